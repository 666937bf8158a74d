/* Host backend load against the cheapest ways to fill fresh shared memory.
 *
 *   wb_bench_hostload make FILE GIB      writes a safetensors checkpoint
 *   wb_bench_hostload run FILE [--reps N] [--json OUT]
 *
 * `run` warms the page cache with the file, then times, REPS times each in
 * round robin (so that noise from other work spreads over every method):
 * the broker's own host load (wb__load with the host backend: the code
 * wbrokerd runs, checksums included), and baselines that copy the same
 * bytes from the page cache with two reader threads claiming 4 MiB chunks:
 * into a reused buffer (no fresh memory at all), and into a fresh shared
 * memory object made in several ways. It prints the medians and writes
 * them as JSON. CPU only; not a test. */

#include "backend.h"
#include "loader.h"
#include "models.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define CHUNK (4u << 20)
#define BLOCK (256u << 10)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- making the checkpoint ---- */

/* Tensor sizes cycle through these (odd ones leave gaps in the slab). */
static const uint64_t SIZES[] = {64ull << 20, 16ull << 20, (4ull << 20) + 12345, 100000, 37 << 20};

static int make(const char *path, double gib)
{
    uint64_t total = (uint64_t)(gib * (double)(1ull << 30));
    size_t cap = 1 << 20, len = 0, n = 0;
    char *hdr = malloc(cap);
    uint64_t off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    while (off < total) {
        uint64_t sz = SIZES[n % (sizeof SIZES / sizeof SIZES[0])];
        if (sz > total - off)
            sz = total - off;
        len += (size_t)snprintf(hdr + len, cap - len,
                                "%s\"t%zu\":{\"dtype\":\"U8\",\"shape\":[%llu],"
                                "\"data_offsets\":[%llu,%llu]}",
                                n ? "," : "", n, (unsigned long long)sz, (unsigned long long)off,
                                (unsigned long long)(off + sz));
        off += sz;
        n++;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8)
        hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    uint64_t *buf = malloc(CHUNK);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t done = 0; done < total;) {
        for (size_t i = 0; i < CHUNK / 8; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = x;
        }
        size_t w = total - done < CHUNK ? (size_t)(total - done) : CHUNK;
        if (fwrite(buf, 1, w, f) != w) {
            perror(path);
            return 1;
        }
        done += w;
    }
    free(buf);
    free(hdr);
    if (fclose(f) != 0) {
        perror(path);
        return 1;
    }
    printf("wrote %s: %zu tensors, %llu bytes\n", path, n, (unsigned long long)total);
    return 0;
}

/* ---- the baselines ---- */

enum dest {
    D_BUF,      /* a reused per-thread buffer */
    D_BUF_HASH, /* the same, XXH3 of each block as the loader does */
    D_FALLOC,   /* posix_fallocate of the whole object, then pread into the mapping */
    D_POPULATE, /* mmap(MAP_POPULATE), then pread */
    D_FAULT,    /* no reservation: pread into the mapping faults the pages in */
    D_MADV_POP, /* each reader: MADV_POPULATE_WRITE of its chunk, then pread */
    D_FALLOC_R, /* each reader: fallocate of its chunk, then pread */
    D_THP,      /* MADV_HUGEPAGE on the mapping, each reader populates its chunk */
    D_PWRITE,   /* pread into a 256 KiB buffer, pwrite into the object: no zeroing */
    D_HUGETLB,  /* memfd_create(MFD_HUGETLB), MAP_POPULATE, then pread */
    D_MADV_BLK, /* each reader: per 256 KiB block, MADV_POPULATE_WRITE then pread */
};

typedef struct run {
    int dest;
    int file;
    uint64_t base; /* data start in the file */
    uint64_t bytes;
    int shm;
    uint8_t *map;
    atomic_uint_fast64_t next;
    atomic_int err;
    char msg[256];
    uint64_t sink;
} run;

