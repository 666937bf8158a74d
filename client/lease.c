/* libwbclient: acquiring and releasing leases, and their tensor tables. */
#include "lease.h"

#include "client_impl.h"
#include "devlist.h"
#include "fdchan.h"
#include "fdwire.h"
#include "gpu.h"
#include "mapcache.h"
#include "names.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DIMS 64

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
    l->maps = calloc(pl->n_slabs ? pl->n_slabs : 1, sizeof *l->maps);
    if (!l->maps)
        return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
    /* Slabs handed out as descriptors come in one fetch for the lease. */
    int fds[WB_FDWIRE_MAX_FDS];
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
    if (want_fds) {
        wb_err e;
        int rc = wb__fdchan_fetch(c->rpc.path, pl->id.data, c->rpc.timeout_ms, fds,
                                  WB_FDWIRE_MAX_FDS, &n_fds, &e);
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
    /* Mapped (or failed): the mappings keep the memory, not the descriptors. */
    for (size_t k = 0; k < n_fds; k++)
        close(fds[k]);
    return rc;
}

/* The tensor table is one allocation: the entries, then every shape, then
 * every name and dtype. A model of 10^5 tensors would otherwise cost 3 * 10^5
 * mallocs at acquire and as many frees at release. */
_Static_assert(sizeof((wb_client *)0)->tables / sizeof((wb_client *)0)->tables[0] == WB_TABLE_CACHE,
               "wb_client.tables holds WB_TABLE_CACHE tables");

