#include "wire.h"

#include "alloc.h"
#include "devlist.h"
#include "placement.h"
#include "shm.h"
#include "tensor_table.h"
#include "wire_impl.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The size of a cudaIpcMemHandle_t. */
#define WIRE_CUDA_HANDLE_LEN 64

/* Appends "name" or "name[k]" (k != SIZE_MAX) to the path of len bytes;
 * returns the new length (the path is cut short rather than overflowed). */
size_t wb__wire_path_push(char *path, size_t cap, size_t len, const char *name, size_t k)
{
    int w = k == SIZE_MAX ? snprintf(path + len, cap - len, "%s%s", len ? "." : "", name)
                          : snprintf(path + len, cap - len, "%s%s[%zu]", len ? "." : "", name, k);
    if (w < 0)
        return len;
    return (size_t)w < cap - len ? len + (size_t)w : cap - 1;
}

/* Every string field of a decoded message, sub-messages included, is valid
 * UTF-8 (proto3 requires it of `string`): a peer's invalid bytes kept and
 * sent back out would make every listing that carries them undecodable for
 * strict decoders. Walks the descriptors, so a field added to wb.proto is
 * checked without a change here. `root` names the top-level message's own
 * strings ("reply.error"); sub-messages are named by their fields, as the
 * other checks name them ("heartbeat.leases[0].container_records[2]"). */
static int check_utf8(const ProtobufCMessage *m, const char *root, char *path, size_t cap,
                      size_t len, wb_err *err)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        size_t n = 1;
        void *const *elems = (void *const *)(const void *)(base + f->offset);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            memcpy(&n, base + f->quantifier_offset, sizeof n);
            memcpy(&elems, base + f->offset, sizeof elems);
        } else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t which;
            memcpy(&which, base + f->quantifier_offset, sizeof which);
            if (which != f->id)
                continue;
        }
        for (size_t k = 0; k < n; k++) {
            const void *e;
            memcpy(&e, &elems[k], sizeof e);
            if (!e)
                continue;
            size_t at = len;
            if (len == 0 && f->type == PROTOBUF_C_TYPE_STRING && root)
                at = wb__wire_path_push(path, cap, 0, root, SIZE_MAX);
            at = wb__wire_path_push(path, cap, at, f->name,
                                    f->label == PROTOBUF_C_LABEL_REPEATED ? k : SIZE_MAX);
            int rc = WB_OK;
            if (f->type == PROTOBUF_C_TYPE_STRING) {
                size_t sl = strlen(e), bad = wb__utf8_invalid_at(e, sl);
                if (bad < sl)
                    rc = wb__err_set(err, WB_EPROTO, "%s is not valid UTF-8 (byte %zu)", path, bad);
            } else {
                rc = check_utf8(e, root, path, cap, at, err);
            }
            path[len] = '\0';
            if (rc != WB_OK)
                return rc;
        }
    }
    return WB_OK;
}

/* check_utf8 over a whole message. */
static int check_strings(const ProtobufCMessage *m, const char *root, wb_err *err)
{
    char path[256] = "";
    return check_utf8(m, root, path, sizeof path, 0, err);
}

/* Model names travel in logs and error messages: 1..WB_NAME_MAX bytes and no
 * control characters. (The stricter character set for new models is checked
 * by the broker's load operation.) */
int wb__wire_check_text(const char *field, const char *s, size_t max, wb_err *err)
{
    if (!s || !s[0])
        return wb__err_set(err, WB_EPROTO, "%s is empty", field);
    size_t n = strlen(s);
    if (n > max)
        return wb__err_set(err, WB_EPROTO, "%s has %zu bytes, at most %zu", field, n, max);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return wb__err_set(err, WB_EPROTO, "%s has a control character (0x%02x) at byte %zu",
                               field, c, i);
    }
    return WB_OK;
}

static int check_name(const char *field, const char *s, wb_err *err)
{
    return wb__wire_check_text(field, s, WB_NAME_MAX, err);
}

static int check_path(const char *field, const char *s, wb_err *err)
{
    if (!s || !s[0])
        return wb__err_set(err, WB_EPROTO, "%s is empty", field);
    size_t n = strlen(s);
    if (n > WB_PATH_MAX)
        return wb__err_set(err, WB_EPROTO, "%s has %zu bytes, at most %d", field, n, WB_PATH_MAX);
    return WB_OK;
}

