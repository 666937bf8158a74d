#include "placement.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The highest ordinal accepted; far above any node's device count. */
#define ORDINAL_MAX 1023

/* WB_EINVAL quoting the text and the 1-based position of the fault. */
static int fail(wb_err *err, const char *text, size_t len, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int fail(wb_err *err, const char *text, size_t len, size_t pos, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int shown = len > 200 ? 200 : (int)len;
    return wb__err_set(err, WB_EINVAL, "placement '%.*s%s': position %zu: %s", shown, text,
                       len > 200 ? "..." : "", pos + 1, msg);
}

/* An item of the text, quoted in messages at a bounded length. */
#define ITEM(p, n) (int)((n) > 60 ? 60 : (n)), (p)

int wb__placement_parse(const char *text, size_t len, wb_placement *out, wb_err *err)
{
    memset(out, 0, sizeof *out);
    const char *t = text ? text : "";
    if (len > WB_PLACEMENT_TEXT_MAX)
        return wb__err_set(err, WB_EINVAL, "placement of %zu characters: at most %d", len,
                           WB_PLACEMENT_TEXT_MAX);
    size_t at = 0;
    if (len && t[0] == '@')
        at = 1;
    if (at == len)
        return fail(err, t, len, at, "expected 'all', device ordinals or GPU UUIDs");
    if (len - at == 3 && memcmp(t + at, "all", 3) == 0) {
        out->all = 1;
        return WB_OK;
    }
    while (at <= len) {
        size_t end = at;
        while (end < len && t[end] != ',')
            end++;
        const char *item = t + at;
        size_t n = end - at;
        if (n == 0)
            return fail(err, t, len, at, "an empty item (two commas, or a comma at an end)");
        if (out->n == WB_PLACEMENT_MAX)
            return fail(err, t, len, at, "'%.*s': more than %d devices", ITEM(item, n),
                        WB_PLACEMENT_MAX);
        wb_placement_item *it = &out->items[out->n];
        if (item[0] >= '0' && item[0] <= '9') {
            for (size_t i = 0; i < n; i++) {
                if (item[i] < '0' || item[i] > '9')
                    return fail(err, t, len, at + i, "'%.*s' is not a device ordinal",
                                ITEM(item, n));
            }
            long v = 0;
            for (size_t i = 0; i < n; i++) {
                v = v * 10 + (item[i] - '0');
                if (v > ORDINAL_MAX)
                    return fail(err, t, len, at, "device ordinal '%.*s' is above %d", ITEM(item, n),
                                ORDINAL_MAX);
            }
            it->index = (int)v;
        } else if (!(n == 3 && memcmp(item, "all", 3) == 0)) {
            char u[WB_GPU_UUID_SIZE] = "";
            if (n < sizeof u) {
                memcpy(u, item, n);
                u[n] = '\0';
            }
            if (!wb__gpu_uuid_valid(u))
                return fail(err, t, len, at,
                            "'%.*s' is not a device ordinal, 'all' or a GPU UUID "
                            "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                            ITEM(item, n));
            it->index = -1;
            memcpy(it->uuid, u, n + 1);
        } else {
            return fail(err, t, len, at,
                        "'%.*s' is not a device ordinal or a GPU UUID ('all' stands alone)",
                        ITEM(item, n));
        }
        out->n++;
        at = end + 1;
    }
    return WB_OK;
}

int wb__placement_resolve(const wb_placement *p, const wb_gpu_list *devs, int *out, unsigned *n,
                          wb_err *err)
{
    *n = 0;
    char seen[512];
    if (p->all) {
        if (devs->n == 0)
            return wb__err_set(err, WB_ENOGPU, "placement 'all': this broker sees no device");
        for (unsigned i = 0; i < devs->n && i < WB_GPU_MAX; i++)
            out[(*n)++] = devs->dev[i].index;
        return WB_OK;
    }
    for (unsigned i = 0; i < p->n; i++) {
        const wb_placement_item *it = &p->items[i];
        const wb_gpu_dev *d = it->index >= 0 ? wb__devlist_find_index(devs, it->index)
                                             : wb__devlist_find_uuid(devs, it->uuid);
        if (!d) {
            wb__devlist_describe(devs, seen, sizeof seen);
            char what[WB_GPU_UUID_SIZE + 16];
            if (it->index >= 0)
                snprintf(what, sizeof what, "%d", it->index);
            else
                snprintf(what, sizeof what, "%s", it->uuid);
            return wb__err_set(err, WB_ENOGPU,
                               "placement names device %s, which this broker does "
                               "not see (it sees: %s)",
                               what, seen);
        }
        for (unsigned k = 0; k < *n; k++) {
            if (out[k] == d->index)
                return wb__err_set(err, WB_EINVAL, "placement names device %d (%s) twice", d->index,
                                   d->uuid);
        }
        out[(*n)++] = d->index;
    }
    return WB_OK;
}

void wb__placement_format(const wb_placement *p, char *buf, size_t size)
{
    if (size == 0)
        return;
    buf[0] = '\0';
    if (p->all) {
        snprintf(buf, size, "all");
        return;
    }
    size_t at = 0;
    for (unsigned i = 0; i < p->n && at < size; i++) {
        int w = p->items[i].index >= 0
                    ? snprintf(buf + at, size - at, "%s%d", i ? "," : "", p->items[i].index)
                    : snprintf(buf + at, size - at, "%s%s", i ? "," : "", p->items[i].uuid);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}
