/* The loading pipeline: moves tensors from checkpoint files into a slab and
 * checksums each one (XXH3-64 of its bytes, in order) on the way.
 *
 * Three modes share the planning, the threads and the error handling:
 * - direct: reader threads pread straight into the slab's host memory (the
 *   host backend); there is no copy stage.
 * - staged: reader threads fill a ring of staging buffers (pinned memory
 *   allocated once, when the backend starts); one copier thread hands each
 *   filled buffer to a copy engine (cudaMemcpyAsync on a non-blocking
 *   stream) as soon as it is filled, whatever its position in the file, and
 *   a buffer goes back to the readers when both its copy and its checksum
 *   are done. Nobody waits for chunks in file order.
 * - mapped: the files are mapped and registered with the engine; the copier
 *   queues copies straight from the mapping while hasher threads checksum
 *   the tensors.
 *
 * Work is cut into chunks of at most chunk_bytes: a tensor larger than that
 * becomes several pieces, consecutive smaller tensors share one chunk. The
 * pieces of one tensor must be hashed in order; they are spread over lanes
 * (one per reader) so that consecutive claims touch different tensors and
 * their checksums proceed in parallel. */
#ifndef WB_BROKER_STAGE_H
#define WB_BROKER_STAGE_H

#include "err.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Limits on the configuration (wbrokerd checks its options against them). */
#define WB_STAGE_MAX_THREADS 64
#define WB_STAGE_MAX_BUFFERS 1024
#define WB_STAGE_MIN_CHUNK   (64u * 1024u)
#define WB_STAGE_MAX_CHUNK   (1024ull * 1024u * 1024u)

/* Defaults, chosen by bench/load on a 16-core H200 host (bench/RESULTS.md):
 * 3/4 of the cores read (the rest is left to the copier and the kernel), in
 * 1 MiB chunks through 48 buffers (48 MiB of pinned memory), the copies
 * handed to the engine eight at a time (WB_STAGE_DEFAULT_COPY_BATCH). With
 * batches, small buffers cost the copy engine nothing more, and a small ring
 * stays in the last-level cache: 2 MiB x 64 loaded at 0.975 of the pinned
 * peak where 4 MiB x 32 did 0.960 (both in batches of 8, 14 readers; one at
 * a time, 4 MiB x 32 did 0.940); then wbrokerd's own reloads with 1 MiB x 48
 * beat 2 MiB x 64 in 16 of 17 A/B pairs (8, 4 and 1 GiB checkpoints, either
 * broker first: -0.7 to +10 points of the peak, median 0.959 against 0.928
 * for 8 GiB). The read source: pread.
 * Measured there in one run (8 GiB, warm page cache, median of 3): pread
 * 47.3 GB/s, copies from a mapping 46.8, the same with non-temporal stores
 * 41.9 (and "auto", which picks those for a cached file, 40.6): the
 * streaming stores did not pay for the mapping's page table work. */
#define WB_STAGE_DEFAULT_CHUNK       (1ull * 1024u * 1024u)
#define WB_STAGE_DEFAULT_BUFFERS     48
#define WB_STAGE_DEFAULT_MAX_THREADS 16
#define WB_STAGE_DEFAULT_READ_BLOCK  (256u * 1024u)
#define WB_STAGE_DEFAULT_READ        WB_STAGE_READ_PREAD
#define WB_STAGE_DEFAULT_RING_PAGES  WB_STAGE_PAGES_NORMAL
#define WB_STAGE_DEFAULT_DEMOTE      WB_STAGE_DEMOTE_OFF
/* Mapped mode, register_threads > 0: the unit of registration. */
#define WB_STAGE_REGISTER_PIECE (64ull * 1024u * 1024u)

/* How readers take a file's bytes (wb_stage_config.read_source). */
typedef enum wb_stage_read {
    /* pread into the buffer: the kernel copies from the page cache. */
    WB_STAGE_READ_PREAD = 1,
    /* memcpy from a read-only shared mapping of the file, populated a chunk
     * at a time (MADV_POPULATE_READ) and dropped after it. */
    WB_STAGE_READ_MMAP = 2,
    /* The same with non-temporal stores (stage_ntcopy.h): the buffer is not read
     * for ownership first. Blocks are checksummed from the mapping, which
     * the copy has just brought into the cache; the buffer's bytes are not
     * there. */
    WB_STAGE_READ_MMAP_NT = 3,
    /* Per file: mmap-nt when the file is in the page cache (judged from 64
     * pages spread over it), pread when not: a cold mapping is read by page
     * faults, a few pages at a time, where pread gets the kernel's
     * readahead. */
    WB_STAGE_READ_AUTO = 4,
} wb_stage_read;

