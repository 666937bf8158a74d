#include "rpc.h"

#include "alloc.h"
#include "clock.h"
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define DEFAULT_TIMEOUT_MS 5000

int wb__rpc_parse_timeout(const char *text, int *ms)
{
    if (!text || text[0] < '0' || text[0] > '9')
        return WB_EINVAL;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || v <= 0 || v > 86400000)
        return WB_EINVAL;
    *ms = (int)v;
    return WB_OK;
}

int wb__rpc_default_timeout(int *ms, wb_err *err)
{
    const char *env = getenv("WB_TIMEOUT_MS");
    *ms = DEFAULT_TIMEOUT_MS;
    if (!env || !env[0])
        return WB_OK;
    if (wb__rpc_parse_timeout(env, ms) == WB_OK)
        return WB_OK;
    *ms = DEFAULT_TIMEOUT_MS;
    return wb__err_set(err, WB_EINVAL,
                       "WB_TIMEOUT_MS: expected milliseconds from 1 to 86400000, got '%.40s' "
                       "(unset it, or set wb_client_options.timeout_ms)",
                       env);
}

/* Has the socket's connections and disconnections reported on an inproc PAIR
 * socket (rpc->mon); without one (libzmq refused) replies are awaited to
 * their timeout, as before. */
static void watch_socket(wb__rpc *rpc)
{
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://wb-rpc-watch-%p-%llu", (void *)rpc,
             (unsigned long long)rpc->generation);
    if (zmq_socket_monitor(rpc->sock, ep, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0)
        return;
    void *m = zmq_socket(rpc->ctx, ZMQ_PAIR);
    int linger = 0;
    if (m && zmq_setsockopt(m, ZMQ_LINGER, &linger, sizeof linger) == 0 &&
        zmq_connect(m, ep) == 0) {
        rpc->mon = m;
        return;
    }
    if (m)
        zmq_close(m);
    zmq_socket_monitor(rpc->sock, NULL, 0);
}

/* A fresh DEALER with linger 0, so closing it never waits for a dead broker. */
static int open_socket(wb__rpc *rpc, wb_err *err)
{
    void *s = zmq_socket(rpc->ctx, ZMQ_DEALER);
    if (!s)
        return wb__err_set(err, WB_ECONN, "cannot create a socket for %s: %s", rpc->path,
                           zmq_strerror(zmq_errno()));
    int linger = 0;
    int64_t maxmsg = WB_MAX_MESSAGE;
    /* Should the broker restart while this socket lives, libzmq reconnects
     * on its own with the same capped backoff as the client library. */
    int ivl = WB_RPC_RECONNECT_MIN_MS, ivl_max = WB_RPC_RECONNECT_MAX_MS;
    if (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0 ||
        zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(s, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max) != 0 ||
        zmq_connect(s, rpc->endpoint) != 0) {
        int e = zmq_errno();
        zmq_close(s);
        return wb__err_set(err, WB_ECONN, "cannot connect to %s: %s", rpc->path, zmq_strerror(e));
    }
    rpc->sock = s;
    rpc->generation++;
    rpc->down = 0;
    watch_socket(rpc);
    return WB_OK;
}

static void close_socket(wb__rpc *rpc)
{
    if (rpc->mon) {
        zmq_socket_monitor(rpc->sock, NULL, 0);
        zmq_close(rpc->mon);
        rpc->mon = NULL;
    }
    if (rpc->sock) {
        zmq_close(rpc->sock);
        rpc->sock = NULL;
    }
}

/* Reads every event the socket's monitor queued (two frames each: the
 * event number and value, then the endpoint) into rpc->down: 1 from a
 * disconnection until libzmq connects again. */
static void watch_events(wb__rpc *rpc)
{
    while (rpc->mon) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, rpc->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&m) >= sizeof event)
            memcpy(&event, zmq_msg_data(&m), sizeof event);
        if (event == ZMQ_EVENT_DISCONNECTED)
            rpc->down = 1;
        else if (event == ZMQ_EVENT_CONNECTED)
            rpc->down = 0;
        while (zmq_msg_more(&m) && zmq_msg_recv(&m, rpc->mon, ZMQ_DONTWAIT) >= 0)
            ;
        zmq_msg_close(&m);
    }
}

