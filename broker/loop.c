#include "loop.h"

#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "ops_admin.h"
#include "paths.h"
#include "wire.h"
#include "zmtp.h"

#include <errno.h>
#include <fcntl.h>
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

/* One queued write: a whole message (reply, greeting, PONG). */
typedef struct outbuf {
    struct outbuf *next;
    size_t len, off;
    uint8_t data[];
} outbuf;

/* One client connection: its socket, the ZMTP codec, its credentials
 * (SO_PEERCRED) and the messages waiting to be written. */
typedef struct conn {
    int fd;
    uint64_t serial; /* the connection's identity for deferred replies */
    wb_zmtp z;
    size_t held; /* wb__zmtp_buffered(&z) as counted in loop.buffered */
    wb_peer_creds creds;
    outbuf *out_head, *out_tail;
    int queued; /* messages in the queue */
} conn;

typedef struct loop {
    wb_broker *b;
    const wb_loop_options *opt;
    int lfd;   /* the listening socket */
    int spare; /* a descriptor kept to be freed when accept meets EMFILE */
    int sigfd;
    wb_loader loader;
    int stop;
    zmq_pollitem_t *items;
    size_t cap_items;
    uint32_t *item_pids; /* pid of each pidfd item */
    size_t first_conn_item;
    conn **conns;
    size_t n_conns, cap_conns;
    uint64_t next_serial;
    size_t buffered; /* bytes held by every connection's codec */
    int64_t refused_logged_ms;
    uint64_t refused_since_log;
} loop;

/* A reply is addressed by the connection's serial number, 8 bytes: a
 * connection that closed and a new one never share it. */
static conn *find_conn(loop *L, const void *id, size_t id_len, size_t *index)
{
    uint64_t serial;
    if (id_len != sizeof serial)
        return NULL;
    memcpy(&serial, id, sizeof serial);
    for (size_t i = 0; i < L->n_conns; i++) {
        if (L->conns[i]->serial == serial) {
            if (index)
                *index = i;
            return L->conns[i];
        }
    }
    return NULL;
}

static void remove_conn(loop *L, size_t i)
{
    conn *c = L->conns[i];
    L->buffered -= c->held;
    wb__zmtp_free(&c->z);
    while (c->out_head) {
        outbuf *o = c->out_head;
        c->out_head = o->next;
        free(o);
    }
    close(c->fd);
    free(c);
    L->conns[i] = L->conns[--L->n_conns];
}

/* Writes what the queue holds until the socket would block. Returns -1
 * when the peer is gone. */
