/* libwbclient: AOTInductor model containers on leased weights.
 *
 * A container runs a model compiled ahead of time by PyTorch's AOTInductor
 * (a `.pt2` package, the directory of an unpacked one, or the model `.so`)
 * directly on the weights of one or more leases: the model's constants are
 * bound by their original names (FQNs, the safetensors names) to the leased
 * tensors without copying them, so every worker on the node shares one copy.
 *
 * libwbclient does not link libtorch. The model library needs libtorch at run
 * time: the caller provides it (LD_LIBRARY_PATH) or names torch's lib
 * directory in the options, and the library then loads libc10.so,
 * libtorch_cpu.so, libtorch_cuda.so and libtorch.so from there first.
 *
 * Lifetime: a container registers itself on every lease it binds, from the
 * start of wb_container_create (a failed creation unregisters before it
 * returns) until wb_container_destroy; such a lease cannot be released
 * (wb_lease_release returns WB_EBUSY). Destroy containers before releasing
 * their leases.
 *
 * Threads: containers on the same leases may be created and destroyed from
 * several threads at once, and concurrently with wb_lease_release on those
 * leases (which then refuses with WB_EBUSY; see wb/client.h, "Threads"). The
 * leases must not be released before a wb_container_create that names them
 * has started. On one container, wb_container_destroy must not overlap any
 * other call. wb_container_run may run from several threads at once (each
 * holds the container's run lock shared; how many run in parallel is the
 * model runtime's: AOTInductor's container keeps opts.num_models
 * instances), and concurrently with wb_container_update, which takes that
 * lock exclusively only for the swap itself: a run sees one version of the
 * weights whole, never a mix. Updates of one container are serialised.
 *
 * Versions: wb_container_update swaps a new version of a model's weights
 * into a live container between runs; wb_container_follow does it for
 * every version the broker announces (see each below).
 *
 * Streams: on CUDA, pass the stream to run on. Workers must not issue
 * synchronous copies (cudaMemcpy) or use the legacy default stream while
 * serving: such calls wait for every kernel of the process and stall it. */
#ifndef WB_CONTAINER_H
#define WB_CONTAINER_H

#include "wb/client.h"
#include "wb/export.h"
#include "wb/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wb_container wb_container;

/* A tensor of the model's runtime (libtorch's AtenTensorHandle: the same
 * opaque type, so a C++ caller may pass it to torch's shim functions). */
typedef struct AtenTensorOpaque *wb_aten_tensor;

/* A tensor owned by the caller, bound as a constant when no lease has its
 * name (or to override a leased one). The memory must stay valid, and
 * unchanged, until the container is destroyed. */
typedef struct wb_container_tensor {
    const char *fqn;       /* the constant's original name, as in the state dict */
    const void *data;      /* host pointer, or device pointer when device >= 0 */
    const char *dtype;     /* "F32", "BF16", ... as in safetensors */
    uint32_t ndim;         /* 0 for a scalar */
    const uint64_t *shape; /* ndim entries */
    int device;            /* CUDA device ordinal, or -1 for host memory */
} wb_container_tensor;

