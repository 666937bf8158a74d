/* Copies with non-temporal (streaming) stores, for the loader's reads from a
 * file mapping into a staging buffer or a slab: the destination is written
 * once and read next by another agent (the copy engine, a client), so
 * ordinary stores would first read every destination line into the cache
 * (read for ownership) and then evict the source's lines for it. Streaming
 * stores write whole lines straight to memory.
 *
 * wb__stage_ntcopy picks the widest kind the CPU has, once (AVX2, else SSE2;
 * memcpy on other architectures), and ends with a store fence, so that the
 * bytes are visible to any thread or device that is handed the buffer
 * afterwards. Any alignment and size; src and dst must not overlap. */
#ifndef WB_BROKER_STAGE_NTCOPY_H
#define WB_BROKER_STAGE_NTCOPY_H

#include <stddef.h>

typedef void (*wb_stage_ntcopy_fn)(void *dst, const void *src, size_t n);

void wb__stage_ntcopy(void *dst, const void *src, size_t n);

/* The implementation wb__stage_ntcopy uses: "avx2", "sse2" or "memcpy". */
const char *wb__stage_ntcopy_kind(void);

/* One implementation by name ("avx2", "sse2", "memcpy"), or NULL when this
 * CPU or build lacks it; for tests and benchmarks that check each. */
wb_stage_ntcopy_fn wb__stage_ntcopy_get(const char *kind);

/* Moves the cache lines of [p, p + n) from this core's caches to the
 * shared last-level cache (CLDEMOTE), for a buffer another agent reads
 * next; nothing where the processor lacks the instruction
 * (wb__stage_can_demote, stage.h) or on other architectures. A hint: the
 * bytes are the same either way. */
void wb__stage_demote(const void *p, size_t n);

#endif