static int conn_flush(conn *c)
{
    while (c->out_head) {
        outbuf *o = c->out_head;
        ssize_t n = send(c->fd, o->data + o->off, o->len - o->off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        o->off += (size_t)n;
        if (o->off < o->len)
            continue;
        c->out_head = o->next;
        if (!c->out_head)
            c->out_tail = NULL;
        c->queued--;
        free(o);
    }
    return 0;
}

/* Queues one message (hdr then body) for the connection and writes what
 * the socket takes. Returns 0, WB_ELIMIT when --max-queued-replies
 * messages are queued already (the peer does not read), WB_ENOMEM, or
 * WB_EIO when the peer is gone. */
static int conn_send(loop *L, conn *c, const void *hdr, size_t hl, const void *body, size_t len)
{
    if (c->queued >= L->opt->max_queued_replies)
        return WB_ELIMIT;
    outbuf *o = malloc(sizeof *o + hl + len);
    if (!o)
        return WB_ENOMEM;
    o->next = NULL;
    o->len = hl + len;
    o->off = 0;
    if (hl)
        memcpy(o->data, hdr, hl);
    if (len)
        memcpy(o->data + hl, body, len);
    if (c->out_tail)
        c->out_tail->next = o;
    else
        c->out_head = o;
    c->out_tail = o;
    c->queued++;
    return conn_flush(c) == 0 ? WB_OK : WB_EIO;
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
    remove_conn(L, i);
}

/* Sends what the codec asked for (greeting, READY, PONG). */
static int flush_codec(loop *L, conn *c)
{
    if (c->z.out_len == 0)
        return WB_OK;
    size_t n = c->z.out_len;
    c->z.out_len = 0;
    return conn_send(L, c, NULL, 0, c->z.out, n);
}

/* Packs and sends a reply to the connection `ident` as one ZMTP frame. A
 * peer that went away loses it; a peer that leaves --max-queued-replies
 * messages unread loses it and is disconnected (replies_dropped counts
 * both). `op` is the request's body field number (0: undecodable), for the
 * per-operation counters. */
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
    size_t i;
    conn *c = find_conn(L, ident, ident_len, &i);
    int rc = WB_EIO;
    if (c) {
        uint8_t hdr[9];
        size_t hl = wb__zmtp_frame_header(hdr, len);
        rc = conn_send(L, c, hdr, hl, buf, len);
    }
    free(buf);
    if (rc == WB_OK)
        return;
    b->stats.replies_dropped++;
    if (rc == WB_ELIMIT) {
        char msg[128];
        snprintf(msg, sizeof msg, "the peer left %d replies unread (--max-queued-replies)",
                 L->opt->max_queued_replies);
        violation(L, i, "slow_reader", msg);
        return;
    }
    wb_debug("reply_dropped", "reason=%s id=%llu", c ? "peer_gone" : "no_connection",
             (unsigned long long)rep->id);
    if (c)
        remove_conn(L, i);
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
    uint64_t ident = c->serial;

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
    } else if (wb__ops_handle(b, &c->creds, req, &ident, sizeof ident, &arena, &rep) ==
               WB_OPS_DEFERRED) {
        /* A load: the reply goes out when the loader is done. */
        wb__request_free(&req);
        wb__arena_free(&arena);
        return;
    }
    send_reply(L, req ? (uint32_t)req->body_case : 0, &ident, sizeof ident, &rep, &arena);
    wb__request_free(&req);
    wb__arena_free(&arena);
}

/* Counts a refused connection; logs at most one line a second. */
static void refused(loop *L, const char *reason, uint32_t pid)
{
    L->b->stats.peers_refused++;
    L->refused_since_log++;
    int64_t now = wb__clock_mono_ms();
    if (now - L->refused_logged_ms < 1000)
        return;
    wb_warn("peer_refused", "reason=%s pid=%u max_peers=%u refused=%llu", reason, pid,
            L->opt->max_peers, (unsigned long long)L->refused_since_log);
    L->refused_logged_ms = now;
    L->refused_since_log = 0;
}

/* Accepts pending connections. Above --max-peers a connection is
 * closed at once; when the process is out of descriptors the spare one is
 * given up for a moment to accept and close the connection, so that the
 * backlog drains and the broker never stops on EMFILE. */
