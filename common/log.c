#include "log.h"

#include "text.h"
#include "utf8.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
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
    int dropped;
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
    for (size_t i = 0; i < n && !b->full;) {
        char tmp[8];
        size_t run = 0;
        while (i + run < n && u[i + run] >= 0x20 && u[i + run] < 0x7f && u[i + run] != '"' &&
               u[i + run] != '\\')
            run++;
        if (run) {
            jput(b, s + i, run);
            i += run;
        } else if (u[i] == '"' || u[i] == '\\') {
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

/* Undoes wb__log_quote: s[0..n) is "..." (wb__log_is_quoted); writes the
 * bytes it stands for to out (n bytes at least). Returns their length. */
static size_t unquote(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 1; i + 1 < n; i++) {
        char c = s[i];
        if (c == '\\' && i + 2 < n) {
            char d = s[i + 1];
            int hi, lo;
            if (d == '"' || d == '\\') {
                c = d;
                i++;
            } else if (d == 'x' && i + 4 < n && (hi = wb__text_hex_digit(s[i + 2])) >= 0 &&
                       (lo = wb__text_hex_digit(s[i + 3])) >= 0) {
                c = (char)(hi << 4 | lo);
                i += 3;
            }
        }
        out[o++] = c;
    }
    return o;
}

/* Appends ,"key": as the start of a field. */
static void jkey(jbuf *b, const char *key, size_t klen)
{
    jput(b, b->len > 1 ? ",\"" : "\"", b->len > 1 ? 2 : 1);
    jescape(b, key, klen);
    jput(b, "\":", 2);
}

/* Ends a field begun at mark: kept whole, or taken back. */
static void jdone(jbuf *b, size_t mark)
{
    if (b->full) {
        b->len = mark;
        b->full = 0;
        b->dropped = 1;
    }
}

/* ,"key":"value", a quoted value unquoted first. */
static void jstring(jbuf *b, const char *key, size_t klen, const char *val, size_t vlen, int quoted)
{
    size_t mark = b->len;
    jkey(b, key, klen);
    jput(b, "\"", 1);
    char raw[WB_LOG_TEXT_SIZE];
    if (quoted && vlen >= 2 && vlen <= sizeof raw) {
        jescape(b, raw, unquote(val, vlen, raw));
    } else {
        jescape(b, val, vlen);
    }
    jput(b, "\"", 1);
    jdone(b, mark);
}

/* ,"key":number */
static void jnumber(jbuf *b, const wb_log_field *fd)
{
    size_t mark = b->len;
    jkey(b, fd->key, fd->klen);
    char num[32];
    if (fd->type == WB_LOG_INT) {
        jput(b, num, (size_t)snprintf(num, sizeof num, "%lld", fd->v.i));
    } else if (fd->type == WB_LOG_UINT) {
        jput(b, num, (size_t)snprintf(num, sizeof num, "%llu", fd->v.u));
    } else if (!isfinite(fd->v.d)) {
        jput(b, "null", 4);
    } else {
        /* The digits the text shows, without its flags and width (which
         * could make it no JSON number: +1, 001, 1.). */
        char spec[8] = "%.*L?";
        spec[4] = fd->conv;
        int prec = fd->prec < 0 ? 6 : fd->prec;
        char small[64];
        int n = snprintf(small, sizeof small, spec, prec, fd->v.d);
        if (n < 0 || b->full || b->len + (size_t)n > b->end) {
            b->full = 1;
        } else {
            /* A long one (%f of 1e300) is printed again in place. */
            char *at = b->p + b->len;
            if ((size_t)n < sizeof small)
                memcpy(at, small, (size_t)n);
            else
                snprintf(at, (size_t)n + 1, spec, prec, fd->v.d);
            b->len += (size_t)n;
            /* Always a fraction or an exponent (%g of 100, %.0f): readers
             * that tell integers from reals keep one type per field. */
            if (!memchr(at, '.', (size_t)n) && !memchr(at, 'e', (size_t)n) &&
                !memchr(at, 'E', (size_t)n))
                jput(b, ".0", 2);
        }
    }
    jdone(b, mark);
}

/* Reads optional fields: the next key=value pair or word of t[0..n) from
 * *i (a key of other characters than a format's keys may have makes a
 * word). Returns 1 for a pair, 2 for a word, 0 at the end. */
static int next_pair(const char *t, size_t n, size_t *i, const char **key, size_t *klen,
                     const char **val, size_t *vlen)
{
    while (*i < n && t[*i] == ' ')
        (*i)++;
    if (*i >= n)
        return 0;
    size_t s = *i, e = s;
    int in_q = 0;
    while (e < n && (in_q || t[e] != ' ')) {
        if (t[e] == '"')
            in_q = !in_q;
        else if (t[e] == '\\' && in_q && e + 1 < n)
            e++;
        e++;
    }
    *i = e;
    size_t k = s;
    while (k < e && t[k] != '=' && t[k] != '"')
        k++;
    *key = t + s;
    if (k < e && t[k] == '=' && wb__log_is_key(t + s, k - s)) {
        *klen = k - s;
        *val = t + k + 1;
        *vlen = e - k - 1;
        return 1;
    }
    *klen = e - s;
    return 2;
}

static size_t render_json(const wb_log_fields *f, char *out, size_t size, const char *ts,
                          const char *level, const char *prog, const char *event)
{
    static const char tail[] = ",\"truncated\":true}\n";
    if (size < sizeof tail + 2) {
        if (size)
            out[0] = '\0';
        return 0;
    }
    jbuf b = {.p = out, .len = 0, .end = size - sizeof tail};
    jput(&b, "{", 1);
    jstring(&b, "ts", 2, ts, strlen(ts), 0);
    jstring(&b, "level", 5, level, strlen(level), 0);
    jstring(&b, "prog", 4, prog, strlen(prog), 0);
    jstring(&b, "event", 5, event, strlen(event), 0);
    int words = 0;
    for (unsigned i = 0; i < f->n; i++) {
        const wb_log_field *fd = &f->f[i];
        const char *t = f->text + fd->off;
        switch (fd->type) {
        case WB_LOG_STRING:
            jstring(&b, fd->key, fd->klen, t, fd->len, fd->quoted);
            break;
        case WB_LOG_INT:
        case WB_LOG_UINT:
        case WB_LOG_REAL:
            jnumber(&b, fd);
            break;
        case WB_LOG_FIELDS: {
            const char *key, *val;
            size_t klen, vlen, at = 0;
            int r;
            while ((r = next_pair(t, fd->len, &at, &key, &klen, &val, &vlen)) != 0) {
                if (r == 1)
                    jstring(&b, key, klen, val, vlen, wb__log_is_quoted(val, vlen));
                else
                    words++;
            }
            break;
        }
        case WB_LOG_WORD:
            words += fd->len > 0;
            break;
        }
    }
    if (words) {
        /* The words outside key=value, in one string. */
        size_t mark = b.len;
        int n = 0;
        jkey(&b, "text", 4);
        jput(&b, "\"", 1);
        for (unsigned i = 0; i < f->n; i++) {
            const wb_log_field *fd = &f->f[i];
            const char *t = f->text + fd->off;
            if (fd->type == WB_LOG_WORD && fd->len > 0) {
                if (n++)
                    jput(&b, " ", 1);
                jescape(&b, t, fd->len);
            } else if (fd->type == WB_LOG_FIELDS) {
                const char *key, *val;
                size_t klen, vlen, at = 0;
                int r;
                while ((r = next_pair(t, fd->len, &at, &key, &klen, &val, &vlen)) != 0) {
                    if (r != 2)
                        continue;
                    if (n++)
                        jput(&b, " ", 1);
                    jescape(&b, key, klen);
                }
            }
        }
        jput(&b, "\"", 1);
        jdone(&b, mark);
    }
    /* The room kept at the end is always there for the closing part. */
    b.end = size - 1;
    if (b.dropped || f->dropped)
        jput(&b, tail + (b.len <= 1), sizeof tail - 1 - (b.len <= 1)); /* no comma first */
    else
        jput(&b, "}\n", 2);
    out[b.len] = '\0';
    return b.len;
}

/* The text line: the fixed fields, a space and the tail when the format
 * was not empty, cut to size - 1 bytes as snprintf cuts. */
static size_t render_text(const wb_log_fields *f, char *line, size_t size, const char *ts,
                          const char *level, const char *prog, const char *event)
{
    if (size < 2)
        return 0;
    int n = snprintf(line, size, "ts=%s level=%s prog=%s event=%s", ts, level, prog, event);
    if (n < 0) {
        line[0] = '\0';
        return 0;
    }
    size_t len = (size_t)n < size ? (size_t)n : size - 1;
    if (f->has_tail && len < size - 2) {
        line[len++] = ' ';
        size_t m = f->len < size - 1 - len ? f->len : size - 1 - len;
        memcpy(line + len, f->text, m);
        len += m;
    }
    line[len] = '\0';
    return len;
}

size_t wb__log_render(const wb_log_fields *f, wb_log_format format, char *out, size_t size,
                      const char *ts, const char *level, const char *prog, const char *event)
{
    ts = ts ? ts : "";
    level = level ? level : "";
    prog = prog ? prog : "wb";
    event = event ? event : "";
    if (format == WB_LOG_JSON)
        return render_json(f, out, size, ts, level, prog, event);
    if (size < 3) {
        if (size)
            out[0] = '\0';
        return 0;
    }
    size_t len = render_text(f, out, size - 1, ts, level, prog, event);
    out[len++] = '\n';
    out[len] = '\0';
    return len;
}

/* The time as both formats write it: 2026-11-30T07:31:02.123Z. */
static void timestamp(char *out, size_t size)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, size, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
}

