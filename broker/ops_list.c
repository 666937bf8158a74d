/* The listings: leases, containers, models and the counters, and a model
 * as they show it (wb__ops_model_info, also in load and unload replies). */
#include "ops_impl.h"
#include "tier.h"

#include "backend_vmm.h"
#include "share.h"

#include <stdlib.h>
#include <string.h>

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

/* How many of `total` entries a page from `offset` may hold at most: the
 * requested limit, where 0 (or too many) means LIST_PAGE_MAX. */
static size_t page_cap(size_t total, uint32_t offset, uint32_t limit)
{
    size_t cap = total > offset ? total - offset : 0;
    size_t max = limit == 0 || limit > LIST_PAGE_MAX ? LIST_PAGE_MAX : limit;
    return cap > max ? max : cap;
}

/* The offset of the page after one of `n` entries from `offset`; 0 when
 * that was the last. */
static uint32_t page_next(uint32_t offset, size_t n, size_t total)
{
    size_t nxt = (size_t)offset + n;
    return nxt < total ? (uint32_t)nxt : 0;
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
    r->swaps = c->swaps;
    r->last_swap_ms = c->last_swap_ms;
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
int wb__ops_list_containers(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                            wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    const wb_lease_table *t = &b->leases;
    int admin = wb__ops_is_admin(b, peer);
    size_t n_refs = 0;
    for (size_t i = 0; i < t->n_leases; i++)
        n_refs += t->leases[i]->n_records;
    container_ref *refs = wb__arena_alloc(a, (n_refs ? n_refs : 1) * sizeof *refs);
    Wbproto__ListContainersReply *lr = wb__arena_alloc(a, sizeof *lr);
    if (!refs || !lr)
        return wb__ops_oom(r);
    size_t k = 0;
    for (size_t i = 0; i < t->n_leases; i++) {
        const wb_lease_rec *l = t->leases[i];
        for (uint32_t j = 0; j < l->n_records; j++)
            refs[k++] = (container_ref){l->pid, l->records[j].id, l, &l->records[j]};
    }
    qsort(refs, n_refs, sizeof *refs, cmp_ref);
    size_t total = 0;
    for (size_t i = 0; i < n_refs; i++)
        total += i == 0 || refs[i].pid != refs[i - 1].pid || refs[i].cid != refs[i - 1].cid;

    wbproto__list_containers_reply__init(lr);
    uint32_t offset = req->list_containers->offset;
    size_t cap = page_cap(total, offset, req->list_containers->limit);
    Wbproto__ContainerInfo **list = wb__arena_alloc(a, (cap ? cap : 1) * sizeof *list);
    if (!list)
        return wb__ops_oom(r);
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
            return wb__ops_oom(r);
        wbproto__container_info__init(ci);
        ci->pid = g->pid;
        /* /proc's comm is any bytes the process chose. */
        ci->process_name = (char *)wb__ops_utf8(a, g->lease->comm);
        if (!ci->process_name)
            return wb__ops_oom(r);
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
        ci->swaps = g->rec->swaps;
        ci->last_swap_ms = g->rec->last_swap_ms;
        for (size_t j = 0; j < m; j++) {
            wbproto__container_lease__init(&cls[j]);
            cls[j].lease_id = shown_id(g[j].lease, peer, admin);
            cls[j].model = g[j].lease->model->name;
            cls[j].bound_bytes = g[j].rec->bound_bytes;
            cls[j].bound_tensors = g[j].rec->bound_tensors;
            cls[j].version = g[j].lease->model->version;
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
    lr->n_containers = n;
    lr->containers = n ? list : NULL;
    lr->total = (uint32_t)total;
    lr->next_offset = page_next(offset, n, total);
    r->msg.body_case = WBPROTO__REPLY__BODY_LIST_CONTAINERS;
    r->msg.list_containers = lr;
    return 0;
}

int wb__ops_list_leases(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                        wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    const wb_lease_table *t = &b->leases;
    int admin = wb__ops_is_admin(b, peer);
    size_t total = t->n_leases;
    uint32_t offset = req->list_leases->offset;
    size_t cap = page_cap(total, offset, req->list_leases->limit);
    Wbproto__ListLeasesReply *lr = wb__arena_alloc(a, sizeof *lr);
    Wbproto__LeaseInfo *infos = wb__arena_alloc(a, (cap ? cap : 1) * sizeof *infos);
    Wbproto__LeaseInfo **ptrs = wb__arena_alloc(a, (cap ? cap : 1) * sizeof *ptrs);
    if (!lr || !infos || !ptrs)
        return wb__ops_oom(r);
    wbproto__list_leases_reply__init(lr);
    size_t budget = list_budget(b), used = 0, n = 0;
    for (; n < cap; n++) {
        const wb_lease_rec *l = t->leases[offset + n];
        Wbproto__LeaseInfo *li = &infos[n];
        wbproto__lease_info__init(li);
        li->id = shown_id(l, peer, admin);
        li->model = l->model->name;
        li->version = l->model->version;
        li->pid = l->pid;
        li->uid = l->uid;
        li->gid = l->gid;
        /* /proc's comm is any bytes the process chose. */
        li->process_name = (char *)wb__ops_utf8(a, l->comm);
        if (!li->process_name)
            return wb__ops_oom(r);
        li->state = l->state;
        li->containers = l->containers;
        li->slabs = 1 + l->model->data.n_groups; /* its own and those it borrows */
        if (l->copy < l->model->data.n_copies) {
            li->device = l->model->data.copies[l->copy].device;
            li->device_uuid = l->model->data.copies[l->copy].uuid;
        } else {
            li->device = l->model->device;
        }
        li->bytes = l->model->data.bytes;
        li->granted_at = l->granted_at;
        li->last_heartbeat = l->last_heartbeat;
        li->container_records_total = l->n_records;
        li->backend = l->model->backend->proto;
        li->transport = (char *)wb__backend_transport(l->model->backend);
        li->access = (char *)wb__backend_access(l->model->backend);
        if (l->n_records) {
            Wbproto__ContainerRecord **recs = wb__arena_alloc(a, l->n_records * sizeof *recs);
            if (!recs)
                return wb__ops_oom(r);
            for (uint32_t j = 0; j < l->n_records; j++) {
                if (!(recs[j] = record_info(&l->records[j], a)))
                    return wb__ops_oom(r);
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
    lr->n_leases = n;
    lr->leases = n ? ptrs : NULL;
    lr->total = (uint32_t)total;
    lr->next_offset = page_next(offset, n, total);
    r->msg.body_case = WBPROTO__REPLY__BODY_LIST_LEASES;
    r->msg.list_leases = lr;
    return 0;
}

Wbproto__ModelInfo *wb__ops_model_info(const wb_model *m, int state, wb_arena *a)
{
    Wbproto__ModelInfo *mi = wb__arena_alloc(a, sizeof *mi);
    if (!mi)
        return NULL;
    wbproto__model_info__init(mi);
    mi->name = wb__arena_strdup(a, m->name);
    /* A preloaded model's path comes from the command line: any bytes. */
    char *path = wb__arena_strdup(a, m->path);
    mi->path = path ? (char *)wb__ops_utf8(a, path) : NULL;
    if (!mi->name || !mi->path)
        return NULL;
    mi->state = state;
    mi->version = m->version;
    mi->current = m->current && state == WBPROTO__MODEL_STATE__MODEL_READY;
    if (m->published) {
        /* A published version's checksums are the broker's: computed as it
         * copies host bytes, read back after the version is current from
         * device memory. */
        mi->published_by_pid = m->published_by_pid;
        mi->published_by_uid = m->published_by_uid;
        mi->checksums = m->state == WBPROTO__MODEL_STATE__MODEL_LOADING ||
                                m->checksums_state == WB_CHECKSUMS_PENDING
                            ? (char *)"pending"
                        : m->checksums_state == WB_CHECKSUMS_FAILED ? (char *)"failed"
                                                                    : (char *)"ready";
    }
    mi->backend = m->backend->proto;
    mi->device = m->device;
    mi->tensors = (uint32_t)m->data.n_tensors;
    mi->bytes = m->data.bytes;
    mi->slab_bytes = m->data.slab_bytes;
    mi->shared_bytes = m->data.shared_bytes;
    mi->shared_tensors = m->data.shared_tensors;
    /* A published version lends its tensors once its checksums are known. */
    mi->share = !m->no_share && (!m->published || m->data.holds) &&
                strcmp(wb__backend_access(m->backend), "ro") == 0;
    mi->tier = (char *)wb__tier_name(m->tier);
    mi->host_bytes = m->host_bytes;
    mi->restores = m->restores;
    mi->last_restore_seconds = m->restore_seconds;
    mi->last_restore_gbps = m->restore_gbps;
    mi->last_restore_at = m->restore_at;
    mi->last_used_at = m->used_wall;
    mi->leases = m->leases;
    mi->load_seconds = m->data.load_seconds;
    mi->load_gbps = m->data.load_gbps;
    mi->transport = (char *)wb__backend_transport(m->backend);
    mi->access = (char *)wb__backend_access(m->backend);
    /* A move or restore under way pins the model: not a lease. */
    if (m->tier_job && mi->leases)
        mi->leases--;
    /* Why its last restore failed (told to the next acquire too). */
    const char *error = m->error ? m->error : m->tier_error;
    if (error) {
        /* A load error may quote a path from the command line. */
        char *why = wb__arena_strdup(a, error);
        if (!why || !(mi->error = (char *)wb__ops_utf8(a, why)))
            return NULL;
    }
    wb__load_fill_model_info(m, mi);
    /* One entry per device: while loading (or after a failed load), the
     * devices asked for, in the model's state. */
    int planned = m->state == WBPROTO__MODEL_STATE__MODEL_LOADING || !m->data.copies;
    size_t nc = planned ? m->n_devices : m->data.n_copies;
    Wbproto__ModelCopy **cp = nc ? wb__arena_alloc(a, nc * sizeof *cp) : NULL;
    Wbproto__ModelCopy *cv = nc ? wb__arena_alloc(a, nc * sizeof *cv) : NULL;
    if (nc && (!cp || !cv))
        return NULL;
    for (size_t k = 0; k < nc; k++) {
        Wbproto__ModelCopy *c = &cv[k];
        wbproto__model_copy__init(c);
        cp[k] = c;
        if (planned) {
            c->device = m->devices[k];
            c->state = state;
            continue;
        }
        const wb_model_copy *mc = &m->data.copies[k];
        c->device = mc->device;
        /* Copied: an unload's reply may outlive the model. */
        c->device_uuid = wb__arena_strdup(a, mc->uuid);
        char *why = wb__arena_strdup(a, mc->error);
        c->error = why ? (char *)wb__ops_utf8(a, why) : NULL;
        if (!c->device_uuid || !c->error)
            return NULL;
        c->state = mc->state;
        /* A draining model's copies drain with it. */
        if (mc->state == WBPROTO__MODEL_STATE__MODEL_READY &&
            state != WBPROTO__MODEL_STATE__MODEL_READY)
            c->state = state;
        c->slab_bytes = m->data.slabs[k].size;
        c->leases = mc->leases;
        c->copy_seconds = mc->copy_seconds;
    }
    mi->n_copies = nc;
    mi->copies = cp;
    return mi;
}

int wb__ops_list_models(wb_broker *b, wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    size_t n = b->models.n;
    Wbproto__ListModelsReply *lr = wb__arena_alloc(a, sizeof *lr);
    Wbproto__ModelInfo **ptrs = wb__arena_alloc(a, (n ? n : 1) * sizeof *ptrs);
    if (!lr || !ptrs)
        return wb__ops_oom(r);
    wbproto__list_models_reply__init(lr);
    size_t i = 0;
    for (wb_model *m = b->models.head; m && i < n; m = m->next) {
        if (!(ptrs[i++] = wb__ops_model_info(m, m->state, a)))
            return wb__ops_oom(r);
    }
    lr->n_models = i;
    lr->models = i ? ptrs : NULL;
    r->msg.body_case = WBPROTO__REPLY__BODY_LIST_MODELS;
    r->msg.list_models = lr;
    return 0;
}

int wb__ops_stats(wb_broker *b, wb_ops_reply *r)
{
    Wbproto__StatsReply *s = wb__arena_alloc(&r->arena, sizeof *s);
    if (!s)
        return wb__ops_oom(r);
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
    s->models = (uint32_t)wb__models_names(&b->models);
    for (wb_model *m = b->models.head; m; m = m->next)
        s->model_bytes += m->data.bytes;
    wb__broker_share_bytes(b, &s->logical_bytes, &s->unique_bytes);
    wb_share_stats ss;
    wb__share_stats(b->share, &ss);
    s->shared_tensors_total = ss.shared_tensors_total;
    s->shared_bytes_total = ss.shared_bytes_total;
    s->share_mismatches = ss.mismatches_total;
    if (b->budget) {
        unsigned slot = b->cfg.device < 0 ? 0 : (unsigned)b->cfg.device + 1;
        s->device_memory_budget = slot < WB_TIER_SLOTS ? b->budget->limit[slot] : 0;
    }
    s->host_memory_budget = b->host_budget;
    s->host_tier_bytes = b->host_tier_bytes;
    s->moved_to_host = st->moved_to_host;
    s->evicted = st->evicted;
    s->restores = st->restores;
    s->reloads = st->reloads;
    s->restore_failures = st->restore_failures;
    s->loads_total = st->loads_total;
    s->loads_failed = st->loads_failed;
    s->loads_cancelled = st->loads_cancelled;
    s->load_bytes_total = st->load_bytes_total;
    s->load_seconds_total = st->load_seconds_total;
    s->rollouts_total = st->rollouts_total;
    s->rollouts_failed = st->rollouts_failed;
    s->rollbacks_total = st->rollbacks_total;
    s->versions_draining = (uint32_t)wb__broker_versions_draining(b);
    s->notices_sent = st->notices_sent;
    s->notices_dropped = st->notices_dropped;
    s->publishes_total = st->publishes_total;
    s->publishes_failed = st->publishes_failed;
    s->publish_bytes_total = st->publish_bytes_total;
    s->slab_pool_bytes = wb__vmm_pool_bytes(-1);
    wb__vmm_pool_counts(&s->slab_pool_hits, &s->slab_pool_misses);
    s->peers = (uint32_t)b->leases.n_holders;
    wb__load_fill_stats(b->cfg.backend, &b->models, s);
    s->requests_refused = st->requests_refused;
    s->limit_refusals = st->limit_refusals;
    s->replies_dropped = st->replies_dropped;
    s->peers_refused = st->peers_refused;
    s->peers_disconnected = st->peers_disconnected;
    s->connections = st->connections;
    r->msg.body_case = WBPROTO__REPLY__BODY_STATS;
    r->msg.stats = s;
    return 0;
}
