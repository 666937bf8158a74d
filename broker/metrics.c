#include "metrics.h"

#include "alloc.h"
#include "buildinfo.h"
#include "connguard.h"
#include "log.h"
#include "wire.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifdef WB_HAVE_MICROHTTPD
#include <microhttpd.h>
#endif

/* A changed broker is rendered at most this often... */
#define RENDER_MIN_MS 20
/* ...and an unchanged one this often, so that a scrape is never older. */
#define RENDER_MAX_MS 250

/* libmicrohttpd's inactivity timeout, in seconds: a backstop only, since
 * the request timeout (at most WB_METRICS_MAX_REQUEST_TIMEOUT_MS) cuts any
 * connection first. */
#define INACTIVITY_S 10

struct wb_metrics {
#ifdef WB_HAVE_MICROHTTPD
    struct MHD_Daemon *daemon;
    pthread_t thread;
    int epoll_fd; /* libmicrohttpd's, which the HTTP thread polls */
    int wake_fd;  /* an eventfd: written once to stop the HTTP thread */
    /* The HTTP thread's alone, like every libmicrohttpd callback. */
    wb_connguard guard;
    unsigned long long cut_logged[WB_CUT_REASONS];
    int64_t cut_logged_ms[WB_CUT_REASONS];
    unsigned long long closed; /* connections closed, for the loop */
    int64_t log_ms;            /* libmicrohttpd's last message logged */
    unsigned long long log_suppressed;
#endif
    unsigned port;
    double start_time; /* process_start_time_seconds, read once at start */
    pthread_mutex_t mu;
    char *text; /* the published page, under mu */
    size_t len;
    int64_t published_ms; /* when it was published, under mu */
    int health;           /* HEALTH_*, under mu */
    int64_t rendered_ms;  /* loop thread only */
    int dirty;            /* loop thread only */
};

enum { HEALTH_STARTING, HEALTH_SERVING, HEALTH_STOPPING };

int wb__metrics_parse_addr(const char *spec, struct sockaddr_storage *ss, socklen_t *len,
                           wb_err *err)
{
    char host[256];
    const char *colon = spec ? strrchr(spec, ':') : NULL;
    if (!colon || colon == spec || !colon[1])
        return wb__err_set(err, WB_EINVAL, "'%s' is not ADDR:PORT (for example 127.0.0.1:9464)",
                           spec ? spec : "");
    size_t hl = (size_t)(colon - spec);
    const char *h = spec;
    if (h[0] == '[') {
        /* [IPv6]:PORT */
        if (hl < 3 || h[hl - 1] != ']')
            return wb__err_set(err, WB_EINVAL, "'%s' is not [IPV6]:PORT", spec);
        h++;
        hl -= 2;
    } else if (memchr(h, ':', hl)) {
        return wb__err_set(err, WB_EINVAL, "'%s': write an IPv6 address in brackets, [ADDR]:PORT",
                           spec);
    }
    if (hl >= sizeof host)
        return wb__err_set(err, WB_EINVAL, "'%s': the address is too long", spec);
    memcpy(host, h, hl);
    host[hl] = '\0';
    const char *port = colon + 1;
    long pv = 0;
    for (const char *c = port; *c; c++) {
        if (*c < '0' || *c > '9' || pv > 65535) {
            pv = -1;
            break;
        }
        pv = pv * 10 + (*c - '0');
    }
    if (pv < 0 || pv > 65535)
        return wb__err_set(err, WB_EINVAL, "'%s': the port '%s' is not 0 to 65535", spec, port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0 || !res)
        return wb__err_set(err, WB_EINVAL, "'%s': cannot resolve '%s': %s", spec, host,
                           g ? gai_strerror(g) : "no address");
    if (ss) {
        memset(ss, 0, sizeof *ss);
        memcpy(ss, res->ai_addr, res->ai_addrlen);
        *len = res->ai_addrlen;
    }
    freeaddrinfo(res);
    return WB_OK;
}

