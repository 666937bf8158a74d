/* The configuration file reader: a valid file becomes the exact "--key=value"
 * arguments with their line numbers (a model's: its path's); comments start
 * with '#' or ';' at the start of a line or after a space or tab, and either
 * character elsewhere stays in the value; every kind of mistake (unknown
 * section or key, a key or section twice, a model without path, a bad device
 * or model name, lines that are not INI, lines too long, unreadable files) is
 * refused with its status and a message naming the file and line; --model
 * values are split into name, device and path. */
#include "config.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A stand-in for wbrokerd's option table: the reader only needs the names
 * and whether each takes a value. */
static const struct option opts[] = {
    {"socket", required_argument, NULL, 's'},
    {"backend", required_argument, NULL, 'b'},
    {"model", required_argument, NULL, 'm'},
    {"heartbeat-ms", required_argument, NULL, 'H'},
    {"stale-ms", required_argument, NULL, 'S'},
    {"foreground", no_argument, NULL, 'f'},
    {"config", required_argument, NULL, 'c'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};
static const char *const exclude[] = {"config", "help", NULL};

static char path[64];
static wb_config cfg;
static wb_err err;

static void setup(void)
{
    snprintf(path, sizeof path, "/tmp/wbconfig.XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    memset(&cfg, 0, sizeof cfg);
    memset(&err, 0, sizeof err);
}

static void teardown(void)
{
    wb__config_free(&cfg);
    unlink(path);
}

/* Writes the file and loads it. */
static int load(const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return wb__config_load(path, opts, exclude, &cfg, &err);
}

/* The message must be exactly "PATH:LINE: what". */
static void assert_error_at(int line, const char *what)
{
    char want[WB_ERR_MSG_MAX];
    snprintf(want, sizeof want, "%s:%d: %s", path, line, what);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(cfg.n_args, 0);
    ck_assert_ptr_null(cfg.args);
}

START_TEST(test_valid_file)
{
    int rc = load("# a comment\n"
                  "; another comment\n"
                  "\n"
                  "[broker]\n"
                  "socket = /run/wbroker/broker.sock ; inline comment\n"
                  "  heartbeat_ms=250\n"
                  "stale-ms : 900\n"
                  "foreground = yes\n"
                  "\n"
                  "[model llama]\n"
                  "path = /models/llama.safetensors\n"
                  "[model  tiny.v2 ]\n"
                  "device = 0\n"
                  "path = /models/with space/tiny\n");
    ck_assert_msg(rc == WB_OK, "%s", err.msg);
    ck_assert_int_eq(cfg.n_args, 6);
    const char *want[] = {"--socket=/run/wbroker/broker.sock",
                          "--heartbeat-ms=250",
                          "--stale-ms=900",
                          "--foreground",
                          "--model=llama=/models/llama.safetensors",
                          "--model=tiny.v2@0=/models/with space/tiny"};
    const int lines[] = {5, 6, 7, 8, 11, 14};
    for (int i = 0; i < 6; i++) {
        ck_assert_str_eq(cfg.args[i], want[i]);
        ck_assert_int_eq(cfg.lines[i], lines[i]);
    }
    ck_assert_str_eq(cfg.file, path);
}
END_TEST

START_TEST(test_comments)
{
    int rc = load("# a whole line\n"
                  "   # indented\n"
                  "[broker]   # after a section header\n"
                  "socket = /run/wb#1/broker.sock  # a '#' inside a value stays\n"
                  "backend = host\t# after a tab\n"
                  "heartbeat-ms = 250 ; the other prefix\n"
                  "stale-ms = 900;not a comment\n"
                  "foreground = yes #\n"
                  "[model m]   ; why\n"
                  "path = /models/run#3/m.safetensors # the third run\n"
                  "devices = 0,1  # two copies\n");
    ck_assert_msg(rc == WB_OK, "%s", err.msg);
    const char *want[] = {"--socket=/run/wb#1/broker.sock",
                          "--backend=host",
                          "--heartbeat-ms=250",
                          "--stale-ms=900;not a comment",
                          "--foreground",
                          "--model=m@0,1=/models/run#3/m.safetensors"};
    const int lines[] = {4, 5, 6, 7, 8, 10};
    ck_assert_int_eq(cfg.n_args, 6);
    for (int i = 0; i < 6; i++) {
        ck_assert_str_eq(cfg.args[i], want[i]);
        ck_assert_int_eq(cfg.lines[i], lines[i]);
    }
    wb__config_free(&cfg);
    /* A value that starts with a comment is empty; a key whose '=' is in a
     * comment is no key. */
    ck_assert_int_eq(load("[broker]\nsocket = # later\n"), WB_OK);
    ck_assert_int_eq(cfg.n_args, 1);
    ck_assert_str_eq(cfg.args[0], "--socket=");
    wb__config_free(&cfg);
    ck_assert_int_eq(load("[broker]\nsocket # = /a\n"), WB_EFORMAT);
    assert_error_at(2, "expected 'key = value', '[section]' or a comment, not 'socket'");
}
END_TEST

START_TEST(test_empty_and_false)
{
    ck_assert_int_eq(load(""), WB_OK);
    ck_assert_int_eq(cfg.n_args, 0);
    wb__config_free(&cfg);
    /* A boolean set to false adds nothing; an empty [broker] is fine. */
    ck_assert_int_eq(load("[broker]\nforeground = off\n"), WB_OK);
    ck_assert_int_eq(cfg.n_args, 0);
}
END_TEST

START_TEST(test_bom_crlf_long_names)
{
    /* inih keeps only 50 characters of a section name; the reader does not
     * depend on that. */
    char name[201];
    memset(name, 'n', 200);
    name[200] = '\0';
    char text[1024];
    snprintf(text, sizeof text,
             "\xEF\xBB\xBF[broker]\r\nsocket = /s\r\n[model %s]\r\npath = /p\r\n", name);
    ck_assert_msg(load(text) == WB_OK, "%s", err.msg);
    ck_assert_int_eq(cfg.n_args, 2);
    ck_assert_str_eq(cfg.args[0], "--socket=/s");
    char want[300];
    snprintf(want, sizeof want, "--model=%s=/p", name);
    ck_assert_str_eq(cfg.args[1], want);
    ck_assert_int_eq(cfg.lines[1], 4);
}
END_TEST

START_TEST(test_long_value)
{
    /* Paths longer than inih's own 200-byte line buffer are read whole. */
    char *text = malloc(4000);
    ck_assert_ptr_nonnull(text);
    int n = snprintf(text, 4000, "[broker]\nsocket = /");
    memset(text + n, 'a', 3000);
    strcpy(text + n + 3000, "\nstale-ms = 5\n");
    int rc = load(text);
    free(text);
    ck_assert_msg(rc == WB_OK, "%s", err.msg);
    ck_assert_int_eq(cfg.n_args, 2);
    ck_assert_uint_eq(strlen(cfg.args[0]), strlen("--socket=/") + 3000);
    ck_assert_str_eq(cfg.args[1], "--stale-ms=5");
    ck_assert_int_eq(cfg.lines[1], 3);
}
END_TEST

START_TEST(test_line_too_long)
{
    char *text = malloc(20000);
    ck_assert_ptr_nonnull(text);
    int n = snprintf(text, 20000, "[broker]\n\nsocket = /");
    memset(text + n, 'a', 10000);
    strcpy(text + n + 10000, "\n");
    int rc = load(text);
    free(text);
    ck_assert_int_eq(rc, WB_EFORMAT);
    ck_assert_msg(strstr(err.msg, ":3: the line has 10010 characters, at most ") != NULL, "%s",
                  err.msg);
}
END_TEST

START_TEST(test_unknown_key)
{
    ck_assert_int_eq(load("[broker]\nsocket = /a\n\nsokcet = /b\n"), WB_EINVAL);
    assert_error_at(4, "unknown key 'sokcet' in [broker] (did you mean 'socket'?)");
}
END_TEST

START_TEST(test_unknown_key_no_hint)
{
    ck_assert_int_eq(load("[broker]\nwhatever = 1\n"), WB_EINVAL);
    assert_error_at(2, "unknown key 'whatever' in [broker]");
}
END_TEST

START_TEST(test_unknown_model_key)
{
    ck_assert_int_eq(load("[model a]\npath = /p\npaht = /q\n"), WB_EINVAL);
    assert_error_at(3, "unknown key 'paht' in [model a] (did you mean 'path'?)");
}
END_TEST

START_TEST(test_excluded_and_model_keys)
{
    ck_assert_int_eq(load("[broker]\nconfig = /etc/other.conf\n"), WB_EINVAL);
    assert_error_at(2, "'config' cannot be set in a configuration file, only on the command line");
    ck_assert_int_eq(load("[broker]\nmodel = a=/p\n"), WB_EINVAL);
    assert_error_at(2, "models are not set in [broker]: give each one a [model NAME] section "
                       "with 'path = ...'");
}
END_TEST

START_TEST(test_unknown_sections)
{
    ck_assert_int_eq(load("[broker]\nsocket = /a\n[brokr]\n"), WB_EINVAL);
    assert_error_at(3, "unknown section [brokr]; expected [broker] or [model NAME]");
    ck_assert_int_eq(load("[model]\npath = /p\n"), WB_EINVAL);
    assert_error_at(1, "unknown section [model]; expected [broker] or [model NAME]");
    ck_assert_int_eq(load("[model bad/name]\npath = /p\n"), WB_EINVAL);
    assert_error_at(1, "model name 'bad/name' is not 1 to 255 characters of A-Z a-z 0-9 . _ -");
}
END_TEST

START_TEST(test_key_outside_section)
{
    ck_assert_int_eq(load("# comment\nsocket = /a\n[broker]\n"), WB_EINVAL);
    assert_error_at(2, "key 'socket' comes before any section; put it under [broker]");
}
END_TEST

START_TEST(test_duplicates)
{
    ck_assert_int_eq(load("[broker]\nsocket = /a\nstale_ms = 5\nstale-ms = 6\n"), WB_EINVAL);
    assert_error_at(4, "key 'stale-ms' is set twice in [broker] (first on line 3)");
    ck_assert_int_eq(load("[broker]\n[model a]\npath=/p\n[broker]\n"), WB_EINVAL);
    assert_error_at(4, "section [broker] appears twice (first on line 1)");
    ck_assert_int_eq(load("[model a]\npath=/p\n[model b]\npath=/q\n[model a]\npath=/r\n"),
                     WB_EINVAL);
    assert_error_at(5, "section [model a] appears twice (first on line 1)");
    ck_assert_int_eq(load("[model a]\npath=/p\npath=/q\n"), WB_EINVAL);
    assert_error_at(3, "key 'path' is set twice in [model a] (first on line 2)");
}
END_TEST

START_TEST(test_model_errors)
{
    ck_assert_int_eq(load("[model a]\ndevice = 0\n[broker]\n"), WB_EINVAL);
    assert_error_at(1, "[model a] has no 'path'");
    /* The last section is checked at the end of the file too. */
    ck_assert_int_eq(load("[broker]\n[model last]\n"), WB_EINVAL);
    assert_error_at(2, "[model last] has no 'path'");
    ck_assert_int_eq(load("[model a]\npath = /p\ndevice = one\n"), WB_EINVAL);
    assert_error_at(3, "model 'a': placement 'one': position 1: 'one' is not a device ordinal, "
                       "'all' or a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
    ck_assert_int_eq(load("[model a]\ndevice = 1024\npath = /p\n"), WB_EINVAL);
    assert_error_at(2, "model 'a': placement '1024': position 1: device ordinal '1024' is above "
                       "1023");
    ck_assert_int_eq(load("[model a]\npath = /p\ndevices = 0,,1\n"), WB_EINVAL);
    assert_error_at(3, "model 'a': placement '0,,1': position 3: an empty item (two commas, or a "
                       "comma at an end)");
    ck_assert_int_eq(load("[model a]\npath = /p\ndevice = 0\ndevices = 1\n"), WB_EINVAL);
    assert_error_at(4, "[model a] sets its devices twice");
    ck_assert_int_eq(load("[model a]\npath =\n"), WB_EINVAL);
    assert_error_at(2, "'path' of [model a] is empty");
}
END_TEST

START_TEST(test_bool_value)
{
    ck_assert_int_eq(load("[broker]\nforeground = maybe\n"), WB_EINVAL);
    assert_error_at(2, "foreground: 'maybe' is not true or false");
}
END_TEST

START_TEST(test_syntax_errors)
{
    ck_assert_int_eq(load("[broker]\nsocket /a\n"), WB_EFORMAT);
    assert_error_at(2, "expected 'key = value', '[section]' or a comment, not 'socket /a'");
    ck_assert_int_eq(load("[broker\n"), WB_EFORMAT);
    assert_error_at(1, "section header without its closing ']'");
    ck_assert_int_eq(load("\n[broker] socket = /a\n"), WB_EFORMAT);
    assert_error_at(2, "unexpected text after the section header");
    /* Nothing after the first error is looked at. */
    ck_assert_int_eq(load("[broker]\nbad line\nsokcet = 1\n"), WB_EFORMAT);
    assert_error_at(2, "expected 'key = value', '[section]' or a comment, not 'bad line'");
}
END_TEST

START_TEST(test_unreadable)
{
    unlink(path);
    ck_assert_int_eq(wb__config_load(path, opts, exclude, &cfg, &err), WB_ENOTFOUND);
    char want[200];
    snprintf(want, sizeof want, "%s: cannot open the configuration file: No such file or directory",
             path);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(wb__config_load("/", opts, exclude, &cfg, &err), WB_EIO);
    ck_assert_msg(strncmp(err.msg, "/: ", 3) == 0, "%s", err.msg);
}
END_TEST

START_TEST(test_parse_model)
{
    wb_model_arg m;
    ck_assert_int_eq(wb__config_parse_model("base=/m/a=b.safetensors", &m, &err), WB_OK);
    ck_assert_str_eq(m.name, "base");
    ck_assert_int_eq(m.device, -1);
    ck_assert_str_eq(m.path, "/m/a=b.safetensors");
    ck_assert_int_eq(wb__config_parse_model("base@3=/m/x", &m, &err), WB_OK);
    ck_assert_str_eq(m.name, "base");
    ck_assert_int_eq(m.device, 3);
    ck_assert_str_eq(m.path, "/m/x");

    ck_assert_int_eq(wb__config_parse_model("base", &m, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "'base' is not NAME=PATH, NAME=PATH@DEVICES or NAME@DEVICES=PATH");
    ck_assert_int_eq(wb__config_parse_model("=/p", &m, &err), WB_EINVAL);
    ck_assert_int_eq(wb__config_parse_model("base=", &m, &err), WB_EINVAL);
    ck_assert_int_eq(wb__config_parse_model("b c=/p", &m, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "model name 'b c' is not 1 to 255 characters of A-Z a-z 0-9 . _ -");
    ck_assert_int_eq(wb__config_parse_model("b@=/p", &m, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "model 'b': placement '': position 1: expected 'all', device "
                              "ordinals or GPU UUIDs");
    ck_assert_int_eq(wb__config_parse_model("b@-1=/p", &m, &err), WB_EINVAL);
    ck_assert_int_eq(wb__config_parse_model("b@99999999999=/p", &m, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "model 'b': placement '99999999999': position 1: device ordinal "
                              "'99999999999' is above 1023");

    /* NAME=PATH@DEVICES: the last '@' of the path starts the placement. */
    ck_assert_int_eq(wb__config_parse_model("base=/m/x.safetensors@0,1", &m, &err), WB_OK);
    ck_assert_str_eq(m.name, "base");
    ck_assert_uint_eq(m.path_len, strlen("/m/x.safetensors"));
    ck_assert_int_eq(strncmp(m.path, "/m/x.safetensors", m.path_len), 0);
    ck_assert_uint_eq(m.placement_len, 3);
    ck_assert_int_eq(strncmp(m.placement, "0,1", 3), 0);
    ck_assert_uint_eq(m.where.n, 2);
    ck_assert_int_eq(m.device, -1);
    ck_assert_int_eq(wb__config_parse_model("base=/m/x@all", &m, &err), WB_OK);
    ck_assert_int_eq(m.where.all, 1);
    ck_assert_int_eq(wb__config_parse_model("base@all=/m/x", &m, &err), WB_OK);
    ck_assert_int_eq(m.where.all, 1);
    ck_assert_uint_eq(m.path_len, 4);
    ck_assert_int_eq(wb__config_parse_model("base=/m/x@1", &m, &err), WB_OK);
    ck_assert_int_eq(m.device, 1);
    ck_assert_int_eq(
        wb__config_parse_model("base=/m/x@GPU-11111111-2222-3333-4444-555555555555", &m, &err),
        WB_OK);
    ck_assert_str_eq(m.where.items[0].uuid, "GPU-11111111-2222-3333-4444-555555555555");
    /* A path with an '@' of its own reads as a placement: refused clearly. */
    ck_assert_int_eq(wb__config_parse_model("base=/m/v@2024/x", &m, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "model 'base': placement '2024/x': position 5: '2024/x' is not a "
                              "device ordinal");
    ck_assert_int_eq(wb__config_parse_model("base@0=/m/x@1", &m, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "model 'base' has two placements ('@0' and '@1')");
    ck_assert_int_eq(wb__config_parse_model("base=@1", &m, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "model 'base' has no path before '@1'");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_valid_file);
    tcase_add_test(tc, test_comments);
    tcase_add_test(tc, test_empty_and_false);
    tcase_add_test(tc, test_bom_crlf_long_names);
    tcase_add_test(tc, test_long_value);
    tcase_add_test(tc, test_line_too_long);
    tcase_add_test(tc, test_unknown_key);
    tcase_add_test(tc, test_unknown_key_no_hint);
    tcase_add_test(tc, test_unknown_model_key);
    tcase_add_test(tc, test_excluded_and_model_keys);
    tcase_add_test(tc, test_unknown_sections);
    tcase_add_test(tc, test_key_outside_section);
    tcase_add_test(tc, test_duplicates);
    tcase_add_test(tc, test_model_errors);
    tcase_add_test(tc, test_bool_value);
    tcase_add_test(tc, test_syntax_errors);
    tcase_add_test(tc, test_unreadable);
    tcase_add_test(tc, test_parse_model);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
