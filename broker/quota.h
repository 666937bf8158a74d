/* Configured limits on what peers may make the broker hold: leases per
 * client process, models, tensors per model, shard files per index, message
 * size and safetensors header size. Each refusal is WB_ELIMIT with a message that names the limit,
 * its value and the wbrokerd option that sets it. */
#ifndef WB_BROKER_QUOTA_H
#define WB_BROKER_QUOTA_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

#define WB_DEFAULT_MAX_LEASES_PER_CLIENT 1024
#define WB_DEFAULT_MAX_MODELS            64
/* Versions of one model name held at once (loading, current, draining):
 * the current one and the one a rollout loads beside it. */
#define WB_DEFAULT_MAX_VERSIONS 2
#define WB_MAX_VERSIONS_LIMIT   64
#define WB_DEFAULT_MAX_TENSORS  1000000
/* Shard files one index may name: the largest public checkpoints have a few
 * hundred; each is opened, judged and read, and all stay open while the
 * load reads them. */
#define WB_DEFAULT_MAX_SHARDS 4096
/* Container record bytes one client process may make the broker keep, over
 * all its leases: 1 MiB holds a container on each of 1024 leases with
 * paths of several hundred bytes (a record costs 64 bytes plus its
 * strings), and bounds what a hostile client costs. */
#define WB_DEFAULT_MAX_RECORD_BYTES_PER_CLIENT (1024u * 1024u)
/* The smallest --max-message-bytes: room for any error reply and a small
 * lease. */
#define WB_MIN_MESSAGE 4096

typedef struct wb_limits {
    uint32_t max_leases_per_client; /* leases one pid may hold at once */
    uint32_t max_models;            /* models in the registry, whatever their state */
    uint64_t max_tensors;           /* tensors in one model */
    uint64_t max_shards;            /* shard files one index names */
    uint64_t max_message;           /* bytes of one message, both directions */
    uint64_t max_header;            /* bytes of one safetensors header */
    uint64_t max_record_bytes;      /* container record bytes one pid may keep */
    uint32_t max_versions;          /* versions of one name: loading, current, draining */
} wb_limits;

/* The defaults: 1024 leases per client, 64 models, 1,000,000 tensors,
 * 4096 shard files, WB_MAX_MESSAGE, WB_ST_MAX_HEADER, 1 MiB of container records per
 * client. */
void wb__limits_default(wb_limits *l);

/* Refusals, each WB_ELIMIT with the limit's name and value. */
/* `held`: what the process holds, or for a session id (its pid hidden) what
 * every session of its uid holds together (wb__leases_quota_use). */
int wb__limits_check_leases(const wb_limits *l, uint32_t pid, uint32_t uid, uint32_t held,
                            wb_err *err);
/* A heartbeat from `pid` would make its leases keep `bytes` bytes of
 * container records in all. */
int wb__limits_check_records(const wb_limits *l, uint32_t pid, uint64_t bytes, wb_err *err);
int wb__limits_check_models(const wb_limits *l, size_t models, wb_err *err);
int wb__limits_check_tensors(const wb_limits *l, const char *model, uint64_t tensors, wb_err *err);
/* The index at `index_path` names `shards` distinct shard files. */
int wb__limits_check_shards(const wb_limits *l, const char *index_path, uint64_t shards,
                            wb_err *err);
/* A lease on `model` would be a `lease_bytes` message (plus framing). */
int wb__limits_check_lease_size(const wb_limits *l, const char *model, uint64_t lease_bytes,
                                wb_err *err);

/* A safetensors file whose 8-byte length field (read by the caller from
 * the descriptor it judged) gives a header of `header_len` bytes. */
int wb__limits_check_header_len(const wb_limits *l, const char *path, uint64_t header_len,
                                wb_err *err);

#endif
