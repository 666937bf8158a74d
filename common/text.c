#include "text.h"

#include "utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

int wb__text_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

char *wb__text_hex(char *out, size_t size, const void *bytes, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    const uint8_t *b = bytes;
    size_t o = 0;
    for (size_t i = 0; i < n && o + 2 < size; i++) {
        out[o++] = digits[b[i] >> 4];
        out[o++] = digits[b[i] & 15];
    }
    if (size)
        out[o] = '\0';
    return out;
}

/* The length of the valid UTF-8 sequence at s (2 to 4 bytes; a NUL ends
 * it), or 0 (ASCII included); C1 controls (U+0080..U+009F, C2 80..C2 9F)
 * count as invalid: some terminals act on them. */
static size_t utf8_len(const unsigned char *s)
{
    if (s[0] < 0x80)
        return 0;
    size_t n = wb__utf8_seq(s, strnlen((const char *)s, 4));
    if (n == 2 && s[0] == 0xc2 && s[1] <= 0x9f)
        return 0;
    return n;
}

/* The code point of the valid n-byte sequence at s. */
static unsigned utf8_cp(const unsigned char *s, size_t n)
{
    unsigned cp = s[0] & (n == 2 ? 0x1f : n == 3 ? 0x0f : 0x07);
    for (size_t i = 1; i < n; i++)
        cp = (cp << 6) | (s[i] & 0x3f);
    return cp;
}

/* Characters that change how the text around them shows without being
 * seen: Unicode's format characters (general category Cf: bidi embeddings,
 * overrides, isolates and marks, zero-width spaces and joiners, the byte
 * order mark, the soft hyphen, invisible operators, tags), and the line and
 * paragraph separators, which some terminals and viewers break lines at. */
static const struct {
    unsigned lo, hi;
} hidden[] = {
    {0x00ad, 0x00ad},   {0x0600, 0x0605},   {0x061c, 0x061c},   {0x06dd, 0x06dd},
    {0x070f, 0x070f},   {0x0890, 0x0891},   {0x08e2, 0x08e2},   {0x180e, 0x180e},
    {0x200b, 0x200f},   {0x2028, 0x202e},   {0x2060, 0x2064},   {0x2066, 0x206f},
    {0xfeff, 0xfeff},   {0xfff9, 0xfffb},   {0x110bd, 0x110bd}, {0x110cd, 0x110cd},
    {0x13430, 0x1343f}, {0x1bca0, 0x1bca3}, {0x1d173, 0x1d17a}, {0xe0001, 0xe0001},
    {0xe0020, 0xe007f},
};

static int is_hidden(unsigned cp)
{
    for (size_t i = 0; i < sizeof hidden / sizeof hidden[0] && cp >= hidden[i].lo; i++) {
        if (cp <= hidden[i].hi)
            return 1;
    }
    return 0;
}

size_t wb__text_escape(char *out, size_t size, const char *s, unsigned flags)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t o = 0, need = 0;
    int full = 0;
    while (*p) {
        char tmp[16];
        const char *piece = tmp;
        size_t k, n = 1;
        if (*p == '\\' || (*p == '"' && (flags & WB_TEXT_ESCAPE_QUOTE))) {
            tmp[0] = '\\';
            tmp[1] = (char)*p;
            k = 2;
        } else if (*p >= 0x20 && *p < 0x7f) {
            piece = (const char *)p;
            k = 1;
        } else if (*p >= 0x80 && (n = utf8_len(p)) > 0) {
            unsigned cp = utf8_cp(p, n);
            if (is_hidden(cp)) {
                k = (size_t)snprintf(tmp, sizeof tmp, "\\u{%04x}", cp);
            } else {
                piece = (const char *)p;
                k = n;
            }
        } else {
            n = 1;
            k = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", *p);
        }
        if (!full && o + k < size) {
            memcpy(out + o, piece, k);
            o += k;
        } else {
            full = 1;
        }
        need += k;
        p += n;
    }
    if (size)
        out[o] = '\0';
    return need;
}
