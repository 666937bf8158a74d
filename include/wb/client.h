/* libwbclient: lease shared model weights from a weightbroker daemon.
 *
 * A worker connects to the broker, acquires a lease on a model, reads the
 * tensor table (name -> pointer, dtype, shape), builds whatever it runs on
 * top of the shared bytes, and releases the lease when done. A background
 * thread sends heartbeats so the broker knows the lease is in use.
 *
 * Conventions: every function returns WB_OK (0) or a negative wb_status
 * code; wb_client_errmsg() then says what was wrong. The library never
 * aborts or exits the process, and never writes to stderr unless asked (see
 * "Logging" below).
 *
 * Threads. Every call on a client and its leases may run concurrently from
 * several threads, with two exceptions, calls that end an object:
 *   - wb_client_destroy: no other call on the client or its leases may run
 *     or start meanwhile.
 *   - wb_lease_release decides under the lease's lock, the lock that
 *     container registrations (wb_lease_container_add/remove,
 *     wb_container_create/destroy) change the lease's count under. While any
 *     container is registered, including one whose wb_container_create is
 *     still running, it returns WB_EBUSY and changes nothing, so it may race
 *     with those calls freely. Once it has ended the lease (any other return),
 *     the lease is gone: the caller must make sure that no other call on it
 *     (accessors, verify, a new registration) runs or starts after that, as
 *     with free(). Calls on the client's other leases are unaffected.
 * Exchanges with the broker are serialised inside the client (one request
 * at a time). wb_client_errmsg is per client: with several threads, the
 * message may be another thread's; the status code returned is always the
 * call's own. */
#ifndef WB_CLIENT_H
#define WB_CLIENT_H

#include "wb/export.h"
#include "wb/log.h"
#include "wb/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WB_LEASE_ID_BYTES 16

typedef struct wb_client wb_client;
typedef struct wb_lease wb_lease;

typedef struct wb_client_options {
    /* Broker socket path; NULL or "" resolves $WB_SOCKET, then
     * $XDG_RUNTIME_DIR/wbroker/broker.sock, then /run/wbroker/broker.sock
     * as root, else /tmp/wbroker-UID/broker.sock (UID: the effective uid). */
    const char *socket_path;
    /* Per-request timeout in milliseconds; 0 means $WB_TIMEOUT_MS or 5000
     * (a $WB_TIMEOUT_MS that is not a number of milliseconds from 1 to
     * 86400000 fails wb_client_create with WB_EINVAL naming it). */
    int timeout_ms;
    /* Nonzero: do not start the background heartbeat thread (the caller
     * then calls wb_client_heartbeat itself, or accepts going stale). */
    int no_heartbeat_thread;
    /* Free-form description sent in the hello, for the broker's log. */
    const char *client_name;
} wb_client_options;

/* Fills opts with the defaults described above. */
WB_EXPORT void wb_client_options_init(wb_client_options *opts);

/* Connects to the broker and says hello. On success *out is a new client.
 * On failure *out is still set (unless out of memory) so that the caller
 * can read wb_client_errmsg(); destroy it either way. Returns WB_ECONN when
 * the socket is missing or unreachable, WB_ETIMEDOUT when nothing answers
 * within the timeout, WB_EPERM when the broker refuses this process. */
WB_EXPORT int wb_client_connect(const wb_client_options *opts, wb_client **out);

/* Releases every lease without live containers (telling the broker when it
 * can), stops the heartbeat thread, closes the connection and sets *client
 * to NULL. Leases that still have live containers stay mapped (their memory
 * is never unmapped under a user), each reported by a warning to the log
 * handler (event client_destroy_busy_lease); wb_lease_release ends them
 * later. NULL is fine. */
WB_EXPORT void wb_client_destroy(wb_client **client);

/* The detailed message of the last failed call on this client or its leases.
 * Owned by the client; valid until the next call. Never NULL. */
WB_EXPORT const char *wb_client_errmsg(const wb_client *client);

/* 1 if the last exchange with the broker succeeded, 0 if it failed (broker
 * gone, restarted, or unreachable). Mappings stay valid either way. While it
 * is 0 the heartbeat thread reconnects (a new socket and a hello) 50 ms after
 * the failure, then at intervals doubling up to 2 s; any call made meanwhile
 * tries at once. A broker that restarted knows none of the old leases: they
 * become orphaned (see wb_lease_orphaned), and new ones can be acquired. */
