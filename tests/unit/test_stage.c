/* The loading pipeline (broker/stage.h) on the CPU: every tensor lands with
 * exactly the file's bytes and the XXH3-64 of those bytes, whatever the
 * tensor sizes, chunk size and thread count, in the direct mode (the host
 * backend), the staged mode (a ring of buffers and a copy engine that
 * copies late and completes out of step, as a GPU does) and the mapped mode;
 * a short file, a read error, a failing copy and a cancel stop the load
 * with a message that names the problem, leave no copy running, and the
 * ring works again afterwards. The readers' crew is kept from one load to
 * the next, lent to one load at a time, and starts afresh after fork. */
#include "stage.h"
#include "stage_ntcopy.h"

#include <check.h>
#include <xxhash.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];
static char data_file[512];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/wb-stage-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

/* A model: tensors back to back in one file (no header: the pipeline only
 * sees offsets), laid out at 256-byte aligned offsets in the slab. */
typedef struct model {
    size_t n;
    wb_stage_tensor *t;
    uint8_t *bytes; /* the file's content */
    uint64_t file_len;
    uint64_t slab_len;
    int fd;
} model;

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void model_make(model *m, const uint64_t *sizes, size_t n, uint64_t lead)
{
    memset(m, 0, sizeof *m);
    m->n = n;
    m->t = calloc(n, sizeof *m->t);
    ck_assert_ptr_nonnull(m->t);
    uint64_t off = lead, slab = 0;
    for (size_t i = 0; i < n; i++) {
        static char names[64][24];
        snprintf(names[i % 64], sizeof names[0], "t%zu", i);
        m->t[i].name = names[i % 64];
        m->t[i].file = 0;
        m->t[i].file_offset = off;
        slab = (slab + 255) & ~(uint64_t)255;
        m->t[i].slab_offset = slab;
        m->t[i].nbytes = sizes[i];
        off += sizes[i];
        slab += sizes[i];
    }
    m->file_len = off;
    m->slab_len = slab ? slab : 1;
    m->bytes = malloc(m->file_len ? m->file_len : 1);
    ck_assert_ptr_nonnull(m->bytes);
    for (uint64_t i = 0; i < m->file_len; i++)
        m->bytes[i] = (uint8_t)(rnd() >> 24);
    snprintf(data_file, sizeof data_file, "%s/data.bin", tmpdir);
    FILE *f = fopen(data_file, "wb");
    ck_assert_ptr_nonnull(f);
    if (m->file_len)
        ck_assert_uint_eq(fwrite(m->bytes, 1, m->file_len, f), m->file_len);
    fclose(f);
    m->fd = open(data_file, O_RDONLY);
    ck_assert_int_ge(m->fd, 0);
}

static void model_free(model *m)
{
    free(m->t);
    free(m->bytes);
    if (m->fd >= 0)
        close(m->fd);
}

/* Checks every tensor's bytes in dst and its checksum. */
static void model_check(const model *m, const uint8_t *dst)
{
    for (size_t i = 0; i < m->n; i++) {
        const wb_stage_tensor *t = &m->t[i];
        const uint8_t *want = m->bytes + t->file_offset;
        ck_assert_msg(memcmp(dst + t->slab_offset, want, t->nbytes) == 0,
                      "tensor %zu (%llu bytes) differs", i, (unsigned long long)t->nbytes);
        ck_assert_msg(t->xxh3 == XXH3_64bits(want, t->nbytes), "tensor %zu checksum", i);
    }
}

/* A copy engine that behaves like a DMA engine: the bytes are read from the
 * staging buffer only when the copy "completes", a few queries later. A
 * buffer refilled before its copy completed would land wrong bytes. */
typedef struct pending_copy {
    int live;
    const void *src;
    void *dst;
    size_t len;
    int polls;
} pending_copy;

typedef struct fake_engine {
    pending_copy slot[64];
    unsigned submits, queries, begins, finishes, in_flight, max_in_flight;
    unsigned fail_submit_at, fail_query_at; /* 1-based; 0 never */
    unsigned registered, register_calls;
    unsigned fail_register_at; /* 1-based; 0 never */
    /* Registered ranges (mapped in pieces), and copies that spanned two. */
    const uint8_t *reg_lo[256], *reg_hi[256];
    unsigned spanning;
    int delay; /* the most queries a copy stays pending */
    /* submit_many: batches, the copies in them, the largest one. */
    unsigned batches, batch_copies, max_batch;
    unsigned fail_batch_at; /* 1-based; 0 never */
} fake_engine;

/* Guards the fake engine's registration records: registering threads and
 * the copier use them at once. */
static pthread_mutex_t fe_mu = PTHREAD_MUTEX_INITIALIZER;

static void land(pending_copy *p)
{
    if (p->live) {
        memcpy(p->dst, p->src, p->len);
        p->live = 0;
    }
}

static int fe_begin(void *ctx, wb_err *err)
{
    (void)err;
    ((fake_engine *)ctx)->begins++;
    return WB_OK;
}

