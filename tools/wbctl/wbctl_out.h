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

#define WBCTL_TABLE_MAX_COLS 32

/* A plain table: rows of strings, columns padded to their widest cell.
 * Every row holds every column; those the default view leaves out are
 * hidden when printed unless the table is wide. */
typedef struct wbctl_table {
    size_t ncols, nrows, cap;
    char **cells;
    int wide;        /* set before the header: print every column (-o wide) */
    uint32_t hidden; /* bit c: column c is not printed */
} wbctl_table;

/* One column: its header and whether only -o wide shows it. */
typedef struct wbctl_column {
    const char *name;
    int wide_only;
} wbctl_column;

/* Starts table t with columns cols[0..n) (at most WBCTL_TABLE_MAX_COLS):
 * sets ncols, hides the wide-only columns unless t->wide, and adds the
 * header row. */
void wbctl_table_columns(wbctl_table *t, const wbctl_column *cols, size_t n);
/* Adds a row of t->ncols strings (escaped copies). */
void wbctl_table_add(wbctl_table *t, ...);
/* Prints the rows, the columns not hidden padded to their widest cell, and
 * empties t. */
void wbctl_table_print(wbctl_table *t);

/* Sizes for people, in one unit family (IEC, powers of 1024): "512 B",
 * "1.5 KiB", "2.0 GiB", up to EiB. The tables, the stage line and the
 * progress bar all print sizes through this. Returns buf. */
const char *wbctl_fmt_size(char *buf, size_t size, uint64_t bytes);
/* A rate in bytes per second the same way: "1.5 GiB/s"; "0 B/s" for zero
 * or less (or not a number). Returns buf. */
const char *wbctl_fmt_rate(char *buf, size_t size, double bytes_per_second);
/* A broker's GB/s figure (10^9 bytes a second, as the protocol sends
 * rates) as wbctl_fmt_rate shows it. Returns buf. */
const char *wbctl_fmt_gbps(char *buf, size_t size, double gbps);

/* How every JSON document is dumped: indented, keys in insertion order,
 * and reals with 15 significant digits, which print what the value was
 * rounded to (0.1, not 0.10000000000000001). */
#define WBCTL_JSON_FLAGS (JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))

/* Seconds for JSON: durations and rates rounded to 6 decimals (a
 * microsecond), times since the epoch to 3 (a millisecond, which keeps
 * them within 15 digits). Numbers of bytes and counts stay integers. */
double wbctl_round_secs(double seconds);
double wbctl_round_time(double epoch_seconds);

/* A peer's string as a JSON string: exact when it is valid UTF-8. */
json_t *wbctl_jstr(const char *s);
/* Prints j (WBCTL_JSON_FLAGS) and drops it; 0, or 1 when out of memory (j
 * NULL included) or stdout could not be written (said on stderr). */
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

/* An age as "42s", "3m07s" or "2h05m00s". */
void wbctl_fmt_age(char *buf, size_t size, double seconds);
/* A holder's pid as shown: "1234", or "conn:N" for a holder the broker
 * knows by its descriptor channel session (its pid is hidden from the
 * broker: another pid namespace). Returns buf. */
const char *wbctl_fmt_pid(char *buf, size_t size, uint32_t pid);
/* Adds "pid" (the number as sent) and, for a session, "session": "conn:N". */
void wbctl_json_pid(json_t *o, uint32_t pid);

#endif
