/* A published version's checksums (publish.h): computed after the version
 * became current, on the checker thread (a loader of its own, so that no
 * commit or load ever waits behind a read-back), by several threads that
 * each take the next tensor and hash it in order. On the cuda backend each
 * of those threads reads its tensor back through two pinned buffers of its
 * own on a stream of its own: one chunk is copied while the one before is
 * hashed, from SUM_HOLD_MS after the commit. On the host backends the
 * slab is read where it is, at once.
 *
 * A version being checksummed is pinned (one count on its leases). When it
 * stops being current (a newer version, an unload) its read-back is
 * dropped: nobody new will lease it, and a trainer that publishes faster
 * than the checksums come in must not pile up versions that only the
 * checker holds. It stays `pending`, and is checksummed again if a
 * rollback makes it current. */
#include "publish.h"

#include "alloc.h"
#include "clock.h"
#include "log.h"
#include "share.h"
#include "xxh.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Threads hashing one version, and the bytes each reads back at a time
 * (twice: two buffers). Four reach the host link's speed on the test
 * machine's PCIe 5 (see bench/RESULTS.md); more only take cores from the
 * workers. */
#define SUM_THREADS 4
#define SUM_CHUNK   (16u << 20)

/* A device version's read-back waits this long after its commit: in the
 * first milliseconds the followers import and map the new slab, and a
 * read-back on the copy engines then made their mappings slower (on the
 * H200, with eight followers of a 4 GiB model: mapping 1.24 ms median and
 * up to 7.7 ms with it, 0.9-1.0 ms and at most 1.6 ms held back by 40 ms;
 * bench/RESULTS.md, "The read-back held back"). */
#define SUM_HOLD_MS 40

/* Pinned (cudaHostAlloc) read-back buffers: made only on the cuda
 * backend, the host backend hashes in place. */
struct wb_sum_pool {
    void *buf[SUM_THREADS][2];
};

void wb__publish_sum_pool_free(wb_sum_pool **pp)
{
    wb_sum_pool *p = pp ? *pp : NULL;
    if (!p)
        return;
    for (unsigned t = 0; t < SUM_THREADS; t++) {
        for (unsigned k = 0; k < 2; k++) {
#ifdef WB_HAVE_CUDA
            if (p->buf[t][k])
                cudaFreeHost(p->buf[t][k]);
#endif
        }
    }
    free(p);
    *pp = NULL;
}

typedef struct sum_run {
    wb_load_job *job;
    const wb_model_data *d;
    const uint8_t *host; /* the slab's bytes (host backends), else NULL */
    atomic_size_t next;  /* the next tensor to take */
    atomic_int failed;
    pthread_mutex_t mu; /* guards err */
    wb_err err;
    int rc;
} sum_run;

static int stopped(const sum_run *s)
{
    return atomic_load(&s->job->cancel) || atomic_load(&s->failed);
}

static void fail(sum_run *s, int rc, const wb_err *err)
{
    pthread_mutex_lock(&s->mu);
    if (s->rc == WB_OK) {
        s->rc = rc;
        s->err = *err;
    }
    pthread_mutex_unlock(&s->mu);
    atomic_store(&s->failed, 1);
}

/* The host: the slab's bytes hashed in place, a chunk at a time so that a
 * cancel is seen. */
static int hash_host(sum_run *s, const wb_model_tensor *t, XXH3_state_t *st)
{
    for (uint64_t at = 0; at < t->nbytes; at += SUM_CHUNK) {
        if (stopped(s))
            return WB_ESTATE;
        size_t n = t->nbytes - at < SUM_CHUNK ? (size_t)(t->nbytes - at) : SUM_CHUNK;
        XXH3_64bits_update(st, s->host + t->offset + at, n);
    }
    return WB_OK;
}

#ifdef WB_HAVE_CUDA
typedef struct sum_dev {
    cudaStream_t stream;
    cudaEvent_t ev[2];
    void *buf[2];
} sum_dev;

static cudaError_t queue_chunk(const sum_run *s, sum_dev *dv, const wb_model_tensor *t, uint64_t at,
                               unsigned k)
{
    size_t n = t->nbytes - at < SUM_CHUNK ? (size_t)(t->nbytes - at) : SUM_CHUNK;
    cudaError_t e = cudaMemcpyAsync(dv->buf[k], (const uint8_t *)s->job->sum_ptr + t->offset + at,
                                    n, cudaMemcpyDeviceToHost, dv->stream);
    return e == cudaSuccess ? cudaEventRecord(dv->ev[k], dv->stream) : e;
}

