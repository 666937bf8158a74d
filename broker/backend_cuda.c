/* The cuda backend: one cudaMalloc slab per model on one device, exported
 * with cudaIpcGetMemHandle, or (--cuda-slab vmm) one cuMemCreate allocation
 * exported as a descriptor (backend_vmm.h). Slabs are filled by the loader
 * through a ring of pinned staging buffers that is allocated once, here,
 * when the backend starts (pinning is slow: never per load), and one
 * non-blocking stream whose per-buffer events tell the loader when a buffer
 * may be refilled.
 * Nothing here issues a pageable or synchronous copy. */
#include "alloc.h"
#include "backend.h"
#include "backend_vmm.h"
#include "log.h"

#include "devlist.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

/* One device's copy engine: its own non-blocking stream and one event per
 * staging buffer, so that several devices copy the same chunk at once. */
typedef struct dev_engine {
    int device;
    cudaStream_t stream;
    cudaEvent_t *events; /* one per staging buffer */
    unsigned n_events;
    cudaEvent_t ev_start, ev_end;
    int started;
    int no_batch; /* the runtime or driver has no cudaMemcpyBatchAsync */
    wb_copy_engine engine;
} dev_engine;

typedef struct cuda_state {
    wb_backend be;
    int device;
    dev_engine main; /* --device's, started with the backend */
    /* The other devices' engines, started by the loader when a model is
     * first placed there; guarded by mu. */
    pthread_mutex_t mu;
    dev_engine *others[WB_GPU_MAX];
    unsigned buffers; /* staging buffers (events per engine); 0 in mapped mode */
    uint8_t *pinned;  /* one allocation, cut into the ring's buffers */
    size_t huge_len;  /* nonzero: pinned is an mmap of this many bytes, registered */
    wb_staging staging;
} cuda_state;

static int cuda_fail(wb_err *err, int code, cudaError_t e, const char *what)
{
    return wb__err_set(err, code, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The NVIDIA driver's user-space library, which the runtime loads. */
#define DRIVER_LIBRARY "libcuda.so.1"

/* Words a failed cudaGetDeviceCount. Without the driver the runtime says
 * its "driver version is insufficient for CUDA runtime version", which
 * sends an operator to upgrade a driver that is not there. */
static int no_gpu(wb_err *err, cudaError_t e)
{
    if (e == cudaErrorInsufficientDriver) {
        void *lib = dlopen(DRIVER_LIBRARY, RTLD_LAZY | RTLD_LOCAL);
        if (!lib) {
            const char *why = dlerror();
            return wb__err_set(err, WB_ENOGPU,
                               "the cuda backend needs the NVIDIA driver: its library %s cannot "
                               "be loaded (%s); install the driver, or use --backend host",
                               DRIVER_LIBRARY, why ? why : "not found");
        }
        dlclose(lib);
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        if (driver > 0)
            return wb__err_set(err, WB_ENOGPU,
                               "the cuda backend needs a newer NVIDIA driver: the driver supports "
                               "CUDA %d.%d, this build's runtime is CUDA %d.%d (%s)",
                               driver / 1000, driver % 1000 / 10, runtime / 1000,
                               runtime % 1000 / 10, cudaGetErrorName(e));
        return wb__err_set(err, WB_ENOGPU,
                           "the cuda backend needs the NVIDIA driver: %s is there but reports no "
                           "driver (is the nvidia kernel module loaded?) (%s)",
                           DRIVER_LIBRARY, cudaGetErrorName(e));
    }
    return cuda_fail(err, WB_ENOGPU, e, "no usable GPU: cudaGetDeviceCount");
}

int wb__backend_cuda_probe(int *count, wb_err *err)
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return no_gpu(err, e);
    if (n < 1)
        return wb__err_set(err, WB_ENOGPU, "no usable GPU: the CUDA runtime sees 0 devices");
    *count = n;
    return WB_OK;
}

static int set_device(int device, wb_err *err)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "cudaSetDevice(%d)", device);
        return cuda_fail(err, WB_ENOGPU, e, what);
    }
    return WB_OK;
}

