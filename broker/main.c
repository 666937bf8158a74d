/* wbrokerd: the weightbroker daemon. Loads models into shared memory and
 * leases them to worker processes over a ZeroMQ ipc:// socket. It does not
 * fork itself; run it under a supervisor. */
#include "backend_pick.h"
#include "broker.h"
#include "config.h"
#include "gpu.h"
#include "log.h"
#include "loop.h"
#include "metrics.h"
#include "models.h"
#include "paths.h"
#include "safetensors.h"
#include "shm.h"
#include "wire.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <unistd.h>

#define EXIT_USAGE 2
/* sysexits.h's EX_CONFIG: the configuration file is wrong. */
#define EXIT_CONFIG 78

/* Operations options. */
#define OPT_CONFIG       0x1500
#define OPT_CHECK_CONFIG 0x1501
#define OPT_LOG_FORMAT   0x1502
#define OPT_METRICS      0x1503

/* Loader options (their values stay clear of the enum below). */
#define OPT_READ_THREADS    0x1400
#define OPT_STAGING_MIB     0x1401
#define OPT_STAGING_BUFFERS 0x1402
#define OPT_LOAD_METHOD     0x1403

/* Long options without a short letter. */
enum {
    OPT_ALLOW_UID = 256,
    OPT_ALLOW_GID,
    OPT_ADMIN_UID,
    OPT_ADMIN_GID,
    OPT_MAX_LEASES,
    OPT_MAX_MODELS,
    OPT_MAX_TENSORS,
    OPT_MAX_MESSAGE,
    OPT_MAX_HEADER,
    /* Transport bounds: OPT_TRANSPORT + index in transport_opts. */
    OPT_TRANSPORT = 0x1600,
};

/* Defaults of the transport bounds (loop.h). */
#define DEFAULT_MAX_REQUEST        (1u << 20)
#define DEFAULT_MAX_BUFFERED       (64u << 20)
#define DEFAULT_MAX_QUEUED_REPLIES 4
#define MAX_FRAMES                 4
/* Descriptors kept for everything but peers: libzmq's own (epoll, mailbox
 * eventfds, the listener), the loader's files and eventfd, slabs being
 * created, the metrics server, logs. */
#define RESERVED_FDS  64
#define MAX_PEERS_CAP 4096

/* The transport bounds, table-driven: name, least, most, where it goes. */
typedef struct transport_opt {
    const char *name;
    long min, max;
    const char *what;
} transport_opt;

enum { T_MAX_PEERS, T_MAX_REQUEST, T_MAX_BUFFERED, T_MAX_QUEUED, N_TRANSPORT };

static const transport_opt transport_opts[N_TRANSPORT] = {
    [T_MAX_PEERS] = {"max-peers", 1, 1000000, "a number of connections"},
    [T_MAX_REQUEST] = {"max-request-bytes", 256, 67108864, "a number of bytes"},
    [T_MAX_BUFFERED] = {"max-buffered-bytes", 4096, 1L << 40, "a number of bytes"},
    [T_MAX_QUEUED] = {"max-queued-replies", 1, 100000, "a number of replies"},
};

/* Raises the soft descriptor limit to the hard one, so that the peer cap
 * derived from it is as high as the system allows. Returns the limit now in
 * force. */
static long raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    rlim_t was = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = was;
    }
    wb_info("fd_limit", "soft=%llu hard=%llu raised_from=%llu", (unsigned long long)rl.rlim_cur,
            (unsigned long long)rl.rlim_max, (unsigned long long)was);
    return rl.rlim_cur > (rlim_t)(1L << 30) ? (1L << 30) : (long)rl.rlim_cur;
}

/* Each peer costs a connection descriptor and, once it leases, a pidfd:
 * half of what is left after the reserve, halved again for the
 * connections libzmq accepts before the loop closes the ones over the
 * cap. */
