/* libwbclient: subscriptions to models' versions. A subscription is sent
 * to the broker once per model per connection (SubscribeRequest); the
 * broker then sends a VersionNotice on the connection whenever a new version
 * of the model becomes current, and lists the current version of every
 * subscribed model in its heartbeat replies, which catches up with a notice
 * that was dropped. Both are recorded here under the client's lock (the rpc
 * hook, the heartbeat); the callbacks run later, from wb__subs_dispatch,
 * with no lock held, once per version that differs from the last one
 * announced. */
#include "client_impl.h"

#include "alloc.h"
#include "clog.h"
#include "log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct wb__sub_cb {
    struct wb__sub_cb *next;
    wb_version_fn fn;
    void *arg;
} wb__sub_cb;

struct wb__sub {
    struct wb__sub *next;
    char model[WB_NAME_MAX + 1];
    uint32_t current;   /* the broker's current version, as last heard */
    uint32_t announced; /* the last one the callbacks were given (or subscribe returned) */
    int noticed;        /* a notice came while the subscription was being sent */
    uint64_t gen;       /* the rpc socket generation it was sent on; 0: not sent */
    wb__sub_cb *cbs;
};

/* One callback to call, copied out of the state so that it may change
 * while the callbacks run. */
typedef struct call {
    char model[WB_NAME_MAX + 1];
    uint32_t version, previous;
    wb_version_fn fn;
    void *arg;
} call;

void wb__subs_init(wb_client *c)
{
    pthread_mutex_init(&c->sub_mu, NULL);
    pthread_cond_init(&c->sub_cond, NULL);
    c->subs = NULL;
    c->n_subs = 0;
    c->sub_gen = 0;
    c->sub_dispatching = 0;
    atomic_init(&c->sub_pending, 0);
    atomic_init(&c->has_subs, 0);
    c->rpc.on_notice = wb__subs_on_notice;
    c->rpc.notice_arg = c;
}

static void sub_free(struct wb__sub *s)
{
    while (s->cbs) {
        wb__sub_cb *cb = s->cbs;
        s->cbs = cb->next;
        free(cb);
    }
    free(s);
}

void wb__subs_free(wb_client *c)
{
    while (c->subs) {
        struct wb__sub *s = c->subs;
        c->subs = s->next;
        sub_free(s);
    }
    pthread_cond_destroy(&c->sub_cond);
    pthread_mutex_destroy(&c->sub_mu);
}

static struct wb__sub *find_sub(wb_client *c, const char *model)
{
    for (struct wb__sub *s = c->subs; s; s = s->next) {
        if (strcmp(s->model, model) == 0)
            return s;
    }
    return NULL;
}

/* Wakes the thread that runs the callbacks. */
static void wake(wb_client *c)
{
    atomic_store(&c->sub_pending, 1);
    wb__client_wake(c);
}

/* A version the broker says is current. The caller holds sub_mu. */
static int record(struct wb__sub *s, uint32_t version)
{
    if (version == s->current)
        return 0;
    s->current = version;
    s->noticed = 1;
    return version != s->announced;
}

void wb__subs_on_notice(void *arg, const Wbproto__VersionNotice *n)
{
    wb_client *c = arg;
    /* Decoded replies were checked (common/wire.c: a valid model name). */
    if (!n || !n->model)
        return;
    pthread_mutex_lock(&c->sub_mu);
    struct wb__sub *s = find_sub(c, n->model);
    int due = s && record(s, n->version);
    pthread_mutex_unlock(&c->sub_mu);
    if (due)
        wake(c);
}

void wb__subs_apply_beat(wb_client *c, const Wbproto__HeartbeatReply *hr)
{
    if (!hr || !hr->n_current_versions || !atomic_load(&c->has_subs))
        return;
    int due = 0;
    pthread_mutex_lock(&c->sub_mu);
    for (size_t i = 0; i < hr->n_current_versions; i++) {
        const Wbproto__VersionNotice *n = hr->current_versions[i];
        if (!n || !n->model)
            continue;
        struct wb__sub *s = find_sub(c, n->model);
        due |= s && record(s, n->version);
    }
    pthread_mutex_unlock(&c->sub_mu);
    if (due)
        wake(c);
}

