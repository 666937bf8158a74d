/* Planning: cuts the tensors into chunks and spreads them over the lanes. */
#include "stage_impl.h"

#include "alloc.h"

#include <stdlib.h>
#include <string.h>

typedef struct unit {
    size_t first_chunk, n_chunks;
    uint64_t bytes;
    unsigned lane;
} unit;

static int by_slab_offset(const void *a, const void *b, void *arg)
{
    const wb_stage_tensor *t = arg;
    uint64_t x = t[*(const size_t *)a].slab_offset, y = t[*(const size_t *)b].slab_offset;
    return x < y ? -1 : x > y;
}

static int by_bytes_desc(const void *a, const void *b, void *arg)
{
    const unit *u = arg;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    if (u[i].bytes != u[j].bytes)
        return u[i].bytes < u[j].bytes ? 1 : -1;
    return i < j ? -1 : i > j;
}

/* Cuts the tensors into chunks and decides the order of claims. */
int wb__stage_plan(ctx *c, unsigned lanes, wb_err *err)
{
    wb_stage_job *j = c->job;
    size_t n = j->n_tensors;
    uint64_t cb = c->chunk_bytes;
    size_t n_data = 0, max_chunks = 0;
    for (size_t i = 0; i < n; i++) {
        if (j->tensors[i].nbytes == 0) {
            j->tensors[i].xxh3 = hash_once(NULL, 0);
            continue;
        }
        n_data++;
        max_chunks += (size_t)((j->tensors[i].nbytes + cb - 1) / cb);
    }
    size_t *idx = wb__malloc((n_data ? n_data : 1) * sizeof *idx);
    unit *units = wb__malloc((max_chunks ? max_chunks : 1) * sizeof *units);
    c->chunks = wb__malloc((max_chunks ? max_chunks : 1) * sizeof *c->chunks);
    c->segs = wb__malloc((max_chunks + n_data + 1) * sizeof *c->segs);
    c->order = wb__malloc((max_chunks ? max_chunks : 1) * sizeof *c->order);
    c->pieces = wb__calloc(n ? n : 1, sizeof *c->pieces);
    c->lane_of = wb__calloc(n ? n : 1, sizeof *c->lane_of);
    c->ticket = wb__calloc(n ? n : 1, sizeof *c->ticket);
    c->states = wb__calloc(n ? n : 1, sizeof *c->states);
    int rc = WB_OK;
    if (!idx || !units || !c->chunks || !c->segs || !c->order || !c->pieces || !c->lane_of ||
        !c->ticket || !c->states) {
        rc = wb__stage_oom(err, "chunk tables");
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (j->tensors[i].nbytes)
            idx[k++] = i;
    }
    qsort_r(idx, n_data, sizeof *idx, by_slab_offset, j->tensors);

    size_t n_units = 0;
    unit *open = NULL; /* the group of small tensors being filled */
    for (size_t q = 0; q < n_data; q++) {
        size_t ti = idx[q];
        const wb_stage_tensor *t = &j->tensors[ti];
        if (t->nbytes > cb) {
            open = NULL;
            unit *u = &units[n_units++];
            u->first_chunk = c->n_chunks;
            u->bytes = t->nbytes;
            uint32_t p = 0;
            for (uint64_t off = 0; off < t->nbytes; off += cb, p++) {
                uint64_t len = t->nbytes - off < cb ? t->nbytes - off : cb;
                chunk *ch = &c->chunks[c->n_chunks++];
                ch->slab_off = t->slab_offset + off;
                ch->span = len;
                ch->bytes = len;
                ch->first_seg = (uint32_t)c->n_segs;
                ch->n_segs = 1;
                c->segs[c->n_segs++] =
                    (seg){.tensor = (uint32_t)ti, .piece = p, .rel = 0, .len = len};
            }
            u->n_chunks = p;
            c->pieces[ti] = p;
            if (!(c->states[ti] = XXH3_createState())) {
                rc = wb__stage_oom(err, "checksum states");
                goto out;
            }
            XXH3_64bits_reset(c->states[ti]);
            continue;
        }
        chunk *last = open ? &c->chunks[open->first_chunk] : NULL;
        if (last && t->slab_offset >= last->slab_off &&
            t->slab_offset + t->nbytes - last->slab_off <= cb) {
            uint64_t rel = t->slab_offset - last->slab_off;
            c->segs[c->n_segs++] =
                (seg){.tensor = (uint32_t)ti, .piece = WHOLE, .rel = rel, .len = t->nbytes};
            last->n_segs++;
            last->span = rel + t->nbytes;
            last->bytes += t->nbytes;
            open->bytes += t->nbytes;
            continue;
        }
        unit *u = &units[n_units++];
        u->first_chunk = c->n_chunks;
        u->n_chunks = 1;
        u->bytes = t->nbytes;
        chunk *ch = &c->chunks[c->n_chunks++];
        ch->slab_off = t->slab_offset;
        ch->span = t->nbytes;
        ch->bytes = t->nbytes;
        ch->first_seg = (uint32_t)c->n_segs;
        ch->n_segs = 1;
        c->segs[c->n_segs++] =
            (seg){.tensor = (uint32_t)ti, .piece = WHOLE, .rel = 0, .len = t->nbytes};
        open = u;
    }

    /* Largest unit first, each onto the least loaded lane. */
    size_t *uorder = idx; /* reused: n_units <= n_data */
    for (size_t u = 0; u < n_units; u++)
        uorder[u] = u;
    qsort_r(uorder, n_units, sizeof *uorder, by_bytes_desc, units);
    uint64_t load[WB_STAGE_MAX_THREADS] = {0};
    size_t per_lane[WB_STAGE_MAX_THREADS] = {0};
    for (size_t q = 0; q < n_units; q++) {
        unit *u = &units[uorder[q]];
        unsigned best = 0;
        for (unsigned l = 1; l < lanes; l++) {
            if (load[l] < load[best])
                best = l;
        }
        u->lane = best;
        load[best] += u->bytes;
        per_lane[best] += u->n_chunks;
        const seg *s = &c->segs[c->chunks[u->first_chunk].first_seg];
        if (s->piece != WHOLE)
            c->lane_of[s->tensor] = best;
    }
    /* Each lane's chunks in order (units in the order they were assigned),
     * then one chunk from each lane in turn. */
    size_t start[WB_STAGE_MAX_THREADS + 1], fill[WB_STAGE_MAX_THREADS];
    start[0] = 0;
    for (unsigned l = 0; l < lanes; l++)
        start[l + 1] = start[l] + per_lane[l];
    memcpy(fill, start, sizeof fill);
    size_t *seq = wb__malloc((c->n_chunks ? c->n_chunks : 1) * sizeof *seq);
    if (!seq) {
        rc = wb__stage_oom(err, "claim order");
        goto out;
    }
    for (size_t q = 0; q < n_units; q++) {
        const unit *u = &units[uorder[q]];
        for (size_t x = 0; x < u->n_chunks; x++)
            seq[fill[u->lane]++] = u->first_chunk + x;
    }
    size_t o = 0;
    for (size_t round = 0; o < c->n_chunks; round++) {
        for (unsigned l = 0; l < lanes; l++) {
            if (start[l] + round < start[l + 1])
                c->order[o++] = seq[start[l] + round];
        }
    }
    free(seq);
out:
    free(idx);
    free(units);
    return rc;
}
