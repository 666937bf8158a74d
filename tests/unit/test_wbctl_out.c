/* wbctl's JSON output built row by row: an array printed element by element
 * is byte for byte what jansson prints for the whole array as one tree, and
 * a row object reused from row to row (wbctl_jrow) dumps exactly as a fresh
 * object built with json_object_set_new would: hostile strings (quotes,
 * backslashes, control bytes, invalid UTF-8), keys present in some rows only
 * (a session, a real that is not finite), nested arrays, all in any order.
 * Reals print as what they were rounded to; sizes and rates read in IEC
 * units; a table hides its wide-only columns unless it is wide. */
#include "wbctl_out.h"

#include "wbctl.h"

#include <check.h>
#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FLAGS WBCTL_JSON_FLAGS

/* What wbctl printed for a whole array before: json_dumps and puts. */
static char *dump_whole(json_t *arr)
{
    char *s = json_dumps(arr, FLAGS);
    ck_assert_ptr_nonnull(s);
    size_t n = strlen(s);
    char *out = malloc(n + 2);
    ck_assert_ptr_nonnull(out);
    memcpy(out, s, n);
    memcpy(out + n, "\n", 2);
    free(s);
    return out;
}

/* Prints a (and frees it) into a string the caller frees. */
static char *print_array(wbctl_json_array *a)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(wbctl_json_array_print(a, f), 0);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_uint_eq(strlen(buf), len);
    return buf;
}

/* Strings a peer may choose. */
static const char *const HOSTILE[] = {
    "",
    "plain",
    "quote \" and backslash \\ and slash /",
    "\x1b[31mX\nFORGED\x07\r\t\b\f\x7f",
    "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
    "not utf-8: \xff\xfe \xc3( \xed\xa0\x80 end",
    "\xc2\x9b C1",
};
#define N_HOSTILE (sizeof HOSTILE / sizeof HOSTILE[0])

START_TEST(test_array_same_bytes)
{
    /* Empty, one element, many: objects with nested arrays and objects,
     * empty ones, every hostile string as a key and as a value, reals,
     * integers, booleans, null, a bare scalar. */
    for (size_t count = 0; count < 40; count += count < 2 ? 1 : 13) {
        json_t *whole = json_array();
        wbctl_json_array a;
        wbctl_json_array_init(&a);
        for (size_t i = 0; i < count; i++) {
            json_t *o = json_object();
            json_object_set_new(o, "i", json_integer((json_int_t)i - 5));
            json_object_set_new(o, "r", json_real(1796119249.7512748 + (double)i / 3));
            json_object_set_new(o, "s", wbctl_jstr(HOSTILE[i % N_HOSTILE]));
            json_object_set_new(o, "empty", json_array());
            json_object_set_new(o, "none", json_object());
            json_t *nested = json_array();
            for (size_t k = 0; k < i % 3; k++) {
                json_t *n = json_object();
                json_object_set_new(n, "k", json_integer((json_int_t)k));
                json_object_set_new(n, "b", json_boolean(k & 1));
                json_object_set_new(n, "z", json_null());
                json_array_append_new(nested, n);
            }
            json_object_set_new(o, "nested", nested);
            char key[64];
            snprintf(key, sizeof key, "%s", i % N_HOSTILE == 5 ? "k" : HOSTILE[i % N_HOSTILE]);
            json_object_set_new(o, key, json_string("v"));
            json_t *e = i == 7 ? json_integer(42) : o;
            if (e != o)
                json_decref(o);
            json_array_append(whole, e);
            wbctl_json_array_add(&a, e);
        }
        char *want = dump_whole(whole);
        char *got = print_array(&a);
        ck_assert_msg(strcmp(got, want) == 0, "%zu elements:\n--- got\n%s\n--- want\n%s", count,
                      got, want);
        free(want);
        free(got);
        json_decref(whole);
    }
}
END_TEST

START_TEST(test_array_out_of_memory_prints_nothing)
{
    /* An element that could not be built (NULL) fails the whole document:
     * nothing on the output, exit code 1. */
    wbctl_json_array a;
    wbctl_json_array_init(&a);
    wbctl_json_array_add(&a, json_integer(1));
    wbctl_json_array_add(&a, NULL);
    wbctl_json_array_add(&a, json_integer(2));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(wbctl_json_array_print(&a, f), 1);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_uint_eq(len, 0);
    free(buf);
}
END_TEST

