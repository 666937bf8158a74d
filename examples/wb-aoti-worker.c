/* wb-aoti-worker: serves one model variant from leased weights.
 *
 * Leases a base model and any number of per-variant models (heads) from the
 * broker, builds an AOTInductor container for the compiled variant on their
 * tensors (no copy), runs it on an input and writes the output.
 *
 *   wb-aoti-worker --model BASE [--model HEAD ...] --aoti PATH.pt2
 *                  [--input FILE] [--output FILE] [--iterations N] [--serve]
 *                  [--socket PATH] [--torch-lib DIR] [--device DEV] [--verify]
 *   wb-aoti-worker --local-weights FILE [--local-weights FILE ...] --aoti PATH ...
 *   wb-aoti-worker --uninit-weights FILE [--uninit-weights FILE ...] --aoti PATH ...
 *   wb-aoti-worker --own-constants --aoti PATH.so ...
 *   wb-aoti-worker --model BASE --aoti PATH --input FILE --serve --follow
 *                  [--version-outputs DIR]
 *
 * --follow (with --model) follows new versions of the leased models while
 * it serves (wb_container_follow: the container then owns the leases and
 * swaps each new version in between runs). Each run reports the version it
 * used (wb_container_run_versioned); the worker counts, per version, its
 * runs and the outputs that differ bitwise from that version's first one
 * (exit 3 if any differ), --version-outputs DIR writes each version's first
 * output to DIR/output_v<N>.safetensors, and the result line gains
 * "versions" (runs and changed outputs per version) and "swaps" (one per
 * swap, in order, a version twice after a rollback: when the notice came,
 * when runs began to use it (in_use_at) and when the swap was done, in Unix
 * seconds, how long it took, and how long it waited for the run in flight).
 *
 * --mutated FQN,... names constants the compiled graph writes (besides the
 * package's "weightbroker.mutated"): binding them to a lease is refused;
 * --copy-mutated binds them to private copies instead.
 *
 * --verify checks every leased tensor against the broker's checksum before
 * serving (wb_lease_verify; device memory is copied to the host in chunks
 * on a private stream).
 *
 * --local-weights loads the safetensors files into this process's own memory
 * instead of leasing them (one allocation for all their tensors, device
 * memory on CUDA, filled through two pinned chunks so that host memory never
 * holds the weights), and --own-constants lets a model library built with
 * its constants inside load them itself: both are the unshared baselines the
 * sharing is measured against.
 *
 * --uninit-weights reads only the files' headers and binds every tensor to
 * the same kind of allocation left uninitialised: no weights read, copied or
 * leased. Its outputs are meaningless; its timings are the floor of getting
 * to a first output, the first inference's own start-up included, that no
 * way of obtaining the weights can beat (the allocation is its own step,
 * alloc_local).
 *
 * Inputs and outputs are safetensors files whose tensors are named input0,
 * input1, ... and output0, output1, ... With --serve the worker keeps running
 * the model until SIGTERM or SIGINT and counts outputs that differ from the
 * first run's. On CUDA, copies go through pinned buffers with
 * cudaMemcpyAsync on the container's non-blocking stream: a serving worker
 * never calls synchronous copies, which would stall every kernel of the
 * process.
 *
 * It prints "attach ..." once the container is ready, "ready" when serving,
 * and one "result {json}" line at the end (timings, the container's
 * record). Exit codes: 0 success, 1 broker or model failure, 2 usage,
 * 3 outputs changed while serving. --help describes every option.
 *
 * Only the public headers are used, and buildinfo.h for --version's block
 * (the project's own programs print the same). */
#include "buildinfo.h"
#include "wb/client.h"
#include "wb/container.h"

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define PROG           "wb-aoti-worker"
#define EXIT_FAIL      1
#define EXIT_USAGE     2
#define EXIT_MISMATCH  3
#define MAX_MODELS     16
#define MAX_IO         16
#define MAX_ITERATIONS 100000000L
#define OPT_VERSION    256 /* long-only options */
#define OPT_VOUT       257
#define MAX_VERSIONS   64

typedef struct host_tensor {
    char name[64];
    char dtype[16];
    uint32_t ndim;
    uint64_t shape[8];
    int64_t shape64[8];
    size_t nbytes;
    uint64_t file_off; /* where its bytes start in the file */
    void *data;        /* host (pinned on CUDA) */
    void *dev;         /* device copy, CUDA only */
} host_tensor;

typedef struct st_file {
    size_t n;
    host_tensor *t;
} st_file;

static volatile sig_atomic_t stop;

/* One version seen while following: its runs, the outputs that differed
 * from its first, and that first output. */
typedef struct version_rec {
    uint32_t version;
    long runs, changed;
    void *first[MAX_IO];
} version_rec;

/* One swap seen while following (a version may come twice: a rollback):
 * the version swapped in, when the client heard of it and when the swap
 * ended (wb_container_info.last_swap_at). */
typedef struct swap_rec {
    uint32_t version;
    double notice_at, swapped_at, swap_ms, in_use_at, run_wait_ms;
} swap_rec;

/* When the client heard of each version (the subscription's callback, on
 * the client's heartbeat thread). */
static pthread_mutex_t notice_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint32_t version;
    double at;
} notices[MAX_VERSIONS];
static size_t n_notices;

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_notice(void *arg, const char *model, uint32_t version, uint32_t previous)
{
    (void)arg;
    (void)model;
    (void)previous;
    pthread_mutex_lock(&notice_mu);
    if (n_notices < MAX_VERSIONS) {
        notices[n_notices].version = version;
        notices[n_notices].at = wall_s();
        n_notices++;
    }
    pthread_mutex_unlock(&notice_mu);
}

