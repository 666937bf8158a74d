/* The request handlers, without sockets: each operation's reply as the
 * contract specifies it (contents, status codes and messages), admin checks,
 * draining and freeing, loads (inline, and on a loader thread for the
 * cancelled and no_wait loads), the records of failed loads, and that every
 * reply packs into bytes the client-side decoder accepts. */
/* The test defines pread() itself (below); glibc's fortified inline one
 * would clash with it. */
#undef _FORTIFY_SOURCE
#include "broker_fixture.h"
#include "ops.h"
#include "ops_admin.h"
#include "wire.h"

#include <check.h>
#include <xxhash.h>

#include <dirent.h>
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static broker_fixture F;

/* pread() as the loader's readers see it here: a read of tensor data (a
 * block, not a header's few bytes) from a file whose path holds "gated"
 * waits while the gate is closed, so that a test holds a load in the middle
 * of its reads for as long as it needs. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_closed, gate_reads;

static int fd_path_has(int fd, const char *part)
{
    char link[64], target[512];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0)
        return 0;
    target[n] = '\0';
    return strstr(target, part) != NULL;
}

ssize_t pread(int fd, void *buf, size_t len, off_t off)
{
    static ssize_t (*real_pread)(int, void *, size_t, off_t);
    if (!real_pread)
        *(void **)&real_pread = dlsym(RTLD_NEXT, "pread");
    if (len >= 65536 && fd_path_has(fd, "gated")) {
        pthread_mutex_lock(&gate_mu);
        gate_reads++;
        pthread_cond_broadcast(&gate_cv);
        while (gate_closed)
            pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
    return real_pread(fd, buf, len, off);
}

static void gate_set(int closed)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = closed;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* Waits (up to 5 s) until a gated read has begun. */
static void gate_wait_read(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&gate_mu);
    while (gate_reads == 0 && pthread_cond_timedwait(&gate_cv, &gate_mu, &until) == 0)
        ;
    int n = gate_reads;
    pthread_mutex_unlock(&gate_mu);
    ck_assert_msg(n > 0, "the load never read its file");
}