static int fe_submit(void *ctx, int buf, const void *src, void *dst, size_t len, wb_err *err)
{
    fake_engine *f = ctx;
    f->submits++;
    if (f->fail_submit_at && f->submits == f->fail_submit_at)
        return wb__err_set(err, WB_EIO, "injected copy failure at copy %u", f->submits);
    if (buf < 0) {
        /* Mapped: the source must lie within one registered range, when
         * the pipeline registered pieces. */
        pthread_mutex_lock(&fe_mu);
        unsigned nr = f->register_calls < 256 ? f->register_calls : 256;
        int inside = nr == 0;
        for (unsigned i = 0; i < nr; i++) {
            if ((const uint8_t *)src >= f->reg_lo[i] && (const uint8_t *)src + len <= f->reg_hi[i])
                inside = 1;
        }
        f->spanning += !inside;
        pthread_mutex_unlock(&fe_mu);
        memcpy(dst, src, len);
        return WB_OK;
    }
    ck_assert_int_lt(buf, 64);
    ck_assert_msg(!f->slot[buf].live, "buffer %d submitted while its copy runs", buf);
    f->slot[buf] = (pending_copy){.live = 1,
                                  .src = src,
                                  .dst = dst,
                                  .len = len,
                                  .polls = f->delay ? (int)(rnd() % (unsigned)(f->delay + 1)) : 0};
    f->in_flight++;
    if (f->in_flight > f->max_in_flight)
        f->max_in_flight = f->in_flight;
    return WB_OK;
}

/* A batch: nothing is queued when it fails; a buffer appears in it once. */
static int fe_submit_many(void *ctx, const wb_copy *cp, unsigned n, wb_err *err)
{
    fake_engine *f = ctx;
    f->batches++;
    ck_assert_uint_ge(n, 1);
    ck_assert_uint_le(n, WB_STAGE_MAX_BATCH);
    if (f->fail_batch_at && f->batches == f->fail_batch_at)
        return wb__err_set(err, WB_EIO, "injected batch failure at batch %u", f->batches);
    for (unsigned i = 0; i < n; i++) {
        ck_assert_int_ge(cp[i].buf, 0);
        for (unsigned k = 0; k < i; k++)
            ck_assert_int_ne(cp[i].buf, cp[k].buf);
    }
    for (unsigned i = 0; i < n; i++) {
        int rc = fe_submit(ctx, cp[i].buf, cp[i].src, cp[i].dst, cp[i].len, err);
        if (rc != WB_OK)
            return rc;
    }
    f->batch_copies += n;
    if (n > f->max_batch)
        f->max_batch = n;
    return WB_OK;
}

static int fe_query(void *ctx, int buf, wb_err *err)
{
    fake_engine *f = ctx;
    f->queries++;
    if (f->fail_query_at && f->queries == f->fail_query_at)
        return wb__err_set(err, WB_EIO, "injected copy error seen at query %u", f->queries);
    pending_copy *p = &f->slot[buf];
    if (!p->live)
        return 1;
    if (p->polls > 0) {
        p->polls--;
        return 0;
    }
    land(p);
    f->in_flight--;
    return 1;
}

static int fe_finish(void *ctx, double *secs, wb_err *err)
{
    (void)err;
    fake_engine *f = ctx;
    f->finishes++;
    for (int i = 0; i < 64; i++) {
        if (f->slot[i].live) {
            land(&f->slot[i]);
            f->in_flight--;
        }
    }
    *secs = -1;
    return WB_OK;
}

static int fe_register(void *ctx, void *addr, size_t len, wb_err *err)
{
    fake_engine *f = ctx;
    pthread_mutex_lock(&fe_mu);
    unsigned k = f->register_calls++;
    int fail = f->fail_register_at && k + 1 == f->fail_register_at;
    if (!fail) {
        f->registered++;
        if (k < 256) {
            f->reg_lo[k] = addr;
            f->reg_hi[k] = (const uint8_t *)addr + len;
        }
    }
    pthread_mutex_unlock(&fe_mu);
    if (fail)
        return wb__err_set(err, WB_EIO, "injected register failure at call %u", k + 1);
    return WB_OK;
}

static void fe_unregister(void *ctx, void *addr)
{
    (void)addr;
    pthread_mutex_lock(&fe_mu);
    ((fake_engine *)ctx)->registered--;
    pthread_mutex_unlock(&fe_mu);
}

typedef struct ring {
    wb_staging s;
    fake_engine fe;
    uint8_t *mem;
} ring;

static void ring_make(ring *r, unsigned n, uint64_t size, int delay)
{
    memset(r, 0, sizeof *r);
    ck_assert_uint_le(n, 64);
    r->mem = malloc(n * size);
    r->s.bufs = calloc(n, sizeof *r->s.bufs);
    ck_assert_ptr_nonnull(r->mem);
    ck_assert_ptr_nonnull(r->s.bufs);
    for (unsigned i = 0; i < n; i++) {
        r->s.bufs[i] = r->mem + i * size;
        memset(r->s.bufs[i], 0xB5, size); /* stale bytes of an earlier load */
    }
    r->s.n = n;
    r->s.size = size;
    r->fe.delay = delay;
    r->s.engine = (wb_copy_engine){.ctx = &r->fe,
                                   .begin = fe_begin,
                                   .submit = fe_submit,
                                   .query = fe_query,
                                   .finish = fe_finish,
                                   .host_register = fe_register,
                                   .host_unregister = fe_unregister};
}

/* The same ring with an engine that takes batches. */
static void ring_make_batched(ring *r, unsigned n, uint64_t size, int delay)
{
    ring_make(r, n, size, delay);
    r->s.engine.submit_many = fe_submit_many;
}

static void ring_free(ring *r)
{
    free(r->mem);
    free(r->s.bufs);
}

static const char *const file_names[] = {data_file};

/* The read source of the running loop test (wb_stage_read): the tests that
 * read run once with each. */
static int cur_read = WB_STAGE_READ_PREAD;
#define READ_LOOP() (cur_read = _i)

/* The read source a load reports: auto reads the test files, which were
 * just written and so are in the page cache, from their mappings. */
static int used_read(void)
{
    return cur_read == WB_STAGE_READ_AUTO ? WB_STAGE_READ_MMAP_NT : cur_read;
}

