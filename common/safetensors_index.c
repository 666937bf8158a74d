/* Counting a shard index's entries without parsing it: a JSON tokenizer
 * that keeps only the nesting (one bit per level: object or array), where
 * the next token may go, and whether the object open at depth 2 is the
 * root's weight_map. */
#include "safetensors_index.h"

#include "text.h"

#include <stdbool.h>
#include <string.h>

/* Where the next token may go. */
enum expect {
    EXP_VALUE,        /* the root, after ':' or after ',' in an array */
    EXP_VALUE_OR_END, /* just after '[' */
    EXP_KEY,          /* after ',' in an object */
    EXP_KEY_OR_END,   /* just after '{' */
    EXP_COLON,        /* after a key */
    EXP_COMMA_OR_END, /* after a value in a container */
    EXP_NOTHING,      /* after the root value */
};

typedef struct scan {
    unsigned depth; /* containers open */
    uint8_t objects[WB_ST_INDEX_MAX_DEPTH / 8];
    enum expect expect;
    bool key_is_map; /* the last key at depth 1 was "weight_map" */
    bool in_map;     /* the container open at depth 2 is the weight_map */
    wb_st_index_count n;
} scan;

static bool is_object(const scan *s)
{
    unsigned d = s->depth - 1;
    return (s->objects[d / 8] >> (d % 8)) & 1u;
}

/* The string body s[0, n) (between the quotes, escapes undecoded) spells
 * "weight_map" once decoded. */
static bool is_map_key(const char *s, size_t n)
{
    static const char want[] = "weight_map";
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') {
            if (i + 1 >= n)
                return false;
            char e = s[i + 1];
            if (e == 'u') {
                if (n - i < 6)
                    return false;
                unsigned v = 0;
                for (int h = 0; h < 4; h++) {
                    int x = wb__text_hex_digit(s[i + 2 + h]);
                    if (x < 0)
                        return false;
                    v = v * 16 + (unsigned)x;
                }
                /* Anything else is not ASCII, or a NUL (refused by jansson). */
                if (v == 0 || v >= 0x80)
                    return false;
                c = (unsigned char)v;
                i += 6;
            } else {
                const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
                const char *p = e ? strchr(from, e) : NULL;
                if (!p)
                    return false;
                c = (unsigned char)to[p - from];
                i += 2;
            }
        } else {
            i++;
        }
        if (k >= sizeof want - 1 || (unsigned char)want[k] != c)
            return false;
        k++;
    }
    return k == sizeof want - 1;
}

/* A value starts here: counted where it lies. */
static void count_value(scan *s)
{
    if (s->in_map && s->depth == 2)
        s->n.map_entries++;
    else
        s->n.other_values++;
}

static bool value_expected(const scan *s)
{
    return s->expect == EXP_VALUE || s->expect == EXP_VALUE_OR_END;
}

/* What may follow a value that has just ended. */
static void value_done(scan *s)
{
    s->expect = s->depth == 0 ? EXP_NOTHING : EXP_COMMA_OR_END;
}

static int open_container(scan *s, bool object)
{
    if (!value_expected(s) || s->depth >= WB_ST_INDEX_MAX_DEPTH)
        return -1;
    count_value(s);
    unsigned d = s->depth++;
    if (object)
        s->objects[d / 8] |= (uint8_t)(1u << (d % 8));
    else
        s->objects[d / 8] &= (uint8_t) ~(1u << (d % 8));
    if (s->depth == 2 && object && s->key_is_map)
        s->in_map = true;
    s->key_is_map = false;
    s->expect = object ? EXP_KEY_OR_END : EXP_VALUE_OR_END;
    return 0;
}

static int close_container(scan *s, bool object)
{
    if (s->depth == 0 || is_object(s) != object)
        return -1;
    if (object ? s->expect != EXP_KEY_OR_END && s->expect != EXP_COMMA_OR_END
               : s->expect != EXP_VALUE_OR_END && s->expect != EXP_COMMA_OR_END)
        return -1;
    if (s->depth == 2)
        s->in_map = false;
    s->depth--;
    value_done(s);
    return 0;
}

/* The string opening at buf[i]: a key or a value. Returns the index after
 * its closing quote, or 0 when it does not end or goes nowhere. */
static size_t string_token(scan *s, const char *buf, size_t len, size_t i)
{
    size_t j = i + 1;
    for (;;) {
        if (j >= len)
            return 0;
        if (buf[j] == '"')
            break;
        j += buf[j] == '\\' ? 2 : 1;
    }
    if (s->expect == EXP_KEY || s->expect == EXP_KEY_OR_END) {
        if (s->depth == 1)
            s->key_is_map = is_map_key(buf + i + 1, j - i - 1);
        s->expect = EXP_COLON;
    } else if (value_expected(s)) {
        count_value(s);
        s->key_is_map = false;
        value_done(s);
    } else {
        return 0;
    }
    return j + 1;
}

static bool scalar_char(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
           c == '+' || c == '.';
}

int wb__st_index_count(const char *buf, size_t len, wb_st_index_count *out)
{
    scan s;
    memset(&s, 0, sizeof s);
    s.expect = EXP_VALUE;
    size_t i = 0;
    while (i < len) {
        char c = buf[i];
        int rc = 0;
        switch (c) {
        case ' ':
        case '\t':
        case '\n':
        case '\r':
            i++;
            continue;
        case '{':
        case '[':
            rc = open_container(&s, c == '{');
            i++;
            break;
        case '}':
        case ']':
            rc = close_container(&s, c == '}');
            i++;
            break;
        case ':':
            if (s.expect != EXP_COLON)
                return -1;
            s.expect = EXP_VALUE;
            i++;
            break;
        case ',':
            if (s.expect != EXP_COMMA_OR_END)
                return -1;
            s.expect = is_object(&s) ? EXP_KEY : EXP_VALUE;
            i++;
            break;
        case '"':
            i = string_token(&s, buf, len, i);
            if (i == 0)
                return -1;
            break;
        default:
            /* A number, true, false or null; the parser judges its spelling. */
            if (!scalar_char(c) || !value_expected(&s))
                return -1;
            while (i < len && scalar_char(buf[i]))
                i++;
            /* jansson drops one NUL byte right after a number or literal
             * (the lexer's look-ahead reads it as "buffer empty"): so does
             * the count, or such a text would escape it. */
            if (i < len && buf[i] == '\0')
                i++;
            count_value(&s);
            s.key_is_map = false;
            value_done(&s);
            break;
        }
        if (rc != 0)
            return -1;
    }
    if (s.expect != EXP_NOTHING)
        return -1;
    *out = s.n;
    return 0;
}
