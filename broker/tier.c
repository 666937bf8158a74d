/* The device memory budget and the host tier (tier.h): the budget's
 * arithmetic, the choice of models to move, and the moves, restores and
 * reloads (tier_jobs.c runs them). */
#include "tier.h"

#include "alloc.h"
#include "broker.h"
#include "clock.h"
#include "log.h"
#include "ops_impl.h"
#include "publish.h"
#include "share.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

const char *wb__tier_name(int tier)
{
    switch (tier) {
    case WB_TIER_DEVICE:
        return "device";
    case WB_TIER_MOVING:
        return "moving";
    case WB_TIER_HOST:
        return "host";
    case WB_TIER_RESTORING:
        return "restoring";
    case WB_TIER_EVICTED:
        return "evicted";
    case WB_TIER_RELOADING:
        return "reloading";
    default:
        return "unknown";
    }
}

int wb__tier_parse_size(const char *what, const char *s, uint64_t *bytes, unsigned *pct,
                        wb_err *err)
{
    *bytes = 0;
    *pct = 0;
    char *end = NULL;
    errno = 0;
    if (!s || !*s || *s == '-' || *s == '+')
        goto bad;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        goto bad;
    if (strcmp(end, "%") == 0) {
        if (v < 1 || v > 100)
            return wb__err_set(err, WB_EINVAL, "%s: %s is not a percent from 1 to 100", what, s);
        *pct = (unsigned)v;
        return WB_OK;
    }
    static const struct {
        const char *suffix;
        unsigned long long mult;
    } units[] = {{"", 1},
                 {"k", 1ull << 10},
                 {"K", 1ull << 10},
                 {"M", 1ull << 20},
                 {"G", 1ull << 30},
                 {"T", 1ull << 40},
                 {"kB", 1000ull},
                 {"KB", 1000ull},
                 {"MB", 1000000ull},
                 {"GB", 1000000000ull},
                 {"TB", 1000000000000ull}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) != 0)
            continue;
        if (v == 0 || v > UINT64_MAX / units[i].mult)
            goto bad;
        *bytes = v * units[i].mult;
        return WB_OK;
    }
bad:
    return wb__err_set(err, WB_EINVAL,
                       "%s: '%s' is not a size (BYTES, with k, M, G or T for powers of 1024 "
                       "or kB, MB, GB, TB for powers of 1000) or a percent (N%%)",
                       what, s ? s : "");
}

static unsigned slot_of(int device)
{
    return device < 0 || device >= WB_GPU_MAX ? 0 : (unsigned)device + 1;
}

/* "4.60 GB (4600000000 bytes)", "1.18 MB (1179648 bytes)" */
static const char *gb(char *buf, size_t size, uint64_t n)
{
    if (n >= 1000000000)
        snprintf(buf, size, "%.2f GB (%llu bytes)", (double)n / 1e9, (unsigned long long)n);
    else if (n >= 1000000)
        snprintf(buf, size, "%.2f MB (%llu bytes)", (double)n / 1e6, (unsigned long long)n);
    else
        snprintf(buf, size, "%llu bytes", (unsigned long long)n);
    return buf;
}

static const char *where(char *buf, size_t size, int device)
{
    if (device < 0)
        snprintf(buf, size, "host memory");
    else
        snprintf(buf, size, "device %d", device);
    return buf;
}

