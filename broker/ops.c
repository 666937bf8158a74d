#include "ops.h"

#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef WB_VERSION
#define WB_VERSION "0.0.0"
#endif

void *wb__arena_alloc(wb_arena *a, size_t n)
{
    if (n > SIZE_MAX - sizeof(wb_arena_block))
        return NULL;
    wb_arena_block *blk = calloc(1, sizeof *blk + n);
    if (!blk)
        return NULL;
    blk->next = a->head;
    a->head = blk;
    return blk->data;
}

char *wb__arena_strdup(wb_arena *a, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = wb__arena_alloc(a, n);
    if (p)
        memcpy(p, s, n);
    return p;
}

char *wb__arena_printf(wb_arena *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = wb__arena_alloc(a, (size_t)n + 1);
    if (!p)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void wb__arena_free(wb_arena *a)
{
    wb_arena_block *blk = a->head;
    while (blk) {
        wb_arena_block *next = blk->next;
        free(blk);
        blk = next;
    }
    a->head = NULL;
}

static char oom_message[] = "out of memory building the reply";

void wb__ops_error(Wbproto__Reply *rep, wb_arena *a, uint64_t id, int status, const char *msg)
{
    rep->version = WB_PROTOCOL_VERSION;
    rep->id = id;
    rep->status = status;
    rep->body_case = WBPROTO__REPLY__BODY__NOT_SET;
    char *s = wb__arena_strdup(a, msg ? msg : wb_strerror(status));
    rep->error = s ? s : oom_message;
}

/* Sets an error status with a formatted message and drops any body. */
__attribute__((format(printf, 4, 5))) static int fail(Wbproto__Reply *rep, wb_arena *a, int status,
                                                      const char *fmt, ...)
{
    wb_err err;
    va_list ap;
    va_start(ap, fmt);
    wb__err_vset(&err, status, fmt, ap);
    va_end(ap);
    wb__ops_error(rep, a, rep->id, status, err.msg);
    return 0;
}

static int oom(Wbproto__Reply *rep, wb_arena *a)
{
    return fail(rep, a, WB_ENOMEM, "%s", oom_message);
}

static int is_admin(const wb_broker *b, const wb_peer_creds *peer)
{
    return wb__auth_admin_ok(&b->auth, peer->uid, peer->gid);
}

/* The request's kind, for log lines. */
static const char *op_name(int body)
{
    switch (body) {
    case WBPROTO__REQUEST__BODY_HELLO:
        return "hello";
    case WBPROTO__REQUEST__BODY_ACQUIRE:
        return "acquire";
    case WBPROTO__REQUEST__BODY_RELEASE:
        return "release";
    case WBPROTO__REQUEST__BODY_HEARTBEAT:
        return "heartbeat";
    case WBPROTO__REQUEST__BODY_LOAD:
        return "load";
    case WBPROTO__REQUEST__BODY_UNLOAD:
        return "unload";
    default:
        return "other";
    }
}

/* An administrator operation from a peer that is not one: logged with the
 * list it failed. */
static int refuse_admin(wb_broker *b, const wb_peer_creds *peer, const char *verb,
                        Wbproto__Reply *rep, wb_arena *a)
{
    char who[200];
    b->stats.requests_refused++;
    wb_warn("peer_refused", "reason=not_admin op=%s uid=%u gid=%u pid=%u admins=\"%s\"", verb,
            peer->uid, peer->gid, peer->pid, wb__auth_describe_admins(&b->auth, who, sizeof who));
    return fail(rep, a, WB_EPERM, "uid %u may not %s models", peer->uid, verb);
}

Wbproto__ModelInfo *wb__ops_model_info(const wb_model *m, int state, wb_arena *a)
{
    Wbproto__ModelInfo *mi = wb__arena_alloc(a, sizeof *mi);
    if (!mi)
        return NULL;
    wbproto__model_info__init(mi);
    mi->name = wb__arena_strdup(a, m->name);
    mi->path = wb__arena_strdup(a, m->path);
    if (!mi->name || !mi->path)
        return NULL;
    mi->state = state;
    mi->backend = m->backend->proto;
    mi->device = m->device;
    mi->tensors = (uint32_t)m->data.n_tensors;
    mi->bytes = m->data.bytes;
    mi->slab_bytes = m->data.slab_bytes;
    mi->leases = m->leases;
    mi->load_seconds = m->data.load_seconds;
    mi->load_gbps = m->data.load_gbps;
    wb__load_fill_model_info(m, mi);
    return mi;
}

static int op_hello(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                    wb_arena *a, Wbproto__Reply *rep)
{
    Wbproto__HelloReply *h = wb__arena_alloc(a, sizeof *h);
    if (!h)
        return oom(rep, a);
    wbproto__hello_reply__init(h);
    h->broker_version = WB_VERSION;
    h->broker_pid = b->pid;
    h->backend = b->cfg.backend->proto;
    h->heartbeat_interval_ms = b->cfg.heartbeat_ms;
    h->stale_after_ms = b->cfg.stale_ms;
    h->peer_uid = peer->uid;
    h->peer_gid = peer->gid;
    h->peer_pid = peer->pid;
    h->broker_instance = b->instance;
    rep->body_case = WBPROTO__REPLY__BODY_HELLO;
    rep->hello = h;
    char q[300];
    wb_debug("hello", "pid=%u uid=%u client=%s", peer->pid, peer->uid,
             wb__log_quote(q, sizeof q, req->hello->client));
    return 0;
}

static int op_acquire(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                      wb_arena *a, Wbproto__Reply *rep)
{
    const char *name = req->acquire->model;
    char q[300];
    wb_model *m = wb__models_find(&b->models, name);
    if (!m)
        return fail(rep, a, WB_ENOTFOUND, "no model named '%s'", name);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING)
        return fail(rep, a, WB_ESTATE, "model '%s' is loading; try again when it is ready", name);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
        return fail(rep, a, WB_ESTATE,
                    "model '%s' is draining (unload requested); new leases are refused", name);
    if (m->state != WBPROTO__MODEL_STATE__MODEL_READY)
        return fail(rep, a, WB_ESTATE, "model '%s' is %s", name, wb__model_state_name(m->state));
    /* Refuse before granting: a lease whose reply cannot be delivered would
     * be held by nobody. */
    wb_err lerr;
    if (wb__limits_check_lease_size(&b->limits, name, m->wire_lease_size, &lerr) != WB_OK)
        return fail(rep, a, WB_ELIMIT, "%s", lerr.msg);
    const wb_peer_rec *holder = wb__leases_peer(&b->leases, peer->pid);
    if (holder && wb__limits_check_leases(&b->limits, peer->pid, holder->leases, &lerr) != WB_OK) {
        wb_warn("limit", "limit=max_leases_per_client pid=%u leases=%u", peer->pid, holder->leases);
        return fail(rep, a, WB_ELIMIT, "%s", lerr.msg);
    }

    Wbproto__AcquireReply *ar = wb__arena_alloc(a, sizeof *ar);
    Wbproto__Lease *lw = wb__arena_alloc(a, sizeof *lw);
    if (!ar || !lw)
        return oom(rep, a);

    char comm[32];
    wb__peer_comm(peer->pid, comm, sizeof comm);
    wb_lease_rec *l;
    wb_err err;
    int rc = wb__leases_grant(&b->leases, m, peer, comm, b->now_ms(), b->now_wall(), &l, &err);
    if (rc != WB_OK)
        return fail(rep, a, rc, "%s", err.msg);
    m->leases++;
    b->stats.leases_granted++;
    char hex[9], qc[80];
    wb_info("lease_grant", "lease=%s model=%s pid=%u uid=%u gid=%u comm=%s",
            wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, m->name), l->pid, l->uid,
            l->gid, wb__log_quote(qc, sizeof qc, l->comm));

    wbproto__acquire_reply__init(ar);
    wbproto__lease__init(lw);
    lw->id.data = l->id;
    lw->id.len = WB_LEASE_ID_LEN;
    lw->model = m->name;
    lw->n_slabs = m->data.n_slabs;
    lw->slabs = m->wire_slab_ptrs;
    lw->n_tensors = m->data.n_tensors;
    lw->tensors = m->wire_tensor_ptrs;
    ar->lease = lw;
    rep->body_case = WBPROTO__REPLY__BODY_ACQUIRE;
    rep->acquire = ar;
    return 0;
}

