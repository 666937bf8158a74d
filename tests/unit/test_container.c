/* The AOTI binding (wb_container_*) against a FAKE AOTI model library
 * (tests/fake_aoti), with leases from a real broker process on the host
 * backend. The fake implements the AOTI C entry points over a trivial CPU
 * "model" (y = x * w + b); it checks that the binding picks the right entry
 * points, binds by name, checks dtypes and sizes, folds, frees an embedded
 * copy and unpacks packages safely. It is not evidence that real AOTI
 * models work: that is what tests/gpu/run.sh shows on a GPU machine. */
#include "wb/client.h"
#include "wb/container.h"

#include "aoti_pkg.h"
#include "client_impl.h"
#include "lease.h"

#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zip.h>

extern char **environ;

#define API_DEVICE   "CreateWithDevice+UpdateUserManagedConstantBufferPairs"
#define API_EXTERNAL "CreateWithExternalConstants"

static char root[128]; /* the test run's directory */
static char sock[256]; /* broker socket */
static pid_t broker = -1;
static char case_dir[256]; /* per test */

static int wait_secs(void)
{
    const char *s = getenv("WB_SANITIZED");
    return s && strcmp(s, "1") == 0 ? 30 : 10;
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void copy_file(const char *from, const char *to)
{
    FILE *f = fopen(from, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", from);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    write_file(to, buf, (size_t)n);
    chmod(to, 0700);
    free(buf);
}

/* Writes a safetensors file of 1-D F32 tensors of 4 values each. */
static void write_st(const char *path, const char *const *names, const float (*values)[4], size_t n)
{
    char header[1024];
    size_t used = (size_t)snprintf(header, sizeof header, "{");
    for (size_t i = 0; i < n; i++)
        used += (size_t)snprintf(
            header + used, sizeof header - used,
            "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[%zu,%zu]}", i ? "," : "",
            names[i], i * 16, i * 16 + 16);
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    while (used % 8)
        header[used++] = ' ';
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t len = used;
    fwrite(&len, 8, 1, f);
    fwrite(header, 1, used, f);
    for (size_t i = 0; i < n; i++)
        fwrite(values[i], 4, 4, f);
    fclose(f);
}

static const char *bin_dir(void)
{
    const char *d = getenv("WB_BIN_DIR");
    ck_assert_msg(d != NULL, "WB_BIN_DIR must name the build directory");
    return d;
}

static void fake_path(const char *flavour, char *out, size_t size)
{
    snprintf(out, size, "%s/tests/fake_aoti/fake_aoti_%s.so", bin_dir(), flavour);
}

static wb_client *connect_client(void)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = sock;
    o.timeout_ms = 5000;
    wb_client *c = NULL;
    int rc = wb_client_connect(&o, &c);
    ck_assert_msg(rc == WB_OK, "connect: %s", wb_client_errmsg(c));
    return c;
}

/* Starts one broker for the whole run, serving "base" (model.weight),
 * "head" (model.bias, model.scale) and "alt" (weight and model.weight: a
 * checkpoint where a name and its prefixed form are both tensors). */
static void start_broker(void)
{
    if (broker > 0)
        return;
    snprintf(root, sizeof root, "/tmp/wbct.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
    snprintf(sock, sizeof sock, "%s/broker.sock", root);
    char base[256], head[256], alt[256], log[256], wbrokerd[512], m1[300], m2[300], m3[300];
    snprintf(base, sizeof base, "%s/base.safetensors", root);
    snprintf(head, sizeof head, "%s/head.safetensors", root);
    snprintf(log, sizeof log, "%s/broker.log", root);
    const char *bn[] = {"model.weight"};
    const float bv[][4] = {{1, 2, 3, 4}};
    write_st(base, bn, bv, 1);
    const char *hn[] = {"model.bias", "model.scale"};
    const float hv[][4] = {{10, 20, 30, 40}, {7, 7, 7, 7}};
    write_st(head, hn, hv, 2);
    snprintf(alt, sizeof alt, "%s/alt.safetensors", root);
    const char *an[] = {"weight", "model.weight"};
    const float av[][4] = {{5, 5, 5, 5}, {1, 2, 3, 4}};
    write_st(alt, an, av, 2);
    snprintf(wbrokerd, sizeof wbrokerd, "%s/broker/wbrokerd", bin_dir());
    snprintf(m1, sizeof m1, "base=%s", base);
    snprintf(m2, sizeof m2, "head=%s", head);
    snprintf(m3, sizeof m3, "alt=%s", alt);
    /* Named slabs: these tests look at the tables the broker publishes in
     * /dev/shm (a memfd broker, the default, sends them in the frame). */
    char *argv[] = {wbrokerd, "--backend",      "host", "--host-slab", "shm", "--socket",
                    sock,     "--model",        m1,     "--model",     m2,    "--model",
                    m3,       "--heartbeat-ms", "100",  NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawn(&broker, wbrokerd, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    ck_assert_msg(rc == 0, "cannot start %s: %s", wbrokerd, strerror(rc));
    double deadline = mono() + wait_secs();
    for (;;) {
        wb_client_options o;
        wb_client_options_init(&o);
        o.socket_path = sock;
        o.timeout_ms = 1000;
        o.no_heartbeat_thread = 1;
        wb_client *c = NULL;
        int ok = 0;
        if (wb_client_connect(&o, &c) == WB_OK) {
            wb_lease *a = NULL, *b = NULL, *d = NULL;
            ok = wb_lease_acquire(c, "base", &a) == WB_OK &&
                 wb_lease_acquire(c, "head", &b) == WB_OK &&
                 wb_lease_acquire(c, "alt", &d) == WB_OK;
            wb_lease_release(&a);
            wb_lease_release(&b);
            wb_lease_release(&d);
        }
        wb_client_destroy(&c);
        if (ok)
            break;
        ck_assert_msg(mono() < deadline, "the broker did not serve base, head and alt (see %s)",
                      log);
        usleep(20000);
    }
}

static void stop_broker(void)
{
    if (broker > 0) {
        kill(broker, SIGTERM);
        waitpid(broker, NULL, 0);
        broker = -1;
        wb__aoti_rmtree(root);
    }
}

static int case_no;

/* A fresh directory holding a copy of the fake library (flavour "v211" or
 * "v214") and its spec; returns the library's path in so. */
static void make_case(const char *flavour, const char *spec, char *so, size_t size)
{
    start_broker();
    snprintf(case_dir, sizeof case_dir, "%s/case%d", root, ++case_no);
    ck_assert_int_eq(mkdir(case_dir, 0700), 0);
    char src[512], specp[512];
    fake_path(flavour, src, sizeof src);
    snprintf(so, size, "%s/fake_aoti_%s.so", case_dir, flavour);
    copy_file(src, so);
    snprintf(specp, sizeof specp, "%s/fake_aoti_spec.txt", case_dir);
    write_file(specp, spec, strlen(spec));
}

static const char *SPEC_BASIC = "elements 4\n"
                                "const w model.weight 6 16\n"
                                "const b model.bias 6 16\n";

typedef struct env {
    wb_client *client;
    wb_lease *leases[2];
} env;

static void open_env(env *e)
{
    e->client = connect_client();
    ck_assert_int_eq(wb_lease_acquire(e->client, "base", &e->leases[0]), WB_OK);
    ck_assert_int_eq(wb_lease_acquire(e->client, "head", &e->leases[1]), WB_OK);
}

static void close_env(env *e)
{
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(wb_lease_release(&e->leases[i]), WB_OK);
    wb_client_destroy(&e->client);
}

/* Runs the model on x = {1, 1, 2, 2} and checks y against `want`. */
static void run_and_check(wb_container *c, const float want[4])
{
    float x[4] = {1, 1, 2, 2};
    int64_t shape[1] = {4};
    wb_aten_tensor in = NULL, out = NULL;
    ck_assert_int_eq(wb_container_tensor_from_blob(c, x, "F32", 1, shape, -1, &in), WB_OK);
    ck_assert_msg(wb_container_run(c, &in, 1, &out, 1, NULL) == WB_OK, "run: %s",
                  wb_container_errmsg(c));
    wb_tensor_desc d;
    ck_assert_int_eq(wb_container_tensor_describe(c, out, &d), WB_OK);
    ck_assert_str_eq(d.dtype, "F32");
    ck_assert_uint_eq(d.ndim, 1);
    ck_assert_int_eq(d.shape[0], 4);
    ck_assert_uint_eq(d.nbytes, 16);
    ck_assert_int_eq(d.device, -1);
    const float *y = d.data;
    for (int i = 0; i < 4; i++)
        ck_assert_msg(y[i] == want[i], "y[%d] = %g, want %g", i, y[i], want[i]);
    ck_assert_int_eq(wb_container_tensor_delete(c, out), WB_OK);
}

static int (*fake_fn(const char *so, const char *name))(void)
{
    void *h = dlopen(so, RTLD_NOW | RTLD_NOLOAD);
    ck_assert_msg(h != NULL, "%s is not loaded", so);
    int (*f)(void) = (int (*)(void))dlsym(h, name);
    ck_assert_ptr_nonnull(f);
    dlclose(h);
    return f;
}

static long fake_long(const char *so, const char *name)
{
    void *h = dlopen(so, RTLD_NOW | RTLD_NOLOAD);
    ck_assert_ptr_nonnull(h);
    long (*f)(void) = (long (*)(void))dlsym(h, name);
    ck_assert_ptr_nonnull(f);
    dlclose(h);
    return f();
}

static const float WANT_BASIC[4] = {1 * 1 + 10, 1 * 2 + 20, 2 * 3 + 30, 2 * 4 + 40};

/* True when `p` lies in a read-only shared mapping of a broker's shm object
 * (/proc/self/maps). */
static int in_shm_mapping(const void *p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
            continue;
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi)
            found = strcmp(perms, "r--s") == 0 && strstr(line, "/dev/shm/wb-") != NULL;
    }
    fclose(f);
    return found;
}

/* The second acquire of a model names the digest of the table the client
 * holds, and the broker sends none: the new lease's entries point into the
 * same table (one reference more), with the same names, shapes and bytes. */
START_TEST(acquire_reuses_the_held_table)
{
    wb_client *c = connect_client();
    wb_lease *a = NULL, *b = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "base", &a), WB_OK);
    wb__table *t = a->table;
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(atomic_load(&t->refs), 2); /* the lease and the cache */
    size_t n = a->n_tensors;
    ck_assert_uint_gt(n, 0);
    /* Nothing per tensor is made until a tensor is read. */
    ck_assert_ptr_null(atomic_load(&t->entries));
    /* The broker published the table in shared memory: no frame and no
     * table in the reply came; the bytes are the read-only mapping's. */
    ck_assert_ptr_nonnull(t->map);
    ck_assert_ptr_null(t->frame);
    ck_assert_ptr_null(t->rep);
    ck_assert(in_shm_mapping(t->bytes));
    ck_assert(in_shm_mapping(t->bytes + t->len - 1));
    /* Every name at once finds what each one alone finds; an absent name
     * is WB_ENOTFOUND, named, its view zeroed, the others filled. */
    {
        const char **names = calloc(n + 1, sizeof *names);
        wb_tensor_view *many = calloc(n + 1, sizeof *many);
        ck_assert_ptr_nonnull(names);
        ck_assert_ptr_nonnull(many);
        wb_tensor_view one;
        for (size_t i = 0; i < n; i++) {
            ck_assert_int_eq(wb_lease_tensor(a, n - 1 - i, &one), WB_OK);
            names[i] = one.name;
        }
        ck_assert_int_eq(wb_lease_find_many(a, names, n, many), WB_OK);
        for (size_t i = 0; i < n; i++) {
            ck_assert_int_eq(wb_lease_find(a, names[i], &one), WB_OK);
            ck_assert_ptr_eq(many[i].name, one.name);
            ck_assert_ptr_eq(many[i].data, one.data);
            ck_assert_uint_eq(many[i].nbytes, one.nbytes);
        }
        names[n] = names[0];
        names[0] = "no.such.tensor";
        ck_assert_int_eq(wb_lease_find_many(a, names, n + 1, many), WB_ENOTFOUND);
        ck_assert_ptr_null(many[0].name);
        ck_assert_ptr_null(many[0].data);
        ck_assert_ptr_nonnull(many[n].data);
        ck_assert_msg(strstr(wb_client_errmsg(c), "no tensor 'no.such.tensor' (names[0]; 1 of") !=
                          NULL,
                      "%s", wb_client_errmsg(c));
        ck_assert_int_eq(wb_lease_find_many(a, names, 0, NULL), WB_OK);
        ck_assert_int_eq(wb_lease_find_many(a, NULL, 1, many), WB_EINVAL);
        names[1] = NULL;
        ck_assert_int_eq(wb_lease_find_many(a, names, 2, many), WB_EINVAL);
        free(names);
        free(many);
    }
    char name0[128];
    const wb__tensor_entry *ae = wb__lease_tensors(a);
    ck_assert_ptr_nonnull(ae);
    snprintf(name0, sizeof name0, "%s", ae[0].name);
    uint64_t nbytes0 = ae[0].nbytes, xxh0 = ae[0].xxh3;
    ck_assert_int_eq(wb_lease_release(&a), WB_OK);
    ck_assert_int_eq(atomic_load(&t->refs), 1); /* kept for the next acquire */

    ck_assert_int_eq(wb_lease_acquire(c, "base", &b), WB_OK);
    ck_assert_ptr_eq(b->table, t);
    ck_assert_int_eq(atomic_load(&t->refs), 2);
    /* Its entries are the table's: nothing per tensor was made again. */
    const wb__tensor_entry *be = wb__lease_tensors(b);
    ck_assert_ptr_eq(be, atomic_load(&t->entries));
    ck_assert_uint_eq(b->n_tensors, n);
    ck_assert_str_eq(be[0].name, name0);
    ck_assert_uint_eq(be[0].nbytes, nbytes0);
    ck_assert_uint_eq(be[0].xxh3, xxh0);
    ck_assert_int_eq(wb_lease_verify(b, NULL), WB_OK);
    /* Another model gets its own table. */
    wb_lease *h = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "head", &h), WB_OK);
    ck_assert_ptr_nonnull(h->table);
    ck_assert_ptr_ne(h->table, t);
    ck_assert_int_eq(wb_lease_release(&h), WB_OK);
    ck_assert_int_eq(wb_lease_release(&b), WB_OK);
    wb_client_destroy(&c);
}
END_TEST

