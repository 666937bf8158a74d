#include "wbctl_call.h"

#include "rpc.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wbctl_globals *bound;
static int try_shown;
static int last_status;

int wbctl_last_status(void)
{
    return last_status;
}

void wbctl_bind_globals(wbctl_globals *g)
{
    bound = g;
}

int wbctl_misuse(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (cmd)
        fprintf(stderr, "wbctl %s: ", cmd);
    else
        fprintf(stderr, "wbctl: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (cmd)
        fprintf(stderr, "\nTry 'wbctl %s --help'.\n", cmd);
    else
        fprintf(stderr, "\nTry 'wbctl --help'.\n");
    try_shown = 1;
    return WBCTL_EXIT_USAGE;
}

int wbctl_misuse_shown(void)
{
    return try_shown;
}

/* One output format chosen; two different ones are refused by name. */
static int set_output(wbctl_globals *g, wbctl_output want, const char *opt, const char *cmd)
{
    if (g->output_opt && g->output != want)
        return wbctl_misuse(cmd, "%s and %s conflict", g->output_opt, opt);
    g->output = want;
    g->output_opt = opt;
    return -1;
}

int wbctl_global_option(wbctl_globals *g, int c, const char *arg, const char *cmd)
{
    switch (c) {
    case 's':
        g->socket_path = arg;
        return -1;
    case 't':
        if (wb__rpc_parse_timeout(arg, &g->timeout_ms) != WB_OK) {
            char *shown = wbctl_escape(arg);
            int rc = wbctl_misuse(cmd,
                                  "--timeout-ms: expected milliseconds from 1 to 86400000, "
                                  "got '%s'",
                                  shown ? shown : "?");
            free(shown);
            return rc;
        }
        return -1;
    case 'j':
        return set_output(g, WBCTL_OUT_JSON, "--json", cmd);
    case 'o':
        if (strcmp(arg, "wide") == 0)
            return set_output(g, WBCTL_OUT_WIDE, "-o wide", cmd);
        if (strcmp(arg, "json") == 0)
            return set_output(g, WBCTL_OUT_JSON, "-o json", cmd);
        {
            char *shown = wbctl_escape(arg);
            int rc =
                wbctl_misuse(cmd, "-o: expected 'wide' or 'json', got '%s'", shown ? shown : "?");
            free(shown);
            return rc;
        }
    default:
        return 0;
    }
}

static void print_help(const char *cmd, const wbctl_spec *spec)
{
    printf("usage: wbctl %s\n\n%s\n\noptions:\n", spec->synopsis, spec->about);
    if (spec->flags & WBCTL_TAKES_MODEL)
        printf("  MODEL, --model MODEL   only the rows of model MODEL\n");
    if (spec->flags & WBCTL_TAKES_WIDE)
        printf("  -o wide, --output wide every column (the default fits 100 columns)\n");
    for (size_t i = 0; i < spec->n_own && i < WBCTL_MAX_FLAGS; i++)
        printf("  --%-20s %s\n", spec->own[i].name, spec->own[i].help);
    printf("  --json, -o json        print JSON (for programs) instead of a table\n"
           "  -h, --help             print this help\n");
    if (!(spec->flags & WBCTL_LOCAL))
        printf("The global options (--socket PATH, --timeout-ms MS) may come before or after\n"
               "'%s'; 'wbctl --help' describes them.\n",
               cmd);
}

int wbctl_parse(int argc, char **argv, const wbctl_spec *spec, wbctl_args *out)
{
    /* The options every command takes, then the command's own flags (their
     * getopt values are 256 + their index). */
    static const struct option common[] = {
        {"json", no_argument, NULL, 'j'},
        {"output", required_argument, NULL, 'o'},
        {"model", required_argument, NULL, 'm'},
        {"socket", required_argument, NULL, 's'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
    };
    enum { N_COMMON = sizeof common / sizeof common[0] };
    struct option opts[N_COMMON + WBCTL_MAX_FLAGS + 1];
    size_t n_own = spec->n_own < WBCTL_MAX_FLAGS ? spec->n_own : WBCTL_MAX_FLAGS;
    memcpy(opts, common, sizeof common);
    for (size_t i = 0; i < n_own; i++)
        opts[N_COMMON + i] = (struct option){spec->own[i].name, no_argument, NULL, 256 + (int)i};
    opts[N_COMMON + n_own] = (struct option){NULL, 0, NULL, 0};
    wbctl_globals none = {0};
    wbctl_globals *g = bound ? bound : &none;
    const char *cmd = argv[0];
    const char *model_opt = NULL;
    memset(out, 0, sizeof *out);
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":ho:", opts, NULL)) != -1) {
        int rc;
        switch (c) {
        case 'h':
            print_help(cmd, spec);
            return WBCTL_EXIT_OK;
        case 'm':
            if (spec->flags & WBCTL_TAKES_MODEL) {
                model_opt = optarg;
                break;
            }
            return wbctl_misuse(cmd, "unknown option '--model'");
        case ':':
            return wbctl_misuse(cmd, "option '%s' needs an argument", argv[optind - 1]);
        case '?':
            if (optopt)
                return wbctl_misuse(cmd, "unknown option '-%c'", optopt);
            return wbctl_misuse(cmd, "unknown option '%s'", argv[optind - 1]);
        default:
            if (c >= 256 && (size_t)(c - 256) < n_own) {
                *spec->own[c - 256].set = 1;
                break;
            }
            rc = wbctl_global_option(g, c, optarg, cmd);
            if (rc >= 0)
                return rc ? rc : wbctl_misuse(cmd, "unknown option '%s'", argv[optind - 1]);
            break;
        }
    }
    int have = argc - optind;
    /* The MODEL filter is the positional argument after the others. */
    int max = spec->max_args + ((spec->flags & WBCTL_TAKES_MODEL) ? 1 : 0);
    if (have < spec->min_args)
        return wbctl_misuse(cmd, "missing argument %s", spec->arg_names[have]);
    if (have > max)
        return wbctl_misuse(cmd, "unexpected argument '%s'", argv[optind + max]);
    out->npos = have < spec->max_args ? have : spec->max_args;
    if (out->npos > (int)(sizeof out->pos / sizeof out->pos[0]))
        out->npos = (int)(sizeof out->pos / sizeof out->pos[0]);
    for (int i = 0; i < out->npos; i++)
        out->pos[i] = argv[optind + i];
    const char *model_pos = have > spec->max_args ? argv[optind + spec->max_args] : NULL;
    if (model_pos && model_opt && strcmp(model_pos, model_opt) != 0)
        return wbctl_misuse(cmd, "MODEL '%s' and --model '%s' conflict", model_pos, model_opt);
    out->model = model_pos ? model_pos : model_opt;
    if (g->output == WBCTL_OUT_WIDE && !(spec->flags & WBCTL_TAKES_WIDE))
        return wbctl_misuse(cmd, "%s: only models, leases and containers have more columns",
                            g->output_opt);
    out->output = g->output;
    return -1;
}