/* "root:root" for a file's owner and group, by name where they have one. */
static void owner_names(char *buf, size_t size, uid_t uid, gid_t gid)
{
    char u[64], g[64];
    struct passwd pw, *pwp = NULL;
    struct group gr, *grp = NULL;
    char tmp[4096];
    if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &pwp) == 0 && pwp)
        snprintf(u, sizeof u, "%s", pwp->pw_name);
    else
        snprintf(u, sizeof u, "%u", (unsigned)uid);
    if (getgrgid_r(gid, &gr, tmp, sizeof tmp, &grp) == 0 && grp)
        snprintf(g, sizeof g, "%s", grp->gr_name);
    else
        snprintf(g, sizeof g, "%u", (unsigned)gid);
    snprintf(buf, size, "%s:%s", u, g);
}

/* Why this process may not connect: the file in the way (`what` is "the
 * socket" or "the directory DIR"), its mode and owner, and who this process
 * is, so that the fix (a group, a mode, --allow-uid is not it) is plain. */
static int denied(const char *path, const char *what, const struct stat *st, wb_err *err)
{
    char owner[140], groups[256] = "";
    owner_names(owner, sizeof owner, st->st_uid, st->st_gid);
    int n = getgroups(0, NULL);
    gid_t *list = n > 0 ? wb__malloc((size_t)n * sizeof *list) : NULL;
    n = list ? getgroups(n, list) : 0;
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof groups; i++) {
        int w =
            snprintf(groups + used, sizeof groups - used, "%s%u", i ? " " : "", (unsigned)list[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    free(list);
    return wb__err_set(err, WB_ECONN,
                       "cannot connect to %s: permission denied: %s is %04o %s and this process "
                       "is uid %u gid %u (%s%s)",
                       path, what, (unsigned)(st->st_mode & 07777), owner, (unsigned)geteuid(),
                       (unsigned)getegid(), n > 0 ? "groups " : "no supplementary groups",
                       n > 0 ? groups : "");
}

/* stat(path) failed with EACCES: the first directory on the way that this
 * process may not search. */
static int denied_dir(const char *path, wb_err *err)
{
    char dir[WB_RPC_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *slash = strchr(dir + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        struct stat st;
        if (stat(dir, &st) == 0 && faccessat(AT_FDCWD, dir, X_OK, AT_EACCESS) != 0 &&
            errno == EACCES) {
            char what[WB_RPC_PATH_MAX + 16];
            snprintf(what, sizeof what, "the directory %s", dir);
            return denied(path, what, &st, err);
        }
        *slash = '/';
    }
    return wb__err_set(err, WB_ECONN, "cannot connect to %s: permission denied", path);
}

/* A socket file left by a broker that died refuses connections; libzmq would
 * retry in silence until the request timed out. One plain connect tells a
 * dead broker from a busy one at once. Anything but a refusal (including a
 * full backlog) is left for the real exchange to judge. */
static int probe_listener(const char *path, const struct stat *st, int *no_access, wb_err *err)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return WB_OK;
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s", path);
    int rc = WB_OK;
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun) != 0) {
        if (errno == ECONNREFUSED)
            rc = wb__err_errno(err, WB_ECONN, errno, "no broker listening at %s", path);
        else if (errno == EACCES || errno == EPERM) {
            *no_access = 1;
            rc = denied(path, "the socket", st, err);
        }
    }
    close(fd);
    return rc;
}

/* libzmq would silently keep retrying a missing path; check first so the
 * caller learns at once that no broker listens there (or that this process
 * may not reach it: *no_access). */
static int check_path(const char *path, int *no_access, wb_err *err)
{
    struct stat st;
    *no_access = 0;
    if (stat(path, &st) != 0) {
        if (errno == EACCES) {
            *no_access = 1;
            return denied_dir(path, err);
        }
        return wb__err_errno(err, WB_ECONN, errno, "no broker socket at %s", path);
    }
    if (!S_ISSOCK(st.st_mode))
        return wb__err_set(err, WB_ECONN, "no broker socket at %s: not a socket", path);
    /* Connecting needs write permission on the socket, as this process's
     * effective ids have it. */
    if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0) {
        if (errno == EACCES) {
            *no_access = 1;
            return denied(path, "the socket", &st, err);
        }
        return wb__err_errno(err, WB_ECONN, errno, "no broker socket at %s", path);
    }
    return probe_listener(path, &st, no_access, err);
}

