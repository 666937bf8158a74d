/* A small structured logger: one line per event on stderr, as key=value pairs.
 *
 *   ts=2026-11-30T07:31:02.123Z level=info prog=wbrokerd event=load model=demo bytes=4096
 *
 * The caller passes the event name and a printf format for the remaining
 * key=value pairs. Values with spaces or quotes should be passed through
 * wb__log_quote() first. Thread-safe: each line is written with one write(2).
 *
 * The format says each field's key and type. The logger reads the format
 * and the arguments together once (wb__log_vfields, log_fields.h) into the
 * text vsnprintf would write and typed fields beside it, and writes either
 * format from those. In JSON format (wb__log_set_format) the same call
 * writes one JSON object per line:
 *
 *   {"ts":"2026-11-30T07:31:02.123Z","level":"info","prog":"wbrokerd","event":"load",
 *    "model":"demo","bytes":4096}
 *
 * A value's JSON type is its conversion's, never its value's, so that a
 * field keeps one type from line to line (a lease id passed as %s is a
 * string even when it is all digits):
 *
 *   key=%d %i %u, any length     an integer, exact: 18446744073709551615 too (which
 *   (hh h l ll j z t)            jansson refuses to read and JavaScript rounds; Python
 *                                and Go's json.Number read it)
 *   key=%f %e %g (%F %E %G, L)   a real with the digits the format asks for, without its
 *                                flags and width: seconds=%.3f of 1.5 gives 1.500; with
 *                                a fraction or an exponent always (%g of 100 gives 100.0);
 *                                null when not finite
 *   key=%s                       a string; a value quoted by wb__log_quote is unquoted
 *                                to the bytes it was given (the escapes are undone, so
 *                                both formats hold the same bytes, cut the same way)
 *   key=%x %X %o %c %p %a        a string: the text
 *   key=word, key="... %u ..."    a string: the literal, a quoted one unquoted
 *   key=%s:%s, key=v%u, ...      a string: the value's text (anything else)
 *
 * A %s right after another conversion (uid=%u%s, passed "" or
 * " no_wait=yes") and a %s alone between spaces add optional fields: their
 * text is read as key=value pairs with string values. A word outside
 * key=value goes to the string field "text", after the others. Bytes that
 * are not UTF-8 are written as the text \xNN, control characters as \u00XX.
 * A line that does not fit drops the fields that do not and ends with
 * "truncated":true.
 *
 * Formats must fit this: no positional arguments, no * width or precision,
 * no %n, %m or wide characters. One that does not is written whole as text
 * (the JSON field "text"). tests/unit/test_log_sites.c reads every call
 * site's format from the sources and checks it with wb__log_format_check,
 * and that a key keeps one JSON type across the broker's events. */
#ifndef WB_LOG_H
#define WB_LOG_H

#include "log_fields.h"
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

/* Writes one line of f, with its newline, in `format` into out (always
 * NUL-terminated): the four fixed fields, then f's. The text line is cut to
 * fit; the JSON line is always one complete object, dropping the fields
 * that do not fit and adding "truncated":true, or empty when not even the
 * fixed fields fit. Returns the length. */
size_t wb__log_render(const wb_log_fields *f, wb_log_format format, char *out, size_t size,
                      const char *ts, const char *level, const char *prog, const char *event);

/* Formats one text line, without its newline, into line (always
 * NUL-terminated, truncated to fit): the fixed fields with `prog`, then the
 * caller's key=value tail. Returns its length. The process logger below and
 * libwbclient's log handler (which must not write to stderr) both use it. */
size_t wb__log_format_line(char *line, size_t size, const char *prog, wb_log_level level,
                           const char *event, const char *fmt, va_list ap);

/* Writes s into buf as a log value: unchanged if it has no space, quote, '='
 * or control character, otherwise double-quoted with \" \\ and \xNN escapes.
 * Returns buf. The result is truncated to fit size. The JSON format undoes
 * the quoting exactly. */
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
