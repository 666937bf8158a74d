/* The loading pipeline as a whole: the configuration, the checks on a job,
 * the first error, and wb__stage_run, which plans the load, starts the
 * readers and runs the copier or the mapped copies (see stage.h). */
#include "stage_impl.h"

#include "alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

static const char *const read_names[] = {[WB_STAGE_READ_PREAD] = "pread",
                                         [WB_STAGE_READ_MMAP] = "mmap",
                                         [WB_STAGE_READ_MMAP_NT] = "mmap-nt",
                                         [WB_STAGE_READ_AUTO] = "auto"};
static const char *const pages_names[] = {
    [WB_STAGE_PAGES_NORMAL] = "normal", [WB_STAGE_PAGES_HUGE] = "huge"};

const char *wb__stage_read_name(int r)
{
    return r >= WB_STAGE_READ_PREAD && r <= WB_STAGE_READ_AUTO ? read_names[r] : "unknown";
}

int wb__stage_read_parse(const char *name)
{
    for (int r = WB_STAGE_READ_PREAD; r <= WB_STAGE_READ_AUTO; r++) {
        if (strcmp(name, read_names[r]) == 0)
            return r;
    }
    return 0;
}

const char *wb__stage_pages_name(int p)
{
    return p >= WB_STAGE_PAGES_NORMAL && p <= WB_STAGE_PAGES_HUGE ? pages_names[p] : "unknown";
}

const char *wb__stage_demote_name(int d)
{
    return d == WB_STAGE_DEMOTE_OFF ? "off" : d == WB_STAGE_DEMOTE_ON ? "on" : "unknown";
}

int wb__stage_demote_parse(const char *name)
{
    return strcmp(name, "off") == 0  ? WB_STAGE_DEMOTE_OFF
           : strcmp(name, "on") == 0 ? WB_STAGE_DEMOTE_ON
                                     : 0;
}

int wb__stage_pages_parse(const char *name)
{
    for (int p = WB_STAGE_PAGES_NORMAL; p <= WB_STAGE_PAGES_HUGE; p++) {
        if (strcmp(name, pages_names[p]) == 0)
            return p;
    }
    return 0;
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
    if (c->read_source == 0)
        c->read_source = WB_STAGE_DEFAULT_READ;
    if (c->ring_pages == 0)
        c->ring_pages = WB_STAGE_DEFAULT_RING_PAGES;
    if (c->register_piece == 0)
        c->register_piece = WB_STAGE_REGISTER_PIECE;
    if (c->copy_batch == 0)
        c->copy_batch = WB_STAGE_DEFAULT_COPY_BATCH;
    if (c->demote == 0)
        c->demote = WB_STAGE_DEFAULT_DEMOTE;
}

int wb__copy_submit_many(wb_copy_engine *e, const wb_copy *cp, unsigned n, wb_err *err)
{
    if (e->submit_many)
        return e->submit_many(e->ctx, cp, n, err);
    int rc = WB_OK;
    for (unsigned i = 0; i < n && rc == WB_OK; i++)
        rc = e->submit(e->ctx, cp[i].buf, cp[i].src, cp[i].dst, cp[i].len, err);
    return rc;
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
    if (c->read_source < WB_STAGE_READ_PREAD || c->read_source > WB_STAGE_READ_AUTO)
        return wb__err_set(err, WB_EINVAL, "read source: %d is not pread, mmap, mmap-nt or auto",
                           c->read_source);
    if (c->ring_pages < WB_STAGE_PAGES_NORMAL || c->ring_pages > WB_STAGE_PAGES_HUGE)
        return wb__err_set(err, WB_EINVAL, "staging pages: %d is not normal or huge",
                           c->ring_pages);
    if (c->register_threads > WB_STAGE_MAX_THREADS)
        return wb__err_set(err, WB_EINVAL, "register threads: %u is not between 0 and %d",
                           c->register_threads, WB_STAGE_MAX_THREADS);
    if (c->copy_batch < 1 || c->copy_batch > WB_STAGE_MAX_BATCH)
        return wb__err_set(err, WB_EINVAL, "copy batch: %u is not between 1 and %d", c->copy_batch,
                           WB_STAGE_MAX_BATCH);
    if (c->demote < WB_STAGE_DEMOTE_OFF || c->demote > WB_STAGE_DEMOTE_ON)
        return wb__err_set(err, WB_EINVAL, "staging demote: %d is not off or on", c->demote);
    if (c->register_piece == 0 || c->register_piece % (64u * 1024u) != 0)
        return wb__err_set(err, WB_EINVAL,
                           "register piece: %llu bytes is not a positive multiple of 65536",
                           (unsigned long long)c->register_piece);
    return WB_OK;
}

