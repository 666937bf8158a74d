/* wb-publish: publishes the tensors of a safetensors file as a new version
 * of a model, from this process's memory (include/wb/publish.h).
 *
 *   wb-publish --model NAME FILE.safetensors [--partial] [--device cuda:N]
 *              [--placement P] [--socket PATH] [--timeout-ms MS]
 *
 * The file's data is read into host memory and published from there (the
 * library copies it into a memfd the broker maps), or with --device cuda:N
 * copied to that device through a pinned buffer and published from device
 * memory (exported with CUDA IPC; the broker copies it during the commit).
 * A host broker takes host sources only, a cuda broker device sources only.
 * Prints "published NAME version N copy_ms=... bytes=..." on success.
 *
 * Exit codes: 0 published, 1 the file or the broker could not be used, 2
 * bad usage, 3 the broker refused the publish. */
#include "buildinfo.h"
#include "wb/publish.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define PROG         "wb-publish"
#define EXIT_FAIL    1
#define EXIT_USAGE   2
#define EXIT_REFUSED 3
#define OPT_VERSION  256
#define MAX_DIMS     64
/* Device copies go through a pinned buffer of this size. */
#define PIN_CHUNK (64u << 20)

static void usage(FILE *out)
{
    fprintf(out,
            "usage: wb-publish --model NAME FILE.safetensors [--partial] [--device cuda:N]\n"
            "                  [--placement P] [--socket PATH] [--timeout-ms MS]\n"
            "\n"
            "Publishes the tensors of FILE as a new version of model NAME, from this\n"
            "process's memory, and prints \"published NAME version N copy_ms=... bytes=...\".\n"
            "\n"
            "  --model NAME           the model to publish (required)\n"
            "  --partial              publish only FILE's tensors; the model's others keep\n"
            "                         their bytes (default: FILE names every tensor)\n"
            "  --device DEV           cuda:N: copy the tensors to that device first and\n"
            "                         publish from device memory, for a cuda broker\n"
            "                         (default: host memory, for a host broker)\n"
            "  --placement P          a new model's placement, as wbctl load --placement\n"
            "  --socket PATH          the broker's socket (default: $WB_SOCKET, else\n"
            "                         $XDG_RUNTIME_DIR/wbroker/broker.sock, else\n"
            "                         /run/wbroker/broker.sock as root, else\n"
            "                         /tmp/wbroker-UID/broker.sock)\n"
            "  --timeout-ms MS        each broker request's timeout (default: $WB_TIMEOUT_MS,\n"
            "                         else 5000; the commit waits at least 60 s)\n"
            "  --version              print the version and build, then exit\n"
            "  -h, --help             print this help, then exit\n"
            "\n"
            "Exit status: 0 published, 1 the file or the broker could not be used (the\n"
            "reason is on stderr), 2 bad usage, 3 the broker refused the publish.\n");
}

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

/* The file's table and its data section, read whole. */
typedef struct file {
    size_t n;
    wb_publish_desc *t;
    uint64_t (*shape)[MAX_DIMS];
    uint64_t *begin, *end; /* data offsets */
    uint8_t *data;
    uint64_t data_len;
    json_t *header;
} file;

static void file_free(file *f)
{
    free(f->t);
    free(f->shape);
    free(f->begin);
    free(f->end);
    free(f->data);
    json_decref(f->header);
}

static int bad(const char *path, const char *what)
{
    fprintf(stderr, PROG ": %s: %s\n", path, what);
    return EXIT_FAIL;
}