static wb_stage_job job_for(model *m, int mode, unsigned threads, uint64_t chunk)
{
    wb_stage_job j = {
        .mode = mode,
        .tensors = m->t,
        .n_tensors = m->n,
        .n_files = 1,
        .files = file_names,
        .fds = &m->fd,
        .cfg = {.read_threads = threads, .chunk_bytes = chunk, .read_source = cur_read},
    };
    return j;
}

/* Sizes around every boundary that matters: empty, sub-alignment, exactly a
 * chunk, a chunk plus one, several chunks. */
static const uint64_t mixed[] = {
    4096,  1,         0,      255,     256,        257,    65536, 65535,
    65537, 3 * 65536, 200000, 1 << 20, 4097,       0,      17,    (1 << 20) + 13,
    33,    64,        5000,   999999,  3 << 19,    128,    1,     2 * 65536,
    70000, 12,        4096,   262144,  262144 + 1, 100000, 7,     (3 << 20) + 5,
};
#define N_MIXED (sizeof mixed / sizeof mixed[0])

START_TEST(test_direct_matrix)
{
    READ_LOOP();
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    static const uint64_t chunks[] = {4096, 65536, 1 << 20, 8 << 20};
    static const unsigned threads[] = {1, 2, 3, 8};
    for (size_t c = 0; c < 4; c++) {
        for (size_t t = 0; t < 4; t++) {
            uint8_t *dst = malloc(m.slab_len);
            ck_assert_ptr_nonnull(dst);
            memset(dst, 0x5A, m.slab_len);
            _Atomic uint64_t landed = 0;
            wb_stage_job j = job_for(&m, WB_STAGE_DIRECT, threads[t], chunks[c]);
            j.cfg.read_block = t % 2 ? 0 : 4096;
            j.host_dst = dst;
            j.landed = &landed;
            for (size_t i = 0; i < m.n; i++)
                m.t[i].xxh3 = 0;
            wb_stage_stats st;
            wb_err err = {0};
            ck_assert_msg(wb__stage_run(&j, &st, &err) == WB_OK, "%s", err.msg);
            model_check(&m, dst);
            ck_assert_uint_eq(atomic_load(&landed), st.bytes);
            ck_assert_int_eq(st.mode, WB_STAGE_DIRECT);
            ck_assert_int_eq(st.read_source, used_read());
            ck_assert_uint_ge(st.threads, 1);
            ck_assert_uint_le(st.threads, threads[t]);
            ck_assert_uint_eq(st.chunk_bytes, chunks[c]);
            ck_assert_uint_ge(st.chunks, 1);
            free(dst);
        }
    }
    model_free(&m);
}
END_TEST

START_TEST(test_staged_matrix)
{
    READ_LOOP();
    model m;
    model_make(&m, mixed, N_MIXED, 3);
    static const uint64_t sizes[] = {4096, 65536, 1 << 20};
    static const unsigned threads[] = {1, 2, 5, 8};
    static const unsigned nbufs[] = {2, 3, 16};
    for (size_t c = 0; c < 3; c++) {
        for (size_t t = 0; t < 4; t++) {
            ring r;
            int batched = (c + t) % 2;
            if (batched)
                ring_make_batched(&r, nbufs[(c + t) % 3], sizes[c], 3);
            else
                ring_make(&r, nbufs[(c + t) % 3], sizes[c], 3);
            uint8_t *dst = malloc(m.slab_len);
            ck_assert_ptr_nonnull(dst);
            memset(dst, 0x5A, m.slab_len);
            _Atomic uint64_t landed = 0;
            wb_stage_job j = job_for(&m, WB_STAGE_STAGED, threads[t], 0);
            j.staging = &r.s;
            j.dst = dst;
            j.landed = &landed;
            /* Small read blocks: pieces are checksummed block by block when
             * their turn has come, later when not. */
            j.cfg.read_block = t % 2 ? 4096 : 0;
            for (size_t i = 0; i < m.n; i++)
                m.t[i].xxh3 = 0;
            wb_stage_stats st;
            wb_err err = {0};
            ck_assert_msg(wb__stage_run(&j, &st, &err) == WB_OK, "%s", err.msg);
            model_check(&m, dst);
            /* Padding that shares a chunk with tensors is zeroed, never
             * stale staging bytes. */
            for (size_t i = 0; i + 1 < m.n; i++) {
                uint64_t end = m.t[i].slab_offset + m.t[i].nbytes;
                for (uint64_t b = end; b < m.t[i + 1].slab_offset; b++)
                    ck_assert_msg(dst[b] == 0 || dst[b] == 0x5A, "stale byte %02x at %llu", dst[b],
                                  (unsigned long long)b);
            }
            ck_assert_uint_eq(atomic_load(&landed), st.bytes);
            ck_assert_uint_eq(r.fe.in_flight, 0);
            ck_assert_uint_eq(r.fe.submits, st.chunks);
            ck_assert_uint_eq(r.fe.batch_copies, batched ? st.chunks : 0);
            ck_assert_uint_le(r.fe.max_batch, r.s.n);
            ck_assert_uint_eq(r.fe.begins, 1);
            ck_assert_uint_ge(r.fe.finishes, 1);
            ck_assert_uint_le(r.fe.max_in_flight, r.s.n);
            ck_assert_uint_eq(st.chunk_bytes, sizes[c]);
            ck_assert_uint_eq(st.buffers, r.s.n);
            free(dst);
            ring_free(&r);
        }
    }
    model_free(&m);
}
END_TEST

/* A staged load of m through r with `threads` readers that must succeed
 * and land every tensor's bytes and checksum; *st gets its figures. */