static double notice_at(uint32_t version)
{
    double at = 0;
    pthread_mutex_lock(&notice_mu);
    for (size_t i = 0; i < n_notices; i++) {
        if (notices[i].version == version)
            at = notices[i].at;
    }
    pthread_mutex_unlock(&notice_mu);
    return at;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Every option of parse()'s table, with its argument and default. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: wb-aoti-worker --model BASE [--model HEAD ...] --aoti PATH [options]\n"
            "       wb-aoti-worker --local-weights FILE [...] --aoti PATH [options]\n"
            "       wb-aoti-worker --uninit-weights FILE [...] --aoti PATH [options]\n"
            "       wb-aoti-worker --own-constants --aoti PATH [options]\n"
            "\n"
            "Serves one AOTInductor model variant: builds its container on the weights of\n"
            "one source, runs it on --input and writes --output.\n"
            "\n"
            "Weights (exactly one source; --model and the files up to 16 times each):\n"
            "  --model NAME           lease the broker's model NAME and bind the package's\n"
            "                         constants to its tensors, no copy (a base, then heads)\n"
            "  --local-weights FILE   load the safetensors file's tensors into this\n"
            "                         process's own memory instead of leasing them (the\n"
            "                         unshared baseline)\n"
            "  --uninit-weights FILE  bind the file's tensors (read from its header only) to\n"
            "                         memory of this process left uninitialised: the floor\n"
            "                         of the first output, meaningless outputs\n"
            "  --own-constants        the model library loads its own embedded constants\n"
            "\n"
            "Model:\n"
            "  --aoti PATH            the AOTInductor package (.pt2), its unpacked directory\n"
            "                         or its model library (.so); required\n"
            "  --device DEV           cpu, cuda or cuda:N (default: $WB_WORKER_DEVICE when\n"
            "                         it names a cuda device, else cpu; a model on CUDA\n"
            "                         weights needs it)\n"
            "  --torch-lib DIR        load torch's libraries from DIR before the model\n"
            "                         (default: the dynamic linker's search path)\n"
            "  --alias NAME=TARGET    bind constant NAME to tensor TARGET, such as a tied\n"
            "                         weight (repeatable; added to the package's own)\n"
            "  --strip-prefix P       remove P from the start of constant names to find\n"
            "                         them in the leases (default: none)\n"
            "  --prefix P             then add P to them (default: none)\n"
            "  --constants FILE       the constants no checkpoint has (default: the\n"
            "                         package's weightbroker/constants.safetensors)\n"
            "  --mutated FQN,...      constants the compiled graph writes, besides the\n"
            "                         package's list: binding them to a lease is refused\n"
            "  --copy-mutated         bind those to private copies instead\n"
            "\n"
            "Running:\n"
            "  --input FILE           safetensors file of the inputs input0, input1, ...\n"
            "                         (default: none, the container is only built)\n"
            "  --output FILE          write the outputs output0, ... to FILE (default: none)\n"
            "  --iterations N         run N times on --input, timed (default: 1)\n"
            "  --serve                then run until SIGTERM or SIGINT, counting outputs\n"
            "                         that differ from the first (needs --input)\n"
            "  --follow               swap in each new version of the leased models while\n"
            "                         serving, counting runs and changed outputs per\n"
            "                         version (needs --model)\n"
            "  --version-outputs DIR  with --follow, write each version's first output to\n"
            "                         DIR/output_v<N>.safetensors (default: none)\n"
            "  --verify               check every leased tensor against the broker's\n"
            "                         checksum before running\n"
            "  --socket PATH          the broker's socket (default: $WB_SOCKET, else\n"
            "                         $XDG_RUNTIME_DIR/wbroker/broker.sock, else\n"
            "                         /run/wbroker/broker.sock as root, else\n"
            "                         /tmp/wbroker-UID/broker.sock)\n"
            "  --version              print the version and build, then exit\n"
            "  -h, --help             print this help, then exit\n"
            "\n"
            "Prints \"attach ...\" once the container is ready, \"ready\" when serving and\n"
            "one \"result {json}\" line at the end. $WB_TIMEOUT_MS: each broker request's\n"
            "timeout (default 5000).\n"
            "Exit status: 0 success, 1 broker or model failure, 2 bad usage (also a model\n"
            "on CUDA without --device), 3 outputs changed while serving (with --follow: within\n"
            "a version).\n");
}

/* A misused command line: what was wrong, then where help is. Returns
 * EXIT_USAGE. */
__attribute__((format(printf, 1, 2))) static int misuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '" PROG " --help'.\n");
    return EXIT_USAGE;
}

static int dtype_bytes(const char *dt)
{
    static const struct {
        const char *n;
        int b;
    } m[] = {{"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F64", 8}, {"I64", 8},
             {"I32", 4}, {"I16", 2},  {"I8", 1},  {"U8", 1},  {"BOOL", 1}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        if (strcmp(m[i].n, dt) == 0)
            return m[i].b;
    }
    return 0;
}

/* Host memory for tensors: pinned on CUDA so that async copies stay async. */
static void *host_alloc(size_t n, int cuda)
{
#ifdef WB_HAVE_CUDA
    if (cuda) {
        void *p = NULL;
        return cudaHostAlloc(&p, n ? n : 1, cudaHostAllocDefault) == cudaSuccess ? p : NULL;
    }
#else
    (void)cuda;
#endif
    return malloc(n ? n : 1);
}

/* Reads a safetensors file's header: every tensor's name, dtype, shape, size
 * and place in the file, no data. On success *fp is the open file. */
