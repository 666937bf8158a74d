#include "share.h"

#include "alloc.h"
#include "clock.h"
#include "log.h"
#include "models.h"
#include "safetensors_table.h"
#include "stage.h"
#include "xxh.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* One tensor that lives in a hold's slab (copied from its owner's table). */
typedef struct entry {
    uint64_t xxh3;
    uint64_t nbytes;
    uint64_t offset;
    char dtype[16];
    uint32_t ndim;
    uint64_t *shape; /* owned */
} entry;

struct wb_share_hold {
    wb_share_index *ix;
    const wb_backend *be;
    wb_slab *slab; /* the owner's, or &own once orphaned */
    wb_slab own;
    int orphan;
    uint64_t origin; /* the load whose copies these are; the same on each device */
    int device;
    uint32_t refs; /* borrowers */
    size_t n;
    entry *e;
    uint64_t tensor_bytes;
    wb_share_hold *prev, *next;
};

struct wb_share_index {
    pthread_mutex_t mu;
    wb_share_hold *head;
    uint64_t serial;
    int ignore_digest;
    uint64_t shared_tensors_total, shared_bytes_total, mismatches_total;
};

wb_share_index *wb__share_index_new(int ignore_digest)
{
    wb_share_index *ix = wb__calloc(1, sizeof *ix);
    if (!ix)
        return NULL;
    pthread_mutex_init(&ix->mu, NULL);
    ix->ignore_digest = ignore_digest;
    return ix;
}

static void hold_free(wb_share_hold *h)
{
    for (size_t i = 0; i < h->n; i++)
        free(h->e[i].shape);
    free(h->e);
    free(h);
}

/* Under the lock. */
static void unlist(wb_share_index *ix, wb_share_hold *h)
{
    if (h->prev)
        h->prev->next = h->next;
    else
        ix->head = h->next;
    if (h->next)
        h->next->prev = h->prev;
    h->prev = h->next = NULL;
}

void wb__share_index_free(wb_share_index **ixp)
{
    if (!ixp || !*ixp)
        return;
    wb_share_index *ix = *ixp;
    while (ix->head) {
        wb_share_hold *h = ix->head;
        unlist(ix, h);
        if (h->orphan)
            h->be->slab_free(&h->own);
        hold_free(h);
    }
    pthread_mutex_destroy(&ix->mu);
    free(ix);
    *ixp = NULL;
}

void wb__share_stats(wb_share_index *ix, wb_share_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!ix)
        return;
    pthread_mutex_lock(&ix->mu);
    for (wb_share_hold *h = ix->head; h; h = h->next) {
        out->holds++;
        if (h->orphan) {
            out->orphans++;
            out->orphan_slab_bytes += h->own.size;
            out->orphan_tensor_bytes += h->tensor_bytes;
        }
    }
    out->shared_tensors_total = ix->shared_tensors_total;
    out->shared_bytes_total = ix->shared_bytes_total;
    out->mismatches_total = ix->mismatches_total;
    pthread_mutex_unlock(&ix->mu);
}

uint64_t wb__share_orphan_bytes_on(wb_share_index *ix, int device)
{
    uint64_t n = 0;
    if (!ix)
        return 0;
    pthread_mutex_lock(&ix->mu);
    for (wb_share_hold *h = ix->head; h; h = h->next)
        if (h->orphan && h->device == device)
            n += h->own.size;
    pthread_mutex_unlock(&ix->mu);
    return n;
}

int wb__share_borrowed(wb_share_hold *h)
{
    pthread_mutex_lock(&h->ix->mu);
    int borrowed = h->refs > 0;
    pthread_mutex_unlock(&h->ix->mu);
    return borrowed;
}

wb_slab *wb__share_slab(wb_share_hold *h)
{
    pthread_mutex_lock(&h->ix->mu);
    wb_slab *s = h->slab;
    pthread_mutex_unlock(&h->ix->mu);
    return s;
}

void wb__share_slab_copy(wb_share_hold *h, wb_slab *out)
{
    pthread_mutex_lock(&h->ix->mu);
    *out = *h->slab;
    pthread_mutex_unlock(&h->ix->mu);
}

int wb__share_release_owner(wb_share_hold *h, wb_slab *slab)
{
    wb_share_index *ix = h->ix;
    pthread_mutex_lock(&ix->mu);
    if (h->refs == 0) {
        unlist(ix, h);
        pthread_mutex_unlock(&ix->mu);
        hold_free(h);
        return 1;
    }
    h->own = *slab;
    h->slab = &h->own;
    h->orphan = 1;
    pthread_mutex_unlock(&ix->mu);
    return 0;
}

