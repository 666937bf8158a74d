/* The dispatcher (ops.c) and the reply context (ops.h), without sockets: the
 * checks made before any handler runs, error replies, and that each request
 * gets a reply of its own: a second frame set for one reply reaches no other,
 * whether handled back to back, refused, turned into an error or answered
 * later (a deferred load). The handlers' own tests are test_ops_lease,
 * test_ops_list and test_ops_admin. */
#include "broker_fixture.h"
#include "ops.h"
#include "tensor_table.h"
#include "wire.h"

#include <check.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fixture's functions that these tests do not need. */
static void unused_fixture(void) __attribute__((unused));
static void unused_fixture(void)
{
    shm_name_exists("");
    advance_ms(0);
}

static broker_fixture F;

static void setup(void)
{
    fixture_open(&F, "ops");
}

static void teardown(void)
{
    fixture_close(&F);
}

/* An acquire of `model` that asks for the compact table, as the reply's
 * second frame when `frame` is set, else inside the reply. */
static void acquire_req(Wbproto__Request *req, Wbproto__AcquireRequest *a, const char *model,
                        int frame)
{
    wbproto__request__init(req);
    wbproto__acquire_request__init(a);
    a->model = (char *)model;
    a->tensor_table = 1;
    a->tensor_table_frame = frame != 0;
    req->body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req->acquire = a;
    req->version = WB_PROTOCOL_VERSION;
    req->id = ++F.next_id;
}

static void hello_req(Wbproto__Request *req, Wbproto__HelloRequest *h)
{
    wbproto__request__init(req);
    wbproto__hello_request__init(h);
    h->client = "unit test";
    req->body_case = WBPROTO__REQUEST__BODY_HELLO;
    req->hello = h;
    req->version = WB_PROTOCOL_VERSION;
    req->id = ++F.next_id;
}

/* Handles one request into its own context `r`, which the caller frees. */
static int handle(const wb_peer_creds *p, const Wbproto__Request *req, wb_ops_reply *r)
{
    return wb__ops_handle(&F.b, p, req, F.ident, sizeof F.ident, r);
}

/* The message of `r` as a client decodes it (F.decoded). */
static Wbproto__Reply *decode(const wb_ops_reply *r)
{
    size_t len;
    uint8_t *buf = wb__reply_pack(&r->msg, &len);
    ck_assert_ptr_nonnull(buf);
    wb__reply_free(&F.decoded);
    wb_err err;
    ck_assert_msg(wb__reply_decode(buf, len, &F.decoded, &err) == WB_OK, "reply: %s", err.msg);
    free(buf);
    return F.decoded;
}

/* Refused before any handler: unknown credentials, and a request without a
 * body (the wire decoder refuses one first; the dispatcher does not rely on
 * it). Neither reply has a body or a frame. */
START_TEST(test_refused_before_handlers)
{
    Wbproto__Request req;
    Wbproto__HelloRequest h;
    hello_req(&req, &h);
    wb_peer_creds none = {0};
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    ck_assert_int_eq(handle(&none, &req, &r), 0);
    ck_assert_uint_eq(r.msg.id, req.id);
    ck_assert_int_eq(r.msg.status, WB_EPERM);
    ck_assert_str_eq(r.msg.error, "the peer's credentials cannot be read");
    ck_assert_int_eq(r.msg.body_case, WBPROTO__REPLY__BODY__NOT_SET);
    ck_assert_ptr_null(r.frame);
    wb__ops_reply_free(&r);

    wb_peer_creds p = me();
    req.body_case = WBPROTO__REQUEST__BODY__NOT_SET;
    ck_assert_int_eq(handle(&p, &req, &r), 0);
    ck_assert_int_eq(r.msg.status, WB_EPROTO);
    ck_assert_str_eq(r.msg.error, "request has no body");
    ck_assert_int_eq(r.msg.body_case, WBPROTO__REPLY__BODY__NOT_SET);
    ck_assert_ptr_null(r.frame);
    wb__ops_reply_free(&r);
}
END_TEST

START_TEST(test_error_reply)
{
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    wb__ops_error(&r, 0, WB_EPROTO, "request does not decode");
    ck_assert_ptr_null(r.frame);
    Wbproto__Reply *d = decode(&r);
    ck_assert_uint_eq(d->id, 0);
    ck_assert_int_eq(d->status, WB_EPROTO);
    ck_assert_str_eq(d->error, "request does not decode");
    /* Without a message: the status's own. */
    wb__ops_error(&r, 9, WB_ENOTFOUND, NULL);
    d = decode(&r);
    ck_assert_uint_eq(d->id, 9);
    ck_assert_str_eq(d->error, wb_strerror(WB_ENOTFOUND));
    wb__ops_reply_free(&r);
}
END_TEST

