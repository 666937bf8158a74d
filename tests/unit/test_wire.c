/* The wire codec: requests and replies round-trip, and every kind of
 * malformed or out-of-bounds message is refused with the right status and a
 * message that names the field. */
#include "wire.h"

#include "tensor_table.h"

#include <check.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const uint8_t lease_id[WB_LEASE_ID_LEN] = {1, 2,  3,  4,  5,  6,  7,  8,
                                                  9, 10, 11, 12, 13, 14, 15, 16};

/* Packs a request, decodes it and returns the status; *out gets the decoded
 * request on success. */
static int req_roundtrip(const Wbproto__Request *req, Wbproto__Request **out, uint64_t *id,
                         wb_err *err)
{
    size_t len;
    uint8_t *buf = wb__request_pack(req, &len);
    ck_assert_ptr_nonnull(buf);
    int rc = wb__request_decode(buf, len, out, id, err);
    free(buf);
    return rc;
}

static int rep_roundtrip(const Wbproto__Reply *rep, Wbproto__Reply **out, wb_err *err)
{
    size_t len;
    uint8_t *buf = wb__reply_pack(rep, &len);
    ck_assert_ptr_nonnull(buf);
    int rc = wb__reply_decode(buf, len, out, err);
    free(buf);
    return rc;
}

static void init_req(Wbproto__Request *req, uint64_t id)
{
    wbproto__request__init(req);
    req->version = WB_PROTOCOL_VERSION;
    req->id = id;
}

START_TEST(test_request_roundtrip)
{
    Wbproto__Request req, *out;
    uint64_t id;
    wb_err err;

    init_req(&req, 42);
    Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
    acq.model = "llama-3.1_8b.v2";
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &acq;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    ck_assert_uint_eq(id, 42);
    ck_assert_uint_eq(out->id, 42);
    ck_assert_int_eq(out->body_case, WBPROTO__REQUEST__BODY_ACQUIRE);
    ck_assert_str_eq(out->acquire->model, "llama-3.1_8b.v2");
    wb__request_free(&out);
    ck_assert_ptr_null(out);

    Wbproto__LeaseBeat b1 = WBPROTO__LEASE_BEAT__INIT, b2 = WBPROTO__LEASE_BEAT__INIT;
    b1.lease_id.data = (uint8_t *)lease_id;
    b1.lease_id.len = WB_LEASE_ID_LEN;
    b1.containers = 3;
    b2.lease_id = b1.lease_id;
    Wbproto__LeaseBeat *beats[] = {&b1, &b2};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 2;
    hb.leases = beats;
    init_req(&req, UINT64_MAX);
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    ck_assert_uint_eq(id, UINT64_MAX);
    ck_assert_uint_eq(out->heartbeat->n_leases, 2);
    ck_assert_uint_eq(out->heartbeat->leases[0]->containers, 3);
    ck_assert_mem_eq(out->heartbeat->leases[1]->lease_id.data, lease_id, WB_LEASE_ID_LEN);
    wb__request_free(&out);

    /* An empty heartbeat is valid. */
    hb.n_leases = 0;
    hb.leases = NULL;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    ck_assert_uint_eq(out->heartbeat->n_leases, 0);
    wb__request_free(&out);

    /* Bodies without fields still count as set. */
    Wbproto__StatsRequest st = WBPROTO__STATS_REQUEST__INIT;
    init_req(&req, 7);
    req.body_case = WBPROTO__REQUEST__BODY_STATS;
    req.stats = &st;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    ck_assert_int_eq(out->body_case, WBPROTO__REQUEST__BODY_STATS);
    wb__request_free(&out);

    Wbproto__LoadRequest ld = WBPROTO__LOAD_REQUEST__INIT;
    ld.name = "demo";
    ld.path = "/models/demo.safetensors";
    init_req(&req, 8);
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &ld;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    ck_assert_str_eq(out->load->path, "/models/demo.safetensors");
    wb__request_free(&out);

    /* Freeing NULL, or a pointer to NULL, does nothing. */
    wb__request_free(NULL);
    wb__request_free(&out);
}
END_TEST

START_TEST(test_request_size_limits)
{
    Wbproto__Request *out = (Wbproto__Request *)1;
    uint64_t id = 99;
    wb_err err;
    uint8_t byte = 0;
    ck_assert_int_eq(wb__request_decode(&byte, 0, &out, &id, &err), WB_EPROTO);
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(id, 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "empty request"));
    /* The size is checked before a byte is read. */
    ck_assert_int_eq(wb__request_decode(&byte, (size_t)WB_MAX_MESSAGE + 1, &out, &id, &err),
                     WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "67108865 bytes exceeds the limit"));
}
END_TEST

START_TEST(test_request_garbage)
{
    Wbproto__Request *out;
    uint64_t id;
    wb_err err;
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(wb__request_decode(junk, sizeof junk, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "request does not decode as wbproto.Request (11 bytes)");
    ck_assert_uint_eq(id, 0);
    ck_assert_ptr_null(out);

    /* version=1, id=300, then a field with the invalid wire type 7: protobuf-c
     * refuses it, but the id that came before is still recovered. */
    const uint8_t with_id[] = {0x08, 0x01, 0x10, 0xac, 0x02, 0x1f, 0x00};
    ck_assert_int_eq(wb__request_decode(with_id, sizeof with_id, &out, &id, &err), WB_EPROTO);
    ck_assert_uint_eq(id, 300);
    ck_assert_ptr_nonnull(strstr(err.msg, "does not decode as wbproto.Request (7 bytes)"));

    /* A truncated length-delimited field. */
    const uint8_t truncated[] = {0x10, 0x05, 0x5a, 0x10, 0x0a};
    ck_assert_int_eq(wb__request_decode(truncated, sizeof truncated, &out, &id, &err), WB_EPROTO);
    ck_assert_uint_eq(id, 5);
}
END_TEST

START_TEST(test_request_version_and_body)
{
    Wbproto__Request req, *out;
    uint64_t id;
    wb_err err;
    init_req(&req, 11);
    req.version = 2;
    Wbproto__HelloRequest h = WBPROTO__HELLO_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    req.hello = &h;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EVERSION);
    ck_assert_str_eq(err.msg, "protocol version 2, this broker speaks 1");
    ck_assert_uint_eq(id, 11);
    ck_assert_ptr_null(out);

    /* A missing version reads as 0. */
    req.version = 0;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EVERSION);
    ck_assert_str_eq(err.msg, "protocol version 0, this broker speaks 1");

    init_req(&req, 12);
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "request has no body");
    ck_assert_uint_eq(id, 12);

    /* A body field this version does not know (number 99) is skipped as
     * unknown, which leaves no body. */
    const uint8_t future[] = {0x08, 0x01, 0x10, 0x0d, 0x9a, 0x06, 0x00};
    ck_assert_int_eq(wb__request_decode(future, sizeof future, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "request has no body");
    ck_assert_uint_eq(id, 13);
}
END_TEST

