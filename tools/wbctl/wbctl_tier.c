/* wbctl sleep and wake: a model moved to the host tier of the device memory
 * budget, or brought back to its device, on demand. The broker answers at
 * once; wbctl then watches the model's tier in the broker's listing until
 * the move or the restore has ended. */
#include "wbctl.h"

#include "clock.h"
#include "wbctl_call.h"
#include "wbctl_model.h"
#include "wbctl_out.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The listing is asked every POLL_MS; the wait lasts --timeout-ms when
 * given, else WAIT_MS. */
#define POLL_MS 20
#define WAIT_MS 60000

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* One of the two commands. */
typedef struct tier_op {
    const char *name; /* "sleep" or "wake" */
    int wake;
} tier_op;

static int is(const char *tier, const char *name)
{
    return strcmp(tier, name) == 0;
}

/* Whether the tier is where the command takes the model. */
static int arrived(const tier_op *op, const char *tier)
{
    return op->wake ? is(tier, "device") : is(tier, "host") || is(tier, "evicted");
}

/* Whether the model is on its way there: a move (a wake waits for it, then
 * the broker restores the model), a restore or a reload. */
static int on_the_way(const tier_op *op, const char *tier)
{
    return is(tier, "moving") || (op->wake && (is(tier, "restoring") || is(tier, "reloading")));
}

/* How a tier brings the model back: 2 a reload from its files, 1 a restore
 * from its host copy, else 0. */
static int way_back(const char *tier)
{
    return is(tier, "reloading") ? 2 : is(tier, "restoring") ? 1 : 0;
}

/* The version `version` of model `name` in a listing, or NULL. */
static const Wbproto__ModelInfo *find(const Wbproto__Reply *rep, const char *name, uint32_t version)
{
    const Wbproto__ListModelsReply *lm = rep->list_models;
    for (size_t i = 0; lm && i < lm->n_models; i++) {
        const Wbproto__ModelInfo *m = lm->models[i];
        if (m->name && strcmp(m->name, name) == 0 &&
            (m->version == version || (version == 0 && m->current)))
            return m;
    }
    return NULL;
}

/* Waits POLL_MS, or less when the wait ends sooner; Ctrl-C cuts it. */
static void pause_ms(int64_t ms)
{
    if (ms > POLL_MS)
        ms = POLL_MS;
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !interrupted) {
    }
}

/* How the wait ended. */
enum { WAIT_ARRIVED, WAIT_LEFT, WAIT_WENT_BACK, WAIT_GONE, WAIT_STOPPED, WAIT_INTERRUPTED };

/* Says why the wait failed, on stderr, and returns the exit code. */
static int wait_failed(const tier_op *op, int how, const char *name, uint32_t version,
                       const Wbproto__ModelInfo *m, int64_t limit_ms)
{
    char *n = wbctl_escape(name);
    char *tier = wbctl_escape(m ? wbctl_model_tier(m) : "");
    char *why = m && m->error && m->error[0] ? wbctl_escape(m->error) : NULL;
    const char *nn = n ? n : "?", *tt = tier ? tier : "?";
    int rc;
    switch (how) {
    case WAIT_LEFT:
        /* The reply already: the broker did not start what was asked (a
         * sleep of a model being restored, say). */
        fprintf(stderr, "wbctl: %s: the broker left model '%s' version %u %s%s%s\n", op->name, nn,
                version, tt, why ? ": " : "", why ? why : "");
        rc = WBCTL_EXIT_REFUSED;
        break;
    case WAIT_WENT_BACK:
        /* A failed restore leaves it host or evicted; a failed move, on
         * its device. */
        if (!op->wake && way_back(m ? wbctl_model_tier(m) : "")) {
            /* Moved, and on its way back already. */
            fprintf(stderr,
                    "wbctl: sleep: model '%s' version %u is %s: an acquire or a wake came "
                    "meanwhile\n",
                    nn, version, tt);
            rc = WBCTL_EXIT_REFUSED;
            break;
        }
        if (op->wake)
            fprintf(stderr,
                    "wbctl: wake: model '%s' version %u did not come back to its device: "
                    "its tier is %s",
                    nn, version, tt);
        else
            fprintf(stderr,
                    "wbctl: sleep: model '%s' version %u did not move off its device: "
                    "its tier is %s",
                    nn, version, tt);
        /* The broker's reason when the listing carries one, else where it is. */
        fprintf(stderr, "%s%s\n", why ? ": " : " (the broker's log says why)", why ? why : "");
        rc = WBCTL_EXIT_REFUSED;
        break;
    case WAIT_GONE:
        fprintf(stderr, "wbctl: %s: model '%s' version %u is no longer listed (unloaded?)\n",
                op->name, nn, version);
        rc = WBCTL_EXIT_REFUSED;
        break;
    case WAIT_INTERRUPTED:
        fprintf(stderr,
                "wbctl: %s: interrupted: model '%s' version %u is %s; the broker goes on "
                "(`wbctl models %s` shows its tier)\n",
                op->name, nn, version, tt, nn);
        rc = WBCTL_EXIT_INTERRUPTED;
        break;
    default:
        fprintf(stderr,
                "wbctl: %s: stopped waiting after %g s: model '%s' version %u is still %s; the "
                "broker goes on (`wbctl models %s` shows its tier)\n",
                op->name, (double)limit_ms / 1000.0, nn, version, tt, nn);
        rc = WBCTL_EXIT_TEMPFAIL;
        break;
    }
    free(n);
    free(tier);
    free(why);
    return rc;
}

