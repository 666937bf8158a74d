/* Synchronous request/reply exchanges with the broker over a ZeroMQ DEALER.
 *
 * Internal to libwbclient and wbctl, which link it as the wbrpc library (the
 * only code that calls libzmq: the broker speaks ZMTP itself and links
 * neither); not part of the public API. One wb__rpc
 * is not thread-safe: its owner serialises calls (the client holds its mutex
 * around every call). Every request gets a fresh id; replies with other ids
 * are discarded, except a VersionNotice (Reply.id 0, body `notice`, sent
 * unsolicited to a connection that subscribed), which goes to the rpc's
 * notice hook wherever it is read: while waiting for a reply, in the drain
 * that ends every exchange, or in wb__rpc_drain. On a timeout the socket is closed and re-created,
 * so that a late reply or a request still queued for a dead broker cannot be mistaken for the
 * answer to a later request. */
#ifndef WB_RPC_H
#define WB_RPC_H

#include "err.h"
#include "wire.h"

#include <stdint.h>
#include <sys/un.h>

#define WB_RPC_PATH_MAX sizeof(((struct sockaddr_un *)0)->sun_path)

/* Reconnection backoff: the first retry after this many milliseconds, then
 * doubling up to the cap. */
#define WB_RPC_RECONNECT_MIN_MS 50
#define WB_RPC_RECONNECT_MAX_MS 2000

/* Called with each VersionNotice read on the socket, on the thread that
 * read it (the rpc's owner, under its lock); the notice is freed after. */
typedef void (*wb__rpc_notice_fn)(void *arg, const Wbproto__VersionNotice *notice);

typedef struct wb__rpc {
    void *ctx;
    void *sock; /* NULL after a failed re-creation; the next call retries */
    char path[WB_RPC_PATH_MAX];
    char endpoint[WB_RPC_PATH_MAX + 8];
    uint64_t next_id;
    int timeout_ms; /* default for calls that pass 0 */
    int denied;     /* the last open or reopen failed: this process may not connect */
    /* Counts the sockets opened: each is a new connection to the broker,
     * which knows nothing of the last one's subscriptions. */
    uint64_t generation;
    /* NULL: notices are discarded like replies to nobody. */
    wb__rpc_notice_fn on_notice;
    void *notice_arg;
    /* The socket's connections and disconnections (a PAIR socket on its
     * monitor), NULL where libzmq gave none. A reply awaited is given up
     * (WB_ECONN) as soon as the connection is down and nothing listens on
     * the path any more (the broker died or stopped), instead of at the
     * timeout; looked at every WB_RPC_WATCH_MS. */
    void *mon;
    int down;
} wb__rpc;

#define WB_RPC_WATCH_MS 50

/* Resolves the socket path (see wb__socket_path: `socket_path` may be NULL),
 * checks that it is a socket this process may open and that something
 * listens on it, and connects. Returns WB_ECONN "no broker socket at PATH:
 * <reason>" or "no broker listening at PATH: <reason>" when not, WB_EINVAL
 * for a path that does not fit a socket address. A socket (or a directory
 * on its way) this process may not open is WB_ECONN too, with rpc->denied
 * set and the message "cannot connect to PATH: permission denied: the
 * socket is 0660 root:root and this process is uid U gid G (groups ...)".
 * Nothing is sent yet. On failure rpc is left closed (wb__rpc_close is
 * harmless). */
int wb__rpc_open(wb__rpc *rpc, const char *socket_path, int timeout_ms, wb_err *err);

/* Reconnects after a failed exchange: closes the socket (dropping whatever
 * it still queues), checks the path again as wb__rpc_open does (WB_ECONN at
 * once when nothing listens) and opens a fresh socket. Request ids keep
 * increasing. Nothing is sent. On failure the rpc has no socket; the next
 * call or reopen tries again. */
int wb__rpc_reopen(wb__rpc *rpc, wb_err *err);

