/* Fuzzes the log's format reader and both writers with arbitrary formats
 * and arguments. The input is a header byte (the arguments' C type for the
 * comparison below, the output size), a format up to its NUL, eight
 * arguments' numbers (8 bytes each) and their strings (NUL-separated).
 * Whatever the format: the check says yes or no with a reason, the fields
 * lie within the text, the JSON line is one object that jansson reads (or
 * empty), the text line ends with its newline; and when every conversion
 * takes one C type, the text is snprintf's byte for byte. Anything else
 * traps. */
#include "log.h"

#include <jansson.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FORMAT 1024
#define N_ARGS     8

static char text_ref[WB_LOG_TEXT_SIZE];
static char out[16384];

/* snprintf with the arguments as the one type every conversion took.
 * Returns 0 when they took several types (no comparison then). */
static int reference(const char *fmt, unsigned types, const wb_log_arg *a, int *n)
{
    switch (types) {
    case 0:
    case WB_LOG_ARG_INT:
        *n = snprintf(text_ref, sizeof text_ref, fmt, (int)a[0].i, (int)a[1].i, (int)a[2].i,
                      (int)a[3].i, (int)a[4].i, (int)a[5].i, (int)a[6].i, (int)a[7].i);
        return 1;
    case WB_LOG_ARG_LLONG:
        *n = snprintf(text_ref, sizeof text_ref, fmt, a[0].i, a[1].i, a[2].i, a[3].i, a[4].i,
                      a[5].i, a[6].i, a[7].i);
        return 1;
    case WB_LOG_ARG_DOUBLE:
        *n = snprintf(text_ref, sizeof text_ref, fmt, (double)a[0].d, (double)a[1].d,
                      (double)a[2].d, (double)a[3].d, (double)a[4].d, (double)a[5].d,
                      (double)a[6].d, (double)a[7].d);
        return 1;
    case WB_LOG_ARG_LDOUBLE:
        *n = snprintf(text_ref, sizeof text_ref, fmt, a[0].d, a[1].d, a[2].d, a[3].d, a[4].d,
                      a[5].d, a[6].d, a[7].d);
        return 1;
    case WB_LOG_ARG_STRING:
        *n = snprintf(text_ref, sizeof text_ref, fmt, a[0].s, a[1].s, a[2].s, a[3].s, a[4].s,
                      a[5].s, a[6].s, a[7].s);
        return 1;
    default:
        return 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t head = data[0];
    data++;
    size--;
    /* The format. */
    char fmt[MAX_FORMAT + 1];
    size_t flen = 0;
    while (flen < size && flen < MAX_FORMAT && data[flen])
        flen++;
    memcpy(fmt, data, flen);
    fmt[flen] = '\0';
    data += flen + (flen < size);
    size -= flen + (flen < size);
    /* The arguments: numbers, then strings. */
    wb_log_arg args[N_ARGS];
    static char strings[N_ARGS][512];
    for (int i = 0; i < N_ARGS; i++) {
        uint64_t bits = 0;
        size_t take = size < 8 ? size : 8;
        memcpy(&bits, data, take);
        data += take;
        size -= take;
        double d;
        memcpy(&d, &bits, sizeof d);
        args[i].i = (long long)bits;
        args[i].d = d;
    }
    for (int i = 0; i < N_ARGS; i++) {
        size_t n = 0;
        while (n < size && n < sizeof strings[i] - 1 && data[n])
            n++;
        memcpy(strings[i], data, n);
        strings[i][n] = '\0';
        data += n + (n < size);
        size -= n + (n < size);
        args[i].s = strings[i];
    }

    char why[128];
    int ok = wb__log_format_check(fmt, NULL, why, sizeof why);
    if ((ok != 0 && why[0] == '\0') || (ok == 0 && why[0] != '\0') || strlen(why) >= sizeof why)
        __builtin_trap();

    static wb_log_fields f;
    wb__log_afields(&f, fmt, args, N_ARGS);
    if (f.len >= sizeof f.text || f.text[f.len] != '\0' || f.n > WB_LOG_MAX_FIELDS)
        __builtin_trap();
    for (unsigned i = 0; i < f.n; i++) {
        if (f.f[i].off > f.len || f.f[i].len > f.len - f.f[i].off)
            __builtin_trap();
        if (f.f[i].type > WB_LOG_WORD || (f.f[i].key == NULL) != (f.f[i].type >= WB_LOG_FIELDS))
            __builtin_trap();
    }
    /* Every format the check accepts is read without refusal. */
    if (ok == 0 && f.refused)
        __builtin_trap();

    int n;
    if (!f.refused && !f.cut && f.n_args <= N_ARGS && reference(fmt, f.arg_types, args, &n)) {
        size_t want = n < 0 ? 0 : (size_t)n < sizeof text_ref ? (size_t)n : sizeof text_ref - 1;
        if (n >= 0 && (f.len != want || memcmp(f.text, text_ref, want) != 0))
            __builtin_trap();
    }

    size_t osize = head < 32 ? (size_t)head + 1 : (size_t)head * 64;
    size_t len = wb__log_render(&f, WB_LOG_JSON, out, osize, "2026-11-30T07:31:02.123Z", "info",
                                "wbfuzz", "ev");
    if (len >= osize || out[len] != '\0')
        __builtin_trap();
    if (len > 0) {
        if (len < 3 || out[len - 1] != '\n' || out[len - 2] != '}')
            __builtin_trap();
        json_error_t e;
        json_t *o = json_loadb(out, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &e);
        if (!o || !json_is_object(o))
            __builtin_trap();
        json_decref(o);
    }
    len = wb__log_render(&f, WB_LOG_TEXT, out, osize, "2026-11-30T07:31:02.123Z", "info", "wbfuzz",
                         "ev");
    if (len >= osize || (osize >= 3 && (len == 0 || out[len - 1] != '\n')))
        __builtin_trap();
    return 0;
}
