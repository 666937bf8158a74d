/* Test fixture shared by the broker's unit tests: a broker state with a fake
 * clock, ready models built by hand on real host slabs (no checkpoint files,
 * no loader), and for the tests that load real files (test_auth, test_quota)
 * a broker with a scratch directory and request helpers. */
#ifndef WB_TEST_BROKER_FIXTURE_H
#define WB_TEST_BROKER_FIXTURE_H

#include "broker.h"
#include "ops.h"
#include "wire.h"

#include <check.h>
#include <xxhash.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int64_t fake_ms;
static double fake_wall = 1700000000.0;

static int64_t fake_now_ms(void)
{
    return fake_ms;
}

static double fake_now_wall(void)
{
    return fake_wall + (double)fake_ms / 1000.0;
}

/* Moves the fake clocks forward. */
static void advance_ms(int64_t ms)
{
    fake_ms += ms;
}

static void fixture_broker(wb_broker *b, uint32_t heartbeat_ms, uint32_t stale_ms)
{
    wb_broker_config cfg = {
        .backend = &wb__backend_host,
        .device = -1,
        .heartbeat_ms = heartbeat_ms,
        .stale_ms = stale_ms,
    };
    fake_ms = 1000;
    wb__broker_init(b, &cfg);
    b->now_ms = fake_now_ms;
    b->now_wall = fake_now_wall;
    b->started_ms = fake_ms;
}

/* Adds a ready model with two F32 tensors ("a": 3 floats, "b": 2x2 floats)
 * in one host slab. Returns the model (owned by the registry). */
static wb_model *fixture_model_on(wb_broker *b, const char *name, const wb_backend *be)
{
    wb_err err;
    wb_model *m = wb__model_new(name, "/models/fixture.safetensors", be, -1);
    ck_assert_ptr_nonnull(m);
    wb_model_data d;
    memset(&d, 0, sizeof d);
    d.n_slabs = 1;
    d.slabs = calloc(1, sizeof *d.slabs);
    ck_assert_int_eq(be->slab_alloc(&d.slabs[0], -1, 256 + 16, &err), WB_OK);
    d.slab_bytes = d.slabs[0].size;
    d.n_tensors = 2;
    d.tensors = calloc(2, sizeof *d.tensors);
    const char *names[2] = {"a", "b"};
    const uint64_t offsets[2] = {0, 256}, nbytes[2] = {12, 16};
    /* Listed b, then a (not in name order, as a checkpoint may be):
     * leases sort them. */
    for (int k = 0; k < 2; k++) {
        int i = 1 - k;
        wb_model_tensor *t = &d.tensors[k];
        t->name = strdup(names[i]);
        strcpy(t->dtype, "F32");
        t->ndim = (uint32_t)(i + 1);
        t->shape = malloc(2 * sizeof *t->shape);
        t->shape[0] = i == 0 ? 3 : 2;
        t->shape[1] = 2;
        t->offset = offsets[i];
        t->nbytes = nbytes[i];
        uint8_t *p = (uint8_t *)d.slabs[0].shm.addr + t->offset;
        for (uint64_t j = 0; j < t->nbytes; j++)
            p[j] = (uint8_t)(j + 1 + 10 * i);
        t->xxh3 = XXH3_64bits(p, t->nbytes);
        d.bytes += t->nbytes;
    }
    if (be->slab_seal)
        ck_assert_int_eq(be->slab_seal(&d.slabs[0], &err), WB_OK);
    ck_assert_int_eq(wb__model_adopt(m, &d, &err), WB_OK);
    wb__models_add(&b->models, m);
    return m;
}

static wb_model *fixture_model(wb_broker *b, const char *name)
{
    return fixture_model_on(b, name, &wb__backend_host);
}

/* A device-like backend for a model with copies on two devices: slabs in
 * host memory standing in for device memory (a fake; nothing is exported to
 * any GPU). */
static inline int twin_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    (void)err;
    memset(slab, 0, sizeof *slab);
    slab->dev_ptr = calloc(1, size);
    slab->size = size;
    slab->device = device;
    return WB_OK;
}

