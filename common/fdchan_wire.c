#include "fdchan_wire.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

size_t wb__fdchan_take_fds(const struct msghdr *mh, int *fds, size_t max, size_t *taken)
{
    size_t seen = 0, n = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR((struct msghdr *)mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t j = 0; j < k; j++, seen++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + j * sizeof(int), sizeof fd);
            if (n < max)
                fds[n++] = fd;
            else
                close(fd);
        }
    }
    *taken = n;
    return seen;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int wb__fdchan_path(const char *socket_path, char *out, size_t size)
{
    int n = snprintf(out, size, "%s" WB_FDCHAN_SUFFIX, socket_path);
    return n < 0 || (size_t)n >= size ? WB_EINVAL : WB_OK;
}

void wb__fdchan_request_pack(uint8_t out[WB_FDCHAN_REQUEST_LEN], const uint8_t *lease_id)
{
    memcpy(out, WB_FDCHAN_MAGIC, 4);
    memcpy(out + 4, lease_id, WB_LEASE_ID_LEN);
}

void wb__fdchan_session_request_pack(uint8_t out[WB_FDCHAN_REQUEST_LEN])
{
    memset(out, 0, WB_FDCHAN_REQUEST_LEN);
    memcpy(out, WB_FDCHAN_SESSION, 4);
}

void wb__fdchan_publish_request_pack(uint8_t out[WB_FDCHAN_REQUEST_LEN], const uint8_t *publish_id)
{
    memcpy(out, WB_FDCHAN_PUBLISH, 4);
    memcpy(out + 4, publish_id, WB_LEASE_ID_LEN);
}

int wb__fdchan_request_parse(const uint8_t *buf, size_t len, int *kind, uint8_t *lease_id,
                             wb_err *err)
{
    *kind = 0;
    if (len != WB_FDCHAN_REQUEST_LEN)
        return wb__err_set(err, WB_EPROTO, "descriptor request has %zu bytes, not %d", len,
                           WB_FDCHAN_REQUEST_LEN);
    if (memcmp(buf, WB_FDCHAN_SESSION, 4) == 0) {
        for (size_t i = 4; i < len; i++) {
            if (buf[i] != 0)
                return wb__err_set(err, WB_EPROTO,
                                   "session request: byte %zu is 0x%02x, the 16 bytes after "
                                   "\"" WB_FDCHAN_SESSION "\" must be zero",
                                   i, buf[i]);
        }
        *kind = WB_FDCHAN_REQ_SESSION;
        return WB_OK;
    }
    int publish = memcmp(buf, WB_FDCHAN_PUBLISH, 4) == 0;
    if (!publish && memcmp(buf, WB_FDCHAN_MAGIC, 4) != 0)
        return wb__err_set(err, WB_EPROTO,
                           "descriptor request does not start with \"" WB_FDCHAN_MAGIC
                           "\", \"" WB_FDCHAN_SESSION "\" or \"" WB_FDCHAN_PUBLISH "\"");
    memcpy(lease_id, buf + 4, WB_LEASE_ID_LEN);
    *kind = publish ? WB_FDCHAN_REQ_PUBLISH : WB_FDCHAN_REQ_LEASE;
    return WB_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

int wb__session_token_parse(const char *hex, uint8_t token[WB_SESSION_TOKEN_LEN], wb_err *err)
{
    size_t len = strlen(hex);
    if (len != WB_SESSION_TOKEN_HEX)
        return wb__err_set(err, WB_EPROTO, "a session token is %d hex digits, not %zu",
                           WB_SESSION_TOKEN_HEX, len);
    for (size_t i = 0; i < WB_SESSION_TOKEN_LEN; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return wb__err_set(err, WB_EPROTO,
                               "a session token is lowercase hex; character %zu is not", 2 * i);
        token[i] = (uint8_t)(hi << 4 | lo);
    }
    return WB_OK;
}

size_t wb__fdchan_reply_pack(uint8_t out[WB_FDCHAN_REPLY_MAX], int32_t status, uint32_t n_fds,
                             const char *msg)
{
    size_t ml = msg ? strlen(msg) : 0;
    if (ml > WB_FDCHAN_MSG_MAX)
        ml = WB_FDCHAN_MSG_MAX;
    memcpy(out, WB_FDCHAN_MAGIC, 4);
    put32(out + 4, (uint32_t)status);
    put32(out + 8, n_fds);
    put32(out + 12, (uint32_t)ml);
    if (ml)
        memcpy(out + WB_FDCHAN_HEADER_LEN, msg, ml);
    return WB_FDCHAN_HEADER_LEN + ml;
}

int wb__fdchan_header_parse(const uint8_t hdr[WB_FDCHAN_HEADER_LEN], int32_t *status,
                            uint32_t *n_fds, uint32_t *msg_len, wb_err *err)
{
    if (memcmp(hdr, WB_FDCHAN_MAGIC, 4) != 0)
        return wb__err_set(err, WB_EPROTO,
                           "descriptor reply does not start with \"" WB_FDCHAN_MAGIC "\"");
    *status = (int32_t)get32(hdr + 4);
    *n_fds = get32(hdr + 8);
    *msg_len = get32(hdr + 12);
    if (*n_fds > WB_FDCHAN_MAX_FDS)
        return wb__err_set(err, WB_EPROTO, "descriptor reply announces %u descriptors, at most %d",
                           *n_fds, WB_FDCHAN_MAX_FDS);
    if (*msg_len > WB_FDCHAN_MSG_MAX)
        return wb__err_set(err, WB_EPROTO,
                           "descriptor reply announces a %u-byte message, at most %d", *msg_len,
                           WB_FDCHAN_MSG_MAX);
    return WB_OK;
}
