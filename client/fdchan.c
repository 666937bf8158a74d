#include "fdchan.h"

#include "fdchan_wire.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* Brokers one process talks to at once; a further one takes the slot of a
 * broker that is gone, else its fetches fail with WB_ELIMIT. */
#define FDCHAN_SLOTS 8

typedef struct chan {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int fd; /* -1: not connected */
    pid_t pid;
    /* The connection's session token, once asked for (dropped with it). */
    uint8_t token[WB_SESSION_TOKEN_LEN];
    int has_token;
} chan;

static pthread_mutex_t chan_mu = PTHREAD_MUTEX_INITIALIZER;
static chan chans[FDCHAN_SLOTS];
static size_t n_chans;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* fork(): the lock is held across it, so the child's copy of the table is
 * whole; the child closes its copies of the parent's connections at once,
 * so that the parent's death still ends them (the broker reclaims the
 * parent's leases), and opens its own when it fetches. */
static void before_fork(void)
{
    pthread_mutex_lock(&chan_mu);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&chan_mu);
}

static void after_fork_child(void)
{
    for (size_t i = 0; i < n_chans; i++) {
        if (chans[i].fd >= 0)
            close(chans[i].fd);
        chans[i].fd = -1;
        chans[i].has_token = 0;
    }
    pthread_mutex_unlock(&chan_mu);
}

static void register_atfork(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

static void chan_drop(chan *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->has_token = 0;
}

/* Whether the broker has closed its end. It never writes unprompted, so
 * between exchanges a readable connection is one at its end (a broker
 * that stopped or restarted). */
static int chan_ended(const chan *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int r;
    do {
        r = poll(&p, 1, 0);
    } while (r < 0 && errno == EINTR);
    return r != 0;
}

static int chan_connect(chan *c, int timeout_ms, wb_err *err)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    memcpy(sun.sun_path, c->path, strlen(c->path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return wb__err_errno(err, WB_ECONN, errno, "descriptor channel %s: socket", c->path);
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun) != 0) {
        int e = errno;
        close(fd);
        return wb__err_errno(err, WB_ECONN, e, "cannot connect to the descriptor channel %s",
                             c->path);
    }
    c->fd = fd;
    c->pid = getpid();
    return WB_OK;
}

/* The slot of a path, connected by this process. Called with chan_mu held. */
static int chan_get(const char *path, int timeout_ms, chan **out, wb_err *err)
{
    chan *c = NULL;
    for (size_t i = 0; i < n_chans; i++) {
        if (strcmp(chans[i].path, path) == 0)
            c = &chans[i];
    }
    /* A full table gives up a slot whose broker is gone (stopped, or never
     * reconnected to): a process that outlives brokers is not locked out. */
    for (size_t i = 0; !c && n_chans == FDCHAN_SLOTS && i < n_chans; i++) {
        chan *o = &chans[i];
        if (o->fd < 0 || o->pid != getpid() || chan_ended(o)) {
            chan_drop(o);
            c = o;
            snprintf(c->path, sizeof c->path, "%s", path);
        }
    }
    if (!c) {
        if (n_chans == FDCHAN_SLOTS)
            return wb__err_set(err, WB_ELIMIT,
                               "descriptor channel %s: this process talks to %d brokers already",
                               path, FDCHAN_SLOTS);
        c = &chans[n_chans++];
        snprintf(c->path, sizeof c->path, "%s", path);
        c->fd = -1;
    }
    if (c->fd >= 0 && (c->pid != getpid() || chan_ended(c)))
        chan_drop(c); /* the parent's, inherited through fork(); or a broker gone */
    *out = c;
    return c->fd >= 0 ? WB_OK : chan_connect(c, timeout_ms, err);
}

