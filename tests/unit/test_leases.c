/* The lease table and the broker's lease bookkeeping: grants, releases by
 * the owner and by others, heartbeats, the stale transition on an injected
 * clock (stale leases are never freed), reclaim on proven death, draining
 * models and their freeing at the last lease. */
#include "broker.h"
#include "broker_fixture.h"
#include "leases.h"
#include "text.h"

#include <check.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

/* A stand-in for pidfd_open that works for made-up pids: every peer gets a
 * fresh descriptor, and the calls are counted. */
static int fake_opens;
static int fake_pidfd(uint32_t pid, wb_err *err)
{
    (void)pid;
    (void)err;
    fake_opens++;
    return eventfd(0, EFD_CLOEXEC);
}

static int fd_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1 || errno != EBADF;
}

static struct wb_model *const MODEL_A = (struct wb_model *)0x1000;
static struct wb_model *const MODEL_B = (struct wb_model *)0x2000;

static void table(wb_lease_table *t)
{
    wb__leases_init(t);
    t->open_pidfd = fake_pidfd;
    fake_opens = 0;
}

START_TEST(test_grant_and_find)
{
    wb_lease_table t;
    table(&t);
    wb_err err;
    wb_peer_creds c = creds(1000, 100, 4242);
    wb_lease_rec *l1, *l2, *l3;
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, "worker", 10, 100.5, &l1, &err), WB_OK);
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_B, &c, "worker", 20, 101.5, &l2, &err), WB_OK);
    wb_peer_creds c2 = creds(1001, 100, 77);
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c2, "", 30, 102.5, &l3, &err), WB_OK);
    ck_assert_uint_eq(t.n_leases, 3);
    ck_assert_uint_eq(t.n_peers, 2);
    ck_assert_int_eq(fake_opens, 2); /* one pidfd per pid, not per lease */
    ck_assert_mem_ne(l1->id, l2->id, WB_LEASE_ID_LEN);
    ck_assert_ptr_eq(wb__leases_find(&t, l1->id), l1);
    ck_assert_ptr_eq(wb__leases_find(&t, l2->id), l2);
    ck_assert_ptr_eq(wb__leases_find(&t, l3->id), l3);
    ck_assert_ptr_eq(l1->model, MODEL_A);
    ck_assert_uint_eq(l1->pid, 4242);
    ck_assert_uint_eq(l1->uid, 1000);
    ck_assert_uint_eq(l1->gid, 100);
    ck_assert_str_eq(l1->comm, "worker");
    ck_assert_str_eq(l3->comm, "?");
    ck_assert_int_eq(l1->state, WBPROTO__LEASE_STATE__LEASE_ACTIVE);
    ck_assert_double_eq(l1->granted_at, 100.5);
    ck_assert_double_eq(l1->last_heartbeat, 100.5);
    ck_assert_int_eq(l1->last_beat_ms, 10);
    ck_assert_uint_eq(wb__leases_peer(&t, 4242)->leases, 2);
    ck_assert_uint_eq(wb__leases_peer(&t, 77)->leases, 1);
    ck_assert_ptr_null(wb__leases_peer(&t, 5));
    uint8_t unknown[WB_LEASE_ID_LEN] = {0};
    ck_assert_ptr_null(wb__leases_find(&t, unknown));
    /* The table stays sorted by id. */
    for (size_t i = 1; i < t.n_leases; i++)
        ck_assert_int_lt(memcmp(t.leases[i - 1]->id, t.leases[i]->id, WB_LEASE_ID_LEN), 0);

    char hex[33], s8[9];
    wb__text_hex(hex, sizeof hex, l1->id, WB_LEASE_ID_LEN);
    wb__lease_id_short(l1->id, s8);
    ck_assert_uint_eq(strlen(hex), 32);
    ck_assert_int_eq(strncmp(hex, s8, 8), 0);

    /* Unknown credentials get nothing. */
    wb_peer_creds none = {0};
    wb_lease_rec *l4 = (wb_lease_rec *)1;
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &none, "x", 0, 0, &l4, &err), WB_EPERM);
    ck_assert_ptr_null(l4);
    ck_assert_uint_eq(t.n_leases, 3);
    wb__leases_destroy(&t);
}
END_TEST