static int st_open(const char *path, st_file *out, FILE **fp)
{
    memset(out, 0, sizeof *out);
    *fp = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "wb-aoti-worker: %s: %s\n", path, strerror(errno));
        return -1;
    }
    uint64_t hlen = 0;
    if (fread(&hlen, 8, 1, f) != 1 || hlen > 100000000) {
        fprintf(stderr, "wb-aoti-worker: %s: not a safetensors file\n", path);
        fclose(f);
        return -1;
    }
    char *h = malloc(hlen + 1);
    if (!h || fread(h, 1, hlen, f) != hlen) {
        fprintf(stderr, "wb-aoti-worker: %s: short header\n", path);
        free(h);
        fclose(f);
        return -1;
    }
    h[hlen] = '\0';
    json_error_t je;
    json_t *j = json_loads(h, 0, &je);
    free(h);
    if (!json_is_object(j)) {
        fprintf(stderr, "wb-aoti-worker: %s: bad header: %s\n", path, je.text);
        json_decref(j);
        fclose(f);
        return -1;
    }
    out->t = calloc(json_object_size(j) + 1, sizeof *out->t);
    const char *key;
    json_t *v;
    int rc = out->t ? 0 : -1;
    json_object_foreach(j, key, v)
    {
        if (rc != 0 || strcmp(key, "__metadata__") == 0)
            continue;
        host_tensor *t = &out->t[out->n];
        snprintf(t->name, sizeof t->name, "%s", key);
        const char *dt = json_string_value(json_object_get(v, "dtype"));
        snprintf(t->dtype, sizeof t->dtype, "%s", dt ? dt : "");
        json_t *shape = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
        t->ndim = (uint32_t)json_array_size(shape);
        uint64_t elems = 1;
        for (uint32_t d = 0; d < t->ndim && d < 8; d++) {
            t->shape[d] = (uint64_t)json_integer_value(json_array_get(shape, d));
            t->shape64[d] = (int64_t)t->shape[d];
            elems *= t->shape[d];
        }
        uint64_t a = (uint64_t)json_integer_value(json_array_get(off, 0));
        uint64_t b = (uint64_t)json_integer_value(json_array_get(off, 1));
        t->nbytes = (size_t)(b - a);
        t->file_off = 8 + hlen + a;
        if (t->ndim > 8 || b < a || elems * (uint64_t)dtype_bytes(t->dtype) != t->nbytes) {
            fprintf(stderr, "wb-aoti-worker: %s: tensor %s: unsupported dtype or bad size\n", path,
                    key);
            rc = -1;
            continue;
        }
        out->n++;
    }
    json_decref(j);
    if (rc != 0) {
        fclose(f);
        return -1;
    }
    *fp = f;
    return 0;
}

/* Reads a safetensors file (every tensor) into host memory. */
static int read_st(const char *path, int cuda, st_file *out)
{
    FILE *f;
    if (st_open(path, out, &f) != 0)
        return -1;
    for (size_t i = 0; i < out->n; i++) {
        host_tensor *t = &out->t[i];
        t->data = host_alloc(t->nbytes, cuda);
        if (!t->data || fseeko(f, (off_t)t->file_off, SEEK_SET) != 0 ||
            fread(t->data, 1, t->nbytes, f) != t->nbytes) {
            fprintf(stderr, "wb-aoti-worker: %s: cannot read tensor %s\n", path, t->name);
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return 0;
}

static host_tensor *st_find(st_file *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->t[i].name, name) == 0)
            return &s->t[i];
    }
    return NULL;
}

static int write_st(const char *path, host_tensor *t, size_t n)
{
    json_t *h = json_object();
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_object(), *shape = json_array(), *offs = json_array();
        for (uint32_t d = 0; d < t[i].ndim; d++)
            json_array_append_new(shape, json_integer((json_int_t)t[i].shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + t[i].nbytes)));
        json_object_set_new(o, "dtype", json_string(t[i].dtype));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "data_offsets", offs);
        json_object_set_new(h, t[i].name, o);
        off += t[i].nbytes;
    }
    char *s = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    size_t len = strlen(s), pad = (8 - len % 8) % 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(s);
        return -1;
    }
    uint64_t hl = len + pad;
    fwrite(&hl, 8, 1, f);
    fwrite(s, 1, len, f);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    /* Tensors were laid out in the order given. */
    for (size_t i = 0; i < n; i++)
        fwrite(t[i].data, 1, t[i].nbytes, f);
    free(s);
    return fclose(f) == 0 ? 0 : -1;
}

/* Copies host tensors to the device on `stream` (CUDA only). */
static int to_device(host_tensor *t, int device, void *stream)
{
#ifdef WB_HAVE_CUDA
    (void)device;
    if (cudaMalloc(&t->dev, t->nbytes ? t->nbytes : 1) != cudaSuccess ||
        cudaMemcpyAsync(t->dev, t->data, t->nbytes, cudaMemcpyHostToDevice, (cudaStream_t)stream) !=
            cudaSuccess) {
        fprintf(stderr, "wb-aoti-worker: cannot copy %s to the device\n", t->name);
        return -1;
    }
    return 0;
#else
    (void)t;
    (void)device;
    (void)stream;
    fprintf(stderr, "wb-aoti-worker: this build has no CUDA support\n");
    return -1;
#endif
}

static int sync_stream(void *stream)
{
#ifdef WB_HAVE_CUDA
    if (stream && cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess)
        return -1;
#else
    (void)stream;
#endif
    return 0;
}

typedef struct worker {
    const char *models[MAX_MODELS];
    size_t n_models;
    const char *local[MAX_MODELS];
    size_t n_local;
    const char *uninit[MAX_MODELS]; /* --uninit-weights */
    size_t n_uninit;
    int own_constants;
    char aliases[4096]; /* --alias, joined with commas */
    const char *strip_prefix, *prefix, *constants_file;
    const char *mutated; /* --mutated: constants the graph writes */
    int copy_mutated;    /* --copy-mutated: bind those to private copies */
    const char *aoti, *input, *output, *socket, *torch_lib, *device;
    long iterations;
    int serve;
    int verify;
    double t_verify;
    int cuda;
    int dev_index;
    wb_client *client;
    wb_lease *leases[MAX_MODELS];
    st_file local_files[MAX_MODELS]; /* the headers of the files loaded by load_local */
    size_t n_files;
    wb_container_tensor *local_tensors;
    size_t n_local_tensors;
    void *weights; /* one allocation for every local tensor (device memory on CUDA) */
    size_t weights_bytes;
    wb_container *c;
    void *stream;
    st_file in;
    host_tensor out[MAX_IO];
    size_t n_out;
    double t_cuda_init, t_torch, t_connect, t_lease, t_load_local, t_alloc_local, t_container;
    double t_total;
    double run_ms_first, run_ms_median;
    long served, mismatches;
    int follow;
    const char *version_outputs;
    version_rec versions[MAX_VERSIONS];
    size_t n_versions;
    swap_rec swaps[MAX_VERSIONS];
    size_t n_swaps;
    uint32_t last_version; /* of the last run; 0 before the first */
} worker;

static int write_st(const char *path, host_tensor *t, size_t n);

/* --follow: the run's outputs (in the host buffers `got`) counted against
 * the first output of the version that run used. */