static unsigned default_max_peers(long nofile)
{
    long n = (nofile - RESERVED_FDS) / 4;
    if (n < 1)
        n = 1;
    return n > MAX_PEERS_CAP ? MAX_PEERS_CAP : (unsigned)n;
}

typedef struct preload {
    char *name;
    char *path;
    int device;    /* -1: the broker's --device */
    int from_file; /* given by a [model NAME] section of the configuration file */
    int line;      /* that section's line (or its device's), else 0 */
} preload;

/* Options a configuration file may not set. */
static const char *const command_line_only[] = {"config", "check-config", "help", "version", NULL};

/* The configuration file's options come first in the vector getopt_long
 * sees, before the command line's (see config.h); NULL without --config. */
static const wb_config *cfg_origin;

/* The line of the configuration file that the argument getopt_long returned
 * last comes from, or 0 when it comes from the command line. */
static int origin_line(void)
{
    int i = optind - 1;
    if (!cfg_origin || i < 1 || i > cfg_origin->n_args)
        return 0;
    return cfg_origin->lines[i - 1];
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: wbrokerd [OPTIONS]\n\n"
            "Loads models into shared memory and leases them to worker processes.\n\n"
            "options:\n"
            "  --socket PATH          socket to listen on (default: $WB_SOCKET, else\n"
            "                         $XDG_RUNTIME_DIR/wbroker/broker.sock, else\n"
            "                         /run/wbroker/broker.sock as root, else\n"
            "                         /tmp/wbroker-<uid>/broker.sock)\n"
            "  --backend auto|cuda|host\n"
            "                         where slabs live (default auto: cuda when a GPU is\n"
            "                         usable, else host)\n"
            "  --model NAME[@DEVICE]=PATH\n"
            "                         load a safetensors checkpoint before serving, on CUDA\n"
            "                         device DEVICE if given, else on --device (repeatable)\n"
            "  --device N             CUDA device for the cuda backend (default 0)\n"
            "  --read-threads N       loader threads reading checkpoints (default: 3/4 of\n"
            "                         the online cores, at most 16)\n"
            "  --staging-mib N        size of one pinned staging buffer, the unit of reads and\n"
            "                         copies, in MiB (cuda; default 4)\n"
            "  --staging-buffers N    pinned staging buffers, allocated once at start (cuda;\n"
            "                         default 32)\n"
            "  --load-method staged|mapped\n"
            "                         cuda: copy through the pinned staging ring (default), or\n"
            "                         register each file mapping with cudaHostRegister\n"
            "  --heartbeat-ms N       heartbeat interval clients are told to use (default %d)\n"
            "  --stale-ms N           silence after which a lease is marked stale (default %d)\n"
            "  --log-level LEVEL      debug, info, warn or error (default info)\n\n"
            "access (LIST: comma-separated numeric ids or names; repeatable):\n"
            "  --allow-uid LIST       users that may lease models (default: root and the\n"
            "                         broker's own user only)\n"
            "  --allow-gid LIST       primary groups that may lease models\n"
            "  --admin-uid LIST       users that may also load and unload models\n"
            "  --admin-gid LIST       primary groups that may also load and unload models\n"
            "                         (root and the broker's own user always may)\n\n"
            "limits (each refusal is WB_ELIMIT naming the limit):\n"
            "  --max-leases-per-client N  leases one process may hold (default %d)\n"
            "  --max-models N         models held at once, loading and draining included\n"
            "                         (default %d)\n"
            "  --max-tensors N        tensors in one model (default %d)\n"
            "  --max-message-bytes N  largest message either way (default and most %u,\n"
            "                         least %d)\n"
            "  --max-header-bytes N   largest safetensors header (default and most %llu)\n\n"
            "transport bounds (a peer over one is disconnected):\n"
            "  --max-peers N          connections at once (default: a quarter of the\n"
            "                         descriptor limit less 64, at most 4096)\n"
            "  --max-request-bytes N  largest incoming message (default 1048576)\n"
            "  --max-buffered-bytes N bytes of unfinished messages over all connections\n"
            "                         (default 67108864)\n"
            "  --max-queued-replies N replies queued for a peer that does not read\n"
            "                         (default 4)\n\n"
            "operations:\n"
            "  --config FILE          read options from an INI file first: [broker] keys are\n"
            "                         the long options above, [model NAME] sections have\n"
            "                         path = and device =; options on the command line win\n"
            "  --check-config         check the configuration file and options, print the\n"
            "                         socket and models, and exit (0 when valid, 78 when the\n"
            "                         file is wrong, 2 for a wrong option)\n"
            "  --log-format text|json log lines as key=value text (default) or JSON objects\n"
            "  --metrics ADDR:PORT    serve Prometheus metrics at http://ADDR:PORT/metrics\n"
            "                         (default off; for example 127.0.0.1:9464)\n\n"
            "  --version              print the version and exit\n"
            "  --help                 print this help and exit\n\n"
            "SIGTERM or SIGINT stops the broker: slab names and the socket are removed;\n"
            "clients keep the memory they have mapped.\n",
            WB_DEFAULT_HEARTBEAT_MS, WB_DEFAULT_STALE_MS, WB_DEFAULT_MAX_LEASES_PER_CLIENT,
            WB_DEFAULT_MAX_MODELS, WB_DEFAULT_MAX_TENSORS, WB_MAX_MESSAGE, WB_MIN_MESSAGE,
            WB_ST_MAX_HEADER);
}

