/* Memory backends: where a model's slab lives and how clients reach it.
 *
 * The loader and the request handlers only go through this table of
 * operations. `host` (POSIX shared memory) is filled directly by the
 * loader's readers; `cuda` (one cudaMalloc slab per model, exported with
 * cudaIpcGetMemHandle) is filled through a ring of pinned staging buffers
 * and asynchronous copies (stage.h), or from registered file mappings. */
#ifndef WB_BROKER_BACKEND_H
#define WB_BROKER_BACKEND_H

#include "err.h"
#include "shm.h"
#include "stage.h"
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
    /* cuda-vmm (backend_vmm.h): the cuMemCreate allocation, its exported
     * POSIX descriptor (size is then a multiple of the granularity). */
    unsigned long long vmm_handle; /* 0: not a VMM slab */
    int vmm_fd;
} wb_slab;

typedef struct wb_backend {
    const char *name; /* "host", "cuda" */
    int proto;        /* WBPROTO__BACKEND__* */
    /* Allocates a slab of at least `size` bytes on `device`. */
    int (*slab_alloc)(wb_slab *slab, int device, uint64_t size, wb_err *err);
    /* A host pointer to bytes [offset, offset + len) of the slab that the
     * loader may read files into directly, or NULL (device memory). */
    void *(*slab_dest)(wb_slab *slab, uint64_t offset, uint64_t len);
    /* May be NULL. Before a direct load's reader writes bytes [offset,
     * offset + len) of slab_dest, it calls this to have their memory
     * allocated (a clean error when there is none, not a fault while
     * writing). Called from several reader threads at once. */
    int (*slab_prepare)(wb_slab *slab, uint64_t offset, uint64_t len, wb_err *err);
    /* Describes the slab for a lease; strings and bytes point into *slab. */
    void (*slab_export)(wb_slab *slab, Wbproto__Slab *out);
    /* May be NULL. Called by the loader once the slab is filled, before
     * any lease: makes it immutable (host memfd: unmapped for writing and
     * sealed, wb__shm_seal). */
    int (*slab_seal)(wb_slab *slab, wb_err *err);
    /* May be NULL. The descriptor a client receives for the slab on the
     * descriptor channel (fdchan_server.h), or -1 when clients reach the slab
     * by its name or handle. The slab keeps it; the channel sends copies. */
    int (*slab_fd)(const wb_slab *slab);
    /* How clients reach a slab (Slab.transport): "shm" (a name in
     * /dev/shm), "memfd" (a sealed memfd from the descriptor channel),
     * "cuda-ipc" (a cudaIpcMemHandle), "cuda-vmm" (a cuMemCreate
     * allocation exported as a descriptor on the descriptor channel). */
    const char *transport;
    /* What a client's mapping allows: "ro", or "rw" (a CUDA IPC handle
     * opens the memory writable; a cuda-vmm import is mapped read-only). */
    const char *access;
    /* May be NULL (no tensor is shared from the backend's slabs, share.h).
     * Copies bytes [offset, offset + len) of a filled slab to host memory
     * at dst; called by the loader's threads, several at once. */
    int (*slab_read)(const wb_slab *slab, uint64_t offset, void *dst, uint64_t len, wb_err *err);
    /* Withdraws the slab's name and releases the broker's memory; clients
     * that attached keep their own mappings. Idempotent. */
    void (*slab_free)(wb_slab *slab);
    /* How the loader fills slabs: WB_STAGE_DIRECT (0 means the same) reads
     * into slab_dest; WB_STAGE_STAGED goes through `staging` to dev_ptr;
     * WB_STAGE_MAPPED copies from file mappings registered with `engine`. */
    int load_mode;
    wb_stage_config stage; /* reader threads, chunk size; zero fields: defaults */
    wb_staging *staging;   /* staged: allocated once when the backend started */
    wb_copy_engine *engine;
    /* May be NULL (host). The copy engine of `device` (its own stream and one
     * event per staging buffer) for loads to several devices at once
     * (stage_fanout.h); `engine` is --device's. Others are started on first
     * use and kept until the backend is freed. Called by the loader thread. */
    int (*device_engine)(const struct wb_backend *be, int device, wb_copy_engine **out,
                         wb_err *err);
    /* May be NULL. The bytes free now where `device`'s slabs are allocated
     * (host: /dev/shm, or the memory available for memfds; cuda: the
     * device's free memory, cudaMemGetInfo), and in `where` words naming
     * it. The loader judges whether a load fits by it before allocating
     * anything. Called by the loader thread. */
    int (*mem_free)(const struct wb_backend *be, int device, uint64_t *bytes, char *where,
                    size_t where_len, wb_err *err);
    /* The host tier of the device memory budget (tier.h). May be NULL (no
     * host tier: models over the budget are dropped and reloaded). Host
     * memory for a model's bytes while its slabs are freed (cuda: pinned,
     * so that a restore runs at the link's speed; host: anonymous memory),
     * and its release. Called by the tier thread and the loop. */
    int (*host_alloc)(const struct wb_backend *be, uint64_t size, void **out, wb_err *err);
    void (*host_free)(const struct wb_backend *be, void *p, uint64_t size);
    /* May be NULL (slab_dest is written then). Copies len bytes at src into
     * a new slab at offset, before slab_seal: a restore from the host tier. */
    int (*slab_write)(wb_slab *slab, uint64_t offset, const void *src, uint64_t len, wb_err *err);
    /* May be NULL. All of `device`'s memory, the base of a budget given in
     * percent (host: the machine's physical memory). */
    int (*mem_total)(const struct wb_backend *be, int device, uint64_t *bytes, wb_err *err);
    void *priv; /* the backend's own state */
} wb_backend;

