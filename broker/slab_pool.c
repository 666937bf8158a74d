/* The slab pool (slab_pool.h). */
#include "slab_pool.h"

#include "alloc.h"

#include <stdlib.h>
#include <string.h>

void wb__slab_pool_init(wb_slab_pool *p, int64_t keep_ms, void (*free_slab)(wb_slab *slab))
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    p->keep_ms = keep_ms > 0 ? keep_ms : 0;
    p->free_slab = free_slab;
}

/* Frees entry i (mu held) and moves the last one into its place. */
static void drop(wb_slab_pool *p, size_t i)
{
    p->bytes -= p->e[i].slab.size;
    p->free_slab(&p->e[i].slab);
    p->e[i] = p->e[--p->n];
}

void wb__slab_pool_destroy(wb_slab_pool *p)
{
    pthread_mutex_lock(&p->mu);
    while (p->n)
        drop(p, p->n - 1);
    free(p->e);
    p->e = NULL;
    p->cap = 0;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_destroy(&p->mu);
}

int wb__slab_pool_take(wb_slab_pool *p, int device, uint64_t size, wb_slab *out)
{
    int hit = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++) {
        if (p->e[i].slab.device == device && p->e[i].slab.size == size) {
            *out = p->e[i].slab;
            p->bytes -= size;
            p->e[i] = p->e[--p->n];
            hit = 1;
            break;
        }
    }
    if (!hit) {
        /* The memory goes back before the caller allocates its own. */
        for (size_t i = p->n; i-- > 0;) {
            if (p->e[i].slab.device == device)
                drop(p, i);
        }
        if (p->keep_ms)
            p->misses++;
    } else {
        p->hits++;
    }
    pthread_mutex_unlock(&p->mu);
    return hit;
}

int wb__slab_pool_put(wb_slab_pool *p, const wb_slab *slab, int64_t now_ms)
{
    if (!p->keep_ms || slab->size == 0)
        return 0;
    pthread_mutex_lock(&p->mu);
    int kept = 0;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 8;
        wb_pooled_slab *e = wb__realloc(p->e, cap * sizeof *e);
        if (e) {
            p->e = e;
            p->cap = cap;
        }
    }
    if (p->n < p->cap) {
        p->e[p->n].slab = *slab;
        p->e[p->n].until_ms = now_ms + p->keep_ms;
        p->n++;
        p->bytes += slab->size;
        kept = 1;
    }
    pthread_mutex_unlock(&p->mu);
    return kept;
}

size_t wb__slab_pool_trim(wb_slab_pool *p, int64_t now_ms)
{
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = p->n; i-- > 0;) {
        if (p->e[i].until_ms <= now_ms) {
            drop(p, i);
            n++;
        }
    }
    p->trimmed += n;
    pthread_mutex_unlock(&p->mu);
    return n;
}

uint64_t wb__slab_pool_bytes(wb_slab_pool *p, int device)
{
    uint64_t b = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++) {
        if (device < 0 || p->e[i].slab.device == device)
            b += p->e[i].slab.size;
    }
    pthread_mutex_unlock(&p->mu);
    return b;
}

void wb__slab_pool_counts(wb_slab_pool *p, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&p->mu);
    *hits = p->hits;
    *misses = p->misses;
    pthread_mutex_unlock(&p->mu);
}
