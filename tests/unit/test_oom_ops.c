/* Out of memory in the broker's request handlers (oom.h): each request
 * (hello, acquire in every table form, release, heartbeat with records,
 * the listings, stats, an inline load, unloads) handled with each
 * allocation failing in turn, on a broker set up afresh each time. A
 * failed request is a WB_ENOMEM reply that packs and decodes, and the
 * broker is as it was (leases, peers, models, record accounting, slabs in
 * /dev/shm); a request that succeeds made its whole change. */
#include "broker_fixture.h"
#include "oom.h"
#include "ops.h"
#include "tensor_table.h"
#include "wire.h"

#include <check.h>

#include <dirent.h>
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

/* What a failed request must leave as it was. */
typedef struct snapshot {
    size_t n_leases, n_peers, n_holders, n_models, shm;
    uint64_t record_bytes, peer_record_bytes;
    char models[512];     /* "name:state:leases " for each */
    uint32_t records[64]; /* n_records of each lease, in id order */
} snapshot;

/* This process's slab and table objects in /dev/shm. */
static size_t my_shm(void)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "wb-%d-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    ck_assert_ptr_nonnull(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void take(const wb_broker *b, snapshot *s)
{
    memset(s, 0, sizeof *s);
    const wb_lease_table *t = &b->leases;
    s->n_leases = t->n_leases;
    s->n_peers = t->n_peers;
    s->n_holders = t->n_holders;
    for (size_t i = 0; i < t->n_leases; i++) {
        s->record_bytes += t->leases[i]->record_bytes;
        if (i < 64)
            s->records[i] = t->leases[i]->n_records;
        /* A lease's records are there or not, with their bytes. */
        ck_assert_int_eq(t->leases[i]->records != NULL, t->leases[i]->n_records > 0);
        ck_assert_int_eq(t->leases[i]->records != NULL, t->leases[i]->record_bytes > 0);
    }
    for (size_t i = 0; i < t->n_peers; i++)
        s->peer_record_bytes += t->peers[i]->record_bytes;
    /* The peers' record quotas count what their leases keep, no more. */
    ck_assert_uint_eq(s->peer_record_bytes, s->record_bytes);
    size_t off = 0;
    for (const wb_model *m = b->models.head; m; m = m->next) {
        s->n_models++;
        uint32_t copies = 0;
        for (uint32_t c = 0; c < m->data.n_copies; c++)
            copies += m->data.copies[c].leases;
        if (m->data.n_copies)
            ck_assert_uint_eq(copies, m->leases);
        off += (size_t)snprintf(s->models + off, sizeof s->models - off, "%s:%d:%u ", m->name,
                                m->state, m->leases);
        ck_assert_uint_lt(off, sizeof s->models);
    }
    s->shm = my_shm();
}

static void same(const snapshot *a, const snapshot *b)
{
    ck_assert_uint_eq(a->n_leases, b->n_leases);
    ck_assert_uint_eq(a->n_peers, b->n_peers);
    ck_assert_uint_eq(a->n_holders, b->n_holders);
    ck_assert_uint_eq(a->n_models, b->n_models);
    ck_assert_uint_eq(a->record_bytes, b->record_bytes);
    ck_assert_str_eq(a->models, b->models);
    ck_assert_int_eq(memcmp(a->records, b->records, sizeof a->records), 0);
    ck_assert_uint_eq(a->shm, b->shm);
}

typedef struct ops_case ops_case;
struct ops_case {
    const char *name;
    void (*prepare)(ops_case *c); /* the broker's state before the request */
    void (*request)(ops_case *c); /* fills c->req */
    void (*check)(ops_case *c);   /* the whole change of a success */
    int failed_is_kept;           /* a failed load is kept as MODEL_FAILED */
    wb_broker b;
    wb_peer_creds peer;
    uint8_t lease[2][WB_LEASE_ID_LEN];
    Wbproto__Request req;
    /* Storage the requests point to. */
    Wbproto__HelloRequest hello;
    Wbproto__AcquireRequest acquire;
    Wbproto__ReleaseRequest release;
    Wbproto__HeartbeatRequest heartbeat;
    Wbproto__LeaseBeat beat[3], *beats[3];
    Wbproto__ContainerRecord rec[2], *recs[2];
    Wbproto__ListLeasesRequest list_leases;
    Wbproto__ListModelsRequest list_models;
    Wbproto__ListContainersRequest list_containers;
    Wbproto__StatsRequest stats;
    Wbproto__LoadRequest load;
    Wbproto__UnloadRequest unload;
    Wbproto__RollbackRequest rollback;
    uint8_t digest[16];
    snapshot before;
    wb_ops_reply r;
    Wbproto__Reply *decoded;
    int handled;
};