typedef struct wb_container_options {
    /* torch's lib directory: its libraries are loaded (RTLD_GLOBAL) before
     * the model. NULL: the model's own dependencies are resolved by the
     * dynamic linker (LD_LIBRARY_PATH). */
    const char *torch_lib_dir;
    /* "cpu", "cuda" or "cuda:N". NULL: "cuda:<current device>" when any
     * bound tensor is in device memory, else "cpu". */
    const char *device;
    /* Model instances that may run concurrently; 0 means 1. */
    size_t num_models;
    /* Caller tensors (see wb_container_tensor), searched before the leases. */
    const wb_container_tensor *tensors;
    size_t n_tensors;
    /* Directory where a .pt2 package is unpacked (into a private mkdtemp
     * directory, mode 0700, removed on destroy). NULL: $TMPDIR, else /tmp. */
    const char *work_dir;
    /* CUDA stream (cudaStream_t) for constant folding at creation. NULL: a
     * private non-blocking stream. Ignored on the CPU. */
    void *stream;
    /* Nonzero: bind nothing and keep the constants the model library loads
     * by itself (a library built with its constants inside). This is the
     * unshared baseline: every process then holds its own copy. With torch
     * >= 2.14 the container is still created with CreateWithDevice. A
     * library that says it holds no data of its own is refused. */
    int own_constants;
    /* Binding rules for real checkpoints. A constant is looked up, in this
     * order: as a caller tensor named by its FQN; in the leases by its
     * checkpoint name (the FQN with `strip_prefix` removed when it starts
     * with it, then `prefix` added: a model exported inside a wrapper,
     * Wrapper(model), has FQNs "model.<name>", so strip_prefix "model."
     * binds a checkpoint saved from the bare model); through an alias; in
     * the package's constants file. */
    const char *strip_prefix; /* NULL: none */
    const char *prefix;       /* NULL: none */
    /* Tied or renamed weights: "name=target,name=target". A constant that
     * is in no lease under its own name binds to the tensor `target` names,
     * without copying: two constants on one tensor cost one copy.
     * save_pretrained drops tied parameters (GPT-2's
     * "lm_head.weight=transformer.wte.weight"). Either side may be written
     * in either namespace. `name` is a constant's model name (FQN); failing
     * that, its checkpoint name (after the prefix rules), which must then
     * be the checkpoint name of that constant only. `target` is a caller
     * tensor's name; else a leased tensor's checkpoint name, or a model name
     * that the prefix rules make one; when both readings find different
     * tensors the alias is refused (WB_EINVAL) naming both. Added after the
     * constants file's aliases; a later alias of the same constant wins. */
    const char *aliases;
    /* The constants file written when the model was compiled (a safetensors
     * file: the constants no checkpoint has, such as non-persistent buffers
     * and tensor constants, keyed by FQN, and in its metadata the aliases
     * and prefix rules found then). NULL: weightbroker/constants.safetensors
     * inside the package (or package directory), else <model_path>.wb.safetensors
     * beside it, else none. Its tensors are copied into memory private to the
     * container (counted in package_bytes). */
    const char *constants_file;
    /* Constants the compiled graph writes (buffers the exported program
     * mutates): "fqn,fqn", added to the constants file's
     * "weightbroker.mutated" list (weightbroker.compile writes it from
     * the exported program's buffers_to_mutate). Such a constant found in a
     * lease is refused with WB_EPERM naming it (a write into a read-only
     * mapping would fault in this worker; into a CUDA IPC slab it would
     * change every worker's copy), unless `copy_mutated` is nonzero: then
     * it is bound to a private copy of the leased tensor, counted in
     * package_constants/package_bytes. Caller tensors are the caller's. */
    const char *mutated;
    int copy_mutated;
} wb_container_options;

/* Fills opts with the defaults described above (all zero). */
WB_EXPORT void wb_container_options_init(wb_container_options *opts);

/* Builds a container for the model at `model_path` on the weights of
 * `leases` (n_leases >= 0; every constant must then be found by the rules
 * of wb_container_options, except a buffer or tensor constant for which the
 * model library loaded data of its own, which keeps it). Checks every
 * constant's dtype and byte size
 * against the tensor bound to it (the model's size is its storage's, which
 * upstream rounds up to 64 bytes unless every constant is on CUDA: both are
 * accepted) and fails naming the tensor on a mismatch. Each bound tensor
 * keeps its own device. A model whose library has <library>.json beside it
 * (custom or extern operators, run through torch's proxy executor) is
 * refused with WB_ENOSYS.
 *
 * On success *out is a new container. On failure *out is still set (unless
 * out of memory) so that wb_container_errmsg() can say what went wrong;
 * destroy it either way. Errors: WB_EINVAL (arguments, dtype or size
 * mismatch, an alias that reads two ways), WB_ENOTFOUND (no such file;
 * constants found nowhere: the message names every one with its type, the
 * prefix rule that would bind them if one does, and the fixes; with
 * own_constants, a library that holds no data of its own),
 * WB_EFORMAT (not a model library or package, a package entry that would
 * escape its directory), WB_EIO (extraction, dlopen), WB_EINTERNAL (the
 * model's runtime reported a failure). */
WB_EXPORT int wb_container_create(wb_lease *const *leases, size_t n_leases, const char *model_path,
                                  const wb_container_options *opts, wb_container **out);

/* Runs the model once. `inputs` are stolen (the model frees them, also on
 * failure); `outputs` receives n_out new tensors that belong to the caller
 * (free each with wb_container_tensor_delete). `stream` is the cudaStream_t
 * to run on (NULL: the container's private stream on CUDA; ignored on the
 * CPU); the call returns once the work is queued: synchronise the stream
 * before reading outputs. */
WB_EXPORT int wb_container_run(wb_container *c, wb_aten_tensor *inputs, size_t n_in,
                               wb_aten_tensor *outputs, size_t n_out, void *stream);

