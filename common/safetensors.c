/* The safetensors file reader: opens a checkpoint (one file, a directory or a
 * shard index), reads each file's header with pread and hands the bytes to
 * the parser (safetensors_parse.c). Only headers are ever read here. */
#include "safetensors.h"

#include "alloc.h"
#include "safetensors_index.h"
#include "safetensors_memo.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define INDEX_NAME  "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

/* Names are quoted in messages with a length cap, so that a huge name cannot push
 * the rest of the message out of the fixed-size error buffer. */
#define NAMEF "'%.200s'"
#define FILEF "%.400s"

/* One open of a checkpoint: the caller's options, and whether headers are
 * read into a table (wb__st_open) or the files only opened and checked
 * (wb__st_check_files). */
typedef struct reader {
    const wb_st_open_opts *o;
    int check_only;
} reader;

static int cmp_meta(const void *a, const void *b)
{
    return strcmp(((const wb_st_meta *)a)->key, ((const wb_st_meta *)b)->key);
}

static int open_error(wb_err *err, int errnum, const char *what, const char *path)
{
    if (errnum == ENOENT || errnum == ENOTDIR)
        return wb__err_set(err, WB_ENOTFOUND, "no such file: " FILEF, path);
    return wb__err_errno(err, WB_EIO, errnum, "cannot %s " FILEF, what, path);
}

/* Reads exactly len bytes at off; a short file is an I/O error (it changed
 * size under us). */
static int pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path, wb_err *err)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return wb__err_errno(err, WB_EIO, errno, "cannot read " FILEF, path);
        }
        if (r == 0)
            return wb__err_set(err, WB_EIO,
                               FILEF ": unexpected end of file at byte %" PRIu64
                                     " (did it change while being read?)",
                               path, off);
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Refuses anything but a regular file, then asks the caller's check (if any)
 * whether this file, the one actually open, may be read, before a byte of it
 * is. Closes fd on failure. */
static int accept_fd(const reader *r, int fd, const char *path, struct stat *st, wb_err *err)
{
    int rc = 0;
    if (fstat(fd, st) != 0)
        rc = wb__err_errno(err, WB_EIO, errno, "cannot stat " FILEF, path);
    else if (!S_ISREG(st->st_mode))
        rc = wb__st_fail(err, WB_EFORMAT, path, "not a regular file");
    else if (r->o && r->o->check_file)
        rc = r->o->check_file(r->o->arg, fd, path, err);
    if (rc)
        close(fd);
    return rc;
}

/* Hands the header length of the safetensors file open on fd to the
 * caller's check_header (if any), read from that very descriptor. */
static int check_header_len(const reader *r, int fd, const struct stat *st, const char *path,
                            wb_err *err)
{
    if (!r->o || !r->o->check_header || st->st_size < 8)
        return 0;
    uint8_t head[8];
    int rc = pread_full(fd, head, sizeof head, 0, path, err);
    if (rc == 0)
        rc = r->o->check_header(r->o->arg, path, wb__st_load_le64(head), err);
    return rc;
}

/* Opens a file for reading and refuses anything but a regular file.
 * O_NONBLOCK: a FIFO in place of a shard or index must not hang the reader.
 * On success *fd_out is the open descriptor and *st describes it. */
static int open_regular(const reader *r, const char *path, int *fd_out, struct stat *st,
                        wb_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return open_error(err, errno, "open", path);
    int rc = accept_fd(r, fd, path, st, err);
    if (rc)
        return rc;
    *fd_out = fd;
    return 0;
}

/* Reads the header of the open file `fd` into the table as file
 * `file_index`, then closes fd. */
