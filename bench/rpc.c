/* wb_bench_rpc: the control plane's speed, on the host backend.
 *
 *   wb_bench_rpc sizes  SOCK MODEL
 *       over a raw DEALER, an acquire, then one naming the first one's table
 *       digest (what libwbclient's loop sends: the table comes once), and
 *       a release; prints the loop's four message sizes (acquire
 *       request/reply, release request/reply) and the first acquire's
 *   wb_bench_rpc lease  SOCK MODEL CLIENTS SECONDS BROKER_PID [HELD_MODEL]
 *       CLIENTS processes loop acquire + release through libwbclient; with
 *       HELD_MODEL, each first acquires and releases that model once, so
 *       that it holds that model's tensor table (its memory) during the loop
 *   wb_bench_rpc echo   CLIENTS SECONDS AREQ AREP RREQ RREP
 *       the baseline: a ROUTER echo server process and CLIENTS DEALER
 *       processes exchanging messages of those sizes, two round trips a pair
 *   wb_bench_rpc attach SOCK MODEL RUNS
 *       fresh process (fork + exec) -> lease mapped and its last tensor found
 *   wb_bench_rpc idle   SOCK MODEL BROKER_PID PROCS SECONDS
 *       PROCS processes each hold one lease and heartbeat; prints the
 *       broker's CPU over SECONDS, as a fraction of one core
 *   wb_bench_rpc hold   SOCK MODEL PROCS LEASES
 *       PROCS processes acquire LEASES leases in all and hold them until
 *       stdin closes (prints "ready" when all are held)
 *
 * Every mode prints one JSON object on stdout. The lease and echo modes use
 * the same process structure: children started after the server is up, a
 * shared start and end time, per-pair latencies in shared memory, each
 * child's CPU measured over the timed loop only. */
#include "wb/client.h"

#include "paths.h"
#include "tensor_table.h"
#include "wire.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_SAMPLES 200000

typedef struct shared {
    atomic_int ready;
    atomic_int failed;
    double start, end; /* CLOCK_MONOTONIC seconds */
    atomic_ullong pairs;
    atomic_ullong cpu_ns;
    atomic_ullong n_samples;
    atomic_int n_done;
    double done_at[4096]; /* when each child's last pair ended */
    float lat_us[MAX_SAMPLES];
} shared;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static shared *shared_new(void)
{
    shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    memset(s, 0, sizeof *s);
    return s;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Waits for the start, then loops `one` until the end; records latencies. */
typedef int (*pair_fn)(void *ctx);

static void run_loop(shared *s, pair_fn one, void *ctx)
{
    atomic_fetch_add(&s->ready, 1);
    while (s->start == 0.0)
        usleep(1000);
    while (now_s() < s->start)
        ;
    double c0 = cpu_s();
    unsigned long long n = 0;
    for (;;) {
        double t0 = now_s();
        if (t0 >= s->end)
            break;
        if (one(ctx) != 0) {
            atomic_fetch_add(&s->failed, 1);
            break;
        }
        double t1 = now_s();
        n++;
        unsigned long long k = atomic_fetch_add(&s->n_samples, 1);
        if (k < MAX_SAMPLES)
            s->lat_us[k] = (float)((t1 - t0) * 1e6);
    }
    atomic_fetch_add(&s->cpu_ns, (unsigned long long)((cpu_s() - c0) * 1e9));
    int slot = atomic_fetch_add(&s->n_done, 1);
    if (slot < 4096)
        s->done_at[slot] = now_s();
    atomic_fetch_add(&s->pairs, n);
}

/* Starts the children (already forked), waits for them, prints the result. */
static int finish(shared *s, pid_t *kids, int n, double seconds, const char *mode, int extra_pid,
                  const char *extra_json)
{
    while (atomic_load(&s->ready) < n) {
        if (atomic_load(&s->failed))
            break;
        usleep(2000);
    }
    double b0 = 0;
    char path[64];
    unsigned long long ut0 = 0, st0 = 0, ut1 = 0, st1 = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", extra_pid);
    FILE *f = extra_pid ? fopen(path, "r") : NULL;
    if (f) {
        if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut0,
                   &st0) != 2)
            ut0 = st0 = 0;
        fclose(f);
    }
    b0 = now_s();
    s->end = b0 + 0.2 + seconds;
    s->start = b0 + 0.2;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st;
        waitpid(kids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
    }
    f = extra_pid ? fopen(path, "r") : NULL;
    if (f) {
        if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut1,
                   &st1) != 2)
            ut1 = st1 = 0;
        fclose(f);
    }
    double server_cpu = (double)(ut1 + st1 - ut0 - st0) / (double)sysconf(_SC_CLK_TCK);
    unsigned long long pairs = atomic_load(&s->pairs);
    size_t ns = atomic_load(&s->n_samples);
    if (ns > MAX_SAMPLES)
        ns = MAX_SAMPLES;
    qsort(s->lat_us, ns, sizeof(float), cmp_float);
    double p50 = ns ? s->lat_us[ns / 2] : 0, p99 = ns ? s->lat_us[(size_t)(ns * 0.99)] : 0;
    double client_cpu = atomic_load(&s->cpu_ns) / 1e9;
    /* A pair started before the end finishes after it: the rate is over
     * the time until the last one ended, not the nominal window. */
    double last = s->end;
    for (int i = 0; i < atomic_load(&s->n_done) && i < 4096; i++)
        if (s->done_at[i] > last)
            last = s->done_at[i];
    seconds = last - s->start;
    printf("{\"mode\":\"%s\",\"clients\":%d,\"seconds\":%.3f,\"pairs\":%llu,\"pairs_per_s\":%.1f,"
           "\"p50_us\":%.1f,\"p99_us\":%.1f,\"server_cpu_us_per_pair\":%.2f,"
           "\"client_cpu_us_per_pair\":%.2f,\"failed\":%d%s}\n",
           mode, n, seconds, pairs, pairs / seconds, p50, p99, pairs ? server_cpu * 1e6 / pairs : 0,
           pairs ? client_cpu * 1e6 / pairs : 0, atomic_load(&s->failed) + bad,
           extra_json ? extra_json : "");
    return atomic_load(&s->failed) + bad ? 1 : 0;
}

