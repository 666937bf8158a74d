/* The ZMTP 3.x server codec (broker/zmtp.h): the handshake with a DEALER,
 * short and long frames fed in any split, multipart counting, PING/PONG,
 * and every refusal: each bound, each protocol error, with its message. */
#include "zmtp.h"

#include <check.h>

#include <stdlib.h>
#include <string.h>

static const wb_zmtp_limits LIM = {.max_message = 1000, .max_frames = 4};

/* A DEALER's greeting (ZMTP 3.minor, NULL). */
static size_t peer_greeting(uint8_t *g, int major, int minor, const char *mech)
{
    memset(g, 0, 64);
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = (uint8_t)major;
    g[11] = (uint8_t)minor;
    memcpy(g + 12, mech, strlen(mech));
    return 64;
}

/* A READY command with Socket-Type `type` and an Identity. */
static size_t peer_ready(uint8_t *p, const char *type, const char *identity)
{
    size_t k = 2;
    p[k++] = 5;
    memcpy(p + k, "READY", 5);
    k += 5;
    p[k++] = 11;
    memcpy(p + k, "Socket-Type", 11);
    k += 11;
    size_t tl = strlen(type);
    p[k++] = 0, p[k++] = 0, p[k++] = 0, p[k++] = (uint8_t)tl;
    memcpy(p + k, type, tl);
    k += tl;
    if (identity) {
        p[k++] = 8;
        memcpy(p + k, "Identity", 8);
        k += 8;
        size_t il = strlen(identity);
        p[k++] = 0, p[k++] = 0, p[k++] = 0, p[k++] = (uint8_t)il;
        memcpy(p + k, identity, il);
        k += il;
    }
    p[0] = 0x04;
    p[1] = (uint8_t)(k - 2);
    return k;
}

/* A codec past the handshake. */
static void ready_codec(wb_zmtp *z)
{
    uint8_t buf[256];
    wb_err err;
    wb_zmtp_msg m;
    wb__zmtp_init(z, &LIM);
    z->out_len = 0;
    size_t n = peer_greeting(buf, 3, 1, "NULL");
    n += peer_ready(buf + n, "DEALER", "abc");
    ck_assert_int_eq(wb__zmtp_feed(z, buf, n, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(z, &m, &err), 0);
    ck_assert_int_eq(z->state, WB_ZMTP_READY);
    z->out_len = 0;
}

START_TEST(test_handshake)
{
    wb_zmtp z;
    wb_err err;
    wb_zmtp_msg m;
    wb__zmtp_init(&z, &LIM);
    /* The greeting goes out first: signature, 3.1, NULL, as-server 0. */
    ck_assert_uint_eq(z.out_len, 64);
    ck_assert_uint_eq(z.out[0], 0xff);
    ck_assert_uint_eq(z.out[9], 0x7f);
    ck_assert_uint_eq(z.out[10], 3);
    ck_assert_uint_eq(z.out[11], 1);
    ck_assert_int_eq(memcmp(z.out + 12, "NULL\0\0\0\0", 8), 0);
    ck_assert_uint_eq(z.out[32], 0);
    z.out_len = 0;

    /* The peer's greeting and READY, one byte at a time. */
    uint8_t buf[256];
    size_t n = peer_greeting(buf, 3, 0, "NULL");
    n += peer_ready(buf + n, "DEALER", "worker-7");
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(wb__zmtp_feed(&z, buf + i, 1, &err), WB_OK);
        ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 0);
        if (i == 63) {
            /* Our READY answers the greeting: Socket-Type ROUTER. */
            ck_assert_int_eq(z.state, WB_ZMTP_HANDSHAKE);
            ck_assert_uint_eq(z.out[0], 0x04);
            ck_assert_uint_eq(z.out[1], z.out_len - 2);
            ck_assert_int_eq(memcmp(z.out + 2, "\x05READY\x0bSocket-Type\0\0\0\x06ROUTER", 27), 0);
            z.out_len = 0;
        }
    }
    ck_assert_int_eq(z.state, WB_ZMTP_READY);
    wb__zmtp_free(&z);
}
END_TEST

