/* Publishing (wb/publish.h) against the FAKE broker of fake_broker.h: the
 * table sent at begin, host bytes copied into a sealed memfd that the
 * descriptor channel receives, where each tensor is at commit, the checks
 * of names and sizes with their messages, refusals of begin and commit,
 * aborts, the publisher freed on every path, a child after fork(), the
 * out-of-memory loop, and a lease whose checksums are pending. */
#include "wb/publish.h"

#include "client_impl.h"
#include "fake_broker.h"
#include "oom.h"

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const uint64_t shape_a[1] = {4};
static const uint64_t shape_b[2] = {5, 1};
/* "a": F32 [4] (16 bytes), "b": U8 [5, 1] (5 bytes), "c": I64 scalar. */
static const wb_publish_desc table[3] = {
    {"a", "F32", 1, shape_a},
    {"b", "U8", 2, shape_b},
    {"c", "I64", 0, NULL},
};

typedef struct data {
    float a[4];
    uint8_t b[5];
    int64_t c;
} data;

static void fill(data *d)
{
    for (int i = 0; i < 4; i++)
        d->a[i] = 1.5f * (float)i;
    for (int i = 0; i < 5; i++)
        d->b[i] = (uint8_t)(0xa0 + i);
    d->c = -42;
}

static void opts_all(wb_publish_options *o)
{
    wb_publish_options_init(o);
    o->tensors = table;
    o->n_tensors = 3;
}

static fake_env env;

static wb_client *start(int channel)
{
    fake_env_start(&env, 10000);
    if (channel)
        fake_broker_channel(&env.b);
    return fake_connect(env.b.path, 1, 2000);
}

static void stop(wb_client **c)
{
    wb_client_destroy(c);
    fake_env_stop(&env);
}

/* A publish of the whole table of "demo", begun. */
static wb_publisher *begun(wb_client *c)
{
    wb_publish_options o;
    opts_all(&o);
    wb_publisher *p = NULL;
    ck_assert_int_eq(wb_publish_begin(c, "demo", &o, &p), WB_OK);
    return p;
}

static int give_all(wb_publisher *p, const data *d)
{
    int rc = wb_publish_tensor(p, "a", d->a, sizeof d->a);
    if (rc == WB_OK)
        rc = wb_publish_tensor(p, "b", d->b, sizeof d->b);
    if (rc == WB_OK)
        rc = wb_publish_tensor(p, "c", &d->c, sizeof d->c);
    return rc;
}

START_TEST(test_publish_host)
{
    wb_client *c = start(1);
    wb_publish_options o;
    opts_all(&o);
    o.placement = "spread";
    wb_publisher *p = NULL;
    int rc = wb_publish_begin(c, "demo", &o, &p);
    ck_assert_msg(rc == WB_OK, "%s", wb_client_errmsg(c));
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(wb_publish_version(p), 7);
    ck_assert_uint_eq(wb_publish_reserved_bytes(p), 16 + 5 + 8);
    ck_assert_str_eq(wb_publish_errmsg(p), "");
    /* The table as sent: names, dtypes, shapes and the bytes they make. */
    fake_pub *fp = &env.b.pub;
    ck_assert_int_eq(atomic_load(&fp->n_begin), 1);
    ck_assert_str_eq(fp->model, "demo");
    ck_assert_str_eq(fp->placement, "spread");
    ck_assert_int_eq(fp->partial, 0);
    ck_assert_uint_eq(fp->n, 3);
    ck_assert_str_eq(fp->t[1].name, "b");
    ck_assert_str_eq(fp->t[1].dtype, "U8");
    ck_assert_uint_eq(fp->t[1].ndim, 2);
    ck_assert_uint_eq(fp->t[1].shape[0], 5);
    ck_assert_uint_eq(fp->t[1].shape[1], 1);
    ck_assert_uint_eq(fp->t[0].nbytes, 16);
    ck_assert_uint_eq(fp->t[1].nbytes, 5);
    ck_assert_uint_eq(fp->t[2].ndim, 0);
    ck_assert_uint_eq(fp->t[2].nbytes, 8);

    data d, want;
    fill(&d);
    fill(&want);
    ck_assert_int_eq(give_all(p, &d), WB_OK);
    /* Host bytes were copied: the caller's memory may change at once. */
    memset(&d, 0x5a, sizeof d);
    wb_publish_info info;
    rc = wb_publish_commit_ex(&p, &info);
    ck_assert_msg(rc == WB_OK, "%s", wb_client_errmsg(c));
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(info.version, 7);
    ck_assert_uint_eq(info.previous_version, 6);
    ck_assert(info.current_at == 1700000000.5);
    ck_assert(info.copy_seconds == 0.25);
    ck_assert_uint_eq(info.copied_bytes, 29);
    ck_assert_uint_eq(info.kept_bytes, 0);

    /* One memfd, sealed, named by the publish id; one host source. */
    ck_assert_int_eq(atomic_load(&fp->n_fds), 1);
    ck_assert_int_eq(fp->fd_id_ok, 1);
    int want_seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
    ck_assert_int_eq(fp->seals & want_seals, want_seals);
    ck_assert_uint_eq(fp->n_sources, 1);
    ck_assert_int_eq(fp->host_fd, 0);
    ck_assert_int_eq(fp->cuda_sources, 0);
    ck_assert_uint_eq(fp->host_size, 2 * 256 + 8);
    ck_assert_uint_eq(fp->t[0].offset, 0);
    ck_assert_uint_eq(fp->t[1].offset, 256);
    ck_assert_uint_eq(fp->t[2].offset, 512);
    ck_assert_int_eq(fp->t[0].got && fp->t[1].got && fp->t[2].got, 1);
    ck_assert_mem_eq(fp->t[0].bytes, want.a, sizeof want.a);
    ck_assert_mem_eq(fp->t[1].bytes, want.b, sizeof want.b);
    ck_assert_mem_eq(fp->t[2].bytes, &want.c, sizeof want.c);
    ck_assert_int_eq(atomic_load(&fp->n_commit), 1);
    ck_assert_int_eq(atomic_load(&fp->n_abort), 0);
    ck_assert_int_eq(fp->open, 0);
    stop(&c);
}
END_TEST

