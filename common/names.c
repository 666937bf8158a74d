#include "names.h"

#include "alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* How many records or lookups apart the pipelines' stages are (the index's
 * building and wb__names_hash_find_many): far enough that a
 * prefetch has landed by the time its stage reads (a memory latency is a
 * few hundred cycles; one stage's work is tens), near enough that what was
 * fetched is still in the cache. */
#define AHEAD 8u

typedef struct layout {
    const char *base;
    size_t stride, name_offset;
} layout;

static const char *name_at(const layout *l, size_t i)
{
    const char *name;
    memcpy(&name, l->base + i * l->stride + l->name_offset, sizeof name);
    return name;
}

static int cmp_index(const void *a, const void *b, void *arg)
{
    return strcmp(name_at(arg, *(const size_t *)a), name_at(arg, *(const size_t *)b));
}

void wb__names_sort(size_t *idx, const void *records, size_t n, size_t stride, size_t name_offset)
{
    layout l = {records, stride, name_offset};
    int sorted = 1;
    for (size_t i = 0; i < n; i++) {
        idx[i] = i;
        sorted = sorted && (i == 0 || strcmp(name_at(&l, i - 1), name_at(&l, i)) <= 0);
    }
    /* Lease tables come in name order (the broker sorts them once per
     * model): one pass instead of n log n comparisons of long names. */
    if (!sorted)
        qsort_r(idx, n, sizeof *idx, cmp_index, &l);
}

const void *wb__names_find(const void *records, size_t n, size_t stride, size_t name_offset,
                           const size_t *by_name, const char *name)
{
    layout l = {records, stride, name_offset};
    if (!by_name) {
        for (size_t i = 0; i < n; i++)
            if (strcmp(name_at(&l, i), name) == 0)
                return l.base + i * stride;
        return NULL;
    }
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name_at(&l, by_name[mid]), name);
        if (c == 0)
            return l.base + by_name[mid] * stride;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

wb__names_hash *wb__names_hash_new(const void *records, size_t n, size_t stride, size_t name_offset)
{
    if (n >= UINT32_MAX)
        return NULL;
    size_t slots = 16;
    while (slots < 2 * n)
        slots *= 2;
    wb__names_hash *h = wb__calloc(1, sizeof *h + slots * sizeof h->slot[0]);
    if (!h)
        return NULL;
    h->mask = slots - 1;
    layout l = {records, stride, name_offset};
    /* Record i's name is hashed and its slot asked for (a prefetch) AHEAD
     * records before it is placed: the slots are written in random order,
     * and the waits for them overlap. */
    uint64_t hash[2 * AHEAD];
    for (size_t step = 0; step < n + AHEAD; step++) {
        if (step < n) {
            const char *nm = name_at(&l, step);
            uint64_t x = XXH3_64bits(nm, strlen(nm));
            hash[step % (2 * AHEAD)] = x;
            __builtin_prefetch(&h->slot[(size_t)x & h->mask], 1);
        }
        if (step < AHEAD)
            continue;
        size_t i = step - AHEAD;
        const char *name = name_at(&l, i);
        uint64_t x = hash[i % (2 * AHEAD)];
        size_t at = (size_t)x & h->mask;
        uint64_t tag = x >> 32;
        for (;;) {
            uint64_t s = h->slot[at];
            if (s == 0) {
                h->slot[at] = tag << 32 | (uint64_t)(i + 1);
                break;
            }
            /* A repeated name keeps its first record, as a scan would. */
            if (s >> 32 == tag && strcmp(name_at(&l, (size_t)(uint32_t)s - 1), name) == 0)
                break;
            at = (at + 1) & h->mask;
        }
    }
    return h;
}

/* The index of the record called `name`, whose XXH3-64 is x, or SIZE_MAX:
 * the probe from its first slot on to an empty one. */
static size_t probe(const wb__names_hash *h, const layout *l, uint64_t x, const char *name)
{
    uint64_t tag = x >> 32;
    for (size_t at = (size_t)x & h->mask;; at = (at + 1) & h->mask) {
        uint64_t s = h->slot[at];
        if (s == 0)
            return SIZE_MAX;
        size_t i = (size_t)(uint32_t)s - 1;
        if (s >> 32 == tag && strcmp(name_at(l, i), name) == 0)
            return i;
    }
}

const void *wb__names_hash_find(const wb__names_hash *h, const void *records, size_t stride,
                                size_t name_offset, const char *name)
{
    layout l = {records, stride, name_offset};
    size_t i = probe(h, &l, XXH3_64bits(name, strlen(name)), name);
    return i == SIZE_MAX ? NULL : l.base + i * stride;
}

void wb__names_hash_find_many(const wb__names_hash *h, const void *records, size_t stride,
                              size_t name_offset, const char *const *names, size_t n, size_t *out)
{
    layout l = {records, stride, name_offset};
    uint64_t hash[4 * AHEAD];
    /* Lookup i: at step i its name is hashed and its first slot asked for;
     * at i + AHEAD that slot is read and its record asked for; at
     * i + 2 AHEAD the record's name is asked for; at i + 3 AHEAD it is
     * compared, and probed on as a single lookup would when the first slot
     * was not it. */
    for (size_t step = 0; step < n + 3 * AHEAD; step++) {
        if (step < n) {
            uint64_t x = XXH3_64bits(names[step], strlen(names[step]));
            hash[step % (4 * AHEAD)] = x;
            __builtin_prefetch(&h->slot[(size_t)x & h->mask]);
        }
        if (step >= AHEAD && step - AHEAD < n) {
            size_t j = step - AHEAD;
            uint64_t s = h->slot[(size_t)hash[j % (4 * AHEAD)] & h->mask];
            if (s)
                __builtin_prefetch(l.base + ((size_t)(uint32_t)s - 1) * stride + name_offset);
        }
        if (step >= 2 * AHEAD && step - 2 * AHEAD < n) {
            size_t j = step - 2 * AHEAD;
            uint64_t s = h->slot[(size_t)hash[j % (4 * AHEAD)] & h->mask];
            if (s)
                __builtin_prefetch(name_at(&l, (size_t)(uint32_t)s - 1));
        }
        if (step >= 3 * AHEAD) {
            size_t j = step - 3 * AHEAD;
            out[j] = probe(h, &l, hash[j % (4 * AHEAD)], names[j]);
        }
    }
}

size_t wb__names_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return SIZE_MAX;
    size_t row[41];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *wb__names_closest(const char *name, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < n; i++) {
        size_t d = wb__names_distance(name, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best;
}