/* wb_container_run, and *version (may be NULL) gets the version of the
 * container's first lease (wb_lease_version) whose weights this run used:
 * read under the same lock as the run, so it is exact even while an update
 * swaps versions. */
WB_EXPORT int wb_container_run_versioned(wb_container *c, wb_aten_tensor *inputs, size_t n_in,
                                         wb_aten_tensor *outputs, size_t n_out, void *stream,
                                         uint32_t *version);

/* Swaps new weights into a live container: each of the n leases replaces
 * the container's lease of the same model name (the others stay). Every
 * constant is bound again by the rules and checks of wb_container_create
 * (dtype, size, missing constants, mutated constants) to the new leases'
 * tensors; caller tensors are bound as they are, constants-file tensors
 * are copied again (a constant the graph writes starts again from its
 * source), constants bound by nothing keep the library's data. They go
 * into the container's inactive constant buffer
 * (UpdateUserManagedConstantBufferPairs with use_inactive), constant
 * folding runs there when the model has folded constants, and the buffers
 * are swapped (SwapConstantBuffer) under the run lock: runs in flight finish
 * on the old version, later runs use the new one. On CUDA, before it
 * returns, it waits for the work that runs queued before the swap on every
 * stream they used since the last update (a stream given to
 * wb_container_run must stay valid until then), so that nothing still
 * reads the old weights; the library's private copy of the old folded
 * constants is then freed.
 *
 * WB_OK: the container runs the new version, is registered on the new
 * leases and no longer on the leases they replaced, which the caller may
 * then release (wb_lease_release; a container that follows owns them, see
 * wb_container_follow). Any failure changes nothing: the container keeps
 * serving the old version, the new leases are not registered (the caller
 * releases them). Errors: WB_EINVAL (NULL or repeated leases, a lease of a
 * model the container does not use, a dtype or size mismatch; a container
 * made with own_constants, which binds nothing that a lease could
 * replace), WB_ENOTFOUND (a constant the new version lacks), WB_EPERM (a
 * mutated constant), WB_ENOSYS (the model library exports no
 * SwapConstantBuffer or UpdateUserManagedConstantBufferPairs: there is no
 * inactive buffer, the old version stays), WB_EINTERNAL (the runtime
 * failed). Runs may continue from other threads meanwhile; concurrent
 * updates of one container wait for each other. */
WB_EXPORT int wb_container_update(wb_container *c, wb_lease *const *new_leases, size_t n);

/* Follows every model the container leases: subscribes to each on
 * `client` (wb_client_subscribe) and, for each new current version, on a
 * thread of the container's own (the follower; the heartbeat thread only
 * wakes it), acquires the new version with the options of the lease it
 * replaces (the same device), calls wb_container_update, then releases
 * the old lease. When the acquire or the update fails, the container keeps
 * the old version, the new lease is released, and the failure goes to the
 * log handler (event container_follow_failed) and is counted
 * (wb_container_info.follow_errors). A version announced while an update
 * runs is taken next; versions announced meanwhile are skipped for the
 * latest. A current version newer than the leases' when follow is called
 * is swapped in at once.
 *
 * Ownership: from a successful call on, the container owns every lease it
 * holds, the ones it was created on included: the caller must not release
 * them (or any it passed to wb_container_update later), the follower
 * releases each one it replaces, and wb_container_destroy stops the
 * follower (joined before anything is freed) and then releases the leases
 * the container holds. `client` must outlive the container. WB_ENOSYS
 * (from wb_client_subscribe) with a broker that predates versions, WB_EBUSY
 * when the container already follows, WB_EINVAL for a container without
 * leases; on failure nothing changes (the caller still owns its leases). */
WB_EXPORT int wb_container_follow(wb_container *c, wb_client *client);

/* Deletes the model container, unregisters it from its leases (which may
 * then be released), frees the tensors wrapping leased memory, unloads the
 * model library and removes any unpacked package. A container that follows
 * (wb_container_follow) first stops its follower, and releases its leases
 * after. Sets *c to NULL; NULL is fine. */
WB_EXPORT void wb_container_destroy(wb_container **c);

/* The message of the last failure on this container, of any length (one
 * that names many constants is long); never NULL. */
WB_EXPORT const char *wb_container_errmsg(const wb_container *c);

/* The container's private CUDA stream (cudaStream_t), or NULL on the CPU. */
WB_EXPORT void *wb_container_stream(const wb_container *c);