/* A partial publish names only some tensors; the commit's version comes
 * back through wb_publish_commit. */
START_TEST(test_publish_partial)
{
    wb_client *c = start(1);
    wb_publish_options o;
    wb_publish_options_init(&o);
    o.tensors = &table[1];
    o.n_tensors = 1;
    o.partial = 1;
    wb_publisher *p = NULL;
    ck_assert_int_eq(wb_publish_begin(c, "demo", &o, &p), WB_OK);
    ck_assert_int_eq(env.b.pub.partial, 1);
    ck_assert_uint_eq(env.b.pub.n, 1);
    uint8_t b[5] = {1, 2, 3, 4, 5};
    ck_assert_int_eq(wb_publish_tensor(p, "b", b, 5), WB_OK);
    uint32_t v = 0;
    ck_assert_int_eq(wb_publish_commit(&p, &v), WB_OK);
    ck_assert_uint_eq(v, 7);
    ck_assert_ptr_null(p);
    ck_assert_mem_eq(env.b.pub.t[0].bytes, b, 5);
    stop(&c);
}
END_TEST

START_TEST(test_tensor_checks)
{
    wb_client *c = start(1);
    wb_publisher *p = begun(c);
    data d;
    fill(&d);
    ck_assert_int_eq(wb_publish_tensor(p, "zz", d.a, 16), WB_ENOTFOUND);
    ck_assert_str_eq(wb_publish_errmsg(p), "publish 'demo': tensor 'zz' is not in the table");
    ck_assert_str_eq(wb_client_errmsg(c), "publish 'demo': tensor 'zz' is not in the table");
    ck_assert_int_eq(wb_publish_tensor(p, "a", d.a, 15), WB_EINVAL);
    ck_assert_str_eq(wb_publish_errmsg(p),
                     "publish 'demo': tensor 'a' has 15 bytes, the table's F32 tensor needs 16");
    ck_assert_int_eq(wb_publish_tensor(p, "c", &d.c, 4), WB_EINVAL);
    ck_assert_str_eq(wb_publish_errmsg(p),
                     "publish 'demo': tensor 'c' has 4 bytes, the table's I64 scalar needs 8");
    ck_assert_int_eq(wb_publish_tensor(p, "a", NULL, 16), WB_EINVAL);
    ck_assert_str_eq(wb_publish_errmsg(p), "publish 'demo': tensor 'a' has no data");
    ck_assert_int_eq(wb_publish_tensor(p, NULL, d.a, 16), WB_EINVAL);
    ck_assert_int_eq(wb_publish_tensor(NULL, "a", d.a, 16), WB_EINVAL);
    /* Refused calls changed nothing: the tensor can still be given, once. */
    ck_assert_int_eq(wb_publish_tensor(p, "a", d.a, 16), WB_OK);
    ck_assert_int_eq(wb_publish_tensor(p, "a", d.a, 16), WB_EINVAL);
    ck_assert_str_eq(wb_publish_errmsg(p), "publish 'demo': tensor 'a' was given already");
    wb_publish_abort(&p);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(atomic_load(&env.b.pub.n_abort), 1);
    ck_assert_int_eq(env.b.pub.open, 0);
    wb_publish_abort(&p); /* NULL: nothing */
    wb_publish_abort(NULL);
    ck_assert_int_eq(atomic_load(&env.b.pub.n_abort), 1);
    ck_assert_str_eq(wb_publish_errmsg(NULL), "");
    stop(&c);
}
END_TEST

