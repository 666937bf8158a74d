/* Out of memory in the wire decoders (oom.h): every request a client
 * sends and every reply the broker makes, decoded with each allocation
 * failing in turn, fails with WB_ENOMEM (not as a malformed message) and
 * leaves nothing behind, the request's id still read for the error reply. */
#include "broker_fixture.h"
#include "oom.h"
#include "wire.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fixture's functions that these tests do not need. */
static void unused_fixture(void) __attribute__((unused));
static void unused_fixture(void)
{
    shm_name_exists("");
    advance_ms(0);
}

typedef struct wire_case {
    uint8_t *buf;
    size_t len;
    uint64_t id;
    Wbproto__Request *req;
    Wbproto__Reply *rep;
    uint64_t got_id;
    wb_err err;
} wire_case;

static int run_request(void *arg)
{
    wire_case *c = arg;
    return wb__request_decode(c->buf, c->len, &c->req, &c->got_id, &c->err);
}

static int run_reply(void *arg)
{
    wire_case *c = arg;
    return wb__reply_decode(c->buf, c->len, &c->rep, &c->err);
}

static void failed_request(void *arg, int rc)
{
    wire_case *c = arg;
    ck_assert_msg(rc == WB_ENOMEM, "status %d: %s", rc, c->err.msg);
    ck_assert_int_eq(c->err.code, WB_ENOMEM);
    ck_assert_ptr_null(c->req);
    ck_assert_uint_eq(c->got_id, c->id);
    ck_assert_ptr_nonnull(strstr(c->err.msg, "out of memory"));
}

static void failed_reply(void *arg, int rc)
{
    wire_case *c = arg;
    ck_assert_msg(rc == WB_ENOMEM, "status %d: %s", rc, c->err.msg);
    ck_assert_ptr_null(c->rep);
    ck_assert_ptr_nonnull(strstr(c->err.msg, "out of memory"));
}

/* A decoded message is whole: it packs to the bytes it came from. */
static void done_request(void *arg)
{
    wire_case *c = arg;
    ck_assert_ptr_nonnull(c->req);
    size_t len;
    uint8_t *again = wb__request_pack(c->req, &len);
    ck_assert_uint_eq(len, c->len);
    ck_assert_int_eq(memcmp(again, c->buf, len), 0);
    free(again);
    wb__request_free(&c->req);
}

static void done_reply(void *arg)
{
    wire_case *c = arg;
    ck_assert_ptr_nonnull(c->rep);
    size_t len;
    uint8_t *again = wb__reply_pack(c->rep, &len);
    ck_assert_uint_eq(len, c->len);
    ck_assert_int_eq(memcmp(again, c->buf, len), 0);
    free(again);
    wb__reply_free(&c->rep);
}

static oom_result total;

static void oom_request(const char *name, Wbproto__Request *req)
{
    req->version = WB_PROTOCOL_VERSION;
    wire_case c = {.id = req->id};
    c.buf = wb__request_pack(req, &c.len);
    ck_assert_ptr_nonnull(c.buf);
    oom_op op = {.name = name,
                 .ctx = &c,
                 .run = run_request,
                 .failed = failed_request,
                 .done = done_request};
    oom_result res = oom_run(&op);
    oom_total(&total, &res);
    free(c.buf);
}

static void oom_reply_bytes(const char *name, uint8_t *buf, size_t len)
{
    wire_case c = {.buf = buf, .len = len};
    oom_op op = {
        .name = name, .ctx = &c, .run = run_reply, .failed = failed_reply, .done = done_reply};
    oom_result res = oom_run(&op);
    oom_total(&total, &res);
}

static const uint8_t lease_a[WB_LEASE_ID_LEN] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const uint8_t lease_b[WB_LEASE_ID_LEN] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};

