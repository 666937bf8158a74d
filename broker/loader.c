#include "loader.h"

#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* Reads are split into chunks small enough to be checksummed while they are
 * still in the CPU's cache, and so that a cancel request is seen soon. */
#define LOAD_CHUNK (4u * 1024u * 1024u)

static double mono_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads exactly len bytes at offset, retrying short reads and EINTR. */
static int read_full(int fd, void *buf, size_t len, uint64_t offset, const char *file,
                     const char *tensor, wb_err *err)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(offset + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return wb__err_errno(err, WB_EIO, errno, "%s: reading tensor '%s' at offset %llu", file,
                                 tensor, (unsigned long long)(offset + got));
        }
        if (r == 0)
            return wb__err_set(err, WB_EIO,
                               "%s: tensor '%s': the file ends at %llu, before the tensor's "
                               "%zu bytes",
                               file, tensor, (unsigned long long)(offset + got), len);
        got += (size_t)r;
    }
    return WB_OK;
}

static int cancelled(const atomic_int *cancel)
{
    return cancel && atomic_load(cancel);
}

/* Copies the table's description of the tensors and lays them out in one
 * slab; returns the slab size through *size. */
static int layout(const wb_st_table *table, wb_model_data *d, uint64_t *size, wb_err *err)
{
    d->n_tensors = table->n_tensors;
    d->tensors = calloc(table->n_tensors ? table->n_tensors : 1, sizeof *d->tensors);
    if (!d->tensors)
        return wb__err_set(err, WB_ENOMEM, "out of memory for a table of %zu tensors",
                           table->n_tensors);
    uint64_t off = 0;
    for (size_t i = 0; i < table->n_tensors; i++) {
        const wb_st_tensor *st = &table->tensors[i];
        wb_model_tensor *t = &d->tensors[i];
        t->name = strdup(st->name);
        if (!t->name)
            return wb__err_set(err, WB_ENOMEM, "out of memory copying tensor names");
        const char *dt = wb__dtype_name(st->dtype);
        snprintf(t->dtype, sizeof t->dtype, "%s", dt ? dt : "?");
        t->ndim = st->ndim;
        if (st->ndim) {
            t->shape = malloc(st->ndim * sizeof *t->shape);
            if (!t->shape)
                return wb__err_set(err, WB_ENOMEM, "out of memory copying tensor shapes");
            memcpy(t->shape, st->shape, st->ndim * sizeof *t->shape);
        }
        uint64_t aligned = (off + (WB_SLAB_ALIGN - 1)) & ~(uint64_t)(WB_SLAB_ALIGN - 1);
        if (aligned < off || st->nbytes > UINT64_MAX - aligned)
            return wb__err_set(err, WB_EFORMAT, "tensor '%s': the slab size overflows", st->name);
        t->slab = 0;
        t->offset = aligned;
        t->nbytes = st->nbytes;
        off = aligned + st->nbytes;
        d->bytes += st->nbytes;
    }
    *size = off;
    return WB_OK;
}

/* Reads one tensor into the slab and returns its checksum. */
static int load_tensor(const wb_backend *be, wb_slab *slab, int fd, const char *file,
                       const wb_st_tensor *st, wb_model_tensor *t, uint8_t **bounce,
                       XXH3_state_t *xs, const atomic_int *cancel, wb_err *err)
{
    XXH3_64bits_reset(xs);
    uint64_t done = 0;
    while (done < t->nbytes) {
        if (cancelled(cancel))
            return wb__err_set(err, WB_ESTATE, "the load was cancelled (the broker is stopping)");
        uint64_t left = t->nbytes - done;
        size_t n = left < LOAD_CHUNK ? (size_t)left : LOAD_CHUNK;
        uint8_t *dst = be->slab_dest(slab, t->offset + done, n);
        if (!dst) {
            /* Device memory: read into host memory first, then copy. */
            if (!*bounce && !(*bounce = malloc(LOAD_CHUNK)))
                return wb__err_set(err, WB_ENOMEM, "out of memory for a staging buffer");
            dst = *bounce;
        }
        int rc = read_full(fd, dst, n, st->offset + done, file, st->name, err);
        if (rc != WB_OK)
            return rc;
        XXH3_64bits_update(xs, dst, n);
        if (dst == *bounce && (rc = be->slab_write(slab, t->offset + done, dst, n, err)) != WB_OK)
            return rc;
        done += n;
    }
    t->xxh3 = XXH3_64bits_digest(xs);
    return WB_OK;
}

