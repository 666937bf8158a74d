/* The metrics endpoint's connection rules, without sockets: a connection is
 * cut once its request timeout passes, however it is counted (waiting or
 * in a request), and a new deadline starts with each response; while more
 * connections wait than a cap allows, from one address or from all, the
 * longest-waiting are cut, in that order, and the newest kept, never one
 * accepted since the last sweep; each connection is cut once; the sweep
 * says when the next deadline is. */
#include "connguard.h"

#include <check.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

/* What the sweep cut, in order. */
static int cut_fd[64];
static wb_cut_reason cut_why[64];
static int n_cut;

static void record(void *cls, int fd, wb_cut_reason why)
{
    ck_assert_ptr_eq(cls, &n_cut);
    ck_assert_int_lt(n_cut, 64);
    cut_fd[n_cut] = fd;
    cut_why[n_cut] = why;
    n_cut++;
}

static long sweep(wb_connguard *g, int64_t now)
{
    n_cut = 0;
    return wb__connguard_sweep(g, now, record, &n_cut);
}

static struct sockaddr_in v4(const char *ip, unsigned port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    ck_assert_int_eq(inet_pton(AF_INET, ip, &sin.sin_addr), 1);
    return sin;
}

static wb_guarded *add(wb_connguard *g, int fd, const char *ip, int64_t now)
{
    struct sockaddr_in sin = v4(ip, 40000 + (unsigned)fd); /* ports differ */
    wb_guarded *c = wb__connguard_add(g, fd, (struct sockaddr *)&sin, now);
    ck_assert_ptr_nonnull(c);
    return c;
}

START_TEST(test_timeout)
{
    wb_connguard g;
    wb__connguard_init(&g, 2000, 8, 32);
    ck_assert_int_eq(sweep(&g, 0), -1); /* nothing tracked */
    wb_guarded *a = add(&g, 10, "127.0.0.1", 1000);
    wb_guarded *b = add(&g, 11, "127.0.0.1", 1500);
    ck_assert_uint_eq(g.n, 2);
    ck_assert_uint_eq(g.n_waiting, 2);
    ck_assert_int_eq(sweep(&g, 1200), 1800);
    ck_assert_int_eq(n_cut, 0);

    /* The headers of b's request are in: it no longer waits, but its
     * deadline runs on until the response is sent. */
    wb__connguard_request(&g, b);
    ck_assert_uint_eq(g.n_waiting, 1);
    /* a trickles: bytes change nothing, 2000 ms after its accept it goes. */
    ck_assert_int_eq(sweep(&g, 2999), 1);
    ck_assert_int_eq(sweep(&g, 3000), 500);
    ck_assert_int_eq(n_cut, 1);
    ck_assert_int_eq(cut_fd[0], 10);
    ck_assert_int_eq(cut_why[0], WB_CUT_TIMEOUT);
    ck_assert_uint_eq(g.n_waiting, 0);
    ck_assert_uint_eq(g.n, 2); /* until its close is seen */
    /* Cut once only, and a response for it changes nothing. */
    wb__connguard_done(&g, a, 3100);
    ck_assert_int_eq(sweep(&g, 3200), 300);
    ck_assert_int_eq(n_cut, 0);
    wb__connguard_remove(&g, &a);
    ck_assert_ptr_null(a);
    ck_assert_uint_eq(g.n, 1);

    /* b's response went out: it waits for the next request, with a new
     * deadline, and is kept alive between requests only that long. */
    wb__connguard_done(&g, b, 3400);
    ck_assert_uint_eq(g.n_waiting, 1);
    ck_assert_int_eq(sweep(&g, 3500), 1900);
    wb__connguard_request(&g, b);
    wb__connguard_done(&g, b, 5000);
    ck_assert_int_eq(sweep(&g, 5399), 1601);
    ck_assert_int_eq(n_cut, 0);
    ck_assert_int_eq(sweep(&g, 7000), -1);
    ck_assert_int_eq(n_cut, 1);
    ck_assert_int_eq(cut_fd[0], 11);
    ck_assert_uint_eq(g.cut[WB_CUT_TIMEOUT], 2);
    ck_assert_uint_eq(g.cut[WB_CUT_CROWDED], 0);
    wb__connguard_remove(&g, &b);
    wb__connguard_remove(&g, &b); /* NULL is fine */
    ck_assert_uint_eq(g.n, 0);
    ck_assert_uint_eq(g.n_waiting, 0);
    ck_assert_ptr_null(g.head);
    ck_assert_ptr_null(g.tail);
    wb__connguard_destroy(&g);
}
END_TEST