START_TEST(v211_binds_by_fqn_across_leases)
{
    char so[512];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 2, so, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    ck_assert_int_eq(wb_container_get_info(c, &info), WB_OK);
    ck_assert_str_eq(info.aoti_api, API_DEVICE);
    ck_assert_int_eq(info.pinned_async_copy, 0);
    ck_assert_uint_eq(info.n_constants, 2);
    ck_assert_uint_eq(info.bound_tensors, 2);
    ck_assert_uint_eq(info.bound_bytes, 32);
    ck_assert_uint_eq(info.folded_bytes, 0);
    ck_assert_uint_eq(info.embedded_bytes, 0);
    ck_assert_str_eq(info.device, "cpu");
    ck_assert_ptr_null(wb_container_stream(c));
    /* The library's part of the creation is timed, and is a part of it. */
    ck_assert(info.library_seconds > 0.0);
    ck_assert(info.library_seconds <= info.create_seconds);
    /* Two wrappers of leased memory; no copy: the weights seen by the fake
     * are the leased bytes themselves. */
    ck_assert_int_eq(fake_fn(so, "fake_aoti_live_tensors")(), 2);
    run_and_check(c, WANT_BASIC);

    /* Registered on both leases: they cannot be released while it lives. */
    ck_assert_uint_eq(wb_lease_containers(e.leases[0]), 1);
    ck_assert_uint_eq(wb_lease_containers(e.leases[1]), 1);
    wb_lease *l = e.leases[0];
    ck_assert_int_eq(wb_lease_release(&l), WB_EBUSY);
    ck_assert_ptr_eq(l, e.leases[0]);
    ck_assert_ptr_nonnull(strstr(wb_client_errmsg(e.client), "container"));

    /* What the next heartbeat reports for each lease. */
    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT;
    ck_assert_int_eq(wb__lease_fill_beat(e.leases[1], &beat), WB_OK);
    ck_assert_uint_eq(beat.n_container_records, 1);
    ck_assert_str_eq(beat.container_records[0]->aoti_api, API_DEVICE);
    ck_assert_uint_eq(beat.container_records[0]->bound_bytes, 16);
    ck_assert_uint_eq(beat.container_records[0]->bound_tensors, 1);
    ck_assert_str_eq(beat.container_records[0]->model_path, so);
    ck_assert(beat.container_records[0]->created_at > 1.6e9);
    wb__lease_beat_free(&beat);

    wb_container_destroy(&c);
    ck_assert_ptr_null(c);
    wb_container_destroy(&c);
    ck_assert_uint_eq(wb_lease_containers(e.leases[0]), 0);
    ck_assert_int_eq(wb__lease_fill_beat(e.leases[1], &beat), WB_OK);
    ck_assert_uint_eq(beat.n_container_records, 0);
    close_env(&e);
}
END_TEST

