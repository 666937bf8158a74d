/* Text made safe to show: bytes as hex digits, and strings from peers
 * escaped for a terminal or a log line. Pure; nothing is allocated. UTF-8
 * validity itself is utf8.h's. */
#ifndef WB_TEXT_H
#define WB_TEXT_H

#include <stddef.h>

/* Writes the n bytes at `bytes` as lowercase hex digits into out (size
 * bytes): as many whole bytes as fit with the terminating NUL (all of them
 * when size >= 2 * n + 1). Returns out. */
char *wb__text_hex(char *out, size_t size, const void *bytes, size_t n);

/* The value of one hex digit, either case: 0 to 15, or -1. */
int wb__text_hex_digit(char c);

/* wb__text_escape's flags. QUOTE: '"' becomes \" as well, for a value
 * shown between double quotes (a log line's). */
#define WB_TEXT_ESCAPE_QUOTE 1u

/* The size that always holds the escaped form of n bytes, NUL included:
 * each byte becomes at most four (\xNN; U+00AD's two bytes become
 * \u{00ad}). */
#define WB_TEXT_ESCAPE_MAX(n) (4 * (size_t)(n) + 1)

/* Writes s (NULL: "") into out (size bytes) made safe for a terminal:
 * printable ASCII and valid UTF-8 stay, a backslash becomes "\\", every
 * control character (C0, DEL, C1) and byte of invalid UTF-8 is shown as
 * \xNN, and every character that reorders or hides text (Unicode format
 * characters such as the bidi overrides U+202A..U+202E and isolates
 * U+2066..U+2069, the zero-width U+200B..U+200F, U+2060 and U+FEFF; the
 * line and paragraph separators U+2028, U+2029) as \u{XXXX}. What does not
 * fit is left out whole, never an escape or a character cut in half; out
 * is NUL-terminated when size > 0. Returns the length of the whole escaped
 * form (as snprintf does): it did not fit when that is >= size. */
size_t wb__text_escape(char *out, size_t size, const char *s, unsigned flags);

#endif
