#include "loop.h"
#include "tier.h"

#include "auth_groups.h"
#include "backend_vmm.h"
#include "clock.h"
#include "alloc.h"
#include "fdchan_server.h"
#include "publish.h"
#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "paths.h"
#include "ratelog.h"
#include "signals.h"
#include "wire.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#ifdef WB_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

/* The longest the loop sleeps, so that stale leases are noticed in time. */
#define LOOP_MAX_WAIT_MS 250

typedef struct loop {
    wb_broker *b;
    const wb_loop_options *opt;
    wb_conns conns;
    int sigfd;
    const wb_loop_reload *reload;
    wb_loader loader;
    /* Published versions' checksums (publish_sum.c), on a thread of their
     * own: a read-back never delays a commit or a load. */
    wb_loader checker;
    wb_loader tier; /* moves and restores of the memory budget (tier.h) */
    int stop;       /* the stop signal received, 0 while serving */
    int epfd;       /* every peer's pidfd, registered once (wb_lease_table.epfd) */
    /* Everything the loop waits on, registered once: the listener, the
     * signals, the loader, the pidfd set and each connection (whose wanted
     * events change only when its output queue fills or empties). One
     * epoll_wait costs the same with 1,000 idle peers as with one. */
    int ep;
    struct epoll_event *evs;
    size_t cap_evs;
    uint64_t *serials; /* connections with events, in this round */
    uint32_t *revents;
    /* The descriptor channel, when the backend hands out descriptors. */
    wb_fdchan_server fdchan;
    int have_fdchan;
} loop;

/* epoll data of the fixed descriptors; a connection's is its serial with
 * EV_CONN set. */
enum { EV_LISTEN = 1, EV_SIGNAL, EV_LOADER, EV_DEATH, EV_FDCHAN, EV_CHECKER, EV_TIER };
#define EV_CONN (1ull << 63)

/* Packs and sends reply `r` to the connection `ident`: its message, and its
 * second frame when it has one. A peer that went away loses it; a peer that
 * leaves --max-queued-replies messages unread loses it and is disconnected
 * (replies_dropped counts both). `op` is the request's body field number (0:
 * undecodable), for the per-operation counters. */
static void send_reply(loop *L, uint32_t op, const void *ident, size_t ident_len, wb_ops_reply *r)
{
    wb_broker *b = L->b;
    Wbproto__Reply *rep = &r->msg;
    size_t len = 0;
    uint8_t *buf = wb__reply_pack(rep, &len);
    if (buf && len + r->frame_len > b->limits.max_message) {
        free(buf);
        len += r->frame_len;
        char msg[160];
        snprintf(msg, sizeof msg,
                 "the reply would take %zu bytes, over the %llu-byte message limit "
                 "(--max-message-bytes)",
                 len, (unsigned long long)b->limits.max_message);
        /* The error drops the frame too. */
        wb__ops_error(r, rep->id, WB_ELIMIT, msg);
        buf = wb__reply_pack(rep, &len);
    }
    b->stats.requests_total++;
    if (rep->status != 0)
        b->stats.requests_failed++;
    if (rep->status == WB_ELIMIT)
        b->stats.limit_refusals++;
    wb__broker_count_request(b, op, rep->status);
    if (!buf) {
        b->stats.replies_dropped++;
        wb_error("reply_dropped", "reason=out_of_memory id=%llu", (unsigned long long)rep->id);
        return;
    }
    int rc = wb__conns_send(&L->conns, ident, ident_len, buf, len, r->frame, r->frame_len);
    free(buf);
    if (rc == WB_OK)
        return;
    b->stats.replies_dropped++;
    if (rc != WB_ELIMIT)
        wb_debug("reply_dropped", "reason=%s id=%llu",
                 rc == WB_ENOTFOUND ? "no_connection" : "peer_gone", (unsigned long long)rep->id);
}

/* Admits a new connection by the kernel's credentials and the process's
 * supplementary groups, read once here: a peer on no allow list is refused
 * before any of its requests is decoded (wb_conns.admit). */
static int admit_peer(void *ctx, wb_peer_creds *kernel, int pidfd, char *why, size_t size)
{
    loop *L = ctx;
    wb_err err;
    wb__auth_read_groups(&L->b->auth, kernel, pidfd);
    if (wb__auth_check_client(&L->b->auth, kernel, &err) == WB_OK)
        return 0;
    snprintf(why, size, "%s", err.msg);
    return -1;
}

