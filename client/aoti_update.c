/* libwbclient: a new version of a container's weights swapped in between
 * runs (wb_container_update), and the locks that make a run see one
 * version whole.
 *
 * What this relies on, read from upstream's runtime
 * (torch/csrc/inductor/aoti_runtime/model_container.h and utils.h of
 * pytorch/pytorch, and the C wrappers in interface.cpp):
 *   - run() holds the container's model_exec_mutex_ shared while it queues
 *     the model's work, and reads the active buffer (use_secondary_) there;
 *     it returns once the work is queued: on CUDA the kernels still read
 *     the weights after it returns;
 *   - update_constant_buffer(use_inactive=true), behind
 *     UpdateUserManagedConstantBufferPairs, takes no lock and writes only
 *     the inactive buffer's map, array and folding state; a buffer or
 *     tensor constant missing from the pairs is given the active buffer's
 *     tensor; a user-managed entry is a handle of its own on the tensor's
 *     storage (aoti_torch_new_tensor_handle) that the container never
 *     frees, so the memory is ours to keep valid;
 *   - run_const_fold(inactive=true) (RunConstantFolding) holds the mutex
 *     shared, borrows one model instance (waiting for one a run frees),
 *     folds into the inactive buffer and marks it folded;
 *   - swap_constant_buffer() (SwapConstantBuffer) takes the mutex
 *     exclusively, so it waits for runs that are queuing, points every model
 *     at the inactive buffer and flips use_secondary_;
 *   - free_inactive_constant_buffer() takes no lock and frees the inactive
 *     buffer's own blob and its folded constants, not the user-managed
 *     entries (which are not owned): after a swap, the old version's
 *     entries stay in the now inactive map, which nothing reads until the
 *     next update overwrites every entry passed. So the old wrappers may be
 *     deleted once no queued work reads the old memory; the blob may not be
 *     freed while a constant bound by nothing reads the library's own data
 *     through it.
 * Our own run lock (a rwlock preferring writers, held shared around Run and
 * exclusively around the swap) gives the same exclusion whatever the
 * library does, and makes the version a run reports exact. */
#include "aoti_impl.h"

#include "alloc.h"
#include "clock.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int wb__aoti_locks_init(wb_container *c)
{
    pthread_rwlockattr_t a;
    if (pthread_rwlockattr_init(&a) != 0)
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    /* glibc prefers readers by default: a loop of runs would starve the
     * swap forever. */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int rc = pthread_rwlock_init(&c->run_lock, &a);
    pthread_rwlockattr_destroy(&a);
    if (rc != 0)
        return wb__aoti_fail(c, WB_ENOMEM, "cannot make the container's run lock");
    pthread_mutex_init(&c->update_mu, NULL);
    pthread_mutex_init(&c->streams_mu, NULL);
    c->locks_ready = 1;
    return WB_OK;
}

void wb__aoti_locks_free(wb_container *c)
{
    if (!c->locks_ready)
        return;
    pthread_rwlock_destroy(&c->run_lock);
    pthread_mutex_destroy(&c->update_mu);
    pthread_mutex_destroy(&c->streams_mu);
    c->locks_ready = 0;
}

void wb__aoti_note_stream(wb_container *c, void *stream)
{
    if (!c->cuda)
        return;
    pthread_mutex_lock(&c->streams_mu);
    size_t i = 0;
    while (i < c->n_streams && c->streams[i] != stream)
        i++;
    if (i == c->n_streams) {
        if (c->n_streams < WB_CONTAINER_STREAMS)
            c->streams[c->n_streams++] = stream;
        else
            c->streams_overflow = 1;
    }
    pthread_mutex_unlock(&c->streams_mu);
}