/* Several threads read tensors at once: faulting in and filling slab pages
 * scales with threads (measured on a 16-core host: 4 GiB from the page cache
 * read in 3.0 s by one thread, 0.5 s by eight). */
#define LOAD_MAX_THREADS 8

typedef struct order_ent {
    uint64_t nbytes;
    size_t index;
} order_ent;

/* Largest first; equal sizes in table order. */
static int by_size_desc(const void *a, const void *b)
{
    const order_ent *x = a, *y = b;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? 1 : -1;
    return x->index < y->index ? -1 : x->index > y->index;
}

typedef struct load_ctx {
    const wb_backend *be;
    wb_slab *slab;
    const wb_st_table *table;
    wb_model_data *d;
    const int *fds;
    const order_ent *order; /* tensors, largest first */
    const atomic_int *cancel;
    atomic_size_t next;
    atomic_int failed;
    pthread_mutex_t mu;
    int rc; /* the first error, and its message */
    wb_err err;
} load_ctx;

static void load_fail(load_ctx *c, int rc, const wb_err *err)
{
    pthread_mutex_lock(&c->mu);
    if (c->rc == WB_OK) {
        c->rc = rc;
        c->err = *err;
    }
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->failed, 1);
}

/* Takes tensors one at a time until none are left or a load failed. */
static void *load_worker(void *arg)
{
    load_ctx *c = arg;
    wb_err err;
    uint8_t *bounce = NULL;
    XXH3_state_t *xs = XXH3_createState();
    if (!xs) {
        wb__err_set(&err, WB_ENOMEM, "out of memory for a checksum state");
        load_fail(c, WB_ENOMEM, &err);
        return NULL;
    }
    while (!atomic_load(&c->failed)) {
        size_t k = atomic_fetch_add(&c->next, 1);
        if (k >= c->table->n_tensors)
            break;
        size_t i = c->order[k].index;
        const wb_st_tensor *st = &c->table->tensors[i];
        int rc = load_tensor(c->be, c->slab, c->fds[st->file], c->table->files[st->file], st,
                             &c->d->tensors[i], &bounce, xs, c->cancel, &err);
        if (rc != WB_OK) {
            load_fail(c, rc, &err);
            break;
        }
    }
    free(bounce);
    XXH3_freeState(xs);
    return NULL;
}

/* Reads every tensor into the slab with up to LOAD_MAX_THREADS threads (one
 * when the backend cannot be written directly, since its slab_write need not
 * be thread-safe). */
