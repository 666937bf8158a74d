#include "peer.h"

#include "fdchan_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

int wb__peer_creds_from_fd(int fd, wb_peer_creds *out, wb_err *err)
{
    memset(out, 0, sizeof *out);
    struct ucred uc;
    socklen_t len = sizeof uc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0)
        return wb__err_errno(err, WB_EPERM, errno, "the peer's credentials are unavailable");
    /* A peer in another pid namespace is reported as pid 0. Its uid and
     * gid still hold (translated into the broker's user namespace). */
    if (uc.pid <= 0) {
        out->uid = (uint32_t)uc.uid;
        out->gid = (uint32_t)uc.gid;
        out->pid_hidden = 1;
        return wb__err_set(err, WB_EPERM,
                           "the peer's pid is not visible from the broker (uid %u, another pid "
                           "namespace)",
                           (unsigned)uc.uid);
    }
    out->known = 1;
    out->uid = (uint32_t)uc.uid;
    out->gid = (uint32_t)uc.gid;
    out->pid = (uint32_t)uc.pid;
    return WB_OK;
}

const char *wb__peer_name(uint32_t pid, char *buf, size_t size)
{
    if (WB_IS_SESSION_ID(pid))
        snprintf(buf, size, "conn:%u", pid - WB_SESSION_ID_BASE);
    else
        snprintf(buf, size, "%u", pid);
    return buf;
}

const char *wb__peer_comm(uint32_t pid, char *buf, size_t size)
{
    if (size == 0)
        return buf;
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = -1;
    if (fd >= 0) {
        do {
            n = read(fd, buf, size - 1);
        } while (n < 0 && errno == EINTR);
        close(fd);
    }
    if (n <= 0) {
        snprintf(buf, size, "?");
        return buf;
    }
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    if (n == 0)
        snprintf(buf, size, "?");
    return buf;
}

int wb__pidfd_open(uint32_t pid, wb_err *err)
{
    if (pid == 0 || pid > 0x7fffffffu)
        return wb__err_set(err, WB_EINVAL, "pid %u is not a process id", pid);
    long fd = syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ESRCH)
            return wb__err_set(err, WB_ENOTFOUND, "process %u no longer exists", pid);
        if (e == ENOSYS)
            return wb__err_set(err, WB_ENOSYS,
                               "this kernel lacks pidfd_open (Linux 5.3 or later "
                               "is needed to prove a client's death)");
        return wb__err_errno(err, WB_EIO, e, "pidfd_open for pid %u", pid);
    }
    /* pidfd_open sets close-on-exec on the descriptor it returns. */
    return (int)fd;
}

int wb__pidfd_exited(int pidfd)
{
    if (pidfd < 0)
        return 0;
    struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
    int r;
    do {
        r = poll(&pfd, 1, 0);
    } while (r < 0 && errno == EINTR);
    return r > 0;
}

/* Whether /proc/<pid>/status lists `uid` among the process's real,
 * effective, saved and filesystem uids. */
static int proc_has_uid(uint32_t pid, uint32_t uid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%u/status", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n;
    do {
        n = read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *u = strstr(buf, "\nUid:");
    if (!u)
        return 0;
    u += 5;
    for (int i = 0; i < 4; i++) {
        char *end;
        unsigned long v = strtoul(u, &end, 10);
        if (end == u)
            return 0;
        if (v == uid)
            return 1;
        u = end;
    }
    return 0;
}

int wb__peer_pidfd(int sockfd, const wb_peer_creds *c, wb_err *err)
{
    if (!c->known || WB_IS_SESSION_ID(c->pid))
        return wb__err_set(err, WB_EINVAL, "the peer has no visible pid");
    int fd = -1;
    socklen_t len = sizeof fd;
    int gr = getsockopt(sockfd, SOL_SOCKET, SO_PEERPIDFD, &fd, &len);
    if (gr != 0 && errno == ESRCH)
        return wb__err_set(err, WB_EPERM,
                           "the process that opened this connection (pid %u) has exited", c->pid);
    if (gr == 0 && fd >= 0) {
        /* The kernel's pidfd of the process that connected. */
        if (wb__pidfd_exited(fd)) {
            close(fd);
            return wb__err_set(err, WB_EPERM,
                               "the process that opened this connection (pid %u) has exited",
                               c->pid);
        }
        if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
            close(fd);
            return wb__err_errno(err, WB_EIO, errno, "fcntl on a peer's pidfd");
        }
        return fd;
    }
    /* A kernel without SO_PEERPIDFD (before 6.5). */
    wb_err perr;
    fd = wb__pidfd_open(c->pid, &perr);
    if (fd == WB_ENOTFOUND)
        return wb__err_set(err, WB_EPERM,
                           "the process that opened this connection (pid %u) has exited", c->pid);
    if (fd < 0)
        return wb__err_set(err, fd, "%s", perr.msg);
    /* The uid is read while the pidfd says the process lives, and checked
     * again after: the /proc entry read was the pidfd's process. */
    int same = proc_has_uid(c->pid, c->uid);
    if (wb__pidfd_exited(fd) || !same) {
        close(fd);
        return wb__err_set(err, WB_EPERM,
                           "the process that opened this connection (pid %u, uid %u) has exited; "
                           "pid %u now names another process",
                           c->pid, c->uid, c->pid);
    }
    return fd;
}

const char *wb__peer_passed_on(uint32_t pid, char *buf, size_t size)
{
    snprintf(buf, size,
             "the process that opened this connection (pid %u) has exited; a connection passed "
             "on to another process is not served",
             pid);
    return buf;
}