/* Prometheus label values escape backslash, double quote and newline. */
static void put_label(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            fprintf(f, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

/* The shortest decimal form that reads back as the same double. */
static void put_double(FILE *f, double v)
{
    char buf[40];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, f);
}

static void header(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Models that hold memory: ready or draining. */
static int holds_memory(const wb_model *m)
{
    return m->state == WBPROTO__MODEL_STATE__MODEL_READY ||
           m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING;
}

/* A metric without labels: its header and its one sample. */
static void single(FILE *f, const char *name, const char *type, const char *help,
                   unsigned long long v)
{
    header(f, name, type, help);
    fprintf(f, "%s %llu\n", name, v);
}

static double load_seconds(const wb_model *m)
{
    return m->data.load_seconds;
}

static double load_bytes_per_second(const wb_model *m)
{
    return m->data.load_seconds > 0 ? (double)m->data.bytes / m->data.load_seconds : 0.0;
}

/* A gauge with one sample per model that holds memory, labelled by name. */
static void per_model(FILE *f, const wb_broker *b, const char *name, const char *help,
                      double (*value)(const wb_model *))
{
    header(f, name, "gauge", help);
    for (const wb_model *m = b->models.head; m; m = m->next) {
        if (!holds_memory(m))
            continue;
        fprintf(f, "%s{model=\"", name);
        put_label(f, m->name);
        fputs("\"} ", f);
        put_double(f, value(m));
        fputc('\n', f);
    }
}

static int by_op_status(const void *a, const void *b)
{
    const wb_request_count *x = a, *y = b;
    if (x->op != y->op)
        return x->op < y->op ? -1 : 1;
    return (x->status < y->status) - (x->status > y->status);
}

static const char *op_name(uint32_t op)
{
    if (op == 0)
        return "invalid";
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&wbproto__request__descriptor, (unsigned)op);
    return fd ? fd->name : "unknown";
}

char *wb__metrics_render(const wb_broker *b, size_t *len)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f)
        return NULL;
    const wb_broker_stats *st = &b->stats;

    header(f, "wb_build_info", "gauge",
           "Always 1, labelled by the broker's version, git revision, wire protocol version and "
           "the backends compiled in.");
    fputs("wb_build_info{version=\"", f);
    put_label(f, WB_VERSION);
    fputs("\",revision=\"", f);
    put_label(f, wb__build_rev());
    fprintf(f, "\",protocol=\"%d\",backends=\"", WB_PROTOCOL_VERSION);
    put_label(f, wb__build_backends());
    fputs("\"} 1\n", f);

    header(f, "wb_leases", "gauge",
           "Leases held, by state (stale: heartbeats stopped, never freed).");
    fprintf(f, "wb_leases{state=\"active\"} %zu\n",
            wb__leases_count_state(&b->leases, WBPROTO__LEASE_STATE__LEASE_ACTIVE));
    fprintf(f, "wb_leases{state=\"stale\"} %zu\n",
            wb__leases_count_state(&b->leases, WBPROTO__LEASE_STATE__LEASE_STALE));

    static const int states[] = {WBPROTO__MODEL_STATE__MODEL_LOADING,
                                 WBPROTO__MODEL_STATE__MODEL_READY,
                                 WBPROTO__MODEL_STATE__MODEL_DRAINING};
    header(f, "wb_models", "gauge", "Models in the registry, by state.");
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
        size_t count = 0;
        for (const wb_model *m = b->models.head; m; m = m->next)
            count += m->state == states[i];
        fprintf(f, "wb_models{state=\"%s\"} %zu\n", wb__model_state_name(states[i]), count);
    }

    header(f, "wb_model_bytes", "gauge",
           "Tensor bytes of each model that holds memory (ready or draining), per device it "
           "has a ready copy on.");
    for (const wb_model *m = b->models.head; m; m = m->next) {
        if (!holds_memory(m))
            continue;
        for (uint32_t k = 0; k < m->data.n_copies; k++) {
            if (m->data.copies[k].state != WBPROTO__MODEL_STATE__MODEL_READY)
                continue;
            fputs("wb_model_bytes{model=\"", f);
            put_label(f, m->name);
            fprintf(f, "\",device=\"%d\",backend=\"", m->data.copies[k].device);
            put_label(f, m->backend->name);
            fprintf(f, "\"} %llu\n", (unsigned long long)m->data.bytes);
        }
    }

    header(f, "wb_model_copies", "gauge",
           "A model's copy on each device it is placed on (device -1: host memory), by state "
           "(a copy whose load failed is failed while the others serve).");
    for (const wb_model *m = b->models.head; m; m = m->next) {
        for (uint32_t k = 0; holds_memory(m) && k < m->data.n_copies; k++) {
            const wb_model_copy *c = &m->data.copies[k];
            fputs("wb_model_copies{model=\"", f);
            put_label(f, m->name);
            fprintf(f, "\",device=\"%d\",uuid=\"", c->device);
            put_label(f, c->uuid);
            fprintf(f, "\",state=\"%s\"} 1\n", wb__model_state_name(c->state));
        }
    }

    header(f, "wb_model_copy_leases", "gauge", "Leases held on each ready copy of a model.");
    for (const wb_model *m = b->models.head; m; m = m->next) {
        for (uint32_t k = 0; holds_memory(m) && k < m->data.n_copies; k++) {
            const wb_model_copy *c = &m->data.copies[k];
            if (c->state != WBPROTO__MODEL_STATE__MODEL_READY)
                continue;
            fputs("wb_model_copy_leases{model=\"", f);
            put_label(f, m->name);
            fprintf(f, "\",device=\"%d\"} %u\n", c->device, c->leases);
        }
    }

    single(f, "wb_loads_total", "counter",
           "Model loads finished since the broker started, successful or not.", st->loads_total);
    single(f, "wb_load_failures_total", "counter", "Model loads that failed.", st->loads_failed);

    per_model(f, b, "wb_load_seconds", "Seconds the load of each model took.", load_seconds);
    per_model(f, b, "wb_load_bytes_per_second", "Tensor bytes per second of each model's load.",
              load_bytes_per_second);

    header(f, "wb_requests_total", "counter",
           "Requests answered, by operation and status (WB_OK or the error's name).");
    wb_request_count sorted[WB_REQUEST_COUNTERS];
    size_t nreq = st->n_by_op < WB_REQUEST_COUNTERS ? st->n_by_op : WB_REQUEST_COUNTERS;
    memcpy(sorted, st->by_op, nreq * sizeof sorted[0]);
    qsort(sorted, nreq, sizeof sorted[0], by_op_status);
    for (size_t i = 0; i < nreq; i++) {
        fputs("wb_requests_total{op=\"", f);
        put_label(f, op_name(sorted[i].op));
        fprintf(f, "\",status=\"%s\"} %llu\n", wb_status_name(sorted[i].status),
                (unsigned long long)sorted[i].n);
    }

    single(f, "wb_reclaims_total", "counter",
           "Leases reclaimed because their process was proven dead (its pidfd, or the end of "
           "its descriptor channel connection).",
           st->leases_reclaimed);

    single(f, "wb_replies_dropped_total", "counter",
           "Replies not delivered: the peer was gone or left too many unread.",
           st->replies_dropped);
    single(f, "wb_malformed_messages_total", "counter", "Requests that could not be decoded.",
           st->malformed_messages);
    single(f, "wb_connections", "gauge", "Connections to the broker's socket open now.",
           st->connections);
    single(f, "wb_peers_refused_total", "counter",
           "Connections closed as soon as accepted, on the socket or the descriptor channel: "
           "over --max-peers, --max-peers-per-uid or --max-peers-per-process, too many refused "
           "ones of one uid kept, or out of descriptors or memory.",
           st->peers_refused);
    single(f, "wb_peers_disconnected_total", "counter",
           "Connections closed for breaking a transport bound or the protocol, or for not "
           "sending a request within --handshake-timeout-ms.",
           st->peers_disconnected);

    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    *len = n;
    return text;
}

