#include "quota.h"

#include "fdchan_wire.h"
#include "peer.h"
#include "safetensors.h"
#include "wire.h"

#include <stdio.h>

/* What a lease reply adds around the Lease itself (reply header, id,
 * status); generous, so that a lease that passes always fits. */
#define LEASE_FRAMING 1024

void wb__limits_default(wb_limits *l)
{
    l->max_leases_per_client = WB_DEFAULT_MAX_LEASES_PER_CLIENT;
    l->max_models = WB_DEFAULT_MAX_MODELS;
    l->max_versions = WB_DEFAULT_MAX_VERSIONS;
    l->max_tensors = WB_DEFAULT_MAX_TENSORS;
    l->max_shards = WB_DEFAULT_MAX_SHARDS;
    l->max_message = WB_MAX_MESSAGE;
    l->max_header = WB_ST_MAX_HEADER;
    l->max_record_bytes = WB_DEFAULT_MAX_RECORD_BYTES_PER_CLIENT;
}

int wb__limits_check_records(const wb_limits *l, uint32_t pid, uint64_t bytes, wb_err *err)
{
    if (bytes <= l->max_record_bytes)
        return WB_OK;
    char name[32];
    return wb__err_set(err, WB_ELIMIT,
                       "pid %s would keep %llu bytes of container records, over the limit of "
                       "%llu bytes per client",
                       wb__peer_name(pid, name, sizeof name), (unsigned long long)bytes,
                       (unsigned long long)l->max_record_bytes);
}

int wb__limits_check_leases(const wb_limits *l, uint32_t pid, uint32_t uid, uint32_t held,
                            wb_err *err)
{
    if (held < l->max_leases_per_client)
        return WB_OK;
    if (WB_IS_SESSION_ID(pid))
        return wb__err_set(err, WB_ELIMIT,
                           "the sessions of uid %u (pid hidden) already hold %u leases together, "
                           "the limit (--max-leases-per-client %u)",
                           uid, held, l->max_leases_per_client);
    char name[32];
    return wb__err_set(err, WB_ELIMIT,
                       "pid %s already holds %u leases, the limit (--max-leases-per-client %u)",
                       wb__peer_name(pid, name, sizeof name), held, l->max_leases_per_client);
}

int wb__limits_check_models(const wb_limits *l, size_t models, wb_err *err)
{
    if (models < l->max_models)
        return WB_OK;
    return wb__err_set(err, WB_ELIMIT,
                       "the broker already holds %zu model%s, the limit (--max-models %u); "
                       "unload one first",
                       models, models == 1 ? "" : "s", l->max_models);
}

int wb__limits_check_tensors(const wb_limits *l, const char *model, uint64_t tensors, wb_err *err)
{
    if (tensors <= l->max_tensors)
        return WB_OK;
    return wb__err_set(err, WB_ELIMIT,
                       "model '%s' has %llu tensors, over the limit of %llu (--max-tensors)", model,
                       (unsigned long long)tensors, (unsigned long long)l->max_tensors);
}

int wb__limits_check_shards(const wb_limits *l, const char *index_path, uint64_t shards,
                            wb_err *err)
{
    if (shards <= l->max_shards)
        return WB_OK;
    return wb__err_set(err, WB_ELIMIT,
                       "%s: the index names %llu shard files, over the limit of %llu "
                       "(--max-shards)",
                       index_path, (unsigned long long)shards, (unsigned long long)l->max_shards);
}

int wb__limits_check_lease_size(const wb_limits *l, const char *model, uint64_t lease_bytes,
                                wb_err *err)
{
    if (l->max_message > LEASE_FRAMING && lease_bytes <= l->max_message - LEASE_FRAMING)
        return WB_OK;
    return wb__err_set(err, WB_ELIMIT,
                       "a lease of model '%s' would take %llu bytes, over the %llu-byte message "
                       "limit (--max-message-bytes)",
                       model, (unsigned long long)lease_bytes + LEASE_FRAMING,
                       (unsigned long long)l->max_message);
}

int wb__limits_check_header_len(const wb_limits *l, const char *path, uint64_t header_len,
                                wb_err *err)
{
    if (header_len <= l->max_header)
        return WB_OK;
    return wb__err_set(err, WB_ELIMIT,
                       "%s: the safetensors header is %llu bytes, over the limit of %llu "
                       "(--max-header-bytes)",
                       path, (unsigned long long)header_len, (unsigned long long)l->max_header);
}
