/* libwbclient: acquiring and releasing leases: the device asked for, the
 * exchange with the broker, the slabs mapped, and the lease's end. The
 * tensor table comes from lease_table.c, lookups are lease_find.c's. */
#include "lease.h"

#include "alloc.h"
#include "client_impl.h"
#include "clock.h"
#include "devlist.h"
#include "fdchan.h"
#include "fdchan_wire.h"
#include "gpu.h"
#include "mapcache.h"
#include "text.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DIMS 64

/* The bounds of a wait between acquires of a model the broker is bringing
 * back to its device (Reply.retry_after_ms). */
#define RETRY_MIN_MS 1
#define RETRY_MAX_MS 200

/* The devices this process sees, with their UUIDs: read once (a process's
 * CUDA_VISIBLE_DEVICES does not change), and only when a lease is on a cuda
 * broker, so that host-memory clients never start the CUDA runtime. */
static pthread_once_t gpus_once = PTHREAD_ONCE_INIT;
static wb_gpu_list gpus;
static int gpus_rc;
static wb_err gpus_err;

static void read_gpus(void)
{
    gpus_rc = wb__gpu_list(&gpus, &gpus_err);
}

static const wb_gpu_list *local_gpus(wb_err *err)
{
    pthread_once(&gpus_once, read_gpus);
    if (gpus_rc != WB_OK) {
        if (err)
            *err = gpus_err;
        return NULL;
    }
    return &gpus;
}

/* The UUID of the device a lease asks for (`uuid` left empty: ask for
 * none). Only a cuda broker is told: host memory serves every device. */
