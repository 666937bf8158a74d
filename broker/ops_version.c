/* The version operations: rollout (a new version loaded beside the current
 * one by the load's own path, wb__ops_start_load), rollback, and the
 * subscriptions to a model's versions. */
#include "ops_impl.h"
#include "tier.h"

#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

uint64_t wb__ops_serial(const void *ident, size_t ident_len)
{
    uint64_t serial = 0;
    if (ident && ident_len == sizeof serial)
        memcpy(&serial, ident, sizeof serial);
    return serial;
}

/* A rollout refused before its load started: counted and logged as a
 * failed rollout, the current version as it was. */
__attribute__((format(printf, 4, 5))) static int refuse_rollout(wb_broker *b, wb_ops_reply *r,
                                                                int status, const char *fmt, ...)
{
    char msg[WB_ERR_MSG_MAX], q[WB_ERR_MSG_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b->stats.rollouts_failed++;
    wb_warn("model_rollout_refused", "status=%s error=%s", wb_status_name(status),
            wb__log_quote(q, sizeof q, msg));
    return wb__ops_fail(r, status, "%s", msg);
}

/* What a name without a current version is, for the refusals of rollout
 * and rollback (`verb`). */
static int no_current(wb_broker *b, wb_ops_reply *r, const char *name, const char *verb, int count)
{
    const wb_model *any = wb__models_find(&b->models, name);
    const char *hint = "";
    int status = WB_ESTATE;
    char msg[WB_ERR_MSG_MAX];
    if (!any) {
        snprintf(msg, sizeof msg,
                 "no model named '%s': a %s needs a current version (load one first with `wbctl "
                 "load %s PATH`)",
                 name, verb, name);
        status = WB_ENOTFOUND;
    } else {
        if (any->state == WBPROTO__MODEL_STATE__MODEL_LOADING)
            hint = "wait for its load to end";
        else if (any->state == WBPROTO__MODEL_STATE__MODEL_FAILED)
            hint = "load it again with `wbctl load`";
        else
            hint = "it is being unloaded; load it again once it is freed";
        snprintf(msg, sizeof msg, "model '%s' has no current version (version %u is %s): %s", name,
                 any->version, wb__model_state_name(any->state), hint);
    }
    if (count)
        return refuse_rollout(b, r, status, "%s", msg);
    return wb__ops_fail(r, status, "%s", msg);
}

/* "version 1 draining (3 leases), version 2 current (1 lease)" */
static void describe_versions(const wb_broker *b, const char *name, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (const wb_model *m = b->models.head; m && at < size; m = m->next) {
        if (strcmp(m->name, name) != 0 || m->state == WBPROTO__MODEL_STATE__MODEL_FAILED)
            continue;
        const char *st = m->current ? "current" : wb__model_state_name(m->state);
        int w = snprintf(buf + at, size - at, "%sversion %u %s (%u lease%s)", at ? ", " : "",
                         m->version, st, m->leases, m->leases == 1 ? "" : "s");
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

int wb__ops_rollout(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                    const void *ident, size_t ident_len, wb_ops_reply *r)
{
    const Wbproto__RolloutRequest *rq = req->rollout;
    const char *name = rq->name;
    char q[300];
    if (!wb__ops_is_admin(b, peer))
        return wb__ops_refuse_admin(b, peer, "rollout", r);
    if (!wb__model_name_valid(name))
        return refuse_rollout(b, r, WB_EINVAL,
                              "model name %s is not 1 to %d characters of A-Z a-z 0-9 . _ -",
                              wb__log_quote(q, 80, name), WB_NAME_MAX);
    wb_model *cur = wb__models_current(&b->models, name);
    if (!cur)
        return no_current(b, r, name, "rollout", 1);
    const wb_model *loading =
        wb__models_in_state(&b->models, name, WBPROTO__MODEL_STATE__MODEL_LOADING);
    if (loading)
        return refuse_rollout(b, r, WB_ESTATE,
                              "a rollout of model '%s' is loading already (version %u): wait for "
                              "it to end, or stop it with `wbctl cancel %s`",
                              name, loading->version, name);
    size_t held = wb__models_versions(&b->models, name);
    if (held >= b->limits.max_versions) {
        char list[600];
        describe_versions(b, name, list, sizeof list);
        return refuse_rollout(b, r, WB_ELIMIT,
                              "model '%s' already has %zu versions, the limit (--max-versions %u): "
                              "%s; a version that is no longer current is freed at its last "
                              "lease (`wbctl leases %s` shows them)",
                              name, held, b->limits.max_versions, list, name);
    }
    wb_load_start ls = {
        .name = name,
        .path = rq->path,
        .no_wait = rq->no_wait,
        .no_share = cur->no_share,
        .rollout = 1,
        .beside = cur->version,
        .replaces = wb__models_in_state(&b->models, name, WBPROTO__MODEL_STATE__MODEL_FAILED)};
    if (rq->placement && rq->placement[0]) {
        wb_err perr;
        int prc = wb__broker_placement(b, name, rq->placement, ls.devices, &ls.n_devices, &perr);
        if (prc != WB_OK)
            return refuse_rollout(b, r, prc, "%s", perr.msg);
    } else {
        /* Where the current version is. */
        memcpy(ls.devices, cur->devices, cur->n_devices * sizeof cur->devices[0]);
        ls.n_devices = cur->n_devices;
    }
    return wb__ops_start_load(b, peer, &ls, ident, ident_len, r);
}

int wb__ops_rollback(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                     wb_ops_reply *r)
{
    const char *name = req->rollback->name;
    char q[300];
    if (!wb__ops_is_admin(b, peer))
        return wb__ops_refuse_admin(b, peer, "rollback", r);
    wb_model *cur = wb__models_current(&b->models, name);
    if (!cur)
        return no_current(b, r, name, "rollback", 0);
    const wb_model *loading =
        wb__models_in_state(&b->models, name, WBPROTO__MODEL_STATE__MODEL_LOADING);
    if (loading)
        return wb__ops_fail(r, WB_ESTATE,
                            "a rollout of model '%s' is loading (version %u): roll back once it "
                            "has ended, or stop it with `wbctl cancel %s`",
                            name, loading->version, name);
    wb_model *prev = NULL;
    for (wb_model *m = b->models.head; m; m = m->next) {
        if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING && m->version < cur->version &&
            strcmp(m->name, name) == 0 && (!prev || m->version > prev->version))
            prev = m;
    }
    if (!prev)
        return wb__ops_fail(r, WB_ENOTFOUND,
                            "model '%s' has no version before version %u left to roll back to: "
                            "a version that is no longer current lives only while leases hold "
                            "it",
                            name, cur->version);
    Wbproto__RollbackReply *rr = wb__arena_alloc(&r->arena, sizeof *rr);
    Wbproto__ModelInfo *mi = wb__ops_model_info(prev, WBPROTO__MODEL_STATE__MODEL_READY, &r->arena);
    if (!rr || !mi)
        return wb__ops_oom(r);
    uint32_t replaced = wb__broker_make_current(b, prev);
    b->stats.rollbacks_total++;
    wb_info("model_rollback", "model=%s version=%u previous=%u pid=%u uid=%u",
            wb__log_quote(q, sizeof q, name), prev->version, replaced, peer->pid, peer->uid);
    wbproto__rollback_reply__init(rr);
    mi->current = 1;
    rr->model = mi;
    rr->previous_version = replaced;
    rr->current_at = b->now_wall();
    r->msg.body_case = WBPROTO__REPLY__BODY_ROLLBACK;
    r->msg.rollback = rr;
    return 0;
}

int wb__ops_subscribe(wb_broker *b, const Wbproto__Request *req, const void *ident,
                      size_t ident_len, wb_ops_reply *r)
{
    const Wbproto__SubscribeRequest *sq = req->subscribe;
    char q[300];
    uint64_t serial = wb__ops_serial(ident, ident_len);
    if (serial == 0)
        return wb__ops_fail(r, WB_EINVAL, "a subscription needs a connection to send notices on");
    if (!wb__model_name_valid(sq->model))
        return wb__ops_fail(r, WB_EINVAL,
                            "model name %s is not 1 to %d characters of A-Z a-z 0-9 . _ -",
                            wb__log_quote(q, 80, sq->model), WB_NAME_MAX);
    Wbproto__SubscribeReply *sr = wb__arena_alloc(&r->arena, sizeof *sr);
    if (!sr)
        return wb__ops_oom(r);
    if (sq->unsubscribe) {
        wb__subs_remove(&b->subs, serial, sq->model);
    } else {
        wb_err err;
        int rc = wb__subs_add(&b->subs, serial, sq->model, &err);
        if (rc != WB_OK)
            return wb__ops_fail(r, rc, "%s", err.msg);
    }
    wbproto__subscribe_reply__init(sr);
    const wb_model *cur = wb__models_current(&b->models, sq->model);
    sr->version = cur ? cur->version : 0;
    wb_debug("subscribe", "model=%s connection=%llu unsubscribe=%s version=%u",
             wb__log_quote(q, sizeof q, sq->model), (unsigned long long)serial,
             sq->unsubscribe ? "yes" : "no", sr->version);
    r->msg.body_case = WBPROTO__REPLY__BODY_SUBSCRIBE;
    r->msg.subscribe = sr;
    return 0;
}

int wb__ops_tier(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                 wb_ops_reply *r)
{
    const Wbproto__TierRequest *tq = req->tier;
    const char *name = tq->name;
    char q[300];
    const char *verb = tq->wake ? "wake" : "sleep";
    if (!wb__ops_is_admin(b, peer))
        return wb__ops_refuse_admin(b, peer, verb, r);
    wb_model *m = wb__models_current(&b->models, name);
    if (!m)
        return no_current(b, r, name, verb, 0);
    wb_err err;
    int rc = tq->wake ? wb__tier_wake(b, m, &err) : wb__tier_sleep(b, m, &err);
    if (rc != WB_OK)
        return wb__ops_fail(r, rc, "%s", err.msg);
    wb_info("model_tier_request", "model=%s version=%u op=%s tier=%s pid=%u uid=%u",
            wb__log_quote(q, sizeof q, name), m->version, verb, wb__tier_name(m->tier), peer->pid,
            peer->uid);
    Wbproto__TierReply *tr = wb__arena_alloc(&r->arena, sizeof *tr);
    Wbproto__ModelInfo *mi = wb__ops_model_info(m, m->state, &r->arena);
    if (!tr || !mi)
        return wb__ops_oom(r);
    wbproto__tier_reply__init(tr);
    tr->model = mi;
    r->msg.body_case = WBPROTO__REPLY__BODY_TIER;
    r->msg.tier = tr;
    return 0;
}