double wb__stage_gbps(uint64_t bytes, double busy, unsigned threads)
{
    if (busy <= 0 || threads == 0)
        return 0;
    return (double)bytes / (busy / (double)threads) / 1e9;
}

void wb__stage_fail(ctx *c, int rc, const wb_err *err)
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

int wb__stage_oom(wb_err *err, const char *what)
{
    return wb__err_set(err, WB_ENOMEM, "out of memory planning the load (%s)", what);
}

/* Whether at least 90 % of 64 pages spread evenly over a mapping are in
 * the page cache. */
static int mostly_cached(const uint8_t *p, uint64_t len)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), pages = (len + page - 1) / page;
    unsigned samples = 0, in = 0;
    for (unsigned i = 0; i < 64; i++) {
        uint64_t pg = pages * i / 64;
        unsigned char v = 0;
        if (i && pg == pages * (i - 1) / 64)
            continue; /* a small file: each page once */
        samples++;
        if (mincore((void *)(p + pg * page), (size_t)page, &v) == 0 && (v & 1))
            in++;
    }
    return in * 10 >= samples * 9;
}

/* The mmap read sources: each file mapped read-only for the load. A file
 * that cannot be mapped (empty, or not a regular file) is read with pread;
 * its errors then say what is wrong with it. */
static void src_maps_open(ctx *c)
{
    const wb_stage_job *j = c->job;
    c->src_maps = wb__calloc(j->n_files ? j->n_files : 1, sizeof *c->src_maps);
    c->src_lens = wb__calloc(j->n_files ? j->n_files : 1, sizeof *c->src_lens);
    if (!c->src_maps || !c->src_lens)
        return; /* every file read with pread */
    for (uint32_t i = 0; i < j->n_files; i++) {
        struct stat sb;
        if (fstat(j->fds[i], &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0)
            continue;
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, j->fds[i], 0);
        if (p == MAP_FAILED)
            continue;
        if (j->cfg.read_source == WB_STAGE_READ_AUTO && !mostly_cached(p, (uint64_t)sb.st_size)) {
            munmap(p, (size_t)sb.st_size);
            continue;
        }
        c->src_maps[i] = p;
        c->src_lens[i] = (uint64_t)sb.st_size;
    }
}

static void src_maps_close(ctx *c)
{
    for (uint32_t i = 0; c->src_maps && i < c->job->n_files; i++) {
        if (c->src_maps[i])
            munmap((void *)c->src_maps[i], (size_t)c->src_lens[i]);
    }
    free(c->src_maps);
    free(c->src_lens);
    c->src_maps = NULL;
    c->src_lens = NULL;
}

static void ctx_free(ctx *c)
{
    src_maps_close(c);
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

int wb__stage_ring_ready(const wb_staging *sg, wb_err *err)
{
    if (!sg->engine.submit || !sg->engine.query || !sg->engine.finish)
        return wb__err_set(err, WB_EINTERNAL, "a staged load needs a copy engine");
    return WB_OK;
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
        if (!j->staging || j->staging->n < 1)
            return wb__err_set(err, WB_EINTERNAL, "a staged load needs a staging ring");
        /* With before_copy the engine may come later (wb__stage_ring_ready). */
        return j->before_copy ? WB_OK : wb__stage_ring_ready(j->staging, err);
    case WB_STAGE_MAPPED:
        if (!j->maps || !j->engine || !j->engine->submit || !j->engine->finish)
            return wb__err_set(err, WB_EINTERNAL, "a mapped load needs mappings and an engine");
        return WB_OK;
    default:
        return wb__err_set(err, WB_EINTERNAL, "unknown load mode %d", j->mode);
    }
}

static void *reader_task(void *arg)
{
    reader *r = arg;
    r->started_at = wb__clock_mono_s() - r->c->t_start;
    return wb__stage_reader_main(r);
}

/* Threads of the load's own, when the crew is busy with another load. */
static unsigned start_own(reader *rs, unsigned n)
{
    pthread_attr_t a;
    int small = wb__stage_reader_attr(&a);
    unsigned k = 0;
    for (; k < n; k++) {
        if (pthread_create(&rs[k].tid, small ? &a : NULL, reader_task, &rs[k]) != 0)
            break;
    }
    if (small)
        pthread_attr_destroy(&a);
    return k;
}