/* A commit with a tensor missing is refused here, and aborted. */
START_TEST(test_commit_missing)
{
    wb_client *c = start(1);
    wb_publisher *p = begun(c);
    data d;
    fill(&d);
    ck_assert_int_eq(wb_publish_tensor(p, "a", d.a, 16), WB_OK);
    ck_assert_int_eq(wb_publish_tensor(p, "c", &d.c, 8), WB_OK);
    uint32_t v = 99;
    ck_assert_int_eq(wb_publish_commit(&p, &v), WB_EINVAL);
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(v, 0);
    ck_assert_str_eq(wb_client_errmsg(c),
                     "publish 'demo': tensor 'b' was not given (2 of 3 were); the publish is "
                     "aborted");
    ck_assert_int_eq(atomic_load(&env.b.pub.n_commit), 0);
    ck_assert_int_eq(atomic_load(&env.b.pub.n_abort), 1);
    ck_assert_int_eq(atomic_load(&env.b.pub.n_fds), 0);
    ck_assert_int_eq(wb_publish_commit(&p, &v), WB_EINVAL); /* NULL */
    ck_assert_int_eq(wb_publish_commit(NULL, &v), WB_EINVAL);
    stop(&c);
}
END_TEST

static int begin_fails(wb_client *c, const wb_publish_desc *t, size_t n, const char *msg)
{
    wb_publish_options o;
    wb_publish_options_init(&o);
    o.tensors = t;
    o.n_tensors = n;
    wb_publisher *p = (wb_publisher *)&o; /* set to NULL on failure */
    int rc = wb_publish_begin(c, "demo", &o, &p);
    ck_assert_ptr_null(p);
    ck_assert_str_eq(wb_client_errmsg(c), msg);
    return rc;
}

START_TEST(test_begin_checks)
{
    wb_client *c = start(0);
    static const uint64_t three[1] = {3}, huge[2] = {UINT64_MAX / 4, 3},
                          wide[2] = {UINT64_MAX / 2, 4};
    wb_publish_desc bad_dtype[1] = {{"w", "Q7", 1, three}};
    ck_assert_int_eq(
        begin_fails(c, bad_dtype, 1,
                    "publish 'demo': tensor 'w' has dtype 'Q7', not one safetensors names (F32, "
                    "BF16, I64, ...)"),
        WB_EINVAL);
    wb_publish_desc twice[2] = {{"w", "F32", 1, three}, {"w", "F16", 1, three}};
    ck_assert_int_eq(
        begin_fails(c, twice, 2, "publish 'demo': tensor 'w' is named twice in the table"),
        WB_EINVAL);
    wb_publish_desc half[1] = {{"w", "F4", 1, three}};
    ck_assert_int_eq(
        begin_fails(c, half, 1,
                    "publish 'demo': tensor 'w': 3 elements of F4 (4 bits) are not whole bytes"),
        WB_EINVAL);
    wb_publish_desc big[1] = {{"w", "F32", 2, huge}};
    ck_assert_int_eq(begin_fails(c, big, 1, "publish 'demo': tensor 'w': its size overflows"),
                     WB_EINVAL);
    wb_publish_desc wider[1] = {{"w", "F32", 2, wide}};
    ck_assert_int_eq(
        begin_fails(c, wider, 1, "publish 'demo': tensor 'w': its shape's product overflows"),
        WB_EINVAL);
    wb_publish_desc noshape[1] = {{"w", "F32", 2, NULL}};
    ck_assert_int_eq(
        begin_fails(c, noshape, 1, "publish 'demo': tensor 'w' has 2 dimensions and no shape"),
        WB_EINVAL);
    wb_publish_desc noname[1] = {{"", "F32", 1, three}};
    ck_assert_int_eq(begin_fails(c, noname, 1, "publish 'demo': tensor 0 of the table has no name"),
                     WB_EINVAL);
    ck_assert_int_eq(begin_fails(c, NULL, 0, "publish 'demo': the table has no tensors"),
                     WB_EINVAL);
    wb_publisher *p = NULL;
    wb_publish_options o;
    opts_all(&o);
    ck_assert_int_eq(wb_publish_begin(NULL, "demo", &o, &p), WB_EINVAL);
    ck_assert_int_eq(wb_publish_begin(c, "", &o, &p), WB_EINVAL);
    ck_assert_str_eq(wb_client_errmsg(c), "publish: no model name, or one over 255 bytes");
    ck_assert_int_eq(wb_publish_begin(c, "demo", NULL, &p), WB_EINVAL);
    ck_assert_ptr_null(p);
    /* Nothing of it reached the broker. */
    ck_assert_int_eq(atomic_load(&env.b.pub.n_begin), 0);
    stop(&c);
}
END_TEST

