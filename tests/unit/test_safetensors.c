/* The safetensors reader: exact tables for valid checkpoints (single files,
 * every dtype, shards through an index, files written by the official
 * libraries), and one clear error for each kind of malformed input. */
#include "safetensors.h"
#include "st_fixture.h"

#include <check.h>
#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[512];

static void make_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/wb-st-XXXXXX", base && *base ? base : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_tmpdir(void)
{
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Paths under the temporary directory; a small ring so that a test can hold a
 * few at once without freeing them. */
static const char *tpath(const char *fmt, ...)
{
    static char ring[8][1024];
    static int next;
    char rel[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    char *p = ring[next++ % 8];
    snprintf(p, 1024, "%s/%s", tmpdir, rel);
    return p;
}

static void write_raw(const char *path, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

/* Writes a safetensors file the way the format defines it: the header length
 * (little-endian), the JSON header padded with `pad` spaces, then `data_len`
 * bytes of data. Returns the header length. */
static uint64_t write_st(const char *path, const char *json, size_t pad, uint64_t data_len)
{
    size_t jl = strlen(json);
    uint64_t n = jl + pad;
    size_t total = 8 + (size_t)n + (size_t)data_len;
    unsigned char *buf = malloc(total ? total : 1);
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, ' ', pad);
    for (uint64_t i = 0; i < data_len; i++)
        buf[8 + n + i] = (unsigned char)(i * 7 + 1);
    write_raw(path, buf, total);
    free(buf);
    return n;
}

/* Opens `path` expecting failure with `code` and every given substring in the
 * message (NULL-terminated list). */
static void expect_open_error(const char *path, int code, ...)
{
    wb_err err = {0};
    wb_st_table *t = (wb_st_table *)1;
    int rc = wb__st_open(path, &t, &err);
    ck_assert_msg(rc == code, "%s: expected %s, got %s (%s)", path, wb_status_name(code),
                  wb_status_name(rc), err.msg);
    ck_assert_int_eq(err.code, code);
    ck_assert_ptr_null(t);
    va_list ap;
    va_start(ap, code);
    const char *want;
    while ((want = va_arg(ap, const char *)) != NULL)
        ck_assert_msg(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
    va_end(ap);
}

static wb_st_table *open_ok(const char *path)
{
    wb_err err = {0};
    wb_st_table *t = NULL;
    int rc = wb__st_open(path, &t, &err);
    ck_assert_msg(rc == WB_OK, "%s: %s", path, err.msg);
    ck_assert_ptr_nonnull(t);
    return t;
}

static void check_shape(const wb_st_tensor *t, uint32_t ndim, const uint64_t *shape)
{
    ck_assert_uint_eq(t->ndim, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        ck_assert_uint_eq(t->shape[i], shape[i]);
    if (ndim == 0)
        ck_assert_ptr_null(t->shape);
}

START_TEST(dtype_names_round_trip)
{
    static const char *const names[] = {
        "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
        "U16",  "F16", "BF16",    "I32",     "U32", "F32", "C64",     "F64",     "I64",     "U64"};
    static const unsigned bits[] = {8,  4,  6,  6,  8,  8,  8,  8,  8,  16,
                                    16, 16, 16, 32, 32, 32, 64, 64, 64, 64};
    ck_assert_int_eq(WB_DTYPE_COUNT, 20);
    for (int i = 0; i < WB_DTYPE_COUNT; i++) {
        ck_assert_str_eq(wb__dtype_name((wb_dtype)i), names[i]);
        ck_assert_int_eq(wb__dtype_parse(names[i]), i);
        ck_assert_uint_eq(wb__dtype_bits((wb_dtype)i), bits[i]);
    }
    ck_assert_int_eq(wb__dtype_parse("f32"), -1);
    ck_assert_int_eq(wb__dtype_parse("F32 "), -1);
    ck_assert_int_eq(wb__dtype_parse(""), -1);
    ck_assert_int_eq(wb__dtype_parse(NULL), -1);
    ck_assert_ptr_null(wb__dtype_name(WB_DTYPE_COUNT));
    ck_assert_uint_eq(wb__dtype_bits(WB_DTYPE_COUNT), 0);
}
END_TEST

/* One tensor of every dtype, shape [2, 4] (8 elements, so that F4 and F6 fill
 * whole bytes), listed in the JSON in reverse order of their offsets, plus a
 * scalar, two zero-sized tensors and metadata; the header is padded. */
START_TEST(every_dtype_exact_table)
{
    char json[8192];
    size_t jl = 0;
    uint64_t begin[WB_DTYPE_COUNT], nbytes[WB_DTYPE_COUNT], off = 0;
    for (int i = 0; i < WB_DTYPE_COUNT; i++) {
        begin[i] = off;
        nbytes[i] = 8 * wb__dtype_bits((wb_dtype)i) / 8;
        off += nbytes[i];
    }
    /* The scalar sits first, the zero-sized ones at the start and the end. */
    uint64_t scalar_begin = off, data_len = off + 4;
    jl += (size_t)snprintf(
        json + jl, sizeof json - jl,
        "{\"__metadata__\":{\"format\":\"pt\",\"b\":\"2\",\"a\":\"1\"},"
        "\"zz_end\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]},"
        "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]},",
        data_len, data_len, scalar_begin, scalar_begin + 4);
    for (int i = WB_DTYPE_COUNT - 1; i >= 0; i--)
        jl +=
            (size_t)snprintf(json + jl, sizeof json - jl,
                             "\"t_%s\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[%" PRIu64
                             ",%" PRIu64 "]},",
                             wb__dtype_name((wb_dtype)i), wb__dtype_name((wb_dtype)i), begin[i],
                             begin[i] + nbytes[i]);
    jl += (size_t)snprintf(json + jl, sizeof json - jl,
                           "\"empty\":{\"shape\":[0],\"data_offsets\":[0,0],\"dtype\":\"BF16\"}}");
    size_t pad = (8 - (jl + 8) % 8) % 8 + 8;
    const char *path = tpath("all.safetensors");
    uint64_t n = write_st(path, json, pad, data_len);
    ck_assert_uint_eq(n % 8, 0);

    wb_st_table *t = open_ok(path);
    ck_assert_uint_eq(t->n_files, 1);
    ck_assert_str_eq(t->files[0], path);
    ck_assert_uint_eq(t->file_sizes[0], 8 + n + data_len);
    ck_assert_uint_eq(t->data_starts[0], 8 + n);
    ck_assert_uint_eq(t->n_tensors, WB_DTYPE_COUNT + 3);
    ck_assert_uint_eq(t->total_bytes, data_len);

    /* Order: by offset, names breaking ties: "empty" (0, 0 bytes) before t_BOOL (0). */
    const wb_st_tensor *e = &t->tensors[0];
    ck_assert_str_eq(e->name, "empty");
    ck_assert_int_eq(e->dtype, WB_DTYPE_BF16);
    check_shape(e, 1, (const uint64_t[]){0});
    ck_assert_uint_eq(e->offset, 8 + n);
    ck_assert_uint_eq(e->nbytes, 0);
    for (int i = 0; i < WB_DTYPE_COUNT; i++) {
        const wb_st_tensor *x = &t->tensors[1 + i];
        char want[32];
        snprintf(want, sizeof want, "t_%s", wb__dtype_name((wb_dtype)i));
        ck_assert_str_eq(x->name, want);
        ck_assert_int_eq(x->dtype, i);
        check_shape(x, 2, (const uint64_t[]){2, 4});
        ck_assert_uint_eq(x->file, 0);
        ck_assert_uint_eq(x->offset, 8 + n + begin[i]);
        ck_assert_uint_eq(x->nbytes, nbytes[i]);
        ck_assert_ptr_eq(wb__st_find(t, want), x);
    }
    ck_assert_uint_eq(t->tensors[1 + WB_DTYPE_F4].nbytes, 4);
    const wb_st_tensor *s = &t->tensors[WB_DTYPE_COUNT + 1];
    ck_assert_str_eq(s->name, "scalar");
    check_shape(s, 0, NULL);
    ck_assert_uint_eq(s->offset, 8 + n + scalar_begin);
    ck_assert_uint_eq(s->nbytes, 4);
    const wb_st_tensor *z = &t->tensors[WB_DTYPE_COUNT + 2];
    ck_assert_str_eq(z->name, "zz_end");
    check_shape(z, 2, (const uint64_t[]){0, 4});
    ck_assert_uint_eq(z->offset, 8 + n + data_len);
    ck_assert_uint_eq(z->nbytes, 0);

    ck_assert_uint_eq(t->n_meta, 3);
    ck_assert_str_eq(t->meta[0].key, "a");
    ck_assert_str_eq(t->meta[0].value, "1");
    ck_assert_str_eq(t->meta[1].key, "b");
    ck_assert_str_eq(t->meta[2].key, "format");
    ck_assert_str_eq(t->meta[2].value, "pt");

    ck_assert_ptr_eq(wb__st_find(t, "scalar"), s);
    ck_assert_ptr_eq(wb__st_find(t, "empty"), e);
    ck_assert_ptr_null(wb__st_find(t, "t_F8"));
    ck_assert_ptr_null(wb__st_find(t, ""));
    ck_assert_ptr_null(wb__st_find(t, "__metadata__"));
    wb__st_table_free(&t);
    ck_assert_ptr_null(t);
    wb__st_table_free(&t); /* NULL is fine */
    wb__st_table_free(NULL);
}
END_TEST

START_TEST(sub_byte_dtypes_with_whole_bytes)
{
    /* 2 F4 elements = 1 byte; 4 F6 elements = 3 bytes; a zero-element F6. */
    const char *path = tpath("sub.safetensors");
    uint64_t n = write_st(path,
                          "{\"a\":{\"dtype\":\"F4\",\"shape\":[1,2],\"data_offsets\":[0,1]},"
                          "\"b\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[1,4]},"
                          "\"c\":{\"dtype\":\"F6_E2M3\",\"shape\":[0,3],\"data_offsets\":[4,4]}}",
                          0, 4);
    wb_st_table *t = open_ok(path);
    ck_assert_uint_eq(t->n_tensors, 3);
    ck_assert_uint_eq(t->tensors[0].nbytes, 1);
    ck_assert_uint_eq(t->tensors[1].nbytes, 3);
    ck_assert_uint_eq(t->tensors[1].offset, 8 + n + 1);
    ck_assert_uint_eq(t->tensors[2].nbytes, 0);
    ck_assert_uint_eq(t->tensors[2].offset, 8 + n + 4);
    ck_assert_uint_eq(t->n_meta, 0);
    wb__st_table_free(&t);
}
END_TEST

START_TEST(empty_checkpoint)
{
    const char *path = tpath("none.safetensors");
    write_st(path, "{}", 6, 0);
    wb_st_table *t = open_ok(path);
    ck_assert_uint_eq(t->n_tensors, 0);
    ck_assert_uint_eq(t->n_files, 1);
    ck_assert_uint_eq(t->total_bytes, 0);
    ck_assert_ptr_null(wb__st_find(t, "a"));
    wb__st_table_free(&t);

    write_st(path, "{\"__metadata__\":{}}", 0, 0);
    t = open_ok(path);
    ck_assert_uint_eq(t->n_meta, 0);
    wb__st_table_free(&t);
}
END_TEST

/* Sizes are 64-bit: a sparse file with a 1 TiB tensor is read from its header
 * alone. */
START_TEST(terabyte_sparse_file)
{
    const char *path = tpath("big.safetensors");
    uint64_t big = 1ULL << 40;
    char json[256];
    snprintf(json, sizeof json,
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[%" PRIu64 "],\"data_offsets\":[0,%" PRIu64 "]}}",
             big / 4, big);
    uint64_t n = write_st(path, json, 0, 0);
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    if (ftruncate(fd, (off_t)(8 + n + big)) != 0) {
        /* A file system without large sparse files cannot run this test. */
        fprintf(stderr, "terabyte_sparse_file: not run: ftruncate: %s\n", strerror(errno));
        close(fd);
        return;
    }
    close(fd);
    wb_st_table *t = open_ok(path);
    ck_assert_uint_eq(t->file_sizes[0], 8 + n + big);
    ck_assert_uint_eq(t->tensors[0].nbytes, big);
    ck_assert_uint_eq(t->tensors[0].shape[0], big / 4);
    ck_assert_uint_eq(t->total_bytes, big);
    wb__st_table_free(&t);
}
END_TEST

static void write_shard(const char *path, const char *json, uint64_t data_len)
{
    size_t pad = (8 - strlen(json) % 8) % 8;
    write_st(path, json, pad, data_len);
}

static void make_sharded(const char *dir)
{
    ck_assert_int_eq(mkdir(tpath("%s", dir), 0755), 0);
    ck_assert_int_eq(mkdir(tpath("%s/sub", dir), 0755), 0);
    write_shard(tpath("%s/model-00001-of-00002.safetensors", dir),
                "{\"__metadata__\":{\"format\":\"pt\",\"total_size\":\"shard\"},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}}",
                16);
    write_shard(tpath("%s/model-00002-of-00002.safetensors", dir),
                "{\"__metadata__\":{\"extra\":\"x\",\"format\":\"other\"},"
                "\"c\":{\"dtype\":\"BF16\",\"shape\":[3,1],\"data_offsets\":[0,6]}}",
                6);
    write_shard(tpath("%s/sub/tail.safetensors", dir),
                "{\"d\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[0,5]}}", 5);
    const char *index = "{\"metadata\":{\"total_size\":27,\"note\":\"n\"},\"weight_map\":{"
                        "\"a\":\"model-00001-of-00002.safetensors\","
                        "\"c\":\"model-00002-of-00002.safetensors\","
                        "\"d\":\"sub/tail.safetensors\","
                        "\"b\":\"model-00001-of-00002.safetensors\"}}";
    write_raw(tpath("%s/model.safetensors.index.json", dir), index, strlen(index));
}

static void check_sharded(wb_st_table *t, const char *dir)
{
    ck_assert_uint_eq(t->n_files, 3);
    ck_assert_str_eq(t->files[0], tpath("%s/model-00001-of-00002.safetensors", dir));
    ck_assert_str_eq(t->files[1], tpath("%s/model-00002-of-00002.safetensors", dir));
    ck_assert_str_eq(t->files[2], tpath("%s/sub/tail.safetensors", dir));
    ck_assert_uint_eq(t->n_tensors, 4);
    ck_assert_uint_eq(t->total_bytes, 27);
    static const char *const names[] = {"b", "a", "c", "d"};
    static const uint32_t files[] = {0, 0, 1, 2};
    static const uint64_t begins[] = {0, 8, 0, 0}, sizes[] = {8, 8, 6, 5};
    for (int i = 0; i < 4; i++) {
        const wb_st_tensor *x = &t->tensors[i];
        ck_assert_str_eq(x->name, names[i]);
        ck_assert_uint_eq(x->file, files[i]);
        ck_assert_uint_eq(x->offset, t->data_starts[files[i]] + begins[i]);
        ck_assert_uint_eq(x->nbytes, sizes[i]);
        ck_assert_ptr_eq(wb__st_find(t, names[i]), x);
        ck_assert_uint_eq(t->data_starts[files[i]] % 8, 0); /* padded headers */
    }
    check_shape(&t->tensors[2], 2, (const uint64_t[]){3, 1});
    ck_assert_int_eq(t->tensors[1].dtype, WB_DTYPE_I64);
    /* The index's metadata (numbers as text) wins; shards add missing keys. */
    ck_assert_uint_eq(t->n_meta, 4);
    ck_assert_str_eq(t->meta[0].key, "extra");
    ck_assert_str_eq(t->meta[0].value, "x");
    ck_assert_str_eq(t->meta[1].key, "format");
    ck_assert_str_eq(t->meta[1].value, "pt");
    ck_assert_str_eq(t->meta[2].key, "note");
    ck_assert_str_eq(t->meta[2].value, "n");
    ck_assert_str_eq(t->meta[3].key, "total_size");
    ck_assert_str_eq(t->meta[3].value, "27");
}

START_TEST(sharded_by_directory_and_index)
{
    make_sharded("ck");
    wb_st_table *t = open_ok(tpath("ck"));
    check_sharded(t, "ck");
    wb__st_table_free(&t);
    t = open_ok(tpath("ck/"));
    check_sharded(t, "ck");
    wb__st_table_free(&t);
    t = open_ok(tpath("ck/model.safetensors.index.json"));
    check_sharded(t, "ck");
    wb__st_table_free(&t);
}
END_TEST

START_TEST(directory_with_single_file)
{
    ck_assert_int_eq(mkdir(tpath("one"), 0755), 0);
    write_st(tpath("one/model.safetensors"),
             "{\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 0, 4);
    wb_st_table *t = open_ok(tpath("one"));
    ck_assert_uint_eq(t->n_files, 1);
    ck_assert_str_eq(t->files[0], tpath("one/model.safetensors"));
    ck_assert_str_eq(t->tensors[0].name, "x");
    wb__st_table_free(&t);
}
END_TEST

START_TEST(missing_paths)
{
    expect_open_error(tpath("nope.safetensors"), WB_ENOTFOUND, "no such file: ", tmpdir,
                      "nope.safetensors", NULL);
    expect_open_error(tpath("nope/model.safetensors"), WB_ENOTFOUND, "no such file", NULL);
    ck_assert_int_eq(mkdir(tpath("emptydir"), 0755), 0);
    expect_open_error(tpath("emptydir"), WB_ENOTFOUND, "emptydir",
                      "neither model.safetensors.index.json nor model.safetensors", NULL);
    expect_open_error(tpath("nope.json"), WB_ENOTFOUND, "no such file", NULL);
    wb_err err;
    wb_st_table *t = NULL;
    ck_assert_int_eq(wb__st_open("", &t, &err), WB_EINVAL);
    ck_assert_int_eq(wb__st_open(NULL, &t, &err), WB_EINVAL);
    ck_assert_int_eq(wb__st_open("x", NULL, &err), WB_EINVAL);
}
END_TEST

/* Malformed headers: each case is one JSON header (written with a correct
 * length field) plus a data section of `data_len` bytes. */
typedef struct bad_case {
    const char *json;
    uint64_t data_len;
    const char *want[4];
} bad_case;

#define T(fields) "{\"w\":{" fields "}}"
static const bad_case bad_cases[] = {
    /* invalid JSON */
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}",
     4,
     {"malformed JSON header", "line 1"}},
    /* duplicate tensor name */
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
     "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
     2,
     {"duplicate object key", "'\"w\"'", "only once"}},
    /* unknown and lowercase dtypes */
    {T("\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]"),
     16,
     {"tensor 'w'", "unknown dtype 'F128'"}},
    {T("\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]"),
     4,
     {"tensor 'w'", "unknown dtype 'f32'", "case-sensitive"}},
    {T("\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]"),
     4,
     {"tensor 'w'", "dtype is an integer"}},
    /* missing and extra fields */
    {T("\"shape\":[1],\"data_offsets\":[0,4]"), 4, {"tensor 'w'", "missing field 'dtype'"}},
    {T("\"dtype\":\"F32\",\"data_offsets\":[0,4]"), 4, {"tensor 'w'", "missing field 'shape'"}},
    {T("\"dtype\":\"F32\",\"shape\":[1]"), 4, {"tensor 'w'", "missing field 'data_offsets'"}},
    {T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"offset\":0"),
     4,
     {"tensor 'w'", "unexpected field 'offset'"}},
    {"{\"w\":[1,2]}", 0, {"tensor 'w'", "entry is an array"}},
    /* shapes */
    {T("\"dtype\":\"F32\",\"shape\":[2,-2],\"data_offsets\":[0,4]"),
     4,
     {"tensor 'w'", "shape[1] is -2", "non-negative"}},
    {T("\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]"),
     16,
     {"tensor 'w'", "shape is an integer"}},
    {T("\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]"),
     4,
     {"tensor 'w'", "shape[0] is a real number"}},
    {T("\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
       "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
       "\"data_offsets\":[0,1]"),
     1,
     {"tensor 'w'", "65 dimensions", "64 allowed"}},
    /* offsets */
    {T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]"),
     4,
     {"tensor 'w'", "data_offsets has 1 entries"}},
    {T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]"),
     8,
     {"tensor 'w'", "data_offsets has 3 entries"}},
    {T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0-4\""),
     4,
     {"tensor 'w'", "data_offsets is a string"}},
    {T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]"),
     8,
     {"tensor 'w'", "begin 8 is greater than end 4"}},
    {T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]"),
     4,
     {"tensor 'w'", "data_offsets begin is -4"}},
    {T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]"),
     4,
     {"malformed JSON header", "too big integer", "63 bits"}},
    /* sizes */
    {T("\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]"),
     20,
     {"tensor 'w'", "hold 20 bytes", "F32 with shape [2, 3] needs 24 bytes", "size mismatch"}},
    {T("\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,0]"),
     0,
     {"tensor 'w'", "element count", "overflows 64 bits"}},
    {T("\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]"),
     0,
     {"tensor 'w'", "2305843009213693952 elements of F64", "overflows 64 bits"}},
    {T("\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]"),
     2,
     {"tensor 'w'", "3 elements of F4 (4 bits each)", "whole number of bytes"}},
    {T("\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]"),
     2,
     {"tensor 'w'", "2 elements of F6_E2M3"}},
    /* coverage */
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
     12,
     {"hole of 4 bytes", "tensor 'a' (ends at 4)", "tensor 'b' (begins at 8)"}},
    {"{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8,
     {"hole of 4 bytes at the start", "tensor 'b'"}},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12,
     {"tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' (data_offsets [0, 8])"}},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
     8,
     {"tensor 'z'", "overlaps tensor 'a'"}},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     6,
     {"2 trailing bytes after the last tensor", "'a' ends at 4"}},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     4,
     {"tensor 'a' ends past the end of the file", "data section has 4 bytes"}},
    {"{}", 3, {"3 trailing bytes after the header, which lists no tensors"}},
    /* metadata */
    {"{\"__metadata__\":{\"n\":1}}", 0, {"__metadata__ value of key 'n' is an integer"}},
    {"{\"__metadata__\":[\"a\"]}", 0, {"__metadata__ is an array"}},
    {"{\"__metadata__\":null}", 0, {"__metadata__ is null"}},
    /* names */
    {"{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, {"empty name"}},
    {"{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
     1,
     {"malformed JSON header", "NUL characters are not allowed"}},
    /* trailing data after the object */
    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}  x",
     1,
     {"unexpected byte 0x78", "after the JSON object"}},
    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}{}",
     1,
     {"unexpected byte 0x7b"}},
};

