/* The readers' crew: threads kept from one load to the next (stage.h).
 *
 * Creating a dozen threads took 0.3-0.9 ms of every load on the GPU hosts
 * (bench/RESULTS.md), time in which no buffer was filled and the copy
 * engine waited. The crew creates them once and wakes them for each run.
 * Each thread has a semaphore of its own and runs the task of its own
 * index, so that a run wakes all of them at once: woken through one shared
 * lock instead, they would start one after the other, each once the one
 * before had let the lock go. One run at a time; a caller that finds the
 * crew busy (a second pipeline in the same process) gets 0 and starts
 * threads of its own. */
#include "stage_impl.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>

typedef struct worker {
    sem_t go; /* a task, or the end */
    unsigned index;
} worker;

static struct {
    pthread_mutex_t mu; /* guards alive, created, busy and the setup of a run */
    worker workers[WB_STAGE_MAX_THREADS];
    unsigned alive;   /* threads waiting for or running tasks */
    unsigned created; /* threads created since the process (or its fork) started */
    int busy;         /* a run is out: from wb__crew_start to wb__crew_wait */
    /* The run, written before the workers' semaphores are posted. */
    void *(*fn)(void *);
    uint8_t *args;
    size_t stride;
    int stopping;
    atomic_uint left;    /* tasks (or, when stopping, threads) not ended yet */
    sem_t done;          /* posted by the last one */
    pthread_cond_t idle; /* busy went to 0 */
} crew = {.mu = PTHREAD_MUTEX_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER};

static void sem_wait_all(sem_t *s)
{
    while (sem_wait(s) != 0 && errno == EINTR)
        ;
}

static void *crew_main(void *arg)
{
    worker *w = arg;
    for (;;) {
        sem_wait_all(&w->go);
        int stop = crew.stopping;
        if (!stop)
            crew.fn(crew.args + (size_t)w->index * crew.stride);
        if (atomic_fetch_sub(&crew.left, 1) == 1)
            sem_post(&crew.done);
        if (stop)
            return NULL;
    }
}

static int sems_ready;

/* A child of fork has none of the crew's threads: it starts afresh. */
static void crew_after_fork(void)
{
    pthread_mutex_init(&crew.mu, NULL);
    pthread_cond_init(&crew.idle, NULL);
    crew.alive = 0;
    crew.created = 0;
    crew.busy = 0;
    crew.stopping = 0;
    crew.fn = NULL;
    crew.args = NULL;
    atomic_store(&crew.left, 0);
    if (sems_ready) {
        sem_init(&crew.done, 0, 0);
        for (unsigned i = 0; i < WB_STAGE_MAX_THREADS; i++)
            sem_init(&crew.workers[i].go, 0, 0);
    }
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void crew_init(void)
{
    sems_ready = sem_init(&crew.done, 0, 0) == 0;
    for (unsigned i = 0; sems_ready && i < WB_STAGE_MAX_THREADS; i++) {
        crew.workers[i].index = i;
        sems_ready = sem_init(&crew.workers[i].go, 0, 0) == 0;
    }
    pthread_atfork(NULL, NULL, crew_after_fork);
}

int wb__stage_reader_attr(pthread_attr_t *a)
{
    if (pthread_attr_init(a) != 0)
        return 0;
    if (pthread_attr_setstacksize(a, READER_STACK) == 0)
        return 1;
    pthread_attr_destroy(a);
    return 0;
}

/* Under crew.mu. Crew threads take no asynchronous signal whichever thread
 * created them (the process's own threads handle those); faults (SIGBUS
 * from a mapping that shrank, stage_read.c) still reach them. */
static unsigned grow(unsigned n)
{
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_attr_t a;
    int small = wb__stage_reader_attr(&a);
    while (crew.alive < n) {
        pthread_t t;
        if (pthread_create(&t, small ? &a : NULL, crew_main, &crew.workers[crew.alive]) != 0)
            break;
        pthread_detach(t);
        crew.alive++;
        crew.created++;
    }
    if (small)
        pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return crew.alive;
}

unsigned wb__crew_start(unsigned n, void *(*fn)(void *), void *args, size_t stride)
{
    if (n == 0)
        return 0;
    if (n > WB_STAGE_MAX_THREADS)
        n = WB_STAGE_MAX_THREADS;
    pthread_once(&once, crew_init);
    if (!sems_ready)
        return 0;
    pthread_mutex_lock(&crew.mu);
    if (crew.busy) {
        pthread_mutex_unlock(&crew.mu);
        return 0;
    }
    unsigned got = grow(n);
    if (got > n)
        got = n;
    if (got) {
        crew.busy = 1;
        crew.fn = fn;
        crew.args = args;
        crew.stride = stride;
        atomic_store(&crew.left, got);
        for (unsigned i = 0; i < got; i++)
            sem_post(&crew.workers[i].go);
    }
    pthread_mutex_unlock(&crew.mu);
    return got;
}

void wb__crew_wait(void)
{
    pthread_mutex_lock(&crew.mu);
    int busy = crew.busy;
    pthread_mutex_unlock(&crew.mu);
    if (!busy)
        return;
    sem_wait_all(&crew.done);
    pthread_mutex_lock(&crew.mu);
    crew.busy = 0;
    crew.fn = NULL;
    crew.args = NULL;
    pthread_cond_broadcast(&crew.idle);
    pthread_mutex_unlock(&crew.mu);
}

void wb__stage_crew_stop(void)
{
    pthread_once(&once, crew_init);
    pthread_mutex_lock(&crew.mu);
    /* A run still out ends first (its caller waits for it); none starts
     * while the threads stop, under the lock. */
    while (crew.busy)
        pthread_cond_wait(&crew.idle, &crew.mu);
    unsigned n = crew.alive;
    if (n) {
        crew.stopping = 1;
        atomic_store(&crew.left, n);
        for (unsigned i = 0; i < n; i++)
            sem_post(&crew.workers[i].go);
        sem_wait_all(&crew.done);
        crew.stopping = 0;
        crew.alive = 0;
    }
    pthread_mutex_unlock(&crew.mu);
}

unsigned wb__stage_crew_threads(unsigned *created)
{
    pthread_mutex_lock(&crew.mu);
    unsigned n = crew.alive;
    if (created)
        *created = crew.created;
    pthread_mutex_unlock(&crew.mu);
    return n;
}