START_TEST(test_request_names)
{
    Wbproto__Request req, *out;
    uint64_t id;
    wb_err err;
    Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
    init_req(&req, 1);
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &acq;

    acq.model = "";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "acquire.model is empty");

    char longname[WB_NAME_MAX + 2];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    acq.model = longname;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "acquire.model has 256 bytes, at most 255");
    longname[WB_NAME_MAX] = '\0';
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    wb__request_free(&out);

    acq.model = "bad\nname";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "acquire.model has a control character (0x0a) at byte 3");
    acq.model = "del\x7f";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "(0x7f) at byte 3"));

    /* The device a lease is for: a UUID or nothing. */
    acq.model = "m";
    acq.device_uuid = "GPU-1";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "acquire.device_uuid is not a device UUID "
                              "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
    acq.device_uuid = "GPU-3b1e00ff-0102-0304-0506-0708090a0bab";
    acq.device_set = 1;
    acq.device = 3;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    ck_assert_str_eq(out->acquire->device_uuid, "GPU-3b1e00ff-0102-0304-0506-0708090a0bab");
    ck_assert_int_eq(out->acquire->device_set, 1);
    ck_assert_int_eq(out->acquire->device, 3);
    wb__request_free(&out);
    acq.device_uuid = "";

    Wbproto__UnloadRequest un = WBPROTO__UNLOAD_REQUEST__INIT;
    un.name = "";
    req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    req.unload = &un;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "unload.name is empty");

    Wbproto__LoadRequest ld = WBPROTO__LOAD_REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &ld;
    ld.name = "ok";
    ld.path = "";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "load.path is empty");
    char *longpath = malloc(WB_PATH_MAX + 2);
    memset(longpath, '/', WB_PATH_MAX + 1);
    longpath[WB_PATH_MAX + 1] = '\0';
    ld.path = longpath;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "load.path has 4097 bytes, at most 4096");
    free(longpath);
    /* The load name's character set is the load operation's to check (it
     * answers WB_EINVAL), so the decoder lets it through. */
    ld.name = "has space";
    ld.path = "/x";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    ck_assert_str_eq(out->load->name, "has space");
    wb__request_free(&out);
}
END_TEST

START_TEST(test_request_lease_ids)
{
    Wbproto__Request req, *out;
    uint64_t id;
    wb_err err;
    uint8_t idbuf[17] = {0};
    Wbproto__ReleaseRequest rel = WBPROTO__RELEASE_REQUEST__INIT;
    init_req(&req, 5);
    req.body_case = WBPROTO__REQUEST__BODY_RELEASE;
    req.release = &rel;
    rel.lease_id.data = idbuf;
    rel.lease_id.len = 15;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "release.lease_id has 15 bytes, expected 16");
    rel.lease_id.len = 17;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "release.lease_id has 17 bytes, expected 16");
    rel.lease_id.len = 0;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "release.lease_id has 0 bytes, expected 16");
    rel.lease_id.len = 16;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    wb__request_free(&out);

    /* Heartbeats: the count cap and each entry's id. */
    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT;
    beat.lease_id.data = idbuf;
    beat.lease_id.len = 16;
    Wbproto__LeaseBeat bad = beat;
    bad.lease_id.len = 4;
    size_t n = WB_MAX_BEATS + 1;
    Wbproto__LeaseBeat **beats = malloc(n * sizeof *beats);
    for (size_t i = 0; i < n; i++)
        beats[i] = &beat;
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.leases = beats;
    hb.n_leases = n;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "heartbeat has 4097 leases, at most 4096");
    hb.n_leases = WB_MAX_BEATS;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    wb__request_free(&out);
    beats[2] = &bad;
    hb.n_leases = 3;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "heartbeat.leases[2].lease_id has 4 bytes, expected 16");
    free(beats);
}
END_TEST

/* A valid acquire reply with two slabs; tests break one field at a time. */
typedef struct fixture {
    Wbproto__Reply rep;
    Wbproto__AcquireReply acq;
    Wbproto__Lease lease;
    Wbproto__Slab slab[2];
    Wbproto__Slab *slabs[2];
    Wbproto__Tensor t[2];
    Wbproto__Tensor *tensors[2];
    uint64_t shape[65];
    uint8_t handle[65];
} fixture;

static void fixture_init(fixture *f)
{
    memset(f, 0, sizeof *f);
    wbproto__reply__init(&f->rep);
    f->rep.version = WB_PROTOCOL_VERSION;
    f->rep.id = 9;
    f->rep.body_case = WBPROTO__REPLY__BODY_ACQUIRE;
    f->rep.acquire = &f->acq;
    wbproto__acquire_reply__init(&f->acq);
    f->acq.lease = &f->lease;
    wbproto__lease__init(&f->lease);
    f->lease.id.data = (uint8_t *)lease_id;
    f->lease.id.len = WB_LEASE_ID_LEN;
    f->lease.model = "demo";
    for (int i = 0; i < 2; i++) {
        wbproto__slab__init(&f->slab[i]);
        f->slab[i].index = (uint32_t)i;
        f->slabs[i] = &f->slab[i];
        wbproto__tensor__init(&f->t[i]);
        f->tensors[i] = &f->t[i];
    }
    f->slab[0].backend = WBPROTO__BACKEND__BACKEND_HOST;
    f->slab[0].device = -1;
    f->slab[0].size = 4096;
    f->slab[0].shm_name = "/wb-123-0123456789abcdef0123456789abcdef";
    f->slab[1].backend = WBPROTO__BACKEND__BACKEND_CUDA;
    f->slab[1].device = 0;
    f->slab[1].size = 1 << 20;
    f->slab[1].cuda_ipc_handle.data = f->handle;
    f->slab[1].cuda_ipc_handle.len = 64;
    f->lease.n_slabs = 2;
    f->lease.slabs = f->slabs;
    for (int i = 0; i < 65; i++)
        f->shape[i] = 1;
    f->t[0].name = "w";
    f->t[0].dtype = "F32";
    f->t[0].n_shape = 2;
    f->t[0].shape = f->shape;
    f->t[0].slab = 0;
    f->t[0].offset = 256;
    f->t[0].nbytes = 4096 - 256; /* ends exactly at the slab's end */
    f->t[1].name = "b";
    f->t[1].dtype = "BF16";
    f->t[1].slab = 1;
    f->t[1].offset = 0;
    f->t[1].nbytes = 2;
    f->lease.n_tensors = 2;
    f->lease.tensors = f->tensors;
}

