#include "broker.h"
#include "tier.h"

#include "auth_files.h"
#include "clock.h"
#include "log.h"
#include "publish.h"
#include "share.h"
#include "placement.h"
#include "wire.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

void wb__broker_init(wb_broker *b, const wb_broker_config *cfg)
{
    memset(b, 0, sizeof *b);
    b->cfg = *cfg;
    if (!b->cfg.backend)
        b->cfg.backend = &wb__backend_host;
    if (b->cfg.heartbeat_ms == 0)
        b->cfg.heartbeat_ms = WB_DEFAULT_HEARTBEAT_MS;
    if (b->cfg.stale_ms == 0)
        b->cfg.stale_ms = WB_DEFAULT_STALE_MS;
    if (b->cfg.max_heartbeat_rate == 0)
        b->cfg.max_heartbeat_rate = WB_DEFAULT_HEARTBEAT_RATE;
    b->pace.interval_ms = b->cfg.heartbeat_ms;
    b->pace.stale_ms = b->cfg.stale_ms;
    wb__leases_init(&b->leases);
    b->euid = (uint32_t)geteuid();
    b->pid = (uint32_t)getpid();
    /* Without randomness the pid and start time still tell runs apart. */
    if (getrandom(&b->instance, sizeof b->instance, GRND_NONBLOCK) != (ssize_t)sizeof b->instance)
        b->instance = ((uint64_t)b->pid << 32) ^ (uint64_t)wb__clock_mono_ms();
    if (b->instance == 0)
        b->instance = 1;
    wb__auth_init_open(&b->auth, b->euid);
    wb__limits_default(&b->limits);
    b->slab_gid = -1;
    b->now_ms = wb__clock_mono_ms;
    b->now_wall = wb__clock_wall;
    b->started_ms = b->now_ms();
    /* Out of memory: nothing is shared. */
    if (!b->cfg.no_share_tensors)
        b->share = wb__share_index_new(b->cfg.share_ignore_digest);
}

void wb__broker_destroy(wb_broker *b)
{
    wb__leases_destroy(&b->leases);
    wb__publish_clear(b);
    wb__models_clear(&b->models);
    wb__share_index_free(&b->share);
    wb__subs_destroy(&b->subs);
    wb__auth_destroy(&b->auth);
}

void wb__broker_free_model(wb_broker *b, wb_model *m)
{
    char q[300];
    wb__log_quote(q, sizeof q, m->name);
    /* A version freed while another of its name serves. */
    const wb_model *cur = wb__models_current(&b->models, m->name);
    if (cur && cur != m)
        wb_info("model_version_freed", "model=%s version=%u current=%u bytes=%llu", q, m->version,
                cur->version, (unsigned long long)m->data.bytes);
    wb_info("model_freed", "model=%s bytes=%llu version=%u", q, (unsigned long long)m->data.bytes,
            m->version);
    wb__models_remove(&b->models, m);
    wb__model_free(&m);
}

/* Drops a lease from its copy's count. */
static void copy_lease_ended(wb_model *m, unsigned copy)
{
    if (copy < m->data.n_copies && m->data.copies[copy].leases > 0)
        m->data.copies[copy].leases--;
}

int wb__broker_lease_ended(wb_broker *b, wb_model *m, unsigned copy)
{
    copy_lease_ended(m, copy);
    if (m->leases > 0)
        m->leases--;
    wb__tier_touch(b, m);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING && m->leases == 0) {
        wb__broker_free_model(b, m);
        return WBPROTO__MODEL_STATE__MODEL_FREED;
    }
    return m->state;
}

typedef struct reclaim_ctx {
    wb_broker *b;
    const char *reason;
} reclaim_ctx;

static void on_reclaim(wb_lease_rec *l, void *arg)
{
    const reclaim_ctx *rc = arg;
    wb_broker *b = rc->b;
    char hex[9], q[300], qc[80], name[32];
    wb_info("lease_reclaim", "reason=%s lease=%s model=%s pid=%s comm=%s", rc->reason,
            wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, l->model->name),
            wb__peer_name(l->pid, name, sizeof name), wb__log_quote(qc, sizeof qc, l->comm));
    b->stats.leases_reclaimed++;
    /* Only count here: freeing a model waits until the lease table has
     * finished walking this pid's leases. */
    copy_lease_ended(l->model, l->copy);
    if (l->model->leases > 0)
        l->model->leases--;
}

size_t wb__broker_reclaim_pid(wb_broker *b, uint32_t pid)
{
    return wb__broker_reclaim_why(b, pid, "process_exit");
}

