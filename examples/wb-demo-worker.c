/* wb-demo-worker: the smallest honest use of libwbclient.
 *
 * Connects to the broker, leases a model, checks every tensor against the
 * checksum the broker computed while loading, then holds the lease (as a
 * real worker would while serving) until told to stop. Only the public
 * header is used, and buildinfo.h for --version's block (the project's own
 * programs print the same).
 *
 *   wb-demo-worker --model NAME [--hold SECONDS] [--verify-every MS]
 *                  [--socket PATH] [--reacquire] [--device N|GPU-UUID] [--allow-peer]
 *
 * --device names the device the lease is for (default: the current CUDA
 * device, 0 unless changed); --allow-peer accepts a copy on another device.
 *
 * While holding it reports, on stdout, when the connection to the broker is
 * lost and when the library has reconnected; the mapping stays valid either
 * way, and --verify-every keeps proving it.
 *
 * Exit codes: 0 every verification passed, 1 the broker could not be used,
 * 2 bad usage, 3 a tensor did not match its checksum. */
#include "buildinfo.h"
#include "wb/client.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG          "wb-demo-worker"
#define EXIT_BROKER   1
#define EXIT_USAGE    2
#define EXIT_MISMATCH 3
#define OPT_VERSION   256 /* long-only options */

/* The hold loop wakes at least this often to notice an orphaned lease. */
#define TICK_MS        100
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 2000

/* Every option of main()'s table, with its argument and default. */
static void usage(FILE *out)
{
    fprintf(out, "usage: wb-demo-worker --model NAME [--hold SECONDS] [--verify-every MS]\n"
                 "                      [--socket PATH] [--reacquire] [--device N|GPU-UUID]\n"
                 "                      [--allow-peer]\n"
                 "\n"
                 "Leases model NAME, verifies every tensor against the broker's checksum, and\n"
                 "holds the lease until SIGTERM or SIGINT.\n"
                 "\n"
                 "  --model NAME           the model to lease (required)\n"
                 "  --hold SECONDS         release after this long instead (fractions allowed;\n"
                 "                         0 releases at once)\n"
                 "  --verify-every MS      verify every tensor again this often while holding\n"
                 "                         (default: only once, at the start)\n"
                 "  --socket PATH          the broker's socket (default: $WB_SOCKET, else\n"
                 "                         $XDG_RUNTIME_DIR/wbroker/broker.sock, else\n"
                 "                         /run/wbroker/broker.sock as root, else\n"
                 "                         /tmp/wbroker-UID/broker.sock)\n"
                 "  --reacquire            when a restarted broker no longer knows the lease,\n"
                 "                         acquire a new one (retrying with backoff)\n"
                 "  --device N|GPU-UUID    the CUDA device the lease is for, by this process's\n"
                 "                         ordinal or by UUID (default: the current device)\n"
                 "  --allow-peer           accept the model's copy on another device when it has\n"
                 "                         none on that one\n"
                 "  --version              print the version and build, then exit\n"
                 "  -h, --help             print this help, then exit\n"
                 "\n"
                 "$WB_TIMEOUT_MS: each broker request's timeout (default 5000).\n"
                 "Exit status: 0 every verification passed, 1 the broker could not be used\n"
                 "(the reason is on stderr), 2 bad usage, 3 a tensor did not match its\n"
                 "checksum.\n");
}

/* A misused command line: what was wrong, then where help is. Returns
 * EXIT_USAGE. */
__attribute__((format(printf, 1, 2))) static int misuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '" PROG " --help'.\n");
    return EXIT_USAGE;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits up to `seconds` for SIGTERM or SIGINT (both blocked, so none is
 * lost between checks). Returns 1 if one arrived. */
static int wait_signal(const sigset_t *set, double seconds)
{
    if (seconds < 0)
        seconds = 0;
    struct timespec ts = {.tv_sec = (time_t)seconds};
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    for (;;) {
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig > 0)
            return 1;
        if (errno == EAGAIN)
            return 0;
        /* EINTR from another signal: wait again for the rest (approximately). */
    }
}

/* Verifies every tensor; prints the first mismatch. Returns 0, or 1 on a
 * mismatch (or any other failure to verify). */
