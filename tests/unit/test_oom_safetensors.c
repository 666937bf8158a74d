/* Out of memory in the safetensors reader (oom.h): the official fixtures
 * (a file of every dtype, GPT-2 in one file, GPT-2 in eight shards by
 * directory and by index, the in-memory parser, the file checks alone),
 * read with each allocation failing in turn (jansson's too), fail with
 * WB_ENOMEM and no table, or give the whole table; with the memo of parsed
 * headers on, both when it has the headers (their copies fail) and when it
 * is to keep them (a copy it cannot make is not kept, and said nowhere). */
#include "alloc.h"
#include "oom.h"
#include "safetensors.h"
#include "safetensors_memo.h"
#include "st_fixture.h"

#include <check.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_case {
    char path[1200];
    wb_st_open_opts opts;
    int use_opts;
    int files_only; /* wb__st_check_files */
    wb_st_table *want, *got;
    /* The in-memory parser: a file's bytes. */
    uint8_t *bytes;
    size_t len;
    wb_err err;
    int checked; /* files the checks were asked about in the last run */
    int memo;    /* 0: off; 1: on and empty before each run; 2: holding the headers */
} st_case;

static oom_result total;

static void fixture_path(char *out, size_t n, const char *rel)
{
    const char *data = getenv("WB_TEST_DATA");
    ck_assert_msg(data != NULL, "WB_TEST_DATA is not set");
    snprintf(out, n, "%s/official/%s", data, rel);
}

static int check_file(void *arg, int fd, const char *path, wb_err *err)
{
    (void)fd;
    (void)path;
    (void)err;
    ((st_case *)arg)->checked++;
    return 0;
}

static int check_count(void *arg, const char *path, uint64_t tensors, wb_err *err)
{
    (void)arg;
    (void)path;
    (void)err;
    ck_assert_uint_gt(tensors, 0);
    return 0;
}

static int run_open(void *arg)
{
    st_case *c = arg;
    c->checked = 0;
    if (c->files_only)
        return wb__st_check_files(c->path, &c->opts, &c->err);
    if (c->bytes) {
        c->got = calloc(1, sizeof *c->got);
        if (!c->got)
            return WB_ENOMEM;
        return wb__st_parse_header(c->got, 0, "in memory", c->bytes, c->len, c->len, &c->err);
    }
    return wb__st_open_ex(c->path, c->use_opts ? &c->opts : NULL, &c->got, &c->err);
}

static void failed_open(void *arg, int rc)
{
    st_case *c = arg;
    ck_assert_msg(rc == WB_ENOMEM, "%s: status %d: %s", c->path, rc, c->err.msg);
    if (c->bytes && c->got) {
        /* The parser leaves the table it was given as it was. */
        ck_assert_uint_eq(c->got->n_files, 0);
        ck_assert_uint_eq(c->got->n_tensors, 0);
        ck_assert_uint_eq(c->got->n_meta, 0);
        ck_assert_uint_eq(c->got->total_bytes, 0);
        wb__st_table_free(&c->got);
    }
    ck_assert_ptr_null(c->got);
}

static void done_open(void *arg)
{
    st_case *c = arg;
    if (c->files_only)
        return;
    ck_assert_ptr_nonnull(c->got);
    st_same_tables(c->want, c->got);
    /* Every file's header, and a sharded checkpoint's index. */
    if (c->memo == 2)
        ck_assert_uint_eq(c->got->remembered,
                          c->got->n_files + (strstr(c->path, "sharded") != NULL));
    wb__st_table_free(&c->got);
}

static void memo_setup(void *arg)
{
    st_case *c = arg;
    wb__st_memo_set_limit(0);
    if (!c->memo)
        return;
    wb__st_memo_set_limit(1u << 20);
    if (c->memo == 2) {
        wb_st_table *t = NULL;
        wb_err err;
        ck_assert_int_eq(wb__st_open(c->path, &t, &err), WB_OK);
        ck_assert_uint_eq(t->remembered, 0);
        wb__st_table_free(&t);
    }
}

static void memo_teardown(void *arg)
{
    (void)arg;
    wb__st_memo_set_limit(0);
}

static void oom_open(const char *name, st_case *c)
{
    /* The table as read with every allocation made. */
    if (!c->files_only) {
        int rc = run_open(c);
        ck_assert_msg(rc == WB_OK, "%s: %s", c->path, c->err.msg);
        c->want = c->got;
        c->got = NULL;
    }
    oom_op op = {.name = name,
                 .ctx = c,
                 .setup = memo_setup,
                 .run = run_open,
                 .failed = failed_open,
                 .done = done_open,
                 .teardown = memo_teardown};
    oom_result res = oom_run(&op);
    oom_total(&total, &res);
    wb__st_table_free(&c->want);
}

static void setup(void)
{
    wb__alloc_use_for_jansson();
}

START_TEST(test_official)
{
    static const char *const files[] = {"all_dtypes.safetensors", "gpt2/model.safetensors", "gpt2",
                                        "gpt2_sharded",
                                        "gpt2_sharded/model.safetensors.index.json"};
    total = (oom_result){0};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        st_case c = {0};
        fixture_path(c.path, sizeof c.path, files[i]);
        char name[128];
        snprintf(name, sizeof name, "open %s", files[i]);
        oom_open(name, &c);
    }
    printf("oom safetensors open: %ld allocation points at %ld sites\n", total.points, total.sites);
}
END_TEST

/* The broker's way: every shard checked first, then read. */
START_TEST(test_checked_open)
{
    total = (oom_result){0};
    st_case c = {0};
    fixture_path(c.path, sizeof c.path, "gpt2_sharded");
    c.use_opts = 1;
    c.opts = (wb_st_open_opts){
        .check_file = check_file, .check_count = check_count, .arg = &c, .precheck = 1};
    oom_open("open gpt2_sharded with checks", &c);
    st_case f = {0};
    fixture_path(f.path, sizeof f.path, "gpt2_sharded/model.safetensors.index.json");
    f.files_only = 1;
    f.opts = (wb_st_open_opts){.check_file = check_file, .check_count = check_count, .arg = &f};
    oom_open("check files gpt2_sharded", &f);
    printf("oom safetensors checked: %ld allocation points at %ld sites\n", total.points,
           total.sites);
}
END_TEST

/* The memo of parsed headers: GPT-2 in shards, each header kept (the copies
 * kept may fail), then each taken from it (the copies handed out may fail). */
START_TEST(test_memo)
{
    total = (oom_result){0};
    for (int memo = 1; memo <= 2; memo++) {
        st_case c = {.memo = memo};
        fixture_path(c.path, sizeof c.path, "gpt2_sharded");
        oom_open(memo == 1 ? "open gpt2_sharded, keeping the headers"
                           : "open gpt2_sharded, the headers kept",
                 &c);
    }
    printf("oom safetensors memo: %ld allocation points at %ld sites\n", total.points, total.sites);
}
END_TEST

/* The parser alone, on the bytes of GPT-2's file. */
START_TEST(test_parse_in_memory)
{
    total = (oom_result){0};
    st_case c = {0};
    fixture_path(c.path, sizeof c.path, "gpt2/model.safetensors");
    int fd = open(c.path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    c.len = (size_t)sb.st_size;
    c.bytes = malloc(c.len);
    ck_assert_int_eq(pread(fd, c.bytes, c.len, 0), (ssize_t)c.len);
    close(fd);
    oom_open("parse gpt2 in memory", &c);
    free(c.bytes);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("oom_safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_official);
    tcase_add_test(tc, test_checked_open);
    tcase_add_test(tc, test_parse_in_memory);
    tcase_add_test(tc, test_memo);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
