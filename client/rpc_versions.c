/* The subscription replies (SubscribeReply, VersionNotice) decoded and
 * checked for the client's connection. common/wire.c validates the reply
 * bodies it knows and refuses any other with status 0; these two are
 * accepted here when it refuses them, with the same checks it applies to
 * every reply (size, version, UTF-8 strings) and the names' rules. */
#include "rpc.h"

#include "alloc.h"
#include "utf8.h"

#include <string.h>

static int name_ok(const char *s)
{
    if (!s || !s[0])
        return 0;
    size_t n = strlen(s);
    if (n > WB_NAME_MAX || wb__utf8_invalid_at(s, n) != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

static int notice_ok(const Wbproto__VersionNotice *n)
{
    return n && name_ok(n->model);
}

int wb__rpc_decode_versions(const uint8_t *buf, size_t len, Wbproto__Reply **out)
{
    *out = NULL;
    if (!buf || len == 0 || len > WB_MAX_MESSAGE)
        return WB_EPROTO;
    Wbproto__Reply *rep = wbproto__reply__unpack(&wb__protobuf_allocator, len, buf);
    if (!rep)
        return WB_EPROTO;
    int ok =
        rep->version == WB_PROTOCOL_VERSION && rep->status == 0 &&
        (!rep->error || wb__utf8_invalid_at(rep->error, strlen(rep->error)) == strlen(rep->error));
    if (ok && rep->body_case == WBPROTO__REPLY__BODY_NOTICE)
        ok = notice_ok(rep->notice);
    else if (ok && rep->body_case == WBPROTO__REPLY__BODY_SUBSCRIBE)
        ok = rep->subscribe != NULL;
    else
        ok = 0;
    if (!ok) {
        wbproto__reply__free_unpacked(rep, &wb__protobuf_allocator);
        return WB_EPROTO;
    }
    *out = rep;
    return WB_OK;
}

int wb__rpc_notice_valid(const Wbproto__VersionNotice *n)
{
    return notice_ok(n);
}
