/* libwbclient: wb_lease_verify, the checksums of a lease's tensors. */
#include "lease.h"

#include "client_impl.h"
#include "xxh.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Device tensors are checked through pinned host buffers of this size. */
#define VERIFY_CHUNK (8u << 20)
/* Devices whose verifier is kept for the process's life; a tensor on a
 * higher ordinal gets one for the call. */
#define VERIFY_DEVICES 16

/* Device tensors are hashed on the host without ever touching the legacy
 * default stream: chunks are copied with cudaMemcpyAsync on a private
 * non-blocking stream of the lowest priority into two pinned buffers, and
 * one chunk is hashed while the next is in flight; each wait is on the
 * chunk's own event. A synchronous copy would wait for (and stall) every
 * kernel of the process, which a serving worker must never do; the low
 * priority lets the worker's own kernels go first. The stream and the
 * buffers of a device are made once and kept for the process's life:
 * a page-locked allocation synchronises the process's streams implicitly
 * (CUDA programming guide) and cudaFreeHost waits for outstanding work,
 * which a verification every few seconds would otherwise do each time.
 * Device tensors are hashed one at a time in the process (kept_mu). */
typedef struct dev_verifier {
    int ready;
#ifdef WB_HAVE_CUDA
    cudaStream_t stream;
    void *buf[2];
    cudaEvent_t ev[2];
#endif
    XXH3_state_t *state;
} dev_verifier;

static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static dev_verifier kept[VERIFY_DEVICES];

static void dev_verifier_free(dev_verifier *v)
{
#ifdef WB_HAVE_CUDA
    if (v->ready) {
        for (int i = 0; i < 2; i++) {
            if (v->buf[i])
                cudaFreeHost(v->buf[i]);
            if (v->ev[i])
                cudaEventDestroy(v->ev[i]);
        }
        if (v->stream)
            cudaStreamDestroy(v->stream);
    }
#endif
    if (v->state)
        XXH3_freeState(v->state);
    memset(v, 0, sizeof *v);
}

#ifdef WB_HAVE_CUDA
/* The stream, events and buffers, made in the current device's context.
 * A failure leaves what was made in `v`, for dev_verifier_free. */
static cudaError_t dev_verifier_setup(dev_verifier *v, char *why, size_t why_len)
{
    v->ready = 1;
    v->state = XXH3_createState();
    if (!v->state) {
        snprintf(why, why_len, "out of memory");
        return cudaErrorMemoryAllocation;
    }
    int least = 0, greatest = 0;
    cudaError_t ce = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (ce == cudaSuccess)
        ce = cudaStreamCreateWithPriority(&v->stream, cudaStreamNonBlocking, least);
    for (int i = 0; i < 2 && ce == cudaSuccess; i++) {
        ce = cudaHostAlloc(&v->buf[i], VERIFY_CHUNK, cudaHostAllocDefault);
        if (ce == cudaSuccess)
            ce = cudaEventCreateWithFlags(&v->ev[i], cudaEventDisableTiming);
    }
    if (ce != cudaSuccess)
        snprintf(why, why_len, "cannot set up pinned buffers and a stream: %s",
                 cudaGetErrorString(ce));
    return ce;
}
#endif

