/* wb_vmm_check: what a worker can and cannot do with a lease on a broker
 * started with --cuda-slab vmm. Each mode is one process: a refused write
 * may leave the process's CUDA context unusable (an illegal address is
 * sticky), so writes are tried in processes of their own and the bytes are
 * checked from another.
 *
 *   wb_vmm_check verify SOCKET MODEL CHECKPOINT
 *       leases MODEL (public API), checks the slab is mapped read-only
 *       (transport cuda-vmm), copies every tensor back and compares it with
 *       the checkpoint's bytes and with the lease's XXH3-64. Exit 0 when
 *       every byte matched.
 *   wb_vmm_check write-kernel|write-memcpy|write-memset SOCKET MODEL
 *       tries to change the first non-empty tensor: a kernel store (PTX
 *       loaded with cuModuleLoadData, no compiler needed at run time), a
 *       cudaMemcpy from the host, or a cudaMemset. Exit 0 when the write was
 *       refused (the error is printed), 1 when it went through.
 *   wb_vmm_check time SOCKET ROUNDS MODEL...
 *       after creating the CUDA context, times acquire (request, descriptor
 *       fetch, import and map, or IPC open) and release of each model
 *       ROUNDS times; prints one JSON line per model.
 *
 * Exit 2 on misuse or when the lease cannot be had. Synchronous copies are
 * fine here: this process serves nothing. */
#include "wb/client.h"

#include "lease.h"
#include "mapcache.h"
#include "safetensors.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <xxhash.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* extern "C" __global__ void wb_store(unsigned *p, unsigned v) { *p = v; }
 * from nvcc -ptx -arch=compute_75 (PTX ISA lowered to 7.5; ptxas sm_90 accepts it). */
static const char STORE_PTX[] = ".version 7.5\n"
                                ".target sm_75\n"
                                ".address_size 64\n"
                                ".visible .entry wb_store(\n"
                                "    .param .u64 wb_store_param_0,\n"
                                "    .param .u32 wb_store_param_1\n"
                                ")\n"
                                "{\n"
                                "    .reg .b32 %r<2>;\n"
                                "    .reg .b64 %rd<3>;\n"
                                "    ld.param.u64 %rd1, [wb_store_param_0];\n"
                                "    ld.param.u32 %r1, [wb_store_param_1];\n"
                                "    cvta.to.global.u64 %rd2, %rd1;\n"
                                "    st.global.u32 [%rd2], %r1;\n"
                                "    ret;\n"
                                "}\n";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static wb_client *connect_to(const char *socket)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = socket;
    o.timeout_ms = 10000;
    wb_client *c = NULL;
    if (wb_client_connect(&o, &c) != WB_OK) {
        fprintf(stderr, "wb_vmm_check: connect %s: %s\n", socket, wb_client_errmsg(c));
        wb_client_destroy(&c);
        return NULL;
    }
    return c;
}

/* The lease's slab transport, and whether its mapping refuses writes. */
static const char *mapping(const wb_lease *l, int *ro)
{
    *ro = l->n_maps > 0;
    const char *t = "none";
    for (size_t i = 0; i < l->n_maps; i++) {
        *ro &= wb__map_readonly(l->maps[i]);
        t = wb__map_transport(l->maps[i]);
    }
    return t;
}

