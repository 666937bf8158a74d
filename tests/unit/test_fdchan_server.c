/* The descriptor channel (broker/fdchan_server.h) on a real socket in a
 * scratch directory, with this test process as the client: the holder of a
 * lease gets its slab's sealed memfd and reads the model's bytes through
 * it; an unknown id, another process's lease and a model without
 * descriptors are refused with their reasons; closing the connection
 * reclaims the leases fetched through it; bytes of the wrong shape are
 * answered and the connection closed; a connection that asks nothing is
 * closed after the handshake time; the path is bound 0660 and unlinked; a
 * session's token binds only its own connection's uid and pid, and its end
 * reclaims every lease of its identity. */
#include "broker_fixture.h"
#include "fdchan_server.h"
#include "fdchan_wire.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

static char dir[64];
static char sock_path[128];

/* A ready model whose slab is a sealed memfd: "a", 12 bytes at 0. */
static wb_model *memfd_model(wb_broker *b, const char *name)
{
    wb_err err;
    const wb_backend *be = &wb__backend_host_memfd;
    wb_model *m = wb__model_new(name, "/models/fixture.safetensors", be, -1);
    ck_assert_ptr_nonnull(m);
    wb_model_data d;
    memset(&d, 0, sizeof d);
    d.n_slabs = 1;
    d.slabs = calloc(1, sizeof *d.slabs);
    ck_assert_int_eq(be->slab_alloc(&d.slabs[0], -1, 256, &err), WB_OK);
    ck_assert_int_eq(be->slab_prepare(&d.slabs[0], 0, 256, &err), WB_OK);
    uint8_t *p = be->slab_dest(&d.slabs[0], 0, 12);
    for (int k = 0; k < 12; k++)
        p[k] = (uint8_t)(k + 1);
    ck_assert_int_eq(be->slab_seal(&d.slabs[0], &err), WB_OK);
    d.slab_bytes = d.slabs[0].size;
    d.n_tensors = 1;
    d.tensors = calloc(1, sizeof *d.tensors);
    d.tensors[0].name = strdup("a");
    strcpy(d.tensors[0].dtype, "U8");
    d.tensors[0].ndim = 1;
    d.tensors[0].shape = malloc(sizeof *d.tensors[0].shape);
    d.tensors[0].shape[0] = 12;
    d.tensors[0].nbytes = 12;
    d.tensors[0].xxh3 = XXH3_64bits(d.slabs[0].shm.addr, 12);
    d.bytes = 12;
    ck_assert_int_eq(wb__model_adopt(m, &d, &err), WB_OK);
    wb__models_add(&b->models, m);
    return m;
}

static void setup_side(wb_broker *b, wb_fdchan_server *s)
{
    fixture_broker(b, 1000, 5000);
    snprintf(dir, sizeof dir, "/tmp/wbside.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(sock_path, sizeof sock_path, "%s/broker.sock", dir);
    wb_err err;
    ck_assert_int_eq(wb__fdchan_listen(s, b, sock_path,
                                       &(wb_loop_options){.max_peers = 8,
                                                          .max_per_uid = 8,
                                                          .max_sessions_per_uid = 8,
                                                          .handshake_ms = 300},
                                       &err),
                     WB_OK);
}

static void teardown_side(wb_broker *b, wb_fdchan_server *s)
{
    wb__fdchan_destroy(s);
    wb__broker_destroy(b);
    rmdir(dir);
}

static int connect_side(void)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%.80s.fd", sock_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sun, sizeof sun), 0);
    return fd;
}

/* Lets the broker's side run until the client has something to read (or
 * about a second has passed). */
static void pump(wb_fdchan_server *s, int cfd)
{
    for (int i = 0; i < 200; i++) {
        wb__fdchan_handle(s);
        struct pollfd p = {.fd = cfd, .events = POLLIN};
        if (poll(&p, 1, 5) > 0)
            return;
    }
}

typedef struct answer {
    int32_t status;
    uint32_t n_fds;
    int fds[WB_FDCHAN_MAX_FDS];
    char msg[WB_FDCHAN_MSG_MAX + 1];
    int eof;
} answer;

