/* A scriptable broker client for the integration tests: it does what a
 * well-behaved worker would not (release another process's lease, send
 * arbitrary bytes) and reports the broker's exact answer.
 *
 *   wbtest_client [--socket PATH] acquire MODEL   print the lease id, hold it
 *                                                 until SIGTERM, then release
 *   wbtest_client [--socket PATH] release HEX     release lease HEX by id
 *   wbtest_client [--socket PATH] raw HEXBYTES    send one frame of raw bytes
 *   wbtest_client [--socket PATH] acquire-n MODEL N
 *                                 acquire N leases in this one process,
 *                                 print "acquired K", release them all
 *   wbtest_client [--socket PATH] forge MODEL KIND
 *                                 acquire a lease, print its id, send one
 *                                 heartbeat with forged container records
 *                                 and print "heartbeat status=S" and
 *                                 "error=TEXT"; then hold the lease until
 *                                 SIGTERM. KIND: dup (a container id twice),
 *                                 over (more records than containers), full
 *                                 (16 records with 1000-byte paths), escape
 *                                 (a model_path with terminal controls and
 *                                 format characters), badutf8 (a
 *                                 model_path that is not UTF-8)
 *
 *   wbtest_client [--socket PATH] acquire-exec MODEL CMD ARGS...
 *                                 acquire a lease, print its id, then exec
 *                                 CMD (same process, same pid) with every
 *                                 argument "{}" replaced by the id
 *
 *   wbtest_client [--socket PATH] acquire-dump MODEL
 *                                 acquire a lease (libwbclient), print its
 *                                 id, then "NAME HEXBYTES" per tensor read
 *                                 through the mapping, then "end"; hold it
 *                                 until SIGTERM, then release
 *   wbtest_client [--socket PATH] acquire-plain MODEL
 *                                 as a client that predates sessions: a
 *                                 hello without a session token, an
 *                                 acquire, then the lease's descriptors
 *                                 fetched on the descriptor channel; print
 *                                 "lease HEX fds=N" (or "error=TEXT" and
 *                                 exit 1) and hold until SIGTERM
 *   wbtest_client [--socket PATH] hello-token HEX
 *                                 one hello carrying HEX as its session
 *                                 token; print "status=S", "error=TEXT"
 *                                 and "peer_pid=N"
 *
 * --comm NAME (before the command) sets the process name the broker reads
 * from /proc (prctl PR_SET_NAME), bytes as given. --zmq-heartbeat-ms N sets
 * ZMQ_HEARTBEAT_IVL (and a timeout of 3 N) on the bare sockets below: libzmq
 * then sends PINGs and drops a connection whose PONGs do not come.
 *
 *   wbtest_client stats-loop COUNT GAP_MS
 *                                     COUNT stats requests GAP_MS apart on one
 *                                     bare socket, each waiting for its reply;
 *                                     prints "sent=N replies=M max_ms=X"
 *
 * On a socket of its own, waiting at most --wait MS (default 2000) for an
 * answer, printing "status=S id=I" and "error=TEXT" or "no reply":
 *
 *   wbtest_client frames HEX HEX...   one message of several frames
 *   wbtest_client big N [HEXBYTE]     one frame of N bytes (all HEXBYTE, 0x41
 *                                     by default), e.g. beyond the size limit
 *   wbtest_client file PATH           one frame holding the file's bytes
 *   wbtest_client random COUNT SEED MAXLEN
 *                                     COUNT frames of random bytes (1..MAXLEN
 *                                     long), one after the other; prints
 *                                     "sent=N replies=M"
 *
 * Exit codes: 0 the broker accepted, 1 it refused (its message on stderr),
 * 2 misuse, 4 no reply within the wait, 69 no broker answered. */
#include "wb/client.h"

#include "fdchan.h"
#include "fdchan_wire.h"
#include "paths.h"
#include "rpc.h"
#include "wire.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <zmq.h>

#define EXIT_NO_REPLY 4

static const char *socket_path;
static int wait_ms = 2000;