START_TEST(test_messages)
{
    wb_zmtp z;
    wb_err err;
    wb_zmtp_msg m;
    ready_codec(&z);
    /* A short frame, then a long one, in one feed. */
    uint8_t buf[2 + 3 + 9 + 600];
    buf[0] = 0, buf[1] = 3;
    memcpy(buf + 2, "abc", 3);
    buf[5] = 0x02;
    memset(buf + 6, 0, 8);
    buf[12] = 600 >> 8, buf[13] = 600 & 0xff;
    memset(buf + 14, 'x', 600);
    ck_assert_int_eq(wb__zmtp_feed(&z, buf, sizeof buf, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 1);
    ck_assert_uint_eq(m.frames, 1);
    ck_assert_uint_eq(m.len, 3);
    ck_assert_int_eq(memcmp(m.data, "abc", 3), 0);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 1);
    ck_assert_uint_eq(m.len, 600);
    ck_assert_uint_eq(m.data[599], 'x');
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 0);

    /* Three frames (MORE, MORE, last): one message of three frames. */
    uint8_t mp[] = {1, 2, 'h', 'i', 1, 0, 0, 1, '!'};
    for (size_t i = 0; i < sizeof mp; i++) {
        ck_assert_int_eq(wb__zmtp_feed(&z, mp + i, 1, &err), WB_OK);
        int rc = wb__zmtp_next(&z, &m, &err);
        ck_assert_int_eq(rc, i + 1 == sizeof mp ? 1 : 0);
    }
    ck_assert_uint_eq(m.frames, 3);
    ck_assert_uint_eq(m.total, 3);
    ck_assert_uint_eq(m.len, 2);
    ck_assert_int_eq(memcmp(m.data, "hi", 2), 0);

    /* PING with a context is answered with PONG and the same context. */
    uint8_t ping[] = {0x04, 9, 4, 'P', 'I', 'N', 'G', 0, 10, 'c', 't'};
    ck_assert_int_eq(wb__zmtp_feed(&z, ping, sizeof ping, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 0);
    ck_assert_uint_eq(z.out_len, 2 + 5 + 2);
    ck_assert_int_eq(memcmp(z.out, "\x04\x07\x04PONGct", 9), 0);
    wb__zmtp_free(&z);

    uint8_t hdr[9];
    ck_assert_uint_eq(wb__zmtp_frame_header(hdr, 255, 0), 2);
    ck_assert_uint_eq(hdr[0], 0);
    ck_assert_uint_eq(hdr[1], 255);
    ck_assert_uint_eq(wb__zmtp_frame_header(hdr, 0x0102030405ULL, 0), 9);
    ck_assert_int_eq(memcmp(hdr, "\x02\x00\x00\x00\x01\x02\x03\x04\x05", 9), 0);
    /* A frame that another of the same message follows: MORE (0x01). */
    ck_assert_uint_eq(wb__zmtp_frame_header(hdr, 7, 1), 2);
    ck_assert_int_eq(memcmp(hdr, "\x01\x07", 2), 0);
    ck_assert_uint_eq(wb__zmtp_frame_header(hdr, 256, 1), 9);
    ck_assert_int_eq(memcmp(hdr, "\x03\x00\x00\x00\x00\x00\x00\x01\x00", 9), 0);
}
END_TEST

/* Feeds `data` to a ready codec and expects `code` with `want` in the
 * message. */
static void refused(const void *data, size_t n, int code, const char *want)
{
    wb_zmtp z;
    wb_err err;
    wb_zmtp_msg m;
    ready_codec(&z);
    int rc = wb__zmtp_feed(&z, data, n, &err);
    if (rc == WB_OK)
        rc = wb__zmtp_next(&z, &m, &err);
    ck_assert_int_eq(rc, code);
    ck_assert_msg(strstr(err.msg, want), "'%s' lacks '%s'", err.msg, want);
    ck_assert_int_eq(z.state, WB_ZMTP_FAILED);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), WB_EPROTO);
    wb__zmtp_free(&z);
}