/* Two requests handled back to back, each in its own context, the first
 * reply not yet sent: the acquire whose table goes as the second frame keeps
 * it, and the request after it (a hello; an acquire that takes the table
 * inside; one refused although it asked for the frame) carries none. The
 * fixture, which handles one request at a time as the loop does, sees the
 * same. */
START_TEST(test_frame_per_request)
{
    wb_model *m = fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    Wbproto__Request req;
    Wbproto__AcquireRequest aq;
    Wbproto__HelloRequest h;

    wb_ops_reply first = WB_OPS_REPLY_INIT;
    acquire_req(&req, &aq, "demo", 1);
    ck_assert_int_eq(handle(&p, &req, &first), 0);
    ck_assert_int_eq(first.msg.status, 0);
    ck_assert_ptr_eq(first.frame, m->table);
    ck_assert_uint_eq(first.frame_len, m->table_len);

    wb_ops_reply second = WB_OPS_REPLY_INIT;
    hello_req(&req, &h);
    ck_assert_int_eq(handle(&p, &req, &second), 0);
    ck_assert_int_eq(second.msg.body_case, WBPROTO__REPLY__BODY_HELLO);
    ck_assert_ptr_null(second.frame);
    ck_assert_uint_eq(second.frame_len, 0);

    wb_ops_reply third = WB_OPS_REPLY_INIT;
    acquire_req(&req, &aq, "demo", 0);
    ck_assert_int_eq(handle(&p, &req, &third), 0);
    ck_assert_ptr_null(third.frame);
    ck_assert_uint_eq(third.frame_len, 0);
    Wbproto__Reply *d = decode(&third);
    ck_assert_int_eq(d->status, 0);
    ck_assert_int_eq(d->acquire->lease->tensor_table_in_frame, 0);
    ck_assert_uint_eq(d->acquire->lease->tensor_table.len, m->table_len);

    wb_ops_reply fourth = WB_OPS_REPLY_INIT;
    acquire_req(&req, &aq, "nope", 1);
    ck_assert_int_eq(handle(&p, &req, &fourth), 0);
    ck_assert_int_eq(fourth.msg.status, WB_ENOTFOUND);
    ck_assert_ptr_null(fourth.frame);
    ck_assert_uint_eq(fourth.frame_len, 0);

    /* The first reply, sent last, is still the acquire with its table. */
    ck_assert_ptr_eq(first.frame, m->table);
    ck_assert_uint_eq(first.frame_len, m->table_len);
    d = decode(&first);
    ck_assert_int_eq(d->status, 0);
    const Wbproto__Lease *l = d->acquire->lease;
    ck_assert_int_eq(l->tensor_table_in_frame, 1);
    ck_assert_uint_eq(l->tensor_table.len, 0);
    wb_err err;
    ck_assert_int_eq(
        wb__tensor_table_check(first.frame, first.frame_len, l->slabs, l->n_slabs, &err), WB_OK);
    wb__ops_reply_free(&first);
    wb__ops_reply_free(&second);
    wb__ops_reply_free(&third);
    wb__ops_reply_free(&fourth);

    /* One at a time through the fixture. */
    acquire_req(&req, &aq, "demo", 1);
    fixture_call(&F, &p, &req);
    ck_assert_ptr_eq(F.frame, m->table);
    ck_assert_int_eq(fixture_simple(&F, &p, WBPROTO__REQUEST__BODY_HELLO)->body_case,
                     WBPROTO__REPLY__BODY_HELLO);
    ck_assert_ptr_null(F.frame);
    ck_assert_uint_eq(F.frame_len, 0);
    ck_assert_uint_eq(F.b.leases.n_leases, 3);
}
END_TEST

/* A reply made an error once it is built (as the loop does with one over the
 * message limit) drops its frame with its body, and a freed context is an
 * empty one, which the next request may use. */
