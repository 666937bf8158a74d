#include "models.h"

#include "alloc.h"
#include "log.h"
#include "share.h"
#include "tensor_table.h"
#include "wire.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

void wb__model_data_free(wb_model_data *d, const wb_backend *be)
{
    for (size_t i = 0; i < d->n_tensors; i++) {
        free(d->tensors[i].name);
        free(d->tensors[i].shape);
    }
    free(d->tensors);
    for (uint32_t i = 0; i < d->n_slabs; i++) {
        /* A slab others borrow stays, with them. */
        if (d->holds && d->holds[i] && !wb__share_release_owner(d->holds[i], &d->slabs[i]))
            continue;
        if (be)
            be->slab_free(&d->slabs[i]);
    }
    free(d->holds);
    for (size_t i = 0; d->borrowed && i < (size_t)d->n_groups * d->n_stride; i++) {
        if (d->borrowed[i])
            wb__share_unref(d->borrowed[i]);
    }
    free(d->borrowed);
    free(d->slabs);
    free(d->copies);
    memset(d, 0, sizeof *d);
}

void wb__model_tensor_slab(const wb_model_data *d, uint32_t k, const wb_model_tensor *t,
                           wb_slab *out)
{
    memset(out, 0, sizeof *out);
    if (t->slab == 0) {
        if (k < d->n_slabs)
            *out = d->slabs[k];
        return;
    }
    if (t->slab <= d->n_groups && k < d->n_stride) {
        wb_share_hold *h = d->borrowed[(size_t)(t->slab - 1) * d->n_stride + k];
        if (h)
            wb__share_slab_copy(h, out);
    }
}

uint32_t wb__model_copy_slabs(const wb_model_data *d, uint32_t k, wb_slab **out, uint32_t max)
{
    uint32_t n = 1 + d->n_groups;
    if (k >= d->n_slabs)
        return 0;
    for (uint32_t g = 0; g < n && g < max; g++) {
        wb_share_hold *h =
            g && k < d->n_stride ? d->borrowed[(size_t)(g - 1) * d->n_stride + k] : NULL;
        out[g] = g == 0 ? &d->slabs[k] : h ? wb__share_slab(h) : NULL;
    }
    return n;
}

wb_model *wb__model_new(const char *name, const char *path, const wb_backend *be, int device)
{
    wb_model *m = wb__calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->name = wb__strdup(name);
    m->path = wb__strdup(path);
    if (!m->name || !m->path) {
        free(m->name);
        free(m->path);
        free(m);
        return NULL;
    }
    m->state = WBPROTO__MODEL_STATE__MODEL_LOADING;
    m->version = m->issued = 1;
    m->backend = be;
    m->device = device;
    m->n_devices = 1;
    m->devices[0] = device;
    return m;
}

void wb__model_set_devices(wb_model *m, const int *devices, unsigned n)
{
    if (n == 0 || n > WB_GPU_MAX)
        return;
    memcpy(m->devices, devices, n * sizeof *devices);
    m->n_devices = n;
    m->device = devices[0];
}

static void wire_free(wb_model *m)
{
    free(m->wire_tensors);
    free(m->wire_tensor_ptrs);
    m->wire_tensors = NULL;
    m->wire_tensor_ptrs = NULL;
    if (m->wire) {
        for (uint32_t i = 0; i < m->data.n_copies; i++) {
            free(m->wire[i].lease_tail);
            free(m->wire[i].cached_tail);
            free(m->wire[i].frame_tail);
            free(m->wire[i].shared_tail);
            for (size_t g = 1; g < m->wire[i].n_slab_ptrs; g++)
                free(m->wire[i].xslabs[g - 1].shm_name);
            free(m->wire[i].xslabs);
            if (m->wire[i].slab_ptrs != &m->wire[i].slab_ptr)
                free(m->wire[i].slab_ptrs);
        }
    }
    free(m->wire);
    m->wire = NULL;
    m->wire_lease_size = 0;
    free(m->table);
    m->table = NULL;
    m->table_len = 0;
    if (m->table_shm.addr) {
        wb__shm_unlink(&m->table_shm);
        wb__shm_unmap(&m->table_shm);
    }
}

