/* The compact tensor table that a lease reply carries instead of one
 * Tensor message per tensor (Lease.tensor_table, a reply's second frame,
 * or a shared memory object): packed by the broker once per model, checked
 * by the client against the lease's slabs, read in place. */
#ifndef WB_TENSOR_TABLE_H
#define WB_TENSOR_TABLE_H

#include "err.h"
#include "wb.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* The compact tensor table (Lease.tensor_table), in the host's byte order
 * (broker and clients share one machine):
 *   header, 16 bytes: u32 magic WB_TABLE_MAGIC, u32 tensors, u32 dims (in
 *     all), u32 string bytes;
 *   one record of 40 bytes per tensor: u64 offset, u64 nbytes, u64 xxh3,
 *     u32 name, u32 dtype (byte offsets into the strings; equal dtypes
 *     share one string), u32 first dim (index into the dims), u16 ndim,
 *     u16 slab;
 *   the dims, u64 each;
 *   the strings, each ending with a NUL (the last byte is one).
 * The length is exactly the sum. Records, dims and the strings are 8-byte
 * aligned when the table is. */
#define WB_TABLE_MAGIC  0x31544257u /* "WBT1" */
#define WB_TABLE_HEADER 16u
#define WB_TABLE_RECORD 40u

/* The most bytes a table published in shared memory may have
 * (Lease.tensor_table_slab): what a client maps before checking it. */
#define WB_TABLE_MAX_SHARED (4ull << 30)

typedef struct wb_table_tensor {
    uint64_t offset, nbytes, xxh3;
    uint32_t name, dtype, dim;
    uint16_t ndim, slab;
} wb_table_tensor;

/* The table of n tensors given as wire messages, in a new malloc'd buffer
 * of *len bytes; NULL when out of memory, over 4 GiB, or a slab index or
 * a dimension count does not fit 16 bits. */
uint8_t *wb__tensor_table_pack(Wbproto__Tensor *const *tensors, size_t n, size_t *len);

/* Checks a table against the lease's slabs: layout, every name non-empty,
 * dtype present, at most 64 dims, every tensor inside its slab. Called by
 * wb__reply_decode for an acquire reply; WB_EPROTO naming the tensor. */
int wb__tensor_table_check(const uint8_t *table, size_t len, Wbproto__Slab *const *slabs,
                           size_t n_slabs, wb_err *err);

/* Tensors in a checked table. */
uint32_t wb__tensor_table_count(const uint8_t *table);
/* XXH3-128 of a table's bytes, in canonical (big-endian) order: how broker
 * and client tell whether the client already holds a model's table
 * (AcquireRequest.tensor_table_digest). */
void wb__tensor_table_digest(const uint8_t *table, size_t len, uint8_t out[16]);
/* Record i of a checked table, and where its strings and dims start. */
void wb__tensor_table_get(const uint8_t *table, uint32_t i, wb_table_tensor *out);
const char *wb__tensor_table_strings(const uint8_t *table);
const uint64_t *wb__tensor_table_dims(const uint8_t *table);

#endif
