/* The log's format reader: a printf format of key=value pairs and its
 * arguments become the text vsnprintf would write and the typed fields
 * both log formats are written from (log_fields.h). Pure: no I/O, no
 * allocation; fuzzed (tests/fuzz/fuzz_log.c). */
#include "log_fields.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

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

/* Reads the conversion at p (p[0] == '%', not "%%"). Returns 0, or -1 with
 * *why for what this logger does not read (printf may well). */
static int parse_conv(const char *p, conv *c, const char **why)
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

static unsigned arg_bit(argtype at)
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
static void take(argsrc *src, const conv *c, value *v)
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
static int print_conv(char *dst, size_t room, const char *p, const conv *c, const value *v)
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

/* One walk over a format: with src, it prints the tail into f->text and
 * records the fields; without, it only records them (a check). Both walks
 * are this code, so the check and the logger cannot disagree. */
typedef struct walker {
    wb_log_fields *f;
    argsrc *src;
    int full;   /* f->text is full: the walk stops */
    int strict; /* record the first problem */
    const char *fmt;
    char *why;
    size_t why_size;
    int problems;
} walker;

__attribute__((format(printf, 3, 4))) static void problem(walker *w, const char *at,
                                                          const char *fmt, ...)
{
    if (!w->strict || w->problems++)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(w->why, w->why_size, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < w->why_size)
        snprintf(w->why + n, w->why_size - (size_t)n, " (at offset %td)", at - w->fmt);
}

static void put(walker *w, const char *s, size_t n)
{
    wb_log_fields *f = w->f;
    if (!w->src || w->full)
        return;
    size_t room = sizeof f->text - 1 - f->len;
    if (n > room) {
        n = room;
        w->full = f->cut = f->dropped = 1;
    }
    memcpy(f->text + f->len, s, n);
    f->len += n;
    f->text[f->len] = '\0';
}

/* Writes u in decimal at the end of buf[24]; returns where it starts. */
static char *decimal(char *end, unsigned long long u)
{
    do
        *--end = (char)('0' + u % 10);
    while (u /= 10);
    return end;
}

/* Takes and prints the conversion at p; returns its value in *v. */
static void put_conv(walker *w, const char *p, const conv *c, value *v)
{
    wb_log_fields *f = w->f;
    if (!w->src) {
        memset(v, 0, sizeof *v);
        return;
    }
    take(w->src, c, v);
    f->arg_types |= arg_bit(c->at);
    f->n_args++;
    if (w->full)
        return;
    /* Most call sites' conversions, without snprintf: %d %u %s as glibc
     * writes them (a NULL string as "(null)"). */
    if (c->plain && (c->c == 'd' || c->c == 'i' || c->c == 'u')) {
        char buf[24], *end = buf + sizeof buf, *start;
        if (c->c == 'u' || v->i >= 0) {
            start = decimal(end, c->c == 'u' ? v->u : (unsigned long long)v->i);
        } else {
            start = decimal(end, 0 - (unsigned long long)v->i);
            *--start = '-';
        }
        put(w, start, (size_t)(end - start));
        return;
    }
    if (c->plain && c->c == 's') {
        const char *str = v->s ? v->s : "(null)";
        put(w, str, strlen(str));
        return;
    }
    size_t room = sizeof f->text - f->len;
    int n = print_conv(f->text + f->len, room, p, c, v);
    if (n < 0) {
        f->text[f->len] = '\0';
        return;
    }
    if ((size_t)n >= room) {
        n = (int)(room - 1);
        w->full = f->cut = f->dropped = 1;
    }
    f->len += (size_t)n;
}

int wb__log_is_key(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return n > 0;
}

/* Opens a field at the text's current end; NULL past WB_LOG_MAX_FIELDS. */
static wb_log_field *field_open(walker *w, const char *at, wb_log_type type, const char *key,
                                size_t klen)
{
    wb_log_fields *f = w->f;
    if (w->strict && key) {
        static const char *const reserved[] = {"ts", "level", "prog", "event", "text", "truncated"};
        if (!wb__log_is_key(key, klen))
            problem(w, at, "key '%.*s' has a character outside [A-Za-z0-9_.-]", (int)klen, key);
        for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++) {
            if (strlen(reserved[i]) == klen && memcmp(reserved[i], key, klen) == 0)
                problem(w, at, "key '%.*s' is one of the fixed fields", (int)klen, key);
        }
        for (unsigned i = 0; i < f->n; i++) {
            if (f->f[i].key && f->f[i].klen == klen && memcmp(f->f[i].key, key, klen) == 0)
                problem(w, at, "key '%.*s' twice", (int)klen, key);
        }
    }
    if (f->n >= WB_LOG_MAX_FIELDS) {
        problem(w, at, "more than %d fields", WB_LOG_MAX_FIELDS);
        f->dropped = 1;
        return NULL;
    }
    wb_log_field *fd = &f->f[f->n++];
    memset(fd, 0, sizeof *fd);
    fd->key = key;
    fd->klen = (uint16_t)(klen > UINT16_MAX ? UINT16_MAX : klen);
    fd->type = (uint8_t)type;
    fd->prec = -1;
    fd->off = (uint32_t)f->len;
    return fd;
}