/* What the device has free now: a rollout is judged by it before its
 * slabs are allocated beside the current version's. */
static int cuda_mem_free(const wb_backend *be, int device, uint64_t *bytes, char *where,
                         size_t where_len, wb_err *err)
{
    (void)be;
    int rc = set_device(device, err);
    if (rc != WB_OK)
        return rc;
    size_t avail = 0, total = 0;
    cudaError_t e = cudaMemGetInfo(&avail, &total);
    if (e != cudaSuccess)
        return cuda_fail(err, WB_EIO, e, "cudaMemGetInfo");
    /* Slabs the pool keeps are freed before a load allocates its own. */
    *bytes = avail + wb__vmm_pool_bytes(device);
    snprintf(where, where_len, "device %d", device);
    return WB_OK;
}

static int cuda_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    memset(slab, 0, sizeof *slab);
    int rc = set_device(device, err);
    if (rc != WB_OK)
        return rc;
    /* An empty model still gets a slab, so that its lease has a handle. */
    uint64_t bytes =
        size ? (size + WB_SLAB_ALIGN - 1) & ~(uint64_t)(WB_SLAB_ALIGN - 1) : WB_SLAB_ALIGN;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, (size_t)bytes);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaMalloc of %llu bytes on device %d",
                 (unsigned long long)bytes, device);
        return cuda_fail(err, WB_ENOMEM, e, what);
    }
    cudaIpcMemHandle_t h;
    e = cudaIpcGetMemHandle(&h, p);
    if (e != cudaSuccess) {
        cudaFree(p);
        return cuda_fail(err, WB_EIO, e, "cudaIpcGetMemHandle");
    }
    _Static_assert(sizeof h == WB_CUDA_IPC_HANDLE_LEN, "cudaIpcMemHandle_t is 64 bytes");
    memcpy(slab->ipc_handle, &h, sizeof h);
    slab->dev_ptr = p;
    slab->size = bytes;
    slab->device = device;
    return WB_OK;
}

static void *cuda_dest(wb_slab *slab, uint64_t offset, uint64_t len)
{
    (void)slab;
    (void)offset;
    (void)len;
    return NULL;
}

static void cuda_export(wb_slab *slab, Wbproto__Slab *out)
{
    wbproto__slab__init(out);
    out->index = slab->index;
    out->backend = WBPROTO__BACKEND__BACKEND_CUDA;
    out->device = slab->device;
    out->size = slab->size;
    out->cuda_ipc_handle.data = slab->ipc_handle;
    out->cuda_ipc_handle.len = WB_CUDA_IPC_HANDLE_LEN;
    out->transport = "cuda-ipc";
}

static void cuda_slab_free(wb_slab *slab)
{
    if (slab->dev_ptr) {
        /* Importers keep the memory alive until they close their handles. */
        cudaSetDevice(slab->device);
        cudaFree(slab->dev_ptr);
        slab->dev_ptr = NULL;
    }
    slab->size = 0;
}

/* A share's comparison (share.h): device to host through the calling
 * thread's own stream, so that readers on several threads do not wait on
 * each other or on the loader's copies. */
static int cuda_slab_read(const wb_slab *slab, uint64_t offset, void *dst, uint64_t len,
                          wb_err *err)
{
    int rc = wb__slab_read_check(slab, slab->dev_ptr != NULL, offset, len, err);
    if (rc != WB_OK)
        return rc;
    cudaError_t e = cudaSetDevice(slab->device);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst, (const uint8_t *)slab->dev_ptr + offset, (size_t)len,
                            cudaMemcpyDeviceToHost, cudaStreamPerThread);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamPerThread);
    if (e != cudaSuccess)
        return wb__err_set(err, WB_EIO, "reading %llu bytes of the slab on device %d back: %s",
                           (unsigned long long)len, slab->device, cudaGetErrorString(e));
    return WB_OK;
}