static inline void twin_export(wb_slab *slab, Wbproto__Slab *out)
{
    wbproto__slab__init(out);
    out->backend = WBPROTO__BACKEND__BACKEND_CUDA;
    out->device = slab->device;
    out->size = slab->size;
    memset(slab->ipc_handle, slab->device + 1, sizeof slab->ipc_handle);
    out->cuda_ipc_handle.data = slab->ipc_handle;
    out->cuda_ipc_handle.len = sizeof slab->ipc_handle;
    out->transport = "cuda-ipc";
}

static inline void twin_free(wb_slab *slab)
{
    free(slab->dev_ptr);
    slab->dev_ptr = NULL;
}

static inline const wb_backend *fixture_twin_backend(void)
{
    static const wb_backend be = {.name = "twin",
                                  .proto = WBPROTO__BACKEND__BACKEND_CUDA,
                                  .slab_alloc = twin_alloc,
                                  .slab_export = twin_export,
                                  .slab_free = twin_free,
                                  .transport = "cuda-ipc",
                                  .access = "rw"};
    return &be;
}

#define UUID0 "GPU-00000000-1111-2222-3333-444444444444"
#define UUID1 "GPU-11111111-1111-2222-3333-444444444444"
#define UUID2 "GPU-22222222-1111-2222-3333-444444444444"

/* Adds model `name` on backend `be` (twin-like): copies ready on devices 0
 * and 1 (256-byte slabs), failed on device 2; one 8-byte tensor "w". */
static inline wb_model *fixture_twin_model_on(wb_broker *b, const char *name, const wb_backend *be)
{
    wb_err err;
    static const int devs[] = {0, 1, 2};
    wb_model *m = wb__model_new(name, "/models/twin.safetensors", be, 0);
    ck_assert_ptr_nonnull(m);
    wb__model_set_devices(m, devs, 3);
    wb_model_data d;
    memset(&d, 0, sizeof d);
    d.n_slabs = d.n_copies = 3;
    d.slabs = calloc(3, sizeof *d.slabs);
    d.copies = calloc(3, sizeof *d.copies);
    const char *uuids[3] = {UUID0, UUID1, UUID2};
    for (int k = 0; k < 3; k++) {
        d.copies[k].device = k;
        strcpy(d.copies[k].uuid, uuids[k]);
        d.copies[k].state =
            k < 2 ? WBPROTO__MODEL_STATE__MODEL_READY : WBPROTO__MODEL_STATE__MODEL_FAILED;
        if (k < 2)
            twin_alloc(&d.slabs[k], k, 256, &err);
    }
    strcpy(d.copies[2].error, "cudaMalloc of 256 bytes on device 2: out of memory");
    d.n_tensors = 1;
    d.tensors = calloc(1, sizeof *d.tensors);
    d.tensors[0].name = strdup("w");
    strcpy(d.tensors[0].dtype, "U8");
    d.tensors[0].ndim = 1;
    d.tensors[0].shape = malloc(sizeof *d.tensors[0].shape);
    d.tensors[0].shape[0] = 8;
    d.tensors[0].nbytes = 8;
    d.bytes = 8;
    ck_assert_int_eq(wb__model_adopt(m, &d, &err), WB_OK);
    wb__models_add(&b->models, m);
    return m;
}

/* Model "twin" on the twin backend. */
static inline wb_model *fixture_twin_model(wb_broker *b)
{
    return fixture_twin_model_on(b, "twin", fixture_twin_backend());
}

/* A backend's mem_free whose memory is nearly all taken: 4 bytes free. */
static inline int fixture_tiny_free(const wb_backend *be, int device, uint64_t *bytes, char *where,
                                    size_t where_len, wb_err *err)
{
    (void)be;
    (void)device;
    (void)err;
    *bytes = 4;
    snprintf(where, where_len, "host shared memory (/dev/shm)");
    return WB_OK;
}