START_TEST(v214_uses_external_constants_and_pinned_copy)
{
    char so[512];
    make_case("v214", SPEC_BASIC, so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 2, so, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_str_eq(info.aoti_api, API_EXTERNAL);
    ck_assert_int_eq(info.pinned_async_copy, 1);
    /* Switched on before the containers were created; one creation to read
     * the names, one with the constants. */
    ck_assert_int_eq(fake_fn(so, "fake_aoti_pinned_at_create")(), 1);
    ck_assert_int_eq(fake_fn(so, "fake_aoti_creates")(), 2);
    ck_assert_uint_eq(info.bound_bytes, 32);
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

START_TEST(dtype_mismatch_names_the_tensor)
{
    char so[512];
    make_case("v211", "elements 4\nconst w model.weight 15 16\nconst b model.bias 6 16\n", so,
              sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_EINVAL);
    const char *m = wb_container_errmsg(c);
    ck_assert_ptr_nonnull(strstr(m, "constant 'model.weight'"));
    ck_assert_ptr_nonnull(strstr(m, "BF16"));
    ck_assert_ptr_nonnull(strstr(m, "has F32"));
    ck_assert_ptr_nonnull(strstr(m, "model 'base'"));
    wb_container_destroy(&c);
    /* Nothing stays registered after a failed creation. */
    ck_assert_uint_eq(wb_lease_containers(e.leases[0]), 0);
    close_env(&e);
}
END_TEST

START_TEST(size_mismatch_names_the_tensor)
{
    char so[512];
    make_case("v214", "elements 4\nconst w model.weight 6 16\nconst b model.bias 6 32\n", so,
              sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_EINVAL);
    const char *m = wb_container_errmsg(c);
    ck_assert_ptr_nonnull(strstr(m, "constant 'model.bias'"));
    ck_assert_ptr_nonnull(strstr(m, "storage is 32 bytes"));
    ck_assert_ptr_nonnull(strstr(m, "16 bytes"));
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

START_TEST(missing_constant_is_named)
{
    char so[512];
    make_case("v211",
              "elements 4\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
              "const extra model.extra 6 16\n",
              so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_ENOTFOUND);
    const char *m = wb_container_errmsg(c);
    ck_assert_ptr_nonnull(strstr(m, "parameter 'model.extra'"));
    ck_assert_ptr_nonnull(strstr(m, "no caller tensor"));
    ck_assert_ptr_nonnull(strstr(m, "no constants file"));
    ck_assert_ptr_nonnull(strstr(m, "'base', 'head'"));
    wb_container_destroy(&c);
    /* Only one lease given: the bias is then missing too. */
    make_case("v211", SPEC_BASIC, so, sizeof so);
    ck_assert_int_eq(wb_container_create(e.leases, 1, so, NULL, &c), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "parameter 'model.bias'"));
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

START_TEST(caller_tensors_bind_and_override)
{
    char so[512];
    make_case("v214", SPEC_BASIC, so, sizeof so);
    env e;
    open_env(&e);
    /* The caller's bias replaces the leased one; the weight comes from the
     * base lease. */
    static const float bias[4] = {100, 200, 300, 400};
    static const uint64_t shape[1] = {4};
    wb_container_tensor t = {
        .fqn = "model.bias", .data = bias, .dtype = "F32", .ndim = 1, .shape = shape, .device = -1};
    wb_container_options o;
    wb_container_options_init(&o);
    o.tensors = &t;
    o.n_tensors = 1;
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 1, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.bound_bytes, 16);
    ck_assert_uint_eq(info.caller_bytes, 16);
    const float want[4] = {101, 202, 306, 408};
    run_and_check(c, want);
    wb_container_destroy(&c);

    /* A caller tensor of the wrong dtype is named. */
    t.dtype = "F16";
    ck_assert_int_eq(wb_container_create(e.leases, 1, so, &o, &c), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "caller tensor 0"));
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "model.bias"));
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

static const char *SPEC_FOLDED = "elements 4\n"
                                 "const w model.weight 6 16\n"
                                 "const b model.bias 6 16\n"
                                 "folded _FOLDED_CONST_w2 16\n";

START_TEST(folded_constants_are_built_not_bound)
{
    const char *flavours[] = {"v211", "v214"};
    for (int k = 0; k < 2; k++) {
        char so[512];
        make_case(flavours[k], SPEC_FOLDED, so, sizeof so);
        env e;
        open_env(&e);
        wb_container *c = NULL;
        int rc = wb_container_create(e.leases, 2, so, NULL, &c);
        ck_assert_msg(rc == WB_OK, "%s: create: %s", flavours[k], wb_container_errmsg(c));
        wb_container_info info;
        wb_container_get_info(c, &info);
        ck_assert_uint_eq(info.n_constants, 3);
        ck_assert_uint_eq(info.bound_tensors, 2);
        ck_assert_uint_eq(info.folded_constants, 1);
        ck_assert_uint_eq(info.folded_bytes, 16);
        /* Folded once, at creation (not left to the first run). */
        ck_assert_int_eq(fake_fn(so, "fake_aoti_fold_calls")(), 1);
        ck_assert_int_eq(fake_long(so, "fake_aoti_folded_live_bytes"), 16);
        run_and_check(c, WANT_BASIC);
        Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT;
        ck_assert_int_eq(wb__lease_fill_beat(e.leases[0], &beat), WB_OK);
        ck_assert_uint_eq(beat.container_records[0]->folded_bytes, 16);
        wb__lease_beat_free(&beat);
        wb_container_destroy(&c);
        close_env(&e);
    }
}
END_TEST

START_TEST(embedded_copy_is_replaced_and_freed)
{
    char so[512];
    make_case("v211emb",
              "elements 4\nembedded 1\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
              "folded _FOLDED_CONST_w2 16\n",
              so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 2, so, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.embedded_bytes, 32);
    ck_assert(info.embedded_free_seconds >= 0);
    /* The library's own copy (filled with 0.5) is gone, and the outputs come
     * from the leased weights. */
    ck_assert_int_eq(fake_long(so, "fake_aoti_embedded_live_bytes"), 0);
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* Builds a zip at `path` from (name, file or NULL for literal text) pairs. */
static void make_zip(const char *path, const char *const *names, const char *const *sources,
                     const char *const *texts, size_t n)
{
    int err = 0;
    zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &err);
    ck_assert_ptr_nonnull(z);
    for (size_t i = 0; i < n; i++) {
        zip_source_t *src = sources[i] ? zip_source_file(z, sources[i], 0, -1)
                                       : zip_source_buffer(z, texts[i], strlen(texts[i]), 0);
        ck_assert_ptr_nonnull(src);
        ck_assert_int_ge(zip_file_add(z, names[i], src, ZIP_FL_OVERWRITE), 0);
    }
    ck_assert_int_eq(zip_close(z), 0);
}

static int count_prefixed(const char *dir, const char *prefix)
{
    int n = 0;
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

START_TEST(pt2_package_is_unpacked_privately)
{
    char so[512], pt2[512], work[512];
    make_case("v214", SPEC_FOLDED, so, sizeof so);
    snprintf(pt2, sizeof pt2, "%s/model.pt2", case_dir);
    snprintf(work, sizeof work, "%s/work", case_dir);
    ck_assert_int_eq(mkdir(work, 0700), 0);
    const char *names[] = {"model/data/aotinductor/model/fake.so",
                           "model/data/aotinductor/model/fake_aoti_spec.txt",
                           "model/extra/readme.txt"};
    const char *sources[] = {so, NULL, NULL};
    const char *texts[] = {NULL, SPEC_FOLDED, "not a model"};
    make_zip(pt2, names, sources, texts, 3);
    env e;
    open_env(&e);
    wb_container_options o;
    wb_container_options_init(&o);
    o.work_dir = work;
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 2, pt2, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_str_eq(info.model_path, pt2);
    ck_assert_ptr_nonnull(strstr(info.so_path, "/wb-aoti-"));
    ck_assert_ptr_nonnull(strstr(info.so_path, "/model/data/aotinductor/model/fake.so"));
    ck_assert_int_eq(strncmp(info.so_path, work, strlen(work)), 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%.*s", (int)(strstr(info.so_path, "/model/data") - info.so_path),
             info.so_path);
    struct stat st;
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);
    /* The private directory is removed with the container. */
    ck_assert_int_eq(stat(dir, &st), -1);
    ck_assert_int_eq(count_prefixed(work, "wb-aoti-"), 0);
    close_env(&e);
}
END_TEST

