#include "fdchan_server.h"

#include "publish.h"

#include "auth_groups.h"
#include "alloc.h"
#include "conn.h"
#include "fdchan_wire.h"
#include "log.h"
#include "peer.h"
#include "ratelog.h"
#include "text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Lease ids one connection remembers (for the reclaim at its end); ids of
 * leases that ended are dropped first when the list is full. */
#define FDCHAN_MAX_IDS 4096
/* Descriptors kept of those that come with one request. */
#define FDCHAN_MAX_RECV 4

struct wb_fdchan_conn {
    int fd;
    uint64_t serial;
    wb_peer_creds creds;
    char creds_error[WB_ERR_MSG_MAX];
    uint8_t in[WB_FDCHAN_REQUEST_LEN];
    size_t in_len;
    int64_t accepted_ms;
    int answered; /* a request was served: the handshake deadline no longer applies */
    uint8_t (*ids)[WB_LEASE_ID_LEN];
    size_t n_ids, cap_ids;
    /* The session: a token handed out on request; creds.pid is the
     * session's id when the kernel gave no pid (hidden). */
    uint8_t token[WB_SESSION_TOKEN_LEN];
    int has_token;
    int hidden;
    /* The process that connected, where its pid is visible (-1 else); see
     * fdchan_server.h. */
    int pidfd;
    /* Refused at accept (a uid on no allow list, a process already gone):
     * its first request gets this, then the connection is closed. */
    int refused;
    /* Descriptors that came with the bytes of the request being read (a
     * publish's memfd); more than FDCHAN_MAX_RECV are closed at once. */
    int recv_fds[FDCHAN_MAX_RECV];
    unsigned n_recv, recv_over;
};

#define TAG_LISTEN UINT64_MAX

int wb__fdchan_listen(wb_fdchan_server *s, wb_broker *b, const char *socket_path,
                      const wb_loop_options *opt, wb_err *err)
{
    memset(s, 0, sizeof *s);
    s->b = b;
    s->lfd = -1;
    s->max_conns = opt->max_peers;
    s->max_per_uid = opt->max_per_uid ? opt->max_per_uid : opt->max_peers;
    s->max_sessions_per_uid = opt->max_sessions_per_uid ? opt->max_sessions_per_uid : 1;
    s->handshake_ms = opt->handshake_ms;
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (wb__fdchan_path(socket_path, s->path, sizeof s->path) != WB_OK ||
        strlen(s->path) >= sizeof sun.sun_path)
        return wb__err_set(err, WB_EINVAL,
                           "the descriptor channel's path %s" WB_FDCHAN_SUFFIX
                           " does not fit a socket address (%zu bytes at most)",
                           socket_path, sizeof sun.sun_path - 1);
    int rc = wb__socket_prepare(s->path, err);
    if (rc != WB_OK) {
        s->path[0] = '\0';
        return rc;
    }
    memcpy(sun.sun_path, s->path, strlen(s->path) + 1);
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->ep < 0 || s->lfd < 0)
        return wb__err_errno(err, WB_EIO, errno, "setting up the descriptor channel");
    /* As the main socket: 0777 & ~0117 gives 0660. */
    mode_t old = umask(0117);
    int r = bind(s->lfd, (struct sockaddr *)&sun, sizeof sun);
    int e = errno;
    umask(old);
    if (r != 0) {
        s->path[0] = '\0'; /* not ours to unlink */
        return wb__err_errno(err, WB_EIO, e, "cannot bind %s", sun.sun_path);
    }
    if (chmod(s->path, 0660) != 0)
        return wb__err_errno(err, WB_EIO, errno, "chmod 0660 %s", s->path);
    if (listen(s->lfd, 128) != 0)
        return wb__err_errno(err, WB_EIO, errno, "cannot listen on %s", s->path);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_LISTEN};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, s->lfd, &ev) != 0)
        return wb__err_errno(err, WB_EIO, errno, "epoll_ctl for %s", s->path);
    return WB_OK;
}

