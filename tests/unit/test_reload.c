/* SIGHUP's reload on a broker state without sockets: the configuration file
 * is read again with the command line the broker started with (whose flags
 * still win); the limits, access lists and log level that changed are
 * applied and listed exactly; what cannot change live is listed as not
 * applied and left as it was; a file that is now wrong (with its FILE:LINE
 * message) or missing changes nothing; without --config nothing happens. */
#include "broker.h"
#include "log.h"
#include "options.h"
#include "reload.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];
static char argv_config[80];
static wb_options running;
static wb_broker b;

static void write_file(const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* Parses `argv` as wbrokerd's command line and starts a broker state the
 * way wbrokerd does: the options' access lists and limits. */
static void start(int argc, char **argv)
{
    wb__options_init(&running);
    running.quiet = 1;
    ck_assert_int_eq(wb__options_parse(&running, argc, argv), WB_OPTIONS_GO_ON);
    ck_assert_int_eq(wb__options_validate(&running), WB_OPTIONS_GO_ON);
    wb_broker_config cfg = {.backend = &wb__backend_host, .device = -1};
    wb__broker_init(&b, &cfg);
    wb__auth_destroy(&b.auth);
    b.auth = running.auth;
    memset(&running.auth, 0, sizeof running.auth);
    wb__options_limits(&running, &b.limits);
}

/* Started with --config FILE --max-leases-per-client 8 --socket S. */
static void start_with_file(const char *text)
{
    write_file(text);
    static char *argv[7];
    argv[0] = "wbrokerd";
    argv[1] = "--config";
    argv[2] = argv_config;
    argv[3] = "--max-leases-per-client";
    argv[4] = "8";
    argv[5] = "--socket";
    argv[6] = "/tmp/wbreload.sock";
    snprintf(argv_config, sizeof argv_config, "%s", path);
    start(7, argv);
}

static void setup(void)
{
    snprintf(path, sizeof path, "/tmp/wbreload.XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    wb__log_set_level(WB_LOG_INFO);
}

static void teardown(void)
{
    wb__broker_destroy(&b);
    wb__options_free(&running);
    unlink(path);
}

/* Plans a reload of the file as it is now; the message of a failure is in
 * err. */
static int plan(wb_options *next, wb_reload_plan *p, wb_err *err)
{
    int rc = wb__options_reparse(&running, next, err);
    if (rc == WB_OK)
        wb__reload_plan(&running, &b, next, p);
    return rc;
}

START_TEST(test_applied_and_not)
{
    start_with_file("[broker]\n"
                    "max-models = 2\n"
                    "allow-uid = 1000\n");
    ck_assert_uint_eq(b.limits.max_models, 2);
    ck_assert_int_eq(
        wb__auth_client_ok(&b.auth, &(wb_peer_creds){.known = 1, .uid = 2000, .gid = 2000}), 0);
    write_file("[broker]\n"
               "max-models = 3   # one more\n"
               "max-leases-per-client = 99\n"
               "allow-uid = 1000,2000\n"
               "admin-gid = 3000\n"
               "log-level = debug\n"
               "heartbeat-ms = 2000\n"
               "stale-ms = 6000\n"
               "max-message-bytes = 8192\n"
               "max-peers = 10\n"
               "[model m]\n"
               "path = /models/m.safetensors\n");
    wb_options next;
    wb_reload_plan p;
    wb_err err;
    ck_assert_msg(plan(&next, &p, &err) == WB_OK, "%s", err.msg);
    /* The command line's --max-leases-per-client 8 still wins. */
    ck_assert_str_eq(p.applied, "max-models=3 allow-uid=1000,2000 admin-gid=3000 log-level=debug");
    ck_assert_str_eq(p.not_applied,
                     "heartbeat-ms=2000 stale-ms=6000 max-message-bytes=8192 max-peers=10 "
                     "model.m=/models/m.safetensors");
    uint64_t message = b.limits.max_message;
    wb__reload_apply(&b, &next, &p);
    wb__options_free(&next);
    ck_assert_uint_eq(b.limits.max_models, 3);
    ck_assert_uint_eq(b.limits.max_leases_per_client, 8);
    ck_assert_uint_eq(b.limits.max_message, message);
    ck_assert_int_eq(
        wb__auth_client_ok(&b.auth, &(wb_peer_creds){.known = 1, .uid = 2000, .gid = 2000}), 1);
    ck_assert_int_eq(
        wb__auth_admin_ok(&b.auth, &(wb_peer_creds){.known = 1, .uid = 4000, .gid = 3000}), 1);
    ck_assert_int_eq(wb__log_get_level(), WB_LOG_DEBUG);
    /* What waits for a restart is still reported the next time; what was
     * applied is not. */
    ck_assert_int_eq(plan(&next, &p, &err), WB_OK);
    ck_assert_str_eq(p.applied, "");
    ck_assert_str_eq(p.not_applied,
                     "heartbeat-ms=2000 stale-ms=6000 max-message-bytes=8192 max-peers=10 "
                     "model.m=/models/m.safetensors");
    wb__options_free(&next);
}
END_TEST

START_TEST(test_unchanged_and_removed)
{
    start_with_file("[broker]\nmax-models = 2\nallow-gid = 27\n[model m]\npath = /m\n");
    wb_options next;
    wb_reload_plan p;
    wb_err err;
    ck_assert_int_eq(plan(&next, &p, &err), WB_OK);
    ck_assert_str_eq(p.applied, "");
    ck_assert_str_eq(p.not_applied, "");
    wb__options_free(&next);
    /* Keys taken out go back to their defaults; a list emptied is "none". */
    write_file("# nothing left\n[broker]\n");
    ck_assert_int_eq(plan(&next, &p, &err), WB_OK);
    ck_assert_str_eq(p.applied, "max-models=64 allow-gid=none");
    ck_assert_str_eq(p.not_applied, "model.m=removed");
    wb__reload_apply(&b, &next, &p);
    wb__options_free(&next);
    ck_assert_uint_eq(b.limits.max_models, WB_DEFAULT_MAX_MODELS);
    ck_assert_int_eq(
        wb__auth_client_ok(&b.auth, &(wb_peer_creds){.known = 1, .uid = 5000, .gid = 27}), 0);
}
END_TEST

START_TEST(test_wrong_file_changes_nothing)
{
    start_with_file("[broker]\nmax-models = 2\n");
    wb_limits before = b.limits;
    write_file("[broker]\nmax-models = 5\nsokcet = /a\n");
    wb__reload(&running, &b);
    ck_assert_uint_eq(b.limits.max_models, before.max_models);
    wb_options next;
    wb_reload_plan p;
    wb_err err;
    ck_assert_int_eq(plan(&next, &p, &err), WB_EINVAL);
    wb__options_free(&next);
    char want[300];
    snprintf(want, sizeof want, "%s:3: unknown key 'sokcet' in [broker] (did you mean 'socket'?)",
             path);
    ck_assert_str_eq(err.msg, want);
    /* A value the option parser refuses, and the liveness rule, name their
     * line too. */
    write_file("[broker]\nmax-models = none\n");
    ck_assert_int_eq(plan(&next, &p, &err), WB_EINVAL);
    wb__options_free(&next);
    snprintf(want, sizeof want, "%s:2: max-models: 'none' is not a positive number", path);
    ck_assert_str_eq(err.msg, want);
    write_file("[broker]\nmax-models = 5\nstale-ms = 1500\n");
    ck_assert_int_eq(plan(&next, &p, &err), WB_EINVAL);
    wb__options_free(&next);
    snprintf(want, sizeof want,
             "%s:3: stale-ms 1500 is less than 2 times heartbeat-ms 1000 (the default): a "
             "healthy worker's lease would turn stale between its heartbeats (stale-ms must be "
             "at least 2 x heartbeat-ms, 2000 here)",
             path);
    ck_assert_str_eq(err.msg, want);
    wb__reload(&running, &b);
    ck_assert_uint_eq(b.limits.max_models, before.max_models);
    /* The file gone. */
    unlink(path);
    ck_assert_int_eq(plan(&next, &p, &err), WB_EINVAL);
    wb__options_free(&next);
    snprintf(want, sizeof want, "%s: cannot open the configuration file: No such file or directory",
             path);
    ck_assert_str_eq(err.msg, want);
    wb__reload(&running, &b);
    ck_assert_uint_eq(b.limits.max_models, before.max_models);
}
END_TEST

START_TEST(test_reload_applies)
{
    start_with_file("[broker]\nmax-tensors = 10\n");
    write_file("[broker]\nmax-tensors = 20\nmax-shards = 3\nmax-header-bytes = 4096\n"
               "log-level = warn\n");
    wb__reload(&running, &b);
    ck_assert_uint_eq(b.limits.max_tensors, 20);
    ck_assert_uint_eq(b.limits.max_shards, 3);
    ck_assert_uint_eq(b.limits.max_header, 4096);
    ck_assert_int_eq(wb__log_get_level(), WB_LOG_WARN);
}
END_TEST

START_TEST(test_without_config)
{
    static char *argv[] = {"wbrokerd", "--max-models", "4", "--socket", "/tmp/wbreload.sock"};
    start(5, argv);
    wb__reload(&running, &b);
    ck_assert_uint_eq(b.limits.max_models, 4);
    wb_options next;
    wb_reload_plan p;
    wb_err err;
    ck_assert_int_eq(plan(&next, &p, &err), WB_OK);
    ck_assert_str_eq(p.applied, "");
    ck_assert_str_eq(p.not_applied, "");
    wb__options_free(&next);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reload");
    TCase *tc = tcase_create("reload");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_applied_and_not);
    tcase_add_test(tc, test_unchanged_and_removed);
    tcase_add_test(tc, test_wrong_file_changes_nothing);
    tcase_add_test(tc, test_reload_applies);
    tcase_add_test(tc, test_without_config);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
