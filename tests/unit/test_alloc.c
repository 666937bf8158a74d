/* The allocators and their test hook: which allocation fails and which do
 * not, the counts, the thread filter, and protobuf-c's and jansson's
 * allocations going through the same hook. */
#include "alloc.h"
#include "wire.h"

#include <check.h>
#include <jansson.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_unarmed)
{
    wb__alloc_hook_off();
    char *s = wb__strdup("weights");
    ck_assert_str_eq(s, "weights");
    free(s);
    char *t = wb__strndup("weights", 3);
    ck_assert_str_eq(t, "wei");
    free(t);
    int *v = wb__calloc(4, sizeof *v);
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(v[3], 0);
    v = wb__realloc(v, 64 * sizeof *v);
    ck_assert_ptr_nonnull(v);
    free(v);
    void *p = wb__malloc(10);
    ck_assert_ptr_nonnull(p);
    free(p);
}
END_TEST

/* Without WB_ALLOC_STICKY only the n-th allocation fails. */
START_TEST(test_fail_once)
{
    wb__alloc_fail_after(2, 0);
    void *a = wb__malloc(8), *b = wb__calloc(1, 8);
    errno = 0;
    char *c = wb__strdup("x");
    ck_assert_int_eq(errno, ENOMEM);
    void *d = wb__realloc(NULL, 8);
    wb__alloc_hook_off();
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(wb__alloc_count(), 4);
    ck_assert_int_eq(wb__alloc_failures(), 1);
    ck_assert_ptr_nonnull(wb__alloc_failed_site());
    free(a);
    free(b);
    free(d);
    /* Off: nothing is counted any more, the counts stay readable. */
    free(wb__malloc(1));
    ck_assert_int_eq(wb__alloc_count(), 4);
}
END_TEST

/* With it the n-th and every later one fail; a failed realloc leaves the
 * block as it was. */
START_TEST(test_fail_sticky)
{
    char *keep = wb__strdup("kept");
    wb__alloc_fail_after(1, WB_ALLOC_STICKY);
    void *a = wb__malloc(8);
    ck_assert_ptr_null(wb__realloc(keep, 4096));
    ck_assert_ptr_null(wb__strndup("abc", 2));
    ck_assert_ptr_null(wb__calloc(1, 1));
    wb__alloc_hook_off();
    ck_assert_ptr_nonnull(a);
    ck_assert_str_eq(keep, "kept");
    ck_assert_int_eq(wb__alloc_count(), 4);
    ck_assert_int_eq(wb__alloc_failures(), 3);
    free(a);
    free(keep);
}
END_TEST

static int vformat(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int vformat(char **out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = wb__vasprintf(out, fmt, ap);
    va_end(ap);
    return n;
}

START_TEST(test_vasprintf)
{
    char *s;
    ck_assert_int_eq(vformat(&s, "%s-%d", "lease", 42), 8);
    ck_assert_str_eq(s, "lease-42");
    free(s);
    wb__alloc_fail_after(0, 0);
    ck_assert_int_eq(vformat(&s, "%s", "x"), -1);
    wb__alloc_hook_off();
    ck_assert_ptr_null(s);
    ck_assert_int_eq(wb__alloc_failures(), 1);
}
END_TEST

/* n < 0 counts and fails nothing; arming again restarts the count. */
START_TEST(test_count_only)
{
    wb__alloc_fail_after(-1, WB_ALLOC_STICKY);
    for (int i = 0; i < 5; i++)
        free(wb__malloc(16));
    ck_assert_int_eq(wb__alloc_count(), 5);
    ck_assert_int_eq(wb__alloc_failures(), 0);
    ck_assert_ptr_null(wb__alloc_failed_site());
    wb__alloc_fail_after(-1, 0);
    ck_assert_int_eq(wb__alloc_count(), 0);
    wb__alloc_hook_off();
}
END_TEST

static void *other_thread(void *arg)
{
    void **out = arg;
    for (int i = 0; i < 3; i++)
        out[i] = wb__malloc(8);
    return NULL;
}

/* WB_ALLOC_THIS_THREAD: another thread's allocations are neither counted
 * nor failed. */
START_TEST(test_this_thread)
{
    void *theirs[3];
    wb__alloc_fail_after(0, WB_ALLOC_STICKY | WB_ALLOC_THIS_THREAD);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, other_thread, theirs), 0);
    pthread_join(t, NULL);
    void *mine = wb__malloc(8);
    wb__alloc_hook_off();
    for (int i = 0; i < 3; i++) {
        ck_assert_ptr_nonnull(theirs[i]);
        free(theirs[i]);
    }
    ck_assert_ptr_null(mine);
    ck_assert_int_eq(wb__alloc_count(), 1);
    /* Without the flag every thread counts. */
    wb__alloc_fail_after(-1, 0);
    ck_assert_int_eq(pthread_create(&t, NULL, other_thread, theirs), 0);
    pthread_join(t, NULL);
    wb__alloc_hook_off();
    ck_assert_int_eq(wb__alloc_count(), 3);
    for (int i = 0; i < 3; i++)
        free(theirs[i]);
}
END_TEST