static void setup(void)
{
    fixture_open(&F, "ops");
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
        req.stats = &st;
        break;
    }
    return call(peer, &req);
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

    /* Unknown credentials: refused. */
    wb_peer_creds none = {0};
    r = simple(&none, WBPROTO__REQUEST__BODY_HELLO);
    ck_assert_int_eq(r->status, WB_EPERM);
    ck_assert_str_eq(r->error, "the peer's credentials cannot be read");
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
    ck_assert_ptr_null(F.b.reply_frame);
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
    ck_assert_ptr_eq(F.b.reply_frame, m->table);
    ck_assert_uint_eq(F.b.reply_frame_len, inside_len);
    ck_assert_int_eq(memcmp(F.b.reply_frame, inside, inside_len), 0);
    wb_err err;
    ck_assert_int_eq(
        wb__tensor_table_check(F.b.reply_frame, F.b.reply_frame_len, l->slabs, l->n_slabs, &err),
        WB_OK);

    uint8_t digest[16];
    wb__tensor_table_digest(inside, inside_len, digest);
    r = acquire_table_ex(&p, "demo", digest, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->acquire->lease->tensor_table_cached, 1);
    ck_assert_int_eq(r->acquire->lease->tensor_table_in_frame, 0);
    ck_assert_ptr_null(F.b.reply_frame);
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
    ck_assert_ptr_null(F.b.reply_frame);
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
    ck_assert_ptr_null(F.b.reply_frame);

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
    ck_assert_ptr_eq(F.b.reply_frame, m->table);
    r = acquire_table_sh(&p, "demo", NULL, 0, 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_ptr_null(r->acquire->lease->tensor_table_slab);
    ck_assert_uint_eq(r->acquire->lease->tensor_table.len, m->table_len);
    ck_assert_ptr_null(F.b.reply_frame);
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
    ck_assert_ptr_eq(F.b.reply_frame, m->table);
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
    ck_assert_str_eq(rec->comm, "test_ops");
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

/* A lease belongs to the process that acquired it. When that process has
 * exited and its pid is reused (by a process of another uid here), the new
 * process may not release the lease: the broker checks the pidfd before
 * acting for the pid, reclaims the dead process's leases, and the request
 * finds none. The event loop is not running: only that check can notice. */
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
    ck_assert_str_eq(li->process_name, "test_ops");
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

START_TEST(test_unload_and_drain)
{
    wb_model *m = fixture_model(&F.b, "demo");
    wb_model *idle = fixture_model(&F.b, "idle");
    char idle_shm[WB_SHM_NAME_MAX], demo_shm[WB_SHM_NAME_MAX];
    char idle_table[WB_SHM_NAME_MAX], demo_table[WB_SHM_NAME_MAX];
    strcpy(idle_shm, idle->data.slabs[0].shm.name);
    strcpy(demo_shm, m->data.slabs[0].shm.name);
    /* The shared tensor tables live and go with their models. */
    strcpy(idle_table, idle->table_shm.name);
    strcpy(demo_table, m->table_shm.name);
    ck_assert(shm_name_exists(idle_table));
    ck_assert(shm_name_exists(demo_table));
    wb_peer_creds p = me();
    wb_peer_creds stranger = creds(p.uid + 1, p.gid, p.pid);
    if (p.uid == 0)
        stranger.uid = 4321;

    Wbproto__Reply *r = fixture_unload(&F, &stranger, "demo");
    ck_assert_int_eq(r->status, WB_EPERM);
    char want[80];
    snprintf(want, sizeof want, "uid %u may not unload models", stranger.uid);
    ck_assert_str_eq(r->error, want);

    r = fixture_unload(&F, &p, "nope");
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_str_eq(r->error, "no model named 'nope'");

    /* No leases: freed at once. */
    r = fixture_unload(&F, &p, "idle");
    ck_assert_int_eq(r->status, 0);
    ck_assert_str_eq(r->unload->model->name, "idle");
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert_ptr_null(wb__models_find(&F.b.models, "idle"));
    ck_assert(!shm_name_exists(idle_shm));
    ck_assert(!shm_name_exists(idle_table));

    /* With leases: draining; new leases refused; freed at the last release. */
    uint8_t id1[16], id2[16];
    memcpy(id1, fixture_acquire(&F, &p, "demo")->acquire->lease->id.data, 16);
    memcpy(id2, fixture_acquire(&F, &p, "demo")->acquire->lease->id.data, 16);
    r = fixture_unload(&F, &p, "demo");
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_DRAINING);
    ck_assert_uint_eq(r->unload->model->leases, 2);
    r = fixture_unload(&F, &p, "demo");
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_DRAINING);

    r = fixture_acquire(&F, &p, "demo");
    ck_assert_int_eq(r->status, WB_ESTATE);
    ck_assert_str_eq(r->error,
                     "model 'demo' is draining (unload requested); new leases are refused");

    r = simple(&p, WBPROTO__REQUEST__BODY_LIST_MODELS);
    ck_assert_uint_eq(r->list_models->n_models, 1);
    ck_assert_int_eq(r->list_models->models[0]->state, WBPROTO__MODEL_STATE__MODEL_DRAINING);

    r = fixture_release(&F, &p, id1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->release->model_state, WBPROTO__MODEL_STATE__MODEL_DRAINING);
    ck_assert(shm_name_exists(demo_shm));
    ck_assert(shm_name_exists(demo_table));
    r = fixture_release(&F, &p, id2);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->release->model_state, WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert(!shm_name_exists(demo_shm));
    ck_assert(!shm_name_exists(demo_table));
    r = simple(&p, WBPROTO__REQUEST__BODY_LIST_MODELS);
    ck_assert_uint_eq(r->list_models->n_models, 0);

    /* A loading model's unload stops its load (here one that has none
     * running) and frees it. */
    wb__models_add(&F.b.models, wb__model_new("later", "/x", &wb__backend_host, -1));
    r = fixture_unload(&F, &p, "later");
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert(r->unload->load_cancelled);
    ck_assert_ptr_null(wb__models_find(&F.b.models, "later"));
    ck_assert_uint_eq(F.b.stats.loads_cancelled, 1);
    ck_assert_uint_eq(F.b.stats.loads_total, 0);
}
END_TEST