/* ---- the copy engine ---- */

static int eng_begin(void *ctx, wb_err *err)
{
    dev_engine *s = ctx;
    s->started = 0;
    return set_device(s->device, err);
}

/* The load's start, recorded before its first copy. */
static int eng_start(dev_engine *s, wb_err *err)
{
    if (s->started)
        return WB_OK;
    cudaError_t e = cudaEventRecord(s->ev_start, s->stream);
    if (e != cudaSuccess)
        return cuda_fail(err, WB_EIO, e, "cudaEventRecord");
    s->started = 1;
    return WB_OK;
}

static int eng_submit(void *ctx, int buf, const void *src, void *dst, size_t len, wb_err *err)
{
    dev_engine *s = ctx;
    int rc = eng_start(s, err);
    if (rc != WB_OK)
        return rc;
    cudaError_t e = cudaMemcpyAsync(dst, src, len, cudaMemcpyHostToDevice, s->stream);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaMemcpyAsync of %zu bytes to the slab on device %d", len,
                 s->device);
        return cuda_fail(err, WB_EIO, e, what);
    }
    if (buf >= 0) {
        if ((unsigned)buf >= s->n_events)
            return wb__err_set(err, WB_EINTERNAL, "staging buffer %d of %u", buf, s->n_events);
        if ((e = cudaEventRecord(s->events[buf], s->stream)) != cudaSuccess)
            return cuda_fail(err, WB_EIO, e, "cudaEventRecord");
    }
    return WB_OK;
}

/* cudaMemcpyBatchAsync: CUDA 12.8 added it with a failIdx argument, 13.0
 * dropped that argument. */
static cudaError_t batch_copy(void **dsts, const void **srcs, size_t *lens, size_t n,
                              cudaStream_t st)
{
#if CUDART_VERSION >= 12080
    struct cudaMemcpyAttributes at;
    memset(&at, 0, sizeof at);
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t at_idx = 0;
#if CUDART_VERSION >= 13000
    return cudaMemcpyBatchAsync(dsts, srcs, lens, n, &at, &at_idx, 1, st);
#else
    size_t fail_idx = 0;
    return cudaMemcpyBatchAsync(dsts, srcs, lens, n, &at, &at_idx, 1, &fail_idx, st);
#endif
#else
    (void)dsts;
    (void)srcs;
    (void)lens;
    (void)n;
    (void)st;
    return cudaErrorNotSupported;
#endif
}

/* A batch of the ring's copies in one call, then each buffer's event. A
 * runtime or driver without batches gets the copies one at a time. */
static int eng_submit_many(void *ctx, const wb_copy *cp, unsigned n, wb_err *err)
{
    dev_engine *s = ctx;
    if (n == 0 || n > WB_STAGE_MAX_BATCH)
        return wb__err_set(err, WB_EINTERNAL, "a batch of %u copies", n);
    for (unsigned i = 0; i < n; i++) {
        if (cp[i].buf < 0 || (unsigned)cp[i].buf >= s->n_events)
            return wb__err_set(err, WB_EINTERNAL, "staging buffer %d of %u", cp[i].buf,
                               s->n_events);
    }
    if (n == 1 || s->no_batch) {
        for (unsigned i = 0; i < n; i++) {
            int rc = eng_submit(s, cp[i].buf, cp[i].src, cp[i].dst, cp[i].len, err);
            if (rc != WB_OK)
                return rc;
        }
        return WB_OK;
    }
    int rc = eng_start(s, err);
    if (rc != WB_OK)
        return rc;
    void *dsts[WB_STAGE_MAX_BATCH];
    const void *srcs[WB_STAGE_MAX_BATCH];
    size_t lens[WB_STAGE_MAX_BATCH];
    for (unsigned i = 0; i < n; i++) {
        dsts[i] = cp[i].dst;
        srcs[i] = cp[i].src;
        lens[i] = cp[i].len;
    }
    cudaError_t e = batch_copy(dsts, srcs, lens, n, s->stream);
    if (e == cudaErrorNotSupported || e == cudaErrorCallRequiresNewerDriver) {
        cudaGetLastError(); /* not sticky: clear it */
        s->no_batch = 1;
        return eng_submit_many(s, cp, n, err);
    }
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaMemcpyBatchAsync of %u copies to the slab on device %d", n,
                 s->device);
        return cuda_fail(err, WB_EIO, e, what);
    }
    for (unsigned i = 0; i < n; i++) {
        if ((e = cudaEventRecord(s->events[cp[i].buf], s->stream)) != cudaSuccess)
            return cuda_fail(err, WB_EIO, e, "cudaEventRecord");
    }
    return WB_OK;
}