/* Answers a request of a connection that may not be served with `msg`,
 * undecoded, and closes the connection once the reply is out. */
static void refuse_and_close(loop *L, wb_conn *c, const wb_zmtp_msg *m, const char *reason,
                             int code, const char *msg)
{
    wb_broker *b = L->b;
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    uint64_t ident = c->serial;
    char q[WB_ERR_MSG_MAX + 64];
    b->stats.requests_refused++;
    wb_warn_peer("peer_refused", c->kernel.uid, "reason=%s uid=%u pid=%u error=%s", reason,
                 c->kernel.uid, c->kernel.pid, wb__log_quote(q, sizeof q, msg));
    wb__ops_error(&r, wb__request_scan_id(m->data, m->len), code, msg);
    send_reply(L, 0, &ident, sizeof ident, &r);
    wb__ops_reply_free(&r);
    wb__conns_close(&L->conns, ident, msg);
}

/* Who connection c's requests act as. A hello that carries a descriptor
 * channel session token binds the connection to that session (the token
 * must have been handed to a connection of the same uid, and the same pid
 * when the pid is visible); a peer whose pid the broker cannot see is
 * served only so bound, and only while the session's connection lasts.
 * WB_OK, or a refusal with the reason in err. */
static int peer_identity(loop *L, wb_conn *c, const Wbproto__Request *req, wb_err *err)
{
    int ended = 0;
    if (c->session && !(L->have_fdchan && wb__fdchan_session_alive(&L->fdchan, c->session))) {
        c->creds = c->kernel;
        c->session = 0;
        ended = 1;
    }
    if (req->body_case == WBPROTO__REQUEST__BODY_HELLO && req->hello->session.len > 0) {
        if (!L->have_fdchan)
            return wb__err_set(err, WB_EINVAL,
                               "the hello carries a session token, but this broker has no "
                               "descriptor channel (it has one with --host-slab memfd)");
        wb_peer_creds id;
        uint64_t serial;
        int rc = wb__fdchan_bind(&L->fdchan, &c->kernel, req->hello->session.data,
                                 req->hello->session.len, &id, &serial, err);
        if (rc != WB_OK)
            return rc;
        if (c->session && c->session != serial)
            return wb__err_set(err, WB_EPERM,
                               "this connection is bound to another descriptor channel session "
                               "already, which is still open");
        c->creds = id;
        c->session = id.pid_hidden ? serial : 0;
        return WB_OK;
    }
    if (c->creds.known)
        return WB_OK;
    if (!c->kernel.pid_hidden)
        return wb__err_set(err, WB_EPERM, "the broker could not read the peer's credentials");
    if (ended)
        return wb__err_set(err, WB_EPERM,
                           "the descriptor channel session this connection was bound to has "
                           "ended; say hello again with a new session token");
    if (!L->have_fdchan)
        return wb__err_set(err, WB_EPERM,
                           "the peer's pid is not visible from the broker (uid %u, another pid "
                           "namespace) and this broker has no descriptor channel to know it by "
                           "(start it with --host-slab memfd)",
                           c->kernel.uid);
    return wb__err_set(err, WB_EPERM,
                       "the peer's pid is not visible from the broker (uid %u, another pid "
                       "namespace): its hello must carry the session token of the descriptor "
                       "channel %s",
                       c->kernel.uid, L->fdchan.path);
}

/* A complete request from connection c (wb_conns' on_message): decoded,
 * handled, and answered unless the reply comes later. */
