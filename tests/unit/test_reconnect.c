/* The client library across a broker's death and restart, against a small
 * scripted broker in a thread: the loss is noticed by the heartbeat thread,
 * reconnection attempts back off (50 ms doubling to 2 s) instead of
 * hammering, mappings stay valid, a restarted broker (another instance id)
 * orphans the old leases at once, and the client can acquire again. */
#include "wb/client.h"

#include "client_impl.h"
#include "fake_broker.h"
#include "mapcache.h"
#include "shm.h"
#include "wire.h"

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

/* The leases of this file's fake broker: one tensor "w" of 64 bytes. */
static const fake_tensor tensors[1] = {{"w", "U8", 0, 64, 64}};

typedef fake_broker fake;

static char dir[64];
static wb_shm slab;

static int64_t now_ms(void)
{
    return test_now_ms();
}

static void sleep_ms(int ms)
{
    test_sleep_ms(ms);
}

/* A broker run with its own instance id on the same socket path, granting
 * leases on the same slab. */
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
}

static void teardown(void)
{
    fake_slab_destroy(&slab);
    rmdir(dir);
}

static wb_client *connect_to(const char *path, int timeout_ms)
{
    return fake_connect(path, 0, timeout_ms);
}

static int wait_until(wb_client *c, int want_connected, int ms)
{
    int64_t deadline = now_ms() + ms;
    while (wb_client_connected(c) != want_connected && now_ms() < deadline)
        sleep_ms(5);
    return wb_client_connected(c) == want_connected;
}

START_TEST(backoff_then_reconnect_to_a_new_broker)
{
    fake f;
    fake_start(&f, 0x11);
    wb_client *c = connect_to(f.path, 200);
    wb_lease *old = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &old), WB_OK);
    int64_t t0 = now_ms();
    while (atomic_load(&f.n_heartbeat) < 3 && now_ms() - t0 < 5000)
        sleep_ms(5);
    ck_assert_int_ge(atomic_load(&f.n_heartbeat), 3);
    ck_assert_int_eq(wb_lease_orphaned(old), 0);

    /* The broker dies. Within a heartbeat and a timeout the loss shows. */
    fake_stop(&f);
    ck_assert(wait_until(c, 0, 3000));
    int64_t lost_at = now_ms();
    unsigned a0 = atomic_load(&c->reconnect_attempts);
    sleep_ms(1600);
    unsigned tries = atomic_load(&c->reconnect_attempts) - a0;
    /* 50, 100, 200, 400, 800 ms apart: at most five tries in 1.6 s (a
     * heartbeat-paced loop would have made some eighty). */
    ck_assert_msg(tries >= 2 && tries <= 6, "%u reconnection attempts in 1.6 s", tries);
    a0 = atomic_load(&c->reconnect_attempts);
    sleep_ms(4200);
    tries = atomic_load(&c->reconnect_attempts) - a0;
    /* 1.6 s then 2 s apart (the cap): two in these 4.2 s, one on a very
     * slow machine, never more than three. */
    ck_assert_msg(tries >= 1 && tries <= 3, "%u reconnection attempts in 4.2 s near the cap",
                  tries);
    ck_assert_int_eq(wb_client_connected(c), 0);
    (void)lost_at;

    /* Meanwhile the mapping is intact. */
    ck_assert_int_eq(wb_lease_verify(old, NULL), WB_OK);

    /* An application call does not wait for the backoff: it tries at once
     * and fails fast. */
    wb_lease *l = NULL;
    int64_t t1 = now_ms();
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_ECONN);
    ck_assert_int_lt(now_ms() - t1, 150);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "no broker socket at"));

    /* A new broker (another instance, same pid) on the same path: the
     * heartbeat thread reconnects within the 2 s cap, and the old lease is
     * orphaned without waiting for a heartbeat to say so. */
    fake_start(&f, 0x22);
    ck_assert(wait_until(c, 1, 4000));
    ck_assert_int_eq(wb_lease_orphaned(old), 1);
    ck_assert_uint_ge(atomic_load(&c->reconnects), 1);
    ck_assert_int_eq(wb_lease_verify(old, NULL), WB_OK);

    /* And it can acquire again, a lease the new broker knows. */
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_lease_orphaned(l), 0);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(wb_lease_orphaned(l), 0);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    /* The orphaned lease ends locally: there is nobody to tell. */
    ck_assert_int_eq(wb_lease_release(&old), WB_OK);
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
