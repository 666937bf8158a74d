/* wb_container_update against the FAKE AOTI library and the FAKE broker
 * (swap_fixture.h): a new version swapped in and counted, the old lease
 * unregistered and the new one registered; every refusal (a wrong dtype or
 * size, a missing constant, a model the container does not use, a library
 * without an inactive buffer, own_constants) leaves the container serving
 * the old version with the new lease unregistered; folded constants are
 * folded again in the inactive buffer; wb_container_follow follows the
 * broker's notices and owns its leases. */
#include "swap_fixture.h"

#include "client_impl.h"

#include <dlfcn.h>
#include <pthread.h>

static const char *SPEC = "elements 64\n"
                          "const w model.weight 6 256\n"
                          "const b model.bias 6 256\n";

typedef struct fix {
    swap_env e;
    wb_client *client;
    wb_lease *l1;
    wb_container *c;
} fix;

static void open_fix(fix *x, const char *flavour, const char *spec)
{
    swap_start(&x->e, flavour, spec, 10000);
    x->client = fake_connect(x->e.b.path, 0, 2000);
    ck_assert_int_eq(wb_lease_acquire(x->client, "demo", &x->l1), WB_OK);
    ck_assert_uint_eq(wb_lease_version(x->l1), 1);
    int rc = wb_container_create(&x->l1, 1, x->e.so, NULL, &x->c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(x->c));
}

static void close_fix(fix *x)
{
    wb_container_destroy(&x->c);
    if (x->l1)
        ck_assert_int_eq(wb_lease_release(&x->l1), WB_OK);
    wb_client_destroy(&x->client);
    swap_stop(&x->e);
}

/* The container still serves version 1, on l1 only. */
static void assert_unchanged(fix *x, wb_lease *refused)
{
    float out[SWAP_ELEMS];
    uint32_t v = 0;
    ck_assert_int_eq(swap_run(x->c, out, &v), WB_OK);
    ck_assert_uint_eq(v, 1);
    ck_assert(swap_is(out, 1));
    wb_container_info info;
    ck_assert_int_eq(wb_container_get_info(x->c, &info), WB_OK);
    ck_assert_uint_eq(info.swaps, 0);
    ck_assert_uint_eq(info.version, 1);
    ck_assert_uint_eq(wb_lease_containers(x->l1), 1);
    ck_assert_uint_eq(wb_lease_containers(refused), 0);
}

static void update_ok(const char *flavour)
{
    fix x;
    open_fix(&x, flavour, SPEC);
    float out[SWAP_ELEMS];
    uint32_t v = 0;
    ck_assert_int_eq(swap_run(x.c, out, &v), WB_OK);
    ck_assert(swap_is(out, 1));
    for (uint32_t want = 2; want <= 3; want++) {
        swap_publish(&x.e, want, 0);
        wb_lease *nl = NULL;
        ck_assert_int_eq(wb_lease_acquire(x.client, "demo", &nl), WB_OK);
        ck_assert_uint_eq(wb_lease_version(nl), want);
        int rc = wb_container_update(x.c, &nl, 1);
        ck_assert_msg(rc == WB_OK, "update: %s", wb_container_errmsg(x.c));
        ck_assert_str_eq(wb_container_errmsg(x.c), "");
        ck_assert_int_eq(swap_run(x.c, out, &v), WB_OK);
        ck_assert_uint_eq(v, want);
        ck_assert(swap_is(out, want));
        /* The old lease is let go, the new one held. */
        ck_assert_uint_eq(wb_lease_containers(x.l1), 0);
        ck_assert_uint_eq(wb_lease_containers(nl), 1);
        ck_assert_int_eq(wb_lease_release(&x.l1), WB_OK);
        ck_assert_int_eq(wb_lease_release(&nl), WB_EBUSY);
        x.l1 = nl;
        wb_container_info info;
        ck_assert_int_eq(wb_container_get_info(x.c, &info), WB_OK);
        ck_assert_uint_eq(info.swaps, want - 1);
        ck_assert_uint_eq(info.version, want);
        ck_assert(info.last_swap_ms > 0);
        ck_assert(info.last_swap_at > 0);
        /* Runs used it before the update returned; nothing was running. */
        ck_assert(info.last_swap_in_use_at > 0);
        ck_assert(info.last_swap_in_use_at <= info.last_swap_at);
        ck_assert(info.last_swap_run_wait_ms >= 0 && info.last_swap_run_wait_ms < 1000);
        ck_assert_uint_eq(info.leased_constants, 2);
        ck_assert_uint_eq(info.bound_bytes, 512);
    }
    /* The heartbeat's record moved to the new lease with the swaps. */
    ck_assert_int_eq(wb_client_heartbeat(x.client), WB_OK);
    ck_assert_uint_eq(atomic_load(&x.e.b.last_swaps), 2);
    ck_assert_int_gt(atomic_load(&x.e.b.last_swap_us), 0);
    ck_assert_uint_eq(atomic_load(&x.e.b.last_containers), 1);
    close_fix(&x);
}

