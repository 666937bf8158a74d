/* The source cache of publishes (publish_srcs.c) with fake handles: a
 * commit's handles stay open for the same connection's next commit, the
 * ones it does not name again close after it, a failed commit closes them
 * all, another connection's commit closes the first one's, the end of the
 * connection closes its own (and not another's), a failed open leaves
 * nothing behind, and the caller's state kept with the cache is freed with
 * it. */
#include "publish_srcs.h"

#include <check.h>

#include <stdlib.h>
#include <string.h>

typedef struct fake {
    int opens, closes, fail_next;
    int open_now;
} fake;

static int fake_open(void *ctx, const uint8_t *handle, int device, unsigned index, void **ptr,
                     wb_err *err)
{
    fake *f = ctx;
    if (f->fail_next) {
        f->fail_next = 0;
        return wb__err_set(err, WB_EIO, "opening source %u: refused", index);
    }
    f->opens++;
    f->open_now++;
    *ptr = (void *)(uintptr_t)(0x1000u * (unsigned)handle[0] + (unsigned)device);
    return WB_OK;
}

static void fake_close(void *ctx, void *ptr, int device)
{
    (void)ptr;
    (void)device;
    fake *f = ctx;
    f->closes++;
    f->open_now--;
}

static void handle(uint8_t h[WB_SRC_HANDLE_LEN], uint8_t id)
{
    memset(h, 0, WB_SRC_HANDLE_LEN);
    h[0] = id;
    h[WB_SRC_HANDLE_LEN - 1] = (uint8_t)~id;
}

/* One commit of `owner` naming handles ids[0..n); returns the opens. */
static int commit(wb_src_cache *c, fake *f, uint64_t owner, const uint8_t *ids, size_t n, int fail)
{
    int before = f->opens;
    wb__src_cache_begin(c, owner);
    for (size_t i = 0; i < n; i++) {
        uint8_t h[WB_SRC_HANDLE_LEN];
        handle(h, ids[i]);
        void *p = NULL;
        wb_err e;
        ck_assert_int_eq(wb__src_cache_open(c, h, 0, (unsigned)i, &p, &e), WB_OK);
        ck_assert_ptr_eq(p, (void *)(uintptr_t)(0x1000u * ids[i]));
    }
    wb__src_cache_end(c, fail);
    return f->opens - before;
}

START_TEST(test_kept_between_commits)
{
    fake f = {0};
    wb_src_ops ops = {.open = fake_open, .close = fake_close, .ctx = &f};
    wb_src_cache *c = wb__src_cache_new(&ops);
    ck_assert_ptr_nonnull(c);
    const uint8_t a[] = {1, 2, 3, 3}; /* 3 twice: one open */
    ck_assert_int_eq(commit(c, &f, 7, a, 4, 0), 3);
    ck_assert_int_eq(commit(c, &f, 7, a, 4, 0), 0);
    uint64_t opened, found;
    size_t open;
    wb__src_cache_counts(c, &opened, &found, &open);
    ck_assert_uint_eq(opened, 3);
    ck_assert_uint_eq(found, 5);
    ck_assert_uint_eq(open, 3);
    /* 1 is not named again: closed after the commit; 4 opened. */
    const uint8_t b[] = {2, 3, 4};
    ck_assert_int_eq(commit(c, &f, 7, b, 3, 0), 1);
    ck_assert_int_eq(f.closes, 1);
    ck_assert_int_eq(f.open_now, 3);
    /* A failed commit closes what it had, named or not. */
    ck_assert_int_eq(commit(c, &f, 7, b, 3, 1), 0);
    ck_assert_int_eq(f.open_now, 0);
    ck_assert_int_eq(commit(c, &f, 7, b, 3, 0), 3);
    wb__src_cache_free(&c);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(f.open_now, 0);
}
END_TEST

START_TEST(test_owners)
{
    fake f = {0};
    wb_src_ops ops = {.open = fake_open, .close = fake_close, .ctx = &f};
    wb_src_cache *c = wb__src_cache_new(&ops);
    const uint8_t a[] = {1, 2};
    commit(c, &f, 7, a, 2, 0);
    /* Another connection's end leaves them; another's commit closes them. */
    ck_assert_uint_eq(wb__src_cache_forget(c, 8), 0);
    ck_assert_int_eq(f.open_now, 2);
    ck_assert_int_eq(commit(c, &f, 8, a, 2, 0), 2);
    ck_assert_int_eq(f.closes, 2);
    ck_assert_int_eq(f.open_now, 2);
    /* Its own end closes them. */
    ck_assert_uint_eq(wb__src_cache_forget(c, 8), 2);
    ck_assert_int_eq(f.open_now, 0);
    ck_assert_uint_eq(wb__src_cache_forget(c, 8), 0);
    wb__src_cache_free(&c);
    ck_assert_int_eq(f.opens, f.closes);
}
END_TEST

START_TEST(test_failed_open)
{
    fake f = {0};
    wb_src_ops ops = {.open = fake_open, .close = fake_close, .ctx = &f};
    wb_src_cache *c = wb__src_cache_new(&ops);
    wb__src_cache_begin(c, 1);
    uint8_t h[WB_SRC_HANDLE_LEN];
    handle(h, 9);
    f.fail_next = 1;
    void *p = (void *)1;
    wb_err e;
    ck_assert_int_eq(wb__src_cache_open(c, h, 0, 5, &p, &e), WB_EIO);
    ck_assert_ptr_null(p);
    ck_assert_str_eq(e.msg, "opening source 5: refused");
    uint64_t opened, found;
    size_t open;
    wb__src_cache_counts(c, &opened, &found, &open);
    ck_assert_uint_eq(open, 0);
    /* The same handle on another device is another mapping. */
    ck_assert_int_eq(wb__src_cache_open(c, h, 0, 0, &p, &e), WB_OK);
    ck_assert_int_eq(wb__src_cache_open(c, h, 1, 1, &p, &e), WB_OK);
    ck_assert_int_eq(f.opens, 2);
    wb__src_cache_end(c, 1);
    ck_assert_int_eq(f.open_now, 0);
    wb__src_cache_free(&c);
}
END_TEST

/* The caller's state kept with the cache (the copy streams) lives across
 * commits and owners and is freed once, with the cache. */
static int kept_freed;

static void free_kept(void *p)
{
    kept_freed++;
    free(p);
}

START_TEST(test_kept_state)
{
    fake f = {0};
    wb_src_ops ops = {.open = fake_open, .close = fake_close, .ctx = &f, .free_kept = free_kept};
    wb_src_cache *c = wb__src_cache_new(&ops);
    ck_assert_ptr_nonnull(c);
    void **slot = wb__src_cache_kept(c);
    ck_assert_ptr_null(*slot);
    *slot = malloc(16);
    const uint8_t a[] = {1, 2};
    commit(c, &f, 7, a, 2, 0);
    commit(c, &f, 8, a, 2, 1);
    ck_assert_uint_eq(wb__src_cache_forget(c, 8), 0);
    ck_assert_ptr_eq(wb__src_cache_kept(c), slot);
    ck_assert_ptr_nonnull(*slot);
    kept_freed = 0;
    wb__src_cache_free(&c);
    ck_assert_int_eq(kept_freed, 1);
    ck_assert_ptr_null(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("src_cache");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_kept_between_commits);
    tcase_add_test(tc, test_owners);
    tcase_add_test(tc, test_failed_open);
    tcase_add_test(tc, test_kept_state);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
