/* Binding every constant of a container: each to a leased tensor by the
 * rules of aoti_rules.h, to a private copy, or to the package's constants
 * file, refusing what would break a shared slab. */
#include "alloc.h"
#include "aoti_impl.h"

#include "log.h"
#include "names.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Reads the model's constant table. */
int wb__aoti_read_constants(wb_container *c)
{
    size_t n = 0;
    if (c->f.num_constants(c->h, &n) != 0)
        return wb__aoti_runtime_fail(c, "AOTInductorModelContainerGetNumConstants", NULL);
    c->bind = wb__calloc(n ? n : 1, sizeof *c->bind);
    if (!c->bind)
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    c->n_bind = n;
    for (size_t i = 0; i < n; i++) {
        binding *b = &c->bind[i];
        const char *name = NULL, *fqn = NULL;
        bool folded = false;
        b->lease = b->caller = -1;
        if (c->f.constant_name(c->h, i, &name) != 0 || !name)
            return wb__aoti_runtime_fail(c, "AOTInductorModelContainerGetConstantName", NULL);
        if (c->f.constant_fqn(c->h, i, &fqn) != 0)
            return wb__aoti_runtime_fail(c, "AOTInductorModelContainerGetConstantOriginalFQN",
                                         name);
        if (c->f.constant_dtype(c->h, i, &b->dtype) != 0)
            return wb__aoti_runtime_fail(c, "AOTInductorModelContainerGetConstantDtype", name);
        if (c->f.constant_size(c->h, i, &b->size) != 0)
            return wb__aoti_runtime_fail(c, "AOTInductorModelContainerGetConstantDataSize", name);
        if (c->f.constant_from_folded && c->f.constant_from_folded(c->h, i, &folded) != 0)
            return wb__aoti_runtime_fail(c, "AOTInductorModelContainerGetConstantFromFolded", name);
        b->folded = folded;
        b->type = folded ? 4 : 1;
        if (c->f.constant_type && c->f.constant_type(c->h, i, &b->type) != 0)
            return wb__aoti_runtime_fail(c, "AOTInductorModelContainerGetConstantType", name);
        b->name = wb__strdup(name);
        b->fqn = wb__strdup(fqn && fqn[0] ? fqn : name);
        if (!b->name || !b->fqn)
            return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    }
    return WB_OK;
}

void wb__aoti_lease_names(const wb_container *c, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < c->n_leases && used + 1 < size; i++) {
        int w = snprintf(buf + used, size - used, "%s'%s'", i ? ", " : "", c->leases[i]->model);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/* Where a constant's tensor was found. */
typedef struct source {
    int kind;
    const char *dtype;
    const void *data;
    uint32_t ndim;
    const uint64_t *shape;
    int device;
    uint64_t nbytes;
    char where[200];
} source;

static uint64_t elem_bytes(const char *dtype, uint32_t ndim, const uint64_t *shape)
{
    int code = wb__dtype_parse(dtype);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < ndim; d++)
        elems *= shape[d];
    return code >= 0 ? elems * wb__dtype_bits((wb_dtype)code) / 8 : 0;
}

/* A caller tensor or a leased tensor named `name`; 1 when found. A name in
 * two leases is an error (returned through *rc). */
static int find_named(wb_container *c, const wb_container_options *o, const char *name, binding *b,
                      source *s, int *rc)
{
    for (size_t k = 0; k < o->n_tensors; k++) {
        const wb_container_tensor *t = &o->tensors[k];
        if (t->fqn && strcmp(t->fqn, name) == 0) {
            b->caller = (int)k;
            *s = (source){.kind = WB_BIND_CALLER,
                          .dtype = t->dtype,
                          .data = t->data,
                          .ndim = t->ndim,
                          .shape = t->shape,
                          .device = t->device,
                          .nbytes = elem_bytes(t->dtype, t->ndim, t->shape)};
            snprintf(s->where, sizeof s->where, "caller tensor %zu ('%s')", k, name);
            return 1;
        }
    }
    int found = 0;
    for (size_t k = 0; k < c->n_leases; k++) {
        const wb__tensor_entry *t = wb__lease_lookup(c->leases[k], name);
        if (!t)
            continue;
        if (b->lease >= 0) {
            *rc = wb__aoti_fail(
                c, WB_EINVAL,
                "constant '%s' (checkpoint name '%s') is in lease %.8s (model '%s') and in "
                "lease %.8s (model '%s'); bind it from one only",
                b->fqn, name, c->leases[b->lease]->id_hex, c->leases[b->lease]->model,
                c->leases[k]->id_hex, c->leases[k]->model);
            return 0;
        }
        b->lease = (int)k;
        *s = (source){.kind = WB_BIND_LEASED,
                      .dtype = t->dtype,
                      .data = wb__entry_data(c->leases[k], t),
                      .ndim = t->ndim,
                      .shape = t->shape,
                      .device = wb__entry_device(c->leases[k], t),
                      .nbytes = t->nbytes};
        snprintf(s->where, sizeof s->where, "lease %.8s (model '%s', tensor '%s')",
                 c->leases[k]->id_hex, c->leases[k]->model, name);
        found = 1;
    }
    return found;
}