static int eng_query(void *ctx, int buf, wb_err *err)
{
    dev_engine *s = ctx;
    if (buf < 0 || (unsigned)buf >= s->n_events)
        return wb__err_set(err, WB_EINTERNAL, "staging buffer %d of %u", buf, s->n_events);
    cudaError_t e = cudaEventQuery(s->events[buf]);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady)
        return 0;
    return cuda_fail(err, WB_EIO, e, "a copy to the slab failed (cudaEventQuery)");
}

static int eng_finish(void *ctx, double *device_seconds, wb_err *err)
{
    dev_engine *s = ctx;
    *device_seconds = -1;
    cudaError_t e;
    if (!s->started) {
        e = cudaStreamSynchronize(s->stream);
        return e == cudaSuccess ? WB_OK : cuda_fail(err, WB_EIO, e, "cudaStreamSynchronize");
    }
    s->started = 0;
    if ((e = cudaEventRecord(s->ev_end, s->stream)) != cudaSuccess ||
        (e = cudaEventSynchronize(s->ev_end)) != cudaSuccess) {
        cudaStreamSynchronize(s->stream);
        return cuda_fail(err, WB_EIO, e, "waiting for the copies to the slab");
    }
    float ms = 0;
    if (cudaEventElapsedTime(&ms, s->ev_start, s->ev_end) == cudaSuccess)
        *device_seconds = ms / 1000.0;
    return WB_OK;
}

static int eng_register(void *ctx, void *addr, size_t len, wb_err *err)
{
    dev_engine *s = ctx;
    int rc = set_device(s->device, err);
    if (rc != WB_OK)
        return rc;
    /* A file mapping is read-only: pin it without asking for write access. */
    /* Portable: every device of a multi-device load copies from it. */
    cudaError_t e =
        cudaHostRegister(addr, len, cudaHostRegisterReadOnly | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaHostRegister of a %zu-byte file mapping", len);
        return cuda_fail(err, WB_EIO, e, what);
    }
    return WB_OK;
}

static void eng_unregister(void *ctx, void *addr)
{
    (void)ctx;
    cudaHostUnregister(addr);
}

#define HUGE_PAGE (2ull * 1024 * 1024)

/* Bytes of [p, p + len) in transparent huge pages, from /proc/self/smaps
 * (the mapping that starts at p); -1 when it cannot be told. */
