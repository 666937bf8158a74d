/* libwbclient: the AOTI binding's creation strategies: torch >= 2.14's
 * CreateWithExternalConstants, torch 2.11-2.13's CreateWithDevice with a
 * user-managed constant update (and the inactive-buffer swap that frees a
 * copy the library loaded by itself), and the unshared baseline; the
 * container's CUDA stream. */
#include "aoti_impl.h"

#include "clock.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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

int wb__aoti_sync_stream(wb_container *c)
{
#ifdef WB_HAVE_CUDA
    if (c->cuda && c->stream) {
        cudaError_t ce = cudaStreamSynchronize((cudaStream_t)c->stream);
        if (ce != cudaSuccess)
            return wb__aoti_fail(c, WB_EINTERNAL, "model %s: the stream failed: %s", c->model_path,
                                 cudaGetErrorString(ce));
    }
#else
    (void)c;
#endif
    return WB_OK;
}

int wb__aoti_make_stream(wb_container *c, void *given)
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
        return wb__aoti_fail(c, WB_ENOGPU, "model %s on %s: cannot create a stream: %s",
                             c->model_path, c->device_str, cudaGetErrorString(ce));
    c->stream = s;
    c->own_stream = 1;
    return WB_OK;
#else
    return wb__aoti_fail(c, WB_ENOSYS,
                         "model %s on %s: this build of libwbclient has no CUDA support",
                         c->model_path, c->device_str);
#endif
}

size_t wb__aoti_count_folded(const wb_container *c, uint64_t *bytes)
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

/* CreateWithDevice, named `api` in the record (`why`, for a failure's
 * message, may be NULL), then the constants' metadata and what the library
 * holds of its own; *free0 and *free1 are the device's free bytes before and
 * after creation (-1 on the CPU). */
static int create_device_container(wb_container *c, size_t num_models, const char *api,
                                   const char *why, int64_t *free0, int64_t *free1)
{
    *free0 = device_free_bytes(c);
    if (c->f.create_with_device(&c->h, num_models, c->device_str, c->cubin_dir) != 0) {
        c->h = NULL;
        *free1 = -1;
        return wb__aoti_runtime_fail(c, "AOTInductorModelContainerCreateWithDevice", why);
    }
    *free1 = device_free_bytes(c);
    snprintf(c->rec.aoti_api, sizeof c->rec.aoti_api, "%s", api);
    int rc = wb__aoti_read_constants(c);
    uint64_t allocated =
        *free0 >= 0 && *free1 >= 0 && *free0 > *free1 ? (uint64_t)(*free0 - *free1) : 0;
    return rc == WB_OK ? wb__aoti_read_own_data(c, allocated) : rc;
}

/* After CreateWithDevice and the binding: points the constants at our
 * tensors. A library that loaded its own copy at creation gets ours in the
 * inactive buffer, which is swapped in; its copy is then freed. Not when a
 * constant bound by nothing keeps the library's data: upstream fills such a
 * constant of the inactive buffer with a handle on the active one's tensor,
 * whose memory FreeInactiveConstantBuffer would free after the swap; the
 * active buffer is updated instead and the library's copy stays. */
