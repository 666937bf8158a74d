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
 * the primary gid alone is matched and refusals say so (auth_groups.h).
 * What a load may open is judged by file access instead (auth_files.h). */
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

/* 1 if id is on the list. */
int wb__auth_id_listed(const wb_id_list *l, uint32_t id);

typedef enum wb_auth_list {
    WB_AUTH_CLIENT_UIDS,
    WB_AUTH_CLIENT_GIDS,
    WB_AUTH_ADMIN_UIDS,
    WB_AUTH_ADMIN_GIDS,
    WB_AUTH_PUBLISH_UIDS,
    WB_AUTH_PUBLISH_GIDS,
    WB_AUTH_N_LISTS,
} wb_auth_list;

typedef struct wb_auth {
    /* 1: every peer with readable credentials passes the client check (the
     * state wb__broker_init starts from; wbrokerd always restricts). */
    int open_clients;
    uint32_t broker_euid;
    wb_id_list lists[WB_AUTH_N_LISTS]; /* indexed by wb_auth_list */
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
/* 1 if the peer may publish new versions of models that exist
 * (--publisher-uid, --publisher-gid; the same matching): administrators
 * always may. A publisher is also a client. */
int wb__auth_publish_ok(const wb_auth *a, const wb_peer_creds *p);

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
/* The same for a primary gid `gid` and supplementary groups g of process
 * `pid`; with say_none 0, nothing is said when there are none. */
const char *wb__auth_describe_groups(uint32_t gid, uint32_t pid, const wb_peer_groups *g,
                                     int say_none, char *buf, size_t size);

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

#endif
