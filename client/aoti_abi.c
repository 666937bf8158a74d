/* libwbclient: the AOTI binding's model library: loading torch and the
 * library, binding its C ABI with dlsym (see aoti_abi.h), error reporting,
 * and the tensor functions of wb/container.h. */
#include "aoti_impl.h"

#include "log.h"
#include "names.h"
#include "safetensors.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The smallest linked constants blob that can be an mmap'd-weights header;
 * smaller ones (a library compiled with its constants outside holds one
 * placeholder byte) are taken as holding nothing. */
#define AOTI_BLOB_HEADER_MIN 8

/* The model path as a log value (quoted when it has spaces). */
const char *wb__aoti_qpath(const wb_container *c, char *buf, size_t size)
{
    return wb__log_quote(buf, size, c->model_path ? c->model_path : "");
}

__attribute__((format(printf, 3, 4))) int wb__aoti_fail(wb_container *c, int code, const char *fmt,
                                                        ...)
{
    free(c->long_msg);
    c->long_msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    wb__err_vset(&c->err, code, fmt, ap);
    va_end(ap);
    return code;
}

int wb__aoti_fail_long(wb_container *c, int code, char *msg)
{
    if (!msg)
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    size_t n = strlen(msg);
    if (n < sizeof c->err.msg)
        wb__aoti_fail(c, code, "%s", msg);
    else
        wb__aoti_fail(c, code, "%.*s...", (int)(sizeof c->err.msg - 4), msg);
    if (n < sizeof c->err.msg)
        free(msg);
    else
        c->long_msg = msg;
    return code;
}

/* A failed runtime call: names the entry point and adds the runtime's own
 * message when the library can give it (AOTInductorGetLastError); otherwise
 * the runtime has printed it on stderr. */
int wb__aoti_runtime_fail(wb_container *c, const char *what, const char *ctx)
{
    const char *msg = NULL;
    if (c->f.last_error && c->f.last_error(&msg) != 0)
        msg = NULL;
    return wb__aoti_fail(c, WB_EINTERNAL, "model %s: %s failed%s%s%s%s", c->model_path, what,
                         ctx && ctx[0] ? " " : "", ctx ? ctx : "",
                         msg && msg[0] ? ": " : " (the model runtime's message is on stderr)",
                         msg && msg[0] ? msg : "");
}

/* safetensors dtype name -> c10::ScalarType code; -1 when torch has none. */
int32_t wb__aoti_dtype_code(const char *name)
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

const char *wb__aoti_dtype_name(int32_t code)
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

/* Upstream's constant types (torch::aot_inductor::ConstantType). */
const char *wb__aoti_type_name(int32_t type)
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

static void *sym(wb_container *c, const char *name)
{
    void *p = dlsym(c->lib, name);
    if (!p) /* The shim comes from libtorch; it may be global already. */
        p = dlsym(RTLD_DEFAULT, name);
    return p;
}

#define BIND(field, name) (*(void **)&c->f.field = sym(c, name))

int wb__aoti_bind_symbols(wb_container *c)
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
    BIND(extract_entries, "AOTInductorModelContainerExtractConstantsMapEntries");
    BIND(blob_size, "AOTInductorModelContainerGetConstantsBlobSize");
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
            return wb__aoti_fail(
                c, WB_EFORMAT,
                "model library %s does not export %s: not an AOTInductor model, or "
                "torch's libraries are not loaded",
                c->so_path, required[i].name);
    }
    if (!c->f.create_external && !(c->f.create_with_device && c->f.update_user_managed))
        return wb__aoti_fail(
            c, WB_EFORMAT,
            "model library %s exports neither "
            "AOTInductorModelContainerCreateWithExternalConstants nor "
            "AOTInductorModelContainerCreateWithDevice with "
            "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs (torch >= 2.11 "
            "is needed)",
            c->so_path);
    return WB_OK;
}

/* Whether the library loaded data of its own for each constant, judged on
 * a container CreateWithDevice has just made, before any update. Upstream
 * (torch/csrc/inductor/aoti_runtime/model_base.h, load_constants) loads
 * every non-folded constant from the blob linked into the library
 * (_binary_constants_bin_start.._end) when the model was compiled with
 * aot_inductor.package_constants_in_so (the default), and nothing at all
 * when it was not: that blob is then empty and the container's map too.
 * In order: the container's own list of what it holds
 * (ExtractConstantsMapEntries, keyed by FQN, newer torch); the blob's size
 * (GetConstantsBlobSize for mmap'd weights, where the blob is a header); a
 * DidCallLoadConstants that says no; the device memory the creation took. */
