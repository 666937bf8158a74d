#include "wbctl_out.h"

#include "alloc.h"
#include "fdchan_wire.h"
#include "text.h"
#include "utf8.h"

#include "wbctl.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *wbctl_utf8(const char *s)
{
    if (!s)
        s = "";
    char *out = wb__malloc(3 * strlen(s) + 1);
    if (!out)
        return NULL;
    return wb__utf8_repair(out, s);
}

char *wbctl_escape(const char *s)
{
    size_t size = WB_TEXT_ESCAPE_MAX(s ? strlen(s) : 0);
    char *out = wb__malloc(size);
    if (!out)
        return NULL;
    wb__text_escape(out, size, s, 0);
    return out;
}

/* Adds a row of t->ncols strings (escaped copies). */
static void table_addv(wbctl_table *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 8;
        char **more = wb__realloc(t->cells, cap * t->ncols * sizeof *more);
        if (!more)
            return;
        t->cells = more;
        t->cap = cap;
    }
    /* Cells hold what peers chose (process names, paths): escaped, so that
     * none can drive the terminal. */
    for (size_t i = 0; i < t->ncols; i++)
        t->cells[t->nrows * t->ncols + i] = wbctl_escape(cells[i]);
    t->nrows++;
}

void wbctl_table_columns(wbctl_table *t, const wbctl_column *cols, size_t n)
{
    if (n > WBCTL_TABLE_MAX_COLS)
        n = WBCTL_TABLE_MAX_COLS;
    t->ncols = n;
    t->hidden = 0;
    const char *names[WBCTL_TABLE_MAX_COLS];
    for (size_t c = 0; c < n; c++) {
        names[c] = cols[c].name;
        if (cols[c].wide_only && !t->wide)
            t->hidden |= 1u << c;
    }
    table_addv(t, names);
}

void wbctl_table_add(wbctl_table *t, ...)
{
    const char *cells[WBCTL_TABLE_MAX_COLS];
    va_list ap;
    va_start(ap, t);
    for (size_t i = 0; i < t->ncols && i < WBCTL_TABLE_MAX_COLS; i++)
        cells[i] = va_arg(ap, const char *);
    va_end(ap);
    table_addv(t, cells);
}

void wbctl_table_print(wbctl_table *t)
{
    size_t width[WBCTL_TABLE_MAX_COLS] = {0};
    size_t ncols = t->ncols < WBCTL_TABLE_MAX_COLS ? t->ncols : WBCTL_TABLE_MAX_COLS;
    size_t last = 0; /* the last column shown: not padded */
    for (size_t c = 0; c < ncols; c++) {
        if (!(t->hidden & (1u << c)))
            last = c;
    }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            size_t n = s ? strlen(s) : 0;
            if (n > width[c])
                width[c] = n;
        }
    }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            if (t->hidden & (1u << c))
                continue;
            if (c < last)
                printf("%-*s  ", (int)width[c], s ? s : "");
            else
                printf("%s\n", s ? s : "");
        }
    }
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    t->cells = NULL;
    t->nrows = t->cap = 0;
}

/* v bytes (or bytes a second) in the largest IEC unit that leaves it at
 * least 1, with one decimal; a value that would print as 1024.0 goes to the
 * next unit. */
static void fmt_iec(char *buf, size_t size, double v, const char *suffix)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (v < 1023.5) {
        snprintf(buf, size, "%.0f B%s", v, suffix);
        return;
    }
    size_t u = 0;
    while (u + 1 < sizeof units / sizeof units[0] && v >= 1023.95) {
        v /= 1024;
        u++;
    }
    snprintf(buf, size, "%.1f %s%s", v, units[u], suffix);
}

const char *wbctl_fmt_size(char *buf, size_t size, uint64_t bytes)
{
    if (bytes < 1024)
        snprintf(buf, size, "%u B", (unsigned)bytes);
    else
        fmt_iec(buf, size, (double)bytes, "");
    return buf;
}

const char *wbctl_fmt_rate(char *buf, size_t size, double bytes_per_second)
{
    fmt_iec(buf, size, bytes_per_second > 0 ? bytes_per_second : 0, "/s");
    return buf;
}

const char *wbctl_fmt_gbps(char *buf, size_t size, double gbps)
{
    return wbctl_fmt_rate(buf, size, gbps * 1e9);
}

