#include "log.h"

#include "utf8.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *log_prog = "wb";
static atomic_int log_level = WB_LOG_INFO;
static atomic_int log_format = WB_LOG_TEXT;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

void wb__log_set_prog(const char *prog)
{
    log_prog = prog ? prog : "wb";
}

void wb__log_set_level(wb_log_level level)
{
    atomic_store(&log_level, (int)level);
}

wb_log_level wb__log_get_level(void)
{
    return (wb_log_level)atomic_load(&log_level);
}

int wb__log_parse_level(const char *name)
{
    for (int i = 0; i <= WB_LOG_OFF; i++) {
        if (name && strcmp(name, level_names[i]) == 0)
            return i;
    }
    return -1;
}

void wb__log_set_format(wb_log_format format)
{
    atomic_store(&log_format, (int)format);
}

wb_log_format wb__log_get_format(void)
{
    return (wb_log_format)atomic_load(&log_format);
}

int wb__log_parse_format(const char *name)
{
    if (name && strcmp(name, "text") == 0)
        return WB_LOG_TEXT;
    if (name && strcmp(name, "json") == 0)
        return WB_LOG_JSON;
    return -1;
}

/* A bounded writer for one JSON line. `end` keeps room for what closes the
 * object, so that a field that does not fit is dropped whole. */
typedef struct jbuf {
    char *p;
    size_t len;
    size_t end;
    int full;
} jbuf;

static void jput(jbuf *b, const char *s, size_t n)
{
    if (b->full || b->len + n > b->end) {
        b->full = 1;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* Appends s[0..n) as the inside of a JSON string. */
static void jescape(jbuf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        char tmp[8];
        if (u[i] == '"' || u[i] == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)u[i];
            jput(b, tmp, 2);
            i++;
        } else if (u[i] < 0x20 || u[i] == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\u%04x", u[i]);
            jput(b, tmp, 6);
            i++;
        } else {
            size_t k = wb__utf8_seq(u + i, n - i);
            if (k == 0) {
                snprintf(tmp, sizeof tmp, "\\\\x%02x", u[i]);
                jput(b, tmp, 5);
                i++;
            } else {
                jput(b, s + i, k);
                i += k;
            }
        }
    }
}

/* Appends ,"key":"value" as a whole or not at all. */
static void jfield(jbuf *b, const char *key, size_t klen, const char *val, size_t vlen)
{
    size_t mark = b->len;
    jput(b, b->len > 1 ? ",\"" : "\"", b->len > 1 ? 2 : 1);
    jescape(b, key, klen);
    jput(b, "\":\"", 3);
    jescape(b, val, vlen);
    jput(b, "\"", 1);
    if (b->full)
        b->len = mark;
}

/* Undoes wb__log_quote on the quoted value starting at *pp (after its
 * opening quote), writing the bytes to out; moves *pp past the closing quote
 * (or to the end of an unterminated value). Returns the length. */
static size_t unquote(const char **pp, char *out, size_t size)
{
    const char *p = *pp;
    size_t o = 0;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\' && (*p == '"' || *p == '\\')) {
            c = *p++;
        } else if (c == '\\' && *p == 'x' && p[1] && p[2]) {
            char hex[3] = {p[1], p[2], 0};
            char *end;
            long v = strtol(hex, &end, 16);
            if (*end == '\0') {
                c = (char)v;
                p += 3;
            }
        }
        if (o < size)
            out[o++] = c;
    }
    if (*p == '"')
        p++;
    *pp = p;
    return o;
}

