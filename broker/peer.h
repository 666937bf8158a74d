/* What the broker knows about the process at the other end of a message: its
 * kernel credentials (from the ZeroMQ "Peer-Address" property, which libzmq
 * fills from SO_PEERCRED on ipc:// sockets), its name, and a pidfd that
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

/* Parses a Peer-Address value: the last three colon-separated fields are
 * decimal uid, gid and pid (":1000:1000:4242", "localhost:0:0:123"). Each must
 * fit in 32 bits and the pid must be positive. Returns 0 and fills *out (with
 * known = 1), or WB_EPERM with a message naming what is wrong; *out is then
 * zeroed. */
int wb__peer_parse_address(const char *addr, wb_peer_creds *out, wb_err *err);

/* Reads /proc/<pid>/comm into buf without its trailing newline; writes "?"
 * when it cannot be read. Returns buf. */
const char *wb__peer_comm(uint32_t pid, char *buf, size_t size);

/* Opens a pidfd for pid (pidfd_open(2) through syscall(2), since older C
 * libraries lack the wrapper). Returns the descriptor, or a negative WB_E*
 * code: WB_ENOTFOUND when the process no longer exists (ESRCH), WB_ENOSYS
 * when the kernel lacks pidfd_open, WB_EIO otherwise. */
int wb__pidfd_open(uint32_t pid, wb_err *err);

#endif