static int op_release(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                      wb_arena *a, Wbproto__Reply *rep)
{
    const uint8_t *id = req->release->lease_id.data;
    Wbproto__ReleaseReply *rr = wb__arena_alloc(a, sizeof *rr);
    if (!rr)
        return oom(rep, a);
    wb_lease_rec *l = wb__leases_find(&b->leases, id);
    char comm[32] = "?";
    if (l)
        snprintf(comm, sizeof comm, "%s", l->comm);
    wb_model *m;
    wb_err err;
    int rc = wb__leases_release(&b->leases, peer, id, &m, &err);
    if (rc != WB_OK)
        return fail(rep, a, rc, "%s", err.msg);
    b->stats.leases_released++;
    char hex[9], q[300], qc[80];
    wb_info("lease_release", "lease=%s model=%s pid=%u comm=%s", wb__lease_id_short(id, hex),
            wb__log_quote(q, sizeof q, m->name), peer->pid, wb__log_quote(qc, sizeof qc, comm));
    wbproto__release_reply__init(rr);
    rr->model_state = wb__broker_lease_ended(b, m);
    rep->body_case = WBPROTO__REPLY__BODY_RELEASE;
    rep->release = rr;
    return 0;
}

/* Container records travel with heartbeats. The broker keeps the last ones
 * of each lease in one allocation (strings after the array), counted in the
 * holder's record quota. */
