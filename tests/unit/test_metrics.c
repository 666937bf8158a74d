/* The Prometheus page: every family has one HELP and one TYPE line before its
 * samples, and the samples carry the broker's exact values (leases by state,
 * models by state, bytes per model, loads, requests by operation and status,
 * reclaims, the build), label values escaped; the process families read
 * from /proc/self (its parsers, and plausible values); the page is published
 * only as often as wb__metrics_tick allows; the HTTP server serves it at
 * /metrics with the process families, and /healthz (503 before the loop
 * serves, when it stalls and once it stops; 200 while it serves), GET and
 * HEAD only, 404 elsewhere, and reports addresses it cannot use; it closes
 * a connection that has not sent a whole request within the request
 * timeout (silent, trickling or idle after a response), and the
 * longest-waiting of an address with too many waiting, while it serves a
 * scrape. */
#include "broker_fixture.h"
#include "buildinfo.h"
#include "clock.h"
#include "metrics.h"
#include "wire.h"

#include <check.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static wb_broker B;

static void setup(void)
{
    (void)shm_name_exists; /* from the fixture; these tests do not need it */
    fixture_broker(&B, 100, 1000);
}

static void teardown(void)
{
    wb__broker_destroy(&B);
}

static char *render(void)
{
    size_t len = 0;
    char *text = wb__metrics_render(&B, &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_uint_eq(strlen(text), len);
    return text;
}

/* The page has `line` as one whole line. */
static void assert_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    }
    ck_abort_msg("no line '%s' in:\n%s", line, text);
}

/* Checks the exposition format's structure: lines are HELP, TYPE or
 * samples; each family's HELP and TYPE come once, before its samples; sample
 * names belong to the family declared last. Returns the number of families. */
static int check_structure(const char *text)
{
    char family[128] = "";
    char seen[64][128];
    int n_seen = 0;
    int help = 0, type = 0, hist = 0;
    const char *p = text;
    ck_assert_msg(text[0] && text[strlen(text) - 1] == '\n', "the page must end with a newline");
    while (*p) {
        const char *nl = strchr(p, '\n');
        ck_assert_ptr_nonnull(nl);
        char line[1024];
        size_t len = (size_t)(nl - p);
        ck_assert_uint_lt(len, sizeof line);
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl + 1;
        char name[128], kind[32];
        if (sscanf(line, "# HELP %127s", name) == 1) {
            for (int i = 0; i < n_seen; i++)
                ck_assert_msg(strcmp(seen[i], name) != 0, "family %s declared twice", name);
            ck_assert_int_lt(n_seen, 64);
            snprintf(seen[n_seen++], sizeof seen[0], "%s", name);
            snprintf(family, sizeof family, "%s", name);
            help = 1;
            type = 0;
            ck_assert_msg(strlen(line) > strlen("# HELP ") + strlen(name) + 1, "empty HELP: %s",
                          line);
        } else if (sscanf(line, "# TYPE %127s %31s", name, kind) == 2) {
            ck_assert_str_eq(name, family);
            ck_assert_msg(help && !type, "TYPE of %s must follow its HELP once", name);
            ck_assert_msg(strcmp(kind, "gauge") == 0 || strcmp(kind, "counter") == 0 ||
                              strcmp(kind, "histogram") == 0,
                          "type %s", kind);
            hist = strcmp(kind, "histogram") == 0;
            type = 1;
        } else {
            ck_assert_msg(line[0] != '#', "unexpected comment: %s", line);
            ck_assert_msg(type, "sample before its TYPE: %s", line);
            size_t fl = strlen(family);
            /* A histogram's samples: _bucket, _sum and _count. */
            const char *rest = line + fl;
            if (strncmp(line, family, fl) == 0 && hist) {
                if (strncmp(rest, "_bucket", 7) == 0)
                    rest += 7;
                else if (strncmp(rest, "_sum", 4) == 0)
                    rest += 4;
                else if (strncmp(rest, "_count", 6) == 0)
                    rest += 6;
            }
            ck_assert_msg(strncmp(line, family, fl) == 0 && (*rest == '{' || *rest == ' '),
                          "sample '%s' outside family %s", line, family);
            const char *value = strrchr(line, ' ');
            ck_assert_ptr_nonnull(value);
            char *end;
            strtod(value + 1, &end);
            ck_assert_msg(*end == '\0' && end != value + 1, "bad value in '%s'", line);
        }
    }
    return n_seen;
}

