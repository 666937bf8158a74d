/* libwbclient: the AOTI binding. Loads a model library with dlopen,
 * binds its C ABI with dlsym (see aoti_abi.h) and points the model's
 * constants at leased tensors without copying them. This file: the public
 * container API and the order of creation; see aoti_impl.h for the others. */
#include "aoti_impl.h"

#include "alloc.h"
#include "aoti_pkg.h"
#include "clock.h"
#include "log.h"
#include "safetensors.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static atomic_uint_fast64_t next_container_id = 1;

static int parse_device(wb_container *c, const char *dev, int any_device_tensor)
{
    if (!dev) {
        if (!any_device_tensor) {
            dev = "cpu";
        } else {
#ifdef WB_HAVE_CUDA
            int cur = 0;
            cudaError_t ce = cudaGetDevice(&cur);
            if (ce != cudaSuccess)
                return wb__aoti_fail(c, WB_ENOGPU,
                                     "model %s: the bound tensors are on a GPU but "
                                     "cudaGetDevice failed: %s",
                                     c->model_path, cudaGetErrorString(ce));
            snprintf(c->device_str, sizeof c->device_str, "cuda:%d", cur);
            dev = c->device_str;
#else
            return wb__aoti_fail(c, WB_ENOSYS,
                                 "model %s: the bound tensors are in GPU memory but this build of "
                                 "libwbclient has no CUDA support",
                                 c->model_path);
#endif
        }
    }
    if (dev != c->device_str)
        snprintf(c->device_str, sizeof c->device_str, "%s", dev);
    if (strcmp(dev, "cpu") == 0) {
        c->cuda = 0;
        c->device_index = 0;
    } else if (strcmp(dev, "cuda") == 0 || strncmp(dev, "cuda:", 5) == 0) {
        c->cuda = 1;
        if (dev[4] == ':') {
            char *end = NULL;
            long v = strtol(dev + 5, &end, 10);
            if (!end || *end || end == dev + 5 || v < 0 || v > 1024)
                return wb__aoti_fail(c, WB_EINVAL, "device '%s': expected cpu, cuda or cuda:N",
                                     dev);
            c->device_index = (int)v;
        } else {
#ifdef WB_HAVE_CUDA
            int cur = 0;
            if (cudaGetDevice(&cur) != cudaSuccess)
                cur = 0;
            c->device_index = cur;
#else
            c->device_index = 0;
#endif
        }
    } else {
        return wb__aoti_fail(c, WB_EINVAL, "device '%s': expected cpu, cuda or cuda:N", dev);
    }
    c->cuda_type_code = c->f.device_type_cuda ? c->f.device_type_cuda() : WB_AOTI_DEVICE_CUDA;
    c->cpu_type_code = c->f.device_type_cpu ? c->f.device_type_cpu() : WB_AOTI_DEVICE_CPU;
    c->dev_type_code = c->cuda ? c->cuda_type_code : c->cpu_type_code;
    return WB_OK;
}

static int check_args(wb_container *c, wb_lease *const *leases, size_t n_leases,
                      const char *model_path, const wb_container_options *o)
{
    if (!model_path || !model_path[0])
        return wb__aoti_fail(c, WB_EINVAL, "create container: no model path");
    if (n_leases && !leases)
        return wb__aoti_fail(c, WB_EINVAL, "create container: %zu leases but the array is NULL",
                             n_leases);
    for (size_t i = 0; i < n_leases; i++) {
        if (!leases[i])
            return wb__aoti_fail(c, WB_EINVAL, "create container: lease %zu is NULL", i);
        for (size_t k = 0; k < i; k++) {
            if (leases[k] == leases[i])
                return wb__aoti_fail(c, WB_EINVAL, "create container: lease %.8s is given twice",
                                     leases[i]->id_hex);
        }
    }
    if (o->n_tensors && !o->tensors)
        return wb__aoti_fail(c, WB_EINVAL,
                             "create container: %zu caller tensors but the array is NULL",
                             o->n_tensors);
    for (size_t i = 0; i < o->n_tensors; i++) {
        const wb_container_tensor *t = &o->tensors[i];
        if (!t->fqn || !t->fqn[0] || !t->data || (t->ndim && !t->shape))
            return wb__aoti_fail(
                c, WB_EINVAL, "create container: caller tensor %zu lacks a name, data or shape", i);
        if (wb__aoti_dtype_code(t->dtype) < 0 || wb__dtype_parse(t->dtype) < 0)
            return wb__aoti_fail(c, WB_EINVAL,
                                 "create container: caller tensor '%s' has dtype '%s'", t->fqn,
                                 t->dtype ? t->dtype : "(none)");
    }
    return WB_OK;
}

