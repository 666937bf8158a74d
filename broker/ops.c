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
    char msg[WB_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    wb__ops_error(rep, a, rep->id, status, msg);
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
    int rc = wb__leases_release(&b->leases, peer->pid, id, &m, &err);
    if (rc != WB_OK)
        return fail(rep, a, rc, "%s", err.msg);
    b->stats.leases_released++;
    char hex[9], q[300];
    wb_info("lease_release", "lease=%s model=%s pid=%u comm=%s", wb__lease_id_short(id, hex),
            wb__log_quote(q, sizeof q, m->name), peer->pid, comm);
    wbproto__release_reply__init(rr);
    rr->model_state = wb__broker_lease_ended(b, m);
    rep->body_case = WBPROTO__REPLY__BODY_RELEASE;
    rep->release = rr;
    return 0;
}

/* Container records travel with heartbeats. The broker keeps the last ones
 * of each lease packed (one buffer, attached to the lease record) and
 * unpacks them into the reply's arena when listing. */
typedef struct packed_records {
    size_t len;
    uint8_t data[];
} packed_records;

static void store_container_records(wb_lease_rec *l, const Wbproto__LeaseBeat *beat)
{
    if (l->ext_free)
        l->ext_free(l->ext);
    l->ext = NULL;
    l->ext_free = NULL;
    if (beat->n_container_records == 0)
        return;
    Wbproto__LeaseBeat only = WBPROTO__LEASE_BEAT__INIT;
    only.n_container_records = beat->n_container_records;
    only.container_records = beat->container_records;
    size_t n = wbproto__lease_beat__get_packed_size(&only);
    packed_records *p = malloc(sizeof *p + n);
    if (!p) {
        wb_warn("container_records_dropped", "reason=out_of_memory pid=%u", l->pid);
        return;
    }
    p->len = wbproto__lease_beat__pack(&only, p->data);
    l->ext = p;
    l->ext_free = free;
}

static void *arena_pb_alloc(void *data, size_t n)
{
    return wb__arena_alloc(data, n);
}

static void arena_pb_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr;
}

/* The lease's container records, allocated in the arena; NULL when none. */
static const Wbproto__LeaseBeat *container_records(const wb_lease_rec *l, wb_arena *a)
{
    const packed_records *p = l->ext_free == free ? l->ext : NULL;
    if (!p)
        return NULL;
    ProtobufCAllocator alloc = {arena_pb_alloc, arena_pb_free, a};
    return wbproto__lease_beat__unpack(&alloc, p->len, p->data);
}

static int op_heartbeat(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                        wb_arena *a, Wbproto__Reply *rep)
{
    const Wbproto__HeartbeatRequest *hb = req->heartbeat;
    Wbproto__HeartbeatReply *hr = wb__arena_alloc(a, sizeof *hr);
    ProtobufCBinaryData *unknown =
        wb__arena_alloc(a, (hb->n_leases ? hb->n_leases : 1) * sizeof *unknown);
    if (!hr || !unknown)
        return oom(rep, a);
    wbproto__heartbeat_reply__init(hr);
    int64_t now_ms = b->now_ms();
    double now_wall = b->now_wall();
    size_t n_unknown = 0;
    for (size_t i = 0; i < hb->n_leases; i++) {
        const Wbproto__LeaseBeat *beat = hb->leases[i];
        int revived;
        if (wb__leases_heartbeat(&b->leases, peer->pid, beat->lease_id.data, beat->containers,
                                 now_ms, now_wall, &revived) != WB_OK) {
            /* Points into the request, which outlives the packing. */
            unknown[n_unknown++] = beat->lease_id;
            continue;
        }
        store_container_records(wb__leases_find(&b->leases, beat->lease_id.data), beat);
        if (revived) {
            wb_lease_rec *l = wb__leases_find(&b->leases, beat->lease_id.data);
            char hex[9], q[300];
            wb_info("lease_active", "lease=%s model=%s pid=%u comm=%s",
                    wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, l->model->name),
                    l->pid, l->comm);
        }
    }
    hr->n_unknown_leases = n_unknown;
    hr->unknown_leases = n_unknown ? unknown : NULL;
    rep->body_case = WBPROTO__REPLY__BODY_HEARTBEAT;
    rep->heartbeat = hr;
    return 0;
}

static int cmp_container(const void *x, const void *y)
{
    const Wbproto__ContainerInfo *a = *(Wbproto__ContainerInfo *const *)x;
    const Wbproto__ContainerInfo *b = *(Wbproto__ContainerInfo *const *)y;
    if (a->pid != b->pid)
        return a->pid < b->pid ? -1 : 1;
    return a->container_id < b->container_id ? -1 : a->container_id > b->container_id;
}

/* Every container any client reported, one entry per (pid, container id),
 * with the leases it binds. */