/* What memory the staging ring is made of (cuda backend). */
typedef enum wb_stage_pages {
    WB_STAGE_PAGES_NORMAL = 1, /* cudaHostAlloc */
    /* 2 MiB pages (a hugetlbfs reservation, else transparent huge pages),
     * pinned with cudaHostRegister; normal pages, with a note in the
     * backend's log line, when neither is to be had. */
    WB_STAGE_PAGES_HUGE = 2,
} wb_stage_pages;

/* Staged: what a reader does with a buffer it has filled, before the copy
 * engine reads it (wb_stage_config.demote). */
typedef enum wb_stage_demote {
    WB_STAGE_DEMOTE_OFF = 1, /* nothing: its lines stay in the reader's core caches */
    /* CLDEMOTE on each of its cache lines, where the processor has it: the
     * lines move to the shared last-level cache, where the engine's reads
     * find them without asking the core that wrote them. */
    WB_STAGE_DEMOTE_ON = 2,
} wb_stage_demote;

typedef enum wb_stage_mode {
    WB_STAGE_DIRECT = 1,
    WB_STAGE_STAGED = 2,
    WB_STAGE_MAPPED = 3,
} wb_stage_mode;

/* "direct", "staged", "mapped"; "unknown" otherwise. */
const char *wb__stage_mode_name(int mode);
/* "pread", "mmap", "mmap-nt", "auto"; "unknown" otherwise. */
const char *wb__stage_read_name(int read_source);
/* The wb_stage_read of a name above, or 0. */
int wb__stage_read_parse(const char *name);
/* "off", "on"; "unknown" otherwise. */
const char *wb__stage_demote_name(int demote);
/* The wb_stage_demote of a name above, or 0. */
int wb__stage_demote_parse(const char *name);
/* Whether this processor has CLDEMOTE. */
int wb__stage_can_demote(void);
/* "normal", "huge"; "unknown" otherwise. */
const char *wb__stage_pages_name(int pages);
/* The wb_stage_pages of a name above, or 0. */
int wb__stage_pages_parse(const char *name);

typedef struct wb_stage_config {
    unsigned read_threads; /* 0: 3/4 of the online cores, at most WB_STAGE_DEFAULT_MAX_THREADS */
    uint64_t chunk_bytes;  /* 0: WB_STAGE_DEFAULT_CHUNK; staged: the size of one buffer */
    unsigned buffers;      /* 0: WB_STAGE_DEFAULT_BUFFERS; staged only */
    /* 0: WB_STAGE_DEFAULT_READ_BLOCK. Reads go in blocks of this size, each
     * checksummed right after it is read, while it is in the core's cache. */
    unsigned read_block;
    int read_source; /* wb_stage_read; 0: WB_STAGE_DEFAULT_READ (direct and staged) */
    int ring_pages;  /* wb_stage_pages; 0: WB_STAGE_DEFAULT_RING_PAGES (cuda, staged) */
    /* Staged: filled buffers held back until this many can go to the
     * engine as one batch (1: never held); 1 to WB_STAGE_MAX_BATCH, 0:
     * WB_STAGE_DEFAULT_COPY_BATCH. */
    unsigned copy_batch;
    /* Mapped: 0 registers each file mapping whole before the first copy;
     * N registers it in pieces of WB_STAGE_REGISTER_PIECE bytes on N
     * threads while the copies of the pieces already registered run. */
    unsigned register_threads;
    /* Mapped, register_threads > 0: bytes per piece, a multiple of 64 KiB;
     * 0: WB_STAGE_REGISTER_PIECE. */
    uint64_t register_piece;
    /* Staged: wb_stage_demote; 0: WB_STAGE_DEFAULT_DEMOTE. */
    int demote;
} wb_stage_config;

/* Replaces zero fields of *c by the defaults. */
void wb__stage_config_fill(wb_stage_config *c);

/* Reads exactly len bytes of `file` (for the message; tensor too) at offset
 * into buf, retrying short reads and EINTR; WB_EIO naming the file, the
 * tensor and the offset. */
