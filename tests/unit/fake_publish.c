/* The fake broker's publishing (fake_broker.h): PublishBegin, Commit and
 * Abort answered from the recorded table, and a tiny descriptor channel
 * that hands out a session token and receives a publish's memfd. */
#include "fake_broker.h"

#include "fdchan_wire.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Every publish id the fake gives: 16 bytes of 0xcd. */
static const uint8_t pub_id[WB_LEASE_ID_LEN] = {0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd,
                                                0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd};

void fake_publish_init(fake_broker *f)
{
    fake_pub *p = &f->pub;
    pthread_mutex_init(&p->mu, NULL);
    p->fd = -1;
    p->listen_fd = -1;
    for (size_t i = 0; i < 4; i++)
        p->conns[i] = -1;
}

static void reset_locked(fake_pub *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    p->open = 0;
}

void fake_publish_reset(fake_broker *f)
{
    pthread_mutex_lock(&f->pub.mu);
    reset_locked(&f->pub);
    pthread_mutex_unlock(&f->pub.mu);
}

static void begin(fake_pub *p, const Wbproto__PublishBeginRequest *b, Wbproto__Reply *rep,
                  Wbproto__PublishBeginReply *br)
{
    atomic_fetch_add(&p->n_begin, 1);
    int st = atomic_load(&p->begin_status);
    if (st == FAKE_PUB_UNKNOWN) {
        rep->status = WB_EPROTO;
        rep->error = "request has no body";
        return;
    }
    if (st) {
        rep->status = st;
        rep->error = "fake refusal";
        return;
    }
    pthread_mutex_lock(&p->mu);
    if (p->open) {
        pthread_mutex_unlock(&p->mu);
        rep->status = WB_EBUSY;
        rep->error = "a publish of this model is open";
        return;
    }
    reset_locked(p);
    p->open = 1;
    snprintf(p->model, sizeof p->model, "%s", b->model);
    p->partial = b->partial;
    snprintf(p->placement, sizeof p->placement, "%s", b->placement ? b->placement : "");
    p->n = b->n_tensors < FAKE_PUB_TENSORS ? b->n_tensors : FAKE_PUB_TENSORS;
    uint64_t total = 0;
    for (size_t i = 0; i < p->n; i++) {
        fake_pub_tensor *t = &p->t[i];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", b->tensors[i]->name);
        snprintf(t->dtype, sizeof t->dtype, "%s", b->tensors[i]->dtype);
        t->ndim = (uint32_t)b->tensors[i]->n_shape;
        for (size_t k = 0; k < t->ndim && k < 4; k++)
            t->shape[k] = b->tensors[i]->shape[k];
        t->nbytes = b->tensors[i]->nbytes;
        total += t->nbytes;
    }
    pthread_mutex_unlock(&p->mu);
    br->publish_id.data = (uint8_t *)pub_id;
    br->publish_id.len = sizeof pub_id;
    br->version = 7;
    br->bytes = total;
    rep->body_case = WBPROTO__REPLY__BODY_PUBLISH_BEGIN;
    rep->publish_begin = br;
}

static int same_id(const ProtobufCBinaryData *id)
{
    return id->len == WB_LEASE_ID_LEN && memcmp(id->data, pub_id, WB_LEASE_ID_LEN) == 0;
}