/* Copies a tensor of the constants file to where the model runs: private
 * to this container, freed with it. */
static int load_private(wb_container *c, binding *b, const wb_st_tensor *t, source *s)
{
    void *host = NULL;
    int rc = wb__aoti_extra_read(&c->rules, t, &host, &c->err);
    if (rc != WB_OK)
        return rc;
    b->private_host = host;
    void *data = host;
#ifdef WB_HAVE_CUDA
    if (c->cuda && t->nbytes) {
        cudaError_t ce = cudaMalloc(&b->private_dev, t->nbytes);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync(b->private_dev, host, t->nbytes, cudaMemcpyHostToDevice,
                                 (cudaStream_t)c->stream);
        if (ce == cudaSuccess)
            ce = cudaStreamSynchronize((cudaStream_t)c->stream);
        if (ce != cudaSuccess)
            return wb__aoti_fail(c, WB_ENOGPU, "constant '%s' from %s: cannot copy it to %s: %s",
                                 b->fqn, c->rules.extra_path, c->device_str,
                                 cudaGetErrorString(ce));
        data = b->private_dev;
    }
#endif
    *s = (source){.kind = WB_BIND_PACKAGE,
                  .dtype = wb__dtype_name(t->dtype),
                  .data = data,
                  .ndim = t->ndim,
                  .shape = t->shape,
                  .device = c->cuda ? c->device_index : -1,
                  .nbytes = t->nbytes};
    snprintf(s->where, sizeof s->where, "constants file %s (tensor '%s')", c->rules.extra_path,
             t->name);
    return WB_OK;
}

int wb__aoti_size_fits(uint64_t size, uint64_t nbytes)
{
    return size == nbytes || (nbytes < size && size == ((nbytes + 63) & ~(uint64_t)63));
}

/* 1 when an earlier constant wraps the same leased memory (tied weights). */
static int lease_tensor_seen(const wb_container *c, const binding *b)
{
    for (const binding *p = c->bind; p < b; p++) {
        if (p->handle && p->lease == b->lease && p->data == b->data)
            return 1;
    }
    return 0;
}

/* How the lease that holds a bound tensor maps it, for messages. */
static const char *lease_mapping(const wb_lease *l, int *readonly)
{
    *readonly = 1;
    const char *t = "host";
    for (size_t i = 0; i < l->n_maps; i++) {
        if (!wb__map_readonly(l->maps[i]))
            *readonly = 0;
        t = wb__map_transport(l->maps[i]);
    }
    return t;
}

/* A constant the compiled graph writes must not be bound to shared memory:
 * refused naming it, or (copy_mutated) bound to a private copy of the
 * leased tensor, made here. */
