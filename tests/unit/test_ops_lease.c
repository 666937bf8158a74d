/* The lease handlers (ops_lease.c), without sockets: hello, acquire (the copy
 * on the peer's device, the tensor table inside the reply, as its second
 * frame, in shared memory or not at all when the client holds it, and the
 * packed tails those replies are made of), release (by its holder only,
 * also after the holder's pid was reused) and heartbeats; every reply
 * packs into bytes the client-side decoder accepts. */
#include "broker_fixture.h"
#include "ops_impl.h"
#include "tensor_table.h"
#include "wire.h"

#include <check.h>
#include <xxhash.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
    fixture_open(&F, "lease");
}

static void teardown(void)
{
    fixture_close(&F);
}

/* Runs one request and returns the reply as a client would decode it. */
static Wbproto__Reply *call(const wb_peer_creds *peer, Wbproto__Request *req)
{
    return fixture_send(&F, peer, req);
}

static Wbproto__Reply *simple(const wb_peer_creds *peer, int body)
{
    return fixture_simple(&F, peer, body);
}

/* An acquire that asks for the compact table with its digest, inside the
 * reply or (frame) as a second frame. */
static Wbproto__Reply *acquire_table_sh(const wb_peer_creds *p, const char *model,
                                        const uint8_t *digest, int frame, int shared)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__AcquireRequest a = WBPROTO__ACQUIRE_REQUEST__INIT;
    a.model = (char *)model;
    a.tensor_table = 1;
    a.tensor_table_frame = frame != 0;
    a.tensor_table_shared = shared != 0;
    if (digest) {
        a.tensor_table_digest.data = (uint8_t *)digest;
        a.tensor_table_digest.len = 16;
    }
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &a;
    return call(p, &req);
}

static Wbproto__Reply *acquire_table_ex(const wb_peer_creds *p, const char *model,
                                        const uint8_t *digest, int frame)
{
    return acquire_table_sh(p, model, digest, frame, 0);
}

static Wbproto__Reply *acquire_table(const wb_peer_creds *p, const char *model,
                                     const uint8_t *digest)
{
    return acquire_table_ex(p, model, digest, 0);
}

START_TEST(test_hello)
{
    wb_peer_creds p = creds(1234, 567, 89);
    Wbproto__Reply *r = simple(&p, WBPROTO__REQUEST__BODY_HELLO);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->body_case, WBPROTO__REPLY__BODY_HELLO);
    ck_assert_str_eq(r->hello->broker_version, WB_VERSION);
    ck_assert_uint_eq(r->hello->broker_pid, (uint32_t)getpid());
    ck_assert_int_eq(r->hello->backend, WBPROTO__BACKEND__BACKEND_HOST);
    ck_assert_uint_eq(r->hello->heartbeat_interval_ms, 200);
    ck_assert_uint_eq(r->hello->stale_after_ms, 1000);
    ck_assert_uint_eq(r->hello->peer_uid, 1234);
    ck_assert_uint_eq(r->hello->peer_gid, 567);
    ck_assert_uint_eq(r->hello->peer_pid, 89);
}
END_TEST

/* A client that names the digest of the table it holds gets no table back,
 * only the slabs and tensor_table_cached; any other digest gets the table. */
