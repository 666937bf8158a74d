#include "zmtp.h"

#include <stdlib.h>
#include <string.h>

/* Frame flags (ZMTP 3.x): bits 7..3 are reserved and must be zero. */
#define F_MORE    0x01
#define F_LONG    0x02
#define F_COMMAND 0x04

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

size_t wb__zmtp_frame_header(uint8_t hdr[9], uint64_t len, int more)
{
    uint8_t flags = more ? F_MORE : 0;
    if (len <= 255) {
        hdr[0] = flags;
        hdr[1] = (uint8_t)len;
        return 2;
    }
    hdr[0] = flags | F_LONG;
    for (int i = 0; i < 8; i++)
        hdr[1 + i] = (uint8_t)(len >> (56 - 8 * i));
    return 9;
}

/* Appends to out; the callers' sizes are fixed and fit WB_ZMTP_OUT_MAX. */
static void out_put(wb_zmtp *z, const void *p, size_t n)
{
    if (n > sizeof z->out - z->out_len)
        return;
    memcpy(z->out + z->out_len, p, n);
    z->out_len += n;
}

static void put_greeting(wb_zmtp *z)
{
    uint8_t g[WB_ZMTP_GREETING_SIZE] = {0};
    g[0] = 0xff; /* signature: 0xff, 8 bytes of padding, 0x7f */
    g[9] = 0x7f;
    g[10] = 3; /* version 3.1 */
    g[11] = 1;
    memcpy(g + 12, "NULL", 4); /* mechanism, zero-padded to 20 bytes */
    /* g[32]: as-server, 0 with NULL; then 31 bytes of filler. */
    out_put(z, g, sizeof g);
}

/* A command frame with no MORE: flags, size, name-size, name, body. */
static void put_command(wb_zmtp *z, const char *name, const uint8_t *body, size_t body_len)
{
    size_t nl = strlen(name);
    uint8_t hdr[2] = {F_COMMAND, (uint8_t)(1 + nl + body_len)};
    out_put(z, hdr, 2);
    uint8_t n = (uint8_t)nl;
    out_put(z, &n, 1);
    out_put(z, name, nl);
    out_put(z, body, body_len);
}

static void put_ready(wb_zmtp *z)
{
    static const char key[] = "Socket-Type", value[] = "ROUTER";
    uint8_t body[1 + sizeof key + 4 + sizeof value];
    size_t k = 0;
    body[k++] = (uint8_t)(sizeof key - 1);
    memcpy(body + k, key, sizeof key - 1);
    k += sizeof key - 1;
    put_be32(body + k, (uint32_t)(sizeof value - 1));
    k += 4;
    memcpy(body + k, value, sizeof value - 1);
    k += sizeof value - 1;
    put_command(z, "READY", body, k);
}

void wb__zmtp_init(wb_zmtp *z, const wb_zmtp_limits *lim)
{
    memset(z, 0, sizeof *z);
    z->lim = *lim;
    if (z->lim.max_frames == 0)
        z->lim.max_frames = 1;
    put_greeting(z);
}

void wb__zmtp_free(wb_zmtp *z)
{
    free(z->buf);
    z->buf = NULL;
    z->len = z->cap = 0;
}

size_t wb__zmtp_buffered(const wb_zmtp *z)
{
    return z->cap;
}

/* Fails the connection with a message saying what the peer did wrong. */
#define fail(z, err, code, ...) ((z)->state = WB_ZMTP_FAILED, wb__err_set(err, code, __VA_ARGS__))

/* The most one connection may hold unconsumed: one whole message with a
 * long header per frame, and one command. */
static size_t hold_limit(const wb_zmtp *z)
{
    size_t frames = z->lim.max_frames;
    return z->lim.max_message + frames * 9 + 9 + WB_ZMTP_MAX_COMMAND + WB_ZMTP_GREETING_SIZE +
           WB_ZMTP_READ_CHUNK;
}

static void drop_consumed(wb_zmtp *z)
{
    if (z->consumed == 0)
        return;
    memmove(z->buf, z->buf + z->consumed, z->len - z->consumed);
    z->len -= z->consumed;
    z->consumed = 0;
    z->scan = 0;
    z->frames = 0;
    z->payload = 0;
    /* Give back a large buffer once the message that needed it is gone. */
    if (z->cap > 65536 && z->len <= 4096) {
        uint8_t *p = realloc(z->buf, 4096);
        if (p) {
            z->buf = p;
            z->cap = 4096;
        }
    }
}

