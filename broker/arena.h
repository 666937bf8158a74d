/* A reply's memory: zeroed blocks handed out one by one and freed at once.
 * The request handlers (ops.h) build each reply in one. */
#ifndef WB_BROKER_ARENA_H
#define WB_BROKER_ARENA_H

#include <stddef.h>

typedef struct wb_arena_block {
    struct wb_arena_block *next;
    max_align_t data[];
} wb_arena_block;

typedef struct wb_arena {
    wb_arena_block *head;
} wb_arena;

/* Zeroed memory that lives until wb__arena_free; NULL when out of memory. */
void *wb__arena_alloc(wb_arena *a, size_t n);
char *wb__arena_strdup(wb_arena *a, const char *s);
char *wb__arena_printf(wb_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void wb__arena_free(wb_arena *a);

#endif
