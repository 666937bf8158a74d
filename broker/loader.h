/* Loading a checkpoint into a slab: judge the request (the path, the peer's
 * access to every file, the limits a file's bytes show), validate it with
 * the safetensors reader, lay its tensors out at WB_SLAB_ALIGN-aligned
 * offsets in one slab, and move them there through the pipeline of stage.h,
 * which checksums each tensor (XXH3-64) on the way: directly for the host
 * backend, through the pinned staging ring or registered file mappings for
 * the cuda backend.
 *
 * wb__load() does one load in the calling thread. wb_loader runs loads one
 * after another in a background thread and signals each completion through
 * an eventfd, so the broker's event loop keeps serving meanwhile: nothing of
 * a load, its checks included, touches a file on the loop's thread. */
#ifndef WB_BROKER_LOADER_H
#define WB_BROKER_LOADER_H

#include "auth_files.h"
#include "backend.h"
#include "err.h"
#include "models.h"
#include "quota.h"
#include "safetensors_table.h"
#include "stage.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wb_load_opts {
    const wb_backend *backend; /* its load_mode, stage config and staging ring are used */
    int device;
    /* May be NULL: `device` alone. The devices the copies go to (the
     * broker's ordinals, at most WB_GPU_MAX), one slab each; the file is read
     * once and copied to all of them in parallel (stage_fanout.h). A device
     * that fails gets a failed copy and the others stay ready. The host
     * backend ignores them and makes one copy in host memory. */
    const int *devices;
    unsigned n_devices;
    const wb_gpu_list *gpus;    /* may be NULL; the devices' UUIDs for the copies */
    const atomic_int *cancel;   /* may be NULL; polled, nonzero stops the load (WB_ESTATE) */
    wb_load_progress *progress; /* may be NULL; total and landed bytes, updated atomically */
    /* May be NULL; whose access every file the load opens is judged by
     * (wb__auth_check_peer_fd), both when its header is read and when its
     * data is. */
    const wb_load_access *access;
    /* For the message of a load that does not fit (NULL name: the path):
     * the model, the version it would be, and the version it would sit
     * beside (0: a load, not a rollout). Whether it fits is judged for
     * every load, by the backend's mem_free where it has one, before any
     * slab is allocated. */
    const char *name;
    uint32_t version;
    uint32_t beside;
    const char *verb; /* NULL: "load" or "rollout"; a publish's "publish" */
    /* May be NULL: nothing shared. Tensors equal to resident ones are not
     * loaded again, and the load's slabs are listed for later loads
     * (share.h). */
    struct wb_share_index *share;
    /* May be NULL: no budget. The device memory budget (tier.h) judged
     * with the free memory; a load that passes reserves its slabs there
     * (*budget_reserved, given back by the loop), one refused for it sets
     * *budget_retry when moving models could make room, and budget_wait_ms
     * > 0 waits that long for room first. */
    struct wb_budget *budget;
    uint64_t *budget_reserved;
    uint64_t *budget_need;
    int *budget_retry;
    int budget_wait_ms;
} wb_load_opts;

/* Loads `path` into a new slab per device. On success *out owns the slabs,
 * the copies (at least one ready) and the tensor table and carries the
 * per-stage figures. On failure nothing is left allocated and the message
 * names the file (and tensor, or device) at fault. */
int wb__load_ex(const char *path, const wb_load_opts *opts, wb_model_data *out, wb_err *err);

/* The loader's steps, shared with publishes (publish.h). Copies the
 * table's description of the tensors into d and lays them out at
 * WB_SLAB_ALIGN-aligned offsets in one slab, whose size goes to *size. */
int wb__load_layout(const wb_st_table *table, wb_model_data *d, uint64_t *size, wb_err *err);
/* WB_ENOMEM, before anything is allocated, when a slab of `size` bytes does
 * not fit on one of the n devices by the backend's mem_free ("rollout of
 * 'X' (version 3) does not fit beside version 2 ...: needs ..., ... free").
 * `path` names the load when o->name is NULL. */
int wb__load_check_fits(const wb_load_opts *o, const char *path, const int *devs, unsigned n,
                        uint64_t size, wb_err *err);
/* Allocates one slab of `size` bytes per device into d (a device that
 * fails gets a failed copy when there are several). */
int wb__load_alloc_copies(const wb_load_opts *o, const int *devs, unsigned n, uint64_t size,
                          wb_model_data *d, wb_err *err);

/* wb__load_ex without progress reporting. */
int wb__load(const char *path, const wb_backend *be, int device, const atomic_int *cancel,
             wb_model_data *out, wb_err *err);