int wb__stage_read_full(int fd, uint8_t *buf, uint64_t len, uint64_t offset, const char *file,
                        const char *tensor, wb_err *err);

/* Checks a configuration against the limits; the message names the field. */
int wb__stage_config_check(const wb_stage_config *c, wb_err *err);

/* Staged: filled buffers are handed to the engine in batches of at most
 * WB_STAGE_MAX_BATCH copies (submit_many). The copier holds buffers back
 * until wb_stage_config.copy_batch of them are ready, unless fewer than
 * twice that many copies are still queued (the engine must not run dry) or
 * the readers have ended. Measured on the H200 host (bench/load.c,
 * --ring-sweep): the ring's 4 MiB copies queued one by one reach 0.96 of
 * the pinned peak, four to a batch 0.99, sixteen 0.996: every copy costs
 * the engine a gap that a batch pays once. */
#define WB_STAGE_MAX_BATCH          16
#define WB_STAGE_DEFAULT_COPY_BATCH 8

/* One copy of a batch. */
typedef struct wb_copy {
    int buf; /* the staging buffer it empties */
    const void *src;
    void *dst;
    size_t len;
} wb_copy;

/* The copy stage of the staged and mapped modes. Every function is called
 * from the copier thread only, except host_register/host_unregister (the
 * loading thread). None may block on a copy except finish. */
typedef struct wb_copy_engine {
    void *ctx;
    /* Before the first copy of a load (e.g. selects the device). */
    int (*begin)(void *ctx, wb_err *err);
    /* Queues an asynchronous copy of len bytes from host memory src to dst.
     * buf is the staging buffer (or -1 in mapped mode); query(buf) must
     * then report this copy's completion. */
    int (*submit)(void *ctx, int buf, const void *src, void *dst, size_t len, wb_err *err);
    /* May be NULL (the copier then submits one at a time). Queues n (1 to
     * WB_STAGE_MAX_BATCH) copies from staging buffers as one batch, which
     * may run in any order within itself; query(copies[i].buf) then
     * reports each one's completion. On failure some may have been
     * queued: the load fails, and finish waits for them. */
    int (*submit_many)(void *ctx, const wb_copy *copies, unsigned n, wb_err *err);
    /* 1 when the last copy submitted from buffer buf has finished, 0 when
     * not yet, a negative code when the copy failed. */
    int (*query)(void *ctx, int buf, wb_err *err);
    /* Waits for every queued copy. *device_seconds gets the time the
     * device spent from the first copy's start to the last one's end, or
     * a negative number when the engine cannot tell. */
    int (*finish)(void *ctx, double *device_seconds, wb_err *err);
    /* Mapped mode: makes [addr, addr + len) usable by submit, and undoes it. */
    int (*host_register)(void *ctx, void *addr, size_t len, wb_err *err);
    void (*host_unregister)(void *ctx, void *addr);
} wb_copy_engine;

/* Queues n copies through e: one submit_many, or one submit each where the
 * engine has no batches (stopping at the first failure). */
int wb__copy_submit_many(wb_copy_engine *e, const wb_copy *copies, unsigned n, wb_err *err);

/* A ring of staging buffers, allocated once by its owner (the backend) and
 * reused by every load; one load at a time. */
typedef struct wb_staging {
    unsigned n; /* buffers */
    /* What the ring's memory is, for the backend's log line: "normal",
     * "hugetlb", "thp 128/128 MiB", or "normal (huge pages: why not)". */
    char pages[160];
    uint64_t size;  /* bytes per buffer = the chunk size of staged loads */
    uint8_t **bufs; /* n buffers of `size` bytes, owned by the creator */
    wb_copy_engine engine;
} wb_staging;

typedef struct wb_stage_tensor {
    const char *name; /* for messages */
    uint32_t file;    /* index into the job's files */
    uint64_t file_offset;
    uint64_t slab_offset;
    uint64_t nbytes;
    uint64_t xxh3; /* output */
} wb_stage_tensor;