static void conn_free(wb_fdchan_conn *c)
{
    for (unsigned k = 0; k < c->n_recv; k++)
        close(c->recv_fds[k]);
    if (c->fd >= 0)
        close(c->fd);
    if (c->pidfd >= 0)
        close(c->pidfd);
    free(c->ids);
    free(c);
}

/* The end of a connection: the kernel closed it when its process died, or
 * the process closed it. Either way the leases fetched through it that this
 * process still holds are of no more use to anyone. */
static void conn_close(wb_fdchan_server *s, size_t i, const char *why)
{
    wb_fdchan_conn *c = s->v[i];
    wb_broker *b = s->b;
    size_t reclaimed = 0;
    if (!c->answered)
        s->n_waiting--;
    /* A connection whose process has exited reclaims nothing: its pid may
     * name another process now, and the exited one's leases end with its
     * own pidfd. (A refused connection fetched nothing.) */
    if (!c->hidden && (c->pidfd < 0 || wb__pidfd_exited(c->pidfd)))
        c->n_ids = 0;
    /* A session's end is its process's end (or the process gave it up):
     * every lease of the identity goes, whichever connection asked for it.
     * Without a session, only what this connection fetched. */
    else if (c->has_token && c->creds.known) {
        reclaimed = wb__broker_reclaim_why(b, c->creds.pid, "descriptor_channel_closed");
        c->n_ids = 0;
    }
    for (size_t k = 0; k < c->n_ids; k++) {
        wb_lease_rec *l = wb__leases_find(&b->leases, c->ids[k]);
        if (!l || !wb__lease_held_by(l, &c->creds))
            continue;
        char hex[9], q[300];
        wb_info("lease_reclaim", "reason=descriptor_channel_closed lease=%s model=%s pid=%u",
                wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, l->model->name), l->pid);
        wb_model *m = l->model;
        unsigned copy = l->copy;
        wb__leases_remove(&b->leases, l);
        b->stats.leases_reclaimed++;
        wb__broker_lease_ended(b, m, copy);
        reclaimed++;
    }
    char name[32];
    wb_debug("fd_channel_closed", "pid=%s uid=%u reason=%s leases_reclaimed=%zu",
             wb__peer_name(c->creds.pid, name, sizeof name), c->creds.uid, why, reclaimed);
    conn_free(c);
    s->v[i] = s->v[--s->n];
}

static size_t find_serial(const wb_fdchan_server *s, uint64_t serial)
{
    for (size_t i = 0; i < s->n; i++) {
        if (s->v[i]->serial == serial)
            return i;
    }
    return SIZE_MAX;
}

/* Sends one reply, descriptors attached. A peer whose socket buffer is
 * full does not read its replies: it is disconnected (returns -1). */
static int send_reply(wb_fdchan_conn *c, int32_t status, const int *fds, uint32_t n_fds,
                      const char *msg)
{
    uint8_t buf[WB_FDCHAN_REPLY_MAX];
    size_t len = wb__fdchan_reply_pack(buf, status, n_fds, msg);
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * WB_FDCHAN_MAX_FDS)];
    } ctl;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n_fds) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.space;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * n_fds);
    }
    ssize_t n;
    do {
        n = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    /* A reply is far smaller than any socket buffer: a short write means
     * the buffer is full of replies the peer did not read. */
    return n == (ssize_t)len ? 0 : -1;
}

/* Remembers that this connection fetched lease `id`. When the list is full,
 * ids of leases that ended are dropped first. */