void wb__metrics_publish(wb_metrics *m, char *text, size_t len)
{
    int64_t now = wb__clock_mono_ms();
    pthread_mutex_lock(&m->mu);
    char *old = m->text;
    m->text = text;
    m->len = len;
    m->published_ms = now;
    pthread_mutex_unlock(&m->mu);
    free(old);
}

void wb__metrics_serving(wb_metrics *m, int serving)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->health = serving ? HEALTH_SERVING : HEALTH_STOPPING;
    /* The stall clock starts now, not at the last page before the loop. */
    if (serving)
        m->published_ms = wb__clock_mono_ms();
    pthread_mutex_unlock(&m->mu);
}

unsigned wb__metrics_health(wb_metrics *m, int64_t now_ms, char *body, size_t size)
{
    pthread_mutex_lock(&m->mu);
    int health = m->health;
    int64_t age = now_ms - m->published_ms;
    pthread_mutex_unlock(&m->mu);
    if (health == HEALTH_STARTING) {
        snprintf(body, size, "starting: loading models\n");
        return 503;
    }
    if (health == HEALTH_STOPPING) {
        snprintf(body, size, "stopping\n");
        return 503;
    }
    if (age > WB_METRICS_STALL_MS) {
        snprintf(body, size, "the event loop has not run for %lld ms\n", (long long)age);
        return 503;
    }
    snprintf(body, size, "ok\n");
    return 200;
}

