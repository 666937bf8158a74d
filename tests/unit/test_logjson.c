/* The logger's two formats, written from the same typed fields: the text
 * line is what vsnprintf wrote for the call (checked on every call here),
 * and the JSON line gives each key the type of its conversion: integers
 * exact (the largest unsigned ones too), reals with the digits the format
 * asks for, strings unquoted from what wb__log_quote made of them, with
 * control characters escaped and bytes that are not UTF-8 kept as the text
 * \xNN; optional fields, stray words in "text"; every line one valid JSON
 * object, however small the buffer; wb__log writes such lines when the
 * format is json and the text otherwise. */
#include "log.h"
#include "utf8.h"

#include <check.h>
#include <jansson.h>

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const TS = "2026-11-30T07:31:02.123Z";
static const char PREFIX[] = "{\"ts\":\"2026-11-30T07:31:02.123Z\",\"level\":\"info\","
                             "\"prog\":\"wbrokerd\",\"event\":\"ev\"";

static char line[16384];

/* Reads one call into f, checking that its text is vsnprintf's. */
static void vread(wb_log_fields *f, const char *fmt, va_list ap)
{
    va_list aq;
    va_copy(aq, ap);
    char ref[WB_LOG_TEXT_SIZE];
    vsnprintf(ref, sizeof ref, fmt, aq);
    va_end(aq);
    wb__log_vfields(f, fmt, ap);
    ck_assert_str_eq(f->text, ref);
    ck_assert_uint_eq(f->len, strlen(ref));
}

/* The JSON line of one call, from after the fixed fields. */
__attribute__((format(printf, 1, 2))) static const char *J(const char *fmt, ...)
{
    wb_log_fields f;
    va_list ap;
    va_start(ap, fmt);
    vread(&f, fmt, ap);
    va_end(ap);
    size_t len = wb__log_render(&f, WB_LOG_JSON, line, sizeof line, TS, "info", "wbrokerd", "ev");
    ck_assert_uint_eq(len, strlen(line));
    ck_assert_msg(strncmp(line, PREFIX, strlen(PREFIX)) == 0, "%s", line);
    return line + strlen(PREFIX);
}

/* The text line of one call. */
__attribute__((format(printf, 1, 2))) static const char *T(const char *fmt, ...)
{
    wb_log_fields f;
    va_list ap;
    va_start(ap, fmt);
    vread(&f, fmt, ap);
    va_end(ap);
    wb__log_render(&f, WB_LOG_TEXT, line, sizeof line, TS, "info", "wbrokerd", "ev");
    return line;
}

/* The JSON line just written, parsed; the caller frees it. */
static json_t *parsed(void)
{
    json_error_t e;
    json_t *o = json_loads(line, 0, &e);
    ck_assert_msg(o != NULL, "not JSON (%s): %s", e.text, line);
    ck_assert(json_is_object(o));
    return o;
}

static const char *str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_string(v), "field %s is not a string: %s", key, line);
    return json_string_value(v);
}

