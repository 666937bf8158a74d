/* wbctl's broker commands: models, leases, containers, load, unload, stats. */
#include "wbctl.h"

#include "rpc.h"
#include "wbctl_progress.h"
#include "wire.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A load can read many gigabytes before the broker answers. */
#define LOAD_TIMEOUT_MS (10 * 60 * 1000)

#define GLOBAL_OPTS "[--socket PATH] [--timeout-ms MS]"

/* Parses a subcommand's own options (--json, --help) and exactly `nargs`
 * positional arguments into pos. Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, const char *synopsis, const char *about, int nargs,
                      const char *const *arg_names, int *json, char **pos)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0];
    *json = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'j':
            *json = 1;
            break;
        case 'h':
            printf("usage: wbctl " GLOBAL_OPTS " %s\n\n%s\n\n"
                   "  --json     print JSON (for programs) instead of a table\n"
                   "  -h, --help print this help\n"
                   "The global options are described by 'wbctl --help'.\n",
                   synopsis, about);
            return WBCTL_EXIT_OK;
        default:
            if (optopt)
                fprintf(stderr, "wbctl %s: unknown option '-%c'\n", cmd, optopt);
            else
                fprintf(stderr, "wbctl %s: unknown option '%s'\n", cmd, argv[optind - 1]);
            fprintf(stderr, "usage: wbctl " GLOBAL_OPTS " %s\n", synopsis);
            return WBCTL_EXIT_USAGE;
        }
    }
    int have = argc - optind;
    if (have < nargs) {
        fprintf(stderr, "wbctl %s: missing argument %s\nusage: wbctl " GLOBAL_OPTS " %s\n", cmd,
                arg_names[have], synopsis);
        return WBCTL_EXIT_USAGE;
    }
    if (have > nargs) {
        fprintf(stderr, "wbctl %s: unexpected argument '%s'\nusage: wbctl " GLOBAL_OPTS " %s\n",
                cmd, argv[optind + nargs], synopsis);
        return WBCTL_EXIT_USAGE;
    }
    for (int i = 0; i < nargs; i++)
        pos[i] = argv[optind + i];
    return -1;
}

/* One exchange with the broker. Returns -1 with *rep set on success, else
 * the exit code after printing why: 1 when the broker refused, 69 when no
 * broker answered. */
static int call(const wbctl_globals *g, const char *op, Wbproto__Request *req, int timeout_ms,
                Wbproto__Reply **rep)
{
    wb__rpc rpc;
    wb_err e;
    *rep = NULL;
    int rc = wb__rpc_open(&rpc, g->socket_path, timeout_ms, &e);
    if (rc != WB_OK) {
        wb__rpc_close(&rpc);
        fprintf(stderr, "wbctl: %s\n", e.msg);
        return rc == WB_EINVAL ? WBCTL_EXIT_USAGE : WBCTL_EXIT_UNAVAILABLE;
    }
    rc = wb__rpc_call(&rpc, req, 0, rep, &e);
    wb__rpc_close(&rpc);
    if (rc == WB_OK)
        return -1;
    char *msg = wbctl_escape(e.msg);
    fprintf(stderr, "wbctl: %s: %s\n", op, msg ? msg : "(out of memory)");
    free(msg);
    if (*rep) {
        wb__reply_free(rep);
        return WBCTL_EXIT_REFUSED;
    }
    return WBCTL_EXIT_UNAVAILABLE;
}

/* A peer's string as a JSON string: exact when it is valid UTF-8. */
static json_t *jstr(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j)
        return j;
    char *fixed = wbctl_utf8(s);
    j = json_string(fixed ? fixed : "");
    free(fixed);
    return j;
}

static int print_json(json_t *j)
{
    if (!j) {
        fprintf(stderr, "wbctl: out of memory\n");
        return 1;
    }
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) {
        fprintf(stderr, "wbctl: out of memory\n");
        return 1;
    }
    puts(s);
    free(s);
    return WBCTL_EXIT_OK;
}

/* A plain table: rows of strings, columns padded to their widest cell. */
typedef struct table {
    size_t ncols, nrows, cap;
    char **cells;
} table;

