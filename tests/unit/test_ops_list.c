/* The listing handlers (ops_list.c), without sockets: leases and models as
 * a client sees them, and the counters. Paging and container records are
 * in test_container_records. */
#include "broker_fixture.h"
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
    fixture_open(&F, "list");
}

static void teardown(void)
{
    fixture_close(&F);
}

static Wbproto__Reply *simple(const wb_peer_creds *peer, int body)
{
    return fixture_simple(&F, peer, body);
}

START_TEST(test_list_leases_and_models)
{
    wb_model *m = fixture_model(&F.b, "demo");
    fixture_model(&F.b, "second");
    wb_peer_creds p = me();
    double t0 = fake_now_wall();
    fixture_acquire(&F, &p, "demo");
    advance_ms(1500);
    ck_assert_uint_eq(wb__broker_scan_stale(&F.b), 1);

    Wbproto__Reply *r = simple(&p, WBPROTO__REQUEST__BODY_LIST_LEASES);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->list_leases->n_leases, 1);
    const Wbproto__LeaseInfo *li = r->list_leases->leases[0];
    ck_assert_str_eq(li->model, "demo");
    ck_assert_uint_eq(li->pid, p.pid);
    ck_assert_uint_eq(li->uid, p.uid);
    ck_assert_uint_eq(li->gid, p.gid);
    ck_assert_str_eq(li->process_name, "test_ops_list");
    ck_assert_int_eq(li->state, WBPROTO__LEASE_STATE__LEASE_STALE);
    ck_assert_uint_eq(li->slabs, 1);
    ck_assert_uint_eq(li->bytes, 28);
    ck_assert_double_eq_tol(li->granted_at, t0, 1e-6);
    ck_assert_double_eq_tol(li->last_heartbeat, t0, 1e-6);

    r = simple(&p, WBPROTO__REQUEST__BODY_LIST_MODELS);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->list_models->n_models, 2);
    const Wbproto__ModelInfo *mi = r->list_models->models[0];
    ck_assert_str_eq(mi->name, "demo");
    ck_assert_str_eq(mi->path, "/models/fixture.safetensors");
    ck_assert_int_eq(mi->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_int_eq(mi->backend, WBPROTO__BACKEND__BACKEND_HOST);
    ck_assert_int_eq(mi->device, -1);
    ck_assert_uint_eq(mi->tensors, 2);
    ck_assert_uint_eq(mi->bytes, 28);
    ck_assert_uint_eq(mi->slab_bytes, m->data.slab_bytes);
    ck_assert_uint_eq(mi->leases, 1);
    ck_assert_str_eq(r->list_models->models[1]->name, "second");
    ck_assert_uint_eq(r->list_models->models[1]->leases, 0);

    /* Loading models are listed as such. */
    wb__models_add(&F.b.models, wb__model_new("later", "/x", &wb__backend_host, -1));
    r = simple(&p, WBPROTO__REQUEST__BODY_LIST_MODELS);
    ck_assert_uint_eq(r->list_models->n_models, 3);
    ck_assert_int_eq(r->list_models->models[2]->state, WBPROTO__MODEL_STATE__MODEL_LOADING);
}
END_TEST

START_TEST(test_stats)
{
    fixture_model(&F.b, "demo");
    wb_model *m2 = fixture_model(&F.b, "two");
    wb_peer_creds p = me();
    uint8_t id[16];
    memcpy(id, fixture_acquire(&F, &p, "demo")->acquire->lease->id.data, 16);
    fixture_acquire(&F, &p, "two");
    fixture_acquire(&F, &p, "two");
    fixture_release(&F, &p, id);
    advance_ms(1001);
    wb__broker_scan_stale(&F.b);
    fixture_acquire(&F, &p, "demo");
    F.b.stats.requests_total = 17;
    F.b.stats.requests_failed = 3;
    F.b.stats.malformed_messages = 2;
    F.b.stats.leases_reclaimed = 4;
    F.b.stats.loads_total = 5;
    F.b.stats.loads_failed = 1;
    F.b.stats.load_bytes_total = 999;
    F.b.stats.load_seconds_total = 1.5;
    advance_ms(2000);

    Wbproto__Reply *r = simple(&p, WBPROTO__REQUEST__BODY_STATS);
    ck_assert_int_eq(r->status, 0);
    const Wbproto__StatsReply *s = r->stats;
    ck_assert_double_eq_tol(s->uptime_seconds, 3.001, 1e-9);
    ck_assert_uint_eq(s->requests_total, 17);
    ck_assert_uint_eq(s->requests_failed, 3);
    ck_assert_uint_eq(s->malformed_messages, 2);
    ck_assert_uint_eq(s->leases_granted, 4);
    ck_assert_uint_eq(s->leases_released, 1);
    ck_assert_uint_eq(s->leases_reclaimed, 4);
    ck_assert_uint_eq(s->leases_active, 1);
    ck_assert_uint_eq(s->leases_stale, 2);
    ck_assert_uint_eq(s->models, 2);
    ck_assert_uint_eq(s->model_bytes, 2 * 28);
    ck_assert_uint_eq(s->loads_total, 5);
    ck_assert_uint_eq(s->loads_failed, 1);
    ck_assert_uint_eq(s->load_bytes_total, 999);
    ck_assert_double_eq(s->load_seconds_total, 1.5);
    ck_assert_uint_eq(s->peers, 1);
    ck_assert_uint_eq(m2->leases, 2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_list");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_list_leases_and_models);
    tcase_add_test(tc, test_stats);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
