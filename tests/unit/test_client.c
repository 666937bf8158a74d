/* libwbclient against a scripted broker in a thread of the test: connection
 * failures, replies the client must refuse, lease lifetime, containers,
 * heartbeats and orphaned leases. The real broker is exercised by the
 * integration tests; here every answer is under the test's control. */
#include "wb/client.h"

#include "client_impl.h"
#include "fake_broker.h"
#include "lease.h"
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

/* The leases of this file's fake broker: fake_env's two tensors on a 4 KiB
 * slab. */
typedef fake_env fake;

static int64_t now_ms(void)
{
    return test_now_ms();
}

static void sleep_ms(int ms)
{
    test_sleep_ms(ms);
}

static void fake_start(fake *f, uint32_t heartbeat_ms)
{
    fake_env_start(f, heartbeat_ms);
}

static void fake_stop(fake *f)
{
    fake_env_stop(f);
}

static wb_client *connect_fake(fake *f, int no_thread, int timeout_ms)
{
    wb_client *c = fake_connect(f->b.path, no_thread, timeout_ms);
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

/* A $WB_TIMEOUT_MS that is not a timeout is refused, named, before any
 * connection; an empty one and an explicit timeout_ms are not read. */
START_TEST(bad_env_timeout_refused)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = "/tmp/wbtest-no-such-dir/broker.sock";
    const char *bad[] = {"abc", "0", "-5", "12ms", "86400001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("WB_TIMEOUT_MS", bad[i], 1);
        wb_client *c = NULL;
        ck_assert_int_eq(wb_client_connect(&o, &c), WB_EINVAL);
        char want[160];
        snprintf(want, sizeof want,
                 "WB_TIMEOUT_MS: expected milliseconds from 1 to 86400000, got '%s' (unset it, "
                 "or set wb_client_options.timeout_ms)",
                 bad[i]);
        ck_assert_str_eq(wb_client_errmsg(c), want);
        wb_client_destroy(&c);
    }
    /* Given in the options, the environment is not read; empty is unset. */
    o.timeout_ms = 100;
    wb_client *c = NULL;
    ck_assert_int_eq(wb_client_connect(&o, &c), WB_ECONN);
    wb_client_destroy(&c);
    o.timeout_ms = 0;
    setenv("WB_TIMEOUT_MS", "", 1);
    ck_assert_int_eq(wb_client_connect(&o, &c), WB_ECONN);
    wb_client_destroy(&c);
    unsetenv("WB_TIMEOUT_MS");
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
    /* The client asks for the compact table and reads the messages of a
     * broker that answers without it. */
    ck_assert_int_eq(atomic_load(&f.b.n_asked_table), 1);
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
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1);
    ck_assert_uint_eq(f.b.released_id[15], 1);
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

/* A slab transport this library does not know is refused before anything
 * is fetched or mapped, naming it; the granted lease is handed back. */
START_TEST(unknown_transport_is_refused)
{
    const struct {
        int mode;
        const char *transport;
        int backend;
    } cases[] = {{FAKE_CUDA, "cuda-bogus", 2}, {FAKE_NORMAL, "rdma", 1}};
    for (size_t k = 0; k < 2; k++) {
        fake f;
        fake_start(&f, 10000);
        atomic_store(&f.b.mode, cases[k].mode);
        f.b.transport = cases[k].transport;
        wb_client *c = connect_fake(&f, 1, 2000);
        wb_lease *l = NULL;
        ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_EPROTO);
        ck_assert_ptr_null(l);
        char want[200];
        snprintf(want, sizeof want,
                 "acquire 'demo': slab 0: transport '%s' of backend %d is not one this "
                 "libwbclient knows (shm, memfd, cuda-ipc, cuda-vmm); upgrade it",
                 cases[k].transport, cases[k].backend);
        ck_assert_str_eq(wb_client_errmsg(c), want);
        ck_assert_int_eq(atomic_load(&f.b.n_release), 1);
        ck_assert_uint_eq(wb__mapcache_count(), 0);
        wb_client_destroy(&c);
        fake_stop(&f);
    }
    /* A known transport on the wrong backend is a malformed reply. */
    fake f;
    fake_start(&f, 10000);
    f.b.transport = "cuda-vmm";
    wb_client *c = connect_fake(&f, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_EPROTO);
    ck_assert_ptr_null(l);
    ck_assert_ptr_nonnull(
        strstr(wb_client_errmsg(c), "lease.slabs[0] is a cuda-vmm slab of a host backend"));
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

