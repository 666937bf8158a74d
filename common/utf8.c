#include "utf8.h"

#include <stdint.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at p (n bytes left), or 0: no
 * overlong form, no surrogate, nothing above U+10FFFF, as Python's and
 * protobuf's strict decoders require. */
size_t wb__utf8_seq(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90; /* overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    }
    return len;
}

size_t wb__utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII a word at a time: names and paths are mostly ASCII. */
        while (n - i >= 8) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i == n)
            break;
        size_t k = wb__utf8_seq(p + i, n - i);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

char *wb__utf8_repair(char *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = wb__utf8_seq(p + i, n - i);
        if (k) {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}
