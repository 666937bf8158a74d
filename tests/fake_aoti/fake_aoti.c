/* FAKE AOTInductor model library, for CPU tests of the binding only.
 *
 * This is not PyTorch and proves nothing about real AOTI models: it exports
 * the same C entry points (container and aoti_torch_* tensor functions) so
 * that libwbclient's symbol selection, binding by name, checks and error
 * paths can be tested on machines without libtorch. It is built in five flavours:
 *   fake_aoti_v211.so     like torch 2.11-2.13: CreateWithDevice +
 *                         UpdateUserManagedConstantBufferPairs only, and an
 *                         empty constants blob (_binary_constants_bin_start
 *                         .._end), as a model compiled with
 *                         aot_inductor.package_constants_in_so=False has;
 *   fake_aoti_v211one.so  the same with a blob of one placeholder byte, as
 *                         torch 2.11 links when the constants are outside;
 *   fake_aoti_v211emb.so  the same with a 4 KiB blob, as a library built
 *                         with its constants inside has (the spec's
 *                         `embedded` or `own` says what it really loads);
 *   fake_aoti_v211noswap.so  like v211 without SwapConstantBuffer and
 *                         FreeInactiveConstantBuffer (no inactive buffer
 *                         to swap: wb_container_update is WB_ENOSYS);
 *   fake_aoti_v214.so     like torch >= 2.14: also CreateWithExternalConstants,
 *                         AOTInductorSetUsePinnedAsyncConstantsCopy,
 *                         AOTInductorGetLastError and
 *                         ExtractConstantsMapEntries (what the container
 *                         holds, constant by constant).
 *
 * The "model" computes y[i] = x[i] * W[i] + B[i] (+ C[i] for every further
 * constant C of type buffer or tensor constant) over host float32 vectors,
 * where W is the first constant and B the second. When the model has a
 * folded constant, folding computes F = 2 * W into private memory and the
 * model uses F / 2.
 *
 * It follows upstream (torch/csrc/inductor/aoti_runtime/model_container.h,
 * interface.h) where the binding depends on it:
 *   - UpdateUserManagedConstantBufferPairs with validate_full_update fails
 *     for a missing parameter of nonzero size, and only warns (stderr) for a
 *     missing buffer, tensor constant or empty parameter;
 *   - the first Run after an update folds by itself when folding has not
 *     run (fold_calls counts it);
 *   - CreateWithExternalConstants validates its entries like a full update
 *     and folds at once: there is no "describe only" call with zero entries;
 *   - GetConstantDataSize is whatever the spec says (upstream: the storage's
 *     bytes, rounded up to 64 unless every constant is on CUDA);
 *   - CreateWithDevice loads data of its own for the constants the spec
 *     marks (upstream: every one, or none when the model was compiled with
 *     its constants outside the library); CreateWithExternalConstants none;
 *   - an update of the inactive buffer that lacks a buffer or tensor
 *     constant gives it the active buffer's tensor (upstream: a handle on
 *     it, user-managed), whose memory FreeInactiveConstantBuffer frees after
 *     a swap: a run then reads freed memory, which the fake refuses;
 *   - GetConstantsBlobSize answers only for mmap'd weights (the spec's
 *     `mmap 1`), and fails otherwise.
 * It does not check the size of the tensors it is given (upstream does not).
 *
 * The model is described by a text file: fake_aoti_spec.txt beside the
 * library, else the file named by $FAKE_AOTI_SPEC:
 *   elements N                  vector length
 *   embedded 0|1                1: creation loads a private copy of every
 *                               constant (filled with 0.5), as a library
 *                               built with its constants inside would
 *   mmap 0|1                    1: GetConstantsBlobSize answers
 *   const NAME FQN DTYPE BYTES [TYPE [OWN]]
 *                               a constant bound by the caller (DTYPE is
 *                               the c10 ScalarType code; TYPE upstream's
 *                               ConstantType: 1 parameter (default),
 *                               2 buffer, 3 tensor constant; OWN 1: the
 *                               creation loads data of its own for it,
 *                               filled with 0.5)
 *   folded NAME BYTES           a constant produced by folding
 *   run_delay_us N              each Run takes about N microseconds,
 *                               reading element k of every constant from
 *                               the bound tensor's memory at k/elements of
 *                               that time (memory unmapped, changed or
 *                               swapped too early shows in the output)
 *
 * Concurrency, as upstream's container (model_container.h): Run holds the
 * container's lock shared for its whole duration and reads the active
 * buffer once; SwapConstantBuffer takes it exclusively; an update or a
 * folding of the inactive buffer writes only that buffer (folding holds the
 * lock shared, folding the active buffer exclusively). */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
