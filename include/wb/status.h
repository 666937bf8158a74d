/* Status codes shared by every weightbroker component and the wire protocol.
 *
 * Functions return 0 (WB_OK) on success or one of the negative codes below.
 * The values travel in replies (Reply.status), so they never change once
 * released; new codes are only appended. */
#ifndef WB_STATUS_H
#define WB_STATUS_H

#include "wb/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum wb_status {
    WB_OK = 0,
    WB_EINVAL = -1,     /* invalid argument or usage */
    WB_ENOMEM = -2,     /* out of memory */
    WB_EIO = -3,        /* I/O error (read, write, mmap, shm) */
    WB_ENOTFOUND = -4,  /* no such file, model, lease or tensor */
    WB_EFORMAT = -5,    /* malformed input file (safetensors, index) */
    WB_EPROTO = -6,     /* malformed or unexpected protocol message */
    WB_EBUSY = -7,      /* object still in use (live containers, leases) */
    WB_EPERM = -8,      /* not allowed for this peer */
    WB_ESTATE = -9,     /* object in the wrong state (draining, loading) */
    WB_ETIMEDOUT = -10, /* no answer in time */
    WB_ENOGPU = -11,    /* no usable GPU or CUDA runtime */
    WB_ELIMIT = -12,    /* a configured limit was reached */
    WB_EEXIST = -13,    /* already exists */
    WB_ECONN = -14,     /* cannot reach the broker */
    WB_EVERSION = -15,  /* protocol version mismatch */
    WB_ENOSYS = -16,    /* not supported by this build or backend */
    WB_EINTERNAL = -17, /* internal error (a bug) */
    WB_ECORRUPT = -18,  /* data does not match its checksum */
} wb_status;

/* Returns a static, human-readable description of a status code. Unknown
 * codes yield "unknown status". The returned string is never NULL. */
WB_EXPORT const char *wb_strerror(int status);

/* Returns the symbolic name of a status code ("WB_EBUSY"), or "WB_E?". */
WB_EXPORT const char *wb_status_name(int status);

#ifdef __cplusplus
}
#endif

#endif
