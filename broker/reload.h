/* SIGHUP: the configuration file read again with the command line the
 * broker was started with (its flags still win, as at start), and what can
 * change while the broker serves applied at once, on the loop's thread
 * between two turns, so that no request sees half of it:
 *
 *   the limits on what peers may make the broker hold: max-leases-per-client,
 *     max-models, max-versions, max-tensors, max-shards, max-header-bytes;
 *   the access lists: allow-uid, allow-gid, admin-uid, admin-gid;
 *   the log level.
 *
 * New requests are judged by the new values; what is held already (leases,
 * loaded models, open connections, a load under way with the limits it
 * started with) is kept. Everything else that changed (the socket, backend,
 * device, slab kinds, loading settings, liveness, max-message-bytes, which
 * also bounds the transport, the transport bounds, the log format, the
 * metrics endpoint, the preloaded models) is reported as not applied until
 * a restart. A file that is now wrong is reported with its FILE:LINE error
 * and changes nothing.
 *
 * One line says what happened: event=config_reload result=applied
 * changed="max-models=2 log-level=debug", result=unchanged,
 * result=restart_needed not_applied="..." note="restart to apply",
 * result=failed error="FILE:LINE: ...", or result=skipped without --config. */
#ifndef WB_BROKER_RELOAD_H
#define WB_BROKER_RELOAD_H

#include "broker.h"
#include "options.h"

typedef struct wb_reload_plan {
    wb_limits limits; /* the broker's limits after the reload */
    int log_level;    /* the log level after it (a wb_log_level) */
    /* Space-separated "key=value" items: what changes now, and what changed
     * but waits for a restart; empty strings when nothing. */
    char applied[2048];
    char not_applied[2048];
} wb_reload_plan;

/* Compares `next` (wb__options_reparse) with what runs: the broker's
 * limits and access lists and the process's log level for what can change
 * live, `running` (the options the broker started with) for the rest. */
void wb__reload_plan(const wb_options *running, const wb_broker *b, const wb_options *next,
                     wb_reload_plan *plan);

/* Applies a plan: the limits, the access lists (moved out of `next`,
 * replacing the broker's whole), the log level. */
void wb__reload_apply(wb_broker *b, wb_options *next, const wb_reload_plan *plan);

/* The SIGHUP action (wb_loop_reload.fn); ctx is the running wb_options.
 * Reparses, plans, logs the line above, then applies. */
void wb__reload(void *ctx, wb_broker *b);

#endif