START_TEST(test_render_values)
{
    wb_err err;
    wb_model *a = fixture_model(&B, "alpha");
    wb_model *b = fixture_model(&B, "beta");
    a->data.load_seconds = 0.5; /* 28 bytes in half a second */
    /* A model being loaded holds no memory yet. */
    wb_model *c = wb__model_new("gamma", "/models/gamma", &wb__backend_host, -1);
    ck_assert_ptr_nonnull(c);
    wb__models_add(&B.models, c);
    /* Three leases of this process; one goes stale. */
    wb_peer_creds me = creds(1000, 1000, (uint32_t)getpid());
    wb_lease_rec *l;
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(
            wb__leases_grant(&B.leases, a, &me, "test", B.now_ms(), B.now_wall(), &l, &err), WB_OK);
        a->leases++;
    }
    advance_ms(2000);
    ck_assert_uint_eq(wb__broker_scan_stale(&B), 2);
    ck_assert_int_eq(
        wb__leases_grant(&B.leases, b, &me, "test", B.now_ms(), B.now_wall(), &l, &err), WB_OK);
    b->leases++;
    b->state = WBPROTO__MODEL_STATE__MODEL_DRAINING;
    B.stats.loads_total = 4;
    B.stats.loads_failed = 1;
    B.stats.leases_reclaimed = 7;
    B.stats.replies_dropped = 11;
    B.stats.malformed_messages = 12;
    B.stats.connections = 13;
    B.stats.peers_refused = 14;
    B.stats.peers_disconnected = 15;
    for (int i = 0; i < 3; i++)
        wb__broker_count_request(&B, WBPROTO__REQUEST__BODY_ACQUIRE, WB_OK);
    wb__broker_count_request(&B, WBPROTO__REQUEST__BODY_ACQUIRE, WB_ENOTFOUND);
    wb__broker_count_request(&B, WBPROTO__REQUEST__BODY_STATS, WB_OK);
    wb__broker_count_request(&B, 0, WB_EPROTO);
    wb__broker_count_request(&B, 0, WB_EPROTO);

    char *text = render();
    ck_assert_int_eq(check_structure(text), 40);
    assert_line(text, "# TYPE wb_leases gauge");
    assert_line(text, "wb_leases{state=\"active\"} 1");
    assert_line(text, "wb_leases{state=\"stale\"} 2");
    assert_line(text, "# TYPE wb_models gauge");
    assert_line(text, "wb_models{state=\"loading\"} 1");
    assert_line(text, "wb_models{state=\"ready\"} 1");
    assert_line(text, "wb_models{state=\"draining\"} 1");
    assert_line(text, "# TYPE wb_model_bytes gauge");
    assert_line(text,
                "wb_model_bytes{model=\"alpha\",version=\"1\",device=\"-1\",backend=\"host\"} 28");
    assert_line(text,
                "wb_model_bytes{model=\"beta\",version=\"1\",device=\"-1\",backend=\"host\"} 28");
    assert_line(text, "# TYPE wb_model_copies gauge");
    assert_line(
        text,
        "wb_model_copies{model=\"alpha\",version=\"1\",device=\"-1\",uuid=\"\",state=\"ready\"} 1");
    assert_line(text, "# TYPE wb_model_copy_leases gauge");
    /* Only counted among the versions, loading. */
    assert_line(text, "wb_model_versions{model=\"gamma\",state=\"loading\"} 1");
    assert_line(text, "wb_model_versions{model=\"alpha\",state=\"current\"} 1");
    ck_assert_ptr_null(strstr(strstr(text, "gamma") + 1, "gamma"));
    assert_line(text, "# TYPE wb_loads_total counter");
    assert_line(text, "wb_loads_total 4");
    assert_line(text, "wb_load_failures_total 1");
    assert_line(text, "# TYPE wb_load_seconds gauge");
    assert_line(text, "wb_load_seconds{model=\"alpha\",version=\"1\"} 0.5");
    assert_line(text, "wb_load_bytes_per_second{model=\"alpha\",version=\"1\"} 56");
    assert_line(text, "wb_load_bytes_per_second{model=\"beta\",version=\"1\"} 0");
    assert_line(text, "# TYPE wb_requests_total counter");
    assert_line(text, "# TYPE wb_reclaims_total counter");
    assert_line(text, "wb_reclaims_total 7");
    assert_line(text, "# TYPE wb_replies_dropped_total counter");
    assert_line(text, "wb_replies_dropped_total 11");
    assert_line(text, "wb_malformed_messages_total 12");
    assert_line(text, "# TYPE wb_connections gauge");
    assert_line(text, "wb_connections 13");
    assert_line(text, "wb_peers_refused_total 14");
    assert_line(text, "# TYPE wb_peers_disconnected_total counter");
    assert_line(text, "wb_peers_disconnected_total 15");
    /* Operations in protocol order, successes first. */
    const char *reqs = strstr(text, "wb_requests_total{");
    ck_assert_ptr_nonnull(reqs);
    ck_assert_msg(strncmp(reqs,
                          "wb_requests_total{op=\"invalid\",status=\"WB_EPROTO\"} 2\n"
                          "wb_requests_total{op=\"acquire\",status=\"WB_OK\"} 3\n"
                          "wb_requests_total{op=\"acquire\",status=\"WB_ENOTFOUND\"} 1\n"
                          "wb_requests_total{op=\"stats\",status=\"WB_OK\"} 1\n"
                          "# HELP wb_reclaims_total ",
                          strlen("wb_requests_total{op=\"invalid\",status=\"WB_EPROTO\"} 2\n"
                                 "wb_requests_total{op=\"acquire\",status=\"WB_OK\"} 3\n"
                                 "wb_requests_total{op=\"acquire\",status=\"WB_ENOTFOUND\"} 1\n"
                                 "wb_requests_total{op=\"stats\",status=\"WB_OK\"} 1\n"
                                 "# HELP wb_reclaims_total ")) == 0,
                  "%s", reqs);
    free(text);
}
END_TEST

