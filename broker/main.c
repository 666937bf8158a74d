/* wbrokerd: the weightbroker daemon. Loads models into shared memory and
 * leases them to worker processes over a ZeroMQ ipc:// socket. It does not
 * fork itself; run it under a supervisor.
 *
 * parse -> validate -> run: the options (options.c) are read and checked as
 * a whole before anything starts. */
#include "auth_files.h"
#include "alloc.h"
#include "backend_pick.h"
#include "backend_vmm.h"
#include "broker.h"
#include "gpu.h"
#include "log.h"
#include "loop.h"
#include "metrics.h"
#include "models.h"
#include "options.h"
#include "paths.h"
#include "reload.h"
#include "safetensors_memo.h"
#include "tier.h"
#include "shm.h"
#include "signals.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <unistd.h>

/* Defaults of the transport bounds (loop.h). */
#define DEFAULT_MAX_REQUEST        (1L << 20)
#define DEFAULT_MAX_BUFFERED       (64L << 20)
#define DEFAULT_MAX_QUEUED_REPLIES 4
#define DEFAULT_MAX_QUEUED_BYTES   (8L << 20)
/* Four of the largest messages. */
#define DEFAULT_MAX_QUEUED_TOTAL (256L << 20)
/* libwbclient holds one connection per client object (a new one after a
 * timeout, the old one closed): no honest process comes near. */
#define DEFAULT_MAX_PER_PROCESS  16
#define DEFAULT_HANDSHAKE_MS     2000
#define DEFAULT_SESSIONS_PER_UID 64
#define MAX_FRAMES               4
/* Descriptors kept for everything but peers: the listener and its spare,
 * the loader's files and eventfd, slabs being created, the metrics server,
 * the signalfd, logs. */
#define RESERVED_FDS  64
#define MAX_PEERS_CAP 4096
/* Raises the soft descriptor limit to the hard one, so that the peer cap
 * derived from it is as high as the system allows. Returns the limit now in
 * force. */
static long raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    rlim_t was = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = was;
    }
    wb_info("fd_limit", "soft=%llu hard=%llu raised_from=%llu", (unsigned long long)rl.rlim_cur,
            (unsigned long long)rl.rlim_max, (unsigned long long)was);
    return rl.rlim_cur > (rlim_t)(1L << 30) ? (1L << 30) : (long)rl.rlim_cur;
}

/* Each peer costs a connection descriptor and, once it leases, a pidfd:
 * half of what the reserve leaves, halved again so that a burst of
 * connections accepted before being closed over the cap finds room. */
