/* Request handlers: (broker state, peer credentials, decoded request) ->
 * reply. No sockets here; the event loop packs and sends what they build.
 *
 * Replies are built in an arena: everything a handler allocates for one
 * reply is freed at once after packing, while strings and arrays that belong
 * to the broker (tensor tables, names) are pointed to, not copied. */
#ifndef WB_BROKER_OPS_H
#define WB_BROKER_OPS_H

#include "broker.h"
#include "peer.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_arena_block {
    struct wb_arena_block *next;
    max_align_t data[];
} wb_arena_block;

typedef struct wb_arena {
    wb_arena_block *head;
} wb_arena;

/* Zeroed memory that lives until wb__arena_free; NULL when out of memory. */
void *wb__arena_alloc(wb_arena *a, size_t n);
char *wb__arena_strdup(wb_arena *a, const char *s);
char *wb__arena_printf(wb_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void wb__arena_free(wb_arena *a);

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

/* Builds the deferred reply of a finished load job (after
 * wb__broker_finish_load has recorded its outcome). */
void wb__ops_load_done(wb_broker *b, const wb_load_job *job, wb_model *model, wb_arena *a,
                       Wbproto__Reply *rep);

/* Fills a ModelInfo from a model, copying strings into the arena. Returns
 * NULL when out of memory. */
Wbproto__ModelInfo *wb__ops_model_info(const wb_model *m, int state, wb_arena *a);

#endif
