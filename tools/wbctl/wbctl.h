/* wbctl, the admin CLI: shared declarations of its subcommands.
 *
 * Exit codes (sysexits where one fits): 0 success, 1 the broker refused,
 * 2 misuse, 65 malformed input, 66 missing input, 69 no broker answers. */
#ifndef WBCTL_H
#define WBCTL_H

#include <stdio.h>

enum {
    WBCTL_EXIT_OK = 0,
    WBCTL_EXIT_REFUSED = 1,
    WBCTL_EXIT_USAGE = 2,
    WBCTL_EXIT_DATAERR = 65,
    WBCTL_EXIT_NOINPUT = 66,
    WBCTL_EXIT_UNAVAILABLE = 69,
};

/* Global options parsed before the subcommand. */
typedef struct wbctl_globals {
    const char *socket_path; /* --socket, or NULL */
    int timeout_ms;          /* --timeout-ms, or 0 for the default */
} wbctl_globals;

/* Each subcommand gets argv starting at its own name (argv[0] = "inspect")
 * and returns the process exit code. */
int wbctl_inspect(const wbctl_globals *g, int argc, char **argv);
int wbctl_models(const wbctl_globals *g, int argc, char **argv);
int wbctl_leases(const wbctl_globals *g, int argc, char **argv);
int wbctl_load(const wbctl_globals *g, int argc, char **argv);
int wbctl_unload(const wbctl_globals *g, int argc, char **argv);
int wbctl_stats(const wbctl_globals *g, int argc, char **argv);
int wbctl_containers(const wbctl_globals *g, int argc, char **argv);

#endif
