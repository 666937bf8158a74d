/* The host tier's moves, restores and reloads (tier.h): queued by the loop,
 * run on the tier thread, ended by the loop. The thread only touches what
 * the job carries (copies of the slabs it reads, the host copy, the slabs
 * it makes); the model stays the loop's, pinned by one count on its leases
 * while the job runs. */
#include "tier.h"

#include "alloc.h"
#include "broker.h"
#include "clock.h"
#include "log.h"
#include "share.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int wb__tier_submit(wb_broker *b, wb_model *m, int op, void *spare, wb_err *err)
{
    wb_load_job *job =
        wb__load_job_new(m->name, m->path ? m->path : "", b->cfg.backend, m->device, NULL, 0, 0);
    if (!job)
        return wb__err_set(err, WB_ENOMEM, "out of memory");
    job->kind = WB_JOB_TIER;
    job->tier_op = op;
    job->tier_model = m;
    job->version = m->version;
    uint32_t n = m->data.n_copies;
    if (op == WB_TIER_OP_RELOAD) {
        int devs[WB_GPU_MAX];
        unsigned nd = m->n_devices;
        memcpy(devs, m->devices, nd * sizeof devs[0]);
        job->no_share = m->no_share;
        wb__broker_set_devices(b, m, job, devs, nd);
        job->budget = NULL; /* its room was made by the loop */
        /* Judged as its load was: the path, and the requester's access to
         * every file (a preload's by nobody). */
        wb__broker_check_job(b, NULL, job);
        job->access = m->access;
    } else {
        job->tier_slabs = wb__calloc(n ? n : 1, sizeof *job->tier_slabs);
        if (!job->tier_slabs) {
            wb__load_job_free(&job);
            return wb__err_set(err, WB_ENOMEM, "out of memory");
        }
        job->tier_n = n;
        job->tier_bytes = m->host_bytes;
        job->tier_slab_size = m->tier_slab_bytes;
        if (op == WB_TIER_OP_MOVE) {
            /* The job reads the first copy's slab back (every copy is the
             * same bytes) and frees them all on the tier thread, so that
             * a restore queued after it finds the memory free (the loop
             * only forgets them). The model keeps them until then. */
            uint32_t ns = m->data.n_slabs;
            free(job->tier_slabs);
            job->tier_slabs = wb__calloc(ns ? ns : 1, sizeof *job->tier_slabs);
            job->tier_holds =
                m->data.holds ? wb__calloc(ns ? ns : 1, sizeof *job->tier_holds) : NULL;
            if (!job->tier_slabs || (m->data.holds && !job->tier_holds)) {
                wb__load_job_free(&job);
                return wb__err_set(err, WB_ENOMEM, "out of memory");
            }
            for (uint32_t k = 0; k < ns; k++) {
                job->tier_slabs[k] = m->data.slabs[k];
                if (job->tier_holds)
                    job->tier_holds[k] = m->data.holds[k];
            }
            job->tier_n = ns;
            job->tier_host = spare;
        } else {
            job->tier_host = m->host_copy;
            for (uint32_t k = 0; k < n; k++)
                job->tier_slabs[k].device =
                    m->data.copies[k].state == WBPROTO__MODEL_STATE__MODEL_READY
                        ? m->data.copies[k].device
                        : -2;
        }
    }
    m->tier_job = job;
    m->leases++;
    if (b->tier) {
        wb__loader_submit(b->tier, job);
        return WB_OK;
    }
    wb__load_job_run(job, NULL);
    wb__tier_done(b, job);
    return WB_OK;
}

/* Fills a new slab from host memory: written in place where the backend
 * maps it, else through slab_write; sealed as the loader seals. */
static int fill(const wb_backend *be, wb_slab *s, const void *src, uint64_t len, wb_err *err)
{
    int rc = WB_OK;
    void *dst = be->slab_dest ? be->slab_dest(s, 0, len) : NULL;
    if (dst) {
        if (be->slab_prepare && (rc = be->slab_prepare(s, 0, len, err)) != WB_OK)
            return rc;
        memcpy(dst, src, (size_t)len);
    } else if (be->slab_write) {
        if ((rc = be->slab_write(s, 0, src, len, err)) != WB_OK)
            return rc;
    } else {
        return wb__err_set(err, WB_ENOSYS, "the %s backend cannot restore a slab", be->name);
    }
    return be->slab_seal ? be->slab_seal(s, err) : WB_OK;
}

int wb__tier_test_delay_ms;