void wb__model_free(wb_model **mp)
{
    if (!mp || !*mp)
        return;
    wb_model *m = *mp;
    wire_free(m);
    wb__model_data_free(&m->data, m->backend);
    if (m->host_copy && m->backend && m->backend->host_free)
        m->backend->host_free(m->backend, m->host_copy, m->host_bytes);
    free(m->tier_error);
    free(m->name);
    free(m->path);
    free(m->error);
    free(m);
    *mp = NULL;
}

void wb__model_fail(wb_model *m, const char *why)
{
    wire_free(m);
    wb__model_data_free(&m->data, m->backend);
    free(m->error);
    /* Out of memory: the record still says that it failed. */
    m->error = wb__strdup(why && why[0] ? why : "the load failed");
    m->state = WBPROTO__MODEL_STATE__MODEL_FAILED;
    m->current = 0;
    m->job = NULL;
}

/* Packs a Lease on copy k once (see wb_model_wire). */
static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(Wbproto__Tensor *const *)a)->name, (*(Wbproto__Tensor *const *)b)->name);
}

static void wire_pack_copy(wb_model *m, uint32_t k, const uint8_t *table, size_t table_len)
{
    wb_model_wire *w = &m->wire[k];
    uint8_t id[WB_LEASE_ID_LEN] = {0};
    Wbproto__Lease lease = WBPROTO__LEASE__INIT;
    lease.id.data = id;
    lease.id.len = sizeof id;
    lease.model = m->name;
    lease.n_slabs = w->n_slab_ptrs;
    lease.slabs = w->slab_ptrs;
    lease.n_tensors = m->data.n_tensors;
    lease.tensors = m->wire_tensor_ptrs;
    lease.version = m->version;
    lease.checksums_pending = m->checksums_state != WB_CHECKSUMS_READY;
    w->lease_size = wbproto__lease__get_packed_size(&lease);
    if (w->lease_size > m->wire_lease_size)
        m->wire_lease_size = w->lease_size;
    lease.id.data = NULL;
    lease.id.len = 0;
    size_t tail = wbproto__lease__get_packed_size(&lease);
    w->lease_tail = wb__malloc(tail ? tail : 1);
    if (w->lease_tail)
        w->lease_tail_len = wbproto__lease__pack(&lease, w->lease_tail);
    if (table) {
        /* A reply with the table inside points at the model's one table
         * (wb__ops_lease_tail): packing a bytes field is one copy, there is
         * nothing to save by packing it per copy ahead. */
        (void)table_len;
        lease.n_tensors = 0;
        lease.tensors = NULL;
        lease.tensor_table_cached = 1;
        tail = wbproto__lease__get_packed_size(&lease);
        w->cached_tail = wb__malloc(tail);
        if (w->cached_tail)
            w->cached_tail_len = wbproto__lease__pack(&lease, w->cached_tail);
        lease.tensor_table_cached = 0;
        lease.tensor_table_in_frame = 1;
        tail = wbproto__lease__get_packed_size(&lease);
        w->frame_tail = wb__malloc(tail);
        if (w->frame_tail)
            w->frame_tail_len = wbproto__lease__pack(&lease, w->frame_tail);
    }
    if (table && m->table_shm.addr) {
        lease.tensor_table_in_frame = 0;
        lease.tensor_table_slab = &m->table_slab;
        tail = wbproto__lease__get_packed_size(&lease);
        w->shared_tail = wb__malloc(tail);
        if (w->shared_tail)
            w->shared_tail_len = wbproto__lease__pack(&lease, w->shared_tail);
    }
}

/* Publishes the table in a read-only shared memory object when the model's
 * clients are expected to reach /dev/shm: its slabs are named shm objects,
 * or CUDA IPC handles (legacy CUDA IPC needs the host's IPC namespace
 * anyway). Made like a slab (unguessable name, mode 0640, opened read-only
 * by clients). Without it (descriptor transports, or no memory) clients get
 * the table as before, and so does a client that cannot map it. */
