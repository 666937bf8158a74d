#include "options.h"

#include "auth_files.h"
#include "alloc.h"
#include "log.h"
#include "metrics.h"
#include "paths.h"
#include "safetensors.h"
#include "stage.h"
#include "tier.h"
#include "wire.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

/* stale-ms must be at least this many heartbeat intervals: a heartbeat that
 * comes a little late must not make a healthy worker's lease flap between
 * stale and active. */
#define STALE_MIN_BEATS 2

/* Options without a short letter. */
enum {
    OPT_ALLOW_UID = 256,
    OPT_ALLOW_GID,
    OPT_ADMIN_UID,
    OPT_ADMIN_GID,
    OPT_PUBLISHER_UID,
    OPT_PUBLISHER_GID,
    OPT_CONFIG,
    OPT_CHECK_CONFIG,
    OPT_LOG_FORMAT,
    OPT_METRICS,
    OPT_LOAD_METHOD,
    OPT_HOST_SLAB,
    OPT_CUDA_SLAB,
    OPT_READ_SOURCE,
    OPT_STAGING_PAGES,
    OPT_STAGING_DEMOTE,
    OPT_REQUIRE_ALL_MODELS,
    OPT_NO_SLAB_POOL,
    OPT_NO_SHARE_TENSORS,
    OPT_DEVICE_BUDGET,
    OPT_HOST_BUDGET,
    /* Numeric options: OPT_NUM + their index in num_opts. */
    OPT_NUM = 0x1000,
};

typedef struct num_opt {
    const char *name;
    long min, max;
    const char *what; /* "%ld" in it takes min, then max */
    int arg_width;    /* the most of the value quoted, 0: all of it */
} num_opt;