/* Threads allocating at once are counted exactly. */
static void *many(void *arg)
{
    (void)arg;
    for (int i = 0; i < 10000; i++)
        free(wb__malloc(8));
    return NULL;
}

START_TEST(test_threads_counted)
{
    pthread_t t[4];
    wb__alloc_fail_after(-1, 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, many, NULL), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    wb__alloc_hook_off();
    ck_assert_int_eq(wb__alloc_count(), 40000);
}
END_TEST

/* protobuf-c's allocations go through the hook: a reply's decoding fails
 * with WB_ENOMEM, not as a malformed reply. */
START_TEST(test_protobuf)
{
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    Wbproto__HelloReply h = WBPROTO__HELLO_REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.body_case = WBPROTO__REPLY__BODY_HELLO;
    rep.hello = &h;
    h.broker_version = "0.1.0";
    size_t len;
    uint8_t *buf = wb__reply_pack(&rep, &len);
    ck_assert_ptr_nonnull(buf);
    Wbproto__Reply *out;
    wb_err err;
    wb__alloc_fail_after(0, WB_ALLOC_STICKY);
    int rc = wb__reply_decode(buf, len, &out, &err);
    wb__alloc_hook_off();
    ck_assert_int_eq(rc, WB_ENOMEM);
    ck_assert_ptr_null(out);
    ck_assert_int_ge(wb__alloc_failures(), 1);
    wb__alloc_fail_after(-1, 0);
    ck_assert_int_eq(wb__reply_decode(buf, len, &out, &err), WB_OK);
    wb__alloc_hook_off();
    ck_assert_int_ge(wb__alloc_count(), 2);
    ck_assert_str_eq(out->hello->broker_version, "0.1.0");
    wb__reply_free(&out);
    /* The allocator itself. */
    ProtobufCAllocator *a = &wb__protobuf_allocator;
    wb__alloc_fail_after(0, 0);
    ck_assert_ptr_null(a->alloc(a->allocator_data, 8));
    void *p = a->alloc(a->allocator_data, 8);
    wb__alloc_hook_off();
    ck_assert_ptr_nonnull(p);
    a->free(a->allocator_data, p);
    free(buf);
}
END_TEST

START_TEST(test_jansson)
{
    wb__alloc_use_for_jansson();
    wb__alloc_fail_after(0, WB_ALLOC_STICKY);
    json_error_t je;
    json_t *j = json_loads("{\"a\": [1, 2, 3]}", 0, &je);
    wb__alloc_hook_off();
    ck_assert_ptr_null(j);
    ck_assert_int_ge(wb__alloc_failures(), 1);
    wb__alloc_fail_after(-1, 0);
    j = json_loads("{\"a\": [1, 2, 3]}", 0, &je);
    wb__alloc_hook_off();
    ck_assert_ptr_nonnull(j);
    ck_assert_int_ge(wb__alloc_count(), 3);
    json_decref(j);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_unarmed);
    tcase_add_test(tc, test_fail_once);
    tcase_add_test(tc, test_fail_sticky);
    tcase_add_test(tc, test_vasprintf);
    tcase_add_test(tc, test_count_only);
    tcase_add_test(tc, test_this_thread);
    tcase_add_test(tc, test_threads_counted);
    tcase_add_test(tc, test_protobuf);
    tcase_add_test(tc, test_jansson);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
