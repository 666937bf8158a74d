/* wb_bench_load --reuse: why a load into device memory that the previous
 * load just freed runs slower than one into memory no load used (0.82-0.87
 * of the pinned peak against 0.91-0.96 with --keep-loads). Each variant
 * below runs --cycles times, and each cycle is timed on its own:
 *   pinned_peak_fresh         one cudaMemcpyAsync of the checkpoint's bytes
 *                             from a pinned buffer into a new cudaMalloc,
 *                             every cycle's allocation kept to the end
 *   pinned_peak_reused        the same into the allocation freed just
 *                             before (cudaFree, then cudaMalloc again)
 *   pinned_peak_reused_touched  the same with a cudaMemset of it before the
 *                             copy (timed apart): first-touch costs?
 *   pinned_peak_same          one allocation, never freed (a pool's bound)
 *   pinned_peak_fresh_ipc, pinned_peak_reused_ipc  fresh and reused with
 *                             cudaIpcGetMemHandle after each cudaMalloc, as
 *                             the ipc slabs are allocated
 *   vmm_peak_fresh, vmm_peak_reused, vmm_peak_reused_touched, vmm_peak_same
 *                             the same four in cuMemCreate + cuMemAddressReserve
 *                             + cuMemMap + cuMemSetAccess memory, as the vmm
 *                             slabs (unmapped and released when reused)
 *   loader_fresh_<slab>, loader_reused_<slab>  the broker's loader
 *                             (wb__load_ex) into slabs of the cuda backend,
 *                             ipc and vmm, each load's slab kept to the end
 *                             or freed just before the next load
 *   loader_pool_<slab>        the loader's pipeline into one slab of the
 *                             backend allocated once (a pool of slabs);
 *                             a vmm slab is sealed read-only after each load,
 *                             as the loader does, and made writable again
 *                             before the next (that time counts)
 * Variants that compare with each other form a group; a group's cycles run
 * interleaved (cycle c runs each of its variants once, in turn, starting
 * from the (c mod k)-th of its k), so that drift in clocks or temperature
 * is spread over all of them. A fresh allocation is kept until its group
 * ends: a later group's first allocations may get memory an earlier group
 * freed (the addresses are in the report). Every cycle's destination is
 * checked against its source in sampled ranges (a loader's also by every
 * tensor's XXH3-64) and, where it is writable, the ranges are overwritten
 * afterwards, so that a later copy that did not happen cannot pass on
 * bytes left by an earlier one. */
#include "load.h"

#include "cudrv.h"
#include "stage.h"
#include "stage_fanout.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CYCLES 32
/* Ranges compared per destination and their length. */
#define SAMPLES    16
#define SAMPLE_LEN (64u * 1024u)

enum { KIND_RT = 1, KIND_VMM = 2, KIND_LOADER = 3 };
enum { FRESH = 1, REUSED = 2, SAME = 3 };

typedef struct vmm_mem {
    CUmemGenericAllocationHandle h;
    CUdeviceptr p;
    size_t len;
} vmm_mem;

typedef struct variant {
    const char *name, *what;
    int kind, policy;
    int touch; /* cudaMemset of the destination before the copy */
    int ipc;   /* cudaIpcGetMemHandle after each cudaMalloc */
    int slab;  /* loader: WB_CUDA_SLAB_IPC or WB_CUDA_SLAB_VMM */
    /* Per cycle. */
    int n;
    double gbps[MAX_CYCLES];
    double wall_s[MAX_CYCLES];  /* peaks: the copy on the host's clock, enqueue to end */
    double alloc_s[MAX_CYCLES]; /* the allocation (loader: its alloc_seconds) */
    double free_s[MAX_CYCLES];  /* freeing the previous one (reused) */
    double touch_s[MAX_CYCLES];
    double create_s[MAX_CYCLES], map_s[MAX_CYCLES]; /* vmm: cuMemCreate; reserve + map + access */
    double pipe_gbps[MAX_CYCLES], open_s[MAX_CYCLES], pipe_s[MAX_CYCLES], copy_s[MAX_CYCLES],
        read_gbps[MAX_CYCLES], wait_s[MAX_CYCLES], load_s[MAX_CYCLES];
    unsigned long long ptr[MAX_CYCLES];
    uint64_t ranges, bad_ranges, bad_xxh3;
    char error[WB_ERR_MSG_MAX];
    int failed;
    /* The memory it holds. */
    void *cur;
    vmm_mem vcur;
    wb_model_data dcur;
    int have_cur;
    void *held[MAX_CYCLES];
    vmm_mem vheld[MAX_CYCLES];
    wb_model_data dheld[MAX_CYCLES];
    int n_held;
    wb_slab pool;
    double pool_alloc_s; /* its slab_alloc, before the first cycle */
    int have_pool, pool_sealed;
    uint64_t scribble_pending; /* pool vmm: ranges to overwrite once writable */
    wb_model_data pool_last;
} variant;

