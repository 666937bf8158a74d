/* libwbclient: a container that follows its models' versions
 * (wb_container_follow). The subscription's callback runs on the client's
 * heartbeat thread and only records the version; the container's follower
 * thread acquires it, swaps it in (wb_container_update) and releases the
 * lease it replaced, so that a heartbeat never waits for a swap.
 *
 * Locks: the follower's mu guards its models' pending versions and the stop
 * flag; it is a leaf (the callback takes it with no lock of the library
 * held, the thread lets go of it before it acquires or updates). */
#include "aoti_impl.h"

#include "alloc.h"
#include "client_impl.h"
#include "clock.h"
#include "lease.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct followed {
    char model[WB_NAME_MAX + 1];
    uint32_t want; /* the last version announced */
    int pending;   /* not yet handled */
} followed;

struct wb__follower {
    wb_container *c;
    wb_client *client;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int stop;
    size_t n;
    size_t subscribed; /* models[0 .. subscribed) have a subscription */
    followed *models;
};

static void on_version(void *arg, const char *model, uint32_t version, uint32_t previous)
{
    struct wb__follower *f = arg;
    (void)previous;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->n; i++) {
        if (strcmp(f->models[i].model, model) == 0) {
            f->models[i].want = version;
            f->models[i].pending = 1;
            pthread_cond_signal(&f->cond);
        }
    }
    pthread_mutex_unlock(&f->mu);
}

static void count_error(wb_container *c)
{
    pthread_mutex_lock(&c->update_mu);
    c->info.follow_errors++;
    pthread_mutex_unlock(&c->update_mu);
}

/* One version of one model: acquire, update, release the old lease. */
static void follow_one(struct wb__follower *f, const char *model, uint32_t want)
{
    wb_container *c = f->c;
    char q[600], qm[300];
    wb_lease *old = NULL;
    wb_lease_options o = {.device = WB_LEASE_DEVICE_CURRENT};
    char uuid[sizeof old->opt_uuid];
    pthread_mutex_lock(&c->update_mu);
    for (size_t i = 0; i < c->n_leases && !old; i++) {
        if (strcmp(c->leases[i]->model, model) == 0)
            old = c->leases[i];
    }
    if (old) {
        o.device = old->opt_device;
        o.allow_peer = old->opt_allow_peer;
        memcpy(uuid, old->opt_uuid, sizeof uuid);
        o.device_uuid = uuid[0] ? uuid : NULL;
    }
    pthread_mutex_unlock(&c->update_mu);
    /* Only this thread replaces the container's leases while it follows
     * (wb_container_update by the caller too, serialised, which the
     * version check below tells). */
    if (!old || wb_lease_version(old) == want)
        return;
    wb_lease *nl = NULL;
    double t0 = wb__clock_mono_s();
    int rc = wb_lease_acquire_ex(f->client, model, &o, &nl);
    double t1 = wb__clock_mono_s();
    if (rc != WB_OK) {
        wb__cerror("container_follow_failed",
                   "model=%s lease_model=%s version=%u step=acquire error=\"%s\"",
                   wb__aoti_qpath(c, q, sizeof q), wb__log_quote(qm, sizeof qm, model), want,
                   wb_client_errmsg(f->client));
        count_error(c);
        return;
    }
    if (wb_lease_version(nl) == wb_lease_version(old)) {
        /* Announced, but not what an acquire gets (yet, or any more). */
        wb_lease_release(&nl);
        return;
    }
    double fetch_ms = nl->fetch_ms, map_ms = nl->map_ms;
    uint32_t got = wb_lease_version(nl);
    rc = wb_container_update(c, &nl, 1);
    if (rc != WB_OK) {
        wb__cerror("container_follow_failed",
                   "model=%s lease_model=%s version=%u step=update error=\"%s\"",
                   wb__aoti_qpath(c, q, sizeof q), wb__log_quote(qm, sizeof qm, model),
                   wb_lease_version(nl), wb_container_errmsg(c));
        wb_lease_release(&nl);
        count_error(c);
        return;
    }
    double t2 = wb__clock_mono_s();
    /* The container no longer uses the old lease (one an update could not
     * wait for stays registered: destroy releases it). */
    wb_lease_release(&old);
    /* Where the time from the notice to the swap went: the acquire (of
     * which the slabs' descriptors and their mapping) and the update. */
    wb__cinfo("container_followed",
              "model=%s lease_model=%s version=%u acquire_ms=%.3f fetch_ms=%.3f map_ms=%.3f "
              "update_ms=%.3f",
              wb__aoti_qpath(c, q, sizeof q), wb__log_quote(qm, sizeof qm, model), got,
              (t1 - t0) * 1000.0, fetch_ms, map_ms, (t2 - t1) * 1000.0);
}