int wb__zmtp_feed(wb_zmtp *z, const void *data, size_t len, wb_err *err)
{
    if (z->state == WB_ZMTP_FAILED)
        return wb__err_set(err, WB_EPROTO, "the connection already failed");
    drop_consumed(z);
    if (len > hold_limit(z) - z->len)
        return fail(z, err, WB_ELIMIT,
                    "the peer sent %llu bytes that do not make a complete message, over the "
                    "%llu bytes one connection may hold",
                    (unsigned long long)(z->len + len), (unsigned long long)hold_limit(z));
    if (z->len + len > z->cap) {
        size_t cap = z->cap ? z->cap : 512;
        while (cap < z->len + len)
            cap *= 2;
        if (cap > hold_limit(z))
            cap = hold_limit(z);
        uint8_t *p = realloc(z->buf, cap);
        if (!p)
            return wb__err_set(err, WB_ENOMEM, "out of memory buffering %zu bytes", z->len + len);
        z->buf = p;
        z->cap = cap;
    }
    memcpy(z->buf + z->len, data, len);
    z->len += len;
    return WB_OK;
}

static int check_greeting(wb_zmtp *z, wb_err *err)
{
    const uint8_t *g = z->buf;
    if (g[0] != 0xff || (g[9] & 1) != 1)
        return fail(z, err, WB_EPROTO,
                    "the peer's greeting has no ZMTP 3 signature (bytes 0x%02x ... 0x%02x)", g[0],
                    g[9]);
    if (g[10] != 3)
        return fail(z, err, WB_EPROTO, "the peer speaks ZMTP %u.%u; this broker speaks 3.x", g[10],
                    g[11]);
    static const uint8_t null_mech[20] = {'N', 'U', 'L', 'L'};
    if (memcmp(g + 12, null_mech, sizeof null_mech) != 0)
        return fail(z, err, WB_EPROTO, "the peer asks for a security mechanism other than NULL");
    z->peer_minor = g[11];
    z->consumed = WB_ZMTP_GREETING_SIZE;
    z->state = WB_ZMTP_HANDSHAKE;
    put_ready(z);
    return WB_OK;
}

/* Reads a frame header at buf[off]: returns 1 and fills flags, header size
 * and body size, 0 when incomplete. */
static int frame_at(const wb_zmtp *z, size_t off, uint8_t *flags, size_t *hl, uint64_t *size)
{
    if (z->len - off < 2)
        return 0;
    *flags = z->buf[off];
    if (*flags & F_LONG) {
        if (z->len - off < 9)
            return 0;
        *hl = 9;
        *size = get_be64(z->buf + off + 1);
    } else {
        *hl = 2;
        *size = z->buf[off + 1];
    }
    return 1;
}

static int handle_ready(wb_zmtp *z, const uint8_t *p, size_t n, wb_err *err)
{
    int have_type = 0;
    while (n > 0) {
        size_t kl = p[0];
        if (kl == 0 || n < 1 + kl + 4)
            return fail(z, err, WB_EPROTO,
                        "the peer's READY has a truncated property (%llu bytes left)",
                        (unsigned long long)n);
        const uint8_t *key = p + 1;
        uint32_t vl = get_be32(p + 1 + kl);
        if (vl > n - 1 - kl - 4)
            return fail(z, err, WB_EPROTO,
                        "the peer's READY has a property value of %llu bytes with %llu left",
                        (unsigned long long)vl, (unsigned long long)(n - 1 - kl - 4));
        const uint8_t *val = p + 1 + kl + 4;
        if (kl == 11 && strncasecmp((const char *)key, "Socket-Type", 11) == 0) {
            if (!(vl == 6 && memcmp(val, "DEALER", 6) == 0))
                return fail(z, err, WB_EPROTO, "the peer's socket type is not DEALER (%u bytes)",
                            vl);
            have_type = 1;
        } else if (kl == 8 && strncasecmp((const char *)key, "Identity", 8) == 0) {
            if (vl > WB_ZMTP_MAX_IDENTITY)
                return fail(z, err, WB_EPROTO, "the peer's Identity has %u bytes, at most %d", vl,
                            WB_ZMTP_MAX_IDENTITY);
            memcpy(z->identity, val, vl);
            z->identity_len = vl;
        }
        n -= 1 + kl + 4 + vl;
        p = val + vl;
    }
    if (!have_type)
        return fail(z, err, WB_EPROTO, "the peer's READY has no Socket-Type");
    z->state = WB_ZMTP_READY;
    return WB_OK;
}