static int usage(void)
{
    fprintf(stderr,
            "usage: wbtest_client [--socket PATH] [--wait MS] acquire MODEL | release HEX "
            "| raw HEXBYTES | acquire-n MODEL N | frames HEX... | big N [HEXBYTE] | "
            "file PATH | random COUNT SEED MAXLEN | acquire-dump MODEL | acquire-plain MODEL | "
            "hello-token HEX\n");
    return 2;
}

static int unhex(const char *s, uint8_t *out, size_t cap, size_t *len)
{
    size_t n = strlen(s);
    if (n % 2 || n / 2 > cap)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    *len = n / 2;
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int zmq_heartbeat_ms; /* --zmq-heartbeat-ms, 0: libzmq's default (none) */

/* A bare DEALER on the broker's socket, for messages the library would
 * never send. */
typedef struct bare {
    void *ctx, *sock;
} bare;

static int bare_open(bare *b)
{
    char path[WB_RPC_PATH_MAX], ep[WB_RPC_PATH_MAX + 8];
    if (wb__socket_path(socket_path, path, sizeof path) != WB_OK ||
        wb__socket_endpoint(path, ep, sizeof ep) != WB_OK)
        return -1;
    b->ctx = zmq_ctx_new();
    b->sock = b->ctx ? zmq_socket(b->ctx, ZMQ_DEALER) : NULL;
    int linger = 0, hb_timeout = zmq_heartbeat_ms * 3;
    if (!b->sock || zmq_setsockopt(b->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        (zmq_heartbeat_ms > 0 &&
         (zmq_setsockopt(b->sock, ZMQ_HEARTBEAT_IVL, &zmq_heartbeat_ms, sizeof(int)) != 0 ||
          zmq_setsockopt(b->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof(int)) != 0)) ||
        zmq_connect(b->sock, ep) != 0) {
        fprintf(stderr, "wbtest_client: cannot connect to %s: %s\n", ep, zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

static void bare_close(bare *b)
{
    if (b->sock)
        zmq_close(b->sock);
    if (b->ctx)
        zmq_ctx_term(b->ctx);
}

/* Sends n frames; 0 on success. */
static int bare_send(bare *b, uint8_t *const *frames, const size_t *lens, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (zmq_send(b->sock, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0) {
            fprintf(stderr, "wbtest_client: send: %s\n", zmq_strerror(zmq_errno()));
            return -1;
        }
    }
    return 0;
}

/* Waits for one reply and prints it. Returns 0 (status 0), 1 (an error
 * status), EXIT_NO_REPLY, or 3 for a reply that does not decode. */
static int bare_reply(bare *b, int quiet)
{
    int64_t deadline = now_ms() + wait_ms;
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left < 0)
            left = 0;
        zmq_pollitem_t it = {.socket = b->sock, .events = ZMQ_POLLIN};
        int n = zmq_poll(&it, 1, (long)left);
        if (n < 0 && zmq_errno() == EINTR)
            continue;
        if (n <= 0) {
            if (!quiet)
                printf("no reply\n");
            return EXIT_NO_REPLY;
        }
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, b->sock, 0) < 0) {
            zmq_msg_close(&msg);
            continue;
        }
        Wbproto__Reply *rep = NULL;
        wb_err err;
        int rc = wb__reply_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &rep, &err);
        zmq_msg_close(&msg);
        if (rc != WB_OK) {
            printf("undecodable reply: %s\n", err.msg);
            return 3;
        }
        int st = rep->status;
        if (!quiet) {
            printf("status=%d id=%llu\n", st, (unsigned long long)rep->id);
            if (st != 0)
                printf("error=%s\n", rep->error ? rep->error : "");
        }
        wb__reply_free(&rep);
        return st == 0 ? 0 : 1;
    }
}