static int load_all(const wb_backend *be, wb_slab *slab, const wb_st_table *table, wb_model_data *d,
                    const int *fds, const atomic_int *cancel, wb_err *err)
{
    d->read_threads = 1;
    size_t n = table->n_tensors;
    if (n == 0)
        return WB_OK;
    order_ent *order = malloc(n * sizeof *order);
    if (!order)
        return wb__err_set(err, WB_ENOMEM, "out of memory ordering %zu tensors", n);
    for (size_t i = 0; i < n; i++) {
        order[i].nbytes = table->tensors[i].nbytes;
        order[i].index = i;
    }
    /* Largest first, so that one big tensor does not start last. */
    qsort(order, n, sizeof *order, by_size_desc);

    load_ctx c = {.be = be,
                  .slab = slab,
                  .table = table,
                  .d = d,
                  .fds = fds,
                  .order = order,
                  .cancel = cancel};
    atomic_init(&c.next, 0);
    atomic_init(&c.failed, 0);
    pthread_mutex_init(&c.mu, NULL);

    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = cpus > 0 ? (size_t)cpus : 1;
    if (threads > LOAD_MAX_THREADS)
        threads = LOAD_MAX_THREADS;
    if (threads > n)
        threads = n;
    if (!be->slab_dest(slab, 0, 0))
        threads = 1;
    pthread_t tids[LOAD_MAX_THREADS];
    size_t started = 0;
    for (size_t i = 1; i < threads; i++) {
        if (pthread_create(&tids[started], NULL, load_worker, &c) != 0)
            break; /* fewer threads still finish the job */
        started++;
    }
    d->read_threads = (unsigned)started + 1;
    load_worker(&c);
    for (size_t i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    pthread_mutex_destroy(&c.mu);
    free(order);
    if (c.rc != WB_OK)
        return wb__err_set(err, c.rc, "%s", c.err.msg);
    return WB_OK;
}

int wb__load(const char *path, const wb_backend *be, int device, const atomic_int *cancel,
             wb_model_data *out, wb_err *err)
{
    memset(out, 0, sizeof *out);
    double t0 = mono_seconds();
    wb_st_table *table = NULL;
    int rc = wb__st_open(path, &table, err);
    if (rc != WB_OK)
        return rc;

    wb_model_data d = {0};
    int *fds = NULL;
    uint64_t size = 0;
    double t1 = mono_seconds(), t2 = t1;
    d.open_seconds = t1 - t0;
    if ((rc = layout(table, &d, &size, err)) != WB_OK)
        goto done;

    fds = malloc((table->n_files ? table->n_files : 1) * sizeof *fds);
    if (!fds) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory preparing the load of %s", path);
        goto done;
    }
    for (uint32_t i = 0; i < table->n_files; i++)
        fds[i] = -1;
    for (uint32_t i = 0; i < table->n_files; i++) {
        fds[i] = open(table->files[i], O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) {
            int e = errno;
            rc = e == ENOENT ? wb__err_set(err, WB_ENOTFOUND, "no such file: %s", table->files[i])
                             : wb__err_errno(err, WB_EIO, e, "open %s", table->files[i]);
            goto done;
        }
    }
    for (size_t i = 0; i < table->n_tensors; i++) {
        if (table->tensors[i].file >= table->n_files) {
            rc = wb__err_set(err, WB_EINTERNAL, "tensor '%s' names file %u of %u",
                             table->tensors[i].name, table->tensors[i].file, table->n_files);
            goto done;
        }
    }

    d.slabs = calloc(1, sizeof *d.slabs);
    if (!d.slabs) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory for a slab");
        goto done;
    }
    if ((rc = be->slab_alloc(&d.slabs[0], device, size, err)) != WB_OK)
        goto done;
    d.n_slabs = 1;
    d.slab_bytes = d.slabs[0].size;
    t2 = mono_seconds();
    d.alloc_seconds = t2 - t1;

    if ((rc = load_all(be, &d.slabs[0], table, &d, fds, cancel, err)) != WB_OK)
        goto done;
    d.read_seconds = mono_seconds() - t2;
    d.load_seconds = mono_seconds() - t0;
    d.load_gbps = d.load_seconds > 0 ? (double)d.bytes / d.load_seconds / 1e9 : 0.0;
    *out = d;
    memset(&d, 0, sizeof d);

done:
    wb__model_data_free(&d, be);
    if (fds) {
        for (uint32_t i = 0; i < table->n_files; i++) {
            if (fds[i] >= 0)
                close(fds[i]);
        }
    }
    free(fds);
    wb__st_table_free(&table);
    return rc;
}

wb_load_job *wb__load_job_new(const char *name, const char *path, const wb_backend *be, int device,
                              const void *ident, size_t ident_len, uint64_t request_id)
{
    wb_load_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->name = strdup(name);
    j->path = strdup(path);
    if (ident && ident_len) {
        j->ident = malloc(ident_len);
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
    return j;
}

void wb__load_job_free(wb_load_job **jp)
{
    if (!jp || !*jp)
        return;
    wb_load_job *j = *jp;
    wb__model_data_free(&j->data, j->backend);
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
        pthread_mutex_unlock(&l->mu);

        wb__err_clear(&j->err);
        j->rc = wb__load(j->path, j->backend, j->device, &l->cancel, &j->data, &j->err);

        pthread_mutex_lock(&l->mu);
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
    atomic_init(&l->cancel, 0);
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
    atomic_store(&l->cancel, 1);
    pthread_mutex_lock(&l->mu);
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
