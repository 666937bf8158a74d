/* Encoding and decoding of wire messages (proto/wb.proto), with validation.
 *
 * Decoders never trust the peer: they check the size cap, the protocol
 * version, that exactly one body is present, and field sanity (names
 * non-empty and short, lease ids exactly 16 bytes, repeated fields under
 * their limits). Generated protobuf-c types are named Wbproto__*. */
#ifndef WB_WIRE_H
#define WB_WIRE_H

#include "err.h"
#include "utf8.h"
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
/* The most dimensions a tensor may have (as the safetensors reader
 * enforces); the client sizes shape arrays and strides from it. */
#define WB_MAX_DIMS 64
/* Container records: what a worker really reports (a handful of containers
 * per lease, an AOTI entry point name and a model path each), so that what
 * one client makes the broker keep stays small. */
#define WB_MAX_CONTAINER_RECORDS 16   /* per lease in one heartbeat */
#define WB_MAX_RECORD_API        64   /* bytes of aoti_api, NUL included */
#define WB_MAX_RECORD_PATH       1024 /* bytes of model_path, NUL included */
/* The longest swap a container record may report (ContainerRecord.
 * last_swap_ms): a day. */
#define WB_MAX_SWAP_MS 86400000.0
/* Models one connection may subscribe to (SubscribeRequest). */
#define WB_MAX_SUBSCRIPTIONS 64
/* Publishes (PublishBeginRequest, PublishCommitRequest): tensors of one
 * table (the broker's --max-tensors judges further), tensor names' bytes,
 * sources of one commit, and the publish id's bytes. */
#define WB_PUBLISH_MAX_TENSORS      1000000
#define WB_PUBLISH_NAME_MAX         1024
#define WB_PUBLISH_MAX_SOURCES_WIRE 64
#define WB_PUBLISH_ID_BYTES         16
/* Fields on the wire in one message of a request beyond its own (each
 * once, a repeated one up to its bound): a newer peer's fields this broker
 * does not know, or a field given again. */
#define WB_MAX_UNKNOWN_FIELDS 64
/* wb__request_budget(len) = BASE + PER_BYTE * len: a heartbeat at every
 * bound takes 11 MB (4096 leases of 16 empty records), its strings about
 * their own bytes again. */
#define WB_REQUEST_BUDGET_BASE     (16u << 20)
#define WB_REQUEST_BUDGET_PER_BYTE 4u
/* What listings show of another process's lease id to a non-administrator:
 * its first bytes (8 hex digits), enough to tell leases apart in a table
 * and too few to act on one. */
#define WB_LEASE_ID_PREFIX_LEN 4

/* The request id (field 2) of bytes that are not decoded, found by scanning
 * their top-level fields: for a message protobuf-c refused, or one from a
 * peer whose requests are refused undecoded, so that the reply still echoes
 * it. 0 when it cannot be found before the bytes stop making sense. */
uint64_t wb__request_scan_id(const uint8_t *buf, size_t len);

/* Decodes and validates a request. On success *out is owned by the caller
 * (free with wb__request_free). On failure returns WB_EPROTO or WB_EVERSION
 * (WB_ENOMEM when memory ran out) with a message; *id is set to the
 * request id when it could be read (so the error reply can echo it), else
 * 0.
 *
 * What a peer can make the decoder do before anything is checked is
 * bounded: the wire bytes are walked first and a repeated field with more
 * entries than its bound (wb__request_bound) is refused before protobuf-c
 * allocates anything, naming the field; protobuf-c's allocations are then
 * counted, and a request whose decoding would take more than
 * wb__request_budget(len) bytes (a field that is not repeated given again
 * and again, a flood of unknown fields) is refused. Every string field must
 * be valid UTF-8 ("heartbeat.leases[0].container_records[2].model_path is
 * not valid UTF-8 (byte 17)"). */
int wb__request_decode(const uint8_t *buf, size_t len, Wbproto__Request **out, uint64_t *id,
                       wb_err *err);
/* The same; *peak (when not NULL) gets the most bytes protobuf-c held at
 * once while decoding (0 when the request was refused before). */
int wb__request_decode_ex(const uint8_t *buf, size_t len, Wbproto__Request **out, uint64_t *id,
                          size_t *peak, wb_err *err);
void wb__request_free(Wbproto__Request **req);

/* The most entries repeated field `field` (its number) of message `msg` may
 * have in a request; 0 for a field without a bound, which a request may not
 * carry at all. */
uint32_t wb__request_bound(const ProtobufCMessageDescriptor *msg, uint32_t field);

/* The most bytes decoding a request of len bytes may take: room for a
 * heartbeat at every bound (4096 leases of 16 records), and the strings'
 * bytes (see WB_REQUEST_BUDGET_*). */
size_t wb__request_budget(size_t len);

/* Same for replies, as a client receives them (WB_ENOMEM too; every
 * string field valid UTF-8, "list_models.models[0].copies[1].error is not
 * valid UTF-8 (byte 3)"; the replies' sizes are the broker's to bound). */
int wb__reply_decode(const uint8_t *buf, size_t len, Wbproto__Reply **out, wb_err *err);
void wb__reply_free(Wbproto__Reply **rep);

/* Packs a message into a new malloc'd buffer; returns NULL on ENOMEM. */
uint8_t *wb__request_pack(const Wbproto__Request *req, size_t *len);
uint8_t *wb__reply_pack(const Wbproto__Reply *rep, size_t *len);

/* Human names for enums: "active", "stale"; "loading", "ready", "draining",
 * "freed", "failed"; "host", "cuda". "unknown" for anything else. */
const char *wb__lease_state_name(int state);
const char *wb__model_state_name(int state);
/* How well a version (a record of a model's name: its state, and whether
 * it is current) stands for its name where one must: the current one, else
 * one loading, else a ready one, else one draining, else a failed record.
 * Higher wins; among equals the higher version. The broker's lookup by name
 * and `wbctl models --json` rank alike. */
int wb__version_rank(int state, int current);
const char *wb__backend_name(int backend);

#endif
