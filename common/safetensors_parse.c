/* The safetensors header parser: header bytes in, tensor table out, no I/O
 * (as hiredis' read.c apart from its net.c). The format: an 8-byte
 * little-endian header length N, N bytes of UTF-8 JSON describing the tensors,
 * then the data section that the tensors must tile exactly. The fuzzer drives
 * wb__st_parse_header directly. */
#include "safetensors_parse.h"

#include "alloc.h"
#include "names.h"
#include "safetensors_memo.h"

#include <jansson.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Names are quoted in messages with a length cap, so that a huge name cannot push
 * the rest of the message out of the fixed-size error buffer. */
#define NAMEF "'%.200s'"
#define FILEF "%.400s"

int wb__st_fail(wb_err *err, int code, const char *file, const char *fmt, ...)
{
    char name[401];
    snprintf(name, sizeof name, FILEF, file);
    va_list ap;
    va_start(ap, fmt);
    wb__err_vsetp(err, code, name, fmt, ap);
    va_end(ap);
    return code;
}

int wb__st_json_nomem(json_t **root, const json_error_t *je, unsigned long failures_before)
{
    int nomem =
        wb__alloc_jansson_failures() != failures_before ||
        (!*root && (json_error_code(je) == json_error_out_of_memory || je->text[0] == '\0'));
    if (nomem) {
        json_decref(*root);
        *root = NULL;
    }
    return nomem;
}

const char *wb__st_json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "a JSON value";
}

uint64_t wb__st_load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* "[2, 3]" into buf, shortened with "..." when it does not fit. */
static const char *format_shape(char *buf, size_t size, const uint64_t *shape, uint32_t ndim)
{
    size_t used = 0;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, size, "[");
    for (uint32_t i = 0; i < ndim && used < size; i++) {
        int n = snprintf(buf + used, size - used, "%s%" PRIu64, i ? ", " : "", shape[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    if (used + 2 <= size) {
        strcat(buf, "]");
    } else if (size >= 5) {
        strcpy(buf + size - 5, "...]");
    }
    return buf;
}

/* A tensor and a metadata entry while their file is validated, before they
 * join the table. */
typedef wb_st_pending pending;
typedef wb_st_pending_meta pending_meta;

/* Reads a non-negative JSON integer, saying what is wrong otherwise. */
/* A shape dimension or an offset: a non-negative integer, else the error
 * naming the tensor, the entry (`field`: "shape[2]", "data_offsets end")
 * and what such entries are (`what`: "dimensions", "offsets"). */
static int get_uint(const char *file, const char *name, const char *field, const char *what,
                    const json_t *v, uint64_t *out, wb_err *err)
{
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return WB_OK;
    }
    if (json_is_integer(v))
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": %s is %" JSON_INTEGER_FORMAT
                           "; %s must be non-negative integers",
                           name, field, json_integer_value(v), what);
    return wb__st_fail(err, WB_EFORMAT, file,
                       "tensor " NAMEF ": %s is %s; %s must be non-negative integers", name, field,
                       wb__st_json_kind(v), what);
}

