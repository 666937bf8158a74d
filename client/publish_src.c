/* libwbclient: where a published tensor's bytes are. Host bytes are copied
 * into the publisher's memfd at once (the caller may reuse its memory);
 * device memory is exported, one CUDA IPC handle per allocation, and the
 * broker copies from it during the commit. */
#include "publish_impl.h"

#include "alloc.h"
#include "cudrv.h"
#include "devlist.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* The memfd grows by at least this much, so that many small tensors cost
 * few ftruncate calls. */
#define HOST_GROW_MIN (4u << 20)

static int add_source(wb_publisher *p, const wb__pub_source *s, uint32_t *index, wb_err *err)
{
    if (p->n_src == p->cap_src) {
        size_t cap = p->cap_src ? 2 * p->cap_src : 8;
        wb__pub_source *n = wb__realloc(p->src, cap * sizeof *n);
        if (!n)
            return wb__err_set(err, WB_ENOMEM, "out of memory");
        p->src = n;
        p->cap_src = cap;
    }
    p->src[p->n_src] = *s;
    *index = (uint32_t)p->n_src++;
    return WB_OK;
}

static int place_host(wb_publisher *p, wb__pub_tensor *t, const void *data, uint64_t nbytes,
                      wb_err *err)
{
    uint64_t off = (p->host_used + WB_PUBLISH_ALIGN - 1) / WB_PUBLISH_ALIGN * WB_PUBLISH_ALIGN;
    if (off > UINT64_MAX - nbytes || off + nbytes > (uint64_t)INT64_MAX)
        return wb__err_set(err, WB_EINVAL, "tensor '%s': the host bytes would pass 2^63", t->name);
    if (p->host_source < 0) {
        wb__pub_source s;
        memset(&s, 0, sizeof s);
        s.host = 1;
        s.device = -1;
        uint32_t index = 0;
        int rc = add_source(p, &s, &index, err);
        if (rc != WB_OK)
            return rc;
        p->host_source = (int)index;
    }
    if (p->memfd < 0) {
        p->memfd = memfd_create("wb-publish", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (p->memfd < 0)
            return wb__err_errno(err, errno == ENOMEM ? WB_ENOMEM : WB_EIO, errno,
                                 "tensor '%s': memfd_create", t->name);
    }
    uint64_t end = off + nbytes;
    if (end > p->host_cap) {
        uint64_t cap = p->host_cap * 2;
        if (cap < end)
            cap = end;
        if (cap < HOST_GROW_MIN)
            cap = HOST_GROW_MIN;
        if (ftruncate(p->memfd, (off_t)cap) != 0)
            return wb__err_errno(err, WB_EIO, errno,
                                 "tensor '%s': growing the publish's memfd to %llu bytes", t->name,
                                 (unsigned long long)cap);
        p->host_cap = cap;
    }
    const uint8_t *src = data;
    uint64_t done = 0;
    while (done < nbytes) {
        size_t chunk = nbytes - done > (1u << 30) ? (1u << 30) : (size_t)(nbytes - done);
        ssize_t w = pwrite(p->memfd, src + done, chunk, (off_t)(off + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return wb__err_errno(err, WB_EIO, w < 0 ? errno : EIO,
                                 "tensor '%s': writing %llu bytes into the publish's memfd",
                                 t->name, (unsigned long long)nbytes);
        done += (uint64_t)w;
    }
    p->host_used = end;
    t->source = (uint32_t)p->host_source;
    t->offset = off;
    return WB_OK;
}

#ifdef WB_HAVE_CUDA
static const char *const not_exportable =
    "cudaIpcGetMemHandle cannot export it (memory from cuMemCreate, such as PyTorch's "
    "expandable segments, or from a cudaMallocAsync pool is not supported: allocate it with "
    "cudaMalloc, or publish from host memory)";

/* The allocation around device pointer `data` on `device`, exported once:
 * its source's index in *index and the tensor's offset from its base. */
static int place_device(wb_publisher *p, wb__pub_tensor *t, const void *data, uint64_t nbytes,
                        int device, wb_err *err)
{
    const wb_cudrv *d;
    wb_err derr;
    if (wb__cudrv_get(&d, &derr) != WB_OK)
        return wb__err_set(err, WB_ENOGPU, "tensor '%s' is in device memory: %s", t->name,
                           derr.msg);
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    /* The driver calls below work in the allocation's device's context. */
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return wb__err_set(err, WB_ENOGPU, "tensor '%s': cudaSetDevice(%d): %s", t->name, device,
                           cudaGetErrorString(ce));
    int rc = WB_OK;
    CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)data, base = 0;
    size_t size = 0;
    int capable = 1;
    CUresult r =
        d->pointer_attribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr);
    if (r == CUDA_SUCCESS && !capable) {
        rc = wb__err_set(err, WB_ENOSYS, "tensor '%s' is in device memory that %s", t->name,
                         not_exportable);
        goto out;
    }
    r = d->address_range(&base, &size, ptr);
    if (r != CUDA_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "tensor '%s': cuMemGetAddressRange", t->name);
        rc = wb__cudrv_fail(d, err, WB_ENOGPU, r, what);
        goto out;
    }
    if (ptr - base > size || nbytes > size - (ptr - base)) {
        rc = wb__err_set(err, WB_EINVAL,
                         "tensor '%s': %llu bytes at %#llx pass the end of their allocation (%zu "
                         "bytes at %#llx)",
                         t->name, (unsigned long long)nbytes, (unsigned long long)ptr, size,
                         (unsigned long long)base);
        goto out;
    }
    for (size_t i = 0; i < p->n_src; i++) {
        if (!p->src[i].host && p->src[i].base == (uintptr_t)base && p->src[i].device == device) {
            t->source = (uint32_t)i;
            t->offset = ptr - base;
            goto out;
        }
    }
    wb__pub_source s;
    memset(&s, 0, sizeof s);
    s.device = device;
    s.base = (uintptr_t)base;
    s.size = size;
    cudaIpcMemHandle_t h;
    ce = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        rc = wb__err_set(err, WB_ENOSYS, "tensor '%s' is in device memory that %s (%s)", t->name,
                         not_exportable, cudaGetErrorString(ce));
        goto out;
    }
    _Static_assert(sizeof h == WB_PUBLISH_IPC_HANDLE, "cudaIpcMemHandle_t is 64 bytes");
    memcpy(s.handle, &h, sizeof h);
    struct cudaDeviceProp prop;
    ce = cudaGetDeviceProperties(&prop, device);
    if (ce != cudaSuccess) {
        rc = wb__err_set(err, WB_ENOGPU, "tensor '%s': cudaGetDeviceProperties(%d): %s", t->name,
                         device, cudaGetErrorString(ce));
        goto out;
    }
    char uuid[WB_GPU_UUID_SIZE];
    wb__gpu_uuid_format((const uint8_t *)prop.uuid.bytes, uuid);
    snprintf(s.uuid, sizeof s.uuid, "%s", uuid);
    uint32_t index = 0;
    rc = add_source(p, &s, &index, err);
    if (rc == WB_OK) {
        t->source = index;
        t->offset = ptr - base;
    }
