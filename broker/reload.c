#include "reload.h"

#include "log.h"
#include "paths.h"
#include "stage.h"
#include "wire.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

/* The numeric options that change live: the limits reload.h names. */
static const wb_num_opt live_nums[] = {WB_NUM_MAX_LEASES,  WB_NUM_MAX_MODELS, WB_NUM_MAX_VERSIONS,
                                       WB_NUM_MAX_TENSORS, WB_NUM_MAX_SHARDS, WB_NUM_MAX_HEADER};

static int is_live(wb_num_opt k)
{
    for (size_t i = 0; i < sizeof live_nums / sizeof live_nums[0]; i++) {
        if (live_nums[i] == k)
            return 1;
    }
    return 0;
}

/* The wb_limits field a live option sets. */
static uint64_t limit_of(const wb_limits *l, wb_num_opt k)
{
    switch (k) {
    case WB_NUM_MAX_LEASES:
        return l->max_leases_per_client;
    case WB_NUM_MAX_MODELS:
        return l->max_models;
    case WB_NUM_MAX_VERSIONS:
        return l->max_versions;
    case WB_NUM_MAX_TENSORS:
        return l->max_tensors;
    case WB_NUM_MAX_SHARDS:
        return l->max_shards;
    case WB_NUM_MAX_HEADER:
        return l->max_header;
    default:
        return 0;
    }
}

/* Appends one "key=value" item to a space-separated list; an item that does
 * not fit ends the list with "...". */
__attribute__((format(printf, 3, 4))) static void item(char *list, size_t size, const char *fmt,
                                                       ...)
{
    size_t used = strlen(list);
    if (used + 4 >= size || (used >= 3 && strcmp(list + used - 3, "...") == 0))
        return;
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (used + (used ? 1 : 0) + strlen(buf) >= size - 4) {
        snprintf(list + used, size - used, "%s...", used ? " " : "");
        return;
    }
    snprintf(list + used, size - used, "%s%s", used ? " " : "", buf);
}

static int same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static const char *level_name(int level)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "off"};
    return level >= 0 && level <= WB_LOG_OFF ? names[level] : "info";
}

/* An access list as the options name it: numeric ids, "none" when empty. */
static void add_list(char *list, size_t size, const char *key, const wb_id_list *l)
{
    char ids[1024] = "";
    size_t used = 0, i = 0;
    for (; i < l->n && used + 16 < sizeof ids; i++)
        used +=
            (size_t)snprintf(ids + used, sizeof ids - used, "%s%" PRIu32, i ? "," : "", l->ids[i]);
    if (i < l->n)
        snprintf(ids + used, sizeof ids - used, ",...");
    item(list, size, "%s=%s", key, l->n ? ids : "none");
}

static int same_list(const wb_id_list *a, const wb_id_list *b)
{
    return a->n == b->n && (a->n == 0 || memcmp(a->ids, b->ids, a->n * sizeof *a->ids) == 0);
}

static const char *cuda_slab_name(int s)
{
    return s == WB_CUDA_SLAB_IPC ? "ipc" : s == WB_CUDA_SLAB_VMM ? "vmm" : "default";
}

/* The preloaded models: added, removed or changed ones, by name. */
static void plan_models(const wb_options *running, const wb_options *next, char *list, size_t size)
{
    for (size_t i = 0; i < next->n_models; i++) {
        const wb_preload *m = &next->models[i], *was = NULL;
        for (size_t j = 0; j < running->n_models && !was; j++) {
            if (strcmp(running->models[j].name, m->name) == 0)
                was = &running->models[j];
        }
        if (was && strcmp(was->path, m->path) == 0 && same_str(was->placement, m->placement))
            continue;
        item(list, size, "model.%s=%s%s%s", m->name, m->path, m->placement ? "@" : "",
             m->placement ? m->placement : "");
    }
    for (size_t j = 0; j < running->n_models; j++) {
        int kept = 0;
        for (size_t i = 0; i < next->n_models && !kept; i++)
            kept = strcmp(running->models[j].name, next->models[i].name) == 0;
        if (!kept)
            item(list, size, "model.%s=removed", running->models[j].name);
    }
}

/* What cannot change while the broker serves: compared with the options it
 * started with. */
