/* wbctl: the weightbroker admin CLI. */
#include "wbctl.h"

#include "log.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*wbctl_cmd_fn)(const wbctl_globals *g, int argc, char **argv);

struct wbctl_cmd {
    const char *name;
    wbctl_cmd_fn fn;
    const char *summary;
};

static const struct wbctl_cmd commands[] = {
    {"models", wbctl_models, "list the broker's models"},
    {"leases", wbctl_leases, "list the leases the broker has granted"},
    {"containers", wbctl_containers, "list the AOTI model containers built on leases"},
    {"load", wbctl_load, "load a safetensors checkpoint as a model"},
    {"unload", wbctl_unload, "unload a model (it drains while leases remain)"},
    {"cancel", wbctl_cancel, "stop a model's load in progress"},
    {"stats", wbctl_stats, "print the broker's counters"},
    {"inspect", wbctl_inspect, "print the tensor table of a safetensors checkpoint"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: wbctl [--socket PATH] [--timeout-ms MS] COMMAND [ARGS]\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\noptions (before the command):\n"
                 "  --socket PATH      the broker's socket (see below)\n"
                 "  --timeout-ms MS    how long to wait for each reply (default $WB_TIMEOUT_MS,\n"
                 "                     else 5000); load waits while the broker loads,\n"
                 "                     or up to MS when given\n"
                 "  -h, --help         print this help\n");
    fprintf(out, "\nRun 'wbctl COMMAND --help' for a command's options.\n"
                 "The socket is --socket, else $WB_SOCKET, else "
                 "$XDG_RUNTIME_DIR/wbroker/broker.sock (root: /run/wbroker/broker.sock).\n"
                 "Exit codes: 0 ok, 1 refused by the broker, 2 misuse, 65 malformed input,\n"
                 "66 missing input, 69 no broker answers, 75 load stopped waiting (the load\n"
                 "goes on in the broker), 130 interrupted.\n");
}

int main(int argc, char **argv)
{
    wbctl_globals g = {0};
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    wb__log_set_prog("wbctl");
    wb__log_set_level(WB_LOG_WARN);
    /* "+": stop at the first non-option, the subcommand. */
    int c;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            g.socket_path = optarg;
            break;
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v <= 0 || v > 86400000) {
                fprintf(stderr, "wbctl: --timeout-ms: expected a positive number, got '%s'\n",
                        optarg);
                return WBCTL_EXIT_USAGE;
            }
            g.timeout_ms = (int)v;
            break;
        }
        case 'h':
            usage(stdout);
            return WBCTL_EXIT_OK;
        default:
            usage(stderr);
            return WBCTL_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return WBCTL_EXIT_USAGE;
    }
    const char *name = argv[optind];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name) == 0) {
            int sub_argc = argc - optind;
            char **sub_argv = argv + optind;
            optind = 0; /* reset getopt for the subcommand */
            int rc = commands[i].fn(&g, sub_argc, sub_argv);
            /* Tables are printed as they are made: whatever did not reach
             * stdout (a full disk, a closed pipe) fails the command here. */
            int flushed = fflush(stdout) == 0;
            int e = errno;
            if (rc == WBCTL_EXIT_OK && (!flushed || ferror(stdout))) {
                fprintf(stderr, "wbctl: writing the output: %s\n", strerror(flushed ? EIO : e));
                return WBCTL_EXIT_REFUSED;
            }
            return rc;
        }
    }
    fprintf(stderr, "wbctl: unknown command '%s'\n", name);
    usage(stderr);
    return WBCTL_EXIT_USAGE;
}
