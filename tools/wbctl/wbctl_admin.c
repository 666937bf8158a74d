/* wbctl's administrator commands: load, rollout, rollback, unload and
 * cancel. */
#include "wbctl.h"

#include "clock.h"
#include "wbctl_call.h"
#include "placement.h"
#include "wbctl_model.h"
#include "wbctl_progress.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A load lasts as long as its checkpoint takes to read: wbctl load waits
 * for the reply in slices of SLICE_MS and, every WATCH_MS, asks the broker
 * on a connection of its own whether the model is still loading. It stops
 * waiting when the broker does not answer, or when the model has not been
 * loading for GONE_WATCHES asks in a row with no reply come (the broker
 * sends the reply in the same turn as it ends the load: only a broker that
 * lost it, by a restart, keeps it away that long). */
#define SLICE_MS     100
#define WATCH_MS     1000
#define GONE_WATCHES 3

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Takes a command's own flag (load's --no-wait, --no-share) out of argv
 * (up to a "--"), so that wbctl_parse_args sees only the options every
 * command has. */
static int take_flag(int *argc, char **argv, const char *flag)
{
    int found = 0, k = 1, i = 1;
    for (; i < *argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], flag) == 0)
            found = 1;
        else
            argv[k++] = argv[i];
    }
    while (i < *argc)
        argv[k++] = argv[i++];
    argv[k] = NULL;
    *argc = k;
    return found;
}

enum { WATCH_LOADING, WATCH_ENDED, WATCH_DEAD };

/* Whether the broker lists model `name` as loading; WATCH_DEAD with the
 * reason in err when it does not answer. A connection of its own each
 * time, checked as a new one is (a broker gone is told at once). */
static int watch(const wbctl_globals *g, const char *name, wb_err *err)
{
    wb__rpc rpc;
    Wbproto__Reply *rep = NULL;
    int rc = wb__rpc_open(&rpc, g->socket_path, 0, err), state = WATCH_ENDED;
    if (rc == WB_OK) {
        Wbproto__ListModelsRequest body = WBPROTO__LIST_MODELS_REQUEST__INIT;
        Wbproto__Request req = WBPROTO__REQUEST__INIT;
        req.body_case = WBPROTO__REQUEST__BODY_LIST_MODELS;
        req.list_models = &body;
        rc = wb__rpc_call(&rpc, &req, 0, &rep, err);
    }
    wb__rpc_close(&rpc);
    if (rc != WB_OK) {
        /* A refusal is an answer: the broker lives. */
        state = rep ? WATCH_LOADING : WATCH_DEAD;
        wb__reply_free(&rep);
        return state;
    }
    for (size_t i = 0; i < rep->list_models->n_models; i++) {
        const Wbproto__ModelInfo *m = rep->list_models->models[i];
        if (strcmp(m->name, name) == 0 && m->state == WBPROTO__MODEL_STATE__MODEL_LOADING)
            state = WATCH_LOADING;
    }
    wb__reply_free(&rep);
    return state;
}

/* A failed exchange or a refusal, as wbctl_exchange reports them. */
static int report_failure(const char *op, const wb_err *e, Wbproto__Reply **rep)
{
    char *msg = wbctl_escape(e->msg);
    fprintf(stderr, "wbctl: %s: %s\n", op, msg ? msg : "(out of memory)");
    free(msg);
    if (*rep) {
        wb__reply_free(rep);
        /* A name or placement the user typed wrong is misuse, as for
         * every other command. */
        return wbctl_refusal_exit(e->code);
    }
    return WBCTL_EXIT_UNAVAILABLE;
}

/* How the wait for a load's reply ended without one. */
enum { WAIT_REPLY, WAIT_STOPPED, WAIT_INTERRUPTED, WAIT_DEAD, WAIT_LOST };

/* Sends the load and waits for its reply while the broker loads it (up to
 * --timeout-ms when given). Returns the exit code after printing why it
 * did not get a reply, or -1 with *rep set. */