out:
    if (prev >= 0 && prev != device)
        cudaSetDevice(prev);
    return rc;
}
#endif

/* The device of `data` in *device (-1: host memory). Every pointer is host
 * memory in a build without CUDA, or when the runtime has no device. */
static int pointer_device(const wb__pub_tensor *t, const void *data, int *device, wb_err *err)
{
    *device = -1;
#ifdef WB_HAVE_CUDA
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    cudaError_t ce = cudaPointerGetAttributes(&a, data);
    if (ce != cudaSuccess) {
        cudaGetLastError(); /* no device, no driver: host memory */
        return WB_OK;
    }
    if (a.type == cudaMemoryTypeManaged)
        return wb__err_set(err, WB_ENOSYS,
                           "tensor '%s' is in CUDA managed memory, which cannot be exported: copy "
                           "it into device memory (cudaMalloc) or host memory first",
                           t->name);
    if (a.type == cudaMemoryTypeDevice)
        *device = a.device;
    return WB_OK;
#else
    (void)t;
    (void)data;
    (void)err;
    return WB_OK;
#endif
}

int wb__pub_place(wb_publisher *p, wb__pub_tensor *t, const void *data, uint64_t nbytes,
                  wb_err *err)
{
    int device = -1;
    int rc = data ? pointer_device(t, data, &device, err) : WB_OK;
    if (rc != WB_OK)
        return rc;
    if (device < 0)
        return place_host(p, t, data, nbytes, err);
#ifdef WB_HAVE_CUDA
    return place_device(p, t, data, nbytes, device, err);
#else
    return wb__err_set(err, WB_EINTERNAL, "tensor '%s': device memory in a build without CUDA",
                       t->name);
#endif
}

int wb__pub_seal(wb_publisher *p, wb_err *err)
{
    if (p->memfd < 0)
        return WB_OK;
    if (ftruncate(p->memfd, (off_t)p->host_used) != 0)
        return wb__err_errno(err, WB_EIO, errno, "cutting the publish's memfd to %llu bytes",
                             (unsigned long long)p->host_used);
    p->host_cap = p->host_used;
    if (fcntl(p->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
        return wb__err_errno(err, WB_EIO, errno, "sealing the publish's memfd");
    return WB_OK;
}

void wb__pub_sources_free(wb_publisher *p)
{
    if (p->memfd >= 0)
        close(p->memfd);
    p->memfd = -1;
    free(p->src);
    p->src = NULL;
    p->n_src = p->cap_src = 0;
}