START_TEST(test_acquire_cached_table)
{
    fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    Wbproto__Reply *r = acquire_table(&p, "demo", NULL);
    ck_assert_int_eq(r->status, 0);
    const Wbproto__Lease *l = r->acquire->lease;
    ck_assert_uint_gt(l->tensor_table.len, 0);
    ck_assert_int_eq(l->tensor_table_cached, 0);
    ck_assert_uint_eq(l->n_tensors, 0);
    /* In name order, whatever the checkpoint's order: clients then index
     * names in one pass. */
    const uint8_t *tb = l->tensor_table.data;
    uint32_t nt = wb__tensor_table_count(tb);
    ck_assert_uint_gt(nt, 1);
    for (uint32_t i = 1; i < nt; i++) {
        wb_table_tensor x, y;
        wb__tensor_table_get(tb, i - 1, &x);
        wb__tensor_table_get(tb, i, &y);
        ck_assert_int_lt(
            strcmp(wb__tensor_table_strings(tb) + x.name, wb__tensor_table_strings(tb) + y.name),
            0);
    }
    uint8_t digest[16];
    wb__tensor_table_digest(l->tensor_table.data, l->tensor_table.len, digest);
    size_t full = wbproto__lease__get_packed_size(l);

    r = acquire_table(&p, "demo", digest);
    ck_assert_int_eq(r->status, 0);
    l = r->acquire->lease;
    ck_assert_int_eq(l->tensor_table_cached, 1);
    ck_assert_uint_eq(l->tensor_table.len, 0);
    ck_assert_uint_eq(l->n_tensors, 0);
    ck_assert_str_eq(l->model, "demo");
    ck_assert_uint_eq(l->n_slabs, 1);
    ck_assert_uint_lt(wbproto__lease__get_packed_size(l), full);

    digest[15] ^= 1;
    r = acquire_table(&p, "demo", digest);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->acquire->lease->tensor_table_cached, 0);
    ck_assert_uint_gt(r->acquire->lease->tensor_table.len, 0);
}
END_TEST

/* Asked for it, the table goes as the reply's second frame (the model's
 * one packed table, not copied into the reply), the same bytes as inside
 * a reply; a client that holds it still gets none, and one that did not
 * ask gets it inside. */
START_TEST(test_acquire_table_frame)
{
    wb_model *m = fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    Wbproto__Reply *r = acquire_table(&p, "demo", NULL);
    ck_assert_int_eq(r->status, 0);
    ck_assert_ptr_null(F.frame);
    size_t inside_len = r->acquire->lease->tensor_table.len;
    uint8_t *inside = malloc(inside_len);
    ck_assert_ptr_nonnull(inside);
    memcpy(inside, r->acquire->lease->tensor_table.data, inside_len);

    r = acquire_table_ex(&p, "demo", NULL, 1);
    ck_assert_int_eq(r->status, 0);
    const Wbproto__Lease *l = r->acquire->lease;
    ck_assert_int_eq(l->tensor_table_in_frame, 1);
    ck_assert_int_eq(l->tensor_table_cached, 0);
    ck_assert_uint_eq(l->tensor_table.len, 0);
    ck_assert_uint_eq(l->n_tensors, 0);
    ck_assert_str_eq(l->model, "demo");
    ck_assert_uint_eq(l->n_slabs, 1);
    ck_assert_ptr_eq(F.frame, m->table);
    ck_assert_uint_eq(F.frame_len, inside_len);
    ck_assert_int_eq(memcmp(F.frame, inside, inside_len), 0);
    wb_err err;
    ck_assert_int_eq(wb__tensor_table_check(F.frame, F.frame_len, l->slabs, l->n_slabs, &err),
                     WB_OK);

    uint8_t digest[16];
    wb__tensor_table_digest(inside, inside_len, digest);
    r = acquire_table_ex(&p, "demo", digest, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->acquire->lease->tensor_table_cached, 1);
    ck_assert_int_eq(r->acquire->lease->tensor_table_in_frame, 0);
    ck_assert_ptr_null(F.frame);
    free(inside);
}
END_TEST

/* Asked for it, the table's place in shared memory goes instead of its
 * bytes: a host shm object made once per model, of exactly the table's
 * bytes, with the slab's mode; no frame. A client holding the table still
 * gets none; a model without a shared table (another transport, or it
 * could not be made) sends the frame when asked, else the table inside. */
