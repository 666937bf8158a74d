#include "subs.h"

#include "alloc.h"

#include <stdlib.h>
#include <string.h>

/* The index of `serial` in s->v, or where it would go. */
static size_t find(const wb_subs *s, uint64_t serial)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid]->serial < serial)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static wb_sub_conn *lookup(const wb_subs *s, uint64_t serial, size_t *at)
{
    size_t i = find(s, serial);
    if (at)
        *at = i;
    return i < s->n && s->v[i]->serial == serial ? s->v[i] : NULL;
}

int wb__subs_add(wb_subs *s, uint64_t serial, const char *name, wb_err *err)
{
    size_t at;
    wb_sub_conn *c = lookup(s, serial, &at);
    for (uint32_t k = 0; c && k < c->n; k++) {
        if (strcmp(c->names[k], name) == 0)
            return WB_OK;
    }
    if (c && c->n >= WB_MAX_SUBSCRIPTIONS)
        return wb__err_set(err, WB_ELIMIT,
                           "this connection is subscribed to %d models already, the most one "
                           "connection may be (unsubscribe from one first)",
                           WB_MAX_SUBSCRIPTIONS);
    char *copy = wb__strdup(name);
    if (!copy)
        return wb__err_set(err, WB_ENOMEM, "out of memory subscribing to '%s'", name);
    if (!c) {
        if (s->n == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 8;
            wb_sub_conn **v = wb__realloc(s->v, cap * sizeof *v);
            if (!v) {
                free(copy);
                return wb__err_set(err, WB_ENOMEM, "out of memory subscribing to '%s'", name);
            }
            s->v = v;
            s->cap = cap;
        }
        c = wb__calloc(1, sizeof *c);
        if (!c) {
            free(copy);
            return wb__err_set(err, WB_ENOMEM, "out of memory subscribing to '%s'", name);
        }
        c->serial = serial;
        memmove(&s->v[at + 1], &s->v[at], (s->n - at) * sizeof s->v[0]);
        s->v[at] = c;
        s->n++;
    }
    c->names[c->n++] = copy;
    return WB_OK;
}

static void remove_at(wb_subs *s, size_t at)
{
    wb_sub_conn *c = s->v[at];
    for (uint32_t k = 0; k < c->n; k++)
        free(c->names[k]);
    free(c);
    memmove(&s->v[at], &s->v[at + 1], (s->n - at - 1) * sizeof s->v[0]);
    s->n--;
}

int wb__subs_remove(wb_subs *s, uint64_t serial, const char *name)
{
    size_t at;
    wb_sub_conn *c = lookup(s, serial, &at);
    for (uint32_t k = 0; c && k < c->n; k++) {
        if (strcmp(c->names[k], name) != 0)
            continue;
        free(c->names[k]);
        c->names[k] = c->names[--c->n];
        if (c->n == 0)
            remove_at(s, at);
        return 1;
    }
    return 0;
}

void wb__subs_drop_conn(wb_subs *s, uint64_t serial)
{
    size_t at;
    if (lookup(s, serial, &at))
        remove_at(s, at);
}

const wb_sub_conn *wb__subs_of(const wb_subs *s, uint64_t serial)
{
    return lookup(s, serial, NULL);
}

void wb__subs_each(const wb_subs *s, const char *name, void (*fn)(void *ctx, uint64_t serial),
                   void *ctx)
{
    /* By serial, looked up again after each call: telling one connection
     * may close it (and drop its subscriptions) under the walk. */
    uint64_t next = 0;
    for (size_t i = find(s, next); i < s->n; i = find(s, next)) {
        const wb_sub_conn *c = s->v[i];
        uint64_t serial = c->serial;
        next = serial + 1;
        for (uint32_t k = 0; k < c->n; k++) {
            if (strcmp(c->names[k], name) == 0) {
                fn(ctx, serial);
                break;
            }
        }
        if (next == 0)
            break;
    }
}

size_t wb__subs_conns(const wb_subs *s)
{
    return s->n;
}

void wb__subs_destroy(wb_subs *s)
{
    while (s->n)
        remove_at(s, s->n - 1);
    free(s->v);
    memset(s, 0, sizeof *s);
}
