/* The insides of the loading pipeline (stage.h), shared by its files:
 * stage.c (the whole), stage_plan.c (planning), stage_read.c (the reader
 * threads), stage_crew.c (the threads they run on), stage_ring.c (the
 * staging buffers), stage_copy.c (the copier) and stage_mapped.c (the
 * mapped mode). */
#ifndef WB_BROKER_STAGE_IMPL_H
#define WB_BROKER_STAGE_IMPL_H

#include "clock.h"
#include "stage.h"

#include <pthread.h>
#include "xxh.h"

/* A piece number meaning "the whole tensor". */
#define WHOLE UINT32_MAX

/* One contiguous part of a tensor that lands in a chunk. */
typedef struct seg {
    uint32_t tensor;
    uint32_t piece; /* WHOLE, or the piece's number within its tensor */
    uint64_t rel;   /* offset in the chunk */
    uint64_t len;
} seg;

/* One unit of reading: a span of the slab filled from one or more segments,
 * moved by one copy. */
typedef struct chunk {
    uint64_t slab_off;
    uint64_t span;  /* bytes from the first segment's start to the last one's end */
    uint64_t bytes; /* tensor bytes in it */
    uint32_t first_seg;
    uint32_t n_segs;
} chunk;

typedef struct lane {
    pthread_mutex_t mu;
    pthread_cond_t cv;
} lane;

typedef struct reader_stats {
    double read, hash, wait;
} reader_stats;

/* The state of one load. */
typedef struct ctx {
    wb_stage_job *job;
    double t_start;       /* the pipeline's start (wb__clock_mono_s) */
    double first_fill_at; /* staged: when the first buffer was filled (under mu) */
    uint64_t chunk_bytes;
    /* The plan. */
    chunk *chunks;
    size_t n_chunks;
    seg *segs;
    size_t n_segs;
    size_t *order; /* the order in which chunks are claimed */
    /* Per tensor, for tensors split into pieces. */
    uint32_t *pieces;
    uint32_t *lane_of;
    /* The next piece to hash; written under its lane's mutex, read without
     * it by a reader that checks whether its turn has come. */
    _Atomic uint32_t *ticket;
    XXH3_state_t **states;
    lane *lanes;
    unsigned n_lanes;
    /* Progress and failure. */
    atomic_size_t next;
    atomic_int failed;
    pthread_mutex_t mu; /* guards everything below and the first error */
    int rc;
    wb_err err;
    /* Staged mode: buffer states. A filled buffer waits for two things, its
     * copy and its checksum; whoever finishes second frees it. */
    pthread_cond_t free_cv;   /* a buffer became free, or the load failed */
    pthread_cond_t copier_cv; /* a buffer was filled, or a reader ended */
    unsigned *free_stack;
    unsigned n_free;
    unsigned *fill_q; /* filled buffers in the order they were filled */
    unsigned fill_head, fill_count;
    atomic_int *pending;
    chunk **buf_chunk;
    unsigned n_readers; /* readers running or ended */
    unsigned readers_done;
    /* Read sources mmap and mmap-nt: per file its mapping (NULL: pread)
     * and length; nt: copy with non-temporal stores. */
    const uint8_t **src_maps;
    uint64_t *src_lens;
    int nt;
} ctx;

typedef struct reader {
    ctx *c;
    pthread_t tid;     /* when not one of the crew's */
    double started_at; /* seconds from the pipeline's start to this reader's */
    reader_stats st;
} reader;

/* The small helpers every stage calls on its hot path are inline, so that
 * splitting the pipeline into files costs no calls. */

static inline int stopped(const ctx *c)
{
    return atomic_load(&c->failed);
}

static inline void add_landed(ctx *c, uint64_t n)
{
    if (c->job->landed)
        atomic_fetch_add(c->job->landed, n);
}

static inline uint64_t hash_once(const void *p, uint64_t len)
{
    static const uint8_t empty[1];
    return XXH3_64bits(len ? p : empty, (size_t)len);
}

/* stage.c: whether a staged load's ring has an engine (WB_EINTERNAL if not). */
int wb__stage_ring_ready(const wb_staging *sg, wb_err *err);

/* stage.c: records the first error and wakes every waiting thread. */
void wb__stage_fail(ctx *c, int rc, const wb_err *err);
int wb__stage_oom(wb_err *err, const char *what);

/* stage_plan.c: cuts the tensors into chunks and decides the order of
 * claims. */
int wb__stage_plan(ctx *c, unsigned lanes, wb_err *err);

/* stage_read.c: one reader thread (arg: its reader). */
void *wb__stage_reader_main(void *arg);

/* stage_ring.c: the staging buffers of a staged load. take_buffer waits for
 * a free buffer (-1 when the load failed); hand_to_copier queues a filled
 * one with two holds (copy, checksum); release_buffer drops one hold and
 * frees the buffer on the last; free_buffer returns an unfilled one. */
int wb__stage_take_buffer(ctx *c, reader_stats *rs);
void wb__stage_free_buffer(ctx *c, unsigned b);
void wb__stage_release_buffer(ctx *c, unsigned b);
void wb__stage_hand_to_copier(ctx *c, unsigned b, chunk *ch);

/* Readers need little stack (their buffers are the ring's or the slab's). */
#define READER_STACK (512u << 10)

/* stage_crew.c: *a initialised with a stack of READER_STACK bytes (1; the
 * caller destroys it), or 0 when that failed (create with NULL: the default
 * stack). */
int wb__stage_reader_attr(pthread_attr_t *a);

/* stage_crew.c: runs fn(args + i * stride) for each i below n on the
 * crew's threads (created on first use, kept); returns how many run (fewer
 * than n when threads could not be created), 0 when the crew is busy with
 * another run: the caller then starts threads of its own. wb__crew_wait
 * waits for every task of the run and ends it. */
unsigned wb__crew_start(unsigned n, void *(*fn)(void *), void *args, size_t stride);
void wb__crew_wait(void);

/* stage_copy.c: the copier of a staged load, in the calling thread, until
 * every reader has ended and every copy has finished (first calling the
 * job's before_copy); fills st's copy_seconds, first_copy_at and
 * copy_calls. */
void wb__stage_run_copier(ctx *c, wb_stage_stats *st);

/* stage_mapped.c: a whole mapped load. */
int wb__stage_run_mapped(ctx *c, wb_stage_stats *st, wb_err *err);

#endif
