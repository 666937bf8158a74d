/* What the broker knows about the process at the other end of a message: its
 * kernel credentials (SO_PEERCRED on its connection), its name, and a pidfd that
 * proves its death. */
#ifndef WB_BROKER_PEER_H
#define WB_BROKER_PEER_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_peer_creds {
    int known; /* 1 when uid/gid/pid were read */
    uint32_t uid;
    uint32_t gid;
    uint32_t pid;
} wb_peer_creds;

/* Reads the credentials of the process at the other end of a connected
 * unix socket (SO_PEERCRED, as the kernel recorded them at connect).
 * Returns 0 and fills *out (known = 1), or WB_EPERM with a message when they
 * cannot be read or the pid is not visible (0: another pid namespace);
 * *out is then zeroed. */
int wb__peer_creds_from_fd(int fd, wb_peer_creds *out, wb_err *err);

/* Reads /proc/<pid>/comm into buf without its trailing newline; writes "?"
 * when it cannot be read. Returns buf. */
const char *wb__peer_comm(uint32_t pid, char *buf, size_t size);

/* Opens a pidfd for pid (pidfd_open(2) through syscall(2), since older C
 * libraries lack the wrapper). Returns the descriptor, or a negative WB_E*
 * code: WB_ENOTFOUND when the process no longer exists (ESRCH), WB_ENOSYS
 * when the kernel lacks pidfd_open, WB_EIO otherwise. */
int wb__pidfd_open(uint32_t pid, wb_err *err);

#endif
