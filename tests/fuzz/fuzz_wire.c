/* Fuzzes the wire decoders with arbitrary bytes, as both a request (what the
 * broker receives) and a reply (what a client receives). A reply that
 * decodes must satisfy the bounds a client relies on for pointer arithmetic;
 * a request's decoding must stay within its allocation budget; the strings
 * of either must be UTF-8; anything else traps so the fuzzer reports it. */
#include "wire.h"

#include "tensor_table.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_utf8(const char *s)
{
    if (s && wb__utf8_invalid_at(s, strlen(s)) != strlen(s))
        __builtin_trap();
}

static void check_lease(const Wbproto__Lease *l)
{
    if (!l || l->id.len != WB_LEASE_ID_LEN)
        __builtin_trap();
    for (size_t i = 0; i < l->n_tensors; i++) {
        const Wbproto__Tensor *t = l->tensors[i];
        if (t->slab >= l->n_slabs || t->n_shape > 64 || !t->name[0])
            __builtin_trap();
        check_utf8(t->name);
        uint64_t size = l->slabs[t->slab]->size;
        if (t->offset > size || t->nbytes > size - t->offset)
            __builtin_trap();
    }
    if (l->tensor_table.len) {
        /* A table that decoded is one a client reads with pointers. */
        const uint8_t *tt = l->tensor_table.data;
        const char *str = wb__tensor_table_strings(tt);
        size_t strings = l->tensor_table.len - (size_t)(str - (const char *)tt);
        size_t dims =
            (size_t)((const uint8_t *)str - (const uint8_t *)wb__tensor_table_dims(tt)) / 8;
        for (uint32_t i = 0; i < wb__tensor_table_count(tt); i++) {
            wb_table_tensor r;
            wb__tensor_table_get(tt, i, &r);
            if (r.slab >= l->n_slabs || r.ndim > 64 || r.name >= strings || r.dtype >= strings ||
                !str[r.name] || r.dim + (size_t)r.ndim > dims)
                __builtin_trap();
            if (strlen(str + r.name) >= strings - r.name)
                __builtin_trap();
            check_utf8(str + r.name);
            uint64_t size = l->slabs[r.slab]->size;
            if (r.offset > size || r.nbytes > size - r.offset)
                __builtin_trap();
        }
    }
    for (size_t i = 0; i < l->n_slabs; i++) {
        size_t h = l->slabs[i]->cuda_ipc_handle.len;
        if (h != 0 && h != 64)
            __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wb_err err;
    uint64_t id;
    Wbproto__Request *req = NULL;
    size_t peak = 0;
    int rc = wb__request_decode_ex(data, size, &req, &id, &peak, &err);
    if (peak > wb__request_budget(size))
        __builtin_trap();
    if (rc == WB_OK) {
        if (req->version != WB_PROTOCOL_VERSION || req->id != id)
            __builtin_trap();
        if (req->body_case == WBPROTO__REQUEST__BODY_HEARTBEAT) {
            const Wbproto__HeartbeatRequest *hb = req->heartbeat;
            if (hb->n_leases > WB_MAX_BEATS)
                __builtin_trap();
            for (size_t i = 0; i < hb->n_leases; i++) {
                if (hb->leases[i]->n_container_records > WB_MAX_CONTAINER_RECORDS)
                    __builtin_trap();
                for (size_t k = 0; k < hb->leases[i]->n_container_records; k++)
                    check_utf8(hb->leases[i]->container_records[k]->model_path);
            }
        }
        if (req->body_case == WBPROTO__REQUEST__BODY_HELLO)
            check_utf8(req->hello->client);
        /* What decodes must pack again. */
        size_t len;
        uint8_t *buf = wb__request_pack(req, &len);
        free(buf);
        wb__request_free(&req);
    } else if (req != NULL || strlen(err.msg) == 0) {
        __builtin_trap();
    }

    Wbproto__Reply *rep = NULL;
    if (wb__reply_decode(data, size, &rep, &err) == WB_OK) {
        check_utf8(rep->error);
        if (rep->body_case == WBPROTO__REPLY__BODY_ACQUIRE)
            check_lease(rep->acquire->lease);
        if (rep->body_case == WBPROTO__REPLY__BODY_LIST_LEASES) {
            for (size_t i = 0; i < rep->list_leases->n_leases; i++) {
                const Wbproto__LeaseInfo *li = rep->list_leases->leases[i];
                (void)wb__lease_state_name(li->state);
                check_utf8(li->process_name);
                /* Full ids, or the prefix a non-administrator sees of
                 * another process's lease. */
                if (li->id.len != WB_LEASE_ID_LEN && li->id.len != WB_LEASE_ID_PREFIX_LEN)
                    __builtin_trap();
            }
        }
        if (rep->body_case == WBPROTO__REPLY__BODY_LIST_MODELS) {
            for (size_t i = 0; i < rep->list_models->n_models; i++) {
                (void)wb__model_state_name(rep->list_models->models[i]->state);
                check_utf8(rep->list_models->models[i]->path);
                (void)wb__backend_name(rep->list_models->models[i]->backend);
            }
        }
        wb__reply_free(&rep);
    } else if (rep != NULL) {
        __builtin_trap();
    }
    return 0;
}