START_TEST(test_reply_acquire_bounds)
{
    fixture f;
    Wbproto__Reply *out;
    wb_err err;
    fixture_init(&f);
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_OK);
    ck_assert_uint_eq(out->id, 9);
    ck_assert_uint_eq(out->acquire->lease->n_tensors, 2);
    ck_assert_str_eq(out->acquire->lease->slabs[0]->shm_name,
                     "/wb-123-0123456789abcdef0123456789abcdef");
    wb__reply_free(&out);
    ck_assert_ptr_null(out);

    /* A slab's device UUID, when given, must be one. */
    f.slab[1].device_uuid = "GPU-not-a-uuid";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.slabs[1].device_uuid is not a device UUID");
    f.slab[1].device_uuid = "GPU-3b1e00ff-0102-0304-0506-0708090a0bab";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_OK);
    wb__reply_free(&out);
    f.slab[1].device_uuid = "";

    fixture_init(&f);
    f.t[0].nbytes = 4096 - 255;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg,
                     "tensor 'w' (offset 256, 3841 bytes) ends past its slab of 4096 bytes");

    /* offset + nbytes wraps around 2^64: still refused. */
    fixture_init(&f);
    f.t[0].offset = 512;
    f.t[0].nbytes = UINT64_MAX - 100;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor 'w'"));
    ck_assert_ptr_nonnull(strstr(err.msg, "ends past its slab"));
    fixture_init(&f);
    f.t[0].offset = UINT64_MAX;
    f.t[0].nbytes = 1;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "ends past its slab"));

    fixture_init(&f);
    f.t[1].slab = 2;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "tensor 'b' names slab 2 of 2");

    fixture_init(&f);
    f.t[0].n_shape = 65;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "tensor 'w' has 65 dimensions, at most 64");
    f.t[0].n_shape = 64;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_OK);
    wb__reply_free(&out);

    fixture_init(&f);
    f.t[1].name = "";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.tensors[1] has no name");
    fixture_init(&f);
    f.t[1].dtype = "";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "tensor 'b' has no dtype");

    fixture_init(&f);
    f.slab[1].cuda_ipc_handle.len = 63;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.slabs[1].cuda_ipc_handle has 63 bytes, expected 0 or 64");
    f.slab[1].cuda_ipc_handle.len = 0;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.slabs[1] is a cuda slab without an IPC handle");
    /* A cuda-vmm slab has no handle: its descriptor comes on the channel. */
    f.slab[1].transport = "cuda-vmm";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_OK);
    wb__reply_free(&out);
    f.slab[0].transport = "cuda-vmm"; /* slab 0 is a host slab */
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.slabs[0] is a cuda-vmm slab of a host backend");

    fixture_init(&f);
    f.slab[0].shm_name = "/../etc/passwd";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "lease.slabs[0].shm_name is not of the form"));

    fixture_init(&f);
    f.slab[1].index = 0;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.slabs[1] has index 0");

    fixture_init(&f);
    f.lease.id.len = 8;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.id has 8 bytes, expected 16");

    fixture_init(&f);
    f.acq.lease = NULL;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "acquire reply has no lease");

    /* An unknown backend value (a later protocol's) is kept as an int and
     * does not crash the decoder; the client decides what to do with it. */
    fixture_init(&f);
    f.slab[0].backend = 77;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_OK);
    ck_assert_int_eq(out->acquire->lease->slabs[0]->backend, 77);
    ck_assert_str_eq(wb__backend_name(out->acquire->lease->slabs[0]->backend), "unknown");
    wb__reply_free(&out);
}
END_TEST

/* The fixture's tensors as a compact table in place of the messages. */
static uint8_t *to_table(fixture *f, size_t *len)
{
    uint8_t *t = wb__tensor_table_pack(f->tensors, 2, len);
    ck_assert_ptr_nonnull(t);
    f->lease.n_tensors = 0;
    f->lease.tensors = NULL;
    f->lease.tensor_table.data = t;
    f->lease.tensor_table.len = *len;
    return t;
}

/* Writes u32 `v` at byte `at` of record i (or of the header when i < 0). */
static void poke(uint8_t *t, int i, size_t at, uint32_t v)
{
    size_t base = i < 0 ? 0 : WB_TABLE_HEADER + (size_t)i * WB_TABLE_RECORD;
    memcpy(t + base + at, &v, sizeof v);
}

