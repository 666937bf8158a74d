/* A device memory budget with a host tier (--device-memory-budget,
 * --host-memory-budget).
 *
 * The budget caps the bytes of slabs on each device (own slabs of every
 * model and version, loads and restores under way, slabs kept for the
 * borrowers of a shared tensor). When a load, a rollout or a restore would
 * go over it, models with no lease are moved to the host tier, least
 * recently used first (their last acquire or release, else their load):
 * their own slabs' bytes are copied to host memory (pinned for cuda) and
 * the slabs freed ("host"). When the host tier's budget is exceeded too,
 * host copies are dropped, least recently used first, and those models
 * are "evicted": they reload from their files. A leased model is never
 * moved; a published version (no file) is never dropped.
 *
 * An acquire of a model that is not on its device starts its restore (from
 * the host copy, or a reload from its files whose tensors must match the
 * checksums recorded at its load) and is answered WB_EBUSY with
 * Reply.retry_after_ms: libwbclient asks again until the model is back or
 * its timeout ends. `wbctl sleep` and `wbctl wake` move one on demand.
 *
 * Moves and restores run one after another on the tier thread (a wb_loader
 * of its own: a restore never waits behind a load); a move's room is made
 * before the restore that needs it is queued, so the order of the queue
 * keeps the budget. Loads judge the budget on the loader thread before
 * they allocate (wb__budget_fits); one refused for it comes back to the
 * loop, which makes room and starts it again. */
#ifndef WB_BROKER_TIER_H
#define WB_BROKER_TIER_H

#include "devlist.h"
#include "err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

enum {
    WB_TIER_DEVICE = 0,
    WB_TIER_MOVING = 1,
    WB_TIER_HOST = 2,
    WB_TIER_RESTORING = 3,
    WB_TIER_EVICTED = 4,
    WB_TIER_RELOADING = 5
};

/* "device", "moving", "host", "restoring", "evicted", "reloading". */
const char *wb__tier_name(int tier);

/* Slot 0 is host memory (device -1: the host backend's slabs), slot d + 1
 * device d. */
#define WB_TIER_SLOTS (WB_GPU_MAX + 1)

/* The budget as the loader thread reads it. The loop counts what is on
 * each device (used: slabs of every record, the share index's orphans,
 * restores under way) after every change it makes; a load past its check
 * adds its slabs to reserved until the loop has taken its result. */
typedef struct wb_budget {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t limit[WB_TIER_SLOTS]; /* 0: no budget on the slot */
    uint64_t used[WB_TIER_SLOTS];
    uint64_t reserved[WB_TIER_SLOTS];
} wb_budget;

/* What the operator asked for: bytes, or a percent of each device's memory
 * (of the machine's for host memory); zero: none. */
typedef struct wb_tier_config {
    uint64_t device_bytes;
    unsigned device_pct;
    uint64_t host_bytes;
    unsigned host_pct;
} wb_tier_config;

/* Parses "BYTES" (with an optional k, M, G or T suffix, powers of 1024, or
 * kB/MB/GB/TB powers of 1000) or "N%" (1..100). WB_EINVAL naming `what`. */
int wb__tier_parse_size(const char *what, const char *s, uint64_t *bytes, unsigned *pct,
                        wb_err *err);

/* Whether a load's slabs of `size` bytes each fit the budget of the n
 * devices (NULL budget, or no limit on a slot: they do). WB_OK reserves
 * them (*reserved = size). Else WB_ENOMEM with the device, the bytes in use
 * and the budget, and *retry 1 when moving other models could make room
 * (size alone is within the budget). wait_ms > 0: waits up to that long for
 * room first (polling cancel). Loader thread. */
int wb__budget_fits(wb_budget *bg, const char *what, const int *devs, unsigned n, uint64_t size,
                    int wait_ms, const atomic_int *cancel, uint64_t *reserved, int *retry,
                    wb_err *err);
/* An empty budget (no limits), its condition variable on the monotonic
 * clock. */
