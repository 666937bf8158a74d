#include "arena.h"

#include "alloc.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *wb__arena_alloc(wb_arena *a, size_t n)
{
    if (n > SIZE_MAX - sizeof(wb_arena_block))
        return NULL;
    wb_arena_block *blk = wb__calloc(1, sizeof *blk + n);
    if (!blk)
        return NULL;
    blk->next = a->head;
    a->head = blk;
    return blk->data;
}

char *wb__arena_strdup(wb_arena *a, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = wb__arena_alloc(a, n);
    if (p)
        memcpy(p, s, n);
    return p;
}

char *wb__arena_printf(wb_arena *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = wb__arena_alloc(a, (size_t)n + 1);
    if (!p)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void wb__arena_free(wb_arena *a)
{
    wb_arena_block *blk = a->head;
    while (blk) {
        wb_arena_block *next = blk->next;
        free(blk);
        blk = next;
    }
    a->head = NULL;
}