static const char *data_path(const char *rel)
{
    static char buf[1024];
    const char *dir = getenv("WB_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/%s", dir && *dir ? dir : "tests/data", rel);
    return buf;
}

/* Handles a request outside the loop (hook off), as the setup of a case. */
static Wbproto__Reply *direct(ops_case *c, Wbproto__Request *req)
{
    static Wbproto__Reply *last;
    wb__reply_free(&last);
    req->version = WB_PROTOCOL_VERSION;
    req->id = 1;
    uint8_t ident[2] = {0, 'o'};
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    ck_assert_int_eq(wb__ops_handle(&c->b, &c->peer, req, ident, sizeof ident, &r), 0);
    size_t len;
    uint8_t *buf = wb__reply_pack(&r.msg, &len);
    wb_err err;
    ck_assert_int_eq(wb__reply_decode(buf, len, &last, &err), WB_OK);
    free(buf);
    wb__ops_reply_free(&r);
    return last;
}

static void grant(ops_case *c, const char *model, uint8_t id[WB_LEASE_ID_LEN])
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__AcquireRequest a = WBPROTO__ACQUIRE_REQUEST__INIT;
    a.model = (char *)model;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &a;
    Wbproto__Reply *r = direct(c, &req);
    ck_assert_int_eq(r->status, 0);
    memcpy(id, r->acquire->lease->id.data, WB_LEASE_ID_LEN);
}

static void fill_heartbeat(ops_case *c, int with_unknown)
{
    for (int i = 0; i < 2; i++) {
        wbproto__container_record__init(&c->rec[i]);
        c->rec[i].container_id = (uint64_t)i + 1;
        c->rec[i].aoti_api = "CreateWithDevice";
        c->rec[i].model_path = i ? "/models/b.pt2" : "/models/a.pt2";
        c->rec[i].bound_bytes = 12;
        c->recs[i] = &c->rec[i];
    }
    static const uint8_t stranger[WB_LEASE_ID_LEN] = {7, 7, 7, 7, 7, 7, 7, 7,
                                                      7, 7, 7, 7, 7, 7, 7, 7};
    size_t n = with_unknown ? 3 : 2;
    for (size_t i = 0; i < n; i++) {
        wbproto__lease_beat__init(&c->beat[i]);
        c->beat[i].lease_id.data = i < 2 ? c->lease[i] : (uint8_t *)stranger;
        c->beat[i].lease_id.len = WB_LEASE_ID_LEN;
        c->beats[i] = &c->beat[i];
    }
    c->beat[0].containers = 2;
    c->beat[0].n_container_records = 2;
    c->beat[0].container_records = c->recs;
    c->beat[1].containers = 1;
    c->beat[1].n_container_records = 1;
    c->beat[1].container_records = c->recs;
    wbproto__heartbeat_request__init(&c->heartbeat);
    c->heartbeat.n_leases = n;
    c->heartbeat.leases = c->beats;
    wbproto__request__init(&c->req);
    c->req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    c->req.heartbeat = &c->heartbeat;
}

/* Models "demo" (host, two tensors) and "twin" (copies on devices 0 and
 * 1), and two leases of demo held by this process, with records. */
static void prepare_leases(ops_case *c)
{
    fixture_model(&c->b, "demo");
    fixture_twin_model(&c->b);
    grant(c, "demo", c->lease[0]);
    grant(c, "demo", c->lease[1]);
    fill_heartbeat(c, 0);
    Wbproto__Reply *r = direct(c, &c->req);
    ck_assert_int_eq(r->status, 0);
}

static void prepare_models(ops_case *c)
{
    fixture_model(&c->b, "demo");
    fixture_twin_model(&c->b);
}

