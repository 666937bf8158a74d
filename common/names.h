/* Finding records by name through an index sorted by name: the safetensors
 * reader's tensor table and a lease's tensor table both keep one, so that a
 * model binding 10^5 constants looks each up in O(log n). A record is any
 * struct whose `const char *` name lies at `name_offset`. */
#ifndef WB_NAMES_H
#define WB_NAMES_H

#include <stddef.h>

/* Fills idx[0..n) with 0..n-1 ordered by the records' names. */
void wb__names_sort(size_t *idx, const void *records, size_t n, size_t stride, size_t name_offset);

/* The record called `name`, or NULL: a binary search through `by_name` (as
 * wb__names_sort makes it), or a linear scan when `by_name` is NULL. */
const void *wb__names_find(const void *records, size_t n, size_t stride, size_t name_offset,
                           const size_t *by_name, const char *name);

#endif