START_TEST(test_release)
{
    wb_lease_table t;
    table(&t);
    wb_err err;
    wb_peer_creds c = creds(1000, 100, 4242), other = creds(1000, 100, 4243);
    wb_lease_rec *l1, *l2;
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, "w", 0, 0, &l1, &err), WB_OK);
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_B, &c, "w", 0, 0, &l2, &err), WB_OK);
    int pidfd = wb__leases_peer(&t, 4242)->pidfd;
    uint8_t id1[WB_LEASE_ID_LEN], id2[WB_LEASE_ID_LEN];
    memcpy(id1, l1->id, sizeof id1);
    memcpy(id2, l2->id, sizeof id2);
    char s8[9];
    wb__lease_id_short(id1, s8);

    /* Another pid may not release it, even with the same uid. */
    struct wb_model *m = (struct wb_model *)1;
    ck_assert_int_eq(wb__leases_release(&t, &other, id1, &m, &err), WB_EPERM);
    char want[64];
    snprintf(want, sizeof want, "lease %s belongs to pid 4242", s8);
    ck_assert_str_eq(err.msg, want);
    ck_assert_ptr_null(m);
    ck_assert_uint_eq(t.n_leases, 2);

    /* Nor may the same pid under another uid (a set-user-ID exec, or a new
     * process on a reused pid). */
    wb_peer_creds nobody = creds(65534, 65534, 4242);
    ck_assert_int_eq(wb__leases_release(&t, &nobody, id1, &m, &err), WB_EPERM);
    snprintf(want, sizeof want, "lease %s belongs to pid 4242 (uid 1000)", s8);
    ck_assert_str_eq(err.msg, want);
    ck_assert_ptr_null(m);
    ck_assert_uint_eq(t.n_leases, 2);

    ck_assert_int_eq(wb__leases_release(&t, &c, id1, &m, &err), WB_OK);
    ck_assert_ptr_eq(m, MODEL_A);
    ck_assert_ptr_null(wb__leases_find(&t, id1));
    ck_assert_uint_eq(wb__leases_peer(&t, 4242)->leases, 1);
    ck_assert(fd_open(pidfd));

    /* Twice: unknown now. */
    ck_assert_int_eq(wb__leases_release(&t, &c, id1, &m, &err), WB_ENOTFOUND);
    snprintf(want, sizeof want, "no lease %s", s8);
    ck_assert_str_eq(err.msg, want);

    /* The last lease of a pid keeps the peer (pidfd and name) for the next
     * acquire: no second pidfd_open. */
    ck_assert_int_eq(wb__leases_release(&t, &c, id2, &m, &err), WB_OK);
    ck_assert_ptr_eq(m, MODEL_B);
    ck_assert_ptr_nonnull(wb__leases_peer(&t, 4242));
    ck_assert_uint_eq(wb__leases_peer(&t, 4242)->leases, 0);
    ck_assert_uint_eq(t.n_peers, 1);
    ck_assert_uint_eq(t.n_holders, 0);
    ck_assert(fd_open(pidfd));
    int opens = fake_opens;
    wb_lease_rec *again;
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, NULL, 0, 0, &again, &err), WB_OK);
    ck_assert_int_eq(fake_opens, opens);
    ck_assert_str_eq(again->comm, "w"); /* the name read at the first grant */
    ck_assert_uint_eq(t.n_holders, 1);
    ck_assert_int_eq(wb__leases_release(&t, &c, again->id, &m, &err), WB_OK);
    /* Its death forgets it and closes the pidfd. */
    ck_assert_uint_eq(wb__leases_reclaim_pid(&t, 4242, NULL, NULL), 0);
    ck_assert_ptr_null(wb__leases_peer(&t, 4242));
    ck_assert_uint_eq(t.n_peers, 0);
    ck_assert(!fd_open(pidfd));
    wb__leases_destroy(&t);
}
END_TEST

/* Peers without leases are kept up to WB_IDLE_PEERS_MAX; past that, a peer
 * whose last lease ends is closed at once. */
