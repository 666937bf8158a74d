/* Internal to libwbclient: the state of a container and the functions the
 * AOTI binding's files share. aoti.c: the public container API and creation
 * order; aoti_abi.c: loading the model library and binding its C ABI, tensor
 * functions; aoti_bind.c: which tensor each constant binds to; aoti_create.c:
 * the creation strategies (external constants, user-managed update, own
 * constants). */
#ifndef WB_AOTI_IMPL_H
#define WB_AOTI_IMPL_H

#include "wb/container.h"

#include "aoti_abi.h"
#include "aoti_bind.h"
#include "clog.h"
#include "lease.h"

#include <stdint.h>

#define API_EXTERNAL "CreateWithExternalConstants"
#define API_DEVICE   "CreateWithDevice+UpdateUserManagedConstantBufferPairs"
#define API_OWN      "CreateWithDevice"
/* Folded constants above this share of the shared bytes earn a warning. */
#define FOLDED_WARN_RATIO 0.10
/* Without AOTInductorModelContainerDidCallLoadConstants, a CreateWithDevice
 * that allocated at least this share of the constants' bytes loaded its own
 * copy. Only judged for constants of at least EMBEDDED_MIN_BYTES: below that
 * other allocations (kernels, workspaces) could be mistaken for a copy, and
 * a small copy left in place costs little. */
#define EMBEDDED_RATIO     0.5
#define EMBEDDED_MIN_BYTES (16ull << 20)

/* Everything looked up in the model library. Required entries are checked
 * once after the lookup; optional ones may be NULL. */
typedef struct aoti_fns {
    aoti_create_with_device_fn create_with_device;
    aoti_create_with_external_constants_fn create_external; /* torch >= 2.14 */
    aoti_delete_fn del;
    aoti_run_fn run;
    aoti_get_count_fn num_constants;
    aoti_get_str_fn constant_name;
    aoti_get_str_fn constant_fqn;
    aoti_get_i32_fn constant_dtype;
    aoti_get_size_fn constant_size;
    aoti_get_bool_fn constant_from_folded; /* optional: none folded */
    aoti_get_i32_fn constant_type;         /* optional: every constant a parameter */
    aoti_update_pairs_fn update_user_managed;
    aoti_fold_fn fold;                 /* optional unless a constant is folded */
    aoti_container_fn swap;            /* optional: embedded constants stay */
    aoti_container_fn free_inactive;   /* optional, idem */
    aoti_container_bool_fn did_load;   /* optional: embedded detection */
    aoti_set_bool_fn set_pinned_async; /* optional, torch >= 2.14 */
    aoti_get_count_fn num_inputs;      /* optional */
    aoti_get_count_fn num_outputs;     /* optional */
    aoti_last_error_fn last_error;     /* optional */
    aoti_from_blob_fn from_blob;
    aoti_tensor_fn delete_tensor;
    aoti_data_ptr_fn data_ptr;
    aoti_get_i64_fn get_dim;         /* optional (describe) */
    aoti_get_i64p_fn get_sizes;      /* optional (describe) */
    aoti_get_t_i32_fn get_dtype;     /* optional (describe) */
    aoti_get_t_i32_fn get_dev_type;  /* optional (describe) */
    aoti_get_t_i32_fn get_dev_index; /* optional (describe) */
    aoti_code_fn device_type_cpu;    /* optional */
    aoti_code_fn device_type_cuda;   /* optional */
} aoti_fns;

/* How a constant was bound. */
enum { WB_BIND_NONE, WB_BIND_LEASED, WB_BIND_ALIASED, WB_BIND_CALLER, WB_BIND_PACKAGE };

/* One constant of the model and what it is bound to. */
typedef struct binding {
    char *name; /* container's internal name (copied: the first container of
                 * the external-constants path is deleted) */
    char *fqn;
    int32_t dtype;
    size_t size;
    int folded;
    int32_t type; /* upstream ConstantType: 1 parameter, 2 buffer, 3 tensor constant, 4 folded */
    int kind;     /* WB_BIND_* */
    AtenTensorHandle handle; /* our wrapper, deleted after the container */
    const void *data;        /* what the handle wraps */
    void *private_host;      /* constants-file data, owned */
    void *private_dev;       /* its device copy, owned */
    int lease;               /* index into leases, or -1 */
    int caller;              /* index into caller tensors, or -1 */
} binding;

struct wb_container {
    wb_err err;
    char *model_path;
    char *so_path;
    char *tmpdir;
    char *cubin_dir;
    char device_str[32];
    int cuda;
    int device_index;
    int32_t dev_type_code;
    int32_t cuda_type_code, cpu_type_code;
    wb__aoti_rules rules;
    void *lib;
    aoti_fns f;
    AOTInductorModelContainerHandle h;
    void *stream;
    int own_stream;
    size_t n_bind;
    binding *bind;
    size_t n_leases;
    wb_lease **leases;
    uint64_t *lease_bytes;
    uint32_t *lease_tensors;
    int attached;
    wb__container_rec rec;
    wb_container_info info;
};

/* The model path as a log value (quoted when it has spaces). */
const char *wb__aoti_qpath(const wb_container *c, char *buf, size_t size);
/* Records an error on the container and returns `code`. */
int wb__aoti_fail(wb_container *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A failed runtime call, with the runtime's own message where it has one. */
int wb__aoti_runtime_fail(wb_container *c, const char *what, const char *ctx);
/* safetensors dtype name <-> c10::ScalarType code (-1 / "?" when none). */
int32_t wb__aoti_dtype_code(const char *name);
const char *wb__aoti_dtype_name(int32_t code);
/* Looks up the model library's entry points; fails naming a missing one. */
int wb__aoti_bind_symbols(wb_container *c);
/* Loads torch's libraries from `dir` (RTLD_GLOBAL), in dependency order. */
int wb__aoti_preload_torch(wb_container *c, const char *dir);
double wb__aoti_mono_now(void);

/* aoti_bind.c: reads the constant table of c->h; binds every constant that
 * is not folded by the rules of aoti_bind.h; the (name, handle) pairs of the
 * bound ones (calloc'd); frees the bindings (after the container). */
int wb__aoti_read_constants(wb_container *c);
int wb__aoti_bind_constants(wb_container *c, const wb_container_options *o);
AOTInductorConstantMapEntry *wb__aoti_make_pairs(wb_container *c, size_t *n);
void wb__aoti_free_bindings(wb_container *c);
size_t wb__aoti_count_folded(const wb_container *c, uint64_t *bytes);

/* aoti_create.c: the creation strategies, and the container's stream. */
int wb__aoti_create_external(wb_container *c, const wb_container_options *o, size_t num_models);
int wb__aoti_create_with_device(wb_container *c, const wb_container_options *o, size_t num_models);
int wb__aoti_create_own(wb_container *c, size_t num_models);
int wb__aoti_make_stream(wb_container *c, void *given);
int wb__aoti_sync_stream(wb_container *c);

#endif