int wb__aoti_keep_options(wb_container *c, const wb_container_options *o)
{
    c->copy_mutated = o->copy_mutated;
    if (!o->n_tensors || !o->tensors)
        return WB_OK;
    c->caller = wb__calloc(o->n_tensors, sizeof *c->caller);
    if (!c->caller)
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    for (size_t i = 0; i < o->n_tensors; i++) {
        const wb_container_tensor *t = &o->tensors[i];
        wb_container_tensor *k = &c->caller[i];
        c->n_caller = i + 1;
        *k = *t;
        k->fqn = t->fqn ? wb__strdup(t->fqn) : NULL;
        k->dtype = t->dtype ? wb__strdup(t->dtype) : NULL;
        uint64_t *shape = wb__calloc(t->ndim ? t->ndim : 1, sizeof *shape);
        if (shape && t->ndim && t->shape)
            memcpy(shape, t->shape, t->ndim * sizeof *shape);
        k->shape = shape;
        if ((t->fqn && !k->fqn) || (t->dtype && !k->dtype) || !shape)
            return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    }
    return WB_OK;
}

/* A container's bindings and what they count, moved out while an update
 * binds the new version in their place (the binding code of aoti_bind.c
 * works on the container), and moved back when it fails. */
typedef struct bound {
    size_t n_bind;
    binding *bind;
    size_t n_leases;
    wb_lease **leases;
    uint64_t *lease_bytes;
    uint32_t *lease_tensors;
    size_t bound_tensors, leased, aliased, caller, package, unbound;
    uint64_t bound_bytes, caller_bytes, package_bytes;
} bound;

static void take(wb_container *c, bound *b)
{
    wb_container_info *i = &c->info;
    *b = (bound){c->n_bind,
                 c->bind,
                 c->n_leases,
                 c->leases,
                 c->lease_bytes,
                 c->lease_tensors,
                 i->bound_tensors,
                 i->leased_constants,
                 i->aliased_constants,
                 i->caller_constants,
                 i->package_constants,
                 i->unbound_constants,
                 i->bound_bytes,
                 i->caller_bytes,
                 i->package_bytes};
}

static void put(wb_container *c, const bound *b)
{
    wb_container_info *i = &c->info;
    c->n_bind = b->n_bind;
    c->bind = b->bind;
    c->n_leases = b->n_leases;
    c->leases = b->leases;
    c->lease_bytes = b->lease_bytes;
    c->lease_tensors = b->lease_tensors;
    i->bound_tensors = b->bound_tensors;
    i->leased_constants = b->leased;
    i->aliased_constants = b->aliased;
    i->caller_constants = b->caller;
    i->package_constants = b->package;
    i->unbound_constants = b->unbound;
    i->bound_bytes = b->bound_bytes;
    i->caller_bytes = b->caller_bytes;
    i->package_bytes = b->package_bytes;
}

static void free_bound(const wb_container *c, bound *b)
{
    wb__aoti_free_binding_array(c, b->bind, b->n_bind);
    free(b->leases);
    free(b->lease_bytes);
    free(b->lease_tensors);
    memset(b, 0, sizeof *b);
}

/* A fresh state for the new version: the constants' metadata copied from
 * the old bindings (the model's, which do not change), nothing bound, the
 * new lease array. */
static int fresh(wb_container *c, const bound *old, wb_lease **leases, size_t n_leases, bound *b)
{
    memset(b, 0, sizeof *b);
    b->leases = leases;
    b->n_leases = n_leases;
    b->bind = wb__calloc(old->n_bind ? old->n_bind : 1, sizeof *b->bind);
    b->lease_bytes = wb__calloc(n_leases ? n_leases : 1, sizeof *b->lease_bytes);
    b->lease_tensors = wb__calloc(n_leases ? n_leases : 1, sizeof *b->lease_tensors);
    if (!b->bind || !b->lease_bytes || !b->lease_tensors)
        return wb__aoti_fail(c, WB_ENOMEM, "update: out of memory");
    for (size_t i = 0; i < old->n_bind; i++) {
        const binding *o = &old->bind[i];
        binding *nb = &b->bind[i];
        b->n_bind = i + 1;
        nb->dtype = o->dtype;
        nb->size = o->size;
        nb->folded = o->folded;
        nb->type = o->type;
        nb->own = o->own;
        nb->lease = nb->caller = nb->alias = -1;
        nb->name = wb__strdup(o->name);
        nb->fqn = wb__strdup(o->fqn);
        if (!nb->name || !nb->fqn)
            return wb__aoti_fail(c, WB_ENOMEM, "update: out of memory");
    }
    return WB_OK;
}