/* ---- lease ---- */

typedef struct lease_ctx {
    wb_client *c;
    const char *model;
} lease_ctx;

static int lease_pair(void *arg)
{
    lease_ctx *x = arg;
    wb_lease *l = NULL;
    if (wb_lease_acquire(x->c, x->model, &l) != WB_OK) {
        fprintf(stderr, "acquire: %s\n", wb_client_errmsg(x->c));
        return -1;
    }
    if (wb_lease_release(&l) != WB_OK) {
        fprintf(stderr, "release: %s\n", wb_client_errmsg(x->c));
        return -1;
    }
    return 0;
}

static wb_client *connect_to(const char *sock)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = sock;
    o.timeout_ms = 60000;
    o.client_name = "wb_bench_rpc";
    wb_client *c = NULL;
    if (wb_client_connect(&o, &c) != WB_OK) {
        fprintf(stderr, "connect: %s\n", c ? wb_client_errmsg(c) : "out of memory");
        wb_client_destroy(&c);
        return NULL;
    }
    return c;
}

static int mode_lease(const char *sock, const char *model, int n, double seconds, int broker_pid,
                      const char *held)
{
    shared *s = shared_new();
    pid_t *kids = calloc((size_t)n, sizeof *kids);
    for (int i = 0; i < n; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            lease_ctx x = {.c = connect_to(sock), .model = model};
            lease_ctx h = {.c = x.c, .model = held};
            if (held && (!x.c || lease_pair(&h) != 0)) {
                atomic_fetch_add(&s->failed, 1);
                _exit(1);
            }
            /* One pair before the window: a process's first acquire brings
             * the model's tensor table (the attach figure times that); the
             * window measures the loop that follows. */
            if (!x.c || lease_pair(&x) != 0) {
                atomic_fetch_add(&s->failed, 1);
                _exit(1);
            }
            run_loop(s, lease_pair, &x);
            wb_client_destroy(&x.c);
            _exit(0);
        }
    }
    int rc = finish(s, kids, n, seconds, "lease", broker_pid, NULL);
    free(kids);
    return rc;
}

/* ---- echo ---- */

typedef struct echo_ctx {
    void *sock;
    char *buf;
    size_t areq, rreq, cap;
} echo_ctx;

static int echo_pair(void *arg)
{
    echo_ctx *x = arg;
    x->buf[0] = 'a';
    if (zmq_send(x->sock, x->buf, x->areq, 0) < 0 || zmq_recv(x->sock, x->buf, x->cap, 0) < 0)
        return -1;
    x->buf[0] = 'r';
    if (zmq_send(x->sock, x->buf, x->rreq, 0) < 0 || zmq_recv(x->sock, x->buf, x->cap, 0) < 0)
        return -1;
    return 0;
}