/* The fields of row i: every kind, with values and presence that change
 * from row to row in patterns of different periods. */
enum { N_FIELDS = 9 };
static void row_fields(size_t i, wbctl_jfield *f, char *id, size_t id_size)
{
    snprintf(id, id_size, "%032zx", i * 2654435761u);
    static const double reals[] = {1.5, 1796119249.7512748, 0.0, -2.25e-300, 1e300};
    double r = reals[i % 5];
    if (i % 11 == 3)
        r = NAN;
    if (i % 13 == 4)
        r = INFINITY;
    json_t *recs = json_array();
    for (size_t k = 0; k < i % 4; k++) {
        json_t *o = json_object();
        json_object_set_new(o, "container_id", json_integer((json_int_t)k));
        json_object_set_new(o, "model_path", wbctl_jstr(HOSTILE[(i + k) % N_HOSTILE]));
        json_array_append_new(recs, o);
    }
    wbctl_jfield fields[N_FIELDS] = {
        {"id", WBCTL_JSTR, .v.s = id},
        {"model", WBCTL_JSTR, .v.s = i % 6 ? "t28" : HOSTILE[i % N_HOSTILE]},
        {"pid", WBCTL_JINT, .v.i = (json_int_t)(i * 7919) - 3},
        {"session", WBCTL_JSTR, i % 5 != 2, .v.s = "conn:7"},
        {"process", WBCTL_JSTR, .v.s = i % 9 == 8 ? NULL : HOSTILE[(i / 2) % N_HOSTILE]},
        {"granted_at", WBCTL_JREAL, .v.d = r},
        {"age_seconds", WBCTL_JREAL, .v.d = (double)i / 7},
        {"container_records", WBCTL_JNEW, .v.j = recs},
        {"bytes", WBCTL_JINT, .v.i = (json_int_t)(i << 20)},
    };
    memcpy(f, fields, sizeof fields);
}

/* Row i built from scratch as wbctl did before: a value jansson refuses
 * (a NaN) leaves its key out. */
static json_t *row_fresh(size_t i)
{
    wbctl_jfield f[N_FIELDS];
    char id[40];
    row_fields(i, f, id, sizeof id);
    json_t *o = json_object();
    for (size_t k = 0; k < N_FIELDS; k++) {
        json_t *v;
        switch (f[k].type) {
        case WBCTL_JSTR:
            v = wbctl_jstr(f[k].v.s);
            break;
        case WBCTL_JINT:
            v = json_integer(f[k].v.i);
            break;
        case WBCTL_JREAL:
            v = json_real(f[k].v.d);
            break;
        default:
            v = f[k].v.j;
            break;
        }
        if (f[k].absent) {
            json_decref(v);
            continue;
        }
        json_object_set_new(o, f[k].key, v);
    }
    return o;
}

START_TEST(test_row_reused_dumps_as_fresh)
{
    wbctl_jrow r = {0};
    json_t *whole = json_array();
    wbctl_json_array a;
    wbctl_json_array_init(&a);
    for (size_t i = 0; i < 300; i++) {
        wbctl_jfield f[N_FIELDS];
        char id[40];
        row_fields(i, f, id, sizeof id);
        json_t *row = wbctl_jrow_set(&r, f, N_FIELDS);
        ck_assert_ptr_nonnull(row);
        json_t *fresh = row_fresh(i);
        char *got = json_dumps(row, FLAGS);
        char *want = json_dumps(fresh, FLAGS);
        ck_assert_msg(strcmp(got, want) == 0, "row %zu:\n--- got\n%s\n--- want\n%s", i, got, want);
        free(got);
        free(want);
        json_array_append_new(whole, fresh);
        wbctl_json_array_add(&a, row);
    }
    wbctl_jrow_free(&r);
    ck_assert_ptr_null(r.o);
    char *want = dump_whole(whole);
    char *got = print_array(&a);
    ck_assert_msg(strcmp(got, want) == 0, "the array of rows differs");
    free(want);
    free(got);
    json_decref(whole);
}
END_TEST