static int verify(const char *socket, const char *model, const char *ckpt)
{
    wb_st_table *table = NULL;
    wb_err e;
    if (wb__st_open(ckpt, &table, &e) != WB_OK) {
        fprintf(stderr, "wb_vmm_check: %s\n", e.msg);
        return 2;
    }
    int *fds = calloc(table->n_files, sizeof *fds);
    for (size_t f = 0; f < table->n_files; f++)
        fds[f] = open(table->files[f], O_RDONLY | O_CLOEXEC);
    cudaFree(0);
    wb_client *c = connect_to(socket);
    wb_lease *l = NULL;
    if (!c || wb_lease_acquire(c, model, &l) != WB_OK) {
        fprintf(stderr, "wb_vmm_check: acquire %s: %s\n", model, c ? wb_client_errmsg(c) : "");
        return 2;
    }
    int ro = 0, bad = 0;
    const char *t = mapping(l, &ro);
    printf("lease %s: transport %s, %s\n", model, t, ro ? "read-only" : "WRITABLE");
    if (strcmp(t, "cuda-vmm") != 0 || !ro) {
        printf("FAIL the lease is not a read-only cuda-vmm mapping\n");
        bad++;
    }
    size_t n = wb_lease_tensor_count(l);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        wb_tensor_view v;
        wb_lease_tensor(l, i, &v);
        const wb_st_tensor *st = wb__st_find(table, v.name);
        if (!st || st->nbytes != v.nbytes) {
            printf("FAIL tensor '%s': not in the checkpoint with %llu bytes\n", v.name,
                   (unsigned long long)v.nbytes);
            bad++;
            continue;
        }
        if (!v.nbytes)
            continue;
        uint8_t *got = malloc(v.nbytes), *want = malloc(v.nbytes);
        cudaError_t ce = cudaMemcpy(got, v.data, v.nbytes, cudaMemcpyDeviceToHost);
        ssize_t r = pread(fds[st->file], want, v.nbytes, (off_t)st->offset);
        if (ce != cudaSuccess) {
            printf("FAIL tensor '%s': cudaMemcpy: %s\n", v.name, cudaGetErrorString(ce));
            bad++;
        } else if (r != (ssize_t)v.nbytes || memcmp(got, want, v.nbytes) != 0) {
            printf("FAIL tensor '%s': the device bytes differ from the checkpoint's\n", v.name);
            bad++;
        } else if (XXH3_64bits(got, v.nbytes) != v.xxh3) {
            printf("FAIL tensor '%s': XXH3 differs from the lease's\n", v.name);
            bad++;
        }
        bytes += v.nbytes;
        free(got);
        free(want);
    }
    printf("verified %zu tensors, %llu bytes, %d problems\n", n, (unsigned long long)bytes, bad);
    wb_lease_release(&l);
    wb_client_destroy(&c);
    for (size_t f = 0; f < table->n_files; f++)
        close(fds[f]);
    free(fds);
    wb__st_table_free(&table);
    return bad ? 1 : 0;
}

static int try_write(const char *how, const char *socket, const char *model)
{
    cudaFree(0);
    wb_client *c = connect_to(socket);
    wb_lease *l = NULL;
    if (!c || wb_lease_acquire(c, model, &l) != WB_OK) {
        fprintf(stderr, "wb_vmm_check: acquire %s: %s\n", model, c ? wb_client_errmsg(c) : "");
        return 2;
    }
    wb_tensor_view v = {0};
    for (size_t i = 0; i < wb_lease_tensor_count(l); i++) {
        wb_lease_tensor(l, i, &v);
        if (v.nbytes >= 4)
            break;
    }
    if (v.nbytes < 4) {
        fprintf(stderr, "wb_vmm_check: no tensor of 4 bytes or more in %s\n", model);
        return 2;
    }
    int ro = 0;
    printf("writing into '%s' (%s, %s mapping) with %s\n", v.name, mapping(l, &ro),
           ro ? "read-only" : "writable", how);
    const char *err = NULL;
    if (strcmp(how, "write-kernel") == 0) {
        CUmodule mod;
        CUfunction fn;
        CUresult r = cuModuleLoadData(&mod, STORE_PTX);
        if (r == CUDA_SUCCESS)
            r = cuModuleGetFunction(&fn, mod, "wb_store");
        if (r != CUDA_SUCCESS) {
            const char *s = "?";
            cuGetErrorString(r, &s);
            fprintf(stderr, "wb_vmm_check: cannot load the store kernel: %s\n", s);
            return 2;
        }
        CUdeviceptr p = (CUdeviceptr)(uintptr_t)v.data;
        unsigned val = 0xdeadbeefu;
        void *args[] = {&p, &val};
        r = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
        if (r == CUDA_SUCCESS)
            r = cuCtxSynchronize();
        if (r != CUDA_SUCCESS) {
            const char *s = "?";
            cuGetErrorName(r, &s);
            err = s;
        }
    } else {
        cudaError_t ce;
        if (strcmp(how, "write-memcpy") == 0) {
            unsigned val = 0xdeadbeefu;
            ce = cudaMemcpy((void *)v.data, &val, sizeof val, cudaMemcpyHostToDevice);
        } else {
            ce = cudaMemset((void *)v.data, 0x77, 4);
        }
        if (ce == cudaSuccess)
            ce = cudaDeviceSynchronize();
        if (ce != cudaSuccess)
            err = cudaGetErrorName(ce);
    }
    if (err) {
        printf("write refused: %s\n", err);
        /* The context may be poisoned: leave without touching CUDA again. */
        fflush(stdout);
        _exit(0);
    }
    unsigned now = 0;
    cudaError_t ce = cudaMemcpy(&now, v.data, sizeof now, cudaMemcpyDeviceToHost);
    printf("FAIL the write was not refused (the first 4 bytes now read 0x%08x%s)\n", now,
           ce == cudaSuccess ? "" : ", read back failed");
    return 1;
}

