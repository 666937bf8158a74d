#include "peer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* Parses a field of decimal digits [s, end) into a 32-bit value. */
static int parse_u32(const char *s, const char *end, uint32_t *out)
{
    if (s == end || end - s > 10)
        return -1;
    uint64_t v = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int wb__peer_parse_address(const char *addr, wb_peer_creds *out, wb_err *err)
{
    memset(out, 0, sizeof *out);
    if (!addr)
        return wb__err_set(err, WB_EPERM,
                           "the peer's credentials are unavailable (no Peer-Address)");
    /* Find the last three colons from the end. */
    const char *colon[3] = {NULL, NULL, NULL};
    size_t len = strlen(addr);
    int found = 0;
    for (size_t i = len; i > 0 && found < 3; i--) {
        if (addr[i - 1] == ':')
            colon[found++] = addr + i - 1;
    }
    if (found < 3)
        return wb__err_set(err, WB_EPERM,
                           "the peer's credentials cannot be read from Peer-Address '%.100s'",
                           addr);
    /* colon[2] < colon[1] < colon[0]: uid between colon[2] and colon[1] ... */
    uint32_t uid, gid, pid;
    if (parse_u32(colon[2] + 1, colon[1], &uid) != 0 ||
        parse_u32(colon[1] + 1, colon[0], &gid) != 0 ||
        parse_u32(colon[0] + 1, addr + len, &pid) != 0)
        return wb__err_set(err, WB_EPERM,
                           "the peer's credentials cannot be read from Peer-Address '%.100s'",
                           addr);
    if (pid == 0)
        return wb__err_set(err, WB_EPERM,
                           "the peer's pid is not visible from the broker (Peer-Address '%.100s')",
                           addr);
    out->known = 1;
    out->uid = uid;
    out->gid = gid;
    out->pid = pid;
    return WB_OK;
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
