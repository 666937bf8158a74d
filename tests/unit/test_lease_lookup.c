/* Looking a lease's tensors up by name: the hash index by name that the
 * first lookup builds (client/lease.c, wb__lease_lookup; common/names.c),
 * which the AOTI binding uses once per constant. Every name of a large table
 * in scrambled order, names that are not there, repeated names, a crowded
 * probe sequence, and the first lookups racing in threads. */
#include "lease.h"

#include <check.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
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
    tb->lease.own_tensors = tb->t;
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

typedef struct rec {
    int pad;
    const char *name;
} rec;

/* Names that differ in one byte or only in length, an empty name, and a
 * repeated one: each found exactly, the repeat as its first record (as a
 * scan finds it). */
START_TEST(near_names_and_repeats)
{
    rec r[] = {{0, "a.weight"}, {1, "a.weigh"},  {2, "a.weightt"}, {3, ""},
               {4, "b.weight"}, {5, "a.weight"}, {6, "a.Weight"}};
    size_t n = sizeof r / sizeof r[0];
    wb__names_hash *h = wb__names_hash_new(r, n, sizeof r[0], offsetof(rec, name));
    ck_assert_ptr_nonnull(h);
    ck_assert_uint_ge(h->mask + 1, 2 * n);
    ck_assert_uint_eq(h->mask & (h->mask + 1), 0); /* a power of two, less one */
    const char *want[] = {"a.weight", "a.weigh", "a.weightt", "", "b.weight", "a.Weight"};
    const int at[] = {0, 1, 2, 3, 4, 6};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const rec *got = wb__names_hash_find(h, r, sizeof r[0], offsetof(rec, name), want[i]);
        ck_assert_ptr_nonnull(got);
        ck_assert_int_eq(got->pad, at[i]);
    }
    ck_assert_ptr_null(wb__names_hash_find(h, r, sizeof r[0], offsetof(rec, name), "a.weights"));
    ck_assert_ptr_null(wb__names_hash_find(h, r, sizeof r[0], offsetof(rec, name), "a"));
    /* Occupied slots: one per distinct name. */
    size_t used = 0;
    for (size_t i = 0; i <= h->mask; i++)
        used += h->slot[i] != 0;
    ck_assert_uint_eq(used, n - 1);
    free(h);

    wb__names_hash *none = wb__names_hash_new(NULL, 0, sizeof r[0], offsetof(rec, name));
    ck_assert_ptr_nonnull(none);
    ck_assert_ptr_null(wb__names_hash_find(none, NULL, sizeof r[0], offsetof(rec, name), ""));
    free(none);
}
END_TEST

/* A full probe sequence: every slot but one taken by hand-made entries
 * whose tags cannot match, so a lookup walks the whole table (wrapping at
 * its end) and stops at the one empty slot. */
START_TEST(crowded_probes_wrap)
{
    rec r[] = {{0, "x"}};
    wb__names_hash *h = wb__names_hash_new(r, 1, sizeof r[0], offsetof(rec, name));
    ck_assert_ptr_nonnull(h);
    size_t found_at = 0;
    for (size_t i = 0; i <= h->mask; i++)
        if (h->slot[i])
            found_at = i;
    uint64_t real = h->slot[found_at];
    for (size_t i = 0; i <= h->mask; i++)
        h->slot[i] = ((real >> 32) ^ 1) << 32 | 1; /* record 0, another tag */
    h->slot[(found_at + h->mask) & h->mask] = 0;   /* the slot before: empty */
    ck_assert_ptr_null(wb__names_hash_find(h, r, sizeof r[0], offsetof(rec, name), "x"));
    h->slot[(found_at + h->mask / 2) & h->mask] = real; /* reached after wrapping or not */
    ck_assert_ptr_eq(wb__names_hash_find(h, r, sizeof r[0], offsetof(rec, name), "x"), &r[0]);
    /* Many at once walk the same way. */
    const char *xs[] = {"x", "y", "x"};
    size_t got[3];
    wb__names_hash_find_many(h, r, sizeof r[0], offsetof(rec, name), xs, 3, got);
    ck_assert_uint_eq(got[0], 0);
    ck_assert_uint_eq(got[1], SIZE_MAX);
    ck_assert_uint_eq(got[2], 0);
    free(h);
}
END_TEST

/* Many names at once (the pipelined lookup) find exactly what one at a time
 * finds: every name of a large table in an order of its own, names that are
 * not there mixed in, repeats, a batch shorter than the pipeline, none
 * (crowded_probes_wrap walks a crowded probe sequence both ways). */
START_TEST(many_at_once_as_one_at_a_time)
{
    table tb;
    table_make(&tb);
    const wb__tensor_entry *ents = tb.t;
    wb__names_hash *h =
        wb__names_hash_new(ents, N_TENSORS, sizeof *ents, offsetof(wb__tensor_entry, name));
    ck_assert_ptr_nonnull(h);
    size_t n = N_TENSORS + N_TENSORS / 10;
    const char **names = calloc(n, sizeof *names);
    char(*absent)[48] = calloc(N_TENSORS / 10, sizeof *absent);
    size_t *out = calloc(n, sizeof *out);
    ck_assert_ptr_nonnull(names);
    ck_assert_ptr_nonnull(absent);
    ck_assert_ptr_nonnull(out);
    for (size_t i = 0, a = 0; i < n; i++) {
        if (i % 11 == 5 && a < N_TENSORS / 10) {
            snprintf(absent[a], sizeof absent[a], "model.layers.%zu.experts.x", i);
            names[i] = absent[a++];
        } else {
            names[i] = tb.names[(i * 104729u) % N_TENSORS]; /* repeats some */
        }
    }
    for (size_t len = 0; len <= n; len = len ? len * 7 : 1) {
        memset(out, 0xAB, n * sizeof *out);
        wb__names_hash_find_many(h, ents, sizeof *ents, offsetof(wb__tensor_entry, name), names,
                                 len, out);
        for (size_t i = 0; i < len; i++) {
            const wb__tensor_entry *one = wb__names_hash_find(
                h, ents, sizeof *ents, offsetof(wb__tensor_entry, name), names[i]);
            if (one)
                ck_assert_uint_eq(out[i], (size_t)(one - ents));
            else
                ck_assert_uint_eq(out[i], SIZE_MAX);
        }
        if (len < n)
            ck_assert_uint_eq(out[len], (size_t)0xABABABABABABABABull); /* nothing past n */
    }
    free(h);
    free(names);
    free(absent);
    free(out);
    table_free(&tb);
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
    tcase_add_test(tc, near_names_and_repeats);
    tcase_add_test(tc, crowded_probes_wrap);
    tcase_add_test(tc, many_at_once_as_one_at_a_time);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
