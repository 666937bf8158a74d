/* Load jobs and the loader thread that runs them one at a time, off the
 * event loop: a queue in, a list of finished jobs out, announced on an
 * eventfd (loader.h). loader.c runs each job. */
#include "loader.h"

#include "alloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

wb_load_job *wb__load_job_new(const char *name, const char *path, const wb_backend *be, int device,
                              const void *ident, size_t ident_len, uint64_t request_id)
{
    wb_load_job *j = wb__calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->name = wb__strdup(name);
    j->path = wb__strdup(path);
    if (ident && ident_len) {
        j->ident = wb__malloc(ident_len);
        if (j->ident) {
            memcpy(j->ident, ident, ident_len);
            j->ident_len = ident_len;
        }
    }
    if (!j->name || !j->path || (ident && ident_len && !j->ident)) {
        wb__load_job_free(&j);
        return NULL;
    }
    j->backend = be;
    j->device = device;
    j->request_id = request_id;
    j->version = 1;
    j->op = WBPROTO__REQUEST__BODY_LOAD;
    atomic_init(&j->cancel, 0);
    atomic_init(&j->progress.total, 0);
    atomic_init(&j->progress.landed, 0);
    return j;
}

void wb__load_job_free(wb_load_job **jp)
{
    if (!jp || !*jp)
        return;
    wb_load_job *j = *jp;
    wb__model_data_free(&j->data, j->backend);
    free(j->sum_xxh3);
    free(j->tier_slabs);
    free(j->tier_holds);
    free(j->name);
    free(j->path);
    free(j->ident);
    free(j);
    *jp = NULL;
}

static void append(wb_load_job **list, wb_load_job *job)
{
    job->next = NULL;
    while (*list)
        list = &(*list)->next;
    *list = job;
}

static void *loader_main(void *arg)
{
    wb_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !l->queue)
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop)
            break;
        wb_load_job *j = l->queue;
        l->queue = j->next;
        j->next = NULL;
        l->current = j;
        pthread_mutex_unlock(&l->mu);

        wb__load_job_run(j, NULL);

        pthread_mutex_lock(&l->mu);
        l->current = NULL;
        append(&l->done, j);
        uint64_t one = 1;
        ssize_t w = write(l->efd, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int wb__loader_start(wb_loader *l, wb_err *err)
{
    memset(l, 0, sizeof *l);
    l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->efd < 0)
        return wb__err_errno(err, WB_EIO, errno, "eventfd for load completions");
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int e = pthread_create(&l->thread, NULL, loader_main, l);
    if (e != 0) {
        close(l->efd);
        l->efd = -1;
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        return wb__err_errno(err, WB_EIO, e, "starting the loader thread");
    }
    l->running = 1;
    return WB_OK;
}

void wb__loader_submit(wb_loader *l, wb_load_job *job)
{
    pthread_mutex_lock(&l->mu);
    append(&l->queue, job);
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

int wb__loader_cancel(wb_loader *l, wb_load_job *job)
{
    int queued = 0;
    pthread_mutex_lock(&l->mu);
    for (wb_load_job **p = &l->queue; *p; p = &(*p)->next) {
        if (*p != job)
            continue;
        *p = job->next;
        job->rc = wb__err_set(&job->err, WB_ESTATE,
                              "the load of '%s' was cancelled before it started", job->name);
        append(&l->done, job);
        uint64_t one = 1;
        ssize_t w = write(l->efd, &one, sizeof one);
        (void)w;
        queued = 1;
        break;
    }
    if (!queued)
        atomic_store(&job->cancel, 1);
    pthread_mutex_unlock(&l->mu);
    return queued;
}

wb_load_job *wb__loader_take_done(wb_loader *l)
{
    uint64_t v;
    ssize_t r = read(l->efd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&l->mu);
    wb_load_job *list = l->done;
    l->done = NULL;
    pthread_mutex_unlock(&l->mu);
    return list;
}

wb_load_job *wb__loader_stop(wb_loader *l)
{
    if (!l->running)
        return NULL;
    pthread_mutex_lock(&l->mu);
    if (l->current)
        atomic_store(&l->current->cancel, 1);
    l->stop = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->running = 0;

    wb_load_job *list = l->done;
    l->done = NULL;
    for (wb_load_job *j = l->queue; j;) {
        wb_load_job *next = j->next;
        j->rc = wb__err_set(&j->err, WB_ESTATE, "the broker stopped before loading '%s'", j->name);
        append(&list, j);
        j = next;
    }
    l->queue = NULL;
    close(l->efd);
    l->efd = -1;
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    return list;
}
