/* wb_bench_load: how fast a safetensors checkpoint reaches GPU memory, with
 * the broker's own loader (the code wbrokerd runs, called as a library) in
 * several variants, and the baselines measured in the same run on the same
 * file:
 *   pageable_sync            cudaMemcpy per tensor from the file mapping
 *                            (what AOTInductor does by default for constants)
 *   pinned_pingpong_1thread  one thread, two 64 MiB pinned buffers: copy from
 *                            the mapping into one while the other goes to the
 *                            device (AOTInductor 2.14's pinned path)
 *   pinned_peak              one large cudaMemcpyAsync from pinned memory
 *   ring_copies              the copy stage alone: the default ring's
 *                            buffer-sized copies, back to back from the ring
 *   ring_copies_with_host_traffic  the same while as many threads as the
 *                            default reads with copy host memory (memcpy)
 * The variants: wbrokerd's compiled-in default (gbps.wbrokerd), then each
 * change to the staged loader alone (read source pread / mmap / mmap-nt,
 * a ring in huge pages, reader threads and read block from a sweep), all of
 * them together, and the mapped mode with the file registered whole or in
 * pieces on 1, 4 or 8 threads while copying. Each variant: `--runs` loads
 * (median), the last one verified byte for byte and checksum for checksum
 * against the file. Optional: the sweep (--sweep) and a cold-cache figure
 * next to the disk's raw read bandwidth (--cold). Writes a JSON report.
 *
 * usage: wb_bench_load [--file PATH] [--gib N] [--runs N] [--out JSON]
 *                      [--device N] [--sweep] [--cold] [--cold-gib N]
 *                      [--threads N] [--staging-mib N] [--buffers N]
 *                      [--read-block-kib N] [--variants NAME,...] [--write-only]
 *                      [--keep-loads] [--pause-ms N] [--copy-batch N] [--ring-sweep]
 *                      [--reuse [--cycles N]]
 * --variants limits the variants to those named (default always runs);
 * --write-only writes the checkpoint (if missing) and exits; --keep-loads
 * keeps every load's device memory until its variant ends (each load gets
 * memory no earlier load used) and --pause-ms waits between loads: both to
 * see why back-to-back loads run slower than the first of a series;
 * --ring-sweep times the copy stage's ways one against another (copies of
 * one buffer or several adjacent ones, several streams, batches of
 * cudaMemcpyBatchAsync) on the default ring, nothing else running;
 * --reuse runs the reuse study (load_reuse.c) instead of everything above:
 * why a load into device memory the previous load freed runs slower than one
 * into memory no load used. The pinned peak into memory fresh, freed and
 * allocated again, or kept (cudaMalloc and cuMemCreate), the same after a
 * cudaMemset, and the loader fresh, reused and into one kept slab, for
 * both slab kinds; --cycles (5) of each, interleaved, each verified. The
 * report's "reused_memory" holds it. */
#include "load.h"
#include "stage.h"
#include "stage_ntcopy.h"

#include <xxhash.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void die(const char *what, const char *why)
{
    fprintf(stderr, "wb_bench_load: %s: %s\n", what, why);
    exit(1);
}

void cuda_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        die(what, cudaGetErrorString(e));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double median(double *v, int n)
{
    double *c = malloc((size_t)n * sizeof *c);
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
    free(c);
    return m;
}

json_t *samples_json(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

/* ---- the checkpoint ---- */

/* A model-like mix: per layer a few small tensors (norms, biases) and
 * matrices from 1 to 256 MiB, odd sizes included; embeddings of 512 MiB at
 * both ends. */
static const uint64_t layer_sizes[] = {4 * 1024,      4 * 1024 + 6,    16 * 1024, 64 * 1024,
                                       1 * MIB + 512, 16 * MIB,        32 * MIB,  64 * MIB,
                                       128 * MIB,     256 * MIB - 4096};

static size_t plan_sizes(uint64_t want, uint64_t **out)
{
    size_t cap = 16 + (size_t)(want / (400 * MIB) + 1) * 10, n = 0;
    uint64_t *s = malloc(cap * sizeof *s), total = 0;
    s[n++] = 512 * MIB;
    total += 512 * MIB;
    while (total + 512 * MIB < want) {
        for (size_t i = 0; i < sizeof layer_sizes / sizeof layer_sizes[0]; i++) {
            s[n++] = layer_sizes[i];
            total += layer_sizes[i];
        }
    }
    s[n++] = 512 * MIB;
    *out = s;
    return n;
}

typedef struct gen_arg {
    int fd;
    uint64_t from, to, seed;
} gen_arg;

static void *gen_main(void *p)
{
    gen_arg *g = p;
    size_t blk = 64 * MIB;
    uint64_t *buf = malloc(blk);
    uint64_t x = g->seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t off = g->from; off < g->to; off += blk) {
        size_t n = g->to - off < blk ? (size_t)(g->to - off) : blk;
        for (size_t i = 0; i < (n + 7) / 8; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = x;
        }
        if (pwrite(g->fd, buf, n, (off_t)off) != (ssize_t)n)
            die("pwrite", strerror(errno));
    }
    free(buf);
    return NULL;
}

/* Writes the checkpoint unless a file of the expected size is there. */
static void make_checkpoint(const char *path, uint64_t want)
{
    uint64_t *sizes;
    size_t n = plan_sizes(want, &sizes);
    size_t cap = 128 + n * 96;
    char *hdr = malloc(cap);
    size_t len = (size_t)snprintf(hdr, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(hdr + len, cap - len,
                                ",\"layer.%04zu.weight\":{\"dtype\":\"U8\",\"shape\":[%llu],"
                                "\"data_offsets\":[%llu,%llu]}",
                                i, (unsigned long long)sizes[i], (unsigned long long)off,
                                (unsigned long long)(off + sizes[i]));
        off += sizes[i];
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8)
        hdr[len++] = ' ';
    uint64_t file_size = 8 + len + off;
    struct stat st;
    if (stat(path, &st) == 0 && (uint64_t)st.st_size == file_size) {
        printf("checkpoint: reusing %s (%zu tensors, %.2f GiB)\n", path, n, (double)off / GIB);
        free(hdr);
        free(sizes);
        return;
    }
    double t0 = now_s();
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(path, strerror(errno));
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)len >> (8 * i));
    if (pwrite(fd, le, 8, 0) != 8 || pwrite(fd, hdr, len, 8) != (ssize_t)len)
        die("writing the header", strerror(errno));
    enum { T = 16 };
    pthread_t tid[T];
    gen_arg ga[T];
    uint64_t base = 8 + len, per = (off / T + 4095) & ~4095ull;
    for (int i = 0; i < T; i++) {
        uint64_t from = base + per * (uint64_t)i, to = from + per;
        if (from > base + off)
            from = base + off;
        if (to > base + off)
            to = base + off;
        ga[i] = (gen_arg){.fd = fd, .from = from, .to = to, .seed = (uint64_t)i + 1};
        pthread_create(&tid[i], NULL, gen_main, &ga[i]);
    }
    for (int i = 0; i < T; i++)
        pthread_join(tid[i], NULL);
    if (fsync(fd) != 0)
        die("fsync", strerror(errno));
    close(fd);
    printf("checkpoint: wrote %s (%zu tensors, %.2f GiB) in %.1f s\n", path, n, (double)off / GIB,
           now_s() - t0);
    free(hdr);
    free(sizes);
}