size_t wb__log_json_line(char *out, size_t size, const char *ts, const char *level,
                         const char *prog, const char *event, const char *kv)
{
    static const char tail[] = ",\"truncated\":\"true\"}\n";
    if (size < sizeof tail + 2) {
        if (size)
            out[0] = '\0';
        return 0;
    }
    jbuf b = {.p = out, .len = 0, .end = size - sizeof tail};
    jput(&b, "{", 1);
    jfield(&b, "ts", 2, ts, strlen(ts));
    jfield(&b, "level", 5, level, strlen(level));
    jfield(&b, "prog", 4, prog, strlen(prog));
    jfield(&b, "event", 5, event, strlen(event));
    char text[2048];
    size_t text_len = 0;
    int dropped = b.full;
    const char *p = kv ? kv : "";
    while (*p) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        const char *key = p;
        while (*p && *p != '=' && *p != ' ')
            p++;
        size_t klen = (size_t)(p - key);
        if (*p != '=' || klen == 0) {
            /* A word that is not key=value: keep it in "text". */
            while (*p && *p != ' ')
                p++;
            size_t wlen = (size_t)(p - key);
            if (text_len + wlen + 1 < sizeof text) {
                if (text_len)
                    text[text_len++] = ' ';
                memcpy(text + text_len, key, wlen);
                text_len += wlen;
            }
            continue;
        }
        p++;
        char val[4096];
        size_t vlen;
        if (*p == '"') {
            p++;
            vlen = unquote(&p, val, sizeof val);
        } else {
            const char *v = p;
            while (*p && *p != ' ')
                p++;
            vlen = (size_t)(p - v);
            if (vlen > sizeof val)
                vlen = sizeof val;
            memcpy(val, v, vlen);
        }
        b.full = 0;
        jfield(&b, key, klen, val, vlen);
        dropped |= b.full;
    }
    if (text_len) {
        b.full = 0;
        jfield(&b, "text", 4, text, text_len);
        dropped |= b.full;
    }
    /* The room kept at the end is always there for the closing part. */
    b.end = size - 1;
    b.full = 0;
    if (dropped && b.len <= 1)
        jput(&b, tail + 1, sizeof tail - 2); /* no field before it: no comma */
    else if (dropped)
        jput(&b, tail, sizeof tail - 1);
    else
        jput(&b, "}\n", 2);
    out[b.len] = '\0';
    return b.len;
}

size_t wb__log_format_line(char *line, size_t size, const char *prog, wb_log_level level,
                           const char *event, const char *fmt, va_list ap)
{
    if (size < 2)
        return 0;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int lv = (int)level < 0 || level >= WB_LOG_OFF ? WB_LOG_ERROR : (int)level;
    int n =
        snprintf(line, size, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s prog=%s event=%s",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 ts.tv_nsec / 1000000, level_names[lv], prog ? prog : "wb", event);
    if (n < 0) {
        line[0] = '\0';
        return 0;
    }
    size_t len = (size_t)n < size ? (size_t)n : size - 1;
    if (fmt && fmt[0] && len < size - 2) {
        line[len++] = ' ';
        int m = vsnprintf(line + len, size - len, fmt, ap);
        if (m > 0)
            len += (size_t)m < size - len ? (size_t)m : size - len - 1;
    }
    line[len] = '\0';
    return len;
}

void wb__log(wb_log_level level, const char *event, const char *fmt, ...)
{
    if ((int)level < atomic_load(&log_level) || level >= WB_LOG_OFF)
        return;

    /* Two bytes are kept for the newline and the NUL. */
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    size_t len = wb__log_format_line(line, sizeof line - 1, log_prog, level, event, fmt, ap);
    va_end(ap);
    if (atomic_load(&log_format) == WB_LOG_JSON) {
        /* The text line is built first, then parsed back: every call site
         * keeps its key=value format string. The timestamp is the text
         * line's, so both formats agree. */
        char tsbuf[64];
        const char *sp = strchr(line, ' ');
        snprintf(tsbuf, sizeof tsbuf, "%.*s", sp && sp - line > 3 ? (int)(sp - line - 3) : 0,
                 line + 3);
        const char *kv = strstr(line, " event=");
        kv = kv ? kv + strlen(" event=") + strlen(event) : "";
        char json[8192];
        size_t jlen =
            wb__log_json_line(json, sizeof json, tsbuf, level_names[level], log_prog, event, kv);
        ssize_t w = write(STDERR_FILENO, json, jlen);
        (void)w;
        return;
    }
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

const char *wb__log_quote(char *buf, size_t size, const char *s)
{
    if (size == 0)
        return buf;
    if (!s)
        s = "";
    int plain = s[0] != '\0';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p <= 0x20 || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f) {
            plain = 0;
            break;
        }
    }
    if (plain) {
        snprintf(buf, size, "%s", s);
        return buf;
    }
    size_t o = 0;
    buf[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 6 < size; p++) {
        if (*p == '"' || *p == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)*p;
        } else if (*p < 0x20 || *p == 0x7f) {
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", *p);
        } else {
            buf[o++] = (char)*p;
        }
    }
    if (o < size - 1)
        buf[o++] = '"';
    buf[o < size ? o : size - 1] = '\0';
    return buf;
}
