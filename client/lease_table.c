/* libwbclient: a lease's tensor table, made from an acquire's reply. The
 * compact tables (wb__table) are shared by every lease on them and by the
 * client's cache of the last WB_TABLE_CACHE models, whose digests the next
 * acquires name so that the broker need not send them again; a table is
 * read from the reply, its second frame or the broker's shared mapping,
 * and its entries are made on first use. A reply of tensor messages gives
 * the lease a table of its own (own_tensors). */
#include "lease.h"

#include "alloc.h"
#include "client_impl.h"
#include "tensor_table.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof((wb_client *)0)->tables / sizeof((wb_client *)0)->tables[0] == WB_TABLE_CACHE,
               "wb_client.tables holds WB_TABLE_CACHE tables");

void wb__table_unref(wb__table **tp)
{
    wb__table *t = tp ? *tp : NULL;
    if (!t)
        return;
    *tp = NULL;
    if (atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    free(atomic_load(&t->entries));
    free(t->slab_need);
    free(atomic_load(&t->by_name));
    pthread_mutex_destroy(&t->mu);
    wb__reply_free(&t->rep);
    wb__frame_free(&t->frame);
    wb__mapcache_put(&t->map);
    free(t->model);
    free(t);
}

static wb__table *table_ref(wb__table *t)
{
    atomic_fetch_add(&t->refs, 1);
    return t;
}

wb__table *wb__table_cached(wb_client *c, const char *model)
{
    for (size_t i = 0; i < WB_TABLE_CACHE; i++) {
        if (c->tables[i] && strcmp(c->tables[i]->model, model) == 0)
            return c->tables[i];
    }
    return NULL;
}

/* Keeps `t` (one more reference) as the model's table, in place of an
 * older one of the same model or else of the oldest slot. */
static void table_keep(wb_client *c, wb__table *t)
{
    size_t slot = c->tables_next;
    for (size_t i = 0; i < WB_TABLE_CACHE; i++) {
        if (c->tables[i] && strcmp(c->tables[i]->model, t->model) == 0) {
            slot = i;
            break;
        }
    }
    if (slot == c->tables_next)
        c->tables_next = (c->tables_next + 1) % WB_TABLE_CACHE;
    wb__table_unref(&c->tables[slot]);
    c->tables[slot] = table_ref(t);
}

/* A table (checked: by the decoder when it came inside the reply, by the
 * caller when it came as a second frame or shared): it keeps what holds
 * `bytes` (*rep, *frame or *map, whichever is given, is taken), or a copy
 * when the bytes are not 8-byte aligned. Its entries are made on first use
 * (table_entries); what a lease on it needs now is each slab's extent, read
 * from the records. NULL when out of memory (nothing taken). */
static wb__table *table_new(const char *model, const uint8_t *bytes, size_t len,
                            Wbproto__Reply **rep, wb__frame **frame, wb__map **map)
{
    int copy = ((uintptr_t)bytes & 7) != 0;
    wb__table *t = wb__calloc(1, sizeof *t + (copy ? (len + 7) & ~(size_t)7 : 0));
    if (!t)
        return NULL;
    t->bytes = copy ? memcpy(t->copy, bytes, len) : bytes;
    t->len = len;
    size_t n = wb__tensor_table_count(t->bytes);
    /* The slabs named (most tables name one), then each one's extent. */
    const uint8_t *rec = t->bytes + WB_TABLE_HEADER;
    for (size_t i = 0; i < n; i++, rec += WB_TABLE_RECORD) {
        wb_table_tensor r;
        memcpy(&r, rec, sizeof r);
        if (r.slab >= t->n_slabs)
            t->n_slabs = (size_t)r.slab + 1;
    }
    t->model = wb__strdup(model);
    t->slab_need = wb__calloc(t->n_slabs ? t->n_slabs : 1, sizeof *t->slab_need);
    if (!t->model || !t->slab_need) {
        free(t->model);
        free(t->slab_need);
        free(t);
        return NULL;
    }
    rec = t->bytes + WB_TABLE_HEADER;
    for (size_t i = 0; i < n; i++, rec += WB_TABLE_RECORD) {
        wb_table_tensor r;
        memcpy(&r, rec, sizeof r);
        if (r.offset + r.nbytes > t->slab_need[r.slab])
            t->slab_need[r.slab] = r.offset + r.nbytes;
    }
    t->n_entries = n;
    atomic_init(&t->refs, 1);
    atomic_init(&t->entries, NULL);
    atomic_init(&t->by_name, NULL);
    pthread_mutex_init(&t->mu, NULL);
    if (!copy && rep) {
        t->rep = *rep;
        *rep = NULL;
    } else if (!copy && frame) {
        t->frame = *frame;
        *frame = NULL;
    } else if (!copy && map) {
        t->map = *map;
        *map = NULL;
    }
    wb__tensor_table_digest(t->bytes, len, t->digest);
    return t;
}

/* The table's entries, made by the first caller under the table's lock and
 * published for every lease on it; NULL when out of memory. */
static const wb__tensor_entry *table_entries(wb__table *t)
{
    wb__tensor_entry *e = atomic_load_explicit(&t->entries, memory_order_acquire);
    if (e)
        return e;
    pthread_mutex_lock(&t->mu);
    e = atomic_load_explicit(&t->entries, memory_order_relaxed);
    size_t n = t->n_entries;
    if (!e && (e = wb__malloc((n ? n : 1) * sizeof *e)) != NULL) {
        const char *str = wb__tensor_table_strings(t->bytes);
        const uint64_t *dims = wb__tensor_table_dims(t->bytes);
        const uint8_t *rec = t->bytes + WB_TABLE_HEADER;
        for (size_t i = 0; i < n; i++, rec += WB_TABLE_RECORD) {
            wb_table_tensor r;
            memcpy(&r, rec, sizeof r);
            e[i] = (wb__tensor_entry){.name = (char *)str + r.name,
                                      .dtype = (char *)str + r.dtype,
                                      .ndim = r.ndim,
                                      .slab = r.slab,
                                      .shape = (uint64_t *)dims + r.dim,
                                      .offset = r.offset,
                                      .nbytes = r.nbytes,
                                      .xxh3 = r.xxh3};
        }
        atomic_store_explicit(&t->entries, e, memory_order_release);
    }
    pthread_mutex_unlock(&t->mu);
    return e;
}

const wb__tensor_entry *wb__lease_tensors(const wb_lease *lease)
{
    return lease->table ? table_entries(lease->table) : lease->own_tensors;
}

/* A lease on a table: its entries are the table's (checked against this
 * lease's slabs: by the decoder for a table just received, again for one
 * held), shared, one reference more. O(1) in the tensors. */
static void lease_on_table(wb_lease *l, wb__table *t)
{
    l->table = table_ref(t);
    l->n_tensors = t->n_entries;
}

/* The table a reply says the client holds: its names, dtypes and layout
 * were checked when it came; what depends on the lease is that every
 * tensor fits its slab, checked per slab (O(slabs), not O(tensors)). */
static int build_from_cached(wb_client *c, const char *model, const Wbproto__Lease *pl,
                             wb__table *held, wb_lease *l)
{
    if (!held)
        return wb__client_fail(c, WB_EPROTO,
                               "acquire '%s': the broker answered that this client holds the "
                               "model's tensor table, but it holds none",
                               model);
    if (held->n_slabs > pl->n_slabs)
        return wb__client_fail(c, WB_EPROTO,
                               "acquire '%s': the tensor table held names slab %zu, the lease "
                               "has %zu",
                               model, held->n_slabs - 1, pl->n_slabs);
    for (size_t i = 0; i < held->n_slabs; i++) {
        if (held->slab_need[i] > pl->slabs[i]->size)
            return wb__client_fail(c, WB_EPROTO,
                                   "acquire '%s': the tensor table held needs %llu bytes of "
                                   "slab %zu, the lease's has %llu",
                                   model, (unsigned long long)held->slab_need[i], i,
                                   (unsigned long long)pl->slabs[i]->size);
    }
    lease_on_table(l, held);
    return WB_OK;
}

/* Keeps the table t as the model's, for the lease and the next acquires. */
static int lease_on_new_table(wb_client *c, const char *model, wb_lease *l, wb__table *t)
{
    if (!t)
        return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
    table_keep(c, t);
    lease_on_table(l, t);
    wb__table_unref(&t);
    return WB_OK;
}

/* The table the broker published in shared memory: mapped read-only
 * through the map cache (every lease and client of this process on the
 * model share the mapping) and checked as a received table is; its bytes
 * are never copied. A mapping that fails sets *unmappable: the caller asks
 * again for the table another way. */
static int build_from_shared(wb_client *c, const char *model, const Wbproto__Lease *pl, wb_lease *l,
                             int *unmappable)
{
    const Wbproto__Slab *s = pl->tensor_table_slab;
    wb__map *map = NULL;
    wb_err e;
    int rc = wb__mapcache_get_host(s->shm_name, s->size, &map, &e);
    if (rc != WB_OK) {
        *unmappable = 1;
        return wb__client_fail(c, rc, "acquire '%s': the shared tensor table: %s", model, e.msg);
    }
    const uint8_t *bytes = wb__map_addr(map);
    size_t len = (size_t)s->size;
    if (wb__tensor_table_check(bytes, len, pl->slabs, pl->n_slabs, &e) != WB_OK) {
        wb__mapcache_put(&map);
        return wb__client_fail(c, WB_EPROTO, "acquire '%s': the shared tensor table %s: %s", model,
                               s->shm_name, e.msg);
    }
    wb__table *t = table_new(model, bytes, len, NULL, NULL, &map);
    wb__mapcache_put(&map); /* still ours when table_new failed */
    return lease_on_new_table(c, model, l, t);
}

int wb__lease_build_tensors(wb_client *c, const char *model, const Wbproto__Lease *pl,
                            wb__table *held, wb_lease *l, Wbproto__Reply **rep, wb__frame **frame,
                            int *unmappable)
{
    if (pl->tensor_table_cached)
        return build_from_cached(c, model, pl, held, l);
    if (pl->tensor_table_slab)
        return build_from_shared(c, model, pl, l, unmappable);
    if (pl->tensor_table_in_frame) {
        if (!*frame)
            return wb__client_fail(c, WB_EPROTO,
                                   "acquire '%s': the reply says the tensor table follows in a "
                                   "second frame, but none came",
                                   model);
        const uint8_t *bytes = wb__frame_data(*frame);
        size_t len = wb__frame_size(*frame);
        wb_err e;
        if (wb__tensor_table_check(bytes, len, pl->slabs, pl->n_slabs, &e) != WB_OK)
            return wb__client_fail(c, WB_EPROTO, "acquire '%s': the tensor table frame: %s", model,
                                   e.msg);
        return lease_on_new_table(c, model, l, table_new(model, bytes, len, NULL, frame, NULL));
    }
    if (pl->tensor_table.len)
        return lease_on_new_table(
            c, model, l,
            table_new(model, pl->tensor_table.data, pl->tensor_table.len, rep, NULL, NULL));
    /* Tensor messages (a broker that sends no compact table): the lease's
     * own table is one allocation, the entries, then every shape, then every
     * name and dtype. A model of 10^5 tensors would otherwise cost 3 * 10^5
     * mallocs at acquire and as many frees at release. */
    size_t n = pl->n_tensors, dims = 0, chars = 0;
    for (size_t i = 0; i < n; i++) {
        const Wbproto__Tensor *t = pl->tensors[i];
        dims += t->n_shape;
        chars += strlen(t->name) + strlen(t->dtype) + 2;
    }
    size_t size = (n ? n : 1) * sizeof *l->own_tensors + dims * sizeof(uint64_t) + chars;
    l->own_tensors = wb__malloc(size);
    if (!l->own_tensors)
        return wb__client_fail(c, WB_ENOMEM, "acquire '%s': out of memory", model);
    uint64_t *shape = (uint64_t *)(l->own_tensors + (n ? n : 1));
    char *str = (char *)(shape + dims);
    for (size_t i = 0; i < n; i++) {
        const Wbproto__Tensor *t = pl->tensors[i];
        wb__tensor_entry *lt = &l->own_tensors[i];
        size_t ln = strlen(t->name) + 1, ld = strlen(t->dtype) + 1;
        lt->name = memcpy(str, t->name, ln);
        str += ln;
        lt->dtype = memcpy(str, t->dtype, ld);
        str += ld;
        lt->ndim = (uint32_t)t->n_shape;
        lt->shape = shape;
        if (t->n_shape)
            memcpy(shape, t->shape, t->n_shape * sizeof *shape);
        shape += t->n_shape;
        lt->slab = t->slab;
        lt->offset = t->offset;
        lt->nbytes = t->nbytes;
        lt->xxh3 = t->xxh3;
    }
    l->n_tensors = n;
    return WB_OK;
}