START_TEST(test_requests)
{
    total = (oom_result){0};
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.id = 7;
    Wbproto__HelloRequest h = WBPROTO__HELLO_REQUEST__INIT;
    h.client = "libwbclient 0.1.0 pid 42";
    h.session.data = (uint8_t *)lease_a;
    h.session.len = 16;
    req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    req.hello = &h;
    oom_request("request hello", &req);

    Wbproto__AcquireRequest a = WBPROTO__ACQUIRE_REQUEST__INIT;
    a.model = "llama-3.1_8b";
    a.tensor_table = 1;
    a.tensor_table_frame = 1;
    a.device_uuid = UUID0;
    a.tensor_table_digest.data = (uint8_t *)lease_b;
    a.tensor_table_digest.len = 16;
    req.id = 8;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &a;
    oom_request("request acquire", &req);

    Wbproto__ReleaseRequest r = WBPROTO__RELEASE_REQUEST__INIT;
    r.lease_id.data = (uint8_t *)lease_a;
    r.lease_id.len = WB_LEASE_ID_LEN;
    req.id = 9;
    req.body_case = WBPROTO__REQUEST__BODY_RELEASE;
    req.release = &r;
    oom_request("request release", &req);

    Wbproto__ContainerRecord rec[2];
    for (int i = 0; i < 2; i++) {
        wbproto__container_record__init(&rec[i]);
        rec[i].container_id = (uint64_t)i + 1;
        rec[i].aoti_api = "CreateWithDevice";
        rec[i].model_path = "/models/variant.pt2";
        rec[i].bound_bytes = 64;
    }
    Wbproto__ContainerRecord *recs[] = {&rec[0], &rec[1]};
    Wbproto__LeaseBeat b0 = WBPROTO__LEASE_BEAT__INIT, b1 = WBPROTO__LEASE_BEAT__INIT;
    b0.lease_id.data = (uint8_t *)lease_a;
    b0.lease_id.len = 16;
    b0.containers = 2;
    b0.n_container_records = 2;
    b0.container_records = recs;
    b1.lease_id.data = (uint8_t *)lease_b;
    b1.lease_id.len = 16;
    Wbproto__LeaseBeat *beats[] = {&b0, &b1};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 2;
    hb.leases = beats;
    req.id = 10;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    oom_request("request heartbeat", &req);

    Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
    ll.offset = 3;
    ll.limit = 10;
    req.id = 11;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
    req.list_leases = &ll;
    oom_request("request list leases", &req);

    Wbproto__ListModelsRequest lm = WBPROTO__LIST_MODELS_REQUEST__INIT;
    req.id = 12;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_MODELS;
    req.list_models = &lm;
    oom_request("request list models", &req);

    Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
    req.id = 13;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
    req.list_containers = &lc;
    oom_request("request list containers", &req);

    Wbproto__LoadRequest l = WBPROTO__LOAD_REQUEST__INIT;
    l.name = "base";
    l.path = "/models/base/model.safetensors.index.json";
    l.placement = "0,1";
    req.id = 14;
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &l;
    oom_request("request load", &req);

    Wbproto__UnloadRequest u = WBPROTO__UNLOAD_REQUEST__INIT;
    u.name = "base";
    u.cancel_only = 1;
    req.id = 15;
    req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    req.unload = &u;
    oom_request("request unload", &req);

    Wbproto__StatsRequest st = WBPROTO__STATS_REQUEST__INIT;
    req.id = 16;
    req.body_case = WBPROTO__REQUEST__BODY_STATS;
    req.stats = &st;
    oom_request("request stats", &req);
    printf("oom requests: %ld allocation points at %ld sites\n", total.points, total.sites);
}
END_TEST

static broker_fixture F;

/* The broker's reply to `req`, packed, as it goes on the wire. */
static uint8_t *reply_bytes(Wbproto__Request *req, size_t *len)
{
    wb_peer_creds p = me();
    req->version = WB_PROTOCOL_VERSION;
    req->id = ++F.next_id;
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    ck_assert_int_eq(wb__ops_handle(&F.b, &p, req, F.ident, sizeof F.ident, &r), 0);
    ck_assert_int_eq(r.msg.status, 0);
    uint8_t *buf = wb__reply_pack(&r.msg, len);
    ck_assert_ptr_nonnull(buf);
    wb__ops_reply_free(&r);
    return buf;
}