static void handle_request(void *ctx, wb_conn *c, const wb_zmtp_msg *m)
{
    loop *L = ctx;
    wb_broker *b = L->b;
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    Wbproto__Request *req = NULL;
    uint64_t id = 0;
    wb_err err;
    char q[WB_ERR_MSG_MAX + 64];
    uint64_t ident = c->serial;

    /* Peers that may not send requests are refused before anything of
     * theirs is decoded: a uid on no allow list, credentials that could
     * not be read, and a connection whose process has exited (it was
     * passed on to another process: its pid may name someone else now). */
    if (c->refused) {
        refuse_and_close(L, c, m, "not_allowed", WB_EPERM, c->refusal);
        return;
    }
    if (wb__pidfd_exited(c->pidfd)) {
        char msg[200];
        refuse_and_close(L, c, m, "process_exited", WB_EPERM,
                         wb__peer_passed_on(c->kernel.pid, msg, sizeof msg));
        return;
    }
    int rc = wb__request_decode(m->data, m->len, &req, &id, &err);
    int close_after = 0;
    if (rc != WB_OK) {
        /* Out of memory is the broker's trouble, not a malformed message. */
        if (rc != WB_ENOMEM)
            b->stats.malformed_messages++;
        wb_warn_peer("bad_message", c->kernel.uid, "reason=%s pid=%u bytes=%zu id=%llu error=%s",
                     rc == WB_ENOMEM ? "out_of_memory" : "decode", c->creds.pid, m->len,
                     (unsigned long long)id, wb__log_quote(q, sizeof q, err.msg));
        wb__ops_error(&r, id, rc, err.msg);
    } else if ((rc = peer_identity(L, c, req, &err)) != WB_OK) {
        b->stats.requests_refused++;
        wb_warn_peer("peer_refused", c->kernel.uid, "reason=credentials uid=%u error=%s",
                     c->kernel.uid, wb__log_quote(q, sizeof q, err.msg));
        wb__ops_error(&r, id, rc, err.msg);
        /* A peer without a usable identity is told why and closed; one
         * whose session ended may say hello again with a new token. */
        close_after = !c->creds.known && !c->kernel.pid_hidden;
    } else {
        /* A lease granted now watches this connection's own process. */
        b->leases.hint_pid = c->creds.pid;
        b->leases.hint_pidfd = c->session ? -1 : c->pidfd;
        int deferred =
            wb__ops_handle(b, &c->creds, req, &ident, sizeof ident, &r) == WB_OPS_DEFERRED;
        b->leases.hint_pidfd = -1;
        if (deferred) {
            /* A load: the reply goes out when the loader is done. */
            wb__request_free(&req);
            wb__ops_reply_free(&r);
            return;
        }
    }
    send_reply(L, req ? (uint32_t)req->body_case : 0, &ident, sizeof ident, &r);
    wb__request_free(&req);
    wb__ops_reply_free(&r);
    if (close_after)
        wb__conns_close(&L->conns, ident, err.msg);
}

/* A connection that closed: its subscriptions end. */
static void conn_closed(void *ctx, uint64_t serial)
{
    loop *L = ctx;
    wb__subs_drop_conn(&L->b->subs, serial);
    wb__publish_conn_closed(L->b, serial);
}

/* Sends a VersionNotice to connection `serial` as a Reply with id 0 and
 * status 0, when its queue has room (wb__conns_offer); else it is dropped
 * and the connection's next heartbeat reply carries the version. */
static int send_notice(void *ctx, uint64_t serial, const Wbproto__VersionNotice *n)
{
    loop *L = ctx;
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.body_case = WBPROTO__REPLY__BODY_NOTICE;
    rep.notice = (Wbproto__VersionNotice *)n;
    size_t len = 0;
    uint8_t *buf = wb__reply_pack(&rep, &len);
    if (!buf)
        return WB_ENOMEM;
    int rc = wb__conns_offer(&L->conns, serial, buf, len);
    free(buf);
    return rc;
}

static void handle_checks(loop *L)
{
    wb_load_job *list = wb__loader_take_done(&L->checker);
    while (list) {
        wb_load_job *job = list;
        list = job->next;
        wb__publish_checksums_done(L->b, job);
        wb__load_job_free(&job);
    }
}

static void handle_tier(loop *L)
{
    wb_load_job *list = wb__loader_take_done(&L->tier);
    while (list) {
        wb_load_job *job = list;
        list = job->next;
        wb__tier_done(L->b, job);
        wb__load_job_free(&job);
    }
}