WB_EXPORT int wb_client_connected(const wb_client *client);

/* Sends one heartbeat now with every lease's live container count. Leases the
 * broker no longer knows (it restarted) become orphaned: their memory stays
 * mapped and usable, and wb_lease_orphaned() says so. */
WB_EXPORT int wb_client_heartbeat(wb_client *client);

/* Acquires a lease on `model`. On success *out is a new lease owned by the
 * client (end it with wb_lease_release). WB_ENOTFOUND: no such model;
 * WB_ESTATE: the model is loading or draining, or its load failed (the
 * message says why); WB_ELIMIT: too many leases; WB_ETIMEDOUT: no reply
 * in time, or the model was still being brought back to its device when the
 * client's timeout ran out (see wb_lease_acquire_ex).
 * On a cuda broker the lease is for the calling thread's current CUDA
 * device, as wb_lease_acquire_ex with default options. */
WB_EXPORT int wb_lease_acquire(wb_client *client, const char *model, wb_lease **out);

/* The device a lease is for (wb_lease_options.device). */
#define WB_LEASE_DEVICE_CURRENT (-1) /* the calling thread's current CUDA device */
#define WB_LEASE_DEVICE_ANY     (-2) /* name none: the broker's first ready copy */

typedef struct wb_lease_options {
    /* This process's CUDA ordinal the worker runs on, or one of the
     * WB_LEASE_DEVICE_* values. The broker is told the device's UUID (its
     * ordinals differ from ours under another CUDA_VISIBLE_DEVICES) and
     * grants its copy there. Ignored by a host-memory broker. */
    int device;
    /* May be NULL. A device UUID ("GPU-..." as nvidia-smi -L prints it):
     * names the device instead of `device`, whether or not this process
     * sees it (mapping then needs it visible, or reachable as a peer). */
    const char *device_uuid;
    /* Nonzero: when the model has no copy on that device, accept a copy on
     * another device that this one reaches as a peer (slower: every read
     * crosses the link). Zero: such an acquire is refused, WB_ENOGPU. */
    int allow_peer;
} wb_lease_options;

/* wb_lease_acquire with options (NULL: the defaults, WB_LEASE_DEVICE_CURRENT
 * and no peer access). WB_ENOGPU with a message naming the device when this
 * process cannot see the device asked for, when the broker has no copy of
 * the model there, or when the copy it granted is on a device this process
 * cannot see (CUDA_VISIBLE_DEVICES).
 *
 * A model that the broker is bringing back to its device (from its host
 * memory tier, or reloading it from its files, under a device memory
 * budget) is answered WB_EBUSY with a time to ask again
 * (Reply.retry_after_ms); the call then waits that long (at least 1 ms, at
 * most 200 ms) and asks again, until the lease is granted, another answer
 * comes, or the client's timeout (wb_client_options.timeout_ms) counted from
 * the first request runs out. WB_ETIMEDOUT therefore also means that the
 * model was still not on its device when that time ran out: the message
 * names the model and ends with the broker's last answer ("acquire 'M':
 * still not on its device after 5000 ms: ..."); acquiring again later may
 * succeed. The client's lock is held for one request at a time, not across
 * the waits, so heartbeats and other threads' calls go on meanwhile. A
 * WB_EBUSY without a time to ask again is returned at once. */
WB_EXPORT int wb_lease_acquire_ex(wb_client *client, const char *model,
                                  const wb_lease_options *opts, wb_lease **out);

/* This process's CUDA ordinal of the lease's slab, or -1 for host memory. */
WB_EXPORT int wb_lease_device(const wb_lease *lease);

/* Ends a lease: tells the broker, drops this lease's reference to its slabs
 * (a slab is unmapped when no lease of this process uses it any more; a
 * host slab of a client with the heartbeat thread stays mapped one second
 * more, for this client's next lease on it, then the thread unmaps it) and
 * sets *lease to NULL. Returns WB_EBUSY, changing nothing, while containers
 * are registered on the lease. If the broker cannot be told, the lease is
 * still ended locally, *lease is set to NULL and WB_ECONN is returned. */
WB_EXPORT int wb_lease_release(wb_lease **lease);

