/* Finding records by name. The safetensors reader keeps an index sorted by
 * name (it also merges and checks shards in that order); a lease's tensor
 * table keeps a hash index, so that a model binding 10^5 constants looks
 * each up in O(1): one hash and, nearly always, one comparison. A record is
 * any struct whose `const char *` name lies at `name_offset`. */
#ifndef WB_NAMES_H
#define WB_NAMES_H

#include <stddef.h>
#include <stdint.h>

/* Fills idx[0..n) with 0..n-1 ordered by the records' names. */
void wb__names_sort(size_t *idx, const void *records, size_t n, size_t stride, size_t name_offset);

/* The record called `name`, or NULL: a binary search through `by_name` (as
 * wb__names_sort makes it), or a linear scan when `by_name` is NULL. */
const void *wb__names_find(const void *records, size_t n, size_t stride, size_t name_offset,
                           const size_t *by_name, const char *name);

/* An open-addressing hash index of n records by name (XXH3 of the name):
 * at least twice as many slots as records, each the record's index and 32
 * bits of its name's hash, so that a probe compares names only when those
 * agree. A slot is (XXH3-64(name) >> 32) << 32 | (index + 1), 0 when
 * empty; a name's probe starts at XXH3-64(name) & mask and goes up, past
 * the last slot to the first. The same layout travels in a compact tensor
 * table (common/wire.h), built once by the broker. */
typedef struct wb__names_hash {
    size_t mask;    /* slots - 1; the slot count is a power of two */
    uint64_t *slot; /* `own`, or slots that live elsewhere (wb__names_hash_over) */
    uint64_t own[];
} wb__names_hash;

/* The slot count for n records: a power of two, at least 16 and 2n; 0 when
 * n is 2^32 - 1 or more. */
size_t wb__names_hash_slots(size_t n);

/* Fills slot[0..slots) (zeroed by the caller; slots from
 * wb__names_hash_slots(n)) with records 0..n-1, whose names name(ctx, i)
 * gives. A repeated name keeps its first record, as a scan would. */
void wb__names_hash_fill(uint64_t *slot, size_t slots, size_t n,
                         const char *(*name)(const void *ctx, size_t i), const void *ctx);

/* The index of records[0..n), or NULL when out of memory or n is
 * 2^32 - 1 or more (callers then use a slower way). Free with free(). */
wb__names_hash *wb__names_hash_new(const void *records, size_t n, size_t stride,
                                   size_t name_offset);

/* An index over slots someone else made and keeps (slots a power of two,
 * their layout as above, checked by the caller: at least one empty, every
 * index below the records'), or NULL when out of memory. Free with free();
 * the slots are not freed and must outlive it. */
wb__names_hash *wb__names_hash_over(const uint64_t *slot, size_t slots);

/* The record called `name` (the first of that name in records' order), or
 * NULL. */
const void *wb__names_hash_find(const wb__names_hash *h, const void *records, size_t stride,
                                size_t name_offset, const char *name);

#endif