/* One SubscribeRequest on the current socket, straight through the rpc
 * (the caller holds c->mu and may be reconnecting). WB_OK with *version, a
 * refusal with *refused set, or a failed exchange. */
static int send_one(wb_client *c, const char *model, int unsubscribe, uint32_t *version,
                    int *refused, wb_err *err)
{
    Wbproto__SubscribeRequest sr = WBPROTO__SUBSCRIBE_REQUEST__INIT;
    sr.model = (char *)model;
    sr.unsubscribe = unsubscribe != 0;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_SUBSCRIBE;
    req.subscribe = &sr;
    Wbproto__Reply *rep = NULL;
    int rc = wb__rpc_call(&c->rpc, &req, 0, &rep, err);
    *refused = rep != NULL && rc != WB_OK;
    *version = rc == WB_OK && rep->subscribe ? rep->subscribe->version : 0;
    if (*refused && (rc == WB_EPROTO || rc == WB_ENOSYS)) {
        /* A broker that predates versions does not know the request. */
        char why[WB_ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = wb__err_set(err, WB_ENOSYS,
                         "subscribe '%s': the broker does not know subscriptions (it predates "
                         "versions; it answered: %.600s)",
                         model, why);
    }
    if (rc == WB_OK || *refused)
        atomic_store(&c->connected, 1);
    wb__reply_free(&rep);
    return rc;
}

int wb__subs_resend_locked(wb_client *c, wb_err *err)
{
    if (!atomic_load(&c->has_subs) || c->rpc.generation == c->sub_gen)
        return WB_OK;
    /* The names, copied: sub_mu is not held across the exchanges. */
    pthread_mutex_lock(&c->sub_mu);
    unsigned n = 0;
    char(*names)[WB_NAME_MAX + 1] = wb__malloc((c->n_subs ? c->n_subs : 1) * sizeof *names);
    for (struct wb__sub *s = c->subs; names && s; s = s->next) {
        if (s->gen != c->rpc.generation)
            memcpy(names[n++], s->model, sizeof s->model);
    }
    pthread_mutex_unlock(&c->sub_mu);
    if (!names)
        return wb__err_set(err, WB_ENOMEM, "subscriptions: out of memory");
    uint64_t gen = c->rpc.generation;
    int rc = WB_OK;
    for (unsigned i = 0; i < n && rc == WB_OK; i++) {
        uint32_t v = 0;
        int refused = 0;
        wb_err e;
        rc = send_one(c, names[i], 0, &v, &refused, &e);
        if (refused) {
            wb__cwarn("client_resubscribe_refused", "model=%s error=\"%s\"", names[i], e.msg);
            rc = WB_OK;
            continue;
        }
        if (rc != WB_OK) {
            wb__err_set(err, rc, "subscribe '%s' again: %s", names[i], e.msg);
            break;
        }
        pthread_mutex_lock(&c->sub_mu);
        struct wb__sub *s = find_sub(c, names[i]);
        int due = s && record(s, v);
        if (s)
            s->gen = gen;
        pthread_mutex_unlock(&c->sub_mu);
        if (due)
            wake(c);
    }
    free(names);
    if (rc == WB_OK && c->rpc.generation == gen) {
        c->sub_gen = gen;
        /* The heartbeat thread polls the new socket from now on. */
        if (n)
            wb__client_wake(c);
    }
    return rc;
}

WB_EXPORT int wb_client_subscribe(wb_client *c, const char *model, wb_version_fn fn, void *arg,
                                  uint32_t *current)
{
    if (current)
        *current = 0;
    if (!c)
        return WB_EINVAL;
    if (!model || !model[0] || strlen(model) > WB_NAME_MAX || !fn)
        return wb__client_fail(c, WB_EINVAL, "subscribe: %s",
                               !fn ? "no callback" : "no model name, or one over 255 bytes");
    wb__sub_cb *cb = wb__calloc(1, sizeof *cb);
    struct wb__sub *fresh = wb__calloc(1, sizeof *fresh);
    if (!cb || !fresh) {
        free(cb);
        free(fresh);
        return wb__client_fail(c, WB_ENOMEM, "subscribe '%s': out of memory", model);
    }
    cb->fn = fn;
    cb->arg = arg;
    pthread_mutex_lock(&c->mu);
    wb_err e;
    int rc = WB_OK;
    /* A subscription on an earlier socket is sent again first. */
    if (atomic_load(&c->connected) && (rc = wb__subs_resend_locked(c, &e)) != WB_OK)
        wb__client_fail(c, rc, "subscribe '%s': %s", model, e.msg);
    pthread_mutex_lock(&c->sub_mu);
    struct wb__sub *s = find_sub(c, model);
    int send = rc == WB_OK && (!s || s->gen != c->rpc.generation), first = 0;
    if (!s && c->n_subs >= WB_MAX_SUBSCRIPTIONS) {
        rc = wb__client_fail(c, WB_ELIMIT,
                             "subscribe '%s': this client has %u subscriptions, at "
                             "most %d",
                             model, c->n_subs, WB_MAX_SUBSCRIPTIONS);
        send = 0;
    } else if (!s && rc == WB_OK) {
        /* Linked before the request goes out, so that the notices read with
         * its reply are recorded. */
        s = fresh;
        fresh = NULL;
        snprintf(s->model, sizeof s->model, "%s", model);
        s->next = c->subs;
        c->subs = s;
        c->n_subs++;
        first = !atomic_exchange(&c->has_subs, 1);
    }
    if (s && send)
        s->noticed = 0;
    pthread_mutex_unlock(&c->sub_mu);
    /* The heartbeat thread polls the socket from now on. */
    if (first)
        wb__client_wake(c);
    uint32_t v = 0;
    if (send) {
        int refused = 0;
        uint64_t gen = c->rpc.generation;
        if (!atomic_load(&c->connected) && c->hello_done) {
            int restarted;
            rc = wb__client_reconnect_locked(c, &restarted, &e);
            if (rc == WB_OK)
                rc = wb__subs_resend_locked(c, &e);
            gen = c->rpc.generation;
            pthread_mutex_lock(&c->sub_mu);
            send = rc == WB_OK && s->gen != gen;
            pthread_mutex_unlock(&c->sub_mu);
        }
        if (send && rc == WB_OK) {
            rc = send_one(c, model, 0, &v, &refused, &e);
            if (rc != WB_OK && !refused)
                atomic_store(&c->connected, 0);
            gen = c->rpc.generation;
        }
        if (rc != WB_OK)
            wb__client_fail(c, rc, "%s", e.msg);
        pthread_mutex_lock(&c->sub_mu);
        if (rc == WB_OK && send) {
            s->gen = gen;
            s->announced = v;
            if (!s->noticed)
                s->current = v;
        }
        pthread_mutex_unlock(&c->sub_mu);
    }
    pthread_mutex_lock(&c->sub_mu);
    if (rc == WB_OK) {
        cb->next = s->cbs;
        s->cbs = cb;
        cb = NULL;
        if (current)
            *current = s->announced;
    } else if (s && !s->cbs) {
        /* A subscription that never took: unlinked again. */
        for (struct wb__sub **pp = &c->subs; *pp; pp = &(*pp)->next) {
            if (*pp == s) {
                *pp = s->next;
                c->n_subs--;
                break;
            }
        }
        atomic_store(&c->has_subs, c->subs != NULL);
        sub_free(s);
    }
    int due = rc == WB_OK && s->current != s->announced;
    pthread_mutex_unlock(&c->sub_mu);
    pthread_mutex_unlock(&c->mu);
    free(cb);
    free(fresh);
    if (due)
        wake(c);
    return rc;
}

WB_EXPORT int wb_client_unsubscribe(wb_client *c, const char *model, wb_version_fn fn, void *arg)
{
    if (!c)
        return WB_EINVAL;
    if (!model || !fn)
        return wb__client_fail(c, WB_EINVAL, "unsubscribe: no model name or no callback");
    pthread_mutex_lock(&c->mu);
    pthread_mutex_lock(&c->sub_mu);
    struct wb__sub *s = find_sub(c, model), *gone = NULL;
    wb__sub_cb *found = NULL;
    for (wb__sub_cb **pp = s ? &s->cbs : NULL; pp && *pp; pp = &(*pp)->next) {
        if ((*pp)->fn == fn && (*pp)->arg == arg) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    if (found && !s->cbs) {
        for (struct wb__sub **pp = &c->subs; *pp; pp = &(*pp)->next) {
            if (*pp == s) {
                *pp = s->next;
                c->n_subs--;
                break;
            }
        }
        atomic_store(&c->has_subs, c->subs != NULL);
        gone = s;
    }
    pthread_mutex_unlock(&c->sub_mu);
    if (gone && gone->gen && gone->gen == c->rpc.generation && atomic_load(&c->connected)) {
        /* The broker stops sending; a refusal changes nothing here. */
        uint32_t v;
        int refused;
        wb_err e;
        if (send_one(c, model, 1, &v, &refused, &e) != WB_OK && !refused)
            atomic_store(&c->connected, 0);
    }
    pthread_mutex_unlock(&c->mu);
    free(found);
    if (gone)
        sub_free(gone);
    if (!found)
        return wb__client_fail(c, WB_ENOTFOUND, "unsubscribe '%s': no such callback", model);
    /* Callbacks running on another thread may still have this one: it is
     * not called after this returns. */
    pthread_mutex_lock(&c->sub_mu);
    while (c->sub_dispatching && !pthread_equal(c->sub_dispatcher, pthread_self()))
        pthread_cond_wait(&c->sub_cond, &c->sub_mu);
    pthread_mutex_unlock(&c->sub_mu);
    return WB_OK;
}

void wb__subs_dispatch(wb_client *c)
{
    if (!atomic_exchange(&c->sub_pending, 0))
        return;
    pthread_mutex_lock(&c->sub_mu);
    /* One dispatch at a time (the heartbeat thread, or wb_client_heartbeat
     * on a client without it): a second one leaves the work to the first. */
    if (c->sub_dispatching) {
        atomic_store(&c->sub_pending, 1);
        pthread_mutex_unlock(&c->sub_mu);
        return;
    }
    size_t n = 0;
    for (struct wb__sub *s = c->subs; s; s = s->next) {
        for (wb__sub_cb *cb = s->cbs; s->current != s->announced && cb; cb = cb->next)
            n++;
    }
    call *calls = n ? wb__malloc(n * sizeof *calls) : NULL;
    if (n && !calls) {
        /* Out of memory: the versions stay to announce at the next wake. */
        atomic_store(&c->sub_pending, 1);
        pthread_mutex_unlock(&c->sub_mu);
        return;
    }
    size_t k = 0;
    for (struct wb__sub *s = c->subs; s; s = s->next) {
        if (s->current == s->announced)
            continue;
        for (wb__sub_cb *cb = s->cbs; cb; cb = cb->next) {
            memcpy(calls[k].model, s->model, sizeof s->model);
            calls[k].version = s->current;
            calls[k].previous = s->announced;
            calls[k].fn = cb->fn;
            calls[k].arg = cb->arg;
            k++;
        }
        s->announced = s->current;
    }
    c->sub_dispatching = 1;
    c->sub_dispatcher = pthread_self();
    pthread_mutex_unlock(&c->sub_mu);
    for (size_t i = 0; i < k; i++)
        calls[i].fn(calls[i].arg, calls[i].model, calls[i].version, calls[i].previous);
    pthread_mutex_lock(&c->sub_mu);
    c->sub_dispatching = 0;
    pthread_cond_broadcast(&c->sub_cond);
    pthread_mutex_unlock(&c->sub_mu);
    free(calls);
}