/* The arguments: each new lease names a model the container leases, once,
 * and is not already one of its leases. *slot[i] = the index it replaces. */
static int check_update(wb_container *c, wb_lease *const *nl, size_t n, size_t *slot)
{
    if (!c->h)
        return wb__aoti_fail(c, WB_ESTATE, "update: the container was not created");
    if (c->own_constants)
        return wb__aoti_fail(c, WB_EINVAL,
                             "update: model %s was created with own_constants: it binds nothing "
                             "of its leases, so there is nothing a new version could replace",
                             c->model_path);
    if (!c->f.swap || !c->f.update_user_managed)
        return wb__aoti_fail(
            c, WB_ENOSYS,
            "update: model library %s does not export %s: there is no inactive constant buffer "
            "to bind a new version into; the container keeps the version it has",
            c->so_path,
            !c->f.swap ? "AOTInductorModelContainerSwapConstantBuffer"
                       : "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs");
    if (!n || !nl)
        return wb__aoti_fail(c, WB_EINVAL, "update: no leases given");
    for (size_t i = 0; i < n; i++) {
        if (!nl[i])
            return wb__aoti_fail(c, WB_EINVAL, "update: lease %zu is NULL", i);
        slot[i] = c->n_leases;
        for (size_t k = 0; k < c->n_leases; k++) {
            if (c->leases[k] == nl[i])
                return wb__aoti_fail(c, WB_EINVAL,
                                     "update: lease %.8s (model '%s') is already the container's",
                                     nl[i]->id_hex, nl[i]->model);
            if (strcmp(c->leases[k]->model, nl[i]->model) == 0)
                slot[i] = k;
        }
        if (slot[i] == c->n_leases) {
            char names[512];
            wb__aoti_lease_names(c, names, sizeof names);
            return wb__aoti_fail(c, WB_EINVAL,
                                 "update: lease %.8s is of model '%s', which the container does "
                                 "not use (its leases are of %s)",
                                 nl[i]->id_hex, nl[i]->model, names[0] ? names : "no model");
        }
        for (size_t k = 0; k < i; k++) {
            if (slot[k] == slot[i])
                return wb__aoti_fail(c, WB_EINVAL, "update: two leases of model '%s' given",
                                     nl[i]->model);
        }
    }
    return WB_OK;
}

/* Waits for the work queued on the streams of `s` (runs before the swap).
 * Beyond WB_CONTAINER_STREAMS streams, the device. */
static int wait_streams(wb_container *c, void *const *s, size_t n, int overflow)
{
#ifdef WB_HAVE_CUDA
    cudaError_t ce = cudaSuccess;
    if (overflow)
        ce = cudaDeviceSynchronize();
    for (size_t i = 0; ce == cudaSuccess && !overflow && i < n; i++)
        ce = cudaStreamSynchronize((cudaStream_t)s[i]);
    if (ce != cudaSuccess)
        return wb__aoti_fail(c, WB_EINTERNAL,
                             "update: waiting for the runs of the old version failed: %s",
                             cudaGetErrorString(ce));
#else
    (void)c;
    (void)s;
    (void)n;
    (void)overflow;
#endif
    return WB_OK;
}

/* Binds, updates the inactive buffer and folds there: nothing a run sees
 * changes. On failure the new bindings are freed by the caller. */