typedef struct study {
    const reuse_opts *o;
    const reference *ref;
    uint8_t *src; /* pinned: the checkpoint's tensor bytes, back to back */
    uint64_t n;   /* bytes the peaks copy */
    uint64_t slab_bytes;
    cudaStream_t s;
    uint8_t *back, *junk; /* pinned, SAMPLE_LEN each */
    const wb_cudrv *drv;  /* NULL: no vmm here (vmm_why) */
    uint64_t gran;
    char vmm_why[WB_ERR_MSG_MAX];
    wb_backend *be; /* the loader group's backend */
    json_t *seq;
} study;

static double ms_between(cudaEvent_t a, cudaEvent_t b)
{
    cuda_check(cudaEventSynchronize(b), "waiting for an event");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    return ms / 1e3;
}

static void drv_check(const study *st, CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        wb_err e;
        wb__cudrv_fail(st->drv, &e, WB_EIO, r, what);
        die("the reuse study", e.msg);
    }
}

/* ---- the destinations ---- */

static void vmm_alloc(const study *st, vmm_mem *m, double *create_s, double *map_s)
{
    const wb_cudrv *d = st->drv;
    CUmemAllocationProp prop = wb__cudrv_prop(st->o->device);
    m->len = (size_t)wb__vmm_round(st->n, st->gran);
    double t0 = now_s();
    drv_check(st, d->create(&m->h, m->len, &prop, 0), "cuMemCreate of a peak destination");
    double t1 = now_s();
    drv_check(st, d->reserve(&m->p, m->len, 0, 0, 0), "cuMemAddressReserve");
    drv_check(st, d->map(m->p, m->len, 0, m->h, 0), "cuMemMap");
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, st->o->device},
                         CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    drv_check(st, d->set_access(m->p, m->len, &a, 1), "cuMemSetAccess (read-write)");
    *create_s = t1 - t0;
    *map_s = now_s() - t1;
}

static void vmm_free(const study *st, vmm_mem *m)
{
    drv_check(st, st->drv->unmap(m->p, m->len), "cuMemUnmap");
    drv_check(st, st->drv->address_free(m->p, m->len), "cuMemAddressFree");
    drv_check(st, st->drv->release(m->h), "cuMemRelease");
    memset(m, 0, sizeof *m);
}

static void rt_alloc(const study *st, const variant *v, void **p)
{
    cuda_check(cudaMalloc(p, (size_t)st->n), "cudaMalloc of a peak destination");
    if (v->ipc) {
        cudaIpcMemHandle_t h;
        cuda_check(cudaIpcGetMemHandle(&h, *p), "cudaIpcGetMemHandle of a peak destination");
    }
}

/* ---- verification ---- */

/* The offset of sampled range k of n bytes: both ends and evenly between. */
static uint64_t sample_at(uint64_t n, unsigned k, uint64_t len)
{
    return n <= len ? 0 : (n - len) * k / (SAMPLES - 1);
}

/* Compares [dst + off, + len) with `expect`; 1 when they differ. */
static int range_differs(study *st, const uint8_t *dst, const uint8_t *expect, size_t len)
{
    cuda_check(cudaMemcpy(st->back, dst, len, cudaMemcpyDeviceToHost),
               "reading a destination back (cudaMemcpy)");
    return memcmp(st->back, expect, len) != 0;
}

static void scribble(study *st, uint8_t *dst, size_t len)
{
    cuda_check(cudaMemcpy(dst, st->junk, len, cudaMemcpyHostToDevice),
               "overwriting a checked range (cudaMemcpy)");
}

/* A peak's destination against the pinned source; then overwritten. */
static void verify_peak(study *st, variant *v, uint8_t *dst)
{
    for (unsigned k = 0; k < SAMPLES; k++) {
        uint64_t len = st->n < SAMPLE_LEN ? st->n : SAMPLE_LEN, off = sample_at(st->n, k, len);
        v->ranges++;
        v->bad_ranges += range_differs(st, dst + off, st->src + off, (size_t)len);
        scribble(st, dst + off, (size_t)len);
    }
}

/* Visits the sampled ranges of a loaded slab: in SAMPLES tensors spread
 * over the table, the start, middle and end of each. */
typedef void (*range_fn)(study *st, variant *v, uint8_t *dst, const uint8_t *file, size_t len);

static void loader_ranges(study *st, variant *v, const wb_model_data *d, uint8_t *base, range_fn fn)
{
    size_t nt = d->n_tensors, last = (size_t)-1;
    for (unsigned k = 0; nt && k < SAMPLES; k++) {
        size_t i = (nt - 1) * k / (SAMPLES - 1);
        if (i == last)
            continue;
        last = i;
        const wb_model_tensor *mt = &d->tensors[i];
        const wb_st_tensor *t = wb__st_find(st->ref->t, mt->name);
        if (!t || t->nbytes != mt->nbytes) {
            v->ranges++;
            v->bad_ranges++;
            continue;
        }
        uint64_t len = mt->nbytes < SAMPLE_LEN ? mt->nbytes : SAMPLE_LEN;
        uint64_t at[3] = {0, (mt->nbytes - len) / 2, mt->nbytes - len};
        for (int j = 0; len && j < 3; j++)
            fn(st, v, base + mt->offset + at[j], st->ref->map + t->offset + at[j], (size_t)len);
    }
}

