/* A memo of parsed safetensors headers. A broker opens the same checkpoint
 * again and again (a reload after an unload, an evicted model brought back
 * from its files), and jansson's parse is most of an open: 0.5 ms for a
 * header of 256 tensors on the development VM, 1-1.4 ms on the GPU host,
 * all of it before the first byte of the tensors is read. The memo is
 * keyed by the header's bytes themselves, compared in full (its XXH3 only
 * finds the candidate), so a hit gives exactly what parsing those bytes
 * gives; what depends on the file beyond its header (its size, the data
 * offsets against it, names taken by other shards) is checked again on
 * every open. Off unless a process turns it on; thread-safe. */
#ifndef WB_SAFETENSORS_MEMO_H
#define WB_SAFETENSORS_MEMO_H

#include "safetensors_table.h"

#include <jansson.h>

#include <stddef.h>
#include <stdint.h>

/* One tensor of a header, validated, before it joins a table; begin and end
 * are its data_offsets. */
typedef struct wb_st_pending {
    char *name;
    wb_dtype dtype;
    uint32_t ndim;
    uint64_t *shape;
    uint64_t begin, end;
} wb_st_pending;

typedef struct wb_st_pending_meta {
    char *key;
    char *value;
} wb_st_pending_meta;

void wb__st_pending_free(wb_st_pending *p, size_t n, wb_st_pending_meta *m, size_t nm);

/* What wbrokerd keeps: a header of 1,000 tensors takes about 0.2 MB. */
#define WB_ST_MEMO_BROKER_BYTES (16u << 20)

/* Keeps up to max_bytes of headers and their entries (the oldest used go
 * first); 0 turns the memo off and empties it. */
void wb__st_memo_set_limit(size_t max_bytes);

/* The entries parsed from the JSON header hdr[0..n): on a hit, fresh copies
 * in *p, *np, *m, *nm (the caller's to free) and 1; 0 on a miss or with the
 * memo off; -1 when the copies could not be allocated. */
int wb__st_memo_get(const uint8_t *hdr, size_t n, wb_st_pending **p, size_t *np,
                    wb_st_pending_meta **m, size_t *nm);

/* Keeps copies of a header's bytes and of the entries parsed from them, when
 * the memo is on and they fit; nothing is said when they cannot be kept. */
void wb__st_memo_put(const uint8_t *hdr, size_t n, const wb_st_pending *p, size_t np,
                     const wb_st_pending_meta *m, size_t nm);

/* Shard indexes (model.safetensors.index.json) are kept the same way, apart
 * from headers: the tree jansson parsed from the index's bytes, shared (the
 * memo and every open hold a reference; nobody modifies it), and what
 * wb__st_index_count found in them (counted: 0 when it could not follow
 * them). A hit gives *root a new reference (the caller's to json_decref)
 * and returns 1; 0 on a miss or with the memo off. */
int wb__st_memo_get_index(const char *buf, size_t n, json_t **root, int *counted,
                          uint64_t *map_entries);
/* Keeps a copy of an index's bytes and a reference to its tree (the tree of
 * an index that opened; one that failed is not kept). values: the JSON
 * values the tree holds, what its size is judged by. */
void wb__st_memo_put_index(const char *buf, size_t n, json_t *root, int counted,
                           uint64_t map_entries, uint64_t values);

typedef struct wb_st_memo_stats {
    uint64_t hits, misses;
    size_t entries, bytes;
} wb_st_memo_stats;

void wb__st_memo_stats(wb_st_memo_stats *out);

/* Tests: every header gets this digest (0: the real one), so that two
 * different headers meet in one candidate. */
void wb__st_memo_test_fixed_digest(uint64_t digest);

#endif