START_TEST(test_acquire_shared_table)
{
    wb_model *m = fixture_model(&F.b, "demo");
    ck_assert_ptr_nonnull(m->table_shm.addr);
    wb_peer_creds p = me();
    Wbproto__Reply *r = acquire_table_sh(&p, "demo", NULL, 1, 1);
    ck_assert_int_eq(r->status, 0);
    const Wbproto__Lease *l = r->acquire->lease;
    ck_assert_ptr_null(F.frame);
    ck_assert_int_eq(l->tensor_table_in_frame, 0);
    ck_assert_int_eq(l->tensor_table_cached, 0);
    ck_assert_uint_eq(l->tensor_table.len, 0);
    ck_assert_uint_eq(l->n_tensors, 0);
    ck_assert_str_eq(l->model, "demo");
    ck_assert_uint_eq(l->n_slabs, 1);
    const Wbproto__Slab *ts = l->tensor_table_slab;
    ck_assert_ptr_nonnull(ts);
    ck_assert_int_eq(ts->backend, WBPROTO__BACKEND__BACKEND_HOST);
    ck_assert_str_eq(ts->transport, "shm");
    ck_assert_int_eq(wb__shm_name_valid(ts->shm_name), 1);
    ck_assert_str_ne(ts->shm_name, l->slabs[0]->shm_name);
    ck_assert_uint_eq(ts->size, m->table_len);
    char name[WB_SHM_NAME_MAX];
    snprintf(name, sizeof name, "%s", ts->shm_name);

    /* What a client maps: the model's table, byte for byte, a valid table
     * for the lease's slabs, with the mode the slab has. */
    wb_shm ro;
    wb_err err;
    ck_assert_int_eq(wb__shm_map_ro(&ro, name, ts->size, &err), WB_OK);
    ck_assert_int_eq(memcmp(ro.addr, m->table, m->table_len), 0);
    ck_assert_int_eq(wb__tensor_table_check(ro.addr, ts->size, l->slabs, l->n_slabs, &err), WB_OK);
    wb__shm_unmap(&ro);
    char path[128], slab_path[128];
    struct stat st, slab_st;
    snprintf(path, sizeof path, "/dev/shm%s", name);
    snprintf(slab_path, sizeof slab_path, "/dev/shm%s", l->slabs[0]->shm_name);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(stat(slab_path, &slab_st), 0);
    ck_assert_uint_eq(st.st_mode & 07777, slab_st.st_mode & 07777);
    ck_assert_uint_eq(st.st_mode & 0022, 0);

    /* The same object for the next lease, and none with the digest. */
    r = acquire_table_sh(&p, "demo", NULL, 0, 1);
    ck_assert_str_eq(r->acquire->lease->tensor_table_slab->shm_name, name);
    uint8_t digest[16];
    memcpy(digest, m->table_digest, 16);
    r = acquire_table_sh(&p, "demo", digest, 1, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->acquire->lease->tensor_table_cached, 1);
    ck_assert_ptr_null(r->acquire->lease->tensor_table_slab);
    ck_assert_ptr_null(F.frame);

    /* Without the flag: as before. */
    r = acquire_table_ex(&p, "demo", NULL, 1);
    ck_assert_ptr_null(r->acquire->lease->tensor_table_slab);
    ck_assert_int_eq(r->acquire->lease->tensor_table_in_frame, 1);

    /* No shared tail: the frame when asked, else the table inside. */
    uint8_t *tail = m->wire[0].shared_tail;
    m->wire[0].shared_tail = NULL;
    r = acquire_table_sh(&p, "demo", NULL, 1, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_ptr_null(r->acquire->lease->tensor_table_slab);
    ck_assert_int_eq(r->acquire->lease->tensor_table_in_frame, 1);
    ck_assert_ptr_eq(F.frame, m->table);
    r = acquire_table_sh(&p, "demo", NULL, 0, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_ptr_null(r->acquire->lease->tensor_table_slab);
    ck_assert_uint_eq(r->acquire->lease->tensor_table.len, m->table_len);
    ck_assert_ptr_null(F.frame);
    m->wire[0].shared_tail = tail;
}
END_TEST

/* A broker whose slabs are memfds makes no shared table (nothing of a
 * model may be left in /dev/shm): a client asking for it gets the frame. */
START_TEST(test_shared_table_not_for_memfd)
{
    wb_model *m = fixture_model_on(&F.b, "demo", &wb__backend_host_memfd);
    ck_assert_ptr_null(m->table_shm.addr);
    wb_peer_creds p = me();
    Wbproto__Reply *r = acquire_table_sh(&p, "demo", NULL, 1, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_ptr_null(r->acquire->lease->tensor_table_slab);
    ck_assert_int_eq(r->acquire->lease->tensor_table_in_frame, 1);
    ck_assert_ptr_eq(F.frame, m->table);
}
END_TEST

/* A model on CUDA IPC slabs publishes its table too (a client of legacy
 * CUDA IPC shares the host's /dev/shm); one on descriptor slabs (cuda-vmm,
 * for clients that need not) does not. */
START_TEST(test_shared_table_for_cuda_ipc)
{
    wb_model *m = fixture_twin_model(&F.b);
    ck_assert_ptr_nonnull(m->table_shm.addr);
    ck_assert_str_eq(m->table_slab.transport, "shm");
    wb_peer_creds p = me();
    Wbproto__Reply *r = acquire_table_sh(&p, "twin", NULL, 1, 1);
    ck_assert_int_eq(r->status, 0);
    const Wbproto__Lease *l = r->acquire->lease;
    ck_assert_ptr_nonnull(l->tensor_table_slab);
    ck_assert_str_eq(l->tensor_table_slab->shm_name, m->table_shm.name);
    ck_assert_int_eq(l->slabs[0]->backend, WBPROTO__BACKEND__BACKEND_CUDA);
    ck_assert_int_eq(memcmp(m->table_shm.addr, m->table, m->table_len), 0);

    static wb_backend vmm;
    vmm = *fixture_twin_backend();
    vmm.transport = "cuda-vmm";
    wb_model *v = fixture_twin_model_on(&F.b, "vmm", &vmm);
    ck_assert_ptr_null(v->table_shm.addr);
    r = acquire_table_sh(&p, "vmm", NULL, 1, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_ptr_null(r->acquire->lease->tensor_table_slab);
}
END_TEST

/* An acquire reply carries the model's tensor table packed once: the Lease
 * it packs must be byte for byte the Lease packed field by field. */
START_TEST(test_lease_tail_bytes)
{
    wb_model *m = fixture_model(&F.b, "demo");
    ck_assert_ptr_nonnull(m->wire[0].lease_tail);
    uint8_t id[16];
    for (int i = 0; i < 16; i++)
        id[i] = (uint8_t)(0xa0 + i);
    Wbproto__Lease full = WBPROTO__LEASE__INIT;
    full.id.data = id;
    full.id.len = sizeof id;
    full.model = m->name;
    full.n_slabs = 1;
    full.slabs = &m->wire[0].slab_ptr;
    full.n_tensors = m->data.n_tensors;
    full.tensors = m->wire_tensor_ptrs;
    full.version = m->version;
    size_t want_len = wbproto__lease__get_packed_size(&full);
    uint8_t *want = malloc(want_len);
    ck_assert_uint_eq(wbproto__lease__pack(&full, want), want_len);

    wb_arena a = {0};
    Wbproto__Lease fast = WBPROTO__LEASE__INIT;
    fast.id.data = id;
    fast.id.len = sizeof id;
    ck_assert_int_eq(wb__ops_lease_tail(m, 0, 0, &fast, &a), WB_OK);
    ck_assert_uint_eq(wbproto__lease__get_packed_size(&fast), want_len);
    uint8_t *got = malloc(want_len);
    ck_assert_uint_eq(wbproto__lease__pack(&fast, got), want_len);
    ck_assert_int_eq(memcmp(got, want, want_len), 0);
    ck_assert_uint_eq(m->wire_lease_size, want_len);

    /* Without a tail (memory was short at load), the fields are filled. */
    uint8_t *tail = m->wire[0].lease_tail;
    m->wire[0].lease_tail = NULL;
    Wbproto__Lease none = WBPROTO__LEASE__INIT;
    ck_assert_int_eq(wb__ops_lease_tail(m, 0, 0, &none, &a), WB_EINVAL);
    ck_assert_uint_eq(none.base.n_unknown_fields, 0);
    /* A copy the model does not have. */
    ck_assert_int_eq(wb__ops_lease_tail(m, 1, 0, &none, &a), WB_EINVAL);
    m->wire[0].lease_tail = tail;
    wb__arena_free(&a);
    free(want);
    free(got);
}
END_TEST

START_TEST(test_acquire)
{
    wb_model *m = fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    Wbproto__Reply *r = fixture_acquire(&F, &p, "nope");
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_str_eq(r->error, "no model named 'nope'");
    ck_assert_int_eq(r->body_case, WBPROTO__REPLY__BODY__NOT_SET);

    r = fixture_acquire(&F, &p, "demo");
    ck_assert_int_eq(r->status, 0);
    const Wbproto__Lease *l = r->acquire->lease;
    ck_assert_uint_eq(l->id.len, 16);
    ck_assert_str_eq(l->model, "demo");
    ck_assert_uint_eq(l->n_slabs, 1);
    ck_assert_uint_eq(l->slabs[0]->index, 0);
    ck_assert_int_eq(l->slabs[0]->backend, WBPROTO__BACKEND__BACKEND_HOST);
    ck_assert_int_eq(l->slabs[0]->device, -1);
    ck_assert_uint_eq(l->slabs[0]->size, m->data.slabs[0].size);
    ck_assert_str_eq(l->slabs[0]->shm_name, m->data.slabs[0].shm.name);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "/wb-%d-", (int)getpid());
    ck_assert_int_eq(strncmp(l->slabs[0]->shm_name, prefix, strlen(prefix)), 0);
    ck_assert_uint_eq(l->slabs[0]->cuda_ipc_handle.len, 0);
    ck_assert_uint_eq(l->n_tensors, 2);
    ck_assert_str_eq(l->tensors[1]->name, "b");
    ck_assert_str_eq(l->tensors[1]->dtype, "F32");
    ck_assert_uint_eq(l->tensors[1]->n_shape, 2);
    ck_assert_uint_eq(l->tensors[1]->shape[0], 2);
    ck_assert_uint_eq(l->tensors[1]->offset, 256);
    ck_assert_uint_eq(l->tensors[1]->nbytes, 16);

    /* A client maps the slab read-only and checks every tensor. */
    wb_shm ro;
    wb_err err;
    ck_assert_int_eq(wb__shm_map_ro(&ro, l->slabs[0]->shm_name, l->slabs[0]->size, &err), WB_OK);
    for (size_t i = 0; i < l->n_tensors; i++) {
        const Wbproto__Tensor *t = l->tensors[i];
        ck_assert_uint_eq(XXH3_64bits((uint8_t *)ro.addr + t->offset, t->nbytes), t->xxh3);
    }
    wb__shm_unmap(&ro);

    ck_assert_uint_eq(m->leases, 1);
    ck_assert_uint_eq(F.b.stats.leases_granted, 1);
    wb_lease_rec *rec = wb__leases_find(&F.b.leases, l->id.data);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(rec->comm, "test_ops_lease");
    ck_assert_ptr_nonnull(wb__leases_peer(&F.b.leases, (uint32_t)getpid()));

    /* A loading model is not leased. */
    wb_model *loading = wb__model_new("later", "/x", &wb__backend_host, -1);
    wb__models_add(&F.b.models, loading);
    r = fixture_acquire(&F, &p, "later");
    ck_assert_int_eq(r->status, WB_ESTATE);
    ck_assert_ptr_nonnull(strstr(r->error, "model 'later' is loading"));
}
END_TEST

START_TEST(test_acquire_dead_peer)
{
    fixture_model(&F.b, "demo");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    wb_peer_creds p = creds(1, 1, (uint32_t)pid);
    Wbproto__Reply *r = fixture_acquire(&F, &p, "demo");
    ck_assert_int_eq(r->status, WB_EPERM);
    ck_assert_ptr_nonnull(strstr(r->error, "exited before its lease was granted"));
    ck_assert_uint_eq(F.b.leases.n_leases, 0);
    ck_assert_uint_eq(wb__models_find(&F.b.models, "demo")->leases, 0);
}
END_TEST

START_TEST(test_release)
{
    wb_model *m = fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    uint8_t id[16];
    memcpy(id, fixture_acquire(&F, &p, "demo")->acquire->lease->id.data, 16);
    char s8[9], want[80];
    wb__lease_id_short(id, s8);

    wb_peer_creds other = creds(p.uid, p.gid, p.pid + 1);
    Wbproto__Reply *r = fixture_release(&F, &other, id);
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want, "lease %s belongs to pid %u", s8, p.pid);
    ck_assert_str_eq(r->error, want);
    ck_assert_uint_eq(m->leases, 1);

    r = fixture_release(&F, &p, id);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->release->model_state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(m->leases, 0);
    ck_assert_uint_eq(F.b.stats.leases_released, 1);
    /* The peer's record stays for its next acquire; it holds nothing. */
    ck_assert_uint_eq(F.b.leases.n_holders, 0);
    ck_assert_uint_eq(F.b.leases.n_peers, 1);

    r = fixture_release(&F, &p, id);
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    snprintf(want, sizeof want, "no lease %s", s8);
    ck_assert_str_eq(r->error, want);
}
END_TEST

static Wbproto__Reply *acquire_on(const wb_peer_creds *p, int device_set, int device,
                                  const char *uuid, int allow_peer)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__AcquireRequest a = WBPROTO__ACQUIRE_REQUEST__INIT;
    a.model = "twin";
    a.device_set = device_set;
    a.device = device;
    a.device_uuid = (char *)uuid;
    a.allow_peer = allow_peer;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &a;
    return call(p, &req);
}

/* A lease names the device the worker runs on and gets that device's copy;
 * a device with no ready copy is refused with the reason; old clients get
 * the first ready copy; the listing shows every copy. */
START_TEST(test_acquire_per_device)
{
    wb_model *m = fixture_twin_model(&F.b);
    wb_peer_creds p = me();
    Wbproto__Reply *r = acquire_on(&p, 0, 0, UUID1, 0);
    ck_assert_msg(r->status == 0, "%s", r->error);
    const Wbproto__Lease *l = r->acquire->lease;
    ck_assert_uint_eq(l->n_slabs, 1);
    ck_assert_int_eq(l->slabs[0]->device, 1);
    ck_assert_str_eq(l->slabs[0]->device_uuid, UUID1);
    ck_assert_uint_eq(l->slabs[0]->index, 0);
    ck_assert_uint_eq(l->slabs[0]->cuda_ipc_handle.data[0], 2); /* device 1's slab */
    ck_assert_uint_eq(m->data.copies[1].leases, 1);

    /* By the broker's ordinal when no UUID is given. */
    r = acquire_on(&p, 1, 0, "", 0);
    ck_assert_int_eq(r->status, 0);
    ck_assert_str_eq(r->acquire->lease->slabs[0]->device_uuid, UUID0);
    uint8_t id0[16];
    memcpy(id0, r->acquire->lease->id.data, 16);

    /* An older client names no device: the first ready copy. */
    r = fixture_acquire(&F, &p, "twin");
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->acquire->lease->slabs[0]->device, 0);

    /* The failed copy and devices without a copy are refused clearly. */
    r = acquire_on(&p, 0, 0, UUID2, 0);
    ck_assert_int_eq(r->status, WB_ENOGPU);
    ck_assert_str_eq(r->error, "model 'twin' has no ready copy on device " UUID2
                               "; its copies: 0=" UUID0 " ready, 1=" UUID1 " ready, 2=" UUID2
                               " failed (load it there, or ask for peer access)");
    r = acquire_on(&p, 1, 5, "", 0);
    ck_assert_int_eq(r->status, WB_ENOGPU);
    ck_assert_ptr_nonnull(strstr(r->error, "has no ready copy on device 5 (the broker's ordinal)"));
    r = acquire_on(&p, 0, 0, "GPU-99999999-1111-2222-3333-444444444444", 0);
    ck_assert_int_eq(r->status, WB_ENOGPU);
    /* With peer access: the first ready copy. */
    r = acquire_on(&p, 1, 5, "", 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->acquire->lease->slabs[0]->device, 0);
    ck_assert_uint_eq(m->leases, 4);
    ck_assert_uint_eq(m->data.copies[0].leases, 3);

    /* The listing: one entry per device with its state, bytes and leases. */
    r = simple(&p, WBPROTO__REQUEST__BODY_LIST_MODELS);
    ck_assert_int_eq(r->status, 0);
    const Wbproto__ModelInfo *mi = NULL;
    for (size_t i = 0; i < r->list_models->n_models; i++) {
        if (strcmp(r->list_models->models[i]->name, "twin") == 0)
            mi = r->list_models->models[i];
    }
    ck_assert_ptr_nonnull(mi);
    ck_assert_uint_eq(mi->n_copies, 3);
    ck_assert_int_eq(mi->copies[1]->device, 1);
    ck_assert_str_eq(mi->copies[1]->device_uuid, UUID1);
    ck_assert_int_eq(mi->copies[1]->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(mi->copies[1]->slab_bytes, 256);
    ck_assert_uint_eq(mi->copies[1]->leases, 1);
    ck_assert_uint_eq(mi->copies[0]->leases, 3);
    ck_assert_int_eq(mi->copies[2]->state, WBPROTO__MODEL_STATE__MODEL_FAILED);
    ck_assert_str_eq(mi->copies[2]->error, "cudaMalloc of 256 bytes on device 2: out of memory");
    ck_assert_uint_eq(mi->copies[2]->slab_bytes, 0);

    /* A release counts down its own copy. */
    r = fixture_release(&F, &p, id0);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(m->data.copies[0].leases, 2);
    ck_assert_uint_eq(m->data.copies[1].leases, 1);
}
END_TEST

/* A lease belongs to the process that acquired it. When that process has
 * exited and its pid is reused (by a process of another uid here), the new
 * process may not release the lease: the broker checks the pidfd before
 * acting for the pid, reclaims the dead process's leases, and the request
 * finds none. The event loop is not running: only that check can notice. */
START_TEST(test_release_after_pid_reuse)
{
    wb_model *m = fixture_model(&F.b, "demo");
    int go[2];
    ck_assert_int_eq(pipe(go), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char c;
        close(go[1]);
        (void)!read(go[0], &c, 1);
        _exit(0);
    }
    close(go[0]);
    wb_peer_creds owner = creds(1000, 1000, (uint32_t)pid);
    uint8_t id[16];
    Wbproto__Reply *r = fixture_acquire(&F, &owner, "demo");
    ck_assert_int_eq(r->status, 0);
    memcpy(id, r->acquire->lease->id.data, 16);
    char s8[9], want[80];
    wb__lease_id_short(id, s8);

    /* While the owner lives, the same pid under another uid is refused. */
    wb_peer_creds reuser = creds(65534, 65534, (uint32_t)pid);
    r = fixture_release(&F, &reuser, id);
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want, "lease %s belongs to pid %u (uid 1000)", s8, (unsigned)pid);
    ck_assert_str_eq(r->error, want);
    ck_assert_uint_eq(F.b.leases.n_leases, 1);

    /* The owner exits; a new process with its pid asks. */
    close(go[1]);
    waitpid(pid, NULL, 0);
    r = fixture_release(&F, &reuser, id);
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    snprintf(want, sizeof want, "no lease %s", s8);
    ck_assert_str_eq(r->error, want);
    ck_assert_uint_eq(F.b.leases.n_leases, 0);
    ck_assert_uint_eq(F.b.leases.n_peers, 0);
    ck_assert_uint_eq(F.b.stats.leases_reclaimed, 1);
    ck_assert_uint_eq(F.b.stats.leases_released, 0);
    ck_assert_uint_eq(m->leases, 0);
    /* Even with the dead owner's uid: a new process holds none of it. */
    ck_assert_int_eq(fixture_release(&F, &owner, id)->status, WB_ENOTFOUND);
}
END_TEST

