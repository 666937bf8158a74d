/* wbsoak: a soak test driver for the broker. It runs many worker processes
 * (this same program, exec'd with --worker) that connect, acquire one to
 * three leases, verify every tensor (checksum, and byte for byte against the
 * checkpoint file), hold, release and sometimes exit while still holding,
 * and it kills them with SIGKILL at random moments, every other kill aimed
 * at a worker that is inside wb_lease_acquire. Meanwhile it sends malformed
 * and oversized messages, and samples the broker's VmRSS and open
 * descriptors.
 *
 *   wbsoak --socket PATH --model NAME --model-file PATH --broker-pid PID
 *          [--workers N] [--duration S] [--warmup S] [--kill-rate PER_S]
 *          [--junk-rate PER_S] [--oversize BYTES] [--hold-max-ms MS]
 *          [--seed N] [--rss-tolerance-kib N] [--json PATH]
 *
 * At the end every worker is stopped (half with SIGTERM, which must end in
 * a clean exit 0, half with SIGKILL) and the driver checks: no lease is left,
 * leases granted = released + reclaimed, every verification passed and no
 * byte differed, the broker never died, its descriptors came back to the
 * count before the workers started, and its RSS did not grow after warm-up
 * by more than the tolerance. Exit 0 when all hold; 1 with the reasons
 * otherwise; 2 on misuse. */
#include "wb/client.h"

#include "paths.h"
#include "rpc.h"
#include "safetensors.h"
#include "wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_WORKERS  256
#define MAX_SAMPLES  4096
#define MAX_REF      4096
#define MAX_HELD     3
#define TICK_MS      5
#define SAMPLE_EVERY 250

extern char **environ;

enum phase {
    PH_IDLE,
    PH_CONNECTING,
    PH_ACQUIRING,
    PH_VERIFYING,
    PH_HOLDING,
    PH_RELEASING,
    PH_DONE,
};

/* Shared between the driver and its workers through a memfd that the
 * workers inherit. Counters only grow; a killed worker loses nothing it had
 * counted. */
typedef struct shared {
    _Atomic uint64_t connects, connect_failures;
    _Atomic uint64_t acquires, acquire_failures;
    _Atomic uint64_t releases, release_failures;
    _Atomic uint64_t verifications, verify_failures, bytes_compared, bytes_corrupt;
    _Atomic uint64_t exits_holding;
    _Atomic int phase[MAX_WORKERS];
    char last_error[512];
} shared;

static volatile sig_atomic_t stop_flag;

static void on_term(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL); /* a signal cuts it short, which is what we want */
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* ------------------------------------------------------------------ */
/* Worker                                                              */

typedef struct ref_tensor {
    char *name;
    uint8_t *bytes;
    uint64_t nbytes;
} ref_tensor;

static ref_tensor refs[MAX_REF];
static size_t n_refs;

/* Reads the checkpoint the broker loaded, so leased bytes can be compared
 * with the file itself rather than with the broker's own checksums. */
static int load_reference(const char *path)
{
    wb_st_table *t = NULL;
    wb_err err;
    if (wb__st_open(path, &t, &err) != WB_OK) {
        fprintf(stderr, "wbsoak: %s\n", err.msg);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < t->n_tensors && i < MAX_REF; i++) {
        const wb_st_tensor *st = &t->tensors[i];
        int fd = open(t->files[st->file], O_RDONLY | O_CLOEXEC);
        ref_tensor *r = &refs[n_refs];
        r->name = strdup(st->name);
        r->nbytes = st->nbytes;
        r->bytes = malloc(st->nbytes ? st->nbytes : 1);
        if (fd < 0 || !r->name || !r->bytes ||
            pread(fd, r->bytes, st->nbytes, (off_t)st->offset) != (ssize_t)st->nbytes) {
            fprintf(stderr, "wbsoak: cannot read tensor '%s' of %s\n", st->name, path);
            rc = -1;
        }
        if (fd >= 0)
            close(fd);
        n_refs++;
        if (rc)
            break;
    }
    wb__st_table_free(&t);
    return rc;
}

static void note_error(shared *sh, const char *what, const char *msg)
{
    snprintf(sh->last_error, sizeof sh->last_error, "pid %ld: %s: %s", (long)getpid(), what, msg);
}