size_t wb__log_format_line(char *line, size_t size, const char *prog, wb_log_level level,
                           const char *event, const char *fmt, va_list ap)
{
    if (size < 2)
        return 0;
    char ts[96];
    timestamp(ts, sizeof ts);
    int lv = (int)level < 0 || level >= WB_LOG_OFF ? WB_LOG_ERROR : (int)level;
    wb_log_fields f;
    wb__log_vfields(&f, fmt, ap);
    return render_text(&f, line, size, ts, level_names[lv], prog ? prog : "wb", event ? event : "");
}

void wb__log(wb_log_level level, const char *event, const char *fmt, ...)
{
    if ((int)level < atomic_load(&log_level) || level >= WB_LOG_OFF)
        return;
    wb_log_fields f;
    va_list ap;
    va_start(ap, fmt);
    wb__log_vfields(&f, fmt, ap);
    va_end(ap);
    char ts[96];
    timestamp(ts, sizeof ts);
    /* A text line is at most 4095 bytes with its newline, as it always was;
     * a JSON one at most 8 KiB. */
    char line[8192];
    wb_log_format format = (wb_log_format)atomic_load(&log_format);
    size_t len = wb__log_render(&f, format, line, format == WB_LOG_JSON ? sizeof line : 4096, ts,
                                level_names[level], log_prog, event);
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
