/* Container records on the broker side and on the wire: heartbeats carry a
 * record per container and lease, the broker keeps the last ones per lease,
 * lists them with the lease (list_leases) and aggregates them per container
 * (list_containers); the decoders enforce their limits. Also the client's
 * cuda import on a machine without a usable GPU: a clear error, no crash. */
#include "broker_fixture.h"
#include "mapcache.h"
#include "ops.h"
#include "wire.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fixture's functions that these tests do not need. */
static void unused_fixture(void) __attribute__((unused));
static void unused_fixture(void)
{
    advance_ms(0);
    shm_name_exists("");
}

static wb_broker B;
static wb_arena A;
static Wbproto__Reply *decoded;

static void setup(void)
{
    fixture_broker(&B, 200, 1000);
    memset(&A, 0, sizeof A);
    decoded = NULL;
}

static void teardown(void)
{
    wb__reply_free(&decoded);
    wb__arena_free(&A);
    wb__broker_destroy(&B);
}

/* Packs a request, decodes it as the broker would, handles it and decodes
 * the reply as a client would: both decoders see every message. */
static Wbproto__Reply *call(const wb_peer_creds *peer, Wbproto__Request *req)
{
    static uint64_t next_id = 10;
    req->version = WB_PROTOCOL_VERSION;
    req->id = ++next_id;
    size_t qlen;
    uint8_t *qbuf = wb__request_pack(req, &qlen);
    Wbproto__Request *dreq = NULL;
    uint64_t id;
    wb_err err;
    ck_assert_msg(wb__request_decode(qbuf, qlen, &dreq, &id, &err) == WB_OK, "request: %s",
                  err.msg);
    free(qbuf);
    const uint8_t ident[] = {0, 'i', 'd'};
    Wbproto__Reply *r = fixture_call(&B, &A, &decoded, peer, dreq, ident, sizeof ident);
    wb__request_free(&dreq);
    return r;
}

static void acquire(const wb_peer_creds *peer, const char *model, uint8_t id[16])
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__AcquireRequest a = WBPROTO__ACQUIRE_REQUEST__INIT;
    a.model = (char *)model;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &a;
    Wbproto__Reply *r = call(peer, &req);
    ck_assert_int_eq(r->status, 0);
    memcpy(id, r->acquire->lease->id.data, 16);
}

static void set_rec(Wbproto__ContainerRecord *r, uint64_t cid, const char *api, uint64_t bytes,
                    uint32_t tensors)
{
    wbproto__container_record__init(r);
    r->container_id = cid;
    r->aoti_api = (char *)api;
    r->bound_bytes = bytes;
    r->bound_tensors = tensors;
    r->folded_bytes = 7;
    r->created_at = 1700000000.5;
    r->model_path = "/models/variant.pt2";
    r->pinned_async_copy = cid == 2;
}

/* A heartbeat for two leases: container 1 binds both, container 2 only the
 * first. */
static Wbproto__Reply *beat(const wb_peer_creds *peer, uint8_t ids[2][16], int with_records)
{
    Wbproto__ContainerRecord r1a, r1b, r2a;
    set_rec(&r1a, 1, "CreateWithDevice+UpdateUserManagedConstantBufferPairs", 12, 1);
    set_rec(&r1b, 1, "CreateWithDevice+UpdateUserManagedConstantBufferPairs", 16, 1);
    set_rec(&r2a, 2, "CreateWithExternalConstants", 12, 1);
    Wbproto__ContainerRecord *recs_a[] = {&r1a, &r2a}, *recs_b[] = {&r1b};
    Wbproto__LeaseBeat b0 = WBPROTO__LEASE_BEAT__INIT, b1 = WBPROTO__LEASE_BEAT__INIT;
    b0.lease_id.data = ids[0];
    b0.lease_id.len = 16;
    b1.lease_id.data = ids[1];
    b1.lease_id.len = 16;
    if (with_records) {
        b0.containers = 2;
        b0.n_container_records = 2;
        b0.container_records = recs_a;
        b1.containers = 1;
        b1.n_container_records = 1;
        b1.container_records = recs_b;
    }
    Wbproto__LeaseBeat *beats[] = {&b0, &b1};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 2;
    hb.leases = beats;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    return call(peer, &req);
}