static int load_and_wait(const wbctl_globals *g, const char *op, const char *name,
                         Wbproto__Request *req, int json, Wbproto__Reply **rep)
{
    int body = (int)req->body_case;
    wb__rpc rpc;
    wb_err e, we;
    uint64_t id;
    *rep = NULL;
    int rc = wbctl_open(g, 0, &rpc);
    if (rc >= 0)
        return rc;
    if ((rc = wb__rpc_send(&rpc, req, 0, &id, &e)) != WB_OK) {
        wb__rpc_close(&rpc);
        return report_failure(op, &e, rep);
    }
    /* Ctrl-C ends the wait, not the load: say so on the way out. */
    struct sigaction sa = {.sa_handler = on_sigint}, old_sa;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, &old_sa);
    /* On a terminal, a progress bar while the broker loads. */
    wbctl_progress *bar = json ? NULL : wbctl_progress_start(g->socket_path, name);
    int64_t start = wb__clock_mono_ms(), next_watch = start + WATCH_MS;
    int how = WAIT_REPLY, gone = 0;
    for (;;) {
        int slice = SLICE_MS;
        if (g->timeout_ms > 0) {
            int64_t left = start + g->timeout_ms - wb__clock_mono_ms();
            slice = left < slice ? (left > 0 ? (int)left : 0) : slice;
        }
        rc = wb__rpc_wait(&rpc, id, body, slice, rep, &e);
        if (rc == WB_ECONN && !*rep) {
            /* The connection closed and nothing listens any more. */
            how = WAIT_DEAD;
            we = e;
            break;
        }
        if (rc != WB_ETIMEDOUT)
            break;
        int64_t now = wb__clock_mono_ms();
        if (interrupted) {
            how = WAIT_INTERRUPTED;
            break;
        }
        if (g->timeout_ms > 0 && now - start >= g->timeout_ms) {
            how = WAIT_STOPPED;
            break;
        }
        if (now < next_watch)
            continue;
        int w = watch(g, name, &we);
        next_watch = wb__clock_mono_ms() + WATCH_MS;
        if (w == WATCH_DEAD) {
            how = WAIT_DEAD;
            break;
        }
        gone = w == WATCH_ENDED ? gone + 1 : 0;
        if (gone >= GONE_WATCHES) {
            how = WAIT_LOST;
            break;
        }
    }
    int watched = WATCH_LOADING;
    if (how == WAIT_STOPPED) {
        /* Said only when true: the broker lists the load as going on (or
         * its reply came meanwhile, and is printed). */
        watched = watch(g, name, &we);
        rc = wb__rpc_wait(&rpc, id, body, 0, rep, &e);
        if (rc != WB_ETIMEDOUT)
            how = WAIT_REPLY;
    }
    wbctl_progress_stop(&bar);
    sigaction(SIGINT, &old_sa, NULL);
    wb__rpc_close(&rpc);
    char *esc = wbctl_escape(name), *why = NULL;
    const char *n = esc ? esc : "?";
    switch (how) {
    case WAIT_REPLY:
        rc = rc == WB_OK ? -1 : report_failure(op, &e, rep);
        break;
    case WAIT_STOPPED:
        fprintf(stderr, "wbctl: %s: stopped waiting after %g s; ", op, g->timeout_ms / 1000.0);
        if (watched == WATCH_LOADING)
            fprintf(stderr,
                    "the load of %s continues in the broker (see `wbctl models`; `wbctl cancel "
                    "%s` stops it)\n",
                    n, n);
        else if (watched == WATCH_ENDED)
            fprintf(stderr, "the broker does not list %s as loading (see `wbctl models`)\n", n);
        else
            fprintf(stderr, "and the broker does not answer: %s\n",
                    (why = wbctl_escape(we.msg)) ? why : "?");
        rc = watched == WATCH_DEAD ? WBCTL_EXIT_UNAVAILABLE : WBCTL_EXIT_TEMPFAIL;
        break;
    case WAIT_INTERRUPTED:
        fprintf(stderr,
                "wbctl: %s: interrupted: the load of %s continues in the broker; `wbctl cancel "
                "%s` stops it\n",
                op, n, n);
        rc = WBCTL_EXIT_INTERRUPTED;
        break;
    case WAIT_DEAD:
        fprintf(stderr, "wbctl: %s: the broker stopped answering while %s was loading: %s\n", op, n,
                (why = wbctl_escape(we.msg)) ? why : "?");
        rc = WBCTL_EXIT_UNAVAILABLE;
        break;
    default:
        fprintf(stderr,
                "wbctl: %s: the broker no longer lists %s as loading but sent no reply (has it "
                "restarted?); see `wbctl models`\n",
                op, n);
        rc = WBCTL_EXIT_UNAVAILABLE;
        break;
    }
    free(esc);
    free(why);
    return rc;
}