/* "demo" version 1 draining with a lease, version 2 current. */
static void prepare_versions(ops_case *c)
{
    wb_model *v1 = fixture_model(&c->b, "demo");
    grant(c, "demo", c->lease[0]);
    wb_model *v2 = fixture_model(&c->b, "demo");
    v2->version = v1->issued = v2->issued = 2;
    v1->current = 0;
    v1->state = WBPROTO__MODEL_STATE__MODEL_DRAINING;
}

static void req_rollback(ops_case *c)
{
    wbproto__rollback_request__init(&c->rollback);
    c->rollback.name = "demo";
    c->req.body_case = WBPROTO__REQUEST__BODY_ROLLBACK;
    c->req.rollback = &c->rollback;
}

static void check_rollback(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_ROLLBACK);
    ck_assert_uint_eq(c->decoded->rollback->model->version, 1);
    ck_assert_uint_eq(c->decoded->rollback->previous_version, 2);
    const wb_model *cur = wb__models_current(&c->b.models, "demo");
    ck_assert_ptr_nonnull(cur);
    ck_assert_uint_eq(cur->version, 1);
}

static void prepare_nothing(ops_case *c)
{
    (void)c;
}

static void prepare_failed_record(ops_case *c)
{
    wb_err err;
    ck_assert_int_eq(
        wb__broker_keep_failed(&c->b, "gpt2", "/models/gone.safetensors", "no such file", &err),
        WB_OK);
}

static void req_hello(ops_case *c)
{
    wbproto__hello_request__init(&c->hello);
    c->hello.client = "oom test";
    c->req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    c->req.hello = &c->hello;
}

static void req_acquire(ops_case *c, const char *model)
{
    wbproto__acquire_request__init(&c->acquire);
    c->acquire.model = (char *)model;
    c->req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    c->req.acquire = &c->acquire;
}

static void req_acquire_tensors(ops_case *c)
{
    req_acquire(c, "demo");
}

static void req_acquire_table(ops_case *c)
{
    req_acquire(c, "demo");
    c->acquire.tensor_table = 1;
}

static void req_acquire_frame(ops_case *c)
{
    req_acquire_table(c);
    c->acquire.tensor_table_frame = 1;
}

static void req_acquire_shared(ops_case *c)
{
    req_acquire_table(c);
    c->acquire.tensor_table_shared = 1;
}

static void req_acquire_cached(ops_case *c)
{
    req_acquire_table(c);
    wb_model *m = wb__models_find(&c->b.models, "demo");
    memcpy(c->digest, m->table_digest, sizeof c->digest);
    c->acquire.tensor_table_digest.data = c->digest;
    c->acquire.tensor_table_digest.len = sizeof c->digest;
}

static void req_acquire_twin(ops_case *c)
{
    req_acquire(c, "twin");
    c->acquire.tensor_table = 1;
    c->acquire.device_uuid = UUID1;
}

static void req_release(ops_case *c)
{
    wbproto__release_request__init(&c->release);
    c->release.lease_id.data = c->lease[0];
    c->release.lease_id.len = WB_LEASE_ID_LEN;
    c->req.body_case = WBPROTO__REQUEST__BODY_RELEASE;
    c->req.release = &c->release;
}

static void req_heartbeat(ops_case *c)
{
    fill_heartbeat(c, 1);
    /* Other records than the ones kept: the first lease's second record
     * leaves, the second lease gets both. */
    c->beat[0].containers = 1;
    c->beat[0].n_container_records = 1;
    c->beat[1].containers = 2;
    c->beat[1].n_container_records = 2;
}

static void req_list_leases(ops_case *c)
{
    wbproto__list_leases_request__init(&c->list_leases);
    c->req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
    c->req.list_leases = &c->list_leases;
}

static void req_list_models(ops_case *c)
{
    wbproto__list_models_request__init(&c->list_models);
    c->req.body_case = WBPROTO__REQUEST__BODY_LIST_MODELS;
    c->req.list_models = &c->list_models;
}

static void req_list_containers(ops_case *c)
{
    wbproto__list_containers_request__init(&c->list_containers);
    c->req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
    c->req.list_containers = &c->list_containers;
}

static void req_stats(ops_case *c)
{
    wbproto__stats_request__init(&c->stats);
    c->req.body_case = WBPROTO__REQUEST__BODY_STATS;
    c->req.stats = &c->stats;
}