static void table_publish(wb_model *m, const uint8_t *table, size_t len)
{
    memset(&m->table_shm, 0, sizeof m->table_shm);
    wbproto__slab__init(&m->table_slab);
    const char *tr = wb__backend_transport(m->backend);
    int shm_slabs =
        m->backend->proto == WBPROTO__BACKEND__BACKEND_HOST && (!tr[0] || strcmp(tr, "shm") == 0);
    int ipc_slabs =
        m->backend->proto == WBPROTO__BACKEND__BACKEND_CUDA && strcmp(tr, "cuda-ipc") == 0;
    if (!table || (!shm_slabs && !ipc_slabs))
        return;
    wb_err e;
    if (wb__shm_create(&m->table_shm, len, &e) != WB_OK) {
        char q[300];
        wb_warn("table_shared", "model=%s error=%s: clients get the table in their replies",
                wb__log_quote(q, sizeof q, m->name), e.msg);
        memset(&m->table_shm, 0, sizeof m->table_shm);
        return;
    }
    memcpy(m->table_shm.addr, table, len);
    /* Never written again: a stray write of the broker's faults instead of
     * changing what clients read. */
    if (len)
        mprotect(m->table_shm.addr, len, PROT_READ);
    m->table_slab.backend = WBPROTO__BACKEND__BACKEND_HOST;
    m->table_slab.device = -1;
    m->table_slab.size = len;
    m->table_slab.shm_name = m->table_shm.name;
    m->table_slab.transport = "shm";
}

/* Copy k's slab list: its own, then each borrowed group's slab on its
 * device (Slab.index = its place in the list). */
static int wire_borrowed(wb_model *m, uint32_t k, wb_model_wire *w)
{
    w->slab_ptr = &w->slab;
    w->slab_ptrs = &w->slab_ptr;
    w->n_slab_ptrs = 1;
    uint32_t ng = m->data.n_groups;
    if (ng == 0)
        return WB_OK;
    w->slab_ptrs = wb__calloc(1 + ng, sizeof *w->slab_ptrs);
    w->xslabs = wb__calloc(ng, sizeof *w->xslabs);
    if (!w->slab_ptrs || !w->xslabs)
        return WB_ENOMEM;
    w->slab_ptrs[0] = &w->slab;
    wb_slab *slabs[1 + WB_SHARE_MAX_GROUPS];
    wb__model_copy_slabs(&m->data, k, slabs, 1 + WB_SHARE_MAX_GROUPS);
    for (uint32_t g = 0; g < ng; g++) {
        Wbproto__Slab *x = &w->xslabs[g];
        m->backend->slab_export(slabs[g + 1], x);
        x->index = g + 1;
        x->device_uuid = m->data.copies[k].uuid;
        /* The owner's name may go before this wire view does. */
        x->shm_name = x->shm_name ? wb__strdup(x->shm_name) : NULL;
        w->slab_ptrs[g + 1] = x;
        w->n_slab_ptrs = g + 2;
        if (!x->shm_name && slabs[g + 1]->shm.name[0])
            return WB_ENOMEM;
    }
    return WB_OK;
}

/* The wire view of m->data (see wb_model_wire). On failure (out of
 * memory) nothing was changed. */
