/* How wbctl shows a model (wbctl_model.c): whatever the broker sent in a
 * ModelInfo (a copy's error, the load mode, names, paths, UUIDs) reaches the
 * terminal escaped in the table, in the failure lines under it and in the
 * stage line, and --json keeps each string exact (invalid UTF-8 as
 * U+FFFD), never dropping a key jansson refused. */
#include "wbctl_model.h"

#include <check.h>
#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Terminal escapes (erase the line, move up), a forged line, a bidi
 * override, a zero-width space and a byte of invalid UTF-8. */
#define HOSTILE                                                                                    \
    "\x1b[2K\x1b[1Aok\nFORGED \xe2\x80\xae"                                                        \
    "exe.txt\xe2\x80\x8b\xff"
#define HOSTILE_SHOWN "\\x1b[2K\\x1b[1Aok\\x0aFORGED \\u{202e}exe.txt\\u{200b}\\xff"
#define HOSTILE_JSON                                                                               \
    "\x1b[2K\x1b[1Aok\nFORGED \xe2\x80\xae"                                                        \
    "exe.txt\xe2\x80\x8b\xef\xbf\xbd"

typedef struct hostile_model {
    Wbproto__ModelInfo m;
    Wbproto__ModelCopy c[2];
    Wbproto__ModelCopy *cp[2];
} hostile_model;

/* A model on two devices whose second copy failed, every string hostile. */
static void hostile_init(hostile_model *h)
{
    wbproto__model_info__init(&h->m);
    h->m.name = "m" HOSTILE;
    h->m.path = "/models/" HOSTILE;
    h->m.state = WBPROTO__MODEL_STATE__MODEL_READY;
    h->m.backend = WBPROTO__BACKEND__BACKEND_CUDA;
    h->m.transport = "cuda-ipc" HOSTILE;
    h->m.access = "rw" HOSTILE;
    h->m.error = "load " HOSTILE;
    h->m.load_mode = "staged" HOSTILE;
    h->m.read_threads = 4;
    for (int k = 0; k < 2; k++) {
        wbproto__model_copy__init(&h->c[k]);
        h->c[k].device = k;
        h->cp[k] = &h->c[k];
    }
    h->c[0].state = WBPROTO__MODEL_STATE__MODEL_READY;
    h->c[0].device_uuid = "GPU-00000000-0000-0000-0000-000000000000";
    h->c[1].state = WBPROTO__MODEL_STATE__MODEL_FAILED;
    h->c[1].device_uuid = "GPU-" HOSTILE;
    h->c[1].error = "copy " HOSTILE;
    h->m.n_copies = 2;
    h->m.copies = h->cp;
}

/* What fn printed on stdout. */
static char *capture(void (*fn)(const Wbproto__ModelInfo *), const Wbproto__ModelInfo *m)
{
    fflush(stdout);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    int saved = dup(STDOUT_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(tmp), STDOUT_FILENO), 0);
    fn(m);
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

/* Nothing a terminal acts on: no control byte but the line ends, no C1,
 * no format character. */
static void assert_inert(const char *out)
{
    for (const unsigned char *p = (const unsigned char *)out; *p; p++) {
        ck_assert_msg(*p == '\n' || (*p >= 0x20 && *p != 0x7f),
                      "control byte 0x%02x at %td in '%s'", *p, (const char *)p - out, out);
        ck_assert_msg(*p != 0xff, "invalid UTF-8 printed: '%s'", out);
    }
    ck_assert_ptr_null(strstr(out, "\xe2\x80\xae"));
    ck_assert_ptr_null(strstr(out, "\xe2\x80\x8b"));
}

static void print_rows(const Wbproto__ModelInfo *m)
{
    wbctl_table t = {.ncols = WBCTL_MODEL_COLUMNS};
    wbctl_model_header(&t);
    wbctl_model_row(&t, m);
    wbctl_table_print(&t);
}

static void print_rows_wide(const Wbproto__ModelInfo *m)
{
    wbctl_table t = {.ncols = WBCTL_MODEL_COLUMNS, .wide = 1};
    wbctl_model_header(&t);
    wbctl_model_row(&t, m);
    wbctl_table_print(&t);
}

START_TEST(test_failures_escaped)
{
    hostile_model h;
    hostile_init(&h);
    char *out = capture(wbctl_model_failures, &h.m);
    assert_inert(out);
    ck_assert_str_eq(out, "m" HOSTILE_SHOWN " on device 1 (GPU-" HOSTILE_SHOWN
                          ") failed: copy " HOSTILE_SHOWN "\n");
    free(out);
}
END_TEST

