/* One load, several devices: a copy engine (stage.h) that queues every copy
 * to each device's own engine (its stream and events), so that the file is
 * read once into the staging ring and each chunk goes to every device, all
 * devices copying in parallel. A staging buffer counts as copied, and may be
 * refilled, only when the copies to every device still in the load are done.
 *
 * A device whose copy fails (or that fails to start) leaves the load: its
 * target is marked failed with the reason, and the other devices go on. The
 * engine fails only when no device is left. The pipeline sees the slab of
 * the first target as the destination; each target gets the same offsets
 * in its own slab. */
#ifndef WB_BROKER_STAGE_FANOUT_H
#define WB_BROKER_STAGE_FANOUT_H

#include "err.h"
#include "stage.h"

#include <stdint.h>

typedef struct wb_stage_fanout_target {
    int device;             /* for messages */
    wb_copy_engine *engine; /* the device's own; not owned */
    uint8_t *dst;           /* the device slab's base */
    int failed;             /* set when a copy to it failed (or it was failed before) */
    wb_err err;             /* why */
    double copy_seconds;    /* its engine's device time, or -1 */
} wb_stage_fanout_target;

typedef struct wb_stage_fanout {
    wb_copy_engine engine; /* what the pipeline calls */
    uint8_t *base;         /* the address the pipeline sees as the slab's base */
    unsigned n;
    wb_stage_fanout_target *t; /* not owned */
} wb_stage_fanout;

/* Sets f up over n targets (targets already marked failed are skipped). The
 * pipeline's job takes f->engine and f->base as its destination. When every
 * target has failed already, returns the first one's code with every
 * device's reason; WB_EINVAL for no target at all. */
int wb__stage_fanout_init(wb_stage_fanout *f, wb_stage_fanout_target *targets, unsigned n,
                          wb_err *err);

/* Marks target i failed with `why` (the first reason is kept). */
void wb__stage_fanout_fail(wb_stage_fanout *f, unsigned i, const wb_err *why);

/* Targets not failed. */
unsigned wb__stage_fanout_live(const wb_stage_fanout *f);

#endif
