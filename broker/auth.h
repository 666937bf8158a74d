/* Who may use the broker, and what it may be asked to load.
 *
 * Peers are judged by the uid and gid the kernel reports for them
 * (SO_PEERCRED on the connection the broker accepted, peer.c), never by
 * anything in a message. Two allow lists: clients (hello, acquire, release, heartbeat,
 * listings, stats) and administrators (load, unload). An administrator is also
 * a client. Root and the broker's own effective uid are always on both lists:
 * they can read the broker's memory and its slabs anyway, so refusing them
 * would protect nothing and could lock the operator out.
 *
 * Only the primary gid is known: SO_PEERCRED does not carry supplementary
 * groups, and reading them from /proc/<pid>/status would race with pid
 * reuse. */
#ifndef WB_BROKER_AUTH_H
#define WB_BROKER_AUTH_H

#include "err.h"
#include "peer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_id_list {
    uint32_t *ids; /* owned, sorted, no duplicates */
    size_t n;
} wb_id_list;

typedef enum wb_auth_list {
    WB_AUTH_CLIENT_UIDS,
    WB_AUTH_CLIENT_GIDS,
    WB_AUTH_ADMIN_UIDS,
    WB_AUTH_ADMIN_GIDS,
} wb_auth_list;

typedef struct wb_auth {
    /* 1: every peer with readable credentials passes the client check (the
     * state wb__broker_init starts from; wbrokerd always restricts). */
    int open_clients;
    uint32_t broker_euid;
    wb_id_list lists[4]; /* indexed by wb_auth_list */
} wb_auth;

/* Clients open to everyone; administrators: root and `broker_euid`. */
void wb__auth_init_open(wb_auth *a, uint32_t broker_euid);
/* wbrokerd's default: root and `broker_euid` on both lists, nobody else. */
void wb__auth_init_default(wb_auth *a, uint32_t broker_euid);
/* Frees the lists; the struct may be initialised again. */
void wb__auth_destroy(wb_auth *a);

/* Adds a comma-separated list of decimal ids or names (resolved with
 * getpwnam/getgrnam) to one list; adding to a client list also closes
 * open_clients. `option` names the option in messages ("--allow-uid").
 * WB_EINVAL "--allow-uid: no user named 'x'" etc.; WB_ENOMEM. On failure
 * the list is unchanged. */
int wb__auth_add(wb_auth *a, wb_auth_list which, const char *text, const char *option, wb_err *err);

/* 1 if the peer may use the client operations (or is an administrator). */
int wb__auth_client_ok(const wb_auth *a, uint32_t uid, uint32_t gid);
/* 1 if the peer may load and unload models. */
int wb__auth_admin_ok(const wb_auth *a, uint32_t uid, uint32_t gid);

/* Describes who passes a check, for messages and logs: "uid 0, 1000; gid 27"
 * (clients include administrators), or "everyone" for open clients.
 * Truncated with "..." to fit. Returns buf. */
const char *wb__auth_describe_clients(const wb_auth *a, char *buf, size_t size);
const char *wb__auth_describe_admins(const wb_auth *a, char *buf, size_t size);

/* WB_OK, or WB_EPERM "uid 1234 is not allowed to lease models (allowed: uid 0,
 * 1000)" for a peer that fails the client check. */
int wb__auth_check_client(const wb_auth *a, const wb_peer_creds *peer, wb_err *err);
/* The same check by uid and gid alone: a connection judged at accept,
 * whose pid may be hidden. */
int wb__auth_check_uid(const wb_auth *a, uint32_t uid, uint32_t gid, wb_err *err);

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
 * rule for the peer's uid and primary gid from SO_PEERCRED. Supplementary
 * groups are not consulted (SO_PEERCRED lacks them and /proc/<pid>/status
 * races with pid reuse), nor are POSIX ACLs or capabilities: a file readable
 * only through those is refused, never the other way round. */
typedef struct wb_load_access {
    int enforce;
    uint32_t uid;
    uint32_t gid;
} wb_load_access;

/* The access of a requesting peer; NULL (a preload) judges nobody. */
wb_load_access wb__auth_load_access(const wb_peer_creds *peer);

/* Checks a fully resolved path (no links; as from realpath) for the peer:
 * search on every directory above it, read on a file, read and search on a
 * directory. WB_OK, or WB_EPERM "uid 1000 (gid 1000) may not read /x (mode
 * 0600, owner uid 0, gid 0); ..." naming the component at fault. */
int wb__auth_check_peer_path(const wb_load_access *a, const char *resolved, wb_err *err);

/* The same check on an open file (a wb_st_file_check; arg is a const
 * wb_load_access *): read on the file the descriptor holds, and search on
 * every directory above where it really lies (/proc/self/fd), so that a link
 * swapped after a path check cannot lead the load elsewhere. */
int wb__auth_check_peer_fd(void *arg, int fd, const char *path, wb_err *err);

/* The group the broker's slabs should have so that peers that can reach the
 * socket can also map them: the socket directory's group when the directory
 * is set-group-ID (a socket made in it inherits that group), else -1 (keep
 * the broker's own group). `socket_path` is the socket's path. */
int64_t wb__auth_slab_group(const char *socket_path);

/* Gives a host slab (by shm name) to group `gid`, keeping its mode 0640, so
 * that members of the group may map it read-only. */
int wb__auth_share_slab(const char *shm_name, uint32_t gid, wb_err *err);

#endif
