#include "connguard.h"

#include "alloc.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

typedef enum guard_state { WAITING, IN_REQUEST, CUT } guard_state;

struct wb_guarded {
    wb_guarded *prev, *next;
    int64_t since;            /* when it began waiting for its current request */
    unsigned long long round; /* the sweep count when it was accepted */
    int fd;
    guard_state state;
    sa_family_t family;
    unsigned char addr[16]; /* the peer's address, without the port */
};

void wb__connguard_init(wb_connguard *g, int64_t timeout_ms, unsigned max_waiting_per_addr,
                        unsigned max_waiting)
{
    *g = (wb_connguard){.timeout_ms = timeout_ms,
                        .max_waiting_per_addr = max_waiting_per_addr,
                        .max_waiting = max_waiting};
}

static void unlink_conn(wb_connguard *g, wb_guarded *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        g->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        g->tail = c->prev;
    c->prev = c->next = NULL;
}

/* Deadlines are kept in order by appending: `since` only grows. */
static void append(wb_connguard *g, wb_guarded *c)
{
    c->prev = g->tail;
    c->next = NULL;
    if (g->tail)
        g->tail->next = c;
    else
        g->head = c;
    g->tail = c;
}

wb_guarded *wb__connguard_add(wb_connguard *g, int fd, const struct sockaddr *addr, int64_t now)
{
    wb_guarded *c = wb__calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;
    c->since = now;
    c->round = g->rounds;
    c->state = WAITING;
    if (addr && addr->sa_family == AF_INET) {
        c->family = AF_INET;
        memcpy(c->addr, &((const struct sockaddr_in *)addr)->sin_addr, 4);
    } else if (addr && addr->sa_family == AF_INET6) {
        c->family = AF_INET6;
        memcpy(c->addr, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
    }
    append(g, c);
    g->n++;
    g->n_waiting++;
    return c;
}

void wb__connguard_request(wb_connguard *g, wb_guarded *c)
{
    if (c->state != WAITING)
        return;
    c->state = IN_REQUEST;
    g->n_waiting--;
}

void wb__connguard_done(wb_connguard *g, wb_guarded *c, int64_t now)
{
    if (c->state == CUT)
        return;
    if (c->state == IN_REQUEST) {
        c->state = WAITING;
        g->n_waiting++;
    }
    c->since = now;
    unlink_conn(g, c);
    append(g, c);
}

void wb__connguard_remove(wb_connguard *g, wb_guarded **cp)
{
    wb_guarded *c = cp ? *cp : NULL;
    if (!c)
        return;
    if (c->state == WAITING)
        g->n_waiting--;
    unlink_conn(g, c);
    g->n--;
    free(c);
    *cp = NULL;
}

static void cut_one(wb_connguard *g, wb_guarded *c, wb_cut_reason why, wb_cut_fn *cut, void *cls)
{
    if (c->state == WAITING)
        g->n_waiting--;
    c->state = CUT;
    g->cut[why]++;
    cut(cls, c->fd, why);
}

static int same_addr(const wb_guarded *a, const wb_guarded *b)
{
    return a->family == b->family && memcmp(a->addr, b->addr, sizeof a->addr) == 0;
}

/* Accepted since the last sweep: the server has not yet had a round in
 * which to read its request, so it is not crowded out yet. */
static int fresh(const wb_connguard *g, const wb_guarded *c)
{
    return c->round == g->rounds;
}

long wb__connguard_sweep(wb_connguard *g, int64_t now, wb_cut_fn *cut, void *cls)
{
    /* Oldest first: the walk stops at the first deadline still ahead. */
    for (wb_guarded *c = g->head, *next; c; c = next) {
        next = c->next;
        if (c->state == CUT)
            continue;
        if (now - c->since < g->timeout_ms)
            break;
        cut_one(g, c, WB_CUT_TIMEOUT, cut, cls);
    }
    /* One address over its cap: newest first, a waiting connection with
     * the cap's worth of newer waiting ones from its address goes. No
     * address can be over it while fewer wait in all, which is the usual
     * case; otherwise the walk costs n times the cap for n connections (at
     * most the server's connection limit). */
    if (g->n_waiting > g->max_waiting_per_addr) {
        for (wb_guarded *c = g->tail, *prev; c; c = prev) {
            prev = c->prev;
            if (c->state != WAITING || fresh(g, c))
                continue;
            unsigned newer = 0;
            for (const wb_guarded *d = c->next; d && newer < g->max_waiting_per_addr; d = d->next)
                newer += d->state == WAITING && same_addr(c, d);
            if (newer >= g->max_waiting_per_addr)
                cut_one(g, c, WB_CUT_CROWDED, cut, cls);
        }
    }
    for (wb_guarded *c = g->head; c && g->n_waiting > g->max_waiting; c = c->next) {
        if (c->state == WAITING && !fresh(g, c))
            cut_one(g, c, WB_CUT_CROWDED, cut, cls);
    }
    g->rounds++;
    for (const wb_guarded *c = g->head; c; c = c->next) {
        if (c->state != CUT)
            return (long)(c->since + g->timeout_ms - now);
    }
    return -1;
}

void wb__connguard_destroy(wb_connguard *g)
{
    while (g->head) {
        wb_guarded *c = g->head;
        wb__connguard_remove(g, &c);
    }
}
