#include "broker.h"

#include "log.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int64_t wb__clock_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double wb__clock_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void wb__broker_init(wb_broker *b, const wb_broker_config *cfg)
{
    memset(b, 0, sizeof *b);
    b->cfg = *cfg;
    if (!b->cfg.backend)
        b->cfg.backend = &wb__backend_host;
    if (b->cfg.heartbeat_ms == 0)
        b->cfg.heartbeat_ms = WB_DEFAULT_HEARTBEAT_MS;
    if (b->cfg.stale_ms == 0)
        b->cfg.stale_ms = WB_DEFAULT_STALE_MS;
    wb__leases_init(&b->leases);
    b->euid = (uint32_t)geteuid();
    b->pid = (uint32_t)getpid();
    b->now_ms = wb__clock_mono_ms;
    b->now_wall = wb__clock_wall;
    b->started_ms = b->now_ms();
}

void wb__broker_destroy(wb_broker *b)
{
    wb__leases_destroy(&b->leases);
    wb__models_clear(&b->models);
}

void wb__broker_free_model(wb_broker *b, wb_model *m)
{
    char q[300];
    wb_info("model_freed", "model=%s bytes=%llu", wb__log_quote(q, sizeof q, m->name),
            (unsigned long long)m->data.bytes);
    wb__models_remove(&b->models, m);
    wb__model_free(&m);
}

int wb__broker_lease_ended(wb_broker *b, wb_model *m)
{
    if (m->leases > 0)
        m->leases--;
    if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING && m->leases == 0) {
        wb__broker_free_model(b, m);
        return WBPROTO__MODEL_STATE__MODEL_FREED;
    }
    return m->state;
}

static void on_reclaim(wb_lease_rec *l, void *arg)
{
    wb_broker *b = arg;
    char hex[9], q[300];
    wb_info("lease_reclaim", "reason=process_exit lease=%s model=%s pid=%u comm=%s",
            wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, l->model->name), l->pid,
            l->comm);
    b->stats.leases_reclaimed++;
    /* Only count here: freeing a model waits until the lease table has
     * finished walking this pid's leases. */
    if (l->model->leases > 0)
        l->model->leases--;
}

size_t wb__broker_reclaim_pid(wb_broker *b, uint32_t pid)
{
    size_t n = wb__leases_reclaim_pid(&b->leases, pid, on_reclaim, b);
    wb_model *m = b->models.head;
    while (m) {
        wb_model *next = m->next;
        if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING && m->leases == 0)
            wb__broker_free_model(b, m);
        m = next;
    }
    return n;
}

static void on_stale(wb_lease_rec *l, void *arg)
{
    wb_broker *b = arg;
    char hex[9], q[300];
    wb_warn("lease_stale", "lease=%s model=%s pid=%u comm=%s silent_ms=%lld",
            wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, l->model->name), l->pid,
            l->comm, (long long)(b->now_ms() - l->last_beat_ms));
}

size_t wb__broker_scan_stale(wb_broker *b)
{
    return wb__leases_mark_stale(&b->leases, b->now_ms(), b->cfg.stale_ms, on_stale, b);
}

int wb__broker_finish_load(wb_broker *b, wb_load_job *job, wb_model **model)
{
    char q[300], qe[WB_ERR_MSG_MAX + 64];
    *model = NULL;
    wb_model *m = wb__models_find(&b->models, job->name);
    if (!m || m->state != WBPROTO__MODEL_STATE__MODEL_LOADING) {
        /* Cannot happen: a loading model can be neither unloaded nor
         * replaced. Keep the broker consistent anyway. */
        if (job->rc == WB_OK)
            job->rc = wb__err_set(&job->err, WB_EINTERNAL,
                                  "model '%s' left the registry while it was loading", job->name);
        return job->rc;
    }
    b->stats.loads_total++;
    if (job->rc == WB_OK) {
        job->rc = wb__model_adopt(m, &job->data, &job->err);
    }
    if (job->rc != WB_OK) {
        b->stats.loads_failed++;
        wb_warn("model_load_failed", "model=%s status=%s error=%s",
                wb__log_quote(q, sizeof q, job->name), wb_status_name(job->rc),
                wb__log_quote(qe, sizeof qe, job->err.msg));
        wb__models_remove(&b->models, m);
        wb__model_free(&m);
        return job->rc;
    }
    b->stats.load_bytes_total += m->data.bytes;
    b->stats.load_seconds_total += m->data.load_seconds;
    wb_info("model_ready",
            "model=%s tensors=%zu bytes=%llu slab_bytes=%llu seconds=%.3f gbps=%.3f backend=%s "
            "open_seconds=%.3f alloc_seconds=%.3f read_seconds=%.3f read_threads=%u",
            wb__log_quote(q, sizeof q, m->name), m->data.n_tensors,
            (unsigned long long)m->data.bytes, (unsigned long long)m->data.slab_bytes,
            m->data.load_seconds, m->data.load_gbps, m->backend->name, m->data.open_seconds,
            m->data.alloc_seconds, m->data.read_seconds, m->data.read_threads);
    *model = m;
    return WB_OK;
}

int wb__broker_preload(wb_broker *b, const char *name, const char *path, wb_err *err)
{
    char q[300], qp[WB_PATH_MAX + 64];
    if (wb__models_find(&b->models, name))
        return wb__err_set(err, WB_EEXIST, "a model named '%s' already exists", name);
    wb_model *m = wb__model_new(name, path, b->cfg.backend, b->cfg.device);
    wb_load_job *job = wb__load_job_new(name, path, b->cfg.backend, b->cfg.device, NULL, 0, 0);
    if (!m || !job) {
        wb__model_free(&m);
        wb__load_job_free(&job);
        return wb__err_set(err, WB_ENOMEM, "out of memory loading '%s'", name);
    }
    wb__models_add(&b->models, m);
    wb_info("model_load_start", "model=%s path=%s backend=%s", wb__log_quote(q, sizeof q, name),
            wb__log_quote(qp, sizeof qp, path), b->cfg.backend->name);
    job->rc = wb__load(path, job->backend, job->device, NULL, &job->data, &job->err);
    wb_model *ready;
    int rc = wb__broker_finish_load(b, job, &ready);
    if (rc != WB_OK)
        wb__err_set(err, rc, "%s", job->err.msg);
    wb__load_job_free(&job);
    return rc;
}
