/* The ring of staging buffers in a staged load: readers take free buffers
 * and hand filled ones to the copier; a buffer is free again when both its
 * copy and its checksum are done. */
#include "stage_impl.h"

#include <pthread.h>

int wb__stage_take_buffer(ctx *c, reader_stats *rs)
{
    double t0 = wb__clock_mono_s();
    pthread_mutex_lock(&c->mu);
    while (c->n_free == 0 && !stopped(c))
        pthread_cond_wait(&c->free_cv, &c->mu);
    int b = -1;
    if (!stopped(c))
        b = (int)c->free_stack[--c->n_free];
    pthread_mutex_unlock(&c->mu);
    rs->wait += wb__clock_mono_s() - t0;
    return b;
}

void wb__stage_free_buffer(ctx *c, unsigned b)
{
    pthread_mutex_lock(&c->mu);
    c->free_stack[c->n_free++] = b;
    pthread_cond_signal(&c->free_cv);
    pthread_mutex_unlock(&c->mu);
}

/* Drops one of a filled buffer's two holds (copy, checksum). */
void wb__stage_release_buffer(ctx *c, unsigned b)
{
    if (atomic_fetch_sub(&c->pending[b], 1) == 1)
        wb__stage_free_buffer(c, b);
}

void wb__stage_hand_to_copier(ctx *c, unsigned b, chunk *ch)
{
    atomic_store(&c->pending[b], 2);
    pthread_mutex_lock(&c->mu);
    c->buf_chunk[b] = ch;
    c->fill_q[(c->fill_head + c->fill_count) % c->job->staging->n] = b;
    c->fill_count++;
    if (c->first_fill_at == 0)
        c->first_fill_at = wb__clock_mono_s() - c->t_start;
    pthread_cond_signal(&c->copier_cv);
    pthread_mutex_unlock(&c->mu);
}
