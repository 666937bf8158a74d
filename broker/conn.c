#include "conn.h"

#include "clock.h"
#include "alloc.h"
#include "log.h"
#include "paths.h"
#include "ratelog.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

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
    int rc = wb__mkdir_p(dir, 0, 0750, 1, err);
    if (rc != WB_OK)
        return rc;
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

/* A reply is addressed by the connection's serial number, 8 bytes: a
 * connection that closed and a new one never share it. */
static wb_conn *conn_find(wb_conns *cs, const void *id, size_t id_len, size_t *index)
{
    uint64_t serial;
    if (id_len != sizeof serial)
        return NULL;
    memcpy(&serial, id, sizeof serial);
    /* cs->v is in serial order (accepted in that order, removed with a
     * move): a binary search, not a scan of every connection per event. */
    size_t lo = 0, hi = cs->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cs->v[mid]->serial < serial)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < cs->n && cs->v[lo]->serial == serial) {
        if (index)
            *index = lo;
        return cs->v[lo];
    }
    return NULL;
}

static void conn_remove(wb_conns *cs, size_t i)
{
    wb_conn *c = cs->v[i];
    if (cs->on_close)
        cs->on_close(cs->ctx, c->serial);
    cs->buffered -= c->held;
    cs->queued_bytes -= c->queued_bytes;
    wb__zmtp_free(&c->z);
    if (c->pidfd >= 0)
        close(c->pidfd);
    while (c->out_head) {
        outbuf *o = c->out_head;
        c->out_head = o->next;
        free(o);
    }
    close(c->fd);
    free(c);
    /* Moved down, not swapped with the last, to keep the serial order. */
    memmove(&cs->v[i], &cs->v[i + 1], (cs->n - i - 1) * sizeof cs->v[0]);
    cs->n--;
}

/* Writes what the queue holds until the socket would block. Returns -1
 * when the peer is gone. */
static int conn_flush(wb_conns *cs, wb_conn *c)
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
        c->queued_bytes -= (size_t)n;
        cs->queued_bytes -= (size_t)n;
        if (o->off < o->len)
            continue;
        c->out_head = o->next;
        if (!c->out_head) {
            c->out_tail = NULL;
            cs->interest_changed = 1; /* EPOLLOUT no longer wanted */
        }
        c->queued--;
        free(o);
    }
    /* A connection being closed goes once its last reply is out. */
    return c->closing ? -1 : 0;
}

/* One non-blocking write, best effort (what the socket does not take is
 * dropped). */
