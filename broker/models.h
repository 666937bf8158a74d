/* The model registry: every model the broker has loaded, is loading, or is
 * draining, in the order they were added. */
#ifndef WB_BROKER_MODELS_H
#define WB_BROKER_MODELS_H

#include "auth_files.h"
#include "backend.h"
#include "devlist.h"
#include "err.h"
#include "shm.h"
#include "wb.pb-c.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_model_tensor {
    char *name;     /* owned */
    char dtype[16]; /* as spelled in safetensors */
    uint32_t ndim;
    uint64_t *shape; /* owned, ndim entries */
    uint32_t slab;
    uint64_t offset; /* in the slab, WB_SLAB_ALIGN-aligned */
    uint64_t nbytes;
    uint64_t xxh3;
} wb_model_tensor;

/* A model's copy on one device: one slab with the same layout as every other
 * copy (the tensor table is shared). A load that fails on one device marks
 * that copy failed and leaves the others ready. */
typedef struct wb_model_copy {
    int device;                  /* the broker's CUDA ordinal; -1 for host */
    char uuid[WB_GPU_UUID_SIZE]; /* "" for host */
    int state;                   /* MODEL_READY or MODEL_FAILED */
    char error[WB_ERR_MSG_MAX];  /* why it failed */
    double copy_seconds;         /* its copies' device time, or 0 */
    uint32_t leases;
} wb_model_copy;

/* What a load produces. */
typedef struct wb_model_data {
    size_t n_tensors;
    wb_model_tensor *tensors; /* owned */
    /* One slab per copy: slabs[i] belongs to copies[i] (a failed copy's is
     * freed and zeroed). */
    uint32_t n_slabs;
    wb_slab *slabs; /* owned; freed through the backend */
    uint32_t n_copies;
    wb_model_copy *copies; /* owned */
    uint64_t bytes;        /* sum of tensor bytes */
    uint64_t slab_bytes;   /* sum of the ready copies' slab sizes */
    double load_seconds;
    double load_gbps;
    /* Where the load's time went: reading and validating the headers,
     * allocating the slab, reading and checksumming the tensors, sealing. */
    double open_seconds;
    uint32_t headers_remembered; /* files the memo had: headers, a shard index */
    double alloc_seconds;        /* staged: overlapped with the first reads */
    double read_seconds;
    double seal_seconds; /* making the filled slabs read-only */
    unsigned read_threads;
    /* The pipeline's figures per stage (stage.h), and the time spent
     * registering file mappings (mapped loads). */
    wb_stage_stats stage;
    double register_seconds;
    /* Tensors shared with other models (share.h): a tensor at slab g + 1
     * lives in borrowed group g, whose hold on copy k's device is
     * borrowed[g * n_stride + k] (one count each); holds[k] is the index's
     * record of own slab k, or NULL (NULL array: none listed). */
    uint32_t n_groups;
    uint32_t n_stride;
    struct wb_share_hold **borrowed;
    struct wb_share_hold **holds;
    uint64_t shared_bytes; /* tensor bytes in borrowed slabs */
    uint32_t shared_tensors;
} wb_model_data;

/* The slab that holds tensor t on copy k (its own, or a borrowed one),
 * copied: NULL fields when there is none. */
void wb__model_tensor_slab(const wb_model_data *d, uint32_t k, const wb_model_tensor *t,
                           wb_slab *out);
/* The slabs of copy k in a lease's order (own first, then the borrowed
 * groups): up to max of them into out; returns how many there are. */
uint32_t wb__model_copy_slabs(const wb_model_data *d, uint32_t k, wb_slab **out, uint32_t max);

/* Frees the slabs (through `be`) and the tensor table; zeroes *d. */
void wb__model_data_free(wb_model_data *d, const wb_backend *be);

/* The wire view of one copy: its slab, and a Lease on it packed once. */
typedef struct wb_model_wire {
    Wbproto__Slab slab;
    Wbproto__Slab *slab_ptr;
    /* Every slab of the copy's lease: slab_ptrs[0] is &slab, then the
     * borrowed groups' (xslabs, whose shm names are the wire's own copies:
     * a borrowed slab's owner may go). n_slab_ptrs = 1 + data.n_groups. */
    Wbproto__Slab **slab_ptrs;
    Wbproto__Slab *xslabs;
    size_t n_slab_ptrs;
    size_t lease_size; /* packed size of a Lease on this copy */
    /* A Lease on this copy packed once, without its id: the fields from
     * `model` on (model, slabs, tensors). Every acquire reply carries these
     * bytes as they are instead of packing 10^5 tensors again. NULL when
     * memory was short (the reply is then packed field by field). */
    uint8_t *lease_tail;
    size_t lease_tail_len;
    /* A Lease tail that carries only the slab and tensor_table_cached: the
     * reply to a client that already holds the model's table. */
    uint8_t *cached_tail;
    size_t cached_tail_len;
    /* The same with tensor_table_in_frame: the reply to a client that reads
     * the table (wb_model.table) from a second frame. */
    uint8_t *frame_tail;
    size_t frame_tail_len;
    /* The same with tensor_table_slab (wb_model.table_shm): the reply to a
     * client that maps the shared table. NULL when there is none. */
    uint8_t *shared_tail;
    size_t shared_tail_len;
} wb_model_wire;

