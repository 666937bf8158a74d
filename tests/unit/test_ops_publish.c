/* Publishes (publish.c, ops_publish.c, publish_copy.c) without sockets, the
 * copy inline (no loader thread): the begin's checks (rights, the table
 * against the current version's, --max-versions, the fits check), the
 * commit's placements, a full and a partial publish copied from memfds and
 * checksummed (inline, or on a checker whose jobs the test runs), and the ends of a publish without
 * commit (abort, connection closed, process dead, unload). */
#include "broker_fixture.h"
#include "ops.h"
#include "publish.h"
#include "wire.h"

#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

static void unused_fixture(void) __attribute__((unused));
static void unused_fixture(void)
{
    advance_ms(0);
    (void)shm_name_exists;
    (void)fixture_model;
}

static broker_fixture F;

static void setup(void)
{
    fixture_open(&F, "publish");
}

static void teardown(void)
{
    fixture_close(&F);
}

/* A checkpoint of two 8-byte U8 tensors "v" and "w" of bytes `seed`. */
static const char *write_model(const char *file, uint8_t seed)
{
    static const char *const vw[] = {"v", "w"};
    return fixture_u8_checkpoint(&F, file, vw, 2, seed);
}

static Wbproto__Reply *call_as(const wb_peer_creds *p, uint64_t serial, Wbproto__Request *req)
{
    return fixture_send_on(&F, p, serial, req);
}

/* A begin of `names` (U8 [n] each, n = dims), from peer p on connection 1. */
static Wbproto__Reply *begin_as(const wb_peer_creds *p, const char *model, const char *const *names,
                                const uint64_t *dims, size_t n, int partial)
{
    Wbproto__PublishTensor t[4], *tp[4];
    uint64_t shapes[4];
    for (size_t i = 0; i < n; i++) {
        wbproto__publish_tensor__init(&t[i]);
        t[i].name = (char *)names[i];
        t[i].dtype = (char *)"U8";
        shapes[i] = dims[i];
        t[i].n_shape = 1;
        t[i].shape = &shapes[i];
        t[i].nbytes = dims[i];
        tp[i] = &t[i];
    }
    Wbproto__PublishBeginRequest b = WBPROTO__PUBLISH_BEGIN_REQUEST__INIT;
    b.model = (char *)model;
    b.n_tensors = n;
    b.tensors = tp;
    b.partial = partial;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_PUBLISH_BEGIN;
    req.publish_begin = &b;
    return call_as(p, 1, &req);
}

static Wbproto__Reply *begin(const char *const *names, const uint64_t *dims, size_t n, int partial)
{
    wb_peer_creds p = me();
    return begin_as(&p, "demo", names, dims, n, partial);
}

