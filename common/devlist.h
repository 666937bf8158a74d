/* A list of CUDA devices as one process sees them: its own ordinal and the
 * device's UUID. Ordinals differ between processes with different
 * CUDA_VISIBLE_DEVICES; the UUID does not, so a device named by another
 * process (the broker) is found here by its UUID.
 *
 * Pure: the real list comes from wb__gpu_list (gpu.h); tests build their
 * own (a fake list). */
#ifndef WB_DEVLIST_H
#define WB_DEVLIST_H

#include "err.h"

#include <stdint.h>

/* "GPU-" or "MIG-" and the 36 characters of a UUID; a terminating NUL. */
#define WB_GPU_UUID_SIZE 48
/* Devices one list holds (a node has at most 8 or 16 today). */
#define WB_GPU_MAX 64

typedef struct wb_gpu_dev {
    int index;                   /* this process's ordinal */
    char uuid[WB_GPU_UUID_SIZE]; /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
} wb_gpu_dev;

typedef struct wb_gpu_list {
    unsigned n;
    wb_gpu_dev dev[WB_GPU_MAX];
} wb_gpu_list;

/* Formats a 16-byte UUID as nvidia-smi does: "GPU-" and 8-4-4-4-12 lower-case
 * hex digits. */
void wb__gpu_uuid_format(const uint8_t bytes[16], char out[WB_GPU_UUID_SIZE]);

/* 1 if `s` looks like a device UUID: "GPU-" or "MIG-" then 36 characters of
 * hex digits and dashes in the 8-4-4-4-12 pattern (any case). */
int wb__gpu_uuid_valid(const char *s);

/* The entry whose UUID equals `uuid` (case does not matter), or NULL. */
const wb_gpu_dev *wb__devlist_find_uuid(const wb_gpu_list *l, const char *uuid);

/* The entry with ordinal `index`, or NULL. */
const wb_gpu_dev *wb__devlist_find_index(const wb_gpu_list *l, int index);

/* Where a device that another process names (its ordinal `their_index`
 * there and its `uuid`) is in this process: *local gets this list's ordinal.
 * With an empty uuid (a peer that predates UUIDs) the ordinal is taken as it
 * is when this list has it. WB_ENOGPU when the device is not in the list,
 * with a message that names the UUID, what this process sees and
 * CUDA_VISIBLE_DEVICES. */
int wb__devlist_map(const wb_gpu_list *l, int their_index, const char *uuid, int *local,
                    wb_err *err);

/* Writes "0=GPU-..., 1=GPU-..." (or "none") into buf, cut to its size. */
void wb__devlist_describe(const wb_gpu_list *l, char *buf, size_t size);
/* The same followed by " (CUDA_VISIBLE_DEVICES=...)" ("unset" when it is):
 * what a process sees and why, for its refusals. */
void wb__devlist_describe_visible(const wb_gpu_list *l, char *buf, size_t size);

#endif
