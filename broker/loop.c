#include "loop.h"

#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "paths.h"
#include "wire.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#ifdef WB_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

/* The longest the loop sleeps, so that stale leases are noticed in time. */
#define LOOP_MAX_WAIT_MS 250

/* Creates every missing directory above `path`; new ones get mode 0750
 * whatever the umask, existing ones are left alone. */
static int make_parents(const char *path, wb_err *err)
{
    char dir[WB_PATH_MAX + 1];
    int n = snprintf(dir, sizeof dir, "%s", path);
    if (n < 0 || (size_t)n >= sizeof dir)
        return wb__err_set(err, WB_EINVAL, "socket path is too long: %s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return WB_OK;
    *slash = '\0';
    for (char *p = dir + 1;; p++) {
        int end = *p == '\0';
        if (*p != '/' && !end)
            continue;
        *p = '\0';
        if (mkdir(dir, 0750) == 0) {
            if (chmod(dir, 0750) != 0)
                return wb__err_errno(err, WB_EIO, errno, "chmod %s", dir);
        } else if (errno != EEXIST) {
            return wb__err_errno(err, WB_EIO, errno, "cannot create directory %s", dir);
        }
        if (end)
            break;
        *p = '/';
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return wb__err_set(err, WB_EIO, "%s is not a directory", dir);
    return WB_OK;
}

int wb__socket_prepare(const char *path, wb_err *err)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sun.sun_path)
        return wb__err_set(err, WB_EINVAL, "socket path has %zu bytes, at most %zu: %s",
                           strlen(path), sizeof sun.sun_path - 1, path);
    int rc = make_parents(path, err);
    if (rc != WB_OK)
        return rc;
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return WB_OK;
        return wb__err_errno(err, WB_EIO, errno, "cannot check %s", path);
    }
    if (!S_ISSOCK(st.st_mode))
        return wb__err_set(err, WB_EEXIST, "%s exists and is not a socket; refusing to replace it",
                           path);
    memcpy(sun.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return wb__err_errno(err, WB_EIO, errno, "socket");
    int c = connect(fd, (struct sockaddr *)&sun, sizeof sun);
    int e = errno;
    close(fd);
    if (c == 0)
        return wb__err_set(err, WB_EEXIST, "another broker is listening on %s", path);
    if (e != ECONNREFUSED && e != ENOENT)
        return wb__err_errno(err, WB_EIO, e, "cannot check whether a broker listens on %s", path);
    if (unlink(path) != 0 && errno != ENOENT)
        return wb__err_errno(err, WB_EIO, errno, "cannot remove the stale socket %s", path);
    char q[WB_PATH_MAX + 64];
    wb_info("stale_socket_removed", "socket=%s", wb__log_quote(q, sizeof q, path));
    return WB_OK;
}

typedef struct loop {
    wb_broker *b;
    void *sock;
    int sigfd;
    wb_loader loader;
    int stop;
    zmq_pollitem_t *items;
    size_t cap_items;
    uint32_t *item_pids; /* pid of each pidfd item */
} loop;

static void free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

/* Packs and sends a reply to `ident`; a peer that went away loses it (the
 * ROUTER drops it) and the broker moves on. `op` is the request's body field
 * number (0: undecodable), for the per-operation counters. */
