/* The safetensors reader. The format: an 8-byte little-endian header length N,
 * N bytes of UTF-8 JSON describing the tensors, then the data section that the
 * tensors must tile exactly. Only the header is ever read. */
#include "safetensors.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_NAME  "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

/* Names are quoted in messages with a length cap, so that a huge name cannot push
 * the rest of the message out of the fixed-size error buffer. */
#define NAMEF "'%.200s'"
#define FILEF "%.400s"

static const struct {
    const char *name;
    unsigned bits;
} dtypes[WB_DTYPE_COUNT] = {
    [WB_DTYPE_BOOL] = {"BOOL", 8},       [WB_DTYPE_F4] = {"F4", 4},
    [WB_DTYPE_F6_E2M3] = {"F6_E2M3", 6}, [WB_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
    [WB_DTYPE_U8] = {"U8", 8},           [WB_DTYPE_I8] = {"I8", 8},
    [WB_DTYPE_F8_E5M2] = {"F8_E5M2", 8}, [WB_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
    [WB_DTYPE_F8_E8M0] = {"F8_E8M0", 8}, [WB_DTYPE_I16] = {"I16", 16},
    [WB_DTYPE_U16] = {"U16", 16},        [WB_DTYPE_F16] = {"F16", 16},
    [WB_DTYPE_BF16] = {"BF16", 16},      [WB_DTYPE_I32] = {"I32", 32},
    [WB_DTYPE_U32] = {"U32", 32},        [WB_DTYPE_F32] = {"F32", 32},
    [WB_DTYPE_C64] = {"C64", 64},        [WB_DTYPE_F64] = {"F64", 64},
    [WB_DTYPE_I64] = {"I64", 64},        [WB_DTYPE_U64] = {"U64", 64},
};

const char *wb__dtype_name(wb_dtype dtype)
{
    if ((unsigned)dtype >= WB_DTYPE_COUNT)
        return NULL;
    return dtypes[dtype].name;
}

int wb__dtype_parse(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < WB_DTYPE_COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0)
            return i;
    return -1;
}

unsigned wb__dtype_bits(wb_dtype dtype)
{
    if ((unsigned)dtype >= WB_DTYPE_COUNT)
        return 0;
    return dtypes[dtype].bits;
}

/* Every message names the file first: "FILE: what is wrong". */
__attribute__((format(printf, 4, 5))) static int fail(wb_err *err, int code, const char *file,
                                                      const char *fmt, ...)
{
    char msg[WB_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return wb__err_set(err, code, FILEF ": %s", file, msg);
}

static const char *json_kind(const json_t *v)
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

static uint64_t load_le64(const uint8_t *p)
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

/* One tensor while its file is validated, before it joins the table. */
typedef struct pending {
    char *name;
    wb_dtype dtype;
    uint32_t ndim;
    uint64_t *shape;
    uint64_t begin, end;
} pending;

typedef struct pending_meta {
    char *key;
    char *value;
} pending_meta;

static void pending_free(pending *p, size_t n, pending_meta *m, size_t nm)
{
    for (size_t i = 0; i < n; i++) {
        free(p[i].name);
        free(p[i].shape);
    }
    free(p);
    for (size_t i = 0; i < nm; i++) {
        free(m[i].key);
        free(m[i].value);
    }
    free(m);
}

/* Reads a non-negative JSON integer, saying what is wrong otherwise. */
static int get_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int validate_tensor(const char *file, const char *name, json_t *entry, pending *out,
                           wb_err *err)
{
    if (!json_is_object(entry))
        return fail(err, WB_EFORMAT, file,
                    "tensor " NAMEF ": entry is %s, expected an object with dtype, shape "
                    "and data_offsets",
                    name, json_kind(entry));
    const char *field;
    json_t *value;
    json_object_foreach(entry, field, value)
    {
        if (strcmp(field, "dtype") && strcmp(field, "shape") && strcmp(field, "data_offsets"))
            return fail(err, WB_EFORMAT, file,
                        "tensor " NAMEF ": unexpected field '%.100s' (only dtype, shape and "
                        "data_offsets are allowed)",
                        name, field);
    }
    static const char *const required[] = {"dtype", "shape", "data_offsets"};
    for (size_t i = 0; i < 3; i++)
        if (!json_object_get(entry, required[i]))
            return fail(err, WB_EFORMAT, file, "tensor " NAMEF ": missing field '%s'", name,
                        required[i]);

    json_t *jd = json_object_get(entry, "dtype");
    if (!json_is_string(jd))
        return fail(err, WB_EFORMAT, file, "tensor " NAMEF ": dtype is %s, expected a string", name,
                    json_kind(jd));
    const char *dname = json_string_value(jd);
    int dt = wb__dtype_parse(dname);
    if (dt < 0) {
        for (int i = 0; i < WB_DTYPE_COUNT; i++)
            if (strcasecmp(dname, dtypes[i].name) == 0)
                return fail(err, WB_EFORMAT, file,
                            "tensor " NAMEF ": unknown dtype '%.40s' (dtype names are "
                            "case-sensitive; did you mean '%s'?)",
                            name, dname, dtypes[i].name);
        return fail(err, WB_EFORMAT, file, "tensor " NAMEF ": unknown dtype '%.40s'", name, dname);
    }

    json_t *js = json_object_get(entry, "shape");
    if (!json_is_array(js))
        return fail(err, WB_EFORMAT, file,
                    "tensor " NAMEF ": shape is %s, expected an array of non-negative integers",
                    name, json_kind(js));
    size_t ndim = json_array_size(js);
    if (ndim > WB_ST_MAX_DIMS)
        return fail(err, WB_EFORMAT, file,
                    "tensor " NAMEF ": shape has %zu dimensions, more than the %d allowed", name,
                    ndim, WB_ST_MAX_DIMS);
    uint64_t shape[WB_ST_MAX_DIMS];
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(js, i);
        if (get_uint(d, &shape[i]) != 0) {
            if (json_is_integer(d))
                return fail(err, WB_EFORMAT, file,
                            "tensor " NAMEF ": shape[%zu] is %" JSON_INTEGER_FORMAT
                            "; dimensions must be non-negative integers",
                            name, i, json_integer_value(d));
            return fail(err, WB_EFORMAT, file,
                        "tensor " NAMEF ": shape[%zu] is %s; dimensions must be non-negative "
                        "integers",
                        name, i, json_kind(d));
        }
    }

    json_t *jo = json_object_get(entry, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2) {
        if (json_is_array(jo))
            return fail(err, WB_EFORMAT, file,
                        "tensor " NAMEF ": data_offsets has %zu entries, expected [begin, end]",
                        name, json_array_size(jo));
        return fail(err, WB_EFORMAT, file,
                    "tensor " NAMEF ": data_offsets is %s, expected [begin, end]", name,
                    json_kind(jo));
    }
    uint64_t off[2];
    for (size_t i = 0; i < 2; i++) {
        json_t *o = json_array_get(jo, i);
        if (get_uint(o, &off[i]) != 0) {
            const char *which = i ? "end" : "begin";
            if (json_is_integer(o))
                return fail(err, WB_EFORMAT, file,
                            "tensor " NAMEF ": data_offsets %s is %" JSON_INTEGER_FORMAT
                            "; offsets must be non-negative integers",
                            name, which, json_integer_value(o));
            return fail(err, WB_EFORMAT, file,
                        "tensor " NAMEF ": data_offsets %s is %s; offsets must be "
                        "non-negative integers",
                        name, which, json_kind(o));
        }
    }
    if (off[0] > off[1])
        return fail(err, WB_EFORMAT, file,
                    "tensor " NAMEF ": data_offsets begin %" PRIu64 " is greater than end %" PRIu64,
                    name, off[0], off[1]);

    /* The byte size, with every step checked: a crafted shape must not wrap around
     * to a small size that happens to match the offsets. */
    char sbuf[256];
    uint64_t count = 1;
    for (size_t i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(count, shape[i], &count))
            return fail(err, WB_EFORMAT, file,
                        "tensor " NAMEF ": the element count of shape %s overflows 64 bits", name,
                        format_shape(sbuf, sizeof sbuf, shape, (uint32_t)ndim));
    uint64_t bits;
    if (__builtin_mul_overflow(count, (uint64_t)dtypes[dt].bits, &bits))
        return fail(err, WB_EFORMAT, file,
                    "tensor " NAMEF ": the size of %" PRIu64 " elements of %s overflows 64 bits",
                    name, count, dtypes[dt].name);
    if (bits % 8 != 0)
        return fail(err, WB_EFORMAT, file,
                    "tensor " NAMEF ": %" PRIu64 " elements of %s (%u bits each) do not fill a "
                    "whole number of bytes",
                    name, count, dtypes[dt].name, dtypes[dt].bits);
    uint64_t nbytes = bits / 8;
    if (off[1] - off[0] != nbytes)
        return fail(err, WB_EFORMAT, file,
                    "tensor " NAMEF ": data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                    " bytes, but dtype %s with shape %s needs %" PRIu64 " bytes (size mismatch)",
                    name, off[0], off[1], off[1] - off[0], dtypes[dt].name,
                    format_shape(sbuf, sizeof sbuf, shape, (uint32_t)ndim), nbytes);

    out->name = strdup(name);
    out->shape = ndim ? malloc(ndim * sizeof *out->shape) : NULL;
    if (!out->name || (ndim && !out->shape)) {
        free(out->name);
        free(out->shape);
        out->name = NULL;
        out->shape = NULL;
        return fail(err, WB_ENOMEM, file, "out of memory reading tensor " NAMEF, name);
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
        return fail(err, WB_EFORMAT, file, "__metadata__ is %s, expected an object of strings",
                    json_kind(meta));
    size_t n = json_object_size(meta);
    pending_meta *m = calloc(n ? n : 1, sizeof *m);
    if (!m)
        return fail(err, WB_ENOMEM, file, "out of memory reading __metadata__");
    size_t i = 0;
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value)
    {
        if (!json_is_string(value)) {
            pending_free(NULL, 0, m, i);
            return fail(err, WB_EFORMAT, file,
                        "__metadata__ value of key " NAMEF " is %s; metadata values must be "
                        "strings",
                        key, json_kind(value));
        }
        m[i].key = strdup(key);
        m[i].value = strdup(json_string_value(value));
        i++;
        if (!m[i - 1].key || !m[i - 1].value) {
            pending_free(NULL, 0, m, i);
            return fail(err, WB_ENOMEM, file, "out of memory reading __metadata__");
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

static int cmp_index_by_name(const void *a, const void *b, void *arg)
{
    const wb_st_tensor *t = arg;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
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
            return fail(err, WB_EFORMAT, file,
                        "%" PRIu64 " trailing bytes after the header, which lists no tensors",
                        data_size);
        return 0;
    }
    pending **order = malloc(n * sizeof *order);
    if (!order)
        return fail(err, WB_ENOMEM, file, "out of memory checking data offsets");
    for (size_t i = 0; i < n; i++)
        order[i] = &p[i];
    qsort(order, n, sizeof *order, cmp_pending_span);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (order[i]->end > data_size)
            rc = fail(err, WB_EFORMAT, file,
                      "tensor " NAMEF " ends past the end of the file: data_offsets end %" PRIu64
                      " but the data section has %" PRIu64 " bytes",
                      order[i]->name, order[i]->end, data_size);
    uint64_t expect = 0;
    const pending *prev = NULL;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const pending *t = order[i];
        if (t->begin > expect) {
            if (prev)
                rc = fail(err, WB_EFORMAT, file,
                          "hole of %" PRIu64 " bytes in the data section between tensor " NAMEF
                          " (ends at %" PRIu64 ") and tensor " NAMEF " (begins at %" PRIu64 ")",
                          t->begin - expect, prev->name, expect, t->name, t->begin);
            else
                rc = fail(err, WB_EFORMAT, file,
                          "hole of %" PRIu64 " bytes at the start of the data section, before "
                          "tensor " NAMEF " (begins at %" PRIu64 ")",
                          t->begin, t->name, t->begin);
        } else if (t->begin < expect) {
            rc = fail(err, WB_EFORMAT, file,
                      "tensor " NAMEF " (data_offsets [%" PRIu64 ", %" PRIu64
                      "]) overlaps tensor " NAMEF " (data_offsets [%" PRIu64 ", %" PRIu64 "])",
                      t->name, t->begin, t->end, prev->name, prev->begin, prev->end);
        }
        expect = t->end;
        prev = t;
    }
    if (rc == 0 && expect < data_size)
        rc = fail(err, WB_EFORMAT, file,
                  "%" PRIu64 " trailing bytes after the last tensor (" NAMEF " ends at %" PRIu64
                  "; the data section has %" PRIu64 " bytes)",
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
        tmp = malloc(table->n_tensors * sizeof *tmp);
        if (!tmp)
            return fail(err, WB_ENOMEM, file, "out of memory checking tensor names");
        for (size_t i = 0; i < table->n_tensors; i++)
            tmp[i] = i;
        qsort_r(tmp, table->n_tensors, sizeof *tmp, cmp_index_by_name, table->tensors);
        old = tmp;
    }
    pending **mine = malloc(n * sizeof *mine);
    if (!mine) {
        free(tmp);
        return fail(err, WB_ENOMEM, file, "out of memory checking tensor names");
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
            rc = fail(err, WB_EFORMAT, file,
                      "tensor " NAMEF " is also in " FILEF "; a tensor may appear in only one "
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
        return fail(err, WB_EFORMAT, file, "the checkpoint's total size overflows 64 bits");

    size_t old_n = table->n_tensors, new_n = old_n + n;
    if (n) {
        wb_st_tensor *t = realloc(table->tensors, new_n * sizeof *t);
        if (!t)
            return fail(err, WB_ENOMEM, file, "out of memory adding %zu tensors", n);
        table->tensors = t;
    }
    size_t *by_name = NULL;
    if (new_n) {
        by_name = malloc(new_n * sizeof *by_name);
        if (!by_name)
            return fail(err, WB_ENOMEM, file, "out of memory indexing tensors");
    }
    size_t n_new_meta = 0;
    for (size_t i = 0; i < nm; i++)
        if (!meta_has(table, m[i].key))
            n_new_meta++;
    if (n_new_meta) {
        wb_st_meta *mm = realloc(table->meta, (table->n_meta + n_new_meta) * sizeof *mm);
        if (!mm) {
            free(by_name);
            return fail(err, WB_ENOMEM, file, "out of memory adding metadata");
        }
        table->meta = mm;
    }
    char *name_copy = NULL;
    if (file_index == table->n_files) {
        uint32_t nf = table->n_files + 1;
        char **files = realloc(table->files, nf * sizeof *files);
        if (files)
            table->files = files;
        uint64_t *sizes = files ? realloc(table->file_sizes, nf * sizeof *sizes) : NULL;
        if (sizes)
            table->file_sizes = sizes;
        uint64_t *starts = sizes ? realloc(table->data_starts, nf * sizeof *starts) : NULL;
        if (starts)
            table->data_starts = starts;
        name_copy = starts ? strdup(file) : NULL;
        if (!name_copy) {
            free(by_name);
            return fail(err, WB_ENOMEM, file, "out of memory adding the file");
        }
    }

    /* From here on nothing can fail. */
    if (name_copy) {
        table->files[table->n_files] = name_copy;
        table->n_files++;
    } else if (!table->files[file_index]) {
        /* A slot that a caller reserved without a name gets this one; a failed
         * strdup only leaves the slot unnamed. */
        table->files[file_index] = strdup(file);
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
        for (size_t i = 0; i < n; i++)
            fresh[i] = old_n + i;
        qsort_r(fresh, n, sizeof *fresh, cmp_index_by_name, table->tensors);
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
        for (size_t i = 0; i < new_n; i++)
            by_name[i] = i;
        qsort_r(by_name, new_n, sizeof *by_name, cmp_index_by_name, table->tensors);
    }
    free(table->by_name);
    table->by_name = by_name;
    return 0;
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
        return fail(err, WB_EFORMAT, file,
                    "file is %" PRIu64 " bytes, shorter than the 8-byte header length", file_size);
    if (len < 8)
        return fail(err, WB_EFORMAT, file,
                    "header truncated: only %zu bytes given, fewer than the 8-byte header length",
                    len);
    uint64_t n = load_le64(buf);
    if (n > WB_ST_MAX_HEADER)
        return fail(err, WB_EFORMAT, file, "header length %" PRIu64 " exceeds the %llu-byte limit",
                    n, WB_ST_MAX_HEADER);
    if (n > file_size - 8)
        return fail(err, WB_EFORMAT, file,
                    "header truncated: header length %" PRIu64 " but only %" PRIu64
                    " bytes follow the length field",
                    n, file_size - 8);
    if (n > len - 8)
        return fail(err, WB_EFORMAT, file,
                    "header truncated: header length %" PRIu64 " but only %zu bytes were read", n,
                    len - 8);
    if (n == 0)
        return fail(err, WB_EFORMAT, file, "header is empty; it must be a JSON object");
    const uint8_t *hdr = buf + 8;
    if (hdr[0] != '{')
        return fail(err, WB_EFORMAT, file,
                    "header does not start with '{' (first byte 0x%02x); it must be a JSON "
                    "object with no leading whitespace",
                    hdr[0]);

    json_error_t je;
    json_t *root = json_loadb((const char *)hdr, (size_t)n,
                              JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
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
        return fail(err, WB_EFORMAT, file,
                    "malformed JSON header: %s (line %d, column %d, byte %d)%s", je.text, je.line,
                    je.column, je.position, hint);
    }
    int rc = 0;
    pending *p = NULL;
    pending_meta *m = NULL;
    size_t np = 0, nm = 0;
    if (!json_is_object(root)) {
        rc = fail(err, WB_EFORMAT, file, "header is %s, expected a JSON object", json_kind(root));
        goto out;
    }
    /* The official writer pads the header with spaces to an 8-byte boundary;
     * anything but whitespace after the object is an error. */
    for (size_t i = je.position > 0 ? (size_t)je.position : 0; i < n; i++) {
        uint8_t c = hdr[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            rc = fail(err, WB_EFORMAT, file,
                      "unexpected byte 0x%02x at header byte %zu, after the JSON object; only "
                      "whitespace padding may follow it",
                      c, i);
            goto out;
        }
    }

    size_t nkeys = json_object_size(root);
    p = calloc(nkeys ? nkeys : 1, sizeof *p);
    if (!p) {
        rc = fail(err, WB_ENOMEM, file, "out of memory reading %zu header entries", nkeys);
        goto out;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "__metadata__") == 0) {
            rc = validate_metadata(file, value, &m, &nm, err);
        } else if (key[0] == '\0') {
            rc = fail(err, WB_EFORMAT, file, "a tensor has an empty name");
        } else {
            rc = validate_tensor(file, key, value, &p[np], err);
            if (rc == 0)
                np++;
        }
        if (rc)
            goto out;
    }
    uint64_t data_start = 8 + n;
    rc = check_coverage(file, p, np, file_size - data_start, err);
    if (rc == 0)
        rc = check_new_names(table, file, p, np, err);
    if (rc == 0)
        rc = commit(table, file_index, file, file_size, data_start, p, np, m, nm, err);
out:
    pending_free(p, np, m, nm);
    json_decref(root);
    return rc;
}

void wb__st_table_free(wb_st_table **table)
{
    if (!table || !*table)
        return;
    wb_st_table *t = *table;
    for (size_t i = 0; i < t->n_tensors; i++) {
        free(t->tensors[i].name);
        free(t->tensors[i].shape);
    }
    free(t->tensors);
    for (uint32_t i = 0; i < t->n_files; i++)
        free(t->files[i]);
    free(t->files);
    free(t->file_sizes);
    free(t->data_starts);
    for (size_t i = 0; i < t->n_meta; i++) {
        free(t->meta[i].key);
        free(t->meta[i].value);
    }
    free(t->meta);
    free(t->by_name);
    free(t);
    *table = NULL;
}

const wb_st_tensor *wb__st_find(const wb_st_table *table, const char *name)
{
    if (!table || !name)
        return NULL;
    if (!table->by_name) {
        for (size_t i = 0; i < table->n_tensors; i++)
            if (strcmp(table->tensors[i].name, name) == 0)
                return &table->tensors[i];
        return NULL;
    }
    size_t lo = 0, hi = table->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const wb_st_tensor *t = &table->tensors[table->by_name[mid]];
        int c = strcmp(t->name, name);
        if (c == 0)
            return t;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int open_error(wb_err *err, int errnum, const char *what, const char *path)
{
    if (errnum == ENOENT || errnum == ENOTDIR)
        return wb__err_set(err, WB_ENOTFOUND, "no such file: " FILEF, path);
    return wb__err_errno(err, WB_EIO, errnum, "cannot %s " FILEF, what, path);
}

/* Reads exactly len bytes at off; a short file is an I/O error (it changed
 * size under us). */
static int pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path, wb_err *err)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return wb__err_errno(err, WB_EIO, errno, "cannot read " FILEF, path);
        }
        if (r == 0)
            return wb__err_set(err, WB_EIO,
                               FILEF ": unexpected end of file at byte %" PRIu64
                                     " (did it change while being read?)",
                               path, off);
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Opens a file for reading and refuses anything but a regular file.
 * O_NONBLOCK: a FIFO in place of a shard or index must not hang the reader.
 * On success *fd_out is the open descriptor and *st describes it. */
static int open_regular(const char *path, int *fd_out, struct stat *st, wb_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return open_error(err, errno, "open", path);
    int rc = 0;
    if (fstat(fd, st) != 0)
        rc = wb__err_errno(err, WB_EIO, errno, "cannot stat " FILEF, path);
    else if (!S_ISREG(st->st_mode))
        rc = fail(err, WB_EFORMAT, path, "not a regular file");
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* Reads one safetensors file's header into the table as file `index`. */
static int read_file(wb_st_table *table, uint32_t file_index, const char *path, wb_err *err)
{
    int fd = -1;
    struct stat st;
    int rc = open_regular(path, &fd, &st, err);
    if (rc)
        return rc;
    uint8_t *buf = NULL;
    uint64_t size = (uint64_t)st.st_size;
    uint8_t head[8];
    size_t got = size < 8 ? (size_t)size : 8;
    rc = pread_full(fd, head, got, 0, path, err);
    if (rc)
        goto out;
    uint64_t n = got == 8 ? load_le64(head) : 0;
    if (got < 8 || n > WB_ST_MAX_HEADER || n > size - 8) {
        /* The parser reports these from the first 8 bytes alone. */
        rc = wb__st_parse_header(table, file_index, path, head, got, size, err);
        goto out;
    }
    buf = malloc((size_t)(8 + n));
    if (!buf) {
        rc = fail(err, WB_ENOMEM, path, "out of memory for a %" PRIu64 "-byte header", n);
        goto out;
    }
    memcpy(buf, head, 8);
    rc = pread_full(fd, buf + 8, (size_t)n, 8, path, err);
    if (rc == 0)
        rc = wb__st_parse_header(table, file_index, path, buf, (size_t)(8 + n), size, err);
out:
    free(buf);
    close(fd);
    return rc;
}

static char *path_join(const char *prefix, size_t prefix_len, const char *name)
{
    size_t nl = strlen(name);
    char *s = malloc(prefix_len + nl + 1);
    if (!s)
        return NULL;
    memcpy(s, prefix, prefix_len);
    memcpy(s + prefix_len, name, nl + 1);
    return s;
}

/* A shard name must stay inside the index's directory. */
static const char *bad_shard_name(const char *name)
{
    if (name[0] == '\0')
        return "is empty";
    if (name[0] == '/')
        return "is absolute; shard names are relative to the index's directory";
    for (const char *c = name; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.')
            return "has a '..' component; shards must stay in the index's directory";
        c += len;
        if (*c == '/')
            c++;
    }
    return NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int read_index_json(const char *path, json_t **out, wb_err *err)
{
    int fd = -1;
    struct stat st;
    int rc = open_regular(path, &fd, &st, err);
    if (rc)
        return rc;
    char *buf = NULL;
    if ((uint64_t)st.st_size > WB_ST_MAX_HEADER) {
        rc = fail(err, WB_EFORMAT, path, "index is %jd bytes, more than the %llu-byte limit",
                  (intmax_t)st.st_size, WB_ST_MAX_HEADER);
        goto out;
    }
    size_t size = (size_t)st.st_size;
    buf = malloc(size ? size : 1);
    if (!buf) {
        rc = fail(err, WB_ENOMEM, path, "out of memory reading the index");
        goto out;
    }
    rc = pread_full(fd, buf, size, 0, path, err);
    if (rc)
        goto out;
    json_error_t je;
    *out = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &je);
    if (!*out)
        rc = fail(err, WB_EFORMAT, path, "malformed JSON index: %s (line %d, column %d, byte %d)",
                  je.text, je.line, je.column, je.position);
out:
    free(buf);
    close(fd);
    return rc;
}

/* Index metadata values are strings or numbers (transformers writes
 * total_size as an integer); numbers become their decimal text. */
static int add_index_metadata(wb_st_table *table, const char *path, json_t *meta, wb_err *err)
{
    if (!meta)
        return 0;
    if (!json_is_object(meta))
        return fail(err, WB_EFORMAT, path, "\"metadata\" is %s, expected an object",
                    json_kind(meta));
    size_t n = json_object_size(meta);
    if (n == 0)
        return 0;
    table->meta = calloc(n, sizeof *table->meta);
    if (!table->meta)
        return fail(err, WB_ENOMEM, path, "out of memory reading metadata");
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value)
    {
        char num[64];
        const char *text;
        if (json_is_string(value)) {
            text = json_string_value(value);
        } else if (json_is_integer(value)) {
            snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
            text = num;
        } else if (json_is_real(value)) {
            /* The shortest text that reads back as the same double. */
            for (int prec = 15; prec <= 17; prec++) {
                snprintf(num, sizeof num, "%.*g", prec, json_real_value(value));
                if (strtod(num, NULL) == json_real_value(value))
                    break;
            }
            text = num;
        } else {
            return fail(err, WB_EFORMAT, path,
                        "metadata value of key " NAMEF " is %s; expected a string or a number", key,
                        json_kind(value));
        }
        wb_st_meta *mm = &table->meta[table->n_meta];
        mm->key = strdup(key);
        mm->value = strdup(text);
        table->n_meta++;
        if (!mm->key || !mm->value)
            return fail(err, WB_ENOMEM, path, "out of memory reading metadata");
    }
    qsort(table->meta, table->n_meta, sizeof *table->meta, cmp_meta);
    return 0;
}

/* Opens a sharded checkpoint: every shard the weight_map names, in name order,
 * then checks that the map and the shards agree tensor by tensor. */
static int open_index(const char *path, wb_st_table **out, wb_err *err)
{
    json_t *root = NULL;
    int rc = read_index_json(path, &root, err);
    if (rc)
        return rc;
    wb_st_table *table = NULL;
    const char **shards = NULL;
    size_t n_shards = 0;
    if (!json_is_object(root)) {
        rc = fail(err, WB_EFORMAT, path, "index is %s, expected a JSON object", json_kind(root));
        goto out;
    }
    json_t *wm = json_object_get(root, "weight_map");
    if (!wm) {
        rc = fail(err, WB_EFORMAT, path, "index has no \"weight_map\"");
        goto out;
    }
    if (!json_is_object(wm)) {
        rc = fail(err, WB_EFORMAT, path, "\"weight_map\" is %s, expected an object", json_kind(wm));
        goto out;
    }
    size_t n_map = json_object_size(wm);
    shards = malloc((n_map ? n_map : 1) * sizeof *shards);
    if (!shards) {
        rc = fail(err, WB_ENOMEM, path, "out of memory reading the weight_map");
        goto out;
    }
    const char *name;
    json_t *value;
    json_object_foreach(wm, name, value)
    {
        if (name[0] == '\0') {
            rc = fail(err, WB_EFORMAT, path, "weight_map has a tensor with an empty name");
            goto out;
        }
        if (!json_is_string(value)) {
            rc = fail(err, WB_EFORMAT, path,
                      "weight_map entry of tensor " NAMEF " is %s, expected a shard file name",
                      name, json_kind(value));
            goto out;
        }
        const char *why = bad_shard_name(json_string_value(value));
        if (why) {
            rc = fail(err, WB_EFORMAT, path, "weight_map: shard '%.200s' of tensor " NAMEF " %s",
                      json_string_value(value), name, why);
            goto out;
        }
        shards[n_shards++] = json_string_value(value);
    }
    qsort(shards, n_shards, sizeof *shards, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0)
            shards[u++] = shards[i];
    n_shards = u;
    if (n_shards > UINT32_MAX) {
        rc = fail(err, WB_EFORMAT, path, "too many shards");
        goto out;
    }

    table = calloc(1, sizeof *table);
    if (!table) {
        rc = fail(err, WB_ENOMEM, path, "out of memory");
        goto out;
    }
    rc = add_index_metadata(table, path, json_object_get(root, "metadata"), err);
    if (rc)
        goto out;

    const char *slash = strrchr(path, '/');
    size_t prefix_len = slash ? (size_t)(slash - path) + 1 : 0;
    for (size_t i = 0; i < n_shards; i++) {
        char *shard_path = path_join(path, prefix_len, shards[i]);
        if (!shard_path) {
            rc = fail(err, WB_ENOMEM, path, "out of memory");
            goto out;
        }
        rc = read_file(table, (uint32_t)i, shard_path, err);
        if (rc == WB_ENOTFOUND) {
            const char *holder = "";
            json_object_foreach(wm, name, value)
            {
                if (strcmp(json_string_value(value), shards[i]) == 0) {
                    holder = name;
                    break;
                }
            }
            rc = fail(err, WB_ENOTFOUND, path,
                      "shard '%.200s' (holding tensor " NAMEF ") is missing: no such file: " FILEF,
                      shards[i], holder, shard_path);
        }
        free(shard_path);
        if (rc)
            goto out;
    }

    /* Every tensor of every shard is in the map, mapped to that shard ... */
    for (size_t i = 0; i < table->n_tensors; i++) {
        const wb_st_tensor *t = &table->tensors[i];
        json_t *mapped = json_object_get(wm, t->name);
        if (!mapped) {
            rc = fail(err, WB_EFORMAT, path,
                      "tensor " NAMEF " in shard " FILEF " is not listed in the weight_map",
                      t->name, shards[t->file]);
            goto out;
        }
        if (strcmp(json_string_value(mapped), shards[t->file]) != 0) {
            rc = fail(err, WB_EFORMAT, path,
                      "tensor " NAMEF " is stored in shard " FILEF
                      " but the weight_map maps it to %.200s",
                      t->name, shards[t->file], json_string_value(mapped));
            goto out;
        }
    }
    /* ... and every tensor of the map is in its shard. */
    json_object_foreach(wm, name, value)
    {
        if (!wb__st_find(table, name)) {
            rc = fail(err, WB_EFORMAT, path,
                      "tensor " NAMEF " is mapped to shard %.200s, which does not contain it", name,
                      json_string_value(value));
            goto out;
        }
    }
out:
    free(shards);
    json_decref(root);
    if (rc)
        wb__st_table_free(&table);
    *out = table;
    return rc;
}

static int open_single(const char *path, wb_st_table **out, wb_err *err)
{
    wb_st_table *table = calloc(1, sizeof *table);
    if (!table)
        return wb__err_set(err, WB_ENOMEM, "out of memory opening " FILEF, path);
    int rc = read_file(table, 0, path, err);
    if (rc)
        wb__st_table_free(&table);
    *out = table;
    return rc;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/* A directory holds an index (sharded) or a single model.safetensors. */
static int open_dir(const char *path, wb_st_table **out, wb_err *err)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    int root = len == 1 && path[0] == '/';
    char *prefix = malloc(len + 2);
    if (!prefix)
        return wb__err_set(err, WB_ENOMEM, "out of memory opening " FILEF, path);
    memcpy(prefix, path, len);
    if (!root)
        prefix[len++] = '/';
    prefix[len] = '\0';

    int rc;
    struct stat st;
    char *candidate = path_join(prefix, len, INDEX_NAME);
    if (!candidate) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory opening " FILEF, path);
        goto out;
    }
    if (stat(candidate, &st) == 0) {
        rc = open_index(candidate, out, err);
        goto out;
    }
    if (errno != ENOENT) {
        rc = wb__err_errno(err, WB_EIO, errno, "cannot stat " FILEF, candidate);
        goto out;
    }
    free(candidate);
    candidate = path_join(prefix, len, SINGLE_NAME);
    if (!candidate) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory opening " FILEF, path);
        goto out;
    }
    if (stat(candidate, &st) == 0) {
        rc = open_single(candidate, out, err);
        goto out;
    }
    if (errno != ENOENT) {
        rc = wb__err_errno(err, WB_EIO, errno, "cannot stat " FILEF, candidate);
        goto out;
    }
    rc = wb__err_set(err, WB_ENOTFOUND,
                     FILEF ": directory holds neither " INDEX_NAME " nor " SINGLE_NAME, path);
out:
    free(candidate);
    free(prefix);
    return rc;
}

int wb__st_open(const char *path, wb_st_table **out, wb_err *err)
{
    if (!out)
        return wb__err_set(err, WB_EINVAL, "wb__st_open: no output table");
    *out = NULL;
    if (!path || !*path)
        return wb__err_set(err, WB_EINVAL, "wb__st_open: empty path");
    struct stat st;
    if (stat(path, &st) != 0)
        return open_error(err, errno, "stat", path);
    if (S_ISDIR(st.st_mode))
        return open_dir(path, out, err);
    if (ends_with(path, ".json"))
        return open_index(path, out, err);
    return open_single(path, out, err);
}
