/* A commit's copy into device slabs (publish.h), on the loader thread.
 *
 * The producer's memory comes as CUDA IPC handles, one per allocation,
 * opened through the source cache (publish_srcs.h): a trainer's next commit
 * finds them open (32 handles cost 1.5 ms to open and 1.4 ms to close on an
 * H200, more than the copy of a GiB). The connection's end or its process's
 * death closes them (a WB_JOB_FORGET job): an importer keeps the producer's
 * allocation alive.
 *
 * The copies are spread over several streams per device (--publish-streams,
 * default 4), each tensor whole on the stream with the fewest bytes queued:
 * one stream's copies run one after another on one copy engine (on an H200
 * with nothing else running, four streams copied 1.04 x as fast as one).
 * The streams and their events are made once per device and kept with the
 * source cache. GPU time (events) is measured beside the wall time, per
 * device. */
#include "publish.h"

#include "alloc.h"
#include "clock.h"
#include "devlist.h"
#include "log.h"
#include "publish_srcs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

/* At most this many streams per device (--publish-streams). */
#define COPY_STREAMS WB_MAX_PUBLISH_STREAMS

int wb__publish_cuda_fail(wb_err *err, int cuda_error, const char *what, const char *tensor)
{
    cudaError_t e = (cudaError_t)cuda_error;
    if (tensor)
        return wb__err_set(err, WB_EIO, "%s for tensor '%s': %s", what, tensor,
                           cudaGetErrorString(e));
    return wb__err_set(err, WB_EIO, "%s: %s", what, cudaGetErrorString(e));
}

/* The source cache's ways to open and close a CUDA IPC handle. */
static int ipc_open(void *ctx, const uint8_t *handle, int device, unsigned index, void **ptr,
                    wb_err *err)
{
    const wb_publish *p = ctx;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaSuccess)
        return WB_OK;
    char what[160];
    snprintf(what, sizeof what, "opening source %u (a CUDA IPC handle on %s)", index,
             p && index < p->n_sources ? p->sources[index].uuid : "?");
    return wb__publish_cuda_fail(err, e, what, NULL);
}

static void ipc_close(void *ctx, void *ptr, int device)
{
    (void)ctx;
    cudaSetDevice(device);
    cudaIpcCloseMemHandle(ptr);
}

typedef struct dev_streams {
    int device;
    cudaStream_t s[COPY_STREAMS];
    cudaEvent_t start[COPY_STREAMS], end[COPY_STREAMS];
    uint64_t queued[COPY_STREAMS];
    unsigned n;
    cudaError_t marked; /* streams_mark's result, for streams_end */
} dev_streams;

/* Each device's streams and events, made by its first commit and kept
 * with the source cache for the next: a commit does not create and
 * destroy streams around a copy of a few milliseconds. */
typedef struct kept_streams {
    dev_streams dev[WB_GPU_MAX];
    unsigned n;
} kept_streams;

static void streams_destroy(dev_streams *ds)
{
    cudaSetDevice(ds->device);
    for (unsigned k = 0; k < ds->n; k++) {
        if (ds->start[k])
            cudaEventDestroy(ds->start[k]);
        if (ds->end[k])
            cudaEventDestroy(ds->end[k]);
        cudaStreamDestroy(ds->s[k]);
    }
    ds->n = 0; /* streams_make starts the next set from nothing */
}

static void kept_free(void *p)
{
    kept_streams *ks = p;
    for (unsigned i = 0; i < ks->n; i++)
        streams_destroy(&ks->dev[i]);
    free(ks);
}

static int streams_make(dev_streams *ds, int device, unsigned n, wb_err *err)
{
    memset(ds, 0, sizeof *ds);
    ds->device = device;
    cudaError_t e = cudaSetDevice(device);
    for (unsigned k = 0; e == cudaSuccess && k < n && k < COPY_STREAMS; k++) {
        if ((e = cudaStreamCreateWithFlags(&ds->s[k], cudaStreamNonBlocking)) != cudaSuccess)
            break;
        ds->n++;
        if ((e = cudaEventCreate(&ds->start[k])) != cudaSuccess) {
            ds->start[k] = NULL;
            break;
        }
        if ((e = cudaEventCreate(&ds->end[k])) != cudaSuccess) {
            ds->end[k] = NULL;
            break;
        }
    }
    if (e == cudaSuccess)
        return WB_OK;
    streams_destroy(ds);
    return wb__publish_cuda_fail(err, e, "creating the copy streams", NULL);
}

/* Device `device`'s kept streams, made now when it has none (or another
 * number of them); nothing queued on them yet. */