static int count_version(worker *w, uint32_t v, void *const *got, size_t n_out)
{
    version_rec *r = NULL;
    for (size_t i = 0; i < w->n_versions && !r; i++) {
        if (w->versions[i].version == v)
            r = &w->versions[i];
    }
    if (!r) {
        if (w->n_versions == MAX_VERSIONS) {
            fprintf(stderr, "wb-aoti-worker: more than %d versions\n", MAX_VERSIONS);
            return -1;
        }
        r = &w->versions[w->n_versions++];
        r->version = v;
    }
    /* The first run on another version: a swap ended before it (asked only
     * then: the info waits for an update in progress). */
    if (w->last_version && v != w->last_version && w->n_swaps < MAX_VERSIONS) {
        wb_container_info info;
        if (wb_container_get_info(w->c, &info) == WB_OK && info.swaps && info.version == v) {
            swap_rec *s = &w->swaps[w->n_swaps++];
            s->version = v;
            s->notice_at = notice_at(v);
            s->swapped_at = info.last_swap_at;
            s->swap_ms = info.last_swap_ms;
            s->in_use_at = info.last_swap_in_use_at;
            s->run_wait_ms = info.last_swap_run_wait_ms;
        }
    }
    w->last_version = v;
    if (r->runs++ == 0) {
        host_tensor t[MAX_IO];
        for (size_t i = 0; i < n_out; i++) {
            if (!(r->first[i] = malloc(w->out[i].nbytes ? w->out[i].nbytes : 1)))
                return -1;
            memcpy(r->first[i], got[i], w->out[i].nbytes);
            t[i] = w->out[i];
            t[i].data = r->first[i];
        }
        if (w->version_outputs) {
            char path[4096];
            snprintf(path, sizeof path, "%s/output_v%u.safetensors", w->version_outputs, v);
            if (write_st(path, t, n_out) != 0) {
                fprintf(stderr, "wb-aoti-worker: cannot write %s\n", path);
                return -1;
            }
        }
        return 0;
    }
    for (size_t i = 0; i < n_out; i++) {
        if (memcmp(r->first[i], got[i], w->out[i].nbytes) != 0) {
            r->changed++;
            w->mismatches++;
            break;
        }
    }
    return 0;
}

/* One inference: wraps the inputs (already on the device for CUDA), runs,
 * copies outputs to host buffers. `check` compares with the stored outputs
 * instead of storing them. */
static int run_once(worker *w, int check, double *ms)
{
    wb_aten_tensor in[MAX_IO], out[MAX_IO] = {0};
    size_t n_in = w->in.n;
    for (size_t i = 0; i < n_in; i++) {
        char name[32];
        snprintf(name, sizeof name, "input%zu", i);
        host_tensor *t = st_find(&w->in, name);
        if (!t) {
            fprintf(stderr, "wb-aoti-worker: the input file has no tensor %s\n", name);
            return -1;
        }
        if (wb_container_tensor_from_blob(w->c, w->cuda ? t->dev : t->data, t->dtype, t->ndim,
                                          t->shape64, w->cuda ? w->dev_index : -1,
                                          &in[i]) != WB_OK) {
            fprintf(stderr, "wb-aoti-worker: %s\n", wb_container_errmsg(w->c));
            return -1;
        }
    }
    wb_container_info info;
    wb_container_get_info(w->c, &info);
    size_t n_out = info.n_outputs ? info.n_outputs : 1;
    double t0 = now_ms();
    uint32_t version = 0;
    if (wb_container_run_versioned(w->c, in, n_in, out, n_out, w->stream, &version) != WB_OK) {
        fprintf(stderr, "wb-aoti-worker: run: %s\n", wb_container_errmsg(w->c));
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < n_out && rc == 0; i++) {
        wb_tensor_desc d;
        if (wb_container_tensor_describe(w->c, out[i], &d) != WB_OK) {
            fprintf(stderr, "wb-aoti-worker: %s\n", wb_container_errmsg(w->c));
            rc = -1;
            break;
        }
        host_tensor *h = &w->out[i];
        if (!check) {
            snprintf(h->name, sizeof h->name, "output%zu", i);
            snprintf(h->dtype, sizeof h->dtype, "%s", d.dtype);
            h->ndim = d.ndim;
            for (uint32_t k = 0; k < d.ndim; k++)
                h->shape[k] = (uint64_t)d.shape[k];
            h->nbytes = d.nbytes;
            h->data = host_alloc(d.nbytes, w->cuda);
            h->dev = host_alloc(d.nbytes, w->cuda); /* a second buffer for checks */
            if (!h->data || !h->dev) {
                rc = -1;
                break;
            }
        }
        void *dst = check ? h->dev : h->data;
#ifdef WB_HAVE_CUDA
        if (w->cuda) {
            if (cudaMemcpyAsync(dst, d.data, d.nbytes, cudaMemcpyDeviceToHost,
                                (cudaStream_t)w->stream) != cudaSuccess)
                rc = -1;
        } else
#endif
            memcpy(dst, d.data, d.nbytes);
    }
    if (rc == 0 && sync_stream(w->stream) != 0)
        rc = -1;
    *ms = now_ms() - t0;
    if (w->follow && rc == 0) {
        void *got[MAX_IO];
        for (size_t i = 0; i < n_out; i++)
            got[i] = check ? w->out[i].dev : w->out[i].data;
        rc = count_version(w, version, got, n_out);
    }
    for (size_t i = 0; i < n_out; i++) {
        if (!w->follow && check && rc == 0 &&
            memcmp(w->out[i].data, w->out[i].dev, w->out[i].nbytes) != 0)
            w->mismatches++;
        wb_container_tensor_delete(w->c, out[i]);
    }
    if (!check)
        w->n_out = n_out;
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define WEIGHT_ALIGN 256u        /* each tensor's start in the allocation, as cudaMalloc's */
#define STAGE_BYTES  (64u << 20) /* each of the two pinned chunks of a CUDA load */

/* Fills the device memory of the tensors from their files through two pinned
 * chunks: one is read into while the other is copied, and host memory never
 * holds more than the two. */
static int fill_device(worker *w, FILE **files, const char *const *paths)
{
#ifdef WB_HAVE_CUDA
    void *stage[2] = {NULL, NULL};
    cudaEvent_t done[2] = {NULL, NULL};
    int rc = 0, k = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        if (cudaHostAlloc(&stage[i], STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming) != cudaSuccess) {
            fprintf(stderr, "wb-aoti-worker: cannot allocate the pinned load buffers\n");
            rc = -1;
        }
    }
    for (size_t i = 0; i < w->n_files && rc == 0; i++) {
        for (size_t j = 0; j < w->local_files[i].n && rc == 0; j++) {
            host_tensor *t = &w->local_files[i].t[j];
            char *dst = t->dev;
            size_t left = t->nbytes;
            if (fseeko(files[i], (off_t)t->file_off, SEEK_SET) != 0)
                rc = -1;
            while (rc == 0 && left) {
                size_t n = left < STAGE_BYTES ? left : STAGE_BYTES;
                /* The copy that last used this chunk must be done first. */
                if (cudaEventSynchronize(done[k]) != cudaSuccess ||
                    fread(stage[k], 1, n, files[i]) != n) {
                    rc = -1;
                    break;
                }
                if (cudaMemcpyAsync(dst, stage[k], n, cudaMemcpyHostToDevice,
                                    (cudaStream_t)w->stream) != cudaSuccess ||
                    cudaEventRecord(done[k], (cudaStream_t)w->stream) != cudaSuccess) {
                    fprintf(stderr, "wb-aoti-worker: %s: cannot copy tensor %s to the device\n",
                            paths[i], t->name);
                    rc = -2;
                    break;
                }
                dst += n;
                left -= n;
                k ^= 1;
            }
            if (rc == -1)
                fprintf(stderr, "wb-aoti-worker: %s: cannot read tensor %s\n", paths[i], t->name);
        }
    }
    if (sync_stream(w->stream) != 0 && rc == 0) {
        fprintf(stderr, "wb-aoti-worker: the copies to the device failed\n");
        rc = -1;
    }
    for (int i = 0; i < 2; i++) {
        if (done[i])
            cudaEventDestroy(done[i]);
        if (stage[i])
            cudaFreeHost(stage[i]);
    }
    return rc == 0 ? 0 : -1;
#else
    (void)w;
    (void)files;
    (void)paths;
    fprintf(stderr, "wb-aoti-worker: this build has no CUDA support\n");
    return -1;
#endif
}

