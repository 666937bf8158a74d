/* The log's format reader: the text is what vsnprintf writes, byte for
 * byte, for every conversion, flag, width, precision and length; each
 * field's key and type come from the format; the argument types taken are
 * the format's; formats it does not read (positional arguments, *, %n, ...)
 * and formats that would not give the fields they mean (a key twice, a
 * conversion outside key=value, ...) are refused by wb__log_format_check
 * with the reason and where. */
#include "log_fields.h"

#include <check.h>

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static wb_log_fields f;

/* Reads a call and checks its text against vsnprintf's. */
static void vsame(const char *fmt, va_list ap)
{
    va_list aq;
    va_copy(aq, ap);
    char ref[WB_LOG_TEXT_SIZE];
    vsnprintf(ref, sizeof ref, fmt, aq);
    va_end(aq);
    wb__log_vfields(&f, fmt, ap);
    ck_assert_msg(strcmp(f.text, ref) == 0, "\"%s\": \"%s\", not \"%s\"", fmt, f.text, ref);
    ck_assert_uint_eq(f.len, strlen(ref));
    ck_assert_int_eq(f.refused, 0);
}

__attribute__((format(printf, 1, 2))) static void same(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsame(fmt, ap);
    va_end(ap);
}

/* Formats and arguments the compiler would question in same(): the empty
 * format, ints for %hhd and %hu. */
static void same_unchecked(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsame(fmt, ap);
    va_end(ap);
}

START_TEST(test_text_is_vsnprintf)
{
    same("a=%d b=%i c=%u d=%ld e=%lu f=%lld g=%llu h=%zu i=%zd j=%jd k=%ju l=%td m=%tu", INT_MIN,
         -1, UINT_MAX, LONG_MIN, ULONG_MAX, LLONG_MIN, ULLONG_MAX, SIZE_MAX, (ssize_t)-2,
         INTMAX_MIN, UINTMAX_MAX, (ptrdiff_t)-3, (ptrdiff_t)-4);
    ck_assert_uint_eq(f.n_args, 13);
    ck_assert_uint_eq(f.arg_types,
                      WB_LOG_ARG_INT | WB_LOG_ARG_LONG | WB_LOG_ARG_LLONG | WB_LOG_ARG_SIZE);
    same("a=%hhd b=%hhu c=%hd d=%hu e=%hhx f=%hx g=%lx h=%llX i=%#o j=%#x k=%jx l=%zx m=%tx",
         (signed char)-5, (unsigned char)250, (short)-300, (unsigned short)65000, (unsigned char)15,
         (unsigned short)4096, 255ul, 255ull, 8u, 0u, UINTMAX_MAX, SIZE_MAX, (ptrdiff_t)-1);
    /* As printf converts an int for them: %hhd of 300 is 44. */
    same_unchecked("a=%hhd b=%hhu c=%hd d=%hu", 300, -1, 70000, -1);
    ck_assert_str_eq(f.text, "a=44 b=255 c=4464 d=65535");
    ck_assert_int_eq(f.f[0].v.i, 44);
    ck_assert_uint_eq(f.f[3].v.u, 65535);
    same("a=%5d b=%-5d| c=%05d d=%+d e=% d f=%.3d g=%8.3d h=%-+8.3d| i=%'d", 42, 42, -42, 42, 42, 7,
         7, 7, 1234567);
    same("a=%f b=%.0f c=%.3f d=%10.4f e=%-10.2f| f=%+f g=%#.0f h=%e i=%.2E j=%g k=%G l=%#g m=%a "
         "n=%.3A o=%F",
         1.5, 2.5, -0.0005, 3.14159, 2.0, 1.0, 3.0, 123456.789, 1e-300, 1e100, 1e-5, 1.0, 1.0, 0.1,
         1e308 * 10);
    ck_assert_uint_eq(f.arg_types, WB_LOG_ARG_DOUBLE);
    same("a=%Lf b=%.2Le c=%Lg", 1.5L, 1e4000L, 0.1L);
    ck_assert_uint_eq(f.arg_types, WB_LOG_ARG_LDOUBLE);
    same("a=%s b=%.3s c=%8s d=%-8s| e=%.0s f=%10.2s g=%c h=%-3c| i=%%", "plain", "abcdef", "r", "l",
         "gone", "xyz", 'q', 'w');
    ck_assert_uint_eq(f.arg_types, WB_LOG_ARG_STRING | WB_LOG_ARG_INT);
    int here;
    same("p=%p q=%20p", (void *)&here, (void *)NULL);
    ck_assert_uint_eq(f.arg_types, WB_LOG_ARG_POINTER);
    /* Literal text as it is: quotes, backslashes, %%, words. */
    same("note=\"a \\\"q\\\" b\" x=\\y 100%% %s words=%s:%s tail", " k=v", "a", "b");
    /* A backslash escapes a quote or a backslash, never a conversion. */
    same("note=\"a \\%d \\z b\\\\\" x=%s", 5, "y");
    ck_assert_uint_eq(f.n_args, 2);
    same_unchecked("");
    ck_assert_int_eq(f.has_tail, 0);
    same("%s", "");
    same("   leading and trailing spaces  ");
    /* Cut where vsnprintf cuts. */
    static char big[6000];
    memset(big, 'x', sizeof big - 1);
    same("a=%d b=%s c=%d", 1, big, 2);
    ck_assert_uint_eq(f.len, WB_LOG_TEXT_SIZE - 1);
    same("a=%s b=%.3f", big + 1910, 1.25);
    same("a=%s b=%.3f", big + 1908, 1.25);
}
END_TEST

