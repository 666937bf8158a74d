/* Peer identity: parsing libzmq's Peer-Address property, reading a process's
 * name, and opening pidfds (which prove a process's death). */
#include "peer.h"

#include <check.h>

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

START_TEST(test_parse_valid)
{
    wb_peer_creds c;
    wb_err err;
    ck_assert_int_eq(wb__peer_parse_address(":1000:1000:42", &c, &err), WB_OK);
    ck_assert_int_eq(c.known, 1);
    ck_assert_uint_eq(c.uid, 1000);
    ck_assert_uint_eq(c.gid, 1000);
    ck_assert_uint_eq(c.pid, 42);

    ck_assert_int_eq(wb__peer_parse_address("localhost:0:0:1", &c, &err), WB_OK);
    ck_assert_uint_eq(c.uid, 0);
    ck_assert_uint_eq(c.gid, 0);
    ck_assert_uint_eq(c.pid, 1);

    /* Only the last three fields count, whatever comes before. */
    ck_assert_int_eq(wb__peer_parse_address("a:b:c:5:6:7", &c, &err), WB_OK);
    ck_assert_uint_eq(c.uid, 5);
    ck_assert_uint_eq(c.gid, 6);
    ck_assert_uint_eq(c.pid, 7);

    ck_assert_int_eq(wb__peer_parse_address(":4294967295:4294967294:2147483647", &c, &err), WB_OK);
    ck_assert_uint_eq(c.uid, 4294967295u);
    ck_assert_uint_eq(c.gid, 4294967294u);
    ck_assert_uint_eq(c.pid, 2147483647u);
}
END_TEST

START_TEST(test_parse_invalid)
{
    static const char *const bad[] = {
        "",
        "garbage",
        ":1000:1000",                       /* two fields */
        "1000:1000",                        /* two fields */
        ":1000::42",                        /* empty gid */
        ":1000:1000:",                      /* empty pid */
        ":x:1000:42",                       /* not a number */
        ":1000:1000:42 ",                   /* trailing space */
        ":-1:1000:42",                      /* sign */
        ":+1:1000:42",                      /* sign */
        ":4294967296:1000:42",              /* uid overflows 32 bits */
        ":1000:1000:99999999999",           /* pid overflows */
        ":1000:1000:0",                     /* pid not visible */
        ":1000:1000:000000000000000000001", /* too many digits */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wb_peer_creds c = {.known = 1, .uid = 9, .gid = 9, .pid = 9};
        wb_err err;
        ck_assert_msg(wb__peer_parse_address(bad[i], &c, &err) == WB_EPERM, "accepted '%s'",
                      bad[i]);
        ck_assert_int_eq(c.known, 0);
        ck_assert_uint_eq(c.pid, 0);
        ck_assert_ptr_nonnull(strstr(err.msg, "Peer-Address"));
    }
    wb_peer_creds c;
    wb_err err;
    ck_assert_int_eq(wb__peer_parse_address(NULL, &c, &err), WB_EPERM);
    ck_assert_str_eq(err.msg, "the peer's credentials are unavailable (no Peer-Address)");
    ck_assert_int_eq(wb__peer_parse_address(":1:2:0", &c, &err), WB_EPERM);
    ck_assert_ptr_nonnull(strstr(err.msg, "pid is not visible"));
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
    tcase_add_test(tc, test_parse_valid);
    tcase_add_test(tc, test_parse_invalid);
    tcase_add_test(tc, test_comm);
    tcase_add_test(tc, test_pidfd);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