/* Which way a slab is reached, from its backend and transport; an empty
 * transport is a broker from before the field. */
START_TEST(slab_kinds)
{
    const int host = WBPROTO__BACKEND__BACKEND_HOST, cuda = WBPROTO__BACKEND__BACKEND_CUDA;
    ck_assert_int_eq(wb__slab_kind(host, NULL), SLAB_SHM);
    ck_assert_int_eq(wb__slab_kind(host, ""), SLAB_SHM);
    ck_assert_int_eq(wb__slab_kind(host, "shm"), SLAB_SHM);
    ck_assert_int_eq(wb__slab_kind(host, "memfd"), SLAB_MEMFD);
    ck_assert_int_eq(wb__slab_kind(cuda, ""), SLAB_CUDA_IPC);
    ck_assert_int_eq(wb__slab_kind(cuda, "cuda-ipc"), SLAB_CUDA_IPC);
    ck_assert_int_eq(wb__slab_kind(cuda, "cuda-vmm"), SLAB_CUDA_VMM);
    ck_assert_int_eq(wb__slab_kind(host, "cuda-vmm"), SLAB_UNKNOWN);
    ck_assert_int_eq(wb__slab_kind(cuda, "memfd"), SLAB_UNKNOWN);
    ck_assert_int_eq(wb__slab_kind(cuda, "cuda-vmm "), SLAB_UNKNOWN);
    ck_assert_int_eq(wb__slab_kind(WBPROTO__BACKEND__BACKEND_UNSPECIFIED, ""), SLAB_UNKNOWN);
}
END_TEST

/* A cuda-vmm slab is refused clearly where it cannot be mapped: no CUDA in
 * the build, or no usable GPU (these tests run without one). */
START_TEST(vmm_map_without_gpu)
{
    wb__map *m = NULL;
    wb_err e;
    int rc = wb__mapcache_get_vmm(-1, 0, 2u << 20, "cuda-vmm slab 0", &m, &e);
    ck_assert_ptr_null(m);
#ifdef WB_HAVE_CUDA
    ck_assert_int_eq(rc, WB_ENOGPU);
    ck_assert_msg(strstr(e.msg, "cuda slab on device 0: no usable GPU in this process") != NULL,
                  "%s", e.msg);
#else
    ck_assert_int_eq(rc, WB_ENOSYS);
    ck_assert_str_eq(e.msg, "cuda-vmm slab 0 on device 0: this build of libwbclient has no CUDA "
                            "support (CUDA toolkit not found at build time)");
#endif
    ck_assert_int_eq(wb__mapcache_get_vmm(-1, 0, 0, "cuda-vmm slab 0", &m, &e), WB_EPROTO);
    ck_assert_str_eq(e.msg, "cuda-vmm slab 0: the broker gave a size of 0 bytes");
    ck_assert_uint_eq(wb__mapcache_count(), 0);
}
END_TEST

/* A cuda slab's device is found by its UUID, not by the broker's ordinal:
 * one this process cannot see is refused naming it and what is visible
 * (here no GPU at all), and the lease goes back. A device asked for that
 * this process does not have is refused before anything is sent. */
START_TEST(cuda_slab_on_an_invisible_device)
{
    fake f;
    fake_start(&f, 10000);
    atomic_store(&f.b.mode, FAKE_CUDA);
    f.b.slab_uuid = "GPU-3b1e00ff-0102-0304-0506-0708090a0bab";
    setenv("CUDA_VISIBLE_DEVICES", "7", 1);
    wb_client *c = connect_fake(&f, 1, 2000);
    wb_lease *l = NULL;
#ifdef WB_HAVE_CUDA
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_ENOGPU);
    ck_assert_str_eq(wb_client_errmsg(c),
                     "acquire 'demo': slab 0: device GPU-3b1e00ff-0102-0304-0506-0708090a0bab "
                     "(the broker's device 0) is not visible in this process, which sees: none "
                     "(CUDA_VISIBLE_DEVICES=7)");
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1);
    wb_lease_options o = {.device = 3};
    int before = atomic_load(&f.b.n_acquire);
    ck_assert_int_eq(wb_lease_acquire_ex(c, "demo", &o, &l), WB_ENOGPU);
    ck_assert_str_eq(wb_client_errmsg(c), "acquire 'demo': this process has no CUDA device 3; it "
                                          "sees: none (CUDA_VISIBLE_DEVICES=7)");
    ck_assert_int_eq(atomic_load(&f.b.n_acquire), before);
