/* wbctl's listings: models, leases, containers and the broker's counters. */
#include "wbctl.h"

#include "clock.h"
#include "alloc.h"
#include "fdchan_wire.h"
#include "text.h"

#include "wbctl_call.h"
#include "wbctl_model.h"
#include "wbctl_out.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pages of a listing are fetched until the broker says there are no more;
 * a page that does not move forward ends it. Models and stats come in one. */
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

/* The offset of the page after `rep`; 0 when it was the last. */
static uint32_t next_offset(const Wbproto__Reply *rep)
{
    switch (rep->body_case) {
    case WBPROTO__REPLY__BODY_LIST_LEASES:
        return rep->list_leases->next_offset;
    case WBPROTO__REPLY__BODY_LIST_CONTAINERS:
        return rep->list_containers->next_offset;
    default:
        return 0;
    }
}

/* Parses a listing's options (spec) into *args and fetches every page of
 * request `body`. Returns -1 with the pages in *out, else the exit code. */
static int list_fetch(const wbctl_globals *g, int argc, char **argv, const char *op,
                      const wbctl_spec *spec, Wbproto__Request__BodyCase body, wbctl_args *args,
                      pages *out)
{
    out->reps = NULL;
    out->n = 0;
    int rc = wbctl_parse(argc, argv, spec, args);
    if (rc >= 0)
        return rc;
    /* One connection for every page: a connection is a ZeroMQ context
     * (two threads) and a handshake. */
    wb__rpc rpc;
    rc = wbctl_open(g, g->timeout_ms, &rpc);
    if (rc >= 0)
        return rc;
    uint32_t offset = 0;
    for (size_t k = 0; k < MAX_PAGES; k++) {
        Wbproto__ListLeasesRequest ll = WBPROTO__LIST_LEASES_REQUEST__INIT;
        Wbproto__ListContainersRequest lc = WBPROTO__LIST_CONTAINERS_REQUEST__INIT;
        Wbproto__ListModelsRequest lm = WBPROTO__LIST_MODELS_REQUEST__INIT;
        Wbproto__StatsRequest sr = WBPROTO__STATS_REQUEST__INIT;
        Wbproto__Request req = WBPROTO__REQUEST__INIT;
        req.body_case = body;
        ll.offset = lc.offset = offset;
        if (body == WBPROTO__REQUEST__BODY_LIST_LEASES)
            req.list_leases = &ll;
        else if (body == WBPROTO__REQUEST__BODY_LIST_CONTAINERS)
            req.list_containers = &lc;
        else if (body == WBPROTO__REQUEST__BODY_LIST_MODELS)
            req.list_models = &lm;
        else
            req.stats = &sr;
        Wbproto__Reply *rep;
        rc = wbctl_exchange(&rpc, op, &req, 0, &rep);
        if (rc >= 0) {
            wb__rpc_close(&rpc);
            pages_free(out);
            return rc;
        }
        Wbproto__Reply **reps = wb__realloc(out->reps, (out->n + 1) * sizeof *reps);
        if (!reps) {
            wb__reply_free(&rep);
            wb__rpc_close(&rpc);
            pages_free(out);
            fprintf(stderr, "wbctl: out of memory\n");
            return 1;
        }
        out->reps = reps;
        out->reps[out->n++] = rep;
        uint32_t next = next_offset(rep);
        if (next <= offset)
            break;
        offset = next;
    }
    wb__rpc_close(&rpc);
    return -1;
}

/* Whether a row of model `name` passes the MODEL filter (NULL: all do). */
static int wanted(const char *filter, const char *name)
{
    return !filter || (name && strcmp(filter, name) == 0);
}

/* Ends a listing: frees its pages and prints the JSON array or the table. */
static int list_print(pages *pg, int json, wbctl_json_array *arr, wbctl_table *t)
{
    pages_free(pg);
    if (json)
        return wbctl_json_array_print(arr, stdout);
    wbctl_table_print(t);
    return WBCTL_EXIT_OK;
}

/* How well a version stands for its name in `wbctl models --json` (the
 * object's top-level fields): the current one, else one loading, else the
 * highest draining, else the failed record. */
static int stand_rank(const Wbproto__ModelInfo *m)
{
    return wb__version_rank(m->state, m->current);
}

/* The versions of the name of models[i], when i is its first: their
 * indexes in version order (at most `cap`), else 0. */