/* Reads a small /proc file whole into buf (terminated). Returns its length,
 * or -1. */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    while (len + 1 < size) {
        ssize_t n = read(fd, buf + len, size - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    return (ssize_t)len;
}

/* The n-th (from 1) blank-separated field of [p, end) as a number. */
static int stat_field(const char *p, const char *end, int n, unsigned long long *out)
{
    for (int i = 1; p < end; i++) {
        while (p < end && *p == ' ')
            p++;
        const char *start = p;
        unsigned long long v = 0;
        int digits = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            v = v * 10 + (unsigned long long)(*p - '0');
            p++;
            digits++;
        }
        while (p < end && *p != ' ')
            p++;
        if (i == n) {
            if (!digits || p != start + digits || digits > 19)
                return -1;
            *out = v;
            return 0;
        }
    }
    return -1;
}

int wb__metrics_parse_stat(const char *text, size_t len, long ticks, uint64_t btime,
                           wb_proc_self *out, wb_err *err)
{
    /* pid (comm) state ppid ...: the command name ends at the last ')'. */
    const char *close = NULL;
    for (size_t i = 0; i < len; i++)
        if (text[i] == ')')
            close = text + i;
    if (!close || ticks <= 0)
        return wb__err_set(err, WB_EFORMAT, "no command name in /proc/self/stat");
    const char *end = text + len;
    while (end > close && (end[-1] == '\n' || end[-1] == ' '))
        end--;
    /* Fields 14 (utime), 15 (stime) and 22 (starttime) of stat(5) are the
     * 12th, 13th and 20th after the name. */
    unsigned long long utime, stime, start;
    if (stat_field(close + 1, end, 12, &utime) != 0 ||
        stat_field(close + 1, end, 13, &stime) != 0 || stat_field(close + 1, end, 20, &start) != 0)
        return wb__err_set(err, WB_EFORMAT, "/proc/self/stat lacks utime, stime or starttime");
    out->cpu_seconds = (double)(utime + stime) / (double)ticks;
    out->start_time_seconds = (double)btime + (double)start / (double)ticks;
    return WB_OK;
}

int wb__metrics_parse_statm(const char *text, size_t len, uint64_t page, wb_proc_self *out,
                            wb_err *err)
{
    unsigned long long size, resident;
    const char *end = text + len;
    while (end > text && (end[-1] == '\n' || end[-1] == ' '))
        end--;
    if (stat_field(text, end, 1, &size) != 0 || stat_field(text, end, 2, &resident) != 0)
        return wb__err_set(err, WB_EFORMAT, "/proc/self/statm lacks its sizes");
    out->virtual_bytes = (uint64_t)size * page;
    out->resident_bytes = (uint64_t)resident * page;
    return WB_OK;
}

int wb__metrics_parse_btime(const char *text, size_t len, uint64_t *btime, wb_err *err)
{
    const char *end = text + len;
    for (const char *p = text; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if ((size_t)(le - p) > 6 && memcmp(p, "btime ", 6) == 0) {
            unsigned long long v;
            if (stat_field(p + 6, le, 1, &v) != 0)
                break;
            *btime = (uint64_t)v;
            return WB_OK;
        }
        p = nl ? nl + 1 : end;
    }
    return wb__err_set(err, WB_EFORMAT, "no btime line in /proc/stat");
}

