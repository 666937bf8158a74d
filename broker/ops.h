/* Request handlers: (broker state, peer credentials, decoded request) ->
 * reply. No sockets here; the event loop packs and sends what they build.
 *
 * Replies are built in an arena (arena.h): everything a handler allocates for
 * one reply is freed at once after packing, while strings and arrays that
 * belong to the broker (tensor tables, names) are pointed to, not copied.
 *
 * This file dispatches and answers the lease operations (hello, acquire,
 * release, heartbeat); listings are in ops_list.c, the administrator's load
 * and unload in ops_admin.c. */
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

/* Handles one request from a peer whose credentials are known. `rep` must be
 * initialised (wbproto__reply__init); the handler sets version, id, status,
 * error and body. `ident` is the requester's transport identity, copied for
 * deferred replies. Returns 0, or WB_OPS_DEFERRED when the reply will come
 * from wb__ops_load_done. */
int wb__ops_handle(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   const void *ident, size_t ident_len, wb_arena *a, Wbproto__Reply *rep);

/* Fills an error reply (for requests refused before any handler runs). */
void wb__ops_error(Wbproto__Reply *rep, wb_arena *a, uint64_t id, int status, const char *msg);

/* Fills a ModelInfo from a model, copying strings into the arena. Returns
 * NULL when out of memory. */
Wbproto__ModelInfo *wb__ops_model_info(const wb_model *m, int state, wb_arena *a);

/* For the handler modules (ops_list.c, ops_admin.c). */

/* Sets an error status with a formatted message and drops any body; 0. */
int wb__ops_fail(Wbproto__Reply *rep, wb_arena *a, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* wb__ops_fail with WB_ENOMEM. */
int wb__ops_oom(Wbproto__Reply *rep, wb_arena *a);
/* A string no peer checked (a process name from /proc, a path from the
 * command line, a message quoting them) as the reply may carry it: s
 * itself when it is valid UTF-8, else a copy in the arena with each
 * invalid byte as U+FFFD, so that strict decoders can read every listing.
 * NULL when out of memory; "" for NULL. */
const char *wb__ops_utf8(wb_arena *a, const char *s);
/* Whether the peer is on the administrator list. */
int wb__ops_is_admin(const wb_broker *b, const wb_peer_creds *peer);
/* Refuses an administrator operation (`verb`) from a peer that is not one,
 * logged with the list it failed. */
int wb__ops_refuse_admin(wb_broker *b, const wb_peer_creds *peer, const char *verb,
                         Wbproto__Reply *rep, wb_arena *a);
/* Which of a copy's packed Lease tails a reply carries. */
enum wb_lease_tail {
    WB_TAIL_TENSORS, /* lease_tail: the tensors as messages */
    WB_TAIL_TABLE,   /* the compact table inside (wb_model.table, not a tail) */
    WB_TAIL_CACHED,  /* cached_tail: tensor_table_cached, no table */
    WB_TAIL_FRAME,   /* frame_tail: tensor_table_in_frame, the table follows */
    WB_TAIL_SHARED,  /* shared_tail: tensor_table_slab, the table in shared memory */
};
/* Points the Lease `lw` (id already set) at one of the packed tails of the
 * model's copy `copy` (wb_model.wire[copy]): it then packs to the same
 * bytes as a Lease with model, the copy's slab and tensors (or
 * tensor_table, or tensor_table_cached) filled in. WB_EINVAL when the model
 * has no such tail, WB_ENOMEM; lw is untouched then. */
int wb__ops_lease_tail(const wb_model *m, unsigned copy, enum wb_lease_tail which,
                       Wbproto__Lease *lw, wb_arena *a);

#endif