static int build_wire(wb_model *m, wb_err *err)
{
    size_t nc = m->data.n_copies, nt = m->data.n_tensors;
    /* calloc(0) may return NULL; allocate at least one element. */
    wb_model_wire *wire = wb__calloc(nc, sizeof *wire);
    Wbproto__Tensor *tensors = wb__calloc(nt ? nt : 1, sizeof *tensors);
    Wbproto__Tensor **tensor_ptrs = wb__calloc(nt ? nt : 1, sizeof *tensor_ptrs);
    if (!wire || !tensors || !tensor_ptrs) {
        free(wire);
        free(tensors);
        free(tensor_ptrs);
        return wb__err_set(err, WB_ENOMEM, "out of memory describing model '%s'", m->name);
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
    /* Leases list the tensors in name order ("the broker's order"): a
     * client then finds names without sorting 10^5 of them first. */
    qsort(tensor_ptrs, nt, sizeof *tensor_ptrs, cmp_tensor_name);
    m->wire_tensors = tensors;
    m->wire_tensor_ptrs = tensor_ptrs;
    m->wire = wire;
    m->wire_lease_size = 0;

    /* The size of a lease reply is known now; an acquire checks it against
     * the message cap before granting anything. Each copy's lease has its
     * one slab at index 0. */
    size_t table_len = 0;
    uint8_t *table = wb__tensor_table_pack(tensor_ptrs, nt, &table_len);
    if (table)
        wb__tensor_table_digest(table, table_len, m->table_digest);
    table_publish(m, table, table_len);
    int first_ready = -1;
    for (uint32_t k = 0; k < nc; k++) {
        wb_model_copy *c = &m->data.copies[k];
        m->data.slabs[k].index = 0;
        if (c->state != WBPROTO__MODEL_STATE__MODEL_READY) {
            wbproto__slab__init(&wire[k].slab);
            continue;
        }
        if (first_ready < 0)
            first_ready = (int)k;
        m->backend->slab_export(&m->data.slabs[k], &wire[k].slab);
        wire[k].slab.device_uuid = c->uuid;
        if (wire_borrowed(m, k, &wire[k]) != WB_OK) {
            wire_free(m);
            free(table);
            return wb__err_set(err, WB_ENOMEM, "out of memory describing model '%s'", m->name);
        }
        wire_pack_copy(m, k, table, table_len);
    }
    m->table = table;
    m->table_len = table ? table_len : 0;
    if (first_ready >= 0)
        m->device = m->data.copies[first_ready].device;
    return WB_OK;
}

int wb__model_adopt(wb_model *m, wb_model_data *data, wb_err *err)
{
    /* Data built without copies (one slab per device, as before copies
     * existed): each slab is a ready copy. */
    if (data->n_copies == 0 && data->n_slabs) {
        data->copies = wb__calloc(data->n_slabs, sizeof *data->copies);
        if (!data->copies)
            return wb__err_set(err, WB_ENOMEM, "out of memory describing model '%s'", m->name);
        data->n_copies = data->n_slabs;
        for (uint32_t k = 0; k < data->n_slabs; k++) {
            data->copies[k].device = data->slabs[k].device;
            data->copies[k].state = WBPROTO__MODEL_STATE__MODEL_READY;
        }
    }
    size_t nc = data->n_copies;
    if (nc == 0 || nc != data->n_slabs)
        return wb__err_set(err, WB_EINTERNAL, "model '%s': %zu copies for %u slabs", m->name, nc,
                           data->n_slabs);
    m->data = *data;
    memset(data, 0, sizeof *data);
    int rc = build_wire(m, err);
    if (rc != WB_OK) {
        /* *data owns everything again. */
        *data = m->data;
        memset(&m->data, 0, sizeof m->data);
        return rc;
    }
    m->state = WBPROTO__MODEL_STATE__MODEL_READY;
    /* Ready is current: the broker demotes the version this one replaces
     * in the same turn (wb__broker_make_current). */
    m->current = 1;
    return WB_OK;
}

int wb__model_rewire(wb_model *m, wb_err *err)
{
    wb_model old = *m;
    m->wire_tensors = NULL;
    m->wire_tensor_ptrs = NULL;
    m->wire = NULL;
    m->table = NULL;
    m->table_len = 0;
    memset(&m->table_shm, 0, sizeof m->table_shm);
    int rc = build_wire(m, err);
    if (rc != WB_OK) {
        m->wire_tensors = old.wire_tensors;
        m->wire_tensor_ptrs = old.wire_tensor_ptrs;
        m->wire = old.wire;
        m->table = old.table;
        m->table_len = old.table_len;
        m->table_shm = old.table_shm;
        m->table_slab = old.table_slab;
        m->wire_lease_size = old.wire_lease_size;
        memcpy(m->table_digest, old.table_digest, sizeof m->table_digest);
        return rc;
    }
    /* The old view's allocations, and its shared table's name. */
    wire_free(&old);
    return WB_OK;
}

/* "0=GPU-... ready, 1=GPU-... failed" for messages. */
static void describe_copies(const wb_model *m, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (uint32_t k = 0; k < m->data.n_copies && at < size; k++) {
        const wb_model_copy *c = &m->data.copies[k];
        int w = snprintf(buf + at, size - at, "%s%d=%s %s", k ? ", " : "", c->device,
                         c->uuid[0] ? c->uuid : "host", wb__model_state_name(c->state));
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

int wb__model_pick_copy(const wb_model *m, int device_set, int device, const char *uuid,
                        int allow_peer, unsigned *copy, wb_err *err)
{
    *copy = 0;
    int first_ready = -1;
    for (uint32_t k = 0; k < m->data.n_copies; k++) {
        if (m->data.copies[k].state == WBPROTO__MODEL_STATE__MODEL_READY) {
            first_ready = (int)k;
            break;
        }
    }
    if (first_ready < 0)
        return wb__err_set(err, WB_ESTATE, "model '%s' has no ready copy", m->name);
    /* Host memory is reachable from any device: its one copy serves all. */
    if (m->backend->proto == WBPROTO__BACKEND__BACKEND_HOST ||
        (!(uuid && uuid[0]) && !device_set)) {
        *copy = (unsigned)first_ready;
        return WB_OK;
    }
    int has_uuid = uuid && uuid[0];
    for (uint32_t k = 0; k < m->data.n_copies; k++) {
        const wb_model_copy *c = &m->data.copies[k];
        int match = has_uuid ? strcasecmp(c->uuid, uuid) == 0 : c->device == device;
        if (match && c->state == WBPROTO__MODEL_STATE__MODEL_READY) {
            *copy = k;
            return WB_OK;
        }
    }
    if (allow_peer) {
        *copy = (unsigned)first_ready;
        return WB_OK;
    }
    char have[1024], want[WB_GPU_UUID_SIZE + 32];
    describe_copies(m, have, sizeof have);
    if (has_uuid)
        snprintf(want, sizeof want, "%s", uuid);
    else
        snprintf(want, sizeof want, "%d (the broker's ordinal)", device);
    return wb__err_set(err, WB_ENOGPU,
                       "model '%s' has no ready copy on device %s; its copies: %s (load it there, "
                       "or ask for peer access)",
                       m->name, want, have);
}

/* How well a record stands for its name (wb__models_find): higher wins. */
static int stand_rank(const wb_model *m)
{
    return wb__version_rank(m->state, m->current);
}

wb_model *wb__models_find(const wb_model_registry *r, const char *name)
{
    wb_model *best = NULL;
    for (wb_model *m = r->head; m; m = m->next) {
        if (strcmp(m->name, name) != 0)
            continue;
        int rank = stand_rank(m), have = best ? stand_rank(best) : 0;
        if (rank > have || (rank == have && m->version > best->version))
            best = m;
    }
    return best;
}

wb_model *wb__models_current(const wb_model_registry *r, const char *name)
{
    for (wb_model *m = r->head; m; m = m->next) {
        if (m->current && m->state == WBPROTO__MODEL_STATE__MODEL_READY &&
            strcmp(m->name, name) == 0)
            return m;
    }
    return NULL;
}

wb_model *wb__models_in_state(const wb_model_registry *r, const char *name, int state)
{
    wb_model *best = NULL;
    for (wb_model *m = r->head; m; m = m->next) {
        if (m->state == state && strcmp(m->name, name) == 0 &&
            (!best || m->version > best->version))
            best = m;
    }
    return best;
}

wb_model *wb__models_version(const wb_model_registry *r, const char *name, uint32_t version)
{
    for (wb_model *m = r->head; m; m = m->next) {
        if (m->version == version && strcmp(m->name, name) == 0)
            return m;
    }
    return NULL;
}

size_t wb__models_versions(const wb_model_registry *r, const char *name)
{
    size_t n = 0;
    for (const wb_model *m = r->head; m; m = m->next)
        n += m->state != WBPROTO__MODEL_STATE__MODEL_FAILED && strcmp(m->name, name) == 0;
    return n;
}

uint32_t wb__models_issue(wb_model_registry *r, const char *name)
{
    uint32_t high = 0;
    for (const wb_model *m = r->head; m; m = m->next) {
        if (strcmp(m->name, name) == 0 && m->issued > high)
            high = m->issued;
    }
    if (high == UINT32_MAX)
        return high;
    for (wb_model *m = r->head; m; m = m->next) {
        if (strcmp(m->name, name) == 0)
            m->issued = high + 1;
    }
    return high + 1;
}

/* Whether m is the first record of its name that `keep` accepts. */
static int first_of_name(const wb_model_registry *r, const wb_model *m,
                         int (*keep)(const wb_model *))
{
    const wb_model *first = r->head;
    while (first != m && (!keep(first) || strcmp(first->name, m->name) != 0))
        first = first->next;
    return first == m;
}

static int any_record(const wb_model *m)
{
    (void)m;
    return 1;
}

static int holds_something(const wb_model *m)
{
    return m->state != WBPROTO__MODEL_STATE__MODEL_FAILED;
}

size_t wb__models_names(const wb_model_registry *r)
{
    size_t n = 0;
    for (const wb_model *m = r->head; m; m = m->next)
        n += first_of_name(r, m, any_record);
    return n;
}

size_t wb__models_held(const wb_model_registry *r)
{
    size_t n = 0;
    for (const wb_model *m = r->head; m; m = m->next)
        n += holds_something(m) && first_of_name(r, m, holds_something);
    return n;
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
