#include "stage.h"

#include <errno.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
/* Picks the widest vector unit at run time (AVX2, AVX-512): the checksum of
 * one tensor is sequential, so its speed bounds how fast a large tensor
 * lands. */
#include <xxh_x86dispatch.h>
#endif

/* How long the copier sleeps when copies are in flight but none finished
 * and no buffer is waiting; short next to one buffer's copy time. */
#define COPIER_NAP_NS 20000

/* Reads go in blocks (wb_stage_config.read_block), each checksummed right
 * after it is read, while it is still in the core's cache: checksumming a
 * whole chunk after reading it reads it from memory a second time, and
 * memory bandwidth is what a fast load runs out of (measured on the H200
 * host: 38 GB/s with whole-chunk checksums, readers busy all the time; 46
 * GB/s with 256 KiB blocks). */

/* A piece number meaning "the whole tensor". */
#define WHOLE UINT32_MAX

const char *wb__stage_mode_name(int mode)
{
    switch (mode) {
    case WB_STAGE_DIRECT:
        return "direct";
    case WB_STAGE_STAGED:
        return "staged";
    case WB_STAGE_MAPPED:
        return "mapped";
    default:
        return "unknown";
    }
}

void wb__stage_config_fill(wb_stage_config *c)
{
    if (c->read_threads == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        c->read_threads = cpus > 1 ? (unsigned)(cpus - cpus / 4) : 1;
        if (c->read_threads > WB_STAGE_DEFAULT_MAX_THREADS)
            c->read_threads = WB_STAGE_DEFAULT_MAX_THREADS;
    }
    if (c->chunk_bytes == 0)
        c->chunk_bytes = WB_STAGE_DEFAULT_CHUNK;
    if (c->buffers == 0)
        c->buffers = WB_STAGE_DEFAULT_BUFFERS;
    if (c->read_block == 0)
        c->read_block = WB_STAGE_DEFAULT_READ_BLOCK;
}

int wb__stage_config_check(const wb_stage_config *c, wb_err *err)
{
    if (c->read_threads < 1 || c->read_threads > WB_STAGE_MAX_THREADS)
        return wb__err_set(err, WB_EINVAL, "read threads: %u is not between 1 and %d",
                           c->read_threads, WB_STAGE_MAX_THREADS);
    if (c->chunk_bytes < WB_STAGE_MIN_CHUNK || c->chunk_bytes > WB_STAGE_MAX_CHUNK)
        return wb__err_set(err, WB_EINVAL,
                           "staging buffer size: %llu bytes is not between %u and %llu",
                           (unsigned long long)c->chunk_bytes, WB_STAGE_MIN_CHUNK,
                           (unsigned long long)WB_STAGE_MAX_CHUNK);
    if (c->read_block < 4096 || c->read_block > c->chunk_bytes)
        return wb__err_set(err, WB_EINVAL, "read block: %u bytes is not between 4096 and %llu",
                           c->read_block, (unsigned long long)c->chunk_bytes);
    if (c->buffers < 2 || c->buffers > WB_STAGE_MAX_BUFFERS)
        return wb__err_set(err, WB_EINVAL, "staging buffers: %u is not between 2 and %d",
                           c->buffers, WB_STAGE_MAX_BUFFERS);
    return WB_OK;
}