/* process_start_time_seconds: the boot time and the process's start in
 * clock ticks after it. -1 when either cannot be read. */
static double read_start_time(void)
{
    char stat[4096];
    ssize_t n = read_small("/proc/self/stat", stat, sizeof stat);
    /* /proc/stat has a line per CPU before btime: a few hundred bytes each
     * on large machines, read through a growing buffer. */
    size_t cap = 64 * 1024;
    char *all = NULL;
    ssize_t an = -1;
    for (; cap <= 16u << 20; cap *= 4) {
        free(all);
        all = wb__malloc(cap);
        if (!all)
            break;
        an = read_small("/proc/stat", all, cap);
        if (an < 0 || (size_t)an + 1 < cap)
            break;
    }
    uint64_t btime = 0;
    wb_proc_self ps;
    wb_err err;
    int ok = n > 0 && all && an > 0 &&
             wb__metrics_parse_btime(all, (size_t)an, &btime, &err) == 0 &&
             wb__metrics_parse_stat(stat, (size_t)n, sysconf(_SC_CLK_TCK), btime, &ps, &err) == 0;
    free(all);
    return ok ? ps.start_time_seconds : -1.0;
}

/* Descriptors open in this process, the one reading the list aside. */
static long count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        n += de->d_name[0] != '.';
    closedir(d);
    return n - 1;
}

void wb__metrics_render_process(FILE *f, double start_time_seconds)
{
    wb_err err;
    wb_proc_self ps = {0};
    char buf[4096];
    ssize_t n = read_small("/proc/self/stat", buf, sizeof buf);
    int have_stat =
        n > 0 && wb__metrics_parse_stat(buf, (size_t)n, sysconf(_SC_CLK_TCK), 0, &ps, &err) == 0;
    long page = sysconf(_SC_PAGESIZE);
    n = read_small("/proc/self/statm", buf, sizeof buf);
    int have_statm = n > 0 && page > 0 &&
                     wb__metrics_parse_statm(buf, (size_t)n, (uint64_t)page, &ps, &err) == 0;
    if (start_time_seconds < 0)
        start_time_seconds = read_start_time();
    long fds = count_fds();
    struct rlimit rl;
    int have_limit = getrlimit(RLIMIT_NOFILE, &rl) == 0;

    header(f, "process_cpu_seconds_total", "counter",
           "Total user and system CPU time spent in seconds.");
    if (have_stat) {
        fputs("process_cpu_seconds_total ", f);
        put_double(f, ps.cpu_seconds);
        fputc('\n', f);
    }
    header(f, "process_start_time_seconds", "gauge",
           "Start time of the process since unix epoch in seconds.");
    if (start_time_seconds >= 0) {
        fputs("process_start_time_seconds ", f);
        put_double(f, start_time_seconds);
        fputc('\n', f);
    }
    header(f, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    if (have_statm)
        fprintf(f, "process_resident_memory_bytes %llu\n", (unsigned long long)ps.resident_bytes);
    header(f, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    if (have_statm)
        fprintf(f, "process_virtual_memory_bytes %llu\n", (unsigned long long)ps.virtual_bytes);
    header(f, "process_open_fds", "gauge", "Number of open file descriptors.");
    if (fds >= 0)
        fprintf(f, "process_open_fds %ld\n", fds);
    header(f, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
    if (have_limit)
        fprintf(f, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
}

char *wb__metrics_page(wb_metrics *m, size_t *len)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f)
        return NULL;
    pthread_mutex_lock(&m->mu);
    if (m->text)
        fwrite(m->text, 1, m->len, f);
    pthread_mutex_unlock(&m->mu);
    wb__metrics_render_process(f, m->start_time);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    *len = n;
    return text;
}

char *wb__metrics_snapshot(wb_metrics *m, size_t *len)
{
    pthread_mutex_lock(&m->mu);
    char *copy = wb__malloc(m->len + 1);
    if (copy) {
        memcpy(copy, m->text ? m->text : "", m->len);
        copy[m->len] = '\0';
        *len = m->len;
    }
    pthread_mutex_unlock(&m->mu);
    return copy;
}

void wb__metrics_tick(wb_metrics *m, const wb_broker *b, int changed)
{
    if (!m)
        return;
    m->dirty |= changed;
    int64_t now = wb__clock_mono_ms();
    int64_t age = now - m->rendered_ms;
    if (age < RENDER_MAX_MS && !(m->dirty && age >= RENDER_MIN_MS))
        return;
    size_t len;
    char *text = wb__metrics_render(b, &len);
    if (!text)
        return; /* out of memory: the last page stays */
    wb__metrics_publish(m, text, len);
    m->rendered_ms = now;
    m->dirty = 0;
}

unsigned wb__metrics_port(const wb_metrics *m)
{
    return m ? m->port : 0;
}

#ifdef WB_HAVE_MICROHTTPD

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, char *body, size_t len,
                               const char *type, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* The HTTP thread: serves a copy of the published page with the process
 * families, and the health check; nothing else. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls)
{
    wb_metrics *m = cls;
    (void)version;
    (void)upload;
    (void)req_cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context)
        wb__connguard_request(&m->guard, ci->socket_context);
    static char not_allowed[] = "only GET and HEAD are served\n";
    static char not_found[] = "not found; the metrics are at /metrics, the health check at "
                              "/healthz\n";
    if (*upload_size) {
        *upload_size = 0; /* a body is read and ignored */
        return MHD_YES;
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed, sizeof not_allowed - 1,
                       "text/plain; charset=utf-8", MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/healthz") == 0) {
        char body[96];
        unsigned code = wb__metrics_health(m, wb__clock_mono_ms(), body, sizeof body);
        return respond(conn, code, body, strlen(body), "text/plain; charset=utf-8",
                       MHD_RESPMEM_MUST_COPY);
    }
    if (strcmp(url, "/metrics") != 0)
        return respond(conn, MHD_HTTP_NOT_FOUND, not_found, sizeof not_found - 1,
                       "text/plain; charset=utf-8", MHD_RESPMEM_PERSISTENT);
    size_t len;
    char *page = wb__metrics_page(m, &len);
    if (!page)
        return MHD_NO;
    return respond(conn, MHD_HTTP_OK, page, len, "text/plain; version=0.0.4; charset=utf-8",
                   MHD_RESPMEM_MUST_FREE);
}