static void commit(fake_pub *p, const Wbproto__PublishCommitRequest *cr, Wbproto__Reply *rep,
                   Wbproto__PublishCommitReply *r, Wbproto__ModelInfo *m)
{
    atomic_fetch_add(&p->n_commit, 1);
    pthread_mutex_lock(&p->mu);
    if (!p->open || !same_id(&cr->publish_id)) {
        pthread_mutex_unlock(&p->mu);
        rep->status = WB_ENOTFOUND;
        rep->error = "no such publish";
        return;
    }
    p->n_sources = cr->n_sources;
    p->host_fd = cr->n_sources ? cr->sources[0]->host_fd : -2;
    p->host_size = cr->n_sources ? cr->sources[0]->size : 0;
    p->cuda_sources = 0;
    for (size_t i = 0; i < cr->n_sources; i++)
        p->cuda_sources += cr->sources[i]->cuda_ipc_handle.len == 64;
    uint64_t copied = 0;
    for (size_t i = 0; i < cr->n_tensors; i++) {
        for (size_t k = 0; k < p->n; k++) {
            fake_pub_tensor *t = &p->t[k];
            if (strcmp(t->name, cr->tensors[i]->name) != 0)
                continue;
            t->source = cr->tensors[i]->source;
            t->offset = cr->tensors[i]->offset;
            copied += t->nbytes;
            const Wbproto__PublishSource *s =
                t->source < cr->n_sources ? cr->sources[t->source] : NULL;
            if (s && s->host_fd == 0 && p->fd >= 0 && t->nbytes <= FAKE_PUB_BYTES)
                t->got = pread(p->fd, t->bytes, t->nbytes, (off_t)t->offset) == (ssize_t)t->nbytes;
        }
    }
    int st = atomic_load(&p->commit_status);
    /* A refused commit leaves the publish open, for the abort that follows. */
    if (!st)
        reset_locked(p);
    pthread_mutex_unlock(&p->mu);
    if (st) {
        rep->status = st;
        rep->error = "fake refusal";
        return;
    }
    m->name = p->model;
    m->version = 7;
    m->current = 1;
    m->checksums = "pending";
    r->model = m;
    r->previous_version = 6;
    r->current_at = 1700000000.5;
    r->copy_seconds = 0.25;
    r->copied_bytes = copied;
    r->kept_bytes = p->partial ? 1000 : 0;
    rep->body_case = WBPROTO__REPLY__BODY_PUBLISH_COMMIT;
    rep->publish_commit = r;
}

int fake_publish_answer(fake_broker *f, const uint8_t *ident, size_t ident_len,
                        const Wbproto__Request *req)
{
    fake_pub *p = &f->pub;
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.id = req->id;
    Wbproto__PublishBeginReply br = WBPROTO__PUBLISH_BEGIN_REPLY__INIT;
    Wbproto__PublishCommitReply cr = WBPROTO__PUBLISH_COMMIT_REPLY__INIT;
    Wbproto__PublishAbortReply ar = WBPROTO__PUBLISH_ABORT_REPLY__INIT;
    Wbproto__ModelInfo m = WBPROTO__MODEL_INFO__INIT;
    switch (req->body_case) {
    case WBPROTO__REQUEST__BODY_PUBLISH_BEGIN:
        begin(p, req->publish_begin, &rep, &br);
        break;
    case WBPROTO__REQUEST__BODY_PUBLISH_COMMIT:
        commit(p, req->publish_commit, &rep, &cr, &m);
        break;
    case WBPROTO__REQUEST__BODY_PUBLISH_ABORT:
        atomic_fetch_add(&p->n_abort, 1);
        pthread_mutex_lock(&p->mu);
        if (p->open && same_id(&req->publish_abort->publish_id)) {
            reset_locked(p);
            rep.body_case = WBPROTO__REPLY__BODY_PUBLISH_ABORT;
            rep.publish_abort = &ar;
        } else {
            rep.status = WB_ENOTFOUND;
            rep.error = "no such publish";
        }
        pthread_mutex_unlock(&p->mu);
        break;
    default:
        return 0;
    }
    fake_send_reply(f, ident, ident_len, &rep);
    return 1;
}