static void table_add(table *t, ...)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 8;
        char **cells = realloc(t->cells, cap * t->ncols * sizeof *cells);
        if (!cells)
            return;
        t->cells = cells;
        t->cap = cap;
    }
    va_list ap;
    va_start(ap, t);
    for (size_t i = 0; i < t->ncols; i++) {
        /* Cells hold what peers chose (process names, paths): escaped, so
         * that none can drive the terminal. */
        const char *s = va_arg(ap, const char *);
        t->cells[t->nrows * t->ncols + i] = wbctl_escape(s);
    }
    va_end(ap);
    t->nrows++;
}

static void table_print(table *t)
{
    size_t width[16] = {0};
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols && c < 16; c++) {
            const char *s = t->cells[r * t->ncols + c];
            size_t n = s ? strlen(s) : 0;
            if (n > width[c])
                width[c] = n;
        }
    }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            if (c + 1 < t->ncols)
                printf("%-*s  ", (int)width[c], s ? s : "");
            else
                printf("%s\n", s ? s : "");
        }
    }
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    t->cells = NULL;
    t->nrows = t->cap = 0;
}

static double now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fmt_age(char *buf, size_t size, double seconds)
{
    long s = seconds > 0 ? (long)seconds : 0;
    if (s < 60)
        snprintf(buf, size, "%lds", s);
    else if (s < 3600)
        snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(buf, size, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
}

static void hex(const ProtobufCBinaryData *b, char *out, size_t size)
{
    static const char digits[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < b->len && o + 2 < size; i++) {
        out[o++] = digits[b->data[i] >> 4];
        out[o++] = digits[b->data[i] & 15];
    }
    out[o] = '\0';
}

/* The loader's figures: progress, settings and per-stage times and rates. */
static void load_json(json_t *o, const Wbproto__ModelInfo *m)
{
    json_object_set_new(o, "loaded_bytes", json_integer((json_int_t)m->loaded_bytes));
    if (m->load_mode && m->load_mode[0])
        json_object_set_new(o, "load_mode", json_string(m->load_mode));
    json_object_set_new(o, "read_threads", json_integer(m->read_threads));
    json_object_set_new(o, "staging_buffer_bytes",
                        json_integer((json_int_t)m->staging_buffer_bytes));
    json_object_set_new(o, "staging_buffers", json_integer(m->staging_buffers));
    json_t *st = json_object();
    static const char *const names[] = {"read", "hash", "copy"};
    const double secs[] = {m->read_seconds, m->hash_seconds, m->copy_seconds};
    const double rates[] = {m->read_gbps, m->hash_gbps, m->copy_gbps};
    for (int i = 0; i < 3; i++) {
        json_t *one = json_object();
        json_object_set_new(one, "seconds", json_real(secs[i]));
        json_object_set_new(one, "gbps", json_real(rates[i]));
        json_object_set_new(st, names[i], one);
    }
    json_object_set_new(o, "load_stages", st);
    json_object_set_new(o, "wait_seconds", json_real(m->wait_seconds));
    json_object_set_new(o, "open_seconds", json_real(m->open_seconds));
    json_object_set_new(o, "alloc_seconds", json_real(m->alloc_seconds));
    json_object_set_new(o, "register_seconds", json_real(m->register_seconds));
}

/* One line per load for people: how each stage did. */
static void print_stages(const Wbproto__ModelInfo *m)
{
    if (!m->load_mode || !m->load_mode[0])
        return;
    printf("load: %s, %u thread%s", m->load_mode, m->read_threads, m->read_threads == 1 ? "" : "s");
    if (m->staging_buffers)
        printf(", %u x %.1f MiB pinned staging", m->staging_buffers,
               (double)m->staging_buffer_bytes / (1024.0 * 1024.0));
    printf("; read %.2f GB/s, hash %.2f GB/s", m->read_gbps, m->hash_gbps);
    if (m->copy_seconds > 0)
        printf(", copy %.2f GB/s", m->copy_gbps);
    printf("\n");
}

static json_t *model_json(const Wbproto__ModelInfo *m)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(m->name));
    json_object_set_new(o, "path", json_string(m->path));
    json_object_set_new(o, "state", json_string(wb__model_state_name(m->state)));
    json_object_set_new(o, "backend", json_string(wb__backend_name(m->backend)));
    json_object_set_new(o, "device", json_integer(m->device));
    json_object_set_new(o, "tensors", json_integer(m->tensors));
    json_object_set_new(o, "bytes", json_integer((json_int_t)m->bytes));
    json_object_set_new(o, "slab_bytes", json_integer((json_int_t)m->slab_bytes));
    json_object_set_new(o, "leases", json_integer(m->leases));
    json_object_set_new(o, "load_seconds", json_real(m->load_seconds));
    json_object_set_new(o, "load_gbps", json_real(m->load_gbps));
    load_json(o, m);
    if (m->error && m->error[0])
        json_object_set_new(o, "error", json_string(m->error));
    return o;
}

