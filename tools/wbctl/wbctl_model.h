/* How wbctl shows a model: the row of `wbctl models` (also printed by load),
 * its JSON object, and the loader's stage line. */
#ifndef WBCTL_MODEL_H
#define WBCTL_MODEL_H

#include "wbctl_out.h"
#include "wire.h"

/* Every column of the models table (-o wide); the default view shows
 * some of them. */
#define WBCTL_MODEL_COLUMNS 16

/* The header of table t (made with .ncols = WBCTL_MODEL_COLUMNS): the
 * default columns, or every one when t->wide. */
void wbctl_model_header(wbctl_table *t);
/* One row, or one per device for a model on devices. */
void wbctl_model_row(wbctl_table *t, const Wbproto__ModelInfo *m);
/* Prints "NAME on device D (UUID) failed: why" for each failed copy, or
 * "NAME failed to load: why" for the record of a failed load. */
void wbctl_model_failures(const Wbproto__ModelInfo *m);
json_t *wbctl_model_json(const Wbproto__ModelInfo *m);
/* A version's state as people read it: "current" for the version new
 * leases get, else loading, ready, draining or failed; a ready version off
 * its device says its tier instead ("host", "evicted", ...). */
const char *wbctl_version_state(const Wbproto__ModelInfo *m);
/* The model's tier (the device memory budget's): "device" (also for the
 * empty string of a broker that predates tiers), "moving", "host",
 * "restoring", "evicted" or "reloading", as the broker sent it. */
const char *wbctl_model_tier(const Wbproto__ModelInfo *m);
/* One version's entry of `wbctl models --json`'s "versions". */
json_t *wbctl_version_json(const Wbproto__ModelInfo *m);
/* One line per load for people: how each stage did, rates in GiB/s. */
void wbctl_print_stages(const Wbproto__ModelInfo *m);

#endif
