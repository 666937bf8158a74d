/* The out-of-memory loop of the tests: an operation run again and again
 * with its n-th allocation failing (common/alloc.h's hook), n = 0, 1, 2, ...
 * until a run makes every allocation it asks for, first with every
 * allocation from the n-th on failing (as a process out of memory sees it),
 * then with only the n-th (which also finds a failure ignored and carried
 * on from). Each failed run must end with a clean error and nothing left
 * behind (the `failed` callback checks the state, LeakSanitizer the leaks
 * at exit); a run that succeeds although an allocation failed must have
 * built its whole result (the `done` callback checks it).
 *
 * A new test fills an oom_op and calls oom_run:
 *
 *     static int run(void *ctx) { ... return rc; }           // hook armed
 *     static void failed(void *ctx, int rc) { ck_assert_int_eq(rc, WB_ENOMEM); ... }
 *     static void done(void *ctx) { ...check the result, free it... }
 *     oom_op op = {.name = "decode", .ctx = &c, .run = run, .failed = failed, .done = done};
 *     oom_result res = oom_run(&op);
 *
 * The hook is off in every callback but `run`. */
#ifndef WB_TEST_OOM_H
#define WB_TEST_OOM_H

#include "alloc.h"

#include <check.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct oom_op {
    const char *name;
    void *ctx;
    unsigned flags;           /* WB_ALLOC_THIS_THREAD, or 0 */
    void (*setup)(void *ctx); /* before each run; may be NULL */
    int (*run)(void *ctx);    /* the operation: its status */
    /* After a run that returned an error while an allocation failed:
     * asserts the status and that nothing of the operation is left. */
    void (*failed)(void *ctx, int rc);
    /* After a run that succeeded: asserts the whole result, frees it. */
    void (*done)(void *ctx);
    void (*teardown)(void *ctx); /* after each run; may be NULL */
} oom_op;

#define OOM_MAX_SITES 512

typedef struct oom_result {
    long points;     /* allocations a run makes when none fails */
    long sites;      /* distinct call sites among them */
    long runs;       /* runs with a failure injected */
    long carried_on; /* of those, runs that succeeded all the same */
    const void *site[OOM_MAX_SITES];
} oom_result;

/* The hook's mode of the run under way (WB_ALLOC_STICKY or 0), for the
 * callbacks. */
static unsigned oom_mode;

/* The most allocations one operation may make before the loop gives up:
 * an operation that keeps allocating after a failure never ends. */
#define OOM_MAX_POINTS 100000

static inline void oom_add_site(oom_result *res, const void *site)
{
    for (long i = 0; i < res->sites; i++)
        if (res->site[i] == site)
            return;
    if (res->sites < OOM_MAX_SITES)
        res->site[res->sites++] = site;
}

/* Prints the sites as module+offset, for addr2line. */
static inline void oom_print_sites(const oom_op *op, const oom_result *res)
{
    for (long i = 0; i < res->sites; i++) {
        Dl_info info;
        if (dladdr(res->site[i], &info) && info.dli_fname)
            printf("oom %s: site %s+0x%lx\n", op->name, info.dli_fname,
                   (unsigned long)((uintptr_t)res->site[i] - (uintptr_t)info.dli_fbase));
        else
            printf("oom %s: site %p\n", op->name, res->site[i]);
    }
}

/* Adds res to a total over several operations: their points, and their
 * sites counted once. */
static inline void oom_total(oom_result *total, const oom_result *res)
{
    total->points += res->points;
    total->runs += res->runs;
    total->carried_on += res->carried_on;
    for (long i = 0; i < res->sites; i++)
        oom_add_site(total, res->site[i]);
}

static inline oom_result oom_run(const oom_op *op)
{
    oom_result res = {0};
    static const unsigned modes[2] = {WB_ALLOC_STICKY, 0};
    for (int m = 0; m < 2; m++) {
        for (long n = 0;; n++) {
            ck_assert_msg(n < OOM_MAX_POINTS, "%s: still allocating after %ld allocations",
                          op->name, n);
            oom_mode = modes[m];
            if (op->setup)
                op->setup(op->ctx);
            wb__alloc_fail_after(n, modes[m] | op->flags);
            int rc = op->run(op->ctx);
            long failures = wb__alloc_failures();
            long count = wb__alloc_count();
            const void *site = wb__alloc_failed_site();
            wb__alloc_hook_off();
            if (failures == 0) {
                ck_assert_msg(rc == 0, "%s: status %d with no allocation failed (%ld made)",
                              op->name, rc, count);
                op->done(op->ctx);
                if (op->teardown)
                    op->teardown(op->ctx);
                if (m == 0)
                    res.points = count;
                else
                    ck_assert_msg(count == res.points,
                                  "%s: %ld allocations in one run, %ld in another", op->name, count,
                                  res.points);
                break;
            }
            res.runs++;
            oom_add_site(&res, site);
            if (rc == 0) {
                res.carried_on++;
                op->done(op->ctx);
            } else {
                op->failed(op->ctx, rc);
            }
            if (op->teardown)
                op->teardown(op->ctx);
        }
    }
    /* An operation that allocates nothing through the hook tests nothing:
     * a direct malloc somewhere (lint.alloc_calls) or a wrong operation. */
    ck_assert_msg(res.points > 0, "%s: no allocation went through the hook", op->name);
    printf("oom %s: %ld allocation points at %ld sites, %ld runs (%ld carried on)\n", op->name,
           res.points, res.sites, res.runs, res.carried_on);
    if (getenv("WB_OOM_SITES"))
        oom_print_sites(op, &res);
    fflush(stdout);
    return res;
}

#endif