static int file_read(const char *path, file *f)
{
    memset(f, 0, sizeof *f);
    FILE *in = fopen(path, "rb");
    if (!in) {
        fprintf(stderr, PROG ": %s: %s\n", path, strerror(errno));
        return EXIT_FAIL;
    }
    uint8_t len8[8];
    int rc = EXIT_FAIL;
    char *h = NULL;
    if (fread(len8, 1, 8, in) != 8) {
        rc = bad(path, "shorter than a safetensors header");
        goto out;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    if (hlen == 0 || hlen > 100000000) {
        rc = bad(path, "the header length is not plausible");
        goto out;
    }
    h = malloc(hlen + 1);
    if (!h || fread(h, 1, hlen, in) != hlen) {
        rc = bad(path, "cannot read the header");
        goto out;
    }
    h[hlen] = '\0';
    json_error_t je;
    f->header = json_loads(h, 0, &je);
    if (!json_is_object(f->header)) {
        rc = bad(path, "the header is not a JSON object");
        goto out;
    }
    size_t cap = json_object_size(f->header);
    f->t = calloc(cap ? cap : 1, sizeof *f->t);
    f->shape = calloc(cap ? cap : 1, sizeof *f->shape);
    f->begin = calloc(cap ? cap : 1, sizeof *f->begin);
    f->end = calloc(cap ? cap : 1, sizeof *f->end);
    if (!f->t || !f->shape || !f->begin || !f->end) {
        rc = bad(path, "out of memory");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(f->header, key, v)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
        json_t *off = json_object_get(v, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(sh) || json_array_size(sh) > MAX_DIMS ||
            !json_is_array(off) || json_array_size(off) != 2) {
            fprintf(stderr, PROG ": %s: tensor '%s' is not described as safetensors does\n", path,
                    key);
            goto out;
        }
        size_t i = f->n++;
        f->t[i].name = key;
        f->t[i].dtype = json_string_value(dt);
        f->t[i].ndim = (uint32_t)json_array_size(sh);
        for (size_t k = 0; k < f->t[i].ndim; k++)
            f->shape[i][k] = (uint64_t)json_integer_value(json_array_get(sh, k));
        f->t[i].shape = f->shape[i];
        f->begin[i] = (uint64_t)json_integer_value(json_array_get(off, 0));
        f->end[i] = (uint64_t)json_integer_value(json_array_get(off, 1));
        if (f->end[i] < f->begin[i] || f->end[i] > ((uint64_t)1 << 48)) {
            fprintf(stderr, PROG ": %s: tensor '%s' has data offsets out of order or range\n", path,
                    key);
            goto out;
        }
        if (f->end[i] > f->data_len)
            f->data_len = f->end[i];
    }
    f->data = malloc(f->data_len ? f->data_len : 1);
    if (!f->data || fread(f->data, 1, f->data_len, in) != f->data_len) {
        rc = bad(path, "cannot read the data section (cut short?)");
        goto out;
    }
    rc = 0;
out:
    free(h);
    fclose(in);
    return rc;
}

/* The file's data on device `device`, copied through a pinned buffer. */
static int to_device(const file *f, int device, void **out)
{
#ifdef WB_HAVE_CUDA
    void *pin = NULL;
    cudaError_t ce = cudaSetDevice(device);
    if (ce == cudaSuccess)
        ce = cudaMalloc(out, f->data_len ? f->data_len : 1);
    if (ce == cudaSuccess)
        ce = cudaMallocHost(&pin, PIN_CHUNK);
    for (uint64_t at = 0; ce == cudaSuccess && at < f->data_len; at += PIN_CHUNK) {
        size_t n = f->data_len - at < PIN_CHUNK ? (size_t)(f->data_len - at) : PIN_CHUNK;
        memcpy(pin, f->data + at, n);
        ce = cudaMemcpy((uint8_t *)*out + at, pin, n, cudaMemcpyHostToDevice);
    }
    if (pin)
        cudaFreeHost(pin);
    if (ce != cudaSuccess) {
        fprintf(stderr, PROG ": copying to cuda:%d: %s\n", device, cudaGetErrorString(ce));
        return EXIT_FAIL;
    }
    return 0;
#else
    (void)f;
    (void)device;
    (void)out;
    fprintf(stderr, PROG ": --device: this build has no CUDA support\n");
    return EXIT_FAIL;
#endif
}

static int publish(wb_client *c, const char *model, const file *f, const uint8_t *base,
                   const wb_publish_options *o)
{
    wb_publisher *p = NULL;
    int rc = wb_publish_begin(c, model, o, &p);
    if (rc != WB_OK) {
        fprintf(stderr, PROG ": %s\n", wb_client_errmsg(c));
        return rc == WB_ECONN || rc == WB_ETIMEDOUT ? EXIT_FAIL : EXIT_REFUSED;
    }
    for (size_t i = 0; i < f->n; i++) {
        rc = wb_publish_tensor(p, f->t[i].name, base + f->begin[i], f->end[i] - f->begin[i]);
        if (rc != WB_OK) {
            fprintf(stderr, PROG ": %s\n", wb_publish_errmsg(p));
            wb_publish_abort(&p);
            return EXIT_FAIL;
        }
    }
    wb_publish_info info;
    rc = wb_publish_commit_ex(&p, &info);
    if (rc != WB_OK) {
        fprintf(stderr, PROG ": %s\n", wb_client_errmsg(c));
        return rc == WB_ECONN || rc == WB_ETIMEDOUT ? EXIT_FAIL : EXIT_REFUSED;
    }
    printf("published %s version %u copy_ms=%.1f bytes=%llu kept_bytes=%llu\n", model, info.version,
           info.copy_seconds * 1000.0, (unsigned long long)info.copied_bytes,
           (unsigned long long)info.kept_bytes);
    return 0;
}

int main(int argc, char **argv)
{
    /* One entry a line: test_worker_cli reads the table. */
    /* clang-format off */
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"partial", no_argument, NULL, 'p'},
        {"device", required_argument, NULL, 'd'},
        {"placement", required_argument, NULL, 'P'},
        {"socket", required_argument, NULL, 's'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* clang-format on */
    const char *model = NULL, *socket_path = NULL, *path = NULL;
    wb_publish_options o;
    wb_publish_options_init(&o);
    int device = -1, timeout_ms = 0, c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'p':
            o.partial = 1;
            break;
        case 'd': {
            char *end;
            errno = 0;
            long d = strncmp(optarg, "cuda:", 5) == 0 ? strtol(optarg + 5, &end, 10) : -1;
            if (d < 0 || errno || end == optarg + 5 || *end || d > 1023)
                return misuse("--device: expected cuda:N, got '%s'", optarg);
            device = (int)d;
            break;
        }
        case 'P':
            o.placement = optarg;
            break;
        case 's':
            socket_path = optarg;
            break;
        case 't': {
            char *end;
            errno = 0;
            long ms = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || ms < 1 || ms > 86400000)
                return misuse("--timeout-ms: expected milliseconds, got '%s'", optarg);
            timeout_ms = (int)ms;
            break;
        }
        case OPT_VERSION:
            wb__print_version(stdout, PROG, NULL);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        case ':':
            return misuse("option '%s' needs an argument", argv[optind - 1]);
        default:
            if (strncmp(argv[optind - 1], "--", 2) == 0)
                return misuse("unrecognized option '%s'", argv[optind - 1]);
            return misuse("unrecognized option '-%c'", optopt);
        }
    }
    if (optind < argc)
        path = argv[optind++];
    if (optind < argc)
        return misuse("unexpected argument '%s'", argv[optind]);
    if (!model || !model[0])
        return misuse("--model NAME is required");
    if (!path)
        return misuse("no FILE.safetensors to publish");

    file f;
    int rc = file_read(path, &f);
    if (rc != 0) {
        file_free(&f);
        return rc;
    }
    o.tensors = f.t;
    o.n_tensors = f.n;
    void *dev = NULL;
    if (device >= 0 && (rc = to_device(&f, device, &dev)) != 0) {
        file_free(&f);
        return rc;
    }
    wb_client_options co;
    wb_client_options_init(&co);
    co.socket_path = socket_path;
    co.client_name = PROG;
    co.timeout_ms = timeout_ms;
    wb_client *client = NULL;
    if (wb_client_connect(&co, &client) != WB_OK) {
        fprintf(stderr, PROG ": %s\n", wb_client_errmsg(client));
        rc = EXIT_FAIL;
    } else {
        rc = publish(client, model, &f, dev ? dev : f.data, &o);
    }
    wb_client_destroy(&client);
#ifdef WB_HAVE_CUDA
    if (dev)
        cudaFree(dev);
#endif
    file_free(&f);
    return rc;
}