static void accept_conns(loop *L)
{
    /* At most 256 a round, so that a flood of connections cannot keep the
     * loop from everything else. */
    for (int round = 0; round < 256; round++) {
        int fd = accept4(L->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if ((errno == EMFILE || errno == ENFILE) && L->spare >= 0) {
                close(L->spare);
                fd = accept4(L->lfd, NULL, NULL, SOCK_CLOEXEC);
                if (fd >= 0)
                    close(fd);
                L->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (fd >= 0) {
                    refused(L, "out_of_descriptors", 0);
                    continue;
                }
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                wb_error("accept_failed", "error=\"%s\"", strerror(errno));
            return;
        }
        /* A connection whose credentials cannot be read is served, but
         * every request of it is refused (handle_request). */
        wb_peer_creds creds;
        wb_err cerr;
        if (wb__peer_creds_from_fd(fd, &creds, &cerr) != WB_OK) {
            char q[WB_ERR_MSG_MAX + 64];
            wb_warn("peer_credentials", "error=%s", wb__log_quote(q, sizeof q, cerr.msg));
        }
        if (L->n_conns >= L->opt->max_peers) {
            close(fd);
            refused(L, "max_peers", creds.pid);
            continue;
        }
        conn *c = NULL;
        if (L->n_conns == L->cap_conns) {
            size_t cap = L->cap_conns ? L->cap_conns * 2 : 16;
            conn **p = realloc(L->conns, cap * sizeof *p);
            if (p) {
                L->conns = p;
                L->cap_conns = cap;
            }
        }
        if (L->n_conns < L->cap_conns)
            c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            refused(L, "out_of_memory", creds.pid);
            continue;
        }
        c->fd = fd;
        c->serial = ++L->next_serial;
        c->creds = creds;
        wb_zmtp_limits lim = {.max_message = L->opt->max_request, .max_frames = L->opt->max_frames};
        wb__zmtp_init(&c->z, &lim);
        L->conns[L->n_conns++] = c;
        wb_debug("peer_connected", "pid=%u uid=%u connections=%zu", creds.pid, creds.uid,
                 L->n_conns);
        if (flush_codec(L, c) != WB_OK)
            remove_conn(L, L->n_conns - 1);
    }
}

/* Bytes from a connection: through the codec, under the per-connection and
 * the aggregate bounds, and every complete request handled. Returns 0
 * while the connection stays, -1 once it was removed. */
static int conn_input(loop *L, size_t i, const void *data, size_t len)
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
        return -1;
    }
    int rc = wb__zmtp_feed(&c->z, data, len, &err);
    for (;;) {
        L->buffered = L->buffered - c->held + wb__zmtp_buffered(&c->z);
        c->held = wb__zmtp_buffered(&c->z);
        if (rc < 0) {
            if (rc == WB_ENOMEM)
                wb_error("peer_input", "error=out_of_memory");
            violation(L, i, rc == WB_ELIMIT ? "limit" : "protocol", err.msg);
            return -1;
        }
        wb_zmtp_msg m;
        rc = wb__zmtp_next(&c->z, &m, &err);
        if (c->z.out_len > 0) {
            int src = flush_codec(L, c);
            if (src == WB_ELIMIT) {
                violation(L, i, "slow_reader", "the peer does not read what the broker sends");
                return -1;
            }
            if (src != WB_OK) {
                remove_conn(L, i);
                return -1;
            }
        }
        if (rc == 0)
            return 0;
        if (rc == 1) {
            if (m.frames != 1) {
                L->b->stats.malformed_messages++;
                wb_warn("bad_message", "reason=frame_count frames=%zu pid=%u", m.frames,
                        c->creds.pid);
                continue;
            }
            uint64_t serial = c->serial;
            handle_request(L, c, &m);
            /* The reply may have ended the connection. */
            if (!find_conn(L, &serial, sizeof serial, &i))
                return -1;
            rc = WB_OK;
        }
    }
}

/* Reads what a connection sent, at most 256 KiB a round so that one peer
 * cannot starve the others. */
