#include "aoti_pkg.h"

#include "paths.h"
#include "alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

/* Directory depth searched for a model library; a package is a few levels. */
#define MAX_DEPTH 16
/* Candidates listed in the error for an ambiguous directory. */
#define MAX_CANDIDATES 16
#define COPY_BUF       (1u << 20)

int wb__aoti_entry_name_safe(const char *name)
{
    if (!name || !name[0] || name[0] == '/' || strchr(name, '\\'))
        return 0;
    const char *p = name;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return 0;
        if (!slash)
            break;
        p = slash + 1;
    }
    return 1;
}

/* Creates every missing directory of `path` below `root` (path is relative
 * to root; the last component is created only when `last` is set). */
static int make_dirs(const char *root, const char *rel, int last, wb_err *err)
{
    char buf[PATH_MAX];
    int n = snprintf(buf, sizeof buf, "%s/%s", root, rel);
    if (n < 0 || (size_t)n >= sizeof buf)
        return wb__err_set(err, WB_EFORMAT, "package entry '%s': path too long", rel);
    size_t start = strlen(root) + 1;
    if (last) {
        size_t len = (size_t)n;
        while (len > start && buf[len - 1] == '/')
            buf[--len] = '\0';
    } else {
        char *slash = strrchr(buf + start, '/');
        if (!slash)
            return WB_OK;
        *slash = '\0';
    }
    wb_err e;
    int rc = wb__mkdir_p(buf, start - 1, 0700, 0, &e);
    if (rc != WB_OK)
        return wb__err_set(err, rc, "package entry '%s': %s", rel, e.msg);
    return WB_OK;
}

static int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

static int extract_file(zip_t *z, zip_int64_t i, const char *name, const char *dest, char *buf,
                        wb_err *err)
{
    int rc = make_dirs(dest, name, 0, err);
    if (rc != WB_OK)
        return rc;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dest, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0700);
    if (fd < 0)
        return wb__err_errno(err, WB_EIO, errno, "package entry '%s': cannot create %s", name,
                             path);
    zip_file_t *zf = zip_fopen_index(z, (zip_uint64_t)i, 0);
    if (!zf) {
        close(fd);
        return wb__err_set(err, WB_EFORMAT, "package entry '%s': %s", name, zip_strerror(z));
    }
    rc = WB_OK;
    for (;;) {
        zip_int64_t n = zip_fread(zf, buf, COPY_BUF);
        if (n < 0) {
            rc = wb__err_set(err, WB_EFORMAT, "package entry '%s': %s", name,
                             zip_error_strerror(zip_file_get_error(zf)));
            break;
        }
        if (n == 0)
            break;
        if (write_all(fd, buf, (size_t)n) != 0) {
            rc = wb__err_errno(err, WB_EIO, errno, "package entry '%s': writing %s", name, path);
            break;
        }
    }
    zip_fclose(zf);
    if (close(fd) != 0 && rc == WB_OK)
        rc = wb__err_errno(err, WB_EIO, errno, "package entry '%s': closing %s", name, path);
    return rc;
}

int wb__aoti_unzip(const char *zip_path, const char *dest_dir, wb_err *err)
{
    int zerr = 0;
    zip_t *z = zip_open(zip_path, ZIP_RDONLY, &zerr);
    if (!z) {
        zip_error_t ze;
        zip_error_init_with_code(&ze, zerr);
        int rc = wb__err_set(err, zerr == ZIP_ER_NOENT ? WB_ENOTFOUND : WB_EFORMAT,
                             "package %s: not a readable zip archive: %s", zip_path,
                             zip_error_strerror(&ze));
        zip_error_fini(&ze);
        return rc;
    }
    zip_int64_t n = zip_get_num_entries(z, 0);
    int rc = WB_OK;
    /* Check every name before writing anything. */
    for (zip_int64_t i = 0; i < n && rc == WB_OK; i++) {
        const char *name = zip_get_name(z, (zip_uint64_t)i, 0);
        if (!wb__aoti_entry_name_safe(name))
            rc = wb__err_set(err, WB_EFORMAT,
                             "package %s: entry %lld '%s' is absolute or has a '..' component; "
                             "refusing to unpack it",
                             zip_path, (long long)i, name ? name : "(no name)");
    }
    char *buf = rc == WB_OK ? wb__malloc(COPY_BUF) : NULL;
    if (rc == WB_OK && !buf)
        rc = wb__err_set(err, WB_ENOMEM, "package %s: out of memory", zip_path);
    for (zip_int64_t i = 0; i < n && rc == WB_OK; i++) {
        const char *name = zip_get_name(z, (zip_uint64_t)i, 0);
        size_t len = strlen(name);
        if (name[len - 1] == '/')
            rc = make_dirs(dest_dir, name, 1, err);
        else
            rc = extract_file(z, i, name, dest_dir, buf, err);
    }
    free(buf);
    zip_discard(z);
    return rc;
}