static int verify(wb_client *client, const wb_lease *lease)
{
    size_t bad = 0;
    int rc = wb_lease_verify(lease, &bad);
    if (rc == WB_OK)
        return 0;
    wb_tensor_view v;
    if (rc == WB_ECORRUPT && wb_lease_tensor(lease, bad, &v) == WB_OK)
        printf("verify failed: %s\n", v.name);
    else
        printf("verify failed: %s\n", wb_client_errmsg(client));
    fflush(stdout);
    return 1;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 1e9)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"hold", required_argument, NULL, 'H'},
        {"verify-every", required_argument, NULL, 'v'},
        {"socket", required_argument, NULL, 's'},
        {"reacquire", no_argument, NULL, 'r'},
        {"device", required_argument, NULL, 'd'},
        {"allow-peer", no_argument, NULL, 'P'},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* A worker shows the library's log lines on its own stderr. */
    wb_set_log_handler(wb_log_stderr, NULL);
    const char *model = NULL;
    const char *socket_path = NULL;
    double hold = -1;
    double verify_every = 0;
    int reacquire = 0;
    wb_lease_options lo = {.device = WB_LEASE_DEVICE_CURRENT};
    int c;
    /* getopt's own messages would name the program by its full argv[0]. */
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'H':
            if (parse_double(optarg, &hold) != 0)
                return misuse("--hold: expected seconds, got '%s'", optarg);
            break;
        case 'v':
            if (parse_double(optarg, &verify_every) != 0 || verify_every < 1)
                return misuse("--verify-every: expected milliseconds, got '%s'", optarg);
            verify_every /= 1000.0;
            break;
        case 's':
            socket_path = optarg;
            break;
        case 'd':
            if (strncmp(optarg, "GPU-", 4) == 0 || strncmp(optarg, "MIG-", 4) == 0) {
                lo.device_uuid = optarg;
            } else {
                char *end;
                errno = 0;
                long d = strtol(optarg, &end, 10);
                if (errno || end == optarg || *end || d < 0 || d > 1023)
                    return misuse("--device: expected an ordinal or a GPU UUID, got '%s'", optarg);
                lo.device = (int)d;
            }
            break;
        case 'P':
            lo.allow_peer = 1;
            break;
        case 'r':
            reacquire = 1;
            break;
        case OPT_VERSION:
            wb__print_version(stdout, PROG, NULL);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        case ':':
            return misuse("option '%s' needs an argument", argv[optind - 1]);
        default:
            /* A long option is named as written; a short one by optopt (it
             * may be inside a group of them). */
            if (strncmp(argv[optind - 1], "--", 2) == 0)
                return misuse("unrecognized option '%s'", argv[optind - 1]);
            return misuse("unrecognized option '-%c'", optopt);
        }
    }
    if (optind < argc)
        return misuse("unexpected argument '%s'", argv[optind]);
    if (!model || !model[0])
        return misuse("--model NAME is required");

    /* Block the stop signals before the library starts its heartbeat thread,
     * so that they are only ever taken by sigtimedwait below. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigprocmask(SIG_BLOCK, &stop, NULL);

    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = socket_path;
    o.client_name = "wb-demo-worker";
    wb_client *client = NULL;
    int rc = wb_client_connect(&o, &client);
    if (rc != WB_OK) {
        fprintf(stderr, "wb-demo-worker: %s\n", wb_client_errmsg(client));
        wb_client_destroy(&client);
        return EXIT_BROKER;
    }
    wb_lease *lease = NULL;
    rc = wb_lease_acquire_ex(client, model, &lo, &lease);
    if (rc != WB_OK) {
        fprintf(stderr, "wb-demo-worker: %s\n", wb_client_errmsg(client));
        wb_client_destroy(&client);
        return EXIT_BROKER;
    }
    char id[33];
    wb_lease_id_hex(lease, id);
    printf("lease %s model %s device %d\n", id, model, wb_lease_device(lease));
    int status = 0;
    if (verify(client, lease) != 0) {
        status = EXIT_MISMATCH;
    } else {
        printf("verified %zu tensors\n", wb_lease_tensor_count(lease));
    }
    fflush(stdout);

    double start = now_s();
    double next_verify = start + verify_every;
    double backoff = BACKOFF_MIN_MS / 1000.0;
    double next_try = 0;
    int was_connected = 1;
    unsigned verifications = 1;
    while (status == 0) {
        double now = now_s();
        double wake = now + TICK_MS / 1000.0;
        if (hold >= 0 && start + hold < wake)
            wake = start + hold;
        if (verify_every > 0 && next_verify < wake)
            wake = next_verify;
        if (wait_signal(&stop, wake - now))
            break;
        now = now_s();
        if (hold >= 0 && now >= start + hold)
            break;
        int connected = wb_client_connected(client);
        if (connected != was_connected) {
            printf(connected ? "broker connection restored\n" : "broker connection lost\n");
            fflush(stdout);
            was_connected = connected;
        }
        if (verify_every > 0 && now >= next_verify) {
            if (verify(client, lease) != 0) {
                status = EXIT_MISMATCH;
                break;
            }
            verifications++;
            next_verify = now + verify_every;
        }
        if (reacquire && wb_lease_orphaned(lease) && now >= next_try) {
            /* Keep the old lease (and its mapping) until a new one is
             * granted, so the bytes stay usable while the broker is away. */
            wb_lease *fresh = NULL;
            if (wb_lease_acquire_ex(client, model, &lo, &fresh) == WB_OK) {
                wb_lease_release(&lease);
                lease = fresh;
                wb_lease_id_hex(lease, id);
                printf("reacquired lease %s\n", id);
                fflush(stdout);
                backoff = BACKOFF_MIN_MS / 1000.0;
            } else {
                next_try = now + backoff;
                backoff =
                    backoff * 2 > BACKOFF_MAX_MS / 1000.0 ? BACKOFF_MAX_MS / 1000.0 : backoff * 2;
            }
        }
    }

    if (status == 0) {
        printf("verifications passed: %u\n", verifications);
        fflush(stdout);
    }
    int orphaned = wb_lease_orphaned(lease);
    rc = wb_lease_release(&lease);
    if (rc == WB_OK && orphaned)
        printf("released (broker gone: the lease was granted by a broker that restarted)\n");
    else if (rc == WB_OK)
        printf("released\n");
    else if (rc == WB_ECONN)
        printf("released (broker gone)\n");
    else
        printf("released (the broker said: %s)\n", wb_client_errmsg(client));
    fflush(stdout);
    wb_client_destroy(&client);
    return status;
}
