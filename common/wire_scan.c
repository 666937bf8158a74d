/* A request's bytes before and while protobuf-c decodes them: its id found
 * without decoding, every repeated field's entries counted against its
 * bound and every message's fields against what it may hold, and the
 * decoder's allocations counted against a byte budget (wire_impl.h).
 * wire.c validates what comes out. */
#include "wire.h"

#include "alloc.h"
#include "wire_impl.h"

#include <limits.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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
    {&wbproto__publish_begin_request__descriptor, 2, WB_PUBLISH_MAX_TENSORS, "tensors", 0},
    {&wbproto__publish_tensor__descriptor, 3, WB_MAX_DIMS, "dimensions", 0},
    {&wbproto__publish_commit_request__descriptor, 2, WB_PUBLISH_MAX_SOURCES_WIRE, "sources", 0},
    {&wbproto__publish_commit_request__descriptor, 3, WB_PUBLISH_MAX_TENSORS, "placements", 0},
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
        wb__wire_path_push(path, cap, plen, f->name, SIZE_MAX);
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
 * WB_WIRE_MALFORMED (bytes protobuf-c refuses as well), or WB_EPROTO naming
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
                return WB_WIRE_MALFORMED;
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
            size_t at = wb__wire_path_push(path, cap, plen, f->name, repeated ? seen[i] : SIZE_MAX);
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
 * it back. With a NULL budget (freeing a request) nothing is counted. */
typedef struct wire_budget {
    size_t used, peak, limit;
    int over, nomem; /* refused for the budget; the allocator said no */
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

int wb__wire_scan_request(const uint8_t *buf, size_t len, wb_err *err)
{
    char path[256] = "";
    return scan_message(&wbproto__request__descriptor, buf, len, path, sizeof path, 0, err);
}

Wbproto__Request *wb__wire_unpack_request(const uint8_t *buf, size_t len, size_t *peak, int *over,
                                          int *nomem)
{
    wire_budget budget = {.limit = wb__request_budget(len)};
    ProtobufCAllocator counted = {budget_alloc, budget_free, &budget};
    Wbproto__Request *req = wbproto__request__unpack(&counted, len, buf);
    *peak = budget.peak;
    *over = budget.over;
    *nomem = budget.nomem && !budget.over;
    return req;
}

void wb__wire_free_request(Wbproto__Request *req)
{
    wbproto__request__free_unpacked(req, &request_allocator);
}

size_t wb__request_budget(size_t len)
{
    return WB_REQUEST_BUDGET_BASE + WB_REQUEST_BUDGET_PER_BYTE * len;
}