START_TEST(test_bounds)
{
    /* Five frames with MORE: the fifth is refused, before its body. */
    uint8_t five[] = {1, 1, 'a', 1, 1, 'b', 1, 1, 'c', 1, 1, 'd', 1, 1};
    refused(five, sizeof five, WB_ELIMIT, "a message of more than 4 frames (the limit is 4)");
    /* A frame that announces more than the request limit: refused on its
     * header, nothing of it is buffered. */
    uint8_t big[9] = {0x02, 0, 0, 0, 0, 0xa0, 0, 0, 0};
    refused(big, sizeof big, WB_ELIMIT,
            "a message of at least 2684354560 bytes, over the 1000-byte request limit");
    /* Frames that add up past the limit. */
    uint8_t two[2 + 255 + 9 + 800];
    memset(two, 0, sizeof two);
    two[0] = 1, two[1] = 255;
    two[257] = 0x02, two[264] = 800 >> 8, two[265] = 800 & 0xff;
    refused(two, sizeof two, WB_ELIMIT, "a message of at least 1055 bytes");
    /* A command over 4096 bytes. */
    uint8_t cmd[9] = {0x06, 0, 0, 0, 0, 0, 0, 0x10, 0x01};
    refused(cmd, sizeof cmd, WB_ELIMIT, "a command frame of 4097 bytes, over 4096");
    /* More bytes at once than one connection may hold. */
    size_t n = 1000 + 4 * 9 + 9 + 4096 + 64 + 65536 + 1;
    uint8_t *flood = calloc(1, n);
    ck_assert_ptr_nonnull(flood);
    refused(flood, n, WB_ELIMIT, "bytes one connection may hold");
    free(flood);
}
END_TEST