static const char *data_path(const char *rel)
{
    static char buf[1024];
    const char *dir = getenv("WB_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/%s", dir && *dir ? dir : "tests/data", rel);
    return buf;
}

START_TEST(test_load)
{
    wb_peer_creds p = me();
    wb_peer_creds stranger = creds(p.uid == 0 ? 4321 : p.uid + 1, p.gid, p.pid);
    const char *path = data_path("official/gpt2/model.safetensors");

    Wbproto__Reply *r = fixture_load(&F, &stranger, "gpt2", path);
    ck_assert_int_eq(r->status, WB_EPERM);
    char want[80];
    snprintf(want, sizeof want, "uid %u may not load models", stranger.uid);
    ck_assert_str_eq(r->error, want);

    static const char *const bad_names[] = {"has space", "semi;colon", "slash/x", "ü"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        r = fixture_load(&F, &p, bad_names[i], path);
        ck_assert_int_eq(r->status, WB_EINVAL);
        ck_assert_ptr_nonnull(strstr(r->error, "is not 1 to 255 characters of A-Z a-z 0-9 . _ -"));
    }
    char longname[300];
    memset(longname, 'x', 256);
    longname[256] = '\0';
    r = fixture_load(&F, &p, longname, path);
    ck_assert_int_eq(r->status, WB_EINVAL);

    r = fixture_load(&F, &p, "gpt2.v1_A-b", path);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
    ck_assert_int_eq(r->body_case, WBPROTO__REPLY__BODY_LOAD);
    ck_assert_str_eq(r->load->model->name, "gpt2.v1_A-b");
    ck_assert_str_eq(r->load->model->path, path);
    ck_assert_int_eq(r->load->model->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(r->load->model->tensors, 28);
    ck_assert_uint_eq(r->load->model->bytes, 126464);
    ck_assert(r->load->model->load_seconds > 0);
    ck_assert_double_eq_tol(r->load->model->load_gbps, 126464 / r->load->model->load_seconds / 1e9,
                            1e-9);
    ck_assert_uint_eq(F.b.stats.loads_total, 1);
    ck_assert_uint_eq(F.b.stats.load_bytes_total, 126464);

    r = fixture_load(&F, &p, "gpt2.v1_A-b", path);
    ck_assert_int_eq(r->status, WB_EEXIST);
    ck_assert_str_eq(r->error, "a model named 'gpt2.v1_A-b' already exists (ready)");

    /* A failed load leaves nothing behind. */
    r = fixture_load(&F, &p, "missing", "/nonexistent/model.safetensors");
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(r->error, "/nonexistent/model.safetensors"));
    ck_assert_ptr_null(wb__models_find(&F.b.models, "missing"));
    ck_assert_uint_eq(F.b.stats.loads_total, 2);
    ck_assert_uint_eq(F.b.stats.loads_failed, 1);

    r = fixture_acquire(&F, &p, "gpt2.v1_A-b");
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->acquire->lease->n_tensors, 28);
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

/* Slab and table names of this process (the broker here) in /dev/shm. */
static int my_shm(void)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "wb-%ld-", (long)getpid());
    DIR *d = opendir("/dev/shm");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* A checkpoint in the scratch directory: one U8 tensor "w" of `bytes`
 * zeros. Returns its path (static storage, one per slot). */
