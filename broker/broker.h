/* The broker's state, independent of the transport: configuration, models,
 * leases, counters and the clocks. The request handlers (ops.h) and the
 * event loop (loop.h) work on it; unit tests drive it without sockets. */
#ifndef WB_BROKER_BROKER_H
#define WB_BROKER_BROKER_H

#include "auth.h"
#include "backend.h"
#include "broker_stats.h"
#include "leases.h"
#include "loader.h"
#include "models.h"
#include "quota.h"
#include "subs.h"

#include <stdint.h>

#define WB_DEFAULT_HEARTBEAT_MS 1000
#define WB_DEFAULT_STALE_MS     5000
/* Heartbeats a second that all peers together are asked for at most. */
#define WB_DEFAULT_HEARTBEAT_RATE 250

typedef struct wb_broker_config {
    const wb_backend *backend;
    int device;       /* the default device; -1 for host */
    wb_gpu_list gpus; /* the devices the broker sees, with UUIDs (empty for host) */
    uint32_t heartbeat_ms;
    uint32_t stale_ms;
    /* Heartbeats a second asked of all connected peers together: with more
     * peers than heartbeat_ms allows, the interval (and the stale window
     * with it) is stretched. 0: WB_DEFAULT_HEARTBEAT_RATE. */
    uint32_t max_heartbeat_rate;
    /* Streams per device a publish's copies are dealt to (--publish-streams;
     * 0: WB_DEFAULT_PUBLISH_STREAMS). */
    uint32_t publish_streams;
    /* Tensors equal to resident ones are shared across models (share.h),
     * unless --no-share-tensors; WB_TEST_SHARE_IGNORE_DIGEST=1, a test hook,
     * makes every same-shaped tensor a candidate (only the byte comparison
     * then tells them apart). */
    int no_share_tensors;
    int share_ignore_digest;
} wb_broker_config;

#define WB_DEFAULT_PUBLISH_STREAMS 4
/* Host tier buffers kept for reuse (tier.h) at most. */
#define WB_TIER_SPARES         4
#define WB_MAX_PUBLISH_STREAMS 8

/* The heartbeat interval and stale window the broker asks for now
 * (wb__broker_pace_heartbeats), and while a shrink reaches every peer, the
 * larger window that peers still on the old interval are judged by. */
typedef struct wb_heartbeat_pace {
    uint32_t interval_ms;
    uint32_t stale_ms;
    uint32_t old_stale_ms;
    int64_t old_until_ms; /* old_stale_ms applies before this time */
} wb_heartbeat_pace;

struct wb_metrics;

