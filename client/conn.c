/* libwbclient: the connection to the broker, under the client's lock: one
 * exchange at a time, hello, and reconnection with backoff when the broker
 * goes away. It knows nothing of leases; a broker restart is reported to the
 * client's on_restart hook. */
#include "client_impl.h"

#include "fdchan.h"
#include "fdchan_wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIN_HEARTBEAT_MS 10

int wb__client_fail(wb_client *c, int code, const char *fmt, ...)
{
    if (c) {
        va_list ap;
        va_start(ap, fmt);
        pthread_mutex_lock(&c->err_mu);
        unsigned next =
            (atomic_load_explicit(&c->err_last, memory_order_relaxed) + 1) % WB_CLIENT_MSGS;
        wb__err_vset(&c->err[next], code, fmt, ap);
        atomic_store_explicit(&c->err_last, next, memory_order_release);
        pthread_mutex_unlock(&c->err_mu);
        va_end(ap);
    }
    return code;
}

void wb__client_set_pace(wb_client *c, uint32_t heartbeat_ms, uint32_t stale_ms)
{
    if (heartbeat_ms == 0 && atomic_load(&c->heartbeat_ms) != 0)
        return;
    if (heartbeat_ms == 0)
        heartbeat_ms = 1000;
    atomic_store(&c->heartbeat_ms,
                 heartbeat_ms < MIN_HEARTBEAT_MS ? MIN_HEARTBEAT_MS : heartbeat_ms);
    atomic_store(&c->stale_ms, stale_ms);
}

/* The connection failed: schedule the first reconnection attempt. The
 * caller holds c->mu. */
static void connection_lost(wb_client *c)
{
    if (atomic_exchange(&c->connected, 0) || c->backoff_ms == 0) {
        c->backoff_ms = WB_RPC_RECONNECT_MIN_MS;
        atomic_store(&c->next_reconnect_ms, c->now_ms() + c->backoff_ms);
    }
}

/* Asks for this process's session on the broker's descriptor channel when
 * the broker has one ("<socket>.fd" is a socket). Without it (no channel,
 * a broker that predates sessions) the hello carries no token and the
 * broker knows the process by its pid, where it can see it; the reason is
 * kept in `why` for a hello that the broker then refuses. */
static void session_locked(wb_client *c, char *why, size_t size)
{
    c->has_session = 0;
    why[0] = '\0';
    char path[WB_RPC_PATH_MAX + 8];
    struct stat st;
    if (wb__fdchan_path(c->rpc.path, path, sizeof path) != WB_OK || stat(path, &st) != 0 ||
        !S_ISSOCK(st.st_mode))
        return;
    wb_err e;
    if (wb__fdchan_session(c->rpc.path, c->rpc.timeout_ms, c->session, &e) == WB_OK)
        c->has_session = 1;
    else
        snprintf(why, size, " (no descriptor channel session: %.900s)", e.msg);
}

/* Says hello on the current socket and records what the broker said. A
 * broker run other than the one that granted our leases is reported to the
 * client's on_restart hook (which orphans the leases) and with 1 in
 * *restarted. The caller holds c->mu. A broker that restarted between the
 * token and the hello knows no such session and refuses it (as it refuses a
 * hello without one that came while its channel was away): once more, with
 * a fresh session. */