START_TEST(test_integers)
{
    ck_assert_str_eq(
        J("a=%d b=%u c=%ld d=%lld e=%zu f=%i", -5, 4000000000u, -7L, LLONG_MIN, (size_t)12, 0),
        ",\"a\":-5,\"b\":4000000000,\"c\":-7,\"d\":-9223372036854775808,\"e\":12,"
        "\"f\":0}\n");
    json_t *o = parsed();
    ck_assert(json_is_integer(json_object_get(o, "a")));
    ck_assert_int_eq(json_integer_value(json_object_get(o, "d")), LLONG_MIN);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "b")), 4000000000);
    json_decref(o);
    /* Above INT64_MAX: the exact digits, a number all the same (which
     * jansson itself cannot read; Python can). */
    ck_assert_str_eq(
        J("bytes=%llu id=%llu top=%lu", (unsigned long long)INT64_MAX + 1, ULLONG_MAX, ULONG_MAX),
        ",\"bytes\":9223372036854775808,\"id\":18446744073709551615,"
        "\"top\":18446744073709551615}\n");
    ck_assert_str_eq(
        J("a=%hhd b=%hu c=%hhu", (signed char)-5, (unsigned short)4464, (unsigned char)255),
        ",\"a\":-5,\"b\":4464,\"c\":255}\n");
    /* Flags and widths change the text, not the number. */
    ck_assert_str_eq(T("a=%05d b=%+d c=%-4u d=%'d", -5, 7, 3u, 1000),
                     "ts=2026-11-30T07:31:02.123Z level=info prog=wbrokerd event=ev a=-0005 b=+7 "
                     "c=3    d=1000\n");
    ck_assert_str_eq(J("a=%05d b=%+d c=%-4u d=%'d", -5, 7, 3u, 1000),
                     ",\"a\":-5,\"b\":7,\"c\":3,\"d\":1000}\n");
}
END_TEST

START_TEST(test_reals)
{
    /* The digits the precision asks for: seconds=%.3f of 1.5 is 1.500, no
     * float noise (0.1 is 0.100000, not 0.10000000000000001). */
    ck_assert_str_eq(
        J("s=%.3f t=%.4f u=%.2f f=%f e=%e g=%g G=%G", 1.5, 2.0, 0.125, 0.1, 1500.0, 1e-5, 1e20),
        ",\"s\":1.500,\"t\":2.0000,\"u\":0.12,\"f\":0.100000,\"e\":1.500000e+03,"
        "\"g\":1e-05,\"G\":1E+20}\n");
    json_t *o = parsed();
    ck_assert(json_is_real(json_object_get(o, "s")));
    ck_assert(json_real_value(json_object_get(o, "s")) == 1.5);
    json_decref(o);
    /* Always with a fraction or an exponent, so that a reader that tells
     * integers from reals sees one type: %g of 100, %.0f. */
    ck_assert_str_eq(J("g=%g z=%.0f h=%#.0f", 100.0, 2.5, 3.0),
                     ",\"g\":100.0,\"z\":2.0,\"h\":3.0}\n");
    /* Flags and widths that would make no JSON number are left out. */
    ck_assert_str_eq(J("p=%+.1f w=%08.3f sp=% .2f", 1.25, 3.0, 0.5),
                     ",\"p\":1.2,\"w\":3.000,\"sp\":0.50}\n");
    /* Not finite: null. */
    ck_assert_str_eq(J("a=%f b=%.3f c=%g d=%.3f", INFINITY, NAN, -INFINITY, -0.0),
                     ",\"a\":null,\"b\":null,\"c\":null,\"d\":-0.000}\n");
    ck_assert_str_eq(J("l=%Lf m=%.2Lf", 1.5L, 2.5L), ",\"l\":1.500000,\"m\":2.50}\n");
    o = parsed();
    json_decref(o);
}
END_TEST

