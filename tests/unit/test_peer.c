/* Peer identity: the credentials of a connection (SO_PEERCRED), a process's
 * name, and opening pidfds (which prove a process's death). */
#include "peer.h"
#include "ratelog.h"

#include <check.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

START_TEST(test_creds_from_fd)
{
    /* Both ends of a socketpair are this process. */
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    wb_peer_creds c;
    wb_err err;
    ck_assert_int_eq(wb__peer_creds_from_fd(sv[0], &c, &err), WB_OK);
    ck_assert_int_eq(c.known, 1);
    ck_assert_uint_eq(c.uid, (uint32_t)geteuid());
    ck_assert_uint_eq(c.gid, (uint32_t)getegid());
    ck_assert_uint_eq(c.pid, (uint32_t)getpid());
    close(sv[0]);
    close(sv[1]);

    /* Not a socket: refused, and *out says nothing is known. */
    int fd = open("/dev/null", O_RDONLY);
    ck_assert_int_ge(fd, 0);
    c = (wb_peer_creds){.known = 1, .uid = 9, .gid = 9, .pid = 9};
    ck_assert_int_eq(wb__peer_creds_from_fd(fd, &c, &err), WB_EPERM);
    ck_assert_int_eq(c.known, 0);
    ck_assert_uint_eq(c.pid, 0);
    ck_assert_msg(strstr(err.msg, "the peer's credentials are unavailable"), "%s", err.msg);
    close(fd);
}
END_TEST

START_TEST(test_comm)
{
    char buf[32];
    ck_assert_str_eq(wb__peer_comm((uint32_t)getpid(), buf, sizeof buf), "test_peer");
    ck_assert_ptr_null(strchr(buf, '\n'));
    /* A process that does not exist (pids stay below 2^22). */
    ck_assert_str_eq(wb__peer_comm(0x7ffffff0u, buf, sizeof buf), "?");
    /* A short buffer truncates but stays terminated. */
    char small[5];
    ck_assert_str_eq(wb__peer_comm((uint32_t)getpid(), small, sizeof small), "test");
}
END_TEST

START_TEST(test_pidfd)
{
    wb_err err;
    int fd = wb__pidfd_open((uint32_t)getpid(), &err);
    ck_assert_int_ge(fd, 0);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 0), 0); /* alive: not readable */
    close(fd);

    /* A child's pidfd becomes readable when it dies, before it is reaped. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        pause();
        _exit(0);
    }
    fd = wb__pidfd_open((uint32_t)pid, &err);
    ck_assert_int_ge(fd, 0);
    p.fd = fd;
    ck_assert_int_eq(poll(&p, 1, 0), 0);
    kill(pid, SIGKILL);
    ck_assert_int_eq(poll(&p, 1, 10000), 1);
    ck_assert(p.revents & POLLIN);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    close(fd);

    /* Once reaped, the pid is gone. */
    ck_assert_int_eq(wb__pidfd_open((uint32_t)pid, &err), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "no longer exists"));
    ck_assert_int_eq(wb__pidfd_open(0, &err), WB_EINVAL);
}
END_TEST

/* The pidfd of a connection names the process that connected: it lives
 * while that process does, and a connection whose process is gone gets
 * none (it was passed on; its pid may name another process by then). */