enum { WB_CHECKSUMS_READY = 0, WB_CHECKSUMS_PENDING = 1, WB_CHECKSUMS_FAILED = 2 };

typedef struct wb_model {
    char *name; /* owned */
    char *path; /* owned */
    int state;  /* WBPROTO__MODEL_STATE__* */
    /* Versions: every version of a name is its own record. `version` is 1
     * for a load, the next one issued for each rollout; `issued` is the
     * highest version issued for the name while any record of it exists
     * (wb__models_issue keeps it on every record of the name). `current`:
     * the version new acquires get (MODEL_READY); a ready record is
     * current once its load ends, until another version replaces it. */
    uint32_t version;
    uint32_t issued;
    int current;
    const wb_backend *backend;
    int device; /* the first ready copy's (before the load: the first asked for); -1 for host */
    /* The devices asked for (the broker's ordinals), in order; one entry,
     * -1, for the host backend. */
    unsigned n_devices;
    int devices[WB_GPU_MAX];
    wb_model_data data;
    /* Its load while MODEL_LOADING (the job the loader reports progress
     * in; owned by the loader or the loop, never by the model), else NULL. */
    struct wb_load_job *job;
    /* Why the load failed (MODEL_FAILED; owned), else NULL. */
    char *error;
    uint32_t leases;
    /* The wire view, built once when the model becomes ready; every acquire
     * reply points at it. Tensors are shared, slabs are per copy. */
    Wbproto__Tensor *wire_tensors;
    Wbproto__Tensor **wire_tensor_ptrs;
    wb_model_wire *wire; /* data.n_copies entries */
    /* The compact tensor table (common/wire.h), packed once, the same for
     * every copy; NULL when memory was short. */
    uint8_t *table;
    size_t table_len;
    /* The same bytes published once in a read-only shared memory object
     * for every client (AcquireRequest.tensor_table_shared), by a broker
     * whose slabs are named shm objects or CUDA IPC handles; table_shm.addr
     * is NULL when there is none (another transport, or it could not be
     * made). Unlinked and
     * unmapped with the model; clients' mappings outlive the name. */
    wb_shm table_shm;
    Wbproto__Slab table_slab;
    size_t wire_lease_size; /* the largest of the copies' lease sizes */
    /* XXH3-128 of the compact table (canonical bytes; the tensors are the
     * same on every copy): a client that names it gets a copy's cached_tail. */
    uint8_t table_digest[16];
    /* A version published from a producer's memory (publish.h): who
     * published it (published set), and while it is MODEL_LOADING the
     * publish that reserved it (not owned), else NULL. */
    int published;
    /* Loaded with LoadRequest.no_share: shares no tensor (and its rollouts
     * neither). */
    int no_share;
    uint32_t published_by_pid;
    uint32_t published_by_uid;
    /* A published version's checksums: WB_CHECKSUMS_READY (also every
     * loaded version), or still being computed by the broker (PENDING:
     * its tensors' xxh3 are 0 and its leases say so,
     * Lease.checksums_pending; wb__model_rewire once they are known), or
     * FAILED (the read-back failed; its leases stay unverifiable). */
    int checksums_state;
    /* Its checksum job while one is queued or running (publish_sum.c; owned
     * by the checker or the loop), else NULL. */
    struct wb_load_job *sum_job;
    struct wb_publish *publish;
    /* The device memory budget (tier.h): WB_TIER_DEVICE while its slabs are
     * on its devices. Its own slabs' bytes kept in host memory (the
     * backend's host_alloc: pinned for cuda), or NULL; host_bytes of them.
     * tier_job: the move, restore or reload under way (the model is pinned
     * by one count on its leases meanwhile), else NULL. tier_wanted: an
     * acquire or a wake asked for it while it moved. tier_rc/tier_error:
     * the last restore's failure, told to the next acquire. registered:
     * its slabs were listed in the share index (listed again on restore). */
    int tier;
    void *host_copy;
    uint64_t host_bytes;
    uint64_t tier_slab_bytes; /* the size of each own slab, as it was on the device */
    struct wb_load_job *tier_job;
    int tier_wanted;
    int tier_rc;
    char *tier_error;
    int registered;
    /* Whose access its load's files were judged by (a preload's: nobody's);
     * a reload of the evicted model is judged by it again. */
    wb_load_access access;
    int64_t used_ms;  /* its last acquire or release (monotonic), or ready */
    double used_wall; /* the same, Unix time */
    uint32_t restores;
    double restore_seconds, restore_gbps, restore_at;
    struct wb_model *next;
} wb_model;