static int guard_mutated(wb_container *c, const wb_container_options *o, binding *b, source *s,
                         const char *mapped)
{
    if (s->kind != WB_BIND_LEASED && s->kind != WB_BIND_ALIASED)
        return WB_OK;
    if (!wb__aoti_is_mutated(&c->rules, b->fqn) && !wb__aoti_is_mutated(&c->rules, mapped))
        return WB_OK;
    const wb_lease *l = c->leases[b->lease];
    int ro = 1;
    const char *transport = lease_mapping(l, &ro);
    if (!o->copy_mutated)
        return wb__aoti_fail(
            c, WB_EPERM,
            "constant '%s' is written by the compiled graph (listed as mutated%s%s) but would be "
            "bound to %s, shared through a %s mapping (%s): a write would %s; bind a caller "
            "tensor of that name, or ask for a private copy (copy_mutated, wb-aoti-worker "
            "--copy-mutated)",
            b->fqn, c->rules.extra_path ? " in " : "",
            c->rules.extra_path ? c->rules.extra_path : "", s->where, ro ? "read-only" : "writable",
            transport,
            ro ? "fault in this worker" : "change the weights of every worker of the lease");
    size_t n = s->nbytes;
    void *copy = NULL;
    if (s->device >= 0) {
#ifdef WB_HAVE_CUDA
        cudaError_t ce = cudaMalloc(&b->private_dev, n ? n : 1);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync(b->private_dev, s->data, n, cudaMemcpyDeviceToDevice,
                                 (cudaStream_t)c->stream);
        if (ce == cudaSuccess)
            ce = cudaStreamSynchronize((cudaStream_t)c->stream);
        if (ce != cudaSuccess)
            return wb__aoti_fail(c, WB_ENOGPU, "constant '%s' from %s: cannot copy it: %s", b->fqn,
                                 s->where, cudaGetErrorString(ce));
        copy = b->private_dev;
#else
        return wb__aoti_fail(c, WB_ENOSYS, "constant '%s': no CUDA in this build to copy %s",
                             b->fqn, s->where);
#endif
    } else {
        if (!(b->private_host = wb__malloc(n ? n : 1)))
            return wb__aoti_fail(c, WB_ENOMEM, "out of memory copying constant '%s'", b->fqn);
        memcpy(b->private_host, s->data, n);
        copy = b->private_host;
    }
    char q[600];
    wb__cwarn("container_constant_copied",
              "model=%s constant=%s bytes=%zu note=\"written by the compiled graph: bound to a "
              "private copy, not to the lease\"",
              wb__aoti_qpath(c, q, sizeof q), b->fqn, n);
    s->data = copy;
    s->kind = WB_BIND_PACKAGE;
    b->lease = -1;
    return WB_OK;
}

/* The checkpoint name of constant b by the prefix rules (strip_prefix
 * removed when the FQN starts with it, then prefix added), or NULL when too
 * long. */
static const char *mapped_name(const wb_container *c, const binding *b, char *buf, size_t size)
{
    return wb__aoti_map_name(&c->rules, b->fqn, buf, size);
}

/* Which constant each alias names (binding.alias). An alias NAME=TARGET
 * names the constant whose model name (FQN) is NAME; failing that, the
 * constant whose checkpoint name (after the prefix rules) is NAME. A
 * checkpoint name that two constants share is refused: neither reading
 * would be sure. A later alias of the same constant wins. */
static int resolve_alias_names(wb_container *c)
{
    for (size_t i = 0; i < c->n_bind; i++)
        c->bind[i].alias = -1;
    if (!c->rules.n_aliases)
        return WB_OK;
    wb__names_hash *idx =
        wb__names_hash_new(c->bind, c->n_bind, sizeof *c->bind, offsetof(binding, fqn));
    int rc = WB_OK;
    for (size_t k = 0; rc == WB_OK && k < c->rules.n_aliases; k++) {
        const wb__alias *a = &c->rules.aliases[k];
        binding *b = idx ? (binding *)wb__names_hash_find(idx, c->bind, sizeof *c->bind,
                                                          offsetof(binding, fqn), a->name)
                         : (binding *)wb__names_find(c->bind, c->n_bind, sizeof *c->bind,
                                                     offsetof(binding, fqn), NULL, a->name);
        if (b && !b->folded) {
            b->alias = (int)k;
            continue;
        }
        binding *first = NULL, *second = NULL;
        for (size_t i = 0; i < c->n_bind && !second; i++) {
            char buf[512];
            const char *m = c->bind[i].folded ? NULL : mapped_name(c, &c->bind[i], buf, sizeof buf);
            if (m && strcmp(m, a->name) == 0) {
                if (first)
                    second = &c->bind[i];
                else
                    first = &c->bind[i];
            }
        }
        if (second) {
            char rules[600];
            wb__aoti_rules_text(c->rules.strip_prefix, c->rules.prefix, rules, sizeof rules);
            rc = wb__aoti_fail(c, WB_EINVAL,
                               "alias '%s=%s'%s%s: '%s' is the checkpoint name (after the prefix "
                               "rules%s) of constants '%s' and '%s', and the model name of none: "
                               "name the constant by its model name (FQN)",
                               a->name, a->target, a->from_file ? " of the constants file " : "",
                               a->from_file ? c->rules.extra_path : "", a->name, rules, first->fqn,
                               second->fqn);
        } else if (first) {
            first->alias = (int)k;
        }
    }
    free(idx);
    return rc;
}

/* The tensor an alias's TARGET names: a caller tensor of that name (caller
 * tensors are named by FQN and come first, as for any constant); else a
 * leased tensor of that checkpoint name, or, read as a model name, the
 * leased tensor its checkpoint name (after the prefix rules) names. When
 * both readings find a tensor and they differ, the alias is refused. */