typedef struct wb_broker {
    wb_broker_config cfg;
    wb_model_registry models;
    wb_lease_table leases;
    wb_broker_stats stats;
    wb_heartbeat_pace pace;
    uint32_t euid;
    uint32_t pid;
    /* Random per run, so clients can tell a restarted broker (whose pid may
     * be the same, as PID 1 of a container) from the one they knew. */
    uint64_t instance;
    /* Who may lease and who may load (wb__broker_init: clients open,
     * administrators root and euid; wbrokerd sets its own policy). */
    wb_auth auth;
    wb_limits limits;
    /* The group slabs are given to (the socket directory's set-group-ID
     * group), or -1 to keep the broker's. */
    int64_t slab_gid;
    /* Clocks: monotonic milliseconds for liveness, Unix seconds for
     * reports. Tests replace them. */
    int64_t (*now_ms)(void);
    double (*now_wall)(void);
    int64_t started_ms;
    /* The Prometheus endpoint the loop publishes to, or NULL. */
    struct wb_metrics *metrics;
    /* Background loads; NULL runs loads inline (preloads, unit tests). */
    wb_loader *loader;
    /* Where published versions are checksummed (publish_sum.c); NULL runs
     * them inline. The read-back buffers it keeps (NULL until the first). */
    wb_loader *checker;
    struct wb_sum_pool *sum_pool;
    /* The shared-tensor index (share.h), or NULL (--no-share-tensors). */
    struct wb_share_index *share;
    /* The producer's CUDA IPC handles the last commit opened (publish_cuda.c;
     * the loader thread's), and whose they are, as the loop knows it: the
     * connection serial and pid (0: none cached). */
    struct wb_src_cache *src_cache;
    uint64_t src_cache_owner;
    uint32_t src_cache_pid;
    /* May be NULL; polled by the load of wb__broker_preload, nonzero stops
     * it (a stop signal while wbrokerd starts). */
    const atomic_int *cancel_preloads;
    /* The models each connection subscribed to, and how a VersionNotice
     * reaches a connection (the loop's; NULL: nobody is told). It returns
     * WB_OK when the notice was queued, else it was dropped. */
    wb_subs subs;
    int (*notify)(void *ctx, uint64_t serial, const Wbproto__VersionNotice *n);
    void *notify_ctx;
    /* The publishes under way (publish.h), owned. */
    struct wb_publish *publishes;
    /* The device memory budget (tier.h), or NULL (none); the host tier's
     * budget (0: none) and its bytes now; where moves and restores run
     * (NULL: inline). */
    struct wb_budget *budget;
    uint64_t host_budget;
    uint64_t host_tier_bytes;
    wb_loader *tier;
    /* Host copies dropped for room, kept for the next move of their size
     * (pinning memory costs far more than the copy: ~0.5 s a GiB). */
    struct {
        void *p;
        uint64_t size;
    } host_spare[WB_TIER_SPARES];
    unsigned n_host_spare;
} wb_broker;

void wb__broker_init(wb_broker *b, const wb_broker_config *cfg);

/* Sets b->pace for `peers` connected peers: heartbeat_ms, or the smallest
 * multiple of it at which they send at most max_heartbeat_rate heartbeats
 * a second together; the stale window grows by the same factor. Liveness
 * does not depend on it (pidfds and the descriptor channel report deaths at
 * once): heartbeats only tell a live but silent process, and carry container
 * records. Hello and heartbeat replies tell peers the current values. */
void wb__broker_pace_heartbeats(wb_broker *b, size_t peers, int64_t now_ms);
/* Frees every model (unlinking its slab names) and every lease. */
void wb__broker_destroy(wb_broker *b);

/* Bookkeeping after a lease on m ended (release or reclaim): a draining model
 * whose last lease this was is freed and removed. Returns the model's state
 * afterwards (MODEL_FREED in that case). */
int wb__broker_lease_ended(wb_broker *b, wb_model *m, unsigned copy);

/* Gives the ready model's slabs to b->slab_gid (when it is set). */
void wb__broker_share_slabs(wb_broker *b, wb_model *m);

/* Frees a model now: logs event=model_freed, removes it from the registry. */
void wb__broker_free_model(wb_broker *b, wb_model *m);

/* Makes the ready version m current (a load or rollout that finished, or a
 * rollback): the version it replaces drains (freed at once without leases),
 * every connection subscribed to its name is sent a VersionNotice
 * (notices_sent, notices_dropped), and both are logged
 * (event=model_version_current, event=model_version_draining). Returns the
 * version it replaced, 0 when there was none. */
uint32_t wb__broker_make_current(wb_broker *b, wb_model *m);

/* The versions no longer current that still hold memory (draining while a
 * version of their name is current). */
size_t wb__broker_versions_draining(const wb_broker *b);

/* Reclaims every lease of a process proven dead. Returns how many. */
size_t wb__broker_reclaim_pid(wb_broker *b, uint32_t pid);
/* The same for another proof of the end (logged as reason=`reason`): a
 * session's descriptor channel connection closed. */
size_t wb__broker_reclaim_why(wb_broker *b, uint32_t pid, const char *reason);

/* Before acting for a request from `pid`: when the process the broker
 * knows as `pid` has exited (a zero-timeout poll of its pidfd), its leases
 * are reclaimed now, so that a new process reusing the pid holds none of
 * them. Returns how many were reclaimed. */
