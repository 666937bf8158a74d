#include "loop.h"

#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "paths.h"
#include "wire.h"
#include "zmtp.h"

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

/* One connection of the STREAM socket: libzmq's routing id for it, the
 * ZMTP codec and the credentials its Peer-Address gave. */
typedef struct conn {
    uint8_t id[256];
    size_t id_len;
    wb_zmtp z;
    size_t held; /* wb__zmtp_buffered(&z) as counted in loop.buffered */
    int closing; /* disconnect asked for but not yet accepted by libzmq */
    wb_peer_creds creds;
} conn;

typedef struct loop {
    wb_broker *b;
    const wb_loop_options *opt;
    void *sock;
    int sigfd;
    wb_loader loader;
    int stop;
    zmq_pollitem_t *items;
    size_t cap_items;
    uint32_t *item_pids; /* pid of each pidfd item */
    conn **conns;
    size_t n_conns, cap_conns;
    size_t buffered; /* bytes held by every connection's codec */
    size_t n_closing;
} loop;

static void free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

static conn *find_conn(loop *L, const void *id, size_t id_len, size_t *index)
{
    for (size_t i = 0; i < L->n_conns; i++) {
        conn *c = L->conns[i];
        if (c->id_len == id_len && memcmp(c->id, id, id_len) == 0) {
            if (index)
                *index = i;
            return c;
        }
    }
    return NULL;
}

static void remove_conn(loop *L, size_t i)
{
    conn *c = L->conns[i];
    L->buffered -= c->held;
    if (c->closing)
        L->n_closing--;
    wb__zmtp_free(&c->z);
    free(c);
    L->conns[i] = L->conns[--L->n_conns];
}

/* Sends `len` bytes to the connection `id` as one STREAM message. libzmq
 * answers EAGAIN when that connection's queue holds --max-queued-replies
 * messages already, EHOSTUNREACH when it is gone. The buffer is taken over. */
