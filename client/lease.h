/* The insides of wb_lease: its tensor table, slab mappings and the
 * containers registered on it. Modules: lease.c (acquire, release),
 * lease_table.c (the tensor tables, shared or the lease's own),
 * lease_find.c (tensors by index and name), lease_containers.c (container
 * registrations, heartbeat records), verify.c (checksums). */
#ifndef WB_LEASE_H
#define WB_LEASE_H

#include "wb/client.h"

#include "err.h"
#include "mapcache.h"
#include "names.h"
#include "rpc.h"
#include "tensor_table.h"
#include "wire.h"

#include <pthread.h>
#include <stdatomic.h>

/* One tensor of a lease. Where its bytes are depends on the lease's
 * mappings (wb__entry_data): entries made from a compact table are shared by
 * every lease on that table. */
typedef struct wb__tensor_entry {
    char *name;
    char *dtype;
    uint32_t ndim;
    uint32_t slab; /* index into the lease's maps */
    uint64_t *shape;
    uint64_t offset; /* in the slab */
    uint64_t nbytes;
    uint64_t xxh3;
} wb__tensor_entry;

/* What a container reports about itself with every heartbeat (see
 * ContainerRecord in wb.proto). Owned by the container; a lease points to it
 * while the container is attached. */
typedef struct wb__container_rec {
    uint64_t id;
    char aoti_api[64];
    int pinned_async_copy;
    uint64_t folded_bytes;
    uint64_t embedded_bytes;
    /* How each constant was bound (see wb_container_info). */
    uint32_t leased_constants, aliased_constants, caller_constants, package_constants;
    uint32_t folded_constants, unbound_constants;
    uint64_t package_bytes;
    double created_at;
    const char *model_path;
    /* Versions swapped in (wb_container_update) and the last swap's time
     * in microseconds; written by the update, read by heartbeats. */
    atomic_uint swaps;
    _Atomic uint64_t last_swap_us;
} wb__container_rec;

/* One container's use of one lease: how much of the lease it binds. */
typedef struct wb__lease_use {
    struct wb__lease_use *next;
    const wb__container_rec *rec;
    int published; /* rec and the counts are complete: heartbeats report it */
    uint64_t bound_bytes;
    uint32_t bound_tensors;
} wb__lease_use;

/* A compact tensor table as a broker sent it (Lease.tensor_table), shared
 * by every lease on that model and by the client's cache of tables, so that
 * the next acquire of the model names its digest and gets no table back.
 * Freed with its last reference. */
typedef struct wb__table {
    atomic_int refs;
    uint8_t digest[16]; /* wb__tensor_table_digest */
    char *model;
    /* The entries (names, dtypes and shapes point into `bytes`), made by
     * the first reader of any lease on the table (wb__lease_tensors), and
     * their name index, made by the first lookup, both under `mu`: a
     * process that only acquires and releases never writes 10^5 entries. */
    size_t n_entries;
    _Atomic(wb__tensor_entry *) entries;
    /* For each slab index the table names, the bytes it needs (the largest
     * offset + nbytes): a lease on a held table checks its slabs against
     * these, not every tensor again. */
    size_t n_slabs;
    uint64_t *slab_need;
    pthread_mutex_t mu;
    _Atomic(wb__names_hash *) by_name;
    const uint8_t *bytes; /* 8-byte aligned: the dims are read as u64 */
    size_t len;
    /* What holds `bytes`: the reply (a table inside it), or the reply's
     * second frame, or the read-only mapping of the broker's shared table
     * (Lease.tensor_table_slab), or none when they were copied to `copy`. */
    Wbproto__Reply *rep;
    wb__frame *frame;
    wb__map *map;
    uint64_t copy[];
} wb__table;

/* Drops one reference; NULL is fine; sets *t to NULL. */
void wb__table_unref(wb__table **t);

/* Tables a client keeps for its next acquires, one per model. */
#define WB_TABLE_CACHE 8

/* The table of the client's last lease on `model` (no reference taken), or
 * NULL. The caller holds client->mu. */
wb__table *wb__table_cached(wb_client *c, const char *model);

/* Gives lease `l` its tensors from the acquire reply's lease `pl`: the
 * table `held` (the one the request named) when the broker says it is
 * still the model's, else the table the reply carries (inside *rep, in
 * *frame, or in the broker's shared mapping; it then becomes the model's
 * table in the client, and takes over *rep or *frame when it keeps its
 * bytes there), else tensor messages copied into one allocation. A shared
 * table this process cannot map sets *unmappable. A message in the client
 * on failure; the caller holds client->mu. */
int wb__lease_build_tensors(wb_client *c, const char *model, const Wbproto__Lease *pl,
                            wb__table *held, wb_lease *l, Wbproto__Reply **rep, wb__frame **frame,
                            int *unmappable);

/* How a slab is reached (wb__slab_kind). */
enum { SLAB_SHM, SLAB_MEMFD, SLAB_CUDA_IPC, SLAB_CUDA_VMM, SLAB_UNKNOWN };

/* The way to reach a slab from its Slab.backend (WBPROTO__BACKEND__*) and
 * Slab.transport: SLAB_UNKNOWN for a transport this library does not know
 * (refused before anything is fetched or mapped). An empty transport is a
 * broker from before the field: its backend's only way (shm, cuda-ipc). */