size_t wb__broker_reclaim_why(wb_broker *b, uint32_t pid, const char *reason)
{
    reclaim_ctx rc = {b, reason};
    wb__publish_pid_dead(b, pid);
    size_t n = wb__leases_reclaim_pid(&b->leases, pid, on_reclaim, &rc);
    wb_model *m = b->models.head;
    while (m) {
        wb_model *next = m->next;
        if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING && m->leases == 0)
            wb__broker_free_model(b, m);
        m = next;
    }
    return n;
}

size_t wb__broker_check_peer(wb_broker *b, uint32_t pid)
{
    const wb_peer_rec *p = wb__leases_peer(&b->leases, pid);
    if (!p || !wb__pidfd_exited(p->pidfd))
        return 0;
    wb_info("peer_exited", "pid=%u reason=before_request leases=%u", pid, p->leases);
    return wb__broker_reclaim_pid(b, pid);
}

static void on_stale(wb_lease_rec *l, void *arg)
{
    wb_broker *b = arg;
    char hex[9], q[300], qc[80];
    wb_warn("lease_stale", "lease=%s model=%s pid=%u comm=%s silent_ms=%lld",
            wb__lease_id_short(l->id, hex), wb__log_quote(q, sizeof q, l->model->name), l->pid,
            wb__log_quote(qc, sizeof qc, l->comm), (long long)(b->now_ms() - l->last_beat_ms));
}

void wb__broker_pace_heartbeats(wb_broker *b, size_t peers, int64_t now_ms)
{
    uint64_t base = b->cfg.heartbeat_ms;
    /* ms between one peer's heartbeats for the rate to hold. */
    uint64_t need =
        ((uint64_t)peers * 1000 + b->cfg.max_heartbeat_rate - 1) / b->cfg.max_heartbeat_rate;
    uint64_t factor = need > base ? (need + base - 1) / base : 1;
    uint64_t interval = base * factor, stale = (uint64_t)b->cfg.stale_ms * factor;
    if (interval > 86400000)
        interval = 86400000;
    if (stale > 864000000)
        stale = 864000000;
    if (interval == b->pace.interval_ms)
        return;
    if (stale < b->pace.stale_ms) {
        /* Peers learn the shorter interval from their next heartbeat reply,
         * up to one old interval from now: until then a silence is judged
         * by the old window. */
        uint32_t old = b->pace.stale_ms;
        if (now_ms < b->pace.old_until_ms && b->pace.old_stale_ms > old)
            old = b->pace.old_stale_ms;
        b->pace.old_stale_ms = old;
        b->pace.old_until_ms = now_ms + old;
    }
    wb_debug("heartbeat_pace", "peers=%zu heartbeat_ms=%llu stale_ms=%llu", peers,
             (unsigned long long)interval, (unsigned long long)stale);
    b->pace.interval_ms = (uint32_t)interval;
    b->pace.stale_ms = (uint32_t)stale;
}

size_t wb__broker_scan_stale(wb_broker *b)
{
    int64_t now = b->now_ms();
    uint32_t window = b->pace.stale_ms;
    if (now < b->pace.old_until_ms && b->pace.old_stale_ms > window)
        window = b->pace.old_stale_ms;
    return wb__leases_mark_stale(&b->leases, now, window, on_stale, b);
}

/* Gives the model's host slabs and its shared tensor table to the socket's
 * group, so that peers who may connect may also map them. A failure leaves
 * the broker's group and is logged: clients in that group still work (and
 * others fall back to receiving the table). */
void wb__broker_share_slabs(wb_broker *b, wb_model *m)
{
    char q[300], qe[WB_ERR_MSG_MAX + 64];
    for (uint32_t i = 0; i <= m->data.n_slabs; i++) {
        const char *name = i < m->data.n_slabs ? m->data.slabs[i].shm.name : m->table_shm.name;
        if (!name[0])
            continue;
        wb_err err;
        if (wb__auth_share_slab(name, (uint32_t)b->slab_gid, &err) != WB_OK)
            wb_warn("slab_group", "model=%s gid=%lld error=%s", wb__log_quote(q, sizeof q, m->name),
                    (long long)b->slab_gid, wb__log_quote(qe, sizeof qe, err.msg));
    }
}

/* A load that did not make its model ready: the model is removed, or
 * kept as a failed record with the error when nobody waits to be told. */
