/* Paths (common/paths.h): wb__mkdir_p creates the missing directories of a
 * path and leaves existing ones alone, skips the prefix it is told exists,
 * sets the exact mode when asked whatever the umask (and leaves the umask's
 * mode otherwise), and names the directory it could not create. */
#include "paths.h"

#include <check.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[64];

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/wb-test-paths.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}

static mode_t mode_of(const char *path)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    return st.st_mode & 07777;
}

START_TEST(test_mkdir_p_exact)
{
    char path[PATH_MAX], mid[PATH_MAX];
    snprintf(path, sizeof path, "%s/a/b//c", root);
    snprintf(mid, sizeof mid, "%s/a", root);
    mode_t old = umask(0077);
    wb_err err;
    ck_assert_int_eq(wb__mkdir_p(path, 0, 0750, 1, &err), WB_OK);
    ck_assert_int_eq(mode_of(mid), 0750);
    ck_assert_int_eq(mode_of(path), 0750);
    /* Again: everything exists, nothing changes. */
    ck_assert_int_eq(chmod(mid, 0700), 0);
    ck_assert_int_eq(wb__mkdir_p(path, 0, 0750, 1, &err), WB_OK);
    ck_assert_int_eq(mode_of(mid), 0700);
    umask(old);
}
END_TEST

START_TEST(test_mkdir_p_umask_and_skip)
{
    char path[PATH_MAX], mid[PATH_MAX];
    snprintf(path, sizeof path, "%s/x/y/", root);
    snprintf(mid, sizeof mid, "%s/x", root);
    mode_t old = umask(0027);
    wb_err err;
    ck_assert_int_eq(wb__mkdir_p(path, strlen(root), 0777, 0, &err), WB_OK);
    umask(old);
    ck_assert_int_eq(mode_of(mid), 0750);
    ck_assert_int_eq(mode_of(path), 0750);
    /* The skipped prefix is not touched: a root that is missing fails on
     * the first directory below it, which names it. */
    snprintf(path, sizeof path, "%s/missing/z", root);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "cannot create directory %s/missing/z: No such file or directory",
             root);
    ck_assert_int_eq(wb__mkdir_p(path, strlen(root) + strlen("/missing"), 0700, 0, &err), WB_EIO);
    ck_assert_str_eq(err.msg, want);
}
END_TEST

START_TEST(test_mkdir_p_refused)
{
    char file[128], path[256];
    snprintf(file, sizeof file, "%s/file", root);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    wb_err err;
    /* A last component that exists as a file is the caller's to check. */
    ck_assert_int_eq(wb__mkdir_p(file, 0, 0700, 0, &err), WB_OK);
    snprintf(path, sizeof path, "%s/below", file);
    ck_assert_int_eq(wb__mkdir_p(path, 0, 0700, 0, &err), WB_EIO);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "cannot create directory %s: Not a directory", path);
    ck_assert_str_eq(err.msg, want);
    char longp[PATH_MAX + 1];
    memset(longp, 'a', PATH_MAX);
    longp[PATH_MAX] = '\0';
    ck_assert_int_eq(wb__mkdir_p(longp, 0, 0700, 0, &err), WB_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("paths");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_mkdir_p_exact);
    tcase_add_test(tc, test_mkdir_p_umask_and_skip);
    tcase_add_test(tc, test_mkdir_p_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