static void send_reply(loop *L, uint32_t op, const void *ident, size_t ident_len,
                       Wbproto__Reply *rep, wb_arena *a)
{
    wb_broker *b = L->b;
    size_t len = 0;
    uint8_t *buf = wb__reply_pack(rep, &len);
    if (buf && len > b->limits.max_message) {
        free(buf);
        char msg[160];
        snprintf(msg, sizeof msg,
                 "the reply would take %zu bytes, over the %llu-byte message limit "
                 "(--max-message-bytes)",
                 len, (unsigned long long)b->limits.max_message);
        wb__ops_error(rep, a, rep->id, WB_ELIMIT, msg);
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
    zmq_msg_t msg;
    if (zmq_msg_init_data(&msg, buf, len, free_buf, NULL) != 0) {
        free(buf);
        b->stats.replies_dropped++;
        return;
    }
    if (zmq_send(L->sock, ident, ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_msg_send(&msg, L->sock, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&msg);
        b->stats.replies_dropped++;
        wb_debug("reply_dropped", "reason=%s id=%llu", zmq_strerror(e),
                 (unsigned long long)rep->id);
    }
}

static void handle_request(loop *L, zmq_msg_t *ident, zmq_msg_t *payload)
{
    wb_broker *b = L->b;
    wb_arena arena = {0};
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    Wbproto__Request *req = NULL;
    uint64_t id = 0;
    wb_err err;
    char q[WB_ERR_MSG_MAX + 64];
    const char *pa = zmq_msg_gets(payload, "Peer-Address");
    wb_peer_creds peer;
    int creds_rc = wb__peer_parse_address(pa, &peer, &err);

    int rc = wb__request_decode(zmq_msg_data(payload), zmq_msg_size(payload), &req, &id, &err);
    if (rc != WB_OK) {
        b->stats.malformed_messages++;
        wb_warn("bad_message", "reason=decode pid=%u bytes=%zu id=%llu error=%s", peer.pid,
                zmq_msg_size(payload), (unsigned long long)id, wb__log_quote(q, sizeof q, err.msg));
        wb__ops_error(&rep, &arena, id, rc, err.msg);
    } else if (creds_rc != WB_OK) {
        wb_warn("peer_refused", "reason=credentials error=%s", wb__log_quote(q, sizeof q, err.msg));
        wb__ops_error(&rep, &arena, id, WB_EPERM, err.msg);
    } else if (wb__ops_handle(b, &peer, req, zmq_msg_data(ident), zmq_msg_size(ident), &arena,
                              &rep) == WB_OPS_DEFERRED) {
        /* A load: the reply goes out when the loader is done. */
        wb__request_free(&req);
        wb__arena_free(&arena);
        return;
    }
    send_reply(L, req ? (uint32_t)req->body_case : 0, zmq_msg_data(ident), zmq_msg_size(ident),
               &rep, &arena);
    wb__request_free(&req);
    wb__arena_free(&arena);
}

/* Takes every message queued on the socket: the socket's descriptor only
 * signals edges, so stopping early could leave messages unseen. */
static void drain_socket(loop *L)
{
    for (;;) {
        zmq_msg_t ident, payload;
        zmq_msg_init(&ident);
        if (zmq_msg_recv(&ident, L->sock, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&ident);
            if (e == EINTR)
                continue;
            if (e != EAGAIN)
                wb_error("recv_failed", "error=\"%s\"", zmq_strerror(e));
            return;
        }
        int frames = 1;
        zmq_msg_init(&payload);
        if (zmq_msg_more(&ident)) {
            /* The rest of a multipart message is already queued. */
            while (zmq_msg_recv(&payload, L->sock, 0) < 0 && zmq_errno() == EINTR)
                ;
            frames++;
        }
        int more = frames == 2 && zmq_msg_more(&payload);
        while (more) {
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            if (zmq_msg_recv(&extra, L->sock, 0) < 0 && zmq_errno() == EINTR) {
                zmq_msg_close(&extra);
                continue;
            }
            frames++;
            more = zmq_msg_more(&extra);
            zmq_msg_close(&extra);
        }
        if (frames != 2) {
            L->b->stats.malformed_messages++;
            wb_warn("bad_message", "reason=frame_count frames=%d", frames);
        } else {
            handle_request(L, &ident, &payload);
        }
        zmq_msg_close(&payload);
        zmq_msg_close(&ident);
    }
}

static void handle_loads(loop *L)
{
    wb_load_job *list = wb__loader_take_done(&L->loader);
    while (list) {
        wb_load_job *job = list;
        list = job->next;
        wb_model *model;
        wb__broker_finish_load(L->b, job, &model);
        if (job->ident) {
            wb_arena arena = {0};
            Wbproto__Reply rep = WBPROTO__REPLY__INIT;
            wb__ops_load_done(L->b, job, model, &arena, &rep);
            send_reply(L, WBPROTO__REQUEST__BODY_LOAD, job->ident, job->ident_len, &rep, &arena);
            wb__arena_free(&arena);
        }
        wb__load_job_free(&job);
    }
}

static void handle_signals(loop *L)
{
    struct signalfd_siginfo si;
    while (read(L->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
            wb_info("signal", "signal=%s", si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
            L->stop = 1;
        }
    }
}

/* Builds the poll set: socket, signals, loads, then one pidfd per peer. */
static int build_items(loop *L, size_t *n)
{
    const wb_lease_table *t = &L->b->leases;
    size_t need = 3 + t->n_peers;
    if (need > L->cap_items) {
        size_t cap = need * 2;
        zmq_pollitem_t *items = realloc(L->items, cap * sizeof *items);
        if (!items)
            return -1;
        L->items = items;
        uint32_t *pids = realloc(L->item_pids, cap * sizeof *pids);
        if (!pids)
            return -1;
        L->item_pids = pids;
        L->cap_items = cap;
    }
    zmq_pollitem_t *it = L->items;
    memset(it, 0, need * sizeof *it);
    it[0].socket = L->sock;
    it[0].events = ZMQ_POLLIN;
    it[1].fd = L->sigfd;
    it[1].events = ZMQ_POLLIN;
    it[2].fd = L->loader.efd;
    it[2].events = ZMQ_POLLIN;
    size_t k = 3;
    for (size_t i = 0; i < t->n_peers; i++) {
        if (t->peers[i]->pidfd < 0)
            continue;
        it[k].fd = t->peers[i]->pidfd;
        it[k].events = ZMQ_POLLIN;
        L->item_pids[k] = t->peers[i]->pid;
        k++;
    }
    *n = k;
    return 0;
}

static int setup_socket(loop *L, const char *path, wb_err *err)
{
    char endpoint[WB_PATH_MAX + 16];
    if (wb__socket_endpoint(path, endpoint, sizeof endpoint) != WB_OK)
        return wb__err_set(err, WB_EINVAL, "socket path is too long: %s", path);
    /* libzmq drops the connection of a peer that sends more: nothing that
     * large is ever read into memory. */
    int64_t maxmsg = (int64_t)L->b->limits.max_message;
    int zero = 0;
    if (zmq_setsockopt(L->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0 ||
        zmq_setsockopt(L->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(L->sock, ZMQ_ROUTER_MANDATORY, &zero, sizeof zero) != 0)
        return wb__err_set(err, WB_EIO, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    /* Sockets are created with 0777 & ~umask: 0117 gives 0660. */
    mode_t old = umask(0117);
    int rc = zmq_bind(L->sock, endpoint);
    int e = zmq_errno();
    umask(old);
    if (rc != 0)
        return wb__err_set(err, WB_EIO, "cannot bind %s: %s", endpoint, zmq_strerror(e));
    struct stat st;
    if (stat(path, &st) != 0)
        return wb__err_errno(err, WB_EIO, errno, "stat %s after binding", path);
    if ((st.st_mode & 07777) != 0660 && chmod(path, 0660) != 0)
        return wb__err_errno(err, WB_EIO, errno, "chmod 0660 %s", path);
    return WB_OK;
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

static void shutdown_loads(loop *L)
{
    wb_load_job *list = wb__loader_stop(&L->loader);
    while (list) {
        wb_load_job *job = list;
        list = job->next;
        if (job->ident) {
            wb_arena arena = {0};
            Wbproto__Reply rep = WBPROTO__REPLY__INIT;
            wb__ops_error(&rep, &arena, job->request_id, WB_ESTATE,
                          "the broker is stopping; the load was abandoned");
            send_reply(L, WBPROTO__REQUEST__BODY_LOAD, job->ident, job->ident_len, &rep, &arena);
            wb__arena_free(&arena);
        }
        wb__load_job_free(&job);
    }
}

int wb__loop_run(wb_broker *b, const char *socket_path, wb_err *err)
{
    loop L = {.b = b, .sigfd = -1};
    int rc = WB_OK, bound = 0;
    char q[WB_PATH_MAX + 64];
    void *ctx = zmq_ctx_new();
    if (!ctx)
        return wb__err_set(err, WB_EIO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    L.sock = zmq_socket(ctx, ZMQ_ROUTER);
    if (!L.sock) {
        rc = wb__err_set(err, WB_EIO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        goto out_ctx;
    }
    if ((rc = setup_socket(&L, socket_path, err)) != WB_OK)
        goto out_sock;
    bound = 1;

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    L.sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (L.sigfd < 0) {
        rc = wb__err_errno(err, WB_EIO, errno, "signalfd");
        goto out_unlink;
    }
    if ((rc = wb__loader_start(&L.loader, err)) != WB_OK)
        goto out_unlink;
    b->loader = &L.loader;

    wb_info("listen", "socket=%s backend=%s heartbeat_ms=%u stale_ms=%u pid=%u",
            wb__log_quote(q, sizeof q, socket_path), b->cfg.backend->name, b->cfg.heartbeat_ms,
            b->cfg.stale_ms, b->pid);
    /* Preloads are done and the socket is bound: clients may come. */
    notify_systemd("READY=1\nSTATUS=serving");
    wb__metrics_tick(b->metrics, b, 1);

    long wait_ms = LOOP_MAX_WAIT_MS;
    if (b->cfg.stale_ms / 4 < (uint32_t)wait_ms)
        wait_ms = b->cfg.stale_ms / 4 > 10 ? (long)(b->cfg.stale_ms / 4) : 10;
    while (!L.stop) {
        size_t n;
        if (build_items(&L, &n) != 0) {
            wb_error("poll_setup", "error=out_of_memory");
            rc = wb__err_set(err, WB_ENOMEM, "out of memory building the poll set");
            break;
        }
        int pr = zmq_poll(L.items, (int)n, wait_ms);
        if (pr < 0 && zmq_errno() != EINTR) {
            rc = wb__err_set(err, WB_EIO, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            wb_error("poll_failed", "error=\"%s\"", zmq_strerror(zmq_errno()));
            break;
        }
        if (pr > 0) {
            if (L.items[1].revents)
                handle_signals(&L);
            /* Deaths first: a pid that died and was reused must not act on
             * the dead process's leases in this same round. */
            for (size_t i = 3; i < n; i++) {
                if (L.items[i].revents)
                    wb__broker_reclaim_pid(b, L.item_pids[i]);
            }
            if (L.items[2].revents)
                handle_loads(&L);
            if (L.items[0].revents & ZMQ_POLLIN)
                drain_socket(&L);
        }
        size_t went_stale = wb__broker_scan_stale(b);
        wb__metrics_tick(b->metrics, b, pr > 0 || went_stale > 0);
    }

    notify_systemd("STOPPING=1");
    shutdown_loads(&L);
    b->loader = NULL;
    wb_info("stop", "leases_held=%zu leases_stale=%zu peers=%zu models=%zu replies_dropped=%llu",
            b->leases.n_leases,
            wb__leases_count_state(&b->leases, WBPROTO__LEASE_STATE__LEASE_STALE),
            b->leases.n_peers, b->models.n, (unsigned long long)b->stats.replies_dropped);

out_unlink:
    if (L.sigfd >= 0)
        close(L.sigfd);
    free(L.items);
    free(L.item_pids);
out_sock:
    zmq_close(L.sock);
out_ctx:
    zmq_ctx_term(ctx);
    /* libzmq removes the socket file itself on close; make sure of it, but
     * only when this broker bound it. */
    if (bound)
        unlink(socket_path);
    /* Slab names go with their models; clients keep their own mappings. */
    wb__broker_destroy(b);
    return rc;
}