static void close_all(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

/* Sends a request, with descriptor `send_fd` attached unless it is -1. */
static ssize_t send_request(int fd, const uint8_t req[WB_FDCHAN_REQUEST_LEN], int send_fd)
{
    struct iovec iov = {.iov_base = (void *)req, .iov_len = WB_FDCHAN_REQUEST_LEN};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (send_fd >= 0) {
        mh.msg_control = ctl.space;
        mh.msg_controllen = sizeof ctl.space;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &send_fd, sizeof(int));
    }
    ssize_t n;
    do {
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
}

/* One exchange on a connected channel, the request carrying `send_fd`
 * unless it is -1. *broken is set when the connection cannot be used any
 * more (the caller drops it). */
static int exchange(chan *c, const uint8_t req[WB_FDCHAN_REQUEST_LEN], int send_fd,
                    const char *what, int *fds, size_t max_fds, size_t *n_fds,
                    char msg[WB_FDCHAN_MSG_MAX + 1], int *broken, wb_err *err)
{
    *broken = 1;
    ssize_t n = send_request(c->fd, req, send_fd);
    if (n != (ssize_t)WB_FDCHAN_REQUEST_LEN)
        return wb__err_errno(err, WB_ECONN, n < 0 ? errno : EPIPE,
                             "descriptor channel %s: sending the request", c->path);
    uint8_t hdr[WB_FDCHAN_HEADER_LEN];
    struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * WB_FDCHAN_MAX_FDS)];
    } ctl;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof ctl};
    do {
        n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    } while (n < 0 && errno == EINTR);
    /* Whatever came, descriptors first: they must not leak. */
    int got[WB_FDCHAN_MAX_FDS];
    size_t n_got = 0;
    wb__fdchan_take_fds(&mh, got, WB_FDCHAN_MAX_FDS, &n_got);
    if (n != (ssize_t)sizeof hdr) {
        close_all(got, n_got);
        if (n == 0)
            return wb__err_set(err, WB_ECONN, "descriptor channel %s: the broker closed it",
                               c->path);
        return wb__err_errno(err, n < 0 && errno == EAGAIN ? WB_ETIMEDOUT : WB_ECONN,
                             n < 0 ? errno : EPROTO, "descriptor channel %s: reading the reply",
                             c->path);
    }
    int32_t status;
    uint32_t want, msg_len;
    int rc = wb__fdchan_header_parse(hdr, &status, &want, &msg_len, err);
    msg[0] = '\0';
    if (rc == WB_OK && msg_len) {
        do {
            n = recv(c->fd, msg, msg_len, MSG_WAITALL);
        } while (n < 0 && errno == EINTR);
        if (n != (ssize_t)msg_len)
            rc = wb__err_set(err, WB_ECONN, "descriptor channel %s: the reply was cut short",
                             c->path);
        msg[msg_len] = '\0';
    }
    if (rc == WB_OK && (mh.msg_flags & MSG_CTRUNC || n_got != want))
        rc = wb__err_set(err, WB_EPROTO,
                         "descriptor channel %s: the reply announces %u descriptors but carries "
                         "%zu",
                         c->path, want, n_got);
    if (rc != WB_OK) {
        close_all(got, n_got);
        return rc;
    }
    *broken = 0;
    if (status != WB_OK) {
        close_all(got, n_got);
        return wb__err_set(err, status, "the broker refused %s: %s", what,
                           msg[0] ? msg : wb_strerror(status));
    }
    if (n_got > max_fds) {
        close_all(got, n_got);
        return wb__err_set(err, WB_EPROTO, "descriptor channel %s: %zu descriptors for %zu slabs",
                           c->path, n_got, max_fds);
    }
    memcpy(fds, got, n_got * sizeof *fds);
    *n_fds = n_got;
    return WB_OK;
}

/* The channel's path beside `socket_path`, and the channel table locked
 * (chan_mu; the fork handlers registered once). */
static int lock_channels(const char *socket_path, char *path, size_t size, wb_err *err)
{
    if (wb__fdchan_path(socket_path, path, size) != WB_OK)
        return wb__err_set(err, WB_EINVAL,
                           "the descriptor channel's path %s" WB_FDCHAN_SUFFIX " is too long",
                           socket_path);
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&chan_mu);
    return WB_OK;
}

int wb__fdchan_fetch(const char *socket_path, const uint8_t *lease_id, int timeout_ms, int *fds,
                     size_t max_fds, size_t *n_fds, wb_err *err)
{
    *n_fds = 0;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lrc = lock_channels(socket_path, path, sizeof path, err);
    if (lrc != WB_OK)
        return lrc;
    int rc = WB_ECONN;
    /* A connection of a broker that restarted is closed: one more try on a
     * fresh one. */
    for (int attempt = 0; attempt < 2; attempt++) {
        chan *c = NULL;
        rc = chan_get(path, timeout_ms > 0 ? timeout_ms : 5000, &c, err);
        if (rc != WB_OK)
            break;
        int broken = 0;
        uint8_t req[WB_FDCHAN_REQUEST_LEN];
        char msg[WB_FDCHAN_MSG_MAX + 1];
        wb__fdchan_request_pack(req, lease_id);
        rc = exchange(c, req, -1, "the descriptors", fds, max_fds, n_fds, msg, &broken, err);
        if (!broken)
            break;
        chan_drop(c);
    }
    pthread_mutex_unlock(&chan_mu);
    return rc;
}

