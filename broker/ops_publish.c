/* The publish requests (publish.h): begin (the rights, the table against
 * the current version's, the limits, the slabs reserved as a loading
 * version), commit (the sources and placements checked, then the copy on
 * the loader thread, answered when it ends) and abort. */
#include "ops_impl.h"
#include "tier.h"
#include "share.h"

#include "alloc.h"
#include "clock.h"
#include "log.h"
#include "names.h"
#include "publish.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* A publish refused: counted and logged as a failed one. */
__attribute__((format(printf, 4, 5))) static int refuse(wb_broker *b, wb_ops_reply *r, int status,
                                                        const char *fmt, ...)
{
    char msg[WB_ERR_MSG_MAX], q[WB_ERR_MSG_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b->stats.publishes_failed++;
    wb_warn("publish_refused", "status=%s error=%s", wb_status_name(status),
            wb__log_quote(q, sizeof q, msg));
    return wb__ops_fail(r, status, "%s", msg);
}

/* "[4096, 4096]" */
static const char *shape_text(const uint64_t *shape, size_t n, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    at += (size_t)snprintf(buf, size, "[");
    for (size_t i = 0; i < n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%llu", i ? ", " : "",
                               (unsigned long long)shape[i]);
    if (at < size)
        snprintf(buf + at, size - at, "]");
    return buf;
}

/* product(shape) * element bits / 8, or UINT64_MAX when it overflows. */
static uint64_t table_nbytes(int dtype, const uint64_t *shape, size_t n)
{
    uint64_t count = 1;
    for (size_t i = 0; i < n; i++) {
        if (__builtin_mul_overflow(count, shape[i], &count))
            return UINT64_MAX;
    }
    uint64_t bits;
    if (__builtin_mul_overflow(count, (uint64_t)wb__dtype_bits((wb_dtype)dtype), &bits))
        return UINT64_MAX;
    return (bits + 7) / 8;
}

/* The nearest name of the current version's table, for "did you mean". */
static const char *nearest(const wb_model *cur, const char *name)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < cur->data.n_tensors; i++) {
        size_t d = wb__names_distance(name, cur->data.tensors[i].name);
        if (d < best_d) {
            best_d = d;
            best = cur->data.tensors[i].name;
        }
    }
    return best;
}

/* An index of d's tensors by name (NULL when memory is short: the look-ups
 * then scan). Free with free(). */
static wb__names_hash *index_of(const wb_model_data *d)
{
    return wb__names_hash_new(d->tensors, d->n_tensors, sizeof *d->tensors,
                              offsetof(wb_model_tensor, name));
}

/* The index of the (first) tensor called `name` in d, or SIZE_MAX. */
static size_t tensor_index(const wb__names_hash *h, const wb_model_data *d, const char *name)
{
    if (h) {
        const wb_model_tensor *t = wb__names_hash_find(h, d->tensors, sizeof *d->tensors,
                                                       offsetof(wb_model_tensor, name), name);
        return t ? (size_t)(t - d->tensors) : SIZE_MAX;
    }
    for (size_t i = 0; i < d->n_tensors; i++) {
        if (strcmp(d->tensors[i].name, name) == 0)
            return i;
    }
    return SIZE_MAX;
}

/* The begin's table against the current version's: every tensor named is
 * one of it, with its dtype and shape; without `partial`, all of them.
 * named[i] marks the current version's tensor i. */