START_TEST(test_heartbeat)
{
    fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    uint8_t mine[16], unknown[16] = {0xee};
    memcpy(mine, fixture_acquire(&F, &p, "demo")->acquire->lease->id.data, 16);

    /* A lease held by another (live) process: this process's own parent. */
    wb_peer_creds parent = creds(p.uid, p.gid, (uint32_t)getppid());
    uint8_t theirs[16];
    memcpy(theirs, fixture_acquire(&F, &parent, "demo")->acquire->lease->id.data, 16);

    advance_ms(1001);
    ck_assert_uint_eq(wb__broker_scan_stale(&F.b), 2);
    wb_lease_rec *rec = wb__leases_find(&F.b.leases, mine);
    ck_assert_int_eq(rec->state, WBPROTO__LEASE_STATE__LEASE_STALE);

    Wbproto__LeaseBeat b1 = WBPROTO__LEASE_BEAT__INIT, b2 = WBPROTO__LEASE_BEAT__INIT,
                       b3 = WBPROTO__LEASE_BEAT__INIT;
    b1.lease_id.data = mine;
    b1.lease_id.len = 16;
    b1.containers = 2;
    b2.lease_id.data = unknown;
    b2.lease_id.len = 16;
    b3.lease_id.data = theirs;
    b3.lease_id.len = 16;
    Wbproto__LeaseBeat *beats[] = {&b1, &b2, &b3};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 3;
    hb.leases = beats;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    Wbproto__Reply *r = call(&p, &req);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->heartbeat->n_unknown_leases, 2);
    ck_assert_mem_eq(r->heartbeat->unknown_leases[0].data, unknown, 16);
    ck_assert_mem_eq(r->heartbeat->unknown_leases[1].data, theirs, 16);
    ck_assert_int_eq(rec->state, WBPROTO__LEASE_STATE__LEASE_ACTIVE);
    ck_assert_uint_eq(rec->containers, 2);
    ck_assert_int_eq(rec->last_beat_ms, fake_ms);
    /* The other process's lease is untouched: still stale. */
    ck_assert_int_eq(wb__leases_find(&F.b.leases, theirs)->state,
                     WBPROTO__LEASE_STATE__LEASE_STALE);

    /* An empty heartbeat is valid. */
    hb.n_leases = 0;
    r = call(&p, &req);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->heartbeat->n_unknown_leases, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_lease");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_hello);
    tcase_add_test(tc, test_acquire);
    tcase_add_test(tc, test_lease_tail_bytes);
    tcase_add_test(tc, test_acquire_cached_table);
    tcase_add_test(tc, test_acquire_table_frame);
    tcase_add_test(tc, test_acquire_shared_table);
    tcase_add_test(tc, test_shared_table_not_for_memfd);
    tcase_add_test(tc, test_shared_table_for_cuda_ipc);
    tcase_add_test(tc, test_acquire_dead_peer);
    tcase_add_test(tc, test_release);
    tcase_add_test(tc, test_release_after_pid_reuse);
    tcase_add_test(tc, test_acquire_per_device);
    tcase_add_test(tc, test_heartbeat);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