void wb__tier_job_run(wb_load_job *job)
{
    const wb_backend *be = job->backend;
    wb__err_clear(&job->err);
    if (wb__tier_test_delay_ms > 0) {
        struct timespec ts = {wb__tier_test_delay_ms / 1000,
                              (long)(wb__tier_test_delay_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    double t0 = wb__clock_mono_s();
    job->rc = WB_OK;
    if (job->tier_op == WB_TIER_OP_MOVE) {
        void *host = job->tier_host;
        if (!host)
            job->rc = be->host_alloc(be, job->tier_bytes, &host, &job->err);
        const wb_slab *src = NULL;
        for (uint32_t k = 0; k < job->tier_n && !src; k++)
            if (job->tier_slabs[k].size)
                src = &job->tier_slabs[k];
        if (job->rc == WB_OK && job->tier_bytes) {
            if (!be->slab_read || !src)
                job->rc = wb__err_set(&job->err, WB_ENOSYS,
                                      "the %s backend cannot read a slab back", be->name);
            else
                job->rc = be->slab_read(src, 0, host, job->tier_bytes, &job->err);
        }
        /* Copied: the slabs go (one another model borrowed meanwhile stays
         * with it). */
        for (uint32_t k = 0; job->rc == WB_OK && k < job->tier_n; k++) {
            if (!job->tier_slabs[k].size)
                continue;
            wb_share_hold *h = job->tier_holds ? job->tier_holds[k] : NULL;
            if (!h || wb__share_release_owner(h, &job->tier_slabs[k]))
                be->slab_free(&job->tier_slabs[k]);
        }
        if (job->rc != WB_OK && host) {
            be->host_free(be, host, job->tier_bytes);
            host = NULL;
        }
        job->tier_host = host;
    } else {
        for (uint32_t k = 0; k < job->tier_n && job->rc == WB_OK; k++) {
            int device = job->tier_slabs[k].device;
            if (device == -2) {
                memset(&job->tier_slabs[k], 0, sizeof job->tier_slabs[k]);
                continue;
            }
            job->rc = be->slab_alloc(&job->tier_slabs[k], device, job->tier_slab_size, &job->err);
            if (job->rc == WB_OK) {
                double c0 = wb__clock_mono_s();
                job->rc = fill(be, &job->tier_slabs[k], job->tier_host, job->tier_bytes, &job->err);
                job->copy_seconds += wb__clock_mono_s() - c0;
            } else
                memset(&job->tier_slabs[k], 0, sizeof job->tier_slabs[k]);
        }
        /* A failed restore's slabs go with the job (wb__tier_job_release). */
    }
    job->tier_seconds = wb__clock_mono_s() - t0;
    job->tier_ran = 1;
}

void wb__tier_job_release(wb_load_job *job)
{
    const wb_backend *be = job->backend;
    for (uint32_t k = 0; job->tier_op == WB_TIER_OP_RESTORE && k < job->tier_n; k++) {
        if (job->tier_slabs[k].size)
            be->slab_free(&job->tier_slabs[k]);
        memset(&job->tier_slabs[k], 0, sizeof job->tier_slabs[k]);
    }
    /* A move's host copy is the job's; a restore's is the model's. */
    if (job->tier_op == WB_TIER_OP_MOVE && job->tier_host)
        be->host_free(be, job->tier_host, job->tier_bytes);
    job->tier_host = NULL;
}

/* A reload's tensors must be the ones its load had: same names, dtypes,
 * shapes and checksums (the files changed otherwise). */
static int same_tensors(const wb_model_data *was, const wb_model_data *now, wb_err *err)
{
    if (was->n_tensors != now->n_tensors)
        return wb__err_set(err, WB_EIO, "its files now have %zu tensors, %zu when it was loaded",
                           now->n_tensors, was->n_tensors);
    for (size_t i = 0; i < was->n_tensors; i++) {
        const wb_model_tensor *a = &was->tensors[i], *c = &now->tensors[i];
        if (strcmp(a->name, c->name) != 0 || strcmp(a->dtype, c->dtype) != 0 ||
            a->ndim != c->ndim ||
            (a->ndim && memcmp(a->shape, c->shape, a->ndim * sizeof *a->shape) != 0) ||
            a->nbytes != c->nbytes)
            return wb__err_set(
                err, WB_EIO, "tensor '%s' in its files is not the one it was loaded with", a->name);
        if (a->xxh3 != c->xxh3)
            return wb__err_set(err, WB_EIO,
                               "tensor '%s' changed in its files since it was loaded (checksum "
                               "%016llx, was %016llx)",
                               a->name, (unsigned long long)c->xxh3, (unsigned long long)a->xxh3);
    }
    return WB_OK;
}

/* The restore's slabs become the model's (copies that were ready only). */
static void install(wb_broker *b, wb_model *m, wb_load_job *job)
{
    wb_model_data *d = &m->data;
    d->slab_bytes = 0;
    for (uint32_t k = 0; k < d->n_slabs && k < job->tier_n; k++) {
        d->slabs[k] = job->tier_slabs[k];
        memset(&job->tier_slabs[k], 0, sizeof job->tier_slabs[k]);
        d->slab_bytes += d->slabs[k].size;
    }
    free(d->holds);
    d->holds = NULL;
    if (m->registered && b->share)
        wb__share_register(b->share, b->cfg.backend, d);
}

static void log_back(const wb_model *m, const wb_load_job *job, const char *how)
{
    char q[300];
    /* copy_seconds: the restore's copies alone, without the allocation. */
    wb_info("model_tier",
            "model=%s version=%u tier=device from=%s bytes=%llu seconds=%.4f gbps=%.2f "
            "copy_seconds=%.4f",
            wb__log_quote(q, sizeof q, m->name), m->version, how,
            (unsigned long long)job->tier_bytes, job->tier_seconds, m->restore_gbps,
            job->copy_seconds);
}

void wb__tier_done(wb_broker *b, wb_load_job *job)
{
    wb_model *m = job->tier_model;
    const wb_backend *be = b->cfg.backend;
    char q[300], qe[WB_ERR_MSG_MAX + 64];
    m->tier_job = NULL;
    if (m->leases)
        m->leases--;
    int gone = m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING;
    int rc = job->rc;
    wb_err err = job->err;
    if (job->tier_op == WB_TIER_OP_MOVE) {
        if (rc == WB_OK) {
            m->host_copy = job->tier_host;
            job->tier_host = NULL;
            /* Its slabs went with the job. */
            wb__tier_free_slabs(b, m, 1);
            m->tier = WB_TIER_HOST;
            b->stats.moved_to_host++;
            wb_info("model_tier",
                    "model=%s version=%u tier=host reason=moved host_bytes=%llu seconds=%.4f",
                    wb__log_quote(q, sizeof q, m->name), m->version,
                    (unsigned long long)m->host_bytes, job->tier_seconds);
        } else {
            /* Stays on its device. */
            m->host_bytes = 0;
            m->tier = WB_TIER_DEVICE;
            wb_warn("model_tier", "model=%s version=%u tier=device reason=move_failed error=%s",
                    wb__log_quote(q, sizeof q, m->name), m->version,
                    wb__log_quote(qe, sizeof qe, err.msg));
        }
    } else if (job->tier_op == WB_TIER_OP_RESTORE) {
        if (rc == WB_OK && !gone) {
            install(b, m, job);
            /* Without its new wire view no lease may name the new slabs. */
            if ((rc = wb__model_rewire(m, &err)) != WB_OK)
                wb__tier_free_slabs(b, m, 0);
        }
    } else if (rc == WB_OK && !gone) {
        rc = same_tensors(&m->data, &job->data, &err);
        if (rc == WB_OK) {
            wb_model_data old = m->data;
            m->data = job->data;
            memset(&job->data, 0, sizeof job->data);
            wb__model_data_free(&old, be);
            m->tier_slab_bytes = wb__tier_slab_size(&m->data);
            job->tier_bytes = m->data.bytes;
            job->tier_seconds = m->data.load_seconds;
            if ((rc = wb__model_rewire(m, &err)) != WB_OK) {
                m->tier = WB_TIER_DEVICE;
                wb__tier_drop(b, m, "rewire_failed");
            }
        }
    }
    if (job->tier_op != WB_TIER_OP_MOVE && !gone) {
        if (rc == WB_OK) {
            m->tier = WB_TIER_DEVICE;
            m->restores++;
            m->restore_seconds = job->tier_seconds; /* a reload's: its load's */
            uint64_t moved =
                job->tier_bytes * (job->tier_op == WB_TIER_OP_RESTORE ? job->tier_n : 1);
            m->restore_gbps = m->restore_seconds > 0 ? (double)moved / m->restore_seconds / 1e9 : 0;
            m->restore_at = b->now_wall();
            free(m->tier_error);
            m->tier_error = NULL;
            wb__broker_share_slabs(b, m);
            if (job->tier_op == WB_TIER_OP_RESTORE)
                b->stats.restores++;
            else
                b->stats.reloads++;
            log_back(m, job, job->tier_op == WB_TIER_OP_RESTORE ? "host" : "files");
        } else {
            /* Back where it was; the next acquire is told why. */
            m->tier = job->tier_op == WB_TIER_OP_RESTORE ? WB_TIER_HOST : WB_TIER_EVICTED;
            m->tier_rc = rc;
            free(m->tier_error);
            m->tier_error = wb__strdup(err.msg);
            b->stats.restore_failures++;
            wb_warn("model_tier", "model=%s version=%u tier=%s reason=restore_failed error=%s",
                    wb__log_quote(q, sizeof q, m->name), m->version, wb__tier_name(m->tier),
                    wb__log_quote(qe, sizeof qe, err.msg));
        }
    }
    /* What the job still owns: a restore's slabs (failed, or a model
     * unloaded meanwhile), a host copy not taken, a reload's data. */
    wb__tier_job_release(job);
    wb__model_data_free(&job->data, be);
    int wanted = m->tier_wanted;
    m->tier_wanted = 0;
    if (gone) {
        if (m->leases == 0)
            wb__broker_free_model(b, m);
    } else if (wanted && m->tier == WB_TIER_HOST) {
        wb_err e;
        if (wb__tier_wake(b, m, &e) != WB_OK)
            wb_warn("model_tier", "model=%s version=%u tier=host reason=wake_failed error=%s",
                    wb__log_quote(q, sizeof q, m->name), m->version,
                    wb__log_quote(qe, sizeof qe, e.msg));
    }
    wb__tier_refresh(b);
}