/* Stats requests one at a time, each answered before the next goes. */
static int cmd_stats_loop(const char *count, const char *gap)
{
    int n = atoi(count), gap_ms = atoi(gap);
    if (n <= 0 || gap_ms < 0)
        return usage();
    bare b = {0};
    if (bare_open(&b) != 0) {
        bare_close(&b);
        return 69;
    }
    int replies = 0;
    int64_t worst = 0;
    for (int i = 0; i < n; i++) {
        /* version 1, id i + 1, an empty StatsRequest (field 18). */
        uint8_t req[16] = {0x08, 0x01, 0x10, (uint8_t)(1 + i % 100), 0x92, 0x01, 0x00};
        uint8_t *frames[1] = {req};
        size_t lens[1] = {7};
        int64_t t0 = now_ms();
        if (bare_send(&b, frames, lens, 1) != 0)
            break;
        if (bare_reply(&b, 1) != 0)
            break;
        int64_t took = now_ms() - t0;
        if (took > worst)
            worst = took;
        replies++;
        struct timespec ts = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    printf("sent=%d replies=%d max_ms=%lld\n", n, replies, (long long)worst);
    bare_close(&b);
    return replies == n ? 0 : 1;
}

static int cmd_frames(int argc, char **argv)
{
    size_t n = (size_t)argc;
    uint8_t **frames = calloc(n, sizeof *frames);
    size_t *lens = calloc(n, sizeof *lens);
    int rc = 2;
    bare b = {0};
    if (!frames || !lens)
        goto out;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(argv[i]) / 2;
        frames[i] = malloc(len + 1);
        if (!frames[i] || unhex(argv[i], frames[i], len + 1, &lens[i]) != 0)
            goto out;
    }
    rc = 69;
    if (bare_open(&b) != 0 || bare_send(&b, frames, lens, n) != 0)
        goto out;
    rc = bare_reply(&b, 0);
out:
    bare_close(&b);
    for (size_t i = 0; frames && i < n; i++)
        free(frames[i]);
    free(frames);
    free(lens);
    return rc == 2 ? usage() : rc;
}

static int cmd_big(const char *count, const char *byte)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(count, &end, 10);
    unsigned v = 0x41;
    if (errno || *end || n == 0 || n > (1ull << 31) || (byte && sscanf(byte, "%2x", &v) != 1))
        return usage();
    uint8_t *buf = malloc((size_t)n);
    if (!buf) {
        fprintf(stderr, "wbtest_client: out of memory for %llu bytes\n", n);
        return 1;
    }
    memset(buf, (int)v, (size_t)n);
    bare b = {0};
    int rc = 69;
    size_t len = (size_t)n;
    if (bare_open(&b) == 0 && bare_send(&b, &buf, &len, 1) == 0)
        rc = bare_reply(&b, 0);
    bare_close(&b);
    free(buf);
    return rc;
}

static int cmd_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    struct stat st;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (fstat(fileno(f), &st) == 0 && st.st_size > 0 && (buf = malloc((size_t)st.st_size)))
        len = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (!buf || len == 0) {
        free(buf);
        fprintf(stderr, "wbtest_client: cannot read %s\n", path);
        return 2;
    }
    bare b = {0};
    int rc = 69;
    if (bare_open(&b) == 0 && bare_send(&b, &buf, &len, 1) == 0)
        rc = bare_reply(&b, 0);
    bare_close(&b);
    free(buf);
    return rc;
}

/* xorshift64*: reproducible bytes from a seed. */
static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int cmd_random(const char *count, const char *seed, const char *maxlen)
{
    long n = atol(count), max = atol(maxlen);
    uint64_t s = strtoull(seed, NULL, 10) | 1;
    if (n <= 0 || max <= 0 || max > 1 << 20)
        return usage();
    uint8_t *buf = malloc((size_t)max);
    bare b = {0};
    if (!buf || bare_open(&b) != 0) {
        free(buf);
        bare_close(&b);
        return 69;
    }
    long replies = 0;
    for (long i = 0; i < n; i++) {
        size_t len = 1 + (size_t)(next_rand(&s) % (uint64_t)max);
        for (size_t k = 0; k < len; k++)
            buf[k] = (uint8_t)next_rand(&s);
        if (bare_send(&b, &buf, &len, 1) != 0)
            break;
        if (bare_reply(&b, 1) != EXIT_NO_REPLY)
            replies++;
    }
    printf("sent=%ld replies=%ld\n", n, replies);
    bare_close(&b);
    free(buf);
    return replies == n ? 0 : EXIT_NO_REPLY;
}