static void check_range(study *st, variant *v, uint8_t *dst, const uint8_t *file, size_t len)
{
    v->ranges++;
    v->bad_ranges += range_differs(st, dst, file, len);
}

static void scribble_range(study *st, variant *v, uint8_t *dst, const uint8_t *file, size_t len)
{
    (void)v;
    (void)file;
    scribble(st, dst, len);
}

/* A load against the file: sampled ranges byte for byte, every tensor's
 * checksum against the file's. A writable slab's ranges are overwritten
 * afterwards (a sealed vmm slab is read-only in the broker too). */
static void verify_load(study *st, variant *v, const wb_model_data *d, uint8_t *base, int writable)
{
    loader_ranges(st, v, d, base, check_range);
    for (size_t i = 0; i < d->n_tensors; i++) {
        const wb_st_tensor *t = wb__st_find(st->ref->t, d->tensors[i].name);
        v->bad_xxh3 += !t || st->ref->xxh3[t - st->ref->t->tensors] != d->tensors[i].xxh3;
    }
    if (writable)
        loader_ranges(st, v, d, base, scribble_range);
}

/* ---- one cycle of a peak ---- */

static void peak_cycle(study *st, variant *v, int c)
{
    uint8_t *dst = NULL;
    double t;
    v->free_s[c] = v->alloc_s[c] = v->create_s[c] = v->map_s[c] = 0;
    if (v->policy == REUSED && v->have_cur) {
        /* Freed right before its own allocation: no other variant can get
         * this memory in between. */
        t = now_s();
        if (v->kind == KIND_RT)
            cuda_check(cudaFree(v->cur), "cudaFree of a peak destination");
        else
            vmm_free(st, &v->vcur);
        v->free_s[c] = now_s() - t;
        v->have_cur = 0;
    }
    if (!v->have_cur) {
        t = now_s();
        if (v->kind == KIND_RT)
            rt_alloc(st, v, &v->cur);
        else
            vmm_alloc(st, &v->vcur, &v->create_s[c], &v->map_s[c]);
        v->alloc_s[c] = now_s() - t;
        v->have_cur = 1;
    }
    dst = v->kind == KIND_RT ? v->cur : (uint8_t *)(uintptr_t)v->vcur.p;
    v->ptr[c] = (unsigned long long)(uintptr_t)dst;
    cudaEvent_t a, b;
    cuda_check(cudaEventCreate(&a), "cudaEventCreate");
    cuda_check(cudaEventCreate(&b), "cudaEventCreate");
    v->touch_s[c] = 0;
    if (v->touch) {
        cuda_check(cudaEventRecord(a, st->s), "cudaEventRecord");
        cuda_check(cudaMemsetAsync(dst, 0, (size_t)st->n, st->s), "cudaMemsetAsync");
        cuda_check(cudaEventRecord(b, st->s), "cudaEventRecord");
        v->touch_s[c] = ms_between(a, b);
    }
    t = now_s();
    cuda_check(cudaEventRecord(a, st->s), "cudaEventRecord");
    cuda_check(cudaMemcpyAsync(dst, st->src, (size_t)st->n, cudaMemcpyHostToDevice, st->s),
               "cudaMemcpyAsync of a peak");
    cuda_check(cudaEventRecord(b, st->s), "cudaEventRecord");
    double dev_s = ms_between(a, b);
    v->wall_s[c] = now_s() - t;
    v->gbps[c] = (double)st->n / dev_s / 1e9;
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    verify_peak(st, v, dst);
    if (v->policy == FRESH) {
        /* Kept to the end of the group: the next allocation is new memory. */
        if (v->kind == KIND_RT)
            v->held[v->n_held++] = v->cur;
        else
            v->vheld[v->n_held++] = v->vcur;
        v->have_cur = 0;
    }
}

/* ---- the loader into one kept slab ---- */

/* What wb__load_ex does for one device in staged mode (loader.c: open and
 * lay out the table, open the files, fan the copies out to the device's
 * engine, run the pipeline, seal), into `slab` instead of a new one. */
