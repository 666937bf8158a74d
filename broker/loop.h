/* The broker's event loop: the listening socket and one descriptor per
 * connection (their transport is conn.h), a signalfd for SIGTERM/SIGINT,
 * the loader's eventfd, and an epoll set of the pidfds of the processes the
 * lease table watches, all registered once in one epoll set. Complete
 * requests go to the handlers (ops.h) and their replies back to their
 * connections. */
#ifndef WB_BROKER_LOOP_H
#define WB_BROKER_LOOP_H

#include "broker.h"
#include "conn.h"
#include "err.h"

/* Binds the socket (mode 0660), serves until SIGTERM or SIGINT, then shuts
 * down: logs the leases still held, unlinks the socket and every slab name.
 * SIGTERM and SIGINT must already be blocked in every thread. Returns WB_OK
 * after a clean stop, or an error when the socket cannot be set up. The
 * broker stays its creator's to destroy. */
int wb__loop_run(wb_broker *b, const char *socket_path, const wb_loop_options *opt, wb_err *err);

#endif
