/* The log's format reader. A log call's format says each field's key and
 * type (key=%llu, key=%s, ...); one walk over the format and the arguments
 * together gives the tail exactly as vsnprintf writes it and, beside it,
 * the fields: key, type, and where the value's text lies (log.h writes the
 * text or the JSON line from them). Pure: no I/O, no allocation. How
 * formats map to JSON types is in log.h. */
#ifndef WB_LOG_FIELDS_H
#define WB_LOG_FIELDS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* The most fields one line keeps for JSON (more are dropped, with
 * "truncated":true; the text keeps them), and the size of its key=value
 * text. */
#define WB_LOG_MAX_FIELDS 64
#define WB_LOG_TEXT_SIZE  4096

typedef enum wb_log_type {
    WB_LOG_STRING = 0, /* a JSON string */
    WB_LOG_INT,        /* a JSON number: v.i */
    WB_LOG_UINT,       /* a JSON number: v.u */
    WB_LOG_REAL,       /* a JSON number: v.d printed as %.<prec><conv>, null if not finite */
    WB_LOG_FIELDS,     /* optional fields: the text's key=value pairs, as strings */
    WB_LOG_WORD,       /* a word outside key=value, for "text" */
} wb_log_type;

/* One field: its key (in the format), its value's text as the text format
 * writes it (in wb_log_fields.text) and, for a number, the value itself. */
typedef struct wb_log_field {
    const char *key; /* NULL for WB_LOG_FIELDS and WB_LOG_WORD */
    uint16_t klen;
    uint8_t type;   /* wb_log_type */
    uint8_t quoted; /* a string whose text is quoted as wb__log_quote does */
    char conv;      /* a real's conversion: f F e E g G */
    int prec;       /* a real's precision (-1: the default) */
    uint32_t off, len;
    union {
        long long i;
        unsigned long long u;
        long double d;
    } v;
} wb_log_field;

/* The argument types a format took (wb_log_fields.arg_types). */
enum {
    WB_LOG_ARG_INT = 1u << 0, /* int and unsigned: d i u x X o c, with hh or h */
    WB_LOG_ARG_LONG = 1u << 1,
    WB_LOG_ARG_LLONG = 1u << 2,
    WB_LOG_ARG_SIZE = 1u << 3, /* z, j and t */
    WB_LOG_ARG_DOUBLE = 1u << 4,
    WB_LOG_ARG_LDOUBLE = 1u << 5,
    WB_LOG_ARG_STRING = 1u << 6,
    WB_LOG_ARG_POINTER = 1u << 7,
};

/* One line's fields, read once from its format and arguments; both formats
 * are written from it. About 7 KiB: meant for the stack. */
typedef struct wb_log_fields {
    char text[WB_LOG_TEXT_SIZE]; /* the key=value tail, as the text format writes it */
    size_t len;
    int has_tail;       /* the format was not empty (the text line gets a space) */
    int dropped;        /* fields lost to WB_LOG_MAX_FIELDS or to text's size */
    int cut;            /* text is full: the rest of the format was not read */
    int refused;        /* the format was not one wb__log_format_check accepts
                         * at all: the whole tail is one word */
    unsigned arg_types; /* WB_LOG_ARG_* of the arguments taken */
    unsigned n_args;
    unsigned n;
    wb_log_field f[WB_LOG_MAX_FIELDS];
} wb_log_fields;

/* Reads fmt and its arguments into f. The tail's text is what vsnprintf
 * writes for them, byte for byte (cut to WB_LOG_TEXT_SIZE - 1). */
void wb__log_vfields(wb_log_fields *f, const char *fmt, va_list ap);

/* An argument for wb__log_afields: the member its conversion reads (every
 * integer type and %p from i, every real from d, %s from s; NULL reads as
 * ""). Arguments past n read as zero. */
typedef struct wb_log_arg {
    long long i;
    long double d;
    const char *s;
} wb_log_arg;

/* wb__log_vfields with the arguments from an array, for the fuzzer. A
 * format that is refused is kept unformatted. */
void wb__log_afields(wb_log_fields *f, const char *fmt, const wb_log_arg *args, size_t n);

/* 0 when fmt is a format this logger reads as intended: every conversion
 * one it supports, inside a key=value pair or as optional fields; keys of
 * [A-Za-z0-9_.-], none twice, none of ts level prog event text truncated;
 * quotes closed; at most WB_LOG_MAX_FIELDS fields. Otherwise -1, with why
 * in `why` (always NUL-terminated). With `fields`, its fields are recorded
 * there (keys and types, no text): the types that fmt gives its keys. */
int wb__log_format_check(const char *fmt, wb_log_fields *fields, char *why, size_t size);

/* 1 when s[0..n) is a key as the check wants them: [A-Za-z0-9_.-]+. */
int wb__log_is_key(const char *s, size_t n);

/* 1 when s[0..n) is one value quoted as wb__log_quote (log.h) quotes:
 * "...", with every inner quote escaped. */
int wb__log_is_quoted(const char *s, size_t n);

#endif