/* Logs one greppable line per stage of a finished load:
 * event=load_stage model=X stage=read|hash|copy|total bytes= seconds= gbps= ... */
void wb__load_log_stages(const char *model, const wb_model_data *d);

/* Fills ModelInfo's loading fields (20-39): for a loading model its progress,
 * for a loaded one its per-stage figures. Strings point to static storage. */
void wb__load_fill_model_info(const wb_model *m, Wbproto__ModelInfo *mi);

/* Fills StatsReply's loading fields (20-39): the backend's staging ring and
 * the progress of loads in progress. */
void wb__load_fill_stats(const wb_backend *be, const wb_model_registry *models,
                         Wbproto__StatsReply *s);

/* What a job does (wb_load_job.kind): a load, or a publish's copy
 * (publish.h). */
enum {
    WB_JOB_LOAD = 0,
    WB_JOB_PUBLISH = 1,
    WB_JOB_CHECKSUM = 2,
    WB_JOB_FORGET = 3,
    WB_JOB_TIER = 4
};

/* What a tier job does (wb_load_job.tier_op). A reload is a load of the
 * model's files (the job's name, path and devices) on the tier thread. */
enum { WB_TIER_OP_MOVE = 1, WB_TIER_OP_RESTORE = 2, WB_TIER_OP_RELOAD = 3 };

typedef struct wb_load_job {
    int kind;
    /* A publish's copy: the publish (owned by the broker's list, kept
     * while the copy runs), and the copy's figures. */
    struct wb_publish *publish;
    double copy_seconds;
    uint64_t copied_bytes, kept_bytes;
    /* A cuda copy's GPU time (events), the time opening the producer's
     * handles, and how many were opened and how many found open in the
     * broker's source cache (publish_cuda.c; the slot is the broker's and
     * only the loader thread touches the cache). */
    double copy_gpu_seconds, src_open_seconds;
    unsigned copy_streams;  /* streams per device (0: the default) */
    char copy_devices[160]; /* "DEVICE:GPU_SECONDS,..." of a cuda copy */
    uint32_t sources_opened, sources_reused;
    struct wb_src_cache **src_cache_slot;
    /* A WB_JOB_FORGET job: the connection whose cached handles are closed. */
    uint64_t forget_owner;
    /* A checksum job (WB_JOB_CHECKSUM): the version it reads (pinned by one
     * count on its leases while the job runs, so that it is not freed), the
     * device and slab it reads, and the XXH3 of each tensor it finds (owned;
     * model->data.tensors order). */
    struct wb_model *sum_model;
    int sum_host; /* sum_ptr is the slab's host memory, not a device's */
    int sum_device;
    const void *sum_ptr;
    uint64_t *sum_xxh3;
    double sum_seconds;
    double sum_queued_at; /* CLOCK_MONOTONIC seconds of the commit: the hold's start */
    /* The broker's pinned read-back buffers (made at the first job) and
     * the pool the job uses; the checker thread alone touches them. */
    struct wb_sum_pool **sum_pool_slot;
    struct wb_sum_pool *sum_pool;
    /* A tier job (tier.h): the model (pinned by one count on its leases),
     * its host copy and that copy's bytes (a move makes it; owned by the
     * job until the loop takes it), the slabs a restore made (one per copy,
     * owned likewise), and the time it took. */
    int tier_op;
    struct wb_model *tier_model;
    void *tier_host;
    uint64_t tier_bytes;
    wb_slab *tier_slabs;
    struct wb_share_hold **tier_holds; /* a move's: the slabs' holds (not owned) */
    uint32_t tier_n;
    uint64_t tier_slab_size; /* a restore's slabs: as they were */
    int tier_ran;            /* the tier thread ran it */
    double tier_seconds;
    /* The device memory budget a load is judged by (NULL: none), what its
     * check reserved there, budget_retry: it was refused for the budget and
     * moves could make room, budget_wait_ms: its next run waits for room. */
    struct wb_budget *budget;
    uint64_t budget_reserved;
    uint64_t budget_need;
    int budget_retry;
    int budget_wait_ms;
    char *name; /* owned */
    char *path; /* owned */
    const wb_backend *backend;
    int device;
    unsigned n_devices; /* 0: `device` alone */
    int devices[WB_GPU_MAX];
    const wb_gpu_list *gpus; /* may be NULL; not owned */
    /* The broker's shared-tensor index (share.h), or NULL: this load
     * neither shares nor is shared from (--no-share-tensors, a load's
     * no_share). Not owned. */
    struct wb_share_index *share;
    int no_share; /* set before wb__broker_set_devices: share stays NULL */
    /* Who asked, so the deferred reply can be sent: the connection's
     * identity (its serial, conn.h; owned copy) and the request id. ident
     * is NULL for preloads. */
    uint8_t *ident;
    size_t ident_len;
    uint64_t request_id;
    /* Where the loader reports progress; the loop reads it through the
     * loading model (wb_model.job). In the job, not the model, so that a
     * model unloaded while loading can go at once. */
    wb_load_progress progress;
    /* Set by the loop to stop the load (wb__loader_cancel); the loader
     * polls it. */
    atomic_int cancel;
    /* Whose access the load's files are judged by (zeroed: nobody's). */
    wb_load_access access;
    /* 1: the request is judged before anything is read (the broker's loads
     * and preloads): the path (wb__auth_check_load_path), the peer's access
     * to it and then to every file the reader opens, each on the descriptor
     * it reads, and the limits that a file's bytes show (header lengths, an
     * index's entries and shards), all before any header is parsed. */
    int check;
    wb_limits limits; /* what the checks judge by (a copy of the broker's) */
    /* The outcome, set by the loader thread. `refused`: the checks refused
     * the load (rc and err say why); nothing of it was read. */
    int rc;
    int refused;
    wb_err err;
    wb_model_data data;
    /* The loop's own fields (the loader never reads them). keep_failed: a
     * load that fails leaves its model listed MODEL_FAILED instead of
     * removing it (nobody waits for its reply, or it replaced such a
     * record). cancelled: the model was unloaded while loading
     * (WB_LOAD_CANCELLED or WB_LOAD_UNLOADED), by cancel_pid and
     * cancel_uid; its model has left the registry. */
    int keep_failed;
    int cancelled;
    uint32_t cancel_pid, cancel_uid;
    /* The version this job loads, and for a rollout (RolloutRequest) the
     * version that was current when it started (beside). `op`: the
     * request's body (WBPROTO__REQUEST__BODY_LOAD or _ROLLOUT) its deferred
     * reply answers. Once it finished: the version it replaced and when it
     * became current (wall clock; 0: not current). */
    uint32_t version;
    uint32_t beside;
    int rollout;
    uint32_t op;
    uint32_t previous;
    double current_at;
    struct wb_load_job *next;
} wb_load_job;

