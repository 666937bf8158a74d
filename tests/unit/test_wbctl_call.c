/* wbctl's option parsing (wbctl_call.c): the global options wherever they
 * are, the MODEL filter in both forms, output formats that conflict refused
 * by name, a command's own flags, and every misuse as exit 2. */
#include "wbctl_call.h"

#include <check.h>

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static int no_wait;
static const wbctl_flag own[] = {{"no-wait", "return at once", &no_wait}};
static const wbctl_spec listing = {
    .synopsis = "leases [MODEL]",
    .about = "Lists.",
    .flags = WBCTL_TAKES_WIDE | WBCTL_TAKES_MODEL,
};
static const wbctl_spec loading = {
    .synopsis = "load NAME PATH",
    .about = "Loads.",
    .min_args = 2,
    .max_args = 2,
    .arg_names = (const char *const[]){"NAME", "PATH"},
    .own = own,
    .n_own = 1,
};

/* Parses argv (NULL-terminated) with fresh globals bound. */
static int parse(wbctl_globals *g, const wbctl_spec *spec, wbctl_args *a, char **argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    *g = (wbctl_globals){0};
    no_wait = 0;
    wbctl_bind_globals(g);
    optind = 0;
    return wbctl_parse(argc, argv, spec, a);
}

START_TEST(test_globals_after_the_command)
{
    wbctl_globals g;
    wbctl_args a;
    char *argv[] = {"leases", "base", "--socket", "/s", "--timeout-ms", "250", "-o", "wide", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, argv), -1);
    ck_assert_str_eq(g.socket_path, "/s");
    ck_assert_int_eq(g.timeout_ms, 250);
    ck_assert_int_eq(a.output, WBCTL_OUT_WIDE);
    ck_assert_str_eq(a.model, "base");
    ck_assert_int_eq(a.npos, 0);
    char *argv2[] = {"leases", "--json", "--model", "base", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, argv2), -1);
    ck_assert_int_eq(a.output, WBCTL_OUT_JSON);
    ck_assert_str_eq(a.model, "base");
    /* The same model both ways is fine. */
    char *argv3[] = {"leases", "base", "--model", "base", "-o", "json", "--json", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, argv3), -1);
    ck_assert_int_eq(a.output, WBCTL_OUT_JSON);
}
END_TEST

START_TEST(test_own_flags_and_arguments)
{
    wbctl_globals g;
    wbctl_args a;
    char *argv[] = {"load", "m", "--no-wait", "/p", "--json", NULL};
    ck_assert_int_eq(parse(&g, &loading, &a, argv), -1);
    ck_assert_int_eq(no_wait, 1);
    ck_assert_int_eq(a.npos, 2);
    ck_assert_str_eq(a.pos[0], "m");
    ck_assert_str_eq(a.pos[1], "/p");
    ck_assert_ptr_null(a.model);
    /* "--" ends the options: a name that looks like one. */
    char *argv2[] = {"load", "--", "--no-wait", "/p", NULL};
    ck_assert_int_eq(parse(&g, &loading, &a, argv2), -1);
    ck_assert_int_eq(no_wait, 0);
    ck_assert_str_eq(a.pos[0], "--no-wait");
}
END_TEST

START_TEST(test_misuse)
{
    wbctl_globals g;
    wbctl_args a;
    char *conflict[] = {"leases", "--json", "-o", "wide", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, conflict), WBCTL_EXIT_USAGE);
    char *two_models[] = {"leases", "a", "--model", "b", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, two_models), WBCTL_EXIT_USAGE);
    char *extra[] = {"leases", "a", "b", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, extra), WBCTL_EXIT_USAGE);
    char *missing[] = {"load", "m", NULL};
    ck_assert_int_eq(parse(&g, &loading, &a, missing), WBCTL_EXIT_USAGE);
    char *no_wide[] = {"load", "m", "/p", "-o", "wide", NULL};
    ck_assert_int_eq(parse(&g, &loading, &a, no_wide), WBCTL_EXIT_USAGE);
    char *no_model[] = {"load", "m", "/p", "--model", "x", NULL};
    ck_assert_int_eq(parse(&g, &loading, &a, no_model), WBCTL_EXIT_USAGE);
    char *bad_output[] = {"leases", "-o", "yaml", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, bad_output), WBCTL_EXIT_USAGE);
    char *no_arg[] = {"leases", "--socket", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, no_arg), WBCTL_EXIT_USAGE);
    char *unknown[] = {"leases", "--no-wait", NULL};
    ck_assert_int_eq(parse(&g, &listing, &a, unknown), WBCTL_EXIT_USAGE);
    static const char *const timeouts[] = {"0", "-1", "86400001", "99999999999", "5s", "", " 5"};
    for (size_t i = 0; i < sizeof timeouts / sizeof timeouts[0]; i++) {
        char *bad[] = {"leases", "--timeout-ms", (char *)timeouts[i], NULL};
        ck_assert_int_eq(parse(&g, &listing, &a, bad), WBCTL_EXIT_USAGE);
    }
    ck_assert(wbctl_misuse_shown());
    char *help[] = {"leases", "--help", NULL};
    fflush(stdout);
    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w");
    ck_assert_int_eq(parse(&g, &listing, &a, help), WBCTL_EXIT_OK);
    fclose(stdout);
    stdout = saved;
}
END_TEST

int main(void)
{
    Suite *s = suite_create("wbctl_call");
    TCase *tc = tcase_create("wbctl_call");
    tcase_add_test(tc, test_globals_after_the_command);
    tcase_add_test(tc, test_own_flags_and_arguments);
    tcase_add_test(tc, test_misuse);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
