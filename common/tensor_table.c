#include "tensor_table.h"

#include "alloc.h"
#include "utf8.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct table_header {
    uint32_t magic, n, dims, strings;
} table_header;
_Static_assert(sizeof(table_header) == WB_TABLE_HEADER, "the table header is 16 bytes");
_Static_assert(sizeof(wb_table_tensor) == WB_TABLE_RECORD, "a table record is 40 bytes");

/* The dtype strings already written (a handful per model), so that equal
 * dtypes share one string. */
typedef struct dtype_seen {
    const char *name;
    uint32_t at;
} dtype_seen;

uint8_t *wb__tensor_table_pack(Wbproto__Tensor *const *tensors, size_t n, size_t *len)
{
    uint64_t dims = 0, strings = 0;
    dtype_seen seen[16];
    size_t n_seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (tensors[i]->n_shape > UINT16_MAX || tensors[i]->slab > UINT16_MAX)
            return NULL;
        dims += tensors[i]->n_shape;
        strings += strlen(tensors[i]->name) + strlen(tensors[i]->dtype) + 2;
    }
    if (strings == 0)
        strings = 1; /* the final NUL the layout promises */
    uint64_t total = WB_TABLE_HEADER + (uint64_t)n * WB_TABLE_RECORD + dims * 8 + strings;
    if (n > UINT32_MAX || total > UINT32_MAX)
        return NULL;
    uint8_t *buf = wb__calloc(1, (size_t)total);
    if (!buf)
        return NULL;
    uint8_t *rec = buf + WB_TABLE_HEADER;
    uint8_t *dim = rec + n * WB_TABLE_RECORD;
    char *str = (char *)(dim + dims * 8);
    uint32_t sp = 0, dp = 0;
    for (size_t i = 0; i < n; i++) {
        const Wbproto__Tensor *t = tensors[i];
        size_t ln = strlen(t->name) + 1;
        wb_table_tensor r = {.offset = t->offset,
                             .nbytes = t->nbytes,
                             .xxh3 = t->xxh3,
                             .name = sp,
                             .dim = dp,
                             .ndim = (uint16_t)t->n_shape,
                             .slab = (uint16_t)t->slab};
        memcpy(str + sp, t->name, ln);
        sp += (uint32_t)ln;
        size_t k = 0;
        while (k < n_seen && strcmp(seen[k].name, t->dtype) != 0)
            k++;
        if (k < n_seen) {
            r.dtype = seen[k].at;
        } else {
            size_t ld = strlen(t->dtype) + 1;
            r.dtype = sp;
            memcpy(str + sp, t->dtype, ld);
            if (n_seen < sizeof seen / sizeof seen[0])
                seen[n_seen++] = (dtype_seen){t->dtype, sp};
            sp += (uint32_t)ld;
        }
        if (t->n_shape)
            memcpy(dim + (size_t)dp * 8, t->shape, t->n_shape * 8);
        dp += (uint32_t)t->n_shape;
        memcpy(rec + i * WB_TABLE_RECORD, &r, sizeof r);
    }
    /* Shared dtypes leave the strings shorter than reserved: the table
     * ends at the last one written. */
    if (sp == 0)
        sp = 1;
    table_header h = {WB_TABLE_MAGIC, (uint32_t)n, (uint32_t)dims, sp};
    memcpy(buf, &h, sizeof h);
    *len = (size_t)(total - strings + sp);
    return buf;
}

/* Names the tensor whose string holds byte `bad` of the strings. */
static int table_bad_string(const uint8_t *table, const table_header *h, const char *str,
                            size_t bad, wb_err *err)
{
    size_t start = bad;
    while (start > 0 && str[start - 1] != '\0')
        start--;
    for (uint32_t i = 0; i < h->n; i++) {
        wb_table_tensor r;
        memcpy(&r, table + WB_TABLE_HEADER + (size_t)i * WB_TABLE_RECORD, sizeof r);
        if (r.name == start || r.dtype == start)
            return wb__err_set(err, WB_EPROTO,
                               "lease.tensor_table[%u].%s is not valid UTF-8 (byte %zu)", i,
                               r.name == start ? "name" : "dtype", bad - start);
    }
    return wb__err_set(err, WB_EPROTO,
                       "lease.tensor_table's strings are not valid UTF-8 (byte %zu of them)", bad);
}

/* A UTF-8 continuation byte (10xxxxxx): no character starts there. */
static int starts_inside_char(char c)
{
    return ((unsigned char)c & 0xC0) == 0x80;
}

