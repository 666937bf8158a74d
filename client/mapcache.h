/* The process-wide cache of slab mappings.
 *
 * Several leases of one process (on one model, or granted again after a
 * release) name the same slab; it is mapped once and shared. Each lease that
 * uses a slab holds one reference; the slab is unmapped when the last one is
 * dropped. The key is the slab's name: the shm name (or a memfd's inode) for
 * the host backend, the
 * 64-byte IPC handle (and device) for cuda. All functions are thread-safe
 * (one global mutex). */
#ifndef WB_MAPCACHE_H
#define WB_MAPCACHE_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

#define WB_CUDA_IPC_HANDLE_BYTES 64

typedef struct wb__map wb__map;

/* Maps the host slab `shm_name` read-only, or takes one more reference on
 * its existing mapping. `size` must match the slab's size (and the size of
 * an existing mapping: WB_EPROTO otherwise). On success *out holds a
 * reference to drop with wb__mapcache_put. */
int wb__mapcache_get_host(const char *shm_name, uint64_t size, wb__map **out, wb_err *err);

/* Maps read-only a host slab received as a descriptor (a sealed memfd,
 * wb__shm_map_fd_ro: an unsealed one is WB_EPROTO), or takes one more
 * reference on its existing mapping: the key is the memfd's inode, so the
 * descriptors of several leases on one slab share a mapping. `what` names
 * the slab in messages. The caller keeps and closes fd. */
int wb__mapcache_get_fd(int fd, uint64_t size, const char *what, wb__map **out, wb_err *err);

/* Opens the cuda slab named by a 64-byte cudaIpcMemHandle_t, exported by the
 * broker on CUDA device `device`, once per process
 * (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess), or takes one
 * more reference on it. The slab is opened in the calling thread's current
 * device; when that is not `device`, it must be able to access `device` as a
 * peer, else WB_ENOGPU says so. The handle is closed (cudaIpcCloseMemHandle)
 * with the last reference. Without CUDA in this build: WB_ENOSYS; without a
 * usable GPU: WB_ENOGPU; a handle the driver refuses: WB_EIO. */
int wb__mapcache_get_cuda(const uint8_t *handle, size_t handle_len, int device, uint64_t size,
                          wb__map **out, wb_err *err);

/* Maps a cuda-vmm slab received as a descriptor (a cuMemCreate allocation
 * the broker exported): cuMemImportFromShareableHandle, cuMemAddressReserve,
 * cuMemMap, then cuMemSetAccess with PROT_READ for `device` (and for the
 * thread's current device when it reaches `device` as a peer): a kernel
 * store or a copy into it fails. Not shared between leases (an exported
 * descriptor says nothing that identifies the allocation): each lease maps
 * its own range of the same memory. `size` is the slab's, a multiple of the
 * allocation granularity. The caller keeps and closes fd; unmapped,
 * its range freed and the import released with the last reference.
 * WB_ENOSYS without CUDA in this build; WB_ENOGPU without a usable device;
 * WB_EIO when the driver refuses the descriptor. */
int wb__mapcache_get_vmm(int fd, int device, uint64_t size, const char *what, wb__map **out,
                         wb_err *err);

/* Drops one reference and sets *map to NULL; unmaps (or closes the IPC
 * handle) at the last. NULL-safe. */
void wb__mapcache_put(wb__map **map);

/* Host: the read-only mapping. Cuda: the device pointer of the slab. */
const void *wb__map_addr(const wb__map *map);
uint64_t wb__map_size(const wb__map *map);
/* The CUDA device the slab lives on, or -1 for a host mapping. */
int wb__map_device(const wb__map *map);
/* The CUDA device whose context opened the slab (differs from
 * wb__map_device when the slab is reached through peer access); -1 for host. */
int wb__map_open_device(const wb__map *map);
/* 1 when the mapping refuses writes (host mappings, cuda-vmm); 0 for a
 * CUDA IPC mapping, which the driver opens read-write. */
int wb__map_readonly(const wb__map *map);
/* "host", "cuda-ipc" or "cuda-vmm", for messages. */
const char *wb__map_transport(const wb__map *map);
/* Number of references held on this mapping. */
unsigned wb__map_refs(const wb__map *map);

/* Number of slabs currently mapped through the cache. */
size_t wb__mapcache_count(void);

/* Number of mappings this process has made (mmap of a host slab, opened
 * IPC handle, imported vmm allocation) since it started: what a reused
 * mapping saves. */
uint64_t wb__mapcache_made(void);

#endif