/* Checksums, then every byte against the file. Returns 0 when all match. */
static int check_lease(shared *sh, wb_client *c, const wb_lease *l)
{
    int bad = 0;
    size_t idx = 0;
    if (wb_lease_verify(l, &idx) != WB_OK) {
        note_error(sh, "verify", wb_client_errmsg(c));
        bad = 1;
    }
    size_t n = wb_lease_tensor_count(l);
    if (n != n_refs) {
        note_error(sh, "verify", "the lease and the file have different tensor counts");
        bad = 1;
    }
    for (size_t i = 0; i < n; i++) {
        wb_tensor_view v;
        if (wb_lease_tensor(l, i, &v) != WB_OK)
            continue;
        const ref_tensor *r = NULL;
        for (size_t k = 0; k < n_refs && !r; k++)
            r = strcmp(refs[k].name, v.name) == 0 ? &refs[k] : NULL;
        if (!r || r->nbytes != v.nbytes) {
            note_error(sh, "verify", "a tensor is missing from the file or has another size");
            atomic_fetch_add(&sh->bytes_corrupt, v.nbytes);
            bad = 1;
            continue;
        }
        atomic_fetch_add(&sh->bytes_compared, v.nbytes);
        if (memcmp(r->bytes, v.data, v.nbytes) != 0) {
            uint64_t diff = 0;
            for (uint64_t k = 0; k < v.nbytes; k++)
                diff += r->bytes[k] != ((const uint8_t *)v.data)[k];
            atomic_fetch_add(&sh->bytes_corrupt, diff);
            note_error(sh, "verify", v.name);
            bad = 1;
        }
    }
    atomic_fetch_add(&sh->verifications, 1);
    if (bad)
        atomic_fetch_add(&sh->verify_failures, 1);
    return bad;
}

static int worker_main(shared *sh, int slot, const char *socket_path, const char *model,
                       const char *model_file, uint64_t seed, int hold_max_ms)
{
    _Atomic int *phase = &sh->phase[slot];
    /* SIGTERM arrives blocked (see spawn_worker), so that one sent right
     * after the spawn waits for the handler instead of killing. */
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_UNBLOCK, &term, NULL);
    if (load_reference(model_file) != 0)
        return 1;
    uint64_t s = seed | 1;
    int status = 0;
    while (!stop_flag && status == 0) {
        atomic_store(phase, PH_CONNECTING);
        wb_client_options o;
        wb_client_options_init(&o);
        o.socket_path = socket_path;
        o.client_name = "wbsoak-worker";
        wb_client *c = NULL;
        if (wb_client_connect(&o, &c) != WB_OK) {
            atomic_fetch_add(&sh->connect_failures, 1);
            note_error(sh, "connect", wb_client_errmsg(c));
            wb_client_destroy(&c);
            sleep_ms(100);
            continue;
        }
        atomic_fetch_add(&sh->connects, 1);
        int cycles = 1 + (int)(rnd(&s) % 20);
        for (int cy = 0; cy < cycles && !stop_flag && status == 0; cy++) {
            wb_lease *held[MAX_HELD] = {NULL};
            int want = rnd(&s) % 4 == 0 ? 1 + (int)(rnd(&s) % MAX_HELD) : 1;
            int got = 0;
            atomic_store(phase, PH_ACQUIRING);
            for (int k = 0; k < want; k++) {
                if (wb_lease_acquire(c, model, &held[got]) == WB_OK) {
                    atomic_fetch_add(&sh->acquires, 1);
                    got++;
                } else {
                    atomic_fetch_add(&sh->acquire_failures, 1);
                    note_error(sh, "acquire", wb_client_errmsg(c));
                }
            }
            atomic_store(phase, PH_VERIFYING);
            for (int k = 0; k < got; k++)
                status |= check_lease(sh, c, held[k]) ? 3 : 0;
            atomic_store(phase, PH_HOLDING);
            int64_t hold = hold_max_ms > 0 ? (int64_t)(rnd(&s) % (uint64_t)hold_max_ms) : 0;
            int64_t until = now_ms() + hold, mid = now_ms() + hold / 2;
            int checked = 0;
            while (!stop_flag && now_ms() < until) {
                sleep_ms(until - now_ms() < 10 ? until - now_ms() : 10);
                if (!checked && now_ms() >= mid && hold >= 20) {
                    for (int k = 0; k < got; k++)
                        status |= check_lease(sh, c, held[k]) ? 3 : 0;
                    checked = 1;
                }
            }
            if (!stop_flag && got > 0 && rnd(&s) % 32 == 0) {
                /* Leave without a word, leases held: the broker must learn of
                 * it from the pidfd alone. */
                atomic_fetch_add(&sh->exits_holding, 1);
                atomic_store(phase, PH_DONE);
                _exit(0);
            }
            atomic_store(phase, PH_RELEASING);
            for (int k = 0; k < got; k++) {
                int rc = wb_lease_release(&held[k]);
                if (rc == WB_OK) {
                    atomic_fetch_add(&sh->releases, 1);
                } else {
                    atomic_fetch_add(&sh->release_failures, 1);
                    note_error(sh, "release", wb_client_errmsg(c));
                }
            }
            atomic_store(phase, PH_IDLE);
        }
        wb_client_destroy(&c);
    }
    atomic_store(phase, PH_DONE);
    return status;
}

