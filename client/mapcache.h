/* The process-wide cache of slab mappings.
 *
 * Several leases of one process (on one model, or granted again after a
 * release) name the same slab; it is mapped once and shared. Each lease that
 * uses a slab holds one reference; the slab is unmapped when the last one is
 * dropped. The key is the slab's name: the shm name for the host backend
 * (and, later, the 64-byte IPC handle for cuda). All functions are
 * thread-safe (one global mutex). */
#ifndef WB_MAPCACHE_H
#define WB_MAPCACHE_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb__map wb__map;

/* Maps the host slab `shm_name` read-only, or takes one more reference on
 * its existing mapping. `size` must match the slab's size (and the size of
 * an existing mapping: WB_EPROTO otherwise). On success *out holds a
 * reference to drop with wb__mapcache_put. */
int wb__mapcache_get_host(const char *shm_name, uint64_t size, wb__map **out, wb_err *err);

/* Drops one reference and sets *map to NULL; unmaps at the last. NULL-safe. */
void wb__mapcache_put(wb__map **map);

const void *wb__map_addr(const wb__map *map);
uint64_t wb__map_size(const wb__map *map);
/* Number of references held on this mapping. */
unsigned wb__map_refs(const wb__map *map);

/* Number of slabs currently mapped through the cache. */
size_t wb__mapcache_count(void);

#endif