START_TEST(test_stages_escaped)
{
    hostile_model h;
    hostile_init(&h);
    char *out = capture(wbctl_print_stages, &h.m);
    assert_inert(out);
    ck_assert_str_eq(out, "load: staged" HOSTILE_SHOWN ", 4 threads; read 0 B/s, hash 0 B/s\n");
    free(out);
}
END_TEST

START_TEST(test_rows_escaped)
{
    hostile_model h;
    hostile_init(&h);
    char *out = capture(print_rows, &h.m);
    assert_inert(out);
    /* The header and one row per device, each line one row. */
    size_t lines = 0;
    for (const char *p = out; (p = strchr(p, '\n')); p++)
        lines++;
    ck_assert_uint_eq(lines, 3);
    /* A broker that predates versions: VERSION "-". */
    ck_assert_ptr_nonnull(strstr(out, "m" HOSTILE_SHOWN "  -        ready"));
    ck_assert_ptr_nonnull(strstr(out, "cuda-ipc" HOSTILE_SHOWN "  rw" HOSTILE_SHOWN "\n"));
    free(out);
    /* -o wide adds the checksums' state and the path, escaped as well. */
    out = capture(print_rows_wide, &h.m);
    assert_inert(out);
    ck_assert_ptr_nonnull(
        strstr(out, "rw" HOSTILE_SHOWN "  ready      /models/" HOSTILE_SHOWN "\n"));
    free(out);
}
END_TEST

/* A stage line on a real load: sizes and rates in IEC units, GiB/s. */
START_TEST(test_stages_units)
{
    Wbproto__ModelInfo m;
    wbproto__model_info__init(&m);
    m.load_mode = "staged";
    m.read_threads = 1;
    m.staging_buffers = 64;
    m.staging_buffer_bytes = 2 << 20;
    m.read_gbps = 12.5;
    m.hash_gbps = 1.0;
    m.copy_seconds = 0.5;
    m.copy_gbps = 25;
    char *out = capture(wbctl_print_stages, &m);
    ck_assert_str_eq(out, "load: staged, 1 thread, 64 x 2.0 MiB pinned staging; read 11.6 GiB/s, "
                          "hash 953.7 MiB/s, copy 23.3 GiB/s\n");
    free(out);
}
END_TEST

/* The default header and the wide one, as the man page shows them. */
START_TEST(test_headers)
{
    Wbproto__ModelInfo m;
    wbproto__model_info__init(&m);
    m.name = "base";
    m.path = "/models/base";
    m.state = WBPROTO__MODEL_STATE__MODEL_LOADING;
    m.backend = WBPROTO__BACKEND__BACKEND_HOST;
    m.device = -1;
    m.bytes = 2147483648ull;
    m.loaded_bytes = m.bytes / 4;
    char *out = capture(print_rows, &m);
    ck_assert_str_eq(
        out, "NAME  VERSION  STATE        BACKEND  DEVICE  TENSORS  SIZE     SHARED  LEASES  "
             "SLAB  ACCESS\n"
             "base  -        loading 25%  host     -1      0        2.0 GiB  -       0       "
             "-     -\n");
    free(out);
    out = capture(print_rows_wide, &m);
    ck_assert_str_eq(
        out,
        "NAME  VERSION  STATE        TIER    BACKEND  DEVICE  TENSORS  SIZE     SHARED  LEASES  "
        "LOAD_S  RATE  SLAB  ACCESS  CHECKSUMS  SOURCE\n"
        "base  -        loading 25%  device  host     -1      0        2.0 GiB  -       0       "
        "-       -     -     -       -          /models/base\n");
    free(out);
}
END_TEST

