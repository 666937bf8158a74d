/* Publishes: a new version of a model whose bytes a live process (the
 * producer) holds. The broker pulls: the producer names its table
 * (PublishBeginRequest), the broker reserves the version's slabs and lists
 * it `loading`; the producer sends memfds of host bytes on the descriptor
 * channel ("WBP1") or names CUDA IPC handles of its own allocations, and at
 * PublishCommitRequest the loader thread opens that memory, copies it once
 * into the slabs and closes it. Only then does the version become current,
 * exactly as a rollout's does. No peer ever writes broker memory.
 *
 * A publish belongs to the connection that began it (its serial) and to
 * that peer's identity. It ends with its commit, an abort, the connection's
 * end, the death of its process, or an unload of the name: everything it
 * reserved is freed and the current version is untouched. A commit whose
 * copy is running when the producer goes completes: the broker holds its
 * own references to the producer's memory (the memfds, the IPC mappings). */
#ifndef WB_BROKER_PUBLISH_H
#define WB_BROKER_PUBLISH_H

#include "broker.h"

#include <stddef.h>
#include <stdint.h>

#define WB_PUBLISH_ID_LEN 16
/* Memfds one publish may be sent, and sources one commit may name. */
#define WB_PUBLISH_MAX_FDS     64
#define WB_PUBLISH_MAX_SOURCES 64

/* One producer's memory a commit names (PublishSource), as the copy reads
 * it: a memfd (host) or a CUDA allocation. */
typedef struct wb_publish_source {
    int fd;        /* a memfd of the publish (not owned here), or -1 */
    uint64_t size; /* bytes the source holds */
    uint8_t handle[64];
    int has_handle;
    char uuid[64]; /* the device the handle names */
    int device;    /* its broker ordinal, -1 when unknown */
} wb_publish_source;

/* Where one tensor of the new version comes from. */
typedef struct wb_publish_piece {
    int kept;        /* 1: from the current version's slab (a partial publish) */
    uint32_t source; /* else: index into sources */
    uint64_t offset; /* bytes from the source's start, or in the kept slab */
} wb_publish_piece;

typedef struct wb_publish {
    uint8_t id[WB_PUBLISH_ID_LEN];
    char *name;      /* owned */
    wb_model *model; /* the reserved version, MODEL_LOADING, in the registry; NULL once unloaded */
    uint32_t version;
    uint32_t beside; /* the version current at begin; 0 for a new model */
    uint64_t owner;  /* the connection that began it */
    wb_peer_creds creds;
    int partial;
    uint8_t *named; /* per tensor of data: 1 when the begin's table named it */
    /* The reserved slabs and the table, laid out as the loader lays a
     * load out; moved to the copy job at commit. */
    wb_model_data data;
    uint64_t bytes; /* slab bytes reserved */
    int fds[WB_PUBLISH_MAX_FDS];
    uint64_t fd_sizes[WB_PUBLISH_MAX_FDS];
    unsigned n_fds;
    /* The commit's plan, while its copy runs (owned). */
    int committing;
    wb_publish_source *sources;
    unsigned n_sources;
    wb_publish_piece *pieces; /* one per tensor of data */
    /* The current version whose bytes a partial publish keeps: held (one
     * lease counted) while the copy runs, so that it cannot be freed. */
    wb_model *keep;
    /* Set by the loop: the name was unloaded while the copy ran; the
     * producer's connection ended or its process died meanwhile. */
    int cancelled;
    int owner_gone;
    double begun_at;
    struct wb_publish *next;
} wb_publish;

/* The publish with this id, or NULL. */
wb_publish *wb__publish_find(const wb_broker *b, const uint8_t *id, size_t len);

/* Ends a publish that is not committing: its slabs freed, its record
 * removed from the registry, its descriptors closed; counted as failed and
 * logged (event=publish_aborted reason=`reason`). */
void wb__publish_end(wb_broker *b, wb_publish *p, const char *reason);

/* The same without counting or logging: the publish leaves the list, its
 * model record (when it still has one) the registry, and what it holds is
 * freed. */
