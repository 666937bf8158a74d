/* libwbclient: a lease's tensors by index and by name. Nothing here talks
 * to the broker or takes the client's lock (client_impl.h, "Locks"): a
 * lookup runs while another thread waits on the broker, and a miss keeps
 * its message under the client's message lock only. */
#include "lease.h"

#include "client_impl.h"
#include "names.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
    return wb__client_fail(lease->client, WB_ENOMEM,
                           "lease %.8s (model '%s'): out of memory making its %zu tensor entries",
                           lease->id_hex, lease->model, lease->n_tensors);
}

WB_EXPORT int wb_lease_tensor(const wb_lease *lease, size_t index, wb_tensor_view *out)
{
    if (!lease || !out)
        return WB_EINVAL;
    if (index >= lease->n_tensors)
        return wb__client_fail(lease->client, WB_EINVAL,
                               "lease %.8s (model '%s'): tensor index %zu out of range (%zu "
                               "tensors)",
                               lease->id_hex, lease->model, index, lease->n_tensors);
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
    return wb__client_fail(lease->client, WB_ENOTFOUND, "lease %.8s (model '%s'): no tensor '%s'",
                           lease->id_hex, lease->model, name);
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
    return wb__client_fail(lease->client, WB_ENOTFOUND,
                           "lease %.8s (model '%s'): no tensor '%s' (names[%zu]; %zu of %zu names "
                           "not found)",
                           lease->id_hex, lease->model, names[first_missing], first_missing,
                           missing, n);
}
