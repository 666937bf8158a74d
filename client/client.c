/* libwbclient: connection, hello, heartbeats and the client's lifetime. */
#include "client_impl.h"

#include "clog.h"
#include "lease.h"
#include "log.h"
#include "lease.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIN_HEARTBEAT_MS 10

WB_EXPORT void wb_client_options_init(wb_client_options *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

int wb__client_fail(wb_client *c, int code, const char *fmt, ...)
{
    if (c) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err.msg, sizeof c->err.msg, fmt, ap);
        va_end(ap);
        c->err.code = code;
    }
    return code;
}

/* The connection failed: schedule the first reconnection attempt. The
 * caller holds c->mu. */
static void connection_lost(wb_client *c)
{
    if (atomic_exchange(&c->connected, 0) || c->backoff_ms == 0) {
        c->backoff_ms = WB_RPC_RECONNECT_MIN_MS;
        atomic_store(&c->next_reconnect_ms, wb__now_ms() + c->backoff_ms);
    }
}

/* Marks every lease orphaned: the broker that granted them is gone. Their
 * mappings stay; the application decides whether to acquire again. */
static void orphan_all(wb_client *c)
{
    for (wb_lease *l = c->leases; l; l = l->next)
        atomic_store(&l->orphaned, 1);
}

/* Says hello on the current socket and records what the broker said. A
 * broker run other than the one that granted our leases orphans them all.
 * Returns 1 in *restarted when that happened. The caller holds c->mu. */
static int hello_locked(wb_client *c, int *restarted, wb_err *err)
{
    *restarted = 0;
    Wbproto__HelloRequest hello = WBPROTO__HELLO_REQUEST__INIT;
    hello.client = c->hello_name;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    req.hello = &hello;
    Wbproto__Reply *rep = NULL;
    wb_err e;
    int rc = wb__rpc_call(&c->rpc, &req, 0, &rep, &e);
    if (rc != WB_OK) {
        if (!rep)
            connection_lost(c);
        wb__reply_free(&rep);
        return wb__err_set(err, rc, "hello: %s", e.msg);
    }
    const Wbproto__HelloReply *h = rep->hello;
    uint32_t pid = h ? h->broker_pid : 0;
    uint64_t instance = h ? h->broker_instance : 0;
    if (c->hello_done && (pid != c->broker_pid || instance != c->broker_instance)) {
        *restarted = 1;
        orphan_all(c);
    }
    c->broker_pid = pid;
    c->broker_instance = instance;
    if (!c->hello_done) {
        /* The first broker's timings are kept: the heartbeat thread reads
         * them without the lock. */
        c->heartbeat_ms = h && h->heartbeat_interval_ms ? h->heartbeat_interval_ms : 1000;
        if (c->heartbeat_ms < MIN_HEARTBEAT_MS)
            c->heartbeat_ms = MIN_HEARTBEAT_MS;
        c->stale_ms = h ? h->stale_after_ms : 0;
    }
    c->hello_done = 1;
    c->backoff_ms = 0;
    atomic_store(&c->connected, 1);
    wb__reply_free(&rep);
    return WB_OK;
}

/* One reconnection attempt: a new socket and a hello. On failure the next
 * automatic attempt waits twice as long as the last (capped). The caller
 * holds c->mu. */
static int reconnect_locked(wb_client *c, int *restarted, wb_err *err)
{
    *restarted = 0;
    atomic_fetch_add(&c->reconnect_attempts, 1);
    int rc = wb__rpc_reopen(&c->rpc, err);
    if (rc == WB_OK)
        rc = hello_locked(c, restarted, err);
    if (rc == WB_OK) {
        atomic_fetch_add(&c->reconnects, 1);
        return WB_OK;
    }
    atomic_store(&c->connected, 0);
    uint32_t next = c->backoff_ms ? c->backoff_ms * 2 : WB_RPC_RECONNECT_MIN_MS;
    c->backoff_ms = next > WB_RPC_RECONNECT_MAX_MS ? WB_RPC_RECONNECT_MAX_MS : next;
    atomic_store(&c->next_reconnect_ms, wb__now_ms() + c->backoff_ms);
    return rc;
}

int wb__client_call(wb_client *c, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                    wb_err *err)
{
    *out = NULL;
    if (!atomic_load(&c->connected) && c->hello_done) {
        /* A call made while disconnected tries at once, whatever the
         * backoff: the application is waiting for this answer. */
        int restarted;
        int rc = reconnect_locked(c, &restarted, err);
        if (rc != WB_OK)
            return rc;
        if (restarted && req->body_case == WBPROTO__REQUEST__BODY_RELEASE)
            return wb__err_set(err, WB_ECONN,
                               "the broker restarted; the lease was granted by its previous run");
    }
    int rc = wb__rpc_call(&c->rpc, req, timeout_ms, out, err);
    if (*out)
        atomic_store(&c->connected, 1);
    else
        connection_lost(c);
    return rc;
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
    Wbproto__LeaseBeat *beats = calloc(n ? n : 1, sizeof *beats);
    Wbproto__LeaseBeat **ptrs = calloc(n ? n : 1, sizeof *ptrs);
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
    pthread_mutex_lock(&client->mu);
    int rc = heartbeat_locked(client, &client->err);
    pthread_mutex_unlock(&client->mu);
    return rc;
}

