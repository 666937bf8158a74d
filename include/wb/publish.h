/* libwbclient: publishing a new version of a model from a live process.
 *
 * A producer (a trainer, a fine-tuning job) makes a new version of a model
 * out of tensors in its own memory, without writing a checkpoint. The
 * broker pulls: the producer exports its memory and the broker copies it
 * into the new version's slabs, then makes the version current as a
 * rollout does (subscribers get a notice, followers swap it in).
 *
 *     wb_publish_options o;
 *     wb_publish_options_init(&o);
 *     o.tensors = table;  o.n_tensors = n;       // names, dtypes, shapes
 *     wb_publisher *p = NULL;
 *     if (wb_publish_begin(client, "base", &o, &p) != WB_OK) ...
 *     for (i = 0; i < n; i++)
 *         if (wb_publish_tensor(p, table[i].name, data[i], nbytes[i]) != WB_OK) ...
 *     uint32_t version;
 *     rc = wb_publish_commit(&p, &version);      // p is NULL after it
 *
 * Sources. A tensor's bytes are either device memory (a pointer that
 * cudaPointerGetAttributes calls device memory) or host memory (anything
 * else, and every pointer in a build without CUDA):
 *   - host bytes are copied into one memfd of the publisher at
 *     wb_publish_tensor (256-byte aligned), so the caller may reuse or free
 *     that memory as soon as the call returns;
 *   - device memory is exported, not copied: the allocation around the
 *     pointer (cuMemGetAddressRange) is exported once per allocation with
 *     cudaIpcGetMemHandle and the broker copies from it during the commit.
 *     Device tensors must stay allocated and unchanged from
 *     wb_publish_tensor until wb_publish_commit returns, and every write to
 *     them must have completed (synchronise the streams that wrote them)
 *     before wb_publish_commit is called. Memory that cudaIpcGetMemHandle
 *     cannot export (cuMemCreate allocations, such as PyTorch's expandable
 *     segments; managed memory) is refused with WB_ENOSYS naming the tensor.
 * A broker copies host sources only into host slabs (the host backend) and
 * device sources only into device slabs (the cuda backend); it refuses the
 * commit otherwise.
 *
 * Ownership and threads. A publisher belongs to the client it was begun on
 * (which must outlive it) and is used by one thread at a time; other
 * threads may use the client meanwhile: the client's lock is held only
 * around the exchanges of begin, commit and abort. wb_publish_commit and
 * wb_publish_abort free the publisher, whatever the outcome, and set the
 * pointer to NULL. One publish at a time per model (the broker refuses a
 * second with WB_EBUSY).
 *
 * A publish ends with its commit or its abort, or with its producer: the
 * broker ends a publish whose connection closes or whose process dies
 * (the reserved version is freed, the current one is left as it was). A
 * child after fork() cannot use its parent's publisher (WB_ESTATE). A
 * reconnection of the client between begin and commit (the broker
 * restarted, or an exchange timed out) also ends it: the commit then fails
 * and the producer begins again. */
#ifndef WB_PUBLISH_H
#define WB_PUBLISH_H

#include "wb/client.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wb_publisher wb_publisher;

/* One tensor of the new version's table. The strings and the shape are the
 * caller's, read during wb_publish_begin only. (Not "wb_publish_tensor":
 * that is the function that gives a tensor's bytes.) */
typedef struct wb_publish_desc {
    const char *name;
    const char *dtype;     /* as safetensors spells it: "F32", "BF16", ... */
    uint32_t ndim;         /* 0 for a scalar */
    const uint64_t *shape; /* ndim entries */
} wb_publish_desc;

typedef struct wb_publish_options {
    /* The new version's table. For a model the broker has, every tensor
     * must be one of its current version's, with the same dtype and shape;
     * for a new model name (which needs the broker administrator's right to
     * load) it is the new model's table. */
    const wb_publish_desc *tensors;
    size_t n_tensors;
    /* 0: the table names every tensor of the current version. 1: only the
     * tensors named are published; the others keep the current version's
     * bytes (the broker copies them). */
    int partial;
    /* A new model only: where the broker places it, as wbctl load's
     * --placement (NULL: the broker's default). */
    const char *placement;
} wb_publish_options;

