/* The log's format reader: a printf format of key=value pairs and its
 * arguments become the text vsnprintf would write and the typed fields
 * both log formats are written from (log_fields.h). Pure: no I/O, no
 * allocation; fuzzed (tests/fuzz/fuzz_log.c). */
#include "log_fields.h"

#include "log_conv.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

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
    wb__log_take(w->src, c, v);
    f->arg_types |= wb__log_arg_bit(c->at);
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
    int n = wb__log_print_conv(f->text + f->len, room, p, c, v);
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
            if (wb__log_parse_conv(p, &c, &why) != 0)
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
            if (wb__log_parse_conv(p, &c, &why) != 0)
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
        int alone =
            p[0] == '%' && wb__log_parse_conv(p, &c, &why) == 0 && c.c == 's' && c.len == word;
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
        if (wb__log_parse_conv(p, &c, why) != 0) {
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
