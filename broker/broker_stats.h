/* The broker's counters (wb_broker.stats): requests, leases, loads and the
 * connections the transport refused or cut. A header of their own so that
 * the transport (conn.h), which counts into them, needs nothing else of the
 * broker's state. */
#ifndef WB_BROKER_BROKER_STATS_H
#define WB_BROKER_BROKER_STATS_H

#include <stddef.h>
#include <stdint.h>

/* Requests answered with one status for one operation. `op` is the field
 * number of the Request's body (wbproto__request__descriptor names it), 0
 * for a request that could not be decoded. */
typedef struct wb_request_count {
    uint32_t op;
    int32_t status;
    uint64_t n;
} wb_request_count;

/* Distinct (operation, status) pairs counted; more are not told apart. */
#define WB_REQUEST_COUNTERS 128

typedef struct wb_broker_stats {
    uint64_t requests_total;
    uint64_t requests_failed;
    uint64_t malformed_messages;
    uint64_t replies_dropped;
    uint64_t leases_granted;
    uint64_t leases_released;
    uint64_t leases_reclaimed;
    uint64_t requests_refused;   /* peers not on the allow lists */
    uint64_t limit_refusals;     /* requests refused with WB_ELIMIT */
    uint64_t peers_refused;      /* connections closed at once: --max-peers reached */
    uint64_t peers_disconnected; /* connections closed for breaking a transport bound */
    uint32_t connections;        /* connections open now (the loop keeps it) */
    uint64_t loads_total;
    uint64_t loads_failed;
    uint64_t loads_cancelled; /* stopped by an unload; not in loads_total */
    uint64_t load_bytes_total;
    double load_seconds_total;
    wb_request_count by_op[WB_REQUEST_COUNTERS];
    size_t n_by_op;
} wb_broker_stats;

#endif