static int shm_name_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

static wb_peer_creds creds(uint32_t uid, uint32_t gid, uint32_t pid)
{
    wb_peer_creds c = {.known = 1, .uid = uid, .gid = gid, .pid = pid};
    return c;
}

/* This test process as a peer. */
static inline wb_peer_creds me(void)
{
    return creds((uint32_t)geteuid(), (uint32_t)getegid(), (uint32_t)getpid());
}

/* A broker, the last reply as a client decoded it with what came beside it,
 * and a scratch directory under /tmp, removed with everything in it at the
 * end. */
typedef struct broker_fixture {
    wb_broker b;
    Wbproto__Reply *decoded;
    size_t reply_len;  /* bytes of the last reply's message */
    const void *frame; /* the last reply's second frame, or NULL */
    size_t frame_len;
    char dir[64];
    uint64_t next_id;
    uint8_t ident[2]; /* the connection identity requests come from */
} broker_fixture;

/* Handles one request on the broker in a reply context of its own, as the
 * loop does, checks that the reply answers it, and returns the reply as a
 * client would decode it: packed and decoded again into f->decoded, whose
 * previous reply is freed. The reply's length and frame are kept in f; the
 * context is freed. */
static inline Wbproto__Reply *fixture_call_from(broker_fixture *f, const wb_peer_creds *peer,
                                                const Wbproto__Request *req, const void *ident,
                                                size_t ident_len)
{
    wb_ops_reply r = WB_OPS_REPLY_INIT;
    ck_assert_int_eq(wb__ops_handle(&f->b, peer, req, ident, ident_len, &r), 0);
    ck_assert_uint_eq(r.msg.id, req->id);
    ck_assert_uint_eq(r.msg.version, WB_PROTOCOL_VERSION);
    size_t len;
    uint8_t *buf = wb__reply_pack(&r.msg, &len);
    ck_assert_ptr_nonnull(buf);
    f->reply_len = len;
    f->frame = r.frame;
    f->frame_len = r.frame_len;
    wb__reply_free(&f->decoded);
    wb_err err;
    ck_assert_msg(wb__reply_decode(buf, len, &f->decoded, &err) == WB_OK, "reply: %s", err.msg);
    free(buf);
    wb__ops_reply_free(&r);
    return f->decoded;
}

/* fixture_call_from on the fixture's own connection identity. */
static inline Wbproto__Reply *fixture_call(broker_fixture *f, const wb_peer_creds *peer,
                                           const Wbproto__Request *req)
{
    return fixture_call_from(f, peer, req, f->ident, sizeof f->ident);
}

/* Sets up a broker (heartbeat 200 ms, stale after 1000 ms) and makes
 * /tmp/wbtest-TAG-XXXXXX. */
static inline void fixture_open(broker_fixture *f, const char *tag)
{
    memset(f, 0, sizeof *f);
    fixture_broker(&f->b, 200, 1000);
    snprintf(f->dir, sizeof f->dir, "/tmp/wbtest-%s-XXXXXX", tag);
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    f->ident[1] = (uint8_t)tag[0];
}

