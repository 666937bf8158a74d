/* The request handlers' private header: what ops.c dispatches to and the
 * helpers the handler files share. Only ops*.c (and their unit tests)
 * include it; the event loop includes ops.h.
 *
 * Every handler fills the reply context it is given (ops.h) and returns 0,
 * or WB_OPS_DEFERRED (a load); a refusal is a reply too (wb__ops_fail). */
#ifndef WB_BROKER_OPS_IMPL_H
#define WB_BROKER_OPS_IMPL_H

#include "ops.h"

/* Reply helpers (ops_reply.c). */

/* Sets an error status with a formatted message and drops any body and
 * frame; 0. */
int wb__ops_fail(wb_ops_reply *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* wb__ops_fail with WB_ENOMEM. */
int wb__ops_oom(wb_ops_reply *r);
/* A string no peer checked (a process name from /proc, a path from the
 * command line, a message quoting them) as the reply may carry it: s
 * itself when it is valid UTF-8, else a copy in the arena with each
 * invalid byte as U+FFFD, so that strict decoders can read every listing.
 * NULL when out of memory; "" for NULL. */
const char *wb__ops_utf8(wb_arena *a, const char *s);

/* Lease handlers (ops_lease.c). */

int wb__ops_hello(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                  wb_ops_reply *r);
/* The copy on the peer's device, its allow list and quota checked; the
 * reply carries the model's tensor table in the form the request asked for
 * (inside, as the reply's frame, in shared memory, or none when it names
 * the table's digest). */
int wb__ops_acquire(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                    wb_ops_reply *r);
int wb__ops_release(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                    wb_ops_reply *r);
/* Liveness of the peer's leases and their container records, checked whole
 * before anything is applied. */
/* The reply lists the current version of every model the connection
 * (`ident`, its serial) subscribed to. */
int wb__ops_heartbeat(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                      const void *ident, size_t ident_len, wb_ops_reply *r);

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

/* Listing handlers (ops_list.c). Each reply is paged so that it fits the
 * message limit by construction. */

int wb__ops_list_leases(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                        wb_ops_reply *r);
int wb__ops_list_containers(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                            wb_ops_reply *r);
int wb__ops_list_models(wb_broker *b, wb_ops_reply *r);
int wb__ops_stats(wb_broker *b, wb_ops_reply *r);
/* Fills a ModelInfo from a model in `state`, copying strings into the
 * arena (an unload's reply may outlive the model). Returns NULL when out of
 * memory. */
Wbproto__ModelInfo *wb__ops_model_info(const wb_model *m, int state, wb_arena *a);

/* Administrator handlers (ops_admin.c): load (deferred to the loader thread
 * when there is one) and unload. Both check the administrator list first. */

int wb__ops_load(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                 const void *ident, size_t ident_len, wb_ops_reply *r);
int wb__ops_unload(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   wb_ops_reply *r);
/* A load to start (wb__ops_start_load): a LoadRequest's, or a rollout's
 * (a new version beside the current one, `beside`). `replaces`: a failed
 * record of the name, removed when the load starts. */
typedef struct wb_load_start {
    const char *name;
    const char *path;
    int devices[WB_GPU_MAX];
    unsigned n_devices;
    int no_wait;
    int no_share; /* LoadRequest.no_share, or the current version's for a rollout */
    int rollout;
    uint32_t beside;
    wb_model *replaces;
} wb_load_start;
/* Registers the loading model and hands its job to the loader (or runs it
 * inline without one): the same checks (wb__broker_check_job), loader and
 * replies for a load and a rollout. WB_OPS_DEFERRED, or 0 with the reply. */
int wb__ops_start_load(wb_broker *b, const wb_peer_creds *peer, const wb_load_start *ls,
                       const void *ident, size_t ident_len, wb_ops_reply *r);

/* Versions (ops_version.c): rollout (a load beside the current version,
 * deferred as a load is), rollback, and subscriptions (`ident`: the
 * connection's serial). */
int wb__ops_rollout(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                    const void *ident, size_t ident_len, wb_ops_reply *r);
/* `wbctl sleep` / `wbctl wake` (TierRequest; administrators). */
int wb__ops_tier(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                 wb_ops_reply *r);
int wb__ops_rollback(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                     wb_ops_reply *r);
int wb__ops_subscribe(wb_broker *b, const Wbproto__Request *req, const void *ident,
                      size_t ident_len, wb_ops_reply *r);
/* Publishes (ops_publish.c, publish.h): begin (the publisher's right, the
 * table, the limits, the slabs reserved), commit (deferred to the loader
 * thread as a load is; answered by wb__publish_copy_done) and abort, each
 * from the connection (`ident`) that began the publish. */
int wb__ops_publish_begin(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                          const void *ident, size_t ident_len, wb_ops_reply *r);
int wb__ops_publish_commit(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                           const void *ident, size_t ident_len, wb_ops_reply *r);
int wb__ops_publish_abort(wb_broker *b, const Wbproto__Request *req, const void *ident,
                          size_t ident_len, wb_ops_reply *r);

/* The serial of a connection identity (8 bytes), 0 when it is none. */
uint64_t wb__ops_serial(const void *ident, size_t ident_len);

/* Whether the peer is on the administrator list. */
int wb__ops_is_admin(const wb_broker *b, const wb_peer_creds *peer);
/* Refuses an administrator operation (`verb`) from a peer that is not one,
 * logged with the list it failed. */
int wb__ops_refuse_admin(wb_broker *b, const wb_peer_creds *peer, const char *verb,
                         wb_ops_reply *r);

#endif