static unsigned default_max_peers(long nofile)
{
    long n = (nofile - RESERVED_FDS) / 4;
    if (n < 1)
        n = 1;
    return n > MAX_PEERS_CAP ? MAX_PEERS_CAP : (unsigned)n;
}
/* The transport bounds: given, or derived from the descriptor limit. */
static void transport_from(const wb_options *o, const wb_limits *l, long nofile, wb_loop_options *t)
{
    *t = (wb_loop_options){
        .max_peers = o->num[WB_NUM_MAX_PEERS] ? (unsigned)o->num[WB_NUM_MAX_PEERS]
                                              : default_max_peers(nofile),
        .max_request =
            (size_t)(o->num[WB_NUM_MAX_REQUEST] ? o->num[WB_NUM_MAX_REQUEST] : DEFAULT_MAX_REQUEST),
        .max_frames = MAX_FRAMES,
        .max_buffered = (size_t)(o->num[WB_NUM_MAX_BUFFERED] ? o->num[WB_NUM_MAX_BUFFERED]
                                                             : DEFAULT_MAX_BUFFERED),
        .max_queued_replies =
            o->num[WB_NUM_MAX_QUEUED] ? (int)o->num[WB_NUM_MAX_QUEUED] : DEFAULT_MAX_QUEUED_REPLIES,
        .max_queued_bytes =
            (size_t)(o->num[WB_NUM_MAX_QUEUED_BYTES] ? o->num[WB_NUM_MAX_QUEUED_BYTES]
                                                     : DEFAULT_MAX_QUEUED_BYTES),
        .max_queued_total =
            (size_t)(o->num[WB_NUM_MAX_QUEUED_TOTAL] ? o->num[WB_NUM_MAX_QUEUED_TOTAL]
                                                     : DEFAULT_MAX_QUEUED_TOTAL),
        .max_per_process = o->num[WB_NUM_MAX_PER_PROCESS] ? (unsigned)o->num[WB_NUM_MAX_PER_PROCESS]
                                                          : DEFAULT_MAX_PER_PROCESS,
        .handshake_ms =
            o->num[WB_NUM_HANDSHAKE] ? (unsigned)o->num[WB_NUM_HANDSHAKE] : DEFAULT_HANDSHAKE_MS,
        .max_sessions_per_uid = o->num[WB_NUM_MAX_SESSIONS_PER_UID]
                                    ? (unsigned)o->num[WB_NUM_MAX_SESSIONS_PER_UID]
                                    : DEFAULT_SESSIONS_PER_UID,
    };
    /* One uid never takes every connection: half of them by default. */
    t->max_per_uid = o->num[WB_NUM_MAX_PER_UID] ? (unsigned)o->num[WB_NUM_MAX_PER_UID]
                     : t->max_peers > 1         ? t->max_peers / 2
                                                : 1;
    /* A request is never larger than a message may be. */
    if (t->max_request > l->max_message)
        t->max_request = (size_t)l->max_message;
    if ((long)t->max_peers > (nofile - RESERVED_FDS) / 2)
        wb_warn("config",
                "note=\"--max-peers %u leaves too few of %ld descriptors: some connections will "
                "be closed as soon as accepted\"",
                t->max_peers, nofile);
}

/* A stop signal that came while the broker was starting: logged with what
 * had been loaded, and the run ends cleanly (exit status 0). */
static int stopped_starting(wb_signal_watch *watch, const wb_broker *b, int have_broker)
{
    int signo = wb__signal_watch_stopping(watch);
    if (!signo)
        return 0;
    char buf[32];
    wb_info("stop", "signal=%s while=starting models=%zu", wb__signal_name(signo, buf, sizeof buf),
            have_broker ? b->models.n : 0);
    return 1;
}

/* Starts the broker and serves until a stop signal (signals.h). Everything
 * it creates it destroys on the one way out. Returns the exit status. */