static size_t records_size(const Wbproto__LeaseBeat *beat)
{
    size_t n = beat->n_container_records * sizeof(wb_container_rec);
    for (size_t k = 0; k < beat->n_container_records; k++) {
        const Wbproto__ContainerRecord *r = beat->container_records[k];
        n += strlen(r->aoti_api) + 1 + strlen(r->model_path ? r->model_path : "") + 1;
    }
    return n;
}

/* Copies the beat's records (already validated) into one allocation of
 * `size` bytes; NULL when there are none or memory is short. */
static wb_container_rec *records_copy(const Wbproto__LeaseBeat *beat, size_t size)
{
    size_t n = beat->n_container_records;
    if (n == 0)
        return NULL;
    wb_container_rec *recs = malloc(size);
    if (!recs)
        return NULL;
    char *str = (char *)(recs + n);
    for (size_t k = 0; k < n; k++) {
        const Wbproto__ContainerRecord *r = beat->container_records[k];
        wb_container_rec *c = &recs[k];
        c->id = r->container_id;
        c->bound_bytes = r->bound_bytes;
        c->folded_bytes = r->folded_bytes;
        c->embedded_bytes = r->embedded_bytes;
        c->leased_constants = r->leased_constants;
        c->aliased_constants = r->aliased_constants;
        c->caller_constants = r->caller_constants;
        c->package_constants = r->package_constants;
        c->folded_constants = r->folded_constants;
        c->unbound_constants = r->unbound_constants;
        c->package_bytes = r->package_bytes;
        c->created_at = r->created_at;
        c->bound_tensors = r->bound_tensors;
        c->pinned_async_copy = r->pinned_async_copy != 0;
        const char *path = r->model_path ? r->model_path : "";
        size_t la = strlen(r->aoti_api) + 1, lp = strlen(path) + 1;
        memcpy(str, r->aoti_api, la);
        c->aoti_api = str;
        str += la;
        memcpy(str, path, lp);
        c->model_path = str;
        str += lp;
    }
    return recs;
}

/* What the lease table cannot judge alone: within one lease, container ids
 * are unique and there are no more records than the containers the client
 * reports. The wire decoder has checked counts and string sizes. */
static int check_beat_records(const Wbproto__LeaseBeat *beat, size_t i, const wb_lease_rec *l,
                              wb_err *err)
{
    char hex[9];
    size_t n = beat->n_container_records;
    if (n > beat->containers)
        return wb__err_set(err, WB_EPROTO,
                           "heartbeat.leases[%zu].container_records has %zu records but the "
                           "lease %s reports %u containers",
                           i, n, wb__lease_id_short(l->id, hex), beat->containers);
    /* At most WB_MAX_CONTAINER_RECORDS: pairs are cheap. */
    for (size_t k = 1; k < n; k++) {
        for (size_t j = 0; j < k; j++) {
            if (beat->container_records[j]->container_id ==
                beat->container_records[k]->container_id)
                return wb__err_set(err, WB_EPROTO,
                                   "heartbeat.leases[%zu].container_records[%zu].container_id "
                                   "%llu repeats records[%zu] on lease %s",
                                   i, k,
                                   (unsigned long long)beat->container_records[k]->container_id, j,
                                   wb__lease_id_short(l->id, hex));
        }
    }
    return WB_OK;
}

typedef struct beat_plan {
    wb_lease_rec *lease; /* NULL: unknown to this peer */
    size_t size;         /* bytes its new records take */
} beat_plan;

static int cmp_plan_lease(const void *x, const void *y)
{
    const beat_plan *a = *(const beat_plan *const *)x, *b = *(const beat_plan *const *)y;
    uintptr_t pa = (uintptr_t)a->lease, pb = (uintptr_t)b->lease;
    return pa < pb ? -1 : pa > pb;
}

/* A heartbeat is checked whole before anything is applied: a bad one
 * changes nothing (no liveness, no records). */