WB_EXPORT const char *wb_lease_model(const wb_lease *lease);
/* The 16-byte lease id, owned by the lease. */
WB_EXPORT const uint8_t *wb_lease_id(const wb_lease *lease);
/* Writes the id as 32 lowercase hex digits plus NUL (33 bytes). */
WB_EXPORT void wb_lease_id_hex(const wb_lease *lease, char out[33]);
/* 1 if the broker that granted this lease no longer knows it (restart). */
WB_EXPORT int wb_lease_orphaned(const wb_lease *lease);
/* The version of the model this lease pins (Lease.version: 1 for a model
 * as loaded, 2, 3, ... for each rollout of its name). A lease keeps its
 * version for its whole life; a newer one needs a new acquire. 0 from a
 * broker that predates versions, and for NULL. */
WB_EXPORT uint32_t wb_lease_version(const wb_lease *lease);
/* 1 when the lease is on a published version whose checksums the broker
 * is still computing (Lease.checksums_pending): its tensors' xxh3 are 0 and
 * wb_lease_verify returns WB_ESTATE; a later acquire gets them. 0 for
 * NULL. */
WB_EXPORT int wb_lease_checksums_pending(const wb_lease *lease);

typedef struct wb_tensor_view {
    const char *name;      /* owned by the lease */
    const char *dtype;     /* "F32", "BF16", ... as in safetensors */
    uint32_t ndim;         /* 0 for a scalar */
    const uint64_t *shape; /* ndim entries, owned by the lease */
    const void *data;      /* host: read-only mapping; cuda: device pointer */
    uint64_t nbytes;
    uint64_t xxh3; /* checksum computed by the broker while loading */
    int device;    /* CUDA device ordinal, or -1 for host memory */
} wb_tensor_view;

WB_EXPORT size_t wb_lease_tensor_count(const wb_lease *lease);
/* Tensor number `index` (0-based, in the broker's order: by name, bytewise,
 * from brokers of this version). WB_EINVAL if out of range. */
WB_EXPORT int wb_lease_tensor(const wb_lease *lease, size_t index, wb_tensor_view *out);
/* Tensor by name. WB_ENOTFOUND if absent. */
WB_EXPORT int wb_lease_find(const wb_lease *lease, const char *name, wb_tensor_view *out);
/* n tensors by name at once, out[i] for names[i]: what a binder that looks
 * up every constant of a model calls. Faster than n calls of wb_lease_find
 * at 10^4 tensors and more (the lookups overlap their waits for memory).
 * WB_ENOTFOUND when any name is absent (its view is zeroed; the client's
 * error message names the first one and counts them), WB_EINVAL for a NULL
 * argument or name. */
WB_EXPORT int wb_lease_find_many(const wb_lease *lease, const char *const *names, size_t n,
                                 wb_tensor_view *out);

/* Recomputes every tensor's XXH3-64 over the mapped bytes and compares it
 * with the broker's. Returns WB_OK, or WB_ECORRUPT with *bad_index (if not
 * NULL) set to the first mismatching tensor. Device memory (cuda leases) is
 * copied to the host in 8 MiB chunks with cudaMemcpyAsync on a private
 * non-blocking stream of the lowest priority into pinned buffers, never with
 * a synchronous copy on the legacy stream nor a device-wide synchronisation,
 * so kernels of the same process keep running (the stream and the two 8 MiB
 * pinned buffers are made at the first verification on a device and kept
 * for the process's life; device tensors are hashed one at a time); without
 * CUDA in this build that returns WB_ENOSYS, without a usable GPU WB_ENOGPU,
 * with *bad_index set likewise. A lease whose checksums are pending
 * (wb_lease_checksums_pending) returns WB_ESTATE, checking nothing. */
WB_EXPORT int wb_lease_verify(const wb_lease *lease, size_t *bad_index);

/* Containers built on a lease. The AOTI binding registers each container it
 * builds, from the start of wb_container_create until wb_container_destroy;
 * a lease with registered containers cannot be released (WB_EBUSY). The
 * count travels to the broker with each heartbeat. These calls may run
 * concurrently with each other, with wb_container_create/destroy on the same
 * lease and with wb_lease_release (see "Threads" above). container_add that
 * comes while a release is ending the lease returns WB_ESTATE (after the
 * release has returned, the lease is gone); container_remove without a
 * matching add returns WB_EINVAL. */
