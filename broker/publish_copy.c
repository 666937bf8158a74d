/* A commit's copy (publish.h), on the loader thread: the producer's
 * memory opened read-only (a memfd mapped, or a CUDA IPC handle opened),
 * read once into the new version's slabs, and closed; the tensors a
 * partial publish keeps copied from the current version's slabs; every
 * tensor checksummed. Then, on the loop, the version made current as a
 * rollout's is. */
#include "publish.h"

#include "alloc.h"
#include "clock.h"
#include "log.h"
#include "ops_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <xxhash.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* The copy into a host slab (the host backend): each memfd mapped
 * read-only once, each tensor copied and checksummed. */
static int copy_host(wb_load_job *job, wb_publish *p, wb_err *err)
{
    const wb_backend *be = job->backend;
    wb_model_data *d = &job->data;
    wb_slab *slab = &d->slabs[0];
    const uint8_t **maps = wb__calloc(p->n_sources ? p->n_sources : 1, sizeof *maps);
    if (!maps)
        return wb__err_set(err, WB_ENOMEM, "out of memory mapping %u sources", p->n_sources);
    int rc = WB_OK;
    for (unsigned i = 0; rc == WB_OK && i < p->n_sources; i++) {
        if (p->sources[i].size == 0)
            continue;
        void *m =
            mmap(NULL, (size_t)p->sources[i].size, PROT_READ, MAP_SHARED, p->sources[i].fd, 0);
        if (m == MAP_FAILED)
            rc = wb__err_errno(err, WB_EIO, errno, "mapping source %u (%llu bytes) read-only", i,
                               (unsigned long long)p->sources[i].size);
        else
            maps[i] = m;
    }
    const uint8_t *kept = NULL;
    if (rc == WB_OK && p->keep) {
        kept = be->slab_dest(&p->keep->data.slabs[0], 0, p->keep->data.slabs[0].size);
        if (!kept)
            rc = wb__err_set(err, WB_EINTERNAL, "version %u's slab cannot be read", p->beside);
    }
    uint8_t *dst = rc == WB_OK ? be->slab_dest(slab, 0, slab->size) : NULL;
    if (rc == WB_OK && !dst && d->n_tensors)
        rc =
            wb__err_set(err, WB_EINTERNAL, "backend %s gave no host memory to copy into", be->name);
    for (size_t i = 0; rc == WB_OK && i < d->n_tensors; i++) {
        wb_model_tensor *t = &d->tensors[i];
        const wb_publish_piece *pc = &p->pieces[i];
        if (be->slab_prepare && (rc = be->slab_prepare(slab, t->offset, t->nbytes, err)) != WB_OK)
            break;
        const uint8_t *src =
            pc->kept ? kept + p->keep->data.tensors[i].offset : maps[pc->source] + pc->offset;
        if (t->nbytes)
            memcpy(dst + t->offset, src, (size_t)t->nbytes);
        t->xxh3 = XXH3_64bits(dst + t->offset, (size_t)t->nbytes);
        if (pc->kept)
            job->kept_bytes += t->nbytes;
        else
            job->copied_bytes += t->nbytes;
    }
    for (unsigned i = 0; i < p->n_sources; i++) {
        if (maps[i])
            munmap((void *)maps[i], (size_t)p->sources[i].size);
    }
    free(maps);
    return rc;
}

#ifdef WB_HAVE_CUDA
static int cuda_fail(wb_err *err, cudaError_t e, const char *what, const char *tensor)
{
    if (tensor)
        return wb__err_set(err, WB_EIO, "%s for tensor '%s': %s", what, tensor,
                           cudaGetErrorString(e));
    return wb__err_set(err, WB_EIO, "%s: %s", what, cudaGetErrorString(e));
}

/* The copy into device slabs: each distinct IPC handle opened once on the
 * device it names (peer access enabled lazily), every tensor copied device
 * to device (peer to peer when the slab's copy is on another device) on
 * the slab's device's own non-blocking stream, one event and a wait at the
 * end, the handles closed; then every tensor read back through pinned
 * memory and checksummed. */