START_TEST(test_row_out_of_memory)
{
    /* A value that could not be built: no row. The next one builds again. */
    wbctl_jrow r = {0};
    wbctl_jfield f[2] = {
        {"a", WBCTL_JINT, .v.i = 1},
        {"b", WBCTL_JNEW, .v.j = NULL},
    };
    ck_assert_ptr_null(wbctl_jrow_set(&r, f, 2));
    ck_assert_ptr_null(r.o);
    f[1].v.j = json_string("x");
    json_t *row = wbctl_jrow_set(&r, f, 2);
    ck_assert_ptr_nonnull(row);
    char *s = json_dumps(row, JSON_COMPACT | JSON_PRESERVE_ORDER);
    ck_assert_str_eq(s, "{\"a\":1,\"b\":\"x\"}");
    free(s);
    json_decref(row);
    f[1].v.j = NULL;
    ck_assert_ptr_null(wbctl_jrow_set(&r, f, 2));
    ck_assert_ptr_null(r.o);
    wbctl_jrow_free(&r);
}
END_TEST

/* What a table cell or a message shows of a peer's string: printable ASCII
 * and UTF-8 text as they are; controls (C0, DEL, C1) and invalid UTF-8 as
 * \xNN; the Unicode format characters that reorder or hide text (bidi
 * overrides and isolates, zero-width characters, the byte order mark, soft
 * hyphen, tags) and the line and paragraph separators as \u{...}. */
START_TEST(test_escape)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"", ""},
        {"plain /models/m.pt2", "plain /models/m.pt2"},
        {"back\\slash", "back\\\\slash"},
        {"\x1b[2K\rFORGED\n\x07\x7f", "\\x1b[2K\\x0dFORGED\\x0a\\x07\\x7f"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"\xc2\x9b C1", "\\xc2\\x9b C1"},
        {"bad \xff\xc3( \xed\xa0\x80", "bad \\xff\\xc3( \\xed\\xa0\\x80"},
        /* U+202A..U+202E: LRE RLE PDF LRO RLO */
        {"a\xe2\x80\xaa\xe2\x80\xab\xe2\x80\xac\xe2\x80\xad\xe2\x80\xae"
         "b",
         "a\\u{202a}\\u{202b}\\u{202c}\\u{202d}\\u{202e}b"},
        /* U+2066..U+2069: LRI RLI FSI PDI */
        {"\xe2\x81\xa6\xe2\x81\xa7\xe2\x81\xa8\xe2\x81\xa9",
         "\\u{2066}\\u{2067}\\u{2068}\\u{2069}"},
        /* U+200B..U+200F: ZWSP ZWNJ ZWJ LRM RLM; U+2060 WJ; U+FEFF BOM */
        {"\xe2\x80\x8b\xe2\x80\x8c\xe2\x80\x8d\xe2\x80\x8e\xe2\x80\x8f\xe2\x81\xa0\xef\xbb\xbf",
         "\\u{200b}\\u{200c}\\u{200d}\\u{200e}\\u{200f}\\u{2060}\\u{feff}"},
        /* U+2028, U+2029: line and paragraph separators (forged lines) */
        {"x\xe2\x80\xa8y\xe2\x80\xa9z", "x\\u{2028}y\\u{2029}z"},
        /* U+00AD soft hyphen, U+061C arabic letter mark, U+E0041 a tag */
        {"\xc2\xad\xd8\x9c\xf3\xa0\x81\x81", "\\u{00ad}\\u{061c}\\u{e0041}"},
        /* Neighbours that are plain text stay: U+2010 hyphen, U+2030 per
         * mille, U+2070 superscript zero, U+FEFE, U+00AC. */
        {"\xe2\x80\x90\xe2\x80\xb0\xe2\x81\xb0\xef\xbb\xbe\xc2\xac",
         "\xe2\x80\x90\xe2\x80\xb0\xe2\x81\xb0\xef\xbb\xbe\xc2\xac"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = wbctl_escape(cases[i].in);
        ck_assert_ptr_nonnull(got);
        ck_assert_msg(strcmp(got, cases[i].want) == 0, "case %zu: got '%s', want '%s'", i, got,
                      cases[i].want);
        free(got);
    }
    char *null = wbctl_escape(NULL);
    ck_assert_str_eq(null, "");
    free(null);
}
END_TEST