/* The unshared baseline (fill: --local-weights) and the floor (no fill:
 * --uninit-weights): every tensor of the safetensors files gets its place
 * in one allocation of this process (device memory on CUDA) and is bound as
 * a caller tensor; with fill its bytes are read from the file into it. */
static int load_local(worker *w, const char *const *paths, size_t n_paths, int fill)
{
    FILE *files[MAX_MODELS] = {NULL};
    int rc = 0;
    size_t total = 0, bytes = 0;
    w->n_files = n_paths;
    for (size_t i = 0; i < n_paths && rc == 0; i++) {
        if (st_open(paths[i], &w->local_files[i], &files[i]) != 0) {
            rc = -1;
            break;
        }
        total += w->local_files[i].n;
        for (size_t k = 0; k < w->local_files[i].n; k++) {
            size_t n = w->local_files[i].t[k].nbytes;
            bytes += (n + WEIGHT_ALIGN - 1) / WEIGHT_ALIGN * WEIGHT_ALIGN;
        }
    }
    if (rc == 0) {
        w->local_tensors = calloc(total + 1, sizeof *w->local_tensors);
        w->weights_bytes = bytes;
#ifdef WB_HAVE_CUDA
        if (w->cuda) {
            cudaError_t e = cudaMalloc(&w->weights, bytes ? bytes : 1);
            if (e != cudaSuccess) {
                fprintf(stderr, "wb-aoti-worker: cannot allocate %zu bytes of device memory: %s\n",
                        bytes, cudaGetErrorString(e));
                w->weights = NULL;
            }
        } else
#endif
            w->weights = malloc(bytes ? bytes : 1);
        if (!w->local_tensors || !w->weights) {
            if (!w->cuda || w->weights)
                fprintf(stderr, "wb-aoti-worker: cannot allocate %zu bytes\n", bytes);
            rc = -1;
        }
    }
    size_t off = 0;
    for (size_t i = 0; i < n_paths && rc == 0; i++) {
        for (size_t k = 0; k < w->local_files[i].n && rc == 0; k++) {
            host_tensor *t = &w->local_files[i].t[k];
            void *p = (char *)w->weights + off;
            off += (t->nbytes + WEIGHT_ALIGN - 1) / WEIGHT_ALIGN * WEIGHT_ALIGN;
            if (w->cuda)
                t->dev = p;
            else
                t->data = p;
            if (fill && !w->cuda &&
                (fseeko(files[i], (off_t)t->file_off, SEEK_SET) != 0 ||
                 fread(p, 1, t->nbytes, files[i]) != t->nbytes)) {
                fprintf(stderr, "wb-aoti-worker: %s: cannot read tensor %s\n", paths[i], t->name);
                rc = -1;
                break;
            }
            wb_container_tensor *ct = &w->local_tensors[w->n_local_tensors++];
            ct->fqn = t->name;
            ct->data = p;
            ct->dtype = t->dtype;
            ct->ndim = t->ndim;
            ct->shape = t->shape;
            ct->device = w->cuda ? w->dev_index : -1;
        }
    }
    if (rc == 0 && fill && w->cuda)
        rc = fill_device(w, files, paths);
    for (size_t i = 0; i < n_paths; i++) {
        if (files[i])
            fclose(files[i]);
    }
    return rc;
}

static void free_local(worker *w)
{
#ifdef WB_HAVE_CUDA
    if (w->cuda && w->weights)
        cudaFree(w->weights);
    else
#endif
        free(w->weights);
    w->weights = NULL;
    for (size_t i = 0; i < w->n_files; i++) {
        free(w->local_files[i].t);
        w->local_files[i].t = NULL;
    }
    free(w->local_tensors);
    w->local_tensors = NULL;
}

