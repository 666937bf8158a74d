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
    shm_name_exists("");
}

static broker_fixture F;

static void setup(void)
{
    fixture_open(&F, "records");
}

static void teardown(void)
{
    fixture_close(&F);
}

/* Packs a request, decodes it as the broker would, handles it and decodes
 * the reply as a client would: both decoders see every message. */
static Wbproto__Reply *call(const wb_peer_creds *peer, Wbproto__Request *req)
{
    req->version = WB_PROTOCOL_VERSION;
    req->id = ++F.next_id;
    size_t qlen;
    uint8_t *qbuf = wb__request_pack(req, &qlen);
    Wbproto__Request *dreq = NULL;
    uint64_t id;
    wb_err err;
    ck_assert_msg(wb__request_decode(qbuf, qlen, &dreq, &id, &err) == WB_OK, "request: %s",
                  err.msg);
    free(qbuf);
    Wbproto__Reply *r = fixture_call(&F, peer, dreq);
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
    fixture_model(&F.b, "base");
    fixture_model(&F.b, "head");
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
    wb__leases_remove(&F.b.leases, wb__leases_find(&F.b.leases, ids[0]));
    r = list(1);
    ck_assert_uint_eq(r->list_containers->n_containers, 1);
    ck_assert_uint_eq(r->list_containers->containers[0]->n_leases, 1);
    ck_assert_str_eq(r->list_containers->containers[0]->leases[0]->model, "head");
}
END_TEST