/* PATH[@DEVICES] as the broker takes it: the placement split off (the
 * last '@' starts it, as in wbrokerd --model) and checked, the path made
 * absolute (the broker resolves paths from its own working directory).
 * -1 to go on, else the exit code. */
static int path_and_placement(const char *op, char *arg, char abs[PATH_MAX], char **placement)
{
    *placement = strrchr(arg, '@');
    if (*placement) {
        *(*placement)++ = '\0';
        wb_placement where;
        wb_err perr;
        if (wb__placement_parse(*placement, strlen(*placement), &where, &perr) != WB_OK) {
            fprintf(stderr, "wbctl %s: %s\n", op, perr.msg);
            return WBCTL_EXIT_USAGE;
        }
    }
    if (!realpath(arg, abs)) {
        int n = arg[0] == '/' ? snprintf(abs, PATH_MAX, "%s", arg) : -1;
        if (n < 0) {
            char cwd[PATH_MAX];
            if (getcwd(cwd, sizeof cwd))
                n = snprintf(abs, PATH_MAX, "%s/%s", cwd, arg);
        }
        if (n < 0 || n >= PATH_MAX) {
            fprintf(stderr, "wbctl %s: cannot make %s absolute: %s\n", op, arg, strerror(errno));
            return WBCTL_EXIT_USAGE;
        }
    }
    return -1;
}

int wbctl_load(const wbctl_globals *g, int argc, char **argv)
{
    static const char *const names[] = {"NAME", "PATH"};
    int json;
    char *pos[2];
    int no_wait = take_flag(&argc, argv, "--no-wait");
    int no_share = take_flag(&argc, argv, "--no-share");
    int rc = wbctl_parse_args(
        argc, argv, "load [--json] [--no-wait] [--no-share] NAME PATH[@DEVICES]",
        "Loads the safetensors checkpoint PATH (a file, a directory or an index) as model NAME\n"
        "and waits until the broker has finished, as long as the broker answers and loads it\n"
        "(with --timeout-ms, at most that long: then it exits 75 and the load goes on).\n"
        "Ctrl-C stops the wait, not the load (exit 130); `wbctl cancel NAME` stops the load.\n"
        "@DEVICES places a copy on each device: @0,1, @all or @GPU-<uuid>,... (default: the\n"
        "broker's --device).\n\n"
        "  --no-wait  return once the load has started, the model loading (`wbctl models`\n"
        "             shows how it goes; a load that fails stays listed as failed)\n"
        "  --no-share load every tensor even where an equal one is resident on the device,\n"
        "             and share none of this model's with later loads (nor its rollouts')",
        2, names, &json, pos);
    if (rc >= 0)
        return rc;
    char abs[PATH_MAX], *placement;
    if ((rc = path_and_placement("load", pos[1], abs, &placement)) >= 0)
        return rc;
    Wbproto__LoadRequest body = WBPROTO__LOAD_REQUEST__INIT;
    body.name = pos[0];
    body.path = abs;
    body.placement = placement ? placement : "";
    body.no_wait = no_wait;
    body.no_share = no_share;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &body;
    Wbproto__Reply *rep;
    rc = no_wait ? wbctl_call(g, "load", &req, g->timeout_ms, &rep)
                 : load_and_wait(g, "load", pos[0], &req, json, &rep);
    if (rc >= 0)
        return rc;
    const Wbproto__ModelInfo *m = rep->load->model;
    if (!m) {
        fprintf(stderr, "wbctl: load: the broker's reply carries no model\n");
        rc = WBCTL_EXIT_UNAVAILABLE;
    } else if (json) {
        rc = wbctl_print_json(wbctl_model_json(m));
    } else {
        wbctl_table t = {.ncols = WBCTL_MODEL_COLUMNS};
        wbctl_model_header(&t);
        wbctl_model_row(&t, m);
        wbctl_table_print(&t);
        wbctl_model_failures(m);
        wbctl_print_stages(m);
        if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING) {
            char *n = wbctl_escape(m->name);
            printf("%s is loading in the broker: `wbctl models` shows how it goes, `wbctl cancel "
                   "%s` stops it\n",
                   n ? n : "?", n ? n : "?");
            free(n);
        }
        rc = WBCTL_EXIT_OK;
    }
    wb__reply_free(&rep);
    return rc;
}

