/* The insides of wb_client: its connection, locks, clock and lease list.
 * The lease modules (lease.h) use it to talk to the broker; it knows leases
 * only as a list of struct wb_lease.
 *
 * Locks. Every mutex of libwbclient, what it guards, and when it is held:
 *   wb_client.mu      the connection (rpc, hello and session state, the
 *                     backoff), the lease list, the table cache, the
 *                     lingering mappings. Held across every exchange with
 *                     the broker, so whoever waits for it may wait a whole
 *                     request timeout: acquire, release once it is allowed,
 *                     heartbeats, reconnection, subscriptions and destroy
 *                     take it, and the heartbeat thread to read notices off
 *                     the socket (an acquire told to ask again, WB_EBUSY
 *                     with retry_after_ms, lets go of it while it waits and
 *                     takes it again for each attempt); lookups, accessors,
 *                     verification, container registrations, container runs
 *                     and updates and the messages of their failures never
 *                     do.
 *   chan_mu           (fdchan.c) the process's descriptor channels. Held
 *                     across an exchange on a channel, always under
 *                     wb_client.mu (an acquire's fetch, the hello's session)
 *                     or across fork().
 *   cache_mu          (mapcache.c) the process's slab mappings; held while
 *                     mapping or unmapping one, never across an exchange.
 *   wb_client.hb_mu   the heartbeat thread's stop and kick flags.
 *   wb_client.sub_mu  (subs.c) the subscriptions: models, their callbacks,
 *                     the versions known and announced, whether callbacks
 *                     run now. Taken under wb_client.mu by the notice hook,
 *                     heartbeat replies and (un)subscribe, and alone by the
 *                     callbacks' dispatch, which calls the callbacks with no
 *                     lock held.
 *   wb_lease.mu       (lease.h) a lease's containers, and the name index of
 *                     a lease without a shared table.
 *   wb__table.mu      (lease.h) a shared table's entries and name index.
 *   wb_client.err_mu  the writers of the client's messages (err); readers
 *                     take no lock.
 *   clog_mu           (clog.c) the log handler and level; the handler is
 *                     called outside it (but may be under wb_client.mu or
 *                     cache_mu: a warning at destroy or while unmapping).
 *   kept_mu           (verify.c) the kept device verifiers; held across a
 *                     tensor's device copies.
 *   container locks   (aoti_impl.h) a container's update_mu (serialises
 *                     updates, taken before the others), run_lock (a
 *                     rwlock: runs shared, the swap exclusive), streams_mu
 *                     and follow_mu (leaves). A container's updates take
 *                     wb_lease.mu under update_mu (registrations) and never
 *                     wb_client.mu; a follower thread takes wb_client.mu
 *                     (acquire, release) with none of them held.
 * Order: a lock is taken only while holding none, or only locks it is
 * listed under here:
 *   wb_client.mu > chan_mu, cache_mu, hb_mu, sub_mu, wb_lease.mu, err_mu
 *   cache_mu > clog_mu (a warning while unmapping)
 *   update_mu > run_lock, streams_mu, wb_lease.mu, clog_mu
 * Every other pair is never nested: err_mu, hb_mu, sub_mu, wb_lease.mu,
 * wb__table.mu, clog_mu and kept_mu are leaves (nothing is taken under
 * them), and the heartbeat thread lets go of hb_mu before it takes
 * wb_client.mu. The once-only initialisers (lease.c's device list,
 * fdchan.c's fork handlers, the driver's entry points) may run under
 * wb_client.mu or cache_mu and take none of these. Only wb_client.mu and
 * chan_mu are ever held across an exchange with the broker. */
#ifndef WB_CLIENT_IMPL_H
#define WB_CLIENT_IMPL_H

#include "wb/client.h"

#include "err.h"
#include "rpc.h"

#include <pthread.h>
#include <stdatomic.h>

/* How long a host slab stays mapped after the last lease on it ended, and
 * how many such mappings a client keeps (the oldest goes first). Only a
 * client with the heartbeat thread keeps any: the thread unmaps each when
 * due, so memory of a model unloaded meanwhile is held at most this long
 * after its last release. */