START_TEST(test_begin_refused)
{
    wb_client *c = start(0);
    wb_publish_options o;
    opts_all(&o);
    wb_publisher *p = NULL;
    atomic_store(&env.b.pub.begin_status, WB_EPERM);
    ck_assert_int_eq(wb_publish_begin(c, "demo", &o, &p), WB_EPERM);
    ck_assert_ptr_null(p);
    ck_assert_str_eq(wb_client_errmsg(c), "publish 'demo': fake refusal");
    /* As a broker without publishing answers. */
    atomic_store(&env.b.pub.begin_status, FAKE_PUB_UNKNOWN);
    ck_assert_int_eq(wb_publish_begin(c, "demo", &o, &p), WB_EPROTO);
    ck_assert_ptr_null(p);
    ck_assert_str_eq(wb_client_errmsg(c),
                     "publish 'demo': the broker does not know publishing (it answered: request "
                     "has no body)");
    /* One publish at a time per model. */
    atomic_store(&env.b.pub.begin_status, 0);
    ck_assert_int_eq(wb_publish_begin(c, "demo", &o, &p), WB_OK);
    wb_publisher *q = NULL;
    ck_assert_int_eq(wb_publish_begin(c, "demo", &o, &q), WB_EBUSY);
    ck_assert_ptr_null(q);
    ck_assert_str_eq(wb_client_errmsg(c), "publish 'demo': a publish of this model is open");
    wb_publish_abort(&p);
    ck_assert_int_eq(atomic_load(&env.b.pub.n_abort), 1);
    stop(&c);
}
END_TEST

/* A refused commit: the publish is aborted after it, the publisher freed. */
START_TEST(test_commit_refused)
{
    wb_client *c = start(1);
    wb_publisher *p = begun(c);
    data d;
    fill(&d);
    ck_assert_int_eq(give_all(p, &d), WB_OK);
    atomic_store(&env.b.pub.commit_status, WB_ELIMIT);
    wb_publish_info info;
    memset(&info, 0xff, sizeof info);
    ck_assert_int_eq(wb_publish_commit_ex(&p, &info), WB_ELIMIT);
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(info.version, 0);
    ck_assert_uint_eq(info.copied_bytes, 0);
    ck_assert_str_eq(wb_client_errmsg(c), "publish 'demo': fake refusal");
    ck_assert_int_eq(atomic_load(&env.b.pub.n_commit), 1);
    ck_assert_int_eq(atomic_load(&env.b.pub.n_abort), 1);
    ck_assert_int_eq(env.b.pub.open, 0);
    stop(&c);
}
END_TEST

/* No descriptor channel: the host bytes cannot be sent; aborted. */
START_TEST(test_commit_no_channel)
{
    wb_client *c = start(0);
    wb_publisher *p = begun(c);
    data d;
    fill(&d);
    ck_assert_int_eq(give_all(p, &d), WB_OK);
    ck_assert_int_eq(wb_publish_commit(&p, NULL), WB_ECONN);
    ck_assert_ptr_null(p);
    char want[400];
    snprintf(want, sizeof want,
             "publish 'demo': sending the host bytes: cannot connect to the descriptor channel "
             "%s.fd: No such file or directory",
             env.b.path);
    ck_assert_str_eq(wb_client_errmsg(c), want);
    ck_assert_int_eq(atomic_load(&env.b.pub.n_commit), 0);
    ck_assert_int_eq(atomic_load(&env.b.pub.n_abort), 1);
    stop(&c);
}
END_TEST

