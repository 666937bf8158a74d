/* Runs in flight while the weights change: several threads run one
 * container in a loop (the FAKE AOTI library's runs last 2 ms and read
 * each weight from the leased memory along the way) while another thread
 * swaps a new version in again and again (wb_container_update), each
 * version's weights equal to its number. Every run's output must be
 * exactly that of the version wb_container_run_versioned reported, never a
 * mix; and right after each update returns, the replaced version's memory
 * is poisoned and its lease released, so that a run still reading it, or
 * one that began on it and ended on the next, fails the test. */
#include "swap_fixture.h"

#include <pthread.h>
#include <stdatomic.h>

#define RUNNERS  4
#define VERSIONS 40

typedef struct shared {
    wb_container *c;
    atomic_int stop;
    atomic_int runs, bad, failed;
    atomic_uint max_seen;
    char first_bad[200];
} shared;

static void *runner(void *arg)
{
    shared *s = arg;
    uint32_t last = 0;
    while (!atomic_load(&s->stop)) {
        float out[SWAP_ELEMS];
        uint32_t v = 0;
        int rc = swap_run(s->c, out, &v);
        if (rc != WB_OK) {
            atomic_fetch_add(&s->failed, 1);
            continue;
        }
        atomic_fetch_add(&s->runs, 1);
        if (!swap_is(out, v) || v < last) {
            if (atomic_fetch_add(&s->bad, 1) == 0)
                snprintf(s->first_bad, sizeof s->first_bad,
                         "version %u reported (last %u), outputs %g .. %g, expected %g", v, last,
                         (double)out[0], (double)out[SWAP_ELEMS - 1], 2.0 * v);
        }
        last = v;
        unsigned m = atomic_load(&s->max_seen);
        while (v > m && !atomic_compare_exchange_weak(&s->max_seen, &m, v))
            ;
    }
    return NULL;
}

START_TEST(test_runs_see_one_version)
{
    swap_env e;
    swap_start(&e, "v211",
               "elements 64\nrun_delay_us 2000\nconst w model.weight 6 256\n"
               "const b model.bias 6 256\n",
               10000);
    wb_client *client = fake_connect(e.b.path, 0, 5000);
    wb_lease *cur = NULL;
    ck_assert_int_eq(wb_lease_acquire(client, "demo", &cur), WB_OK);
    wb_container_options o;
    wb_container_options_init(&o);
    o.num_models = RUNNERS;
    shared s = {0};
    ck_assert_int_eq(wb_container_create(&cur, 1, e.so, &o, &s.c), WB_OK);
    pthread_t t[RUNNERS];
    for (int i = 0; i < RUNNERS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, runner, &s), 0);
    double worst = 0;
    for (uint32_t v = 2; v <= VERSIONS; v++) {
        swap_publish(&e, v, 0);
        wb_lease *nl = NULL;
        ck_assert_int_eq(wb_lease_acquire(client, "demo", &nl), WB_OK);
        int rc = wb_container_update(s.c, &nl, 1);
        ck_assert_msg(rc == WB_OK, "update to %u: %s", v, wb_container_errmsg(s.c));
        /* Nothing may read version v - 1 any more. */
        swap_fill(&e, v - 1, -1000.0f);
        ck_assert_int_eq(wb_lease_release(&cur), WB_OK);
        cur = nl;
        wb_container_info info;
        ck_assert_int_eq(wb_container_get_info(s.c, &info), WB_OK);
        ck_assert_uint_eq(info.swaps, v - 1);
        if (info.last_swap_ms > worst)
            worst = info.last_swap_ms;
        /* Let runs happen on this version. */
        int runs = atomic_load(&s.runs);
        while (atomic_load(&s.runs) < runs + RUNNERS && !atomic_load(&s.bad))
            test_sleep_ms(1);
    }
    atomic_store(&s.stop, 1);
    for (int i = 0; i < RUNNERS; i++)
        pthread_join(t[i], NULL);
    fprintf(stderr, "runs %d, worst swap %.2f ms\n", atomic_load(&s.runs), worst);
    ck_assert_msg(atomic_load(&s.bad) == 0, "%d runs saw a mix or a wrong version: %s",
                  atomic_load(&s.bad), s.first_bad);
    ck_assert_int_eq(atomic_load(&s.failed), 0);
    ck_assert_uint_eq(atomic_load(&s.max_seen), VERSIONS);
    ck_assert_int_gt(atomic_load(&s.runs), VERSIONS * RUNNERS);
    wb_container_destroy(&s.c);
    ck_assert_int_eq(wb_lease_release(&cur), WB_OK);
    wb_client_destroy(&client);
    swap_stop(&e);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("container_swap");
    TCase *tc = tcase_create("swap");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_runs_see_one_version);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
