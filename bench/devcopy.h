/* A device-to-device copy run on the SMs (a grid-stride kernel,
 * devcopy_kernel.cu) rather than on a copy engine, for wb_bench_d2d to set
 * against cudaMemcpyAsync from a producer's memory opened with
 * cudaIpcOpenMemHandle (the broker's publish copy). On the H200 the copy
 * engine was as fast from IPC memory as from local memory, and faster than
 * this kernel (bench/RESULTS.md), so the broker does not use it. The
 * kernel is PTX embedded in the library (devcopy_ptx.h), loaded with the
 * runtime's library calls (cudaLibraryLoadData) and JIT-compiled by the
 * driver for each device at its first launch there (the driver caches the
 * result on disk). Built only with CUDA (WB_HAVE_CUDA). */
#ifndef WB_BENCH_DEVCOPY_H
#define WB_BENCH_DEVCOPY_H

#include "err.h"

#include <cuda_runtime_api.h>

#include <stdint.h>

/* Threads per block of every launch. */
#define WB_DEVCOPY_THREADS 256

typedef struct wb_devcopy wb_devcopy;

/* Loads the kernels: one wb_devcopy serves the whole process, every device
 * and thread. WB_ENOGPU naming the call that failed and the CUDA error
 * (a driver too old for the PTX says so here), WB_ENOMEM. */
int wb__devcopy_open(wb_devcopy **out, wb_err *err);

/* Queues a copy of n bytes from src to dst, both device memory the calling
 * thread's current device can address (its own, or memory opened there with
 * cudaIpcOpenMemHandle or mapped with cuMemMap), on `stream`; the ranges
 * must not overlap. Nothing waits: the copy is done when the stream has
 * passed it. The 16-byte vector kernel when dst and src are 16-byte aligned
 * (any n: the tail is copied byte by byte), else a byte-wise kernel, far
 * slower. blocks: 0 for the default (4 per SM of the current device,
 * cudaDevAttrMultiProcessorCount, asked once per device), else at most that
 * many; never more than the copy has work for. n == 0 queues nothing.
 * WB_EINVAL for n over 2^63, WB_EIO naming the CUDA call that failed. */
int wb__devcopy_async(wb_devcopy *dc, void *dst, const void *src, uint64_t n, unsigned blocks,
                      cudaStream_t stream, wb_err *err);

/* Unloads the kernels and sets *dc to NULL; NULL or *dc NULL: nothing.
 * Copies still queued must have finished. */
void wb__devcopy_close(wb_devcopy **dc);

#endif
