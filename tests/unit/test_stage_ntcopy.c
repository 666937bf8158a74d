/* Non-temporal copies (broker/stage_ntcopy.h): every implementation this CPU has
 * copies exactly what memcpy copies, for every size from 0 up past a few
 * vector widths and every alignment of source and destination, and touches
 * no byte outside the destination. */
#include "stage_ntcopy.h"

#include <check.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const kinds[] = {"avx2", "sse2", "memcpy"};
#define N_KINDS (sizeof kinds / sizeof kinds[0])

/* Guard bytes around the destination. */
#define PAD 64

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

/* Copies n bytes from src + soff to dst + doff with fn and checks them
 * against memcpy's result and the guards on both sides. */
static void check_one(wb_stage_ntcopy_fn fn, const char *kind, size_t n, size_t soff, size_t doff)
{
    ck_assert_uint_le(n, 1u << 30);
    if (n > (1u << 30))
        return; /* never: tells the compiler n is bounded */
    size_t cap = n + 2 * PAD + 64;
    uint8_t *src = malloc(cap), *dst = malloc(cap), *want = malloc(cap);
    ck_assert_ptr_nonnull(src);
    ck_assert_ptr_nonnull(dst);
    ck_assert_ptr_nonnull(want);
    fill(src, cap, (uint32_t)(n * 131 + soff * 7 + doff));
    memset(dst, 0xA5, cap);
    memset(want, 0xA5, cap);
    memcpy(want + PAD + doff, src + soff, n);
    fn(dst + PAD + doff, src + soff, n);
    ck_assert_msg(memcmp(dst, want, cap) == 0, "%s: %zu bytes, src +%zu, dst +%zu differ", kind, n,
                  soff, doff);
    free(src);
    free(dst);
    free(want);
}

START_TEST(test_sizes_and_alignments)
{
    unsigned have = 0;
    for (size_t k = 0; k < N_KINDS; k++) {
        wb_stage_ntcopy_fn fn = wb__stage_ntcopy_get(kinds[k]);
        if (!fn)
            continue;
        have++;
        /* Every size up to well past the short-copy threshold and several
         * unrolled loop turns, at every source and destination offset
         * within a 32-byte vector (heads and tails of every length). */
        for (size_t n = 0; n <= 700; n++) {
            for (size_t soff = 0; soff < 33; soff += (n < 300 ? 1 : 11)) {
                for (size_t doff = 0; doff < 33; doff += (n < 300 ? 1 : 7))
                    check_one(fn, kinds[k], n, soff, doff);
            }
        }
    }
    /* memcpy always exists, and x86-64 always has SSE2. */
    ck_assert_ptr_nonnull(wb__stage_ntcopy_get("memcpy"));
#if defined(__x86_64__)
    ck_assert_ptr_nonnull(wb__stage_ntcopy_get("sse2"));
    ck_assert_uint_ge(have, 2);
#endif
    ck_assert_ptr_null(wb__stage_ntcopy_get("avx9000"));
}
END_TEST

/* Large copies, as the loader does them: megabytes at odd offsets. */
START_TEST(test_large)
{
    static const size_t sizes[] = {4096, 65536 + 1, (1u << 20) + 17, (3u << 20) - 5};
    for (size_t k = 0; k < N_KINDS; k++) {
        wb_stage_ntcopy_fn fn = wb__stage_ntcopy_get(kinds[k]);
        if (!fn)
            continue;
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            check_one(fn, kinds[k], sizes[i], 0, 0);
            check_one(fn, kinds[k], sizes[i], 3, 29);
            check_one(fn, kinds[k], sizes[i], 31, 1);
        }
    }
}
END_TEST

/* wb__stage_ntcopy uses the widest kind this CPU has, and copies. */
START_TEST(test_dispatch)
{
    const char *kind = wb__stage_ntcopy_kind();
    ck_assert_ptr_nonnull(kind);
    ck_assert_ptr_nonnull(wb__stage_ntcopy_get(kind));
#if defined(__x86_64__)
    __builtin_cpu_init();
    ck_assert_str_eq(kind, __builtin_cpu_supports("avx2") ? "avx2" : "sse2");
#else
    ck_assert_str_eq(kind, "memcpy");
#endif
    check_one(wb__stage_ntcopy, kind, 100000, 5, 11);
    check_one(wb__stage_ntcopy, kind, 0, 0, 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("stage_ntcopy");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_sizes_and_alignments);
    tcase_add_test(tc, test_large);
    tcase_add_test(tc, test_dispatch);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