static int pool_load(const study *st, wb_slab *slab, wb_model_data *d, wb_err *err)
{
    const wb_backend *be = st->be;
    memset(d, 0, sizeof *d);
    double t0 = now_s();
    wb_st_table *table = NULL;
    int rc = wb__st_open(st->o->file, &table, err);
    if (rc != WB_OK)
        return rc;
    int *fds = calloc(table->n_files ? table->n_files : 1, sizeof *fds);
    wb_stage_tensor *tens = calloc(table->n_tensors ? table->n_tensors : 1, sizeof *tens);
    uint64_t size = 0;
    if (!fds || !tens) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory for the pool's load of %s", st->o->file);
        goto done;
    }
    for (uint32_t i = 0; i < table->n_files; i++)
        fds[i] = -1;
    if ((rc = wb__load_layout(table, d, &size, err)) != WB_OK)
        goto done;
    if (size > slab->size) {
        rc = wb__err_set(err, WB_ELIMIT, "the pool's slab holds %llu bytes, the load needs %llu",
                         (unsigned long long)slab->size, (unsigned long long)size);
        goto done;
    }
    for (uint32_t i = 0; i < table->n_files; i++) {
        if ((fds[i] = open(table->files[i], O_RDONLY | O_CLOEXEC)) < 0) {
            rc = wb__err_errno(err, WB_EIO, errno, "open %s", table->files[i]);
            goto done;
        }
    }
    for (size_t i = 0; i < table->n_tensors; i++)
        tens[i] = (wb_stage_tensor){.name = table->tensors[i].name,
                                    .file = table->tensors[i].file,
                                    .file_offset = table->tensors[i].offset,
                                    .slab_offset = d->tensors[i].offset,
                                    .nbytes = table->tensors[i].nbytes};
    double t1 = now_s();
    d->open_seconds = t1 - t0;
    wb_stage_fanout_target target = {
        .device = st->o->device, .dst = slab->dev_ptr, .copy_seconds = -1};
    wb_stage_fanout fan;
    if ((rc = be->device_engine(be, st->o->device, &target.engine, err)) != WB_OK ||
        (rc = wb__stage_fanout_init(&fan, &target, 1, err)) != WB_OK)
        goto done;
    wb_staging ring = *be->staging;
    ring.engine = fan.engine;
    wb_stage_job job = {.mode = WB_STAGE_STAGED,
                        .tensors = tens,
                        .n_tensors = table->n_tensors,
                        .n_files = table->n_files,
                        .files = (const char *const *)table->files,
                        .fds = fds,
                        .staging = &ring,
                        .engine = &fan.engine,
                        .cfg = be->stage,
                        .dst = fan.base};
    if ((rc = wb__stage_run(&job, &d->stage, err)) != WB_OK)
        goto done;
    if (target.failed) {
        rc = wb__err_set(err, target.err.code, "%s", target.err.msg);
        goto done;
    }
    for (size_t i = 0; i < table->n_tensors; i++)
        d->tensors[i].xxh3 = tens[i].xxh3;
    if (be->slab_seal && (rc = be->slab_seal(slab, err)) != WB_OK)
        goto done;
    d->load_seconds = now_s() - t0;
done:
    for (uint32_t i = 0; fds && i < table->n_files; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
    }
    free(fds);
    free(tens);
    wb__st_table_free(&table);
    return rc;
}

/* A sealed vmm slab writable again, as a pool would make it for its next
 * load. */
static void pool_unseal(const study *st, variant *v)
{
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, st->o->device},
                         CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    drv_check(
        st,
        st->drv->set_access((CUdeviceptr)(uintptr_t)v->pool.dev_ptr, (size_t)v->pool.size, &a, 1),
        "cuMemSetAccess (read-write again, for the pool's next load)");
    v->pool_sealed = 0;
}

/* ---- one cycle of the loader ---- */

static void record_load(variant *v, int c, const wb_model_data *d, double whole_s)
{
    const wb_stage_stats *s = &d->stage;
    v->gbps[c] = whole_s > 0 ? (double)d->bytes / whole_s / 1e9 : 0;
    v->pipe_gbps[c] = s->seconds > 0 ? (double)d->bytes / s->seconds / 1e9 : 0;
    v->open_s[c] = d->open_seconds;
    v->pipe_s[c] = s->seconds;
    v->copy_s[c] = s->copy_seconds;
    v->read_gbps[c] = wb__stage_gbps(s->bytes, s->read_busy, s->threads);
    v->wait_s[c] = s->wait_busy;
    v->load_s[c] = whole_s;
}

static void loader_cycle(study *st, variant *v, int c)
{
    const wb_backend *be = st->be;
    v->free_s[c] = v->alloc_s[c] = 0;
    if (v->policy == SAME) {
        double t0 = now_s();
        if (v->pool_sealed)
            pool_unseal(st, v);
        v->alloc_s[c] = now_s() - t0;
        if (v->scribble_pending) {
            /* The previous load's checked ranges, now that they are
             * writable (outside the timed load). */
            loader_ranges(st, v, &v->pool_last, v->pool.dev_ptr, scribble_range);
            v->scribble_pending = 0;
        }
        wb__model_data_free(&v->pool_last, NULL);
        wb_err err;
        double t1 = now_s();
        int rc = pool_load(st, &v->pool, &v->pool_last, &err);
        double whole = now_s() - t1 + v->alloc_s[c];
        if (rc != WB_OK) {
            snprintf(v->error, sizeof v->error, "%s", err.msg);
            v->failed = 1;
            return;
        }
        v->pool_sealed = be->slab_seal != NULL;
        record_load(v, c, &v->pool_last, whole);
        v->ptr[c] = (unsigned long long)(uintptr_t)v->pool.dev_ptr;
        verify_load(st, v, &v->pool_last, v->pool.dev_ptr, !v->pool_sealed);
        v->scribble_pending = v->pool_sealed;
        return;
    }
    if (v->policy == REUSED && v->have_cur) {
        double t0 = now_s();
        wb__model_data_free(&v->dcur, be);
        v->free_s[c] = now_s() - t0;
        v->have_cur = 0;
    }
    double t0 = now_s();
    load_result r = load_once(be, st->o->file, st->o->device, 1);
    double whole = now_s() - t0;
    if (r.rc != WB_OK) {
        snprintf(v->error, sizeof v->error, "%s", r.error);
        v->failed = 1;
        return;
    }
    record_load(v, c, &r.d, whole);
    v->alloc_s[c] = r.d.alloc_seconds;
    v->ptr[c] = (unsigned long long)(uintptr_t)r.d.slabs[0].dev_ptr;
    verify_load(st, v, &r.d, r.d.slabs[0].dev_ptr, be->slab_seal == NULL);
    if (v->policy == FRESH) {
        v->dheld[v->n_held++] = r.d;
    } else {
        v->dcur = r.d;
        v->have_cur = 1;
    }
}