int wb__fdchan_session(const char *socket_path, int timeout_ms, uint8_t *token, wb_err *err)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lrc = lock_channels(socket_path, path, sizeof path, err);
    if (lrc != WB_OK)
        return lrc;
    int rc = WB_ECONN;
    for (int attempt = 0; attempt < 2; attempt++) {
        chan *c = NULL;
        rc = chan_get(path, timeout_ms > 0 ? timeout_ms : 5000, &c, err);
        if (rc != WB_OK)
            break;
        if (c->has_token) {
            memcpy(token, c->token, WB_SESSION_TOKEN_LEN);
            break;
        }
        int broken = 0, fds[WB_FDCHAN_MAX_FDS];
        size_t n_fds = 0;
        uint8_t req[WB_FDCHAN_REQUEST_LEN];
        char msg[WB_FDCHAN_MSG_MAX + 1];
        wb__fdchan_session_request_pack(req);
        rc = exchange(c, req, -1, "a session", fds, WB_FDCHAN_MAX_FDS, &n_fds, msg, &broken, err);
        close_all(fds, n_fds);
        if (rc == WB_OK && n_fds == 0) {
            wb_err perr;
            rc = wb__session_token_parse(msg, c->token, &perr);
            if (rc != WB_OK)
                rc = wb__err_set(err, rc, "descriptor channel %s: %s", c->path, perr.msg);
        } else if (rc == WB_OK) {
            rc = wb__err_set(err, WB_EPROTO,
                             "descriptor channel %s: a session reply carries %zu descriptors",
                             c->path, n_fds);
        }
        if (rc == WB_OK) {
            c->has_token = 1;
            memcpy(token, c->token, WB_SESSION_TOKEN_LEN);
            break;
        }
        /* A broker that predates sessions answers the request as malformed
         * and closes the connection: the caller goes on without a token. */
        chan_drop(c);
        if (!broken)
            break;
    }
    pthread_mutex_unlock(&chan_mu);
    return rc;
}

int wb__fdchan_session_open(const char *socket_path, const uint8_t *token)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (wb__fdchan_path(socket_path, path, sizeof path) != WB_OK)
        return 0;
    int open = 0;
    pthread_mutex_lock(&chan_mu);
    for (size_t i = 0; i < n_chans; i++) {
        chan *c = &chans[i];
        if (strcmp(c->path, path) != 0)
            continue;
        open = c->fd >= 0 && c->pid == getpid() && c->has_token &&
               memcmp(c->token, token, WB_SESSION_TOKEN_LEN) == 0 && !chan_ended(c);
    }
    pthread_mutex_unlock(&chan_mu);
    return open;
}

int wb__fdchan_publish(const char *socket_path, const uint8_t *publish_id, int fd, int timeout_ms,
                       wb_err *err)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lrc = lock_channels(socket_path, path, sizeof path, err);
    if (lrc != WB_OK)
        return lrc;
    /* One attempt: a connection the broker closed was its session, and the
     * publish ended with it. */
    chan *c = NULL;
    int rc = chan_get(path, timeout_ms > 0 ? timeout_ms : 5000, &c, err);
    if (rc == WB_OK) {
        int broken = 0, fds[WB_FDCHAN_MAX_FDS];
        size_t n_fds = 0;
        uint8_t req[WB_FDCHAN_REQUEST_LEN];
        char msg[WB_FDCHAN_MSG_MAX + 1];
        wb__fdchan_publish_request_pack(req, publish_id);
        rc = exchange(c, req, fd, "the publish's host bytes", fds, WB_FDCHAN_MAX_FDS, &n_fds, msg,
                      &broken, err);
        close_all(fds, n_fds);
        if (rc == WB_OK && n_fds)
            rc = wb__err_set(err, WB_EPROTO,
                             "descriptor channel %s: a publish reply carries %zu descriptors",
                             c->path, n_fds);
        if (broken)
            chan_drop(c);
    }
    pthread_mutex_unlock(&chan_mu);
    return rc;
}