static void staged_ok(model *m, ring *r, unsigned threads, wb_stage_stats *st)
{
    uint8_t *dst = malloc(m->slab_len);
    ck_assert_ptr_nonnull(dst);
    wb_stage_job j = job_for(m, WB_STAGE_STAGED, threads, 0);
    j.staging = &r->s;
    j.dst = dst;
    wb_err err = {0};
    ck_assert_msg(wb__stage_run(&j, st, &err) == WB_OK, "%s", err.msg);
    model_check(m, dst);
    free(dst);
}

/* Readers that demote each filled buffer's lines (CLDEMOTE where the
 * processor has it, nothing elsewhere) land the same bytes; the hint itself
 * changes no byte of what it is given, at any alignment. */
START_TEST(test_demote)
{
    READ_LOOP();
    model m;
    model_make(&m, mixed, N_MIXED, 5);
    ring r;
    ring_make(&r, 6, 65536, 3);
    uint8_t *dst = malloc(m.slab_len);
    ck_assert_ptr_nonnull(dst);
    wb_stage_job j = job_for(&m, WB_STAGE_STAGED, 4, 0);
    j.cfg.demote = WB_STAGE_DEMOTE_ON;
    j.staging = &r.s;
    j.dst = dst;
    wb_stage_stats st;
    wb_err err = {0};
    ck_assert_msg(wb__stage_run(&j, &st, &err) == WB_OK, "%s", err.msg);
    model_check(&m, dst);
    free(dst);
    ring_free(&r);
    model_free(&m);
    uint8_t buf[1000], copy[1000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = copy[i] = (uint8_t)(rnd() >> 16);
    wb__stage_demote(buf + 3, 997);
    wb__stage_demote(buf, 0);
    ck_assert_int_eq(memcmp(buf, copy, sizeof buf), 0);
    ck_assert_int_eq(wb__stage_can_demote(), wb__stage_can_demote());
}
END_TEST

/* One large tensor cut into many pieces that many threads read at once: its
 * checksum must still be over the bytes in order. */
START_TEST(test_one_big_tensor_many_threads)
{
    READ_LOOP();
    static const uint64_t sizes[] = {(7 << 20) + 3};
    model m;
    model_make(&m, sizes, 1, 100);
    ring r;
    ring_make(&r, 4, 65536, 5);
    wb_stage_stats st;
    staged_ok(&m, &r, 8, &st);
    ck_assert_uint_eq(st.chunks, ((7u << 20) + 3 + 65535) / 65536);
    ring_free(&r);
    model_free(&m);
}
END_TEST

/* While the engine is busy, filled buffers wait to go as one batch: a slow
 * engine and a ring of 16 small buffers make batches of several copies,
 * none over WB_STAGE_MAX_BATCH, and every byte lands once. */
START_TEST(test_batches)
{
    READ_LOOP();
    uint64_t sizes[200];
    for (size_t i = 0; i < 200; i++)
        sizes[i] = 4096 - (i % 7);
    model m;
    model_make(&m, sizes, 200, 0);
    ring r;
    ring_make_batched(&r, 16, 4096, 40);
    wb_stage_stats st;
    staged_ok(&m, &r, 8, &st);
    ck_assert_uint_eq(r.fe.batch_copies, st.chunks);
    ck_assert_uint_eq(r.fe.submits, st.chunks);
    ck_assert_uint_ge(r.fe.max_batch, 2);
    ck_assert_uint_lt(r.fe.batches, st.chunks);
    ck_assert_uint_eq(r.fe.in_flight, 0);
    ring_free(&r);
    model_free(&m);
}
END_TEST

START_TEST(test_mapped)
{
    /* _i: registering threads (0: the caller registered the mapping). */
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    uint8_t *map = mmap(NULL, m.file_len, PROT_READ, MAP_SHARED, m.fd, 0);
    ck_assert_ptr_ne(map, MAP_FAILED);
    const uint8_t *const maps[] = {map};
    const uint64_t lens[] = {m.file_len};
    ring r;
    ring_make(&r, 2, 65536, 0);
    uint8_t *dst = malloc(m.slab_len);
    ck_assert_ptr_nonnull(dst);
    _Atomic uint64_t landed = 0;
    wb_stage_job j = job_for(&m, WB_STAGE_MAPPED, 4, 65536);
    j.maps = maps;
    j.map_lens = lens;
    j.engine = &r.s.engine;
    j.dst = dst;
    j.landed = &landed;
    j.cfg.register_threads = (unsigned)_i;
    /* Pieces smaller than a chunk and not a divisor of the tensors' offsets:
     * copies are cut at every piece boundary. */
    j.cfg.register_piece = 3 * 65536;
    wb_stage_stats st;
    wb_err err = {0};
    ck_assert_msg(wb__stage_run(&j, &st, &err) == WB_OK, "%s", err.msg);
    model_check(&m, dst);
    ck_assert_uint_eq(atomic_load(&landed), st.bytes);
    ck_assert_int_eq(st.mode, WB_STAGE_MAPPED);
    uint64_t pieces = (m.file_len + 3 * 65536 - 1) / (3 * 65536);
    ck_assert_uint_eq(r.fe.registered, 0); /* every piece unregistered */
    ck_assert_uint_eq(r.fe.register_calls, _i ? pieces : 0);
    if (_i) {
        /* No copy spans two pieces. */
        ck_assert_uint_eq(r.fe.spanning, 0);
        ck_assert_uint_gt(r.fe.submits, pieces);
    }
    munmap(map, m.file_len);
    free(dst);
    ring_free(&r);
    model_free(&m);
}
END_TEST

/* A piece that cannot be registered fails the load with the engine's
 * message and the file's range; every piece registered is unregistered. */
START_TEST(test_mapped_register_fails)
{
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    uint8_t *map = mmap(NULL, m.file_len, PROT_READ, MAP_SHARED, m.fd, 0);
    ck_assert_ptr_ne(map, MAP_FAILED);
    const uint8_t *const maps[] = {map};
    const uint64_t lens[] = {m.file_len};
    ring r;
    ring_make(&r, 2, 65536, 0);
    r.fe.fail_register_at = 3;
    uint8_t *dst = malloc(m.slab_len);
    ck_assert_ptr_nonnull(dst);
    wb_stage_job j = job_for(&m, WB_STAGE_MAPPED, 2, 65536);
    j.maps = maps;
    j.map_lens = lens;
    j.engine = &r.s.engine;
    j.dst = dst;
    j.cfg.register_threads = 1;
    j.cfg.register_piece = 65536;
    wb_stage_stats st;
    wb_err err = {0};
    ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_EIO);
    ck_assert_msg(strstr(err.msg, "injected register failure at call 3") != NULL, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "bytes 131072 to 196608") != NULL, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, data_file) != NULL, "%s", err.msg);
    ck_assert_uint_eq(r.fe.registered, 0);
    munmap(map, m.file_len);
    free(dst);
    ring_free(&r);
    model_free(&m);
}
END_TEST

