/* Peer identity: the credentials of a connection (SO_PEERCRED), a process's
 * name, and opening pidfds (which prove a process's death). */
#include "peer.h"

#include <check.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
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

int main(void)
{
    Suite *s = suite_create("peer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_creds_from_fd);
    tcase_add_test(tc, test_comm);
    tcase_add_test(tc, test_pidfd);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
