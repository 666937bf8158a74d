#include "paths.h"

#include "wb/status.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int wb__socket_path(const char *override, char *buf, size_t size)
{
    const char *env = getenv("WB_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (override && override[0])
        n = snprintf(buf, size, "%s", override);
    else if (env && env[0])
        n = snprintf(buf, size, "%s", env);
    else if (xdg && xdg[0])
        n = snprintf(buf, size, "%s/wbroker/broker.sock", xdg);
    else if (geteuid() == 0)
        n = snprintf(buf, size, "/run/wbroker/broker.sock");
    else
        n = snprintf(buf, size, "/tmp/wbroker-%u/broker.sock", (unsigned)geteuid());
    struct sockaddr_un sun;
    if (n < 0 || (size_t)n >= size || (size_t)n >= sizeof sun.sun_path)
        return WB_EINVAL;
    return WB_OK;
}

int wb__socket_endpoint(const char *path, char *buf, size_t size)
{
    int n = snprintf(buf, size, "ipc://%s", path);
    return (n < 0 || (size_t)n >= size) ? WB_EINVAL : WB_OK;
}

int wb__mkdir_p(const char *path, size_t skip, mode_t mode, int exact, wb_err *err)
{
    char dir[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof dir)
        return wb__err_set(err, WB_EINVAL, "path is too long: %.64s...", path);
    memcpy(dir, path, len + 1);
    for (size_t i = skip + 1; i <= len; i++) {
        if (dir[i] != '/' && dir[i] != '\0')
            continue;
        dir[i] = '\0';
        if (mkdir(dir, mode) == 0) {
            if (exact && chmod(dir, mode) != 0)
                return wb__err_errno(err, WB_EIO, errno, "chmod %s", dir);
        } else if (errno != EEXIST) {
            return wb__err_errno(err, WB_EIO, errno, "cannot create directory %s", dir);
        }
        if (i < len)
            dir[i] = '/';
    }
    return WB_OK;
}