static int remember(wb_fdchan_server *s, wb_fdchan_conn *c, const uint8_t *id)
{
    for (size_t k = 0; k < c->n_ids; k++) {
        if (memcmp(c->ids[k], id, WB_LEASE_ID_LEN) == 0)
            return WB_OK;
    }
    if (c->n_ids == c->cap_ids) {
        size_t kept = 0;
        for (size_t k = 0; k < c->n_ids; k++) {
            wb_lease_rec *l = wb__leases_find(&s->b->leases, c->ids[k]);
            if (l && wb__lease_held_by(l, &c->creds))
                memmove(c->ids[kept++], c->ids[k], WB_LEASE_ID_LEN);
        }
        c->n_ids = kept;
    }
    if (c->n_ids == c->cap_ids) {
        if (c->cap_ids >= FDCHAN_MAX_IDS)
            return WB_ELIMIT;
        size_t cap = c->cap_ids ? c->cap_ids * 2 : 8;
        void *v = wb__realloc(c->ids, cap * WB_LEASE_ID_LEN);
        if (!v)
            return WB_ENOMEM;
        c->ids = v;
        c->cap_ids = cap;
    }
    memcpy(c->ids[c->n_ids++], id, WB_LEASE_ID_LEN);
    return WB_OK;
}

/* Judges one request; fills fds (borrowed from the slabs) or a refusal. */
static int judge(wb_fdchan_server *s, wb_fdchan_conn *c, const uint8_t *id, int *fds,
                 uint32_t *n_fds, char *msg, size_t size)
{
    wb_broker *b = s->b;
    char hex[9];
    wb_err err;
    *n_fds = 0;
    if (!c->creds.known) {
        snprintf(msg, size, "%.200s", c->creds_error);
        return WB_EPERM;
    }
    if (wb__auth_check_client(&b->auth, &c->creds, &err) != WB_OK) {
        snprintf(msg, size, "%.200s", err.msg);
        return WB_EPERM;
    }
    /* A pid whose process exited and was reused holds none of the old
     * process's leases. */
    wb__broker_check_peer(b, c->creds.pid);
    wb_lease_rec *l = wb__leases_find(&b->leases, id);
    if (!l) {
        snprintf(msg, size, "no lease %s", wb__lease_id_short(id, hex));
        return WB_ENOTFOUND;
    }
    if (!wb__lease_held_by(l, &c->creds)) {
        char holder[32], mine[32];
        snprintf(msg, size,
                 "lease %s belongs to pid %s (uid %u), not to this connection's pid %s (uid %u)",
                 wb__lease_id_short(id, hex), wb__peer_name(l->pid, holder, sizeof holder), l->uid,
                 wb__peer_name(c->creds.pid, mine, sizeof mine), c->creds.uid);
        return WB_EPERM;
    }
    const wb_model *m = l->model;
    const wb_backend *be = m->backend;
    /* The lease's slabs: its copy's own, then those it borrows (never the
     * model's other copies). */
    wb_slab *slabs[WB_FDCHAN_MAX_FDS];
    uint32_t n = wb__model_copy_slabs(&m->data, l->copy, slabs, WB_FDCHAN_MAX_FDS);
    if (!be->slab_fd || n == 0 || n > WB_FDCHAN_MAX_FDS) {
        snprintf(msg, size, "model '%.80s' has no slab descriptors (transport %s)", m->name,
                 wb__backend_transport(be));
        return WB_ENOSYS;
    }
    for (size_t i = 0; i < n; i++) {
        fds[i] = slabs[i] ? be->slab_fd(slabs[i]) : -1;
        if (fds[i] < 0) {
            snprintf(msg, size, "slab %zu of model '%.80s' has no descriptor", i, m->name);
            return WB_ENOSYS;
        }
    }
    int rc = remember(s, c, id);
    if (rc != WB_OK) {
        snprintf(msg, size,
                 rc == WB_ELIMIT ? "this connection holds %d leases' descriptors already"
                                 : "out of memory (%d leases)",
                 FDCHAN_MAX_IDS);
        return rc;
    }
    *n_fds = n;
    msg[0] = '\0';
    return WB_OK;
}

/* Hands out the connection's session token (made at the first request).
 * The token goes nowhere else: not in logs, not in replies to others. */
