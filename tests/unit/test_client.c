/* libwbclient against a scripted broker in a thread of the test: connection
 * failures, replies the client must refuse, lease lifetime, containers,
 * heartbeats and orphaned leases. The real broker is exercised by the
 * integration tests; here every answer is under the test's control. */
#include "wb/client.h"

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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

enum fake_mode {
    FAKE_NORMAL,
    FAKE_CUDA,   /* grant a lease on a cuda slab */
    FAKE_SILENT, /* read requests, never answer */
};

typedef struct fake {
    char dir[64];
    char path[128];
    void *ctx, *router;
    pthread_t thread;
    atomic_int stop;
    atomic_int mode;
    atomic_int delay_next_ms; /* delay the next answer by this much, once */
    atomic_int forget;        /* heartbeats: report every lease as unknown */
    uint32_t heartbeat_ms;
    atomic_int n_hello, n_acquire, n_release, n_heartbeat;
    atomic_uint last_containers;
    atomic_int last_beats;
    uint8_t released_id[WB_LEASE_ID_LEN];
    uint8_t next_id;
    wb_shm slab;
} fake;

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

static void fill_lease(fake *f, Wbproto__Lease *lease, Wbproto__Slab *slab, Wbproto__Slab **slabs,
                       Wbproto__Tensor *t, Wbproto__Tensor **tensors, uint64_t *shape, uint8_t *id,
                       uint8_t *handle, const char *model)
{
    memset(id, 0, WB_LEASE_ID_LEN);
    id[0] = 0xab;
    id[15] = ++f->next_id;
    lease->id.data = id;
    lease->id.len = WB_LEASE_ID_LEN;
    lease->model = (char *)model;
    slab->index = 0;
    slab->size = f->slab.size;
    if (atomic_load(&f->mode) == FAKE_CUDA) {
        slab->backend = WBPROTO__BACKEND__BACKEND_CUDA;
        slab->device = 0;
        memset(handle, 0x11, 64);
        slab->cuda_ipc_handle.data = handle;
        slab->cuda_ipc_handle.len = 64;
    } else {
        slab->backend = WBPROTO__BACKEND__BACKEND_HOST;
        slab->device = -1;
        slab->shm_name = f->slab.name;
    }
    slabs[0] = slab;
    lease->n_slabs = 1;
    lease->slabs = slabs;
    static const char *names[2] = {"a", "b"};
    static const uint64_t offsets[2] = {0, 256};
    static const uint64_t sizes[2] = {64, 100};
    shape[0] = 16;
    shape[1] = 25;
    for (int i = 0; i < 2; i++) {
        t[i].name = (char *)names[i];
        t[i].dtype = i == 0 ? "F32" : "U8";
        t[i].n_shape = 1;
        t[i].shape = &shape[i];
        t[i].slab = 0;
        t[i].offset = offsets[i];
        t[i].nbytes = sizes[i];
        t[i].xxh3 = XXH3_64bits((const uint8_t *)f->slab.addr + offsets[i], sizes[i]);
        tensors[i] = &t[i];
    }
    lease->n_tensors = 2;
    lease->tensors = tensors;
}

