/* The safetensors header parser: bytes in memory in, tensor table out, no
 * I/O. It is what the fuzzer drives; safetensors.h reads files and calls it.
 * Every error says which file, which tensor and what is wrong. */
#ifndef WB_SAFETENSORS_PARSE_H
#define WB_SAFETENSORS_PARSE_H

#include "err.h"
#include "safetensors_table.h"

#include <jansson.h>

#include <stddef.h>
#include <stdint.h>

/* Parses and validates one safetensors header held in memory and appends its
 * tensors and metadata to `table` as file number `file_index`.
 *
 * `buf` holds the first `len` bytes of the file (at least 8 + header length);
 * `file_size` is the size of the whole file, used to check that the data
 * offsets cover the data section exactly (no holes, no overlaps, no trailing
 * bytes). `display_name` names the file in error messages. It also records the
 * file: file_index may be n_files (a new file: files[] gets a copy of
 * display_name) or an existing one; file_sizes[] and data_starts[] are set. On
 * error returns WB_EFORMAT (or WB_ENOMEM) and leaves `table` unchanged. */
int wb__st_parse_header(wb_st_table *table, uint32_t file_index, const char *display_name,
                        const uint8_t *buf, size_t len, uint64_t file_size, wb_err *err);

/* Sets err to `code` with "FILE: what is wrong": every message of the parser
 * and the reader names the file first. Returns code. */
int wb__st_fail(wb_err *err, int code, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The 8-byte little-endian header length at the start of a file. */
uint64_t wb__st_load_le64(const uint8_t *p);

/* "an object", "a string", ... for messages about JSON values. */
const char *wb__st_json_kind(const json_t *v);

/* Whether json_loadb's answer *root (NULL or not) is to be dropped for
 * memory: an allocation of jansson's failed since wb__alloc_jansson_failures()
 * said `failures_before` (jansson reports most as a syntax error, and one in
 * its lexer's buffer it ignores, dropping a character from a string it goes
 * on to return), or jansson says so itself (its out-of-memory code, or no
 * error set at all: its lexer could not allocate). Frees and clears *root
 * then. */
int wb__st_json_nomem(json_t **root, const json_error_t *je, unsigned long failures_before);

#endif
