/* The broker's event loop: one ZeroMQ ROUTER socket on ipc://, a signalfd
 * for SIGTERM/SIGINT, the loader's eventfd, and one pidfd per process that
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

/* Binds the socket (mode 0660), serves until SIGTERM or SIGINT, then shuts
 * down: logs the leases still held, unlinks the socket and every slab name.
 * SIGTERM and SIGINT must already be blocked in every thread. Returns WB_OK
 * after a clean stop, or an error when the socket cannot be set up. Either
 * way the broker's models and leases are freed (wb__broker_destroy). */
int wb__loop_run(wb_broker *b, const char *socket_path, wb_err *err);

#endif