static void handle_loads(loop *L)
{
    wb_load_job *list = wb__loader_take_done(&L->loader);
    while (list) {
        wb_load_job *job = list;
        list = job->next;
        if (job->kind == WB_JOB_FORGET) {
            wb__load_job_free(&job);
            continue;
        }
        if (job->kind == WB_JOB_PUBLISH) {
            wb_ops_reply r = WB_OPS_REPLY_INIT;
            wb__publish_copy_done(L->b, job, &r);
            send_reply(L, job->op, job->ident, job->ident_len, &r);
            wb__ops_reply_free(&r);
            wb__load_job_free(&job);
            continue;
        }
        /* Refused for the budget: room made, submitted again. */
        if (wb__tier_load_back(L->b, job))
            continue;
        wb_model *model;
        wb__broker_finish_load(L->b, job, &model);
        if (job->ident) {
            wb_ops_reply r = WB_OPS_REPLY_INIT;
            wb__ops_load_done(L->b, job, model, &r);
            send_reply(L, job->op, job->ident, job->ident_len, &r);
            wb__ops_reply_free(&r);
        }
        wb__load_job_free(&job);
    }
}

/* Tells systemd (Type=notify) how the broker is doing. Without
 * $NOTIFY_SOCKET, or without libsystemd at build time, nothing is sent. */
static void notify_systemd(const char *state)
{
#ifdef WB_HAVE_SYSTEMD
    int rc = sd_notify(0, state);
    char q[128], qe[128];
    if (rc < 0)
        wb_warn("sd_notify", "state=%s error=%s", wb__log_quote(q, sizeof q, state),
                wb__log_quote(qe, sizeof qe, strerror(-rc)));
    else if (rc > 0)
        wb_info("sd_notify", "state=%s", wb__log_quote(q, sizeof q, state));
#else
    (void)state;
#endif
}

/* SIGHUP: the reload hook, inside RELOADING=1 ... READY=1 for systemd
 * (MONOTONIC_USEC tells it which reload this is). */
static void reload_config(loop *L)
{
    if (!L->reload || !L->reload->fn) {
        wb_info("config_reload", "result=skipped note=\"nothing to reload\"");
        return;
    }
    char state[128];
    snprintf(state, sizeof state, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading",
             (unsigned long long)wb__clock_mono_us());
    notify_systemd(state);
    L->reload->fn(L->reload->ctx, L->b);
    notify_systemd("READY=1\nSTATUS=serving");
}

/* Everything the signalfd holds: the first stop signal ends the loop, one
 * reload serves any number of SIGHUPs read together, the others are logged
 * (with who sent them) and ignored. */
