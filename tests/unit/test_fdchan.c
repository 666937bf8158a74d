/* The client's end of the descriptor channel (client/fdchan.h) against the
 * broker's (broker/fdchan_server.h) on a real socket, the broker side pumped
 * by a thread: a process gets one session token per connection, the same
 * on every ask, that the broker binds to this process; the session stays
 * open until the broker closes its end, after which the next ask connects
 * again and gets another token; a broker that predates sessions answers
 * the request as malformed and the client reports it. */
#include "broker.h"
#include "fdchan.h"
#include "fdchan_server.h"
#include "fdchan_wire.h"

#include <check.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static char dir[64];
static char sock_path[96];

static void broker_init(wb_broker *b)
{
    wb_broker_config cfg = {
        .backend = &wb__backend_host, .device = -1, .heartbeat_ms = 1000, .stale_ms = 5000};
    wb__broker_init(b, &cfg);
}

static wb_peer_creds me(void)
{
    wb_peer_creds c = {.known = 1,
                       .uid = (uint32_t)geteuid(),
                       .gid = (uint32_t)getegid(),
                       .pid = (uint32_t)getpid()};
    return c;
}

typedef struct pump {
    wb_fdchan_server *s;
    pthread_t t;
    atomic_int stop;
} pump;

static void *pump_main(void *arg)
{
    pump *p = arg;
    while (!atomic_load(&p->stop)) {
        wb__fdchan_handle(p->s);
        usleep(500);
    }
    return NULL;
}

static void pump_start(pump *p, wb_fdchan_server *s)
{
    p->s = s;
    atomic_init(&p->stop, 0);
    ck_assert_int_eq(pthread_create(&p->t, NULL, pump_main, p), 0);
}

static void pump_stop(pump *p)
{
    atomic_store(&p->stop, 1);
    pthread_join(p->t, NULL);
}

