/* A shard index's entries, counted from its bytes before they are parsed:
 * parsing builds a tree of some 170 bytes per entry (a 51 MB index of 1.5
 * million entries took 325 MB at its peak), so the reader judges the counts
 * against its limits first. Pure: bytes in, counts out, no allocation; fuzzed. */
#ifndef WB_SAFETENSORS_INDEX_H
#define WB_SAFETENSORS_INDEX_H

#include <stddef.h>
#include <stdint.h>

/* Deepest nesting the count follows; jansson refuses beyond 2048. */
#define WB_ST_INDEX_MAX_DEPTH 4096

typedef struct wb_st_index_count {
    /* Members of the root object's "weight_map" objects (summed, should
     * the key repeat). */
    uint64_t map_entries;
    /* Every other JSON value: the root, the weight_map object itself, the
     * metadata and its members, anything nested inside a map's entries. */
    uint64_t other_values;
} wb_st_index_count;

/* Counts the values of the JSON text in buf[0, len) in one pass. Returns 0,
 * or -1 when the bytes are not JSON whose structure the count can follow (an
 * unterminated string, unbalanced brackets, a stray token, nesting deeper than
 * WB_ST_INDEX_MAX_DEPTH): the parser then says what is wrong. For any text
 * jansson's json_loadb accepts with JSON_REJECT_DUPLICATES, 0 is returned,
 * map_entries is the size of the root's "weight_map" object (0 when there is
 * none, or it is not an object) and other_values the number of every other
 * value in the document. Keys are compared after their escapes are decoded
 * ("weight\u005fmap" is the map too). */
int wb__st_index_count(const char *buf, size_t len, wb_st_index_count *out);

#endif
