/* Threads racing container registration against wb_lease_release on one
 * lease: a FAKE broker (fake_broker.h) grants host leases, and containers
 * are built with the FAKE AOTI model library (tests/fake_aoti) on the CPU.
 * The fakes only stand in for the broker and the model runtime; what is
 * tested is libwbclient's locking. Run it under ASan as well (build-asan):
 * a lease freed under a container shows up there as a use-after-free. */
#include "wb/client.h"
#include "wb/container.h"

#include "fake_broker.h"

#include <check.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The fake model: y = x * w + b over 4 floats, its constants bound by name
 * to the lease's tensors "w" and "b". */
static const fake_tensor tensors[2] = {
    {"w", "F32", 0, 16, 4},
    {"b", "F32", 64, 16, 4},
};
static const char *SPEC = "elements 4\n"
                          "const c_w w 6 16\n"
                          "const c_b b 6 16\n";

static char dir[64];
static char so[256];
static wb_shm slab;
static fake_broker broker;

static int budget_ms(void)
{
    const char *s = getenv("WB_SANITIZED");
    return s && strcmp(s, "1") == 0 ? 4000 : 2000;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static void copy_fake(const char *to)
{
    const char *bin = getenv("WB_BIN_DIR");
    ck_assert_msg(bin != NULL, "WB_BIN_DIR must name the build directory");
    char from[512];
    snprintf(from, sizeof from, "%s/tests/fake_aoti/fake_aoti_v211.so", bin);
    FILE *in = fopen(from, "rb");
    ck_assert_msg(in != NULL, "cannot read %s", from);
    FILE *out = fopen(to, "wb");
    ck_assert_ptr_nonnull(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
    chmod(to, 0700);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/wbtest-race-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(so, sizeof so, "%s/fake_aoti_v211.so", dir);
    copy_fake(so);
    char spec[300], path[200];
    snprintf(spec, sizeof spec, "%s/fake_aoti_spec.txt", dir);
    write_text(spec, SPEC);
    fake_slab_create(&slab, 4096, 3, 1);
    snprintf(path, sizeof path, "%s/broker.sock", dir);
    fake_broker_start(&broker, path, &slab, 10, 0, tensors, 2);
}

static void teardown(void)
{
    fake_broker_stop(&broker);
    fake_slab_destroy(&slab);
    char path[300];
    snprintf(path, sizeof path, "%s/fake_aoti_spec.txt", dir);
    unlink(path);
    unlink(so);
    rmdir(dir);
}

/* ---- a release while a container is being built on the lease ---- */

static atomic_int in_create, go;

static void hold_create(void)
{
    atomic_store(&in_create, 1);
    int64_t deadline = test_now_ms() + 20000;
    while (!atomic_load(&go) && test_now_ms() < deadline)
        test_sleep_ms(1);
}

typedef struct creator {
    wb_lease *lease;
    wb_container *c;
    int rc;
} creator;

static void *create_main(void *arg)
{
    creator *cr = arg;
    cr->rc = wb_container_create(&cr->lease, 1, so, NULL, &cr->c);
    return NULL;
}

/* The lease is used from the first moment of wb_container_create: a
 * release that comes meanwhile must refuse (WB_EBUSY), not free the lease
 * under the container. Before the fix the container registered only at the
 * end of its creation, and this release ended the lease. */
START_TEST(release_during_create_is_busy)
{
    /* Our own handle on the library: the binding's dlopen of the same path
     * then shares its globals, the gate among them. */
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(h != NULL, "dlopen %s: %s", so, dlerror());
    void (*set_gate)(void (*)(void)) =
        (void (*)(void (*)(void)))dlsym(h, "fake_aoti_set_create_gate");
    ck_assert_ptr_nonnull(set_gate);
    set_gate(hold_create);

    wb_client *client = fake_connect(broker.path, 1, 5000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(client, "demo", &l), WB_OK);
    creator cr = {.lease = l};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, create_main, &cr), 0);
    int64_t deadline = test_now_ms() + 20000;
    while (!atomic_load(&in_create) && test_now_ms() < deadline)
        test_sleep_ms(1);
    ck_assert_msg(atomic_load(&in_create), "the container creation never reached the model");

    wb_lease *victim = l;
    int rc = wb_lease_release(&victim);
    ck_assert_msg(rc == WB_EBUSY, "release during a container's creation returned %d (%s)", rc,
                  wb_client_errmsg(client));
    ck_assert_ptr_eq(victim, l);
    ck_assert_str_eq(wb_client_errmsg(client),
                     "release lease ab000000 (model 'demo'): 1 container(s) still use it");
    ck_assert_int_eq(atomic_load(&broker.n_release), 0);

    atomic_store(&go, 1);
    pthread_join(t, NULL);
    ck_assert_msg(cr.rc == WB_OK, "create: %s", wb_container_errmsg(cr.c));
    wb_container_info info;
    ck_assert_int_eq(wb_container_get_info(cr.c, &info), WB_OK);
    ck_assert_uint_eq(info.bound_tensors, 2);
    ck_assert_uint_eq(wb_lease_containers(l), 1);
    wb_container_destroy(&cr.c);
    ck_assert_uint_eq(wb_lease_containers(l), 0);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(atomic_load(&broker.n_release), 1);
    set_gate(NULL);
    dlclose(h);
    wb_client_destroy(&client);
}
END_TEST