static int op_heartbeat(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                        wb_arena *a, Wbproto__Reply *rep)
{
    const Wbproto__HeartbeatRequest *hb = req->heartbeat;
    size_t nb = hb->n_leases;
    Wbproto__HeartbeatReply *hr = wb__arena_alloc(a, sizeof *hr);
    ProtobufCBinaryData *unknown = wb__arena_alloc(a, (nb ? nb : 1) * sizeof *unknown);
    beat_plan *plan = wb__arena_alloc(a, (nb ? nb : 1) * sizeof *plan);
    beat_plan **known = wb__arena_alloc(a, (nb ? nb : 1) * sizeof *known);
    if (!hr || !unknown || !plan || !known)
        return oom(rep, a);
    wbproto__heartbeat_reply__init(hr);
    size_t n_known = 0;
    wb_err err;
    char hex[9];
    for (size_t i = 0; i < nb; i++) {
        const Wbproto__LeaseBeat *beat = hb->leases[i];
        wb_lease_rec *l = wb__leases_find(&b->leases, beat->lease_id.data);
        if (!wb__lease_held_by(l, peer))
            continue;
        if (check_beat_records(beat, i, l, &err) != WB_OK) {
            wb_warn("bad_heartbeat", "pid=%u uid=%u lease=%s error=\"%s\"", peer->pid, peer->uid,
                    wb__lease_id_short(l->id, hex), err.msg);
            return fail(rep, a, WB_EPROTO, "%s", err.msg);
        }
        plan[i].lease = l;
        plan[i].size = records_size(beat);
        known[n_known++] = &plan[i];
    }
    /* The same lease twice would count its records twice. */
    qsort(known, n_known, sizeof *known, cmp_plan_lease);
    for (size_t k = 1; k < n_known; k++) {
        if (known[k]->lease == known[k - 1]->lease) {
            size_t i = (size_t)(known[k] - plan), j = (size_t)(known[k - 1] - plan);
            return fail(rep, a, WB_EPROTO, "heartbeat.leases[%zu] repeats leases[%zu] (lease %s)",
                        i > j ? i : j, i > j ? j : i, wb__lease_id_short(known[k]->lease->id, hex));
        }
    }
    const wb_peer_rec *holder = wb__leases_peer(&b->leases, peer->pid);
    uint64_t total = holder ? holder->record_bytes : 0;
    for (size_t k = 0; k < n_known; k++) {
        total -= known[k]->lease->record_bytes < total ? known[k]->lease->record_bytes : total;
        total += known[k]->size;
    }
    if (wb__limits_check_records(&b->limits, peer->pid, total, &err) != WB_OK) {
        wb_warn("limit", "limit=max_record_bytes pid=%u bytes=%llu", peer->pid,
                (unsigned long long)total);
        return fail(rep, a, WB_ELIMIT, "%s", err.msg);
    }

    int64_t now_ms = b->now_ms();
    double now_wall = b->now_wall();
    size_t n_unknown = 0;
    for (size_t i = 0; i < nb; i++) {
        const Wbproto__LeaseBeat *beat = hb->leases[i];
        int revived;
        if (!plan[i].lease ||
            wb__leases_heartbeat(&b->leases, peer, beat->lease_id.data, beat->containers, now_ms,
                                 now_wall, &revived) != WB_OK) {
            /* Points into the request, which outlives the packing. */
            unknown[n_unknown++] = beat->lease_id;
            continue;
        }
        wb_lease_rec *l = plan[i].lease;
        wb_container_rec *recs = records_copy(beat, plan[i].size);
        if (!recs && beat->n_container_records)
            wb_warn("container_records_dropped", "reason=out_of_memory pid=%u", l->pid);
        wb__leases_set_records(&b->leases, l, recs, (uint32_t)beat->n_container_records,
                               plan[i].size);
        if (revived) {
            char q[300], qc[80];
            wb_info("lease_active", "lease=%s model=%s pid=%u comm=%s",
                    wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, l->model->name),
                    l->pid, wb__log_quote(qc, sizeof qc, l->comm));
        }
    }
    hr->n_unknown_leases = n_unknown;
    hr->unknown_leases = n_unknown ? unknown : NULL;
    rep->body_case = WBPROTO__REPLY__BODY_HEARTBEAT;
    rep->heartbeat = hr;
    return 0;
}

/* Listings are paged so that every reply fits the message limit by
 * construction: entries are added while their packed sizes (plus the
 * repeated field's tag and length) stay within the budget, and an entry
 * that alone would not fit is cut (records or leases left out, with the
 * total still given). */
#define LIST_FRAMING   1024 /* reply header, status, totals */
#define LIST_ENTRY_TAG 8    /* tag and length prefix of one repeated entry */
#define LIST_PAGE_MAX  2048 /* entries per page at most */

static size_t list_budget(const wb_broker *b)
{
    return b->limits.max_message > 2 * LIST_FRAMING ? (size_t)b->limits.max_message - LIST_FRAMING
                                                    : LIST_FRAMING;
}

static uint32_t page_limit(uint32_t limit)
{
    return limit == 0 || limit > LIST_PAGE_MAX ? LIST_PAGE_MAX : limit;
}

/* A lease id as this peer may see it: whole for its own leases and for
 * administrators, else only a prefix. */
static ProtobufCBinaryData shown_id(const wb_lease_rec *l, const wb_peer_creds *viewer, int admin)
{
    ProtobufCBinaryData d = {WB_LEASE_ID_LEN, (uint8_t *)l->id};
    if (!admin && !wb__lease_held_by(l, viewer))
        d.len = WB_LEASE_ID_PREFIX_LEN;
    return d;
}