START_TEST(zip_slip_is_refused)
{
    char so[512], pt2[512], work[512], evil[512];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    snprintf(work, sizeof work, "%s/work", case_dir);
    ck_assert_int_eq(mkdir(work, 0700), 0);
    const char *bad[] = {"../evil.so", "model/../../evil.so", "/tmp/evil.so"};
    for (int k = 0; k < 3; k++) {
        snprintf(pt2, sizeof pt2, "%s/slip%d.pt2", case_dir, k);
        const char *names[] = {"model/data/aotinductor/model/fake.so", bad[k]};
        const char *sources[] = {so, NULL};
        const char *texts[] = {NULL, "payload"};
        make_zip(pt2, names, sources, texts, 2);
        wb_container_options o;
        wb_container_options_init(&o);
        o.work_dir = work;
        wb_container *c = NULL;
        ck_assert_int_eq(wb_container_create(NULL, 0, pt2, &o, &c), WB_EFORMAT);
        ck_assert_msg(strstr(wb_container_errmsg(c), bad[k]) != NULL, "%s", wb_container_errmsg(c));
        ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "refusing"));
        wb_container_destroy(&c);
        /* Nothing was written, and no directory is left behind. */
        ck_assert_int_eq(count_prefixed(work, "wb-aoti-"), 0);
        snprintf(evil, sizeof evil, "%s/evil.so", case_dir);
        ck_assert_int_eq(access(evil, F_OK), -1);
    }
    ck_assert_int_eq(wb__aoti_entry_name_safe("a/b/c.so"), 1);
    ck_assert_int_eq(wb__aoti_entry_name_safe("a/..b/c"), 1);
    ck_assert_int_eq(wb__aoti_entry_name_safe("a/../c"), 0);
    ck_assert_int_eq(wb__aoti_entry_name_safe(".."), 0);
    ck_assert_int_eq(wb__aoti_entry_name_safe("a\\..\\b"), 0);
    ck_assert_int_eq(wb__aoti_entry_name_safe(""), 0);
}
END_TEST

START_TEST(bad_model_paths)
{
    char so[512], path[512];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    wb_container *c = NULL;
    snprintf(path, sizeof path, "%s/absent.pt2", case_dir);
    ck_assert_int_eq(wb_container_create(NULL, 0, path, NULL, &c), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "absent.pt2"));
    wb_container_destroy(&c);

    snprintf(path, sizeof path, "%s/fake_aoti_spec.txt", case_dir);
    ck_assert_int_eq(wb_container_create(NULL, 0, path, NULL, &c), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "neither a .pt2 package"));
    wb_container_destroy(&c);

    /* A directory with two libraries is ambiguous; both are named. */
    char second[512];
    snprintf(second, sizeof second, "%s/other.so", case_dir);
    copy_file(so, second);
    ck_assert_int_eq(wb_container_create(NULL, 0, case_dir, NULL, &c), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "other.so"));
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "fake_aoti_v211.so"));
    wb_container_destroy(&c);
    unlink(second);

    /* A directory with one library is fine. */
    env e;
    open_env(&e);
    ck_assert_int_eq(wb_container_create(e.leases, 2, case_dir, NULL, &c), WB_OK);
    wb_container_destroy(&c);
    close_env(&e);

    /* A shared library that is not a model. */
    snprintf(path, sizeof path, "%s/client/libwbclient.so", bin_dir());
    ck_assert_int_eq(wb_container_create(NULL, 0, path, NULL, &c), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "does not export"));
    wb_container_destroy(&c);

    /* Arguments. */
    ck_assert_int_eq(wb_container_create(NULL, 0, so, NULL, NULL), WB_EINVAL);
    ck_assert_int_eq(wb_container_create(NULL, 2, so, NULL, &c), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "array is NULL"));
    wb_container_destroy(&c);
    wb_container_options o;
    wb_container_options_init(&o);
    o.device = "tpu";
    ck_assert_int_eq(wb_container_create(NULL, 0, so, &o, &c), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "device 'tpu'"));
    wb_container_destroy(&c);
    o.device = NULL;
    o.torch_lib_dir = case_dir;
    ck_assert_int_eq(wb_container_create(NULL, 0, so, &o, &c), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "libc10.so"));
    wb_container_destroy(&c);
    ck_assert_str_eq(wb_container_errmsg(NULL), "no container (out of memory, or NULL was passed)");
}
END_TEST

START_TEST(run_argument_checks)
{
    char so[512];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_OK);
    wb_aten_tensor out = NULL;
    ck_assert_int_eq(wb_container_run(c, NULL, 0, &out, 1, NULL), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "takes 1 inputs, 0 given"));
    /* A runtime failure is reported with the runtime's message. */
    float x[3] = {1, 2, 3};
    int64_t shape[1] = {3};
    wb_aten_tensor in = NULL;
    ck_assert_int_eq(wb_container_tensor_from_blob(c, x, "F32", 1, shape, -1, &in), WB_OK);
    ck_assert_int_eq(wb_container_run(c, &in, 1, &out, 1, NULL), WB_EINTERNAL);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "AOTInductorModelContainerRun failed"));
    ck_assert_int_eq(wb_container_tensor_from_blob(c, x, "F4", 1, shape, -1, &in), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "'F4'"));
    wb_container_destroy(&c);
    /* The stolen input was freed by the model; nothing leaks. */
    close_env(&e);
}
END_TEST

static void teardown_all(void)
{
    stop_broker();
}

/* Writes a safetensors file of 1-D F32 tensors of 4 values with metadata
 * (key/value pairs, n_meta of them). */
static void write_st_meta(const char *path, const char *const *names, const float (*values)[4],
                          size_t n, const char *const *meta, size_t n_meta)
{
    char header[2048];
    size_t used = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":{");
    for (size_t i = 0; i < n_meta; i++)
        used += (size_t)snprintf(header + used, sizeof header - used, "%s\"%s\":\"%s\"",
                                 i ? "," : "", meta[2 * i], meta[2 * i + 1]);
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    for (size_t i = 0; i < n; i++)
        used +=
            (size_t)snprintf(header + used, sizeof header - used,
                             ",\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[%zu,%zu]}",
                             names[i], i * 16, i * 16 + 16);
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    while (used % 8)
        header[used++] = ' ';
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t len = used;
    fwrite(&len, 8, 1, f);
    fwrite(header, 1, used, f);
    for (size_t i = 0; i < n; i++)
        fwrite(values[i], 4, 4, f);
    fclose(f);
}

static void check_beat_counts(wb_lease *l, uint32_t leased, uint32_t aliased, uint32_t package,
                              uint32_t unbound)
{
    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT;
    ck_assert_int_eq(wb__lease_fill_beat(l, &beat), WB_OK);
    ck_assert_uint_eq(beat.n_container_records, 1);
    const Wbproto__ContainerRecord *r = beat.container_records[0];
    ck_assert_uint_eq(r->leased_constants, leased);
    ck_assert_uint_eq(r->aliased_constants, aliased);
    ck_assert_uint_eq(r->package_constants, package);
    ck_assert_uint_eq(r->unbound_constants, unbound);
    wb__lease_beat_free(&beat);
}

/* A constant the compiled graph writes (the constants file's
 * "weightbroker.mutated", or the caller's list) is never bound to the
 * shared lease: refused naming it, or bound to a private copy when asked. */
START_TEST(mutated_constant_is_refused_or_copied)
{
    char so[512], file[600];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    snprintf(file, sizeof file, "%s.wb.safetensors", so);
    const char *names[] = {"unused.extra"};
    const float vals[][4] = {{0, 0, 0, 0}};
    const char *meta[] = {"weightbroker.mutated", "running.count, model.bias"};
    write_st_meta(file, names, vals, 1, meta, 1);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_EPERM);
    const char *msg = wb_container_errmsg(c);
    ck_assert_msg(strstr(msg, "constant 'model.bias' is written by the compiled graph (listed as "
                              "mutated in ") != NULL,
                  "%s", msg);
    ck_assert_msg(strstr(msg, "shared through a read-only mapping (host): a write would fault in "
                              "this worker") != NULL,
                  "%s", msg);
    ck_assert_ptr_nonnull(strstr(msg, "copy_mutated"));
    wb_container_destroy(&c);
    ck_assert_uint_eq(wb_lease_containers(e.leases[0]), 0);

    /* Asked for: a private copy, counted as the container's own. */
    wb_container_options o;
    wb_container_options_init(&o);
    o.copy_mutated = 1;
    int rc = wb_container_create(e.leases, 2, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.leased_constants, 1);
    ck_assert_uint_eq(info.package_constants, 1);
    ck_assert_uint_eq(info.package_bytes, 16);
    ck_assert_uint_eq(info.bound_bytes, 16);
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);
    unlink(file);

    /* The caller's list, names trimmed; only whole names match. */
    wb_container_options_init(&o);
    o.mutated = " model.weight ,";
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, &o, &c), WB_EPERM);
    ck_assert_msg(strstr(wb_container_errmsg(c), "constant 'model.weight' is written by the "
                                                 "compiled graph (listed as mutated) but") != NULL,
                  "%s", wb_container_errmsg(c));
    wb_container_destroy(&c);
    o.mutated = "model.weigh,odel.bias,model.bias.x";
    rc = wb_container_create(e.leases, 2, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* save_pretrained drops a tied parameter: the model still has a constant
 * for it, which binds to the tensor it is tied to. */
START_TEST(tied_weight_binds_through_alias)
{
    const char *flavours[] = {"v211", "v214"};
    for (int k = 0; k < 2; k++) {
        char so[512];
        make_case(flavours[k], "elements 4\nconst w lm_head.weight 6 16\nconst b model.bias 6 16\n",
                  so, sizeof so);
        env e;
        open_env(&e);
        wb_container *c = NULL;
        /* Without the alias: the parameter, the leases searched and the way
         * out are named. */
        ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_ENOTFOUND);
        const char *m = wb_container_errmsg(c);
        ck_assert_msg(strstr(m, "parameter 'lm_head.weight'") && strstr(m, "'base', 'head'") &&
                          strstr(m, "alias (lm_head.weight=<checkpoint name>)"),
                      "%s", m);
        wb_container_destroy(&c);

        wb_container_options o;
        wb_container_options_init(&o);
        o.aliases = " lm_head.weight = model.weight ";
        int rc = wb_container_create(e.leases, 2, so, &o, &c);
        ck_assert_msg(rc == WB_OK, "%s: create: %s", flavours[k], wb_container_errmsg(c));
        wb_container_info info;
        wb_container_get_info(c, &info);
        ck_assert_uint_eq(info.leased_constants, 1);
        ck_assert_uint_eq(info.aliased_constants, 1);
        ck_assert_uint_eq(info.bound_bytes, 32);
        run_and_check(c, WANT_BASIC);
        check_beat_counts(e.leases[0], 1, 1, 0, 0);
        wb_container_destroy(&c);

        /* An alias to a name no lease has: named too. */
        o.aliases = "lm_head.weight=transformer.wte.weight";
        ck_assert_int_eq(wb_container_create(e.leases, 2, so, &o, &c), WB_ENOTFOUND);
        ck_assert_ptr_nonnull(
            strstr(wb_container_errmsg(c), "alias target 'transformer.wte.weight' not found"));
        wb_container_destroy(&c);
        close_env(&e);
    }
}
END_TEST

