/* The mapped mode: copies straight from the registered file mappings while
 * hasher threads checksum the tensors. */
#include "stage_impl.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct hasher {
    ctx *c;
    pthread_t tid;
    const size_t *order;
    size_t n;
    atomic_size_t *next;
    reader_stats st;
} hasher;

static void *hasher_main(void *arg)
{
    hasher *h = arg;
    wb_stage_job *j = h->c->job;
    while (!stopped(h->c)) {
        size_t k = atomic_fetch_add(h->next, 1);
        if (k >= h->n)
            break;
        wb_stage_tensor *t = &j->tensors[h->order[k]];
        double t0 = now_s();
        t->xxh3 = hash_once(j->maps[t->file] + t->file_offset, t->nbytes);
        h->st.hash += now_s() - t0;
    }
    return NULL;
}

static int by_nbytes_desc(const void *a, const void *b, void *arg)
{
    const wb_stage_tensor *t = arg;
    uint64_t x = t[*(const size_t *)a].nbytes, y = t[*(const size_t *)b].nbytes;
    return x < y ? 1 : x > y ? -1 : 0;
}

int wb__stage_run_mapped(ctx *c, wb_stage_stats *st, wb_err *err)
{
    wb_stage_job *j = c->job;
    wb_copy_engine *e = j->engine;
    size_t n = j->n_tensors;
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    unsigned threads = j->cfg.read_threads;
    hasher *hs = calloc(threads, sizeof *hs);
    if (!order || !hs) {
        free(order);
        free(hs);
        return wb__err_set(err, WB_ENOMEM, "out of memory planning the load");
    }
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof *order, by_nbytes_desc, j->tensors);
    atomic_size_t next;
    atomic_init(&next, 0);
    unsigned started = 0;
    for (unsigned i = 0; i < threads; i++) {
        hs[i] = (hasher){.c = c, .order = order, .n = n, .next = &next};
        if (pthread_create(&hs[i].tid, NULL, hasher_main, &hs[i]) != 0)
            break;
        started++;
    }
    int rc = WB_OK;
    if (started == 0) {
        hasher_main(&hs[0]);
        started = 0;
    }
    /* The copies, in slab order, from the mapping; they overlap the
     * checksums. */
    int submitted = 0;
    double dev = -1;
    if (e->begin && (rc = e->begin(e->ctx, err)) != WB_OK)
        goto join;
    for (size_t i = 0; i < n && rc == WB_OK; i++) {
        const wb_stage_tensor *t = &j->tensors[i];
        for (uint64_t off = 0; off < t->nbytes && rc == WB_OK; off += c->chunk_bytes) {
            uint64_t len = t->nbytes - off < c->chunk_bytes ? t->nbytes - off : c->chunk_bytes;
            rc = e->submit(e->ctx, -1, j->maps[t->file] + t->file_offset + off,
                           (uint8_t *)j->dst + t->slab_offset + off, (size_t)len, err);
            submitted = 1;
        }
        if (j->cancel && atomic_load(j->cancel) && rc == WB_OK)
            rc = wb__err_set(err, WB_ESTATE, "the load was cancelled (the broker is stopping)");
    }
    if (submitted) {
        wb_err ferr;
        int frc = e->finish(e->ctx, &dev, &ferr);
        if (rc == WB_OK && frc != WB_OK) {
            rc = frc;
            *err = ferr;
        }
    }
    st->copy_seconds = dev;
join:
    if (rc != WB_OK) {
        wb_err copy_err = *err;
        wb__stage_fail(c, rc, &copy_err);
    }
    for (unsigned i = 0; i < started; i++) {
        pthread_join(hs[i].tid, NULL);
        st->hash_busy += hs[i].st.hash;
    }
    if (started == 0)
        st->hash_busy += hs[0].st.hash;
    st->threads = started ? started : 1;
    if (rc == WB_OK)
        add_landed(c, st->bytes);
    free(order);
    free(hs);
    return rc;
}
