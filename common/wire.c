#include "wire.h"

#include "alloc.h"
#include "devlist.h"
#include "placement.h"
#include "shm.h"

#include <limits.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* The largest number of dimensions a tensor may have (as the safetensors
 * reader enforces); the client sizes shape arrays and strides from it. */
#define WIRE_MAX_DIMS 64
/* The size of a cudaIpcMemHandle_t. */
#define WIRE_CUDA_HANDLE_LEN 64

/* Reads one base-128 varint; returns the number of bytes used or 0 when the
 * buffer ends first or the varint is longer than 10 bytes. */
static size_t read_varint(const uint8_t *p, size_t len, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len && i < 10; i++) {
        v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *out = v;
            return i + 1;
        }
    }
    return 0;
}

uint64_t wb__request_scan_id(const uint8_t *buf, size_t len)
{
    size_t pos = 0;
    uint64_t id = 0;
    while (pos < len) {
        uint64_t key, v;
        size_t n = read_varint(buf + pos, len - pos, &key);
        if (n == 0)
            return id;
        pos += n;
        switch (key & 7) {
        case 0: /* varint */
            n = read_varint(buf + pos, len - pos, &v);
            if (n == 0)
                return id;
            pos += n;
            if ((key >> 3) == 2)
                id = v;
            break;
        case 1: /* 64-bit */
            if (len - pos < 8)
                return id;
            pos += 8;
            break;
        case 2: /* length-delimited */
            n = read_varint(buf + pos, len - pos, &v);
            if (n == 0)
                return id;
            pos += n;
            if (v > len - pos)
                return id;
            pos += (size_t)v;
            break;
        case 5: /* 32-bit */
            if (len - pos < 4)
                return id;
            pos += 4;
            break;
        default:
            return id;
        }
    }
    return id;
}

/* Appends "name" or "name[k]" (k != SIZE_MAX) to the path of len bytes;
 * returns the new length (the path is cut short rather than overflowed). */
static size_t path_push(char *path, size_t cap, size_t len, const char *name, size_t k)
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
                at = path_push(path, cap, 0, root, SIZE_MAX);
            at = path_push(path, cap, at, f->name,
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
static int check_name(const char *field, const char *s, wb_err *err)
{
    if (!s || !s[0])
        return wb__err_set(err, WB_EPROTO, "%s is empty", field);
    size_t n = strlen(s);
    if (n > WB_NAME_MAX)
        return wb__err_set(err, WB_EPROTO, "%s has %zu bytes, at most %d", field, n, WB_NAME_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return wb__err_set(err, WB_EPROTO, "%s has a control character (0x%02x) at byte %zu",
                               field, c, i);
    }
    return WB_OK;
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
    case WBPROTO__REQUEST__BODY_STATS:
        return req->stats ? WB_OK : missing("stats", err);
    case WBPROTO__REQUEST__BODY_LIST_CONTAINERS:
        return req->list_containers ? WB_OK : missing("list_containers", err);
    case WBPROTO__REQUEST__BODY__NOT_SET:
    default:
        return wb__err_set(err, WB_EPROTO, "request has no body");
    }
}

/* The most entries each repeated field of a request may have (wb.proto's
 * bounds, wire.h), checked on the wire bytes before protobuf-c allocates
 * anything: decoding a heartbeat's 349,514 empty records (1 MiB) took 63 MB
 * and 129 ms before the count was looked at. Every repeated field a request
 * can reach has one (test_wire walks the descriptors). `noun` says what the
 * entries are; `whole` names the message that holds the field rather than
 * the field (as "heartbeat has 5000 leases"). */
typedef struct wire_bound {
    const ProtobufCMessageDescriptor *msg;
    uint32_t field, max;
    const char *noun;
    int whole;
} wire_bound;

