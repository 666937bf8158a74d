#include "mapcache.h"

#include "alloc.h"
#include "clog.h"

#include "shm.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cudrv.h"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

enum { MAP_HOST = 0, MAP_CUDA_IPC = 1, MAP_CUDA_VMM = 2 };

struct wb__map {
    struct wb__map *next;
    int cuda;                      /* MAP_HOST, MAP_CUDA_IPC or MAP_CUDA_VMM */
    unsigned long long vmm_handle; /* the imported allocation */
    char key[WB_SHM_NAME_MAX];
    uint8_t handle[WB_CUDA_IPC_HANDLE_BYTES];
    wb_shm shm;
    void *dptr;
    uint64_t size;
    int device;      /* where the slab lives (-1 host) */
    int open_device; /* whose context opened it (-1 host) */
    unsigned refs;
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static wb__map *cache_head;
static uint64_t cache_made; /* under cache_mu */

static void link_map(wb__map *m)
{
    cache_made++;
    m->refs = 1;
    m->next = cache_head;
    cache_head = m;
}

/* A cached mapping asked for again: shared when the broker still gives the
 * size it was mapped with (`have`), else refused naming it (`what`). Called
 * with cache_mu held. */
static int map_reuse(wb__map *m, uint64_t have, uint64_t size, const char *what, wb__map **out,
                     wb_err *err)
{
    if (have != size)
        return wb__err_set(err, WB_EPROTO, "%s with %llu bytes but the broker now says %llu", what,
                           (unsigned long long)have, (unsigned long long)size);
    m->refs++;
    *out = m;
    return WB_OK;
}

/* The host mapping cached under `key`, or a new read-only one of the slab
 * named `shm_name` (when not NULL) or of descriptor `fd`. `what` names the
 * slab in messages. */
static int get_host(const char *key, const char *shm_name, int fd, uint64_t size, const char *what,
                    wb__map **out, wb_err *err)
{
    pthread_mutex_lock(&cache_mu);
    wb__map *m;
    for (m = cache_head; m; m = m->next) {
        if (!m->cuda && strcmp(m->key, key) == 0)
            break;
    }
    int rc;
    if (m) {
        char w[160];
        snprintf(w, sizeof w, "%.120s is mapped", what);
        rc = map_reuse(m, m->shm.size, size, w, out, err);
        pthread_mutex_unlock(&cache_mu);
        return rc;
    }
    m = wb__calloc(1, sizeof *m);
    if (!m) {
        pthread_mutex_unlock(&cache_mu);
        return wb__err_set(err, WB_ENOMEM, "out of memory mapping %s", what);
    }
    rc = shm_name ? wb__shm_map_ro(&m->shm, shm_name, size, err)
                  : wb__shm_map_fd_ro(&m->shm, fd, size, what, err);
    if (rc != WB_OK) {
        free(m);
        pthread_mutex_unlock(&cache_mu);
        return rc;
    }
    snprintf(m->key, sizeof m->key, "%s", key);
    m->size = size;
    m->device = -1;
    m->open_device = -1;
    link_map(m);
    *out = m;
    pthread_mutex_unlock(&cache_mu);
    return WB_OK;
}

int wb__mapcache_get_host(const char *shm_name, uint64_t size, wb__map **out, wb_err *err)
{
    *out = NULL;
    if (!shm_name || strlen(shm_name) >= WB_SHM_NAME_MAX)
        return wb__err_set(err, WB_EPROTO, "slab name is missing or too long");
    char what[WB_SHM_NAME_MAX + 8];
    snprintf(what, sizeof what, "slab %s", shm_name);
    return get_host(shm_name, shm_name, -1, size, what, out, err);
}

int wb__mapcache_get_fd(int fd, uint64_t size, const char *what, wb__map **out, wb_err *err)
{
    *out = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return wb__err_errno(err, WB_EIO, errno, "%s: fstat of its descriptor", what);
    char key[WB_SHM_NAME_MAX];
    /* No shm name starts with "memfd:" (they start with '/'). */
    snprintf(key, sizeof key, "memfd:%llx:%llx", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    return get_host(key, NULL, fd, size, what, out, err);
}

#ifdef WB_HAVE_CUDA
/* The calling thread's current device in *cur, after checking that the
 * slab's device exists and is reachable from there (itself, or as a peer). */
static int cuda_reachable(int device, int *cur, wb_err *err)
{
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess)
        return wb__err_set(err, WB_ENOGPU,
                           "cuda slab on device %d: no usable GPU in this process: "
                           "cudaGetDeviceCount: %s (%s)",
                           device, cudaGetErrorString(ce), cudaGetErrorName(ce));
    if (device < 0 || device >= count)
        return wb__err_set(err, WB_ENOGPU,
                           "cuda slab on device %d: this process sees %d CUDA device(s) "
                           "(check CUDA_VISIBLE_DEVICES)",
                           device, count);
    ce = cudaGetDevice(cur);
    if (ce != cudaSuccess)
        return wb__err_set(err, WB_ENOGPU, "cuda slab on device %d: cudaGetDevice: %s", device,
                           cudaGetErrorString(ce));
    if (*cur != device) {
        int can = 0;
        ce = cudaDeviceCanAccessPeer(&can, *cur, device);
        if (ce != cudaSuccess || !can)
            return wb__err_set(err, WB_ENOGPU,
                               "cuda slab on device %d: this thread's current device is %d, "
                               "which cannot access device %d as a peer; call "
                               "cudaSetDevice(%d) before acquiring",
                               device, *cur, device, device);
    }
    return WB_OK;
}

/* Opens the handle in the current device's context, after checking that the
 * slab's device is reachable from there. Called with cache_mu held. */
static int cuda_open(wb__map *m, int device, wb_err *err)
{
    int cur = 0;
    int rc = cuda_reachable(device, &cur, err);
    if (rc != WB_OK)
        return rc;
    cudaError_t ce;
    cudaIpcMemHandle_t h;
    memcpy(&h, m->handle, sizeof h);
    void *p = NULL;
    ce = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess)
        return wb__err_set(err, WB_EIO,
                           "cuda slab on device %d (%llu bytes): cudaIpcOpenMemHandle on "
                           "device %d: %s (%s)",
                           device, (unsigned long long)m->size, cur, cudaGetErrorString(ce),
                           cudaGetErrorName(ce));
    m->dptr = p;
    m->device = device;
    m->open_device = cur;
    return WB_OK;
}