/* The fields of a format, as the check records them. */
static void fields_of(const char *fmt)
{
    char why[256];
    ck_assert_msg(wb__log_format_check(fmt, &f, why, sizeof why) == 0, "%s: %s", fmt, why);
}

static void field_is(unsigned i, const char *key, wb_log_type type, int quoted)
{
    ck_assert_uint_lt(i, f.n);
    if (key) {
        ck_assert_ptr_nonnull(f.f[i].key);
        ck_assert_uint_eq(f.f[i].klen, strlen(key));
        ck_assert_int_eq(memcmp(f.f[i].key, key, strlen(key)), 0);
    } else {
        ck_assert_ptr_null(f.f[i].key);
    }
    ck_assert_int_eq(f.f[i].type, type);
    ck_assert_int_eq(f.f[i].quoted, quoted);
}

START_TEST(test_types_from_the_format)
{
    fields_of("a=%d b=%u c=%.3f d=%s e=x f=\"q %u\" g=%x h=%s:%s i=%u%s j=%lld k=%zu l=%g m=%c "
              "n=%p o=%a p= q=%% r=%s%s");
    ck_assert_uint_eq(f.n, 20);
    field_is(0, "a", WB_LOG_INT, 0);
    field_is(1, "b", WB_LOG_UINT, 0);
    field_is(2, "c", WB_LOG_REAL, 0);
    ck_assert_int_eq(f.f[2].conv, 'f');
    ck_assert_int_eq(f.f[2].prec, 3);
    field_is(3, "d", WB_LOG_STRING, 0);
    field_is(4, "e", WB_LOG_STRING, 0);
    field_is(5, "f", WB_LOG_STRING, 1);
    field_is(6, "g", WB_LOG_STRING, 0);
    field_is(7, "h", WB_LOG_STRING, 0);
    field_is(8, "i", WB_LOG_UINT, 0);
    field_is(9, NULL, WB_LOG_FIELDS, 0);
    field_is(10, "j", WB_LOG_INT, 0);
    field_is(11, "k", WB_LOG_UINT, 0);
    field_is(12, "l", WB_LOG_REAL, 0);
    ck_assert_int_eq(f.f[12].prec, -1);
    field_is(13, "m", WB_LOG_STRING, 0);
    field_is(14, "n", WB_LOG_STRING, 0);
    field_is(15, "o", WB_LOG_STRING, 0);
    field_is(16, "p", WB_LOG_STRING, 0);
    field_is(17, "q", WB_LOG_STRING, 0);
    /* A %s right after a conversion is optional fields; after text, part
     * of the value. */
    field_is(18, "r", WB_LOG_STRING, 0);
    field_is(19, NULL, WB_LOG_FIELDS, 0);
    /* Words, optional fields alone, a model's error with words after it. */
    fields_of("model=%s error=%s: clients get the table %s");
    ck_assert_uint_eq(f.n, 7);
    field_is(1, "error", WB_LOG_STRING, 0);
    field_is(2, NULL, WB_LOG_WORD, 0);
    field_is(6, NULL, WB_LOG_FIELDS, 0);
    fields_of("");
    ck_assert_uint_eq(f.n, 0);
}
END_TEST

/* What the check says of fmt. */
static const char *refusal(const char *fmt)
{
    static char why[256];
    ck_assert_msg(wb__log_format_check(fmt, NULL, why, sizeof why) == -1, "%s was accepted",
                  fmt ? fmt : "no format");
    return why;
}