static int check_lease_id(const char *field, const ProtobufCBinaryData *id, wb_err *err)
{
    if (id->len != WB_LEASE_ID_LEN || (id->len && !id->data))
        return wb__err_set(err, WB_EPROTO, "%s has %zu bytes, expected %d", field, id->len,
                           WB_LEASE_ID_LEN);
    return WB_OK;
}

/* Listings show a prefix of the leases of other processes. */
static int check_listed_id(const char *field, const ProtobufCBinaryData *id, wb_err *err)
{
    if (id->len == WB_LEASE_ID_PREFIX_LEN && id->data)
        return WB_OK;
    return check_lease_id(field, id, err);
}

static int missing(const char *what, wb_err *err)
{
    return wb__err_set(err, WB_EPROTO, "%s is missing", what);
}

/* Container records come from clients (heartbeats) and go back out in
 * listings: the same limits apply both ways. `field` names the array. What
 * needs the lease (ids unique, no more records than containers) is checked
 * by the broker, which knows it. */
static int check_container_records(const char *field, Wbproto__ContainerRecord *const *recs,
                                   size_t n, wb_err *err)
{
    char name[128];
    int rc;
    if (n > WB_MAX_CONTAINER_RECORDS)
        return wb__err_set(err, WB_EPROTO, "%s has %zu container records, at most %d", field, n,
                           WB_MAX_CONTAINER_RECORDS);
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s[%zu]", field, i);
        if (!recs[i])
            return missing(name, err);
        snprintf(name, sizeof name, "%s[%zu].aoti_api", field, i);
        if ((rc = check_name(name, recs[i]->aoti_api, err)) != WB_OK)
            return rc;
        size_t len = strlen(recs[i]->aoti_api);
        if (len >= WB_MAX_RECORD_API)
            return wb__err_set(err, WB_EPROTO, "%s has %zu bytes, at most %d", name, len,
                               WB_MAX_RECORD_API - 1);
        len = recs[i]->model_path ? strlen(recs[i]->model_path) : 0;
        if (len >= WB_MAX_RECORD_PATH)
            return wb__err_set(err, WB_EPROTO, "%s[%zu].model_path has %zu bytes, at most %d",
                               field, i, len, WB_MAX_RECORD_PATH - 1);
        /* Milliseconds: not negative, and not NaN or infinite. */
        double ms = recs[i]->last_swap_ms;
        if (!(ms >= 0 && ms <= WB_MAX_SWAP_MS))
            return wb__err_set(err, WB_EPROTO,
                               "%s[%zu].last_swap_ms is %g, not a number of milliseconds from 0 "
                               "to %g",
                               field, i, ms, (double)WB_MAX_SWAP_MS);
    }
    return WB_OK;
}

