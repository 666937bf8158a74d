/* What a load did, for the log (event=load_stage), wbctl models and wbctl
 * stats (loader.h). */
#include "loader.h"

#include "log.h"

#include <stdatomic.h>

void wb__load_log_stages(const char *model, const wb_model_data *d)
{
    char q[300];
    const wb_stage_stats *s = &d->stage;
    wb__log_quote(q, sizeof q, model);
    unsigned long long b = (unsigned long long)s->bytes;
    unsigned long long chunk = (unsigned long long)s->chunk_bytes;
    const char *mode = wb__stage_mode_name(s->mode);
    if (s->mode != WB_STAGE_MAPPED)
        wb_info("load_stage",
                "model=%s stage=read bytes=%llu seconds=%.4f gbps=%.2f busy_seconds=%.4f "
                "threads=%u chunk_bytes=%llu chunks=%llu mode=%s",
                q, b, s->threads ? s->read_busy / s->threads : 0.0,
                wb__stage_gbps(s->bytes, s->read_busy, s->threads), s->read_busy, s->threads, chunk,
                (unsigned long long)s->chunks, mode);
    else
        wb_info("load_stage", "model=%s stage=register bytes=%llu seconds=%.4f gbps=%.2f mode=%s",
                q, b, d->register_seconds,
                d->register_seconds > 0 ? (double)s->bytes / d->register_seconds / 1e9 : 0.0, mode);
    wb_info("load_stage",
            "model=%s stage=hash bytes=%llu seconds=%.4f gbps=%.2f busy_seconds=%.4f threads=%u "
            "mode=%s",
            q, b, s->threads ? s->hash_busy / s->threads : 0.0,
            wb__stage_gbps(s->bytes, s->hash_busy, s->threads), s->hash_busy, s->threads, mode);
    if (s->mode != WB_STAGE_DIRECT)
        wb_info("load_stage",
                "model=%s stage=copy bytes=%llu seconds=%.4f gbps=%.2f staging_bytes=%llu "
                "buffers=%u copy_calls=%llu wait_seconds=%.4f plan_seconds=%.5f "
                "readers_started_seconds=%.5f first_fill_seconds=%.5f first_copy_seconds=%.5f "
                "mode=%s",
                q, b, s->copy_seconds,
                s->copy_seconds > 0 ? (double)s->bytes / s->copy_seconds / 1e9 : 0.0,
                (unsigned long long)s->chunk_bytes * s->buffers, s->buffers,
                (unsigned long long)s->copy_calls, s->wait_busy, s->plan_at, s->readers_at,
                s->first_fill_at, s->first_copy_at, mode);
    wb_info("load_stage",
            "model=%s stage=total bytes=%llu seconds=%.4f gbps=%.2f open_seconds=%.4f "
            "headers_remembered=%u alloc_seconds=%.4f pipeline_seconds=%.4f seal_seconds=%.4f "
            "mode=%s",
            q, b, d->load_seconds, d->load_gbps, d->open_seconds, d->headers_remembered,
            d->alloc_seconds, s->seconds, d->seal_seconds, mode);
}

void wb__load_fill_model_info(const wb_model *m, Wbproto__ModelInfo *mi)
{
    if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING) {
        if (m->job) {
            mi->bytes = atomic_load(&m->job->progress.total);
            mi->loaded_bytes = atomic_load(&m->job->progress.landed);
        }
        return;
    }
    /* A failed load's record has no figures. */
    if (m->state == WBPROTO__MODEL_STATE__MODEL_FAILED)
        return;
    const wb_model_data *d = &m->data;
    const wb_stage_stats *s = &d->stage;
    mi->loaded_bytes = d->bytes;
    mi->load_mode = (char *)wb__stage_mode_name(s->mode ? s->mode : WB_STAGE_DIRECT);
    mi->read_threads = s->threads;
    if (s->mode == WB_STAGE_STAGED) {
        mi->staging_buffer_bytes = s->chunk_bytes;
        mi->staging_buffers = s->buffers;
    }
    if (s->threads) {
        mi->read_seconds = s->read_busy / s->threads;
        mi->hash_seconds = s->hash_busy / s->threads;
    }
    mi->read_gbps = wb__stage_gbps(s->bytes, s->read_busy, s->threads);
    mi->hash_gbps = wb__stage_gbps(s->bytes, s->hash_busy, s->threads);
    if (s->copy_seconds > 0) {
        mi->copy_seconds = s->copy_seconds;
        mi->copy_gbps = (double)s->bytes / s->copy_seconds / 1e9;
    }
    mi->wait_seconds = s->wait_busy;
    mi->open_seconds = d->open_seconds;
    mi->alloc_seconds = d->alloc_seconds;
    mi->register_seconds = d->register_seconds;
    mi->seal_seconds = d->seal_seconds;
    mi->first_copy_seconds = s->first_copy_at;
}

void wb__load_fill_stats(const wb_backend *be, const wb_model_registry *models,
                         Wbproto__StatsReply *s)
{
    wb_stage_config cfg = be->stage;
    wb__stage_config_fill(&cfg);
    s->read_threads = cfg.read_threads;
    if (be->staging) {
        s->staging_buffers = be->staging->n;
        s->staging_bytes = be->staging->size * be->staging->n;
    }
    for (const wb_model *m = models->head; m; m = m->next) {
        if (m->state != WBPROTO__MODEL_STATE__MODEL_LOADING)
            continue;
        s->loads_in_progress++;
        if (!m->job)
            continue;
        s->loading_bytes += atomic_load(&m->job->progress.landed);
        s->loading_total_bytes += atomic_load(&m->job->progress.total);
    }
}