/* v to the nearest multiple of 1/scale, halves away from zero (without
 * libm); values too large for that to matter stay as they are. */
static double round_to(double v, double scale)
{
    double x = v * scale;
    if (!isfinite(x) || x > 9e15 || x < -9e15)
        return v;
    return (double)(long long)(x + (x < 0 ? -0.5 : 0.5)) / scale;
}

double wbctl_round_secs(double seconds)
{
    return round_to(seconds, 1e6);
}

double wbctl_round_time(double epoch_seconds)
{
    return round_to(epoch_seconds, 1e3);
}

json_t *wbctl_jstr(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j)
        return j;
    char *fixed = wbctl_utf8(s);
    j = json_string(fixed ? fixed : "");
    free(fixed);
    return j;
}

int wbctl_print_json(json_t *j)
{
    if (!j) {
        fprintf(stderr, "wbctl: out of memory\n");
        return 1;
    }
    char *s = json_dumps(j, WBCTL_JSON_FLAGS);
    json_decref(j);
    if (!s) {
        fprintf(stderr, "wbctl: out of memory\n");
        return 1;
    }
    int rc = WBCTL_EXIT_OK;
    if (puts(s) == EOF || fflush(stdout) != 0) {
        fprintf(stderr, "wbctl: writing the output: %s\n", strerror(errno));
        rc = 1;
    }
    free(s);
    return rc;
}

/* As wbctl_print_json dumps. */
#define JSON_FLAGS WBCTL_JSON_FLAGS

/* Makes room for `more` bytes at the end of a->out. */
static int out_reserve(wbctl_json_array *a, size_t more)
{
    if (a->cap - a->len >= more)
        return 0;
    size_t cap = a->cap ? a->cap : 1 << 16;
    while (cap - a->len < more)
        cap *= 2;
    char *p = wb__realloc(a->out, cap);
    if (!p)
        return -1;
    a->out = p;
    a->cap = cap;
    return 0;
}

void wbctl_json_array_init(wbctl_json_array *a)
{
    *a = (wbctl_json_array){0};
}

void wbctl_json_array_add(wbctl_json_array *a, json_t *j)
{
    if (!j || a->failed || (!a->wrap && !(a->wrap = json_array())) || out_reserve(a, 1024) != 0) {
        json_decref(j);
        a->failed = 1;
        return;
    }
    int rc = json_array_size(a->wrap) ? json_array_set_new(a->wrap, 0, j)
                                      : json_array_append_new(a->wrap, j);
    /* Dumped straight into the document: json_dumpb writes nothing past
     * the room it is given and says how much it needed. */
    size_t n = 0;
    while (rc == 0) {
        size_t room = a->cap - a->len;
        n = json_dumpb(a->wrap, a->out + a->len, room, JSON_FLAGS);
        if (n == 0 || n <= room || out_reserve(a, n) != 0)
            break;
    }
    if (rc != 0 || n < 2 || n > a->cap - a->len) {
        a->failed = 1;
        return;
    }
    /* "[\n  {...}\n]": the element indented as it sits in the array. Its
     * "[" opens the document (first element) or becomes the comma after
     * the previous one; the closing "\n]" is left off. */
    if (a->n++)
        a->out[a->len] = ',';
    a->len += n - 2;
}

int wbctl_json_array_print(wbctl_json_array *a, FILE *f)
{
    int rc = WBCTL_EXIT_OK;
    if (a->failed || out_reserve(a, 4) != 0) {
        fprintf(stderr, "wbctl: out of memory\n");
        rc = 1;
    } else {
        /* As json_dumps prints the whole array, then puts's newline. */
        const char *end = a->n ? "\n]\n" : "[]\n";
        size_t len = strlen(end);
        memcpy(a->out + a->len, end, len);
        a->len += len;
        if (fwrite(a->out, 1, a->len, f) != a->len || fflush(f) != 0) {
            fprintf(stderr, "wbctl: writing the output: %s\n", strerror(errno));
            rc = 1;
        }
    }
    json_decref(a->wrap);
    free(a->out);
    *a = (wbctl_json_array){0};
    return rc;
}

static int field_present(const wbctl_jfield *f)
{
    return !f->absent && (f->type != WBCTL_JREAL || isfinite(f->v.d));
}