static int validate_tensor(const char *file, const char *name, json_t *entry, pending *out,
                           wb_err *err)
{
    if (!json_is_object(entry))
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": entry is %s, expected an object with dtype, shape "
                           "and data_offsets",
                           name, wb__st_json_kind(entry));
    const char *field;
    json_t *value;
    json_object_foreach(entry, field, value)
    {
        if (strcmp(field, "dtype") && strcmp(field, "shape") && strcmp(field, "data_offsets"))
            return wb__st_fail(err, WB_EFORMAT, file,
                               "tensor " NAMEF ": unexpected field '%.100s' (only dtype, shape and "
                               "data_offsets are allowed)",
                               name, field);
    }
    static const char *const required[] = {"dtype", "shape", "data_offsets"};
    for (size_t i = 0; i < 3; i++)
        if (!json_object_get(entry, required[i]))
            return wb__st_fail(err, WB_EFORMAT, file, "tensor " NAMEF ": missing field '%s'", name,
                               required[i]);

    json_t *jd = json_object_get(entry, "dtype");
    if (!json_is_string(jd))
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": dtype is %s, expected a string", name,
                           wb__st_json_kind(jd));
    const char *dname = json_string_value(jd);
    int dt = wb__dtype_parse(dname);
    if (dt < 0) {
        for (int i = 0; i < WB_DTYPE_COUNT; i++)
            if (strcasecmp(dname, wb__dtype_name((wb_dtype)i)) == 0)
                return wb__st_fail(err, WB_EFORMAT, file,
                                   "tensor " NAMEF ": unknown dtype '%.40s' (dtype names are "
                                   "case-sensitive; did you mean '%s'?)",
                                   name, dname, wb__dtype_name((wb_dtype)i));
        return wb__st_fail(err, WB_EFORMAT, file, "tensor " NAMEF ": unknown dtype '%.40s'", name,
                           dname);
    }

    json_t *js = json_object_get(entry, "shape");
    if (!json_is_array(js))
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF
                           ": shape is %s, expected an array of non-negative integers",
                           name, wb__st_json_kind(js));
    size_t ndim = json_array_size(js);
    if (ndim > WB_ST_MAX_DIMS)
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": shape has %zu dimensions, more than the %d allowed",
                           name, ndim, WB_ST_MAX_DIMS);
    uint64_t shape[WB_ST_MAX_DIMS];
    for (size_t i = 0; i < ndim; i++) {
        char dim[32];
        snprintf(dim, sizeof dim, "shape[%zu]", i);
        int rc = get_uint(file, name, dim, "dimensions", json_array_get(js, i), &shape[i], err);
        if (rc != WB_OK)
            return rc;
    }

    json_t *jo = json_object_get(entry, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2) {
        if (json_is_array(jo))
            return wb__st_fail(err, WB_EFORMAT, file,
                               "tensor " NAMEF
                               ": data_offsets has %zu entries, expected [begin, end]",
                               name, json_array_size(jo));
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": data_offsets is %s, expected [begin, end]", name,
                           wb__st_json_kind(jo));
    }
    uint64_t off[2];
    for (size_t i = 0; i < 2; i++) {
        int rc = get_uint(file, name, i ? "data_offsets end" : "data_offsets begin", "offsets",
                          json_array_get(jo, i), &off[i], err);
        if (rc != WB_OK)
            return rc;
    }
    if (off[0] > off[1])
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": data_offsets begin %" PRIu64
                           " is greater than end %" PRIu64,
                           name, off[0], off[1]);

    /* The byte size, with every step checked: a crafted shape must not wrap around
     * to a small size that happens to match the offsets. */
    char sbuf[256];
    uint64_t count = 1;
    for (size_t i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(count, shape[i], &count))
            return wb__st_fail(err, WB_EFORMAT, file,
                               "tensor " NAMEF ": the element count of shape %s overflows 64 bits",
                               name, format_shape(sbuf, sizeof sbuf, shape, (uint32_t)ndim));
    uint64_t bits;
    if (__builtin_mul_overflow(count, (uint64_t)wb__dtype_bits((wb_dtype)dt), &bits))
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": the size of %" PRIu64
                           " elements of %s overflows 64 bits",
                           name, count, wb__dtype_name((wb_dtype)dt));
    if (bits % 8 != 0)
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": %" PRIu64
                           " elements of %s (%u bits each) do not fill a "
                           "whole number of bytes",
                           name, count, wb__dtype_name((wb_dtype)dt), wb__dtype_bits((wb_dtype)dt));
    uint64_t nbytes = bits / 8;
    if (off[1] - off[0] != nbytes)
        return wb__st_fail(err, WB_EFORMAT, file,
                           "tensor " NAMEF ": data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                           " bytes, but dtype %s with shape %s needs %" PRIu64
                           " bytes (size mismatch)",
                           name, off[0], off[1], off[1] - off[0], wb__dtype_name((wb_dtype)dt),
                           format_shape(sbuf, sizeof sbuf, shape, (uint32_t)ndim), nbytes);

    out->name = wb__strdup(name);
    out->shape = ndim ? wb__malloc(ndim * sizeof *out->shape) : NULL;
    if (!out->name || (ndim && !out->shape)) {
        free(out->name);
        free(out->shape);
        out->name = NULL;
        out->shape = NULL;
        return wb__st_fail(err, WB_ENOMEM, file, "out of memory reading tensor " NAMEF, name);
    }
    if (ndim)
        memcpy(out->shape, shape, ndim * sizeof *shape);
    out->dtype = (wb_dtype)dt;
    out->ndim = (uint32_t)ndim;
    out->begin = off[0];
    out->end = off[1];
    return 0;
}