void wb__publish_release(wb_broker *b, wb_publish *p);

/* The connection `serial` closed: its publishes that are not committing
 * end (reason=connection_closed). */
void wb__publish_conn_closed(wb_broker *b, uint64_t serial);

/* The process `pid` is proven dead: its publishes that are not committing
 * end (reason=process_exit). */
void wb__publish_pid_dead(wb_broker *b, uint32_t pid);

/* The reserved version m (m->publish set) is unloaded or cancelled by
 * `peer`: a publish that is not committing ends now; a committing one
 * loses its model (the copy's result is freed when it ends). The model
 * record is removed and freed. */
void wb__publish_unloaded(wb_broker *b, wb_model *m, const wb_peer_creds *peer);

/* Takes a memfd sent on the descriptor channel for publish `id` by a peer
 * with `creds` (the channel connection's): WB_OK and the publish owns fd;
 * else the status and a message, and the caller closes fd. */
int wb__publish_add_fd(wb_broker *b, const uint8_t *id, const wb_peer_creds *creds, int fd,
                       char *msg, size_t size);

/* Ends every publish (the broker is stopping); committing ones must have
 * been handed back by the loader. */
void wb__publish_clear(wb_broker *b);

/* The copy of a commit, on the loader thread (a job of kind
 * WB_JOB_PUBLISH): reads every source once into job->data's slabs (and the
 * kept tensors from the current version's) and sets job->rc, job->err and
 * the figures; the checksums come after the version is current. */
void wb__publish_copy_run(wb_load_job *job);
/* A checksum job (WB_JOB_CHECKSUM, on the checker thread): the published
 * version's bytes read back (device) or read in place (host) and hashed
 * into job->sum_xxh3. Then, on the loop,
 * wb__publish_checksums_done stores them, rebuilds the version's wire view
 * (later leases carry them) and unpins it. */
void wb__publish_checksum_run(wb_load_job *job);
void wb__publish_checksums_done(wb_broker *b, wb_load_job *job);
/* Queues the checksums of version m (current, its checksums pending): on
 * b->checker, or inline without one. m is pinned until they are done. */
void wb__publish_checksums_queue(wb_broker *b, wb_model *m);
/* Version m stopped being current: its checksum job (if any) is dropped;
 * wb__publish_checksums_done then unpins it and leaves it pending. */
void wb__publish_checksums_drop(wb_broker *b, wb_model *m);
/* WB_EIO with "WHAT[ for tensor 'TENSOR']: CUDA's message of cuda_error"
 * (a cudaError_t). */
int wb__publish_cuda_fail(wb_err *err, int cuda_error, const char *what, const char *tensor);
/* The cuda copy of a commit (publish_cuda.c), called by
 * wb__publish_copy_run; job->src_cache_slot is the broker's source cache. */
int wb__publish_copy_cuda(wb_load_job *job, wb_publish *p, wb_err *err);
/* A WB_JOB_FORGET job (loader thread): the cached handles of connection
 * job->forget_owner closed. */
void wb__publish_forget_run(wb_load_job *job);
/* Closes every cached handle and frees the cache (the loader stopped). */
typedef struct wb_src_cache wb_src_cache;
void wb__publish_src_cache_free(wb_src_cache **cache);
/* The connection `serial` (or every connection of process `pid`, serial
 * 0) ended: its cached handles are closed (a WB_JOB_FORGET job). */
void wb__publish_forget(wb_broker *b, uint64_t serial, uint32_t pid);
/* Frees the checker's pinned buffers (the checker stopped). */
typedef struct wb_sum_pool wb_sum_pool;
void wb__publish_sum_pool_free(wb_sum_pool **pool);

/* The copy of a commit ended (on the loop): the version becomes current,
 * or the publish ends with the copy's error. Builds the commit's reply in
 * r. */
struct wb_ops_reply;
void wb__publish_copy_done(wb_broker *b, wb_load_job *job, struct wb_ops_reply *r);

#endif