int wb__budget_fits(wb_budget *bg, const char *what, const int *devs, unsigned n, uint64_t size,
                    int wait_ms, const atomic_int *cancel, uint64_t *reserved, int *retry,
                    wb_err *err)
{
    *reserved = 0;
    *retry = 0;
    if (!bg)
        return WB_OK;
    int64_t deadline = wb__clock_mono_ms() + (wait_ms > 0 ? wait_ms : 0);
    pthread_mutex_lock(&bg->mu);
    int over = -1;
    for (;;) {
        over = -1;
        for (unsigned k = 0; k < n && over < 0; k++) {
            unsigned s = slot_of(devs[k]);
            if (bg->limit[s] && bg->used[s] + bg->reserved[s] + size > bg->limit[s])
                over = (int)k;
        }
        if (over < 0) {
            for (unsigned k = 0; k < n; k++)
                bg->reserved[slot_of(devs[k])] += size;
            *reserved = size;
            pthread_mutex_unlock(&bg->mu);
            return WB_OK;
        }
        int64_t now = wb__clock_mono_ms();
        if (size > bg->limit[slot_of(devs[over])] || now >= deadline ||
            (cancel && atomic_load(cancel)))
            break;
        int64_t until = now + 50 < deadline ? now + 50 : deadline;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = (int64_t)ts.tv_nsec + (until - now) * 1000000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&bg->cv, &bg->mu, &ts);
    }
    unsigned s = slot_of(devs[over]);
    uint64_t in_use = bg->used[s] + bg->reserved[s], limit = bg->limit[s];
    pthread_mutex_unlock(&bg->mu);
    char w[32], a[64], b[64], c[64];
    *retry = size <= limit;
    if (size > limit)
        return wb__err_set(err, WB_ENOMEM,
                           "%s does not fit the memory budget of %s: it needs %s, more than the "
                           "whole budget of %s",
                           what, where(w, sizeof w, devs[over]), gb(a, sizeof a, size),
                           gb(b, sizeof b, limit));
    return wb__err_set(err, WB_ENOMEM,
                       "%s does not fit the memory budget of %s: it needs %s, %s of the budget "
                       "of %s in use",
                       what, where(w, sizeof w, devs[over]), gb(a, sizeof a, size),
                       gb(b, sizeof b, in_use), gb(c, sizeof c, limit));
}

