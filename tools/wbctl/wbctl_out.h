/* wbctl's output: a padded table for people or JSON for programs, and the
 * small formats both use. Whatever a peer chose (process names, paths) is
 * escaped before it reaches a terminal. */
#ifndef WBCTL_OUT_H
#define WBCTL_OUT_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* A plain table: rows of strings, columns padded to their widest cell. */
typedef struct wbctl_table {
    size_t ncols, nrows, cap;
    char **cells;
} wbctl_table;

/* Adds a row of t->ncols strings (escaped copies). */
void wbctl_table_add(wbctl_table *t, ...);
/* Prints the rows, columns padded to their widest cell, and empties t. */
void wbctl_table_print(wbctl_table *t);

/* A peer's string as a JSON string: exact when it is valid UTF-8. */
json_t *wbctl_jstr(const char *s);
/* Prints j (indented) and drops it; 0, or 1 when out of memory (j NULL
 * included) or stdout could not be written (said on stderr). */
int wbctl_print_json(json_t *j);

/* A JSON array built one element at a time: the bytes wbctl_print_json
 * prints for the whole array, without every element's tree alive at once
 * (5,000 leases are some 150,000 jansson values, and building, dumping and
 * freeing them as one tree was most of `wbctl leases --json`). Each element
 * is dumped by jansson as it comes, into the document, and dropped; the
 * document is printed at the end, whole or not at all. */
typedef struct wbctl_json_array {
    json_t *wrap; /* [element]: dumped, it is the element as indented in the array */
    char *out;    /* the document so far */
    size_t len, cap;
    size_t n;   /* elements added */
    int failed; /* out of memory (or an element was NULL): print nothing */
} wbctl_json_array;

/* Starts an empty array. */
void wbctl_json_array_init(wbctl_json_array *a);
/* Appends element j (NULL counts as out of memory) and drops it. */
void wbctl_json_array_add(wbctl_json_array *a, json_t *j);
/* Prints the array on f and frees a: 0, or 1 when out of memory or f
 * could not be written (said on stderr). */
int wbctl_json_array_print(wbctl_json_array *a, FILE *f);

/* One field of a row: its key, its type and this row's value. */
typedef enum wbctl_jtype {
    WBCTL_JSTR,  /* v.s, a peer's string as wbctl_jstr makes it (NULL: "") */
    WBCTL_JINT,  /* v.i */
    WBCTL_JREAL, /* v.d; left out when not finite (jansson has no NaN) */
    WBCTL_JNEW,  /* v.j, a value the row takes over (NULL: out of memory) */
} wbctl_jtype;

typedef struct wbctl_jfield {
    const char *key;
    wbctl_jtype type;
    int absent; /* left out of this row */
    union {
        const char *s;
        json_int_t i;
        double d;
        json_t *j;
    } v;
} wbctl_jfield;

/* One JSON object reused from row to row of a listing: the keys are made
 * once and the values set in place, numbers without allocating and a
 * string only when it differs from the last row's. A fresh object per row
 * allocated and freed some 30 jansson values, a fifth of the CPU that
 * printing 5,000 leases took. The object is rebuilt when the set of keys
 * present changes. */
typedef struct wbctl_jrow {
    json_t *o;
    size_t n;
    json_t **vals;          /* o's values by field; NULL where absent */
    unsigned char *present; /* the fields o has */
} wbctl_jrow;

/* The row for fields f[0..n) (the same keys in the same order on every
 * call), as jansson would build it from scratch: a new reference to the
 * object r keeps, whose values the next call overwrites. NULL when out of
 * memory. */
json_t *wbctl_jrow_set(wbctl_jrow *r, const wbctl_jfield *f, size_t n);
/* Drops r's object. */
void wbctl_jrow_free(wbctl_jrow *r);

/* The time now, in seconds since the epoch. */
double wbctl_now(void);
/* An age as "42s", "3m07s" or "2h05m00s". */
void wbctl_fmt_age(char *buf, size_t size, double seconds);
/* A holder's pid as shown: "1234", or "conn:N" for a holder the broker
 * knows by its descriptor channel session (its pid is hidden from the
 * broker: another pid namespace). Returns buf. */
const char *wbctl_fmt_pid(char *buf, size_t size, uint32_t pid);
/* Adds "pid" (the number as sent) and, for a session, "session": "conn:N". */
void wbctl_json_pid(json_t *o, uint32_t pid);
/* Bytes as lower-case hex, cut to fit `size`. */
void wbctl_hex(const ProtobufCBinaryData *b, char *out, size_t size);

#endif