/* ------------------------------------------------------------------ */
/* Driver                                                              */

typedef struct options {
    const char *socket_path, *model, *model_file, *json_path;
    long broker_pid;
    int workers;
    double duration, warmup, kill_rate, junk_rate;
    long oversize;
    int hold_max_ms;
    uint64_t seed;
    long rss_tolerance_kib;
} options;

typedef struct sample {
    double t;
    long rss_kib;
    long fds;
} sample;

typedef struct driver {
    options o;
    shared *sh;
    int state_fd;
    char exe[4096];
    pid_t pids[MAX_WORKERS];
    int killed[MAX_WORKERS]; /* SIGKILL sent by us to the current pid */
    int termed[MAX_WORKERS]; /* SIGTERM sent at the end */
    uint64_t spawned, kills, kills_in_acquire, abnormal_exits, clean_exits;
    uint64_t junk_sent, junk_multiframe, junk_replies, oversize_sent;
    int broker_died;
    sample samples[MAX_SAMPLES];
    size_t n_samples;
    char problems[4096];
} driver;

static void problem(driver *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void problem(driver *d, const char *fmt, ...)
{
    size_t used = strlen(d->problems);
    if (used + 2 >= sizeof d->problems)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->problems + used, sizeof d->problems - used, fmt, ap);
    va_end(ap);
    used = strlen(d->problems);
    if (used + 1 < sizeof d->problems)
        strcat(d->problems, "\n");
}

static int broker_alive(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

static long broker_rss_kib(long pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = atol(line + 6);
            break;
        }
    }
    fclose(f);
    return kib;
}

static long broker_fds(long pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/fd", pid);
    DIR *dir = opendir(path);
    if (!dir)
        return -1;
    long n = 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL)
        n += de->d_name[0] != '.';
    closedir(dir);
    return n;
}

static int spawn_worker(driver *d, int slot)
{
    char slot_s[16], fd_s[16], seed_s[32], hold_s[16];
    snprintf(slot_s, sizeof slot_s, "%d", slot);
    snprintf(fd_s, sizeof fd_s, "%d", d->state_fd);
    snprintf(seed_s, sizeof seed_s, "%llu",
             (unsigned long long)(d->o.seed * 1000003ull + d->spawned * 7919ull + (uint64_t)slot));
    snprintf(hold_s, sizeof hold_s, "%d", d->o.hold_max_ms);
    char *argv[] = {d->exe,
                    "--worker",
                    slot_s,
                    "--state-fd",
                    fd_s,
                    "--socket",
                    (char *)d->o.socket_path,
                    "--model",
                    (char *)d->o.model,
                    "--model-file",
                    (char *)d->o.model_file,
                    "--seed",
                    seed_s,
                    "--hold-max-ms",
                    hold_s,
                    NULL};
    atomic_store(&d->sh->phase[slot], PH_IDLE);
    pid_t pid;
    posix_spawnattr_t attr;
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &term);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    int e = posix_spawn(&pid, d->exe, NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (e != 0) {
        problem(d, "posix_spawn: %s", strerror(e));
        return -1;
    }
    d->pids[slot] = pid;
    d->killed[slot] = 0;
    d->termed[slot] = 0;
    d->spawned++;
    return 0;
}

static int slot_of(const driver *d, pid_t pid)
{
    for (int i = 0; i < d->o.workers; i++) {
        if (d->pids[i] == pid)
            return i;
    }
    return -1;
}

/* Collects every worker that ended; respawns unless `respawn` is 0. */
static void reap(driver *d, int respawn)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            return;
        int slot = slot_of(d, pid);
        if (slot < 0)
            continue;
        int by_us = d->killed[slot] && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            d->clean_exits++;
        } else if (!by_us) {
            d->abnormal_exits++;
            if (WIFEXITED(st))
                problem(d, "worker %d exited with status %d (last error: %s)", (int)pid,
                        WEXITSTATUS(st), d->sh->last_error);
            else
                problem(d, "worker %d died of signal %d", (int)pid, WTERMSIG(st));
        }
        d->pids[slot] = 0;
        if (respawn)
            spawn_worker(d, slot);
    }
}

