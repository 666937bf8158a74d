/* The memo of parsed safetensors headers (common/safetensors_memo.h): a
 * header met again gives the table a parse gives, the checks that depend
 * on the file beyond its header run every time, two headers that meet in
 * one digest are told apart by their bytes, failed parses are not kept, and
 * the limit holds. The real checkpoints of the fixtures are opened twice
 * and compared field by field. */
#include "safetensors.h"
#include "safetensors_memo.h"
#include "safetensors_parse.h"
#include "st_fixture.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wb_st_table *parse(const unsigned char *buf, size_t len, uint64_t file_size, int want,
                          wb_err *err)
{
    wb_st_table *t = calloc(1, sizeof *t);
    ck_assert_ptr_nonnull(t);
    int rc = wb__st_parse_header(t, 0, "A", buf, len, file_size, err);
    ck_assert_msg(rc == want, "status %d, want %d: %s", rc, want, rc ? err->msg : "");
    return t;
}

static void setup(void)
{
    wb__st_memo_set_limit(0);
    wb__st_memo_test_fixed_digest(0);
    wb__st_memo_set_limit(1u << 20);
}

static void teardown(void)
{
    wb__st_memo_set_limit(0);
    wb__st_memo_test_fixed_digest(0);
}

static const char *TWO = "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                         "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[12,16]},"
                         "\"__metadata__\":{\"format\":\"pt\"}}";

START_TEST(second_parse_is_remembered)
{
    unsigned char buf[512];
    wb_err err;
    size_t len = st_build(buf, sizeof buf, TWO, 16);
    wb_st_memo_stats s0, s1, s2;
    wb__st_memo_stats(&s0);
    wb_st_table *a = parse(buf, len, len, WB_OK, &err);
    wb__st_memo_stats(&s1);
    ck_assert_uint_eq(a->remembered, 0);
    ck_assert_uint_eq(s1.misses, s0.misses + 1);
    ck_assert_uint_eq(s1.entries, 1);
    wb_st_table *b = parse(buf, len, len, WB_OK, &err);
    wb__st_memo_stats(&s2);
    ck_assert_uint_eq(b->remembered, 1);
    ck_assert_uint_eq(s2.hits, s1.hits + 1);
    ck_assert_uint_eq(s2.entries, 1);
    st_same_tables(a, b);
    wb__st_table_free(&a);
    wb__st_table_free(&b);

    /* Off: neither kept nor looked up. */
    wb__st_memo_set_limit(0);
    wb__st_memo_stats(&s1);
    ck_assert_uint_eq(s1.entries, 0);
    ck_assert_uint_eq(s1.bytes, 0);
    a = parse(buf, len, len, WB_OK, &err);
    wb__st_memo_stats(&s2);
    ck_assert_uint_eq(a->remembered, 0);
    ck_assert_uint_eq(s2.hits, s1.hits);
    ck_assert_uint_eq(s2.entries, 0);
    wb__st_table_free(&a);
}
END_TEST

/* What depends on the file and not on the header is checked on a hit too:
 * the data section's size, and names already in the table (shards). */
START_TEST(file_checks_run_on_a_hit)
{
    unsigned char buf[512];
    wb_err err;
    size_t len = st_build(buf, sizeof buf, TWO, 16);
    wb_st_table *a = parse(buf, len, len, WB_OK, &err);
    wb__st_table_free(&a);
    /* The same header in a file 4 bytes short. */
    a = parse(buf, len - 4, len - 4, WB_EFORMAT, &err);
    ck_assert_msg(strstr(err.msg, "A: tensor 'b' ends past the end of the file") != NULL, "%s",
                  err.msg);
    ck_assert_uint_eq(a->n_tensors, 0);
    wb__st_table_free(&a);
    /* And 4 bytes long. */
    unsigned char big[512];
    size_t blen = st_build(big, sizeof big, TWO, 20);
    a = parse(big, blen, blen, WB_EFORMAT, &err);
    ck_assert_msg(strstr(err.msg, "trailing") != NULL || strstr(err.msg, "after") != NULL, "%s",
                  err.msg);
    wb__st_table_free(&a);
    /* The same header as a second shard of one table: its names are taken. */
    a = parse(buf, len, len, WB_OK, &err);
    ck_assert_uint_eq(a->remembered, 1);
    ck_assert_int_eq(wb__st_parse_header(a, 1, "B", buf, len, len, &err), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "is also in A"));
    ck_assert_uint_eq(a->n_files, 1);
    ck_assert_uint_eq(a->n_tensors, 2);
    ck_assert_uint_eq(a->remembered, 1);
    wb__st_table_free(&a);
}
END_TEST

/* Two headers of one length whose digests are made equal: the bytes tell
 * them apart, each gets its own table. */