/* The device: chunk c hashed while chunk c + 1 is copied. Whatever
 * happens, nothing is left queued into the buffers when it returns. */
static int hash_dev(sum_run *s, sum_dev *dv, const wb_model_tensor *t, XXH3_state_t *st,
                    wb_err *err)
{
    int rc = WB_OK;
    cudaError_t e = t->nbytes ? queue_chunk(s, dv, t, 0, 0) : cudaSuccess;
    unsigned c = 0;
    for (uint64_t at = 0; e == cudaSuccess && at < t->nbytes; at += SUM_CHUNK, c++) {
        uint64_t next = at + SUM_CHUNK;
        if (next < t->nbytes && !stopped(s))
            e = queue_chunk(s, dv, t, next, (c + 1) & 1);
        cudaError_t w = cudaEventSynchronize(dv->ev[c & 1]);
        if (e == cudaSuccess)
            e = w;
        if (e != cudaSuccess)
            break;
        if (stopped(s)) {
            rc = WB_ESTATE;
            break;
        }
        size_t n = t->nbytes - at < SUM_CHUNK ? (size_t)(t->nbytes - at) : SUM_CHUNK;
        XXH3_64bits_update(st, dv->buf[c & 1], n);
    }
    cudaError_t w = cudaStreamSynchronize(dv->stream);
    if (e == cudaSuccess)
        e = w;
    if (e != cudaSuccess)
        return wb__publish_cuda_fail(err, e, "reading back for the checksum", t->name);
    return rc;
}
#endif

typedef struct sum_thread {
    sum_run *s;
    unsigned index;
    pthread_t th;
    int started;
} sum_thread;

static void *sum_main(void *arg)
{
    sum_thread *me = arg;
    sum_run *s = me->s;
    wb_err err;
    wb__err_clear(&err);
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        wb__err_set(&err, WB_ENOMEM, "out of memory for a checksum state");
        fail(s, WB_ENOMEM, &err);
        return NULL;
    }
#ifdef WB_HAVE_CUDA
    sum_dev dv = {0};
    if (!s->host) {
        wb_sum_pool *pool = s->job->sum_pool;
        dv.buf[0] = pool->buf[me->index][0];
        dv.buf[1] = pool->buf[me->index][1];
        cudaError_t e = cudaSetDevice(s->job->sum_device);
        if (e == cudaSuccess &&
            (e = cudaStreamCreateWithFlags(&dv.stream, cudaStreamNonBlocking)) != cudaSuccess)
            dv.stream = NULL;
        for (unsigned k = 0; k < 2 && e == cudaSuccess; k++) {
            if ((e = cudaEventCreateWithFlags(&dv.ev[k], cudaEventDisableTiming)) != cudaSuccess)
                dv.ev[k] = NULL;
        }
        if (e != cudaSuccess) {
            wb__publish_cuda_fail(&err, e, "creating a stream for the checksums", NULL);
            fail(s, WB_EIO, &err);
        }
    }
#endif
    for (;;) {
        size_t i = atomic_fetch_add(&s->next, 1);
        if (i >= s->d->n_tensors || stopped(s))
            break;
        const wb_model_tensor *t = &s->d->tensors[i];
        if (t->slab) {
            /* Borrowed from the version it was kept from: known. */
            s->job->sum_xxh3[i] = t->xxh3;
            continue;
        }
        XXH3_64bits_reset(st);
        int rc;
#ifdef WB_HAVE_CUDA
        rc = s->host ? hash_host(s, t, st) : hash_dev(s, &dv, t, st, &err);
#else
        rc = hash_host(s, t, st);
#endif
        if (rc == WB_ESTATE)
            break;
        if (rc != WB_OK) {
            fail(s, rc, &err);
            break;
        }
        s->job->sum_xxh3[i] = XXH3_64bits_digest(st);
    }
    XXH3_freeState(st);
#ifdef WB_HAVE_CUDA
    for (unsigned k = 0; k < 2; k++) {
        if (dv.ev[k])
            cudaEventDestroy(dv.ev[k]);
    }
    if (dv.stream)
        cudaStreamDestroy(dv.stream);