static size_t name_versions(const Wbproto__ListModelsReply *lm, size_t i, size_t *idx, size_t cap)
{
    const char *name = lm->models[i]->name;
    for (size_t j = 0; j < i; j++) {
        if (strcmp(lm->models[j]->name, name) == 0)
            return 0;
    }
    size_t n = 0;
    for (size_t j = i; j < lm->n_models && n < cap; j++) {
        if (strcmp(lm->models[j]->name, name) != 0)
            continue;
        size_t k = n++;
        while (k > 0 && lm->models[idx[k - 1]]->version > lm->models[j]->version) {
            idx[k] = idx[k - 1];
            k--;
        }
        idx[k] = j;
    }
    return n;
}

/* One object per name: the fields of the version that stands for it (as
 * before versions existed), and "versions" with each version's own. */
static json_t *name_json(const Wbproto__ListModelsReply *lm, const size_t *idx, size_t n)
{
    const Wbproto__ModelInfo *best = lm->models[idx[0]];
    for (size_t k = 1; k < n; k++) {
        const Wbproto__ModelInfo *m = lm->models[idx[k]];
        int r = stand_rank(m), br = stand_rank(best);
        if (r > br || (r == br && m->version > best->version))
            best = m;
    }
    json_t *o = wbctl_model_json(best);
    json_t *vs = json_array();
    for (size_t k = 0; k < n; k++)
        json_array_append_new(vs, wbctl_version_json(lm->models[idx[k]]));
    json_object_set_new(o, "versions", vs);
    return o;
}

/* Versions of one name listed at most: --max-versions and a failed record. */
#define NAME_VERSIONS 128

int wbctl_models(const wbctl_globals *g, int argc, char **argv)
{
    static const wbctl_spec spec = {
        .synopsis = "models [MODEL] [-o wide] [--json]",
        .about = "Lists the broker's models, one row per version: its number, its state\n"
                 "(current: the version new leases get; loading, with how far it got;\n"
                 "draining: no longer current, freed at its last lease; failed; a version\n"
                 "the device memory budget moved off its device: its tier, host, evicted,\n"
                 "moving, restoring or reloading), backend, device, tensors, size, leases,\n"
                 "and how clients reach the slab (SLAB) with what access; -o wide adds its\n"
                 "TIER (device when on it), how long each load took, how fast, and the path.\n"
                 "A model on devices has one row per device. --json gives one object per\n"
                 "model with its \"versions\".",
        .flags = WBCTL_TAKES_WIDE | WBCTL_TAKES_MODEL,
    };
    wbctl_args args;
    pages pg;
    int rc =
        list_fetch(g, argc, argv, "models", &spec, WBPROTO__REQUEST__BODY_LIST_MODELS, &args, &pg);
    if (rc >= 0)
        return rc;
    int json = args.output == WBCTL_OUT_JSON;
    const Wbproto__ListModelsReply *lm = pg.reps[0]->list_models;
    wbctl_json_array arr;
    wbctl_json_array_init(&arr);
    wbctl_table t = {.ncols = WBCTL_MODEL_COLUMNS, .wide = args.output == WBCTL_OUT_WIDE};
    if (!json)
        wbctl_model_header(&t);
    size_t idx[NAME_VERSIONS];
    for (size_t i = 0; i < lm->n_models; i++) {
        if (!wanted(args.model, lm->models[i]->name))
            continue;
        size_t n = name_versions(lm, i, idx, NAME_VERSIONS);
        if (n == 0)
            continue;
        if (json) {
            wbctl_json_array_add(&arr, name_json(lm, idx, n));
            continue;
        }
        for (size_t k = 0; k < n; k++)
            wbctl_model_row(&t, lm->models[idx[k]]);
    }
    if (json)
        return list_print(&pg, json, &arr, &t);
    wbctl_table_print(&t);
    /* Why a copy failed, under the table (the others serve). */
    for (size_t i = 0; i < lm->n_models; i++) {
        if (wanted(args.model, lm->models[i]->name))
            wbctl_model_failures(lm->models[i]);
    }
    pages_free(&pg);
    return WBCTL_EXIT_OK;
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
    json_object_set_new(o, "aoti_api", wbctl_jstr(r->aoti_api));
    json_object_set_new(o, "pinned_async_copy", json_boolean(r->pinned_async_copy));
    json_object_set_new(o, "bound_bytes", json_integer((json_int_t)r->bound_bytes));
    json_object_set_new(o, "bound_tensors", json_integer(r->bound_tensors));
    json_object_set_new(o, "folded_bytes", json_integer((json_int_t)r->folded_bytes));
    json_object_set_new(o, "embedded_bytes", json_integer((json_int_t)r->embedded_bytes));
    json_object_set_new(o, "bindings",
                        bindings_json(r->leased_constants, r->aliased_constants,
                                      r->caller_constants, r->package_constants,
                                      r->folded_constants, r->unbound_constants, r->package_bytes));
    json_object_set_new(o, "created_at", json_real(wbctl_round_time(r->created_at)));
    json_object_set_new(o, "model_path", wbctl_jstr(r->model_path));
    return o;
}