START_TEST(test_update_v211)
{
    update_ok("v211");
}
END_TEST

START_TEST(test_update_v214)
{
    update_ok("v214");
}
END_TEST

/* A new version whose tensor `field` differs: refused, nothing changed. */
static void refused(void (*spoil)(fake_tensor *t), const char *model, int code, const char *msg)
{
    fix x;
    open_fix(&x, "v211", SPEC);
    swap_publish(&x.e, 2, 0);
    fake_tensor saved = x.e.b.tensors[0];
    if (spoil)
        spoil(&x.e.b.tensors[0]);
    wb_lease *nl = NULL;
    ck_assert_int_eq(wb_lease_acquire(x.client, model, &nl), WB_OK);
    x.e.b.tensors[0] = saved;
    int rc = wb_container_update(x.c, &nl, 1);
    ck_assert_int_eq(rc, code);
    char id[33];
    wb_lease_id_hex(nl, id);
    char want[1024];
    snprintf(want, sizeof want, msg, id);
    ck_assert_str_eq(wb_container_errmsg(x.c), want);
    assert_unchanged(&x, nl);
    ck_assert_int_eq(wb_lease_release(&nl), WB_OK);
    close_fix(&x);
}

static void wrong_dtype(fake_tensor *t)
{
    t->dtype = "I32";
}

static void wrong_size(fake_tensor *t)
{
    t->nbytes = 4 * (SWAP_ELEMS - 16);
    t->dim = SWAP_ELEMS - 16;
}

static void renamed(fake_tensor *t)
{
    t->name = "model.weights";
}

START_TEST(test_update_wrong_dtype)
{
    refused(wrong_dtype, "demo", WB_EINVAL,
            "constant 'model.weight': the model expects dtype F32 (code 6) but lease %.8s "
            "(model 'demo', tensor 'model.weight') has I32");
}
END_TEST

START_TEST(test_update_wrong_size)
{
    refused(wrong_size, "demo", WB_EINVAL,
            "constant 'model.weight': the model's storage is 256 bytes but lease %.8s (model "
            "'demo', tensor 'model.weight') has 192 bytes (a contiguous tensor of 192 bytes was "
            "expected; a view into a larger storage cannot be bound to a checkpoint tensor)");
}
END_TEST

START_TEST(test_update_missing_constant)
{
    fix x;
    open_fix(&x, "v211", SPEC);
    swap_publish(&x.e, 2, 0);
    fake_tensor saved = x.e.b.tensors[0];
    renamed(&x.e.b.tensors[0]);
    wb_lease *nl = NULL;
    ck_assert_int_eq(wb_lease_acquire(x.client, "demo", &nl), WB_OK);
    x.e.b.tensors[0] = saved;
    ck_assert_int_eq(wb_container_update(x.c, &nl, 1), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(x.c), "model.weight"));
    assert_unchanged(&x, nl);
    ck_assert_int_eq(wb_lease_release(&nl), WB_OK);
    close_fix(&x);
}
END_TEST

START_TEST(test_update_unknown_model)
{
    refused(NULL, "other", WB_EINVAL,
            "update: lease %.8s is of model 'other', which the container does not use (its "
            "leases are of 'demo')");
}
END_TEST