/* The worst case for the output's size: every character a format one, of
 * each length (U+00AD is 2 bytes and 8 escaped, the most per byte). */
START_TEST(test_escape_worst_case)
{
    static const char *const units[] = {"\xc2\xad", "\xe2\x80\xae", "\xf3\xa0\x81\x81", "\x01"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        char in[4096] = "";
        size_t n = 0, k = strlen(units[u]);
        while (n + k < sizeof in) {
            memcpy(in + n, units[u], k);
            n += k;
        }
        in[n] = '\0';
        char *got = wbctl_escape(in);
        ck_assert_ptr_nonnull(got);
        ck_assert_uint_le(strlen(got), 4 * n);
        ck_assert_ptr_null(strchr(got, 0x1b));
        ck_assert_uint_eq(strspn(got, "\\u{}0123456789abcdefx"), strlen(got));
        free(got);
    }
}
END_TEST

/* A table escapes every cell, the header's and the data's alike. */
START_TEST(test_table_escapes_cells)
{
    fflush(stdout);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    int saved = dup(STDOUT_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(tmp), STDOUT_FILENO), 0);
    wbctl_table t = {.ncols = 2};
    wbctl_table_add(&t, "NAME", "ERROR");
    wbctl_table_add(&t, "m\xe2\x80\xaegp.exe", "\x1b[1A\x1b[2Kok\nFORGED");
    wbctl_table_print(&t);
    fflush(stdout);
    ck_assert_int_ge(dup2(saved, STDOUT_FILENO), 0);
    close(saved);
    char out[512];
    rewind(tmp);
    size_t n = fread(out, 1, sizeof out - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
    ck_assert_str_eq(out, "NAME             ERROR\n"
                          "m\\u{202e}gp.exe  \\x1b[1A\\x1b[2Kok\\x0aFORGED\n");
}
END_TEST

