/* The server side of ZMTP 3.x (rfc.zeromq.org/spec/23 and /37) with the NULL
 * mechanism, as a pure codec: bytes in, complete messages and bytes to send
 * out; no I/O. The broker accepts and reads its unix socket itself, and
 * this codec speaks the protocol to the clients' libzmq DEALER sockets. It
 * exists to bound what one peer can make the broker hold:
 * libzmq's ROUTER buffers a multipart message in its I/O thread until the
 * last frame arrives, with no limit on the number of frames, where this
 * codec refuses the first byte over the limits below.
 *
 * What a connection may buffer here is at most the bytes of one unfinished
 * message (its frames' payloads and headers), at most max_message payload
 * bytes in at most max_frames frames, plus one command of at most
 * WB_ZMTP_MAX_COMMAND bytes and one read of WB_ZMTP_READ_CHUNK bytes. */
#ifndef WB_BROKER_ZMTP_H
#define WB_BROKER_ZMTP_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

#define WB_ZMTP_GREETING_SIZE 64
/* The largest command frame accepted (READY with its properties, PING). */
#define WB_ZMTP_MAX_COMMAND 4096
/* The longest Identity property accepted (ZMQ routing ids are 0..255
 * bytes); the broker addresses replies by connection, so it keeps none. */
#define WB_ZMTP_MAX_IDENTITY 255
/* The longest reason an ERROR command carries (its size is one byte). */
#define WB_ZMTP_MAX_REASON 255
/* The most the caller feeds at once; one connection may hold that much
 * beyond one message, since a read can end in the middle of the next. */
#define WB_ZMTP_READ_CHUNK 65536
/* Room for the bytes the codec asks the caller to send at once: a greeting
 * and a READY, or several PONGs (wb__zmtp_next returns WB_ZMTP_FLUSH when
 * another might not fit). */
#define WB_ZMTP_OUT_MAX 256
/* wb__zmtp_next: out is nearly full; send it, then call again. */
#define WB_ZMTP_FLUSH 2

typedef struct wb_zmtp_limits {
    size_t max_message; /* payload bytes of one message, all frames */
    size_t max_frames;  /* frames of one message */
} wb_zmtp_limits;

typedef enum wb_zmtp_state {
    WB_ZMTP_GREETING = 0, /* waiting for the peer's 64-byte greeting */
    WB_ZMTP_HANDSHAKE,    /* waiting for the peer's READY */
    WB_ZMTP_READY,        /* exchanging messages */
    WB_ZMTP_FAILED        /* a protocol error: the caller disconnects */
} wb_zmtp_state;

typedef struct wb_zmtp {
    wb_zmtp_limits lim;
    wb_zmtp_state state;
    /* Received bytes: buf[off, len) are not yet consumed. Consuming moves
     * off; the rest moves down only when a feed needs the room, so a burst
     * of small messages costs no copy per message. */
    uint8_t *buf;
    size_t off, len, cap;
    size_t consumed; /* bytes after off the last message used, dropped on the next call */
    /* Progress through the frames of the message at buf + off. */
    size_t scan;                  /* offset (from off) of the next frame header to look at */
    size_t frames;                /* frames seen so far in that message */
    size_t payload;               /* payload bytes seen so far in that message */
    uint8_t out[WB_ZMTP_OUT_MAX]; /* bytes to send to the peer */
    size_t out_len;
} wb_zmtp;

/* A complete message. frames > 1 means a multipart message; data/len is its
 * first frame, valid until the next call on the codec. */
typedef struct wb_zmtp_msg {
    const uint8_t *data;
    size_t len;
    size_t frames;
    size_t total; /* payload bytes over all frames */
} wb_zmtp_msg;

/* Starts a connection: out holds the broker's greeting, to be sent first. */
void wb__zmtp_init(wb_zmtp *z, const wb_zmtp_limits *lim);
void wb__zmtp_free(wb_zmtp *z);

/* Bytes of memory the codec holds for this connection (for the aggregate
 * bound): its buffer's capacity, 0 once everything received was consumed. */
size_t wb__zmtp_buffered(const wb_zmtp *z);

/* Received bytes not yet consumed. */
size_t wb__zmtp_pending(const wb_zmtp *z);

/* Appends received bytes. Refuses (WB_ELIMIT, state FAILED) when the
 * unconsumed bytes would exceed what one message and one command may take,
 * WB_ENOMEM when out of memory. */
int wb__zmtp_feed(wb_zmtp *z, const void *data, size_t len, wb_err *err);

/* Advances through the buffered bytes. Returns 1 with *msg filled when a
 * complete message is there, 0 when more bytes are needed (everything
 * received was parsed), WB_ZMTP_FLUSH when the answers to commands fill
 * out (send them, then call again), or a negative code (WB_EPROTO for a
 * protocol error, WB_ELIMIT for a message over the limits; the state is
 * then FAILED) with a message saying what was wrong. Commands are handled
 * inside: READY in the handshake; then PING (answered with PONG), PONG and
 * ERROR (fails) only: any other command from a DEALER peer is a protocol
 * error. After each call, out/out_len may hold bytes to send; the caller
 * sends them and sets out_len to 0. */
int wb__zmtp_next(wb_zmtp *z, wb_zmtp_msg *msg, wb_err *err);

/* Writes an ERROR command (ZMTP 3.1: the reason a peer is refused, which
 * libzmq reports to its user) into buf (room for 3 + WB_ZMTP_MAX_REASON
 * bytes); the reason is cut to WB_ZMTP_MAX_REASON bytes. Returns the size. */
size_t wb__zmtp_error_command(uint8_t *buf, const char *reason);

/* Writes the header of one message frame of `len` bytes into hdr (9 bytes
 * of room): a final one, or with `more` one that another frame of the same
 * message follows. Returns the header's size: 1 + 1 or 1 + 8. */
size_t wb__zmtp_frame_header(uint8_t hdr[9], uint64_t len, int more);

#endif
