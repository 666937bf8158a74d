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
 * A gid on a list matches the peer's primary gid (SO_PEERCRED's, the
 * effective gid at connect) or any of its supplementary groups, as file
 * permissions do. SO_PEERCRED carries no supplementary groups: they are read
 * from /proc/<pid>/status once, when the connection is accepted, while the
 * pidfd taken at accept says the process that connected lives, and that
 * pidfd is checked again after the read, so a pid reused meanwhile never
 * lends its groups (wb__auth_read_groups). Where they cannot be read (the
 * pid is hidden in another pid namespace, /proc shows another process),
 * the primary gid alone is matched and refusals say so. */
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

/* 1 if the peer may use the client operations (or is an administrator):
 * its uid, or its primary gid or one of its supplementary groups (those
 * read, p->groups), is on a list. Peers whose pid is hidden are judged by
 * their uid and primary gid. */
int wb__auth_client_ok(const wb_auth *a, const wb_peer_creds *p);
/* 1 if the peer may load and unload models (the same matching). */
int wb__auth_admin_ok(const wb_auth *a, const wb_peer_creds *p);

/* Describes who passes a check, for messages and logs: "uid 0, 1000; gid 27"
 * (clients include administrators), or "everyone" for open clients.
 * Truncated with "..." to fit. Returns buf. */
const char *wb__auth_describe_clients(const wb_auth *a, char *buf, size_t size);
const char *wb__auth_describe_admins(const wb_auth *a, char *buf, size_t size);

/* What of the peer a gid list is matched against, for messages:
 * "gid 1000 and supplementary groups 27, 100" (at most 8 named, then
 * "... (N in all)"), "gid 1000 (no supplementary groups)", or
 * "gid 1000 only; supplementary groups could not be read because the
 * peer's pid is not visible from the broker (another pid namespace)".
 * Returns buf. */
const char *wb__auth_describe_gids(const wb_peer_creds *p, char *buf, size_t size);

/* The peer's groups as one log field's value: "27,100", "none", or
 * "unread:pid_hidden" (the wb_groups_state). Returns buf. */
const char *wb__auth_groups_field(const wb_peer_creds *p, char *buf, size_t size);

/* WB_OK, or WB_EPERM "uid 1234 is not allowed to lease models (allowed: uid
 * 0, 1000; gid 27); matched gid 1234 and supplementary groups 100" for a
 * peer that fails the client check (the part after ";" only when a gid list
 * is set). Judges peers with known credentials, and connections whose pid
 * is hidden (by uid and primary gid), as accepted. */
int wb__auth_check_client(const wb_auth *a, const wb_peer_creds *peer, wb_err *err);

/* The refusal of an administrator operation (`verb`: "load", "unload") to a
 * peer that fails wb__auth_admin_ok: WB_EPERM "uid 1234 may not load models",
 * with "; matched gid ..." when an administrator gid list is set. */
int wb__auth_refuse_admin(const wb_auth *a, const wb_peer_creds *peer, const char *verb,
                          wb_err *err);

/* The ids of a /proc/<pid>/status text. */
typedef struct wb_proc_ids {
    uint32_t uid[4]; /* real, effective, saved set, filesystem */
    uint32_t gid[4];
    size_t n_groups; /* supplementary groups on the Groups: line */
} wb_proc_ids;

/* The most groups a Groups: line may hold (the kernel's NGROUPS_MAX). */
#define WB_PROC_GROUPS_MAX 65536

/* Parses the Uid:, Gid: and Groups: lines of a /proc/<pid>/status text
 * (`len` bytes, not necessarily terminated; other lines are skipped). The
 * first `cap` groups, in the order given, go to groups[] (NULL when cap is
 * 0); ids->n_groups counts them all. WB_OK, or WB_EFORMAT naming the fault:
 * a line missing or given twice, a field that is not a decimal id below
 * 2^32 - 1, more than WB_PROC_GROUPS_MAX groups. */
int wb__auth_parse_status(const char *text, size_t len, wb_proc_ids *ids, uint32_t *groups,
                          size_t cap, wb_err *err);

/* Reads the supplementary groups of the process at the other end of a
 * connection just accepted into c->groups (c: its SO_PEERCRED credentials;
 * pidfd: the one taken at accept, -1 when none). /proc/<pid>/status is read
 * only while the pidfd says the process lives, /proc/self/fdinfo of the
 * pidfd must show the same pid where the kernel shows one (so that /proc is
 * the broker's pid namespace's), the status must show the connection's
 * effective uid and gid, and the pidfd is checked again after the read:
 * otherwise the groups read may be another process's, and none are kept
 * (state says why). A process in more than WB_PEER_GROUPS_MAX keeps those
 * on a's administrator gid list first, then the client one, then the
 * lowest others. Returns c->groups.state. */
int wb__auth_read_groups(const wb_auth *a, wb_peer_creds *c, int pidfd);

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
