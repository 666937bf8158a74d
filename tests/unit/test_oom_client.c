/* Out of memory in the client (oom.h): connect, two acquires of a model
 * (the second names the table the client holds), lookups and releases, and
 * the client's end, against the FAKE broker of fake_broker.h, with each of
 * the calling thread's allocations failing in turn (the fake's thread
 * allocates freely). A call that fails says WB_ENOMEM and hands out no
 * lease; what it did get is whole. The table is asked for in each form the
 * broker sends it in: tensor messages, a second frame, shared memory. */
#include "wb/client.h"

#include "alloc.h"
#include "fake_broker.h"
#include "oom.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct client_case {
    fake_env f;
    wb_client *client;
    wb_lease *lease[2];
    int step;    /* how far the last run went: 1 connected, 2 and 3 acquired, 4 released */
    int lost[2]; /* grants no release followed, with one allocation failing, with all after */
} client_case;

/* Tensor views of a lease: fake_env's two tensors with their bytes. */
static void check_lease(const wb_lease *l)
{
    ck_assert_ptr_nonnull(l);
    ck_assert_str_eq(wb_lease_model(l), "demo");
    ck_assert_uint_eq(wb_lease_tensor_count(l), 2);
    wb_tensor_view v;
    ck_assert_int_eq(wb_lease_find(l, "b", &v), WB_OK);
    ck_assert_str_eq(v.dtype, "U8");
    ck_assert_uint_eq(v.ndim, 1);
    ck_assert_uint_eq(v.shape[0], 25);
    ck_assert_uint_eq(v.nbytes, 100);
    const uint8_t *p = v.data;
    for (unsigned i = 0; i < 100; i++)
        ck_assert_uint_eq(p[i], (uint8_t)(7 * (256 + i) + 1));
    ck_assert_int_eq(wb_lease_find(l, "a", &v), WB_OK);
    ck_assert_uint_eq(v.nbytes, 64);
    ck_assert_int_eq(wb_lease_find(l, "c", &v), WB_ENOTFOUND);
}

static int run_client(void *arg)
{
    client_case *c = arg;
    c->step = 0;
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = c->f.b.path;
    o.no_heartbeat_thread = 1;
    o.timeout_ms = 5000;
    int rc = wb_client_connect(&o, &c->client);
    if (rc != WB_OK)
        return rc;
    c->step = 1;
    for (int i = 0; i < 2; i++) {
        if ((rc = wb_lease_acquire(c->client, "demo", &c->lease[i])) != WB_OK)
            return rc;
        c->step = 2 + i;
        wb_tensor_view v;
        if ((rc = wb_lease_find(c->lease[i], "b", &v)) != WB_OK)
            return rc;
    }
    /* A release that cannot tell the broker still ends the lease here. */
    rc = wb_lease_release(&c->lease[0]);
    ck_assert_ptr_null(c->lease[0]);
    if (rc != WB_OK)
        return rc;
    c->step = 4;
    return WB_OK;
}

/* After the run (hook off): the client's end. */
static void end_client(client_case *c)
{
    for (int i = 0; i < 2; i++) {
        if (c->lease[i])
            ck_assert_int_eq(wb_lease_release(&c->lease[i]), WB_OK);
    }
    wb_client_destroy(&c->client);
    ck_assert_ptr_null(c->client);
}

static void failed_client(void *arg, int rc)
{
    client_case *c = arg;
    int step = c->step;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", c->client ? wb_client_errmsg(c->client) : "");
    /* The failed call handed out no lease. */
    if (step >= 1 && step < 3)
        ck_assert_ptr_null(c->lease[step - 1]);
    else if (step == 3)
        check_lease(c->lease[1]);
    end_client(c);
    if (step == 3) {
        /* A release the broker could not be told of, as documented: the
         * lease ended here, WB_ECONN, and the message says why. */
        ck_assert_msg(rc == WB_ECONN, "release: status %d: %s", rc, msg);
        ck_assert_msg(strstr(msg, "could not be told") && strstr(msg, "out of memory"), "%s", msg);
        return;
    }
    ck_assert_msg(rc == WB_ENOMEM, "step %d: status %d: %s", step, rc, msg);
    if (step >= 1)
        ck_assert_msg(strstr(msg, "out of memory") != NULL, "step %d: %s", step, msg);
}

static void done_client(void *arg)
{
    client_case *c = arg;
    ck_assert_int_eq(c->step, 4);
    check_lease(c->lease[1]);
    end_client(c);
}

static void setup_client(void *arg)
{
    client_case *c = arg;
    atomic_store(&c->f.b.n_acquire, 0);
    atomic_store(&c->f.b.n_release, 0);
}

static void teardown_client(void *arg)
{
    client_case *c = arg;
    int granted = atomic_load(&c->f.b.n_acquire), released = atomic_load(&c->f.b.n_release);
    ck_assert_int_le(released, granted);
    c->lost[oom_mode == WB_ALLOC_STICKY] += granted - released;
}

/* Acquires whose lease stays at the broker because the client could not
 * even read the reply that granted it, or tell the broker it gives it
 * back, are counted, not failed: only the process's end frees them. */
static void oom_client(const char *name, int compact, int frame_mode, int shared_mode)
{
    static client_case c;
    memset(&c, 0, sizeof c);
    fake_env_start(&c.f, 1000);
    atomic_store(&c.f.b.compact, compact);
    atomic_store(&c.f.b.frame_mode, frame_mode);
    atomic_store(&c.f.b.shared_mode, shared_mode);
    /* A run with every allocation made, for the reference. */
    ck_assert_int_eq(run_client(&c), WB_OK);
    check_lease(c.lease[1]);
    end_client(&c);
    c.lost[0] = c.lost[1] = 0;

    oom_op op = {.name = name,
                 .ctx = &c,
                 .flags = WB_ALLOC_THIS_THREAD,
                 .setup = setup_client,
                 .run = run_client,
                 .failed = failed_client,
                 .done = done_client,
                 .teardown = teardown_client};
    oom_run(&op);
    printf("oom %s: leases left at the broker: %d with one allocation failing, %d with all from "
           "one on\n",
           name, c.lost[0], c.lost[1]);
    fake_env_stop(&c.f);
}

START_TEST(test_tensor_messages)
{
    oom_client("client acquire (tensor messages)", 0, FAKE_FRAME_IGNORE, FAKE_SHARED_IGNORE);
}
END_TEST

START_TEST(test_table_frame)
{
    oom_client("client acquire (table as a frame)", 1, FAKE_FRAME_SEND, FAKE_SHARED_IGNORE);
}
END_TEST

START_TEST(test_table_shared)
{
    oom_client("client acquire (table in shared memory)", 1, FAKE_FRAME_SEND, FAKE_SHARED_SEND);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("oom_client");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_tensor_messages);
    tcase_add_test(tc, test_table_frame);
    tcase_add_test(tc, test_table_shared);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