static void *follower_main(void *arg)
{
    struct wb__follower *f = arg;
    pthread_mutex_lock(&f->mu);
    while (!f->stop) {
        size_t i = 0;
        while (i < f->n && !f->models[i].pending)
            i++;
        if (i == f->n) {
            pthread_cond_wait(&f->cond, &f->mu);
            continue;
        }
        f->models[i].pending = 0;
        uint32_t want = f->models[i].want;
        char model[WB_NAME_MAX + 1];
        memcpy(model, f->models[i].model, sizeof model);
        pthread_mutex_unlock(&f->mu);
        follow_one(f, model, want);
        pthread_mutex_lock(&f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static void follower_free(struct wb__follower *f)
{
    for (size_t i = 0; i < f->subscribed; i++)
        wb_client_unsubscribe(f->client, f->models[i].model, on_version, f);
    if (f->started) {
        pthread_mutex_lock(&f->mu);
        f->stop = 1;
        pthread_cond_signal(&f->cond);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thread, NULL);
    }
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->mu);
    free(f->models);
    free(f);
}

void wb__aoti_follow_stop(wb_container *c)
{
    if (c->follower) {
        follower_free(c->follower);
        c->follower = NULL;
    }
}

WB_EXPORT int wb_container_follow(wb_container *c, wb_client *client)
{
    if (!c)
        return WB_EINVAL;
    if (!client)
        return wb__aoti_fail(c, WB_EINVAL, "follow: no client");
    if (!c->h)
        return wb__aoti_fail(c, WB_ESTATE, "follow: the container was not created");
    if (c->follower)
        return wb__aoti_fail(c, WB_EBUSY, "follow: the container follows already");
    if (!c->n_leases || c->own_constants)
        return wb__aoti_fail(c, WB_EINVAL, "follow: model %s binds no lease to follow",
                             c->model_path);
    struct wb__follower *f = wb__calloc(1, sizeof *f);
    followed *models = wb__calloc(c->n_leases, sizeof *models);
    if (!f || !models) {
        free(f);
        free(models);
        return wb__aoti_fail(c, WB_ENOMEM, "follow: out of memory");
    }
    f->c = c;
    f->client = client;
    f->models = models;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cond, NULL);
    uint32_t have[64];
    for (size_t i = 0; i < c->n_leases; i++) {
        size_t k = 0;
        while (k < f->n && strcmp(models[k].model, c->leases[i]->model) != 0)
            k++;
        if (k == f->n) {
            snprintf(models[f->n].model, sizeof models[f->n].model, "%s", c->leases[i]->model);
            if (f->n < sizeof have / sizeof have[0])
                have[f->n] = wb_lease_version(c->leases[i]);
            f->n++;
        }
    }
    int rc = pthread_create(&f->thread, NULL, follower_main, f);
    if (rc != 0) {
        follower_free(f);
        return wb__aoti_fail(c, WB_ENOMEM, "follow: cannot start the follower thread");
    }
    f->started = 1;
    for (size_t i = 0; i < f->n; i++) {
        uint32_t cur = 0;
        rc = wb_client_subscribe(client, models[i].model, on_version, f, &cur);
        if (rc != WB_OK) {
            wb__aoti_fail(c, rc, "follow: %s", wb_client_errmsg(client));
            follower_free(f);
            return rc;
        }
        f->subscribed = i + 1;
        /* A version made current before the subscription: at once. */
        if (cur && i < sizeof have / sizeof have[0] && cur != have[i])
            on_version(f, models[i].model, cur, have[i]);
    }
    c->follower = f;
    c->owns_leases = 1;
    char q[600];
    wb__cinfo("container_following", "model=%s models=%zu", wb__aoti_qpath(c, q, sizeof q), f->n);
    return WB_OK;
}