static const wire_bound request_bounds[] = {
    {&wbproto__heartbeat_request__descriptor, 1, WB_MAX_BEATS, "leases", 1},
    {&wbproto__lease_beat__descriptor, 40, WB_MAX_CONTAINER_RECORDS, "container records", 0},
};

static const wire_bound *find_bound(const ProtobufCMessageDescriptor *msg, uint32_t field)
{
    for (size_t i = 0; i < sizeof request_bounds / sizeof request_bounds[0]; i++) {
        if (request_bounds[i].msg == msg && request_bounds[i].field == field)
            return &request_bounds[i];
    }
    return NULL;
}

uint32_t wb__request_bound(const ProtobufCMessageDescriptor *msg, uint32_t field)
{
    const wire_bound *b = find_bound(msg, field);
    return b ? b->max : 0;
}

/* The most fields a request's message type has, for the scan's counters. */
#define WIRE_SCAN_FIELDS 64
/* A wire format protobuf-c refuses too (the scan stops at it). */
#define WIRE_MALFORMED 1

/* One field's key and extent at p (len bytes left), as protobuf-c reads
 * them: a key of at most 5 bytes whose first byte has a tag; a varint of at
 * most 10 bytes; a length of at most 5 bytes, INT_MAX and what is left; no
 * groups. Returns the bytes of key and value, 0 when malformed; *data and
 * *n are the value (a length-delimited one without its length). */
static size_t scan_field(const uint8_t *p, size_t len, uint32_t *tag, unsigned *wire,
                         const uint8_t **data, size_t *n)
{
    uint64_t key, v;
    size_t k = read_varint(p, len < 5 ? len : 5, &key);
    if (k == 0 || (p[0] & 0xf8) == 0)
        return 0;
    *tag = (uint32_t)(key >> 3);
    *wire = (unsigned)(key & 7);
    len -= k;
    p += k;
    size_t h = 0, size;
    switch (*wire) {
    case 0: /* varint */
        if ((size = read_varint(p, len, &v)) == 0)
            return 0;
        break;
    case 1: /* 64-bit */
        size = 8;
        break;
    case 5: /* 32-bit */
        size = 4;
        break;
    case 2: /* length-delimited */
        h = read_varint(p, len < 5 ? len : 5, &v);
        if (h == 0 || v > INT_MAX)
            return 0;
        size = (size_t)v;
        break;
    default:
        return 0;
    }
    if (h + size > len)
        return 0;
    *data = p + h;
    *n = size;
    return k + h + size;
}

/* The entries of one occurrence of repeated field f: a packed run holds
 * several, as protobuf-c counts them. */
static size_t scan_entries(const ProtobufCFieldDescriptor *f, unsigned wire, const uint8_t *data,
                           size_t n)
{
    if (wire != 2 || f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES ||
        f->type == PROTOBUF_C_TYPE_MESSAGE)
        return 1;
    switch (f->type) {
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return n / 4;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return n / 8;
    default: {
        size_t c = 0;
        for (size_t i = 0; i < n; i++)
            c += !(data[i] & 0x80);
        return c;
    }
    }
}

/* The counts of one message (`members` fields on the wire, counts[i] of
 * field i) against what a request may hold: each repeated field up to its
 * bound, and in all no more fields than its own, each once, plus
 * WB_MAX_UNKNOWN_FIELDS, since protobuf-c holds 32 bytes per field on the
 * wire while it decodes a message and keeps every unknown one. (A oneof
 * given again keeps its last, each checked as it comes; requests have no
 * other message field that is not repeated, which protobuf-c would merge.) */