#else
    wb_lease_options o = {.device = 3};
    ck_assert_int_eq(wb_lease_acquire_ex(c, "demo", &o, &l), WB_ENOSYS);
#endif
    o.device = -5;
    ck_assert_int_eq(wb_lease_acquire_ex(c, "demo", &o, &l), WB_EINVAL);
    ck_assert_str_eq(wb_client_errmsg(c), "acquire 'demo': device -5 is not an ordinal");
    o.device_uuid = "GPU-12";
    ck_assert_int_eq(wb_lease_acquire_ex(c, "demo", &o, &l), WB_EINVAL);
    ck_assert_str_eq(wb_client_errmsg(c), "acquire 'demo': 'GPU-12' is not a device UUID "
                                          "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
    ck_assert_ptr_null(l);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    unsetenv("CUDA_VISIBLE_DEVICES");
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

START_TEST(cuda_slab_not_supported)
{
    fake f;
    fake_start(&f, 10000);
    atomic_store(&f.b.mode, FAKE_CUDA);
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
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1);
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
    ck_assert_int_eq(atomic_load(&f.b.n_release), 0);
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    wb_tensor_view v;
    ck_assert_int_eq(wb_lease_find(l, "a", &v), WB_OK);
    ck_assert_uint_eq(((const uint8_t *)v.data)[0], 1);

    /* The count travels with the heartbeat. */
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_uint_eq(atomic_load(&f.b.last_containers), 2);

    ck_assert_int_eq(wb_lease_container_remove(l), WB_OK);
    ck_assert_int_eq(wb_lease_container_remove(l), WB_OK);
    ck_assert_int_eq(wb_lease_container_remove(l), WB_EINVAL);
    ck_assert_uint_eq(wb_lease_containers(l), 0);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1);
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
    ck_assert_int_eq(atomic_load(&f.b.last_beats), 1);
    ck_assert_int_eq(wb_lease_orphaned(l), 0);

    atomic_store(&f.b.forget, 1);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(wb_lease_orphaned(l), 1);
    ck_assert_int_eq(wb_client_connected(c), 1);
    /* The mapping stays usable. */
    ck_assert_int_eq(wb_lease_verify(l, NULL), WB_OK);
    /* Orphaned leases are no longer announced... */
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.last_beats), 0);
    /* ...nor released at a broker that does not know them. */
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_release), 0);
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
    atomic_store(&f.b.delay_next_ms, 400);
    int64_t t0 = now_ms();
    ck_assert_int_eq(wb_client_heartbeat(c), WB_ETIMEDOUT);
    ck_assert_int_lt(now_ms() - t0, 2000);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "heartbeat: no reply"));
    ck_assert_int_eq(wb_client_connected(c), 0);
    sleep_ms(500); /* the late reply has now been sent to the old socket */
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_client_connected(c), 1);
    ck_assert_int_eq(atomic_load(&f.b.n_heartbeat), 1);

    /* A broker that stops answering: the release still ends the lease. */
    atomic_store(&f.b.mode, FAKE_SILENT);
    ck_assert_int_eq(wb_lease_release(&l), WB_ECONN);
    ck_assert_ptr_null(l);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(c), "could not be told"));
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    ck_assert_int_eq(wb_client_connected(c), 0);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

/* A heartbeat reply that asks for another interval (a broker with many
 * peers stretches it) is followed from the next beat on. */