int wb__aoti_read_own_data(wb_container *c, uint64_t allocated)
{
    uint64_t need = 0;
    for (size_t i = 0; i < c->n_bind; i++) {
        c->bind[i].own = 0;
        need += c->bind[i].folded ? 0 : c->bind[i].size;
    }
    c->own_known = 1;
    if (c->f.extract_entries) {
        const AOTInductorConstantMapEntry *e = NULL;
        size_t n = 0, held = 0;
        if (c->f.extract_entries(c->h, &e, &n, false) != 0)
            return wb__aoti_runtime_fail(c, "AOTInductorModelContainerExtractConstantsMapEntries",
                                         NULL);
        wb__names_hash *idx =
            wb__names_hash_new(c->bind, c->n_bind, sizeof *c->bind, offsetof(binding, fqn));
        for (size_t k = 0; e && k < n; k++) {
            if (!e[k].name)
                continue;
            binding *b = idx ? (binding *)wb__names_hash_find(idx, c->bind, sizeof *c->bind,
                                                              offsetof(binding, fqn), e[k].name)
                             : (binding *)wb__names_find(c->bind, c->n_bind, sizeof *c->bind,
                                                         offsetof(binding, fqn), NULL, e[k].name);
            if (b && !b->folded && !b->own) {
                b->own = 1;
                held++;
            }
        }
        free(idx);
        snprintf(c->own_how, sizeof c->own_how,
                 "AOTInductorModelContainerExtractConstantsMapEntries lists %zu constants", held);
        return WB_OK;
    }
    const uint8_t *start = dlsym(c->lib, "_binary_constants_bin_start");
    const uint8_t *end = dlsym(c->lib, "_binary_constants_bin_end");
    int all = -1;
    if (start && end && end >= start) {
        uint64_t have = (uint64_t)(end - start), blob = 0;
        /* mmap'd weights: the linked blob is a header, the weights follow
         * the library in its file. Asked only then: upstream fails (and
         * prints on stderr) for a library whose weights are not mmap'd. A
         * library compiled with its constants outside it links a blob of
         * one placeholder byte (seen on torch 2.11): no header, not asked. */
        if (have >= AOTI_BLOB_HEADER_MIN && have < need && c->f.blob_size &&
            c->f.blob_size(c->h, &blob) == 0)
            have = blob;
        all = have > 0 && have >= need;
        snprintf(c->own_how, sizeof c->own_how,
                 "its embedded constants blob holds %llu bytes for %llu bytes of constants",
                 (unsigned long long)have, (unsigned long long)need);
    } else {
        bool did = true;
        if (c->f.did_load && c->f.did_load(c->h, &did) == 0 && !did) {
            all = 0;
            snprintf(c->own_how, sizeof c->own_how,
                     "AOTInductorModelContainerDidCallLoadConstants says it loaded none");
        } else if (need >= EMBEDDED_MIN_BYTES &&
                   (double)allocated >= EMBEDDED_RATIO * (double)need) {
            all = 1;
            snprintf(c->own_how, sizeof c->own_how,
                     "its creation took %llu bytes of device memory for %llu bytes of constants",
                     (unsigned long long)allocated, (unsigned long long)need);
        } else {
            all = 0;
            c->own_known = 0;
            snprintf(c->own_how, sizeof c->own_how,
                     "the library exports no constants blob and no list of what it holds, so "
                     "libwbclient cannot tell that it holds any");
        }
    }
    for (size_t i = 0; i < c->n_bind; i++)
        c->bind[i].own = all && !c->bind[i].folded;
    return WB_OK;
}

/* Loads torch's libraries globally, in dependency order, so that the model
 * library (which names them without a path) finds them already loaded.
 * libtorch_cuda.so is optional: a CPU-only torch has none. These stay
 * loaded for the life of the process: unloading libtorch is not safe. */