static int check_counts(const ProtobufCMessageDescriptor *d, const size_t *counts, size_t members,
                        char *path, size_t cap, size_t plen, wb_err *err)
{
    const char *self = plen ? path : "request";
    size_t most = WB_MAX_UNKNOWN_FIELDS;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const wire_bound *b = find_bound(d, f->id);
        if (f->label != PROTOBUF_C_LABEL_REPEATED) {
            most++;
            continue;
        }
        most += b ? b->max : 0;
        if (counts[i] <= (b ? b->max : 0))
            continue;
        if (b && b->whole)
            return wb__err_set(err, WB_EPROTO, "%s has %zu %s, at most %u", self, counts[i],
                               b->noun, b->max);
        path_push(path, cap, plen, f->name, SIZE_MAX);
        if (b)
            wb__err_set(err, WB_EPROTO, "%s has %zu %s, at most %u", path, counts[i], b->noun,
                        b->max);
        else
            wb__err_set(err, WB_EPROTO, "%s has %zu entries; a request may not have any", path,
                        counts[i]);
        path[plen] = '\0';
        return WB_EPROTO;
    }
    if (members > most)
        return wb__err_set(err, WB_EPROTO,
                           "%s has %zu fields on the wire, at most %zu: its own once each "
                           "(repeated ones up to their bounds) and %d more, unknown to this "
                           "broker or given again",
                           self, members, most, WB_MAX_UNKNOWN_FIELDS);
    return WB_OK;
}

/* Walks one message of type d in p[0..len) before it is decoded: counts its
 * fields (check_counts), then does the same inside every sub-message
 * protobuf-c would decode. Cost: two reads of the bytes per level of
 * nesting (wb.proto's requests nest 4 deep), no allocation. Returns WB_OK,
 * WIRE_MALFORMED (bytes protobuf-c refuses as well), or WB_EPROTO naming
 * the field. `path` (cap bytes, plen used) names the message. */
static int scan_message(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len,
                        char *path, size_t cap, size_t plen, wb_err *err)
{
    size_t counts[WIRE_SCAN_FIELDS] = {0}, seen[WIRE_SCAN_FIELDS] = {0};
    size_t members = 0;
    if (d->n_fields > WIRE_SCAN_FIELDS)
        return wb__err_set(err, WB_EPROTO, "%s has %u fields, more than the decoder counts",
                           d->name, d->n_fields);
    for (int pass = 0; pass < 2; pass++) {
        /* Fields come in runs (a repeated one's entries): one look-up each. */
        uint32_t last_tag = 0;
        const ProtobufCFieldDescriptor *f = NULL;
        for (size_t pos = 0; pos < len;) {
            uint32_t tag;
            unsigned wire;
            const uint8_t *data;
            size_t n, used = scan_field(p + pos, len - pos, &tag, &wire, &data, &n);
            if (used == 0)
                return WIRE_MALFORMED;
            pos += used;
            if (tag != last_tag) {
                f = protobuf_c_message_descriptor_get_field(d, tag);
                last_tag = tag;
            }
            size_t i = f ? (size_t)(f - d->fields) : 0;
            int repeated = f && f->label == PROTOBUF_C_LABEL_REPEATED;
            if (pass == 0) {
                members++;
                if (f)
                    counts[i] += repeated ? scan_entries(f, wire, data, n) : 1;
                continue;
            }
            /* Unknown fields are kept as bytes, never decoded. */
            if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE || wire != 2)
                continue;
            size_t at = path_push(path, cap, plen, f->name, repeated ? seen[i] : SIZE_MAX);
            seen[i]++;
            int rc = scan_message(f->descriptor, data, n, path, cap, at, err);
            path[plen] = '\0';
            if (rc != WB_OK)
                return rc;
        }
        if (pass == 0) {
            int rc = check_counts(d, counts, members, path, cap, plen, err);
            if (rc != WB_OK)
                return rc;
        }
    }
    return WB_OK;
}

/* protobuf-c's allocations while decoding one request, counted against a
 * budget: each block carries its size in front, so that a free can count
 * it back. With a NULL budget (freeing a request) nothing is counted.
 * `over`: refused for the budget; `nomem`: the allocator said no. */
typedef struct wire_budget {
    size_t used, peak, limit;
    int over, nomem;
} wire_budget;

