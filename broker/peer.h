/* What the broker knows about the process at the other end of a message: its
 * kernel credentials (SO_PEERCRED on its connection), its name, and a pidfd that
 * proves its death. */
#ifndef WB_BROKER_PEER_H
#define WB_BROKER_PEER_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

/* The most supplementary groups kept for a peer. A process in more keeps
 * those on the broker's gid lists first (auth.h, wb__auth_read_groups), so
 * that the allow-list checks stay exact; only load access checks can then
 * miss a group. */
#define WB_PEER_GROUPS_MAX 64

/* Whether a peer's supplementary groups are known, and why not. */
typedef enum wb_groups_state {
    WB_GROUPS_UNREAD = 0,  /* never read: only the primary gid is known */
    WB_GROUPS_READ,        /* read from /proc/<pid>/status at accept */
    WB_GROUPS_PID_HIDDEN,  /* SO_PEERCRED gave pid 0 (another pid namespace) */
    WB_GROUPS_NO_PIDFD,    /* no pidfd proves which process the pid names */
    WB_GROUPS_EXITED,      /* the process exited before or while they were read */
    WB_GROUPS_OTHER_PROC,  /* /proc/<pid> is not the process the pidfd names */
    WB_GROUPS_IDS_CHANGED, /* its uid or gid there is not the connection's */
    WB_GROUPS_UNREADABLE,  /* /proc/<pid>/status could not be read (err_no) */
    WB_GROUPS_MALFORMED,   /* /proc/<pid>/status could not be parsed */
} wb_groups_state;

/* A peer's supplementary groups, read once per connection when it is
 * accepted (a group change of a running process applies to its later
 * connections, as file permissions after a new login). */
typedef struct wb_peer_groups {
    int state;      /* wb_groups_state */
    int err_no;     /* WB_GROUPS_UNREADABLE: why */
    uint32_t n;     /* gids kept in gid[], sorted, no duplicates */
    uint32_t total; /* supplementary groups the process had */
    uint32_t gid[WB_PEER_GROUPS_MAX];
} wb_peer_groups;

typedef struct wb_peer_creds {
    int known; /* 1 when uid/gid/pid were read (or the peer's session names it) */
    uint32_t uid;
    uint32_t gid; /* the effective gid at connect (SO_PEERCRED) */
    /* The process id, or for a peer known by its descriptor channel session
     * an id at or above WB_SESSION_ID_BASE (common/fdchan_wire.h). */
    uint32_t pid;
    /* 1 when the kernel gave uid and gid but pid 0: the peer lives in a pid
     * namespace the broker cannot see into (known is 0 until a session
     * names it). */
    int pid_hidden;
    wb_peer_groups groups; /* WB_GROUPS_UNREAD until wb__auth_read_groups */
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
 * told apart there, see docs/security.md). Returns the
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