static int attach(worker *w)
{
    double t0 = now_ms();
    if (w->n_models) {
        wb_client_options o;
        wb_client_options_init(&o);
        o.socket_path = w->socket;
        o.client_name = "wb-aoti-worker";
        if (wb_client_connect(&o, &w->client) != WB_OK) {
            fprintf(stderr, "wb-aoti-worker: %s\n", wb_client_errmsg(w->client));
            return -1;
        }
        w->t_connect = now_ms() - t0;
        double t1 = now_ms();
        for (size_t i = 0; i < w->n_models; i++) {
            if (wb_lease_acquire(w->client, w->models[i], &w->leases[i]) != WB_OK) {
                fprintf(stderr, "wb-aoti-worker: %s\n", wb_client_errmsg(w->client));
                return -1;
            }
        }
        w->t_lease = now_ms() - t1;
    }
    if (w->n_local) {
        double t1 = now_ms();
        if (load_local(w, w->local, w->n_local, 1) != 0)
            return -1;
        w->t_load_local = now_ms() - t1;
    }
    if (w->n_uninit) {
        double t1 = now_ms();
        if (load_local(w, w->uninit, w->n_uninit, 0) != 0)
            return -1;
        w->t_alloc_local = now_ms() - t1;
    }
    double t2 = now_ms();
    wb_container_options o;
    wb_container_options_init(&o);
    o.torch_lib_dir = w->torch_lib;
    o.device = w->device;
    o.stream = w->stream;
    o.tensors = w->local_tensors;
    o.n_tensors = w->n_local_tensors;
    o.own_constants = w->own_constants;
    o.aliases = w->aliases[0] ? w->aliases : NULL;
    o.strip_prefix = w->strip_prefix;
    o.prefix = w->prefix;
    o.constants_file = w->constants_file;
    o.mutated = w->mutated;
    o.copy_mutated = w->copy_mutated;
    int rc = wb_container_create(w->leases, w->n_models, w->aoti, &o, &w->c);
    if (rc != WB_OK) {
        fprintf(stderr, "wb-aoti-worker: %s: %s\n", wb_status_name(rc), wb_container_errmsg(w->c));
        return -1;
    }
    w->t_container = now_ms() - t2;
    w->t_total = now_ms() - t0;
    if (w->follow) {
        /* Its own subscription, to note when each notice came; then the
         * container follows, and owns the leases from now on. */
        for (size_t i = 0; i < w->n_models; i++) {
            if (wb_client_subscribe(w->client, w->models[i], on_notice, NULL, NULL) != WB_OK) {
                fprintf(stderr, "wb-aoti-worker: --follow: %s\n", wb_client_errmsg(w->client));
                return -1;
            }
        }
        if ((rc = wb_container_follow(w->c, w->client)) != WB_OK) {
            fprintf(stderr, "wb-aoti-worker: --follow: %s: %s\n", wb_status_name(rc),
                    wb_container_errmsg(w->c));
            return -1;
        }
        for (size_t i = 0; i < w->n_models; i++)
            w->leases[i] = NULL;
    }
    return 0;
}

