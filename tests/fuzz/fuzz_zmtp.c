/* Fuzzes the ZMTP server codec (broker/zmtp.h) with arbitrary bytes, fed
 * in chunks whose sizes the input's first byte chooses, as a connection's
 * reads would split them. Traps when the codec holds more than its bound,
 * delivers a message over the limits, or asks to send more than its output
 * buffer. The input starts past a valid handshake half of the time, so the
 * fuzzer spends its effort on frames too. */
#include "zmtp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t handshake[] = {
    0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 1, 'N', 'U', 'L', 'L', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0,
    /* READY: Socket-Type DEALER, Identity "" */
    0x04, 41, 5, 'R', 'E', 'A', 'D', 'Y', 11, 'S', 'o', 'c', 'k', 'e', 't', '-', 'T', 'y', 'p', 'e',
    0, 0, 0, 6, 'D', 'E', 'A', 'L', 'E', 'R', 8, 'I', 'd', 'e', 'n', 't', 'i', 't', 'y', 0, 0, 0,
    0};

static int feed(wb_zmtp *z, const wb_zmtp_limits *lim, const uint8_t *p, size_t n)
{
    wb_err err;
    if (wb__zmtp_feed(z, p, n, &err) != WB_OK)
        return -1;
    for (;;) {
        wb_zmtp_msg m;
        int rc = wb__zmtp_next(z, &m, &err);
        if (z->out_len > WB_ZMTP_OUT_MAX)
            __builtin_trap();
        z->out_len = 0;
        if (rc < 0) {
            if (z->state != WB_ZMTP_FAILED || !err.msg[0])
                __builtin_trap();
            return -1;
        }
        if (rc == 0)
            return 0;
        if (rc == WB_ZMTP_FLUSH)
            continue;
        if (rc != 1 || wb__zmtp_pending(z) > z->len)
            __builtin_trap();
        if (m.frames == 0 || m.frames > lim->max_frames || m.total > lim->max_message ||
            m.len > m.total)
            __builtin_trap();
        if (m.len)
            (void)(volatile uint8_t)(m.data[0] + m.data[m.len - 1]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const wb_zmtp_limits lim = {.max_message = 4096, .max_frames = 4};
    size_t chunk = (size_t)(data[0] & 0x3f) + 1;
    int skip = data[0] & 0x80;
    data++, size--;
    wb_zmtp z;
    wb__zmtp_init(&z, &lim);
    size_t bound = lim.max_message + 9 * lim.max_frames + 9 + WB_ZMTP_MAX_COMMAND +
                   WB_ZMTP_GREETING_SIZE + WB_ZMTP_READ_CHUNK;
    if (skip && feed(&z, &lim, handshake, sizeof handshake) != 0)
        __builtin_trap();
    if (skip && z.state != WB_ZMTP_READY)
        __builtin_trap();
    for (size_t off = 0; off < size; off += chunk) {
        size_t n = size - off < chunk ? size - off : chunk;
        if (feed(&z, &lim, data + off, n) != 0)
            break;
        if (wb__zmtp_buffered(&z) > bound)
            __builtin_trap();
    }
    wb__zmtp_free(&z);
    return 0;
}