static int validate_metadata(const char *file, json_t *meta, pending_meta **out, size_t *n_out,
                             wb_err *err)
{
    if (!json_is_object(meta))
        return wb__st_fail(err, WB_EFORMAT, file,
                           "__metadata__ is %s, expected an object of strings",
                           wb__st_json_kind(meta));
    size_t n = json_object_size(meta);
    pending_meta *m = wb__calloc(n ? n : 1, sizeof *m);
    if (!m)
        return wb__st_fail(err, WB_ENOMEM, file, "out of memory reading __metadata__");
    size_t i = 0;
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value)
    {
        if (!json_is_string(value)) {
            wb__st_pending_free(NULL, 0, m, i);
            return wb__st_fail(err, WB_EFORMAT, file,
                               "__metadata__ value of key " NAMEF " is %s; metadata values must be "
                               "strings",
                               key, wb__st_json_kind(value));
        }
        m[i].key = wb__strdup(key);
        m[i].value = wb__strdup(json_string_value(value));
        i++;
        if (!m[i - 1].key || !m[i - 1].value) {
            wb__st_pending_free(NULL, 0, m, i);
            return wb__st_fail(err, WB_ENOMEM, file, "out of memory reading __metadata__");
        }
    }
    *out = m;
    *n_out = i;
    return 0;
}