START_TEST(test_reply_tensor_table)
{
    fixture f;
    Wbproto__Reply *out;
    wb_err err;
    size_t len;
    fixture_init(&f);
    f.t[0].n_shape = 2;
    f.shape[0] = 3;
    f.shape[1] = 5;
    uint8_t *t = to_table(&f, &len);
    ck_assert_uint_eq(len, WB_TABLE_HEADER + 2 * WB_TABLE_RECORD + 2 * 8 + strlen("w F32 b BF16 "));
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_OK);
    const Wbproto__Lease *l = out->acquire->lease;
    ck_assert_uint_eq(l->n_tensors, 0);
    ck_assert_uint_eq(wb__tensor_table_count(l->tensor_table.data), 2);
    wb_table_tensor r;
    const char *str = wb__tensor_table_strings(l->tensor_table.data);
    const uint64_t *dims = wb__tensor_table_dims(l->tensor_table.data);
    wb__tensor_table_get(l->tensor_table.data, 0, &r);
    ck_assert_str_eq(str + r.name, "w");
    ck_assert_str_eq(str + r.dtype, "F32");
    ck_assert_uint_eq(r.ndim, 2);
    ck_assert_uint_eq(dims[r.dim + 1], 5);
    ck_assert_uint_eq(r.offset, 256);
    ck_assert_uint_eq(r.nbytes, 4096 - 256);
    wb__tensor_table_get(l->tensor_table.data, 1, &r);
    ck_assert_str_eq(str + r.name, "b");
    ck_assert_str_eq(str + r.dtype, "BF16");
    ck_assert_uint_eq(r.slab, 1);
    ck_assert_uint_eq(r.ndim, 0);
    wb__reply_free(&out);
    free(t);

    /* Every bound the messages have, the table has too. */
    fixture_init(&f);
    f.t[0].nbytes = 4096 - 255;
    t = to_table(&f, &len);
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg,
                     "tensor 'w' (offset 256, 3841 bytes) ends past its slab of 4096 bytes");
    free(t);
    fixture_init(&f);
    f.t[1].slab = 2;
    t = to_table(&f, &len);
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "tensor 'b' names slab 2 of 2");
    free(t);

    fixture_init(&f);
    t = to_table(&f, &len);
    poke(t, -1, 0, 0x12345678); /* magic */
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.tensor_table has magic 0x12345678, not 0x31544257");
    free(t);
    fixture_init(&f);
    t = to_table(&f, &len);
    poke(t, -1, 4, 3); /* 3 tensors announced, 2 present */
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "header (3 tensors, 2 dims, 13 string bytes) needs"));
    free(t);
    fixture_init(&f);
    t = to_table(&f, &len);
    t[len - 1] = 'x';
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.tensor_table's strings do not end with a NUL");
    free(t);
    fixture_init(&f);
    t = to_table(&f, &len);
    poke(t, 1, 24, 13); /* name offset past the strings */
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.tensor_table[1] has no name");
    free(t);
    /* A name offset into the middle of a character: the strings are UTF-8
     * as a whole, the name would not be. */
    fixture_init(&f);
    f.t[0].name = "w\xc3\xa9";
    t = to_table(&f, &len);
    poke(t, 1, 24, 2);
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.tensor_table[1]'s name starts inside a UTF-8 character");
    free(t);
    fixture_init(&f);
    t = to_table(&f, &len);
    poke(t, 0, 36, 3); /* ndim 3: dims 0..2 of 2 */
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "tensor 'w' has 3 dimensions from dim 0 (of 2, at most 64 each)");
    free(t);
    fixture_init(&f);
    t = to_table(&f, &len);
    f.lease.n_tensors = 2;
    f.lease.tensors = f.tensors;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease carries both tensors (2) and a tensor_table");
    free(t);

    /* A table in a second frame: the lease says so and carries nothing
     * else of the tensors (the frame is the receiver's to check). */
    fixture_init(&f);
    f.lease.n_tensors = 0;
    f.lease.tensors = NULL;
    f.lease.tensor_table_in_frame = 1;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_OK);
    ck_assert_int_eq(out->acquire->lease->tensor_table_in_frame, 1);
    wb__reply_free(&out);
    fixture_init(&f);
    f.lease.tensor_table_in_frame = 1;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease says tensor_table_in_frame but carries tensors");
    fixture_init(&f);
    t = to_table(&f, &len);
    f.lease.tensor_table_in_frame = 1;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease says tensor_table_in_frame but carries a tensor_table");
    free(t);
    fixture_init(&f);
    f.lease.n_tensors = 0;
    f.lease.tensors = NULL;
    f.lease.tensor_table_in_frame = 1;
    f.lease.tensor_table_cached = 1;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease says tensor_table_in_frame but also says tensor_table_cached");

    /* A table in shared memory: a host shm object of a table's size, and
     * nothing else of the tensors (its bytes are the receiver's to map and
     * check). */
    Wbproto__Slab ts = WBPROTO__SLAB__INIT;
    ts.backend = WBPROTO__BACKEND__BACKEND_HOST;
    ts.transport = "shm";
    ts.shm_name = "/wb-12-0123456789abcdef0123456789abcdef";
    ts.size = 4096;
    fixture_init(&f);
    f.lease.n_tensors = 0;
    f.lease.tensors = NULL;
    f.lease.tensor_table_slab = &ts;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_OK);
    ck_assert_str_eq(out->acquire->lease->tensor_table_slab->shm_name, ts.shm_name);
    ck_assert_uint_eq(out->acquire->lease->tensor_table_slab->size, 4096);
    wb__reply_free(&out);
    f.lease.tensor_table_cached = 1;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease has a tensor_table_slab but also says tensor_table_cached");
    f.lease.tensor_table_cached = 0;
    fixture_init(&f);
    f.lease.tensor_table_slab = &ts;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease has a tensor_table_slab but carries tensors");
    fixture_init(&f);
    f.lease.n_tensors = 0;
    f.lease.tensors = NULL;
    f.lease.tensor_table_slab = &ts;
    ts.transport = "memfd";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.tensor_table_slab is not a host shm object (backend 1, "
                              "transport 'memfd')");
    ts.transport = "shm";
    ts.shm_name = "/etc/passwd";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg,
                     "lease.tensor_table_slab.shm_name is not of the form /wb-<pid>-<32 hex>");
    ts.shm_name = "/wb-12-0123456789abcdef0123456789abcdef";
    ts.size = 15;
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg,
                     "lease.tensor_table_slab has 15 bytes (a table has 16 to 4294967296)");
}
END_TEST

START_TEST(test_reply_header)
{
    Wbproto__Reply rep = WBPROTO__REPLY__INIT, *out;
    wb_err err;
    rep.version = WB_PROTOCOL_VERSION;
    rep.id = 3;
    rep.status = WB_ENOTFOUND;
    rep.error = "no model named 'x'";
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_OK);
    ck_assert_int_eq(out->status, WB_ENOTFOUND);
    ck_assert_str_eq(out->error, "no model named 'x'");
    wb__reply_free(&out);

    rep.status = 0;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "reply has status 0 and no body");

    rep.status = 5;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "reply has status 5; statuses are 0 or negative");

    rep.status = WB_EPERM;
    rep.version = 3;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EVERSION);
    ck_assert_str_eq(err.msg, "reply has protocol version 3, this client speaks 1");

    const uint8_t junk[] = {0x0b};
    ck_assert_int_eq(wb__reply_decode(junk, 1, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "reply does not decode as wbproto.Reply (1 bytes)");
    ck_assert_int_eq(wb__reply_decode(junk, 0, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "empty reply (0 bytes)");
    ck_assert_int_eq(wb__reply_decode(junk, (size_t)WB_MAX_MESSAGE + 1, &out, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "exceeds the limit"));
}
END_TEST

START_TEST(test_reply_lists)
{
    Wbproto__Reply rep = WBPROTO__REPLY__INIT, *out;
    wb_err err;
    rep.version = WB_PROTOCOL_VERSION;

    ProtobufCBinaryData ids[2] = {{16, (uint8_t *)lease_id}, {3, (uint8_t *)lease_id}};
    Wbproto__HeartbeatReply hb = WBPROTO__HEARTBEAT_REPLY__INIT;
    hb.n_unknown_leases = 1;
    hb.unknown_leases = ids;
    rep.body_case = WBPROTO__REPLY__BODY_HEARTBEAT;
    rep.heartbeat = &hb;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_OK);
    ck_assert_uint_eq(out->heartbeat->n_unknown_leases, 1);
    wb__reply_free(&out);
    hb.n_unknown_leases = 2;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "heartbeat.unknown_leases[1] has 3 bytes, expected 16");

    /* Enum values beyond the ones this build knows survive decoding. */
    Wbproto__LeaseInfo li = WBPROTO__LEASE_INFO__INIT;
    li.id = ids[0];
    li.state = 9;
    Wbproto__LeaseInfo *lis[] = {&li};
    Wbproto__ListLeasesReply ll = WBPROTO__LIST_LEASES_REPLY__INIT;
    ll.n_leases = 1;
    ll.leases = lis;
    rep.body_case = WBPROTO__REPLY__BODY_LIST_LEASES;
    rep.list_leases = &ll;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_OK);
    ck_assert_int_eq(out->list_leases->leases[0]->state, 9);
    ck_assert_str_eq(wb__lease_state_name(out->list_leases->leases[0]->state), "unknown");
    wb__reply_free(&out);
    li.id = ids[1];
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "list_leases.leases[0].id has 3 bytes, expected 16");

    Wbproto__ModelInfo mi = WBPROTO__MODEL_INFO__INIT;
    mi.name = "demo";
    mi.state = 42;
    Wbproto__ModelInfo *mis[] = {&mi};
    Wbproto__ListModelsReply lm = WBPROTO__LIST_MODELS_REPLY__INIT;
    lm.n_models = 1;
    lm.models = mis;
    rep.body_case = WBPROTO__REPLY__BODY_LIST_MODELS;
    rep.list_models = &lm;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_OK);
    ck_assert_str_eq(wb__model_state_name(out->list_models->models[0]->state), "unknown");
    wb__reply_free(&out);
    mi.name = "";
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "list_models.models[0].name is empty");

    /* A load reply must carry its model. */
    Wbproto__LoadReply lr = WBPROTO__LOAD_REPLY__INIT;
    rep.body_case = WBPROTO__REPLY__BODY_LOAD;
    rep.load = &lr;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "load.model is missing");
    mi.name = "demo";
    lr.model = &mi;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_OK);
    wb__reply_free(&out);
}
END_TEST