static int read_header(wb_st_table *table, uint32_t file_index, int fd, const struct stat *sb,
                       const char *path, wb_err *err)
{
    struct stat st = *sb;
    int rc;
    uint8_t *buf = NULL;
    uint64_t size = (uint64_t)st.st_size;
    uint8_t head[8];
    size_t got = size < 8 ? (size_t)size : 8;
    rc = pread_full(fd, head, got, 0, path, err);
    if (rc)
        goto out;
    uint64_t n = got == 8 ? wb__st_load_le64(head) : 0;
    if (got < 8 || n > WB_ST_MAX_HEADER || n > size - 8) {
        /* The parser reports these from the first 8 bytes alone. */
        rc = wb__st_parse_header(table, file_index, path, head, got, size, err);
        goto out;
    }
    buf = wb__malloc((size_t)(8 + n));
    if (!buf) {
        rc = wb__st_fail(err, WB_ENOMEM, path, "out of memory for a %" PRIu64 "-byte header", n);
        goto out;
    }
    memcpy(buf, head, 8);
    rc = pread_full(fd, buf + 8, (size_t)n, 8, path, err);
    if (rc == 0)
        rc = wb__st_parse_header(table, file_index, path, buf, (size_t)(8 + n), size, err);
out:
    free(buf);
    close(fd);
    return rc;
}

static char *path_join(const char *prefix, size_t prefix_len, const char *name)
{
    size_t nl = strlen(name);
    char *s = wb__malloc(prefix_len + nl + 1);
    if (!s)
        return NULL;
    memcpy(s, prefix, prefix_len);
    memcpy(s + prefix_len, name, nl + 1);
    return s;
}

/* A shard name must stay inside the index's directory. */
static const char *bad_shard_name(const char *name)
{
    if (name[0] == '\0')
        return "is empty";
    if (name[0] == '/')
        return "is absolute; shard names are relative to the index's directory";
    for (const char *c = name; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.')
            return "has a '..' component; shards must stay in the index's directory";
        c += len;
        if (*c == '/')
            c++;
    }
    return NULL;
}

/* realpath(path) is `dir` or lies under it. */
static int beneath(const char *dir, const char *path)
{
    char rd[PATH_MAX], rp[PATH_MAX];
    if (!realpath(dir, rd) || !realpath(path, rp))
        return -1;
    size_t n = strlen(rd);
    if (n == 1)
        return 1; /* everything is under "/" */
    return strncmp(rd, rp, n) == 0 && (rp[n] == '\0' || rp[n] == '/');
}

/* Opens a shard, `name` relative to the index's directory `dirfd`
 * (`shard_path` is the same file by path, for messages). The directories of
 * the name must stay inside the index's directory even through symbolic links
 * (openat2 RESOLVE_BENEATH, or a realpath comparison on kernels without
 * openat2); the file itself may be a link anywhere, as Hugging Face caches
 * link snapshots/REV/NAME to ../../blobs/HASH. */