static int misuse(const char *fmt, const char *a, const char *b)
{
    int line = origin_line();
    if (line > 0) {
        /* The file names options without their dashes. */
        char msg[WB_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, fmt, a, b);
        fprintf(stderr, "wbrokerd: %s:%d: %s\n", cfg_origin->file, line,
                strncmp(msg, "--", 2) == 0 ? msg + 2 : msg);
        return EXIT_CONFIG;
    }
    fprintf(stderr, "wbrokerd: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry 'wbrokerd --help'.\n");
    return EXIT_USAGE;
}

/* Reports why the broker cannot start or go on. In the JSON log format it
 * is a log line like the others, so that a log collector keeps it. */
__attribute__((format(printf, 1, 2))) static void fatal(const char *fmt, ...)
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

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"backend", required_argument, NULL, 'b'},
        {"model", required_argument, NULL, 'm'},
        {"device", required_argument, NULL, 'd'},
        {"read-threads", required_argument, NULL, OPT_READ_THREADS},
        {"staging-mib", required_argument, NULL, OPT_STAGING_MIB},
        {"staging-buffers", required_argument, NULL, OPT_STAGING_BUFFERS},
        {"load-method", required_argument, NULL, OPT_LOAD_METHOD},
        {"heartbeat-ms", required_argument, NULL, 'H'},
        {"stale-ms", required_argument, NULL, 'S'},
        {"log-level", required_argument, NULL, 'l'},
        {"allow-uid", required_argument, NULL, OPT_ALLOW_UID},
        {"allow-gid", required_argument, NULL, OPT_ALLOW_GID},
        {"admin-uid", required_argument, NULL, OPT_ADMIN_UID},
        {"admin-gid", required_argument, NULL, OPT_ADMIN_GID},
        {"max-leases-per-client", required_argument, NULL, OPT_MAX_LEASES},
        {"max-models", required_argument, NULL, OPT_MAX_MODELS},
        {"max-tensors", required_argument, NULL, OPT_MAX_TENSORS},
        {"max-message-bytes", required_argument, NULL, OPT_MAX_MESSAGE},
        {"max-header-bytes", required_argument, NULL, OPT_MAX_HEADER},
        {"max-peers", required_argument, NULL, OPT_TRANSPORT + T_MAX_PEERS},
        {"max-request-bytes", required_argument, NULL, OPT_TRANSPORT + T_MAX_REQUEST},
        {"max-buffered-bytes", required_argument, NULL, OPT_TRANSPORT + T_MAX_BUFFERED},
        {"max-queued-replies", required_argument, NULL, OPT_TRANSPORT + T_MAX_QUEUED},
        {"config", required_argument, NULL, OPT_CONFIG},
        {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
        {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
        {"metrics", required_argument, NULL, OPT_METRICS},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    wb__log_set_prog("wbrokerd");
    const char *socket_opt = NULL;
    const char *backend_opt = "auto";
    int device = 0, device_given = 0;
    wb_stage_config stage = {0};
    int load_mode = 0;
    long heartbeat_ms = WB_DEFAULT_HEARTBEAT_MS, stale_ms = WB_DEFAULT_STALE_MS;
    /* Static, so that the models stay reachable on the early exits of a
     * wrong option (a configuration file may have added some already). */
    static preload *models;
    size_t n_models = 0;
    int rc = 0, c;
    /* Static so that its lists stay reachable on every early exit (a leak
     * checker would otherwise report them). */
    static wb_auth auth;
    wb__auth_init_default(&auth, (uint32_t)geteuid());
    wb_limits limits;
    wb__limits_default(&limits);
    wb_err aerr;
    long num;
    long transport[N_TRANSPORT] = {0}; /* 0: not given */

    const char *metrics_addr = NULL;

    /* --config names a file whose options go before the command line's, so
     * that flags win: find it (and --check-config) first, acting on nothing
     * else. --help and --version work whatever the file holds. */
    const char *config_file = NULL;
    int check_config = 0, help_or_version = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == OPT_CONFIG)
            config_file = optarg;
        else if (c == OPT_CHECK_CONFIG)
            check_config = 1;
        else if (c == 'h' || c == 'V')
            help_or_version = 1;
    }
    /* Static, so that what they hold stays reachable on every early exit. */
    static wb_config config;
    static char **av;
    int ac = argc;
    av = argv;
    if (config_file && !help_or_version) {
        wb_err cerr;
        if (wb__config_load(config_file, opts, command_line_only, &config, &cerr) != WB_OK) {
            fprintf(stderr, "wbrokerd: %s\n", cerr.msg);
            wb__auth_destroy(&auth);
            return EXIT_CONFIG;
        }
        av = calloc((size_t)argc + (size_t)config.n_args + 1, sizeof *av);
        if (!av) {
            fprintf(stderr, "wbrokerd: out of memory\n");
            wb__auth_destroy(&auth);
            return 1;
        }
        av[0] = argv[0];
        for (int i = 0; i < config.n_args; i++)
            av[1 + i] = config.args[i];
        for (int i = 1; i < argc; i++)
            av[config.n_args + i] = argv[i];
        ac = argc + config.n_args;
        cfg_origin = &config;
    }

    optind = 0; /* start getopt_long afresh */
    opterr = 1;
    while ((c = getopt_long(ac, av, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            if (!optarg[0])
                return misuse("--socket: %s%s", "the path is empty", "");
            socket_opt = optarg;
            break;
        case 'b':
            if (strcmp(optarg, "auto") && strcmp(optarg, "cuda") && strcmp(optarg, "host"))
                return misuse("--backend: '%s' is not one of auto, cuda, host%s", optarg, "");
            backend_opt = optarg;
            break;
        case 'm': {
            wb_model_arg ma;
            wb_err merr;
            if (wb__config_parse_model(optarg, &ma, &merr) != WB_OK) {
                free(models);
                return misuse("--model: %s%s", merr.msg, "");
            }
            /* A model given on the command line replaces the configuration
             * file's model of the same name; any other repeat is a mistake. */
            int from_file = origin_line() > 0;
            size_t k = 0;
            while (k < n_models && strcmp(models[k].name, ma.name) != 0)
                k++;
            if (k < n_models && (from_file || !models[k].from_file)) {
                free(models);
                return misuse("--model: model '%s' is given twice%s", ma.name, "");
            }
            if (k == n_models) {
                preload *grown = realloc(models, (n_models + 1) * sizeof *models);
                if (!grown) {
                    fprintf(stderr, "wbrokerd: out of memory\n");
                    free(models);
                    return 1;
                }
                models = grown;
                n_models++;
            }
            optarg[strlen(ma.name)] = '\0'; /* ends the name at its '@' or '=' */
            models[k].name = optarg;
            models[k].path = (char *)ma.path;
            models[k].device = ma.device;
            models[k].from_file = from_file;
            models[k].line = origin_line();
            break;
        }
        case 'd': {
            if (strcmp(optarg, "0") == 0) {
                device = 0;
            } else {
                long v = parse_positive(optarg, 1023);
                if (v < 0)
                    return misuse("--device: '%s' is not a device number%s", optarg, "");
                device = (int)v;
            }
            device_given = 1;
            break;
        }
        case OPT_READ_THREADS:
        case OPT_STAGING_MIB:
        case OPT_STAGING_BUFFERS: {
            static const char *const what[] = {"--read-threads", "--staging-mib",
                                               "--staging-buffers"};
            static const long most[] = {WB_STAGE_MAX_THREADS, WB_STAGE_MAX_CHUNK >> 20,
                                        WB_STAGE_MAX_BUFFERS};
            int k = c - OPT_READ_THREADS;
            long v = parse_positive(optarg, most[k]);
            if (v < 0 || (c == OPT_STAGING_BUFFERS && v < 2)) {
                char msg[160];
                snprintf(msg, sizeof msg, "%s: '%.40s' is not a number from %d to %ld", what[k],
                         optarg, c == OPT_STAGING_BUFFERS ? 2 : 1, most[k]);
                free(models);
                return misuse("%s%s", msg, "");
            }
            if (c == OPT_READ_THREADS)
                stage.read_threads = (unsigned)v;
            else if (c == OPT_STAGING_MIB)
                stage.chunk_bytes = (uint64_t)v << 20;
            else
                stage.buffers = (unsigned)v;
            break;
        }
        case OPT_LOAD_METHOD:
            if (strcmp(optarg, "staged") == 0)
                load_mode = WB_STAGE_STAGED;
            else if (strcmp(optarg, "mapped") == 0)
                load_mode = WB_STAGE_MAPPED;
            else {
                free(models);
                return misuse("--load-method: '%s' is not one of staged, mapped%s", optarg, "");
            }
            break;
        case 'H':
            if ((heartbeat_ms = parse_positive(optarg, 86400000)) < 0)
                return misuse("--heartbeat-ms: '%s' is not a positive number of milliseconds%s",
                              optarg, "");
            break;
        case 'S':
            if ((stale_ms = parse_positive(optarg, 86400000)) < 0)
                return misuse("--stale-ms: '%s' is not a positive number of milliseconds%s", optarg,
                              "");
            break;
        case 'l': {
            int lvl = wb__log_parse_level(optarg);
            if (lvl < 0)
                return misuse("--log-level: '%s' is not one of debug, info, warn, error%s", optarg,
                              "");
            wb__log_set_level((wb_log_level)lvl);
            break;
        }
        case OPT_ALLOW_UID:
        case OPT_ALLOW_GID:
        case OPT_ADMIN_UID:
        case OPT_ADMIN_GID: {
            static const wb_auth_list which[] = {WB_AUTH_CLIENT_UIDS, WB_AUTH_CLIENT_GIDS,
                                                 WB_AUTH_ADMIN_UIDS, WB_AUTH_ADMIN_GIDS};
            static const char *const names[] = {"--allow-uid", "--allow-gid", "--admin-uid",
                                                "--admin-gid"};
            int k = c - OPT_ALLOW_UID;
            if (wb__auth_add(&auth, which[k], optarg, names[k], &aerr) != WB_OK) {
                wb__auth_destroy(&auth);
                free(models);
                return misuse("%s%s", aerr.msg, "");
            }
            break;
        }
        case OPT_MAX_LEASES:
        case OPT_MAX_MODELS:
            if ((num = parse_positive(optarg, 1000000000)) < 0) {
                wb__auth_destroy(&auth);
                free(models);
                return misuse("--%s: '%s' is not a positive number",
                              c == OPT_MAX_LEASES ? "max-leases-per-client" : "max-models", optarg);
            }
            if (c == OPT_MAX_LEASES)
                limits.max_leases_per_client = (uint32_t)num;
            else
                limits.max_models = (uint32_t)num;
            break;
        case OPT_MAX_TENSORS:
            if ((num = parse_positive(optarg, 1000000000)) < 0) {
                wb__auth_destroy(&auth);
                free(models);
                return misuse("--max-tensors: '%s' is not a positive number%s", optarg, "");
            }
            limits.max_tensors = (uint64_t)num;
            break;
        case OPT_MAX_MESSAGE:
            if ((num = parse_positive(optarg, WB_MAX_MESSAGE)) < WB_MIN_MESSAGE) {
                wb__auth_destroy(&auth);
                free(models);
                return misuse("--max-message-bytes: '%s' is not a number of bytes from 4096 to "
                              "%s",
                              optarg, "67108864 (clients accept no more)");
            }
            limits.max_message = (uint64_t)num;
            break;
        case OPT_MAX_HEADER:
            if ((num = parse_positive(optarg, (long)WB_ST_MAX_HEADER)) < 0) {
                wb__auth_destroy(&auth);
                free(models);
                return misuse("--max-header-bytes: '%s' is not a number of bytes from 1 to %s",
                              optarg, "100000000 (the safetensors limit)");
            }
            limits.max_header = (uint64_t)num;
            break;
        case OPT_TRANSPORT + T_MAX_PEERS:
        case OPT_TRANSPORT + T_MAX_REQUEST:
        case OPT_TRANSPORT + T_MAX_BUFFERED:
        case OPT_TRANSPORT + T_MAX_QUEUED: {
            const transport_opt *t = &transport_opts[c - OPT_TRANSPORT];
            if ((num = parse_positive(optarg, t->max)) < t->min) {
                wb__auth_destroy(&auth);
                free(models);
                char msg[WB_ERR_MSG_MAX];
                snprintf(msg, sizeof msg, "--%s: '%.200s' is not %s from %ld to %ld", t->name,
                         optarg, t->what, t->min, t->max);
                return misuse("%s%s", msg, "");
            }
            transport[c - OPT_TRANSPORT] = num;
            break;
        }
        case OPT_CONFIG:
        case OPT_CHECK_CONFIG:
            break; /* taken by the first pass */
        case OPT_LOG_FORMAT: {
            int fmt = wb__log_parse_format(optarg);
            if (fmt < 0) {
                wb__auth_destroy(&auth);
                free(models);
                return misuse("--log-format: '%s' is not text or json%s", optarg, "");
            }
            wb__log_set_format((wb_log_format)fmt);
            break;
        }
        case OPT_METRICS: {
            wb_err merr;
            if (wb__metrics_parse_addr(optarg, NULL, NULL, &merr) != WB_OK) {
                wb__auth_destroy(&auth);
                free(models);
                return misuse("--metrics: %s%s", merr.msg, "");
            }
            metrics_addr = optarg;
            break;
        }
        case 'V':
            printf("wbrokerd %s (protocol %d)\n", WB_VERSION, WB_PROTOCOL_VERSION);
            /* What this build can do beyond the basics, for scripts. */
            printf("features: %csystemd %cmetrics\n",
#ifdef WB_HAVE_SYSTEMD
                   '+',
#else
                   '-',
#endif
#ifdef WB_HAVE_MICROHTTPD
                   '+'
#else
                   '-'
#endif
            );
            wb__auth_destroy(&auth);
            free(models);
            return 0;
        case 'h':
            usage(stdout);
            wb__auth_destroy(&auth);
            free(models);
            return 0;
        default:
            /* getopt_long has already named the option. */
            fprintf(stderr, "Try 'wbrokerd --help'.\n");
            wb__auth_destroy(&auth);
            free(models);
            return origin_line() > 0 ? EXIT_CONFIG : EXIT_USAGE;
        }
    }
    cfg_origin = NULL;
    if (optind < ac) {
        wb__auth_destroy(&auth);
        free(models);
        return misuse("unexpected argument '%s'%s", av[optind], "");
    }
    /* A broker serves one CUDA device (its backend's stream and staging
     * ring live there): a model that names another one is a mistake. */
    for (size_t i = 0; i < n_models; i++) {
        if (models[i].device < 0 || models[i].device == device || strcmp(backend_opt, "host") == 0)
            continue;
        char msg[600];
        snprintf(msg, sizeof msg,
                 "model '%s' asks for device %d, but this broker serves device %d (--device); "
                 "run one broker per device",
                 models[i].name, models[i].device, device);
        if (models[i].line > 0)
            fprintf(stderr, "wbrokerd: %s:%d: %s\n", config.file, models[i].line, msg);
        else
            fprintf(stderr, "wbrokerd: --model: %s\nTry 'wbrokerd --help'.\n", msg);
        int from_file = models[i].line > 0;
        wb__auth_destroy(&auth);
        free(models);
        return from_file ? EXIT_CONFIG : EXIT_USAGE;
    }
    if (check_config) {
        /* Every option has been checked; nothing is started. What the
         * broker would use is printed for the operator to compare. */
        char sp[sizeof(((struct sockaddr_un *)0)->sun_path)];
        int ok = wb__socket_path(socket_opt, sp, sizeof sp) == WB_OK;
        if (ok) {
            printf("config: %s\nsocket: %s\n", config_file ? config_file : "(none)", sp);
            for (size_t i = 0; i < n_models; i++) {
                printf("model: %s path=%s", models[i].name, models[i].path);
                if (models[i].device >= 0)
                    printf(" device=%d", models[i].device);
                printf("%s\n", models[i].from_file ? " (file)" : " (command line)");
            }
            printf("metrics: %s\nvalid\n", metrics_addr ? metrics_addr : "off");
        } else {
            fprintf(stderr, "wbrokerd: the socket path is too long for a unix socket\n");
        }
        wb__auth_destroy(&auth);
        free(models);
        return ok ? 0 : EXIT_USAGE;
    }

    if (stale_ms <= heartbeat_ms)
        wb_warn("config",
                "note=\"stale-ms is not above heartbeat-ms: leases may go stale between "
                "heartbeats\" heartbeat_ms=%ld stale_ms=%ld",
                heartbeat_ms, stale_ms);

    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (wb__socket_path(socket_opt, socket_path, sizeof socket_path) != WB_OK) {
        fatal("the socket path is too long for a unix socket");
        free(models);
        return EXIT_USAGE;
    }

    /* Block the signals before any thread exists, so that only the loop's
     * signalfd sees them. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* The backend, once the signals are blocked: the CUDA runtime starts
     * threads of its own, and they must not take SIGTERM. */
    wb_err err;
    const wb_backend *backend = NULL;
    if (wb__backend_pick(backend_opt, device, &stage, load_mode, &backend, &err) != WB_OK) {
        fatal("%s", err.msg);
        free(models);
        return 1;
    }
    if (device_given && backend->proto == WBPROTO__BACKEND__BACKEND_HOST)
        wb_info("config", "note=\"--device is ignored by the host backend\" device=%d", device);
    if (wb__socket_prepare(socket_path, &err) != WB_OK) {
        fatal("%s", err.msg);
        free(models);
        return 1;
    }
    int removed = wb__shm_cleanup_stale();
    wb_info("shm_cleanup", "removed=%d", removed);
    wb_broker_config cfg = {
        .backend = backend,
        .device = backend->proto == WBPROTO__BACKEND__BACKEND_HOST ? -1 : device,
        .heartbeat_ms = (uint32_t)heartbeat_ms,
        .stale_ms = (uint32_t)stale_ms,
    };
    wb_broker b;
    wb__broker_init(&b, &cfg);
    /* The metrics endpoint comes before the preloads, so that a port in use
     * is reported at once rather than after minutes of loading; its first
     * page is rendered before it answers. */
    wb_metrics *metrics = NULL;
    if (metrics_addr && wb__metrics_start(metrics_addr, &b, &metrics, &err) != WB_OK) {
        fatal("%s", err.msg);
        wb__broker_destroy(&b);
        wb__auth_destroy(&auth);
        free(models);
        return 1;
    }
    b.metrics = metrics;
    /* The broker takes the access lists and limits from the options. */
    wb__auth_destroy(&b.auth);
    b.auth = auth;
    memset(&auth, 0, sizeof auth);
    b.limits = limits;
    b.slab_gid = wb__auth_slab_group(socket_path);
    char who[256], admins[256];
    wb_info("access", "clients=\"%s\" admins=\"%s\" slab_group=%lld",
            wb__auth_describe_clients(&b.auth, who, sizeof who),
            wb__auth_describe_admins(&b.auth, admins, sizeof admins), (long long)b.slab_gid);
    wb_info("limits",
            "max_leases_per_client=%u max_models=%u max_tensors=%llu max_message_bytes=%llu "
            "max_header_bytes=%llu",
            b.limits.max_leases_per_client, b.limits.max_models,
            (unsigned long long)b.limits.max_tensors, (unsigned long long)b.limits.max_message,
            (unsigned long long)b.limits.max_header);
    for (size_t i = 0; i < n_models; i++) {
        if (wb__broker_preload(&b, models[i].name, models[i].path, &err) != WB_OK) {
            fatal("cannot load model '%s': %s", models[i].name, err.msg);
            wb__broker_destroy(&b);
            wb__metrics_stop(&metrics);
            free(models);
            return 1;
        }
    }
    free(models);

    /* Loading may have taken a while: check once more that nobody took the
     * socket meanwhile. */
    if (wb__socket_prepare(socket_path, &err) != WB_OK) {
        fatal("%s", err.msg);
        wb__broker_destroy(&b);
        wb__metrics_stop(&metrics);
        return 1;
    }
    /* Descriptors: as many as the system allows, and a cap on peers that
     * keeps accept(2) from ever running out (libzmq aborts on EMFILE). */
    long nofile = raise_nofile();
    wb_loop_options lopt = {
        .max_peers =
            transport[T_MAX_PEERS] ? (unsigned)transport[T_MAX_PEERS] : default_max_peers(nofile),
        .max_request =
            transport[T_MAX_REQUEST] ? (size_t)transport[T_MAX_REQUEST] : DEFAULT_MAX_REQUEST,
        .max_frames = MAX_FRAMES,
        .max_buffered =
            transport[T_MAX_BUFFERED] ? (size_t)transport[T_MAX_BUFFERED] : DEFAULT_MAX_BUFFERED,
        .max_queued_replies =
            transport[T_MAX_QUEUED] ? (int)transport[T_MAX_QUEUED] : DEFAULT_MAX_QUEUED_REPLIES,
    };
    /* A request is never larger than a message may be. */
    if (lopt.max_request > b.limits.max_message)
        lopt.max_request = (size_t)b.limits.max_message;
    if ((long)lopt.max_peers > (nofile - RESERVED_FDS) / 2)
        wb_warn("config",
                "note=\"--max-peers %u leaves too few of %ld descriptors: accepting may "
                "fail\"",
                lopt.max_peers, nofile);
    rc = wb__loop_run(&b, socket_path, &lopt, &err);
    /* Slab names go with their models; clients keep their own mappings. */
    wb__broker_destroy(&b);
    wb__metrics_stop(&metrics);
    wb__backend_release(&backend);
    if (rc != WB_OK) {
        fatal("%s", err.msg);
        return 1;
    }
    return 0;
}