START_TEST(test_enum_names)
{
    ck_assert_str_eq(wb__lease_state_name(WBPROTO__LEASE_STATE__LEASE_ACTIVE), "active");
    ck_assert_str_eq(wb__lease_state_name(WBPROTO__LEASE_STATE__LEASE_STALE), "stale");
    ck_assert_str_eq(wb__lease_state_name(0), "unknown");
    ck_assert_str_eq(wb__lease_state_name(-1), "unknown");
    ck_assert_str_eq(wb__model_state_name(WBPROTO__MODEL_STATE__MODEL_LOADING), "loading");
    ck_assert_str_eq(wb__model_state_name(WBPROTO__MODEL_STATE__MODEL_READY), "ready");
    ck_assert_str_eq(wb__model_state_name(WBPROTO__MODEL_STATE__MODEL_DRAINING), "draining");
    ck_assert_str_eq(wb__model_state_name(WBPROTO__MODEL_STATE__MODEL_FREED), "freed");
    ck_assert_str_eq(wb__model_state_name(WBPROTO__MODEL_STATE__MODEL_FAILED), "failed");
    ck_assert_str_eq(wb__model_state_name(6), "unknown");
    ck_assert_str_eq(wb__backend_name(WBPROTO__BACKEND__BACKEND_HOST), "host");
    ck_assert_str_eq(wb__backend_name(WBPROTO__BACKEND__BACKEND_CUDA), "cuda");
    ck_assert_str_eq(wb__backend_name(0), "unknown");
}
END_TEST

/* wb.proto's strings are UTF-8 (proto3): the strict decoders of other
 * languages refuse a message with invalid bytes in one. */
START_TEST(test_utf8_validity)
{
    static const struct {
        const char *s;
        size_t bad; /* SIZE_MAX: valid */
    } cases[] = {
        {"", SIZE_MAX},
        {"plain ascii, long enough for the word loop", SIZE_MAX},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xe6\xa8\xa1\xe5\x9e\x8b", SIZE_MAX},
        {"\xc2\x80 \xdf\xbf \xe0\xa0\x80 \xef\xbf\xbf \xf0\x90\x80\x80 \xf4\x8f\xbf\xbf", SIZE_MAX},
        {"\x7f\x01 controls are valid UTF-8", SIZE_MAX},
        {"\x80", 0},                    /* a lone continuation byte */
        {"ab\xc0\xaf", 2},              /* overlong '/' */
        {"\xc1\xbf", 0},                /* overlong */
        {"x\xe0\x80\xaf", 1},           /* overlong, 3 bytes */
        {"xy\xf0\x80\x80\xaf", 2},      /* overlong, 4 bytes */
        {"surrogate \xed\xa0\x80", 10}, /* U+D800 */
        {"\xed\xbf\xbf", 0},            /* U+DFFF */
        {"\xf4\x90\x80\x80", 0},        /* U+110000 */
        {"\xf5\x80\x80\x80", 0},
        {"\xff", 0},
        {"\xfe", 0},
        {"cut \xe2\x82", 4}, /* truncated */
        {"cut \xf0\x9f\x98", 4},
        {"\xc3(", 0}, /* a continuation that is not one */
        {"\xe2\x28\xa1", 0},
        {"0123456789abcdef\xff", 16}, /* after two ASCII words */
        {"01234567\xc3\xa9\x80", 10},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].s);
        size_t want = cases[i].bad == SIZE_MAX ? n : cases[i].bad;
        ck_assert_msg(wb__utf8_invalid_at(cases[i].s, n) == want, "case %zu: %zu, want %zu", i,
                      wb__utf8_invalid_at(cases[i].s, n), want);
    }
    /* An invalid byte found at every position of the word loop. */
    for (size_t at = 0; at < 24; at++) {
        char s[32];
        memset(s, 'a', sizeof s);
        s[at] = (char)0xff;
        ck_assert_uint_eq(wb__utf8_invalid_at(s, sizeof s), at);
    }
    char out[64];
    ck_assert_str_eq(wb__utf8_repair(out, "ok \xff\xc3( \xe2\x82\xac"),
                     "ok \xef\xbf\xbd\xef\xbf\xbd( \xe2\x82\xac");
    ck_assert_str_eq(wb__utf8_repair(out, "caf\xc3\xa9"), "caf\xc3\xa9");
}
END_TEST