/* How a load was stopped (wb_load_job.cancelled). */
enum { WB_LOAD_CANCELLED = 1, WB_LOAD_UNLOADED = 2 };

/* A new job with copies of name, path and ident; NULL when out of memory. */
wb_load_job *wb__load_job_new(const char *name, const char *path, const wb_backend *be, int device,
                              const void *ident, size_t ident_len, uint64_t request_id);
/* Runs the job's checks (job->check) and load in the calling thread (the
 * loader thread, or the broker's when it has none) and sets job->rc,
 * job->refused, job->err and job->data. The load stops (WB_ESTATE) when
 * `cancel` becomes nonzero, or with `cancel` NULL the job's own flag. Logs
 * the checked path (event=load_path) or its refusal
 * (event=load_path_refused). Memory the load freed (an index's parse takes
 * hundreds of megabytes) is given back to the system before it returns. */
void wb__load_job_run(wb_load_job *job, const atomic_int *cancel);
/* Frees the job and whatever result it still owns; sets *job to NULL. */
void wb__load_job_free(wb_load_job **job);

typedef struct wb_loader {
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    wb_load_job *queue;   /* waiting, in order */
    wb_load_job *current; /* the one being loaded, or NULL */
    wb_load_job *done;    /* finished, in order */
    int stop;
    int efd; /* eventfd: readable when a job has finished */
} wb_loader;

/* Creates the eventfd and starts the thread. Block the signals the process
 * handles before calling this, so that the thread inherits the mask. */
int wb__loader_start(wb_loader *l, wb_err *err);
/* Queues a job; the loader owns it until wb__loader_take_done returns it. */
void wb__loader_submit(wb_loader *l, wb_load_job *job);
/* Stops a job submitted to the loader: one still queued is handed back at
 * once (as finished, rc WB_ESTATE) without having started; the one loading
 * stops at its next check of the job's cancel flag (between chunks, and
 * before each file is opened) and frees what it had made; one finished
 * already is left as it is. The job stays the loader's until
 * wb__loader_take_done returns it. Returns 1 when it had not started. */
int wb__loader_cancel(wb_loader *l, wb_load_job *job);
/* Drains the eventfd and returns the finished jobs in order (a list linked
 * by `next`, owned by the caller), or NULL. */
wb_load_job *wb__loader_take_done(wb_loader *l);
/* Cancels the running load, stops the thread, and returns every job it had
 * not finished or handed back (their rc is WB_ESTATE). Closes the eventfd. */
wb_load_job *wb__loader_stop(wb_loader *l);

#endif
