/* The device copy of bench/devcopy.c: a grid-stride copy run on the SMs,
 * for sources that cudaMemcpyAsync copies on a copy engine well below the
 * memory's bandwidth (a producer's memory opened with
 * cudaIpcOpenMemHandle). The build does not compile this file: it is
 * compiled to PTX by scripts/gen_devcopy_ptx.sh into devcopy_ptx.h, which
 * is committed; the driver JIT-compiles that PTX for the GPU it runs on.
 * extern "C": devcopy.c looks the kernels up by these names. Sizes are
 * unsigned long long so that one launch copies up to 2^64 - 1 bytes. */

/* Vectors each thread has in flight per iteration: loads issued together,
 * then stores, so that a few blocks per SM keep enough bytes in flight to
 * reach the memory's bandwidth. */
#define WB_DEVCOPY_UNROLL 4

/* dst and src 16-byte aligned; n any size: n / 16 vectors, then the tail
 * of fewer than 16 bytes by the first threads of the grid. */
extern "C" __global__ void wb_devcopy_v16(uint4 *__restrict__ dst, const uint4 *__restrict__ src,
                                          unsigned long long n)
{
    const unsigned long long nv = n / 16;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    /* i + 3 * stride cannot overflow: nv < 2^60 and stride < 2^42. */
    for (; i + (WB_DEVCOPY_UNROLL - 1) * stride < nv; i += WB_DEVCOPY_UNROLL * stride) {
        uint4 v[WB_DEVCOPY_UNROLL];
#pragma unroll
        for (int k = 0; k < WB_DEVCOPY_UNROLL; k++)
            v[k] = __ldg(src + i + k * stride);
#pragma unroll
        for (int k = 0; k < WB_DEVCOPY_UNROLL; k++)
            dst[i + k * stride] = v[k];
    }
    for (; i < nv; i += stride)
        dst[i] = __ldg(src + i);
    const unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n % 16) {
        const unsigned long long at = nv * 16 + t;
        ((unsigned char *)dst)[at] = ((const unsigned char *)src)[at];
    }
}

/* Any alignment: one byte per thread and iteration. Slow, and only for
 * pointers or sizes the vector kernel cannot take (the broker's are
 * 16-byte aligned). */
extern "C" __global__ void wb_devcopy_v1(unsigned char *__restrict__ dst,
                                         const unsigned char *__restrict__ src,
                                         unsigned long long n)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        dst[i] = src[i];
}
