/* wbctl: the weightbroker admin CLI. */
#include "wbctl.h"

#include "alloc.h"
#include "buildinfo.h"
#include "log.h"
#include "names.h"
#include "wbctl_call.h"

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
    {"rollout", wbctl_rollout, "load a new version of a model and make it current"},
    {"rollback", wbctl_rollback, "make a model's previous version current again"},
    {"unload", wbctl_unload, "unload a model (it drains while leases remain)"},
    {"cancel", wbctl_cancel, "stop a model's load in progress"},
    {"sleep", wbctl_sleep, "move a model off its device to the host tier"},
    {"wake", wbctl_wake, "bring a model back to its device"},
    {"stats", wbctl_stats, "print the broker's counters"},
    {"inspect", wbctl_inspect, "print the tensor table of a safetensors checkpoint"},
    {"version", wbctl_version, "print wbctl's version (as --version)"},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: wbctl [OPTIONS] COMMAND [ARGS]\n\n"
                 "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\noptions (before or after the command):\n"
                 "  --socket PATH      the broker's socket (see below)\n"
                 "  --timeout-ms MS    how long to wait for each reply, 1 to 86400000 (default\n"
                 "                     $WB_TIMEOUT_MS, else 5000); load waits while the broker\n"
                 "                     loads, or up to MS when given; sleep and wake wait up\n"
                 "                     to MS when given, else 60 s\n"
                 "  --json, -o json    print JSON (for programs) instead of a table\n"
                 "  -o wide, --output wide\n"
                 "                     models, leases, containers: every column\n"
                 "  --version          print the version and exit\n"
                 "  -h, --help         print this help\n");
    fprintf(out, "\nRun 'wbctl COMMAND --help' for a command's options. models, leases and\n"
                 "containers take a model name (MODEL, or --model MODEL) to list its rows only.\n"
                 "The socket is --socket, else $WB_SOCKET, else\n"
                 "$XDG_RUNTIME_DIR/wbroker/broker.sock, else /run/wbroker/broker.sock as root,\n"
                 "else /tmp/wbroker-UID/broker.sock.\n"
                 "Exit codes: 0 ok, 1 refused by the broker, 2 misuse (the broker's WB_EINVAL\n"
                 "included), 65 malformed input, 66 missing input, 69 no broker answers,\n"
                 "70 an internal error, 74 a read error, 75 stopped waiting (the operation\n"
                 "goes on in the broker), 77 permission denied on the socket, 130 interrupted.\n");
}

/* The command names, for the messages that list them. */
static void command_names(const char **names)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        names[i] = commands[i].name;
}

static int unknown_command(const char *name)
{
    const char *names[N_COMMANDS];
    command_names(names);
    /* The one command the name begins ("lea"), else the nearest by edits. */
    const char *near = NULL;
    size_t starts = 0, len = strlen(name);
    for (size_t i = 0; len && i < N_COMMANDS; i++) {
        if (strncmp(names[i], name, len) == 0) {
            near = names[i];
            starts++;
        }
    }
    if (starts != 1)
        near = wb__names_closest(name, names, N_COMMANDS);
    char *shown = wbctl_escape(name);
    int rc = near ? wbctl_misuse(NULL, "unknown command '%s'; did you mean '%s'?",
                                 shown ? shown : "?", near)
                  : wbctl_misuse(NULL, "unknown command '%s'", shown ? shown : "?");
    free(shown);
    return rc;
}

/* Tables are printed as they are made: whatever did not reach stdout (a
 * full disk, a closed pipe) fails the command here. */
static int finish(int rc)
{
    int flushed = fflush(stdout) == 0;
    int e = errno;
    if (rc == WBCTL_EXIT_OK && (!flushed || ferror(stdout))) {
        fprintf(stderr, "wbctl: writing the output: %s\n", strerror(flushed ? EIO : e));
        return WBCTL_EXIT_REFUSED;
    }
    return rc;
}

int main(int argc, char **argv)
{
    wb__alloc_use_for_jansson();
    wbctl_globals g = {0};
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},
        {"output", required_argument, NULL, 'o'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    wb__log_set_prog("wbctl");
    wb__log_set_level(WB_LOG_WARN);
    /* "+": stop at the first non-option, the subcommand, whose own parser
     * takes the global options too (wbctl_parse). */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "+:ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            usage(stdout);
            return finish(WBCTL_EXIT_OK);
        case 'V':
            wb__print_version(stdout, "wbctl", NULL);
            return finish(WBCTL_EXIT_OK);
        case ':':
            return wbctl_misuse(NULL, "option '%s' needs an argument", argv[optind - 1]);
        case '?':
            if (optopt)
                return wbctl_misuse(NULL, "unknown option '-%c'", optopt);
            return wbctl_misuse(NULL, "unknown option '%s'", argv[optind - 1]);
        default: {
            int rc = wbctl_global_option(&g, c, optarg, NULL);
            if (rc >= 0)
                return rc;
        }
        }
    }
    if (optind >= argc) {
        const char *names[N_COMMANDS];
        command_names(names);
        char list[256] = "";
        size_t used = 0;
        for (size_t i = 0; i < N_COMMANDS && used < sizeof list; i++) {
            int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
            used += w > 0 ? (size_t)w : 0;
        }
        return wbctl_misuse(NULL, "missing command (one of: %s)", list);
    }
    const char *name = argv[optind];
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(name, commands[i].name) != 0)
            continue;
        int sub_argc = argc - optind;
        char **sub_argv = argv + optind;
        optind = 0; /* reset getopt for the subcommand */
        wbctl_bind_globals(&g);
        int rc = finish(commands[i].fn(&g, sub_argc, sub_argv));
        /* Every misuse ends the same way, whoever found it. */
        if (rc == WBCTL_EXIT_USAGE && !wbctl_misuse_shown())
            fprintf(stderr, "Try 'wbctl %s --help'.\n", name);
        return rc;
    }
    return unknown_command(name);
}
