#include "metrics.h"

#include "clock.h"
#include "alloc.h"
#include "buildinfo.h"
#include "connguard.h"
#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
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
    m->start_time = wb__metrics_start_time();
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
