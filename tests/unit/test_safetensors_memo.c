/* The memo of parsed safetensors headers and shard indexes
 * (common/safetensors_memo.h): a header or an index met again gives the
 * table a parse gives, the checks that depend on the files beyond its bytes
 * run every time, two that meet in one digest are told apart by their
 * bytes (a header's from an index's too), failed parses and opens are not
 * kept, and the limit holds. The real checkpoints of the fixtures are
 * opened twice and compared field by field. */
#include "safetensors.h"
#include "safetensors_memo.h"
#include "safetensors_parse.h"
#include "st_fixture.h"

#include <check.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
        /* Every file: the shards' headers, and the index of a sharded one. */
        ck_assert_uint_eq(b->remembered, b->n_files + (strstr(names[i], "sharded") != NULL));
        st_same_tables(a, b);
        wb__st_table_free(&a);
        wb__st_table_free(&b);
    }
}
END_TEST

/* ---- shard indexes ---------------------------------------------------- */

static char tmpdir[512];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void index_setup(void)
{
    setup();
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/wb-memo-XXXXXX", base && *base ? base : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void index_teardown(void)
{
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    teardown();
}

static const char *at(const char *rel)
{
    static char ring[4][1024];
    static int next;
    char *p = ring[next++ % 4];
    snprintf(p, 1024, "%s/%s", tmpdir, rel);
    return p;
}

static void write_bytes(const char *rel, const void *bytes, size_t len)
{
    FILE *f = fopen(at(rel), "wb");
    ck_assert_msg(f != NULL, "cannot create %s: %s", at(rel), strerror(errno));
    ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

static void write_shard(const char *rel, const char *json, uint64_t data_len)
{
    unsigned char buf[1024];
    write_bytes(rel, buf, st_build(buf, sizeof buf, json, data_len));
}

static const char *SHARD_A = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
static const char *SHARD_B = "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
static const char *INDEX = "{\"metadata\":{\"total_size\":5},"
                           "\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}";

/* d/: two shards and INDEX. */
static void write_checkpoint(const char *d)
{
    char rel[256];
    ck_assert_int_eq(mkdir(at(d), 0755), 0);
    snprintf(rel, sizeof rel, "%s/s1.safetensors", d);
    write_shard(rel, SHARD_A, 2);
    snprintf(rel, sizeof rel, "%s/s2.safetensors", d);
    write_shard(rel, SHARD_B, 3);
    snprintf(rel, sizeof rel, "%s/model.safetensors.index.json", d);
    write_bytes(rel, INDEX, strlen(INDEX));
}

static wb_st_table *open_want(const char *rel, const wb_st_open_opts *o, int want, wb_err *err)
{
    wb_st_table *t = NULL;
    int rc = wb__st_open_ex(at(rel), o, &t, err);
    ck_assert_msg(rc == want, "%s: status %d, want %d: %s", rel, rc, want, rc ? err->msg : "");
    ck_assert_int_eq(t != NULL, want == WB_OK);
    return t;
}

START_TEST(index_remembered)
{
    write_checkpoint("c");
    wb_err err;
    wb_st_memo_stats s0, s1;
    wb__st_memo_stats(&s0);
    wb_st_table *a = open_want("c", NULL, WB_OK, &err);
    ck_assert_uint_eq(a->remembered, 0);
    wb__st_memo_stats(&s1);
    ck_assert_uint_eq(s1.entries, 3); /* the index and two headers */
    ck_assert_uint_eq(s1.misses, s0.misses + 3);
    wb_st_table *b = open_want("c", NULL, WB_OK, &err);
    ck_assert_uint_eq(b->remembered, 3);
    st_same_tables(a, b);
    ck_assert_str_eq(b->meta[0].key, "total_size");
    ck_assert_str_eq(b->meta[0].value, "5");
    wb__st_table_free(&a);
    wb__st_table_free(&b);
    /* The files alone (wb__st_check_files) keep nothing and need nothing. */
    ck_assert_int_eq(wb__st_check_files(at("c"), NULL, &err), WB_OK);
    wb__st_memo_stats(&s0);
    ck_assert_uint_eq(s0.entries, 3);
}
END_TEST

static uint64_t counted_entries;

static int refuse_two(void *arg, const char *path, uint64_t tensors, wb_err *err)
{
    (void)arg;
    counted_entries = tensors;
    if (tensors >= 2)
        return wb__err_set(err, WB_ELIMIT, "%s: %llu tensors, over the test's limit of 1", path,
                           (unsigned long long)tensors);
    return WB_OK;
}

/* On a hit the shards are opened and checked against the map as ever, and
 * the caller's limit on the count is asked again. */
START_TEST(index_checks_run_on_a_hit)
{
    write_checkpoint("c");
    wb_err err;
    wb_st_table *t = open_want("c", NULL, WB_OK, &err);
    wb__st_table_free(&t);
    /* A shard gone. */
    ck_assert_int_eq(rename(at("c/s2.safetensors"), at("c/gone")), 0);
    open_want("c", NULL, WB_ENOTFOUND, &err);
    ck_assert_msg(strstr(err.msg, "shard 's2.safetensors' (holding tensor 'b') is missing"), "%s",
                  err.msg);
    /* Back, but holding another tensor than the map says. */
    write_shard("c/s2.safetensors",
                "{\"z\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3);
    open_want("c", NULL, WB_EFORMAT, &err);
    ck_assert_msg(strstr(err.msg, "tensor 'z' in shard s2.safetensors is not listed"), "%s",
                  err.msg);
    write_shard("c/s2.safetensors", SHARD_B, 3);
    t = open_want("c", NULL, WB_OK, &err);
    ck_assert_uint_eq(t->remembered, 3);
    wb__st_table_free(&t);
    /* The limit on tensors, asked with the entries counted before. */
    wb_st_open_opts o = {.check_count = refuse_two};
    counted_entries = 0;
    open_want("c", &o, WB_ELIMIT, &err);
    ck_assert_uint_eq(counted_entries, 2);
    ck_assert_ptr_nonnull(strstr(err.msg, "over the test's limit"));
}
END_TEST

/* Indexes of one length meeting in one digest get their own trees; a
 * header's bytes kept never answer for an index of the same bytes, nor the
 * other way round. */
START_TEST(index_equal_digests)
{
    wb__st_memo_test_fixed_digest(7);
    write_checkpoint("x");
    write_checkpoint("y");
    const char *other = "{\"metadata\":{\"total_size\":6},"
                        "\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}";
    ck_assert_uint_eq(strlen(other), strlen(INDEX));
    write_bytes("y/model.safetensors.index.json", other, strlen(other));
    wb_err err;
    wb_st_table *x = open_want("x", NULL, WB_OK, &err), *y = open_want("y", NULL, WB_OK, &err);
    /* y's shards are x's bytes; its index is not. */
    ck_assert_uint_eq(y->remembered, 2);
    ck_assert_str_eq(x->meta[0].value, "5");
    ck_assert_str_eq(y->meta[0].value, "6");
    wb__st_table_free(&x);
    wb__st_table_free(&y);
    y = open_want("y", NULL, WB_OK, &err);
    ck_assert_uint_eq(y->remembered, 3);
    ck_assert_str_eq(y->meta[0].value, "6");
    wb__st_table_free(&y);

    /* A header, kept; an index of the same bytes is read as an index. */
    const char *both = "{\"weight_map\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    unsigned char buf[512];
    size_t len = st_build(buf, sizeof buf, both, 2);
    wb_st_table *h = parse(buf, len, len, WB_OK, &err);
    ck_assert_str_eq(h->tensors[0].name, "weight_map");
    wb__st_table_free(&h);
    ck_assert_int_eq(mkdir(at("z"), 0755), 0);
    write_bytes("z/model.safetensors.index.json", both, strlen(both));
    open_want("z", NULL, WB_EFORMAT, &err);
    ck_assert_msg(strstr(err.msg, "weight_map entry of tensor 'dtype' is a string") == NULL &&
                      strstr(err.msg, "weight_map") != NULL,
                  "%s", err.msg);
    /* An index, kept (x's); a header of its bytes is parsed as a header. */
    len = st_build(buf, sizeof buf, INDEX, 0);
    h = parse(buf, len, len, WB_EFORMAT, &err);
    ck_assert_ptr_nonnull(strstr(err.msg, "A: "));
    wb__st_table_free(&h);
}
END_TEST

/* An index whose open failed is not kept; nor one whose tree would not fit
 * the limit. */
START_TEST(index_failures_and_the_limit)
{
    write_checkpoint("c");
    ck_assert_int_eq(unlink(at("c/s2.safetensors")), 0);
    wb_err err;
    open_want("c", NULL, WB_ENOTFOUND, &err);
    wb_st_memo_stats s;
    wb__st_memo_stats(&s);
    ck_assert_uint_eq(s.entries, 1); /* s1's header only */
    write_shard("c/s2.safetensors", SHARD_B, 3);
    wb__st_memo_set_limit(0);
    wb__st_memo_set_limit(1000); /* under the index's 7 values of 170 bytes */
    wb_st_table *t = open_want("c", NULL, WB_OK, &err);
    wb__st_table_free(&t);
    t = open_want("c", NULL, WB_OK, &err);
    ck_assert_uint_eq(t->remembered, 2); /* the shards only */
    wb__st_table_free(&t);
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
    tc = tcase_create("index");
    tcase_add_checked_fixture(tc, index_setup, index_teardown);
    tcase_add_test(tc, index_remembered);
    tcase_add_test(tc, index_checks_run_on_a_hit);
    tcase_add_test(tc, index_equal_digests);
    tcase_add_test(tc, index_failures_and_the_limit);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