START_TEST(test_render_empty_broker)
{
    char *text = render();
    ck_assert_int_eq(check_structure(text), 40);
    /* The build, as --version says it. */
    char line[256];
    snprintf(line, sizeof line,
             "wb_build_info{version=\"%s\",revision=\"%s\",protocol=\"%d\",backends=\"%s\"} 1",
             WB_VERSION, wb__build_rev(), WB_PROTOCOL_VERSION, wb__build_backends());
    assert_line(text, line);
    assert_line(text, "# TYPE wb_build_info gauge");
    assert_line(text, "wb_leases{state=\"active\"} 0");
    assert_line(text, "wb_models{state=\"ready\"} 0");
    assert_line(text, "wb_loads_total 0");
    ck_assert_ptr_null(strstr(text, "wb_requests_total{"));
    free(text);
}
END_TEST

/* A model on devices: bytes per ready copy, every copy with its device,
 * UUID and state, leases per copy (a fake two-device backend in host
 * memory, broker_fixture.h). */
START_TEST(test_device_labels)
{
    wb_model *m = fixture_twin_model(&B);
    m->data.copies[1].leases = 2;
    char *text = render();
    assert_line(text,
                "wb_model_bytes{model=\"twin\",version=\"1\",device=\"0\",backend=\"twin\"} 8");
    assert_line(text,
                "wb_model_bytes{model=\"twin\",version=\"1\",device=\"1\",backend=\"twin\"} 8");
    ck_assert_ptr_null(strstr(text, "wb_model_bytes{model=\"twin\",version=\"1\",device=\"2\""));
    assert_line(text, "wb_model_copies{model=\"twin\",version=\"1\",device=\"0\",uuid=\"" UUID0
                      "\",state=\"ready\"} 1");
    assert_line(text, "wb_model_copies{model=\"twin\",version=\"1\",device=\"2\",uuid=\"" UUID2
                      "\",state=\"failed\"} 1");
    assert_line(text, "wb_model_copy_leases{model=\"twin\",version=\"1\",device=\"1\"} 2");
    ck_assert_ptr_null(
        strstr(text, "wb_model_copy_leases{model=\"twin\",version=\"1\",device=\"2\""));
    free(text);
}
END_TEST