void wb__budget_init(wb_budget *bg)
{
    memset(bg, 0, sizeof *bg);
    pthread_mutex_init(&bg->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* wb__budget_fits waits by it */
    pthread_cond_init(&bg->cv, &ca);
    pthread_condattr_destroy(&ca);
}

void wb__budget_unreserve(wb_budget *bg, const int *devs, unsigned n, uint64_t size)
{
    if (!bg || !size)
        return;
    pthread_mutex_lock(&bg->mu);
    for (unsigned k = 0; k < n; k++) {
        unsigned s = slot_of(devs[k]);
        bg->reserved[s] -= size < bg->reserved[s] ? size : bg->reserved[s];
    }
    pthread_cond_broadcast(&bg->cv);
    pthread_mutex_unlock(&bg->mu);
}

static void log_budget(const wb_broker *b)
{
    const wb_budget *bg = b->budget;
    char list[512] = "";
    size_t at = 0;
    for (unsigned s = 0; s < WB_TIER_SLOTS && at < sizeof list; s++) {
        if (!bg->limit[s])
            continue;
        int w = snprintf(list + at, sizeof list - at, "%s%d:%llu", at ? "," : "", (int)s - 1,
                         (unsigned long long)bg->limit[s]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
    wb_info("memory_budget", "device_budgets=%s host_budget=%llu host_tier=%s", list,
            (unsigned long long)b->host_budget, b->cfg.backend->host_alloc ? "yes" : "no");
}

int wb__tier_setup(wb_broker *b, const wb_tier_config *cfg, wb_err *err)
{
    const wb_backend *be = b->cfg.backend;
    if (cfg->host_pct) {
        uint64_t total = 0;
        int rc = wb__tier_host_total(be, -1, &total, err);
        if (rc != WB_OK)
            return rc;
        b->host_budget = total / 100 * cfg->host_pct;
    } else {
        b->host_budget = cfg->host_bytes;
    }
    if (!cfg->device_bytes && !cfg->device_pct)
        return WB_OK;
    wb_budget *bg = wb__calloc(1, sizeof *bg);
    if (!bg)
        return wb__err_set(err, WB_ENOMEM, "out of memory");
    wb__budget_init(bg);
    int devs[WB_GPU_MAX];
    unsigned n = 0;
    if (be->proto == WBPROTO__BACKEND__BACKEND_HOST) {
        devs[n++] = -1;
    } else {
        for (size_t i = 0; i < b->cfg.gpus.n && n < WB_GPU_MAX; i++)
            devs[n++] = b->cfg.gpus.dev[i].index;
        if (n == 0)
            devs[n++] = b->cfg.device;
    }
    for (unsigned k = 0; k < n; k++) {
        uint64_t limit = cfg->device_bytes;
        if (cfg->device_pct) {
            uint64_t total = 0;
            int rc = be->mem_total ? be->mem_total(be, devs[k], &total, err)
                                   : wb__err_set(err, WB_ENOSYS,
                                                 "the %s backend cannot tell its memory's size: "
                                                 "give --device-memory-budget in bytes",
                                                 be->name);
            if (rc != WB_OK) {
                pthread_cond_destroy(&bg->cv);
                pthread_mutex_destroy(&bg->mu);
                free(bg);
                return rc;
            }
            limit = total / 100 * cfg->device_pct;
        }
        bg->limit[slot_of(devs[k])] = limit ? limit : 1;
    }
    b->budget = bg;
    log_budget(b);
    return WB_OK;
}

void wb__tier_destroy(wb_broker *b)
{
    wb__tier_free_spares(b);
    if (!b->budget)
        return;
    pthread_cond_destroy(&b->budget->cv);
    pthread_mutex_destroy(&b->budget->mu);
    free(b->budget);
    b->budget = NULL;
}

/* Own slab bytes of m on a slot. */
static uint64_t slot_bytes(const wb_model *m, unsigned slot)
{
    uint64_t n = 0;
    for (uint32_t k = 0; k < m->data.n_slabs; k++)
        if (m->data.slabs[k].size && slot_of(m->data.slabs[k].device) == slot)
            n += m->data.slabs[k].size;
    return n;
}

static int on_slot(const wb_model *m, unsigned slot)
{
    for (unsigned k = 0; k < m->n_devices; k++)
        if (slot_of(m->devices[k]) == slot)
            return 1;
    return 0;
}

void wb__tier_refresh(wb_broker *b)
{
    int64_t now = b->now_ms();
    uint64_t host = 0;
    for (wb_model *m = b->models.head; m; m = m->next) {
        if (!m->used_ms && m->state == WBPROTO__MODEL_STATE__MODEL_READY) {
            m->used_ms = now > 0 ? now : 1;
            m->used_wall = b->now_wall();
        }
        host += m->host_bytes;
    }
    b->host_tier_bytes = host + wb__tier_spare_bytes(b);
    wb_budget *bg = b->budget;
    if (!bg)
        return;
    uint64_t used[WB_TIER_SLOTS] = {0};
    for (const wb_model *m = b->models.head; m; m = m->next) {
        for (unsigned s = 0; s < WB_TIER_SLOTS; s++) {
            used[s] += slot_bytes(m, s);
            if ((m->tier == WB_TIER_RESTORING || m->tier == WB_TIER_RELOADING) && on_slot(m, s))
                used[s] += m->tier_slab_bytes;
        }
    }
    for (const wb_publish *p = b->publishes; p; p = p->next)
        for (uint32_t k = 0; k < p->data.n_slabs; k++)
            used[slot_of(p->data.slabs[k].device)] += p->data.slabs[k].size;
    for (unsigned s = 0; s < WB_TIER_SLOTS; s++)
        if (bg->limit[s])
            used[s] += wb__share_orphan_bytes_on(b->share, (int)s - 1);
    pthread_mutex_lock(&bg->mu);
    memcpy(bg->used, used, sizeof used);
    pthread_cond_broadcast(&bg->cv);
    pthread_mutex_unlock(&bg->mu);
}

void wb__tier_touch(wb_broker *b, wb_model *m)
{
    m->used_ms = b->now_ms();
    m->used_wall = b->now_wall();
}

/* A publish under way reads or replaces the name's current version. */
static int publishing(const wb_broker *b, const char *name)
{
    for (const wb_publish *p = b->publishes; p; p = p->next)
        if (p->name && strcmp(p->name, name) == 0)
            return 1;
    return 0;
}

/* Another model borrows tensors from m's slabs. */
static int lends(const wb_model *m)
{
    for (uint32_t k = 0; m->data.holds && k < m->data.n_slabs; k++)
        if (m->data.holds[k] && wb__share_borrowed(m->data.holds[k]))
            return 1;
    return 0;
}

/* Why m cannot be moved now, or NULL. */
static const char *unmovable(const wb_broker *b, const wb_model *m)
{
    if (m->state != WBPROTO__MODEL_STATE__MODEL_READY || m->tier != WB_TIER_DEVICE)
        return "not ready on its device";
    if (m->leases)
        return "leased";
    if (m->checksums_state == WB_CHECKSUMS_PENDING || m->sum_job)
        return "its checksums are being computed";
    if (publishing(b, m->name))
        return "a publish of its name is under way";
    if (lends(m))
        return "other models share its tensors";
    return NULL;
}

/* A host copy fits beside the others, dropping those of models least
 * recently used (on the device: the copy only; in the host tier: the model
 * is evicted) but never `keep`'s. */

/* A kept host buffer of exactly `bytes`, taken out of the spares. */
static void *take_spare(wb_broker *b, uint64_t bytes)
{
    for (unsigned i = 0; i < b->n_host_spare; i++) {
        if (b->host_spare[i].size != bytes)
            continue;
        void *p = b->host_spare[i].p;
        b->host_spare[i] = b->host_spare[--b->n_host_spare];
        return p;
    }
    return NULL;
}

/* A host copy no model needs: kept for the next move of its size. */
static void put_spare(wb_broker *b, void *p, uint64_t bytes)
{
    if (!p)
        return;
    if (b->n_host_spare == WB_TIER_SPARES) {
        /* The oldest goes. */
        b->cfg.backend->host_free(b->cfg.backend, b->host_spare[0].p, b->host_spare[0].size);
        memmove(&b->host_spare[0], &b->host_spare[1],
                (WB_TIER_SPARES - 1) * sizeof b->host_spare[0]);
        b->n_host_spare--;
    }
    b->host_spare[b->n_host_spare].p = p;
    b->host_spare[b->n_host_spare++].size = bytes;
}

uint64_t wb__tier_spare_bytes(const wb_broker *b)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < b->n_host_spare; i++)
        n += b->host_spare[i].size;
    return n;
}

void wb__tier_free_spares(wb_broker *b)
{
    while (b->n_host_spare) {
        b->n_host_spare--;
        b->cfg.backend->host_free(b->cfg.backend, b->host_spare[b->n_host_spare].p,
                                  b->host_spare[b->n_host_spare].size);
    }
}

/* Room in the host tier for a copy of `bytes`; *spare: a kept buffer of
 * that size to copy into (NULL: allocate one). */
static int host_room(wb_broker *b, uint64_t bytes, const wb_model *keep, const wb_model *keep2,
                     void **spare)
{
    *spare = NULL;
    if (!b->host_budget) {
        *spare = take_spare(b, bytes);
        return 1;
    }
    if (bytes > b->host_budget)
        return 0;
    for (;;) {
        if ((*spare = take_spare(b, bytes)) != NULL)
            return 1; /* counted already */
        uint64_t used = wb__tier_spare_bytes(b);
        wb_model *lru = NULL;
        for (wb_model *m = b->models.head; m; m = m->next) {
            used += m->host_bytes;
            if (m == keep || m == keep2 || !m->host_copy || m->tier_job ||
                (m->tier == WB_TIER_HOST && (!m->path || m->published)))
                continue;
            if (m->tier != WB_TIER_DEVICE && m->tier != WB_TIER_HOST)
                continue;
            if (!lru || m->used_ms < lru->used_ms)
                lru = m;
        }
        if (used + bytes <= b->host_budget)
            return 1;
        if (b->n_host_spare) {
            /* Kept buffers of other sizes go first. */
            b->n_host_spare--;
            b->cfg.backend->host_free(b->cfg.backend, b->host_spare[b->n_host_spare].p,
                                      b->host_spare[b->n_host_spare].size);
            continue;
        }
        if (!lru)
            return 0;
        if (lru->tier == WB_TIER_HOST) {
            wb__tier_drop(b, lru, "host_budget");
        } else {
            put_spare(b, lru->host_copy, lru->host_bytes);
            lru->host_copy = NULL;
            lru->host_bytes = 0;
        }
    }
}

uint64_t wb__tier_slab_size(const wb_model_data *d)
{
    for (uint32_t k = 0; k < d->n_slabs; k++)
        if (d->slabs[k].size)
            return d->slabs[k].size;
    return 0;
}

void wb__tier_free_slabs(wb_broker *b, wb_model *m, int freed)
{
    wb_model_data *d = &m->data;
    m->registered = d->holds != NULL;
    if (!m->tier_slab_bytes)
        m->tier_slab_bytes = wb__tier_slab_size(d);
    for (uint32_t k = 0; k < d->n_slabs; k++) {
        if (freed) {
            if (d->holds)
                d->holds[k] = NULL;
            memset(&d->slabs[k], 0, sizeof d->slabs[k]);
            continue;
        }
        if (d->holds && d->holds[k]) {
            int mine = wb__share_release_owner(d->holds[k], &d->slabs[k]);
            d->holds[k] = NULL;
            if (!mine) {
                memset(&d->slabs[k], 0, sizeof d->slabs[k]);
                continue;
            }
        }
        b->cfg.backend->slab_free(&d->slabs[k]);
        memset(&d->slabs[k], 0, sizeof d->slabs[k]);
    }
    d->slab_bytes = 0;
}

void wb__tier_drop(wb_broker *b, wb_model *m, const char *reason)
{
    char q[300];
    wb_model_data *d = &m->data;
    if (m->tier == WB_TIER_DEVICE)
        wb__tier_free_slabs(b, m, 0);
    /* Its borrowed tensors go too: the reload shares again what it can. */
    for (size_t i = 0; d->borrowed && i < (size_t)d->n_groups * d->n_stride; i++)
        if (d->borrowed[i])
            wb__share_unref(d->borrowed[i]);
    free(d->borrowed);
    d->borrowed = NULL;
    d->n_groups = 0;
    put_spare(b, m->host_copy, m->host_bytes);
    m->host_copy = NULL;
    m->host_bytes = 0;
    m->tier = WB_TIER_EVICTED;
    b->stats.evicted++;
    wb_info("model_tier", "model=%s version=%u tier=evicted reason=%s",
            wb__log_quote(q, sizeof q, m->name), m->version, reason);
}

/* Starts moving m off its device: to the host tier (a copy kept from an
 * earlier restore makes it at once), else dropped. The host copy of
 * `keep` (a model coming back) is not dropped to make room. */
static int move_out(wb_broker *b, wb_model *m, const char *reason, const wb_model *keep,
                    wb_err *err)
{
    char q[300];
    const wb_backend *be = b->cfg.backend;
    uint64_t bytes = 0;
    for (size_t i = 0; i < m->data.n_tensors; i++) {
        const wb_model_tensor *t = &m->data.tensors[i];
        if (t->slab == 0 && t->offset + t->nbytes > bytes)
            bytes = t->offset + t->nbytes;
    }
    if (m->host_copy) {
        wb__tier_free_slabs(b, m, 0);
        m->tier = WB_TIER_HOST;
        b->stats.moved_to_host++;
        wb_info("model_tier", "model=%s version=%u tier=host reason=%s host_bytes=%llu copied=no",
                wb__log_quote(q, sizeof q, m->name), m->version, reason,
                (unsigned long long)m->host_bytes);
        return WB_OK;
    }
    void *spare = NULL;
    int keepable = be->host_alloc && host_room(b, bytes, m, keep, &spare);
    if (!keepable) {
        if (!m->path || m->published)
            return wb__err_set(err, WB_ENOMEM,
                               "model '%s' version %u was published (it has no file to reload "
                               "from) and the host tier has no room for its %llu bytes",
                               m->name, m->version, (unsigned long long)bytes);
        wb__tier_drop(b, m, be->host_alloc ? "host_budget" : "no_host_tier");
        return WB_OK;
    }
    m->host_bytes = bytes; /* reserved in the host tier while it moves */
    if (!m->tier_slab_bytes)
        m->tier_slab_bytes = wb__tier_slab_size(&m->data);
    m->tier = WB_TIER_MOVING;
    wb_info("model_tier", "model=%s version=%u tier=moving reason=%s bytes=%llu",
            wb__log_quote(q, sizeof q, m->name), m->version, reason, (unsigned long long)bytes);
    /* The job copies into the spare (it owns it until the loop takes it). */
    int rc = wb__tier_submit(b, m, WB_TIER_OP_MOVE, spare, err);
    if (rc != WB_OK)
        put_spare(b, spare, bytes);
    return rc;
}

int wb__tier_make_room(wb_broker *b, const int *devs, unsigned n, uint64_t need,
                       const wb_model *except, wb_err *err)
{
    wb_budget *bg = b->budget;
    if (!bg)
        return WB_OK;
    wb__tier_refresh(b);
    for (unsigned k = 0; k < n; k++) {
        unsigned s = slot_of(devs[k]);
        if (!bg->limit[s])
            continue;
        pthread_mutex_lock(&bg->mu);
        uint64_t in_use = bg->used[s] + bg->reserved[s];
        pthread_mutex_unlock(&bg->mu);
        /* Moves queued already count as done: the queue runs in order. */
        for (const wb_model *m = b->models.head; m; m = m->next)
            if (m->tier == WB_TIER_MOVING && on_slot(m, s))
                in_use -= m->tier_slab_bytes < in_use ? m->tier_slab_bytes : in_use;
        char w[32], a[64], c[64];
        if (need > bg->limit[s])
            return wb__err_set(err, WB_ENOMEM, "%s more than the whole budget of %s (%s)",
                               gb(a, sizeof a, need), where(w, sizeof w, devs[k]),
                               gb(c, sizeof c, bg->limit[s]));
        while (in_use + need > bg->limit[s]) {
            wb_model *lru = NULL;
            uint64_t freed = 0;
            for (wb_model *m = b->models.head; m; m = m->next) {
                uint64_t own = slot_bytes(m, s);
                if (m == except || !own || unmovable(b, m))
                    continue;
                if (!lru || m->used_ms < lru->used_ms) {
                    lru = m;
                    freed = own;
                }
            }
            if (!lru) {
                char held[256] = "";
                size_t at = 0;
                for (const wb_model *m = b->models.head; m && at < sizeof held; m = m->next) {
                    const char *why = slot_bytes(m, s) ? unmovable(b, m) : NULL;
                    if (!why)
                        continue;
                    int wr = snprintf(held + at, sizeof held - at, "%s'%s' v%u (%s)",
                                      at ? ", " : "", m->name, m->version, why);
                    if (wr < 0)
                        break;
                    at += (size_t)wr;
                }
                return wb__err_set(err, WB_ENOMEM, "nothing more can be moved off %s: %s",
                                   where(w, sizeof w, devs[k]),
                                   held[0] ? held : "no model holds it");
            }
            int rc = move_out(b, lru, "budget", except, err);
            if (rc != WB_OK)
                return rc;
            in_use -= freed < in_use ? freed : in_use;
        }
    }
    wb__tier_refresh(b);
    return WB_OK;
}

/* Brings m back: room first (moves queued before the restore), then the
 * restore from the host copy or a reload from the files. */
static int bring_back(wb_broker *b, wb_model *m, wb_err *err)
{
    char q[300];
    if (m->tier == WB_TIER_MOVING) {
        m->tier_wanted = 1;
        return WB_OK;
    }
    if (m->tier == WB_TIER_RESTORING || m->tier == WB_TIER_RELOADING || m->tier == WB_TIER_DEVICE)
        return WB_OK;
    uint64_t need = m->tier_slab_bytes;
    if (m->tier == WB_TIER_EVICTED) {
        /* A reload may share less than before: judged by its whole size. */
        need = 0;
        for (size_t i = 0; i < m->data.n_tensors; i++)
            need += (m->data.tensors[i].nbytes + 255) & ~(uint64_t)255;
    }
    int rc = wb__tier_make_room(b, m->devices, m->n_devices, need, m, err);
    if (rc != WB_OK)
        return rc;
    int op = m->tier == WB_TIER_HOST ? WB_TIER_OP_RESTORE : WB_TIER_OP_RELOAD;
    m->tier = op == WB_TIER_OP_RESTORE ? WB_TIER_RESTORING : WB_TIER_RELOADING;
    if (op == WB_TIER_OP_RELOAD)
        m->tier_slab_bytes = need;
    wb_info("model_tier", "model=%s version=%u tier=%s bytes=%llu",
            wb__log_quote(q, sizeof q, m->name), m->version, wb__tier_name(m->tier),
            (unsigned long long)need);
    rc = wb__tier_submit(b, m, op, NULL, err);
    wb__tier_refresh(b);
    return rc;
}

int wb__tier_acquire(wb_broker *b, wb_model *m, wb_ops_reply *r)
{
    if (m->tier_error && !m->tier_job) {
        /* The last restore failed: told once, the next acquire tries again. */
        int rc = m->tier_rc ? m->tier_rc : WB_EIO;
        wb__ops_fail(r, rc, "model '%s' could not be brought back to its device: %s", m->name,
                     m->tier_error);
        free(m->tier_error);
        m->tier_error = NULL;
        return 0;
    }
    wb_err err;
    int was = m->tier;
    if (bring_back(b, m, &err) != WB_OK)
        return wb__ops_fail(r, err.code, "model '%s' is %s and cannot be brought back now: %s",
                            m->name, wb__tier_name(was), err.msg);
    if (m->tier == WB_TIER_DEVICE)
        return -1; /* restored inline: the caller grants */
    wb__ops_fail(r, WB_EBUSY, "model '%s' is %s; ask again shortly", m->name,
                 wb__tier_name(m->tier));
    r->msg.retry_after_ms = m->tier == WB_TIER_RELOADING ? 20 : 5;
    return 0;
}

int wb__tier_sleep(wb_broker *b, wb_model *m, wb_err *err)
{
    if (m->tier != WB_TIER_DEVICE)
        return WB_OK;
    const char *why = unmovable(b, m);
    if (why)
        return wb__err_set(err, m->leases ? WB_EBUSY : WB_ESTATE,
                           "model '%s' version %u cannot be moved: %s%s", m->name, m->version, why,
                           m->leases ? " (a leased model is never moved)" : "");
    int rc = move_out(b, m, "sleep", NULL, err);
    wb__tier_refresh(b);
    return rc;
}

int wb__tier_wake(wb_broker *b, wb_model *m, wb_err *err)
{
    return bring_back(b, m, err);
}

int wb__tier_load_back(wb_broker *b, wb_load_job *job)
{
    const int *devs = job->n_devices ? job->devices : &job->device;
    unsigned n = job->n_devices ? job->n_devices : 1;
    wb__budget_unreserve(b->budget, devs, n, job->budget_reserved);
    job->budget_reserved = 0;
    if (!job->budget_retry || job->cancelled || job->budget_wait_ms)
        return 0;
    job->budget_retry = 0;
    wb_model *m = b->models.head;
    while (m && m->job != job)
        m = m->next;
    if (!m)
        return 0;
    /* The bytes it needs: from the refusal, whose size the loader knows. */
    uint64_t need = job->budget_need;
    wb_err e;
    if (wb__tier_make_room(b, devs, n, need, m, &e) != WB_OK) {
        size_t at = strlen(job->err.msg);
        snprintf(job->err.msg + at, sizeof job->err.msg - at, "; %s", e.msg);
        return 0;
    }
    job->rc = WB_OK;
    job->refused = 0;
    wb__err_clear(&job->err);
    job->budget_wait_ms = 60000;
    if (!b->loader)
        return 2;
    wb__loader_submit(b->loader, job);
    return 1;
}