/* The host tier's operations of the host backends (backend_tier.c). */
int wb__tier_host_alloc(const wb_backend *be, uint64_t size, void **out, wb_err *err);
void wb__tier_host_free(const wb_backend *be, void *p, uint64_t size);
int wb__tier_host_total(const wb_backend *be, int device, uint64_t *bytes, wb_err *err);
/* Sets the cuda backend's (pinned host memory, copies on the calling
 * thread's default stream). */
void wb__tier_cuda_ops(wb_backend *be);

/* slab_read's bounds: WB_EINTERNAL when bytes [offset, offset + len) are
 * not all in the slab (or it has no memory), else WB_OK. */
static inline int wb__slab_read_check(const wb_slab *slab, int mapped, uint64_t offset,
                                      uint64_t len, wb_err *err)
{
    if (mapped && offset <= slab->size && len <= slab->size - offset)
        return WB_OK;
    return wb__err_set(err, WB_EINTERNAL, "bytes %llu+%llu are outside the slab (%llu bytes)",
                       (unsigned long long)offset, (unsigned long long)len,
                       (unsigned long long)slab->size);
}

/* be->transport and be->access, "" when a backend leaves them unset. */
static inline const char *wb__backend_transport(const wb_backend *be)
{
    return be && be->transport ? be->transport : "";
}
static inline const char *wb__backend_access(const wb_backend *be)
{
    return be && be->access ? be->access : "";
}

/* POSIX shared memory (common/shm.h), with the default loader settings. A
 * broker that changes them uses a copy. */
extern const wb_backend wb__backend_host;
/* The same in sealed memfds handed out as descriptors (--host-slab memfd). */
extern const wb_backend wb__backend_host_memfd;

/* How the cuda backend exports its slabs (--cuda-slab). AUTO, the default,
 * is VMM where the device supports it (wb__backend_pick falls back to IPC,
 * saying why); wb__backend_cuda_new takes IPC or VMM only. */
enum { WB_CUDA_SLAB_IPC = 0, WB_CUDA_SLAB_VMM = 1, WB_CUDA_SLAB_AUTO = 2 };

typedef struct wb_cuda_options {
    int device;
    int slab;              /* WB_CUDA_SLAB_IPC (default) or WB_CUDA_SLAB_VMM */
    int load_mode;         /* WB_STAGE_STAGED (0 means the same) or WB_STAGE_MAPPED */
    wb_stage_config stage; /* staged: buffers of chunk_bytes, `buffers` of them */
} wb_cuda_options;

/* Counts the GPUs the cuda backend could use: WB_OK with *count >= 1;
 * WB_ENOGPU with a reason an operator can act on: "the cuda backend needs
 * the NVIDIA driver: ..." when its library cannot be loaded (the runtime
 * alone says "CUDA driver version is insufficient", which reads as an old
 * driver), "the cuda backend needs a newer NVIDIA driver: ..." naming both
 * CUDA versions, else "no usable GPU: ..." with the runtime's error;
 * WB_ENOSYS in a build without CUDA. */
int wb__backend_cuda_probe(int *count, wb_err *err);

/* Starts the cuda backend on --device: a non-blocking stream, and for the
 * staged mode the pinned staging ring (cudaHostAlloc, once; it is reused by
 * every load). With WB_CUDA_SLAB_VMM its slabs are cuMemCreate allocations
 * handed out as descriptors (transport "cuda-vmm", access "ro"), after a
 * check that the device supports them. *out is owned by the caller
 * (wb__backend_cuda_free). Returns WB_ENOSYS in a build without CUDA or on
 * a device without VMM descriptor export, WB_ENOGPU when the device cannot
 * be used, WB_ENOMEM when pinned memory cannot be had; the message says
 * which call failed and why. */
int wb__backend_cuda_new(const wb_cuda_options *opts, wb_backend **out, wb_err *err);
/* Frees the ring and the stream; slabs must have been freed. NULL is fine;
 * sets *be to NULL. */
void wb__backend_cuda_free(wb_backend **be);

#endif