START_TEST(equal_digests_unequal_bytes)
{
    wb__st_memo_test_fixed_digest(42);
    unsigned char x[512], y[512];
    wb_err err;
    const char *jx = "{\"aa\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    const char *jy = "{\"ab\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    ck_assert_uint_eq(strlen(jx), strlen(jy));
    size_t lx = st_build(x, sizeof x, jx, 4), ly = st_build(y, sizeof y, jy, 4);
    wb_st_table *a = parse(x, lx, lx, WB_OK, &err);
    wb_st_table *b = parse(y, ly, ly, WB_OK, &err);
    ck_assert_uint_eq(b->remembered, 0);
    ck_assert_str_eq(b->tensors[0].name, "ab");
    ck_assert_int_eq(b->tensors[0].dtype, WB_DTYPE_I8);
    wb_st_memo_stats s;
    wb__st_memo_stats(&s);
    ck_assert_uint_eq(s.entries, 2);
    /* Each is found again as itself. */
    wb_st_table *a2 = parse(x, lx, lx, WB_OK, &err), *b2 = parse(y, ly, ly, WB_OK, &err);
    ck_assert_uint_eq(a2->remembered, 1);
    ck_assert_uint_eq(b2->remembered, 1);
    st_same_tables(a, a2);
    st_same_tables(b, b2);
    wb__st_table_free(&a);
    wb__st_table_free(&b);
    wb__st_table_free(&a2);
    wb__st_table_free(&b2);
}
END_TEST

/* A header that fails to parse is not kept; nor is one bigger than the
 * limit; the least recently used go first. */
START_TEST(failures_and_the_limit)
{
    unsigned char buf[4096];
    wb_err err;
    size_t len = st_build(buf, sizeof buf,
                          "{\"q\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2);
    wb_st_table *t = parse(buf, len, len, WB_EFORMAT, &err);
    ck_assert_ptr_nonnull(strstr(err.msg, "A: tensor 'q'"));
    wb_st_memo_stats s;
    wb__st_memo_stats(&s);
    ck_assert_uint_eq(s.entries, 0);
    wb__st_table_free(&t);
    /* The same error on the second try: it was parsed again. */
    t = parse(buf, len, len, WB_EFORMAT, &err);
    ck_assert_ptr_nonnull(strstr(err.msg, "A: tensor 'q'"));
    wb__st_table_free(&t);

    /* Room for about two entries of this size. */
    unsigned char h[3][512];
    size_t hl[3];
    char json[256];
    for (int i = 0; i < 3; i++) {
        snprintf(json, sizeof json,
                 "{\"tensor_%d\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", i);
        hl[i] = st_build(h[i], sizeof h[i], json, 4);
        t = parse(h[i], hl[i], hl[i], WB_OK, &err);
        wb__st_table_free(&t);
    }
    wb__st_memo_stats(&s);
    size_t one = s.bytes / s.entries;
    ck_assert_uint_eq(s.entries, 3);
    wb__st_memo_set_limit(2 * one + one / 2);
    wb__st_memo_stats(&s);
    ck_assert_uint_eq(s.entries, 2);
    ck_assert_uint_le(s.bytes, 2 * one + one / 2);
    /* The first was the least recently used: gone; the third stays. */
    t = parse(h[2], hl[2], hl[2], WB_OK, &err);
    ck_assert_uint_eq(t->remembered, 1);
    wb__st_table_free(&t);
    t = parse(h[0], hl[0], hl[0], WB_OK, &err);
    ck_assert_uint_eq(t->remembered, 0);
    wb__st_table_free(&t);
    /* Keeping h[0] again made room by dropping h[1], the least recent now. */
    wb__st_memo_stats(&s);
    ck_assert_uint_eq(s.entries, 2);
    t = parse(h[1], hl[1], hl[1], WB_OK, &err);
    ck_assert_uint_eq(t->remembered, 0);
    wb__st_table_free(&t);
    /* A limit below one entry keeps nothing. */
    wb__st_memo_set_limit(16);
    t = parse(h[1], hl[1], hl[1], WB_OK, &err);
    wb__st_table_free(&t);
    wb__st_memo_stats(&s);
    ck_assert_uint_eq(s.entries, 0);
}
END_TEST

/* The fixtures' real checkpoints (single files and shards), opened twice:
 * the second open takes every header from the memo and gives the same
 * table. */
START_TEST(fixtures_open_twice)
{
    const char *names[] = {"gpt2/model.safetensors", "gpt2_sharded", "all_dtypes.safetensors"};
    const char *data = getenv("WB_TEST_DATA");
    ck_assert_ptr_nonnull(data);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/official/%s", data, names[i]);
        wb_st_table *a = NULL, *b = NULL;
        wb_err err;
        ck_assert_msg(wb__st_open(path, &a, &err) == WB_OK, "%s: %s", path, err.msg);
        ck_assert_msg(wb__st_open(path, &b, &err) == WB_OK, "%s: %s", path, err.msg);
        ck_assert_uint_gt(a->n_tensors, 0);
        ck_assert_uint_eq(b->remembered, b->n_files);
        st_same_tables(a, b);
        wb__st_table_free(&a);
        wb__st_table_free(&b);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors_memo");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, second_parse_is_remembered);
    tcase_add_test(tc, file_checks_run_on_a_hit);
    tcase_add_test(tc, equal_digests_unequal_bytes);
    tcase_add_test(tc, failures_and_the_limit);
    tcase_add_test(tc, fixtures_open_twice);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