/* One complete command frame's body (name-size, name, data). */
static int handle_command(wb_zmtp *z, const uint8_t *p, size_t n, wb_err *err)
{
    if (n < 1 || p[0] == 0 || (size_t)p[0] > n - 1)
        return fail(z, err, WB_EPROTO, "a command frame of %llu bytes has a bad name size",
                    (unsigned long long)n);
    size_t nl = p[0];
    const char *name = (const char *)p + 1;
    const uint8_t *data = p + 1 + nl;
    size_t dl = n - 1 - nl;
    if (z->state == WB_ZMTP_HANDSHAKE) {
        if (nl == 5 && memcmp(name, "READY", 5) == 0)
            return handle_ready(z, data, dl, err);
        if (nl == 5 && memcmp(name, "ERROR", 5) == 0)
            return fail(z, err, WB_EPROTO, "the peer sent ERROR during the handshake");
        return fail(z, err, WB_EPROTO,
                    "the peer sent a command other than READY during the handshake (%llu-byte "
                    "name)",
                    (unsigned long long)nl);
    }
    if (nl == 4 && memcmp(name, "PING", 4) == 0) {
        /* PING: a 2-byte TTL and up to 16 bytes of context, echoed in PONG. */
        if (dl < 2 || dl > 2 + 16)
            return fail(z, err, WB_EPROTO, "a PING of %llu bytes (2 to 18)",
                        (unsigned long long)dl);
        put_command(z, "PONG", data + 2, dl - 2);
        return WB_OK;
    }
    if (nl == 5 && memcmp(name, "ERROR", 5) == 0)
        return fail(z, err, WB_EPROTO, "the peer sent ERROR");
    if (nl == 5 && memcmp(name, "READY", 5) == 0)
        return fail(z, err, WB_EPROTO, "the peer sent READY twice");
    /* PONG and anything newer: nothing to do. */
    return WB_OK;
}

int wb__zmtp_next(wb_zmtp *z, wb_zmtp_msg *msg, wb_err *err)
{
    if (z->state == WB_ZMTP_FAILED)
        return wb__err_set(err, WB_EPROTO, "the connection already failed");
    drop_consumed(z);
    if (z->state == WB_ZMTP_GREETING) {
        if (z->len < WB_ZMTP_GREETING_SIZE) {
            /* Refuse a wrong signature as soon as it shows. */
            if (z->len >= 1 && z->buf[0] != 0xff)
                return fail(z, err, WB_EPROTO,
                            "the peer's greeting has no ZMTP 3 signature (first byte 0x%02x)",
                            z->buf[0]);
            return 0;
        }
        int rc = check_greeting(z, err);
        if (rc != WB_OK)
            return rc;
        drop_consumed(z);
    }
    for (;;) {
        uint8_t flags;
        size_t hl;
        uint64_t size;
        if (!frame_at(z, z->scan, &flags, &hl, &size))
            return 0;
        if (flags & ~(F_MORE | F_LONG | F_COMMAND))
            return fail(z, err, WB_EPROTO, "a frame has reserved flag bits set (0x%02x)", flags);
        if (flags & F_COMMAND) {
            if (flags & F_MORE)
                return fail(z, err, WB_EPROTO, "a command frame has MORE set (0x%02x)", flags);
            if (z->frames > 0)
                return fail(z, err, WB_EPROTO,
                            "a command frame in the middle of a %llu-frame message",
                            (unsigned long long)z->frames);
            if (size > WB_ZMTP_MAX_COMMAND)
                return fail(z, err, WB_ELIMIT, "a command frame of %llu bytes, over %d",
                            (unsigned long long)size, WB_ZMTP_MAX_COMMAND);
            if (z->len - z->scan - hl < size)
                return 0;
            z->consumed = z->scan + hl + (size_t)size;
            int rc = handle_command(z, z->buf + z->scan + hl, (size_t)size, err);
            if (rc != WB_OK)
                return rc;
            drop_consumed(z);
            if (z->out_len > 0)
                return 0; /* let the caller send the answer before going on */
            continue;
        }
        if (z->state != WB_ZMTP_READY)
            return fail(z, err, WB_EPROTO, "a message frame before the handshake ended");
        if (z->frames + 1 > z->lim.max_frames)
            return fail(z, err, WB_ELIMIT, "a message of more than %llu frames (the limit is %llu)",
                        (unsigned long long)z->frames, (unsigned long long)z->lim.max_frames);
        if (size > z->lim.max_message - z->payload)
            return fail(z, err, WB_ELIMIT,
                        "a message of at least %llu bytes, over the %llu-byte request limit",
                        (unsigned long long)(z->payload + size),
                        (unsigned long long)z->lim.max_message);
        if (z->len - z->scan - hl < size)
            return 0;
        z->frames++;
        z->payload += (size_t)size;
        size_t next = z->scan + hl + (size_t)size;
        if (z->frames == 1) {
            msg->data = z->buf + z->scan + hl;
            msg->len = (size_t)size;
        }
        z->scan = next;
        if (!(flags & F_MORE)) {
            /* The first frame's header was at offset 0. */
            uint8_t f0 = 0;
            size_t hl0 = 0;
            uint64_t s0 = 0;
            frame_at(z, 0, &f0, &hl0, &s0);
            msg->data = z->buf + hl0;
            msg->len = (size_t)s0;
            msg->frames = z->frames;
            msg->total = z->payload;
            z->consumed = next;
            return 1;
        }
    }
}