START_TEST(test_idle_peers_capped)
{
    wb_lease_table t;
    table(&t);
    wb_err err;
    wb_lease_rec *l;
    struct wb_model *m;
    for (uint32_t pid = 1; pid <= WB_IDLE_PEERS_MAX + 5; pid++) {
        wb_peer_creds c = creds(1, 1, pid);
        ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, "x", 0, 0, &l, &err), WB_OK);
        ck_assert_int_eq(wb__leases_release(&t, &c, l->id, &m, &err), WB_OK);
    }
    ck_assert_uint_eq(t.n_peers, WB_IDLE_PEERS_MAX);
    ck_assert_uint_eq(t.n_holders, 0);
    ck_assert_ptr_null(wb__leases_peer(&t, WB_IDLE_PEERS_MAX + 5));
    wb__leases_destroy(&t);
}
END_TEST

START_TEST(test_heartbeat)
{
    wb_lease_table t;
    table(&t);
    wb_err err;
    wb_peer_creds c = creds(1000, 100, 10);
    wb_lease_rec *l;
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, "w", 100, 5.0, &l, &err), WB_OK);
    int revived = 7;
    ck_assert_int_eq(wb__leases_heartbeat(&t, &c, l->id, 3, 600, 5.5, &revived), WB_OK);
    ck_assert_int_eq(revived, 0);
    ck_assert_uint_eq(l->containers, 3);
    ck_assert_int_eq(l->last_beat_ms, 600);
    ck_assert_double_eq(l->last_heartbeat, 5.5);
    ck_assert_double_eq(l->granted_at, 5.0);

    /* Another pid's heartbeat for this lease changes nothing. */
    wb_peer_creds other = creds(1000, 100, 11), nobody = creds(65534, 65534, 10);
    ck_assert_int_eq(wb__leases_heartbeat(&t, &other, l->id, 9, 700, 6.0, &revived), WB_ENOTFOUND);
    ck_assert_uint_eq(l->containers, 3);
    ck_assert_int_eq(l->last_beat_ms, 600);
    /* Nor does one from the same pid under another uid. */
    ck_assert_int_eq(wb__leases_heartbeat(&t, &nobody, l->id, 9, 700, 6.0, &revived), WB_ENOTFOUND);
    ck_assert_uint_eq(l->containers, 3);
    uint8_t unknown[WB_LEASE_ID_LEN] = {1};
    ck_assert_int_eq(wb__leases_heartbeat(&t, &c, unknown, 1, 700, 6.0, &revived), WB_ENOTFOUND);
    wb__leases_destroy(&t);
}
END_TEST

static int stale_calls;
static void count_cb(wb_lease_rec *l, void *ctx)
{
    (void)l;
    (void)ctx;
    stale_calls++;
}

START_TEST(test_stale_transition)
{
    wb_lease_table t;
    table(&t);
    wb_err err;
    wb_peer_creds c = creds(1000, 100, 10);
    wb_lease_rec *a, *b;
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, "w", 0, 0, &a, &err), WB_OK);
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, "w", 2000, 0, &b, &err), WB_OK);
    stale_calls = 0;
    /* Exactly stale_ms of silence is still fine; one more millisecond is not. */
    ck_assert_uint_eq(wb__leases_mark_stale(&t, 5000, 5000, count_cb, NULL), 0);
    ck_assert_uint_eq(wb__leases_mark_stale(&t, 5001, 5000, count_cb, NULL), 1);
    ck_assert_int_eq(stale_calls, 1);
    ck_assert_int_eq(a->state, WBPROTO__LEASE_STATE__LEASE_STALE);
    ck_assert_int_eq(b->state, WBPROTO__LEASE_STATE__LEASE_ACTIVE);
    /* Reported once, not at every scan. */
    ck_assert_uint_eq(wb__leases_mark_stale(&t, 6000, 5000, count_cb, NULL), 0);
    ck_assert_int_eq(stale_calls, 1);
    ck_assert_uint_eq(wb__leases_count_state(&t, WBPROTO__LEASE_STATE__LEASE_STALE), 1);
    ck_assert_uint_eq(wb__leases_count_state(&t, WBPROTO__LEASE_STATE__LEASE_ACTIVE), 1);

    /* Much later, still held: stale leases are never freed. */
    ck_assert_uint_eq(wb__leases_mark_stale(&t, 10000000, 5000, count_cb, NULL), 1);
    ck_assert_uint_eq(t.n_leases, 2);
    ck_assert_ptr_eq(wb__leases_find(&t, a->id), a);

    /* A heartbeat brings a stale lease back. */
    int revived;
    ck_assert_int_eq(wb__leases_heartbeat(&t, &c, a->id, 1, 10000001, 0, &revived), WB_OK);
    ck_assert_int_eq(revived, 1);
    ck_assert_int_eq(a->state, WBPROTO__LEASE_STATE__LEASE_ACTIVE);
    ck_assert_int_eq(wb__leases_heartbeat(&t, &c, a->id, 1, 10000002, 0, &revived), WB_OK);
    ck_assert_int_eq(revived, 0);
    wb__leases_destroy(&t);
}
END_TEST

