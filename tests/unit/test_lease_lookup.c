/* Looking a lease's tensors up by name: the index sorted by name that the
 * first lookup builds (client/lease.c, wb__lease_lookup), which the AOTI
 * binding uses once per constant. Every name of a large table in scrambled
 * order, names that are not there, and the first lookups racing in threads. */
#include "lease.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TENSORS 20000
#define N_THREADS 8

typedef struct table {
    wb_lease lease;
    wb__tensor_entry *t;
    char (*names)[40];
} table;

/* A lease with N_TENSORS tensors whose names are in no sorted order. */
static void table_make(table *tb)
{
    memset(tb, 0, sizeof *tb);
    tb->t = calloc(N_TENSORS, sizeof *tb->t);
    tb->names = calloc(N_TENSORS, sizeof *tb->names);
    ck_assert_ptr_nonnull(tb->t);
    ck_assert_ptr_nonnull(tb->names);
    for (size_t i = 0; i < N_TENSORS; i++) {
        /* A multiplicative scramble of i: distinct, and out of order. */
        snprintf(tb->names[i], sizeof tb->names[i], "model.layers.%zu.experts.w",
                 (i * 7919u) % N_TENSORS);
        tb->t[i].name = tb->names[i];
        tb->t[i].nbytes = i;
    }
    tb->lease.n_tensors = N_TENSORS;
    tb->lease.tensors = tb->t;
    wb__lease_containers_init(&tb->lease);
}

static void table_free(table *tb)
{
    wb__lease_containers_free(&tb->lease);
    free(atomic_load(&tb->lease.by_name));
    free(tb->t);
    free(tb->names);
}

START_TEST(every_name_is_found)
{
    table tb;
    table_make(&tb);
    ck_assert_ptr_null(atomic_load(&tb.lease.by_name));
    for (size_t i = 0; i < N_TENSORS; i++) {
        const wb__tensor_entry *e = wb__lease_lookup(&tb.lease, tb.names[i]);
        ck_assert_ptr_eq(e, &tb.t[i]);
        ck_assert_uint_eq(e->nbytes, i);
    }
    ck_assert_ptr_nonnull(atomic_load(&tb.lease.by_name));
    ck_assert_ptr_null(wb__lease_lookup(&tb.lease, "model.layers.20000.experts.w"));
    ck_assert_ptr_null(wb__lease_lookup(&tb.lease, ""));
    ck_assert_ptr_null(wb__lease_lookup(&tb.lease, "model.layers.1.experts"));
    ck_assert_ptr_null(wb__lease_lookup(&tb.lease, "zzz"));
    table_free(&tb);
}
END_TEST

START_TEST(an_empty_table_finds_nothing)
{
    wb_lease l;
    memset(&l, 0, sizeof l);
    wb__lease_containers_init(&l);
    ck_assert_ptr_null(wb__lease_lookup(&l, "a"));
    ck_assert_ptr_null(atomic_load(&l.by_name));
    wb__lease_containers_free(&l);
}
END_TEST

typedef struct racer {
    table *tb;
    size_t start;
    size_t wrong;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    for (size_t k = 0; k < N_TENSORS; k += 7) {
        size_t i = (r->start + k) % N_TENSORS;
        if (wb__lease_lookup(&r->tb->lease, r->tb->names[i]) != &r->tb->t[i])
            r->wrong++;
    }
    return NULL;
}

/* Threads that look up at once all see a complete index: one builds it
 * under the lease's lock, the others wait for it or find it published. */
START_TEST(first_lookups_race)
{
    table tb;
    table_make(&tb);
    pthread_t th[N_THREADS];
    racer rs[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        rs[i] = (racer){.tb = &tb, .start = (size_t)i * 1000};
        ck_assert_int_eq(pthread_create(&th[i], NULL, race, &rs[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_uint_eq(rs[i].wrong, 0);
    }
    table_free(&tb);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lease_lookup");
    TCase *tc = tcase_create("lookup");
    tcase_add_test(tc, every_name_is_found);
    tcase_add_test(tc, an_empty_table_finds_nothing);
    tcase_add_test(tc, first_lookups_race);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