#define WIRE_BLOCK_HEADER alignof(max_align_t)

static void *budget_alloc(void *data, size_t size)
{
    wire_budget *b = data;
    if (size > SIZE_MAX - WIRE_BLOCK_HEADER)
        return NULL;
    size_t total = size + WIRE_BLOCK_HEADER;
    if (b && (total > b->limit || b->used > b->limit - total)) {
        b->over = 1;
        return NULL;
    }
    unsigned char *p = wb__malloc(total);
    if (!p) {
        if (b)
            b->nomem = 1;
        return NULL;
    }
    memcpy(p, &total, sizeof total);
    if (b) {
        b->used += total;
        if (b->used > b->peak)
            b->peak = b->used;
    }
    return p + WIRE_BLOCK_HEADER;
}

static void budget_free(void *data, void *ptr)
{
    if (!ptr)
        return;
    unsigned char *p = (unsigned char *)ptr - WIRE_BLOCK_HEADER;
    wire_budget *b = data;
    if (b) {
        size_t total;
        memcpy(&total, p, sizeof total);
        b->used -= total;
    }
    free(p);
}

/* Frees what budget_alloc allocated, without counting. */
static ProtobufCAllocator request_allocator = {budget_alloc, budget_free, NULL};

size_t wb__request_budget(size_t len)
{
    return WB_REQUEST_BUDGET_BASE + WB_REQUEST_BUDGET_PER_BYTE * len;
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
    char path[256] = "";
    int rc = scan_message(&wbproto__request__descriptor, buf, len, path, sizeof path, 0, err);
    if (rc == WB_EPROTO) {
        *id = wb__request_scan_id(buf, len);
        return rc;
    }
    wire_budget budget = {.limit = wb__request_budget(len)};
    ProtobufCAllocator counted = {budget_alloc, budget_free, &budget};
    Wbproto__Request *req = rc == WB_OK ? wbproto__request__unpack(&counted, len, buf) : NULL;
    if (peak)
        *peak = budget.peak;
    if (!req) {
        *id = wb__request_scan_id(buf, len);
        if (budget.nomem && !budget.over)
            return wb__err_set(err, WB_ENOMEM, "out of memory decoding a request of %zu bytes",
                               len);
        if (budget.over)
            return wb__err_set(err, WB_EPROTO,
                               "decoding the request would take more than %zu bytes (%zu bytes "
                               "of request; fields that are not repeated given again and again, "
                               "or fields this broker does not know)",
                               budget.limit, len);
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
        wbproto__request__free_unpacked(req, &request_allocator);
        return rc;
    }
    *out = req;
    return WB_OK;
}