static const char *checkpoint(int slot, const char *name, uint64_t bytes)
{
    static char paths[4][200];
    char *path = paths[slot];
    snprintf(path, sizeof paths[slot], "%s/%s", F.dir, name);
    char hdr[160];
    int n = snprintf(hdr, sizeof hdr,
                     "{\"w\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[0,%llu]}}",
                     (unsigned long long)bytes, (unsigned long long)bytes);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    ck_assert_uint_eq(fwrite(len, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite(hdr, 1, (size_t)n, f), (size_t)n);
    ck_assert_int_eq(ftruncate(fileno(f), (off_t)(8 + (uint64_t)n + bytes)), 0);
    fclose(f);
    return path;
}

/* Packs and decodes a reply as a client would (into F.decoded). */
static Wbproto__Reply *decoded(Wbproto__Reply *rep)
{
    size_t len;
    uint8_t *buf = wb__reply_pack(rep, &len);
    ck_assert_ptr_nonnull(buf);
    wb__reply_free(&F.decoded);
    wb_err err;
    ck_assert_msg(wb__reply_decode(buf, len, &F.decoded, &err) == WB_OK, "reply: %s", err.msg);
    free(buf);
    wb__arena_free(&F.a);
    return F.decoded;
}

/* A load on the loader thread: NULL when its reply is deferred, else the
 * reply (a refusal, or with no_wait the loading model). */
static Wbproto__Reply *load_async(const wb_peer_creds *p, const char *name, const char *path,
                                  int no_wait)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__LoadRequest l = WBPROTO__LOAD_REQUEST__INIT;
    l.name = (char *)name;
    l.path = (char *)path;
    l.no_wait = no_wait;
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &l;
    req.version = WB_PROTOCOL_VERSION;
    req.id = ++F.next_id;
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    int rc = wb__ops_handle(&F.b, p, &req, F.ident, sizeof F.ident, &F.a, &rep);
    if (rc == WB_OPS_DEFERRED) {
        wb__arena_free(&F.a);
        return NULL;
    }
    ck_assert_int_eq(rc, 0);
    return decoded(&rep);
}

static Wbproto__Reply *cancel(const wb_peer_creds *p, const char *name)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__UnloadRequest u = WBPROTO__UNLOAD_REQUEST__INIT;
    u.name = (char *)name;
    u.cancel_only = 1;
    req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    req.unload = &u;
    return fixture_send(&F, p, &req);
}

static wb_loader L;
static wb_load_job *done_jobs;

static void loader_start(void)
{
    wb_err err;
    ck_assert_int_eq(wb__loader_start(&L, &err), WB_OK);
    F.b.loader = &L;
    done_jobs = NULL;
}

static void loader_stop(void)
{
    ck_assert_ptr_null(done_jobs);
    ck_assert_ptr_null(wb__loader_stop(&L));
    F.b.loader = NULL;
}

/* The next job the loader hands back (waiting up to 5 s for it), finished
 * as the loop does (loop.c, handle_loads). Returns its request's reply as
 * the client decodes it, or NULL for a load nobody waits for. */
static Wbproto__Reply *next_done(void)
{
    for (int tries = 0; !done_jobs && tries < 50; tries++) {
        struct pollfd pfd = {.fd = L.efd, .events = POLLIN};
        if (poll(&pfd, 1, 100) == 1)
            done_jobs = wb__loader_take_done(&L);
    }
    ck_assert_msg(done_jobs != NULL, "no load came back from the loader");
    wb_load_job *job = done_jobs;
    done_jobs = job->next;
    wb_model *model;
    wb__broker_finish_load(&F.b, job, &model);
    Wbproto__Reply *r = NULL;
    if (job->ident) {
        Wbproto__Reply rep = WBPROTO__REPLY__INIT;
        wb__ops_load_done(&F.b, job, model, &F.a, &rep);
        r = decoded(&rep);
    }
    wb__load_job_free(&job);
    return r;
}

/* Unloading a loading model stops its load: a load still queued behind
 * another never starts, the one reading stops between chunks, each model
 * leaves the registry at once (its name is free again), what the load had
 * made is freed, and each load's request is answered with who cancelled
 * it. A cancel of a model that is not loading is refused. */
