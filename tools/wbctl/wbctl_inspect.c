/* wbctl inspect: prints the tensor table of a safetensors checkpoint, read and
 * validated by the same reader the broker uses. Needs no broker. */
#include "wbctl.h"

#include "safetensors.h"
#include "wbctl_call.h"

#include <jansson.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const wbctl_spec spec = {
    .synopsis = "inspect [--json] PATH",
    .about =
        "Validates a safetensors checkpoint and prints its tensor table. PATH is a\n"
        ".safetensors file, a model.safetensors.index.json, or a directory holding\n"
        "one of those (the index first). Needs no broker.\n\n"
        "--json prints {\"metadata\": {...}, \"tensors\": [{\"name\", \"dtype\", \"shape\",\n"
        "\"file\", \"offset\", \"nbytes\"}]}; offsets are absolute byte offsets in the file.\n\n"
        "Exit codes: 0 valid, 2 misuse, 65 malformed checkpoint, 66 missing file,\n"
        "70 internal error, 74 read error.",
    .min_args = 1,
    .max_args = 1,
    .arg_names = (const char *const[]){"PATH"},
    .flags = WBCTL_LOCAL,
};

static int exit_code(int status)
{
    switch (status) {
    case WB_EFORMAT:
        return WBCTL_EXIT_DATAERR;
    case WB_ENOTFOUND:
        return WBCTL_EXIT_NOINPUT;
    case WB_EIO:
        return WBCTL_EXIT_IOERR;
    case WB_EINVAL:
        return WBCTL_EXIT_USAGE;
    default:
        return WBCTL_EXIT_SOFTWARE;
    }
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static void format_shape(char *buf, size_t size, const wb_st_tensor *t)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (uint32_t i = 0; i < t->ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* Metadata is free text: control characters are escaped so that one entry
 * stays on one line. */
static void print_escaped(FILE *out, const char *s)
{
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '\\')
            fputs("\\\\", out);
        else if (*c == '\n')
            fputs("\\n", out);
        else if (*c == '\t')
            fputs("\\t", out);
        else if (*c < 0x20 || *c == 0x7f)
            fprintf(out, "\\x%02x", *c);
        else
            fputc(*c, out);
    }
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

static int print_plain(const char *path, const wb_st_table *t)
{
    printf("%s: %u file%s, %zu tensor%s, %" PRIu64 " bytes\n", path, t->n_files,
           t->n_files == 1 ? "" : "s", t->n_tensors, t->n_tensors == 1 ? "" : "s", t->total_bytes);
    for (size_t i = 0; i < t->n_meta; i++) {
        fputs("metadata ", stdout);
        print_escaped(stdout, t->meta[i].key);
        fputs(" = ", stdout);
        print_escaped(stdout, t->meta[i].value);
        fputc('\n', stdout);
    }
    if (t->n_tensors == 0)
        return 0;

    /* Column widths from the data, so that the table lines up. */
    char shape[2048], num[32];
    size_t w_name = 4, w_dtype = 5, w_shape = 5, w_file = 4, w_off = 6, w_nb = 6;
    for (size_t i = 0; i < t->n_tensors; i++) {
        const wb_st_tensor *x = &t->tensors[i];
        w_name = max_size(w_name, strlen(x->name));
        w_dtype = max_size(w_dtype, strlen(wb__dtype_name(x->dtype)));
        format_shape(shape, sizeof shape, x);
        w_shape = max_size(w_shape, strlen(shape));
        w_file = max_size(w_file, strlen(base_name(t->files[x->file])));
        w_off = max_size(w_off, (size_t)snprintf(num, sizeof num, "%" PRIu64, x->offset));
        w_nb = max_size(w_nb, (size_t)snprintf(num, sizeof num, "%" PRIu64, x->nbytes));
    }
    printf("%-*s  %-*s  %-*s  %-*s  %*s  %*s\n", (int)w_name, "NAME", (int)w_dtype, "DTYPE",
           (int)w_shape, "SHAPE", (int)w_file, "FILE", (int)w_off, "OFFSET", (int)w_nb, "NBYTES");
    for (size_t i = 0; i < t->n_tensors; i++) {
        const wb_st_tensor *x = &t->tensors[i];
        format_shape(shape, sizeof shape, x);
        printf("%-*s  %-*s  %-*s  %-*s  %*" PRIu64 "  %*" PRIu64 "\n", (int)w_name, x->name,
               (int)w_dtype, wb__dtype_name(x->dtype), (int)w_shape, shape, (int)w_file,
               base_name(t->files[x->file]), (int)w_off, x->offset, (int)w_nb, x->nbytes);
    }
    return 0;
}

/* Builds {"metadata": {...}, "tensors": [...]}; jansson keeps insertion
 * order, so the keys come out in the documented order. */
static json_t *build_json(const wb_st_table *t)
{
    json_t *root = json_object();
    json_t *meta = json_object();
    json_t *tensors = json_array();
    if (!root || !meta || !tensors) {
        json_decref(root);
        json_decref(meta);
        json_decref(tensors);
        return NULL;
    }
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "tensors", tensors);
    for (size_t i = 0; i < t->n_meta; i++)
        if (json_object_set_new(meta, t->meta[i].key, json_string(t->meta[i].value)) != 0)
            goto fail;
    for (size_t i = 0; i < t->n_tensors; i++) {
        const wb_st_tensor *x = &t->tensors[i];
        json_t *e = json_object();
        json_t *shape = json_array();
        if (!e || !shape || json_array_append_new(tensors, e) != 0) {
            json_decref(shape);
            goto fail;
        }
        json_object_set_new(e, "name", json_string(x->name));
        json_object_set_new(e, "dtype", json_string(wb__dtype_name(x->dtype)));
        json_object_set_new(e, "shape", shape);
        for (uint32_t d = 0; d < x->ndim; d++)
            json_array_append_new(shape, json_integer((json_int_t)x->shape[d]));
        json_object_set_new(e, "file", json_string(t->files[x->file]));
        json_object_set_new(e, "offset", json_integer((json_int_t)x->offset));
        json_object_set_new(e, "nbytes", json_integer((json_int_t)x->nbytes));
        if (json_object_size(e) != 6 || json_array_size(shape) != x->ndim)
            goto fail;
    }
    return root;
fail:
    json_decref(root);
    return NULL;
}

int wbctl_inspect(const wbctl_globals *g, int argc, char **argv)
{
    (void)g;
    wbctl_args args;
    int rc = wbctl_parse(argc, argv, &spec, &args);
    if (rc >= 0)
        return rc;
    int as_json = args.output == WBCTL_OUT_JSON;
    const char *path = args.pos[0];

    wb_err err = {0};
    wb_st_table *t = NULL;
    rc = wb__st_open(path, &t, &err);
    if (rc != WB_OK) {
        fprintf(stderr, "wbctl: inspect: %s\n", err.msg);
        return exit_code(rc);
    }
    int code = WBCTL_EXIT_OK;
    if (as_json) {
        json_t *root = build_json(t);
        if (!root) {
            fprintf(stderr, "wbctl: inspect: out of memory building the JSON output\n");
            code = WBCTL_EXIT_SOFTWARE;
        } else {
            if (json_dumpf(root, stdout, JSON_INDENT(2)) != 0)
                code = WBCTL_EXIT_IOERR;
            fputc('\n', stdout);
            json_decref(root);
        }
    } else {
        print_plain(path, t);
    }
    wb__st_table_free(&t);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        perror("wbctl: inspect: writing the output");
        code = WBCTL_EXIT_IOERR;
    }
    return code;
}