static void drop_loading(wb_broker *b, wb_model *m, const wb_load_job *job)
{
    if (job->keep_failed) {
        wb__model_fail(m, job->err.msg);
        return;
    }
    wb__models_remove(&b->models, m);
    wb__model_free(&m);
}

/* A rollout whose load failed or was refused: counted and logged; the
 * current version serves on as it was. */
static void rollout_failed(wb_broker *b, const wb_load_job *job)
{
    char q[300], qe[WB_ERR_MSG_MAX + 64];
    b->stats.rollouts_failed++;
    wb_warn("model_rollout_failed", "model=%s version=%u current=%u status=%s error=%s",
            wb__log_quote(q, sizeof q, job->name), job->version, job->beside,
            wb_status_name(job->rc), wb__log_quote(qe, sizeof qe, job->err.msg));
}

/* The end of a load whose model was unloaded while it ran: what it made
 * goes now, and its request learns who stopped it. */
static int load_stopped(wb_load_job *job)
{
    char q[300], who[32];
    wb__model_data_free(&job->data, job->backend);
    wb__peer_name(job->cancel_pid, who, sizeof who);
    wb_info("model_load_stopped", "model=%s", wb__log_quote(q, sizeof q, job->name));
    if (job->cancelled == WB_LOAD_UNLOADED)
        return job->rc = wb__err_set(&job->err, WB_ESTATE,
                                     "the load of model '%s' was cancelled: pid %s (uid %u) "
                                     "unloaded the model",
                                     job->name, who, job->cancel_uid);
    return job->rc = wb__err_set(&job->err, WB_ESTATE,
                                 "the load of model '%s' was cancelled by pid %s (uid %u)",
                                 job->name, who, job->cancel_uid);
}

void wb__broker_share_bytes(const wb_broker *b, uint64_t *logical, uint64_t *unique)
{
    *logical = *unique = 0;
    for (const wb_model *m = b->models.head; m; m = m->next) {
        if (m->tier != 0) /* WB_TIER_DEVICE: others are off their devices */
            continue;
        *logical += m->data.bytes;
        *unique += m->data.bytes - m->data.shared_bytes;
    }
    /* Shared bytes whose first model went stay for the others: resident
     * once, in nobody's own bytes. */
    wb_share_stats ss;
    wb__share_stats(b->share, &ss);
    *unique += ss.orphan_tensor_bytes;
}