/* ---- page cache ---- */

static double resident_fraction(const char *path)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        die(path, strerror(errno));
    size_t len = (size_t)st.st_size;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        die("mmap", strerror(errno));
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (len + page - 1) / page, in = 0;
    unsigned char *vec = malloc(pages);
    if (mincore(p, len, vec) != 0)
        die("mincore", strerror(errno));
    for (size_t i = 0; i < pages; i++)
        in += vec[i] & 1;
    free(vec);
    munmap(p, len);
    return (double)in / (double)pages;
}

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        die(path, strerror(errno));
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

typedef struct read_arg {
    int fd;
    uint64_t size, block;
    int direct;
    _Atomic uint64_t *next;
} read_arg;

static void *read_main(void *p)
{
    read_arg *r = p;
    void *buf;
    if (posix_memalign(&buf, 4096, r->block) != 0)
        return NULL;
    for (;;) {
        uint64_t off = atomic_fetch_add(r->next, r->block);
        if (off >= r->size)
            break;
        size_t n = r->size - off < r->block ? (size_t)(r->size - off) : (size_t)r->block;
        if (r->direct)
            n = (n + 4095) & ~(size_t)4095;
        if (pread(r->fd, buf, n, (off_t)off) < 0)
            break;
    }
    free(buf);
    return NULL;
}

/* Reads the whole file with `threads` threads in `block`-byte reads; O_DIRECT
 * bypasses the page cache (the disk's raw bandwidth). Returns GB/s, or -1
 * when O_DIRECT is refused. */