#ifndef FAKE_AOTI_BLOB_BYTES
#define FAKE_AOTI_BLOB_BYTES 0
#endif
#define STR_(x)      #x
#define STR(x)       STR_(x)
#define MAX_CONSTS   16
#define TENSOR_MAGIC 0x7e45a0a1u
#define DTYPE_F32    6

typedef struct fake_tensor {
    uint32_t magic;
    void *data;
    int owns;
    int64_t ndim;
    int64_t sizes[8];
    int64_t strides[8];
    int32_t dtype, device_type, device_index;
} fake_tensor;

typedef struct fake_const {
    char name[64], fqn[128];
    int32_t dtype;
    size_t size;
    int folded;
    int32_t type;
    int own;               /* data of its own, loaded at CreateWithDevice */
    int borrowed[2];       /* per buffer: reads the other buffer's copy */
    fake_tensor *bound[2]; /* user-managed tensor per buffer (not owned) */
    void *folded_data[2];  /* folded result per buffer (owned) */
} fake_const;

typedef struct fake_container {
    int n_consts;
    fake_const c[MAX_CONSTS];
    long elements;
    int embedded;
    int mmap;
    struct {
        const char *name;
        void *handle;
    } entries[MAX_CONSTS]; /* ExtractConstantsMapEntries' answer */
    void *blob;            /* the embedded copy, in buffer `blob_buf` */
    size_t blob_size;
    int blob_buf;
    int active; /* 0 or 1 */
    int folded_ok[2];
    int load_called;
    long run_delay_us;
    pthread_rwlock_t lock;
} fake_container;

/* The constants blob upstream links into every model library (see the
 * flavours above), as assembly like upstream's: global symbols that the
 * binding finds with dlsym. */
__asm__(".section .rodata\n"
        ".balign 64\n"
        ".globl _binary_constants_bin_start\n"
        "_binary_constants_bin_start:\n"
        ".skip " STR(FAKE_AOTI_BLOB_BYTES) "\n"
                                           ".globl _binary_constants_bin_end\n"
                                           "_binary_constants_bin_end:\n"
                                           ".previous\n");

static _Atomic int live_tensors;
static int pinned_async;
static int pinned_at_create = -1;
static int creates;
static _Atomic int fold_calls;
static long embedded_live;
static long folded_live;
static const char *last_error = "";

/* A test may install a function that every container creation calls first,
 * to hold a creation in progress while another thread acts (the tests open
 * the library themselves, so they share its globals with the binding). */
static void (*create_gate)(void);

EXPORT void fake_aoti_set_create_gate(void (*fn)(void))
{
    create_gate = fn;
}

EXPORT int fake_aoti_live_tensors(void)
{
    return live_tensors;
}
EXPORT int fake_aoti_pinned_at_create(void)
{
    return pinned_at_create;
}
EXPORT int fake_aoti_creates(void)
{
    return creates;
}
EXPORT int fake_aoti_fold_calls(void)
{
    return fold_calls;
}
EXPORT long fake_aoti_embedded_live_bytes(void)
{
    return embedded_live;
}
EXPORT long fake_aoti_folded_live_bytes(void)
{
    return folded_live;
}

static fake_container *last_container;

/* The device of the tensor bound to constant `fqn` in the active buffer of
 * the last container created: device_type * 100 + device_index, or -1. */
EXPORT int fake_aoti_bound_device(const char *fqn)
{
    fake_container *m = last_container;
    for (int i = 0; m && i < m->n_consts; i++) {
        const fake_tensor *t = m->c[i].bound[m->active];
        if (strcmp(m->c[i].fqn, fqn) == 0 && t)
            return t->device_type * 100 + t->device_index;
    }
    return -1;
}

