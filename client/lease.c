/* libwbclient: leases, their tensor tables, verification and containers. */
#include "client_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define MAX_DIMS 64
/* Container records per lease in one heartbeat, as the decoder allows. */
#define MAX_RECORDS 256
/* Device tensors are checked through pinned host buffers of this size. */
#define VERIFY_CHUNK (8u << 20)

/* Guards every lease's list of attached containers. One lock for all: the
 * lists are short and touched only when containers come and go and when a
 * heartbeat is built. */
static pthread_mutex_t uses_mu = PTHREAD_MUTEX_INITIALIZER;

static void hex_id(const uint8_t *id, char out[2 * WB_LEASE_ID_BYTES + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < WB_LEASE_ID_BYTES; i++) {
        out[2 * i] = digits[id[i] >> 4];
        out[2 * i + 1] = digits[id[i] & 15];
    }
    out[2 * WB_LEASE_ID_BYTES] = '\0';
}

static void lease_free(wb_lease *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n_tensors; i++) {
        free(l->tensors[i].name);
        free(l->tensors[i].dtype);
        free(l->tensors[i].shape);
    }
    free(l->tensors);
    while (l->uses) {
        wb__lease_use *u = l->uses;
        l->uses = u->next;
        free(u);
    }
    for (size_t i = 0; i < l->n_maps; i++)
        wb__mapcache_put(&l->maps[i]);
    free(l->maps);
    free(l->model);
    free(l);
}