static double read_file(const char *path, int threads, uint64_t block, int direct)
{
    int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
    if (fd < 0)
        return -1;
    struct stat st;
    fstat(fd, &st);
    _Atomic uint64_t next = 0;
    pthread_t tid[64];
    read_arg ra = {
        .fd = fd, .size = (uint64_t)st.st_size, .block = block, .direct = direct, .next = &next};
    double t0 = now_s();
    for (int i = 0; i < threads; i++)
        pthread_create(&tid[i], NULL, read_main, &ra);
    for (int i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    double t = now_s() - t0;
    close(fd);
    return (double)st.st_size / t / 1e9;
}

/* ---- the broker's loader ---- */

/* The stage configuration a loader_cfg asks for (0: the default). */
static wb_stage_config stage_cfg(const loader_cfg *c)
{
    return (wb_stage_config){.read_threads = c->threads,
                             .chunk_bytes = c->chunk,
                             .buffers = c->buffers,
                             .read_block = c->block,
                             .read_source = c->read,
                             .ring_pages = c->pages,
                             .register_threads = c->reg_threads,
                             .copy_batch = c->batch};
}

/* The same with every default filled in, as the loader runs it. */
static wb_stage_config stage_cfg_filled(const loader_cfg *c)
{
    wb_stage_config s = stage_cfg(c);
    wb__stage_config_fill(&s);
    return s;
}

wb_backend *start_backend(int device, const loader_cfg *c, char *pages, size_t pages_len)
{
    wb_cuda_options o = {
        .device = device, .slab = c->slab, .load_mode = c->mode, .stage = stage_cfg(c)};
    wb_backend *be = NULL;
    wb_err err;
    if (wb__backend_cuda_new(&o, &be, &err) != WB_OK) {
        fprintf(stderr, "wb_bench_load: starting the cuda backend: %s\n", err.msg);
        return NULL;
    }
    if (pages)
        snprintf(pages, pages_len, "%s", be->staging ? be->staging->pages : "none");
    return be;
}

load_result load_once(const wb_backend *be, const char *path, int device, int keep)
{
    load_result r = {0};
    wb_load_opts o = {.backend = be, .device = device};
    wb_err err;
    double t0 = now_s();
    if ((r.rc = wb__load_ex(path, &o, &r.d, &err)) != WB_OK) {
        snprintf(r.error, sizeof r.error, "%s", err.msg);
        fprintf(stderr, "wb_bench_load: the broker's loader: %s\n", err.msg);
        return r;
    }
    double t = now_s() - t0;
    r.gbps = (double)r.d.bytes / t / 1e9;
    r.pipeline_gbps = (double)r.d.bytes / r.d.stage.seconds / 1e9;
    r.read_source = r.d.stage.read_source;
    if (!keep)
        wb__model_data_free(&r.d, be);
    return r;
}

json_t *stages_json(const wb_model_data *d)
{
    const wb_stage_stats *s = &d->stage;
    json_t *o = json_object();
    json_object_set_new(o, "mode", json_string(wb__stage_mode_name(s->mode)));
    if (s->mode != WB_STAGE_MAPPED)
        json_object_set_new(o, "read_source", json_string(wb__stage_read_name(s->read_source)));
    json_object_set_new(o, "threads", json_integer(s->threads));
    json_object_set_new(o, "chunks", json_integer((json_int_t)s->chunks));
    json_object_set_new(o, "load_seconds", json_real(d->load_seconds));
    json_object_set_new(o, "open_seconds", json_real(d->open_seconds));
    json_object_set_new(o, "alloc_seconds", json_real(d->alloc_seconds));
    json_object_set_new(o, "register_seconds", json_real(d->register_seconds));
    json_object_set_new(o, "register_seconds_summed_in_pieces", json_real(s->register_seconds));
    json_object_set_new(o, "pipeline_seconds", json_real(s->seconds));
    json_object_set_new(o, "read_gbps",
                        json_real(wb__stage_gbps(s->bytes, s->read_busy, s->threads)));
    json_object_set_new(o, "hash_gbps",
                        json_real(wb__stage_gbps(s->bytes, s->hash_busy, s->threads)));
    json_object_set_new(o, "copy_seconds", json_real(s->copy_seconds));
    json_object_set_new(o, "copy_calls", json_integer((json_int_t)s->copy_calls));
    json_object_set_new(
        o, "copy_gbps",
        json_real(s->copy_seconds > 0 ? (double)s->bytes / s->copy_seconds / 1e9 : 0));
    json_object_set_new(o, "wait_seconds_summed", json_real(s->wait_busy));
    return o;
}

/* Compares every tensor of a loaded slab with the file, byte for byte
 * (copied back through a pinned buffer), and its checksum with the file's
 * XXH3-64. */
static json_t *verify(const wb_model_data *d, const reference *ref, uint64_t *mismatches)
{
    uint64_t compared = 0, bad = 0, bad_hash = 0;
    double t0 = now_s();
    for (size_t i = 0; i < d->n_tensors; i++) {
        const wb_model_tensor *mt = &d->tensors[i];
        const wb_st_tensor *st = wb__st_find(ref->t, mt->name);
        if (!st || st->nbytes != mt->nbytes) {
            bad++;
            continue;
        }
        size_t k = (size_t)(st - ref->t->tensors);
        int differs = 0;
        for (uint64_t off = 0; off < mt->nbytes; off += ref->pin_len) {
            size_t n = mt->nbytes - off < ref->pin_len ? (size_t)(mt->nbytes - off) : ref->pin_len;
            cuda_check(cudaMemcpy(ref->pin, (uint8_t *)d->slabs[0].dev_ptr + mt->offset + off, n,
                                  cudaMemcpyDeviceToHost),
                       "verify: cudaMemcpy");
            differs |= memcmp(ref->pin, ref->map + st->offset + off, n) != 0;
        }
        bad += differs;
        bad_hash += ref->xxh3[k] != mt->xxh3;
        compared += mt->nbytes;
    }
    json_t *o = json_object();
    json_object_set_new(o, "bytes_compared", json_integer((json_int_t)compared));
    json_object_set_new(o, "tensor_mismatches", json_integer((json_int_t)bad));
    json_object_set_new(o, "xxh3_mismatches", json_integer((json_int_t)bad_hash));
    json_object_set_new(o, "seconds", json_real(now_s() - t0));
    *mismatches = bad + bad_hash;
    return o;
}

/* ---- baselines ---- */

typedef struct mapped_file {
    wb_st_table *t;
    uint8_t *map;
    size_t len;
    uint64_t bytes, slab;
} mapped_file;

static void map_file(const char *path, mapped_file *m)
{
    wb_err err;
    if (wb__st_open(path, &m->t, &err) != WB_OK)
        die(path, err.msg);
    int fd = open(path, O_RDONLY);
    struct stat st;
    fstat(fd, &st);
    m->len = (size_t)st.st_size;
    m->map = mmap(NULL, m->len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m->map == MAP_FAILED)
        die("mmap", strerror(errno));
    m->bytes = m->t->total_bytes;
    m->slab = 0;
    for (size_t i = 0; i < m->t->n_tensors; i++)
        m->slab = ((m->slab + 255) & ~255ull) + m->t->tensors[i].nbytes;
}

/* AOTInductor's default: cudaMemcpy per tensor from pageable memory. */
static double pageable_sync(const mapped_file *m, uint8_t *slab)
{
    double t0 = now_s();
    uint64_t off = 0;
    for (size_t i = 0; i < m->t->n_tensors; i++) {
        const wb_st_tensor *st = &m->t->tensors[i];
        off = (off + 255) & ~255ull;
        cuda_check(cudaMemcpy(slab + off, m->map + st->offset, st->nbytes, cudaMemcpyHostToDevice),
                   "cudaMemcpy");
        off += st->nbytes;
    }
    return (double)m->bytes / (now_s() - t0) / 1e9;
}

/* AOTInductor 2.14's pinned path: one thread, two 64 MiB pinned buffers; it
 * fills one from the mapping while the other is copied. */
static double pinned_pingpong(const mapped_file *m, uint8_t *slab, uint8_t *const pin[2],
                              cudaStream_t s, cudaEvent_t const ev[2])
{
    const uint64_t B = 64 * MIB;
    double t0 = now_s();
    uint64_t off = 0, k = 0;
    for (size_t i = 0; i < m->t->n_tensors; i++) {
        const wb_st_tensor *st = &m->t->tensors[i];
        off = (off + 255) & ~255ull;
        for (uint64_t done = 0; done < st->nbytes; done += B, k++) {
            uint64_t n = st->nbytes - done < B ? st->nbytes - done : B;
            int b = (int)(k % 2);
            cuda_check(cudaEventSynchronize(ev[b]), "cudaEventSynchronize");
            memcpy(pin[b], m->map + st->offset + done, n);
            cuda_check(cudaMemcpyAsync(slab + off + done, pin[b], n, cudaMemcpyHostToDevice, s),
                       "cudaMemcpyAsync");
            cuda_check(cudaEventRecord(ev[b], s), "cudaEventRecord");
        }
        off += st->nbytes;
    }
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return (double)m->bytes / (now_s() - t0) / 1e9;
}

/* The rate of n bytes moved between events a and b (b recorded last):
 * waits for b, then frees both. */
static double events_rate(cudaEvent_t a, cudaEvent_t b, uint64_t n)
{
    cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return (double)n / (ms / 1e3) / 1e9;
}

/* The link's peak: one large copy from pinned memory, timed on the device. */
static double pinned_peak(uint8_t *pin, uint8_t *slab, uint64_t n, cudaStream_t s)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, s);
    cuda_check(cudaMemcpyAsync(slab, pin, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    cudaEventRecord(b, s);
    return events_rate(a, b, n);
}

/* The copy stage without the readers: n bytes copied in `chunk`-sized
 * copies cycling through a ring of `bufs` pinned buffers, queued back to
 * back on one stream, as the copier queues them (the ring's contents do not
 * matter here). With `hogs` threads each copying 64 MiB between buffers of
 * its own in a loop meanwhile (host memory traffic like the readers',
 * without the page cache), the same copies show what that traffic costs
 * the copy engine. */
typedef struct hog {
    pthread_t tid;
    const atomic_int *stop;
    uint8_t *a, *b;
    atomic_ullong chunks; /* 64 MiB copies done */
} hog;

static void *hog_main(void *arg)
{
    hog *h = arg;
    while (!atomic_load(h->stop)) {
        memcpy(h->b, h->a, 64 * MIB);
        atomic_fetch_add(&h->chunks, 1);
    }
    return NULL;
}

static double ring_copies(uint8_t *ring, unsigned bufs, uint64_t chunk, uint8_t *slab, uint64_t n,
                          cudaStream_t s, int hogs, double *hog_gbps)
{
    atomic_int stop = 0;
    hog hs[64];
    int started = 0;
    for (int i = 0; i < hogs && i < 64; i++) {
        hs[i] = (hog){.stop = &stop, .a = malloc(64 * MIB), .b = malloc(64 * MIB)};
        atomic_init(&hs[i].chunks, 0);
        if (!hs[i].a || !hs[i].b)
            die("ring_copies", "out of memory");
        memset(hs[i].a, i, 64 * MIB);
        memset(hs[i].b, i, 64 * MIB);
    }
    for (int i = 0; i < hogs && i < 64; i++, started++)
        pthread_create(&hs[i].tid, NULL, hog_main, &hs[i]);
    if (hogs)
        usleep(50000); /* the traffic running before the first copy */
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    unsigned long long before = 0;
    for (int i = 0; i < started; i++)
        before += atomic_load(&hs[i].chunks);
    double t0 = now_s();
    cudaEventRecord(a, s);
    for (uint64_t off = 0, k = 0; off < n; off += chunk, k++) {
        uint64_t len = n - off < chunk ? n - off : chunk;
        cuda_check(
            cudaMemcpyAsync(slab + off, ring + (k % bufs) * chunk, len, cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync");
    }
    cudaEventRecord(b, s);
    cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
    double wall = now_s() - t0;
    unsigned long long after = 0;
    for (int i = 0; i < started; i++)
        after += atomic_load(&hs[i].chunks);
    atomic_store(&stop, 1);
    for (int i = 0; i < started; i++)
        pthread_join(hs[i].tid, NULL);
    double hog_bytes = (double)(after - before) * 64.0 * MIB;
    for (int i = 0; i < hogs && i < 64; i++) {
        free(hs[i].a);
        free(hs[i].b);
    }
    if (hog_gbps)
        *hog_gbps = wall > 0 ? hog_bytes / wall / 1e9 : 0;
    return events_rate(a, b, n);
}

/* One way of moving a ring's bytes to the device, for --ring-sweep: copies
 * of `join` consecutive buffers each (one buffer: what the loader does),
 * spread over `streams` streams in turn, an event recorded after each copy
 * (as the loader does, to tell when a buffer may be refilled) or not, or
 * `batch` buffers at a time in one cudaMemcpyBatchAsync. */
typedef struct ring_way {
    const char *name;
    unsigned join, streams, batch;
    int events;
} ring_way;

static double ring_way_copies(const ring_way *w, uint8_t *ring, unsigned bufs, uint64_t chunk,
                              uint8_t *slab, uint64_t n, cudaStream_t *st, cudaEvent_t *evs)
{
    cudaEvent_t a, b;
    cuda_check(cudaEventCreate(&a), "cudaEventCreate");
    cuda_check(cudaEventCreate(&b), "cudaEventCreate");
    cuda_check(cudaEventRecord(a, st[0]), "cudaEventRecord");
    for (unsigned i = 1; i < w->streams; i++)
        cuda_check(cudaStreamWaitEvent(st[i], a, 0), "cudaStreamWaitEvent");
    uint64_t step = chunk * w->join;
    unsigned k = 0, per = w->batch ? w->batch : 1;
    for (uint64_t off = 0; off < n; k++) {
        cudaStream_t s = st[k % w->streams];
        void *dsts[64] = {0};
        const void *srcs[64] = {0};
        size_t lens[64] = {0};
        unsigned m = 0;
        for (; m < per && off < n; m++) {
            uint64_t len = n - off < step ? n - off : step;
            dsts[m] = slab + off;
            srcs[m] = ring + ((off / chunk) % bufs) * chunk;
            lens[m] = (size_t)len;
            off += len;
        }
        if (w->batch) {
            struct cudaMemcpyAttributes at;
            memset(&at, 0, sizeof at);
            at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            size_t idx = 0;
            cuda_check(cudaMemcpyBatchAsync(dsts, srcs, lens, m, &at, &idx, 1, s),
                       "cudaMemcpyBatchAsync");
        } else {
            cuda_check(cudaMemcpyAsync(dsts[0], srcs[0], lens[0], cudaMemcpyHostToDevice, s),
                       "cudaMemcpyAsync");
        }
        if (w->events)
            cuda_check(cudaEventRecord(evs[k % bufs], s), "cudaEventRecord");
    }
    for (unsigned i = 1; i < w->streams; i++) {
        cuda_check(cudaEventRecord(evs[i], st[i]), "cudaEventRecord");
        cuda_check(cudaStreamWaitEvent(st[0], evs[i], 0), "cudaStreamWaitEvent");
    }
    cuda_check(cudaEventRecord(b, st[0]), "cudaEventRecord");
    return events_rate(a, b, n);
}

/* --ring-sweep: each way `runs` times over n bytes, median GB/s and its
 * ratio to the pinned peak of the same run. */
static json_t *ring_sweep(int runs, uint8_t *ring, unsigned bufs, uint64_t chunk, uint8_t *slab,
                          uint64_t n, double peak)
{
    static const ring_way ways[] = {
        {"one buffer a copy, no events", 1, 1, 0, 0},
        {"one buffer a copy, an event each (the loader)", 1, 1, 0, 1},
        {"one buffer a copy, an event each, 2 streams", 1, 2, 0, 1},
        {"one buffer a copy, an event each, 4 streams", 1, 4, 0, 1},
        {"2 buffers a copy, an event each", 2, 1, 0, 1},
        {"4 buffers a copy, an event each", 4, 1, 0, 1},
        {"8 buffers a copy, an event each", 8, 1, 0, 1},
        {"4 buffers a batch (cudaMemcpyBatchAsync), an event each", 1, 1, 4, 1},
        {"16 buffers a batch (cudaMemcpyBatchAsync), an event each", 1, 1, 16, 1},
    };
    cudaStream_t st[4];
    for (int i = 0; i < 4; i++)
        cuda_check(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking), "cudaStreamCreate");
    cudaEvent_t *evs = calloc(bufs, sizeof *evs);
    if (!evs)
        die("ring_sweep", "out of memory");
    for (unsigned i = 0; i < bufs; i++)
        cuda_check(cudaEventCreateWithFlags(&evs[i], cudaEventDisableTiming), "cudaEventCreate");
    json_t *arr = json_array();
    double v[32];
    for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
        if (bufs % ways[w].join)
            continue;
        for (int r = 0; r < runs; r++)
            v[r] = ring_way_copies(&ways[w], ring, bufs, chunk, slab, n, st, evs);
        double m = median(v, runs);
        json_t *o = json_object();
        json_object_set_new(o, "way", json_string(ways[w].name));
        json_object_set_new(o, "copy_bytes", json_integer((json_int_t)(chunk * ways[w].join)));
        json_object_set_new(o, "streams", json_integer(ways[w].streams));
        json_object_set_new(o, "batch", json_integer(ways[w].batch));
        json_object_set_new(o, "events", json_boolean(ways[w].events));
        json_object_set_new(o, "gbps", json_real(m));
        json_object_set_new(o, "over_pinned_peak", json_real(m / peak));
        json_object_set_new(o, "samples", samples_json(v, runs));
        json_array_append_new(arr, o);
        printf("ring way: %-58s %.2f GB/s (%.3f of the peak)\n", ways[w].name, m, m / peak);
    }
    for (unsigned i = 0; i < bufs; i++)
        cudaEventDestroy(evs[i]);
    free(evs);
    for (int i = 0; i < 4; i++)
        cudaStreamDestroy(st[i]);
    return arr;
}

/* ---- main ---- */

typedef struct opts {
    const char *file, *out, *only;
    double gib, cold_gib;
    int runs, device, sweep, cold, write_only;
    /* Between a variant's loads: keep every load's device memory until the
     * variant ends (no slab reused), and pause this long. */
    int keep_loads, pause_ms;
    /* The copy stage's ways measured one against another (ring_sweep). */
    int ring_sweep;
    /* The reuse study instead of the variants (load_reuse.c), `cycles` of
     * each of its variants. */
    int reuse, cycles;
    loader_cfg cfg;
} opts;

static void parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {{"file", required_argument, NULL, 'f'},
                                       {"gib", required_argument, NULL, 'g'},
                                       {"runs", required_argument, NULL, 'r'},
                                       {"out", required_argument, NULL, 'o'},
                                       {"device", required_argument, NULL, 'd'},
                                       {"sweep", no_argument, NULL, 's'},
                                       {"cold", no_argument, NULL, 'c'},
                                       {"cold-gib", required_argument, NULL, 'C'},
                                       {"threads", required_argument, NULL, 't'},
                                       {"staging-mib", required_argument, NULL, 'm'},
                                       {"buffers", required_argument, NULL, 'b'},
                                       {"read-block-kib", required_argument, NULL, 'B'},
                                       {"help", no_argument, NULL, 'h'},
                                       {"write-only", no_argument, NULL, 'w'},
                                       {"variants", required_argument, NULL, 'v'},
                                       {"keep-loads", no_argument, NULL, 'k'},
                                       {"pause-ms", required_argument, NULL, 'p'},
                                       {"ring-sweep", no_argument, NULL, 'R'},
                                       {"copy-batch", required_argument, NULL, 'X'},
                                       {"reuse", no_argument, NULL, 'U'},
                                       {"cycles", required_argument, NULL, 'N'},
                                       {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'f':
            o->file = optarg;
            break;
        case 'g':
            o->gib = atof(optarg);
            break;
        case 'r':
            o->runs = atoi(optarg);
            break;
        case 'o':
            o->out = optarg;
            break;
        case 'd':
            o->device = atoi(optarg);
            break;
        case 's':
            o->sweep = 1;
            break;
        case 'c':
            o->cold = 1;
            break;
        case 'C':
            o->cold_gib = atof(optarg);
            break;
        case 't':
            o->cfg.threads = (unsigned)atoi(optarg);
            break;
        case 'm':
            o->cfg.chunk = (uint64_t)atoi(optarg) * MIB;
            break;
        case 'b':
            o->cfg.buffers = (unsigned)atoi(optarg);
            break;
        case 'B':
            o->cfg.block = (unsigned)atoi(optarg) * 1024u;
            break;
        case 'v':
            o->only = optarg;
            break;
        case 'w':
            o->write_only = 1;
            break;
        case 'k':
            o->keep_loads = 1;
            break;
        case 'p':
            o->pause_ms = atoi(optarg);
            break;
        case 'R':
            o->ring_sweep = 1;
            break;
        case 'X':
            o->cfg.batch = (unsigned)atoi(optarg);
            break;
        case 'U':
            o->reuse = 1;
            break;
        case 'N':
            o->cycles = atoi(optarg);
            break;
        case 'h':
            printf("usage: wb_bench_load [--file PATH] [--gib N] [--runs N] [--out JSON] "
                   "[--device N]\n                     [--sweep] [--cold] [--cold-gib N] "
                   "[--threads N] [--staging-mib N] [--buffers N]\n                     "
                   "[--read-block-kib N] [--variants NAME,NAME...] [--write-only]\n"
                   "                     [--keep-loads] [--pause-ms N] [--ring-sweep] "
                   "[--copy-batch N]\n"
                   "                     [--reuse [--cycles N]]\n"
                   "--threads, --staging-mib, --buffers, --read-block-kib and --copy-batch "
                   "change the default variant only.\n");
            exit(0);
        default:
            exit(2);
        }
    }
    if (o->runs < 3)
        o->runs = 3;
    if (o->runs > 32)
        o->runs = 32;
    if (o->cycles < 2)
        o->cycles = 2;
    if (o->cycles > 32)
        o->cycles = 32;
}

