/* The client library across a broker's death and restart, against a small
 * scripted broker in a thread: the loss is noticed by the heartbeat thread,
 * reconnection attempts back off (50 ms doubling to 2 s) instead of
 * hammering, mappings stay valid, a restarted broker (another instance id)
 * orphans the old leases at once, and the client can acquire again.
 *
 * The client runs on this file's clock (wb__client_clock), which moves only
 * when a test moves it, so that every beat and attempt is checked at the
 * millisecond it is due, without sleeping through the backoff. What stays
 * on real time is the exchange itself: a heartbeat to a broker that died
 * waits out its request timeout in zmq_poll, kept short here (200 ms). */
#include "wb/client.h"

#include "client_impl.h"
#include "fake_broker.h"
#include "mapcache.h"
#include "shm.h"
#include "wire.h"

#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The leases of this file's fake broker: one tensor "w" of 64 bytes. */
static const fake_tensor tensors[1] = {{"w", "U8", 0, 64, 64}};

typedef fake_broker fake;

static char dir[64];
static wb_shm slab;

/* The clients' clock: it starts well above 0 (0 means "none" to the
 * client's deadlines) and moves only through run_to. */
#define CLOCK_START 1000000
static _Atomic int64_t clock_ms = CLOCK_START;

static int64_t test_clock(void)
{
    return atomic_load(&clock_ms);
}

/* Moves the clock to `t` and waits until the client's heartbeat thread has
 * done all that is due by then and gone back to sleep. The real-time bound
 * only keeps a broken thread from hanging the test. */
static void run_to(wb_client *c, int64_t t)
{
    ck_assert_int_ge(t, atomic_load(&clock_ms));
    atomic_store(&clock_ms, t);
    wb__client_wake(c);
    int64_t give_up = test_now_ms() + 30000;
    while (atomic_load(&c->hb_idle_ms) < t) {
        ck_assert_msg(test_now_ms() < give_up,
                      "the heartbeat thread is not asleep at %+lld ms (last asleep at %+lld ms)",
                      (long long)(t - CLOCK_START),
                      (long long)(atomic_load(&c->hb_idle_ms) - CLOCK_START));
        test_sleep_ms(1);
    }
}

/* A broker run with its own instance id on the same socket path, granting
 * leases on the same slab; it asks for a heartbeat every 20 ms. */
static void fake_start(fake *f, uint64_t instance)
{
    char path[160];
    snprintf(path, sizeof path, "%s/broker.sock", dir);
    fake_broker_start(f, path, &slab, 20, instance, tensors, 1);
}

/* The broker dies: its socket closes and, as after a crash, nothing
 * listens on the path any more. */
static void fake_stop(fake *f)
{
    fake_broker_stop(f);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/wbtest-reconnect-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    fake_slab_create(&slab, 4096, 13, 5);
    atomic_store(&clock_ms, CLOCK_START);
    wb__client_clock(test_clock);
}

static void teardown(void)
{
    wb__client_clock(NULL);
    fake_slab_destroy(&slab);
    rmdir(dir);
}

static unsigned attempts(wb_client *c)
{
    return atomic_load(&c->reconnect_attempts);
}

