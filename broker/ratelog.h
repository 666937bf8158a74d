/* Rate limits for the log lines that peers cause (refusals, malformed
 * messages, disconnections), as the kernel's printk_ratelimit does: per
 * event and per peer key (its uid), at most WB_RATELOG_BURST lines every
 * WB_RATELOG_INTERVAL_MS; the first line written after some were withheld
 * says how many (suppressed=N). A bound over every key together keeps a
 * peer that varies its key from flooding the log. Only the event loop's
 * thread calls these. */
#ifndef WB_BROKER_RATELOG_H
#define WB_BROKER_RATELOG_H

#include "clock.h"
#include "log.h"

#include <stdint.h>

#define WB_RATELOG_BURST       10
#define WB_RATELOG_INTERVAL_MS 5000
/* Lines a second over every event and key together. */
#define WB_RATELOG_GLOBAL_PER_S 50

/* 1 when a line of `event` for `key` may be written now; *suppressed is
 * then the number withheld for them (and, for the global bound, for
 * others) since the last one written. 0 when it is withheld (counted). */
int wb__ratelog_allow(const char *event, uint64_t key, int64_t now_ms, uint64_t *suppressed);

/* Lines withheld since the start (for tests and the stats). */
uint64_t wb__ratelog_suppressed_total(void);

/* Forgets every window (tests). */
void wb__ratelog_reset(void);

/* A warning caused by a peer, rate limited by event and key. */
#define wb_warn_peer(event, key, fmt, ...)                                                         \
    do {                                                                                           \
        uint64_t sup_;                                                                             \
        if (wb__ratelog_allow(event, (uint64_t)(key), wb__clock_mono_ms(), &sup_)) {               \
            if (sup_)                                                                              \
                wb_warn(event, fmt " suppressed=%llu", __VA_ARGS__, (unsigned long long)sup_);     \
            else                                                                                   \
                wb_warn(event, fmt, __VA_ARGS__);                                                  \
        }                                                                                          \
    } while (0)

#endif
