/* The client's end of the broker's descriptor channel (broker/fdchan_server.h,
 * wire layout in common/fdchan_wire.h): the descriptors of a lease's slabs,
 * fetched by lease id over the unix socket "<broker socket>.fd".
 *
 * One connection per broker socket and process, opened at the first fetch
 * and kept open for the life of the process: the broker takes its end (the
 * kernel closes it when the process dies) as the end of every lease
 * fetched through it, even when it cannot see the process's pid. A child
 * after fork() closes its copies at once (pthread_atfork), so that the
 * parent's death still ends them, and opens its own when it fetches. The
 * connections are close-on-exec: exec ends them too (the mappings go with
 * the old image).
 *
 * The same connection carries the process's session (fdchan_wire.h): its token
 * goes in every hello, and names the process to a broker that cannot see
 * its pid (another pid namespace). */
#ifndef WB_FDCHAN_H
#define WB_FDCHAN_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

/* Fetches the descriptors of lease `lease_id` (16 bytes) into fds (at most
 * max_fds; *n_fds says how many, close-on-exec, the caller's to close).
 * The broker's refusal comes back with its status and reason (WB_EPERM
 * "lease ... belongs to pid N ...", WB_ENOTFOUND "no lease ..."); WB_ECONN
 * when the channel cannot be reached; WB_EPROTO for a reply that breaks
 * the layout. `timeout_ms` bounds each exchange. */
int wb__fdchan_fetch(const char *socket_path, const uint8_t *lease_id, int timeout_ms, int *fds,
                     size_t max_fds, size_t *n_fds, wb_err *err);

/* This process's session token on the broker's descriptor channel
 * (WB_SESSION_TOKEN_LEN bytes into `token`), asked for once per
 * connection; a connection the broker closed (it stopped or restarted) is
 * replaced by a fresh one first, with a new token. The broker's refusal
 * comes back with its status and reason; a broker that predates sessions
 * answers WB_EPROTO and the caller goes on without a token. */
int wb__fdchan_session(const char *socket_path, int timeout_ms, uint8_t *token, wb_err *err);

/* Whether the connection that handed out `token` is still open on both
 * ends (a zero-timeout poll): 0 once the broker closed it, or after fork()
 * in the child. */
int wb__fdchan_session_open(const char *socket_path, const uint8_t *token);

/* Sends the memfd `fd` of host bytes for publish `publish_id` (16 bytes)
 * as a "WBP1" request (fdchan_wire.h) and reads the status reply: WB_OK,
 * the broker's refusal with its status and reason, WB_ECONN when the
 * channel cannot be reached, WB_EPROTO for a reply that breaks the layout.
 * `fd` stays the caller's. */
int wb__fdchan_publish(const char *socket_path, const uint8_t *publish_id, int fd, int timeout_ms,
                       wb_err *err);

#endif
