/* wbctl, the admin CLI: shared declarations of its subcommands.
 *
 * Exit codes (sysexits where one fits): 0 success, 1 the broker refused,
 * 2 misuse (the broker's WB_EINVAL included: a request typed wrong),
 * 65 malformed input, 66 missing input, 69 no broker answers, 70 an
 * internal error (inspect), 74 a read error, 75 stopped waiting (the operation goes on in the
 * broker), 77 this process may not connect to the socket, 130 interrupted (SIGINT). */
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
    WBCTL_EXIT_SOFTWARE = 70,
    WBCTL_EXIT_IOERR = 74,
    WBCTL_EXIT_TEMPFAIL = 75,
    WBCTL_EXIT_NOPERM = 77,
    WBCTL_EXIT_INTERRUPTED = 130,
};

/* How a listing prints: a table of the default columns, one of every
 * column (-o wide), or JSON (--json, -o json). */
typedef enum wbctl_output {
    WBCTL_OUT_TABLE = 0,
    WBCTL_OUT_WIDE,
    WBCTL_OUT_JSON,
} wbctl_output;

/* Global options, given before the subcommand or among its own options
 * (wbctl_parse_args adds those it finds). */
typedef struct wbctl_globals {
    const char *socket_path; /* --socket, or NULL */
    int timeout_ms;          /* --timeout-ms, or 0 for the default */
    wbctl_output output;     /* --json, -o FORMAT */
    const char *output_opt;  /* the option that chose `output` ("--json", "-o wide"), or NULL */
} wbctl_globals;

/* A string from a peer made safe for a terminal, as wb__text_escape
 * (text.h) writes it: control characters, invalid UTF-8 and characters
 * that reorder or hide text shown as escapes. Returns a malloc'd string the
 * caller frees, or NULL when out of memory. */
char *wbctl_escape(const char *s);

/* The string as valid UTF-8 for JSON output: every byte of invalid UTF-8
 * becomes U+FFFD (wb__utf8_repair; jansson refuses invalid strings).
 * Malloc'd, or NULL. */
char *wbctl_utf8(const char *s);

/* Each subcommand gets argv starting at its own name (argv[0] = "inspect")
 * and returns the process exit code. */
int wbctl_inspect(const wbctl_globals *g, int argc, char **argv);
int wbctl_models(const wbctl_globals *g, int argc, char **argv);
int wbctl_leases(const wbctl_globals *g, int argc, char **argv);
int wbctl_load(const wbctl_globals *g, int argc, char **argv);
int wbctl_unload(const wbctl_globals *g, int argc, char **argv);
int wbctl_rollout(const wbctl_globals *g, int argc, char **argv);
int wbctl_rollback(const wbctl_globals *g, int argc, char **argv);
int wbctl_cancel(const wbctl_globals *g, int argc, char **argv);
int wbctl_sleep(const wbctl_globals *g, int argc, char **argv);
int wbctl_wake(const wbctl_globals *g, int argc, char **argv);
int wbctl_stats(const wbctl_globals *g, int argc, char **argv);
int wbctl_containers(const wbctl_globals *g, int argc, char **argv);
int wbctl_version(const wbctl_globals *g, int argc, char **argv);

#endif
