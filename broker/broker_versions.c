/* Versions of a model: which one is current, the one it replaces draining,
 * and the notices to the connections subscribed to the name. */
#include "broker.h"

#include "log.h"
#include "publish.h"

#include <string.h>

typedef struct notice_ctx {
    wb_broker *b;
    Wbproto__VersionNotice n;
} notice_ctx;

static void tell(void *arg, uint64_t serial)
{
    notice_ctx *nc = arg;
    wb_broker *b = nc->b;
    if (b->notify && b->notify(b->notify_ctx, serial, &nc->n) == WB_OK)
        b->stats.notices_sent++;
    else
        b->stats.notices_dropped++;
}

/* Tells every connection subscribed to m's name that m is current. */
static void notify_current(wb_broker *b, const wb_model *m, uint32_t previous)
{
    notice_ctx nc = {.b = b};
    wbproto__version_notice__init(&nc.n);
    nc.n.model = m->name;
    nc.n.version = m->version;
    nc.n.previous_version = previous;
    wb__subs_each(&b->subs, m->name, tell, &nc);
}

uint32_t wb__broker_make_current(wb_broker *b, wb_model *m)
{
    char q[300];
    uint32_t previous = 0;
    m->state = WBPROTO__MODEL_STATE__MODEL_READY;
    m->current = 1;
    wb__log_quote(q, sizeof q, m->name);
    wb_model *o = b->models.head;
    while (o) {
        wb_model *next = o->next;
        if (o != m && o->current && strcmp(o->name, m->name) == 0) {
            previous = o->version;
            o->current = 0;
            if (o->state == WBPROTO__MODEL_STATE__MODEL_READY)
                o->state = WBPROTO__MODEL_STATE__MODEL_DRAINING;
            wb_info("model_version_draining", "model=%s version=%u leases=%u current=%u", q,
                    o->version, o->leases, m->version);
            wb__publish_checksums_drop(b, o);
            if (o->leases == 0)
                wb__broker_free_model(b, o);
        }
        o = next;
    }
    wb_info("model_version_current", "model=%s version=%u previous=%u", q, m->version, previous);
    notify_current(b, m, previous);
    /* A published version (or one a rollback brings back whose read-back
     * was dropped) gets its checksums now. */
    if (m->checksums_state == WB_CHECKSUMS_PENDING && !m->sum_job)
        wb__publish_checksums_queue(b, m);
    return previous;
}

size_t wb__broker_versions_draining(const wb_broker *b)
{
    size_t n = 0;
    for (const wb_model *m = b->models.head; m; m = m->next)
        n += m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING &&
             wb__models_current(&b->models, m->name) != NULL;
    return n;
}