static int check_request_body(const Wbproto__Request *req, wb_err *err)
{
    char field[64];
    int rc;
    switch (req->body_case) {
    case WBPROTO__REQUEST__BODY_HELLO:
        return req->hello ? WB_OK : missing("hello", err);
    case WBPROTO__REQUEST__BODY_ACQUIRE:
        if (!req->acquire)
            return missing("acquire", err);
        if (req->acquire->device_uuid && req->acquire->device_uuid[0] &&
            !wb__gpu_uuid_valid(req->acquire->device_uuid))
            return wb__err_set(err, WB_EPROTO,
                               "acquire.device_uuid is not a device UUID (GPU-xxxxxxxx-xxxx-xxxx-"
                               "xxxx-xxxxxxxxxxxx)");
        return check_name("acquire.model", req->acquire->model, err);
    case WBPROTO__REQUEST__BODY_RELEASE:
        if (!req->release)
            return missing("release", err);
        return check_lease_id("release.lease_id", &req->release->lease_id, err);
    case WBPROTO__REQUEST__BODY_HEARTBEAT: {
        const Wbproto__HeartbeatRequest *hb = req->heartbeat;
        if (!hb)
            return missing("heartbeat", err);
        if (hb->n_leases > WB_MAX_BEATS)
            return wb__err_set(err, WB_EPROTO, "heartbeat has %zu leases, at most %d", hb->n_leases,
                               WB_MAX_BEATS);
        for (size_t i = 0; i < hb->n_leases; i++) {
            snprintf(field, sizeof field, "heartbeat.leases[%zu]", i);
            if (!hb->leases[i])
                return missing(field, err);
            snprintf(field, sizeof field, "heartbeat.leases[%zu].lease_id", i);
            if ((rc = check_lease_id(field, &hb->leases[i]->lease_id, err)) != WB_OK)
                return rc;
            snprintf(field, sizeof field, "heartbeat.leases[%zu].container_records", i);
            rc = check_container_records(field, hb->leases[i]->container_records,
                                         hb->leases[i]->n_container_records, err);
            if (rc != WB_OK)
                return rc;
        }
        return WB_OK;
    }
    case WBPROTO__REQUEST__BODY_LIST_LEASES:
        return req->list_leases ? WB_OK : missing("list_leases", err);
    case WBPROTO__REQUEST__BODY_LIST_MODELS:
        return req->list_models ? WB_OK : missing("list_models", err);
    case WBPROTO__REQUEST__BODY_LOAD:
        /* load.name is checked by the load operation itself, which answers
         * WB_EINVAL for a name outside [A-Za-z0-9._-]{1,255}. */
        if (!req->load || !req->load->name)
            return missing("load", err);
        if (req->load->placement && strlen(req->load->placement) > WB_PLACEMENT_TEXT_MAX)
            return wb__err_set(err, WB_EPROTO, "load.placement has %zu bytes, at most %d",
                               strlen(req->load->placement), WB_PLACEMENT_TEXT_MAX);
        return check_path("load.path", req->load->path, err);
    case WBPROTO__REQUEST__BODY_UNLOAD:
        if (!req->unload)
            return missing("unload", err);
        return check_name("unload.name", req->unload->name, err);
    case WBPROTO__REQUEST__BODY_ROLLOUT:
        /* rollout.name's character set is the operation's, as load's. */
        if (!req->rollout)
            return missing("rollout", err);
        if ((rc = check_name("rollout.name", req->rollout->name, err)) != WB_OK)
            return rc;
        if (req->rollout->placement && strlen(req->rollout->placement) > WB_PLACEMENT_TEXT_MAX)
            return wb__err_set(err, WB_EPROTO, "rollout.placement has %zu bytes, at most %d",
                               strlen(req->rollout->placement), WB_PLACEMENT_TEXT_MAX);
        return check_path("rollout.path", req->rollout->path, err);
    case WBPROTO__REQUEST__BODY_ROLLBACK:
        if (!req->rollback)
            return missing("rollback", err);
        return check_name("rollback.name", req->rollback->name, err);
    case WBPROTO__REQUEST__BODY_TIER:
        if (!req->tier)
            return missing("tier", err);
        return check_name("tier.name", req->tier->name, err);
    case WBPROTO__REQUEST__BODY_SUBSCRIBE:
        if (!req->subscribe)
            return missing("subscribe", err);
        return check_name("subscribe.model", req->subscribe->model, err);
    case WBPROTO__REQUEST__BODY_PUBLISH_BEGIN:
        return wb__wire_check_publish_begin(req->publish_begin, err);
    case WBPROTO__REQUEST__BODY_PUBLISH_COMMIT:
        return wb__wire_check_publish_commit(req->publish_commit, err);
    case WBPROTO__REQUEST__BODY_PUBLISH_ABORT:
        return wb__wire_check_publish_abort(req->publish_abort, err);
    case WBPROTO__REQUEST__BODY_STATS:
        return req->stats ? WB_OK : missing("stats", err);
    case WBPROTO__REQUEST__BODY_LIST_CONTAINERS:
        return req->list_containers ? WB_OK : missing("list_containers", err);
    case WBPROTO__REQUEST__BODY__NOT_SET:
    default:
        return wb__err_set(err, WB_EPROTO, "request has no body");
    }
}

int wb__request_decode(const uint8_t *buf, size_t len, Wbproto__Request **out, uint64_t *id,
                       wb_err *err)
{
    return wb__request_decode_ex(buf, len, out, id, NULL, err);
}

