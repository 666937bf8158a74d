#include "wbctl_progress.h"

#include "clock.h"
#include "alloc.h"
#include "rpc.h"
#include "wbctl_out.h"
#include "wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POLL_MS  200
#define BAR_COLS 24

struct wbctl_progress {
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int drawn;
    char *socket_path;
    char *name;
};

/* One line: name, bar, percent, bytes, rate and time left. */
static void draw(wbctl_progress *p, unsigned long long done, unsigned long long total,
                 double elapsed)
{
    char bar[BAR_COLS + 1], have[32], all[32], rate[32], eta[32];
    double frac = total ? (double)done / (double)total : 0;
    if (frac > 1)
        frac = 1;
    int fill = (int)(frac * BAR_COLS);
    for (int i = 0; i < BAR_COLS; i++)
        bar[i] = i < fill ? '#' : ' ';
    bar[BAR_COLS] = '\0';
    wbctl_fmt_size(have, sizeof have, done);
    wbctl_fmt_size(all, sizeof all, total);
    double bps = elapsed > 0 ? (double)done / elapsed : 0;
    wbctl_fmt_rate(rate, sizeof rate, bps);
    if (bps > 0 && total > done)
        snprintf(eta, sizeof eta, "ETA %.0fs", (double)(total - done) / bps);
    else
        snprintf(eta, sizeof eta, "ETA -");
    printf("\rloading %s [%s] %3.0f%% %s / %s  %s  %s\033[K", p->name, bar, frac * 100, have, all,
           rate, eta);
    fflush(stdout);
    p->drawn = 1;
}

/* Asks for the model's progress; 1 with the figures when it is listed. */
static int poll_model(wb__rpc *rpc, const char *name, unsigned long long *done,
                      unsigned long long *total)
{
    Wbproto__ListModelsRequest body = WBPROTO__LIST_MODELS_REQUEST__INIT;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_MODELS;
    req.list_models = &body;
    Wbproto__Reply *rep = NULL;
    wb_err err;
    int found = 0;
    if (wb__rpc_call(rpc, &req, 0, &rep, &err) == WB_OK) {
        for (size_t i = 0; i < rep->list_models->n_models; i++) {
            const Wbproto__ModelInfo *m = rep->list_models->models[i];
            /* The version loading (a rollout's, beside the current one). */
            if (strcmp(m->name, name) == 0 &&
                (!found || m->state == WBPROTO__MODEL_STATE__MODEL_LOADING)) {
                *done = m->loaded_bytes;
                *total = m->bytes;
                found = 1;
            }
        }
    }
    wb__reply_free(&rep);
    return found;
}

static void *run(void *arg)
{
    wbctl_progress *p = arg;
    wb__rpc rpc;
    wb_err err;
    int open = wb__rpc_open(&rpc, p->socket_path, 2000, &err) == WB_OK;
    double t0 = wb__clock_mono_s();
    unsigned long long done = 0, total = 0;
    pthread_mutex_lock(&p->mu);
    draw(p, 0, 0, 0);
    while (!p->stop) {
        pthread_mutex_unlock(&p->mu);
        if (open && poll_model(&rpc, p->name, &done, &total)) {
            pthread_mutex_lock(&p->mu);
            if (!p->stop)
                draw(p, done, total, wb__clock_mono_s() - t0);
            pthread_mutex_unlock(&p->mu);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&p->mu);
        if (!p->stop)
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    wb__rpc_close(&rpc);
    return NULL;
}

wbctl_progress *wbctl_progress_start(const char *socket_path, const char *name)
{
    if (!isatty(STDOUT_FILENO))
        return NULL;
    wbctl_progress *p = wb__calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->name = wb__strdup(name);
    p->socket_path = socket_path ? wb__strdup(socket_path) : NULL;
    if (!p->name || (socket_path && !p->socket_path)) {
        free(p->name);
        free(p->socket_path);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->tid, NULL, run, p) != 0) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p->name);
        free(p->socket_path);
        free(p);
        return NULL;
    }
    return p;
}

void wbctl_progress_stop(wbctl_progress **pp)
{
    if (!pp || !*pp)
        return;
    wbctl_progress *p = *pp;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->tid, NULL);
    if (p->drawn) {
        printf("\r\033[K");
        fflush(stdout);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->name);
    free(p->socket_path);
    free(p);
    *pp = NULL;
}