START_TEST(test_update_bad_args)
{
    fix x;
    open_fix(&x, "v211", SPEC);
    ck_assert_int_eq(wb_container_update(NULL, NULL, 0), WB_EINVAL);
    ck_assert_int_eq(wb_container_update(x.c, NULL, 1), WB_EINVAL);
    ck_assert_str_eq(wb_container_errmsg(x.c), "update: no leases given");
    ck_assert_int_eq(wb_container_update(x.c, &x.l1, 1), WB_EINVAL);
    char id[33], want[200];
    wb_lease_id_hex(x.l1, id);
    snprintf(want, sizeof want, "update: lease %.8s (model 'demo') is already the container's", id);
    ck_assert_str_eq(wb_container_errmsg(x.c), want);
    swap_publish(&x.e, 2, 0);
    wb_lease *two[2] = {NULL, NULL};
    ck_assert_int_eq(wb_lease_acquire(x.client, "demo", &two[0]), WB_OK);
    ck_assert_int_eq(wb_lease_acquire(x.client, "demo", &two[1]), WB_OK);
    ck_assert_int_eq(wb_container_update(x.c, two, 2), WB_EINVAL);
    ck_assert_str_eq(wb_container_errmsg(x.c), "update: two leases of model 'demo' given");
    assert_unchanged(&x, two[0]);
    ck_assert_int_eq(wb_lease_release(&two[0]), WB_OK);
    ck_assert_int_eq(wb_lease_release(&two[1]), WB_OK);
    close_fix(&x);
}
END_TEST

/* A library without an inactive buffer to swap. */
START_TEST(test_update_enosys)
{
    fix x;
    open_fix(&x, "v211noswap", SPEC);
    swap_publish(&x.e, 2, 0);
    wb_lease *nl = NULL;
    ck_assert_int_eq(wb_lease_acquire(x.client, "demo", &nl), WB_OK);
    ck_assert_int_eq(wb_container_update(x.c, &nl, 1), WB_ENOSYS);
    char want[1024];
    snprintf(want, sizeof want,
             "update: model library %s does not export "
             "AOTInductorModelContainerSwapConstantBuffer: there is no inactive constant buffer to "
             "bind a new version into; the container keeps the version it has",
             x.e.so);
    ck_assert_str_eq(wb_container_errmsg(x.c), want);
    assert_unchanged(&x, nl);
    ck_assert_int_eq(wb_lease_release(&nl), WB_OK);
    close_fix(&x);
}
END_TEST

START_TEST(test_update_own_constants)
{
    swap_env e;
    swap_start(&e, "v211emb",
               "elements 64\nembedded 1\nconst w model.weight 6 256\n"
               "const b model.bias 6 256\n",
               10000);
    wb_client *client = fake_connect(e.b.path, 0, 2000);
    wb_lease *l1 = NULL, *nl = NULL;
    ck_assert_int_eq(wb_lease_acquire(client, "demo", &l1), WB_OK);
    wb_container_options o;
    wb_container_options_init(&o);
    o.own_constants = 1;
    wb_container *c = NULL;
    int rc = wb_container_create(&l1, 1, e.so, &o, &c);
    ck_assert_msg(rc == WB_OK, "create: %s", wb_container_errmsg(c));
    swap_publish(&e, 2, 0);
    ck_assert_int_eq(wb_lease_acquire(client, "demo", &nl), WB_OK);
    ck_assert_int_eq(wb_container_update(c, &nl, 1), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(wb_container_errmsg(c), "own_constants"));
    ck_assert_uint_eq(wb_lease_containers(nl), 0);
    ck_assert_int_eq(wb_lease_release(&nl), WB_OK);
    wb_container_destroy(&c);
    ck_assert_int_eq(wb_lease_release(&l1), WB_OK);
    wb_client_destroy(&client);
    swap_stop(&e);
}
END_TEST

/* Folded constants are folded again in the inactive buffer before the
 * swap: the first run after it folds nothing more. */