START_TEST(test_protocol_errors)
{
    uint8_t flags[] = {0x08, 0};
    refused(flags, sizeof flags, WB_EPROTO, "reserved flag bits set (0x08)");
    uint8_t cmore[] = {0x05, 5, 4, 'P', 'O', 'N', 'G'};
    refused(cmore, sizeof cmore, WB_EPROTO, "a command frame has MORE set");
    uint8_t mid[] = {1, 1, 'a', 0x04, 5, 4, 'P', 'O', 'N', 'G'};
    refused(mid, sizeof mid, WB_EPROTO, "a command frame in the middle of a 1-frame message");
    uint8_t ready2[64];
    size_t n = peer_ready(ready2, "DEALER", NULL);
    refused(ready2, n, WB_EPROTO, "the peer sent READY twice");
    uint8_t pingbad[] = {0x04, 6, 4, 'P', 'I', 'N', 'G', 0};
    refused(pingbad, sizeof pingbad, WB_EPROTO, "a PING of 1 bytes");

    /* Handshake errors. */
    struct {
        int major;
        const char *mech, *type;
        const char *want;
    } cases[] = {
        {2, "NULL", "DEALER", "the peer speaks ZMTP 2.1; this broker speaks 3.x"},
        {3, "CURVE", "DEALER", "security mechanism other than NULL"},
        {3, "NULL", "PUB", "the peer's socket type is not DEALER (3 bytes)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wb_zmtp z;
        wb_err err;
        wb_zmtp_msg m;
        uint8_t buf[256];
        wb__zmtp_init(&z, &LIM);
        size_t k = peer_greeting(buf, cases[i].major, 1, cases[i].mech);
        k += peer_ready(buf + k, cases[i].type, NULL);
        ck_assert_int_eq(wb__zmtp_feed(&z, buf, k, &err), WB_OK);
        ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), WB_EPROTO);
        ck_assert_msg(strstr(err.msg, cases[i].want), "'%s' lacks '%s'", err.msg, cases[i].want);
        wb__zmtp_free(&z);
    }
    /* Not ZMTP at all: refused on the first byte. */
    wb_zmtp z;
    wb_err err;
    wb_zmtp_msg m;
    wb__zmtp_init(&z, &LIM);
    ck_assert_int_eq(wb__zmtp_feed(&z, "GET / HTTP/1.0\r\n", 16, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "the peer's greeting has no ZMTP 3 signature (first byte 0x47)");
    wb__zmtp_free(&z);
    /* A message frame before READY. */
    wb__zmtp_init(&z, &LIM);
    uint8_t buf[80];
    size_t k = peer_greeting(buf, 3, 1, "NULL");
    buf[k++] = 0, buf[k++] = 1, buf[k++] = 'x';
    ck_assert_int_eq(wb__zmtp_feed(&z, buf, k, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "a message frame before the handshake ended");
    wb__zmtp_free(&z);
}
END_TEST

/* Commands answered in the middle of the input do not hold back what
 * follows them: a request written with a PING, or with the greeting and
 * READY, is complete at once. */
START_TEST(test_keeps_parsing)
{
    wb_zmtp z;
    wb_err err;
    wb_zmtp_msg m;
    ready_codec(&z);
    uint8_t ping_req[] = {0x04, 7, 4, 'P', 'I', 'N', 'G', 0, 10, 0, 3, 'r', 'e', 'q'};
    ck_assert_int_eq(wb__zmtp_feed(&z, ping_req, sizeof ping_req, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 1);
    ck_assert_uint_eq(m.len, 3);
    ck_assert_int_eq(memcmp(m.data, "req", 3), 0);
    ck_assert_uint_eq(z.out_len, 2 + 5);
    ck_assert_int_eq(memcmp(z.out, "\x04\x05\x04PONG", 7), 0);
    z.out_len = 0;
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 0);
    wb__zmtp_free(&z);

    /* Greeting, READY and a request in one write. */
    wb__zmtp_init(&z, &LIM);
    z.out_len = 0;
    uint8_t buf[256];
    size_t n = peer_greeting(buf, 3, 1, "NULL");
    n += peer_ready(buf + n, "DEALER", NULL);
    buf[n++] = 0, buf[n++] = 2, buf[n++] = 'h', buf[n++] = 'i';
    ck_assert_int_eq(wb__zmtp_feed(&z, buf, n, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 1);
    ck_assert_int_eq(z.state, WB_ZMTP_READY);
    ck_assert_uint_eq(m.len, 2);
    ck_assert_int_eq(memcmp(m.data, "hi", 2), 0);
    ck_assert_uint_eq(z.out[0], 0x04); /* our READY is there to send */
    wb__zmtp_free(&z);

    /* 100 PINGs at once: answered in batches that fit, none lost. */
    ready_codec(&z);
    uint8_t pings[100 * 9];
    for (int i = 0; i < 100; i++)
        memcpy(pings + 9 * i, "\x04\x07\x04PING\0\x0a", 9);
    ck_assert_int_eq(wb__zmtp_feed(&z, pings, sizeof pings, &err), WB_OK);
    size_t pongs = 0;
    int rc, flushes = 0;
    while ((rc = wb__zmtp_next(&z, &m, &err)) == WB_ZMTP_FLUSH) {
        pongs += z.out_len / 7;
        z.out_len = 0;
        flushes++;
    }
    ck_assert_int_eq(rc, 0);
    pongs += z.out_len / 7;
    ck_assert_uint_eq(pongs, 100);
    ck_assert_int_gt(flushes, 0);
    wb__zmtp_free(&z);
}
END_TEST

/* After the handshake a DEALER peer sends PING, PONG and ERROR only. */
START_TEST(test_commands_after_ready)
{
    uint8_t sub[] = {0x04, 11, 9, 'S', 'U', 'B', 'S', 'C', 'R', 'I', 'B', 'E', 'x'};
    refused(sub, sizeof sub, WB_EPROTO,
            "the peer sent the command 'SUBSCRIBE' after the handshake");
    uint8_t odd[] = {0x04, 4, 3, 'a', '\n', 'b'};
    refused(odd, sizeof odd, WB_EPROTO, "the command 'a?b'");
    uint8_t pong[2 + 5 + 17] = {0x04, 5 + 17, 4, 'P', 'O', 'N', 'G'};
    refused(pong, sizeof pong, WB_EPROTO, "a PONG of 17 bytes (at most 16)");
    uint8_t err_cmd[] = {0x04, 8, 5, 'E', 'R', 'R', 'O', 'R', 1, 'x'};
    refused(err_cmd, sizeof err_cmd, WB_EPROTO, "the peer sent ERROR");
    /* A READY naming its type twice. */
    wb_zmtp z;
    wb_err err;
    wb_zmtp_msg m;
    wb__zmtp_init(&z, &LIM);
    uint8_t buf[256];
    size_t n = peer_greeting(buf, 3, 1, "NULL");
    size_t r = peer_ready(buf + n, "DEALER", NULL);
    /* Append a second Socket-Type property and fix the frame size. */
    static const char prop[] = "\x0bSocket-Type\0\0\0\x06"
                               "DEALER";
    memcpy(buf + n + r, prop, sizeof prop - 1);
    buf[n + 1] = (uint8_t)(buf[n + 1] + sizeof prop - 1);
    ck_assert_int_eq(wb__zmtp_feed(&z, buf, n + r + sizeof prop - 1, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "the peer's READY names Socket-Type twice");
    wb__zmtp_free(&z);
}
END_TEST

/* What a connection is charged for is what it holds: nothing once every
 * message was consumed, and consuming moves an offset, not the bytes. */
START_TEST(test_buffer_held)
{
    wb_zmtp z;
    wb_err err;
    wb_zmtp_msg m;
    wb_zmtp_limits lim = {.max_message = 1 << 20, .max_frames = 4};
    wb__zmtp_init(&z, &lim);
    z.out_len = 0;
    uint8_t hs[256];
    size_t n = peer_greeting(hs, 3, 1, "NULL");
    n += peer_ready(hs + n, "DEALER", NULL);
    ck_assert_int_eq(wb__zmtp_feed(&z, hs, n, &err), WB_OK);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 0);
    ck_assert_uint_le(wb__zmtp_buffered(&z), 4096);

    /* One complete 512 KiB request, then silence: once it is consumed the
     * codec holds nothing. */
    size_t big = 512 * 1024;
    uint8_t *req = calloc(1, 9 + big);
    ck_assert_ptr_nonnull(req);
    wb__zmtp_frame_header(req, big, 0);
    ck_assert_int_eq(wb__zmtp_feed(&z, req, 9 + big, &err), WB_OK);
    ck_assert_uint_ge(wb__zmtp_buffered(&z), big);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 1);
    ck_assert_uint_eq(m.len, big);
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 0);
    ck_assert_uint_eq(wb__zmtp_buffered(&z), 0);
    ck_assert_uint_eq(wb__zmtp_pending(&z), 0);
    free(req);

    /* Many small messages in one feed: each one's data follows the last
     * one's in place. */
    uint8_t many[64 * 3];
    for (int i = 0; i < 64; i++)
        many[3 * i] = 0, many[3 * i + 1] = 1, many[3 * i + 2] = (uint8_t)i;
    ck_assert_int_eq(wb__zmtp_feed(&z, many, sizeof many, &err), WB_OK);
    const uint8_t *first = NULL;
    for (int i = 0; i < 64; i++) {
        ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 1);
        ck_assert_uint_eq(m.data[0], (uint8_t)i);
        if (!first)
            first = m.data;
        ck_assert_ptr_eq(m.data, first + 3 * i);
    }
    ck_assert_int_eq(wb__zmtp_next(&z, &m, &err), 0);
    ck_assert_uint_eq(wb__zmtp_pending(&z), 0);
    wb__zmtp_free(&z);
}
END_TEST