/* ---- groups ---- */

static void release(study *st, variant *v)
{
    for (int i = 0; i < v->n_held; i++) {
        if (v->kind == KIND_RT)
            cudaFree(v->held[i]);
        else if (v->kind == KIND_VMM)
            vmm_free(st, &v->vheld[i]);
        else
            wb__model_data_free(&v->dheld[i], st->be);
    }
    v->n_held = 0;
    if (v->have_cur) {
        if (v->kind == KIND_RT)
            cudaFree(v->cur);
        else if (v->kind == KIND_VMM)
            vmm_free(st, &v->vcur);
        else
            wb__model_data_free(&v->dcur, st->be);
        v->have_cur = 0;
    }
    if (v->have_pool) {
        wb__model_data_free(&v->pool_last, NULL);
        st->be->slab_free(&v->pool);
        v->have_pool = 0;
    }
}

/* Runs a group's variants interleaved; NULL when it ran, else why not. */
static const char *run_group(study *st, variant *const *g, int k, char *why, size_t why_len)
{
    int cycles = st->o->cycles;
    /* Whether the group's memory fits: fresh variants hold one allocation
     * per cycle, the others one. */
    uint64_t need = 0;
    for (int j = 0; j < k; j++)
        need += (g[j]->policy == FRESH ? (uint64_t)cycles : 1) * (st->slab_bytes + 64 * MIB);
    size_t avail = 0, total = 0;
    cuda_check(cudaMemGetInfo(&avail, &total), "cudaMemGetInfo");
    if (need + GIB > avail) {
        snprintf(why, why_len,
                 "needs %.1f GiB of device memory for %d cycles, %.1f GiB free: fewer --cycles "
                 "or a smaller --gib",
                 (double)need / GIB, cycles, (double)avail / GIB);
        return why;
    }
    if (g[0]->kind == KIND_LOADER) {
        loader_cfg c = st->o->cfg;
        c.mode = WB_STAGE_STAGED;
        c.slab = g[0]->slab;
        if (!(st->be = start_backend(st->o->device, &c, NULL, 0))) {
            snprintf(why, why_len, "the cuda backend (%s slabs) did not start (see above)",
                     c.slab == WB_CUDA_SLAB_VMM ? "vmm" : "ipc");
            return why;
        }
    }
    for (int j = 0; j < k; j++) {
        variant *v = g[j];
        if (v->kind == KIND_LOADER && v->policy == SAME) {
            wb_err err;
            double t0 = now_s();
            if (st->be->slab_alloc(&v->pool, st->o->device, st->slab_bytes, &err) != WB_OK)
                die("allocating the pool's slab", err.msg);
            v->pool_alloc_s = now_s() - t0;
            v->have_pool = 1;
        }
    }
    for (int c = 0; c < cycles; c++) {
        for (int j = 0; j < k; j++) {
            variant *v = g[(j + c) % k];
            if (v->failed)
                continue;
            if (v->kind == KIND_LOADER)
                loader_cycle(st, v, c);
            else
                peak_cycle(st, v, c);
            if (!v->failed)
                v->n = c + 1;
            char step[96];
            snprintf(step, sizeof step, "%s[%d]", v->name, c);
            json_array_append_new(st->seq, json_string(step));
        }
    }
    for (int j = 0; j < k; j++)
        release(st, g[j]);
    if (st->be)
        wb__backend_cuda_free(&st->be);
    return NULL;
}

/* ---- the report ---- */

static void put_list(json_t *o, const char *key, const double *v, int n)
{
    json_object_set_new(o, key, samples_json(v, n));
}

static double median_from(double *v, int n, int from)
{
    return n > from ? median(v + from, n - from) : 0;
}