static void model_header(table *t)
{
    table_add(t, "NAME", "STATE", "BACKEND", "DEVICE", "TENSORS", "BYTES", "LEASES", "LOAD_S",
              "GB/S");
}

static void model_row(table *t, const Wbproto__ModelInfo *m)
{
    char dev[16], tensors[16], bytes[32], leases[16], secs[32], gbps[32];
    snprintf(dev, sizeof dev, "%d", m->device);
    snprintf(tensors, sizeof tensors, "%u", m->tensors);
    snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)m->bytes);
    snprintf(leases, sizeof leases, "%u", m->leases);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING) {
        /* While loading, LOAD_S shows how far it got. */
        if (m->bytes)
            snprintf(secs, sizeof secs, "%.0f%%",
                     100.0 * (double)m->loaded_bytes / (double)m->bytes);
        else
            snprintf(secs, sizeof secs, "-");
        snprintf(gbps, sizeof gbps, "-");
    } else {
        snprintf(secs, sizeof secs, "%.3f", m->load_seconds);
        snprintf(gbps, sizeof gbps, "%.2f", m->load_gbps);
    }
    table_add(t, m->name, wb__model_state_name(m->state), wb__backend_name(m->backend), dev,
              tensors, bytes, leases, secs, gbps);
}

int wbctl_models(const wbctl_globals *g, int argc, char **argv)
{
    int json;
    int rc = parse_args(argc, argv, "models [--json]",
                        "Lists the broker's models: state, backend, size, leases and how fast "
                        "each was loaded.",
                        0, NULL, &json, NULL);
    if (rc >= 0)
        return rc;
    Wbproto__ListModelsRequest body = WBPROTO__LIST_MODELS_REQUEST__INIT;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LIST_MODELS;
    req.list_models = &body;
    Wbproto__Reply *rep;
    if ((rc = call(g, "models", &req, g->timeout_ms, &rep)) >= 0)
        return rc;
    const Wbproto__ListModelsReply *lm = rep->list_models;
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < lm->n_models; i++)
            json_array_append_new(arr, model_json(lm->models[i]));
        rc = print_json(arr);
    } else {
        table t = {.ncols = 9};
        model_header(&t);
        for (size_t i = 0; i < lm->n_models; i++)
            model_row(&t, lm->models[i]);
        table_print(&t);
        rc = WBCTL_EXIT_OK;
    }
    wb__reply_free(&rep);
    return rc;
}

/* How a container's constants were bound (ContainerRecord/ContainerInfo). */
static json_t *bindings_json(uint32_t leased, uint32_t aliased, uint32_t caller, uint32_t package,
                             uint32_t folded, uint32_t unbound, uint64_t package_bytes)
{
    json_t *o = json_object();
    json_object_set_new(o, "leased", json_integer(leased));
    json_object_set_new(o, "aliased", json_integer(aliased));
    json_object_set_new(o, "caller", json_integer(caller));
    json_object_set_new(o, "package", json_integer(package));
    json_object_set_new(o, "folded", json_integer(folded));
    json_object_set_new(o, "unbound", json_integer(unbound));
    json_object_set_new(o, "package_bytes", json_integer((json_int_t)package_bytes));
    return o;
}

static json_t *record_json(const Wbproto__ContainerRecord *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "container_id", json_integer((json_int_t)r->container_id));
    json_object_set_new(o, "aoti_api", jstr(r->aoti_api));
    json_object_set_new(o, "pinned_async_copy", json_boolean(r->pinned_async_copy));
    json_object_set_new(o, "bound_bytes", json_integer((json_int_t)r->bound_bytes));
    json_object_set_new(o, "bound_tensors", json_integer(r->bound_tensors));
    json_object_set_new(o, "folded_bytes", json_integer((json_int_t)r->folded_bytes));
    json_object_set_new(o, "embedded_bytes", json_integer((json_int_t)r->embedded_bytes));
    json_object_set_new(o, "bindings",
                        bindings_json(r->leased_constants, r->aliased_constants,
                                      r->caller_constants, r->package_constants,
                                      r->folded_constants, r->unbound_constants, r->package_bytes));
    json_object_set_new(o, "created_at", json_real(r->created_at));
    json_object_set_new(o, "model_path", jstr(r->model_path));
    return o;
}