START_TEST(test_error_drops_frame)
{
    wb_model *m = fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    Wbproto__Request req;
    Wbproto__AcquireRequest aq;
    Wbproto__HelloRequest h;
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    acquire_req(&req, &aq, "demo", 1);
    ck_assert_int_eq(handle(&p, &req, &r), 0);
    ck_assert_ptr_eq(r.frame, m->table);
    wb__ops_error(&r, r.msg.id, WB_ELIMIT, "over the limit");
    ck_assert_ptr_null(r.frame);
    ck_assert_uint_eq(r.frame_len, 0);
    Wbproto__Reply *d = decode(&r);
    ck_assert_uint_eq(d->id, req.id);
    ck_assert_int_eq(d->status, WB_ELIMIT);
    ck_assert_str_eq(d->error, "over the limit");
    ck_assert_int_eq(d->body_case, WBPROTO__REPLY__BODY__NOT_SET);

    acquire_req(&req, &aq, "demo", 1);
    ck_assert_int_eq(handle(&p, &req, &r), 0);
    ck_assert_ptr_eq(r.frame, m->table);
    wb__ops_reply_free(&r);
    ck_assert_ptr_null(r.frame);
    ck_assert_uint_eq(r.frame_len, 0);
    ck_assert_ptr_null(r.arena.head);
    ck_assert_int_eq(r.msg.status, 0);
    ck_assert_int_eq(r.msg.body_case, WBPROTO__REPLY__BODY__NOT_SET);
    hello_req(&req, &h);
    ck_assert_int_eq(handle(&p, &req, &r), 0);
    ck_assert_ptr_null(r.frame);
    ck_assert_int_eq(decode(&r)->body_case, WBPROTO__REPLY__BODY_HELLO);
    wb__ops_reply_free(&r);
}
END_TEST

static const char *data_path(const char *rel)
{
    static char buf[1024];
    const char *dir = getenv("WB_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/%s", dir && *dir ? dir : "tests/data", rel);
    return buf;
}

/* A load on the loader thread is answered later: its request's context
 * holds nothing to send. An acquire handled meanwhile has its frame; the
 * load's reply, made when the loader is done (as loop.c's handle_loads
 * does), answers the load's request and carries no frame. */
START_TEST(test_deferred_reply)
{
    wb_model *m = fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    wb_loader loader;
    wb_err err;
    ck_assert_int_eq(wb__loader_start(&loader, &err), WB_OK);
    F.b.loader = &loader;

    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__LoadRequest lr = WBPROTO__LOAD_REQUEST__INIT;
    lr.name = "gpt2";
    lr.path = (char *)data_path("official/gpt2/model.safetensors");
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &lr;
    req.version = WB_PROTOCOL_VERSION;
    req.id = ++F.next_id;
    uint64_t load_id = req.id;
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    ck_assert_int_eq(handle(&p, &req, &r), WB_OPS_DEFERRED);
    ck_assert_ptr_null(r.frame);
    wb__ops_reply_free(&r);

    Wbproto__Request areq;
    Wbproto__AcquireRequest aq;
    acquire_req(&areq, &aq, "demo", 1);
    ck_assert_int_eq(handle(&p, &areq, &r), 0);
    ck_assert_ptr_eq(r.frame, m->table);

    struct pollfd pfd = {.fd = loader.efd, .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 30000), 1);
    wb_load_job *job = wb__loader_take_done(&loader);
    ck_assert_ptr_nonnull(job);
    ck_assert_ptr_null(job->next);
    wb_model *ready = NULL;
    ck_assert_msg(wb__broker_finish_load(&F.b, job, &ready) == WB_OK, "%s", job->err.msg);
    ck_assert_ptr_nonnull(job->ident);
    ck_assert_int_eq(memcmp(job->ident, F.ident, sizeof F.ident), 0);
    wb_ops_reply done = WB_OPS_REPLY_INIT;
    wb__ops_load_done(&F.b, job, ready, &done);
    ck_assert_ptr_null(done.frame);
    ck_assert_uint_eq(done.frame_len, 0);
    Wbproto__Reply *d = decode(&done);
    ck_assert_uint_eq(d->id, load_id);
    ck_assert_int_eq(d->status, 0);
    ck_assert_int_eq(d->body_case, WBPROTO__REPLY__BODY_LOAD);
    ck_assert_str_eq(d->load->model->name, "gpt2");
    ck_assert_int_eq(d->load->model->state, WBPROTO__MODEL_STATE__MODEL_READY);
    wb__ops_reply_free(&done);
    wb__load_job_free(&job);

    /* The acquire's reply is untouched by the load's. */
    ck_assert_ptr_eq(r.frame, m->table);
    ck_assert_uint_eq(r.frame_len, m->table_len);
    ck_assert_int_eq(decode(&r)->acquire->lease->tensor_table_in_frame, 1);
    wb__ops_reply_free(&r);
    ck_assert_ptr_null(wb__loader_stop(&loader));
    F.b.loader = NULL;
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_refused_before_handlers);
    tcase_add_test(tc, test_error_reply);
    tcase_add_test(tc, test_frame_per_request);
    tcase_add_test(tc, test_error_drops_frame);
    tcase_add_test(tc, test_deferred_reply);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