static void collect_cb(wb_lease_rec *l, void *ctx)
{
    uint32_t *pids = ctx;
    pids[stale_calls++] = l->pid;
}

START_TEST(test_reclaim_pid)
{
    wb_lease_table t;
    table(&t);
    wb_err err;
    wb_peer_creds a = creds(1, 1, 100), b = creds(1, 1, 200);
    wb_lease_rec *l;
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &a, "a", 0, 0, &l, &err), WB_OK);
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_B, &b, "b", 0, 0, &l, &err), WB_OK);
    int fd_a = wb__leases_peer(&t, 100)->pidfd;
    uint32_t pids[8] = {0};
    stale_calls = 0;
    ck_assert_uint_eq(wb__leases_reclaim_pid(&t, 100, collect_cb, pids), 3);
    ck_assert_int_eq(stale_calls, 3);
    ck_assert_uint_eq(pids[0], 100);
    ck_assert_uint_eq(pids[2], 100);
    ck_assert_uint_eq(t.n_leases, 1);
    ck_assert_ptr_eq(wb__leases_find(&t, l->id), l);
    ck_assert_ptr_null(wb__leases_peer(&t, 100));
    ck_assert(!fd_open(fd_a));
    ck_assert_uint_eq(wb__leases_reclaim_pid(&t, 100, NULL, NULL), 0);
    wb__leases_destroy(&t);
}
END_TEST

START_TEST(test_dead_pid_refused)
{
    wb_lease_table t;
    wb__leases_init(&t); /* the real pidfd_open */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(0);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    wb_peer_creds c = creds(1, 1, (uint32_t)pid);
    wb_lease_rec *l;
    wb_err err;
    ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, "gone", 0, 0, &l, &err), WB_EPERM);
    ck_assert_ptr_nonnull(strstr(err.msg, "exited before its lease was granted"));
    ck_assert_uint_eq(t.n_leases, 0);
    ck_assert_uint_eq(t.n_peers, 0);
    wb__leases_destroy(&t);
}
END_TEST

START_TEST(test_many_leases)
{
    wb_lease_table t;
    table(&t);
    wb_err err;
    enum { N = 2000 };
    static uint8_t ids[N][WB_LEASE_ID_LEN];
    for (int i = 0; i < N; i++) {
        wb_peer_creds c = creds(1, 1, (uint32_t)(1 + i % 37));
        wb_lease_rec *l;
        ck_assert_int_eq(wb__leases_grant(&t, MODEL_A, &c, "w", 0, 0, &l, &err), WB_OK);
        memcpy(ids[i], l->id, WB_LEASE_ID_LEN);
    }
    ck_assert_uint_eq(t.n_peers, 37);
    for (int i = 0; i < N; i++)
        ck_assert_ptr_nonnull(wb__leases_find(&t, ids[i]));
    /* Release every other one, by its owner. */
    for (int i = 0; i < N; i += 2) {
        struct wb_model *m;
        wb_peer_creds c = creds(1, 1, (uint32_t)(1 + i % 37));
        ck_assert_int_eq(wb__leases_release(&t, &c, ids[i], &m, &err), WB_OK);
    }
    ck_assert_uint_eq(t.n_leases, N / 2);
    for (int i = 0; i < N; i++)
        ck_assert((wb__leases_find(&t, ids[i]) != NULL) == (i % 2 == 1));
    wb__leases_destroy(&t);
    ck_assert_uint_eq(t.n_leases, 0);
}
END_TEST

/* The broker's bookkeeping on top of the table. */

