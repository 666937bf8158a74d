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
