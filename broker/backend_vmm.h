/* The cuda-vmm slabs of the cuda backend (--cuda-slab vmm): one cuMemCreate
 * allocation per model, its size rounded up to the device's allocation
 * granularity, mapped read-write in the broker for the loader (dev_ptr, as
 * a cudaMalloc slab) and exported as a POSIX file descriptor that clients
 * receive on the descriptor channel, import, and map read-only. The loader
 * and the staging ring are those of the cudaMalloc slabs (backend_cuda.c).
 * Driver calls go through common/cudrv.h: nothing links libcuda. */
#ifndef WB_BROKER_BACKEND_VMM_H
#define WB_BROKER_BACKEND_VMM_H

#include "backend.h"

/* Checks at start that `device` supports VMM descriptor export
 * (wb__cudrv_vmm_check: WB_ENOSYS naming the missing attribute) and gives
 * its allocation granularity, for the log. Each allocation asks again for
 * its own device's. */
int wb__vmm_start(int device, uint64_t *granularity, wb_err *err);

/* The backend operations (backend.h) of a VMM slab. */
int wb__vmm_slab_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err);
/* Once filled: the broker's own mapping becomes read-only too (a driver
 * that refuses is logged, event=cuda_vmm_seal_failed, not fatal). */
int wb__vmm_slab_seal(wb_slab *slab, wb_err *err);
int wb__vmm_slab_fd(const wb_slab *slab);
void wb__vmm_slab_export(wb_slab *slab, Wbproto__Slab *out);
void wb__vmm_slab_free(wb_slab *slab);

/* The pool of freed VMM slabs (slab_pool.h), one per process: started by
 * wbrokerd with --slab-pool-seconds (keep_ms 0: slabs are freed at once),
 * trimmed on its timer, stopped (every kept slab freed) at its end. */
void wb__vmm_pool_start(int64_t keep_ms);
void wb__vmm_pool_stop(void);
size_t wb__vmm_pool_trim(int64_t now_ms);
/* Bytes kept on `device` (-1: all), and takes served and not served. */
uint64_t wb__vmm_pool_bytes(int device);
void wb__vmm_pool_counts(uint64_t *hits, uint64_t *misses);

#endif
