/* The tensor table and the dtype names it uses. Both the parser (which fills
 * a table) and the file reader (which owns one per checkpoint) link this. */
#include "safetensors_table.h"

#include "names.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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
    return wb__names_find(table->tensors, table->n_tensors, sizeof *table->tensors,
                          offsetof(wb_st_tensor, name), table->by_name, name);
}
