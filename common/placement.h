/* Where a model's copies go: the text after '@' in "--model NAME=PATH@0,1",
 * or a configuration file's `devices =`.
 *
 *   all                  every device the broker sees
 *   0,1                  device ordinals, as the broker sees them
 *   GPU-3b1e...,1        UUIDs (as nvidia-smi -L prints them) and ordinals mixed
 *
 * Parsing is pure and separate from resolving against the broker's device
 * list (devlist.h), so that a file can be checked on a machine without the
 * devices. */
#ifndef WB_PLACEMENT_H
#define WB_PLACEMENT_H

#include "devlist.h"
#include "err.h"

#include <stddef.h>

/* Devices one placement may name. */
#define WB_PLACEMENT_MAX 16
/* Placement texts longer than this are refused. */
#define WB_PLACEMENT_TEXT_MAX 1024

typedef struct wb_placement_item {
    int index;                   /* an ordinal, or -1 when `uuid` names the device */
    char uuid[WB_GPU_UUID_SIZE]; /* "" for an ordinal */
} wb_placement_item;

typedef struct wb_placement {
    int all; /* "all": every device; n is 0 */
    unsigned n;
    wb_placement_item items[WB_PLACEMENT_MAX];
} wb_placement;

/* Parses `len` bytes of `text` (one leading '@' is allowed). WB_EINVAL for
 * anything else, with a message that quotes the text and gives the 1-based
 * position of the fault: "placement '0,x': position 3: 'x' is not a device
 * ordinal, 'all' or a GPU UUID". An empty text is an error too. */
int wb__placement_parse(const char *text, size_t len, wb_placement *out, wb_err *err);

/* Resolves a placement against the devices the broker sees: out[] gets the
 * ordinals (in the placement's order; "all": the list's order) and *n their
 * number. WB_ENOGPU when a device is not in the list (the message names it
 * and lists what is there), WB_EINVAL when one device is named twice, and
 * WB_ENOGPU for "all" with an empty list. `out` has room for WB_GPU_MAX. */
int wb__placement_resolve(const wb_placement *p, const wb_gpu_list *devs, int *out, unsigned *n,
                          wb_err *err);

/* The placement as text ("all", "0,1", "GPU-...,2"), cut to size. */
void wb__placement_format(const wb_placement *p, char *buf, size_t size);

#endif