static int op_list_containers(wb_broker *b, wb_arena *a, Wbproto__Reply *rep)
{
    size_t cap = 0, n_leases = b->leases.n_leases;
    const Wbproto__LeaseBeat **per = wb__arena_alloc(a, (n_leases ? n_leases : 1) * sizeof *per);
    if (!per)
        return oom(rep, a);
    for (size_t i = 0; i < n_leases; i++) {
        per[i] = container_records(b->leases.leases[i], a);
        cap += per[i] ? per[i]->n_container_records : 0;
    }
    Wbproto__ListContainersReply *lr = wb__arena_alloc(a, sizeof *lr);
    Wbproto__ContainerInfo **list = wb__arena_alloc(a, (cap ? cap : 1) * sizeof *list);
    if (!lr || !list)
        return oom(rep, a);
    wbproto__list_containers_reply__init(lr);
    size_t n = 0;
    for (size_t i = 0; i < n_leases; i++) {
        wb_lease_rec *l = b->leases.leases[i];
        const Wbproto__LeaseBeat *recs = per[i];
        for (size_t k = 0; recs && k < recs->n_container_records; k++) {
            const Wbproto__ContainerRecord *r = recs->container_records[k];
            Wbproto__ContainerInfo *ci = NULL;
            for (size_t j = 0; j < n && !ci; j++) {
                if (list[j]->pid == l->pid && list[j]->container_id == r->container_id)
                    ci = list[j];
            }
            if (!ci) {
                ci = wb__arena_alloc(a, sizeof *ci);
                /* Room for every lease the container could name. */
                Wbproto__ContainerLease **cl = wb__arena_alloc(a, n_leases * sizeof *cl);
                if (!ci || !cl)
                    return oom(rep, a);
                wbproto__container_info__init(ci);
                ci->pid = l->pid;
                ci->process_name = l->comm;
                ci->container_id = r->container_id;
                ci->aoti_api = r->aoti_api;
                ci->pinned_async_copy = r->pinned_async_copy;
                ci->folded_bytes = r->folded_bytes;
                ci->created_at = r->created_at;
                ci->model_path = r->model_path;
                ci->embedded_bytes = r->embedded_bytes;
                ci->leased_constants = r->leased_constants;
                ci->aliased_constants = r->aliased_constants;
                ci->caller_constants = r->caller_constants;
                ci->package_constants = r->package_constants;
                ci->folded_constants = r->folded_constants;
                ci->unbound_constants = r->unbound_constants;
                ci->package_bytes = r->package_bytes;
                ci->leases = cl;
                list[n++] = ci;
            }
            Wbproto__ContainerLease *cl = wb__arena_alloc(a, sizeof *cl);
            if (!cl)
                return oom(rep, a);
            wbproto__container_lease__init(cl);
            cl->lease_id.data = l->id;
            cl->lease_id.len = WB_LEASE_ID_LEN;
            cl->model = l->model->name;
            cl->bound_bytes = r->bound_bytes;
            cl->bound_tensors = r->bound_tensors;
            ci->leases[ci->n_leases++] = cl;
        }
    }
    qsort(list, n, sizeof *list, cmp_container);
    lr->n_containers = n;
    lr->containers = n ? list : NULL;
    rep->body_case = WBPROTO__REPLY__BODY_LIST_CONTAINERS;
    rep->list_containers = lr;
    return 0;
}

static int op_list_leases(wb_broker *b, wb_arena *a, Wbproto__Reply *rep)
{
    size_t n = b->leases.n_leases;
    Wbproto__ListLeasesReply *lr = wb__arena_alloc(a, sizeof *lr);
    Wbproto__LeaseInfo *infos = wb__arena_alloc(a, (n ? n : 1) * sizeof *infos);
    Wbproto__LeaseInfo **ptrs = wb__arena_alloc(a, (n ? n : 1) * sizeof *ptrs);
    if (!lr || !infos || !ptrs)
        return oom(rep, a);
    wbproto__list_leases_reply__init(lr);
    for (size_t i = 0; i < n; i++) {
        wb_lease_rec *l = b->leases.leases[i];
        Wbproto__LeaseInfo *li = &infos[i];
        wbproto__lease_info__init(li);
        li->id.data = l->id;
        li->id.len = WB_LEASE_ID_LEN;
        li->model = l->model->name;
        li->pid = l->pid;
        li->uid = l->uid;
        li->gid = l->gid;
        li->process_name = l->comm;
        li->state = l->state;
        li->containers = l->containers;
        li->slabs = l->model->data.n_slabs;
        li->bytes = l->model->data.bytes;
        li->granted_at = l->granted_at;
        li->last_heartbeat = l->last_heartbeat;
        const Wbproto__LeaseBeat *recs = container_records(l, a);
        if (recs) {
            li->n_container_records = recs->n_container_records;
            li->container_records = recs->container_records;
        }
        ptrs[i] = li;
    }
    lr->n_leases = n;
    lr->leases = n ? ptrs : NULL;
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
    int crc = wb__broker_check_load(b, name, path, &cerr);
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
    wb__models_add(&b->models, m);
    wb_info("model_load_start", "model=%s path=%s backend=%s pid=%u uid=%u",
            wb__log_quote(q, sizeof q, name), wb__log_quote(qp, sizeof qp, path),
            b->cfg.backend->name, peer->pid, peer->uid);
    if (b->loader) {
        wb__loader_submit(b->loader, job);
        return WB_OPS_DEFERRED;
    }
    job->rc = wb__load(path, job->backend, job->device, NULL, &job->data, &job->err);
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
        return op_list_leases(b, a, rep);
    case WBPROTO__REQUEST__BODY_LIST_CONTAINERS:
        return op_list_containers(b, a, rep);
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