/* libmicrohttpd's messages, at most one a second with the number left out
 * since the last: it writes one for every connection that a client (or a
 * cut) ends early, and an attacker makes hundreds a second. Called on the
 * HTTP thread, or on the thread that starts or stops the daemon while the
 * HTTP thread does not run. */
static void on_log(void *cls, const char *fmt, va_list ap)
{
    wb_metrics *m = cls;
    int64_t now = wb__clock_mono_ms();
    if (m->log_ms && now - m->log_ms < 1000) {
        m->log_suppressed++;
        return;
    }
    char msg[512], q[600];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    wb_warn("metrics_http", "error=%s suppressed=%llu", wb__log_quote(q, sizeof q, msg),
            m->log_suppressed);
    m->log_ms = now;
    m->log_suppressed = 0;
}

/* A connection starts or closes (the HTTP thread). Its record lives
 * exactly as long as libmicrohttpd holds its socket open: it closes the
 * descriptor only after this callback says CLOSED, on the same thread as
 * the sweep, so a cut never reaches a descriptor number reused since. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    wb_metrics *m = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        m->closed++;
        wb_guarded *c = *socket_context;
        wb__connguard_remove(&m->guard, &c);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fi =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ai =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!fi)
        return;
    *socket_context = wb__connguard_add(&m->guard, fi->connect_fd, ai ? ai->client_addr : NULL,
                                        wb__clock_mono_ms());
    /* Out of memory: a connection without a deadline is not kept. */
    if (!*socket_context)
        shutdown(fi->connect_fd, SHUT_RDWR);
}

/* A response was sent (or the request ended otherwise): the connection
 * waits for its next request, with a new deadline. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    wb_metrics *m = cls;
    (void)req_cls;
    (void)toe;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context)
        wb__connguard_done(&m->guard, ci->socket_context, wb__clock_mono_ms());
}

/* shutdown, never close: the descriptor stays libmicrohttpd's, which sees
 * the end of the stream on its next round and closes the connection. */
