/* Constant binding rules of the AOTI binding: the prefix map, aliases
 * (tied weights) and the package's constants file (aoti_rules.h). */
#include "aoti_rules.h"

#include "alloc.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define META_ALIASES "weightbroker.aliases"
#define META_STRIP   "weightbroker.strip_prefix"
#define META_PREFIX  "weightbroker.prefix"
#define META_MUTATED "weightbroker.mutated"
#define PKG_ENTRY    "weightbroker/constants.safetensors"
#define BESIDE_EXT   ".wb.safetensors"

static char *trimmed(const char *s, size_t n)
{
    while (n && isspace((unsigned char)*s)) {
        s++;
        n--;
    }
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    return wb__strndup(s, n);
}

int wb__aoti_aliases_parse(wb__aoti_rules *rules, const char *list, int from_file, const char *what,
                           wb_err *err)
{
    const char *p = list;
    while (p && *p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        char *item = trimmed(p, len);
        if (!item)
            return wb__err_set(err, WB_ENOMEM, "out of memory");
        if (!item[0]) { /* "a=b," or ",," */
            free(item);
            p = end ? end + 1 : p + len;
            continue;
        }
        char *name = eq ? trimmed(p, (size_t)(eq - p)) : NULL;
        char *target = eq ? trimmed(eq + 1, len - (size_t)(eq - p) - 1) : NULL;
        int bad = !eq || !name || !target || !name[0] || !target[0] || strchr(target, '=');
        if (bad) {
            int rc = wb__err_set(err, WB_EINVAL,
                                 "%s: alias '%s': expected NAME=TARGET (a constant's name, then "
                                 "the checkpoint tensor it is tied to)",
                                 what, item);
            free(item);
            free(name);
            free(target);
            return rc;
        }
        free(item);
        wb__alias *a = wb__realloc(rules->aliases, (rules->n_aliases + 1) * sizeof *a);
        if (!a) {
            free(name);
            free(target);
            return wb__err_set(err, WB_ENOMEM, "out of memory");
        }
        rules->aliases = a;
        a[rules->n_aliases++] = (wb__alias){name, target, from_file};
        p = end ? end + 1 : p + len;
    }
    return WB_OK;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static const char *meta(const wb_st_table *t, const char *key)
{
    for (size_t i = 0; i < t->n_meta; i++) {
        if (strcmp(t->meta[i].key, key) == 0)
            return t->meta[i].value;
    }
    return NULL;
}

static int set_str(char **dst, const char *src, wb_err *err)
{
    if (!src)
        return WB_OK;
    free(*dst);
    *dst = wb__strdup(src);
    return *dst ? WB_OK : wb__err_set(err, WB_ENOMEM, "out of memory");
}

/* <root>/weightbroker/constants.safetensors, or the same one folder down
 * (a .pt2 archive keeps everything under its archive name, "model/"). */
static int find_in_package(const char *root, char *path, size_t size)
{
    if (snprintf(path, size, "%s/%s", root, PKG_ENTRY) < (int)size && exists(path))
        return 1;
    DIR *d = opendir(root);
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        found = snprintf(path, size, "%s/%s/%s", root, e->d_name, PKG_ENTRY) < (int)size &&
                exists(path);
    }
    closedir(d);
    return found;
}

/* Appends the names of the list "a, b,c" to *set, kept as ",a,b,c," so that
 * a lookup is one strstr of ",name,". */
static int add_names(char **set, const char *list, wb_err *err)
{
    if (!list || !list[0])
        return WB_OK;
    size_t have = *set ? strlen(*set) : 0;
    char *n = wb__realloc(*set, have + strlen(list) + 3);
    if (!n)
        return wb__err_set(err, WB_ENOMEM, "out of memory");
    if (!have)
        n[have++] = ',';
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *item = trimmed(p, len);
        if (!item) {
            n[have] = '\0';
            *set = n;
            return wb__err_set(err, WB_ENOMEM, "out of memory");
        }
        size_t il = strlen(item);
        if (il) {
            memcpy(n + have, item, il);
            have += il;
            n[have++] = ',';
        }
        free(item);
        p = end ? end + 1 : p + len;
    }
    n[have] = '\0';
    *set = n;
    return WB_OK;
}

int wb__aoti_is_mutated(const wb__aoti_rules *r, const char *fqn)
{
    if (!r->mutated || !fqn || !fqn[0])
        return 0;
    size_t len = strlen(fqn);
    for (const char *p = strstr(r->mutated, fqn); p; p = strstr(p + 1, fqn)) {
        if (p > r->mutated && p[-1] == ',' && p[len] == ',')
            return 1;
    }
    return 0;
}