static int failf(const char *msg)
{
    last_error = msg;
    fprintf(stderr, "fake_aoti: %s\n", msg);
    return 1;
}

static fake_tensor *tensor_ok(void *h)
{
    fake_tensor *t = h;
    return t && t->magic == TENSOR_MAGIC ? t : NULL;
}

/* ---- tensors (the aoti_torch_* shim) ---- */

EXPORT int32_t aoti_torch_device_type_cpu(void)
{
    return 0;
}
EXPORT int32_t aoti_torch_device_type_cuda(void)
{
    return 1;
}

EXPORT int32_t aoti_torch_create_tensor_from_blob(void *data, int64_t ndim, const int64_t *sizes,
                                                  const int64_t *strides, int64_t offset,
                                                  int32_t dtype, int32_t device_type,
                                                  int32_t device_index, void **out)
{
    if (!out || ndim < 0 || ndim > 8 || offset != 0)
        return failf("create_tensor_from_blob: bad arguments");
    fake_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return failf("out of memory");
    t->magic = TENSOR_MAGIC;
    t->data = data;
    t->ndim = ndim;
    for (int64_t i = 0; i < ndim; i++) {
        t->sizes[i] = sizes[i];
        t->strides[i] = strides[i];
    }
    t->dtype = dtype;
    t->device_type = device_type;
    t->device_index = device_index;
    live_tensors++;
    *out = t;
    return 0;
}

EXPORT int32_t aoti_torch_delete_tensor_object(void *h)
{
    fake_tensor *t = tensor_ok(h);
    if (!t)
        return failf("delete_tensor_object: not a tensor");
    if (t->owns)
        free(t->data);
    t->magic = 0;
    free(t);
    live_tensors--;
    return 0;
}

EXPORT int32_t aoti_torch_get_data_ptr(void *h, void **out)
{
    fake_tensor *t = tensor_ok(h);
    if (!t)
        return failf("get_data_ptr: not a tensor");
    *out = t->data;
    return 0;
}

EXPORT int32_t aoti_torch_get_dim(void *h, int64_t *out)
{
    fake_tensor *t = tensor_ok(h);
    if (!t)
        return failf("get_dim: not a tensor");
    *out = t->ndim;
    return 0;
}

EXPORT int32_t aoti_torch_get_sizes(void *h, int64_t **out)
{
    fake_tensor *t = tensor_ok(h);
    if (!t)
        return failf("get_sizes: not a tensor");
    *out = t->sizes;
    return 0;
}

EXPORT int32_t aoti_torch_get_dtype(void *h, int32_t *out)
{
    fake_tensor *t = tensor_ok(h);
    if (!t)
        return failf("get_dtype: not a tensor");
    *out = t->dtype;
    return 0;
}

EXPORT int32_t aoti_torch_get_device_type(void *h, int32_t *out)
{
    fake_tensor *t = tensor_ok(h);
    if (!t)
        return failf("get_device_type: not a tensor");
    *out = t->device_type;
    return 0;
}

EXPORT int32_t aoti_torch_get_device_index(void *h, int32_t *out)
{
    fake_tensor *t = tensor_ok(h);
    if (!t)
        return failf("get_device_index: not a tensor");
    *out = t->device_index;
    return 0;
}

/* ---- the model spec ---- */

static int spec_path(char *buf, size_t size)
{
    Dl_info info;
    if (dladdr((void *)spec_path, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            snprintf(buf, size, "%.*s/fake_aoti_spec.txt", (int)(slash - info.dli_fname),
                     info.dli_fname);
            FILE *f = fopen(buf, "r");
            if (f) {
                fclose(f);
                return 0;
            }
        }
    }
    const char *env = getenv("FAKE_AOTI_SPEC");
    if (!env || !env[0])
        return -1;
    snprintf(buf, size, "%s", env);
    return 0;
}