json_t *cfg_json(const loader_cfg *c)
{
    wb_stage_config s = stage_cfg_filled(c);
    json_t *o = json_object();
    json_object_set_new(o, "load_mode", json_string(wb__stage_mode_name(c->mode)));
    json_object_set_new(o, "read_threads", json_integer(s.read_threads));
    if (c->mode == WB_STAGE_MAPPED) {
        json_object_set_new(o, "register_threads", json_integer(s.register_threads));
        json_object_set_new(o, "register_piece_mib",
                            json_real((double)s.register_piece / (double)MIB));
    } else {
        json_object_set_new(o, "read_source", json_string(wb__stage_read_name(s.read_source)));
        json_object_set_new(o, "staging_pages", json_string(wb__stage_pages_name(s.ring_pages)));
        json_object_set_new(o, "staging_mib", json_real((double)s.chunk_bytes / MIB));
        json_object_set_new(o, "staging_buffers", json_integer(s.buffers));
        json_object_set_new(o, "read_block_kib", json_integer(s.read_block / 1024));
        json_object_set_new(o, "copy_batch", json_integer(s.copy_batch));
    }
    return o;
}

/* The command-line options that select a configuration in wbrokerd. */
static void cfg_flags(const loader_cfg *c, char *buf, size_t len)
{
    wb_stage_config s = stage_cfg_filled(c);
    if (c->mode == WB_STAGE_MAPPED)
        snprintf(buf, len, "--load-method mapped --read-threads %u%s%.0u", s.read_threads,
                 s.register_threads ? " --register-threads " : "", s.register_threads);
    else
        snprintf(buf, len,
                 "--read-source %s --staging-pages %s --read-threads %u --staging-mib %llu "
                 "--staging-buffers %u --copy-batch %u (read block %u KiB)",
                 wb__stage_read_name(s.read_source), wb__stage_pages_name(s.ring_pages),
                 s.read_threads, (unsigned long long)(s.chunk_bytes / MIB), s.buffers, s.copy_batch,
                 s.read_block / 1024);
}