static void send_once(int fd, const void *buf, size_t n)
{
    ssize_t w;
    do {
        w = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
}

/* Tells a peer why it is being disconnected, with a ZMTP ERROR command
 * written straight to the socket (libzmq reports it to its user; without
 * it a DEALER reconnects forever, saying nothing). Best effort: skipped
 * when part of a message is still queued, since the command would land
 * inside it. */
static void send_error(wb_conn *c, const char *reason)
{
    if (c->out_head)
        return;
    uint8_t buf[9 + 3 + WB_ZMTP_MAX_REASON];
    send_once(c->fd, buf, wb__zmtp_error_command(buf, reason));
}

/* Queues one message (its frames' headers and bodies, `n` pieces in order)
 * for the connection and writes what the socket takes. Returns 0;
 * WB_ELIMIT when --max-queued-replies messages are queued already, or when
 * the message would take the peer's queue over --max-queued-bytes or every
 * peer's over --max-queued-bytes-total (one message always fits an empty
 * queue; the peer does not read; `why` says which); WB_ENOMEM; or WB_EIO
 * when the peer is gone. */
static int conn_send(wb_conns *cs, wb_conn *c, const struct iovec *iov, int n, char *why,
                     size_t why_len)
{
    size_t total = 0;
    for (int k = 0; k < n; k++)
        total += iov[k].iov_len;
    if (c->queued >= cs->opt->max_queued_replies) {
        snprintf(why, why_len, "the peer left %d replies unread (--max-queued-replies)",
                 cs->opt->max_queued_replies);
        return WB_ELIMIT;
    }
    if (c->queued > 0 && c->queued_bytes + total > cs->opt->max_queued_bytes) {
        snprintf(why, why_len,
                 "the peer left %zu bytes unread; %zu more would pass %zu (--max-queued-bytes)",
                 c->queued_bytes, total, cs->opt->max_queued_bytes);
        return WB_ELIMIT;
    }
    /* The total bounds what peers that do not read may hold beyond one reply
     * each: a reply to a peer with nothing queued always goes out, so a burst
     * of honest clients acquiring a large model at once (64 replies of 8 MB,
     * more than the total) is served rather than cut off. */
    if (c->queued > 0 && cs->queued_bytes + total > cs->opt->max_queued_total) {
        snprintf(why, why_len,
                 "%zu more bytes would take the replies queued for all peers over %zu "
                 "(--max-queued-bytes-total)",
                 total, cs->opt->max_queued_total);
        return WB_ELIMIT;
    }
    /* Nothing queued: write straight from the caller's buffers, and copy
     * only what the socket did not take (a large reply is not copied once
     * more on its way out). */
    size_t done = 0;
    if (!c->out_head) {
        struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
        ssize_t w;
        do {
            w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        } while (w < 0 && errno == EINTR);
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return WB_EIO;
        done = w > 0 ? (size_t)w : 0;
        if (done == total)
            return WB_OK;
    }
    outbuf *o = wb__malloc(sizeof *o + total - done);
    if (!o)
        return WB_ENOMEM;
    o->next = NULL;
    o->len = total - done;
    o->off = 0;
    uint8_t *to = o->data;
    for (int k = 0; k < n; k++) {
        size_t len = iov[k].iov_len;
        size_t skip = done < len ? done : len;
        done -= skip;
        memcpy(to, (const uint8_t *)iov[k].iov_base + skip, len - skip);
        to += len - skip;
    }
    if (c->out_tail) {
        c->out_tail->next = o;
    } else {
        c->out_head = o;
        cs->interest_changed = 1; /* EPOLLOUT wanted until it drains */
    }
    c->out_tail = o;
    c->queued++;
    c->queued_bytes += o->len;
    cs->queued_bytes += o->len;
    return conn_flush(cs, c) == 0 ? WB_OK : WB_EIO;
}

/* A peer that broke a transport bound or the protocol: logged, counted,
 * disconnected. */
static void violation(wb_conns *cs, size_t i, const char *reason, const char *msg)
{
    wb_conn *c = cs->v[i];
    char q[WB_ERR_MSG_MAX + 64];
    cs->stats->peers_disconnected++;
    wb_warn_peer("peer_disconnected", c->kernel.uid, "reason=%s pid=%u uid=%u error=%s", reason,
                 c->creds.pid, c->creds.uid, wb__log_quote(q, sizeof q, msg));
    send_error(c, msg);
    conn_remove(cs, i);
}

/* Sends what the codec asked for (greeting, READY, PONG). */
static int flush_codec(wb_conns *cs, wb_conn *c, char *why, size_t why_len)
{
    if (c->z.out_len == 0)
        return WB_OK;
    size_t n = c->z.out_len;
    c->z.out_len = 0;
    struct iovec iov = {c->z.out, n};
    return conn_send(cs, c, &iov, 1, why, why_len);
}

/* Counts a refused connection; logs at most one line a second. */
static void refused(wb_conns *cs, const char *reason, uint32_t pid)
{
    cs->stats->peers_refused++;
    cs->refused_since_log++;
    int64_t now = wb__clock_mono_ms();
    if (now - cs->refused_logged_ms < 1000)
        return;
    wb_warn("peer_refused", "reason=%s pid=%u max_peers=%u max_peers_per_process=%u refused=%llu",
            reason, pid, cs->opt->max_peers, cs->opt->max_per_process,
            (unsigned long long)cs->refused_since_log);
    cs->refused_logged_ms = now;
    cs->refused_since_log = 0;
}

/* Closes a connection refused before it was served, after our greeting
 * and a ZMTP ERROR with the reason (one write, best effort). */
static void close_refused(int fd, const char *reason)
{
    wb_zmtp z;
    wb_zmtp_limits lim = {.max_message = 1, .max_frames = 1};
    wb__zmtp_init(&z, &lim);
    uint8_t buf[WB_ZMTP_GREETING_SIZE + 9 + 3 + WB_ZMTP_MAX_REASON];
    memcpy(buf, z.out, z.out_len);
    size_t n = z.out_len + wb__zmtp_error_command(buf + z.out_len, reason);
    wb__zmtp_free(&z);
    send_once(fd, buf, n);
    close(fd);
}

/* Accepts pending connections. Above --max-peers a connection is
 * closed at once; when the process is out of descriptors the spare one is
 * given up for a moment to accept and close the connection, so that the
 * backlog drains and the broker never stops on EMFILE. */
void wb__conns_accept(wb_conns *cs)
{
    /* At most 256 a round, so that a flood of connections cannot keep the
     * loop from everything else. */
    for (int round = 0; round < 256; round++) {
        int fd = accept4(cs->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if ((errno == EMFILE || errno == ENFILE) && cs->spare >= 0) {
                close(cs->spare);
                fd = accept4(cs->lfd, NULL, NULL, SOCK_CLOEXEC);
                if (fd >= 0)
                    close(fd);
                cs->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (fd >= 0) {
                    refused(cs, "out_of_descriptors", 0);
                    continue;
                }
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                wb_error("accept_failed", "error=\"%s\"", strerror(errno));
            return;
        }
        /* A connection whose credentials cannot be read is served, but
         * every request of it is refused (loop.c); one whose pid is hidden
         * (another pid namespace) is served once its hello names a
         * descriptor channel session. */
        wb_peer_creds creds;
        wb_err cerr;
        if (wb__peer_creds_from_fd(fd, &creds, &cerr) != WB_OK && !creds.pid_hidden) {
            char q[WB_ERR_MSG_MAX + 64];
            wb_warn("peer_credentials", "error=%s", wb__log_quote(q, sizeof q, cerr.msg));
        }
        if (cs->n >= cs->opt->max_peers) {
            close(fd);
            refused(cs, "max_peers", creds.pid);
            continue;
        }
        /* The process that connected, proven by a pidfd from here on; its
         * supplementary groups are read through it. */
        char refusal[WB_REFUSE_MAX] = "";
        int refuse = 0;
        int pidfd = -1;
        if (creds.known) {
            wb_err perr;
            pidfd = wb__peer_pidfd(fd, &creds, &perr);
            if (pidfd < 0) {
                snprintf(refusal, sizeof refusal, "%.190s", perr.msg);
                refuse = 1;
            }
        }
        /* Judged by its uid and groups before anything is read from it: a
         * refused peer is answered once and closed, and only a few of one
         * uid are kept at once. */
        if (!refuse && (creds.known || creds.pid_hidden) && cs->admit &&
            cs->admit(cs->ctx, &creds, pidfd, refusal, sizeof refusal) != 0)
            refuse = 1;
        if (!creds.known && !creds.pid_hidden) {
            snprintf(refusal, sizeof refusal, "%.190s", cerr.msg);
            refuse = 1;
        }
        if (refuse && pidfd >= 0) {
            close(pidfd);
            pidfd = -1;
        }
        unsigned same_uid = 0, refused_uid = 0;
        for (size_t k = 0; k < cs->n; k++) {
            const wb_conn *o = cs->v[k];
            if (o->kernel.uid == creds.uid && (o->kernel.known || o->kernel.pid_hidden)) {
                same_uid++;
                refused_uid += o->refused;
            }
        }
        if (refuse && refused_uid >= WB_REFUSED_PER_UID) {
            close_refused(fd, refusal);
            refused(cs, "refused_uid", creds.pid);
            continue;
        }
        if (!refuse && creds.uid != 0 && creds.uid != cs->exempt_uid &&
            same_uid >= cs->opt->max_per_uid) {
            char why[WB_REFUSE_MAX];
            snprintf(why, sizeof why,
                     "uid %u holds %u connections already, the most one uid may "
                     "(--max-peers-per-uid)",
                     creds.uid, same_uid);
            close_refused(fd, why);
            if (pidfd >= 0)
                close(pidfd);
            refused(cs, "max_peers_per_uid", creds.pid);
            continue;
        }
        /* One process cannot take the whole table: libwbclient holds one
         * connection per client object, far fewer than this. */
        if (creds.known) {
            unsigned same = 0;
            for (size_t k = 0; k < cs->n; k++)
                same += cs->v[k]->kernel.known && cs->v[k]->kernel.pid == creds.pid;
            if (same >= cs->opt->max_per_process) {
                close_refused(fd, "this process holds --max-peers-per-process connections already");
                if (pidfd >= 0)
                    close(pidfd);
                refused(cs, "max_peers_per_process", creds.pid);
                continue;
            }
        }
        wb_conn *c = NULL;
        if (cs->n == cs->cap) {
            size_t cap = cs->cap ? cs->cap * 2 : 16;
            wb_conn **p = wb__realloc(cs->v, cap * sizeof *p);
            if (p) {
                cs->v = p;
                cs->cap = cap;
            }
        }
        if (cs->n < cs->cap)
            c = wb__calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            if (pidfd >= 0)
                close(pidfd);
            refused(cs, "out_of_memory", creds.pid);
            continue;
        }
        c->fd = fd;
        c->pidfd = pidfd;
        c->refused = refuse;
        if (refuse)
            snprintf(c->refusal, sizeof c->refusal, "%s", refusal);
        c->serial = ++cs->next_serial;
        c->creds = creds;
        c->kernel = creds;
        c->accepted_ms = wb__clock_mono_ms();
        int64_t due = c->accepted_ms + (int64_t)cs->opt->handshake_ms;
        if (cs->next_expire_ms == 0 || due < cs->next_expire_ms)
            cs->next_expire_ms = due;
        cs->interest_changed = 1; /* a new descriptor to register */
        wb_zmtp_limits lim = {.max_message = cs->opt->max_request,
                              .max_frames = cs->opt->max_frames};
        wb__zmtp_init(&c->z, &lim);
        cs->v[cs->n++] = c;
        wb_debug("peer_connected", "pid=%u uid=%u connections=%zu", creds.pid, creds.uid, cs->n);
        char why[160];
        if (flush_codec(cs, c, why, sizeof why) != WB_OK)
            conn_remove(cs, cs->n - 1);
    }
}

/* Bytes from a connection: through the codec, under the per-connection and
 * the aggregate bounds, and every complete request handled. Returns 0
 * while the connection stays, -1 once it was removed. */
/* *ip is the connection's index, updated when handling a message moved it
 * (another connection closed meanwhile). */
static int conn_input(wb_conns *cs, size_t *ip, const void *data, size_t len)
{
    size_t i = *ip;
    wb_conn *c = cs->v[i];
    wb_err err;
    /* At least what the codec will hold once these bytes are in. */
    size_t after = wb__zmtp_pending(&c->z) + len;
    if (after > c->held && cs->buffered - c->held + after > cs->opt->max_buffered) {
        char msg[192];
        snprintf(msg, sizeof msg,
                 "holding %zu more bytes would take the connections over %zu buffered bytes "
                 "(--max-buffered-bytes)",
                 len, cs->opt->max_buffered);
        violation(cs, i, "max_buffered", msg);
        return -1;
    }
    int rc = wb__zmtp_feed(&c->z, data, len, &err);
    int more = 1; /* the codec may have more to give */
    for (;;) {
        /* Charged what the codec really holds, after every step: a
         * consumed message is given back at once, not at the next read. */
        cs->buffered = cs->buffered - c->held + wb__zmtp_buffered(&c->z);
        c->held = wb__zmtp_buffered(&c->z);
        if (rc < 0) {
            if (rc == WB_ENOMEM)
                wb_error("peer_input", "error=out_of_memory");
            violation(cs, i, rc == WB_ELIMIT ? "limit" : "protocol", err.msg);
            return -1;
        }
        if (!more)
            return 0;
        wb_zmtp_msg m;
        rc = wb__zmtp_next(&c->z, &m, &err);
        more = rc != 0;
        if (c->z.out_len > 0) {
            char why[160];
            int src = flush_codec(cs, c, why, sizeof why);
            if (src == WB_ELIMIT) {
                violation(cs, i, "slow_reader", why);
                return -1;
            }
            if (src != WB_OK) {
                conn_remove(cs, i);
                return -1;
            }
        }
        if (rc == 0 || rc == WB_ZMTP_FLUSH)
            continue; /* re-synced above; 0 then returns */
        if (rc == 1) {
            if (m.frames != 1) {
                cs->stats->malformed_messages++;
                wb_warn_peer("bad_message", c->kernel.uid, "reason=frame_count frames=%zu pid=%u",
                             m.frames, c->creds.pid);
                continue;
            }
            uint64_t serial = c->serial;
            cs->on_message(cs->ctx, c, &m);
            /* The reply may have ended the connection, or another one,
             * which moves this one down the table. */
            if (!conn_find(cs, &serial, sizeof serial, &i))
                return -1;
            *ip = i;
            c = cs->v[i];
            if (c->closing)
                return 0; /* nothing more is read from it */
            rc = WB_OK;
        }
    }
}

/* Reads what a connection sent, at most 256 KiB a round so that one peer
 * cannot starve the others. */
static void conn_readable(wb_conns *cs, size_t i)
{
    uint8_t buf[WB_ZMTP_READ_CHUNK];
    for (int round = 0; round < 4; round++) {
        wb_conn *c = cs->v[i];
        if (c->closing)
            return;
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            wb_debug("peer_disconnected", "pid=%u", c->creds.pid);
            conn_remove(cs, i);
            return;
        }
        if (conn_input(cs, &i, buf, (size_t)n) != 0)
            return;
    }
}

