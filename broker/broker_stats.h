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

/* The upper bounds, in seconds, of the swap time histogram's buckets (the
 * last bucket, +Inf, after them). */
#define WB_SWAP_BUCKETS 10
#define WB_SWAP_BOUNDS                                                                             \
    {                                                                                              \
        0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0                                         \
    }

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
    /* Versions: rollouts made current, rollouts refused or failed,
     * rollbacks, and the notices queued to subscribers or dropped (their
     * queue had no room). */
    uint64_t rollouts_total;
    uint64_t rollouts_failed;
    uint64_t rollbacks_total;
    uint64_t notices_sent;
    uint64_t notices_dropped;
    /* Publishes: versions made current by one, those refused, aborted or
     * ended with their producer, the bytes copied from producers and the
     * copies' time. */
    uint64_t publishes_total;
    uint64_t publishes_failed;
    uint64_t publish_bytes_total;
    double publish_copy_seconds;
    /* Versions swapped into containers, as heartbeats report them, and a
     * histogram of the swap times (wb_container_swap_seconds). */
    uint64_t container_swaps;
    uint64_t swap_buckets[WB_SWAP_BUCKETS]; /* not cumulative: one count per bucket */
    double swap_seconds_sum;
    /* The memory budget (tier.h): models moved to the host tier, dropped
     * from both tiers, restored from the host tier, reloaded from their
     * files, and restores or reloads that failed. */
    uint64_t moved_to_host;
    uint64_t evicted;
    uint64_t restores;
    uint64_t reloads;
    uint64_t restore_failures;
    wb_request_count by_op[WB_REQUEST_COUNTERS];
    size_t n_by_op;
} wb_broker_stats;

#endif
