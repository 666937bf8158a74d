/* Finding the model library of an AOTInductor model: a `.so`, a directory
 * (an unpacked package), or a `.pt2` package (a zip archive) that is
 * unpacked into a private directory first. Internal to libwbclient. */
#ifndef WB_AOTI_PKG_H
#define WB_AOTI_PKG_H

#include "err.h"

/* 1 if a zip entry name may be unpacked: not empty, not absolute, no ".."
 * component, no backslash. */
int wb__aoti_entry_name_safe(const char *name);

/* Unpacks every entry of the zip archive `zip_path` under `dest_dir` (which
 * exists). All names are checked before anything is written: an unsafe name
 * fails with WB_EFORMAT naming the entry. Files are created new (O_EXCL,
 * never through a link) with mode 0700 (model libraries are mapped
 * executable), directories 0700. */
int wb__aoti_unzip(const char *zip_path, const char *dest_dir, wb_err *err);

/* Resolves `path` to a model library. A `.pt2` package is unpacked into a
 * new directory "wb-aoti-XXXXXX" (mkdtemp, mode 0700) under work_dir
 * ($TMPDIR or /tmp when NULL); *tmpdir then names it (else NULL), and the
 * caller removes it with wb__aoti_rmtree. In a directory, the one `.so`
 * below it is chosen (preferring those under data/aotinductor/); several
 * candidates are an error that lists them. *so_path is malloc'd. */
int wb__aoti_locate(const char *path, const char *work_dir, char **so_path, char **tmpdir,
                    wb_err *err);

/* Removes a directory tree without following symbolic links. */
void wb__aoti_rmtree(const char *dir);

#endif
