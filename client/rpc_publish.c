/* The publish replies (PublishBeginReply, PublishCommitReply,
 * PublishAbortReply) decoded and checked for the client's connection until
 * common/wire.c knows them: it validates the reply bodies it knows and
 * refuses any other with status 0. Accepted here when it refuses them, with
 * the checks it applies to every reply (size, version, UTF-8 strings).
 * Remove this file (and its call in rpc.c) once common/wire.c decodes these
 * bodies itself. */
#include "rpc.h"

#include "alloc.h"
#include "utf8.h"

#include <stdlib.h>
#include <string.h>

static int text_ok(const char *s)
{
    return !s || wb__utf8_invalid_at(s, strlen(s)) == strlen(s);
}

static int model_ok(const Wbproto__ModelInfo *m)
{
    return m && m->name && m->name[0] && strlen(m->name) <= WB_NAME_MAX && text_ok(m->name) &&
           text_ok(m->checksums);
}

/* protobuf-c says NULL for both a malformed reply and a failed allocation:
 * these note the second. */
static void *note_alloc(void *data, size_t size)
{
    void *p = wb__malloc(size);
    if (!p)
        *(int *)data = 1;
    return p;
}

static void note_free(void *data, void *p)
{
    (void)data;
    free(p);
}

int wb__rpc_decode_publish(const uint8_t *buf, size_t len, Wbproto__Reply **out)
{
    *out = NULL;
    if (!buf || len == 0 || len > WB_MAX_MESSAGE)
        return WB_EPROTO;
    int failed = 0;
    ProtobufCAllocator a = {.alloc = note_alloc, .free = note_free, .allocator_data = &failed};
    Wbproto__Reply *rep = wbproto__reply__unpack(&a, len, buf);
    if (!rep)
        return failed ? WB_ENOMEM : WB_EPROTO;
    int ok = rep->version == WB_PROTOCOL_VERSION && rep->status == 0 && text_ok(rep->error);
    if (ok && rep->body_case == WBPROTO__REPLY__BODY_PUBLISH_BEGIN)
        ok = rep->publish_begin && rep->publish_begin->publish_id.len == WB_LEASE_ID_LEN;
    else if (ok && rep->body_case == WBPROTO__REPLY__BODY_PUBLISH_COMMIT)
        ok = rep->publish_commit && model_ok(rep->publish_commit->model);
    else if (ok && rep->body_case == WBPROTO__REPLY__BODY_PUBLISH_ABORT)
        ok = rep->publish_abort != NULL;
    else
        ok = 0;
    if (!ok) {
        wbproto__reply__free_unpacked(rep, &a);
        return WB_EPROTO;
    }
    *out = rep;
    return WB_OK;
}