static void print_result(worker *w, int rc)
{
    wb_container_info info;
    memset(&info, 0, sizeof info);
    if (w->c)
        wb_container_get_info(w->c, &info);
    json_t *o = json_object();
    json_object_set_new(o, "ok", json_boolean(rc == 0));
    json_object_set_new(o, "pid", json_integer(getpid()));
    json_object_set_new(o, "mode",
                        json_string(w->n_models   ? "leased"
                                    : w->n_local  ? "local_weights"
                                    : w->n_uninit ? "uninit_weights"
                                                  : "own_constants"));
    json_object_set_new(o, "aoti_api", json_string(info.aoti_api ? info.aoti_api : ""));
    json_object_set_new(o, "device", json_string(info.device ? info.device : ""));
    json_object_set_new(o, "pinned_async_copy", json_boolean(info.pinned_async_copy));
    json_object_set_new(o, "constants", json_integer((json_int_t)info.n_constants));
    json_object_set_new(o, "bound_tensors", json_integer((json_int_t)info.bound_tensors));
    json_object_set_new(o, "bound_bytes", json_integer((json_int_t)info.bound_bytes));
    json_object_set_new(o, "caller_bytes", json_integer((json_int_t)info.caller_bytes));
    json_object_set_new(o, "folded_constants", json_integer((json_int_t)info.folded_constants));
    json_object_set_new(o, "folded_bytes", json_integer((json_int_t)info.folded_bytes));
    json_object_set_new(o, "embedded_bytes", json_integer((json_int_t)info.embedded_bytes));
    json_object_set_new(o, "embedded_free_s", json_real(info.embedded_free_seconds));
    json_object_set_new(o, "leased_constants", json_integer((json_int_t)info.leased_constants));
    json_object_set_new(o, "aliased_constants", json_integer((json_int_t)info.aliased_constants));
    json_object_set_new(o, "caller_constants", json_integer((json_int_t)info.caller_constants));
    json_object_set_new(o, "package_constants", json_integer((json_int_t)info.package_constants));
    json_object_set_new(o, "unbound_constants", json_integer((json_int_t)info.unbound_constants));
    json_object_set_new(o, "package_bytes", json_integer((json_int_t)info.package_bytes));
    /* The one allocation of --local-weights or --uninit-weights. */
    json_object_set_new(o, "local_bytes", json_integer((json_int_t)w->weights_bytes));
    json_t *t = json_object();
    json_object_set_new(t, "cuda_init", json_real(w->t_cuda_init));
    json_object_set_new(t, "torch_load", json_real(w->t_torch));
    json_object_set_new(t, "connect", json_real(w->t_connect));
    json_object_set_new(t, "lease_and_open", json_real(w->t_lease));
    json_object_set_new(t, "load_local", json_real(w->t_load_local));
    json_object_set_new(t, "alloc_local", json_real(w->t_alloc_local));
    json_object_set_new(t, "container", json_real(w->t_container));
    json_object_set_new(t, "library_load", json_real(info.library_seconds * 1e3));
    json_object_set_new(t, "attach_total", json_real(w->t_total));
    json_object_set_new(t, "first_run", json_real(w->run_ms_first));
    json_object_set_new(t, "median_run", json_real(w->run_ms_median));
    json_object_set_new(t, "verify", json_real(w->t_verify));
    json_object_set_new(o, "ms", t);
    json_object_set_new(o, "served", json_integer(w->served));
    json_object_set_new(o, "mismatches", json_integer(w->mismatches));
    if (w->follow) {
        json_t *vs = json_array(), *sw = json_array();
        for (size_t i = 0; i < w->n_versions; i++) {
            const version_rec *r = &w->versions[i];
            json_t *v = json_object();
            json_object_set_new(v, "version", json_integer(r->version));
            json_object_set_new(v, "runs", json_integer(r->runs));
            json_object_set_new(v, "changed", json_integer(r->changed));
            json_array_append_new(vs, v);
        }
        for (size_t i = 0; i < w->n_swaps; i++) {
            const swap_rec *r = &w->swaps[i];
            json_t *x = json_object();
            json_object_set_new(x, "version", json_integer(r->version));
            json_object_set_new(x, "notice_at", json_real(r->notice_at));
            json_object_set_new(x, "swapped_at", json_real(r->swapped_at));
            json_object_set_new(x, "swap_ms", json_real(r->swap_ms));
            json_object_set_new(x, "in_use_at", json_real(r->in_use_at));
            json_object_set_new(x, "run_wait_ms", json_real(r->run_wait_ms));
            json_array_append_new(sw, x);
        }
        json_object_set_new(o, "versions", vs);
        json_object_set_new(o, "swaps", sw);
        json_object_set_new(o, "follow_errors", json_integer(info.follow_errors));
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    printf("result %s\n", s);
    fflush(stdout);
    free(s);
    json_decref(o);
}

static int parse(worker *w, int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"local-weights", required_argument, NULL, 'L'},
        {"uninit-weights", required_argument, NULL, 'U'},
        {"own-constants", no_argument, NULL, 'E'},
        {"aoti", required_argument, NULL, 'a'},
        {"input", required_argument, NULL, 'i'},
        {"output", required_argument, NULL, 'o'},
        {"iterations", required_argument, NULL, 'n'},
        {"serve", no_argument, NULL, 'S'},
        {"follow", no_argument, NULL, 'F'},
        {"version-outputs", required_argument, NULL, OPT_VOUT},
        {"verify", no_argument, NULL, 'V'},
        {"socket", required_argument, NULL, 's'},
        {"torch-lib", required_argument, NULL, 't'},
        {"device", required_argument, NULL, 'd'},
        {"alias", required_argument, NULL, 'A'},
        {"strip-prefix", required_argument, NULL, 'P'},
        {"prefix", required_argument, NULL, 'p'},
        {"constants", required_argument, NULL, 'C'},
        {"mutated", required_argument, NULL, 'u'},
        {"copy-mutated", no_argument, NULL, 'K'},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    w->iterations = 1;
    int c;
    /* getopt's own messages would name the program by its full argv[0]. */
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            if (w->n_models == MAX_MODELS)
                return misuse("--model: at most %d models", MAX_MODELS);
            w->models[w->n_models++] = optarg;
            break;
        case 'L':
            if (w->n_local == MAX_MODELS)
                return misuse("--local-weights: at most %d files", MAX_MODELS);
            w->local[w->n_local++] = optarg;
            break;
        case 'U':
            if (w->n_uninit == MAX_MODELS)
                return misuse("--uninit-weights: at most %d files", MAX_MODELS);
            w->uninit[w->n_uninit++] = optarg;
            break;
        case 'E':
            w->own_constants = 1;
            break;
        case 'A': {
            size_t used = strlen(w->aliases);
            if (used + strlen(optarg) + 2 > sizeof w->aliases)
                return misuse("--alias: too many aliases (%zu bytes at most)",
                              sizeof w->aliases - 1);
            snprintf(w->aliases + used, sizeof w->aliases - used, "%s%s", used ? "," : "", optarg);
            break;
        }
        case 'P':
            w->strip_prefix = optarg;
            break;
        case 'p':
            w->prefix = optarg;
            break;
        case 'u':
            w->mutated = optarg;
            break;
        case 'K':
            w->copy_mutated = 1;
            break;
        case 'C':
            w->constants_file = optarg;
            break;
        case 'a':
            w->aoti = optarg;
            break;
        case 'i':
            w->input = optarg;
            break;
        case 'o':
            w->output = optarg;
            break;
        case 'n': {
            char *end;
            errno = 0;
            w->iterations = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || w->iterations < 1 ||
                w->iterations > MAX_ITERATIONS)
                return misuse("--iterations: expected a number from 1 to %ld, got '%s'",
                              MAX_ITERATIONS, optarg);
            break;
        }
        case 'F':
            w->follow = 1;
            break;
        case OPT_VOUT:
            w->version_outputs = optarg;
            break;
        case 'S':
            w->serve = 1;
            break;
        case 'V':
            w->verify = 1;
            break;
        case 's':
            w->socket = optarg;
            break;
        case 't':
            w->torch_lib = optarg;
            break;
        case 'd':
            w->device = optarg;
            break;
        case OPT_VERSION:
            wb__print_version(stdout, PROG, NULL);
            exit(0);
        case 'h':
            usage(stdout);
            exit(0);
        case ':':
            return misuse("option '%s' needs an argument", argv[optind - 1]);
        default:
            /* A long option is named as written; a short one by optopt (it
             * may be inside a group of them). */
            if (strncmp(argv[optind - 1], "--", 2) == 0)
                return misuse("unrecognized option '%s'", argv[optind - 1]);
            return misuse("unrecognized option '-%c'", optopt);
        }
    }
    if (optind != argc)
        return misuse("unexpected argument '%s'", argv[optind]);
    int modes = (w->n_models > 0) + (w->n_local > 0) + (w->n_uninit > 0) + w->own_constants;
    if (!w->aoti || modes != 1)
        return misuse("give --aoti and exactly one of --model, --local-weights, "
                      "--uninit-weights, --own-constants");
    if (w->serve && !w->input)
        return misuse("--serve needs --input");
    if (w->follow && !w->n_models)
        return misuse("--follow needs --model");
    if (w->version_outputs && !w->follow)
        return misuse("--version-outputs needs --follow");
    return 0;
}

