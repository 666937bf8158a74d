/* The printf conversions of the log's format reader (log_conv.h). Pure:
 * no I/O, no allocation. */
#include "log_conv.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* Reads the conversion at p (p[0] == '%', not "%%"). Returns 0, or -1 with
 * *why for what this logger does not read (printf may well). */
int wb__log_parse_conv(const char *p, conv *c, const char **why)
{
    const char *s = p + 1;
    while (*s && strchr("-+ #0'", *s))
        s++;
    if (*s == '*') {
        *why = "a * width";
        return -1;
    }
    long num = 0;
    while (*s >= '0' && *s <= '9') {
        if ((num = num * 10 + (*s++ - '0')) > NUMBER_MAX) {
            *why = "a width over 4096";
            return -1;
        }
    }
    if (*s == '$') {
        *why = "a positional argument";
        return -1;
    }
    c->prec = -1;
    if (*s == '.') {
        s++;
        if (*s == '*') {
            *why = "a * precision";
            return -1;
        }
        num = 0;
        while (*s >= '0' && *s <= '9') {
            if ((num = num * 10 + (*s++ - '0')) > NUMBER_MAX) {
                *why = "a precision over 4096";
                return -1;
            }
        }
        c->prec = (int)num;
    }
    c->plain = s == p + 1;
    static const struct {
        const char *s;
        int lm;
    } lengths[] = {{"hh", LM_HH}, {"ll", LM_LL}, {"h", LM_H}, {"l", LM_L},
                   {"j", LM_J},   {"z", LM_Z},   {"t", LM_T}, {"L", LM_BIG_L}};
    c->lm = LM_NONE;
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        size_t n = strlen(lengths[i].s);
        if (strncmp(s, lengths[i].s, n) == 0) {
            c->lm = lengths[i].lm;
            s += n;
            break;
        }
    }
    c->c = *s;
    c->len = (size_t)(s - p) + 1;
    if (*s == '\0') {
        *why = "a '%' at the end";
        return -1;
    }
    if (c->len > CONV_MAX) {
        *why = "a conversion longer than 31 characters";
        return -1;
    }
    static const argtype sints[] = {
        [LM_NONE] = AT_INT, [LM_HH] = AT_INT,   [LM_H] = AT_INT,   [LM_L] = AT_LONG,
        [LM_LL] = AT_LLONG, [LM_J] = AT_INTMAX, [LM_Z] = AT_SSIZE, [LM_T] = AT_PTRDIFF};
    static const argtype uints[] = {
        [LM_NONE] = AT_UINT, [LM_HH] = AT_UINT,   [LM_H] = AT_UINT, [LM_L] = AT_ULONG,
        [LM_LL] = AT_ULLONG, [LM_J] = AT_UINTMAX, [LM_Z] = AT_SIZE, [LM_T] = AT_PTRDIFF};
    switch (*s) {
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o':
        if (c->lm == LM_BIG_L) {
            *why = "L on an integer conversion";
            return -1;
        }
        c->at = *s == 'd' || *s == 'i' ? sints[c->lm] : uints[c->lm];
        return 0;
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G':
    case 'a':
    case 'A':
        if (c->lm != LM_NONE && c->lm != LM_L && c->lm != LM_BIG_L) {
            *why = "an integer length on a real conversion";
            return -1;
        }
        c->at = c->lm == LM_BIG_L ? AT_LDOUBLE : AT_DOUBLE;
        return 0;
    case 'c':
    case 's':
    case 'p':
        if (c->lm != LM_NONE) {
            *why = c->lm == LM_L ? "a wide character or string" : "a length on %c, %s or %p";
            return -1;
        }
        c->at = *s == 's' ? AT_STR : *s == 'p' ? AT_PTR : AT_INT;
        return 0;
    case 'n':
        *why = "%n";
        return -1;
    case 'm':
        *why = "%m";
        return -1;
    default:
        *why = "an unknown conversion";
        return -1;
    }
}

unsigned wb__log_arg_bit(argtype at)
{
    switch (at) {
    case AT_INT:
    case AT_UINT:
        return WB_LOG_ARG_INT;
    case AT_LONG:
    case AT_ULONG:
        return WB_LOG_ARG_LONG;
    case AT_LLONG:
    case AT_ULLONG:
        return WB_LOG_ARG_LLONG;
    case AT_SSIZE:
    case AT_SIZE:
    case AT_INTMAX:
    case AT_UINTMAX:
    case AT_PTRDIFF:
        return WB_LOG_ARG_SIZE;
    case AT_DOUBLE:
        return WB_LOG_ARG_DOUBLE;
    case AT_LDOUBLE:
        return WB_LOG_ARG_LDOUBLE;
    case AT_STR:
        return WB_LOG_ARG_STRING;
    case AT_PTR:
        return WB_LOG_ARG_POINTER;
    }
    return 0;
}

