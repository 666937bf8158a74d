/* The copier of a staged load: hands each filled staging buffer to the copy
 * engine and frees it when its copy is done. */
#include "stage_impl.h"

#include "alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

/* How long the copier sleeps when copies are in flight but none finished
 * and no buffer is waiting; short next to one buffer's copy time. */
#define COPIER_NAP_NS 20000

static void nap(ctx *c)
{
    struct timespec ts = wb__clock_mono_deadline(COPIER_NAP_NS);
    pthread_cond_timedwait(&c->copier_cv, &c->mu, &ts);
}

/* Calls the job's before_copy, while the readers fill the ring; 1 when the
 * copies may start. */
static int ready_to_copy(ctx *c)
{
    wb_stage_job *j = c->job;
    wb_err err;
    int rc = j->before_copy ? j->before_copy(j->before_copy_ctx, j, &err) : WB_OK;
    if (rc == WB_OK && j->before_copy)
        rc = wb__stage_ring_ready(j->staging, &err);
    if (rc != WB_OK)
        wb__stage_fail(c, rc, &err);
    return rc == WB_OK;
}

void wb__stage_run_copier(ctx *c, wb_stage_stats *st)
{
    int ready = ready_to_copy(c);
    wb_staging *sg = c->job->staging;
    wb_copy_engine *e = &sg->engine;
    unsigned n = sg->n;
    unsigned *inflight = wb__malloc(n * sizeof *inflight);
    unsigned *batch = wb__malloc(n * sizeof *batch);
    wb_copy cps[WB_STAGE_MAX_BATCH];
    unsigned hold = c->job->cfg.copy_batch;
    if (hold < 1 || hold > WB_STAGE_MAX_BATCH)
        hold = hold ? WB_STAGE_MAX_BATCH : 1;
    st->copy_calls = 0;
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
        wb__stage_fail(c, WB_ENOMEM, &err);
    } else if (ready && e->begin && e->begin(e->ctx, &err) != WB_OK) {
        wb__stage_fail(c, err.code ? err.code : WB_EIO, &err);
    }

    pthread_mutex_lock(&c->mu);
    for (;;) {
        /* Filled buffers wait for a batch's worth unless the engine is about
         * to run dry or no more are coming. */
        unsigned m = 0;
        int all_read = c->readers_done == c->n_readers;
        if (c->fill_count &&
            (c->fill_count >= hold || in_count < 2 * hold || all_read || stopped(c))) {
            while (c->fill_count && batch) {
                batch[m++] = c->fill_q[c->fill_head];
                c->fill_head = (c->fill_head + 1) % n;
                c->fill_count--;
            }
        }
        if (m == 0 && in_count == 0 && (c->fill_count == 0 || !batch)) {
            if (all_read)
                break;
            pthread_cond_wait(&c->copier_cv, &c->mu);
            continue;
        }
        pthread_mutex_unlock(&c->mu);

        for (unsigned i = 0; i < m;) {
            if (stopped(c)) {
                wb__stage_release_buffer(c, batch[i++]);
                continue;
            }
            if (!started) {
                started = 1;
                first = wb__clock_mono_s();
                st->first_copy_at = first - c->t_start;
            }
            unsigned k = 0;
            for (; k < WB_STAGE_MAX_BATCH && i + k < m; k++) {
                unsigned b = batch[i + k];
                const chunk *ch = c->buf_chunk[b];
                cps[k] = (wb_copy){.buf = (int)b,
                                   .src = sg->bufs[b],
                                   .dst = (uint8_t *)c->job->dst + ch->slab_off,
                                   .len = (size_t)ch->span};
            }
            st->copy_calls++;
            int rc = wb__copy_submit_many(e, cps, k, &err);
            if (rc != WB_OK)
                wb__stage_fail(c, rc, &err);
            /* A failed batch's buffers go in flight too: the failure stops
             * the load, and they are freed after the engine's finish. */
            for (unsigned q = 0; q < k; q++) {
                inflight[(in_head + in_count) % n] = (unsigned)cps[q].buf;
                in_count++;
            }
            i += k;
        }
        /* Copies on one stream end in the order they were queued. */
        int progressed = 0;
        while (in_count) {
            unsigned b = inflight[in_head];
            int q = stopped(c) ? 0 : e->query(e->ctx, (int)b, &err);
            if (q < 0) {
                wb__stage_fail(c, q, &err);
                break;
            }
            if (q == 0)
                break;
            in_head = (in_head + 1) % n;
            in_count--;
            add_landed(c, c->buf_chunk[b]->bytes);
            last = wb__clock_mono_s();
            wb__stage_release_buffer(c, b);
            progressed = 1;
        }
        if (stopped(c) && in_count) {
            /* Nothing may be freed or refilled under a running copy. */
            double ignored;
            e->finish(e->ctx, &ignored, &err);
            while (in_count) {
                wb__stage_release_buffer(c, inflight[in_head]);
                in_head = (in_head + 1) % n;
                in_count--;
            }
        }
        pthread_mutex_lock(&c->mu);
        if (!progressed && in_count &&
            (c->fill_count == 0 ||
             (c->fill_count < hold && in_count >= 2 * hold && c->readers_done < c->n_readers)))
            nap(c);
    }
    pthread_mutex_unlock(&c->mu);
    if (started) {
        double dev = -1;
        int rc = e->finish(e->ctx, &dev, &err);
        if (rc != WB_OK && !stopped(c))
            wb__stage_fail(c, rc, &err);
        st->copy_seconds = dev >= 0 ? dev : last - first;
    }
    if (slack > 0)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    free(inflight);
    free(batch);
}