START_TEST(test_peer_pidfd)
{
    int sv[2], go[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ck_assert_int_eq(pipe(go), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        /* Holds the other end; exits when told. */
        close(sv[0]);
        char c;
        (void)!read(go[0], &c, 1);
        _exit(0);
    }
    close(go[0]);
    /* A socketpair's peer is the process that made it: this one. */
    wb_peer_creds c;
    wb_err err;
    ck_assert_int_eq(wb__peer_creds_from_fd(sv[0], &c, &err), WB_OK);
    int pfd = wb__peer_pidfd(sv[0], &c, &err);
    ck_assert_msg(pfd >= 0, "%s", err.msg);
    ck_assert_int_eq(wb__pidfd_exited(pfd), 0);
    ck_assert_int_eq(wb__pidfd_exited(-1), 0);
    close(pfd);

    /* A connection made by a process that exited (and was reaped) before
     * the broker judged it: no pidfd, whatever the pid names now. */
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(lfd, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path + 1, sizeof sun.sun_path - 1, "wbtest-peer-%d", (int)getpid());
    socklen_t slen =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(sun.sun_path + 1));
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sun, slen), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    pid_t maker = fork();
    ck_assert_int_ge(maker, 0);
    if (maker == 0) {
        int s2 = socket(AF_UNIX, SOCK_STREAM, 0);
        _exit(s2 >= 0 && connect(s2, (struct sockaddr *)&sun, slen) == 0 ? 0 : 1);
    }
    int st;
    ck_assert_int_eq(waitpid(maker, &st, 0), maker);
    ck_assert_int_eq(WEXITSTATUS(st), 0);
    int afd = accept(lfd, NULL, NULL);
    ck_assert_int_ge(afd, 0);
    wb_peer_creds gone;
    ck_assert_int_eq(wb__peer_creds_from_fd(afd, &gone, &err), WB_OK);
    ck_assert_uint_eq(gone.pid, (uint32_t)maker);
    ck_assert_int_eq(wb__peer_pidfd(afd, &gone, &err), WB_EPERM);
    ck_assert_msg(strstr(err.msg, "has exited"), "%s", err.msg);
    close(afd);
    close(lfd);

    /* The child's pidfd, opened while it lives, turns readable at its exit. */
    wb_peer_creds kid = {.known = 1, .uid = (uint32_t)geteuid(), .pid = (uint32_t)child};
    int kfd = wb__pidfd_open(kid.pid, &err);
    ck_assert_int_ge(kfd, 0);
    ck_assert_int_eq(wb__pidfd_exited(kfd), 0);
    ck_assert_int_eq(write(go[1], "x", 1), 1);
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    ck_assert_int_eq(wb__pidfd_exited(kfd), 1);
    close(kfd);
    close(go[1]);
    close(sv[0]);
    close(sv[1]);
}
END_TEST

/* Log lines caused by peers: a burst per event and key, then a count. */
START_TEST(test_ratelog)
{
    wb__ratelog_reset();
    static const char ev_a[] = "a", ev_b[] = "b";
    uint64_t sup;
    int64_t t = 1000000;
    for (int i = 0; i < WB_RATELOG_BURST; i++) {
        ck_assert_int_eq(wb__ratelog_allow(ev_a, 7, t, &sup), 1);
        ck_assert_uint_eq(sup, 0);
    }
    for (int i = 0; i < 25; i++)
        ck_assert_int_eq(wb__ratelog_allow(ev_a, 7, t + i, &sup), 0);
    /* Another key and another event have windows of their own. */
    ck_assert_int_eq(wb__ratelog_allow(ev_a, 8, t, &sup), 1);
    ck_assert_int_eq(wb__ratelog_allow(ev_b, 7, t, &sup), 1);
    /* The next window's first line tells how many were held back. */
    ck_assert_int_eq(wb__ratelog_allow(ev_a, 7, t + WB_RATELOG_INTERVAL_MS, &sup), 1);
    ck_assert_uint_eq(sup, 25);
    ck_assert_int_eq(wb__ratelog_allow(ev_a, 7, t + WB_RATELOG_INTERVAL_MS + 1, &sup), 1);
    ck_assert_uint_eq(sup, 0);
    ck_assert_uint_eq(wb__ratelog_suppressed_total(), 25);
    /* Many keys at once: at most WB_RATELOG_GLOBAL_PER_S lines a second. */
    wb__ratelog_reset();
    int written = 0;
    for (uint64_t key = 0; key < 1000; key++) {
        written += wb__ratelog_allow(ev_b, key, t, &sup);
    }
    ck_assert_int_eq(written, WB_RATELOG_GLOBAL_PER_S);
    ck_assert_int_eq(wb__ratelog_allow(ev_b, 5000, t + 1000, &sup), 1);
    ck_assert_uint_eq(sup, 1000 - WB_RATELOG_GLOBAL_PER_S);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("peer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_creds_from_fd);
    tcase_add_test(tc, test_comm);
    tcase_add_test(tc, test_pidfd);
    tcase_add_test(tc, test_peer_pidfd);
    tcase_add_test(tc, test_ratelog);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