static json_t *variant_json(variant *v, const char *group, double ref_peak)
{
    json_t *o = json_object();
    json_object_set_new(o, "what", json_string(v->what));
    json_object_set_new(o, "group", json_string(group));
    json_object_set_new(o, "cycles", json_integer(v->n));
    if (v->error[0])
        json_object_set_new(o, "error", json_string(v->error));
    if (v->n == 0)
        return o;
    double m = median(v->gbps, v->n);
    put_list(o, "gbps", v->gbps, v->n);
    json_object_set_new(o, "median_gbps", json_real(m));
    json_object_set_new(o, "median_gbps_from_cycle_1", json_real(median_from(v->gbps, v->n, 1)));
    json_object_set_new(o, "over_reference_peak", json_real(ref_peak > 0 ? m / ref_peak : 0));
    put_list(o, "alloc_seconds", v->alloc_s, v->n);
    if (v->kind == KIND_LOADER && v->policy == SAME)
        json_object_set_new(o, "pool_slab_alloc_seconds", json_real(v->pool_alloc_s));
    if (v->policy == REUSED)
        put_list(o, "free_seconds", v->free_s, v->n);
    if (v->kind == KIND_VMM) {
        put_list(o, "create_seconds", v->create_s, v->n);
        put_list(o, "reserve_map_access_seconds", v->map_s, v->n);
    }
    if (v->touch)
        put_list(o, "touch_seconds", v->touch_s, v->n);
    if (v->kind == KIND_LOADER) {
        double pm = median(v->pipe_gbps, v->n);
        put_list(o, "pipeline_gbps", v->pipe_gbps, v->n);
        json_object_set_new(o, "median_pipeline_gbps", json_real(pm));
        json_object_set_new(o, "pipeline_over_reference_peak",
                            json_real(ref_peak > 0 ? pm / ref_peak : 0));
        put_list(o, "load_seconds", v->load_s, v->n);
        put_list(o, "open_seconds", v->open_s, v->n);
        put_list(o, "pipeline_seconds", v->pipe_s, v->n);
        put_list(o, "copy_device_seconds", v->copy_s, v->n);
        put_list(o, "read_gbps", v->read_gbps, v->n);
        put_list(o, "wait_seconds_summed", v->wait_s, v->n);
    } else {
        put_list(o, "copy_wall_seconds", v->wall_s, v->n);
    }
    json_t *p = json_array();
    for (int i = 0; i < v->n; i++) {
        char h[32];
        snprintf(h, sizeof h, "0x%llx", v->ptr[i]);
        json_array_append_new(p, json_string(h));
    }
    json_object_set_new(o, "dst", p);
    json_t *vf = json_object();
    json_object_set_new(vf, "ranges_compared", json_integer((json_int_t)v->ranges));
    json_object_set_new(vf, "range_mismatches", json_integer((json_int_t)v->bad_ranges));
    if (v->kind == KIND_LOADER)
        json_object_set_new(vf, "xxh3_mismatches", json_integer((json_int_t)v->bad_xxh3));
    json_object_set_new(o, "verify", vf);
    json_object_set_new(o, "verified", json_boolean(v->bad_ranges == 0 && v->bad_xxh3 == 0));
    return o;
}

static double median_of(variant *v)
{
    return v->n ? median(v->gbps, v->n) : 0;
}

static variant vs[] = {
    {"pinned_peak_fresh", "pinned -> a new cudaMalloc each cycle, all kept", KIND_RT, FRESH},
    {"pinned_peak_reused", "pinned -> the cudaMalloc freed just before, allocated again", KIND_RT,
     REUSED},
    {"pinned_peak_reused_touched", "as pinned_peak_reused, after a cudaMemset of it (timed apart)",
     KIND_RT, REUSED, 1},
    {"pinned_peak_same", "pinned -> one cudaMalloc made at its first cycle, never freed", KIND_RT,
     SAME},
    {"pinned_peak_fresh_ipc", "as pinned_peak_fresh, with cudaIpcGetMemHandle after cudaMalloc",
     KIND_RT, FRESH, 0, 1},
    {"pinned_peak_reused_ipc", "as pinned_peak_reused, with cudaIpcGetMemHandle after cudaMalloc",
     KIND_RT, REUSED, 0, 1},
    {"vmm_peak_fresh", "pinned -> a new cuMemCreate mapping each cycle, all kept", KIND_VMM, FRESH},
    {"vmm_peak_reused", "pinned -> cuMemCreate + map again right after unmapping and releasing",
     KIND_VMM, REUSED},
    {"vmm_peak_reused_touched", "as vmm_peak_reused, after a cudaMemset of it (timed apart)",
     KIND_VMM, REUSED, 1},
    {"vmm_peak_same", "pinned -> one cuMemCreate mapping made at its first cycle", KIND_VMM, SAME},
    {"loader_fresh_ipc", "wb__load_ex, ipc slabs, every load's slab kept", KIND_LOADER, FRESH, 0, 0,
     WB_CUDA_SLAB_IPC},
    {"loader_reused_ipc", "wb__load_ex, ipc slabs, the previous load freed just before",
     KIND_LOADER, REUSED, 0, 0, WB_CUDA_SLAB_IPC},
    {"loader_pool_ipc", "the loader's pipeline into one ipc slab allocated once", KIND_LOADER, SAME,
     0, 0, WB_CUDA_SLAB_IPC},
    {"loader_fresh_vmm", "wb__load_ex, vmm slabs, every load's slab kept", KIND_LOADER, FRESH, 0, 0,
     WB_CUDA_SLAB_VMM},
    {"loader_reused_vmm", "wb__load_ex, vmm slabs, the previous load freed just before",
     KIND_LOADER, REUSED, 0, 0, WB_CUDA_SLAB_VMM},
    {"loader_pool_vmm",
     "the loader's pipeline into one vmm slab allocated once, sealed after each load and made "
     "writable before the next",
     KIND_LOADER, SAME, 0, 0, WB_CUDA_SLAB_VMM},
};
#define NV ((int)(sizeof vs / sizeof vs[0]))