int wb__request_decode_ex(const uint8_t *buf, size_t len, Wbproto__Request **out, uint64_t *id,
                          size_t *peak, wb_err *err)
{
    if (peak)
        *peak = 0;
    *out = NULL;
    *id = 0;
    if (len == 0 || !buf)
        return wb__err_set(err, WB_EPROTO, "empty request (0 bytes)");
    if (len > WB_MAX_MESSAGE)
        return wb__err_set(err, WB_EPROTO, "request of %zu bytes exceeds the limit of %u bytes",
                           len, WB_MAX_MESSAGE);
    int rc = wb__wire_scan_request(buf, len, err);
    if (rc == WB_EPROTO) {
        *id = wb__request_scan_id(buf, len);
        return rc;
    }
    size_t held = 0;
    int over = 0, nomem = 0;
    Wbproto__Request *req =
        rc == WB_OK ? wb__wire_unpack_request(buf, len, &held, &over, &nomem) : NULL;
    if (peak)
        *peak = held;
    if (!req) {
        *id = wb__request_scan_id(buf, len);
        if (nomem)
            return wb__err_set(err, WB_ENOMEM, "out of memory decoding a request of %zu bytes",
                               len);
        if (over)
            return wb__err_set(err, WB_EPROTO,
                               "decoding the request would take more than %zu bytes (%zu bytes "
                               "of request; fields that are not repeated given again and again, "
                               "or fields this broker does not know)",
                               wb__request_budget(len), len);
        return wb__err_set(err, WB_EPROTO, "request does not decode as wbproto.Request (%zu bytes)",
                           len);
    }
    *id = req->id;
    if (req->version != WB_PROTOCOL_VERSION)
        rc = wb__err_set(err, WB_EVERSION, "protocol version %u, this broker speaks %d",
                         req->version, WB_PROTOCOL_VERSION);
    else if ((rc = check_strings(&req->base, NULL, err)) == WB_OK)
        rc = check_request_body(req, err);
    if (rc != WB_OK) {
        wb__wire_free_request(req);
        return rc;
    }
    *out = req;
    return WB_OK;
}

void wb__request_free(Wbproto__Request **req)
{
    if (req && *req) {
        wb__wire_free_request(*req);
        *req = NULL;
    }
}

static int check_slab(const Wbproto__Slab *s, size_t i, wb_err *err)
{
    if (!s)
        return wb__err_set(err, WB_EPROTO, "lease.slabs[%zu] is missing", i);
    if (s->index != i)
        return wb__err_set(err, WB_EPROTO, "lease.slabs[%zu] has index %u", i, s->index);
    if (s->cuda_ipc_handle.len != 0 && s->cuda_ipc_handle.len != WIRE_CUDA_HANDLE_LEN)
        return wb__err_set(err, WB_EPROTO,
                           "lease.slabs[%zu].cuda_ipc_handle has %zu bytes, expected 0 or %d", i,
                           s->cuda_ipc_handle.len, WIRE_CUDA_HANDLE_LEN);
    /* A cuda-vmm slab comes as a descriptor on the descriptor channel. */
    int vmm = s->transport && strcmp(s->transport, "cuda-vmm") == 0;
    if (vmm && s->backend != WBPROTO__BACKEND__BACKEND_CUDA)
        return wb__err_set(err, WB_EPROTO, "lease.slabs[%zu] is a cuda-vmm slab of a host backend",
                           i);
    if (s->backend == WBPROTO__BACKEND__BACKEND_CUDA && !vmm && s->cuda_ipc_handle.len == 0)
        return wb__err_set(err, WB_EPROTO, "lease.slabs[%zu] is a cuda slab without an IPC handle",
                           i);
    if (s->device_uuid && s->device_uuid[0] && !wb__gpu_uuid_valid(s->device_uuid))
        return wb__err_set(err, WB_EPROTO, "lease.slabs[%zu].device_uuid is not a device UUID", i);
    /* A memfd slab has no name: the client fetches its descriptor. */
    int memfd = s->transport && strcmp(s->transport, "memfd") == 0;
    if (memfd && s->backend != WBPROTO__BACKEND__BACKEND_HOST)
        return wb__err_set(err, WB_EPROTO, "lease.slabs[%zu] is a memfd slab of a cuda backend", i);
    if (s->backend == WBPROTO__BACKEND__BACKEND_HOST && !memfd && !wb__shm_name_valid(s->shm_name))
        return wb__err_set(err, WB_EPROTO,
                           "lease.slabs[%zu].shm_name is not of the form /wb-<pid>-<32 hex>", i);
    return WB_OK;
}

