/* The broker's event loop: the listening unix socket the clients' ZeroMQ
 * DEALER sockets connect to (ipc://) and one descriptor per connection,
 * spoken to in ZMTP 3 through the codec in zmtp.h; a signalfd for
 * SIGTERM/SIGINT, the loader's eventfd, and one pidfd per process that
 * holds leases, all in one zmq_poll. */
#ifndef WB_BROKER_LOOP_H
#define WB_BROKER_LOOP_H

#include "broker.h"
#include "err.h"

/* Gets the socket path ready for binding: creates missing parent
 * directories (mode 0750), refuses with WB_EEXIST when a broker answers on
 * the path or when the path is something other than a socket, and removes a
 * socket file that nothing answers on. */
int wb__socket_prepare(const char *path, wb_err *err);

/* Transport bounds: what peers can make the broker hold. */
typedef struct wb_loop_options {
    unsigned max_peers;     /* connections at once; more are closed at once */
    size_t max_request;     /* payload bytes of one incoming message */
    unsigned max_frames;    /* frames of one incoming message */
    size_t max_buffered;    /* bytes of unfinished messages over all connections */
    int max_queued_replies; /* replies queued for one peer (send high-water mark) */
} wb_loop_options;

/* Binds the socket (mode 0660), serves until SIGTERM or SIGINT, then shuts
 * down: logs the leases still held, unlinks the socket and every slab name.
 * SIGTERM and SIGINT must already be blocked in every thread. Returns WB_OK
 * after a clean stop, or an error when the socket cannot be set up. The
 * broker stays its creator's to destroy. */
int wb__loop_run(wb_broker *b, const char *socket_path, const wb_loop_options *opt, wb_err *err);

#endif