/* The file is shorter than the table says: the read fails, names the file
 * and the tensor, and the ring can load again. */
START_TEST(test_short_file)
{
    READ_LOOP();
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    ck_assert_int_eq(truncate(data_file, (off_t)(m.file_len - 1000)), 0);
    for (int staged = 0; staged < 2; staged++) {
        ring r;
        ring_make(&r, 3, 65536, 2);
        uint8_t *dst = malloc(m.slab_len);
        ck_assert_ptr_nonnull(dst);
        wb_stage_job j = job_for(&m, staged ? WB_STAGE_STAGED : WB_STAGE_DIRECT, 4, 65536);
        j.staging = &r.s;
        j.host_dst = dst;
        j.dst = dst;
        wb_stage_stats st;
        wb_err err = {0};
        ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_EIO);
        ck_assert_int_eq(err.code, WB_EIO);
        ck_assert_ptr_nonnull(strstr(err.msg, data_file));
        ck_assert_ptr_nonnull(strstr(err.msg, "the file ends at"));
        /* The last tensor is the one cut short. */
        char want[64];
        snprintf(want, sizeof want, "tensor '%s'", m.t[m.n - 1].name);
        ck_assert_msg(strstr(err.msg, want) != NULL, "%s", err.msg);
        ck_assert_uint_eq(r.fe.in_flight, 0);
        free(dst);
        ring_free(&r);
    }
    model_free(&m);
}
END_TEST

/* Truncates the data file when the reader prepares chunk `at`. */
typedef struct shrink {
    unsigned calls, at;
    off_t to;
} shrink;

static int shrink_prepare(void *ctx, uint64_t offset, uint64_t len, wb_err *err)
{
    (void)offset;
    (void)len;
    (void)err;
    shrink *k = ctx;
    if (k->calls++ == k->at)
        ck_assert_int_eq(truncate(data_file, k->to), 0);
    return WB_OK;
}

/* The file shrinks while it is read (someone truncates it): a pread gets a
 * short read, a mapping faults (SIGBUS, or an error from populating its
 * pages). Each read source fails the load with WB_EIO naming the file and
 * the tensor; none kills the process. Small tensors take the fault path,
 * large ones are populated first. */
START_TEST(test_file_shrinks)
{
    READ_LOOP();
    static const uint64_t small[] = {4096, 5000, 70000, 65536, 8192, 100000, 4096, 65536};
    static const uint64_t large[] = {1 << 20, (1 << 20) + 5, 3 << 20, 1 << 20};
    for (int big = 0; big < 2; big++) {
        model m;
        const uint64_t *sizes = big ? large : small;
        size_t n = big ? 4 : 8;
        model_make(&m, sizes, n, 0);
        uint8_t *dst = malloc(m.slab_len);
        ck_assert_ptr_nonnull(dst);
        /* One thread, chunks of one tensor each (in slab order): the file
         * loses its second half when the third chunk is prepared. */
        wb_stage_job j = job_for(&m, WB_STAGE_DIRECT, 1, 65536);
        j.host_dst = dst;
        shrink k = {.at = 2, .to = (off_t)(m.t[2].file_offset + 100)};
        j.prepare = shrink_prepare;
        j.prepare_ctx = &k;
        wb_stage_stats st;
        wb_err err = {0};
        ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_EIO);
        ck_assert_int_eq(err.code, WB_EIO);
        ck_assert_msg(strstr(err.msg, data_file) != NULL, "%s", err.msg);
        ck_assert_msg(strstr(err.msg, "tensor 't2'") != NULL, "%s", err.msg);
        if (cur_read == WB_STAGE_READ_PREAD)
            ck_assert_msg(strstr(err.msg, "the file ends at") != NULL, "%s", err.msg);
        else
            ck_assert_msg(strstr(err.msg, "the file shrank while it was read") != NULL, "%s",
                          err.msg);
        free(dst);
        model_free(&m);
    }
}
END_TEST

/* auto: a file in the page cache is read from its mapping, one that is not
 * with pread; the bytes and checksums are right either way. */
