/* Request handlers as the event loop sees them: (broker state, peer
 * credentials, decoded request) -> reply. No sockets here; the loop packs
 * and sends what they build.
 *
 * Each request gets its own reply context (wb_ops_reply): the Reply message,
 * the arena everything the handler allocates for it lives in (freed at once
 * after packing; strings and arrays that belong to the broker, such as tensor
 * tables and names, are pointed to, not copied), and the second frame the
 * reply may carry. Nothing of a reply is kept in the broker between requests.
 *
 * ops.c dispatches; the handlers are in ops_lease.c (hello, acquire, release,
 * heartbeat), ops_list.c (listings) and ops_admin.c (load, unload), and the
 * reply helpers in ops_reply.c; ops_impl.h is their private header. */
#ifndef WB_BROKER_OPS_H
#define WB_BROKER_OPS_H

#include "arena.h"
#include "broker.h"
#include "peer.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

/* Returned by wb__ops_handle when the reply comes later (a load). */
#define WB_OPS_DEFERRED 1

/* One request's reply, from the handler to the send. `msg` and what it
 * points to live in `arena` or in broker state. `frame`, when not NULL, is
 * sent unchanged after the message as its second frame (an acquire's tensor
 * table, Lease.tensor_table_in_frame); it points into the model, which
 * outlives the send (what the socket does not take at once is copied). An
 * error reply carries no frame. The caller owns the context;
 * wb__ops_reply_free releases what it holds. */
typedef struct wb_ops_reply {
    Wbproto__Reply msg;
    wb_arena arena;
    const void *frame;
    size_t frame_len; /* 0 without a frame */
    /* An error message when the arena has no room for it (ASCII). */
    char errbuf[WB_ERR_MSG_MAX];
} wb_ops_reply;

#define WB_OPS_REPLY_INIT                                                                          \
    {                                                                                              \
        .msg = WBPROTO__REPLY__INIT                                                                \
    }

/* Frees the context's arena and makes it an empty one again (as
 * WB_OPS_REPLY_INIT), so that nothing of this reply reaches another. */
void wb__ops_reply_free(wb_ops_reply *r);

/* Handles one request from a peer whose credentials are known, into `r`
 * (empty: WB_OPS_REPLY_INIT); the handler sets the message's version, id,
 * status, error and body, and the frame. `ident` is the requester's transport
 * identity, copied for deferred replies. Returns 0, or WB_OPS_DEFERRED when
 * the reply will come from wb__ops_load_done (r then holds nothing to send). */
int wb__ops_handle(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   const void *ident, size_t ident_len, wb_ops_reply *r);

/* Makes `r` an error reply to request `id` (for requests refused before any
 * handler runs, and for a reply that would not fit): any body and frame are
 * dropped. `msg` NULL: wb_strerror(status). */
void wb__ops_error(wb_ops_reply *r, uint64_t id, int status, const char *msg);

/* Builds into `r` the deferred reply of a finished load job (after
 * wb__broker_finish_load has recorded its outcome; `model` is what it
 * returned). */
void wb__ops_load_done(wb_broker *b, const wb_load_job *job, wb_model *model, wb_ops_reply *r);

#endif