START_TEST(test_strings)
{
    char q1[128], q2[128], q3[128], q4[128], q5[128], q6[128];
    ck_assert_str_eq(J("model=%s", "demo"), ",\"model\":\"demo\"}\n");
    /* Quoted by wb__log_quote: the JSON value is the string it was given. */
    ck_assert_str_eq(
        J("error=%s path=%s ctl=%s empty=%s", wb__log_quote(q1, sizeof q1, "no such file: /a b"),
          wb__log_quote(q2, sizeof q2, "x\"y\\z=w"), wb__log_quote(q3, sizeof q3, "a\nb\tc\x7f"),
          wb__log_quote(q4, sizeof q4, "")),
        ",\"error\":\"no such file: /a b\",\"path\":\"x\\\"y\\\\z=w\","
        "\"ctl\":\"a\\u000ab\\u0009c\\u007f\",\"empty\":\"\"}\n");
    ck_assert_str_eq(T("error=%s path=%s", q1, q2),
                     "ts=2026-11-30T07:31:02.123Z level=info prog=wbrokerd event=ev "
                     "error=\"no such file: /a b\" path=\"x\\\"y\\\\z=w\"\n");
    /* Escapes are undone once: the text \x41 stays \x41. */
    ck_assert_str_eq(J("v=%s", wb__log_quote(q5, sizeof q5, "\\x41 \"")),
                     ",\"v\":\"\\\\x41 \\\"\"}\n");
    /* UTF-8 passes; bytes that are not UTF-8 are the text \xNN. */
    ck_assert_str_eq(
        J("name=%s raw=%s", "caf\xc3\xa9", wb__log_quote(q6, sizeof q6, "a\xff b\xc3")),
        ",\"name\":\"caf\xc3\xa9\",\"raw\":\"a\\\\xff b\\\\xc3\"}\n");
    /* A string that only looks quoted, or has spaces unquoted, is taken as
     * it is. */
    ck_assert_str_eq(J("a=%s b=%s c=%s", "\"x\" y", "two words", "\"open"),
                     ",\"a\":\"\\\"x\\\" y\",\"b\":\"two words\",\"c\":\"\\\"open\"}\n");
    /* Precision, %c, %x, %o, %p and %a: strings, the text. */
    ck_assert_str_eq(
        J("lease=%.8s c=%c x=%x X=%#X o=%o a=%a", "ab000000ffff", 'z', 255u, 255u, 8u, 1.0),
        ",\"lease\":\"ab000000\",\"c\":\"z\",\"x\":\"ff\",\"X\":\"0XFF\",\"o\":\"10\","
        "\"a\":\"0x1p+0\"}\n");
    int here;
    char ptr[32];
    snprintf(ptr, sizeof ptr, "%p", (void *)&here);
    J("p=%p", (void *)&here);
    json_t *o = parsed();
    ck_assert_str_eq(str(o, "p"), ptr);
    json_decref(o);
}
END_TEST

START_TEST(test_literals_and_quoted_formats)
{
    /* Values written in the format: strings, those it quotes unquoted, the
     * conversions inside them as text. */
    ck_assert_str_eq(
        J("state=ready path=/metrics note=\"--max-peers %u leaves too few of %ld descriptors\"", 7u,
          -1L),
        ",\"state\":\"ready\",\"path\":\"/metrics\","
        "\"note\":\"--max-peers 7 leaves too few of -1 descriptors\"}\n");
    ck_assert_str_eq(J("error=\"%s\" reason=\"the host backend\" e=", "No such file or directory"),
                     ",\"error\":\"No such file or directory\",\"reason\":\"the host backend\","
                     "\"e\":\"\"}\n");
    /* A value of several parts is its text; words outside key=value go to
     * "text", after the fields. */
    ck_assert_str_eq(J("model=%s error=%s: clients get the table in their replies", "m",
                       "cannot map: Permission denied"),
                     ",\"model\":\"m\",\"error\":\"cannot map: Permission denied:\","
                     "\"text\":\"clients get the table in their replies\"}\n");
    ck_assert_str_eq(J("a=%s-%u b=x%d%%", "v", 3u, 4), ",\"a\":\"v-3\",\"b\":\"x4%\"}\n");
}
END_TEST