/* A version made current (a rollout's or a rollback's reply), for people:
 * the table row of the new version and which one it replaced. */
static int print_versioned(const Wbproto__ModelInfo *m, uint32_t previous, double current_at,
                           int json, const char *verb)
{
    if (json) {
        json_t *o = wbctl_model_json(m);
        json_object_set_new(o, "previous_version", json_integer(previous));
        json_object_set_new(o, "current_at", json_real(wbctl_round_time(current_at)));
        return wbctl_print_json(o);
    }
    wbctl_table t = {.ncols = WBCTL_MODEL_COLUMNS};
    wbctl_model_header(&t);
    wbctl_model_row(&t, m);
    wbctl_table_print(&t);
    wbctl_model_failures(m);
    char *n = wbctl_escape(m->name);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING)
        printf("version %u of %s is loading beside version %u: `wbctl models` shows how it goes, "
               "`wbctl cancel %s` stops it\n",
               m->version, n ? n : "?", previous, n ? n : "?");
    else if (previous)
        printf("%s: version %u is current, version %u %s\n", verb, m->version, previous,
               "drains (freed at its last lease)");
    else
        printf("%s: version %u is current\n", verb, m->version);
    free(n);
    return WBCTL_EXIT_OK;
}

int wbctl_rollout(const wbctl_globals *g, int argc, char **argv)
{
    static const char *const names[] = {"NAME", "PATH"};
    int json;
    char *pos[2];
    int no_wait = take_flag(&argc, argv, "--no-wait");
    int rc = wbctl_parse_args(
        argc, argv, "rollout [--json] [--no-wait] NAME PATH[@DEVICES]",
        "Loads the checkpoint PATH as a new version of model NAME beside its current one\n"
        "(the same checks and loader as `wbctl load`) and, once it is ready, makes it\n"
        "current: new leases get it, leases keep the version they have, and the version it\n"
        "replaces drains and is freed at its last lease. A rollout that fails leaves the\n"
        "current version as it was; one that does not fit beside it is refused before\n"
        "anything is allocated. Waits as `wbctl load` does. @DEVICES places the copies\n"
        "(default: where the current version is).\n\n"
        "  --no-wait  return once the new version is loading",
        2, names, &json, pos);
    if (rc >= 0)
        return rc;
    char abs[PATH_MAX], *placement;
    if ((rc = path_and_placement("rollout", pos[1], abs, &placement)) >= 0)
        return rc;
    Wbproto__RolloutRequest body = WBPROTO__ROLLOUT_REQUEST__INIT;
    body.name = pos[0];
    body.path = abs;
    body.placement = placement ? placement : "";
    body.no_wait = no_wait;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_ROLLOUT;
    req.rollout = &body;
    Wbproto__Reply *rep;
    rc = no_wait ? wbctl_call(g, "rollout", &req, g->timeout_ms, &rep)
                 : load_and_wait(g, "rollout", pos[0], &req, json, &rep);
    if (rc >= 0)
        return rc;
    const Wbproto__RolloutReply *rr = rep->rollout;
    rc = print_versioned(rr->model, rr->previous_version, rr->current_at, json, "rollout");
    if (!json && rr->model->state != WBPROTO__MODEL_STATE__MODEL_LOADING)
        wbctl_print_stages(rr->model);
    wb__reply_free(&rep);
    return rc;
}