/* Every string field of a request, however deep. */
START_TEST(test_request_utf8)
{
    Wbproto__Request req, *out;
    uint64_t id;
    wb_err err;
    Wbproto__ContainerRecord rec[3];
    Wbproto__ContainerRecord *recs[3];
    for (int i = 0; i < 3; i++) {
        wbproto__container_record__init(&rec[i]);
        rec[i].container_id = (uint64_t)i + 1;
        rec[i].aoti_api = "CreateWithDevice";
        rec[i].model_path = "/mod\xc3\xa8les/\xe6\xa8\xa1\xe5\x9e\x8b/\xf0\x9f\x98\x80.pt2";
        recs[i] = &rec[i];
    }
    Wbproto__LeaseBeat beat[2] = {WBPROTO__LEASE_BEAT__INIT, WBPROTO__LEASE_BEAT__INIT};
    Wbproto__LeaseBeat *beats[2] = {&beat[0], &beat[1]};
    for (int i = 0; i < 2; i++) {
        beat[i].lease_id.data = (uint8_t *)lease_id;
        beat[i].lease_id.len = WB_LEASE_ID_LEN;
        beat[i].containers = 3;
        beat[i].n_container_records = 3;
        beat[i].container_records = recs;
    }
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 2;
    hb.leases = beats;
    init_req(&req, 21);
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    ck_assert_str_eq(out->heartbeat->leases[1]->container_records[2]->model_path,
                     rec[2].model_path);
    wb__request_free(&out);

    /* Byte 15 of the path is not UTF-8: refused, nothing kept. */
    rec[2].model_path = "/models/\xe6\xa8\xa1\xe5\x9e\x8b/\xff.pt2";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(id, 21);
    ck_assert_str_eq(err.msg,
                     "heartbeat.leases[0].container_records[2].model_path is not valid UTF-8 "
                     "(byte 15)");
    hb.leases = (Wbproto__LeaseBeat *[]){&beat[0], &beat[0]};
    beat[0].container_records = (Wbproto__ContainerRecord *[]){&rec[0], &rec[1], &rec[0]};
    rec[0].aoti_api = "Create\xc0\xaf";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg,
                     "heartbeat.leases[0].container_records[0].aoti_api is not valid UTF-8 "
                     "(byte 6)");

    Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
    acq.model = "demo\xed\xa0\x80";
    init_req(&req, 22);
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &acq;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "acquire.model is not valid UTF-8 (byte 4)");
    acq.model = "demo";
    acq.device_uuid = "GPU-\xff";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "acquire.device_uuid is not valid UTF-8 (byte 4)");

    Wbproto__HelloRequest h = WBPROTO__HELLO_REQUEST__INIT;
    h.client = "w\xf4\x90\x80\x80";
    req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    req.hello = &h;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "hello.client is not valid UTF-8 (byte 1)");
    /* bytes fields (the session token) are not strings. */
    h.client = "worker";
    uint8_t token[16] = {0xff, 0xfe, 0x80};
    h.session.data = token;
    h.session.len = sizeof token;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_OK);
    wb__request_free(&out);

    Wbproto__LoadRequest ld = WBPROTO__LOAD_REQUEST__INIT;
    ld.name = "m";
    ld.path = "/x/\xe2\x82";
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &ld;
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "load.path is not valid UTF-8 (byte 3)");
    ld.path = "/x";
    ld.placement = "0,\x80";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "load.placement is not valid UTF-8 (byte 2)");
    ld.placement = "";
    ld.name = "\xc3";
    ck_assert_int_eq(req_roundtrip(&req, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "load.name is not valid UTF-8 (byte 0)");
}
END_TEST

