/* The descriptor channel's messages: a client that got a lease over ZeroMQ
 * asks the broker, on the unix socket "<socket>.fd", for the descriptors of
 * the lease's slabs; the broker answers with a status, a message and the
 * descriptors (SCM_RIGHTS, in slab order). Fixed little-endian layouts, so
 * that the broker reads a request of known size and nothing else:
 *
 *   request: "WBF1" | lease id (16 bytes)                      20 bytes
 *            "WBS1" | 16 zero bytes (a session token request)   20 bytes
 *            "WBP1" | publish id (16 bytes), one descriptor     20 bytes
 *                     attached (SCM_RIGHTS): a memfd of host bytes
 *                     for that publish (PublishSource.host_fd: the
 *                     index in the order sent), from the process that
 *                     began it; answered with no descriptor
 *   reply:   "WBF1" | status (int32) | descriptors (uint32)
 *            | message length (uint32) | message (at most 240 bytes)
 *
 * The descriptors travel with the reply's first byte. A connection carries
 * any number of requests, one at a time.
 *
 * A session token request is answered with status 0, no descriptor, and
 * the connection's session token as the message: 32 hex digits of 16
 * random bytes, the same on every request of the connection. The client
 * carries the token in its ZeroMQ hello (HelloRequest.session), which binds
 * that ZeroMQ connection to this one: a process whose pid the broker cannot
 * see (another pid namespace) is known by its session, and its leases end
 * when this connection ends. A broker without sessions answers "WBS1" as a
 * malformed request, so a client falls back to a hello without a token. */
#ifndef WB_FDCHAN_WIRE_H
#define WB_FDCHAN_WIRE_H

#include "err.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

#define WB_FDCHAN_MAGIC       "WBF1"
#define WB_FDCHAN_SESSION     "WBS1"
#define WB_FDCHAN_PUBLISH     "WBP1"
#define WB_FDCHAN_REQUEST_LEN (4 + WB_LEASE_ID_LEN)
#define WB_FDCHAN_HEADER_LEN  16
#define WB_FDCHAN_MSG_MAX     240
#define WB_FDCHAN_REPLY_MAX   (WB_FDCHAN_HEADER_LEN + WB_FDCHAN_MSG_MAX)
/* Descriptors one reply may carry (slabs of one lease). */
#define WB_FDCHAN_MAX_FDS 16
/* A session token's bytes, and its length as hex in a reply. */
#define WB_SESSION_TOKEN_LEN 16
#define WB_SESSION_TOKEN_HEX (2 * WB_SESSION_TOKEN_LEN)
/* Peers known by their session rather than by their pid get an id at or
 * above this, in the fields that otherwise hold a pid (the lease's pid in
 * LeaseInfo, HelloReply.peer_pid): a pid is never that large (Linux caps
 * pids at 2^22). wbctl shows such an id as "conn:N", N = id - BASE. */
#define WB_SESSION_ID_BASE    0x80000000u
#define WB_IS_SESSION_ID(pid) ((uint32_t)(pid) >= WB_SESSION_ID_BASE)
/* The channel's path beside the broker's socket. */
#define WB_FDCHAN_SUFFIX ".fd"

/* The descriptors a received message carried (SCM_RIGHTS in mh's control
 * data): the first `max` into fds, the others closed, so that none leaks.
 * Returns how many came; *taken, how many are in fds. */
struct msghdr;
size_t wb__fdchan_take_fds(const struct msghdr *mh, int *fds, size_t max, size_t *taken);

/* Builds the channel's path, "<socket>.fd". WB_EINVAL when it does not fit
 * `size` bytes. */
int wb__fdchan_path(const char *socket_path, char *out, size_t size);

/* What a request asks for. */
enum { WB_FDCHAN_REQ_LEASE = 1, WB_FDCHAN_REQ_SESSION = 2, WB_FDCHAN_REQ_PUBLISH = 3 };

void wb__fdchan_request_pack(uint8_t out[WB_FDCHAN_REQUEST_LEN], const uint8_t *lease_id);
void wb__fdchan_session_request_pack(uint8_t out[WB_FDCHAN_REQUEST_LEN]);
void wb__fdchan_publish_request_pack(uint8_t out[WB_FDCHAN_REQUEST_LEN], const uint8_t *publish_id);
/* Checks a whole request and says which kind it is (*kind); a lease
 * request's id, or a publish request's, goes to lease_id. WB_EPROTO
 * naming what is wrong. */
int wb__fdchan_request_parse(const uint8_t *buf, size_t len, int *kind, uint8_t *lease_id,
                             wb_err *err);

/* A token from the 32 lowercase hex digits of a session reply's message
 * (wb__text_hex writes them): WB_EPROTO when `hex` is not exactly that. */
int wb__session_token_parse(const char *hex, uint8_t token[WB_SESSION_TOKEN_LEN], wb_err *err);

/* Packs a reply (the message cut at WB_FDCHAN_MSG_MAX bytes); returns its
 * length, at most WB_FDCHAN_REPLY_MAX. */
size_t wb__fdchan_reply_pack(uint8_t out[WB_FDCHAN_REPLY_MAX], int32_t status, uint32_t n_fds,
                             const char *msg);
/* Reads a reply header: WB_EPROTO for a wrong magic, a message longer than
 * WB_FDCHAN_MSG_MAX or more than WB_FDCHAN_MAX_FDS descriptors. */
int wb__fdchan_header_parse(const uint8_t hdr[WB_FDCHAN_HEADER_LEN], int32_t *status,
                            uint32_t *n_fds, uint32_t *msg_len, wb_err *err);

#endif
