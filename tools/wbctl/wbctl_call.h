/* wbctl's side of one exchange with the broker: a subcommand's own options
 * and positional arguments, then one request and its reply. */
#ifndef WBCTL_CALL_H
#define WBCTL_CALL_H

#include "rpc.h"
#include "wbctl.h"
#include "wire.h"

#define WBCTL_GLOBAL_OPTS "[--socket PATH] [--timeout-ms MS]"

/* Parses a subcommand's own options (--json, --help) and exactly `nargs`
 * positional arguments into pos. Returns -1 to go on, else the exit code. */
int wbctl_parse_args(int argc, char **argv, const char *synopsis, const char *about, int nargs,
                     const char *const *arg_names, int *json, char **pos);

/* One exchange with the broker. Returns -1 with *rep set on success, else
 * the exit code after printing why: 1 when the broker refused, 69 when no
 * broker answered. */
int wbctl_call(const wbctl_globals *g, const char *op, Wbproto__Request *req, int timeout_ms,
               Wbproto__Reply **rep);

/* wbctl_call in two halves, for several exchanges on one connection (a
 * listing's pages): wbctl_open connects (-1, else the exit code after
 * printing why; rpc is then closed) and wbctl_exchange sends one request
 * (-1 with *rep set, else the exit code as for wbctl_call; a timeout of 0
 * is the one given to wbctl_open). The caller closes rpc with
 * wb__rpc_close. */
int wbctl_open(const wbctl_globals *g, int timeout_ms, wb__rpc *rpc);
int wbctl_exchange(wb__rpc *rpc, const char *op, Wbproto__Request *req, int timeout_ms,
                   Wbproto__Reply **rep);

#endif