static answer ask(wb_fdchan_server *s, int cfd, const uint8_t *raw, size_t len)
{
    answer a;
    memset(&a, 0, sizeof a);
    ck_assert_int_eq(send(cfd, raw, len, MSG_NOSIGNAL), (ssize_t)len);
    pump(s, cfd);
    uint8_t hdr[WB_FDCHAN_HEADER_LEN];
    struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * WB_FDCHAN_MAX_FDS)];
    } ctl;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(cfd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n == 0) {
        a.eof = 1;
        return a;
    }
    ck_assert_int_eq(n, (ssize_t)sizeof hdr);
    size_t taken;
    ck_assert_uint_eq(wb__fdchan_take_fds(&mh, a.fds, WB_FDCHAN_MAX_FDS, &taken), taken);
    a.n_fds = (uint32_t)taken;
    uint32_t announced, ml;
    wb_err err;
    ck_assert_int_eq(wb__fdchan_header_parse(hdr, &a.status, &announced, &ml, &err), WB_OK);
    ck_assert_uint_eq(announced, a.n_fds);
    if (ml)
        ck_assert_int_eq(recv(cfd, a.msg, ml, MSG_DONTWAIT), (ssize_t)ml);
    return a;
}

static answer ask_id(wb_fdchan_server *s, int cfd, const uint8_t *id)
{
    uint8_t req[WB_FDCHAN_REQUEST_LEN];
    wb__fdchan_request_pack(req, id);
    return ask(s, cfd, req, sizeof req);
}

static wb_lease_rec *grant(wb_broker *b, wb_model *m, wb_peer_creds c)
{
    wb_lease_rec *l;
    wb_err err;
    ck_assert_int_eq(
        wb__leases_grant(&b->leases, m, &c, "test", fake_ms, fake_now_wall(), &l, &err), WB_OK);
    m->leases++;
    return l;
}