/* A memfd of `len` bytes of `fill`, given to publish `id`. */
static void send_memfd(const uint8_t *id, size_t len, uint8_t fill)
{
    int fd = memfd_create("publish", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    uint8_t buf[64];
    memset(buf, fill, sizeof buf);
    ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
    wb_peer_creds p = me();
    char msg[256];
    ck_assert_int_eq(wb__publish_add_fd(&F.b, id, &p, fd, msg, sizeof msg), WB_OK);
}

/* A commit placing `names` at 0, 8, ... of memfd 0. */
static Wbproto__Reply *commit(const uint8_t *id, const char *const *names, size_t n)
{
    Wbproto__PublishSource src = WBPROTO__PUBLISH_SOURCE__INIT, *sp = &src;
    src.host_fd = 0;
    Wbproto__PublishPlacement pl[4], *pp[4];
    for (size_t i = 0; i < n; i++) {
        wbproto__publish_placement__init(&pl[i]);
        pl[i].name = (char *)names[i];
        pl[i].offset = 8 * i;
        pp[i] = &pl[i];
    }
    Wbproto__PublishCommitRequest c = WBPROTO__PUBLISH_COMMIT_REQUEST__INIT;
    c.publish_id.data = (uint8_t *)id;
    c.publish_id.len = 16;
    c.n_sources = 1;
    c.sources = &sp;
    c.n_tensors = n;
    c.tensors = pp;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_PUBLISH_COMMIT;
    req.publish_commit = &c;
    wb_peer_creds p = me();
    return call_as(&p, 1, &req);
}

/* "VERSION:STATE ..." of demo's records. */
static const char *versions(void)
{
    static char buf[256];
    size_t at = 0;
    buf[0] = '\0';
    for (const wb_model *m = F.b.models.head; m; m = m->next) {
        const char *st = m->current ? "current" : wb__model_state_name(m->state);
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%u:%s", at ? " " : "", m->version, st);
    }
    return buf;
}

static void load_demo(void)
{
    wb_peer_creds p = me();
    Wbproto__Reply *r = fixture_load(&F, &p, "demo", write_model("v1.safetensors", 1));
    ck_assert_msg(r->status == 0, "%s", r->error);
}

/* The bytes of tensor `name` of the current version of demo. */
static const uint8_t *bytes_of(const char *name, uint64_t *xxh3)
{
    const wb_model *m = wb__models_current(&F.b.models, "demo");
    ck_assert_ptr_nonnull(m);
    for (size_t i = 0; i < m->data.n_tensors; i++) {
        const wb_model_tensor *t = &m->data.tensors[i];
        if (strcmp(t->name, name) == 0) {
            *xxh3 = t->xxh3;
            /* Its own slab, or the one it borrows (a kept tensor). */
            wb_slab s;
            wb__model_tensor_slab(&m->data, 0, t, &s);
            ck_assert_ptr_nonnull(s.shm.addr);
            return (const uint8_t *)s.shm.addr + t->offset;
        }
    }
    ck_abort_msg("no tensor %s", name);
    return NULL;
}

static const char *const VW[] = {"v", "w"};
static const uint64_t D8[] = {8, 8, 8, 8};

START_TEST(test_begin_checks)
{
    load_demo();
    const char *const bad_name[] = {"vv"};
    Wbproto__Reply *r = begin(bad_name, D8, 1, 1);
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_str_eq(r->error, "tensor vv is not in model 'demo' (version 1): did you mean 'v'?; "
                               "a publish names tensors of the current version");
    const uint64_t d9[] = {8, 9};
    r = begin(VW, d9, 2, 0);
    ck_assert_int_eq(r->status, WB_EINVAL);
    ck_assert_str_eq(r->error, "tensor 'w': shape [9] differs from version 1's [8] (a publish "
                               "keeps every tensor's dtype and shape)");
    r = begin(VW, D8, 1, 0);
    ck_assert_int_eq(r->status, WB_EINVAL);
    ck_assert_str_eq(r->error, "the publish names 1 of the 2 tensors of model 'demo' (version 1): "
                               "1 missing, the first 'w'; name them all, or publish with "
                               "`partial` to keep the others' bytes");
    /* A client that is not a publisher; then one on --publisher-uid. */
    wb_peer_creds other = creds(4242, 4242, 777);
    F.b.auth.open_clients = 1;
    r = begin_as(&other, "demo", VW, D8, 2, 0);
    ck_assert_int_eq(r->status, WB_EPERM);
    ck_assert_ptr_nonnull(strstr(r->error, "uid 4242 may not publish"));
    wb_err err;
    ck_assert_int_eq(wb__auth_add(&F.b.auth, WB_AUTH_PUBLISH_UIDS, "4242", "--publisher-uid", &err),
                     WB_OK);
    r = begin_as(&other, "demo", VW, D8, 2, 0);
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_str_eq(versions(), "1:current 2:loading");
    /* One publish of a name at a time; a new model is the administrator's. */
    r = begin(VW, D8, 2, 0);
    ck_assert_int_eq(r->status, WB_ESTATE);
    r = begin_as(&other, "fresh", VW, D8, 2, 0);
    ck_assert_int_eq(r->status, WB_EPERM);
    ck_assert_uint_eq(F.b.stats.publishes_failed, 6);
}
END_TEST

START_TEST(test_max_versions)
{
    load_demo();
    F.b.limits.max_versions = 1;
    Wbproto__Reply *r = begin(VW, D8, 2, 0);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    ck_assert_ptr_nonnull(strstr(r->error, "model 'demo' already has 1 versions, the limit "
                                           "(--max-versions 1)"));
    ck_assert_str_eq(versions(), "1:current");
}
END_TEST

START_TEST(test_does_not_fit)
{
    static wb_backend tight;
    load_demo();
    tight = *F.b.cfg.backend;
    tight.mem_free = fixture_tiny_free;
    const wb_backend *was = F.b.cfg.backend;
    F.b.cfg.backend = &tight;
    Wbproto__Reply *r = begin(VW, D8, 2, 0);
    ck_assert_int_eq(r->status, WB_ENOMEM);
    ck_assert_str_eq(r->error, "publish of 'demo' (version 2) does not fit beside version 1 in "
                               "host shared memory (/dev/shm): needs 0.00 GB (264 bytes), 0.00 GB "
                               "(4 bytes) free");
    ck_assert_str_eq(versions(), "1:current");
    F.b.cfg.backend = was;
}
END_TEST

START_TEST(test_publish_and_partial)
{
    load_demo();
    Wbproto__Reply *r = begin(VW, D8, 2, 0);
    ck_assert_msg(r->status == 0, "%s", r->error);
    uint8_t id[16];
    memcpy(id, r->publish_begin->publish_id.data, 16);
    ck_assert_uint_eq(r->publish_begin->version, 2);
    send_memfd(id, 16, 7);
    /* Placements: each tensor once, inside its source. */
    const char *const only_v[] = {"v"};
    r = commit(id, only_v, 1);
    ck_assert_int_eq(r->status, WB_EINVAL);
    ck_assert_str_eq(r->error, "tensor 'w' of the publish's table is not placed: the commit "
                               "places every tensor the begin named, once");
    const char *const vwv[] = {"v", "w", "v"};
    r = commit(id, vwv, 3);
    ck_assert_int_eq(r->status, WB_EINVAL);
    ck_assert_str_eq(r->error, "tensor 'v' is placed twice");
    r = commit(id, VW, 2);
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_uint_eq(r->publish_commit->previous_version, 1);
    ck_assert_uint_eq(r->publish_commit->copied_bytes, 16);
    ck_assert_uint_eq(r->publish_commit->kept_bytes, 0);
    ck_assert_str_eq(r->publish_commit->model->checksums, "ready");
    ck_assert_str_eq(versions(), "2:current");
    uint8_t want[8];
    memset(want, 7, sizeof want);
    uint64_t x;
    ck_assert_mem_eq(bytes_of("w", &x), want, 8);
    ck_assert_uint_eq(x, XXH3_64bits(want, 8));
    /* Partial: v changes, w is kept. */
    r = begin(only_v, D8, 1, 1);
    ck_assert_msg(r->status == 0, "%s", r->error);
    memcpy(id, r->publish_begin->publish_id.data, 16);
    send_memfd(id, 8, 9);
    r = commit(id, only_v, 1);
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_uint_eq(r->publish_commit->copied_bytes, 8);
    ck_assert_uint_eq(r->publish_commit->kept_bytes, 8);
    ck_assert_mem_eq(bytes_of("w", &x), want, 8);
    /* w is kept by borrowing version 2's bytes, not copied. */
    const wb_model *v3 = wb__models_current(&F.b.models, "demo");
    ck_assert_uint_eq(v3->data.shared_tensors, 1);
    ck_assert_uint_eq(v3->data.shared_bytes, 8);
    ck_assert_uint_eq(v3->data.n_groups, 1);
    memset(want, 9, sizeof want);
    ck_assert_mem_eq(bytes_of("v", &x), want, 8);
    ck_assert_str_eq(versions(), "3:current");
    ck_assert_uint_eq(F.b.stats.publishes_total, 2);
    ck_assert_uint_eq(F.b.stats.publish_bytes_total, 24);
}
END_TEST

/* A source too small for its placement, then the ends without commit. */
START_TEST(test_ends)
{
    load_demo();
    Wbproto__Reply *r = begin(VW, D8, 2, 0);
    uint8_t id[16];
    memcpy(id, r->publish_begin->publish_id.data, 16);
    send_memfd(id, 12, 1);
    r = commit(id, VW, 2);
    ck_assert_int_eq(r->status, WB_EINVAL);
    ck_assert_str_eq(r->error, "tensor 'w': bytes [8, 16) of source 0, which holds 12");
    /* The connection's end ends it. */
    wb__publish_conn_closed(&F.b, 2);
    ck_assert_str_eq(versions(), "1:current 2:loading");
    wb__publish_conn_closed(&F.b, 1);
    ck_assert_str_eq(versions(), "1:current");
    ck_assert_ptr_null(F.b.publishes);
    /* The process's death. */
    r = begin(VW, D8, 2, 0);
    ck_assert_msg(r->status == 0, "%s", r->error);
    wb__publish_pid_dead(&F.b, me().pid);
    ck_assert_str_eq(versions(), "1:current");
    /* An abort, from its connection only. */
    r = begin(VW, D8, 2, 0);
    memcpy(id, r->publish_begin->publish_id.data, 16);
    Wbproto__PublishAbortRequest a = WBPROTO__PUBLISH_ABORT_REQUEST__INIT;
    a.publish_id.data = id;
    a.publish_id.len = 16;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_PUBLISH_ABORT;
    req.publish_abort = &a;
    wb_peer_creds p = me();
    r = call_as(&p, 5, &req);
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    r = call_as(&p, 1, &req);
    ck_assert_int_eq(r->status, 0);
    ck_assert_str_eq(versions(), "1:current");
    /* An unload of the name. */
    r = begin(VW, D8, 2, 0);
    memcpy(id, r->publish_begin->publish_id.data, 16);
    r = fixture_unload(&F, &p, "demo");
    ck_assert_int_eq(r->status, 0);
    ck_assert_ptr_null(F.b.publishes);
    ck_assert_str_eq(versions(), "");
    ck_assert_uint_eq(F.b.stats.publishes_total, 0);
}
END_TEST

/* A published version whose checksums are still being computed (a cuda
 * publish reads them back after it is current): its leases say so and
 * carry no checksums; once they are in, the wire view is built again and
 * later leases carry them, with the table's digest. */
START_TEST(test_checksums_pending)
{
    load_demo();
    wb_model *m = wb__models_current(&F.b.models, "demo");
    ck_assert_ptr_nonnull(m);
    uint8_t digest[16];
    memcpy(digest, m->table_digest, sizeof digest);
    uint64_t want[64];
    ck_assert_uint_le(m->data.n_tensors, 64);
    for (size_t i = 0; i < m->data.n_tensors; i++) {
        want[i] = m->data.tensors[i].xxh3;
        m->data.tensors[i].xxh3 = 0;
    }
    m->checksums_state = WB_CHECKSUMS_PENDING;
    wb_err err;
    ck_assert_int_eq(wb__model_rewire(m, &err), WB_OK);
    wb_peer_creds p = me();
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__AcquireRequest ar = WBPROTO__ACQUIRE_REQUEST__INIT;
    ar.model = "demo";
    req.id = 7;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &ar;
    Wbproto__Reply *r = fixture_call(&F, &p, &req);
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert(r->acquire->lease->checksums_pending);
    ck_assert_uint_eq(r->acquire->lease->n_tensors, m->data.n_tensors);
    for (size_t i = 0; i < r->acquire->lease->n_tensors; i++)
        ck_assert_uint_eq(r->acquire->lease->tensors[i]->xxh3, 0);
    ck_assert_mem_ne(m->table_digest, digest, sizeof digest);
    for (size_t i = 0; i < m->data.n_tensors; i++)
        m->data.tensors[i].xxh3 = want[i];
    m->checksums_state = WB_CHECKSUMS_READY;
    ck_assert_int_eq(wb__model_rewire(m, &err), WB_OK);
    req.id = 8;
    r = fixture_call(&F, &p, &req);
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert(!r->acquire->lease->checksums_pending);
    size_t nonzero = 0;
    for (size_t i = 0; i < r->acquire->lease->n_tensors; i++)
        nonzero += r->acquire->lease->tensors[i]->xxh3 != 0;
    ck_assert_uint_eq(nonzero, m->data.n_tensors);
    ck_assert_mem_eq(m->table_digest, digest, sizeof digest);
}
END_TEST

/* A checker that never runs a job by itself: the test runs them (run_checks)
 * and hands them back as the loop does. */
static wb_loader idle;

static void idle_checker(void)
{
    memset(&idle, 0, sizeof idle);
    idle.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ck_assert_int_ge(idle.efd, 0);
    pthread_mutex_init(&idle.mu, NULL);
    pthread_cond_init(&idle.cv, NULL);
    F.b.checker = &idle;
}

static size_t queued_checks(void)
{
    size_t n = 0;
    for (const wb_load_job *j = idle.queue; j; j = j->next)
        n++;
    return n;
}

/* Hands back what is done (dropped jobs), then runs what is queued when
 * `run`. */
static void run_checks(int run)
{
    while (run && idle.queue) {
        wb_load_job *j = idle.queue;
        idle.queue = j->next;
        wb__publish_checksum_run(j);
        j->next = idle.done;
        idle.done = j;
    }
    wb_load_job *list = wb__loader_take_done(&idle);
    while (list) {
        wb_load_job *j = list;
        list = j->next;
        wb__publish_checksums_done(&F.b, j);
        wb__load_job_free(&j);
    }
}

static void publish_fill(uint8_t fill)
{
    Wbproto__Reply *r = begin(VW, D8, 2, 0);
    ck_assert_msg(r->status == 0, "%s", r->error);
    uint8_t id[16];
    memcpy(id, r->publish_begin->publish_id.data, 16);
    send_memfd(id, 16, fill);
    r = commit(id, VW, 2);
    ck_assert_msg(r->status == 0, "%s", r->error);
    ck_assert_str_eq(r->publish_commit->model->checksums, "pending");
}

static wb_model *version(uint32_t v)
{
    for (wb_model *m = F.b.models.head; m; m = m->next) {
        if (m->version == v)
            return m;
    }
    ck_abort_msg("no version %u", v);
    return NULL;
}

static void acquire_demo(void)
{
    wb_peer_creds p = me();
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    Wbproto__AcquireRequest ar = WBPROTO__ACQUIRE_REQUEST__INIT;
    ar.model = "demo";
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &ar;
    Wbproto__Reply *r = fixture_send(&F, &p, &req);
    ck_assert_msg(r->status == 0, "%s", r->error);
}

/* Checksums on the checker: a version replaced before its read-back ran
 * has it dropped (it was pinned by it alone: freed then; with a lease:
 * draining and still pending), and a rollback to it reads it back again. */
START_TEST(test_checksums_checker)
{
    load_demo();
    F.b.limits.max_versions = 8;
    idle_checker();
    publish_fill(7);
    ck_assert_str_eq(versions(), "2:current");
    ck_assert_uint_eq(version(2)->leases, 1);
    ck_assert_uint_eq(queued_checks(), 1);
    publish_fill(8);
    /* Version 2's read-back left the queue at once, dropped. */
    ck_assert_uint_eq(queued_checks(), 1);
    ck_assert_str_eq(versions(), "2:draining 3:current");
    run_checks(0);
    ck_assert_str_eq(versions(), "3:current");
    run_checks(1);
    wb_model *m = version(3);
    ck_assert_int_eq(m->checksums_state, WB_CHECKSUMS_READY);
    ck_assert_uint_eq(m->leases, 0);
    uint8_t want[8];
    memset(want, 8, sizeof want);
    ck_assert_uint_eq(m->data.tensors[0].xxh3, XXH3_64bits(want, 8));
    /* A holder keeps version 4 while its read-back is dropped. */
    publish_fill(9);
    acquire_demo();
    publish_fill(10);
    run_checks(0);
    m = version(4);
    ck_assert_int_eq(m->checksums_state, WB_CHECKSUMS_PENDING);
    ck_assert_uint_eq(m->leases, 1);
    ck_assert_ptr_null(m->sum_job);
    ck_assert_str_eq(versions(), "4:draining 5:current");
    Wbproto__RollbackRequest rb = WBPROTO__ROLLBACK_REQUEST__INIT;
    rb.name = "demo";
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_ROLLBACK;
    req.rollback = &rb;
    wb_peer_creds p = me();
    Wbproto__Reply *r = fixture_send(&F, &p, &req);
    ck_assert_msg(r->status == 0, "%s", r->error);
    /* Version 5's read-back is dropped in turn; version 4's queued again. */
    ck_assert_uint_eq(queued_checks(), 1);
    run_checks(1);
    ck_assert_str_eq(versions(), "4:current");
    ck_assert_int_eq(m->checksums_state, WB_CHECKSUMS_READY);
    memset(want, 9, sizeof want);
    ck_assert_uint_eq(m->data.tensors[1].xxh3, XXH3_64bits(want, 8));
    ck_assert_uint_eq(m->leases, 1);
    F.b.checker = NULL;
    close(idle.efd);
    pthread_mutex_destroy(&idle.mu);
    pthread_cond_destroy(&idle.cv);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_publish");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_begin_checks);
    tcase_add_test(tc, test_max_versions);
    tcase_add_test(tc, test_does_not_fit);
    tcase_add_test(tc, test_publish_and_partial);
    tcase_add_test(tc, test_ends);
    tcase_add_test(tc, test_checksums_pending);
    tcase_add_test(tc, test_checksums_checker);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