/* Deadlines stay in order when a response moves a connection to the end:
 * the walk stops at the first deadline ahead, and misses none. */
START_TEST(test_timeout_order)
{
    wb_connguard g;
    wb__connguard_init(&g, 1000, 8, 32);
    wb_guarded *a = add(&g, 1, "10.0.0.1", 0);
    add(&g, 2, "10.0.0.2", 100);
    add(&g, 3, "10.0.0.3", 200);
    wb__connguard_request(&g, a);
    wb__connguard_done(&g, a, 250); /* now the last deadline: 1250 */
    ck_assert_int_eq(sweep(&g, 1000), 100);
    ck_assert_int_eq(n_cut, 0);
    ck_assert_int_eq(sweep(&g, 1200), 50);
    ck_assert_int_eq(n_cut, 2);
    ck_assert_int_eq(cut_fd[0], 2);
    ck_assert_int_eq(cut_fd[1], 3);
    ck_assert_int_eq(sweep(&g, 1250), -1);
    ck_assert_int_eq(n_cut, 1);
    ck_assert_int_eq(cut_fd[0], 1);
    wb__connguard_destroy(&g);
    ck_assert_uint_eq(g.n, 0);
}
END_TEST

/* One address with more waiting connections than its cap keeps the newest;
 * those in a request are not counted, nor are other addresses'. */
START_TEST(test_crowded_address)
{
    wb_connguard g;
    wb__connguard_init(&g, 2000, 3, 32);
    wb_guarded *c[6];
    for (int i = 0; i < 6; i++)
        c[i] = add(&g, 20 + i, "127.0.0.1", 100 + i);
    wb__connguard_request(&g, c[4]); /* a scrape being answered */
    add(&g, 30, "127.0.0.2", 106);
    add(&g, 31, "127.0.0.2", 107);
    struct sockaddr_in6 six = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    ck_assert_ptr_nonnull(wb__connguard_add(&g, 40, (struct sockaddr *)&six, 108));
    ck_assert_uint_eq(g.n_waiting, 8);
    /* All were accepted since the last sweep: none goes yet. */
    ck_assert_int_eq(sweep(&g, 150), 1950);
    ck_assert_int_eq(n_cut, 0);
    /* 127.0.0.1 waits on 20, 21, 22, 23, 25: 20 and 21 go, oldest last. */
    ck_assert_int_eq(sweep(&g, 200), 1902);
    ck_assert_int_eq(n_cut, 2);
    ck_assert_int_eq(cut_fd[0], 21);
    ck_assert_int_eq(cut_fd[1], 20);
    ck_assert_int_eq(cut_why[0], WB_CUT_CROWDED);
    ck_assert_int_eq(cut_why[1], WB_CUT_CROWDED);
    ck_assert_uint_eq(g.n_waiting, 6);
    ck_assert_uint_eq(g.cut[WB_CUT_CROWDED], 2);
    /* At the cap now: nothing more. */
    ck_assert_int_eq(sweep(&g, 201), 1901);
    ck_assert_int_eq(n_cut, 0);
    /* A newcomer, counted at once, pushes out the longest-waiting of its
     * address. */
    add(&g, 26, "127.0.0.1", 300);
    sweep(&g, 300);
    ck_assert_int_eq(n_cut, 1);
    ck_assert_int_eq(cut_fd[0], 22);
    wb__connguard_destroy(&g);
}
END_TEST