static int check_each(wb_broker *b, const Wbproto__PublishBeginRequest *rq, const wb_model *cur,
                      const wb__names_hash *h, uint8_t *named, wb_ops_reply *r)
{
    char q[300], s1[200], s2[200];
    for (size_t k = 0; k < rq->n_tensors; k++) {
        const Wbproto__PublishTensor *t = rq->tensors[k];
        size_t i = tensor_index(h, &cur->data, t->name);
        if (i == SIZE_MAX) {
            const char *hint = nearest(cur, t->name);
            return refuse(b, r, WB_ENOTFOUND,
                          "tensor %s is not in model '%s' (version %u)%s%s%s; a publish names "
                          "tensors of the current version",
                          wb__log_quote(q, sizeof q, t->name), cur->name, cur->version,
                          hint ? ": did you mean '" : "", hint ? hint : "", hint ? "'?" : "");
        }
        const wb_model_tensor *mt = &cur->data.tensors[i];
        if (named[i])
            return refuse(b, r, WB_EINVAL, "tensor '%s' is named twice in the publish's table",
                          mt->name);
        named[i] = 1;
        if (strcmp(t->dtype, mt->dtype) != 0)
            return refuse(b, r, WB_EINVAL,
                          "tensor '%s': dtype %s differs from version %u's %s (a publish keeps "
                          "every tensor's dtype and shape)",
                          mt->name, wb__log_quote(q, 80, t->dtype), cur->version, mt->dtype);
        int same = t->n_shape == mt->ndim;
        for (size_t d = 0; same && d < t->n_shape; d++)
            same = t->shape[d] == mt->shape[d];
        if (!same)
            return refuse(b, r, WB_EINVAL,
                          "tensor '%s': shape %s differs from version %u's %s (a publish keeps "
                          "every tensor's dtype and shape)",
                          mt->name, shape_text(t->shape, t->n_shape, s1, sizeof s1), cur->version,
                          shape_text(mt->shape, mt->ndim, s2, sizeof s2));
        if (t->nbytes != mt->nbytes)
            return refuse(b, r, WB_EINVAL,
                          "tensor '%s': nbytes %llu, but its dtype and shape "
                          "make %llu",
                          mt->name, (unsigned long long)t->nbytes, (unsigned long long)mt->nbytes);
    }
    return 0;
}

static int check_against(wb_broker *b, const Wbproto__PublishBeginRequest *rq, const wb_model *cur,
                         uint8_t *named, wb_ops_reply *r)
{
    wb__names_hash *h = index_of(&cur->data);
    int rc = check_each(b, rq, cur, h, named, r);
    free(h);
    if (rc != 0 || r->msg.status)
        return rc;
    if (rq->partial || rq->n_tensors == cur->data.n_tensors)
        return 0;
    size_t missing = 0, first = SIZE_MAX;
    for (size_t i = 0; i < cur->data.n_tensors; i++) {
        if (!named[i]) {
            missing++;
            if (first == SIZE_MAX)
                first = i;
        }
    }
    return refuse(b, r, WB_EINVAL,
                  "the publish names %zu of the %zu tensors of model '%s' (version %u): %zu "
                  "missing, the first '%s'; name them all, or publish with `partial` to keep the "
                  "others' bytes",
                  rq->n_tensors, cur->data.n_tensors, cur->name, cur->version, missing,
                  cur->data.tensors[first].name);
}

/* A new model's table: names, dtypes, sizes. */
static int check_new_table(wb_broker *b, const Wbproto__PublishBeginRequest *rq, wb_st_tensor *st,
                           wb_ops_reply *r)
{
    char q[300];
    wb_err err;
    if (rq->n_tensors == 0)
        return refuse(b, r, WB_EINVAL, "a publish of the new model '%s' names no tensor",
                      rq->model);
    if (wb__limits_check_tensors(&b->limits, rq->model, rq->n_tensors, &err) != WB_OK)
        return refuse(b, r, WB_ELIMIT, "%s", err.msg);
    for (size_t k = 0; k < rq->n_tensors; k++) {
        const Wbproto__PublishTensor *t = rq->tensors[k];
        int dt = wb__dtype_parse(t->dtype);
        if (dt < 0)
            return refuse(b, r, WB_EINVAL, "tensor %s: unknown dtype %s",
                          wb__log_quote(q, sizeof q, t->name),
                          wb__log_quote(q + 150, 100, t->dtype));
        uint64_t n = table_nbytes(dt, t->shape, t->n_shape);
        if (n != t->nbytes)
            return refuse(b, r, WB_EINVAL,
                          "tensor %s: nbytes %llu, but dtype %s and its shape make %llu",
                          wb__log_quote(q, sizeof q, t->name), (unsigned long long)t->nbytes,
                          t->dtype, (unsigned long long)n);
        st[k].name = t->name;
        st[k].dtype = (wb_dtype)dt;
        st[k].ndim = (uint32_t)t->n_shape;
        st[k].shape = t->shape;
        st[k].nbytes = t->nbytes;
    }
    return 0;
}

