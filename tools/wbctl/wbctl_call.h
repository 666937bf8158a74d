/* wbctl's side of one exchange with the broker: a subcommand's own options
 * and positional arguments, then one request and its reply. */
#ifndef WBCTL_CALL_H
#define WBCTL_CALL_H

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

#endif
