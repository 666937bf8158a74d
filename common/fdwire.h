/* The descriptor channel's messages: a client that got a lease over ZeroMQ
 * asks the broker, on the unix socket "<socket>.fd", for the descriptors of
 * the lease's slabs; the broker answers with a status, a message and the
 * descriptors (SCM_RIGHTS, in slab order). Fixed little-endian layouts, so
 * that the broker reads a request of known size and nothing else:
 *
 *   request: "WBF1" | lease id (16 bytes)                      20 bytes
 *   reply:   "WBF1" | status (int32) | descriptors (uint32)
 *            | message length (uint32) | message (at most 240 bytes)
 *
 * The descriptors travel with the reply's first byte. A connection carries
 * any number of requests, one at a time. */
#ifndef WB_FDWIRE_H
#define WB_FDWIRE_H

#include "err.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

#define WB_FDWIRE_MAGIC       "WBF1"
#define WB_FDWIRE_REQUEST_LEN (4 + WB_LEASE_ID_LEN)
#define WB_FDWIRE_HEADER_LEN  16
#define WB_FDWIRE_MSG_MAX     240
#define WB_FDWIRE_REPLY_MAX   (WB_FDWIRE_HEADER_LEN + WB_FDWIRE_MSG_MAX)
/* Descriptors one reply may carry (slabs of one lease). */
#define WB_FDWIRE_MAX_FDS 16
/* The channel's path beside the broker's socket. */
#define WB_FDWIRE_SUFFIX ".fd"

/* Builds the channel's path, "<socket>.fd". WB_EINVAL when it does not fit
 * `size` bytes. */
int wb__fdwire_path(const char *socket_path, char *out, size_t size);

void wb__fdwire_request_pack(uint8_t out[WB_FDWIRE_REQUEST_LEN], const uint8_t *lease_id);
/* Checks a whole request; WB_EPROTO naming what is wrong. */
int wb__fdwire_request_parse(const uint8_t *buf, size_t len, uint8_t *lease_id, wb_err *err);

/* Packs a reply (the message cut at WB_FDWIRE_MSG_MAX bytes); returns its
 * length, at most WB_FDWIRE_REPLY_MAX. */
size_t wb__fdwire_reply_pack(uint8_t out[WB_FDWIRE_REPLY_MAX], int32_t status, uint32_t n_fds,
                             const char *msg);
/* Reads a reply header: WB_EPROTO for a wrong magic, a message longer than
 * WB_FDWIRE_MSG_MAX or more than WB_FDWIRE_MAX_FDS descriptors. */
int wb__fdwire_header_parse(const uint8_t hdr[WB_FDWIRE_HEADER_LEN], int32_t *status,
                            uint32_t *n_fds, uint32_t *msg_len, wb_err *err);

#endif