static int find_alias_target(wb_container *c, const wb_container_options *o, binding *b,
                             const wb__alias *a, source *s, int *rc)
{
    binding tx = *b, ty = *b;
    source sx = {0}, sy = {0};
    tx.lease = tx.caller = ty.lease = ty.caller = -1;
    int fx = find_named(c, o, a->target, &tx, &sx, rc);
    if (*rc != WB_OK)
        return 0;
    char buf[512];
    const char *mt = wb__aoti_map_name(&c->rules, a->target, buf, sizeof buf);
    int fy = 0;
    if ((!fx || sx.kind != WB_BIND_CALLER) && mt && strcmp(mt, a->target) != 0) {
        fy = find_named(c, o, mt, &ty, &sy, rc);
        if (*rc != WB_OK)
            return 0;
    }
    if (fx && fy && (sx.data != sy.data || tx.lease != ty.lease)) {
        char rules[600];
        wb__aoti_rules_text(c->rules.strip_prefix, c->rules.prefix, rules, sizeof rules);
        *rc = wb__aoti_fail(c, WB_EINVAL,
                            "alias '%s=%s': the target '%s' reads two ways: as a checkpoint name "
                            "it is %s, and as a model name it becomes '%s' (prefix rules%s), "
                            "which is %s; name the tensor you mean by a name that reads one way",
                            a->name, a->target, a->target, sx.where, mt, rules, sy.where);
        return 0;
    }
    if (fy && !fx) {
        *s = sy;
        b->lease = ty.lease;
        b->caller = ty.caller;
        return 1;
    }
    if (fx) {
        *s = sx;
        b->lease = tx.lease;
        b->caller = tx.caller;
    }
    return fx;
}

/* Finds, checks and wraps the tensor of every constant that is not folded.
 * Order: a caller tensor of the FQN; a leased tensor of the mapped name
 * (prefix rules); the alias target (tied weights); the package's constants
 * file. A constant found nowhere keeps the data the library loaded for it
 * when it has some and it is a buffer, a tensor constant or an empty
 * parameter (upstream's full update requires every other parameter);
 * otherwise the creation fails naming every such constant. */