int main(int argc, char **argv)
{
    static worker w;
    int rc = parse(&w, argc, argv);
    if (rc)
        return rc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* The library's log lines (container_ready, ...) go to our stderr. */
    wb_set_log_handler(wb_log_stderr, NULL);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    /* CUDA when asked for, or when the weights will be in device memory:
     * the context is made here, before timing the attach. */
    w.cuda = w.device ? strncmp(w.device, "cuda", 4) == 0 : 0;
    const char *env_dev = getenv("WB_WORKER_DEVICE");
    if (!w.device && env_dev && strncmp(env_dev, "cuda", 4) == 0) {
        w.cuda = 1;
        w.device = env_dev;
    }
#ifdef WB_HAVE_CUDA
    if (w.cuda) {
        double t0 = now_ms();
        const char *colon = strchr(w.device, ':');
        w.dev_index = colon ? atoi(colon + 1) : 0;
        cudaStream_t s;
        if (cudaSetDevice(w.dev_index) != cudaSuccess || cudaFree(NULL) != cudaSuccess ||
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "wb-aoti-worker: no usable GPU for %s\n", w.device);
            return EXIT_FAIL;
        }
        w.stream = s;
        w.t_cuda_init = now_ms() - t0;
    }
#else
    if (w.cuda) {
        fprintf(stderr, "wb-aoti-worker: this build has no CUDA support\n");
        return EXIT_FAIL;
    }
#endif
    if (w.torch_lib) {
        /* Loaded here, before the attach is timed, as a serving process
         * would have it loaded already; the binding then finds it. */
        double t0 = now_ms();
        static const char *libs[] = {"libc10.so", "libc10_cuda.so", "libtorch_cpu.so",
                                     "libtorch_cuda.so", "libtorch.so"};
        for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", w.torch_lib, libs[i]);
            if (access(p, R_OK) == 0 && !dlopen(p, RTLD_NOW | RTLD_GLOBAL))
                fprintf(stderr, "wb-aoti-worker: %s\n", dlerror());
        }
        w.t_torch = now_ms() - t0;
    }
    if (w.input && read_st(w.input, w.cuda, &w.in) != 0)
        return EXIT_FAIL;
    for (size_t i = 0; w.cuda && i < w.in.n; i++) {
        if (to_device(&w.in.t[i], w.dev_index, w.stream) != 0)
            return EXIT_FAIL;
    }
    if (sync_stream(w.stream) != 0)
        return EXIT_FAIL;

    rc = attach(&w) == 0 ? 0 : EXIT_FAIL;
    if (rc == 0) {
        wb_container_info info;
        wb_container_get_info(w.c, &info);
        if (!w.cuda && strncmp(info.device, "cuda", 4) == 0) {
            fprintf(stderr, "wb-aoti-worker: the model runs on %s: pass --device %s\n", info.device,
                    info.device);
            rc = EXIT_USAGE;
        }
    }
    if (rc == 0) {
        wb_container_info info;
        wb_container_get_info(w.c, &info);
        printf("attach api=%s total_ms=%.1f connect_ms=%.1f lease_ms=%.1f container_ms=%.1f "
               "bound_bytes=%llu folded_bytes=%llu\n",
               info.aoti_api, w.t_total, w.t_connect, w.t_lease, w.t_container,
               (unsigned long long)info.bound_bytes, (unsigned long long)info.folded_bytes);
    }
    for (size_t i = 0; rc == 0 && w.verify && i < w.n_models; i++) {
        double t0 = now_ms();
        size_t bad = 0;
        if (wb_lease_verify(w.leases[i], &bad) != WB_OK) {
            fprintf(stderr, "wb-aoti-worker: %s\n", wb_client_errmsg(w.client));
            rc = EXIT_FAIL;
            break;
        }
        w.t_verify += now_ms() - t0;
        printf("verified %s (%zu tensors) in %.1f ms\n", w.models[i],
               wb_lease_tensor_count(w.leases[i]), now_ms() - t0);
    }
    if (rc == 0 && w.input) {
        double *ms = calloc((size_t)w.iterations, sizeof *ms);
        if (!ms) {
            fprintf(stderr, "wb-aoti-worker: cannot allocate the timings of %ld runs\n",
                    w.iterations);
            rc = EXIT_FAIL;
        }
        for (long i = 0; rc == 0 && i < w.iterations; i++)
            rc = run_once(&w, i > 0, &ms[i]) == 0 ? 0 : EXIT_FAIL;
        if (rc == 0) {
            w.run_ms_first = ms[0];
            qsort(ms, (size_t)w.iterations, sizeof *ms, cmp_double);
            w.run_ms_median = ms[w.iterations / 2];
        }
        free(ms);
        if (rc == 0 && w.output && write_st(w.output, w.out, w.n_out) != 0) {
            fprintf(stderr, "wb-aoti-worker: cannot write %s\n", w.output);
            rc = EXIT_FAIL;
        }
    }
    if (rc == 0 && w.serve) {
        printf("ready\n");
        while (!stop && rc == 0) {
            double ms;
            rc = run_once(&w, 1, &ms) == 0 ? 0 : EXIT_FAIL;
            w.served++;
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        printf("served runs=%ld mismatches=%ld\n", w.served, w.mismatches);
        if (rc == 0 && w.mismatches)
            rc = EXIT_MISMATCH;
    }
    print_result(&w, rc);
    /* With --follow the container owns the leases and releases them. */
    wb_container_destroy(&w.c);
    free_local(&w);
    for (size_t i = 0; i < w.n_models; i++) {
        if (w.leases[i] && wb_lease_release(&w.leases[i]) != WB_OK)
            fprintf(stderr, "wb-aoti-worker: release: %s\n", wb_client_errmsg(w.client));
    }
    for (size_t i = 0; i < w.n_versions; i++) {
        for (size_t k = 0; k < MAX_IO; k++)
            free(w.versions[i].first[k]);
    }
    wb_client_destroy(&w.client);
    return rc;
}
