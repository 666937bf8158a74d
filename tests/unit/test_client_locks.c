/* The client's locks (client_impl.h, "Locks"): what needs no broker never
 * waits for one. One thread acquires from a FAKE broker that reads the
 * request and never answers, so that it holds the client's lock for a whole
 * request timeout; meanwhile the test's thread looks up tensors of a lease
 * it holds, misses, reads each miss's message, checks the lease, and is
 * refused its release and a container removal. All of it must be done
 * while the acquire still waits. The fake stands in for the broker only;
 * what is tested is libwbclient's locking. Run it under TSan as well. */
#include "wb/client.h"

#include "fake_broker.h"

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* Long against anything the lookups do, even under the sanitizers on a
 * loaded machine: they must end before it does. */
#define TIMEOUT_MS 3000

typedef struct acquirer {
    wb_client *client;
    int rc;
    wb_lease *lease;
    atomic_int done;
} acquirer;

static void *acquire_main(void *arg)
{
    acquirer *a = arg;
    a->rc = wb_lease_acquire(a->client, "demo", &a->lease);
    atomic_store(&a->done, 1);
    return NULL;
}

/* One round of calls that need no broker, each failing call's message
 * checked whole: the status is the call's own and so, with no other thread
 * failing meanwhile, is the message. */
static void lookups(wb_client *c, wb_lease *l)
{
    char id[33], want[300];
    wb_lease_id_hex(l, id);
    wb_tensor_view v;

    ck_assert_int_eq(wb_lease_find(l, "nosuch", &v), WB_ENOTFOUND);
    snprintf(want, sizeof want, "lease %.8s (model 'demo'): no tensor 'nosuch'", id);
    ck_assert_str_eq(wb_client_errmsg(c), want);

    ck_assert_int_eq(wb_lease_find(l, "b", &v), WB_OK);
    ck_assert_uint_eq(v.nbytes, 100);

    const char *names[3] = {"a", "missing", "gone"};
    wb_tensor_view views[3];
    ck_assert_int_eq(wb_lease_find_many(l, names, 3, views), WB_ENOTFOUND);
    snprintf(want, sizeof want,
             "lease %.8s (model 'demo'): no tensor 'missing' (names[1]; 2 of 3 names not found)",
             id);
    ck_assert_str_eq(wb_client_errmsg(c), want);
    ck_assert_str_eq(views[0].name, "a");

    ck_assert_int_eq(wb_lease_tensor(l, 2, &v), WB_EINVAL);
    snprintf(want, sizeof want,
             "lease %.8s (model 'demo'): tensor index 2 out of range (2 tensors)", id);
    ck_assert_str_eq(wb_client_errmsg(c), want);

    ck_assert_int_eq(wb_lease_verify(l, NULL), WB_OK);

    ck_assert_int_eq(wb_lease_container_remove(l), WB_EINVAL);
    snprintf(want, sizeof want, "lease %.8s: container_remove without a matching container_add",
             id);
    ck_assert_str_eq(wb_client_errmsg(c), want);

    /* A release refused for a live container tells the broker nothing. */
    ck_assert_int_eq(wb_lease_container_add(l), WB_OK);
    wb_lease *same = l;
    ck_assert_int_eq(wb_lease_release(&same), WB_EBUSY);
    ck_assert_ptr_eq(same, l);
    snprintf(want, sizeof want, "release lease %.8s (model 'demo'): 1 container(s) still use it",
             id);
    ck_assert_str_eq(wb_client_errmsg(c), want);
    ck_assert_int_eq(wb_lease_container_remove(l), WB_OK);
    ck_assert_uint_eq(wb_lease_containers(l), 0);
}

START_TEST(lookups_do_not_wait_for_the_broker)
{
    fake_env f;
    fake_env_start(&f, 60000);
    wb_client *c = fake_connect(f.b.path, 1, TIMEOUT_MS);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    lookups(c, l); /* the indexes are made: what follows only reads them */

    atomic_store(&f.b.mode, FAKE_SILENT);
    int seen = atomic_load(&f.b.n_received);
    acquirer a = {.client = c};
    int64_t t0 = test_now_ms();
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, acquire_main, &a), 0);
    /* Once the fake has the request, the acquire holds the client's lock
     * until its timeout. */
    while (atomic_load(&f.b.n_received) == seen && !atomic_load(&a.done))
        test_sleep_ms(1);
    ck_assert_int_eq(atomic_load(&a.done), 0);

    int64_t t1 = test_now_ms();
    for (int i = 0; i < 50; i++)
        lookups(c, l);
    int64_t took = test_now_ms() - t1;
    int acquired = atomic_load(&a.done);
    ck_assert_msg(!acquired,
                  "the lookups ended after the acquire that waited for the broker (%lld ms, "
                  "timeout %d ms): they waited for its lock",
                  (long long)took, TIMEOUT_MS);
    ck_assert_msg(took < TIMEOUT_MS / 2, "the lookups took %lld ms, the timeout is %d ms",
                  (long long)took, TIMEOUT_MS);

    /* The acquire did wait for the broker, and its message is its own. */
    pthread_join(th, NULL);
    ck_assert_int_eq(a.rc, WB_ETIMEDOUT);
    ck_assert_ptr_null(a.lease);
    ck_assert_int_ge(test_now_ms() - t0, TIMEOUT_MS / 2);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "acquire 'demo': no reply from the broker"));

    /* The broker answers again: the release reconnects and is told. */
    atomic_store(&f.b.mode, FAKE_NORMAL);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_locks");
    TCase *tc = tcase_create("client_locks");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, lookups_do_not_wait_for_the_broker);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
