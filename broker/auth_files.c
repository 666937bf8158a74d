/* File access: a load's path and files judged for the peer that asked,
 * and the group the slabs are given to (auth_files.h). */
#include "auth_files.h"

#include "auth.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_type(mode_t mode)
{
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return "not a regular file";
}

int wb__auth_check_load_path(const char *path, char *resolved, size_t size, int *is_dir,
                             wb_err *err)
{
    *is_dir = 0;
    if (!path || !path[0])
        return wb__err_set(err, WB_EINVAL, "the load path is empty");
    if (size < PATH_MAX)
        return wb__err_set(err, WB_EINTERNAL, "no room for the resolved path of %s", path);
    /* realpath resolves every link, so what is judged below is the final
     * target, whatever chain of links leads to it. */
    if (!realpath(path, resolved)) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            return wb__err_set(err, WB_ENOTFOUND, "no such file: %s", path);
        if (e == EACCES)
            return wb__err_errno(err, WB_EPERM, e, "the broker cannot reach %s", path);
        if (e == ELOOP)
            return wb__err_set(err, WB_EINVAL, "%s: too many levels of symbolic links", path);
        return wb__err_errno(err, WB_EIO, e, "cannot resolve %s", path);
    }
    struct stat st;
    if (stat(resolved, &st) != 0)
        return wb__err_errno(err, errno == ENOENT ? WB_ENOTFOUND : WB_EIO, errno, "cannot stat %s",
                             resolved);
    int same = strcmp(path, resolved) == 0;
    if (S_ISDIR(st.st_mode)) {
        if (faccessat(AT_FDCWD, resolved, R_OK | X_OK, AT_EACCESS) != 0)
            return wb__err_errno(err, WB_EPERM, errno,
                                 "the broker may not read the directory %s%s%s", path,
                                 same ? "" : " -> ", same ? "" : resolved);
        *is_dir = 1;
        return WB_OK;
    }
    if (!S_ISREG(st.st_mode))
        return wb__err_set(err, WB_EINVAL,
                           "%s%s%s is %s; only regular files (or a directory holding a "
                           "checkpoint) can be loaded",
                           path, same ? "" : " -> ", same ? "" : resolved, file_type(st.st_mode));
    if (faccessat(AT_FDCWD, resolved, R_OK, AT_EACCESS) != 0)
        return wb__err_errno(err, WB_EPERM, errno, "the broker may not read %s%s%s", path,
                             same ? "" : " -> ", same ? "" : resolved);
    return WB_OK;
}

wb_load_access wb__auth_load_access(const wb_peer_creds *peer)
{
    wb_load_access a = {0};
    if (!peer)
        return a;
    /* A peer whose credentials are unknown never gets this far (every
     * operation needs them); judge it as strictly as anyone. */
    a.enforce = !peer->known || peer->uid != 0;
    a.uid = peer->known ? peer->uid : UINT32_MAX;
    a.gid = peer->known ? peer->gid : UINT32_MAX;
    a.pid = peer->pid;
    if (peer->known)
        a.groups = peer->groups;
    return a;
}

/* Whether gid is one of the supplementary groups read (sorted). */
static int in_groups(const wb_peer_groups *g, uint32_t gid)
{
    if (g->state != WB_GROUPS_READ)
        return 0;
    size_t lo = 0, hi = g->n < WB_PEER_GROUPS_MAX ? g->n : WB_PEER_GROUPS_MAX;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->gid[mid] == gid)
            return 1;
        if (g->gid[mid] < gid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* The kernel's owner / group / other rule on mode bits alone, for the peer's
 * uid, primary gid and supplementary groups: the owner's bits apply to the
 * owner even when the group's or others' would allow more, the group's to a
 * member even when others' would. `want` is 4 (read), 1 (search) or 5. */
static int mode_allows(const wb_load_access *a, const struct stat *st, unsigned want)
{
    unsigned bits;
    if (st->st_uid == a->uid)
        bits = (st->st_mode >> 6) & 7u;
    else if (st->st_gid == a->gid || in_groups(&a->groups, (uint32_t)st->st_gid))
        bits = (st->st_mode >> 3) & 7u;
    else
        bits = st->st_mode & 7u;
    return (bits & want) == want;
}

static int refuse_peer(const wb_load_access *a, const char *what, const char *path,
                       const struct stat *st, wb_err *err)
{
    char gids[300];
    /* Nothing more when the peer has no supplementary groups: the kernel's
     * rule then knows only the primary gid too. */
    if (a->groups.state == WB_GROUPS_UNREAD)
        snprintf(gids, sizeof gids, "gid %u", a->gid);
    else
        wb__auth_describe_groups(a->gid, a->pid, &a->groups, 0, gids, sizeof gids);
    return wb__err_set(err, WB_EPERM,
                       "uid %u (%s) may not %s %.400s (mode %04o, owner uid %u, gid %u); "
                       "the broker loads only what the requesting user can read",
                       a->uid, gids, what, path, (unsigned)(st->st_mode & 07777),
                       (unsigned)st->st_uid, (unsigned)st->st_gid);
}

static int check_search(const wb_load_access *a, const char *dir, wb_err *err)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return wb__err_errno(err, WB_EPERM, errno, "cannot judge access to %.400s", dir);
    return mode_allows(a, &st, 1) ? WB_OK : refuse_peer(a, "search the directory", dir, &st, err);
}

