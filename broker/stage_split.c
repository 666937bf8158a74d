/* The split mode (stage.h): a staged load whose last tensors, about
 * cfg.mapped_share percent of the bytes, are copied straight from their
 * registered file mappings on the side engine, in a thread of their own,
 * while the staging ring carries the rest. Each part is a whole load of its
 * own (wb__stage_run), so each keeps that function's promises: on return
 * nothing of either part runs any more. */
#include "stage_impl.h"

#include <pthread.h>

typedef struct side_run {
    wb_stage_job job;
    wb_stage_stats st;
    wb_err err;
    int rc;
} side_run;

static void *side_main(void *arg)
{
    side_run *s = arg;
    s->rc = wb__stage_run(&s->job, &s->st, &s->err);
    return NULL;
}

/* The first tensor of the mapped tail: the tail's bytes come as close to
 * share percent of the whole as whole tensors allow. */
static size_t split_at(const wb_stage_job *j, unsigned share)
{
    uint64_t total = 0;
    for (size_t i = 0; i < j->n_tensors; i++)
        total += j->tensors[i].nbytes;
    uint64_t want = total / 100 * share + total % 100 * share / 100, got = 0;
    size_t k = j->n_tensors;
    while (k > 0 && got < want) {
        uint64_t next = got + j->tensors[k - 1].nbytes;
        /* Stop short when taking this tensor overshoots by more than not
         * taking it falls short. */
        if (next > want && next - want > want - got)
            break;
        got = next;
        k--;
    }
    return k;
}

int wb__stage_run_split(wb_stage_job *job, wb_stage_stats *st, wb_err *err)
{
    double t0 = now_s();
    const wb_stage_config *cfg = &job->cfg;
    size_t k = split_at(job, cfg->mapped_share);
    /* The hashers of the tail take their share of the threads. */
    unsigned threads = cfg->read_threads;
    unsigned hashers = (threads * cfg->mapped_share + 50) / 100;
    if (hashers < 1)
        hashers = 1;
    unsigned readers = threads > hashers ? threads - hashers : 1;

    wb_stage_job head = *job;
    head.n_tensors = k;
    head.cfg.read_threads = readers;
    head.cfg.mapped_share = 0;
    head.side_engine = NULL;

    side_run side = {.job = *job};
    side.job.mode = WB_STAGE_MAPPED;
    side.job.tensors = job->tensors + k;
    side.job.n_tensors = job->n_tensors - k;
    side.job.staging = NULL;
    side.job.engine = job->side_engine;
    side.job.dst = job->side_dst ? job->side_dst : job->dst;
    side.job.side_engine = NULL;
    side.job.side_dst = NULL;
    side.job.cfg.read_threads = hashers;
    side.job.cfg.mapped_share = 0;
    if (side.job.cfg.register_threads == 0)
        side.job.cfg.register_threads = 1;

    pthread_t tid;
    int threaded = side.job.n_tensors && pthread_create(&tid, NULL, side_main, &side) == 0;
    wb_err head_err = {0};
    int rc = wb__stage_run(&head, st, &head_err);
    if (threaded)
        pthread_join(tid, NULL);
    else if (side.job.n_tensors)
        side_main(&side); /* no thread to be had: one part after the other */
    else
        side.rc = WB_OK;

    double copy = st->copy_seconds;
    st->mode = WB_STAGE_STAGED;
    st->bytes += side.st.bytes;
    st->threads += side.st.threads;
    st->hash_busy += side.st.hash_busy;
    st->register_seconds = side.st.register_seconds;
    st->mapped_bytes = side.st.bytes;
    st->mapped_seconds = side.st.seconds;
    st->copy_seconds = side.st.copy_seconds > copy ? side.st.copy_seconds : copy;
    st->seconds = now_s() - t0;
    if (rc != WB_OK) {
        *err = head_err;
        return rc;
    }
    if (side.rc != WB_OK) {
        *err = side.err;
        return side.rc;
    }
    return WB_OK;
}
