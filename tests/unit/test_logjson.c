/* The logger's JSON format: the key=value tail becomes string fields (quoted
 * values unquoted, \xNN escapes decoded, bytes that are not UTF-8 kept as
 * the text \xNN, stray words in "text"); every line is one valid JSON
 * object, however small the buffer; wb__log writes such lines when the
 * format is json and plain text otherwise. */
#include "log.h"

#include <check.h>
#include <jansson.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const TS = "2026-11-30T07:31:02.123Z";

/* Converts and parses; the caller frees the object. */
static json_t *convert(const char *kv, char *out, size_t size)
{
    size_t len = wb__log_json_line(out, size, TS, "info", "wbrokerd", "ev", kv);
    ck_assert_uint_eq(len, strlen(out));
    ck_assert_msg(len > 0 && out[len - 1] == '\n', "no newline: %s", out);
    json_error_t e;
    json_t *o = json_loadb(out, len, 0, &e);
    ck_assert_msg(o != NULL, "not JSON (%s): %s", e.text, out);
    ck_assert(json_is_object(o));
    return o;
}

static const char *field(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(v != NULL, "no field %s", key);
    ck_assert_msg(json_is_string(v), "field %s is not a string", key);
    return json_string_value(v);
}

START_TEST(test_plain_fields)
{
    char out[1024];
    json_t *o = convert(" model=demo bytes=4096 gbps=1.5", out, sizeof out);
    ck_assert_str_eq(out, "{\"ts\":\"2026-11-30T07:31:02.123Z\",\"level\":\"info\","
                          "\"prog\":\"wbrokerd\",\"event\":\"ev\",\"model\":\"demo\","
                          "\"bytes\":\"4096\",\"gbps\":\"1.5\"}\n");
    ck_assert_uint_eq(json_object_size(o), 7);
    json_decref(o);
    o = convert("", out, sizeof out);
    ck_assert_uint_eq(json_object_size(o), 4);
    ck_assert_str_eq(field(o, "event"), "ev");
    json_decref(o);
}
END_TEST

START_TEST(test_quoted_values)
{
    char out[1024], q1[128], q2[128], q3[128], kv[512];
    /* Values as the text format quotes them. */
    snprintf(kv, sizeof kv, " error=%s path=%s ctl=%s empty=%s",
             wb__log_quote(q1, sizeof q1, "no such file: /a b"),
             wb__log_quote(q2, sizeof q2, "x\"y\\z=w"), wb__log_quote(q3, sizeof q3, "a\nb\tc"),
             "\"\"");
    json_t *o = convert(kv, out, sizeof out);
    ck_assert_str_eq(field(o, "error"), "no such file: /a b");
    ck_assert_str_eq(field(o, "path"), "x\"y\\z=w");
    ck_assert_str_eq(field(o, "ctl"), "a\nb\tc");
    ck_assert_str_eq(field(o, "empty"), "");
    json_decref(o);
}
END_TEST

START_TEST(test_bytes_and_words)
{
    char out[1024];
    /* UTF-8 passes through; a lone 0xff is kept as the text \xff. */
    json_t *o = convert(" name=caf\xc3\xa9 raw=a\xff"
                        "b loose words here",
                        out, sizeof out);
    ck_assert_str_eq(field(o, "name"), "caf\xc3\xa9");
    ck_assert_str_eq(field(o, "raw"), "a\\xffb");
    ck_assert_str_eq(field(o, "text"), "loose words here");
    json_decref(o);
    /* An unterminated quote (a truncated text line) takes the rest. */
    o = convert(" a=1 msg=\"cut off here", out, sizeof out);
    ck_assert_str_eq(field(o, "a"), "1");
    ck_assert_str_eq(field(o, "msg"), "cut off here");
    json_decref(o);
}
END_TEST

START_TEST(test_always_valid_when_truncated)
{
    char kv[2048];
    size_t n = 0;
    for (int i = 0; i < 60; i++)
        n += (size_t)snprintf(kv + n, sizeof kv - n, " key%d=\"value %d with \\\"quotes\\\"\"", i,
                              i);
    char out[4096];
    int truncated = 0;
    for (size_t size = 40; size < sizeof out; size += 37) {
        size_t len = wb__log_json_line(out, size, TS, "warn", "wbrokerd", "ev", kv);
        ck_assert_uint_lt(len, size);
        json_t *o = convert(kv, out, size);
        if (json_object_get(o, "truncated")) {
            truncated++;
            ck_assert_str_eq(field(o, "truncated"), "true");
        } else {
            ck_assert_str_eq(field(o, "key59"), "value 59 with \"quotes\"");
        }
        json_decref(o);
    }
    ck_assert_int_gt(truncated, 10);
    /* Too small for anything: an empty string, not half an object. */
    ck_assert_uint_eq(wb__log_json_line(out, 8, TS, "info", "p", "e", ""), 0);
    ck_assert_str_eq(out, "");
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
    wb_info("model_ready", "model=%s bytes=%d", wb__log_quote(q, sizeof q, "a b"), 12);
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
    ck_assert_str_eq(field(a, "level"), "info");
    ck_assert_str_eq(field(a, "prog"), "wbtest");
    ck_assert_str_eq(field(a, "event"), "model_ready");
    ck_assert_str_eq(field(a, "model"), "a b");
    ck_assert_str_eq(field(a, "bytes"), "12");
    ck_assert_uint_eq(strlen(field(a, "ts")), strlen(TS));
    ck_assert_str_eq(field(b, "level"), "error");
    ck_assert_str_eq(field(b, "error"), "boom");
    json_decref(a);
    json_decref(b);
    free(out);

    wb__log_set_format(WB_LOG_TEXT);
    out = capture(log_some);
    ck_assert_ptr_nonnull(strstr(out, " level=info prog=wbtest event=model_ready model=\"a b\" "
                                      "bytes=12\n"));
    ck_assert_ptr_null(strchr(out, '{'));
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("logjson");
    TCase *tc = tcase_create("logjson");
    tcase_add_test(tc, test_plain_fields);
    tcase_add_test(tc, test_quoted_values);
    tcase_add_test(tc, test_bytes_and_words);
    tcase_add_test(tc, test_always_valid_when_truncated);
    tcase_add_test(tc, test_wb_log_formats);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