static void cut_socket(void *cls, int fd, wb_cut_reason why)
{
    (void)cls;
    (void)why;
    shutdown(fd, SHUT_RDWR);
}

/* Cuts are logged at most once a second for each reason (or now, when
 * `all`), with the count since the last line: an attacker makes one every
 * few milliseconds. Returns the milliseconds until cuts not yet logged can
 * be, -1 if none. */
static long log_cuts(wb_metrics *m, int64_t now, int all)
{
    static const char *const reasons[WB_CUT_REASONS] = {"request_timeout", "crowded"};
    long wait = -1;
    for (int r = 0; r < WB_CUT_REASONS; r++) {
        unsigned long long n = m->guard.cut[r] - m->cut_logged[r];
        if (n == 0)
            continue;
        if (!all && m->cut_logged_ms[r] && now - m->cut_logged_ms[r] < 1000) {
            long left = (long)(m->cut_logged_ms[r] + 1000 - now);
            if (wait < 0 || left < wait)
                wait = left;
            continue;
        }
        wb_warn("metrics_connection_closed",
                "reason=%s closed=%llu request_timeout_ms=%lld max_waiting=%u "
                "max_waiting_per_address=%u",
                reasons[r], n, (long long)m->guard.timeout_ms, m->guard.max_waiting,
                m->guard.max_waiting_per_addr);
        m->cut_logged[r] = m->guard.cut[r];
        m->cut_logged_ms[r] = now;
    }
    return wait;
}

/* The HTTP thread: runs libmicrohttpd's event loop (its epoll descriptor)
 * and, after each round, the sweep that cuts connections; it sleeps until
 * the next event, the next deadline, or the stop. */
static void *serve(void *arg)
{
    wb_metrics *m = arg;
    struct pollfd pfd[2] = {{.fd = m->epoll_fd, .events = POLLIN},
                            {.fd = m->wake_fd, .events = POLLIN}};
    for (;;) {
        unsigned long long closed = m->closed;
        MHD_run(m->daemon);
        int64_t now = wb__clock_mono_ms();
        /* A cut connection is closed on the next round, at once: shutdown
         * wakes the epoll descriptor. */
        long wait = wb__connguard_sweep(&m->guard, now, cut_socket, m);
        long log_wait = log_cuts(m, now, 0);
        if (log_wait >= 0 && (wait < 0 || log_wait < wait))
            wait = log_wait;
        MHD_UNSIGNED_LONG_LONG mt;
        if (MHD_get_timeout(m->daemon, &mt) == MHD_YES &&
            (wait < 0 || mt < (MHD_UNSIGNED_LONG_LONG)wait))
            wait = (long)mt;
        /* At the connection limit libmicrohttpd takes the listening socket
         * out of its epoll set, and puts it back only at the start of a
         * round: after closes, one more round, or the backlog would wait
         * for the next event. */
        if (m->closed != closed)
            wait = 0;
        if (poll(pfd, 2, (int)wait) < 0 && errno != EINTR)
            usleep(10 * 1000); /* ENOMEM: try again shortly */
        if (pfd[1].revents)
            return NULL;
    }
}

