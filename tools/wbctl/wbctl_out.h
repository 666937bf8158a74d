/* wbctl's output: a padded table for people or JSON for programs, and the
 * small formats both use. Whatever a peer chose (process names, paths) is
 * escaped before it reaches a terminal. */
#ifndef WBCTL_OUT_H
#define WBCTL_OUT_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
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
 * included). */
int wbctl_print_json(json_t *j);

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