static void rmtree_at(int dirfd, int depth)
{
    DIR *d = fdopendir(dirfd);
    if (!d) {
        close(dirfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode) && depth < 64) {
            int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0)
                rmtree_at(sub, depth + 1);
            unlinkat(dirfd, e->d_name, AT_REMOVEDIR);
        } else {
            unlinkat(dirfd, e->d_name, 0);
        }
    }
    closedir(d);
}

void wb__aoti_rmtree(const char *dir)
{
    if (!dir || !dir[0])
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0)
        rmtree_at(fd, 0);
    rmdir(dir);
}

typedef struct candidates {
    char *paths[MAX_CANDIDATES];
    size_t n;     /* found, may exceed MAX_CANDIDATES */
    size_t n_pkg; /* found under data/aotinductor/ */
    char *pkg;    /* the first of those */
} candidates;

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void find_libs(const char *dir, int depth, candidates *c)
{
    if (depth > MAX_DEPTH)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[PATH_MAX];
        int n = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (n < 0 || (size_t)n >= sizeof path)
            continue;
        struct stat st;
        if (lstat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            find_libs(path, depth + 1, c);
        } else if (S_ISREG(st.st_mode) && ends_with(e->d_name, ".so")) {
            if (c->n < MAX_CANDIDATES)
                c->paths[c->n] = wb__strdup(path);
            c->n++;
            if (strstr(path, "/data/aotinductor/")) {
                if (!c->pkg)
                    c->pkg = wb__strdup(path);
                c->n_pkg++;
            }
        }
    }
    closedir(d);
}

static int pick_library(const char *dir, const char *shown, char **so_path, wb_err *err)
{
    candidates c;
    memset(&c, 0, sizeof c);
    find_libs(dir, 0, &c);
    int rc = WB_OK;
    if (c.n_pkg == 1) {
        *so_path = c.pkg;
        c.pkg = NULL;
    } else if (c.n == 1 && c.paths[0]) {
        *so_path = c.paths[0];
        c.paths[0] = NULL;
    } else if (c.n == 0) {
        rc = wb__err_set(err, WB_ENOTFOUND, "no model library (.so) in %s", shown);
    } else {
        char list[600] = "";
        size_t used = 0;
        for (size_t i = 0; i < c.n && i < MAX_CANDIDATES && used < sizeof list - 1; i++) {
            int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                             c.paths[i] ? c.paths[i] + strlen(dir) + 1 : "?");
            if (w < 0)
                break;
            used += (size_t)w;
        }
        rc = wb__err_set(err, WB_EFORMAT,
                         "%s holds %zu model libraries (%s); pass the path of the one to load",
                         shown, c.n, list);
    }
    for (size_t i = 0; i < MAX_CANDIDATES; i++)
        free(c.paths[i]);
    free(c.pkg);
    if (rc == WB_OK && !*so_path)
        rc = wb__err_set(err, WB_ENOMEM, "out of memory");
    return rc;
}

int wb__aoti_locate(const char *path, const char *work_dir, char **so_path, char **tmpdir,
                    wb_err *err)
{
    *so_path = NULL;
    *tmpdir = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return wb__err_errno(err, errno == ENOENT ? WB_ENOTFOUND : WB_EIO, errno, "model %s", path);
    if (S_ISDIR(st.st_mode))
        return pick_library(path, path, so_path, err);
    if (!S_ISREG(st.st_mode))
        return wb__err_set(err, WB_EFORMAT, "model %s is neither a file nor a directory", path);
    unsigned char magic[4] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wb__err_errno(err, WB_EIO, errno, "model %s", path);
    ssize_t got = read(fd, magic, sizeof magic);
    close(fd);
    if (got == 4 && !memcmp(magic,
                            "\x7f"
                            "ELF",
                            4)) {
        *so_path = wb__strdup(path);
        return *so_path ? WB_OK : wb__err_set(err, WB_ENOMEM, "out of memory");
    }
    if (got != 4 || memcmp(magic, "PK\x03\x04", 4) != 0)
        return wb__err_set(err, WB_EFORMAT,
                           "model %s is neither a .pt2 package (zip) nor a shared library (ELF)",
                           path);
    const char *base = work_dir && work_dir[0] ? work_dir : getenv("TMPDIR");
    if (!base || !base[0])
        base = "/tmp";
    char tmpl[PATH_MAX];
    int n = snprintf(tmpl, sizeof tmpl, "%s/wb-aoti-XXXXXX", base);
    if (n < 0 || (size_t)n >= sizeof tmpl)
        return wb__err_set(err, WB_EINVAL, "work directory %s: path too long", base);
    if (!mkdtemp(tmpl))
        return wb__err_errno(err, WB_EIO, errno, "package %s: cannot make a directory in %s", path,
                             base);
    int rc = wb__aoti_unzip(path, tmpl, err);
    if (rc == WB_OK)
        rc = pick_library(tmpl, path, so_path, err);
    if (rc != WB_OK) {
        wb__aoti_rmtree(tmpl);
        return rc;
    }
    *tmpdir = wb__strdup(tmpl);
    if (!*tmpdir) {
        free(*so_path);
        *so_path = NULL;
        wb__aoti_rmtree(tmpl);
        return wb__err_set(err, WB_ENOMEM, "out of memory");
    }
    return WB_OK;
}
