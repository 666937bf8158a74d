/* Listing handlers: leases, containers, models and the counters. Each reply
 * is paged so that it fits the message limit by construction. */
#ifndef WB_BROKER_OPS_LIST_H
#define WB_BROKER_OPS_LIST_H

#include "ops.h"

int wb__ops_list_leases(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                        wb_arena *a, Wbproto__Reply *rep);
int wb__ops_list_containers(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                            wb_arena *a, Wbproto__Reply *rep);
int wb__ops_list_models(wb_broker *b, wb_arena *a, Wbproto__Reply *rep);
int wb__ops_stats(wb_broker *b, wb_arena *a, Wbproto__Reply *rep);

#endif