START_TEST(test_label_escaping)
{
    wb_model *m = fixture_model(&B, "plain");
    /* Names are validated on the way in; the page must stay well-formed
     * whatever a name holds. */
    free(m->name);
    m->name = strdup("we\"ird\\na\nme");
    char *text = render();
    check_structure(text);
    assert_line(text, "wb_load_seconds{model=\"we\\\"ird\\\\na\\nme\",version=\"1\"} 0");
    free(text);
}
END_TEST

START_TEST(test_request_counters_bounded)
{
    for (int op = 1; op <= 200; op++)
        wb__broker_count_request(&B, (uint32_t)op, WB_OK);
    ck_assert_uint_eq(B.stats.n_by_op, WB_REQUEST_COUNTERS);
    wb__broker_count_request(&B, 1, WB_OK);
    ck_assert_uint_eq(B.stats.by_op[0].n, 2);
    /* Field numbers that are not operations still render. */
    char *text = render();
    check_structure(text);
    assert_line(text, "wb_requests_total{op=\"unknown\",status=\"WB_OK\"} 1");
    free(text);
}
END_TEST

START_TEST(test_parse_addr)
{
    wb_err err;
    struct sockaddr_storage ss;
    socklen_t len;
    ck_assert_int_eq(wb__metrics_parse_addr("127.0.0.1:9464", &ss, &len, &err), WB_OK);
    ck_assert_int_eq(ss.ss_family, AF_INET);
    ck_assert_uint_eq(ntohs(((struct sockaddr_in *)&ss)->sin_port), 9464);
    ck_assert_int_eq(wb__metrics_parse_addr("[::1]:0", &ss, &len, &err), WB_OK);
    ck_assert_int_eq(ss.ss_family, AF_INET6);
    ck_assert_int_eq(wb__metrics_parse_addr("localhost:80", NULL, NULL, &err), WB_OK);

    ck_assert_int_eq(wb__metrics_parse_addr("9464", NULL, NULL, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "'9464' is not ADDR:PORT (for example 127.0.0.1:9464)");
    ck_assert_int_eq(wb__metrics_parse_addr(":9464", NULL, NULL, &err), WB_EINVAL);
    ck_assert_int_eq(wb__metrics_parse_addr("127.0.0.1:", NULL, NULL, &err), WB_EINVAL);
    ck_assert_int_eq(wb__metrics_parse_addr("127.0.0.1:65536", NULL, NULL, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "'127.0.0.1:65536': the port '65536' is not 0 to 65535");
    ck_assert_int_eq(wb__metrics_parse_addr("127.0.0.1:http", NULL, NULL, &err), WB_EINVAL);
    ck_assert_int_eq(wb__metrics_parse_addr("::1:80", NULL, NULL, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "'::1:80': write an IPv6 address in brackets, [ADDR]:PORT");
    ck_assert_int_eq(wb__metrics_parse_addr("[::1]80", NULL, NULL, &err), WB_EINVAL);
    ck_assert_int_eq(wb__metrics_parse_addr("no.such.host.invalid:80", NULL, NULL, &err),
                     WB_EINVAL);
    ck_assert_msg(strstr(err.msg, "cannot resolve 'no.such.host.invalid'") != NULL, "%s", err.msg);
}
END_TEST

#ifdef WB_HAVE_MICROHTTPD
/* One HTTP/1.0 exchange on 127.0.0.1:port; returns the whole response. */
static char *http(unsigned port, const char *request)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof sin), 0);
    ck_assert_int_eq(write(fd, request, strlen(request)), (ssize_t)strlen(request));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    ssize_t got;
    while ((got = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)got;
    close(fd);
    buf[len] = '\0';
    return buf;
}
#endif

/* The parsers of /proc/self/stat, statm and /proc/stat's btime. */
START_TEST(test_proc_parsers)
{
    wb_err err;
    wb_proc_self ps = {0};
    /* A command name with spaces and parentheses; utime 250, stime 150,
     * starttime 5000 ticks after boot. */
    static const char stat[] =
        "4242 (wb (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 3 0 5000 "
        "123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";
    ck_assert_int_eq(wb__metrics_parse_stat(stat, strlen(stat), 100, 1700000000, &ps, &err), WB_OK);
    ck_assert(ps.cpu_seconds == 4.0);
    ck_assert(ps.start_time_seconds == 1700000050.0);
    static const char *const bad_stat[] = {
        "4242 wb S 1\n",                                        /* no command name */
        "4242 (wb) S 1 4242 4242 0 -1 4194560 100 0 0 0 250\n", /* short */
        "4242 (wb) S 1 4242 4242 0 -1 4194560 100 0 0 0 2x0 150 0 0 20 0 3 0 5000\n",
        "",
    };
    for (size_t i = 0; i < sizeof bad_stat / sizeof bad_stat[0]; i++)
        ck_assert_int_eq(
            wb__metrics_parse_stat(bad_stat[i], strlen(bad_stat[i]), 100, 0, &ps, &err),
            WB_EFORMAT);
    ck_assert_int_eq(wb__metrics_parse_stat(stat, strlen(stat), 0, 0, &ps, &err), WB_EFORMAT);

    static const char statm[] = "30000 2000 500 100 0 9000 0\n";
    ck_assert_int_eq(wb__metrics_parse_statm(statm, strlen(statm), 4096, &ps, &err), WB_OK);
    ck_assert_uint_eq(ps.virtual_bytes, 30000ull * 4096);
    ck_assert_uint_eq(ps.resident_bytes, 2000ull * 4096);
    ck_assert_int_eq(wb__metrics_parse_statm("30000\n", 6, 4096, &ps, &err), WB_EFORMAT);
    ck_assert_int_eq(wb__metrics_parse_statm("x 1\n", 4, 4096, &ps, &err), WB_EFORMAT);

    static const char pstat[] = "cpu  1 2 3\ncpu0 1 2 3\nintr 5 0 0\nctxt 77\nbtime 1700000000\n"
                                "processes 9\n";
    uint64_t btime = 0;
    ck_assert_int_eq(wb__metrics_parse_btime(pstat, strlen(pstat), &btime, &err), WB_OK);
    ck_assert_uint_eq(btime, 1700000000);
    ck_assert_int_eq(wb__metrics_parse_btime("cpu 1\nbtimex 5\n", 15, &btime, &err), WB_EFORMAT);
    ck_assert_str_eq(err.msg, "no btime line in /proc/stat");
    ck_assert_int_eq(wb__metrics_parse_btime("btime x\n", 8, &btime, &err), WB_EFORMAT);
}
END_TEST

/* The value of the sample `name` (without labels) on the page. */
static double sample(const char *text, const char *name)
{
    char want[128];
    snprintf(want, sizeof want, "\n%s ", name);
    const char *p = strstr(text, want);
    ck_assert_msg(p != NULL, "no sample %s in:\n%s", name, text);
    return strtod(p + strlen(want), NULL);
}

/* The process families of this process, with plausible values. */
START_TEST(test_process_metrics)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    ck_assert_ptr_nonnull(f);
    wb__metrics_render_process(f, -1);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(check_structure(text), 6);
    assert_line(text, "# TYPE process_cpu_seconds_total counter");
    assert_line(text, "# TYPE process_start_time_seconds gauge");
    assert_line(text, "# TYPE process_resident_memory_bytes gauge");
    assert_line(text, "# TYPE process_virtual_memory_bytes gauge");
    assert_line(text, "# TYPE process_open_fds gauge");
    assert_line(text, "# TYPE process_max_fds gauge");
    double now = (double)time(NULL);
    double start = sample(text, "process_start_time_seconds");
    /* The test started (forked) a moment ago; boot time has 1 s steps. */
    ck_assert_msg(start <= now + 1 && start > now - 600, "start %f, now %f", start, now);
    ck_assert(sample(text, "process_cpu_seconds_total") >= 0);
    double rss = sample(text, "process_resident_memory_bytes");
    double vsz = sample(text, "process_virtual_memory_bytes");
    ck_assert(rss > 0 && vsz >= rss);
    /* stdin, stdout, stderr at least, and not the directory being read. */
    double fds = sample(text, "process_open_fds");
    int extra = open("/dev/null", O_RDONLY);
    ck_assert_int_ge(extra, 0);
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    ck_assert(sample(text, "process_max_fds") == (double)rl.rlim_cur);
    free(text);
    text = NULL;
    f = open_memstream(&text, &n);
    ck_assert_ptr_nonnull(f);
    wb__metrics_render_process(f, 12.5);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert(sample(text, "process_open_fds") == fds + 1);
    assert_line(text, "process_start_time_seconds 12.5");
    close(extra);
    ck_assert(fds >= 3);
    free(text);
}
END_TEST