static Wbproto__ContainerRecord *record_info(const wb_container_rec *c, wb_arena *a)
{
    Wbproto__ContainerRecord *r = wb__arena_alloc(a, sizeof *r);
    if (!r)
        return NULL;
    wbproto__container_record__init(r);
    r->container_id = c->id;
    r->aoti_api = (char *)c->aoti_api;
    r->pinned_async_copy = c->pinned_async_copy;
    r->bound_bytes = c->bound_bytes;
    r->bound_tensors = c->bound_tensors;
    r->folded_bytes = c->folded_bytes;
    r->created_at = c->created_at;
    r->model_path = (char *)c->model_path;
    r->embedded_bytes = c->embedded_bytes;
    r->leased_constants = c->leased_constants;
    r->aliased_constants = c->aliased_constants;
    r->caller_constants = c->caller_constants;
    r->package_constants = c->package_constants;
    r->folded_constants = c->folded_constants;
    r->unbound_constants = c->unbound_constants;
    r->package_bytes = c->package_bytes;
    return r;
}

typedef struct container_ref {
    uint32_t pid;
    uint64_t cid;
    const wb_lease_rec *lease;
    const wb_container_rec *rec;
} container_ref;

static int cmp_ref(const void *x, const void *y)
{
    const container_ref *a = x, *b = y;
    if (a->pid != b->pid)
        return a->pid < b->pid ? -1 : 1;
    if (a->cid != b->cid)
        return a->cid < b->cid ? -1 : 1;
    return memcmp(a->lease->id, b->lease->id, WB_LEASE_ID_LEN);
}

/* Every container any client reported, one entry per (pid, container id),
 * with the leases it binds: the records are sorted once, O(R log R) for R
 * records, and each entry's lease array is sized from its own group. */
static int op_list_containers(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                              wb_arena *a, Wbproto__Reply *rep)
{
    const wb_lease_table *t = &b->leases;
    int admin = is_admin(b, peer);
    size_t n_refs = 0;
    for (size_t i = 0; i < t->n_leases; i++)
        n_refs += t->leases[i]->n_records;
    container_ref *refs = wb__arena_alloc(a, (n_refs ? n_refs : 1) * sizeof *refs);
    Wbproto__ListContainersReply *lr = wb__arena_alloc(a, sizeof *lr);
    if (!refs || !lr)
        return oom(rep, a);
    size_t k = 0;
    for (size_t i = 0; i < t->n_leases; i++) {
        const wb_lease_rec *l = t->leases[i];
        for (uint32_t r = 0; r < l->n_records; r++)
            refs[k++] = (container_ref){l->pid, l->records[r].id, l, &l->records[r]};
    }
    qsort(refs, n_refs, sizeof *refs, cmp_ref);
    size_t total = 0;
    for (size_t i = 0; i < n_refs; i++)
        total += i == 0 || refs[i].pid != refs[i - 1].pid || refs[i].cid != refs[i - 1].cid;

    wbproto__list_containers_reply__init(lr);
    uint32_t offset = req->list_containers->offset;
    uint32_t limit = page_limit(req->list_containers->limit);
    size_t cap = total > offset ? total - offset : 0;
    if (cap > limit)
        cap = limit;
    Wbproto__ContainerInfo **list = wb__arena_alloc(a, (cap ? cap : 1) * sizeof *list);
    if (!list)
        return oom(rep, a);
    size_t budget = list_budget(b), used = 0, n = 0, group = 0, i = 0;
    while (i < n_refs && n < cap) {
        size_t end = i + 1;
        while (end < n_refs && refs[end].pid == refs[i].pid && refs[end].cid == refs[i].cid)
            end++;
        if (group++ < offset) {
            i = end;
            continue;
        }
        size_t m = end - i;
        const container_ref *g = &refs[i];
        Wbproto__ContainerInfo *ci = wb__arena_alloc(a, sizeof *ci);
        Wbproto__ContainerLease *cls = wb__arena_alloc(a, m * sizeof *cls);
        Wbproto__ContainerLease **clp = wb__arena_alloc(a, m * sizeof *clp);
        if (!ci || !cls || !clp)
            return oom(rep, a);
        wbproto__container_info__init(ci);
        ci->pid = g->pid;
        ci->process_name = (char *)g->lease->comm;
        ci->container_id = g->cid;
        ci->aoti_api = (char *)g->rec->aoti_api;
        ci->pinned_async_copy = g->rec->pinned_async_copy;
        ci->folded_bytes = g->rec->folded_bytes;
        ci->created_at = g->rec->created_at;
        ci->model_path = (char *)g->rec->model_path;
        ci->embedded_bytes = g->rec->embedded_bytes;
        ci->leased_constants = g->rec->leased_constants;
        ci->aliased_constants = g->rec->aliased_constants;
        ci->caller_constants = g->rec->caller_constants;
        ci->package_constants = g->rec->package_constants;
        ci->folded_constants = g->rec->folded_constants;
        ci->unbound_constants = g->rec->unbound_constants;
        ci->package_bytes = g->rec->package_bytes;
        for (size_t j = 0; j < m; j++) {
            wbproto__container_lease__init(&cls[j]);
            cls[j].lease_id = shown_id(g[j].lease, peer, admin);
            cls[j].model = g[j].lease->model->name;
            cls[j].bound_bytes = g[j].rec->bound_bytes;
            cls[j].bound_tensors = g[j].rec->bound_tensors;
            clp[j] = &cls[j];
        }
        ci->leases = clp;
        ci->n_leases = m;
        ci->leases_total = (uint32_t)m;
        size_t sz = wbproto__container_info__get_packed_size(ci) + LIST_ENTRY_TAG;
        if (used + sz > budget && n == 0) {
            /* Alone too big: keep the leases that fit. */
            while (ci->n_leases > 0 && sz > budget) {
                ci->n_leases /= 2;
                sz = wbproto__container_info__get_packed_size(ci) + LIST_ENTRY_TAG;
            }
        }
        if (used + sz > budget)
            break;
        used += sz;
        list[n++] = ci;
        i = end;
    }
    size_t next = (size_t)offset + n;
    lr->n_containers = n;
    lr->containers = n ? list : NULL;
    lr->total = (uint32_t)total;
    lr->next_offset = next < total ? (uint32_t)next : 0;
    rep->body_case = WBPROTO__REPLY__BODY_LIST_CONTAINERS;
    rep->list_containers = lr;
    return 0;
}

