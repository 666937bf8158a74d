/* Versions of a model (models.c's registry, ops_version.c, subs.c,
 * broker_versions.c), without sockets: numbering, rollouts loaded inline
 * (no loader thread) that become current, leases that keep their version,
 * draining and freeing, rollback, --max-versions, the fits-beside check,
 * subscriptions and their notices, heartbeat replies' current versions. */
#include "broker_fixture.h"
#include "ops.h"
#include "subs.h"
#include "wire.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void unused_fixture(void) __attribute__((unused));
static void unused_fixture(void)
{
    advance_ms(0);
    (void)shm_name_exists;
    (void)fixture_model;
}

static broker_fixture F;

/* The notices the broker sent, by the fake loop below. */
static uint64_t told[64];
static char told_model[64][64];
static uint32_t told_version[64], told_previous[64];
static size_t n_told;
static int refuse_notices;

static int fake_notify(void *ctx, uint64_t serial, const Wbproto__VersionNotice *n)
{
    (void)ctx;
    if (refuse_notices)
        return WB_ELIMIT;
    told[n_told] = serial;
    snprintf(told_model[n_told], sizeof told_model[0], "%s", n->model);
    told_version[n_told] = n->version;
    told_previous[n_told] = n->previous_version;
    n_told++;
    return WB_OK;
}

static void setup(void)
{
    fixture_open(&F, "versions");
    F.b.notify = fake_notify;
    n_told = 0;
    refuse_notices = 0;
}

static void teardown(void)
{
    fixture_close(&F);
}

/* A checkpoint of one 8-byte U8 tensor "w" whose bytes are `seed`. */
static const char *write_model(const char *file, uint8_t seed)
{
    static const char *const w[] = {"w"};
    return fixture_u8_checkpoint(&F, file, w, 1, seed);
}

/* One request from `serial`'s connection, decoded as a client would. */
static Wbproto__Reply *call_from(uint64_t serial, Wbproto__Request *req)
{
    wb_peer_creds p = me();
    return fixture_send_on(&F, &p, serial, req);
}

static Wbproto__Reply *rollout(const char *name, const char *path)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__RolloutRequest ro = WBPROTO__ROLLOUT_REQUEST__INIT;
    ro.name = (char *)name;
    ro.path = (char *)path;
    req.body_case = WBPROTO__REQUEST__BODY_ROLLOUT;
    req.rollout = &ro;
    return call_from(1, &req);
}

static Wbproto__Reply *rollback(const char *name)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__RollbackRequest rb = WBPROTO__ROLLBACK_REQUEST__INIT;
    rb.name = (char *)name;
    req.body_case = WBPROTO__REQUEST__BODY_ROLLBACK;
    req.rollback = &rb;
    return call_from(1, &req);
}

static Wbproto__Reply *subscribe(uint64_t serial, const char *model, int unsubscribe)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__SubscribeRequest s = WBPROTO__SUBSCRIBE_REQUEST__INIT;
    s.model = (char *)model;
    s.unsubscribe = unsubscribe;
    req.body_case = WBPROTO__REQUEST__BODY_SUBSCRIBE;
    req.subscribe = &s;
    return call_from(serial, &req);
}

static Wbproto__Reply *heartbeat(uint64_t serial)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__HeartbeatRequest h = WBPROTO__HEARTBEAT_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &h;
    return call_from(serial, &req);
}

/* "VERSION:STATE:LEASES ..." of name's records, in registry order. */
static const char *versions(const char *name)
{
    static char buf[256];
    size_t at = 0;
    buf[0] = '\0';
    for (const wb_model *m = F.b.models.head; m; m = m->next) {
        if (strcmp(m->name, name) != 0)
            continue;
        const char *st = m->current ? "current" : wb__model_state_name(m->state);
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%u:%s:%u", at ? " " : "", m->version,
                               st, m->leases);
    }
    return buf;
}

