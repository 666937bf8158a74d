/* The lease operations: hello, acquire (the copy on the peer's device and
 * its tensor table in the form asked for), release, and heartbeats with the
 * container records they carry. */
#include "ops_impl.h"
#include "tier.h"

#include "alloc.h"
#include "log.h"
#include "ratelog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef WB_VERSION
#define WB_VERSION "0.0.0"
#endif

int wb__ops_lease_tail(const wb_model *m, unsigned copy, enum wb_lease_tail which,
                       Wbproto__Lease *lw, wb_arena *a)
{
    /* The cached bytes start with the tag of `model` (field 2, length
     * delimited: 0x12). protobuf-c packs an unknown field as its tag and
     * then its data verbatim, after the known fields (here only the id):
     * one unknown field whose tag is 2 and whose data is the rest of the
     * cached bytes therefore packs to exactly the Lease packed field by
     * field, without walking the tensors. */
    if (!m->wire || copy >= m->data.n_copies)
        return WB_EINVAL;
    const wb_model_wire *w = &m->wire[copy];
    if (which == WB_TAIL_TABLE) {
        /* The fields themselves: the table is one bytes field. */
        if (!m->table)
            return WB_EINVAL;
        lw->model = m->name;
        lw->n_slabs = w->n_slab_ptrs;
        lw->slabs = w->slab_ptrs;
        lw->tensor_table.data = m->table;
        lw->tensor_table.len = m->table_len;
        lw->version = m->version;
        lw->checksums_pending = m->checksums_state != WB_CHECKSUMS_READY;
        return WB_OK;
    }
    const uint8_t *tail = which == WB_TAIL_CACHED   ? w->cached_tail
                          : which == WB_TAIL_FRAME  ? (m->table ? w->frame_tail : NULL)
                          : which == WB_TAIL_SHARED ? (m->table ? w->shared_tail : NULL)
                                                    : w->lease_tail;
    size_t len = which == WB_TAIL_CACHED   ? w->cached_tail_len
                 : which == WB_TAIL_FRAME  ? w->frame_tail_len
                 : which == WB_TAIL_SHARED ? w->shared_tail_len
                                           : w->lease_tail_len;
    if (!tail || len < 2 || tail[0] != 0x12)
        return WB_EINVAL;
    ProtobufCMessageUnknownField *u = wb__arena_alloc(a, sizeof *u);
    if (!u)
        return WB_ENOMEM;
    u->tag = 2;
    u->wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
    u->len = len - 1;
    u->data = (uint8_t *)tail + 1;
    lw->base.n_unknown_fields = 1;
    lw->base.unknown_fields = u;
    return WB_OK;
}

int wb__ops_hello(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                  wb_ops_reply *r)
{
    Wbproto__HelloReply *h = wb__arena_alloc(&r->arena, sizeof *h);
    if (!h)
        return wb__ops_oom(r);
    wbproto__hello_reply__init(h);
    h->broker_version = WB_VERSION;
    h->broker_pid = b->pid;
    h->backend = b->cfg.backend->proto;
    h->heartbeat_interval_ms = b->pace.interval_ms;
    h->stale_after_ms = b->pace.stale_ms;
    h->peer_uid = peer->uid;
    h->peer_gid = peer->gid;
    h->peer_pid = peer->pid;
    h->broker_instance = b->instance;
    r->msg.body_case = WBPROTO__REPLY__BODY_HELLO;
    r->msg.hello = h;
    char q[300];
    wb_debug("hello", "pid=%u uid=%u client=%s", peer->pid, peer->uid,
             wb__log_quote(q, sizeof q, req->hello->client));
    return 0;
}