void save(json_t *root, const char *out)
{
    if (out && json_dump_file(root, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        die(out, "cannot write the report");
}

/* One variant of the loader: `runs` timed loads with one configuration (a
 * fresh backend, as wbrokerd starts it), the last one verified. */
typedef struct variant {
    const char *name, *what;
    loader_cfg cfg;
    double gbps, pipeline;
    uint64_t bad;
    int ok;
} variant;

static json_t *run_variant(const opts *o, variant *v, const reference *ref)
{
    json_t *e = json_object();
    json_object_set_new(e, "name", json_string(v->name));
    json_object_set_new(e, "what", json_string(v->what));
    json_object_set_new(e, "config", cfg_json(&v->cfg));
    char flags[256];
    cfg_flags(&v->cfg, flags, sizeof flags);
    json_object_set_new(e, "wbrokerd_options", json_string(flags));
    char pages[160] = "";
    wb_backend *be = start_backend(o->device, &v->cfg, pages, sizeof pages);
    if (!be) {
        json_object_set_new(e, "error", json_string("the cuda backend did not start"));
        return e;
    }
    json_object_set_new(e, "staging_pages_got", json_string(pages));
    double g[32], p[32];
    load_result keep = {0};
    wb_model_data held[32];
    int n = 0, n_held = 0;
    for (int i = 0; i < o->runs; i++) {
        if (i > 0 && o->pause_ms > 0)
            usleep((useconds_t)o->pause_ms * 1000);
        int last = i == o->runs - 1;
        load_result r = load_once(be, o->file, o->device, last || o->keep_loads);
        if (r.rc != WB_OK) {
            json_object_set_new(e, "error", json_string(r.error));
            break;
        }
        g[n] = r.gbps;
        p[n++] = r.pipeline_gbps;
        if (last)
            keep = r;
        else if (o->keep_loads)
            held[n_held++] = r.d;
    }
    for (int i = 0; i < n_held; i++)
        wb__model_data_free(&held[i], be);
    if (n == o->runs) {
        v->ok = 1;
        v->gbps = median(g, n);
        v->pipeline = median(p, n);
        json_object_set_new(e, "gbps", json_real(v->gbps));
        json_object_set_new(e, "pipeline_gbps", json_real(v->pipeline));
        json_object_set_new(e, "samples", samples_json(g, n));
        json_object_set_new(e, "stages", stages_json(&keep.d));
        json_object_set_new(e, "verify", verify(&keep.d, ref, &v->bad));
        wb__model_data_free(&keep.d, be);
    }
    wb__backend_cuda_free(&be);
    printf("%-14s %7.2f GB/s (pipeline %6.2f)  verify: %s  [%s] %s\n", v->name, v->gbps,
           v->pipeline,
           !v->ok   ? "NOT RUN"
           : v->bad ? "MISMATCH"
                    : "ok",
           pages, flags);
    return e;
}

/* Cold cache, on its own smaller file: the disk's raw bandwidth, then the
 * loader. */
static void cold_figures(const opts *o, const loader_cfg *cfg, json_t *cold)
{
    char cold_path[4096];
    snprintf(cold_path, sizeof cold_path, "%s.cold", o->file);
    make_checkpoint(cold_path, (uint64_t)(o->cold_gib * (double)GIB));
    struct stat st;
    stat(cold_path, &st);
    json_object_set_new(cold, "file_bytes", json_integer((json_int_t)st.st_size));
    drop_cache(cold_path);
    double res = resident_fraction(cold_path);
    json_object_set_new(cold, "resident_after_drop", json_real(res));
    printf("cold: %.1f%% of %s resident after POSIX_FADV_DONTNEED\n", res * 100, cold_path);
    if (res >= 0.05) {
        json_object_set_new(cold, "possible", json_false());
        unlink(cold_path);
        return;
    }
    double direct = read_file(cold_path, 16, 8 * MIB, 1);
    drop_cache(cold_path);
    double buffered = read_file(cold_path, 16, 8 * MIB, 0);
    drop_cache(cold_path);
    double res2 = resident_fraction(cold_path);
    wb_backend *be = start_backend(o->device, cfg, NULL, 0);
    load_result r = {.rc = WB_EIO};
    if (be)
        r = load_once(be, cold_path, o->device, 0);
    wb__backend_cuda_free(&be);
    /* The same cold load with pread and with mmap-nt. */
    static const int reads[] = {WB_STAGE_READ_PREAD, WB_STAGE_READ_MMAP_NT};
    static const char *const keys[] = {"wbrokerd_pread_gbps", "wbrokerd_mmap_nt_gbps"};
    double raw = direct > buffered ? direct : buffered;
    for (size_t i = 0; i < 2; i++) {
        loader_cfg pc = *cfg;
        pc.read = reads[i];
        drop_cache(cold_path);
        wb_backend *bp = start_backend(o->device, &pc, NULL, 0);
        load_result rp = {.rc = WB_EIO};
        if (bp)
            rp = load_once(bp, cold_path, o->device, 0);
        wb__backend_cuda_free(&bp);
        if (rp.rc == WB_OK) {
            json_object_set_new(cold, keys[i], json_real(rp.gbps));
            printf("cold: wbrokerd with %s %.2f GB/s = %.2f x raw\n", wb__stage_read_name(reads[i]),
                   rp.gbps, raw > 0 ? rp.gbps / raw : 0);
        }
    }
    json_object_set_new(cold, "possible", json_true());
    json_object_set_new(cold, "raw_odirect_16threads_gbps", json_real(direct));
    json_object_set_new(cold, "raw_buffered_16threads_gbps", json_real(buffered));
    json_object_set_new(cold, "resident_before_load", json_real(res2));
    if (r.rc == WB_OK) {
        json_object_set_new(cold, "read_source_used",
                            json_string(wb__stage_read_name(r.read_source)));
        json_object_set_new(cold, "wbrokerd_gbps", json_real(r.gbps));
        json_object_set_new(cold, "wbrokerd_pipeline_gbps", json_real(r.pipeline_gbps));
        json_object_set_new(cold, "wbrokerd_over_raw", json_real(raw > 0 ? r.gbps / raw : 0));
    }
    printf("cold: raw O_DIRECT %.2f GB/s, raw buffered %.2f GB/s, wbrokerd %.2f GB/s "
           "(pipeline %.2f)\n",
           direct, buffered, r.gbps, r.pipeline_gbps);
    unlink(cold_path);
}

/* Reader threads x read block for one read source (two loads each);
 * returns the fastest configuration. */
static loader_cfg sweep_figures(const opts *o, int read, json_t *sw)
{
    static const unsigned threads[] = {8, 10, 12, 14};
    static const unsigned blocks[] = {256, 1024};
    loader_cfg best = {.mode = WB_STAGE_STAGED, .read = read};
    double best_gbps = 0;
    for (size_t a = 0; a < sizeof threads / sizeof threads[0]; a++)
        for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
            loader_cfg lc = {.mode = WB_STAGE_STAGED,
                             .threads = threads[a],
                             .block = blocks[b] * 1024,
                             .read = read};
            wb_backend *be = start_backend(o->device, &lc, NULL, 0);
            double g[2] = {0, 0};
            for (int i = 0; be && i < 2; i++) {
                load_result r = load_once(be, o->file, o->device, 0);
                g[i] = r.rc == WB_OK ? r.gbps : 0;
            }
            wb__backend_cuda_free(&be);
            double mean = (g[0] + g[1]) / 2;
            json_t *e = cfg_json(&lc);
            json_object_set_new(e, "gbps", json_real(mean));
            json_array_append_new(sw, e);
            printf("sweep %-7s: threads %2u read block %4u KiB: %.2f GB/s\n",
                   wb__stage_read_name(read), threads[a], blocks[b], mean);
            if (mean > best_gbps) {
                best_gbps = mean;
                best = lc;
            }
        }
    return best;
}

static int wanted(const opts *o, const char *name)
{
    if (!o->only)
        return 1;
    size_t n = strlen(name);
    for (const char *p = o->only; (p = strstr(p, name)) != NULL; p += n) {
        if ((p == o->only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o = {
        .file = "/tmp/wb-bench/load.safetensors", .gib = 8, .runs = 3, .cold_gib = 2, .cycles = 5};
    o.cfg.mode = WB_STAGE_STAGED;
    parse(argc, argv, &o);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (o.write_only) {
        make_checkpoint(o.file, (uint64_t)(o.gib * (double)GIB));
        return 0;
    }
    int dev_count = 0;
    cuda_check(cudaGetDeviceCount(&dev_count), "cudaGetDeviceCount");
    cuda_check(cudaSetDevice(o.device), "cudaSetDevice");
    struct cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
    cuda_check(cudaFree(0), "cudaFree");

    make_checkpoint(o.file, (uint64_t)(o.gib * (double)GIB));
    json_t *root = json_object();
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_object_set_new(root, "date", json_string(date));
    json_object_set_new(root, "gpu", json_string(prop.name));
    json_object_set_new(root, "cpus", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    json_object_set_new(root, "nt_copy", json_string(wb__stage_ntcopy_kind()));
    json_object_set_new(root, "file", json_string(o.file));
    json_object_set_new(root, "runs", json_integer(o.runs));
    json_object_set_new(root, "keep_loads", json_boolean(o.keep_loads));
    json_object_set_new(root, "pause_ms", json_integer(o.pause_ms));
    json_t *gbps = json_object(), *samples = json_object();
    json_object_set_new(root, "gbps", gbps);
    json_object_set_new(root, "samples", samples);

    /* Warm: the whole file in the page cache. */
    double cache_read = read_file(o.file, 16, 8 * MIB, 0);
    double cache_read2 = read_file(o.file, 16, 8 * MIB, 0);
    double res = resident_fraction(o.file);
    json_object_set_new(root, "resident_fraction", json_real(res));
    json_object_set_new(gbps, "page_cache_read_16threads", json_real(cache_read2));
    printf("warm: %.1f%% resident; page cache read with 16 threads %.2f GB/s (first pass %.2f)\n",
           res * 100, cache_read2, cache_read);

    mapped_file mf = {0};
    map_file(o.file, &mf);
    json_object_set_new(root, "bytes", json_integer((json_int_t)mf.bytes));
    json_object_set_new(root, "tensors", json_integer((json_int_t)mf.t->n_tensors));

    /* The reference every variant is verified against. */
    reference ref = {.t = mf.t, .map = mf.map, .len = mf.len, .pin_len = (size_t)(256 * MIB)};
    ref.xxh3 = malloc((mf.t->n_tensors ? mf.t->n_tensors : 1) * sizeof *ref.xxh3);
    for (size_t i = 0; i < mf.t->n_tensors; i++)
        ref.xxh3[i] = XXH3_64bits(mf.map + mf.t->tensors[i].offset, mf.t->tensors[i].nbytes);
    cuda_check(cudaHostAlloc((void **)&ref.pin, ref.pin_len, 0), "cudaHostAlloc");

    if (o.reuse) {
        reuse_opts ro = {
            .file = o.file, .out = o.out, .device = o.device, .cycles = o.cycles, .cfg = o.cfg};
        int rc = reuse_study(&ro, &ref, root);
        save(root, o.out);
        json_decref(root);
        cudaFreeHost(ref.pin);
        free(ref.xxh3);
        munmap(mf.map, mf.len);
        wb__st_table_free(&mf.t);
        return rc;
    }

    /* (d): reader threads x read block, for pread and mmap-nt. */
    loader_cfg tuned_pread = {
        .mode = WB_STAGE_STAGED, .threads = 14, .block = 1024 * 1024, .read = WB_STAGE_READ_PREAD};
    loader_cfg tuned_nt = tuned_pread;
    tuned_nt.read = WB_STAGE_READ_MMAP_NT;
    if (o.sweep) {
        json_t *sw = json_array();
        tuned_pread = sweep_figures(&o, WB_STAGE_READ_PREAD, sw);
        tuned_nt = sweep_figures(&o, WB_STAGE_READ_MMAP_NT, sw);
        json_object_set_new(root, "sweep", sw);
        save(root, o.out);
    }
    loader_cfg all = tuned_nt;
    all.pages = WB_STAGE_PAGES_HUGE;
    loader_cfg def = o.cfg; /* the compiled-in defaults, unless --threads etc. */

    variant vs[] = {
        {"default", "wbrokerd's configuration as compiled (what it runs without options)", def},
        {"pread",
         "pread into the pinned ring (the loader before the read sources)",
         {.mode = WB_STAGE_STAGED, .read = WB_STAGE_READ_PREAD, .pages = WB_STAGE_PAGES_NORMAL}},
        {"mmap",
         "(a) without streaming stores: memcpy from a populated mapping",
         {.mode = WB_STAGE_STAGED, .read = WB_STAGE_READ_MMAP, .pages = WB_STAGE_PAGES_NORMAL}},
        {"mmap-nt",
         "(a)+(b) non-temporal copy from a populated mapping, XXH3 from the source block",
         {.mode = WB_STAGE_STAGED, .read = WB_STAGE_READ_MMAP_NT, .pages = WB_STAGE_PAGES_NORMAL}},
        {"huge",
         "(c) pread into a ring in 2 MiB pages (cudaHostRegister)",
         {.mode = WB_STAGE_STAGED, .read = WB_STAGE_READ_PREAD, .pages = WB_STAGE_PAGES_HUGE}},
        {"tuned-pread", "(d) pread, threads and read block from the sweep", tuned_pread},
        {"tuned-mmap-nt", "(d) mmap-nt, threads and read block from the sweep", tuned_nt},
        {"all", "(a)+(b)+(c)+(d): mmap-nt, huge ring, tuned", all},
        {"mapped",
         "cudaHostRegister of each whole file mapping, then copies from it",
         {.mode = WB_STAGE_MAPPED}},
        {"mapped-reg1",
         "(e) registered in 64 MiB pieces on 1 thread while copying",
         {.mode = WB_STAGE_MAPPED, .reg_threads = 1}},
        {"mapped-reg4",
         "(e) registered in 64 MiB pieces on 4 threads while copying",
         {.mode = WB_STAGE_MAPPED, .reg_threads = 4}},
        {"mapped-reg8",
         "(e) registered in 64 MiB pieces on 8 threads while copying",
         {.mode = WB_STAGE_MAPPED, .reg_threads = 8}},
    };
    size_t nv = sizeof vs / sizeof vs[0];
    json_t *vj = json_array();
    json_object_set_new(root, "variants", vj);
    uint64_t bad = 0;
    printf("%-14s %7s\n", "variant", "median");
    for (size_t i = 0; i < nv; i++) {
        if (i > 0 && !wanted(&o, vs[i].name))
            continue;
        json_array_append_new(vj, run_variant(&o, &vs[i], &ref));
        bad += vs[i].bad;
        if (vs[i].ok) {
            char key[64];
            snprintf(key, sizeof key, "wbrokerd_%s", vs[i].name);
            json_object_set_new(gbps, key, json_real(vs[i].gbps));
        }
        save(root, o.out);
    }
    if (!vs[0].ok)
        die("the default variant", "failed (see above)");
    json_object_set_new(gbps, "wbrokerd", json_real(vs[0].gbps));
    json_object_set_new(gbps, "wbrokerd_pipeline", json_real(vs[0].pipeline));
    json_object_set_new(root, "config", cfg_json(&vs[0].cfg));
    cudaFreeHost(ref.pin);
    free(ref.xxh3);

    /* Baselines. */
    double v[32];
    uint8_t *slab = NULL;
    cuda_check(cudaMalloc((void **)&slab, mf.slab), "cudaMalloc");
    for (int i = 0; i < o.runs; i++)
        v[i] = pageable_sync(&mf, slab);
    double pageable = median(v, o.runs);
    json_object_set_new(gbps, "pageable_sync", json_real(pageable));
    json_object_set_new(samples, "pageable_sync", samples_json(v, o.runs));
    printf("pageable_sync: median %.2f GB/s\n", pageable);

    uint8_t *pin[2];
    cudaStream_t s;
    cudaEvent_t ev[2];
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int i = 0; i < 2; i++) {
        cuda_check(cudaHostAlloc((void **)&pin[i], 64 * MIB, 0), "cudaHostAlloc");
        cuda_check(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming), "cudaEventCreate");
    }
    for (int i = 0; i < o.runs; i++)
        v[i] = pinned_pingpong(&mf, slab, pin, s, ev);
    double pp = median(v, o.runs);
    json_object_set_new(gbps, "pinned_pingpong_1thread", json_real(pp));
    json_object_set_new(samples, "pinned_pingpong_1thread", samples_json(v, o.runs));
    printf("pinned_pingpong_1thread: median %.2f GB/s\n", pp);
    for (int i = 0; i < 2; i++) {
        cudaFreeHost(pin[i]);
        cudaEventDestroy(ev[i]);
    }

    uint64_t peak_n = 4 * GIB < mf.slab ? 4 * GIB : mf.slab;
    uint8_t *big;
    cuda_check(cudaHostAlloc((void **)&big, peak_n, 0), "cudaHostAlloc");
    memset(big, 1, peak_n);
    for (int i = 0; i < o.runs; i++)
        v[i] = pinned_peak(big, slab, peak_n, s);
    cudaFreeHost(big);
    double peak = median(v, o.runs);
    json_object_set_new(gbps, "pinned_peak", json_real(peak));
    json_object_set_new(samples, "pinned_peak", samples_json(v, o.runs));
    json_object_set_new(root, "pinned_peak_bytes", json_integer((json_int_t)peak_n));
    printf("pinned_peak (%.0f GiB): median %.2f GB/s\n", (double)peak_n / GIB, peak);

    /* The copy stage alone, from a ring like the loader's, then with host
     * memory traffic from as many threads as the default variant reads
     * with (hog_gbps: what those threads copied meanwhile). */
    wb_stage_config rc = stage_cfg_filled(&vs[0].cfg);
    uint8_t *ring;
    cuda_check(cudaHostAlloc((void **)&ring, rc.chunk_bytes * rc.buffers, 0), "cudaHostAlloc");
    memset(ring, 2, rc.chunk_bytes * rc.buffers);
    double hog_gbps[32] = {0};
    for (int i = 0; i < o.runs; i++)
        v[i] = ring_copies(ring, rc.buffers, rc.chunk_bytes, slab, peak_n, s, 0, NULL);
    double ring_alone = median(v, o.runs);
    json_object_set_new(gbps, "ring_copies", json_real(ring_alone));
    json_object_set_new(samples, "ring_copies", samples_json(v, o.runs));
    for (int i = 0; i < o.runs; i++)
        v[i] = ring_copies(ring, rc.buffers, rc.chunk_bytes, slab, peak_n, s, (int)rc.read_threads,
                           &hog_gbps[i]);
    double ring_hogged = median(v, o.runs);
    json_object_set_new(gbps, "ring_copies_with_host_traffic", json_real(ring_hogged));
    json_object_set_new(samples, "ring_copies_with_host_traffic", samples_json(v, o.runs));
    json_object_set_new(gbps, "host_traffic_memcpy", json_real(median(hog_gbps, o.runs)));
    json_object_set_new(root, "ring_copies_config",
                        json_pack("{s:I, s:I, s:I}", "chunk_bytes", (json_int_t)rc.chunk_bytes,
                                  "buffers", (json_int_t)rc.buffers, "host_traffic_threads",
                                  (json_int_t)rc.read_threads));
    printf("ring_copies (%llu MiB x %u): median %.2f GB/s alone, %.2f GB/s with %u threads "
           "copying host memory (%.1f GB/s of memcpy)\n",
           (unsigned long long)(rc.chunk_bytes / MIB), rc.buffers, ring_alone, ring_hogged,
           rc.read_threads, median(hog_gbps, o.runs));
    if (o.ring_sweep) {
        json_object_set_new(
            root, "ring_sweep",
            ring_sweep(o.runs, ring, rc.buffers, rc.chunk_bytes, slab, peak_n, peak));
        save(root, o.out);
    }
    cudaFreeHost(ring);
    cudaStreamDestroy(s);
    cudaFree(slab);

    double wb = vs[0].gbps;
    json_t *ratios = json_object(), *per = json_object();
    json_object_set_new(ratios, "wbrokerd_over_pinned_peak", json_real(wb / peak));
    json_object_set_new(ratios, "wbrokerd_over_pageable", json_real(wb / pageable));
    json_object_set_new(ratios, "wbrokerd_over_pingpong", json_real(wb / pp));
    json_object_set_new(ratios, "wbrokerd_over_page_cache_read", json_real(wb / cache_read2));
    int best = 0;
    for (size_t i = 0; i < nv; i++) {
        if (!vs[i].ok)
            continue;
        json_object_set_new(per, vs[i].name, json_real(vs[i].gbps / peak));
        if (vs[i].gbps > vs[best].gbps)
            best = (int)i;
    }
    json_object_set_new(ratios, "variant_over_pinned_peak", per);
    json_object_set_new(root, "ratios", ratios);
    char flags[256];
    cfg_flags(&vs[best].cfg, flags, sizeof flags);
    json_t *bj = json_object();
    json_object_set_new(bj, "name", json_string(vs[best].name));
    json_object_set_new(bj, "gbps", json_real(vs[best].gbps));
    json_object_set_new(bj, "over_pinned_peak", json_real(vs[best].gbps / peak));
    json_object_set_new(bj, "wbrokerd_options", json_string(flags));
    json_object_set_new(root, "best_variant", bj);
    printf("ratios: wbrokerd (default)/pinned_peak %.3f, /pageable %.2f, /pingpong %.2f\n",
           wb / peak, wb / pageable, wb / pp);
    printf("best variant: %s %.2f GB/s = %.3f of the pinned peak (%s)\n", vs[best].name,
           vs[best].gbps, vs[best].gbps / peak, flags);
    save(root, o.out);

    if (o.cold) {
        json_t *cold = json_object();
        cold_figures(&o, &vs[0].cfg, cold);
        json_object_set_new(root, "cold", cold);
        save(root, o.out);
    }
    json_decref(root);
    munmap(mf.map, mf.len);
    wb__st_table_free(&mf.t);
    return bad ? 1 : 0;
}
