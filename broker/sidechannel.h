/* The descriptor channel: a unix socket beside the ZeroMQ one
 * ("<socket>.fd", same directory, mode 0660) on which a client that holds a
 * lease fetches the descriptors of its slabs (SCM_RIGHTS). It is bound only
 * when the backend hands slabs out as descriptors (--host-slab memfd).
 *
 * A request is a lease id (common/fdwire.h, 20 bytes); nothing else is
 * accepted. The broker answers with the lease's descriptors only when the
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
 * pidfd stays the proof wherever the pid is visible). */
#ifndef WB_BROKER_SIDECHANNEL_H
#define WB_BROKER_SIDECHANNEL_H

#include "broker.h"
#include "err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_side_conn wb_side_conn;

typedef struct wb_sidechan {
    wb_broker *b;
    int lfd;        /* listening socket, -1 when not bound */
    int ep;         /* epoll set of lfd and every connection; the loop waits on it */
    char path[128]; /* fits a sockaddr_un */
    wb_side_conn **v;
    size_t n, cap;
    size_t n_waiting; /* connections that have not sent a request yet */
    unsigned max_conns;
    unsigned handshake_ms;
    uint64_t next_serial;
} wb_sidechan;

/* Binds "<socket_path>.fd" (mode 0660; a stale socket there is replaced, a
 * live one or another file is WB_EEXIST). */
int wb__side_listen(wb_sidechan *s, wb_broker *b, const char *socket_path, unsigned max_conns,
                    unsigned handshake_ms, wb_err *err);

/* Accepts, reads and answers whatever is ready (never blocks). */
void wb__side_handle(wb_sidechan *s);

/* Closes connections that sent no request within handshake_ms. */
void wb__side_expire(wb_sidechan *s);

/* Closes every connection (reclaiming nothing: the broker is stopping),
 * the listener, and unlinks the path. NULL-safe, idempotent. */
void wb__side_destroy(wb_sidechan *s);

#endif