/* Two constants on one leased tensor: both bind to the same memory, which
 * is counted once. */
START_TEST(two_constants_on_one_leased_tensor)
{
    char so[512];
    make_case("v211", "elements 4\nconst w model.weight 6 16\nconst b lm_head.weight 6 16\n", so,
              sizeof so);
    env e;
    open_env(&e);
    wb_container_options o;
    wb_container_options_init(&o);
    o.aliases = "lm_head.weight=model.weight";
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 1, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.bound_tensors, 2);
    ck_assert_uint_eq(info.bound_bytes, 16);
    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT;
    ck_assert_int_eq(wb__lease_fill_beat(e.leases[0], &beat), WB_OK);
    ck_assert_uint_eq(beat.container_records[0]->bound_bytes, 16);
    ck_assert_uint_eq(beat.container_records[0]->bound_tensors, 1);
    wb__lease_beat_free(&beat);
    /* y = x * w + w: both constants read the leased weight. */
    const float want[4] = {1 + 1, 2 + 2, 6 + 3, 8 + 4};
    run_and_check(c, want);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* A model path is any bytes and may be long; the broker refuses a heartbeat
 * whose strings are not UTF-8, and one whose path has 1024 bytes or more.
 * The record libwbclient sends is UTF-8 (a byte that is not, as U+FFFD) of
 * at most WB_MAX_RECORD_PATH - 1 bytes, a long path by its end from a
 * character's start: a heartbeat the broker accepts. */
START_TEST(record_path_is_utf8)
{
    char so[512];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    /* Five directories of 81 x U+6A21 (243 bytes each), then "m\xff\xfe.so". */
    static char dir[2048];
    size_t n = (size_t)snprintf(dir, sizeof dir, "%s", case_dir);
    for (int d = 0; d < 5; d++) {
        dir[n++] = '/';
        for (int k = 0; k < 81; k++, n += 3)
            memcpy(dir + n, "\xe6\xa8\xa1", 3);
        dir[n] = '\0';
        ck_assert_int_eq(mkdir(dir, 0700), 0);
    }
    char path[2100], spec[2100];
    snprintf(path, sizeof path, "%s/m\xff\xfe.so", dir);
    snprintf(spec, sizeof spec, "%s/fake_aoti_spec.txt", dir);
    copy_file(so, path);
    write_file(spec, SPEC_BASIC, strlen(SPEC_BASIC));
    ck_assert_uint_gt(strlen(path), WB_MAX_RECORD_PATH);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 2, path, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    ck_assert_int_eq(wb_container_get_info(c, &info), WB_OK);
    ck_assert_str_eq(info.model_path, path); /* the caller's own, exact */

    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT;
    ck_assert_int_eq(wb__lease_fill_beat(e.leases[0], &beat), WB_OK);
    ck_assert_uint_eq(beat.n_container_records, 1);
    const char *sent = beat.container_records[0]->model_path;
    size_t len = strlen(sent);
    ck_assert_uint_lt(len, WB_MAX_RECORD_PATH);
    ck_assert_uint_eq(wb__utf8_invalid_at(sent, len), len);
    ck_assert_msg(strncmp(sent, "...\xe6\xa8\xa1", 6) == 0, "starts '%.12s'", sent);
    const char *end = "\xe6\xa8\xa1/m\xef\xbf\xbd\xef\xbf\xbd.so";
    ck_assert_str_eq(sent + len - strlen(end), end);
    /* The broker's decoder takes it. */
    Wbproto__LeaseBeat *beats[] = {&beat};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 1;
    hb.leases = beats;
    beat.lease_id.data = (uint8_t[WB_LEASE_ID_LEN]){1};
    beat.lease_id.len = WB_LEASE_ID_LEN;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.version = WB_PROTOCOL_VERSION;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    size_t blen;
    uint8_t *buf = wb__request_pack(&req, &blen);
    ck_assert_ptr_nonnull(buf);
    Wbproto__Request *out = NULL;
    uint64_t id;
    wb_err err;
    ck_assert_msg(wb__request_decode(buf, blen, &out, &id, &err) == WB_OK, "%s", err.msg);
    wb__request_free(&out);
    free(buf);
    beat.lease_id.data = NULL;
    beat.lease_id.len = 0;
    wb__lease_beat_free(&beat);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

START_TEST(bad_alias_lists_are_refused)
{
    char so[512];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    env e;
    open_env(&e);
    const char *bad[] = {"lm_head.weight", "=model.weight", "a=", "a=b=c"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wb_container_options o;
        wb_container_options_init(&o);
        o.aliases = bad[i];
        wb_container *c = NULL;
        ck_assert_int_eq(wb_container_create(e.leases, 2, so, &o, &c), WB_EINVAL);
        ck_assert_msg(strstr(wb_container_errmsg(c), "option aliases: alias") &&
                          strstr(wb_container_errmsg(c), "expected NAME=TARGET"),
                      "%s: %s", bad[i], wb_container_errmsg(c));
        wb_container_destroy(&c);
    }
    close_env(&e);
}
END_TEST

/* A model exported inside a wrapper has prefixed FQNs. */
START_TEST(prefix_rules_map_wrapped_names)
{
    char so[512];
    make_case("v214", "elements 4\nconst w wrap.model.weight 6 16\nconst b wrap.model.bias 6 16\n",
              so, sizeof so);
    env e;
    open_env(&e);
    wb_container_options o;
    wb_container_options_init(&o);
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, &o, &c), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "parameter 'wrap.model.weight'"));
    wb_container_destroy(&c);
    o.strip_prefix = "wrap.";
    int rc = wb_container_create(e.leases, 2, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);

    /* The other way: the checkpoint has a prefix the model lacks. */
    make_case("v211", "elements 4\nconst w weight 6 16\nconst b bias 6 16\n", so, sizeof so);
    wb_container_options_init(&o);
    o.prefix = "model.";
    rc = wb_container_create(e.leases, 2, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.leased_constants, 2);
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

static const char *SPEC_BUFFER = "elements 4\n"
                                 "const w lm_head.weight 6 16\n"
                                 "const b model.bias 6 16\n"
                                 "const inv rotary.inv_freq 6 16 2\n";

/* A non-persistent buffer is in no checkpoint: it comes from the constants
 * file written at compile time, which also carries the ties. */
START_TEST(constants_file_supplies_buffers_and_aliases)
{
    const char *names[] = {"rotary.inv_freq"};
    const float vals[][4] = {{0.5f, 0.25f, 0.125f, 1}};
    const char *meta[] = {"weightbroker.aliases", "lm_head.weight=model.weight"};
    const float want[4] = {11.5f, 22.25f, 36.125f, 49};
    const char *flavours[] = {"v211", "v214"};
    for (int k = 0; k < 2; k++) {
        char so[512], file[600];
        make_case(flavours[k], SPEC_BUFFER, so, sizeof so);
        env e;
        open_env(&e);
        wb_container *c = NULL;
        /* No file: the tied parameter is missing, and the buffer, for which
         * this library holds no data of its own. */
        ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_ENOTFOUND);
        ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "parameter 'lm_head.weight'"));
        wb_container_destroy(&c);

        /* Beside the library. */
        snprintf(file, sizeof file, "%s.wb.safetensors", so);
        write_st_meta(file, names, vals, 1, meta, 1);
        int rc = wb_container_create(e.leases, 2, so, NULL, &c);
        ck_assert_msg(rc == WB_OK, "%s: create: %s", flavours[k], wb_container_errmsg(c));
        wb_container_info info;
        wb_container_get_info(c, &info);
        ck_assert_uint_eq(info.leased_constants, 1);
        ck_assert_uint_eq(info.aliased_constants, 1);
        ck_assert_uint_eq(info.package_constants, 1);
        ck_assert_uint_eq(info.package_bytes, 16);
        ck_assert_uint_eq(info.unbound_constants, 0);
        ck_assert_uint_eq(info.bound_bytes, 32);
        run_and_check(c, want);
        check_beat_counts(e.leases[0], 1, 1, 1, 0);
        wb_container_destroy(&c);
        close_env(&e);
    }
}
END_TEST

