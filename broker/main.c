/* wbrokerd: the weightbroker daemon. Loads models into shared memory and
 * leases them to worker processes over a ZeroMQ ipc:// socket. It does not
 * fork itself; run it under a supervisor. */
#include "broker.h"
#include "gpu.h"
#include "log.h"
#include "loop.h"
#include "models.h"
#include "paths.h"
#include "shm.h"
#include "wire.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#define EXIT_USAGE 2

typedef struct preload {
    char *name;
    char *path;
} preload;

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
            "                         where slabs live (default auto; auto picks host while the\n"
            "                         cuda backend's loader is not built)\n"
            "  --model NAME=PATH      load a safetensors checkpoint before serving (repeatable)\n"
            "  --device N             CUDA device for the cuda backend (default 0)\n"
            "  --heartbeat-ms N       heartbeat interval clients are told to use (default %d)\n"
            "  --stale-ms N           silence after which a lease is marked stale (default %d)\n"
            "  --log-level LEVEL      debug, info, warn or error (default info)\n"
            "  --version              print the version and exit\n"
            "  --help                 print this help and exit\n\n"
            "SIGTERM or SIGINT stops the broker: slab names and the socket are removed;\n"
            "clients keep the memory they have mapped.\n",
            WB_DEFAULT_HEARTBEAT_MS, WB_DEFAULT_STALE_MS);
}

static int misuse(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "wbrokerd: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry 'wbrokerd --help'.\n");
    return EXIT_USAGE;
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
        {"heartbeat-ms", required_argument, NULL, 'H'},
        {"stale-ms", required_argument, NULL, 'S'},
        {"log-level", required_argument, NULL, 'l'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    wb__log_set_prog("wbrokerd");
    const char *socket_opt = NULL;
    const char *backend_opt = "auto";
    int device = 0, device_given = 0;
    long heartbeat_ms = WB_DEFAULT_HEARTBEAT_MS, stale_ms = WB_DEFAULT_STALE_MS;
    preload *models = NULL;
    size_t n_models = 0;
    int rc = 0, c;

    opterr = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
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
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || !eq[1])
                return misuse("--model: '%s' is not NAME=PATH%s", optarg, "");
            *eq = '\0';
            if (!wb__model_name_valid(optarg))
                return misuse("--model: model name '%s' is not 1 to 255 characters of "
                              "A-Z a-z 0-9 . _ -%s",
                              optarg, "");
            for (size_t i = 0; i < n_models; i++) {
                if (strcmp(models[i].name, optarg) == 0)
                    return misuse("--model: model '%s' is given twice%s", optarg, "");
            }
            preload *grown = realloc(models, (n_models + 1) * sizeof *models);
            if (!grown) {
                fprintf(stderr, "wbrokerd: out of memory\n");
                return 1;
            }
            models = grown;
            models[n_models].name = optarg;
            models[n_models].path = eq + 1;
            n_models++;
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
        case 'V':
            printf("wbrokerd %s (protocol %d)\n", WB_VERSION, WB_PROTOCOL_VERSION);
            free(models);
            return 0;
        case 'h':
            usage(stdout);
            free(models);
            return 0;
        default:
            /* getopt_long has already named the option. */
            fprintf(stderr, "Try 'wbrokerd --help'.\n");
            free(models);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        free(models);
        return misuse("unexpected argument '%s'%s", argv[optind], "");
    }

    /* The backend. The cuda backend's loader does not exist yet; say so
     * rather than pretend. */
    const wb_backend *backend = &wb__backend_host;
    if (strcmp(backend_opt, "cuda") == 0) {
        int count = 0;
        wb_err err;
        if (wb__gpu_probe(&count, &err) != WB_OK)
            fprintf(stderr, "wbrokerd: %s\n", err.msg);
        else
            fprintf(stderr, "wbrokerd: the cuda backend's loader is not built yet; use --backend "
                            "host\n");
        free(models);
        return 1;
    }
    wb_info("backend", "backend=host requested=%s%s", backend_opt,
            strcmp(backend_opt, "auto") == 0
                ? " note=\"the cuda backend's loader is not built yet\""
                : "");
    if (device_given)
        wb_info("config", "note=\"--device is ignored by the host backend\" device=%d", device);
    if (stale_ms <= heartbeat_ms)
        wb_warn("config",
                "note=\"stale-ms is not above heartbeat-ms: leases may go stale between "
                "heartbeats\" heartbeat_ms=%ld stale_ms=%ld",
                heartbeat_ms, stale_ms);

    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (wb__socket_path(socket_opt, socket_path, sizeof socket_path) != WB_OK) {
        fprintf(stderr, "wbrokerd: the socket path is too long for a unix socket\n");
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

    wb_err err;
    if (wb__socket_prepare(socket_path, &err) != WB_OK) {
        fprintf(stderr, "wbrokerd: %s\n", err.msg);
        free(models);
        return 1;
    }
    int removed = wb__shm_cleanup_stale();
    wb_info("shm_cleanup", "removed=%d", removed);

    wb_broker_config cfg = {
        .backend = backend,
        .device = backend == &wb__backend_host ? -1 : device,
        .heartbeat_ms = (uint32_t)heartbeat_ms,
        .stale_ms = (uint32_t)stale_ms,
    };
    wb_broker b;
    wb__broker_init(&b, &cfg);
    for (size_t i = 0; i < n_models; i++) {
        if (wb__broker_preload(&b, models[i].name, models[i].path, &err) != WB_OK) {
            fprintf(stderr, "wbrokerd: cannot load model '%s': %s\n", models[i].name, err.msg);
            wb__broker_destroy(&b);
            free(models);
            return 1;
        }
    }
    free(models);

    /* Loading may have taken a while: check once more that nobody took the
     * socket meanwhile. */
    if (wb__socket_prepare(socket_path, &err) != WB_OK) {
        fprintf(stderr, "wbrokerd: %s\n", err.msg);
        wb__broker_destroy(&b);
        return 1;
    }
    rc = wb__loop_run(&b, socket_path, &err);
    if (rc != WB_OK) {
        fprintf(stderr, "wbrokerd: %s\n", err.msg);
        return 1;
    }
    return 0;
}