START_TEST(test_optional_fields)
{
    /* `uid=%u%s` with "" or " no_wait=yes", as ops_admin.c writes it. */
    const char *fmt = "model=%s path=%s backend=%s pid=%u uid=%u%s";
    ck_assert_str_eq(
        J("model=%s path=%s backend=%s pid=%u uid=%u%s", "m", "/p", "host", 1u, 2u, ""),
        ",\"model\":\"m\",\"path\":\"/p\",\"backend\":\"host\",\"pid\":1,\"uid\":2}\n");
    ck_assert_str_eq(
        J("model=%s path=%s backend=%s pid=%u uid=%u%s", "m", "/p", "host", 1u, 2u, " no_wait=yes"),
        ",\"model\":\"m\",\"path\":\"/p\",\"backend\":\"host\",\"pid\":1,\"uid\":2,"
        "\"no_wait\":\"yes\"}\n");
    ck_assert_int_eq(wb__log_format_check(fmt, NULL, NULL, 0), 0);
    /* A %s alone: its pairs are strings (quoted ones unquoted), its other
     * words text. */
    ck_assert_str_eq(J("a=%d %s b=%d", 1, "c=2 d=\"x y\" loose =e", 3),
                     ",\"a\":1,\"c\":\"2\",\"d\":\"x y\",\"b\":3,\"text\":\"loose =e\"}\n");
    /* wb_warn_peer's tail. */
    ck_assert_str_eq(J("reason=%s pid=%u"
                       " suppressed=%llu",
                       "limit", 5u, 12ull),
                     ",\"reason\":\"limit\",\"pid\":5,\"suppressed\":12}\n");
}
END_TEST

START_TEST(test_text_line)
{
    char q[64];
    ck_assert_str_eq(T("model=%s bytes=%d", wb__log_quote(q, sizeof q, "a b"), 12),
                     "ts=2026-11-30T07:31:02.123Z level=info prog=wbrokerd event=ev model=\"a b\" "
                     "bytes=12\n");
    /* No tail, no space; an empty tail keeps its space, as before. */
    ck_assert_str_eq(T("%s", ""),
                     "ts=2026-11-30T07:31:02.123Z level=info prog=wbrokerd event=ev \n");
    wb_log_fields f;
    wb__log_afields(&f, "", NULL, 0);
    wb__log_render(&f, WB_LOG_TEXT, line, sizeof line, TS, "info", "wbrokerd", "ev");
    ck_assert_str_eq(line, "ts=2026-11-30T07:31:02.123Z level=info prog=wbrokerd event=ev\n");
    wb__log_render(&f, WB_LOG_JSON, line, sizeof line, TS, "info", "wbrokerd", "ev");
    ck_assert_str_eq(line + strlen(PREFIX), "}\n");
    /* Cut as snprintf cuts, the newline kept. */
    wb__log_afields(&f, "a=%d b=%s", (wb_log_arg[]){{.i = 1}, {.s = "xyz"}}, 2);
    ck_assert_uint_eq(wb__log_render(&f, WB_LOG_TEXT, line, 70, TS, "info", "wbrokerd", "ev"), 69);
    ck_assert_str_eq(line,
                     "ts=2026-11-30T07:31:02.123Z level=info prog=wbrokerd event=ev a=1 b=\n");
}
END_TEST

/* What the JSON format makes of a string that wb__log_quote quoted: the
 * string, with each byte that is not UTF-8 as the text \xNN. */
static void expect_json_string(char *out, const char *s)
{
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = wb__utf8_seq((const unsigned char *)s + i, n - i);
        if (k == 0) {
            o += (size_t)sprintf(out + o, "\\x%02x", (unsigned char)s[i]);
            i++;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    out[o] = '\0';
}

START_TEST(test_quote_round_trip)
{
    uint32_t seed = 12345;
    for (int round = 0; round < 20000; round++) {
        char s[48], q[256], want[256];
        size_t n = (seed = seed * 1103515245 + 12345) >> 16 & 31;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245 + 12345;
            unsigned c = seed >> 16 & 0xff;
            /* Mostly what names and messages hold, some of everything. */
            s[i] = c % 4 ? " \"\\=azAZ09\n\t\x7f\xc3\xa9\xe2\x82\xac"[c % 18] : (char)(c | 1);
        }
        s[n] = '\0';
        J("v=%s", wb__log_quote(q, sizeof q, s));
        json_t *o = parsed();
        expect_json_string(want, s);
        ck_assert_msg(strcmp(str(o, "v"), want) == 0, "round %d: %s from %s", round, line, q);
        ck_assert_uint_eq(json_object_size(o), 5);
        json_decref(o);
    }
}
END_TEST

