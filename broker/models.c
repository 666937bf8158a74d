#include "models.h"

#include "wire.h"

#include <stdlib.h>
#include <string.h>

void wb__model_data_free(wb_model_data *d, const wb_backend *be)
{
    for (size_t i = 0; i < d->n_tensors; i++) {
        free(d->tensors[i].name);
        free(d->tensors[i].shape);
    }
    free(d->tensors);
    for (uint32_t i = 0; i < d->n_slabs; i++) {
        if (be)
            be->slab_free(&d->slabs[i]);
    }
    free(d->slabs);
    memset(d, 0, sizeof *d);
}

wb_model *wb__model_new(const char *name, const char *path, const wb_backend *be, int device)
{
    wb_model *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->name = strdup(name);
    m->path = strdup(path);
    if (!m->name || !m->path) {
        free(m->name);
        free(m->path);
        free(m);
        return NULL;
    }
    m->state = WBPROTO__MODEL_STATE__MODEL_LOADING;
    m->backend = be;
    m->device = device;
    return m;
}

static void wire_free(wb_model *m)
{
    free(m->wire_slabs);
    free(m->wire_slab_ptrs);
    free(m->wire_tensors);
    free(m->wire_tensor_ptrs);
    m->wire_slabs = NULL;
    m->wire_slab_ptrs = NULL;
    m->wire_tensors = NULL;
    m->wire_tensor_ptrs = NULL;
    free(m->wire_lease_tail);
    m->wire_lease_tail = NULL;
    m->wire_lease_tail_len = 0;
    free(m->wire_table_tail);
    m->wire_table_tail = NULL;
    m->wire_table_tail_len = 0;
    free(m->wire_cached_tail);
    m->wire_cached_tail = NULL;
    m->wire_cached_tail_len = 0;
}

void wb__model_free(wb_model **mp)
{
    if (!mp || !*mp)
        return;
    wb_model *m = *mp;
    wire_free(m);
    wb__model_data_free(&m->data, m->backend);
    free(m->name);
    free(m->path);
    free(m);
    *mp = NULL;
}

int wb__model_adopt(wb_model *m, wb_model_data *data, wb_err *err)
{
    size_t ns = data->n_slabs, nt = data->n_tensors;
    /* calloc(0) may return NULL; allocate at least one element. */
    Wbproto__Slab *slabs = calloc(ns ? ns : 1, sizeof *slabs);
    Wbproto__Slab **slab_ptrs = calloc(ns ? ns : 1, sizeof *slab_ptrs);
    Wbproto__Tensor *tensors = calloc(nt ? nt : 1, sizeof *tensors);
    Wbproto__Tensor **tensor_ptrs = calloc(nt ? nt : 1, sizeof *tensor_ptrs);
    if (!slabs || !slab_ptrs || !tensors || !tensor_ptrs) {
        free(slabs);
        free(slab_ptrs);
        free(tensors);
        free(tensor_ptrs);
        return wb__err_set(err, WB_ENOMEM, "out of memory describing model '%s'", m->name);
    }
    m->data = *data;
    memset(data, 0, sizeof *data);
    for (size_t i = 0; i < ns; i++) {
        m->data.slabs[i].index = (uint32_t)i;
        m->backend->slab_export(&m->data.slabs[i], &slabs[i]);
        slab_ptrs[i] = &slabs[i];
    }
    for (size_t i = 0; i < nt; i++) {
        const wb_model_tensor *t = &m->data.tensors[i];
        Wbproto__Tensor *w = &tensors[i];
        wbproto__tensor__init(w);
        w->name = t->name;
        w->dtype = (char *)t->dtype;
        w->n_shape = t->ndim;
        w->shape = t->shape;
        w->slab = t->slab;
        w->offset = t->offset;
        w->nbytes = t->nbytes;
        w->xxh3 = t->xxh3;
        tensor_ptrs[i] = w;
    }
    m->wire_slabs = slabs;
    m->wire_slab_ptrs = slab_ptrs;
    m->wire_tensors = tensors;
    m->wire_tensor_ptrs = tensor_ptrs;

    /* The size of a lease reply is known now; an acquire checks it against
     * the message cap before granting anything. */
    uint8_t id[WB_LEASE_ID_LEN] = {0};
    Wbproto__Lease lease = WBPROTO__LEASE__INIT;
    lease.id.data = id;
    lease.id.len = sizeof id;
    lease.model = m->name;
    lease.n_slabs = ns;
    lease.slabs = slab_ptrs;
    lease.n_tensors = nt;
    lease.tensors = tensor_ptrs;
    m->wire_lease_size = wbproto__lease__get_packed_size(&lease);
    lease.id.data = NULL;
    lease.id.len = 0;
    size_t tail = wbproto__lease__get_packed_size(&lease);
    m->wire_lease_tail = malloc(tail ? tail : 1);
    if (m->wire_lease_tail)
        m->wire_lease_tail_len = wbproto__lease__pack(&lease, m->wire_lease_tail);
    size_t table_len = 0;
    uint8_t *table = wb__tensor_table_pack(tensor_ptrs, nt, &table_len);
    if (table) {
        lease.n_tensors = 0;
        lease.tensors = NULL;
        lease.tensor_table.data = table;
        lease.tensor_table.len = table_len;
        tail = wbproto__lease__get_packed_size(&lease);
        m->wire_table_tail = malloc(tail);
        if (m->wire_table_tail)
            m->wire_table_tail_len = wbproto__lease__pack(&lease, m->wire_table_tail);
        wb__tensor_table_digest(table, table_len, m->table_digest);
        lease.tensor_table.data = NULL;
        lease.tensor_table.len = 0;
        lease.tensor_table_cached = 1;
        tail = wbproto__lease__get_packed_size(&lease);
        m->wire_cached_tail = m->wire_table_tail ? malloc(tail) : NULL;
        if (m->wire_cached_tail)
            m->wire_cached_tail_len = wbproto__lease__pack(&lease, m->wire_cached_tail);
        free(table);
    }
    m->state = WBPROTO__MODEL_STATE__MODEL_READY;
    return WB_OK;
}

wb_model *wb__models_find(const wb_model_registry *r, const char *name)
{
    for (wb_model *m = r->head; m; m = m->next) {
        if (strcmp(m->name, name) == 0)
            return m;
    }
    return NULL;
}

void wb__models_add(wb_model_registry *r, wb_model *m)
{
    m->next = NULL;
    if (r->tail)
        r->tail->next = m;
    else
        r->head = m;
    r->tail = m;
    r->n++;
}

void wb__models_remove(wb_model_registry *r, wb_model *m)
{
    wb_model *prev = NULL;
    for (wb_model *p = r->head; p; prev = p, p = p->next) {
        if (p != m)
            continue;
        if (prev)
            prev->next = p->next;
        else
            r->head = p->next;
        if (r->tail == p)
            r->tail = prev;
        r->n--;
        p->next = NULL;
        return;
    }
}

void wb__models_clear(wb_model_registry *r)
{
    wb_model *m = r->head;
    while (m) {
        wb_model *next = m->next;
        wb__model_free(&m);
        m = next;
    }
    memset(r, 0, sizeof *r);
}

int wb__model_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > WB_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}