static void req_load(ops_case *c)
{
    wbproto__load_request__init(&c->load);
    c->load.name = "gpt2";
    c->load.path = (char *)data_path("official/gpt2/model.safetensors");
    c->req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    c->req.load = &c->load;
}

static void req_load_sharded(ops_case *c)
{
    req_load(c);
    c->load.path = (char *)data_path("official/gpt2_sharded/model.safetensors.index.json");
}

static void req_unload(ops_case *c, const char *name)
{
    wbproto__unload_request__init(&c->unload);
    c->unload.name = (char *)name;
    c->req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    c->req.unload = &c->unload;
}

static void req_unload_idle(ops_case *c)
{
    req_unload(c, "twin");
}

static void req_unload_leased(ops_case *c)
{
    req_unload(c, "demo");
}

static void check_hello(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_HELLO);
    ck_assert_uint_eq(c->decoded->hello->peer_pid, c->peer.pid);
    ck_assert_uint_eq(c->decoded->hello->broker_instance, c->b.instance);
}

static void check_acquire(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_ACQUIRE);
    const Wbproto__Lease *l = c->decoded->acquire->lease;
    ck_assert_uint_eq(c->b.leases.n_leases, c->before.n_leases + 1);
    wb_lease_rec *rec = wb__leases_find(&c->b.leases, l->id.data);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(rec->model->name, l->model);
    ck_assert_uint_eq(rec->model->leases, 1 + (strcmp(l->model, "demo") == 0 ? 2 : 0));
    /* The tensors in one form or another: as messages, a table inside or
     * as the second frame, in shared memory, or the one the client has. */
    size_t tensors = l->n_tensors;
    if (l->tensor_table.len)
        tensors = wb__tensor_table_count(l->tensor_table.data);
    if (l->tensor_table_in_frame) {
        ck_assert_ptr_nonnull(c->r.frame);
        tensors = wb__tensor_table_count(c->r.frame);
    }
    if (l->tensor_table_slab && l->tensor_table_slab->shm_name)
        tensors = rec->model->data.n_tensors;
    /* The client's table, or (when that reply could not be made) the
     * table again. */
    if (l->tensor_table_cached)
        tensors = rec->model->data.n_tensors;
    ck_assert_uint_eq(tensors, rec->model->data.n_tensors);
}

static void check_release(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_RELEASE);
    ck_assert_uint_eq(c->b.leases.n_leases, c->before.n_leases - 1);
    ck_assert_ptr_null(wb__leases_find(&c->b.leases, c->lease[0]));
}

static void check_heartbeat(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_HEARTBEAT);
    ck_assert_uint_eq(c->decoded->heartbeat->n_unknown_leases, 1);
    /* Records may be dropped when memory is short (the lease's liveness
     * matters more); those kept are the new ones. */
    wb_lease_rec *l0 = wb__leases_find(&c->b.leases, c->lease[0]);
    wb_lease_rec *l1 = wb__leases_find(&c->b.leases, c->lease[1]);
    ck_assert_uint_le(l0->n_records, 1);
    ck_assert(l1->n_records == 0 || l1->n_records == 2);
    ck_assert_uint_eq(l0->containers, 1);
    ck_assert_uint_eq(l1->containers, 2);
}

static void check_list_leases(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_LIST_LEASES);
    const Wbproto__ListLeasesReply *ll = c->decoded->list_leases;
    ck_assert_uint_eq(ll->n_leases, 2);
    ck_assert_uint_eq(ll->total, 2);
    size_t records = 0;
    for (size_t i = 0; i < ll->n_leases; i++) {
        ck_assert_str_eq(ll->leases[i]->model, "demo");
        records += ll->leases[i]->n_container_records;
    }
    ck_assert_uint_eq(records, 3);
}

static void check_list_models(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_LIST_MODELS);
    const Wbproto__ListModelsReply *lm = c->decoded->list_models;
    ck_assert_uint_eq(lm->n_models, 2);
    ck_assert_str_eq(lm->models[0]->name, "demo");
    ck_assert_str_eq(lm->models[1]->name, "twin");
    ck_assert_uint_eq(lm->models[1]->n_copies, 3);
    ck_assert_str_eq(lm->models[1]->copies[2]->error,
                     "cudaMalloc of 256 bytes on device 2: out of memory");
}

