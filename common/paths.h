/* Where the broker's socket lives, for every program alike, and the
 * directories on the way to a path. */
#ifndef WB_PATHS_H
#define WB_PATHS_H

#include "err.h"

#include <stddef.h>
#include <sys/types.h>

/* Resolves the broker socket path: `override` if non-NULL and non-empty,
 * else $WB_SOCKET, else $XDG_RUNTIME_DIR/wbroker/broker.sock, else (as root)
 * /run/wbroker/broker.sock, else /tmp/wbroker-<uid>/broker.sock.
 * Returns 0, or WB_EINVAL if the path does not fit in `size` or in a
 * sockaddr_un. */
int wb__socket_path(const char *override, char *buf, size_t size);

/* Builds "ipc://<path>". Returns 0 or WB_EINVAL. */
int wb__socket_endpoint(const char *path, char *buf, size_t size);

/* mkdir -p: creates every missing directory of `path`, its last component
 * included, whose name is longer than `skip` bytes (a prefix the caller
 * knows to exist, such as a root it made; 0: all of them). New directories
 * get `mode`, exactly so whatever the umask when `exact` is set (chmod
 * after mkdir); existing ones are left alone, and one that exists as
 * something else is the caller's to check. Returns WB_OK; WB_EINVAL when
 * path has PATH_MAX bytes or more; WB_EIO "cannot create directory DIR: ..."
 * or "chmod DIR: ..." (with strerror). */
int wb__mkdir_p(const char *path, size_t skip, mode_t mode, int exact, wb_err *err);

#endif