START_TEST(test_auto_follows_the_cache)
{
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    for (int cold = 0; cold < 2; cold++) {
        if (cold) {
            /* Written back, then dropped from the page cache. */
            ck_assert_int_eq(fdatasync(m.fd), 0);
            ck_assert_int_eq(posix_fadvise(m.fd, 0, 0, POSIX_FADV_DONTNEED), 0);
            uint8_t *map = mmap(NULL, m.file_len, PROT_READ, MAP_SHARED, m.fd, 0);
            ck_assert_ptr_ne(map, MAP_FAILED);
            size_t pages = (m.file_len + 4095) / 4096, in = 0;
            unsigned char *vec = malloc(pages);
            ck_assert_ptr_nonnull(vec);
            ck_assert_int_eq(mincore(map, m.file_len, vec), 0);
            for (size_t i = 0; i < pages; i++)
                in += vec[i] & 1;
            free(vec);
            munmap(map, m.file_len);
            ck_assert_msg(in * 10 < pages, "the file stayed in the page cache: %zu of %zu pages",
                          in, pages);
        }
        uint8_t *dst = malloc(m.slab_len);
        ck_assert_ptr_nonnull(dst);
        wb_stage_job j = job_for(&m, WB_STAGE_DIRECT, 2, 65536);
        j.cfg.read_source = WB_STAGE_READ_AUTO;
        j.host_dst = dst;
        wb_stage_stats st;
        wb_err err = {0};
        ck_assert_msg(wb__stage_run(&j, &st, &err) == WB_OK, "%s", err.msg);
        model_check(&m, dst);
        ck_assert_int_eq(st.read_source, cold ? WB_STAGE_READ_PREAD : WB_STAGE_READ_MMAP_NT);
        free(dst);
    }
    model_free(&m);
}
END_TEST

/* A descriptor that cannot be read (a directory): WB_EIO with the reason. */
START_TEST(test_read_error)
{
    READ_LOOP();
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    int dirfd = open(tmpdir, O_RDONLY | O_DIRECTORY);
    ck_assert_int_ge(dirfd, 0);
    ring r;
    ring_make(&r, 4, 65536, 1);
    uint8_t *dst = malloc(m.slab_len);
    ck_assert_ptr_nonnull(dst);
    wb_stage_job j = job_for(&m, WB_STAGE_STAGED, 3, 0);
    j.fds = &dirfd;
    j.staging = &r.s;
    j.dst = dst;
    wb_stage_stats st;
    wb_err err = {0};
    ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_EIO);
    ck_assert_ptr_nonnull(strstr(err.msg, "reading tensor"));
    ck_assert_ptr_nonnull(strstr(err.msg, "directory"));
    ck_assert_uint_eq(r.fe.in_flight, 0);

    /* The same ring loads the model afterwards. */
    j.fds = &m.fd;
    ck_assert_msg(wb__stage_run(&j, &st, &err) == WB_OK, "%s", err.msg);
    model_check(&m, dst);
    close(dirfd);
    free(dst);
    ring_free(&r);
    model_free(&m);
}
END_TEST

/* The copy engine fails, at submission or later: the load stops with the
 * engine's message, every queued copy is finished first, and the ring works
 * again. */
START_TEST(test_copy_failures)
{
    READ_LOOP();
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    static const char *const why[] = {"injected copy failure at copy 5",
                                      "injected copy error seen at query 7",
                                      "injected batch failure at batch 2"};
    for (int which = 0; which < 3; which++) {
        ring r;
        if (which == 2)
            ring_make_batched(&r, 4, 65536, 3);
        else
            ring_make(&r, 4, 65536, 3);
        if (which == 0)
            r.fe.fail_submit_at = 5;
        else if (which == 1)
            r.fe.fail_query_at = 7;
        else
            r.fe.fail_batch_at = 2;
        uint8_t *dst = malloc(m.slab_len);
        ck_assert_ptr_nonnull(dst);
        wb_stage_job j = job_for(&m, WB_STAGE_STAGED, 4, 0);
        j.staging = &r.s;
        j.dst = dst;
        wb_stage_stats st;
        wb_err err = {0};
        ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_EIO);
        ck_assert_msg(strstr(err.msg, why[which]) != NULL, "%s", err.msg);
        ck_assert_uint_eq(r.fe.in_flight, 0);
        r.fe.fail_submit_at = r.fe.fail_query_at = r.fe.fail_batch_at = 0;
        ck_assert_msg(wb__stage_run(&j, &st, &err) == WB_OK, "%s", err.msg);
        model_check(&m, dst);
        free(dst);
        ring_free(&r);
    }
    model_free(&m);
}
END_TEST

START_TEST(test_cancel)
{
    READ_LOOP();
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    atomic_int cancel = 1;
    for (int staged = 0; staged < 2; staged++) {
        ring r;
        ring_make(&r, 2, 4096, 0);
        uint8_t *dst = malloc(m.slab_len);
        ck_assert_ptr_nonnull(dst);
        wb_stage_job j = job_for(&m, staged ? WB_STAGE_STAGED : WB_STAGE_DIRECT, 2, 4096);
        j.staging = &r.s;
        j.host_dst = dst;
        j.dst = dst;
        j.cancel = &cancel;
        wb_stage_stats st;
        wb_err err = {0};
        ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_ESTATE);
        ck_assert_ptr_nonnull(strstr(err.msg, "cancelled"));
        ck_assert_uint_eq(r.fe.in_flight, 0);
        free(dst);
        ring_free(&r);
    }
    model_free(&m);
}
END_TEST

/* A tensor naming a file the job lacks is a bug, reported, not a crash; so
 * is a staged job without a ring. */
