/* The broker's state, independent of the transport: configuration, models,
 * leases, counters and the clocks. The request handlers (ops.h) and the
 * event loop (loop.h) work on it; unit tests drive it without sockets. */
#ifndef WB_BROKER_BROKER_H
#define WB_BROKER_BROKER_H

#include "backend.h"
#include "leases.h"
#include "loader.h"
#include "models.h"

#include <stdint.h>

#define WB_DEFAULT_HEARTBEAT_MS 1000
#define WB_DEFAULT_STALE_MS     5000

typedef struct wb_broker_config {
    const wb_backend *backend;
    int device; /* -1 for host */
    uint32_t heartbeat_ms;
    uint32_t stale_ms;
} wb_broker_config;

typedef struct wb_broker_stats {
    uint64_t requests_total;
    uint64_t requests_failed;
    uint64_t malformed_messages;
    uint64_t replies_dropped;
    uint64_t leases_granted;
    uint64_t leases_released;
    uint64_t leases_reclaimed;
    uint64_t loads_total;
    uint64_t loads_failed;
    uint64_t load_bytes_total;
    double load_seconds_total;
} wb_broker_stats;

typedef struct wb_broker {
    wb_broker_config cfg;
    wb_model_registry models;
    wb_lease_table leases;
    wb_broker_stats stats;
    uint32_t euid;
    uint32_t pid;
    /* Clocks: monotonic milliseconds for liveness, Unix seconds for
     * reports. Tests replace them. */
    int64_t (*now_ms)(void);
    double (*now_wall)(void);
    int64_t started_ms;
    /* Background loads; NULL runs loads inline (preloads, unit tests). */
    wb_loader *loader;
} wb_broker;

int64_t wb__clock_mono_ms(void);
double wb__clock_wall(void);

void wb__broker_init(wb_broker *b, const wb_broker_config *cfg);
/* Frees every model (unlinking its slab names) and every lease. */
void wb__broker_destroy(wb_broker *b);

/* Bookkeeping after a lease on m ended (release or reclaim): a draining model
 * whose last lease this was is freed and removed. Returns the model's state
 * afterwards (MODEL_FREED in that case). */
int wb__broker_lease_ended(wb_broker *b, wb_model *m);

/* Frees a model now: logs event=model_freed, removes it from the registry. */
void wb__broker_free_model(wb_broker *b, wb_model *m);

/* Reclaims every lease of a process proven dead. Returns how many. */
size_t wb__broker_reclaim_pid(wb_broker *b, uint32_t pid);

/* Marks leases stale whose heartbeats stopped. Returns how many changed. */
size_t wb__broker_scan_stale(wb_broker *b);

/* Finishes a load (inline or from the loader thread): on success the model
 * named by the job becomes ready; on failure it is removed. Counts the load
 * and logs it. Returns the job's status; *model is the ready model or NULL. */
int wb__broker_finish_load(wb_broker *b, wb_load_job *job, wb_model **model);

/* Loads a model before serving (--model NAME=PATH), in the calling thread. */
int wb__broker_preload(wb_broker *b, const char *name, const char *path, wb_err *err);

#endif