static int load_spec(fake_container *m)
{
    char path[4096], line[512];
    if (spec_path(path, sizeof path) != 0)
        return failf("no fake_aoti_spec.txt beside the library and no $FAKE_AOTI_SPEC");
    FILE *f = fopen(path, "r");
    if (!f)
        return failf("cannot open the spec file");
    while (fgets(line, sizeof line, f)) {
        fake_const *c = &m->c[m->n_consts];
        long long size = 0;
        int dtype = 0, type = 1, own = 0;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "elements %ld", &m->elements) == 1)
            continue;
        if (sscanf(line, "embedded %d", &m->embedded) == 1)
            continue;
        if (sscanf(line, "mmap %d", &m->mmap) == 1)
            continue;
        if (sscanf(line, "run_delay_us %ld", &m->run_delay_us) == 1)
            continue;
        if (m->n_consts < MAX_CONSTS && sscanf(line, "const %63s %127s %d %lld %d %d", c->name,
                                               c->fqn, &dtype, &size, &type, &own) >= 4) {
            c->dtype = dtype;
            c->type = type;
            c->own = own;
            c->size = (size_t)size;
            m->n_consts++;
            continue;
        }
        if (m->n_consts < MAX_CONSTS && sscanf(line, "folded %63s %lld", c->name, &size) == 2) {
            memcpy(c->fqn, c->name, sizeof c->name);
            c->dtype = DTYPE_F32;
            c->size = (size_t)size;
            c->folded = 1;
            c->type = 4;
            m->n_consts++;
            continue;
        }
        fclose(f);
        return failf("bad line in the spec file");
    }
    fclose(f);
    if (m->elements <= 0 || m->n_consts < 2)
        return failf("the spec needs elements and at least two constants");
    for (int i = 0; m->embedded && i < m->n_consts; i++)
        m->c[i].own = !m->c[i].folded;
    return 0;
}

static void free_folded(fake_container *m, int buf)
{
    for (int i = 0; i < m->n_consts; i++) {
        if (m->c[i].folded_data[buf]) {
            free(m->c[i].folded_data[buf]);
            folded_live -= (long)m->c[i].size;
            m->c[i].folded_data[buf] = NULL;
        }
    }
    m->folded_ok[buf] = 0;
}

static void free_blob(fake_container *m)
{
    if (m->blob) {
        free(m->blob);
        embedded_live -= (long)m->blob_size;
        m->blob = NULL;
    }
}

static int has_folded(const fake_container *m)
{
    for (int i = 0; i < m->n_consts; i++) {
        if (m->c[i].folded)
            return 1;
    }
    return 0;
}

/* The library's own copy of constant i, in the blob loaded at creation. */
static const float *own_data(const fake_container *m, int i)
{
    if (!m->blob || !m->c[i].own)
        return NULL;
    size_t off = 0;
    for (int k = 0; k < i; k++)
        off += m->c[k].own ? m->c[k].size : 0;
    return (const float *)((const char *)m->blob + off);
}

/* The data of constant i in buffer `buf`: a bound tensor, or the embedded
 * copy when that buffer holds it, or when it borrowed it from the other
 * buffer (NULL once that copy is freed). */
static const float *const_data(const fake_container *m, int i, int buf)
{
    if (m->c[i].bound[buf])
        return m->c[i].bound[buf]->data;
    if (m->blob && (m->blob_buf == buf || m->c[i].borrowed[buf]))
        return own_data(m, i);
    return NULL;
}

static int do_fold(fake_container *m, int buf)
{
    fold_calls++;
    const float *w = const_data(m, 0, buf);
    if (!w)
        return failf("constant folding: the weight is not bound");
    free_folded(m, buf);
    for (int i = 0; i < m->n_consts; i++) {
        if (!m->c[i].folded)
            continue;
        float *out = malloc(m->c[i].size);
        if (!out)
            return failf("out of memory");
        for (long k = 0; k < m->elements && (size_t)k * 4 < m->c[i].size; k++)
            out[k] = 2.0f * w[k];
        m->c[i].folded_data[buf] = out;
        folded_live += (long)m->c[i].size;
    }
    m->folded_ok[buf] = 1;
    return 0;
}

static fake_container *new_container(void)
{
    if (create_gate)
        create_gate();
    fake_container *m = calloc(1, sizeof *m);
    if (!m) {
        failf("out of memory");
        return NULL;
    }
    if (load_spec(m) != 0) {
        free(m);
        return NULL;
    }
    creates++;
    pinned_at_create = pinned_async;
    last_container = m;
    pthread_rwlock_init(&m->lock, NULL);
    return m;
}