/* One lease as `wbctl leases --json` prints it, in row r. */
static json_t *lease_json(wbctl_jrow *r, const Wbproto__LeaseInfo *l, const char *id, double age,
                          uint64_t shared_tensors, uint64_t shared_bytes)
{
    char session[24];
    json_t *recs = json_array();
    for (size_t k = 0; recs && k < l->n_container_records; k++) {
        if (json_array_append_new(recs, record_json(l->container_records[k])) != 0) {
            json_decref(recs);
            recs = NULL;
        }
    }
    /* A holder known by its session: "session" after "pid" (wbctl_json_pid). */
    int is_session = WB_IS_SESSION_ID(l->pid);
    wbctl_fmt_pid(session, sizeof session, l->pid);
    const wbctl_jfield f[] = {
        {"id", WBCTL_JSTR, .v.s = id},
        {"model", WBCTL_JSTR, .v.s = l->model},
        {"version", WBCTL_JINT, .v.i = l->version},
        {"pid", WBCTL_JINT, .v.i = l->pid},
        {"session", WBCTL_JSTR, !is_session, .v.s = session},
        {"process", WBCTL_JSTR, .v.s = l->process_name},
        {"uid", WBCTL_JINT, .v.i = l->uid},
        {"gid", WBCTL_JINT, .v.i = l->gid},
        {"state", WBCTL_JSTR, .v.s = wb__lease_state_name(l->state)},
        {"containers", WBCTL_JINT, .v.i = l->containers},
        {"slabs", WBCTL_JINT, .v.i = l->slabs},
        {"backend", WBCTL_JSTR, .v.s = wb__backend_name(l->backend)},
        {"transport", WBCTL_JSTR, .v.s = l->transport},
        {"access", WBCTL_JSTR, .v.s = l->access},
        {"device", WBCTL_JINT, .v.i = l->device},
        {"device_uuid", WBCTL_JSTR, .v.s = l->device_uuid},
        {"bytes", WBCTL_JINT, .v.i = (json_int_t)l->bytes},
        {"granted_at", WBCTL_JREAL, .v.d = wbctl_round_time(l->granted_at)},
        {"last_heartbeat", WBCTL_JREAL, .v.d = wbctl_round_time(l->last_heartbeat)},
        {"age_seconds", WBCTL_JREAL, .v.d = wbctl_round_secs(age)},
        {"container_records", WBCTL_JNEW, .v.j = recs},
        {"container_records_total", WBCTL_JINT, .v.i = l->container_records_total},
        {"shared_buffers", WBCTL_JINT, .v.i = (json_int_t)shared_tensors},
        {"shared_bytes", WBCTL_JINT, .v.i = (json_int_t)shared_bytes},
    };
    return wbctl_jrow_set(r, f, sizeof f / sizeof f[0]);
}

/* The leases table: the default view answers who holds which model, with
 * how many containers and shared buffers, in what state and since when;
 * -o wide adds the holder's ids, the slabs and bytes held, the last
 * heartbeat and how the slab is reached. */
static const wbctl_column lease_columns[] = {
    {"ID", 0},  {"MODEL", 0},     {"VERSION", 0},    {"PID", 0},    {"PROCESS", 0}, {"UID", 1},
    {"GID", 1}, {"STATE", 0},     {"CONTAINERS", 0}, {"SHARED", 0}, {"SLABS", 1},   {"SIZE", 1},
    {"AGE", 0}, {"HEARTBEAT", 1}, {"BACKEND", 1},    {"SLAB", 1},   {"ACCESS", 1},
};