/* Closes in the context that opened the handle, then restores the thread's
 * device: a worker may have switched devices since. */
static void cuda_close(wb__map *m)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess)
        cur = -1;
    if (cur != m->open_device)
        cudaSetDevice(m->open_device);
    cudaError_t ce = cudaIpcCloseMemHandle(m->dptr);
    if (ce != cudaSuccess)
        wb__cwarn("cuda_ipc_close_failed", "device=%d error=\"%s\"", m->device,
                  cudaGetErrorString(ce));
    if (cur >= 0 && cur != m->open_device)
        cudaSetDevice(cur);
}

/* Imports the allocation behind `fd`, reserves an address range, maps it,
 * and allows the lease's device (and the current one, when it is a peer)
 * to read it, nothing more: a store into it faults. The range is mapped in
 * the current device's context (the primary context the runtime made
 * current). */
static int vmm_open(wb__map *m, int fd, int device, const char *what, wb_err *err)
{
    int cur = 0;
    int rc = cuda_reachable(device, &cur, err);
    if (rc != WB_OK)
        return rc;
    /* The runtime's primary context of `cur` becomes current for the driver calls. */
    cudaError_t ce = cudaSetDevice(cur);
    if (ce != cudaSuccess)
        return wb__err_set(err, WB_ENOGPU, "%s: cudaSetDevice(%d): %s", what, cur,
                           cudaGetErrorString(ce));
    const wb_cudrv *d = NULL;
    if ((rc = wb__cudrv_get(&d, err)) != WB_OK)
        return rc;
    char w[256];
    CUmemGenericAllocationHandle h = 0;
    CUresult r =
        d->import_handle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
        snprintf(w, sizeof w, "%.120s: cuMemImportFromShareableHandle", what);
        return wb__cudrv_fail(d, err, WB_EIO, r, w);
    }
    CUdeviceptr p = 0;
    if ((r = d->reserve(&p, (size_t)m->size, 0, 0, 0)) != CUDA_SUCCESS) {
        d->release(h);
        snprintf(w, sizeof w, "%.120s: cuMemAddressReserve of %llu bytes", what,
                 (unsigned long long)m->size);
        return wb__cudrv_fail(d, err, WB_ENOMEM, r, w);
    }
    if ((r = d->map(p, (size_t)m->size, 0, h, 0)) != CUDA_SUCCESS) {
        d->address_free(p, (size_t)m->size);
        d->release(h);
        snprintf(w, sizeof w,
                 "%.120s: cuMemMap of %llu bytes (the broker's allocation is smaller?)", what,
                 (unsigned long long)m->size);
        return wb__cudrv_fail(d, err, WB_EPROTO, r, w);
    }
    CUmemAccessDesc a[2] = {
        {{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READ},
        {{CU_MEM_LOCATION_TYPE_DEVICE, cur}, CU_MEM_ACCESS_FLAGS_PROT_READ},
    };
    if ((r = d->set_access(p, (size_t)m->size, a, cur == device ? 1 : 2)) != CUDA_SUCCESS) {
        d->unmap(p, (size_t)m->size);
        d->address_free(p, (size_t)m->size);
        d->release(h);
        snprintf(w, sizeof w, "%.120s: cuMemSetAccess (read-only)", what);
        return wb__cudrv_fail(d, err, WB_EIO, r, w);
    }
    m->dptr = (void *)(uintptr_t)p;
    m->vmm_handle = h;
    m->device = device;
    m->open_device = cur;
    return WB_OK;
}

