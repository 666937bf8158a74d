/* libwbclient: publishing a new version of a model from this process's
 * memory (include/wb/publish.h). The table is checked and sent at begin;
 * the tensors' places are recorded without an exchange (publish_src.c);
 * the commit sends the host bytes' memfd on the descriptor channel, then
 * the places, and waits for the broker's copies. client->mu is held only
 * around the exchanges. */
#include "publish_impl.h"

#include "alloc.h"
#include "client_impl.h"
#include "fdchan.h"
#include "safetensors_table.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

WB_EXPORT void wb_publish_options_init(wb_publish_options *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

static void pub_free(wb_publisher *p)
{
    if (!p)
        return;
    for (size_t i = 0; p->t && i < p->n; i++) {
        free(p->t[i].name);
        free(p->t[i].dtype);
        free(p->t[i].shape);
    }
    free(p->t);
    free(p->by_name);
    free(p->model);
    wb__pub_sources_free(p);
    free(p);
}

/* A tensor's bytes from its dtype and shape; WB_EINVAL naming what is
 * wrong. */
static int table_nbytes(const wb_publish_desc *in, uint64_t *out, wb_err *err)
{
    int dt = wb__dtype_parse(in->dtype);
    if (dt < 0)
        return wb__err_set(err, WB_EINVAL,
                           "tensor '%s' has dtype '%s', not one safetensors names (F32, BF16, "
                           "I64, ...)",
                           in->name, in->dtype);
    if (in->ndim > WB_MAX_DIMS)
        return wb__err_set(err, WB_EINVAL, "tensor '%s' has %u dimensions, at most %d", in->name,
                           in->ndim, WB_MAX_DIMS);
    if (in->ndim && !in->shape)
        return wb__err_set(err, WB_EINVAL, "tensor '%s' has %u dimensions and no shape", in->name,
                           in->ndim);
    uint64_t elems = 1;
    for (uint32_t k = 0; k < in->ndim; k++) {
        if (in->shape[k] && elems > UINT64_MAX / in->shape[k])
            return wb__err_set(err, WB_EINVAL, "tensor '%s': its shape's product overflows",
                               in->name);
        elems *= in->shape[k];
    }
    unsigned bits = wb__dtype_bits((wb_dtype)dt);
    if (elems > UINT64_MAX / bits)
        return wb__err_set(err, WB_EINVAL, "tensor '%s': its size overflows", in->name);
    if (elems * bits % 8)
        return wb__err_set(err, WB_EINVAL,
                           "tensor '%s': %llu elements of %s (%u bits) are not whole bytes",
                           in->name, (unsigned long long)elems, in->dtype, bits);
    *out = elems * bits / 8;
    return WB_OK;
}

/* The publisher's copy of the table, checked; its name index. */
static int copy_table(wb_publisher *p, const wb_publish_options *o, wb_err *err)
{
    p->t = wb__calloc(o->n_tensors, sizeof *p->t);
    if (!p->t)
        return wb__err_set(err, WB_ENOMEM, "out of memory for %zu tensors", o->n_tensors);
    p->n = o->n_tensors;
    for (size_t i = 0; i < p->n; i++) {
        const wb_publish_desc *in = &o->tensors[i];
        wb__pub_tensor *t = &p->t[i];
        if (!in->name || !in->name[0])
            return wb__err_set(err, WB_EINVAL, "tensor %zu of the table has no name", i);
        if (!in->dtype)
            return wb__err_set(err, WB_EINVAL, "tensor '%s' has no dtype", in->name);
        int rc = table_nbytes(in, &t->nbytes, err);
        if (rc != WB_OK)
            return rc;
        t->name = wb__strdup(in->name);
        t->dtype = wb__strdup(in->dtype);
        t->ndim = in->ndim;
        if (in->ndim)
            t->shape = wb__malloc(in->ndim * sizeof *t->shape);
        if (!t->name || !t->dtype || (in->ndim && !t->shape))
            return wb__err_set(err, WB_ENOMEM, "out of memory copying the table");
        if (in->ndim)
            memcpy(t->shape, in->shape, in->ndim * sizeof *t->shape);
    }
    /* Without the index (out of memory), lookups scan. */
    p->by_name = wb__names_hash_new(p->t, p->n, sizeof *p->t, offsetof(wb__pub_tensor, name));
    for (size_t i = 0; i < p->n; i++) {
        const void *first =
            p->by_name ? wb__names_hash_find(p->by_name, p->t, sizeof *p->t,
                                             offsetof(wb__pub_tensor, name), p->t[i].name)
                       : wb__names_find(p->t, p->n, sizeof *p->t, offsetof(wb__pub_tensor, name),
                                        NULL, p->t[i].name);
        if (first != &p->t[i])
            return wb__err_set(err, WB_EINVAL, "tensor '%s' is named twice in the table",
                               p->t[i].name);
    }
    return WB_OK;
}

static wb__pub_tensor *find(const wb_publisher *p, const char *name)
{
    const size_t at = offsetof(wb__pub_tensor, name);
    if (p->by_name)
        return (wb__pub_tensor *)wb__names_hash_find(p->by_name, p->t, sizeof *p->t, at, name);
    return (wb__pub_tensor *)wb__names_find(p->t, p->n, sizeof *p->t, at, NULL, name);
}

/* Sends PublishBeginRequest. The caller holds c->mu. */
static int send_begin(wb_publisher *p, const wb_publish_options *o, wb_err *err)
{
    Wbproto__PublishTensor *pt = wb__calloc(p->n, sizeof *pt);
    Wbproto__PublishTensor **ptp = wb__calloc(p->n, sizeof *ptp);
    if (!pt || !ptp) {
        free(pt);
        free(ptp);
        return wb__err_set(err, WB_ENOMEM, "out of memory for the request");
    }
    for (size_t i = 0; i < p->n; i++) {
        wbproto__publish_tensor__init(&pt[i]);
        pt[i].name = p->t[i].name;
        pt[i].dtype = p->t[i].dtype;
        pt[i].n_shape = p->t[i].ndim;
        pt[i].shape = p->t[i].shape;
        pt[i].nbytes = p->t[i].nbytes;
        ptp[i] = &pt[i];
    }
    Wbproto__PublishBeginRequest b = WBPROTO__PUBLISH_BEGIN_REQUEST__INIT;
    b.model = p->model;
    b.n_tensors = p->n;
    b.tensors = ptp;
    b.partial = o->partial != 0;
    b.placement = (char *)(o->placement ? o->placement : "");
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_PUBLISH_BEGIN;
    req.publish_begin = &b;
    Wbproto__Reply *rep = NULL;
    int rc = wb__client_call(p->client, &req, 0, &rep, err);
    free(pt);
    free(ptp);
    if (rc == WB_OK) {
        const Wbproto__PublishBeginReply *br = rep->publish_begin;
        if (!br || br->publish_id.len != WB_LEASE_ID_LEN) {
            rc = wb__err_set(err, WB_EPROTO, "the reply carries no publish id of %d bytes",
                             WB_LEASE_ID_LEN);
        } else {
            memcpy(p->id, br->publish_id.data, WB_LEASE_ID_LEN);
            p->version = br->version;
            p->reserved = br->bytes;
        }
    }
    p->gen = p->client->rpc.generation;
    wb__reply_free(&rep);
    return rc;
}

WB_EXPORT int wb_publish_begin(wb_client *c, const char *model, const wb_publish_options *opts,
                               wb_publisher **out)
{
    if (out)
        *out = NULL;
    if (!c)
        return WB_EINVAL;
    if (!model || !model[0] || strlen(model) > WB_NAME_MAX || !opts || !out)
        return wb__client_fail(c, WB_EINVAL, "publish: %s",
                               !out || !opts ? "no options or no place for the publisher"
                                             : "no model name, or one over 255 bytes");
    if (opts->n_tensors == 0 || !opts->tensors)
        return wb__client_fail(c, WB_EINVAL, "publish '%s': the table has no tensors", model);
    wb_publisher *p = wb__calloc(1, sizeof *p);
    if (!p)
        return wb__client_fail(c, WB_ENOMEM, "publish '%s': out of memory", model);
    p->client = c;
    p->pid = getpid();
    p->memfd = -1;
    p->host_source = -1;
    wb_err e;
    int rc = (p->model = wb__strdup(model)) ? WB_OK : wb__err_set(&e, WB_ENOMEM, "out of memory");
    if (rc == WB_OK)
        rc = copy_table(p, opts, &e);
    if (rc != WB_OK) {
        pub_free(p);
        return wb__client_fail(c, rc, "publish '%s': %s", model, e.msg);
    }
    pthread_mutex_lock(&c->mu);
    rc = send_begin(p, opts, &e);
    pthread_mutex_unlock(&c->mu);
    if (rc != WB_OK) {
        pub_free(p);
        /* A broker without publishing refuses the request undecoded: no
         * body it knows, or a repeated field it has no bound for. */
        if (rc == WB_EPROTO && (strcmp(e.msg, "request has no body") == 0 ||
                                strstr(e.msg, "; a request may not have any")))
            return wb__client_fail(c, rc,
                                   "publish '%s': the broker does not know publishing (it "
                                   "answered: %s)",
                                   model, e.msg);
        return wb__client_fail(c, rc, "publish '%s': %s", model, e.msg);
    }
    *out = p;
    return WB_OK;
}

/* Stores the message of a failed call in the publisher and the client. */
static int pub_fail(wb_publisher *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int pub_fail(wb_publisher *p, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wb__err_vset(&p->err, code, fmt, ap);
    va_end(ap);
    return wb__client_fail(p->client, code, "%s", p->err.msg);
}

static int forked(const wb_publisher *p)
{
    return p->pid != getpid();
}

WB_EXPORT int wb_publish_tensor(wb_publisher *p, const char *name, const void *data,
                                uint64_t nbytes)
{
    if (!p)
        return WB_EINVAL;
    if (forked(p))
        return pub_fail(p, WB_ESTATE,
                        "publish '%s': begun by process %d; a child after fork() cannot use it",
                        p->model, (int)p->pid);
    if (!name)
        return pub_fail(p, WB_EINVAL, "publish '%s': a tensor without a name", p->model);
    wb__pub_tensor *t = find(p, name);
    if (!t)
        return pub_fail(p, WB_ENOTFOUND, "publish '%s': tensor '%s' is not in the table", p->model,
                        name);
    if (t->given)
        return pub_fail(p, WB_EINVAL, "publish '%s': tensor '%s' was given already", p->model,
                        name);
    if (nbytes != t->nbytes)
        return pub_fail(p, WB_EINVAL,
                        "publish '%s': tensor '%s' has %llu bytes, the table's %s%s "
                        "needs %llu",
                        p->model, name, (unsigned long long)nbytes, t->dtype,
                        t->ndim ? " tensor" : " scalar", (unsigned long long)t->nbytes);
    if (!data && nbytes)
        return pub_fail(p, WB_EINVAL, "publish '%s': tensor '%s' has no data", p->model, name);
    wb_err e;
    int rc = wb__pub_place(p, t, data, nbytes, &e);
    if (rc != WB_OK)
        return pub_fail(p, rc, "publish '%s': %s", p->model, e.msg);
    t->given = 1;
    p->n_given++;
    return WB_OK;
}

/* Whether the publish can still be named to the broker: begun by this
 * process on the socket the client has now. The caller holds c->mu. */
static int still_open(const wb_publisher *p)
{
    return !forked(p) && atomic_load(&p->client->connected) && p->client->rpc.generation == p->gen;
}

/* Best effort: a refusal or a failed exchange is the broker's to clean up
 * (it ends a publish with its connection). The caller holds c->mu. */
static void send_abort(wb_publisher *p)
{
    if (!still_open(p))
        return;
    Wbproto__PublishAbortRequest a = WBPROTO__PUBLISH_ABORT_REQUEST__INIT;
    a.publish_id.data = p->id;
    a.publish_id.len = WB_LEASE_ID_LEN;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_PUBLISH_ABORT;
    req.publish_abort = &a;
    Wbproto__Reply *rep = NULL;
    wb_err ignored;
    wb__client_call(p->client, &req, 0, &rep, &ignored);
    wb__reply_free(&rep);
}

/* Sends PublishCommitRequest and waits. The caller holds c->mu. */
static int send_commit(wb_publisher *p, wb_publish_info *info, int *refused, wb_err *err)
{
    Wbproto__PublishSource *s = wb__calloc(p->n_src ? p->n_src : 1, sizeof *s);
    Wbproto__PublishSource **sp = wb__calloc(p->n_src ? p->n_src : 1, sizeof *sp);
    Wbproto__PublishPlacement *pl = wb__calloc(p->n, sizeof *pl);
    Wbproto__PublishPlacement **plp = wb__calloc(p->n, sizeof *plp);
    int rc = WB_OK;
    if (!s || !sp || !pl || !plp) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory for the request");
        goto out;
    }
    for (size_t i = 0; i < p->n_src; i++) {
        wbproto__publish_source__init(&s[i]);
        if (p->src[i].host) {
            s[i].host_fd = 0; /* the one memfd sent */
            s[i].size = p->host_used;
        } else {
            s[i].cuda_ipc_handle.data = p->src[i].handle;
            s[i].cuda_ipc_handle.len = WB_PUBLISH_IPC_HANDLE;
            s[i].device_uuid = p->src[i].uuid;
            s[i].size = p->src[i].size;
            s[i].host_fd = -1;
        }
        sp[i] = &s[i];
    }
    for (size_t i = 0; i < p->n; i++) {
        wbproto__publish_placement__init(&pl[i]);
        pl[i].name = p->t[i].name;
        pl[i].source = p->t[i].source;
        pl[i].offset = p->t[i].offset;
        plp[i] = &pl[i];
    }
    Wbproto__PublishCommitRequest cr = WBPROTO__PUBLISH_COMMIT_REQUEST__INIT;
    cr.publish_id.data = p->id;
    cr.publish_id.len = WB_LEASE_ID_LEN;
    cr.n_sources = p->n_src;
    cr.sources = sp;
    cr.n_tensors = p->n;
    cr.tensors = plp;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_PUBLISH_COMMIT;
    req.publish_commit = &cr;
    int timeout = p->client->rpc.timeout_ms;
    if (timeout < WB_PUBLISH_COMMIT_MIN_MS)
        timeout = WB_PUBLISH_COMMIT_MIN_MS;
    Wbproto__Reply *rep = NULL;
    rc = wb__client_call(p->client, &req, timeout, &rep, err);
    *refused = rep != NULL && rc != WB_OK;
    if (rc == WB_OK) {
        const Wbproto__PublishCommitReply *r = rep->publish_commit;
        info->version = r->model ? r->model->version : 0;
        info->previous_version = r->previous_version;
        info->current_at = r->current_at;
        info->copy_seconds = r->copy_seconds;
        info->copied_bytes = r->copied_bytes;
        info->kept_bytes = r->kept_bytes;
        if (!info->version)
            info->version = p->version;
    }
    wb__reply_free(&rep);
out:
    free(s);
    free(sp);
    free(pl);
    free(plp);
    return rc;
}

WB_EXPORT int wb_publish_commit_ex(wb_publisher **pp, wb_publish_info *info)
{
    wb_publish_info scratch;
    if (!info)
        info = &scratch;
    memset(info, 0, sizeof *info);
    if (!pp || !*pp)
        return WB_EINVAL;
    wb_publisher *p = *pp;
    *pp = NULL;
    wb_client *c = p->client;
    int rc;
    wb_err e;
    if (forked(p)) {
        rc = wb__client_fail(c, WB_ESTATE,
                             "publish '%s': begun by process %d; a child after fork() cannot "
                             "commit it",
                             p->model, (int)p->pid);
        pub_free(p);
        return rc;
    }
    if (p->n_given < p->n) {
        size_t i = 0;
        while (p->t[i].given)
            i++;
        pthread_mutex_lock(&c->mu);
        send_abort(p);
        pthread_mutex_unlock(&c->mu);
        rc = wb__client_fail(c, WB_EINVAL,
                             "publish '%s': tensor '%s' was not given (%zu of %zu were); the "
                             "publish is aborted",
                             p->model, p->t[i].name, p->n_given, p->n);
        pub_free(p);
        return rc;
    }
    rc = wb__pub_seal(p, &e);
    pthread_mutex_lock(&c->mu);
    if (rc == WB_OK && !still_open(p))
        rc = wb__err_set(&e, WB_ECONN,
                         "the connection it was begun on ended (the broker ends a publish with "
                         "it): begin again");
    if (rc == WB_OK && p->memfd >= 0) {
        rc = wb__fdchan_publish(c->rpc.path, p->id, p->memfd, c->rpc.timeout_ms, &e);
        if (rc != WB_OK) {
            wb_err inner = e;
            wb__err_set(&e, rc, "sending the host bytes: %s", inner.msg);
        }
    }
    int refused = 1;
    if (rc == WB_OK)
        rc = send_commit(p, info, &refused, &e);
    /* A refusal may leave the publish open at the broker; a failed exchange
     * (a timeout re-creates the socket) ends it with the connection. */
    if (rc != WB_OK && refused)
        send_abort(p);
    pthread_mutex_unlock(&c->mu);
    if (rc != WB_OK) {
        memset(info, 0, sizeof *info);
        rc = wb__client_fail(c, rc, "publish '%s': %s", p->model, e.msg);
    }
    pub_free(p);
    return rc;
}

WB_EXPORT int wb_publish_commit(wb_publisher **pp, uint32_t *version)
{
    wb_publish_info info;
    int rc = wb_publish_commit_ex(pp, &info);
    if (version)
        *version = rc == WB_OK ? info.version : 0;
    return rc;
}

WB_EXPORT void wb_publish_abort(wb_publisher **pp)
{
    if (!pp || !*pp)
        return;
    wb_publisher *p = *pp;
    *pp = NULL;
    pthread_mutex_lock(&p->client->mu);
    send_abort(p);
    pthread_mutex_unlock(&p->client->mu);
    pub_free(p);
}

WB_EXPORT const char *wb_publish_errmsg(const wb_publisher *p)
{
    return p ? p->err.msg : "";
}

WB_EXPORT uint32_t wb_publish_version(const wb_publisher *p)
{
    return p ? p->version : 0;
}

WB_EXPORT uint64_t wb_publish_reserved_bytes(const wb_publisher *p)
{
    return p ? p->reserved : 0;
}
