/* Subscriptions to models' versions (wb_client_subscribe) against the FAKE
 * broker of fake_broker.h: one SubscribeRequest per model per connection,
 * the notice read as soon as it arrives and announced once, deduplicated
 * with the heartbeat replies' current versions (which catch up with a
 * dropped notice), subscriptions sent again after a reconnection, a client
 * that did not subscribe unaffected, a broker that predates versions
 * refused clearly, and Lease.version. */
#include "wb/client.h"

#include "client_impl.h"
#include "fake_broker.h"

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What a callback saw. */
typedef struct seen {
    atomic_int calls;
    atomic_uint version, previous;
    _Atomic int64_t at_us;
    char model[64];
    wb_client *client; /* set: the callback acquires and releases a lease */
    atomic_int acquired;
} seen;

static void on_version(void *arg, const char *model, uint32_t version, uint32_t previous)
{
    seen *s = arg;
    atomic_store(&s->at_us, test_now_us());
    snprintf(s->model, sizeof s->model, "%s", model);
    atomic_store(&s->version, version);
    atomic_store(&s->previous, previous);
    if (s->client) {
        /* No lock of the library is held: a callback may acquire. */
        wb_lease *l = NULL;
        if (wb_lease_acquire(s->client, "demo", &l) == WB_OK) {
            atomic_store(&s->acquired, (int)wb_lease_version(l));
            wb_lease_release(&l);
        }
    }
    atomic_fetch_add(&s->calls, 1);
}

static void wait_calls(seen *s, int n)
{
    int64_t give_up = test_now_ms() + 10000;
    while (atomic_load(&s->calls) < n) {
        ck_assert_msg(test_now_ms() < give_up, "%d callbacks after 10 s, expected %d",
                      atomic_load(&s->calls), n);
        test_sleep_ms(1);
    }
}

/* Long heartbeats (10 s): whatever arrives is the notice's doing. */
START_TEST(test_subscribe_notice_once)
{
    fake_env f;
    fake_env_start(&f, 10000);
    atomic_store(&f.b.version, 1);
    wb_client *c = fake_connect(f.b.path, 0, 2000);
    seen a = {0}, b = {0};
    uint32_t cur = 99;
    ck_assert_int_eq(wb_client_subscribe(c, "demo", on_version, &a, &cur), WB_OK);
    ck_assert_uint_eq(cur, 1);
    ck_assert_int_eq(atomic_load(&f.b.n_subscribe), 1);
    /* A second callback on the same model sends nothing. */
    ck_assert_int_eq(wb_client_subscribe(c, "demo", on_version, &b, &cur), WB_OK);
    ck_assert_uint_eq(cur, 1);
    ck_assert_int_eq(atomic_load(&f.b.n_subscribe), 1);

    fake_broker_notify(&f.b, "demo", 2, 1);
    wait_calls(&a, 1);
    wait_calls(&b, 1);
    int64_t latency = atomic_load(&a.at_us) - atomic_load(&f.b.notice_sent_us);
    fprintf(stderr, "notice to callback: %lld us\n", (long long)latency);
    /* Well under a millisecond on an idle machine; generous for sanitizers
     * and a loaded one, and far below the 10 s heartbeat. */
    ck_assert_int_lt(latency, 200000);
    ck_assert_str_eq(a.model, "demo");
    ck_assert_uint_eq(atomic_load(&a.version), 2);
    ck_assert_uint_eq(atomic_load(&a.previous), 1);
    /* The same version again (a heartbeat, a repeated notice): nothing. */
    fake_broker_notify(&f.b, "demo", 2, 1);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    test_sleep_ms(50);
    ck_assert_int_eq(atomic_load(&a.calls), 1);
    ck_assert_int_eq(atomic_load(&b.calls), 1);
    /* A rollback makes an older version current: announced. */
    fake_broker_notify(&f.b, "demo", 1, 2);
    wait_calls(&a, 2);
    ck_assert_uint_eq(atomic_load(&a.version), 1);
    ck_assert_uint_eq(atomic_load(&a.previous), 2);

    ck_assert_int_eq(wb_client_unsubscribe(c, "demo", on_version, &a), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_unsubscribe), 0); /* b still listens */
    ck_assert_int_eq(wb_client_unsubscribe(c, "demo", on_version, &a), WB_ENOTFOUND);
    ck_assert_int_eq(wb_client_unsubscribe(c, "demo", on_version, &b), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_unsubscribe), 1);
    fake_broker_notify(&f.b, "demo", 3, 1);
    ck_assert_int_eq(atomic_load(&f.b.n_notices_sent), 3); /* none after the unsubscribe */
    test_sleep_ms(50);
    ck_assert_int_eq(atomic_load(&a.calls), 2);
    ck_assert_int_eq(atomic_load(&b.calls), 2);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