START_TEST(test_cancel_loads)
{
    wb_peer_creds p = me();
    const char *slow = checkpoint(0, "gated.safetensors", 16u << 20);
    const char *quick = checkpoint(1, "quick.safetensors", 4096);
    int shm_before = my_shm();
    loader_start();
    gate_set(1);
    ck_assert_ptr_null(load_async(&p, "big", slow, 0));
    gate_wait_read();
    ck_assert_ptr_null(load_async(&p, "queued", quick, 0));
    Wbproto__Reply *r = simple(&p, WBPROTO__REQUEST__BODY_STATS);
    ck_assert_uint_eq(r->stats->loads_in_progress, 2);
    ck_assert_uint_eq(r->stats->loading_total_bytes, 16u << 20);

    /* The queued one: handed back at once, the first still reading. */
    r = cancel(&p, "queued");
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->body_case, WBPROTO__REPLY__BODY_UNLOAD);
    ck_assert_str_eq(r->unload->model->name, "queued");
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert(r->unload->load_cancelled);
    ck_assert_ptr_null(wb__models_find(&F.b.models, "queued"));
    r = next_done();
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, WB_ESTATE);
    char want[200];
    snprintf(want, sizeof want, "the load of model 'queued' was cancelled by pid %u (uid %u)",
             p.pid, p.uid);
    ck_assert_str_eq(r->error, want);

    /* The reading one, by a plain unload: gone now, its name free for a
     * new load (queued behind the stopping one). */
    r = fixture_unload(&F, &p, "big");
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert(r->unload->load_cancelled);
    ck_assert_ptr_null(wb__models_find(&F.b.models, "big"));
    ck_assert_ptr_null(load_async(&p, "big", quick, 0));
    gate_set(0);
    r = next_done();
    ck_assert_int_eq(r->status, WB_ESTATE);
    snprintf(want, sizeof want,
             "the load of model 'big' was cancelled: pid %u (uid %u) unloaded the model", p.pid,
             p.uid);
    ck_assert_str_eq(r->error, want);
    /* Nothing of the stopped load is left: only the new model's slab and
     * shared table. */
    r = next_done();
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->load->model->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(r->load->model->bytes, 4096);
    ck_assert_int_eq(my_shm(), shm_before + 2);

    /* Counted apart from finished loads. */
    r = simple(&p, WBPROTO__REQUEST__BODY_STATS);
    ck_assert_uint_eq(r->stats->loads_cancelled, 2);
    ck_assert_uint_eq(r->stats->loads_total, 1);
    ck_assert_uint_eq(r->stats->loads_failed, 0);
    ck_assert_uint_eq(r->stats->loads_in_progress, 0);
    ck_assert_uint_eq(r->stats->models, 1);

    /* Only a load can be cancelled. */
    r = cancel(&p, "big");
    ck_assert_int_eq(r->status, WB_ESTATE);
    ck_assert_str_eq(r->error,
                     "model 'big' is ready, not loading: there is no load to cancel (unload it "
                     "instead)");
    ck_assert_int_eq(wb__models_find(&F.b.models, "big")->state, WBPROTO__MODEL_STATE__MODEL_READY);
    r = cancel(&p, "nope");
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_str_eq(r->error, "no model named 'nope'");
    wb_peer_creds stranger = creds(p.uid == 0 ? 4321 : p.uid + 1, p.gid, p.pid);
    r = cancel(&stranger, "big");
    ck_assert_int_eq(r->status, WB_EPERM);
    snprintf(want, sizeof want, "uid %u may not unload models", stranger.uid);
    ck_assert_str_eq(r->error, want);

    r = fixture_unload(&F, &p, "big");
    ck_assert_int_eq(r->status, 0);
    ck_assert(!r->unload->load_cancelled);
    ck_assert_int_eq(my_shm(), shm_before);
    loader_stop();
}
END_TEST

/* A no_wait load is answered at once with the model loading, and nothing
 * when it ends; one that fails stays listed as failed with its error
 * (nobody else is told), refuses leases with it, and is replaced by the
 * next load of its name. */
