/* libwbclient: the AOTInductor binding. Loads a model library with dlopen,
 * binds its C ABI with dlsym (see aoti_abi.h) and points the model's
 * constants at leased tensors without copying them. */
#include "wb/container.h"

#include "aoti_abi.h"
#include "aoti_bind.h"
#include "aoti_pkg.h"
#include "client_impl.h"
#include "log.h"
#include "safetensors.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define API_EXTERNAL "CreateWithExternalConstants"
#define API_DEVICE   "CreateWithDevice+UpdateUserManagedConstantBufferPairs"
#define API_OWN      "CreateWithDevice"
/* Folded constants above this share of the shared bytes earn a warning. */
#define FOLDED_WARN_RATIO 0.10
/* Without AOTInductorModelContainerDidCallLoadConstants, a CreateWithDevice
 * that allocated at least this share of the constants' bytes loaded its own
 * copy. Only judged for constants of at least EMBEDDED_MIN_BYTES: below that
 * other allocations (kernels, workspaces) could be mistaken for a copy, and
 * a small copy left in place costs little. */
#define EMBEDDED_RATIO     0.5
#define EMBEDDED_MIN_BYTES (16ull << 20)

/* Everything looked up in the model library. Required entries are checked
 * once after the lookup; optional ones may be NULL. */
typedef struct aoti_fns {
    aoti_create_with_device_fn create_with_device;
    aoti_create_with_external_constants_fn create_external; /* torch >= 2.14 */
    aoti_delete_fn del;
    aoti_run_fn run;
    aoti_get_count_fn num_constants;
    aoti_get_str_fn constant_name;
    aoti_get_str_fn constant_fqn;
    aoti_get_i32_fn constant_dtype;
    aoti_get_size_fn constant_size;
    aoti_get_bool_fn constant_from_folded; /* optional: none folded */
    aoti_get_i32_fn constant_type;         /* optional: every constant a parameter */
    aoti_update_pairs_fn update_user_managed;
    aoti_fold_fn fold;                 /* optional unless a constant is folded */
    aoti_container_fn swap;            /* optional: embedded constants stay */
    aoti_container_fn free_inactive;   /* optional, idem */
    aoti_container_bool_fn did_load;   /* optional: embedded detection */
    aoti_set_bool_fn set_pinned_async; /* optional, torch >= 2.14 */
    aoti_get_count_fn num_inputs;      /* optional */
    aoti_get_count_fn num_outputs;     /* optional */
    aoti_last_error_fn last_error;     /* optional */
    aoti_from_blob_fn from_blob;
    aoti_tensor_fn delete_tensor;
    aoti_data_ptr_fn data_ptr;
    aoti_get_i64_fn get_dim;         /* optional (describe) */
    aoti_get_i64p_fn get_sizes;      /* optional (describe) */
    aoti_get_t_i32_fn get_dtype;     /* optional (describe) */
    aoti_get_t_i32_fn get_dev_type;  /* optional (describe) */
    aoti_get_t_i32_fn get_dev_index; /* optional (describe) */
    aoti_code_fn device_type_cpu;    /* optional */
    aoti_code_fn device_type_cuda;   /* optional */
} aoti_fns;

/* How a constant was bound. */
enum { WB_BIND_NONE, WB_BIND_LEASED, WB_BIND_ALIASED, WB_BIND_CALLER, WB_BIND_PACKAGE };

/* One constant of the model and what it is bound to. */
typedef struct binding {
    char *name; /* container's internal name (copied: the first container of
                 * the external-constants path is deleted) */
    char *fqn;
    int32_t dtype;
    size_t size;
    int folded;
    int32_t type; /* upstream ConstantType: 1 parameter, 2 buffer, 3 tensor constant, 4 folded */
    int kind;     /* WB_BIND_* */
    AtenTensorHandle handle; /* our wrapper, deleted after the container */
    const void *data;        /* what the handle wraps */
    void *private_host;      /* constants-file data, owned */
    void *private_dev;       /* its device copy, owned */
    int lease;               /* index into leases, or -1 */
    int caller;              /* index into caller tensors, or -1 */
} binding;

struct wb_container {
    wb_err err;
    char *model_path;
    char *so_path;
    char *tmpdir;
    char *cubin_dir;
    char device_str[32];
    int cuda;
    int device_index;
    int32_t dev_type_code;
    int32_t cuda_type_code, cpu_type_code;
    wb__aoti_rules rules;
    void *lib;
    aoti_fns f;
    AOTInductorModelContainerHandle h;
    void *stream;
    int own_stream;
    size_t n_bind;
    binding *bind;
    size_t n_leases;
    wb_lease **leases;
    uint64_t *lease_bytes;
    uint32_t *lease_tensors;
    int attached;
    wb__container_rec rec;
    wb_container_info info;
};

static atomic_uint_fast64_t next_container_id = 1;

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The model path as a log value (quoted when it has spaces). */
static const char *qpath(const wb_container *c, char *buf, size_t size)
{
    return wb__log_quote(buf, size, c->model_path ? c->model_path : "");
}

__attribute__((format(printf, 3, 4))) static int fail(wb_container *c, int code, const char *fmt,
                                                      ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err.msg, sizeof c->err.msg, fmt, ap);
    va_end(ap);
    c->err.code = code;
    return code;
}

/* A failed runtime call: names the entry point and adds the runtime's own
 * message when the library can give it (AOTInductorGetLastError); otherwise
 * the runtime has printed it on stderr. */
static int runtime_fail(wb_container *c, const char *what, const char *ctx)
{
    const char *msg = NULL;
    if (c->f.last_error && c->f.last_error(&msg) != 0)
        msg = NULL;
    return fail(c, WB_EINTERNAL, "model %s: %s failed%s%s%s%s", c->model_path, what,
                ctx && ctx[0] ? " " : "", ctx ? ctx : "",
                msg && msg[0] ? ": " : " (the model runtime's message is on stderr)",
                msg && msg[0] ? msg : "");
}