void wb__table_unref(wb__table **tp)
{
    wb__table *t = tp ? *tp : NULL;
    if (!t)
        return;
    *tp = NULL;
    if (atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    free(atomic_load(&t->entries));
    free(t->slab_need);
    free(atomic_load(&t->by_name));
    pthread_mutex_destroy(&t->mu);
    wb__reply_free(&t->rep);
    wb__frame_free(&t->frame);
    wb__mapcache_put(&t->map);
    free(t->model);
    free(t);
}

static wb__table *table_ref(wb__table *t)
{
    atomic_fetch_add(&t->refs, 1);
    return t;
}

/* The table of the client's last lease on `model`, or NULL. */
static wb__table *table_cached(wb_client *c, const char *model)
{
    for (size_t i = 0; i < WB_TABLE_CACHE; i++) {
        if (c->tables[i] && strcmp(c->tables[i]->model, model) == 0)
            return c->tables[i];
    }
    return NULL;
}

/* Keeps `t` (one more reference) as the model's table, in place of an
 * older one of the same model or else of the oldest slot. */
static void table_keep(wb_client *c, wb__table *t)
{
    size_t slot = c->tables_next;
    for (size_t i = 0; i < WB_TABLE_CACHE; i++) {
        if (c->tables[i] && strcmp(c->tables[i]->model, t->model) == 0) {
            slot = i;
            break;
        }
    }
    if (slot == c->tables_next)
        c->tables_next = (c->tables_next + 1) % WB_TABLE_CACHE;
    wb__table_unref(&c->tables[slot]);
    c->tables[slot] = table_ref(t);
}

/* A table (checked: by the decoder when it came inside the reply, by the
 * caller when it came as a second frame or shared): it keeps what holds
 * `bytes` (*rep, *frame or *map, whichever is given, is taken), or a copy
 * when the bytes are not 8-byte aligned. Its entries are made on first use
 * (table_entries); what a lease on it needs now is each slab's extent, read
 * from the records. NULL when out of memory (nothing taken). */
static wb__table *table_new(const char *model, const uint8_t *bytes, size_t len,
                            Wbproto__Reply **rep, wb__frame **frame, wb__map **map)
{
    int copy = ((uintptr_t)bytes & 7) != 0;
    wb__table *t = calloc(1, sizeof *t + (copy ? (len + 7) & ~(size_t)7 : 0));
    if (!t)
        return NULL;
    t->bytes = copy ? memcpy(t->copy, bytes, len) : bytes;
    t->len = len;
    size_t n = wb__tensor_table_count(t->bytes);
    /* The slabs named (most tables name one), then each one's extent. */
    const uint8_t *rec = t->bytes + WB_TABLE_HEADER;
    for (size_t i = 0; i < n; i++, rec += WB_TABLE_RECORD) {
        wb_table_tensor r;
        memcpy(&r, rec, sizeof r);
        if (r.slab >= t->n_slabs)
            t->n_slabs = (size_t)r.slab + 1;
    }
    t->model = strdup(model);
    t->slab_need = calloc(t->n_slabs ? t->n_slabs : 1, sizeof *t->slab_need);
    if (!t->model || !t->slab_need) {
        free(t->model);
        free(t->slab_need);
        free(t);
        return NULL;
    }
    rec = t->bytes + WB_TABLE_HEADER;
    for (size_t i = 0; i < n; i++, rec += WB_TABLE_RECORD) {
        wb_table_tensor r;
        memcpy(&r, rec, sizeof r);
        if (r.offset + r.nbytes > t->slab_need[r.slab])
            t->slab_need[r.slab] = r.offset + r.nbytes;
    }
    t->n_entries = n;
    atomic_init(&t->refs, 1);
    atomic_init(&t->entries, NULL);
    atomic_init(&t->by_name, NULL);
    pthread_mutex_init(&t->mu, NULL);
    if (!copy && rep) {
        t->rep = *rep;
        *rep = NULL;
    } else if (!copy && frame) {
        t->frame = *frame;
        *frame = NULL;
    } else if (!copy && map) {
        t->map = *map;
        *map = NULL;
    }
    wb__tensor_table_digest(t->bytes, len, t->digest);
    return t;
}

/* The table's entries, made by the first caller under the table's lock and
 * published for every lease on it; NULL when out of memory. */
static const wb__tensor_entry *table_entries(wb__table *t)
{
    wb__tensor_entry *e = atomic_load_explicit(&t->entries, memory_order_acquire);
    if (e)
        return e;
    pthread_mutex_lock(&t->mu);
    e = atomic_load_explicit(&t->entries, memory_order_relaxed);
    size_t n = t->n_entries;
    if (!e && (e = malloc((n ? n : 1) * sizeof *e)) != NULL) {
        const char *str = wb__tensor_table_strings(t->bytes);
        const uint64_t *dims = wb__tensor_table_dims(t->bytes);
        const uint8_t *rec = t->bytes + WB_TABLE_HEADER;
        for (size_t i = 0; i < n; i++, rec += WB_TABLE_RECORD) {
            wb_table_tensor r;
            memcpy(&r, rec, sizeof r);
            e[i] = (wb__tensor_entry){.name = (char *)str + r.name,
                                      .dtype = (char *)str + r.dtype,
                                      .ndim = r.ndim,
                                      .slab = r.slab,
                                      .shape = (uint64_t *)dims + r.dim,
                                      .offset = r.offset,
                                      .nbytes = r.nbytes,
                                      .xxh3 = r.xxh3};
        }
        atomic_store_explicit(&t->entries, e, memory_order_release);
    }
    pthread_mutex_unlock(&t->mu);
    return e;
}

const wb__tensor_entry *wb__lease_tensors(const wb_lease *lease)
{
    return lease->table ? table_entries(lease->table) : lease->own_tensors;
}

/* A lease on a table: its entries are the table's (checked against this
 * lease's slabs: by the decoder for a table just received, again for one
 * held), shared, one reference more. O(1) in the tensors. */
static void lease_on_table(wb_lease *l, wb__table *t)
{
    l->table = table_ref(t);
    l->n_tensors = t->n_entries;
}

/* The table a reply says the client holds: its names, dtypes and layout
 * were checked when it came; what depends on the lease is that every
 * tensor fits its slab, checked per slab (O(slabs), not O(tensors)). */
static int build_from_cached(wb_client *c, const char *model, const Wbproto__Lease *pl,
                             wb__table *held, wb_lease *l)
{
    if (!held)
        return wb__client_fail(c, WB_EPROTO,
                               "acquire '%s': the broker answered that this client holds the "
                               "model's tensor table, but it holds none",
                               model);
    if (held->n_slabs > pl->n_slabs)
        return wb__client_fail(c, WB_EPROTO,
                               "acquire '%s': the tensor table held names slab %zu, the lease "
                               "has %zu",
                               model, held->n_slabs - 1, pl->n_slabs);
    for (size_t i = 0; i < held->n_slabs; i++) {
        if (held->slab_need[i] > pl->slabs[i]->size)
            return wb__client_fail(c, WB_EPROTO,
                                   "acquire '%s': the tensor table held needs %llu bytes of "
                                   "slab %zu, the lease's has %llu",
                                   model, (unsigned long long)held->slab_need[i], i,
                                   (unsigned long long)pl->slabs[i]->size);
    }
    lease_on_table(l, held);
    return WB_OK;
}

/* Keeps the table t as the model's, for the lease and the next acquires. */
static int lease_on_new_table(wb_client *c, const char *model, wb_lease *l, wb__table *t)
{
    if (!t)
        return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
    table_keep(c, t);
    lease_on_table(l, t);
    wb__table_unref(&t);
    return WB_OK;
}

/* The table the broker published in shared memory: mapped read-only
 * through the map cache (every lease and client of this process on the
 * model share the mapping) and checked as a received table is; its bytes
 * are never copied. A mapping that fails sets *unmappable: the caller asks
 * again for the table another way. */
static int build_from_shared(wb_client *c, const char *model, const Wbproto__Lease *pl, wb_lease *l,
                             int *unmappable)
{
    const Wbproto__Slab *s = pl->tensor_table_slab;
    wb__map *map = NULL;
    wb_err e;
    int rc = wb__mapcache_get_host(s->shm_name, s->size, &map, &e);
    if (rc != WB_OK) {
        *unmappable = 1;
        return wb__client_fail(c, rc, "acquire '%s': the shared tensor table: %s", model, e.msg);
    }
    const uint8_t *bytes = wb__map_addr(map);
    size_t len = (size_t)s->size;
    if (wb__tensor_table_check(bytes, len, pl->slabs, pl->n_slabs, &e) != WB_OK) {
        wb__mapcache_put(&map);
        return wb__client_fail(c, WB_EPROTO, "acquire '%s': the shared tensor table %s: %s", model,
                               s->shm_name, e.msg);
    }
    wb__table *t = table_new(model, bytes, len, NULL, NULL, &map);
    wb__mapcache_put(&map); /* still ours when table_new failed */
    return lease_on_new_table(c, model, l, t);
}

static int build_tensors(wb_client *c, const char *model, const Wbproto__Lease *pl, wb__table *held,
                         wb_lease *l, Wbproto__Reply **rep, wb__frame **frame, int *unmappable)
{
    if (pl->tensor_table_cached)
        return build_from_cached(c, model, pl, held, l);
    if (pl->tensor_table_slab)
        return build_from_shared(c, model, pl, l, unmappable);
    if (pl->tensor_table_in_frame) {
        if (!*frame)
            return wb__client_fail(c, WB_EPROTO,
                                   "acquire '%s': the reply says the tensor table follows in a "
                                   "second frame, but none came",
                                   model);
        const uint8_t *bytes = wb__frame_data(*frame);
        size_t len = wb__frame_size(*frame);
        wb_err e;
        if (wb__tensor_table_check(bytes, len, pl->slabs, pl->n_slabs, &e) != WB_OK)
            return wb__client_fail(c, WB_EPROTO, "acquire '%s': the tensor table frame: %s", model,
                                   e.msg);
        return lease_on_new_table(c, model, l, table_new(model, bytes, len, NULL, frame, NULL));
    }
    if (pl->tensor_table.len)
        return lease_on_new_table(
            c, model, l,
            table_new(model, pl->tensor_table.data, pl->tensor_table.len, rep, NULL, NULL));
    size_t n = pl->n_tensors, dims = 0, chars = 0;
    for (size_t i = 0; i < n; i++) {
        const Wbproto__Tensor *t = pl->tensors[i];
        dims += t->n_shape;
        chars += strlen(t->name) + strlen(t->dtype) + 2;
    }
    size_t size = (n ? n : 1) * sizeof *l->own_tensors + dims * sizeof(uint64_t) + chars;
    l->own_tensors = malloc(size);
    if (!l->own_tensors)
        return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
    uint64_t *shape = (uint64_t *)(l->own_tensors + (n ? n : 1));
    char *str = (char *)(shape + dims);
    for (size_t i = 0; i < n; i++) {
        const Wbproto__Tensor *t = pl->tensors[i];
        wb__tensor_entry *lt = &l->own_tensors[i];
        size_t ln = strlen(t->name) + 1, ld = strlen(t->dtype) + 1;
        lt->name = memcpy(str, t->name, ln);
        str += ln;
        lt->dtype = memcpy(str, t->dtype, ld);
        str += ld;
        lt->ndim = (uint32_t)t->n_shape;
        lt->shape = shape;
        if (t->n_shape)
            memcpy(shape, t->shape, t->n_shape * sizeof *shape);
        shape += t->n_shape;
        lt->slab = t->slab;
        lt->offset = t->offset;
        lt->nbytes = t->nbytes;
        lt->xxh3 = t->xxh3;
    }
    l->n_tensors = n;
    return WB_OK;
}

WB_EXPORT int wb_lease_acquire(wb_client *client, const char *model, wb_lease **out)
{
    return wb_lease_acquire_ex(client, model, NULL, out);
}

WB_EXPORT int wb_lease_device(const wb_lease *lease)
{
    return lease && lease->n_maps ? wb__map_device(lease->maps[0]) : -1;
}

/* One acquire request and what follows it, under client->mu: *out gets
 * the lease. With `shared` the broker is asked for its shared table; when
 * that table cannot be mapped here the lease is handed back and
 * *unmappable set. */
static int acquire_once(wb_client *client, const char *model, const char *uuid,
                        const wb_lease_options *o, int shared, wb_lease **out, int *unmappable)
{
    int rc;
    Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
    acq.model = (char *)model;
    acq.tensor_table = 1;
    acq.tensor_table_frame = 1;
    acq.tensor_table_shared = shared != 0;
    /* The table of an earlier lease on this model: the broker sends none
     * when it is still the model's. */
    wb__table *held = table_cached(client, model);
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
    rc = wb__client_call_frame(client, &req, 0, &rep, &frame, &e);
    if (rc != WB_OK) {
        wb__reply_free(&rep);
        wb__frame_free(&frame);
        return wb__client_fail(client, rc, "acquire '%s': %s", model, e.msg);
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
        wb__lease_containers_init(l);
        atomic_init(&l->orphaned, 0);
        l->model = strdup(model);
        if (!l->model)
            rc = wb__client_fail(client, WB_ENOMEM, "acquire '%s': out of memory", model);
        if (rc == WB_OK)
            rc = map_slabs(client, model, pl, l);
        if (rc == WB_OK)
            rc = build_tensors(client, model, pl, held, l, &rep, &frame, unmappable);
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
    pthread_mutex_lock(&client->mu);
    int rc;
    if (!out || !model || !model[0]) {
        rc = wb__client_fail(client, WB_EINVAL, "acquire: %s",
                             !out ? "no place for the lease (out is NULL)" : "no model name");
        pthread_mutex_unlock(&client->mu);
        return rc;
    }
    /* The backend is known from the hello; reconnecting first would tell a
     * new broker's, but a stale value only costs one refused acquire. */
    char uuid[WB_GPU_UUID_SIZE];
    if ((rc = lease_device_uuid(client, model, o, uuid)) != WB_OK) {
        pthread_mutex_unlock(&client->mu);
        return rc;
    }
    /* The shared table first; where it cannot be mapped (no /dev/shm
     * shared with the broker), the table as a frame from then on. */
    int unmappable = 0;
    rc = acquire_once(client, model, uuid, o, !client->table_shared_off, out, &unmappable);
    if (rc != WB_OK && unmappable) {
        client->table_shared_off = 1;
        rc = acquire_once(client, model, uuid, o, 0, out, &unmappable);
    }
    pthread_mutex_unlock(&client->mu);
    return rc;
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
    pthread_mutex_lock(&c->mu);
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

static void fill_view(const wb_lease *l, const wb__tensor_entry *t, wb_tensor_view *out)
{
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    out->shape = t->shape;
    out->data = wb__entry_data(l, t);
    out->nbytes = t->nbytes;
    out->xxh3 = t->xxh3;
    out->device = wb__entry_device(l, t);
}

/* The lease's tensors could not be made. */
static int lease_enomem(const wb_lease *lease)
{
    if (lease->client) {
        pthread_mutex_lock(&lease->client->mu);
        wb__client_fail(lease->client, WB_ENOMEM,
                        "lease %.8s (model '%s'): out of memory making its %zu tensor entries",
                        lease->id_hex, lease->model, lease->n_tensors);
        pthread_mutex_unlock(&lease->client->mu);
    }
    return WB_ENOMEM;
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
    const wb__tensor_entry *e = wb__lease_tensors(lease);
    if (!e)
        return lease_enomem(lease);
    fill_view(lease, &e[index], out);
    return WB_OK;
}

/* The lease's name index over its entries, made by the first caller; NULL
 * when memory is short (callers then scan). */
static const wb__names_hash *lease_index(wb_lease *l, const wb__tensor_entry *ents)
{
    /* The index is a cache: building it changes nothing a caller sees. A
     * lease on a table uses the table's, made once for every lease on it. */
    _Atomic(wb__names_hash *) *slot = l->table ? &l->table->by_name : &l->by_name;
    pthread_mutex_t *mu = l->table ? &l->table->mu : &l->mu;
    wb__names_hash *idx = atomic_load_explicit(slot, memory_order_acquire);
    if (!idx && l->n_tensors > 0) {
        pthread_mutex_lock(mu);
        idx = atomic_load_explicit(slot, memory_order_relaxed);
        if (!idx) {
            idx = wb__names_hash_new(ents, l->n_tensors, sizeof *ents,
                                     offsetof(wb__tensor_entry, name));
            if (idx)
                atomic_store_explicit(slot, idx, memory_order_release);
        }
        pthread_mutex_unlock(mu);
    }
    return idx;
}

const wb__tensor_entry *wb__lease_lookup(const wb_lease *lease, const char *name)
{
    wb_lease *l = (wb_lease *)lease;
    const wb__tensor_entry *ents = wb__lease_tensors(l);
    if (!ents)
        return NULL;
    const wb__names_hash *idx = lease_index(l, ents);
    if (idx)
        return wb__names_hash_find(idx, ents, sizeof *ents, offsetof(wb__tensor_entry, name), name);
    /* Without an index (out of memory) the lookup scans. */
    return wb__names_find(ents, l->n_tensors, sizeof *ents, offsetof(wb__tensor_entry, name), NULL,
                          name);
}

WB_EXPORT int wb_lease_find(const wb_lease *lease, const char *name, wb_tensor_view *out)
{
    if (!lease || !name || !out)
        return WB_EINVAL;
    if (lease->n_tensors && !wb__lease_tensors(lease))
        return lease_enomem(lease);
    const wb__tensor_entry *t = wb__lease_lookup(lease, name);
    if (t) {
        fill_view(lease, t, out);
        return WB_OK;
    }
    if (lease->client) {
        pthread_mutex_lock(&lease->client->mu);
        wb__client_fail(lease->client, WB_ENOTFOUND, "lease %.8s (model '%s'): no tensor '%s'",
                        lease->id_hex, lease->model, name);
        pthread_mutex_unlock(&lease->client->mu);
    }
    return WB_ENOTFOUND;
}

WB_EXPORT int wb_lease_find_many(const wb_lease *lease, const char *const *names, size_t n,
                                 wb_tensor_view *out)
{
    if (!lease || (n && (!names || !out)))
        return WB_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!names[i])
            return WB_EINVAL;
    }
    if (n == 0)
        return WB_OK;
    wb_lease *l = (wb_lease *)lease;
    const wb__tensor_entry *ents = l->n_tensors ? wb__lease_tensors(l) : NULL;
    if (l->n_tensors && !ents)
        return lease_enomem(lease);
    const wb__names_hash *idx = ents ? lease_index(l, ents) : NULL;
    size_t missing = 0, first_missing = 0;
    size_t found[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t m = n - i < 1024 ? n - i : 1024;
        if (idx)
            wb__names_hash_find_many(idx, ents, sizeof *ents, offsetof(wb__tensor_entry, name),
                                     names + i, m, found);
        for (size_t j = 0; j < m; j++) {
            const wb__tensor_entry *t = NULL;
            if (idx)
                t = found[j] == SIZE_MAX ? NULL : &ents[found[j]];
            else if (ents) /* no index (out of memory): a scan */
                t = wb__names_find(ents, l->n_tensors, sizeof *ents,
                                   offsetof(wb__tensor_entry, name), NULL, names[i + j]);
            memset(&out[i + j], 0, sizeof out[i + j]);
            if (t)
                fill_view(lease, t, &out[i + j]);
            else if (missing++ == 0)
                first_missing = i + j;
        }
    }
    if (!missing)
        return WB_OK;
    if (lease->client) {
        pthread_mutex_lock(&lease->client->mu);
        wb__client_fail(lease->client, WB_ENOTFOUND,
                        "lease %.8s (model '%s'): no tensor '%s' (names[%zu]; %zu of %zu names "
                        "not found)",
                        lease->id_hex, lease->model, names[first_missing], first_missing, missing,
                        n);
        pthread_mutex_unlock(&lease->client->mu);
    }
    return WB_ENOTFOUND;
}