static long long thp_bytes(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[256];
    int in = 0;
    long long kb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long long a, b;
        if (sscanf(line, "%llx-%llx ", &a, &b) == 2) {
            if (in)
                break;
            in = a == (uintptr_t)p;
        } else if (in && sscanf(line, "AnonHugePages: %lld kB", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* The staging ring in 2 MiB pages, pinned with cudaHostRegister: a
 * hugetlbfs page reservation if the system has one, else transparent huge
 * pages (an aligned anonymous mapping with MADV_HUGEPAGE, touched so that
 * the kernel backs it now). Sets s->pinned, or leaves it NULL when neither
 * could be had, with why in s->staging.pages (the caller then falls back to
 * cudaHostAlloc). A failure to pin is returned as an error. */
static int ring_alloc_huge(cuda_state *s, size_t total, wb_err *err)
{
    size_t len = (total + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
    char *why = s->staging.pages;
    size_t why_len = sizeof s->staging.pages;
    void *p =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    const char *kind = "hugetlb";
    int e_hugetlb = p == MAP_FAILED ? errno : 0;
    if (p == MAP_FAILED) {
        /* Over-allocate by a page to align the start on 2 MiB. */
        uint8_t *raw =
            mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) {
            snprintf(why, why_len, "normal (huge pages: mmap: %s)", strerror(errno));
            return WB_OK;
        }
        uint8_t *a = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
        if (a > raw)
            munmap(raw, (size_t)(a - raw));
        if (a + len < raw + len + HUGE_PAGE)
            munmap(a + len, (size_t)(raw + len + HUGE_PAGE - (a + len)));
        p = a;
        if (madvise(p, len, MADV_HUGEPAGE) != 0) {
            snprintf(why, why_len,
                     "normal (huge pages: no hugetlbfs pages (%s), madvise(MADV_HUGEPAGE): %s)",
                     strerror(e_hugetlb), strerror(errno));
            munmap(p, len);
            return WB_OK;
        }
        kind = "thp";
    }
    memset(p, 0, len);
    long long huge = strcmp(kind, "thp") == 0 ? thp_bytes(p) : (long long)len;
    if (huge == 0) {
        snprintf(why, why_len,
                 "normal (huge pages: no hugetlbfs pages (%s), and no transparent huge pages "
                 "were given)",
                 strerror(e_hugetlb));
        munmap(p, len);
        return WB_OK;
    }
    cudaError_t e = cudaHostRegister(p, total, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        munmap(p, len);
        char what[96];
        snprintf(what, sizeof what, "cudaHostRegister of a %zu-byte staging ring", total);
        return cuda_fail(err, WB_ENOMEM, e, what);
    }
    s->pinned = p;
    s->huge_len = len;
    if (huge < 0)
        snprintf(why, why_len, "%s", kind);
    else
        snprintf(why, why_len, "%s %lld/%zu MiB", kind, huge >> 20, len >> 20);
    return WB_OK;
}

static void dev_engine_free(dev_engine *d)
{
    cudaSetDevice(d->device);
    for (unsigned i = 0; i < d->n_events; i++) {
        if (d->events[i])
            cudaEventDestroy(d->events[i]);
    }
    free(d->events);
    if (d->ev_start)
        cudaEventDestroy(d->ev_start);
    if (d->ev_end)
        cudaEventDestroy(d->ev_end);
    if (d->stream)
        cudaStreamDestroy(d->stream);
    memset(d, 0, sizeof *d);
}

/* Starts a device's engine: stream, timing events, one event per staging
 * buffer. */
static int dev_engine_start(dev_engine *d, int device, unsigned buffers, wb_err *err)
{
    memset(d, 0, sizeof *d);
    d->device = device;
    int rc = set_device(device, err);
    if (rc != WB_OK)
        return rc;
    cudaError_t e;
    char what[64];
    if ((e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        snprintf(what, sizeof what, "cudaStreamCreateWithFlags on device %d", device);
        return cuda_fail(err, WB_ENOGPU, e, what);
    }
    if ((e = cudaEventCreate(&d->ev_start)) != cudaSuccess ||
        (e = cudaEventCreate(&d->ev_end)) != cudaSuccess) {
        snprintf(what, sizeof what, "cudaEventCreate on device %d", device);
        return cuda_fail(err, WB_ENOGPU, e, what);
    }
    if (buffers) {
        d->events = wb__calloc(buffers, sizeof *d->events);
        if (!d->events)
            return wb__err_set(err, WB_ENOMEM, "out of memory for the staging ring's events");
        d->n_events = buffers;
        for (unsigned i = 0; i < buffers; i++) {
            if ((e = cudaEventCreateWithFlags(&d->events[i], cudaEventDisableTiming)) !=
                cudaSuccess) {
                snprintf(what, sizeof what, "cudaEventCreateWithFlags on device %d", device);
                return cuda_fail(err, WB_ENOGPU, e, what);
            }
        }
    }
    d->engine = (wb_copy_engine){
        .ctx = d,
        .begin = eng_begin,
        .submit = eng_submit,
        .submit_many = eng_submit_many,
        .query = eng_query,
        .finish = eng_finish,
        .host_register = eng_register,
        .host_unregister = eng_unregister,
    };
    return WB_OK;
}

/* The engine of `device`: --device's, or another one's, started on first
 * use (a context, a stream and events on that device) and kept until the
 * backend is freed. */
static int cuda_device_engine(const wb_backend *be, int device, wb_copy_engine **out, wb_err *err)
{
    cuda_state *s = be->priv;
    *out = NULL;
    if (device == s->device) {
        *out = &s->main.engine;
        return WB_OK;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return cuda_fail(err, WB_ENOGPU, e, "cudaGetDeviceCount");
    if (device < 0 || device >= count || device >= WB_GPU_MAX)
        return wb__err_set(err, WB_ENOGPU, "no CUDA device %d: the broker sees %d", device, count);
    pthread_mutex_lock(&s->mu);
    int rc = WB_OK;
    if (!s->others[device]) {
        dev_engine *d = wb__calloc(1, sizeof *d);
        if (!d) {
            rc = wb__err_set(err, WB_ENOMEM, "out of memory starting device %d", device);
        } else if ((rc = dev_engine_start(d, device, s->buffers, err)) != WB_OK) {
            dev_engine_free(d);
            free(d);
        } else {
            s->others[device] = d;
        }
    }
    if (rc == WB_OK)
        *out = &s->others[device]->engine;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void state_free(cuda_state *s)
{
    if (!s)
        return;
    for (unsigned i = 0; i < WB_GPU_MAX; i++) {
        if (s->others[i]) {
            dev_engine_free(s->others[i]);
            free(s->others[i]);
        }
    }
    dev_engine_free(&s->main);
    cudaSetDevice(s->device);
    if (s->pinned && s->huge_len) {
        cudaHostUnregister(s->pinned);
        munmap(s->pinned, s->huge_len);
    } else if (s->pinned) {
        cudaFreeHost(s->pinned);
    }
    free(s->staging.bufs);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int wb__backend_cuda_new(const wb_cuda_options *opts, wb_backend **out, wb_err *err)
{
    *out = NULL;
    int mode = opts->load_mode ? opts->load_mode : WB_STAGE_STAGED;
    if (mode != WB_STAGE_STAGED && mode != WB_STAGE_MAPPED)
        return wb__err_set(err, WB_EINVAL, "the cuda backend loads staged or mapped, not %s",
                           wb__stage_mode_name(mode));
    wb_stage_config cfg = opts->stage;
    wb__stage_config_fill(&cfg);
    int rc = wb__stage_config_check(&cfg, err);
    if (rc != WB_OK)
        return rc;
    int count = 0;
    if ((rc = wb__backend_cuda_probe(&count, err)) != WB_OK)
        return rc;
    if (opts->device < 0 || opts->device >= count)
        return wb__err_set(err, WB_ENOGPU, "no CUDA device %d: the runtime sees %d", opts->device,
                           count);

    uint64_t granularity = 0;
    if (opts->slab == WB_CUDA_SLAB_VMM && (rc = wb__vmm_start(opts->device, &granularity, err)))
        return rc;

    cuda_state *s = wb__calloc(1, sizeof *s);
    if (!s)
        return wb__err_set(err, WB_ENOMEM, "out of memory starting the cuda backend");
    pthread_mutex_init(&s->mu, NULL);
    s->device = opts->device;
    s->buffers = mode == WB_STAGE_STAGED ? cfg.buffers : 0;
    if ((rc = dev_engine_start(&s->main, s->device, s->buffers, err)) != WB_OK)
        goto fail;
    if (mode == WB_STAGE_STAGED) {
        size_t total = (size_t)cfg.chunk_bytes * cfg.buffers;
        s->staging.bufs = wb__calloc(cfg.buffers, sizeof *s->staging.bufs);
        if (!s->staging.bufs) {
            rc = wb__err_set(err, WB_ENOMEM, "out of memory for the staging ring");
            goto fail;
        }
        snprintf(s->staging.pages, sizeof s->staging.pages, "normal");
        if (cfg.ring_pages == WB_STAGE_PAGES_HUGE && (rc = ring_alloc_huge(s, total, err)) != WB_OK)
            goto fail;
        void *p = NULL;
        cudaError_t e;
        /* Portable: the ring feeds every device's copies. */
        if (!s->pinned && (e = cudaHostAlloc(&p, total, cudaHostAllocPortable)) != cudaSuccess) {
            char what[128];
            snprintf(what, sizeof what, "cudaHostAlloc of a %u x %llu-byte staging ring",
                     cfg.buffers, (unsigned long long)cfg.chunk_bytes);
            rc = cuda_fail(err, WB_ENOMEM, e, what);
            goto fail;
        }
        if (!s->pinned)
            s->pinned = p;
        for (unsigned i = 0; i < cfg.buffers; i++)
            s->staging.bufs[i] = s->pinned + (size_t)i * cfg.chunk_bytes;
        s->staging.n = cfg.buffers;
        s->staging.size = cfg.chunk_bytes;
        s->staging.engine = s->main.engine;
        s->be.staging = &s->staging;
    }
    s->be.name = "cuda";
    s->be.proto = WBPROTO__BACKEND__BACKEND_CUDA;
    s->be.slab_alloc = cuda_alloc;
    s->be.slab_dest = cuda_dest;
    s->be.slab_export = cuda_export;
    s->be.slab_free = cuda_slab_free;
    s->be.slab_read = cuda_slab_read;
    s->be.mem_free = cuda_mem_free;
    wb__tier_cuda_ops(&s->be);
    s->be.transport = "cuda-ipc";
    s->be.access = "rw";
    if (opts->slab == WB_CUDA_SLAB_VMM) {
        /* A descriptor per slab: the descriptor channel is opened for them. */
        s->be.slab_alloc = wb__vmm_slab_alloc;
        s->be.slab_seal = wb__vmm_slab_seal;
        s->be.slab_fd = wb__vmm_slab_fd;
        s->be.slab_export = wb__vmm_slab_export;
        s->be.slab_free = wb__vmm_slab_free;
        s->be.transport = "cuda-vmm";
        s->be.access = "ro";
        wb_info("cuda_vmm", "device=%d granularity=%llu", opts->device,
                (unsigned long long)granularity);
    }
    s->be.load_mode = mode;
    s->be.stage = cfg;
    s->be.engine = &s->main.engine;
    s->be.device_engine = cuda_device_engine;
    s->be.priv = s;
    *out = &s->be;
    return WB_OK;
fail:
    state_free(s);
    return rc;
}

void wb__backend_cuda_free(wb_backend **be)
{
    if (!be || !*be)
        return;
    state_free((*be)->priv);
    *be = NULL;
}

#else /* !WB_HAVE_CUDA */

int wb__backend_cuda_probe(int *count, wb_err *err)
{
    *count = 0;
    return wb__err_set(err, WB_ENOSYS,
                       "this build has no cuda backend (CUDA toolkit not found at build time)");
}

int wb__backend_cuda_new(const wb_cuda_options *opts, wb_backend **out, wb_err *err)
{
    (void)opts;
    *out = NULL;
    return wb__err_set(err, WB_ENOSYS,
                       "this build has no cuda backend (CUDA toolkit not found at build time)");
}

void wb__backend_cuda_free(wb_backend **be)
{
    if (be)
        *be = NULL;
}

#endif