/* Watches the listing until model `name` version `version` (as the reply
 * *cur showed it) has arrived. *cur is the reply that holds *m; on success
 * both are the last listing's. Returns -1, else the exit code after saying
 * why. *back: the way back seen (way_back), reload over restore. */
static int wait_tier(const wbctl_globals *g, const tier_op *op, const char *name, uint32_t version,
                     Wbproto__Reply **cur, const Wbproto__ModelInfo **m, int *back)
{
    int64_t limit = g->timeout_ms > 0 ? g->timeout_ms : WAIT_MS;
    int64_t start = wb__clock_mono_ms();
    const char *tier = wbctl_model_tier(*m);
    *back = way_back(tier);
    if (arrived(op, tier))
        return -1;
    if (!on_the_way(op, tier))
        return wait_failed(op, WAIT_LEFT, name, version, *m, 0);
    wb__rpc rpc;
    int rc = wbctl_open(g, g->timeout_ms, &rpc);
    if (rc >= 0)
        return rc;
    /* Ctrl-C ends the wait, not the move: say so on the way out. */
    struct sigaction sa = {.sa_handler = on_sigint}, old_sa;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, &old_sa);
    int how = WAIT_STOPPED;
    rc = -1;
    for (;;) {
        int64_t left = start + limit - wb__clock_mono_ms();
        if (left <= 0)
            break;
        pause_ms(left);
        if (interrupted) {
            how = WAIT_INTERRUPTED;
            break;
        }
        Wbproto__ListModelsRequest body = WBPROTO__LIST_MODELS_REQUEST__INIT;
        Wbproto__Request req = WBPROTO__REQUEST__INIT;
        req.body_case = WBPROTO__REQUEST__BODY_LIST_MODELS;
        req.list_models = &body;
        Wbproto__Reply *rep;
        if ((rc = wbctl_exchange(&rpc, op->name, &req, 0, &rep)) >= 0)
            break;
        const Wbproto__ModelInfo *now = find(rep, name, version);
        if (!now) {
            wb__reply_free(&rep);
            how = WAIT_GONE;
            break;
        }
        wb__reply_free(cur);
        *cur = rep;
        *m = now;
        tier = wbctl_model_tier(now);
        if (way_back(tier) > *back)
            *back = way_back(tier);
        if (arrived(op, tier)) {
            how = WAIT_ARRIVED;
            break;
        }
        if (!on_the_way(op, tier)) {
            how = WAIT_WENT_BACK;
            break;
        }
    }
    sigaction(SIGINT, &old_sa, NULL);
    wb__rpc_close(&rpc);
    if (rc >= 0)
        return rc; /* the listing failed: wbctl_exchange said why */
    if (how == WAIT_ARRIVED)
        return -1;
    /* The model as last seen (a model no longer listed: the reply's). */
    return wait_failed(op, how, name, version, *m, limit);
}

/* The line for people: where the model is now, and what it took (back: how
 * it came back to its device, as way_back). */
