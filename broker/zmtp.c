#include "zmtp.h"

#include "alloc.h"

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
    z->off = z->len = z->cap = 0;
}

size_t wb__zmtp_buffered(const wb_zmtp *z)
{
    return z->cap;
}

size_t wb__zmtp_pending(const wb_zmtp *z)
{
    return z->len - z->off;
}

size_t wb__zmtp_error_command(uint8_t *buf, const char *reason)
{
    size_t rl = strlen(reason);
    if (rl > WB_ZMTP_MAX_REASON)
        rl = WB_ZMTP_MAX_REASON;
    /* flags, size, name-size, "ERROR", reason-size, reason: the size byte
     * counts 1 + 5 + 1 + rl, at most 262, so a long frame when over 255. */
    size_t body = 1 + 5 + 1 + rl, k = 0;
    if (body <= 255) {
        buf[k++] = F_COMMAND;
        buf[k++] = (uint8_t)body;
    } else {
        buf[k++] = F_COMMAND | F_LONG;
        for (int i = 0; i < 8; i++)
            buf[k++] = (uint8_t)((uint64_t)body >> (56 - 8 * i));
    }
    buf[k++] = 5;
    memcpy(buf + k, "ERROR", 5);
    k += 5;
    buf[k++] = (uint8_t)rl;
    memcpy(buf + k, reason, rl);
    return k + rl;
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

/* Consumes what the last message or command used: the read offset moves,
 * nothing is copied. Once everything received is consumed the offsets
 * start again at 0 and a buffer larger than 4 KiB is given back, so that
 * an idle connection holds (and is charged for) at most 4 KiB. */
static void drop_consumed(wb_zmtp *z)
{
    if (z->consumed == 0)
        return;
    z->off += z->consumed;
    z->consumed = 0;
    z->scan = 0;
    z->frames = 0;
    z->payload = 0;
    if (z->off < z->len)
        return;
    z->off = z->len = 0;
    if (z->cap > 4096) {
        free(z->buf);
        z->buf = NULL;
        z->cap = 0;
    }
}

int wb__zmtp_feed(wb_zmtp *z, const void *data, size_t len, wb_err *err)
{
    if (z->state == WB_ZMTP_FAILED)
        return wb__err_set(err, WB_EPROTO, "the connection already failed");
    drop_consumed(z);
    size_t pending = z->len - z->off;
    if (len > hold_limit(z) - pending)
        return fail(z, err, WB_ELIMIT,
                    "the peer sent %llu bytes that do not make a complete message, over the "
                    "%llu bytes one connection may hold",
                    (unsigned long long)(pending + len), (unsigned long long)hold_limit(z));
    /* The unconsumed rest moves down only when the new bytes would not fit
     * after it: at most once per read, never once per message. */
    if (z->len + len > z->cap && z->off > 0) {
        memmove(z->buf, z->buf + z->off, pending);
        z->len = pending;
        z->off = 0;
    }
    if (z->len + len > z->cap) {
        size_t cap = z->cap ? z->cap : 512;
        while (cap < z->len + len)
            cap *= 2;
        if (cap > hold_limit(z))
            cap = hold_limit(z);
        uint8_t *p = wb__realloc(z->buf, cap);
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
    const uint8_t *g = z->buf + z->off;
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
    z->consumed = WB_ZMTP_GREETING_SIZE;
    z->state = WB_ZMTP_HANDSHAKE;
    put_ready(z);
    return WB_OK;
}

/* Reads a frame header `at` bytes past the read offset: returns 1 and
 * fills flags, header size and body size, 0 when incomplete. */
static int frame_at(const wb_zmtp *z, size_t at, uint8_t *flags, size_t *hl, uint64_t *size)
{
    const uint8_t *p = z->buf + z->off + at;
    size_t avail = z->len - z->off - at;
    if (avail < 2)
        return 0;
    *flags = p[0];
    if (*flags & F_LONG) {
        if (avail < 9)
            return 0;
        *hl = 9;
        *size = get_be64(p + 1);
    } else {
        *hl = 2;
        *size = p[1];
    }
    return 1;
}

static int handle_ready(wb_zmtp *z, const uint8_t *p, size_t n, wb_err *err)
{
    int have_type = 0, have_identity = 0;
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
            if (have_type)
                return fail(z, err, WB_EPROTO, "the peer's READY names Socket-Type twice");
            if (!(vl == 6 && memcmp(val, "DEALER", 6) == 0))
                return fail(z, err, WB_EPROTO, "the peer's socket type is not DEALER (%u bytes)",
                            vl);
            have_type = 1;
        } else if (kl == 8 && strncasecmp((const char *)key, "Identity", 8) == 0) {
            /* Checked, not kept: replies go by connection. */
            if (have_identity)
                return fail(z, err, WB_EPROTO, "the peer's READY names Identity twice");
            if (vl > WB_ZMTP_MAX_IDENTITY)
                return fail(z, err, WB_EPROTO, "the peer's Identity has %u bytes, at most %d", vl,
                            WB_ZMTP_MAX_IDENTITY);
            have_identity = 1;
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
    if (nl == 4 && memcmp(name, "PONG", 4) == 0) {
        /* PONG: the context of a PING, at most 16 bytes. The broker sends
         * no PING, but a peer may answer one it never got. */
        if (dl > 16)
            return fail(z, err, WB_EPROTO, "a PONG of %llu bytes (at most 16)",
                        (unsigned long long)dl);
        return WB_OK;
    }
    if (nl == 5 && memcmp(name, "ERROR", 5) == 0)
        return fail(z, err, WB_EPROTO, "the peer sent ERROR");
    if (nl == 5 && memcmp(name, "READY", 5) == 0)
        return fail(z, err, WB_EPROTO, "the peer sent READY twice");
    /* A DEALER peer sends no other command (SUBSCRIBE and CANCEL are a SUB
     * socket's); the name is shown as printable ASCII only. */
    char shown[32];
    size_t k = 0;
    for (size_t i = 0; i < nl && k + 1 < sizeof shown; i++)
        shown[k++] = name[i] >= 0x21 && name[i] <= 0x7e ? name[i] : '?';
    shown[k] = '\0';
    return fail(z, err, WB_EPROTO, "the peer sent the command '%s' after the handshake", shown);
}

int wb__zmtp_next(wb_zmtp *z, wb_zmtp_msg *msg, wb_err *err)
{
    if (z->state == WB_ZMTP_FAILED)
        return wb__err_set(err, WB_EPROTO, "the connection already failed");
    drop_consumed(z);
    if (z->state == WB_ZMTP_GREETING) {
        if (z->len - z->off < WB_ZMTP_GREETING_SIZE) {
            /* Refuse a wrong signature as soon as it shows. */
            if (z->len > z->off && z->buf[z->off] != 0xff)
                return fail(z, err, WB_EPROTO,
                            "the peer's greeting has no ZMTP 3 signature (first byte 0x%02x)",
                            z->buf[z->off]);
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
            if (z->len - z->off - z->scan - hl < size)
                return 0;
            z->consumed = z->scan + hl + (size_t)size;
            int rc = handle_command(z, z->buf + z->off + z->scan + hl, (size_t)size, err);
            if (rc != WB_OK)
                return rc;
            drop_consumed(z);
            /* Go on parsing what follows the command (a request in the
             * same write must not wait for more bytes); stop only when
             * another answer might not fit. */
            if (sizeof z->out - z->out_len < 64)
                return WB_ZMTP_FLUSH;
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
        if (z->len - z->off - z->scan - hl < size)
            return 0;
        z->frames++;
        z->payload += (size_t)size;
        size_t next = z->scan + hl + (size_t)size;
        if (z->frames == 1) {
            msg->data = z->buf + z->off + z->scan + hl;
            msg->len = (size_t)size;
        }
        z->scan = next;
        if (!(flags & F_MORE)) {
            /* The first frame's header was at offset 0. */
            uint8_t f0 = 0;
            size_t hl0 = 0;
            uint64_t s0 = 0;
            frame_at(z, 0, &f0, &hl0, &s0);
            msg->data = z->buf + z->off + hl0;
            msg->len = (size_t)s0;
            msg->frames = z->frames;
            msg->total = z->payload;
            z->consumed = next;
            return 1;
        }
    }
}