void wb__share_unref(wb_share_hold *h)
{
    wb_share_index *ix = h->ix;
    pthread_mutex_lock(&ix->mu);
    if (h->refs)
        h->refs--;
    int last = h->refs == 0 && h->orphan;
    if (last)
        unlist(ix, h);
    pthread_mutex_unlock(&ix->mu);
    if (last) {
        h->be->slab_free(&h->own);
        hold_free(h);
    }
}

void wb__share_register(wb_share_index *ix, const wb_backend *be, wb_model_data *d)
{
    if (!ix || !d->n_slabs)
        return;
    d->holds = wb__calloc(d->n_slabs, sizeof *d->holds);
    if (!d->holds)
        return;
    size_t own = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < d->n_tensors; i++) {
        if (d->tensors[i].slab == 0) {
            own++;
            bytes += d->tensors[i].nbytes;
        }
    }
    pthread_mutex_lock(&ix->mu);
    uint64_t origin = ++ix->serial;
    pthread_mutex_unlock(&ix->mu);
    for (uint32_t k = 0; k < d->n_slabs; k++) {
        if (k < d->n_copies && d->copies[k].state != WBPROTO__MODEL_STATE__MODEL_READY)
            continue;
        wb_share_hold *h = wb__calloc(1, sizeof *h);
        entry *e = h ? wb__calloc(own ? own : 1, sizeof *e) : NULL;
        if (!e) {
            free(h);
            continue;
        }
        h->ix = ix;
        h->be = be;
        h->slab = &d->slabs[k];
        h->origin = origin;
        h->device = d->slabs[k].device;
        h->e = e;
        h->tensor_bytes = bytes;
        int ok = 1;
        for (size_t i = 0; ok && i < d->n_tensors; i++) {
            const wb_model_tensor *t = &d->tensors[i];
            if (t->slab != 0)
                continue;
            entry *x = &e[h->n];
            x->xxh3 = t->xxh3;
            x->nbytes = t->nbytes;
            x->offset = t->offset;
            memcpy(x->dtype, t->dtype, sizeof x->dtype);
            x->ndim = t->ndim;
            if (t->ndim) {
                x->shape = wb__malloc(t->ndim * sizeof *x->shape);
                if (!x->shape) {
                    ok = 0;
                    break;
                }
                memcpy(x->shape, t->shape, t->ndim * sizeof *x->shape);
            }
            h->n++;
        }
        if (!ok) {
            hold_free(h);
            continue;
        }
        pthread_mutex_lock(&ix->mu);
        h->next = ix->head;
        if (ix->head)
            ix->head->prev = h;
        ix->head = h;
        pthread_mutex_unlock(&ix->mu);
        d->holds[k] = h;
    }
}

/* ---- a load's plan ------------------------------------------------------ */

/* A listed tensor a load may point at: the hold (one count taken for the
 * load's snapshot) and its slab as it was then. */
typedef struct cand {
    const entry *e;
    wb_share_hold *h;
    size_t hold; /* its index in the snapshot (plan.holds, plan.slabs) */
} cand;

typedef struct plan {
    const wb_backend *be;
    const wb_st_table *table;
    const int *fds;
    const atomic_int *cancel;
    wb_model_data *d;
    const int *devs;
    unsigned n_devs;
    /* The snapshot: every listed hold of the backend on one of devs, each
     * with one count, and its slab copied. */
    size_t n_holds;
    wb_share_hold **holds;
    wb_slab *slabs;
    cand *cands; /* the holds' entries on devs[0], by nbytes */
    size_t n_cands;
    /* Per tensor of d: a candidate exists (1), its digest from the file,
     * and the match found (index into cands, or -1). */
    uint8_t *want;
    uint64_t *xxh3;
    long *match;
    int *equal;
    /* Work shared by the threads. */
    atomic_size_t next;
    pthread_mutex_t mu;
    int rc; /* the first error (err), under mu; `failed` says there is one */
    wb_err err;
    atomic_int failed;
    int verifying;
} plan;

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->e->nbytes != y->e->nbytes)
        return x->e->nbytes < y->e->nbytes ? -1 : 1;
    return x->e->xxh3 < y->e->xxh3 ? -1 : x->e->xxh3 > y->e->xxh3;
}