typedef struct wb_container_info {
    /* "CreateWithExternalConstants" (torch >= 2.14),
     * "CreateWithDevice+UpdateUserManagedConstantBufferPairs" (2.11-2.13),
     * or "CreateWithDevice" (own_constants: the library's own copy). */
    const char *aoti_api;
    const char *model_path; /* as given */
    const char *so_path;    /* the model library that was loaded */
    const char *device;     /* "cpu", "cuda:0", ... */
    int pinned_async_copy;  /* AOTInductorSetUsePinnedAsyncConstantsCopy(true) was called */
    size_t n_constants;     /* constants the model declares */
    size_t bound_tensors;   /* constants bound to leased or caller tensors */
    uint64_t bound_bytes;   /* bytes bound from leases (shared, never copied) */
    uint64_t caller_bytes;  /* bytes bound from caller tensors */
    /* Every constant is one of: leased (a leased tensor of its checkpoint
     * name), aliased (a leased or caller tensor of another name: tied
     * weights), caller, package (from the constants file, private),
     * folded (built by the container), unbound (a buffer or tensor constant
     * found nowhere that keeps the data the model library loaded for it; a
     * constant found nowhere without such data, or a parameter found
     * nowhere, fails the creation). A leased tensor bound under two names
     * is counted once in bound_bytes. */
    size_t leased_constants, aliased_constants, caller_constants, package_constants;
    size_t unbound_constants;
    uint64_t package_bytes; /* private copies of constants-file tensors */
    size_t folded_constants;
    uint64_t folded_bytes;        /* built by constant folding, private to this container */
    uint64_t embedded_bytes;      /* constants the library loaded by itself, then freed */
    double embedded_free_seconds; /* time spent replacing and freeing them */
    double created_at;            /* Unix seconds */
    double create_seconds;        /* wall time of wb_container_create */
    size_t n_inputs, n_outputs;   /* 0 when the library does not say */
    /* Of create_seconds: finding the model library (unpacking a .pt2) and
     * dlopen, the part any process running the model pays. */
    double library_seconds;
    /* The version of the first lease (0 from a broker that predates
     * versions); versions swapped in by wb_container_update; how long the
     * last swap took, from the start of the update to the old version no
     * longer used by any run (its work on the streams done included). */
    uint32_t version;
    uint32_t swaps;
    double last_swap_ms;
    double last_swap_at; /* Unix seconds when the last swap's update returned; 0: none */
    /* Versions the follower could not swap in (wb_container_follow). */
    uint32_t follow_errors;
    /* Of the last swap: when runs began to use the new version (Unix
     * seconds: the swap itself, before the old version's work on the
     * streams is waited for), and how long it waited for the runs in
     * flight to end (milliseconds). */
    double last_swap_in_use_at;
    double last_swap_run_wait_ms;
} wb_container_info;

/* Fills *out; strings belong to the container. Waits for an update in
 * progress. */
WB_EXPORT int wb_container_get_info(const wb_container *c, wb_container_info *out);

/* Tensor functions, so that callers need no libtorch headers. They use the
 * model's own runtime (aoti_torch_* functions). */

/* Wraps caller memory as a contiguous tensor without copying it
 * (non-owning: free the memory after the tensor is gone). device: CUDA
 * ordinal or -1 for host memory. */
WB_EXPORT int wb_container_tensor_from_blob(wb_container *c, void *data, const char *dtype,
                                            uint32_t ndim, const int64_t *shape, int device,
                                            wb_aten_tensor *out);
/* Frees a tensor handle (and its memory when the runtime owns it). NULL is fine. */
WB_EXPORT int wb_container_tensor_delete(wb_container *c, wb_aten_tensor t);

/* The tensor's data pointer (owned by the tensor). */
WB_EXPORT int wb_container_tensor_data_ptr(wb_container *c, wb_aten_tensor t, void **out);

#define WB_CONTAINER_MAX_DIMS 8

typedef struct wb_tensor_desc {
    void *data;
    char dtype[16]; /* "F32", ...; "?" when the code is not one safetensors knows */
    uint32_t ndim;
    int64_t shape[WB_CONTAINER_MAX_DIMS];
    uint64_t nbytes; /* product(shape) * element size, for a contiguous tensor */
    int device;      /* CUDA ordinal or -1 */
} wb_tensor_desc;

/* Describes a tensor (for example an output): data pointer, dtype, shape.
 * WB_ENOSYS when the runtime lacks the query functions; WB_ELIMIT for more
 * than WB_CONTAINER_MAX_DIMS dimensions. */
WB_EXPORT int wb_container_tensor_describe(wb_container *c, wb_aten_tensor t, wb_tensor_desc *out);

#ifdef __cplusplus
}
#endif

#endif
