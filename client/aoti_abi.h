/* The few C types and entry points of PyTorch's AOTInductor runtime that the
 * binding uses, declared here because torch's own header (interface.h) is
 * C++ only. Nothing is linked: every function is looked up with dlsym in the
 * model library, so these are pointer types, named after the symbols.
 *
 * Sources: torch/csrc/inductor/aoti_runtime/interface.h (model container ABI)
 * and torch/csrc/inductor/aoti_torch/c/shim.h (tensor ABI). Every function
 * returns 0 on success and nonzero on failure. */
#ifndef WB_AOTI_ABI_H
#define WB_AOTI_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct AtenTensorOpaque *AtenTensorHandle;
typedef struct AOTInductorModelContainerOpaque *AOTInductorModelContainerHandle;
typedef struct AOTInductorStreamOpaque *AOTInductorStreamHandle;
typedef struct AOTIProxyExecutorOpaque *AOTIProxyExecutorHandle;
typedef int32_t AOTIRuntimeError;
typedef int32_t AOTITorchError;

typedef struct AOTInductorConstantMapEntry {
    const char *name;
    AtenTensorHandle handle;
} AOTInductorConstantMapEntry;

/* c10::ScalarType codes, as GetConstantDtype and the shim use them (checked
 * against torch/headeronly/core/ScalarType.h). */
enum {
    WB_AOTI_DTYPE_U8 = 0,
    WB_AOTI_DTYPE_I8 = 1,
    WB_AOTI_DTYPE_I16 = 2,
    WB_AOTI_DTYPE_I32 = 3,
    WB_AOTI_DTYPE_I64 = 4,
    WB_AOTI_DTYPE_F16 = 5,
    WB_AOTI_DTYPE_F32 = 6,
    WB_AOTI_DTYPE_F64 = 7,
    WB_AOTI_DTYPE_C64 = 9,
    WB_AOTI_DTYPE_BOOL = 11,
    WB_AOTI_DTYPE_BF16 = 15,
    WB_AOTI_DTYPE_F8_E5M2 = 23,
    WB_AOTI_DTYPE_F8_E4M3FN = 24,
    WB_AOTI_DTYPE_U16 = 27,
    WB_AOTI_DTYPE_U32 = 28,
    WB_AOTI_DTYPE_U64 = 29,
    WB_AOTI_DTYPE_F8_E8M0FNU = 44,
};

/* c10::DeviceType codes, used when the runtime does not export
 * aoti_torch_device_type_cpu/cuda. */
enum { WB_AOTI_DEVICE_CPU = 0, WB_AOTI_DEVICE_CUDA = 1 };

/* Model container (interface.h). */
typedef AOTIRuntimeError (*aoti_create_with_device_fn)(AOTInductorModelContainerHandle *,
                                                       size_t num_models, const char *device_str,
                                                       const char *cubin_dir);
typedef AOTIRuntimeError (*aoti_create_with_external_constants_fn)(
    AOTInductorModelContainerHandle *, size_t num_models, const char *device_str,
    const char *cubin_dir, const AOTInductorConstantMapEntry *entries, size_t n_entries);
typedef AOTIRuntimeError (*aoti_delete_fn)(AOTInductorModelContainerHandle);
typedef AOTIRuntimeError (*aoti_run_fn)(AOTInductorModelContainerHandle, AtenTensorHandle *inputs,
                                        size_t n_inputs, AtenTensorHandle *outputs,
                                        size_t n_outputs, AOTInductorStreamHandle,
                                        AOTIProxyExecutorHandle);
typedef AOTIRuntimeError (*aoti_get_count_fn)(AOTInductorModelContainerHandle, size_t *);
typedef AOTIRuntimeError (*aoti_get_str_fn)(AOTInductorModelContainerHandle, size_t idx,
                                            const char **);
typedef AOTIRuntimeError (*aoti_get_i32_fn)(AOTInductorModelContainerHandle, size_t idx, int32_t *);
typedef AOTIRuntimeError (*aoti_get_bool_fn)(AOTInductorModelContainerHandle, size_t idx, bool *);
typedef AOTIRuntimeError (*aoti_get_size_fn)(AOTInductorModelContainerHandle, size_t idx, size_t *);
typedef AOTIRuntimeError (*aoti_update_pairs_fn)(AOTInductorModelContainerHandle,
                                                 const AOTInductorConstantMapEntry *pairs,
                                                 size_t n_pairs, bool use_inactive,
                                                 bool validate_full_update);
typedef AOTIRuntimeError (*aoti_fold_fn)(AOTInductorModelContainerHandle, bool use_inactive,
                                         AOTInductorStreamHandle, AOTIProxyExecutorHandle);
typedef AOTIRuntimeError (*aoti_container_fn)(AOTInductorModelContainerHandle);
typedef AOTIRuntimeError (*aoti_container_bool_fn)(AOTInductorModelContainerHandle, bool *);
typedef AOTIRuntimeError (*aoti_set_bool_fn)(bool);
typedef AOTIRuntimeError (*aoti_last_error_fn)(const char **);
/* The constants the container holds, keyed by original FQN (newer torch). */
typedef AOTIRuntimeError (*aoti_extract_entries_fn)(AOTInductorModelContainerHandle,
                                                    const AOTInductorConstantMapEntry **entries,
                                                    size_t *n_entries, bool use_inactive);
typedef AOTIRuntimeError (*aoti_get_u64_fn)(AOTInductorModelContainerHandle, uint64_t *);

/* Tensors (shim.h). */
typedef AOTITorchError (*aoti_from_blob_fn)(void *data, int64_t ndim, const int64_t *sizes,
                                            const int64_t *strides, int64_t storage_offset,
                                            int32_t dtype, int32_t device_type,
                                            int32_t device_index, AtenTensorHandle *out);
typedef AOTITorchError (*aoti_tensor_fn)(AtenTensorHandle);
typedef AOTITorchError (*aoti_data_ptr_fn)(AtenTensorHandle, void **);
typedef AOTITorchError (*aoti_get_i64_fn)(AtenTensorHandle, int64_t *);
typedef AOTITorchError (*aoti_get_i64p_fn)(AtenTensorHandle, int64_t **);
typedef AOTITorchError (*aoti_get_t_i32_fn)(AtenTensorHandle, int32_t *);
typedef int32_t (*aoti_code_fn)(void);

#endif