static int open_shard(const reader *r, int dirfd, const char *index_dir, const char *name,
                      const char *shard_path, int *fd_out, struct stat *st, wb_err *err)
{
    const char *slash = strrchr(name, '/');
    int sub = -1, fd;
    if (slash) {
        char dir[PATH_MAX];
        int n = snprintf(dir, sizeof dir, "%.*s", (int)(slash - name), name);
        if (n < 0 || (size_t)n >= sizeof dir)
            return wb__st_fail(err, WB_EFORMAT, shard_path, "shard name too long");
        struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                               .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
        sub = (int)syscall(SYS_openat2, dirfd, dir, &how, sizeof how);
        if (sub < 0 && errno == ENOSYS) {
            char full[PATH_MAX];
            n = snprintf(full, sizeof full, "%s/%s", index_dir, dir);
            if (n < 0 || (size_t)n >= sizeof full)
                return wb__st_fail(err, WB_EFORMAT, shard_path, "shard path too long");
            int in = beneath(index_dir, full);
            if (in == 0)
                errno = EXDEV;
            else
                sub = open(full, O_PATH | O_DIRECTORY | O_CLOEXEC);
        }
        if (sub < 0) {
            if (errno == EXDEV)
                return wb__st_fail(err, WB_EPERM, shard_path,
                                   "shard '%.200s' leaves the index's directory through a symbolic "
                                   "link; shard directories must stay inside it",
                                   name);
            return open_error(err, errno, "open the directory of", shard_path);
        }
        fd = openat(sub, slash + 1, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    } else {
        fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    }
    int e = errno;
    if (sub >= 0)
        close(sub);
    if (fd < 0)
        return open_error(err, e, "open", shard_path);
    int rc = accept_fd(r, fd, shard_path, st, err);
    if (rc)
        return rc;
    *fd_out = fd;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* An index as read_index_json gives it: its tree, its bytes (kept for the
 * memo until the open has succeeded), what the count found. */
typedef struct index_read {
    json_t *root;
    char *buf;
    size_t size;
    int counted;      /* check_count was asked before the parse */
    int remembered;   /* the tree came from the memo */
    uint64_t values;  /* the JSON values in it (counted), else its size */
    uint64_t entries; /* the weight_map's (counted) */
} index_read;

/* Reads and parses the index, after judging what its bytes hold: its
 * entries by check_count and the other values against WB_ST_INDEX_MAX_OTHER,
 * so that an index over a limit is never made into a tree (some 170 bytes an
 * entry). ir->counted tells whether check_count was asked: bytes whose
 * structure the count cannot follow are the parser's to refuse. Bytes the
 * memo holds give its tree, the caller's limit asked again. */
static int read_index_json(const reader *r, const char *path, index_read *ir, wb_err *err)
{
    memset(ir, 0, sizeof *ir);
    json_t **out = &ir->root;
    int *counted = &ir->counted;
    int fd = -1;
    struct stat st;
    int rc = open_regular(r, path, &fd, &st, err);
    if (rc)
        return rc;
    char *buf = NULL;
    if ((uint64_t)st.st_size > WB_ST_MAX_HEADER) {
        rc = wb__st_fail(err, WB_EFORMAT, path, "index is %jd bytes, more than the %llu-byte limit",
                         (intmax_t)st.st_size, WB_ST_MAX_HEADER);
        goto out;
    }
    size_t size = (size_t)st.st_size;
    buf = wb__malloc(size ? size : 1);
    if (!buf) {
        rc = wb__st_fail(err, WB_ENOMEM, path, "out of memory reading the index");
        goto out;
    }
    rc = pread_full(fd, buf, size, 0, path, err);
    if (rc)
        goto out;
    ir->buf = buf;
    ir->size = size;
    ir->values = size;
    if (wb__st_memo_get_index(buf, size, out, counted, &ir->entries) == 1) {
        ir->remembered = 1;
        if (*counted && r->o && r->o->check_count &&
            (rc = r->o->check_count(r->o->arg, path, ir->entries, err)) != 0) {
            json_decref(*out);
            *out = NULL;
        }
        goto out;
    }
    wb_st_index_count n;
    if (wb__st_index_count(buf, size, &n) == 0) {
        if (n.other_values > WB_ST_INDEX_MAX_OTHER) {
            rc = wb__st_fail(err, WB_ELIMIT, path,
                             "the index holds %" PRIu64 " JSON values besides its weight_map's "
                             "entries, over the limit of %d",
                             n.other_values, WB_ST_INDEX_MAX_OTHER);
            goto out;
        }
        *counted = 1;
        ir->entries = n.map_entries;
        ir->values = n.map_entries + n.other_values;
        if (r->o && r->o->check_count &&
            (rc = r->o->check_count(r->o->arg, path, n.map_entries, err)) != 0)
            goto out;
    }
    json_error_t je;
    unsigned long failures = wb__alloc_jansson_failures();
    *out = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &je);
    if (wb__st_json_nomem(out, &je, failures))
        rc = wb__st_fail(err, WB_ENOMEM, path, "out of memory parsing the JSON index");
    else if (!*out)
        rc = wb__st_fail(err, WB_EFORMAT, path,
                         "malformed JSON index: %s (line %d, column %d, byte %d)", je.text, je.line,
                         je.column, je.position);
out:
    if (!ir->buf)
        free(buf);
    close(fd);
    return rc;
}

/* Index metadata values are strings or numbers (transformers writes
 * total_size as an integer); numbers become their decimal text. */
static int add_index_metadata(wb_st_table *table, const char *path, json_t *meta, wb_err *err)
{
    if (!meta)
        return 0;
    if (!json_is_object(meta))
        return wb__st_fail(err, WB_EFORMAT, path, "\"metadata\" is %s, expected an object",
                           wb__st_json_kind(meta));
    size_t n = json_object_size(meta);
    if (n == 0)
        return 0;
    table->meta = wb__calloc(n, sizeof *table->meta);
    if (!table->meta)
        return wb__st_fail(err, WB_ENOMEM, path, "out of memory reading metadata");
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value)
    {
        char num[64];
        const char *text;
        if (json_is_string(value)) {
            text = json_string_value(value);
        } else if (json_is_integer(value)) {
            snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
            text = num;
        } else if (json_is_real(value)) {
            /* The shortest text that reads back as the same double. */
            for (int prec = 15; prec <= 17; prec++) {
                snprintf(num, sizeof num, "%.*g", prec, json_real_value(value));
                if (strtod(num, NULL) == json_real_value(value))
                    break;
            }
            text = num;
        } else {
            return wb__st_fail(err, WB_EFORMAT, path,
                               "metadata value of key " NAMEF
                               " is %s; expected a string or a number",
                               key, wb__st_json_kind(value));
        }
        wb_st_meta *mm = &table->meta[table->n_meta];
        mm->key = wb__strdup(key);
        mm->value = wb__strdup(text);
        table->n_meta++;
        if (!mm->key || !mm->value)
            return wb__st_fail(err, WB_ENOMEM, path, "out of memory reading metadata");
    }
    qsort(table->meta, table->n_meta, sizeof *table->meta, cmp_meta);
    return 0;
}

