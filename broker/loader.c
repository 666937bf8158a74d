#include "loader.h"
#include "tier.h"

#include "auth_files.h"
#include "clock.h"
#include "alloc.h"
#include "log.h"
#include "publish.h"
#include "safetensors.h"
#include "share.h"
#include "stage_fanout.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Copies the table's description of the tensors and lays them out in one
 * slab; returns the slab size through *size. */
int wb__load_layout(const wb_st_table *table, wb_model_data *d, uint64_t *size, wb_err *err)
{
    d->tensors = wb__calloc(table->n_tensors ? table->n_tensors : 1, sizeof *d->tensors);
    if (!d->tensors)
        return wb__err_set(err, WB_ENOMEM, "out of memory for a table of %zu tensors",
                           table->n_tensors);
    /* Counted once there is an array to free them from. */
    d->n_tensors = table->n_tensors;
    uint64_t off = 0;
    for (size_t i = 0; i < table->n_tensors; i++) {
        const wb_st_tensor *st = &table->tensors[i];
        wb_model_tensor *t = &d->tensors[i];
        t->name = wb__strdup(st->name);
        if (!t->name)
            return wb__err_set(err, WB_ENOMEM, "out of memory copying tensor names");
        const char *dt = wb__dtype_name(st->dtype);
        snprintf(t->dtype, sizeof t->dtype, "%s", dt ? dt : "?");
        t->ndim = st->ndim;
        if (st->ndim) {
            t->shape = wb__malloc(st->ndim * sizeof *t->shape);
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

/* The files a load reads: descriptors, and for mapped loads mappings
 * registered with the copy engine. */
typedef struct inputs {
    uint32_t n;
    int *fds;
    uint8_t **maps;
    uint64_t *lens;
    int *registered;
    wb_copy_engine *engine;
} inputs;

static void inputs_close(inputs *in)
{
    for (uint32_t i = 0; i < in->n; i++) {
        if (in->registered && in->registered[i])
            in->engine->host_unregister(in->engine->ctx, in->maps[i]);
        if (in->maps && in->maps[i])
            munmap(in->maps[i], (size_t)in->lens[i]);
        if (in->fds && in->fds[i] >= 0)
            close(in->fds[i]);
    }
    free(in->fds);
    free(in->maps);
    free(in->lens);
    free(in->registered);
    memset(in, 0, sizeof *in);
}

static int inputs_open(inputs *in, const wb_st_table *table, int mapped,
                       const wb_load_access *access, wb_err *err)
{
    uint32_t n = table->n_files;
    in->fds = wb__malloc((n ? n : 1) * sizeof *in->fds);
    in->maps = wb__calloc(n ? n : 1, sizeof *in->maps);
    in->lens = wb__calloc(n ? n : 1, sizeof *in->lens);
    in->registered = wb__calloc(n ? n : 1, sizeof *in->registered);
    if (!in->fds || !in->maps || !in->lens || !in->registered)
        return wb__err_set(err, WB_ENOMEM, "out of memory opening %u files", n);
    for (uint32_t i = 0; i < n; i++)
        in->fds[i] = -1;
    in->n = n;
    for (uint32_t i = 0; i < n; i++) {
        /* The file was validated by path; it is opened again here, so a path
         * swapped for a FIFO or a different file in between must be caught:
         * never block on the open, and insist on the validated regular file. */
        in->fds[i] = open(table->files[i], O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (in->fds[i] < 0) {
            int e = errno;
            return e == ENOENT ? wb__err_set(err, WB_ENOTFOUND, "no such file: %s", table->files[i])
                               : wb__err_errno(err, WB_EIO, e, "open %s", table->files[i]);
        }
        struct stat sb;
        if (fstat(in->fds[i], &sb) != 0)
            return wb__err_errno(err, WB_EIO, errno, "fstat %s", table->files[i]);
        if (!S_ISREG(sb.st_mode))
            return wb__err_set(err, WB_EFORMAT, "%s is no longer a regular file", table->files[i]);
        /* Judged again on the descriptor whose bytes are read: the path may
         * lead elsewhere now than when the header was. */
        int arc = wb__auth_check_peer_fd((void *)access, in->fds[i], table->files[i], err);
        if (arc != WB_OK)
            return arc;
        if ((uint64_t)sb.st_size != table->file_sizes[i])
            return wb__err_set(err, WB_EFORMAT,
                               "%s changed while loading: %llu bytes, validated with %llu",
                               table->files[i], (unsigned long long)sb.st_size,
                               (unsigned long long)table->file_sizes[i]);
        if (!mapped || table->file_sizes[i] == 0)
            continue;
        void *p = mmap(NULL, (size_t)table->file_sizes[i], PROT_READ, MAP_SHARED, in->fds[i], 0);
        if (p == MAP_FAILED)
            return wb__err_errno(err, WB_EIO, errno, "mmap %s", table->files[i]);
        in->maps[i] = p;
        in->lens[i] = table->file_sizes[i];
    }
    return WB_OK;
}

static int inputs_register(inputs *in, wb_copy_engine *e, const wb_st_table *table, wb_err *err)
{
    in->engine = e;
    for (uint32_t i = 0; i < in->n; i++) {
        if (!in->maps[i])
            continue;
        int rc = e->host_register(e->ctx, in->maps[i], (size_t)in->lens[i], err);
        if (rc != WB_OK) {
            char msg[WB_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return wb__err_set(err, rc, "%s: %s", table->files[i], msg);
        }
        in->registered[i] = 1;
    }
    return WB_OK;
}

/* The backend's slab_prepare, as the pipeline calls it. */
typedef struct slab_ref {
    const wb_backend *be;
    wb_slab *slab;
} slab_ref;

static int prepare_slab(void *ctx, uint64_t offset, uint64_t len, wb_err *err)
{
    slab_ref *r = ctx;
    return r->be->slab_prepare(r->slab, offset, len, err);
}

/* Allocates one slab per device. A device whose allocation fails gets a
 * failed copy (the others go on); with a single device the load fails. */
int wb__load_alloc_copies(const wb_load_opts *o, const int *devs, unsigned n, uint64_t size,
                          wb_model_data *d, wb_err *err)
{
    const wb_backend *be = o->backend;
    d->slabs = wb__calloc(n, sizeof *d->slabs);
    d->copies = wb__calloc(n, sizeof *d->copies);
    if (!d->slabs || !d->copies)
        return wb__err_set(err, WB_ENOMEM, "out of memory for %u copies", n);
    d->n_slabs = d->n_copies = n;
    unsigned ok = 0;
    for (unsigned k = 0; k < n; k++) {
        wb_model_copy *c = &d->copies[k];
        c->device = devs[k];
        c->state = WBPROTO__MODEL_STATE__MODEL_READY;
        const wb_gpu_dev *g = o->gpus ? wb__devlist_find_index(o->gpus, devs[k]) : NULL;
        if (g)
            snprintf(c->uuid, sizeof c->uuid, "%s", g->uuid);
        wb_err e;
        int rc = be->slab_alloc(&d->slabs[k], devs[k], size, &e);
        if (rc != WB_OK) {
            if (n == 1)
                return wb__err_set(err, rc, "%s", e.msg);
            memset(&d->slabs[k], 0, sizeof d->slabs[k]);
            c->state = WBPROTO__MODEL_STATE__MODEL_FAILED;
            snprintf(c->error, sizeof c->error, "%s", e.msg);
            continue;
        }
        ok++;
    }
    if (ok == 0)
        return wb__err_set(err, WB_ENOMEM, "no slab could be allocated on any of %u devices: %s", n,
                           d->copies[0].error);
    return WB_OK;
}

/* "4.60 GB (4600000000 bytes)" */
static const char *fmt_bytes(char *buf, size_t size, uint64_t n)
{
    snprintf(buf, size, "%.2f GB (%llu bytes)", (double)n / 1e9, (unsigned long long)n);
    return buf;
}

/* Whether a slab of `size` bytes fits on each device, by what the backend
 * says is free there (mem_free; a backend without it, or a device it cannot
 * tell, is not judged): refused WB_ENOMEM before any slab is allocated, the
 * current version of a rollout untouched. */
int wb__load_check_fits(const wb_load_opts *o, const char *path, const int *devs, unsigned n,
                        uint64_t size, wb_err *err)
{
    const wb_backend *be = o->backend;
    if (o->budget) {
        char what[WB_NAME_MAX + 64];
        if (o->beside)
            snprintf(what, sizeof what, "%s of '%s' (version %u)", o->verb ? o->verb : "rollout",
                     o->name ? o->name : path, o->version);
        else
            snprintf(what, sizeof what, "%s of '%s'", o->verb ? o->verb : "load",
                     o->name ? o->name : path);
        uint64_t scratch = 0;
        int retry = 0;
        int rc = wb__budget_fits(o->budget, what, devs, n, size, o->budget_wait_ms, o->cancel,
                                 o->budget_reserved ? o->budget_reserved : &scratch, &retry, err);
        if (o->budget_retry)
            *o->budget_retry = retry;
        if (o->budget_need)
            *o->budget_need = size;
        if (rc != WB_OK)
            return rc;
        /* Only a load's check reserves (the loop gives it back). */
        if (!o->budget_reserved)
            wb__budget_unreserve(o->budget, devs, n, size);
    }
    if (!be->mem_free)
        return WB_OK;
    for (unsigned k = 0; k < n; k++) {
        uint64_t avail = 0;
        char where[160] = "", what[WB_NAME_MAX + 64], need[64], have[64];
        wb_err e;
        if (be->mem_free(be, devs[k], &avail, where, sizeof where, &e) != WB_OK)
            continue;
        if (size <= avail)
            continue;
        if (o->beside)
            snprintf(what, sizeof what, "%s of '%s' (version %u) does not fit beside version %u",
                     o->verb ? o->verb : "rollout", o->name ? o->name : path, o->version,
                     o->beside);
        else
            snprintf(what, sizeof what, "%s of '%s' does not fit", o->verb ? o->verb : "load",
                     o->name ? o->name : path);
        const wb_gpu_dev *g = o->gpus ? wb__devlist_find_index(o->gpus, devs[k]) : NULL;
        if (devs[k] >= 0)
            return wb__err_set(err, WB_ENOMEM, "%s on device %d (%s): needs %s, %s free", what,
                               devs[k], g ? g->uuid : "no UUID known",
                               fmt_bytes(need, sizeof need, size),
                               fmt_bytes(have, sizeof have, avail));
        return wb__err_set(err, WB_ENOMEM, "%s in %s: needs %s, %s free", what, where,
                           fmt_bytes(need, sizeof need, size), fmt_bytes(have, sizeof have, avail));
    }
    return WB_OK;
}

/* Ends a copy that failed during the load: its reason, and its slab freed. */
static void fail_copy(const wb_backend *be, wb_model_data *d, unsigned k, const wb_err *why)
{
    wb_model_copy *c = &d->copies[k];
    if (c->state == WBPROTO__MODEL_STATE__MODEL_FAILED)
        return;
    c->state = WBPROTO__MODEL_STATE__MODEL_FAILED;
    snprintf(c->error, sizeof c->error, "%s", why->msg);
    be->slab_free(&d->slabs[k]);
    memset(&d->slabs[k], 0, sizeof d->slabs[k]);
}

/* Where a load's copies go: the slabs, and on the cuda backend the fan-out
 * over their devices' engines. Attached before the pipeline starts, or,
 * for a staged load, by its copier while the readers fill the ring, so
 * that the allocation (0.4-1.3 ms on the H200 host, a kept slab's included)
 * overlaps the first reads. */
typedef struct dest {
    const wb_load_opts *o;
    const int *devs;
    unsigned n_devs;
    uint64_t size;
    int fan;
    wb_model_data *d;
    wb_stage_fanout_target *targets; /* n_devs */
    wb_stage_fanout *fanout;
    wb_staging *fan_ring; /* staged fan-out: the ring the job reads through */
} dest;

static int dest_attach(void *arg, wb_stage_job *job, wb_err *err)
{
    dest *x = arg;
    const wb_backend *be = x->o->backend;
    wb_model_data *d = x->d;
    double t = wb__clock_mono_s();
    int rc = wb__load_alloc_copies(x->o, x->devs, x->n_devs, x->size, d, err);
    d->alloc_seconds = wb__clock_mono_s() - t;
    if (rc != WB_OK)
        return rc;
    if (!x->fan) {
        if (job->mode != WB_STAGE_DIRECT)
            job->dst = d->slabs[0].dev_ptr;
        return WB_OK;
    }
    /* Each device copies through its own engine; the file is read once
     * and every chunk goes to every device. */
    wb_stage_fanout_target *targets = x->targets;
    for (unsigned k = 0; k < x->n_devs; k++) {
        targets[k] = (wb_stage_fanout_target){
            .device = x->devs[k], .dst = d->slabs[k].dev_ptr, .copy_seconds = -1};
        if (d->copies[k].state != WBPROTO__MODEL_STATE__MODEL_READY) {
            targets[k].failed = 1;
            wb__err_set(&targets[k].err, WB_ENOMEM, "%s", d->copies[k].error);
            continue;
        }
        if (be->device_engine(be, x->devs[k], &targets[k].engine, &targets[k].err) != WB_OK) {
            if (x->n_devs == 1)
                return wb__err_set(err, targets[k].err.code, "%s", targets[k].err.msg);
            targets[k].failed = 1;
            fail_copy(be, d, k, &targets[k].err);
        }
    }
    if ((rc = wb__stage_fanout_init(x->fanout, targets, x->n_devs, err)) != WB_OK)
        return rc;
    if (job->mode == WB_STAGE_STAGED)
        x->fan_ring->engine = x->fanout->engine;
    job->engine = &x->fanout->engine;
    job->dst = x->fanout->base;
    return WB_OK;
}

/* How a load opens its checkpoint's table: wb__load_ex's way (the peer's
 * access to each file), or a job's checks. */
typedef int (*table_open)(void *ctx, const char *path, const wb_load_opts *o, wb_st_table **table,
                          wb_err *err);

static int open_judged(void *ctx, const char *path, const wb_load_opts *o, wb_st_table **table,
                       wb_err *err)
{
    (void)ctx;
    wb_st_open_opts so = {.check_file = wb__auth_check_peer_fd, .arg = (void *)o->access};
    return wb__st_open_ex(path, &so, table, err);
}

static int load(const char *path, const wb_load_opts *o, table_open open_table, void *open_ctx,
                wb_model_data *out, wb_err *err)
{
    const wb_backend *be = o->backend;
    memset(out, 0, sizeof *out);
    double t0 = wb__clock_mono_s();
    int mode = be->load_mode ? be->load_mode : WB_STAGE_DIRECT;
    if (mode == WB_STAGE_STAGED && !be->staging)
        return wb__err_set(err, WB_EINTERNAL, "backend %s has no staging ring", be->name);
    if (mode == WB_STAGE_MAPPED && (!be->engine || !be->engine->host_register))
        return wb__err_set(err, WB_EINTERNAL, "backend %s cannot register mappings", be->name);
    /* The host backend keeps one copy in host memory, whatever the
     * placement says: every device reaches it. */
    int host = be->proto == WBPROTO__BACKEND__BACKEND_HOST || mode == WB_STAGE_DIRECT;
    int one_device = o->device;
    const int *devs = o->n_devices && !host ? o->devices : &one_device;
    unsigned n_devs = o->n_devices && !host ? o->n_devices : 1;
    if (host)
        one_device = -1;
    if (n_devs > WB_GPU_MAX)
        return wb__err_set(err, WB_EINVAL, "%u devices: at most %d", n_devs, WB_GPU_MAX);
    int fan = !host && be->device_engine;
    if (n_devs > 1 && !fan)
        return wb__err_set(err, WB_ENOSYS, "backend %s loads to one device only", be->name);
    wb_st_table *table = NULL;
    int rc = open_table(open_ctx, path, o, &table, err);
    if (rc != WB_OK)
        return rc;
    /* A big index takes a while to parse: a load stopped meanwhile
     * allocates nothing. */
    if (o->cancel && atomic_load(o->cancel)) {
        wb__st_table_free(&table);
        return wb__err_set(err, WB_ESTATE, "the load was cancelled (the broker is stopping)");
    }

    wb_model_data d = {0};
    inputs in = {0};
    wb_stage_tensor *st = NULL;
    size_t *own = NULL, n_own = 0;
    wb_stage_fanout_target targets[WB_GPU_MAX];
    wb_stage_fanout fanout;
    wb_staging fan_ring;
    uint64_t size = 0;
    double t1 = wb__clock_mono_s();
    d.open_seconds = t1 - t0;
    d.headers_remembered = table->remembered;
    if ((rc = wb__load_layout(table, &d, &size, err)) != WB_OK)
        goto done;
    for (size_t i = 0; i < table->n_tensors; i++) {
        const wb_st_tensor *t = &table->tensors[i];
        if (t->file >= table->n_files) {
            rc = wb__err_set(err, WB_EINTERNAL, "tensor '%s' names file %u of %u", t->name, t->file,
                             table->n_files);
            goto done;
        }
    }
    if ((rc = inputs_open(&in, table, mode == WB_STAGE_MAPPED, o->access, err)) != WB_OK)
        goto done;
    /* Tensors already resident elsewhere are compared and left out of the
     * slab (share.h): it fits and is filled by what remains. */
    if (o->share) {
        wb_stage_config sc = be->stage;
        wb__stage_config_fill(&sc);
        /* Its time is logged by event=share_applied. */
        if ((rc = wb__share_apply(o->share, be, devs, n_devs, table, in.fds, sc.read_threads,
                                  o->cancel, &d, &size, err)) != WB_OK)
            goto done;
    }
    if ((rc = wb__load_check_fits(o, path, devs, n_devs, size, err)) != WB_OK)
        goto done;
    if (o->progress) {
        atomic_store(&o->progress->landed, 0);
        atomic_store(&o->progress->total, d.bytes - d.shared_bytes);
    }
    st = wb__calloc(table->n_tensors ? table->n_tensors : 1, sizeof *st);
    own = wb__calloc(table->n_tensors ? table->n_tensors : 1, sizeof *own);
    if (!st || !own) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory preparing the load of %s", path);
        goto done;
    }
    for (size_t i = 0; i < table->n_tensors; i++) {
        const wb_st_tensor *t = &table->tensors[i];
        if (d.tensors[i].slab != 0)
            continue; /* shared: nothing to read */
        own[n_own] = i;
        st[n_own++] = (wb_stage_tensor){.name = t->name,
                                        .file = t->file,
                                        .file_offset = t->offset,
                                        .slab_offset = d.tensors[i].offset,
                                        .nbytes = t->nbytes};
    }
    wb_stage_job job = {
        .mode = mode,
        .tensors = st,
        .n_tensors = n_own,
        .n_files = table->n_files,
        .files = (const char *const *)table->files,
        .fds = in.fds,
        .maps = (const uint8_t *const *)in.maps,
        .map_lens = in.lens,
        .staging = be->staging,
        .engine = be->engine,
        .cfg = be->stage,
        .cancel = o->cancel,
        .landed = o->progress ? &o->progress->landed : NULL,
    };
    if (fan && mode == WB_STAGE_STAGED) {
        /* The same buffers; the engine, the fan-out's, comes with the slabs. */
        fan_ring = *be->staging;
        memset(&fan_ring.engine, 0, sizeof fan_ring.engine);
        job.staging = &fan_ring;
    }
    dest ds = {.o = o,
               .devs = devs,
               .n_devs = n_devs,
               .size = size,
               .fan = fan,
               .d = &d,
               .targets = targets,
               .fanout = &fanout,
               .fan_ring = &fan_ring};
    double t2 = wb__clock_mono_s();
    if (mode == WB_STAGE_STAGED) {
        /* Allocated by the copier while the readers fill the ring. */
        job.before_copy = dest_attach;
        job.before_copy_ctx = &ds;
    } else {
        if ((rc = dest_attach(&ds, &job, err)) != WB_OK)
            goto done;
        t2 = wb__clock_mono_s();
    }
    /* With register threads the pipeline registers the mappings itself, in
     * pieces, while it copies. */
    if (mode == WB_STAGE_MAPPED && be->stage.register_threads == 0) {
        if ((rc = inputs_register(&in, job.engine, table, err)) != WB_OK)
            goto done;
        d.register_seconds = wb__clock_mono_s() - t2;
    }
    slab_ref ref = {be, &d.slabs[0]};
    if (mode == WB_STAGE_DIRECT) {
        if (be->slab_prepare) {
            job.prepare = prepare_slab;
            job.prepare_ctx = &ref;
        }
        job.host_dst = be->slab_dest(&d.slabs[0], 0, d.slabs[0].size);
        if (!job.host_dst && n_own) {
            rc = wb__err_set(err, WB_EINTERNAL, "backend %s gave no host memory to read into",
                             be->name);
            goto done;
        }
    }
    if ((rc = wb__stage_run(&job, &d.stage, err)) != WB_OK)
        goto done;
    if (!d.n_slabs) {
        rc = wb__err_set(err, WB_EINTERNAL, "the load of %s ended with no slab", path);
        goto done;
    }
    for (size_t j = 0; j < n_own; j++)
        d.tensors[own[j]].xxh3 = st[j].xxh3;
    for (unsigned k = 0; fan && k < n_devs; k++) {
        if (targets[k].failed)
            fail_copy(be, &d, k, &targets[k].err);
        else
            d.copies[k].copy_seconds = targets[k].copy_seconds > 0 ? targets[k].copy_seconds : 0;
    }
    if (!fan && mode != WB_STAGE_DIRECT)
        d.copies[0].copy_seconds = d.stage.copy_seconds;
    /* Filled and hashed: nothing may change the bytes from here on. */
    double ts = wb__clock_mono_s();
    for (unsigned k = 0; k < d.n_slabs; k++) {
        if (d.copies[k].state != WBPROTO__MODEL_STATE__MODEL_READY)
            continue;
        if (be->slab_seal && (rc = be->slab_seal(&d.slabs[k], err)) != WB_OK)
            goto done;
        d.slab_bytes += d.slabs[k].size;
    }
    d.seal_seconds = wb__clock_mono_s() - ts;
    inputs_close(&in);
    d.read_seconds = wb__clock_mono_s() - t2;
    d.read_threads = d.stage.threads;
    d.load_seconds = wb__clock_mono_s() - t0;
    d.load_gbps = d.load_seconds > 0 ? (double)d.bytes / d.load_seconds / 1e9 : 0.0;
    /* Last: from here on other loads may point into these slabs. */
    if (o->share)
        wb__share_register(o->share, be, &d);
    *out = d;
    memset(&d, 0, sizeof d);

done:
    /* Mappings are unregistered before the slab goes (nothing copies any
     * more: the pipeline has stopped). */
    inputs_close(&in);
    wb__model_data_free(&d, be);
    free(st);
    free(own);
    wb__st_table_free(&table);
    return rc;
}

int wb__load_ex(const char *path, const wb_load_opts *o, wb_model_data *out, wb_err *err)
{
    return load(path, o, open_judged, NULL, out, err);
}

int wb__load(const char *path, const wb_backend *be, int device, const atomic_int *cancel,
             wb_model_data *out, wb_err *err)
{
    wb_load_opts o = {.backend = be, .device = device, .cancel = cancel};
    return wb__load_ex(path, &o, out, err);
}

/* A job's checks, as the reader asks them about each file: the peer's
 * access, then the limits, all on the descriptor the reader opened. A
 * cancel (an unload, or the broker stopping) ends the walk at the next
 * file. */
typedef struct load_check {
    wb_load_job *job;
    const atomic_int *cancel;
} load_check;

static int check_file(void *arg, int fd, const char *path, wb_err *err)
{
    const load_check *lc = arg;
    if (lc->cancel && atomic_load(lc->cancel))
        return wb__err_set(err, WB_ESTATE, "the load was cancelled (the broker is stopping)");
    return wb__auth_check_peer_fd(&lc->job->access, fd, path, err);
}

static int check_header_len(void *arg, const char *path, uint64_t header_len, wb_err *err)
{
    return wb__limits_check_header_len(&((load_check *)arg)->job->limits, path, header_len, err);
}

static int check_tensor_count(void *arg, const char *index_path, uint64_t tensors, wb_err *err)
{
    (void)index_path;
    const wb_load_job *job = ((load_check *)arg)->job;
    return wb__limits_check_tensors(&job->limits, job->name, tensors, err);
}

static int check_shard_count(void *arg, const char *index_path, uint64_t shards, wb_err *err)
{
    return wb__limits_check_shards(&((load_check *)arg)->job->limits, index_path, shards, err);
}

static void log_refused(const wb_load_job *job, int rc)
{
    char q[300], qp[WB_PATH_MAX + 64], qr[WB_PATH_MAX + 64];
    wb_warn("load_path_refused", "model=%s path=%s status=%s error=%s",
            wb__log_quote(q, sizeof q, job->name), wb__log_quote(qp, sizeof qp, job->path),
            wb_status_name(rc), wb__log_quote(qr, sizeof qr, job->err.msg));
}

/* Opens a job's table after judging the request: the path (what it resolves
 * to, and the peer's access to that), then every file the reader opens, each
 * judged before a byte of it is read and all of them before any header is
 * parsed, so that nothing read from a file reaches the peer before that file
 * has passed. Each file is judged on the descriptor it is read through: a
 * link swapped meanwhile cannot make a message echo bytes of a file the peer
 * may not read. A missing path is the reader's to report, as for any load.
 * A refusal sets job->refused and is logged (limits, WB_ELIMIT, are counted
 * by the broker instead). */
static int open_checked(void *ctx, const char *path, const wb_load_opts *o, wb_st_table **table,
                        wb_err *err)
{
    (void)o;
    load_check *lc = ctx;
    wb_load_job *job = lc->job;
    char resolved[WB_PATH_MAX + 1];
    int is_dir = 0;
    int rc = wb__auth_check_load_path(path, resolved, sizeof resolved, &is_dir, err);
    int found = rc != WB_ENOTFOUND;
    if (!found)
        rc = WB_OK;
    else if (rc == WB_OK)
        rc = wb__auth_check_peer_path(&job->access, resolved, err);
    if (rc == WB_OK) {
        wb_st_open_opts so = {.check_file = check_file,
                              .arg = lc,
                              .check_header = check_header_len,
                              .check_count = check_tensor_count,
                              .check_shards = check_shard_count,
                              .precheck = 1};
        rc = wb__st_open_ex(path, &so, table, err);
        if (rc != WB_EPERM && rc != WB_ELIMIT) {
            if (found && rc == WB_OK) {
                char q[300], qp[WB_PATH_MAX + 64], qr[WB_PATH_MAX + 64];
                wb_info("load_path", "model=%s path=%s resolved=%s kind=%s",
                        wb__log_quote(q, sizeof q, job->name), wb__log_quote(qp, sizeof qp, path),
                        wb__log_quote(qr, sizeof qr, resolved), is_dir ? "directory" : "file");
            }
            /* Failures of the reader are failed loads. */
            return rc;
        }
    }
    job->refused = 1;
    if (rc != WB_ELIMIT)
        log_refused(job, rc);
    return rc;
}

/* glibc keeps what the load freed (the parsed index, the tables' copies)
 * in its arenas, fragmented: a failed load of a big index left hundreds of
 * megabytes resident. Given back here, on the loader's thread. */
static void give_back_memory(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

void wb__load_job_run(wb_load_job *job, const atomic_int *cancel)
{
    if (job->kind == WB_JOB_PUBLISH) {
        wb__publish_copy_run(job);
        return;
    }
    if (job->kind == WB_JOB_CHECKSUM) {
        wb__publish_checksum_run(job);
        return;
    }
    if (job->kind == WB_JOB_FORGET) {
        wb__publish_forget_run(job);
        return;
    }
    if (job->kind == WB_JOB_TIER && job->tier_op != WB_TIER_OP_RELOAD) {
        wb__tier_job_run(job);
        return;
    }
    wb__err_clear(&job->err);
    job->refused = 0;
    if (!cancel)
        cancel = &job->cancel;
    wb_load_opts o = {.backend = job->backend,
                      .device = job->device,
                      .devices = job->devices,
                      .n_devices = job->n_devices,
                      .gpus = job->gpus,
                      .cancel = cancel,
                      .progress = &job->progress,
                      .access = &job->access};
    o.name = job->name;
    o.version = job->version;
    o.beside = job->beside;
    o.share = job->share;
    o.budget = job->budget;
    o.budget_reserved = &job->budget_reserved;
    o.budget_retry = &job->budget_retry;
    o.budget_need = &job->budget_need;
    o.budget_wait_ms = job->budget_wait_ms;
    job->budget_retry = 0;
    load_check lc = {.job = job, .cancel = cancel};
    job->rc =
        load(job->path, &o, job->check ? open_checked : open_judged, &lc, &job->data, &job->err);
    give_back_memory();
}