int wbctl_leases(const wbctl_globals *g, int argc, char **argv)
{
    static const wbctl_spec spec = {
        .synopsis = "leases [MODEL] [-o wide] [--json]",
        .about = "Lists the leases the broker has granted: who holds each (pid and process),\n"
                 "the model and the version of it the lease keeps, its state, the containers built "
                 "on it and the tensors and bytes\n"
                 "they bind (SHARED), and its age; -o wide adds the holder's uid and gid, the\n"
                 "slabs and bytes held, the time since the last heartbeat, the backend, SLAB\n"
                 "and ACCESS.",
        .flags = WBCTL_TAKES_WIDE | WBCTL_TAKES_MODEL,
    };
    wbctl_args args;
    pages pg;
    int rc =
        list_fetch(g, argc, argv, "leases", &spec, WBPROTO__REQUEST__BODY_LIST_LEASES, &args, &pg);
    if (rc >= 0)
        return rc;
    int json = args.output == WBCTL_OUT_JSON;
    double now = wb__clock_wall();
    wbctl_json_array arr;
    wbctl_json_array_init(&arr);
    wbctl_jrow row = {0};
    wbctl_table t = {.wide = args.output == WBCTL_OUT_WIDE};
    if (!json)
        wbctl_table_columns(&t, lease_columns, sizeof lease_columns / sizeof lease_columns[0]);
    for (size_t page = 0; page < pg.n; page++) {
        const Wbproto__ListLeasesReply *ll = pg.reps[page]->list_leases;
        for (size_t i = 0; i < ll->n_leases; i++) {
            const Wbproto__LeaseInfo *l = ll->leases[i];
            if (!wanted(args.model, l->model))
                continue;
            char id[2 * WB_LEASE_ID_LEN + 1];
            wb__text_hex(id, sizeof id, l->id.data, l->id.len);
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
                wbctl_json_array_add(&arr,
                                     lease_json(&row, l, id, age, shared_tensors, shared_bytes));
                continue;
            }
            char pid[24], uid[16], gid[16], containers[16], slabs[16], bytes[32], agebuf[32];
            char hb[32], shared[64], shared_size[32], version[16];
            snprintf(version, sizeof version, "%u", l->version);
            /* Bound by containers, counted once per container: two containers
             * binding the same tensor share one buffer but count twice here. */
            snprintf(shared, sizeof shared, "%llu (%s)", (unsigned long long)shared_tensors,
                     wbctl_fmt_size(shared_size, sizeof shared_size, shared_bytes));
            wbctl_fmt_pid(pid, sizeof pid, l->pid);
            snprintf(uid, sizeof uid, "%u", l->uid);
            snprintf(gid, sizeof gid, "%u", l->gid);
            snprintf(containers, sizeof containers, "%u", l->containers);
            snprintf(slabs, sizeof slabs, "%u", l->slabs);
            wbctl_fmt_size(bytes, sizeof bytes, l->bytes);
            wbctl_fmt_age(agebuf, sizeof agebuf, age);
            snprintf(hb, sizeof hb, "%.1fs ago", since);
            id[8] = '\0';
            wbctl_table_add(&t, id, l->model, version, pid, l->process_name, uid, gid,
                            wb__lease_state_name(l->state), containers, shared, slabs, bytes,
                            agebuf, hb, wb__backend_name(l->backend),
                            l->transport && l->transport[0] ? l->transport : "-",
                            l->access && l->access[0] ? l->access : "-");
        }
    }
    wbctl_jrow_free(&row);
    return list_print(&pg, json, &arr, &t);
}

/* One container as `wbctl containers --json` prints it. */
static json_t *container_json(const Wbproto__ContainerInfo *c, uint64_t shared)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    wbctl_json_pid(o, c->pid);
    json_object_set_new(o, "process", wbctl_jstr(c->process_name));
    json_object_set_new(o, "container_id", json_integer((json_int_t)c->container_id));
    json_object_set_new(o, "aoti_api", wbctl_jstr(c->aoti_api));
    json_object_set_new(o, "pinned_async_copy", json_boolean(c->pinned_async_copy));
    json_object_set_new(o, "shared_bytes", json_integer((json_int_t)shared));
    json_object_set_new(o, "folded_bytes", json_integer((json_int_t)c->folded_bytes));
    json_object_set_new(o, "embedded_bytes", json_integer((json_int_t)c->embedded_bytes));
    json_object_set_new(o, "bindings",
                        bindings_json(c->leased_constants, c->aliased_constants,
                                      c->caller_constants, c->package_constants,
                                      c->folded_constants, c->unbound_constants, c->package_bytes));
    json_object_set_new(o, "created_at", json_real(wbctl_round_time(c->created_at)));
    json_object_set_new(o, "model_path", wbctl_jstr(c->model_path));
    json_t *ls = json_array();
    for (size_t k = 0; k < c->n_leases; k++) {
        const Wbproto__ContainerLease *cl = c->leases[k];
        char id[2 * WB_LEASE_ID_LEN + 1];
        wb__text_hex(id, sizeof id, cl->lease_id.data, cl->lease_id.len);
        json_t *lo = json_object();
        json_object_set_new(lo, "lease_id", json_string(id));
        json_object_set_new(lo, "model", wbctl_jstr(cl->model));
        json_object_set_new(lo, "version", json_integer(cl->version));
        json_object_set_new(lo, "bound_bytes", json_integer((json_int_t)cl->bound_bytes));
        json_object_set_new(lo, "bound_tensors", json_integer(cl->bound_tensors));
        json_array_append_new(ls, lo);
    }
    json_object_set_new(o, "leases", ls);
    json_object_set_new(o, "leases_total", json_integer(c->leases_total));
    json_object_set_new(o, "swaps", json_integer(c->swaps));
    json_object_set_new(o, "last_swap_ms", json_real(wbctl_round_secs(c->last_swap_ms)));
    return o;
}