/* An index's shards, as open_index walks them. */
typedef struct shard_walk {
    const char *path; /* the index */
    size_t prefix_len;
    int dirfd; /* the index's directory */
    const char *index_dir;
    const char **shards; /* distinct, sorted */
    size_t n_shards;
    json_t *wm;
} shard_walk;

/* Opens every shard in name order, each judged by the caller's checks; with
 * `check_only` closes it again, else reads its header into `table`. A missing
 * shard is reported with a tensor it holds. */
static int walk_shards(const reader *r, const shard_walk *w, int check_only, wb_st_table *table,
                       wb_err *err)
{
    for (size_t i = 0; i < w->n_shards; i++) {
        char *shard_path = path_join(w->path, w->prefix_len, w->shards[i]);
        if (!shard_path)
            return wb__st_fail(err, WB_ENOMEM, w->path, "out of memory");
        int fd = -1;
        struct stat st;
        int rc = open_shard(r, w->dirfd, w->index_dir, w->shards[i], shard_path, &fd, &st, err);
        if (rc == 0 && (rc = check_header_len(r, fd, &st, shard_path, err)) != 0)
            close(fd);
        else if (rc == 0 && check_only)
            close(fd);
        else if (rc == 0)
            rc = read_header(table, (uint32_t)i, fd, &st, shard_path, err);
        if (rc == WB_ENOTFOUND) {
            const char *holder = "", *name;
            json_t *value;
            json_object_foreach(w->wm, name, value)
            {
                if (strcmp(json_string_value(value), w->shards[i]) == 0) {
                    holder = name;
                    break;
                }
            }
            rc = wb__st_fail(err, WB_ENOTFOUND, w->path,
                             "shard '%.200s' (holding tensor " NAMEF
                             ") is missing: no such file: " FILEF,
                             w->shards[i], holder, shard_path);
        }
        free(shard_path);
        if (rc)
            return rc;
    }
    return 0;
}

/* Opens a sharded checkpoint: every shard the weight_map names, in name order,
 * then checks that the map and the shards agree tensor by tensor. */