START_TEST(test_holder_gets_sealed_memfd)
{
    wb_broker b;
    wb_fdchan_server s;
    setup_side(&b, &s);
    struct stat st;
    ck_assert_int_eq(stat(s.path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 07777, 0660);
    wb_model *m = memfd_model(&b, "m");
    wb_lease_rec *l = grant(&b, m, me());
    int cfd = connect_side();
    answer a = ask_id(&s, cfd, l->id);
    ck_assert_int_eq(a.status, WB_OK);
    ck_assert_str_eq(a.msg, "");
    ck_assert_uint_eq(a.n_fds, 1);
    ck_assert_int_eq(fcntl(a.fds[0], F_GET_SEALS) & 0xf, 0xf);
    wb_shm map;
    wb_err err;
    ck_assert_int_eq(wb__shm_map_fd_ro(&map, a.fds[0], m->data.slabs[0].size, "slab 0", &err),
                     WB_OK);
    for (int k = 0; k < 12; k++)
        ck_assert_uint_eq(((const uint8_t *)map.addr)[k], (unsigned)(k + 1));
    errno = 0;
    ck_assert_int_eq(write(a.fds[0], "x", 1), -1);
    ck_assert_int_eq(errno, EPERM);
    wb__shm_unmap(&map);
    close(a.fds[0]);
    /* The same lease again: the same answer. */
    a = ask_id(&s, cfd, l->id);
    ck_assert_int_eq(a.status, WB_OK);
    ck_assert_uint_eq(a.n_fds, 1);
    close(a.fds[0]);
    close(cfd);
    char path[sizeof s.path];
    snprintf(path, sizeof path, "%s", s.path);
    teardown_side(&b, &s);
    ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

START_TEST(test_refusals)
{
    wb_broker b;
    wb_fdchan_server s;
    setup_side(&b, &s);
    wb_model *m = memfd_model(&b, "m");
    wb_model *named = fixture_model(&b, "named");
    int cfd = connect_side();
    uint8_t unknown[WB_LEASE_ID_LEN] = {0xde, 0xad, 0xbe, 0xef};
    answer a = ask_id(&s, cfd, unknown);
    ck_assert_int_eq(a.status, WB_ENOTFOUND);
    ck_assert_str_eq(a.msg, "no lease deadbeef");
    ck_assert_uint_eq(a.n_fds, 0);

    /* Another process's lease: a child that waits. */
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        pause();
        _exit(0);
    }
    wb_peer_creds other = creds((uint32_t)geteuid(), (uint32_t)getegid(), (uint32_t)child);
    wb_lease_rec *l = grant(&b, m, other);
    a = ask_id(&s, cfd, l->id);
    ck_assert_int_eq(a.status, WB_EPERM);
    char want[200], hex[9];
    snprintf(want, sizeof want,
             "lease %s belongs to pid %d (uid %u), not to this connection's pid %d (uid %u)",
             wb__lease_id_short(l->id, hex), (int)child, (unsigned)geteuid(), (int)getpid(),
             (unsigned)geteuid());
    ck_assert_str_eq(a.msg, want);
    ck_assert_uint_eq(a.n_fds, 0);
    ck_assert_uint_eq(b.stats.requests_refused, 1);
    /* The refused lease is untouched, and the connection still serves. */
    ck_assert_ptr_eq(wb__leases_find(&b.leases, l->id), l);

    /* A model whose slabs are reached by name has no descriptors. */
    wb_lease_rec *ln = grant(&b, named, me());
    a = ask_id(&s, cfd, ln->id);
    ck_assert_int_eq(a.status, WB_ENOSYS);
    ck_assert_str_eq(a.msg, "model 'named' has no slab descriptors (transport shm)");
    close(cfd);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    teardown_side(&b, &s);
}
END_TEST

START_TEST(test_eof_reclaims)
{
    wb_broker b;
    wb_fdchan_server s;
    setup_side(&b, &s);
    wb_model *m = memfd_model(&b, "m");
    wb_lease_rec *fetched = grant(&b, m, me());
    wb_lease_rec *kept = grant(&b, m, me());
    uint8_t fetched_id[WB_LEASE_ID_LEN], kept_id[WB_LEASE_ID_LEN];
    memcpy(fetched_id, fetched->id, sizeof fetched_id);
    memcpy(kept_id, kept->id, sizeof kept_id);
    int cfd = connect_side();
    answer a = ask_id(&s, cfd, fetched_id);
    ck_assert_int_eq(a.status, WB_OK);
    close(a.fds[0]);
    ck_assert_uint_eq(s.n, 1);
    /* The process lives on; its connection ends: the lease fetched through
     * it is reclaimed, the other one stays. */
    close(cfd);
    for (int i = 0; i < 200 && s.n; i++) {
        wb__fdchan_handle(&s);
        usleep(1000);
    }
    ck_assert_uint_eq(s.n, 0);
    ck_assert_ptr_null(wb__leases_find(&b.leases, fetched_id));
    ck_assert_ptr_nonnull(wb__leases_find(&b.leases, kept_id));
    ck_assert_uint_eq(b.stats.leases_reclaimed, 1);
    ck_assert_uint_eq(m->leases, 1);
    teardown_side(&b, &s);
}
END_TEST

/* A session: one token per connection, the same on every request;
 * wb__fdchan_bind accepts it only from the kernel identity of the connection
 * that got it (uid, and pid where visible), refuses a wrong size or an
 * unknown token; when the connection ends the session is gone and every
 * lease of its identity is reclaimed, fetched through it or not. */
START_TEST(test_session)
{
    wb_broker b;
    wb_fdchan_server s;
    setup_side(&b, &s);
    wb_model *m = memfd_model(&b, "m");
    int cfd = connect_side();
    uint8_t req[WB_FDCHAN_REQUEST_LEN];
    wb__fdchan_session_request_pack(req);
    answer a = ask(&s, cfd, req, sizeof req);
    ck_assert_int_eq(a.status, WB_OK);
    ck_assert_uint_eq(a.n_fds, 0);
    ck_assert_uint_eq(strlen(a.msg), WB_SESSION_TOKEN_HEX);
    uint8_t token[WB_SESSION_TOKEN_LEN];
    wb_err err;
    ck_assert_int_eq(wb__session_token_parse(a.msg, token, &err), WB_OK);
    answer again = ask(&s, cfd, req, sizeof req);
    ck_assert_str_eq(again.msg, a.msg);

    /* A second connection of the same process has another token. */
    int cfd2 = connect_side();
    answer other = ask(&s, cfd2, req, sizeof req);
    ck_assert_int_eq(other.status, WB_OK);
    ck_assert_str_ne(other.msg, a.msg);
    close(cfd2);
    wb__fdchan_handle(&s);

    wb_peer_creds kernel = me(), out;
    uint64_t serial = 0;
    ck_assert_int_eq(wb__fdchan_bind(&s, &kernel, token, sizeof token, &out, &serial, &err), WB_OK);
    ck_assert_int_eq(out.known, 1);
    ck_assert_uint_eq(out.pid, kernel.pid);
    ck_assert_uint_eq(out.uid, kernel.uid);
    ck_assert_int_eq(out.pid_hidden, 0);
    ck_assert_uint_ne(serial, 0);
    ck_assert_int_eq(wb__fdchan_session_alive(&s, serial), 1);

    char want[300];
    wb_peer_creds wrong_uid = kernel;
    wrong_uid.uid = kernel.uid + 1;
    ck_assert_int_eq(wb__fdchan_bind(&s, &wrong_uid, token, sizeof token, &out, &serial, &err),
                     WB_EPERM);
    snprintf(want, sizeof want,
             "the session token belongs to uid %u (session %u), not to this connection's uid %u",
             kernel.uid, kernel.pid, kernel.uid + 1);
    ck_assert_str_eq(err.msg, want);
    wb_peer_creds wrong_pid = kernel;
    wrong_pid.pid = kernel.pid + 1;
    ck_assert_int_eq(wb__fdchan_bind(&s, &wrong_pid, token, sizeof token, &out, &serial, &err),
                     WB_EPERM);
    snprintf(want, sizeof want,
             "the session token belongs to pid %u, not to this connection's pid %u", kernel.pid,
             kernel.pid + 1);
    ck_assert_str_eq(err.msg, want);
    wb_peer_creds hidden = {.uid = kernel.uid, .gid = kernel.gid, .pid_hidden = 1};
    ck_assert_int_eq(wb__fdchan_bind(&s, &hidden, token, sizeof token, &out, &serial, &err),
                     WB_EPERM);
    snprintf(want, sizeof want,
             "the session token belongs to pid %u, not to this connection's pid hidden (another "
             "pid namespace)",
             kernel.pid);
    ck_assert_str_eq(err.msg, want);
    wb_peer_creds unread = {0};
    ck_assert_int_eq(wb__fdchan_bind(&s, &unread, token, sizeof token, &out, &serial, &err),
                     WB_EPERM);
    ck_assert_str_eq(err.msg, "the broker could not read the peer's credentials");
    ck_assert_int_eq(wb__fdchan_bind(&s, &kernel, token, 15, &out, &serial, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "the session token has 15 bytes, not 16");
    uint8_t forged[WB_SESSION_TOKEN_LEN];
    memcpy(forged, token, sizeof forged);
    forged[15] ^= 1;
    ck_assert_int_eq(wb__fdchan_bind(&s, &kernel, forged, sizeof forged, &out, &serial, &err),
                     WB_EPERM);
    snprintf(want, sizeof want,
             "no session on the descriptor channel %s has this token (its connection ended, or "
             "the token is forged)",
             s.path);
    ck_assert_str_eq(err.msg, want);

    /* Two leases of the session's identity, neither fetched: the end of
     * the connection reclaims both (the process's end), not only what it
     * fetched. */
    grant(&b, m, kernel);
    grant(&b, m, kernel);
    ck_assert_uint_eq(b.leases.n_leases, 2);
    ck_assert_int_eq(wb__fdchan_bind(&s, &kernel, token, sizeof token, &out, &serial, &err), WB_OK);
    close(cfd);
    for (int i = 0; i < 100 && s.n > 0; i++) {
        wb__fdchan_handle(&s);
        usleep(1000);
    }
    ck_assert_uint_eq(s.n, 0);
    ck_assert_uint_eq(b.leases.n_leases, 0);
    ck_assert_uint_eq(b.stats.leases_reclaimed, 2);
    ck_assert_uint_eq(m->leases, 0);
    ck_assert_int_eq(wb__fdchan_session_alive(&s, serial), 0);
    ck_assert_int_eq(wb__fdchan_bind(&s, &kernel, token, sizeof token, &out, &serial, &err),
                     WB_EPERM);
    teardown_side(&b, &s);
}
END_TEST

START_TEST(test_hostile_input)
{
    wb_broker b;
    wb_fdchan_server s;
    setup_side(&b, &s);
    int cfd = connect_side();
    uint8_t junk[WB_FDCHAN_REQUEST_LEN];
    memset(junk, 'Z', sizeof junk);
    answer a = ask(&s, cfd, junk, sizeof junk);
    ck_assert_int_eq(a.status, WB_EPROTO);
    ck_assert_str_eq(a.msg,
                     "descriptor request does not start with \"WBF1\", \"WBS1\" or \"WBP1\"");
    ck_assert_uint_eq(b.stats.malformed_messages, 1);
    char c;
    ck_assert_int_eq(recv(cfd, &c, 1, MSG_DONTWAIT), 0); /* closed */
    close(cfd);
    ck_assert_uint_eq(s.n, 0);

    /* Half a request, then silence: closed after the handshake time. */
    cfd = connect_side();
    ck_assert_int_eq(send(cfd, "WBF1", 4, 0), 4);
    pump(&s, cfd);
    ck_assert_uint_eq(s.n, 1);
    wb__fdchan_expire(&s);
    ck_assert_uint_eq(s.n, 1);
    advance_ms(301);
    wb__fdchan_expire(&s);
    ck_assert_uint_eq(s.n, 0);
    ck_assert_int_eq(recv(cfd, &c, 1, MSG_DONTWAIT), 0);
    close(cfd);

    /* More connections than allowed: the surplus is closed at once. */
    int fds[9];
    for (int i = 0; i < 9; i++)
        fds[i] = connect_side();
    for (int i = 0; i < 20; i++)
        wb__fdchan_handle(&s);
    ck_assert_uint_eq(s.n, 8);
    ck_assert_uint_eq(b.stats.peers_refused, 1);
    for (int i = 0; i < 9; i++)
        close(fds[i]);
    teardown_side(&b, &s);
}
END_TEST

/* Sends a publish request ("WBP1") with `n` descriptors attached (memfds
 * whose inodes go to `ino`). */
static answer ask_publish(wb_fdchan_server *s, int cfd, const uint8_t *id, int n, ino_t *ino)
{
    uint8_t req[WB_FDCHAN_REQUEST_LEN];
    wb__fdchan_publish_request_pack(req, id);
    int fds[4];
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof fds)];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = req, .iov_len = sizeof req};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    for (int i = 0; i < n; i++) {
        fds[i] = memfd_create("publish", MFD_CLOEXEC);
        ck_assert_int_ge(fds[i], 0);
        struct stat st;
        ck_assert_int_eq(fstat(fds[i], &st), 0);
        ino[i] = st.st_ino;
    }
    if (n) {
        mh.msg_control = ctl.space;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)n);
    }
    ck_assert_int_eq(sendmsg(cfd, &mh, MSG_NOSIGNAL), (ssize_t)sizeof req);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    pump(s, cfd);
    return ask(s, cfd, NULL, 0);
}