#define WB_MAP_LINGER_MS 1000
#define WB_LINGER_MAPS   8

/* Messages a client keeps (wb_client.err). */
#define WB_CLIENT_MSGS 4

struct wb__map;
struct wb__sub;

struct wb_client {
    /* Held around every exchange with the broker and every change of the
     * lease list; the heartbeat thread takes it too (see "Locks" above). */
    pthread_mutex_t mu;
    wb__rpc rpc;
    /* The messages of the last failed calls (wb_client_errmsg). Each is
     * written whole under err_mu alone (wb__client_fail), so that a lookup
     * that fails never waits for an exchange with the broker, into the slot
     * after the newest, and then published in err_last: a reader sees one
     * whole message while other threads fail, and it stays as it was
     * through the next WB_CLIENT_MSGS - 1 failures. */
    pthread_mutex_t err_mu;
    wb_err err[WB_CLIENT_MSGS];
    atomic_uint err_last;
    /* The clock of the heartbeat thread's schedule, the reconnection backoff
     * and the lingering mappings: wb__clock_mono_ms, or a test's (wb__client_clock).
     * An exchange's own waits are real time (zmq_poll). */
    int64_t (*now_ms)(void);
    atomic_int connected;
    struct wb_lease *leases; /* linked through wb_lease.prev/next, under mu */
    /* The tensor tables of recent acquires, one per model, under mu; each
     * holds a reference (wb__table). Slot `tables_next` is replaced next. */
    struct wb__table *tables[8];
    unsigned tables_next;
    /* A shared tensor table (Lease.tensor_table_slab) could not be mapped
     * here (e.g. no /dev/shm shared with the broker): the next acquires
     * ask for the table as a frame instead. Under mu. */
    int table_shared_off;

    uint32_t broker_pid;
    /* What the broker asked for, at hello and in every heartbeat reply (it
     * stretches them when many peers are connected); the heartbeat thread
     * reads them without the lock. */
    atomic_uint heartbeat_ms;
    atomic_uint stale_ms;

    /* Reconnection, under mu except where atomic. A failed exchange clears
     * `connected`; the next call, or the heartbeat thread once
     * next_reconnect_ms has passed, opens a new socket and says hello again.
     * A broker with another instance id knows none of the leases. */
    char hello_name[128];
    int hello_done;
    /* The descriptor channel session the last hello carried (fdchan.h):
     * when its connection ends (the broker restarted, or closed it), the
     * next call says hello again with a fresh token. */
    uint8_t session[16];
    int has_session;
    uint64_t broker_instance;
    int broker_backend;  /* WBPROTO__BACKEND__* from the last hello */
    uint32_t backoff_ms; /* 0 while connected */
    _Atomic int64_t next_reconnect_ms;
    atomic_uint reconnect_attempts;
    atomic_uint reconnects;

    /* Called under mu when a hello finds another broker run than the one
     * that granted the leases. */
    void (*on_restart)(wb_client *c);

    /* The heartbeat thread sleeps in poll(2) on `hb_wake` (an eventfd) so
     * destroy can wake it, and so can a lingering mapping due before its
     * next beat, a notice read by another thread, or a test that moved the
     * clock (hb_kick); with subscriptions it also polls the socket's
     * ZMQ_FD, so that a notice wakes it at once. The first beat is due at
     * `hb_first_ms`, an interval after the hello, however late the thread
     * starts; `hb_idle_ms` is the clock's reading when the thread last
     * found nothing due and went to sleep. */
    int hb_started;
    pthread_t hb_thread;
    pthread_mutex_t hb_mu;
    int hb_wake;
    int hb_stop;
    int hb_kick;
    int64_t hb_first_ms;
    _Atomic int64_t hb_idle_ms;

    /* Host slab mappings kept for WB_MAP_LINGER_MS after the last lease on
     * them ended, one mapping cache reference each (wb__client_linger), so
     * that a worker acquiring and releasing a model in a loop maps its slabs
     * once: an acquire on a lingering slab makes no system call for it.
     * Under mu; `linger_due_ms` (the earliest `linger_until`, 0 with none)
     * is read by the heartbeat thread without it. */
    struct wb__map *linger[WB_LINGER_MAPS];
    int64_t linger_until[WB_LINGER_MAPS];
    _Atomic int64_t linger_due_ms;