START_TEST(malformed_header)
{
    const bad_case *c = &bad_cases[_i];
    const char *path = tpath("bad%d.safetensors", _i);
    write_st(path, c->json, 0, c->data_len);
    wb_err err = {0};
    wb_st_table *t = (wb_st_table *)1;
    int rc = wb__st_open(path, &t, &err);
    ck_assert_msg(rc == WB_EFORMAT, "case %d (%s): got %s (%s)", _i, c->json, wb_status_name(rc),
                  err.msg);
    ck_assert_ptr_null(t);
    /* The message names the file first. */
    ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0, "case %d: '%s' does not start with %s",
                  _i, err.msg, path);
    for (int k = 0; k < 4 && c->want[k]; k++)
        ck_assert_msg(strstr(err.msg, c->want[k]) != NULL, "case %d: message '%s' lacks '%s'", _i,
                      err.msg, c->want[k]);
}
END_TEST

START_TEST(malformed_framing)
{
    unsigned char buf[64] = {0};
    const char *p = tpath("short.safetensors");
    write_raw(p, "\x01\x02\x03\x04\x05", 5);
    expect_open_error(p, WB_EFORMAT, p, "file is 5 bytes, shorter than the 8-byte header length",
                      NULL);
    write_raw(p, "", 0);
    expect_open_error(p, WB_EFORMAT, "file is 0 bytes", NULL);

    st_put_le64(buf, 100000001ULL);
    memcpy(buf + 8, "{}", 2);
    write_raw(p, buf, 10);
    expect_open_error(p, WB_EFORMAT, "header length 100000001 exceeds the 100000000-byte limit",
                      NULL);
    st_put_le64(buf, UINT64_MAX);
    write_raw(p, buf, 10);
    expect_open_error(p, WB_EFORMAT, "header length 18446744073709551615 exceeds", NULL);

    st_put_le64(buf, 100);
    write_raw(p, buf, 8 + 50);
    expect_open_error(p, WB_EFORMAT, "header truncated: header length 100 but only 50 bytes", NULL);

    st_put_le64(buf, 0);
    write_raw(p, buf, 8);
    expect_open_error(p, WB_EFORMAT, "header is empty", NULL);

    write_st(p, " {}", 0, 0);
    expect_open_error(p, WB_EFORMAT, "does not start with '{' (first byte 0x20)", NULL);
    write_st(p, "[{\"a\":1}]", 0, 0);
    expect_open_error(p, WB_EFORMAT, "does not start with '{' (first byte 0x5b)", NULL);

    write_st(p, "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1);
    expect_open_error(p, WB_EFORMAT, "unable to decode byte 0xff", "valid UTF-8", NULL);

    /* A raw NUL byte in the header (not an escape). */
    static const char nul_hdr[] = "{\"a\":\"x\0y\"}";
    st_put_le64(buf, sizeof nul_hdr - 1);
    memcpy(buf + 8, nul_hdr, sizeof nul_hdr - 1);
    write_raw(p, buf, 8 + sizeof nul_hdr - 1);
    expect_open_error(p, WB_EFORMAT, "malformed JSON header", NULL);

    /* NUL padding is not whitespace. */
    static const char nul_pad[] = "{}\0\0";
    st_put_le64(buf, sizeof nul_pad - 1);
    memcpy(buf + 8, nul_pad, sizeof nul_pad - 1);
    write_raw(p, buf, 8 + sizeof nul_pad - 1);
    expect_open_error(p, WB_EFORMAT, "unexpected byte 0x00 at header byte 2", NULL);

    /* Not a regular file. */
    ck_assert_int_eq(mkfifo(tpath("fifo.safetensors"), 0600), 0);
    expect_open_error(tpath("fifo.safetensors"), WB_EFORMAT, "not a regular file", NULL);
}
END_TEST

/* Padding may be any JSON whitespace, and any amount. */
START_TEST(whitespace_padding)
{
    const char *p = tpath("pad.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}} \t\r\n", 0, 1);
    wb_st_table *t = open_ok(p);
    ck_assert_uint_eq(t->n_tensors, 1);
    wb__st_table_free(&t);
    write_st(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 4000, 1);
    t = open_ok(p);
    ck_assert_uint_eq(t->tensors[0].offset, 8 + 4000 +
                                                strlen("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
                                                       "\"data_offsets\":[0,1]}}"));
    wb__st_table_free(&t);
}
END_TEST

/* Index files: each case writes one index over two good shards. */
static void write_two_shards(const char *dir)
{
    ck_assert_int_eq(mkdir(tpath("%s", dir), 0755), 0);
    write_shard(tpath("%s/s1.safetensors", dir),
                "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    write_shard(tpath("%s/s2.safetensors", dir),
                "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3);
}

static void write_index(const char *dir, const char *json)
{
    write_raw(tpath("%s/model.safetensors.index.json", dir), json, strlen(json));
}

START_TEST(malformed_index)
{
    write_two_shards("i");
    char dir[1024], index[1024];
    snprintf(dir, sizeof dir, "%s", tpath("i"));
    snprintf(index, sizeof index, "%s", tpath("i/model.safetensors.index.json"));

    write_index("i", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    wb_st_table *t = open_ok(dir);
    ck_assert_uint_eq(t->n_tensors, 2);
    ck_assert_uint_eq(t->n_meta, 0);
    wb__st_table_free(&t);

    write_index("i", "{\"metadata\":{}}");
    expect_open_error(dir, WB_EFORMAT, index, "no \"weight_map\"", NULL);
    write_index("i", "{\"weight_map\":[]}");
    expect_open_error(dir, WB_EFORMAT, "\"weight_map\" is an array", NULL);
    write_index("i", "[]");
    expect_open_error(dir, WB_EFORMAT, "index is an array", NULL);
    write_index("i", "{\"weight_map\":{\"a\":\"s1.safetensors\",");
    expect_open_error(dir, WB_EFORMAT, index, "malformed JSON index", NULL);
    write_index("i", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s1.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "duplicate object key", NULL);
    write_index("i", "{\"weight_map\":{\"a\":1}}");
    expect_open_error(dir, WB_EFORMAT, "weight_map entry of tensor 'a' is an integer", NULL);
    write_index("i", "{\"weight_map\":{\"\":\"s1.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "empty name", NULL);

    /* A shard that does not exist. */
    write_index("i", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s3.safetensors\"}}");
    expect_open_error(dir, WB_ENOTFOUND, "shard 's3.safetensors' (holding tensor 'b') is missing",
                      "no such file", NULL);
    /* A tensor the map names but its shard lacks. */
    write_index("i", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\","
                     "\"c\":\"s2.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, index,
                      "tensor 'c' is mapped to shard s2.safetensors, which does not contain it",
                      NULL);
    /* A tensor of a shard that the map does not list. */
    write_index("i", "{\"weight_map\":{\"a\":\"s1.safetensors\"}}");
    t = open_ok(dir); /* s2 is not named, so it is not part of the checkpoint */
    ck_assert_uint_eq(t->n_files, 1);
    wb__st_table_free(&t);
    write_shard(tpath("i/s3.safetensors"),
                "{\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                "\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                2);
    write_index("i", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s3.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "tensor 'x' in shard s3.safetensors is not listed", NULL);
    /* A tensor stored in another shard than the map says. */
    write_index("i", "{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s1.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT,
                      "tensor 'a' is stored in shard s1.safetensors but the weight_map maps it "
                      "to s2.safetensors",
                      NULL);
    /* Path traversal and absolute shard names. */
    write_index("i", "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "shard '../x.safetensors' of tensor 'a'", "'..'", NULL);
    write_index("i", "{\"weight_map\":{\"a\":\"sub/../../x.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "'..' component", NULL);
    write_index("i", "{\"weight_map\":{\"a\":\"/etc/x.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "is absolute", NULL);
    write_index("i", "{\"weight_map\":{\"a\":\"\"}}");
    expect_open_error(dir, WB_EFORMAT, "shard '' of tensor 'a' is empty", NULL);
    /* Metadata of the index: numbers and strings only. */
    write_index("i", "{\"metadata\":{\"flag\":true},\"weight_map\":{\"a\":\"s1.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "metadata value of key 'flag' is a boolean", NULL);
    write_index("i", "{\"metadata\":[],\"weight_map\":{\"a\":\"s1.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "\"metadata\" is an array", NULL);
    write_index("i",
                "{\"metadata\":{\"r\":0.5,\"i\":-3},\"weight_map\":{\"a\":\"s1.safetensors\"}}");
    t = open_ok(index);
    ck_assert_uint_eq(t->n_meta, 2);
    ck_assert_str_eq(t->meta[0].key, "i");
    ck_assert_str_eq(t->meta[0].value, "-3");
    ck_assert_str_eq(t->meta[1].value, "0.5");
    wb__st_table_free(&t);
}
END_TEST

START_TEST(index_shard_errors)
{
    write_two_shards("j");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tpath("j"));
    /* The same tensor in two shards. */
    write_shard(tpath("j/s3.safetensors"),
                "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
                3);
    write_index("j", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s3.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, tpath("j/s3.safetensors"), "tensor 'a' is also in",
                      tpath("j/s1.safetensors"), NULL);
    /* An error inside a shard names the shard. */
    write_shard(tpath("j/s4.safetensors"),
                "{\"d\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    write_index("j", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"d\":\"s4.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, tpath("j/s4.safetensors"), "unknown dtype 'X9'", NULL);
    /* A shard that is a directory. */
    ck_assert_int_eq(mkdir(tpath("j/s5.safetensors"), 0755), 0);
    write_index("j", "{\"weight_map\":{\"a\":\"s5.safetensors\"}}");
    expect_open_error(dir, WB_EFORMAT, "s5.safetensors: not a regular file", NULL);
    /* An index path given directly is read as an index, whatever its name. */
    write_raw(tpath("j/other.json"), "{}", 2);
    expect_open_error(tpath("j/other.json"), WB_EFORMAT, "no \"weight_map\"", NULL);
}
END_TEST

/* Shard directories must stay inside the index's directory through links;
 * shard files may be links anywhere (a Hugging Face cache: snapshots/REV/NAME
 * -> ../../blobs/HASH). */
START_TEST(shard_links)
{
    write_two_shards("k");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tpath("k"));
    ck_assert_int_eq(mkdir(tpath("outside"), 0755), 0);
    write_shard(tpath("outside/o.safetensors"),
                "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3);
    ck_assert_int_eq(symlink("../outside", tpath("k/esc")), 0);
    write_index("k", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"esc/o.safetensors\"}}");
    expect_open_error(dir, WB_EPERM,
                      "shard 'esc/o.safetensors' leaves the index's directory through a symbolic "
                      "link; shard directories must stay inside it",
                      NULL);
    /* The check-only walk the broker does before a load refuses it alike. */
    wb_err err = {0};
    ck_assert_int_eq(wb__st_check_files(dir, NULL, &err), WB_EPERM);
    /* A link to a directory inside is fine. */
    ck_assert_int_eq(mkdir(tpath("k/real"), 0755), 0);
    ck_assert_int_eq(rename(tpath("k/s2.safetensors"), tpath("k/real/s2.safetensors")), 0);
    ck_assert_int_eq(symlink("real", tpath("k/alias")), 0);
    write_index("k", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"alias/s2.safetensors\"}}");
    wb_st_table *t = open_ok(dir);
    ck_assert_uint_eq(t->n_files, 2);
    wb__st_table_free(&t);
    /* A shard file that is itself a link out of the directory is followed. */
    ck_assert_int_eq(symlink("../outside/o.safetensors", tpath("k/linked.safetensors")), 0);
    write_index("k", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"linked.safetensors\"}}");
    t = open_ok(dir);
    ck_assert_uint_eq(t->n_tensors, 2);
    ck_assert_str_eq(t->files[0], tpath("k/linked.safetensors")); /* shards in name order */
    wb__st_table_free(&t);
}
END_TEST

static int refuse_all(void *arg, int fd, const char *path, wb_err *err)
{
    int *calls = arg;
    (*calls)++;
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    ck_assert(S_ISREG(st.st_mode));
    return wb__err_set(err, WB_EPERM, "refused %s", path);
}

/* The per-file check is asked about the index before it is read, and every
 * shard; its refusal is the open's. */
START_TEST(file_check_hook)
{
    write_two_shards("h");
    write_index("h", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    int calls = 0;
    wb_st_open_opts o = {.check_file = refuse_all, .arg = &calls};
    wb_st_table *t = NULL;
    wb_err err = {0};
    ck_assert_int_eq(wb__st_open_ex(tpath("h"), &o, &t, &err), WB_EPERM);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(calls, 1);
    char want[1200];
    snprintf(want, sizeof want, "refused %s", tpath("h/model.safetensors.index.json"));
    ck_assert_str_eq(err.msg, want);
    /* Without a check, every file is opened and none refused. */
    ck_assert_int_eq(wb__st_check_files(tpath("h"), NULL, &err), WB_OK);
}
END_TEST

/* What the index checks were asked, and what they refuse. */
typedef struct counts {
    int count_calls, shard_calls, file_calls;
    uint64_t tensors, shards;
    uint64_t max_tensors; /* refused over it */
    const char *refuse;   /* a file check refuses the path ending in this */
} counts;

static int note_count(void *arg, const char *index_path, uint64_t tensors, wb_err *err)
{
    counts *c = arg;
    c->count_calls++;
    c->tensors = tensors;
    if (tensors > c->max_tensors)
        return wb__err_set(err, WB_ELIMIT, "%s: %llu tensors", index_path,
                           (unsigned long long)tensors);
    return 0;
}

static int note_shards(void *arg, const char *index_path, uint64_t shards, wb_err *err)
{
    (void)index_path;
    (void)err;
    counts *c = arg;
    c->shard_calls++;
    c->shards = shards;
    return 0;
}

static int note_file(void *arg, int fd, const char *path, wb_err *err)
{
    (void)fd;
    counts *c = arg;
    c->file_calls++;
    size_t n = strlen(path), k = c->refuse ? strlen(c->refuse) : 0;
    if (c->refuse && n >= k && strcmp(path + n - k, c->refuse) == 0)
        return wb__err_set(err, WB_EPERM, "refused %s", path);
    return 0;
}

static int open_counted(const char *path, counts *c, int precheck, wb_err *err)
{
    wb_st_open_opts o = {.check_file = note_file,
                         .arg = c,
                         .check_count = note_count,
                         .check_shards = note_shards,
                         .precheck = precheck};
    wb_st_table *t = NULL;
    int rc = wb__st_open_ex(path, &o, &t, err);
    ck_assert(rc == WB_OK ? t != NULL : t == NULL);
    wb__st_table_free(&t);
    return rc;
}

/* An index's tensors are counted from its bytes and judged before it is
 * parsed (a refusal comes even where the parse would fail: a repeated key),
 * its shards once it is parsed and before any is opened; the values besides
 * the map are bounded. */
START_TEST(index_counts)
{
    write_two_shards("c");
    write_index("c", "{\"metadata\":{\"total_size\":5},\"weight_map\":{\"a\":\"s1.safetensors\","
                     "\"b\":\"s2.safetensors\"}}");
    counts c = {.max_tensors = 2};
    wb_err err = {0};
    ck_assert_msg(open_counted(tpath("c"), &c, 0, &err) == WB_OK, "%s", err.msg);
    ck_assert_int_eq(c.count_calls, 1);
    ck_assert_uint_eq(c.tensors, 2);
    ck_assert_int_eq(c.shard_calls, 1);
    ck_assert_uint_eq(c.shards, 2);
    ck_assert_int_eq(c.file_calls, 3); /* the index and two shards */

    /* Counted before the parse: the repeated key that would fail it. */
    write_index("c", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\","
                     "\"a\":\"s1.safetensors\"}}");
    c = (counts){.max_tensors = 2};
    ck_assert_int_eq(open_counted(tpath("c"), &c, 0, &err), WB_ELIMIT);
    char want[1200];
    snprintf(want, sizeof want, "%s: 3 tensors", tpath("c/model.safetensors.index.json"));
    ck_assert_str_eq(err.msg, want);
    ck_assert_uint_eq(c.tensors, 3);
    ck_assert_int_eq(c.shard_calls, 0);
    c = (counts){.max_tensors = 3};
    ck_assert_int_eq(open_counted(tpath("c"), &c, 0, &err), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "malformed JSON index"));

    /* Bytes the count cannot follow: the parser's message, and no count. */
    write_index("c", "{\"weight_map\":{\"a\":\"s1.safetensors\"");
    c = (counts){.max_tensors = 0};
    ck_assert_int_eq(open_counted(tpath("c"), &c, 0, &err), WB_EFORMAT);
    ck_assert_int_eq(c.count_calls, 0);

    /* Values besides the map: a few are fine, past the limit refused. */
    size_t n = WB_ST_INDEX_MAX_OTHER, cap = 2 * n + 128, used = 0;
    char *text = malloc(cap);
    ck_assert_ptr_nonnull(text);
    used += (size_t)snprintf(text, cap, "{\"metadata\":{\"k\":[0");
    for (size_t i = 1; i < n; i++) {
        text[used++] = ',';
        text[used++] = '0';
    }
    used +=
        (size_t)snprintf(text + used, cap - used, "]},\"weight_map\":{\"a\":\"s1.safetensors\"}}");
    write_raw(tpath("c/model.safetensors.index.json"), text, used);
    c = (counts){.max_tensors = 10};
    ck_assert_int_eq(open_counted(tpath("c"), &c, 0, &err), WB_ELIMIT);
    snprintf(want, sizeof want,
             "%s: the index holds %zu JSON values besides its weight_map's entries, over the "
             "limit of %d",
             tpath("c/model.safetensors.index.json"), n + 4, WB_ST_INDEX_MAX_OTHER);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(c.count_calls, 0);
    free(text);
}
END_TEST

/* With precheck, every shard is judged before any header is read: a
 * refused second shard is reported rather than the first one's malformed
 * header; without it, the first shard's header is read first. */
START_TEST(index_precheck)
{
    ck_assert_int_eq(mkdir(tpath("p"), 0755), 0);
    write_shard(tpath("p/s1.safetensors"), "{\"a\":{\"dtype\":\"U8\",\"shape\":[2]}}", 2);
    write_shard(tpath("p/s2.safetensors"),
                "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3);
    write_index("p", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    counts c = {.max_tensors = 10, .refuse = "/s2.safetensors"};
    wb_err err = {0};
    ck_assert_int_eq(open_counted(tpath("p"), &c, 0, &err), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "s1.safetensors"));
    c = (counts){.max_tensors = 10, .refuse = "/s2.safetensors"};
    ck_assert_int_eq(open_counted(tpath("p"), &c, 1, &err), WB_EPERM);
    char want[1200];
    snprintf(want, sizeof want, "refused %s", tpath("p/s2.safetensors"));
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(c.file_calls, 3); /* index, s1, s2: nothing read yet */
    /* All passing: each shard is judged twice, once to read it. */
    c = (counts){.max_tensors = 10};
    write_shard(tpath("p/s1.safetensors"),
                "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    ck_assert_msg(open_counted(tpath("p"), &c, 1, &err) == WB_OK, "%s", err.msg);
    ck_assert_int_eq(c.file_calls, 5);
}
END_TEST

/* The in-memory parser: failures leave the table as it was; names stay unique
 * across files; the order and the name index stay right when files arrive out
 * of order. */
static void check_invariants(const wb_st_table *t)
{
    for (size_t i = 0; i + 1 < t->n_tensors; i++) {
        const wb_st_tensor *a = &t->tensors[i], *b = &t->tensors[i + 1];
        ck_assert(a->file < b->file || (a->file == b->file &&
                                        (a->offset < b->offset || (a->offset == b->offset &&
                                                                   strcmp(a->name, b->name) < 0))));
    }
    for (size_t i = 0; i < t->n_tensors; i++)
        ck_assert_ptr_eq(wb__st_find(t, t->tensors[i].name), &t->tensors[i]);
    for (size_t i = 0; i + 1 < t->n_tensors; i++)
        ck_assert_int_lt(strcmp(t->tensors[t->by_name[i]].name, t->tensors[t->by_name[i + 1]].name),
                         0);
}

START_TEST(parse_header_in_memory)
{
    unsigned char buf[512];
    wb_err err;
    wb_st_table *t = calloc(1, sizeof *t);
    ck_assert_ptr_nonnull(t);
    size_t len = st_build(buf, sizeof buf,
                          "{\"m\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                          "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]},"
                          "\"__metadata__\":{\"k\":\"v\"}}",
                          2);
    ck_assert_int_eq(wb__st_parse_header(t, 0, "A", buf, len, len, &err), WB_OK);
    ck_assert_uint_eq(t->n_files, 1);
    ck_assert_str_eq(t->files[0], "A");
    check_invariants(t);

    /* A bad file leaves the table unchanged. */
    size_t bad = st_build(buf, sizeof buf,
                          "{\"q\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2);
    ck_assert_int_eq(wb__st_parse_header(t, 1, "B", buf, bad, bad, &err), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "B: tensor 'q'"));
    ck_assert_uint_eq(t->n_files, 1);
    ck_assert_uint_eq(t->n_tensors, 2);
    ck_assert_uint_eq(t->n_meta, 1);
    /* A name already in the table. */
    len = st_build(buf, sizeof buf,
                   "{\"z\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                   "\"m\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                   2);
    ck_assert_int_eq(wb__st_parse_header(t, 1, "B", buf, len, len, &err), WB_EFORMAT);
    ck_assert_str_eq(err.msg, "B: tensor 'm' is also in A; a tensor may appear in only one file");
    ck_assert_uint_eq(t->n_tensors, 2);
    ck_assert_uint_eq(t->n_files, 1);
    /* A file index that skips one. */
    ck_assert_int_eq(wb__st_parse_header(t, 2, "C", buf, len, len, &err), WB_EINVAL);

    /* In order: names merge into the index. */
    len = st_build(buf, sizeof buf,
                   "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                   "\"zz\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
                   "\"__metadata__\":{\"k\":\"other\",\"j\":\"w\"}}",
                   2);
    ck_assert_int_eq(wb__st_parse_header(t, 1, "B", buf, len, len, &err), WB_OK);
    ck_assert_uint_eq(t->n_tensors, 4);
    ck_assert_uint_eq(t->n_files, 2);
    ck_assert_uint_eq(t->total_bytes, 4);
    check_invariants(t);
    ck_assert_uint_eq(t->n_meta, 2);
    ck_assert_str_eq(t->meta[0].key, "j");
    ck_assert_str_eq(t->meta[1].key, "k");
    ck_assert_str_eq(t->meta[1].value, "v"); /* the first file's value stays */

    /* Out of order: more tensors for file 0 force a full re-sort. */
    len = st_build(buf, sizeof buf,
                   "{\"b\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
    ck_assert_int_eq(wb__st_parse_header(t, 0, "A", buf, len, len, &err), WB_OK);
    ck_assert_uint_eq(t->n_tensors, 5);
    ck_assert_uint_eq(t->n_files, 2);
    check_invariants(t);
    ck_assert_str_eq(t->tensors[0].name, "b");
    ck_assert_uint_eq(t->tensors[4].file, 1);
    ck_assert_uint_eq(t->total_bytes, 6);

    /* A buffer shorter than the header it announces. */
    ck_assert_int_eq(wb__st_parse_header(t, 2, "C", buf, 20, len, &err), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "C: header truncated"));
    ck_assert_int_eq(wb__st_parse_header(t, 2, "C", buf, 4, len, &err), WB_EFORMAT);
    ck_assert_int_eq(wb__st_parse_header(NULL, 0, "C", buf, len, len, &err), WB_EINVAL);
    wb__st_table_free(&t);
}
END_TEST

/* find() works on a table without a name index (one built by hand). */
START_TEST(find_without_index)
{
    wb_st_tensor ts[2] = {{.name = "x"}, {.name = "y"}};
    wb_st_table t = {.n_tensors = 2, .tensors = ts};
    ck_assert_ptr_eq(wb__st_find(&t, "y"), &ts[1]);
    ck_assert_ptr_null(wb__st_find(&t, "z"));
    ck_assert_ptr_null(wb__st_find(NULL, "z"));
    ck_assert_ptr_null(wb__st_find(&t, NULL));
}
END_TEST

/* Many tensors: lookups by name stay right (and fast enough to run 20k). */
START_TEST(many_tensors)
{
    enum { N = 20000 };
    size_t cap = (size_t)N * 100 + 16;
    char *json = malloc(cap);
    ck_assert_ptr_nonnull(json);
    size_t jl = 0;
    json[jl++] = '{';
    for (int i = 0; i < N; i++)
        jl += (size_t)snprintf(
            json + jl, cap - jl,
            "%s\"layer.%d.w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[%d,%d]}",
            i ? "," : "", (i * 7919) % N, i * 4, i * 4 + 4);
    json[jl++] = '}';
    json[jl] = '\0';
    const char *p = tpath("many.safetensors");
    uint64_t n = write_st(p, json, 0, (uint64_t)N * 4);
    free(json);
    wb_st_table *t = open_ok(p);
    ck_assert_uint_eq(t->n_tensors, N);
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer.%d.w", (i * 7919) % N);
        const wb_st_tensor *x = wb__st_find(t, name);
        ck_assert_ptr_nonnull(x);
        ck_assert_uint_eq(x->offset, 8 + n + (uint64_t)i * 4);
    }
    ck_assert_ptr_null(wb__st_find(t, "layer.20000.w"));
    wb__st_table_free(&t);
}
END_TEST

/* Checkpoints written by safetensors and transformers themselves, compared
 * with the manifest that the generator computed from the raw bytes. */
static void compare_official(const char *root, json_t *ck, const char *open_path)
{
    wb_st_table *t = open_ok(open_path);
    json_t *files = json_object_get(ck, "files");
    ck_assert_uint_eq(t->n_files, json_array_size(files));
    char want[2048];
    for (uint32_t i = 0; i < t->n_files; i++) {
        snprintf(want, sizeof want, "%s/%s", root, json_string_value(json_array_get(files, i)));
        ck_assert_str_eq(t->files[i], want);
        struct stat st;
        ck_assert_int_eq(stat(want, &st), 0);
        ck_assert_uint_eq(t->file_sizes[i], (uint64_t)st.st_size);
    }
    json_t *meta = json_object_get(ck, "metadata");
    ck_assert_uint_eq(t->n_meta, json_object_size(meta));
    for (size_t i = 0; i < t->n_meta; i++) {
        json_t *v = json_object_get(meta, t->meta[i].key);
        ck_assert_msg(v != NULL, "%s: unexpected metadata key %s", open_path, t->meta[i].key);
        ck_assert_str_eq(t->meta[i].value, json_string_value(v));
    }
    json_t *tensors = json_object_get(ck, "tensors");
    ck_assert_uint_eq(t->n_tensors, json_array_size(tensors));
    for (size_t i = 0; i < t->n_tensors; i++) {
        const wb_st_tensor *x = &t->tensors[i];
        json_t *e = json_array_get(tensors, i);
        ck_assert_str_eq(x->name, json_string_value(json_object_get(e, "name")));
        ck_assert_str_eq(wb__dtype_name(x->dtype), json_string_value(json_object_get(e, "dtype")));
        json_t *shape = json_object_get(e, "shape");
        ck_assert_uint_eq(x->ndim, json_array_size(shape));
        for (uint32_t d = 0; d < x->ndim; d++)
            ck_assert_uint_eq(x->shape[d], (uint64_t)json_integer_value(json_array_get(shape, d)));
        snprintf(want, sizeof want, "%s/%s", root, json_string_value(json_object_get(e, "file")));
        ck_assert_str_eq(t->files[x->file], want);
        ck_assert_uint_eq(x->offset, (uint64_t)json_integer_value(json_object_get(e, "offset")));
        ck_assert_uint_eq(x->nbytes, (uint64_t)json_integer_value(json_object_get(e, "nbytes")));
    }
    ck_assert_uint_eq(t->total_bytes,
                      (uint64_t)json_integer_value(json_object_get(ck, "total_bytes")));
    wb__st_table_free(&t);
}

START_TEST(official_fixtures)
{
    const char *data = getenv("WB_TEST_DATA");
    ck_assert_msg(data != NULL, "WB_TEST_DATA is not set");
    char root[1024], path[1200];
    snprintf(root, sizeof root, "%s/official", data);
    snprintf(path, sizeof path, "%s/expected.json", root);
    json_error_t je;
    json_t *expected = json_load_file(path, 0, &je);
    ck_assert_msg(expected != NULL, "%s: %s", path, je.text);
    json_t *cks = json_object_get(expected, "checkpoints");
    ck_assert_uint_eq(json_array_size(cks), 3);
    int seen_dtypes[WB_DTYPE_COUNT] = {0};
    size_t i;
    json_t *ck;
    json_array_foreach(cks, i, ck)
    {
        const char *rel = json_string_value(json_object_get(ck, "path"));
        snprintf(path, sizeof path, "%s/%s", root, rel);
        compare_official(root, ck, path);
        json_t *files = json_object_get(ck, "files");
        if (strcmp(rel, "gpt2") == 0) {
            snprintf(path, sizeof path, "%s/%s", root, json_string_value(json_array_get(files, 0)));
            compare_official(root, ck, path);
        }
        if (json_array_size(files) > 1) {
            snprintf(path, sizeof path, "%s/%s/model.safetensors.index.json", root, rel);
            compare_official(root, ck, path);
        }
        size_t k;
        json_t *e;
        json_array_foreach(json_object_get(ck, "tensors"), k, e)
        {
            int d = wb__dtype_parse(json_string_value(json_object_get(e, "dtype")));
            ck_assert_int_ge(d, 0);
            seen_dtypes[d] = 1;
        }
    }
    /* The fixtures hold every dtype that torch and safetensors could write. */
    static const wb_dtype written[] = {
        WB_DTYPE_BOOL,    WB_DTYPE_U8,  WB_DTYPE_I8,  WB_DTYPE_I16,     WB_DTYPE_U16,
        WB_DTYPE_I32,     WB_DTYPE_U32, WB_DTYPE_I64, WB_DTYPE_U64,     WB_DTYPE_F16,
        WB_DTYPE_BF16,    WB_DTYPE_F32, WB_DTYPE_F64, WB_DTYPE_F8_E5M2, WB_DTYPE_F8_E4M3,
        WB_DTYPE_F8_E8M0, WB_DTYPE_C64, WB_DTYPE_F4};
    for (size_t k = 0; k < sizeof written / sizeof written[0]; k++)
        ck_assert_msg(seen_dtypes[written[k]], "no official tensor of dtype %s",
                      wb__dtype_name(written[k]));
    json_decref(expected);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("reader");
    tcase_add_checked_fixture(tc, make_tmpdir, remove_tmpdir);
    tcase_add_test(tc, dtype_names_round_trip);
    tcase_add_test(tc, every_dtype_exact_table);
    tcase_add_test(tc, sub_byte_dtypes_with_whole_bytes);
    tcase_add_test(tc, empty_checkpoint);
    tcase_add_test(tc, terabyte_sparse_file);
    tcase_add_test(tc, sharded_by_directory_and_index);
    tcase_add_test(tc, directory_with_single_file);
    tcase_add_test(tc, missing_paths);
    tcase_add_loop_test(tc, malformed_header, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, malformed_framing);
    tcase_add_test(tc, whitespace_padding);
    tcase_add_test(tc, malformed_index);
    tcase_add_test(tc, index_shard_errors);
    tcase_add_test(tc, shard_links);
    tcase_add_test(tc, file_check_hook);
    tcase_add_test(tc, index_counts);
    tcase_add_test(tc, index_precheck);
    tcase_add_test(tc, parse_header_in_memory);
    tcase_add_test(tc, find_without_index);
    tcase_add_test(tc, many_tensors);
    tcase_add_test(tc, official_fixtures);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