int wb__aoti_rules_init(wb__aoti_rules *r, const char *aliases, const char *strip_prefix,
                        const char *prefix, const char *mutated, const char *explicit_file,
                        const char *package_root, const char *model_path, wb_err *err)
{
    char path[PATH_MAX];
    memset(r, 0, sizeof *r);
    path[0] = '\0';
    if (explicit_file && explicit_file[0]) {
        if (!exists(explicit_file))
            return wb__err_set(err, WB_ENOTFOUND, "constants file %s: no such file", explicit_file);
        snprintf(path, sizeof path, "%s", explicit_file);
    } else {
        if (package_root && find_in_package(package_root, path, sizeof path)) {
            /* found inside the package */
        } else if (model_path &&
                   snprintf(path, sizeof path, "%s%s", model_path, BESIDE_EXT) < (int)sizeof path &&
                   exists(path)) {
            /* found beside the model */
        } else {
            path[0] = '\0';
        }
    }
    int rc = WB_OK;
    if (path[0]) {
        if ((rc = wb__st_open(path, &r->extra, err)) != WB_OK)
            return rc;
        if (!(r->extra_path = wb__strdup(path)))
            return wb__err_set(err, WB_ENOMEM, "out of memory");
        char what[PATH_MAX + 64];
        snprintf(what, sizeof what, "constants file %s (%s)", path, META_ALIASES);
        if ((rc = wb__aoti_aliases_parse(r, meta(r->extra, META_ALIASES), 1, what, err)))
            return rc;
        if ((rc = set_str(&r->strip_prefix, meta(r->extra, META_STRIP), err)) ||
            (rc = set_str(&r->prefix, meta(r->extra, META_PREFIX), err)) ||
            (rc = add_names(&r->mutated, meta(r->extra, META_MUTATED), err)))
            return rc;
    }
    if ((rc = add_names(&r->mutated, mutated, err)))
        return rc;
    /* The caller's rules come after the file's: alias lookups take the last
     * match, and the caller's prefixes replace the file's. */
    if ((rc = wb__aoti_aliases_parse(r, aliases, 0, "option aliases", err)))
        return rc;
    if ((rc = set_str(&r->strip_prefix, strip_prefix, err)) ||
        (rc = set_str(&r->prefix, prefix, err)))
        return rc;
    return WB_OK;
}

void wb__aoti_rules_free(wb__aoti_rules *r)
{
    for (size_t i = 0; i < r->n_aliases; i++) {
        free(r->aliases[i].name);
        free(r->aliases[i].target);
    }
    free(r->aliases);
    free(r->strip_prefix);
    free(r->prefix);
    free(r->mutated);
    free(r->extra_path);
    wb__st_table_free(&r->extra);
    memset(r, 0, sizeof *r);
}

const char *wb__aoti_map_name(const wb__aoti_rules *r, const char *fqn, char *buf, size_t size)
{
    const char *rest = fqn;
    size_t sl = r->strip_prefix ? strlen(r->strip_prefix) : 0;
    if (sl && strncmp(fqn, r->strip_prefix, sl) == 0)
        rest = fqn + sl;
    int w = snprintf(buf, size, "%s%s", r->prefix ? r->prefix : "", rest);
    return w >= 0 && (size_t)w < size ? buf : NULL;
}

const wb_st_tensor *wb__aoti_extra_find(const wb__aoti_rules *r, const char *fqn,
                                        const char *mapped)
{
    if (!r->extra)
        return NULL;
    const wb_st_tensor *t = wb__st_find(r->extra, fqn);
    return t ? t : mapped ? wb__st_find(r->extra, mapped) : NULL;
}

int wb__aoti_extra_read(const wb__aoti_rules *r, const wb_st_tensor *t, void **out, wb_err *err)
{
    *out = NULL;
    const char *file = r->extra->files[t->file];
    void *buf = wb__malloc(t->nbytes ? t->nbytes : 1);
    if (!buf)
        return wb__err_set(err, WB_ENOMEM, "out of memory reading '%s' from %s", t->name, file);
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        free(buf);
        return wb__err_errno(err, WB_EIO, errno, "constants file %s", file);
    }
    uint64_t done = 0;
    while (done < t->nbytes) {
        ssize_t n = pread(fd, (char *)buf + done, t->nbytes - done, (off_t)(t->offset + done));
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            free(buf);
            return wb__err_errno(err, WB_EIO, e, "constants file %s: reading '%s'", file, t->name);
        }
        done += (uint64_t)n;
    }
    close(fd);
    *out = buf;
    return WB_OK;
}

void wb__aoti_rules_text(const char *strip, const char *prefix, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s%s%s", strip && strip[0] ? " --strip-prefix " : "",
             strip && strip[0] ? strip : "", prefix && prefix[0] ? " --prefix " : "",
             prefix && prefix[0] ? prefix : "");
}