static void print_tier(const Wbproto__ModelInfo *m, int back)
{
    char *n = wbctl_escape(m->name);
    char *tier = wbctl_escape(wbctl_model_tier(m));
    char size[32], rate[32];
    printf("model '%s' version %u: %s", n ? n : "?", m->version, tier ? tier : "?");
    if (is(wbctl_model_tier(m), "host"))
        printf(" (host copy %s)", wbctl_fmt_size(size, sizeof size, m->host_bytes));
    else if (is(wbctl_model_tier(m), "evicted"))
        printf(" (no host copy: it reloads from its files when next acquired)");
    else if (is(wbctl_model_tier(m), "device") && !back)
        printf(" (already on its device)");
    else if (is(wbctl_model_tier(m), "device") && m->last_restore_seconds > 0)
        printf(" (%s in %.3f s, %s)", back == 2 ? "reloaded" : "restored", m->last_restore_seconds,
               wbctl_fmt_gbps(rate, sizeof rate, m->last_restore_gbps));
    printf("\n");
    free(n);
    free(tier);
}

static int tier_cmd(const wbctl_globals *g, int argc, char **argv, const tier_op *op)
{
    static const char *const names[] = {"NAME"};
    int no_wait = 0;
    const wbctl_flag sleep_flags[] = {
        {"no-wait", "return once the broker has started the move", &no_wait},
    };
    const wbctl_flag wake_flags[] = {
        {"no-wait", "return once the broker has started the restore", &no_wait},
    };
    const wbctl_spec spec = {
        .synopsis = op->wake ? "wake [--json] [--no-wait] NAME" : "sleep [--json] [--no-wait] NAME",
        .about =
            op->wake
                ? "Brings model NAME (its current version), which the device memory budget\n"
                  "moved off its device, back to it: restored from its host copy, or reloaded\n"
                  "from its files when evicted (its tensors checked against the checksums of\n"
                  "its load). Waits until it is on its device (at most --timeout-ms when\n"
                  "given, else 60 s: then it exits 75 and the restore goes on) and prints\n"
                  "how long the restore took and how fast it went; a restore that fails\n"
                  "leaves the model host or evicted, said with the broker's reason (exit 1)."
                : "Moves model NAME (its current version), which no lease may hold, off its\n"
                  "device now: its bytes are copied to the host tier (pinned host memory)\n"
                  "and its device memory freed, or, with no room in the host tier, it is\n"
                  "evicted (it reloads from its files; a published version, which has none,\n"
                  "is refused). Waits until it is host or evicted (at most --timeout-ms when\n"
                  "given, else 60 s: then it exits 75 and the move goes on). The next\n"
                  "acquire of it, or `wbctl wake NAME`, brings it back.",
        .min_args = 1,
        .max_args = 1,
        .arg_names = names,
        .own = op->wake ? wake_flags : sleep_flags,
        .n_own = 1,
    };
    wbctl_args args;
    int rc = wbctl_parse(argc, argv, &spec, &args);
    if (rc >= 0)
        return rc;
    int json = args.output == WBCTL_OUT_JSON;
    Wbproto__TierRequest body = WBPROTO__TIER_REQUEST__INIT;
    body.name = args.pos[0];
    body.wake = op->wake;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_TIER;
    req.tier = &body;
    Wbproto__Reply *rep;
    if ((rc = wbctl_call(g, op->name, &req, g->timeout_ms, &rep)) >= 0)
        return rc;
    const Wbproto__ModelInfo *m = rep->tier ? rep->tier->model : NULL;
    if (!m) {
        fprintf(stderr, "wbctl: %s: the broker's reply carries no model\n", op->name);
        wb__reply_free(&rep);
        return WBCTL_EXIT_UNAVAILABLE;
    }
    int back = way_back(wbctl_model_tier(m));
    if (!no_wait && (rc = wait_tier(g, op, args.pos[0], m->version, &rep, &m, &back)) >= 0) {
        wb__reply_free(&rep);
        return rc;
    }
    if (json) {
        rc = wbctl_print_json(wbctl_model_json(m));
    } else {
        print_tier(m, back);
        rc = WBCTL_EXIT_OK;
    }
    wb__reply_free(&rep);
    return rc;
}

int wbctl_sleep(const wbctl_globals *g, int argc, char **argv)
{
    static const tier_op op = {"sleep", 0};
    return tier_cmd(g, argc, argv, &op);
}

int wbctl_wake(const wbctl_globals *g, int argc, char **argv)
{
    static const tier_op op = {"wake", 1};
    return tier_cmd(g, argc, argv, &op);
}