START_TEST(test_always_valid_when_truncated)
{
    /* 20 fields of quoted strings, a number and a real each. */
    char fmt[1024];
    wb_log_arg args[60];
    size_t n = 0;
    char vals[20][96];
    for (int i = 0; i < 20; i++) {
        n += (size_t)snprintf(fmt + n, sizeof fmt - n, " key%d=%%s n%d=%%llu r%d=%%.2f", i, i, i);
        char raw[80];
        snprintf(raw, sizeof raw, "value %d with \"quotes\" and \\ and \n, longer than the rest",
                 i);
        wb__log_quote(vals[i], sizeof vals[i], raw);
        args[3 * i] = (wb_log_arg){.s = vals[i]};
        args[3 * i + 1] = (wb_log_arg){.i = -1};
        args[3 * i + 2] = (wb_log_arg){.d = i + 0.5};
    }
    ck_assert_int_eq(wb__log_format_check(fmt, NULL, NULL, 0), 0);
    wb_log_fields f;
    wb__log_afields(&f, fmt, args, 60);
    ck_assert_uint_eq(f.n, 60);
    ck_assert_int_eq(f.dropped, 0);
    int truncated = 0, whole = 0;
    for (size_t size = 40; size < 4096; size += 37) {
        size_t len = wb__log_render(&f, WB_LOG_JSON, line, size, TS, "warn", "wbrokerd", "ev");
        ck_assert_uint_lt(len, size);
        ck_assert_uint_eq(len, strlen(line));
        ck_assert_int_eq(line[len - 1], '\n');
        json_error_t e;
        json_t *o = json_loads(line, JSON_DECODE_INT_AS_REAL, &e);
        ck_assert_msg(o != NULL, "not JSON at size %zu (%s): %s", size, e.text, line);
        /* The fields that are there are whole, with their types. */
        size_t fields = 0;
        for (int i = 0; i < 20; i++) {
            char key[16], want[96];
            snprintf(want, sizeof want,
                     "value %d with \"quotes\" and \\ and \n, longer than the rest", i);
            snprintf(key, sizeof key, "key%d", i);
            json_t *v = json_object_get(o, key);
            if (v && ++fields)
                ck_assert_str_eq(str(o, key), want);
            snprintf(key, sizeof key, "n%d", i);
            if ((v = json_object_get(o, key)) != NULL && ++fields)
                ck_assert(json_real_value(v) == 18446744073709551615.0);
            snprintf(key, sizeof key, "r%d", i);
            if ((v = json_object_get(o, key)) != NULL && ++fields)
                ck_assert(json_real_value(v) == i + 0.5);
        }
        json_t *t = json_object_get(o, "truncated");
        if (t) {
            truncated++;
            ck_assert(json_is_true(t));
            ck_assert_uint_lt(fields, 60);
        } else {
            whole++;
            ck_assert_uint_eq(fields, 60);
        }
        json_decref(o);
    }
    ck_assert_int_gt(whole, 10);
    ck_assert_int_gt(truncated, 10);
    /* Too small for anything: an empty string, not half an object. */
    ck_assert_uint_eq(wb__log_render(&f, WB_LOG_JSON, line, 8, TS, "info", "p", "e"), 0);
    ck_assert_str_eq(line, "");
    /* Room for the braces only. */
    ck_assert_uint_eq(wb__log_render(&f, WB_LOG_JSON, line, 24, TS, "info", "p", "e"), 19);
    ck_assert_str_eq(line, "{\"truncated\":true}\n");
}
END_TEST