static void vmm_close(wb__map *m)
{
    const wb_cudrv *d = NULL;
    if (wb__cudrv_get(&d, NULL) != WB_OK)
        return;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)m->dptr;
    CUresult r = d->unmap(p, (size_t)m->size);
    if (r == CUDA_SUCCESS)
        r = d->address_free(p, (size_t)m->size);
    CUresult r2 = d->release((CUmemGenericAllocationHandle)m->vmm_handle);
    if (r != CUDA_SUCCESS || r2 != CUDA_SUCCESS)
        wb__cwarn("cuda_vmm_unmap_failed", "device=%d unmap=%d release=%d", m->device, (int)r,
                  (int)r2);
}
#endif

int wb__mapcache_get_vmm(int fd, int device, uint64_t size, const char *what, wb__map **out,
                         wb_err *err)
{
    *out = NULL;
    if (size == 0)
        return wb__err_set(err, WB_EPROTO, "%s: the broker gave a size of 0 bytes", what);
#ifndef WB_HAVE_CUDA
    (void)fd;
    return wb__err_set(err, WB_ENOSYS,
                       "%s on device %d: this build of libwbclient has no CUDA support (CUDA "
                       "toolkit not found at build time)",
                       what, device);
#else
    wb__map *m = wb__calloc(1, sizeof *m);
    if (!m)
        return wb__err_set(err, WB_ENOMEM, "out of memory mapping %s", what);
    m->cuda = MAP_CUDA_VMM;
    m->size = size;
    pthread_mutex_lock(&cache_mu);
    int rc = vmm_open(m, fd, device, what, err);
    if (rc != WB_OK) {
        pthread_mutex_unlock(&cache_mu);
        free(m);
        return rc;
    }
    link_map(m);
    *out = m;
    pthread_mutex_unlock(&cache_mu);
    return WB_OK;
#endif
}