/* A client checks the strings of the replies it exposes the same way. */
START_TEST(test_reply_utf8)
{
    Wbproto__Reply rep = WBPROTO__REPLY__INIT, *out;
    wb_err err;
    rep.version = WB_PROTOCOL_VERSION;

    Wbproto__ModelCopy mc[2] = {WBPROTO__MODEL_COPY__INIT, WBPROTO__MODEL_COPY__INIT};
    Wbproto__ModelCopy *mcs[] = {&mc[0], &mc[1]};
    mc[1].state = WBPROTO__MODEL_STATE__MODEL_FAILED;
    mc[1].error = "cuda error: out of memory";
    Wbproto__ModelInfo mi = WBPROTO__MODEL_INFO__INIT;
    mi.name = "demo";
    mi.path = "/models/\xe6\xa8\xa1\xe5\x9e\x8b.safetensors";
    mi.n_copies = 2;
    mi.copies = mcs;
    Wbproto__ModelInfo *mis[] = {&mi};
    Wbproto__ListModelsReply lm = WBPROTO__LIST_MODELS_REPLY__INIT;
    lm.n_models = 1;
    lm.models = mis;
    rep.body_case = WBPROTO__REPLY__BODY_LIST_MODELS;
    rep.list_models = &lm;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_OK);
    wb__reply_free(&out);
    mc[1].error = "cud\xff error";
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_ptr_null(out);
    ck_assert_str_eq(err.msg, "list_models.models[0].copies[1].error is not valid UTF-8 (byte 3)");
    mc[1].error = "";
    mi.load_mode = "staged\xc3";
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "list_models.models[0].load_mode is not valid UTF-8 (byte 6)");
    mi.load_mode = "";

    Wbproto__LeaseInfo li = WBPROTO__LEASE_INFO__INIT;
    li.id.data = (uint8_t *)lease_id;
    li.id.len = WB_LEASE_ID_LEN;
    li.process_name = "py\xfe";
    Wbproto__LeaseInfo *lis[] = {&li};
    Wbproto__ListLeasesReply ll = WBPROTO__LIST_LEASES_REPLY__INIT;
    ll.n_leases = 1;
    ll.leases = lis;
    rep.body_case = WBPROTO__REPLY__BODY_LIST_LEASES;
    rep.list_leases = &ll;
    ck_assert_int_eq(rep_roundtrip(&rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "list_leases.leases[0].process_name is not valid UTF-8 (byte 2)");

    /* The reply's own message, as an error reply carries it. */
    Wbproto__Reply bad = WBPROTO__REPLY__INIT;
    bad.version = WB_PROTOCOL_VERSION;
    bad.status = WB_ENOTFOUND;
    bad.error = "\x80no such model";
    ck_assert_int_eq(rep_roundtrip(&bad, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "reply.error is not valid UTF-8 (byte 0)");
    bad.error = "no model 'mod\xc3\xa8le'";
    ck_assert_int_eq(rep_roundtrip(&bad, &out, &err), WB_OK);
    ck_assert_int_eq(out->status, WB_ENOTFOUND);
    wb__reply_free(&out);

    /* An acquire: tensor messages and the compact table alike. */
    fixture f;
    fixture_init(&f);
    f.t[1].name = "\xe2\x82";
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "acquire.lease.tensors[1].name is not valid UTF-8 (byte 0)");
    fixture_init(&f);
    f.t[1].name = "b\xff";
    size_t len;
    uint8_t *t = to_table(&f, &len);
    ck_assert_int_eq(rep_roundtrip(&f.rep, &out, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.tensor_table[1].name is not valid UTF-8 (byte 1)");
    ck_assert_int_eq(wb__tensor_table_check(t, len, f.lease.slabs, 2, &err), WB_EPROTO);
    free(t);
    fixture_init(&f);
    f.t[0].dtype = "F\xc0\xb2";
    t = to_table(&f, &len);
    ck_assert_int_eq(wb__tensor_table_check(t, len, f.lease.slabs, 2, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "lease.tensor_table[0].dtype is not valid UTF-8 (byte 1)");
    free(t);
}
END_TEST

/* A heartbeat of exactly `len` bytes (about 1 MiB): version 1, id 300, one
 * lease (300 containers) whose records are `rec` (rec_len bytes) over and
 * over. Returns the buffer and the records in *n. */
static uint8_t *flood_heartbeat(size_t len, const uint8_t *rec, size_t rec_len, size_t *n)
{
    uint8_t *buf = malloc(len);
    ck_assert_ptr_nonnull(buf);
    /* Request: 08 01 10 ac 02 6a <len> | HeartbeatRequest: 0a <len> |
     * LeaseBeat: 0a 10 <16 bytes> 10 ac 02, then the records. Lengths are
     * 3-byte varints for a 1 MiB message. */
    size_t hdr = 5 + 1 + 3 + 1 + 3 + 18 + 3;
    size_t body = len - hdr;
    *n = body / rec_len;
    ck_assert_uint_eq(body % rec_len, 0);
    size_t beat = 18 + 3 + body, hb = 1 + 3 + beat;
    ck_assert_uint_lt(hb, 1u << 21);
    ck_assert_uint_ge(beat, 1u << 14);
    uint8_t *p = buf;
    *p++ = 0x08, *p++ = 0x01, *p++ = 0x10, *p++ = 0xac, *p++ = 0x02;
    *p++ = 0x6a;
    *p++ = (uint8_t)(hb | 0x80), *p++ = (uint8_t)((hb >> 7) | 0x80), *p++ = (uint8_t)(hb >> 14);
    *p++ = 0x0a;
    *p++ = (uint8_t)(beat | 0x80), *p++ = (uint8_t)((beat >> 7) | 0x80),
    *p++ = (uint8_t)(beat >> 14);
    *p++ = 0x0a, *p++ = 0x10;
    memcpy(p, lease_id, 16);
    p += 16;
    *p++ = 0x10, *p++ = 0xac, *p++ = 0x02;
    for (size_t i = 0; i < *n; i++, p += rec_len)
        memcpy(p, rec, rec_len);
    ck_assert_uint_eq((size_t)(p - buf), len);
    return buf;
}

static long max_rss_kib(void)
{
    struct rusage ru;
    ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_maxrss;
}

/* 1 MiB of empty container records (3 bytes each) in one lease: refused for
 * their number, which is looked at before anything is decoded. Decoding
 * them first took 63 MB and 129 ms. The peak RSS of this (forked) test
 * process stays where the buffer left it. */
START_TEST(test_request_flood_of_records)
{
    static const uint8_t empty_record[] = {0xc2, 0x02, 0x00}; /* field 40, 0 bytes */
    size_t n;
    uint8_t *buf = flood_heartbeat(1u << 20, empty_record, sizeof empty_record, &n);
    ck_assert_uint_eq(n, 349514);
    long before = max_rss_kib();
    Wbproto__Request *out = NULL;
    uint64_t id = 0;
    wb_err err;
    ck_assert_int_eq(wb__request_decode(buf, 1u << 20, &out, &id, &err), WB_EPROTO);
    long grew = max_rss_kib() - before;
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(id, 300);
    ck_assert_str_eq(err.msg, "heartbeat.leases[0].container_records has 349514 container "
                              "records, at most 16");
    ck_assert_msg(grew < 4096, "decoding grew the peak RSS by %ld KiB", grew);
    free(buf);
}
END_TEST

/* What the decoder allocates is counted: nothing for a request refused on
 * the wire bytes, at most wb__request_budget(len) for any other, and a
 * heartbeat at every bound fits. */
START_TEST(test_request_budget)
{
    static const uint8_t empty_record[] = {0xc2, 0x02, 0x00};
    size_t n, peak = 1;
    uint8_t *buf = flood_heartbeat(1u << 20, empty_record, sizeof empty_record, &n);
    Wbproto__Request *out = NULL;
    uint64_t id;
    wb_err err;
    ck_assert_int_eq(wb__request_decode_ex(buf, 1u << 20, &out, &id, &peak, &err), WB_EPROTO);
    ck_assert_uint_eq(peak, 0);
    free(buf);

    /* 4096 leases of 16 records, the most a heartbeat may carry. */
    Wbproto__ContainerRecord rec = WBPROTO__CONTAINER_RECORD__INIT;
    rec.aoti_api = "a";
    Wbproto__ContainerRecord *recs[WB_MAX_CONTAINER_RECORDS];
    for (size_t i = 0; i < WB_MAX_CONTAINER_RECORDS; i++)
        recs[i] = &rec;
    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT;
    beat.lease_id.data = (uint8_t *)lease_id;
    beat.lease_id.len = WB_LEASE_ID_LEN;
    beat.containers = WB_MAX_CONTAINER_RECORDS;
    beat.n_container_records = WB_MAX_CONTAINER_RECORDS;
    beat.container_records = recs;
    Wbproto__LeaseBeat **beats = malloc(WB_MAX_BEATS * sizeof *beats);
    ck_assert_ptr_nonnull(beats);
    for (size_t i = 0; i < WB_MAX_BEATS; i++)
        beats[i] = &beat;
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = WB_MAX_BEATS;
    hb.leases = beats;
    Wbproto__Request req;
    init_req(&req, 5);
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    size_t len;
    buf = wb__request_pack(&req, &len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(wb__request_decode_ex(buf, len, &out, &id, &peak, &err), WB_OK);
    ck_assert_uint_eq(out->heartbeat->n_leases, WB_MAX_BEATS);
    ck_assert_uint_gt(peak, (size_t)WB_MAX_BEATS * WB_MAX_CONTAINER_RECORDS * sizeof rec);
    ck_assert_uint_le(peak, wb__request_budget(len));
    wb__request_free(&out);
    free(buf);
    free(beats);

    /* A record with 60 fields the broker does not know (2 bytes each), as
     * many as fit in 1 MiB: under every count, over the budget. */
    uint8_t unknown[3 + 120];
    unknown[0] = 0xc2, unknown[1] = 0x02, unknown[2] = 120;
    for (size_t i = 0; i < 60; i++)
        unknown[3 + 2 * i] = 0x18, unknown[4 + 2 * i] = 0x00; /* field 3, varint 0 */
    /* One lease of 16 such records per beat would be the honest shape;
     * the flood puts them all in one lease, so make it many leases. */
    size_t per_beat = 16 * sizeof unknown + 18 + 3, beats_n = ((1u << 20) - 16) / per_beat;
    size_t body = beats_n * per_beat;
    buf = malloc(body + 16);
    ck_assert_ptr_nonnull(buf);
    uint8_t *p = buf;
    *p++ = 0x08, *p++ = 0x01, *p++ = 0x10, *p++ = 6, *p++ = 0x6a;
    *p++ = (uint8_t)(body | 0x80), *p++ = (uint8_t)((body >> 7) | 0x80),
    *p++ = (uint8_t)(body >> 14);
    for (size_t b = 0; b < beats_n; b++) {
        size_t bl = per_beat - 3;
        *p++ = 0x0a, *p++ = (uint8_t)(bl | 0x80), *p++ = (uint8_t)(bl >> 7);
        *p++ = 0x0a, *p++ = 0x10;
        memcpy(p, lease_id, 16);
        p += 16;
        for (int r = 0; r < 16; r++, p += sizeof unknown)
            memcpy(p, unknown, sizeof unknown);
    }
    len = (size_t)(p - buf);
    ck_assert_int_eq(wb__request_decode_ex(buf, len, &out, &id, &peak, &err), WB_EPROTO);
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(id, 6);
    char want[256];
    snprintf(want, sizeof want,
             "decoding the request would take more than %zu bytes (%zu bytes of request; fields "
             "that are not repeated given again and again, or fields this broker does not know)",
             wb__request_budget(len), len);
    ck_assert_str_eq(err.msg, want);
    ck_assert_uint_le(peak, wb__request_budget(len));
    free(buf);
}
END_TEST

/* Fields beyond a message's own, on the wire: a few are a newer peer's;
 * hundreds of thousands a flood that protobuf-c would hold 32 bytes each
 * for while decoding. Refused before, naming the message. */
START_TEST(test_request_field_counts)
{
    Wbproto__Request *out;
    uint64_t id;
    size_t peak;
    wb_err err;
    uint8_t buf[4096];
    size_t n = 0;
    buf[n++] = 0x08, buf[n++] = 0x01, buf[n++] = 0x10, buf[n++] = 9;
    buf[n++] = 0x92, buf[n++] = 0x01, buf[n++] = 0x00; /* stats */
    for (int i = 0; i < WB_MAX_UNKNOWN_FIELDS; i++)
        buf[n++] = 0x18, buf[n++] = 0x01; /* field 3: unknown */
    ck_assert_int_eq(wb__request_decode(buf, n, &out, &id, &err), WB_OK);
    ck_assert_uint_eq(out->base.n_unknown_fields, WB_MAX_UNKNOWN_FIELDS);
    wb__request_free(&out);
    /* The request's 19 fields, each once, and 64 more: 83. */
    for (int i = 0; i < 17; i++)
        buf[n++] = 0x18, buf[n++] = 0x01;
    ck_assert_int_eq(wb__request_decode_ex(buf, n, &out, &id, &peak, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "request has 84 fields on the wire, at most 83: its own once each "
                              "(repeated ones up to their bounds) and 64 more, unknown to this "
                              "broker or given again");
    ck_assert_uint_eq(id, 9);
    ck_assert_uint_eq(peak, 0);
    /* A known field given again counts the same: the id 100 times. */
    n = 0;
    buf[n++] = 0x08, buf[n++] = 0x01;
    for (int i = 0; i < 100; i++)
        buf[n++] = 0x10, buf[n++] = 10;
    buf[n++] = 0x92, buf[n++] = 0x01, buf[n++] = 0x00;
    ck_assert_int_eq(wb__request_decode(buf, n, &out, &id, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "request has 102 fields on the wire, at most 83: its own once each "
                              "(repeated ones up to their bounds) and 64 more, unknown to this "
                              "broker or given again");

    /* Inside the second record of a lease: its 18 fields and 64 more. The
     * record holds container_id 100 times (3 bytes each). */
    n = 0;
    static const uint8_t head[] = {0x08, 0x01, 0x10, 0x0a, 0x6a, 0xc8, 0x02, /* heartbeat, 328 */
                                   0x0a, 0xc5, 0x02,                         /* leases[0], 325 */
                                   0x0a, 0x10};                              /* lease_id */
    memcpy(buf, head, sizeof head);
    n = sizeof head;
    memcpy(buf + n, lease_id, 16);
    n += 16;
    buf[n++] = 0xc2, buf[n++] = 0x02, buf[n++] = 0x00;                  /* records[0]: empty */
    buf[n++] = 0xc2, buf[n++] = 0x02, buf[n++] = 0xac, buf[n++] = 0x02; /* records[1]: 300 */
    for (int i = 0; i < 100; i++)
        buf[n++] = 0xc0, buf[n++] = 0x02, buf[n++] = 0x01;
    ck_assert_uint_eq(n, 7 + 328);
    ck_assert_int_eq(wb__request_decode_ex(buf, n, &out, &id, &peak, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "heartbeat.leases[0].container_records[1] has 100 fields on the "
                              "wire, at most 82: its own once each (repeated ones up to their "
                              "bounds) and 64 more, unknown to this broker or given again");
    ck_assert_uint_eq(id, 10);
    ck_assert_uint_eq(peak, 0);
    /* Cut by one byte: bytes protobuf-c refuses too, said as before. */
    ck_assert_int_eq(wb__request_decode_ex(buf, n - 1, &out, &id, &peak, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "request does not decode as wbproto.Request (334 bytes)");
    ck_assert_uint_eq(peak, 0);
}
END_TEST

/* Every repeated field a request can reach has a bound, and every message
 * type fits the scan's counters: a field added to wb.proto without one
 * fails here, not in production. */
static void check_bounds(const ProtobufCMessageDescriptor *d, int depth)
{
    ck_assert_int_lt(depth, 8);
    ck_assert_uint_le(d->n_fields, 64);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->label == PROTOBUF_C_LABEL_REPEATED)
            ck_assert_msg(wb__request_bound(d, f->id) > 0, "%s.%s has no bound", d->name, f->name);
        if (f->type == PROTOBUF_C_TYPE_MESSAGE)
            check_bounds(f->descriptor, depth + 1);
    }
}

START_TEST(test_request_bounds_cover_the_schema)
{
    check_bounds(&wbproto__request__descriptor, 0);
    ck_assert_uint_eq(wb__request_bound(&wbproto__heartbeat_request__descriptor, 1), WB_MAX_BEATS);
    ck_assert_uint_eq(wb__request_bound(&wbproto__lease_beat__descriptor, 40),
                      WB_MAX_CONTAINER_RECORDS);
    ck_assert_uint_eq(wb__request_bound(&wbproto__lease_beat__descriptor, 1), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_request_roundtrip);
    tcase_add_test(tc, test_request_size_limits);
    tcase_add_test(tc, test_request_garbage);
    tcase_add_test(tc, test_request_version_and_body);
    tcase_add_test(tc, test_request_names);
    tcase_add_test(tc, test_request_lease_ids);
    tcase_add_test(tc, test_reply_acquire_bounds);
    tcase_add_test(tc, test_reply_tensor_table);
    tcase_add_test(tc, test_reply_header);
    tcase_add_test(tc, test_reply_lists);
    tcase_add_test(tc, test_enum_names);
    tcase_add_test(tc, test_utf8_validity);
    tcase_add_test(tc, test_request_utf8);
    tcase_add_test(tc, test_reply_utf8);
    tcase_add_test(tc, test_request_flood_of_records);
    tcase_add_test(tc, test_request_budget);
    tcase_add_test(tc, test_request_field_counts);
    tcase_add_test(tc, test_request_bounds_cover_the_schema);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