static int op_list_leases(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                          wb_arena *a, Wbproto__Reply *rep)
{
    const wb_lease_table *t = &b->leases;
    int admin = is_admin(b, peer);
    size_t total = t->n_leases;
    uint32_t offset = req->list_leases->offset;
    size_t cap = total > offset ? total - offset : 0;
    if (cap > page_limit(req->list_leases->limit))
        cap = page_limit(req->list_leases->limit);
    Wbproto__ListLeasesReply *lr = wb__arena_alloc(a, sizeof *lr);
    Wbproto__LeaseInfo *infos = wb__arena_alloc(a, (cap ? cap : 1) * sizeof *infos);
    Wbproto__LeaseInfo **ptrs = wb__arena_alloc(a, (cap ? cap : 1) * sizeof *ptrs);
    if (!lr || !infos || !ptrs)
        return oom(rep, a);
    wbproto__list_leases_reply__init(lr);
    size_t budget = list_budget(b), used = 0, n = 0;
    for (; n < cap; n++) {
        const wb_lease_rec *l = t->leases[offset + n];
        Wbproto__LeaseInfo *li = &infos[n];
        wbproto__lease_info__init(li);
        li->id = shown_id(l, peer, admin);
        li->model = l->model->name;
        li->pid = l->pid;
        li->uid = l->uid;
        li->gid = l->gid;
        li->process_name = (char *)l->comm;
        li->state = l->state;
        li->containers = l->containers;
        li->slabs = l->model->data.n_slabs;
        li->bytes = l->model->data.bytes;
        li->granted_at = l->granted_at;
        li->last_heartbeat = l->last_heartbeat;
        li->container_records_total = l->n_records;
        if (l->n_records) {
            Wbproto__ContainerRecord **recs = wb__arena_alloc(a, l->n_records * sizeof *recs);
            if (!recs)
                return oom(rep, a);
            for (uint32_t r = 0; r < l->n_records; r++) {
                if (!(recs[r] = record_info(&l->records[r], a)))
                    return oom(rep, a);
            }
            li->container_records = recs;
            li->n_container_records = l->n_records;
        }
        size_t sz = wbproto__lease_info__get_packed_size(li) + LIST_ENTRY_TAG;
        if (used + sz > budget && n == 0) {
            /* Alone too big: without its records (the total still says
             * how many there are). */
            li->n_container_records = 0;
            li->container_records = NULL;
            sz = wbproto__lease_info__get_packed_size(li) + LIST_ENTRY_TAG;
        }
        if (used + sz > budget)
            break;
        used += sz;
        ptrs[n] = li;
    }
    size_t next = (size_t)offset + n;
    lr->n_leases = n;
    lr->leases = n ? ptrs : NULL;
    lr->total = (uint32_t)total;
    lr->next_offset = next < total ? (uint32_t)next : 0;
    rep->body_case = WBPROTO__REPLY__BODY_LIST_LEASES;
    rep->list_leases = lr;
    return 0;
}