int wb__aoti_preload_torch(wb_container *c, const char *dir)
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
                return wb__aoti_fail(c, WB_ENOTFOUND, "torch_lib_dir %s has no %s", dir,
                                     libs[i].name);
            continue;
        }
        if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL))
            return wb__aoti_fail(c, WB_EIO, "cannot load %s: %s", path, dlerror());
    }
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
        return wb__aoti_fail(c, WB_ESTATE, "tensor_from_blob: no model library is loaded");
    int32_t code = wb__aoti_dtype_code(dtype);
    if (code < 0)
        return wb__aoti_fail(c, WB_EINVAL, "tensor_from_blob: dtype '%s' has no torch equivalent",
                             dtype ? dtype : "(none)");
    if (ndim > 64 || (ndim && !shape))
        return wb__aoti_fail(c, WB_EINVAL, "tensor_from_blob: bad shape (%u dimensions)", ndim);
    int64_t strides[64], stride = 1;
    for (uint32_t d = ndim; d-- > 0;) {
        if (shape[d] < 0)
            return wb__aoti_fail(c, WB_EINVAL, "tensor_from_blob: dimension %u is negative", d);
        strides[d] = stride;
        stride *= shape[d] ? shape[d] : 1;
    }
    int32_t type = device >= 0
                       ? (c->f.device_type_cuda ? c->f.device_type_cuda() : WB_AOTI_DEVICE_CUDA)
                       : (c->f.device_type_cpu ? c->f.device_type_cpu() : WB_AOTI_DEVICE_CPU);
    AtenTensorHandle h = NULL;
    if (c->f.from_blob(data, (int64_t)ndim, shape, strides, 0, code, type, device >= 0 ? device : 0,
                       &h) != 0)
        return wb__aoti_runtime_fail(c, "aoti_torch_create_tensor_from_blob", NULL);
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
        return wb__aoti_fail(c, WB_ESTATE, "tensor_delete: no model library is loaded");
    if (c->f.delete_tensor((AtenTensorHandle)t) != 0)
        return wb__aoti_runtime_fail(c, "aoti_torch_delete_tensor_object", NULL);
    return WB_OK;
}

WB_EXPORT int wb_container_tensor_data_ptr(wb_container *c, wb_aten_tensor t, void **out)
{
    if (!c || !t || !out)
        return WB_EINVAL;
    if (!c->f.data_ptr)
        return wb__aoti_fail(c, WB_ESTATE, "tensor_data_ptr: no model library is loaded");
    if (c->f.data_ptr((AtenTensorHandle)t, out) != 0)
        return wb__aoti_runtime_fail(c, "aoti_torch_get_data_ptr", NULL);
    return WB_OK;
}

WB_EXPORT int wb_container_tensor_describe(wb_container *c, wb_aten_tensor t, wb_tensor_desc *out)
{
    if (!c || !t || !out)
        return WB_EINVAL;
    memset(out, 0, sizeof *out);
    if (!c->f.data_ptr || !c->f.get_dim || !c->f.get_sizes || !c->f.get_dtype)
        return wb__aoti_fail(c, WB_ENOSYS,
                             "tensor_describe: the model runtime lacks aoti_torch_get_dim, "
                             "_get_sizes or _get_dtype");
    AtenTensorHandle h = (AtenTensorHandle)t;
    int64_t dim = 0, *sizes = NULL;
    int32_t dtype = 0, dev_type = 0, dev_index = 0;
    if (c->f.data_ptr(h, &out->data) != 0 || c->f.get_dim(h, &dim) != 0 ||
        c->f.get_sizes(h, &sizes) != 0 || c->f.get_dtype(h, &dtype) != 0)
        return wb__aoti_runtime_fail(c, "aoti_torch_get_*", "(describing a tensor)");
    if (dim < 0 || dim > WB_CONTAINER_MAX_DIMS)
        return wb__aoti_fail(c, WB_ELIMIT, "tensor_describe: %lld dimensions, at most %d",
                             (long long)dim, WB_CONTAINER_MAX_DIMS);
    out->ndim = (uint32_t)dim;
    uint64_t elems = 1;
    for (int64_t d = 0; d < dim; d++) {
        out->shape[d] = sizes[d];
        elems *= (uint64_t)(sizes[d] > 0 ? sizes[d] : 0);
    }
    const char *name = wb__aoti_dtype_name(dtype);
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
