/* wbctl's listings: models, leases, containers and the broker's counters. */
#include "wbctl.h"

#include "fdwire.h"

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

/* Parses a listing's options (--json, --help; no arguments) and fetches
 * every page of request `body`. Returns -1 with the pages in *out, else the
 * exit code. */
static int list_fetch(const wbctl_globals *g, int argc, char **argv, const char *op,
                      const char *synopsis, const char *about, Wbproto__Request__BodyCase body,
                      int *json, pages *out)
{
    out->reps = NULL;
    out->n = 0;
    int rc = wbctl_parse_args(argc, argv, synopsis, about, 0, NULL, json, NULL);
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
        Wbproto__Reply **reps = realloc(out->reps, (out->n + 1) * sizeof *reps);
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

/* Ends a listing: frees its pages and prints the JSON array or the table. */
static int list_print(pages *pg, int json, wbctl_json_array *arr, wbctl_table *t)
{
    pages_free(pg);
    if (json)
        return wbctl_json_array_print(arr, stdout);
    wbctl_table_print(t);
    return WBCTL_EXIT_OK;
}

int wbctl_models(const wbctl_globals *g, int argc, char **argv)
{
    int json;
    pages pg;
    int rc = list_fetch(g, argc, argv, "models", "models [--json]",
                        "Lists the broker's models: state, backend, size, leases and how fast "
                        "each was loaded; a model on devices has one row per device.",
                        WBPROTO__REQUEST__BODY_LIST_MODELS, &json, &pg);
    if (rc >= 0)
        return rc;
    const Wbproto__ListModelsReply *lm = pg.reps[0]->list_models;
    wbctl_json_array arr;
    wbctl_json_array_init(&arr);
    wbctl_table t = {.ncols = WBCTL_MODEL_COLUMNS};
    if (!json)
        wbctl_model_header(&t);
    for (size_t i = 0; i < lm->n_models; i++) {
        if (json)
            wbctl_json_array_add(&arr, wbctl_model_json(lm->models[i]));
        else
            wbctl_model_row(&t, lm->models[i]);
    }
    if (json)
        return list_print(&pg, json, &arr, &t);
    wbctl_table_print(&t);
    /* Why a copy failed, under the table (the others serve). */
    for (size_t i = 0; i < lm->n_models; i++)
        wbctl_model_failures(lm->models[i]);
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
    json_object_set_new(o, "created_at", json_real(r->created_at));
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
        {"granted_at", WBCTL_JREAL, .v.d = l->granted_at},
        {"last_heartbeat", WBCTL_JREAL, .v.d = l->last_heartbeat},
        {"age_seconds", WBCTL_JREAL, .v.d = age},
        {"container_records", WBCTL_JNEW, .v.j = recs},
        {"container_records_total", WBCTL_JINT, .v.i = l->container_records_total},
        {"shared_buffers", WBCTL_JINT, .v.i = (json_int_t)shared_tensors},
        {"shared_bytes", WBCTL_JINT, .v.i = (json_int_t)shared_bytes},
    };
    return wbctl_jrow_set(r, f, sizeof f / sizeof f[0]);
}

