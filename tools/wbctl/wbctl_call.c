#include "wbctl_call.h"

#include "rpc.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

int wbctl_parse_args(int argc, char **argv, const char *synopsis, const char *about, int nargs,
                     const char *const *arg_names, int *json, char **pos)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0];
    *json = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'j':
            *json = 1;
            break;
        case 'h':
            printf("usage: wbctl " WBCTL_GLOBAL_OPTS " %s\n\n%s\n\n"
                   "  --json     print JSON (for programs) instead of a table\n"
                   "  -h, --help print this help\n"
                   "The global options are described by 'wbctl --help'.\n",
                   synopsis, about);
            return WBCTL_EXIT_OK;
        default:
            if (optopt)
                fprintf(stderr, "wbctl %s: unknown option '-%c'\n", cmd, optopt);
            else
                fprintf(stderr, "wbctl %s: unknown option '%s'\n", cmd, argv[optind - 1]);
            fprintf(stderr, "usage: wbctl " WBCTL_GLOBAL_OPTS " %s\n", synopsis);
            return WBCTL_EXIT_USAGE;
        }
    }
    int have = argc - optind;
    if (have < nargs) {
        fprintf(stderr, "wbctl %s: missing argument %s\nusage: wbctl " WBCTL_GLOBAL_OPTS " %s\n",
                cmd, arg_names[have], synopsis);
        return WBCTL_EXIT_USAGE;
    }
    if (have > nargs) {
        fprintf(stderr,
                "wbctl %s: unexpected argument '%s'\nusage: wbctl " WBCTL_GLOBAL_OPTS " %s\n", cmd,
                argv[optind + nargs], synopsis);
        return WBCTL_EXIT_USAGE;
    }
    for (int i = 0; i < nargs; i++)
        pos[i] = argv[optind + i];
    return -1;
}

int wbctl_open(const wbctl_globals *g, int timeout_ms, wb__rpc *rpc)
{
    wb_err e;
    int rc = wb__rpc_open(rpc, g->socket_path, timeout_ms, &e);
    if (rc == WB_OK)
        return -1;
    wb__rpc_close(rpc);
    fprintf(stderr, "wbctl: %s\n", e.msg);
    return rc == WB_EINVAL ? WBCTL_EXIT_USAGE : WBCTL_EXIT_UNAVAILABLE;
}

int wbctl_exchange(wb__rpc *rpc, const char *op, Wbproto__Request *req, int timeout_ms,
                   Wbproto__Reply **rep)
{
    wb_err e;
    *rep = NULL;
    int rc = wb__rpc_call(rpc, req, timeout_ms, rep, &e);
    if (rc == WB_OK)
        return -1;
    char *msg = wbctl_escape(e.msg);
    fprintf(stderr, "wbctl: %s: %s\n", op, msg ? msg : "(out of memory)");
    free(msg);
    if (*rep) {
        wb__reply_free(rep);
        return WBCTL_EXIT_REFUSED;
    }
    return WBCTL_EXIT_UNAVAILABLE;
}

int wbctl_call(const wbctl_globals *g, const char *op, Wbproto__Request *req, int timeout_ms,
               Wbproto__Reply **rep)
{
    wb__rpc rpc;
    *rep = NULL;
    int rc = wbctl_open(g, timeout_ms, &rpc);
    if (rc >= 0)
        return rc;
    rc = wbctl_exchange(&rpc, op, req, 0, rep);
    wb__rpc_close(&rpc);
    return rc;
}
