/* The clocks (common/clock.h): the monotonic flavours read one clock (each
 * between the ones read before and after it, in its own unit), never go
 * back, and a deadline is that far ahead, normalised; the wall clock is
 * Unix time. */
#include "clock.h"

#include <check.h>

START_TEST(test_mono_flavours_agree)
{
    for (int i = 0; i < 1000; i++) {
        int64_t ms0 = wb__clock_mono_ms();
        int64_t us = wb__clock_mono_us();
        double s = wb__clock_mono_s();
        int64_t ms1 = wb__clock_mono_ms();
        ck_assert_int_gt(ms0, 0);
        ck_assert_int_le(ms0, ms1);
        ck_assert_int_le(ms0, us / 1000);
        ck_assert_int_le(us / 1000, ms1);
        ck_assert(s * 1000.0 >= (double)ms0 - 1.0 && s * 1000.0 <= (double)ms1 + 1.0);
    }
}
END_TEST

START_TEST(test_mono_deadline)
{
    static const int64_t ns[] = {0, 1, 999999999, 1000000000, 1500000000, 86400000000000};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        int64_t before = wb__clock_mono_us();
        struct timespec d = wb__clock_mono_deadline(ns[i]);
        int64_t after = wb__clock_mono_us();
        ck_assert_int_ge(d.tv_nsec, 0);
        ck_assert_int_lt(d.tv_nsec, 1000000000L);
        int64_t d_us = (int64_t)d.tv_sec * 1000000 + d.tv_nsec / 1000;
        ck_assert_int_ge(d_us, before + ns[i] / 1000);
        ck_assert_int_le(d_us, after + ns[i] / 1000 + 1);
    }
}
END_TEST

START_TEST(test_wall)
{
    double now = wb__clock_wall();
    ck_assert(now > 1.6e9); /* after 2020 */
    ck_assert((double)time(NULL) - now < 2.0 && now - (double)time(NULL) < 2.0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("clock");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_mono_flavours_agree);
    tcase_add_test(tc, test_mono_deadline);
    tcase_add_test(tc, test_wall);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