static int timing(const char *socket, int rounds, char **models, int n_models)
{
    cudaFree(0); /* the context is not part of the import */
    wb_client *c = connect_to(socket);
    if (!c)
        return 2;
    for (int m = 0; m < n_models; m++) {
        double *acq = calloc((size_t)rounds, sizeof *acq),
               *rel = calloc((size_t)rounds, sizeof *rel);
        uint64_t size = 0;
        const char *t = "";
        for (int i = 0; i < rounds; i++) {
            wb_lease *l = NULL;
            double t0 = now_ms();
            if (wb_lease_acquire(c, models[m], &l) != WB_OK) {
                fprintf(stderr, "wb_vmm_check: acquire %s: %s\n", models[m], wb_client_errmsg(c));
                return 2;
            }
            acq[i] = now_ms() - t0;
            int ro;
            t = mapping(l, &ro);
            size = l->n_maps ? wb__map_size(l->maps[0]) : 0;
            t0 = now_ms();
            wb_lease_release(&l);
            rel[i] = now_ms() - t0;
        }
        /* Medians (insertion sort: a handful of rounds). */
        for (int i = 1; i < rounds; i++)
            for (int j = i; j > 0 && acq[j] < acq[j - 1]; j--) {
                double x = acq[j];
                acq[j] = acq[j - 1];
                acq[j - 1] = x;
            }
        for (int i = 1; i < rounds; i++)
            for (int j = i; j > 0 && rel[j] < rel[j - 1]; j--) {
                double x = rel[j];
                rel[j] = rel[j - 1];
                rel[j - 1] = x;
            }
        printf("{\"model\": \"%s\", \"transport\": \"%s\", \"slab_bytes\": %llu, \"rounds\": %d, "
               "\"acquire_ms_median\": %.3f, \"acquire_ms_min\": %.3f, \"acquire_ms_max\": %.3f, "
               "\"release_ms_median\": %.3f}\n",
               models[m], t, (unsigned long long)size, rounds, acq[rounds / 2], acq[0],
               acq[rounds - 1], rel[rounds / 2]);
        free(acq);
        free(rel);
    }
    wb_client_destroy(&c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "verify") == 0)
        return verify(argv[2], argv[3], argv[4]);
    if (argc == 4 && strncmp(argv[1], "write-", 6) == 0 &&
        (strcmp(argv[1], "write-kernel") == 0 || strcmp(argv[1], "write-memcpy") == 0 ||
         strcmp(argv[1], "write-memset") == 0))
        return try_write(argv[1], argv[2], argv[3]);
    if (argc >= 5 && strcmp(argv[1], "time") == 0 && atoi(argv[3]) > 0)
        return timing(argv[2], atoi(argv[3]), argv + 4, argc - 4);
    fprintf(stderr, "usage: wb_vmm_check verify SOCKET MODEL CHECKPOINT\n"
                    "       wb_vmm_check write-kernel|write-memcpy|write-memset SOCKET MODEL\n"
                    "       wb_vmm_check time SOCKET ROUNDS MODEL...\n");
    return 2;
}