static int check_tensor(const Wbproto__Tensor *t, size_t i, const Wbproto__Lease *lease,
                        wb_err *err)
{
    if (!t)
        return wb__err_set(err, WB_EPROTO, "lease.tensors[%zu] is missing", i);
    if (!t->name || !t->name[0])
        return wb__err_set(err, WB_EPROTO, "lease.tensors[%zu] has no name", i);
    if (!t->dtype || !t->dtype[0])
        return wb__err_set(err, WB_EPROTO, "tensor '%.200s' has no dtype", t->name);
    if (t->n_shape > WB_MAX_DIMS)
        return wb__err_set(err, WB_EPROTO, "tensor '%.200s' has %zu dimensions, at most %d",
                           t->name, t->n_shape, WB_MAX_DIMS);
    if (t->slab >= lease->n_slabs)
        return wb__err_set(err, WB_EPROTO, "tensor '%.200s' names slab %u of %zu", t->name, t->slab,
                           lease->n_slabs);
    uint64_t size = lease->slabs[t->slab]->size;
    if (t->offset > size || t->nbytes > size - t->offset)
        return wb__err_set(err, WB_EPROTO,
                           "tensor '%.200s' (offset %llu, %llu bytes) ends past its slab of %llu "
                           "bytes",
                           t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                           (unsigned long long)size);
    return WB_OK;
}

static int check_lease(const Wbproto__Lease *lease, wb_err *err)
{
    int rc;
    if (!lease)
        return wb__err_set(err, WB_EPROTO, "acquire reply has no lease");
    if ((rc = check_lease_id("lease.id", &lease->id, err)) != WB_OK)
        return rc;
    if ((rc = check_name("lease.model", lease->model, err)) != WB_OK)
        return rc;
    for (size_t i = 0; i < lease->n_slabs; i++) {
        if ((rc = check_slab(lease->slabs[i], i, err)) != WB_OK)
            return rc;
    }
    for (size_t i = 0; i < lease->n_tensors; i++) {
        if ((rc = check_tensor(lease->tensors[i], i, lease, err)) != WB_OK)
            return rc;
    }
    if (lease->tensor_table_cached && (lease->n_tensors || lease->tensor_table.len))
        return wb__err_set(err, WB_EPROTO, "lease says tensor_table_cached but carries %s",
                           lease->n_tensors ? "tensors" : "a tensor_table");
    /* The frame itself is checked by whoever receives it (wb__rpc). */
    if (lease->tensor_table_in_frame &&
        (lease->n_tensors || lease->tensor_table.len || lease->tensor_table_cached))
        return wb__err_set(err, WB_EPROTO, "lease says tensor_table_in_frame but %s",
                           lease->n_tensors          ? "carries tensors"
                           : lease->tensor_table.len ? "carries a tensor_table"
                                                     : "also says tensor_table_cached");
    /* The shared table is mapped and checked by the client (lease.c). */
    const Wbproto__Slab *ts = lease->tensor_table_slab;
    if (ts) {
        if (lease->n_tensors || lease->tensor_table.len || lease->tensor_table_cached ||
            lease->tensor_table_in_frame)
            return wb__err_set(err, WB_EPROTO, "lease has a tensor_table_slab but %s",
                               lease->n_tensors             ? "carries tensors"
                               : lease->tensor_table.len    ? "carries a tensor_table"
                               : lease->tensor_table_cached ? "also says tensor_table_cached"
                                                            : "also says tensor_table_in_frame");
        if (ts->backend != WBPROTO__BACKEND__BACKEND_HOST ||
            (ts->transport && ts->transport[0] && strcmp(ts->transport, "shm") != 0))
            return wb__err_set(err, WB_EPROTO,
                               "lease.tensor_table_slab is not a host shm object (backend %d, "
                               "transport '%.40s')",
                               (int)ts->backend, ts->transport ? ts->transport : "");
        if (!wb__shm_name_valid(ts->shm_name))
            return wb__err_set(err, WB_EPROTO,
                               "lease.tensor_table_slab.shm_name is not of the form "
                               "/wb-<pid>-<32 hex>");
        if (ts->size < WB_TABLE_HEADER || ts->size > WB_TABLE_MAX_SHARED)
            return wb__err_set(err, WB_EPROTO,
                               "lease.tensor_table_slab has %llu bytes (a table has %u to %llu)",
                               (unsigned long long)ts->size, WB_TABLE_HEADER,
                               (unsigned long long)WB_TABLE_MAX_SHARED);
    }
    if (lease->tensor_table.len) {
        if (lease->n_tensors)
            return wb__err_set(err, WB_EPROTO,
                               "lease carries both tensors (%zu) and a tensor_table",
                               lease->n_tensors);
        return wb__tensor_table_check(lease->tensor_table.data, lease->tensor_table.len,
                                      lease->slabs, lease->n_slabs, err);
    }
    return WB_OK;
}

