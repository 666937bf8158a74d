/* What bench/load.c shares with the reuse study of bench/load_reuse.c
 * (wb_bench_load --reuse), linked into the same executable: the timing and
 * report functions, the broker's loader as the variants call it, and the
 * checkpoint's reference. */
#ifndef WB_BENCH_LOAD_H
#define WB_BENCH_LOAD_H

#include "backend.h"
#include "loader.h"
#include "safetensors.h"

#include <cuda_runtime_api.h>
#include <jansson.h>

#include <stddef.h>
#include <stdint.h>

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

double now_s(void);
void die(const char *what, const char *why);
void cuda_check(cudaError_t e, const char *what);
/* The median of v[0..n), v left as it is. */
double median(double *v, int n);
json_t *samples_json(const double *v, int n);

/* A loader configuration: zero fields are the broker's defaults. */
typedef struct loader_cfg {
    int mode;
    unsigned threads, buffers, block;
    uint64_t chunk;
    int read, pages;
    unsigned reg_threads;
    unsigned batch;
    int slab; /* WB_CUDA_SLAB_IPC (0, what the variants use) or WB_CUDA_SLAB_VMM */
} loader_cfg;

/* The cuda backend on `device` as wbrokerd starts it with c; NULL (with a
 * message) when it does not start. `pages` gets what the ring is made of. */
wb_backend *start_backend(int device, const loader_cfg *c, char *pages, size_t pages_len);
json_t *cfg_json(const loader_cfg *c);

typedef struct load_result {
    int rc;
    char error[WB_ERR_MSG_MAX];
    double gbps;          /* tensor bytes / whole load (headers, slab allocation, pipeline) */
    double pipeline_gbps; /* tensor bytes / pipeline */
    int read_source;      /* the one the readers used */
    wb_model_data d;      /* kept when asked */
} load_result;

/* One load with the broker's loader; the slab is freed unless `keep`. */
load_result load_once(const wb_backend *be, const char *path, int device, int keep);
/* The per-stage figures of a load. */
json_t *stages_json(const wb_model_data *d);

/* The file's tensors: a mapping to compare against and each one's XXH3-64,
 * computed once. */
typedef struct reference {
    wb_st_table *t;
    uint8_t *map;
    size_t len;
    uint64_t *xxh3;
    uint8_t *pin; /* pinned bounce buffer for copies back */
    size_t pin_len;
} reference;

/* wb_bench_load --reuse: the study of loads into memory the previous load
 * freed (load_reuse.c). Adds "reused_memory" to root, saving it to `out`
 * (may be NULL) as it goes. Returns 0 when every variant's destination
 * held what was copied there, 1 otherwise. */
typedef struct reuse_opts {
    const char *file, *out;
    int device, cycles;
    loader_cfg cfg; /* the loader's configuration (staged) */
} reuse_opts;

int reuse_study(const reuse_opts *o, const reference *ref, json_t *root);

void save(json_t *root, const char *out);

#endif