static void load_demo(void)
{
    wb_peer_creds p = me();
    Wbproto__Reply *r = fixture_load(&F, &p, "demo", write_model("v1.safetensors", 1));
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_uint_eq(r->load->model->version, 1);
    ck_assert(r->load->model->current);
}

START_TEST(test_numbering)
{
    wb_model_registry reg = {0};
    ck_assert_uint_eq(wb__models_issue(&reg, "a"), 1);
    wb_model *a1 = wb__model_new("a", "/x", &wb__backend_host, -1);
    wb__models_add(&reg, a1);
    ck_assert_uint_eq(a1->version, 1);
    uint32_t v = wb__models_issue(&reg, "a");
    ck_assert_uint_eq(v, 2);
    wb_model *a2 = wb__model_new("a", "/y", &wb__backend_host, -1);
    wb__models_add(&reg, a2);
    a2->version = a2->issued = v;
    /* Issued numbers are not given again while a record of the name lives,
     * even when the record that had one has gone. */
    wb__models_remove(&reg, a2);
    wb__model_free(&a2);
    ck_assert_uint_eq(wb__models_issue(&reg, "a"), 3);
    ck_assert_uint_eq(wb__models_issue(&reg, "b"), 1);
    ck_assert_uint_eq(wb__models_held(&reg), 1);
    ck_assert_uint_eq(wb__models_versions(&reg, "a"), 1);
    wb__models_clear(&reg);
}
END_TEST

START_TEST(test_rollout_and_leases)
{
    wb_peer_creds p = me();
    load_demo();
    Wbproto__Reply *r = fixture_acquire(&F, &p, "demo");
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->acquire->lease->version, 1);
    uint8_t lease1[16];
    memcpy(lease1, r->acquire->lease->id.data, 16);

    r = rollout("demo", write_model("v2.safetensors", 2));
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_int_eq(r->body_case, WBPROTO__REPLY__BODY_ROLLOUT);
    ck_assert_uint_eq(r->rollout->model->version, 2);
    ck_assert(r->rollout->model->current);
    ck_assert_uint_eq(r->rollout->previous_version, 1);
    ck_assert(r->rollout->current_at > 0);
    ck_assert_str_eq(versions("demo"), "1:draining:1 2:current:0");
    ck_assert_uint_eq(wb__broker_versions_draining(&F.b), 1);
    ck_assert_uint_eq(F.b.stats.rollouts_total, 1);

    /* New leases are on version 2; the lease on version 1 keeps it. */
    r = fixture_acquire(&F, &p, "demo");
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->acquire->lease->version, 2);
    r = fixture_simple(&F, &p, WBPROTO__REQUEST__BODY_LIST_LEASES);
    ck_assert_uint_eq(r->list_leases->n_leases, 2);
    for (size_t i = 0; i < 2; i++) {
        const Wbproto__LeaseInfo *li = r->list_leases->leases[i];
        ck_assert_uint_eq(li->version, memcmp(li->id.data, lease1, 16) == 0 ? 1 : 2);
    }

    /* A load of the name is refused and points to rollout. */
    r = fixture_load(&F, &p, "demo", write_model("v3.safetensors", 3));
    ck_assert_int_eq(r->status, WB_EEXIST);
    ck_assert_str_eq(r->error, "a model named 'demo' already exists (version 2 is current); "
                               "`wbctl rollout demo PATH` loads a new version of it");

    /* A rollback while version 1 exists, and the way forward again. */
    r = rollback("demo");
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_uint_eq(r->rollback->model->version, 1);
    ck_assert_uint_eq(r->rollback->previous_version, 2);
    ck_assert_str_eq(versions("demo"), "1:current:1 2:draining:1");
    ck_assert_uint_eq(F.b.stats.rollbacks_total, 1);

    /* --max-versions 2: a third is refused, naming both. */
    r = rollout("demo", write_model("v3.safetensors", 3));
    ck_assert_int_eq(r->status, WB_ELIMIT);
    ck_assert_str_eq(r->error,
                     "model 'demo' already has 2 versions, the limit (--max-versions 2): version "
                     "1 current (1 lease), version 2 draining (1 lease); a version that is no "
                     "longer current is freed at its last lease (`wbctl leases demo` shows them)");
    ck_assert_uint_eq(F.b.stats.rollouts_failed, 1);

    /* Version 1's release leaves it current; version 2 is freed at its own. */
    r = fixture_release(&F, &p, lease1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_str_eq(versions("demo"), "1:current:0 2:draining:1");
    r = fixture_simple(&F, &p, WBPROTO__REQUEST__BODY_LIST_LEASES);
    ck_assert_uint_eq(r->list_leases->n_leases, 1);
    ck_assert_uint_eq(r->list_leases->leases[0]->version, 2);
    uint8_t lease2[16];
    memcpy(lease2, r->list_leases->leases[0]->id.data, 16);
    r = fixture_release(&F, &p, lease2);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->release->model_state, WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert_str_eq(versions("demo"), "1:current:0");
    r = rollback("demo");
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_str_eq(r->error, "model 'demo' has no version before version 1 left to roll back "
                               "to: a version that is no longer current lives only while "
                               "leases hold it");
    /* Numbers go on from the highest issued. */
    r = rollout("demo", write_model("v3.safetensors", 3));
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_uint_eq(r->rollout->model->version, 3);
    ck_assert_str_eq(versions("demo"), "3:current:0");
}
END_TEST