static int prepare(wb_container *c)
{
    wb_container_options o;
    wb_container_options_init(&o);
    o.tensors = c->caller;
    o.n_tensors = c->n_caller;
    o.copy_mutated = c->copy_mutated;
    int rc = wb__aoti_bind_constants(c, &o);
    if (rc != WB_OK)
        return rc;
    size_t n = 0;
    AOTInductorConstantMapEntry *pairs = wb__aoti_make_pairs(c, &n);
    if (!pairs)
        return wb__aoti_fail(c, WB_ENOMEM, "update: out of memory");
    if (c->f.update_user_managed(c->h, pairs, n, true, true) != 0)
        rc = wb__aoti_runtime_fail(c,
                                   "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs",
                                   "(inactive buffer, new version)");
    free(pairs);
    uint64_t folded_bytes = 0;
    if (rc == WB_OK && wb__aoti_count_folded(c, &folded_bytes)) {
        if (!c->f.fold)
            return wb__aoti_fail(c, WB_EFORMAT,
                                 "update: model %s has folded constants but its library does not "
                                 "export AOTInductorModelContainerRunConstantFolding",
                                 c->model_path);
        if (c->f.fold(c->h, true, (AOTInductorStreamHandle)c->stream, NULL) != 0)
            rc = wb__aoti_runtime_fail(c, "AOTInductorModelContainerRunConstantFolding",
                                       "(inactive buffer, new version)");
        /* Runs on other streams read the folded constants after the swap. */
        if (rc == WB_OK)
            rc = wb__aoti_sync_stream(c);
    }
    return rc;
}