START_TEST(test_broker_draining_frees_at_last_release)
{
    wb_broker b;
    fixture_broker(&b, 1000, 5000);
    b.leases.open_pidfd = fake_pidfd;
    wb_model *m = fixture_model(&b, "demo");
    char name[WB_SHM_NAME_MAX];
    strcpy(name, m->data.slabs[0].shm.name);
    wb_err err;
    wb_peer_creds c = creds(1, 1, 50);
    wb_lease_rec *l1, *l2;
    ck_assert_int_eq(wb__leases_grant(&b.leases, m, &c, "w", 0, 0, &l1, &err), WB_OK);
    m->leases++;
    ck_assert_int_eq(wb__leases_grant(&b.leases, m, &c, "w", 0, 0, &l2, &err), WB_OK);
    m->leases++;

    /* A ready model stays when its leases end. */
    struct wb_model *got;
    uint8_t id[WB_LEASE_ID_LEN];
    memcpy(id, l1->id, sizeof id);
    ck_assert_int_eq(wb__leases_release(&b.leases, &c, id, &got, &err), WB_OK);
    ck_assert_int_eq(wb__broker_lease_ended(&b, got, 0), WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_uint_eq(m->leases, 1);

    m->state = WBPROTO__MODEL_STATE__MODEL_DRAINING;
    memcpy(id, l2->id, sizeof id);
    ck_assert(shm_name_exists(name));
    ck_assert_int_eq(wb__leases_release(&b.leases, &c, id, &got, &err), WB_OK);
    ck_assert_int_eq(wb__broker_lease_ended(&b, got, 0), WBPROTO__MODEL_STATE__MODEL_FREED);
    ck_assert_ptr_null(wb__models_find(&b.models, "demo"));
    ck_assert_uint_eq(b.models.n, 0);
    ck_assert(!shm_name_exists(name));
    wb__broker_destroy(&b);
}
END_TEST

START_TEST(test_broker_reclaim_on_death)
{
    wb_broker b;
    fixture_broker(&b, 1000, 5000);
    wb_model *keep = fixture_model(&b, "keep");
    wb_model *drain = fixture_model(&b, "drain");
    char drain_name[WB_SHM_NAME_MAX];
    strcpy(drain_name, drain->data.slabs[0].shm.name);

    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        pause();
        _exit(0);
    }
    wb_err err;
    wb_peer_creds c = creds(1, 1, (uint32_t)pid);
    wb_lease_rec *l;
    ck_assert_int_eq(wb__leases_grant(&b.leases, keep, &c, "child", 0, 0, &l, &err), WB_OK);
    keep->leases++;
    ck_assert_int_eq(wb__leases_grant(&b.leases, drain, &c, "child", 0, 0, &l, &err), WB_OK);
    drain->leases++;
    drain->state = WBPROTO__MODEL_STATE__MODEL_DRAINING;

    /* The pidfd says when the process is gone; then everything it held is
     * reclaimed at once. */
    int fd = wb__leases_peer(&b.leases, (uint32_t)pid)->pidfd;
    ck_assert_int_ge(fd, 0);
    kill(pid, SIGKILL);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 10000), 1);
    ck_assert_uint_eq(wb__broker_reclaim_pid(&b, (uint32_t)pid), 2);
    waitpid(pid, NULL, 0);
    ck_assert_uint_eq(b.stats.leases_reclaimed, 2);
    ck_assert_uint_eq(b.leases.n_leases, 0);
    ck_assert_uint_eq(b.leases.n_peers, 0);
    ck_assert_uint_eq(keep->leases, 0);
    ck_assert_int_eq(keep->state, WBPROTO__MODEL_STATE__MODEL_READY);
    ck_assert_ptr_null(wb__models_find(&b.models, "drain"));
    ck_assert(!shm_name_exists(drain_name));
    wb__broker_destroy(&b);
}
END_TEST

