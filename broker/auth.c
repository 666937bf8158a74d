#include "auth.h"

#include "alloc.h"
#include "wire.h"
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Entries in one list option; far more than any sane deployment names. */
#define AUTH_MAX_IDS 4096
/* getpwnam_r/getgrnam_r buffers: large enough for big group lists. */
#define AUTH_NSS_BUF (64 * 1024)

static int is_gid_list(wb_auth_list which)
{
    return which == WB_AUTH_CLIENT_GIDS || which == WB_AUTH_ADMIN_GIDS ||
           which == WB_AUTH_PUBLISH_GIDS;
}

static const char *list_kind(wb_auth_list which)
{
    return is_gid_list(which) ? "group" : "user";
}

int wb__auth_id_listed(const wb_id_list *l, uint32_t id)
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
    if (wb__auth_id_listed(l, id))
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
    for (int i = 0; i < WB_AUTH_N_LISTS; i++) {
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
    if ((unsigned)which >= WB_AUTH_N_LISTS)
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
    if (wb__auth_id_listed(l, p->gid))
        return 1;
    if (p->groups.state != WB_GROUPS_READ)
        return 0;
    for (uint32_t i = 0; i < p->groups.n && i < WB_PEER_GROUPS_MAX; i++)
        if (wb__auth_id_listed(l, p->groups.gid[i]))
            return 1;
    return 0;
}

int wb__auth_admin_ok(const wb_auth *a, const wb_peer_creds *p)
{
    return p->uid == 0 || p->uid == a->broker_euid ||
           wb__auth_id_listed(&a->lists[WB_AUTH_ADMIN_UIDS], p->uid) ||
           gids_on(&a->lists[WB_AUTH_ADMIN_GIDS], p);
}

int wb__auth_publish_ok(const wb_auth *a, const wb_peer_creds *p)
{
    return wb__auth_admin_ok(a, p) || wb__auth_id_listed(&a->lists[WB_AUTH_PUBLISH_UIDS], p->uid) ||
           gids_on(&a->lists[WB_AUTH_PUBLISH_GIDS], p);
}

int wb__auth_client_ok(const wb_auth *a, const wb_peer_creds *p)
{
    return a->open_clients || wb__auth_publish_ok(a, p) ||
           wb__auth_id_listed(&a->lists[WB_AUTH_CLIENT_UIDS], p->uid) ||
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

const char *wb__auth_describe_groups(uint32_t gid, uint32_t pid, const wb_peer_groups *g,
                                     int say_none, char *buf, size_t size)
{
    if (size == 0)
        return buf;
    size_t used = 0;
    buf[0] = '\0';
    appendf(buf, size, &used, "gid %u", gid);
    append_groups(buf, size, &used, pid, g, say_none);
    return buf;
}

const char *wb__auth_describe_gids(const wb_peer_creds *p, char *buf, size_t size)
{
    return wb__auth_describe_groups(p->gid, p->pid, &p->groups, 1, buf, size);
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