/* A new value for field f; NULL when out of memory. */
static json_t *field_value(const wbctl_jfield *f)
{
    switch (f->type) {
    case WBCTL_JSTR:
        return wbctl_jstr(f->v.s);
    case WBCTL_JINT:
        return json_integer(f->v.i);
    case WBCTL_JREAL:
        return json_real(f->v.d);
    default:
        return f->v.j;
    }
}

/* Sets field k of r's object in place to f's value. */
static int field_set(wbctl_jrow *r, size_t k, const wbctl_jfield *f)
{
    json_t *v = r->vals[k];
    switch (f->type) {
    case WBCTL_JSTR: {
        const char *s = f->v.s ? f->v.s : "";
        if (strcmp(json_string_value(v), s) == 0)
            return 0;
        if (json_string_set(v, s) == 0)
            return 0;
        /* Not UTF-8: as wbctl_jstr shows it. */
        char *fixed = wbctl_utf8(s);
        int rc = fixed ? json_string_set(v, fixed) : -1;
        free(fixed);
        return rc;
    }
    case WBCTL_JINT:
        return json_integer_set(v, f->v.i);
    case WBCTL_JREAL:
        return json_real_set(v, f->v.d);
    default:
        if (!f->v.j)
            return -1;
        r->vals[k] = f->v.j;
        return json_object_set_new(r->o, f->key, f->v.j);
    }
}

/* Builds r's object afresh for fields f. */
static int row_build(wbctl_jrow *r, const wbctl_jfield *f, size_t n)
{
    wbctl_jrow_free(r);
    r->vals = wb__calloc(n, sizeof *r->vals);
    r->present = wb__calloc(n, 1);
    r->o = json_object();
    r->n = n;
    int rc = r->vals && r->present && r->o ? 0 : -1;
    for (size_t k = 0; k < n; k++) {
        if (!field_present(&f[k])) {
            if (f[k].type == WBCTL_JNEW)
                json_decref(f[k].v.j);
            continue;
        }
        json_t *v = field_value(&f[k]);
        if (rc != 0 || !v) {
            json_decref(v);
            rc = -1;
            continue;
        }
        if (json_object_set_new(r->o, f[k].key, v) != 0) {
            rc = -1;
            continue;
        }
        r->vals[k] = v;
        r->present[k] = 1;
    }
    return rc;
}

json_t *wbctl_jrow_set(wbctl_jrow *r, const wbctl_jfield *f, size_t n)
{
    int same = r->o && r->n == n;
    for (size_t k = 0; same && k < n; k++)
        same = r->present[k] == field_present(&f[k]);
    int rc = 0;
    if (!same) {
        rc = row_build(r, f, n);
    } else {
        for (size_t k = 0; k < n; k++) {
            if (r->present[k] && field_set(r, k, &f[k]) != 0)
                rc = -1;
            else if (!r->present[k] && f[k].type == WBCTL_JNEW)
                json_decref(f[k].v.j);
        }
    }
    if (rc != 0) {
        wbctl_jrow_free(r);
        return NULL;
    }
    return json_incref(r->o);
}

void wbctl_jrow_free(wbctl_jrow *r)
{
    json_decref(r->o);
    free(r->vals);
    free(r->present);
    *r = (wbctl_jrow){0};
}

void wbctl_fmt_age(char *buf, size_t size, double seconds)
{
    long s = seconds > 0 ? (long)seconds : 0;
    if (s < 60)
        snprintf(buf, size, "%lds", s);
    else if (s < 3600)
        snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(buf, size, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
}

const char *wbctl_fmt_pid(char *buf, size_t size, uint32_t pid)
{
    if (WB_IS_SESSION_ID(pid))
        snprintf(buf, size, "conn:%u", pid - WB_SESSION_ID_BASE);
    else
        snprintf(buf, size, "%u", pid);
    return buf;
}

void wbctl_json_pid(json_t *o, uint32_t pid)
{
    json_object_set_new(o, "pid", json_integer(pid));
    if (WB_IS_SESSION_ID(pid)) {
        char buf[24];
        json_object_set_new(o, "session", json_string(wbctl_fmt_pid(buf, sizeof buf, pid)));
    }
}
