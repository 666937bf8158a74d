#include "backend_vmm.h"

#include "clock.h"
#include "cudrv.h"
#include "log.h"
#include "slab_pool.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int wb__vmm_start(int device, uint64_t *granularity, wb_err *err)
{
    return wb__cudrv_vmm_check(device, granularity, err);
}

static wb_slab_pool pool;
static int pool_on;

#ifdef WB_HAVE_CUDA

static const wb_cudrv *drv(wb_err *err)
{
    const wb_cudrv *d = NULL;
    return wb__cudrv_get(&d, err) == WB_OK ? d : NULL;
}

/* Undoes what vmm_alloc did, in reverse; each step only when it happened. */
static void vmm_undo(const wb_cudrv *d, wb_slab *s, CUdeviceptr p, uint64_t bytes, int mapped)
{
    if (mapped)
        d->unmap(p, (size_t)bytes);
    if (p)
        d->address_free(p, (size_t)bytes);
    if (s->vmm_handle)
        d->release((CUmemGenericAllocationHandle)s->vmm_handle);
    if (s->vmm_fd >= 0)
        close(s->vmm_fd);
    s->vmm_handle = 0;
    s->vmm_fd = -1;
}

int wb__vmm_slab_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    memset(slab, 0, sizeof *slab);
    slab->vmm_fd = -1;
    uint64_t g = 0;
    int rc = wb__cudrv_vmm_check(device, &g, err); /* also makes `device` current */
    if (rc != WB_OK)
        return rc;
    const wb_cudrv *d = drv(err);
    if (!d)
        return WB_ENOGPU;
    uint64_t bytes = wb__vmm_round(size, g);
    if (bytes == 0)
        return wb__err_set(err, WB_ELIMIT, "cuda-vmm: %llu bytes cannot be rounded up to %llu",
                           (unsigned long long)size, (unsigned long long)g);
    char what[128];
    if (pool_on && wb__slab_pool_take(&pool, device, bytes, slab)) {
        /* Sealed read-only when its model was loaded: writable again. */
        slab->index = 0;
        CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, device},
                             CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUresult r = d->set_access((CUdeviceptr)(uintptr_t)slab->dev_ptr, (size_t)bytes, &a, 1);
        if (r == CUDA_SUCCESS)
            return WB_OK;
        rc = wb__cudrv_fail(d, err, WB_EIO, r, "cuMemSetAccess (read-write, a kept slab)");
        vmm_undo(d, slab, (CUdeviceptr)(uintptr_t)slab->dev_ptr, slab->size, 1);
        return rc;
    }
    CUmemAllocationProp prop = wb__cudrv_prop(device);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = d->create(&h, (size_t)bytes, &prop, 0);
    if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemCreate of %llu bytes on device %d",
                 (unsigned long long)bytes, device);
        return wb__cudrv_fail(d, err, r == CUDA_ERROR_OUT_OF_MEMORY ? WB_ENOMEM : WB_EIO, r, what);
    }
    slab->vmm_handle = h;
    CUdeviceptr p = 0;
    int mapped = 0;
    if ((r = d->reserve(&p, (size_t)bytes, 0, 0, 0)) != CUDA_SUCCESS) {
        p = 0;
        rc = wb__cudrv_fail(d, err, WB_ENOMEM, r, "cuMemAddressReserve");
        goto fail;
    }
    if ((r = d->map(p, (size_t)bytes, 0, h, 0)) != CUDA_SUCCESS) {
        rc = wb__cudrv_fail(d, err, WB_EIO, r, "cuMemMap");
        goto fail;
    }
    mapped = 1;
    /* Read-write here, for the loader's copies; sealed read-only once filled. */
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if ((r = d->set_access(p, (size_t)bytes, &a, 1)) != CUDA_SUCCESS) {
        rc = wb__cudrv_fail(d, err, WB_EIO, r, "cuMemSetAccess (read-write, for loading)");
        goto fail;
    }
    int fd = -1;
    if ((r = d->export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) !=
            CUDA_SUCCESS ||
        fd < 0) {
        rc = wb__cudrv_fail(d, err, WB_EIO, r, "cuMemExportToShareableHandle (POSIX descriptor)");
        goto fail;
    }
    /* Workers the broker might exec must not inherit it. */
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    slab->vmm_fd = fd;
    slab->dev_ptr = (void *)(uintptr_t)p;
    slab->size = bytes;
    slab->device = device;
    return WB_OK;