static int same_kind(const entry *e, const wb_model_tensor *t)
{
    if (e->nbytes != t->nbytes || e->ndim != t->ndim || strcmp(e->dtype, t->dtype) != 0)
        return 0;
    return t->ndim == 0 || memcmp(e->shape, t->shape, t->ndim * sizeof *t->shape) == 0;
}

/* The first candidate of t's size (cands are sorted by nbytes). */
static size_t first_of_size(const plan *p, uint64_t nbytes)
{
    size_t lo = 0, hi = p->n_cands;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->cands[mid].e->nbytes < nbytes)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void plan_fail(plan *p, int rc, const wb_err *e)
{
    pthread_mutex_lock(&p->mu);
    if (p->rc == WB_OK) {
        p->rc = rc;
        p->err = *e;
    }
    pthread_mutex_unlock(&p->mu);
    atomic_store(&p->failed, 1);
}

enum { CHUNK = 4u << 20 };

/* Reads bytes [at, at + len) of tensor i from its file into buf. */
static int read_file(const plan *p, size_t i, uint64_t at, uint8_t *buf, size_t len, wb_err *err)
{
    const wb_st_tensor *st = &p->table->tensors[i];
    return wb__stage_read_full(p->fds[st->file], buf, len, st->offset + at,
                               p->table->files[st->file], st->name, err);
}

static int hash_one(plan *p, size_t i, uint8_t *buf, XXH3_state_t *xs, wb_err *err)
{
    uint64_t n = p->d->tensors[i].nbytes;
    XXH3_64bits_reset(xs);
    for (uint64_t at = 0; at < n; at += CHUNK) {
        size_t len = (size_t)(n - at < CHUNK ? n - at : CHUNK);
        int rc = read_file(p, i, at, buf, len, err);
        if (rc != WB_OK)
            return rc;
        XXH3_64bits_update(xs, buf, len);
    }
    p->xxh3[i] = XXH3_64bits_digest(xs);
    return WB_OK;
}

/* The file's bytes of tensor i against the candidate's. */
static int verify_one(plan *p, size_t i, uint8_t *buf, uint8_t *theirs, wb_err *err)
{
    const cand *c = &p->cands[p->match[i]];
    const wb_slab *slab = &p->slabs[c->hold];
    uint64_t n = p->d->tensors[i].nbytes;
    for (uint64_t at = 0; at < n; at += CHUNK) {
        size_t len = (size_t)(n - at < CHUNK ? n - at : CHUNK);
        int rc = read_file(p, i, at, buf, len, err);
        if (rc == WB_OK)
            rc = p->be->slab_read(slab, c->e->offset + at, theirs, len, err);
        if (rc != WB_OK)
            return rc;
        if (memcmp(buf, theirs, len) != 0)
            return WB_OK; /* p->equal[i] stays 0 */
    }
    p->equal[i] = 1;
    return WB_OK;
}

static void *worker(void *arg)
{
    plan *p = arg;
    uint8_t *buf = wb__malloc(CHUNK);
    uint8_t *theirs = p->verifying ? wb__malloc(CHUNK) : NULL;
    XXH3_state_t *xs = XXH3_createState();
    wb_err e;
    if (!buf || !xs || (p->verifying && !theirs)) {
        wb__err_set(&e, WB_ENOMEM, "out of memory comparing tensors");
        plan_fail(p, WB_ENOMEM, &e);
    }
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->d->n_tensors || atomic_load(&p->failed))
            break;
        if (p->cancel && atomic_load(p->cancel)) {
            wb__err_set(&e, WB_ESTATE, "the load was cancelled (the broker is stopping)");
            plan_fail(p, WB_ESTATE, &e);
            break;
        }
        int rc = WB_OK;
        if (!p->verifying && p->want[i])
            rc = hash_one(p, i, buf, xs, &e);
        else if (p->verifying && p->match[i] >= 0)
            rc = verify_one(p, i, buf, theirs, &e);
        if (rc != WB_OK)
            plan_fail(p, rc, &e);
    }
    free(buf);
    free(theirs);
    if (xs)
        XXH3_freeState(xs);
    return NULL;
}

static int run_threads(plan *p, unsigned threads, int verifying)
{
    p->verifying = verifying;
    atomic_store(&p->next, 0);
    if (threads < 1)
        threads = 1;
    if (threads > 16)
        threads = 16;
    pthread_t tid[16];
    unsigned started = 0;
    for (unsigned k = 1; k < threads; k++) {
        if (pthread_create(&tid[started], NULL, worker, p) != 0)
            break;
        started++;
    }
    worker(p);
    for (unsigned k = 0; k < started; k++)
        pthread_join(tid[k], NULL);
    return p->rc;
}