static void kill_one(driver *d, uint64_t *s, int aim_at_acquire)
{
    int n = d->o.workers, slot = -1;
    if (aim_at_acquire) {
        int start = (int)(rnd(s) % (uint64_t)n);
        for (int k = 0; k < n && slot < 0; k++) {
            int i = (start + k) % n;
            if (d->pids[i] > 0 && !d->killed[i] && atomic_load(&d->sh->phase[i]) == PH_ACQUIRING)
                slot = i;
        }
        if (slot < 0)
            return; /* nobody acquiring right now: try again next tick */
    } else {
        slot = (int)(rnd(s) % (uint64_t)n);
        if (d->pids[slot] <= 0 || d->killed[slot])
            return;
    }
    int ph = atomic_load(&d->sh->phase[slot]);
    if (kill(d->pids[slot], SIGKILL) == 0) {
        d->killed[slot] = 1;
        d->kills++;
        if (ph == PH_ACQUIRING)
            d->kills_in_acquire++;
    }
}

/* Sends one malformed message on a fresh DEALER: garbage, a truncated
 * request, a wrong version, an empty frame, or several frames. The
 * single-frame kinds must each be answered. */
static void send_junk(driver *d, void *ctx, const char *endpoint, uint64_t *s)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    if (!sock)
        return;
    /* Linger, so that a message nobody answers still leaves on close. */
    int linger = 2000, timeout = 5000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    if (zmq_connect(sock, endpoint) != 0) {
        zmq_close(sock);
        return;
    }
    uint8_t buf[256];
    size_t len = 0;
    int kind = (int)(rnd(s) % 5);
    switch (kind) {
    case 0: /* random bytes */
        len = 1 + rnd(s) % sizeof buf;
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)rnd(s);
        break;
    case 1: { /* a stats request cut short */
        static const uint8_t trunc[] = {0x08, 0x01, 0x10, 0x2a, 0x92, 0x01, 0x05, 0x00};
        memcpy(buf, trunc, sizeof trunc);
        len = sizeof trunc;
        break;
    }
    case 2: { /* version 9 */
        static const uint8_t ver[] = {0x08, 0x09, 0x10, 0x2b, 0x92, 0x01, 0x00};
        memcpy(buf, ver, sizeof ver);
        len = sizeof ver;
        break;
    }
    case 3: /* empty frame */
        len = 0;
        break;
    default:
        break;
    }
    if (kind == 4) {
        /* Two frames: the broker drops it with a log line, no reply. */
        zmq_send(sock, "\x08\x01", 2, ZMQ_SNDMORE);
        zmq_send(sock, "\x10\x01", 2, 0);
        d->junk_multiframe++;
    } else {
        zmq_send(sock, buf, len, 0);
        char rep[4096];
        if (zmq_recv(sock, rep, sizeof rep, 0) >= 0)
            d->junk_replies++;
        else
            problem(d, "a malformed message of kind %d got no reply within 5 s", kind);
    }
    d->junk_sent++;
    zmq_close(sock);
}

/* One message over the broker's limit: libzmq drops the connection. */
static void send_oversize(driver *d, void *ctx, const char *endpoint)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    if (!sock)
        return;
    /* Linger, so that the message leaves after the close. */
    int linger = 2000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    uint8_t *buf = malloc((size_t)d->o.oversize);
    if (buf && zmq_connect(sock, endpoint) == 0) {
        memset(buf, 0x08, (size_t)d->o.oversize);
        if (zmq_send(sock, buf, (size_t)d->o.oversize, 0) >= 0)
            d->oversize_sent++;
    }
    free(buf);
    zmq_close(sock);
}

static int rpc_simple(wb__rpc *rpc, int body, Wbproto__Reply **rep, wb_err *err)
{
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__StatsRequest st = WBPROTO__STATS_REQUEST__INIT;
    Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
    req.body_case = body;
    if (body == WBPROTO__REQUEST__BODY_STATS)
        req.stats = &st;
    else
        req.list_leases = &ll;
    return wb__rpc_call(rpc, &req, 10000, rep, err);
}

typedef struct stats {
    uint64_t granted, released, reclaimed, malformed, refused, limit;
    uint32_t active, stale, peers;
} stats;

