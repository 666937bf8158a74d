/* wb_bench_d2d: how fast a producer's tensors, opened as CUDA IPC handles,
 * copy device to device into a broker-like slab on one GPU, with the copy
 * engine (cudaMemcpyAsync, what the broker's publish copy does, broker/publish_cuda.c) and with the
 * SM copy kernel of bench/devcopy.c, against the same copies from the
 * process's own memory. An exporter child, forked before this process
 * touches CUDA (CUDA is not fork-safe once initialised), allocates
 * --tensors buffers of --mib MiB with one cudaMalloc each (PyTorch's
 * caching allocator gives a large tensor a segment of its own), fills them
 * with a pattern and hands their cudaIpcGetMemHandle over a pipe. This
 * process opens them, allocates local sources of the same layout and a
 * cudaMalloc slab (tensors back to back at 2 MiB-aligned offsets) and, with
 * --vmm, a cuMemCreate slab made by the broker's own code
 * (wb__vmm_slab_alloc). The variants:
 *   local_ce_1        local sources, cudaMemcpyAsync per tensor, 1 stream:
 *                     the baseline (torch's copy_)
 *   ipc_ce_S          IPC sources, cudaMemcpyAsync, tensors round-robin
 *                     over S = 1, 2, 4, 8 non-blocking streams
 *   ipc_kernel_S      IPC sources, wb__devcopy_async (default blocks),
 *                     S = 1, 4
 *   ipc_kernel_1_b32  the same on 1 stream with 32 blocks: how few SMs do
 *   local_kernel_1    local sources with the kernel
 *   ipc_ce_1_vmm, ipc_kernel_1_vmm   (--vmm) into the cuMemCreate slab
 * Each variant: one untimed warm-up (the kernel's JIT compilation, first
 * touches of the mappings), then --runs timed copies of every tensor; the
 * median, min and max of the wall time (before queueing the first copy to
 * after the last stream's synchronise) and of the GPU time (events before
 * the first and after the last copy of every stream used: earliest start
 * to latest end), GB/s as bytes copied / time, and the ratio of each
 * median GB/s to local_ce_1's. The destination is cleared before each
 * variant and checked after its last run: 16 sampled 64 KiB blocks and the
 * last 4 KiB of each tensor against the pattern ("verified"; a mismatch
 * makes the exit status 1). Also timed: each handle's first
 * cudaIpcOpenMemHandle ("open"), opening it again while open ("reopen":
 * whether CUDA gives the same pointer, and what closing that reference
 * costs) and its cudaIpcCloseMemHandle ("close"): median and sum over the
 * handles. Writes a JSON report to --out, a summary to stdout.
 *
 * usage: wb_bench_d2d [--tensors N] [--mib M] [--runs R] [--device N]
 *                     [--vmm] [--out JSON]
 * Defaults: 32 tensors of 128 MiB, 7 runs, device 0, no VMM slab, the
 * report to d2d.json. */
#include "backend_vmm.h"
#include "devcopy.h"

#include <cuda_runtime_api.h>
#include <jansson.h>

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB        (1024ull * 1024ull)
#define BLK        (64ull * 1024ull) /* the pattern's granule */
#define MAX_STREAM 8
#define SAMPLES    16

static pid_t child = -1;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Never leaves the exporter behind: it is killed and reaped first. */
static void die(const char *what, const char *why)
{
    fprintf(stderr, "wb_bench_d2d: %s: %s\n", what, why);
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    exit(1);
}

static void cuda_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        char why[256];
        snprintf(why, sizeof why, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        die(what, why);
    }
}

/* The byte of tensor i's 64 KiB block b: never 0, so a cleared destination
 * block that no copy wrote fails the check. */
static unsigned char pattern(unsigned i, uint64_t b)
{
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (b + 1) * 0xC2B2AE3D27D4EB4Full;
    x ^= x >> 29;
    return (unsigned char)(1 + (x % 255));
}

/* Fills a tensor with its pattern: one memset per 64 KiB block. */
static void fill(unsigned char *p, unsigned i, uint64_t bytes, cudaStream_t s)
{
    for (uint64_t b = 0; b * BLK < bytes; b++) {
        uint64_t len = bytes - b * BLK < BLK ? bytes - b * BLK : BLK;
        cuda_check(cudaMemsetAsync(p + b * BLK, pattern(i, b), (size_t)len, s),
                   "cudaMemsetAsync (pattern)");
    }
}

