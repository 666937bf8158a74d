#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *log_prog = "wb";
static atomic_int log_level = WB_LOG_INFO;

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

void wb__log(wb_log_level level, const char *event, const char *fmt, ...)
{
    if ((int)level < atomic_load(&log_level) || level >= WB_LOG_OFF)
        return;

    char line[4096];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line,
                     "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s prog=%s event=%s",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_names[level], log_prog, event);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (fmt && fmt[0] && len < sizeof line - 2) {
        line[len++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + len, sizeof line - len, fmt, ap);
        va_end(ap);
        if (m > 0)
            len += (size_t)m < sizeof line - len ? (size_t)m : sizeof line - len - 1;
    }
    if (len > sizeof line - 2)
        len = sizeof line - 2;
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
