#include "quota.h"

#include "safetensors.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a lease reply adds around the Lease itself (reply header, id,
 * status); generous, so that a lease that passes always fits. */
#define LEASE_FRAMING 1024
/* Index files larger than this are left to the reader: the pre-check runs
 * in the broker's event loop and must stay quick. */
#define INDEX_PRECHECK_MAX (16u * 1024u * 1024u)
#define INDEX_NAME         "model.safetensors.index.json"
#define SINGLE_NAME        "model.safetensors"

void wb__limits_default(wb_limits *l)
{
    l->max_leases_per_client = WB_DEFAULT_MAX_LEASES_PER_CLIENT;
    l->max_models = WB_DEFAULT_MAX_MODELS;
    l->max_tensors = WB_DEFAULT_MAX_TENSORS;
    l->max_message = WB_MAX_MESSAGE;
    l->max_header = WB_ST_MAX_HEADER;
    l->max_record_bytes = WB_DEFAULT_MAX_RECORD_BYTES_PER_CLIENT;
}

int wb__limits_check_records(const wb_limits *l, uint32_t pid, uint64_t bytes, wb_err *err)
{
    if (bytes <= l->max_record_bytes)
        return WB_OK;
    return wb__err_set(err, WB_ELIMIT,
                       "pid %u would keep %llu bytes of container records, over the limit of "
                       "%llu bytes per client",
                       pid, (unsigned long long)bytes, (unsigned long long)l->max_record_bytes);
}

int wb__limits_check_leases(const wb_limits *l, uint32_t pid, uint32_t held, wb_err *err)
{
    if (held < l->max_leases_per_client)
        return WB_OK;
    return wb__err_set(err, WB_ELIMIT,
                       "pid %u already holds %u leases, the limit (--max-leases-per-client %u)",
                       pid, held, l->max_leases_per_client);
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

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int wb__limits_check_header(const wb_limits *l, const char *path, wb_err *err)
{
    if (ends_with(path, ".json"))
        return WB_OK;
    /* O_NONBLOCK: should the path have become a FIFO since it was checked,
     * the open must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return wb__err_errno(err, errno == ENOENT ? WB_ENOTFOUND : WB_EIO, errno, "open %s", path);
    struct stat st;
    uint8_t b[8];
    ssize_t got = -1;
    int rc = WB_OK;
    if (fstat(fd, &st) != 0) {
        rc = wb__err_errno(err, WB_EIO, errno, "cannot stat %s", path);
    } else if (!S_ISREG(st.st_mode)) {
        rc = wb__err_set(err, WB_EINVAL, "%s is not a regular file", path);
    } else {
        do {
            got = pread(fd, b, sizeof b, 0);
        } while (got < 0 && errno == EINTR);
        if (got < 0)
            rc = wb__err_errno(err, WB_EIO, errno, "reading the header length of %s", path);
    }
    close(fd);
    if (rc != WB_OK || got < (ssize_t)sizeof b)
        return rc;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | b[i];
    if (n <= l->max_header)
        return WB_OK;
    return wb__err_set(err, WB_ELIMIT,
                       "%s: the safetensors header is %llu bytes, over the limit of %llu "
                       "(--max-header-bytes)",
                       path, (unsigned long long)n, (unsigned long long)l->max_header);
}

/* dir + "/" + name into out; -1 when it does not fit. */
static int join(char *out, size_t size, const char *dir, size_t dir_len, const char *name)
{
    int n = snprintf(out, size, "%.*s/%s", (int)dir_len, dir, name);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* Reads a whole small regular file; NULL (and *len 0) when it cannot, or when
 * it is larger than INDEX_PRECHECK_MAX. */
static char *read_small(const char *path, size_t *len)
{
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0 &&
        (uint64_t)st.st_size <= INDEX_PRECHECK_MAX && (buf = malloc((size_t)st.st_size + 1))) {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        *len = got;
    }
    close(fd);
    return buf;
}

static int check_index(const wb_limits *l, const char *model, const char *index, wb_err *err)
{
    size_t len;
    char *buf = read_small(index, &len);
    if (!buf)
        return WB_OK;
    json_error_t je;
    json_t *root = json_loadb(buf, len, 0, &je);
    free(buf);
    json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        json_decref(root);
        return WB_OK;
    }
    int rc = wb__limits_check_tensors(l, model, json_object_size(wm), err);
    const char *slash = strrchr(index, '/');
    size_t dir_len = slash ? (size_t)(slash - index) : 1;
    const char *dir = slash ? index : ".";
    if (slash == index)
        dir_len = 0; /* an index in "/": shards are "/NAME" */
    const char *key;
    json_t *value;
    json_object_foreach(wm, key, value)
    {
        if (rc != WB_OK)
            break;
        const char *shard = json_string_value(value);
        /* Odd names are the reader's to refuse, with its message. */
        if (!shard || !shard[0] || shard[0] == '/' || strstr(shard, ".."))
            continue;
        char path[WB_PATH_MAX + 1];
        if (join(path, sizeof path, dir, dir_len, shard) != 0)
            continue;
        rc = wb__limits_check_header(l, path, err);
        if (rc == WB_ENOTFOUND || rc == WB_EIO || rc == WB_EINVAL)
            rc = WB_OK; /* the reader reports missing and odd shards */
    }
    json_decref(root);
    return rc;
}

int wb__limits_check_checkpoint(const wb_limits *l, const char *model, const char *path,
                                wb_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return WB_OK;
    if (S_ISDIR(st.st_mode)) {
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/')
            n--;
        char candidate[WB_PATH_MAX + 1];
        if (join(candidate, sizeof candidate, path, n == 1 && path[0] == '/' ? 0 : n, INDEX_NAME) ==
                0 &&
            stat(candidate, &st) == 0)
            return check_index(l, model, candidate, err);
        if (join(candidate, sizeof candidate, path, n == 1 && path[0] == '/' ? 0 : n,
                 SINGLE_NAME) == 0 &&
            stat(candidate, &st) == 0 && S_ISREG(st.st_mode))
            return wb__limits_check_header(l, candidate, err);
        return WB_OK;
    }
    if (!S_ISREG(st.st_mode))
        return WB_OK;
    if (ends_with(path, ".json"))
        return check_index(l, model, path, err);
    return wb__limits_check_header(l, path, err);
}
