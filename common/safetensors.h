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

/* Asked about each file the reader opens (the index, every shard), with the
 * open descriptor, after it is known to be a regular file and before any byte
 * of it is read; `path` names it for messages. A nonzero return (a WB_E*
 * code with `err` set) stops the open with that status. The broker uses it to
 * judge the requesting peer's access to the very file that is read. */
typedef int (*wb_st_file_check)(void *arg, int fd, const char *path, wb_err *err);

/* Asked, after check_file passed, about each safetensors file (the single
 * file or a shard, not the index) with the header length its first 8 bytes
 * give, read from that same descriptor; not asked about a file shorter than
 * 8 bytes (the parser reports it). Nonzero stops the open, as check_file. */
typedef int (*wb_st_header_check)(void *arg, const char *path, uint64_t header_len, wb_err *err);

/* Asked about an index once its weight_map is known to be an object of
 * shard names, with the number of tensors it maps, before any shard is
 * opened. Nonzero stops the open, as check_file. */
typedef int (*wb_st_count_check)(void *arg, const char *index_path, uint64_t tensors, wb_err *err);

typedef struct wb_st_open_opts {
    wb_st_file_check check_file;     /* may be NULL */
    void *arg;                       /* passed to each check */
    wb_st_header_check check_header; /* may be NULL */
    wb_st_count_check check_count;   /* may be NULL */
} wb_st_open_opts;

/* wb__st_open with options (NULL: none). A shard whose directories lead out
 * of the index's directory through a symbolic link is refused with
 * WB_EPERM; a shard file that is itself a link to a regular file elsewhere
 * (a Hugging Face cache's snapshots/ into blobs/) is followed. */
int wb__st_open_ex(const char *path, const wb_st_open_opts *opts, wb_st_table **out, wb_err *err);

/* Opens every file wb__st_open_ex would (resolving the directory and the
 * index, refusing the same shard names) and passes each to opts->check_file
 * (and its header length, its index's tensor count, to check_header and
 * check_count), but parses no safetensors header. Each file is opened once
 * and judged on that descriptor. Errors as wb__st_open_ex. */
int wb__st_check_files(const char *path, const wb_st_open_opts *opts, wb_err *err);

#endif