START_TEST(test_http_server)
{
#ifndef WB_HAVE_MICROHTTPD
    wb_metrics *none;
    wb_err e;
    ck_assert_int_eq(wb__metrics_start("127.0.0.1:0", 0, NULL, &none, &e), WB_ENOSYS);
    return;
#else
    wb_metrics *m = NULL;
    wb_err err;
    ck_assert_msg(wb__metrics_start("127.0.0.1:0", 0, NULL, &m, &err) == WB_OK, "%s", err.msg);
    unsigned port = wb__metrics_port(m);
    ck_assert_uint_gt(port, 0);
    fixture_model(&B, "served");
    wb__metrics_tick(m, &B, 1);
    size_t len;
    char *page = wb__metrics_render(&B, &len);

    char *r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    ck_assert_msg(strncmp(r, "HTTP/1.1 200", 12) == 0 || strncmp(r, "HTTP/1.0 200", 12) == 0, "%s",
                  r);
    ck_assert_msg(strstr(r, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "%s", r);
    const char *body = strstr(r, "\r\n\r\n");
    ck_assert_ptr_nonnull(body);
    /* The published page, then the process families read at the scrape. */
    ck_assert_int_eq(strncmp(body + 4, page, len), 0);
    ck_assert_int_eq(strncmp(body + 4 + len, "# HELP process_cpu_seconds_total ",
                             strlen("# HELP process_cpu_seconds_total ")),
                     0);
    ck_assert_int_eq(check_structure(body + 4), 40 + 6);
    free(r);

    r = http(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
    ck_assert_msg(strstr(r, " 200 ") != NULL, "%s", r);
    ck_assert_str_eq(strstr(r, "\r\n\r\n") + 4, "");
    free(r);
    r = http(port, "GET /other HTTP/1.0\r\n\r\n");
    ck_assert_msg(strstr(r, " 404 ") != NULL, "%s", r);
    ck_assert_str_eq(strstr(r, "\r\n\r\n") + 4,
                     "not found; the metrics are at /metrics, the health check at /healthz\n");
    free(r);

    /* /healthz: 503 until the loop serves (a page published from the
     * broker's state before that, as at start, does not count), 200 while
     * it does, 503 once it stops. */
    r = http(port, "GET /healthz HTTP/1.0\r\n\r\n");
    ck_assert_msg(strstr(r, " 503 ") != NULL, "%s", r);
    ck_assert_str_eq(strstr(r, "\r\n\r\n") + 4, "starting: loading models\n");
    free(r);
    wb__metrics_serving(m, 1);
    r = http(port, "GET /healthz HTTP/1.0\r\n\r\n");
    ck_assert_msg(strstr(r, " 200 ") != NULL, "%s", r);
    ck_assert_msg(strstr(r, "Content-Type: text/plain; charset=utf-8\r\n"), "%s", r);
    ck_assert_str_eq(strstr(r, "\r\n\r\n") + 4, "ok\n");
    free(r);
    r = http(port, "HEAD /healthz HTTP/1.0\r\n\r\n");
    ck_assert_msg(strstr(r, " 200 ") != NULL, "%s", r);
    ck_assert_str_eq(strstr(r, "\r\n\r\n") + 4, "");
    free(r);
    r = http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
    ck_assert_msg(strstr(r, " 405 ") != NULL, "%s", r);
    ck_assert_msg(strstr(r, "Allow: GET, HEAD\r\n") != NULL, "%s", r);
    free(r);

    /* Changes are published no more often than every 20 ms, and an
     * unchanged broker is not rendered again at once. */
    fixture_model(&B, "later");
    wb__metrics_tick(m, &B, 0);
    char *snap = wb__metrics_snapshot(m, &len);
    ck_assert_str_eq(snap, page);
    free(snap);
    usleep(30 * 1000);
    wb__metrics_tick(m, &B, 1);
    snap = wb__metrics_snapshot(m, &len);
    ck_assert_ptr_nonnull(strstr(snap, "model=\"later\""));
    free(snap);
    free(page);

    /* A loop that stops publishing pages is reported, as is the stop. */
    char said[96];
    int64_t now = wb__clock_mono_ms();
    ck_assert_uint_eq(wb__metrics_health(m, now, said, sizeof said), 200);
    ck_assert_uint_eq(wb__metrics_health(m, now + WB_METRICS_STALL_MS + 1000, said, sizeof said),
                      503);
    ck_assert_msg(strncmp(said, "the event loop has not run for ", 31) == 0, "%s", said);
    wb__metrics_serving(m, 0);
    r = http(port, "GET /healthz HTTP/1.0\r\n\r\n");
    ck_assert_msg(strstr(r, " 503 ") != NULL, "%s", r);
    ck_assert_str_eq(strstr(r, "\r\n\r\n") + 4, "stopping\n");
    free(r);
    wb__metrics_serving(NULL, 1); /* NULL is fine */

    /* The same port again cannot be bound, and says why. */
    char spec[64];
    snprintf(spec, sizeof spec, "127.0.0.1:%u", port);
    wb_metrics *second = NULL;
    ck_assert_int_eq(wb__metrics_start(spec, 0, NULL, &second, &err), WB_EIO);
    ck_assert_ptr_null(second);
    char want[200];
    snprintf(want, sizeof want, "metrics: cannot listen on %s: Address already in use", spec);
    ck_assert_str_eq(err.msg, want);

    wb__metrics_stop(&m);
    ck_assert_ptr_null(m);
    wb__metrics_stop(&m); /* NULL is fine */
#endif
}
END_TEST

#ifdef WB_HAVE_MICROHTTPD
static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int connect_to(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof sin), 0);
    return fd;
}

