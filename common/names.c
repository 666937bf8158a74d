#include "names.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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
    wb__names_hash *h = calloc(1, sizeof *h + slots * sizeof h->slot[0]);
    if (!h)
        return NULL;
    h->mask = slots - 1;
    layout l = {records, stride, name_offset};
    for (size_t i = 0; i < n; i++) {
        const char *name = name_at(&l, i);
        uint64_t x = XXH3_64bits(name, strlen(name));
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

const void *wb__names_hash_find(const wb__names_hash *h, const void *records, size_t stride,
                                size_t name_offset, const char *name)
{
    layout l = {records, stride, name_offset};
    uint64_t x = XXH3_64bits(name, strlen(name));
    uint64_t tag = x >> 32;
    for (size_t at = (size_t)x & h->mask;; at = (at + 1) & h->mask) {
        uint64_t s = h->slot[at];
        if (s == 0)
            return NULL;
        size_t i = (size_t)(uint32_t)s - 1;
        if (s >> 32 == tag && strcmp(name_at(&l, i), name) == 0)
            return l.base + i * stride;
    }
}