/* Zeroes the options. */
WB_EXPORT void wb_publish_options_init(wb_publish_options *opts);

/* Begins a publish of `model`: checks the table here (names non-empty and
 * unique, known dtypes, sizes that fit; WB_EINVAL naming the tensor), sends
 * it with each tensor's nbytes (its elements times its dtype's size) and
 * waits for the broker to reserve the version (the client's timeout). The
 * broker refuses what it cannot publish: WB_EPERM without the publisher
 * right, WB_ELIMIT without the space (the bytes needed and free), WB_EBUSY
 * while another publish of the model is open, WB_EINVAL for a table that is
 * not the current version's. A broker without publishing gives WB_EPROTO,
 * "publish 'M': the broker does not know publishing (it answered: ...)".
 *
 * On success *out is a new publisher (end it with wb_publish_commit or
 * wb_publish_abort). On failure *out is NULL and wb_client_errmsg(client)
 * says why. */
WB_EXPORT int wb_publish_begin(wb_client *client, const char *model, const wb_publish_options *opts,
                               wb_publisher **out);

/* Gives the bytes of tensor `name` of the table: `nbytes` must be its size.
 * No exchange with the broker. Host bytes are copied at once (see
 * "Sources" above); device memory is exported and must stay unchanged
 * until the commit returns. WB_ENOTFOUND for a name not in the table,
 * WB_EINVAL for a size that is not the tensor's, a NULL pointer with bytes
 * to give, or a tensor given twice; WB_ENOSYS for device memory that cannot
 * be exported; WB_EIO when the memfd cannot grow. A refused call changes
 * nothing: the publisher stays usable. The message is in
 * wb_publish_errmsg(p). */
WB_EXPORT int wb_publish_tensor(wb_publisher *p, const char *name, const void *data,
                                uint64_t nbytes);

/* What a commit did, as the broker measured it. */
typedef struct wb_publish_info {
    uint32_t version;          /* now current */
    uint32_t previous_version; /* current before it; 0 for a new model */
    double current_at;         /* Unix time (seconds) it became current */
    double copy_seconds;       /* the broker's copies of the producer's bytes */
    uint64_t copied_bytes;     /* bytes copied from the producer */
    uint64_t kept_bytes;       /* partial: bytes kept from the current version */
} wb_publish_info;

/* Commits: every tensor of the table must have been given (else WB_EINVAL
 * naming the first one missing, and the publish is aborted). Sends the
 * host bytes' memfd on the descriptor channel (sealed first, so that it
 * cannot change under the broker's copy), then where each tensor is, and
 * waits for the broker to copy them all and make the version current: the
 * client's timeout, at least 60 seconds (a large copy). On WB_OK *version
 * (when not NULL) is the version now current. The producer's device
 * tensors may change again once this returns, whatever it returns.
 *
 * Frees the publisher and sets *p to NULL in every case; the message of a
 * failure is in wb_client_errmsg of the publisher's client. NULL or *p NULL
 * is WB_EINVAL. */
WB_EXPORT int wb_publish_commit(wb_publisher **p, uint32_t *version);
/* The same, with what the commit did in *info (when not NULL; zeroed on
 * failure). */
WB_EXPORT int wb_publish_commit_ex(wb_publisher **p, wb_publish_info *info);

/* Tells the broker to end the publish (the reserved version is freed, the
 * current one untouched), then frees the publisher and sets *p to NULL.
 * NULL, or *p NULL, does nothing. A broker that cannot be told ends the
 * publish with the connection. */
WB_EXPORT void wb_publish_abort(wb_publisher **p);

/* The message of the publisher's last failed call (wb_publish_tensor), ""
 * when none; owned by the publisher. "" for NULL. */
WB_EXPORT const char *wb_publish_errmsg(const wb_publisher *p);

/* The version the publish becomes at commit (PublishBeginReply.version),
 * and the slab bytes the broker reserved for it. 0 for NULL. */
WB_EXPORT uint32_t wb_publish_version(const wb_publisher *p);
WB_EXPORT uint64_t wb_publish_reserved_bytes(const wb_publisher *p);

#ifdef __cplusplus
}
#endif

#endif
