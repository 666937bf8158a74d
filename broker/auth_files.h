/* What a load may open, and who may map the slabs: file access judged by
 * the mode bits for the peer that asked (its uid, primary gid and the
 * supplementary groups read at accept, auth_groups.h), and the group the
 * host slabs are given to. */
#ifndef WB_BROKER_AUTH_FILES_H
#define WB_BROKER_AUTH_FILES_H

#include "err.h"
#include "peer.h"

#include <stddef.h>
#include <stdint.h>

/* Checks a path the broker is asked to load, before any loading starts.
 * Symbolic links are followed (checkpoints in Hugging Face caches are links
 * into blobs/), and what counts is the final target: a regular file the
 * broker can read, or a directory it can search and read (a sharded
 * checkpoint). Device files, FIFOs, sockets and anything else are refused
 * with WB_EINVAL naming the resolved path and its type; a missing path is
 * WB_ENOTFOUND "no such file: PATH"; one the broker may not read is
 * WB_EPERM. On success the resolved path is written to `resolved` (size at
 * least WB_PATH_MAX + 1) and *is_dir tells a directory. */
int wb__auth_check_load_path(const char *path, char *resolved, size_t size, int *is_dir,
                             wb_err *err);

/* Whose access a load is judged by. Root peers may load anything the broker
 * can read (enforce 0), as may the operator's own --model loads (no peer).
 * Every other peer must itself be able to read each file the load opens.
 *
 * The judgement uses the mode bits with the kernel's owner / group / other
 * rule for the peer's uid, its primary gid from SO_PEERCRED and the
 * supplementary groups read at accept (wb__auth_read_groups; the primary
 * gid alone where they could not be read). POSIX ACLs and capabilities are
 * not consulted: a file readable only through those is refused, never the
 * other way round. */
typedef struct wb_load_access {
    int enforce;
    uint32_t uid;
    uint32_t gid;
    uint32_t pid; /* for messages */
    wb_peer_groups groups;
} wb_load_access;

/* The access of a requesting peer; NULL (a preload) judges nobody. */
wb_load_access wb__auth_load_access(const wb_peer_creds *peer);

/* Checks a fully resolved path (no links; as from realpath) for the peer:
 * search on every directory above it, read on a file, read and search on a
 * directory. WB_OK, or WB_EPERM "uid 1000 (gid 1000) may not read /x (mode
 * 0600, owner uid 0, gid 0); ..." naming the component at fault (and the
 * supplementary groups, when there are: "(gid 1000, supplementary groups 27)",
 * or "(gid 1000 only; supplementary groups could not be read because
 * ...)"). */
int wb__auth_check_peer_path(const wb_load_access *a, const char *resolved, wb_err *err);

/* The same check on an open file (a wb_st_file_check; arg is a const
 * wb_load_access *): read on the file the descriptor holds, and search on
 * every directory above where it really lies (/proc/self/fd), so that a link
 * swapped after a path check cannot lead the load elsewhere. */
int wb__auth_check_peer_fd(void *arg, int fd, const char *path, wb_err *err);

/* The group the broker's slabs should have so that peers that can reach the
 * socket can also map them: the socket directory's group when the directory
 * is set-group-ID (a socket made in it inherits that group), else -1 (keep
 * the broker's own group). `socket_path` is the socket's path. The kernel
 * lets members open the socket and the named slabs by their primary or a
 * supplementary group alike; memfd and cuda-vmm slabs come as descriptors,
 * with no file permission to pass. */
int64_t wb__auth_slab_group(const char *socket_path);

/* Gives a host slab (by shm name) to group `gid`, keeping its mode 0640, so
 * that members of the group may map it read-only. */
int wb__auth_share_slab(const char *shm_name, uint32_t gid, wb_err *err);

#endif