static int copy_cuda(wb_load_job *job, wb_publish *p, wb_err *err)
{
    wb_model_data *d = &job->data;
    void **ptrs = wb__calloc(p->n_sources ? p->n_sources : 1, sizeof *ptrs);
    cudaStream_t *streams = wb__calloc(d->n_slabs ? d->n_slabs : 1, sizeof *streams);
    if (!ptrs || !streams) {
        free(ptrs);
        free(streams);
        return wb__err_set(err, WB_ENOMEM, "out of memory opening %u sources", p->n_sources);
    }
    int rc = WB_OK;
    cudaError_t e;
    char what[160];
    for (unsigned i = 0; rc == WB_OK && i < p->n_sources; i++) {
        unsigned first = i;
        for (unsigned j = 0; j < i; j++) {
            if (memcmp(p->sources[j].handle, p->sources[i].handle, sizeof p->sources[i].handle) ==
                0)
                first = j;
        }
        if (first != i) {
            ptrs[i] = ptrs[first];
            continue;
        }
        cudaIpcMemHandle_t h;
        memcpy(&h, p->sources[i].handle, sizeof h);
        if ((e = cudaSetDevice(p->sources[i].device)) != cudaSuccess ||
            (e = cudaIpcOpenMemHandle(&ptrs[i], h, cudaIpcMemLazyEnablePeerAccess)) !=
                cudaSuccess) {
            snprintf(what, sizeof what, "opening source %u (a CUDA IPC handle on %s)", i,
                     p->sources[i].uuid);
            rc = cuda_fail(err, e, what, NULL);
            ptrs[i] = NULL;
        }
    }
    for (uint32_t k = 0; rc == WB_OK && k < d->n_slabs; k++) {
        if (!d->slabs[k].dev_ptr)
            continue;
        if ((e = cudaSetDevice(d->slabs[k].device)) != cudaSuccess ||
            (e = cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking)) != cudaSuccess) {
            streams[k] = NULL;
            rc = cuda_fail(err, e, "creating a copy stream", NULL);
        }
    }
    double t0 = wb__clock_mono_s();
    for (uint32_t k = 0; rc == WB_OK && k < d->n_slabs; k++) {
        wb_slab *slab = &d->slabs[k];
        if (!slab->dev_ptr)
            continue;
        const wb_slab *ks = NULL;
        for (uint32_t c = 0; p->keep && c < p->keep->data.n_slabs; c++) {
            if (p->keep->data.slabs[c].device == slab->device && p->keep->data.slabs[c].dev_ptr)
                ks = &p->keep->data.slabs[c];
        }
        cudaSetDevice(slab->device);
        for (size_t i = 0; rc == WB_OK && i < d->n_tensors; i++) {
            const wb_model_tensor *t = &d->tensors[i];
            const wb_publish_piece *pc = &p->pieces[i];
            uint8_t *dst = (uint8_t *)slab->dev_ptr + t->offset;
            if (t->nbytes == 0)
                continue;
            if (pc->kept) {
                if (!ks) {
                    rc = wb__err_set(err, WB_ESTATE,
                                     "tensor '%s': version %u has no copy on device %d to keep",
                                     t->name, p->beside, slab->device);
                    break;
                }
                e = cudaMemcpyAsync(dst,
                                    (const uint8_t *)ks->dev_ptr + p->keep->data.tensors[i].offset,
                                    (size_t)t->nbytes, cudaMemcpyDeviceToDevice, streams[k]);
                if (k == 0)
                    job->kept_bytes += t->nbytes;
            } else {
                const wb_publish_source *s = &p->sources[pc->source];
                const uint8_t *src = (const uint8_t *)ptrs[pc->source] + pc->offset;
                if (s->device == slab->device)
                    e = cudaMemcpyAsync(dst, src, (size_t)t->nbytes, cudaMemcpyDeviceToDevice,
                                        streams[k]);
                else
                    e = cudaMemcpyPeerAsync(dst, slab->device, src, s->device, (size_t)t->nbytes,
                                            streams[k]);
                if (k == 0)
                    job->copied_bytes += t->nbytes;
            }
            if (e != cudaSuccess)
                rc = cuda_fail(err, e, "queueing the copy", t->name);
        }
    }
    /* One event per stream and a wait at the end; waited for even after a
     * failure, so that no copy reads a handle closed below. */
    for (uint32_t k = 0; k < d->n_slabs; k++) {
        if (!streams[k])
            continue;
        cudaSetDevice(d->slabs[k].device);
        cudaEvent_t ev;
        if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) == cudaSuccess) {
            if ((e = cudaEventRecord(ev, streams[k])) == cudaSuccess)
                e = cudaEventSynchronize(ev);
            cudaEventDestroy(ev);
        }
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(streams[k]);
        if (e != cudaSuccess && rc == WB_OK)
            rc = cuda_fail(err, e, "copying the producer's bytes", NULL);
    }
    job->copy_seconds = wb__clock_mono_s() - t0;
    for (unsigned i = 0; i < p->n_sources; i++) {
        int first = 1;
        for (unsigned j = 0; j < i; j++)
            first &= ptrs[j] != ptrs[i];
        if (ptrs[i] && first) {
            cudaSetDevice(p->sources[i].device);
            cudaIpcCloseMemHandle(ptrs[i]);
        }
    }
    free(ptrs);
    /* The checksums come after the version is current (a checksum job):
     * reading 4 GiB back takes a tenth of a second, the copy a few ms. */
    if (rc == WB_OK)
        job->checksums_pending = 1;
    for (uint32_t k = 0; k < d->n_slabs; k++) {
        if (streams[k]) {
            cudaSetDevice(d->slabs[k].device);
            cudaStreamDestroy(streams[k]);
        }
    }
    free(streams);
    return rc;
}