static int run(wb_options *o)
{
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    wb__socket_path(o->socket, socket_path,
                    sizeof socket_path); /* checked by wb__options_validate */

    /* Block the signals before any thread exists, so that only a signalfd
     * sees them: the watcher's while the broker starts (a stop cancels the
     * preload under way), then the loop's. */
    wb__signals_block();
    atomic_int cancel;
    atomic_init(&cancel, 0);
    wb_signal_watch watch;
    wb_err err;
    if (wb__signal_watch_start(&watch, &cancel, &err) != WB_OK) {
        wb__fatal("%s", err.msg);
        return 1;
    }

    int status = 1;
    const wb_backend *backend = NULL;
    wb_metrics *metrics = NULL;
    wb_broker b;
    int have_broker = 0;

    /* The backend, once the signals are blocked: the CUDA runtime starts
     * threads of its own, and they must not take SIGTERM. */
    wb_stage_config stage = {
        .read_threads = (unsigned)o->num[WB_NUM_READ_THREADS],
        .chunk_bytes = (uint64_t)o->num[WB_NUM_STAGING_MIB] << 20,
        .buffers = (unsigned)o->num[WB_NUM_STAGING_BUFFERS],
        .read_source = o->read_source,
        .ring_pages = o->staging_pages,
        .demote = o->staging_demote,
        .register_threads = (unsigned)o->num[WB_NUM_REGISTER_THREADS],
        .copy_batch = (unsigned)o->num[WB_NUM_COPY_BATCH],
    };
    if (wb__backend_pick(o->backend, o->device, &stage, o->load_mode, o->host_memfd, o->cuda_slab,
                         &backend, &err) != WB_OK) {
        wb__fatal("%s", err.msg);
        goto out;
    }
    /* Freed cuda-vmm slabs are kept for the next load of their size. */
    if (backend->slab_alloc == wb__vmm_slab_alloc) {
        long secs = o->no_slab_pool                    ? 0
                    : o->num[WB_NUM_SLAB_POOL_SECONDS] ? o->num[WB_NUM_SLAB_POOL_SECONDS]
                                                       : WB_DEFAULT_SLAB_POOL_SECONDS;
        wb__vmm_pool_start((int64_t)secs * 1000);
        wb_info("slab_pool", "seconds=%.3f transport=cuda-vmm", (double)secs);
    }
    if (o->device_given && backend->proto == WBPROTO__BACKEND__BACKEND_HOST)
        wb_info("config", "note=\"--device is ignored by the host backend\" device=%d", o->device);
    if (wb__socket_prepare(socket_path, &err) != WB_OK) {
        wb__fatal("%s", err.msg);
        goto out;
    }
    int removed = wb__shm_cleanup_stale();
    wb_info("shm_cleanup", "removed=%d", removed);

    wb_broker_config cfg = {
        .backend = backend,
        .device = backend->proto == WBPROTO__BACKEND__BACKEND_HOST ? -1 : o->device,
        .heartbeat_ms = (uint32_t)o->num[WB_NUM_HEARTBEAT],
        .stale_ms = (uint32_t)o->num[WB_NUM_STALE],
        .max_heartbeat_rate = (uint32_t)o->num[WB_NUM_HEARTBEAT_RATE],
        .publish_streams = (uint32_t)o->num[WB_NUM_PUBLISH_STREAMS],
        .no_share_tensors = o->no_share_tensors,
    };
    const char *delay = getenv("WB_TEST_TIER_DELAY_MS");
    if (delay)
        wb__tier_test_delay_ms = atoi(delay);
    const char *ignore = getenv("WB_TEST_SHARE_IGNORE_DIGEST");
    cfg.share_ignore_digest = ignore && strcmp(ignore, "1") == 0;
    /* The devices placements name, with their UUIDs; logged once so that an
     * operator can match ordinals and UUIDs. */
    if (backend->proto != WBPROTO__BACKEND__BACKEND_HOST) {
        if (wb__gpu_list(&cfg.gpus, &err) != WB_OK) {
            wb__fatal("%s", err.msg);
            goto out;
        }
        for (unsigned i = 0; i < cfg.gpus.n; i++)
            wb_info("device", "device=%d uuid=%s default=%s", cfg.gpus.dev[i].index,
                    cfg.gpus.dev[i].uuid, cfg.gpus.dev[i].index == o->device ? "yes" : "no");
    }
    wb__broker_init(&b, &cfg);
    have_broker = 1;
    /* The broker takes the access lists and limits from the options. */
    wb__auth_destroy(&b.auth);
    b.auth = o->auth;
    memset(&o->auth, 0, sizeof o->auth);
    wb__options_limits(o, &b.limits);
    wb_tier_config tcfg = {.device_bytes = o->device_budget,
                           .device_pct = o->device_budget_pct,
                           .host_bytes = o->host_budget,
                           .host_pct = o->host_budget_pct};
    if (wb__tier_setup(&b, &tcfg, &err) != WB_OK) {
        wb__fatal("%s", err.msg);
        goto out;
    }
    b.cancel_preloads = &cancel;
    b.slab_gid = wb__auth_slab_group(socket_path);
    /* The metrics endpoint comes before the preloads, so that a port in use
     * is reported at once rather than after minutes of loading; its first
     * page is rendered before it answers. */
    if (o->metrics &&
        wb__metrics_start(o->metrics, (unsigned)o->num[WB_NUM_METRICS_REQUEST_TIMEOUT], &b,
                          &metrics, &err) != WB_OK) {
        wb__fatal("%s", err.msg);
        goto out;
    }
    b.metrics = metrics;
    char who[256], admins[256];
    wb_info("access", "clients=\"%s\" admins=\"%s\" slab_group=%lld",
            wb__auth_describe_clients(&b.auth, who, sizeof who),
            wb__auth_describe_admins(&b.auth, admins, sizeof admins), (long long)b.slab_gid);
    wb_info("limits",
            "max_leases_per_client=%u max_models=%u max_tensors=%llu max_message_bytes=%llu "
            "max_header_bytes=%llu max_shards=%llu max_versions=%u",
            b.limits.max_leases_per_client, b.limits.max_models,
            (unsigned long long)b.limits.max_tensors, (unsigned long long)b.limits.max_message,
            (unsigned long long)b.limits.max_header, (unsigned long long)b.limits.max_shards,
            b.limits.max_versions);
    /* A model that cannot be loaded is listed as failed, with its error,
     * while the broker serves the others (a missing checkpoint on one node
     * must not take every model of the node down), unless all are
     * required. */
    for (size_t i = 0; i < o->n_models; i++) {
        const wb_preload *pm = &o->models[i];
        if (wb__broker_preload(&b, pm->name, pm->path, pm->placement, &err) == WB_OK)
            continue;
        /* A stop signal cancelled it (b.cancel_preloads). */
        if (stopped_starting(&watch, &b, have_broker)) {
            status = 0;
            goto out;
        }
        if (o->require_all_models) {
            if (pm->line > 0)
                wb__fatal("%s:%d: cannot load model '%s': %s", o->config.file, pm->line, pm->name,
                          err.msg);
            else
                wb__fatal("cannot load model '%s': %s", pm->name, err.msg);
            goto out;
        }
        /* Listed so that `wbctl models` and a lease's refusal say why. */
        char q[300], qe[WB_ERR_MSG_MAX + 64];
        wb_err kerr;
        int listed = wb__broker_keep_failed(&b, pm->name, pm->path, err.msg, &kerr) == WB_OK;
        wb_warn("preload_failed", "model=%s error=%s listed=%s",
                wb__log_quote(q, sizeof q, pm->name), wb__log_quote(qe, sizeof qe, err.msg),
                listed ? "failed" : "no");
    }
    b.cancel_preloads = NULL;
    /* From here the loop's signalfd reads the signals: what came since the
     * watcher's last read is pending for it. */
    wb__signal_watch_end(&watch);
    if (stopped_starting(&watch, &b, have_broker)) {
        status = 0;
        goto out;
    }
    /* Loading may have taken a while: check once more that nobody took the
     * socket meanwhile. */
    if (wb__socket_prepare(socket_path, &err) != WB_OK) {
        wb__fatal("%s", err.msg);
        goto out;
    }
    /* Descriptors: as many as the system allows, and a cap on peers. */
    wb_loop_options lopt;
    transport_from(o, &b.limits, raise_nofile(), &lopt);
    wb_loop_reload reload = {.fn = wb__reload, .ctx = o};
    if (wb__loop_run(&b, socket_path, &lopt, &reload, &err) != WB_OK) {
        wb__fatal("%s", err.msg);
        goto out;
    }
    status = 0;
out:
    wb__signal_watch_end(&watch);
    /* Slab names go with their models; clients keep their own mappings. */
    if (have_broker) {
        wb__tier_destroy(&b);
        wb__broker_destroy(&b);
    }
    /* After the models: their slabs went to the pool. */
    wb__vmm_pool_stop();
    wb__metrics_stop(&metrics);
    if (backend)
        wb__backend_release(&backend);
    /* No load runs any more: the readers' crew goes too. */
    wb__stage_crew_stop();
    return status;
}
int main(int argc, char **argv)
{
    wb__log_set_prog("wbrokerd");
    /* The process is ours: jansson allocates as the rest does. */
    wb__alloc_use_for_jansson();
    /* Reloads of a checkpoint skip the parse of its headers. */
    wb__st_memo_set_limit(WB_ST_MEMO_BROKER_BYTES);
    wb_options o;
    wb__options_init(&o);
    int rc = wb__options_parse(&o, argc, argv);
    if (rc == WB_OPTIONS_GO_ON)
        rc = wb__options_validate(&o);
    if (rc == WB_OPTIONS_GO_ON)
        rc = run(&o);
    wb__options_free(&o);
    wb__st_memo_set_limit(0);
    return rc;
}
