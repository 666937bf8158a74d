/* The lease table: who holds which model, and since when.
 *
 * Pure bookkeeping: no sockets, no clocks of its own (callers pass the time,
 * so tests can move it), no knowledge of what a model is. Leases are kept in
 * an array sorted by their 16-byte random id; per-pid peer records (sorted
 * by pid) hold the pidfd that proves the holder's death, the process's name,
 * the number of leases the pid holds and the bytes of container records its
 * leases keep. A peer record outlives its last lease (so that a process that
 * acquires and releases in a loop does not pay pidfd_open and a read of
 * /proc/<pid>/comm each time) until its pidfd reports the exit; at most
 * WB_IDLE_PEERS_MAX records without leases are kept, the surplus is closed
 * at once.
 *
 * A lease belongs to the process that acquired it: the same pid, the same
 * uid, and the process the peer record's pidfd watches (the broker reclaims
 * a pid's leases before acting for a new process that reuses the pid). A
 * peer whose pid the broker cannot see is known by a session id in place
 * of the pid (WB_IS_SESSION_ID, common/fdchan_wire.h): its record has no pidfd
 * and no name from /proc; the session's end reclaims its leases. */
#ifndef WB_BROKER_LEASES_H
#define WB_BROKER_LEASES_H

#include "err.h"
#include "peer.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

struct wb_model;

/* Peer records without leases kept open at most (each holds a pidfd). */
#define WB_IDLE_PEERS_MAX 256

typedef struct wb_peer_rec {
    uint32_t pid;
    uint32_t uid; /* of the first grant (a session's uid for a session id) */
    int pidfd;
    uint32_t leases;
    char comm[32];         /* /proc/<pid>/comm when the record was made */
    uint64_t record_bytes; /* container records kept for its leases */
} wb_peer_rec;

/* A container record as the broker keeps it, from the last heartbeat. The
 * strings live in the same allocation as the array. */
typedef struct wb_container_rec {
    uint64_t id;
    uint64_t bound_bytes;
    uint64_t folded_bytes;
    uint64_t embedded_bytes;
    uint64_t package_bytes;
    double created_at;
    uint32_t bound_tensors;
    /* How the container bound its constants (see ContainerRecord). */
    uint32_t leased_constants, aliased_constants, caller_constants, package_constants;
    uint32_t folded_constants, unbound_constants;
    int pinned_async_copy;
    uint32_t swaps;      /* versions swapped into the container (ContainerRecord.swaps) */
    double last_swap_ms; /* how long the last swap took */
    const char *aoti_api;
    const char *model_path;
} wb_container_rec;

typedef struct wb_lease_rec {
    uint8_t id[WB_LEASE_ID_LEN];
    struct wb_model *model; /* not owned */
    unsigned copy;          /* which of the model's copies (wb_model_copy) */
    uint32_t pid;
    uint32_t uid;
    uint32_t gid;
    char comm[32];         /* /proc/<pid>/comm at grant time */
    int state;             /* WBPROTO__LEASE_STATE__LEASE_ACTIVE or _STALE */
    uint32_t containers;   /* as last reported by the client */
    double granted_at;     /* Unix seconds */
    double last_heartbeat; /* Unix seconds; the grant time until the first heartbeat */
    int64_t last_beat_ms;  /* monotonic milliseconds of the grant or last heartbeat */
    /* The container records of the last heartbeat: one allocation of
     * record_bytes bytes (counted in the peer's record_bytes), or NULL. */
    wb_container_rec *records;
    uint32_t n_records;
    uint64_t record_bytes;
} wb_lease_rec;

/* Opens the pidfd of a new peer; returns a descriptor or a negative WB_E*. */
typedef int (*wb_pidfd_open_fn)(uint32_t pid, wb_err *err);

typedef struct wb_lease_table {
    wb_lease_rec **leases; /* sorted by id */
    size_t n_leases;
    size_t cap_leases;
    wb_peer_rec **peers;
    size_t n_peers;
    size_t cap_peers;
    size_t n_holders;            /* peers with at least one lease */
    wb_pidfd_open_fn open_pidfd; /* wb__pidfd_open unless a test replaces it */
    /* When >= 0, every pidfd is added to this epoll set once, with the pid
     * as its data (closing the pidfd removes it): the event loop waits on
     * one descriptor instead of a poll array of every peer. */
    int epfd;
    /* Set by the caller for the request being handled: the pidfd of the
     * process that sent it (its connection's, -1: none) and its pid. A new
     * peer record of that pid watches a duplicate of it rather than a
     * pidfd_open of the number, which could name a process that reused
     * the pid. */
    uint32_t hint_pid;
    int hint_pidfd;
} wb_lease_table;

