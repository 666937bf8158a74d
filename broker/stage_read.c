/* The reader threads: read chunks (into the slab or a staging buffer) and
 * checksum them. */
#include "stage_impl.h"

#include "stage_ntcopy.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Reads go in blocks (wb_stage_config.read_block), each checksummed right
 * after it is read, while it is still in the core's cache: checksumming a
 * whole chunk after reading it reads it from memory a second time, and
 * memory bandwidth is what a fast load runs out of (measured on the H200
 * host: 38 GB/s with whole-chunk checksums, readers busy all the time; 46
 * GB/s with 256 KiB blocks). */

int wb__stage_read_full(int fd, uint8_t *buf, uint64_t len, uint64_t offset, const char *file,
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

/* ---- reads from a file mapping ----
 * A mapped file that shrinks under the load (truncated by someone else)
 * faults with SIGBUS where pread would return a short read. The readers
 * catch it: a process-wide SIGBUS handler, installed on the first mapped
 * read, jumps back into the reader whose guard is set; any other SIGBUS
 * gets the handler that was there before (or the default), by putting it
 * back and returning to the faulting instruction. */

static _Thread_local sigjmp_buf *bus_guard;
static struct sigaction bus_prev;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)si;
    (void)uc;
    if (bus_guard)
        siglongjmp(*bus_guard, 1);
    sigaction(sig, &bus_prev, NULL);
}

static void bus_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &bus_prev);
}

/* One guarded step on mapped bytes: copy n bytes from src to dst (when dst
 * is set), then checksum them from src into st (when set) or *once (when
 * set). Returns nonzero when the mapping faulted. */
typedef struct mapped_op {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
    int nt;
    XXH3_state_t *st;
    uint64_t *once;
} mapped_op;

static int guarded(const mapped_op *op)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0)) {
        bus_guard = NULL;
        return 1;
    }
    bus_guard = &jb;
    if (op->dst) {
        if (op->nt)
            wb__stage_ntcopy(op->dst, op->src, op->n);
        else if (op->n)
            memcpy(op->dst, op->src, op->n);
    }
    if (op->st)
        XXH3_64bits_update(op->st, op->src, op->n);
    if (op->once)
        *op->once = hash_once(op->src, op->n);
    bus_guard = NULL;
    return 0;
}

static int shrank(wb_err *err, const char *file, const char *tensor, uint64_t offset)
{
    return wb__err_set(err, WB_EIO,
                       "%s: tensor '%s': the file shrank while it was read (no bytes at "
                       "offset %llu any more)",
                       file, tensor, (unsigned long long)offset);
}

/* MADV_POPULATE_READ (Linux 5.14): maps a range's pages in one call instead
 * of one fault per few pages, and says EFAULT where a read would fault
 * with SIGBUS; an older kernel says EINVAL once and the readers fault the
 * pages in instead. */
static atomic_int no_populate;

/* Segments smaller than this are neither populated nor dropped: a system
 * call and a TLB flush would cost more than the few faults they save. */
#define MAP_TABLE_MIN (256u * 1024u)

static void page_range(const uint8_t *p, uint64_t len, uintptr_t *from, size_t *n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(page - 1), b = ((uintptr_t)p + len + page - 1) & ~(page - 1);
    *from = a;
    *n = (size_t)(b - a);
}

/* Asks for a range of a mapping that is not in the page cache (judged by
 * its first page) to be read, asynchronously and as a whole. A warm range
 * costs one mincore of one page. */
static void read_ahead(void *a, size_t n)
{
    unsigned char resident = 1;
    if (mincore(a, (size_t)sysconf(_SC_PAGESIZE), &resident) == 0 && !(resident & 1))
        madvise(a, n, MADV_WILLNEED);
}

/* Cold files: a reader that starts on a chunk also asks for the chunk one
 * round of claims ahead, so that the disk has work queued while this one is
 * copied (pread gets the same from the kernel's readahead). */