START_TEST(test_bad_jobs)
{
    model m;
    model_make(&m, mixed, 4, 0);
    m.t[2].file = 3;
    uint8_t dst[4096 * 4];
    wb_stage_job j = job_for(&m, WB_STAGE_DIRECT, 1, 0);
    j.host_dst = dst;
    wb_stage_stats st;
    wb_err err = {0};
    ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_EINTERNAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor 't2' names file 3 of 1"));
    m.t[2].file = 0;
    j.mode = WB_STAGE_STAGED;
    ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_EINTERNAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "staging ring"));
    j.mode = 9;
    ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_EINTERNAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "unknown load mode 9"));
    model_free(&m);
}
END_TEST

/* Only zero-size tensors: nothing to read, checksums of nothing. */
START_TEST(test_empty_tensors)
{
    static const uint64_t sizes[] = {0, 0, 0};
    model m;
    model_make(&m, sizes, 3, 0);
    uint8_t dst[1];
    wb_stage_job j = job_for(&m, WB_STAGE_DIRECT, 4, 0);
    j.host_dst = dst;
    wb_stage_stats st;
    wb_err err = {0};
    ck_assert_int_eq(wb__stage_run(&j, &st, &err), WB_OK);
    for (size_t i = 0; i < 3; i++)
        ck_assert_uint_eq(m.t[i].xxh3, XXH3_64bits("", 0));
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert_uint_eq(st.chunks, 0);
    model_free(&m);
}
END_TEST

START_TEST(test_config)
{
    wb_stage_config c = {0};
    wb__stage_config_fill(&c);
    ck_assert_uint_ge(c.read_threads, 1);
    ck_assert_uint_le(c.read_threads, WB_STAGE_DEFAULT_MAX_THREADS);
    ck_assert_uint_eq(c.chunk_bytes, WB_STAGE_DEFAULT_CHUNK);
    ck_assert_uint_eq(c.buffers, WB_STAGE_DEFAULT_BUFFERS);
    ck_assert_uint_eq(c.read_block, WB_STAGE_DEFAULT_READ_BLOCK);
    ck_assert_int_eq(c.read_source, WB_STAGE_READ_PREAD);
    ck_assert_int_eq(c.ring_pages, WB_STAGE_PAGES_NORMAL);
    ck_assert_uint_eq(c.register_threads, 0);
    ck_assert_uint_eq(c.register_piece, WB_STAGE_REGISTER_PIECE);
    ck_assert_uint_eq(c.copy_batch, WB_STAGE_DEFAULT_COPY_BATCH);
    wb_err err;
    ck_assert_int_eq(wb__stage_config_check(&c, &err), WB_OK);
    wb_stage_config bad = c;
    bad.read_threads = WB_STAGE_MAX_THREADS + 1;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "read threads"));
    bad = c;
    bad.chunk_bytes = 1000;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "staging buffer size"));
    bad = c;
    bad.read_block = 1000;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "read block: 1000 bytes"));
    bad = c;
    bad.buffers = 1;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "staging buffers: 1"));
    bad = c;
    bad.read_source = 5;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "read source: 5 is not pread, mmap, mmap-nt or auto");
    bad = c;
    bad.ring_pages = 3;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "staging pages: 3 is not normal or huge");
    bad = c;
    bad.register_threads = WB_STAGE_MAX_THREADS + 1;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "register threads: 65"));
    bad = c;
    bad.copy_batch = WB_STAGE_MAX_BATCH + 1;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "copy batch: 17 is not between 1 and 16");
    bad.copy_batch = 0;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    bad = c;
    bad.demote = 3;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "staging demote: 3 is not off or on");
    ck_assert_int_eq(c.demote, WB_STAGE_DEFAULT_DEMOTE);
    ck_assert_int_eq(wb__stage_demote_parse(wb__stage_demote_name(WB_STAGE_DEMOTE_ON)),
                     WB_STAGE_DEMOTE_ON);
    ck_assert_int_eq(wb__stage_demote_parse("off"), WB_STAGE_DEMOTE_OFF);
    ck_assert_int_eq(wb__stage_demote_parse("yes"), 0);
    ck_assert_str_eq(wb__stage_demote_name(0), "unknown");
    bad = c;
    bad.register_piece = 65536 + 4096;
    ck_assert_int_eq(wb__stage_config_check(&bad, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "register piece: 69632 bytes is not a positive multiple of 65536");
    for (int r = WB_STAGE_READ_PREAD; r <= WB_STAGE_READ_AUTO; r++)
        ck_assert_int_eq(wb__stage_read_parse(wb__stage_read_name(r)), r);
    ck_assert_int_eq(wb__stage_read_parse("mmap-t"), 0);
    ck_assert_str_eq(wb__stage_read_name(0), "unknown");
    ck_assert_int_eq(wb__stage_pages_parse("huge"), WB_STAGE_PAGES_HUGE);
    ck_assert_int_eq(wb__stage_pages_parse("normal"), WB_STAGE_PAGES_NORMAL);
    ck_assert_int_eq(wb__stage_pages_parse("giant"), 0);
    ck_assert_str_eq(wb__stage_mode_name(WB_STAGE_STAGED), "staged");
    ck_assert_str_eq(wb__stage_mode_name(0), "unknown");
    ck_assert(wb__stage_gbps(2000000000ull, 2.0, 2) == 2.0);
    ck_assert(wb__stage_gbps(1, 0, 2) == 0);
}
END_TEST

/* ---- the readers' crew (stage_crew.c) ---- */

/* A direct load of m into a fresh buffer, checked. */
static void direct_ok(model *m, unsigned threads, wb_stage_stats *st)
{
    uint8_t *dst = malloc(m->slab_len);
    ck_assert_ptr_nonnull(dst);
    wb_stage_job j = job_for(m, WB_STAGE_DIRECT, threads, 65536);
    j.host_dst = dst;
    for (size_t i = 0; i < m->n; i++)
        m->t[i].xxh3 = 0;
    wb_err err = {0};
    ck_assert_msg(wb__stage_run(&j, st, &err) == WB_OK, "%s", err.msg);
    model_check(m, dst);
    free(dst);
}

