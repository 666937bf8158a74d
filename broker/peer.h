/* What the broker knows about the process at the other end of a message: its
 * kernel credentials (SO_PEERCRED on its connection), its name, and a pidfd that
 * proves its death. */
#ifndef WB_BROKER_PEER_H
#define WB_BROKER_PEER_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_peer_creds {
    int known; /* 1 when uid/gid/pid were read (or the peer's session names it) */
    uint32_t uid;
    uint32_t gid;
    /* The process id, or for a peer known by its descriptor channel session
     * an id at or above WB_SESSION_ID_BASE (common/fdwire.h). */
    uint32_t pid;
    /* 1 when the kernel gave uid and gid but pid 0: the peer lives in a pid
     * namespace the broker cannot see into (known is 0 until a session
     * names it). */
    int pid_hidden;
} wb_peer_creds;

/* Reads the credentials of the process at the other end of a connected
 * unix socket (SO_PEERCRED, as the kernel recorded them at connect).
 * Returns 0 and fills *out (known = 1), or WB_EPERM with a message when they
 * cannot be read (*out zeroed) or the pid is not visible (0: another pid
 * namespace; uid and gid are filled in and pid_hidden is 1). */
int wb__peer_creds_from_fd(int fd, wb_peer_creds *out, wb_err *err);

/* Opens a pidfd for the process at the other end of connected unix socket
 * `sockfd`, whose credentials `c` were just read (known, pid visible): the
 * kernel's own (SO_PEERPIDFD, Linux 6.5) where it has one, which names the
 * process that connected even if its pid was reused since; else
 * pidfd_open of the pid, kept only when that process lives and has the
 * uid SO_PEERCRED gave (so a pid reused by another user's process before
 * the accept is not taken for the peer; a reuse within the same uid is not
 * told apart there, see README "Security and limits"). Returns the
 * descriptor, or a negative WB_E* code with err saying why (WB_EPERM: the
 * process that connected is gone). */
int wb__peer_pidfd(int sockfd, const wb_peer_creds *c, wb_err *err);

/* 1 when the process a pidfd names has exited (the pidfd is readable);
 * 0 while it lives, or for a negative pidfd. A connection acts as its pid
 * only while its pidfd says 0: a pid is not reused before its process has
 * exited and been reaped, so a live pidfd and a pid number name one
 * process. */
int wb__pidfd_exited(int pidfd);

/* The refusal of a request that came on a connection whose process (pid)
 * has exited since it connected: the connection was passed on to another
 * process, and pid may name someone else now. Returns buf. */
const char *wb__peer_passed_on(uint32_t pid, char *buf, size_t size);

/* A peer's pid as logs and messages show it: "1234", or "conn:N" for a
 * session id (WB_IS_SESSION_ID). Returns buf. */
const char *wb__peer_name(uint32_t pid, char *buf, size_t size);

/* Reads /proc/<pid>/comm into buf without its trailing newline; writes "?"
 * when it cannot be read. Returns buf. */
const char *wb__peer_comm(uint32_t pid, char *buf, size_t size);

/* Opens a pidfd for pid (pidfd_open(2) through syscall(2), since older C
 * libraries lack the wrapper). Returns the descriptor, or a negative WB_E*
 * code: WB_ENOTFOUND when the process no longer exists (ESRCH), WB_ENOSYS
 * when the kernel lacks pidfd_open, WB_EIO otherwise. */
int wb__pidfd_open(uint32_t pid, wb_err *err);

#endif