/* Whether container c binds a lease of model `filter` (NULL: any). */
static int container_wanted(const char *filter, const Wbproto__ContainerInfo *c)
{
    for (size_t k = 0; filter && k < c->n_leases; k++) {
        if (wanted(filter, c->leases[k]->model))
            return 1;
    }
    return !filter;
}

/* The containers table: by default who built each, on which models, what it
 * shares and what it holds privately (folded constants), and its age;
 * -o wide adds the AOTI entry point, pinned async copy, how each constant
 * was bound and the package's path. */
static const wbctl_column container_columns[] = {
    {"PID", 0},    {"PROCESS", 0},   {"ID", 0},     {"API", 1},    {"PINNED", 1},
    {"MODELS", 0}, {"VERSION", 0},   {"SHARED", 0}, {"FOLDED", 0}, {"BOUND(L/A/C/P/F/U)", 1},
    {"SWAPS", 1},  {"LAST_SWAP", 1}, {"AGE", 0},    {"PATH", 1},
};

int wbctl_containers(const wbctl_globals *g, int argc, char **argv)
{
    static const wbctl_spec spec = {
        .synopsis = "containers [MODEL] [-o wide] [--json]",
        .about = "Lists the AOTI model containers that clients built on their leases, as their\n"
                 "last heartbeats reported them: the models of the leases each binds, the\n"
                 "bytes bound from them (SHARED), the bytes built by constant folding (FOLDED,\n"
                 "private to the container) and its age; -o wide adds the AOTI entry point\n"
                 "used, whether pinned async constant copy was on, how the constants were\n"
                 "bound (leased/aliased/caller/package/folded/unbound), the versions swapped\n"
                 "into it and how long the last swap took, and the package path. VERSION is\n"
                 "the version of each model it binds, in the order of MODELS.\n"
                 "MODEL keeps the containers that bind a lease of that model.",
        .flags = WBCTL_TAKES_WIDE | WBCTL_TAKES_MODEL,
    };
    wbctl_args args;
    pages pg;
    int rc = list_fetch(g, argc, argv, "containers", &spec, WBPROTO__REQUEST__BODY_LIST_CONTAINERS,
                        &args, &pg);
    if (rc >= 0)
        return rc;
    int json = args.output == WBCTL_OUT_JSON;
    double now = wb__clock_wall();
    wbctl_json_array arr;
    wbctl_json_array_init(&arr);
    wbctl_table t = {.wide = args.output == WBCTL_OUT_WIDE};
    if (!json)
        wbctl_table_columns(&t, container_columns,
                            sizeof container_columns / sizeof container_columns[0]);
    for (size_t page = 0; page < pg.n; page++) {
        const Wbproto__ListContainersReply *lc = pg.reps[page]->list_containers;
        for (size_t i = 0; i < lc->n_containers; i++) {
            const Wbproto__ContainerInfo *c = lc->containers[i];
            if (!container_wanted(args.model, c))
                continue;
            uint64_t shared = 0;
            for (size_t k = 0; k < c->n_leases; k++)
                shared += c->leases[k]->bound_bytes;
            if (json) {
                wbctl_json_array_add(&arr, container_json(c, shared));
                continue;
            }
            char pid[24], id[24], models[256] = "", shared_s[32], folded[32], agebuf[32], binds[96];
            char versions[128] = "", swaps[16], last_swap[32];
            size_t vused = 0;
            for (size_t k = 0; k < c->n_leases && vused < sizeof versions; k++) {
                int w = snprintf(versions + vused, sizeof versions - vused, "%s%u", k ? "," : "",
                                 c->leases[k]->version);
                if (w < 0)
                    break;
                vused += (size_t)w;
            }
            snprintf(swaps, sizeof swaps, "%u", c->swaps);
            if (c->swaps)
                snprintf(last_swap, sizeof last_swap, "%.1f ms", c->last_swap_ms);
            else
                snprintf(last_swap, sizeof last_swap, "-");
            wbctl_fmt_pid(pid, sizeof pid, c->pid);
            snprintf(id, sizeof id, "%llu", (unsigned long long)c->container_id);
            size_t used = 0;
            for (size_t k = 0; k < c->n_leases && used < sizeof models; k++) {
                int w = snprintf(models + used, sizeof models - used, "%s%s", k ? "," : "",
                                 c->leases[k]->model);
                if (w < 0)
                    break;
                used += (size_t)w;
            }
            wbctl_fmt_size(shared_s, sizeof shared_s, shared);
            wbctl_fmt_size(folded, sizeof folded, c->folded_bytes);
            /* A record without its creation time (0) has no age to show. */
            if (c->created_at > 0)
                wbctl_fmt_age(agebuf, sizeof agebuf, now - c->created_at);
            else
                snprintf(agebuf, sizeof agebuf, "-");
            if (c->leases_total > c->n_leases && used < sizeof models)
                snprintf(models + used, sizeof models - used, ",+%u more",
                         c->leases_total - (uint32_t)c->n_leases);
            /* leased/aliased/caller/package/folded/unbound constants */
            snprintf(binds, sizeof binds, "%u/%u/%u/%u/%u/%u", c->leased_constants,
                     c->aliased_constants, c->caller_constants, c->package_constants,
                     c->folded_constants, c->unbound_constants);
            wbctl_table_add(&t, pid, c->process_name, id, c->aoti_api,
                            c->pinned_async_copy ? "on" : "off", models, versions, shared_s, folded,
                            binds, swaps, last_swap, agebuf, c->model_path);
        }
    }
    return list_print(&pg, json, &arr, &t);
}

