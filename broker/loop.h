/* The broker's event loop: the listening socket and one descriptor per
 * connection (their transport is conn.h), a signalfd for the signals the
 * broker handles (signals.h), the loader's eventfd, and an epoll set of the
 * pidfds of the processes the lease table watches, all registered once in
 * one epoll set. Complete requests go to the handlers (ops.h) and their
 * replies back to their connections. */
#ifndef WB_BROKER_LOOP_H
#define WB_BROKER_LOOP_H

#include "broker.h"
#include "conn.h"
#include "err.h"

/* What SIGHUP does: fn(ctx, b) runs on the loop's thread between two turns,
 * with systemd told RELOADING=1 before it and READY=1 after (sd_notify).
 * `fn` NULL: the signal is logged and otherwise ignored. */
typedef struct wb_loop_reload {
    void (*fn)(void *ctx, wb_broker *b);
    void *ctx;
} wb_loop_reload;

/* Binds the socket (mode 0660), serves until a stop signal (signals.h:
 * SIGTERM, SIGINT, SIGQUIT, ...), then shuts down: logs the signal and how
 * many leases, peers and models are still held (event=stop), abandons the
 * loads under way, unlinks the socket; the caller's wb__broker_destroy
 * unlinks every slab name. Signals are read from a signalfd: they must
 * already be blocked in every thread (wb__signals_block). `reload` may be
 * NULL. Returns WB_OK after a clean stop, or an error when the socket
 * cannot be set up. The broker stays its creator's to destroy. */
int wb__loop_run(wb_broker *b, const char *socket_path, const wb_loop_options *opt,
                 const wb_loop_reload *reload, wb_err *err);

#endif
