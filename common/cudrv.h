/* The CUDA driver calls of the cuda-vmm transport (cuMem*: create, export,
 * import, reserve, map, set access), looked up once through the runtime
 * (cudaGetDriverEntryPointByVersion) so that neither the broker nor
 * libwbclient links libcuda: a build and a CPU-only test run need only the
 * toolkit's runtime, as before. Everything here also compiles without CUDA;
 * then the calls report WB_ENOSYS. */
#ifndef WB_CUDRV_H
#define WB_CUDRV_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

#ifdef WB_HAVE_CUDA
#include <cuda.h>

typedef struct wb_cudrv {
    CUresult (*get_error_string)(CUresult, const char **);
    CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*export_handle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                              unsigned long long);
    CUresult (*import_handle)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    /* A publish's device sources (client/publish_cuda.c): the allocation
     * around a pointer, and whether cudaIpcGetMemHandle can export it. */
    CUresult (*address_range)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*pointer_attribute)(void *, CUpointer_attribute, CUdeviceptr);
} wb_cudrv;

/* The driver's entry points, looked up at the first call (thread-safe) and
 * kept for the process. WB_ENOGPU naming the missing symbol when the
 * driver has none of them (too old, or no driver). */
int wb__cudrv_get(const wb_cudrv **out, wb_err *err);

/* Sets err to "<what>: <driver's text> (CUresult N)" and returns code. */
int wb__cudrv_fail(const wb_cudrv *d, wb_err *err, int code, CUresult r, const char *what);

/* The allocation properties of a slab on `device` that can be exported as
 * a POSIX file descriptor. */
CUmemAllocationProp wb__cudrv_prop(int device);
#endif

/* Checks that CUDA device `device` supports the VMM calls and exporting
 * allocations as POSIX file descriptors (device attributes
 * VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
 * HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED), and gives the allocation
 * granularity in *granularity. WB_ENOSYS without CUDA in the build or
 * without support on the device, WB_ENOGPU when the driver cannot be asked;
 * the message says which. The calling thread's current device is left on
 * `device`. */
int wb__cudrv_vmm_check(int device, uint64_t *granularity, wb_err *err);

/* `size` rounded up to a multiple of `granularity` (a power of two or not);
 * at least one granule, so that an empty model still has a mapping. 0 when
 * the result would overflow or granularity is 0. */
uint64_t wb__vmm_round(uint64_t size, uint64_t granularity);

#endif