static int session_token(wb_fdchan_server *s, wb_fdchan_conn *c, char *msg, size_t size)
{
    wb_err err;
    if (!c->creds.known) {
        snprintf(msg, size, "%.200s", c->creds_error);
        return WB_EPERM;
    }
    if (wb__auth_check_client(&s->b->auth, &c->creds, &err) != WB_OK) {
        snprintf(msg, size, "%.200s", err.msg);
        return WB_EPERM;
    }
    if (!c->has_token && c->hidden) {
        /* A uid whose pids are hidden is known by its sessions alone: it
         * may hold only so many at once. */
        unsigned same = 0;
        for (size_t i = 0; i < s->n; i++)
            same += s->v[i]->has_token && s->v[i]->hidden && s->v[i]->creds.uid == c->creds.uid;
        if (same >= s->max_sessions_per_uid) {
            snprintf(msg, size,
                     "uid %u holds %u sessions already, the most one uid whose pid is hidden "
                     "may (--max-sessions-per-uid)",
                     c->creds.uid, same);
            return WB_ELIMIT;
        }
    }
    if (!c->has_token) {
        size_t got = 0;
        while (got < sizeof c->token) {
            ssize_t r = getrandom(c->token + got, sizeof c->token - got, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0) {
                snprintf(msg, size, "getrandom for a session token: %s", strerror(errno));
                return WB_EIO;
            }
            got += (size_t)r;
        }
        c->has_token = 1;
        char id[32];
        wb_debug("session_opened", "session=%s uid=%u gid=%u",
                 wb__peer_name(c->creds.pid, id, sizeof id), c->creds.uid, c->creds.gid);
    }
    char hex[WB_SESSION_TOKEN_HEX + 1];
    wb__text_hex(hex, sizeof hex, c->token, WB_SESSION_TOKEN_LEN);
    snprintf(msg, size, "%s", hex);
    return WB_OK;
}

/* Reads and answers at most WB_FDCHAN_REQUESTS_PER_TURN requests; returns
 * -1 when the connection was closed. */
/* Closes the descriptors that came with the request. */
static void drop_recv(wb_fdchan_conn *c)
{
    for (unsigned k = 0; k < c->n_recv; k++)
        close(c->recv_fds[k]);
    c->n_recv = 0;
    c->recv_over = 0;
}

/* Reads what the request still lacks, keeping the descriptors that come
 * with it (SCM_RIGHTS): recv's return. */
static ssize_t recv_some(wb_fdchan_conn *c)
{
    struct iovec iov = {.iov_base = c->in + c->in_len, .iov_len = sizeof c->in - c->in_len};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * 8)];
    } ctl;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return n;
    if (mh.msg_flags & MSG_CTRUNC)
        c->recv_over++;
    size_t taken;
    size_t seen =
        wb__fdchan_take_fds(&mh, c->recv_fds + c->n_recv, FDCHAN_MAX_RECV - c->n_recv, &taken);
    c->n_recv += (unsigned)taken;
    c->recv_over += (unsigned)(seen - taken);
    return n;
}

/* A publish's memfd ("WBP1"): exactly one descriptor with the request,
 * for a publish of this connection's identity (publish.h). The
 * descriptor is the publish's, or closed. */
static int take_publish_fd(wb_fdchan_server *s, wb_fdchan_conn *c, const uint8_t *id, char *msg,
                           size_t size)
{
    wb_err err;
    if (!c->creds.known) {
        drop_recv(c);
        snprintf(msg, size, "%.200s", c->creds_error);
        return WB_EPERM;
    }
    if (wb__auth_check_client(&s->b->auth, &c->creds, &err) != WB_OK) {
        drop_recv(c);
        snprintf(msg, size, "%.200s", err.msg);
        return WB_EPERM;
    }
    if (c->n_recv != 1 || c->recv_over) {
        unsigned got = c->n_recv + c->recv_over;
        drop_recv(c);
        snprintf(msg, size, "a publish request carries exactly one descriptor (a memfd), not %u",
                 got);
        return WB_EINVAL;
    }
    int fd = c->recv_fds[0];
    c->n_recv = 0;
    int rc = wb__publish_add_fd(s->b, id, &c->creds, fd, msg, size);
    if (rc != WB_OK)
        close(fd);
    return rc;
}