/* Reserves the slabs of d (laid out already, `size` bytes each) where the
 * version goes: refused before anything is allocated when it does not fit. */
static int reserve(wb_broker *b, const char *name, uint32_t version, uint32_t beside,
                   const int *devs, unsigned n, uint64_t size, wb_model_data *d, wb_ops_reply *r)
{
    wb_load_opts o = {.backend = b->cfg.backend,
                      .device = devs[0],
                      .devices = devs,
                      .n_devices = n,
                      .gpus = &b->cfg.gpus,
                      .name = name,
                      .version = version,
                      .beside = beside,
                      .verb = "publish",
                      .budget = b->budget};
    wb_err err;
    int rc = wb__load_check_fits(&o, name, devs, n, size, &err);
    if (rc == WB_OK)
        rc = wb__load_alloc_copies(&o, devs, n, size, d, &err);
    if (rc != WB_OK)
        return refuse(b, r, rc, "%s", err.msg);
    for (uint32_t k = 0; k < d->n_slabs; k++)
        d->slab_bytes += d->slabs[k].size;
    return 0;
}

int wb__ops_publish_begin(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                          const void *ident, size_t ident_len, wb_ops_reply *r)
{
    const Wbproto__PublishBeginRequest *rq = req->publish_begin;
    const char *name = rq->model;
    char q[300];
    uint64_t serial = wb__ops_serial(ident, ident_len);
    if (serial == 0)
        return wb__ops_fail(r, WB_EINVAL, "a publish needs a connection that lasts until commit");
    if (!wb__model_name_valid(name))
        return refuse(b, r, WB_EINVAL,
                      "model name %s is not 1 to %d characters of A-Z a-z 0-9 . _ -",
                      wb__log_quote(q, 80, name), WB_NAME_MAX);
    wb_model *cur = wb__models_current(&b->models, name);
    wb_model *any = wb__models_find(&b->models, name);
    if (!cur) {
        /* A new model is a load: the administrator's right. */
        if (!wb__ops_is_admin(b, peer)) {
            b->stats.publishes_failed++;
            return wb__ops_refuse_admin(b, peer, "publish new models", r);
        }
        if (any && any->state != WBPROTO__MODEL_STATE__MODEL_FAILED)
            return refuse(b, r, WB_ESTATE,
                          "model '%s' has no current version (version %u is %s): publish once "
                          "it has one, or under another name",
                          name, any->version, wb__model_state_name(any->state));
        wb_err err;
        if (wb__limits_check_models(&b->limits, wb__models_held(&b->models), &err) != WB_OK)
            return refuse(b, r, WB_ELIMIT, "%s", err.msg);
    } else {
        if (!wb__auth_publish_ok(&b->auth, peer)) {
            wb_err err;
            b->stats.publishes_failed++;
            b->stats.requests_refused++;
            wb__auth_refuse_admin(&b->auth, peer, "publish", &err);
            wb_warn("peer_refused", "reason=not_publisher op=publish uid=%u gid=%u pid=%u",
                    peer->uid, peer->gid, peer->pid);
            return wb__ops_fail(r, WB_EPERM,
                                "%s (publishers: --publisher-uid, --publisher-gid, or the "
                                "administrators)",
                                err.msg);
        }
        /* A partial publish reads the current version's slabs: on its
         * device (the memory budget may have moved it). */
        if (cur->tier != WB_TIER_DEVICE) {
            wb_err terr;
            int was = cur->tier;
            if (wb__tier_wake(b, cur, &terr) != WB_OK)
                return refuse(b, r, terr.code, "model '%s' is %s and cannot come back now: %s",
                              name, wb__tier_name(was), terr.msg);
            if (cur->tier != WB_TIER_DEVICE) {
                int rc = refuse(b, r, WB_EBUSY,
                                "model '%s' is %s (the memory budget moved it); publish again "
                                "once it is back on its device",
                                name, wb__tier_name(cur->tier));
                r->msg.retry_after_ms = 20;
                return rc;
            }
        }
        const wb_model *loading =
            wb__models_in_state(&b->models, name, WBPROTO__MODEL_STATE__MODEL_LOADING);
        if (loading)
            return refuse(b, r, WB_ESTATE,
                          "a new version of model '%s' is %s already (version %u): wait for it "
                          "to end, or stop it with `wbctl cancel %s`",
                          name, loading->publish ? "being published" : "loading", loading->version,
                          name);
        size_t held = wb__models_versions(&b->models, name);
        if (held >= b->limits.max_versions)
            return refuse(b, r, WB_ELIMIT,
                          "model '%s' already has %zu versions, the limit (--max-versions %u); a "
                          "version that is no longer current is freed at its last lease (`wbctl "
                          "leases %s` shows them)",
                          name, held, b->limits.max_versions, name);
    }

    wb_publish *p = wb__calloc(1, sizeof *p);
    size_t nt = cur ? cur->data.n_tensors : rq->n_tensors;
    wb_st_tensor *st = wb__calloc(nt ? nt : 1, sizeof *st);
    if (!p || !st || !(p->named = wb__calloc(nt ? nt : 1, 1)) || !(p->name = wb__strdup(name))) {
        free(st);
        if (p) {
            free(p->named);
            free(p);
        }
        return wb__ops_oom(r);
    }
    int devs[WB_GPU_MAX];
    unsigned n_devs = 0;
    int rc = 0;
    /* Each step below answers its refusal in r (the status set). */
    if (cur) {
        check_against(b, rq, cur, p->named, r);
        for (size_t i = 0; i < nt; i++) {
            const wb_model_tensor *mt = &cur->data.tensors[i];
            st[i] = (wb_st_tensor){.name = mt->name,
                                   .dtype = (wb_dtype)wb__dtype_parse(mt->dtype),
                                   .ndim = mt->ndim,
                                   .shape = mt->shape,
                                   .nbytes = mt->nbytes};
        }
        memcpy(devs, cur->devices, cur->n_devices * sizeof devs[0]);
        n_devs = cur->n_devices;
    } else {
        check_new_table(b, rq, st, r);
        memset(p->named, 1, nt);
        wb_err err;
        if (!r->msg.status &&
            wb__broker_placement(b, name, rq->placement, devs, &n_devs, &err) != WB_OK)
            refuse(b, r, err.code, "%s", err.msg);
    }
    rc = r->msg.status ? -1 : 0;
    uint64_t size = 0;
    uint32_t version = cur ? cur->issued + 1 : 1;
    if (cur && version <= cur->version)
        version = cur->version + 1;
    if (rc == 0) {
        wb_st_table table = {.n_tensors = nt, .tensors = st};
        wb_err err;
        if (wb__load_layout(&table, &p->data, &size, &err) != WB_OK) {
            refuse(b, r, err.code, "%s", err.msg);
            rc = -1;
        }
        /* A partial publish keeps the other tensors by borrowing the
         * current version's bytes where it lends them (share.h), else by
         * a copy at commit. */
        if (rc == 0 && cur && rq->partial && !cur->no_share &&
            cur->checksums_state == WB_CHECKSUMS_READY &&
            wb__share_keep(&cur->data, p->named, n_devs, &p->data, &size))
            wb_debug("publish_keep", "model=%s version=%u kept_tensors=%u kept_bytes=%llu",
                     wb__log_quote(q, sizeof q, name), version, p->data.shared_tensors,
                     (unsigned long long)p->data.shared_bytes);
        wb__names_hash *h = rc == 0 && !cur ? index_of(&p->data) : NULL;
        for (size_t i = 0; h && rc == 0 && i < nt; i++) {
            if (tensor_index(h, &p->data, p->data.tensors[i].name) != i) {
                refuse(b, r, WB_EINVAL, "tensor %s is named twice in the publish's table",
                       wb__log_quote(q, sizeof q, p->data.tensors[i].name));
                rc = -1;
            }
        }
        free(h);
    }
    free(st);
    double t_alloc = wb__clock_mono_s();
    if (rc == 0) {
        reserve(b, name, version, cur ? cur->version : 0, devs, n_devs, size, &p->data, r);
        rc = r->msg.status ? -1 : 0;
    }
    t_alloc = wb__clock_mono_s() - t_alloc;
    if (rc == 0 && getrandom(p->id, sizeof p->id, 0) != (ssize_t)sizeof p->id) {
        wb__ops_fail(r, WB_EIO, "getrandom for a publish id failed");
        rc = -1;
    }
    wb_model *m = NULL;
    Wbproto__PublishBeginReply *br = NULL;
    if (rc == 0) {
        m = wb__model_new(name, "", b->cfg.backend, devs[0]);
        br = wb__arena_alloc(&r->arena, sizeof *br);
        if (!m || !br) {
            wb__model_free(&m);
            wb__ops_oom(r);
            rc = -1;
        }
    }
    if (rc != 0 || r->msg.status != 0) {
        wb__model_data_free(&p->data, b->cfg.backend);
        free(p->named);
        free(p->name);
        free(p);
        return 0;
    }
    /* A failed record of the name is replaced, as a load replaces it. */
    if (!cur && any) {
        wb__models_remove(&b->models, any);
        wb__model_free(&any);
    }
    wb__model_set_devices(m, devs, n_devs);
    wb__models_add(&b->models, m);
    m->version = cur ? wb__models_issue(&b->models, name) : 1;
    m->published = 1;
    /* It lends its tensors as the name's loads do (not at all with
     * --no-share-tensors or a load's no_share). */
    m->no_share = cur ? cur->no_share : !b->share;
    m->published_by_pid = peer->pid;
    m->published_by_uid = peer->uid;
    m->publish = p;
    p->model = m;
    p->version = m->version;
    p->beside = cur ? cur->version : 0;
    p->owner = serial;
    p->creds = *peer;
    p->partial = rq->partial;
    p->bytes = p->data.slab_bytes;
    p->begun_at = b->now_wall();
    p->next = b->publishes;
    b->publishes = p;
    wb_info("publish_begin",
            "model=%s version=%u current=%u tensors=%zu named=%zu partial=%s bytes=%llu "
            "alloc_seconds=%.6f pid=%u uid=%u",
            wb__log_quote(q, sizeof q, name), m->version, p->beside, nt, rq->n_tensors,
            rq->partial ? "yes" : "no", (unsigned long long)p->bytes, t_alloc, peer->pid,
            peer->uid);
    wbproto__publish_begin_reply__init(br);
    br->publish_id.data = p->id;
    br->publish_id.len = sizeof p->id;
    br->version = m->version;
    br->bytes = p->bytes;
    r->msg.body_case = WBPROTO__REPLY__BODY_PUBLISH_BEGIN;
    r->msg.publish_begin = br;
    return 0;
}