int wbctl_leases(const wbctl_globals *g, int argc, char **argv)
{
    int json;
    pages pg;
    int rc = list_fetch(g, argc, argv, "leases", "leases [--json]",
                        "Lists the leases the broker has granted: owner process, state, "
                        "containers,\nthe tensors and bytes they bind (shared), age and time "
                        "since the last heartbeat.",
                        WBPROTO__REQUEST__BODY_LIST_LEASES, &json, &pg);
    if (rc >= 0)
        return rc;
    double now = wbctl_now();
    wbctl_json_array arr;
    wbctl_json_array_init(&arr);
    wbctl_jrow row = {0};
    wbctl_table t = {.ncols = 15};
    if (!json)
        wbctl_table_add(&t, "ID", "MODEL", "PID", "PROCESS", "UID", "STATE", "CONTAINERS", "SHARED",
                        "SLABS", "BYTES", "AGE", "HEARTBEAT", "BACKEND", "SLAB", "ACCESS");
    for (size_t page = 0; page < pg.n; page++) {
        const Wbproto__ListLeasesReply *ll = pg.reps[page]->list_leases;
        for (size_t i = 0; i < ll->n_leases; i++) {
            const Wbproto__LeaseInfo *l = ll->leases[i];
            char id[2 * WB_LEASE_ID_LEN + 1];
            wbctl_hex(&l->id, id, sizeof id);
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
            char pid[24], uid[16], containers[16], slabs[16], bytes[32], agebuf[32], hb[32];
            char shared[64];
            /* Bound by containers, counted once per container: two containers
             * binding the same tensor share one buffer but count twice here. */
            snprintf(shared, sizeof shared, "%llu (%llu B)", (unsigned long long)shared_tensors,
                     (unsigned long long)shared_bytes);
            wbctl_fmt_pid(pid, sizeof pid, l->pid);
            snprintf(uid, sizeof uid, "%u", l->uid);
            snprintf(containers, sizeof containers, "%u", l->containers);
            snprintf(slabs, sizeof slabs, "%u", l->slabs);
            snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)l->bytes);
            wbctl_fmt_age(agebuf, sizeof agebuf, age);
            snprintf(hb, sizeof hb, "%.1fs ago", since);
            id[8] = '\0';
            wbctl_table_add(&t, id, l->model, pid, l->process_name, uid,
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
    json_object_set_new(o, "created_at", json_real(c->created_at));
    json_object_set_new(o, "model_path", wbctl_jstr(c->model_path));
    json_t *ls = json_array();
    for (size_t k = 0; k < c->n_leases; k++) {
        const Wbproto__ContainerLease *cl = c->leases[k];
        char id[2 * WB_LEASE_ID_LEN + 1];
        wbctl_hex(&cl->lease_id, id, sizeof id);
        json_t *lo = json_object();
        json_object_set_new(lo, "lease_id", json_string(id));
        json_object_set_new(lo, "model", wbctl_jstr(cl->model));
        json_object_set_new(lo, "bound_bytes", json_integer((json_int_t)cl->bound_bytes));
        json_object_set_new(lo, "bound_tensors", json_integer(cl->bound_tensors));
        json_array_append_new(ls, lo);
    }
    json_object_set_new(o, "leases", ls);
    json_object_set_new(o, "leases_total", json_integer(c->leases_total));
    return o;
}

int wbctl_containers(const wbctl_globals *g, int argc, char **argv)
{
    int json;
    pages pg;
    int rc = list_fetch(g, argc, argv, "containers", "containers [--json]",
                        "Lists the AOTI model containers that clients built on their leases, as "
                        "their\nlast heartbeats reported them: the AOTI entry point used, "
                        "whether pinned async\nconstant copy was on, bytes bound from each lease "
                        "(shared), bytes built by\nconstant folding (private to the "
                        "container) and constants the model loaded itself.",
                        WBPROTO__REQUEST__BODY_LIST_CONTAINERS, &json, &pg);
    if (rc >= 0)
        return rc;
    double now = wbctl_now();
    wbctl_json_array arr;
    wbctl_json_array_init(&arr);
    wbctl_table t = {.ncols = 11};
    if (!json)
        wbctl_table_add(&t, "PID", "PROCESS", "ID", "API", "PINNED", "LEASES", "SHARED_BYTES",
                        "FOLDED_BYTES", "BOUND(L/A/C/P/F/U)", "AGE", "MODEL");
    for (size_t page = 0; page < pg.n; page++) {
        const Wbproto__ListContainersReply *lc = pg.reps[page]->list_containers;
        for (size_t i = 0; i < lc->n_containers; i++) {
            const Wbproto__ContainerInfo *c = lc->containers[i];
            uint64_t shared = 0;
            for (size_t k = 0; k < c->n_leases; k++)
                shared += c->leases[k]->bound_bytes;
            if (json) {
                wbctl_json_array_add(&arr, container_json(c, shared));
                continue;
            }
            char pid[24], id[24], leases[256] = "", shared_s[32], folded[32], agebuf[32], binds[96];
            wbctl_fmt_pid(pid, sizeof pid, c->pid);
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
            wbctl_fmt_age(agebuf, sizeof agebuf, now - c->created_at);
            if (c->leases_total > c->n_leases && used < sizeof leases)
                snprintf(leases + used, sizeof leases - used, ",+%u more",
                         c->leases_total - (uint32_t)c->n_leases);
            /* leased/aliased/caller/package/folded/unbound constants */
            snprintf(binds, sizeof binds, "%u/%u/%u/%u/%u/%u", c->leased_constants,
                     c->aliased_constants, c->caller_constants, c->package_constants,
                     c->folded_constants, c->unbound_constants);
            wbctl_table_add(&t, pid, c->process_name, id, c->aoti_api,
                            c->pinned_async_copy ? "on" : "off", leases, shared_s, folded, binds,
                            agebuf, c->model_path);
        }
    }
    return list_print(&pg, json, &arr, &t);
}

/* Walks StatsReply through its descriptor, so that every field wb.proto has
 * is printed under its own name, including fields added later. */
int wbctl_stats(const wbctl_globals *g, int argc, char **argv)
{
    int json;
    pages pg;
    int rc = list_fetch(g, argc, argv, "stats", "stats [--json]",
                        "Prints the broker's counters: requests, leases granted, released and "
                        "reclaimed, models and load totals.",
                        WBPROTO__REQUEST__BODY_STATS, &json, &pg);
    if (rc >= 0)
        return rc;
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
        if (json)
            json_object_set_new(obj, f->name,
                                is_double ? json_real(dv) : json_integer((json_int_t)uv));
        else if (is_double)
            printf("%s: %.3f\n", f->name, dv);
        else
            printf("%s: %llu\n", f->name, uv);
    }
    pages_free(&pg);
    return json ? wbctl_print_json(obj) : WBCTL_EXIT_OK;
}