static int lease_device_uuid(wb_client *c, const char *model, const wb_lease_options *o,
                             char uuid[WB_GPU_UUID_SIZE])
{
    uuid[0] = '\0';
    if (o->device_uuid && o->device_uuid[0] && !wb__gpu_uuid_valid(o->device_uuid))
        return wb__client_fail(c, WB_EINVAL,
                               "acquire '%s': '%.100s' is not a device UUID "
                               "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                               model, o->device_uuid);
    if (c->broker_backend != WBPROTO__BACKEND__BACKEND_CUDA)
        return WB_OK;
    if (o->device_uuid && o->device_uuid[0]) {
        snprintf(uuid, WB_GPU_UUID_SIZE, "%s", o->device_uuid);
        return WB_OK;
    }
    if (o->device == WB_LEASE_DEVICE_ANY)
        return WB_OK;
    wb_err e;
    int dev = o->device;
    if (dev == WB_LEASE_DEVICE_CURRENT && wb__gpu_current(&dev, &e) != WB_OK)
        return WB_OK; /* no usable CUDA here: mapping the slab will say so */
    if (dev < 0)
        return wb__client_fail(c, WB_EINVAL, "acquire '%s': device %d is not an ordinal", model,
                               dev);
    const wb_gpu_list *l = local_gpus(&e);
    if (!l)
        return wb__client_fail(c, e.code, "acquire '%s': device %d: %s", model, dev, e.msg);
    const wb_gpu_dev *d = wb__devlist_find_index(l, dev);
    if (!d) {
        char seen[512];
        wb__devlist_describe_visible(l, seen, sizeof seen);
        return wb__client_fail(c, WB_ENOGPU,
                               "acquire '%s': this process has no CUDA device %d; it sees: %s",
                               model, dev, seen);
    }
    snprintf(uuid, WB_GPU_UUID_SIZE, "%s", d->uuid);
    return WB_OK;
}

/* This process's ordinal of a cuda slab's device: by its UUID (the broker's
 * ordinal means nothing under another CUDA_VISIBLE_DEVICES), or by the
 * ordinal from a broker that sends no UUID. */
static int slab_local_device(const Wbproto__Slab *s, int *local, wb_err *err)
{
    *local = s->device;
    if (!s->device_uuid || !s->device_uuid[0])
        return WB_OK;
    const wb_gpu_list *l = local_gpus(err);
    if (!l)
        return err->code;
    return wb__devlist_map(l, s->device, s->device_uuid, local, err);
}

static void lease_free(wb_lease *l)
{
    if (!l)
        return;
    free(l->own_tensors); /* with their names, dtypes and shapes: one block */
    free(atomic_load(&l->by_name));
    wb__table_unref(&l->table);
    wb__lease_containers_free(l);
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
    /* Its slabs stay mapped a while for the client's next lease on them
     * (not those of a broker run that ended). */
    if (c && !atomic_load(&lease->orphaned)) {
        for (size_t i = 0; i < lease->n_maps; i++)
            wb__client_linger(c, &lease->maps[i]);
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

int wb__slab_kind(int backend, const char *transport)
{
    int empty = !transport || !transport[0];
    if (backend == WBPROTO__BACKEND__BACKEND_HOST) {
        if (empty || strcmp(transport, "shm") == 0)
            return SLAB_SHM;
        if (strcmp(transport, "memfd") == 0)
            return SLAB_MEMFD;
    } else if (backend == WBPROTO__BACKEND__BACKEND_CUDA) {
        if (empty || strcmp(transport, "cuda-ipc") == 0)
            return SLAB_CUDA_IPC;
        if (strcmp(transport, "cuda-vmm") == 0)
            return SLAB_CUDA_VMM;
    }
    return SLAB_UNKNOWN;
}

/* Slabs the broker hands out as descriptors on the descriptor channel
 * rather than by name or handle. */
static int slab_is_fd(int kind)
{
    return kind == SLAB_MEMFD || kind == SLAB_CUDA_VMM;
}

static int map_slabs(wb_client *c, const char *model, const Wbproto__Lease *pl, wb_lease *l)
{
    l->maps = wb__calloc(pl->n_slabs ? pl->n_slabs : 1, sizeof *l->maps);
    if (!l->maps)
        return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
    /* Slabs handed out as descriptors come in one fetch for the lease. */
    int fds[WB_FDCHAN_MAX_FDS];
    size_t n_fds = 0, want_fds = 0;
    for (size_t i = 0; i < pl->n_slabs; i++) {
        const Wbproto__Slab *s = pl->slabs[i];
        int kind = wb__slab_kind(s->backend, s->transport);
        /* Refused before anything is fetched or mapped. */
        if (kind == SLAB_UNKNOWN)
            return wb__client_fail(
                c, WB_EPROTO,
                "acquire '%s': slab %zu: transport '%.40s' of backend %d is not one this "
                "libwbclient knows (shm, memfd, cuda-ipc, cuda-vmm); upgrade it",
                model, i, s->transport ? s->transport : "", (int)s->backend);
        want_fds += slab_is_fd(kind);
    }
    double t0 = wb__clock_mono_s();
    if (want_fds) {
        wb_err e;
        int rc = wb__fdchan_fetch(c->rpc.path, pl->id.data, c->rpc.timeout_ms, fds,
                                  WB_FDCHAN_MAX_FDS, &n_fds, &e);
        if (rc != WB_OK)
            return wb__client_fail(c, rc, "acquire '%s': %s", model, e.msg);
        if (n_fds != pl->n_slabs) {
            for (size_t k = 0; k < n_fds; k++)
                close(fds[k]);
            return wb__client_fail(c, WB_EPROTO,
                                   "acquire '%s': the broker sent %zu descriptors for %zu slabs",
                                   model, n_fds, pl->n_slabs);
        }
    }
    double t1 = wb__clock_mono_s();
    l->fetch_ms = (t1 - t0) * 1000.0;
    int rc = WB_OK;
    wb_err e;
    for (size_t i = 0; i < pl->n_slabs && rc == WB_OK; i++) {
        const Wbproto__Slab *s = pl->slabs[i];
        char what[64];
        switch (wb__slab_kind(s->backend, s->transport)) {
        case SLAB_MEMFD:
            snprintf(what, sizeof what, "slab %zu (memfd)", i);
            rc = wb__mapcache_get_fd(fds[i], s->size, what, &l->maps[i], &e);
            break;
        case SLAB_CUDA_VMM:
        case SLAB_CUDA_IPC: {
            /* The broker's ordinal means nothing here: the slab's UUID says
             * which of this process's devices holds it. */
            int local = -1;
            rc = slab_local_device(s, &local, &e);
            if (rc != WB_OK)
                break;
            if (wb__slab_kind(s->backend, s->transport) == SLAB_CUDA_VMM) {
                snprintf(what, sizeof what, "cuda-vmm slab %zu", i);
                rc = wb__mapcache_get_vmm(fds[i], local, s->size, what, &l->maps[i], &e);
            } else {
                rc = wb__mapcache_get_cuda(s->cuda_ipc_handle.data, s->cuda_ipc_handle.len, local,
                                           s->size, &l->maps[i], &e);
            }
            break;
        }
        default:
            rc = wb__mapcache_get_host(s->shm_name, s->size, &l->maps[i], &e);
            break;
        }
        if (rc == WB_OK)
            l->n_maps = i + 1;
        else
            rc = wb__client_fail(c, rc, "acquire '%s': slab %zu: %s", model, i, e.msg);
    }
    l->map_ms = (wb__clock_mono_s() - t1) * 1000.0;
    /* Mapped (or failed): the mappings keep the memory, not the descriptors. */
    for (size_t k = 0; k < n_fds; k++)
        close(fds[k]);
    return rc;
}

/* Sleeps `ms` milliseconds of CLOCK_MONOTONIC, signals or not. */
static void sleep_ms(int64_t ms)
{
    struct timespec until = wb__clock_mono_deadline(ms * 1000000);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
        ;
}

WB_EXPORT int wb_lease_acquire(wb_client *client, const char *model, wb_lease **out)
{
    return wb_lease_acquire_ex(client, model, NULL, out);
}

WB_EXPORT int wb_lease_device(const wb_lease *lease)
{
    return lease && lease->n_maps ? wb__map_device(lease->maps[0]) : -1;
}

/* An acquire's attempts while the broker answers WB_EBUSY with
 * Reply.retry_after_ms: the exchange's timeout (0: the client's), when the
 * first attempt began, and the last such answer's wait (0 when this
 * attempt got none) and message (empty before the first). */
typedef struct acquire_try {
    int exchange_ms;
    int64_t started_ms;
    uint32_t retry_ms;
    char busy[WB_ERR_MSG_MAX];
} acquire_try;

/* One acquire request and what follows it, under client->mu: *out gets
 * the lease. With `shared` the broker is asked for its shared table; when
 * that table cannot be mapped here the lease is handed back and
 * *unmappable set. A WB_EBUSY with a retry_after_ms is returned with no
 * message stored, its wait and message in *t: the caller asks again. */
static int acquire_once(wb_client *client, const char *model, const char *uuid,
                        const wb_lease_options *o, int shared, wb_lease **out, int *unmappable,
                        acquire_try *t)
{
    int rc;
    Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
    acq.model = (char *)model;
    acq.tensor_table = 1;
    acq.tensor_table_frame = 1;
    acq.tensor_table_shared = shared != 0;
    /* The table of an earlier lease on this model: the broker sends none
     * when it is still the model's. */
    wb__table *held = wb__table_cached(client, model);
    if (held) {
        acq.tensor_table_digest.data = held->digest;
        acq.tensor_table_digest.len = sizeof held->digest;
    }
    acq.device_uuid = (char *)uuid;
    acq.allow_peer = o->allow_peer != 0;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &acq;
    Wbproto__Reply *rep = NULL;
    wb__frame *frame = NULL;
    wb_err e;
    rc = wb__client_call_frame(client, &req, t->exchange_ms, &rep, &frame, &e);
    if (rc != WB_OK) {
        uint32_t retry = rc == WB_EBUSY && rep ? rep->retry_after_ms : 0;
        int answered = rep != NULL;
        wb__reply_free(&rep);
        wb__frame_free(&frame);
        if (retry > 0) {
            t->retry_ms = retry;
            snprintf(t->busy, sizeof t->busy, "%s", e.msg);
            return WB_EBUSY;
        }
        if (t->busy[0] && !answered && rc == WB_ETIMEDOUT)
            /* The attempt had only what was left of the time. */
            return wb__client_fail(client, rc,
                                   "acquire '%s': still not on its device after %lld ms: "
                                   "%.400s (then %.400s)",
                                   model, (long long)(wb__clock_mono_ms() - t->started_ms), t->busy,
                                   e.msg);
        return wb__client_fail(client, rc, "acquire '%s': %s", model, e.msg);
    }
    const Wbproto__Lease *pl = rep->acquire ? rep->acquire->lease : NULL;
    wb_lease *l = NULL;
    if (!pl) {
        rc = wb__client_fail(client, WB_EPROTO, "acquire '%s': the reply carries no lease", model);
    } else if ((rc = validate_lease(client, model, pl)) == WB_OK) {
        l = wb__calloc(1, sizeof *l);
        if (!l)
            rc = wb__client_fail(client, WB_ENOMEM, "acquire '%s': out of memory", model);
    }
    if (l) {
        memcpy(l->id, pl->id.data, WB_LEASE_ID_BYTES);
        wb__text_hex(l->id_hex, sizeof l->id_hex, l->id, WB_LEASE_ID_BYTES);
        wb__lease_containers_init(l);
        atomic_init(&l->orphaned, 0);
        l->version = pl->version;
        l->checksums_pending = pl->checksums_pending != 0;
        l->opt_device = o->device;
        l->opt_allow_peer = o->allow_peer;
        if (o->device_uuid)
            snprintf(l->opt_uuid, sizeof l->opt_uuid, "%s", o->device_uuid);
        l->model = wb__strdup(model);
        if (!l->model)
            rc = wb__client_fail(client, WB_ENOMEM, "acquire '%s': out of memory", model);
        if (rc == WB_OK)
            rc = map_slabs(client, model, pl, l);
        if (rc == WB_OK)
            rc = wb__lease_build_tensors(client, model, pl, held, l, &rep, &frame, unmappable);
    }
    if (rc != WB_OK && pl && pl->id.len == WB_LEASE_ID_BYTES) {
        /* The broker granted a lease this process cannot use: hand it back
         * now rather than leave it to process exit. */
        wb_err ignored;
        send_release(client, pl->id.data, &ignored);
    }
    wb__reply_free(&rep);
    wb__frame_free(&frame);
    if (rc != WB_OK) {
        lease_free(l);
        return rc;
    }
    l->client = client;
    l->next = client->leases;
    if (client->leases)
        client->leases->prev = l;
    client->leases = l;
    *out = l;
    return WB_OK;
}

WB_EXPORT int wb_lease_acquire_ex(wb_client *client, const char *model,
                                  const wb_lease_options *opts, wb_lease **out)
{
    if (out)
        *out = NULL;
    if (!client)
        return WB_EINVAL;
    static const wb_lease_options defaults = {.device = WB_LEASE_DEVICE_CURRENT};
    const wb_lease_options *o = opts ? opts : &defaults;
    if (!out || !model || !model[0])
        return wb__client_fail(client, WB_EINVAL, "acquire: %s",
                               !out ? "no place for the lease (out is NULL)" : "no model name");
    pthread_mutex_lock(&client->mu);
    int rc;
    /* The backend is known from the hello; reconnecting first would tell a
     * new broker's, but a stale value only costs one refused acquire. */
    char uuid[WB_GPU_UUID_SIZE];
    if ((rc = lease_device_uuid(client, model, o, uuid)) != WB_OK) {
        pthread_mutex_unlock(&client->mu);
        return rc;
    }
    /* A model the broker is bringing back to its device is asked for again
     * after the wait it names, until the client's timeout from the first
     * attempt runs out. The lock is held for one attempt at a time, never
     * across a wait: heartbeats and other requests go between attempts. */
    const int timeout_ms = client->rpc.timeout_ms;
    acquire_try t = {.started_ms = wb__clock_mono_ms()};
    for (;;) {
        /* The shared table first; where it cannot be mapped (no /dev/shm
         * shared with the broker), the table as a frame from then on. */
        int unmappable = 0;
        t.retry_ms = 0;
        rc = acquire_once(client, model, uuid, o, !client->table_shared_off, out, &unmappable, &t);
        if (rc != WB_OK && unmappable) {
            client->table_shared_off = 1;
            rc = acquire_once(client, model, uuid, o, 0, out, &unmappable, &t);
        }
        pthread_mutex_unlock(&client->mu);
        if (rc != WB_EBUSY || t.retry_ms == 0)
            return rc;
        int64_t left = t.started_ms + timeout_ms - wb__clock_mono_ms();
        if (left > 0) {
            int64_t wait = t.retry_ms < RETRY_MIN_MS   ? RETRY_MIN_MS
                           : t.retry_ms > RETRY_MAX_MS ? RETRY_MAX_MS
                                                       : t.retry_ms;
            sleep_ms(wait < left ? wait : left);
            left = t.started_ms + timeout_ms - wb__clock_mono_ms();
        }
        if (left <= 0)
            return wb__client_fail(client, WB_ETIMEDOUT,
                                   "acquire '%s': still not on its device after %d ms: %s", model,
                                   timeout_ms, t.busy);
        /* Within what is left of the time. */
        t.exchange_ms = (int)left;
        pthread_mutex_lock(&client->mu);
    }
}

WB_EXPORT int wb_lease_release(wb_lease **lease)
{
    if (!lease)
        return WB_EINVAL;
    wb_lease *l = *lease;
    if (!l)
        return WB_OK;
    wb_client *c = l->client;
    /* The decision is taken under the lease's lock, the one registrations
     * change under: once it says 0, no container can register any more. */
    unsigned n = wb__lease_begin_end(l);
    if (!c) {
        /* Detached by wb_client_destroy: only the local side is left. */
        if (n > 0)
            return WB_EBUSY;
        *lease = NULL;
        lease_free(l);
        return WB_ECONN;
    }
    if (n > 0)
        return wb__client_fail(c, WB_EBUSY,
                               "release lease %.8s (model '%s'): %u container(s) still use it",
                               l->id_hex, l->model, n);
    pthread_mutex_lock(&c->mu);
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

WB_EXPORT uint32_t wb_lease_version(const wb_lease *lease)
{
    return lease ? lease->version : 0;
}

WB_EXPORT int wb_lease_checksums_pending(const wb_lease *lease)
{
    return lease ? lease->checksums_pending : 0;
}

WB_EXPORT int wb_lease_orphaned(const wb_lease *lease)
{
    return lease ? atomic_load(&lease->orphaned) : 0;
}