static void handle_signals(loop *L)
{
    struct signalfd_siginfo si;
    int hup = 0;
    while (read(L->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        int signo = (int)si.ssi_signo;
        char buf[32];
        const char *name = wb__signal_name(signo, buf, sizeof buf);
        switch (wb__signal_action(signo)) {
        case WB_SIGNAL_STOP:
            wb_info("signal", "signal=%s action=stop sender_pid=%u", name, si.ssi_pid);
            if (!L->stop)
                L->stop = signo;
            break;
        case WB_SIGNAL_RELOAD:
            wb_info("signal", "signal=%s action=reload sender_pid=%u", name, si.ssi_pid);
            hup = 1;
            break;
        default:
            wb_info("signal", "signal=%s action=ignored sender_pid=%u", name, si.ssi_pid);
            break;
        }
    }
    if (hup && !L->stop)
        reload_config(L);
}

/* Registers new connections and follows the output interest of the others
 * (EPOLLOUT while replies wait). A closed connection left the set when its
 * descriptor was closed. A walk of the table, no system call unless
 * something changed. */
static int sync_conns(loop *L)
{
    for (size_t i = 0; L->conns.interest_changed && i < L->conns.n; i++) {
        wb_conn *c = L->conns.v[i];
        uint32_t want = EPOLLIN | (c->out_head ? EPOLLOUT : 0);
        if (c->loop_events == want)
            continue;
        struct epoll_event ev = {.events = want, .data.u64 = EV_CONN | c->serial};
        if (epoll_ctl(L->ep, c->loop_events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) != 0)
            return -1;
        c->loop_events = want;
    }
    L->conns.interest_changed = 0;
    if (L->cap_evs < L->conns.n + 8) {
        size_t cap = (L->conns.n + 8) * 2;
        struct epoll_event *evs = wb__realloc(L->evs, cap * sizeof *evs);
        if (!evs)
            return -1;
        L->evs = evs;
        uint64_t *serials = wb__realloc(L->serials, cap * sizeof *serials);
        if (!serials)
            return -1;
        L->serials = serials;
        uint32_t *rev = wb__realloc(L->revents, cap * sizeof *rev);
        if (!rev)
            return -1;
        L->revents = rev;
        L->cap_evs = cap;
    }
    return 0;
}

static int add_fixed(int ep, int fd, uint64_t tag)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

/* Every peer whose pidfd reports an exit: its leases are reclaimed and its
 * record forgotten (which closes the pidfd and so leaves the set). */
static void handle_deaths(loop *L)
{
    struct epoll_event ev[64];
    int n;
    do {
        n = epoll_wait(L->epfd, ev, 64, 0);
        for (int i = 0; i < n; i++)
            wb__broker_reclaim_pid(L->b, ev[i].data.u32);
    } while (n == 64);
}

/* Connections with events, handled by identity: handling one may remove
 * others from the table (a reply to a slow reader). */
static void handle_conns(loop *L, size_t k)
{
    for (size_t j = 0; j < k; j++)
        wb__conns_event(&L->conns, L->serials[j], (L->revents[j] & EPOLLOUT) != 0,
                        (L->revents[j] & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0);
}

static void shutdown_loads(loop *L)
{
    /* Checksums not done stay pending: their versions go with the broker. */
    wb_load_job *list = wb__loader_stop(&L->checker);
    while (list) {
        wb_load_job *job = list;
        list = job->next;
        job->sum_model->sum_job = NULL;
        wb__load_job_free(&job);
    }
    wb__publish_sum_pool_free(&L->b->sum_pool);
    /* Moves and restores not done end with the broker (its models go). */
    list = wb__loader_stop(&L->tier);
    while (list) {
        wb_load_job *job = list;
        list = job->next;
        wb_model *m = job->tier_model;
        if (job->tier_op == WB_TIER_OP_MOVE && job->tier_ran) {
            /* Done, not yet taken: a move freed the model's slabs. */
            L->b->tier = NULL;
            m->tier_wanted = 0;
            wb__tier_done(L->b, job);
            wb__load_job_free(&job);
            continue;
        }
        m->tier_job = NULL;
        if (m->leases)
            m->leases--;
        wb__tier_job_release(job);
        wb__load_job_free(&job);
    }
    list = wb__loader_stop(&L->loader);
    wb__publish_src_cache_free(&L->b->src_cache);
    while (list) {
        wb_load_job *job = list;
        list = job->next;
        if (job->kind == WB_JOB_PUBLISH && job->publish)
            /* Not made current: the publish ends with the broker. */
            job->publish->committing = 0;
        if (job->ident) {
            wb_ops_reply r = WB_OPS_REPLY_INIT;
            wb__ops_error(&r, job->request_id, WB_ESTATE,
                          job->kind == WB_JOB_PUBLISH
                              ? "the broker is stopping; the publish was abandoned"
                              : "the broker is stopping; the load was abandoned");
            send_reply(L, job->op, job->ident, job->ident_len, &r);
            wb__ops_reply_free(&r);
        }
        wb__load_job_free(&job);
    }
}

int wb__loop_run(wb_broker *b, const char *socket_path, const wb_loop_options *opt,
                 const wb_loop_reload *reload, wb_err *err)
{
    loop L = {.b = b, .opt = opt, .sigfd = -1, .reload = reload, .epfd = -1, .ep = -1};
    L.conns = (wb_conns){.opt = opt,
                         .stats = &b->stats,
                         .on_message = handle_request,
                         .admit = admit_peer,
                         .on_close = conn_closed,
                         .ctx = &L,
                         .exempt_uid = b->euid,
                         .lfd = -1,
                         .spare = -1};
    int rc = WB_OK, bound = 0;
    char q[WB_PATH_MAX + 64];
    if ((rc = wb__conns_listen(&L.conns, socket_path, err)) != WB_OK) {
        wb__conns_destroy(&L.conns);
        return rc;
    }
    bound = 1;

    sigset_t mask;
    wb__signals_fill(&mask);
    L.sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (L.sigfd < 0) {
        rc = wb__err_errno(err, WB_EIO, errno, "signalfd");
        goto out_unlink;
    }
    L.epfd = epoll_create1(EPOLL_CLOEXEC);
    if (L.epfd < 0) {
        rc = wb__err_errno(err, WB_EIO, errno, "epoll_create1");
        goto out_unlink;
    }
    /* Peers that hold leases already (none today: leases come only from
     * requests) join the set as they would at their first grant. */
    for (size_t i = 0; i < b->leases.n_peers; i++) {
        wb_peer_rec *p = b->leases.peers[i];
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = p->pid};
        if (p->pidfd >= 0)
            epoll_ctl(L.epfd, EPOLL_CTL_ADD, p->pidfd, &ev);
    }
    b->leases.epfd = L.epfd;
    if ((rc = wb__loader_start(&L.loader, err)) != WB_OK)
        goto out_unlink;
    if ((rc = wb__loader_start(&L.checker, err)) != WB_OK)
        goto out_unlink;
    if ((rc = wb__loader_start(&L.tier, err)) != WB_OK)
        goto out_unlink;
    L.ep = epoll_create1(EPOLL_CLOEXEC);
    if (L.ep < 0 || add_fixed(L.ep, L.conns.lfd, EV_LISTEN) != 0 ||
        add_fixed(L.ep, L.sigfd, EV_SIGNAL) != 0 || add_fixed(L.ep, L.loader.efd, EV_LOADER) != 0 ||
        add_fixed(L.ep, L.checker.efd, EV_CHECKER) != 0 ||
        add_fixed(L.ep, L.tier.efd, EV_TIER) != 0 || add_fixed(L.ep, L.epfd, EV_DEATH) != 0) {
        rc = wb__err_errno(err, WB_EIO, errno, "setting up the epoll set");
        goto out_unlink;
    }
    if (b->cfg.backend->slab_fd) {
        L.have_fdchan = 1;
        if ((rc = wb__fdchan_listen(&L.fdchan, b, socket_path, opt, err)) != WB_OK)
            goto out_unlink;
        if (add_fixed(L.ep, L.fdchan.ep, EV_FDCHAN) != 0) {
            rc = wb__err_errno(err, WB_EIO, errno, "setting up the epoll set");
            goto out_unlink;
        }
        wb_info("fd_channel", "socket=%s", wb__log_quote(q, sizeof q, L.fdchan.path));
    }
    b->loader = &L.loader;
    b->checker = &L.checker;
    b->tier = &L.tier;
    b->notify = send_notice;
    b->notify_ctx = &L;

    wb_info("listen",
            "socket=%s backend=%s heartbeat_ms=%u stale_ms=%u pid=%u max_peers=%u "
            "max_request_bytes=%zu max_frames=%u max_buffered_bytes=%zu max_queued_replies=%d "
            "max_queued_bytes=%zu max_queued_bytes_total=%zu max_peers_per_process=%u "
            "max_peers_per_uid=%u max_sessions_per_uid=%u handshake_timeout_ms=%u",
            wb__log_quote(q, sizeof q, socket_path), b->cfg.backend->name, b->cfg.heartbeat_ms,
            b->cfg.stale_ms, b->pid, opt->max_peers, opt->max_request, opt->max_frames,
            opt->max_buffered, opt->max_queued_replies, opt->max_queued_bytes,
            opt->max_queued_total, opt->max_per_process, opt->max_per_uid,
            opt->max_sessions_per_uid, opt->handshake_ms);
    /* Preloads are done and the socket is bound: clients may come. */
    notify_systemd("READY=1\nSTATUS=serving");
    wb__metrics_serving(b->metrics, 1);
    wb__metrics_tick(b->metrics, b, 1);

    long wait_ms = LOOP_MAX_WAIT_MS;
    if (b->cfg.stale_ms / 4 < (uint32_t)wait_ms)
        wait_ms = b->cfg.stale_ms / 4 > 10 ? (long)(b->cfg.stale_ms / 4) : 10;
    int64_t next_scan = 0;
    while (!L.stop) {
        /* Connections past their handshake deadline go first; the next
         * deadline bounds the wait. */
        long deadline = wb__conns_expire(&L.conns);
        if (sync_conns(&L) != 0) {
            int e = errno;
            wb_error("poll_setup", "error=\"%s\"", strerror(e));
            rc = wb__err_errno(err, WB_EIO, e, "registering connections with epoll");
            break;
        }
        int pr = epoll_wait(L.ep, L.evs, (int)L.cap_evs,
                            (int)(deadline >= 0 && deadline < wait_ms ? deadline : wait_ms));
        if (pr < 0 && errno != EINTR) {
            int e = errno;
            rc = wb__err_errno(err, WB_EIO, e, "epoll_wait");
            wb_error("poll_failed", "error=\"%s\"", strerror(e));
            break;
        }
        if (pr > 0) {
            int listen = 0, signals = 0, loads = 0, deaths = 0, fdchan = 0, checks = 0, tier = 0;
            size_t k = 0;
            for (int i = 0; i < pr; i++) {
                uint64_t tag = L.evs[i].data.u64;
                if (tag & EV_CONN) {
                    L.serials[k] = tag & ~EV_CONN;
                    L.revents[k++] = L.evs[i].events;
                } else {
                    listen |= tag == EV_LISTEN;
                    signals |= tag == EV_SIGNAL;
                    loads |= tag == EV_LOADER;
                    deaths |= tag == EV_DEATH;
                    fdchan |= tag == EV_FDCHAN;
                    checks |= tag == EV_CHECKER;
                    tier |= tag == EV_TIER;
                }
            }
            if (signals)
                handle_signals(&L);
            /* Deaths first: a pid that died and was reused must not act on
             * the dead process's leases in this same round. */
            if (deaths)
                handle_deaths(&L);
            if (fdchan)
                wb__fdchan_handle(&L.fdchan);
            if (loads)
                handle_loads(&L);
            if (checks)
                handle_checks(&L);
            if (tier)
                handle_tier(&L);
            handle_conns(&L, k);
            if (listen)
                wb__conns_accept(&L.conns);
        }
        if (L.have_fdchan)
            wb__fdchan_expire(&L.fdchan);
        b->stats.connections = (uint32_t)L.conns.n;
        wb__broker_pace_heartbeats(b, L.conns.n, b->now_ms());
        /* The stale scan walks every lease: on a timer, not per message. */
        size_t went_stale = 0;
        int64_t now = b->now_ms();
        if (now >= next_scan) {
            went_stale = wb__broker_scan_stale(b);
            next_scan = now + wait_ms;
            size_t trimmed = wb__vmm_pool_trim(wb__clock_mono_ms());
            if (trimmed)
                wb_info("slab_pool_trimmed", "slabs=%zu kept_bytes=%llu", trimmed,
                        (unsigned long long)wb__vmm_pool_bytes(-1));
        }
        /* What is on each device, for the loads judged by the budget. */
        if (pr > 0)
            wb__tier_refresh(b);
        wb__metrics_tick(b->metrics, b, pr > 0 || went_stale > 0);
    }

    notify_systemd("STOPPING=1");
    wb__metrics_serving(b->metrics, 0);
    shutdown_loads(&L);
    b->loader = NULL;
    b->checker = NULL;
    b->tier = NULL;
    b->notify = NULL;
    b->notify_ctx = NULL;
    char signame[32];
    wb_info("stop",
            "leases_held=%zu leases_stale=%zu peers=%zu models=%zu replies_dropped=%llu signal=%s",
            b->leases.n_leases,
            wb__leases_count_state(&b->leases, WBPROTO__LEASE_STATE__LEASE_STALE),
            b->leases.n_holders, b->models.n, (unsigned long long)b->stats.replies_dropped,
            L.stop ? wb__signal_name(L.stop, signame, sizeof signame) : "none");

out_unlink:
    /* Nothing was queued when setting up failed; stopped already else. */
    wb__loader_stop(&L.checker);
    wb__loader_stop(&L.tier);
    wb__loader_stop(&L.loader);
    if (L.have_fdchan)
        wb__fdchan_destroy(&L.fdchan);
    wb__conns_destroy(&L.conns);
    if (L.sigfd >= 0)
        close(L.sigfd);
    b->leases.epfd = -1;
    if (L.epfd >= 0)
        close(L.epfd);
    if (L.ep >= 0)
        close(L.ep);
    free(L.evs);
    free(L.serials);
    free(L.revents);
    if (bound)
        unlink(socket_path);
    return rc;
}
