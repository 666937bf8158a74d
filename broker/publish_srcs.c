/* The source cache (publish_srcs.h). */
#include "publish_srcs.h"

#include "alloc.h"

#include <stdlib.h>
#include <string.h>

typedef struct cached_src {
    uint8_t handle[WB_SRC_HANDLE_LEN];
    int device;
    void *ptr;
    int used; /* named by the commit in progress */
} cached_src;

struct wb_src_cache {
    wb_src_ops ops;
    uint64_t owner; /* the connection whose handles these are */
    cached_src *e;
    size_t n, cap;
    uint64_t opened, found;
    void *kept;
};

wb_src_cache *wb__src_cache_new(const wb_src_ops *ops)
{
    wb_src_cache *c = wb__calloc(1, sizeof *c);
    if (c)
        c->ops = *ops;
    return c;
}

/* Closes the entries the commit in progress did not use (all with all). */
static void close_unused(wb_src_cache *c, int all)
{
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->e[i].used && !all) {
            c->e[i].used = 0;
            c->e[k++] = c->e[i];
            continue;
        }
        c->ops.close(c->ops.ctx, c->e[i].ptr, c->e[i].device);
    }
    c->n = k;
}

void wb__src_cache_set_ctx(wb_src_cache *c, void *ctx)
{
    c->ops.ctx = ctx;
}

void wb__src_cache_free(wb_src_cache **cp)
{
    wb_src_cache *c = cp ? *cp : NULL;
    if (!c)
        return;
    close_unused(c, 1);
    if (c->kept && c->ops.free_kept)
        c->ops.free_kept(c->kept);
    free(c->e);
    free(c);
    *cp = NULL;
}

void **wb__src_cache_kept(wb_src_cache *c)
{
    return &c->kept;
}

void wb__src_cache_begin(wb_src_cache *c, uint64_t owner)
{
    if (c->owner != owner)
        close_unused(c, 1);
    c->owner = owner;
}

int wb__src_cache_open(wb_src_cache *c, const uint8_t *handle, int device, unsigned index,
                       void **ptr, wb_err *err)
{
    for (size_t k = 0; k < c->n; k++) {
        if (c->e[k].device == device && memcmp(c->e[k].handle, handle, WB_SRC_HANDLE_LEN) == 0) {
            c->e[k].used = 1;
            c->found++;
            *ptr = c->e[k].ptr;
            return WB_OK;
        }
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        cached_src *n = wb__realloc(c->e, cap * sizeof *n);
        if (!n)
            return wb__err_set(err, WB_ENOMEM, "out of memory opening source %u", index);
        c->e = n;
        c->cap = cap;
    }
    int rc = c->ops.open(c->ops.ctx, handle, device, index, ptr, err);
    if (rc != WB_OK) {
        *ptr = NULL;
        return rc;
    }
    cached_src *n = &c->e[c->n++];
    memcpy(n->handle, handle, WB_SRC_HANDLE_LEN);
    n->device = device;
    n->ptr = *ptr;
    n->used = 1;
    c->opened++;
    return WB_OK;
}

void wb__src_cache_end(wb_src_cache *c, int failed)
{
    close_unused(c, failed);
}

size_t wb__src_cache_forget(wb_src_cache *c, uint64_t owner)
{
    if (c->owner != owner)
        return 0;
    size_t n = c->n;
    close_unused(c, 1);
    return n;
}

void wb__src_cache_counts(const wb_src_cache *c, uint64_t *opened, uint64_t *found, size_t *open)
{
    *opened = c->opened;
    *found = c->found;
    *open = c->n;
}