#endif
    return NULL;
}

#ifdef WB_HAVE_CUDA
/* The pinned buffers, made at the first read-back and kept by the broker
 * (cudaHostAlloc of 128 MiB takes tens of milliseconds). */
static int pool_get(wb_load_job *job, wb_err *err)
{
    wb_sum_pool *p = *job->sum_pool_slot;
    if (!p) {
        if (!(p = wb__calloc(1, sizeof *p)))
            return wb__err_set(err, WB_ENOMEM, "out of memory for the checksums' buffers");
        *job->sum_pool_slot = p;
    }
    for (unsigned t = 0; t < SUM_THREADS; t++) {
        for (unsigned k = 0; k < 2; k++) {
            if (p->buf[t][k])
                continue;
            cudaError_t e = cudaHostAlloc(&p->buf[t][k], SUM_CHUNK, cudaHostAllocPortable);
            if (e != cudaSuccess) {
                p->buf[t][k] = NULL;
                return wb__publish_cuda_fail(err, e, "allocating pinned memory for the checksums",
                                             NULL);
            }
        }
    }
    job->sum_pool = p;
    return WB_OK;
}
#endif

static unsigned sum_threads(size_t tensors)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned n = SUM_THREADS;
    if (cpus > 0 && (unsigned long)cpus < n)
        n = (unsigned)cpus;
    if (tensors < n)
        n = tensors ? (unsigned)tensors : 1;
    return n;
}

/* Waits out the hold of a device version's read-back (SUM_HOLD_MS after
 * its commit), or until it is dropped. */