static void oom_reply(const char *name, Wbproto__Request *req)
{
    size_t len;
    uint8_t *buf = reply_bytes(req, &len);
    oom_reply_bytes(name, buf, len);
    free(buf);
}

START_TEST(test_replies)
{
    total = (oom_result){0};
    fixture_open(&F, "oomwire");
    fixture_model(&F.b, "demo");
    fixture_twin_model(&F.b);
    wb_peer_creds p = me();

    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__HelloRequest h = WBPROTO__HELLO_REQUEST__INIT;
    h.client = "unit test";
    req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    req.hello = &h;
    oom_reply("reply hello", &req);

    /* An acquire with tensor messages, and one with the compact table. */
    Wbproto__AcquireRequest a = WBPROTO__ACQUIRE_REQUEST__INIT;
    a.model = "demo";
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &a;
    oom_reply("reply acquire", &req);
    a.tensor_table = 1;
    oom_reply("reply acquire table", &req);
    a.model = "twin";
    a.device_uuid = UUID1;
    oom_reply("reply acquire twin", &req);

    /* A heartbeat with records on a lease, one unknown lease. */
    Wbproto__Reply *got = fixture_acquire(&F, &p, "demo");
    uint8_t id[WB_LEASE_ID_LEN];
    memcpy(id, got->acquire->lease->id.data, sizeof id);
    Wbproto__ContainerRecord rec = WBPROTO__CONTAINER_RECORD__INIT;
    rec.container_id = 1;
    rec.aoti_api = "CreateWithDevice";
    rec.model_path = "/models/variant.pt2";
    Wbproto__ContainerRecord *recs[] = {&rec};
    Wbproto__LeaseBeat b0 = WBPROTO__LEASE_BEAT__INIT, b1 = WBPROTO__LEASE_BEAT__INIT;
    b0.lease_id.data = id;
    b0.lease_id.len = 16;
    b0.containers = 1;
    b0.n_container_records = 1;
    b0.container_records = recs;
    b1.lease_id.data = (uint8_t *)lease_b;
    b1.lease_id.len = 16;
    Wbproto__LeaseBeat *beats[] = {&b0, &b1};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 2;
    hb.leases = beats;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    oom_reply("reply heartbeat", &req);

    Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
    req.list_leases = &ll;
    oom_reply("reply list leases", &req);
    Wbproto__ListModelsRequest lm = WBPROTO__LIST_MODELS_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_MODELS;
    req.list_models = &lm;
    oom_reply("reply list models", &req);
    Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
    req.list_containers = &lc;
    oom_reply("reply list containers", &req);
    Wbproto__StatsRequest st = WBPROTO__STATS_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_STATS;
    req.stats = &st;
    oom_reply("reply stats", &req);
    Wbproto__ReleaseRequest r = WBPROTO__RELEASE_REQUEST__INIT;
    r.lease_id.data = id;
    r.lease_id.len = WB_LEASE_ID_LEN;
    req.body_case = WBPROTO__REQUEST__BODY_RELEASE;
    req.release = &r;
    oom_reply("reply release", &req);
    Wbproto__UnloadRequest u = WBPROTO__UNLOAD_REQUEST__INIT;
    u.name = "demo";
    req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    req.unload = &u;
    oom_reply("reply unload", &req);

    /* An error reply. */
    wb_ops_reply e = WB_OPS_REPLY_INIT;
    wb__ops_error(&e, 99, WB_ENOTFOUND, "no model 'nothing' (models: demo, twin)");
    size_t len;
    uint8_t *buf = wb__reply_pack(&e.msg, &len);
    wb__ops_reply_free(&e);
    oom_reply_bytes("reply error", buf, len);
    free(buf);
    fixture_close(&F);
    printf("oom replies: %ld allocation points at %ld sites\n", total.points, total.sites);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("oom_wire");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_requests);
    tcase_add_test(tc, test_replies);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
