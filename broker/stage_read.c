/* The reader threads: read chunks (into the slab or a staging buffer) and
 * checksum them. */
#include "stage_impl.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

/* Reads go in blocks (wb_stage_config.read_block), each checksummed right
 * after it is read, while it is still in the core's cache: checksumming a
 * whole chunk after reading it reads it from memory a second time, and
 * memory bandwidth is what a fast load runs out of (measured on the H200
 * host: 38 GB/s with whole-chunk checksums, readers busy all the time; 46
 * GB/s with 256 KiB blocks). */

/* Reads exactly len bytes at offset, retrying short reads and EINTR. */
static int read_full(int fd, uint8_t *buf, uint64_t len, uint64_t offset, const char *file,
                     const char *tensor, wb_err *err)
{
    uint64_t got = 0;
    while (got < len) {
        uint64_t want = len - got;
        if (want > (1u << 30))
            want = 1u << 30;
        ssize_t r = pread(fd, buf + got, (size_t)want, (off_t)(offset + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return wb__err_errno(err, WB_EIO, errno, "%s: reading tensor '%s' at offset %llu", file,
                                 tensor, (unsigned long long)(offset + got));
        }
        if (r == 0)
            return wb__err_set(err, WB_EIO,
                               "%s: tensor '%s': the file ends at %llu, before the tensor's "
                               "end at %llu",
                               file, tensor, (unsigned long long)(offset + got),
                               (unsigned long long)(offset + len));
        got += (uint64_t)r;
    }
    return WB_OK;
}

static int my_turn(ctx *c, const seg *s)
{
    return atomic_load_explicit(&c->ticket[s->tensor], memory_order_acquire) == s->piece;
}

/* Hands the turn of a split tensor to its next piece. */
static void pass_turn(ctx *c, const seg *s)
{
    lane *ln = &c->lanes[c->lane_of[s->tensor]];
    pthread_mutex_lock(&ln->mu);
    atomic_store_explicit(&c->ticket[s->tensor], s->piece + 1, memory_order_release);
    pthread_cond_broadcast(&ln->cv);
    pthread_mutex_unlock(&ln->mu);
}

/* What a reader knows of the chunk it holds: how much of its piece (if it
 * is a piece of a split tensor) is already checksummed. */
typedef struct held {
    uint64_t hashed;
} held;

/* Reads a chunk's segments to base, block by block. Whole tensors are
 * checksummed as they are read; a piece of a split tensor too when its turn
 * has come, else later (finish_hash). In a staging buffer the gaps between
 * tensors are zeroed so that no stale bytes reach the slab. */
static int read_chunk(ctx *c, reader_stats *rs, const chunk *ch, uint8_t *base, int zero_gaps,
                      XXH3_state_t *local, held *h, wb_err *err)
{
    const wb_stage_job *j = c->job;
    uint64_t end = 0;
    h->hashed = 0;
    for (uint32_t i = 0; i < ch->n_segs; i++) {
        const seg *s = &c->segs[ch->first_seg + i];
        wb_stage_tensor *t = &j->tensors[s->tensor];
        uint8_t *p = base + s->rel;
        if (zero_gaps && s->rel > end)
            memset(base + end, 0, s->rel - end);
        uint64_t from = s->piece == WHOLE ? 0 : (uint64_t)s->piece * c->chunk_bytes;
        uint64_t blk = c->job->cfg.read_block;
        int whole = s->piece == WHOLE, streaming = whole && s->len > blk;
        if (streaming)
            XXH3_64bits_reset(local);
        for (uint64_t done = 0; done < s->len;) {
            uint64_t n = s->len - done < blk ? s->len - done : blk;
            double t0 = now_s();
            int rc = read_full(j->fds[t->file], p + done, n, t->file_offset + from + done,
                               j->files[t->file], t->name, err);
            double t1 = now_s();
            rs->read += t1 - t0;
            if (rc != WB_OK)
                return rc;
            done += n;
            if (streaming) {
                XXH3_64bits_update(local, p + done - n, (size_t)n);
            } else if (!whole && my_turn(c, s)) {
                XXH3_64bits_update(c->states[s->tensor], p + h->hashed, (size_t)(done - h->hashed));
                h->hashed = done;
            }
            if (streaming || !whole)
                rs->hash += now_s() - t1;
        }
        if (whole) {
            double t0 = now_s();
            t->xxh3 = streaming ? XXH3_64bits_digest(local) : hash_once(p, s->len);
            rs->hash += now_s() - t0;
        }
        end = s->rel + s->len;
    }
    return WB_OK;
}

/* Finishes the checksum of a chunk that is a piece of a split tensor: waits
 * for its turn, checksums what was not yet, passes the turn on. Returns
 * nonzero when the load failed meanwhile. */
static int finish_hash(ctx *c, reader_stats *rs, const chunk *ch, const uint8_t *base,
                       const held *h)
{
    const seg *s = &c->segs[ch->first_seg];
    if (ch->n_segs != 1 || s->piece == WHOLE)
        return 0;
    if (h->hashed < s->len) {
        lane *ln = &c->lanes[c->lane_of[s->tensor]];
        double t0 = now_s();
        pthread_mutex_lock(&ln->mu);
        while (!my_turn(c, s) && !stopped(c))
            pthread_cond_wait(&ln->cv, &ln->mu);
        int gone = !my_turn(c, s);
        pthread_mutex_unlock(&ln->mu);
        double t1 = now_s();
        rs->wait += t1 - t0;
        if (gone)
            return 1;
        /* Only the holder of the turn touches the tensor's state; the
         * ticket's release and acquire order the turns. */
        XXH3_64bits_update(c->states[s->tensor], base + s->rel + h->hashed,
                           (size_t)(s->len - h->hashed));
        rs->hash += now_s() - t1;
    }
    if (s->piece + 1 == c->pieces[s->tensor])
        c->job->tensors[s->tensor].xxh3 = XXH3_64bits_digest(c->states[s->tensor]);
    pass_turn(c, s);
    return 0;
}

/* Direct mode: has the memory of chunk ci, and of the gap up to the next
 * chunk, allocated by the reader that fills it (chunks are in slab order).
 * Counted as reading: it is the cost of landing the bytes. */
static int prepare(ctx *c, reader_stats *rs, size_t ci, wb_err *err)
{
    const wb_stage_job *j = c->job;
    if (!j->prepare)
        return WB_OK;
    uint64_t from = ci ? c->chunks[ci].slab_off : 0;
    uint64_t to = ci + 1 < c->n_chunks ? c->chunks[ci + 1].slab_off : UINT64_MAX;
    double t0 = now_s();
    int rc = j->prepare(j->prepare_ctx, from, to - from, err);
    rs->read += now_s() - t0;
    return rc;
}

static int check_cancel(ctx *c)
{
    if (c->job->cancel && atomic_load(c->job->cancel)) {
        wb_err e;
        wb__err_set(&e, WB_ESTATE, "the load was cancelled (the broker is stopping)");
        wb__stage_fail(c, WB_ESTATE, &e);
        return 1;
    }
    return 0;
}

void *wb__stage_reader_main(void *arg)
{
    reader *r = arg;
    ctx *c = r->c;
    int staged = c->job->mode == WB_STAGE_STAGED;
    wb_err err;
    XXH3_state_t *local = XXH3_createState();
    if (!local) {
        wb__err_set(&err, WB_ENOMEM, "out of memory for a checksum state");
        wb__stage_fail(c, WB_ENOMEM, &err);
    }
    while (!stopped(c) && !check_cancel(c)) {
        int b = -1;
        if (staged && (b = wb__stage_take_buffer(c, &r->st)) < 0)
            break;
        size_t k = atomic_fetch_add(&c->next, 1);
        if (k >= c->n_chunks) {
            if (staged)
                wb__stage_free_buffer(c, (unsigned)b);
            break;
        }
        size_t ci = c->order[k];
        chunk *ch = &c->chunks[ci];
        uint8_t *base = staged ? c->job->staging->bufs[b] : c->job->host_dst + ch->slab_off;
        held h;
        int rc = staged ? WB_OK : prepare(c, &r->st, ci, &err);
        if (rc == WB_OK)
            rc = read_chunk(c, &r->st, ch, base, staged, local, &h, &err);
        if (rc != WB_OK) {
            wb__stage_fail(c, rc, &err);
            if (staged)
                wb__stage_free_buffer(c, (unsigned)b);
            break;
        }
        if (staged)
            wb__stage_hand_to_copier(c, (unsigned)b, ch);
        else
            add_landed(c, ch->bytes);
        int gone = finish_hash(c, &r->st, ch, base, &h);
        if (staged)
            wb__stage_release_buffer(c, (unsigned)b);
        if (gone)
            break;
    }
    XXH3_freeState(local);
    pthread_mutex_lock(&c->mu);
    c->readers_done++;
    pthread_cond_signal(&c->copier_cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}