/* Reads what the server sends for up to ms; 1 when it closed the
 * connection (end of stream or reset), else 0. With `trickle`, writes one
 * byte of a request's headers every 20 ms meanwhile. */
static int closed_within(int fd, int ms, int trickle)
{
    int64_t end = mono_ms() + ms;
    for (int64_t now; (now = mono_ms()) < end;) {
        if (trickle && send(fd, "X", 1, MSG_NOSIGNAL) < 0)
            return 1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(end - now);
        if (poll(&p, 1, trickle && left > 20 ? 20 : left) == 1) {
            char buf[4096];
            ssize_t got = read(fd, buf, sizeof buf);
            if (got <= 0)
                return 1;
        }
    }
    return 0;
}

/* Slack for a loaded machine or the sanitizer build. */
#define LATE_MS 1500

START_TEST(test_http_request_timeout)
{
    wb_metrics *m = NULL;
    wb_err err;
    ck_assert_msg(wb__metrics_start("127.0.0.1:0", 400, NULL, &m, &err) == WB_OK, "%s", err.msg);
    unsigned port = wb__metrics_port(m);

    /* Silent: the kernel hands it over after WB_METRICS_DEFER_ACCEPT_S,
     * then it has the timeout like any other. */
    int fd = connect_to(port);
    int64_t t0 = mono_ms();
    ck_assert_int_eq(closed_within(fd, 350, 0), 0);
    ck_assert_int_eq(closed_within(fd, WB_METRICS_DEFER_ACCEPT_S * 1000 + 50 + LATE_MS, 0), 1);
    ck_assert_int_ge(mono_ms() - t0, 400);
    close(fd);

    /* Trickling headers, a byte every 20 ms: closed at the timeout all the
     * same. */
    fd = connect_to(port);
    t0 = mono_ms();
    ck_assert_int_eq(write(fd, "GET /metrics HTTP/1.1\r\nX-Slow: ", 30), 30);
    ck_assert_int_eq(closed_within(fd, 350, 1), 0);
    ck_assert_int_eq(closed_within(fd, 50 + LATE_MS, 1), 1);
    ck_assert_int_ge(mono_ms() - t0, 400);
    close(fd);

    /* A request whose headers come in two parts, 150 ms apart, well within
     * the timeout, is answered. */
    fd = connect_to(port);
    ck_assert_int_eq(write(fd, "GET /metrics HTTP/1.0\r\n", 24), 24);
    usleep(150 * 1000);
    ck_assert_int_eq(write(fd, "\r\n", 2), 2);
    char buf[64] = "";
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 5000), 1);
    ck_assert_int_gt(read(fd, buf, sizeof buf - 1), 12);
    ck_assert_msg(strstr(buf, " 200 ") != NULL, "%s", buf);
    close(fd);

    wb__metrics_stop(&m);
    ck_assert_ptr_null(m);
}
END_TEST