int wb__stage_run(wb_stage_job *job, wb_stage_stats *st, wb_err *err)
{
    memset(st, 0, sizeof *st);
    double t_start = wb__clock_mono_s();
    int rc = check_job(job, err);
    if (rc != WB_OK)
        return rc;
    wb__stage_config_fill(&job->cfg);
    if (job->cfg.read_threads > WB_STAGE_MAX_THREADS)
        job->cfg.read_threads = WB_STAGE_MAX_THREADS;
    st->mode = job->mode;
    for (size_t i = 0; i < job->n_tensors; i++)
        st->bytes += job->tensors[i].nbytes;

    ctx c = {.job = job, .t_start = t_start};
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
        rc = wb__stage_run_mapped(&c, st, err);
        st->seconds = wb__clock_mono_s() - t_start;
        ctx_free(&c);
        return rc;
    }

    unsigned threads = job->cfg.read_threads;
    c.lanes = wb__calloc(threads, sizeof *c.lanes);
    if (!c.lanes) {
        ctx_free(&c);
        return wb__stage_oom(err, "lanes");
    }
    /* Counted once they exist: ctx_free destroys n_lanes locks. */
    c.n_lanes = threads;
    for (unsigned i = 0; i < threads; i++) {
        pthread_mutex_init(&c.lanes[i].mu, NULL);
        pthread_cond_init(&c.lanes[i].cv, NULL);
    }
    if ((rc = wb__stage_plan(&c, threads, err)) != WB_OK) {
        ctx_free(&c);
        return rc;
    }
    st->chunks = c.n_chunks;
    st->read_source = job->cfg.read_source;
    if (job->cfg.read_source != WB_STAGE_READ_PREAD && c.n_chunks) {
        c.nt = job->cfg.read_source != WB_STAGE_READ_MMAP;
        src_maps_open(&c);
        if (job->cfg.read_source == WB_STAGE_READ_AUTO) {
            st->read_source = WB_STAGE_READ_PREAD;
            for (uint32_t i = 0; c.src_maps && i < job->n_files; i++) {
                if (c.src_maps[i])
                    st->read_source = WB_STAGE_READ_MMAP_NT;
            }
        }
    }
    if (threads > c.n_chunks)
        threads = c.n_chunks ? (unsigned)c.n_chunks : 1;
    if (job->mode == WB_STAGE_STAGED) {
        unsigned nb = job->staging->n;
        st->buffers = nb;
        c.free_stack = wb__malloc(nb * sizeof *c.free_stack);
        c.fill_q = wb__malloc(nb * sizeof *c.fill_q);
        c.pending = wb__calloc(nb, sizeof *c.pending);
        c.buf_chunk = wb__calloc(nb, sizeof *c.buf_chunk);
        if (!c.free_stack || !c.fill_q || !c.pending || !c.buf_chunk) {
            ctx_free(&c);
            return wb__stage_oom(err, "buffer tables");
        }
        /* Lowest buffer first, so that a small load touches few buffers. */
        for (unsigned i = 0; i < nb; i++)
            c.free_stack[i] = nb - 1 - i;
        c.n_free = nb;
    }

    reader *rs = wb__calloc(threads, sizeof *rs);
    if (!rs) {
        ctx_free(&c);
        return wb__stage_oom(err, "reader threads");
    }
    unsigned started = 0;
    int crewed = 0;
    if (c.n_chunks) {
        for (unsigned i = 0; i < threads; i++)
            rs[i].c = &c;
        st->plan_at = wb__clock_mono_s() - t_start;
        started = wb__crew_start(threads, reader_task, rs, sizeof *rs);
        crewed = started > 0;
        if (!crewed)
            started = start_own(rs, threads);
        /* Before the copier runs (here, below): it waits for n_readers. */
        c.n_readers = started;
    }
    if (c.n_chunks && started == 0) {
        wb_err e;
        wb__err_set(&e, WB_ENOMEM, "could not start any reader thread");
        wb__stage_fail(&c, WB_ENOMEM, &e);
    }
    if (job->mode == WB_STAGE_STAGED && c.n_chunks) {
        wb__stage_run_copier(&c, st);
    } else if (job->mode == WB_STAGE_STAGED && job->before_copy && !stopped(&c)) {
        /* Nothing to copy (every tensor empty): the destination still has
         * to exist. */
        wb_err e;
        if ((rc = job->before_copy(job->before_copy_ctx, job, &e)) != WB_OK)
            wb__stage_fail(&c, rc, &e);
    }
    if (crewed)
        wb__crew_wait();
    for (unsigned i = 0; i < started; i++) {
        if (!crewed)
            pthread_join(rs[i].tid, NULL);
        if (rs[i].started_at > st->readers_at)
            st->readers_at = rs[i].started_at;
        st->read_busy += rs[i].st.read;
        st->hash_busy += rs[i].st.hash;
        st->wait_busy += rs[i].st.wait;
    }
    st->threads = started ? started : threads;
    free(rs);
    rc = c.rc;
    if (rc != WB_OK)
        *err = c.err;
    st->first_fill_at = c.first_fill_at;
    st->seconds = wb__clock_mono_s() - t_start;
    ctx_free(&c);
    return rc;
}