START_TEST(heartbeat_interval_follows_the_reply)
{
    fake f;
    fake_start(&f, 20);
    wb_client *c = connect_fake(&f, 0, 2000);
    int64_t deadline = now_ms() + 10000;
    while (atomic_load(&f.b.n_heartbeat) < 3 && now_ms() < deadline)
        sleep_ms(10);
    ck_assert_int_ge(atomic_load(&f.b.n_heartbeat), 3);
    atomic_store(&f.b.pace_ms, 1000);
    /* The beat that carries the new interval back, then none for 1 s. */
    int before = atomic_load(&f.b.n_heartbeat);
    deadline = now_ms() + 10000;
    while (atomic_load(&f.b.n_heartbeat) < before + 2 && now_ms() < deadline)
        sleep_ms(5);
    int seen = atomic_load(&f.b.n_heartbeat);
    sleep_ms(700);
    /* At 20 ms, 35 more would have come. */
    ck_assert_int_le(atomic_load(&f.b.n_heartbeat) - seen, 1);
    /* A reply that says nothing (an older broker) keeps the interval. */
    atomic_store(&f.b.pace_ms, 0);
    ck_assert_int_eq(wb_client_heartbeat(c), WB_OK);
    seen = atomic_load(&f.b.n_heartbeat);
    sleep_ms(500);
    ck_assert_int_le(atomic_load(&f.b.n_heartbeat) - seen, 1);
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
    while (atomic_load(&f.b.n_heartbeat) < 5 && now_ms() < deadline)
        sleep_ms(10);
    ck_assert_int_ge(atomic_load(&f.b.n_heartbeat), 5);
    ck_assert_uint_eq(atomic_load(&f.b.last_containers), 1);

    /* The broker forgets the lease (a restart): the thread marks it. */
    atomic_store(&f.b.forget, 1);
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
    ck_assert_int_eq(atomic_load(&f.b.n_heartbeat), 0);
    fake_stop(&f);
}
END_TEST

/* A worker that acquires and releases one model in a loop maps its slab
 * once: the mapping lingers after the release (the heartbeat thread unmaps
 * it WB_MAP_LINGER_MS later), and the next lease reuses it without a
 * system call. Without the heartbeat thread nothing lingers. */
START_TEST(released_slab_lingers_for_the_next_lease)
{
    fake f;
    fake_start(&f, 60000);
    wb_client *c = connect_fake(&f, 0, 2000);
    uint64_t made = wb__mapcache_made();
    wb_tensor_view v;
    for (int i = 0; i < 50; i++) {
        wb_lease *l = NULL;
        ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
        ck_assert_int_eq(wb_lease_find(l, "b", &v), WB_OK);
        ck_assert_int_eq(wb_lease_verify(l, NULL), WB_OK);
        ck_assert_int_eq(wb_lease_release(&l), WB_OK);
        ck_assert_uint_eq(wb__mapcache_count(), 1);
    }
    ck_assert_uint_eq(wb__mapcache_made() - made, 1);
    /* Every release still reaches the broker. */
    ck_assert_int_eq(atomic_load(&f.b.n_release), 50);

    /* Unmapped when due, though no heartbeat is (the interval is 60 s). */
    int64_t deadline = now_ms() + 10 * WB_MAP_LINGER_MS;
    while (wb__mapcache_count() > 0 && now_ms() < deadline)
        sleep_ms(10);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    ck_assert_int_eq(atomic_load(&f.b.n_heartbeat), 0);

    /* The next lease maps again; destroy unmaps what lingers at once. */
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_uint_eq(wb__mapcache_made() - made, 2);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    wb_client_destroy(&c);
    ck_assert_uint_eq(wb__mapcache_count(), 0);

    c = connect_fake(&f, 1, 2000);
    made = wb__mapcache_made();
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
        ck_assert_int_eq(wb_lease_release(&l), WB_OK);
        ck_assert_uint_eq(wb__mapcache_count(), 0);
    }
    ck_assert_uint_eq(wb__mapcache_made() - made, 3);
    wb_client_destroy(&c);
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
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1);
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

/* A broker bringing the model back to its device answers WB_EBUSY with
 * Reply.retry_after_ms: the acquire waits that long and asks again until
 * the lease is granted, one request per answer. */
START_TEST(busy_acquire_retries_until_granted)
{
    fake f;
    fake_start(&f, 10000);
    wb_client *c = connect_fake(&f, 1, 2000);
    atomic_store(&f.b.busy_acquires, 3);
    atomic_store(&f.b.busy_retry_ms, 5);
    wb_lease *l = NULL;
    int64_t t0 = now_ms();
    ck_assert_msg(wb_lease_acquire(c, "demo", &l) == WB_OK, "%s", wb_client_errmsg(c));
    int64_t took = now_ms() - t0;
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq(atomic_load(&f.b.n_busy), 3);
    ck_assert_int_eq(atomic_load(&f.b.n_acquire), 4);
    ck_assert_int_ge(took, 15);
    ck_assert_int_lt(took, 1500);
    wb_tensor_view v;
    ck_assert_int_eq(wb_lease_find(l, "a", &v), WB_OK);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);

    /* A wait asked for beyond 200 ms is cut to 200 ms. */
    atomic_store(&f.b.busy_acquires, 1);
    atomic_store(&f.b.busy_retry_ms, 60000);
    t0 = now_ms();
    ck_assert_msg(wb_lease_acquire(c, "demo", &l) == WB_OK, "%s", wb_client_errmsg(c));
    took = now_ms() - t0;
    ck_assert_int_ge(took, 200);
    ck_assert_int_lt(took, 1500);
    ck_assert_int_eq(atomic_load(&f.b.n_acquire), 6);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

