/* Encoding and decoding of wire messages (proto/wb.proto), with validation.
 *
 * Decoders never trust the peer: they check the size cap, the protocol
 * version, that exactly one body is present, and field sanity (names
 * non-empty and short, lease ids exactly 16 bytes, repeated fields under
 * their limits). Generated protobuf-c types are named Wbproto__*. */
#ifndef WB_WIRE_H
#define WB_WIRE_H

#include "err.h"
#include "wb.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#define WB_PROTOCOL_VERSION 1
/* Default cap on one message, both directions (ZMQ_MAXMSGSIZE on the broker). */
#define WB_MAX_MESSAGE  (64u * 1024u * 1024u)
#define WB_LEASE_ID_LEN 16
#define WB_NAME_MAX     255 /* model names, tensor names are checked by the loader */
#define WB_PATH_MAX     4096
#define WB_MAX_BEATS    4096 /* leases in one heartbeat */
/* Container records: what a worker really reports (a handful of containers
 * per lease, an AOTI entry point name and a model path each), so that what
 * one client makes the broker keep stays small. */
#define WB_MAX_CONTAINER_RECORDS 16   /* per lease in one heartbeat */
#define WB_MAX_RECORD_API        64   /* bytes of aoti_api, NUL included */
#define WB_MAX_RECORD_PATH       1024 /* bytes of model_path, NUL included */
/* What listings show of another process's lease id to a non-administrator:
 * its first bytes (8 hex digits), enough to tell leases apart in a table
 * and too few to act on one. */
#define WB_LEASE_ID_PREFIX_LEN 4

/* Decodes and validates a request. On success *out is owned by the caller
 * (free with wb__request_free). On failure returns WB_EPROTO or WB_EVERSION
 * with a message; *id is set to the request id when it could be read (so the
 * error reply can echo it), else 0. */
int wb__request_decode(const uint8_t *buf, size_t len, Wbproto__Request **out, uint64_t *id,
                       wb_err *err);
void wb__request_free(Wbproto__Request **req);

/* Same for replies, as a client receives them. */
int wb__reply_decode(const uint8_t *buf, size_t len, Wbproto__Reply **out, wb_err *err);
void wb__reply_free(Wbproto__Reply **rep);

/* Packs a message into a new malloc'd buffer; returns NULL on ENOMEM. */
uint8_t *wb__request_pack(const Wbproto__Request *req, size_t *len);
uint8_t *wb__reply_pack(const Wbproto__Reply *rep, size_t *len);

/* Human names for enums: "active", "stale"; "loading", "ready", "draining",
 * "freed", "failed"; "host", "cuda". "unknown" for anything else. */
const char *wb__lease_state_name(int state);
const char *wb__model_state_name(int state);
const char *wb__backend_name(int backend);

#endif