int wb__broker_finish_load(wb_broker *b, wb_load_job *job, wb_model **model)
{
    char q[300], qe[WB_ERR_MSG_MAX + 64];
    *model = NULL;
    if (job->cancelled)
        return load_stopped(job);
    wb_model *m = b->models.head;
    while (m && m->job != job)
        m = m->next;
    if (!m || m->state != WBPROTO__MODEL_STATE__MODEL_LOADING) {
        /* Cannot happen: a loading model leaves the registry only through
         * wb__broker_cancel_load. Keep the broker consistent anyway. */
        wb__model_data_free(&job->data, job->backend);
        if (job->rc == WB_OK)
            job->rc = wb__err_set(&job->err, WB_EINTERNAL,
                                  "model '%s' left the registry while it was loading", job->name);
        return job->rc;
    }
    m->job = NULL;
    if (job->refused) {
        /* Refused by its checks, before anything was read: not counted as
         * a load, and the name it reserved is free again. */
        if (job->rollout)
            rollout_failed(b, job);
        drop_loading(b, m, job);
        return job->rc;
    }
    b->stats.loads_total++;
    if (job->rc == WB_OK) {
        job->rc = wb__model_adopt(m, &job->data, &job->err);
        m->access = job->access;
    }
    /* Limits that only the loaded table shows. The slab was already filled,
     * but nobody ever leases it: it is freed with the model below. */
    if (job->rc == WB_OK)
        job->rc = wb__limits_check_tensors(&b->limits, m->name, m->data.n_tensors, &job->err);
    if (job->rc == WB_OK)
        job->rc = wb__limits_check_lease_size(&b->limits, m->name, m->wire_lease_size, &job->err);
    if (job->rc == WB_OK && b->slab_gid >= 0)
        wb__broker_share_slabs(b, m);
    if (job->rc != WB_OK) {
        b->stats.loads_failed++;
        wb_warn("model_load_failed", "model=%s status=%s error=%s version=%u",
                wb__log_quote(q, sizeof q, job->name), wb_status_name(job->rc),
                wb__log_quote(qe, sizeof qe, job->err.msg), job->version);
        if (job->rollout)
            rollout_failed(b, job);
        drop_loading(b, m, job);
        return job->rc;
    }
    b->stats.load_bytes_total += m->data.bytes;
    b->stats.load_seconds_total += m->data.load_seconds;
    wb_info("model_ready",
            "model=%s tensors=%zu bytes=%llu slab_bytes=%llu seconds=%.3f gbps=%.3f backend=%s "
            "open_seconds=%.3f alloc_seconds=%.3f read_seconds=%.3f read_threads=%u version=%u",
            wb__log_quote(q, sizeof q, m->name), m->data.n_tensors,
            (unsigned long long)m->data.bytes, (unsigned long long)m->data.slab_bytes,
            m->data.load_seconds, m->data.load_gbps, m->backend->name, m->data.open_seconds,
            m->data.alloc_seconds, m->data.read_seconds, m->data.read_threads, m->version);
    wb__load_log_stages(m->name, &m->data);
    /* Where the copies are; a copy that failed is a warning, not a failed
     * load: the others serve. */
    for (uint32_t k = 0; k < m->data.n_copies; k++) {
        const wb_model_copy *c = &m->data.copies[k];
        if (c->state == WBPROTO__MODEL_STATE__MODEL_READY)
            wb_info("model_copy",
                    "model=%s device=%d uuid=%s state=ready slab_bytes=%llu "
                    "copy_seconds=%.3f",
                    wb__log_quote(q, sizeof q, m->name), c->device, c->uuid[0] ? c->uuid : "-",
                    (unsigned long long)m->data.slabs[k].size, c->copy_seconds);
        else
            wb_warn("model_copy_failed", "model=%s device=%d uuid=%s error=%s",
                    wb__log_quote(q, sizeof q, m->name), c->device, c->uuid[0] ? c->uuid : "-",
                    wb__log_quote(qe, sizeof qe, c->error));
    }
    /* Current in the turn its load ends: new acquires get it from the next
     * request on, and the version it replaces drains. */
    if (job->rollout)
        wb_info("model_version_ready", "model=%s version=%u previous=%u bytes=%llu seconds=%.3f", q,
                m->version, job->beside, (unsigned long long)m->data.bytes, m->data.load_seconds);
    job->previous = wb__broker_make_current(b, m);
    job->current_at = b->now_wall();
    if (job->rollout)
        b->stats.rollouts_total++;
    *model = m;
    return WB_OK;
}

void wb__broker_cancel_load(wb_broker *b, wb_model *m, const wb_peer_creds *peer, int how)
{
    char q[300], who[32];
    wb_load_job *job = m->job;
    int queued = 0;
    unsigned long long landed = 0, total = 0;
    if (m->publish) {
        wb__publish_unloaded(b, m, peer);
        return;
    }
    if (job) {
        job->cancelled = how;
        job->cancel_pid = peer->pid;
        job->cancel_uid = peer->uid;
        landed = atomic_load(&job->progress.landed);
        total = atomic_load(&job->progress.total);
        /* Without a loader the load runs inline and has ended before any
         * request can name its model. */
        if (b->loader)
            queued = wb__loader_cancel(b->loader, job);
        else
            atomic_store(&job->cancel, 1);
        m->job = NULL;
    }
    b->stats.loads_cancelled++;
    wb_info("model_load_cancelled",
            "model=%s by=%s pid=%s uid=%u started=%s loaded_bytes=%llu total_bytes=%llu",
            wb__log_quote(q, sizeof q, m->name), how == WB_LOAD_UNLOADED ? "unload" : "cancel",
            wb__peer_name(peer->pid, who, sizeof who), peer->uid, queued ? "no" : "yes", landed,
            total);
    wb__models_remove(&b->models, m);
    wb__model_free(&m);
}

int wb__broker_keep_failed(wb_broker *b, const char *name, const char *path, const char *why,
                           wb_err *err)
{
    wb_model *old = wb__models_find(&b->models, name);
    if (old && old->state != WBPROTO__MODEL_STATE__MODEL_FAILED)
        return wb__err_set(err, WB_EEXIST, "a model named '%s' already exists (%s)", name,
                           wb__model_state_name(old->state));
    wb_model *m = wb__model_new(name, path, b->cfg.backend, b->cfg.device);
    if (!m)
        return wb__err_set(err, WB_ENOMEM, "out of memory recording the failed model '%s'", name);
    wb__model_fail(m, why);
    if (old) {
        wb__models_remove(&b->models, old);
        wb__model_free(&old);
    }
    wb__models_add(&b->models, m);
    return WB_OK;
}