START_TEST(test_failed_rollout)
{
    wb_peer_creds p = me();
    load_demo();
    Wbproto__Reply *r = rollout("demo", "/nonexistent/v2.safetensors");
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_str_eq(versions("demo"), "1:current:0 2:failed:0");
    r = fixture_acquire(&F, &p, "demo");
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->acquire->lease->version, 1);
    /* The next rollout replaces the failed record. */
    r = rollout("demo", "/nonexistent/v3.safetensors");
    ck_assert_str_eq(versions("demo"), "1:current:1 3:failed:0");
    ck_assert_uint_eq(F.b.stats.rollouts_failed, 2);
    /* No current version: refused, saying why. */
    r = rollout("other", "/x.safetensors");
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_str_eq(r->error, "no model named 'other': a rollout needs a current version (load "
                               "one first with `wbctl load other PATH`)");
    /* An unload ends every version; the leased one drains. */
    r = fixture_unload(&F, &p, "demo");
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_DRAINING);
    ck_assert_str_eq(versions("demo"), "1:draining:1");
    r = rollout("demo", "/x.safetensors");
    ck_assert_int_eq(r->status, WB_ESTATE);
    ck_assert_str_eq(r->error, "model 'demo' has no current version (version 1 is draining): it "
                               "is being unloaded; load it again once it is freed");
}
END_TEST

START_TEST(test_does_not_fit)
{
    static wb_backend tight;
    tight = wb__backend_host;
    load_demo();
    tight.mem_free = fixture_tiny_free;
    F.b.cfg.backend = &tight;
    Wbproto__Reply *r = rollout("demo", write_model("v2.safetensors", 2));
    ck_assert_int_eq(r->status, WB_ENOMEM);
    ck_assert_str_eq(r->error, "rollout of 'demo' (version 2) does not fit beside version 1 in "
                               "host shared memory (/dev/shm): needs 0.00 GB (8 bytes), 0.00 GB "
                               "(4 bytes) free");
    ck_assert_str_eq(versions("demo"), "1:current:0 2:failed:0");
    wb_peer_creds p = me();
    r = fixture_load(&F, &p, "new", write_model("n.safetensors", 4));
    ck_assert_int_eq(r->status, WB_ENOMEM);
    ck_assert_str_eq(r->error, "load of 'new' does not fit in host shared memory (/dev/shm): "
                               "needs 0.00 GB (8 bytes), 0.00 GB (4 bytes) free");
    F.b.cfg.backend = &wb__backend_host;
}
END_TEST