static void fail(run *r, const char *what, int e)
{
    int z = 0;
    if (atomic_compare_exchange_strong(&r->err, &z, e ? e : -1))
        snprintf(r->msg, sizeof r->msg, "%s: %s", what, strerror(e));
}

static int pread_all(int fd, uint8_t *p, uint64_t len, uint64_t off)
{
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return n < 0 ? errno : EIO;
        }
        p += n, len -= (uint64_t)n, off += (uint64_t)n;
    }
    return 0;
}

static void *worker(void *arg)
{
    run *r = arg;
    uint8_t *buf = NULL;
    if (r->dest == D_BUF || r->dest == D_BUF_HASH || r->dest == D_PWRITE)
        buf = aligned_alloc(4096, CHUNK);
    uint64_t sink = 0;
    for (;;) {
        uint64_t k = atomic_fetch_add(&r->next, 1), off = k * CHUNK;
        if (off >= r->bytes || atomic_load(&r->err))
            break;
        uint64_t len = r->bytes - off < CHUNK ? r->bytes - off : CHUNK;
        uint8_t *dst = r->map ? r->map + off : buf;
        int e = 0;
        switch (r->dest) {
        case D_MADV_POP:
        case D_THP:
            if (madvise(dst, len, MADV_POPULATE_WRITE) != 0)
                fail(r, "madvise(MADV_POPULATE_WRITE)", errno);
            break;
        case D_FALLOC_R:
            if ((e = posix_fallocate(r->shm, (off_t)off, (off_t)len)) != 0)
                fail(r, "posix_fallocate of a chunk", e);
            break;
        default:
            break;
        }
        if (r->dest == D_MADV_BLK) {
            for (uint64_t d = 0; d < len; d += BLOCK) {
                uint64_t n = len - d < BLOCK ? len - d : BLOCK;
                if (madvise(dst + d, n, MADV_POPULATE_WRITE) != 0) {
                    fail(r, "madvise(MADV_POPULATE_WRITE)", errno);
                    break;
                }
                if ((e = pread_all(r->file, dst + d, n, r->base + off + d)) != 0) {
                    fail(r, "pread", e);
                    break;
                }
            }
        } else if (r->dest == D_PWRITE || r->dest == D_BUF_HASH) {
            for (uint64_t d = 0; d < len; d += BLOCK) {
                uint64_t n = len - d < BLOCK ? len - d : BLOCK;
                if ((e = pread_all(r->file, buf, n, r->base + off + d)) != 0) {
                    fail(r, "pread", e);
                    break;
                }
                sink ^= XXH3_64bits(buf, n);
                if (r->dest == D_PWRITE && pwrite(r->shm, buf, n, (off_t)(off + d)) != (ssize_t)n) {
                    fail(r, "pwrite", errno);
                    break;
                }
            }
        } else if ((e = pread_all(r->file, dst, len, r->base + off)) != 0) {
            fail(r, "pread", e);
        }
    }
    r->sink ^= sink;
    free(buf);
    return NULL;
}