START_TEST(test_broker_stale_scan_uses_clock)
{
    wb_broker b;
    fixture_broker(&b, 100, 500);
    b.leases.open_pidfd = fake_pidfd;
    wb_model *m = fixture_model(&b, "demo");
    wb_err err;
    wb_peer_creds c = creds(1, 1, 60);
    wb_lease_rec *l;
    ck_assert_int_eq(wb__leases_grant(&b.leases, m, &c, "w", b.now_ms(), b.now_wall(), &l, &err),
                     WB_OK);
    m->leases++;
    advance_ms(500);
    ck_assert_uint_eq(wb__broker_scan_stale(&b), 0);
    advance_ms(1);
    ck_assert_uint_eq(wb__broker_scan_stale(&b), 1);
    ck_assert_int_eq(l->state, WBPROTO__LEASE_STATE__LEASE_STALE);
    advance_ms(3600 * 1000);
    ck_assert_uint_eq(wb__broker_scan_stale(&b), 0);
    ck_assert_uint_eq(b.leases.n_leases, 1);
    ck_assert_uint_eq(m->leases, 1);
    wb__broker_destroy(&b);
}
END_TEST

/* With more peers than the base interval allows at the rate, the interval
 * and the stale window stretch by the same whole factor; when they shrink
 * again, silences are judged by the old window until every peer had time
 * to hear the new interval. */
START_TEST(test_broker_heartbeat_pace)
{
    wb_broker b;
    fixture_broker(&b, 100, 500);
    b.cfg.max_heartbeat_rate = 10; /* heartbeats a second, all peers */
    b.leases.open_pidfd = fake_pidfd;
    ck_assert_uint_eq(b.pace.interval_ms, 100);
    ck_assert_uint_eq(b.pace.stale_ms, 500);
    wb__broker_pace_heartbeats(&b, 1, b.now_ms());
    ck_assert_uint_eq(b.pace.interval_ms, 100);
    wb__broker_pace_heartbeats(&b, 5, b.now_ms());
    ck_assert_uint_eq(b.pace.interval_ms, 500);
    ck_assert_uint_eq(b.pace.stale_ms, 2500);
    wb__broker_pace_heartbeats(&b, 41, b.now_ms()); /* 4,100 ms */
    ck_assert_uint_eq(b.pace.interval_ms, 4100);
    ck_assert_uint_eq(b.pace.stale_ms, 20500);
    wb__broker_pace_heartbeats(&b, 42, b.now_ms()); /* 4,200 ms */
    ck_assert_uint_eq(b.pace.interval_ms, 4200);
    ck_assert_uint_eq(b.pace.stale_ms, 21000);
    wb__broker_pace_heartbeats(&b, 5, b.now_ms());
    ck_assert_uint_eq(b.pace.interval_ms, 500);

    wb_model *m = fixture_model(&b, "demo");
    wb_err err;
    wb_peer_creds c = creds(1, 1, 60);
    wb_lease_rec *l;
    ck_assert_int_eq(wb__leases_grant(&b.leases, m, &c, "w", b.now_ms(), b.now_wall(), &l, &err),
                     WB_OK);
    m->leases++;
    /* Silent for 3 s: beyond the new window (2.5 s), within the old one. */
    advance_ms(3000);
    ck_assert_uint_eq(wb__broker_scan_stale(&b), 0);
    /* Once the old window has passed since the shrink, the new one rules. */
    advance_ms(18001); /* 21,001 ms after the shrink */
    ck_assert_uint_eq(wb__broker_scan_stale(&b), 1);
    ck_assert_int_eq(l->state, WBPROTO__LEASE_STATE__LEASE_STALE);
    /* Unbounded rates stay at the base. */
    b.cfg.max_heartbeat_rate = 1000000;
    wb__broker_pace_heartbeats(&b, 4096, b.now_ms());
    ck_assert_uint_eq(b.pace.interval_ms, 100);
    wb__broker_destroy(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("leases");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_grant_and_find);
    tcase_add_test(tc, test_release);
    tcase_add_test(tc, test_idle_peers_capped);
    tcase_add_test(tc, test_heartbeat);
    tcase_add_test(tc, test_stale_transition);
    tcase_add_test(tc, test_reclaim_pid);
    tcase_add_test(tc, test_dead_pid_refused);
    tcase_add_test(tc, test_many_leases);
    suite_add_tcase(s, tc);
    TCase *tb = tcase_create("broker");
    tcase_add_test(tb, test_broker_draining_frees_at_last_release);
    tcase_add_test(tb, test_broker_reclaim_on_death);
    tcase_add_test(tb, test_broker_stale_scan_uses_clock);
    tcase_add_test(tb, test_broker_heartbeat_pace);
    suite_add_tcase(s, tb);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
