/* The producer's memory a publish's commits open, kept open between the
 * commits of one connection (the source cache, publish_cuda.c): a trainer
 * publishes the same allocations again and again, and opening and closing
 * 32 CUDA IPC handles costs several milliseconds a commit. The ones a
 * commit names again are used as they are, the others are closed after it;
 * another connection's commit closes them first; the connection's end
 * closes them (an importer keeps the producer's allocation alive). How a
 * handle is opened and closed is the caller's (ops), so that the rules are
 * tested without a GPU. Used by the loader thread alone. */
#ifndef WB_BROKER_PUBLISH_SRCS_H
#define WB_BROKER_PUBLISH_SRCS_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

#define WB_SRC_HANDLE_LEN 64

typedef struct wb_src_ops {
    /* Opens `handle` on `device` into *ptr; source `index` of the commit
     * (for the message). */
    int (*open)(void *ctx, const uint8_t *handle, int device, unsigned index, void **ptr,
                wb_err *err);
    void (*close)(void *ctx, void *ptr, int device);
    void *ctx;
    /* May be NULL: frees what the caller keeps with the cache
     * (wb__src_cache_kept), when the cache is freed. */
    void (*free_kept)(void *kept);
} wb_src_ops;

typedef struct wb_src_cache wb_src_cache;

/* NULL when out of memory. */
wb_src_cache *wb__src_cache_new(const wb_src_ops *ops);
/* The ops' context from now on (a commit's, while it opens). */
void wb__src_cache_set_ctx(wb_src_cache *c, void *ctx);
/* Closes every handle and frees the cache; sets *c to NULL. */
void wb__src_cache_free(wb_src_cache **c);
/* A commit of connection `owner` begins: another owner's handles close. */
void wb__src_cache_begin(wb_src_cache *c, uint64_t owner);
/* The mapping of `handle` on `device`: found open, or opened now. */
int wb__src_cache_open(wb_src_cache *c, const uint8_t *handle, int device, unsigned index,
                       void **ptr, wb_err *err);
/* The commit ended: the handles it did not name close (all of them when
 * it failed). */
void wb__src_cache_end(wb_src_cache *c, int failed);
/* Connection `owner` ended: its handles close. Returns how many. */
size_t wb__src_cache_forget(wb_src_cache *c, uint64_t owner);
/* A slot for the caller's own state, kept as long as the cache (the copy
 * streams, publish_cuda.c); ops.free_kept frees it. */
void **wb__src_cache_kept(wb_src_cache *c);
/* Handles opened and found open, over the cache's life; open now. */
void wb__src_cache_counts(const wb_src_cache *c, uint64_t *opened, uint64_t *found, size_t *open);

#endif