static int any_device_tensor(wb_lease *const *leases, size_t n_leases,
                             const wb_container_options *o)
{
    /* A lease's tensors are on its slabs' devices: asking the slabs makes
     * no entries (O(slabs), not O(tensors)). */
    for (size_t i = 0; i < n_leases; i++) {
        for (size_t k = 0; leases[i]->n_tensors && k < leases[i]->n_maps; k++) {
            if (wb__map_device(leases[i]->maps[k]) >= 0)
                return 1;
        }
    }
    for (size_t i = 0; i < o->n_tensors; i++) {
        if (o->tensors[i].device >= 0)
            return 1;
    }
    return 0;
}

/* The directory of the library: compiled kernels (.cubin) live beside it in
 * a package, and the runtime looks there when told. */
static int set_cubin_dir(wb_container *c)
{
    const char *slash = strrchr(c->so_path, '/');
    if (!slash)
        return WB_OK;
    c->cubin_dir = wb__strndup(c->so_path, (size_t)(slash - c->so_path));
    return c->cubin_dir ? WB_OK : wb__aoti_fail(c, WB_ENOMEM, "out of memory");
}

WB_EXPORT void wb_container_options_init(wb_container_options *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

/* Upstream's runner builds an OSSProxyExecutor (libtorch C++) when
 * <model>.json sits beside the library: the model calls custom or extern
 * ops through it. libwbclient has no libtorch to build one, and running such
 * a model without it would fail at the first such op, so it is refused. */
static int check_proxy_executor(wb_container *c)
{
    size_t n = strlen(c->so_path);
    if (n < 3 || strcmp(c->so_path + n - 3, ".so") != 0)
        return WB_OK;
    char json[PATH_MAX];
    snprintf(json, sizeof json, "%.*s.json", (int)(n - 3), c->so_path);
    struct stat st;
    if (stat(json, &st) != 0)
        return WB_OK;
    return wb__aoti_fail(
        c, WB_ENOSYS,
        "model %s calls custom or extern operators through a proxy executor (%s is "
        "beside its library); libwbclient cannot build torch's OSSProxyExecutor: "
        "compile the model without such operators",
        c->model_path, json);
}

static int create(wb_container *c, wb_lease *const *leases, size_t n_leases, const char *model_path,
                  const wb_container_options *o)
{
    double t0 = wb__clock_mono_s();
    int rc = check_args(c, leases, n_leases, model_path, o);
    if (rc != WB_OK)
        return rc;
    c->own_constants = o->own_constants != 0;
    if ((rc = wb__aoti_keep_options(c, o)))
        return rc;
    c->model_path = wb__strdup(model_path);
    c->leases = wb__calloc(n_leases ? n_leases : 1, sizeof *c->leases);
    c->lease_bytes = wb__calloc(n_leases ? n_leases : 1, sizeof *c->lease_bytes);
    c->lease_tensors = wb__calloc(n_leases ? n_leases : 1, sizeof *c->lease_tensors);
    if (!c->model_path || !c->leases || !c->lease_bytes || !c->lease_tensors)
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    c->n_leases = n_leases;
    for (size_t i = 0; i < n_leases; i++)
        c->leases[i] = leases[i];
    /* Registered before anything reads the leases, so that a release in
     * another thread meanwhile gets WB_EBUSY instead of freeing them. */
    for (size_t i = 0; i < n_leases; i++) {
        wb_err e;
        if ((rc = wb__lease_attach(leases[i], &c->rec, &e))) {
            for (size_t k = 0; k < i; k++)
                wb__lease_detach(leases[k], &c->rec);
            return wb__aoti_fail(c, rc, "%s", e.msg);
        }
    }
    c->attached = 1;

    if (o->torch_lib_dir && o->torch_lib_dir[0] &&
        (rc = wb__aoti_preload_torch(c, o->torch_lib_dir)))
        return rc;
    double t_lib = wb__clock_mono_s();
    if ((rc = wb__aoti_locate(model_path, o->work_dir, &c->so_path, &c->tmpdir, &c->err)))
        return rc;
    c->info.library_seconds = wb__clock_mono_s() - t_lib;
    if ((rc = set_cubin_dir(c)))
        return rc;
    if ((rc = check_proxy_executor(c)))
        return rc;
    struct stat st;
    const char *root = c->tmpdir                                           ? c->tmpdir
                       : stat(model_path, &st) == 0 && S_ISDIR(st.st_mode) ? model_path
                                                                           : NULL;
    if (!o->own_constants &&
        (rc = wb__aoti_rules_init(&c->rules, o->aliases, o->strip_prefix, o->prefix, o->mutated,
                                  o->constants_file, root, model_path, &c->err)))
        return rc;
    t_lib = wb__clock_mono_s();
    c->lib = dlopen(c->so_path, RTLD_NOW | RTLD_LOCAL);
    c->info.library_seconds += wb__clock_mono_s() - t_lib;
    if (!c->lib) {
        const char *e = dlerror();
        return wb__aoti_fail(
            c, WB_EIO, "cannot load model library %s: %s%s", c->so_path, e ? e : "unknown error",
            e && strstr(e, "libtorch")
                ? " (put torch's lib directory in LD_LIBRARY_PATH or set torch_lib_dir)"
                : "");
    }
    if ((rc = wb__aoti_bind_symbols(c)))
        return rc;
    if ((rc = parse_device(c, o->device, any_device_tensor(leases, n_leases, o))))
        return rc;
    if ((rc = wb__aoti_make_stream(c, o->stream)))
        return rc;
    /* Only effective before creation; harmless when nothing is loaded. */
    if (c->f.set_pinned_async) {
        if (c->f.set_pinned_async(true) != 0)
            return wb__aoti_runtime_fail(c, "AOTInductorSetUsePinnedAsyncConstantsCopy", NULL);
        c->rec.pinned_async_copy = 1;
    }
    size_t num_models = o->num_models ? o->num_models : 1;
    if (o->own_constants)
        rc = wb__aoti_create_own(c, num_models);
    else if (c->f.create_external)
        rc = wb__aoti_create_external(c, o, num_models);
    else
        rc = wb__aoti_create_with_device(c, o, num_models);
    if (rc == WB_OK)
        rc = wb__aoti_sync_stream(c);
    if (rc != WB_OK)
        return rc;

    c->info.folded_constants = wb__aoti_count_folded(c, &c->info.folded_bytes);
    if (c->f.num_inputs)
        c->f.num_inputs(c->h, &c->info.n_inputs);
    if (c->f.num_outputs)
        c->f.num_outputs(c->h, &c->info.n_outputs);
    c->rec.id = atomic_fetch_add(&next_container_id, 1);
    c->rec.folded_bytes = c->info.folded_bytes;
    c->rec.leased_constants = (uint32_t)c->info.leased_constants;
    c->rec.aliased_constants = (uint32_t)c->info.aliased_constants;
    c->rec.caller_constants = (uint32_t)c->info.caller_constants;
    c->rec.package_constants = (uint32_t)c->info.package_constants;
    c->rec.folded_constants = (uint32_t)c->info.folded_constants;
    c->rec.unbound_constants = (uint32_t)c->info.unbound_constants;
    c->rec.package_bytes = c->info.package_bytes;
    c->rec.embedded_bytes = c->info.embedded_bytes;
    c->rec.created_at = wb__clock_wall();
    c->rec.model_path = c->model_path;
    c->version = n_leases ? wb_lease_version(leases[0]) : 0;
    c->info.version = c->version;
    for (size_t i = 0; i < n_leases; i++)
        wb__lease_publish(leases[i], &c->rec, c->lease_bytes[i], c->lease_tensors[i]);

    c->info.aoti_api = c->rec.aoti_api;
    c->info.model_path = c->model_path;
    c->info.so_path = c->so_path;
    c->info.device = c->device_str;
    c->info.pinned_async_copy = c->rec.pinned_async_copy;
    c->info.n_constants = c->n_bind;
    c->info.created_at = c->rec.created_at;
    c->info.create_seconds = wb__clock_mono_s() - t0;
    char q[600];
    wb__cinfo("container_ready",
              "model=%s api=%s device=%s constants=%zu bound=%zu leased=%zu aliased=%zu "
              "caller=%zu package=%zu unbound=%zu bound_bytes=%llu package_bytes=%llu "
              "caller_bytes=%llu folded=%zu folded_bytes=%llu embedded_bytes=%llu "
              "pinned_async_copy=%d seconds=%.3f",
              wb__log_quote(q, sizeof q, c->model_path), c->rec.aoti_api, c->device_str, c->n_bind,
              c->info.bound_tensors, c->info.leased_constants, c->info.aliased_constants,
              c->info.caller_constants, c->info.package_constants, c->info.unbound_constants,
              (unsigned long long)c->info.bound_bytes, (unsigned long long)c->info.package_bytes,
              (unsigned long long)c->info.caller_bytes, c->info.folded_constants,
              (unsigned long long)c->info.folded_bytes, (unsigned long long)c->info.embedded_bytes,
              c->rec.pinned_async_copy, c->info.create_seconds);
    uint64_t shared = c->info.bound_bytes + c->info.caller_bytes;
    if (c->info.folded_bytes > 0 && (double)c->info.folded_bytes > FOLDED_WARN_RATIO * shared)
        wb__cwarn("container_folded_private",
                  "model=%s folded_bytes=%llu shared_bytes=%llu note=\"constants built by "
                  "constant folding are private to each container: every worker holds its own "
                  "copy\"",
                  q, (unsigned long long)c->info.folded_bytes, (unsigned long long)shared);
    return WB_OK;
}

WB_EXPORT int wb_container_create(wb_lease *const *leases, size_t n_leases, const char *model_path,
                                  const wb_container_options *opts, wb_container **out)
{
    if (!out)
        return WB_EINVAL;
    *out = NULL;
    wb_container_options defaults;
    wb_container_options_init(&defaults);
    wb_container *c = wb__calloc(1, sizeof *c);
    if (!c)
        return WB_ENOMEM;
    *out = c;
    int rc = wb__aoti_locks_init(c);
    if (rc == WB_OK)
        rc = create(c, leases, n_leases, model_path, opts ? opts : &defaults);
    if (rc == WB_OK) {
        c->err.code = WB_OK;
        c->err.msg[0] = '\0';
        free(c->long_msg);
        c->long_msg = NULL;
    } else if (c->attached) {
        /* A failed container holds no lease: they may be released at once. */
        for (size_t i = 0; i < c->n_leases; i++)
            wb__lease_detach(c->leases[i], &c->rec);
        c->attached = 0;
    }
    return rc;
}

WB_EXPORT int wb_container_run(wb_container *c, wb_aten_tensor *inputs, size_t n_in,
                               wb_aten_tensor *outputs, size_t n_out, void *stream)
{
    return wb_container_run_versioned(c, inputs, n_in, outputs, n_out, stream, NULL);
}

/* The run lock is held shared around the model's Run (see aoti_update.c):
 * the version read under it is the one the run uses. */
WB_EXPORT int wb_container_run_versioned(wb_container *c, wb_aten_tensor *inputs, size_t n_in,
                                         wb_aten_tensor *outputs, size_t n_out, void *stream,
                                         uint32_t *version)
{
    if (!c)
        return WB_EINVAL;
    if (!c->h)
        return wb__aoti_fail(c, WB_ESTATE, "run: the container was not created");
    if ((n_in && !inputs) || (n_out && !outputs))
        return wb__aoti_fail(c, WB_EINVAL, "run: NULL input or output array");
    if (c->info.n_inputs && n_in != c->info.n_inputs)
        return wb__aoti_fail(c, WB_EINVAL, "run: model %s takes %zu inputs, %zu given",
                             c->model_path, c->info.n_inputs, n_in);
    if (c->info.n_outputs && n_out != c->info.n_outputs)
        return wb__aoti_fail(c, WB_EINVAL, "run: model %s gives %zu outputs, room for %zu given",
                             c->model_path, c->info.n_outputs, n_out);
    void *s = stream ? stream : c->stream;
    pthread_rwlock_rdlock(&c->run_lock);
    if (version)
        *version = c->version;
    wb__aoti_note_stream(c, s);
    int rc = c->f.run(c->h, (AtenTensorHandle *)inputs, n_in, (AtenTensorHandle *)outputs, n_out,
                      (AOTInductorStreamHandle)s, NULL);
    pthread_rwlock_unlock(&c->run_lock);
    if (rc != 0)
        return wb__aoti_runtime_fail(c, "AOTInductorModelContainerRun", NULL);
    return WB_OK;
}

WB_EXPORT void wb_container_destroy(wb_container **cp)
{
    if (!cp || !*cp)
        return;
    wb_container *c = *cp;
    *cp = NULL;
    /* The follower goes first: it may be swapping. */
    wb__aoti_follow_stop(c);
    if (c->h && c->f.del)
        c->f.del(c->h);
    c->h = NULL;
    /* Our wrappers go after the container that pointed at them. */
    wb__aoti_free_bindings(c);
    if (c->attached) {
        for (size_t i = 0; i < c->n_leases; i++)
            wb__lease_detach(c->leases[i], &c->rec);
    }
    for (size_t i = 0; i < c->n_held; i++)
        wb__lease_detach(c->held[i], &c->rec);
    /* A container that followed owns its leases. */
    for (size_t i = 0; c->owns_leases && i < c->n_leases; i++)
        wb_lease_release(&c->leases[i]);
    for (size_t i = 0; c->owns_leases && i < c->n_held; i++)
        wb_lease_release(&c->held[i]);
    free(c->held);
#ifdef WB_HAVE_CUDA
    if (c->own_stream && c->stream)
        cudaStreamDestroy((cudaStream_t)c->stream);
#endif
    if (c->lib)
        dlclose(c->lib);
    if (c->tmpdir)
        wb__aoti_rmtree(c->tmpdir);
    wb__aoti_rules_free(&c->rules);
    free(c->tmpdir);
    free(c->so_path);
    free(c->cubin_dir);
    free(c->model_path);
    free(c->leases);
    free(c->lease_bytes);
    free(c->lease_tensors);
    free(c->long_msg);
    for (size_t i = 0; i < c->n_caller; i++) {
        free((char *)c->caller[i].fqn);
        free((char *)c->caller[i].dtype);
        free((uint64_t *)c->caller[i].shape);
    }
    free(c->caller);
    wb__aoti_locks_free(c);
    free(c);
}

WB_EXPORT const char *wb_container_errmsg(const wb_container *c)
{
    if (!c)
        return "no container (out of memory, or NULL was passed)";
    return c->long_msg ? c->long_msg : c->err.msg;
}

WB_EXPORT void *wb_container_stream(const wb_container *c)
{
    return c && c->cuda ? c->stream : NULL;
}

WB_EXPORT int wb_container_get_info(const wb_container *c, wb_container_info *out)
{
    if (!c || !out)
        return WB_EINVAL;
    /* The lock is part of the container's state, not of its value. */
    wb_container *m = (wb_container *)c;
    if (m->locks_ready)
        pthread_mutex_lock(&m->update_mu);
    *out = c->info;
    if (m->locks_ready)
        pthread_mutex_unlock(&m->update_mu);
    return WB_OK;
}