/* safetensors dtype name -> c10::ScalarType code; -1 when torch has none. */
static int32_t dtype_code(const char *name)
{
    static const struct {
        const char *name;
        int32_t code;
    } map[] = {
        {"BOOL", WB_AOTI_DTYPE_BOOL},
        {"U8", WB_AOTI_DTYPE_U8},
        {"I8", WB_AOTI_DTYPE_I8},
        {"I16", WB_AOTI_DTYPE_I16},
        {"I32", WB_AOTI_DTYPE_I32},
        {"I64", WB_AOTI_DTYPE_I64},
        {"F16", WB_AOTI_DTYPE_F16},
        {"F32", WB_AOTI_DTYPE_F32},
        {"F64", WB_AOTI_DTYPE_F64},
        {"C64", WB_AOTI_DTYPE_C64},
        {"BF16", WB_AOTI_DTYPE_BF16},
        {"F8_E5M2", WB_AOTI_DTYPE_F8_E5M2},
        {"F8_E4M3", WB_AOTI_DTYPE_F8_E4M3FN},
        {"U16", WB_AOTI_DTYPE_U16},
        {"U32", WB_AOTI_DTYPE_U32},
        {"U64", WB_AOTI_DTYPE_U64},
        {"F8_E8M0", WB_AOTI_DTYPE_F8_E8M0FNU},
    };
    for (size_t i = 0; name && i < sizeof map / sizeof map[0]; i++) {
        if (strcmp(map[i].name, name) == 0)
            return map[i].code;
    }
    return -1;
}

static const char *dtype_name(int32_t code)
{
    static const char *names[] = {
        [WB_AOTI_DTYPE_U8] = "U8",
        [WB_AOTI_DTYPE_I8] = "I8",
        [WB_AOTI_DTYPE_I16] = "I16",
        [WB_AOTI_DTYPE_I32] = "I32",
        [WB_AOTI_DTYPE_I64] = "I64",
        [WB_AOTI_DTYPE_F16] = "F16",
        [WB_AOTI_DTYPE_F32] = "F32",
        [WB_AOTI_DTYPE_F64] = "F64",
        [WB_AOTI_DTYPE_C64] = "C64",
        [WB_AOTI_DTYPE_BOOL] = "BOOL",
        [WB_AOTI_DTYPE_BF16] = "BF16",
        [WB_AOTI_DTYPE_F8_E5M2] = "F8_E5M2",
        [WB_AOTI_DTYPE_F8_E4M3FN] = "F8_E4M3",
        [WB_AOTI_DTYPE_U16] = "U16",
        [WB_AOTI_DTYPE_U32] = "U32",
        [WB_AOTI_DTYPE_U64] = "U64",
        [WB_AOTI_DTYPE_F8_E8M0FNU] = "F8_E8M0",
    };
    if (code >= 0 && (size_t)code < sizeof names / sizeof names[0] && names[code])
        return names[code];
    return "?";
}

static void *sym(wb_container *c, const char *name)
{
    void *p = dlsym(c->lib, name);
    if (!p) /* The shim comes from libtorch; it may be global already. */
        p = dlsym(RTLD_DEFAULT, name);
    return p;
}

#define BIND(field, name) (*(void **)&c->f.field = sym(c, name))

static int bind_symbols(wb_container *c)
{
    BIND(create_with_device, "AOTInductorModelContainerCreateWithDevice");
    BIND(create_external, "AOTInductorModelContainerCreateWithExternalConstants");
    BIND(del, "AOTInductorModelContainerDelete");
    BIND(run, "AOTInductorModelContainerRun");
    BIND(num_constants, "AOTInductorModelContainerGetNumConstants");
    BIND(constant_name, "AOTInductorModelContainerGetConstantName");
    BIND(constant_fqn, "AOTInductorModelContainerGetConstantOriginalFQN");
    BIND(constant_dtype, "AOTInductorModelContainerGetConstantDtype");
    BIND(constant_size, "AOTInductorModelContainerGetConstantDataSize");
    BIND(constant_from_folded, "AOTInductorModelContainerGetConstantFromFolded");
    BIND(constant_type, "AOTInductorModelContainerGetConstantType");
    BIND(update_user_managed, "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs");
    BIND(fold, "AOTInductorModelContainerRunConstantFolding");
    BIND(swap, "AOTInductorModelContainerSwapConstantBuffer");
    BIND(free_inactive, "AOTInductorModelContainerFreeInactiveConstantBuffer");
    BIND(did_load, "AOTInductorModelContainerDidCallLoadConstants");
    BIND(set_pinned_async, "AOTInductorSetUsePinnedAsyncConstantsCopy");
    BIND(num_inputs, "AOTInductorModelContainerGetNumInputs");
    BIND(num_outputs, "AOTInductorModelContainerGetNumOutputs");
    BIND(last_error, "AOTInductorGetLastError");
    BIND(from_blob, "aoti_torch_create_tensor_from_blob");
    BIND(delete_tensor, "aoti_torch_delete_tensor_object");
    BIND(data_ptr, "aoti_torch_get_data_ptr");
    BIND(get_dim, "aoti_torch_get_dim");
    BIND(get_sizes, "aoti_torch_get_sizes");
    BIND(get_dtype, "aoti_torch_get_dtype");
    BIND(get_dev_type, "aoti_torch_get_device_type");
    BIND(get_dev_index, "aoti_torch_get_device_index");
    BIND(device_type_cpu, "aoti_torch_device_type_cpu");
    BIND(device_type_cuda, "aoti_torch_device_type_cuda");

    const struct {
        const void *p;
        const char *name;
    } required[] = {
        {c->f.del, "AOTInductorModelContainerDelete"},
        {c->f.run, "AOTInductorModelContainerRun"},
        {c->f.num_constants, "AOTInductorModelContainerGetNumConstants"},
        {c->f.constant_name, "AOTInductorModelContainerGetConstantName"},
        {c->f.constant_fqn, "AOTInductorModelContainerGetConstantOriginalFQN"},
        {c->f.constant_dtype, "AOTInductorModelContainerGetConstantDtype"},
        {c->f.constant_size, "AOTInductorModelContainerGetConstantDataSize"},
        {c->f.from_blob, "aoti_torch_create_tensor_from_blob"},
        {c->f.delete_tensor, "aoti_torch_delete_tensor_object"},
        {c->f.data_ptr, "aoti_torch_get_data_ptr"},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (!required[i].p)
            return fail(c, WB_EFORMAT,
                        "model library %s does not export %s: not an AOTInductor model, or "
                        "torch's libraries are not loaded",
                        c->so_path, required[i].name);
    }
    if (!c->f.create_external && !(c->f.create_with_device && c->f.update_user_managed))
        return fail(c, WB_EFORMAT,
                    "model library %s exports neither "
                    "AOTInductorModelContainerCreateWithExternalConstants nor "
                    "AOTInductorModelContainerCreateWithDevice with "
                    "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs (torch >= 2.11 "
                    "is needed)",
                    c->so_path);
    return WB_OK;
}