START_TEST(test_subscriptions)
{
    /* The model need not exist. */
    Wbproto__Reply *r = subscribe(7, "demo", 0);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->subscribe->version, 0);
    r = subscribe(8, "other", 0);
    ck_assert_int_eq(r->status, 0);
    load_demo();
    /* The first version becoming current is told too. */
    ck_assert_uint_eq(n_told, 1);
    ck_assert_uint_eq(told[0], 7);
    ck_assert_str_eq(told_model[0], "demo");
    ck_assert_uint_eq(told_version[0], 1);
    ck_assert_uint_eq(told_previous[0], 0);
    r = subscribe(9, "demo", 0);
    ck_assert_uint_eq(r->subscribe->version, 1);
    r = rollout("demo", write_model("v2.safetensors", 2));
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(n_told, 3);
    ck_assert_uint_eq(told[1], 7);
    ck_assert_uint_eq(told[2], 9);
    ck_assert_uint_eq(told_version[2], 2);
    ck_assert_uint_eq(told_previous[2], 1);
    ck_assert_uint_eq(F.b.stats.notices_sent, 3);

    /* Heartbeat replies carry the current versions of the subscriptions;
     * a connection without any gets none. */
    r = heartbeat(9);
    ck_assert_uint_eq(r->heartbeat->n_current_versions, 1);
    ck_assert_str_eq(r->heartbeat->current_versions[0]->model, "demo");
    ck_assert_uint_eq(r->heartbeat->current_versions[0]->version, 2);
    r = heartbeat(8);
    ck_assert_uint_eq(r->heartbeat->n_current_versions, 1);
    ck_assert_uint_eq(r->heartbeat->current_versions[0]->version, 0);
    r = heartbeat(5);
    ck_assert_uint_eq(r->heartbeat->n_current_versions, 0);

    /* Dropped notices are counted; unsubscribed and closed connections are
     * told nothing. */
    refuse_notices = 1;
    wb__subs_drop_conn(&F.b.subs, 7);
    r = subscribe(9, "demo", 1);
    ck_assert_int_eq(r->status, 0);
    r = subscribe(10, "demo", 0);
    r = rollout("demo", write_model("v3.safetensors", 3));
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_uint_eq(F.b.stats.notices_dropped, 1);
    ck_assert_uint_eq(n_told, 3);

    /* At most WB_MAX_SUBSCRIPTIONS a connection. */
    char name[32];
    for (int i = 0; i < WB_MAX_SUBSCRIPTIONS; i++) {
        snprintf(name, sizeof name, "m%d", i);
        r = subscribe(11, name, 0);
        ck_assert_int_eq(r->status, 0);
    }
    r = subscribe(11, "m0", 0);
    ck_assert_int_eq(r->status, 0);
    r = subscribe(11, "one-more", 0);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    ck_assert_str_eq(r->error, "this connection is subscribed to 64 models already, the most one "
                               "connection may be (unsubscribe from one first)");
    r = subscribe(11, "bad name", 0);
    ck_assert_int_eq(r->status, WB_EINVAL);
}
END_TEST

/* A heartbeat whose record of a container shows more swaps than before
 * (on its lease, or a container new to the lease with swaps) is one swap:
 * counted once, with its time in the histogram; the listing shows it. */
static Wbproto__Reply *beat_swaps(const uint8_t *lease, uint32_t swaps, double ms)
{
    Wbproto__ContainerRecord rec = WBPROTO__CONTAINER_RECORD__INIT, *recs[1] = {&rec};
    rec.container_id = 42;
    rec.aoti_api = "AOTInductorModelContainerCreateWithDevice";
    rec.swaps = swaps;
    rec.last_swap_ms = ms;
    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT, *beats[1] = {&beat};
    beat.lease_id.data = (uint8_t *)lease;
    beat.lease_id.len = 16;
    beat.containers = 1;
    beat.n_container_records = 1;
    beat.container_records = recs;
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 1;
    hb.leases = beats;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    return call_from(3, &req);
}

