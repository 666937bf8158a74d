#include "wb/status.h"

#include <stddef.h>

struct status_entry {
    int code;
    const char *name;
    const char *text;
};

static const struct status_entry status_table[] = {
    {WB_OK, "WB_OK", "success"},
    {WB_EINVAL, "WB_EINVAL", "invalid argument"},
    {WB_ENOMEM, "WB_ENOMEM", "out of memory"},
    {WB_EIO, "WB_EIO", "input/output error"},
    {WB_ENOTFOUND, "WB_ENOTFOUND", "not found"},
    {WB_EFORMAT, "WB_EFORMAT", "malformed input"},
    {WB_EPROTO, "WB_EPROTO", "protocol error"},
    {WB_EBUSY, "WB_EBUSY", "resource busy"},
    {WB_EPERM, "WB_EPERM", "permission denied"},
    {WB_ESTATE, "WB_ESTATE", "wrong state for this operation"},
    {WB_ETIMEDOUT, "WB_ETIMEDOUT", "timed out"},
    {WB_ENOGPU, "WB_ENOGPU", "no usable GPU"},
    {WB_ELIMIT, "WB_ELIMIT", "limit reached"},
    {WB_EEXIST, "WB_EEXIST", "already exists"},
    {WB_ECONN, "WB_ECONN", "cannot reach the broker"},
    {WB_EVERSION, "WB_EVERSION", "protocol version mismatch"},
    {WB_ENOSYS, "WB_ENOSYS", "not supported"},
    {WB_EINTERNAL, "WB_EINTERNAL", "internal error"},
    {WB_ECORRUPT, "WB_ECORRUPT", "data does not match its checksum"},
};

static const struct status_entry *status_find(int code)
{
    for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++) {
        if (status_table[i].code == code)
            return &status_table[i];
    }
    return NULL;
}

const char *wb_strerror(int status)
{
    const struct status_entry *e = status_find(status);
    return e ? e->text : "unknown status";
}

const char *wb_status_name(int status)
{
    const struct status_entry *e = status_find(status);
    return e ? e->name : "WB_E?";
}
