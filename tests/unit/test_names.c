/* The name nearest to a mistyped one (names.c), for the "did you mean"
 * hints of wbctl's commands and wbrokerd's configuration keys: the exact
 * edit distance, no hint beyond two edits, the first of equally near
 * names, and no work on names too long to be worth it. */
#include "names.h"

#include <check.h>

#include <stdint.h>
#include <string.h>

static const char *const COMMANDS[] = {"models", "leases", "containers", "load",
                                       "unload", "stats",  "inspect",    "version"};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

START_TEST(test_distance)
{
    ck_assert_uint_eq(wb__names_distance("leases", "leases"), 0);
    ck_assert_uint_eq(wb__names_distance("leaes", "leases"), 1);   /* a deletion */
    ck_assert_uint_eq(wb__names_distance("leasess", "leases"), 1); /* an insertion */
    ck_assert_uint_eq(wb__names_distance("laeses", "leases"), 2);  /* two substitutions */
    ck_assert_uint_eq(wb__names_distance("", "abc"), 3);
    ck_assert_uint_eq(wb__names_distance("abc", ""), 3);
    ck_assert_uint_eq(wb__names_distance("kitten", "sitting"), 3);
    char long_name[42];
    memset(long_name, 'a', 41);
    long_name[41] = '\0';
    ck_assert_uint_eq(wb__names_distance(long_name, "a"), SIZE_MAX);
    ck_assert_uint_eq(wb__names_distance("a", long_name), SIZE_MAX);
    long_name[40] = '\0'; /* 40 bytes: still measured */
    ck_assert_uint_eq(wb__names_distance(long_name, "a"), 39);
}
END_TEST

START_TEST(test_closest)
{
    ck_assert_str_eq(wb__names_closest("leaes", COMMANDS, N_COMMANDS), "leases");
    ck_assert_str_eq(wb__names_closest("lod", COMMANDS, N_COMMANDS), "load");
    ck_assert_str_eq(wb__names_closest("stat", COMMANDS, N_COMMANDS), "stats");
    ck_assert_str_eq(wb__names_closest("modles", COMMANDS, N_COMMANDS), "models");
    /* Three edits away, or nothing alike: no hint. */
    static const char *const sitting[] = {"sitting"};
    ck_assert_ptr_null(wb__names_closest("kitten", sitting, 1));
    ck_assert_str_eq(wb__names_closest("sittin", sitting, 1), "sitting");
    ck_assert_ptr_null(wb__names_closest("frobnicate", COMMANDS, N_COMMANDS));
    ck_assert_ptr_null(wb__names_closest("x", NULL, 0));
    /* "unlod" is one edit from "unload" and two from "load": the nearer. */
    ck_assert_str_eq(wb__names_closest("unlod", COMMANDS, N_COMMANDS), "unload");
    /* Equally near: the first listed. */
    static const char *const two[] = {"abd", "abe"};
    ck_assert_str_eq(wb__names_closest("abc", two, 2), "abd");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("names");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, test_distance);
    tcase_add_test(tc, test_closest);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