START_TEST(constants_file_inside_a_package)
{
    char so[512], pt2[512], cfile[600];
    make_case("v214", SPEC_BUFFER, so, sizeof so);
    snprintf(cfile, sizeof cfile, "%s/constants.safetensors", case_dir);
    const char *names[] = {"rotary.inv_freq"};
    const float vals[][4] = {{1, 1, 1, 1}};
    const char *meta[] = {"weightbroker.aliases", "lm_head.weight=model.weight",
                          "weightbroker.format", "1"};
    write_st_meta(cfile, names, vals, 1, meta, 2);
    snprintf(pt2, sizeof pt2, "%s/model.pt2", case_dir);
    const char *zn[] = {"model/data/aotinductor/model/fake.so",
                        "model/data/aotinductor/model/fake_aoti_spec.txt",
                        "model/weightbroker/constants.safetensors"};
    const char *sources[] = {so, NULL, cfile};
    const char *texts[] = {NULL, SPEC_BUFFER, NULL};
    make_zip(pt2, zn, sources, texts, 3);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 2, pt2, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.package_constants, 1);
    const float want[4] = {12, 23, 37, 49};
    run_and_check(c, want);
    wb_container_destroy(&c);

    /* Named explicitly: a missing file is an error. */
    wb_container_options o;
    wb_container_options_init(&o);
    o.constants_file = "/nonexistent/constants.safetensors";
    ck_assert_int_eq(wb_container_create(e.leases, 2, pt2, &o, &c), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "/nonexistent/constants.safetensors"));
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* Creates a container expecting WB_ENOTFOUND; returns
 * the message (valid until the container is destroyed). */
static const char *create_fails(env *e, size_t n_leases, const char *so,
                                const wb_container_options *o, wb_container **c)
{
    int rc = wb_container_create(e->leases, n_leases, so, o, c);
    ck_assert_msg(rc == WB_ENOTFOUND, "create: %d (%s)", rc, wb_container_errmsg(*c));
    return wb_container_errmsg(*c);
}

static void has(const char *msg, const char *part)
{
    ck_assert_msg(strstr(msg, part) != NULL, "'%s' not in: %s", part, msg);
}

static void lacks(const char *msg, const char *part)
{
    ck_assert_msg(strstr(msg, part) == NULL, "'%s' in: %s", part, msg);
}

static const char *SPEC_UNBOUND = "elements 4\n"
                                  "const w model.weight 6 16\n"
                                  "const b model.bias 6 16\n"
                                  "const inv rotary.inv_freq 6 16 2\n"
                                  "const mask causal_mask 6 16 3\n";

/* A buffer or tensor constant bound by nothing, for which the library holds
 * no data of its own (a model compiled with its constants outside the
 * library): upstream's runtime only warns and the first run faults on the
 * GPU. The creation is refused naming every such constant, its type, how
 * the library's data was judged and the fixes. */
/* torch 2.11 links a blob of one byte into a library whose constants are
 * outside it: that holds nothing, and is no mmap'd-weights header to ask
 * GetConstantsBlobSize about (upstream would print an error on the
 * worker's stderr). Seen on the GPU machine with torch's own packages. */