static Wbproto__Reply *list(int containers)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
    Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
    if (containers) {
        req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
        req.list_containers = &lc;
    } else {
        req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
        req.list_leases = &ll;
    }
    wb_peer_creds p = me();
    return call(&p, &req);
}

START_TEST(records_are_kept_per_lease_and_listed_per_container)
{
    fixture_model(&B, "base");
    fixture_model(&B, "head");
    wb_peer_creds p = me();
    uint8_t ids[2][16];
    acquire(&p, "base", ids[0]);
    acquire(&p, "head", ids[1]);

    Wbproto__Reply *r = list(1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->list_containers->n_containers, 0);

    r = beat(&p, ids, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->heartbeat->n_unknown_leases, 0);

    r = list(0);
    ck_assert_uint_eq(r->list_leases->n_leases, 2);
    for (size_t i = 0; i < 2; i++) {
        const Wbproto__LeaseInfo *li = r->list_leases->leases[i];
        int is_base = memcmp(li->id.data, ids[0], 16) == 0;
        ck_assert_uint_eq(li->n_container_records, is_base ? 2 : 1);
        ck_assert_uint_eq(li->containers, is_base ? 2 : 1);
        ck_assert_uint_eq(li->container_records[0]->bound_bytes, is_base ? 12 : 16);
        ck_assert_str_eq(li->container_records[0]->model_path, "/models/variant.pt2");
    }

    r = list(1);
    const Wbproto__ListContainersReply *lc = r->list_containers;
    ck_assert_uint_eq(lc->n_containers, 2);
    const Wbproto__ContainerInfo *c1 = lc->containers[0], *c2 = lc->containers[1];
    ck_assert_uint_eq(c1->container_id, 1);
    ck_assert_uint_eq(c2->container_id, 2);
    ck_assert_uint_eq(c1->pid, p.pid);
    ck_assert_str_eq(c1->aoti_api, "CreateWithDevice+UpdateUserManagedConstantBufferPairs");
    ck_assert_str_eq(c2->aoti_api, "CreateWithExternalConstants");
    ck_assert(!c1->pinned_async_copy && c2->pinned_async_copy);
    ck_assert_uint_eq(c1->folded_bytes, 7);
    ck_assert_double_eq(c1->created_at, 1700000000.5);
    /* Container 1 binds both leases, with each lease's bytes. */
    ck_assert_uint_eq(c1->n_leases, 2);
    uint64_t sum = 0;
    for (size_t i = 0; i < c1->n_leases; i++)
        sum += c1->leases[i]->bound_bytes;
    ck_assert_uint_eq(sum, 28);
    ck_assert_uint_eq(c2->n_leases, 1);
    ck_assert_str_eq(c2->leases[0]->model, "base");
    ck_assert_mem_eq(c2->leases[0]->lease_id.data, ids[0], 16);

    /* A heartbeat without records clears them (the containers are gone). */
    r = beat(&p, ids, 0);
    r = list(1);
    ck_assert_uint_eq(r->list_containers->n_containers, 0);

    /* Records of a lease that ends go with it (no leak under ASan). */
    beat(&p, ids, 1);
    wb__leases_remove(&B.leases, wb__leases_find(&B.leases, ids[0]));
    r = list(1);
    ck_assert_uint_eq(r->list_containers->n_containers, 1);
    ck_assert_uint_eq(r->list_containers->containers[0]->n_leases, 1);
    ck_assert_str_eq(r->list_containers->containers[0]->leases[0]->model, "head");
}
END_TEST

START_TEST(another_pids_records_are_ignored)
{
    fixture_model(&B, "base");
    wb_peer_creds p = me(), other = creds(p.uid, p.gid, p.pid + 1);
    uint8_t ids[2][16];
    acquire(&p, "base", ids[0]);
    acquire(&p, "base", ids[1]);
    Wbproto__Reply *r = beat(&other, ids, 1);
    ck_assert_uint_eq(r->heartbeat->n_unknown_leases, 2);
    r = list(1);
    ck_assert_uint_eq(r->list_containers->n_containers, 0);
}
END_TEST