/* Loads torch's libraries globally, in dependency order, so that the model
 * library (which names them without a path) finds them already loaded.
 * libtorch_cuda.so is optional: a CPU-only torch has none. These stay
 * loaded for the life of the process: unloading libtorch is not safe. */
static int preload_torch(wb_container *c, const char *dir)
{
    static const struct {
        const char *name;
        int required;
    } libs[] = {
        {"libc10.so", 1},        {"libc10_cuda.so", 0}, {"libtorch_cpu.so", 1},
        {"libtorch_cuda.so", 0}, {"libtorch.so", 1},
    };
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, libs[i].name);
        struct stat st;
        if (stat(path, &st) != 0) {
            if (libs[i].required)
                return fail(c, WB_ENOTFOUND, "torch_lib_dir %s has no %s", dir, libs[i].name);
            continue;
        }
        if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL))
            return fail(c, WB_EIO, "cannot load %s: %s", path, dlerror());
    }
    return WB_OK;
}

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
                return fail(c, WB_ENOGPU,
                            "model %s: the bound tensors are on a GPU but "
                            "cudaGetDevice failed: %s",
                            c->model_path, cudaGetErrorString(ce));
            snprintf(c->device_str, sizeof c->device_str, "cuda:%d", cur);
            dev = c->device_str;
#else
            return fail(c, WB_ENOSYS,
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
                return fail(c, WB_EINVAL, "device '%s': expected cpu, cuda or cuda:N", dev);
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
        return fail(c, WB_EINVAL, "device '%s': expected cpu, cuda or cuda:N", dev);
    }
    c->cuda_type_code = c->f.device_type_cuda ? c->f.device_type_cuda() : WB_AOTI_DEVICE_CUDA;
    c->cpu_type_code = c->f.device_type_cpu ? c->f.device_type_cpu() : WB_AOTI_DEVICE_CPU;
    c->dev_type_code = c->cuda ? c->cuda_type_code : c->cpu_type_code;
    return WB_OK;
}

/* Reads the model's constant table. */
static int read_constants(wb_container *c)
{
    size_t n = 0;
    if (c->f.num_constants(c->h, &n) != 0)
        return runtime_fail(c, "AOTInductorModelContainerGetNumConstants", NULL);
    c->bind = calloc(n ? n : 1, sizeof *c->bind);
    if (!c->bind)
        return fail(c, WB_ENOMEM, "out of memory");
    c->n_bind = n;
    for (size_t i = 0; i < n; i++) {
        binding *b = &c->bind[i];
        const char *name = NULL, *fqn = NULL;
        bool folded = false;
        b->lease = b->caller = -1;
        if (c->f.constant_name(c->h, i, &name) != 0 || !name)
            return runtime_fail(c, "AOTInductorModelContainerGetConstantName", NULL);
        if (c->f.constant_fqn(c->h, i, &fqn) != 0)
            return runtime_fail(c, "AOTInductorModelContainerGetConstantOriginalFQN", name);
        if (c->f.constant_dtype(c->h, i, &b->dtype) != 0)
            return runtime_fail(c, "AOTInductorModelContainerGetConstantDtype", name);
        if (c->f.constant_size(c->h, i, &b->size) != 0)
            return runtime_fail(c, "AOTInductorModelContainerGetConstantDataSize", name);
        if (c->f.constant_from_folded && c->f.constant_from_folded(c->h, i, &folded) != 0)
            return runtime_fail(c, "AOTInductorModelContainerGetConstantFromFolded", name);
        b->folded = folded;
        b->type = folded ? 4 : 1;
        if (c->f.constant_type && c->f.constant_type(c->h, i, &b->type) != 0)
            return runtime_fail(c, "AOTInductorModelContainerGetConstantType", name);
        b->name = strdup(name);
        b->fqn = strdup(fqn && fqn[0] ? fqn : name);
        if (!b->name || !b->fqn)
            return fail(c, WB_ENOMEM, "out of memory");
    }
    return WB_OK;
}

static const wb__tensor_entry *lease_lookup(const wb_lease *l, const char *name)
{
    for (size_t i = 0; i < l->n_tensors; i++) {
        if (strcmp(l->tensors[i].name, name) == 0)
            return &l->tensors[i];
    }
    return NULL;
}

