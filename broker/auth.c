#include "auth.h"

#include "alloc.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Entries in one list option; far more than any sane deployment names. */
#define AUTH_MAX_IDS 4096
/* getpwnam_r/getgrnam_r buffers: large enough for big group lists. */
#define AUTH_NSS_BUF (64 * 1024)

static const char *list_kind(wb_auth_list which)
{
    return which == WB_AUTH_CLIENT_GIDS || which == WB_AUTH_ADMIN_GIDS ? "group" : "user";
}

static int is_gid_list(wb_auth_list which)
{
    return which == WB_AUTH_CLIENT_GIDS || which == WB_AUTH_ADMIN_GIDS;
}

static int has_id(const wb_id_list *l, uint32_t id)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->ids[mid] == id)
            return 1;
        if (l->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* Inserts keeping the list sorted; duplicates are dropped. -1 when out of
 * memory. */
static int insert_id(wb_id_list *l, uint32_t id)
{
    if (has_id(l, id))
        return 0;
    uint32_t *grown = wb__realloc(l->ids, (l->n + 1) * sizeof *grown);
    if (!grown)
        return -1;
    l->ids = grown;
    size_t pos = l->n;
    while (pos > 0 && l->ids[pos - 1] > id) {
        l->ids[pos] = l->ids[pos - 1];
        pos--;
    }
    l->ids[pos] = id;
    l->n++;
    return 0;
}

static void init_common(wb_auth *a, uint32_t broker_euid)
{
    memset(a, 0, sizeof *a);
    a->broker_euid = broker_euid;
}

void wb__auth_init_open(wb_auth *a, uint32_t broker_euid)
{
    init_common(a, broker_euid);
    a->open_clients = 1;
}

void wb__auth_init_default(wb_auth *a, uint32_t broker_euid)
{
    init_common(a, broker_euid);
}

void wb__auth_destroy(wb_auth *a)
{
    for (int i = 0; i < 4; i++) {
        free(a->lists[i].ids);
        a->lists[i].ids = NULL;
        a->lists[i].n = 0;
    }
}

/* Parses a decimal id of at most 32 bits. Returns 0 on success. */
static int parse_id(const char *s, uint32_t *out)
{
    if (!*s)
        return -1;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > UINT32_MAX)
            return -1;
    }
    /* (uid_t)-1 means "no change" to chown and friends: never a real id. */
    if (v == UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int resolve_name(wb_auth_list which, const char *name, const char *option, uint32_t *out,
                        wb_err *err)
{
    char *buf = wb__malloc(AUTH_NSS_BUF);
    if (!buf)
        return wb__err_set(err, WB_ENOMEM, "%s: out of memory resolving '%s'", option, name);
    int e;
    int found = 0;
    if (is_gid_list(which)) {
        struct group gr, *res = NULL;
        e = getgrnam_r(name, &gr, buf, AUTH_NSS_BUF, &res);
        if (e == 0 && res) {
            *out = (uint32_t)res->gr_gid;
            found = 1;
        }
    } else {
        struct passwd pw, *res = NULL;
        e = getpwnam_r(name, &pw, buf, AUTH_NSS_BUF, &res);
        if (e == 0 && res) {
            *out = (uint32_t)res->pw_uid;
            found = 1;
        }
    }
    free(buf);
    if (found)
        return WB_OK;
    if (e != 0 && e != ENOENT && e != ESRCH)
        return wb__err_errno(err, WB_EINVAL, e, "%s: cannot look up %s '%s'", option,
                             list_kind(which), name);
    return wb__err_set(err, WB_EINVAL, "%s: no %s named '%s'", option, list_kind(which), name);
}

int wb__auth_add(wb_auth *a, wb_auth_list which, const char *text, const char *option, wb_err *err)
{
    if ((unsigned)which > WB_AUTH_ADMIN_GIDS)
        return wb__err_set(err, WB_EINVAL, "%s: no such list", option);
    if (!text || !text[0])
        return wb__err_set(err, WB_EINVAL, "%s: the list is empty", option);
    /* Resolve everything first, so that a bad entry changes nothing. */
    uint32_t ids[64];
    uint32_t *all = ids;
    size_t n = 0, cap = sizeof ids / sizeof ids[0];
    const char *p = text;
    int rc = WB_OK;
    for (;;) {
        size_t len = strcspn(p, ",");
        char item[256];
        if (len == 0) {
            rc = wb__err_set(err, WB_EINVAL, "%s: empty entry in '%s'", option, text);
            break;
        }
        if (len >= sizeof item) {
            rc =
                wb__err_set(err, WB_EINVAL, "%s: entry of %zu characters in the list", option, len);
            break;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        uint32_t id = 0;
        if (item[0] >= '0' && item[0] <= '9') {
            if (parse_id(item, &id) != 0) {
                rc = wb__err_set(err, WB_EINVAL, "%s: '%s' is not a %s id (0 to %u)", option, item,
                                 is_gid_list(which) ? "group" : "user", UINT32_MAX - 1);
                break;
            }
        } else if ((rc = resolve_name(which, item, option, &id, err)) != WB_OK) {
            break;
        }
        if (n == cap) {
            if (cap >= AUTH_MAX_IDS) {
                rc = wb__err_set(err, WB_EINVAL, "%s: more than %d entries", option, AUTH_MAX_IDS);
                break;
            }
            uint32_t *grown = wb__malloc(cap * 2 * sizeof *grown);
            if (!grown) {
                rc = wb__err_set(err, WB_ENOMEM, "%s: out of memory", option);
                break;
            }
            memcpy(grown, all, n * sizeof *all);
            if (all != ids)
                free(all);
            all = grown;
            cap *= 2;
        }
        all[n++] = id;
        p += len;
        if (*p == '\0')
            break;
        p++; /* the comma; a trailing one gives an empty entry above */
    }
    wb_id_list *l = &a->lists[which];
    wb_id_list saved = {.ids = NULL, .n = l->n};
    if (rc == WB_OK && l->n) {
        saved.ids = wb__malloc(l->n * sizeof *saved.ids);
        if (!saved.ids)
            rc = wb__err_set(err, WB_ENOMEM, "%s: out of memory", option);
        else
            memcpy(saved.ids, l->ids, l->n * sizeof *saved.ids);
    }
    for (size_t i = 0; rc == WB_OK && i < n; i++) {
        if (insert_id(l, all[i]) != 0) {
            /* Put the list back as it was. */
            free(l->ids);
            *l = saved;
            saved.ids = NULL;
            rc = wb__err_set(err, WB_ENOMEM, "%s: out of memory", option);
        }
    }
    free(saved.ids);
    if (all != ids)
        free(all);
    if (rc == WB_OK && (which == WB_AUTH_CLIENT_UIDS || which == WB_AUTH_CLIENT_GIDS))
        a->open_clients = 0;
    return rc;
}

/* Whether list l holds the peer's primary gid or one of the supplementary
 * groups read at accept. */
static int gids_on(const wb_id_list *l, const wb_peer_creds *p)
{
    if (l->n == 0)
        return 0;
    if (has_id(l, p->gid))
        return 1;
    if (p->groups.state != WB_GROUPS_READ)
        return 0;
    for (uint32_t i = 0; i < p->groups.n && i < WB_PEER_GROUPS_MAX; i++)
        if (has_id(l, p->groups.gid[i]))
            return 1;
    return 0;
}

int wb__auth_admin_ok(const wb_auth *a, const wb_peer_creds *p)
{
    return p->uid == 0 || p->uid == a->broker_euid ||
           has_id(&a->lists[WB_AUTH_ADMIN_UIDS], p->uid) ||
           gids_on(&a->lists[WB_AUTH_ADMIN_GIDS], p);
}

int wb__auth_client_ok(const wb_auth *a, const wb_peer_creds *p)
{
    return a->open_clients || wb__auth_admin_ok(a, p) ||
           has_id(&a->lists[WB_AUTH_CLIENT_UIDS], p->uid) ||
           gids_on(&a->lists[WB_AUTH_CLIENT_GIDS], p);
}

/* Appends to buf, keeping it terminated; marks truncation with "...". */
__attribute__((format(printf, 4, 5))) static void appendf(char *buf, size_t size, size_t *used,
                                                          const char *fmt, ...)
{
    if (*used + 1 >= size) {
        /* Full, and more to say. */
        if (size >= 4)
            memcpy(buf + size - 4, "...", 4);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, size - *used, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= size - *used) {
        *used = size - 1;
        if (size >= 4)
            memcpy(buf + size - 4, "...", 4);
        return;
    }
    *used += (size_t)n;
}

/* "uid 0, 1000; gid 27" from up to two uid lists and two gid lists. */
static const char *describe(const wb_auth *a, int with_clients, char *buf, size_t size)
{
    if (size == 0)
        return buf;
    buf[0] = '\0';
    size_t used = 0;
    wb_id_list uids = {0}, gids = {0};
    int oom = insert_id(&uids, 0) != 0 || insert_id(&uids, a->broker_euid) != 0;
    for (size_t i = 0; !oom && i < a->lists[WB_AUTH_ADMIN_UIDS].n; i++)
        oom = insert_id(&uids, a->lists[WB_AUTH_ADMIN_UIDS].ids[i]) != 0;
    for (size_t i = 0; !oom && i < a->lists[WB_AUTH_ADMIN_GIDS].n; i++)
        oom = insert_id(&gids, a->lists[WB_AUTH_ADMIN_GIDS].ids[i]) != 0;
    for (size_t i = 0; !oom && with_clients && i < a->lists[WB_AUTH_CLIENT_UIDS].n; i++)
        oom = insert_id(&uids, a->lists[WB_AUTH_CLIENT_UIDS].ids[i]) != 0;
    for (size_t i = 0; !oom && with_clients && i < a->lists[WB_AUTH_CLIENT_GIDS].n; i++)
        oom = insert_id(&gids, a->lists[WB_AUTH_CLIENT_GIDS].ids[i]) != 0;
    if (oom) {
        snprintf(buf, size, "(out of memory listing them)");
    } else {
        appendf(buf, size, &used, "uid");
        for (size_t i = 0; i < uids.n; i++)
            appendf(buf, size, &used, "%s%u", i ? ", " : " ", uids.ids[i]);
        for (size_t i = 0; i < gids.n; i++)
            appendf(buf, size, &used, "%s%u", i ? ", " : "; gid ", gids.ids[i]);
    }
    free(uids.ids);
    free(gids.ids);
    return buf;
}

const char *wb__auth_describe_clients(const wb_auth *a, char *buf, size_t size)
{
    if (a->open_clients) {
        snprintf(buf, size, "everyone");
        return buf;
    }
    return describe(a, 1, buf, size);
}

const char *wb__auth_describe_admins(const wb_auth *a, char *buf, size_t size)
{
    return describe(a, 0, buf, size);
}

/* Why a peer's supplementary groups are not known, to end "supplementary
 * groups could not be read because ...". */
static const char *groups_reason(const wb_peer_groups *g, uint32_t pid, char *buf, size_t size)
{
    switch (g->state) {
    case WB_GROUPS_PID_HIDDEN:
        return "the peer's pid is not visible from the broker (another pid namespace)";
    case WB_GROUPS_NO_PIDFD:
        return "no pidfd proves which process its pid names";
    case WB_GROUPS_EXITED:
        return "the process exited while they were read";
    case WB_GROUPS_OTHER_PROC:
        snprintf(buf, size,
                 "the broker's /proc does not show the process that connected as pid %u (a /proc "
                 "of another pid namespace)",
                 pid);
        return buf;
    case WB_GROUPS_IDS_CHANGED:
        snprintf(buf, size, "/proc/%u/status shows another uid or gid than the connection's", pid);
        return buf;
    case WB_GROUPS_UNREADABLE:
        snprintf(buf, size, "/proc/%u/status: %s", pid, strerror(g->err_no));
        return buf;
    case WB_GROUPS_MALFORMED:
        snprintf(buf, size, "/proc/%u/status could not be parsed", pid);
        return buf;
    default:
        return "they were not read";
    }
}

/* The shortest mention of the supplementary groups that says what is
 * matched: nothing (say_none 0) or " (no supplementary groups)" when there
 * are none, " and supplementary groups 27, 100", or " only; supplementary
 * groups could not be read because ...". */
static void append_groups(char *buf, size_t size, size_t *used, uint32_t pid,
                          const wb_peer_groups *g, int say_none)
{
    enum { SHOWN = 8 };
    if (g->state == WB_GROUPS_READ) {
        if (g->total == 0) {
            if (say_none)
                appendf(buf, size, used, " (no supplementary groups)");
            return;
        }
        appendf(buf, size, used, " and supplementary group%s", g->total == 1 ? "" : "s");
        uint32_t i;
        for (i = 0; i < g->n && i < SHOWN; i++)
            appendf(buf, size, used, "%s%u", i ? ", " : " ", g->gid[i]);
        if (g->total > i)
            appendf(buf, size, used, ", ... (%u in all)", g->total);
        return;
    }
    if (g->state == WB_GROUPS_UNREAD) {
        appendf(buf, size, used, " only (supplementary groups were not read)");
        return;
    }
    char why[160];
    appendf(buf, size, used, " only; supplementary groups could not be read because %s",
            groups_reason(g, pid, why, sizeof why));
}

const char *wb__auth_describe_gids(const wb_peer_creds *p, char *buf, size_t size)
{
    if (size == 0)
        return buf;
    size_t used = 0;
    buf[0] = '\0';
    appendf(buf, size, &used, "gid %u", p->gid);
    append_groups(buf, size, &used, p->pid, &p->groups, 1);
    return buf;
}

const char *wb__auth_groups_field(const wb_peer_creds *p, char *buf, size_t size)
{
    static const char *const unread[] = {
        [WB_GROUPS_UNREAD] = "unread:never",
        [WB_GROUPS_PID_HIDDEN] = "unread:pid_hidden",
        [WB_GROUPS_NO_PIDFD] = "unread:no_pidfd",
        [WB_GROUPS_EXITED] = "unread:exited",
        [WB_GROUPS_OTHER_PROC] = "unread:other_process",
        [WB_GROUPS_IDS_CHANGED] = "unread:ids_changed",
        [WB_GROUPS_UNREADABLE] = "unread:unreadable",
        [WB_GROUPS_MALFORMED] = "unread:malformed",
    };
    if (size == 0)
        return buf;
    buf[0] = '\0';
    const wb_peer_groups *g = &p->groups;
    if (g->state != WB_GROUPS_READ) {
        size_t k = (size_t)g->state;
        snprintf(buf, size, "%s",
                 k < sizeof unread / sizeof unread[0] && unread[k] ? unread[k] : "unread");
        return buf;
    }
    if (g->total == 0) {
        snprintf(buf, size, "none");
        return buf;
    }
    size_t used = 0;
    for (uint32_t i = 0; i < g->n && i < WB_PEER_GROUPS_MAX; i++)
        appendf(buf, size, &used, "%s%u", i ? "," : "", g->gid[i]);
    if (g->total > g->n)
        appendf(buf, size, &used, ",...");
    return buf;
}

int wb__auth_check_client(const wb_auth *a, const wb_peer_creds *peer, wb_err *err)
{
    if (!peer || (!peer->known && !peer->pid_hidden))
        return wb__err_set(err, WB_EPERM, "the peer's credentials cannot be read");
    if (wb__auth_client_ok(a, peer))
        return WB_OK;
    char who[200], gids[300];
    wb__auth_describe_clients(a, who, sizeof who);
    if (a->lists[WB_AUTH_CLIENT_GIDS].n == 0 && a->lists[WB_AUTH_ADMIN_GIDS].n == 0)
        return wb__err_set(err, WB_EPERM, "uid %u is not allowed to lease models (allowed: %s)",
                           peer->uid, who);
    return wb__err_set(err, WB_EPERM,
                       "uid %u is not allowed to lease models (allowed: %s); matched against %s",
                       peer->uid, who, wb__auth_describe_gids(peer, gids, sizeof gids));
}

int wb__auth_refuse_admin(const wb_auth *a, const wb_peer_creds *peer, const char *verb,
                          wb_err *err)
{
    char gids[300];
    if (a->lists[WB_AUTH_ADMIN_GIDS].n == 0)
        return wb__err_set(err, WB_EPERM, "uid %u may not %s models", peer->uid, verb);
    return wb__err_set(err, WB_EPERM, "uid %u may not %s models; matched against %s", peer->uid,
                       verb, wb__auth_describe_gids(peer, gids, sizeof gids));
}

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
            int on_admin = admin && has_id(admin, all[i]);
            int on_client = client && has_id(client, all[i]);
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
    size_t used = 0;
    gids[0] = '\0';
    appendf(gids, sizeof gids, &used, "gid %u", a->gid);
    /* Nothing more when the peer has no supplementary groups: the kernel's
     * rule then knows only the primary gid too. */
    if (a->groups.state != WB_GROUPS_UNREAD)
        append_groups(gids, sizeof gids, &used, a->pid, &a->groups, 0);
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
