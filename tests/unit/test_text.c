/* Text made safe to show (common/text.h): bytes as hex digits, whole bytes
 * only when the buffer is short; the terminal escape in a caller's buffer,
 * its length as snprintf reports it, nothing cut in half when it does not
 * fit, and the quote escaped only when asked. The escapes themselves, case
 * by case, are tested through wbctl_escape (test_wbctl_out). */
#include "text.h"

#include <check.h>

#include <string.h>

START_TEST(test_hex)
{
    const unsigned char b[] = {0x00, 0x7f, 0x80, 0xff, 0x1a};
    char out[11];
    ck_assert_ptr_eq(wb__text_hex(out, sizeof out, b, sizeof b), out);
    ck_assert_str_eq(out, "007f80ff1a");
    /* Short: whole bytes only. */
    ck_assert_str_eq(wb__text_hex(out, 6, b, sizeof b), "007f");
    ck_assert_str_eq(wb__text_hex(out, 2, b, sizeof b), "");
    ck_assert_str_eq(wb__text_hex(out, sizeof out, b, 0), "");
    out[0] = 'x';
    wb__text_hex(out, 0, b, sizeof b);
    ck_assert_int_eq(out[0], 'x');
}
END_TEST

/* Either case; everything else is not a digit. */
START_TEST(test_hex_digit)
{
    const char *digits = "0123456789abcdef", *upper = "ABCDEF";
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(wb__text_hex_digit(digits[i]), i);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(wb__text_hex_digit(upper[i]), 10 + i);
    const char *not_digits = "gG/:@`x \0";
    for (const char *c = not_digits; *c; c++)
        ck_assert_int_eq(wb__text_hex_digit(*c), -1);
    ck_assert_int_eq(wb__text_hex_digit('\0'), -1);
    ck_assert_int_eq(wb__text_hex_digit((char)0xc3), -1);
}
END_TEST

START_TEST(test_escape_bounded)
{
    char out[64];
    /* "a\x01" plus U+202E (8 escaped) plus a backslash: 1 + 4 + 8 + 2. */
    const char *in = "a\x01\xe2\x80\xae\\";
    ck_assert_uint_eq(wb__text_escape(out, sizeof out, in, 0), 15);
    ck_assert_str_eq(out, "a\\x01\\u{202e}\\\\");
    /* Every size: a prefix of whole escapes, the length always the same. */
    static const struct {
        size_t lo, hi;
        const char *want;
    } sizes[] = {
        {1, 1, ""},
        {2, 5, "a"},
        {6, 13, "a\\x01"},
        {14, 15, "a\\x01\\u{202e}"},
        {16, sizeof out, "a\\x01\\u{202e}\\\\"},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t size = sizes[i].lo; size <= sizes[i].hi; size++) {
            memset(out, '#', sizeof out);
            ck_assert_uint_eq(wb__text_escape(out, size, in, 0), 15);
            ck_assert_msg(strcmp(out, sizes[i].want) == 0, "size %zu: '%s'", size, out);
        }
    }
    /* A valid character that does not fit is left out whole. */
    ck_assert_uint_eq(wb__text_escape(out, 3, "a\xc3\xa9", 0), 3);
    ck_assert_str_eq(out, "a");
    ck_assert_uint_eq(wb__text_escape(out, 4, "a\xc3\xa9", 0), 3);
    ck_assert_str_eq(out, "a\xc3\xa9");
    out[0] = 'x';
    ck_assert_uint_eq(wb__text_escape(out, 0, "abc", 0), 3);
    ck_assert_int_eq(out[0], 'x');
    ck_assert_uint_eq(wb__text_escape(out, sizeof out, NULL, 0), 0);
    ck_assert_str_eq(out, "");
}
END_TEST

START_TEST(test_escape_quote)
{
    char out[32];
    ck_assert_uint_eq(wb__text_escape(out, sizeof out, "say \"hi\"", 0), 8);
    ck_assert_str_eq(out, "say \"hi\"");
    ck_assert_uint_eq(wb__text_escape(out, sizeof out, "say \"hi\"", WB_TEXT_ESCAPE_QUOTE), 10);
    ck_assert_str_eq(out, "say \\\"hi\\\"");
}
END_TEST

/* WB_TEXT_ESCAPE_MAX holds the longest escape of every length of input. */
START_TEST(test_escape_max)
{
    static const char *const units[] = {
        "\xc2\xad", "\xe2\x80\xae", "\xf3\xa0\x81\x81", "\x01", "\xff", "\"", "\\"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        char in[256] = "", out[WB_TEXT_ESCAPE_MAX(sizeof in)];
        size_t n = 0, k = strlen(units[u]);
        while (n + k < sizeof in) {
            memcpy(in + n, units[u], k);
            n += k;
        }
        in[n] = '\0';
        size_t need = wb__text_escape(out, sizeof out, in, WB_TEXT_ESCAPE_QUOTE);
        ck_assert_uint_lt(need, WB_TEXT_ESCAPE_MAX(n));
        ck_assert_uint_eq(strlen(out), need);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("text");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_hex);
    tcase_add_test(tc, test_hex_digit);
    tcase_add_test(tc, test_escape_bounded);
    tcase_add_test(tc, test_escape_quote);
    tcase_add_test(tc, test_escape_max);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