/* Walks StatsReply through its descriptor, so that every field wb.proto has
 * is printed under its own name, including fields added later. */
/* Whether name ends with suffix. */
static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcmp(name + n - k, suffix) == 0;
}

/* A counter of bytes, by the protocol's naming: shown as a size. */
static int is_bytes(const char *name)
{
    return ends_with(name, "_bytes") || strstr(name, "_bytes_") != NULL;
}

int wbctl_stats(const wbctl_globals *g, int argc, char **argv)
{
    static const wbctl_spec spec = {
        .synopsis = "stats [--json]",
        .about = "Prints the broker's counters: requests, leases granted, released and\n"
                 "reclaimed, models and load totals, the device memory budget and its host\n"
                 "tier (device_memory_budget and host_memory_budget, none when unset;\n"
                 "host_tier_bytes; moved_to_host, evicted, restores, reloads,\n"
                 "restore_failures), one 'name: value' a line (sizes in KiB, MiB, GiB...);\n"
                 "--json gives exact numbers under the same names (a budget not set: 0).",
    };
    wbctl_args args;
    pages pg;
    int rc = list_fetch(g, argc, argv, "stats", &spec, WBPROTO__REQUEST__BODY_STATS, &args, &pg);
    if (rc >= 0)
        return rc;
    int json = args.output == WBCTL_OUT_JSON;
    const Wbproto__StatsReply *st = pg.reps[0]->stats;
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
        char size[32];
        /* Every real the broker counts is seconds. */
        if (json)
            json_object_set_new(obj, f->name,
                                is_double ? json_real(wbctl_round_secs(dv))
                                          : json_integer((json_int_t)uv));
        else if (is_double)
            printf("%s: %.3f\n", f->name, dv);
        else if (ends_with(f->name, "_budget") && uv == 0)
            printf("%s: none\n", f->name); /* a budget of 0 is none */
        else if (is_bytes(f->name) || ends_with(f->name, "_budget"))
            printf("%s: %s\n", f->name, wbctl_fmt_size(size, sizeof size, uv));
        else
            printf("%s: %llu\n", f->name, uv);
    }
    pages_free(&pg);
    return json ? wbctl_print_json(obj) : WBCTL_EXIT_OK;
}