/* The publish a request names, begun by this connection. */
static wb_publish *owned(wb_broker *b, const ProtobufCBinaryData *id, uint64_t serial,
                         wb_ops_reply *r)
{
    wb_publish *p = wb__publish_find(b, id->data, id->len);
    if (!p || p->owner != serial) {
        wb__ops_fail(r, WB_ENOTFOUND,
                     "no publish with this id was begun on this connection (a publish ends "
                     "with its connection)");
        return NULL;
    }
    if (p->committing) {
        wb__ops_fail(r, WB_ESTATE, "the publish of '%s' is committing already", p->name);
        return NULL;
    }
    return p;
}

/* The commit's sources, checked and kept in p. */
static int take_sources(wb_broker *b, wb_publish *p, const Wbproto__PublishCommitRequest *rq,
                        wb_err *err)
{
    int host = b->cfg.backend->proto == WBPROTO__BACKEND__BACKEND_HOST;
    p->sources = wb__calloc(rq->n_sources ? rq->n_sources : 1, sizeof *p->sources);
    if (!p->sources)
        return wb__err_set(err, WB_ENOMEM, "out of memory for %zu sources", rq->n_sources);
    p->n_sources = (unsigned)rq->n_sources;
    for (size_t i = 0; i < rq->n_sources; i++) {
        const Wbproto__PublishSource *s = rq->sources[i];
        wb_publish_source *o = &p->sources[i];
        o->fd = -1;
        o->device = -1;
        if (s->cuda_ipc_handle.len) {
            if (host)
                return wb__err_set(err, WB_ENOSYS,
                                   "source %zu is a CUDA allocation, but this broker keeps its "
                                   "slabs in host memory (--backend host): publish host bytes "
                                   "as memfds",
                                   i);
            if (s->cuda_ipc_handle.len != sizeof o->handle || !s->device_uuid[0] || !s->size)
                return wb__err_set(err, WB_EINVAL,
                                   "source %zu: a CUDA source is a 64-byte IPC handle, the "
                                   "device's UUID and its size",
                                   i);
            memcpy(o->handle, s->cuda_ipc_handle.data, sizeof o->handle);
            o->has_handle = 1;
            snprintf(o->uuid, sizeof o->uuid, "%s", s->device_uuid);
            const wb_gpu_dev *g = wb__devlist_find_uuid(&b->cfg.gpus, s->device_uuid);
            if (!g)
                return wb__err_set(err, WB_ENOGPU,
                                   "source %zu names device %s, which this broker does not use", i,
                                   o->uuid);
            o->device = g->index;
            o->size = s->size;
            continue;
        }
        if (s->host_fd < 0 || (unsigned)s->host_fd >= p->n_fds)
            return wb__err_set(err, WB_EINVAL,
                               "source %zu: host_fd %d is not one of the %u memfds sent for this "
                               "publish",
                               i, (int)s->host_fd, p->n_fds);
        if (!host)
            return wb__err_set(err, WB_ENOSYS,
                               "source %zu is host memory, but this broker keeps its slabs on "
                               "GPUs: publish CUDA allocations (IPC handles)",
                               i);
        o->fd = p->fds[s->host_fd];
        o->size = p->fd_sizes[s->host_fd];
        if (s->size && s->size > o->size)
            return wb__err_set(
                err, WB_EINVAL, "source %zu: size %llu, but memfd %d holds %llu bytes", i,
                (unsigned long long)s->size, (int)s->host_fd, (unsigned long long)o->size);
        if (s->size)
            o->size = s->size;
    }
    return WB_OK;
}

