/* What a build is: its version, git revision, wire protocol and the
 * backends and features compiled in. Every program's --version prints it
 * through wb__print_version, in one format:
 *
 *   wbctl 0.1.0 (git 1a2b3c4d5e6f, protocol 1)
 *   backends: host cuda vmm
 *   features: +systemd +metrics
 */
#ifndef WB_COMMON_BUILDINFO_H
#define WB_COMMON_BUILDINFO_H

#include <stdio.h>

/* The git revision the build was made from ("unknown" outside a checkout;
 * "-dirty" when the tree had changes). */
const char *wb__build_rev(void);

/* The backends compiled in, space-separated: "host", or "host cuda vmm". */
const char *wb__build_backends(void);

/* Prints the version block above for program `prog` to `out`; `features`
 * (may be NULL) is the program's own line ("+systemd -metrics"). */
void wb__print_version(FILE *out, const char *prog, const char *features);

#endif