/* Which of the load's devices hold h is on (its index in devs), or -1 when
 * the load cannot use it. */
static int hold_device(const plan *p, const wb_share_hold *h)
{
    for (unsigned k = 0; h->be == p->be && k < p->n_devs; k++) {
        if (h->device == p->devs[k])
            return (int)k;
    }
    return -1;
}

/* Takes the snapshot: a count on every listed hold of the backend on one of
 * the devices, its slab copied, and the candidates of devs[0]. */
static int snapshot(wb_share_index *ix, plan *p)
{
    pthread_mutex_lock(&ix->mu);
    size_t n = 0, ne = 0;
    for (wb_share_hold *h = ix->head; h; h = h->next) {
        int k = hold_device(p, h);
        n += k >= 0;
        ne += k == 0 ? h->n : 0;
    }
    p->holds = wb__calloc(n ? n : 1, sizeof *p->holds);
    p->slabs = wb__calloc(n ? n : 1, sizeof *p->slabs);
    p->cands = wb__calloc(ne ? ne : 1, sizeof *p->cands);
    if (!p->holds || !p->slabs || !p->cands) {
        pthread_mutex_unlock(&ix->mu);
        return WB_ENOMEM;
    }
    for (wb_share_hold *h = ix->head; h; h = h->next) {
        int k = hold_device(p, h);
        if (k < 0)
            continue;
        h->refs++;
        for (size_t j = 0; k == 0 && j < h->n; j++)
            p->cands[p->n_cands++] = (cand){.e = &h->e[j], .h = h, .hold = p->n_holds};
        p->slabs[p->n_holds] = *h->slab;
        p->holds[p->n_holds++] = h;
    }
    pthread_mutex_unlock(&ix->mu);
    qsort(p->cands, p->n_cands, sizeof *p->cands, cmp_cand);
    return WB_OK;
}

/* The hold of `origin` on device dev in the snapshot, or NULL. */
static wb_share_hold *hold_on(const plan *p, uint64_t origin, int dev)
{
    for (size_t i = 0; i < p->n_holds; i++) {
        if (p->holds[i]->origin == origin && p->holds[i]->device == dev)
            return p->holds[i];
    }
    return NULL;
}

static int on_every_device(const plan *p, uint64_t origin)
{
    for (unsigned k = 1; k < p->n_devs; k++) {
        if (!hold_on(p, origin, p->devs[k]))
            return 0;
    }
    return 1;
}

/* The first candidate for tensor t of the same dtype and shape; with a
 * digest (not NULL), also of that digest (unless the test hook ignores
 * digests) and held on every device of the load. -1: none. */
static long first_candidate(const plan *p, const wb_model_tensor *t, const uint64_t *digest,
                            int ignore_digest)
{
    for (size_t c = first_of_size(p, t->nbytes);
         c < p->n_cands && p->cands[c].e->nbytes == t->nbytes; c++) {
        const entry *e = p->cands[c].e;
        if (!same_kind(e, t))
            continue;
        if (!digest)
            return (long)c;
        if ((ignore_digest || e->xxh3 == *digest) && on_every_device(p, p->cands[c].h->origin))
            return (long)c;
    }
    return -1;
}

static void find_matches(wb_share_index *ix, plan *p)
{
    for (size_t i = 0; i < p->d->n_tensors; i++)
        p->match[i] =
            p->want[i] ? first_candidate(p, &p->d->tensors[i], &p->xxh3[i], ix->ignore_digest) : -1;
}

/* The groups (donor loads) the equal tensors point into, at most `max`, and
 * the new layout. */
/* Tensor t at the next aligned offset of its model's own slab. */
static void place_own(wb_model_tensor *t, uint64_t *off)
{
    uint64_t aligned = (*off + (WB_SLAB_ALIGN - 1)) & ~(uint64_t)(WB_SLAB_ALIGN - 1);
    t->slab = 0;
    t->offset = aligned;
    *off = aligned + t->nbytes;
}

