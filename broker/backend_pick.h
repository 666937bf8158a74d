/* Choosing the broker's backend at start. */
#ifndef WB_BROKER_BACKEND_PICK_H
#define WB_BROKER_BACKEND_PICK_H

#include "backend.h"
#include "err.h"
#include "stage.h"

/* Picks the backend for `requested` ("auto", "cuda" or "host") and logs one
 * line (event=backend) saying which, why, and how clients reach its slabs:
 * - host: the host backend with the given loader settings, its slabs in
 *   sealed memfds when `host_memfd` (--host-slab memfd), else named POSIX
 *   shared memory;
 * - cuda: the cuda backend on `device` (stream and pinned staging ring
 *   allocated now), its slabs exported as `cuda_slab` says (WB_CUDA_SLAB_IPC:
 *   cudaIpcMemHandle; WB_CUDA_SLAB_VMM: cuMemCreate descriptors mapped
 *   read-only, --cuda-slab vmm); WB_ENOGPU or WB_ENOSYS with a one-line
 *   reason when no GPU is usable, the build has no CUDA or the device no VMM
 *   descriptor export, or the start's error;
 * - auto: cuda when a GPU is usable and the backend starts, else host.
 * Zero fields of `stage` take the defaults; an out-of-range value is
 * WB_EINVAL naming it. *out is released with wb__backend_release. */
int wb__backend_pick(const char *requested, int device, const wb_stage_config *stage, int load_mode,
                     int host_memfd, int cuda_slab, const wb_backend **out, wb_err *err);

/* Frees what wb__backend_pick started (the cuda backend's ring and stream);
 * slabs must have been freed. Sets *be to NULL. */
void wb__backend_release(const wb_backend **be);

#endif
