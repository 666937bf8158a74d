/* Prometheus metrics over HTTP (libmicrohttpd), at /metrics on --metrics
 * ADDR:PORT, in the text exposition format 0.0.4, and a health check for
 * probes at /healthz.
 *
 * The broker's state belongs to the event loop's thread. The HTTP server
 * runs its own thread, so it never looks at that state: the loop renders the
 * broker's families into a buffer (wb__metrics_tick, on changes and every
 * 250 ms) and publishes it under a mutex, with what /healthz says; each
 * scrape copies the last page and adds the process_* families, read from
 * /proc/self on the HTTP thread at the scrape (they concern the process,
 * not the broker's state, and so are current even while preloads hold the
 * loop from starting).
 *
 * The HTTP thread also bounds what clients can hold (connguard.h): every
 * connection has the request timeout, from its accept or its last response,
 * to send a whole request and take the answer; connections still waiting
 * for their request are capped per address and in all, the longest-waiting
 * cut first, so that a scrape is served while others trickle headers. */
#ifndef WB_BROKER_METRICS_H
#define WB_BROKER_METRICS_H

#include "broker.h"
#include "err.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

typedef struct wb_metrics wb_metrics;

/* The default of --metrics-request-timeout-ms, and its range. */
#define WB_METRICS_REQUEST_TIMEOUT_MS     2000
#define WB_METRICS_MIN_REQUEST_TIMEOUT_MS 100
#define WB_METRICS_MAX_REQUEST_TIMEOUT_MS 10000
/* Connections at once; beyond it new ones wait in the listen backlog. */
#define WB_METRICS_MAX_CONNECTIONS 64
#define WB_METRICS_LISTEN_BACKLOG  64
/* Connections from one address; more are closed as soon as accepted, so
 * that other addresses always have 16. */
#define WB_METRICS_MAX_PER_ADDR 48
/* Connections waiting for their request's headers, from one address and
 * in all; over either, the longest-waiting is cut (never one accepted in
 * the last round). When libmicrohttpd accepts, one address then holds at
 * most 33 (8 kept, or up to the 11 it accepts in a round; up to 11 cut and
 * not yet closed; up to 11 being accepted), all addresses 54: under the two
 * limits above, so that connections about to be cut never make them refuse
 * a newcomer. */
#define WB_METRICS_MAX_WAITING          32
#define WB_METRICS_MAX_WAITING_PER_ADDR 8
/* The kernel hands over a connection once it has sent something, or after
 * this many seconds: a scraper's request is there when it is accepted. */
#define WB_METRICS_DEFER_ACCEPT_S 1

/* Parses "ADDR:PORT": an IPv4 address, "[IPv6]" or a host name, and a port
 * from 0 (any free port) to 65535. When ss is not NULL, fills it (and *len)
 * with the first address found. Returns WB_OK or WB_EINVAL saying what is
 * wrong. */
int wb__metrics_parse_addr(const char *spec, struct sockaddr_storage *ss, socklen_t *len,
                           wb_err *err);

/* Binds ADDR:PORT, publishes a first page rendered from b (when not NULL),
 * then starts the HTTP thread, with request_timeout_ms (0: the default)
 * for each request. SIGTERM and SIGINT must already be blocked (the thread
 * inherits the mask). WB_ENOSYS when built without libmicrohttpd, WB_EIO
 * when the address cannot be bound. */
int wb__metrics_start(const char *spec, unsigned request_timeout_ms, const wb_broker *b,
                      wb_metrics **out, wb_err *err);

/* Stops the HTTP thread and frees everything; sets *m to NULL. NULL is
 * fine. */
void wb__metrics_stop(wb_metrics **m);

/* The port the server listens on (useful with port 0). */
unsigned wb__metrics_port(const wb_metrics *m);

/* Renders the page for the broker's current state into a new buffer (the
 * caller frees it). Returns NULL when out of memory. Loop thread only. */
char *wb__metrics_render(const wb_broker *b, size_t *len);

/* Replaces the published page with `text` (taken over, freed later). */
void wb__metrics_publish(wb_metrics *m, char *text, size_t len);

/* Called by the loop after each round: renders and publishes when the
 * broker changed (`changed`) and the last page is at least 20 ms old, or
 * when it is 250 ms old anyway. */
void wb__metrics_tick(wb_metrics *m, const wb_broker *b, int changed);

/* A copy of the published page (for tests); NULL when out of memory. */
char *wb__metrics_snapshot(wb_metrics *m, size_t *len);

/* What a scrape of /metrics gets: the published page followed by the
 * process families (wb__metrics_render_process), in a new buffer; NULL when
 * out of memory. Any thread. */
char *wb__metrics_page(wb_metrics *m, size_t *len);

/* What /healthz answers. Until the loop serves, 503 "starting: loading
 * models" (the server starts before the preloads); once wb__metrics_serving
 * (m, 1) was called, 200 "ok" while the loop keeps publishing pages, and 503
 * "the event loop has not run for N ms" when its last page is older than
 * WB_METRICS_STALL_MS; after wb__metrics_serving(m, 0), 503 "stopping".
 * Loop thread; NULL m is fine. */
void wb__metrics_serving(wb_metrics *m, int serving);
#define WB_METRICS_STALL_MS 10000

/* /healthz's status code and body (a static string), as the HTTP thread
 * answers it at monotonic time now_ms (for tests). */
unsigned wb__metrics_health(wb_metrics *m, int64_t now_ms, char *body, size_t size);

/* This process's figures for the process_* families, as the Prometheus
 * client libraries define them. */
typedef struct wb_proc_self {
    double cpu_seconds;        /* user + system time (stat utime + stime) */
    double start_time_seconds; /* since the Unix epoch (stat starttime + btime) */
    uint64_t virtual_bytes;    /* statm size */
    uint64_t resident_bytes;   /* statm resident */
} wb_proc_self;

/* Parses /proc/self/stat (`len` bytes; the command name may hold spaces and
 * parentheses): cpu_seconds and start_time_seconds, with `ticks` clock ticks
 * a second and the boot time `btime` (seconds since the epoch). WB_OK, or
 * WB_EFORMAT when the fields are not there. */
int wb__metrics_parse_stat(const char *text, size_t len, long ticks, uint64_t btime,
                           wb_proc_self *out, wb_err *err);
/* Parses /proc/self/statm: the virtual and resident sizes in bytes with
 * pages of `page` bytes. WB_OK or WB_EFORMAT. */
int wb__metrics_parse_statm(const char *text, size_t len, uint64_t page, wb_proc_self *out,
                            wb_err *err);
/* The btime line of /proc/stat. WB_OK or WB_EFORMAT. */
int wb__metrics_parse_btime(const char *text, size_t len, uint64_t *btime, wb_err *err);

/* Writes the process families (process_cpu_seconds_total,
 * process_start_time_seconds, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds) for this
 * process to f: each with HELP and TYPE, its sample left out when its
 * figure cannot be read. start_time_seconds < 0: read it now. Any thread. */
void wb__metrics_render_process(FILE *f, double start_time_seconds);

/* process_start_time_seconds: the boot time and the process's start in
 * clock ticks after it. -1 when either cannot be read. */
double wb__metrics_start_time(void);

#endif
