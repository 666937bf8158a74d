/* Internal to libwbclient: the state of a container and the functions the
 * AOTI binding's files share. aoti.c: the public container API and creation
 * order; aoti_abi.c: loading the model library and binding its C ABI, what
 * data of its own it holds, tensor functions; aoti_bind.c: which tensor each
 * constant binds to, by the rules of aoti_rules.c (aoti_rules.h);
 * aoti_missing.c: the error for constants bound by nothing; aoti_create.c:
 * the creation strategies (external constants, user-managed update, own
 * constants). */
#ifndef WB_AOTI_IMPL_H
#define WB_AOTI_IMPL_H

#include "wb/container.h"

#include "aoti_abi.h"
#include "aoti_rules.h"
#include "clog.h"
#include "lease.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define API_EXTERNAL "CreateWithExternalConstants"
#define API_DEVICE   "CreateWithDevice+UpdateUserManagedConstantBufferPairs"
#define API_OWN      "CreateWithDevice"
/* Folded constants above this share of the shared bytes earn a warning. */
#define FOLDED_WARN_RATIO 0.10
/* When the library says nothing of its own data (see wb__aoti_read_own_data),
 * a CreateWithDevice that allocated at least this share of the constants'
 * bytes loaded its own copy. Only judged for constants of at least
 * EMBEDDED_MIN_BYTES: below that other allocations (kernels, workspaces)
 * could be mistaken for a copy. */
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
    aoti_fold_fn fold;                       /* optional unless a constant is folded */
    aoti_container_fn swap;                  /* optional: embedded constants stay */
    aoti_container_fn free_inactive;         /* optional, idem */
    aoti_container_bool_fn did_load;         /* optional: embedded detection */
    aoti_extract_entries_fn extract_entries; /* optional: what the library holds */
    aoti_get_u64_fn blob_size;               /* optional: mmap'd weights only */
    aoti_set_bool_fn set_pinned_async;       /* optional, torch >= 2.14 */
    aoti_get_count_fn num_inputs;            /* optional */
    aoti_get_count_fn num_outputs;           /* optional */
    aoti_last_error_fn last_error;           /* optional */
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

/* Distinct streams a container remembers between updates (runs' streams,
 * waited for after a swap); beyond that an update waits for the device. */
#define WB_CONTAINER_STREAMS 32

struct wb__follower;

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
    int own;      /* the library holds data of its own for it (wb__aoti_read_own_data) */
    int kept;     /* bound by nothing: keeps the library's own data */
    int alias;    /* index into rules.aliases of the alias naming it, or -1 */
    AtenTensorHandle handle; /* our wrapper, deleted after the container */
    const void *data;        /* what the handle wraps */
    void *private_host;      /* constants-file data, owned */
    void *private_dev;       /* its device copy, owned */
    int lease;               /* index into leases, or -1 */
    int caller;              /* index into caller tensors, or -1 */
} binding;

struct wb_container {
    wb_err err;
    char *long_msg; /* the whole message when err.msg holds only its start */
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
    /* How the library's own constant data was judged, for messages; own_known
     * is 0 when nothing the library exports could tell. */
    char own_how[160];
    int own_known;
    wb__container_rec rec;
    wb_container_info info;
    int own_constants;
    /* The caller tensors of the options, copied (with their names, dtypes
     * and shapes) for the bindings of an update; the memory is the
     * caller's. */
    wb_container_tensor *caller;
    size_t n_caller;
    int copy_mutated;

    /* Runs and swaps (aoti_update.c). update_mu serialises updates (and
     * the reads of `info` by wb_container_get_info). run_lock: every run
     * holds it shared around the model's Run, the swap exclusive, so that a
     * run sees one version whole; writers are preferred, so a stream of
     * runs cannot starve a swap. `version` (the first lease's) is written
     * under it exclusive and read shared. `streams`: the CUDA streams runs
     * used since the last update, under streams_mu (a leaf). */
    int locks_ready;
    pthread_mutex_t update_mu;
    pthread_rwlock_t run_lock;
    uint32_t version;
    pthread_mutex_t streams_mu;
    void *streams[WB_CONTAINER_STREAMS];
    size_t n_streams;
    int streams_overflow;
    /* follow.c: the follower, and whether the container owns its leases
     * (wb_container_follow makes it so: destroy releases them). */
    struct wb__follower *follower;
    int owns_leases;
    /* Leases an update replaced but could not wait for (a CUDA stream that
     * failed): still registered, let go (and released when owned) at
     * destroy. */
    wb_lease **held;
    size_t n_held;
};