/* More waiting connections than the cap for all: the longest-waiting go,
 * whatever their address, and connections in a request stay. */
START_TEST(test_crowded_total)
{
    wb_connguard g;
    wb__connguard_init(&g, 2000, 8, 4);
    char ip[32];
    wb_guarded *c[7];
    for (int i = 0; i < 7; i++) {
        snprintf(ip, sizeof ip, "192.0.2.%d", i + 1);
        c[i] = add(&g, 50 + i, ip, 10 * i);
    }
    wb__connguard_request(&g, c[0]);
    ck_assert_int_eq(sweep(&g, 99), 1901);
    ck_assert_int_eq(n_cut, 0);
    ck_assert_int_eq(sweep(&g, 100), 1900);
    ck_assert_int_eq(n_cut, 2);
    ck_assert_int_eq(cut_fd[0], 51);
    ck_assert_int_eq(cut_fd[1], 52);
    ck_assert_uint_eq(g.n_waiting, 4);
    /* Closed ones are forgotten; a cut one that closes changes no count. */
    wb__connguard_remove(&g, &c[1]);
    wb__connguard_remove(&g, &c[3]);
    ck_assert_uint_eq(g.n_waiting, 3);
    ck_assert_uint_eq(g.n, 5);
    ck_assert_int_eq(sweep(&g, 100), 1900);
    ck_assert_int_eq(n_cut, 0);
    wb__connguard_destroy(&g);
}
END_TEST

/* A burst from one address, accepted in one round with a scraper among
 * it: the older waiting connections go at once, the burst only after a
 * round, by which time the scraper's request is in and it stays. */
START_TEST(test_crowded_burst)
{
    wb_connguard g;
    wb__connguard_init(&g, 2000, 3, 32);
    for (int i = 0; i < 3; i++)
        add(&g, 1 + i, "127.0.0.1", i);
    sweep(&g, 10);
    ck_assert_int_eq(n_cut, 0);
    wb_guarded *scraper = add(&g, 10, "127.0.0.1", 20);
    for (int i = 0; i < 4; i++)
        add(&g, 11 + i, "127.0.0.1", 20);
    sweep(&g, 20);
    ck_assert_int_eq(n_cut, 3);
    ck_assert_int_eq(cut_fd[0], 3);
    ck_assert_int_eq(cut_fd[1], 2);
    ck_assert_int_eq(cut_fd[2], 1);
    ck_assert_uint_eq(g.n_waiting, 5);
    wb__connguard_request(&g, scraper);
    sweep(&g, 21);
    ck_assert_int_eq(n_cut, 1);
    ck_assert_int_eq(cut_fd[0], 11);
    ck_assert_uint_eq(g.n_waiting, 3);
    ck_assert_uint_eq(g.cut[WB_CUT_CROWDED], 4);
    wb__connguard_destroy(&g);
}
END_TEST

/* A connection whose address is neither IPv4 nor IPv6 (or unknown) counts
 * as one address with the others like it. */
START_TEST(test_other_family)
{
    wb_connguard g;
    wb__connguard_init(&g, 2000, 1, 32);
    ck_assert_ptr_nonnull(wb__connguard_add(&g, 1, NULL, 0));
    struct sockaddr sa = {.sa_family = AF_UNIX};
    ck_assert_ptr_nonnull(wb__connguard_add(&g, 2, &sa, 1));
    sweep(&g, 2);
    ck_assert_int_eq(n_cut, 0);
    sweep(&g, 3);
    ck_assert_int_eq(n_cut, 1);
    ck_assert_int_eq(cut_fd[0], 1);
    wb__connguard_destroy(&g);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("connguard");
    TCase *tc = tcase_create("connguard");
    tcase_add_test(tc, test_timeout);
    tcase_add_test(tc, test_timeout_order);
    tcase_add_test(tc, test_crowded_address);
    tcase_add_test(tc, test_crowded_total);
    tcase_add_test(tc, test_crowded_burst);
    tcase_add_test(tc, test_other_family);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
