/* The host tier's memory and copies (tier.h): where a model's bytes wait
 * while its slabs are freed, and how they go back. The host backends keep
 * them in anonymous memory; the cuda backend in pinned memory, copied with
 * asynchronous copies on the calling thread's default stream (the tier
 * thread's own: no load or publish waits behind them), so that a restore
 * runs at the link's speed. */
#include "backend.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int wb__tier_host_alloc(const wb_backend *be, uint64_t size, void **out, wb_err *err)
{
    (void)be;
    *out = NULL;
    void *p = mmap(NULL, (size_t)(size ? size : 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return wb__err_errno(err, WB_ENOMEM, errno, "host tier: mapping %llu bytes",
                             (unsigned long long)size);
    *out = p;
    return WB_OK;
}

void wb__tier_host_free(const wb_backend *be, void *p, uint64_t size)
{
    (void)be;
    if (p)
        munmap(p, (size_t)(size ? size : 1));
}

int wb__tier_host_total(const wb_backend *be, int device, uint64_t *bytes, wb_err *err)
{
    (void)be;
    (void)device;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return wb__err_errno(err, WB_EIO, errno, "sysconf(_SC_PHYS_PAGES)");
    *bytes = (uint64_t)pages * (uint64_t)page;
    return WB_OK;
}

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

static int cuda_host_alloc(const wb_backend *be, uint64_t size, void **out, wb_err *err)
{
    (void)be;
    *out = NULL;
    cudaError_t e = cudaHostAlloc(out, (size_t)(size ? size : 1), cudaHostAllocPortable);
    if (e != cudaSuccess) {
        *out = NULL;
        return wb__err_set(err, WB_ENOMEM, "host tier: cudaHostAlloc of %llu bytes: %s",
                           (unsigned long long)size, cudaGetErrorString(e));
    }
    return WB_OK;
}

static void cuda_host_free(const wb_backend *be, void *p, uint64_t size)
{
    (void)be;
    (void)size;
    if (p)
        cudaFreeHost(p);
}

static int cuda_slab_write(wb_slab *slab, uint64_t offset, const void *src, uint64_t len,
                           wb_err *err)
{
    if (!slab->dev_ptr || offset > slab->size || len > slab->size - offset)
        return wb__err_set(err, WB_EINTERNAL, "bytes %llu+%llu are outside the slab (%llu bytes)",
                           (unsigned long long)offset, (unsigned long long)len,
                           (unsigned long long)slab->size);
    cudaError_t e = cudaSetDevice(slab->device);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync((uint8_t *)slab->dev_ptr + offset, src, (size_t)len,
                            cudaMemcpyHostToDevice, cudaStreamPerThread);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamPerThread);
    if (e != cudaSuccess)
        return wb__err_set(err, WB_EIO, "restoring %llu bytes to the slab on device %d: %s",
                           (unsigned long long)len, slab->device, cudaGetErrorString(e));
    return WB_OK;
}

static int cuda_mem_total(const wb_backend *be, int device, uint64_t *bytes, wb_err *err)
{
    (void)be;
    size_t avail = 0, total = 0;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&avail, &total);
    if (e != cudaSuccess)
        return wb__err_set(err, WB_EIO, "cudaMemGetInfo on device %d: %s", device,
                           cudaGetErrorString(e));
    *bytes = total;
    return WB_OK;
}

void wb__tier_cuda_ops(wb_backend *be)
{
    be->host_alloc = cuda_host_alloc;
    be->host_free = cuda_host_free;
    be->slab_write = cuda_slab_write;
    be->mem_total = cuda_mem_total;
}
#else
void wb__tier_cuda_ops(wb_backend *be)
{
    (void)be;
}
#endif