/* What fn(arg) printed on stdout. */
static char *capture_stdout(void (*fn)(void *), void *arg)
{
    fflush(stdout);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    int saved = dup(STDOUT_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(tmp), STDOUT_FILENO), 0);
    fn(arg);
    fflush(stdout);
    ck_assert_int_ge(dup2(saved, STDOUT_FILENO), 0);
    close(saved);
    long n = ftell(tmp);
    ck_assert_int_ge(n, 0);
    char *out = calloc(1, (size_t)n + 1);
    ck_assert_ptr_nonnull(out);
    rewind(tmp);
    ck_assert_uint_eq(fread(out, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    return out;
}

START_TEST(test_fmt_size)
{
    static const struct {
        uint64_t bytes;
        const char *text;
    } cases[] = {
        {0, "0 B"},
        {1, "1 B"},
        {512, "512 B"},
        {1023, "1023 B"},
        {1024, "1.0 KiB"},
        {1536, "1.5 KiB"},
        {126464, "123.5 KiB"},
        /* 1023.999 KiB would round to "1024.0 KiB": the next unit. */
        {1048575, "1.0 MiB"},
        {1048576, "1.0 MiB"},
        {1288490189, "1.2 GiB"},
        {2147483648ull, "2.0 GiB"},
        {1099511627776ull, "1.0 TiB"},
        {1125899906842624ull, "1.0 PiB"},
        {UINT64_MAX, "16.0 EiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[32];
        ck_assert_ptr_eq(wbctl_fmt_size(buf, sizeof buf, cases[i].bytes), buf);
        ck_assert_msg(strcmp(buf, cases[i].text) == 0, "%llu bytes: '%s', want '%s'",
                      (unsigned long long)cases[i].bytes, buf, cases[i].text);
    }
}
END_TEST

START_TEST(test_fmt_rate)
{
    char buf[32];
    ck_assert_str_eq(wbctl_fmt_rate(buf, sizeof buf, 0), "0 B/s");
    ck_assert_str_eq(wbctl_fmt_rate(buf, sizeof buf, -5), "0 B/s");
    ck_assert_str_eq(wbctl_fmt_rate(buf, sizeof buf, NAN), "0 B/s");
    ck_assert_str_eq(wbctl_fmt_rate(buf, sizeof buf, 999.4), "999 B/s");
    ck_assert_str_eq(wbctl_fmt_rate(buf, sizeof buf, 1.5 * 1024 * 1024 * 1024), "1.5 GiB/s");
    /* The broker's GB/s are 10^9 bytes a second. */
    ck_assert_str_eq(wbctl_fmt_gbps(buf, sizeof buf, 1.0), "953.7 MiB/s");
    ck_assert_str_eq(wbctl_fmt_gbps(buf, sizeof buf, 12.5), "11.6 GiB/s");
}
END_TEST

static void print_reals(void *arg)
{
    (void)arg;
    json_t *o = json_object();
    json_object_set_new(o, "tenth", json_real(0.1));
    json_object_set_new(o, "sum", json_real(0.1 + 0.2));
    json_object_set_new(o, "secs", json_real(wbctl_round_secs(12.3456789)));
    json_object_set_new(o, "tiny", json_real(wbctl_round_secs(0.0000004)));
    json_object_set_new(o, "time", json_real(wbctl_round_time(1764500000.1234567)));
    json_object_set_new(o, "third", json_real(1.0 / 3));
    json_object_set_new(o, "bytes", json_integer(2147483648ll));
    ck_assert_int_eq(wbctl_print_json(o), 0);
}

/* Reals print as the value they stand for: 0.1, never 0.10000000000000001;
 * seconds to the microsecond, times to the millisecond; integers exact. */
START_TEST(test_json_reals)
{
    char *out = capture_stdout(print_reals, NULL);
    ck_assert_str_eq(out, "{\n"
                          "  \"tenth\": 0.1,\n"
                          "  \"sum\": 0.3,\n"
                          "  \"secs\": 12.345679,\n"
                          "  \"tiny\": 0.0,\n"
                          "  \"time\": 1764500000.123,\n"
                          "  \"third\": 0.333333333333333,\n"
                          "  \"bytes\": 2147483648\n"
                          "}\n");
    free(out);
}
END_TEST

static const wbctl_column COLS[] = {{"NAME", 0}, {"EXTRA", 1}, {"SIZE", 0}, {"TAIL", 1}};

static void print_table(void *arg)
{
    wbctl_table t = {.wide = *(int *)arg};
    wbctl_table_columns(&t, COLS, 4);
    ck_assert_uint_eq(t.ncols, 4);
    wbctl_table_add(&t, "alpha", "x", "2.0 GiB", "last");
    wbctl_table_add(&t, "b", "longer extra", "512 B", "-");
    wbctl_table_print(&t);
    ck_assert_uint_eq(t.nrows, 0);
}

/* The default view leaves the wide-only columns out (their widths too) and
 * pads no column after the last one shown; -o wide shows them all. */
START_TEST(test_table_wide_columns)
{
    int wide = 0;
    char *out = capture_stdout(print_table, &wide);
    ck_assert_str_eq(out, "NAME   SIZE\n"
                          "alpha  2.0 GiB\n"
                          "b      512 B\n");
    free(out);
    wide = 1;
    out = capture_stdout(print_table, &wide);
    ck_assert_str_eq(out, "NAME   EXTRA         SIZE     TAIL\n"
                          "alpha  x             2.0 GiB  last\n"
                          "b      longer extra  512 B    -\n");
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("wbctl_out");
    TCase *tc = tcase_create("wbctl_out");
    tcase_add_test(tc, test_array_same_bytes);
    tcase_add_test(tc, test_array_out_of_memory_prints_nothing);
    tcase_add_test(tc, test_row_reused_dumps_as_fresh);
    tcase_add_test(tc, test_row_out_of_memory);
    tcase_add_test(tc, test_escape);
    tcase_add_test(tc, test_escape_worst_case);
    tcase_add_test(tc, test_table_escapes_cells);
    tcase_add_test(tc, test_fmt_size);
    tcase_add_test(tc, test_fmt_rate);
    tcase_add_test(tc, test_json_reals);
    tcase_add_test(tc, test_table_wide_columns);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