START_TEST(backoff_then_reconnect_to_a_new_broker)
{
    fake f;
    fake_start(&f, 0x11);
    const int timeout_ms = 200;
    wb_client *c = fake_connect(f.path, 0, timeout_ms);
    wb_lease *old = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &old), WB_OK);

    /* A beat every 20 ms, none in between. */
    const int64_t t0 = CLOCK_START;
    for (int i = 1; i <= 3; i++) {
        run_to(c, t0 + 20 * i - 1);
        ck_assert_int_eq(atomic_load(&f.n_heartbeat), i - 1);
        run_to(c, t0 + 20 * i);
        ck_assert_int_eq(atomic_load(&f.n_heartbeat), i);
    }
    ck_assert_int_eq(wb_lease_orphaned(old), 0);
    ck_assert_int_eq(wb_client_connected(c), 1);

    /* The broker dies. The next beat finds it gone (after its request
     * timeout, in real time) and the loss shows; nothing was tried yet. */
    fake_stop(&f);
    const int64_t lost = t0 + 80;
    unsigned a0 = attempts(c);
    run_to(c, lost);
    ck_assert_int_eq(wb_client_connected(c), 0);
    ck_assert_uint_eq(attempts(c), a0);

    /* The heartbeat thread tries 50, 100, 200, 400, 800, 1600 ms apart,
     * then every 2 s (the cap), each at the millisecond it is due and not
     * one before (a heartbeat-paced loop would try every 20 ms). */
    static const int gaps[] = {50, 100, 200, 400, 800, 1600, 2000, 2000};
    int64_t at = lost;
    for (unsigned i = 0; i < sizeof gaps / sizeof gaps[0]; i++) {
        at += gaps[i];
        run_to(c, at - 1);
        ck_assert_msg(attempts(c) - a0 == i, "%u attempts before %+lld ms, not %u",
                      attempts(c) - a0, (long long)(at - lost), i);
        run_to(c, at);
        ck_assert_msg(attempts(c) - a0 == i + 1, "%u attempts at %+lld ms, not %u",
                      attempts(c) - a0, (long long)(at - lost), i + 1);
        ck_assert_int_eq(wb_client_connected(c), 0);
    }

    /* Meanwhile the mapping is intact. */
    ck_assert_int_eq(wb_lease_verify(old, NULL), WB_OK);

    /* An application call does not wait for the backoff: it tries at once
     * and fails fast, in less than a request timeout. */
    wb_lease *l = NULL;
    unsigned a1 = attempts(c);
    int64_t t1 = test_now_ms();
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_ECONN);
    ck_assert_int_lt(test_now_ms() - t1, timeout_ms);
    ck_assert_uint_eq(attempts(c), a1 + 1);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "no broker socket at"));

    /* A new broker (another instance, same pid) on the same path: the
     * heartbeat thread reconnects at its next attempt, within the 2 s cap
     * of the call's, and not before; the old lease is orphaned by the hello
     * itself, and the heartbeat sent at once after it carries no lease. */
    fake_start(&f, 0x22);
    run_to(c, at + 1999);
    ck_assert_int_eq(wb_client_connected(c), 0);
    ck_assert_int_eq(atomic_load(&f.n_hello), 0);
    ck_assert_int_eq(wb_lease_orphaned(old), 0);
    run_to(c, at + 2000);
    ck_assert_int_eq(wb_client_connected(c), 1);
    ck_assert_int_eq(wb_lease_orphaned(old), 1);
    ck_assert_uint_eq(atomic_load(&c->reconnects), 1);
    ck_assert_int_eq(atomic_load(&f.n_hello), 1);
    ck_assert_int_eq(atomic_load(&f.n_heartbeat), 1);
    ck_assert_int_eq(atomic_load(&f.last_beats), 0);
    ck_assert_int_eq(wb_lease_verify(old, NULL), WB_OK);

    /* And it can acquire again, a lease the new broker knows. */
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_lease_orphaned(l), 0);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(wb_lease_orphaned(l), 0);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    /* The orphaned lease ends locally: there is nobody to tell. */
    int released = atomic_load(&f.n_release);
    ck_assert_int_eq(wb_lease_release(&old), WB_OK);
    ck_assert_int_eq(atomic_load(&f.n_release), released);
    /* The new broker's slab lingers for the next lease; the old one's does
     * not; destroy unmaps what lingers. */
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    wb_client_destroy(&c);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    fake_stop(&f);
}
END_TEST

/* A broker restart between two heartbeats (no failed exchange at all):
 * the heartbeat reply's unknown ids still orphan the leases. */
START_TEST(restart_between_heartbeats)
{
    fake f;
    fake_start(&f, 0x33);
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = f.path;
    o.timeout_ms = 2000;
    o.no_heartbeat_thread = 1;
    wb_client *c = NULL;
    ck_assert_int_eq(wb_client_connect(&o, &c), WB_OK);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    fake_stop(&f);
    fake_start(&f, 0x44);
    /* libzmq reconnects the same socket by itself; the broker answers that
     * it does not know the lease. */
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(wb_lease_orphaned(l), 1);
    ck_assert_int_eq(wb_client_connected(c), 1);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reconnect");
    TCase *tc = tcase_create("reconnect");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, backoff_then_reconnect_to_a_new_broker);
    tcase_add_test(tc, restart_between_heartbeats);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