typedef struct wb_stage_job {
    int mode; /* wb_stage_mode */
    wb_stage_tensor *tensors;
    size_t n_tensors;
    /* Inputs: one descriptor (direct, staged) or mapping (mapped) per file. */
    uint32_t n_files;
    const char *const *files; /* names, for messages */
    const int *fds;
    const uint8_t *const *maps;
    /* Mapped, register_threads > 0: each mapping's length; the pipeline
     * registers and unregisters the mappings itself, in pieces. */
    const uint64_t *map_lens;
    /* The destination: the slab's host bytes (direct) or its base address
     * as the engine understands it (staged, mapped). */
    uint8_t *host_dst;
    /* Direct: may be NULL. Called by a reader before it writes a chunk, with
     * the range from the chunk's start to the next chunk's (the first from 0,
     * the last to UINT64_MAX: the slab's end), so that every byte of the
     * slab, the gaps between tensors included, is prepared once. */
    int (*prepare)(void *ctx, uint64_t offset, uint64_t len, wb_err *err);
    void *prepare_ctx;
    void *dst;
    /* Staged: may be NULL. Called once, on the thread that runs the
     * pipeline, after the readers have started and before the first copy,
     * to set dst (and the ring's engine, which readers never touch): the
     * destination is allocated while the first chunks are read into the
     * ring. A failure stops the load with its error before any copy. */
    int (*before_copy)(void *ctx, struct wb_stage_job *job, wb_err *err);
    void *before_copy_ctx;
    wb_staging *staging;      /* staged: the ring; mapped: only its engine */
    wb_copy_engine *engine;   /* mapped: the engine (staged uses the ring's) */
    wb_stage_config cfg;      /* threads and chunk size (staged: chunk = buffer size) */
    const atomic_int *cancel; /* may be NULL; nonzero stops the load (WB_ESTATE) */
    _Atomic uint64_t *landed; /* may be NULL; tensor bytes in place so far */
} wb_stage_job;

/* What a load did. Reader and hasher figures are summed over threads; the
 * stage's rate is bytes / (busy seconds / threads), i.e. how fast that stage
 * ran while it was busy. */
typedef struct wb_stage_stats {
    int mode;
    uint64_t bytes; /* tensor bytes */
    unsigned threads;
    uint64_t chunk_bytes;
    unsigned buffers;
    uint64_t chunks;
    double seconds;       /* the whole pipeline, wall clock */
    double read_busy;     /* summed seconds in pread (or memcpy) */
    double hash_busy;     /* summed seconds in XXH3 */
    double wait_busy;     /* summed seconds readers waited for a buffer or a turn */
    double copy_seconds;  /* copy stage: first copy's start to last one's end */
    double first_copy_at; /* staged: seconds from the pipeline's start to its first copy */
    double plan_at;       /* seconds from the pipeline's start to the readers handed their work */
    double readers_at;    /* seconds from the pipeline's start to its last reader's start */
    double first_fill_at; /* staged: ... to the first staging buffer filled */
    uint64_t copy_calls;  /* staged: calls to the engine (a batch is one) */
    int read_source;      /* wb_stage_read the readers used (direct, staged) */
    double register_seconds; /* mapped in pieces: summed over the registering threads */
} wb_stage_stats;

/* Progress of one load: the loader thread writes it, the broker's event
 * loop reads it (wbctl's progress bar). */
typedef struct wb_load_progress {
    _Atomic uint64_t total;  /* tensor bytes, once the headers are read */
    _Atomic uint64_t landed; /* tensor bytes in place */
} wb_load_progress;

/* Runs the pipeline. On success every tensor's xxh3 is set and its bytes are
 * in place. On failure returns the first error (a read error or short file
 * names the file and tensor; WB_ESTATE for a cancel), after every thread has
 * stopped and every queued copy has finished: nothing is left running and
 * the staging ring can be reused. */
int wb__stage_run(wb_stage_job *job, wb_stage_stats *stats, wb_err *err);

/* The readers of direct and staged loads are a crew of threads kept from
 * one load to the next (created by the first load that needs them, grown
 * when a load asks for more), not threads created for each load: a load's
 * readers start within tens of microseconds of its plan. One load at a
 * time uses the crew; a second running at the same time in the process
 * starts threads of its own. wb__stage_crew_stop ends the crew's threads (waiting for a load
 * still using them); a later load creates them again. */
void wb__stage_crew_stop(void);
/* Threads in the crew now; *created (may be NULL) gets how many the
 * process has created for it so far. */
unsigned wb__stage_crew_threads(unsigned *created);

/* The rate of a stage in GB/s from its busy seconds, or 0. */
double wb__stage_gbps(uint64_t bytes, double busy, unsigned threads);

#endif