/* Acquires up to n leases in this process; prints how many it got and the
 * first refusal, then releases them all. */
static int cmd_acquire_n(const char *model, const char *count)
{
    long n = atol(count);
    if (n <= 0 || n > 100000)
        return usage();
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = socket_path;
    wb_client *c = NULL;
    if (wb_client_connect(&o, &c) != WB_OK) {
        fprintf(stderr, "wbtest_client: %s\n", wb_client_errmsg(c));
        wb_client_destroy(&c);
        return 69;
    }
    wb_lease **leases = calloc((size_t)n, sizeof *leases);
    long got = 0;
    int rc = WB_OK;
    while (leases && got < n && (rc = wb_lease_acquire(c, model, &leases[got])) == WB_OK)
        got++;
    printf("acquired %ld\n", got);
    if (rc != WB_OK)
        printf("error=%s (%s)\n", wb_client_errmsg(c), wb_status_name(rc));
    fflush(stdout);
    for (long i = 0; i < got; i++)
        wb_lease_release(&leases[i]);
    free(leases);
    wb_client_destroy(&c);
    return got == n ? 0 : 1;
}

/* A well-formed lease whose heartbeat carries records a real client would
 * never send. */
static int cmd_forge(const char *model, const char *kind)
{
    enum { N = 16 };
    static char path[1001];
    Wbproto__ContainerRecord recs[N], *ptrs[N];
    size_t n;
    uint32_t containers;
    memset(path, 'p', sizeof path - 1);
    path[0] = '/';
    for (size_t i = 0; i < N; i++) {
        wbproto__container_record__init(&recs[i]);
        recs[i].container_id = i + 1;
        recs[i].aoti_api = "CreateWithDevice";
        recs[i].model_path = "/models/m.pt2";
        recs[i].bound_bytes = 64;
        recs[i].bound_tensors = 1;
        ptrs[i] = &recs[i];
    }
    if (strcmp(kind, "dup") == 0) {
        n = 3;
        containers = 3;
        recs[2].container_id = recs[0].container_id;
    } else if (strcmp(kind, "over") == 0) {
        n = 3;
        containers = 1;
    } else if (strcmp(kind, "full") == 0) {
        n = N;
        containers = N;
        for (size_t i = 0; i < N; i++)
            recs[i].model_path = path;
    } else if (strcmp(kind, "escape") == 0) {
        n = 1;
        containers = 1;
        recs[0].model_path = "/m/\x1b]0;owned\x07\x1b[31mred\n"
                             "FORGED LINE\r\xc2\x9b\xe2\x80\xae"
                             "exe.\xe2\x80\x8bpt2";
    } else if (strcmp(kind, "badutf8") == 0) {
        n = 1;
        containers = 1;
        recs[0].model_path = "/models/\xe6\xa8\xa1/\xff.pt2";
    } else {
        return usage();
    }
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigprocmask(SIG_BLOCK, &stop, NULL);
    wb__rpc rpc;
    wb_err err;
    if (wb__rpc_open(&rpc, socket_path, 0, &err) != WB_OK) {
        fprintf(stderr, "wbtest_client: %s\n", err.msg);
        wb__rpc_close(&rpc);
        return 69;
    }
    Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
    acq.model = (char *)model;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &acq;
    Wbproto__Reply *rep = NULL;
    if (wb__rpc_call(&rpc, &req, 0, &rep, &err) != WB_OK) {
        fprintf(stderr, "wbtest_client: acquire: %s\n", err.msg);
        wb__reply_free(&rep);
        wb__rpc_close(&rpc);
        return 1;
    }
    uint8_t id[16];
    memcpy(id, rep->acquire->lease->id.data, 16);
    wb__reply_free(&rep);
    for (int i = 0; i < 16; i++)
        printf("%02x", id[i]);
    printf("\n");
    Wbproto__LeaseBeat beat = WBPROTO__LEASE_BEAT__INIT;
    beat.lease_id.data = id;
    beat.lease_id.len = 16;
    beat.containers = containers;
    beat.n_container_records = n;
    beat.container_records = ptrs;
    Wbproto__LeaseBeat *beats[] = {&beat};
    Wbproto__HeartbeatRequest hb = WBPROTO__HEARTBEAT_REQUEST__INIT;
    hb.n_leases = 1;
    hb.leases = beats;
    req.body_case = WBPROTO__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    int rc = wb__rpc_call(&rpc, &req, 0, &rep, &err);
    printf("heartbeat status=%d\n", rep ? (int)rep->status : rc);
    if (rc != WB_OK)
        printf("error=%s\n", err.msg);
    fflush(stdout);
    wb__reply_free(&rep);
    int sig;
    sigwait(&stop, &sig);
    wb__rpc_close(&rpc);
    return 0;
}