void wb__broker_check_job(const wb_broker *b, const wb_peer_creds *peer, wb_load_job *job)
{
    job->check = 1;
    job->limits = b->limits;
    job->access = wb__auth_load_access(peer);
}

void wb__broker_count_request(wb_broker *b, uint32_t op, int status)
{
    wb_broker_stats *st = &b->stats;
    for (size_t i = 0; i < st->n_by_op; i++) {
        if (st->by_op[i].op == op && st->by_op[i].status == status) {
            st->by_op[i].n++;
            return;
        }
    }
    /* A full table would take more pairs than the protocol's operations
     * and statuses make in practice; requests_total still counts them. */
    if (st->n_by_op < WB_REQUEST_COUNTERS)
        st->by_op[st->n_by_op++] = (wb_request_count){.op = op, .status = status, .n = 1};
}

void wb__broker_set_devices(const wb_broker *b, wb_model *m, wb_load_job *job, const int *devices,
                            unsigned n)
{
    wb__model_set_devices(m, devices, n);
    memcpy(job->devices, devices, n * sizeof *devices);
    job->n_devices = n;
    job->gpus = &b->cfg.gpus;
    job->share = job->no_share ? NULL : b->share;
    if (!job->share)
        m->no_share = 1;
    job->budget = b->budget;
}

int wb__broker_placement(const wb_broker *b, const char *name, const char *placement, int *devices,
                         unsigned *n, wb_err *err)
{
    *n = 1;
    devices[0] = b->cfg.device;
    if (b->cfg.backend->proto == WBPROTO__BACKEND__BACKEND_HOST) {
        devices[0] = -1;
        if (placement && placement[0]) {
            char q[300], qp[300];
            wb_info("placement_ignored",
                    "model=%s placement=%s reason=\"the host backend keeps "
                    "one copy in host memory\"",
                    wb__log_quote(q, sizeof q, name), wb__log_quote(qp, sizeof qp, placement));
        }
        return WB_OK;
    }
    if (!placement || !placement[0])
        return WB_OK;
    wb_placement p;
    wb_err e;
    int rc = wb__placement_parse(placement, strlen(placement), &p, &e);
    if (rc == WB_OK)
        rc = wb__placement_resolve(&p, &b->cfg.gpus, devices, n, &e);
    if (rc != WB_OK)
        return wb__err_set(err, rc, "model '%s': %s", name, e.msg);
    return WB_OK;
}

int wb__broker_preload(wb_broker *b, const char *name, const char *path, const char *placement,
                       wb_err *err)
{
    char q[300], qp[WB_PATH_MAX + 64];
    wb_model *old = wb__models_find(&b->models, name);
    if (old && old->state != WBPROTO__MODEL_STATE__MODEL_FAILED)
        return wb__err_set(err, WB_EEXIST, "a model named '%s' already exists", name);
    int rc0 = wb__limits_check_models(&b->limits, wb__models_held(&b->models), err);
    if (rc0 != WB_OK)
        return rc0;
    int devices[WB_GPU_MAX];
    unsigned n_devices = 0;
    if ((rc0 = wb__broker_placement(b, name, placement, devices, &n_devices, err)) != WB_OK)
        return rc0;
    wb_model *m = wb__model_new(name, path, b->cfg.backend, b->cfg.device);
    wb_load_job *job = wb__load_job_new(name, path, b->cfg.backend, b->cfg.device, NULL, 0, 0);
    if (!m || !job) {
        wb__model_free(&m);
        wb__load_job_free(&job);
        return wb__err_set(err, WB_ENOMEM, "out of memory loading '%s'", name);
    }
    if (old) {
        wb__models_remove(&b->models, old);
        wb__model_free(&old);
    }
    wb__broker_set_devices(b, m, job, devices, n_devices);
    wb__broker_check_job(b, NULL, job);
    wb__models_add(&b->models, m);
    m->job = job;
    wb_info("model_load_start", "model=%s path=%s backend=%s", wb__log_quote(q, sizeof q, name),
            wb__log_quote(qp, sizeof qp, path), b->cfg.backend->name);
    wb__load_job_run(job, b->cancel_preloads);
    /* Refused for the budget: room is made (inline) and it runs again. */
    if (wb__tier_load_back(b, job) == 2)
        wb__load_job_run(job, b->cancel_preloads);
    wb_model *ready;
    int rc = wb__broker_finish_load(b, job, &ready);
    if (rc != WB_OK)
        wb__err_set(err, rc, "%s", job->err.msg);
    wb__load_job_free(&job);
    return rc;
}
