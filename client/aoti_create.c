/* libwbclient: the AOTI binding's creation strategies: torch >= 2.14's
 * CreateWithExternalConstants, torch 2.11-2.13's CreateWithDevice with a
 * user-managed constant update (and the inactive-buffer swap that frees a
 * copy the library loaded by itself), and the unshared baseline; the
 * container's CUDA stream. */
#include "aoti_impl.h"

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

/* torch >= 2.14. Upstream defines no "describe only" call: its constructor
 * with external constants validates them and folds at once, so a call with
 * zero entries is not a way to read the constants' names. As upstream's own
 * caller does, an ordinary container (CreateWithDevice) is created to read
 * the metadata, deleted, and the container is then created again with every
 * entry. */
int wb__aoti_create_external(wb_container *c, const wb_container_options *o, size_t num_models)
{
    if (!c->f.create_with_device)
        return wb__aoti_fail(
            c, WB_EFORMAT,
            "model library %s exports CreateWithExternalConstants but not "
            "AOTInductorModelContainerCreateWithDevice, needed to read the constants' "
            "names first",
            c->so_path);
    if (c->f.create_with_device(&c->h, num_models, c->device_str, c->cubin_dir) != 0) {
        c->h = NULL;
        return wb__aoti_runtime_fail(c, "AOTInductorModelContainerCreateWithDevice",
                                     "(to read the constants' metadata)");
    }
    int rc = wb__aoti_read_constants(c);
    c->f.del(c->h);
    c->h = NULL;
    if (rc == WB_OK)
        rc = wb__aoti_bind_constants(c, o);
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
    snprintf(c->rec.aoti_api, sizeof c->rec.aoti_api, "%s", API_EXTERNAL);
    return rc;
}

/* CreateWithDevice, named `api` in the record, then the constants' metadata;
 * *free0 and *free1 are the device's free bytes before and after creation
 * (-1 on the CPU), to see whether the library loaded constants of its own. */
static int create_device_container(wb_container *c, size_t num_models, const char *api,
                                   int64_t *free0, int64_t *free1)
{
    *free0 = device_free_bytes(c);
    if (c->f.create_with_device(&c->h, num_models, c->device_str, c->cubin_dir) != 0) {
        c->h = NULL;
        *free1 = -1;
        return wb__aoti_runtime_fail(c, "AOTInductorModelContainerCreateWithDevice", NULL);
    }
    *free1 = device_free_bytes(c);
    snprintf(c->rec.aoti_api, sizeof c->rec.aoti_api, "%s", api);
    return wb__aoti_read_constants(c);
}

/* torch 2.11-2.13: create, then point the constants at our tensors. A
 * library that loaded its own copy at creation gets ours in the inactive
 * buffer, which is swapped in; its copy is then freed. */
int wb__aoti_create_with_device(wb_container *c, const wb_container_options *o, size_t num_models)
{
    char q[600];
    int64_t free0, free1;
    int rc = create_device_container(c, num_models, API_DEVICE, &free0, &free1);
    if (rc == WB_OK)
        rc = wb__aoti_bind_constants(c, o);
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
    if (embedded && c->f.swap && c->f.free_inactive) {
        double t0 = wb__aoti_mono_now();
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
        c->info.embedded_free_seconds = wb__aoti_mono_now() - t0;
        int64_t free2 = device_free_bytes(c);
        if (rc == WB_OK)
            wb__cwarn("container_embedded_freed",
                      "model=%s bytes=%llu seconds=%.3f device_bytes_returned=%lld",
                      wb__aoti_qpath(c, q, sizeof q), (unsigned long long)own,
                      c->info.embedded_free_seconds,
                      free2 >= 0 && free1 >= 0 ? (long long)(free2 - free1) : -1LL);
    } else {
        if (embedded)
            wb__cwarn("container_embedded_constants",
                      "model=%s bytes=%llu note=\"the model library loaded its own copy of its "
                      "constants and cannot swap buffers; that copy stays allocated\"",
                      wb__aoti_qpath(c, q, sizeof q), (unsigned long long)own);
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
    int rc = create_device_container(c, num_models, API_OWN, &free0, &free1);
    if (rc != WB_OK)
        return rc;
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
