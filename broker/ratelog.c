#include "ratelog.h"

#include <string.h>

/* Windows kept at once: a direct-mapped table by (event, key). A key that
 * takes another's slot starts a new window; the global bound still holds. */
#define SLOTS 256

typedef struct slot {
    const char *event; /* compared by address: events are string literals */
    uint64_t key;
    int64_t start_ms;
    uint32_t lines;
    uint64_t suppressed;
} slot;

static slot slots[SLOTS];
static int64_t global_start_ms;
static uint32_t global_lines;
static uint64_t global_suppressed; /* withheld by the global bound, not yet told */
static uint64_t suppressed_total;

static size_t slot_of(const char *event, uint64_t key)
{
    uint64_t h = (uint64_t)(uintptr_t)event * 0x9e3779b97f4a7c15ull ^ key * 0xc2b2ae3d27d4eb4full;
    return (size_t)(h >> 56) % SLOTS;
}

int wb__ratelog_allow(const char *event, uint64_t key, int64_t now_ms, uint64_t *suppressed)
{
    *suppressed = 0;
    slot *s = &slots[slot_of(event, key)];
    if (s->event != event || s->key != key) {
        *s = (slot){.event = event, .key = key, .start_ms = now_ms};
    } else if (now_ms - s->start_ms >= WB_RATELOG_INTERVAL_MS) {
        s->start_ms = now_ms;
        s->lines = 0;
    }
    if (now_ms - global_start_ms >= 1000) {
        global_start_ms = now_ms;
        global_lines = 0;
    }
    if (s->lines >= WB_RATELOG_BURST || global_lines >= WB_RATELOG_GLOBAL_PER_S) {
        if (s->lines >= WB_RATELOG_BURST)
            s->suppressed++;
        else
            global_suppressed++;
        suppressed_total++;
        return 0;
    }
    s->lines++;
    global_lines++;
    *suppressed = s->suppressed + global_suppressed;
    s->suppressed = 0;
    global_suppressed = 0;
    return 1;
}

uint64_t wb__ratelog_suppressed_total(void)
{
    return suppressed_total;
}

void wb__ratelog_reset(void)
{
    memset(slots, 0, sizeof slots);
    global_start_ms = 0;
    global_lines = 0;
    global_suppressed = 0;
    suppressed_total = 0;
}