int wb__metrics_start(const char *spec, unsigned request_timeout_ms, const wb_broker *b,
                      wb_metrics **out, wb_err *err)
{
    *out = NULL;
    if (request_timeout_ms == 0)
        request_timeout_ms = WB_METRICS_REQUEST_TIMEOUT_MS;
    struct sockaddr_storage ss;
    socklen_t sslen;
    int rc = wb__metrics_parse_addr(spec, &ss, &sslen, err);
    if (rc != WB_OK)
        return rc;
    /* The socket is bound here rather than by libmicrohttpd, so that a
     * failure says why (address in use, permission) and port 0 works. */
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return wb__err_errno(err, WB_EIO, errno, "metrics: socket");
    int one = 1, defer = WB_METRICS_DEFER_ACCEPT_S;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* Best effort: without it a scraper's request may come just after its
     * accept, and a burst from its address could crowd it out first. */
    setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof defer);
    if (bind(fd, (struct sockaddr *)&ss, sslen) != 0 ||
        listen(fd, WB_METRICS_LISTEN_BACKLOG) != 0) {
        int e = errno;
        close(fd);
        return wb__err_errno(err, WB_EIO, e, "metrics: cannot listen on %s", spec);
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    unsigned port = 0;
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0)
        port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                 : ((struct sockaddr_in *)&bound)->sin_port);
    wb_metrics *m = wb__calloc(1, sizeof *m);
    if (!m) {
        close(fd);
        return wb__err_set(err, WB_ENOMEM, "metrics: out of memory");
    }
    pthread_mutex_init(&m->mu, NULL);
    m->port = port;
    m->dirty = 1;
    m->health = HEALTH_STARTING;
    m->start_time = read_start_time();
    wb__connguard_init(&m->guard, request_timeout_ms, WB_METRICS_MAX_WAITING_PER_ADDR,
                       WB_METRICS_MAX_WAITING);
    /* The first page exists before the server answers: a scrape right
     * after start-up gets every metric family, not an empty page. */
    if (b) {
        size_t len = 0;
        char *text = wb__metrics_render(b, &len);
        if (text)
            wb__metrics_publish(m, text, len);
    }
    /* No internal thread: the loop is ours (serve), so that the sweep runs
     * on the thread where connections start and close. */
    m->daemon = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_USE_ERROR_LOG | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0), 0, NULL,
        NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, on_log, m, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)WB_METRICS_MAX_CONNECTIONS,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)WB_METRICS_MAX_PER_ADDR,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)INACTIVITY_S, MHD_OPTION_NOTIFY_CONNECTION,
        on_connection, m, MHD_OPTION_NOTIFY_COMPLETED, on_completed, m, MHD_OPTION_END);
    const char *what = "libmicrohttpd could not start";
    if (m->daemon) {
        what = "cannot start the HTTP thread";
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(m->daemon, MHD_DAEMON_INFO_EPOLL_FD);
        m->epoll_fd = di ? di->epoll_fd : -1;
        m->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (m->epoll_fd >= 0 && m->wake_fd >= 0 &&
            pthread_create(&m->thread, NULL, serve, m) == 0) {
            char q[300];
            wb_info("metrics_listen",
                    "address=%s port=%u path=/metrics health=/healthz request_timeout_ms=%u "
                    "max_connections=%u "
                    "max_per_address=%u max_waiting=%u max_waiting_per_address=%u",
                    wb__log_quote(q, sizeof q, spec), port, request_timeout_ms,
                    WB_METRICS_MAX_CONNECTIONS, WB_METRICS_MAX_PER_ADDR, WB_METRICS_MAX_WAITING,
                    WB_METRICS_MAX_WAITING_PER_ADDR);
            *out = m;
            return WB_OK;
        }
        if (m->wake_fd >= 0)
            close(m->wake_fd);
        MHD_stop_daemon(m->daemon); /* closes the listening socket */
    } else {
        close(fd);
    }
    pthread_mutex_destroy(&m->mu);
    free(m->text);
    free(m);
    return wb__err_set(err, WB_EIO, "metrics: %s on %s", what, spec);
}

void wb__metrics_stop(wb_metrics **mp)
{
    wb_metrics *m = mp ? *mp : NULL;
    if (!m)
        return;
    /* The HTTP thread ends, then the daemon closes the connections (their
     * records go with them) and the listening socket. */
    uint64_t one = 1;
    while (write(m->wake_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
    pthread_join(m->thread, NULL);
    MHD_stop_daemon(m->daemon);
    log_cuts(m, wb__clock_mono_ms(), 1);
    wb__connguard_destroy(&m->guard);
    close(m->wake_fd);
    pthread_mutex_destroy(&m->mu);
    free(m->text);
    free(m);
    *mp = NULL;
}

#else /* !WB_HAVE_MICROHTTPD */

int wb__metrics_start(const char *spec, unsigned request_timeout_ms, const wb_broker *b,
                      wb_metrics **out, wb_err *err)
{
    (void)spec;
    (void)request_timeout_ms;
    (void)b;
    *out = NULL;
    return wb__err_set(err, WB_ENOSYS,
                       "--metrics: this wbrokerd was built without libmicrohttpd; rebuild with "
                       "libmicrohttpd-dev installed");
}

void wb__metrics_stop(wb_metrics **mp)
{
    if (mp)
        *mp = NULL;
}

#endif