void wb__budget_init(wb_budget *bg);
/* Gives back what wb__budget_fits reserved. */
void wb__budget_unreserve(wb_budget *bg, const int *devs, unsigned n, uint64_t size);

struct wb_broker;
struct wb_model;
struct wb_load_job;
struct wb_ops_reply;

/* Resolves the budgets against the backend's devices (percent: of
 * mem_total) into b->budget, and logs them (event=memory_budget). No budget
 * asked: b->budget stays NULL and nothing here acts. */
int wb__tier_setup(struct wb_broker *b, const wb_tier_config *cfg, wb_err *err);
void wb__tier_destroy(struct wb_broker *b);

/* Counts what is on each device again (after the loop changed anything). */
void wb__tier_refresh(struct wb_broker *b);

/* An acquire or release of m: it is the most recently used. */
void wb__tier_touch(struct wb_broker *b, struct wb_model *m);

/* Frees room for `need` bytes on each of the n devices by moving models
 * (never `except`): WB_OK when the room is there once the moves queued
 * have run, else WB_ENOMEM saying what holds the device. */
int wb__tier_make_room(struct wb_broker *b, const int *devs, unsigned n, uint64_t need,
                       const struct wb_model *except, wb_err *err);

/* An acquire of m, which is not on its device: starts its restore when
 * none runs and makes r the WB_EBUSY reply that says to ask again, or the
 * error of its last restore (once), or why it cannot come back. */
int wb__tier_acquire(struct wb_broker *b, struct wb_model *m, struct wb_ops_reply *r);

/* `wbctl sleep`: moves m (no lease) to the host tier, or drops it when the
 * host tier has no room. `wbctl wake`: brings it back. WB_OK when done or
 * under way. */
int wb__tier_sleep(struct wb_broker *b, struct wb_model *m, wb_err *err);
int wb__tier_wake(struct wb_broker *b, struct wb_model *m, wb_err *err);

/* A load refused by the budget (job->budget_retry) comes back here from the
 * loader: room is made and the job submitted again (returns 1: the loop
 * does not finish it), or its error says why there is none (returns 0).
 * Every load job's reservation is given back here first. */
int wb__tier_load_back(struct wb_broker *b, struct wb_load_job *job);

/* Queues a move, restore or reload of m (WB_TIER_OP_*) on the tier thread
 * (inline without one); m is pinned until wb__tier_done. A move copies
 * into `spare` (a kept host buffer of m->host_bytes, or NULL: allocated). */
int wb__tier_submit(struct wb_broker *b, struct wb_model *m, int op, void *spare, wb_err *err);
/* Host buffers kept for reuse: their bytes, and their release. */
uint64_t wb__tier_spare_bytes(const struct wb_broker *b);
void wb__tier_free_spares(struct wb_broker *b);

/* A test hook (WB_TEST_TIER_DELAY_MS in wbrokerd's environment): every
 * move and restore waits this long first, so that tests can act while one
 * is under way. */
extern int wb__tier_test_delay_ms;

/* The size of the first own slab of d that has memory (every copy's is
 * the same), or 0. */
struct wb_model_data;
uint64_t wb__tier_slab_size(const struct wb_model_data *d);

/* Frees m's own slabs on its devices (a slab others borrow stays with
 * them), withdrawn from the share index; remembers their size for the
 * restore. freed: a move's job freed them already (forgotten only). */
void wb__tier_free_slabs(struct wb_broker *b, struct wb_model *m, int freed);
/* Drops m from both tiers (its slabs if on its device, its borrowed
 * tensors, its host copy): evicted, it reloads from its files. */
void wb__tier_drop(struct wb_broker *b, struct wb_model *m, const char *reason);

/* Frees what a tier job still owns: a restore's slabs (it failed, or
 * nobody took them), a move's host copy not taken. */
void wb__tier_job_release(struct wb_load_job *job);

/* The tier thread's work (loader.c dispatches WB_JOB_TIER here), and the
 * loop's end of it. */
void wb__tier_job_run(struct wb_load_job *job);
void wb__tier_done(struct wb_broker *b, struct wb_load_job *job);

#endif