static void read_ahead_chunk(ctx *c, size_t k)
{
    if (k >= c->n_chunks)
        return;
    const chunk *ch = &c->chunks[c->order[k]];
    for (uint32_t i = 0; i < ch->n_segs; i++) {
        const seg *s = &c->segs[ch->first_seg + i];
        const wb_stage_tensor *t = &c->job->tensors[s->tensor];
        const uint8_t *map = c->src_maps[t->file];
        uint64_t at =
            t->file_offset + (s->piece == WHOLE ? 0 : (uint64_t)s->piece * c->chunk_bytes);
        if (!map || s->len < MAP_TABLE_MIN || at > c->src_lens[t->file] ||
            s->len > c->src_lens[t->file] - at)
            continue;
        uintptr_t a;
        size_t n;
        page_range(map + at, s->len, &a, &n);
        read_ahead((void *)a, n);
    }
}

static int populate(const uint8_t *p, uint64_t len, const char *file, const char *tensor,
                    uint64_t offset, wb_err *err)
{
#ifdef MADV_POPULATE_READ
    if (len < MAP_TABLE_MIN || atomic_load_explicit(&no_populate, memory_order_relaxed))
        return WB_OK;
    uintptr_t a;
    size_t n;
    page_range(p, len, &a, &n);
    /* A segment whose first page is not in the page cache is likely cold
     * as a whole: ask for all of it at once (asynchronous readahead of the
     * whole range), not one fault's read-around at a time. A warm segment
     * costs one mincore of one page. */
    read_ahead((void *)a, n);
    if (madvise((void *)a, n, MADV_POPULATE_READ) == 0)
        return WB_OK;
    if (errno == EFAULT)
        return shrank(err, file, tensor, offset);
    /* EINVAL (no such advice), or a transient failure: fault the pages in. */
    if (errno == EINVAL)
        atomic_store(&no_populate, 1);
#else
    (void)p;
    (void)len;
    (void)file;
    (void)tensor;
    (void)offset;
    (void)err;
#endif
    return WB_OK;
}

/* Drops the load's page table entries for a range it has read, in the
 * reader, so that unmapping the file at the end of the load is cheap
 * instead of one thread tearing down millions of entries. The page cache
 * keeps the pages. */
