/* libwbclient: the client's lifetime (connect, destroy) and its heartbeats,
 * over the connection (conn.c) and the leases (lease.h). */
#include "client_impl.h"

#include "clock.h"
#include "alloc.h"
#include "clog.h"
#include "lease.h"
#include "log.h"
#include "mapcache.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* The clock of clients connected from now on (wb__client_clock). */
static int64_t (*client_clock)(void) = wb__clock_mono_ms;

void wb__client_clock(int64_t (*now_ms)(void))
{
    client_clock = now_ms ? now_ms : wb__clock_mono_ms;
}

WB_EXPORT void wb_client_options_init(wb_client_options *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

/* Tells the heartbeat thread to look at its deadlines again. */
static void kick_heartbeat(wb_client *c)
{
    pthread_mutex_lock(&c->hb_mu);
    c->hb_kick = 1;
    pthread_mutex_unlock(&c->hb_mu);
    uint64_t one = 1;
    while (write(c->hb_wake, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

void wb__client_wake(wb_client *c)
{
    if (c && c->hb_started)
        kick_heartbeat(c);
}

/* Marks every lease orphaned: the broker that granted them is gone (the
 * connection's on_restart hook). Their
 * mappings stay; the application decides whether to acquire again. */
static void orphan_all(wb_client *c)
{
    for (wb_lease *l = c->leases; l; l = l->next)
        atomic_store(&l->orphaned, 1);
    /* The slabs of the broker run that ended: nothing will lease them again. */
    wb__client_linger_sweep(c, INT64_MAX);
}

void wb__client_linger_sweep(wb_client *c, int64_t now_ms)
{
    int64_t due = 0;
    for (size_t i = 0; i < WB_LINGER_MAPS; i++) {
        if (!c->linger[i])
            continue;
        if (c->linger_until[i] <= now_ms)
            wb__mapcache_put(&c->linger[i]);
        else if (!due || c->linger_until[i] < due)
            due = c->linger_until[i];
    }
    atomic_store(&c->linger_due_ms, due);
}

void wb__client_linger(wb_client *c, struct wb__map **map)
{
    if (!*map)
        return;
    /* Host slabs only, and only with a thread to unmap them when due. */
    if (!c->hb_started || wb__map_device(*map) >= 0) {
        wb__mapcache_put(map);
        return;
    }
    int64_t until = c->now_ms() + WB_MAP_LINGER_MS;
    size_t slot = WB_LINGER_MAPS, oldest = WB_LINGER_MAPS;
    for (size_t i = 0; i < WB_LINGER_MAPS; i++) {
        if (c->linger[i] == *map) {
            /* Already kept: the lease's reference goes, the clock restarts. */
            c->linger_until[i] = until;
            wb__mapcache_put(map);
            return;
        }
        if (!c->linger[i]) {
            if (slot == WB_LINGER_MAPS)
                slot = i;
        } else if (oldest == WB_LINGER_MAPS || c->linger_until[i] < c->linger_until[oldest]) {
            oldest = i;
        }
    }
    if (slot == WB_LINGER_MAPS) {
        slot = oldest;
        wb__mapcache_put(&c->linger[slot]);
    }
    c->linger[slot] = *map;
    c->linger_until[slot] = until;
    *map = NULL;
    if (atomic_load(&c->linger_due_ms) == 0) {
        /* The thread may sleep until its next beat, seconds away: it is
         * told once, when the first mapping starts to linger, not at every
         * release. */
        atomic_store(&c->linger_due_ms, until);
        kick_heartbeat(c);
    }
}

/* Sends one heartbeat with every lease the broker should know, and marks the
 * leases it does not know as orphaned. The caller holds c->mu. */
static int heartbeat_locked(wb_client *c, wb_err *err)
{
    size_t n = 0;
    for (wb_lease *l = c->leases; l; l = l->next) {
        if (!atomic_load(&l->orphaned))
            n++;
    }
    if (n > WB_MAX_BEATS)
        n = WB_MAX_BEATS;
    Wbproto__LeaseBeat *beats = wb__calloc(n ? n : 1, sizeof *beats);
    Wbproto__LeaseBeat **ptrs = wb__calloc(n ? n : 1, sizeof *ptrs);
    if (!beats || !ptrs) {
        free(beats);
        free(ptrs);
        return wb__err_set(err, WB_ENOMEM, "heartbeat: out of memory");
    }
    size_t i = 0;
    for (wb_lease *l = c->leases; l && i < n; l = l->next) {
        if (atomic_load(&l->orphaned))
            continue;
        wbproto__lease_beat__init(&beats[i]);
        beats[i].lease_id.data = l->id;
        beats[i].lease_id.len = WB_LEASE_ID_BYTES;
        /* The count and the records, read together under the lease's lock;
         * without memory for the records, the count alone still goes out. */
        wb__lease_fill_beat(l, &beats[i]);
        ptrs[i] = &beats[i];
        i++;
    }
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = i;
    hb.leases = ptrs;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    Wbproto__Reply *rep = NULL;
    wb_err e;
    int rc = wb__client_call(c, &req, 0, &rep, &e);
    for (size_t k = 0; k < i; k++)
        wb__lease_beat_free(&beats[k]);
    free(beats);
    free(ptrs);
    if (rc != WB_OK) {
        wb__reply_free(&rep);
        return wb__err_set(err, rc, "heartbeat: %s", e.msg);
    }
    const Wbproto__HeartbeatReply *hr = rep->heartbeat;
    if (hr) {
        wb__client_set_pace(c, hr->heartbeat_interval_ms, hr->stale_after_ms);
        wb__subs_apply_beat(c, hr);
    }
    for (size_t k = 0; hr && k < hr->n_unknown_leases; k++) {
        if (hr->unknown_leases[k].len != WB_LEASE_ID_BYTES)
            continue;
        for (wb_lease *l = c->leases; l; l = l->next) {
            if (memcmp(l->id, hr->unknown_leases[k].data, WB_LEASE_ID_BYTES) == 0)
                atomic_store(&l->orphaned, 1);
        }
    }
    wb__reply_free(&rep);
    return WB_OK;
}

WB_EXPORT int wb_client_heartbeat(wb_client *client)
{
    if (!client)
        return WB_EINVAL;
    wb_err e;
    pthread_mutex_lock(&client->mu);
    int rc = heartbeat_locked(client, &e);
    pthread_mutex_unlock(&client->mu);
    if (rc != WB_OK)
        wb__client_fail(client, rc, "%s", e.msg);
    /* Without the heartbeat thread, the callbacks of the versions heard
     * run here, on the caller's thread. */
    if (!client->hb_started)
        wb__subs_dispatch(client);
    return rc;
}

/* What the heartbeat thread waits for next, on the client's clock: the
 * next beat while connected, the next reconnection attempt while not (no
 * beat goes out meanwhile: waking for one would only spin until the
 * attempt), or a lingering mapping's end when sooner. */
static int64_t heartbeat_next(wb_client *c, int64_t beat_at)
{
    int64_t at = atomic_load(&c->connected) ? beat_at : atomic_load(&c->next_reconnect_ms);
    int64_t due = atomic_load(&c->linger_due_ms);
    return due && due < at ? due : at;
}

/* Sleeps in poll(2) rather than in sleep() so that destroy can stop the
 * thread at once. A failed heartbeat only clears `connected`: the thread
 * has no caller to report to, and the client's message belongs to the
 * application's own calls. While disconnected it wakes for each
 * reconnection attempt (50 ms after the loss, then doubling up to 2 s) and,
 * once reconnected, sends a heartbeat at once so that leases the broker does
 * not know are marked orphaned. It also wakes when a lingering mapping is
 * due (wb__client_linger), which sends nothing. With subscriptions it also
 * polls the socket (ZMQ_FD, edge-triggered), reads what came under the
 * client's lock (the notices go to subs.c) and runs the callbacks with no
 * lock held; a notice that another thread's exchange read wakes it too.
 * Every wake reads the clock again, so a kick or a wait that ends early
 * does nothing that is not due. */
static void *heartbeat_main(void *arg)
{
    wb_client *c = arg;
    int64_t beat_at = c->hb_first_ms;
    for (;;) {
        pthread_mutex_lock(&c->hb_mu);
        int stop = c->hb_stop;
        c->hb_kick = 0;
        pthread_mutex_unlock(&c->hb_mu);
        if (stop)
            break;
        uint64_t drained;
        while (read(c->hb_wake, &drained, sizeof drained) < 0 && errno == EINTR)
            ;
        int sock_fd = -1;
        if (atomic_load(&c->has_subs)) {
            wb_err e;
            pthread_mutex_lock(&c->mu);
            wb__rpc_drain(&c->rpc);
            if (atomic_load(&c->connected) && wb__subs_resend_locked(c, &e) != WB_OK)
                atomic_store(&c->connected, 0);
            sock_fd = wb__rpc_fd(&c->rpc);
            pthread_mutex_unlock(&c->mu);
        }
        wb__subs_dispatch(c);
        int64_t now = c->now_ms();
        int64_t left = heartbeat_next(c, beat_at) - now;
        if (left > 0) {
            atomic_store(&c->hb_idle_ms, now);
            struct pollfd p[2] = {{.fd = c->hb_wake, .events = POLLIN},
                                  {.fd = sock_fd, .events = POLLIN}};
            int wait_ms = left > INT32_MAX ? INT32_MAX : (int)left;
            poll(p, sock_fd >= 0 ? 2 : 1, wait_ms);
            continue;
        }
        wb_err e;
        pthread_mutex_lock(&c->mu);
        now = c->now_ms();
        if (atomic_load(&c->connected)) {
            if (now >= beat_at) {
                heartbeat_locked(c, &e);
                beat_at = c->now_ms() + atomic_load(&c->heartbeat_ms);
            }
        } else if (now >= atomic_load(&c->next_reconnect_ms)) {
            int restarted;
            if (wb__client_reconnect_locked(c, &restarted, &e) == WB_OK)
                heartbeat_locked(c, &e);
            beat_at = c->now_ms() + atomic_load(&c->heartbeat_ms);
        }
        if (atomic_load(&c->linger_due_ms))
            wb__client_linger_sweep(c, c->now_ms());
        pthread_mutex_unlock(&c->mu);
        wb__subs_dispatch(c);
    }
    return NULL;
}

static int start_heartbeat(wb_client *c)
{
    c->hb_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->hb_wake < 0)
        return wb__client_fail(c, WB_ENOMEM, "cannot start the heartbeat thread: eventfd: %s",
                               strerror(errno));
    pthread_mutex_init(&c->hb_mu, NULL);
    c->hb_first_ms = c->now_ms() + atomic_load(&c->heartbeat_ms);
    int rc = pthread_create(&c->hb_thread, NULL, heartbeat_main, c);
    if (rc != 0) {
        close(c->hb_wake);
        c->hb_wake = -1;
        pthread_mutex_destroy(&c->hb_mu);
        return wb__client_fail(c, WB_ENOMEM, "cannot start the heartbeat thread: %s", strerror(rc));
    }
    c->hb_started = 1;
    return WB_OK;
}

static void stop_heartbeat(wb_client *c)
{
    if (!c->hb_started)
        return;
    pthread_mutex_lock(&c->hb_mu);
    c->hb_stop = 1;
    pthread_mutex_unlock(&c->hb_mu);
    uint64_t one = 1;
    while (write(c->hb_wake, &one, sizeof one) < 0 && errno == EINTR)
        ;
    pthread_join(c->hb_thread, NULL);
    pthread_mutex_destroy(&c->hb_mu);
    close(c->hb_wake);
    c->hb_wake = -1;
    c->hb_started = 0;
}

WB_EXPORT int wb_client_connect(const wb_client_options *opts, wb_client **out)
{
    if (!out)
        return WB_EINVAL;
    *out = NULL;
    wb_client_options defaults;
    wb_client_options_init(&defaults);
    if (!opts)
        opts = &defaults;
    wb_client *c = wb__calloc(1, sizeof *c);
    if (!c)
        return WB_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->err_mu, NULL);
    c->now_ms = client_clock;
    atomic_init(&c->err_last, 0);
    atomic_init(&c->hb_idle_ms, 0);
    atomic_init(&c->connected, 0);
    atomic_init(&c->next_reconnect_ms, 0);
    atomic_init(&c->reconnect_attempts, 0);
    atomic_init(&c->reconnects, 0);
    atomic_init(&c->linger_due_ms, 0);
    *out = c;

    wb_err e;
    c->hb_wake = -1;
    int rc = wb__rpc_open(&c->rpc, opts->socket_path, opts->timeout_ms, &e);
    wb__subs_init(c);
    if (rc != WB_OK)
        return wb__client_fail(c, rc, "%s", e.msg);
    c->on_restart = orphan_all;
    rc = wb__client_hello(c, opts->client_name);
    if (rc != WB_OK)
        return rc;
    if (!opts->no_heartbeat_thread) {
        rc = start_heartbeat(c);
        if (rc != WB_OK)
            return rc;
    }
    wb__client_fail(c, WB_OK, "%s", ""); /* a connect that worked leaves no message */
    return WB_OK;
}

WB_EXPORT void wb_client_destroy(wb_client **client)
{
    if (!client || !*client)
        return;
    wb_client *c = *client;
    *client = NULL;
    stop_heartbeat(c);

    pthread_mutex_lock(&c->mu);
    /* After one failed release the broker is not answering: end the rest
     * locally instead of waiting a full timeout for each. */
    int tell = 1;
    while (c->leases) {
        wb_lease *l = c->leases;
        unsigned n = wb__lease_begin_end(l);
        if (n > 0) {
            /* Never unmap memory a container may still run on: keep the
             * lease mapped and detached; wb_lease_release ends it later. */
            char q[300];
            wb__cwarn("client_destroy_busy_lease",
                      "lease=%.8s model=%s containers=%u note=\"its memory stays mapped until "
                      "wb_lease_release\"",
                      l->id_hex, wb__log_quote(q, sizeof q, l->model), n);
            c->leases = l->next;
            if (c->leases)
                c->leases->prev = NULL;
            l->next = l->prev = NULL;
            l->client = NULL;
            continue;
        }
        wb_err ignored;
        int rc = wb__lease_end(l, tell && !atomic_load(&l->orphaned), &ignored);
        if (rc == WB_ECONN)
            tell = 0;
    }
    for (size_t i = 0; i < sizeof c->tables / sizeof c->tables[0]; i++)
        wb__table_unref(&c->tables[i]);
    wb__client_linger_sweep(c, INT64_MAX);
    pthread_mutex_unlock(&c->mu);
    wb__rpc_close(&c->rpc);
    wb__subs_free(c);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->err_mu);
    free(c);
}