START_TEST(test_field_and_text_limits)
{
    /* Past WB_LOG_MAX_FIELDS: the text keeps them, the JSON says truncated. */
    char fmt[1024];
    size_t n = 0;
    wb_log_arg args[70];
    for (int i = 0; i < 70; i++) {
        n += (size_t)snprintf(fmt + n, sizeof fmt - n, "%sk%d=%%d", i ? " " : "", i);
        args[i] = (wb_log_arg){.i = i};
    }
    wb_log_fields f;
    wb__log_afields(&f, fmt, args, 70);
    ck_assert_uint_eq(f.n, WB_LOG_MAX_FIELDS);
    ck_assert_int_eq(f.dropped, 1);
    ck_assert_ptr_nonnull(strstr(f.text, " k69=69"));
    wb__log_render(&f, WB_LOG_JSON, line, sizeof line, TS, "info", "wbrokerd", "ev");
    ck_assert_ptr_nonnull(strstr(line, ",\"k63\":63,\"truncated\":true}\n"));
    char why[128];
    ck_assert_int_eq(wb__log_format_check(fmt, NULL, why, sizeof why), -1);
    ck_assert_str_eq(why, "more than 64 fields (at offset 438)");

    /* A value the text's end cuts is dropped: a number cut short would be
     * another number. */
    static char big[5000];
    memset(big, 'a', sizeof big - 1);
    wb__log_afields(&f, "n=%d s=%s m=%d", (wb_log_arg[]){{.i = 1}, {.s = big}, {.i = 2}}, 3);
    ck_assert_uint_eq(f.len, WB_LOG_TEXT_SIZE - 1);
    ck_assert_int_eq(f.dropped, 1);
    wb__log_render(&f, WB_LOG_JSON, line, sizeof line, TS, "info", "wbrokerd", "ev");
    ck_assert_str_eq(line + strlen(PREFIX), ",\"n\":1,\"truncated\":true}\n");
    wb__log_afields(&f, "s=%s n=%llu", (wb_log_arg[]){{.s = big + 912}, {.i = 123456}}, 2);
    ck_assert_str_eq(f.text + f.len - 10, "aaaa n=123");
    wb__log_render(&f, WB_LOG_JSON, line, sizeof line, TS, "info", "wbrokerd", "ev");
    ck_assert_ptr_nonnull(strstr(line, "aaaa\",\"truncated\":true}\n"));
    /* The text line the logger writes: 4095 bytes with the newline. */
    size_t len = wb__log_render(&f, WB_LOG_TEXT, line, 4096, TS, "info", "wbrokerd", "ev");
    ck_assert_uint_eq(len, 4095);
    ck_assert_int_eq(line[4094], '\n');
    ck_assert_int_eq(line[4093], 'a');
}
END_TEST

/* No format attribute: these are formats the compiler would question. */
static const char *refused(const char *fmt, ...)
{
    wb_log_fields f;
    va_list ap;
    va_start(ap, fmt);
    wb__log_vfields(&f, fmt, ap);
    va_end(ap);
    ck_assert_int_eq(f.refused, 1);
    wb__log_render(&f, WB_LOG_JSON, line, sizeof line, TS, "info", "wbrokerd", "ev");
    return line + strlen(PREFIX);
}

START_TEST(test_refused_formats)
{
    /* What vsnprintf writes, as one word: the logger cannot tell the
     * fields of a format it does not read. */
    ck_assert_str_eq(refused("a=%*d b=%s", 4, 5, "x"), ",\"text\":\"a=   5 b=x\"}\n");
    ck_assert_str_eq(refused("b=%2$s a=%1$d", 3, "y"), ",\"text\":\"b=y a=3\"}\n");
    /* %n is never run: the format itself is the text. */
    int written = -1;
    ck_assert_str_eq(refused("a=%d%n", 1, &written), ",\"text\":\"a=%d%n\"}\n");
    ck_assert_int_eq(written, -1);
    ck_assert_str_eq(refused("a=%d%5n", 1, &written), ",\"text\":\"a=%d%5n\"}\n");
    ck_assert_int_eq(written, -1);
}
END_TEST