/* One request on a channel connection; 0 when it ended. */
static int serve(fake_pub *p, int conn)
{
    uint8_t req[WB_FDCHAN_REQUEST_LEN];
    struct iovec iov = {.iov_base = req, .iov_len = sizeof req};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * 4)];
    } ctl;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(conn, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    if (n <= 0)
        return 0;
    int got = -1;
    size_t taken;
    int n_got = (int)wb__fdchan_take_fds(&mh, &got, 1, &taken);
    int kind = 0;
    uint8_t id[WB_LEASE_ID_LEN];
    wb_err err;
    uint8_t reply[WB_FDCHAN_REPLY_MAX];
    size_t len;
    if (wb__fdchan_request_parse(req, (size_t)n, &kind, id, &err) != WB_OK) {
        len = wb__fdchan_reply_pack(reply, WB_EPROTO, 0, err.msg);
    } else if (kind == WB_FDCHAN_REQ_SESSION) {
        len = wb__fdchan_reply_pack(reply, 0, 0, "00112233445566778899aabbccddeeff");
    } else if (kind == WB_FDCHAN_REQ_PUBLISH && n_got == 1) {
        atomic_fetch_add(&p->n_fds, 1);
        pthread_mutex_lock(&p->mu);
        if (p->fd >= 0)
            close(p->fd);
        p->fd = got;
        got = -1;
        p->seals = fcntl(p->fd, F_GET_SEALS);
        p->fd_id_ok = memcmp(id, pub_id, WB_LEASE_ID_LEN) == 0;
        pthread_mutex_unlock(&p->mu);
        len = wb__fdchan_reply_pack(reply, 0, 0, "");
    } else {
        len = wb__fdchan_reply_pack(reply, WB_ENOTFOUND, 0, "the fake channel does not do that");
    }
    if (got >= 0)
        close(got);
    return send(conn, reply, len, MSG_NOSIGNAL) == (ssize_t)len;
}

static void *channel_main(void *arg)
{
    fake_pub *p = arg;
    while (atomic_load(&p->running)) {
        struct pollfd fds[5];
        fds[0] = (struct pollfd){.fd = p->listen_fd, .events = POLLIN};
        for (size_t i = 0; i < 4; i++)
            fds[i + 1] = (struct pollfd){.fd = p->conns[i], .events = POLLIN};
        if (poll(fds, 5, 10) <= 0)
            continue;
        if (fds[0].revents & POLLIN) {
            int c = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            for (size_t i = 0; c >= 0 && i < 4; i++) {
                if (p->conns[i] < 0) {
                    p->conns[i] = c;
                    c = -1;
                }
            }
            if (c >= 0)
                close(c);
        }
        for (size_t i = 0; i < 4; i++) {
            if (p->conns[i] >= 0 && (fds[i + 1].revents & (POLLIN | POLLHUP)) &&
                !serve(p, p->conns[i])) {
                close(p->conns[i]);
                p->conns[i] = -1;
            }
        }
    }
    return NULL;
}

void fake_broker_channel(fake_broker *f)
{
    fake_pub *p = &f->pub;
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    ck_assert_int_eq(wb__fdchan_path(f->path, sun.sun_path, sizeof sun.sun_path), WB_OK);
    p->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(p->listen_fd, 0);
    unlink(sun.sun_path);
    ck_assert_int_eq(bind(p->listen_fd, (struct sockaddr *)&sun, sizeof sun), 0);
    ck_assert_int_eq(listen(p->listen_fd, 4), 0);
    atomic_store(&p->running, 1);
    ck_assert_int_eq(pthread_create(&p->thread, NULL, channel_main, p), 0);
}

void fake_publish_stop(fake_broker *f)
{
    fake_pub *p = &f->pub;
    if (atomic_exchange(&p->running, 0)) {
        pthread_join(p->thread, NULL);
        char path[108];
        if (wb__fdchan_path(f->path, path, sizeof path) == WB_OK)
            unlink(path);
    }
    if (p->listen_fd >= 0)
        close(p->listen_fd);
    for (size_t i = 0; i < 4; i++) {
        if (p->conns[i] >= 0)
            close(p->conns[i]);
    }
    if (p->fd >= 0)
        close(p->fd);
    pthread_mutex_destroy(&p->mu);
}