fail:
    vmm_undo(d, slab, p, bytes, mapped);
    return rc;
}

/* Clients' mappings are read-only whatever happens here; the broker's own
 * becoming read-only too is defence in depth, so a driver that refuses it
 * is logged (event=cuda_vmm_seal_failed) rather than failing the load. */
int wb__vmm_slab_seal(wb_slab *slab, wb_err *err)
{
    const wb_cudrv *d = drv(err);
    if (!d)
        return WB_ENOGPU;
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, slab->device},
                         CU_MEM_ACCESS_FLAGS_PROT_READ};
    CUresult r = d->set_access((CUdeviceptr)(uintptr_t)slab->dev_ptr, (size_t)slab->size, &a, 1);
    if (r != CUDA_SUCCESS) {
        wb_err e;
        wb__cudrv_fail(d, &e, WB_EIO, r, "cuMemSetAccess (read-only)");
        char q[WB_ERR_MSG_MAX + 16];
        wb_warn("cuda_vmm_seal_failed", "device=%d bytes=%llu error=%s", slab->device,
                (unsigned long long)slab->size, wb__log_quote(q, sizeof q, e.msg));
    }
    return WB_OK;
}

static void free_now(wb_slab *slab)
{
    if (slab->vmm_handle) {
        const wb_cudrv *d = drv(NULL);
        if (d) {
            /* Importers keep the allocation alive until they release theirs. */
            vmm_undo(d, slab, (CUdeviceptr)(uintptr_t)slab->dev_ptr, slab->size, 1);
        }
        slab->dev_ptr = NULL;
    }
    slab->size = 0;
}

void wb__vmm_slab_free(wb_slab *slab)
{
    if (pool_on && slab->vmm_handle && wb__slab_pool_put(&pool, slab, wb__clock_mono_ms())) {
        /* The pool's now, as it is (mapped, exported). */
        memset(slab, 0, sizeof *slab);
        slab->vmm_fd = -1;
        return;
    }
    free_now(slab);
}

void wb__vmm_pool_start(int64_t keep_ms)
{
    if (pool_on || keep_ms <= 0)
        return;
    wb__slab_pool_init(&pool, keep_ms, free_now);
    pool_on = 1;
}

#else /* !WB_HAVE_CUDA: wb__backend_cuda_new refuses before any of these runs */

int wb__vmm_slab_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    (void)size;
    memset(slab, 0, sizeof *slab);
    slab->vmm_fd = -1;
    uint64_t g;
    return wb__cudrv_vmm_check(device, &g, err);
}

int wb__vmm_slab_seal(wb_slab *slab, wb_err *err)
{
    (void)slab;
    return wb__err_set(err, WB_ENOSYS, "this build has no cuda-vmm support");
}

void wb__vmm_slab_free(wb_slab *slab)
{
    slab->size = 0;
}

void wb__vmm_pool_start(int64_t keep_ms)
{
    (void)keep_ms;
}

#endif

void wb__vmm_pool_stop(void)
{
    if (!pool_on)
        return;
    pool_on = 0;
    wb__slab_pool_destroy(&pool);
}

size_t wb__vmm_pool_trim(int64_t now_ms)
{
    return pool_on ? wb__slab_pool_trim(&pool, now_ms) : 0;
}

uint64_t wb__vmm_pool_bytes(int device)
{
    return pool_on ? wb__slab_pool_bytes(&pool, device) : 0;
}

void wb__vmm_pool_counts(uint64_t *hits, uint64_t *misses)
{
    *hits = *misses = 0;
    if (pool_on)
        wb__slab_pool_counts(&pool, hits, misses);
}

int wb__vmm_slab_fd(const wb_slab *slab)
{
    return slab->vmm_handle ? slab->vmm_fd : -1;
}

void wb__vmm_slab_export(wb_slab *slab, Wbproto__Slab *out)
{
    wbproto__slab__init(out);
    out->index = slab->index;
    out->backend = WBPROTO__BACKEND__BACKEND_CUDA;
    out->device = slab->device;
    out->size = slab->size;
    out->transport = "cuda-vmm";
}