int wb__rpc_reopen(wb__rpc *rpc, wb_err *err)
{
    close_socket(rpc);
    int rc = check_path(rpc->path, &rpc->denied, err);
    if (rc != WB_OK)
        return rc;
    if (!rpc->ctx && !(rpc->ctx = zmq_ctx_new()))
        return wb__err_set(err, WB_ECONN, "cannot create a ZeroMQ context: %s",
                           zmq_strerror(zmq_errno()));
    if (rpc->next_id == 0)
        rpc->next_id = 1;
    return open_socket(rpc, err);
}

int wb__rpc_open(wb__rpc *rpc, const char *socket_path, int timeout_ms, wb_err *err)
{
    memset(rpc, 0, sizeof *rpc);
    rpc->timeout_ms = timeout_ms;
    if (timeout_ms <= 0) {
        int rc = wb__rpc_default_timeout(&rpc->timeout_ms, err);
        if (rc != WB_OK)
            return rc;
    }
    if (wb__socket_path(socket_path, rpc->path, sizeof rpc->path) != WB_OK)
        return wb__err_set(err, WB_EINVAL, "broker socket path is too long for a socket address");
    if (wb__socket_endpoint(rpc->path, rpc->endpoint, sizeof rpc->endpoint) != WB_OK)
        return wb__err_set(err, WB_EINVAL, "broker socket path %s is too long", rpc->path);

    int rc = check_path(rpc->path, &rpc->denied, err);
    if (rc != WB_OK)
        return rc;

    rpc->ctx = zmq_ctx_new();
    if (!rpc->ctx)
        return wb__err_set(err, WB_ECONN, "cannot create a ZeroMQ context: %s",
                           zmq_strerror(zmq_errno()));
    rpc->next_id = 1;
    rc = open_socket(rpc, err);
    if (rc != WB_OK)
        wb__rpc_close(rpc);
    return rc;
}

void wb__rpc_close(wb__rpc *rpc)
{
    if (!rpc)
        return;
    close_socket(rpc);
    if (rpc->ctx) {
        while (zmq_ctx_term(rpc->ctx) != 0 && zmq_errno() == EINTR)
            ;
        rpc->ctx = NULL;
    }
}

/* Waits for `events` on the socket until `deadline`. Returns 1 when ready,
 * 0 on timeout, a negative code on error. */
static int wait_socket(wb__rpc *rpc, short events, int64_t deadline, wb_err *err)
{
    for (;;) {
        int64_t left = deadline - wb__clock_mono_ms();
        if (left < 0)
            left = 0;
        zmq_pollitem_t item = {.socket = rpc->sock, .events = events};
        int n = zmq_poll(&item, 1, (long)left);
        if (n > 0)
            return 1;
        if (n == 0)
            return 0;
        if (zmq_errno() != EINTR)
            return wb__err_set(err, WB_ECONN, "waiting for the broker at %s: %s", rpc->path,
                               zmq_strerror(zmq_errno()));
        if (left == 0)
            return 0;
    }
}

struct wb__frame {
    zmq_msg_t msg;
};

const uint8_t *wb__frame_data(const wb__frame *f)
{
    return zmq_msg_data((zmq_msg_t *)&f->msg);
}

size_t wb__frame_size(const wb__frame *f)
{
    return zmq_msg_size((zmq_msg_t *)&f->msg);
}

void wb__frame_free(wb__frame **fp)
{
    wb__frame *f = fp ? *fp : NULL;
    if (!f)
        return;
    *fp = NULL;
    zmq_msg_close(&f->msg);
    free(f);
}

/* Drops the rest of a multi-frame message whose frame `msg` was read. */
static void drop_rest(wb__rpc *rpc, zmq_msg_t *msg)
{
    while (zmq_msg_more(msg)) {
        if (zmq_msg_recv(msg, rpc->sock, ZMQ_DONTWAIT) < 0)
            break;
    }
}