/* A VersionNotice (a notice's body, or an entry of a heartbeat reply's
 * current_versions): a model name, and a version unless it says none. */
static int check_notice(const char *field, const Wbproto__VersionNotice *n, wb_err *err)
{
    char name[160];
    if (!n)
        return missing(field, err);
    snprintf(name, sizeof name, "%s.model", field);
    int rc = check_name(name, n->model, err);
    if (rc != WB_OK)
        return rc;
    if (n->previous_version && n->previous_version == n->version)
        return wb__err_set(err, WB_EPROTO, "%s names version %u as both current and previous",
                           field, n->version);
    return WB_OK;
}

static int check_reply_body(const Wbproto__Reply *rep, wb_err *err)
{
    char field[128];
    int rc;
    switch (rep->body_case) {
    case WBPROTO__REPLY__BODY_HELLO:
        return rep->hello ? WB_OK : missing("hello", err);
    case WBPROTO__REPLY__BODY_ACQUIRE:
        if (!rep->acquire)
            return missing("acquire", err);
        return check_lease(rep->acquire->lease, err);
    case WBPROTO__REPLY__BODY_RELEASE:
        return rep->release ? WB_OK : missing("release", err);
    case WBPROTO__REPLY__BODY_HEARTBEAT:
        if (!rep->heartbeat)
            return missing("heartbeat", err);
        for (size_t i = 0; i < rep->heartbeat->n_unknown_leases; i++) {
            snprintf(field, sizeof field, "heartbeat.unknown_leases[%zu]", i);
            if ((rc = check_lease_id(field, &rep->heartbeat->unknown_leases[i], err)) != WB_OK)
                return rc;
        }
        if (rep->heartbeat->n_current_versions > WB_MAX_SUBSCRIPTIONS)
            return wb__err_set(err, WB_EPROTO, "heartbeat has %zu current versions, at most %d",
                               rep->heartbeat->n_current_versions, WB_MAX_SUBSCRIPTIONS);
        for (size_t i = 0; i < rep->heartbeat->n_current_versions; i++) {
            snprintf(field, sizeof field, "heartbeat.current_versions[%zu]", i);
            if ((rc = check_notice(field, rep->heartbeat->current_versions[i], err)) != WB_OK)
                return rc;
        }
        return WB_OK;
    case WBPROTO__REPLY__BODY_LIST_LEASES:
        if (!rep->list_leases)
            return missing("list_leases", err);
        for (size_t i = 0; i < rep->list_leases->n_leases; i++) {
            const Wbproto__LeaseInfo *li = rep->list_leases->leases[i];
            snprintf(field, sizeof field, "list_leases.leases[%zu]", i);
            if (!li)
                return missing(field, err);
            snprintf(field, sizeof field, "list_leases.leases[%zu].id", i);
            if ((rc = check_listed_id(field, &li->id, err)) != WB_OK)
                return rc;
            snprintf(field, sizeof field, "list_leases.leases[%zu].container_records", i);
            rc =
                check_container_records(field, li->container_records, li->n_container_records, err);
            if (rc != WB_OK)
                return rc;
        }
        return WB_OK;
    case WBPROTO__REPLY__BODY_LIST_CONTAINERS:
        if (!rep->list_containers)
            return missing("list_containers", err);
        for (size_t i = 0; i < rep->list_containers->n_containers; i++) {
            const Wbproto__ContainerInfo *ci = rep->list_containers->containers[i];
            snprintf(field, sizeof field, "list_containers.containers[%zu]", i);
            if (!ci)
                return missing(field, err);
            snprintf(field, sizeof field, "list_containers.containers[%zu].aoti_api", i);
            if ((rc = check_name(field, ci->aoti_api, err)) != WB_OK)
                return rc;
            for (size_t k = 0; k < ci->n_leases; k++) {
                snprintf(field, sizeof field, "list_containers.containers[%zu].leases[%zu]", i, k);
                if (!ci->leases[k])
                    return missing(field, err);
                snprintf(field, sizeof field,
                         "list_containers.containers[%zu].leases[%zu].lease_id", i, k);
                if ((rc = check_listed_id(field, &ci->leases[k]->lease_id, err)) != WB_OK)
                    return rc;
            }
        }
        return WB_OK;
    case WBPROTO__REPLY__BODY_LIST_MODELS:
        if (!rep->list_models)
            return missing("list_models", err);
        for (size_t i = 0; i < rep->list_models->n_models; i++) {
            snprintf(field, sizeof field, "list_models.models[%zu]", i);
            if (!rep->list_models->models[i])
                return missing(field, err);
            snprintf(field, sizeof field, "list_models.models[%zu].name", i);
            if ((rc = check_name(field, rep->list_models->models[i]->name, err)) != WB_OK)
                return rc;
        }
        return WB_OK;
    case WBPROTO__REPLY__BODY_LOAD:
        if (!rep->load || !rep->load->model)
            return missing("load.model", err);
        return check_name("load.model.name", rep->load->model->name, err);
    case WBPROTO__REPLY__BODY_UNLOAD:
        if (!rep->unload || !rep->unload->model)
            return missing("unload.model", err);
        return check_name("unload.model.name", rep->unload->model->name, err);
    case WBPROTO__REPLY__BODY_STATS:
        return rep->stats ? WB_OK : missing("stats", err);
    case WBPROTO__REPLY__BODY_ROLLOUT:
        if (!rep->rollout || !rep->rollout->model)
            return missing("rollout.model", err);
        return check_name("rollout.model.name", rep->rollout->model->name, err);
    case WBPROTO__REPLY__BODY_ROLLBACK:
        if (!rep->rollback || !rep->rollback->model)
            return missing("rollback.model", err);
        return check_name("rollback.model.name", rep->rollback->model->name, err);
    case WBPROTO__REPLY__BODY_TIER:
        if (!rep->tier || !rep->tier->model)
            return missing("tier.model", err);
        return check_name("tier.model.name", rep->tier->model->name, err);
    case WBPROTO__REPLY__BODY_SUBSCRIBE:
        return rep->subscribe ? WB_OK : missing("subscribe", err);
    case WBPROTO__REPLY__BODY_PUBLISH_BEGIN:
    case WBPROTO__REPLY__BODY_PUBLISH_COMMIT:
    case WBPROTO__REPLY__BODY_PUBLISH_ABORT:
        return wb__wire_check_publish_reply(rep, err);
    case WBPROTO__REPLY__BODY_NOTICE:
        /* Unsolicited: id 0 and status 0, nothing else. */
        if (rep->id != 0 || rep->status != 0)
            return wb__err_set(err, WB_EPROTO, "a notice has id %llu and status %d, not 0 and 0",
                               (unsigned long long)rep->id, (int)rep->status);
        return check_notice("notice", rep->notice, err);
    case WBPROTO__REPLY__BODY__NOT_SET:
    default:
        /* An error reply needs no body; a success always has one. */
        if (rep->status != 0)
            return WB_OK;
        return wb__err_set(err, WB_EPROTO, "reply has status 0 and no body");
    }
}

