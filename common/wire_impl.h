/* What wire.c and wire_scan.c share: the decoding of a request in steps
 * (wb__request_decode_ex is wire.c's), and the field paths of messages. */
#ifndef WB_WIRE_IMPL_H
#define WB_WIRE_IMPL_H

#include "err.h"
#include "wb.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* Bytes protobuf-c would refuse as well (wb__wire_scan_request). */
#define WB_WIRE_MALFORMED 1

/* Walks a request's bytes before they are decoded: every message's fields
 * counted against what it may hold, each repeated field against its bound
 * (wb__request_bound), no allocation. WB_OK; WB_EPROTO naming the field
 * ("heartbeat has 5000 leases, at most 4096"); WB_WIRE_MALFORMED. */
int wb__wire_scan_request(const uint8_t *buf, size_t len, wb_err *err);

/* Unpacks bytes that wb__wire_scan_request passed, protobuf-c's allocations
 * counted against wb__request_budget(len): NULL when it refuses them, with
 * *over set when the budget ran out and *nomem when the allocator said no;
 * *peak is the most bytes held at once. Free the request with
 * wb__wire_free_request. */
Wbproto__Request *wb__wire_unpack_request(const uint8_t *buf, size_t len, size_t *peak, int *over,
                                          int *nomem);
void wb__wire_free_request(Wbproto__Request *req);

/* Appends "name" or "name[k]" (k != SIZE_MAX) to the path of len bytes;
 * returns the new length (the path is cut short rather than overflowed). */
size_t wb__wire_path_push(char *path, size_t cap, size_t len, const char *name, size_t k);

/* A name or text field: 1 to `max` bytes, no control character;
 * WB_EPROTO naming `field` otherwise. */
int wb__wire_check_text(const char *field, const char *s, size_t max, wb_err *err);

/* The publish messages' checks (wire_publish.c): WB_OK or WB_EPROTO
 * naming the field. */
int wb__wire_check_publish_begin(const Wbproto__PublishBeginRequest *rq, wb_err *err);
int wb__wire_check_publish_commit(const Wbproto__PublishCommitRequest *rq, wb_err *err);
int wb__wire_check_publish_abort(const Wbproto__PublishAbortRequest *rq, wb_err *err);
/* A publish reply's body (publish_begin, publish_commit or publish_abort). */
int wb__wire_check_publish_reply(const Wbproto__Reply *rep, wb_err *err);

#endif