int wbctl_rollback(const wbctl_globals *g, int argc, char **argv)
{
    static const char *const names[] = {"NAME"};
    int json;
    char *pos[1];
    int rc = wbctl_parse_args(
        argc, argv, "rollback [--json] NAME",
        "Makes the previous version of model NAME current again (the highest below the\n"
        "current one that still exists): new leases get it, and the version it replaces\n"
        "drains. A version that is no longer current lives only while leases hold it:\n"
        "with none left, the rollback is refused (exit 1).",
        1, names, &json, pos);
    if (rc >= 0)
        return rc;
    Wbproto__RollbackRequest body = WBPROTO__ROLLBACK_REQUEST__INIT;
    body.name = pos[0];
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_ROLLBACK;
    req.rollback = &body;
    Wbproto__Reply *rep;
    if ((rc = wbctl_call(g, "rollback", &req, g->timeout_ms, &rep)) >= 0)
        return rc;
    const Wbproto__RollbackReply *rr = rep->rollback;
    rc = print_versioned(rr->model, rr->previous_version, rr->current_at, json, "rollback");
    wb__reply_free(&rep);
    return rc;
}

/* unload, and cancel (an unload that only stops a load in progress). */
static int unload(const wbctl_globals *g, int argc, char **argv, int cancel_only)
{
    static const char *const names[] = {"NAME"};
    int json;
    char *pos[1];
    int rc = wbctl_parse_args(
        argc, argv, cancel_only ? "cancel [--json] NAME" : "unload [--json] NAME",
        cancel_only
            ? "Stops the load of model NAME, which must be loading (its first load, or a\n"
              "rollout's new version): the broker frees what it had loaded and removes that\n"
              "version, and a `wbctl load` or `wbctl rollout` waiting for it fails saying who\n"
              "cancelled it. A model with nothing loading is refused (exit 1): unload it instead."
            : "Unloads model NAME, every version of it: a version is freed at once when no\n"
              "lease holds it, else it drains (new leases are refused) and is freed when its\n"
              "last lease ends. A version that is loading has its load stopped and is freed;\n"
              "the record of a failed load is removed.",
        1, names, &json, pos);
    if (rc >= 0)
        return rc;
    const char *op = cancel_only ? "cancel" : "unload";
    Wbproto__UnloadRequest body = WBPROTO__UNLOAD_REQUEST__INIT;
    body.name = pos[0];
    body.cancel_only = cancel_only;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    req.unload = &body;
    Wbproto__Reply *rep;
    if ((rc = wbctl_call(g, op, &req, g->timeout_ms, &rep)) >= 0)
        return rc;
    const Wbproto__ModelInfo *m = rep->unload->model;
    if (!m) {
        fprintf(stderr, "wbctl: %s: the broker's reply carries no model\n", op);
        rc = WBCTL_EXIT_UNAVAILABLE;
    } else if (json) {
        json_t *o = wbctl_model_json(m);
        json_object_set_new(o, "load_cancelled", json_boolean(rep->unload->load_cancelled));
        rc = wbctl_print_json(o);
    } else {
        char *n = wbctl_escape(m->name);
        if (cancel_only)
            printf("cancelled the load of %s\n", n ? n : "?");
        else if (rep->unload->load_cancelled && m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
            printf("draining (%u lease%s; the load of a new version was cancelled)\n", m->leases,
                   m->leases == 1 ? "" : "s");
        else if (rep->unload->load_cancelled)
            printf("freed (its load was cancelled)\n");
        else if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
            printf("draining (%u lease%s)\n", m->leases, m->leases == 1 ? "" : "s");
        else
            printf("%s\n", wb__model_state_name(m->state));
        free(n);
        rc = WBCTL_EXIT_OK;
    }
    wb__reply_free(&rep);
    return rc;
}

int wbctl_unload(const wbctl_globals *g, int argc, char **argv)
{
    return unload(g, argc, argv, 0);
}

int wbctl_cancel(const wbctl_globals *g, int argc, char **argv)
{
    return unload(g, argc, argv, 1);
}
