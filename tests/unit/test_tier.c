/* The memory budget's arithmetic (tier.h): sizes and percents as the
 * options take them, and the loader's judgement of a load against the
 * budget of each device: reserved when it fits, refused with the device
 * and the bytes when it does not, told whether moves could make room, and
 * a wait for room that ends when the loop's count goes down, when the load
 * is stopped, or at its deadline. */
#include "tier.h"

#include "clock.h"

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

START_TEST(test_parse_size)
{
    uint64_t b;
    unsigned pct;
    wb_err err;
    ck_assert_int_eq(wb__tier_parse_size("--x", "4096", &b, &pct, &err), WB_OK);
    ck_assert_uint_eq(b, 4096);
    ck_assert_uint_eq(pct, 0);
    ck_assert_int_eq(wb__tier_parse_size("--x", "3G", &b, &pct, &err), WB_OK);
    ck_assert_uint_eq(b, 3ull << 30);
    ck_assert_int_eq(wb__tier_parse_size("--x", "2k", &b, &pct, &err), WB_OK);
    ck_assert_uint_eq(b, 2048);
    ck_assert_int_eq(wb__tier_parse_size("--x", "5GB", &b, &pct, &err), WB_OK);
    ck_assert_uint_eq(b, 5000000000ull);
    ck_assert_int_eq(wb__tier_parse_size("--x", "25%", &b, &pct, &err), WB_OK);
    ck_assert_uint_eq(pct, 25);
    ck_assert_uint_eq(b, 0);
    const char *bad[] = {"", "0", "-1", "+5", "12Q", "0%", "101%", "G", "5 G", "99999999999T"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(wb__tier_parse_size("--device-memory-budget", bad[i], &b, &pct, &err),
                         WB_EINVAL);
        ck_assert_ptr_nonnull(strstr(err.msg, "--device-memory-budget"));
    }
}
END_TEST

START_TEST(test_fits_and_refuses)
{
    wb_budget bg;
    wb__budget_init(&bg);
    bg.limit[1] = 1000; /* device 0 */
    bg.limit[2] = 500;  /* device 1 */
    bg.used[1] = 300;
    int devs[2] = {0, 1};
    uint64_t reserved;
    int retry;
    wb_err err;
    ck_assert_int_eq(
        wb__budget_fits(&bg, "load of 'a'", devs, 1, 700, 0, NULL, &reserved, &retry, &err), WB_OK);
    ck_assert_uint_eq(reserved, 700);
    ck_assert_uint_eq(bg.reserved[1], 700);
    /* Nothing left on device 0: refused, and moves could help. */
    ck_assert_int_eq(
        wb__budget_fits(&bg, "load of 'b'", devs, 1, 100, 0, NULL, &reserved, &retry, &err),
        WB_ENOMEM);
    ck_assert_uint_eq(reserved, 0);
    ck_assert_int_eq(retry, 1);
    ck_assert_ptr_nonnull(
        strstr(err.msg, "load of 'b' does not fit the memory budget of device 0"));
    ck_assert_ptr_nonnull(
        strstr(err.msg, "it needs 100 bytes, 1000 bytes of the budget of 1000 bytes in use"));
    wb__budget_unreserve(&bg, devs, 1, 700);
    ck_assert_uint_eq(bg.reserved[1], 0);
    /* Both devices judged: device 1's budget is the smaller. */
    ck_assert_int_eq(
        wb__budget_fits(&bg, "load of 'c'", devs, 2, 600, 0, NULL, &reserved, &retry, &err),
        WB_ENOMEM);
    ck_assert_int_eq(retry, 0); /* larger than device 1's whole budget */
    ck_assert_ptr_nonnull(strstr(err.msg, "device 1"));
    ck_assert_ptr_nonnull(strstr(err.msg, "more than the whole budget"));
    ck_assert_uint_eq(bg.reserved[1], 0);
    /* A slot without a budget takes anything. */
    int host = -1;
    ck_assert_int_eq(
        wb__budget_fits(&bg, "load", &host, 1, 1ull << 40, 0, NULL, &reserved, &retry, &err),
        WB_OK);
    ck_assert_int_eq(
        wb__budget_fits(NULL, "load", devs, 2, 1ull << 40, 0, NULL, &reserved, &retry, &err),
        WB_OK);
    ck_assert_uint_eq(reserved, 0);
}
END_TEST

typedef struct room {
    wb_budget *bg;
    int delay_ms;
} room;

/* The loop's side: after a while, what is on the device goes down. */
static void *free_later(void *arg)
{
    room *r = arg;
    usleep((useconds_t)r->delay_ms * 1000);
    pthread_mutex_lock(&r->bg->mu);
    r->bg->used[1] = 0;
    pthread_cond_broadcast(&r->bg->cv);
    pthread_mutex_unlock(&r->bg->mu);
    return NULL;
}

START_TEST(test_wait_for_room)
{
    wb_budget bg;
    wb__budget_init(&bg);
    bg.limit[1] = 1000;
    bg.used[1] = 900;
    int dev = 0;
    uint64_t reserved;
    int retry;
    wb_err err;
    room r = {&bg, 150};
    pthread_t t;
    pthread_create(&t, NULL, free_later, &r);
    int64_t t0 = wb__clock_mono_ms();
    ck_assert_int_eq(
        wb__budget_fits(&bg, "load", &dev, 1, 500, 5000, NULL, &reserved, &retry, &err), WB_OK);
    int64_t waited = wb__clock_mono_ms() - t0;
    pthread_join(t, NULL);
    ck_assert_int_ge(waited, 100);
    ck_assert_int_lt(waited, 4000);
    ck_assert_uint_eq(reserved, 500);
    /* No room comes: refused at the deadline. */
    bg.used[1] = 900;
    t0 = wb__clock_mono_ms();
    ck_assert_int_eq(wb__budget_fits(&bg, "load", &dev, 1, 200, 120, NULL, &reserved, &retry, &err),
                     WB_ENOMEM);
    waited = wb__clock_mono_ms() - t0;
    ck_assert_int_ge(waited, 100);
    ck_assert_int_eq(retry, 1);
    /* A stopped load does not wait. */
    atomic_int cancel = 1;
    t0 = wb__clock_mono_ms();
    ck_assert_int_eq(
        wb__budget_fits(&bg, "load", &dev, 1, 200, 5000, &cancel, &reserved, &retry, &err),
        WB_ENOMEM);
    ck_assert_int_lt(wb__clock_mono_ms() - t0, 1000);
}
END_TEST

START_TEST(test_names)
{
    ck_assert_str_eq(wb__tier_name(WB_TIER_DEVICE), "device");
    ck_assert_str_eq(wb__tier_name(WB_TIER_HOST), "host");
    ck_assert_str_eq(wb__tier_name(WB_TIER_EVICTED), "evicted");
    ck_assert_str_eq(wb__tier_name(WB_TIER_RESTORING), "restoring");
    ck_assert_str_eq(wb__tier_name(99), "unknown");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tier");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_parse_size);
    tcase_add_test(tc, test_fits_and_refuses);
    tcase_add_test(tc, test_wait_for_room);
    tcase_add_test(tc, test_names);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