/* protobuf-c says NULL for both a malformed reply and a failed allocation:
 * these note the second (data: an int set to 1). A reply is freed with
 * wb__protobuf_allocator, which frees the same way. */
static void *reply_alloc(void *data, size_t size)
{
    void *p = wb__malloc(size);
    if (!p)
        *(int *)data = 1;
    return p;
}

static void reply_free(void *data, void *p)
{
    (void)data;
    free(p);
}

int wb__reply_decode(const uint8_t *buf, size_t len, Wbproto__Reply **out, wb_err *err)
{
    *out = NULL;
    if (len == 0 || !buf)
        return wb__err_set(err, WB_EPROTO, "empty reply (0 bytes)");
    if (len > WB_MAX_MESSAGE)
        return wb__err_set(err, WB_EPROTO, "reply of %zu bytes exceeds the limit of %u bytes", len,
                           WB_MAX_MESSAGE);
    int nomem = 0;
    ProtobufCAllocator noting = {reply_alloc, reply_free, &nomem};
    Wbproto__Reply *rep = wbproto__reply__unpack(&noting, len, buf);
    if (!rep && nomem)
        return wb__err_set(err, WB_ENOMEM, "out of memory decoding a reply of %zu bytes", len);
    if (!rep)
        return wb__err_set(err, WB_EPROTO, "reply does not decode as wbproto.Reply (%zu bytes)",
                           len);
    int rc;
    if (rep->version != WB_PROTOCOL_VERSION)
        rc = wb__err_set(err, WB_EVERSION, "reply has protocol version %u, this client speaks %d",
                         rep->version, WB_PROTOCOL_VERSION);
    else if (rep->status > 0)
        rc = wb__err_set(err, WB_EPROTO, "reply has status %d; statuses are 0 or negative",
                         (int)rep->status);
    else if ((rc = check_strings(&rep->base, "reply", err)) == WB_OK)
        rc = check_reply_body(rep, err);
    if (rc != WB_OK) {
        wbproto__reply__free_unpacked(rep, &wb__protobuf_allocator);
        return rc;
    }
    *out = rep;
    return WB_OK;
}