/* Pages of a listing are fetched until the broker says there are no more;
 * a page that does not move forward ends it. */
#define MAX_PAGES 100000

typedef struct pages {
    Wbproto__Reply **reps;
    size_t n;
} pages;

static void pages_free(pages *p)
{
    for (size_t i = 0; i < p->n; i++)
        wb__reply_free(&p->reps[i]);
    free(p->reps);
    p->reps = NULL;
    p->n = 0;
}

/* Returns -1 with every page in *out, else the exit code. */
static int fetch_pages(const wbctl_globals *g, const char *op, int containers, pages *out)
{
    uint32_t offset = 0;
    out->reps = NULL;
    out->n = 0;
    for (size_t k = 0; k < MAX_PAGES; k++) {
        Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
        Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
        Wbproto__Request req = WBPROTO__REQUEST__INIT;
        if (containers) {
            lc.offset = offset;
            req.body_case = WBPROTO__REQUEST__BODY_LIST_CONTAINERS;
            req.list_containers = &lc;
        } else {
            ll.offset = offset;
            req.body_case = WBPROTO__REQUEST__BODY_LIST_LEASES;
            req.list_leases = &ll;
        }
        Wbproto__Reply *rep;
        int rc = call(g, op, &req, g->timeout_ms, &rep);
        if (rc >= 0) {
            pages_free(out);
            return rc;
        }
        Wbproto__Reply **reps = realloc(out->reps, (out->n + 1) * sizeof *reps);
        if (!reps) {
            wb__reply_free(&rep);
            pages_free(out);
            fprintf(stderr, "wbctl: out of memory\n");
            return 1;
        }
        out->reps = reps;
        out->reps[out->n++] = rep;
        uint32_t next =
            containers ? rep->list_containers->next_offset : rep->list_leases->next_offset;
        if (next <= offset)
            break;
        offset = next;
    }
    return -1;
}

int wbctl_leases(const wbctl_globals *g, int argc, char **argv)
{
    int json;
    int rc = parse_args(argc, argv, "leases [--json]",
                        "Lists the leases the broker has granted: owner process, state, "
                        "containers,\nthe tensors and bytes they bind (shared), age and time "
                        "since the last heartbeat.",
                        0, NULL, &json, NULL);
    if (rc >= 0)
        return rc;
    pages pg;
    if ((rc = fetch_pages(g, "leases", 0, &pg)) >= 0)
        return rc;
    double now = now_unix();
    json_t *arr = json ? json_array() : NULL;
    table t = {.ncols = 12};
    if (!json)
        table_add(&t, "ID", "MODEL", "PID", "PROCESS", "UID", "STATE", "CONTAINERS", "SHARED",
                  "SLABS", "BYTES", "AGE", "HEARTBEAT");
    for (size_t page = 0; page < pg.n; page++) {
        const Wbproto__ListLeasesReply *ll = pg.reps[page]->list_leases;
        for (size_t i = 0; i < ll->n_leases; i++) {
            const Wbproto__LeaseInfo *l = ll->leases[i];
            char id[2 * WB_LEASE_ID_LEN + 1];
            hex(&l->id, id, sizeof id);
            double age = now - l->granted_at;
            double since = now - l->last_heartbeat;
            if (age < 0)
                age = 0;
            if (since < 0)
                since = 0;
            uint64_t shared_bytes = 0, shared_tensors = 0;
            for (size_t k = 0; k < l->n_container_records; k++) {
                shared_bytes += l->container_records[k]->bound_bytes;
                shared_tensors += l->container_records[k]->bound_tensors;
            }
            if (json) {
                json_t *o = json_object();
                json_object_set_new(o, "id", json_string(id));
                json_object_set_new(o, "model", jstr(l->model));
                json_object_set_new(o, "pid", json_integer(l->pid));
                json_object_set_new(o, "process", jstr(l->process_name));
                json_object_set_new(o, "uid", json_integer(l->uid));
                json_object_set_new(o, "gid", json_integer(l->gid));
                json_object_set_new(o, "state", json_string(wb__lease_state_name(l->state)));
                json_object_set_new(o, "containers", json_integer(l->containers));
                json_object_set_new(o, "slabs", json_integer(l->slabs));
                json_object_set_new(o, "bytes", json_integer((json_int_t)l->bytes));
                json_object_set_new(o, "granted_at", json_real(l->granted_at));
                json_object_set_new(o, "last_heartbeat", json_real(l->last_heartbeat));
                json_object_set_new(o, "age_seconds", json_real(age));
                json_t *recs = json_array();
                for (size_t k = 0; k < l->n_container_records; k++)
                    json_array_append_new(recs, record_json(l->container_records[k]));
                json_object_set_new(o, "container_records", recs);
                json_object_set_new(o, "container_records_total",
                                    json_integer(l->container_records_total));
                json_object_set_new(o, "shared_buffers", json_integer((json_int_t)shared_tensors));
                json_object_set_new(o, "shared_bytes", json_integer((json_int_t)shared_bytes));
                json_array_append_new(arr, o);
                continue;
            }
            char pid[16], uid[16], containers[16], slabs[16], bytes[32], agebuf[32], hb[32];
            char shared[64];
            /* Bound by containers, counted once per container: two containers
             * binding the same tensor share one buffer but count twice here. */
            snprintf(shared, sizeof shared, "%llu (%llu B)", (unsigned long long)shared_tensors,
                     (unsigned long long)shared_bytes);
            snprintf(pid, sizeof pid, "%u", l->pid);
            snprintf(uid, sizeof uid, "%u", l->uid);
            snprintf(containers, sizeof containers, "%u", l->containers);
            snprintf(slabs, sizeof slabs, "%u", l->slabs);
            snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)l->bytes);
            fmt_age(agebuf, sizeof agebuf, age);
            snprintf(hb, sizeof hb, "%.1fs ago", since);
            id[8] = '\0';
            table_add(&t, id, l->model, pid, l->process_name, uid, wb__lease_state_name(l->state),
                      containers, shared, slabs, bytes, agebuf, hb);
        }
    }
    pages_free(&pg);
    if (json)
        return print_json(arr);
    table_print(&t);
    return WBCTL_EXIT_OK;
}