/* A client that did not subscribe gets no notice and works as before; one
 * that did keeps its exchanges working with notices in between. */
START_TEST(test_unsubscribed_unaffected)
{
    fake_env f;
    fake_env_start(&f, 10000);
    atomic_store(&f.b.version, 1);
    wb_client *plain = fake_connect(f.b.path, 0, 2000);
    wb_client *sub = fake_connect(f.b.path, 0, 2000);
    seen s = {0};
    ck_assert_int_eq(wb_client_subscribe(sub, "demo", on_version, &s, NULL), WB_OK);
    fake_broker_notify(&f.b, "demo", 2, 1);
    ck_assert_int_eq(atomic_load(&f.b.n_notices_sent), 1);
    wait_calls(&s, 1);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(plain, "demo", &l), WB_OK);
    ck_assert_uint_eq(wb_lease_version(l), 2);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_int_eq(wb_client_heartbeat(plain), WB_OK);
    ck_assert_int_eq(wb_client_connected(plain), 1);
    wb_client_destroy(&plain);
    wb_client_destroy(&sub);
    fake_env_stop(&f);
}
END_TEST

/* The notice comes while another thread's exchange reads the socket: it is
 * recorded there and announced once, and the exchange still gets its own
 * reply. */
START_TEST(test_notice_during_exchange)
{
    fake_env f;
    fake_env_start(&f, 10000);
    atomic_store(&f.b.version, 1);
    wb_client *c = fake_connect(f.b.path, 0, 2000);
    seen s = {.client = c};
    ck_assert_int_eq(wb_client_subscribe(c, "demo", on_version, &s, NULL), WB_OK);
    for (uint32_t v = 2; v < 12; v++) {
        wb_lease *l = NULL;
        atomic_store(&f.b.delay_next_ms, 5);
        fake_broker_notify(&f.b, "demo", v, v - 1);
        ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
        ck_assert_int_eq(wb_lease_release(&l), WB_OK);
        wait_calls(&s, (int)v - 1);
        ck_assert_uint_eq(atomic_load(&s.version), v);
        /* The callback's own acquire got the new version. */
        ck_assert_int_eq(atomic_load(&s.acquired), (int)v);
    }
    ck_assert_int_eq(atomic_load(&s.calls), 10);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

/* A dropped notice is caught up with by the next heartbeat reply, once. */
START_TEST(test_heartbeat_catch_up)
{
    fake_env f;
    fake_env_start(&f, 30);
    atomic_store(&f.b.version, 4);
    wb_client *c = fake_connect(f.b.path, 0, 2000);
    seen s = {0};
    uint32_t cur = 0;
    ck_assert_int_eq(wb_client_subscribe(c, "demo", on_version, &s, &cur), WB_OK);
    ck_assert_uint_eq(cur, 4);
    atomic_store(&f.b.drop_notices, 1);
    fake_broker_notify(&f.b, "demo", 5, 4);
    ck_assert_int_eq(atomic_load(&f.b.n_notices_dropped), 1);
    wait_calls(&s, 1);
    ck_assert_uint_eq(atomic_load(&s.version), 5);
    ck_assert_uint_eq(atomic_load(&s.previous), 4);
    /* Many more beats: nothing new. */
    int beats = atomic_load(&f.b.n_heartbeat);
    while (atomic_load(&f.b.n_heartbeat) < beats + 4)
        test_sleep_ms(5);
    ck_assert_int_eq(atomic_load(&s.calls), 1);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

/* Without the heartbeat thread the callbacks run in wb_client_heartbeat. */
START_TEST(test_no_thread_dispatch)
{
    fake_env f;
    fake_env_start(&f, 10000);
    atomic_store(&f.b.version, 1);
    wb_client *c = fake_connect(f.b.path, 1, 2000);
    seen s = {0};
    ck_assert_int_eq(wb_client_subscribe(c, "demo", on_version, &s, NULL), WB_OK);
    fake_broker_notify(&f.b, "demo", 2, 1);
    test_sleep_ms(20);
    ck_assert_int_eq(atomic_load(&s.calls), 0);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(atomic_load(&s.calls), 1);
    ck_assert_uint_eq(atomic_load(&s.version), 2);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(atomic_load(&s.calls), 1);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

/* A broker that predates versions does not know the request. */
START_TEST(test_old_broker)
{
    fake_env f;
    fake_env_start(&f, 10000);
    atomic_store(&f.b.sub_mode, FAKE_SUB_UNKNOWN);
    wb_client *c = fake_connect(f.b.path, 0, 2000);
    seen s = {0};
    uint32_t cur = 7;
    ck_assert_int_eq(wb_client_subscribe(c, "demo", on_version, &s, &cur), WB_ENOSYS);
    ck_assert_uint_eq(cur, 0);
    ck_assert_str_eq(wb_client_errmsg(c),
                     "subscribe 'demo': the broker does not know subscriptions (it predates "
                     "versions; it answered: request has no body)");
    ck_assert_int_eq(wb_client_connected(c), 1);
    ck_assert_int_eq(wb_client_unsubscribe(c, "demo", on_version, &s), WB_ENOTFOUND);
    /* A lease from it has version 0. */
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_uint_eq(wb_lease_version(l), 0);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_uint_eq(wb_lease_version(NULL), 0);
    ck_assert_int_eq(wb_client_subscribe(c, "demo", NULL, &s, NULL), WB_EINVAL);
    ck_assert_int_eq(wb_client_subscribe(c, "", on_version, &s, NULL), WB_EINVAL);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

/* The broker restarts: the client reconnects and subscribes again by
 * itself; a version that changed meanwhile is announced, and notices of the
 * new run arrive. */
START_TEST(test_resubscribe_after_reconnect)
{
    fake_env f;
    fake_env_start(&f, 20);
    atomic_store(&f.b.version, 1);
    wb_client *c = fake_connect(f.b.path, 0, 300);
    seen s = {0};
    ck_assert_int_eq(wb_client_subscribe(c, "demo", on_version, &s, NULL), WB_OK);
    char path[160];
    snprintf(path, sizeof path, "%s", f.b.path);
    fake_broker_stop(&f.b);
    int64_t give_up = test_now_ms() + 10000;
    while (wb_client_connected(c)) {
        ck_assert_msg(test_now_ms() < give_up, "the loss was not noticed");
        test_sleep_ms(5);
    }
    fake_broker_start(&f.b, path, &f.slab, 20, 0, fake_env_tensors, 2);
    atomic_store(&f.b.version, 3);
    while (atomic_load(&f.b.n_subscribe) < 1) {
        ck_assert_msg(test_now_ms() < give_up, "no SubscribeRequest after the restart");
        test_sleep_ms(5);
    }
    wait_calls(&s, 1);
    ck_assert_uint_eq(atomic_load(&s.version), 3);
    ck_assert_uint_eq(atomic_load(&s.previous), 1);
    fake_broker_notify(&f.b, "demo", 4, 3);
    wait_calls(&s, 2);
    ck_assert_uint_eq(atomic_load(&s.version), 4);
    ck_assert_int_eq(atomic_load(&f.b.n_subscribe), 1);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("subs");
    TCase *tc = tcase_create("subscriptions");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_subscribe_notice_once);
    tcase_add_test(tc, test_unsubscribed_unaffected);
    tcase_add_test(tc, test_notice_during_exchange);
    tcase_add_test(tc, test_heartbeat_catch_up);
    tcase_add_test(tc, test_no_thread_dispatch);
    tcase_add_test(tc, test_old_broker);
    tcase_add_test(tc, test_resubscribe_after_reconnect);
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