static void lease_names(wb_container *c, char *buf, size_t size)
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
        const wb__tensor_entry *t = lease_lookup(c->leases[k], name);
        if (!t)
            continue;
        if (b->lease >= 0) {
            *rc = fail(c, WB_EINVAL,
                       "constant '%s' (checkpoint name '%s') is in lease %.8s (model '%s') and in "
                       "lease %.8s (model '%s'); bind it from one only",
                       b->fqn, name, c->leases[b->lease]->id_hex, c->leases[b->lease]->model,
                       c->leases[k]->id_hex, c->leases[k]->model);
            return 0;
        }
        b->lease = (int)k;
        *s = (source){.kind = WB_BIND_LEASED,
                      .dtype = t->dtype,
                      .data = t->data,
                      .ndim = t->ndim,
                      .shape = t->shape,
                      .device = t->device,
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
            return fail(c, WB_ENOGPU, "constant '%s' from %s: cannot copy it to %s: %s", b->fqn,
                        c->rules.extra_path, c->device_str, cudaGetErrorString(ce));
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

/* Upstream's constant types (torch::aot_inductor::ConstantType). */
static const char *type_name(int32_t type)
{
    switch (type) {
    case 1:
        return "parameter";
    case 2:
        return "buffer";
    case 3:
        return "tensor constant";
    case 4:
        return "folded constant";
    default:
        return "constant of unknown type";
    }
}

/* 1 when `size` (GetConstantDataSize: the storage's bytes, rounded up to 64
 * unless every constant is on CUDA) fits a contiguous tensor of `nbytes`. */
static int size_fits(uint64_t size, uint64_t nbytes)
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

/* Finds, checks and wraps the tensor of every constant that is not folded.
 * Order: a caller tensor of the FQN; a leased tensor of the mapped name
 * (prefix rules); the alias target (tied weights); the package's constants
 * file. A parameter found nowhere is an error; a buffer or tensor constant
 * found nowhere is left to the model, as upstream's full update does. */
static int bind_constants(wb_container *c, const wb_container_options *o)
{
    for (size_t i = 0; i < c->n_bind; i++) {
        binding *b = &c->bind[i];
        if (b->folded)
            continue;
        char mapped[512], q[600];
        const char *name = wb__aoti_map_name(&c->rules, b->fqn, mapped, sizeof mapped);
        if (!name)
            return fail(c, WB_ELIMIT, "constant '%s': the mapped name is too long", b->fqn);
        source s = {0};
        int rc = WB_OK, found = find_named(c, o, b->fqn, b, &s, &rc);
        if (!found && rc == WB_OK && strcmp(name, b->fqn) != 0)
            found = find_named(c, o, name, b, &s, &rc);
        const wb__alias *a = NULL;
        if (!found && rc == WB_OK) {
            a = wb__aoti_alias_find(&c->rules, b->fqn);
            if (!a)
                a = wb__aoti_alias_find(&c->rules, name);
            if (a && (found = find_named(c, o, a->target, b, &s, &rc)))
                s.kind = WB_BIND_ALIASED;
        }
        if (rc != WB_OK)
            return rc;
        const wb_st_tensor *et = NULL;
        if (!found && (et = wb__aoti_extra_find(&c->rules, b->fqn, name))) {
            if ((rc = load_private(c, b, et, &s)))
                return rc;
            found = 1;
        }
        if (!found) {
            if (b->type != 1 || b->size == 0) {
                c->info.unbound_constants++;
                wb_warn("container_constant_unbound",
                        "model=%s constant=%s type=\"%s\" note=\"in no lease, caller tensor or "
                        "constants file; left to the model, as upstream's full update does\"",
                        qpath(c, q, sizeof q), b->fqn, type_name(b->type));
                continue;
            }
            char names[300];
            lease_names(c, names, sizeof names);
            return fail(c, WB_ENOTFOUND,
                        "parameter '%s' (internal name '%s'%s%s%s%s) of model %s is in no lease "
                        "(%s), no caller tensor%s%s; if it is tied to another weight, give "
                        "an alias (%s=<checkpoint name>)",
                        b->fqn, b->name, strcmp(name, b->fqn) ? ", checkpoint name '" : "",
                        strcmp(name, b->fqn) ? name : "", strcmp(name, b->fqn) ? "'" : "",
                        a ? ", alias target not found either" : "", c->model_path,
                        c->n_leases ? names : "none given",
                        c->rules.extra ? " and not in the constants file "
                                       : " and no constants "
                                         "file",
                        c->rules.extra ? c->rules.extra_path : "", b->fqn);
        }
        b->kind = s.kind;
        int32_t code = dtype_code(s.dtype);
        if (code != b->dtype)
            return fail(c, WB_EINVAL,
                        "constant '%s': the model expects dtype %s (code %d) but %s has %s", b->fqn,
                        dtype_name(b->dtype), (int)b->dtype, s.where, s.dtype);
        if (!size_fits(b->size, s.nbytes))
            return fail(c, WB_EINVAL,
                        "constant '%s': the model's storage is %zu bytes but %s has %llu bytes "
                        "(a contiguous tensor of %llu bytes was expected; a view into a larger "
                        "storage cannot be bound to a checkpoint tensor)",
                        b->fqn, b->size, s.where, (unsigned long long)s.nbytes,
                        (unsigned long long)s.nbytes);
        if (s.ndim > 64)
            return fail(c, WB_EINVAL, "constant '%s': %u dimensions", b->fqn, s.ndim);
        int64_t sizes[64], strides[64];
        int64_t stride = 1;
        for (uint32_t d = s.ndim; d-- > 0;) {
            sizes[d] = (int64_t)s.shape[d];
            strides[d] = stride;
            stride *= sizes[d] ? sizes[d] : 1;
        }
        /* Each tensor keeps its own device: upstream checks every constant
         * against its own device type, so a model may mix them. The model
         * never writes its constants; host leases are mapped read-only, so a
         * write would fault rather than corrupt the shared copy. */
        int32_t dev_type = s.device >= 0 ? c->cuda_type_code : c->cpu_type_code;
        b->data = s.data;
        if (c->f.from_blob((void *)s.data, (int64_t)s.ndim, sizes, strides, 0, b->dtype, dev_type,
                           s.device >= 0 ? s.device : 0, &b->handle) != 0)
            return runtime_fail(c, "aoti_torch_create_tensor_from_blob", b->fqn);
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
    return WB_OK;
}

/* The (name, handle) pairs of the bound constants. */
static AOTInductorConstantMapEntry *make_pairs(wb_container *c, size_t *n)
{
    AOTInductorConstantMapEntry *p = calloc(c->n_bind ? c->n_bind : 1, sizeof *p);
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

static void free_bindings(wb_container *c)
{
    for (size_t i = 0; i < c->n_bind; i++) {
        if (c->bind[i].handle && c->f.delete_tensor)
            c->f.delete_tensor(c->bind[i].handle);
        free(c->bind[i].private_host);
#ifdef WB_HAVE_CUDA
        if (c->bind[i].private_dev)
            cudaFree(c->bind[i].private_dev);
#endif
        free(c->bind[i].name);
        free(c->bind[i].fqn);
    }
    free(c->bind);
    c->bind = NULL;
    c->n_bind = 0;
}

static int64_t device_free_bytes(wb_container *c)
{
#ifdef WB_HAVE_CUDA
    if (c->cuda) {
        size_t fr = 0, total = 0;
        if (cudaMemGetInfo(&fr, &total) == cudaSuccess)
            return (int64_t)fr;
    }
#else
    (void)c;
#endif
    return -1;
}

static int sync_stream(wb_container *c)
{
#ifdef WB_HAVE_CUDA
    if (c->cuda && c->stream) {
        cudaError_t ce = cudaStreamSynchronize((cudaStream_t)c->stream);
        if (ce != cudaSuccess)
            return fail(c, WB_EINTERNAL, "model %s: the stream failed: %s", c->model_path,
                        cudaGetErrorString(ce));
    }
#else
    (void)c;
#endif
    return WB_OK;
}

static int make_stream(wb_container *c, void *given)
{
    if (!c->cuda)
        return WB_OK;
    if (given) {
        c->stream = given;
        return WB_OK;
    }
#ifdef WB_HAVE_CUDA
    cudaStream_t s = NULL;
    cudaError_t ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (ce != cudaSuccess)
        return fail(c, WB_ENOGPU, "model %s on %s: cannot create a stream: %s", c->model_path,
                    c->device_str, cudaGetErrorString(ce));
    c->stream = s;
    c->own_stream = 1;
    return WB_OK;
#else
    return fail(c, WB_ENOSYS, "model %s on %s: this build of libwbclient has no CUDA support",
                c->model_path, c->device_str);
#endif
}

static size_t count_folded(const wb_container *c, uint64_t *bytes)
{
    size_t n = 0;
    *bytes = 0;
    for (size_t i = 0; i < c->n_bind; i++) {
        if (c->bind[i].folded) {
            n++;
            *bytes += c->bind[i].size;
        }
    }
    return n;
}

/* torch >= 2.14. Upstream defines no "describe only" call: its constructor
 * with external constants validates them and folds at once, so a call with
 * zero entries is not a way to read the constants' names. As upstream's own
 * caller does, an ordinary container (CreateWithDevice) is created to read
 * the metadata, deleted, and the container is then created again with every
 * entry. */
static int create_external(wb_container *c, const wb_container_options *o, size_t num_models)
{
    if (!c->f.create_with_device)
        return fail(c, WB_EFORMAT,
                    "model library %s exports CreateWithExternalConstants but not "
                    "AOTInductorModelContainerCreateWithDevice, needed to read the constants' "
                    "names first",
                    c->so_path);
    if (c->f.create_with_device(&c->h, num_models, c->device_str, c->cubin_dir) != 0) {
        c->h = NULL;
        return runtime_fail(c, "AOTInductorModelContainerCreateWithDevice",
                            "(to read the constants' metadata)");
    }
    int rc = read_constants(c);
    c->f.del(c->h);
    c->h = NULL;
    if (rc == WB_OK)
        rc = bind_constants(c, o);
    if (rc != WB_OK)
        return rc;
    size_t n = 0;
    AOTInductorConstantMapEntry *pairs = make_pairs(c, &n);
    if (!pairs)
        return fail(c, WB_ENOMEM, "out of memory");
    if (c->f.create_external(&c->h, num_models, c->device_str, c->cubin_dir, pairs, n) != 0) {
        c->h = NULL;
        rc = runtime_fail(c, "AOTInductorModelContainerCreateWithExternalConstants", NULL);
    }
    free(pairs);
    snprintf(c->rec.aoti_api, sizeof c->rec.aoti_api, "%s", API_EXTERNAL);
    return rc;
}

/* torch 2.11-2.13: create, then point the constants at our tensors. A
 * library that loaded its own copy at creation gets ours in the inactive
 * buffer, which is swapped in; its copy is then freed. */
static int create_with_device(wb_container *c, const wb_container_options *o, size_t num_models)
{
    char q[600];
    int64_t free0 = device_free_bytes(c);
    if (c->f.create_with_device(&c->h, num_models, c->device_str, c->cubin_dir) != 0) {
        c->h = NULL;
        return runtime_fail(c, "AOTInductorModelContainerCreateWithDevice", NULL);
    }
    int64_t free1 = device_free_bytes(c);
    snprintf(c->rec.aoti_api, sizeof c->rec.aoti_api, "%s", API_DEVICE);
    int rc = read_constants(c);
    if (rc == WB_OK)
        rc = bind_constants(c, o);
    if (rc != WB_OK)
        return rc;

    uint64_t own = 0;
    for (size_t i = 0; i < c->n_bind; i++)
        own += c->bind[i].folded ? 0 : c->bind[i].size;
    int embedded = 0;
    bool did = false;
    uint64_t allocated = free0 >= 0 && free1 >= 0 && free0 > free1 ? (uint64_t)(free0 - free1) : 0;
    if (c->f.did_load && c->f.did_load(c->h, &did) == 0)
        embedded = did;
    else if (own >= EMBEDDED_MIN_BYTES && (double)allocated >= EMBEDDED_RATIO * (double)own)
        embedded = 1;

    uint64_t folded_bytes = 0;
    size_t n_folded = count_folded(c, &folded_bytes);
    if (n_folded && !c->f.fold)
        return fail(c, WB_EFORMAT,
                    "model %s has %zu folded constants but its library does not export "
                    "AOTInductorModelContainerRunConstantFolding",
                    c->model_path, n_folded);
    size_t n = 0;
    AOTInductorConstantMapEntry *pairs = make_pairs(c, &n);
    if (!pairs)
        return fail(c, WB_ENOMEM, "out of memory");
    if (embedded && c->f.swap && c->f.free_inactive) {
        double t0 = mono_now();
        wb_warn("container_embedded_constants",
                "model=%s bytes=%llu note=\"the model library loaded its own copy of its "
                "constants; replacing it with the shared tensors and freeing it\"",
                qpath(c, q, sizeof q), (unsigned long long)own);
        if (c->f.update_user_managed(c->h, pairs, n, true, true) != 0)
            rc = runtime_fail(c, "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs",
                              "(inactive buffer)");
        if (rc == WB_OK && n_folded &&
            c->f.fold(c->h, true, (AOTInductorStreamHandle)c->stream, NULL) != 0)
            rc =
                runtime_fail(c, "AOTInductorModelContainerRunConstantFolding", "(inactive buffer)");
        if (rc == WB_OK && c->f.swap(c->h) != 0)
            rc = runtime_fail(c, "AOTInductorModelContainerSwapConstantBuffer", NULL);
        if (rc == WB_OK && c->f.free_inactive(c->h) != 0)
            rc = runtime_fail(c, "AOTInductorModelContainerFreeInactiveConstantBuffer", NULL);
        if (rc == WB_OK)
            rc = sync_stream(c);
        c->info.embedded_bytes = own;
        c->info.embedded_free_seconds = mono_now() - t0;
        int64_t free2 = device_free_bytes(c);
        if (rc == WB_OK)
            wb_warn("container_embedded_freed",
                    "model=%s bytes=%llu seconds=%.3f device_bytes_returned=%lld",
                    qpath(c, q, sizeof q), (unsigned long long)own, c->info.embedded_free_seconds,
                    free2 >= 0 && free1 >= 0 ? (long long)(free2 - free1) : -1LL);
    } else {
        if (embedded)
            wb_warn("container_embedded_constants",
                    "model=%s bytes=%llu note=\"the model library loaded its own copy of its "
                    "constants and cannot swap buffers; that copy stays allocated\"",
                    qpath(c, q, sizeof q), (unsigned long long)own);
        if (c->f.update_user_managed(c->h, pairs, n, false, true) != 0)
            rc = runtime_fail(c, "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs",
                              NULL);
        if (rc == WB_OK && n_folded &&
            c->f.fold(c->h, false, (AOTInductorStreamHandle)c->stream, NULL) != 0)
            rc = runtime_fail(c, "AOTInductorModelContainerRunConstantFolding", NULL);
    }
    free(pairs);
    return rc;
}

/* The unshared baseline: the library loads its own constants at creation
 * and nothing is bound. Folded constants are built from that copy. */
static int create_own(wb_container *c, size_t num_models)
{
    char q[600];
    if (!c->f.create_with_device)
        return fail(c, WB_EFORMAT,
                    "model library %s does not export "
                    "AOTInductorModelContainerCreateWithDevice",
                    c->so_path);
    int64_t free0 = device_free_bytes(c);
    if (c->f.create_with_device(&c->h, num_models, c->device_str, c->cubin_dir) != 0) {
        c->h = NULL;
        return runtime_fail(c, "AOTInductorModelContainerCreateWithDevice", NULL);
    }
    int64_t free1 = device_free_bytes(c);
    snprintf(c->rec.aoti_api, sizeof c->rec.aoti_api, "%s", API_OWN);
    int rc = read_constants(c);
    if (rc != WB_OK)
        return rc;
    uint64_t own = 0, folded_bytes = 0;
    for (size_t i = 0; i < c->n_bind; i++)
        own += c->bind[i].folded ? 0 : c->bind[i].size;
    c->info.embedded_bytes = own;
    if (count_folded(c, &folded_bytes) && c->f.fold &&
        c->f.fold(c->h, false, (AOTInductorStreamHandle)c->stream, NULL) != 0)
        return runtime_fail(c, "AOTInductorModelContainerRunConstantFolding", NULL);
    wb_info("container_own_constants", "model=%s bytes=%llu device_bytes_allocated=%lld",
            qpath(c, q, sizeof q), (unsigned long long)own,
            free0 >= 0 && free1 >= 0 ? (long long)(free0 - free1) : -1LL);
    return WB_OK;
}

static int check_args(wb_container *c, wb_lease *const *leases, size_t n_leases,
                      const char *model_path, const wb_container_options *o)
{
    if (!model_path || !model_path[0])
        return fail(c, WB_EINVAL, "create container: no model path");
    if (n_leases && !leases)
        return fail(c, WB_EINVAL, "create container: %zu leases but the array is NULL", n_leases);
    for (size_t i = 0; i < n_leases; i++) {
        if (!leases[i])
            return fail(c, WB_EINVAL, "create container: lease %zu is NULL", i);
        for (size_t k = 0; k < i; k++) {
            if (leases[k] == leases[i])
                return fail(c, WB_EINVAL, "create container: lease %.8s is given twice",
                            leases[i]->id_hex);
        }
    }
    if (o->n_tensors && !o->tensors)
        return fail(c, WB_EINVAL, "create container: %zu caller tensors but the array is NULL",
                    o->n_tensors);
    for (size_t i = 0; i < o->n_tensors; i++) {
        const wb_container_tensor *t = &o->tensors[i];
        if (!t->fqn || !t->fqn[0] || !t->data || (t->ndim && !t->shape))
            return fail(c, WB_EINVAL,
                        "create container: caller tensor %zu lacks a name, data or shape", i);
        if (dtype_code(t->dtype) < 0 || wb__dtype_parse(t->dtype) < 0)
            return fail(c, WB_EINVAL, "create container: caller tensor '%s' has dtype '%s'", t->fqn,
                        t->dtype ? t->dtype : "(none)");
    }
    return WB_OK;
}

static int any_device_tensor(wb_lease *const *leases, size_t n_leases,
                             const wb_container_options *o)
{
    for (size_t i = 0; i < n_leases; i++) {
        for (size_t k = 0; k < leases[i]->n_tensors; k++) {
            if (leases[i]->tensors[k].device >= 0)
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
    c->cubin_dir = strndup(c->so_path, (size_t)(slash - c->so_path));
    return c->cubin_dir ? WB_OK : fail(c, WB_ENOMEM, "out of memory");
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
    return fail(c, WB_ENOSYS,
                "model %s calls custom or extern operators through a proxy executor (%s is "
                "beside its library); libwbclient cannot build torch's OSSProxyExecutor: "
                "compile the model without such operators",
                c->model_path, json);
}

static int create(wb_container *c, wb_lease *const *leases, size_t n_leases, const char *model_path,
                  const wb_container_options *o)
{
    double t0 = mono_now();
    int rc = check_args(c, leases, n_leases, model_path, o);
    if (rc != WB_OK)
        return rc;
    c->model_path = strdup(model_path);
    c->leases = calloc(n_leases ? n_leases : 1, sizeof *c->leases);
    c->lease_bytes = calloc(n_leases ? n_leases : 1, sizeof *c->lease_bytes);
    c->lease_tensors = calloc(n_leases ? n_leases : 1, sizeof *c->lease_tensors);
    if (!c->model_path || !c->leases || !c->lease_bytes || !c->lease_tensors)
        return fail(c, WB_ENOMEM, "out of memory");
    c->n_leases = n_leases;
    for (size_t i = 0; i < n_leases; i++)
        c->leases[i] = leases[i];

    if (o->torch_lib_dir && o->torch_lib_dir[0] && (rc = preload_torch(c, o->torch_lib_dir)))
        return rc;
    if ((rc = wb__aoti_locate(model_path, o->work_dir, &c->so_path, &c->tmpdir, &c->err)))
        return rc;
    if ((rc = set_cubin_dir(c)))
        return rc;
    if ((rc = check_proxy_executor(c)))
        return rc;
    struct stat st;
    const char *root = c->tmpdir                                           ? c->tmpdir
                       : stat(model_path, &st) == 0 && S_ISDIR(st.st_mode) ? model_path
                                                                           : NULL;
    if (!o->own_constants &&
        (rc = wb__aoti_rules_init(&c->rules, o->aliases, o->strip_prefix, o->prefix,
                                  o->constants_file, root, model_path, &c->err)))
        return rc;
    c->lib = dlopen(c->so_path, RTLD_NOW | RTLD_LOCAL);
    if (!c->lib) {
        const char *e = dlerror();
        return fail(c, WB_EIO, "cannot load model library %s: %s%s", c->so_path,
                    e ? e : "unknown error",
                    e && strstr(e, "libtorch")
                        ? " (put torch's lib directory in LD_LIBRARY_PATH or set torch_lib_dir)"
                        : "");
    }
    if ((rc = bind_symbols(c)))
        return rc;
    if ((rc = parse_device(c, o->device, any_device_tensor(leases, n_leases, o))))
        return rc;
    if ((rc = make_stream(c, o->stream)))
        return rc;
    /* Only effective before creation; harmless when nothing is loaded. */
    if (c->f.set_pinned_async) {
        if (c->f.set_pinned_async(true) != 0)
            return runtime_fail(c, "AOTInductorSetUsePinnedAsyncConstantsCopy", NULL);
        c->rec.pinned_async_copy = 1;
    }
    size_t num_models = o->num_models ? o->num_models : 1;
    if (o->own_constants)
        rc = create_own(c, num_models);
    else if (c->f.create_external)
        rc = create_external(c, o, num_models);
    else
        rc = create_with_device(c, o, num_models);
    if (rc == WB_OK)
        rc = sync_stream(c);
    if (rc != WB_OK)
        return rc;

    c->info.folded_constants = count_folded(c, &c->info.folded_bytes);
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
    c->rec.created_at = wall_now();
    c->rec.model_path = c->model_path;
    for (size_t i = 0; i < n_leases; i++) {
        wb_err e;
        if ((rc = wb__lease_attach(leases[i], &c->rec, c->lease_bytes[i], c->lease_tensors[i],
                                   &e))) {
            for (size_t k = 0; k < i; k++)
                wb__lease_detach(leases[k], &c->rec);
            return fail(c, rc, "%s", e.msg);
        }
    }
    c->attached = 1;

    c->info.aoti_api = c->rec.aoti_api;
    c->info.model_path = c->model_path;
    c->info.so_path = c->so_path;
    c->info.device = c->device_str;
    c->info.pinned_async_copy = c->rec.pinned_async_copy;
    c->info.n_constants = c->n_bind;
    c->info.created_at = c->rec.created_at;
    c->info.create_seconds = mono_now() - t0;
    char q[600];
    wb_info("container_ready",
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
        wb_warn("container_folded_private",
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
    wb_container *c = calloc(1, sizeof *c);
    if (!c)
        return WB_ENOMEM;
    *out = c;
    int rc = create(c, leases, n_leases, model_path, opts ? opts : &defaults);
    if (rc == WB_OK) {
        c->err.code = WB_OK;
        c->err.msg[0] = '\0';
    }
    return rc;
}

WB_EXPORT int wb_container_run(wb_container *c, wb_aten_tensor *inputs, size_t n_in,
                               wb_aten_tensor *outputs, size_t n_out, void *stream)
{
    if (!c)
        return WB_EINVAL;
    if (!c->h)
        return fail(c, WB_ESTATE, "run: the container was not created");
    if ((n_in && !inputs) || (n_out && !outputs))
        return fail(c, WB_EINVAL, "run: NULL input or output array");
    if (c->info.n_inputs && n_in != c->info.n_inputs)
        return fail(c, WB_EINVAL, "run: model %s takes %zu inputs, %zu given", c->model_path,
                    c->info.n_inputs, n_in);
    if (c->info.n_outputs && n_out != c->info.n_outputs)
        return fail(c, WB_EINVAL, "run: model %s gives %zu outputs, room for %zu given",
                    c->model_path, c->info.n_outputs, n_out);
    void *s = stream ? stream : c->stream;
    if (c->f.run(c->h, (AtenTensorHandle *)inputs, n_in, (AtenTensorHandle *)outputs, n_out,
                 (AOTInductorStreamHandle)s, NULL) != 0)
        return runtime_fail(c, "AOTInductorModelContainerRun", NULL);
    return WB_OK;
}

WB_EXPORT void wb_container_destroy(wb_container **cp)
{
    if (!cp || !*cp)
        return;
    wb_container *c = *cp;
    *cp = NULL;
    if (c->h && c->f.del)
        c->f.del(c->h);
    c->h = NULL;
    /* Our wrappers go after the container that pointed at them. */
    free_bindings(c);
    if (c->attached) {
        for (size_t i = 0; i < c->n_leases; i++)
            wb__lease_detach(c->leases[i], &c->rec);
    }
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
    free(c);
}

WB_EXPORT const char *wb_container_errmsg(const wb_container *c)
{
    if (!c)
        return "no container (out of memory, or NULL was passed)";
    return c->err.msg;
}

WB_EXPORT void *wb_container_stream(const wb_container *c)
{
    return c && c->cuda ? c->stream : NULL;
}

WB_EXPORT int wb_container_get_info(const wb_container *c, wb_container_info *out)
{
    if (!c || !out)
        return WB_EINVAL;
    *out = c->info;
    return WB_OK;
}

WB_EXPORT int wb_container_tensor_from_blob(wb_container *c, void *data, const char *dtype,
                                            uint32_t ndim, const int64_t *shape, int device,
                                            wb_aten_tensor *out)
{
    if (!c || !out)
        return WB_EINVAL;
    *out = NULL;
    if (!c->f.from_blob)
        return fail(c, WB_ESTATE, "tensor_from_blob: no model library is loaded");
    int32_t code = dtype_code(dtype);
    if (code < 0)
        return fail(c, WB_EINVAL, "tensor_from_blob: dtype '%s' has no torch equivalent",
                    dtype ? dtype : "(none)");
    if (ndim > 64 || (ndim && !shape))
        return fail(c, WB_EINVAL, "tensor_from_blob: bad shape (%u dimensions)", ndim);
    int64_t strides[64], stride = 1;
    for (uint32_t d = ndim; d-- > 0;) {
        if (shape[d] < 0)
            return fail(c, WB_EINVAL, "tensor_from_blob: dimension %u is negative", d);
        strides[d] = stride;
        stride *= shape[d] ? shape[d] : 1;
    }
    int32_t type = device >= 0
                       ? (c->f.device_type_cuda ? c->f.device_type_cuda() : WB_AOTI_DEVICE_CUDA)
                       : (c->f.device_type_cpu ? c->f.device_type_cpu() : WB_AOTI_DEVICE_CPU);
    AtenTensorHandle h = NULL;
    if (c->f.from_blob(data, (int64_t)ndim, shape, strides, 0, code, type, device >= 0 ? device : 0,
                       &h) != 0)
        return runtime_fail(c, "aoti_torch_create_tensor_from_blob", NULL);
    *out = (wb_aten_tensor)h;
    return WB_OK;
}

WB_EXPORT int wb_container_tensor_delete(wb_container *c, wb_aten_tensor t)
{
    if (!c)
        return WB_EINVAL;
    if (!t)
        return WB_OK;
    if (!c->f.delete_tensor)
        return fail(c, WB_ESTATE, "tensor_delete: no model library is loaded");
    if (c->f.delete_tensor((AtenTensorHandle)t) != 0)
        return runtime_fail(c, "aoti_torch_delete_tensor_object", NULL);
    return WB_OK;
}

WB_EXPORT int wb_container_tensor_data_ptr(wb_container *c, wb_aten_tensor t, void **out)
{
    if (!c || !t || !out)
        return WB_EINVAL;
    if (!c->f.data_ptr)
        return fail(c, WB_ESTATE, "tensor_data_ptr: no model library is loaded");
    if (c->f.data_ptr((AtenTensorHandle)t, out) != 0)
        return runtime_fail(c, "aoti_torch_get_data_ptr", NULL);
    return WB_OK;
}

WB_EXPORT int wb_container_tensor_describe(wb_container *c, wb_aten_tensor t, wb_tensor_desc *out)
{
    if (!c || !t || !out)
        return WB_EINVAL;
    memset(out, 0, sizeof *out);
    if (!c->f.data_ptr || !c->f.get_dim || !c->f.get_sizes || !c->f.get_dtype)
        return fail(c, WB_ENOSYS,
                    "tensor_describe: the model runtime lacks aoti_torch_get_dim, "
                    "_get_sizes or _get_dtype");
    AtenTensorHandle h = (AtenTensorHandle)t;
    int64_t dim = 0, *sizes = NULL;
    int32_t dtype = 0, dev_type = 0, dev_index = 0;
    if (c->f.data_ptr(h, &out->data) != 0 || c->f.get_dim(h, &dim) != 0 ||
        c->f.get_sizes(h, &sizes) != 0 || c->f.get_dtype(h, &dtype) != 0)
        return runtime_fail(c, "aoti_torch_get_*", "(describing a tensor)");
    if (dim < 0 || dim > WB_CONTAINER_MAX_DIMS)
        return fail(c, WB_ELIMIT, "tensor_describe: %lld dimensions, at most %d", (long long)dim,
                    WB_CONTAINER_MAX_DIMS);
    out->ndim = (uint32_t)dim;
    uint64_t elems = 1;
    for (int64_t d = 0; d < dim; d++) {
        out->shape[d] = sizes[d];
        elems *= (uint64_t)(sizes[d] > 0 ? sizes[d] : 0);
    }
    const char *name = dtype_name(dtype);
    snprintf(out->dtype, sizeof out->dtype, "%s", name);
    int st = wb__dtype_parse(name);
    out->nbytes = st >= 0 ? elems * wb__dtype_bits((wb_dtype)st) / 8 : 0;
    out->device = -1;
    if (c->f.get_dev_type && c->f.get_dev_type(h, &dev_type) == 0) {
        int32_t cuda_code = c->f.device_type_cuda ? c->f.device_type_cuda() : WB_AOTI_DEVICE_CUDA;
        if (dev_type == cuda_code) {
            if (c->f.get_dev_index)
                c->f.get_dev_index(h, &dev_index);
            out->device = dev_index;
        }
    }
    return WB_OK;
}