START_TEST(test_error_command)
{
    uint8_t buf[3 + 9 + WB_ZMTP_MAX_REASON + 8];
    size_t n = wb__zmtp_error_command(buf, "uid 5 is not allowed");
    ck_assert_uint_eq(n, 2 + 1 + 5 + 1 + 20);
    ck_assert_int_eq(memcmp(buf,
                            "\x04\x1b\x05"
                            "ERROR\x14"
                            "uid 5 is not allowed",
                            n),
                     0);
    char longr[400];
    memset(longr, 'r', sizeof longr - 1);
    longr[sizeof longr - 1] = '\0';
    n = wb__zmtp_error_command(buf, longr);
    ck_assert_uint_eq(n, 9 + 1 + 5 + 1 + WB_ZMTP_MAX_REASON);
    ck_assert_uint_eq(buf[0], 0x06); /* a long command frame */
    ck_assert_uint_eq(buf[7], 1);    /* 262 = 0x0106 */
    ck_assert_uint_eq(buf[8], 6);
    ck_assert_uint_eq(buf[15], WB_ZMTP_MAX_REASON);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("zmtp");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_handshake);
    tcase_add_test(tc, test_messages);
    tcase_add_test(tc, test_bounds);
    tcase_add_test(tc, test_protocol_errors);
    tcase_add_test(tc, test_keeps_parsing);
    tcase_add_test(tc, test_commands_after_ready);
    tcase_add_test(tc, test_buffer_held);
    tcase_add_test(tc, test_error_command);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