static int conn_readable(wb_fdchan_server *s, size_t i)
{
    wb_fdchan_conn *c = s->v[i];
    for (int answered = 0; answered < WB_FDCHAN_REQUESTS_PER_TURN;) {
        ssize_t n = recv_some(c);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0) {
            conn_close(s, i, n == 0 ? "eof" : "error");
            return -1;
        }
        c->in_len += (size_t)n;
        if (c->in_len < sizeof c->in)
            continue;
        c->in_len = 0;
        uint8_t id[WB_LEASE_ID_LEN];
        wb_err err;
        char msg[WB_FDCHAN_MSG_MAX + 1];
        int fds[WB_FDCHAN_MAX_FDS];
        uint32_t n_fds = 0;
        int kind = 0;
        int rc = wb__fdchan_request_parse(c->in, sizeof c->in, &kind, id, &err);
        if (rc != WB_OK) {
            s->b->stats.malformed_messages++;
            char q[WB_ERR_MSG_MAX + 64];
            wb_warn_peer("bad_message", c->creds.uid, "reason=fd_channel pid=%u uid=%u error=%s",
                         c->creds.pid, c->creds.uid, wb__log_quote(q, sizeof q, err.msg));
            send_reply(c, rc, NULL, 0, err.msg);
            conn_close(s, i, "malformed");
            return -1;
        }
        /* A connection that may not be served (refused at accept, or whose
         * process has exited since) gets one answer and is closed. */
        /* Only a publish request carries a descriptor. */
        if (kind != WB_FDCHAN_REQ_PUBLISH)
            drop_recv(c);
        int refuse = c->refused || (!c->hidden && wb__pidfd_exited(c->pidfd));
        if (refuse && !c->refused)
            wb__peer_passed_on(c->creds.pid, c->creds_error, sizeof c->creds_error);
        if (refuse) {
            drop_recv(c);
            rc = WB_EPERM;
            snprintf(msg, sizeof msg, "%.200s", c->creds_error);
        } else if (kind == WB_FDCHAN_REQ_SESSION) {
            rc = session_token(s, c, msg, sizeof msg);
        } else if (kind == WB_FDCHAN_REQ_PUBLISH) {
            rc = take_publish_fd(s, c, id, msg, sizeof msg);
        } else {
            rc = judge(s, c, id, fds, &n_fds, msg, sizeof msg);
        }
        if (rc == WB_EPERM) {
            s->b->stats.requests_refused++;
            char q[WB_FDCHAN_MSG_MAX + 64];
            wb_warn_peer("peer_refused", c->creds.uid, "reason=fd_channel pid=%u uid=%u error=%s",
                         c->creds.pid, c->creds.uid, wb__log_quote(q, sizeof q, msg));
        }
        if (send_reply(c, rc, fds, n_fds, msg) != 0) {
            s->b->stats.peers_disconnected++;
            conn_close(s, i, "slow_reader");
            return -1;
        }
        if (refuse) {
            conn_close(s, i, "refused");
            return -1;
        }
        if (!c->answered)
            s->n_waiting--;
        c->answered = 1;
        answered++;
    }
    return 0; /* more may wait: the descriptor stays readable */
}

/* Judges a new connection by its kernel credentials and supplementary
 * groups, read through the pidfd of the process that connected (taken here
 * for a visible pid). A peer on no allow list is kept refused (one answer,
 * then closed) while fewer than WB_REFUSED_PER_UID connections of its uid
 * are; a uid at --max-peers-per-uid (root and the broker's own uid aside)
 * is closed at once. Returns 0 when the connection is to be closed now. */