START_TEST(another_pids_records_are_ignored)
{
    fixture_model(&F.b, "base");
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

/* One heartbeat for one lease with the records given. */
static Wbproto__Reply *beat_one(const wb_peer_creds *peer, const uint8_t id[16],
                                uint32_t containers, Wbproto__ContainerRecord **recs, size_t n)
{
    Wbproto__LeaseBeat b0 = WBPROTO__LEASE_BEAT__INIT;
    b0.lease_id.data = (uint8_t *)id;
    b0.lease_id.len = 16;
    b0.containers = containers;
    b0.n_container_records = n;
    b0.container_records = recs;
    Wbproto__LeaseBeat *beats[] = {&b0};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 1;
    hb.leases = beats;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    return call(peer, &req);
}

/* A lease's records that repeat a container id, or outnumber the containers
 * the lease reports, made list_containers write past an array sized from
 * the number of leases. Such a heartbeat is refused whole, naming the field
 * and the lease, and changes nothing. */
START_TEST(inconsistent_records_are_refused)
{
    fixture_model(&F.b, "base");
    wb_peer_creds p = me();
    uint8_t id[16];
    acquire(&p, "base", id);
    char hex[9];
    wb__lease_id_short(id, hex);
    char want[256];

    Wbproto__ContainerRecord r[3], *ptrs[3] = {&r[0], &r[1], &r[2]};
    for (int i = 0; i < 3; i++)
        set_rec(&r[i], 7, "CreateWithDevice", 4, 1);
    advance_ms(100);
    Wbproto__Reply *rep = beat_one(&p, id, 3, ptrs, 3);
    ck_assert_int_eq(rep->status, WB_EPROTO);
    snprintf(want, sizeof want,
             "heartbeat.leases[0].container_records[1].container_id 7 repeats records[0] on "
             "lease %s",
             hex);
    ck_assert_str_eq(rep->error, want);
    /* Nothing applied: no records, not even the liveness. */
    wb_lease_rec *l = wb__leases_find(&F.b.leases, id);
    ck_assert_uint_eq(l->n_records, 0);
    ck_assert_uint_eq(l->containers, 0);
    ck_assert_int_eq(l->last_beat_ms, fake_ms - 100);

    set_rec(&r[1], 8, "CreateWithDevice", 4, 1);
    set_rec(&r[2], 9, "CreateWithDevice", 4, 1);
    rep = beat_one(&p, id, 2, ptrs, 3);
    ck_assert_int_eq(rep->status, WB_EPROTO);
    snprintf(want, sizeof want,
             "heartbeat.leases[0].container_records has 3 records but the lease %s reports 2 "
             "containers",
             hex);
    ck_assert_str_eq(rep->error, want);

    /* Consistent ones are kept, and the listing has one entry per container
     * with exactly the leases it binds. */
    rep = beat_one(&p, id, 3, ptrs, 3);
    ck_assert_int_eq(rep->status, 0);
    rep = list(1);
    ck_assert_int_eq(rep->status, 0);
    ck_assert_uint_eq(rep->list_containers->n_containers, 3);
    ck_assert_uint_eq(rep->list_containers->total, 3);
    for (size_t i = 0; i < 3; i++) {
        ck_assert_uint_eq(rep->list_containers->containers[i]->container_id, 7 + i);
        ck_assert_uint_eq(rep->list_containers->containers[i]->n_leases, 1);
        ck_assert_uint_eq(rep->list_containers->containers[i]->leases_total, 1);
    }
}
END_TEST

/* The same lease twice in one heartbeat would count its records twice. */
START_TEST(repeated_lease_in_heartbeat_is_refused)
{
    fixture_model(&F.b, "base");
    wb_peer_creds p = me();
    uint8_t ids[2][16];
    acquire(&p, "base", ids[0]);
    memcpy(ids[1], ids[0], 16);
    Wbproto__Reply *rep = beat(&p, ids, 0);
    ck_assert_int_eq(rep->status, WB_EPROTO);
    char want[128], hex[9];
    snprintf(want, sizeof want, "heartbeat.leases[1] repeats leases[0] (lease %s)",
             wb__lease_id_short(ids[0], hex));
    ck_assert_str_eq(rep->error, want);
}
END_TEST

/* Record bytes count in the client's quota: a heartbeat that would go over
 * is refused with WB_ELIMIT, and the bytes go when the records or the lease
 * go. */
START_TEST(record_bytes_count_in_the_quota)
{
    fixture_model(&F.b, "base");
    wb_peer_creds p = me();
    uint8_t a[16], b2[16];
    acquire(&p, "base", a);
    acquire(&p, "base", b2);
    Wbproto__ContainerRecord r[WB_MAX_CONTAINER_RECORDS], *ptrs[WB_MAX_CONTAINER_RECORDS];
    static char path[WB_MAX_RECORD_PATH];
    memset(path, 'p', sizeof path - 1);
    for (int i = 0; i < WB_MAX_CONTAINER_RECORDS; i++) {
        set_rec(&r[i], (uint64_t)i, "CreateWithDevice", 4, 1);
        r[i].model_path = path;
        ptrs[i] = &r[i];
    }
    size_t one = WB_MAX_CONTAINER_RECORDS *
                 (sizeof(wb_container_rec) + sizeof "CreateWithDevice" + WB_MAX_RECORD_PATH);
    F.b.limits.max_record_bytes = one + one / 2;
    Wbproto__Reply *rep = beat_one(&p, a, WB_MAX_CONTAINER_RECORDS, ptrs, WB_MAX_CONTAINER_RECORDS);
    ck_assert_int_eq(rep->status, 0);
    const wb_peer_rec *pr = wb__leases_peer(&F.b.leases, p.pid);
    ck_assert_uint_eq(pr->record_bytes, one);
    /* Replacing a lease's records is not counted twice. */
    rep = beat_one(&p, a, WB_MAX_CONTAINER_RECORDS, ptrs, WB_MAX_CONTAINER_RECORDS);
    ck_assert_int_eq(rep->status, 0);
    ck_assert_uint_eq(pr->record_bytes, one);
    /* The second lease's would go over. */
    rep = beat_one(&p, b2, WB_MAX_CONTAINER_RECORDS, ptrs, WB_MAX_CONTAINER_RECORDS);
    ck_assert_int_eq(rep->status, WB_ELIMIT);
    char want[200];
    snprintf(want, sizeof want,
             "pid %u would keep %zu bytes of container records, over the limit of %zu bytes per "
             "client",
             p.pid, 2 * one, one + one / 2);
    ck_assert_str_eq(rep->error, want);
    ck_assert_uint_eq(wb__leases_find(&F.b.leases, b2)->n_records, 0);
    ck_assert_uint_eq(pr->record_bytes, one);
    /* Fewer records on the first lease make room. */
    rep = beat_one(&p, a, 1, ptrs, 1);
    ck_assert_int_eq(rep->status, 0);
    ck_assert_uint_eq(pr->record_bytes, one / WB_MAX_CONTAINER_RECORDS);
    /* A lease that ends takes its bytes along. */
    wb__leases_remove(&F.b.leases, wb__leases_find(&F.b.leases, a));
    ck_assert_uint_eq(pr->record_bytes, 0);
}
END_TEST

/* Pages through a listing; checks that every reply fits the message limit
 * and returns the number of entries seen. */
static size_t list_all(int containers, const wb_peer_creds *viewer, uint32_t limit, size_t *pages)
{
    size_t seen = 0;
    uint32_t offset = 0;
    *pages = 0;
    do {
        Wbproto__Request req = WBPROTO__REQUEST__INIT;
        Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
        Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
        if (containers) {
            lc.offset = offset;
            lc.limit = limit;
            req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
            req.list_containers = &lc;
        } else {
            ll.offset = offset;
            ll.limit = limit;
            req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
            req.list_leases = &ll;
        }
        Wbproto__Reply *rep = call(viewer, &req);
        ck_assert_int_eq(rep->status, 0);
        ck_assert_msg(F.reply_len <= F.b.limits.max_message, "page of %zu bytes over %llu",
                      F.reply_len, (unsigned long long)F.b.limits.max_message);
        size_t n = containers ? rep->list_containers->n_containers : rep->list_leases->n_leases;
        ck_assert_uint_gt(n, 0);
        if (limit)
            ck_assert_uint_le(n, limit);
        seen += n;
        offset = containers ? rep->list_containers->next_offset : rep->list_leases->next_offset;
        if (offset)
            ck_assert_uint_eq(offset, seen);
        (*pages)++;
    } while (offset != 0);
    return seen;
}

/* Whatever clients store, listings stay under the message limit: 64 leases
 * with their records at the bounds make far more than one 4096-byte
 * message, and come back in pages. */
START_TEST(listings_fit_the_message_limit)
{
    fixture_model(&F.b, "base");
    F.b.limits.max_record_bytes = 64u << 20;
    wb_peer_creds p = me();
    enum { LEASES = 64 };
    static uint8_t ids[LEASES][16];
    Wbproto__ContainerRecord r[WB_MAX_CONTAINER_RECORDS], *ptrs[WB_MAX_CONTAINER_RECORDS];
    static char path[WB_MAX_RECORD_PATH];
    memset(path, 'p', sizeof path - 1);
    for (int i = 0; i < WB_MAX_CONTAINER_RECORDS; i++) {
        set_rec(&r[i], (uint64_t)i, "CreateWithDevice", 4, 1);
        r[i].model_path = path;
        ptrs[i] = &r[i];
    }
    for (int k = 0; k < LEASES; k++) {
        acquire(&p, "base", ids[k]);
        /* The same container ids on every lease: one container binding all
         * 64 leases, as a container built on many leases is reported. */
        Wbproto__Reply *rep =
            beat_one(&p, ids[k], WB_MAX_CONTAINER_RECORDS, ptrs, WB_MAX_CONTAINER_RECORDS);
        ck_assert_int_eq(rep->status, 0);
    }
    F.b.limits.max_message = 4096;
    size_t pages;
    ck_assert_uint_eq(list_all(0, &p, 0, &pages), LEASES);
    ck_assert_uint_eq(pages, LEASES);
    ck_assert_uint_eq(list_all(0, &p, 5, &pages), LEASES);
    /* A lease entry too big for a page alone comes without its records. */
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
    req.list_leases = &ll;
    Wbproto__Reply *rep = call(&p, &req);
    ck_assert_uint_eq(rep->list_leases->n_leases, 1);
    ck_assert_uint_eq(rep->list_leases->total, LEASES);
    ck_assert_uint_eq(rep->list_leases->next_offset, 1);
    ck_assert_uint_eq(rep->list_leases->leases[0]->n_container_records, 0);
    ck_assert_uint_eq(rep->list_leases->leases[0]->container_records_total,
                      WB_MAX_CONTAINER_RECORDS);

    /* 16 containers, each on 64 leases: each entry keeps the leases that fit
     * and says how many there are. */
    ck_assert_uint_eq(list_all(1, &p, 0, &pages), WB_MAX_CONTAINER_RECORDS);
    Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
    req.list_containers = &lc;
    rep = call(&p, &req);
    ck_assert_uint_eq(rep->list_containers->total, WB_MAX_CONTAINER_RECORDS);
    const Wbproto__ContainerInfo *ci = rep->list_containers->containers[0];
    ck_assert_uint_eq(ci->leases_total, LEASES);
    ck_assert_uint_lt(ci->n_leases, LEASES);

    /* With the default limit, one page holds everything. */
    F.b.limits.max_message = WB_MAX_MESSAGE;
    ck_assert_uint_eq(list_all(0, &p, 0, &pages), LEASES);
    ck_assert_uint_eq(pages, 1);
    ck_assert_uint_eq(list_all(1, &p, 0, &pages), WB_MAX_CONTAINER_RECORDS);
    ck_assert_uint_eq(pages, 1);
    rep = call(&p, &req);
    ck_assert_uint_eq(rep->list_containers->containers[0]->n_leases, LEASES);
    /* An offset past the end is an empty last page. */
    lc.offset = 1000;
    rep = call(&p, &req);
    ck_assert_int_eq(rep->status, 0);
    ck_assert_uint_eq(rep->list_containers->n_containers, 0);
    ck_assert_uint_eq(rep->list_containers->next_offset, 0);
}
END_TEST

/* Lease ids are whole for their holder and administrators; other peers see
 * the first 4 bytes, in both listings. */
START_TEST(other_peers_see_a_lease_id_prefix)
{
    fixture_model(&F.b, "base");
    wb_peer_creds p = me();
    uint8_t ids[2][16];
    acquire(&p, "base", ids[0]);
    acquire(&p, "base", ids[1]);
    ck_assert_int_eq(beat(&p, ids, 1)->status, 0);
    /* A non-administrator of another uid (clients are open here). */
    wb_peer_creds other = creds(4321, 4321, p.pid + 100000);
    ck_assert(!wb__auth_admin_ok(&F.b.auth, &other));
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
    req.list_leases = &ll;
    Wbproto__Reply *rep = call(&other, &req);
    ck_assert_uint_eq(rep->list_leases->n_leases, 2);
    for (size_t i = 0; i < 2; i++) {
        const ProtobufCBinaryData *id = &rep->list_leases->leases[i]->id;
        ck_assert_uint_eq(id->len, WB_LEASE_ID_PREFIX_LEN);
        ck_assert(memcmp(id->data, ids[0], 4) == 0 || memcmp(id->data, ids[1], 4) == 0);
    }
    Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
    req.list_containers = &lc;
    rep = call(&other, &req);
    ck_assert_uint_eq(rep->list_containers->n_containers, 2);
    ck_assert_uint_eq(rep->list_containers->containers[0]->leases[0]->lease_id.len,
                      WB_LEASE_ID_PREFIX_LEN);
    /* The holder (here also an administrator) sees them whole. */
    req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
    rep = call(&p, &req);
    ck_assert_uint_eq(rep->list_leases->leases[0]->id.len, WB_LEASE_ID_LEN);
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
    enum { N = WB_MAX_CONTAINER_RECORDS + 1 };
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

    b.n_container_records = WB_MAX_CONTAINER_RECORDS;
    ck_assert_int_eq(decode_request(&req, &err), WB_OK);
    b.n_container_records = N;
    ck_assert_int_eq(decode_request(&req, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "heartbeat.leases[0].container_records has 17 container records, "
                              "at most 16");

    /* Strings: an AOTI entry point name and a path, not kilobytes. */
    b.n_container_records = 2;
    char api[WB_MAX_RECORD_API + 1], path[WB_MAX_RECORD_PATH + 1];
    memset(api, 'a', sizeof api - 1);
    api[WB_MAX_RECORD_API] = '\0';
    recs[1].aoti_api = api;
    ck_assert_int_eq(decode_request(&req, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "heartbeat.leases[0].container_records[1].aoti_api has 64 bytes, "
                              "at most 63");
    api[WB_MAX_RECORD_API - 1] = '\0';
    ck_assert_int_eq(decode_request(&req, &err), WB_OK);
    memset(path, '/', sizeof path - 1);
    path[WB_MAX_RECORD_PATH] = '\0';
    recs[0].model_path = path;
    ck_assert_int_eq(decode_request(&req, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "heartbeat.leases[0].container_records[0].model_path has 1024 "
                              "bytes, at most 1023");
    path[WB_MAX_RECORD_PATH - 1] = '\0';
    ck_assert_int_eq(decode_request(&req, &err), WB_OK);
    recs[0].model_path = "/models/variant.pt2";

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
    tcase_add_test(tc, inconsistent_records_are_refused);
    tcase_add_test(tc, repeated_lease_in_heartbeat_is_refused);
    tcase_add_test(tc, record_bytes_count_in_the_quota);
    tcase_add_test(tc, listings_fit_the_message_limit);
    tcase_add_test(tc, other_peers_see_a_lease_id_prefix);
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