/* Binds the unix socket the clients' DEALER sockets connect to (libzmq's
 * ipc:// is a plain SOCK_STREAM unix socket). The broker accepts and
 * reads itself and speaks ZMTP through zmtp.h: libzmq's ROUTER would
 * buffer an unfinished multipart message without limit, queue replies for
 * a peer that never reads, and abort on EMFILE in accept. */
int wb__conns_listen(wb_conns *cs, const char *path, wb_err *err)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sun.sun_path)
        return wb__err_set(err, WB_EINVAL, "socket path is too long: %s", path);
    memcpy(sun.sun_path, path, strlen(path) + 1);
    cs->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (cs->lfd < 0)
        return wb__err_errno(err, WB_EIO, errno, "socket");
    /* Sockets are created with 0777 & ~umask: 0117 gives 0660. */
    mode_t old = umask(0117);
    int rc = bind(cs->lfd, (struct sockaddr *)&sun, sizeof sun);
    int e = errno;
    umask(old);
    if (rc != 0)
        return wb__err_errno(err, WB_EIO, e, "cannot bind %s", path);
    if (listen(cs->lfd, 128) != 0)
        return wb__err_errno(err, WB_EIO, errno, "cannot listen on %s", path);
    struct stat st;
    if (stat(path, &st) != 0)
        return wb__err_errno(err, WB_EIO, errno, "stat %s after binding", path);
    if ((st.st_mode & 07777) != 0660 && chmod(path, 0660) != 0)
        return wb__err_errno(err, WB_EIO, errno, "chmod 0660 %s", path);
    cs->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return WB_OK;
}

