/* Opening a checkpoint's headers with the memo of parsed headers off and on
 * (common/safetensors_memo.h), in one run: for each tensor count, a
 * checkpoint of that many small tensors with names as a transformer's, each
 * opened RUNS times both ways, alternating; prints one JSON line per count
 * with the medians and their ratio. COUNTxSHARDS writes the tensors as that
 * many shards and a model.safetensors.index.json, as transformers does
 * (291x2 is Llama-2-7B's layout, 723x15 Llama-2-70B's): the open reads the
 * index and every shard's header. CPU only; never a timed test.
 *
 *   wb_bench_headers DIR [RUNS] [COUNT[xSHARDS] ...]
 *                                     (defaults: 200; 64 256 512 2048) */
#include "clock.h"
#include "safetensors.h"
#include "safetensors_memo.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define TENSOR_NAME "model.layers.%d.mlp.proj_%d.weight"

/* A file of tensors first..first+n-1 of the checkpoint. */
static int write_file(const char *path, int first, int n)
{
    size_t cap = (size_t)n * 160 + 64, used = 0;
    char *json = malloc(cap);
    if (!json)
        return -1;
    used += (size_t)snprintf(json, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int k = 0; k < n; k++) {
        int i = first + k;
        used += (size_t)snprintf(json + used, cap - used,
                                 ",\"" TENSOR_NAME "\":{\"dtype\":\"BF16\","
                                 "\"shape\":[32,64],\"data_offsets\":[%d,%d]}",
                                 i / 8, i % 8, k * 4096, (k + 1) * 4096);
    }
    used += (size_t)snprintf(json + used, cap - used, "}");
    while (used % 8)
        json[used++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(json);
        return -1;
    }
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)used >> (8 * i));
    int ok = fwrite(len, 1, 8, f) == 8 && fwrite(json, 1, used, f) == used;
    static const char zero[4096];
    for (int i = 0; ok && i < n; i++)
        ok = fwrite(zero, 1, sizeof zero, f) == sizeof zero;
    free(json);
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* n tensors in `shards` files under dir/sharded_N, and their index; path
 * gets the index's. */
static int write_sharded(const char *dir, int n, int shards, char *path, size_t size)
{
    char sub[1024], file[1200];
    snprintf(sub, sizeof sub, "%s/sharded_%d", dir, n);
    if (mkdir(sub, 0755) != 0 && errno != EEXIST)
        return -1;
    size_t cap = (size_t)n * 96 + 128, used = 0;
    char *json = malloc(cap);
    if (!json)
        return -1;
    used +=
        (size_t)snprintf(json, cap, "{\"metadata\":{\"total_size\":%d},\"weight_map\":{", n * 4096);
    int per = (n + shards - 1) / shards, rc = 0;
    for (int s = 0, first = 0; s < shards && first < n && rc == 0; s++, first += per) {
        int count = n - first < per ? n - first : per;
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
        snprintf(file, sizeof file, "%s/%s", sub, name);
        rc = write_file(file, first, count);
        for (int i = first; i < first + count; i++)
            used += (size_t)snprintf(json + used, cap - used, "%s\"" TENSOR_NAME "\":\"%s\"",
                                     i ? "," : "", i / 8, i % 8, name);
    }
    used += (size_t)snprintf(json + used, cap - used, "}}");
    snprintf(path, size, "%s/model.safetensors.index.json", sub);
    FILE *f = rc == 0 ? fopen(path, "wb") : NULL;
    rc = f && fwrite(json, 1, used, f) == used ? 0 : -1;
    if (f && fclose(f) != 0)
        rc = -1;
    free(json);
    return rc;
}

static void remove_sharded(const char *dir, int n, int shards)
{
    char sub[1024], file[1200];
    snprintf(sub, sizeof sub, "%s/sharded_%d", dir, n);
    for (int s = 0; s < shards; s++) {
        snprintf(file, sizeof file, "%s/model-%05d-of-%05d.safetensors", sub, s + 1, shards);
        remove(file);
    }
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", sub);
    remove(file);
    remove(sub);
}

static double open_once(const char *path)
{
    wb_st_table *t = NULL;
    wb_err err;
    double t0 = wb__clock_mono_s();
    if (wb__st_open(path, &t, &err) != WB_OK) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        exit(1);
    }
    double d = wb__clock_mono_s() - t0;
    wb__st_table_free(&t);
    return d;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: wb_bench_headers DIR [RUNS] [COUNT ...]\n");
        return 2;
    }
    int runs = argc > 2 ? atoi(argv[2]) : 200;
    static const int defaults[] = {64, 256, 512, 2048};
    int n_counts = argc > 3 ? argc - 3 : 4;
    if (runs < 1) {
        fprintf(stderr, "wb_bench_headers: RUNS must be at least 1\n");
        return 2;
    }
    double *off = malloc((size_t)runs * sizeof *off), *on = malloc((size_t)runs * sizeof *on);
    if (!off || !on)
        return 1;
    for (int c = 0; c < n_counts; c++) {
        const char *arg = argc > 3 ? argv[3 + c] : NULL;
        int n = arg ? atoi(arg) : defaults[c];
        const char *x = arg ? strchr(arg, 'x') : NULL;
        int shards = x ? atoi(x + 1) : 0;
        char path[1200];
        snprintf(path, sizeof path, "%s/headers_%d.safetensors", argv[1], n);
        if (n < 1 || (x && shards < 1) ||
            (shards ? write_sharded(argv[1], n, shards, path, sizeof path)
                    : write_file(path, 0, n)) != 0) {
            fprintf(stderr, "wb_bench_headers: cannot write %s\n", path);
            return 1;
        }
        wb__st_memo_set_limit(WB_ST_MEMO_BROKER_BYTES);
        open_once(path); /* the memo holds it from here on */
        for (int r = 0; r < runs; r++) {
            wb__st_memo_set_limit(WB_ST_MEMO_BROKER_BYTES);
            on[r] = open_once(path);
            wb__st_memo_set_limit(0);
            off[r] = open_once(path);
            wb__st_memo_set_limit(WB_ST_MEMO_BROKER_BYTES);
            open_once(path); /* kept again for the next round */
        }
        wb__st_memo_set_limit(0);
        qsort(off, (size_t)runs, sizeof *off, cmp_double);
        qsort(on, (size_t)runs, sizeof *on, cmp_double);
        double mo = off[runs / 2], mn = on[runs / 2];
        printf("{\"tensors\": %d, \"shards\": %d, \"runs\": %d, \"parse_ms_median\": %.4f, "
               "\"memo_ms_median\": %.4f, \"memo_over_parse\": %.4f}\n",
               n, shards, runs, mo * 1e3, mn * 1e3, mn / mo);
        if (shards)
            remove_sharded(argv[1], n, shards);
        else
            remove(path);
    }
    free(off);
    free(on);
    return 0;
}