static const num_opt num_opts[WB_NUM_OPTS] = {
    [WB_NUM_HEARTBEAT] = {"heartbeat-ms", 1, 86400000, "a positive number of milliseconds", 0},
    [WB_NUM_STALE] = {"stale-ms", 1, 86400000, "a positive number of milliseconds", 0},
    [WB_NUM_HEARTBEAT_RATE] = {"max-heartbeat-rate", 1, 1000000,
                               "a number of heartbeats a second from %ld to %ld", 40},
    [WB_NUM_READ_THREADS] = {"read-threads", 1, WB_STAGE_MAX_THREADS, "a number from %ld to %ld",
                             40},
    [WB_NUM_STAGING_MIB] = {"staging-mib", 1, WB_STAGE_MAX_CHUNK >> 20, "a number from %ld to %ld",
                            40},
    [WB_NUM_STAGING_BUFFERS] = {"staging-buffers", 2, WB_STAGE_MAX_BUFFERS,
                                "a number from %ld to %ld", 40},
    [WB_NUM_REGISTER_THREADS] = {"register-threads", 1, WB_STAGE_MAX_THREADS,
                                 "a number from %ld to %ld", 40},
    [WB_NUM_COPY_BATCH] = {"copy-batch", 1, WB_STAGE_MAX_BATCH, "a number from %ld to %ld", 40},
    [WB_NUM_MAX_LEASES] = {"max-leases-per-client", 1, 1000000000, "a positive number", 0},
    [WB_NUM_MAX_MODELS] = {"max-models", 1, 1000000000, "a positive number", 0},
    [WB_NUM_MAX_TENSORS] = {"max-tensors", 1, 1000000000, "a positive number", 0},
    [WB_NUM_MAX_SHARDS] = {"max-shards", 1, 1000000, "a number from %ld to %ld", 40},
    [WB_NUM_MAX_MESSAGE] = {"max-message-bytes", WB_MIN_MESSAGE, WB_MAX_MESSAGE,
                            "a number of bytes from %ld to %ld (clients accept no more)", 0},
    [WB_NUM_MAX_HEADER] = {"max-header-bytes", 1, (long)WB_ST_MAX_HEADER,
                           "a number of bytes from %ld to %ld (the safetensors limit)", 0},
    [WB_NUM_MAX_PEERS] = {"max-peers", 1, 1000000, "a number of connections from %ld to %ld", 200},
    [WB_NUM_MAX_REQUEST] = {"max-request-bytes", 256, WB_MAX_MESSAGE,
                            "a number of bytes from %ld to %ld", 200},
    [WB_NUM_MAX_BUFFERED] = {"max-buffered-bytes", 4096, 1L << 40,
                             "a number of bytes from %ld to %ld", 200},
    [WB_NUM_MAX_QUEUED] = {"max-queued-replies", 1, 100000, "a number of replies from %ld to %ld",
                           200},
    [WB_NUM_MAX_QUEUED_BYTES] = {"max-queued-bytes", 4096, 1L << 40,
                                 "a number of bytes from %ld to %ld", 200},
    [WB_NUM_MAX_QUEUED_TOTAL] = {"max-queued-bytes-total", 4096, 1L << 40,
                                 "a number of bytes from %ld to %ld", 200},
    [WB_NUM_MAX_PER_PROCESS] = {"max-peers-per-process", 1, 1000000,
                                "a number of connections from %ld to %ld", 200},
    [WB_NUM_HANDSHAKE] = {"handshake-timeout-ms", 10, 3600000,
                          "a number of milliseconds from %ld to %ld", 200},
    [WB_NUM_MAX_PER_UID] = {"max-peers-per-uid", 1, 1000000,
                            "a number of connections from %ld to %ld", 200},
    [WB_NUM_MAX_SESSIONS_PER_UID] = {"max-sessions-per-uid", 1, 1000000,
                                     "a number of sessions from %ld to %ld", 200},
    [WB_NUM_METRICS_REQUEST_TIMEOUT] = {"metrics-request-timeout-ms",
                                        WB_METRICS_MIN_REQUEST_TIMEOUT_MS,
                                        WB_METRICS_MAX_REQUEST_TIMEOUT_MS,
                                        "a number of milliseconds from %ld to %ld", 200},
    [WB_NUM_MAX_VERSIONS] = {"max-versions", 2, WB_MAX_VERSIONS_LIMIT, "a number from %ld to %ld",
                             40},
    [WB_NUM_SLAB_POOL_SECONDS] = {"slab-pool-seconds", 1, 3600,
                                  "a number of seconds from %ld to %ld", 40},
    [WB_NUM_PUBLISH_STREAMS] = {"publish-streams", 1, 8, "a number of streams from %ld to %ld", 40},
};
static const struct option long_opts[] = {
    {"socket", required_argument, NULL, 's'},
    {"backend", required_argument, NULL, 'b'},
    {"model", required_argument, NULL, 'm'},
    {"require-all-models", no_argument, NULL, OPT_REQUIRE_ALL_MODELS},
    {"device", required_argument, NULL, 'd'},
    {"read-threads", required_argument, NULL, OPT_NUM + WB_NUM_READ_THREADS},
    {"staging-mib", required_argument, NULL, OPT_NUM + WB_NUM_STAGING_MIB},
    {"staging-buffers", required_argument, NULL, OPT_NUM + WB_NUM_STAGING_BUFFERS},
    {"load-method", required_argument, NULL, OPT_LOAD_METHOD},
    {"read-source", required_argument, NULL, OPT_READ_SOURCE},
    {"staging-pages", required_argument, NULL, OPT_STAGING_PAGES},
    {"staging-demote", required_argument, NULL, OPT_STAGING_DEMOTE},
    {"register-threads", required_argument, NULL, OPT_NUM + WB_NUM_REGISTER_THREADS},
    {"copy-batch", required_argument, NULL, OPT_NUM + WB_NUM_COPY_BATCH},
    {"host-slab", required_argument, NULL, OPT_HOST_SLAB},
    {"cuda-slab", required_argument, NULL, OPT_CUDA_SLAB},
    {"heartbeat-ms", required_argument, NULL, OPT_NUM + WB_NUM_HEARTBEAT},
    {"stale-ms", required_argument, NULL, OPT_NUM + WB_NUM_STALE},
    {"max-heartbeat-rate", required_argument, NULL, OPT_NUM + WB_NUM_HEARTBEAT_RATE},
    {"log-level", required_argument, NULL, 'l'},
    {"allow-uid", required_argument, NULL, OPT_ALLOW_UID},
    {"allow-gid", required_argument, NULL, OPT_ALLOW_GID},
    {"admin-uid", required_argument, NULL, OPT_ADMIN_UID},
    {"admin-gid", required_argument, NULL, OPT_ADMIN_GID},
    {"publisher-uid", required_argument, NULL, OPT_PUBLISHER_UID},
    {"publisher-gid", required_argument, NULL, OPT_PUBLISHER_GID},
    {"max-leases-per-client", required_argument, NULL, OPT_NUM + WB_NUM_MAX_LEASES},
    {"max-models", required_argument, NULL, OPT_NUM + WB_NUM_MAX_MODELS},
    {"max-versions", required_argument, NULL, OPT_NUM + WB_NUM_MAX_VERSIONS},
    {"slab-pool-seconds", required_argument, NULL, OPT_NUM + WB_NUM_SLAB_POOL_SECONDS},
    {"no-slab-pool", no_argument, NULL, OPT_NO_SLAB_POOL},
    {"no-share-tensors", no_argument, NULL, OPT_NO_SHARE_TENSORS},
    {"device-memory-budget", required_argument, NULL, OPT_DEVICE_BUDGET},
    {"host-memory-budget", required_argument, NULL, OPT_HOST_BUDGET},
    {"publish-streams", required_argument, NULL, OPT_NUM + WB_NUM_PUBLISH_STREAMS},
    {"max-tensors", required_argument, NULL, OPT_NUM + WB_NUM_MAX_TENSORS},
    {"max-shards", required_argument, NULL, OPT_NUM + WB_NUM_MAX_SHARDS},
    {"max-message-bytes", required_argument, NULL, OPT_NUM + WB_NUM_MAX_MESSAGE},
    {"max-header-bytes", required_argument, NULL, OPT_NUM + WB_NUM_MAX_HEADER},
    {"max-peers", required_argument, NULL, OPT_NUM + WB_NUM_MAX_PEERS},
    {"max-request-bytes", required_argument, NULL, OPT_NUM + WB_NUM_MAX_REQUEST},
    {"max-buffered-bytes", required_argument, NULL, OPT_NUM + WB_NUM_MAX_BUFFERED},
    {"max-queued-replies", required_argument, NULL, OPT_NUM + WB_NUM_MAX_QUEUED},
    {"max-queued-bytes", required_argument, NULL, OPT_NUM + WB_NUM_MAX_QUEUED_BYTES},
    {"max-queued-bytes-total", required_argument, NULL, OPT_NUM + WB_NUM_MAX_QUEUED_TOTAL},
    {"max-peers-per-process", required_argument, NULL, OPT_NUM + WB_NUM_MAX_PER_PROCESS},
    {"handshake-timeout-ms", required_argument, NULL, OPT_NUM + WB_NUM_HANDSHAKE},
    {"max-peers-per-uid", required_argument, NULL, OPT_NUM + WB_NUM_MAX_PER_UID},
    {"max-sessions-per-uid", required_argument, NULL, OPT_NUM + WB_NUM_MAX_SESSIONS_PER_UID},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
    {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
    {"metrics", required_argument, NULL, OPT_METRICS},
    {"metrics-request-timeout-ms", required_argument, NULL,
     OPT_NUM + WB_NUM_METRICS_REQUEST_TIMEOUT},
    {"version", no_argument, NULL, 'V'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Options a configuration file may not set. */
static const char *const command_line_only[] = {"config", "check-config", "help", "version", NULL};

/* The line of the configuration file that the argument getopt_long returned
 * last comes from, or 0 when it comes from the command line. The file's
 * options come first in the vector getopt_long sees, before the command
 * line's (see config.h). */
static int origin_line(const wb_options *o)
{
    int i = optind - 1;
    if (!o->config_file || i < 1 || i > o->config.n_args)
        return 0;
    return o->config.lines[i - 1];
}

/* Keeps why the options cannot be used in o->why and prints it (unless
 * quiet) as "wbrokerd: WHY". Returns `rc`. */
__attribute__((format(printf, 3, 4))) static int fail_with(wb_options *o, int rc, const char *fmt,
                                                           ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->why, sizeof o->why, fmt, ap);
    va_end(ap);
    if (!o->quiet)
        fprintf(stderr, "wbrokerd: %s\n", o->why);
    return rc;
}

/* A mistake in the options. `line` > 0: the configuration file's line holds
 * it; the message is "FILE:LINE: ..." with the option named without its
 * dashes, as the file names it, and the exit status 78. 0: the command
 * line's, followed by the hint to --help, exit status 2. */
__attribute__((format(printf, 3, 4))) static int misuse_at(wb_options *o, int line, const char *fmt,
                                                           ...)
{
    char msg[WB_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        return fail_with(o, WB_EXIT_CONFIG, "%s:%d: %s", o->config_file, line,
                         strncmp(msg, "--", 2) == 0 ? msg + 2 : msg);
    fail_with(o, WB_EXIT_USAGE, "%s", msg);
    if (!o->quiet)
        fputs("Try 'wbrokerd --help'.\n", stderr);
    return WB_EXIT_USAGE;
}

/* A mistake in the argument getopt_long returned last. */
#define misuse(o, ...) misuse_at(o, origin_line(o), __VA_ARGS__)

void wb__fatal(const char *fmt, ...)
{
    char msg[WB_ERR_MSG_MAX + 300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (wb__log_get_format() == WB_LOG_JSON) {
        char q[sizeof msg + 64];
        wb_error("fatal", "error=%s", wb__log_quote(q, sizeof q, msg));
    } else {
        fprintf(stderr, "wbrokerd: %s\n", msg);
    }
}
/* Parses a positive decimal number of at most `max`; -1 if invalid. */
static long parse_positive(const char *s, long max)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v == 0 || v > (unsigned long long)max)
        return -1;
    return (long)v;
}

static void free_argv(char ***argv, int argc)
{
    if (!*argv)
        return;
    for (int i = 0; i < argc; i++)
        free((*argv)[i]);
    free(*argv);
    *argv = NULL;
}

/* A deep copy of argv (NULL-terminated), or NULL when out of memory. */
static char **copy_argv(int argc, char *const *argv)
{
    char **c = wb__calloc((size_t)argc + 1, sizeof *c);
    for (int i = 0; c && i < argc; i++) {
        if (!(c[i] = wb__strdup(argv[i]))) {
            free_argv(&c, i);
            return NULL;
        }
    }
    return c;
}

void wb__options_free(wb_options *o)
{
    wb__auth_destroy(&o->auth);
    free(o->models);
    o->models = NULL;
    if (o->av && o->config_file)
        free(o->av);
    o->av = NULL;
    wb__config_free(&o->config);
    free_argv(&o->cmdline, o->n_cmdline);
    free_argv(&o->reparsed, o->n_cmdline);
}

/* A numeric option: in its range, or a usage error naming it. */
static int parse_num(wb_options *o, int k, const char *arg)
{
    const num_opt *t = &num_opts[k];
    long v = parse_positive(arg, t->max);
    if (v < t->min) {
        char what[160], msg[WB_ERR_MSG_MAX];
        snprintf(what, sizeof what, t->what, t->min, t->max);
        snprintf(msg, sizeof msg, "--%s: '%.*s' is not %s", t->name,
                 t->arg_width ? t->arg_width : (int)strlen(arg), arg, what);
        return misuse(o, "%s", msg);
    }
    o->num[k] = v;
    o->line[k] = origin_line(o);
    return WB_OPTIONS_GO_ON;
}

static int add_model(wb_options *o, char *arg)
{
    wb_model_arg ma;
    wb_err merr;
    if (wb__config_parse_model(arg, &ma, &merr) != WB_OK)
        return misuse(o, "--model: %s", merr.msg);
    /* A model given on the command line replaces the configuration file's
     * model of the same name; any other repeat is a mistake. */
    int from_file = origin_line(o) > 0;
    size_t k = 0;
    while (k < o->n_models && strcmp(o->models[k].name, ma.name) != 0)
        k++;
    if (k < o->n_models && (from_file || !o->models[k].from_file))
        return misuse(o, "--model: model '%s' is given twice", ma.name);
    if (k == o->n_models) {
        wb_preload *grown = wb__realloc(o->models, (o->n_models + 1) * sizeof *grown);
        if (!grown)
            return fail_with(o, 1, "out of memory");
        o->models = grown;
        o->n_models++;
    }
    /* The name, path and placement are cut out of arg in place. */
    char *path = arg + (ma.path - arg);
    char *placement = ma.placement ? arg + (ma.placement - arg) : NULL;
    arg[strlen(ma.name)] = '\0'; /* ends the name at its '@' or '=' */
    if (placement && placement > path)
        path[ma.path_len] = '\0'; /* ends the path at its placement's '@' */
    if (placement)
        placement[ma.placement_len] = '\0';
    o->models[k].name = arg;
    o->models[k].path = path;
    o->models[k].device = ma.device;
    o->models[k].placement = placement;
    o->models[k].from_file = from_file;
    o->models[k].line = origin_line(o);
    return WB_OPTIONS_GO_ON;
}

/* How many long options start with name[0..len): *match is the one that
 * is exactly it, else the only one, else NULL; `list` names them all
 * ("--a, --b"). */
static size_t prefix_matches(const char *name, int len, const struct option **match, char *list,
                             size_t size)
{
    size_t n = 0, used = 0;
    const struct option *exact = NULL, *last = NULL;
    list[0] = '\0';
    for (const struct option *lo = long_opts; lo->name; lo++) {
        if (strncmp(lo->name, name, (size_t)len) != 0)
            continue;
        if (lo->name[len] == '\0')
            exact = lo;
        last = lo;
        n++;
        if (used < size) {
            int w = snprintf(list + used, size - used, "%s--%s", n > 1 ? ", " : "", lo->name);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    *match = exact ? exact : n == 1 ? last : NULL;
    return n;
}

/* What getopt_long refused ('?': an unknown or ambiguous option, or a
 * value given to one that takes none; ':': a value missing), worded here:
 * getopt_long's own message would start with the program's path. */
static int bad_option(wb_options *o, int c)
{
    const char *text = optind >= 1 && optind <= o->ac ? o->av[optind - 1] : "";
    int is_long = strncmp(text, "--", 2) == 0;
    /* A short option comes with its letter in optopt; so does a long one
     * given a value it does not take, with its '='. */
    if (c == '?' && optopt != 0 && !(is_long && strchr(text, '=')))
        return misuse(o, "unknown option '-%c'", optopt);
    if (!is_long)
        return misuse(o, "unknown option '%s'", text);
    const char *name = text + 2;
    int len = (int)strcspn(name, "=");
    if (c == ':')
        return misuse(o, "option '--%.*s' needs a value", len, name);
    const struct option *match;
    char list[512];
    size_t n = prefix_matches(name, len, &match, list, sizeof list);
    if (match)
        return misuse(o, "option '--%s' takes no value", match->name);
    if (n > 1)
        return misuse(o, "option '--%.*s' is ambiguous: it could be %s", len, name, list);
    return misuse(o, "unknown option '--%.*s'", len, name);
}

/* One option of the second pass. Returns WB_OPTIONS_GO_ON, or the exit status. */
static int parse_one(wb_options *o, int c, char *arg)
{
    if (c >= OPT_NUM && c < OPT_NUM + WB_NUM_OPTS)
        return parse_num(o, c - OPT_NUM, arg);
    switch (c) {
    case 's':
        if (!arg[0])
            return misuse(o, "--socket: the path is empty");
        o->socket = arg;
        o->socket_line = origin_line(o);
        return WB_OPTIONS_GO_ON;
    case 'b':
        if (strcmp(arg, "auto") && strcmp(arg, "cuda") && strcmp(arg, "host"))
            return misuse(o, "--backend: '%s' is not one of auto, cuda, host", arg);
        o->backend = arg;
        return WB_OPTIONS_GO_ON;
    case 'm':
        return add_model(o, arg);
    case OPT_REQUIRE_ALL_MODELS:
        o->require_all_models = 1;
        return WB_OPTIONS_GO_ON;
    case OPT_NO_SLAB_POOL:
        o->no_slab_pool = 1;
        return WB_OPTIONS_GO_ON;
    case OPT_NO_SHARE_TENSORS:
        o->no_share_tensors = 1;
        return WB_OPTIONS_GO_ON;
    case OPT_DEVICE_BUDGET:
    case OPT_HOST_BUDGET: {
        int dev = c == OPT_DEVICE_BUDGET;
        wb_err e;
        if (wb__tier_parse_size(dev ? "--device-memory-budget" : "--host-memory-budget", arg,
                                dev ? &o->device_budget : &o->host_budget,
                                dev ? &o->device_budget_pct : &o->host_budget_pct, &e) != WB_OK)
            return misuse(o, "%s", e.msg);
        return WB_OPTIONS_GO_ON;
    }
    case 'd':
        if (strcmp(arg, "0") == 0) {
            o->device = 0;
        } else {
            long v = parse_positive(arg, 1023);
            if (v < 0)
                return misuse(o, "--device: '%s' is not a device number", arg);
            o->device = (int)v;
        }
        o->device_given = 1;
        return WB_OPTIONS_GO_ON;
    case OPT_HOST_SLAB:
        if (strcmp(arg, "memfd") == 0)
            o->host_memfd = 1;
        else if (strcmp(arg, "shm") == 0)
            o->host_memfd = 0;
        else
            return misuse(o, "--host-slab: '%s' is not one of shm, memfd", arg);
        return WB_OPTIONS_GO_ON;
    case OPT_CUDA_SLAB:
        if (strcmp(arg, "vmm") == 0)
            o->cuda_slab = WB_CUDA_SLAB_VMM;
        else if (strcmp(arg, "ipc") == 0)
            o->cuda_slab = WB_CUDA_SLAB_IPC;
        else
            return misuse(o, "--cuda-slab: '%s' is not one of ipc, vmm", arg);
        return WB_OPTIONS_GO_ON;
    case OPT_READ_SOURCE:
        if (!(o->read_source = wb__stage_read_parse(arg)))
            return misuse(o, "--read-source: '%s' is not one of pread, mmap, mmap-nt, auto", arg);
        return WB_OPTIONS_GO_ON;
    case OPT_STAGING_PAGES:
        if (!(o->staging_pages = wb__stage_pages_parse(arg)))
            return misuse(o, "--staging-pages: '%s' is not one of normal, huge", arg);
        return WB_OPTIONS_GO_ON;
    case OPT_STAGING_DEMOTE:
        if (!(o->staging_demote = wb__stage_demote_parse(arg)))
            return misuse(o, "--staging-demote: '%s' is not one of off, on", arg);
        return WB_OPTIONS_GO_ON;
    case OPT_LOAD_METHOD:
        if (strcmp(arg, "staged") == 0)
            o->load_mode = WB_STAGE_STAGED;
        else if (strcmp(arg, "mapped") == 0)
            o->load_mode = WB_STAGE_MAPPED;
        else
            return misuse(o, "--load-method: '%s' is not one of staged, mapped", arg);
        return WB_OPTIONS_GO_ON;
    case 'l': {
        int lvl = wb__log_parse_level(arg);
        if (lvl < 0)
            return misuse(o, "--log-level: '%s' is not one of debug, info, warn, error", arg);
        o->log_level = lvl;
        return WB_OPTIONS_GO_ON;
    }
    case OPT_ALLOW_UID:
    case OPT_ALLOW_GID:
    case OPT_ADMIN_UID:
    case OPT_ADMIN_GID:
    case OPT_PUBLISHER_UID:
    case OPT_PUBLISHER_GID: {
        static const wb_auth_list which[] = {WB_AUTH_CLIENT_UIDS,  WB_AUTH_CLIENT_GIDS,
                                             WB_AUTH_ADMIN_UIDS,   WB_AUTH_ADMIN_GIDS,
                                             WB_AUTH_PUBLISH_UIDS, WB_AUTH_PUBLISH_GIDS};
        static const char *const names[] = {"--allow-uid", "--allow-gid",     "--admin-uid",
                                            "--admin-gid", "--publisher-uid", "--publisher-gid"};
        int k = c - OPT_ALLOW_UID;
        wb_err aerr;
        if (wb__auth_add(&o->auth, which[k], arg, names[k], &aerr) != WB_OK)
            return misuse(o, "%s", aerr.msg);
        return WB_OPTIONS_GO_ON;
    }
    case OPT_CONFIG:
    case OPT_CHECK_CONFIG:
        return WB_OPTIONS_GO_ON; /* taken by the first pass */
    case OPT_LOG_FORMAT: {
        int fmt = wb__log_parse_format(arg);
        if (fmt < 0)
            return misuse(o, "--log-format: '%s' is not text or json", arg);
        o->log_format = fmt;
        return WB_OPTIONS_GO_ON;
    }
    case OPT_METRICS: {
        wb_err merr;
        if (wb__metrics_parse_addr(arg, NULL, NULL, &merr) != WB_OK)
            return misuse(o, "--metrics: %s", merr.msg);
        o->metrics = arg;
        return WB_OPTIONS_GO_ON;
    }
    case 'V':
        wb__options_print_version();
        return 0;
    case 'h':
        wb__options_usage(stdout);
        return 0;
    default:
        return bad_option(o, c);
    }
}

int wb__options_parse(wb_options *o, int argc, char **argv)
{
    if (!o->cmdline && !o->reparsed) {
        if (!(o->cmdline = copy_argv(argc, argv)))
            return fail_with(o, 1, "out of memory");
        o->n_cmdline = argc;
    }
    /* --config names a file whose options go before the command line's:
     * find it (and --check-config) first, acting on nothing else. --help
     * and --version work whatever the file holds. */
    int c, help_or_version = 0;
    optind = 0; /* getopt_long from the start, also when parsing again */
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        if (c == OPT_CONFIG)
            o->config_file = optarg;
        else if (c == OPT_CHECK_CONFIG)
            o->check_config = 1;
        else if (c == 'h' || c == 'V')
            help_or_version = 1;
    }
    o->av = argv;
    o->ac = argc;
    if (o->config_file && help_or_version)
        o->config_file = NULL;
    if (o->config_file) {
        wb_err cerr;
        if (wb__config_load(o->config_file, long_opts, command_line_only, &o->config, &cerr) !=
            WB_OK) {
            o->av = NULL;
            return fail_with(o, WB_EXIT_CONFIG, "%s", cerr.msg);
        }
        char **av = wb__calloc((size_t)argc + (size_t)o->config.n_args + 1, sizeof *av);
        if (!av) {
            o->av = NULL;
            return fail_with(o, 1, "out of memory");
        }
        av[0] = argv[0];
        for (int i = 0; i < o->config.n_args; i++)
            av[1 + i] = o->config.args[i];
        for (int i = 1; i < argc; i++)
            av[o->config.n_args + i] = argv[i];
        o->av = av;
        o->ac = argc + o->config.n_args;
    }
    /* Mistakes are worded by bad_option (":" asks getopt_long to tell a
     * missing value from an unknown option). */
    optind = 0;
    while ((c = getopt_long(o->ac, o->av, ":h", long_opts, NULL)) != -1) {
        int rc = parse_one(o, c, optarg);
        if (rc != WB_OPTIONS_GO_ON)
            return rc;
    }
    if (optind < o->ac)
        return misuse(o, "unexpected argument '%s'", o->av[optind]);
    if (!o->quiet) {
        if (o->log_level >= 0)
            wb__log_set_level((wb_log_level)o->log_level);
        if (o->log_format >= 0)
            wb__log_set_format((wb_log_format)o->log_format);
    }
    return WB_OPTIONS_GO_ON;
}

/* How a numeric option's value reads in a message, with where it comes
 * from: "heartbeat-ms 1000" (on the line the message names),
 * "heartbeat-ms 1000 (line 3)", "--heartbeat-ms 1000", or
 * "heartbeat-ms 1000 (the default)". */
static const char *num_origin(const wb_options *o, wb_num_opt k, int given, int at_line, char *buf,
                              size_t size)
{
    if (o->line[k] > 0 && o->line[k] == at_line)
        snprintf(buf, size, "%s %ld", num_opts[k].name, o->num[k]);
    else if (o->line[k] > 0)
        snprintf(buf, size, "%s %ld (line %d)", num_opts[k].name, o->num[k], o->line[k]);
    else if (given)
        snprintf(buf, size, "--%s %ld", num_opts[k].name, o->num[k]);
    else
        snprintf(buf, size, "%s %ld (the default)", num_opts[k].name, o->num[k]);
    return buf;
}

/* A lease is stale after stale-ms without a heartbeat: a window of less
 * than STALE_MIN_BEATS heartbeats makes a healthy worker's lease flap
 * between stale and active whenever a heartbeat comes a little late. */
static int check_liveness(wb_options *o, int heartbeat_given, int stale_given)
{
    long hb = o->num[WB_NUM_HEARTBEAT], stale = o->num[WB_NUM_STALE];
    if (stale >= STALE_MIN_BEATS * hb)
        return WB_OPTIONS_GO_ON;
    int line = o->line[WB_NUM_STALE] > 0 ? o->line[WB_NUM_STALE] : o->line[WB_NUM_HEARTBEAT];
    char a[160], b[160];
    char msg[WB_ERR_MSG_MAX];
    snprintf(msg, sizeof msg,
             "%s is less than %d times %s: a healthy worker's lease would turn stale between "
             "its heartbeats (stale-ms must be at least %d x heartbeat-ms, %ld here)",
             num_origin(o, WB_NUM_STALE, stale_given, line, a, sizeof a), STALE_MIN_BEATS,
             num_origin(o, WB_NUM_HEARTBEAT, heartbeat_given, line, b, sizeof b), STALE_MIN_BEATS,
             STALE_MIN_BEATS * hb);
    if (line > 0)
        return fail_with(o, WB_EXIT_CONFIG, "%s:%d: %s", o->config_file, line, msg);
    return misuse_at(o, 0, "%s", msg);
}

/* --check-config: every model's path is one a load can read: a file, a
 * directory holding a checkpoint, or a shard index whose shards are there,
 * each judged as the user running the check. No header is parsed. Every
 * model at fault is reported. */
static int check_models(wb_options *o)
{
    int rc = WB_OPTIONS_GO_ON, flag = 0;
    for (size_t i = 0; i < o->n_models; i++) {
        const wb_preload *m = &o->models[i];
        char resolved[WB_PATH_MAX + 1];
        int is_dir = 0;
        wb_err e;
        if (wb__auth_check_load_path(m->path, resolved, sizeof resolved, &is_dir, &e) == WB_OK &&
            wb__st_check_files(m->path, NULL, &e) == WB_OK)
            continue;
        if (m->from_file && m->line > 0) {
            fail_with(o, WB_EXIT_CONFIG, "%s:%d: model '%s': %s", o->config_file, m->line, m->name,
                      e.msg);
            rc = WB_EXIT_CONFIG;
        } else {
            fail_with(o, WB_EXIT_USAGE, "--model %s: %s", m->name, e.msg);
            if (rc == WB_OPTIONS_GO_ON)
                rc = WB_EXIT_USAGE;
            flag = 1;
        }
    }
    if (flag && !o->quiet)
        fputs("Try 'wbrokerd --help'.\n", stderr);
    return rc;
}

int wb__options_validate(wb_options *o)
{
    int heartbeat_given = o->num[WB_NUM_HEARTBEAT] != 0, stale_given = o->num[WB_NUM_STALE] != 0;
    if (!heartbeat_given)
        o->num[WB_NUM_HEARTBEAT] = WB_DEFAULT_HEARTBEAT_MS;
    if (!stale_given)
        o->num[WB_NUM_STALE] = WB_DEFAULT_STALE_MS;
    int rc = check_liveness(o, heartbeat_given, stale_given);
    if (rc != WB_OPTIONS_GO_ON)
        return rc;
    /* Placements were parsed with --model; whether their devices exist is
     * known only once the backend has started (wbrokerd refuses then,
     * naming the model and the devices it sees). */
    char sp[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (wb__socket_path(o->socket, sp, sizeof sp) != WB_OK) {
        if (o->socket)
            return misuse_at(o, o->socket_line,
                             "--socket: the path is too long for a unix socket (at most %zu "
                             "bytes)",
                             sizeof sp - 1);
        return misuse_at(o, 0,
                         "the default socket path ($WB_SOCKET, or under $XDG_RUNTIME_DIR) is too "
                         "long for a unix socket (at most %zu bytes); give --socket",
                         sizeof sp - 1);
    }
    if (!o->check_config)
        return WB_OPTIONS_GO_ON;
    /* Every option has been checked and nothing is started; the models'
     * paths are looked at. What the broker would use is printed for the
     * operator to compare. */
    if ((rc = check_models(o)) != WB_OPTIONS_GO_ON)
        return rc;
    printf("config: %s\nsocket: %s\n", o->config_file ? o->config_file : "(none)", sp);
    for (size_t i = 0; i < o->n_models; i++) {
        printf("model: %s path=%s", o->models[i].name, o->models[i].path);
        if (o->models[i].placement)
            printf(" devices=%s", o->models[i].placement);
        printf("%s\n", o->models[i].from_file ? " (file)" : " (command line)");
    }
    printf("backend: %s cuda-slab=%s host-slab=%s", o->backend,
           o->cuda_slab == WB_CUDA_SLAB_IPC ? "ipc" : "vmm", o->host_memfd ? "memfd" : "shm");
    if (o->no_slab_pool || o->cuda_slab == WB_CUDA_SLAB_IPC)
        printf(" slab-pool=off\n");
    else
        printf(" slab-pool=%lds\n", o->num[WB_NUM_SLAB_POOL_SECONDS]
                                        ? o->num[WB_NUM_SLAB_POOL_SECONDS]
                                        : (long)WB_DEFAULT_SLAB_POOL_SECONDS);
    printf("share-tensors: %s\n", o->no_share_tensors ? "off" : "on (read-only transports)");
    if (o->device_budget_pct)
        printf("device-memory-budget: %u%%\n", o->device_budget_pct);
    else if (o->device_budget)
        printf("device-memory-budget: %llu bytes\n", (unsigned long long)o->device_budget);
    else
        printf("device-memory-budget: none\n");
    if (o->host_budget_pct)
        printf("host-memory-budget: %u%%\n", o->host_budget_pct);
    else if (o->host_budget)
        printf("host-memory-budget: %llu bytes\n", (unsigned long long)o->host_budget);
    else
        printf("host-memory-budget: none\n");
    printf("access: cuda %s, host %s\n",
           o->cuda_slab == WB_CUDA_SLAB_AUTO  ? "ro (cuda-vmm; cuda-ipc, rw, where the device "
                                                "lacks VMM descriptors)"
           : o->cuda_slab == WB_CUDA_SLAB_VMM ? "ro (cuda-vmm)"
                                              : "rw (cuda-ipc)",
           o->host_memfd ? "ro (sealed memfd)" : "ro mappings of named /dev/shm objects");
    printf("metrics: %s\nvalid\n", o->metrics ? o->metrics : "off");
    return 0;
}

int wb__options_reparse(const wb_options *running, wb_options *next, wb_err *err)
{
    wb__options_init(next);
    next->quiet = 1;
    if (!running->cmdline)
        return wb__err_set(err, WB_EINVAL, "the command line was not kept");
    if (!(next->reparsed = copy_argv(running->n_cmdline, running->cmdline)))
        return wb__err_set(err, WB_ENOMEM, "out of memory");
    next->n_cmdline = running->n_cmdline;
    int rc = wb__options_parse(next, next->n_cmdline, next->reparsed);
    if (rc == WB_OPTIONS_GO_ON) {
        next->check_config = 0;
        rc = wb__options_validate(next);
    }
    if (rc == WB_OPTIONS_GO_ON)
        return WB_OK;
    /* --help or --version cannot be in a command line the broker runs with. */
    return wb__err_set(err, WB_EINVAL, "%s", next->why[0] ? next->why : "the options are wrong");
}

void wb__options_limits(const wb_options *o, wb_limits *l)
{
    wb__limits_default(l);
    if (o->num[WB_NUM_MAX_LEASES])
        l->max_leases_per_client = (uint32_t)o->num[WB_NUM_MAX_LEASES];
    if (o->num[WB_NUM_MAX_MODELS])
        l->max_models = (uint32_t)o->num[WB_NUM_MAX_MODELS];
    if (o->num[WB_NUM_MAX_VERSIONS])
        l->max_versions = (uint32_t)o->num[WB_NUM_MAX_VERSIONS];
    if (o->num[WB_NUM_MAX_TENSORS])
        l->max_tensors = (uint64_t)o->num[WB_NUM_MAX_TENSORS];
    if (o->num[WB_NUM_MAX_SHARDS])
        l->max_shards = (uint64_t)o->num[WB_NUM_MAX_SHARDS];
    if (o->num[WB_NUM_MAX_MESSAGE])
        l->max_message = (uint64_t)o->num[WB_NUM_MAX_MESSAGE];
    if (o->num[WB_NUM_MAX_HEADER])
        l->max_header = (uint64_t)o->num[WB_NUM_MAX_HEADER];
}

const char *wb__options_num_name(wb_num_opt k)
{
    return k < WB_NUM_OPTS ? num_opts[k].name : "?";
}

void wb__options_init(wb_options *o)
{
    /* Read-only sharing unless asked otherwise: sealed memfds on the host,
     * cuda-vmm descriptors on GPUs that support them. */
    *o = (wb_options){.backend = "auto",
                      .host_memfd = 1,
                      .cuda_slab = WB_CUDA_SLAB_AUTO,
                      .log_level = -1,
                      .log_format = -1};
    wb__auth_init_default(&o->auth, (uint32_t)geteuid());
}
