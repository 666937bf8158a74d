/* Where the broker's socket lives, for every program alike. */
#ifndef WB_PATHS_H
#define WB_PATHS_H

#include <stddef.h>

/* Resolves the broker socket path: `override` if non-NULL and non-empty,
 * else $WB_SOCKET, else $XDG_RUNTIME_DIR/wbroker/broker.sock, else (as root)
 * /run/wbroker/broker.sock, else /tmp/wbroker-<uid>/broker.sock.
 * Returns 0, or WB_EINVAL if the path does not fit in `size` or in a
 * sockaddr_un. */
int wb__socket_path(const char *override, char *buf, size_t size);

/* Builds "ipc://<path>". Returns 0 or WB_EINVAL. */
int wb__socket_endpoint(const char *path, char *buf, size_t size);

#endif
