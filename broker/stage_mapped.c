/* The mapped mode: copies straight from the registered file mappings while
 * hasher threads checksum the tensors. */
#include "stage_impl.h"

#include "alloc.h"

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
        double t0 = wb__clock_mono_s();
        t->xxh3 = hash_once(j->maps[t->file] + t->file_offset, t->nbytes);
        h->st.hash += wb__clock_mono_s() - t0;
    }
    return NULL;
}

static int by_nbytes_desc(const void *a, const void *b, void *arg)
{
    const wb_stage_tensor *t = arg;
    uint64_t x = t[*(const size_t *)a].nbytes, y = t[*(const size_t *)b].nbytes;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* ---- registration in pieces ----
 * cudaHostRegister of a whole 8 GiB mapping takes a quarter of a second
 * before the first copy can start (measured on the H200 host), and copies
 * then run at 52 GB/s. Here the mappings are cut into pieces that
 * registering threads take in file order while the copier copies from the
 * pieces already registered; copies never span two pieces (each is its
 * own registration). After the last copy the same threads unregister the
 * pieces, in parallel. */

typedef struct piece {
    uint32_t file;
    uint64_t off, len;
    atomic_int state; /* 0 not yet, 1 registered, -1 failed */
} piece;

typedef struct registrar {
    ctx *c;
    piece *pieces;
    size_t n;
    atomic_size_t next, next_un;
    atomic_int copies_done;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a piece was registered or failed; the copies are done */
    double busy;       /* summed seconds in register and unregister */
} registrar;

typedef struct reg_thread {
    registrar *r;
    pthread_t tid;
    double busy;
} reg_thread;

static void *registrar_main(void *arg)
{
    reg_thread *rt = arg;
    registrar *r = rt->r;
    wb_stage_job *j = r->c->job;
    wb_copy_engine *e = j->engine;
    for (;;) {
        size_t k = atomic_fetch_add(&r->next, 1);
        if (k >= r->n)
            break;
        piece *p = &r->pieces[k];
        int ok = 0;
        if (!stopped(r->c)) {
            wb_err err;
            double t0 = wb__clock_mono_s();
            int rc =
                e->host_register(e->ctx, (void *)(j->maps[p->file] + p->off), (size_t)p->len, &err);
            rt->busy += wb__clock_mono_s() - t0;
            if (rc != WB_OK) {
                wb_err e2;
                wb__err_set(&e2, rc, "%s: bytes %llu to %llu: %s", j->files[p->file],
                            (unsigned long long)p->off, (unsigned long long)(p->off + p->len),
                            err.msg);
                wb__stage_fail(r->c, rc, &e2);
            } else {
                ok = 1;
            }
        }
        pthread_mutex_lock(&r->mu);
        atomic_store(&p->state, ok ? 1 : -1);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    /* Unregister once nothing copies any more. */
    pthread_mutex_lock(&r->mu);
    while (!atomic_load(&r->copies_done))
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    for (;;) {
        size_t k = atomic_fetch_add(&r->next_un, 1);
        if (k >= r->n)
            break;
        piece *p = &r->pieces[k];
        /* Every piece has been taken by now; wait for its outcome. */
        pthread_mutex_lock(&r->mu);
        while (atomic_load(&p->state) == 0)
            pthread_cond_wait(&r->cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
        if (atomic_load(&p->state) == 1) {
            double t0 = wb__clock_mono_s();
            e->host_unregister(e->ctx, (void *)(j->maps[p->file] + p->off));
            rt->busy += wb__clock_mono_s() - t0;
        }
    }
    return NULL;
}

/* Waits until piece k is registered: 1, or 0 when it failed. */
static int piece_ready(registrar *r, size_t k)
{
    if (atomic_load(&r->pieces[k].state) == 1)
        return 1;
    pthread_mutex_lock(&r->mu);
    while (atomic_load(&r->pieces[k].state) == 0)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return atomic_load(&r->pieces[k].state) == 1;
}

/* Cuts the mappings into pieces; first_piece[f] is file f's first. */
static int make_pieces(registrar *r, const wb_stage_job *j, size_t *first_piece)
{
    uint64_t piece_bytes = j->cfg.register_piece;
    size_t n = 0;
    for (uint32_t f = 0; f < j->n_files; f++) {
        if (j->maps[f])
            n += (size_t)((j->map_lens[f] + piece_bytes - 1) / piece_bytes);
    }
    r->pieces = wb__calloc(n ? n : 1, sizeof *r->pieces);
    if (!r->pieces)
        return -1;
    for (uint32_t f = 0; f < j->n_files; f++) {
        first_piece[f] = r->n;
        if (!j->maps[f])
            continue;
        for (uint64_t off = 0; off < j->map_lens[f]; off += piece_bytes) {
            piece *p = &r->pieces[r->n++];
            p->file = f;
            p->off = off;
            p->len = j->map_lens[f] - off < piece_bytes ? j->map_lens[f] - off : piece_bytes;
            atomic_init(&p->state, 0);
        }
    }
    return 0;
}

int wb__stage_run_mapped(ctx *c, wb_stage_stats *st, wb_err *err)
{
    wb_stage_job *j = c->job;
    wb_copy_engine *e = j->engine;
    size_t n = j->n_tensors;
    size_t *order = wb__malloc((n ? n : 1) * sizeof *order);
    unsigned threads = j->cfg.read_threads;
    hasher *hs = wb__calloc(threads, sizeof *hs);
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
    unsigned nreg = j->cfg.register_threads && j->map_lens ? j->cfg.register_threads : 0;
    registrar reg = {.c = c};
    reg_thread *rts = NULL;
    unsigned reg_started = 0;
    size_t *first_piece = NULL;
    if (nreg) {
        pthread_mutex_init(&reg.mu, NULL);
        pthread_cond_init(&reg.cv, NULL);
        atomic_init(&reg.next, 0);
        atomic_init(&reg.next_un, 0);
        atomic_init(&reg.copies_done, 0);
        first_piece = wb__calloc(j->n_files ? j->n_files : 1, sizeof *first_piece);
        rts = wb__calloc(nreg, sizeof *rts);
        if (!first_piece || !rts || make_pieces(&reg, j, first_piece) != 0) {
            rc = wb__err_set(err, WB_ENOMEM, "out of memory planning the registration");
            goto join;
        }
        for (unsigned i = 0; i < nreg; i++) {
            rts[i].r = &reg;
            if (pthread_create(&rts[i].tid, NULL, registrar_main, &rts[i]) != 0)
                break;
            reg_started++;
        }
        if (reg_started == 0) {
            rc = wb__err_set(err, WB_ENOMEM, "could not start any registering thread");
            goto join;
        }
    }
    if (e->begin && (rc = e->begin(e->ctx, err)) != WB_OK)
        goto join;
    for (size_t i = 0; i < n && rc == WB_OK; i++) {
        const wb_stage_tensor *t = &j->tensors[i];
        for (uint64_t off = 0; off < t->nbytes && rc == WB_OK;) {
            uint64_t len = t->nbytes - off < c->chunk_bytes ? t->nbytes - off : c->chunk_bytes;
            if (nreg) {
                /* Within one piece, once it is registered. */
                uint64_t piece_bytes = j->cfg.register_piece;
                uint64_t at = t->file_offset + off;
                size_t k = first_piece[t->file] + (size_t)(at / piece_bytes);
                uint64_t room = (k + 1 - first_piece[t->file]) * piece_bytes - at;
                if (len > room)
                    len = room;
                if (!piece_ready(&reg, k)) {
                    pthread_mutex_lock(&c->mu);
                    rc = c->rc ? c->rc : WB_EIO;
                    *err = c->err;
                    pthread_mutex_unlock(&c->mu);
                    break;
                }
            }
            rc = e->submit(e->ctx, -1, j->maps[t->file] + t->file_offset + off,
                           (uint8_t *)j->dst + t->slab_offset + off, (size_t)len, err);
            submitted = 1;
            off += len;
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
    if (nreg) {
        /* Nothing copies any more: the registering threads unregister. */
        pthread_mutex_lock(&reg.mu);
        atomic_store(&reg.copies_done, 1);
        pthread_cond_broadcast(&reg.cv);
        pthread_mutex_unlock(&reg.mu);
        for (unsigned i = 0; i < reg_started; i++) {
            pthread_join(rts[i].tid, NULL);
            st->register_seconds += rts[i].busy;
        }
        pthread_mutex_destroy(&reg.mu);
        pthread_cond_destroy(&reg.cv);
        free(reg.pieces);
        free(rts);
        free(first_piece);
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
