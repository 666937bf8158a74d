/* What wbrokerd --help and --version print (options.c parses the options
 * they describe). */
#include "options.h"

#include "buildinfo.h"
#include "metrics.h"
#include "safetensors.h"
#include "wire.h"

#include <stdio.h>

void wb__options_usage(FILE *out)
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
            "  --model NAME=PATH[@DEVICES]\n"
            "                         load a safetensors checkpoint before serving, one copy\n"
            "                         per device of DEVICES (0,1 | all | GPU-<uuid>,...; also\n"
            "                         NAME@DEVICES=PATH), else on --device (repeatable;\n"
            "                         the host backend keeps one copy and ignores DEVICES)\n"
            "  --require-all-models   exit (status 1) when a model to load before serving\n"
            "                         cannot be loaded; by default the broker serves the\n"
            "                         others and lists that one as failed, with its error\n"
            "  --device N             default CUDA device for the cuda backend (default 0)\n"
            "  --read-threads N       loader threads reading checkpoints (default: 3/4 of\n"
            "                         the online cores, at most 16)\n"
            "  --staging-mib N        size of one pinned staging buffer, the unit of reads and\n"
            "                         copies, in MiB (cuda; default 2)\n"
            "  --staging-buffers N    pinned staging buffers, allocated once at start (cuda;\n"
            "                         default 64)\n"
            "  --copy-batch N         cuda, staged: filled buffers wait until N can go to\n"
            "                         the copy engine in one call, unless it is about to\n"
            "                         run dry (1 to 16, default 8)\n"
            "  --load-method staged|mapped\n"
            "                         cuda: copy through the pinned staging ring (default), or\n"
            "                         register each file mapping with cudaHostRegister\n"
            "  --read-source pread|mmap|mmap-nt|auto\n"
            "                         how readers take a checkpoint's bytes: pread, or\n"
            "                         copies from a mapping of the file, with non-temporal\n"
            "                         stores for mmap-nt (default pread); auto: mmap-nt\n"
            "                         for a file in the page cache, else pread\n"
            "  --staging-pages normal|huge\n"
            "                         cuda: the pinned ring in normal pages (default) or\n"
            "                         2 MiB pages (normal ones, logged, when none are had)\n"
            "  --register-threads N   cuda, mapped: register file mappings in 64 MiB pieces\n"
            "                         on N threads while copying (default: whole files\n"
            "                         first)\n"
            "  --host-slab memfd|shm  host: slabs as sealed memfds passed on the descriptor\n"
            "                         channel <socket>.fd (default: no /dev/shm names, no\n"
            "                         shared IPC or PID namespace needed), or as named\n"
            "                         POSIX shared memory that clients open by name\n"
            "  --cuda-slab vmm|ipc    cuda: slabs as cuMemCreate allocations passed as\n"
            "                         descriptors on <socket>.fd that clients map read-only\n"
            "                         (default where the device supports it), or as CUDA\n"
            "                         IPC handles that clients open read-write\n"
            "  --slab-pool-seconds N  cuda-vmm: keep a freed slab N seconds for the next load\n"
            "                         of its size on its device (default 30)\n"
            "  --no-slab-pool         free every slab at once\n"
            "  --no-share-tensors     load every tensor again even where an equal one is\n"
            "                         resident on the device (default: shared, read-only\n"
            "                         transports only)\n"
            "  --publish-streams N    cuda: streams per device a publish's copies are dealt\n"
            "                         to (default 4)\n"
            "  --heartbeat-ms N       heartbeat interval clients are told to use (default %d)\n"
            "  --stale-ms N           silence after which a lease is marked stale, at least\n"
            "                         twice --heartbeat-ms (default %d)\n"
            "  --max-heartbeat-rate N heartbeats a second asked of all peers together: with\n"
            "                         more peers, both values above are stretched by the\n"
            "                         same factor (default %d)\n"
            "  --log-level LEVEL      debug, info, warn or error (default info)\n\n"
            "access (LIST: comma-separated numeric ids or names; repeatable):\n"
            "  --allow-uid LIST       users that may lease models (default: root and the\n"
            "                         broker's own user only)\n"
            "  --allow-gid LIST       groups that may lease models (the peer's primary or a\n"
            "                         supplementary group)\n"
            "  --admin-uid LIST       users that may also load and unload models\n"
            "  --admin-gid LIST       groups that may also load and unload models (primary\n"
            "                         or supplementary)\n"
            "                         (root and the broker's own user always may)\n"
            "  --publisher-uid LIST   users that may publish new versions of models that\n"
            "                         exist from their own memory (administrators always may)\n"
            "  --publisher-gid LIST   groups that may publish (primary or supplementary)\n\n"
            "limits (each refusal is WB_ELIMIT naming the limit):\n"
            "  --max-leases-per-client N  leases one process may hold (default %d)\n"
            "  --max-models N         models held at once, loading and draining included\n"
            "                         (default %d; the versions of one name count once)\n"
            "  --max-versions N       versions of one model at once, loading, current and\n"
            "                         draining: a rollout beyond is refused (2 to %d,\n"
            "                         default %d)\n"
            "  --max-tensors N        tensors in one model, also entries of a shard index\n"
            "                         (default %d)\n"
            "  --max-shards N         shard files one index may name (default %d)\n"
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
            "                         (default 4)\n"
            "  --max-queued-bytes N   reply bytes queued for a peer that does not read; one\n"
            "                         reply always fits (default 8388608)\n"
            "  --max-queued-bytes-total N\n"
            "                         reply bytes queued for all peers beyond each one's\n"
            "                         first reply (default 268435456)\n"
            "  --max-peers-per-process N\n"
            "                         connections of one process (default 16)\n"
            "  --max-peers-per-uid N  connections of one uid on each socket, root and the\n"
            "                         broker's own uid aside (default half of --max-peers)\n"
            "  --max-sessions-per-uid N\n"
            "                         descriptor channel sessions of one uid whose pid is\n"
            "                         hidden (default 64)\n"
            "  --handshake-timeout-ms N\n"
            "                         time a connection has to complete the ZMTP\n"
            "                         handshake (default 2000)\n\n"
            "operations:\n"
            "  --config FILE          read options from an INI file first: [broker] keys are\n"
            "                         the long options above, [model NAME] sections have\n"
            "                         path = and devices =; options on the command line win\n"
            "  --check-config         check the configuration file, the options and that\n"
            "                         every model's path can be read, print the socket and\n"
            "                         models, and exit (0 when valid, 78 when the file is\n"
            "                         wrong, 2 for a wrong option)\n"
            "  --log-format text|json log lines as key=value text (default) or JSON objects\n"
            "  --metrics ADDR:PORT    serve Prometheus metrics at http://ADDR:PORT/metrics\n"
            "                         (default off; for example 127.0.0.1:9464)\n"
            "  --metrics-request-timeout-ms N\n"
            "                         time an HTTP connection has, from its accept or its\n"
            "                         last response, to send a whole request and take the\n"
            "                         response (default %d)\n\n"
            "  --version              print the version and exit\n"
            "  --help                 print this help and exit\n\n"
            "SIGTERM, SIGINT or SIGQUIT stops the broker: slab names and the socket are\n"
            "removed; clients keep the memory they have mapped. SIGHUP reads the --config\n"
            "file again and applies its limits, access lists and log level.\n",
            WB_DEFAULT_HEARTBEAT_MS, WB_DEFAULT_STALE_MS, WB_DEFAULT_HEARTBEAT_RATE,
            WB_DEFAULT_MAX_LEASES_PER_CLIENT, WB_DEFAULT_MAX_MODELS, WB_MAX_VERSIONS_LIMIT,
            WB_DEFAULT_MAX_VERSIONS, WB_DEFAULT_MAX_TENSORS, WB_DEFAULT_MAX_SHARDS, WB_MAX_MESSAGE,
            WB_MIN_MESSAGE, WB_ST_MAX_HEADER, WB_METRICS_REQUEST_TIMEOUT_MS);
}

void wb__options_print_version(void)
{
    /* What this build can do beyond the basics, for scripts. */
    char features[64];
    snprintf(features, sizeof features, "%csystemd %cmetrics",
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
    wb__print_version(stdout, "wbrokerd", features);
}