static int relayout(wb_share_index *ix, plan *p, uint64_t *size, wb_err *err)
{
    wb_model_data *d = p->d;
    uint64_t origins[WB_SHARE_MAX_GROUPS];
    uint32_t ng = 0;
    long *group = wb__calloc(d->n_tensors ? d->n_tensors : 1, sizeof *group);
    if (!group)
        return wb__err_set(err, WB_ENOMEM, "out of memory sharing tensors");
    for (size_t i = 0; i < d->n_tensors; i++) {
        group[i] = -1;
        if (p->match[i] < 0 || !p->equal[i])
            continue;
        uint64_t o = p->cands[p->match[i]].h->origin;
        uint32_t g = 0;
        while (g < ng && origins[g] != o)
            g++;
        if (g == ng) {
            if (ng == WB_SHARE_MAX_GROUPS)
                continue;
            origins[ng++] = o;
        }
        group[i] = g;
    }
    if (ng == 0) {
        free(group);
        return WB_OK;
    }
    d->borrowed = wb__calloc((size_t)ng * p->n_devs, sizeof *d->borrowed);
    if (!d->borrowed) {
        free(group);
        return wb__err_set(err, WB_ENOMEM, "out of memory sharing tensors");
    }
    /* Each group's hold on each device gets the load's own count (its
     * snapshot count moves to d). */
    pthread_mutex_lock(&ix->mu);
    for (uint32_t g = 0; g < ng; g++) {
        for (unsigned k = 0; k < p->n_devs; k++) {
            wb_share_hold *h = hold_on(p, origins[g], p->devs[k]);
            h->refs++;
            d->borrowed[g * p->n_devs + k] = h;
        }
    }
    pthread_mutex_unlock(&ix->mu);
    d->n_groups = ng;
    d->n_stride = p->n_devs;
    uint64_t off = 0;
    for (size_t i = 0; i < d->n_tensors; i++) {
        wb_model_tensor *t = &d->tensors[i];
        if (group[i] >= 0) {
            t->slab = (uint32_t)group[i] + 1;
            t->offset = p->cands[p->match[i]].e->offset;
            t->xxh3 = p->cands[p->match[i]].e->xxh3;
            d->shared_bytes += t->nbytes;
            d->shared_tensors++;
            continue;
        }
        place_own(t, &off);
    }
    /* A model whose every tensor is shared still has a slab of its own. */
    *size = off ? off : WB_SLAB_ALIGN;
    free(group);
    return WB_OK;
}

int wb__share_keep(const wb_model_data *from, const uint8_t *named, unsigned n, wb_model_data *d,
                   uint64_t *size)
{
    if (!from->holds || from->n_slabs != n || from->n_tensors != d->n_tensors || d->borrowed)
        return 0;
    for (unsigned k = 0; k < n; k++)
        if (!from->holds[k])
            return 0;
    /* Source group 0 is from's own slab, g + 1 its borrowed group g. */
    int map[WB_SHARE_MAX_GROUPS + 1];
    for (size_t g = 0; g <= WB_SHARE_MAX_GROUPS; g++)
        map[g] = -1;
    uint32_t ng = 0;
    for (size_t i = 0; i < d->n_tensors; i++) {
        uint32_t src = from->tensors[i].slab;
        if (named[i])
            continue;
        if (src > from->n_groups || src > WB_SHARE_MAX_GROUPS)
            return 0;
        if (map[src] < 0)
            map[src] = (int)ng++;
    }
    if (ng == 0 || ng > WB_SHARE_MAX_GROUPS)
        return 0;
    wb_share_hold **bw = wb__calloc((size_t)ng * n, sizeof *bw);
    if (!bw)
        return 0;
    for (uint32_t src = 0; src <= from->n_groups && src <= WB_SHARE_MAX_GROUPS; src++) {
        if (map[src] < 0)
            continue;
        for (unsigned k = 0; k < n; k++) {
            wb_share_hold *h =
                src == 0 ? from->holds[k] : from->borrowed[(size_t)(src - 1) * from->n_stride + k];
            if (!h) {
                free(bw);
                return 0;
            }
            bw[(size_t)map[src] * n + k] = h;
        }
    }
    wb_share_index *ix = from->holds[0]->ix;
    pthread_mutex_lock(&ix->mu);
    for (size_t i = 0; i < (size_t)ng * n; i++)
        bw[i]->refs++;
    pthread_mutex_unlock(&ix->mu);
    d->borrowed = bw;
    d->n_groups = ng;
    d->n_stride = n;
    uint64_t off = 0;
    for (size_t i = 0; i < d->n_tensors; i++) {
        wb_model_tensor *t = &d->tensors[i];
        if (named[i]) {
            place_own(t, &off);
            continue;
        }
        const wb_model_tensor *ft = &from->tensors[i];
        t->slab = (uint32_t)map[ft->slab] + 1;
        t->offset = ft->offset;
        t->xxh3 = ft->xxh3;
        d->shared_bytes += t->nbytes;
        d->shared_tensors++;
    }
    *size = off ? off : WB_SLAB_ALIGN;
    return 1;
}

