/* wb_bench_attach: the CUDA attach path without a model library, and the
 * floor it is measured against.
 *
 *   wb_bench_attach --context-only [--device N]
 *       creates a CUDA context the way the workers do (cudaSetDevice, then
 *       cudaFree(NULL)) and exits: the floor of the stall and attach
 *       benchmarks, a process that costs the GPU nothing but its context.
 *   wb_bench_attach --socket PATH --model NAME [--device N]
 *                   [--lookup | --lookup-many] [--verify]
 *       the same context (none with --device -1), then connect, acquire a lease (the slab's IPC
 *       handle opened), and with --lookup every tensor found by its name
 *       (wb_lease_find, one name at a time; --lookup-many: all the names in
 *       one wb_lease_find_many), with --verify every tensor checksummed
 *       (wb_lease_verify). That is the part of an attach that grows with the
 *       number of tensors and bytes, measured where no model of that many
 *       constants can be compiled.
 *   wb_bench_attach --local FILE [--device N]
 *       the baseline without the broker: the same context, then every
 *       tensor of the safetensors FILE read (pread into a reused host
 *       buffer) and copied into one device allocation, one synchronous copy
 *       per tensor, as a plain loader does (torch's per-tensor .to("cuda")).
 *
 * Prints one JSON object: {"ms": {"context", "connect", "acquire", "lookup",
 * "verify", "local", "total"}, "tensors", "bytes"}; total counts from main() to the
 * end of the last step (the process start before main() is the caller's to
 * time). Exit codes: 0 done, 1 a step failed (message on stderr), 2 usage. */
#include "wb/client.h"

#include "safetensors.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <getopt.h>
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

/* --local: every tensor of `path` into one device buffer; *n and *bytes
 * say how many tensors and bytes. Returns 0, or 1 with a message. */