static void echo_server(const char *ep, size_t arep, size_t rrep)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    if (zmq_bind(s, ep) != 0) {
        fprintf(stderr, "bind %s: %s\n", ep, zmq_strerror(zmq_errno()));
        _exit(1);
    }
    char *rep = calloc(1, arep > rrep ? arep : rrep);
    for (;;) {
        zmq_msg_t id, m;
        zmq_msg_init(&id);
        zmq_msg_init(&m);
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&m, s, 0) < 0)
            _exit(1);
        size_t len = ((const char *)zmq_msg_data(&m))[0] == 'a' ? arep : rrep;
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        zmq_send(s, rep, len, 0);
        zmq_msg_close(&m);
    }
}

static int mode_echo(int n, double seconds, size_t areq, size_t arep, size_t rreq, size_t rrep)
{
    char ep[128], dir[] = "/tmp/wbecho.XXXXXX";
    if (!mkdtemp(dir))
        return 2;
    snprintf(ep, sizeof ep, "ipc://%s/echo.sock", dir);
    shared *s = shared_new();
    pid_t server = fork();
    if (server == 0)
        echo_server(ep, arep, rrep);
    char path[160];
    snprintf(path, sizeof path, "%s/echo.sock", dir);
    while (access(path, F_OK) != 0)
        usleep(1000);
    pid_t *kids = calloc((size_t)n, sizeof *kids);
    for (int i = 0; i < n; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            void *ctx = zmq_ctx_new();
            echo_ctx x = {.sock = zmq_socket(ctx, ZMQ_DEALER), .areq = areq, .rreq = rreq};
            x.cap = (arep > rrep ? arep : rrep) + (areq > rreq ? areq : rreq) + 1;
            x.buf = calloc(1, x.cap);
            int linger = 0;
            zmq_setsockopt(x.sock, ZMQ_LINGER, &linger, sizeof linger);
            if (zmq_connect(x.sock, ep) != 0)
                _exit(1);
            run_loop(s, echo_pair, &x);
            zmq_close(x.sock);
            zmq_ctx_term(ctx);
            _exit(0);
        }
    }
    int rc = finish(s, kids, n, seconds, "echo", server, NULL);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    unlink(path);
    rmdir(dir);
    free(kids);
    return rc;
}

/* ---- sizes ---- */

static int raw_call(void *s, Wbproto__Request *req, size_t *req_len, size_t *rep_len,
                    Wbproto__Reply **rep)
{
    req->version = WB_PROTOCOL_VERSION;
    uint8_t *buf = wb__request_pack(req, req_len);
    if (!buf || zmq_send(s, buf, *req_len, 0) < 0)
        return -1;
    free(buf);
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0)
        return -1;
    *rep_len = zmq_msg_size(&m);
    wb_err err;
    int rc = wb__reply_decode(zmq_msg_data(&m), zmq_msg_size(&m), rep, &err);
    zmq_msg_close(&m);
    if (rc != WB_OK || (*rep)->status != 0) {
        fprintf(stderr, "reply: %s\n", rc != WB_OK ? err.msg : (*rep)->error);
        return -1;
    }
    return 0;
}

