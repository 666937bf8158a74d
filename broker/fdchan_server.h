/* The descriptor channel: a unix socket beside the ZeroMQ one
 * ("<socket>.fd", same directory, mode 0660) on which a client that holds a
 * lease fetches the descriptors of its slabs (SCM_RIGHTS). It is bound only
 * when the backend hands slabs out as descriptors (--host-slab memfd).
 *
 * A request is a lease id or a session token request (common/fdchan_wire.h, 20
 * bytes); nothing else is accepted. The broker answers with the lease's descriptors only when the
 * connection's SO_PEERCRED (read at accept) is the lease's holder, the same
 * pid and uid; otherwise a status and a reason that the client reports. A
 * request of the wrong shape is answered and the connection closed. Every
 * connection is non-blocking and served from the broker's event loop, with
 * the main socket's bounds: --max-peers connections, --handshake-timeout-ms
 * for the first request, replies that a peer does not read close it.
 *
 * Liveness by connection: a client keeps its connection open for its life,
 * so the kernel closes it when the process dies. When a connection ends,
 * the leases whose descriptors it fetched and that the same process still
 * holds are reclaimed, without the broker needing the process's pid (the
 * pidfd stays the proof wherever the pid is visible). A connection whose
 * pid is visible is bound to its process by a pidfd taken at accept: once
 * that process has exited, the connection (passed on to another process)
 * acts as nobody, and its end reclaims nothing, since its pid may name
 * another process by then; that process's leases end with its own pidfd.
 *
 * Sessions: a connection may ask for its session token (fdchan_wire.h); the
 * client presents it in its ZeroMQ hello, and wb__fdchan_bind then names
 * the ZeroMQ connection's peer by this connection. That is how a process
 * whose pid the broker cannot see (pid 0 from SO_PEERCRED: another pid
 * namespace, a pod without hostPID) gets an identity: the session id
 * (WB_SESSION_ID_BASE + the connection's serial) stands for its pid, with
 * no pidfd. When a connection that handed out its token ends, every lease
 * of its identity is reclaimed (pid or session id). A token is random (16
 * bytes of getrandom), one per connection, bound to the uid (and visible
 * pid) the kernel reported for the connection, and gone with it. */
#ifndef WB_BROKER_FDCHAN_SERVER_H
#define WB_BROKER_FDCHAN_SERVER_H

#include "broker.h"
#include "conn.h"
#include "err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_fdchan_conn wb_fdchan_conn;

typedef struct wb_fdchan_server {
    wb_broker *b;
    int lfd;        /* listening socket, -1 when not bound */
    int ep;         /* epoll set of lfd and every connection; the loop waits on it */
    char path[128]; /* fits a sockaddr_un */
    wb_fdchan_conn **v;
    size_t n, cap;
    size_t n_waiting; /* connections that have not sent a request yet */
    unsigned max_conns;
    unsigned max_per_uid;          /* connections of one uid (root and the broker's aside) */
    unsigned max_sessions_per_uid; /* sessions of one uid whose pid is hidden */
    unsigned handshake_ms;
    uint64_t next_serial;
} wb_fdchan_server;

/* Requests one connection has answered per turn of the event loop, and
 * connections served per turn: the channel never holds the loop from the
 * main socket for longer than that much work. */
#define WB_FDCHAN_REQUESTS_PER_TURN 8
#define WB_FDCHAN_EVENTS_PER_TURN   64

/* Binds "<socket_path>.fd" (mode 0660; a stale socket there is replaced, a
 * live one or another file is WB_EEXIST), with the bounds of `opt`
 * (--max-peers, --max-peers-per-uid, --max-sessions-per-uid,
 * --handshake-timeout-ms). */
int wb__fdchan_listen(wb_fdchan_server *s, wb_broker *b, const char *socket_path,
                      const wb_loop_options *opt, wb_err *err);

/* Accepts, reads and answers what is ready, at most
 * WB_FDCHAN_EVENTS_PER_TURN connections with at most
 * WB_FDCHAN_REQUESTS_PER_TURN requests each (never blocks; what is left is
 * served on the next turn, the channel's descriptor staying readable). A
 * connection of a uid on no allow list, or whose process has exited (it
 * was passed on), gets one refusal and is closed; at most
 * WB_REFUSED_PER_UID such connections of one uid are kept at once. */
void wb__fdchan_handle(wb_fdchan_server *s);

/* Closes connections that sent no request within handshake_ms. */
void wb__fdchan_expire(wb_fdchan_server *s);

/* Binds a ZeroMQ peer (`kernel`: its SO_PEERCRED, known or pid_hidden) to
 * the session whose token is `token` (`len` bytes). On success *out is the
 * identity the peer's requests act as (the session's pid or session id,
 * its uid and gid) and *serial the session's connection, for
 * wb__fdchan_session_alive. WB_EINVAL for a token of the wrong size;
 * WB_EPERM "no session ... has this token", or "the session token belongs
 * to uid U ..., not to this connection's uid V" (or pid). */
int wb__fdchan_bind(wb_fdchan_server *s, const wb_peer_creds *kernel, const uint8_t *token,
                    size_t len, wb_peer_creds *out, uint64_t *serial, wb_err *err);

/* Whether the session connection `serial` is still open. */
int wb__fdchan_session_alive(const wb_fdchan_server *s, uint64_t serial);

/* Closes every connection (reclaiming nothing: the broker is stopping),
 * the listener, and unlinks the path. NULL-safe, idempotent. */
void wb__fdchan_destroy(wb_fdchan_server *s);

#endif