static int open_index(const reader *r, const char *path, wb_st_table **out, wb_err *err)
{
    index_read ir;
    int rc = read_index_json(r, path, &ir, err);
    json_t *root = ir.root;
    if (rc) {
        free(ir.buf);
        return rc;
    }
    wb_st_table *table = NULL;
    char *index_dir = NULL;
    int dirfd = -1;
    const char **shards = NULL;
    size_t n_shards = 0;
    if (!json_is_object(root)) {
        rc = wb__st_fail(err, WB_EFORMAT, path, "index is %s, expected a JSON object",
                         wb__st_json_kind(root));
        goto out;
    }
    json_t *wm = json_object_get(root, "weight_map");
    if (!wm) {
        rc = wb__st_fail(err, WB_EFORMAT, path, "index has no \"weight_map\"");
        goto out;
    }
    if (!json_is_object(wm)) {
        rc = wb__st_fail(err, WB_EFORMAT, path, "\"weight_map\" is %s, expected an object",
                         wb__st_json_kind(wm));
        goto out;
    }
    size_t n_map = json_object_size(wm);
    shards = wb__malloc((n_map ? n_map : 1) * sizeof *shards);
    if (!shards) {
        rc = wb__st_fail(err, WB_ENOMEM, path, "out of memory reading the weight_map");
        goto out;
    }
    const char *name;
    json_t *value;
    json_object_foreach(wm, name, value)
    {
        if (name[0] == '\0') {
            rc = wb__st_fail(err, WB_EFORMAT, path, "weight_map has a tensor with an empty name");
            goto out;
        }
        if (!json_is_string(value)) {
            rc = wb__st_fail(err, WB_EFORMAT, path,
                             "weight_map entry of tensor " NAMEF
                             " is %s, expected a shard file name",
                             name, wb__st_json_kind(value));
            goto out;
        }
        const char *why = bad_shard_name(json_string_value(value));
        if (why) {
            rc = wb__st_fail(err, WB_EFORMAT, path,
                             "weight_map: shard '%.200s' of tensor " NAMEF " %s",
                             json_string_value(value), name, why);
            goto out;
        }
        shards[n_shards++] = json_string_value(value);
    }
    /* Counted before the parse unless the count could not follow the
     * bytes (and the parser still took them). */
    if (!ir.counted && r->o && r->o->check_count &&
        (rc = r->o->check_count(r->o->arg, path, n_map, err)) != 0)
        goto out;
    qsort(shards, n_shards, sizeof *shards, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0)
            shards[u++] = shards[i];
    n_shards = u;
    if (r->o && r->o->check_shards &&
        (rc = r->o->check_shards(r->o->arg, path, n_shards, err)) != 0)
        goto out;
    if (n_shards > UINT32_MAX) {
        rc = wb__st_fail(err, WB_EFORMAT, path, "too many shards");
        goto out;
    }

    table = wb__calloc(1, sizeof *table);
    if (!table) {
        rc = wb__st_fail(err, WB_ENOMEM, path, "out of memory");
        goto out;
    }
    rc = add_index_metadata(table, path, json_object_get(root, "metadata"), err);
    if (rc)
        goto out;

    const char *slash = strrchr(path, '/');
    size_t prefix_len = slash ? (size_t)(slash - path) + 1 : 0;
    index_dir = slash == path ? wb__strdup("/")
                : slash       ? wb__strndup(path, prefix_len - 1)
                              : wb__strdup(".");
    if (!index_dir) {
        rc = wb__st_fail(err, WB_ENOMEM, path, "out of memory");
        goto out;
    }
    dirfd = open(index_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) {
        rc = open_error(err, errno, "open the directory of", path);
        goto out;
    }
    shard_walk w = {.path = path,
                    .prefix_len = prefix_len,
                    .dirfd = dirfd,
                    .index_dir = index_dir,
                    .shards = shards,
                    .n_shards = n_shards,
                    .wm = wm};
    if (!r->check_only && r->o && r->o->precheck && (rc = walk_shards(r, &w, 1, NULL, err)) != 0)
        goto out;
    if ((rc = walk_shards(r, &w, r->check_only, table, err)) != 0)
        goto out;

    if (r->check_only)
        goto out;
    /* Every tensor of every shard is in the map, mapped to that shard ... */
    for (size_t i = 0; i < table->n_tensors; i++) {
        const wb_st_tensor *t = &table->tensors[i];
        json_t *mapped = json_object_get(wm, t->name);
        if (!mapped) {
            rc = wb__st_fail(err, WB_EFORMAT, path,
                             "tensor " NAMEF " in shard " FILEF " is not listed in the weight_map",
                             t->name, shards[t->file]);
            goto out;
        }
        if (strcmp(json_string_value(mapped), shards[t->file]) != 0) {
            rc = wb__st_fail(err, WB_EFORMAT, path,
                             "tensor " NAMEF " is stored in shard " FILEF
                             " but the weight_map maps it to %.200s",
                             t->name, shards[t->file], json_string_value(mapped));
            goto out;
        }
    }
    /* ... and every tensor of the map is in its shard. */
    json_object_foreach(wm, name, value)
    {
        if (!wb__st_find(table, name)) {
            rc =
                wb__st_fail(err, WB_EFORMAT, path,
                            "tensor " NAMEF " is mapped to shard %.200s, which does not contain it",
                            name, json_string_value(value));
            goto out;
        }
    }
out:
    if (dirfd >= 0)
        close(dirfd);
    free(index_dir);
    free(shards);
    if (rc == 0 && !r->check_only) {
        if (ir.remembered)
            table->remembered++;
        else
            wb__st_memo_put_index(ir.buf, ir.size, root, ir.counted, ir.entries, ir.values);
    }
    free(ir.buf);
    json_decref(root);
    if (rc || r->check_only)
        wb__st_table_free(&table);
    *out = table;
    return rc;
}