int wb__aoti_bind_constants(wb_container *c, const wb_container_options *o)
{
    int rc = resolve_alias_names(c);
    if (rc != WB_OK)
        return rc;
    size_t *missing = NULL, n_missing = 0;
    for (size_t i = 0; i < c->n_bind; i++) {
        binding *b = &c->bind[i];
        if (b->folded)
            continue;
        char mapped[512], q[600];
        const char *name = mapped_name(c, b, mapped, sizeof mapped);
        if (!name) {
            free(missing);
            return wb__aoti_fail(c, WB_ELIMIT, "constant '%s': the mapped name is too long",
                                 b->fqn);
        }
        source s = {0};
        int found = find_named(c, o, b->fqn, b, &s, &rc);
        if (!found && rc == WB_OK && strcmp(name, b->fqn) != 0)
            found = find_named(c, o, name, b, &s, &rc);
        if (!found && rc == WB_OK && b->alias >= 0 &&
            (found = find_alias_target(c, o, b, &c->rules.aliases[b->alias], &s, &rc)))
            s.kind = WB_BIND_ALIASED;
        const wb_st_tensor *et = NULL;
        if (!found && rc == WB_OK && (et = wb__aoti_extra_find(&c->rules, b->fqn, name))) {
            if ((rc = load_private(c, b, et, &s)) == WB_OK)
                found = 1;
        }
        if (rc != WB_OK) {
            free(missing);
            return rc;
        }
        if (!found) {
            if ((b->type != 1 || b->size == 0) && b->own) {
                b->kept = 1;
                c->info.unbound_constants++;
                wb__cwarn("container_constant_unbound",
                          "model=%s constant=%s type=\"%s\" note=\"in no lease, caller tensor or "
                          "constants file; keeps the data the model library loaded for it\"",
                          wb__aoti_qpath(c, q, sizeof q), b->fqn, wb__aoti_type_name(b->type));
                continue;
            }
            if (!missing && !(missing = wb__malloc(c->n_bind * sizeof *missing)))
                return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
            missing[n_missing++] = i;
            continue;
        }
        if (n_missing)
            continue; /* failing anyway: only the missing ones matter now */
        b->kind = s.kind;
        int32_t code = wb__aoti_dtype_code(s.dtype);
        if (code != b->dtype)
            return wb__aoti_fail(
                c, WB_EINVAL, "constant '%s': the model expects dtype %s (code %d) but %s has %s",
                b->fqn, wb__aoti_dtype_name(b->dtype), (int)b->dtype, s.where, s.dtype);
        if (!wb__aoti_size_fits(b->size, s.nbytes))
            return wb__aoti_fail(
                c, WB_EINVAL,
                "constant '%s': the model's storage is %zu bytes but %s has %llu bytes "
                "(a contiguous tensor of %llu bytes was expected; a view into a larger "
                "storage cannot be bound to a checkpoint tensor)",
                b->fqn, b->size, s.where, (unsigned long long)s.nbytes,
                (unsigned long long)s.nbytes);
        if (s.ndim > 64)
            return wb__aoti_fail(c, WB_EINVAL, "constant '%s': %u dimensions", b->fqn, s.ndim);
        if ((rc = guard_mutated(c, o, b, &s, name)) != WB_OK)
            return rc;
        b->kind = s.kind;
        int64_t sizes[64], strides[64];
        int64_t stride = 1;
        for (uint32_t d = s.ndim; d-- > 0;) {
            sizes[d] = (int64_t)s.shape[d];
            strides[d] = stride;
            stride *= sizes[d] ? sizes[d] : 1;
        }
        /* Each tensor keeps its own device: upstream checks every constant
         * against its own device type, so a model may mix them. The model
         * does not write its constants unless listed as mutated (guard_mutated);
         * host and cuda-vmm leases are mapped read-only, so an unlisted write
         * faults rather than corrupting the shared copy. */
        int32_t dev_type = s.device >= 0 ? c->cuda_type_code : c->cpu_type_code;
        b->data = s.data;
        if (c->f.from_blob((void *)s.data, (int64_t)s.ndim, sizes, strides, 0, b->dtype, dev_type,
                           s.device >= 0 ? s.device : 0, &b->handle) != 0)
            return wb__aoti_runtime_fail(c, "aoti_torch_create_tensor_from_blob", b->fqn);
        c->info.bound_tensors++;
        switch (s.kind) {
        case WB_BIND_LEASED:
        case WB_BIND_ALIASED:
            if (s.kind == WB_BIND_LEASED)
                c->info.leased_constants++;
            else
                c->info.aliased_constants++;
            /* A tensor bound twice (tied weights) is shared memory counted once. */
            if (!lease_tensor_seen(c, b)) {
                c->info.bound_bytes += s.nbytes;
                c->lease_bytes[b->lease] += s.nbytes;
                c->lease_tensors[b->lease]++;
            }
            break;
        case WB_BIND_CALLER:
            c->info.caller_constants++;
            c->info.caller_bytes += s.nbytes;
            break;
        case WB_BIND_PACKAGE:
            c->info.package_constants++;
            c->info.package_bytes += s.nbytes;
            break;
        }
    }
    if (n_missing) {
        rc = wb__aoti_report_missing(c, missing, n_missing);
        free(missing);
        return rc;
    }
    return WB_OK;
}

size_t wb__aoti_count_kept(const wb_container *c)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_bind; i++)
        n += (size_t)c->bind[i].kept;
    return n;
}

/* The (name, handle) pairs of the bound constants. */
AOTInductorConstantMapEntry *wb__aoti_make_pairs(wb_container *c, size_t *n)
{
    AOTInductorConstantMapEntry *p = wb__calloc(c->n_bind ? c->n_bind : 1, sizeof *p);
    *n = 0;
    if (!p)
        return NULL;
    for (size_t i = 0; i < c->n_bind; i++) {
        if (c->bind[i].handle) {
            p[*n].name = c->bind[i].name;
            p[*n].handle = c->bind[i].handle;
            (*n)++;
        }
    }
    return p;
}

void wb__aoti_free_binding_array(const wb_container *c, binding *bind, size_t n)
{
    for (size_t i = 0; bind && i < n; i++) {
        if (bind[i].handle && c->f.delete_tensor)
            c->f.delete_tensor(bind[i].handle);
        free(bind[i].private_host);
#ifdef WB_HAVE_CUDA
        if (bind[i].private_dev)
            cudaFree(bind[i].private_dev);
#endif
        free(bind[i].name);
        free(bind[i].fqn);
    }
    free(bind);
}

void wb__aoti_free_bindings(wb_container *c)
{
    wb__aoti_free_binding_array(c, c->bind, c->n_bind);
    c->bind = NULL;
    c->n_bind = 0;
}