static variant *by_name(const char *name)
{
    for (int i = 0; i < NV; i++) {
        if (strcmp(vs[i].name, name) == 0)
            return &vs[i];
    }
    die("the reuse study: no variant", name);
    return NULL;
}

typedef struct group {
    const char *name;
    const char *members[4];
    int vmm; /* needs cuMemCreate */
} group;

/* The reference group first: its pinned_peak_same is what every variant is
 * compared with. */
static const group groups[] = {
    {"cudaMalloc",
     {"pinned_peak_fresh", "pinned_peak_reused", "pinned_peak_reused_touched", "pinned_peak_same"},
     0},
    {"cudaMalloc with IPC handles", {"pinned_peak_fresh_ipc", "pinned_peak_reused_ipc"}, 0},
    {"cuMemCreate",
     {"vmm_peak_fresh", "vmm_peak_reused", "vmm_peak_reused_touched", "vmm_peak_same"},
     1},
    {"loader, ipc slabs", {"loader_fresh_ipc", "loader_reused_ipc", "loader_pool_ipc"}, 0},
    {"loader, vmm slabs", {"loader_fresh_vmm", "loader_reused_vmm", "loader_pool_vmm"}, 1},
};
#define NG ((int)(sizeof groups / sizeof groups[0]))

static void put_ratio(json_t *o, const char *num, const char *den)
{
    variant *a = by_name(num), *b = by_name(den);
    double x = median_of(a), y = median_of(b);
    if (x <= 0 || y <= 0)
        return;
    char key[128];
    snprintf(key, sizeof key, "%s_over_%s", num, den);
    json_object_set_new(o, key, json_real(x / y));
}