static void plan_restart(const wb_options *running, const wb_options *next, char *list, size_t size)
{
    char was[sizeof(((struct sockaddr_un *)0)->sun_path)], now[sizeof was];
    if (wb__socket_path(running->socket, was, sizeof was) != WB_OK ||
        wb__socket_path(next->socket, now, sizeof now) != WB_OK || strcmp(was, now) != 0)
        item(list, size, "socket=%s", now);
    if (!same_str(running->backend, next->backend))
        item(list, size, "backend=%s", next->backend);
    if (running->device != next->device)
        item(list, size, "device=%d", next->device);
    if (running->host_memfd != next->host_memfd)
        item(list, size, "host-slab=%s", next->host_memfd ? "memfd" : "shm");
    if (running->cuda_slab != next->cuda_slab)
        item(list, size, "cuda-slab=%s", cuda_slab_name(next->cuda_slab));
    if (running->load_mode != next->load_mode)
        item(list, size, "load-method=%s",
             next->load_mode ? wb__stage_mode_name(next->load_mode) : "default");
    if (running->read_source != next->read_source)
        item(list, size, "read-source=%s",
             next->read_source ? wb__stage_read_name(next->read_source) : "default");
    if (running->staging_pages != next->staging_pages)
        item(list, size, "staging-pages=%s",
             next->staging_pages ? wb__stage_pages_name(next->staging_pages) : "default");
    if (running->staging_demote != next->staging_demote)
        item(list, size, "staging-demote=%s",
             next->staging_demote ? wb__stage_demote_name(next->staging_demote) : "default");
    for (int k = 0; k < WB_NUM_OPTS; k++) {
        if (is_live((wb_num_opt)k) || running->num[k] == next->num[k])
            continue;
        if (next->num[k])
            item(list, size, "%s=%ld", wb__options_num_name((wb_num_opt)k), next->num[k]);
        else
            item(list, size, "%s=default", wb__options_num_name((wb_num_opt)k));
    }
    if (running->log_format != next->log_format)
        item(list, size, "log-format=%s", next->log_format == WB_LOG_JSON ? "json" : "text");
    if (!same_str(running->metrics, next->metrics))
        item(list, size, "metrics=%s", next->metrics ? next->metrics : "off");
    plan_models(running, next, list, size);
}

void wb__reload_plan(const wb_options *running, const wb_broker *b, const wb_options *next,
                     wb_reload_plan *plan)
{
    plan->applied[0] = plan->not_applied[0] = '\0';
    wb_limits want;
    wb__options_limits(next, &want);
    plan->limits = b->limits;
    for (size_t i = 0; i < sizeof live_nums / sizeof live_nums[0]; i++) {
        wb_num_opt k = live_nums[i];
        uint64_t v = limit_of(&want, k);
        if (v == limit_of(&b->limits, k))
            continue;
        item(plan->applied, sizeof plan->applied, "%s=%" PRIu64, wb__options_num_name(k), v);
    }
    plan->limits.max_leases_per_client = want.max_leases_per_client;
    plan->limits.max_models = want.max_models;
    plan->limits.max_versions = want.max_versions;
    plan->limits.max_tensors = want.max_tensors;
    plan->limits.max_shards = want.max_shards;
    plan->limits.max_header = want.max_header;

    static const char *const keys[] = {"allow-uid", "allow-gid",     "admin-uid",
                                       "admin-gid", "publisher-uid", "publisher-gid"};
    for (int i = 0; i < WB_AUTH_N_LISTS; i++) {
        if (!same_list(&b->auth.lists[i], &next->auth.lists[i]))
            add_list(plan->applied, sizeof plan->applied, keys[i], &next->auth.lists[i]);
    }
    plan->log_level = next->log_level >= 0 ? next->log_level : WB_LOG_INFO;
    if (plan->log_level != (int)wb__log_get_level())
        item(plan->applied, sizeof plan->applied, "log-level=%s", level_name(plan->log_level));

    plan_restart(running, next, plan->not_applied, sizeof plan->not_applied);
}

void wb__reload_apply(wb_broker *b, wb_options *next, const wb_reload_plan *plan)
{
    b->limits = plan->limits;
    /* The whole of it, so that nothing of the old lists survives. */
    wb__auth_destroy(&b->auth);
    b->auth = next->auth;
    memset(&next->auth, 0, sizeof next->auth);
    wb__log_set_level((wb_log_level)plan->log_level);
}

void wb__reload(void *ctx, wb_broker *b)
{
    wb_options *running = ctx;
    if (!running->config_file) {
        wb_info("config_reload",
                "result=skipped note=\"started without --config: there is nothing to reload\"");
        return;
    }
    char qf[WB_PATH_MAX + 64];
    wb__log_quote(qf, sizeof qf, running->config_file);
    wb_options next;
    wb_err err;
    if (wb__options_reparse(running, &next, &err) != WB_OK) {
        char qe[WB_ERR_MSG_MAX + 1400];
        wb_error("config_reload",
                 "file=%s result=failed error=%s note=\"the running settings are kept\"", qf,
                 wb__log_quote(qe, sizeof qe, err.msg));
        wb__options_free(&next);
        return;
    }
    wb_reload_plan plan;
    wb__reload_plan(running, b, &next, &plan);
    char qa[sizeof plan.applied + 64], qn[sizeof plan.not_applied + 64];
    wb__log_quote(qa, sizeof qa, plan.applied);
    wb__log_quote(qn, sizeof qn, plan.not_applied);
    /* Logged before the level changes, so that a reload that raises the
     * level still says so. */
    if (plan.not_applied[0] && plan.applied[0])
        wb_warn("config_reload",
                "file=%s result=applied changed=%s not_applied=%s note=\"restart to apply\"", qf,
                qa, qn);
    else if (plan.not_applied[0])
        wb_warn("config_reload",
                "file=%s result=restart_needed not_applied=%s note=\"restart to apply\"", qf, qn);
    else if (plan.applied[0])
        wb_info("config_reload", "file=%s result=applied changed=%s", qf, qa);
    else
        wb_info("config_reload", "file=%s result=unchanged", qf);
    wb__reload_apply(b, &next, &plan);
    wb__options_free(&next);
}
