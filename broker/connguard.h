/* Which of the metrics endpoint's HTTP connections to cut, decided apart
 * from any socket so that the rules are tested exactly (metrics.c applies
 * them to libmicrohttpd's connections).
 *
 * A connection waits for a request from its accept, and again from the end
 * of each response, until that request's headers are in. It must have sent
 * a whole request and taken its response within the timeout of the moment
 * it began waiting, however it trickles. And when more connections wait
 * than the caps allow, from one address or from all, those that have waited
 * longest are cut first, never one accepted since the last sweep (the
 * server has not had a round to read its request yet): a scraper's request
 * is there when it is accepted, so it is read before the scraper can be
 * cut, and it is served while connections that trickle their headers come
 * and go.
 *
 * Not thread-safe: every call comes from the thread that runs the HTTP
 * server, where connections start, finish requests and close. */
#ifndef WB_BROKER_CONNGUARD_H
#define WB_BROKER_CONNGUARD_H

#include <stdint.h>
#include <sys/socket.h>

typedef enum wb_cut_reason {
    WB_CUT_TIMEOUT, /* no whole request and response within the timeout */
    WB_CUT_CROWDED, /* waited longest while more than a cap were waiting */
    WB_CUT_REASONS
} wb_cut_reason;

/* One connection, owned by the guard (freed by wb__connguard_remove). */
typedef struct wb_guarded wb_guarded;

typedef struct wb_connguard {
    int64_t timeout_ms;
    unsigned max_waiting_per_addr;
    unsigned max_waiting;
    wb_guarded *head, *tail;                /* by the time each began waiting, oldest first */
    unsigned n;                             /* connections tracked, cut ones included */
    unsigned n_waiting;                     /* of them, waiting for a request and not cut */
    unsigned long long cut[WB_CUT_REASONS]; /* since init, by reason */
    unsigned long long rounds;              /* sweeps so far */
} wb_connguard;

void wb__connguard_init(wb_connguard *g, int64_t timeout_ms, unsigned max_waiting_per_addr,
                        unsigned max_waiting);

/* Tracks a connection accepted at `now` on socket fd from addr (IPv4 or
 * IPv6; other families all count as one address). NULL when out of memory:
 * the caller must then close the connection itself. */
wb_guarded *wb__connguard_add(wb_connguard *g, int fd, const struct sockaddr *addr, int64_t now);

/* The request's headers are in: the connection no longer waits (its
 * deadline still runs until the response is sent). */
void wb__connguard_request(wb_connguard *g, wb_guarded *c);

/* The response was sent at `now`: the connection waits for its next
 * request, with a new deadline. */
void wb__connguard_done(wb_connguard *g, wb_guarded *c, int64_t now);

/* The connection is closed: forgets it and sets *c to NULL. NULL is fine. */
void wb__connguard_remove(wb_connguard *g, wb_guarded **c);

/* Called once for each connection to cut, with its socket; from then on the
 * connection counts as neither waiting nor in a request, until removed. */
typedef void wb_cut_fn(void *cls, int fd, wb_cut_reason why);

/* To be called after each round of the server. Cuts every connection past
 * its deadline, then, while more than max_waiting_per_addr connections
 * from one address wait (or more than max_waiting from all), the one of
 * them that has waited longest, unless it was added since the last sweep.
 * Returns the milliseconds until the next deadline, -1 when no connection
 * that is not cut is tracked. */
long wb__connguard_sweep(wb_connguard *g, int64_t now, wb_cut_fn *cut, void *cls);

/* Frees whatever is still tracked. */
void wb__connguard_destroy(wb_connguard *g);

#endif