static int op_list_models(wb_broker *b, wb_arena *a, Wbproto__Reply *rep)
{
    size_t n = b->models.n;
    Wbproto__ListModelsReply *lr = wb__arena_alloc(a, sizeof *lr);
    Wbproto__ModelInfo **ptrs = wb__arena_alloc(a, (n ? n : 1) * sizeof *ptrs);
    if (!lr || !ptrs)
        return oom(rep, a);
    wbproto__list_models_reply__init(lr);
    size_t i = 0;
    for (wb_model *m = b->models.head; m && i < n; m = m->next) {
        if (!(ptrs[i++] = wb__ops_model_info(m, m->state, a)))
            return oom(rep, a);
    }
    lr->n_models = i;
    lr->models = i ? ptrs : NULL;
    rep->body_case = WBPROTO__REPLY__BODY_LIST_MODELS;
    rep->list_models = lr;
    return 0;
}

static int op_stats(wb_broker *b, wb_arena *a, Wbproto__Reply *rep)
{
    Wbproto__StatsReply *s = wb__arena_alloc(a, sizeof *s);
    if (!s)
        return oom(rep, a);
    wbproto__stats_reply__init(s);
    const wb_broker_stats *st = &b->stats;
    s->uptime_seconds = (double)(b->now_ms() - b->started_ms) / 1000.0;
    s->requests_total = st->requests_total;
    s->requests_failed = st->requests_failed;
    s->malformed_messages = st->malformed_messages;
    s->leases_granted = st->leases_granted;
    s->leases_released = st->leases_released;
    s->leases_reclaimed = st->leases_reclaimed;
    s->leases_active =
        (uint32_t)wb__leases_count_state(&b->leases, WBPROTO__LEASE_STATE__LEASE_ACTIVE);
    s->leases_stale =
        (uint32_t)wb__leases_count_state(&b->leases, WBPROTO__LEASE_STATE__LEASE_STALE);
    s->models = (uint32_t)b->models.n;
    for (wb_model *m = b->models.head; m; m = m->next)
        s->model_bytes += m->data.bytes;
    s->loads_total = st->loads_total;
    s->loads_failed = st->loads_failed;
    s->load_bytes_total = st->load_bytes_total;
    s->load_seconds_total = st->load_seconds_total;
    s->peers = (uint32_t)b->leases.n_peers;
    wb__load_fill_stats(b->cfg.backend, &b->models, s);
    s->requests_refused = st->requests_refused;
    s->limit_refusals = st->limit_refusals;
    s->replies_dropped = st->replies_dropped;
    s->peers_refused = st->peers_refused;
    s->peers_disconnected = st->peers_disconnected;
    s->connections = st->connections;
    rep->body_case = WBPROTO__REPLY__BODY_STATS;
    rep->stats = s;
    return 0;
}

void wb__ops_load_done(wb_broker *b, const wb_load_job *job, wb_model *model, wb_arena *a,
                       Wbproto__Reply *rep)
{
    (void)b;
    rep->version = WB_PROTOCOL_VERSION;
    rep->id = job->request_id;
    if (job->rc != WB_OK || !model) {
        wb__ops_error(rep, a, job->request_id, job->rc != WB_OK ? job->rc : WB_EINTERNAL,
                      job->err.msg);
        return;
    }
    Wbproto__LoadReply *lr = wb__arena_alloc(a, sizeof *lr);
    Wbproto__ModelInfo *mi = wb__ops_model_info(model, model->state, a);
    if (!lr || !mi) {
        oom(rep, a);
        return;
    }
    wbproto__load_reply__init(lr);
    lr->model = mi;
    rep->body_case = WBPROTO__REPLY__BODY_LOAD;
    rep->load = lr;
}

static int op_load(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   const void *ident, size_t ident_len, wb_arena *a, Wbproto__Reply *rep)
{
    const char *name = req->load->name;
    const char *path = req->load->path;
    char q[300], qp[WB_PATH_MAX + 64];
    if (!is_admin(b, peer))
        return refuse_admin(b, peer, "load", rep, a);
    if (!wb__model_name_valid(name))
        return fail(rep, a, WB_EINVAL,
                    "model name %s is not 1 to %d characters of A-Z a-z 0-9 . _ -",
                    wb__log_quote(q, 80, name), WB_NAME_MAX);
    wb_model *m = wb__models_find(&b->models, name);
    if (m)
        return fail(rep, a, WB_EEXIST, "a model named '%s' already exists (%s)", name,
                    wb__model_state_name(m->state));
    wb_err cerr;
    int crc = wb__broker_check_load(b, peer, name, path, &cerr);
    if (crc != WB_OK)
        return fail(rep, a, crc, "%s", cerr.msg);
    m = wb__model_new(name, path, b->cfg.backend, b->cfg.device);
    wb_load_job *job =
        wb__load_job_new(name, path, b->cfg.backend, b->cfg.device, ident, ident_len, rep->id);
    if (!m || !job) {
        wb__model_free(&m);
        wb__load_job_free(&job);
        return oom(rep, a);
    }
    job->progress = &m->progress;
    job->access = wb__auth_load_access(peer);
    wb__models_add(&b->models, m);
    wb_info("model_load_start", "model=%s path=%s backend=%s pid=%u uid=%u",
            wb__log_quote(q, sizeof q, name), wb__log_quote(qp, sizeof qp, path),
            b->cfg.backend->name, peer->pid, peer->uid);
    if (b->loader) {
        wb__loader_submit(b->loader, job);
        return WB_OPS_DEFERRED;
    }
    wb__load_job_run(job, NULL);
    wb_model *ready;
    wb__broker_finish_load(b, job, &ready);
    wb__ops_load_done(b, job, ready, a, rep);
    wb__load_job_free(&job);
    return 0;
}