static int hello_locked(wb_client *c, int *restarted, wb_err *err)
{
    *restarted = 0;
    char why[WB_ERR_MSG_MAX];
    Wbproto__Reply *rep = NULL;
    wb_err e;
    int rc;
    for (int attempt = 0;; attempt++) {
        session_locked(c, why, sizeof why);
        Wbproto__HelloRequest hello = WBPROTO__HELLO_REQUEST__INIT;
        hello.client = c->hello_name;
        if (c->has_session) {
            hello.session.data = c->session;
            hello.session.len = WB_SESSION_TOKEN_LEN;
        }
        Wbproto__Request req = WBPROTO__REQUEST__INIT;
        req.body_case = WBPROTO__REQUEST__BODY_HELLO;
        req.hello = &hello;
        rc = wb__rpc_call(&c->rpc, &req, 0, &rep, &e);
        int session_lost =
            c->has_session ? !wb__fdchan_session_open(c->rpc.path, c->session) : why[0] != '\0';
        if (rc == WB_OK || !rep || attempt > 0 || !session_lost)
            break;
        wb__reply_free(&rep);
    }
    if (rc != WB_OK) {
        if (!rep)
            connection_lost(c);
        wb__reply_free(&rep);
        return wb__err_set(err, rc, "hello: %.700s%.300s", e.msg, why);
    }
    const Wbproto__HelloReply *h = rep->hello;
    uint32_t pid = h ? h->broker_pid : 0;
    uint64_t instance = h ? h->broker_instance : 0;
    c->broker_backend = h ? (int)h->backend : 0;
    if (c->hello_done && (pid != c->broker_pid || instance != c->broker_instance)) {
        *restarted = 1;
        if (c->on_restart)
            c->on_restart(c);
    }
    c->broker_pid = pid;
    c->broker_instance = instance;
    wb__client_set_pace(c, h ? h->heartbeat_interval_ms : 0, h ? h->stale_after_ms : 0);
    c->hello_done = 1;
    c->backoff_ms = 0;
    atomic_store(&c->connected, 1);
    wb__reply_free(&rep);
    return WB_OK;
}

int wb__client_reconnect_locked(wb_client *c, int *restarted, wb_err *err)
{
    *restarted = 0;
    atomic_fetch_add(&c->reconnect_attempts, 1);
    int rc = wb__rpc_reopen(&c->rpc, err);
    if (rc == WB_OK)
        rc = hello_locked(c, restarted, err);
    /* The new connection knows none of the subscriptions. */
    if (rc == WB_OK)
        rc = wb__subs_resend_locked(c, err);
    if (rc == WB_OK) {
        atomic_fetch_add(&c->reconnects, 1);
        return WB_OK;
    }
    atomic_store(&c->connected, 0);
    uint32_t next = c->backoff_ms ? c->backoff_ms * 2 : WB_RPC_RECONNECT_MIN_MS;
    c->backoff_ms = next > WB_RPC_RECONNECT_MAX_MS ? WB_RPC_RECONNECT_MAX_MS : next;
    atomic_store(&c->next_reconnect_ms, c->now_ms() + c->backoff_ms);
    return rc;
}

int wb__client_call(wb_client *c, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                    wb_err *err)
{
    return wb__client_call_frame(c, req, timeout_ms, out, NULL, err);
}

int wb__client_call_frame(wb_client *c, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                          wb__frame **frame, wb_err *err)
{
    *out = NULL;
    if (frame)
        *frame = NULL;
    /* The session's connection ended: the broker restarted (its new run
     * knows neither the session nor, for a process whose pid it cannot
     * see, this process), or it dropped the connection. Say hello again. */
    if (c->has_session && atomic_load(&c->connected) &&
        !wb__fdchan_session_open(c->rpc.path, c->session))
        connection_lost(c);
    if (!atomic_load(&c->connected) && c->hello_done) {
        /* A call made while disconnected tries at once, whatever the
         * backoff: the application is waiting for this answer. */
        int restarted;
        int rc = wb__client_reconnect_locked(c, &restarted, err);
        if (rc != WB_OK)
            return rc;
        if (restarted && req->body_case == WBPROTO__REQUEST__BODY_RELEASE)
            return wb__err_set(err, WB_ECONN,
                               "the broker restarted; the lease was granted by its previous run");
    }
    int rc = wb__rpc_call_frame(&c->rpc, req, timeout_ms, out, frame, err);
    if (*out)
        atomic_store(&c->connected, 1);
    else
        connection_lost(c);
    return rc;
}

int wb__client_hello(wb_client *c, const char *name)
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

WB_EXPORT const char *wb_client_errmsg(const wb_client *client)
{
    if (!client)
        return "no client (connect failed for lack of memory, or NULL was passed)";
    return client->err[atomic_load_explicit(&client->err_last, memory_order_acquire)].msg;
}

WB_EXPORT int wb_client_connected(const wb_client *client)
{
    return client ? atomic_load(&client->connected) : 0;
}