/* Every tensor of one copy read back once through a pinned buffer, and its
 * XXH3 into job->sum_xxh3. */
static int checksum_cuda(wb_load_job *job, wb_err *err)
{
    const wb_model_data *d = &job->sum_model->data;
    size_t chunk = 64u << 20;
    void *pinned = NULL;
    cudaStream_t stream = NULL;
    cudaError_t e;
    int rc = WB_OK;
    if ((e = cudaSetDevice(job->sum_device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
        stream = NULL;
        return cuda_fail(err, e, "creating a stream for the checksums", NULL);
    }
    if ((e = cudaHostAlloc(&pinned, chunk, cudaHostAllocDefault)) != cudaSuccess) {
        pinned = NULL;
        rc = cuda_fail(err, e, "allocating pinned memory for the checksums", NULL);
    }
    XXH3_state_t *st = rc == WB_OK ? XXH3_createState() : NULL;
    if (rc == WB_OK && !st)
        rc = wb__err_set(err, WB_ENOMEM, "out of memory for a checksum state");
    for (size_t i = 0; rc == WB_OK && i < d->n_tensors; i++) {
        const wb_model_tensor *t = &d->tensors[i];
        XXH3_64bits_reset(st);
        for (uint64_t at = 0; rc == WB_OK && at < t->nbytes; at += chunk) {
            size_t n = t->nbytes - at < chunk ? (size_t)(t->nbytes - at) : chunk;
            e = cudaMemcpyAsync(pinned, (const uint8_t *)job->sum_ptr + t->offset + at, n,
                                cudaMemcpyDeviceToHost, stream);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(stream);
            if (e != cudaSuccess)
                rc = cuda_fail(err, e, "reading back for the checksum", t->name);
            else
                XXH3_64bits_update(st, pinned, n);
        }
        job->sum_xxh3[i] = XXH3_64bits_digest(st);
    }
    if (st)
        XXH3_freeState(st);
    if (pinned)
        cudaFreeHost(pinned);
    cudaStreamDestroy(stream);
    return rc;
}
#endif

void wb__publish_checksum_run(wb_load_job *job)
{
    wb__err_clear(&job->err);
    double t0 = wb__clock_mono_s();
#ifdef WB_HAVE_CUDA
    job->rc = checksum_cuda(job, &job->err);
#else
    job->rc = wb__err_set(&job->err, WB_ENOSYS, "this build has no CUDA");
#endif
    job->sum_seconds = wb__clock_mono_s() - t0;
}

/* A published version's checksums read back after it became current: it
 * is pinned (one count on its leases) until they are in. */
static void queue_checksums(wb_broker *b, wb_model *m)
{
    char q[300];
    wb__log_quote(q, sizeof q, m->name);
    uint32_t k0 = 0;
    while (k0 < m->data.n_slabs && !m->data.slabs[k0].dev_ptr)
        k0++;
    wb_load_job *j = k0 < m->data.n_slabs ? wb__load_job_new(m->name, "", m->backend,
                                                             m->data.slabs[k0].device, NULL, 0, 0)
                                          : NULL;
    uint64_t *sums = j ? wb__calloc(m->data.n_tensors ? m->data.n_tensors : 1, sizeof *sums) : NULL;
    if (!sums) {
        wb__load_job_free(&j);
        m->checksums_state = WB_CHECKSUMS_FAILED;
        wb_warn("publish_checksums", "model=%s version=%u state=failed error=%s", q, m->version,
                "out of memory starting the checksums");
        return;
    }
    j->kind = WB_JOB_CHECKSUM;
    j->sum_model = m;
    j->sum_device = m->data.slabs[k0].device;
    j->sum_ptr = m->data.slabs[k0].dev_ptr;
    j->sum_xxh3 = sums;
    m->leases++;
    wb_info("publish_checksums", "model=%s version=%u tensors=%zu state=pending", q, m->version,
            m->data.n_tensors);
    if (b->loader) {
        wb__loader_submit(b->loader, j);
        return;
    }
    wb__publish_checksum_run(j);
    wb__publish_checksums_done(b, j);
    wb__load_job_free(&j);
}

void wb__publish_checksums_done(wb_broker *b, wb_load_job *job)
{
    wb_model *m = job->sum_model;
    char q[300], qe[WB_ERR_MSG_MAX + 64];
    wb__log_quote(q, sizeof q, m->name);
    wb_err err = job->err;
    int rc = job->rc;
    if (rc == WB_OK) {
        for (size_t i = 0; i < m->data.n_tensors; i++)
            m->data.tensors[i].xxh3 = job->sum_xxh3[i];
        m->checksums_state = WB_CHECKSUMS_READY;
        rc = wb__model_rewire(m, &err);
        if (rc != WB_OK)
            m->checksums_state = WB_CHECKSUMS_PENDING;
    }
    if (rc == WB_OK) {
        wb_info("publish_checksums", "model=%s version=%u tensors=%zu state=ready seconds=%.3f", q,
                m->version, m->data.n_tensors, job->sum_seconds);
    } else {
        if (job->rc != WB_OK)
            m->checksums_state = WB_CHECKSUMS_FAILED;
        wb_warn("publish_checksums", "model=%s version=%u state=%s status=%s error=%s", q,
                m->version, m->checksums_state == WB_CHECKSUMS_FAILED ? "failed" : "pending",
                wb_status_name(rc), wb__log_quote(qe, sizeof qe, err.msg));
    }
    /* Unpinned: a version no longer current goes at its last lease. */
    if (m->leases)
        m->leases--;
    if (m->leases == 0 && m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
        wb__broker_free_model(b, m);
}

void wb__publish_copy_run(wb_load_job *job)
{
    wb_publish *p = job->publish;
    const wb_backend *be = job->backend;
    wb__err_clear(&job->err);
    double t0 = wb__clock_mono_s();
    if (be->proto == WBPROTO__BACKEND__BACKEND_HOST) {
        job->rc = copy_host(job, p, &job->err);
        job->copy_seconds = wb__clock_mono_s() - t0;
    } else {
#ifdef WB_HAVE_CUDA
        job->rc = copy_cuda(job, p, &job->err);
#else
        job->rc = wb__err_set(&job->err, WB_ENOSYS, "this build has no CUDA");
#endif
    }
    /* Immutable before any lease: sealed as a load's slabs are. */
    for (uint32_t k = 0; job->rc == WB_OK && k < job->data.n_slabs; k++) {
        if (be->slab_seal && job->data.copies[k].state == WBPROTO__MODEL_STATE__MODEL_READY)
            job->rc = be->slab_seal(&job->data.slabs[k], &job->err);
    }
    job->data.load_seconds = wb__clock_mono_s() - t0;
    job->data.load_gbps =
        job->data.load_seconds > 0 ? (double)job->data.bytes / job->data.load_seconds / 1e9 : 0;
}

/* The current version a partial publish kept bytes from is let go. */
static void let_go(wb_broker *b, wb_publish *p)
{
    wb_model *k = p->keep;
    p->keep = NULL;
    if (!k)
        return;
    if (k->leases)
        k->leases--;
    if (k->leases == 0 && k->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
        wb__broker_free_model(b, k);
}

void wb__publish_copy_done(wb_broker *b, wb_load_job *job, wb_ops_reply *r)
{
    wb_publish *p = job->publish;
    char q[300], qe[WB_ERR_MSG_MAX + 64];
    r->msg.version = WB_PROTOCOL_VERSION;
    r->msg.id = job->request_id;
    let_go(b, p);
    wb__log_quote(q, sizeof q, p->name);
    wb_model *m = p->model;
    int rc = job->rc;
    wb_err err = job->err;
    if (rc == WB_OK && (p->cancelled || !m))
        rc = wb__err_set(&err, WB_ESTATE,
                         "the publish of model '%s' was cancelled: the model was unloaded while "
                         "its bytes were copied",
                         p->name);
    if (rc == WB_OK) {
        job->data.open_seconds = 0;
        m->checksums_state = job->checksums_pending ? WB_CHECKSUMS_PENDING : WB_CHECKSUMS_READY;
        rc = wb__model_adopt(m, &job->data, &err);
    }
    if (rc == WB_OK)
        rc = wb__limits_check_lease_size(&b->limits, m->name, m->wire_lease_size, &err);
    if (rc != WB_OK) {
        b->stats.publishes_failed++;
        wb_warn("publish_failed", "model=%s version=%u current=%u status=%s error=%s", q,
                p->version, p->beside, wb_status_name(rc), wb__log_quote(qe, sizeof qe, err.msg));
        /* The version never serves: its record goes, with what it adopted. */
        wb__publish_release(b, p);
        wb__ops_error(r, job->request_id, rc, err.msg);
        return;
    }
    if (b->slab_gid >= 0)
        wb__broker_share_slabs(b, m);
    double secs = job->copy_seconds;
    uint64_t copied = job->copied_bytes, kept = job->kept_bytes;
    b->stats.publishes_total++;
    b->stats.publish_bytes_total += copied;
    b->stats.publish_copy_seconds += secs;
    wb_info("publish_commit",
            "model=%s version=%u previous=%u bytes=%llu kept_bytes=%llu copy_seconds=%.6f "
            "gbps=%.3f pid=%u uid=%u",
            q, m->version, p->beside, (unsigned long long)copied, (unsigned long long)kept, secs,
            secs > 0 ? (double)(copied + kept) / secs / 1e9 : 0.0, p->creds.pid, p->creds.uid);
    if (m->checksums_state == WB_CHECKSUMS_READY)
        wb_info("publish_checksums", "model=%s version=%u tensors=%zu state=ready", q, m->version,
                m->data.n_tensors);
    uint32_t previous = wb__broker_make_current(b, m);
    /* The publish is over; its record is the model's now. */
    p->model = NULL;
    wb__publish_release(b, p);
    Wbproto__PublishCommitReply *cr = wb__arena_alloc(&r->arena, sizeof *cr);
    Wbproto__ModelInfo *mi = wb__ops_model_info(m, WBPROTO__MODEL_STATE__MODEL_READY, &r->arena);
    if (!cr || !mi) {
        wb__ops_fail(r, WB_ENOMEM,
                     "model '%s' version %u is published and current, but out of memory "
                     "building the reply",
                     m->name, m->version);
        return;
    }
    wbproto__publish_commit_reply__init(cr);
    mi->current = 1;
    cr->model = mi;
    cr->previous_version = previous;
    cr->current_at = b->now_wall();
    cr->copy_seconds = secs;
    cr->copied_bytes = copied;
    cr->kept_bytes = kept;
    r->msg.body_case = WBPROTO__REPLY__BODY_PUBLISH_COMMIT;
    r->msg.publish_commit = cr;
    /* After the reply is made: the version is current, its checksums come. */
    if (m->checksums_state == WB_CHECKSUMS_PENDING)
        queue_checksums(b, m);
}