static int decode_request(Wbproto__Request *req, wb_err *err)
{
    req->version = WB_PROTOCOL_VERSION;
    req->id = 5;
    size_t len;
    uint8_t *buf = wb__request_pack(req, &len);
    Wbproto__Request *out = NULL;
    uint64_t id;
    int rc = wb__request_decode(buf, len, &out, &id, err);
    free(buf);
    wb__request_free(&out);
    return rc;
}

START_TEST(wire_limits_on_records)
{
    uint8_t id[16] = {1};
    enum { N = 257 };
    Wbproto__ContainerRecord recs[N], *ptrs[N];
    for (int i = 0; i < N; i++) {
        set_rec(&recs[i], (uint64_t)i, "CreateWithExternalConstants", 1, 1);
        ptrs[i] = &recs[i];
    }
    Wbproto__LeaseBeat b = WBPROTO__LEASE_BEAT__INIT;
    b.lease_id.data = id;
    b.lease_id.len = 16;
    b.container_records = ptrs;
    Wbproto__LeaseBeat *beats[] = {&b};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 1;
    hb.leases = beats;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    wb_err err;

    b.n_container_records = 256;
    ck_assert_int_eq(decode_request(&req, &err), WB_OK);
    b.n_container_records = N;
    ck_assert_int_eq(decode_request(&req, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "heartbeat.leases[0].container_records has 257"));

    b.n_container_records = 2;
    recs[1].aoti_api = "";
    ck_assert_int_eq(decode_request(&req, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "container_records[1].aoti_api is empty"));
    recs[1].aoti_api = "bad\napi";
    ck_assert_int_eq(decode_request(&req, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "control character"));
}
END_TEST

START_TEST(wire_checks_container_listing)
{
    Wbproto__ContainerLease cl = WBPROTO__CONTAINER_LEASE__INIT;
    uint8_t short_id[3] = {1, 2, 3};
    cl.lease_id.data = short_id;
    cl.lease_id.len = 3;
    Wbproto__ContainerLease *cls[] = {&cl};
    Wbproto__ContainerInfo ci = WBPROTO__CONTAINER_INFO__INIT;
    ci.aoti_api = "CreateWithDevice";
    ci.n_leases = 1;
    ci.leases = cls;
    Wbproto__ContainerInfo *cis[] = {&ci};
    Wbproto__ListContainersReply lr = WBPROTO__LIST_CONTAINERS_REPLY__INIT;
    lr.n_containers = 1;
    lr.containers = cis;
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.body_case = WBPROTO__REPLY__BODY_LIST_CONTAINERS;
    rep.list_containers = &lr;
    size_t len;
    uint8_t *buf = wb__reply_pack(&rep, &len);
    Wbproto__Reply *out = NULL;
    wb_err err;
    ck_assert_int_eq(wb__reply_decode(buf, len, &out, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "list_containers.containers[0].leases[0].lease_id"));
    free(buf);
}
END_TEST

START_TEST(cuda_import_without_gpu_is_a_clear_error)
{
    uint8_t handle[64];
    memset(handle, 0x5a, sizeof handle);
    wb__map *m = NULL;
    wb_err err;
    ck_assert_int_eq(wb__mapcache_get_cuda(handle, 63, 0, 4096, &m, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "63 bytes"));
    int rc = wb__mapcache_get_cuda(handle, 64, 0, 4096, &m, &err);
#ifdef WB_HAVE_CUDA
    /* The machines that run these tests have no GPU. */
    ck_assert_int_eq(rc, WB_ENOGPU);
    ck_assert_ptr_nonnull(strstr(err.msg, "no usable GPU"));
#else
    ck_assert_int_eq(rc, WB_ENOSYS);
    ck_assert_ptr_nonnull(strstr(err.msg, "no CUDA support"));
#endif
    ck_assert_ptr_nonnull(strstr(err.msg, "device 0"));
    ck_assert_ptr_null(m);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("container_records");
    TCase *tc = tcase_create("records");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, records_are_kept_per_lease_and_listed_per_container);
    tcase_add_test(tc, another_pids_records_are_ignored);
    tcase_add_test(tc, wire_limits_on_records);
    tcase_add_test(tc, wire_checks_container_listing);
    tcase_add_test(tc, cuda_import_without_gpu_is_a_clear_error);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