/* Reads one message. Returns 1 with the payload in msg (and, when `frame`
 * is not NULL and the message has two frames, the second in *frame), 0 if
 * it was a message of more frames than that (discarded), or a negative
 * code (the message discarded whole). */
static int recv_one(wb__rpc *rpc, zmq_msg_t *msg, wb__frame **frame, wb_err *err)
{
    if (zmq_msg_recv(msg, rpc->sock, 0) < 0) {
        int e = zmq_errno();
        if (e == EAGAIN || e == EINTR)
            return 0;
        return wb__err_set(err, WB_ECONN, "receiving from the broker at %s: %s", rpc->path,
                           zmq_strerror(e));
    }
    if (!zmq_msg_more(msg))
        return 1;
    if (frame) {
        /* The frames of one message arrive together: the second is there. */
        wb__frame *f = wb__malloc(sizeof *f);
        if (!f) {
            /* The frame is dropped with the reply, not left to be read as
             * the next one. */
            drop_rest(rpc, msg);
            return wb__err_set(err, WB_ENOMEM, "out of memory receiving a reply from the broker");
        }
        if (zmq_msg_init(&f->msg) == 0) {
            if (zmq_msg_recv(&f->msg, rpc->sock, ZMQ_DONTWAIT) >= 0 && !zmq_msg_more(&f->msg)) {
                *frame = f;
                return 1;
            }
            drop_rest(rpc, &f->msg);
            zmq_msg_close(&f->msg);
        }
        free(f);
        return 0;
    }
    /* A reply of several frames nobody asked for: drop it whole. */
    drop_rest(rpc, msg);
    return 0;
}

/* The timeout path: drop the socket (and whatever it still queues) and start
 * a new one so the next request cannot meet this request's late reply. */
static int timed_out(wb__rpc *rpc, int timeout_ms, wb_err *err)
{
    close_socket(rpc);
    wb_err ignored;
    open_socket(rpc, &ignored);
    return wb__err_set(err, WB_ETIMEDOUT, "no reply from the broker at %s within %d ms", rpc->path,
                       timeout_ms);
}

/* Sends one message, waiting until `deadline` when the socket cannot take
 * it now. WB_ETIMEDOUT (nothing set in err) when the time ran out. */
static int send_buf(wb__rpc *rpc, const uint8_t *buf, size_t len, int64_t deadline, wb_err *err)
{
    if (!rpc->ctx)
        return wb__err_set(err, WB_ECONN, "not connected to a broker");
    if (!rpc->sock) {
        int rc = open_socket(rpc, err);
        if (rc != WB_OK)
            return rc;
    }
    /* Send first and wait only when the socket says it cannot take the
     * message now: a poll before every send costs a round of system calls
     * for what is almost always ready. */
    for (;;) {
        if (zmq_send(rpc->sock, buf, len, ZMQ_DONTWAIT) >= 0)
            return WB_OK;
        int e = zmq_errno();
        if (e == EINTR)
            continue;
        if (e != EAGAIN)
            return wb__err_set(err, WB_ECONN, "sending to the broker at %s: %s", rpc->path,
                               zmq_strerror(e));
        int ready = wait_socket(rpc, ZMQ_POLLOUT, deadline, err);
        if (ready < 0)
            return ready;
        if (ready == 0)
            return WB_ETIMEDOUT;
    }
}

static int decode(const zmq_msg_t *msg, Wbproto__Reply **rep, wb_err *err)
{
    return wb__reply_decode(zmq_msg_data((zmq_msg_t *)msg), zmq_msg_size((zmq_msg_t *)msg), rep,
                            err);
}

/* An unsolicited notice: handed to the hook and freed. 1 when `rep` was
 * one. */
static int take_notice(wb__rpc *rpc, Wbproto__Reply **rep)
{
    if ((*rep)->id != 0 || (*rep)->body_case != WBPROTO__REPLY__BODY_NOTICE || !(*rep)->notice)
        return 0;
    if (rpc->on_notice)
        rpc->on_notice(rpc->notice_arg, (*rep)->notice);
    wb__reply_free(rep);
    return 1;
}