/* aoti_update.c: sets up and frees the run and update locks; notes the
 * stream a run used (CUDA only). */
int wb__aoti_locks_init(wb_container *c);
void wb__aoti_locks_free(wb_container *c);
void wb__aoti_note_stream(wb_container *c, void *stream);
/* Copies what an update's bindings need of the creation's options (the
 * caller tensors' descriptions, copy_mutated). */
int wb__aoti_keep_options(wb_container *c, const wb_container_options *o);
/* follow.c: stops and joins the follower (before destroy frees
 * anything); harmless without one. */
void wb__aoti_follow_stop(wb_container *c);

/* The model path as a log value (quoted when it has spaces). */
const char *wb__aoti_qpath(const wb_container *c, char *buf, size_t size);
/* Records an error on the container and returns `code`. */
int wb__aoti_fail(wb_container *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records a message of any length (taken, malloc'd; NULL: out of memory):
 * err.msg keeps its start, wb_container_errmsg returns all of it. */
int wb__aoti_fail_long(wb_container *c, int code, char *msg);
/* A failed runtime call, with the runtime's own message where it has one. */
int wb__aoti_runtime_fail(wb_container *c, const char *what, const char *ctx);
/* Upstream's ConstantType code as a word ("parameter", "buffer", ...). */
const char *wb__aoti_type_name(int32_t type);
/* safetensors dtype name <-> c10::ScalarType code (-1 / "?" when none). */
int32_t wb__aoti_dtype_code(const char *name);
const char *wb__aoti_dtype_name(int32_t code);
/* Looks up the model library's entry points; fails naming a missing one. */
int wb__aoti_bind_symbols(wb_container *c);
/* Sets bind[i].own for every constant of c->h, a container just made by
 * CreateWithDevice (before any update): whether the library loaded data of
 * its own for it. `allocated` is the device memory the creation took (0 on
 * the CPU). Says how it judged in c->own_how. */
int wb__aoti_read_own_data(wb_container *c, uint64_t allocated);
/* Loads torch's libraries from `dir` (RTLD_GLOBAL), in dependency order. */
int wb__aoti_preload_torch(wb_container *c, const char *dir);

/* aoti_bind.c: reads the constant table of c->h; binds every constant that
 * is not folded by the rules of aoti_rules.h; the (name, handle) pairs of the
 * bound ones (calloc'd); frees the bindings (after the container). */
int wb__aoti_read_constants(wb_container *c);
int wb__aoti_bind_constants(wb_container *c, const wb_container_options *o);
/* The constants bound by nothing that keep the library's own data. */
size_t wb__aoti_count_kept(const wb_container *c);
/* 1 when `size` (GetConstantDataSize: the storage's bytes, rounded up to 64
 * unless every constant is on CUDA) fits a contiguous tensor of `nbytes`. */
int wb__aoti_size_fits(uint64_t size, uint64_t nbytes);
/* The leases' model names, "'a', 'b'", for messages. */
void wb__aoti_lease_names(const wb_container *c, char *buf, size_t size);

/* aoti_missing.c: fails the creation with WB_ENOTFOUND naming every
 * constant bound by nothing (indices into c->bind), its type, the prefix
 * rule that would bind them, if any, and the fixes. */
int wb__aoti_report_missing(wb_container *c, const size_t *missing, size_t n);
AOTInductorConstantMapEntry *wb__aoti_make_pairs(wb_container *c, size_t *n);
void wb__aoti_free_bindings(wb_container *c);
/* Frees n bindings made for c (their wrappers, private copies and names)
 * and the array. */
void wb__aoti_free_binding_array(const wb_container *c, binding *bind, size_t n);
size_t wb__aoti_count_folded(const wb_container *c, uint64_t *bytes);

/* aoti_create.c: the creation strategies, and the container's stream. */
int wb__aoti_create_external(wb_container *c, const wb_container_options *o, size_t num_models);
int wb__aoti_create_with_device(wb_container *c, const wb_container_options *o, size_t num_models);
int wb__aoti_create_own(wb_container *c, size_t num_models);
int wb__aoti_make_stream(wb_container *c, void *given);
int wb__aoti_sync_stream(wb_container *c);

#endif