/* The lease stays with this process (its pid) across the exec: the
 * program that follows, maybe under another uid, is the same process to
 * the kernel. */
static int cmd_acquire_exec(const char *model, char **cmd)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = socket_path;
    wb_client *c = NULL;
    wb_lease *l = NULL;
    int rc = wb_client_connect(&o, &c);
    if (rc == WB_OK)
        rc = wb_lease_acquire(c, model, &l);
    if (rc != WB_OK) {
        fprintf(stderr, "wbtest_client: %s\n", wb_client_errmsg(c));
        return 1;
    }
    static char hex[33];
    wb_lease_id_hex(l, hex);
    printf("%s\n", hex);
    fflush(stdout);
    for (char **a = cmd; *a; a++) {
        if (strcmp(*a, "{}") == 0)
            *a = hex;
    }
    execvp(cmd[0], cmd);
    fprintf(stderr, "wbtest_client: exec %s: %s\n", cmd[0], strerror(errno));
    return 2;
}

static void block_stop(sigset_t *stop)
{
    sigemptyset(stop);
    sigaddset(stop, SIGTERM);
    sigaddset(stop, SIGINT);
    sigprocmask(SIG_BLOCK, stop, NULL);
}

/* Every tensor's bytes as read through the client's mapping, for the test
 * to compare with the checkpoint file. */
static int cmd_acquire_dump(const char *model)
{
    sigset_t stop;
    block_stop(&stop);
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = socket_path;
    wb_client *c = NULL;
    wb_lease *l = NULL;
    int rc = wb_client_connect(&o, &c);
    if (rc == WB_OK)
        rc = wb_lease_acquire(c, model, &l);
    if (rc != WB_OK) {
        printf("error=%s\n", wb_client_errmsg(c));
        wb_client_destroy(&c);
        return rc == WB_ECONN || rc == WB_ETIMEDOUT ? 69 : 1;
    }
    char hex[33];
    wb_lease_id_hex(l, hex);
    printf("%s\n", hex);
    for (size_t i = 0; i < wb_lease_tensor_count(l); i++) {
        wb_tensor_view v;
        if (wb_lease_tensor(l, i, &v) != WB_OK)
            break;
        printf("%s ", v.name);
        for (uint64_t k = 0; k < v.nbytes; k++)
            printf("%02x", ((const uint8_t *)v.data)[k]);
        printf("\n");
    }
    printf("end\n");
    fflush(stdout);
    int sig;
    sigwait(&stop, &sig);
    rc = wb_lease_release(&l);
    if (rc != WB_OK)
        fprintf(stderr, "wbtest_client: %s\n", wb_client_errmsg(c));
    wb_client_destroy(&c);
    return rc == WB_OK ? 0 : 1;
}