static void answer(fake *f, zmq_msg_t *ident, const Wbproto__Request *req)
{
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.id = req->id;
    Wbproto__HelloReply hello = WBPROTO__HELLO_REPLY__INIT;
    Wbproto__AcquireReply acq = WBPROTO__ACQUIRE_REPLY__INIT;
    Wbproto__Lease lease = WBPROTO__LEASE__INIT;
    Wbproto__Slab slab = WBPROTO__SLAB__INIT;
    Wbproto__Slab *slabs[1];
    Wbproto__Tensor t[2] = {WBPROTO__TENSOR__INIT, WBPROTO__TENSOR__INIT};
    Wbproto__Tensor *tensors[2];
    uint64_t shape[2];
    uint8_t id[WB_LEASE_ID_LEN], handle[64];
    Wbproto__ReleaseReply rel = WBPROTO__RELEASE_REPLY__INIT;
    Wbproto__HeartbeatReply hb = WBPROTO__HEARTBEAT_REPLY__INIT;
    ProtobufCBinaryData unknown[16];

    switch (req->body_case) {
    case WBPROTO__REQUEST__BODY_HELLO:
        atomic_fetch_add(&f->n_hello, 1);
        hello.broker_version = "fake";
        hello.broker_pid = (uint32_t)getpid();
        hello.backend = WBPROTO__BACKEND__BACKEND_HOST;
        hello.heartbeat_interval_ms = f->heartbeat_ms;
        hello.stale_after_ms = 5 * f->heartbeat_ms;
        rep.body_case = WBPROTO__REPLY__BODY_HELLO;
        rep.hello = &hello;
        break;
    case WBPROTO__REQUEST__BODY_ACQUIRE:
        atomic_fetch_add(&f->n_acquire, 1);
        if (strcmp(req->acquire->model, "demo") != 0) {
            rep.status = WB_ENOTFOUND;
            rep.error = "no model named 'nosuch'";
            break;
        }
        fill_lease(f, &lease, &slab, slabs, t, tensors, shape, id, handle, req->acquire->model);
        acq.lease = &lease;
        rep.body_case = WBPROTO__REPLY__BODY_ACQUIRE;
        rep.acquire = &acq;
        break;
    case WBPROTO__REQUEST__BODY_RELEASE:
        atomic_fetch_add(&f->n_release, 1);
        if (req->release->lease_id.len == WB_LEASE_ID_LEN)
            memcpy(f->released_id, req->release->lease_id.data, WB_LEASE_ID_LEN);
        rel.model_state = WBPROTO__MODEL_STATE__MODEL_READY;
        rep.body_case = WBPROTO__REPLY__BODY_RELEASE;
        rep.release = &rel;
        break;
    case WBPROTO__REQUEST__BODY_HEARTBEAT:
        atomic_store(&f->last_beats, (int)req->heartbeat->n_leases);
        if (req->heartbeat->n_leases > 0)
            atomic_store(&f->last_containers, req->heartbeat->leases[0]->containers);
        if (atomic_load(&f->forget)) {
            for (size_t i = 0; i < req->heartbeat->n_leases && i < 16; i++)
                unknown[hb.n_unknown_leases++] = req->heartbeat->leases[i]->lease_id;
            hb.unknown_leases = unknown;
        }
        rep.body_case = WBPROTO__REPLY__BODY_HEARTBEAT;
        rep.heartbeat = &hb;
        atomic_fetch_add(&f->n_heartbeat, 1);
        break;
    default:
        rep.status = WB_ENOSYS;
        rep.error = "the fake broker does not do that";
        break;
    }
    size_t len;
    uint8_t *buf = wb__reply_pack(&rep, &len);
    ck_assert_ptr_nonnull(buf);
    zmq_msg_send(ident, f->router, ZMQ_SNDMORE);
    zmq_send(f->router, buf, len, 0);
    free(buf);
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    while (!atomic_load(&f->stop)) {
        zmq_pollitem_t item = {.socket = f->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, 20) <= 0)
            continue;
        zmq_msg_t ident, payload;
        zmq_msg_init(&ident);
        zmq_msg_init(&payload);
        zmq_msg_recv(&ident, f->router, 0);
        zmq_msg_recv(&payload, f->router, 0);
        Wbproto__Request *req = NULL;
        uint64_t id;
        wb_err err;
        int rc =
            wb__request_decode(zmq_msg_data(&payload), zmq_msg_size(&payload), &req, &id, &err);
        if (rc == WB_OK && atomic_load(&f->mode) != FAKE_SILENT) {
            int delay = atomic_exchange(&f->delay_next_ms, 0);
            if (delay > 0)
                sleep_ms(delay);
            answer(f, &ident, req);
        }
        wb__request_free(&req);
        zmq_msg_close(&ident);
        zmq_msg_close(&payload);
    }
    return NULL;
}