/* A new model in state MODEL_LOADING, or NULL when out of memory. `devices`
 * (n of them, at most WB_GPU_MAX) are where its copies go; n == 0 means
 * `device` alone. */
wb_model *wb__model_new(const char *name, const char *path, const wb_backend *be, int device);
/* Sets the devices the copies go to (n >= 1, at most WB_GPU_MAX). */
void wb__model_set_devices(wb_model *m, const int *devices, unsigned n);
/* Frees the model's memory and slabs (their names are unlinked); sets *m to
 * NULL. The model must not be in a registry. */
void wb__model_free(wb_model **m);

/* Makes the model MODEL_FAILED with `why` (copied): whatever it held (its
 * slabs, its wire view) is freed, so that the record holds no memory. */
void wb__model_fail(wb_model *m, const char *why);

/* Takes the load's result (moving it out of *data), builds the wire view and
 * makes the model MODEL_READY (at least one copy is ready: the loader fails
 * a load that has none). On failure (out of memory) nothing changes and
 * *data still owns everything. */
int wb__model_adopt(wb_model *m, wb_model_data *data, wb_err *err);

/* Builds the wire view again from m->data (the tensors' checksums
 * changed): later acquire replies carry the new bytes, and the table's
 * digest with them. On failure (out of memory) the old view stays. */
int wb__model_rewire(wb_model *m, wb_err *err);

/* Which copy a lease gets. With `uuid` (non-empty) the copy on that device,
 * else with `device_set` the copy on the broker's ordinal `device`, else the
 * first ready copy. A device with no ready copy is refused (WB_ENOGPU naming
 * the device and the devices that have one) unless `allow_peer`: then the
 * first ready copy. For the host backend the one copy, whatever is asked.
 * *copy gets the index into data.copies. */
int wb__model_pick_copy(const wb_model *m, int device_set, int device, const char *uuid,
                        int allow_peer, unsigned *copy, wb_err *err);

typedef struct wb_model_registry {
    wb_model *head;
    wb_model *tail;
    size_t n;
} wb_model_registry;

/* The record that stands for a name: its current version, else one
 * loading, else its highest draining version, else its failed record;
 * NULL when the registry has none of that name. */
wb_model *wb__models_find(const wb_model_registry *r, const char *name);
/* The current version of a name (MODEL_READY and current), or NULL. */
wb_model *wb__models_current(const wb_model_registry *r, const char *name);
/* A version of the name in `state` (the highest such), or NULL. */
wb_model *wb__models_in_state(const wb_model_registry *r, const char *name, int state);
/* Version `version` of the name, or NULL. */
wb_model *wb__models_version(const wb_model_registry *r, const char *name, uint32_t version);
/* The versions of a name that count against --max-versions: loading,
 * ready and draining ones (not a failed record, which holds no memory). */
size_t wb__models_versions(const wb_model_registry *r, const char *name);
/* The next version for a new record of the name: the highest issued while
 * any record of it exists, plus one (1 for a name the registry does not
 * hold). Every record of the name remembers it. */
uint32_t wb__models_issue(wb_model_registry *r, const char *name);
/* Models that count against --max-models: the names with a record that
 * is not a failed one (the versions of one name count once; failed records
 * hold no memory). */
size_t wb__models_held(const wb_model_registry *r);
/* Names in the registry, whatever their records' states. */
size_t wb__models_names(const wb_model_registry *r);
void wb__models_add(wb_model_registry *r, wb_model *m);
/* Unlinks m from the registry; does not free it. */
void wb__models_remove(wb_model_registry *r, wb_model *m);
/* Removes and frees every model. */
void wb__models_clear(wb_model_registry *r);

/* 1 if a name is 1..255 characters of [A-Za-z0-9._-]. */
int wb__model_name_valid(const char *name);

#endif