/* Closes the field opened last. One that the text's end cut is dropped: a
 * number cut short would be another number. */
static void field_close(walker *w, wb_log_field *fd)
{
    if (!fd)
        return;
    fd->len = (uint32_t)(w->f->len - fd->off);
    if (w->full) {
        w->f->n--;
        w->f->dropped = 1;
    }
}

int wb__log_is_quoted(const char *s, size_t n)
{
    if (n < 2 || s[0] != '"' || s[n - 1] != '"')
        return 0;
    size_t i = 1;
    while (i < n - 1) {
        if (s[i] == '\\')
            i += 2;
        else if (s[i] == '"')
            return 0;
        else
            i++;
    }
    return i == n - 1;
}

/* Reads optional fields or a stray word: the rest of the word at p. */
static const char *walk_word(walker *w, const char *p, const char *word, wb_log_type type)
{
    wb_log_field *fd = field_open(w, p, type, NULL, 0);
    int in_q = 0, pieces = 0;
    while (*p && (in_q || *p != ' ') && !w->full) {
        if (type == WB_LOG_FIELDS && pieces++ == 1)
            problem(w, p, "optional fields (%%s) must end their word");
        if (p[0] == '%' && p[1] == '%') {
            put(w, "%", 1);
            p += 2;
        } else if (*p == '%') {
            conv c;
            value v;
            const char *why;
            if (parse_conv(p, &c, &why) != 0)
                break; /* not reached: the format was scanned first */
            if (type == WB_LOG_WORD)
                problem(w, p, "a conversion outside key=value in '%.*s'", (int)strcspn(word, " "),
                        word);
            put_conv(w, p, &c, &v);
            p += c.len;
        } else if (*p == '"' || *p == '\\') {
            if (*p == '"')
                in_q = !in_q;
            else if (in_q && (p[1] == '"' || p[1] == '\\'))
                put(w, p++, 1);
            put(w, p++, 1);
        } else {
            size_t run = strcspn(p + 1, " %\"\\") + 1;
            put(w, p, run);
            p += run;
        }
    }
    if (in_q)
        problem(w, word, "an unclosed quote");
    field_close(w, fd);
    return p;
}

/* Reads key=value at p, the key klen bytes long. */
static const char *walk_pair(walker *w, const char *p, size_t klen)
{
    const char *key = p;
    put(w, p, klen + 1);
    p += klen + 1;
    wb_log_field *fd = field_open(w, key, WB_LOG_STRING, key, klen);
    size_t pieces = 0, convs = 0, closed_at = 0;
    int in_q = 0, opened_first = 0, after_conv = 0;
    conv first = {0};
    value fv = {0};
    while (*p && (in_q || *p != ' ') && !w->full) {
        int is_conv = 0;
        if (p[0] == '%' && p[1] == '%') {
            put(w, "%", 1);
            p += 2;
        } else if (*p == '%') {
            conv c;
            const char *why;
            if (parse_conv(p, &c, &why) != 0)
                break; /* not reached: the format was scanned first */
            /* A %s right after a conversion: optional fields. */
            if (c.c == 's' && after_conv && !in_q)
                break;
            value v;
            put_conv(w, p, &c, &v);
            if (!convs++) {
                first = c;
                fv = v;
            }
            p += c.len;
            is_conv = 1;
        } else if (*p == '"') {
            if (pieces == 0)
                opened_first = 1;
            in_q = !in_q;
            if (!in_q)
                closed_at = pieces + 1;
            put(w, p++, 1);
        } else if (*p == '\\' && in_q && (p[1] == '"' || p[1] == '\\')) {
            put(w, p, 2);
            p += 2;
        } else {
            size_t run = strcspn(p + 1, " %\"\\") + 1;
            put(w, p, run);
            p += run;
        }
        pieces++;
        after_conv = is_conv;
    }
    if (in_q)
        problem(w, key, "an unclosed quote in '%.*s'", (int)klen, key);
    if (fd && pieces == 1 && convs == 1) {
        switch (first.c) {
        case 'd':
        case 'i':
            fd->type = WB_LOG_INT;
            fd->v.i = fv.i;
            break;
        case 'u':
            fd->type = WB_LOG_UINT;
            fd->v.u = fv.u;
            break;
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G':
            fd->type = WB_LOG_REAL;
            fd->v.d = fv.d;
            fd->conv = first.c;
            fd->prec = first.prec;
            break;
        case 's':
            fd->quoted = (uint8_t)wb__log_is_quoted(w->f->text + fd->off, w->f->len - fd->off);
            break;
        default:
            break; /* %x %o %c %p %a: the text */
        }
    } else if (fd && opened_first && closed_at == pieces) {
        fd->quoted = 1;
    }
    field_close(w, fd);
    if (*p == '%' && !w->full)
        p = walk_word(w, p, p, WB_LOG_FIELDS);
    return p;
}