/* How many of this process's descriptors are open on inode `ino`. */
static int open_on(ino_t ino)
{
    int count = 0;
    for (int fd = 0; fd < 4096; fd++) {
        struct stat st;
        if (fstat(fd, &st) == 0 && st.st_ino == ino && S_ISREG(st.st_mode))
            count++;
    }
    return count;
}

/* A publish request with no descriptor, or two, is refused, and whatever
 * came with it is closed in the broker; so is one for a publish nobody
 * began. */
START_TEST(test_publish_fds)
{
    wb_broker b;
    wb_fdchan_server s;
    setup_side(&b, &s);
    int cfd = connect_side();
    uint8_t id[WB_LEASE_ID_LEN];
    memset(id, 0x5a, sizeof id);
    ino_t ino[4];
    answer a = ask_publish(&s, cfd, id, 0, ino);
    ck_assert_int_eq(a.status, WB_EINVAL);
    ck_assert_str_eq(a.msg, "a publish request carries exactly one descriptor (a memfd), not 0");
    a = ask_publish(&s, cfd, id, 2, ino);
    ck_assert_int_eq(a.status, WB_EINVAL);
    ck_assert_str_eq(a.msg, "a publish request carries exactly one descriptor (a memfd), not 2");
    ck_assert_int_eq(open_on(ino[0]), 0);
    ck_assert_int_eq(open_on(ino[1]), 0);
    a = ask_publish(&s, cfd, id, 1, ino);
    ck_assert_int_ne(a.status, WB_OK);
    ck_assert_int_eq(open_on(ino[0]), 0);
    close(cfd);
    teardown_side(&b, &s);
}
END_TEST

int main(void)
{
    (void)shm_name_exists; /* broker_fixture.h's, for named slabs */
    Suite *su = suite_create("fdchan_server");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_holder_gets_sealed_memfd);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_eof_reclaims);
    tcase_add_test(tc, test_session);
    tcase_add_test(tc, test_hostile_input);
    tcase_add_test(tc, test_publish_fds);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