START_TEST(test_swaps)
{
    wb_peer_creds p = me();
    load_demo();
    Wbproto__Reply *r = fixture_acquire(&F, &p, "demo");
    uint8_t lease[16];
    memcpy(lease, r->acquire->lease->id.data, 16);
    r = beat_swaps(lease, 0, 0);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(F.b.stats.container_swaps, 0);
    r = beat_swaps(lease, 1, 12.5);
    ck_assert_int_eq(r->status, 0);
    r = beat_swaps(lease, 1, 12.5);
    ck_assert_uint_eq(F.b.stats.container_swaps, 1);
    /* 12.5 ms: the bucket up to 50 ms (the fourth). */
    ck_assert_uint_eq(F.b.stats.swap_buckets[3], 1);
    ck_assert(F.b.stats.swap_seconds_sum > 0.0124 && F.b.stats.swap_seconds_sum < 0.0126);
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
    req.list_containers = &lc;
    r = call_from(3, &req);
    ck_assert_uint_eq(r->list_containers->n_containers, 1);
    ck_assert_uint_eq(r->list_containers->containers[0]->swaps, 1);
    ck_assert(r->list_containers->containers[0]->last_swap_ms == 12.5);
    ck_assert_uint_eq(r->list_containers->containers[0]->leases[0]->version, 1);
}
END_TEST

/* The wire checks of the new bodies: a notice is unsolicited (id and status
 * 0) and names a model; a record's last swap time is a number of ms. */
START_TEST(test_wire_checks)
{
    Wbproto__VersionNotice n = WBPROTO__VERSION_NOTICE__INIT;
    n.model = "demo";
    n.version = 2;
    n.previous_version = 1;
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.body_case = WBPROTO__REPLY__BODY_NOTICE;
    rep.notice = &n;
    size_t len;
    Wbproto__Reply *out = NULL;
    wb_err err;
    uint8_t *buf = wb__reply_pack(&rep, &len);
    ck_assert_int_eq(wb__reply_decode(buf, len, &out, &err), WB_OK);
    ck_assert_str_eq(out->notice->model, "demo");
    wb__reply_free(&out);
    free(buf);
    rep.id = 5;
    buf = wb__reply_pack(&rep, &len);
    ck_assert_int_eq(wb__reply_decode(buf, len, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "a notice has id 5 and status 0, not 0 and 0");
    free(buf);
    rep.id = 0;
    n.model = "";
    buf = wb__reply_pack(&rep, &len);
    ck_assert_int_eq(wb__reply_decode(buf, len, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "notice.model is empty");
    free(buf);

    Wbproto__ContainerRecord rec = WBPROTO__CONTAINER_RECORD__INIT, *recs[1] = {&rec};
    rec.container_id = 1;
    rec.aoti_api = "AOTInductorModelContainerCreateWithDevice";
    rec.swaps = 1;
    rec.last_swap_ms = -1;
    uint8_t id[16] = {1};
    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT, *beats[1] = {&beat};
    beat.lease_id.data = id;
    beat.lease_id.len = 16;
    beat.containers = 1;
    beat.n_container_records = 1;
    beat.container_records = recs;
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 1;
    hb.leases = beats;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.version = WB_PROTOCOL_VERSION;
    req.id = 3;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    Wbproto__Request *rq = NULL;
    uint64_t rid;
    buf = wb__request_pack(&req, &len);
    ck_assert_int_eq(wb__request_decode(buf, len, &rq, &rid, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "heartbeat.leases[0].container_records[0].last_swap_ms is -1, not a "
                              "number of milliseconds from 0 to 8.64e+07");
    free(buf);
    rec.last_swap_ms = 12.5;
    buf = wb__request_pack(&req, &len);
    ck_assert_int_eq(wb__request_decode(buf, len, &rq, &rid, &err), WB_OK);
    wb__request_free(&rq);
    free(buf);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("versions");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_numbering);
    tcase_add_test(tc, test_rollout_and_leases);
    tcase_add_test(tc, test_failed_rollout);
    tcase_add_test(tc, test_does_not_fit);
    tcase_add_test(tc, test_subscriptions);
    tcase_add_test(tc, test_wire_checks);
    tcase_add_test(tc, test_swaps);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