static int update_user_managed(wb_container *c, int64_t free1)
{
    char q[600];
    int rc = WB_OK;
    uint64_t own = 0;
    for (size_t i = 0; i < c->n_bind; i++)
        own += c->bind[i].folded || !c->bind[i].own ? 0 : c->bind[i].size;
    size_t kept = wb__aoti_count_kept(c);
    uint64_t folded_bytes = 0;
    size_t n_folded = wb__aoti_count_folded(c, &folded_bytes);
    if (n_folded && !c->f.fold)
        return wb__aoti_fail(c, WB_EFORMAT,
                             "model %s has %zu folded constants but its library does not export "
                             "AOTInductorModelContainerRunConstantFolding",
                             c->model_path, n_folded);
    size_t n = 0;
    AOTInductorConstantMapEntry *pairs = wb__aoti_make_pairs(c, &n);
    if (!pairs)
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    if (own && !kept && c->f.swap && c->f.free_inactive) {
        double t0 = wb__clock_mono_s();
        wb__cwarn("container_embedded_constants",
                  "model=%s bytes=%llu note=\"the model library loaded its own copy of its "
                  "constants; replacing it with the shared tensors and freeing it\"",
                  wb__aoti_qpath(c, q, sizeof q), (unsigned long long)own);
        if (c->f.update_user_managed(c->h, pairs, n, true, true) != 0)
            rc = wb__aoti_runtime_fail(
                c, "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs",
                "(inactive buffer)");
        if (rc == WB_OK && n_folded &&
            c->f.fold(c->h, true, (AOTInductorStreamHandle)c->stream, NULL) != 0)
            rc = wb__aoti_runtime_fail(c, "AOTInductorModelContainerRunConstantFolding",
                                       "(inactive buffer)");
        if (rc == WB_OK && c->f.swap(c->h) != 0)
            rc = wb__aoti_runtime_fail(c, "AOTInductorModelContainerSwapConstantBuffer", NULL);
        if (rc == WB_OK && c->f.free_inactive(c->h) != 0)
            rc = wb__aoti_runtime_fail(c, "AOTInductorModelContainerFreeInactiveConstantBuffer",
                                       NULL);
        if (rc == WB_OK)
            rc = wb__aoti_sync_stream(c);
        c->info.embedded_bytes = own;
        c->info.embedded_free_seconds = wb__clock_mono_s() - t0;
        int64_t free2 = device_free_bytes(c);
        if (rc == WB_OK)
            wb__cwarn("container_embedded_freed",
                      "model=%s bytes=%llu seconds=%.3f device_bytes_returned=%lld",
                      wb__aoti_qpath(c, q, sizeof q), (unsigned long long)own,
                      c->info.embedded_free_seconds,
                      free2 >= 0 && free1 >= 0 ? (long long)(free2 - free1) : -1LL);
    } else {
        if (own)
            wb__cwarn("container_embedded_constants",
                      "model=%s bytes=%llu kept_constants=%zu note=\"the model library loaded "
                      "its own copy of its constants and %s; that copy stays allocated\"",
                      wb__aoti_qpath(c, q, sizeof q), (unsigned long long)own, kept,
                      kept ? "constants bound by nothing read it" : "cannot swap buffers");
        if (c->f.update_user_managed(c->h, pairs, n, false, true) != 0)
            rc = wb__aoti_runtime_fail(
                c, "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs", NULL);
        if (rc == WB_OK && n_folded &&
            c->f.fold(c->h, false, (AOTInductorStreamHandle)c->stream, NULL) != 0)
            rc = wb__aoti_runtime_fail(c, "AOTInductorModelContainerRunConstantFolding", NULL);
    }
    free(pairs);
    return rc;
}

/* torch >= 2.14. Upstream defines no "describe only" call: its constructor
 * with external constants validates them and folds at once, so a call with
 * zero entries is not a way to read the constants' names. As upstream's own
 * caller does, an ordinary container (CreateWithDevice) is created to read
 * the metadata, the constants are bound, and the container is then created
 * again with every entry. CreateWithExternalConstants loads no data from
 * the library: when a constant bound by nothing keeps the data the first
 * container loaded, that container is kept and updated as on torch 2.11. */
