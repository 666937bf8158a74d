/* The model registry: every model the broker has loaded, is loading, or is
 * draining, in the order they were added. */
#ifndef WB_BROKER_MODELS_H
#define WB_BROKER_MODELS_H

#include "backend.h"
#include "err.h"
#include "wb.pb-c.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_model_tensor {
    char *name;     /* owned */
    char dtype[16]; /* as spelled in safetensors */
    uint32_t ndim;
    uint64_t *shape; /* owned, ndim entries */
    uint32_t slab;
    uint64_t offset; /* in the slab, WB_SLAB_ALIGN-aligned */
    uint64_t nbytes;
    uint64_t xxh3;
} wb_model_tensor;

/* What a load produces. */
typedef struct wb_model_data {
    size_t n_tensors;
    wb_model_tensor *tensors; /* owned */
    uint32_t n_slabs;
    wb_slab *slabs;      /* owned; freed through the backend */
    uint64_t bytes;      /* sum of tensor bytes */
    uint64_t slab_bytes; /* sum of slab sizes */
    double load_seconds;
    double load_gbps;
    /* Where the load's time went: reading and validating the headers,
     * allocating the slab, reading and checksumming the tensors. */
    double open_seconds;
    double alloc_seconds;
    double read_seconds;
    unsigned read_threads;
    /* The pipeline's figures per stage (stage.h), and the time spent
     * registering file mappings (mapped loads). */
    wb_stage_stats stage;
    double register_seconds;
} wb_model_data;

/* Frees the slabs (through `be`) and the tensor table; zeroes *d. */
void wb__model_data_free(wb_model_data *d, const wb_backend *be);

typedef struct wb_model {
    char *name; /* owned */
    char *path; /* owned */
    int state;  /* WBPROTO__MODEL_STATE__* */
    const wb_backend *backend;
    int device; /* -1 for host */
    wb_model_data data;
    wb_load_progress progress; /* written by the loader while MODEL_LOADING */
    uint32_t leases;
    /* The wire view of the slabs and tensors, built once when the model
     * becomes ready; every acquire reply points at it. */
    Wbproto__Slab *wire_slabs;
    Wbproto__Slab **wire_slab_ptrs;
    Wbproto__Tensor *wire_tensors;
    Wbproto__Tensor **wire_tensor_ptrs;
    size_t wire_lease_size; /* packed size of a Lease on this model */
    /* A Lease on this model packed once, without its id: the fields from
     * `model` on (model, slabs, tensors). Every acquire reply carries these
     * bytes as they are instead of packing 10^5 tensors again. NULL when
     * memory was short (the reply is then packed field by field). */
    uint8_t *wire_lease_tail;
    size_t wire_lease_tail_len;
    /* The same with Lease.tensor_table (the compact table, common/wire.h)
     * in place of the tensors, for clients that ask for it. */
    uint8_t *wire_table_tail;
    size_t wire_table_tail_len;
    /* XXH3-128 of the compact table (canonical bytes), and a Lease tail
     * that carries only the slabs and tensor_table_cached: the reply to a
     * client that already holds this table. */
    uint8_t table_digest[16];
    uint8_t *wire_cached_tail;
    size_t wire_cached_tail_len;
    struct wb_model *next;
} wb_model;

/* A new model in state MODEL_LOADING, or NULL when out of memory. */
wb_model *wb__model_new(const char *name, const char *path, const wb_backend *be, int device);
/* Frees the model's memory and slabs (their names are unlinked); sets *m to
 * NULL. The model must not be in a registry. */
void wb__model_free(wb_model **m);

/* Takes the load's result (moving it out of *data), builds the wire view and
 * makes the model MODEL_READY. On failure (out of memory) nothing changes
 * and *data still owns everything. */
int wb__model_adopt(wb_model *m, wb_model_data *data, wb_err *err);

typedef struct wb_model_registry {
    wb_model *head;
    wb_model *tail;
    size_t n;
} wb_model_registry;

wb_model *wb__models_find(const wb_model_registry *r, const char *name);
void wb__models_add(wb_model_registry *r, wb_model *m);
/* Unlinks m from the registry; does not free it. */
void wb__models_remove(wb_model_registry *r, wb_model *m);
/* Removes and frees every model. */
void wb__models_clear(wb_model_registry *r);

/* 1 if a name is 1..255 characters of [A-Za-z0-9._-]. */
int wb__model_name_valid(const char *name);

#endif