static void walk(walker *w, const char *fmt)
{
    const char *p = fmt;
    while (*p && !w->full) {
        if (*p == ' ') {
            put(w, p++, 1);
            continue;
        }
        const char *k = p;
        while (*k && *k != ' ' && *k != '=' && *k != '%' && *k != '"')
            k++;
        if (*k == '=' && k > p) {
            p = walk_pair(w, p, (size_t)(k - p));
            continue;
        }
        /* A %s alone between spaces is optional fields; anything else a
         * word for "text". */
        conv c;
        const char *why;
        size_t word = strcspn(p, " ");
        int alone = p[0] == '%' && parse_conv(p, &c, &why) == 0 && c.c == 's' && c.len == word;
        const char *was = p;
        p = walk_word(w, p, p, alone ? WB_LOG_FIELDS : WB_LOG_WORD);
        if (p == was)
            break; /* not reached: every conversion was read once before */
    }
}

/* The conversions alone: -1 with *why and *at at the first that is not
 * read here. */
static int scan_convs(const char *fmt, const char **why, const char **at)
{
    for (const char *p = fmt; (p = strchr(p, '%')) != NULL;) {
        if (p[1] == '%') {
            p += 2;
            continue;
        }
        conv c;
        if (parse_conv(p, &c, why) != 0) {
            *at = p;
            return -1;
        }
        p += c.len;
    }
    return 0;
}

/* 1 when some conversion of fmt is %n, in whatever form. */
static int has_percent_n(const char *fmt)
{
    for (const char *p = fmt; (p = strchr(p, '%')) != NULL;) {
        p++;
        if (*p == '%') {
            p++;
            continue;
        }
        p += strspn(p, "-+ #0'*$.0123456789hlLjzt");
        if (*p == 'n')
            return 1;
    }
    return 0;
}

static void fields_reset(wb_log_fields *f, const char *fmt)
{
    f->len = 0;
    f->text[0] = '\0';
    f->has_tail = fmt && fmt[0];
    f->dropped = 0;
    f->cut = 0;
    f->refused = 0;
    f->arg_types = 0;
    f->n_args = 0;
    f->n = 0;
}

/* A format that is refused: the whole tail is one word. */
static void fields_refused(wb_log_fields *f)
{
    f->refused = 1;
    f->f[0] = (wb_log_field){.type = WB_LOG_WORD, .off = 0, .len = (uint32_t)f->len, .prec = -1};
    f->n = 1;
}

static void fields_read(wb_log_fields *f, const char *fmt, argsrc *src)
{
    walker w = {.f = f, .src = src, .fmt = fmt};
    walk(&w, fmt);
}

void wb__log_vfields(wb_log_fields *f, const char *fmt, va_list ap)
{
    fields_reset(f, fmt);
    if (!fmt)
        return;
    const char *why, *at;
    if (scan_convs(fmt, &why, &at) != 0) {
        /* vsnprintf can read what this cannot, except %n. */
        if (has_percent_n(fmt)) {
            snprintf(f->text, sizeof f->text, "%s", fmt);
        } else {
            va_list aq;
            va_copy(aq, ap);
            vsnprintf(f->text, sizeof f->text, fmt, aq);
            va_end(aq);
        }
        f->len = strlen(f->text);
        fields_refused(f);
        return;
    }
    va_list aq;
    va_copy(aq, ap);
    argsrc src = {.ap = &aq};
    fields_read(f, fmt, &src);
    va_end(aq);
}

void wb__log_afields(wb_log_fields *f, const char *fmt, const wb_log_arg *args, size_t n)
{
    fields_reset(f, fmt);
    if (!fmt)
        return;
    const char *why, *at;
    if (scan_convs(fmt, &why, &at) != 0) {
        snprintf(f->text, sizeof f->text, "%s", fmt);
        f->len = strlen(f->text);
        fields_refused(f);
        return;
    }
    argsrc src = {.v = args, .n = n};
    fields_read(f, fmt, &src);
}

int wb__log_format_check(const char *fmt, wb_log_fields *out, char *why, size_t size)
{
    char none[1];
    if (!why || size == 0) {
        why = none;
        size = sizeof none;
    }
    why[0] = '\0';
    if (!fmt) {
        snprintf(why, size, "no format");
        return -1;
    }
    const char *bad, *at;
    if (scan_convs(fmt, &bad, &at) != 0) {
        snprintf(why, size, "%s (at offset %td)", bad, at - fmt);
        return -1;
    }
    wb_log_fields f;
    if (!out)
        out = &f;
    fields_reset(out, fmt);
    walker w = {.f = out, .strict = 1, .fmt = fmt, .why = why, .why_size = size};
    walk(&w, fmt);
    return w.problems ? -1 : 0;
}
