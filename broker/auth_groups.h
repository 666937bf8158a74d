/* A peer's supplementary groups, which SO_PEERCRED does not carry: read
 * from /proc/<pid>/status once, when its connection is accepted, and only
 * while the pidfd taken at accept says the process that connected lives
 * (see auth.h for how the allow lists match them). */
#ifndef WB_BROKER_AUTH_GROUPS_H
#define WB_BROKER_AUTH_GROUPS_H

#include "auth.h"
#include "err.h"
#include "peer.h"

#include <stddef.h>
#include <stdint.h>

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

#endif
