/* libFuzzer target for the count of a shard index's entries made before the
 * index is parsed. Besides crashes, it traps when the count disagrees with
 * jansson on a text jansson accepts: every such text is counted, the
 * weight_map's entries are the size of the parsed map and the other values
 * all the rest. */
#include "safetensors_index.h"

#include <jansson.h>

#include <stdint.h>
#include <stdlib.h>

#define MAX_INPUT (1u << 20)

/* Values in a parsed document, itself included. */
static uint64_t values(const json_t *v)
{
    uint64_t n = 1;
    if (json_is_object(v)) {
        const char *k;
        json_t *m;
        json_object_foreach((json_t *)v, k, m)
        {
            n += values(m);
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            n += values(json_array_get(v, i));
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MAX_INPUT)
        return 0;
    wb_st_index_count n;
    int rc = wb__st_index_count((const char *)data, size, &n);
    json_error_t je;
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return 0;
    if (rc != 0)
        __builtin_trap();
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    uint64_t map = json_is_object(wm) ? json_object_size(wm) : 0;
    if (n.map_entries != map || n.other_values != values(root) - map)
        __builtin_trap();
    json_decref(root);
    return 0;
}