START_TEST(test_json_exact)
{
    hostile_model h;
    hostile_init(&h);
    json_t *o = wbctl_model_json(&h.m);
    ck_assert_ptr_nonnull(o);
    static const char *const keys[] = {"name", "path", "transport", "access", "error", "load_mode"};
    static const char *const prefix[] = {"m", "/models/", "cuda-ipc", "rw", "load ", "staged"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char want[256];
        snprintf(want, sizeof want, "%s%s", prefix[i], HOSTILE_JSON);
        const char *got = json_string_value(json_object_get(o, keys[i]));
        ck_assert_msg(got != NULL, "key %s is missing", keys[i]);
        ck_assert_str_eq(got, want);
    }
    json_t *c = json_array_get(json_object_get(o, "copies"), 1);
    ck_assert_str_eq(json_string_value(json_object_get(c, "uuid")), "GPU-" HOSTILE_JSON);
    ck_assert_str_eq(json_string_value(json_object_get(c, "error")), "copy " HOSTILE_JSON);
    ck_assert_str_eq(json_string_value(json_object_get(c, "state")), "failed");
    /* Valid JSON that reads back the same. */
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    ck_assert_ptr_nonnull(s);
    json_error_t je;
    json_t *back = json_loads(s, 0, &je);
    ck_assert_msg(back != NULL, "not JSON: %s", je.text);
    ck_assert(json_equal(back, o));
    json_decref(back);
    free(s);
    json_decref(o);
}
END_TEST

/* A model the device memory budget moved off its device: STATE (and the
 * JSON state) says its tier instead of current, -o wide's TIER too, and the
 * JSON has its tier's fields; a broker that predates tiers (an empty tier)
 * is on its device. */
START_TEST(test_tier)
{
    Wbproto__ModelInfo m;
    wbproto__model_info__init(&m);
    m.name = "emb";
    m.path = "/models/emb";
    m.version = 3;
    m.current = 1;
    m.state = WBPROTO__MODEL_STATE__MODEL_READY;
    m.backend = WBPROTO__BACKEND__BACKEND_HOST;
    m.device = -1;
    json_t *o = wbctl_model_json(&m);
    ck_assert_str_eq(json_string_value(json_object_get(o, "state")), "ready");
    ck_assert_str_eq(json_string_value(json_object_get(o, "tier")), "device");
    json_decref(o);
    o = wbctl_version_json(&m);
    ck_assert_str_eq(json_string_value(json_object_get(o, "state")), "current");
    ck_assert_str_eq(json_string_value(json_object_get(o, "tier")), "device");
    json_decref(o);

    m.tier = "host";
    m.host_bytes = 1536;
    m.restores = 2;
    m.last_restore_seconds = 0.25;
    m.last_restore_gbps = 4.5;
    m.last_restore_at = 1700000000.125;
    m.last_used_at = 1700000001.5;
    char *out = capture(print_rows, &m);
    ck_assert_ptr_nonnull(strstr(out, "\nemb   3        host   host "));
    free(out);
    out = capture(print_rows_wide, &m);
    ck_assert_ptr_nonnull(strstr(out, "\nemb   3        host   host  host "));
    free(out);
    o = wbctl_model_json(&m);
    ck_assert_str_eq(json_string_value(json_object_get(o, "state")), "host");
    ck_assert_str_eq(json_string_value(json_object_get(o, "tier")), "host");
    ck_assert_int_eq(json_integer_value(json_object_get(o, "host_bytes")), 1536);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "restores")), 2);
    ck_assert(json_real_value(json_object_get(o, "last_restore_seconds")) == 0.25);
    ck_assert(json_real_value(json_object_get(o, "last_restore_gbps")) == 4.5);
    ck_assert(json_real_value(json_object_get(o, "last_restore_at")) == 1700000000.125);
    ck_assert(json_real_value(json_object_get(o, "last_used_at")) == 1700000001.5);
    json_decref(o);
    o = wbctl_version_json(&m);
    ck_assert_str_eq(json_string_value(json_object_get(o, "state")), "host");
    json_decref(o);

    /* A tier is the broker's string: escaped for the terminal, exact in
     * JSON. A version that is not ready keeps its state. */
    m.tier = "x" HOSTILE;
    out = capture(print_rows_wide, &m);
    assert_inert(out);
    free(out);
    o = wbctl_model_json(&m);
    ck_assert_str_eq(json_string_value(json_object_get(o, "tier")), "x" HOSTILE_JSON);
    json_decref(o);
    m.tier = "host";
    m.state = WBPROTO__MODEL_STATE__MODEL_DRAINING;
    o = wbctl_model_json(&m);
    ck_assert_str_eq(json_string_value(json_object_get(o, "state")), "draining");
    json_decref(o);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("wbctl_model");
    TCase *tc = tcase_create("wbctl_model");
    tcase_add_test(tc, test_failures_escaped);
    tcase_add_test(tc, test_stages_escaped);
    tcase_add_test(tc, test_rows_escaped);
    tcase_add_test(tc, test_stages_units);
    tcase_add_test(tc, test_headers);
    tcase_add_test(tc, test_json_exact);
    tcase_add_test(tc, test_tier);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