START_TEST(placeholder_blob_is_not_asked)
{
    char so[512];
    make_case("v211one", SPEC_UNBOUND, so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    const char *m = create_fails(&e, 2, so, NULL, &c);
    has(m, "2 constants are bound by nothing");
    has(m, "its embedded constants blob holds 1 bytes for 64 bytes of constants");
    ck_assert_int_eq(fake_fn(so, "fake_aoti_blob_size_calls")(), 0);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

START_TEST(unbound_constants_without_library_data_are_refused)
{
    const char *flavours[] = {"v211", "v214"};
    const char *how[] = {"its embedded constants blob holds 0 bytes for 64 bytes of constants",
                         "AOTInductorModelContainerExtractConstantsMapEntries lists 0 constants"};
    for (int k = 0; k < 2; k++) {
        char so[512];
        make_case(flavours[k], SPEC_UNBOUND, so, sizeof so);
        env e;
        open_env(&e);
        wb_container *c = NULL;
        const char *m = create_fails(&e, 2, so, NULL, &c);
        has(m, "2 constants are bound by nothing (in no lease ('base', 'head'), no caller tensor "
               "and no constants file): buffer 'rotary.inv_freq', tensor constant 'causal_mask'.");
        has(m, "The model library holds no data of its own for them (");
        has(m, how[k]);
        has(m, "python3 -m weightbroker.compile");
        has(m, "--constants FILE");
        has(m, "wb_container_options.tensors");
        lacks(m, "alias");
        wb_container_destroy(&c);
        ck_assert_uint_eq(wb_lease_containers(e.leases[0]), 0);

        /* Bound by caller tensors, it runs (the fake adds each buffer). */
        static const float one[4] = {1, 1, 1, 1};
        static const uint64_t shape[1] = {4};
        wb_container_tensor t[2] = {{.fqn = "rotary.inv_freq",
                                     .data = one,
                                     .dtype = "F32",
                                     .ndim = 1,
                                     .shape = shape,
                                     .device = -1},
                                    {.fqn = "causal_mask",
                                     .data = one,
                                     .dtype = "F32",
                                     .ndim = 1,
                                     .shape = shape,
                                     .device = -1}};
        wb_container_options o;
        wb_container_options_init(&o);
        o.tensors = t;
        o.n_tensors = 2;
        int rc = wb_container_create(e.leases, 2, so, &o, &c);
        ck_assert_msg(rc == WB_OK, "%s: create: %s", flavours[k], wb_container_errmsg(c));
        const float want[4] = {13, 24, 38, 50};
        run_and_check(c, want);
        wb_container_destroy(&c);
        close_env(&e);
    }
}
END_TEST

/* Where the library did load data of its own for a buffer (here reported
 * constant by constant through ExtractConstantsMapEntries), a buffer bound
 * by nothing keeps it and is counted as unbound; one without such data is
 * still refused. With torch >= 2.14 the container made to read the
 * constants is kept: CreateWithExternalConstants loads no data. */
START_TEST(unbound_buffer_keeps_the_library_data)
{
    char so[512];
    make_case("v214",
              "elements 4\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
              "const inv rotary.inv_freq 6 16 2 1\nconst mask causal_mask 6 16 3\n",
              so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    const char *m = create_fails(&e, 2, so, NULL, &c);
    has(m, "1 constant is bound by nothing");
    has(m, ": tensor constant 'causal_mask'.");
    has(m, "ExtractConstantsMapEntries lists 1 constants");
    lacks(m, "rotary.inv_freq");
    wb_container_destroy(&c);

    make_case("v214",
              "elements 4\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
              "const inv rotary.inv_freq 6 16 2 1\n",
              so, sizeof so);
    int rc = wb_container_create(e.leases, 2, so, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.unbound_constants, 1);
    ck_assert_uint_eq(info.leased_constants, 2);
    ck_assert_str_eq(info.aoti_api, API_DEVICE);
    ck_assert_int_eq(fake_fn(so, "fake_aoti_creates")(), 1);
    check_beat_counts(e.leases[0], 2, 0, 0, 1);
    /* The library's 0.5 is added to x * w + b. */
    const float want[4] = {11.5f, 22.5f, 36.5f, 48.5f};
    run_and_check(c, want);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* A library built with its constants inside (a full blob): a buffer bound
 * by nothing keeps the library's copy. That copy is then not swapped out
 * and freed: upstream gives such a buffer of the inactive buffer a handle
 * on the active one's tensor, whose memory FreeInactiveConstantBuffer
 * would free (the fake refuses to run on it). */
START_TEST(embedded_copy_stays_for_a_kept_buffer)
{
    char so[512];
    make_case("v211emb",
              "elements 4\nembedded 1\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
              "const inv rotary.inv_freq 6 16 2\n",
              so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 2, so, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.unbound_constants, 1);
    ck_assert_uint_eq(info.embedded_bytes, 0);
    ck_assert_int_eq(fake_long(so, "fake_aoti_embedded_live_bytes"), 48);
    const float want[4] = {11.5f, 22.5f, 36.5f, 48.5f};
    run_and_check(c, want);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* With mmap'd weights the linked blob is only a header: its size is asked
 * with GetConstantsBlobSize, which upstream answers for such libraries
 * only. */
START_TEST(mmap_weights_blob_size_is_asked)
{
    const char *spec = "elements 4\nembedded 1\n%sconst w model.weight 6 16\n"
                       "const b model.bias 6 16\nconst inv rotary.inv_freq 6 8192 2\n";
    char so[512], text[300];
    env e;
    open_env(&e);
    wb_container *c = NULL;
    snprintf(text, sizeof text, spec, "");
    make_case("v211emb", text, so, sizeof so);
    const char *m = create_fails(&e, 2, so, NULL, &c);
    has(m, "buffer 'rotary.inv_freq'");
    has(m, "its embedded constants blob holds 4096 bytes for 8224 bytes of constants");
    wb_container_destroy(&c);
    snprintf(text, sizeof text, spec, "mmap 1\n");
    make_case("v211emb", text, so, sizeof so);
    int rc = wb_container_create(e.leases, 2, so, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    wb_container_info info;
    wb_container_get_info(c, &info);
    ck_assert_uint_eq(info.unbound_constants, 1);
    const float want[4] = {11.5f, 22.5f, 36.5f, 48.5f};
    run_and_check(c, want);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* Every missing constant is named, also past the length of an ordinary
 * message. */
START_TEST(every_missing_constant_is_named)
{
    char spec[4096], so[512], fqn[14][128];
    size_t used = (size_t)snprintf(spec, sizeof spec,
                                   "elements 4\nconst w model.weight 6 16\n"
                                   "const b model.bias 6 16\n");
    for (int i = 0; i < 14; i++) {
        snprintf(fqn[i], sizeof fqn[i],
                 "model.layers.%d.self_attention.rotary_embedding.non_persistent_buffer.inv_freq",
                 i);
        used += (size_t)snprintf(spec + used, sizeof spec - used, "const c%d %s 6 16 %d\n", i,
                                 fqn[i], 2 + i % 2);
    }
    make_case("v211", spec, so, sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    const char *m = create_fails(&e, 2, so, NULL, &c);
    ck_assert_uint_gt(strlen(m), 1100);
    has(m, "14 constants are bound by nothing");
    for (int i = 0; i < 14; i++) {
        char item[200];
        snprintf(item, sizeof item, "%s '%s'", i % 2 ? "tensor constant" : "buffer", fqn[i]);
        has(m, item);
    }
    has(m, "python3 -m weightbroker.compile");
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* own_constants binds nothing: a library without data of its own is
 * refused rather than run on constants nothing has set. */
START_TEST(own_constants_needs_library_data)
{
    char so[512];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    wb_container_options o;
    wb_container_options_init(&o);
    o.own_constants = 1;
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(NULL, 0, so, &o, &c), WB_ENOTFOUND);
    has(wb_container_errmsg(c), "own_constants, but the model library holds no data of its own "
                                "for 2 of its 2 constants ('model.weight', ...;");
    has(wb_container_errmsg(c), "package_constants_in_so=False");
    wb_container_destroy(&c);
    make_case("v211emb",
              "elements 4\nembedded 1\nconst w model.weight 6 16\nconst b model.bias 6 16\n", so,
              sizeof so);
    int rc = wb_container_create(NULL, 0, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    const float want[4] = {1, 1, 1.5f, 1.5f}; /* every constant 0.5 */
    run_and_check(c, want);
    wb_container_destroy(&c);
}
END_TEST

/* Missing constants whose names carry a wrapper's prefix: the error names
 * the rule that binds them all. */
START_TEST(prefix_hints_for_wrapped_names)
{
    static const struct {
        const char *wrap, *strip;
    } cases[] = {{"model.", "model."},
                 {"module.", "module."},
                 {"_orig_mod.", "_orig_mod."},
                 {"_orig_mod.module.", "_orig_mod.module."}};
    env e;
    open_env(&e);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char so[512], spec[300], want[200];
        snprintf(spec, sizeof spec,
                 "elements 4\nconst w %smodel.weight 6 16\nconst b %smodel.bias 6 16\n",
                 cases[k].wrap, cases[k].wrap);
        make_case(k % 2 ? "v214" : "v211", spec, so, sizeof so);
        wb_container *c = NULL;
        const char *m = create_fails(&e, 2, so, NULL, &c);
        snprintf(want, sizeof want,
                 "; all 2 missing constants bind with --strip-prefix %s (wb_container_options "
                 "strip_prefix \"%s\"): parameter '%smodel.weight', parameter '%smodel.bias'.",
                 cases[k].strip, cases[k].strip, cases[k].wrap, cases[k].wrap);
        has(m, want);
        /* The rule is the fix: no alias is suggested. */
        lacks(m, "alias");
        lacks(m, "Fixes");
        wb_container_destroy(&c);
        /* The rule named binds them. */
        wb_container_options o;
        wb_container_options_init(&o);
        o.strip_prefix = cases[k].strip;
        int rc = wb_container_create(e.leases, 2, so, &o, &c);
        ck_assert_msg(rc == WB_OK, "%s: create: %s", cases[k].wrap, wb_container_errmsg(c));
        run_and_check(c, WANT_BASIC);
        wb_container_destroy(&c);
    }

    /* The checkpoint has the prefix the model lacks. */
    char so[512];
    make_case("v211", "elements 4\nconst w weight 6 16\nconst b bias 6 16\n", so, sizeof so);
    wb_container *c = NULL;
    has(create_fails(&e, 2, so, NULL, &c),
        "; all 2 missing constants bind with --prefix model. (wb_container_options prefix "
        "\"model.\"): parameter 'weight', parameter 'bias'.");
    wb_container_destroy(&c);

    /* A rule that binds some: those it leaves come first. */
    make_case("v211",
              "elements 4\nconst w model.model.weight 6 16\nconst b model.model.bias 6 16\n"
              "const inv model.rotary.inv_freq 6 16 2\n",
              so, sizeof so);
    const char *m = create_fails(&e, 2, so, NULL, &c);
    has(m, "; with --strip-prefix model. 2 of the 3 missing constants bind (wb_container_options "
           "strip_prefix \"model.\"); the other 1: buffer 'model.rotary.inv_freq'; the 2 it "
           "binds: parameter 'model.model.weight', parameter 'model.model.bias'.");
    has(m, ". The model library holds no data of its own for the buffer or tensor constant "
           "among those (its embedded constants blob holds 0 bytes for 48 bytes of constants)");
    has(m, "python3 -m weightbroker.compile");
    wb_container_destroy(&c);

    /* Names no rule binds get no hint. */
    make_case("v211", "elements 4\nconst w enc.w 6 16\nconst b enc.b 6 16\n", so, sizeof so);
    m = create_fails(&e, 2, so, NULL, &c);
    lacks(m, "bind with");
    has(m, ": parameter 'enc.w', parameter 'enc.b'.");
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* A rule given the wrong way round: the hint is its inverse, in place of
 * the rules in use. */
START_TEST(prefix_hint_inverts_a_given_rule)
{
    char so[512];
    make_case("v211", "elements 4\nconst w weight 6 16\nconst b bias 6 16\n", so, sizeof so);
    env e;
    open_env(&e);
    wb_container_options o;
    wb_container_options_init(&o);
    o.strip_prefix = "model.";
    wb_container *c = NULL;
    has(create_fails(&e, 2, so, &o, &c),
        "; all 2 missing constants bind with --prefix model. (wb_container_options prefix "
        "\"model.\"), in place of the rules in use (--strip-prefix model.): parameter 'weight'");
    wb_container_destroy(&c);

    make_case("v211",
              "elements 4\nconst w model.model.weight 6 16\nconst b model.model.bias 6 16\n", so,
              sizeof so);
    wb_container_options_init(&o);
    o.prefix = "model.";
    has(create_fails(&e, 2, so, &o, &c),
        "; all 2 missing constants bind with --strip-prefix model. (wb_container_options "
        "strip_prefix \"model.\"), in place of the rules in use (--prefix model.)");
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* An alias may name either side in either namespace: the constant by its
 * model name or its checkpoint name, the target by its checkpoint name or
 * by the model name the prefix rules turn into one. A wrapped model with a
 * tied head: model.lm_head.weight is model.model.weight, whose checkpoint
 * name (after --strip-prefix model.) is model.weight. */
START_TEST(aliases_in_either_namespace)
{
    char so[512];
    make_case("v214",
              "elements 4\nconst w model.lm_head.weight 6 16\nconst b model.model.bias 6 16\n"
              "const e model.model.weight 6 16\n",
              so, sizeof so);
    const char *aliases[] = {"lm_head.weight=model.weight", "model.lm_head.weight=model.weight",
                             "model.lm_head.weight=model.model.weight",
                             "lm_head.weight=model.model.weight"};
    env e;
    open_env(&e);
    for (size_t k = 0; k < sizeof aliases / sizeof aliases[0]; k++) {
        wb_container_options o;
        wb_container_options_init(&o);
        o.strip_prefix = "model.";
        o.aliases = aliases[k];
        wb_container *c = NULL;
        int rc = wb_container_create(e.leases, 2, so, &o, &c);
        ck_assert_msg(rc == WB_OK, "%s: create: %s", aliases[k], wb_container_errmsg(c));
        wb_container_info info;
        wb_container_get_info(c, &info);
        ck_assert_uint_eq(info.aliased_constants, 1);
        ck_assert_uint_eq(info.leased_constants, 2);
        ck_assert_uint_eq(info.bound_bytes, 32); /* the tied tensor counted once */
        run_and_check(c, WANT_BASIC);
        wb_container_destroy(&c);
    }
    close_env(&e);
}
END_TEST

/* An alias that reads two ways is refused with the reason: a target that
 * is one checkpoint tensor by its name and another as a model name, or a
 * name that is the checkpoint name of two constants. */
START_TEST(ambiguous_alias_is_refused)
{
    char so[512];
    wb_client *client = connect_client();
    wb_lease *alt = NULL;
    ck_assert_int_eq(wb_lease_acquire(client, "alt", &alt), WB_OK);
    make_case("v211", "elements 4\nconst w lm_head.weight 6 16\nconst b model.bias 6 16\n", so,
              sizeof so);
    static const float bias[4] = {10, 20, 30, 40};
    static const uint64_t shape[1] = {4};
    wb_container_tensor t = {
        .fqn = "model.bias", .data = bias, .dtype = "F32", .ndim = 1, .shape = shape, .device = -1};
    wb_container_options o;
    wb_container_options_init(&o);
    o.tensors = &t;
    o.n_tensors = 1;
    o.strip_prefix = "model.";
    o.aliases = "lm_head.weight=model.weight";
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(&alt, 1, so, &o, &c), WB_EINVAL);
    has(wb_container_errmsg(c),
        "alias 'lm_head.weight=model.weight': the target 'model.weight' reads two ways: as a "
        "checkpoint name it is lease ");
    has(wb_container_errmsg(c), "(model 'alt', tensor 'model.weight'), and as a model name it "
                                "becomes 'weight' (prefix rules --strip-prefix model.), which is "
                                "lease ");
    has(wb_container_errmsg(c), "(model 'alt', tensor 'weight'); name the tensor you mean");
    wb_container_destroy(&c);
    ck_assert_uint_eq(wb_lease_containers(alt), 0);
    /* Names that read one way: the checkpoint tensor weight (w = 5), or
     * model.weight by the model name that becomes it. */
    o.aliases = "lm_head.weight=weight";
    int rc = wb_container_create(&alt, 1, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    const float want5[4] = {15, 25, 40, 50};
    run_and_check(c, want5);
    wb_container_destroy(&c);
    o.aliases = "lm_head.weight=model.model.weight";
    rc = wb_container_create(&alt, 1, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);

    /* Two constants with one checkpoint name, neither with that model
     * name. */
    make_case("v211", "elements 4\nconst w s.extra 6 16\nconst b extra 6 16\n", so, sizeof so);
    wb_container_options_init(&o);
    o.strip_prefix = "s.";
    o.prefix = "model.";
    o.aliases = "model.extra=model.weight";
    ck_assert_int_eq(wb_container_create(&alt, 1, so, &o, &c), WB_EINVAL);
    has(wb_container_errmsg(c),
        "alias 'model.extra=model.weight': 'model.extra' is the checkpoint name (after the "
        "prefix rules --strip-prefix s. --prefix model.) of constants 's.extra' and 'extra', and "
        "the model name of none: name the constant by its model name (FQN)");
    wb_container_destroy(&c);
    ck_assert_int_eq(wb_lease_release(&alt), WB_OK);
    wb_client_destroy(&client);
}
END_TEST

/* GetConstantDataSize is the storage's size, rounded up to 64 bytes unless
 * every constant is on CUDA: 16 bytes of data may report 64. */
START_TEST(storage_size_rounding_is_accepted)
{
    char so[512];
    make_case("v211", "elements 4\nconst w model.weight 6 64\nconst b model.bias 6 16\n", so,
              sizeof so);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 2, so, NULL, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);
    /* Beyond the rounding: a view into a larger storage, refused. */
    make_case("v211", "elements 4\nconst w model.weight 6 128\nconst b model.bias 6 16\n", so,
              sizeof so);
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "storage is 128 bytes"));
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* Constants may live on different devices: each tensor is wrapped with its
 * own device, none is forced onto the container's. */
START_TEST(each_tensor_keeps_its_device)
{
    char so[512];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    env e;
    open_env(&e);
    /* Host memory labelled as CUDA device 3: the fake reads it either way,
     * and says what it was given. */
    static const float bias[4] = {10, 20, 30, 40};
    static const uint64_t shape[1] = {4};
    wb_container_tensor t = {
        .fqn = "model.bias", .data = bias, .dtype = "F32", .ndim = 1, .shape = shape, .device = 3};
    wb_container_options o;
    wb_container_options_init(&o);
    o.device = "cpu";
    o.tensors = &t;
    o.n_tensors = 1;
    wb_container *c = NULL;
    int rc = wb_container_create(e.leases, 1, so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    int (*dev)(const char *) = (int (*)(const char *))(void *)fake_fn(so, "fake_aoti_bound_device");
    ck_assert_int_eq(dev("model.weight"), 0); /* CPU, from the host lease */
    ck_assert_int_eq(dev("model.bias"), 103); /* CUDA (type 1), device 3 */
    run_and_check(c, WANT_BASIC);
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

/* <library>.json beside the library: upstream runs such a model through an
 * OSSProxyExecutor, which libwbclient cannot build. */
START_TEST(proxy_executor_model_is_refused)
{
    char so[512], json[600];
    make_case("v211", SPEC_BASIC, so, sizeof so);
    snprintf(json, sizeof json, "%.*s.json", (int)(strlen(so) - 3), so);
    write_file(json, "{}", 2);
    env e;
    open_env(&e);
    wb_container *c = NULL;
    ck_assert_int_eq(wb_container_create(e.leases, 2, so, NULL, &c), WB_ENOSYS);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "proxy executor"));
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), json));
    wb_container_destroy(&c);
    close_env(&e);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("container");
    TCase *tc = tcase_create("fake_aoti");
    tcase_set_timeout(tc, 120);
    tcase_add_unchecked_fixture(tc, NULL, teardown_all);
    tcase_add_test(tc, v211_binds_by_fqn_across_leases);
    tcase_add_test(tc, v214_uses_external_constants_and_pinned_copy);
    tcase_add_test(tc, dtype_mismatch_names_the_tensor);
    tcase_add_test(tc, size_mismatch_names_the_tensor);
    tcase_add_test(tc, missing_constant_is_named);
    tcase_add_test(tc, caller_tensors_bind_and_override);
    tcase_add_test(tc, folded_constants_are_built_not_bound);
    tcase_add_test(tc, embedded_copy_is_replaced_and_freed);
    tcase_add_test(tc, pt2_package_is_unpacked_privately);
    tcase_add_test(tc, zip_slip_is_refused);
    tcase_add_test(tc, bad_model_paths);
    tcase_add_test(tc, run_argument_checks);
    tcase_add_test(tc, tied_weight_binds_through_alias);
    tcase_add_test(tc, two_constants_on_one_leased_tensor);
    tcase_add_test(tc, bad_alias_lists_are_refused);
    tcase_add_test(tc, prefix_rules_map_wrapped_names);
    tcase_add_test(tc, constants_file_supplies_buffers_and_aliases);
    tcase_add_test(tc, constants_file_inside_a_package);
    tcase_add_test(tc, unbound_constants_without_library_data_are_refused);
    tcase_add_test(tc, placeholder_blob_is_not_asked);
    tcase_add_test(tc, unbound_buffer_keeps_the_library_data);
    tcase_add_test(tc, embedded_copy_stays_for_a_kept_buffer);
    tcase_add_test(tc, mmap_weights_blob_size_is_asked);
    tcase_add_test(tc, every_missing_constant_is_named);
    tcase_add_test(tc, own_constants_needs_library_data);
    tcase_add_test(tc, prefix_hints_for_wrapped_names);
    tcase_add_test(tc, prefix_hint_inverts_a_given_rule);
    tcase_add_test(tc, aliases_in_either_namespace);
    tcase_add_test(tc, ambiguous_alias_is_refused);
    tcase_add_test(tc, storage_size_rounding_is_accepted);
    tcase_add_test(tc, proxy_executor_model_is_refused);
    tcase_add_test(tc, each_tensor_keeps_its_device);
    tcase_add_test(tc, acquire_reuses_the_held_table);
    tcase_add_test(tc, mutated_constant_is_refused_or_copied);
    tcase_add_test(tc, record_path_is_utf8);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    /* One process for all tests: they share one broker. */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    stop_broker();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