double wb__stage_gbps(uint64_t bytes, double busy, unsigned threads)
{
    if (busy <= 0 || threads == 0)
        return 0;
    return (double)bytes / (busy / (double)threads) / 1e9;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One contiguous part of a tensor that lands in a chunk. */
typedef struct seg {
    uint32_t tensor;
    uint32_t piece; /* WHOLE, or the piece's number within its tensor */
    uint64_t rel;   /* offset in the chunk */
    uint64_t len;
} seg;

/* One unit of reading: a span of the slab filled from one or more segments,
 * moved by one copy. */
typedef struct chunk {
    uint64_t slab_off;
    uint64_t span;  /* bytes from the first segment's start to the last one's end */
    uint64_t bytes; /* tensor bytes in it */
    uint32_t first_seg;
    uint32_t n_segs;
} chunk;

typedef struct lane {
    pthread_mutex_t mu;
    pthread_cond_t cv;
} lane;

typedef struct reader_stats {
    double read, hash, wait;
} reader_stats;

typedef struct ctx {
    wb_stage_job *job;
    uint64_t chunk_bytes;
    /* The plan. */
    chunk *chunks;
    size_t n_chunks;
    seg *segs;
    size_t n_segs;
    size_t *order; /* the order in which chunks are claimed */
    /* Per tensor, for tensors split into pieces. */
    uint32_t *pieces;
    uint32_t *lane_of;
    /* The next piece to hash; written under its lane's mutex, read without
     * it by a reader that checks whether its turn has come. */
    _Atomic uint32_t *ticket;
    XXH3_state_t **states;
    lane *lanes;
    unsigned n_lanes;
    /* Progress and failure. */
    atomic_size_t next;
    atomic_int failed;
    pthread_mutex_t mu; /* guards everything below and the first error */
    int rc;
    wb_err err;
    /* Staged mode: buffer states. A filled buffer waits for two things, its
     * copy and its checksum; whoever finishes second frees it. */
    pthread_cond_t free_cv;   /* a buffer became free, or the load failed */
    pthread_cond_t copier_cv; /* a buffer was filled, or a reader ended */
    unsigned *free_stack;
    unsigned n_free;
    unsigned *fill_q; /* filled buffers in the order they were filled */
    unsigned fill_head, fill_count;
    atomic_int *pending;
    chunk **buf_chunk;
    unsigned n_readers;
    unsigned readers_done;
} ctx;

static void fail(ctx *c, int rc, const wb_err *err)
{
    pthread_mutex_lock(&c->mu);
    if (c->rc == WB_OK) {
        c->rc = rc;
        c->err = *err;
    }
    atomic_store(&c->failed, 1);
    pthread_cond_broadcast(&c->free_cv);
    pthread_cond_broadcast(&c->copier_cv);
    pthread_mutex_unlock(&c->mu);
    for (unsigned i = 0; i < c->n_lanes; i++) {
        pthread_mutex_lock(&c->lanes[i].mu);
        pthread_cond_broadcast(&c->lanes[i].cv);
        pthread_mutex_unlock(&c->lanes[i].mu);
    }
}

static int stopped(const ctx *c)
{
    return atomic_load(&c->failed);
}

static void add_landed(ctx *c, uint64_t n)
{
    if (c->job->landed)
        atomic_fetch_add(c->job->landed, n);
}

/* Reads exactly len bytes at offset, retrying short reads and EINTR. */
static int read_full(int fd, uint8_t *buf, uint64_t len, uint64_t offset, const char *file,
                     const char *tensor, wb_err *err)
{
    uint64_t got = 0;
    while (got < len) {
        uint64_t want = len - got;
        if (want > (1u << 30))
            want = 1u << 30;
        ssize_t r = pread(fd, buf + got, (size_t)want, (off_t)(offset + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return wb__err_errno(err, WB_EIO, errno, "%s: reading tensor '%s' at offset %llu", file,
                                 tensor, (unsigned long long)(offset + got));
        }
        if (r == 0)
            return wb__err_set(err, WB_EIO,
                               "%s: tensor '%s': the file ends at %llu, before the tensor's "
                               "end at %llu",
                               file, tensor, (unsigned long long)(offset + got),
                               (unsigned long long)(offset + len));
        got += (uint64_t)r;
    }
    return WB_OK;
}

static uint64_t hash_once(const void *p, uint64_t len)
{
    static const uint8_t empty[1];
    return XXH3_64bits(len ? p : empty, (size_t)len);
}

/* ---- planning ---- */

typedef struct unit {
    size_t first_chunk, n_chunks;
    uint64_t bytes;
    unsigned lane;
} unit;

static int by_slab_offset(const void *a, const void *b, void *arg)
{
    const wb_stage_tensor *t = arg;
    uint64_t x = t[*(const size_t *)a].slab_offset, y = t[*(const size_t *)b].slab_offset;
    return x < y ? -1 : x > y;
}

static int by_bytes_desc(const void *a, const void *b, void *arg)
{
    const unit *u = arg;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    if (u[i].bytes != u[j].bytes)
        return u[i].bytes < u[j].bytes ? 1 : -1;
    return i < j ? -1 : i > j;
}

static int oom(wb_err *err, const char *what)
{
    return wb__err_set(err, WB_ENOMEM, "out of memory planning the load (%s)", what);
}

/* Cuts the tensors into chunks and decides the order of claims. */
static int plan(ctx *c, unsigned lanes, wb_err *err)
{
    wb_stage_job *j = c->job;
    size_t n = j->n_tensors;
    uint64_t cb = c->chunk_bytes;
    size_t n_data = 0, max_chunks = 0;
    for (size_t i = 0; i < n; i++) {
        if (j->tensors[i].nbytes == 0) {
            j->tensors[i].xxh3 = hash_once(NULL, 0);
            continue;
        }
        n_data++;
        max_chunks += (size_t)((j->tensors[i].nbytes + cb - 1) / cb);
    }
    size_t *idx = malloc((n_data ? n_data : 1) * sizeof *idx);
    unit *units = malloc((max_chunks ? max_chunks : 1) * sizeof *units);
    c->chunks = malloc((max_chunks ? max_chunks : 1) * sizeof *c->chunks);
    c->segs = malloc((max_chunks + n_data + 1) * sizeof *c->segs);
    c->order = malloc((max_chunks ? max_chunks : 1) * sizeof *c->order);
    c->pieces = calloc(n ? n : 1, sizeof *c->pieces);
    c->lane_of = calloc(n ? n : 1, sizeof *c->lane_of);
    c->ticket = calloc(n ? n : 1, sizeof *c->ticket);
    c->states = calloc(n ? n : 1, sizeof *c->states);
    int rc = WB_OK;
    if (!idx || !units || !c->chunks || !c->segs || !c->order || !c->pieces || !c->lane_of ||
        !c->ticket || !c->states) {
        rc = oom(err, "chunk tables");
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (j->tensors[i].nbytes)
            idx[k++] = i;
    }
    qsort_r(idx, n_data, sizeof *idx, by_slab_offset, j->tensors);

    size_t n_units = 0;
    unit *open = NULL; /* the group of small tensors being filled */
    for (size_t q = 0; q < n_data; q++) {
        size_t ti = idx[q];
        const wb_stage_tensor *t = &j->tensors[ti];
        if (t->nbytes > cb) {
            open = NULL;
            unit *u = &units[n_units++];
            u->first_chunk = c->n_chunks;
            u->bytes = t->nbytes;
            uint32_t p = 0;
            for (uint64_t off = 0; off < t->nbytes; off += cb, p++) {
                uint64_t len = t->nbytes - off < cb ? t->nbytes - off : cb;
                chunk *ch = &c->chunks[c->n_chunks++];
                ch->slab_off = t->slab_offset + off;
                ch->span = len;
                ch->bytes = len;
                ch->first_seg = (uint32_t)c->n_segs;
                ch->n_segs = 1;
                c->segs[c->n_segs++] =
                    (seg){.tensor = (uint32_t)ti, .piece = p, .rel = 0, .len = len};
            }
            u->n_chunks = p;
            c->pieces[ti] = p;
            if (!(c->states[ti] = XXH3_createState())) {
                rc = oom(err, "checksum states");
                goto out;
            }
            XXH3_64bits_reset(c->states[ti]);
            continue;
        }
        chunk *last = open ? &c->chunks[open->first_chunk] : NULL;
        if (last && t->slab_offset >= last->slab_off &&
            t->slab_offset + t->nbytes - last->slab_off <= cb) {
            uint64_t rel = t->slab_offset - last->slab_off;
            c->segs[c->n_segs++] =
                (seg){.tensor = (uint32_t)ti, .piece = WHOLE, .rel = rel, .len = t->nbytes};
            last->n_segs++;
            last->span = rel + t->nbytes;
            last->bytes += t->nbytes;
            open->bytes += t->nbytes;
            continue;
        }
        unit *u = &units[n_units++];
        u->first_chunk = c->n_chunks;
        u->n_chunks = 1;
        u->bytes = t->nbytes;
        chunk *ch = &c->chunks[c->n_chunks++];
        ch->slab_off = t->slab_offset;
        ch->span = t->nbytes;
        ch->bytes = t->nbytes;
        ch->first_seg = (uint32_t)c->n_segs;
        ch->n_segs = 1;
        c->segs[c->n_segs++] =
            (seg){.tensor = (uint32_t)ti, .piece = WHOLE, .rel = 0, .len = t->nbytes};
        open = u;
    }

    /* Largest unit first, each onto the least loaded lane. */
    size_t *uorder = idx; /* reused: n_units <= n_data */
    for (size_t u = 0; u < n_units; u++)
        uorder[u] = u;
    qsort_r(uorder, n_units, sizeof *uorder, by_bytes_desc, units);
    uint64_t load[WB_STAGE_MAX_THREADS] = {0};
    size_t per_lane[WB_STAGE_MAX_THREADS] = {0};
    for (size_t q = 0; q < n_units; q++) {
        unit *u = &units[uorder[q]];
        unsigned best = 0;
        for (unsigned l = 1; l < lanes; l++) {
            if (load[l] < load[best])
                best = l;
        }
        u->lane = best;
        load[best] += u->bytes;
        per_lane[best] += u->n_chunks;
        const seg *s = &c->segs[c->chunks[u->first_chunk].first_seg];
        if (s->piece != WHOLE)
            c->lane_of[s->tensor] = best;
    }
    /* Each lane's chunks in order (units in the order they were assigned),
     * then one chunk from each lane in turn. */
    size_t start[WB_STAGE_MAX_THREADS + 1], fill[WB_STAGE_MAX_THREADS];
    start[0] = 0;
    for (unsigned l = 0; l < lanes; l++)
        start[l + 1] = start[l] + per_lane[l];
    memcpy(fill, start, sizeof fill);
    size_t *seq = malloc((c->n_chunks ? c->n_chunks : 1) * sizeof *seq);
    if (!seq) {
        rc = oom(err, "claim order");
        goto out;
    }
    for (size_t q = 0; q < n_units; q++) {
        const unit *u = &units[uorder[q]];
        for (size_t x = 0; x < u->n_chunks; x++)
            seq[fill[u->lane]++] = u->first_chunk + x;
    }
    size_t o = 0;
    for (size_t round = 0; o < c->n_chunks; round++) {
        for (unsigned l = 0; l < lanes; l++) {
            if (start[l] + round < start[l + 1])
                c->order[o++] = seq[start[l] + round];
        }
    }
    free(seq);
out:
    free(idx);
    free(units);
    return rc;
}

/* ---- reading and checksums ---- */

static int my_turn(ctx *c, const seg *s)
{
    return atomic_load_explicit(&c->ticket[s->tensor], memory_order_acquire) == s->piece;
}

/* Hands the turn of a split tensor to its next piece. */
static void pass_turn(ctx *c, const seg *s)
{
    lane *ln = &c->lanes[c->lane_of[s->tensor]];
    pthread_mutex_lock(&ln->mu);
    atomic_store_explicit(&c->ticket[s->tensor], s->piece + 1, memory_order_release);
    pthread_cond_broadcast(&ln->cv);
    pthread_mutex_unlock(&ln->mu);
}

/* What a reader knows of the chunk it holds: how much of its piece (if it
 * is a piece of a split tensor) is already checksummed. */
typedef struct held {
    uint64_t hashed;
} held;

/* Reads a chunk's segments to base, block by block. Whole tensors are
 * checksummed as they are read; a piece of a split tensor too when its turn
 * has come, else later (finish_hash). In a staging buffer the gaps between
 * tensors are zeroed so that no stale bytes reach the slab. */
static int read_chunk(ctx *c, reader_stats *rs, const chunk *ch, uint8_t *base, int zero_gaps,
                      XXH3_state_t *local, held *h, wb_err *err)
{
    const wb_stage_job *j = c->job;
    uint64_t end = 0;
    h->hashed = 0;
    for (uint32_t i = 0; i < ch->n_segs; i++) {
        const seg *s = &c->segs[ch->first_seg + i];
        wb_stage_tensor *t = &j->tensors[s->tensor];
        uint8_t *p = base + s->rel;
        if (zero_gaps && s->rel > end)
            memset(base + end, 0, s->rel - end);
        uint64_t from = s->piece == WHOLE ? 0 : (uint64_t)s->piece * c->chunk_bytes;
        uint64_t blk = c->job->cfg.read_block;
        int whole = s->piece == WHOLE, streaming = whole && s->len > blk;
        if (streaming)
            XXH3_64bits_reset(local);
        for (uint64_t done = 0; done < s->len;) {
            uint64_t n = s->len - done < blk ? s->len - done : blk;
            double t0 = now_s();
            int rc = read_full(j->fds[t->file], p + done, n, t->file_offset + from + done,
                               j->files[t->file], t->name, err);
            double t1 = now_s();
            rs->read += t1 - t0;
            if (rc != WB_OK)
                return rc;
            done += n;
            if (streaming) {
                XXH3_64bits_update(local, p + done - n, (size_t)n);
            } else if (!whole && my_turn(c, s)) {
                XXH3_64bits_update(c->states[s->tensor], p + h->hashed, (size_t)(done - h->hashed));
                h->hashed = done;
            }
            if (streaming || !whole)
                rs->hash += now_s() - t1;
        }
        if (whole) {
            double t0 = now_s();
            t->xxh3 = streaming ? XXH3_64bits_digest(local) : hash_once(p, s->len);
            rs->hash += now_s() - t0;
        }
        end = s->rel + s->len;
    }
    return WB_OK;
}

/* Finishes the checksum of a chunk that is a piece of a split tensor: waits
 * for its turn, checksums what was not yet, passes the turn on. Returns
 * nonzero when the load failed meanwhile. */
static int finish_hash(ctx *c, reader_stats *rs, const chunk *ch, const uint8_t *base,
                       const held *h)
{
    const seg *s = &c->segs[ch->first_seg];
    if (ch->n_segs != 1 || s->piece == WHOLE)
        return 0;
    if (h->hashed < s->len) {
        lane *ln = &c->lanes[c->lane_of[s->tensor]];
        double t0 = now_s();
        pthread_mutex_lock(&ln->mu);
        while (!my_turn(c, s) && !stopped(c))
            pthread_cond_wait(&ln->cv, &ln->mu);
        int gone = !my_turn(c, s);
        pthread_mutex_unlock(&ln->mu);
        double t1 = now_s();
        rs->wait += t1 - t0;
        if (gone)
            return 1;
        /* Only the holder of the turn touches the tensor's state; the
         * ticket's release and acquire order the turns. */
        XXH3_64bits_update(c->states[s->tensor], base + s->rel + h->hashed,
                           (size_t)(s->len - h->hashed));
        rs->hash += now_s() - t1;
    }
    if (s->piece + 1 == c->pieces[s->tensor])
        c->job->tensors[s->tensor].xxh3 = XXH3_64bits_digest(c->states[s->tensor]);
    pass_turn(c, s);
    return 0;
}

/* ---- buffers ---- */

static int take_buffer(ctx *c, reader_stats *rs)
{
    double t0 = now_s();
    pthread_mutex_lock(&c->mu);
    while (c->n_free == 0 && !stopped(c))
        pthread_cond_wait(&c->free_cv, &c->mu);
    int b = -1;
    if (!stopped(c))
        b = (int)c->free_stack[--c->n_free];
    pthread_mutex_unlock(&c->mu);
    rs->wait += now_s() - t0;
    return b;
}

static void free_buffer(ctx *c, unsigned b)
{
    pthread_mutex_lock(&c->mu);
    c->free_stack[c->n_free++] = b;
    pthread_cond_signal(&c->free_cv);
    pthread_mutex_unlock(&c->mu);
}

/* Drops one of a filled buffer's two holds (copy, checksum). */
static void release_buffer(ctx *c, unsigned b)
{
    if (atomic_fetch_sub(&c->pending[b], 1) == 1)
        free_buffer(c, b);
}

static void hand_to_copier(ctx *c, unsigned b, chunk *ch)
{
    atomic_store(&c->pending[b], 2);
    pthread_mutex_lock(&c->mu);
    c->buf_chunk[b] = ch;
    c->fill_q[(c->fill_head + c->fill_count) % c->job->staging->n] = b;
    c->fill_count++;
    pthread_cond_signal(&c->copier_cv);
    pthread_mutex_unlock(&c->mu);
}

typedef struct reader {
    ctx *c;
    pthread_t tid;
    reader_stats st;
} reader;

static int check_cancel(ctx *c)
{
    if (c->job->cancel && atomic_load(c->job->cancel)) {
        wb_err e;
        wb__err_set(&e, WB_ESTATE, "the load was cancelled (the broker is stopping)");
        fail(c, WB_ESTATE, &e);
        return 1;
    }
    return 0;
}

static void *reader_main(void *arg)
{
    reader *r = arg;
    ctx *c = r->c;
    int staged = c->job->mode == WB_STAGE_STAGED;
    wb_err err;
    XXH3_state_t *local = XXH3_createState();
    if (!local) {
        wb__err_set(&err, WB_ENOMEM, "out of memory for a checksum state");
        fail(c, WB_ENOMEM, &err);
    }
    while (!stopped(c) && !check_cancel(c)) {
        int b = -1;
        if (staged && (b = take_buffer(c, &r->st)) < 0)
            break;
        size_t k = atomic_fetch_add(&c->next, 1);
        if (k >= c->n_chunks) {
            if (staged)
                free_buffer(c, (unsigned)b);
            break;
        }
        chunk *ch = &c->chunks[c->order[k]];
        uint8_t *base = staged ? c->job->staging->bufs[b] : c->job->host_dst + ch->slab_off;
        held h;
        int rc = read_chunk(c, &r->st, ch, base, staged, local, &h, &err);
        if (rc != WB_OK) {
            fail(c, rc, &err);
            if (staged)
                free_buffer(c, (unsigned)b);
            break;
        }
        if (staged)
            hand_to_copier(c, (unsigned)b, ch);
        else
            add_landed(c, ch->bytes);
        int gone = finish_hash(c, &r->st, ch, base, &h);
        if (staged)
            release_buffer(c, (unsigned)b);
        if (gone)
            break;
    }
    XXH3_freeState(local);
    pthread_mutex_lock(&c->mu);
    c->readers_done++;
    pthread_cond_signal(&c->copier_cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- the copier (staged mode, in the calling thread) ---- */

static void nap(ctx *c)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += COPIER_NAP_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&c->copier_cv, &c->mu, &ts);
}

static void run_copier(ctx *c, double *copy_seconds)
{
    wb_staging *sg = c->job->staging;
    wb_copy_engine *e = &sg->engine;
    unsigned n = sg->n;
    unsigned *inflight = malloc(n * sizeof *inflight);
    unsigned *batch = malloc(n * sizeof *batch);
    unsigned in_head = 0, in_count = 0;
    int started = 0;
    double first = 0, last = 0;
    wb_err err;
    /* The copier's naps must be short, not rounded up to the default 50 us
     * of timer slack. */
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    if (!inflight || !batch) {
        wb__err_set(&err, WB_ENOMEM, "out of memory for the copy queue");
        fail(c, WB_ENOMEM, &err);
    } else if (e->begin && e->begin(e->ctx, &err) != WB_OK) {
        fail(c, err.code ? err.code : WB_EIO, &err);
    }

    pthread_mutex_lock(&c->mu);
    for (;;) {
        unsigned m = 0;
        while (c->fill_count && batch) {
            batch[m++] = c->fill_q[c->fill_head];
            c->fill_head = (c->fill_head + 1) % n;
            c->fill_count--;
        }
        if (m == 0 && in_count == 0) {
            if (c->readers_done == c->n_readers)
                break;
            pthread_cond_wait(&c->copier_cv, &c->mu);
            continue;
        }
        pthread_mutex_unlock(&c->mu);

        for (unsigned i = 0; i < m; i++) {
            unsigned b = batch[i];
            const chunk *ch = c->buf_chunk[b];
            if (stopped(c)) {
                release_buffer(c, b);
                continue;
            }
            if (!started) {
                started = 1;
                first = now_s();
            }
            int rc = e->submit(e->ctx, (int)b, sg->bufs[b], (uint8_t *)c->job->dst + ch->slab_off,
                               (size_t)ch->span, &err);
            if (rc != WB_OK) {
                fail(c, rc, &err);
                release_buffer(c, b);
                continue;
            }
            inflight[(in_head + in_count) % n] = b;
            in_count++;
        }
        /* Copies on one stream end in the order they were queued. */
        int progressed = 0;
        while (in_count) {
            unsigned b = inflight[in_head];
            int q = stopped(c) ? 0 : e->query(e->ctx, (int)b, &err);
            if (q < 0) {
                fail(c, q, &err);
                break;
            }
            if (q == 0)
                break;
            in_head = (in_head + 1) % n;
            in_count--;
            add_landed(c, c->buf_chunk[b]->bytes);
            last = now_s();
            release_buffer(c, b);
            progressed = 1;
        }
        if (stopped(c) && in_count) {
            /* Nothing may be freed or refilled under a running copy. */
            double ignored;
            e->finish(e->ctx, &ignored, &err);
            while (in_count) {
                release_buffer(c, inflight[in_head]);
                in_head = (in_head + 1) % n;
                in_count--;
            }
        }
        pthread_mutex_lock(&c->mu);
        if (!progressed && in_count && c->fill_count == 0)
            nap(c);
    }
    pthread_mutex_unlock(&c->mu);
    if (started) {
        double dev = -1;
        int rc = e->finish(e->ctx, &dev, &err);
        if (rc != WB_OK && !stopped(c))
            fail(c, rc, &err);
        *copy_seconds = dev >= 0 ? dev : last - first;
    }
    if (slack > 0)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    free(inflight);
    free(batch);
}

/* ---- mapped mode ---- */

typedef struct hasher {
    ctx *c;
    pthread_t tid;
    const size_t *order;
    size_t n;
    atomic_size_t *next;
    reader_stats st;
} hasher;

static void *hasher_main(void *arg)
{
    hasher *h = arg;
    wb_stage_job *j = h->c->job;
    while (!stopped(h->c)) {
        size_t k = atomic_fetch_add(h->next, 1);
        if (k >= h->n)
            break;
        wb_stage_tensor *t = &j->tensors[h->order[k]];
        double t0 = now_s();
        t->xxh3 = hash_once(j->maps[t->file] + t->file_offset, t->nbytes);
        h->st.hash += now_s() - t0;
    }
    return NULL;
}

static int by_nbytes_desc(const void *a, const void *b, void *arg)
{
    const wb_stage_tensor *t = arg;
    uint64_t x = t[*(const size_t *)a].nbytes, y = t[*(const size_t *)b].nbytes;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int run_mapped(ctx *c, wb_stage_stats *st, wb_err *err)
{
    wb_stage_job *j = c->job;
    wb_copy_engine *e = j->engine;
    size_t n = j->n_tensors;
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    unsigned threads = j->cfg.read_threads;
    hasher *hs = calloc(threads, sizeof *hs);
    if (!order || !hs) {
        free(order);
        free(hs);
        return wb__err_set(err, WB_ENOMEM, "out of memory planning the load");
    }
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof *order, by_nbytes_desc, j->tensors);
    atomic_size_t next;
    atomic_init(&next, 0);
    unsigned started = 0;
    for (unsigned i = 0; i < threads; i++) {
        hs[i] = (hasher){.c = c, .order = order, .n = n, .next = &next};
        if (pthread_create(&hs[i].tid, NULL, hasher_main, &hs[i]) != 0)
            break;
        started++;
    }
    int rc = WB_OK;
    if (started == 0) {
        hasher_main(&hs[0]);
        started = 0;
    }
    /* The copies, in slab order, from the mapping; they overlap the
     * checksums. */
    int submitted = 0;
    double dev = -1;
    if (e->begin && (rc = e->begin(e->ctx, err)) != WB_OK)
        goto join;
    for (size_t i = 0; i < n && rc == WB_OK; i++) {
        const wb_stage_tensor *t = &j->tensors[i];
        for (uint64_t off = 0; off < t->nbytes && rc == WB_OK; off += c->chunk_bytes) {
            uint64_t len = t->nbytes - off < c->chunk_bytes ? t->nbytes - off : c->chunk_bytes;
            rc = e->submit(e->ctx, -1, j->maps[t->file] + t->file_offset + off,
                           (uint8_t *)j->dst + t->slab_offset + off, (size_t)len, err);
            submitted = 1;
        }
        if (j->cancel && atomic_load(j->cancel) && rc == WB_OK)
            rc = wb__err_set(err, WB_ESTATE, "the load was cancelled (the broker is stopping)");
    }
    if (submitted) {
        wb_err ferr;
        int frc = e->finish(e->ctx, &dev, &ferr);
        if (rc == WB_OK && frc != WB_OK) {
            rc = frc;
            *err = ferr;
        }
    }
    st->copy_seconds = dev;
join:
    if (rc != WB_OK) {
        wb_err copy_err = *err;
        fail(c, rc, &copy_err);
    }
    for (unsigned i = 0; i < started; i++) {
        pthread_join(hs[i].tid, NULL);
        st->hash_busy += hs[i].st.hash;
    }
    if (started == 0)
        st->hash_busy += hs[0].st.hash;
    st->threads = started ? started : 1;
    if (rc == WB_OK)
        add_landed(c, st->bytes);
    free(order);
    free(hs);
    return rc;
}

/* ---- the whole ---- */

static void ctx_free(ctx *c)
{
    if (c->states) {
        for (size_t i = 0; i < c->job->n_tensors; i++)
            XXH3_freeState(c->states[i]);
    }
    free(c->states);
    free(c->chunks);
    free(c->segs);
    free(c->order);
    free(c->pieces);
    free(c->lane_of);
    free(c->ticket);
    for (unsigned i = 0; i < c->n_lanes; i++) {
        pthread_mutex_destroy(&c->lanes[i].mu);
        pthread_cond_destroy(&c->lanes[i].cv);
    }
    free(c->lanes);
    free(c->free_stack);
    free(c->fill_q);
    free(c->pending);
    free(c->buf_chunk);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->free_cv);
    pthread_cond_destroy(&c->copier_cv);
}

static int check_job(const wb_stage_job *j, wb_err *err)
{
    for (size_t i = 0; i < j->n_tensors; i++) {
        if (j->tensors[i].file >= j->n_files)
            return wb__err_set(err, WB_EINTERNAL, "tensor '%s' names file %u of %u",
                               j->tensors[i].name, j->tensors[i].file, j->n_files);
    }
    switch (j->mode) {
    case WB_STAGE_DIRECT:
        if (!j->host_dst && j->n_tensors)
            return wb__err_set(err, WB_EINTERNAL, "a direct load needs the slab's host memory");
        return WB_OK;
    case WB_STAGE_STAGED:
        if (!j->staging || j->staging->n < 1 || !j->staging->engine.submit ||
            !j->staging->engine.query || !j->staging->engine.finish)
            return wb__err_set(err, WB_EINTERNAL, "a staged load needs a staging ring and engine");
        return WB_OK;
    case WB_STAGE_MAPPED:
        if (!j->maps || !j->engine || !j->engine->submit || !j->engine->finish)
            return wb__err_set(err, WB_EINTERNAL, "a mapped load needs mappings and an engine");
        return WB_OK;
    default:
        return wb__err_set(err, WB_EINTERNAL, "unknown load mode %d", j->mode);
    }
}

int wb__stage_run(wb_stage_job *job, wb_stage_stats *st, wb_err *err)
{
    memset(st, 0, sizeof *st);
    double t_start = now_s();
    int rc = check_job(job, err);
    if (rc != WB_OK)
        return rc;
    wb__stage_config_fill(&job->cfg);
    if (job->cfg.read_threads > WB_STAGE_MAX_THREADS)
        job->cfg.read_threads = WB_STAGE_MAX_THREADS;
    st->mode = job->mode;
    for (size_t i = 0; i < job->n_tensors; i++)
        st->bytes += job->tensors[i].nbytes;

    ctx c = {.job = job};
    c.chunk_bytes = job->mode == WB_STAGE_STAGED ? job->staging->size : job->cfg.chunk_bytes;
    atomic_init(&c.next, 0);
    atomic_init(&c.failed, 0);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.free_cv, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c.copier_cv, &ca);
    pthread_condattr_destroy(&ca);
    st->chunk_bytes = c.chunk_bytes;

    if (job->mode == WB_STAGE_MAPPED) {
        for (size_t i = 0; i < job->n_tensors; i++) {
            if (job->tensors[i].nbytes == 0)
                job->tensors[i].xxh3 = hash_once(NULL, 0);
        }
        rc = run_mapped(&c, st, err);
        st->seconds = now_s() - t_start;
        ctx_free(&c);
        return rc;
    }

    unsigned threads = job->cfg.read_threads;
    c.n_lanes = threads;
    c.lanes = calloc(threads, sizeof *c.lanes);
    if (!c.lanes) {
        ctx_free(&c);
        return oom(err, "lanes");
    }
    for (unsigned i = 0; i < threads; i++) {
        pthread_mutex_init(&c.lanes[i].mu, NULL);
        pthread_cond_init(&c.lanes[i].cv, NULL);
    }
    if ((rc = plan(&c, threads, err)) != WB_OK) {
        ctx_free(&c);
        return rc;
    }
    st->chunks = c.n_chunks;
    if (threads > c.n_chunks)
        threads = c.n_chunks ? (unsigned)c.n_chunks : 1;
    if (job->mode == WB_STAGE_STAGED) {
        unsigned nb = job->staging->n;
        st->buffers = nb;
        c.free_stack = malloc(nb * sizeof *c.free_stack);
        c.fill_q = malloc(nb * sizeof *c.fill_q);
        c.pending = calloc(nb, sizeof *c.pending);
        c.buf_chunk = calloc(nb, sizeof *c.buf_chunk);
        if (!c.free_stack || !c.fill_q || !c.pending || !c.buf_chunk) {
            ctx_free(&c);
            return oom(err, "buffer tables");
        }
        /* Lowest buffer first, so that a small load touches few buffers. */
        for (unsigned i = 0; i < nb; i++)
            c.free_stack[i] = nb - 1 - i;
        c.n_free = nb;
    }

    reader *rs = calloc(threads, sizeof *rs);
    if (!rs) {
        ctx_free(&c);
        return oom(err, "reader threads");
    }
    unsigned started = 0;
    if (c.n_chunks) {
        for (unsigned i = 0; i < threads; i++) {
            rs[i].c = &c;
            if (pthread_create(&rs[i].tid, NULL, reader_main, &rs[i]) != 0)
                break;
            started++;
        }
    }
    pthread_mutex_lock(&c.mu);
    c.n_readers = started;
    pthread_mutex_unlock(&c.mu);
    if (c.n_chunks && started == 0) {
        wb_err e;
        wb__err_set(&e, WB_ENOMEM, "could not start any reader thread");
        fail(&c, WB_ENOMEM, &e);
    }
    if (job->mode == WB_STAGE_STAGED && c.n_chunks)
        run_copier(&c, &st->copy_seconds);
    for (unsigned i = 0; i < started; i++) {
        pthread_join(rs[i].tid, NULL);
        st->read_busy += rs[i].st.read;
        st->hash_busy += rs[i].st.hash;
        st->wait_busy += rs[i].st.wait;
    }
    st->threads = started ? started : threads;
    free(rs);
    rc = c.rc;
    if (rc != WB_OK)
        *err = c.err;
    st->seconds = now_s() - t_start;
    ctx_free(&c);
    return rc;
}