static void fake_start(fake *f, uint32_t heartbeat_ms)
{
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/wbtest-client-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/broker.sock", f->dir);
    f->heartbeat_ms = heartbeat_ms;
    wb_err err;
    ck_assert_int_eq(wb__shm_create(&f->slab, 4096, &err), WB_OK);
    for (size_t i = 0; i < f->slab.size; i++)
        ((uint8_t *)f->slab.addr)[i] = (uint8_t)(i * 7 + 1);
    f->ctx = zmq_ctx_new();
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof linger);
    char ep[160];
    snprintf(ep, sizeof ep, "ipc://%s", f->path);
    ck_assert_int_eq(zmq_bind(f->router, ep), 0);
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_stop(fake *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    wb__shm_unlink(&f->slab);
    wb__shm_unmap(&f->slab);
    unlink(f->path);
    rmdir(f->dir);
}

static wb_client *connect_fake(fake *f, int no_thread, int timeout_ms)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = f->path;
    o.no_heartbeat_thread = no_thread;
    o.timeout_ms = timeout_ms;
    wb_client *c = NULL;
    int rc = wb_client_connect(&o, &c);
    ck_assert_msg(rc == WB_OK, "connect: %s", wb_client_errmsg(c));
    ck_assert_int_eq(wb_client_connected(c), 1);
    return c;
}

START_TEST(missing_socket_fails_fast)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = "/tmp/wbtest-no-such-dir/broker.sock";
    wb_client *c = NULL;
    int64_t t0 = now_ms();
    ck_assert_int_eq(wb_client_connect(&o, &c), WB_ECONN);
    ck_assert_int_lt(now_ms() - t0, 1000);
    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "/tmp/wbtest-no-such-dir/broker.sock"));
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "No such file"));
    ck_assert_int_eq(wb_client_connected(c), 0);
    wb_client_destroy(&c);
    ck_assert_ptr_null(c);
}
END_TEST

START_TEST(not_a_socket_fails)
{
    char path[] = "/tmp/wbtest-plain-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = path;
    wb_client *c = NULL;
    ck_assert_int_eq(wb_client_connect(&o, &c), WB_ECONN);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), path));
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "not a socket"));
    wb_client_destroy(&c);
    unlink(path);
}
END_TEST

/* The socket file a killed broker leaves behind refuses connections: that
 * is reported at once, not after the timeout. */
START_TEST(stale_socket_refused_fast)
{
    char dir[] = "/tmp/wbtest-stale-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s/broker.sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&sun, sizeof sun), 0);
    close(s); /* the file stays, nobody listens */

    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = sun.sun_path;
    o.timeout_ms = 5000;
    wb_client *c = NULL;
    int64_t t0 = now_ms();
    ck_assert_int_eq(wb_client_connect(&o, &c), WB_ECONN);
    ck_assert_int_lt(now_ms() - t0, 1000);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "no broker listening at"));
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), sun.sun_path));
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "refused"));
    wb_client_destroy(&c);
    unlink(sun.sun_path);
    rmdir(dir);
}
END_TEST

/* A socket whose owner listens but never reads: the hello cannot be
 * answered, and the connect gives up after the configured timeout. */
START_TEST(silent_socket_times_out)
{
    char dir[] = "/tmp/wbtest-silent-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s/broker.sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&sun, sizeof sun), 0);
    ck_assert_int_eq(listen(s, 4), 0);

    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = sun.sun_path;
    o.timeout_ms = 200;
    wb_client *c = NULL;
    int64_t t0 = now_ms();
    ck_assert_int_eq(wb_client_connect(&o, &c), WB_ETIMEDOUT);
    int64_t took = now_ms() - t0;
    ck_assert_int_ge(took, 190);
    ck_assert_int_lt(took, 3000);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "within 200 ms"));
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), sun.sun_path));
    ck_assert_int_eq(wb_client_connected(c), 0);
    wb_client_destroy(&c);
    close(s);
    unlink(sun.sun_path);
    rmdir(dir);
}
END_TEST

