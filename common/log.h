/* A small structured logger: one line per event on stderr, as key=value pairs.
 *
 *   ts=2026-11-30T07:31:02.123Z level=info prog=wbrokerd event=load model=demo bytes=4096
 *
 * The caller passes the event name and a printf format for the remaining
 * key=value pairs. Values with spaces or quotes should be passed through
 * wb__log_quote() first. Thread-safe: each line is written with one write(2).
 *
 * In JSON format (wb__log_set_format) the same call writes one JSON object
 * per line instead, its key=value pairs turned into string fields:
 *
 *   {"ts":"2026-11-30T07:31:02.123Z","level":"info","prog":"wbrokerd","event":"load",
 *    "model":"demo","bytes":"4096"}
 *
 * Every value is a JSON string, numbers included, so that a field never
 * changes type from one line to the next (a lease id such as 12345678 would
 * otherwise be a number on one line and a string on the next). */
#ifndef WB_LOG_H
#define WB_LOG_H

#include "wb/log.h"

#include <stdarg.h>
#include <stddef.h>

typedef enum wb_log_format {
    WB_LOG_TEXT = 0,
    WB_LOG_JSON = 1,
} wb_log_format;

/* Sets the program name printed as prog=... (the pointer is kept). */
void wb__log_set_prog(const char *prog);
void wb__log_set_level(wb_log_level level);
wb_log_level wb__log_get_level(void);

/* Parses "debug", "info", "warn", "error" or "off"; returns -1 otherwise. */
int wb__log_parse_level(const char *name);

void wb__log_set_format(wb_log_format format);
wb_log_format wb__log_get_format(void);
/* Parses "text" or "json"; returns -1 otherwise. */
int wb__log_parse_format(const char *name);

/* Writes one JSON log line (with its newline) into out: the four fixed
 * fields, then the fields parsed from `kv`, a key=value tail in the text
 * format (values quoted by wb__log_quote are unquoted; a word without '='
 * goes to a field "text"). The result is always one complete JSON object:
 * fields that do not fit are dropped and "truncated":"true" is added. Bytes
 * that are not UTF-8 are written as the text \xNN. Returns the length. */
size_t wb__log_json_line(char *out, size_t size, const char *ts, const char *level,
                         const char *prog, const char *event, const char *kv);

/* Formats one text line, without its newline, into line (always
 * NUL-terminated, truncated to fit): the fixed fields with `prog`, then the
 * caller's key=value tail. Returns its length. The process logger below and
 * libwbclient's log handler (which must not write to stderr) both use it. */
size_t wb__log_format_line(char *line, size_t size, const char *prog, wb_log_level level,
                           const char *event, const char *fmt, va_list ap);

/* Writes s into buf as a log value: unchanged if it has no space, quote, '='
 * or control character, otherwise double-quoted with \" \\ and \xNN escapes.
 * Returns buf. The result is truncated to fit size. */
const char *wb__log_quote(char *buf, size_t size, const char *s);

/* libwbclient never writes on its host's stderr: its sources are compiled
 * with WB_LIBRARY_CODE and log through wb__clog (client/clog.h) instead. */
#ifndef WB_LIBRARY_CODE
/* Writes one line on this process's stderr: for programs (the broker, wbctl),
 * never for libwbclient, which logs through wb__clog (client/clog.h). */
void wb__log(wb_log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define wb_debug(ev, ...) wb__log(WB_LOG_DEBUG, ev, __VA_ARGS__)
#define wb_info(ev, ...)  wb__log(WB_LOG_INFO, ev, __VA_ARGS__)
#define wb_warn(ev, ...)  wb__log(WB_LOG_WARN, ev, __VA_ARGS__)
#define wb_error(ev, ...) wb__log(WB_LOG_ERROR, ev, __VA_ARGS__)

#endif

#endif
