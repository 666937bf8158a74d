#include "paths.h"

#include "wb/status.h"

#include <stdio.h>
#include <stdlib.h>
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