static int admit(wb_fdchan_server *s, wb_fdchan_conn *c)
{
    wb_broker *b = s->b;
    wb_err aerr;
    if (!c->refused && !c->hidden && c->creds.known) {
        wb_err perr;
        c->pidfd = wb__peer_pidfd(c->fd, &c->creds, &perr);
        if (c->pidfd < 0) {
            snprintf(c->creds_error, sizeof c->creds_error, "%s", perr.msg);
            c->refused = 1;
        }
    }
    /* The supplementary groups are read once, through the pidfd; a refused
     * connection keeps none. */
    if (c->creds.known && !c->refused) {
        wb__auth_read_groups(&b->auth, &c->creds, c->pidfd);
        if (wb__auth_check_client(&b->auth, &c->creds, &aerr) != WB_OK) {
            snprintf(c->creds_error, sizeof c->creds_error, "%s", aerr.msg);
            c->refused = 1;
            if (c->pidfd >= 0)
                close(c->pidfd);
            c->pidfd = -1;
        }
    }
    unsigned same = 0, refused = 0;
    for (size_t i = 0; i < s->n; i++) {
        const wb_fdchan_conn *o = s->v[i];
        if (o->creds.known == c->creds.known && o->creds.uid == c->creds.uid) {
            same++;
            refused += o->refused != 0;
        }
    }
    if (c->refused && refused >= WB_REFUSED_PER_UID) {
        b->stats.peers_refused++;
        wb_warn_peer("peer_refused", c->creds.uid,
                     "reason=refused_uid channel=fd uid=%u connections=%u", c->creds.uid, refused);
        return 0;
    }
    if (!c->refused && c->creds.uid != 0 && c->creds.uid != b->euid && same >= s->max_per_uid) {
        b->stats.peers_refused++;
        wb_warn_peer("limit", c->creds.uid,
                     "limit=max_peers_per_uid channel=fd uid=%u connections=%u", c->creds.uid,
                     same);
        return 0;
    }
    return 1;
}

static void fdchan_accept(wb_fdchan_server *s)
{
    for (int round = 0; round < WB_FDCHAN_EVENTS_PER_TURN; round++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* EAGAIN, or EMFILE: the next round tries again */
        if (s->n >= s->max_conns) {
            s->b->stats.peers_refused++;
            wb_warn_peer("limit", 0, "limit=max_peers channel=fd peers=%zu", s->n);
            close(fd);
            continue;
        }
        if (s->n == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 16;
            wb_fdchan_conn **v = wb__realloc(s->v, cap * sizeof *v);
            if (!v) {
                close(fd);
                continue;
            }
            s->v = v;
            s->cap = cap;
        }
        wb_fdchan_conn *c = wb__calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->pidfd = -1;
        c->serial = ++s->next_serial;
        c->accepted_ms = s->b->now_ms();
        wb_err err;
        /* A peer whose pid is not visible (another pid namespace) is known
         * by this connection: its session id stands for the pid. A peer
         * whose credentials cannot be read at all is refused on its first
         * request, with the reason, rather than dropped silently. */
        if (wb__peer_creds_from_fd(fd, &c->creds, &err) != WB_OK) {
            if (c->creds.pid_hidden) {
                c->creds.known = 1;
                c->creds.pid = WB_SESSION_ID_BASE | (uint32_t)(c->serial & 0x7fffffffu);
                c->hidden = 1;
            } else {
                snprintf(c->creds_error, sizeof c->creds_error, "%s", err.msg);
                c->refused = 1;
            }
        }
        if (!admit(s, c)) {
            conn_free(c);
            continue;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = c->serial};
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            conn_free(c);
            continue;
        }
        s->v[s->n++] = c;
        s->n_waiting++;
    }
}

