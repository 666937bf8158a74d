/* Slabs kept after their model is freed, for the next load of the same size
 * on the same device (--slab-pool-seconds). Measured on an H200
 * (bench/RESULTS.md, "Why reused device memory is slower"): a copy into
 * device memory that was freed and allocated again runs at 0.89 of the
 * pinned peak, into an allocation kept and written again at 1.00; so a
 * load that follows an unload, a rollout or a publish that follows the
 * version it replaces, gets the slab the last one freed, as it was.
 *
 * Only slabs whose clients map them read-only are kept (cuda-vmm): a client
 * that still maps one after its lease ended reads the next model's bytes
 * (every allowed client may lease every model), but never writes them. A
 * slab is kept `keep_ms` after it was freed, then freed for real (trimmed
 * on the broker's timer); an allocation of another size on the device, or
 * one the pool cannot serve, frees the device's pooled slabs first, so that
 * the pool never makes a load fail. Thread-safe: the loader thread
 * allocates, the loop frees. */
#ifndef WB_BROKER_SLAB_POOL_H
#define WB_BROKER_SLAB_POOL_H

#include "backend.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wb_pooled_slab {
    wb_slab slab;
    int64_t until_ms; /* freed for real after this (monotonic ms) */
} wb_pooled_slab;

typedef struct wb_slab_pool {
    pthread_mutex_t mu;
    int64_t keep_ms;                  /* 0: the pool keeps nothing */
    void (*free_slab)(wb_slab *slab); /* frees a slab for real */
    wb_pooled_slab *e;
    size_t n, cap;
    uint64_t bytes;                 /* kept now */
    uint64_t hits, misses, trimmed; /* takes served, not served; expired */
} wb_slab_pool;

/* keep_ms 0 disables it; free_slab is the backend's own free. */
void wb__slab_pool_init(wb_slab_pool *p, int64_t keep_ms, void (*free_slab)(wb_slab *slab));
/* Frees every pooled slab (through free_slab) and the pool's memory. */
void wb__slab_pool_destroy(wb_slab_pool *p);

/* A kept slab of exactly `size` bytes on `device`: 1 and *out filled (the
 * pool lets go of it), else 0 after freeing the device's pooled slabs (a
 * miss: the caller allocates, with that memory back). */
int wb__slab_pool_take(wb_slab_pool *p, int device, uint64_t size, wb_slab *out);
/* Keeps *slab until now_ms + keep_ms: 1 (the pool owns it now), or 0 when
 * the pool keeps nothing or is out of memory (the caller frees it). */
int wb__slab_pool_put(wb_slab_pool *p, const wb_slab *slab, int64_t now_ms);
/* Frees the slabs kept past now_ms; returns how many. */
size_t wb__slab_pool_trim(wb_slab_pool *p, int64_t now_ms);
/* Bytes kept on `device` (-1: all devices). */
uint64_t wb__slab_pool_bytes(wb_slab_pool *p, int device);
/* Takes served and not served so far. */
void wb__slab_pool_counts(wb_slab_pool *p, uint64_t *hits, uint64_t *misses);

#endif
