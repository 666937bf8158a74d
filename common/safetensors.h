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
 * read error, WB_EFORMAT for malformed input, WB_ENOMEM when memory ran out
 * (jansson's included, where it allocates through wb__malloc). */
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

/* Asked about an index with the number of tensors its weight_map maps,
 * counted from its bytes before they are parsed (safetensors_index.h), so
 * that an index over a limit costs no more memory than its bytes (bytes the
 * count cannot follow and the parser still takes are asked about once
 * parsed). Nonzero stops the open, as check_file. */
typedef int (*wb_st_count_check)(void *arg, const char *index_path, uint64_t tensors, wb_err *err);

/* Asked about an index once it is parsed, with the number of distinct shard
 * files its weight_map names, before any of them is opened. Nonzero stops
 * the open, as check_file. */
typedef int (*wb_st_shards_check)(void *arg, const char *index_path, uint64_t shards, wb_err *err);

/* Values an index may hold besides its weight_map's entries: the root, the
 * map itself, the metadata (a few keys in any real index). More is refused
 * with WB_ELIMIT before the index is parsed. */
#define WB_ST_INDEX_MAX_OTHER 65536

typedef struct wb_st_open_opts {
    wb_st_file_check check_file;     /* may be NULL */
    void *arg;                       /* passed to each check */
    wb_st_header_check check_header; /* may be NULL */
    wb_st_count_check check_count;   /* may be NULL */
    wb_st_shards_check check_shards; /* may be NULL */
    /* 1: every shard of an index is opened and passed to check_file and
     * check_header (as wb__st_check_files does) before any header is read,
     * so that a refusal of any file comes before what reading the others
     * could report; each shard is then opened and judged again to be read. */
    int precheck;
} wb_st_open_opts;

/* wb__st_open with options (NULL: none). A shard whose directories lead out
 * of the index's directory through a symbolic link is refused with
 * WB_EPERM; a shard file that is itself a link to a regular file elsewhere
 * (a Hugging Face cache's snapshots/ into blobs/) is followed. */
int wb__st_open_ex(const char *path, const wb_st_open_opts *opts, wb_st_table **out, wb_err *err);

/* Opens every file wb__st_open_ex would (resolving the directory and the
 * index, refusing the same shard names) and passes each to opts->check_file
 * (and its header length, its index's tensor and shard counts, to
 * check_header, check_count and check_shards), but parses no safetensors
 * header. Each file is opened once and judged on that descriptor. Errors as
 * wb__st_open_ex. */
int wb__st_check_files(const char *path, const wb_st_open_opts *opts, wb_err *err);

#endif
