/* libwbclient's logging: silent by default, lines to the host's handler
 * with their level, the level threshold, and $WB_CLIENT_LOG. The library
 * call that logs here is wb_client_destroy with a lease that still has a
 * container (a warning), against the FAKE broker of fake_broker.h. */
#include "wb/client.h"

#include "fake_broker.h"

#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static wb_shm slab;
static fake_broker broker;
static const fake_tensor tensors[1] = {{"w", "U8", 0, 64, 64}};

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/wbtest-clog-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    fake_slab_create(&slab, 4096, 5, 3);
    char path[160];
    snprintf(path, sizeof path, "%s/broker.sock", dir);
    fake_broker_start(&broker, path, &slab, 1000, 0, tensors, 1);
}

static void teardown(void)
{
    fake_broker_stop(&broker);
    fake_slab_destroy(&slab);
    rmdir(dir);
}

/* fd 2 goes to a file while a test runs; restore_stderr returns what was
 * written there. */
static int saved_fd = -1;
static char capture_path[128];

static void capture_stderr(void)
{
    snprintf(capture_path, sizeof capture_path, "%s/stderr.txt", dir);
    int fd = open(capture_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    saved_fd = dup(2);
    ck_assert_int_ge(saved_fd, 0);
    ck_assert_int_eq(dup2(fd, 2), 2);
    close(fd);
}

static char *restore_stderr(void)
{
    ck_assert_int_eq(dup2(saved_fd, 2), 2);
    close(saved_fd);
    FILE *f = fopen(capture_path, "r");
    ck_assert_ptr_nonnull(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(capture_path);
    return buf;
}

/* Acquires a lease, registers a container on it and destroys the client,
 * which warns that the lease stays mapped; then ends the lease locally. */
static void destroy_with_busy_lease(void)
{
    wb_client *c = fake_connect(broker.path, 1, 5000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_lease_container_add(l), WB_OK);
    wb_client_destroy(&c);
    ck_assert_int_eq(wb_lease_release(&l), WB_EBUSY);
    ck_assert_int_eq(wb_lease_container_remove(l), WB_OK);
    ck_assert_int_eq(wb_lease_release(&l), WB_ECONN);
    ck_assert_ptr_null(l);
}

#define MAX_LINES 8
static pthread_mutex_t got_mu = PTHREAD_MUTEX_INITIALIZER;
static int n_got;
static wb_log_level got_level[MAX_LINES];
static char got_line[MAX_LINES][1024];
static void *got_userdata;

static void collect(wb_log_level level, const char *line, void *userdata)
{
    pthread_mutex_lock(&got_mu);
    if (n_got < MAX_LINES) {
        got_level[n_got] = level;
        snprintf(got_line[n_got], sizeof got_line[n_got], "%s", line);
        got_userdata = userdata;
        n_got++;
    }
    pthread_mutex_unlock(&got_mu);
}

/* Before the log handler existed this warning went to stderr as
 * "wbclient: lease ... still has 1 container(s) ...". */
START_TEST(silent_by_default)
{
    capture_stderr();
    destroy_with_busy_lease();
    char *err = restore_stderr();
    ck_assert_msg(err[0] == '\0', "the library wrote to stderr: %s", err);
}
END_TEST

START_TEST(handler_receives_lines_with_level)
{
    static int tag;
    wb_set_log_handler(collect, &tag);
    capture_stderr();
    destroy_with_busy_lease();
    char *err = restore_stderr();
    ck_assert_msg(err[0] == '\0', "the library wrote to stderr: %s", err);
    ck_assert_int_eq(n_got, 1);
    ck_assert_int_eq(got_level[0], WB_LOG_WARN);
    ck_assert_ptr_eq(got_userdata, &tag);
    const char *line = got_line[0];
    ck_assert_msg(strncmp(line, "ts=", 3) == 0, "%s", line);
    ck_assert_ptr_nonnull(strstr(line, " level=warn prog=wbclient event=client_destroy_busy_lease "
                                       "lease=ab000000 model=demo containers=1 note="));
    ck_assert_ptr_null(strchr(line, '\n'));
    wb_set_log_handler(NULL, NULL);
}
END_TEST

START_TEST(level_threshold_drops_lines)
{
    wb_set_log_handler(collect, NULL);
    wb_set_log_level(WB_LOG_ERROR);
    destroy_with_busy_lease();
    ck_assert_int_eq(n_got, 0);
    wb_set_log_level(WB_LOG_WARN);
    destroy_with_busy_lease();
    ck_assert_int_eq(n_got, 1);
    wb_set_log_level(WB_LOG_OFF);
    destroy_with_busy_lease();
    ck_assert_int_eq(n_got, 1);
    wb_set_log_handler(NULL, NULL);
    wb_set_log_level(WB_LOG_INFO);
}
END_TEST

START_TEST(stderr_handler_writes_one_line)
{
    wb_set_log_handler(wb_log_stderr, NULL);
    capture_stderr();
    destroy_with_busy_lease();
    char *err = restore_stderr();
    wb_set_log_handler(NULL, NULL);
    ck_assert_ptr_nonnull(
        strstr(err, " level=warn prog=wbclient event=client_destroy_busy_lease "));
    size_t n = strlen(err);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(err[n - 1], '\n');
    ck_assert_ptr_eq(strchr(err, '\n'), err + n - 1);
}
END_TEST

/* $WB_CLIENT_LOG asks for stderr without a handler; it is read at the first
 * log line of the process (each Check test runs in a fresh process). */
START_TEST(env_asks_for_stderr)
{
    setenv("WB_CLIENT_LOG", "error", 1);
    capture_stderr();
    destroy_with_busy_lease(); /* a warning: below the asked level */
    char *err = restore_stderr();
    ck_assert_msg(err[0] == '\0', "a warning reached stderr at level error: %s", err);
    wb_set_log_level(WB_LOG_WARN);
    capture_stderr();
    destroy_with_busy_lease();
    err = restore_stderr();
    ck_assert_ptr_nonnull(
        strstr(err, " level=warn prog=wbclient event=client_destroy_busy_lease "));
    unsetenv("WB_CLIENT_LOG");
}
END_TEST

int main(void)
{
    unsetenv("WB_CLIENT_LOG");
    Suite *s = suite_create("client_log");
    TCase *tc = tcase_create("log");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, silent_by_default);
    tcase_add_test(tc, handler_receives_lines_with_level);
    tcase_add_test(tc, level_threshold_drops_lines);
    tcase_add_test(tc, stderr_handler_writes_one_line);
    tcase_add_test(tc, env_asks_for_stderr);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
