#include "wbctl_out.h"

#include "fdwire.h"

#include "wbctl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void wbctl_table_add(wbctl_table *t, ...)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 8;
        char **cells = realloc(t->cells, cap * t->ncols * sizeof *cells);
        if (!cells)
            return;
        t->cells = cells;
        t->cap = cap;
    }
    va_list ap;
    va_start(ap, t);
    for (size_t i = 0; i < t->ncols; i++) {
        /* Cells hold what peers chose (process names, paths): escaped, so
         * that none can drive the terminal. */
        const char *s = va_arg(ap, const char *);
        t->cells[t->nrows * t->ncols + i] = wbctl_escape(s);
    }
    va_end(ap);
    t->nrows++;
}

void wbctl_table_print(wbctl_table *t)
{
    size_t width[16] = {0};
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols && c < 16; c++) {
            const char *s = t->cells[r * t->ncols + c];
            size_t n = s ? strlen(s) : 0;
            if (n > width[c])
                width[c] = n;
        }
    }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            if (c + 1 < t->ncols)
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
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) {
        fprintf(stderr, "wbctl: out of memory\n");
        return 1;
    }
    puts(s);
    free(s);
    return WBCTL_EXIT_OK;
}

/* As wbctl_print_json dumps. */
#define JSON_FLAGS (JSON_INDENT(2) | JSON_PRESERVE_ORDER)

/* Makes room for `more` bytes at the end of a->out. */
static int out_reserve(wbctl_json_array *a, size_t more)
{
    if (a->cap - a->len >= more)
        return 0;
    size_t cap = a->cap ? a->cap : 1 << 16;
    while (cap - a->len < more)
        cap *= 2;
    char *p = realloc(a->out, cap);
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

int wbctl_json_array_print(wbctl_json_array *a)
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
        if (fwrite(a->out, 1, a->len, stdout) != a->len || fflush(stdout) != 0) {
            fprintf(stderr, "wbctl: writing the output: %s\n", strerror(errno));
            rc = 1;
        }
    }
    json_decref(a->wrap);
    free(a->out);
    *a = (wbctl_json_array){0};
    return rc;
}

double wbctl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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

void wbctl_hex(const ProtobufCBinaryData *b, char *out, size_t size)
{
    static const char digits[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < b->len && o + 2 < size; i++) {
        out[o++] = digits[b->data[i] >> 4];
        out[o++] = digits[b->data[i] & 15];
    }
    out[o] = '\0';
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