int wb__aoti_create_external(wb_container *c, const wb_container_options *o, size_t num_models)
{
    if (!c->f.create_with_device)
        return wb__aoti_fail(
            c, WB_EFORMAT,
            "model library %s exports CreateWithExternalConstants but not "
            "AOTInductorModelContainerCreateWithDevice, needed to read the constants' "
            "names first",
            c->so_path);
    int64_t free0, free1;
    int rc = create_device_container(c, num_models, API_EXTERNAL,
                                     "(to read the constants' metadata)", &free0, &free1);
    if (rc == WB_OK)
        rc = wb__aoti_bind_constants(c, o);
    if (rc == WB_OK && wb__aoti_count_kept(c)) {
        char q[600];
        if (!c->f.update_user_managed)
            return wb__aoti_fail(
                c, WB_EFORMAT,
                "model %s: %zu constants bound by nothing keep the data its library loaded, "
                "which only a container made by CreateWithDevice holds, but the library does not "
                "export AOTInductorModelContainerUpdateUserManagedConstantBufferPairs",
                c->model_path, wb__aoti_count_kept(c));
        wb__cinfo("container_external_skipped",
                  "model=%s kept_constants=%zu note=\"constants bound by nothing keep the data "
                  "the library loaded, which CreateWithExternalConstants would not load\"",
                  wb__aoti_qpath(c, q, sizeof q), wb__aoti_count_kept(c));
        snprintf(c->rec.aoti_api, sizeof c->rec.aoti_api, "%s", API_DEVICE);
        return update_user_managed(c, free1);
    }
    if (c->h) {
        c->f.del(c->h);
        c->h = NULL;
    }
    if (rc != WB_OK)
        return rc;
    size_t n = 0;
    AOTInductorConstantMapEntry *pairs = wb__aoti_make_pairs(c, &n);
    if (!pairs)
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    if (c->f.create_external(&c->h, num_models, c->device_str, c->cubin_dir, pairs, n) != 0) {
        c->h = NULL;
        rc = wb__aoti_runtime_fail(c, "AOTInductorModelContainerCreateWithExternalConstants", NULL);
    }
    free(pairs);
    return rc;
}

/* torch 2.11-2.13: create, bind, then point the constants at our tensors. */
int wb__aoti_create_with_device(wb_container *c, const wb_container_options *o, size_t num_models)
{
    int64_t free0, free1;
    int rc = create_device_container(c, num_models, API_DEVICE, NULL, &free0, &free1);
    if (rc == WB_OK)
        rc = wb__aoti_bind_constants(c, o);
    return rc == WB_OK ? update_user_managed(c, free1) : rc;
}

/* The unshared baseline: the library loads its own constants at creation
 * and nothing is bound. Folded constants are built from that copy. */
int wb__aoti_create_own(wb_container *c, size_t num_models)
{
    char q[600];
    if (!c->f.create_with_device)
        return wb__aoti_fail(c, WB_EFORMAT,
                             "model library %s does not export "
                             "AOTInductorModelContainerCreateWithDevice",
                             c->so_path);
    int64_t free0, free1;
    int rc = create_device_container(c, num_models, API_OWN, NULL, &free0, &free1);
    if (rc != WB_OK)
        return rc;
    /* Nothing is bound: a library without data of its own would run on
     * constants nothing has set. Refused only when the library says so. */
    size_t lacking = 0, n_own = 0;
    const char *first = NULL;
    for (size_t i = 0; i < c->n_bind; i++) {
        if (c->bind[i].folded)
            continue;
        n_own++;
        if (!c->bind[i].own && !lacking++)
            first = c->bind[i].fqn;
    }
    if (lacking && c->own_known)
        return wb__aoti_fail(c, WB_ENOTFOUND,
                             "model %s: own_constants, but the model library holds no data of its "
                             "own for %zu of its %zu constants ('%s'%s; %s): it was compiled with "
                             "its constants outside the library "
                             "(aot_inductor.package_constants_in_so=False); bind them to leases",
                             c->model_path, lacking, n_own, first, lacking > 1 ? ", ..." : "",
                             c->own_how);
    uint64_t own = 0, folded_bytes = 0;
    for (size_t i = 0; i < c->n_bind; i++)
        own += c->bind[i].folded ? 0 : c->bind[i].size;
    c->info.embedded_bytes = own;
    if (wb__aoti_count_folded(c, &folded_bytes) && c->f.fold &&
        c->f.fold(c->h, false, (AOTInductorStreamHandle)c->stream, NULL) != 0)
        return wb__aoti_runtime_fail(c, "AOTInductorModelContainerRunConstantFolding", NULL);
    wb__cinfo("container_own_constants", "model=%s bytes=%llu device_bytes_allocated=%lld",
              wb__aoti_qpath(c, q, sizeof q), (unsigned long long)own,
              free0 >= 0 && free1 >= 0 ? (long long)(free0 - free1) : -1LL);
    return WB_OK;
}