START_TEST(test_update_folded)
{
    fix x;
    open_fix(&x, "v211",
             "elements 64\nconst w model.weight 6 256\nconst b model.bias 6 256\n"
             "folded f 256\n");
    void *lib = dlopen(x.e.so, RTLD_NOW | RTLD_NOLOAD);
    ck_assert_ptr_nonnull(lib);
    int (*fold_calls)(void) = (int (*)(void))dlsym(lib, "fake_aoti_fold_calls");
    ck_assert_ptr_nonnull(fold_calls);
    float out[SWAP_ELEMS];
    uint32_t v;
    ck_assert_int_eq(swap_run(x.c, out, &v), WB_OK);
    ck_assert(swap_is(out, 1));
    int before = fold_calls();
    swap_publish(&x.e, 2, 0);
    wb_lease *nl = NULL;
    ck_assert_int_eq(wb_lease_acquire(x.client, "demo", &nl), WB_OK);
    ck_assert_int_eq(wb_container_update(x.c, &nl, 1), WB_OK);
    ck_assert_int_eq(fold_calls(), before + 1);
    ck_assert_int_eq(swap_run(x.c, out, &v), WB_OK);
    ck_assert_int_eq(fold_calls(), before + 1);
    ck_assert_uint_eq(v, 2);
    ck_assert(swap_is(out, 2));
    ck_assert_int_eq(wb_lease_release(&x.l1), WB_OK);
    x.l1 = NULL;
    wb_container_destroy(&x.c);
    ck_assert_int_eq(wb_lease_release(&nl), WB_OK);
    dlclose(lib);
    close_fix(&x);
}
END_TEST

/* wb_container_follow: the broker's notice leads to the new version, the
 * old lease released by the follower, the container owning what it holds
 * (destroy releases it), a failed acquire counted. */
START_TEST(test_follow)
{
    fix x;
    open_fix(&x, "v211", SPEC);
    ck_assert_int_eq(wb_container_follow(x.c, x.client), WB_OK);
    ck_assert_int_eq(wb_container_follow(x.c, x.client), WB_EBUSY);
    x.l1 = NULL; /* the container's now */
    for (uint32_t want = 2; want <= 4; want++) {
        swap_publish(&x.e, want, 1);
        int64_t give_up = test_now_ms() + 10000;
        float out[SWAP_ELEMS];
        uint32_t v = 0;
        do {
            ck_assert_msg(test_now_ms() < give_up, "version %u was not swapped in", want);
            test_sleep_ms(1);
            ck_assert_int_eq(swap_run(x.c, out, &v), WB_OK);
        } while (v != want);
        ck_assert(swap_is(out, want));
    }
    wb_container_info info;
    ck_assert_int_eq(wb_container_get_info(x.c, &info), WB_OK);
    ck_assert_uint_eq(info.swaps, 3);
    ck_assert_uint_eq(info.follow_errors, 0);
    /* Each replaced lease was released: only the current one is left (the
     * follower releases the old one after the swap the run saw). */
    int64_t released_by = test_now_ms() + 10000;
    while (atomic_load(&x.e.b.n_release) < 3 && test_now_ms() < released_by)
        test_sleep_ms(1);
    ck_assert_int_eq(atomic_load(&x.e.b.n_release), 3);
    /* A version that lacks a constant: the update fails, counted, and the
     * container keeps version 4. */
    fake_tensor saved = x.e.b.tensors[0];
    renamed(&x.e.b.tensors[0]);
    swap_publish(&x.e, 5, 1);
    int64_t give_up = test_now_ms() + 10000;
    do {
        ck_assert_msg(test_now_ms() < give_up, "the failure was not counted");
        test_sleep_ms(5);
        ck_assert_int_eq(wb_container_get_info(x.c, &info), WB_OK);
    } while (info.follow_errors == 0);
    x.e.b.tensors[0] = saved;
    ck_assert_uint_eq(info.version, 4);
    ck_assert_uint_eq(info.follow_errors, 1);
    /* The refused lease was released. */
    ck_assert_int_eq(atomic_load(&x.e.b.n_release), 4);
    wb_container_destroy(&x.c);
    ck_assert_int_eq(atomic_load(&x.e.b.n_release), 5);
    close_fix(&x);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("container_update");
    TCase *tc = tcase_create("update");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_update_v211);
    tcase_add_test(tc, test_update_v214);
    tcase_add_test(tc, test_update_wrong_dtype);
    tcase_add_test(tc, test_update_wrong_size);
    tcase_add_test(tc, test_update_missing_constant);
    tcase_add_test(tc, test_update_unknown_model);
    tcase_add_test(tc, test_update_bad_args);
    tcase_add_test(tc, test_update_enosys);
    tcase_add_test(tc, test_update_own_constants);
    tcase_add_test(tc, test_update_folded);
    tcase_add_test(tc, test_follow);
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