/* A model that never comes back: WB_ETIMEDOUT once the client's timeout
 * from the first attempt has run out, naming the model and the broker's
 * last answer; meanwhile the lock is free between attempts, so the
 * heartbeat thread keeps beating. */
START_TEST(busy_acquire_times_out)
{
    fake f;
    fake_start(&f, 20);
    wb_client *c = connect_fake(&f, 0, 400);
    atomic_store(&f.b.busy_acquires, -1);
    atomic_store(&f.b.busy_retry_ms, 5);
    int beats = atomic_load(&f.b.n_heartbeat);
    wb_lease *l = (wb_lease *)&f;
    int64_t t0 = now_ms();
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_ETIMEDOUT);
    int64_t took = now_ms() - t0;
    ck_assert_ptr_null(l);
    /* The timeout ran out between two attempts, or during the last one,
     * which had only what was left of it (a loaded machine): then the
     * message says so after the broker's answer. */
    const char *msg = wb_client_errmsg(c);
    static const char answer[] = " ms: model 'demo' is being brought back to its device";
    int after = 0, used = 0;
    ck_assert_msg(
        sscanf(msg, "acquire 'demo': still not on its device after %d%n", &after, &used) == 1 &&
            after >= 400 && after < 1400 && strncmp(msg + used, answer, sizeof answer - 1) == 0,
        "%s", msg);
    const char *tail = msg + used + sizeof answer - 1;
    ck_assert_msg(tail[0] == '\0' || strncmp(tail, " (then no reply from the broker at ", 35) == 0,
                  "%s", msg);
    ck_assert_int_ge(took, 400);
    ck_assert_int_lt(took, 1400);
    /* One request per wait of 5 ms: at most 400 / 5 + 1 of them. */
    int n = atomic_load(&f.b.n_busy);
    ck_assert_int_eq(atomic_load(&f.b.n_acquire), n);
    ck_assert_int_ge(n, 5);
    ck_assert_int_le(n, 81);
    ck_assert_int_ge(atomic_load(&f.b.n_heartbeat) - beats, 3);
    ck_assert_int_eq(wb_client_connected(c), 1);

    /* Once it is back, the next acquire gets it. */
    atomic_store(&f.b.busy_acquires, 0);
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

typedef struct acquire_job {
    wb_client *c;
    wb_lease *l;
    int rc;
    int64_t took_ms;
} acquire_job;

static void *acquire_demo(void *arg)
{
    acquire_job *j = arg;
    int64_t t0 = now_ms();
    j->rc = wb_lease_acquire(j->c, "demo", &j->l);
    j->took_ms = now_ms() - t0;
    return NULL;
}

/* The broker goes away while an acquire waits for the model to come back:
 * the acquire ends with WB_ECONN saying so within a few of libwbclient's
 * looks at its connection (WB_RPC_WATCH_MS), not at its 3 s timeout. */
START_TEST(busy_acquire_broker_gone)
{
    fake f;
    fake_start(&f, 0);
    wb_client *c = connect_fake(&f, 1, 3000);
    atomic_store(&f.b.busy_acquires, -1);
    atomic_store(&f.b.busy_retry_ms, 5);
    acquire_job j = {.c = c};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, acquire_demo, &j), 0);
    while (atomic_load(&f.b.n_busy) < 3)
        usleep(1000);
    int64_t t0 = now_ms();
    fake_broker_stop(&f.b);
    pthread_join(t, NULL);
    int64_t after_stop = now_ms() - t0;
    ck_assert_int_eq(j.rc, WB_ECONN);
    ck_assert_ptr_null(j.l);
    ck_assert_msg(strstr(wb_client_errmsg(c), "acquire 'demo': the broker went away before it "
                                              "answered: ") != NULL,
                  "%s", wb_client_errmsg(c));
    ck_assert_int_lt(after_stop, 1000);
    ck_assert_int_lt(j.took_ms, 2500);
    wb_client_destroy(&c);
    fake_slab_destroy(&f.slab);
    rmdir(f.dir);
}
END_TEST