static struct timespec deadline_after(uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Sleeps on a condition variable rather than in sleep() so that destroy can
 * stop the thread at once. A failed heartbeat only clears `connected`: the
 * thread has no caller to report to, and the client's message belongs to
 * the application's own calls. While disconnected it wakes for each
 * reconnection attempt (50 ms after the loss, then doubling up to 2 s) and,
 * once reconnected, sends a heartbeat at once so that leases the broker does
 * not know are marked orphaned. */
static void *heartbeat_main(void *arg)
{
    wb_client *c = arg;
    pthread_mutex_lock(&c->hb_mu);
    while (!c->hb_stop) {
        uint32_t wait_ms = c->heartbeat_ms;
        if (!atomic_load(&c->connected)) {
            int64_t left = atomic_load(&c->next_reconnect_ms) - wb__now_ms();
            wait_ms = left <= 0 ? 0 : left < (int64_t)wait_ms ? (uint32_t)left : wait_ms;
        }
        struct timespec until = deadline_after(wait_ms);
        while (!c->hb_stop) {
            int rc = pthread_cond_timedwait(&c->hb_cond, &c->hb_mu, &until);
            if (rc == ETIMEDOUT)
                break;
        }
        if (c->hb_stop)
            break;
        pthread_mutex_unlock(&c->hb_mu);
        wb_err e;
        pthread_mutex_lock(&c->mu);
        if (atomic_load(&c->connected)) {
            heartbeat_locked(c, &e);
        } else if (wb__now_ms() >= atomic_load(&c->next_reconnect_ms)) {
            int restarted;
            if (reconnect_locked(c, &restarted, &e) == WB_OK)
                heartbeat_locked(c, &e);
        }
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_lock(&c->hb_mu);
    }
    pthread_mutex_unlock(&c->hb_mu);
    return NULL;
}

static int start_heartbeat(wb_client *c)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return wb__client_fail(c, WB_ENOMEM, "cannot start the heartbeat thread");
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&c->hb_cond, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        return wb__client_fail(c, WB_ENOMEM, "cannot start the heartbeat thread: %s", strerror(rc));
    pthread_mutex_init(&c->hb_mu, NULL);
    rc = pthread_create(&c->hb_thread, NULL, heartbeat_main, c);
    if (rc != 0) {
        pthread_cond_destroy(&c->hb_cond);
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
    pthread_cond_signal(&c->hb_cond);
    pthread_mutex_unlock(&c->hb_mu);
    pthread_join(c->hb_thread, NULL);
    pthread_cond_destroy(&c->hb_cond);
    pthread_mutex_destroy(&c->hb_mu);
    c->hb_started = 0;
}

static int say_hello(wb_client *c, const char *name)
{
    if (name && name[0])
        snprintf(c->hello_name, sizeof c->hello_name, "%s", name);
    else
        snprintf(c->hello_name, sizeof c->hello_name, "%s[%ld]", program_invocation_short_name,
                 (long)getpid());
    wb_err e;
    int restarted;
    int rc = hello_locked(c, &restarted, &e);
    if (rc != WB_OK)
        return wb__client_fail(c, rc, "%s", e.msg);
    return WB_OK;
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
    wb_client *c = calloc(1, sizeof *c);
    if (!c)
        return WB_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->connected, 0);
    atomic_init(&c->next_reconnect_ms, 0);
    atomic_init(&c->reconnect_attempts, 0);
    atomic_init(&c->reconnects, 0);
    *out = c;

    wb_err e;
    int rc = wb__rpc_open(&c->rpc, opts->socket_path, opts->timeout_ms, &e);
    if (rc != WB_OK)
        return wb__client_fail(c, rc, "%s", e.msg);
    rc = say_hello(c, opts->client_name);
    if (rc != WB_OK)
        return rc;
    if (!opts->no_heartbeat_thread) {
        rc = start_heartbeat(c);
        if (rc != WB_OK)
            return rc;
    }
    c->err.code = WB_OK;
    c->err.msg[0] = '\0';
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
    pthread_mutex_unlock(&c->mu);
    wb__rpc_close(&c->rpc);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

WB_EXPORT const char *wb_client_errmsg(const wb_client *client)
{
    if (!client)
        return "no client (connect failed for lack of memory, or NULL was passed)";
    return client->err.msg;
}

WB_EXPORT int wb_client_connected(const wb_client *client)
{
    return client ? atomic_load(&client->connected) : 0;
}