static int write_all(int fd, const void *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, (const char *)p + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t r = read(fd, (char *)p + off, n - off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        off += (size_t)r;
    }
    return 0;
}

/* What the exporter sends first: its status, then (status 0) the handles. */
typedef struct hello {
    int status;
    char msg[256];
} hello;

/* The exporter: allocates, fills and exports the tensors, then holds them
 * until the parent writes to (or closes) the exit pipe. */
static void exporter(int device, unsigned n, uint64_t bytes, int out_fd, int exit_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    hello h = {0, ""};
    cudaIpcMemHandle_t *hs = calloc(n, sizeof *hs);
    void **p = calloc(n, sizeof *p);
    cudaError_t e = hs && p ? cudaSetDevice(device) : cudaErrorMemoryAllocation;
    const char *what = "cudaSetDevice";
    for (unsigned i = 0; e == cudaSuccess && i < n; i++) {
        what = "cudaMalloc (exporter)";
        if ((e = cudaMalloc(&p[i], (size_t)bytes)) != cudaSuccess)
            break;
        for (uint64_t b = 0; e == cudaSuccess && b * BLK < bytes; b++) {
            uint64_t len = bytes - b * BLK < BLK ? bytes - b * BLK : BLK;
            what = "cudaMemsetAsync (exporter)";
            e = cudaMemsetAsync((char *)p[i] + b * BLK, pattern(i, b), (size_t)len, 0);
        }
        if (e == cudaSuccess) {
            what = "cudaIpcGetMemHandle";
            e = cudaIpcGetMemHandle(&hs[i], p[i]);
        }
    }
    if (e == cudaSuccess) {
        what = "cudaDeviceSynchronize (exporter)";
        e = cudaDeviceSynchronize();
    }
    if (e != cudaSuccess) {
        h.status = 1;
        snprintf(h.msg, sizeof h.msg, "%s: %s (%s)", what, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    }
    if (write_all(out_fd, &h, sizeof h) == 0 && h.status == 0)
        write_all(out_fd, hs, n * sizeof *hs);
    close(out_fd);
    char c;
    while (read(exit_fd, &c, 1) < 0 && errno == EINTR)
        ;
    for (unsigned i = 0; p && i < n; i++)
        if (p[i])
            cudaFree(p[i]);
    _exit(h.status);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct stats {
    double median, min, max, sum;
} stats;

static stats stats_of(const double *v, int n)
{
    double *c = malloc((size_t)n * sizeof *c);
    if (!c)
        die("stats", "out of memory");
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    stats s = {n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2, c[0], c[n - 1], 0};
    for (int i = 0; i < n; i++)
        s.sum += c[i];
    free(c);
    return s;
}

typedef struct variant {
    const char *name;
    int ipc;    /* sources: the exporter's (1) or this process's (0) */
    int kernel; /* wb__devcopy_async (1) or cudaMemcpyAsync (0) */
    unsigned streams;
    unsigned blocks; /* the kernel's; 0: its default */
    int vmm;         /* destination: the cuMemCreate slab */
} variant;

typedef struct bench {
    unsigned n;
    uint64_t bytes, stride; /* per tensor; between tensors in a slab */
    int runs;
    void **ipc, **local;
    unsigned char *slab, *vmm_slab;
    cudaStream_t st[MAX_STREAM];
    cudaEvent_t ev0[MAX_STREAM], ev1[MAX_STREAM];
    wb_devcopy *dc;
    unsigned char *host; /* one sampled block, pinned */
} bench;

static void copy_all(bench *b, const variant *v)
{
    void **src = v->ipc ? b->ipc : b->local;
    unsigned char *dst = v->vmm ? b->vmm_slab : b->slab;
    for (unsigned i = 0; i < b->n; i++) {
        cudaStream_t s = b->st[i % v->streams];
        if (v->kernel) {
            wb_err err;
            if (wb__devcopy_async(b->dc, dst + i * b->stride, src[i], b->bytes, v->blocks, s,
                                  &err) != WB_OK)
                die(v->name, err.msg);
        } else {
            cuda_check(cudaMemcpyAsync(dst + i * b->stride, src[i], (size_t)b->bytes,
                                       cudaMemcpyDeviceToDevice, s),
                       "cudaMemcpyAsync (device to device)");
        }
    }
}

/* One run: wall and GPU seconds. */
static void run_once(bench *b, const variant *v, double *wall, double *gpu)
{
    for (unsigned s = 0; s < v->streams; s++)
        cuda_check(cudaEventRecord(b->ev0[s], b->st[s]), "cudaEventRecord (start)");
    double t0 = now_s();
    copy_all(b, v);
    for (unsigned s = 0; s < v->streams; s++)
        cuda_check(cudaEventRecord(b->ev1[s], b->st[s]), "cudaEventRecord (end)");
    for (unsigned s = 0; s < v->streams; s++)
        cuda_check(cudaStreamSynchronize(b->st[s]), "cudaStreamSynchronize");
    *wall = now_s() - t0;
    /* Relative to stream 0's start: the earliest start to the latest end. */
    float lo = 0, hi = 0;
    for (unsigned s = 0; s < v->streams; s++) {
        float a = 0, z = 0;
        cuda_check(cudaEventElapsedTime(&a, b->ev0[0], b->ev0[s]), "cudaEventElapsedTime");
        cuda_check(cudaEventElapsedTime(&z, b->ev0[0], b->ev1[s]), "cudaEventElapsedTime");
        if (a < lo)
            lo = a;
        if (z > hi)
            hi = z;
    }
    *gpu = (double)(hi - lo) / 1e3;
}

/* The sampled blocks of every tensor in the destination against the
 * pattern: the first and last 64 KiB block, 14 spread between, and the
 * last 4 KiB. The first mismatch goes to *where. */
static int verify(bench *b, const variant *v, char *where, size_t where_len)
{
    unsigned char *dst = v->vmm ? b->vmm_slab : b->slab;
    uint64_t nblk = (b->bytes + BLK - 1) / BLK;
    for (unsigned i = 0; i < b->n; i++) {
        for (unsigned k = 0; k <= SAMPLES; k++) {
            uint64_t off, len;
            if (k < SAMPLES) {
                uint64_t blk = SAMPLES > 1 ? (nblk - 1) * k / (SAMPLES - 1) : 0;
                off = blk * BLK;
                len = b->bytes - off < BLK ? b->bytes - off : BLK;
            } else {
                len = b->bytes < 4096 ? b->bytes : 4096;
                off = b->bytes - len;
            }
            cuda_check(
                cudaMemcpy(b->host, dst + i * b->stride + off, (size_t)len, cudaMemcpyDeviceToHost),
                "cudaMemcpy (verify, device to host)");
            for (uint64_t j = 0; j < len; j++) {
                unsigned char want = pattern(i, (off + j) / BLK);
                if (b->host[j] != want) {
                    snprintf(where, where_len,
                             "tensor %u byte %llu: 0x%02x where the source has 0x%02x", i,
                             (unsigned long long)(off + j), b->host[j], want);
                    return 0;
                }
            }
        }
    }
    return 1;
}

static json_t *stats_json(stats s, double bytes)
{
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "median_s", s.median, "min_s", s.min,
                     "max_s", s.max, "gbps_median", bytes / s.median / 1e9, "gbps_max",
                     bytes / s.min / 1e9, "gbps_min", bytes / s.max / 1e9);
}

/* Runs a variant; its report, and *ok cleared on a mismatch. */
static json_t *run_variant(bench *b, const variant *v, double base_wall, double base_gpu,
                           double *gbps_wall, double *gbps_gpu, int *ok)
{
    unsigned char *dst = v->vmm ? b->vmm_slab : b->slab;
    cuda_check(cudaMemset(dst, 0, (size_t)(b->n * b->stride)), "cudaMemset (clear destination)");
    double w, g;
    run_once(b, v, &w, &g); /* warm-up */
    double *wall = calloc((size_t)b->runs, sizeof *wall);
    double *gpu = calloc((size_t)b->runs, sizeof *gpu);
    if (!wall || !gpu)
        die(v->name, "out of memory");
    for (int r = 0; r < b->runs; r++)
        run_once(b, v, &wall[r], &gpu[r]);
    char where[160] = "";
    int verified = verify(b, v, where, sizeof where);
    if (!verified)
        *ok = 0;
    stats sw = stats_of(wall, b->runs), sg = stats_of(gpu, b->runs);
    double bytes = (double)b->bytes * b->n;
    *gbps_wall = bytes / sw.median / 1e9;
    *gbps_gpu = bytes / sg.median / 1e9;
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:s, s:o, s:o, s:b}", "name", v->name,
                          "source", v->ipc ? "ipc" : "local", "copy",
                          v->kernel ? "devcopy_kernel" : "cudaMemcpyAsync", "streams",
                          (json_int_t)v->streams, "blocks", (json_int_t)v->blocks, "destination",
                          v->vmm ? "cuMemCreate" : "cudaMalloc", "wall", stats_json(sw, bytes),
                          "gpu", stats_json(sg, bytes), "verified", verified);
    if (!verified)
        json_object_set_new(o, "mismatch", json_string(where));
    if (base_gpu > 0) {
        json_object_set_new(o, "ratio_gpu_to_local_ce_1", json_real(*gbps_gpu / base_gpu));
        json_object_set_new(o, "ratio_wall_to_local_ce_1", json_real(*gbps_wall / base_wall));
    }
    printf("%-18s gpu %7.1f GB/s (%.2fx)  wall %7.1f GB/s (%.2fx)%s\n", v->name, *gbps_gpu,
           base_gpu > 0 ? *gbps_gpu / base_gpu : 1.0, *gbps_wall,
           base_wall > 0 ? *gbps_wall / base_wall : 1.0, verified ? "" : "  MISMATCH");
    fflush(stdout);
    free(wall);
    free(gpu);
    return o;
}