/* A client as it was before sessions: known to the broker by its pid only. */
static int cmd_acquire_plain(const char *model)
{
    sigset_t stop;
    block_stop(&stop);
    wb__rpc rpc;
    wb_err err;
    if (wb__rpc_open(&rpc, socket_path, 0, &err) != WB_OK) {
        fprintf(stderr, "wbtest_client: %s\n", err.msg);
        wb__rpc_close(&rpc);
        return 69;
    }
    Wbproto__HelloRequest hello = WBPROTO__HELLO_REQUEST__INIT;
    hello.client = "wbtest_client acquire-plain";
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    req.hello = &hello;
    Wbproto__Reply *rep = NULL;
    int rc = wb__rpc_call(&rpc, &req, 0, &rep, &err);
    wb__reply_free(&rep);
    uint8_t id[WB_LEASE_ID_LEN];
    if (rc == WB_OK) {
        Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
        acq.model = (char *)model;
        req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
        req.acquire = &acq;
        rc = wb__rpc_call(&rpc, &req, 0, &rep, &err);
        if (rc == WB_OK)
            memcpy(id, rep->acquire->lease->id.data, WB_LEASE_ID_LEN);
        wb__reply_free(&rep);
    }
    int fds[WB_FDCHAN_MAX_FDS];
    size_t n_fds = 0;
    if (rc == WB_OK)
        rc = wb__fdchan_fetch(rpc.path, id, 0, fds, WB_FDCHAN_MAX_FDS, &n_fds, &err);
    if (rc != WB_OK) {
        printf("error=%s\n", err.msg);
        wb__rpc_close(&rpc);
        return 1;
    }
    for (size_t i = 0; i < n_fds; i++)
        close(fds[i]);
    printf("lease ");
    for (int i = 0; i < WB_LEASE_ID_LEN; i++)
        printf("%02x", id[i]);
    printf(" fds=%zu\n", n_fds);
    fflush(stdout);
    int sig;
    sigwait(&stop, &sig);
    wb__rpc_close(&rpc);
    return 0;
}

