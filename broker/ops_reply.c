/* What every reply is made with: its context's release, error replies (which
 * drop any body and frame), and strings made valid UTF-8 for the wire. */
#include "ops_impl.h"

#include <stdarg.h>
#include <string.h>

static const char oom_message[] = "out of memory building the reply";

void wb__ops_reply_free(wb_ops_reply *r)
{
    wb__arena_free(&r->arena);
    *r = (wb_ops_reply)WB_OPS_REPLY_INIT;
}

const char *wb__ops_utf8(wb_arena *a, const char *s)
{
    if (!s)
        return "";
    size_t n = strlen(s);
    if (wb__utf8_invalid_at(s, n) == n)
        return s;
    char *out = wb__arena_alloc(a, 3 * n + 1);
    return out ? wb__utf8_repair(out, s) : NULL;
}

void wb__ops_error(wb_ops_reply *r, uint64_t id, int status, const char *msg)
{
    Wbproto__Reply *rep = &r->msg;
    rep->version = WB_PROTOCOL_VERSION;
    rep->id = id;
    rep->status = status;
    rep->body_case = WBPROTO__REPLY__BODY__NOT_SET;
    r->frame = NULL;
    r->frame_len = 0;
    /* A message may quote a path or a name the broker did not get from a
     * peer (its command line, a file): UTF-8 before it goes out. */
    const char *text = msg ? msg : wb_strerror(status);
    char *s = wb__arena_strdup(&r->arena, text);
    const char *t = s ? wb__ops_utf8(&r->arena, s) : NULL;
    if (!t) {
        /* Out of memory: the message all the same, in the context's own
         * buffer, its bytes past ASCII as '?' (always UTF-8). */
        size_t i = 0;
        for (; text[i] && i + 1 < sizeof r->errbuf; i++)
            r->errbuf[i] = (unsigned char)text[i] < 0x80 ? text[i] : '?';
        r->errbuf[i] = '\0';
        t = r->errbuf;
    }
    rep->error = (char *)t;
}

int wb__ops_fail(wb_ops_reply *r, int status, const char *fmt, ...)
{
    wb_err err;
    va_list ap;
    va_start(ap, fmt);
    wb__err_vset(&err, status, fmt, ap);
    va_end(ap);
    wb__ops_error(r, r->msg.id, status, err.msg);
    return 0;
}

int wb__ops_oom(wb_ops_reply *r)
{
    return wb__ops_fail(r, WB_ENOMEM, "%s", oom_message);
}