static int update_locked(wb_container *c, wb_lease *const *nl, size_t n)
{
    double t0 = wb__clock_mono_s();
    size_t *slot = wb__calloc(n ? n : 1, sizeof *slot);
    if (!slot)
        return wb__aoti_fail(c, WB_ENOMEM, "update: out of memory");
    int rc = check_update(c, nl, n, slot);
    wb_lease **leases = NULL;
    if (rc == WB_OK && !(leases = wb__calloc(c->n_leases, sizeof *leases)))
        rc = wb__aoti_fail(c, WB_ENOMEM, "update: out of memory");
    /* Registered before anything reads them, as at creation. */
    size_t attached = 0;
    for (; rc == WB_OK && attached < n; attached++) {
        wb_err e;
        int a = wb__lease_attach(nl[attached], &c->rec, &e);
        if (a != WB_OK) {
            rc = wb__aoti_fail(c, a, "update: %s", e.msg);
            break;
        }
    }
    if (rc != WB_OK) {
        for (size_t k = 0; k < attached; k++)
            wb__lease_detach(nl[k], &c->rec);
        free(leases);
        free(slot);
        return rc;
    }
    memcpy(leases, c->leases, c->n_leases * sizeof *leases);
    for (size_t i = 0; i < n; i++)
        leases[slot[i]] = nl[i];
    bound old, neu;
    take(c, &old);
    rc = fresh(c, &old, leases, old.n_leases, &neu);
    if (rc == WB_OK) {
        put(c, &neu);
        rc = prepare(c);
        take(c, &neu); /* the binding may have grown counts */
    }
    uint32_t version = wb_lease_version(leases[0]);
    void *streams[WB_CONTAINER_STREAMS];
    size_t n_streams = 0;
    int overflow = 0;
    double wait0 = wb__clock_mono_s(), waited_ms = 0, in_use_at = 0;
    if (rc == WB_OK) {
        pthread_rwlock_wrlock(&c->run_lock);
        waited_ms = (wb__clock_mono_s() - wait0) * 1000.0;
        if (c->f.swap(c->h) != 0) {
            rc = wb__aoti_runtime_fail(c, "AOTInductorModelContainerSwapConstantBuffer", NULL);
        } else {
            c->version = version;
            /* No run is in flight now: the streams used so far are the
             * ones that may still read the old version. */
            pthread_mutex_lock(&c->streams_mu);
            n_streams = c->n_streams;
            memcpy(streams, c->streams, n_streams * sizeof *streams);
            overflow = c->streams_overflow;
            c->n_streams = 0;
            c->streams_overflow = 0;
            pthread_mutex_unlock(&c->streams_mu);
        }
        pthread_rwlock_unlock(&c->run_lock);
        in_use_at = wb__clock_wall();
    }
    if (rc != WB_OK) {
        /* Nothing a run sees changed: the old version stays. */
        neu.leases = NULL; /* `leases`, freed below */
        free_bound(c, &neu);
        put(c, &old);
        for (size_t k = 0; k < n; k++)
            wb__lease_detach(nl[k], &c->rec);
        free(leases);
        free(slot);
        return rc;
    }
    put(c, &neu);
    char q[600];
    int waited = wait_streams(c, streams, n_streams, overflow) == WB_OK;
    if (!waited)
        wb__cerror("container_swap_wait_failed", "model=%s error=\"%s\"",
                   wb__aoti_qpath(c, q, sizeof q), c->err.msg);
    if (waited && c->f.free_inactive && !wb__aoti_count_kept(c) && c->f.free_inactive(c->h) != 0)
        wb__cwarn("container_free_inactive_failed",
                  "model=%s note=\"the old version's folded "
                  "constants stay allocated\"",
                  wb__aoti_qpath(c, q, sizeof q));
    /* Nothing reads the old version now: its wrappers go, and the leases
     * it replaced are let go (unless waiting failed: then they stay
     * registered, and are let go at destroy). */
    wb__aoti_free_binding_array(c, old.bind, old.n_bind);
    for (size_t i = 0; i < n; i++) {
        wb_lease *gone = old.leases[slot[i]];
        if (waited) {
            wb__lease_detach(gone, &c->rec);
        } else {
            wb__cerror("container_old_version_held",
                       "model=%s lease=%.8s note=\"could not wait for the old version's runs; "
                       "its lease stays registered until the container is destroyed\"",
                       wb__aoti_qpath(c, q, sizeof q), gone->id_hex);
        }
    }
    if (!waited) {
        /* Kept registered until destroy, which lets them go. */
        wb_lease **held = wb__realloc(c->held, (c->n_held + n) * sizeof *held);
        if (held) {
            for (size_t i = 0; i < n; i++)
                held[c->n_held++] = old.leases[slot[i]];
            c->held = held;
        }
    }
    for (size_t i = 0; i < old.n_leases; i++)
        wb__lease_publish(leases[i], &c->rec, c->lease_bytes[i], c->lease_tensors[i]);
    free(old.leases);
    free(old.lease_bytes);
    free(old.lease_tensors);
    double ms = (wb__clock_mono_s() - t0) * 1000.0;
    atomic_fetch_add(&c->rec.swaps, 1);
    atomic_store(&c->rec.last_swap_us, (uint64_t)(ms * 1000.0));
    c->info.swaps++;
    c->info.last_swap_ms = ms;
    c->info.last_swap_at = wb__clock_wall();
    c->info.last_swap_in_use_at = in_use_at;
    c->info.last_swap_run_wait_ms = waited_ms;
    c->info.version = version;
    wb__cinfo("container_swapped", "model=%s version=%u swaps=%u ms=%.3f streams=%zu",
              wb__aoti_qpath(c, q, sizeof q), version, c->info.swaps, ms, n_streams);
    free(slot);
    return WB_OK;
}

WB_EXPORT int wb_container_update(wb_container *c, wb_lease *const *new_leases, size_t n)
{
    if (!c)
        return WB_EINVAL;
    if (!c->locks_ready)
        return wb__aoti_fail(c, WB_ESTATE, "update: the container was not created");
    pthread_mutex_lock(&c->update_mu);
    int rc = update_locked(c, new_leases, n);
    if (rc == WB_OK) {
        c->err.code = WB_OK;
        c->err.msg[0] = '\0';
        free(c->long_msg);
        c->long_msg = NULL;
    }
    pthread_mutex_unlock(&c->update_mu);
    return rc;
}