int wb__conns_send(wb_conns *cs, const void *ident, size_t ident_len, const void *body, size_t len,
                   const void *frame, size_t frame_len)
{
    size_t i;
    wb_conn *c = conn_find(cs, ident, ident_len, &i);
    if (!c)
        return WB_ENOTFOUND;
    uint8_t hdr[9], hdr2[9];
    struct iovec iov[4];
    iov[0] = (struct iovec){hdr, wb__zmtp_frame_header(hdr, len, frame != NULL)};
    iov[1] = (struct iovec){(void *)body, len};
    int n = 2;
    if (frame) {
        iov[2] = (struct iovec){hdr2, wb__zmtp_frame_header(hdr2, frame_len, 0)};
        iov[3] = (struct iovec){(void *)frame, frame_len};
        n = 4;
    }
    char why[192];
    int rc = conn_send(cs, c, iov, n, why, sizeof why);
    if (rc == WB_ELIMIT) {
        violation(cs, i, "slow_reader", why);
    } else if (rc != WB_OK) {
        conn_remove(cs, i);
        rc = WB_EIO;
    }
    return rc;
}

int wb__conns_offer(wb_conns *cs, uint64_t serial, const void *body, size_t len)
{
    wb_conn *c = conn_find(cs, &serial, sizeof serial, NULL);
    if (!c)
        return WB_ENOTFOUND;
    if (c->closing || c->z.state != WB_ZMTP_READY)
        return WB_ELIMIT;
    uint8_t hdr[9];
    size_t hl = wb__zmtp_frame_header(hdr, len, 0);
    if (2 * (c->queued + 1) > cs->opt->max_queued_replies ||
        2 * (c->queued_bytes + hl + len) > cs->opt->max_queued_bytes ||
        2 * (cs->queued_bytes + hl + len) > cs->opt->max_queued_total)
        return WB_ELIMIT;
    struct iovec iov[2] = {{hdr, hl}, {(void *)body, len}};
    char why[192];
    /* A peer gone is removed when its end of file is read, not under the
     * caller's walk of the subscriptions. */
    int rc = conn_send(cs, c, iov, 2, why, sizeof why);
    return rc == WB_EIO || rc == WB_ENOMEM ? rc : WB_OK;
}