static int cmp_pending_span(const void *a, const void *b)
{
    const pending *x = *(const pending *const *)a, *y = *(const pending *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_pending_offset(const void *a, const void *b)
{
    const pending *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_pending_name(const void *a, const void *b)
{
    const pending *x = *(const pending *const *)a, *y = *(const pending *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_tensor(const void *a, const void *b)
{
    const wb_st_tensor *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_meta(const void *a, const void *b)
{
    return strcmp(((const wb_st_meta *)a)->key, ((const wb_st_meta *)b)->key);
}

/* Checks that the tensors tile the data section: sorted by offsets, the first
 * begins at 0, each begins where the previous ends, the last ends at its end. */
static int check_coverage(const char *file, pending *p, size_t n, uint64_t data_size, wb_err *err)
{
    if (n == 0) {
        if (data_size != 0)
            return wb__st_fail(
                err, WB_EFORMAT, file,
                "%" PRIu64 " trailing bytes after the header, which lists no tensors", data_size);
        return 0;
    }
    pending **order = wb__malloc(n * sizeof *order);
    if (!order)
        return wb__st_fail(err, WB_ENOMEM, file, "out of memory checking data offsets");
    for (size_t i = 0; i < n; i++)
        order[i] = &p[i];
    qsort(order, n, sizeof *order, cmp_pending_span);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (order[i]->end > data_size)
            rc = wb__st_fail(err, WB_EFORMAT, file,
                             "tensor " NAMEF
                             " ends past the end of the file: data_offsets end %" PRIu64
                             " but the data section has %" PRIu64 " bytes",
                             order[i]->name, order[i]->end, data_size);
    uint64_t expect = 0;
    const pending *prev = NULL;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const pending *t = order[i];
        if (t->begin > expect) {
            if (prev)
                rc = wb__st_fail(
                    err, WB_EFORMAT, file,
                    "hole of %" PRIu64 " bytes in the data section between tensor " NAMEF
                    " (ends at %" PRIu64 ") and tensor " NAMEF " (begins at %" PRIu64 ")",
                    t->begin - expect, prev->name, expect, t->name, t->begin);
            else
                rc = wb__st_fail(err, WB_EFORMAT, file,
                                 "hole of %" PRIu64
                                 " bytes at the start of the data section, before "
                                 "tensor " NAMEF " (begins at %" PRIu64 ")",
                                 t->begin, t->name, t->begin);
        } else if (t->begin < expect) {
            rc = wb__st_fail(err, WB_EFORMAT, file,
                             "tensor " NAMEF " (data_offsets [%" PRIu64 ", %" PRIu64
                             "]) overlaps tensor " NAMEF " (data_offsets [%" PRIu64 ", %" PRIu64
                             "])",
                             t->name, t->begin, t->end, prev->name, prev->begin, prev->end);
        }
        expect = t->end;
        prev = t;
    }
    if (rc == 0 && expect < data_size)
        rc = wb__st_fail(err, WB_EFORMAT, file,
                         "%" PRIu64 " trailing bytes after the last tensor (" NAMEF
                         " ends at %" PRIu64 "; the data section has %" PRIu64 " bytes)",
                         data_size - expect, prev->name, expect, data_size);
    free(order);
    return rc;
}

/* Rejects a name that the table already holds (sharded checkpoints put each
 * tensor in exactly one shard). Both lists are walked in name order. */
static int check_new_names(const wb_st_table *table, const char *file, pending *p, size_t n,
                           wb_err *err)
{
    if (table->n_tensors == 0 || n == 0)
        return 0;
    size_t *old = table->by_name;
    size_t *tmp = NULL;
    if (!old) {
        tmp = wb__malloc(table->n_tensors * sizeof *tmp);
        if (!tmp)
            return wb__st_fail(err, WB_ENOMEM, file, "out of memory checking tensor names");
        wb__names_sort(tmp, table->tensors, table->n_tensors, sizeof *table->tensors,
                       offsetof(wb_st_tensor, name));
        old = tmp;
    }
    pending **mine = wb__malloc(n * sizeof *mine);
    if (!mine) {
        free(tmp);
        return wb__st_fail(err, WB_ENOMEM, file, "out of memory checking tensor names");
    }
    for (size_t i = 0; i < n; i++)
        mine[i] = &p[i];
    qsort(mine, n, sizeof *mine, cmp_pending_name);
    int rc = 0;
    size_t i = 0, j = 0;
    while (i < table->n_tensors && j < n) {
        const wb_st_tensor *t = &table->tensors[old[i]];
        int c = strcmp(t->name, mine[j]->name);
        if (c == 0) {
            const char *other = t->file < table->n_files && table->files[t->file]
                                    ? table->files[t->file]
                                    : "another file";
            rc = wb__st_fail(err, WB_EFORMAT, file,
                             "tensor " NAMEF " is also in " FILEF
                             "; a tensor may appear in only one "
                             "file",
                             t->name, other);
            break;
        }
        if (c < 0)
            i++;
        else
            j++;
    }
    free(mine);
    free(tmp);
    return rc;
}

static int meta_has(const wb_st_table *table, const char *key)
{
    size_t lo = 0, hi = table->n_meta;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(table->meta[mid].key, key);
        if (c == 0)
            return 1;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* Adds a validated file to the table. Every allocation happens before the
 * first change that a caller could see, so a failure leaves the table as it
 * was (arrays may have grown, but their counts have not). */
static int commit(wb_st_table *table, uint32_t file_index, const char *file, uint64_t file_size,
                  uint64_t data_start, pending *p, size_t n, pending_meta *m, size_t nm,
                  wb_err *err)
{
    uint64_t added = 0;
    for (size_t i = 0; i < n; i++)
        added += p[i].end - p[i].begin; /* bounded by the file size: no overflow */
    uint64_t total;
    if (__builtin_add_overflow(table->total_bytes, added, &total))
        return wb__st_fail(err, WB_EFORMAT, file, "the checkpoint's total size overflows 64 bits");

    size_t old_n = table->n_tensors, new_n = old_n + n;
    if (n) {
        wb_st_tensor *t = wb__realloc(table->tensors, new_n * sizeof *t);
        if (!t)
            return wb__st_fail(err, WB_ENOMEM, file, "out of memory adding %zu tensors", n);
        table->tensors = t;
    }
    size_t *by_name = NULL;
    if (new_n) {
        by_name = wb__malloc(new_n * sizeof *by_name);
        if (!by_name)
            return wb__st_fail(err, WB_ENOMEM, file, "out of memory indexing tensors");
    }
    size_t n_new_meta = 0;
    for (size_t i = 0; i < nm; i++)
        if (!meta_has(table, m[i].key))
            n_new_meta++;
    if (n_new_meta) {
        wb_st_meta *mm = wb__realloc(table->meta, (table->n_meta + n_new_meta) * sizeof *mm);
        if (!mm) {
            free(by_name);
            return wb__st_fail(err, WB_ENOMEM, file, "out of memory adding metadata");
        }
        table->meta = mm;
    }
    char *name_copy = NULL;
    if (file_index == table->n_files) {
        uint32_t nf = table->n_files + 1;
        char **files = wb__realloc(table->files, nf * sizeof *files);
        if (files)
            table->files = files;
        uint64_t *sizes = files ? wb__realloc(table->file_sizes, nf * sizeof *sizes) : NULL;
        if (sizes)
            table->file_sizes = sizes;
        uint64_t *starts = sizes ? wb__realloc(table->data_starts, nf * sizeof *starts) : NULL;
        if (starts)
            table->data_starts = starts;
        name_copy = starts ? wb__strdup(file) : NULL;
        if (!name_copy) {
            free(by_name);
            return wb__st_fail(err, WB_ENOMEM, file, "out of memory adding the file");
        }
    }

    /* From here on nothing can fail. */
    if (name_copy) {
        table->files[table->n_files] = name_copy;
        table->n_files++;
    } else if (!table->files[file_index]) {
        /* A slot that a caller reserved without a name gets this one; a failed
         * strdup only leaves the slot unnamed. */
        table->files[file_index] = wb__strdup(file);
    }
    table->file_sizes[file_index] = file_size;
    table->data_starts[file_index] = data_start;

    for (size_t i = 0; i < nm; i++) {
        if (meta_has(table, m[i].key))
            continue;
        table->meta[table->n_meta].key = m[i].key;
        table->meta[table->n_meta].value = m[i].value;
        m[i].key = m[i].value = NULL;
        table->n_meta++;
        /* Keep the order for meta_has: a file has few keys, so sorting each time is fine. */
        qsort(table->meta, table->n_meta, sizeof *table->meta, cmp_meta);
    }

    bool in_order = old_n == 0 || table->tensors[old_n - 1].file < file_index;
    qsort(p, n, sizeof *p, cmp_pending_offset);
    for (size_t i = 0; i < n; i++) {
        wb_st_tensor *t = &table->tensors[old_n + i];
        t->name = p[i].name;
        t->dtype = p[i].dtype;
        t->ndim = p[i].ndim;
        t->shape = p[i].shape;
        t->file = file_index;
        t->offset = data_start + p[i].begin;
        t->nbytes = p[i].end - p[i].begin;
        p[i].name = NULL;
        p[i].shape = NULL;
    }
    table->n_tensors = new_n;
    table->total_bytes = total;

    if (n && !in_order)
        qsort(table->tensors, new_n, sizeof *table->tensors, cmp_tensor);
    if (in_order && table->by_name && old_n) {
        /* Merge the old name order with the new tensors' name order. The new
         * ones are sorted at the front of the output and the merge runs from the
         * back, so it never overwrites one of them before reading it. */
        size_t *fresh = by_name;
        wb__names_sort(fresh, table->tensors + old_n, n, sizeof *table->tensors,
                       offsetof(wb_st_tensor, name));
        for (size_t i = 0; i < n; i++)
            fresh[i] += old_n;
        size_t i = old_n, j = n, k = new_n;
        while (j > 0) {
            if (i > 0 && strcmp(table->tensors[table->by_name[i - 1]].name,
                                table->tensors[fresh[j - 1]].name) > 0)
                by_name[--k] = table->by_name[--i];
            else
                by_name[--k] = fresh[--j];
        }
        while (i > 0)
            by_name[--k] = table->by_name[--i];
    } else if (new_n) {
        wb__names_sort(by_name, table->tensors, new_n, sizeof *table->tensors,
                       offsetof(wb_st_tensor, name));
    }
    free(table->by_name);
    table->by_name = by_name;
    return 0;
}

/* Parses the JSON header hdr[0..n) into its entries: *po, *np, *mo, *nm,
 * which the caller frees, on error too. */
static int parse_entries(const char *file, const uint8_t *hdr, size_t n, pending **po, size_t *np,
                         pending_meta **mo, size_t *nm, wb_err *err)
{
    json_error_t je;
    unsigned long failures = wb__alloc_jansson_failures();
    json_t *root = json_loadb((const char *)hdr, (size_t)n,
                              JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
    if (wb__st_json_nomem(&root, &je, failures))
        return wb__st_fail(err, WB_ENOMEM, file, "out of memory parsing the JSON header");
    if (!root) {
        const char *hint = "";
        switch (json_error_code(&je)) {
        case json_error_duplicate_key:
            hint = "; each tensor name and key may appear only once";
            break;
        case json_error_null_character:
        case json_error_null_byte_in_key:
            hint = "; NUL characters are not allowed in names or values";
            break;
        case json_error_invalid_utf8:
            hint = "; the header must be valid UTF-8";
            break;
        case json_error_numeric_overflow:
            hint = "; integers must fit in 63 bits";
            break;
        default:
            break;
        }
        return wb__st_fail(err, WB_EFORMAT, file,
                           "malformed JSON header: %s (line %d, column %d, byte %d)%s", je.text,
                           je.line, je.column, je.position, hint);
    }
    int rc = 0;
    if (!json_is_object(root)) {
        rc = wb__st_fail(err, WB_EFORMAT, file, "header is %s, expected a JSON object",
                         wb__st_json_kind(root));
        goto out;
    }
    /* The official writer pads the header with spaces to an 8-byte boundary;
     * anything but whitespace after the object is an error. */
    for (size_t i = je.position > 0 ? (size_t)je.position : 0; i < n; i++) {
        uint8_t c = hdr[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            rc = wb__st_fail(
                err, WB_EFORMAT, file,
                "unexpected byte 0x%02x at header byte %zu, after the JSON object; only "
                "whitespace padding may follow it",
                c, i);
            goto out;
        }
    }

    size_t nkeys = json_object_size(root);
    pending *p = *po = wb__calloc(nkeys ? nkeys : 1, sizeof *p);
    if (!p) {
        rc = wb__st_fail(err, WB_ENOMEM, file, "out of memory reading %zu header entries", nkeys);
        goto out;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "__metadata__") == 0) {
            rc = validate_metadata(file, value, mo, nm, err);
        } else if (key[0] == '\0') {
            rc = wb__st_fail(err, WB_EFORMAT, file, "a tensor has an empty name");
        } else {
            rc = validate_tensor(file, key, value, &p[*np], err);
            if (rc == 0)
                (*np)++;
        }
        if (rc)
            goto out;
    }
out:
    json_decref(root);
    return rc;
}

int wb__st_parse_header(wb_st_table *table, uint32_t file_index, const char *display_name,
                        const uint8_t *buf, size_t len, uint64_t file_size, wb_err *err)
{
    const char *file = display_name ? display_name : "(safetensors)";
    if (!table || (!buf && len))
        return wb__err_set(err, WB_EINVAL, "wb__st_parse_header: no table or no buffer");
    if (file_index > table->n_files)
        return wb__err_set(err, WB_EINVAL,
                           "wb__st_parse_header: file index %u skips files (the table has %u)",
                           file_index, table->n_files);
    if (file_size < 8)
        return wb__st_fail(err, WB_EFORMAT, file,
                           "file is %" PRIu64 " bytes, shorter than the 8-byte header length",
                           file_size);
    if (len < 8)
        return wb__st_fail(
            err, WB_EFORMAT, file,
            "header truncated: only %zu bytes given, fewer than the 8-byte header length", len);
    uint64_t n = wb__st_load_le64(buf);
    if (n > WB_ST_MAX_HEADER)
        return wb__st_fail(err, WB_EFORMAT, file,
                           "header length %" PRIu64 " exceeds the %llu-byte limit", n,
                           WB_ST_MAX_HEADER);
    if (n > file_size - 8)
        return wb__st_fail(err, WB_EFORMAT, file,
                           "header truncated: header length %" PRIu64 " but only %" PRIu64
                           " bytes follow the length field",
                           n, file_size - 8);
    if (n > len - 8)
        return wb__st_fail(
            err, WB_EFORMAT, file,
            "header truncated: header length %" PRIu64 " but only %zu bytes were read", n, len - 8);
    if (n == 0)
        return wb__st_fail(err, WB_EFORMAT, file, "header is empty; it must be a JSON object");
    const uint8_t *hdr = buf + 8;
    if (hdr[0] != '{')
        return wb__st_fail(err, WB_EFORMAT, file,
                           "header does not start with '{' (first byte 0x%02x); it must be a JSON "
                           "object with no leading whitespace",
                           hdr[0]);

    /* A header parsed before is not parsed again (safetensors_memo.h). */
    pending *p = NULL;
    pending_meta *m = NULL;
    size_t np = 0, nm = 0;
    int rc = wb__st_memo_get(hdr, (size_t)n, &p, &np, &m, &nm);
    if (rc < 0)
        return wb__st_fail(err, WB_ENOMEM, file, "out of memory copying a remembered header");
    if (rc == 0) {
        if ((rc = parse_entries(file, hdr, (size_t)n, &p, &np, &m, &nm, err)) != 0)
            goto out;
        wb__st_memo_put(hdr, (size_t)n, p, np, m, nm);
    }
    int remembered = rc == 1;
    uint64_t data_start = 8 + n;
    rc = check_coverage(file, p, np, file_size - data_start, err);
    if (rc == 0)
        rc = check_new_names(table, file, p, np, err);
    if (rc == 0)
        rc = commit(table, file_index, file, file_size, data_start, p, np, m, nm, err);
    if (rc == 0 && remembered)
        table->remembered++;
out:
    wb__st_pending_free(p, np, m, nm);
    return rc;
}
