/* The dispatcher: the checks every request passes (known credentials, the
 * client list, a pid whose process has exited and been reused), then the
 * handler of its body (ops_impl.h). */
#include "ops_impl.h"

#include "log.h"
#include "ratelog.h"

/* The request's kind, for log lines. */
static const char *op_name(int body)
{
    switch (body) {
    case WBPROTO__REQUEST__BODY_HELLO:
        return "hello";
    case WBPROTO__REQUEST__BODY_ACQUIRE:
        return "acquire";
    case WBPROTO__REQUEST__BODY_RELEASE:
        return "release";
    case WBPROTO__REQUEST__BODY_HEARTBEAT:
        return "heartbeat";
    case WBPROTO__REQUEST__BODY_LOAD:
        return "load";
    case WBPROTO__REQUEST__BODY_UNLOAD:
        return "unload";
    case WBPROTO__REQUEST__BODY_ROLLOUT:
        return "rollout";
    case WBPROTO__REQUEST__BODY_ROLLBACK:
        return "rollback";
    case WBPROTO__REQUEST__BODY_SUBSCRIBE:
        return "subscribe";
    case WBPROTO__REQUEST__BODY_PUBLISH_BEGIN:
        return "publish_begin";
    case WBPROTO__REQUEST__BODY_PUBLISH_COMMIT:
        return "publish_commit";
    case WBPROTO__REQUEST__BODY_PUBLISH_ABORT:
        return "publish_abort";
    case WBPROTO__REQUEST__BODY_TIER:
        return "tier";
    default:
        return "other";
    }
}

int wb__ops_handle(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   const void *ident, size_t ident_len, wb_ops_reply *r)
{
    r->msg.version = WB_PROTOCOL_VERSION;
    r->msg.id = req->id;
    r->msg.status = WB_OK;
    if (!peer || !peer->known)
        return wb__ops_fail(r, WB_EPERM, "the peer's credentials cannot be read");
    /* Every operation needs a peer on the client list (administrators are
     * on it); load and unload check the administrator list on top. */
    wb_err aerr;
    if (wb__auth_check_client(&b->auth, peer, &aerr) != WB_OK) {
        char who[200], groups[200];
        b->stats.requests_refused++;
        wb_warn_peer("peer_refused", peer->uid,
                     "reason=not_allowed op=%s uid=%u gid=%u groups=%s pid=%u allowed=\"%s\"",
                     op_name(req->body_case), peer->uid, peer->gid,
                     wb__auth_groups_field(peer, groups, sizeof groups), peer->pid,
                     wb__auth_describe_clients(&b->auth, who, sizeof who));
        return wb__ops_fail(r, WB_EPERM, "%s", aerr.msg);
    }
    /* The process the broker knows as this pid may have exited and the pid
     * been reused: its leases go first, so this request comes from a new
     * process holding none. */
    wb__broker_check_peer(b, peer->pid);
    switch (req->body_case) {
    case WBPROTO__REQUEST__BODY_HELLO:
        return wb__ops_hello(b, peer, req, r);
    case WBPROTO__REQUEST__BODY_ACQUIRE:
        return wb__ops_acquire(b, peer, req, r);
    case WBPROTO__REQUEST__BODY_RELEASE:
        return wb__ops_release(b, peer, req, r);
    case WBPROTO__REQUEST__BODY_HEARTBEAT:
        return wb__ops_heartbeat(b, peer, req, ident, ident_len, r);
    case WBPROTO__REQUEST__BODY_LIST_LEASES:
        return wb__ops_list_leases(b, peer, req, r);
    case WBPROTO__REQUEST__BODY_LIST_CONTAINERS:
        return wb__ops_list_containers(b, peer, req, r);
    case WBPROTO__REQUEST__BODY_LIST_MODELS:
        return wb__ops_list_models(b, r);
    case WBPROTO__REQUEST__BODY_LOAD:
        return wb__ops_load(b, peer, req, ident, ident_len, r);
    case WBPROTO__REQUEST__BODY_UNLOAD:
        return wb__ops_unload(b, peer, req, r);
    case WBPROTO__REQUEST__BODY_STATS:
        return wb__ops_stats(b, r);
    case WBPROTO__REQUEST__BODY_ROLLOUT:
        return wb__ops_rollout(b, peer, req, ident, ident_len, r);
    case WBPROTO__REQUEST__BODY_ROLLBACK:
        return wb__ops_rollback(b, peer, req, r);
    case WBPROTO__REQUEST__BODY_SUBSCRIBE:
        return wb__ops_subscribe(b, req, ident, ident_len, r);
    case WBPROTO__REQUEST__BODY_PUBLISH_BEGIN:
        return wb__ops_publish_begin(b, peer, req, ident, ident_len, r);
    case WBPROTO__REQUEST__BODY_PUBLISH_COMMIT:
        return wb__ops_publish_commit(b, peer, req, ident, ident_len, r);
    case WBPROTO__REQUEST__BODY_PUBLISH_ABORT:
        return wb__ops_publish_abort(b, req, ident, ident_len, r);
    case WBPROTO__REQUEST__BODY_TIER:
        return wb__ops_tier(b, peer, req, r);
    default:
        return wb__ops_fail(r, WB_EPROTO, "request has no body");
    }
}