int wb__slab_kind(int backend, const char *transport);

struct wb_lease {
    /* NULL once the client was destroyed while containers still used the
     * lease: it then lives on, mapped, until released locally. */
    wb_client *client;
    struct wb_lease *prev, *next; /* the client's list, under client->mu */
    uint8_t id[WB_LEASE_ID_BYTES];
    char id_hex[2 * WB_LEASE_ID_BYTES + 1];
    char *model;
    size_t n_maps;
    wb__map **maps; /* one reference per slab, in the broker's slab order */
    size_t n_tensors;
    /* The compact tensor table when the broker sent one or the client held
     * it (one reference): the lease's tensors are its entries. NULL
     * otherwise: the lease owns `own_tensors`, made from the reply's
     * messages. Read the tensors through wb__lease_tensors, never these. */
    wb__table *table;
    wb__tensor_entry *own_tensors;
    /* A hash index of the tensors by name, built under `mu` by the first
     * lookup (wb__lease_lookup) of a lease without a table (one with a
     * table uses the table's); NULL until then. */
    _Atomic(wb__names_hash *) by_name;
    atomic_int orphaned;
    /* Lease.version: the model's version this lease pins (0 from a broker
     * that predates versions). */
    uint32_t version;
    /* Lease.checksums_pending: a published version whose checksums the
     * broker has not computed yet (wb_lease_verify refuses). */
    int checksums_pending;
    /* The options it was acquired with, so that a follower acquires the
     * next version for the same device (wb_container_follow). */
    int opt_device;
    int opt_allow_peer;
    char opt_uuid[48];
    /* What the acquire spent on the slabs (milliseconds): fetching their
     * descriptors from the broker, and importing and mapping them. */
    double fetch_ms, map_ms;
    /* The container state: one lock for the count, the records and the
     * `ending` flag, so that wb_lease_release decides under the same lock
     * that registrations change under (lease_containers.c). */
    pthread_mutex_t mu;
    unsigned containers; /* registrations: public adds plus attached containers */
    wb__lease_use *uses; /* containers attached by the AOTI binding */
    int ending;          /* release has begun: no new registration */
};

/* The lease's n_tensors tensors, in the broker's order. Those of a table
 * are made by the first call on any lease of the table (thread-safe, O(n)
 * once, O(1) after). NULL when they could not be made (out of memory) and
 * the lease has tensors. */
const wb__tensor_entry *wb__lease_tensors(const wb_lease *lease);

/* The lease's tensor called `name`, or NULL (also when out of memory): a
 * hash index by name that the first call builds, shared with the other
 * leases on its table (a model binds 10^5 constants of a 10^5-tensor lease
 * in O(n), not O(n^2)); a scan when the index cannot be made. Thread-safe;
 * takes no lock of the client. */
const wb__tensor_entry *wb__lease_lookup(const wb_lease *lease, const char *name);

/* Where a lease's tensor is: its bytes in this process, and its device (-1
 * for host memory). */
static inline const uint8_t *wb__entry_data(const wb_lease *l, const wb__tensor_entry *t)
{
    return (const uint8_t *)wb__map_addr(l->maps[t->slab]) + t->offset;
}
static inline int wb__entry_device(const wb_lease *l, const wb__tensor_entry *t)
{
    return wb__map_device(l->maps[t->slab]);
}

/* Sets up and frees the lease's lock and container state (lease_containers.c). */
void wb__lease_containers_init(wb_lease *lease);
void wb__lease_containers_free(wb_lease *lease);

/* Tells the broker (unless `tell` is 0) and frees the lease: unlinks it from
 * the client, drops its slab references. The caller holds client->mu when
 * the lease has a client, and has made wb__lease_begin_end return 0. Returns what the broker said
 * (0, its refusal, or WB_ECONN when it could not be told), with a message in err. */
int wb__lease_end(wb_lease *lease, int tell, wb_err *err);

/* Registers a container on a lease as its construction begins: it then
 * counts as one of the lease's containers, so the lease cannot be released
 * while the container reads it. `rec` must stay valid until
 * wb__lease_detach; heartbeats report it only once published. WB_ESTATE when
 * the lease's release has begun, WB_ENOMEM; a message in err. */
int wb__lease_attach(wb_lease *lease, const wb__container_rec *rec, wb_err *err);
/* The container is built: from now on heartbeats report its record with
 * these counts. `rec` must have been attached. */
void wb__lease_publish(wb_lease *lease, const wb__container_rec *rec, uint64_t bound_bytes,
                       uint32_t bound_tensors);
/* Undoes wb__lease_attach. */
void wb__lease_detach(wb_lease *lease, const wb__container_rec *rec);

/* Decides the end of a lease under its lock: 0 and no further registrations
 * if no container is registered, else the number registered (nothing
 * changes). */
unsigned wb__lease_begin_end(wb_lease *lease);

/* Fills beat->containers with the lease's registration count and
 * beat->container_records with copies of the published records (at most the
 * protocol's limit), both read under one lock. Free with
 * wb__lease_beat_free. Returns WB_ENOMEM (and leaves no records, the count
 * still set) when out of memory. */
int wb__lease_fill_beat(wb_lease *lease, Wbproto__LeaseBeat *beat);
void wb__lease_beat_free(Wbproto__LeaseBeat *beat);

#endif