    /* Subscriptions (subs.c), under sub_mu. `sub_gen` is the rpc socket
     * generation they were sent on: another one (a reconnection, a socket
     * re-created after a timeout) is a new connection to the broker, which
     * knows none of them, so they are sent again. `sub_pending`: a version
     * to announce (read without the lock by the heartbeat thread). */
    pthread_mutex_t sub_mu;
    pthread_cond_t sub_cond;
    struct wb__sub *subs;
    unsigned n_subs;
    uint64_t sub_gen;
    int sub_dispatching; /* callbacks are running, on sub_dispatcher */
    pthread_t sub_dispatcher;
    atomic_int sub_pending;
    atomic_int has_subs;
};

/* subs.c: the subscriptions' state. wb__subs_init/free at connect and
 * destroy (free after the heartbeat thread stopped). wb__subs_on_notice is
 * the rpc's notice hook (under c->mu). wb__subs_apply_beat records a
 * heartbeat reply's current versions (under c->mu). wb__subs_resend_locked
 * sends every subscription again when the socket is not the one they were
 * sent on (under c->mu; a failed exchange is returned, a refusal is not).
 * wb__subs_dispatch calls the callbacks of versions not yet announced;
 * the caller holds no lock of the library. */
void wb__subs_init(wb_client *c);
void wb__subs_free(wb_client *c);
void wb__subs_on_notice(void *arg, const Wbproto__VersionNotice *n);
void wb__subs_apply_beat(wb_client *c, const Wbproto__HeartbeatReply *hr);
int wb__subs_resend_locked(wb_client *c, wb_err *err);
void wb__subs_dispatch(wb_client *c);

/* Stores a message in the client (when there is one) and returns code.
 * Takes err_mu only: callers may hold client->mu or not. */
int wb__client_fail(wb_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For tests: the clock of the clients connected from now on (NULL: back to
 * wb__clock_mono_ms), a monotonic millisecond count above 0. Call it before
 * connecting, from one thread. */
void wb__client_clock(int64_t (*now_ms)(void));

/* Wakes the client's heartbeat thread to read its clock again, as a test
 * does after moving it; nothing when the client has no thread. */
void wb__client_wake(wb_client *c);

/* Says hello (the first time: records the broker's timings and the name
 * sent, `name` or "program[pid]"). Stores a message in the client on
 * failure. The caller holds client->mu or is the only user. */
int wb__client_hello(wb_client *c, const char *name);

/* One reconnection attempt: a new socket and a hello. On failure the next
 * automatic attempt waits twice as long as the last (capped at
 * WB_RPC_RECONNECT_MAX_MS). 1 in *restarted when the broker is another run.
 * The caller holds c->mu. */
int wb__client_reconnect_locked(wb_client *c, int *restarted, wb_err *err);

/* Adopts the heartbeat interval and stale window a broker reply gave (0:
 * the reply did not say; the interval stays as it was, 1 s at first). */
void wb__client_set_pace(wb_client *c, uint32_t heartbeat_ms, uint32_t stale_ms);

/* Takes over the reference *map holds (*map becomes NULL) and keeps the
 * mapping for WB_MAP_LINGER_MS, or drops it as wb__mapcache_put when this
 * client keeps none (no heartbeat thread, or a cuda slab, whose memory the
 * broker frees only when the last process closes it). The caller holds
 * c->mu. */
void wb__client_linger(wb_client *c, struct wb__map **map);

/* Drops the lingering mappings due at now_ms (every one with INT64_MAX).
 * The caller holds c->mu. */
void wb__client_linger_sweep(wb_client *c, int64_t now_ms);

/* One exchange with the broker; records whether it answered (connected).
 * Same contract as wb__rpc_call. The caller holds client->mu. */
int wb__client_call(wb_client *c, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                    wb_err *err);
/* The same for a reply that may come in two frames (wb__rpc_call_frame). */
int wb__client_call_frame(wb_client *c, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                          wb__frame **frame, wb_err *err);

#endif