void wb__leases_init(wb_lease_table *t);
/* Frees every lease and peer record and closes every pidfd. */
void wb__leases_destroy(wb_lease_table *t);

/* Grants a new lease on `model` to the peer `c` (which must be known). The
 * first lease of a pid opens its pidfd and reads its name (/proc/<pid>/comm;
 * `comm`, when not NULL, replaces that read): WB_EPERM if the process is
 * already gone. On success *out points to the new record, owned by the
 * table. */
int wb__leases_grant(wb_lease_table *t, struct wb_model *model, const wb_peer_creds *c,
                     const char *comm, int64_t now_ms, double now_wall, wb_lease_rec **out,
                     wb_err *err);

/* Looks a lease up by id; NULL if absent. */
wb_lease_rec *wb__leases_find(const wb_lease_table *t, const uint8_t *id);

/* Removes a lease held by the peer `c` (same pid and uid). WB_ENOTFOUND
 * "no lease <8 hex>" for an unknown id, WB_EPERM "lease <8 hex> belongs to
 * pid N" for another pid's lease, "... belongs to pid N (uid U)" when only
 * the uid differs. On success *model is the model the lease was on. */
int wb__leases_release(wb_lease_table *t, const wb_peer_creds *c, const uint8_t *id,
                       struct wb_model **model, wb_err *err);

/* Whether the peer `c` holds lease `l` (same pid and uid). */
int wb__lease_held_by(const wb_lease_rec *l, const wb_peer_creds *c);

/* Replaces the container records of a lease with `records` (n of them, one
 * allocation of `bytes` bytes that the table takes over; NULL for none) and
 * moves the holder's record_bytes accordingly. */
void wb__leases_set_records(wb_lease_table *t, wb_lease_rec *l, wb_container_rec *records,
                            uint32_t n, uint64_t bytes);

/* Removes a lease record, whoever holds it, and frees it. */
void wb__leases_remove(wb_lease_table *t, wb_lease_rec *lease);

/* Records a heartbeat from the peer `c` for lease `id`. Returns WB_OK, or
 * WB_ENOTFOUND when the id is unknown or held by another process (pid or
 * uid). *revived is set to 1 when the lease was stale and is active again. */
int wb__leases_heartbeat(wb_lease_table *t, const wb_peer_creds *c, const uint8_t *id,
                         uint32_t containers, int64_t now_ms, double now_wall, int *revived);

typedef void (*wb_lease_cb)(wb_lease_rec *lease, void *ctx);

/* Marks stale every active lease silent for longer than stale_ms; calls cb
 * (if not NULL) once per newly stale lease. Returns how many became stale. */
size_t wb__leases_mark_stale(wb_lease_table *t, int64_t now_ms, int64_t stale_ms, wb_lease_cb cb,
                             void *ctx);

/* Removes every lease of `pid` (its death was proven), calling cb before each
 * record is freed, and forgets the peer (closing its pidfd). Returns the
 * number of leases removed. One pass over the table. */
size_t wb__leases_reclaim_pid(wb_lease_table *t, uint32_t pid, wb_lease_cb cb, void *ctx);

/* The peer record of a pid (binary search); NULL if the table has none (a
 * record may hold no lease). */
wb_peer_rec *wb__leases_peer(const wb_lease_table *t, uint32_t pid);

/* What the peer `c` holds for its quotas: its own record's leases and
 * container record bytes, or, for a peer known by a session id (its pid
 * hidden), those of every session of its uid together, so that opening
 * more sessions buys no more. */
/* Either output may be NULL. */
void wb__leases_quota_use(const wb_lease_table *t, const wb_peer_creds *c, uint32_t *leases,
                          uint64_t *record_bytes);

/* Number of leases in a state (WBPROTO__LEASE_STATE__*). */
size_t wb__leases_count_state(const wb_lease_table *t, int state);

/* The first four bytes of an id as 8 hex digits, for logs and messages
 * (the whole id: wb__text_hex). */
const char *wb__lease_id_short(const uint8_t *id, char out[9]);

#endif
