/* The administrator's handlers (ops_admin.c), without sockets: unload and
 * draining, loads (inline, and on a loader thread for the cancelled and
 * no_wait loads, whose replies are deferred), administrator checks, and the
 * records of failed loads; every reply packs into bytes the client-side
 * decoder accepts. */
/* The test defines pread() itself (below); glibc's fortified inline one
 * would clash with it. */
#undef _FORTIFY_SOURCE
#include "broker_fixture.h"
#include "ops.h"
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

/* The fixture's functions that these tests do not need. */
static void unused_fixture(void) __attribute__((unused));
static void unused_fixture(void)
{
    advance_ms(0);
}

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
    fixture_open(&F, "admin");
}

static void teardown(void)
{
    fixture_close(&F);
}

static Wbproto__Reply *simple(const wb_peer_creds *peer, int body)
{
    return fixture_simple(&F, peer, body);
}

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
    ck_assert_str_eq(r->error, "a model named 'gpt2.v1_A-b' already exists (version 1 is current); "
                               "`wbctl rollout gpt2.v1_A-b PATH` loads a new version of it");

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

/* Packs and decodes a reply as a client would (into F.decoded), and frees
 * its context. A load's reply has no second frame. */
static Wbproto__Reply *decoded(wb_ops_reply *r)
{
    ck_assert_ptr_null(r->frame);
    ck_assert_uint_eq(r->frame_len, 0);
    size_t len;
    uint8_t *buf = wb__reply_pack(&r->msg, &len);
    ck_assert_ptr_nonnull(buf);
    wb__reply_free(&F.decoded);
    wb_err err;
    ck_assert_msg(wb__reply_decode(buf, len, &F.decoded, &err) == WB_OK, "reply: %s", err.msg);
    free(buf);
    wb__ops_reply_free(r);
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
    wb_ops_reply rep = WB_OPS_REPLY_INIT;
    int rc = wb__ops_handle(&F.b, p, &req, F.ident, sizeof F.ident, &rep);
    if (rc == WB_OPS_DEFERRED) {
        wb__ops_reply_free(&rep);
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
        wb_ops_reply rep = WB_OPS_REPLY_INIT;
        wb__ops_load_done(&F.b, job, model, &rep);
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
    ck_assert_str_eq(r->error, "a model named 'nw' already exists (version 1 is current); `wbctl "
                               "rollout nw PATH` loads a new version of it");

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

int main(void)
{
    Suite *s = suite_create("ops_admin");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_unload_and_drain);
    tcase_add_test(tc, test_load);
    tcase_add_test(tc, test_cancel_loads);
    tcase_add_test(tc, test_load_no_wait);
    tcase_add_test(tc, test_failed_preload);
    tcase_add_test(tc, test_load_over_draining);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
