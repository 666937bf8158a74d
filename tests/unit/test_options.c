/* wbrokerd's options: mistakes are worded here, never by getopt_long with
 * the program's path (unknown, ambiguous, missing or unwanted values), with
 * exit status 2 on the command line and 78 with FILE:LINE in the file;
 * stale-ms must be at least twice heartbeat-ms, the message naming both
 * values and where each comes from; --check-config opens every model's
 * path and names each model it cannot read. */
#include "options.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static wb_options o;
static char dir[64];
static char conf[96];

static void setup(void)
{
    wb__options_init(&o);
    o.quiet = 1;
    snprintf(dir, sizeof dir, "/tmp/wboptions.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(conf, sizeof conf, "%s/wb.conf", dir);
}

/* The strings of the command lines parsed: the options point into them. */
static char *owned[64];
static size_t n_owned;

static void teardown(void)
{
    wb__options_free(&o);
    while (n_owned)
        free(owned[--n_owned]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Parses and validates a command line (copied: getopt_long permutes it and
 * --model values are cut in place). */
static int run_args(int argc, const char *const *args)
{
    char *argv[16];
    ck_assert_int_lt(argc, 16);
    for (int i = 0; i < argc; i++) {
        ck_assert_uint_lt(n_owned, 64);
        argv[i] = owned[n_owned++] = strdup(args[i]);
    }
    int rc = wb__options_parse(&o, argc, argv);
    if (rc == WB_OPTIONS_GO_ON)
        rc = wb__options_validate(&o);
    return rc;
}

#define RUN(...)                                                                                   \
    run_args((int)(sizeof((const char *[]){"wbrokerd", __VA_ARGS__}) / sizeof(const char *)),      \
             (const char *[]){"wbrokerd", __VA_ARGS__})

static void write_conf(const char *text)
{
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_bad_options)
{
    ck_assert_int_eq(RUN("--socket", "/tmp/a.sock", "--bogus"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "unknown option '--bogus'");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--bogus=3"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "unknown option '--bogus'");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("-x"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "unknown option '-x'");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--socket"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "option '--socket' needs a value");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--check-config=yes"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "option '--check-config' takes no value");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--max-queued"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "option '--max-queued' is ambiguous: it could be "
                            "--max-queued-replies, --max-queued-bytes, --max-queued-bytes-total");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    /* A unique prefix is the option. */
    ck_assert_int_eq(RUN("--sock", "/tmp/a.sock", "--max-models", "3"), WB_OPTIONS_GO_ON);
    ck_assert_str_eq(o.socket, "/tmp/a.sock");
}
END_TEST

/* --staging-demote: off or on, from the command line or the file; anything
 * else refused with the value quoted (and FILE:LINE in the file). */
START_TEST(test_staging_demote)
{
    ck_assert_int_eq(RUN("--socket", "/tmp/a.sock"), WB_OPTIONS_GO_ON);
    ck_assert_int_eq(o.staging_demote, 0);
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--staging-demote", "on"), WB_OPTIONS_GO_ON);
    ck_assert_int_eq(o.staging_demote, WB_STAGE_DEMOTE_ON);
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--staging-demote", "sideways"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "--staging-demote: 'sideways' is not one of off, on");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    write_conf("[broker]\nstaging-demote = off\n");
    ck_assert_int_eq(RUN("--config", conf), WB_OPTIONS_GO_ON);
    ck_assert_int_eq(o.staging_demote, WB_STAGE_DEMOTE_OFF);
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    write_conf("[broker]\n\nstaging-demote = 1\n");
    ck_assert_int_eq(RUN("--config", conf), WB_EXIT_CONFIG);
    ck_assert_ptr_nonnull(strstr(o.why, ":3: "));
    ck_assert_ptr_nonnull(strstr(o.why, "'1' is not one of off, on"));
}
END_TEST

/* The slab pool and the publish streams: their ranges, worded. */
START_TEST(test_pool_and_streams)
{
    ck_assert_int_eq(RUN("--slab-pool-seconds", "12", "--publish-streams", "2"), WB_OPTIONS_GO_ON);
    ck_assert_int_eq(o.num[WB_NUM_SLAB_POOL_SECONDS], 12);
    ck_assert_int_eq(o.num[WB_NUM_PUBLISH_STREAMS], 2);
    ck_assert_int_eq(o.no_slab_pool, 0);
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--no-slab-pool"), WB_OPTIONS_GO_ON);
    ck_assert_int_eq(o.no_slab_pool, 1);
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--publish-streams", "9"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "--publish-streams: '9' is not a number of streams from 1 to 8");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--slab-pool-seconds", "3601"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why,
                     "--slab-pool-seconds: '3601' is not a number of seconds from 1 to 3600");
}
END_TEST

START_TEST(test_liveness)
{
    ck_assert_int_eq(RUN("--socket", "/tmp/a.sock", "--stale-ms", "500", "--heartbeat-ms", "1000"),
                     WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "--stale-ms 500 is less than 2 times --heartbeat-ms 1000: a healthy "
                            "worker's lease would turn stale between its heartbeats (stale-ms "
                            "must be at least 2 x heartbeat-ms, 2000 here)");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    /* Exactly twice is enough; the default heartbeat counts. */
    ck_assert_int_eq(RUN("--socket", "/tmp/a.sock", "--stale-ms", "2000"), WB_OPTIONS_GO_ON);
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    ck_assert_int_eq(RUN("--socket", "/tmp/a.sock", "--heartbeat-ms", "3000"), WB_EXIT_USAGE);
    ck_assert_str_eq(o.why, "stale-ms 5000 (the default) is less than 2 times --heartbeat-ms "
                            "3000: a healthy worker's lease would turn stale between its "
                            "heartbeats (stale-ms must be at least 2 x heartbeat-ms, 6000 here)");
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    /* From the file: its line, and 78. */
    write_conf("[broker]\nheartbeat-ms = 1000\n\nstale-ms = 1999\n");
    ck_assert_int_eq(RUN("--config", conf, "--socket", "/tmp/a.sock"), WB_EXIT_CONFIG);
    char want[600];
    snprintf(want, sizeof want,
             "%s:4: stale-ms 1999 is less than 2 times heartbeat-ms 1000 (line 2): a healthy "
             "worker's lease would turn stale between its heartbeats (stale-ms must be at least "
             "2 x heartbeat-ms, 2000 here)",
             conf);
    ck_assert_str_eq(o.why, want);
}
END_TEST

START_TEST(test_check_models)
{
    char file[128], shard_dir[128], cmd[400];
    snprintf(file, sizeof file, "%s/one.safetensors", dir);
    snprintf(shard_dir, sizeof shard_dir, "%s/empty", dir);
    snprintf(cmd, sizeof cmd, "printf x > '%s' && mkdir '%s'", file, shard_dir);
    ck_assert_int_eq(system(cmd), 0);
    char text[1024];
    snprintf(text, sizeof text,
             "[broker]\n"
             "socket = /tmp/a.sock\n"
             "[model good]\n"
             "path = %s\n"
             "[model missing]\n"
             "devices = 0\n"
             "path = %s/absent.safetensors\n"
             "[model empty]\n"
             "path = %s  # a directory without a checkpoint\n",
             file, dir, shard_dir);
    write_conf(text);
    ck_assert_int_eq(RUN("--config", conf, "--check-config"), WB_EXIT_CONFIG);
    /* Each model at fault is reported; the last one is kept. */
    char want[600];
    snprintf(want, sizeof want,
             "%s:9: model 'empty': %s: directory holds neither "
             "model.safetensors.index.json nor model.safetensors",
             conf, shard_dir);
    ck_assert_str_eq(o.why, want);
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    char arg[200];
    snprintf(arg, sizeof arg, "missing=%s/absent.safetensors", dir);
    ck_assert_int_eq(RUN("--socket", "/tmp/a.sock", "--model", arg, "--check-config"),
                     WB_EXIT_USAGE);
    snprintf(want, sizeof want, "--model missing: no such file: %s/absent.safetensors", dir);
    ck_assert_str_eq(o.why, want);
    wb__options_free(&o);
    wb__options_init(&o);
    o.quiet = 1;
    /* Without --check-config the paths are the preloads' to judge. */
    ck_assert_int_eq(RUN("--socket", "/tmp/a.sock", "--model", arg), WB_OPTIONS_GO_ON);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_bad_options);
    tcase_add_test(tc, test_staging_demote);
    tcase_add_test(tc, test_pool_and_streams);
    tcase_add_test(tc, test_liveness);
    tcase_add_test(tc, test_check_models);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