void wb__request_free(Wbproto__Request **req)
{
    if (req && *req) {
        wbproto__request__free_unpacked(*req, &request_allocator);
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
    if (t->n_shape > WIRE_MAX_DIMS)
        return wb__err_set(err, WB_EPROTO, "tensor '%.200s' has %zu dimensions, at most %d",
                           t->name, t->n_shape, WIRE_MAX_DIMS);
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

typedef struct table_header {
    uint32_t magic, n, dims, strings;
} table_header;
_Static_assert(sizeof(table_header) == WB_TABLE_HEADER, "the table header is 16 bytes");
_Static_assert(sizeof(wb_table_tensor) == WB_TABLE_RECORD, "a table record is 40 bytes");

/* The dtype strings already written (a handful per model), so that equal
 * dtypes share one string. */
typedef struct dtype_seen {
    const char *name;
    uint32_t at;
} dtype_seen;

uint8_t *wb__tensor_table_pack(Wbproto__Tensor *const *tensors, size_t n, size_t *len)
{
    uint64_t dims = 0, strings = 0;
    dtype_seen seen[16];
    size_t n_seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (tensors[i]->n_shape > UINT16_MAX || tensors[i]->slab > UINT16_MAX)
            return NULL;
        dims += tensors[i]->n_shape;
        strings += strlen(tensors[i]->name) + strlen(tensors[i]->dtype) + 2;
    }
    if (strings == 0)
        strings = 1; /* the final NUL the layout promises */
    uint64_t total = WB_TABLE_HEADER + (uint64_t)n * WB_TABLE_RECORD + dims * 8 + strings;
    if (n > UINT32_MAX || total > UINT32_MAX)
        return NULL;
    uint8_t *buf = wb__calloc(1, (size_t)total);
    if (!buf)
        return NULL;
    uint8_t *rec = buf + WB_TABLE_HEADER;
    uint8_t *dim = rec + n * WB_TABLE_RECORD;
    char *str = (char *)(dim + dims * 8);
    uint32_t sp = 0, dp = 0;
    for (size_t i = 0; i < n; i++) {
        const Wbproto__Tensor *t = tensors[i];
        size_t ln = strlen(t->name) + 1;
        wb_table_tensor r = {.offset = t->offset,
                             .nbytes = t->nbytes,
                             .xxh3 = t->xxh3,
                             .name = sp,
                             .dim = dp,
                             .ndim = (uint16_t)t->n_shape,
                             .slab = (uint16_t)t->slab};
        memcpy(str + sp, t->name, ln);
        sp += (uint32_t)ln;
        size_t k = 0;
        while (k < n_seen && strcmp(seen[k].name, t->dtype) != 0)
            k++;
        if (k < n_seen) {
            r.dtype = seen[k].at;
        } else {
            size_t ld = strlen(t->dtype) + 1;
            r.dtype = sp;
            memcpy(str + sp, t->dtype, ld);
            if (n_seen < sizeof seen / sizeof seen[0])
                seen[n_seen++] = (dtype_seen){t->dtype, sp};
            sp += (uint32_t)ld;
        }
        if (t->n_shape)
            memcpy(dim + (size_t)dp * 8, t->shape, t->n_shape * 8);
        dp += (uint32_t)t->n_shape;
        memcpy(rec + i * WB_TABLE_RECORD, &r, sizeof r);
    }
    /* Shared dtypes leave the strings shorter than reserved: the table
     * ends at the last one written. */
    if (sp == 0)
        sp = 1;
    table_header h = {WB_TABLE_MAGIC, (uint32_t)n, (uint32_t)dims, sp};
    memcpy(buf, &h, sizeof h);
    *len = (size_t)(total - strings + sp);
    return buf;
}

/* Names the tensor whose string holds byte `bad` of the strings. */
static int table_bad_string(const uint8_t *table, const table_header *h, const char *str,
                            size_t bad, wb_err *err)
{
    size_t start = bad;
    while (start > 0 && str[start - 1] != '\0')
        start--;
    for (uint32_t i = 0; i < h->n; i++) {
        wb_table_tensor r;
        memcpy(&r, table + WB_TABLE_HEADER + (size_t)i * WB_TABLE_RECORD, sizeof r);
        if (r.name == start || r.dtype == start)
            return wb__err_set(err, WB_EPROTO,
                               "lease.tensor_table[%u].%s is not valid UTF-8 (byte %zu)", i,
                               r.name == start ? "name" : "dtype", bad - start);
    }
    return wb__err_set(err, WB_EPROTO,
                       "lease.tensor_table's strings are not valid UTF-8 (byte %zu of them)", bad);
}

int wb__tensor_table_check(const uint8_t *table, size_t len, Wbproto__Slab *const *slabs,
                           size_t n_slabs, wb_err *err)
{
    table_header h;
    if (len < WB_TABLE_HEADER)
        return wb__err_set(err, WB_EPROTO, "lease.tensor_table has %zu bytes, less than a header",
                           len);
    memcpy(&h, table, sizeof h);
    if (h.magic != WB_TABLE_MAGIC)
        return wb__err_set(err, WB_EPROTO, "lease.tensor_table has magic 0x%08x, not 0x%08x",
                           h.magic, WB_TABLE_MAGIC);
    uint64_t want = WB_TABLE_HEADER + (uint64_t)h.n * WB_TABLE_RECORD + (uint64_t)h.dims * 8 +
                    (uint64_t)h.strings;
    if (want != len)
        return wb__err_set(err, WB_EPROTO,
                           "lease.tensor_table has %zu bytes but its header (%u tensors, %u dims, "
                           "%u string bytes) needs %llu",
                           len, h.n, h.dims, h.strings, (unsigned long long)want);
    const char *str = (const char *)table + (len - h.strings);
    /* With a NUL last, every offset inside the strings starts a string that
     * ends inside them. */
    if (h.strings == 0 || str[h.strings - 1] != '\0')
        return wb__err_set(err, WB_EPROTO, "lease.tensor_table's strings do not end with a NUL");
    /* Names and dtypes reach the caller as strings (and Python's str):
     * UTF-8, as the Tensor messages' strings are. The strings are the
     * names one after the other, so one pass checks them all. */
    size_t bad = wb__utf8_invalid_at(str, h.strings);
    if (bad < h.strings)
        return table_bad_string(table, &h, str, bad, err);
    for (uint32_t i = 0; i < h.n; i++) {
        wb_table_tensor r;
        memcpy(&r, table + WB_TABLE_HEADER + (size_t)i * WB_TABLE_RECORD, sizeof r);
        if (r.name >= h.strings || !str[r.name])
            return wb__err_set(err, WB_EPROTO, "lease.tensor_table[%u] has no name", i);
        const char *name = str + r.name;
        if (r.dtype >= h.strings || !str[r.dtype])
            return wb__err_set(err, WB_EPROTO, "tensor '%.200s' has no dtype", name);
        if (r.ndim > WIRE_MAX_DIMS || r.dim > h.dims || r.ndim > h.dims - r.dim)
            return wb__err_set(err, WB_EPROTO,
                               "tensor '%.200s' has %u dimensions from dim %u (of %u, at most %d "
                               "each)",
                               name, r.ndim, r.dim, h.dims, WIRE_MAX_DIMS);
        if (r.slab >= n_slabs)
            return wb__err_set(err, WB_EPROTO, "tensor '%.200s' names slab %u of %zu", name, r.slab,
                               n_slabs);
        uint64_t size = slabs[r.slab]->size;
        if (r.offset > size || r.nbytes > size - r.offset)
            return wb__err_set(err, WB_EPROTO,
                               "tensor '%.200s' (offset %llu, %llu bytes) ends past its slab of "
                               "%llu bytes",
                               name, (unsigned long long)r.offset, (unsigned long long)r.nbytes,
                               (unsigned long long)size);
    }
    return WB_OK;
}

void wb__tensor_table_digest(const uint8_t *table, size_t len, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(table, len));
    memcpy(out, c.digest, 16);
}

uint32_t wb__tensor_table_count(const uint8_t *table)
{
    table_header h;
    memcpy(&h, table, sizeof h);
    return h.n;
}

void wb__tensor_table_get(const uint8_t *table, uint32_t i, wb_table_tensor *out)
{
    memcpy(out, table + WB_TABLE_HEADER + (size_t)i * WB_TABLE_RECORD, sizeof *out);
}

const uint64_t *wb__tensor_table_dims(const uint8_t *table)
{
    table_header h;
    memcpy(&h, table, sizeof h);
    return (const uint64_t *)(const void *)(table + WB_TABLE_HEADER +
                                            (size_t)h.n * WB_TABLE_RECORD);
}

const char *wb__tensor_table_strings(const uint8_t *table)
{
    table_header h;
    memcpy(&h, table, sizeof h);
    return (const char *)table + WB_TABLE_HEADER + (size_t)h.n * WB_TABLE_RECORD +
           (size_t)h.dims * 8;
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