/* A failed creation leaves nothing registered: the lease can be released
 * without destroying the failed container first. */
START_TEST(failed_create_holds_no_lease)
{
    wb_client *client = fake_connect(broker.path, 1, 5000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(client, "demo", &l), WB_OK);
    wb_container *c = NULL;
    char missing[300];
    snprintf(missing, sizeof missing, "%s/no-such-model.so", dir);
    ck_assert_int_eq(wb_container_create(&l, 1, missing, NULL, &c), WB_ENOTFOUND);
    ck_assert_uint_eq(wb_lease_containers(l), 0);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_container_destroy(&c);
    wb_client_destroy(&client);
}
END_TEST

/* ---- stress: registrations, containers and heartbeats against release ---- */

typedef struct stress {
    wb_lease *lease;
    atomic_int stop;
    atomic_long adds, creates, beats;
    atomic_int failures;
} stress;

static void *adder_main(void *arg)
{
    stress *s = arg;
    while (!atomic_load(&s->stop)) {
        if (wb_lease_container_add(s->lease) != WB_OK ||
            wb_lease_container_remove(s->lease) != WB_OK)
            atomic_fetch_add(&s->failures, 1);
        atomic_fetch_add(&s->adds, 1);
    }
    return NULL;
}

static void *builder_main(void *arg)
{
    stress *s = arg;
    while (!atomic_load(&s->stop)) {
        wb_container *c = NULL;
        if (wb_container_create(&s->lease, 1, so, NULL, &c) != WB_OK)
            atomic_fetch_add(&s->failures, 1);
        wb_container_destroy(&c);
        atomic_fetch_add(&s->creates, 1);
    }
    return NULL;
}

typedef struct releaser {
    stress *s;
    wb_client *client;
    int busy;
    int rc;
} releaser;

/* Tries to release until it succeeds: every refusal must be WB_EBUSY. */
static void *releaser_main(void *arg)
{
    releaser *r = arg;
    wb_lease *l = r->s->lease;
    int64_t deadline = test_now_ms() + 30000;
    for (;;) {
        r->rc = wb_lease_release(&l);
        if (r->rc != WB_EBUSY || test_now_ms() > deadline)
            break;
        r->busy++;
        sched_yield();
    }
    return NULL;
}

/* Many rounds, each on a fresh lease: two threads add and remove
 * registrations, one builds and destroys containers, the client's heartbeat
 * thread reports them every 10 ms, and a releaser tries to end the lease all
 * along. A keeper registration, dropped once the others have stopped, is
 * what makes the last release legal; before that every release must refuse.
 * At the end each round's lease must be released exactly once. */
START_TEST(stress_registrations_against_release)
{
    wb_client *client = fake_connect(broker.path, 0, 5000);
    int64_t end = test_now_ms() + budget_ms();
    int rounds = 0;
    long busy = 0;
    while (test_now_ms() < end || rounds < 5) {
        stress s;
        memset(&s, 0, sizeof s);
        ck_assert_int_eq(wb_lease_acquire(client, "demo", &s.lease), WB_OK);
        ck_assert_int_eq(wb_lease_container_add(s.lease), WB_OK); /* the keeper */
        pthread_t adders[2], builder, rel;
        releaser r = {.s = &s, .client = client};
        for (int i = 0; i < 2; i++)
            ck_assert_int_eq(pthread_create(&adders[i], NULL, adder_main, &s), 0);
        ck_assert_int_eq(pthread_create(&builder, NULL, builder_main, &s), 0);
        ck_assert_int_eq(pthread_create(&rel, NULL, releaser_main, &r), 0);
        test_sleep_ms(20);
        atomic_store(&s.stop, 1);
        for (int i = 0; i < 2; i++)
            pthread_join(adders[i], NULL);
        pthread_join(builder, NULL);
        ck_assert_int_eq(atomic_load(&s.failures), 0);
        ck_assert_uint_eq(wb_lease_containers(s.lease), 1);
        ck_assert_int_eq(wb_lease_container_remove(s.lease), WB_OK);
        pthread_join(rel, NULL);
        ck_assert_msg(r.rc == WB_OK, "round %d: release returned %d (%s)", rounds, r.rc,
                      wb_client_errmsg(client));
        ck_assert_int_eq(atomic_load(&broker.n_release), rounds + 1);
        busy += r.busy;
        rounds++;
    }
    ck_assert_int_gt(busy, 0);
    wb_client_destroy(&client);
}
END_TEST

int main(void)
{
    /* What the library would log is not this test's concern. */
    unsetenv("WB_CLIENT_LOG");
    Suite *s = suite_create("lease_race");
    TCase *tc = tcase_create("race");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, release_during_create_is_busy);
    tcase_add_test(tc, failed_create_holds_no_lease);
    tcase_add_test(tc, stress_registrations_against_release);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
