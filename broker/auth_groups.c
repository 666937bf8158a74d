/* A peer's supplementary groups, read from /proc/<pid>/status while its
 * pidfd proves which process that pid names (auth_groups.h). */
#include "auth_groups.h"

#include "alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whether [p, end) starts with the line tag `tag` ("Uid:"). */
static int line_is(const char *p, const char *end, const char *tag)
{
    size_t n = strlen(tag);
    return (size_t)(end - p) >= n && memcmp(p, tag, n) == 0;
}

/* Parses the blank-separated decimal ids of one line, [p, end): the first
 * `cap` to out[], all counted in *count (at most `max`). 0, or -1 when a
 * field is not an id or there are more than `max`. */
static int parse_id_fields(const char *p, const char *end, uint32_t *out, size_t cap, size_t *count,
                           size_t max)
{
    *count = 0;
    for (;;) {
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (p == end)
            return 0;
        uint64_t v = 0;
        const char *start = p;
        while (p < end && *p >= '0' && *p <= '9') {
            v = v * 10 + (uint64_t)(*p - '0');
            if (v >= UINT32_MAX)
                return -1;
            p++;
        }
        if (p == start || (p < end && *p != ' ' && *p != '\t'))
            return -1;
        if (*count == max)
            return -1;
        if (*count < cap)
            out[*count] = (uint32_t)v;
        (*count)++;
    }
}

int wb__auth_parse_status(const char *text, size_t len, wb_proc_ids *ids, uint32_t *groups,
                          size_t cap, wb_err *err)
{
    memset(ids, 0, sizeof *ids);
    int have_uid = 0, have_gid = 0, have_groups = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *tag = NULL;
        int *have = NULL;
        uint32_t *out = NULL;
        size_t out_cap = 0, max = 4, count = 0;
        if (line_is(p, le, "Uid:")) {
            tag = "Uid:";
            have = &have_uid;
            out = ids->uid;
            out_cap = 4;
        } else if (line_is(p, le, "Gid:")) {
            tag = "Gid:";
            have = &have_gid;
            out = ids->gid;
            out_cap = 4;
        } else if (line_is(p, le, "Groups:")) {
            tag = "Groups:";
            have = &have_groups;
            out = groups;
            out_cap = groups ? cap : 0;
            max = WB_PROC_GROUPS_MAX;
        }
        if (tag) {
            if (*have)
                return wb__err_set(err, WB_EFORMAT, "two %s lines", tag);
            *have = 1;
            if (parse_id_fields(p + strlen(tag), le, out, out_cap, &count, max) != 0)
                return wb__err_set(err, WB_EFORMAT,
                                   max == 4 ? "the %s line is not four ids"
                                            : "the %s line is not a list of at most 65536 ids",
                                   tag);
            if (max == 4 && count != 4)
                return wb__err_set(err, WB_EFORMAT, "the %s line is not four ids", tag);
            if (max != 4)
                ids->n_groups = count;
        }
        p = nl ? nl + 1 : end;
    }
    if (!have_uid || !have_gid || !have_groups)
        return wb__err_set(err, WB_EFORMAT, "no %s line",
                           !have_uid   ? "Uid:"
                           : !have_gid ? "Gid:"
                                       : "Groups:");
    return WB_OK;
}

/* Reads a whole /proc file (at most `max` bytes) into a new buffer (*out,
 * the caller frees it). Returns its length, or -1 with errno set. */