int wbctl_parse_args(int argc, char **argv, const char *synopsis, const char *about, int nargs,
                     const char *const *arg_names, int *json, char **pos)
{
    const wbctl_spec spec = {synopsis, about, nargs, nargs, arg_names, 0, NULL, 0};
    wbctl_args a;
    *json = 0;
    int rc = wbctl_parse(argc, argv, &spec, &a);
    if (rc >= 0)
        return rc;
    *json = a.output == WBCTL_OUT_JSON;
    for (int i = 0; i < nargs; i++)
        pos[i] = a.pos[i];
    return -1;
}

int wbctl_open(const wbctl_globals *g, int timeout_ms, wb__rpc *rpc)
{
    memset(rpc, 0, sizeof *rpc);
    /* A timeout the environment sets but nobody can read is a mistake to
     * say, not one to ignore; --timeout-ms overrides it. */
    const char *env = getenv("WB_TIMEOUT_MS");
    int ms;
    if (g->timeout_ms == 0 && env && env[0] && wb__rpc_parse_timeout(env, &ms) != WB_OK) {
        char *shown = wbctl_escape(env);
        int rc = wbctl_misuse(NULL,
                              "WB_TIMEOUT_MS: expected milliseconds from 1 to 86400000, got "
                              "'%s' (unset it, or give --timeout-ms)",
                              shown ? shown : "?");
        free(shown);
        last_status = WB_EINVAL;
        return rc;
    }
    wb_err e;
    int rc = wb__rpc_open(rpc, g->socket_path, timeout_ms, &e);
    if (rc == WB_OK)
        return -1;
    int denied = rpc->denied;
    last_status = rc;
    wb__rpc_close(rpc);
    fprintf(stderr, "wbctl: %s\n", e.msg);
    if (rc == WB_EINVAL)
        return WBCTL_EXIT_USAGE;
    return denied ? WBCTL_EXIT_NOPERM : WBCTL_EXIT_UNAVAILABLE;
}

int wbctl_refusal_exit(int status)
{
    /* The broker found the request itself wrong: what was typed is to fix,
     * as for misuse. */
    return status == WB_EINVAL ? WBCTL_EXIT_USAGE : WBCTL_EXIT_REFUSED;
}

int wbctl_exchange(wb__rpc *rpc, const char *op, Wbproto__Request *req, int timeout_ms,
                   Wbproto__Reply **rep)
{
    wb_err e;
    *rep = NULL;
    int rc = wb__rpc_call(rpc, req, timeout_ms, rep, &e);
    if (rc == WB_OK)
        return -1;
    last_status = rc;
    char *msg = wbctl_escape(e.msg);
    fprintf(stderr, "wbctl: %s: %s\n", op, msg ? msg : "(out of memory)");
    free(msg);
    if (*rep) {
        wb__reply_free(rep);
        return wbctl_refusal_exit(rc);
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