int wbctl_containers(const wbctl_globals *g, int argc, char **argv)
{
    int json;
    int rc = parse_args(argc, argv, "containers [--json]",
                        "Lists the AOTI model containers that clients built on their leases, as "
                        "their\nlast heartbeats reported them: the AOTI entry point used, "
                        "whether pinned async\nconstant copy was on, bytes bound from each lease "
                        "(shared), bytes built by\nconstant folding (private to the "
                        "container) and constants the model loaded itself.",
                        0, NULL, &json, NULL);
    if (rc >= 0)
        return rc;
    pages pg;
    if ((rc = fetch_pages(g, "containers", 1, &pg)) >= 0)
        return rc;
    double now = now_unix();
    json_t *arr = json ? json_array() : NULL;
    table t = {.ncols = 11};
    if (!json)
        table_add(&t, "PID", "PROCESS", "ID", "API", "PINNED", "LEASES", "SHARED_BYTES",
                  "FOLDED_BYTES", "BOUND(L/A/C/P/F/U)", "AGE", "MODEL");
    for (size_t page = 0; page < pg.n; page++) {
        const Wbproto__ListContainersReply *lc = pg.reps[page]->list_containers;
        for (size_t i = 0; i < lc->n_containers; i++) {
            const Wbproto__ContainerInfo *c = lc->containers[i];
            uint64_t shared = 0;
            for (size_t k = 0; k < c->n_leases; k++)
                shared += c->leases[k]->bound_bytes;
            if (json) {
                json_t *o = json_object();
                json_object_set_new(o, "pid", json_integer(c->pid));
                json_object_set_new(o, "process", jstr(c->process_name));
                json_object_set_new(o, "container_id", json_integer((json_int_t)c->container_id));
                json_object_set_new(o, "aoti_api", jstr(c->aoti_api));
                json_object_set_new(o, "pinned_async_copy", json_boolean(c->pinned_async_copy));
                json_object_set_new(o, "shared_bytes", json_integer((json_int_t)shared));
                json_object_set_new(o, "folded_bytes", json_integer((json_int_t)c->folded_bytes));
                json_object_set_new(o, "embedded_bytes",
                                    json_integer((json_int_t)c->embedded_bytes));
                json_object_set_new(o, "bindings",
                                    bindings_json(c->leased_constants, c->aliased_constants,
                                                  c->caller_constants, c->package_constants,
                                                  c->folded_constants, c->unbound_constants,
                                                  c->package_bytes));
                json_object_set_new(o, "created_at", json_real(c->created_at));
                json_object_set_new(o, "model_path", jstr(c->model_path));
                json_t *ls = json_array();
                for (size_t k = 0; k < c->n_leases; k++) {
                    const Wbproto__ContainerLease *cl = c->leases[k];
                    char id[2 * WB_LEASE_ID_LEN + 1];
                    hex(&cl->lease_id, id, sizeof id);
                    json_t *lo = json_object();
                    json_object_set_new(lo, "lease_id", json_string(id));
                    json_object_set_new(lo, "model", jstr(cl->model));
                    json_object_set_new(lo, "bound_bytes",
                                        json_integer((json_int_t)cl->bound_bytes));
                    json_object_set_new(lo, "bound_tensors", json_integer(cl->bound_tensors));
                    json_array_append_new(ls, lo);
                }
                json_object_set_new(o, "leases", ls);
                json_object_set_new(o, "leases_total", json_integer(c->leases_total));
                json_array_append_new(arr, o);
                continue;
            }
            char pid[16], id[24], leases[256] = "", shared_s[32], folded[32], agebuf[32],
                binds[96];
            snprintf(pid, sizeof pid, "%u", c->pid);
            snprintf(id, sizeof id, "%llu", (unsigned long long)c->container_id);
            size_t used = 0;
            for (size_t k = 0; k < c->n_leases && used < sizeof leases; k++) {
                int w = snprintf(leases + used, sizeof leases - used, "%s%s", k ? "," : "",
                                 c->leases[k]->model);
                if (w < 0)
                    break;
                used += (size_t)w;
            }
            snprintf(shared_s, sizeof shared_s, "%llu", (unsigned long long)shared);
            snprintf(folded, sizeof folded, "%llu", (unsigned long long)c->folded_bytes);
            fmt_age(agebuf, sizeof agebuf, now - c->created_at);
            if (c->leases_total > c->n_leases && used < sizeof leases)
                snprintf(leases + used, sizeof leases - used, ",+%u more",
                         c->leases_total - (uint32_t)c->n_leases);
            /* leased/aliased/caller/package/folded/unbound constants */
            snprintf(binds, sizeof binds, "%u/%u/%u/%u/%u/%u", c->leased_constants,
                     c->aliased_constants, c->caller_constants, c->package_constants,
                     c->folded_constants, c->unbound_constants);
            table_add(&t, pid, c->process_name, id, c->aoti_api,
                      c->pinned_async_copy ? "on" : "off", leases, shared_s, folded, binds,
                      agebuf, c->model_path);
        }
    }
    pages_free(&pg);
    if (json)
        return print_json(arr);
    table_print(&t);
    return WBCTL_EXIT_OK;
}

