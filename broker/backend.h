/* Memory backends: where a model's slab lives and how clients reach it.
 *
 * The loader and the request handlers only go through this table of
 * operations, so a new backend (cuda: cudaMalloc, staged pinned copies and
 * cudaIpcGetMemHandle) plugs in without touching them. */
#ifndef WB_BROKER_BACKEND_H
#define WB_BROKER_BACKEND_H

#include "err.h"
#include "shm.h"
#include "wb.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* Tensors start at multiples of this many bytes inside a slab. */
#define WB_SLAB_ALIGN          256
#define WB_CUDA_IPC_HANDLE_LEN 64

typedef struct wb_slab {
    uint32_t index;
    uint64_t size; /* bytes allocated, as clients must map them */
    int device;    /* CUDA ordinal, -1 for host memory */
    wb_shm shm;    /* host backend */
    void *dev_ptr; /* cuda backend */
    uint8_t ipc_handle[WB_CUDA_IPC_HANDLE_LEN];
} wb_slab;

typedef struct wb_backend {
    const char *name; /* "host", "cuda" */
    int proto;        /* WBPROTO__BACKEND__* */
    /* Allocates a slab of at least `size` bytes on `device`. */
    int (*slab_alloc)(wb_slab *slab, int device, uint64_t size, wb_err *err);
    /* A host pointer to bytes [offset, offset + len) of the slab that the
     * loader may read files into directly, or NULL when the backend needs
     * slab_write (device memory). */
    void *(*slab_dest)(wb_slab *slab, uint64_t offset, uint64_t len);
    /* Copies host bytes into the slab. */
    int (*slab_write)(wb_slab *slab, uint64_t offset, const void *src, uint64_t len, wb_err *err);
    /* Describes the slab for a lease; strings and bytes point into *slab. */
    void (*slab_export)(wb_slab *slab, Wbproto__Slab *out);
    /* Withdraws the slab's name and releases the broker's memory; clients
     * that attached keep their own mappings. Idempotent. */
    void (*slab_free)(wb_slab *slab);
} wb_backend;

/* POSIX shared memory (common/shm.h). */
extern const wb_backend wb__backend_host;

#endif