static int op_unload(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                     wb_arena *a, Wbproto__Reply *rep)
{
    const char *name = req->unload->name;
    char q[300];
    if (!is_admin(b, peer))
        return refuse_admin(b, peer, "unload", rep, a);
    wb_model *m = wb__models_find(&b->models, name);
    if (!m)
        return fail(rep, a, WB_ENOTFOUND, "no model named '%s'", name);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING)
        return fail(rep, a, WB_ESTATE, "model '%s' is loading; unload it when the load has ended",
                    name);
    Wbproto__UnloadReply *ur = wb__arena_alloc(a, sizeof *ur);
    if (!ur)
        return oom(rep, a);
    wbproto__unload_reply__init(ur);
    if (m->leases == 0) {
        if (!(ur->model = wb__ops_model_info(m, WBPROTO__MODEL_STATE__MODEL_FREED, a)))
            return oom(rep, a);
        wb__broker_free_model(b, m);
    } else {
        if (m->state != WBPROTO__MODEL_STATE__MODEL_DRAINING) {
            m->state = WBPROTO__MODEL_STATE__MODEL_DRAINING;
            wb_info("model_draining", "model=%s leases=%u", wb__log_quote(q, sizeof q, name),
                    m->leases);
        }
        if (!(ur->model = wb__ops_model_info(m, m->state, a)))
            return oom(rep, a);
    }
    rep->body_case = WBPROTO__REPLY__BODY_UNLOAD;
    rep->unload = ur;
    return 0;
}

int wb__ops_handle(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   const void *ident, size_t ident_len, wb_arena *a, Wbproto__Reply *rep)
{
    rep->version = WB_PROTOCOL_VERSION;
    rep->id = req->id;
    rep->status = WB_OK;
    if (!peer || !peer->known)
        return fail(rep, a, WB_EPERM, "the peer's credentials cannot be read");
    /* Every operation needs a peer on the client list (administrators are
     * on it); load and unload check the administrator list on top. */
    wb_err aerr;
    if (wb__auth_check_client(&b->auth, peer, &aerr) != WB_OK) {
        char who[200];
        b->stats.requests_refused++;
        wb_warn("peer_refused", "reason=not_allowed op=%s uid=%u gid=%u pid=%u allowed=\"%s\"",
                op_name(req->body_case), peer->uid, peer->gid, peer->pid,
                wb__auth_describe_clients(&b->auth, who, sizeof who));
        return fail(rep, a, WB_EPERM, "%s", aerr.msg);
    }
    /* The process the broker knows as this pid may have exited and the pid
     * been reused: its leases go first, so this request comes from a new
     * process holding none. */
    wb__broker_check_peer(b, peer->pid);
    switch (req->body_case) {
    case WBPROTO__REQUEST__BODY_HELLO:
        return op_hello(b, peer, req, a, rep);
    case WBPROTO__REQUEST__BODY_ACQUIRE:
        return op_acquire(b, peer, req, a, rep);
    case WBPROTO__REQUEST__BODY_RELEASE:
        return op_release(b, peer, req, a, rep);
    case WBPROTO__REQUEST__BODY_HEARTBEAT:
        return op_heartbeat(b, peer, req, a, rep);
    case WBPROTO__REQUEST__BODY_LIST_LEASES:
        return op_list_leases(b, peer, req, a, rep);
    case WBPROTO__REQUEST__BODY_LIST_CONTAINERS:
        return op_list_containers(b, peer, req, a, rep);
    case WBPROTO__REQUEST__BODY_LIST_MODELS:
        return op_list_models(b, a, rep);
    case WBPROTO__REQUEST__BODY_LOAD:
        return op_load(b, peer, req, ident, ident_len, a, rep);
    case WBPROTO__REQUEST__BODY_UNLOAD:
        return op_unload(b, peer, req, a, rep);
    case WBPROTO__REQUEST__BODY_STATS:
        return op_stats(b, a, rep);
    default:
        return fail(rep, a, WB_EPROTO, "request has no body");
    }
}