START_TEST(test_session_per_connection)
{
    wb_broker b;
    wb_fdchan_server s;
    broker_init(&b);
    snprintf(dir, sizeof dir, "/tmp/wbfdc.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(sock_path, sizeof sock_path, "%s/broker.sock", dir);
    wb_err err;
    ck_assert_int_eq(wb__fdchan_listen(&s, &b, sock_path,
                                       &(wb_loop_options){.max_peers = 8,
                                                          .max_per_uid = 8,
                                                          .max_sessions_per_uid = 8,
                                                          .handshake_ms = 1000},
                                       &err),
                     WB_OK);
    pump p;
    pump_start(&p, &s);
    uint8_t t1[WB_SESSION_TOKEN_LEN], again[WB_SESSION_TOKEN_LEN];
    ck_assert_int_eq(wb__fdchan_session(sock_path, 2000, t1, &err), WB_OK);
    ck_assert_int_eq(wb__fdchan_session(sock_path, 2000, again, &err), WB_OK);
    ck_assert_mem_eq(t1, again, sizeof t1);
    ck_assert_int_eq(wb__fdchan_session_open(sock_path, t1), 1);
    uint8_t other[WB_SESSION_TOKEN_LEN];
    memcpy(other, t1, sizeof other);
    other[0] ^= 0x80;
    ck_assert_int_eq(wb__fdchan_session_open(sock_path, other), 0);
    pump_stop(&p);

    /* The broker knows the token as this process's. */
    wb_peer_creds self = me(), out;
    uint64_t serial;
    ck_assert_int_eq(wb__fdchan_bind(&s, &self, t1, sizeof t1, &out, &serial, &err), WB_OK);
    ck_assert_uint_eq(out.pid, self.pid);

    /* The broker goes away and another takes the path: the old session is
     * over, the next ask gets a new one. */
    wb__fdchan_destroy(&s);
    ck_assert_int_eq(wb__fdchan_session_open(sock_path, t1), 0);
    ck_assert_int_eq(wb__fdchan_listen(&s, &b, sock_path,
                                       &(wb_loop_options){.max_peers = 8,
                                                          .max_per_uid = 8,
                                                          .max_sessions_per_uid = 8,
                                                          .handshake_ms = 1000},
                                       &err),
                     WB_OK);
    pump_start(&p, &s);
    uint8_t t2[WB_SESSION_TOKEN_LEN];
    ck_assert_int_eq(wb__fdchan_session(sock_path, 2000, t2, &err), WB_OK);
    ck_assert_mem_ne(t1, t2, sizeof t1);
    ck_assert_int_eq(wb__fdchan_session_open(sock_path, t2), 1);
    ck_assert_int_eq(wb__fdchan_session_open(sock_path, t1), 0);
    pump_stop(&p);
    ck_assert_int_eq(wb__fdchan_bind(&s, &self, t1, sizeof t1, &out, &serial, &err), WB_EPERM);
    ck_assert_int_eq(wb__fdchan_bind(&s, &self, t2, sizeof t2, &out, &serial, &err), WB_OK);
    wb__fdchan_destroy(&s);
    wb__broker_destroy(&b);
    rmdir(dir);
}
END_TEST

/* A broker from before sessions: reads a request, answers it as one of the
 * wrong magic, closes. */
static void *old_broker(void *arg)
{
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    uint8_t req[WB_FDCHAN_REQUEST_LEN];
    ssize_t n = recv(fd, req, sizeof req, MSG_WAITALL);
    uint8_t buf[WB_FDCHAN_REPLY_MAX];
    size_t len = wb__fdchan_reply_pack(
        buf, WB_EPROTO, 0,
        n == (ssize_t)sizeof req ? "descriptor request does not start with \"WBF1\"" : "short");
    (void)!send(fd, buf, len, MSG_NOSIGNAL);
    close(fd);
    return NULL;
}

START_TEST(test_broker_without_sessions)
{
    snprintf(dir, sizeof dir, "/tmp/wbfdc.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(sock_path, sizeof sock_path, "%s/old.sock", dir);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%.90s.fd", sock_path);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(lfd, 0);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sun, sizeof sun), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, old_broker, &lfd), 0);
    uint8_t token[WB_SESSION_TOKEN_LEN];
    wb_err err;
    ck_assert_int_eq(wb__fdchan_session(sock_path, 2000, token, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "the broker refused a session: descriptor request does not start "
                              "with \"WBF1\"");
    pthread_join(t, NULL);
    ck_assert_int_eq(wb__fdchan_session_open(sock_path, token), 0);
    close(lfd);
    unlink(sun.sun_path);
    rmdir(dir);
}
END_TEST

/* A process that outlives brokers (a test runner, a long-lived worker
 * that followed several) is not locked out once it has talked to more
 * brokers than the channel table holds: a gone broker's slot is reused. */
START_TEST(test_brokers_come_and_go)
{
    wb_broker b;
    wb_fdchan_server s;
    broker_init(&b);
    snprintf(dir, sizeof dir, "/tmp/wbfdc.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    wb_err err;
    for (int k = 0; k < 12; k++) {
        snprintf(sock_path, sizeof sock_path, "%s/broker%d.sock", dir, k);
        ck_assert_int_eq(wb__fdchan_listen(&s, &b, sock_path,
                                           &(wb_loop_options){.max_peers = 8,
                                                              .max_per_uid = 8,
                                                              .max_sessions_per_uid = 8,
                                                              .handshake_ms = 1000},
                                           &err),
                         WB_OK);
        pump p;
        pump_start(&p, &s);
        uint8_t t[WB_SESSION_TOKEN_LEN];
        int rc = wb__fdchan_session(sock_path, 2000, t, &err);
        ck_assert_msg(rc == WB_OK, "broker %d: %s", k, err.msg);
        pump_stop(&p);
        wb__fdchan_destroy(&s);
    }
    wb__broker_destroy(&b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fdchan");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_session_per_connection);
    tcase_add_test(tc, test_broker_without_sessions);
    tcase_add_test(tc, test_brokers_come_and_go);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
