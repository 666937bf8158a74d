/* The slab pool (slab_pool.c) with fake slabs: an allocation of the same
 * size on the same device gets the slab kept, as it was; a miss frees the
 * device's kept slabs first (and only that device's); slabs kept past their
 * time are trimmed; a pool that keeps nothing refuses; the bytes and the
 * counts follow. */
#include "slab_pool.h"

#include <check.h>

#include <stdlib.h>
#include <string.h>

static int freed;
static uint64_t freed_bytes;

static void fake_free(wb_slab *s)
{
    freed++;
    freed_bytes += s->size;
    s->size = 0;
}

static wb_slab slab(int device, uint64_t size, uintptr_t ptr)
{
    wb_slab s;
    memset(&s, 0, sizeof s);
    s.device = device;
    s.size = size;
    s.dev_ptr = (void *)ptr;
    s.vmm_handle = ptr;
    s.vmm_fd = (int)ptr;
    return s;
}

static void reset(void)
{
    freed = 0;
    freed_bytes = 0;
}

START_TEST(test_take_same_size)
{
    reset();
    wb_slab_pool p;
    wb__slab_pool_init(&p, 1000, fake_free);
    wb_slab a = slab(0, 4096, 0x1000), b = slab(1, 4096, 0x2000), out;
    ck_assert_int_eq(wb__slab_pool_put(&p, &a, 0), 1);
    ck_assert_int_eq(wb__slab_pool_put(&p, &b, 0), 1);
    ck_assert_uint_eq(wb__slab_pool_bytes(&p, -1), 8192);
    ck_assert_uint_eq(wb__slab_pool_bytes(&p, 1), 4096);
    /* The same size on device 0: a's slab, as it was. */
    memset(&out, 0, sizeof out);
    ck_assert_int_eq(wb__slab_pool_take(&p, 0, 4096, &out), 1);
    ck_assert_ptr_eq(out.dev_ptr, (void *)0x1000);
    ck_assert_int_eq(out.vmm_fd, 0x1000);
    ck_assert_uint_eq(wb__slab_pool_bytes(&p, 0), 0);
    ck_assert_int_eq(freed, 0);
    /* Another size on device 1: b is freed first, nothing is served. */
    ck_assert_int_eq(wb__slab_pool_take(&p, 1, 8192, &out), 0);
    ck_assert_int_eq(freed, 1);
    ck_assert_uint_eq(freed_bytes, 4096);
    ck_assert_uint_eq(wb__slab_pool_bytes(&p, -1), 0);
    uint64_t hits, misses;
    wb__slab_pool_counts(&p, &hits, &misses);
    ck_assert_uint_eq(hits, 1);
    ck_assert_uint_eq(misses, 1);
    wb__slab_pool_destroy(&p);
}
END_TEST

START_TEST(test_miss_keeps_other_devices)
{
    reset();
    wb_slab_pool p;
    wb__slab_pool_init(&p, 1000, fake_free);
    wb_slab a = slab(0, 4096, 0x1000), b = slab(1, 4096, 0x2000), out;
    wb__slab_pool_put(&p, &a, 0);
    wb__slab_pool_put(&p, &b, 0);
    ck_assert_int_eq(wb__slab_pool_take(&p, 0, 4096 * 3, &out), 0);
    ck_assert_int_eq(freed, 1);
    ck_assert_uint_eq(wb__slab_pool_bytes(&p, 1), 4096);
    ck_assert_int_eq(wb__slab_pool_take(&p, 1, 4096, &out), 1);
    ck_assert_ptr_eq(out.dev_ptr, (void *)0x2000);
    wb__slab_pool_destroy(&p);
    ck_assert_int_eq(freed, 1);
}
END_TEST

START_TEST(test_trim_and_destroy)
{
    reset();
    wb_slab_pool p;
    wb__slab_pool_init(&p, 1000, fake_free);
    for (uintptr_t i = 1; i <= 20; i++) {
        wb_slab s = slab(0, i * 4096, i << 12);
        ck_assert_int_eq(wb__slab_pool_put(&p, &s, (int64_t)i * 100), 1);
    }
    ck_assert_uint_eq(wb__slab_pool_bytes(&p, 0), 4096u * 210);
    /* Kept until put + 1000 ms: at 1500, the first five went. */
    ck_assert_uint_eq(wb__slab_pool_trim(&p, 1500), 5);
    ck_assert_int_eq(freed, 5);
    ck_assert_uint_eq(freed_bytes, 4096u * 15);
    ck_assert_uint_eq(wb__slab_pool_trim(&p, 1500), 0);
    wb_slab out;
    ck_assert_int_eq(wb__slab_pool_take(&p, 0, 4096 * 12, &out), 1);
    ck_assert_ptr_eq(out.dev_ptr, (void *)(12u << 12));
    wb__slab_pool_destroy(&p);
    ck_assert_int_eq(freed, 19);
}
END_TEST

START_TEST(test_keeps_nothing)
{
    reset();
    wb_slab_pool p;
    wb__slab_pool_init(&p, 0, fake_free);
    wb_slab a = slab(0, 4096, 0x1000), out;
    ck_assert_int_eq(wb__slab_pool_put(&p, &a, 0), 0);
    ck_assert_int_eq(wb__slab_pool_take(&p, 0, 4096, &out), 0);
    uint64_t hits, misses;
    wb__slab_pool_counts(&p, &hits, &misses);
    ck_assert_uint_eq(hits + misses, 0);
    wb__slab_pool_destroy(&p);
    ck_assert_int_eq(freed, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("slab_pool");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_take_same_size);
    tcase_add_test(tc, test_miss_keeps_other_devices);
    tcase_add_test(tc, test_trim_and_destroy);
    tcase_add_test(tc, test_keeps_nothing);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
