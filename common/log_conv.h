/* The printf conversions the log's format reader takes (log_fields.c):
 * reading one, taking its argument from a va_list or an array, and printing
 * it as printf would. Private to the logger. */
#ifndef WB_COMMON_LOG_CONV_H
#define WB_COMMON_LOG_CONV_H

#include "log_fields.h"

#include <stdarg.h>
#include <stddef.h>

/* The C type a conversion reads, as printf reads it. */
typedef enum argtype {
    AT_INT,
    AT_UINT,
    AT_LONG,
    AT_ULONG,
    AT_LLONG,
    AT_ULLONG,
    AT_SSIZE,
    AT_SIZE,
    AT_INTMAX,
    AT_UINTMAX,
    AT_PTRDIFF,
    AT_DOUBLE,
    AT_LDOUBLE,
    AT_STR,
    AT_PTR,
} argtype;

/* Length modifiers. */
enum { LM_NONE, LM_HH, LM_H, LM_L, LM_LL, LM_J, LM_Z, LM_T, LM_BIG_L };

/* Longer conversions (flags, width and precision together) are refused. */
#define CONV_MAX   31
#define NUMBER_MAX 4096

typedef struct conv {
    size_t len; /* from the '%' to the conversion character, inclusive */
    char c;
    int lm;
    int prec;  /* -1: none */
    int plain; /* no flag, width or precision */
    argtype at;
} conv;

/* Where the arguments come from: the caller's va_list or an array. */
typedef struct argsrc {
    va_list *ap;
    const wb_log_arg *v;
    size_t n, next;
} argsrc;

typedef struct value {
    long long i;
    unsigned long long u;
    long double d;
    const char *s;
    const void *p;
} value;

/* Reads the conversion at p (p[0] == '%', not "%%"). Returns 0, or -1 with
 * *why for what this logger does not read (printf may well). */
int wb__log_parse_conv(const char *p, conv *c, const char **why);

/* The WB_LOG_ARG_* bit of an argument type. */
unsigned wb__log_arg_bit(argtype at);

/* Takes the next argument as c's type, into both v.i and v.u for an
 * integer (as printf converts it: %hhd of 300 is 44). */
void wb__log_take(argsrc *src, const conv *c, value *v);

/* Prints one conversion with its value as printf would, into dst (room
 * bytes, at least 1). Returns what snprintf returns. */
int wb__log_print_conv(char *dst, size_t room, const char *p, const conv *c, const value *v);

#endif
