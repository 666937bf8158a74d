/* A commit's copy (publish.h), on the loader thread: the producer's
 * memory opened read-only (a memfd mapped here, or CUDA IPC handles in
 * publish_cuda.c), read once into the new version's slabs; the tensors a
 * partial publish keeps copied from the current version's slabs. Then, on
 * the loop, the version made current as a rollout's is, and its checksums
 * computed on the checker (publish_sum.c). */
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

/* The copy into a host slab (the host backend): each memfd mapped
 * read-only once, each tensor copied. */
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
        if (t->slab) {
            /* Kept by borrowing the version's bytes (share.h): no copy. */
            job->kept_bytes += t->nbytes;
            continue;
        }
        if (be->slab_prepare && (rc = be->slab_prepare(slab, t->offset, t->nbytes, err)) != WB_OK)
            break;
        const uint8_t *src = maps[pc->source] + pc->offset;
        if (pc->kept) {
            /* Where the kept tensor lives: the version's slab or one it
             * borrows (share.h). */
            const wb_model_tensor *kt = &p->keep->data.tensors[i];
            wb_slab ks;
            wb__model_tensor_slab(&p->keep->data, 0, kt, &ks);
            const uint8_t *kb = kt->slab ? be->slab_dest(&ks, 0, ks.size) : kept;
            if (!kb) {
                rc = wb__err_set(err, WB_EINTERNAL, "tensor '%s': version %u's slab cannot be read",
                                 t->name, p->beside);
                break;
            }
            src = kb + kt->offset;
        }
        if (t->nbytes)
            memcpy(dst + t->offset, src, (size_t)t->nbytes);
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
        job->rc = wb__publish_copy_cuda(job, p, &job->err);
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
    char q[300], qe[WB_ERR_MSG_MAX + 64], qd[200];
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
        /* Computed once the version is current (publish_sum.c), on every
         * backend: the workers swap without waiting for them. */
        m->checksums_state = WB_CHECKSUMS_PENDING;
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
            "gbps=%.3f gpu_seconds=%.6f device_gpu_seconds=%s open_seconds=%.6f "
            "sources_opened=%u sources_cached=%u pid=%u uid=%u",
            q, m->version, p->beside, (unsigned long long)copied, (unsigned long long)kept, secs,
            secs > 0 ? (double)(copied + kept) / secs / 1e9 : 0.0, job->copy_gpu_seconds,
            wb__log_quote(qd, sizeof qd, job->copy_devices), job->src_open_seconds,
            job->sources_opened, job->sources_reused, p->creds.pid, p->creds.uid);
    if (job->sources_opened || job->sources_reused) {
        b->src_cache_owner = p->owner;
        b->src_cache_pid = p->creds.pid;
        if (p->owner_gone)
            wb__publish_forget(b, p->owner, 0);
    }
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
}