void wb__fdchan_handle(wb_fdchan_server *s)
{
    /* One round a turn of the loop: level-triggered, the channel's
     * descriptor stays readable while anything is left, and the main
     * socket's connections are served in between. */
    struct epoll_event ev[WB_FDCHAN_EVENTS_PER_TURN];
    int n = epoll_wait(s->ep, ev, WB_FDCHAN_EVENTS_PER_TURN, 0);
    for (int k = 0; k < n; k++) {
        if (ev[k].data.u64 == TAG_LISTEN) {
            fdchan_accept(s);
            continue;
        }
        size_t i = find_serial(s, ev[k].data.u64);
        if (i != SIZE_MAX)
            conn_readable(s, i);
    }
}

void wb__fdchan_expire(wb_fdchan_server *s)
{
    /* Most connections have asked already and stay for their process's
     * life: no walk unless one has not. */
    if (s->n_waiting == 0)
        return;
    int64_t now = s->b->now_ms();
    for (size_t i = 0; i < s->n;) {
        wb_fdchan_conn *c = s->v[i];
        if (!c->answered && now - c->accepted_ms > (int64_t)s->handshake_ms) {
            s->b->stats.peers_disconnected++;
            conn_close(s, i, "no_request_in_time");
            continue;
        }
        i++;
    }
}

/* Compares tokens in constant time: how long a wrong guess took tells
 * nothing about the right one. */
static int token_eq(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (size_t i = 0; i < WB_SESSION_TOKEN_LEN; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

int wb__fdchan_bind(wb_fdchan_server *s, const wb_peer_creds *kernel, const uint8_t *token,
                    size_t len, wb_peer_creds *out, uint64_t *serial, wb_err *err)
{
    *serial = 0;
    if (len != WB_SESSION_TOKEN_LEN)
        return wb__err_set(err, WB_EINVAL, "the session token has %zu bytes, not %d", len,
                           WB_SESSION_TOKEN_LEN);
    if (!kernel->known && !kernel->pid_hidden)
        return wb__err_set(err, WB_EPERM, "the broker could not read the peer's credentials");
    wb_fdchan_conn *c = NULL;
    for (size_t i = 0; i < s->n; i++) {
        if (s->v[i]->has_token && token_eq(s->v[i]->token, token))
            c = s->v[i];
    }
    if (!c)
        return wb__err_set(err, WB_EPERM,
                           "no session on the descriptor channel %s has this token (its "
                           "connection ended, or the token is forged)",
                           s->path);
    char name[32], mine[32];
    wb__peer_name(c->creds.pid, name, sizeof name);
    snprintf(mine, sizeof mine, "%s", "hidden (another pid namespace)");
    if (kernel->known)
        wb__peer_name(kernel->pid, mine, sizeof mine);
    /* The token is bound to the kernel's view of the connection that
     * received it: the same uid, and the same pid when one is visible. */
    if (kernel->uid != c->creds.uid)
        return wb__err_set(err, WB_EPERM,
                           "the session token belongs to uid %u (session %s), not to this "
                           "connection's uid %u",
                           c->creds.uid, name, kernel->uid);
    if (kernel->known != !c->hidden || (kernel->known && kernel->pid != c->creds.pid))
        return wb__err_set(err, WB_EPERM,
                           "the session token belongs to pid %s, not to this connection's pid %s",
                           c->hidden ? "hidden (another pid namespace)" : name, mine);
    *out = c->creds;
    out->pid_hidden = c->hidden;
    *serial = c->serial;
    return WB_OK;
}

int wb__fdchan_session_alive(const wb_fdchan_server *s, uint64_t serial)
{
    return find_serial(s, serial) != SIZE_MAX;
}

void wb__fdchan_destroy(wb_fdchan_server *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        conn_free(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = s->cap = s->n_waiting = 0;
    if (s->lfd >= 0)
        close(s->lfd);
    s->lfd = -1;
    if (s->ep > 0)
        close(s->ep);
    s->ep = -1;
    if (s->path[0])
        unlink(s->path);
    s->path[0] = '\0';
}