static void check_list_containers(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_LIST_CONTAINERS);
    const Wbproto__ListContainersReply *lc = c->decoded->list_containers;
    ck_assert_uint_eq(lc->n_containers, 2);
    ck_assert_uint_eq(lc->total, 2);
    /* Container 1 binds both leases, container 2 the first. */
    ck_assert_uint_eq(lc->containers[0]->n_leases, 2);
    ck_assert_uint_eq(lc->containers[1]->n_leases, 1);
}

static void check_stats(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_STATS);
    ck_assert_uint_eq(c->decoded->stats->leases_active, 2);
}

static void check_load(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_LOAD);
    ck_assert_str_eq(c->decoded->load->model->name, "gpt2");
    ck_assert_int_eq(c->decoded->load->model->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(c->decoded->load->model->tensors, 28);
    wb_model *m = wb__models_find(&c->b.models, "gpt2");
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(m->data.n_tensors, 28);
    /* Leasable, its table whole. */
    uint8_t id[WB_LEASE_ID_LEN];
    grant(c, "gpt2", id);
}

static void check_unload_idle(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_UNLOAD);
    ck_assert_int_eq(c->decoded->unload->model->state, WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert_ptr_null(wb__models_find(&c->b.models, "twin"));
}

static void check_unload_leased(ops_case *c)
{
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY_UNLOAD);
    ck_assert_int_eq(c->decoded->unload->model->state, WBPROTO__MODEL_STATE__MODEL_DRAINING);
    ck_assert_int_eq(wb__models_find(&c->b.models, "demo")->state,
                     WBPROTO__MODEL_STATE__MODEL_DRAINING);
}

static void setup_case(void *arg)
{
    ops_case *c = arg;
    fixture_broker(&c->b, 200, 1000);
    c->peer = me();
    c->prepare(c);
    wbproto__request__init(&c->req);
    c->request(c);
    c->req.version = WB_PROTOCOL_VERSION;
    c->req.id = 4242;
    take(&c->b, &c->before);
    c->r = (wb_ops_reply)WB_OPS_REPLY_INIT;
}

static int run_case(void *arg)
{
    ops_case *c = arg;
    static const uint8_t ident[2] = {0, 'o'};
    int rc = wb__ops_handle(&c->b, &c->peer, &c->req, ident, sizeof ident, &c->r);
    ck_assert_int_eq(rc, 0);
    return c->r.msg.status;
}

/* The reply as the loop sends it and a client reads it (hook off). */
static void decode_reply(ops_case *c)
{
    ck_assert_uint_eq(c->r.msg.id, 4242);
    size_t len;
    uint8_t *buf = wb__reply_pack(&c->r.msg, &len);
    ck_assert_ptr_nonnull(buf);
    wb_err err;
    ck_assert_msg(wb__reply_decode(buf, len, &c->decoded, &err) == WB_OK, "%s: reply: %s", c->name,
                  err.msg);
    free(buf);
}

static void failed_case(void *arg, int rc)
{
    ops_case *c = arg;
    decode_reply(c);
    ck_assert_msg(rc == WB_ENOMEM, "%s: status %d: %s", c->name, rc, c->decoded->error);
    ck_assert_int_eq(c->decoded->body_case, WBPROTO__REPLY__BODY__NOT_SET);
    ck_assert_ptr_null(c->r.frame);
    ck_assert_ptr_nonnull(strstr(c->decoded->error, "out of memory"));
    snapshot now;
    take(&c->b, &now);
    wb_model *loaded = wb__models_find(&c->b.models, "gpt2");
    if (loaded && loaded->state == WBPROTO__MODEL_STATE__MODEL_READY) {
        /* The load was done, its reply could not be made: the error says
         * that the model is there. */
        ck_assert_msg(strstr(c->decoded->error, "model 'gpt2' is loaded (ready)"), "%s",
                      c->decoded->error);
        return;
    }
    if (c->failed_is_kept) {
        /* The load's failure replaces the failed record, or the load
         * was refused before it began and the record is as it was. */
        wb_model *m = wb__models_find(&c->b.models, "gpt2");
        ck_assert_ptr_nonnull(m);
        ck_assert_int_eq(m->state, WBPROTO__MODEL_STATE__MODEL_FAILED);
        /* (Its error is NULL when even that could not be copied.) */
        ck_assert_msg(!m->error || strstr(m->error, "out of memory") ||
                          strcmp(m->error, "no such file") == 0,
                      "error: %s", m->error);
        ck_assert_uint_eq(now.n_models, c->before.n_models);
        ck_assert_uint_eq(now.shm, c->before.shm);
        return;
    }
    same(&c->before, &now);
}

