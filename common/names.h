/* Finding records by name. The safetensors reader keeps an index sorted by
 * name (it also merges and checks shards in that order); a lease's tensor
 * table keeps a hash index, so that a model binding 10^5 constants looks
 * each up in O(1): one hash and, nearly always, one comparison. A record is
 * any struct whose `const char *` name lies at `name_offset`. And the name
 * nearest to a mistyped one, for "did you mean" hints. */
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
 * agree. */
typedef struct wb__names_hash {
    size_t mask;     /* slots - 1; the slot count is a power of two */
    uint64_t slot[]; /* (hash >> 32) << 32 | (index + 1); 0 = empty */
} wb__names_hash;

/* The index of records[0..n), or NULL when out of memory or n is
 * 2^32 - 1 or more (callers then use a slower way). Free with free(). */
wb__names_hash *wb__names_hash_new(const void *records, size_t n, size_t stride,
                                   size_t name_offset);

/* The record called `name` (the first of that name in records' order), or
 * NULL. */
const void *wb__names_hash_find(const wb__names_hash *h, const void *records, size_t stride,
                                size_t name_offset, const char *name);

/* The same for n names at once: out[i] is the index of the record called
 * names[i], or SIZE_MAX. Each lookup waits for memory three times (its
 * slot, its record, the record's name) when the index and the records are
 * not in the cache; here the lookups run as a pipeline that asks for each
 * of those a few lookups ahead (prefetches), so that the waits overlap. */
void wb__names_hash_find_many(const wb__names_hash *h, const void *records, size_t stride,
                              size_t name_offset, const char *const *names, size_t n, size_t *out);

/* How many single-byte insertions, deletions and substitutions turn a into
 * b (the Levenshtein distance), for "did you mean" hints; SIZE_MAX when
 * either is longer than 40 bytes (no hint is worth that work). */
size_t wb__names_distance(const char *a, const char *b);

/* The name of names[0..n) nearest to `name` when at most 2 edits away (the
 * first of equally near ones), else NULL: the hint for a mistyped command
 * or key. */
const char *wb__names_closest(const char *name, const char *const *names, size_t n);

#endif
