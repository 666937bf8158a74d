/* UTF-8 as strict decoders (Python's, protobuf's) require it: no overlong
 * form, no surrogate, nothing above U+10FFFF. One definition for the wire
 * format's checks, the log's JSON and wbctl's escaping. */
#ifndef WB_COMMON_UTF8_H
#define WB_COMMON_UTF8_H

#include <stddef.h>

/* The length (1 to 4) of the valid UTF-8 sequence at p, of which n bytes
 * are there to read, or 0 when none starts there. */
size_t wb__utf8_seq(const unsigned char *p, size_t n);

/* The offset of the first byte of s[0..n) that does not start a valid
 * UTF-8 sequence (no overlong form, no surrogate, nothing above U+10FFFF),
 * or n when all of it is valid. */
size_t wb__utf8_invalid_at(const char *s, size_t n);
/* Copies s into out (3 * strlen(s) + 1 bytes), each byte that is not valid
 * UTF-8 replaced by U+FFFD; returns out. For strings the broker sends that
 * no peer checked (process names from /proc, paths from its command
 * line). */
char *wb__utf8_repair(char *out, const char *s);

#endif