/* Runs fn with stderr going to a file; returns what it wrote. */
static char *capture(void (*fn)(void))
{
    char path[] = "/tmp/wblogjson.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    unlink(path);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    char *buf = calloc(1, (size_t)len + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(pread(fd, buf, (size_t)len, 0), len);
    close(fd);
    return buf;
}

static void log_some(void)
{
    char q[64];
    wb__log_set_prog("wbtest");
    wb_info("model_ready", "model=%s bytes=%d seconds=%.3f", wb__log_quote(q, sizeof q, "a b"), 12,
            0.25);
    wb_debug("hidden", "x=1");
    wb_error("fatal", "error=\"boom\"");
}

START_TEST(test_wb_log_formats)
{
    wb__log_set_level(WB_LOG_INFO);
    ck_assert_int_eq(wb__log_parse_format("json"), WB_LOG_JSON);
    ck_assert_int_eq(wb__log_parse_format("text"), WB_LOG_TEXT);
    ck_assert_int_eq(wb__log_parse_format("yaml"), -1);
    ck_assert_int_eq(wb__log_parse_format(NULL), -1);

    wb__log_set_format(WB_LOG_JSON);
    ck_assert_int_eq(wb__log_get_format(), WB_LOG_JSON);
    char *out = capture(log_some);
    /* Two lines: the debug one is below the level. */
    ck_assert_ptr_null(strstr(out, "hidden"));
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, 2);
    char *second = strchr(out, '\n');
    ck_assert_ptr_nonnull(second);
    *second++ = '\0';
    json_error_t e;
    json_t *a = json_loads(out, 0, &e);
    json_t *b = json_loads(second, 0, &e);
    ck_assert_msg(a && b, "not JSON: %s / %s", out, second);
    ck_assert_str_eq(json_string_value(json_object_get(a, "level")), "info");
    ck_assert_str_eq(json_string_value(json_object_get(a, "prog")), "wbtest");
    ck_assert_str_eq(json_string_value(json_object_get(a, "event")), "model_ready");
    ck_assert_str_eq(json_string_value(json_object_get(a, "model")), "a b");
    ck_assert(json_is_integer(json_object_get(a, "bytes")));
    ck_assert_int_eq(json_integer_value(json_object_get(a, "bytes")), 12);
    ck_assert(json_is_real(json_object_get(a, "seconds")));
    ck_assert(json_real_value(json_object_get(a, "seconds")) == 0.25);
    ck_assert_uint_eq(strlen(json_string_value(json_object_get(a, "ts"))), strlen(TS));
    ck_assert_ptr_nonnull(strstr(out, ",\"bytes\":12,\"seconds\":0.250}"));
    ck_assert_str_eq(json_string_value(json_object_get(b, "level")), "error");
    ck_assert_str_eq(json_string_value(json_object_get(b, "error")), "boom");
    json_decref(a);
    json_decref(b);
    free(out);

    wb__log_set_format(WB_LOG_TEXT);
    out = capture(log_some);
    ck_assert_ptr_nonnull(strstr(out, " level=info prog=wbtest event=model_ready model=\"a b\" "
                                      "bytes=12 seconds=0.250\n"));
    ck_assert_ptr_nonnull(strstr(out, " level=error prog=wbtest event=fatal error=\"boom\"\n"));
    ck_assert_ptr_null(strchr(out, '{'));
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("logjson");
    TCase *tc = tcase_create("logjson");
    tcase_add_test(tc, test_integers);
    tcase_add_test(tc, test_reals);
    tcase_add_test(tc, test_strings);
    tcase_add_test(tc, test_literals_and_quoted_formats);
    tcase_add_test(tc, test_optional_fields);
    tcase_add_test(tc, test_text_line);
    tcase_add_test(tc, test_quote_round_trip);
    tcase_add_test(tc, test_always_valid_when_truncated);
    tcase_add_test(tc, test_field_and_text_limits);
    tcase_add_test(tc, test_refused_formats);
    tcase_add_test(tc, test_wb_log_formats);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