int wb__rpc_drain(wb__rpc *rpc)
{
    int n = 0;
    if (!rpc->sock)
        return 0;
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, rpc->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            return n;
        }
        int more = zmq_msg_more(&msg);
        Wbproto__Reply *rep = NULL;
        wb_err ignored;
        if (!more && decode(&msg, &rep, &ignored) == WB_OK) {
            n += take_notice(rpc, &rep);
            wb__reply_free(&rep);
        }
        if (more)
            drop_rest(rpc, &msg);
        zmq_msg_close(&msg);
    }
}

int wb__rpc_fd(const wb__rpc *rpc)
{
    int fd = -1;
    size_t len = sizeof fd;
    if (!rpc->sock || zmq_getsockopt(rpc->sock, ZMQ_FD, &fd, &len) != 0)
        return -1;
    return fd;
}

/* Whether the broker a reply is awaited from is gone: the connection
 * closed, libzmq has not connected again, and nothing listens on the path
 * now (a broker that restarts there is waited for, as libzmq delivers the
 * request to it). */
static int gone(wb__rpc *rpc, wb_err *err)
{
    watch_events(rpc);
    if (!rpc->down)
        return 0;
    int no_access = 0;
    wb_err why;
    if (check_path(rpc->path, &no_access, &why) == WB_OK)
        return 0;
    wb__err_set(err, WB_ECONN, "the broker went away before it answered: %s", why.msg);
    return 1;
}

/* Receives the reply to `want_id` (any reply with any_id) until `deadline`.
 * WB_ETIMEDOUT (nothing set in err) when none came in time. */
static int recv_reply(wb__rpc *rpc, uint64_t want_id, int any_id, int64_t deadline,
                      Wbproto__Reply **out, wb__frame **frame, wb_err *err)
{
    if (!rpc->sock)
        return wb__err_set(err, WB_ECONN, "not connected to a broker");
    for (;;) {
        /* A blocking receive bounded by the time left (ZMQ_RCVTIMEO is
         * read at each call and costs no system call to set), instead of a
         * poll and then a receive. */
        int64_t left = deadline - wb__clock_mono_ms();
        int wait = left > 0 ? (int)left : 0;
        /* In slices while the connection is watched: a broker that died
         * answers nothing, and the wait need not run to its end. */
        int sliced = rpc->mon && wait > WB_RPC_WATCH_MS;
        if (sliced)
            wait = WB_RPC_WATCH_MS;
        zmq_setsockopt(rpc->sock, ZMQ_RCVTIMEO, &wait, sizeof wait);
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        wb__frame *second = NULL;
        int got = recv_one(rpc, &msg, frame ? &second : NULL, err);
        if (got <= 0) {
            zmq_msg_close(&msg);
            if (got < 0)
                return got;
            if (left <= 0)
                return WB_ETIMEDOUT;
            if (sliced && gone(rpc, err))
                return WB_ECONN;
            continue;
        }
        Wbproto__Reply *rep = NULL;
        wb_err derr;
        int rc = decode(&msg, &rep, &derr);
        zmq_msg_close(&msg);
        if (rc != WB_OK) {
            wb__frame_free(&second);
            if (rc == WB_ENOMEM)
                return wb__err_set(err, rc, "reply from the broker at %s: %s", rpc->path, derr.msg);
            return wb__err_set(err, rc, "malformed reply from the broker at %s: %s", rpc->path,
                               derr.msg);
        }
        if (take_notice(rpc, &rep)) {
            wb__frame_free(&second);
            continue;
        }
        if (!any_id && rep->id != want_id) {
            /* A late answer to an earlier request: not ours. */
            wb__reply_free(&rep);
            wb__frame_free(&second);
            continue;
        }
        *out = rep;
        if (frame)
            *frame = second;
        return WB_OK;
    }
}

static int exchange(wb__rpc *rpc, const uint8_t *buf, size_t len, uint64_t want_id, int any_id,
                    int timeout_ms, Wbproto__Reply **out, wb__frame **frame, wb_err *err)
{
    int64_t deadline = wb__clock_mono_ms() + timeout_ms;
    int rc = send_buf(rpc, buf, len, deadline, err);
    if (rc == WB_OK)
        rc = recv_reply(rpc, want_id, any_id, deadline, out, frame, err);
    if (rc == WB_OK)
        wb__rpc_drain(rpc); /* notices that came with or after the reply */
    return rc == WB_ETIMEDOUT ? timed_out(rpc, timeout_ms, err) : rc;
}

