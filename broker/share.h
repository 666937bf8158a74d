/* Tensors shared across models: a tensor equal to one already resident on
 * the same device (same dtype, shape and bytes) is not loaded again; the new
 * model's table points at the bytes already there.
 *
 * The index lists every shareable slab (a hold): the slab of one copy of a
 * loaded model, with the tensors that live in it (their XXH3-64, dtype,
 * shape, offset). A load asks the index before it allocates anything
 * (wb__share_apply): the tensors whose digest, dtype and shape match a listed
 * one are compared byte for byte (the file's bytes against the slab's,
 * never assumed from the digest), and those that are equal are left out of
 * the new slab. The new model borrows the holds it points into, on every
 * device it is placed on (a tensor is shared only where the same load's
 * copies hold it on each of them), and the lease lists them as its slabs 1..n
 * after its own at 0.
 *
 * Holds are reference-counted: one count per model data that borrows them.
 * When the owner of a hold goes while it is borrowed, the slab stays (the
 * hold keeps it, "orphaned") and is freed with its last borrower. Only
 * read-only transports share (a client can write a legacy CUDA IPC slab).
 *
 * Thread-safe: the loader thread asks the index and registers what it
 * loaded; the loop frees models. One mutex guards the list and the counts. */
#ifndef WB_BROKER_SHARE_H
#define WB_BROKER_SHARE_H

#include "backend.h"
#include "err.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct wb_model_data;
struct wb_st_table;

/* Slabs a model borrows at most (its lease's slabs: the descriptor
 * channel's 16 less its own). */
#define WB_SHARE_MAX_GROUPS 15

typedef struct wb_share_index wb_share_index;
typedef struct wb_share_hold wb_share_hold;

/* A new, empty index; NULL when out of memory. ignore_digest: a test hook
 * (WB_TEST_SHARE_IGNORE_DIGEST=1 in wbrokerd's environment) that takes
 * every tensor of the same dtype and shape for a candidate whatever its
 * digest, as a crafted collision would: only the byte comparison then
 * keeps unequal tensors apart. */
wb_share_index *wb__share_index_new(int ignore_digest);
/* Frees the index; holds still listed (none once every model is freed) have
 * their slabs freed. */
void wb__share_index_free(wb_share_index **ix);

/* What the index holds now: slabs listed, and the bytes of slabs whose
 * owner went and that stay for their borrowers (orphaned). */
typedef struct wb_share_stats {
    uint32_t holds;
    uint32_t orphans;
    uint64_t orphan_slab_bytes;
    uint64_t orphan_tensor_bytes;
    uint64_t shared_tensors_total; /* tensors loads left out, since start */
    uint64_t shared_bytes_total;
    uint64_t mismatches_total; /* candidates whose bytes differed */
} wb_share_stats;
void wb__share_stats(wb_share_index *ix, wb_share_stats *out);

/* Called by the loader after the layout of d (one slab per device, every
 * tensor at slab 0) and before anything is allocated. Hashes the tensors that
 * have a candidate (reading the checkpoint's files through fds, in `threads`
 * threads), compares the matches' bytes, and lays out again: shared tensors
 * at slab 1..n (d->borrowed, d->n_groups), the others packed in the own slab
 * whose size goes to *size. devs: the copies' devices in order (n of
 * them). Nothing shared: d unchanged. Errors: reading the files (WB_EIO,
 * naming the file and tensor), out of memory, cancelled. */
int wb__share_apply(wb_share_index *ix, const wb_backend *be, const int *devs, unsigned n,
                    const struct wb_st_table *table, const int *fds, unsigned threads,
                    const atomic_int *cancel, struct wb_model_data *d, uint64_t *size, wb_err *err);

/* A partial publish's kept tensors (named[i] 0) borrow the bytes of the
 * version `from` they are kept from (its own slabs' holds, or those it
 * borrows itself) instead of a copy: d's layout (every tensor at slab 0)
 * is redone, the named tensors packed in the own slab (*size), and a count
 * taken on each hold. n: the copies (from's, in the same order). Returns
 * 1, or 0 with d unchanged when `from` does not lend them (not listed in
 * the index, a failed copy, too many groups, out of memory): then they are
 * copied. */
int wb__share_keep(const struct wb_model_data *from, const uint8_t *named, unsigned n,
                   struct wb_model_data *d, uint64_t *size);

/* Lists the ready copies' own slabs of d (a load that ended well), so that
 * later loads can share their tensors; d->holds gets one entry per slab.
 * Out of memory: not listed (nothing is shared from it). */
void wb__share_register(wb_share_index *ix, const wb_backend *be, struct wb_model_data *d);

/* Bytes of orphaned slabs on `device` (kept for their borrowers). */
uint64_t wb__share_orphan_bytes_on(wb_share_index *ix, int device);
/* 1 while another model borrows from the hold (or a load compares it). */
int wb__share_borrowed(wb_share_hold *h);

/* The hold's slab now (the owner's, or its own once orphaned). Loop thread
 * or a holder of a count. */
wb_slab *wb__share_slab(wb_share_hold *h);
/* The same, copied under the index's lock: for the loader thread, whose
 * reads a concurrent orphaning must not race. */
void wb__share_slab_copy(wb_share_hold *h, wb_slab *out);

/* Called when the owner frees its slab k (wb__model_data_free): 1 when the
 * caller frees the slab as before (nobody borrows it; the hold is gone), 0
 * when the hold took it over for its borrowers. */
int wb__share_release_owner(wb_share_hold *h, wb_slab *slab);
/* Drops a borrower's count; the last one of an orphaned hold frees it. */
void wb__share_unref(wb_share_hold *h);

#endif