/* The placements: every tensor the begin named, once, inside its source. */
static int take_pieces(wb_publish *p, const Wbproto__PublishCommitRequest *rq, wb_err *err)
{
    size_t nt = p->data.n_tensors;
    p->pieces = wb__calloc(nt ? nt : 1, sizeof *p->pieces);
    uint8_t *placed = wb__calloc(nt ? nt : 1, 1);
    if (!p->pieces || !placed) {
        free(placed);
        return wb__err_set(err, WB_ENOMEM, "out of memory for %zu placements", nt);
    }
    int rc = WB_OK;
    char q[300];
    wb__names_hash *h = index_of(&p->data);
    for (size_t k = 0; rc == WB_OK && k < rq->n_tensors; k++) {
        const Wbproto__PublishPlacement *pl = rq->tensors[k];
        size_t i = tensor_index(h, &p->data, pl->name);
        if (i == SIZE_MAX || !p->named[i]) {
            rc = wb__err_set(err, i == SIZE_MAX ? WB_ENOTFOUND : WB_EINVAL,
                             "placement %zu: tensor %s is not in the publish's table", k,
                             wb__log_quote(q, sizeof q, pl->name));
            break;
        }
        const wb_model_tensor *t = &p->data.tensors[i];
        if (placed[i]) {
            rc = wb__err_set(err, WB_EINVAL, "tensor '%s' is placed twice", t->name);
            break;
        }
        placed[i] = 1;
        if (pl->source >= p->n_sources) {
            rc = wb__err_set(err, WB_EINVAL, "tensor '%s': source %u, but the commit names %u",
                             t->name, pl->source, p->n_sources);
            break;
        }
        uint64_t size = p->sources[pl->source].size;
        if (pl->offset > size || t->nbytes > size - pl->offset)
            rc = wb__err_set(
                err, WB_EINVAL, "tensor '%s': bytes [%llu, %llu) of source %u, which holds %llu",
                t->name, (unsigned long long)pl->offset,
                (unsigned long long)(pl->offset + t->nbytes), pl->source, (unsigned long long)size);
        p->pieces[i].source = pl->source;
        p->pieces[i].offset = pl->offset;
    }
    for (size_t i = 0; rc == WB_OK && i < nt; i++) {
        if (p->named[i] && !placed[i])
            rc = wb__err_set(err, WB_EINVAL,
                             "tensor '%s' of the publish's table is not placed: the commit "
                             "places every tensor the begin named, once",
                             p->data.tensors[i].name);
        if (!p->named[i])
            p->pieces[i].kept = 1;
    }
    free(h);
    free(placed);
    return rc;
}