static inline void fixture_close(broker_fixture *f)
{
    wb__reply_free(&f->decoded);
    wb__broker_destroy(&f->b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Sends one request from `peer` on the connection whose serial (an 8-byte
 * identity, as the loop's) is `serial`, with the next request id. */
static inline Wbproto__Reply *fixture_send_on(broker_fixture *f, const wb_peer_creds *peer,
                                              uint64_t serial, Wbproto__Request *req)
{
    req->version = WB_PROTOCOL_VERSION;
    req->id = ++f->next_id;
    return fixture_call_from(f, peer, req, &serial, sizeof serial);
}

/* A checkpoint f->dir/file of n U8 tensors of 8 bytes each, named by
 * `names`, every byte `seed`; its path (static: the next call replaces
 * it). */
static inline const char *fixture_u8_checkpoint(broker_fixture *f, const char *file,
                                                const char *const *names, size_t n, uint8_t seed)
{
    static char path[256];
    char hdr[512];
    size_t at = 0;
    ck_assert_uint_le(n, 8);
    at += (size_t)snprintf(hdr + at, sizeof hdr - at, "{");
    for (size_t i = 0; i < n; i++)
        at +=
            (size_t)snprintf(hdr + at, sizeof hdr - at,
                             "%s\"%s\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", names[i], 8 * i, 8 * i + 8);
    at += (size_t)snprintf(hdr + at, sizeof hdr - at, "}");
    ck_assert_uint_lt(at, sizeof hdr - 8);
    size_t hl = (at + 7) & ~(size_t)7;
    memset(hdr + at, ' ', hl - at);
    snprintf(path, sizeof path, "%s/%s", f->dir, file);
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    uint64_t len = hl;
    fwrite(&len, 8, 1, fp);
    fwrite(hdr, 1, hl, fp);
    uint8_t data[64];
    memset(data, seed, sizeof data);
    fwrite(data, 1, 8 * n, fp);
    fclose(fp);
    return path;
}

/* Sends one request from `peer` with the next request id (fixture_call). */
static inline Wbproto__Reply *fixture_send(broker_fixture *f, const wb_peer_creds *peer,
                                           Wbproto__Request *req)
{
    req->version = WB_PROTOCOL_VERSION;
    req->id = ++f->next_id;
    return fixture_call(f, peer, req);
}

/* A request whose body has no fields: hello, a listing of leases or
 * models, or (any other `body`) the counters. */
static inline Wbproto__Reply *fixture_simple(broker_fixture *f, const wb_peer_creds *peer, int body)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__HelloRequest h = WBPROTO__HELLO_REQUEST__INIT;
    Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
    Wbproto__ListModelsRequest lm = WBPROTO__LIST_MODELS_REQUEST__INIT;
    Wbproto__StatsRequest st = WBPROTO__STATS_REQUEST__INIT;
    req.body_case = body;
    switch (body) {
    case WBPROTO__REQUEST__BODY_HELLO:
        h.client = "unit test";
        req.hello = &h;
        break;
    case WBPROTO__REQUEST__BODY_LIST_LEASES:
        req.list_leases = &ll;
        break;
    case WBPROTO__REQUEST__BODY_LIST_MODELS:
        req.list_models = &lm;
        break;
    default:
        req.body_case = WBPROTO__REQUEST__BODY_STATS;
        req.stats = &st;
        break;
    }
    return fixture_send(f, peer, &req);
}

static inline Wbproto__Reply *fixture_acquire(broker_fixture *f, const wb_peer_creds *peer,
                                              const char *model)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__AcquireRequest a = WBPROTO__ACQUIRE_REQUEST__INIT;
    a.model = (char *)model;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &a;
    return fixture_send(f, peer, &req);
}

static inline Wbproto__Reply *fixture_release(broker_fixture *f, const wb_peer_creds *peer,
                                              const uint8_t *lease_id)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__ReleaseRequest r = WBPROTO__RELEASE_REQUEST__INIT;
    r.lease_id.data = (uint8_t *)lease_id;
    r.lease_id.len = WB_LEASE_ID_LEN;
    req.body_case = WBPROTO__REQUEST__BODY_RELEASE;
    req.release = &r;
    return fixture_send(f, peer, &req);
}

static inline Wbproto__Reply *fixture_load(broker_fixture *f, const wb_peer_creds *peer,
                                           const char *name, const char *path)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__LoadRequest l = WBPROTO__LOAD_REQUEST__INIT;
    l.name = (char *)name;
    l.path = (char *)path;
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &l;
    return fixture_send(f, peer, &req);
}

static inline Wbproto__Reply *fixture_unload(broker_fixture *f, const wb_peer_creds *peer,
                                             const char *name)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__UnloadRequest u = WBPROTO__UNLOAD_REQUEST__INIT;
    u.name = (char *)name;
    req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    req.unload = &u;
    return fixture_send(f, peer, &req);
}

#endif
