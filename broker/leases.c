#include "leases.h"

#include "alloc.h"
#include "fdchan_wire.h"
#include "text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#include "wb.pb-c.h"

void wb__leases_init(wb_lease_table *t)
{
    memset(t, 0, sizeof *t);
    t->open_pidfd = wb__pidfd_open;
    t->epfd = -1;
    t->hint_pidfd = -1;
}

static void lease_rec_free(wb_lease_rec *l)
{
    free(l->records);
    free(l);
}

void wb__leases_destroy(wb_lease_table *t)
{
    for (size_t i = 0; i < t->n_leases; i++)
        lease_rec_free(t->leases[i]);
    for (size_t i = 0; i < t->n_peers; i++) {
        if (t->peers[i]->pidfd >= 0)
            close(t->peers[i]->pidfd);
        free(t->peers[i]);
    }
    free(t->leases);
    free(t->peers);
    wb_pidfd_open_fn open_pidfd = t->open_pidfd;
    int epfd = t->epfd;
    memset(t, 0, sizeof *t);
    t->open_pidfd = open_pidfd;
    t->epfd = epfd;
    t->hint_pidfd = -1;
}

const char *wb__lease_id_short(const uint8_t *id, char out[9])
{
    return wb__text_hex(out, 9, id, 4);
}