int wbctl_load(const wbctl_globals *g, int argc, char **argv)
{
    static const char *const names[] = {"NAME", "PATH"};
    int json;
    char *pos[2];
    int rc = parse_args(argc, argv, "load [--json] NAME PATH",
                        "Loads the safetensors checkpoint PATH (a file, a directory or an "
                        "index) as model NAME\nand waits until the broker has finished "
                        "(up to 10 minutes unless --timeout-ms is given).",
                        2, names, &json, pos);
    if (rc >= 0)
        return rc;
    /* The broker resolves paths from its own working directory. */
    char abs[PATH_MAX];
    if (!realpath(pos[1], abs)) {
        int n = pos[1][0] == '/' ? snprintf(abs, sizeof abs, "%s", pos[1]) : -1;
        if (n < 0) {
            char cwd[PATH_MAX];
            if (getcwd(cwd, sizeof cwd))
                n = snprintf(abs, sizeof abs, "%s/%s", cwd, pos[1]);
        }
        if (n < 0 || (size_t)n >= sizeof abs) {
            fprintf(stderr, "wbctl load: cannot make %s absolute: %s\n", pos[1], strerror(errno));
            return WBCTL_EXIT_USAGE;
        }
    }
    Wbproto__LoadRequest body = WBPROTO__LOAD_REQUEST__INIT;
    body.name = pos[0];
    body.path = abs;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &body;
    Wbproto__Reply *rep;
    /* On a terminal, a progress bar while the broker loads. */
    wbctl_progress *bar = json ? NULL : wbctl_progress_start(g->socket_path, pos[0]);
    rc = call(g, "load", &req, g->timeout_ms > 0 ? g->timeout_ms : LOAD_TIMEOUT_MS, &rep);
    wbctl_progress_stop(&bar);
    if (rc >= 0)
        return rc;
    const Wbproto__ModelInfo *m = rep->load->model;
    if (!m) {
        fprintf(stderr, "wbctl: load: the broker's reply carries no model\n");
        rc = WBCTL_EXIT_UNAVAILABLE;
    } else if (json) {
        rc = print_json(model_json(m));
    } else {
        table t = {.ncols = 9};
        model_header(&t);
        model_row(&t, m);
        table_print(&t);
        print_stages(m);
        rc = WBCTL_EXIT_OK;
    }
    wb__reply_free(&rep);
    return rc;
}