static int get_stats(const options *o, stats *out, size_t *leases, wb_err *err)
{
    wb__rpc rpc;
    int rc = wb__rpc_open(&rpc, o->socket_path, 10000, err);
    Wbproto__Reply *rep = NULL;
    if (rc == WB_OK)
        rc = rpc_simple(&rpc, WBPROTO__REQUEST__BODY_STATS, &rep, err);
    if (rc == WB_OK) {
        const Wbproto__StatsReply *s = rep->stats;
        out->granted = s->leases_granted;
        out->released = s->leases_released;
        out->reclaimed = s->leases_reclaimed;
        out->malformed = s->malformed_messages;
        out->refused = s->requests_refused;
        out->limit = s->limit_refusals;
        out->active = s->leases_active;
        out->stale = s->leases_stale;
        out->peers = s->peers;
        wb__reply_free(&rep);
        rc = rpc_simple(&rpc, WBPROTO__REQUEST__BODY_LIST_LEASES, &rep, err);
        /* The total, not the entries: a listing comes in pages. */
        if (rc == WB_OK)
            *leases = rep->list_leases->total;
    }
    wb__reply_free(&rep);
    wb__rpc_close(&rpc);
    return rc;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* The median RSS of the samples taken in [t0, t1). */
static long median_rss(const driver *d, double t0, double t1, size_t *count)
{
    long v[MAX_SAMPLES];
    size_t n = 0;
    for (size_t i = 0; i < d->n_samples; i++) {
        if (d->samples[i].t >= t0 && d->samples[i].t < t1 && d->samples[i].rss_kib >= 0)
            v[n++] = d->samples[i].rss_kib;
    }
    *count = n;
    if (n == 0)
        return -1;
    qsort(v, n, sizeof *v, cmp_long);
    return v[n / 2];
}

static int usage(FILE *out)
{
    fprintf(out, "usage: wbsoak --socket PATH --model NAME --model-file PATH --broker-pid PID\n"
                 "              [--workers N] [--duration S] [--warmup S] [--kill-rate PER_S]\n"
                 "              [--junk-rate PER_S] [--oversize BYTES] [--hold-max-ms MS]\n"
                 "              [--seed N] [--rss-tolerance-kib N] [--json PATH]\n");
    return 2;
}

static int driver_main(options *o)
{
    static driver d;
    memset(&d, 0, sizeof d);
    d.o = *o;
    ssize_t n = readlink("/proc/self/exe", d.exe, sizeof d.exe - 1);
    if (n <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    d.exe[n] = '\0';
    /* No close-on-exec: the workers map it by descriptor number. */
    d.state_fd = memfd_create("wbsoak", 0);
    if (d.state_fd < 0 || ftruncate(d.state_fd, sizeof(shared)) != 0) {
        perror("memfd_create");
        return 1;
    }
    d.sh = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED, d.state_fd, 0);
    if (d.sh == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    char path[WB_RPC_PATH_MAX], endpoint[WB_RPC_PATH_MAX + 8];
    if (wb__socket_path(o->socket_path, path, sizeof path) != WB_OK ||
        wb__socket_endpoint(path, endpoint, sizeof endpoint) != WB_OK)
        return usage(stderr);

    stats s0 = {0}, s1 = {0};
    size_t leases0 = 0, leases1 = 0;
    wb_err err;
    if (get_stats(o, &s0, &leases0, &err) != WB_OK) {
        fprintf(stderr, "wbsoak: the broker does not answer: %s\n", err.msg);
        return 1;
    }
    if (leases0 != 0)
        problem(&d, "%zu leases were held before the soak started", leases0);
    /* The baseline: the fewest descriptors over a quiet second, since the
     * broker closes a departed client's connection (ours, just now) from
     * libzmq's I/O thread, a moment later. */
    long fds0 = broker_fds(o->broker_pid), rss0 = broker_rss_kib(o->broker_pid);
    for (int64_t until = now_ms() + 1000; now_ms() < until && fds0 >= 0;) {
        sleep_ms(50);
        long now_fds = broker_fds(o->broker_pid);
        if (now_fds >= 0 && now_fds < fds0)
            fds0 = now_fds;
    }
    if (fds0 < 0 || rss0 < 0) {
        fprintf(stderr, "wbsoak: cannot read /proc/%ld (is --broker-pid right?)\n", o->broker_pid);
        return 1;
    }

    void *ctx = zmq_ctx_new();
    uint64_t rs = o->seed | 1;
    for (int i = 0; i < o->workers; i++)
        spawn_worker(&d, i);

    int64_t t_start = now_ms(), last = t_start, next_sample = t_start, next_oversize = t_start;
    double kill_due = 0, junk_due = 0;
    int aim = 0;
    while (now_ms() - t_start < (int64_t)(o->duration * 1000)) {
        sleep_ms(TICK_MS);
        int64_t now = now_ms();
        double dt = (double)(now - last) / 1000.0;
        last = now;
        if (!broker_alive(o->broker_pid)) {
            d.broker_died = 1;
            problem(&d, "the broker (pid %ld) died %.1f s into the soak", o->broker_pid,
                    (double)(now - t_start) / 1000.0);
            break;
        }
        reap(&d, 1);
        kill_due += o->kill_rate * dt;
        while (kill_due >= 1) {
            uint64_t before = d.kills;
            kill_one(&d, &rs, aim);
            if (d.kills == before && aim)
                break; /* no worker acquiring: keep the kill for the next tick */
            aim = !aim;
            kill_due -= 1;
        }
        junk_due += o->junk_rate * dt;
        while (junk_due >= 1) {
            send_junk(&d, ctx, endpoint, &rs);
            junk_due -= 1;
        }
        if (o->oversize > 0 && now >= next_oversize) {
            send_oversize(&d, ctx, endpoint);
            next_oversize = now + 2000;
        }
        if (now >= next_sample && d.n_samples < MAX_SAMPLES) {
            sample *sp = &d.samples[d.n_samples++];
            sp->t = (double)(now - t_start) / 1000.0;
            sp->rss_kib = broker_rss_kib(o->broker_pid);
            sp->fds = broker_fds(o->broker_pid);
            next_sample = now + SAMPLE_EVERY;
        }
    }
    double ran = (double)(now_ms() - t_start) / 1000.0;

    /* The end: half stop cleanly, half are killed. */
    for (int i = 0; i < o->workers; i++) {
        if (d.pids[i] <= 0)
            continue;
        if (i % 2 == 0) {
            d.termed[i] = 1;
            kill(d.pids[i], SIGTERM);
        } else if (kill(d.pids[i], SIGKILL) == 0) {
            d.killed[i] = 1;
            d.kills++;
        }
    }
    int64_t deadline = now_ms() + 60000;
    for (;;) {
        reap(&d, 0);
        int left = 0;
        for (int i = 0; i < o->workers; i++)
            left += d.pids[i] > 0;
        if (left == 0)
            break;
        if (now_ms() > deadline) {
            problem(&d, "%d workers did not end within 60 s", left);
            for (int i = 0; i < o->workers; i++) {
                if (d.pids[i] > 0)
                    kill(d.pids[i], SIGKILL);
            }
            sleep_ms(100);
            reap(&d, 0);
            break;
        }
        sleep_ms(10);
    }
    zmq_ctx_term(ctx);

    /* Every lease must go: released, or reclaimed from the dead. */
    deadline = now_ms() + 30000;
    int rc_stats;
    for (;;) {
        rc_stats = get_stats(o, &s1, &leases1, &err);
        if ((rc_stats == WB_OK && leases1 == 0) || now_ms() > deadline)
            break;
        sleep_ms(50);
    }
    if (!broker_alive(o->broker_pid) && !d.broker_died) {
        d.broker_died = 1;
        problem(&d, "the broker died at the end of the soak");
    }
    if (rc_stats != WB_OK)
        problem(&d, "the broker does not answer after the soak: %s", err.msg);
    else if (leases1 != 0)
        problem(&d, "%zu leases remain with every worker gone", leases1);
    uint64_t granted = s1.granted - s0.granted, released = s1.released - s0.released,
             reclaimed = s1.reclaimed - s0.reclaimed;
    if (rc_stats == WB_OK && granted != released + reclaimed)
        problem(&d, "leases granted (%llu) != released (%llu) + reclaimed (%llu)",
                (unsigned long long)granted, (unsigned long long)released,
                (unsigned long long)reclaimed);
    uint64_t malformed = s1.malformed - s0.malformed;
    if (rc_stats == WB_OK && malformed != d.junk_sent)
        problem(&d, "the broker counted %llu malformed messages, %llu were sent",
                (unsigned long long)malformed, (unsigned long long)d.junk_sent);

    /* Descriptors: back to the count before any worker connected. libzmq
     * closes a departed peer's connection from its I/O thread, so give it
     * a moment. */
    long fds_end = -1;
    deadline = now_ms() + 10000;
    while ((fds_end = broker_fds(o->broker_pid)) > fds0 && now_ms() < deadline)
        sleep_ms(50);
    long fds_max = fds0;
    for (size_t i = 0; i < d.n_samples; i++)
        fds_max = d.samples[i].fds > fds_max ? d.samples[i].fds : fds_max;
    if (fds_end > fds0)
        problem(&d, "the broker has %ld open descriptors after the soak, %ld before", fds_end,
                fds0);

    /* Memory: the median of the last quarter of the run against the median
     * of the quarter right after warm-up. */
    long rss_end = broker_rss_kib(o->broker_pid);
    double span = ran - o->warmup;
    size_t n_early = 0, n_late = 0;
    long rss_early = median_rss(&d, o->warmup, o->warmup + span / 4, &n_early);
    long rss_late = median_rss(&d, ran - span / 4, ran + 1, &n_late);
    long rss_growth = rss_early >= 0 && rss_late >= 0 ? rss_late - rss_early : 0;
    if (n_early == 0 || n_late == 0)
        problem(&d, "too few RSS samples after warm-up (%zu early, %zu late)", n_early, n_late);
    else if (rss_growth > o->rss_tolerance_kib)
        problem(&d,
                "the broker's RSS grew by %ld KiB after warm-up (%ld -> %ld), over the "
                "%ld KiB tolerance",
                rss_growth, rss_early, rss_late, o->rss_tolerance_kib);

    shared *sh = d.sh;
    if (atomic_load(&sh->verify_failures) || atomic_load(&sh->bytes_corrupt))
        problem(&d, "%llu verifications failed, %llu bytes differed (last: %s)",
                (unsigned long long)atomic_load(&sh->verify_failures),
                (unsigned long long)atomic_load(&sh->bytes_corrupt), sh->last_error);
    if (atomic_load(&sh->connect_failures) || atomic_load(&sh->acquire_failures) ||
        atomic_load(&sh->release_failures))
        problem(&d,
                "live workers saw failures: %llu connects, %llu acquires, %llu releases "
                "(last: %s)",
                (unsigned long long)atomic_load(&sh->connect_failures),
                (unsigned long long)atomic_load(&sh->acquire_failures),
                (unsigned long long)atomic_load(&sh->release_failures), sh->last_error);
    if (o->duration >= 10 && d.kills_in_acquire == 0)
        problem(&d, "no worker was killed inside an acquire");
    if (d.kills == 0)
        problem(&d, "no worker was killed");

    printf("soak: %.1f s, %d workers at a time, %llu started, %llu killed (%llu inside "
           "acquire), %llu left holding leases, %llu clean exits\n",
           ran, o->workers, (unsigned long long)d.spawned, (unsigned long long)d.kills,
           (unsigned long long)d.kills_in_acquire,
           (unsigned long long)atomic_load(&sh->exits_holding), (unsigned long long)d.clean_exits);
    printf("soak: leases granted %llu, released %llu, reclaimed %llu; left %zu\n",
           (unsigned long long)granted, (unsigned long long)released, (unsigned long long)reclaimed,
           leases1);
    printf("soak: verifications %llu (failed %llu), bytes compared %llu, corrupt %llu\n",
           (unsigned long long)atomic_load(&sh->verifications),
           (unsigned long long)atomic_load(&sh->verify_failures),
           (unsigned long long)atomic_load(&sh->bytes_compared),
           (unsigned long long)atomic_load(&sh->bytes_corrupt));
    printf("soak: malformed messages sent %llu (%llu multi-frame, %llu answered), oversized "
           "%llu\n",
           (unsigned long long)d.junk_sent, (unsigned long long)d.junk_multiframe,
           (unsigned long long)d.junk_replies, (unsigned long long)d.oversize_sent);
    printf("soak: broker fds %ld before, %ld peak, %ld after; RSS %ld KiB before, %ld early, "
           "%ld late, %ld after (growth %ld KiB, tolerance %ld)\n",
           fds0, fds_max, fds_end, rss0, rss_early, rss_late, rss_end, rss_growth,
           o->rss_tolerance_kib);

    if (o->json_path) {
        json_t *j = json_object();
#define PUT(key, v) json_object_set_new(j, key, json_integer((json_int_t)(v)))
        json_object_set_new(j, "duration_seconds", json_real(ran));
        PUT("workers", o->workers);
        PUT("workers_started", d.spawned);
        PUT("kills", d.kills);
        PUT("kills_inside_acquire", d.kills_in_acquire);
        PUT("exits_holding_leases", atomic_load(&sh->exits_holding));
        PUT("clean_exits", d.clean_exits);
        PUT("abnormal_exits", d.abnormal_exits);
        PUT("client_acquires", atomic_load(&sh->acquires));
        PUT("client_releases", atomic_load(&sh->releases));
        PUT("leases_granted", granted);
        PUT("leases_released", released);
        PUT("leases_reclaimed", reclaimed);
        PUT("leases_left", leases1);
        PUT("verifications", atomic_load(&sh->verifications));
        PUT("verification_failures", atomic_load(&sh->verify_failures));
        PUT("bytes_compared", atomic_load(&sh->bytes_compared));
        PUT("bytes_corrupt", atomic_load(&sh->bytes_corrupt));
        PUT("malformed_sent", d.junk_sent);
        PUT("malformed_multiframe", d.junk_multiframe);
        PUT("malformed_answered", d.junk_replies);
        PUT("malformed_counted_by_broker", malformed);
        PUT("oversized_sent", d.oversize_sent);
        PUT("broker_crashes", d.broker_died);
        PUT("broker_fds_before", fds0);
        PUT("broker_fds_peak", fds_max);
        PUT("broker_fds_after", fds_end);
        PUT("broker_rss_kib_before", rss0);
        PUT("broker_rss_kib_early", rss_early);
        PUT("broker_rss_kib_late", rss_late);
        PUT("broker_rss_kib_after", rss_end);
        PUT("rss_growth_kib", rss_growth);
        PUT("rss_tolerance_kib", o->rss_tolerance_kib);
#undef PUT
        json_object_set_new(j, "passed", json_boolean(d.problems[0] == '\0'));
        json_object_set_new(j, "problems", json_string(d.problems));
        /* One sample a second: [seconds, VmRSS KiB, open descriptors]. */
        json_t *samples = json_array();
        for (size_t i = 0; i < d.n_samples; i += 1000 / SAMPLE_EVERY)
            json_array_append_new(samples, json_pack("[f, I, I]", d.samples[i].t,
                                                     (json_int_t)d.samples[i].rss_kib,
                                                     (json_int_t)d.samples[i].fds));
        json_object_set_new(j, "broker_samples", samples);
        if (!j || json_dump_file(j, o->json_path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
            problem(&d, "cannot write %s", o->json_path);
        json_decref(j);
    }
    if (d.problems[0]) {
        fprintf(stderr, "wbsoak: FAILED:\n%s", d.problems);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"model", required_argument, NULL, 'm'},
        {"model-file", required_argument, NULL, 'f'},
        {"broker-pid", required_argument, NULL, 'p'},
        {"workers", required_argument, NULL, 'w'},
        {"duration", required_argument, NULL, 'd'},
        {"warmup", required_argument, NULL, 'u'},
        {"kill-rate", required_argument, NULL, 'k'},
        {"junk-rate", required_argument, NULL, 'j'},
        {"oversize", required_argument, NULL, 'o'},
        {"hold-max-ms", required_argument, NULL, 'H'},
        {"seed", required_argument, NULL, 'S'},
        {"rss-tolerance-kib", required_argument, NULL, 'r'},
        {"json", required_argument, NULL, 'J'},
        {"worker", required_argument, NULL, 'W'},
        {"state-fd", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    options o = {.workers = 32,
                 .duration = 30,
                 .warmup = 5,
                 .kill_rate = 10,
                 .junk_rate = 5,
                 .hold_max_ms = 200,
                 .seed = 1,
                 .rss_tolerance_kib = 1024};
    int worker_slot = -1, state_fd = -1, c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            o.socket_path = optarg;
            break;
        case 'm':
            o.model = optarg;
            break;
        case 'f':
            o.model_file = optarg;
            break;
        case 'p':
            o.broker_pid = atol(optarg);
            break;
        case 'w':
            o.workers = atoi(optarg);
            break;
        case 'd':
            o.duration = atof(optarg);
            break;
        case 'u':
            o.warmup = atof(optarg);
            break;
        case 'k':
            o.kill_rate = atof(optarg);
            break;
        case 'j':
            o.junk_rate = atof(optarg);
            break;
        case 'o':
            o.oversize = atol(optarg);
            break;
        case 'H':
            o.hold_max_ms = atoi(optarg);
            break;
        case 'S':
            o.seed = strtoull(optarg, NULL, 10);
            break;
        case 'r':
            o.rss_tolerance_kib = atol(optarg);
            break;
        case 'J':
            o.json_path = optarg;
            break;
        case 'W':
            worker_slot = atoi(optarg);
            break;
        case 'F':
            state_fd = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return usage(stderr);
        }
    }
    if (!o.model || !o.model_file)
        return usage(stderr);
    if (worker_slot >= 0) {
        if (worker_slot >= MAX_WORKERS || state_fd < 0)
            return usage(stderr);
        shared *sh = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED, state_fd, 0);
        if (sh == MAP_FAILED) {
            perror("wbsoak worker: mmap");
            return 1;
        }
        close(state_fd);
        return worker_main(sh, worker_slot, o.socket_path, o.model, o.model_file, o.seed,
                           o.hold_max_ms);
    }
    if (o.broker_pid <= 0 || o.workers < 1 || o.workers > MAX_WORKERS || o.duration <= 0 ||
        o.warmup < 0 || o.warmup >= o.duration || o.kill_rate < 0 || o.junk_rate < 0)
        return usage(stderr);
    return driver_main(&o);
}