/* A child after fork() cannot use its parent's publisher. */
START_TEST(test_fork_child)
{
    wb_client *c = start(1);
    wb_publisher *p = begun(c);
    data d;
    fill(&d);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int rc = wb_publish_tensor(p, "a", d.a, 16);
        char want[160];
        snprintf(want, sizeof want,
                 "publish 'demo': begun by process %d; a child after fork() cannot use it",
                 (int)getppid());
        _exit(rc == WB_ESTATE && strcmp(wb_publish_errmsg(p), want) == 0 ? 0 : 1);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_int_eq(WIFEXITED(status) && WEXITSTATUS(status) == 0, 1);
    /* The parent's publisher is as it was. */
    ck_assert_int_eq(give_all(p, &d), WB_OK);
    ck_assert_int_eq(wb_publish_commit(&p, NULL), WB_OK);
    stop(&c);
}
END_TEST

START_TEST(test_checksums_pending)
{
    wb_client *c = start(0);
    atomic_store(&env.b.checksums_pending, 1);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_lease_checksums_pending(l), 1);
    size_t bad = 77;
    ck_assert_int_eq(wb_lease_verify(l, &bad), WB_ESTATE);
    ck_assert_uint_eq(bad, 77);
    char want[300];
    char hex[33];
    wb_lease_id_hex(l, hex);
    snprintf(want, sizeof want,
             "verify lease %.8s: the checksums of this published version of 'demo' are still "
             "being computed by the broker; a later acquire gets them",
             hex);
    ck_assert_str_eq(wb_client_errmsg(c), want);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    atomic_store(&env.b.checksums_pending, 0);
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_lease_checksums_pending(l), 0);
    ck_assert_int_eq(wb_lease_verify(l, NULL), WB_OK);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    ck_assert_int_eq(wb_lease_checksums_pending(NULL), 0);
    stop(&c);
}
END_TEST

/* The out-of-memory loop over a whole publish. */
typedef struct oom_ctx {
    wb_client *c;
    data d;
    uint32_t version;
} oom_ctx;

static void oom_setup(void *arg)
{
    (void)arg;
    fake_publish_reset(&env.b);
}

static int oom_publish(void *arg)
{
    oom_ctx *x = arg;
    wb_publish_options o;
    opts_all(&o);
    wb_publisher *p = NULL;
    int rc = wb_publish_begin(x->c, "demo", &o, &p);
    if (rc != WB_OK)
        return rc;
    rc = give_all(p, &x->d);
    if (rc != WB_OK) {
        wb_publish_abort(&p);
        return rc;
    }
    return wb_publish_commit(&p, &x->version);
}

static void oom_failed(void *arg, int rc)
{
    oom_ctx *x = arg;
    ck_assert_msg(rc == WB_ENOMEM, "rc %d: %s", rc, wb_client_errmsg(x->c));
}

static void oom_done(void *arg)
{
    oom_ctx *x = arg;
    ck_assert_uint_eq(x->version, 7);
    ck_assert_mem_eq(env.b.pub.t[0].bytes, x->d.a, sizeof x->d.a);
}

START_TEST(test_oom_publish)
{
    oom_ctx x;
    memset(&x, 0, sizeof x);
    x.c = start(1);
    fill(&x.d);
    oom_op op = {.name = "publish",
                 .ctx = &x,
                 .flags = WB_ALLOC_THIS_THREAD,
                 .setup = oom_setup,
                 .run = oom_publish,
                 .failed = oom_failed,
                 .done = oom_done};
    oom_result res = oom_run(&op);
    ck_assert_int_gt(res.points, 10);
    stop(&x.c);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("publish");
    TCase *tc = tcase_create("publish");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_publish_host);
    tcase_add_test(tc, test_publish_partial);
    tcase_add_test(tc, test_tensor_checks);
    tcase_add_test(tc, test_commit_missing);
    tcase_add_test(tc, test_begin_checks);
    tcase_add_test(tc, test_begin_refused);
    tcase_add_test(tc, test_commit_refused);
    tcase_add_test(tc, test_commit_no_channel);
    tcase_add_test(tc, test_fork_child);
    tcase_add_test(tc, test_checksums_pending);
    tcase_add_test(tc, test_oom_publish);
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