static int streams_get(kept_streams *ks, int device, unsigned n, dev_streams **out, wb_err *err)
{
    if (n > COPY_STREAMS)
        n = COPY_STREAMS;
    dev_streams *ds = NULL;
    for (unsigned i = 0; i < ks->n && !ds; i++) {
        if (ks->dev[i].device == device)
            ds = &ks->dev[i];
    }
    if (!ds) {
        if (ks->n == WB_GPU_MAX)
            return wb__err_set(err, WB_ELIMIT, "copy streams on more than %d devices", WB_GPU_MAX);
        ds = &ks->dev[ks->n++]; /* zeroed: no streams yet */
        ds->device = device;
    }
    if (ds->n != n) {
        streams_destroy(ds);
        int rc = streams_make(ds, device, n, err);
        if (rc != WB_OK)
            return rc;
    }
    memset(ds->queued, 0, sizeof ds->queued);
    ds->marked = cudaSuccess;
    *out = ds;
    return WB_OK;
}

/* Records the end event of every stream that has copies, before any
 * stream is waited for: an event recorded after waiting for another
 * stream is queued when this context may have lost its time slice to
 * the other processes on the GPU, and would wait for its next one (a
 * span and a commit longer by that wait). The first failure goes to
 * ds->marked. */
static void streams_mark(dev_streams *ds)
{
    cudaError_t first = cudaSetDevice(ds->device);
    for (unsigned k = 0; first == cudaSuccess && k < ds->n; k++) {
        if (ds->queued[k] && ds->end[k])
            first = cudaEventRecord(ds->end[k], ds->s[k]);
    }
    ds->marked = first;
}

/* Waits for every stream (even after a failure: no copy may read a
 * handle closed after) and adds its GPU span to *gpu: from the first used
 * stream's start to the latest end over the streams used (marked by
 * streams_mark). The streams stay for the next commit, unless they
 * failed. */
static cudaError_t streams_end(dev_streams *ds, double *gpu)
{
    cudaError_t first = ds->marked;
    cudaSetDevice(ds->device);
    int have = -1;
    for (unsigned k = 0; k < ds->n; k++) {
        cudaError_t w = cudaStreamSynchronize(ds->s[k]);
        if (first == cudaSuccess)
            first = w;
        if (ds->queued[k] && ds->start[k] && ds->end[k] && have < 0)
            have = (int)k;
    }
    /* Stream `have` was used first: every end against its start. */
    float span = 0;
    for (unsigned k = 0; first == cudaSuccess && have >= 0 && k < ds->n; k++) {
        float ms = 0;
        if (ds->queued[k] &&
            cudaEventElapsedTime(&ms, ds->start[have], ds->end[k]) == cudaSuccess && ms > span)
            span = ms;
    }
    *gpu += span / 1e3;
    if (first != cudaSuccess)
        streams_destroy(ds);
    return first;
}

/* The stream with the fewest bytes queued; its start event recorded
 * before its first copy. */
static cudaStream_t pick(dev_streams *ds, uint64_t bytes)
{
    unsigned best = 0;
    for (unsigned k = 1; k < ds->n; k++) {
        if (ds->queued[k] < ds->queued[best])
            best = k;
    }
    if (ds->queued[best] == 0 && ds->start[best])
        cudaEventRecord(ds->start[best], ds->s[best]);
    ds->queued[best] += bytes ? bytes : 1;
    return ds->s[best];
}