static void conn_readable(loop *L, size_t i)
{
    uint8_t buf[WB_ZMTP_READ_CHUNK];
    for (int round = 0; round < 4; round++) {
        conn *c = L->conns[i];
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            wb_debug("peer_disconnected", "pid=%u", c->creds.pid);
            remove_conn(L, i);
            return;
        }
        if (conn_input(L, i, buf, (size_t)n) != 0)
            return;
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

/* Builds the poll set: listener, signals, loads, one pidfd per process
 * that holds leases, then one item per connection (item_pids holds the
 * connection's index there). */
static int build_items(loop *L, size_t *n)
{
    const wb_lease_table *t = &L->b->leases;
    size_t need = 3 + t->n_peers + L->n_conns;
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
    it[0].fd = L->lfd;
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
    L->first_conn_item = k;
    for (size_t i = 0; i < L->n_conns; i++) {
        it[k].fd = L->conns[i]->fd;
        it[k].events = (short)(ZMQ_POLLIN | (L->conns[i]->out_head ? ZMQ_POLLOUT : 0));
        L->item_pids[k] = (uint32_t)i;
        k++;
    }
    *n = k;
    return 0;
}

/* Connections with events, handled by identity: handling one may remove
 * others from the table (a reply to a slow reader), so indexes move. */
static void handle_conns(loop *L, size_t n)
{
    size_t m = n - L->first_conn_item;
    uint64_t *serials = malloc((m ? m : 1) * sizeof *serials);
    short *revents = malloc((m ? m : 1) * sizeof *revents);
    if (!serials || !revents) {
        free(serials);
        free(revents);
        return;
    }
    size_t k = 0;
    for (size_t j = L->first_conn_item; j < n; j++) {
        if (!L->items[j].revents)
            continue;
        serials[k] = L->conns[L->item_pids[j]]->serial;
        revents[k++] = L->items[j].revents;
    }
    for (size_t j = 0; j < k; j++) {
        size_t i;
        conn *c = find_conn(L, &serials[j], sizeof serials[j], &i);
        if (!c)
            continue;
        if ((revents[j] & ZMQ_POLLOUT) && conn_flush(c) != 0) {
            remove_conn(L, i);
            continue;
        }
        if (revents[j] & (ZMQ_POLLIN | ZMQ_POLLERR))
            conn_readable(L, i);
    }
    free(serials);
    free(revents);
}

/* Binds the unix socket the clients' DEALER sockets connect to (libzmq's
 * ipc:// is a plain SOCK_STREAM unix socket). The broker accepts and
 * reads itself and speaks ZMTP through zmtp.h: libzmq's ROUTER would
 * buffer an unfinished multipart message without limit, queue replies for
 * a peer that never reads, and abort on EMFILE in accept. */
static int setup_socket(loop *L, const char *path, wb_err *err)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sun.sun_path)
        return wb__err_set(err, WB_EINVAL, "socket path is too long: %s", path);
    memcpy(sun.sun_path, path, strlen(path) + 1);
    L->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (L->lfd < 0)
        return wb__err_errno(err, WB_EIO, errno, "socket");
    /* Sockets are created with 0777 & ~umask: 0117 gives 0660. */
    mode_t old = umask(0117);
    int rc = bind(L->lfd, (struct sockaddr *)&sun, sizeof sun);
    int e = errno;
    umask(old);
    if (rc != 0)
        return wb__err_errno(err, WB_EIO, e, "cannot bind %s", path);
    if (listen(L->lfd, 128) != 0)
        return wb__err_errno(err, WB_EIO, errno, "cannot listen on %s", path);
    struct stat st;
    if (stat(path, &st) != 0)
        return wb__err_errno(err, WB_EIO, errno, "stat %s after binding", path);
    if ((st.st_mode & 07777) != 0660 && chmod(path, 0660) != 0)
        return wb__err_errno(err, WB_EIO, errno, "chmod 0660 %s", path);
    L->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
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
    loop L = {.b = b, .opt = opt, .lfd = -1, .spare = -1, .sigfd = -1};
    int rc = WB_OK, bound = 0;
    char q[WB_PATH_MAX + 64];
    if ((rc = setup_socket(&L, socket_path, err)) != WB_OK) {
        if (L.lfd >= 0)
            close(L.lfd);
        return rc;
    }
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
            for (size_t i = 3; i < L.first_conn_item; i++) {
                if (L.items[i].revents)
                    wb__broker_reclaim_pid(b, L.item_pids[i]);
            }
            if (L.items[2].revents)
                handle_loads(&L);
            handle_conns(&L, n);
            if (L.items[0].revents & ZMQ_POLLIN)
                accept_conns(&L);
        }
        b->stats.connections = (uint32_t)L.n_conns;
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
    close(L.lfd);
    if (L.spare >= 0)
        close(L.spare);
    if (bound)
        unlink(socket_path);
    return rc;
}