/* Binary search: the index of id, or where it would be inserted. */
static size_t lease_pos(const wb_lease_table *t, const uint8_t *id, int *found)
{
    size_t lo = 0, hi = t->n_leases;
    *found = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = memcmp(t->leases[mid]->id, id, WB_LEASE_ID_LEN);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

wb_lease_rec *wb__leases_find(const wb_lease_table *t, const uint8_t *id)
{
    int found;
    size_t pos = lease_pos(t, id, &found);
    return found ? t->leases[pos] : NULL;
}

/* Binary search over the peers (sorted by pid): the index of pid, or where
 * it would be inserted. */
static size_t peer_pos(const wb_lease_table *t, uint32_t pid, int *found)
{
    size_t lo = 0, hi = t->n_peers;
    *found = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint32_t p = t->peers[mid]->pid;
        if (p == pid) {
            *found = 1;
            return mid;
        }
        if (p < pid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

wb_peer_rec *wb__leases_peer(const wb_lease_table *t, uint32_t pid)
{
    int found;
    size_t i = peer_pos(t, pid, &found);
    return found ? t->peers[i] : NULL;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    void *p = wb__realloc(*arr, ncap * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

static void peer_forget(wb_lease_table *t, size_t i)
{
    wb_peer_rec *p = t->peers[i];
    if (p->pidfd >= 0)
        close(p->pidfd);
    if (p->leases > 0)
        t->n_holders--;
    free(p);
    memmove(t->peers + i, t->peers + i + 1, (t->n_peers - i - 1) * sizeof *t->peers);
    t->n_peers--;
}

/* Drops one lease from a pid's count. A peer left without leases keeps its
 * record (and pidfd) for its next acquire, unless too many such records are
 * open already. */
static void peer_put(wb_lease_table *t, uint32_t pid, uint64_t record_bytes)
{
    int found;
    size_t i = peer_pos(t, pid, &found);
    if (!found)
        return;
    wb_peer_rec *p = t->peers[i];
    p->record_bytes -= record_bytes < p->record_bytes ? record_bytes : p->record_bytes;
    if (p->leases == 0)
        return;
    if (--p->leases == 0) {
        t->n_holders--;
        if (t->n_peers - t->n_holders > WB_IDLE_PEERS_MAX)
            peer_forget(t, i);
    }
}

static int random_id(uint8_t *id, wb_err *err)
{
    size_t got = 0;
    while (got < WB_LEASE_ID_LEN) {
        ssize_t r = getrandom(id + got, WB_LEASE_ID_LEN - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return wb__err_errno(err, WB_EIO, errno, "getrandom for a lease id");
        }
        got += (size_t)r;
    }
    return WB_OK;
}

int wb__leases_grant(wb_lease_table *t, struct wb_model *model, const wb_peer_creds *c,
                     const char *comm, int64_t now_ms, double now_wall, wb_lease_rec **out,
                     wb_err *err)
{
    *out = NULL;
    if (!c || !c->known)
        return wb__err_set(err, WB_EPERM, "the peer's credentials are unknown");
    if (grow((void **)&t->leases, &t->cap_leases, t->n_leases + 1, sizeof *t->leases) != 0 ||
        grow((void **)&t->peers, &t->cap_peers, t->n_peers + 1, sizeof *t->peers) != 0)
        return wb__err_set(err, WB_ENOMEM, "out of memory growing the lease table");

    wb_lease_rec *l = wb__calloc(1, sizeof *l);
    if (!l)
        return wb__err_set(err, WB_ENOMEM, "out of memory for a lease");
    size_t pos;
    int found, rc;
    do {
        if ((rc = random_id(l->id, err)) != WB_OK) {
            free(l);
            return rc;
        }
        pos = lease_pos(t, l->id, &found);
    } while (found);

    int pfound;
    size_t ppos = peer_pos(t, c->pid, &pfound);
    wb_peer_rec *p = pfound ? t->peers[ppos] : NULL;
    if (!p) {
        p = wb__calloc(1, sizeof *p);
        if (!p) {
            free(l);
            return wb__err_set(err, WB_ENOMEM, "out of memory for a peer record");
        }
        wb_err perr;
        /* A peer known by its session has no pid to watch: its session's
         * connection is the proof of its end (fdchan_server.h). */
        int session = WB_IS_SESSION_ID(c->pid);
        int fd = -1;
        if (!session && t->hint_pidfd >= 0 && t->hint_pid == c->pid) {
            fd = fcntl(t->hint_pidfd, F_DUPFD_CLOEXEC, 3);
            if (fd < 0)
                fd = wb__err_errno(&perr, WB_EIO, errno, "dup of the pidfd of process %u", c->pid);
        } else if (t->open_pidfd && !session) {
            fd = t->open_pidfd(c->pid, &perr);
        }
        if (fd >= 0 && t->epfd >= 0) {
            struct epoll_event ev = {.events = EPOLLIN, .data.u32 = c->pid};
            if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
                int e = errno;
                close(fd);
                free(p);
                free(l);
                return wb__err_errno(err, WB_EIO, e, "cannot watch process %u", c->pid);
            }
        }
        if (fd < 0 && (t->open_pidfd || t->hint_pidfd >= 0) && !session) {
            free(p);
            free(l);
            /* The peer is gone (or its pid was reused): nobody can prove
             * this lease's end later, so it is not granted. */
            if (fd == WB_ENOTFOUND)
                return wb__err_set(err, WB_EPERM, "process %u exited before its lease was granted",
                                   c->pid);
            return wb__err_set(err, fd, "cannot watch process %u: %s", c->pid, perr.msg);
        }
        p->pid = c->pid;
        p->uid = c->uid;
        p->pidfd = fd;
        if (comm)
            snprintf(p->comm, sizeof p->comm, "%s", comm[0] ? comm : "?");
        else if (session)
            snprintf(p->comm, sizeof p->comm, "?");
        else
            wb__peer_comm(c->pid, p->comm, sizeof p->comm);
        memmove(t->peers + ppos + 1, t->peers + ppos, (t->n_peers - ppos) * sizeof *t->peers);
        t->peers[ppos] = p;
        t->n_peers++;
    }
    if (p->leases++ == 0)
        t->n_holders++;

    l->model = model;
    l->pid = c->pid;
    l->uid = c->uid;
    l->gid = c->gid;
    snprintf(l->comm, sizeof l->comm, "%s", comm ? (comm[0] ? comm : "?") : p->comm);
    l->state = WBPROTO__LEASE_STATE__LEASE_ACTIVE;
    l->granted_at = now_wall;
    l->last_heartbeat = now_wall;
    l->last_beat_ms = now_ms;
    memmove(t->leases + pos + 1, t->leases + pos, (t->n_leases - pos) * sizeof *t->leases);
    t->leases[pos] = l;
    t->n_leases++;
    *out = l;
    return WB_OK;
}

void wb__leases_remove(wb_lease_table *t, wb_lease_rec *lease)
{
    int found;
    size_t pos = lease_pos(t, lease->id, &found);
    if (!found || t->leases[pos] != lease)
        return;
    memmove(t->leases + pos, t->leases + pos + 1, (t->n_leases - pos - 1) * sizeof *t->leases);
    t->n_leases--;
    peer_put(t, lease->pid, lease->record_bytes);
    lease_rec_free(lease);
}

int wb__lease_held_by(const wb_lease_rec *l, const wb_peer_creds *c)
{
    return l && c && c->known && l->pid == c->pid && l->uid == c->uid;
}

int wb__leases_release(wb_lease_table *t, const wb_peer_creds *c, const uint8_t *id,
                       struct wb_model **model, wb_err *err)
{
    char hex[9];
    *model = NULL;
    wb_lease_rec *l = wb__leases_find(t, id);
    if (!l)
        return wb__err_set(err, WB_ENOTFOUND, "no lease %s", wb__lease_id_short(id, hex));
    if (!c || l->pid != c->pid)
        return wb__err_set(err, WB_EPERM, "lease %s belongs to pid %u", wb__lease_id_short(id, hex),
                           l->pid);
    /* Same pid, another uid: the holder changed identity (a set-user-ID
     * exec), or this is not the process that acquired the lease. */
    if (l->uid != c->uid)
        return wb__err_set(err, WB_EPERM, "lease %s belongs to pid %u (uid %u)",
                           wb__lease_id_short(id, hex), l->pid, l->uid);
    *model = l->model;
    wb__leases_remove(t, l);
    return WB_OK;
}

void wb__leases_set_records(wb_lease_table *t, wb_lease_rec *l, wb_container_rec *records,
                            uint32_t n, uint64_t bytes)
{
    /* No records (none sent, or their copy failed) cost nothing. */
    if (!records)
        bytes = 0;
    wb_peer_rec *p = wb__leases_peer(t, l->pid);
    if (p) {
        p->record_bytes -= l->record_bytes < p->record_bytes ? l->record_bytes : p->record_bytes;
        p->record_bytes += bytes;
    }
    free(l->records);
    l->records = records;
    l->n_records = records ? n : 0;
    l->record_bytes = bytes;
}

int wb__leases_heartbeat(wb_lease_table *t, const wb_peer_creds *c, const uint8_t *id,
                         uint32_t containers, int64_t now_ms, double now_wall, int *revived)
{
    *revived = 0;
    wb_lease_rec *l = wb__leases_find(t, id);
    if (!wb__lease_held_by(l, c))
        return WB_ENOTFOUND;
    l->last_beat_ms = now_ms;
    l->last_heartbeat = now_wall;
    l->containers = containers;
    if (l->state == WBPROTO__LEASE_STATE__LEASE_STALE)
        *revived = 1;
    l->state = WBPROTO__LEASE_STATE__LEASE_ACTIVE;
    return WB_OK;
}

size_t wb__leases_mark_stale(wb_lease_table *t, int64_t now_ms, int64_t stale_ms, wb_lease_cb cb,
                             void *ctx)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n_leases; i++) {
        wb_lease_rec *l = t->leases[i];
        if (l->state == WBPROTO__LEASE_STATE__LEASE_ACTIVE && now_ms - l->last_beat_ms > stale_ms) {
            l->state = WBPROTO__LEASE_STATE__LEASE_STALE;
            n++;
            if (cb)
                cb(l, ctx);
        }
    }
    return n;
}

size_t wb__leases_reclaim_pid(wb_lease_table *t, uint32_t pid, wb_lease_cb cb, void *ctx)
{
    int found;
    size_t i = peer_pos(t, pid, &found);
    if (found && t->peers[i]->leases == 0) {
        /* A peer kept between leases: only its record goes. */
        peer_forget(t, i);
        return 0;
    }
    /* One pass that keeps the other leases in order: removing them one by
     * one would move the array once per lease. */
    size_t n = 0, kept = 0;
    for (size_t k = 0; k < t->n_leases; k++) {
        wb_lease_rec *l = t->leases[k];
        if (l->pid != pid) {
            t->leases[kept++] = l;
            continue;
        }
        if (cb)
            cb(l, ctx);
        peer_put(t, l->pid, l->record_bytes);
        lease_rec_free(l);
        n++;
    }
    t->n_leases = kept;
    i = peer_pos(t, pid, &found);
    if (found)
        peer_forget(t, i);
    return n;
}

size_t wb__leases_count_state(const wb_lease_table *t, int state)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n_leases; i++)
        n += t->leases[i]->state == state;
    return n;
}

void wb__leases_quota_use(const wb_lease_table *t, const wb_peer_creds *c, uint32_t *leases,
                          uint64_t *record_bytes)
{
    uint32_t n = 0;
    uint64_t bytes = 0;
    if (!WB_IS_SESSION_ID(c->pid)) {
        const wb_peer_rec *p = wb__leases_peer(t, c->pid);
        if (p) {
            n = p->leases;
            bytes = p->record_bytes;
        }
    } else {
        /* Session ids sort above every pid: the walk starts at the first. */
        int found;
        for (size_t i = peer_pos(t, WB_SESSION_ID_BASE, &found); i < t->n_peers; i++) {
            const wb_peer_rec *p = t->peers[i];
            if (WB_IS_SESSION_ID(p->pid) && p->uid == c->uid) {
                n += p->leases;
                bytes += p->record_bytes;
            }
        }
    }
    if (leases)
        *leases = n;
    if (record_bytes)
        *record_bytes = bytes;
}