static ssize_t read_proc_file(const char *path, char **out, size_t max)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t cap = 4096, len = 0;
    char *buf = wb__malloc(cap);
    for (;;) {
        if (!buf) {
            close(fd);
            errno = ENOMEM;
            return -1;
        }
        if (len == cap) {
            if (cap >= max) {
                free(buf);
                close(fd);
                errno = EFBIG;
                return -1;
            }
            char *grown = wb__realloc(buf, cap * 2);
            if (!grown)
                free(buf);
            buf = grown;
            cap *= 2;
            continue;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            errno = e;
            return -1;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    *out = buf;
    return (ssize_t)len;
}

/* The pid the broker's /proc shows for the process a pidfd names (the Pid:
 * line of /proc/self/fdinfo: -1 once it exited, 0 outside the namespace of
 * that /proc). 1 with *pid set; 0 when the kernel shows no such line (older
 * kernels); -1 when the fdinfo cannot be read. */
static int pidfd_proc_pid(int pidfd, long *pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n;
    do {
        n = read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    const char *line = strncmp(buf, "Pid:", 4) == 0 ? buf : strstr(buf, "\nPid:");
    if (!line)
        return 0;
    line += line == buf ? 4 : 5;
    char *end;
    errno = 0;
    long v = strtol(line, &end, 10);
    if (end == line || errno != 0)
        return -1;
    *pid = v;
    return 1;
}

static int cmp_u32(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

/* Keeps the process's groups (all[], n of them, sorted here) in g: all of
 * them when they fit, else those on the administrator gid list, then the
 * client one, then the lowest others. */
static void keep_groups(const wb_auth *a, wb_peer_groups *g, uint32_t *all, size_t n)
{
    qsort(all, n, sizeof *all, cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || all[u - 1] != all[i])
            all[u++] = all[i];
    g->total = (uint32_t)u;
    if (u <= WB_PEER_GROUPS_MAX) {
        memcpy(g->gid, all, u * sizeof *all);
        g->n = (uint32_t)u;
        return;
    }
    const wb_id_list *admin = a ? &a->lists[WB_AUTH_ADMIN_GIDS] : NULL;
    const wb_id_list *client = a ? &a->lists[WB_AUTH_CLIENT_GIDS] : NULL;
    g->n = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (size_t i = 0; i < u && g->n < WB_PEER_GROUPS_MAX; i++) {
            int on_admin = admin && wb__auth_id_listed(admin, all[i]);
            int on_client = client && wb__auth_id_listed(client, all[i]);
            int take = pass == 0   ? on_admin
                       : pass == 1 ? on_client && !on_admin
                                   : !on_admin && !on_client;
            if (take)
                g->gid[g->n++] = all[i];
        }
    }
    qsort(g->gid, g->n, sizeof g->gid[0], cmp_u32);
}

int wb__auth_read_groups(const wb_auth *a, wb_peer_creds *c, int pidfd)
{
    wb_peer_groups *g = &c->groups;
    memset(g, 0, sizeof *g);
    if (c->pid_hidden)
        return g->state = WB_GROUPS_PID_HIDDEN;
    if (!c->known || c->pid == 0 || c->pid > 0x7fffffffu || pidfd < 0)
        return g->state = WB_GROUPS_NO_PIDFD;
    if (wb__pidfd_exited(pidfd))
        return g->state = WB_GROUPS_EXITED;
    /* /proc must be the broker's pid namespace's: there the pidfd's process
     * has the pid SO_PEERCRED gave. */
    long shown = 0;
    int fr = pidfd_proc_pid(pidfd, &shown);
    if (fr == 1 && shown == -1)
        return g->state = WB_GROUPS_EXITED;
    if (fr < 0 || (fr == 1 && shown != (long)c->pid))
        return g->state = WB_GROUPS_OTHER_PROC;
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/status", c->pid);
    char *text = NULL;
    /* 65536 groups of up to 10 digits, and the other lines. */
    ssize_t len = read_proc_file(path, &text, 1u << 20);
    int e = errno;
    /* Whatever was read is the pidfd's process's only if it still lives:
     * a pid is not reused before its process has exited. */
    if (wb__pidfd_exited(pidfd)) {
        free(text);
        return g->state = WB_GROUPS_EXITED;
    }
    if (len < 0) {
        g->err_no = e;
        return g->state = WB_GROUPS_UNREADABLE;
    }
    uint32_t small[256];
    uint32_t *all = small;
    wb_proc_ids ids;
    wb_err perr;
    int rc = wb__auth_parse_status(text, (size_t)len, &ids, small, 256, &perr);
    if (rc == WB_OK && ids.n_groups > 256) {
        all = wb__malloc(ids.n_groups * sizeof *all);
        rc = all ? wb__auth_parse_status(text, (size_t)len, &ids, all, ids.n_groups, &perr)
                 : WB_ENOMEM;
    }
    free(text);
    if (rc == WB_ENOMEM) {
        g->err_no = ENOMEM;
        return g->state = WB_GROUPS_UNREADABLE;
    }
    if (rc != WB_OK) {
        if (all != small)
            free(all);
        return g->state = WB_GROUPS_MALFORMED;
    }
    /* SO_PEERCRED's ids are the effective ones at connect: a process that
     * changed them since is not judged by groups it may have changed too. */
    if (ids.uid[1] != c->uid || ids.gid[1] != c->gid) {
        if (all != small)
            free(all);
        return g->state = WB_GROUPS_IDS_CHANGED;
    }
    keep_groups(a, g, all, ids.n_groups);
    if (all != small)
        free(all);
    return g->state = WB_GROUPS_READ;
}