int wb__share_apply(wb_share_index *ix, const wb_backend *be, const int *devs, unsigned n,
                    const wb_st_table *table, const int *fds, unsigned threads,
                    const atomic_int *cancel, wb_model_data *d, uint64_t *size, wb_err *err)
{
    if (!ix || !be->slab_read || strcmp(wb__backend_access(be), "ro") != 0 || !d->n_tensors ||
        n == 0)
        return WB_OK;
    double t0 = wb__clock_mono_s();
    plan p = {
        .be = be, .table = table, .fds = fds, .cancel = cancel, .d = d, .devs = devs, .n_devs = n};
    pthread_mutex_init(&p.mu, NULL);
    int rc = snapshot(ix, &p);
    size_t nt = d->n_tensors, wanted = 0;
    if (rc == WB_OK && p.n_cands) {
        p.want = wb__calloc(nt, 1);
        p.xxh3 = wb__calloc(nt, sizeof *p.xxh3);
        p.match = wb__calloc(nt, sizeof *p.match);
        p.equal = wb__calloc(nt, sizeof *p.equal);
        if (!p.want || !p.xxh3 || !p.match || !p.equal)
            rc = WB_ENOMEM;
    }
    if (rc == WB_ENOMEM)
        wb__err_set(err, WB_ENOMEM, "out of memory sharing the tensors of %s", table->files[0]);
    for (size_t i = 0; rc == WB_OK && p.n_cands && i < nt; i++) {
        p.want[i] = first_candidate(&p, &d->tensors[i], NULL, 0) >= 0;
        wanted += p.want[i];
    }
    if (rc == WB_OK && wanted) {
        if ((rc = run_threads(&p, threads, 0)) != WB_OK)
            *err = p.err;
    }
    if (rc == WB_OK && wanted) {
        find_matches(ix, &p);
        if ((rc = run_threads(&p, threads, 1)) != WB_OK)
            *err = p.err;
    }
    uint64_t mismatched = 0;
    for (size_t i = 0; rc == WB_OK && wanted && i < nt; i++) {
        if (p.match[i] >= 0 && !p.equal[i]) {
            char q[300];
            char qf[300];
            const wb_st_tensor *st = &table->tensors[i];
            mismatched++;
            wb_warn("share_mismatch",
                    "file=%s tensor=%s digest=%016llx reason=\"a resident tensor of the same "
                    "dtype, shape and digest has other bytes: loaded, not shared\"",
                    wb__log_quote(qf, sizeof qf, table->files[st->file]),
                    wb__log_quote(q, sizeof q, d->tensors[i].name), (unsigned long long)p.xxh3[i]);
        }
    }
    if (rc == WB_OK && wanted)
        rc = relayout(ix, &p, size, err);
    /* The snapshot's counts go back (d holds its own). */
    for (size_t i = 0; i < p.n_holds; i++)
        wb__share_unref(p.holds[i]);
    if (rc == WB_OK && wanted) {
        uint64_t hashed = 0;
        for (size_t i = 0; i < nt; i++)
            hashed += p.want[i] ? d->tensors[i].nbytes : 0;
        char qf[300];
        wb_info("share_applied",
                "file=%s tensors=%zu candidates=%zu shared=%u shared_bytes=%llu borrowed_slabs=%u "
                "hashed_bytes=%llu mismatches=%llu seconds=%.4f",
                wb__log_quote(qf, sizeof qf, table->n_files ? table->files[0] : "-"), nt, wanted,
                d->shared_tensors, (unsigned long long)d->shared_bytes, d->n_groups,
                (unsigned long long)hashed, (unsigned long long)mismatched,
                wb__clock_mono_s() - t0);
    }
    if (rc == WB_OK) {
        pthread_mutex_lock(&ix->mu);
        ix->shared_tensors_total += d->shared_tensors;
        ix->shared_bytes_total += d->shared_bytes;
        ix->mismatches_total += mismatched;
        pthread_mutex_unlock(&ix->mu);
    }
    free(p.holds);
    free(p.slabs);
    free(p.cands);
    free(p.want);
    free(p.xxh3);
    free(p.match);
    free(p.equal);
    pthread_mutex_destroy(&p.mu);
    return rc;
}
