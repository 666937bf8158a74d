/* The checks of the publish messages (wire.c calls them): names, dtypes
 * and shapes of a begin's table, a commit's sources and placements, and the
 * replies' bodies. The repeated fields' counts are bounded on the wire
 * bytes before decoding (wire_scan.c). */
#include "wire_impl.h"

#include "placement.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>

/* A tensor name: 1 to WB_PUBLISH_NAME_MAX bytes, no control character. */
static int check_tensor_name(const char *field, const char *s, wb_err *err)
{
    return wb__wire_check_text(field, s, WB_PUBLISH_NAME_MAX, err);
}

static int check_publish_id(const char *field, const ProtobufCBinaryData *id, wb_err *err)
{
    if (id->len != WB_PUBLISH_ID_BYTES || !id->data)
        return wb__err_set(err, WB_EPROTO, "%s has %zu bytes, not %d", field, id->len,
                           WB_PUBLISH_ID_BYTES);
    return WB_OK;
}

int wb__wire_check_publish_begin(const Wbproto__PublishBeginRequest *rq, wb_err *err)
{
    char field[96];
    int rc;
    if (!rq)
        return wb__err_set(err, WB_EPROTO, "publish_begin is missing");
    if (!rq->model || !rq->model[0] || strlen(rq->model) > WB_NAME_MAX)
        return wb__err_set(err, WB_EPROTO, "publish_begin.model is empty or longer than %d bytes",
                           WB_NAME_MAX);
    if (rq->placement && strlen(rq->placement) > WB_PLACEMENT_TEXT_MAX)
        return wb__err_set(err, WB_EPROTO, "publish_begin.placement has %zu bytes, at most %d",
                           strlen(rq->placement), WB_PLACEMENT_TEXT_MAX);
    for (size_t i = 0; i < rq->n_tensors; i++) {
        const Wbproto__PublishTensor *t = rq->tensors[i];
        snprintf(field, sizeof field, "publish_begin.tensors[%zu]", i);
        if (!t)
            return wb__err_set(err, WB_EPROTO, "%s is missing", field);
        snprintf(field, sizeof field, "publish_begin.tensors[%zu].name", i);
        if ((rc = check_tensor_name(field, t->name, err)) != WB_OK)
            return rc;
        if (!t->dtype || !t->dtype[0] || strlen(t->dtype) > 15)
            return wb__err_set(err, WB_EPROTO,
                               "publish_begin.tensors[%zu].dtype is empty or longer than 15 bytes",
                               i);
        if (t->n_shape > WB_MAX_DIMS)
            return wb__err_set(err, WB_EPROTO,
                               "publish_begin.tensors[%zu].shape has %zu dimensions, at most %d", i,
                               t->n_shape, WB_MAX_DIMS);
    }
    return WB_OK;
}

int wb__wire_check_publish_commit(const Wbproto__PublishCommitRequest *rq, wb_err *err)
{
    char field[96];
    int rc;
    if (!rq)
        return wb__err_set(err, WB_EPROTO, "publish_commit is missing");
    if ((rc = check_publish_id("publish_commit.publish_id", &rq->publish_id, err)) != WB_OK)
        return rc;
    if (rq->n_sources > WB_PUBLISH_MAX_SOURCES_WIRE)
        return wb__err_set(err, WB_EPROTO, "publish_commit has %zu sources, at most %d",
                           rq->n_sources, WB_PUBLISH_MAX_SOURCES_WIRE);
    for (size_t i = 0; i < rq->n_sources; i++) {
        const Wbproto__PublishSource *s = rq->sources[i];
        if (!s)
            return wb__err_set(err, WB_EPROTO, "publish_commit.sources[%zu] is missing", i);
        if (s->cuda_ipc_handle.len && s->cuda_ipc_handle.len != 64)
            return wb__err_set(err, WB_EPROTO,
                               "publish_commit.sources[%zu].cuda_ipc_handle has %zu bytes, not 64",
                               i, s->cuda_ipc_handle.len);
        if (s->device_uuid && strlen(s->device_uuid) > 63)
            return wb__err_set(err, WB_EPROTO,
                               "publish_commit.sources[%zu].device_uuid has %zu bytes, at most 63",
                               i, strlen(s->device_uuid));
        if (s->cuda_ipc_handle.len && s->host_fd > 0)
            return wb__err_set(err, WB_EPROTO,
                               "publish_commit.sources[%zu] names both a CUDA handle and a memfd",
                               i);
    }
    for (size_t i = 0; i < rq->n_tensors; i++) {
        const Wbproto__PublishPlacement *p = rq->tensors[i];
        if (!p)
            return wb__err_set(err, WB_EPROTO, "publish_commit.tensors[%zu] is missing", i);
        snprintf(field, sizeof field, "publish_commit.tensors[%zu].name", i);
        if ((rc = check_tensor_name(field, p->name, err)) != WB_OK)
            return rc;
    }
    return WB_OK;
}

int wb__wire_check_publish_abort(const Wbproto__PublishAbortRequest *rq, wb_err *err)
{
    if (!rq)
        return wb__err_set(err, WB_EPROTO, "publish_abort is missing");
    return check_publish_id("publish_abort.publish_id", &rq->publish_id, err);
}

int wb__wire_check_publish_reply(const Wbproto__Reply *rep, wb_err *err)
{
    switch (rep->body_case) {
    case WBPROTO__REPLY__BODY_PUBLISH_BEGIN:
        if (!rep->publish_begin)
            return wb__err_set(err, WB_EPROTO, "publish_begin is missing");
        return check_publish_id("publish_begin.publish_id", &rep->publish_begin->publish_id, err);
    case WBPROTO__REPLY__BODY_PUBLISH_COMMIT:
        if (!rep->publish_commit || !rep->publish_commit->model ||
            !rep->publish_commit->model->name || !rep->publish_commit->model->name[0])
            return wb__err_set(err, WB_EPROTO, "publish_commit.model is missing");
        return WB_OK;
    default:
        return rep->publish_abort ? WB_OK : wb__err_set(err, WB_EPROTO, "publish_abort is missing");
    }
}