/* The request and reply body numbers are the same in wb.proto. */
static int check_reply(Wbproto__Reply **out, int want_body, wb_err *err)
{
    Wbproto__Reply *rep = *out;
    if (rep->status > 0) {
        int st = rep->status;
        wb__reply_free(out);
        return wb__err_set(err, WB_EPROTO, "the broker answered with a positive status %d", st);
    }
    if (rep->status < 0)
        return wb__err_set(err, rep->status, "%s",
                           rep->error && rep->error[0] ? rep->error : wb_strerror(rep->status));
    if (want_body != 0 && (int)rep->body_case != want_body) {
        int got = (int)rep->body_case;
        wb__reply_free(out);
        return wb__err_set(err, WB_EPROTO,
                           "the broker answered request kind %d with a reply of kind %d", want_body,
                           got);
    }
    return WB_OK;
}

int wb__rpc_call(wb__rpc *rpc, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                 wb_err *err)
{
    return wb__rpc_call_frame(rpc, req, timeout_ms, out, NULL, err);
}

/* Gives req this protocol's version and the connection's next id, and
 * encodes it; NULL when out of memory. */
static uint8_t *stamp_and_pack(wb__rpc *rpc, Wbproto__Request *req, size_t *len)
{
    req->version = WB_PROTOCOL_VERSION;
    req->id = rpc->next_id++;
    return wb__request_pack(req, len);
}

int wb__rpc_call_frame(wb__rpc *rpc, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                       wb__frame **frame, wb_err *err)
{
    *out = NULL;
    if (frame)
        *frame = NULL;
    if (timeout_ms <= 0)
        timeout_ms = rpc->timeout_ms;
    size_t len = 0;
    uint8_t *buf = stamp_and_pack(rpc, req, &len);
    if (!buf)
        return wb__err_set(err, WB_ENOMEM, "out of memory encoding a request");
    int rc = exchange(rpc, buf, len, req->id, 0, timeout_ms, out, frame, err);
    free(buf);
    if (rc != WB_OK)
        return rc;
    rc = check_reply(out, (int)req->body_case, err);
    if (rc != WB_OK && frame)
        wb__frame_free(frame);
    return rc;
}

int wb__rpc_send(wb__rpc *rpc, Wbproto__Request *req, int timeout_ms, uint64_t *id, wb_err *err)
{
    if (timeout_ms <= 0)
        timeout_ms = rpc->timeout_ms;
    size_t len = 0;
    uint8_t *buf = stamp_and_pack(rpc, req, &len);
    *id = req->id;
    if (!buf)
        return wb__err_set(err, WB_ENOMEM, "out of memory encoding a request");
    int rc = send_buf(rpc, buf, len, wb__clock_mono_ms() + timeout_ms, err);
    free(buf);
    return rc == WB_ETIMEDOUT ? timed_out(rpc, timeout_ms, err) : rc;
}

int wb__rpc_wait(wb__rpc *rpc, uint64_t id, int body, int timeout_ms, Wbproto__Reply **out,
                 wb_err *err)
{
    *out = NULL;
    int rc = recv_reply(rpc, id, 0, wb__clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 0), out,
                        NULL, err);
    if (rc == WB_ETIMEDOUT)
        return wb__err_set(err, WB_ETIMEDOUT, "no reply from the broker at %s yet", rpc->path);
    if (rc != WB_OK)
        return rc;
    wb__rpc_drain(rpc);
    return check_reply(out, body, err);
}

int wb__rpc_call_raw(wb__rpc *rpc, const uint8_t *buf, size_t len, int timeout_ms,
                     Wbproto__Reply **out, wb_err *err)
{
    *out = NULL;
    if (timeout_ms <= 0)
        timeout_ms = rpc->timeout_ms;
    int rc = exchange(rpc, buf, len, 0, 1, timeout_ms, out, NULL, err);
    if (rc != WB_OK)
        return rc;
    return check_reply(out, 0, err);
}