/* One timed fill; returns seconds or a negative number (r->msg says why). */
static double fill(run *r, unsigned threads)
{
    atomic_store(&r->next, 0);
    atomic_store(&r->err, 0);
    r->map = NULL;
    r->shm = -1;
    char name[64];
    snprintf(name, sizeof name, "/wb-bench-hostload-%ld", (long)getpid());
    double t0 = now();
    if (r->dest != D_BUF && r->dest != D_BUF_HASH) {
        if (r->dest == D_HUGETLB)
            r->shm = memfd_create("wb-bench", MFD_HUGETLB);
        else
            r->shm = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (r->shm < 0) {
            fail(r, r->dest == D_HUGETLB ? "memfd_create(MFD_HUGETLB)" : "shm_open", errno);
            return -1;
        }
        if (r->dest != D_HUGETLB)
            shm_unlink(name);
        uint64_t sz = (r->bytes + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
        if (ftruncate(r->shm, (off_t)sz) != 0) {
            fail(r, "ftruncate", errno);
            close(r->shm);
            return -1;
        }
        int e;
        if (r->dest == D_FALLOC && (e = posix_fallocate(r->shm, 0, (off_t)sz)) != 0) {
            fail(r, "posix_fallocate", e);
            close(r->shm);
            return -1;
        }
        int flags = MAP_SHARED | (r->dest == D_POPULATE || r->dest == D_HUGETLB ? MAP_POPULATE : 0);
        void *m = mmap(NULL, sz, PROT_READ | PROT_WRITE, flags, r->shm, 0);
        if (m == MAP_FAILED) {
            fail(r, "mmap", errno);
            close(r->shm);
            return -1;
        }
        r->map = m;
        if (r->dest == D_THP && madvise(m, sz, MADV_HUGEPAGE) != 0)
            fail(r, "madvise(MADV_HUGEPAGE)", errno);
    }
    pthread_t t[8];
    for (unsigned i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, r);
    for (unsigned i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    double s = now() - t0;
    if (r->map)
        munmap(r->map, (r->bytes + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1));
    if (r->shm >= 0)
        close(r->shm);
    return atomic_load(&r->err) ? -1 : s;
}

/* ---- the driver ---- */

/* The host backend as it was before slabs were populated by the readers:
 * the whole slab reserved (posix_fallocate) when it is created, then read
 * into through page faults. Kept here to measure both in one run. */
static int reserved_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    (void)device;
    memset(slab, 0, sizeof *slab);
    int rc = wb__shm_create(&slab->shm, size, err);
    if (rc != WB_OK)
        return rc;
    slab->size = slab->shm.size;
    slab->device = -1;
    return WB_OK;
}

typedef struct method {
    const char *key, *what;
    int dest; /* -1: the broker's loader, -2: the same with the whole slab reserved first */
    unsigned threads;
    double secs[64];
    int n;
    char error[1100];
} method;

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(method *m)
{
    double v[64];
    memcpy(v, m->secs, sizeof v);
    qsort(v, (size_t)m->n, sizeof v[0], cmp);
    return m->n ? (m->n % 2 ? v[m->n / 2] : (v[m->n / 2 - 1] + v[m->n / 2]) / 2) : 0;
}

static double fastest(const method *m)
{
    double v = m->secs[0];
    for (int i = 1; i < m->n; i++)
        v = m->secs[i] < v ? m->secs[i] : v;
    return v;
}

static void read_line(const char *path, char *out, size_t n)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(out, (int)n, f))
            out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
}