static void unlink_lease(wb_lease *l)
{
    wb_client *c = l->client;
    if (!c)
        return;
    if (l->prev)
        l->prev->next = l->next;
    else if (c->leases == l)
        c->leases = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

static int send_release(wb_client *c, const uint8_t *id, wb_err *err)
{
    Wbproto__ReleaseRequest rel = WBPROTO__RELEASE_REQUEST__INIT;
    rel.lease_id.data = (uint8_t *)id;
    rel.lease_id.len = WB_LEASE_ID_BYTES;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_RELEASE;
    req.release = &rel;
    Wbproto__Reply *rep = NULL;
    int rc = wb__client_call(c, &req, 0, &rep, err);
    if (rc != WB_OK && !rep)
        rc = WB_ECONN;
    wb__reply_free(&rep);
    return rc;
}

int wb__lease_end(wb_lease *lease, int tell, wb_err *err)
{
    int rc = WB_OK;
    wb_client *c = lease->client;
    wb__err_clear(err);
    if (tell && c) {
        wb_err e;
        rc = send_release(c, lease->id, &e);
        if (rc == WB_ECONN)
            wb__err_set(err, rc, "release lease %.8s: the broker could not be told (%s)",
                        lease->id_hex, e.msg);
        else if (rc != WB_OK)
            wb__err_set(err, rc, "release lease %.8s: %s", lease->id_hex, e.msg);
    } else if (tell) {
        rc = wb__err_set(err, WB_ECONN,
                         "release lease %.8s: the broker could not be told (its client "
                         "was destroyed)",
                         lease->id_hex);
    }
    unlink_lease(lease);
    lease_free(lease);
    return rc;
}

/* Checks everything the tensor table's pointers will be computed from; the
 * decoder has checked sizes and counts, but not that tensors fit their slab. */
static int validate_lease(wb_client *c, const char *model, const Wbproto__Lease *pl)
{
    if (pl->id.len != WB_LEASE_ID_BYTES)
        return wb__client_fail(c, WB_EPROTO, "acquire '%s': the lease id has %zu bytes, not %d",
                               model, pl->id.len, WB_LEASE_ID_BYTES);
    for (size_t i = 0; i < pl->n_tensors; i++) {
        const Wbproto__Tensor *t = pl->tensors[i];
        const char *name = t->name && t->name[0] ? t->name : "?";
        if (!t->name || !t->name[0] || !t->dtype || !t->dtype[0])
            return wb__client_fail(c, WB_EPROTO, "acquire '%s': tensor %zu has no name or no dtype",
                                   model, i);
        if (t->slab >= pl->n_slabs)
            return wb__client_fail(c, WB_EPROTO, "acquire '%s': tensor '%s' names slab %u of %zu",
                                   model, name, t->slab, pl->n_slabs);
        uint64_t size = pl->slabs[t->slab]->size;
        if (t->offset > size || t->nbytes > size - t->offset)
            return wb__client_fail(c, WB_EPROTO,
                                   "acquire '%s': tensor '%s' (offset %llu, %llu bytes) lies "
                                   "outside slab %u of %llu bytes",
                                   model, name, (unsigned long long)t->offset,
                                   (unsigned long long)t->nbytes, t->slab,
                                   (unsigned long long)size);
        if (t->n_shape > MAX_DIMS)
            return wb__client_fail(c, WB_EPROTO, "acquire '%s': tensor '%s' has %zu dimensions",
                                   model, name, t->n_shape);
    }
    return WB_OK;
}

static int map_slabs(wb_client *c, const char *model, const Wbproto__Lease *pl, wb_lease *l)
{
    l->maps = calloc(pl->n_slabs ? pl->n_slabs : 1, sizeof *l->maps);
    if (!l->maps)
        return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
    for (size_t i = 0; i < pl->n_slabs; i++) {
        const Wbproto__Slab *s = pl->slabs[i];
        wb_err e;
        int rc;
        if (s->backend == WBPROTO__BACKEND__BACKEND_CUDA)
            rc = wb__mapcache_get_cuda(s->cuda_ipc_handle.data, s->cuda_ipc_handle.len, s->device,
                                       s->size, &l->maps[i], &e);
        else if (s->backend == WBPROTO__BACKEND__BACKEND_HOST)
            rc = wb__mapcache_get_host(s->shm_name, s->size, &l->maps[i], &e);
        else
            return wb__client_fail(c, WB_EPROTO, "acquire '%s': slab %zu has unknown backend %d",
                                   model, i, (int)s->backend);
        if (rc != WB_OK)
            return wb__client_fail(c, rc, "acquire '%s': slab %zu: %s", model, i, e.msg);
        l->n_maps = i + 1;
    }
    return WB_OK;
}

static char *dup_str(const char *s)
{
    return strdup(s ? s : "");
}

static int build_tensors(wb_client *c, const char *model, const Wbproto__Lease *pl, wb_lease *l)
{
    l->tensors = calloc(pl->n_tensors ? pl->n_tensors : 1, sizeof *l->tensors);
    if (!l->tensors)
        return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
    for (size_t i = 0; i < pl->n_tensors; i++) {
        const Wbproto__Tensor *t = pl->tensors[i];
        wb__tensor_entry *lt = &l->tensors[i];
        l->n_tensors = i + 1;
        lt->name = dup_str(t->name);
        lt->dtype = dup_str(t->dtype);
        lt->ndim = (uint32_t)t->n_shape;
        lt->shape = calloc(t->n_shape ? t->n_shape : 1, sizeof *lt->shape);
        if (!lt->name || !lt->dtype || !lt->shape)
            return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
        if (t->n_shape)
            memcpy(lt->shape, t->shape, t->n_shape * sizeof *lt->shape);
        lt->data = (const uint8_t *)wb__map_addr(l->maps[t->slab]) + t->offset;
        lt->nbytes = t->nbytes;
        lt->xxh3 = t->xxh3;
        lt->device = wb__map_device(l->maps[t->slab]);
    }
    return WB_OK;
}

WB_EXPORT int wb_lease_acquire(wb_client *client, const char *model, wb_lease **out)
{
    if (out)
        *out = NULL;
    if (!client)
        return WB_EINVAL;
    pthread_mutex_lock(&client->mu);
    int rc;
    if (!out || !model || !model[0]) {
        rc = wb__client_fail(client, WB_EINVAL, "acquire: %s",
                             !out ? "no place for the lease (out is NULL)" : "no model name");
        pthread_mutex_unlock(&client->mu);
        return rc;
    }
    Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
    acq.model = (char *)model;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &acq;
    Wbproto__Reply *rep = NULL;
    wb_err e;
    rc = wb__client_call(client, &req, 0, &rep, &e);
    if (rc != WB_OK) {
        wb__reply_free(&rep);
        rc = wb__client_fail(client, rc, "acquire '%s': %s", model, e.msg);
        pthread_mutex_unlock(&client->mu);
        return rc;
    }
    const Wbproto__Lease *pl = rep->acquire ? rep->acquire->lease : NULL;
    wb_lease *l = NULL;
    if (!pl) {
        rc = wb__client_fail(client, WB_EPROTO, "acquire '%s': the reply carries no lease", model);
    } else if ((rc = validate_lease(client, model, pl)) == WB_OK) {
        l = calloc(1, sizeof *l);
        if (!l)
            rc = wb__client_fail(client, WB_ENOMEM, "acquire '%s': out of memory", model);
    }
    if (l) {
        memcpy(l->id, pl->id.data, WB_LEASE_ID_BYTES);
        hex_id(l->id, l->id_hex);
        atomic_init(&l->containers, 0);
        atomic_init(&l->orphaned, 0);
        l->model = strdup(model);
        if (!l->model)
            rc = wb__client_fail(client, WB_ENOMEM, "acquire '%s': out of memory", model);
        if (rc == WB_OK)
            rc = map_slabs(client, model, pl, l);
        if (rc == WB_OK)
            rc = build_tensors(client, model, pl, l);
    }
    if (rc != WB_OK && pl && pl->id.len == WB_LEASE_ID_BYTES) {
        /* The broker granted a lease this process cannot use: hand it back
         * now rather than leave it to process exit. */
        wb_err ignored;
        send_release(client, pl->id.data, &ignored);
    }
    wb__reply_free(&rep);
    if (rc != WB_OK) {
        lease_free(l);
        pthread_mutex_unlock(&client->mu);
        return rc;
    }
    l->client = client;
    l->next = client->leases;
    if (client->leases)
        client->leases->prev = l;
    client->leases = l;
    *out = l;
    pthread_mutex_unlock(&client->mu);
    return WB_OK;
}

WB_EXPORT int wb_lease_release(wb_lease **lease)
{
    if (!lease)
        return WB_EINVAL;
    wb_lease *l = *lease;
    if (!l)
        return WB_OK;
    wb_client *c = l->client;
    if (!c) {
        /* Detached by wb_client_destroy: only the local side is left. */
        if (atomic_load(&l->containers) > 0)
            return WB_EBUSY;
        *lease = NULL;
        lease_free(l);
        return WB_ECONN;
    }
    pthread_mutex_lock(&c->mu);
    unsigned n = atomic_load(&l->containers);
    if (n > 0) {
        int rc = wb__client_fail(c, WB_EBUSY,
                                 "release lease %.8s (model '%s'): %u container(s) still use it",
                                 l->id_hex, l->model, n);
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    *lease = NULL;
    /* An orphaned lease is unknown to the broker that runs now: there is
     * nobody to tell. */
    wb_err e;
    int rc = wb__lease_end(l, !atomic_load(&l->orphaned), &e);
    if (rc != WB_OK)
        wb__client_fail(c, rc, "%s", e.msg);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

WB_EXPORT const char *wb_lease_model(const wb_lease *lease)
{
    return lease ? lease->model : NULL;
}

WB_EXPORT const uint8_t *wb_lease_id(const wb_lease *lease)
{
    return lease ? lease->id : NULL;
}

WB_EXPORT void wb_lease_id_hex(const wb_lease *lease, char out[33])
{
    if (!out)
        return;
    if (!lease) {
        out[0] = '\0';
        return;
    }
    memcpy(out, lease->id_hex, sizeof lease->id_hex);
}

WB_EXPORT int wb_lease_orphaned(const wb_lease *lease)
{
    return lease ? atomic_load(&lease->orphaned) : 0;
}

WB_EXPORT size_t wb_lease_tensor_count(const wb_lease *lease)
{
    return lease ? lease->n_tensors : 0;
}

static void fill_view(const wb__tensor_entry *t, wb_tensor_view *out)
{
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    out->shape = t->shape;
    out->data = t->data;
    out->nbytes = t->nbytes;
    out->xxh3 = t->xxh3;
    out->device = t->device;
}

WB_EXPORT int wb_lease_tensor(const wb_lease *lease, size_t index, wb_tensor_view *out)
{
    if (!lease || !out)
        return WB_EINVAL;
    if (index >= lease->n_tensors) {
        if (lease->client) {
            pthread_mutex_lock(&lease->client->mu);
            wb__client_fail(lease->client, WB_EINVAL,
                            "lease %.8s (model '%s'): tensor index %zu out of range (%zu "
                            "tensors)",
                            lease->id_hex, lease->model, index, lease->n_tensors);
            pthread_mutex_unlock(&lease->client->mu);
        }
        return WB_EINVAL;
    }
    fill_view(&lease->tensors[index], out);
    return WB_OK;
}

WB_EXPORT int wb_lease_find(const wb_lease *lease, const char *name, wb_tensor_view *out)
{
    if (!lease || !name || !out)
        return WB_EINVAL;
    for (size_t i = 0; i < lease->n_tensors; i++) {
        if (strcmp(lease->tensors[i].name, name) == 0) {
            fill_view(&lease->tensors[i], out);
            return WB_OK;
        }
    }
    if (lease->client) {
        pthread_mutex_lock(&lease->client->mu);
        wb__client_fail(lease->client, WB_ENOTFOUND, "lease %.8s (model '%s'): no tensor '%s'",
                        lease->id_hex, lease->model, name);
        pthread_mutex_unlock(&lease->client->mu);
    }
    return WB_ENOTFOUND;
}

/* Device tensors are hashed on the host without ever touching the legacy
 * default stream: chunks are copied with cudaMemcpyAsync on a private
 * non-blocking stream into two pinned buffers, and one chunk is hashed while
 * the next is in flight. A synchronous copy would wait for (and stall) every
 * kernel of the process, which a serving worker must never do. */
typedef struct dev_verifier {
    int ready;
#ifdef WB_HAVE_CUDA
    cudaStream_t stream;
    void *buf[2];
    cudaEvent_t ev[2];
#endif
    XXH3_state_t *state;
} dev_verifier;

static void dev_verifier_free(dev_verifier *v)
{
#ifdef WB_HAVE_CUDA
    if (v->ready) {
        for (int i = 0; i < 2; i++) {
            if (v->buf[i])
                cudaFreeHost(v->buf[i]);
            if (v->ev[i])
                cudaEventDestroy(v->ev[i]);
        }
        if (v->stream)
            cudaStreamDestroy(v->stream);
    }
#endif
    if (v->state)
        XXH3_freeState(v->state);
    memset(v, 0, sizeof *v);
}

static int dev_hash(dev_verifier *v, const wb__tensor_entry *t, uint64_t *out, char *why,
                    size_t why_len)
{
#ifndef WB_HAVE_CUDA
    (void)v;
    (void)t;
    (void)out;
    snprintf(why, why_len, "this build of libwbclient has no CUDA support");
    return WB_ENOSYS;
#else
    cudaError_t ce = cudaSuccess;
    if (!v->ready) {
        v->ready = 1;
        v->state = XXH3_createState();
        if (!v->state) {
            snprintf(why, why_len, "out of memory");
            return WB_ENOMEM;
        }
        ce = cudaStreamCreateWithFlags(&v->stream, cudaStreamNonBlocking);
        for (int i = 0; i < 2 && ce == cudaSuccess; i++) {
            ce = cudaHostAlloc(&v->buf[i], VERIFY_CHUNK, cudaHostAllocDefault);
            if (ce == cudaSuccess)
                ce = cudaEventCreateWithFlags(&v->ev[i], cudaEventDisableTiming);
        }
        if (ce != cudaSuccess) {
            snprintf(why, why_len, "cannot set up pinned buffers and a stream: %s",
                     cudaGetErrorString(ce));
            return WB_ENOGPU;
        }
    }
    if (!v->state || !v->stream) {
        snprintf(why, why_len, "the device verifier could not be set up");
        return WB_ENOGPU;
    }
    XXH3_64bits_reset(v->state);
    uint64_t n = t->nbytes, chunks = (n + VERIFY_CHUNK - 1) / VERIFY_CHUNK;
    const uint8_t *src = t->data;
    for (uint64_t k = 0; k <= chunks && ce == cudaSuccess; k++) {
        /* Issue chunk k, then hash chunk k-1 while k is copied. Buffer k%2
         * last held chunk k-2, already hashed. */
        if (k < chunks) {
            size_t len = (size_t)(k + 1 < chunks ? VERIFY_CHUNK : n - k * VERIFY_CHUNK);
            ce = cudaMemcpyAsync(v->buf[k % 2], src + k * VERIFY_CHUNK, len, cudaMemcpyDefault,
                                 v->stream);
            if (ce == cudaSuccess)
                ce = cudaEventRecord(v->ev[k % 2], v->stream);
        }
        if (k > 0 && ce == cudaSuccess) {
            uint64_t j = k - 1;
            size_t len = (size_t)(j + 1 < chunks ? VERIFY_CHUNK : n - j * VERIFY_CHUNK);
            ce = cudaEventSynchronize(v->ev[j % 2]);
            if (ce == cudaSuccess)
                XXH3_64bits_update(v->state, v->buf[j % 2], len);
        }
    }
    if (ce != cudaSuccess) {
        cudaStreamSynchronize(v->stream);
        snprintf(why, why_len, "copying it to the host failed: %s", cudaGetErrorString(ce));
        return WB_EIO;
    }
    *out = XXH3_64bits_digest(v->state);
    return WB_OK;
#endif
}

WB_EXPORT int wb_lease_verify(const wb_lease *lease, size_t *bad_index)
{
    if (!lease)
        return WB_EINVAL;
    dev_verifier dv;
    memset(&dv, 0, sizeof dv);
    for (size_t i = 0; i < lease->n_tensors; i++) {
        const wb__tensor_entry *t = &lease->tensors[i];
        int rc = WB_OK;
        uint64_t got = 0;
        char why[200] = "";
        if (t->device >= 0)
            rc = dev_hash(&dv, t, &got, why, sizeof why);
        else
            got = XXH3_64bits(t->data, (size_t)t->nbytes);
        if (rc == WB_OK && got != t->xxh3)
            rc = WB_ECORRUPT;
        if (rc == WB_OK)
            continue;
        dev_verifier_free(&dv);
        if (bad_index)
            *bad_index = i;
        if (lease->client) {
            pthread_mutex_lock(&lease->client->mu);
            if (rc != WB_ECORRUPT)
                wb__client_fail(lease->client, rc,
                                "verify lease %.8s: tensor '%s' on cuda device %d cannot be "
                                "checked: %s",
                                lease->id_hex, t->name, t->device, why);
            else
                wb__client_fail(lease->client, rc,
                                "verify lease %.8s: tensor '%s' has checksum %016llx, the "
                                "broker recorded %016llx",
                                lease->id_hex, t->name, (unsigned long long)got,
                                (unsigned long long)t->xxh3);
            pthread_mutex_unlock(&lease->client->mu);
        }
        return rc;
    }
    dev_verifier_free(&dv);
    return WB_OK;
}

WB_EXPORT int wb_lease_container_add(wb_lease *lease)
{
    if (!lease)
        return WB_EINVAL;
    atomic_fetch_add(&lease->containers, 1);
    return WB_OK;
}

WB_EXPORT int wb_lease_container_remove(wb_lease *lease)
{
    if (!lease)
        return WB_EINVAL;
    unsigned n = atomic_load(&lease->containers);
    while (n > 0 && !atomic_compare_exchange_weak(&lease->containers, &n, n - 1))
        ;
    if (n == 0) {
        if (lease->client) {
            pthread_mutex_lock(&lease->client->mu);
            wb__client_fail(lease->client, WB_EINVAL,
                            "lease %.8s: container_remove without a matching container_add",
                            lease->id_hex);
            pthread_mutex_unlock(&lease->client->mu);
        }
        return WB_EINVAL;
    }
    return WB_OK;
}

WB_EXPORT unsigned wb_lease_containers(const wb_lease *lease)
{
    return lease ? atomic_load(&lease->containers) : 0;
}

int wb__lease_attach(wb_lease *lease, const wb__container_rec *rec, uint64_t bound_bytes,
                     uint32_t bound_tensors, wb_err *err)
{
    wb__lease_use *u = calloc(1, sizeof *u);
    if (!u)
        return wb__err_set(err, WB_ENOMEM, "out of memory registering a container on lease %.8s",
                           lease->id_hex);
    u->rec = rec;
    u->bound_bytes = bound_bytes;
    u->bound_tensors = bound_tensors;
    pthread_mutex_lock(&uses_mu);
    u->next = lease->uses;
    lease->uses = u;
    atomic_fetch_add(&lease->containers, 1);
    pthread_mutex_unlock(&uses_mu);
    return WB_OK;
}

void wb__lease_detach(wb_lease *lease, const wb__container_rec *rec)
{
    wb__lease_use *found = NULL;
    pthread_mutex_lock(&uses_mu);
    for (wb__lease_use **pp = &lease->uses; *pp; pp = &(*pp)->next) {
        if ((*pp)->rec == rec) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    if (found && atomic_load(&lease->containers) > 0)
        atomic_fetch_sub(&lease->containers, 1);
    pthread_mutex_unlock(&uses_mu);
    free(found);
}

void wb__lease_beat_free(Wbproto__LeaseBeat *beat)
{
    for (size_t i = 0; i < beat->n_container_records; i++) {
        Wbproto__ContainerRecord *r = beat->container_records[i];
        free(r->aoti_api);
        free(r->model_path);
        free(r);
    }
    free(beat->container_records);
    beat->container_records = NULL;
    beat->n_container_records = 0;
}

int wb__lease_fill_beat(wb_lease *lease, Wbproto__LeaseBeat *beat)
{
    beat->n_container_records = 0;
    beat->container_records = NULL;
    pthread_mutex_lock(&uses_mu);
    size_t n = 0;
    for (const wb__lease_use *u = lease->uses; u && n < MAX_RECORDS; u = u->next)
        n++;
    if (n == 0) {
        pthread_mutex_unlock(&uses_mu);
        return WB_OK;
    }
    beat->container_records = calloc(n, sizeof *beat->container_records);
    int rc = beat->container_records ? WB_OK : WB_ENOMEM;
    const wb__lease_use *u = lease->uses;
    for (size_t i = 0; i < n && rc == WB_OK; i++, u = u->next) {
        Wbproto__ContainerRecord *r = calloc(1, sizeof *r);
        if (!r) {
            rc = WB_ENOMEM;
            break;
        }
        wbproto__container_record__init(r);
        beat->container_records[beat->n_container_records++] = r;
        r->container_id = u->rec->id;
        r->aoti_api = strdup(u->rec->aoti_api);
        r->model_path = strdup(u->rec->model_path ? u->rec->model_path : "");
        r->pinned_async_copy = u->rec->pinned_async_copy != 0;
        r->bound_bytes = u->bound_bytes;
        r->bound_tensors = u->bound_tensors;
        r->folded_bytes = u->rec->folded_bytes;
        r->embedded_bytes = u->rec->embedded_bytes;
        r->leased_constants = u->rec->leased_constants;
        r->aliased_constants = u->rec->aliased_constants;
        r->caller_constants = u->rec->caller_constants;
        r->package_constants = u->rec->package_constants;
        r->folded_constants = u->rec->folded_constants;
        r->unbound_constants = u->rec->unbound_constants;
        r->package_bytes = u->rec->package_bytes;
        r->created_at = u->rec->created_at;
        if (!r->aoti_api || !r->model_path)
            rc = WB_ENOMEM;
    }
    pthread_mutex_unlock(&uses_mu);
    if (rc != WB_OK)
        wb__lease_beat_free(beat);
    return rc;
}