static int dev_hash(dev_verifier *v, const uint8_t *src, uint64_t n, uint64_t *out, char *why,
                    size_t why_len)
{
#ifndef WB_HAVE_CUDA
    (void)v;
    (void)src;
    (void)n;
    (void)out;
    snprintf(why, why_len, "this build of libwbclient has no CUDA support");
    return WB_ENOSYS;
#else
    cudaError_t ce = cudaSuccess;
    if (!v->ready && dev_verifier_setup(v, why, why_len) != cudaSuccess) {
        int rc = v->state ? WB_ENOGPU : WB_ENOMEM;
        dev_verifier_free(v); /* the next call tries again */
        return rc;
    }
    if (!v->state || !v->stream || !v->buf[1] || !v->ev[1]) {
        snprintf(why, why_len, "the device verifier could not be set up");
        return WB_ENOGPU;
    }
    XXH3_64bits_reset(v->state);
    uint64_t chunks = (n + VERIFY_CHUNK - 1) / VERIFY_CHUNK;
    for (uint64_t k = 0; k <= chunks && ce == cudaSuccess; k++) {
        /* Issue chunk k, then hash chunk k-1 while k is copied. Buffer k%2
         * last held chunk k-2, already hashed. */
        if (k < chunks) {
            size_t len = (size_t)(k + 1 < chunks ? VERIFY_CHUNK : n - k * VERIFY_CHUNK);
            ce = cudaMemcpyAsync(v->buf[k % 2], src + k * VERIFY_CHUNK, len, cudaMemcpyDefault,
                                 v->stream);
            if (ce == cudaSuccess)
                ce = cudaEventRecord(v->ev[k % 2], v->stream);
        }
        if (k > 0 && ce == cudaSuccess) {
            uint64_t j = k - 1;
            size_t len = (size_t)(j + 1 < chunks ? VERIFY_CHUNK : n - j * VERIFY_CHUNK);
            ce = cudaEventSynchronize(v->ev[j % 2]);
            if (ce == cudaSuccess)
                XXH3_64bits_update(v->state, v->buf[j % 2], len);
        }
    }
    if (ce != cudaSuccess) {
        cudaStreamSynchronize(v->stream);
        snprintf(why, why_len, "copying it to the host failed: %s", cudaGetErrorString(ce));
        return WB_EIO;
    }
    *out = XXH3_64bits_digest(v->state);
    return WB_OK;
#endif
}

/* The checksum of `n` bytes of device memory at `src`, with the kept
 * verifier of the current device (or one made for this tensor beyond
 * VERIFY_DEVICES). */
static int dev_hash_kept(const uint8_t *src, uint64_t n, uint64_t *out, char *why, size_t why_len)
{
    int cur = -1;
#ifdef WB_HAVE_CUDA
    if (cudaGetDevice(&cur) != cudaSuccess)
        cur = -1;
#endif
    if (cur < 0 || cur >= VERIFY_DEVICES) {
        dev_verifier v;
        memset(&v, 0, sizeof v);
        int rc = dev_hash(&v, src, n, out, why, why_len);
        dev_verifier_free(&v);
        return rc;
    }
    pthread_mutex_lock(&kept_mu);
    int rc = dev_hash(&kept[cur], src, n, out, why, why_len);
    pthread_mutex_unlock(&kept_mu);
    return rc;
}

WB_EXPORT int wb_lease_verify(const wb_lease *lease, size_t *bad_index)
{
    if (!lease)
        return WB_EINVAL;
    if (lease->checksums_pending)
        return wb__client_fail(lease->client, WB_ESTATE,
                               "verify lease %.8s: the checksums of this published version of "
                               "'%s' are still being computed by the broker; a later acquire "
                               "gets them",
                               lease->id_hex, lease->model);
    const wb__tensor_entry *ents = wb__lease_tensors(lease);
    if (!ents && lease->n_tensors)
        return wb__client_fail(lease->client, WB_ENOMEM,
                               "verify lease %.8s: out of memory making its %zu tensor entries",
                               lease->id_hex, lease->n_tensors);
    for (size_t i = 0; i < lease->n_tensors; i++) {
        const wb__tensor_entry *t = &ents[i];
        int rc = WB_OK;
        uint64_t got = 0;
        char why[200] = "";
        const uint8_t *data = wb__entry_data(lease, t);
        int device = wb__entry_device(lease, t);
        if (device >= 0)
            rc = dev_hash_kept(data, t->nbytes, &got, why, sizeof why);
        else
            got = XXH3_64bits(data, (size_t)t->nbytes);
        if (rc == WB_OK && got != t->xxh3)
            rc = WB_ECORRUPT;
        if (rc == WB_OK)
            continue;
        if (bad_index)
            *bad_index = i;
        if (rc != WB_ECORRUPT)
            return wb__client_fail(lease->client, rc,
                                   "verify lease %.8s: tensor '%s' on cuda device %d cannot be "
                                   "checked: %s",
                                   lease->id_hex, t->name, device, why);
        return wb__client_fail(lease->client, rc,
                               "verify lease %.8s: tensor '%s' has checksum %016llx, the "
                               "broker recorded %016llx",
                               lease->id_hex, t->name, (unsigned long long)got,
                               (unsigned long long)t->xxh3);
    }
    return WB_OK;
}