int wb__tensor_table_check(const uint8_t *table, size_t len, Wbproto__Slab *const *slabs,
                           size_t n_slabs, wb_err *err)
{
    table_header h;
    if (len < WB_TABLE_HEADER)
        return wb__err_set(err, WB_EPROTO, "lease.tensor_table has %zu bytes, less than a header",
                           len);
    memcpy(&h, table, sizeof h);
    if (h.magic != WB_TABLE_MAGIC)
        return wb__err_set(err, WB_EPROTO, "lease.tensor_table has magic 0x%08x, not 0x%08x",
                           h.magic, WB_TABLE_MAGIC);
    uint64_t want = WB_TABLE_HEADER + (uint64_t)h.n * WB_TABLE_RECORD + (uint64_t)h.dims * 8 +
                    (uint64_t)h.strings;
    if (want != len)
        return wb__err_set(err, WB_EPROTO,
                           "lease.tensor_table has %zu bytes but its header (%u tensors, %u dims, "
                           "%u string bytes) needs %llu",
                           len, h.n, h.dims, h.strings, (unsigned long long)want);
    const char *str = (const char *)table + (len - h.strings);
    /* With a NUL last, every offset inside the strings starts a string that
     * ends inside them. */
    if (h.strings == 0 || str[h.strings - 1] != '\0')
        return wb__err_set(err, WB_EPROTO, "lease.tensor_table's strings do not end with a NUL");
    /* Names and dtypes reach the caller as strings (and Python's str):
     * UTF-8, as the Tensor messages' strings are. The strings are the
     * names one after the other, so one pass checks them all. */
    size_t bad = wb__utf8_invalid_at(str, h.strings);
    if (bad < h.strings)
        return table_bad_string(table, &h, str, bad, err);
    for (uint32_t i = 0; i < h.n; i++) {
        wb_table_tensor r;
        memcpy(&r, table + WB_TABLE_HEADER + (size_t)i * WB_TABLE_RECORD, sizeof r);
        if (r.name >= h.strings || !str[r.name])
            return wb__err_set(err, WB_EPROTO, "lease.tensor_table[%u] has no name", i);
        /* The one pass above holds for strings that start where a
         * character does: an offset into the middle of one would give a
         * string that is not UTF-8. */
        if (starts_inside_char(str[r.name]))
            return wb__err_set(err, WB_EPROTO,
                               "lease.tensor_table[%u]'s name starts inside a UTF-8 character", i);
        const char *name = str + r.name;
        if (r.dtype >= h.strings || !str[r.dtype])
            return wb__err_set(err, WB_EPROTO, "tensor '%.200s' has no dtype", name);
        if (starts_inside_char(str[r.dtype]))
            return wb__err_set(err, WB_EPROTO,
                               "tensor '%.200s''s dtype starts inside a UTF-8 character", name);
        if (r.ndim > WB_MAX_DIMS || r.dim > h.dims || r.ndim > h.dims - r.dim)
            return wb__err_set(err, WB_EPROTO,
                               "tensor '%.200s' has %u dimensions from dim %u (of %u, at most %d "
                               "each)",
                               name, r.ndim, r.dim, h.dims, WB_MAX_DIMS);
        if (r.slab >= n_slabs)
            return wb__err_set(err, WB_EPROTO, "tensor '%.200s' names slab %u of %zu", name, r.slab,
                               n_slabs);
        uint64_t size = slabs[r.slab]->size;
        if (r.offset > size || r.nbytes > size - r.offset)
            return wb__err_set(err, WB_EPROTO,
                               "tensor '%.200s' (offset %llu, %llu bytes) ends past its slab of "
                               "%llu bytes",
                               name, (unsigned long long)r.offset, (unsigned long long)r.nbytes,
                               (unsigned long long)size);
    }
    return WB_OK;
}

void wb__tensor_table_digest(const uint8_t *table, size_t len, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(table, len));
    memcpy(out, c.digest, 16);
}

uint32_t wb__tensor_table_count(const uint8_t *table)
{
    table_header h;
    memcpy(&h, table, sizeof h);
    return h.n;
}

void wb__tensor_table_get(const uint8_t *table, uint32_t i, wb_table_tensor *out)
{
    memcpy(out, table + WB_TABLE_HEADER + (size_t)i * WB_TABLE_RECORD, sizeof *out);
}

const uint64_t *wb__tensor_table_dims(const uint8_t *table)
{
    table_header h;
    memcpy(&h, table, sizeof h);
    return (const uint64_t *)(const void *)(table + WB_TABLE_HEADER +
                                            (size_t)h.n * WB_TABLE_RECORD);
}

const char *wb__tensor_table_strings(const uint8_t *table)
{
    table_header h;
    memcpy(&h, table, sizeof h);
    return (const char *)table + WB_TABLE_HEADER + (size_t)h.n * WB_TABLE_RECORD +
           (size_t)h.dims * 8;
}