static int stream_send(loop *L, const void *id, size_t id_len, uint8_t *buf, size_t len)
{
    zmq_msg_t msg;
    if (zmq_msg_init_data(&msg, buf, len, free_buf, NULL) != 0) {
        free(buf);
        return -1;
    }
    if (zmq_send(L->sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_msg_send(&msg, L->sock, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&msg);
        errno = e;
        return -1;
    }
    return 0;
}

/* An empty message to a STREAM routing id closes that connection. */
static int stream_close(loop *L, const void *id, size_t id_len)
{
    if (zmq_send(L->sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(L->sock, "", 0, ZMQ_DONTWAIT) < 0)
        return -1;
    return 0;
}

/* Disconnects a connection; when its queue is full the close waits for
 * room (retry_closing) and nothing more is read from it meanwhile. */
static void drop_conn(loop *L, size_t i)
{
    conn *c = L->conns[i];
    if (stream_close(L, c->id, c->id_len) == 0) {
        remove_conn(L, i);
        return;
    }
    if (!c->closing) {
        c->closing = 1;
        L->n_closing++;
    }
    L->buffered -= c->held;
    c->held = 0;
    wb__zmtp_free(&c->z);
}

static void retry_closing(loop *L)
{
    for (size_t i = L->n_conns; i-- > 0;) {
        if (L->conns[i]->closing && stream_close(L, L->conns[i]->id, L->conns[i]->id_len) == 0)
            remove_conn(L, i);
    }
}

/* A peer that broke a transport bound or the protocol: logged, counted,
 * disconnected. */
static void violation(loop *L, size_t i, const char *reason, const char *msg)
{
    conn *c = L->conns[i];
    char q[WB_ERR_MSG_MAX + 64];
    L->b->stats.peers_disconnected++;
    wb_warn("peer_disconnected", "reason=%s pid=%u uid=%u error=%s", reason, c->creds.pid,
            c->creds.uid, wb__log_quote(q, sizeof q, msg));
    drop_conn(L, i);
}

/* Sends what the codec asked for (greeting, READY, PONG). */
static int flush_codec(loop *L, conn *c)
{
    if (c->z.out_len == 0)
        return 0;
    uint8_t *buf = malloc(c->z.out_len);
    if (!buf)
        return -1;
    memcpy(buf, c->z.out, c->z.out_len);
    size_t n = c->z.out_len;
    c->z.out_len = 0;
    return stream_send(L, c->id, c->id_len, buf, n);
}

/* Packs and sends a reply to the connection `ident` as one ZMTP frame; a
 * peer that went away, or whose queue is full because it does not read,
 * loses it (counted in replies_dropped) and the broker moves on. `op` is the
 * request's body field number (0: undecodable), for the per-operation
 * counters. */
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
    uint8_t *frame = NULL;
    size_t hl = 0;
    if (buf) {
        uint8_t hdr[9];
        hl = wb__zmtp_frame_header(hdr, len);
        frame = malloc(hl + len);
        if (frame) {
            memcpy(frame, hdr, hl);
            memcpy(frame + hl, buf, len);
        }
        free(buf);
    }
    if (!frame) {
        b->stats.replies_dropped++;
        wb_error("reply_dropped", "reason=out_of_memory id=%llu", (unsigned long long)rep->id);
        return;
    }
    if (stream_send(L, ident, ident_len, frame, hl + len) == 0)
        return;
    int e = errno;
    b->stats.replies_dropped++;
    size_t i;
    conn *c = find_conn(L, ident, ident_len, &i);
    if (e == EAGAIN && c) {
        /* The peer does not read its replies: what it may keep queued is
         * bounded by the send high-water mark; it gets nothing more. */
        char msg[128];
        snprintf(msg, sizeof msg, "the peer left %d replies unread (--max-queued-replies)",
                 L->opt->max_queued_replies);
        violation(L, i, "slow_reader", msg);
        return;
    }
    wb_debug("reply_dropped", "reason=\"%s\" id=%llu", zmq_strerror(e),
             (unsigned long long)rep->id);
}

static void handle_request(loop *L, conn *c, const wb_zmtp_msg *m)
{
    wb_broker *b = L->b;
    wb_arena arena = {0};
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    Wbproto__Request *req = NULL;
    uint64_t id = 0;
    wb_err err;
    char q[WB_ERR_MSG_MAX + 64];
    /* The codec's buffer may move when a reply is sent: keep the id. */
    uint8_t ident[256];
    size_t ident_len = c->id_len;
    memcpy(ident, c->id, ident_len);

    int rc = wb__request_decode(m->data, m->len, &req, &id, &err);
    if (rc != WB_OK) {
        b->stats.malformed_messages++;
        wb_warn("bad_message", "reason=decode pid=%u bytes=%zu id=%llu error=%s", c->creds.pid,
                m->len, (unsigned long long)id, wb__log_quote(q, sizeof q, err.msg));
        wb__ops_error(&rep, &arena, id, rc, err.msg);
    } else if (!c->creds.known) {
        wb_warn("peer_refused", "reason=credentials");
        wb__ops_error(&rep, &arena, id, WB_EPERM,
                      "the broker could not read the peer's credentials");
    } else if (wb__ops_handle(b, &c->creds, req, ident, ident_len, &arena, &rep) ==
               WB_OPS_DEFERRED) {
        /* A load: the reply goes out when the loader is done. */
        wb__request_free(&req);
        wb__arena_free(&arena);
        return;
    }
    send_reply(L, req ? (uint32_t)req->body_case : 0, ident, ident_len, &rep, &arena);
    wb__request_free(&req);
    wb__arena_free(&arena);
}

/* A new connection (libzmq's empty notification for a routing id not seen
 * before): refused at once above --max-peers, so that accepting never runs
 * out of descriptors; otherwise greeted. */
static void open_conn(loop *L, const void *id, size_t id_len, const char *peer_address)
{
    wb_peer_creds creds;
    wb_err err;
    char q[WB_ERR_MSG_MAX + 64];
    if (wb__peer_parse_address(peer_address, &creds, &err) != WB_OK)
        wb_warn("peer_credentials", "error=%s", wb__log_quote(q, sizeof q, err.msg));
    if (L->n_conns - L->n_closing >= L->opt->max_peers) {
        L->b->stats.peers_refused++;
        wb_warn("peer_refused", "reason=max_peers pid=%u uid=%u max_peers=%u", creds.pid, creds.uid,
                L->opt->max_peers);
        stream_close(L, id, id_len);
        return;
    }
    if (L->n_conns == L->cap_conns) {
        size_t cap = L->cap_conns ? L->cap_conns * 2 : 16;
        conn **p = realloc(L->conns, cap * sizeof *p);
        if (!p) {
            stream_close(L, id, id_len);
            return;
        }
        L->conns = p;
        L->cap_conns = cap;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c || id_len > sizeof c->id) {
        free(c);
        stream_close(L, id, id_len);
        return;
    }
    memcpy(c->id, id, id_len);
    c->id_len = id_len;
    c->creds = creds;
    wb_zmtp_limits lim = {.max_message = L->opt->max_request, .max_frames = L->opt->max_frames};
    wb__zmtp_init(&c->z, &lim);
    L->conns[L->n_conns++] = c;
    wb_debug("peer_connected", "pid=%u uid=%u connections=%zu", creds.pid, creds.uid, L->n_conns);
    if (flush_codec(L, c) != 0)
        drop_conn(L, L->n_conns - 1);
}

/* Bytes from a connection: through the codec, under the per-connection and
 * the aggregate bounds, and every complete request handled. */
static void conn_input(loop *L, size_t i, const void *data, size_t len)
{
    conn *c = L->conns[i];
    wb_err err;
    size_t after = c->z.len + len; /* at least what the codec will hold */
    if (after > c->held && L->buffered - c->held + after > L->opt->max_buffered) {
        char msg[192];
        snprintf(msg, sizeof msg,
                 "holding %zu more bytes would take the connections over %zu buffered bytes "
                 "(--max-buffered-bytes)",
                 len, L->opt->max_buffered);
        violation(L, i, "max_buffered", msg);
        return;
    }
    int rc = wb__zmtp_feed(&c->z, data, len, &err);
    for (;;) {
        L->buffered = L->buffered - c->held + wb__zmtp_buffered(&c->z);
        c->held = wb__zmtp_buffered(&c->z);
        if (rc < 0) {
            if (rc == WB_ENOMEM)
                wb_error("peer_input", "error=out_of_memory");
            violation(L, i, rc == WB_ELIMIT ? "limit" : "protocol", err.msg);
            return;
        }
        wb_zmtp_msg m;
        rc = wb__zmtp_next(&c->z, &m, &err);
        if (c->z.out_len > 0 && flush_codec(L, c) != 0) {
            violation(L, i, "slow_reader", "the peer does not read what the broker sends");
            return;
        }
        if (rc == 0)
            return;
        if (rc == 1) {
            if (m.frames != 1) {
                L->b->stats.malformed_messages++;
                wb_warn("bad_message", "reason=frame_count frames=%zu pid=%u", m.frames,
                        c->creds.pid);
                continue;
            }
            handle_request(L, c, &m);
            /* The reply may have disconnected the peer (slow reader). */
            if (i >= L->n_conns || L->conns[i] != c || c->closing)
                return;
            rc = WB_OK;
        }
    }
}

/* Takes every message queued on the socket: the socket's descriptor only
 * signals edges, so stopping early could leave messages unseen. Each is a
 * routing id and a data frame: empty data says a connection opened or
 * closed, anything else is bytes of the ZMTP stream. */
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
        zmq_msg_init(&payload);
        int got = 0;
        if (zmq_msg_more(&ident)) {
            /* The data frame is queued with its routing id. */
            while (!(got = zmq_msg_recv(&payload, L->sock, 0) >= 0) && zmq_errno() == EINTR)
                ;
        }
        if (got) {
            const void *id = zmq_msg_data(&ident);
            size_t id_len = zmq_msg_size(&ident);
            size_t i;
            conn *c = find_conn(L, id, id_len, &i);
            if (zmq_msg_size(&payload) == 0) {
                if (c) {
                    wb_debug("peer_disconnected", "pid=%u", c->creds.pid);
                    remove_conn(L, i);
                } else {
                    open_conn(L, id, id_len, zmq_msg_gets(&payload, "Peer-Address"));
                }
            } else if (c && !c->closing) {
                conn_input(L, i, zmq_msg_data(&payload), zmq_msg_size(&payload));
            }
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
    /* A STREAM socket: libzmq accepts and moves bytes, the broker speaks
     * ZMTP itself (zmtp.h), so what a peer can make it hold is bounded by
     * the codec, not by libzmq's unbounded multipart reassembly. The send
     * high-water mark bounds the replies queued for a peer that does not
     * read; with STREAM a full queue answers EAGAIN. The receive mark keeps
     * what libzmq reads ahead per connection small (chunks of 8 KiB). */
    int zero = 0, sndhwm = L->opt->max_queued_replies, rcvhwm = 64;
    if (zmq_setsockopt(L->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(L->sock, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm) != 0 ||
        zmq_setsockopt(L->sock, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm) != 0)
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

int wb__loop_run(wb_broker *b, const char *socket_path, const wb_loop_options *opt, wb_err *err)
{
    loop L = {.b = b, .opt = opt, .sigfd = -1};
    int rc = WB_OK, bound = 0;
    char q[WB_PATH_MAX + 64];
    void *ctx = zmq_ctx_new();
    if (!ctx)
        return wb__err_set(err, WB_EIO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    L.sock = zmq_socket(ctx, ZMQ_STREAM);
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

    wb_info("listen",
            "socket=%s backend=%s heartbeat_ms=%u stale_ms=%u pid=%u max_peers=%u "
            "max_request_bytes=%zu max_frames=%u max_buffered_bytes=%zu max_queued_replies=%d",
            wb__log_quote(q, sizeof q, socket_path), b->cfg.backend->name, b->cfg.heartbeat_ms,
            b->cfg.stale_ms, b->pid, opt->max_peers, opt->max_request, opt->max_frames,
            opt->max_buffered, opt->max_queued_replies);
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
        if (L.n_closing > 0)
            retry_closing(&L);
        b->stats.connections = (uint32_t)(L.n_conns - L.n_closing);
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
    while (L.n_conns > 0)
        remove_conn(&L, L.n_conns - 1);
    free(L.conns);
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
    return rc;
}