static json_t *times_json(const double *v, unsigned n)
{
    stats s = stats_of(v, (int)n);
    return json_pack("{s:f, s:f, s:f, s:f}", "median_s", s.median, "sum_s", s.sum, "min_s", s.min,
                     "max_s", s.max);
}

static unsigned long parse_num(const char *opt, const char *s, unsigned long lo, unsigned long hi)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        char why[96];
        snprintf(why, sizeof why, "'%s' is not a number from %lu to %lu", s, lo, hi);
        die(opt, why);
    }
    return v;
}

int main(int argc, char **argv)
{
    unsigned n = 32;
    uint64_t mib = 128;
    int runs = 7, device = 0, use_vmm = 0;
    const char *out = "d2d.json";
    static const struct option opts[] = {
        {"tensors", required_argument, NULL, 't'}, {"mib", required_argument, NULL, 'm'},
        {"runs", required_argument, NULL, 'r'},    {"device", required_argument, NULL, 'd'},
        {"vmm", no_argument, NULL, 'v'},           {"out", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            n = (unsigned)parse_num("--tensors", optarg, 1, 4096);
            break;
        case 'm':
            mib = parse_num("--mib", optarg, 1, 1u << 20);
            break;
        case 'r':
            runs = (int)parse_num("--runs", optarg, 1, 1000);
            break;
        case 'd':
            device = (int)parse_num("--device", optarg, 0, 1023);
            break;
        case 'v':
            use_vmm = 1;
            break;
        case 'o':
            out = optarg;
            break;
        default:
            fprintf(stderr, "usage: wb_bench_d2d [--tensors N] [--mib M] [--runs R] "
                            "[--device N] [--vmm] [--out JSON]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    bench b;
    memset(&b, 0, sizeof b);
    b.n = n;
    b.bytes = mib * MIB;
    b.stride = (b.bytes + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
    b.runs = runs;

    /* The exporter first: this process has not touched CUDA yet. */
    int to_parent[2], to_child[2];
    if (pipe(to_parent) != 0 || pipe(to_child) != 0)
        die("pipe", strerror(errno));
    fflush(NULL);
    child = fork();
    if (child < 0)
        die("fork", strerror(errno));
    if (child == 0) {
        close(to_parent[0]);
        close(to_child[1]);
        exporter(device, n, b.bytes, to_parent[1], to_child[0]);
    }
    close(to_parent[1]);
    close(to_child[0]);

    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    struct cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    int drv = 0, rt = 0, sms = 0;
    cuda_check(cudaDriverGetVersion(&drv), "cudaDriverGetVersion");
    cuda_check(cudaRuntimeGetVersion(&rt), "cudaRuntimeGetVersion");
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute (cudaDevAttrMultiProcessorCount)");
    wb_err err;
    if (wb__devcopy_open(&b.dc, &err) != WB_OK)
        die("wb__devcopy_open", err.msg);

    b.ipc = calloc(n, sizeof *b.ipc);
    b.local = calloc(n, sizeof *b.local);
    cudaIpcMemHandle_t *hs = calloc(n, sizeof *hs);
    double *t_open = calloc(n, sizeof *t_open), *t_reopen = calloc(n, sizeof *t_reopen);
    double *t_close = calloc(n, sizeof *t_close), *t_unref = calloc(n, sizeof *t_unref);
    if (!b.ipc || !b.local || !hs || !t_open || !t_reopen || !t_close || !t_unref)
        die("main", "out of memory");
    cuda_check(cudaMallocHost((void **)&b.host, BLK), "cudaMallocHost (verify buffer)");
    for (unsigned s = 0; s < MAX_STREAM; s++) {
        cuda_check(cudaStreamCreateWithFlags(&b.st[s], cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
        cuda_check(cudaEventCreate(&b.ev0[s]), "cudaEventCreate");
        cuda_check(cudaEventCreate(&b.ev1[s]), "cudaEventCreate");
    }
    for (unsigned i = 0; i < n; i++) {
        cuda_check(cudaMalloc(&b.local[i], (size_t)b.bytes), "cudaMalloc (local source)");
        fill(b.local[i], i, b.bytes, b.st[0]);
    }
    cuda_check(cudaMalloc((void **)&b.slab, (size_t)(n * b.stride)), "cudaMalloc (slab)");
    wb_slab vslab;
    memset(&vslab, 0, sizeof vslab);
    if (use_vmm) {
        if (wb__vmm_slab_alloc(&vslab, device, n * b.stride, &err) != WB_OK)
            die("wb__vmm_slab_alloc", err.msg);
        b.vmm_slab = vslab.dev_ptr;
    }
    cuda_check(cudaStreamSynchronize(b.st[0]), "cudaStreamSynchronize (fill)");

    hello h;
    if (read_all(to_parent[0], &h, sizeof h) != 0)
        die("exporter", "exited before sending its handles");
    if (h.status != 0)
        die("exporter", h.msg);
    if (read_all(to_parent[0], hs, n * sizeof *hs) != 0)
        die("exporter", "sent fewer handles than tensors");
    for (unsigned i = 0; i < n; i++) {
        double t0 = now_s();
        cuda_check(cudaIpcOpenMemHandle(&b.ipc[i], hs[i], cudaIpcMemLazyEnablePeerAccess),
                   "cudaIpcOpenMemHandle");
        t_open[i] = now_s() - t0;
    }

    variant vs[16];
    unsigned nv = 0;
    vs[nv++] = (variant){"local_ce_1", 0, 0, 1, 0, 0};
    vs[nv++] = (variant){"ipc_ce_1", 1, 0, 1, 0, 0};
    vs[nv++] = (variant){"ipc_ce_2", 1, 0, 2, 0, 0};
    vs[nv++] = (variant){"ipc_ce_4", 1, 0, 4, 0, 0};
    vs[nv++] = (variant){"ipc_ce_8", 1, 0, 8, 0, 0};
    vs[nv++] = (variant){"ipc_kernel_1", 1, 1, 1, 0, 0};
    vs[nv++] = (variant){"ipc_kernel_4", 1, 1, 4, 0, 0};
    vs[nv++] = (variant){"ipc_kernel_1_b32", 1, 1, 1, 32, 0};
    vs[nv++] = (variant){"local_kernel_1", 0, 1, 1, 0, 0};
    if (use_vmm) {
        vs[nv++] = (variant){"ipc_ce_1_vmm", 1, 0, 1, 0, 1};
        vs[nv++] = (variant){"ipc_kernel_1_vmm", 1, 1, 1, 0, 1};
    }
    printf("%s: %u tensors of %llu MiB, %d runs each (median GB/s, ratio to local_ce_1)\n",
           prop.name, n, (unsigned long long)mib, runs);
    int ok = 1;
    double base_wall = 0, base_gpu = 0;
    json_t *jv = json_array();
    for (unsigned k = 0; k < nv; k++) {
        double gw, gg;
        json_array_append_new(jv, run_variant(&b, &vs[k], base_wall, base_gpu, &gw, &gg, &ok));
        if (k == 0) {
            /* The baseline's own ratios, 1, added now that it is known. */
            base_wall = gw;
            base_gpu = gg;
            json_t *o = json_array_get(jv, 0);
            json_object_set_new(o, "ratio_gpu_to_local_ce_1", json_real(1.0));
            json_object_set_new(o, "ratio_wall_to_local_ce_1", json_real(1.0));
        }
    }

    /* Opening an open handle again, then closing that reference; the real
     * close last. A driver without reference counts may fail the reopen
     * (or unmap at the first close): reported, not fatal. */
    int same = 1;
    const char *reopen_err = NULL, *unref_err = NULL;
    for (unsigned i = 0; i < n && !reopen_err; i++) {
        void *p = NULL;
        double t0 = now_s();
        cudaError_t e = cudaIpcOpenMemHandle(&p, hs[i], cudaIpcMemLazyEnablePeerAccess);
        t_reopen[i] = now_s() - t0;
        if (e != cudaSuccess) {
            reopen_err = cudaGetErrorName(e);
            break;
        }
        same &= p == b.ipc[i];
        t0 = now_s();
        e = cudaIpcCloseMemHandle(p);
        t_unref[i] = now_s() - t0;
        if (e != cudaSuccess && !unref_err)
            unref_err = cudaGetErrorName(e);
    }
    const char *close_err = NULL;
    for (unsigned i = 0; i < n; i++) {
        double t0 = now_s();
        cudaError_t e = cudaIpcCloseMemHandle(b.ipc[i]);
        t_close[i] = now_s() - t0;
        if (e != cudaSuccess && !close_err)
            close_err = cudaGetErrorName(e);
    }
    write_all(to_child[1], "x", 1);
    close(to_child[1]);
    int wst = 0;
    if (waitpid(child, &wst, 0) != child)
        die("waitpid", strerror(errno));
    child = -1;

    json_t *root = json_pack(
        "{s:s, s:{s:s, s:i, s:i, s:i, s:I}, s:i, s:i, s:I, s:I, s:I, s:i, s:b}", "bench",
        "wb_bench_d2d", "device", "name", prop.name, "ordinal", device, "sm_count", sms,
        "pci_bus_id", prop.pciBusID, "memory_bytes", (json_int_t)prop.totalGlobalMem,
        "driver_version", drv, "runtime_version", rt, "tensors", (json_int_t)n, "tensor_bytes",
        (json_int_t)b.bytes, "bytes", (json_int_t)(b.bytes * n), "runs", runs, "vmm", use_vmm);
    json_object_set_new(root, "variants", jv);
    json_object_set_new(root, "open", times_json(t_open, n));
    json_t *jr = reopen_err ? json_pack("{s:s}", "error", reopen_err)
                            : json_pack("{s:o, s:b, s:o}", "open", times_json(t_reopen, n),
                                        "same_pointer", same, "close", times_json(t_unref, n));
    if (unref_err)
        json_object_set_new(jr, "close_error", json_string(unref_err));
    json_object_set_new(root, "reopen", jr);
    json_t *jc = times_json(t_close, n);
    if (close_err)
        json_object_set_new(jc, "error", json_string(close_err));
    json_object_set_new(root, "close", jc);
    json_object_set_new(root, "verified", json_boolean(ok));
    if (json_dump_file(root, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        die(out, "cannot write the report");
    stats so = stats_of(t_open, (int)n), sc = stats_of(t_close, (int)n);
    printf("open %.1f us median (%.2f ms total), close %.1f us median (%.2f ms total)",
           so.median * 1e6, so.sum * 1e3, sc.median * 1e6, sc.sum * 1e3);
    if (reopen_err)
        printf(", reopen: %s\n", reopen_err);
    else
        printf(", reopen %.1f us median (%s pointer)\n", stats_of(t_reopen, (int)n).median * 1e6,
               same ? "same" : "another");
    printf("report: %s%s\n", out, ok ? "" : " (VERIFICATION FAILED)");
    json_decref(root);

    if (use_vmm)
        wb__vmm_slab_free(&vslab);
    for (unsigned i = 0; i < n; i++)
        cudaFree(b.local[i]);
    cudaFree(b.slab);
    cudaFreeHost(b.host);
    wb__devcopy_close(&b.dc);
    free(b.ipc);
    free(b.local);
    free(hs);
    free(t_open);
    free(t_reopen);
    free(t_close);
    free(t_unref);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0)
        fprintf(stderr, "wb_bench_d2d: the exporter exited with status 0x%x\n", wst);
    return ok ? 0 : 1;
}