/* ---- the container ABI ---- */

EXPORT int32_t AOTInductorModelContainerCreateWithDevice(void **out, size_t num_models,
                                                         const char *device, const char *cubin)
{
    (void)cubin;
    if (!out || num_models < 1 || !device || strcmp(device, "cpu") != 0)
        return failf("CreateWithDevice: the fake runs on \"cpu\" only");
    fake_container *m = new_container();
    if (!m)
        return 1;
    for (int i = 0; i < m->n_consts; i++)
        m->blob_size += m->c[i].own ? m->c[i].size : 0;
    if (m->blob_size) {
        m->load_called = 1;
        m->blob = malloc(m->blob_size);
        if (!m->blob) {
            free(m);
            return failf("out of memory");
        }
        float *p = m->blob;
        for (size_t k = 0; k < m->blob_size / 4; k++)
            p[k] = 0.5f;
        embedded_live += (long)m->blob_size;
        m->blob_buf = 0;
    }
    *out = m;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerDelete(void *h)
{
    fake_container *m = h;
    if (!m)
        return failf("Delete: NULL container");
    if (m == last_container)
        last_container = NULL;
    free_folded(m, 0);
    free_folded(m, 1);
    free_blob(m);
    pthread_rwlock_destroy(&m->lock);
    free(m);
    return 0;
}

EXPORT int32_t AOTInductorModelContainerGetNumConstants(void *h, size_t *n)
{
    *n = (size_t)((fake_container *)h)->n_consts;
    return 0;
}

#define CONST_AT(h, i)                                                                             \
    fake_container *m = h;                                                                         \
    if (!m || (int)(i) >= m->n_consts)                                                             \
        return failf("constant index out of range");                                               \
    fake_const *c = &m->c[i]

EXPORT int32_t AOTInductorModelContainerGetConstantName(void *h, size_t i, const char **out)
{
    CONST_AT(h, i);
    *out = c->name;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerGetConstantOriginalFQN(void *h, size_t i, const char **out)
{
    CONST_AT(h, i);
    *out = c->fqn;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerGetConstantDtype(void *h, size_t i, int32_t *out)
{
    CONST_AT(h, i);
    *out = c->dtype;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerGetConstantDataSize(void *h, size_t i, size_t *out)
{
    CONST_AT(h, i);
    *out = c->size;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerGetConstantFromFolded(void *h, size_t i, bool *out)
{
    CONST_AT(h, i);
    *out = c->folded;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerGetConstantType(void *h, size_t i, int32_t *out)
{
    CONST_AT(h, i);
    *out = c->type;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerDidCallLoadConstants(void *h, bool *out)
{
    *out = ((fake_container *)h)->load_called;
    return 0;
}

static int blob_size_calls;

/* How often GetConstantsBlobSize was asked (upstream prints on stderr when
 * it fails). */
EXPORT int fake_aoti_blob_size_calls(void)
{
    return blob_size_calls;
}

EXPORT int32_t AOTInductorModelContainerGetConstantsBlobSize(void *h, uint64_t *out)
{
    fake_container *m = h;
    blob_size_calls++;
    if (!m->mmap)
        return failf("constant blob size is only available for mmap'd weights");
    *out = m->blob_size;
    return 0;
}

static int update(fake_container *m, const void *pairs_v, size_t n, bool use_inactive,
                  bool validate_full)
{
    const struct {
        const char *name;
        void *handle;
    } *pairs = pairs_v;
    int buf = use_inactive ? !m->active : m->active;
    for (size_t p = 0; p < n; p++) {
        int found = -1;
        for (int i = 0; i < m->n_consts; i++) {
            if (strcmp(m->c[i].name, pairs[p].name) == 0)
                found = i;
        }
        if (found < 0)
            return failf("update: unknown constant name");
        fake_tensor *t = tensor_ok(pairs[p].handle);
        if (!t || t->dtype != m->c[found].dtype)
            return failf("update: not a tensor, or wrong dtype");
        m->c[found].bound[buf] = t;
        m->c[found].borrowed[buf] = 0;
    }
    /* Upstream gives a buffer or tensor constant missing from an update of
     * the inactive buffer the active one's tensor. */
    for (int i = 0; use_inactive && i < m->n_consts; i++) {
        fake_const *c = &m->c[i];
        int given = 0;
        for (size_t p = 0; p < n; p++)
            given |= strcmp(c->name, pairs[p].name) == 0;
        if (given || c->folded || (c->type != 2 && c->type != 3))
            continue;
        if (!const_data(m, i, !buf))
            return failf("update: a buffer missing from the inactive update is not in the active "
                         "buffer either (upstream dereferences a missing entry)");
        c->bound[buf] = c->bound[!buf];
        c->borrowed[buf] = !c->bound[!buf];
    }
    if (validate_full) {
        for (int i = 0; i < m->n_consts; i++) {
            const fake_const *c = &m->c[i];
            if (c->folded || c->bound[buf])
                continue;
            if (c->type == 1 && c->size > 0)
                return failf("update: validate_full_update and a parameter is missing");
            fprintf(stderr, "fake_aoti: update: constant %s is missing (not a parameter)\n",
                    c->name);
        }
    }
    m->folded_ok[buf] = 0;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerUpdateUserManagedConstantBufferPairs(
    void *h, const void *pairs, size_t n, bool use_inactive, bool validate_full)
{
    return update(h, pairs, n, use_inactive, validate_full);
}

EXPORT int32_t AOTInductorModelContainerRunConstantFolding(void *h, bool use_inactive, void *stream,
                                                           void *proxy)
{
    (void)stream;
    (void)proxy;
    fake_container *m = h;
    if (use_inactive)
        pthread_rwlock_rdlock(&m->lock);
    else
        pthread_rwlock_wrlock(&m->lock);
    int rc = do_fold(m, use_inactive ? !m->active : m->active);
    pthread_rwlock_unlock(&m->lock);
    return rc;
}

#ifndef FAKE_AOTI_NO_SWAP
EXPORT int32_t AOTInductorModelContainerSwapConstantBuffer(void *h)
{
    fake_container *m = h;
    pthread_rwlock_wrlock(&m->lock);
    m->active = !m->active;
    pthread_rwlock_unlock(&m->lock);
    return 0;
}

EXPORT int32_t AOTInductorModelContainerFreeInactiveConstantBuffer(void *h)
{
    fake_container *m = h;
    int inactive = !m->active;
    if (m->blob && m->blob_buf == inactive)
        free_blob(m);
    free_folded(m, inactive);
    for (int i = 0; i < m->n_consts; i++) {
        m->c[i].bound[inactive] = NULL;
        m->c[i].borrowed[inactive] = 0;
    }
    return 0;
}

#endif

EXPORT int32_t AOTInductorModelContainerGetNumInputs(void *h, size_t *n)
{
    (void)h;
    *n = 1;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerGetNumOutputs(void *h, size_t *n)
{
    (void)h;
    *n = 1;
    return 0;
}

static void pause_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

EXPORT int32_t AOTInductorModelContainerRun(void *h, void **inputs, size_t n_in, void **outputs,
                                            size_t n_out, void *stream, void *proxy)
{
    (void)stream;
    (void)proxy;
    fake_container *m = h;
    int rc = 0;
    fake_tensor *x = n_in == 1 ? tensor_ok(inputs[0]) : NULL;
    pthread_rwlock_rdlock(&m->lock);
    /* Upstream folds on the first run after an update, exclusively. */
    if (has_folded(m) && !m->folded_ok[m->active]) {
        pthread_rwlock_unlock(&m->lock);
        pthread_rwlock_wrlock(&m->lock);
        if (!m->folded_ok[m->active] && const_data(m, 0, m->active))
            rc = do_fold(m, m->active);
        pthread_rwlock_unlock(&m->lock);
        pthread_rwlock_rdlock(&m->lock);
    }
    /* The active buffer, read once for the whole run. */
    int buf = m->active;
    const float *w = const_data(m, 0, buf), *b = const_data(m, 1, buf);
    const float *fw = NULL;
    for (int i = 0; i < m->n_consts; i++) {
        if (m->c[i].folded)
            fw = m->c[i].folded_data[buf];
    }
    if (rc != 0)
        ;
    else if (!x || n_out != 1 || x->dtype != DTYPE_F32 || x->ndim != 1 ||
             x->sizes[0] != m->elements)
        rc = failf("Run: expects one float32 input of `elements` values and one output");
    else if (!w || !b)
        rc = failf("Run: constants are not bound");
    else if (has_folded(m) && !fw)
        rc = failf("Run: the folded constants were not built");
    for (int i = 2; rc == 0 && i < m->n_consts; i++) {
        if ((m->c[i].type == 2 || m->c[i].type == 3) && !const_data(m, i, buf))
            rc = failf(m->c[i].borrowed[buf]
                           ? "Run: a buffer reads the library's copy, which "
                             "FreeInactiveConstantBuffer freed (upstream: a use after free)"
                           : "Run: a buffer or tensor constant is not bound");
    }
    float *y = rc == 0 ? malloc((size_t)m->elements * 4) : NULL;
    if (rc == 0 && !y)
        rc = failf("out of memory");
    if (rc == 0) {
        const float *xd = x->data;
        long step = m->run_delay_us > 0 ? m->run_delay_us / m->elements : 0;
        for (long k = 0; k < m->elements; k++) {
            if (step)
                pause_us(step);
            y[k] = xd[k] * (fw ? fw[k] / 2.0f : w[k]) + b[k];
            for (int i = 2; i < m->n_consts; i++) {
                if (m->c[i].type == 2 || m->c[i].type == 3)
                    y[k] += const_data(m, i, buf)[k];
            }
        }
        int64_t size = m->elements, stride = 1;
        void *out = NULL;
        aoti_torch_create_tensor_from_blob(y, 1, &size, &stride, 0, DTYPE_F32, 0, 0, &out);
        ((fake_tensor *)out)->owns = 1;
        outputs[0] = out;
    }
    pthread_rwlock_unlock(&m->lock);
    /* Inputs are stolen, also on failure. */
    for (size_t i = 0; i < n_in; i++) {
        if (tensor_ok(inputs[i]))
            aoti_torch_delete_tensor_object(inputs[i]);
    }
    return rc;
}

#ifdef FAKE_AOTI_V214
/* The constants the active or inactive buffer holds, by FQN: bound ones and
 * the library's own copies. The array lives until the next call. */
EXPORT int32_t AOTInductorModelContainerExtractConstantsMapEntries(void *h, const void **entries,
                                                                   size_t *n, bool use_inactive)
{
    fake_container *m = h;
    if (!m || !entries || !n)
        return failf("ExtractConstantsMapEntries: bad arguments");
    int buf = use_inactive ? !m->active : m->active;
    size_t k = 0;
    for (int i = 0; i < m->n_consts; i++) {
        if (m->c[i].folded || !const_data(m, i, buf))
            continue;
        m->entries[k].name = m->c[i].fqn;
        m->entries[k].handle = m->c[i].bound[buf];
        k++;
    }
    *entries = k ? (const void *)m->entries : NULL;
    *n = k;
    return 0;
}

EXPORT int32_t AOTInductorSetUsePinnedAsyncConstantsCopy(bool enabled)
{
    pinned_async = enabled;
    return 0;
}

EXPORT int32_t AOTInductorGetLastError(const char **msg)
{
    *msg = last_error;
    return 0;
}

EXPORT int32_t AOTInductorModelContainerCreateWithExternalConstants(void **out, size_t num_models,
                                                                    const char *device,
                                                                    const char *cubin,
                                                                    const void *entries, size_t n)
{
    (void)cubin;
    if (!out || num_models < 1 || !device || strcmp(device, "cpu") != 0)
        return failf("CreateWithExternalConstants: the fake runs on \"cpu\" only");
    fake_container *m = new_container();
    if (!m)
        return 1;
    /* As upstream: the entries are validated like a full update (a missing
     * parameter fails, so zero entries is no "describe only" call) and
     * folding runs now. */
    if (update(m, entries, n, false, true) != 0 || (has_folded(m) && do_fold(m, 0) != 0)) {
        AOTInductorModelContainerDelete(m);
        return 1;
    }
    *out = m;
    return 0;
}
#endif