static void drop_range(const uint8_t *p, uint64_t len)
{
    if (len < MAP_TABLE_MIN)
        return;
    uintptr_t a;
    size_t n;
    page_range(p, len, &a, &n);
    madvise((void *)a, n, MADV_DONTNEED);
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

/* One segment by pread, block by block, each checksummed from the buffer
 * right after its read (the kernel's copy has left it in the cache). Whole
 * tensors are checksummed as they are read; a piece of a split tensor too
 * when its turn has come, else later (finish_hash). */
static int read_pread(ctx *c, reader_stats *rs, const seg *s, uint8_t *p, uint64_t from,
                      XXH3_state_t *local, held *h, wb_err *err)
{
    const wb_stage_job *j = c->job;
    wb_stage_tensor *t = &j->tensors[s->tensor];
    uint64_t blk = j->cfg.read_block;
    int whole = s->piece == WHOLE, streaming = whole && s->len > blk;
    if (streaming)
        XXH3_64bits_reset(local);
    for (uint64_t done = 0; done < s->len;) {
        uint64_t n = s->len - done < blk ? s->len - done : blk;
        double t0 = wb__clock_mono_s();
        int rc = wb__stage_read_full(j->fds[t->file], p + done, n, t->file_offset + from + done,
                                     j->files[t->file], t->name, err);
        double t1 = wb__clock_mono_s();
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
            rs->hash += wb__clock_mono_s() - t1;
    }
    if (whole) {
        double t0 = wb__clock_mono_s();
        t->xxh3 = streaming ? XXH3_64bits_digest(local) : hash_once(p, s->len);
        rs->hash += wb__clock_mono_s() - t0;
    }
    return WB_OK;
}

/* One segment copied from the file's mapping, block by block, each
 * checksummed from the mapping right after its copy: the copy's loads have
 * left the source in the cache, and a non-temporal copy has left nothing of
 * the destination there. The same checksum rules as read_pread. */
static int read_mapped(ctx *c, reader_stats *rs, const seg *s, uint8_t *p, uint64_t from,
                       XXH3_state_t *local, held *h, wb_err *err)
{
    const wb_stage_job *j = c->job;
    wb_stage_tensor *t = &j->tensors[s->tensor];
    const char *file = j->files[t->file];
    uint64_t flen = c->src_lens[t->file], at = t->file_offset + from;
    if (at > flen || s->len > flen - at)
        return wb__err_set(err, WB_EIO,
                           "%s: tensor '%s': the file ends at %llu, before the tensor's "
                           "end at %llu",
                           file, t->name, (unsigned long long)flen,
                           (unsigned long long)(at + s->len));
    const uint8_t *src = c->src_maps[t->file] + at;
    double t0 = wb__clock_mono_s();
    int rc = populate(src, s->len, file, t->name, at, err);
    rs->read += wb__clock_mono_s() - t0;
    if (rc != WB_OK)
        return rc;
    uint64_t blk = j->cfg.read_block;
    int whole = s->piece == WHOLE, streaming = whole && s->len > blk;
    if (streaming)
        XXH3_64bits_reset(local);
    for (uint64_t done = 0; done < s->len;) {
        uint64_t n = s->len - done < blk ? s->len - done : blk;
        double t1 = wb__clock_mono_s();
        mapped_op op = {.dst = p + done, .src = src + done, .n = (size_t)n, .nt = c->nt};
        if (guarded(&op))
            return shrank(err, file, t->name, at + done);
        double t2 = wb__clock_mono_s();
        rs->read += t2 - t1;
        mapped_op hop = {0}; /* a small whole tensor is checksummed below */
        if (streaming) {
            hop = (mapped_op){.src = src + done, .n = (size_t)n, .st = local};
        } else if (!whole && my_turn(c, s)) {
            hop = (mapped_op){.src = src + h->hashed,
                              .n = (size_t)(done + n - h->hashed),
                              .st = c->states[s->tensor]};
            h->hashed = done + n;
        }
        if (hop.src && guarded(&hop))
            return shrank(err, file, t->name, at + done);
        done += n;
        rs->hash += wb__clock_mono_s() - t2;
    }
    if (whole) {
        double t3 = wb__clock_mono_s();
        if (streaming) {
            t->xxh3 = XXH3_64bits_digest(local);
        } else {
            mapped_op op = {.src = src, .n = (size_t)s->len, .once = &t->xxh3};
            if (guarded(&op))
                return shrank(err, file, t->name, at);
        }
        rs->hash += wb__clock_mono_s() - t3;
    }
    double t4 = wb__clock_mono_s();
    drop_range(src, s->len);
    rs->read += wb__clock_mono_s() - t4;
    return WB_OK;
}

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
        const uint8_t *map = c->src_maps ? c->src_maps[t->file] : NULL;
        int rc = map ? read_mapped(c, rs, s, p, from, local, h, err)
                     : read_pread(c, rs, s, p, from, local, h, err);
        if (rc != WB_OK)
            return rc;
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
        double t0 = wb__clock_mono_s();
        pthread_mutex_lock(&ln->mu);
        while (!my_turn(c, s) && !stopped(c))
            pthread_cond_wait(&ln->cv, &ln->mu);
        int gone = !my_turn(c, s);
        pthread_mutex_unlock(&ln->mu);
        double t1 = wb__clock_mono_s();
        rs->wait += t1 - t0;
        if (gone)
            return 1;
        /* Only the holder of the turn touches the tensor's state; the
         * ticket's release and acquire order the turns. */
        XXH3_64bits_update(c->states[s->tensor], base + s->rel + h->hashed,
                           (size_t)(s->len - h->hashed));
        rs->hash += wb__clock_mono_s() - t1;
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
    double t0 = wb__clock_mono_s();
    int rc = j->prepare(j->prepare_ctx, from, to - from, err);
    rs->read += wb__clock_mono_s() - t0;
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
    if (c->src_maps)
        pthread_once(&bus_once, bus_install);
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
        if (c->src_maps)
            read_ahead_chunk(c, k + c->n_lanes);
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
        if (staged) {
            if (c->job->cfg.demote == WB_STAGE_DEMOTE_ON)
                wb__stage_demote(base, ch->span);
            wb__stage_hand_to_copier(c, (unsigned)b, ch);
        } else
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
