/* The CUDA runtime, when this build has it. Everything here also compiles
 * without CUDA and then reports WB_ENOSYS, so callers need no #ifdefs. */
#ifndef WB_GPU_H
#define WB_GPU_H

#include "devlist.h"
#include "err.h"

/* 1 if this build includes the cuda backend. */
int wb__gpu_built(void);

/* Counts usable CUDA devices. Returns WB_OK with *count >= 1, WB_ENOGPU with
 * a one-line reason (no driver, no device, runtime error), or WB_ENOSYS when
 * the build has no CUDA support. Never crashes on a machine without a GPU. */
int wb__gpu_probe(int *count, wb_err *err);

/* The devices this process sees, with their UUIDs (cudaGetDeviceProperties):
 * WB_OK (an empty list when there is no usable device), or WB_ENOSYS when the
 * build has no CUDA support. Never crashes on a machine without a GPU. */
int wb__gpu_list(wb_gpu_list *out, wb_err *err);

/* The calling thread's current CUDA device: WB_OK and *device, WB_ENOGPU when
 * there is none usable, WB_ENOSYS without CUDA. */
int wb__gpu_current(int *device, wb_err *err);

#endif