/* A commit refused before its copy: the publish stays as it was, to be
 * committed again or aborted. */
static void unplan(wb_publish *p)
{
    free(p->sources);
    free(p->pieces);
    p->sources = NULL;
    p->pieces = NULL;
    p->n_sources = 0;
}

int wb__ops_publish_commit(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                           const void *ident, size_t ident_len, wb_ops_reply *r)
{
    const Wbproto__PublishCommitRequest *rq = req->publish_commit;
    (void)peer;
    wb_publish *p = owned(b, &rq->publish_id, wb__ops_serial(ident, ident_len), r);
    if (!p)
        return 0;
    wb_err err;
    int rc = take_sources(b, p, rq, &err);
    if (rc == WB_OK)
        rc = take_pieces(p, rq, &err);
    wb_model *keep = NULL;
    if (rc == WB_OK && p->beside) {
        keep = wb__models_version(&b->models, p->name, p->beside);
        int kept = 0;
        for (size_t i = 0; i < p->data.n_tensors; i++)
            kept |= p->pieces[i].kept;
        if (!kept)
            keep = NULL;
        else if (!keep || keep->state == WBPROTO__MODEL_STATE__MODEL_FREED)
            rc = wb__err_set(&err, WB_ESTATE,
                             "version %u of model '%s', whose bytes a partial publish keeps, "
                             "is gone",
                             p->beside, p->name);
    }
    wb_load_job *job = NULL;
    if (rc == WB_OK) {
        job = wb__load_job_new(p->name, "", b->cfg.backend, b->cfg.device, ident, ident_len,
                               r->msg.id);
        if (!job)
            rc = wb__err_set(&err, WB_ENOMEM, "out of memory starting the publish's copy");
    }
    if (rc != WB_OK) {
        unplan(p);
        char q[WB_ERR_MSG_MAX + 64];
        wb_warn("publish_commit_refused", "model=%s version=%u status=%s error=%s", p->name,
                p->version, wb_status_name(rc), wb__log_quote(q, sizeof q, err.msg));
        return wb__ops_fail(r, rc, "%s", err.msg);
    }
    job->kind = WB_JOB_PUBLISH;
    job->publish = p;
    job->src_cache_slot = &b->src_cache;
    job->copy_streams = b->cfg.publish_streams;
    job->op = WBPROTO__REQUEST__BODY_PUBLISH_COMMIT;
    job->version = p->version;
    job->beside = p->beside;
    job->gpus = &b->cfg.gpus;
    job->data = p->data;
    memset(&p->data, 0, sizeof p->data);
    p->committing = 1;
    if (keep) {
        p->keep = keep;
        keep->leases++;
    }
    if (b->loader) {
        wb__loader_submit(b->loader, job);
        return WB_OPS_DEFERRED;
    }
    wb__publish_copy_run(job);
    wb__publish_copy_done(b, job, r);
    wb__load_job_free(&job);
    return 0;
}

int wb__ops_publish_abort(wb_broker *b, const Wbproto__Request *req, const void *ident,
                          size_t ident_len, wb_ops_reply *r)
{
    wb_publish *p = owned(b, &req->publish_abort->publish_id, wb__ops_serial(ident, ident_len), r);
    if (!p)
        return 0;
    Wbproto__PublishAbortReply *ar = wb__arena_alloc(&r->arena, sizeof *ar);
    if (!ar)
        return wb__ops_oom(r);
    wb__publish_end(b, p, "abort");
    wbproto__publish_abort_reply__init(ar);
    r->msg.body_case = WBPROTO__REPLY__BODY_PUBLISH_ABORT;
    r->msg.publish_abort = ar;
    return 0;
}