START_TEST(null_safety)
{
    wb_client_destroy(NULL);
    wb_client *c = NULL;
    wb_client_destroy(&c);
    ck_assert_int_eq(wb_lease_release(NULL), WB_EINVAL);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_ptr_nonnull(wb_client_errmsg(NULL));
    ck_assert_int_eq(wb_client_connected(NULL), 0);
    ck_assert_int_eq(wb_client_heartbeat(NULL), WB_EINVAL);
    ck_assert_int_eq(wb_client_connect(NULL, NULL), WB_EINVAL);
    ck_assert_int_eq(wb_lease_acquire(NULL, "demo", &l), WB_EINVAL);
    ck_assert_ptr_null(l);
    ck_assert_uint_eq(wb_lease_tensor_count(NULL), 0);
    wb_tensor_view v;
    ck_assert_int_eq(wb_lease_tensor(NULL, 0, &v), WB_EINVAL);
    ck_assert_int_eq(wb_lease_find(NULL, "a", &v), WB_EINVAL);
    ck_assert_int_eq(wb_lease_verify(NULL, NULL), WB_EINVAL);
    ck_assert_int_eq(wb_lease_container_add(NULL), WB_EINVAL);
    ck_assert_int_eq(wb_lease_container_remove(NULL), WB_EINVAL);
    ck_assert_uint_eq(wb_lease_containers(NULL), 0);
    ck_assert_int_eq(wb_lease_orphaned(NULL), 0);
    ck_assert_ptr_null(wb_lease_model(NULL));
    ck_assert_ptr_null(wb_lease_id(NULL));
    char hex[33] = "x";
    wb_lease_id_hex(NULL, hex);
    ck_assert_str_eq(hex, "");
}
END_TEST

START_TEST(acquire_maps_and_verifies)
{
    fake f;
    fake_start(&f, 10000);
    wb_client *c = connect_fake(&f, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_str_eq(wb_lease_model(l), "demo");
    char hex[33];
    wb_lease_id_hex(l, hex);
    ck_assert_str_eq(hex, "ab000000000000000000000000000001");
    ck_assert_uint_eq(wb_lease_id(l)[0], 0xab);
    ck_assert_uint_eq(wb_lease_tensor_count(l), 2);

    wb_tensor_view v;
    ck_assert_int_eq(wb_lease_tensor(l, 1, &v), WB_OK);
    ck_assert_str_eq(v.name, "b");
    ck_assert_str_eq(v.dtype, "U8");
    ck_assert_uint_eq(v.ndim, 1);
    ck_assert_uint_eq(v.shape[0], 25);
    ck_assert_uint_eq(v.nbytes, 100);
    ck_assert_int_eq(v.device, -1);
    ck_assert_int_eq(memcmp(v.data, (const uint8_t *)f.slab.addr + 256, 100), 0);
    ck_assert_ptr_ne(v.data, (const uint8_t *)f.slab.addr + 256); /* its own mapping */
    ck_assert_int_eq(wb_lease_find(l, "a", &v), WB_OK);
    ck_assert_uint_eq(v.nbytes, 64);

    ck_assert_int_eq(wb_lease_tensor(l, 2, &v), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "index 2 out of range"));
    ck_assert_int_eq(wb_lease_find(l, "zz", &v), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "no tensor 'zz'"));

    size_t bad = 99;
    ck_assert_int_eq(wb_lease_verify(l, &bad), WB_OK);
    ck_assert_uint_eq(bad, 99);
    /* The broker's side of the slab is writable: a byte changed there is
     * seen through the client's read-only mapping and caught. */
    ((uint8_t *)f.slab.addr)[300] ^= 0xff;
    ck_assert_int_eq(wb_lease_verify(l, &bad), WB_ECORRUPT);
    ck_assert_uint_eq(bad, 1);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "tensor 'b'"));

    /* A second lease on the same slab shares the mapping. */
    wb_lease *l2 = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l2), WB_OK);
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    wb_tensor_view v2;
    ck_assert_int_eq(wb_lease_find(l2, "a", &v2), WB_OK);
    ck_assert_ptr_eq(v.data, v2.data);

    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(atomic_load(&f.n_release), 1);
    ck_assert_uint_eq(f.released_id[15], 1);
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    ck_assert_int_eq(wb_lease_release(&l2), WB_OK);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