int wb__ops_acquire(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                    wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    const char *name = req->acquire->model;
    char q[300];
    /* New leases are on the current version; one that stands for a name
     * without a current version says why there is none. */
    wb_model *m = wb__models_current(&b->models, name);
    if (!m)
        m = wb__models_find(&b->models, name);
    if (!m)
        return wb__ops_fail(r, WB_ENOTFOUND, "no model named '%s'", name);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING)
        return wb__ops_fail(r, WB_ESTATE, "model '%s' is loading; try again when it is ready",
                            name);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
        return wb__ops_fail(r, WB_ESTATE,
                            "model '%s' is draining (unload requested); new leases are refused",
                            name);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_FAILED)
        return wb__ops_fail(r, WB_ESTATE,
                            "model '%s' failed to load: %s (an administrator may load it again "
                            "or unload it)",
                            name, m->error ? m->error : "no reason recorded");
    if (m->state != WBPROTO__MODEL_STATE__MODEL_READY)
        return wb__ops_fail(r, WB_ESTATE, "model '%s' is %s", name, wb__model_state_name(m->state));
    /* Off its device (the memory budget): brought back, asked again. */
    if (m->tier != WB_TIER_DEVICE) {
        int trc = wb__tier_acquire(b, m, r);
        if (trc >= 0)
            return trc;
    }
    /* The copy on the client's device (by UUID, else by the broker's
     * ordinal), or the first ready one for a client that names none. */
    const Wbproto__AcquireRequest *aq = req->acquire;
    unsigned copy = 0;
    wb_err lerr;
    if (wb__model_pick_copy(m, aq->device_set, aq->device, aq->device_uuid, aq->allow_peer, &copy,
                            &lerr) != WB_OK)
        return wb__ops_fail(r, lerr.code, "%s", lerr.msg);
    /* Refuse before granting: a lease whose reply cannot be delivered would
     * be held by nobody. */
    if (wb__limits_check_lease_size(&b->limits, name, m->wire[copy].lease_size, &lerr) != WB_OK)
        return wb__ops_fail(r, WB_ELIMIT, "%s", lerr.msg);
    /* Peers whose pid is hidden count together, by uid. */
    uint32_t held;
    wb__leases_quota_use(&b->leases, peer, &held, NULL);
    if (wb__limits_check_leases(&b->limits, peer->pid, peer->uid, held, &lerr) != WB_OK) {
        wb_warn_peer("limit", peer->uid, "limit=max_leases_per_client pid=%u uid=%u leases=%u",
                     peer->pid, peer->uid, held);
        return wb__ops_fail(r, WB_ELIMIT, "%s", lerr.msg);
    }

    Wbproto__AcquireReply *ar = wb__arena_alloc(a, sizeof *ar);
    Wbproto__Lease *lw = wb__arena_alloc(a, sizeof *lw);
    if (!ar || !lw)
        return wb__ops_oom(r);

    wb_lease_rec *l;
    wb_err err;
    int rc = wb__leases_grant(&b->leases, m, peer, NULL, b->now_ms(), b->now_wall(), &l, &err);
    if (rc != WB_OK)
        return wb__ops_fail(r, rc, "%s", err.msg);
    m->leases++;
    wb__tier_touch(b, m);
    l->copy = copy;
    m->data.copies[copy].leases++;
    b->stats.leases_granted++;
    char hex[9], qc[80], qn[32];
    /* Per-lease lines are debug: at thousands of leases a second, info
     * lines cost the broker more than the grant itself. */
    if (wb__log_get_level() <= WB_LOG_DEBUG)
        wb_debug("lease_grant",
                 "lease=%s model=%s version=%u device=%d pid=%s uid=%u gid=%u comm=%s",
                 wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, m->name), m->version,
                 m->data.copies[copy].device, wb__peer_name(l->pid, qn, sizeof qn), l->uid, l->gid,
                 wb__log_quote(qc, sizeof qc, l->comm));

    wbproto__acquire_reply__init(ar);
    wbproto__lease__init(lw);
    lw->id.data = l->id;
    lw->id.len = WB_LEASE_ID_LEN;
    /* A client that holds this model's table gets none; one that reads
     * the compact table gets where it lies in shared memory when it asks
     * so and the model has it there, else the table as a second frame
     * when it asks so, else inside the reply; else (or when it could not
     * be built) the tensors as messages. */
    enum wb_lease_tail which = WB_TAIL_TENSORS;
    if (aq->tensor_table)
        which = aq->tensor_table_digest.len == sizeof m->table_digest &&
                        memcmp(aq->tensor_table_digest.data, m->table_digest,
                               sizeof m->table_digest) == 0
                    ? WB_TAIL_CACHED
                : aq->tensor_table_shared && m->table_shm.addr ? WB_TAIL_SHARED
                : aq->tensor_table_frame                       ? WB_TAIL_FRAME
                                                               : WB_TAIL_TABLE;
    int made = wb__ops_lease_tail(m, copy, which, lw, a) == WB_OK;
    /* What could not be made falls back: to the frame when asked, to the
     * table inside the reply, then to the tensors as messages, then to
     * packing field by field. */
    if (!made && which == WB_TAIL_SHARED && aq->tensor_table_frame)
        made = wb__ops_lease_tail(m, copy, which = WB_TAIL_FRAME, lw, a) == WB_OK;
    if (made && which == WB_TAIL_FRAME) {
        r->frame = m->table;
        r->frame_len = m->table_len;
    }
    if (!made && (which == WB_TAIL_CACHED || which == WB_TAIL_FRAME || which == WB_TAIL_SHARED))
        made = wb__ops_lease_tail(m, copy, WB_TAIL_TABLE, lw, a) == WB_OK;
    if (!made && which != WB_TAIL_TENSORS)
        made = wb__ops_lease_tail(m, copy, WB_TAIL_TENSORS, lw, a) == WB_OK;
    if (!made) {
        lw->model = m->name;
        lw->n_slabs = m->wire[copy].n_slab_ptrs;
        lw->slabs = m->wire[copy].slab_ptrs;
        lw->n_tensors = m->data.n_tensors;
        lw->tensors = m->wire_tensor_ptrs;
        lw->version = m->version;
        lw->checksums_pending = m->checksums_state != WB_CHECKSUMS_READY;
    }
    ar->lease = lw;
    r->msg.body_case = WBPROTO__REPLY__BODY_ACQUIRE;
    r->msg.acquire = ar;
    return 0;
}

