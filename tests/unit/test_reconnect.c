/* The client library across a broker's death and restart, against a small
 * scripted broker in a thread: the loss is noticed by the heartbeat thread,
 * reconnection attempts back off (50 ms doubling to 2 s) instead of
 * hammering, mappings stay valid, a restarted broker (another instance id)
 * orphans the old leases at once, and the client can acquire again. */
#include "wb/client.h"

#include "client_impl.h"
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

typedef struct fake {
    char path[128];
    void *ctx, *router;
    pthread_t thread;
    atomic_int stop;
    uint64_t instance;
    uint8_t lease_id[WB_LEASE_ID_LEN];
    int granted;
    atomic_int n_hello, n_heartbeat;
    wb_shm *slab;
} fake;

static char dir[64];
static wb_shm slab;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void answer(fake *f, zmq_msg_t *ident, const Wbproto__Request *req)
{
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.id = req->id;
    Wbproto__HelloReply hello = WBPROTO__HELLO_REPLY__INIT;
    Wbproto__AcquireReply acq = WBPROTO__ACQUIRE_REPLY__INIT;
    Wbproto__Lease lease = WBPROTO__LEASE__INIT;
    Wbproto__Slab s = WBPROTO__SLAB__INIT;
    Wbproto__Slab *slabs[1] = {&s};
    Wbproto__Tensor t = WBPROTO__TENSOR__INIT;
    Wbproto__Tensor *tensors[1] = {&t};
    uint64_t shape[1] = {64};
    Wbproto__ReleaseReply rel = WBPROTO__RELEASE_REPLY__INIT;
    Wbproto__HeartbeatReply hb = WBPROTO__HEARTBEAT_REPLY__INIT;
    ProtobufCBinaryData unknown[8];

    switch (req->body_case) {
    case WBPROTO__REQUEST__BODY_HELLO:
        atomic_fetch_add(&f->n_hello, 1);
        hello.broker_version = "fake";
        hello.broker_pid = (uint32_t)getpid(); /* the same pid across restarts */
        hello.broker_instance = f->instance;
        hello.backend = WBPROTO__BACKEND__BACKEND_HOST;
        hello.heartbeat_interval_ms = 20;
        hello.stale_after_ms = 100;
        rep.body_case = WBPROTO__REPLY__BODY_HELLO;
        rep.hello = &hello;
        break;
    case WBPROTO__REQUEST__BODY_ACQUIRE:
        memset(f->lease_id, (int)(f->instance & 0xff), WB_LEASE_ID_LEN);
        f->lease_id[15] = (uint8_t)++f->granted;
        lease.id.data = f->lease_id;
        lease.id.len = WB_LEASE_ID_LEN;
        lease.model = "demo";
        s.backend = WBPROTO__BACKEND__BACKEND_HOST;
        s.device = -1;
        s.size = f->slab->size;
        s.shm_name = f->slab->name;
        lease.n_slabs = 1;
        lease.slabs = slabs;
        t.name = "w";
        t.dtype = "U8";
        t.n_shape = 1;
        t.shape = shape;
        t.nbytes = 64;
        t.xxh3 = XXH3_64bits(f->slab->addr, 64);
        lease.n_tensors = 1;
        lease.tensors = tensors;
        acq.lease = &lease;
        rep.body_case = WBPROTO__REPLY__BODY_ACQUIRE;
        rep.acquire = &acq;
        break;
    case WBPROTO__REQUEST__BODY_RELEASE:
        rel.model_state = WBPROTO__MODEL_STATE__MODEL_READY;
        rep.body_case = WBPROTO__REPLY__BODY_RELEASE;
        rep.release = &rel;
        break;
    case WBPROTO__REQUEST__BODY_HEARTBEAT:
        atomic_fetch_add(&f->n_heartbeat, 1);
        /* Only leases this instance granted are known. */
        for (size_t i = 0; i < req->heartbeat->n_leases && hb.n_unknown_leases < 8; i++) {
            const ProtobufCBinaryData *id = &req->heartbeat->leases[i]->lease_id;
            if (id->data[0] != (uint8_t)(f->instance & 0xff))
                unknown[hb.n_unknown_leases++] = *id;
        }
        hb.unknown_leases = unknown;
        rep.body_case = WBPROTO__REPLY__BODY_HEARTBEAT;
        rep.heartbeat = &hb;
        break;
    default:
        rep.status = WB_ENOSYS;
        rep.error = "not in this fake";
        break;
    }
    size_t len;
    uint8_t *buf = wb__reply_pack(&rep, &len);
    zmq_msg_send(ident, f->router, ZMQ_SNDMORE);
    zmq_send(f->router, buf, len, 0);
    free(buf);
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    while (!atomic_load(&f->stop)) {
        zmq_pollitem_t item = {.socket = f->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, 10) <= 0)
            continue;
        zmq_msg_t ident, payload;
        zmq_msg_init(&ident);
        zmq_msg_init(&payload);
        zmq_msg_recv(&ident, f->router, 0);
        zmq_msg_recv(&payload, f->router, 0);
        Wbproto__Request *req = NULL;
        uint64_t id;
        wb_err err;
        if (wb__request_decode(zmq_msg_data(&payload), zmq_msg_size(&payload), &req, &id, &err) ==
            WB_OK)
            answer(f, &ident, req);
        wb__request_free(&req);
        zmq_msg_close(&ident);
        zmq_msg_close(&payload);
    }
    return NULL;
}

static void fake_start(fake *f, uint64_t instance)
{
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s/broker.sock", dir);
    f->instance = instance;
    f->slab = &slab;
    f->ctx = zmq_ctx_new();
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof linger);
    char ep[160];
    snprintf(ep, sizeof ep, "ipc://%s", f->path);
    ck_assert_int_eq(zmq_bind(f->router, ep), 0);
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

/* The broker dies: its socket closes and, as after a crash, nothing
 * listens on the path any more. */
static void fake_stop(fake *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    unlink(f->path);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/wbtest-reconnect-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    wb_err err;
    ck_assert_int_eq(wb__shm_create(&slab, 4096, &err), WB_OK);
    for (size_t i = 0; i < 4096; i++)
        ((uint8_t *)slab.addr)[i] = (uint8_t)(i * 13 + 5);
}

static void teardown(void)
{
    wb__shm_unlink(&slab);
    wb__shm_unmap(&slab);
    rmdir(dir);
}

static wb_client *connect_to(const char *path, int timeout_ms)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = path;
    o.timeout_ms = timeout_ms;
    wb_client *c = NULL;
    int rc = wb_client_connect(&o, &c);
    ck_assert_msg(rc == WB_OK, "connect: %s", wb_client_errmsg(c));
    return c;
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
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    wb_client_destroy(&c);
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