size_t wb__broker_check_peer(wb_broker *b, uint32_t pid);

/* Marks leases stale whose heartbeats stopped. Returns how many changed. */
size_t wb__broker_scan_stale(wb_broker *b);

/* Tensor bytes of every resident model and version (logical) and the bytes
 * resident once (unique: shared tensors counted once, share.h). */
void wb__broker_share_bytes(const wb_broker *b, uint64_t *logical, uint64_t *unique);

/* Finishes a load (inline or from the loader thread): on success the model
 * named by the job becomes ready; on failure it is removed, or with
 * job->keep_failed kept as MODEL_FAILED with the error. Counts the load
 * (unless its checks refused it) and logs it. A load whose model was
 * unloaded meanwhile (wb__broker_cancel_load) only frees what it made
 * (logged as event=model_load_stopped) and gets the error that says who
 * cancelled it. Returns the job's status; *model is the ready model or
 * NULL. */
int wb__broker_finish_load(wb_broker *b, wb_load_job *job, wb_model **model);

/* Stops the load of a loading model for an unload from `peer` (`how`:
 * WB_LOAD_CANCELLED or WB_LOAD_UNLOADED): the model leaves the registry and
 * is freed now, its job is cancelled in the loader (one still queued never
 * starts) and comes back to wb__broker_finish_load, which frees what it had
 * made and answers its request with the error. Counted (loads_cancelled)
 * and logged (event=model_load_cancelled). */
void wb__broker_cancel_load(wb_broker *b, wb_model *m, const wb_peer_creds *peer, int how);

/* Registers `name` as a model whose load failed (MODEL_FAILED with `why`),
 * in place of a failed record of that name: the broker lists it with its
 * error and refuses its leases with it until a load of that name replaces
 * it or an unload removes it. For the preloads that failed: the broker
 * serves the others. A name held by a model that is not a failed record is
 * left alone (WB_EEXIST). */
int wb__broker_keep_failed(wb_broker *b, const char *name, const char *path, const char *why,
                           wb_err *err);

/* Arms a load's checks (wb_load_job.check): the path
 * (wb__auth_check_load_path, logged with its resolved target), the
 * requesting peer's own access to every file of the checkpoint (`peer` NULL
 * for the operator's --model preloads: not judged) and what the configured
 * limits can judge from the files' bytes before they are parsed. They run
 * with the load, on the loader's thread: a big index is parsed, and every
 * shard opened, off the event loop. A refusal is the load's reply, the
 * model removed and the load not counted (wb__broker_finish_load). */
void wb__broker_check_job(const wb_broker *b, const wb_peer_creds *peer, wb_load_job *job);

/* Counts one reply for the metrics (wb_requests_total{op,status}). */
void wb__broker_count_request(wb_broker *b, uint32_t op, int status);

/* Loads a model before serving (--model NAME=PATH), in the calling thread,
 * in place of a failed record of that name. On failure nothing of it is
 * left (see wb__broker_keep_failed). */
int wb__broker_preload(wb_broker *b, const char *name, const char *path, const char *placement,
                       wb_err *err);

/* Gives a new model and its load job the devices from wb__broker_placement. */
void wb__broker_set_devices(const wb_broker *b, wb_model *m, wb_load_job *job, const int *devices,
                            unsigned n);

/* The devices a model's copies go to: `placement` ("0,1", "all", "GPU-...";
 * NULL or empty: the broker's --device) resolved against the devices the
 * broker sees. The host backend keeps one copy in host memory and ignores
 * the placement (devices = {-1}). WB_EINVAL or WB_ENOGPU with a message that
 * names the model and the fault. `devices` has room for WB_GPU_MAX. */
int wb__broker_placement(const wb_broker *b, const char *name, const char *placement, int *devices,
                         unsigned *n, wb_err *err);

#endif