int reuse_study(const reuse_opts *o, const reference *ref, json_t *root)
{
    study st = {.o = o, .ref = ref};
    st.n = ref->t->total_bytes;
    for (size_t i = 0; i < ref->t->n_tensors; i++)
        st.slab_bytes = ((st.slab_bytes + WB_SLAB_ALIGN - 1) & ~(uint64_t)(WB_SLAB_ALIGN - 1)) +
                        ref->t->tensors[i].nbytes;
    if (st.n == 0)
        die(o->file, "the reuse study needs a checkpoint with tensor bytes");
    cuda_check(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaHostAlloc((void **)&st.back, SAMPLE_LEN, 0), "cudaHostAlloc");
    cuda_check(cudaHostAlloc((void **)&st.junk, SAMPLE_LEN, 0), "cudaHostAlloc");
    memset(st.junk, 0x5a, SAMPLE_LEN);
    double t0 = now_s();
    cuda_check(cudaHostAlloc((void **)&st.src, (size_t)st.n, 0),
               "cudaHostAlloc of the peaks' source (the checkpoint's size)");
    uint64_t at = 0;
    for (size_t i = 0; i < ref->t->n_tensors; i++) {
        memcpy(st.src + at, ref->map + ref->t->tensors[i].offset, ref->t->tensors[i].nbytes);
        at += ref->t->tensors[i].nbytes;
    }
    printf("reuse: pinned source of %.2f GiB filled from the file in %.1f s\n", (double)st.n / GIB,
           now_s() - t0);
    wb_err err;
    if (wb__cudrv_vmm_check(o->device, &st.gran, &err) != WB_OK ||
        wb__cudrv_get(&st.drv, &err) != WB_OK) {
        st.drv = NULL;
        snprintf(st.vmm_why, sizeof st.vmm_why, "%s", err.msg);
    }
    cuda_check(cudaSetDevice(o->device), "cudaSetDevice");

    json_t *rm = json_object();
    json_object_set_new(root, "reused_memory", rm);
    json_object_set_new(rm, "cycles", json_integer(o->cycles));
    json_object_set_new(rm, "bytes", json_integer((json_int_t)st.n));
    json_object_set_new(rm, "slab_bytes", json_integer((json_int_t)st.slab_bytes));
    json_object_set_new(
        rm, "pinned_source",
        json_string("one cudaHostAlloc of the checkpoint's tensor bytes, filled from the file; "
                    "every peak copies all of it in one cudaMemcpyAsync, timed by events"));
    json_object_set_new(
        rm, "order",
        json_string("by group (in the order of \"groups\"); within a group interleaved: cycle c "
                    "runs each of its k variants once, starting from the (c mod k)-th; the "
                    "sequence lists every step"));
    if (st.drv)
        json_object_set_new(rm, "vmm_granularity", json_integer((json_int_t)st.gran));
    else
        json_object_set_new(rm, "vmm_unavailable", json_string(st.vmm_why));
    json_object_set_new(rm, "loader_config", cfg_json(&o->cfg));
    st.seq = json_array();
    json_object_set_new(rm, "sequence", st.seq);
    json_t *gj = json_array();
    json_object_set_new(rm, "groups", gj);

    int incomplete = 0;
    for (int i = 0; i < NG; i++) {
        variant *g[4];
        int k = 0;
        json_t *e = json_object();
        json_t *names = json_array();
        for (; k < 4 && groups[i].members[k]; k++) {
            g[k] = by_name(groups[i].members[k]);
            json_array_append_new(names, json_string(g[k]->name));
        }
        json_object_set_new(e, "name", json_string(groups[i].name));
        json_object_set_new(e, "variants", names);
        size_t avail = 0, total = 0;
        cuda_check(cudaMemGetInfo(&avail, &total), "cudaMemGetInfo");
        json_object_set_new(e, "device_free_bytes_before", json_integer((json_int_t)avail));
        char why[WB_ERR_MSG_MAX + 64];
        const char *skip = NULL;
        if (groups[i].vmm && !st.drv) {
            snprintf(why, sizeof why, "no cuda-vmm: %s", st.vmm_why);
            skip = why;
        } else {
            double g0 = now_s();
            skip = run_group(&st, g, k, why, sizeof why);
            json_object_set_new(e, "seconds", json_real(now_s() - g0));
            if (!skip)
                printf("reuse: group %s: %d cycles in %.1f s\n", groups[i].name, o->cycles,
                       now_s() - g0);
        }
        if (skip) {
            json_object_set_new(e, "skipped", json_string(skip));
            printf("reuse: group %s skipped: %s\n", groups[i].name, skip);
            incomplete = 1;
        }
        json_array_append_new(gj, e);
        save(root, o->out);
    }

    variant *refv = by_name("pinned_peak_same");
    double peak = median_of(refv);
    json_t *rp = json_object();
    json_object_set_new(rp, "variant", json_string(refv->name));
    json_object_set_new(rp, "gbps", json_real(peak));
    json_object_set_new(rp, "destination",
                        json_string("one cudaMalloc allocation of the checkpoint's size, made "
                                    "at its first cycle and copied into every cycle, never "
                                    "freed (as the pinned_peak of the other modes)"));
    json_object_set_new(rm, "reference_peak", rp);
    json_t *vj = json_object();
    json_object_set_new(rm, "variants", vj);
    int ok = 1;
    printf("%-28s %8s %6s %9s %9s  %s\n", "reuse variant", "GB/s", "/peak", "alloc s", "free s",
           "verify");
    for (int i = 0; i < NG; i++) {
        for (int k = 0; k < 4 && groups[i].members[k]; k++) {
            variant *v = by_name(groups[i].members[k]);
            json_object_set_new(vj, v->name, variant_json(v, groups[i].name, peak));
            int good = v->bad_ranges == 0 && v->bad_xxh3 == 0;
            ok &= good;
            incomplete |= v->failed || v->n < o->cycles;
            if (v->n == 0) {
                printf("%-28s %8s %s\n", v->name, "-", v->error[0] ? v->error : "not run");
                continue;
            }
            double m = median(v->gbps, v->n);
            printf("%-28s %8.2f %6.3f %9.4f %9.4f  %s%s%s\n", v->name, m, peak > 0 ? m / peak : 0,
                   median(v->alloc_s, v->n), median(v->free_s, v->n), good ? "ok" : "MISMATCH",
                   v->error[0] ? "  error: " : "", v->error);
        }
    }
    json_t *ra = json_object();
    put_ratio(ra, "pinned_peak_reused", "pinned_peak_fresh");
    put_ratio(ra, "pinned_peak_reused_touched", "pinned_peak_fresh");
    put_ratio(ra, "pinned_peak_same", "pinned_peak_fresh");
    put_ratio(ra, "pinned_peak_reused_ipc", "pinned_peak_fresh_ipc");
    put_ratio(ra, "vmm_peak_reused", "vmm_peak_fresh");
    put_ratio(ra, "vmm_peak_reused_touched", "vmm_peak_fresh");
    put_ratio(ra, "vmm_peak_same", "vmm_peak_fresh");
    put_ratio(ra, "loader_reused_ipc", "loader_fresh_ipc");
    put_ratio(ra, "loader_pool_ipc", "loader_fresh_ipc");
    put_ratio(ra, "loader_reused_vmm", "loader_fresh_vmm");
    put_ratio(ra, "loader_pool_vmm", "loader_fresh_vmm");
    json_object_set_new(rm, "ratios", ra);
    json_object_set_new(rm, "verified", json_boolean(ok));
    json_object_set_new(rm, "complete", json_boolean(!incomplete));
    save(root, o->out);
    printf("reuse: reference peak (pinned_peak_same) %.2f GB/s; verified: %s%s\n", peak,
           ok ? "yes" : "NO (mismatch)",
           incomplete ? "; some variants did not run (see above)" : "");

    cudaFreeHost(st.src);
    cudaFreeHost(st.back);
    cudaFreeHost(st.junk);
    cudaStreamDestroy(st.s);
    return ok && !incomplete ? 0 : 1;
}