/* Every directory above `resolved` (an absolute path without links), from
 * "/" down, must be searchable by the peer. */
static int check_ancestors(const wb_load_access *a, const char *resolved, wb_err *err)
{
    char dir[PATH_MAX];
    if (resolved[0] != '/' || strlen(resolved) >= sizeof dir)
        return wb__err_set(err, WB_EPERM, "cannot judge access to %.400s: not a resolved path",
                           resolved);
    int rc = check_search(a, "/", err);
    const char *last = strrchr(resolved, '/');
    for (const char *p = resolved + 1; rc == WB_OK && p < last;) {
        const char *q = strchr(p, '/');
        size_t len = (size_t)(q - resolved);
        memcpy(dir, resolved, len);
        dir[len] = '\0';
        rc = check_search(a, dir, err);
        p = q + 1;
    }
    return rc;
}

int wb__auth_check_peer_path(const wb_load_access *a, const char *resolved, wb_err *err)
{
    if (!a || !a->enforce)
        return WB_OK;
    struct stat st;
    if (stat(resolved, &st) != 0)
        return wb__err_errno(err, errno == ENOENT ? WB_ENOTFOUND : WB_EPERM, errno,
                             "cannot judge access to %.400s", resolved);
    int rc = check_ancestors(a, resolved, err);
    if (rc != WB_OK)
        return rc;
    if (S_ISDIR(st.st_mode))
        return mode_allows(a, &st, 5) ? WB_OK
                                      : refuse_peer(a, "read the directory", resolved, &st, err);
    return mode_allows(a, &st, 4) ? WB_OK : refuse_peer(a, "read", resolved, &st, err);
}

int wb__auth_check_peer_fd(void *arg, int fd, const char *path, wb_err *err)
{
    const wb_load_access *a = arg;
    if (!a || !a->enforce)
        return WB_OK;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return wb__err_errno(err, WB_EIO, errno, "fstat %.400s", path);
    /* Where the open file really lies, whatever links led to it: the
     * directories above it are judged on that path. */
    char link[64], real[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, real, sizeof real - 1);
    if (n <= 0 || (size_t)n >= sizeof real - 1)
        return wb__err_set(err, WB_EPERM, "cannot tell where %.400s lies (%s)", path,
                           n < 0 ? strerror(errno) : "path too long");
    real[n] = '\0';
    static const char deleted[] = " (deleted)";
    size_t dl = sizeof deleted - 1;
    if (real[0] != '/' || ((size_t)n > dl && strcmp(real + n - dl, deleted) == 0))
        return wb__err_set(err, WB_EPERM, "cannot tell where %.400s lies (%s)", path, real);
    if (!mode_allows(a, &st, 4)) {
        if (strcmp(path, real) == 0)
            return refuse_peer(a, "read", path, &st, err);
        char both[2 * PATH_MAX + 8];
        snprintf(both, sizeof both, "%s -> %s", path, real);
        return refuse_peer(a, "read", both, &st, err);
    }
    return check_ancestors(a, real, err);
}

int64_t wb__auth_slab_group(const char *socket_path)
{
    char dir[WB_PATH_MAX + 1];
    int n = snprintf(dir, sizeof dir, "%s", socket_path);
    if (n < 0 || (size_t)n >= sizeof dir)
        return -1;
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || !(st.st_mode & S_ISGID))
        return -1;
    if (st.st_gid == getegid())
        return -1;
    return (int64_t)st.st_gid;
}

int wb__auth_share_slab(const char *shm_name, uint32_t gid, wb_err *err)
{
    int fd = shm_open(shm_name, O_RDONLY, 0);
    if (fd < 0)
        return wb__err_errno(err, WB_EIO, errno, "shm_open %s", shm_name);
    int rc = WB_OK;
    if (fchown(fd, (uid_t)-1, (gid_t)gid) != 0)
        rc = wb__err_errno(err, WB_EPERM, errno, "cannot give slab %s to group %u", shm_name, gid);
    else if (fchmod(fd, 0640) != 0)
        rc = wb__err_errno(err, WB_EIO, errno, "chmod 0640 %s", shm_name);
    close(fd);
    return rc;
}