int wb__ops_release(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                    wb_ops_reply *r)
{
    const uint8_t *id = req->release->lease_id.data;
    Wbproto__ReleaseReply *rr = wb__arena_alloc(&r->arena, sizeof *rr);
    if (!rr)
        return wb__ops_oom(r);
    wb_lease_rec *l = wb__leases_find(&b->leases, id);
    unsigned copy = l ? l->copy : 0;
    char comm[32] = "?";
    if (l && wb__log_get_level() <= WB_LOG_DEBUG)
        snprintf(comm, sizeof comm, "%s", l->comm);
    wb_model *m;
    wb_err err;
    int rc = wb__leases_release(&b->leases, peer, id, &m, &err);
    if (rc != WB_OK)
        return wb__ops_fail(r, rc, "%s", err.msg);
    b->stats.leases_released++;
    char hex[9], q[300], qc[80];
    if (wb__log_get_level() <= WB_LOG_DEBUG)
        wb_debug("lease_release", "lease=%s model=%s pid=%u comm=%s", wb__lease_id_short(id, hex),
                 wb__log_quote(q, sizeof q, m->name), peer->pid,
                 wb__log_quote(qc, sizeof qc, comm));
    wbproto__release_reply__init(rr);
    rr->model_state = wb__broker_lease_ended(b, m, copy);
    r->msg.body_case = WBPROTO__REPLY__BODY_RELEASE;
    r->msg.release = rr;
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
    wb_container_rec *recs = wb__malloc(size);
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
        c->swaps = r->swaps;
        c->last_swap_ms = r->last_swap_ms;
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

/* The current version of each model the connection subscribed to, so that
 * a notice it missed (dropped while its queue was full) reaches it now. */
static int current_versions(const wb_broker *b, Wbproto__HeartbeatReply *hr, uint64_t serial,
                            wb_arena *a)
{
    const wb_sub_conn *sc = wb__subs_of(&b->subs, serial);
    if (!sc || sc->n == 0)
        return WB_OK;
    Wbproto__VersionNotice *v = wb__arena_alloc(a, sc->n * sizeof *v);
    Wbproto__VersionNotice **vp = wb__arena_alloc(a, sc->n * sizeof *vp);
    if (!v || !vp)
        return WB_ENOMEM;
    for (uint32_t k = 0; k < sc->n; k++) {
        wbproto__version_notice__init(&v[k]);
        v[k].model = sc->names[k];
        const wb_model *cur = wb__models_current(&b->models, sc->names[k]);
        v[k].version = cur ? cur->version : 0;
        vp[k] = &v[k];
    }
    hr->current_versions = vp;
    hr->n_current_versions = sc->n;
    return WB_OK;
}

/* Observes one container swap: logged and counted in the histogram. */
static void swap_seen(wb_broker *b, const wb_lease_rec *l, const Wbproto__ContainerRecord *c)
{
    static const double bounds[] = WB_SWAP_BOUNDS;
    char q[300];
    double secs = c->last_swap_ms / 1000.0;
    size_t k = 0;
    while (k < sizeof bounds / sizeof bounds[0] && secs > bounds[k])
        k++;
    b->stats.swap_buckets[k]++;
    b->stats.swap_seconds_sum += secs;
    b->stats.container_swaps++;
    wb_info("container_swapped", "pid=%u container=%llu model=%s version=%u swaps=%u swap_ms=%.3f",
            l->pid, (unsigned long long)c->container_id, wb__log_quote(q, sizeof q, l->model->name),
            l->model->version, c->swaps, c->last_swap_ms);
}

/* A container whose swaps count grew since the broker last heard of it:
 * on this lease (its record there had fewer), or new on this lease with
 * swaps (it swapped onto this lease's version). A container reported on
 * several leases of the beat counts once, at its first. */
static void note_swaps(wb_broker *b, const wb_lease_rec *l, const Wbproto__LeaseBeat *beat,
                       const Wbproto__HeartbeatRequest *hb, size_t i)
{
    for (size_t k = 0; k < beat->n_container_records; k++) {
        const Wbproto__ContainerRecord *c = beat->container_records[k];
        if (c->swaps == 0)
            continue;
        uint32_t before = 0;
        int known = 0;
        for (uint32_t j = 0; j < l->n_records; j++) {
            if (l->records[j].id == c->container_id) {
                before = l->records[j].swaps;
                known = 1;
            }
        }
        if (known && c->swaps <= before)
            continue;
        int earlier = 0;
        for (size_t e = 0; e < i && !earlier; e++) {
            for (size_t f = 0; f < hb->leases[e]->n_container_records; f++)
                earlier |= hb->leases[e]->container_records[f]->container_id == c->container_id;
        }
        if (!earlier)
            swap_seen(b, l, c);
    }
}

/* A heartbeat is checked whole before anything is applied: a bad one
 * changes nothing (no liveness, no records). */
int wb__ops_heartbeat(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                      const void *ident, size_t ident_len, wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    const Wbproto__HeartbeatRequest *hb = req->heartbeat;
    size_t nb = hb->n_leases;
    Wbproto__HeartbeatReply *hr = wb__arena_alloc(a, sizeof *hr);
    ProtobufCBinaryData *unknown = wb__arena_alloc(a, (nb ? nb : 1) * sizeof *unknown);
    beat_plan *plan = wb__arena_alloc(a, (nb ? nb : 1) * sizeof *plan);
    beat_plan **known = wb__arena_alloc(a, (nb ? nb : 1) * sizeof *known);
    if (!hr || !unknown || !plan || !known)
        return wb__ops_oom(r);
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
            wb_warn_peer("bad_heartbeat", peer->uid, "pid=%u uid=%u lease=%s error=\"%s\"",
                         peer->pid, peer->uid, wb__lease_id_short(l->id, hex), err.msg);
            return wb__ops_fail(r, WB_EPROTO, "%s", err.msg);
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
            return wb__ops_fail(
                r, WB_EPROTO, "heartbeat.leases[%zu] repeats leases[%zu] (lease %s)", i > j ? i : j,
                i > j ? j : i, wb__lease_id_short(known[k]->lease->id, hex));
        }
    }
    uint64_t total;
    wb__leases_quota_use(&b->leases, peer, NULL, &total);
    for (size_t k = 0; k < n_known; k++) {
        total -= known[k]->lease->record_bytes < total ? known[k]->lease->record_bytes : total;
        total += known[k]->size;
    }
    if (wb__limits_check_records(&b->limits, peer->pid, total, &err) != WB_OK) {
        wb_warn_peer("limit", peer->uid, "limit=max_record_bytes pid=%u uid=%u bytes=%llu",
                     peer->pid, peer->uid, (unsigned long long)total);
        return wb__ops_fail(r, WB_ELIMIT, "%s", err.msg);
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
        note_swaps(b, l, beat, hb, i);
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
    hr->heartbeat_interval_ms = b->pace.interval_ms;
    hr->stale_after_ms = b->pace.stale_ms;
    if (current_versions(b, hr, wb__ops_serial(ident, ident_len), a) != WB_OK)
        return wb__ops_oom(r);
    r->msg.body_case = WBPROTO__REPLY__BODY_HEARTBEAT;
    r->msg.heartbeat = hr;
    return 0;
}
