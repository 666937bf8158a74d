/* libFuzzer target for the safetensors header parser. The input is a whole
 * file (file_size = input size). Besides crashes and leaks, it traps when an
 * accepted table breaks the reader's promises: tensors ordered by offset and
 * tiling the data section, names unique and found by wb__st_find, and a
 * rejected second file leaving the table unchanged. Each input is parsed with
 * the memo of parsed headers on (safetensors_memo.h): a second parse of the
 * same bytes, from the memo, must give the same table, and a rejected input
 * the same error. */
#include "safetensors_memo.h"
#include "safetensors_parse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Inputs over 1 MiB only slow the search down; they find nothing new. */
#define MAX_INPUT (1u << 20)

static void check_table(const wb_st_table *t, uint64_t file_size)
{
    uint64_t start = t->n_files ? t->data_starts[0] : 0, end = start, total = 0;
    for (size_t i = 0; i < t->n_tensors; i++) {
        const wb_st_tensor *x = &t->tensors[i];
        if (x->file != 0 || wb__dtype_name(x->dtype) == NULL || x->ndim > WB_ST_MAX_DIMS ||
            wb__st_find(t, x->name) != x)
            __builtin_trap();
        /* Ordered by (offset, name); a zero-sized tensor may share the offset
         * of the tensor after it, so only sized tensors follow each other. */
        if (i > 0) {
            const wb_st_tensor *p = &t->tensors[i - 1];
            if (p->offset > x->offset || (p->offset == x->offset && strcmp(p->name, x->name) >= 0))
                __builtin_trap();
        }
        if (x->nbytes > 0) {
            if (x->offset != end)
                __builtin_trap();
            end += x->nbytes;
        } else if (x->offset < start || x->offset > file_size) {
            __builtin_trap();
        }
        total += x->nbytes;
    }
    if (t->n_files != 1 || end != file_size || total != t->total_bytes)
        __builtin_trap();
    for (size_t i = 1; i < t->n_meta; i++)
        if (strcmp(t->meta[i - 1].key, t->meta[i].key) >= 0)
            __builtin_trap();
}

static void same_tables(const wb_st_table *a, const wb_st_table *b)
{
    if (a->n_tensors != b->n_tensors || a->n_meta != b->n_meta || a->n_files != b->n_files ||
        a->total_bytes != b->total_bytes || b->remembered != 1)
        __builtin_trap();
    for (size_t i = 0; i < a->n_tensors; i++) {
        const wb_st_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->ndim != y->ndim ||
            x->offset != y->offset || x->nbytes != y->nbytes ||
            (x->ndim && memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape)))
            __builtin_trap();
    }
    for (size_t i = 0; i < a->n_meta; i++)
        if (strcmp(a->meta[i].key, b->meta[i].key) || strcmp(a->meta[i].value, b->meta[i].value))
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MAX_INPUT)
        return 0;
    wb_st_table *t = calloc(1, sizeof *t);
    if (!t)
        return 0;
    wb_err err;
    wb__st_memo_set_limit(0); /* each input starts with an empty memo */
    wb__st_memo_set_limit(4u << 20);
    int rc = wb__st_parse_header(t, 0, "fuzz", data, size, size, &err);
    if (rc == WB_OK) {
        wb_st_table *again = calloc(1, sizeof *again);
        if (again) {
            if (wb__st_parse_header(again, 0, "fuzz", data, size, size, &err) != WB_OK)
                __builtin_trap();
            same_tables(t, again);
            wb__st_table_free(&again);
        }
        check_table(t, size);
        /* The same file again as a second shard: every name is a duplicate. */
        size_t n = t->n_tensors, nm = t->n_meta;
        uint64_t total = t->total_bytes;
        rc = wb__st_parse_header(t, 1, "fuzz2", data, size, size, &err);
        if ((n > 0 && rc != WB_EFORMAT) || (n == 0 && rc != WB_OK))
            __builtin_trap();
        if (n > 0 &&
            (t->n_tensors != n || t->n_files != 1 || t->n_meta != nm || t->total_bytes != total))
            __builtin_trap();
    } else if (rc != WB_EFORMAT || err.code != rc || err.msg[0] == '\0') {
        __builtin_trap();
    } else {
        /* Nothing was kept: the same error again. */
        wb_err again;
        wb_st_table *u = calloc(1, sizeof *u);
        if (u && (wb__st_parse_header(u, 0, "fuzz", data, size, size, &again) != rc ||
                  strcmp(again.msg, err.msg) != 0))
            __builtin_trap();
        wb__st_table_free(&u);
    }
    wb__st_table_free(&t);
    return 0;
}