/* Takes the next argument as c's type, into both v.i and v.u for an
 * integer (as printf converts it: %hhd of 300 is 44). */
void wb__log_take(argsrc *src, const conv *c, value *v)
{
    memset(v, 0, sizeof *v);
    if (src->ap) {
        va_list *ap = src->ap;
        switch (c->at) {
        case AT_INT:
            v->i = va_arg(*ap, int);
            break;
        case AT_UINT:
            v->i = (long long)va_arg(*ap, unsigned);
            break;
        case AT_LONG:
            v->i = va_arg(*ap, long);
            break;
        case AT_ULONG:
            v->i = (long long)va_arg(*ap, unsigned long);
            break;
        case AT_LLONG:
            v->i = va_arg(*ap, long long);
            break;
        case AT_ULLONG:
            v->i = (long long)va_arg(*ap, unsigned long long);
            break;
        case AT_SSIZE:
            v->i = va_arg(*ap, ssize_t);
            break;
        case AT_SIZE:
            v->i = (long long)va_arg(*ap, size_t);
            break;
        case AT_INTMAX:
            v->i = va_arg(*ap, intmax_t);
            break;
        case AT_UINTMAX:
            v->i = (long long)va_arg(*ap, uintmax_t);
            break;
        case AT_PTRDIFF:
            v->i = va_arg(*ap, ptrdiff_t);
            break;
        case AT_DOUBLE:
            v->d = va_arg(*ap, double);
            break;
        case AT_LDOUBLE:
            v->d = va_arg(*ap, long double);
            break;
        case AT_STR:
            v->s = va_arg(*ap, const char *);
            break;
        case AT_PTR:
            v->p = va_arg(*ap, const void *);
            break;
        }
    } else {
        wb_log_arg a = {0};
        if (src->next < src->n)
            a = src->v[src->next];
        src->next++;
        v->i = a.i;
        v->d = a.d;
        v->s = a.s ? a.s : "";
        v->p = (const void *)(uintptr_t)a.i;
        /* As the argument would be in C: an int is an int. */
        switch (c->at) {
        case AT_INT:
            v->i = (int)v->i;
            break;
        case AT_UINT:
            v->i = (unsigned)v->i;
            break;
        case AT_LONG:
            v->i = (long)v->i;
            break;
        case AT_ULONG:
            v->i = (long long)(unsigned long)v->i;
            break;
        case AT_SSIZE:
            v->i = (ssize_t)v->i;
            break;
        case AT_SIZE:
            v->i = (long long)(size_t)v->i;
            break;
        case AT_PTRDIFF:
            v->i = (ptrdiff_t)v->i;
            break;
        case AT_DOUBLE:
            v->d = (double)v->d;
            break;
        default:
            break;
        }
    }
    /* The value printf prints. */
    if (c->lm == LM_HH)
        v->i = c->at == AT_INT ? (long long)(signed char)v->i : (long long)(unsigned char)v->i;
    else if (c->lm == LM_H)
        v->i = c->at == AT_INT ? (long long)(short)v->i : (long long)(unsigned short)v->i;
    else if (c->lm == LM_T && c->c != 'd' && c->c != 'i')
        v->i = (long long)(size_t)v->i;
    v->u = (unsigned long long)v->i;
}

/* Prints one conversion with its value as printf would, into dst (room
 * bytes, at least 1). Returns what snprintf returns. */
int wb__log_print_conv(char *dst, size_t room, const char *p, const conv *c, const value *v)
{
    char spec[CONV_MAX + 1];
    memcpy(spec, p, c->len);
    spec[c->len] = '\0';
    switch (c->at) {
    case AT_INT:
        return snprintf(dst, room, spec, (int)v->i);
    case AT_UINT:
        return snprintf(dst, room, spec, (unsigned)v->u);
    case AT_LONG:
        return snprintf(dst, room, spec, (long)v->i);
    case AT_ULONG:
        return snprintf(dst, room, spec, (unsigned long)v->u);
    case AT_LLONG:
        return snprintf(dst, room, spec, v->i);
    case AT_ULLONG:
        return snprintf(dst, room, spec, v->u);
    case AT_SSIZE:
        return snprintf(dst, room, spec, (ssize_t)v->i);
    case AT_SIZE:
        return snprintf(dst, room, spec, (size_t)v->u);
    case AT_INTMAX:
        return snprintf(dst, room, spec, (intmax_t)v->i);
    case AT_UINTMAX:
        return snprintf(dst, room, spec, (uintmax_t)v->u);
    case AT_PTRDIFF:
        return snprintf(dst, room, spec, (ptrdiff_t)v->i);
    case AT_DOUBLE:
        return snprintf(dst, room, spec, (double)v->d);
    case AT_LDOUBLE:
        return snprintf(dst, room, spec, v->d);
    case AT_STR:
        return snprintf(dst, room, spec, v->s);
    case AT_PTR:
        return snprintf(dst, room, spec, v->p);
    }
    return 0;
}
