/* The page's text in the Prometheus exposition format: the broker's
 * families, rendered by the loop from its state (wb__metrics_render), and
 * the process families read from /proc/self at each scrape
 * (wb__metrics_render_process). metrics.c publishes and serves them. */
#include "metrics.h"

#include "alloc.h"
#include "backend_vmm.h"
#include "buildinfo.h"
#include "wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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
        fprintf(f, "\",version=\"%u\"} ", m->version);
        put_double(f, value(m));
        fputc('\n', f);
    }
}

/* A version's state as `wbctl models` words it. */
static const char *version_state(const wb_model *m)
{
    if (m->state == WBPROTO__MODEL_STATE__MODEL_READY)
        return m->current ? "current" : "ready";
    return wb__model_state_name(m->state);
}

/* wb_model_versions{model,state}: how many versions of each name are in
 * each state (a name's records are few: --max-versions and a failed one). */
static void model_versions(FILE *f, const wb_broker *b)
{
    header(f, "wb_model_versions", "gauge",
           "Versions of each model by state (loading, current, draining, failed).");
    for (const wb_model *m = b->models.head; m; m = m->next) {
        const char *st = version_state(m);
        int seen = 0;
        for (const wb_model *o = b->models.head; o != m && !seen; o = o->next)
            seen = strcmp(o->name, m->name) == 0 && strcmp(version_state(o), st) == 0;
        if (seen)
            continue;
        unsigned n = 0;
        for (const wb_model *o = m; o; o = o->next)
            n += strcmp(o->name, m->name) == 0 && strcmp(version_state(o), st) == 0;
        fputs("wb_model_versions{model=\"", f);
        put_label(f, m->name);
        fprintf(f, "\",state=\"%s\"} %u\n", st, n);
    }
}

/* wb_container_swap_seconds: the swap times heartbeats reported. */
static void swap_histogram(FILE *f, const wb_broker_stats *st)
{
    static const double bounds[] = WB_SWAP_BOUNDS;
    header(f, "wb_container_swap_seconds", "histogram",
           "How long containers took to swap to a new version (wb_container_update), as their "
           "heartbeats reported it.");
    unsigned long long cum = 0;
    for (size_t k = 0; k < sizeof bounds / sizeof bounds[0]; k++) {
        cum += st->swap_buckets[k];
        fputs("wb_container_swap_seconds_bucket{le=\"", f);
        put_double(f, bounds[k]);
        fprintf(f, "\"} %llu\n", cum);
    }
    cum += st->swap_buckets[WB_SWAP_BUCKETS - 1];
    fprintf(f, "wb_container_swap_seconds_bucket{le=\"+Inf\"} %llu\n", cum);
    fputs("wb_container_swap_seconds_sum ", f);
    put_double(f, st->swap_seconds_sum);
    fprintf(f, "\nwb_container_swap_seconds_count %llu\n", cum);
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
            fprintf(f, "\",version=\"%u\",device=\"%d\",backend=\"", m->version,
                    m->data.copies[k].device);
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
            fprintf(f, "\",version=\"%u\",device=\"%d\",uuid=\"", m->version, c->device);
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
            fprintf(f, "\",version=\"%u\",device=\"%d\"} %u\n", m->version, c->device, c->leases);
        }
    }

    model_versions(f, b);
    single(f, "wb_rollouts_total", "counter",
           "Rollouts whose new version became current since the broker started.",
           st->rollouts_total);
    single(f, "wb_rollout_failures_total", "counter",
           "Rollouts refused or whose load failed (the current version kept serving).",
           st->rollouts_failed);
    single(f, "wb_publishes_total", "counter",
           "Publishes whose new version became current since the broker started.",
           st->publishes_total);
    single(f, "wb_publish_failures_total", "counter",
           "Publishes refused, aborted, failed or ended with their producer (the current version "
           "kept serving).",
           st->publishes_failed);
    single(f, "wb_publish_bytes_total", "counter", "Bytes the broker copied from producers.",
           st->publish_bytes_total);
    fprintf(f,
            "# HELP wb_publish_copy_seconds_total Seconds the broker spent copying producers' "
            "bytes.\n# TYPE wb_publish_copy_seconds_total counter\n"
            "wb_publish_copy_seconds_total %.6f\n",
            st->publish_copy_seconds);
    single(f, "wb_rollbacks_total", "counter", "Rollbacks: a previous version made current again.",
           st->rollbacks_total);
    single(f, "wb_versions_draining", "gauge",
           "Versions no longer current that leases still hold (freed at their last lease).",
           wb__broker_versions_draining(b));
    single(f, "wb_notices_sent_total", "counter",
           "Version notices queued to subscribed connections.", st->notices_sent);
    single(f, "wb_notices_dropped_total", "counter",
           "Version notices dropped: the subscriber's output queue had no room (its next "
           "heartbeat reply carries the version).",
           st->notices_dropped);
    swap_histogram(f, st);
    uint64_t hits = 0, misses = 0;
    wb__vmm_pool_counts(&hits, &misses);
    single(f, "wb_slab_pool_bytes", "gauge",
           "Freed cuda-vmm slabs kept for the next load of their size (--slab-pool-seconds).",
           wb__vmm_pool_bytes(-1));
    single(f, "wb_slab_pool_hits_total", "counter", "Slab allocations served by a kept slab.",
           hits);
    single(f, "wb_slab_pool_misses_total", "counter",
           "Slab allocations that found no kept slab of their size.", misses);
    uint64_t logical = 0, unique = 0;
    wb__broker_share_bytes(b, &logical, &unique);
    single(f, "wb_logical_bytes", "gauge",
           "Tensor bytes of every resident model and version, as if nothing were shared.", logical);
    single(f, "wb_unique_bytes", "gauge",
           "Tensor bytes resident once (tensors shared across models counted once).", unique);
    single(f, "wb_host_tier_bytes", "gauge",
           "Bytes of models kept in the host tier of the memory budget (and buffers kept for "
           "reuse).",
           b->host_tier_bytes);
    single(f, "wb_models_moved_to_host_total", "counter",
           "Models moved to the host tier to make room on their devices.", st->moved_to_host);
    single(f, "wb_models_evicted_total", "counter",
           "Models dropped from both tiers (they reload from their files).", st->evicted);
    single(f, "wb_restores_total", "counter",
           "Models brought back to their devices from the host tier.", st->restores);
    single(f, "wb_reloads_total", "counter", "Evicted models reloaded from their files.",
           st->reloads);
    single(f, "wb_restore_failures_total", "counter",
           "Restores and reloads that failed (the model stays off its device).",
           st->restore_failures);

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

double wb__metrics_start_time(void)
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
        start_time_seconds = wb__metrics_start_time();
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