START_TEST(test_load_no_wait)
{
    wb_peer_creds p = me();
    const char *slow = checkpoint(0, "gated.safetensors", 1u << 20);
    loader_start();
    gate_set(1);
    Wbproto__Reply *r = load_async(&p, "nw", slow, 1);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->body_case, WBPROTO__REPLY__BODY_LOAD);
    ck_assert_str_eq(r->load->model->name, "nw");
    ck_assert_int_eq(r->load->model->state, WBPROTO__MODEL_STATE__MODEL_LOADING);
    gate_wait_read();
    gate_set(0);
    ck_assert_ptr_null(next_done());
    ck_assert_int_eq(wb__models_find(&F.b.models, "nw")->state, WBPROTO__MODEL_STATE__MODEL_READY);

    /* The up-front checks still answer at once. */
    r = load_async(&p, "nw", slow, 1);
    ck_assert_int_eq(r->status, WB_EEXIST);
    ck_assert_str_eq(r->error, "a model named 'nw' already exists (ready)");

    r = load_async(&p, "gone", "/nonexistent/gone.safetensors", 1);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->load->model->state, WBPROTO__MODEL_STATE__MODEL_LOADING);
    ck_assert_ptr_null(next_done());
    wb_model *m = wb__models_find(&F.b.models, "gone");
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->state, WBPROTO__MODEL_STATE__MODEL_FAILED);
    ck_assert_str_eq(m->error, "no such file: /nonexistent/gone.safetensors");
    ck_assert_uint_eq(F.b.stats.loads_failed, 1);
    r = fixture_acquire(&F, &p, "gone");
    ck_assert_int_eq(r->status, WB_ESTATE);
    ck_assert_str_eq(r->error,
                     "model 'gone' failed to load: no such file: /nonexistent/gone.safetensors "
                     "(an administrator may load it again or unload it)");

    /* The retry replaces the record (and would keep it, failed again). */
    ck_assert_ptr_null(load_async(&p, "gone", slow, 0));
    r = next_done();
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->load->model->state, WBPROTO__MODEL_STATE__MODEL_READY);
    loader_stop();
}
END_TEST

/* A preload that failed is kept as a record: listed as failed with its
 * error (its copies too), holding no memory and no place under
 * --max-models, refusing leases with the load's error; a load of its name
 * replaces it (and a retry that fails keeps it, with the new error); an
 * unload removes it. */