int wbctl_unload(const wbctl_globals *g, int argc, char **argv)
{
    static const char *const names[] = {"NAME"};
    int json;
    char *pos[1];
    int rc = parse_args(argc, argv, "unload [--json] NAME",
                        "Unloads model NAME: it is freed at once when no lease holds it, "
                        "else it drains\n(new leases are refused) and is freed when the last "
                        "lease ends.",
                        1, names, &json, pos);
    if (rc >= 0)
        return rc;
    Wbproto__UnloadRequest body = WBPROTO__UNLOAD_REQUEST__INIT;
    body.name = pos[0];
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    req.unload = &body;
    Wbproto__Reply *rep;
    if ((rc = call(g, "unload", &req, g->timeout_ms, &rep)) >= 0)
        return rc;
    const Wbproto__ModelInfo *m = rep->unload->model;
    if (!m) {
        fprintf(stderr, "wbctl: unload: the broker's reply carries no model\n");
        rc = WBCTL_EXIT_UNAVAILABLE;
    } else if (json) {
        rc = print_json(model_json(m));
    } else {
        if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
            printf("draining (%u lease%s)\n", m->leases, m->leases == 1 ? "" : "s");
        else
            printf("%s\n", wb__model_state_name(m->state));
        rc = WBCTL_EXIT_OK;
    }
    wb__reply_free(&rep);
    return rc;
}

/* Walks StatsReply through its descriptor, so that every field wb.proto has
 * is printed under its own name, including fields added later. */
int wbctl_stats(const wbctl_globals *g, int argc, char **argv)
{
    int json;
    int rc = parse_args(argc, argv, "stats [--json]",
                        "Prints the broker's counters: requests, leases granted, released and "
                        "reclaimed, models and load totals.",
                        0, NULL, &json, NULL);
    if (rc >= 0)
        return rc;
    Wbproto__StatsRequest body = WBPROTO__STATS_REQUEST__INIT;
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_STATS;
    req.stats = &body;
    Wbproto__Reply *rep;
    if ((rc = call(g, "stats", &req, g->timeout_ms, &rep)) >= 0)
        return rc;
    const Wbproto__StatsReply *st = rep->stats;
    const ProtobufCMessageDescriptor *d = &wbproto__stats_reply__descriptor;
    json_t *obj = json ? json_object() : NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *p = (const char *)st + f->offset;
        double dv = 0;
        unsigned long long uv = 0;
        int is_double = 0;
        switch (f->type) {
        case PROTOBUF_C_TYPE_DOUBLE:
            memcpy(&dv, p, sizeof dv);
            is_double = 1;
            break;
        case PROTOBUF_C_TYPE_UINT64: {
            uint64_t v;
            memcpy(&v, p, sizeof v);
            uv = v;
            break;
        }
        case PROTOBUF_C_TYPE_UINT32: {
            uint32_t v;
            memcpy(&v, p, sizeof v);
            uv = v;
            break;
        }
        default:
            continue;
        }
        if (json)
            json_object_set_new(obj, f->name,
                                is_double ? json_real(dv) : json_integer((json_int_t)uv));
        else if (is_double)
            printf("%s: %.3f\n", f->name, dv);
        else
            printf("%s: %llu\n", f->name, uv);
    }
    wb__reply_free(&rep);
    return json ? print_json(obj) : WBCTL_EXIT_OK;
}