void wb__reply_free(Wbproto__Reply **rep)
{
    if (rep && *rep) {
        wbproto__reply__free_unpacked(*rep, &wb__protobuf_allocator);
        *rep = NULL;
    }
}

uint8_t *wb__request_pack(const Wbproto__Request *req, size_t *len)
{
    size_t n = wbproto__request__get_packed_size(req);
    /* One spare byte so that an empty message still gets a real buffer. */
    uint8_t *buf = wb__malloc(n + 1);
    if (!buf)
        return NULL;
    *len = wbproto__request__pack(req, buf);
    return buf;
}

uint8_t *wb__reply_pack(const Wbproto__Reply *rep, size_t *len)
{
    size_t n = wbproto__reply__get_packed_size(rep);
    uint8_t *buf = wb__malloc(n + 1);
    if (!buf)
        return NULL;
    *len = wbproto__reply__pack(rep, buf);
    return buf;
}

const char *wb__lease_state_name(int state)
{
    switch (state) {
    case WBPROTO__LEASE_STATE__LEASE_ACTIVE:
        return "active";
    case WBPROTO__LEASE_STATE__LEASE_STALE:
        return "stale";
    default:
        return "unknown";
    }
}

int wb__version_rank(int state, int current)
{
    switch (state) {
    case WBPROTO__MODEL_STATE__MODEL_READY:
        return current ? 5 : 3;
    case WBPROTO__MODEL_STATE__MODEL_LOADING:
        return 4;
    case WBPROTO__MODEL_STATE__MODEL_DRAINING:
        return 2;
    default:
        return 1;
    }
}

const char *wb__model_state_name(int state)
{
    switch (state) {
    case WBPROTO__MODEL_STATE__MODEL_LOADING:
        return "loading";
    case WBPROTO__MODEL_STATE__MODEL_READY:
        return "ready";
    case WBPROTO__MODEL_STATE__MODEL_DRAINING:
        return "draining";
    case WBPROTO__MODEL_STATE__MODEL_FREED:
        return "freed";
    case WBPROTO__MODEL_STATE__MODEL_FAILED:
        return "failed";
    default:
        return "unknown";
    }
}

const char *wb__backend_name(int backend)
{
    switch (backend) {
    case WBPROTO__BACKEND__BACKEND_HOST:
        return "host";
    case WBPROTO__BACKEND__BACKEND_CUDA:
        return "cuda";
    default:
        return "unknown";
    }
}