static void hold(wb_load_job *job)
{
    if (job->sum_host)
        return;
    double until = job->sum_queued_at + SUM_HOLD_MS / 1e3;
    while (!atomic_load(&job->cancel) && wb__clock_mono_s() < until) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

void wb__publish_checksum_run(wb_load_job *job)
{
    wb__err_clear(&job->err);
    hold(job);
    double t0 = wb__clock_mono_s();
    const wb_model_data *d = &job->sum_model->data;
    sum_run s = {.job = job, .d = d, .rc = WB_OK};
    atomic_init(&s.next, 0);
    atomic_init(&s.failed, 0);
    pthread_mutex_init(&s.mu, NULL);
    wb__err_clear(&s.err);
    int rc = WB_OK;
    if (job->sum_host) {
        s.host = job->sum_ptr;
    } else {
#ifdef WB_HAVE_CUDA
        rc = pool_get(job, &job->err);
#else
        rc = wb__err_set(&job->err, WB_ENOSYS, "this build has no CUDA");
#endif
    }
    sum_thread th[SUM_THREADS];
    unsigned n = rc == WB_OK ? sum_threads(d->n_tensors) : 0;
    memset(th, 0, sizeof th);
    for (unsigned i = 0; i < n; i++) {
        th[i].s = &s;
        th[i].index = i;
        /* The first runs here when no thread can start. */
        th[i].started = i > 0 && pthread_create(&th[i].th, NULL, sum_main, &th[i]) == 0;
    }
    if (n)
        sum_main(&th[0]);
    for (unsigned i = 1; i < n; i++) {
        if (th[i].started)
            pthread_join(th[i].th, NULL);
    }
    pthread_mutex_destroy(&s.mu);
    if (rc == WB_OK && s.rc != WB_OK) {
        rc = s.rc;
        job->err = s.err;
    }
    if (rc == WB_OK && atomic_load(&job->cancel))
        rc = wb__err_set(&job->err, WB_ESTATE, "the checksums of '%s' version %u were dropped",
                         job->name, job->sum_model->version);
    job->rc = rc;
    job->sum_seconds = wb__clock_mono_s() - t0;
}

void wb__publish_checksums_queue(wb_broker *b, wb_model *m)
{
    char q[300];
    wb__log_quote(q, sizeof q, m->name);
    const wb_backend *be = m->backend;
    uint32_t k0 = 0;
    int host = be->proto == WBPROTO__BACKEND__BACKEND_HOST;
    while (!host && k0 < m->data.n_slabs && !m->data.slabs[k0].dev_ptr)
        k0++;
    const void *src = NULL;
    if (host && m->data.n_slabs)
        src = be->slab_dest(&m->data.slabs[0], 0, m->data.slabs[0].size);
    else if (k0 < m->data.n_slabs)
        src = m->data.slabs[k0].dev_ptr;
    wb_load_job *j =
        src || !m->data.n_tensors
            ? wb__load_job_new(m->name, "", be, host ? -1 : m->data.slabs[k0].device, NULL, 0, 0)
            : NULL;
    uint64_t *sums = j ? wb__calloc(m->data.n_tensors ? m->data.n_tensors : 1, sizeof *sums) : NULL;
    if (!sums) {
        wb__load_job_free(&j);
        m->checksums_state = WB_CHECKSUMS_FAILED;
        wb_warn("publish_checksums", "model=%s version=%u state=failed error=%s", q, m->version,
                src ? "\"out of memory starting the checksums\""
                    : "\"the version's bytes cannot be read\"");
        return;
    }
    j->kind = WB_JOB_CHECKSUM;
    j->sum_model = m;
    j->sum_host = host;
    j->sum_device = host ? -1 : m->data.slabs[k0].device;
    j->sum_ptr = src;
    j->sum_queued_at = wb__clock_mono_s();
    j->sum_xxh3 = sums;
    j->sum_pool_slot = &b->sum_pool;
    m->leases++;
    m->sum_job = j;
    wb_info("publish_checksums", "model=%s version=%u tensors=%zu state=pending", q, m->version,
            m->data.n_tensors);
    if (b->checker) {
        wb__loader_submit(b->checker, j);
        return;
    }
    wb__publish_checksum_run(j);
    wb__publish_checksums_done(b, j);
    wb__load_job_free(&j);
}

void wb__publish_checksums_drop(wb_broker *b, wb_model *m)
{
    wb_load_job *j = m->sum_job;
    if (!j || j->cancelled)
        return;
    j->cancelled = 1;
    if (b->checker)
        wb__loader_cancel(b->checker, j);
    else
        atomic_store(&j->cancel, 1);
}

void wb__publish_checksums_done(wb_broker *b, wb_load_job *job)
{
    wb_model *m = job->sum_model;
    char q[300], qe[WB_ERR_MSG_MAX + 64];
    wb__log_quote(q, sizeof q, m->name);
    m->sum_job = NULL;
    wb_err err = job->err;
    int rc = job->rc;
    if (rc == WB_OK) {
        for (size_t i = 0; i < m->data.n_tensors; i++)
            m->data.tensors[i].xxh3 = job->sum_xxh3[i];
        m->checksums_state = WB_CHECKSUMS_READY;
        rc = wb__model_rewire(m, &err);
        if (rc != WB_OK)
            m->checksums_state = WB_CHECKSUMS_PENDING;
        /* Known checksums: later loads may share its tensors (share.h). */
        if (rc == WB_OK && b->share && !m->no_share && !m->data.holds &&
            strcmp(wb__backend_access(m->backend), "ro") == 0)
            wb__share_register(b->share, m->backend, &m->data);
        if (rc == WB_OK)
            wb_info("publish_checksums",
                    "model=%s version=%u tensors=%zu state=ready seconds=%.3f gbps=%.2f", q,
                    m->version, m->data.n_tensors, job->sum_seconds,
                    job->sum_seconds > 0 ? (double)m->data.bytes / job->sum_seconds / 1e9 : 0.0);
    } else if (job->cancelled) {
        /* Dropped: the version is no longer current. */
        const wb_model *cur = wb__models_current(&b->models, m->name);
        wb_info("publish_checksums", "model=%s version=%u state=dropped current=%u", q, m->version,
                cur ? cur->version : 0);
    } else {
        m->checksums_state = WB_CHECKSUMS_FAILED;
    }
    if (rc != WB_OK && !job->cancelled)
        wb_warn("publish_checksums", "model=%s version=%u state=%s status=%s error=%s", q,
                m->version, m->checksums_state == WB_CHECKSUMS_FAILED ? "failed" : "pending",
                wb_status_name(rc), wb__log_quote(qe, sizeof qe, err.msg));
    /* Unpinned: a version no longer current goes at its last lease. */
    if (m->leases)
        m->leases--;
    if (m->leases == 0 && m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
        wb__broker_free_model(b, m);
}