START_TEST(broker_refusal_message)
{
    fake f;
    fake_start(&f, 10000);
    wb_client *c = connect_fake(&f, 1, 2000);
    wb_lease *l = (wb_lease *)&f;
    ck_assert_int_eq(wb_lease_acquire(c, "nosuch", &l), WB_ENOTFOUND);
    ck_assert_ptr_null(l);
    ck_assert_str_eq(wb_client_errmsg(c), "acquire 'nosuch': no model named 'nosuch'");
    ck_assert_int_eq(wb_client_connected(c), 1);
    ck_assert_int_eq(wb_lease_acquire(c, "", &l), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "no model name"));
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

START_TEST(cuda_slab_not_supported)
{
    fake f;
    fake_start(&f, 10000);
    atomic_store(&f.mode, FAKE_CUDA);
    wb_client *c = connect_fake(&f, 1, 2000);
    wb_lease *l = NULL;
    /* A build without CUDA says so; a CUDA build on a machine without a
     * GPU (where the tests run) says that instead; neither crashes. */
#ifdef WB_HAVE_CUDA
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_ENOGPU);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "no usable GPU"));
#else
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_ENOSYS);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "no CUDA support"));
#endif
    ck_assert_ptr_null(l);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "cuda slab on device 0"));
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "acquire 'demo'"));
    /* The lease the broker granted was handed back. */
    ck_assert_int_eq(atomic_load(&f.n_release), 1);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

START_TEST(release_with_containers_is_busy)
{
    fake f;
    fake_start(&f, 10000);
    wb_client *c = connect_fake(&f, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_lease_container_add(l), WB_OK);
    ck_assert_int_eq(wb_lease_container_add(l), WB_OK);
    ck_assert_uint_eq(wb_lease_containers(l), 2);
    wb_lease *same = l;
    ck_assert_int_eq(wb_lease_release(&l), WB_EBUSY);
    ck_assert_ptr_eq(l, same);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "2 container(s) still use it"));
    ck_assert_int_eq(atomic_load(&f.n_release), 0);
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    wb_tensor_view v;
    ck_assert_int_eq(wb_lease_find(l, "a", &v), WB_OK);
    ck_assert_uint_eq(((const uint8_t *)v.data)[0], 1);

    /* The count travels with the heartbeat. */
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_uint_eq(atomic_load(&f.last_containers), 2);

    ck_assert_int_eq(wb_lease_container_remove(l), WB_OK);
    ck_assert_int_eq(wb_lease_container_remove(l), WB_OK);
    ck_assert_int_eq(wb_lease_container_remove(l), WB_EINVAL);
    ck_assert_uint_eq(wb_lease_containers(l), 0);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(atomic_load(&f.n_release), 1);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

START_TEST(unknown_lease_becomes_orphaned)
{
    fake f;
    fake_start(&f, 10000);
    wb_client *c = connect_fake(&f, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(atomic_load(&f.last_beats), 1);
    ck_assert_int_eq(wb_lease_orphaned(l), 0);

    atomic_store(&f.forget, 1);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(wb_lease_orphaned(l), 1);
    ck_assert_int_eq(wb_client_connected(c), 1);
    /* The mapping stays usable. */
    ck_assert_int_eq(wb_lease_verify(l, NULL), WB_OK);
    /* Orphaned leases are no longer announced... */
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(atomic_load(&f.last_beats), 0);
    /* ...nor released at a broker that does not know them. */
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.n_release), 0);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

/* A late reply must not be taken for the answer to the next request, and
 * `connected` follows each exchange. */
