/* libwbclient: wb_lease_verify, the checksums of a lease's tensors. */
#include "lease.h"

#include "client_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Device tensors are checked through pinned host buffers of this size. */
#define VERIFY_CHUNK (8u << 20)

/* Device tensors are hashed on the host without ever touching the legacy
 * default stream: chunks are copied with cudaMemcpyAsync on a private
 * non-blocking stream into two pinned buffers, and one chunk is hashed while
 * the next is in flight. A synchronous copy would wait for (and stall) every
 * kernel of the process, which a serving worker must never do. */
typedef struct dev_verifier {
    int ready;
#ifdef WB_HAVE_CUDA
    cudaStream_t stream;
    void *buf[2];
    cudaEvent_t ev[2];
#endif
    XXH3_state_t *state;
} dev_verifier;

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

static int dev_hash(dev_verifier *v, const wb__tensor_entry *t, uint64_t *out, char *why,
                    size_t why_len)
{
#ifndef WB_HAVE_CUDA
    (void)v;
    (void)t;
    (void)out;
    snprintf(why, why_len, "this build of libwbclient has no CUDA support");
    return WB_ENOSYS;
#else
    cudaError_t ce = cudaSuccess;
    if (!v->ready) {
        v->ready = 1;
        v->state = XXH3_createState();
        if (!v->state) {
            snprintf(why, why_len, "out of memory");
            return WB_ENOMEM;
        }
        ce = cudaStreamCreateWithFlags(&v->stream, cudaStreamNonBlocking);
        for (int i = 0; i < 2 && ce == cudaSuccess; i++) {
            ce = cudaHostAlloc(&v->buf[i], VERIFY_CHUNK, cudaHostAllocDefault);
            if (ce == cudaSuccess)
                ce = cudaEventCreateWithFlags(&v->ev[i], cudaEventDisableTiming);
        }
        if (ce != cudaSuccess) {
            snprintf(why, why_len, "cannot set up pinned buffers and a stream: %s",
                     cudaGetErrorString(ce));
            return WB_ENOGPU;
        }
    }
    if (!v->state || !v->stream) {
        snprintf(why, why_len, "the device verifier could not be set up");
        return WB_ENOGPU;
    }
    XXH3_64bits_reset(v->state);
    uint64_t n = t->nbytes, chunks = (n + VERIFY_CHUNK - 1) / VERIFY_CHUNK;
    const uint8_t *src = t->data;
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

WB_EXPORT int wb_lease_verify(const wb_lease *lease, size_t *bad_index)
{
    if (!lease)
        return WB_EINVAL;
    dev_verifier dv;
    memset(&dv, 0, sizeof dv);
    for (size_t i = 0; i < lease->n_tensors; i++) {
        const wb__tensor_entry *t = &lease->tensors[i];
        int rc = WB_OK;
        uint64_t got = 0;
        char why[200] = "";
        if (t->device >= 0)
            rc = dev_hash(&dv, t, &got, why, sizeof why);
        else
            got = XXH3_64bits(t->data, (size_t)t->nbytes);
        if (rc == WB_OK && got != t->xxh3)
            rc = WB_ECORRUPT;
        if (rc == WB_OK)
            continue;
        dev_verifier_free(&dv);
        if (bad_index)
            *bad_index = i;
        if (lease->client) {
            pthread_mutex_lock(&lease->client->mu);
            if (rc != WB_ECORRUPT)
                wb__client_fail(lease->client, rc,
                                "verify lease %.8s: tensor '%s' on cuda device %d cannot be "
                                "checked: %s",
                                lease->id_hex, t->name, t->device, why);
            else
                wb__client_fail(lease->client, rc,
                                "verify lease %.8s: tensor '%s' has checksum %016llx, the "
                                "broker recorded %016llx",
                                lease->id_hex, t->name, (unsigned long long)got,
                                (unsigned long long)t->xxh3);
            pthread_mutex_unlock(&lease->client->mu);
        }
        return rc;
    }
    dev_verifier_free(&dv);
    return WB_OK;
}