int wb__mapcache_get_cuda(const uint8_t *handle, size_t handle_len, int device, uint64_t size,
                          wb__map **out, wb_err *err)
{
    *out = NULL;
    if (!handle || handle_len != WB_CUDA_IPC_HANDLE_BYTES)
        return wb__err_set(err, WB_EPROTO, "cuda slab: the IPC handle has %zu bytes, not %d",
                           handle ? handle_len : 0, WB_CUDA_IPC_HANDLE_BYTES);
#ifndef WB_HAVE_CUDA
    (void)size;
    return wb__err_set(err, WB_ENOSYS,
                       "cuda slab on device %d: this build of libwbclient has no CUDA support "
                       "(CUDA toolkit not found at build time)",
                       device);
#else
    int rc = WB_OK;
    pthread_mutex_lock(&cache_mu);
    wb__map *m;
    for (m = cache_head; m; m = m->next) {
        if (m->cuda == MAP_CUDA_IPC && m->device == device &&
            memcmp(m->handle, handle, WB_CUDA_IPC_HANDLE_BYTES) == 0)
            break;
    }
    if (m) {
        char what[64];
        snprintf(what, sizeof what, "cuda slab on device %d is open", device);
        rc = map_reuse(m, m->size, size, what, out, err);
        pthread_mutex_unlock(&cache_mu);
        return rc;
    }
    m = wb__calloc(1, sizeof *m);
    if (!m) {
        pthread_mutex_unlock(&cache_mu);
        return wb__err_set(err, WB_ENOMEM, "out of memory opening a cuda slab");
    }
    m->cuda = MAP_CUDA_IPC;
    memcpy(m->handle, handle, WB_CUDA_IPC_HANDLE_BYTES);
    m->size = size;
    rc = cuda_open(m, device, err);
    if (rc != WB_OK) {
        free(m);
        pthread_mutex_unlock(&cache_mu);
        return rc;
    }
    link_map(m);
    *out = m;
    pthread_mutex_unlock(&cache_mu);
    return WB_OK;
#endif
}

void wb__mapcache_put(wb__map **map)
{
    if (!map || !*map)
        return;
    wb__map *m = *map;
    *map = NULL;
    pthread_mutex_lock(&cache_mu);
    if (--m->refs > 0) {
        pthread_mutex_unlock(&cache_mu);
        return;
    }
    for (wb__map **pp = &cache_head; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    pthread_mutex_unlock(&cache_mu);
    if (m->cuda == MAP_CUDA_VMM) {
#ifdef WB_HAVE_CUDA
        vmm_close(m);
#endif
    } else if (m->cuda == MAP_CUDA_IPC) {
#ifdef WB_HAVE_CUDA
        cuda_close(m);
#endif
    } else {
        wb__shm_unmap(&m->shm);
    }
    free(m);
}

const void *wb__map_addr(const wb__map *map)
{
    if (!map)
        return NULL;
    return map->cuda ? map->dptr : map->shm.addr;
}

uint64_t wb__map_size(const wb__map *map)
{
    return map ? map->size : 0;
}

int wb__map_device(const wb__map *map)
{
    return map ? map->device : -1;
}

int wb__map_readonly(const wb__map *map)
{
    return map && map->cuda != MAP_CUDA_IPC;
}

const char *wb__map_transport(const wb__map *map)
{
    if (!map)
        return "";
    return map->cuda == MAP_CUDA_VMM ? "cuda-vmm" : map->cuda == MAP_CUDA_IPC ? "cuda-ipc" : "host";
}

int wb__map_open_device(const wb__map *map)
{
    return map ? map->open_device : -1;
}

unsigned wb__map_refs(const wb__map *map)
{
    unsigned refs = 0;
    if (map) {
        pthread_mutex_lock(&cache_mu);
        refs = map->refs;
        pthread_mutex_unlock(&cache_mu);
    }
    return refs;
}

size_t wb__mapcache_count(void)
{
    size_t n = 0;
    pthread_mutex_lock(&cache_mu);
    for (const wb__map *m = cache_head; m; m = m->next)
        n++;
    pthread_mutex_unlock(&cache_mu);
    return n;
}

uint64_t wb__mapcache_made(void)
{
    pthread_mutex_lock(&cache_mu);
    uint64_t n = cache_made;
    pthread_mutex_unlock(&cache_mu);
    return n;
}