void wb__conns_event(wb_conns *cs, uint64_t serial, int writable, int readable)
{
    size_t i;
    wb_conn *c = conn_find(cs, &serial, sizeof serial, &i);
    if (!c)
        return;
    if (writable && conn_flush(cs, c) != 0) {
        conn_remove(cs, i);
        return;
    }
    if (readable)
        conn_readable(cs, i);
}

long wb__conns_expire(wb_conns *cs)
{
    int64_t now = wb__clock_mono_ms();
    /* Nothing is due before the earliest deadline seen at accept or at the
     * last scan: most wakeups (heartbeats of 1,000 peers) skip the walk. */
    if (cs->next_expire_ms == 0)
        return -1;
    if (now < cs->next_expire_ms)
        return (long)(cs->next_expire_ms - now);
    long next = -1;
    for (size_t i = 0; i < cs->n;) {
        wb_conn *c = cs->v[i];
        /* A refused connection has until its deadline for its one request,
         * whatever state its handshake is in. */
        if (c->z.state == WB_ZMTP_READY && !c->refused) {
            i++;
            continue;
        }
        int64_t left = c->accepted_ms + (int64_t)cs->opt->handshake_ms - now;
        if (left > 0) {
            if (next < 0 || left < next)
                next = (long)left;
            i++;
            continue;
        }
        /* Counted as a disconnection; logged like refusals, at most once a
         * second, since one process may hold --max-peers-per-process of them
         * every deadline. */
        cs->stats->peers_disconnected++;
        cs->timeouts_since_log++;
        if (now - cs->timeout_logged_ms >= 1000) {
            wb_warn("peer_disconnected",
                    "reason=handshake_timeout pid=%u uid=%u handshake_timeout_ms=%u closed=%llu",
                    c->creds.pid, c->creds.uid, cs->opt->handshake_ms,
                    (unsigned long long)cs->timeouts_since_log);
            cs->timeout_logged_ms = now;
            cs->timeouts_since_log = 0;
        }
        send_error(c, c->refused ? c->refusal : "the ZMTP handshake did not complete in time");
        conn_remove(cs, i); /* the next one moved to i */
    }
    cs->next_expire_ms = next < 0 ? 0 : now + next;
    return next;
}

void wb__conns_close(wb_conns *cs, uint64_t serial, const char *reason)
{
    size_t i;
    wb_conn *c = conn_find(cs, &serial, sizeof serial, &i);
    if (!c)
        return;
    if (reason)
        send_error(c, reason);
    c->closing = 1;
    if (!c->out_head)
        conn_remove(cs, i);
}

void wb__conns_destroy(wb_conns *cs)
{
    while (cs->n > 0)
        conn_remove(cs, cs->n - 1);
    free(cs->v);
    cs->v = NULL;
    if (cs->lfd >= 0)
        close(cs->lfd);
    if (cs->spare >= 0)
        close(cs->spare);
    cs->lfd = cs->spare = -1;
}
