#include "devcopy.h"

#include "alloc.h"
#include "devcopy_ptx.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Blocks per SM of the default grid: with WB_DEVCOPY_THREADS threads each
 * and 4 vectors of 16 bytes in flight per thread (the kernel's unroll),
 * 64 KiB in flight per SM, several times what the memory's latency needs. */
#define BLOCKS_PER_SM 4
/* Vectors (or bytes) each thread copies at least before another block is
 * worth launching: the kernel's unroll. */
#define PER_THREAD 4

struct wb_devcopy {
    cudaLibrary_t lib;
    cudaKernel_t v16; /* 16-byte aligned dst and src */
    cudaKernel_t v1;  /* anything else */
    /* SM counts by device ordinal, 0 until first asked: several threads may
     * ask at once and store the same value. */
    int ndev;
    atomic_int *sms;
};

static int cuda_fail(wb_err *err, int code, cudaError_t e, const char *what)
{
    return wb__err_set(err, code, "device copy: %s: %s (%s)", what, cudaGetErrorString(e),
                       cudaGetErrorName(e));
}

int wb__devcopy_open(wb_devcopy **out, wb_err *err)
{
    *out = NULL;
    wb_devcopy *dc = wb__calloc(1, sizeof *dc);
    if (!dc)
        return wb__err_set(err, WB_ENOMEM, "device copy: out of memory");
    int rc;
    cudaError_t e = cudaGetDeviceCount(&dc->ndev);
    if (e != cudaSuccess) {
        rc = cuda_fail(err, WB_ENOGPU, e, "cudaGetDeviceCount");
        goto fail;
    }
    if (dc->ndev > 0 && !(dc->sms = wb__calloc((size_t)dc->ndev, sizeof *dc->sms))) {
        rc = wb__err_set(err, WB_ENOMEM, "device copy: out of memory");
        goto fail;
    }
    for (int i = 0; i < dc->ndev; i++)
        atomic_init(&dc->sms[i], 0);
    /* Context-independent: the driver loads it into each device's context
     * (JIT-compiling the PTX for that device) when a kernel first runs there. */
    e = cudaLibraryLoadData(&dc->lib, wb__devcopy_ptx, NULL, NULL, 0, NULL, NULL, 0);
    if (e != cudaSuccess) {
        dc->lib = NULL;
        rc = cuda_fail(err, WB_ENOGPU, e,
                       "cudaLibraryLoadData (the embedded PTX of devcopy_kernel.cu)");
        goto fail;
    }
    if ((e = cudaLibraryGetKernel(&dc->v16, dc->lib, "wb_devcopy_v16")) != cudaSuccess) {
        rc = cuda_fail(err, WB_ENOGPU, e, "cudaLibraryGetKernel (wb_devcopy_v16)");
        goto fail;
    }
    if ((e = cudaLibraryGetKernel(&dc->v1, dc->lib, "wb_devcopy_v1")) != cudaSuccess) {
        rc = cuda_fail(err, WB_ENOGPU, e, "cudaLibraryGetKernel (wb_devcopy_v1)");
        goto fail;
    }
    *out = dc;
    return WB_OK;
fail:
    wb__devcopy_close(&dc);
    return rc;
}

/* The current device's SM count, asked once per device. */
static int sm_count(wb_devcopy *dc, int *out, wb_err *err)
{
    int dev = 0, n = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return cuda_fail(err, WB_EIO, e, "cudaGetDevice");
    if (dev >= 0 && dev < dc->ndev &&
        (n = atomic_load_explicit(&dc->sms[dev], memory_order_relaxed)) > 0) {
        *out = n;
        return WB_OK;
    }
    e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return cuda_fail(err, WB_EIO, e, "cudaDeviceGetAttribute (cudaDevAttrMultiProcessorCount)");
    if (n <= 0)
        n = 1;
    if (dev >= 0 && dev < dc->ndev)
        atomic_store_explicit(&dc->sms[dev], n, memory_order_relaxed);
    *out = n;
    return WB_OK;
}

int wb__devcopy_async(wb_devcopy *dc, void *dst, const void *src, uint64_t n, unsigned blocks,
                      cudaStream_t stream, wb_err *err)
{
    if (n > (UINT64_C(1) << 63))
        return wb__err_set(err, WB_EINVAL, "device copy: %llu bytes is over the limit of 2^63",
                           (unsigned long long)n);
    if (n == 0)
        return WB_OK;
    int vec = (((uintptr_t)dst | (uintptr_t)src) & 15) == 0;
    if (blocks == 0) {
        int sms = 0;
        int rc = sm_count(dc, &sms, err);
        if (rc != WB_OK)
            return rc;
        blocks = (unsigned)sms * BLOCKS_PER_SM;
    }
    /* No more blocks than the copy has work for, and no more than a grid's
     * x dimension takes. */
    uint64_t units = vec ? n / 16 : n;
    uint64_t per_block = (uint64_t)WB_DEVCOPY_THREADS * PER_THREAD;
    uint64_t need = units / per_block + (units % per_block != 0);
    if (need == 0)
        need = 1; /* fewer than 16 bytes: the vector kernel's tail alone */
    if (blocks > need)
        blocks = (unsigned)need;
    if (blocks > INT_MAX)
        blocks = INT_MAX;
    unsigned long long size = (unsigned long long)n;
    void *args[] = {&dst, (void *)&src, &size};
    dim3 grid = {blocks, 1, 1}, block = {WB_DEVCOPY_THREADS, 1, 1};
    /* A cudaKernel_t passed where a kernel's address goes, as the runtime
     * allows since CUDA 12. */
    cudaError_t e =
        cudaLaunchKernel((const void *)(vec ? dc->v16 : dc->v1), grid, block, args, 0, stream);
    if (e != cudaSuccess)
        return wb__err_set(err, WB_EIO,
                           "device copy: cudaLaunchKernel (%s, %u blocks, %llu bytes): %s (%s)",
                           vec ? "wb_devcopy_v16" : "wb_devcopy_v1", blocks, size,
                           cudaGetErrorString(e), cudaGetErrorName(e));
    return WB_OK;
}

void wb__devcopy_close(wb_devcopy **dc)
{
    if (!dc || !*dc)
        return;
    if ((*dc)->lib)
        cudaLibraryUnload((*dc)->lib);
    free((*dc)->sms);
    free(*dc);
    *dc = NULL;
}
