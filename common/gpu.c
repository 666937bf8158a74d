#include "gpu.h"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int wb__gpu_built(void)
{
#ifdef WB_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int wb__gpu_probe(int *count, wb_err *err)
{
    *count = 0;
#ifdef WB_HAVE_CUDA
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess)
        return wb__err_set(err, WB_ENOGPU, "no usable GPU: cudaGetDeviceCount: %s (%s)",
                           cudaGetErrorString(rc), cudaGetErrorName(rc));
    if (n < 1)
        return wb__err_set(err, WB_ENOGPU, "no usable GPU: the CUDA runtime sees 0 devices");
    *count = n;
    return WB_OK;
#else
    return wb__err_set(err, WB_ENOSYS,
                       "this build has no cuda backend (CUDA toolkit not found at build time)");
#endif
}

int wb__gpu_list(wb_gpu_list *out, wb_err *err)
{
    out->n = 0;
#ifdef WB_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
        return WB_OK;
    for (int i = 0; i < n && out->n < WB_GPU_MAX; i++) {
        struct cudaDeviceProp p;
        cudaError_t rc = cudaGetDeviceProperties(&p, i);
        if (rc != cudaSuccess)
            return wb__err_set(err, WB_ENOGPU, "cudaGetDeviceProperties(%d): %s (%s)", i,
                               cudaGetErrorString(rc), cudaGetErrorName(rc));
        wb_gpu_dev *d = &out->dev[out->n++];
        d->index = i;
        wb__gpu_uuid_format((const uint8_t *)p.uuid.bytes, d->uuid);
    }
    return WB_OK;
#else
    return wb__err_set(err, WB_ENOSYS,
                       "this build has no CUDA support (CUDA toolkit not found at build time)");
#endif
}

int wb__gpu_current(int *device, wb_err *err)
{
    *device = -1;
#ifdef WB_HAVE_CUDA
    int d = -1;
    cudaError_t rc = cudaGetDevice(&d);
    if (rc != cudaSuccess)
        return wb__err_set(err, WB_ENOGPU, "cudaGetDevice: %s (%s)", cudaGetErrorString(rc),
                           cudaGetErrorName(rc));
    *device = d;
    return WB_OK;
#else
    return wb__err_set(err, WB_ENOSYS,
                       "this build has no CUDA support (CUDA toolkit not found at build time)");
#endif
}
