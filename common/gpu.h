/* The CUDA runtime, when this build has it. Everything here also compiles
 * without CUDA and then reports WB_ENOSYS, so callers need no #ifdefs. */
#ifndef WB_GPU_H
#define WB_GPU_H

#include "err.h"

/* 1 if this build includes the cuda backend. */
int wb__gpu_built(void);

/* Counts usable CUDA devices. Returns WB_OK with *count >= 1, WB_ENOGPU with
 * a one-line reason (no driver, no device, runtime error), or WB_ENOSYS when
 * the build has no CUDA support. Never crashes on a machine without a GPU. */
int wb__gpu_probe(int *count, wb_err *err);

#endif