/* Closes the socket and the ZeroMQ context. Safe on a closed or zeroed rpc. */
void wb__rpc_close(wb__rpc *rpc);

/* Sends `req` (its version and id are filled in here) and waits up to
 * timeout_ms (0: the rpc's default) for the reply with the same id.
 *
 * Returns 0 with *out set to a reply of the matching kind (free it with
 * wb__reply_free). When the broker answered with an error, returns its
 * status with its message in err and *out still set, so callers can tell a
 * refusal (*out != NULL) from a failed exchange (*out == NULL): WB_ETIMEDOUT,
 * WB_ECONN, WB_EPROTO (malformed reply, or a reply of the wrong kind) or
 * WB_ENOMEM. */
int wb__rpc_call(wb__rpc *rpc, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                 wb_err *err);

/* wb__rpc_call in two halves, for a caller that waits for one reply in
 * slices while it does something else between them (wbctl load watching
 * that the broker lives): wb__rpc_send sends `req` (its version and id
 * filled in, the id also in *id), waiting up to timeout_ms (0: the rpc's
 * default) only when the socket cannot take it now; wb__rpc_wait waits up
 * to timeout_ms (0: not at all) for the reply to request `id`, whose kind
 * must be `body` (the request's body_case). A WB_ETIMEDOUT from
 * wb__rpc_wait leaves the socket as it was, so the reply may still come to
 * the next wait; any other outcome is as for wb__rpc_call. */
int wb__rpc_send(wb__rpc *rpc, Wbproto__Request *req, int timeout_ms, uint64_t *id, wb_err *err);
int wb__rpc_wait(wb__rpc *rpc, uint64_t id, int body, int timeout_ms, Wbproto__Reply **out,
                 wb_err *err);

/* A second frame of a reply message (an acquire's tensor table, when the
 * request asked for Lease.tensor_table_in_frame): its bytes stay in the
 * ZeroMQ message they arrived in, not copied. */
typedef struct wb__frame wb__frame;
const uint8_t *wb__frame_data(const wb__frame *f);
size_t wb__frame_size(const wb__frame *f);
/* Frees the frame; NULL is fine; sets *f to NULL. */
void wb__frame_free(wb__frame **f);

/* wb__rpc_call for a request whose reply may come in two frames: *frame is
 * the second one, or NULL when the reply had one. A reply of more than two
 * frames is discarded whole, as wb__rpc_call discards any of more than
 * one. */
int wb__rpc_call_frame(wb__rpc *rpc, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                       wb__frame **frame, wb_err *err);

/* Sends arbitrary bytes as one frame and returns the first reply that arrives,
 * whatever its id, decoded as by wb__rpc_call (a nonzero status is returned
 * with *out set). For tests and diagnostics of the broker's decoder. */
int wb__rpc_call_raw(wb__rpc *rpc, const uint8_t *buf, size_t len, int timeout_ms,
                     Wbproto__Reply **out, wb_err *err);

/* Reads every message the socket holds now without waiting: notices go
 * to the hook, anything else (a late reply) is dropped. Returns how many
 * notices it handed on. */
int wb__rpc_drain(wb__rpc *rpc);

/* The socket's ZMQ_FD, for poll(2) (edge-triggered: after it polls
 * readable, wb__rpc_drain reads what came), or -1 without a socket. It
 * changes when the socket is re-created (a timeout, a reopen). */
int wb__rpc_fd(const wb__rpc *rpc);

/* Default per-request timeout: $WB_TIMEOUT_MS, or 5000 when it is unset or
 * empty; WB_EINVAL naming it when wb__rpc_parse_timeout refuses it (a
 * typo must not leave a worker with a timeout nobody chose). */
int wb__rpc_default_timeout(int *ms, wb_err *err);

/* A timeout as text: a decimal number of milliseconds from 1 to 86400000
 * (a day), nothing else around it. WB_OK with *ms set, else WB_EINVAL. */
int wb__rpc_parse_timeout(const char *text, int *ms);

#endif