int wb__publish_copy_cuda(wb_load_job *job, wb_publish *p, wb_err *err)
{
    wb_model_data *d = &job->data;
    wb_src_cache *c = *job->src_cache_slot;
    if (!c) {
        const wb_src_ops ops = {.open = ipc_open, .close = ipc_close, .free_kept = kept_free};
        if (!(c = wb__src_cache_new(&ops)))
            return wb__err_set(err, WB_ENOMEM, "out of memory for the source cache");
        *job->src_cache_slot = c;
    }
    /* Another producer's handles go first. */
    wb__src_cache_begin(c, p->owner);
    void **kept = wb__src_cache_kept(c);
    if (!*kept && !(*kept = wb__calloc(1, sizeof(kept_streams))))
        return wb__err_set(err, WB_ENOMEM, "out of memory for the copy streams");
    void **ptrs = wb__calloc(p->n_sources ? p->n_sources : 1, sizeof *ptrs);
    dev_streams **ds = wb__calloc(d->n_slabs ? d->n_slabs : 1, sizeof *ds);
    if (!ptrs || !ds) {
        free(ptrs);
        free(ds);
        return wb__err_set(err, WB_ENOMEM, "out of memory opening %u sources", p->n_sources);
    }
    int rc = WB_OK;
    double t_open = wb__clock_mono_s();
    uint64_t opened0, found0, opened, found;
    size_t open_now;
    wb__src_cache_counts(c, &opened0, &found0, &open_now);
    /* The ops' context: the commit, for the handles' device names. */
    wb__src_cache_set_ctx(c, p);
    for (unsigned i = 0; rc == WB_OK && i < p->n_sources; i++)
        rc = wb__src_cache_open(c, p->sources[i].handle, p->sources[i].device, i, &ptrs[i], err);
    job->src_open_seconds = wb__clock_mono_s() - t_open;
    wb__src_cache_counts(c, &opened, &found, &open_now);
    job->sources_opened = (uint32_t)(opened - opened0);
    job->sources_reused = (uint32_t)(found - found0);
    for (uint32_t k = 0; rc == WB_OK && k < d->n_slabs; k++) {
        if (d->slabs[k].dev_ptr)
            rc = streams_get(*kept, d->slabs[k].device,
                             job->copy_streams ? job->copy_streams : WB_DEFAULT_PUBLISH_STREAMS,
                             &ds[k], err);
    }
    double t0 = wb__clock_mono_s();
    cudaError_t e = cudaSuccess;
    for (uint32_t k = 0; rc == WB_OK && k < d->n_slabs; k++) {
        wb_slab *slab = &d->slabs[k];
        if (!slab->dev_ptr)
            continue;
        const wb_slab *ks = NULL;
        uint32_t kc = 0;
        for (uint32_t j = 0; p->keep && j < p->keep->data.n_slabs; j++) {
            if (p->keep->data.slabs[j].device == slab->device && p->keep->data.slabs[j].dev_ptr) {
                ks = &p->keep->data.slabs[j];
                kc = j;
            }
        }
        cudaSetDevice(slab->device);
        for (size_t i = 0; rc == WB_OK && i < d->n_tensors; i++) {
            const wb_model_tensor *t = &d->tensors[i];
            const wb_publish_piece *pc = &p->pieces[i];
            uint8_t *dst = (uint8_t *)slab->dev_ptr + t->offset;
            if (t->nbytes == 0)
                continue;
            if (t->slab) {
                /* Kept by borrowing the version's bytes (share.h). */
                if (k == 0)
                    job->kept_bytes += t->nbytes;
                continue;
            }
            if (pc->kept && !ks) {
                rc = wb__err_set(err, WB_ESTATE,
                                 "tensor '%s': version %u has no copy on device %d to keep",
                                 t->name, p->beside, slab->device);
                break;
            }
            cudaStream_t st = pick(ds[k], t->nbytes);
            if (pc->kept) {
                /* The kept tensor's slab: the version's own or one it
                 * borrows (share.h). */
                const wb_model_tensor *kt = &p->keep->data.tensors[i];
                wb_slab kb;
                wb__model_tensor_slab(&p->keep->data, kc, kt, &kb);
                const uint8_t *ksrc = (const uint8_t *)(kt->slab ? kb.dev_ptr : ks->dev_ptr);
                e = ksrc ? cudaMemcpyAsync(dst, ksrc + kt->offset, (size_t)t->nbytes,
                                           cudaMemcpyDeviceToDevice, st)
                         : cudaErrorInvalidValue;
                if (k == 0)
                    job->kept_bytes += t->nbytes;
            } else {
                const wb_publish_source *s = &p->sources[pc->source];
                const uint8_t *src = (const uint8_t *)ptrs[pc->source] + pc->offset;
                if (s->device == slab->device)
                    e = cudaMemcpyAsync(dst, src, (size_t)t->nbytes, cudaMemcpyDeviceToDevice, st);
                else
                    e = cudaMemcpyPeerAsync(dst, slab->device, src, s->device, (size_t)t->nbytes,
                                            st);
                if (k == 0)
                    job->copied_bytes += t->nbytes;
            }
            if (e != cudaSuccess)
                rc = wb__publish_cuda_fail(err, e, "queueing the copy", t->name);
        }
    }
    /* The slowest device's GPU time, and each device's (the log's
     * device_gpu_seconds: a peer copy against a local one). */
    double gpu = 0;
    size_t at = 0;
    job->copy_devices[0] = '\0';
    for (uint32_t k = 0; k < d->n_slabs; k++) {
        if (ds[k] && ds[k]->n)
            streams_mark(ds[k]);
    }
    for (uint32_t k = 0; k < d->n_slabs; k++) {
        if (!ds[k] || !ds[k]->n)
            continue;
        double span = 0;
        int device = ds[k]->device;
        e = streams_end(ds[k], &span);
        if (e != cudaSuccess && rc == WB_OK)
            rc = wb__publish_cuda_fail(err, e, "copying the producer's bytes", NULL);
        if (span > gpu)
            gpu = span;
        int w = snprintf(job->copy_devices + at, sizeof job->copy_devices - at, "%s%d:%.6f",
                         at ? "," : "", device, span);
        if (w > 0 && (size_t)w < sizeof job->copy_devices - at)
            at += (size_t)w;
    }
    job->copy_seconds = wb__clock_mono_s() - t0;
    job->copy_gpu_seconds = gpu;
    /* Handles this commit did not name are closed; after a failure all. */
    wb__src_cache_end(c, rc != WB_OK);
    wb__src_cache_set_ctx(c, NULL);
    free(ptrs);
    free(ds);
    return rc;
}
#endif

void wb__publish_src_cache_free(wb_src_cache **cp)
{
    wb__src_cache_free(cp);
}

void wb__publish_forget_run(wb_load_job *job)
{
    wb_src_cache *c = *job->src_cache_slot;
    job->rc = WB_OK;
    size_t n = c ? wb__src_cache_forget(c, job->forget_owner) : 0;
    if (n)
        wb_info("publish_sources_closed", "handles=%zu reason=producer_gone", n);
}