START_TEST(test_failed_preload)
{
    wb_peer_creds p = me();
    wb_err err;
    F.b.limits.max_models = 1;
    ck_assert_int_eq(wb__broker_preload(&F.b, "lost", "/nonexistent/lost.safetensors", NULL, &err),
                     WB_ENOTFOUND);
    ck_assert_str_eq(err.msg, "no such file: /nonexistent/lost.safetensors");
    ck_assert_ptr_null(wb__models_find(&F.b.models, "lost"));
    ck_assert_int_eq(
        wb__broker_keep_failed(&F.b, "lost", "/nonexistent/lost.safetensors", err.msg, &err),
        WB_OK);

    Wbproto__Reply *r = simple(&p, WBPROTO__REQUEST__BODY_LIST_MODELS);
    ck_assert_uint_eq(r->list_models->n_models, 1);
    const Wbproto__ModelInfo *mi = r->list_models->models[0];
    ck_assert_str_eq(mi->name, "lost");
    ck_assert_str_eq(mi->path, "/nonexistent/lost.safetensors");
    ck_assert_int_eq(mi->state, WBPROTO__MODEL_STATE__MODEL_FAILED);
    ck_assert_str_eq(mi->error, "no such file: /nonexistent/lost.safetensors");
    ck_assert_uint_eq(mi->bytes, 0);
    ck_assert_uint_eq(mi->slab_bytes, 0);
    ck_assert_str_eq(mi->load_mode, "");
    ck_assert_uint_eq(mi->n_copies, 1);
    ck_assert_int_eq(mi->copies[0]->state, WBPROTO__MODEL_STATE__MODEL_FAILED);
    r = simple(&p, WBPROTO__REQUEST__BODY_STATS);
    ck_assert_uint_eq(r->stats->models, 1);
    ck_assert_uint_eq(r->stats->model_bytes, 0);
    ck_assert_uint_eq(r->stats->loads_in_progress, 0);

    r = fixture_acquire(&F, &p, "lost");
    ck_assert_int_eq(r->status, WB_ESTATE);
    ck_assert_str_eq(r->error,
                     "model 'lost' failed to load: no such file: /nonexistent/lost.safetensors "
                     "(an administrator may load it again or unload it)");

    /* The record holds no place under the limit of one model. */
    const char *path = checkpoint(0, "good.safetensors", 64);
    r = fixture_load(&F, &p, "other", path);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
    r = fixture_unload(&F, &p, "other");
    ck_assert_int_eq(r->status, 0);

    /* A retry that fails keeps the record, with its own error. */
    r = fixture_load(&F, &p, "lost", "/nonexistent/still.safetensors");
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    wb_model *m = wb__models_find(&F.b.models, "lost");
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->state, WBPROTO__MODEL_STATE__MODEL_FAILED);
    ck_assert_str_eq(m->error, "no such file: /nonexistent/still.safetensors");

    /* One that works replaces it. */
    r = fixture_load(&F, &p, "lost", path);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
    ck_assert_int_eq(r->load->model->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(F.b.models.n, 1);
    r = fixture_acquire(&F, &p, "lost");
    ck_assert_int_eq(r->status, 0);

    /* A failed record is removed by an unload. */
    ck_assert_int_eq(wb__broker_keep_failed(&F.b, "bad", "/x", "it broke", &err), WB_OK);
    ck_assert_int_eq(wb__broker_keep_failed(&F.b, "lost", "/x", "it broke", &err), WB_EEXIST);
    ck_assert_str_eq(err.msg, "a model named 'lost' already exists (ready)");
    r = fixture_unload(&F, &p, "bad");
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert_str_eq(r->unload->model->error, "it broke");
    ck_assert_ptr_null(wb__models_find(&F.b.models, "bad"));
}
END_TEST

/* A load of a name whose model drains says how to go on. */
START_TEST(test_load_over_draining)
{
    fixture_model(&F.b, "demo");
    wb_peer_creds p = me();
    fixture_acquire(&F, &p, "demo");
    Wbproto__Reply *r = fixture_unload(&F, &p, "demo");
    ck_assert_int_eq(r->unload->model->state, WBPROTO__MODEL_STATE__MODEL_DRAINING);
    r = fixture_load(&F, &p, "demo", "/models/new.safetensors");
    ck_assert_int_eq(r->status, WB_EEXIST);
    ck_assert_str_eq(r->error,
                     "a model named 'demo' already exists and is draining: its name is free "
                     "again when its last lease ends (1 left; `wbctl leases demo` shows them); "
                     "wait for that, or load this one under another name");
}
END_TEST

START_TEST(test_error_reply)
{
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    wb__ops_error(&rep, &F.a, 0, WB_EPROTO, "request does not decode");
    size_t len;
    uint8_t *buf = wb__reply_pack(&rep, &len);
    wb_err err;
    ck_assert_int_eq(wb__reply_decode(buf, len, &F.decoded, &err), WB_OK);
    free(buf);
    ck_assert_uint_eq(F.decoded->id, 0);
    ck_assert_int_eq(F.decoded->status, WB_EPROTO);
    ck_assert_str_eq(F.decoded->error, "request does not decode");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops");
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
    tcase_add_test(tc, test_list_leases_and_models);
    tcase_add_test(tc, test_unload_and_drain);
    tcase_add_test(tc, test_load);
    tcase_add_test(tc, test_stats);
    tcase_add_test(tc, test_cancel_loads);
    tcase_add_test(tc, test_load_no_wait);
    tcase_add_test(tc, test_failed_preload);
    tcase_add_test(tc, test_load_over_draining);
    tcase_add_test(tc, test_error_reply);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
