#include "devlist.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void wb__gpu_uuid_format(const uint8_t b[16], char out[WB_GPU_UUID_SIZE])
{
    snprintf(out, WB_GPU_UUID_SIZE,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

int wb__gpu_uuid_valid(const char *s)
{
    if (!s || (strncmp(s, "GPU-", 4) != 0 && strncmp(s, "MIG-", 4) != 0))
        return 0;
    s += 4;
    static const int groups[] = {8, 4, 4, 4, 12};
    for (int g = 0; g < 5; g++) {
        for (int i = 0; i < groups[g]; i++, s++) {
            if (!isxdigit((unsigned char)*s))
                return 0;
        }
        if (g < 4 && *s++ != '-')
            return 0;
    }
    return *s == '\0';
}

const wb_gpu_dev *wb__devlist_find_uuid(const wb_gpu_list *l, const char *uuid)
{
    for (unsigned i = 0; uuid && i < l->n; i++) {
        if (strcasecmp(l->dev[i].uuid, uuid) == 0)
            return &l->dev[i];
    }
    return NULL;
}

const wb_gpu_dev *wb__devlist_find_index(const wb_gpu_list *l, int index)
{
    for (unsigned i = 0; i < l->n; i++) {
        if (l->dev[i].index == index)
            return &l->dev[i];
    }
    return NULL;
}

void wb__devlist_describe(const wb_gpu_list *l, char *buf, size_t size)
{
    size_t at = 0;
    if (size == 0)
        return;
    buf[0] = '\0';
    if (l->n == 0) {
        snprintf(buf, size, "none");
        return;
    }
    for (unsigned i = 0; i < l->n && at < size; i++) {
        int w = snprintf(buf + at, size - at, "%s%d=%s", i ? ", " : "", l->dev[i].index,
                         l->dev[i].uuid);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

void wb__devlist_describe_visible(const wb_gpu_list *l, char *buf, size_t size)
{
    wb__devlist_describe(l, buf, size);
    size_t at = strlen(buf);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (at < size)
        snprintf(buf + at, size - at, " (CUDA_VISIBLE_DEVICES=%s)", cvd ? cvd : "unset");
}

int wb__devlist_map(const wb_gpu_list *l, int their_index, const char *uuid, int *local,
                    wb_err *err)
{
    *local = -1;
    char seen[512];
    if (uuid && uuid[0]) {
        const wb_gpu_dev *d = wb__devlist_find_uuid(l, uuid);
        if (d) {
            *local = d->index;
            return WB_OK;
        }
        wb__devlist_describe_visible(l, seen, sizeof seen);
        return wb__err_set(err, WB_ENOGPU,
                           "device %s (the broker's device %d) is not visible in this process, "
                           "which sees: %s",
                           uuid, their_index, seen);
    }
    if (wb__devlist_find_index(l, their_index)) {
        *local = their_index;
        return WB_OK;
    }
    wb__devlist_describe(l, seen, sizeof seen);
    return wb__err_set(err, WB_ENOGPU,
                       "the broker's device %d (no UUID given) is not visible in this process, "
                       "which sees: %s",
                       their_index, seen);
}