/* Loads reuse the crew's threads: none is created after the first load of
 * a size, a bigger load adds only what it lacks, a stopped crew has no
 * thread left and the next load creates them again. */
START_TEST(test_crew_kept)
{
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    wb__stage_crew_stop();
    ck_assert_uint_eq(wb__stage_crew_threads(NULL), 0);
    unsigned c0 = 0, c1 = 0, c2 = 0;
    wb__stage_crew_threads(&c0);
    wb_stage_stats st;
    direct_ok(&m, 4, &st);
    ck_assert_uint_eq(st.threads, 4);
    ck_assert_uint_eq(wb__stage_crew_threads(&c1), 4);
    ck_assert_uint_eq(c1, c0 + 4);
    for (int r = 0; r < 5; r++) {
        direct_ok(&m, r % 2 ? 2 : 4, &st);
        ck_assert_uint_eq(wb__stage_crew_threads(&c2), 4);
        ck_assert_uint_eq(c2, c1);
    }
    direct_ok(&m, 6, &st);
    ck_assert_uint_eq(st.threads, 6);
    ck_assert_uint_eq(wb__stage_crew_threads(&c2), 6);
    ck_assert_uint_eq(c2, c1 + 2);
    /* Each reader's start is timed: the last one's is within the load. */
    ck_assert(st.readers_at > 0 && st.readers_at <= st.seconds);
    wb__stage_crew_stop();
    ck_assert_uint_eq(wb__stage_crew_threads(NULL), 0);
    direct_ok(&m, 3, &st);
    ck_assert_uint_eq(wb__stage_crew_threads(&c1), 3);
    ck_assert_uint_eq(c1, c2 + 3);
    model_free(&m);
}
END_TEST

/* A load held in its first reader's prepare keeps the crew busy; a second
 * load meanwhile runs on threads of its own, correctly, and adds none to
 * the crew. */
typedef struct hold {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, released;
} hold;

static int hold_prepare(void *ctx, uint64_t offset, uint64_t len, wb_err *err)
{
    (void)offset;
    (void)len;
    (void)err;
    hold *h = ctx;
    pthread_mutex_lock(&h->mu);
    h->entered = 1;
    pthread_cond_broadcast(&h->cv);
    while (!h->released)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return WB_OK;
}

typedef struct held_load {
    model *m;
    hold *h;
    uint8_t *dst;
    int rc;
} held_load;

static void *held_main(void *arg)
{
    held_load *l = arg;
    wb_stage_job j = job_for(l->m, WB_STAGE_DIRECT, 3, 65536);
    j.host_dst = l->dst;
    j.prepare = hold_prepare;
    j.prepare_ctx = l->h;
    wb_stage_stats st;
    wb_err err = {0};
    l->rc = wb__stage_run(&j, &st, &err);
    return NULL;
}

START_TEST(test_crew_busy)
{
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    /* The second load's own tensors (their checksums are outputs). */
    model m2 = m;
    m2.t = malloc(m.n * sizeof *m.t);
    ck_assert_ptr_nonnull(m2.t);
    memcpy(m2.t, m.t, m.n * sizeof *m.t);
    wb__stage_crew_stop();
    hold h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    held_load l = {.m = &m, .h = &h, .dst = malloc(m.slab_len)};
    ck_assert_ptr_nonnull(l.dst);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, held_main, &l), 0);
    pthread_mutex_lock(&h.mu);
    while (!h.entered)
        pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    unsigned created = 0, after = 0;
    ck_assert_uint_eq(wb__stage_crew_threads(&created), 3);
    wb_stage_stats st;
    direct_ok(&m2, 5, &st);
    ck_assert_uint_eq(st.threads, 5);
    ck_assert_uint_eq(wb__stage_crew_threads(&after), 3);
    ck_assert_uint_eq(after, created);
    pthread_mutex_lock(&h.mu);
    h.released = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(t, NULL);
    ck_assert_int_eq(l.rc, WB_OK);
    model_check(&m, l.dst);
    free(l.dst);
    free(m2.t);
    model_free(&m);
}
END_TEST

/* A child of fork has none of its parent's crew threads: its loads create
 * their own. */
START_TEST(test_crew_fork)
{
    model m;
    model_make(&m, mixed, N_MIXED, 0);
    wb_stage_stats st;
    direct_ok(&m, 4, &st);
    ck_assert_uint_ge(wb__stage_crew_threads(NULL), 4);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int ok = wb__stage_crew_threads(NULL) == 0;
        direct_ok(&m, 4, &st);
        ok = ok && wb__stage_crew_threads(NULL) == 4 && st.threads == 4;
        _exit(ok ? 0 : 3);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    model_free(&m);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("stage");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_direct_matrix, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_staged_matrix, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_one_big_tensor_many_threads, WB_STAGE_READ_PREAD,
                        WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_batches, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_demote, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_mapped, 0, 4);
    tcase_add_test(tc, test_mapped_register_fails);
    tcase_add_loop_test(tc, test_short_file, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_read_error, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_copy_failures, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_cancel, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_file_shrinks, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_test(tc, test_auto_follows_the_cache);
    tcase_add_test(tc, test_bad_jobs);
    tcase_add_test(tc, test_empty_tensors);
    tcase_add_test(tc, test_config);
    tcase_add_test(tc, test_crew_kept);
    tcase_add_test(tc, test_crew_busy);
    tcase_add_test(tc, test_crew_fork);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