static int bench(const char *path, int reps, const char *json)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    uint64_t hl;
    struct stat st;
    if (pread(fd, &hl, 8, 0) != 8 || fstat(fd, &st) != 0) {
        fprintf(stderr, "%s: not a safetensors file\n", path);
        return 1;
    }
    run r = {.file = fd, .base = 8 + hl, .bytes = (uint64_t)st.st_size - 8 - hl};
    /* Warm the page cache (twice the file's bytes are needed in memory:
     * the cache and one slab). */
    double tw = now();
    r.dest = D_BUF;
    fill(&r, 2);
    printf("file %s: %.2f GiB of tensors, warmed in %.2f s\n", path, (double)r.bytes / (1ull << 30),
           now() - tw);

    method ms[] = {
        {"wbrokerd_host", "wbrokerd host load (wb__load, host backend, checksums)", -1, 0},
        {"wbrokerd_host_reserved",
         "the same, slab reserved whole by posix_fallocate first (the former host backend)", -2, 0},
        {"wbrokerd_host_mmap", "wbrokerd host load, --read-source mmap (memcpy from a mapping)", -3,
         0},
        {"wbrokerd_host_mmap_nt",
         "wbrokerd host load, --read-source mmap-nt (non-temporal copy from a mapping)", -4, 0},
        {"pread_buf_1t", "pread into a reused buffer, 1 thread", D_BUF, 1},
        {"pread_buf_2t", "pread into a reused buffer, 2 threads", D_BUF, 2},
        {"pread_buf_hash_2t", "pread into a reused 256 KiB buffer + XXH3, 2 threads", D_BUF_HASH,
         2},
        {"shm_fallocate", "shm: posix_fallocate whole, then pread into the mapping", D_FALLOC, 2},
        {"shm_map_populate", "shm: mmap(MAP_POPULATE), then pread", D_POPULATE, 2},
        {"shm_fault", "shm: no reservation, pread faults pages in", D_FAULT, 2},
        {"shm_madv_populate_per_reader", "shm: each reader MADV_POPULATE_WRITE its chunk, pread",
         D_MADV_POP, 2},
        {"shm_madv_populate_per_block",
         "shm: each reader MADV_POPULATE_WRITE then pread, per 256 KiB block", D_MADV_BLK, 2},
        {"shm_fallocate_per_reader", "shm: each reader fallocates its chunk, pread", D_FALLOC_R, 2},
        {"shm_thp_per_reader", "shm: MADV_HUGEPAGE + per-reader populate, pread", D_THP, 2},
        {"shm_pwrite", "shm: pread to a 256 KiB buffer + XXH3, pwrite into the object", D_PWRITE,
         2},
        {"memfd_hugetlb", "memfd MFD_HUGETLB, MAP_POPULATE, pread", D_HUGETLB, 2},
    };
    size_t nm = sizeof ms / sizeof ms[0];
    if (reps > 64)
        reps = 64;
    for (int rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < nm; i++) {
            method *m = &ms[i];
            if (m->error[0])
                continue;
            double s;
            if (m->dest < 0) {
                wb_backend reserved = wb__backend_host;
                reserved.slab_alloc = reserved_alloc;
                reserved.slab_prepare = NULL;
                wb_backend mapped = wb__backend_host;
                mapped.stage.read_source =
                    m->dest == -3 ? WB_STAGE_READ_MMAP : WB_STAGE_READ_MMAP_NT;
                const wb_backend *be = m->dest == -1   ? &wb__backend_host
                                       : m->dest == -2 ? &reserved
                                                       : &mapped;
                wb_model_data d;
                wb_err err;
                double t0 = now();
                int rc = wb__load(path, be, -1, NULL, &d, &err);
                s = now() - t0;
                if (rc != WB_OK) {
                    snprintf(m->error, sizeof m->error, "%s", err.msg);
                    continue;
                }
                m->threads = d.read_threads;
                printf("  %s: %.3f s: open %.3f, slab %.3f, read+hash %.3f (read busy "
                       "%.3f, hash busy %.3f summed over %u threads)\n",
                       m->key, s, d.open_seconds, d.alloc_seconds, d.read_seconds,
                       d.stage.read_busy, d.stage.hash_busy, d.read_threads);
                wb__model_data_free(&d, be);
            } else {
                r.dest = m->dest;
                s = fill(&r, m->threads);
                if (s < 0) {
                    snprintf(m->error, sizeof m->error, "%s", r.msg);
                    continue;
                }
            }
            m->secs[m->n++] = s;
        }
    }

    char thp[256], hp[64];
    read_line("/sys/kernel/mm/transparent_hugepage/shmem_enabled", thp, sizeof thp);
    read_line("/proc/sys/vm/nr_hugepages", hp, sizeof hp);
    double best = 0;
    const char *best_key = "";
    for (size_t i = 0; i < nm; i++) {
        if (ms[i].dest >= 0 && ms[i].dest != D_BUF && ms[i].dest != D_BUF_HASH && ms[i].n) {
            double g = (double)r.bytes / median(&ms[i]) / 1e9;
            if (g > best)
                best = g, best_key = ms[i].key;
        }
    }
    double broker = ms[0].n ? (double)r.bytes / median(&ms[0]) / 1e9 : 0;
    double before = ms[1].n ? (double)r.bytes / median(&ms[1]) / 1e9 : 0;
    printf("shmem_enabled: %s; nr_hugepages: %s; %d reps, medians\n", thp, hp, reps);
    printf("%-30s %3s %8s %8s %8s  %s\n", "method", "thr", "GB/s", "/best", "fastest", "what");
    for (size_t i = 0; i < nm; i++) {
        method *m = &ms[i];
        if (!m->n) {
            printf("%-30s %3u %8s %8s %8s  %s: FAILED: %s\n", m->key, m->threads, "-", "-", "-",
                   m->what, m->error);
            continue;
        }
        double g = (double)r.bytes / median(m) / 1e9;
        printf("%-30s %3u %8.2f %8.2f %8.2f  %s\n", m->key, m->threads, g, g / best,
               (double)r.bytes / fastest(m) / 1e9, m->what);
    }
    printf("cheapest fresh shared memory fill: %s %.2f GB/s; wbrokerd host load %.2f GB/s = "
           "%.2fx slower (target <= 2); with the slab reserved first %.2f GB/s = %.2fx slower\n",
           best_key, best, broker, broker > 0 ? best / broker : 0, before,
           before > 0 ? best / before : 0);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\n  \"bytes\": %llu,\n  \"reps\": %d,\n  \"shmem_enabled\": \"%s\",\n",
                (unsigned long long)r.bytes, reps, thp);
        fprintf(f, "  \"nr_hugepages\": \"%s\",\n  \"methods\": [\n", hp);
        for (size_t i = 0; i < nm; i++) {
            method *m = &ms[i];
            fprintf(f, "    {\"key\": \"%s\", \"what\": \"%s\", \"threads\": %u, ", m->key, m->what,
                    m->threads);
            if (!m->n) {
                fprintf(f, "\"error\": \"%s\"}%s\n", m->error, i + 1 < nm ? "," : "");
                continue;
            }
            fprintf(f, "\"seconds\": [");
            for (int k = 0; k < m->n; k++)
                fprintf(f, "%s%.4f", k ? ", " : "", m->secs[k]);
            fprintf(f, "], \"median_gbps\": %.3f, \"fastest_gbps\": %.3f}%s\n",
                    (double)r.bytes / median(m) / 1e9, (double)r.bytes / fastest(m) / 1e9,
                    i + 1 < nm ? "," : "");
        }
        fprintf(f, "  ],\n  \"cheapest_fresh_fill\": \"%s\",\n  \"cheapest_fresh_gbps\": %.3f,\n",
                best_key, best);
        fprintf(f, "  \"wbrokerd_host_gbps\": %.3f,\n  \"cheapest_over_wbrokerd\": %.3f,\n", broker,
                broker > 0 ? best / broker : 0);
        fprintf(f,
                "  \"wbrokerd_host_reserved_gbps\": %.3f,\n"
                "  \"cheapest_over_wbrokerd_reserved\": %.3f\n}\n",
                before, before > 0 ? best / before : 0);
        fclose(f);
    }
    close(fd);
    return (int)(r.sink & 0) | (ms[0].n ? 0 : 1);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 4 && strcmp(argv[1], "make") == 0)
        return make(argv[2], atof(argv[3]));
    if (argc >= 3 && strcmp(argv[1], "run") == 0) {
        int reps = 3;
        const char *json = NULL;
        for (int i = 3; i + 1 < argc; i += 2) {
            if (strcmp(argv[i], "--reps") == 0)
                reps = atoi(argv[i + 1]);
            else if (strcmp(argv[i], "--json") == 0)
                json = argv[i + 1];
        }
        return bench(argv[2], reps < 1 ? 1 : reps, json);
    }
    fprintf(stderr, "usage: %s make FILE GIB | run FILE [--reps N] [--json OUT]\n", argv[0]);
    return 2;
}
