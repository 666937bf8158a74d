/* The host memory backend: a model's slab in POSIX shared memory.
 *
 * The broker creates a slab with an unguessable name ("/wb-<pid>-<32 hex>"),
 * mode 0640, maps it read-write and fills it. Clients open the name read-only
 * and map it PROT_READ. A mapping stays valid after the name is unlinked and
 * after the broker dies; the memory is returned when the last mapping goes. */
#ifndef WB_SHM_H
#define WB_SHM_H

#include "err.h"

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
} wb_shm;

/* Creates and maps read-write a new slab of `size` bytes (size may be 0: a
 * one-page object is made). The name is fresh and random. */
int wb__shm_create(wb_shm *shm, uint64_t size, wb_err *err);

/* Opens and maps read-only an existing slab; fails with WB_EPROTO if its size
 * differs from `size` and WB_ENOTFOUND if the name does not exist. */
int wb__shm_map_ro(wb_shm *shm, const char *name, uint64_t size, wb_err *err);

/* Removes the name (the memory stays while mapped). Idempotent. */
void wb__shm_unlink(wb_shm *shm);

/* Unmaps; does not unlink. Zeroes *shm. */
void wb__shm_unmap(wb_shm *shm);

/* Checks that a name has the form "/wb-<pid>-<32 hex>". */
int wb__shm_name_valid(const char *name);

/* Unlinks slabs left in /dev/shm by broker processes that no longer run
 * (names "wb-<pid>-..." whose pid is gone or a zombie not yet reaped, and
 * owned by our uid). Returns the number removed. */
int wb__shm_cleanup_stale(void);

#endif