static int mode_sizes(const char *sock, const char *model)
{
    char ep[WB_PATH_MAX + 8];
    if (wb__socket_endpoint(sock, ep, sizeof ep) != WB_OK)
        return 2;
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int64_t maxmsg = -1;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (zmq_connect(s, ep) != 0)
        return 1;
    Wbproto__AcquireRequest acq = WBPROTO__ACQUIRE_REQUEST__INIT;
    acq.model = (char *)model;
    acq.tensor_table = 1; /* as libwbclient asks */
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.id = 1;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &acq;
    size_t areq, arep, rreq, rrep;
    Wbproto__Reply *rep = NULL;
    if (raw_call(s, &req, &areq, &arep, &rep) != 0)
        return 1;
    /* The loop's steady state: libwbclient holds the table from its
     * first lease and names its digest, so the broker sends none. */
    size_t first_areq = areq, first_arep = arep;
    uint8_t digest[16];
    const Wbproto__Lease *fl = rep->acquire->lease;
    wb__tensor_table_digest(fl->tensor_table.data, fl->tensor_table.len, digest);
    acq.tensor_table_digest.data = digest;
    acq.tensor_table_digest.len = sizeof digest;
    req.id = 3;
    Wbproto__Reply *rep3 = NULL;
    if (raw_call(s, &req, &areq, &arep, &rep3) != 0)
        return 1;
    int cached = rep3->acquire->lease->tensor_table_cached;
    Wbproto__ReleaseRequest rel = WBPROTO__RELEASE_REQUEST__INIT;
    Wbproto__Request req2 = WBPROTO__REQUEST__INIT;
    req2.body_case = WBPROTO__REQUEST__BODY_RELEASE;
    req2.release = &rel;
    Wbproto__Reply *rep2 = NULL;
    rel.lease_id = rep3->acquire->lease->id;
    req2.id = 4;
    if (raw_call(s, &req2, &rreq, &rrep, &rep2) != 0)
        return 1;
    wb__reply_free(&rep2);
    rel.lease_id = rep->acquire->lease->id;
    req2.id = 2;
    if (raw_call(s, &req2, &rreq, &rrep, &rep2) != 0)
        return 1;
    printf("{\"mode\":\"sizes\",\"acquire_request\":%zu,\"acquire_reply\":%zu,"
           "\"release_request\":%zu,\"release_reply\":%zu,\"table_cached\":%s,"
           "\"first_acquire_request\":%zu,\"first_acquire_reply\":%zu}\n",
           areq, arep, rreq, rrep, cached ? "true" : "false", first_areq, first_arep);
    wb__reply_free(&rep);
    wb__reply_free(&rep3);
    wb__reply_free(&rep2);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return 0;
}

/* ---- attach ---- */

