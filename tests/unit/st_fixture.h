/* Helpers of the safetensors tests: a file's bytes built in memory, and two
 * tables compared field by field. Header-only, static: each test program
 * takes what it uses. */
#ifndef WB_TEST_ST_FIXTURE_H
#define WB_TEST_ST_FIXTURE_H

#include "safetensors.h"

#include <check.h>

#include <stdint.h>
#include <string.h>

static inline void st_put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A file in buf: the 8-byte length, the JSON, data_len bytes of 0xab. */
static inline size_t st_build(unsigned char *buf, size_t cap, const char *json, uint64_t data_len)
{
    size_t jl = strlen(json);
    ck_assert_uint_le(8 + jl + data_len, cap);
    st_put_le64(buf, jl);
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, 0xab, (size_t)data_len);
    return 8 + jl + (size_t)data_len;
}

/* Every field of two tables equal, b's lookups by name right, and no name
 * shared between them (each table owns its copies). */
static inline void st_same_tables(const wb_st_table *a, const wb_st_table *b)
{
    ck_assert_uint_eq(a->n_files, b->n_files);
    for (uint32_t i = 0; i < a->n_files; i++) {
        ck_assert_str_eq(a->files[i], b->files[i]);
        ck_assert_uint_eq(a->file_sizes[i], b->file_sizes[i]);
        ck_assert_uint_eq(a->data_starts[i], b->data_starts[i]);
    }
    ck_assert_uint_eq(a->n_tensors, b->n_tensors);
    for (size_t i = 0; i < a->n_tensors; i++) {
        const wb_st_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        ck_assert_str_eq(x->name, y->name);
        ck_assert_ptr_ne(x->name, y->name);
        ck_assert_int_eq(x->dtype, y->dtype);
        ck_assert_uint_eq(x->ndim, y->ndim);
        for (uint32_t d = 0; d < x->ndim; d++)
            ck_assert_uint_eq(x->shape[d], y->shape[d]);
        ck_assert_uint_eq(x->file, y->file);
        ck_assert_uint_eq(x->offset, y->offset);
        ck_assert_uint_eq(x->nbytes, y->nbytes);
        ck_assert_ptr_eq(wb__st_find(b, x->name), y);
    }
    ck_assert_uint_eq(a->n_meta, b->n_meta);
    for (size_t i = 0; i < a->n_meta; i++) {
        ck_assert_str_eq(a->meta[i].key, b->meta[i].key);
        ck_assert_str_eq(a->meta[i].value, b->meta[i].value);
    }
    ck_assert_uint_eq(a->total_bytes, b->total_bytes);
    ck_assert_int_eq(a->by_name != NULL, b->by_name != NULL);
}

#endif