/* The attempts after the first have only what is left of the timeout: a
 * broker that then answers late still ends the acquire in time. */
START_TEST(busy_acquire_retry_bounded_by_the_timeout)
{
    fake f;
    fake_start(&f, 10000);
    acquire_job j = {.c = connect_fake(&f, 1, 300)};
    int received = atomic_load(&f.b.n_received);
    atomic_store(&f.b.busy_acquires, 1);
    atomic_store(&f.b.busy_retry_ms, 200);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, acquire_demo, &j), 0);
    int64_t deadline = now_ms() + 5000;
    while (atomic_load(&f.b.n_busy) < 1 && now_ms() < deadline)
        sleep_ms(1);
    ck_assert_int_eq(atomic_load(&f.b.n_busy), 1);
    /* Read before the attempt that follows the 200 ms wait. */
    atomic_store(&f.b.delay_next_ms, 600);
    pthread_join(th, NULL);
    ck_assert_int_eq(j.rc, WB_ETIMEDOUT);
    ck_assert_ptr_null(j.l);
    ck_assert_int_ge(j.took_ms, 300);
    ck_assert_int_lt(j.took_ms, 550);
    const char *msg = wb_client_errmsg(j.c);
    ck_assert_msg(strncmp(msg, "acquire 'demo': still not on its device after ", 46) == 0, "%s",
                  msg);
    ck_assert_msg(strstr(msg, "ms: model 'demo' is being brought back to its device (then no "
                              "reply from the broker at ") != NULL,
                  "%s", msg);
    /* The first attempt and the one answered late. */
    ck_assert_int_eq(atomic_load(&f.b.n_received) - received, 2);
    sleep_ms(700); /* the late answer went to the socket dropped */
    ck_assert_int_eq(wb_lease_acquire(j.c, "demo", &j.l), WB_OK);
    ck_assert_int_eq(wb_lease_release(&j.l), WB_OK);
    wb_client_destroy(&j.c);
    fake_stop(&f);
}
END_TEST

/* WB_EBUSY without a time to ask again is the broker's answer, at once. */
START_TEST(busy_without_retry_is_returned_at_once)
{
    fake f;
    fake_start(&f, 10000);
    wb_client *c = connect_fake(&f, 1, 5000);
    atomic_store(&f.b.busy_acquires, -1);
    atomic_store(&f.b.busy_retry_ms, 0);
    wb_lease *l = (wb_lease *)&f;
    int64_t t0 = now_ms();
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_EBUSY);
    ck_assert_int_lt(now_ms() - t0, 1000);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(atomic_load(&f.b.n_acquire), 1);
    ck_assert_str_eq(wb_client_errmsg(c),
                     "acquire 'demo': model 'demo' is being brought back to its device");
    wb_client_destroy(&c);
    fake_stop(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("client");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, missing_socket_fails_fast);
    tcase_add_test(tc, bad_env_timeout_refused);
    tcase_add_test(tc, unknown_transport_is_refused);
    tcase_add_test(tc, slab_kinds);
    tcase_add_test(tc, vmm_map_without_gpu);
    tcase_add_test(tc, not_a_socket_fails);
    tcase_add_test(tc, stale_socket_refused_fast);
    tcase_add_test(tc, silent_socket_times_out);
    tcase_add_test(tc, null_safety);
    tcase_add_test(tc, acquire_maps_and_verifies);
    tcase_add_test(tc, broker_refusal_message);
    tcase_add_test(tc, cuda_slab_not_supported);
    tcase_add_test(tc, cuda_slab_on_an_invisible_device);
    tcase_add_test(tc, release_with_containers_is_busy);
    tcase_add_test(tc, unknown_lease_becomes_orphaned);
    tcase_add_test(tc, timeout_then_recovery);
    tcase_add_test(tc, heartbeat_thread_runs_and_stops_promptly);
    tcase_add_test(tc, heartbeat_interval_follows_the_reply);
    tcase_add_test(tc, released_slab_lingers_for_the_next_lease);
    tcase_add_test(tc, destroy_keeps_busy_leases_mapped);
    tcase_add_test(tc, busy_acquire_retries_until_granted);
    tcase_add_test(tc, busy_acquire_times_out);
    tcase_add_test(tc, busy_acquire_broker_gone);
    tcase_add_test(tc, busy_acquire_retry_bounded_by_the_timeout);
    tcase_add_test(tc, busy_without_retry_is_returned_at_once);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
