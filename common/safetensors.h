/* The safetensors reader: opens a checkpoint (one file, or shards named by a
 * model.safetensors.index.json), reads each file's header and validates it
 * with the parser (safetensors_parse.h), producing the tensor table that the
 * loader and `wbctl inspect` use. Only headers are read here. */
#ifndef WB_SAFETENSORS_H
#define WB_SAFETENSORS_H

#include "err.h"
#include "safetensors_parse.h"
#include "safetensors_table.h"

/* Opens a checkpoint: a .safetensors file, a directory holding
 * model.safetensors.index.json (or a single model.safetensors), or an index
 * file. On success *out is a new table owned by the caller (free with
 * wb__st_table_free). Returns WB_ENOTFOUND for a missing path, WB_EIO for a
 * read error, WB_EFORMAT for malformed input. */
int wb__st_open(const char *path, wb_st_table **out, wb_err *err);

#endif