START_TEST(test_refusals)
{
    /* Conversions it does not read: the logger writes such a format
     * whole as text. */
    ck_assert_str_eq(refusal("a=1 b=%n"), "%n (at offset 6)");
    ck_assert_str_eq(refusal("a=%*d"), "a * width (at offset 2)");
    ck_assert_str_eq(refusal("a=%.*f"), "a * precision (at offset 2)");
    ck_assert_str_eq(refusal("a=%1$d"), "a positional argument (at offset 2)");
    ck_assert_str_eq(refusal("a=%ls"), "a wide character or string (at offset 2)");
    ck_assert_str_eq(refusal("a=%lc"), "a wide character or string (at offset 2)");
    ck_assert_str_eq(refusal("a=%hs"), "a length on %c, %s or %p (at offset 2)");
    ck_assert_str_eq(refusal("a=%Ld"), "L on an integer conversion (at offset 2)");
    ck_assert_str_eq(refusal("a=%hf"), "an integer length on a real conversion (at offset 2)");
    ck_assert_str_eq(refusal("a=%m"), "%m (at offset 2)");
    ck_assert_str_eq(refusal("a=%"), "a '%' at the end (at offset 2)");
    ck_assert_str_eq(refusal("a=%y"), "an unknown conversion (at offset 2)");
    ck_assert_str_eq(refusal("a=%5000d"), "a width over 4096 (at offset 2)");
    ck_assert_str_eq(refusal("a=%.5000f"), "a precision over 4096 (at offset 2)");
    ck_assert_str_eq(refusal("a=%00000000000000000000000000000001d"),
                     "a conversion longer than 31 characters (at offset 2)");
    /* Formats whose fields would not be what they mean. */
    ck_assert_str_eq(refusal("a=1 b=%d a=%s"), "key 'a' twice (at offset 9)");
    ck_assert_str_eq(refusal("model=%s event=%s"),
                     "key 'event' is one of the fixed fields (at offset 9)");
    ck_assert_str_eq(refusal("text=x"), "key 'text' is one of the fixed fields (at offset 0)");
    ck_assert_str_eq(refusal("truncated=%d"),
                     "key 'truncated' is one of the fixed fields (at offset 0)");
    ck_assert_str_eq(refusal("a/b=1"), "key 'a/b' has a character outside [A-Za-z0-9_.-] (at "
                                       "offset 0)");
    ck_assert_str_eq(refusal("loaded %zu tensors"),
                     "a conversion outside key=value in '%zu' (at offset 7)");
    ck_assert_str_eq(refusal("a=1 x%d"), "a conversion outside key=value in 'x%d' (at offset 5)");
    ck_assert_str_eq(refusal("note=\"never closed"), "an unclosed quote in 'note' (at offset 0)");
    ck_assert_str_eq(refusal("uid=%u%s:x"), "optional fields (%s) must end their word (at offset "
                                            "8)");
    ck_assert_str_eq(refusal(NULL), "no format");
    /* The first problem only, and why may be NULL. */
    ck_assert_str_eq(refusal("a=1 a=2 b/c=3"), "key 'a' twice (at offset 4)");
    ck_assert_int_eq(wb__log_format_check("a=%n", NULL, NULL, 0), -1);
    /* Accepted: the shapes the call sites use. */
    static const char *const good[] = {
        "",
        "x=1",
        "%s",
        "a=%d %s",
        "a=%u%s",
        "error=%s: clients get the table in their replies",
        "a=100%%",
        "note=\"a b %u\" c=\\x",
        ("lease=%.8s model=%s containers=%u note=\"its memory stays mapped until "
         "wb_lease_release\""),
        "reason=%s pid=%u suppressed=%llu",
        "k.a-b_C9=%Lf",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char why[256];
        ck_assert_msg(wb__log_format_check(good[i], NULL, why, sizeof why) == 0, "%s: %s", good[i],
                      why);
        ck_assert_str_eq(why, "");
    }
}
END_TEST

START_TEST(test_array_arguments)
{
    /* Each conversion reads its member, as C would pass it; past the end,
     * zeros; a NULL string reads as "". */
    wb_log_arg args[] = {{.i = 0x1ffffffffLL}, {.i = -1}, {.d = 2.5}, {.s = NULL}, {.i = 300}};
    wb__log_afields(&f, "a=%d b=%u c=%.1f d=%s e=%hhd f=%s g=%llu", args, 5);
    ck_assert_str_eq(f.text, "a=-1 b=4294967295 c=2.5 d= e=44 f= g=0");
    ck_assert_uint_eq(f.n_args, 7);
    ck_assert_int_eq(f.f[0].v.i, -1);
    ck_assert_uint_eq(f.f[1].v.u, 4294967295u);
    ck_assert_int_eq(f.f[4].v.i, 44);
    /* A refused format is kept as it is. */
    wb__log_afields(&f, "a=%*d", args, 5);
    ck_assert_int_eq(f.refused, 1);
    ck_assert_str_eq(f.text, "a=%*d");
    ck_assert_uint_eq(f.n, 1);
    ck_assert_int_eq(f.f[0].type, WB_LOG_WORD);
}
END_TEST

START_TEST(test_is_quoted)
{
    ck_assert_int_eq(wb__log_is_quoted("\"\"", 2), 1);
    ck_assert_int_eq(wb__log_is_quoted("\"a b\"", 5), 1);
    ck_assert_int_eq(wb__log_is_quoted("\"a\\\"b\"", 6), 1);
    ck_assert_int_eq(wb__log_is_quoted("\"a\\\\\"", 5), 1);
    ck_assert_int_eq(wb__log_is_quoted("\"", 1), 0);
    ck_assert_int_eq(wb__log_is_quoted("\"a\\\"", 4), 0);     /* the last quote is escaped */
    ck_assert_int_eq(wb__log_is_quoted("\"a\" \"b\"", 7), 0); /* two values */
    ck_assert_int_eq(wb__log_is_quoted("a\"\"", 3), 0);
    ck_assert_int_eq(wb__log_is_quoted("\"a\":", 4), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("log_fields");
    TCase *tc = tcase_create("log_fields");
    tcase_add_test(tc, test_text_is_vsnprintf);
    tcase_add_test(tc, test_types_from_the_format);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_array_arguments);
    tcase_add_test(tc, test_is_quoted);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