/* Connections waiting for their request from one address: a newcomer
 * beyond the cap closes the longest-waiting, at once (a scrape from that
 * address counts until its request is read, and is served), and one up to
 * the cap closes none; at the stop, the server closes the rest. */
START_TEST(test_http_crowded)
{
    enum { CAP = WB_METRICS_MAX_WAITING_PER_ADDR };
    wb_metrics *m = NULL;
    wb_err err;
    ck_assert_msg(wb__metrics_start("127.0.0.1:0", 5000, NULL, &m, &err) == WB_OK, "%s", err.msg);
    unsigned port = wb__metrics_port(m);
    int fds[CAP + 2];
    for (int i = 0; i < CAP; i++) {
        fds[i] = connect_to(port);
        ck_assert_int_eq(write(fds[i], "GET", 3), 3);
        usleep(20 * 1000); /* accepted in this order */
    }
    for (int i = 0; i < CAP; i++)
        ck_assert_int_eq(closed_within(fds[i], 10, 0), 0);
    char *r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    ck_assert_msg(strncmp(r, "HTTP/1.0 200", 12) == 0 || strncmp(r, "HTTP/1.1 200", 12) == 0, "%s",
                  r);
    free(r);
    ck_assert_int_eq(closed_within(fds[0], LATE_MS, 0), 1);
    for (int i = 1; i < CAP; i++)
        ck_assert_int_eq(closed_within(fds[i], 10, 0), 0);

    /* Back to the cap, then one over it. */
    fds[CAP] = connect_to(port);
    ck_assert_int_eq(write(fds[CAP], "GET", 3), 3);
    ck_assert_int_eq(closed_within(fds[1], 100, 0), 0);
    fds[CAP + 1] = connect_to(port);
    ck_assert_int_eq(write(fds[CAP + 1], "GET", 3), 3);
    ck_assert_int_eq(closed_within(fds[1], LATE_MS, 0), 1);
    for (int i = 2; i <= CAP + 1; i++)
        ck_assert_int_eq(closed_within(fds[i], 10, 0), 0);

    wb__metrics_stop(&m);
    for (int i = 2; i <= CAP + 1; i++)
        ck_assert_int_eq(closed_within(fds[i], LATE_MS, 0), 1);
    for (int i = 0; i <= CAP + 1; i++)
        close(fds[i]);
}
END_TEST
#endif

int main(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("metrics");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_render_values);
    tcase_add_test(tc, test_render_empty_broker);
    tcase_add_test(tc, test_label_escaping);
    tcase_add_test(tc, test_device_labels);
    tcase_add_test(tc, test_request_counters_bounded);
    tcase_add_test(tc, test_parse_addr);
    tcase_add_test(tc, test_proc_parsers);
    tcase_add_test(tc, test_process_metrics);
    tcase_add_test(tc, test_http_server);
#ifdef WB_HAVE_MICROHTTPD
    tcase_add_test(tc, test_http_request_timeout);
    tcase_add_test(tc, test_http_crowded);
#endif
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
