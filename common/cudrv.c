#include "cudrv.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

uint64_t wb__vmm_round(uint64_t size, uint64_t granularity)
{
    if (granularity == 0)
        return 0;
    if (size == 0)
        return granularity;
    uint64_t rem = size % granularity;
    if (rem == 0)
        return size;
    if (size > UINT64_MAX - (granularity - rem))
        return 0;
    return size + (granularity - rem);
}

#ifdef WB_HAVE_CUDA
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static wb_cudrv drv;
static wb_err drv_err;
static int drv_rc;

/* CUDA 12.0's ABI of each entry point: every one used here has kept it. */
#define WB_CUDRV_ABI 12000

static int lookup(const char *symbol, void **fn)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
    cudaError_t e =
        cudaGetDriverEntryPointByVersion(symbol, fn, WB_CUDRV_ABI, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn) {
        drv_rc = wb__err_set(&drv_err, WB_ENOGPU,
                             "the CUDA driver has no %s (cudaGetDriverEntryPointByVersion: %s, "
                             "query result %d)",
                             symbol, cudaGetErrorString(e), (int)q);
        *fn = NULL;
        return -1;
    }
    return 0;
}

/* The toolkit's own prototypes of the ABI versions looked up: a field of a
 * different type fails to compile (-Werror). */
#define WB_SAME_TYPE(field, pfn)                                                                   \
    do {                                                                                           \
        pfn check_ = drv.field;                                                                    \
        (void)check_;                                                                              \
    } while (0)

static void load(void)
{
    WB_SAME_TYPE(get_error_string, PFN_cuGetErrorString_v6000);
    WB_SAME_TYPE(device_get_attribute, PFN_cuDeviceGetAttribute_v2000);
    WB_SAME_TYPE(granularity, PFN_cuMemGetAllocationGranularity_v10020);
    WB_SAME_TYPE(create, PFN_cuMemCreate_v10020);
    WB_SAME_TYPE(release, PFN_cuMemRelease_v10020);
    WB_SAME_TYPE(reserve, PFN_cuMemAddressReserve_v10020);
    WB_SAME_TYPE(address_free, PFN_cuMemAddressFree_v10020);
    WB_SAME_TYPE(map, PFN_cuMemMap_v10020);
    WB_SAME_TYPE(unmap, PFN_cuMemUnmap_v10020);
    WB_SAME_TYPE(set_access, PFN_cuMemSetAccess_v10020);
    WB_SAME_TYPE(export_handle, PFN_cuMemExportToShareableHandle_v10020);
    WB_SAME_TYPE(import_handle, PFN_cuMemImportFromShareableHandle_v10020);
    WB_SAME_TYPE(address_range, PFN_cuMemGetAddressRange_v3020);
    WB_SAME_TYPE(pointer_attribute, PFN_cuPointerGetAttribute_v4000);
    struct {
        const char *sym;
        void **fn;
    } t[] = {
        {"cuGetErrorString", (void **)&drv.get_error_string},
        {"cuDeviceGetAttribute", (void **)&drv.device_get_attribute},
        {"cuMemGetAllocationGranularity", (void **)&drv.granularity},
        {"cuMemCreate", (void **)&drv.create},
        {"cuMemRelease", (void **)&drv.release},
        {"cuMemAddressReserve", (void **)&drv.reserve},
        {"cuMemAddressFree", (void **)&drv.address_free},
        {"cuMemMap", (void **)&drv.map},
        {"cuMemUnmap", (void **)&drv.unmap},
        {"cuMemSetAccess", (void **)&drv.set_access},
        {"cuMemExportToShareableHandle", (void **)&drv.export_handle},
        {"cuMemImportFromShareableHandle", (void **)&drv.import_handle},
        {"cuMemGetAddressRange", (void **)&drv.address_range},
        {"cuPointerGetAttribute", (void **)&drv.pointer_attribute},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (lookup(t[i].sym, t[i].fn) != 0)
            return;
    }
    drv_rc = WB_OK;
}

int wb__cudrv_get(const wb_cudrv **out, wb_err *err)
{
    *out = NULL;
    pthread_once(&once, load);
    if (drv_rc != WB_OK) {
        if (err)
            *err = drv_err;
        return drv_rc;
    }
    *out = &drv;
    return WB_OK;
}

int wb__cudrv_fail(const wb_cudrv *d, wb_err *err, int code, CUresult r, const char *what)
{
    const char *s = NULL;
    if (!d || !d->get_error_string || d->get_error_string(r, &s) != CUDA_SUCCESS || !s)
        s = "unknown error";
    return wb__err_set(err, code, "%s: %s (CUresult %d)", what, s, (int)r);
}

CUmemAllocationProp wb__cudrv_prop(int device)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

int wb__cudrv_vmm_check(int device, uint64_t *granularity, wb_err *err)
{
    *granularity = 0;
    /* The runtime makes the device's primary context current: the driver
     * calls below and every later cuMem* call of this thread use it. */
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return wb__err_set(err, WB_ENOGPU, "cuda-vmm: cudaSetDevice(%d): %s (%s)", device,
                           cudaGetErrorString(ce), cudaGetErrorName(ce));
    const wb_cudrv *d;
    int rc = wb__cudrv_get(&d, err);
    if (rc != WB_OK)
        return rc;
    int vmm = 0, fd = 0;
    CUresult r = d->device_get_attribute(
        &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, (CUdevice)device);
    if (r == CUDA_SUCCESS)
        r = d->device_get_attribute(
            &fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, (CUdevice)device);
    if (r != CUDA_SUCCESS)
        return wb__cudrv_fail(d, err, WB_ENOGPU, r, "cuda-vmm: cuDeviceGetAttribute");
    if (!vmm)
        return wb__err_set(err, WB_ENOSYS,
                           "cuda-vmm: device %d does not support virtual memory management "
                           "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); use "
                           "--cuda-slab ipc",
                           device);
    if (!fd)
        return wb__err_set(
            err, WB_ENOSYS,
            "cuda-vmm: device %d cannot export memory as a POSIX file descriptor "
            "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0); "
            "use --cuda-slab ipc",
            device);
    CUmemAllocationProp p = wb__cudrv_prop(device);
    size_t g = 0;
    r = d->granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS)
        return wb__cudrv_fail(d, err, WB_ENOGPU, r, "cuda-vmm: cuMemGetAllocationGranularity");
    if (g == 0)
        return wb__err_set(err, WB_ENOGPU,
                           "cuda-vmm: the driver gave an allocation granularity of 0 bytes");
    *granularity = g;
    return WB_OK;
}

#else /* !WB_HAVE_CUDA */

int wb__cudrv_vmm_check(int device, uint64_t *granularity, wb_err *err)
{
    (void)device;
    *granularity = 0;
    return wb__err_set(err, WB_ENOSYS,
                       "this build has no cuda-vmm support (CUDA toolkit not found at build time)");
}

#endif