static int cmd_hello_token(const char *hex)
{
    uint8_t token[64];
    size_t len = 0;
    if (unhex(hex, token, sizeof token, &len) != 0)
        return usage();
    wb__rpc rpc;
    wb_err err;
    if (wb__rpc_open(&rpc, socket_path, 0, &err) != WB_OK) {
        fprintf(stderr, "wbtest_client: %s\n", err.msg);
        wb__rpc_close(&rpc);
        return 69;
    }
    Wbproto__HelloRequest hello = WBPROTO__HELLO_REQUEST__INIT;
    hello.client = "wbtest_client hello-token";
    hello.session.data = token;
    hello.session.len = len;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_HELLO;
    req.hello = &hello;
    Wbproto__Reply *rep = NULL;
    int rc = wb__rpc_call(&rpc, &req, 0, &rep, &err);
    wb__rpc_close(&rpc);
    if (!rep) {
        fprintf(stderr, "wbtest_client: %s\n", err.msg);
        return 69;
    }
    printf("status=%d\nerror=%s\n", (int)rep->status, rc == WB_OK ? "" : err.msg);
    if (rc == WB_OK)
        printf("peer_pid=%u\n", rep->hello->peer_pid);
    wb__reply_free(&rep);
    return rc == WB_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    int i = 1;
    for (;;) {
        if (i + 1 < argc && strcmp(argv[i], "--socket") == 0) {
            socket_path = argv[i + 1];
            i += 2;
        } else if (i + 1 < argc && strcmp(argv[i], "--comm") == 0) {
            prctl(PR_SET_NAME, argv[i + 1], 0, 0, 0);
            i += 2;
        } else if (i + 1 < argc && strcmp(argv[i], "--zmq-heartbeat-ms") == 0) {
            zmq_heartbeat_ms = atoi(argv[i + 1]);
            if (zmq_heartbeat_ms <= 0)
                return usage();
            i += 2;
        } else if (i + 1 < argc && strcmp(argv[i], "--wait") == 0) {
            wait_ms = atoi(argv[i + 1]);
            if (wait_ms <= 0)
                return usage();
            i += 2;
        } else {
            break;
        }
    }
    if (argc - i < 2)
        return usage();
    const char *cmd = argv[i], *arg = argv[i + 1];
    int rest = argc - i - 1;
    if (strcmp(cmd, "frames") == 0)
        return cmd_frames(rest, argv + i + 1);
    if (strcmp(cmd, "stats-loop") == 0 && rest == 2)
        return cmd_stats_loop(arg, argv[i + 2]);
    if (strcmp(cmd, "big") == 0 && rest <= 2)
        return cmd_big(arg, rest == 2 ? argv[i + 2] : NULL);
    if (strcmp(cmd, "file") == 0 && rest == 1)
        return cmd_file(arg);
    if (strcmp(cmd, "random") == 0 && rest == 3)
        return cmd_random(arg, argv[i + 2], argv[i + 3]);
    if (strcmp(cmd, "acquire-exec") == 0 && rest >= 2)
        return cmd_acquire_exec(arg, argv + i + 2);
    if (strcmp(cmd, "forge") == 0 && rest == 2)
        return cmd_forge(arg, argv[i + 2]);
    if (strcmp(cmd, "acquire-dump") == 0 && rest == 1)
        return cmd_acquire_dump(arg);
    if (strcmp(cmd, "acquire-plain") == 0 && rest == 1)
        return cmd_acquire_plain(arg);
    if (strcmp(cmd, "hello-token") == 0 && rest == 1)
        return cmd_hello_token(arg);
    if (strcmp(cmd, "acquire-n") == 0 && rest == 2)
        return cmd_acquire_n(arg, argv[i + 2]);
    if (rest != 1)
        return usage();

    if (strcmp(cmd, "acquire") == 0) {
        sigset_t stop;
        sigemptyset(&stop);
        sigaddset(&stop, SIGTERM);
        sigaddset(&stop, SIGINT);
        sigprocmask(SIG_BLOCK, &stop, NULL);
        wb_client_options o;
        wb_client_options_init(&o);
        o.socket_path = socket_path;
        wb_client *c = NULL;
        wb_lease *l = NULL;
        int rc = wb_client_connect(&o, &c);
        if (rc == WB_OK)
            rc = wb_lease_acquire(c, arg, &l);
        if (rc != WB_OK) {
            fprintf(stderr, "wbtest_client: %s\n", wb_client_errmsg(c));
            wb_client_destroy(&c);
            return rc == WB_ECONN || rc == WB_ETIMEDOUT ? 69 : 1;
        }
        char hex[33];
        wb_lease_id_hex(l, hex);
        printf("%s\n", hex);
        fflush(stdout);
        int sig;
        sigwait(&stop, &sig);
        rc = wb_lease_release(&l);
        if (rc != WB_OK)
            fprintf(stderr, "wbtest_client: %s\n", wb_client_errmsg(c));
        else
            printf("released\n");
        wb_client_destroy(&c);
        return rc == WB_OK ? 0 : 1;
    }

    wb__rpc rpc;
    wb_err err;
    int rc = wb__rpc_open(&rpc, socket_path, 0, &err);
    if (rc != WB_OK) {
        fprintf(stderr, "wbtest_client: %s\n", err.msg);
        wb__rpc_close(&rpc);
        return 69;
    }
    Wbproto__Reply *rep = NULL;
    uint8_t buf[4096];
    size_t len = 0;
    if (strcmp(cmd, "release") == 0) {
        if (unhex(arg, buf, sizeof buf, &len) != 0) {
            wb__rpc_close(&rpc);
            return usage();
        }
        Wbproto__ReleaseRequest rel = WBPROTO__RELEASE_REQUEST__INIT;
        rel.lease_id.data = buf;
        rel.lease_id.len = len;
        Wbproto__Request req = WBPROTO__REQUEST__INIT;
        req.body_case = WBPROTO__REQUEST__BODY_RELEASE;
        req.release = &rel;
        rc = wb__rpc_call(&rpc, &req, 0, &rep, &err);
    } else if (strcmp(cmd, "raw") == 0) {
        if (unhex(arg, buf, sizeof buf, &len) != 0) {
            wb__rpc_close(&rpc);
            return usage();
        }
        rc = wb__rpc_call_raw(&rpc, buf, len, 0, &rep, &err);
        if (rep)
            printf("status=%d id=%llu\n", (int)rep->status, (unsigned long long)rep->id);
    } else {
        wb__rpc_close(&rpc);
        return usage();
    }
    wb__rpc_close(&rpc);
    int code = 0;
    if (rc != WB_OK) {
        fprintf(stderr, "wbtest_client: %s: %s\n", cmd, err.msg);
        code = rep ? 1 : 69;
    } else if (strcmp(cmd, "release") == 0) {
        printf("released (model %s)\n", wb__model_state_name(rep->release->model_state));
    }
    wb__reply_free(&rep);
    return code;
}