static void done_case(void *arg)
{
    ops_case *c = arg;
    decode_reply(c);
    ck_assert_msg(c->decoded->status == 0, "%s: %s", c->name, c->decoded->error);
    snapshot now;
    take(&c->b, &now);
    c->check(c);
}

static void teardown_case(void *arg)
{
    ops_case *c = arg;
    wb__reply_free(&c->decoded);
    wb__ops_reply_free(&c->r);
    wb__broker_destroy(&c->b);
    Wbproto__Request none = WBPROTO__REQUEST__INIT;
    direct(c, &none); /* frees the last setup reply */
}

static oom_result oom_case(ops_case *c)
{
    oom_op op = {.name = c->name,
                 .ctx = c,
                 .setup = setup_case,
                 .run = run_case,
                 .failed = failed_case,
                 .done = done_case,
                 .teardown = teardown_case};
    oom_result res = oom_run(&op);
    return res;
}

static ops_case cases[] = {
    {.name = "hello", .prepare = prepare_nothing, .request = req_hello, .check = check_hello},
    {.name = "acquire tensors",
     .prepare = prepare_leases,
     .request = req_acquire_tensors,
     .check = check_acquire},
    {.name = "acquire table",
     .prepare = prepare_leases,
     .request = req_acquire_table,
     .check = check_acquire},
    {.name = "acquire frame",
     .prepare = prepare_leases,
     .request = req_acquire_frame,
     .check = check_acquire},
    {.name = "acquire shared",
     .prepare = prepare_leases,
     .request = req_acquire_shared,
     .check = check_acquire},
    {.name = "acquire cached",
     .prepare = prepare_leases,
     .request = req_acquire_cached,
     .check = check_acquire},
    {.name = "acquire twin",
     .prepare = prepare_models,
     .request = req_acquire_twin,
     .check = check_acquire},
    {.name = "release", .prepare = prepare_leases, .request = req_release, .check = check_release},
    {.name = "heartbeat",
     .prepare = prepare_leases,
     .request = req_heartbeat,
     .check = check_heartbeat},
    {.name = "list leases",
     .prepare = prepare_leases,
     .request = req_list_leases,
     .check = check_list_leases},
    {.name = "list models",
     .prepare = prepare_models,
     .request = req_list_models,
     .check = check_list_models},
    {.name = "list containers",
     .prepare = prepare_leases,
     .request = req_list_containers,
     .check = check_list_containers},
    {.name = "stats", .prepare = prepare_leases, .request = req_stats, .check = check_stats},
    {.name = "load", .prepare = prepare_nothing, .request = req_load, .check = check_load},
    {.name = "load sharded",
     .prepare = prepare_nothing,
     .request = req_load_sharded,
     .check = check_load},
    {.name = "load over a failed record",
     .prepare = prepare_failed_record,
     .request = req_load,
     .check = check_load,
     .failed_is_kept = 1},
    {.name = "unload idle",
     .prepare = prepare_leases,
     .request = req_unload_idle,
     .check = check_unload_idle},
    {.name = "rollback",
     .prepare = prepare_versions,
     .request = req_rollback,
     .check = check_rollback},
    {.name = "unload leased",
     .prepare = prepare_leases,
     .request = req_unload_leased,
     .check = check_unload_leased},
};

#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

START_TEST(test_handler)
{
    wb__alloc_use_for_jansson();
    oom_case(&cases[_i]);
}
END_TEST

/* Every case once more in one process, for the totals. */
START_TEST(test_totals)
{
    wb__alloc_use_for_jansson();
    oom_result total = {0};
    for (int i = 0; i < N_CASES; i++) {
        oom_result res = oom_case(&cases[i]);
        oom_total(&total, &res);
    }
    printf("oom broker handlers: %ld allocation points at %ld sites\n", total.points, total.sites);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("oom_ops");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_handler, 0, N_CASES);
    if (getenv("WB_OOM_TOTALS"))
        tcase_add_test(tc, test_totals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