static int load_local(const char *path, size_t *n, unsigned long long *bytes)
{
    wb_err err = {0};
    wb_st_table *t = NULL;
    if (wb__st_open(path, &t, &err) != WB_OK) {
        fprintf(stderr, "wb_bench_attach: %s\n", err.msg);
        return 1;
    }
    uint64_t biggest = 1;
    for (size_t i = 0; i < t->n_tensors; i++)
        biggest = t->tensors[i].nbytes > biggest ? t->tensors[i].nbytes : biggest;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char *host = malloc(biggest);
    void *dev = NULL;
    cudaError_t ce = cudaMalloc(&dev, t->total_bytes ? t->total_bytes : 1);
    int rc = fd < 0 || !host || ce != cudaSuccess;
    if (rc)
        fprintf(stderr, "wb_bench_attach: %s: cannot open it or allocate %llu bytes\n", path,
                (unsigned long long)t->total_bytes);
    uint64_t off = 0;
    for (size_t i = 0; !rc && i < t->n_tensors; i++) {
        const wb_st_tensor *x = &t->tensors[i];
        uint64_t got = 0;
        while (got < x->nbytes) {
            ssize_t r = pread(fd, host + got, x->nbytes - got, (off_t)(x->offset + got));
            if (r <= 0)
                break;
            got += (uint64_t)r;
        }
        if (got < x->nbytes ||
            cudaMemcpy((char *)dev + off, host, x->nbytes, cudaMemcpyHostToDevice) != cudaSuccess) {
            fprintf(stderr, "wb_bench_attach: %s: tensor '%s' could not be read or copied\n", path,
                    x->name);
            rc = 1;
        }
        off += x->nbytes;
    }
    *n = t->n_tensors;
    *bytes = t->total_bytes;
    if (dev)
        cudaFree(dev);
    free(host);
    if (fd >= 0)
        close(fd);
    wb__st_table_free(&t);
    return rc;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: wb_bench_attach --context-only [--device N]\n"
                 "       wb_bench_attach --socket PATH --model NAME [--device N]\n"
                 "                       [--lookup | --lookup-many] [--verify]\n"
                 "       wb_bench_attach --local FILE [--device N]\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"context-only", no_argument, NULL, 'c'}, {"socket", required_argument, NULL, 's'},
        {"model", required_argument, NULL, 'm'},  {"device", required_argument, NULL, 'd'},
        {"lookup", no_argument, NULL, 'l'},       {"lookup-many", no_argument, NULL, 'M'},
        {"verify", no_argument, NULL, 'v'},       {"local", required_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
    int context_only = 0, lookup = 0, verify = 0, device = 0, c;
    const char *socket = NULL, *model = NULL, *local = NULL;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            context_only = 1;
            break;
        case 's':
            socket = optarg;
            break;
        case 'm':
            model = optarg;
            break;
        case 'd':
            device = atoi(optarg);
            break;
        case 'l':
            lookup = 1;
            break;
        case 'M':
            lookup = 2;
            break;
        case 'v':
            verify = 1;
            break;
        case 'L':
            local = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc || context_only + !!model + !!local != 1 || (local && device < 0)) {
        usage(stderr);
        return 2;
    }
    double t0 = now_ms(), ms_ctx, ms_connect = 0, ms_acquire = 0, ms_lookup = 0, ms_verify = 0,
           ms_local = 0;
    /* --device -1: no CUDA at all (a host-backend broker; to try the
     * script without a GPU). */
    cudaError_t ce = device < 0 ? cudaSuccess : cudaSetDevice(device);
    if (ce == cudaSuccess && device >= 0)
        ce = cudaFree(NULL);
    if (ce != cudaSuccess) {
        fprintf(stderr, "wb_bench_attach: CUDA device %d: %s\n", device, cudaGetErrorString(ce));
        return 1;
    }
    ms_ctx = now_ms() - t0;
    size_t n = 0;
    unsigned long long bytes = 0;
    if (local) {
        double t = now_ms();
        if (load_local(local, &n, &bytes))
            return 1;
        ms_local = now_ms() - t;
    } else if (model) {
        wb_client_options o;
        wb_client_options_init(&o);
        o.socket_path = socket;
        o.client_name = "wb_bench_attach";
        o.timeout_ms = 60000;
        wb_client *cl = NULL;
        wb_lease *lease = NULL;
        double t = now_ms();
        int rc = wb_client_connect(&o, &cl);
        ms_connect = now_ms() - t;
        t = now_ms();
        if (rc == WB_OK)
            rc = wb_lease_acquire(cl, model, &lease);
        ms_acquire = now_ms() - t;
        if (rc == WB_OK)
            n = wb_lease_tensor_count(lease);
        t = now_ms();
        /* --lookup-many: the names gathered and found a block at a time
         * (one wb_lease_find_many per block, the buffers reused), as a
         * binder of many constants would call it. */
        enum { BLOCK = 1024 };
        const char *names[BLOCK];
        const void *want[BLOCK];
        wb_tensor_view views[BLOCK];
        for (size_t i = 0; rc == WB_OK && i < n; i++) {
            wb_tensor_view v, w;
            rc = wb_lease_tensor(lease, i, &v);
            if (rc == WB_OK)
                bytes += v.nbytes;
            if (rc == WB_OK && lookup == 2) {
                names[i % BLOCK] = v.name;
                want[i % BLOCK] = v.data;
                if (i % BLOCK == BLOCK - 1 || i == n - 1) {
                    size_t m = i % BLOCK + 1;
                    rc = wb_lease_find_many(lease, names, m, views);
                    for (size_t j = 0; rc == WB_OK && j < m; j++) {
                        if (views[j].data != want[j]) {
                            fprintf(stderr,
                                    "wb_bench_attach: tensor '%s' found at another address\n",
                                    names[j]);
                            rc = WB_EINTERNAL;
                        }
                    }
                }
            } else if (rc == WB_OK && lookup) {
                rc = wb_lease_find(lease, v.name, &w);
                if (rc == WB_OK && w.data != v.data) {
                    fprintf(stderr, "wb_bench_attach: tensor '%s' found at another address\n",
                            v.name);
                    rc = WB_EINTERNAL;
                }
            }
        }
        ms_lookup = now_ms() - t;
        t = now_ms();
        size_t bad = 0;
        if (rc == WB_OK && verify)
            rc = wb_lease_verify(lease, &bad);
        ms_verify = verify ? now_ms() - t : 0;
        if (rc != WB_OK)
            fprintf(stderr, "wb_bench_attach: %s: %s\n", wb_status_name(rc),
                    cl ? wb_client_errmsg(cl) : "out of memory");
        if (lease)
            wb_lease_release(&lease);
        wb_client_destroy(&cl);
        if (rc != WB_OK)
            return 1;
    }
    printf("{\"ms\": {\"context\": %.3f, \"connect\": %.3f, \"acquire\": %.3f, \"lookup\": %.3f, "
           "\"verify\": %.3f, \"local\": %.3f, \"total\": %.3f}, \"tensors\": %zu, \"bytes\": "
           "%llu}\n",
           ms_ctx, ms_connect, ms_acquire, ms_lookup, ms_verify, ms_local, now_ms() - t0, n, bytes);
    return 0;
}