static int open_single(const reader *r, const char *path, wb_st_table **out, wb_err *err)
{
    int fd = -1;
    struct stat st;
    int rc = open_regular(r, path, &fd, &st, err);
    if (rc)
        return rc;
    if ((rc = check_header_len(r, fd, &st, path, err)) != 0 || r->check_only) {
        close(fd);
        return rc;
    }
    wb_st_table *table = wb__calloc(1, sizeof *table);
    if (!table) {
        close(fd);
        return wb__err_set(err, WB_ENOMEM, "out of memory opening " FILEF, path);
    }
    rc = read_header(table, 0, fd, &st, path, err);
    if (rc)
        wb__st_table_free(&table);
    *out = table;
    return rc;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/* A directory holds an index (sharded) or a single model.safetensors. */
static int open_dir(const reader *r, const char *path, wb_st_table **out, wb_err *err)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    int root = len == 1 && path[0] == '/';
    char *prefix = wb__malloc(len + 2);
    if (!prefix)
        return wb__err_set(err, WB_ENOMEM, "out of memory opening " FILEF, path);
    memcpy(prefix, path, len);
    if (!root)
        prefix[len++] = '/';
    prefix[len] = '\0';

    int rc;
    struct stat st;
    char *candidate = path_join(prefix, len, INDEX_NAME);
    if (!candidate) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory opening " FILEF, path);
        goto out;
    }
    if (stat(candidate, &st) == 0) {
        rc = open_index(r, candidate, out, err);
        goto out;
    }
    if (errno != ENOENT) {
        rc = wb__err_errno(err, WB_EIO, errno, "cannot stat " FILEF, candidate);
        goto out;
    }
    free(candidate);
    candidate = path_join(prefix, len, SINGLE_NAME);
    if (!candidate) {
        rc = wb__err_set(err, WB_ENOMEM, "out of memory opening " FILEF, path);
        goto out;
    }
    if (stat(candidate, &st) == 0) {
        rc = open_single(r, candidate, out, err);
        goto out;
    }
    if (errno != ENOENT) {
        rc = wb__err_errno(err, WB_EIO, errno, "cannot stat " FILEF, candidate);
        goto out;
    }
    rc = wb__err_set(err, WB_ENOTFOUND,
                     FILEF ": directory holds neither " INDEX_NAME " nor " SINGLE_NAME, path);
out:
    free(candidate);
    free(prefix);
    return rc;
}

static int open_checkpoint(const reader *r, const char *path, wb_st_table **out, wb_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return open_error(err, errno, "stat", path);
    if (S_ISDIR(st.st_mode))
        return open_dir(r, path, out, err);
    if (ends_with(path, ".json"))
        return open_index(r, path, out, err);
    return open_single(r, path, out, err);
}

int wb__st_open_ex(const char *path, const wb_st_open_opts *opts, wb_st_table **out, wb_err *err)
{
    if (!out)
        return wb__err_set(err, WB_EINVAL, "wb__st_open: no output table");
    *out = NULL;
    if (!path || !*path)
        return wb__err_set(err, WB_EINVAL, "wb__st_open: empty path");
    reader r = {.o = opts, .check_only = 0};
    return open_checkpoint(&r, path, out, err);
}

int wb__st_open(const char *path, wb_st_table **out, wb_err *err)
{
    return wb__st_open_ex(path, NULL, out, err);
}

int wb__st_check_files(const char *path, const wb_st_open_opts *opts, wb_err *err)
{
    if (!path || !*path)
        return wb__err_set(err, WB_EINVAL, "wb__st_check_files: empty path");
    reader r = {.o = opts, .check_only = 1};
    wb_st_table *none = NULL;
    int rc = open_checkpoint(&r, path, &none, err);
    wb__st_table_free(&none);
    return rc;
}
