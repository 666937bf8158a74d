/* wbctl's side of one exchange with the broker: a subcommand's own options
 * and positional arguments, then one request and its reply. */
#ifndef WBCTL_CALL_H
#define WBCTL_CALL_H

#include "rpc.h"
#include "wbctl.h"
#include "wire.h"

#define WBCTL_GLOBAL_OPTS "[--socket PATH] [--timeout-ms MS]"

/* What a subcommand takes besides the global options. */
enum {
    WBCTL_TAKES_WIDE = 1u << 0,  /* -o wide: a table with every column */
    WBCTL_TAKES_MODEL = 1u << 1, /* [MODEL] or --model MODEL: one model's rows only */
    WBCTL_LOCAL = 1u << 2,       /* needs no broker: --help says nothing of --socket */
};

/* A subcommand's own option without an argument ("--no-wait"). */
typedef struct wbctl_flag {
    const char *name; /* "no-wait" for --no-wait */
    const char *help; /* its line in --help, after the option's name */
    int *set;         /* set to 1 when given */
} wbctl_flag;

#define WBCTL_MAX_FLAGS 8

typedef struct wbctl_spec {
    const char *synopsis;         /* after "wbctl": "leases [MODEL] [-o wide] [--json]" */
    const char *about;            /* the paragraph --help prints under the usage line */
    int min_args, max_args;       /* max_args at most 4 */
    const char *const *arg_names; /* for "missing argument NAME"; may be NULL if min_args is 0 */
    unsigned flags;               /* WBCTL_TAKES_* */
    const wbctl_flag *own;        /* the command's own flags, n_own of them (at most 8) */
    size_t n_own;
} wbctl_spec;

/* What wbctl_parse found. */
typedef struct wbctl_args {
    wbctl_output output; /* the global one, or one given among the subcommand's options */
    const char *model;   /* the MODEL filter (WBCTL_TAKES_MODEL), or NULL */
    char *pos[4];        /* the positional arguments (the filter not among them) */
    int npos;
} wbctl_args;

/* Where wbctl_parse puts the global options it meets after a subcommand's
 * name (`wbctl leases --socket S`): main's globals, which the subcommand
 * then reads. Without a call, those options go nowhere. */
void wbctl_bind_globals(wbctl_globals *g);

/* A global option met by getopt_long as `c` (s: --socket, t: --timeout-ms,
 * j: --json, o: -o/--output) with its argument: stored in g. -1 when it was
 * one (stored), 0 when c is no global option, else the exit code after
 * printing why (wbctl_misuse for command `cmd`, NULL before a command). */
int wbctl_global_option(wbctl_globals *g, int c, const char *arg, const char *cmd);

/* Parses a subcommand's argv (argv[0] is its name): its options, the
 * global ones, and spec->min_args to spec->max_args positional arguments.
 * Prints the help on stdout for --help (returns 0). Returns -1 to go on,
 * else the exit code after printing why. */
int wbctl_parse(int argc, char **argv, const wbctl_spec *spec, wbctl_args *out);

/* Parses a subcommand's own options (--json, --help, and the global ones)
 * and exactly `nargs` positional arguments into pos. Returns -1 to go on,
 * else the exit code. */
int wbctl_parse_args(int argc, char **argv, const char *synopsis, const char *about, int nargs,
                     const char *const *arg_names, int *json, char **pos);

/* Misuse: prints "wbctl CMD: MESSAGE" (or "wbctl: MESSAGE" when cmd is
 * NULL) and "Try 'wbctl [CMD] --help'." on stderr, and returns 2. */
int wbctl_misuse(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether wbctl_misuse has printed its "Try" line (main prints one for a
 * subcommand that returned 2 without it). */
int wbctl_misuse_shown(void);

/* The exit code for a request the broker refused with `status`: 2 for
 * WB_EINVAL (the request itself is wrong: a malformed model name or
 * placement, as typed), else 1. */
int wbctl_refusal_exit(int status);

/* One exchange with the broker. Returns -1 with *rep set on success, else
 * the exit code after printing why: 1 when the broker refused, 2 when it
 * refused the request as invalid (WB_EINVAL: typed wrong), 69 when no broker
 * answered, 77 when this process may not connect to the socket. */
int wbctl_call(const wbctl_globals *g, const char *op, Wbproto__Request *req, int timeout_ms,
               Wbproto__Reply **rep);

/* wbctl_call in two halves, for several exchanges on one connection (a
 * listing's pages): wbctl_open connects (-1, else the exit code after
 * printing why; rpc is then closed; a malformed $WB_TIMEOUT_MS, when no
 * --timeout-ms overrides it, is misuse) and wbctl_exchange sends one request
 * (-1 with *rep set, else the exit code as for wbctl_call; a timeout of 0
 * is the one given to wbctl_open). The caller closes rpc with
 * wb__rpc_close. */
int wbctl_open(const wbctl_globals *g, int timeout_ms, wb__rpc *rpc);
int wbctl_exchange(wb__rpc *rpc, const char *op, Wbproto__Request *req, int timeout_ms,
                   Wbproto__Reply **rep);

/* The status (WB_E*) behind the last exit code wbctl_open, wbctl_exchange
 * or wbctl_call returned: WB_ETIMEDOUT when no reply came in time, the
 * broker's own status for a refusal; WB_OK before any failure. For a command
 * that has more to say about one of them. */
int wbctl_last_status(void);

#endif
