/* Administrator handlers: load (deferred to the loader thread when there is
 * one) and unload. Both check the administrator list first. */
#ifndef WB_BROKER_OPS_ADMIN_H
#define WB_BROKER_OPS_ADMIN_H

#include "ops.h"

int wb__ops_load(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                 const void *ident, size_t ident_len, wb_arena *a, Wbproto__Reply *rep);
int wb__ops_unload(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   wb_arena *a, Wbproto__Reply *rep);

/* Builds the deferred reply of a finished load job (after
 * wb__broker_finish_load has recorded its outcome). */
void wb__ops_load_done(wb_broker *b, const wb_load_job *job, wb_model *model, wb_arena *a,
                       Wbproto__Reply *rep);

#endif