static int attach_child(const char *sock, const char *model)
{
    wb_client *c = connect_to(sock);
    if (!c)
        return 1;
    double t0 = now_s();
    wb_lease *l = NULL;
    if (wb_lease_acquire(c, model, &l) != WB_OK) {
        fprintf(stderr, "acquire: %s\n", wb_client_errmsg(c));
        return 1;
    }
    double t1 = now_s();
    size_t n = wb_lease_tensor_count(l);
    wb_tensor_view v;
    if (n == 0 || wb_lease_tensor(l, n - 1, &v) != WB_OK) {
        fprintf(stderr, "no tensor\n");
        return 1;
    }
    char name[512];
    snprintf(name, sizeof name, "%s", v.name);
    wb_tensor_view w;
    if (wb_lease_find(l, name, &w) != WB_OK || w.data != v.data) {
        fprintf(stderr, "find %s failed\n", name);
        return 1;
    }
    volatile uint8_t touch = ((const uint8_t *)w.data)[0];
    (void)touch;
    double t2 = now_s();
    printf("%.6f %.6f %.6f %zu\n", t0, t1, t2, n);
    fflush(stdout);
    wb_lease_release(&l);
    wb_client_destroy(&c);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int mode_attach(const char *self, const char *sock, const char *model, int runs)
{
    double *total = calloc((size_t)runs, sizeof *total), *acq = calloc((size_t)runs, sizeof *acq);
    size_t tensors = 0;
    for (int r = 0; r < runs; r++) {
        int fds[2];
        if (pipe(fds) != 0)
            return 2;
        double start = now_s();
        pid_t p = fork();
        if (p == 0) {
            dup2(fds[1], 1);
            close(fds[0]);
            execl("/proc/self/exe", self, "attach-child", sock, model, (char *)NULL);
            _exit(127);
        }
        close(fds[1]);
        char line[256] = {0};
        ssize_t got = read(fds[0], line, sizeof line - 1);
        close(fds[0]);
        int st;
        waitpid(p, &st, 0);
        double t0, t1, t2;
        if (got <= 0 || sscanf(line, "%lf %lf %lf %zu", &t0, &t1, &t2, &tensors) != 4)
            return 1;
        total[r] = (t2 - start) * 1e3;
        acq[r] = (t1 - t0) * 1e3;
    }
    qsort(total, (size_t)runs, sizeof *total, cmp_double);
    qsort(acq, (size_t)runs, sizeof *acq, cmp_double);
    printf("{\"mode\":\"attach\",\"tensors\":%zu,\"runs\":%d,\"attach_ms\":%.2f,"
           "\"acquire_ms\":%.2f}\n",
           tensors, runs, total[runs / 2], acq[runs / 2]);
    return 0;
}

/* ---- idle and hold ---- */

static unsigned long long proc_ticks(int pid)
{
    char path[64];
    unsigned long long ut = 0, st = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        ut = st = 0;
    fclose(f);
    return ut + st;
}

/* Children that each hold `per` leases until their stdin (a pipe from the
 * parent) closes. */
static pid_t *spawn_holders(const char *sock, const char *model, int procs, int leases, int *wfd,
                            shared *s)
{
    int fds[2];
    if (pipe(fds) != 0)
        exit(2);
    pid_t *kids = calloc((size_t)procs, sizeof *kids);
    for (int i = 0; i < procs; i++) {
        int per = leases / procs + (i < leases % procs);
        kids[i] = fork();
        if (kids[i] == 0) {
            close(fds[1]);
            wb_client *c = connect_to(sock);
            if (!c) {
                atomic_fetch_add(&s->failed, 1);
                _exit(1);
            }
            wb_lease **held = calloc((size_t)per + 1, sizeof *held);
            for (int k = 0; k < per; k++) {
                if (wb_lease_acquire(c, model, &held[k]) != WB_OK) {
                    fprintf(stderr, "acquire %d: %s\n", k, wb_client_errmsg(c));
                    atomic_fetch_add(&s->failed, 1);
                    _exit(1);
                }
            }
            atomic_fetch_add(&s->ready, 1);
            char b;
            while (read(fds[0], &b, 1) > 0)
                ;
            for (int k = 0; k < per; k++)
                wb_lease_release(&held[k]);
            wb_client_destroy(&c);
            _exit(0);
        }
        /* Do not flood a two-core machine with connects at once. */
        if (i % 50 == 49)
            usleep(20000);
    }
    close(fds[0]);
    *wfd = fds[1];
    while (atomic_load(&s->ready) < procs && !atomic_load(&s->failed))
        usleep(10000);
    return kids;
}

static void reap(pid_t *kids, int procs, int wfd)
{
    close(wfd);
    for (int i = 0; i < procs; i++)
        waitpid(kids[i], NULL, 0);
    free(kids);
}

static int mode_idle(const char *sock, const char *model, int broker_pid, int procs, double seconds)
{
    shared *s = shared_new();
    int wfd;
    pid_t *kids = spawn_holders(sock, model, procs, procs, &wfd, s);
    if (atomic_load(&s->failed)) {
        reap(kids, procs, wfd);
        return 1;
    }
    sleep(2); /* let the connects settle */
    unsigned long long t0 = proc_ticks(broker_pid);
    double w0 = now_s();
    usleep((useconds_t)(seconds * 1e6));
    unsigned long long t1 = proc_ticks(broker_pid);
    double w1 = now_s();
    double frac = (double)(t1 - t0) / (double)sysconf(_SC_CLK_TCK) / (w1 - w0);
    printf("{\"mode\":\"idle\",\"processes\":%d,\"clients\":%d,\"seconds\":%.2f,"
           "\"broker_core_fraction\":%.4f}\n",
           procs, procs, w1 - w0, frac);
    fflush(stdout);
    reap(kids, procs, wfd);
    return 0;
}

static int mode_hold(const char *sock, const char *model, int procs, int leases)
{
    shared *s = shared_new();
    int wfd;
    pid_t *kids = spawn_holders(sock, model, procs, leases, &wfd, s);
    if (atomic_load(&s->failed)) {
        reap(kids, procs, wfd);
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    char b;
    while (read(0, &b, 1) > 0)
        ;
    reap(kids, procs, wfd);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: see the comment at the top of bench/rpc.c\n");
    exit(2);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2)
        usage();
    const char *m = argv[1];
    if (strcmp(m, "sizes") == 0 && argc == 4)
        return mode_sizes(argv[2], argv[3]);
    if (strcmp(m, "lease") == 0 && (argc == 7 || argc == 8))
        return mode_lease(argv[2], argv[3], atoi(argv[4]), atof(argv[5]), atoi(argv[6]),
                          argc == 8 ? argv[7] : NULL);
    if (strcmp(m, "echo") == 0 && argc == 8)
        return mode_echo(atoi(argv[2]), atof(argv[3]), strtoul(argv[4], NULL, 10),
                         strtoul(argv[5], NULL, 10), strtoul(argv[6], NULL, 10),
                         strtoul(argv[7], NULL, 10));
    if (strcmp(m, "attach") == 0 && argc == 5)
        return mode_attach(argv[0], argv[2], argv[3], atoi(argv[4]));
    if (strcmp(m, "attach-child") == 0 && argc == 4)
        return attach_child(argv[2], argv[3]);
    if (strcmp(m, "idle") == 0 && argc == 7)
        return mode_idle(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atof(argv[6]));
    if (strcmp(m, "hold") == 0 && argc == 6)
        return mode_hold(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
    usage();
    return 2;
}
