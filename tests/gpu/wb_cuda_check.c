/* wb_cuda_check: proves that a broker on the cuda backend loaded a model
 * exactly. It acquires a lease over the wire (libwbclient's internal rpc:
 * the public API does not open cuda slabs yet), opens the slab's IPC handle
 * in this process with cudaIpcOpenMemHandle, copies every tensor back and
 * compares it with the checkpoint's bytes and with the lease's XXH3-64, then
 * releases the lease.
 *
 * usage: wb_cuda_check SOCKET MODEL CHECKPOINT
 * Prints one line per problem and a summary; exits 0 when every byte
 * matched, 1 otherwise, 2 on misuse. Synchronous copies are fine here: this
 * process serves nothing. */
#include "rpc.h"
#include "safetensors.h"
#include "wire.h"

#include <cuda_runtime_api.h>
#include <xxhash.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int check_tensor(const Wbproto__Tensor *t, uint8_t *const *bases, const wb_st_table *table,
                        const int *fds, uint8_t *host, uint8_t *want)
{
    const wb_st_tensor *st = wb__st_find(table, t->name);
    if (!st) {
        printf("FAIL tensor '%s': not in the checkpoint\n", t->name);
        return 1;
    }
    if (st->nbytes != t->nbytes) {
        printf("FAIL tensor '%s': %llu bytes in the lease, %llu in the file\n", t->name,
               (unsigned long long)t->nbytes, (unsigned long long)st->nbytes);
        return 1;
    }
    if (t->offset % 256) {
        printf("FAIL tensor '%s': offset %llu is not 256-byte aligned\n", t->name,
               (unsigned long long)t->offset);
        return 1;
    }
    if (t->nbytes == 0)
        return 0;
    ssize_t r = pread(fds[st->file], want, t->nbytes, (off_t)st->offset);
    if (r != (ssize_t)t->nbytes) {
        printf("FAIL tensor '%s': cannot read it from %s\n", t->name, table->files[st->file]);
        return 1;
    }
    cudaError_t e = cudaMemcpy(host, bases[t->slab] + t->offset, t->nbytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        printf("FAIL tensor '%s': cudaMemcpy: %s\n", t->name, cudaGetErrorString(e));
        return 1;
    }
    int bad = 0;
    if (memcmp(host, want, t->nbytes) != 0) {
        uint64_t at = 0;
        while (host[at] == want[at])
            at++;
        printf("FAIL tensor '%s': device bytes differ from the file at byte %llu\n", t->name,
               (unsigned long long)at);
        bad = 1;
    }
    if (XXH3_64bits(want, t->nbytes) != t->xxh3) {
        printf("FAIL tensor '%s': lease xxh3 %016llx, file %016llx\n", t->name,
               (unsigned long long)t->xxh3, (unsigned long long)XXH3_64bits(want, t->nbytes));
        bad = 1;
    }
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: wb_cuda_check SOCKET MODEL CHECKPOINT\n");
        return 2;
    }
    const char *sock = argv[1], *model = argv[2], *path = argv[3];
    wb_err err;
    wb_st_table *table = NULL;
    if (wb__st_open(path, &table, &err) != WB_OK) {
        printf("FAIL %s\n", err.msg);
        return 1;
    }
    wb__rpc rpc;
    if (wb__rpc_open(&rpc, sock, 60000, &err) != WB_OK) {
        printf("FAIL %s\n", err.msg);
        return 1;
    }
    Wbproto__AcquireRequest ab = WBPROTO__ACQUIRE_REQUEST__INIT;
    ab.model = (char *)model;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_ACQUIRE;
    req.acquire = &ab;
    Wbproto__Reply *rep = NULL;
    double t0 = now_ms();
    if (wb__rpc_call(&rpc, &req, 0, &rep, &err) != WB_OK) {
        printf("FAIL acquire %s: %s\n", model, err.msg);
        return 1;
    }
    double t_acquire = now_ms() - t0;
    const Wbproto__Lease *lease = rep->acquire->lease;
    int bad = 0;
    uint8_t **bases = calloc(lease->n_slabs ? lease->n_slabs : 1, sizeof *bases);
    double t_open = 0;
    for (size_t i = 0; i < lease->n_slabs; i++) {
        const Wbproto__Slab *s = lease->slabs[i];
        if (s->backend != WBPROTO__BACKEND__BACKEND_CUDA ||
            s->cuda_ipc_handle.len != sizeof(cudaIpcMemHandle_t)) {
            printf("FAIL slab %zu: backend %d, handle of %zu bytes: not a cuda slab\n", i,
                   s->backend, s->cuda_ipc_handle.len);
            return 1;
        }
        cudaError_t e = cudaSetDevice(s->device);
        if (e != cudaSuccess) {
            printf("FAIL slab %zu: cudaSetDevice(%d): %s\n", i, s->device, cudaGetErrorString(e));
            return 1;
        }
        cudaFree(0); /* the context, so that the open below is timed alone */
        cudaIpcMemHandle_t h;
        memcpy(&h, s->cuda_ipc_handle.data, sizeof h);
        double o0 = now_ms();
        e = cudaIpcOpenMemHandle((void **)&bases[i], h, cudaIpcMemLazyEnablePeerAccess);
        t_open += now_ms() - o0;
        if (e != cudaSuccess) {
            printf("FAIL slab %zu: cudaIpcOpenMemHandle: %s\n", i, cudaGetErrorString(e));
            return 1;
        }
    }
    int *fds = calloc(table->n_files, sizeof *fds);
    for (uint32_t i = 0; i < table->n_files; i++)
        fds[i] = open(table->files[i], O_RDONLY);
    uint64_t max = 1, total = 0;
    for (size_t i = 0; i < lease->n_tensors; i++) {
        if (lease->tensors[i]->nbytes > max)
            max = lease->tensors[i]->nbytes;
    }
    uint8_t *host = malloc(max), *want = malloc(max);
    if (!host || !want) {
        printf("FAIL out of memory for %llu bytes\n", (unsigned long long)max);
        return 1;
    }
    if (lease->n_tensors != table->n_tensors) {
        printf("FAIL the lease has %zu tensors, the checkpoint %zu\n", lease->n_tensors,
               table->n_tensors);
        bad++;
    }
    for (size_t i = 0; i < lease->n_tensors; i++) {
        bad += check_tensor(lease->tensors[i], bases, table, fds, host, want);
        total += lease->tensors[i]->nbytes;
    }
    for (size_t i = 0; i < lease->n_slabs; i++)
        cudaIpcCloseMemHandle(bases[i]);

    Wbproto__ReleaseRequest rb = WBPROTO__RELEASE_REQUEST__INIT;
    rb.lease_id = lease->id;
    Wbproto__Request rreq = WBPROTO__REQUEST__INIT;
    rreq.body_case = WBPROTO__REQUEST__BODY_RELEASE;
    rreq.release = &rb;
    Wbproto__Reply *rrep = NULL;
    if (wb__rpc_call(&rpc, &rreq, 0, &rrep, &err) != WB_OK) {
        printf("FAIL release: %s\n", err.msg);
        bad++;
    }
    printf("%s model=%s tensors=%zu bytes=%llu slabs=%zu acquire_ms=%.2f ipc_open_ms=%.2f "
           "mismatches=%d\n",
           bad ? "FAIL" : "OK", model, lease->n_tensors, (unsigned long long)total, lease->n_slabs,
           t_acquire, t_open, bad);
    wb__reply_free(&rrep);
    wb__reply_free(&rep);
    wb__rpc_close(&rpc);
    for (uint32_t i = 0; i < table->n_files; i++)
        close(fds[i]);
    free(fds);
    free(host);
    free(want);
    free(bases);
    wb__st_table_free(&table);
    return bad ? 1 : 0;
}
