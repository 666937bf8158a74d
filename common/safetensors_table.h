/* The tensor table a safetensors checkpoint is read into, and the dtypes it
 * names. The parser (safetensors_parse.h) fills it; the reader
 * (safetensors.h) returns one per checkpoint. */
#ifndef WB_SAFETENSORS_TABLE_H
#define WB_SAFETENSORS_TABLE_H

#include <stddef.h>
#include <stdint.h>

/* Largest header the reader accepts, as in the reference implementation. */
#define WB_ST_MAX_HEADER 100000000ULL
/* Largest number of dimensions a tensor may have. */
#define WB_ST_MAX_DIMS 64

typedef enum wb_dtype {
    WB_DTYPE_BOOL,
    WB_DTYPE_F4,
    WB_DTYPE_F6_E2M3,
    WB_DTYPE_F6_E3M2,
    WB_DTYPE_U8,
    WB_DTYPE_I8,
    WB_DTYPE_F8_E5M2,
    WB_DTYPE_F8_E4M3,
    WB_DTYPE_F8_E8M0,
    WB_DTYPE_I16,
    WB_DTYPE_U16,
    WB_DTYPE_F16,
    WB_DTYPE_BF16,
    WB_DTYPE_I32,
    WB_DTYPE_U32,
    WB_DTYPE_F32,
    WB_DTYPE_C64,
    WB_DTYPE_F64,
    WB_DTYPE_I64,
    WB_DTYPE_U64,
    WB_DTYPE_COUNT
} wb_dtype;

/* "F32" etc., spelled as in the file; NULL for an out-of-range value. */
const char *wb__dtype_name(wb_dtype dtype);
/* Parses a dtype name (exact, case-sensitive); returns -1 if unknown. */
int wb__dtype_parse(const char *name);
/* Size of one element in bits (4 for F4, 6 for F6_*, 8 for U8, ...). */
unsigned wb__dtype_bits(wb_dtype dtype);

typedef struct wb_st_tensor {
    char *name; /* owned by the table */
    wb_dtype dtype;
    uint32_t ndim;   /* 0 for a scalar */
    uint64_t *shape; /* ndim entries, owned by the table (NULL when ndim == 0) */
    uint32_t file;   /* index into wb_st_table.files */
    uint64_t offset; /* absolute byte offset of the data in that file */
    uint64_t nbytes; /* product(shape) * bits / 8, may be 0 */
} wb_st_tensor;

typedef struct wb_st_meta {
    char *key;   /* owned */
    char *value; /* owned */
} wb_st_meta;

typedef struct wb_st_table {
    uint32_t n_files;
    char **files;          /* paths as opened, owned */
    uint64_t *file_sizes;  /* byte size of each file */
    uint64_t *data_starts; /* absolute offset of each file's data section (8 + header length) */
    size_t n_tensors;
    wb_st_tensor *tensors; /* ordered by (file, offset) */
    size_t n_meta;
    wb_st_meta *meta;     /* ordered by key */
    uint64_t total_bytes; /* sum of nbytes */
    size_t *by_name;      /* n_tensors indices into tensors, ordered by name, owned; kept by
                           * wb__st_parse_header for wb__st_find (NULL: find scans) */
    uint32_t remembered;  /* files the memo had: headers, and a shard index (safetensors_memo.h) */
} wb_st_table;

/* Frees a table and sets *table to NULL; NULL is fine. */
void wb__st_table_free(wb_st_table **table);

/* Looks up a tensor by name; NULL if absent. */
const wb_st_tensor *wb__st_find(const wb_st_table *table, const char *name);

#endif