WB_EXPORT int wb_lease_container_add(wb_lease *lease);
WB_EXPORT int wb_lease_container_remove(wb_lease *lease);
WB_EXPORT unsigned wb_lease_containers(const wb_lease *lease);

/* Versions. A model name points at its current version; a rollout makes a
 * new one current (an acquire then gets it) while leases keep theirs. A
 * client may subscribe to a model: the broker then tells it, on its
 * connection, when a new version of that model becomes current.
 *
 * The callback of a subscription: `model` (owned by the library, valid
 * during the call) has a new current version `version`; `previous` is the
 * version this client knew as current before (the one wb_client_subscribe
 * returned, or the last callback's), 0 when none. `arg` is the pointer given
 * to wb_client_subscribe. */
typedef void (*wb_version_fn)(void *arg, const char *model, uint32_t version, uint32_t previous);

/* Subscribes to `model` (which need not exist yet) and adds fn(arg, ...) to
 * its callbacks. The first subscription to a model sends one
 * SubscribeRequest to the broker; further callbacks for the same model send
 * nothing. After a reconnection (a broker restart, a re-created socket) the
 * library subscribes again by itself. *current (may be NULL) gets the
 * model's current version now, 0 when it has none.
 *
 * Callbacks run on the client's heartbeat thread (on a client made with
 * no_heartbeat_thread, inside wb_client_heartbeat on the caller's thread),
 * with no lock of the library held: a callback may acquire and release
 * leases, but should return soon, as no heartbeat goes out while it runs
 * (a swap belongs on a thread of its own: see wb_container_follow). Each
 * callback is called once per new current version: the broker's notice
 * and the current versions listed in its heartbeat replies (which catch up
 * with a notice that was lost) are deduplicated, and a version equal to the
 * last one announced is not announced again. A rollback, which makes an
 * older version current, is announced like any other. The notice wakes the
 * heartbeat thread as soon as it arrives.
 *
 * WB_ENOSYS, changing nothing, when the broker predates versions (it does
 * not know the request); WB_ELIMIT beyond WB_MAX_SUBSCRIPTIONS (64) models
 * per client; WB_EINVAL for a NULL callback or a bad name; a failed
 * exchange (WB_ECONN, WB_ETIMEDOUT) subscribes nothing. */
WB_EXPORT int wb_client_subscribe(wb_client *client, const char *model, wb_version_fn fn, void *arg,
                                  uint32_t *current);

/* Removes the callback (fn, arg) of `model`; the model's last callback
 * unsubscribes from the broker. Once it returns, fn is not called with arg
 * again, except that a callback running on this thread (an unsubscribe from
 * inside a callback) finishes the announcements already under way.
 * WB_ENOTFOUND when no such callback is subscribed. */
WB_EXPORT int wb_client_unsubscribe(wb_client *client, const char *model, wb_version_fn fn,
                                    void *arg);

/* Logging. libwbclient reports events (a container built, constants that
 * could not be shared, a lease left mapped at destroy) as log lines; it
 * writes nothing unless the host installs a handler, or sets the environment
 * variable WB_CLIENT_LOG to a level name (debug, info, warn, error) before the
 * first log line, which sends lines at that level and above to stderr.
 *
 * A line is one key=value record without newline, for example
 *   ts=2026-11-30T07:31:02.123Z level=info prog=wbclient event=container_ready model=...
 * valid only during the call. The handler may be called from any thread that
 * calls into the library (and from its heartbeat thread), also concurrently:
 * it must be thread-safe and must not block for long. Settings are
 * process-wide, for every client. */
typedef void (*wb_log_fn)(wb_log_level level, const char *line, void *userdata);

/* Installs fn (NULL: no handler, nothing is logged) with its userdata; it
 * replaces any handler, and $WB_CLIENT_LOG is then ignored. */
WB_EXPORT void wb_set_log_handler(wb_log_fn fn, void *userdata);
/* Lines below `level` are dropped before formatting. Default WB_LOG_INFO;
 * WB_LOG_OFF drops all. */
WB_EXPORT void wb_set_log_level(wb_log_level level);
/* A ready-made handler: writes the line and a newline to stderr with one
 * write(2). wb_set_log_handler(wb_log_stderr, NULL) shows on stderr what
 * earlier versions printed there unasked (now in the key=value format). */
WB_EXPORT void wb_log_stderr(wb_log_level level, const char *line, void *userdata);

#ifdef __cplusplus
}
#endif

#endif