START_TEST(timeout_then_recovery)
{
    fake f;
    fake_start(&f, 10000);
    wb_client *c = connect_fake(&f, 1, 150);
    atomic_store(&f.delay_next_ms, 400);
    int64_t t0 = now_ms();
    ck_assert_int_eq(wb_client_heartbeat(c), WB_ETIMEDOUT);
    ck_assert_int_lt(now_ms() - t0, 2000);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "heartbeat: no reply"));
    ck_assert_int_eq(wb_client_connected(c), 0);
    sleep_ms(500); /* the late reply has now been sent to the old socket */
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_client_connected(c), 1);
    ck_assert_int_eq(atomic_load(&f.n_heartbeat), 1);

    /* A broker that stops answering: the release still ends the lease. */
    atomic_store(&f.mode, FAKE_SILENT);
    ck_assert_int_eq(wb_lease_release(&l), WB_ECONN);
    ck_assert_ptr_null(l);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "could not be told"));
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    ck_assert_int_eq(wb_client_connected(c), 0);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

START_TEST(heartbeat_thread_runs_and_stops_promptly)
{
    fake f;
    fake_start(&f, 20);
    wb_client *c = connect_fake(&f, 0, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    wb_lease_container_add(l);
    int64_t deadline = now_ms() + 10000;
    while (atomic_load(&f.n_heartbeat) < 5 && now_ms() < deadline)
        sleep_ms(10);
    ck_assert_int_ge(atomic_load(&f.n_heartbeat), 5);
    ck_assert_uint_eq(atomic_load(&f.last_containers), 1);

    /* The broker forgets the lease (a restart): the thread marks it. */
    atomic_store(&f.forget, 1);
    deadline = now_ms() + 10000;
    while (!wb_lease_orphaned(l) && now_ms() < deadline)
        sleep_ms(10);
    ck_assert_int_eq(wb_lease_orphaned(l), 1);
    wb_lease_container_remove(l);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_client_destroy(&c);
    fake_stop(&f);

    /* With a long interval, destroy must not wait for the next beat. */
    fake_start(&f, 60000);
    c = connect_fake(&f, 0, 2000);
    int64_t t0 = now_ms();
    wb_client_destroy(&c);
    ck_assert_int_lt(now_ms() - t0, 1000);
    ck_assert_int_eq(atomic_load(&f.n_heartbeat), 0);
    fake_stop(&f);
}
END_TEST

/* Destroy releases what it can and keeps leases with live containers
 * mapped; such a lease can still be ended afterwards. */
START_TEST(destroy_keeps_busy_leases_mapped)
{
    fake f;
    fake_start(&f, 10000);
    wb_client *c = connect_fake(&f, 1, 2000);
    wb_lease *idle = NULL, *busy = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &idle), WB_OK);
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &busy), WB_OK);
    wb_lease_container_add(busy);
    wb_client_destroy(&c);
    ck_assert_int_eq(atomic_load(&f.n_release), 1);
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    wb_tensor_view v;
    ck_assert_int_eq(wb_lease_find(busy, "a", &v), WB_OK);
    ck_assert_int_eq(wb_lease_verify(busy, NULL), WB_OK);
    ck_assert_int_eq(wb_lease_release(&busy), WB_EBUSY);
    wb_lease_container_remove(busy);
    ck_assert_int_eq(wb_lease_release(&busy), WB_ECONN);
    ck_assert_ptr_null(busy);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    fake_stop(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("client");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, missing_socket_fails_fast);
    tcase_add_test(tc, not_a_socket_fails);
    tcase_add_test(tc, stale_socket_refused_fast);
    tcase_add_test(tc, silent_socket_times_out);
    tcase_add_test(tc, null_safety);
    tcase_add_test(tc, acquire_maps_and_verifies);
    tcase_add_test(tc, broker_refusal_message);
    tcase_add_test(tc, cuda_slab_not_supported);
    tcase_add_test(tc, release_with_containers_is_busy);
    tcase_add_test(tc, unknown_lease_becomes_orphaned);
    tcase_add_test(tc, timeout_then_recovery);
    tcase_add_test(tc, heartbeat_thread_runs_and_stops_promptly);
    tcase_add_test(tc, destroy_keeps_busy_leases_mapped);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
