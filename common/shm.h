/* The host memory backend: a model's slab in POSIX shared memory.
 *
 * The broker creates a slab with an unguessable name ("/wb-<pid>-<32 hex>"),
 * mode 0640, maps it read-write and fills it. Clients open the name read-only
 * and map it PROT_READ. A mapping stays valid after the name is unlinked and
 * after the broker dies; the memory is returned when the last mapping goes. */
#ifndef WB_SHM_H
#define WB_SHM_H

#include "err.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WB_SHM_NAME_MAX 64
#define WB_SHM_PREFIX   "wb-"

typedef struct wb_shm {
    char name[WB_SHM_NAME_MAX]; /* "/wb-..." */
    void *addr;
    uint64_t size;
    int writable;
    /* Made by wb__shm_create_lazy: a page is reserved only when
     * wb__shm_populate covers it. */
    int lazy;
    /* Made by wb__shm_create_memfd: an anonymous memfd with no name, kept
     * open in `fd` (its owner hands it to clients) and closed by
     * wb__shm_unmap. */
    int memfd;
    /* Made by wb__shm_create(_lazy): `fd` stays open with a shared flock on
     * the object for as long as the slab lives, so that another broker's
     * wb__shm_cleanup_stale can tell it is in use even from another PID
     * namespace; closed by wb__shm_unmap. */
    int locked;
    int fd;
} wb_shm;

/* Creates and maps read-write a new slab of `size` bytes (size may be 0: a
 * one-page object is made). The name is fresh and random. Every page is
 * reserved before this returns: filling the mapping never runs out of
 * shared memory (tmpfs allocates lazily, and running out while writing to
 * a mapping is SIGBUS, not an error). */
int wb__shm_create(wb_shm *shm, uint64_t size, wb_err *err);

/* The same, but reserves nothing: whoever fills the slab calls
 * wb__shm_populate on each range before writing to it, so that the pages
 * are allocated by the threads that fill them, in parallel and overlapped
 * with their reads, instead of one posix_fallocate of the whole slab before
 * any read starts. Huge pages are asked for (MADV_HUGEPAGE), which tmpfs
 * honours when /sys/kernel/mm/transparent_hugepage/shmem_enabled allows.
 * Where the kernel cannot populate a range with an error return (before
 * Linux 5.14), the slab is reserved up front as wb__shm_create does. */
int wb__shm_create_lazy(wb_shm *shm, uint64_t size, wb_err *err);

/* The same as wb__shm_create_lazy, but the slab is an anonymous memfd
 * (memfd_create with MFD_ALLOW_SEALING) instead of a name in /dev/shm:
 * nothing to unlink, nothing left behind when the broker dies, no shared
 * IPC namespace needed. Clients get the descriptor itself (SCM_RIGHTS).
 * shm->name is left empty. */
int wb__shm_create_memfd(wb_shm *shm, uint64_t size, wb_err *err);

/* Seals a filled memfd slab: the writable mapping is unmapped (the kernel
 * refuses F_SEAL_WRITE while one exists), the seals F_SEAL_WRITE,
 * F_SEAL_GROW, F_SEAL_SHRINK and F_SEAL_SEAL are added, and the slab is
 * mapped again read-only at a new address. From then on nobody, the broker
 * included, can change or resize the bytes: write(2), ftruncate(2) and a
 * writable shared mapping all fail with EPERM. WB_EINVAL for a slab that is
 * not a memfd. */
int wb__shm_seal(wb_shm *shm, wb_err *err);

/* The seals a memfd slab must carry before a client maps it. */
#define WB_SHM_SEALS_REQUIRED (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK)

/* Maps read-only a slab received as a descriptor (`what` names it in
 * messages). The descriptor must be a memfd carrying WB_SHM_SEALS_REQUIRED
 * (WB_EPROTO otherwise: an unsealed descriptor could change under the
 * client) and have exactly `size` bytes. The caller keeps and closes fd. */
int wb__shm_map_fd_ro(wb_shm *shm, int fd, uint64_t size, const char *what, wb_err *err);

/* Allocates and maps the pages of bytes [offset, offset + len) (clamped to
 * the slab) so that writing there cannot fault. When shared memory runs out
 * this returns WB_ENOMEM and a message naming the slab and the range,
 * instead of a SIGBUS on the first write. Returns WB_OK at once for a slab
 * reserved up front. Safe from several threads on disjoint or overlapping
 * ranges. */
int wb__shm_populate(wb_shm *shm, uint64_t offset, uint64_t len, wb_err *err);

/* Opens and maps read-only an existing slab; fails with WB_EPROTO if its size
 * differs from `size` and WB_ENOTFOUND if the name does not exist. */
int wb__shm_map_ro(wb_shm *shm, const char *name, uint64_t size, wb_err *err);

/* Removes the name (the memory stays while mapped). Idempotent. */
void wb__shm_unlink(wb_shm *shm);

/* Unmaps; does not unlink. Zeroes *shm. */
void wb__shm_unmap(wb_shm *shm);

/* Checks that a name has the form "/wb-<pid>-<32 hex>". */
int wb__shm_name_valid(const char *name);

/* Unlinks slabs left in /dev/shm by broker processes that no longer run:
 * names "wb-<pid>-..." owned by our uid, whose pid is gone or a zombie not
 * yet reaped, and whose object no live broker holds locked (a broker in
 * another PID namespace that shares /dev/shm has pids this one cannot see;
 * its lock says it lives). An empty object modified in the last 10 s is
 * left alone (a broker between creating and locking it: it locks before
 * giving it a size). Returns the number removed. */
int wb__shm_cleanup_stale(void);

#endif
