#include "wbctl_model.h"

#include "wbctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The loader's figures: progress, settings and per-stage times and rates. */
static void load_json(json_t *o, const Wbproto__ModelInfo *m)
{
    json_object_set_new(o, "loaded_bytes", json_integer((json_int_t)m->loaded_bytes));
    if (m->load_mode && m->load_mode[0])
        json_object_set_new(o, "load_mode", wbctl_jstr(m->load_mode));
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
        json_object_set_new(one, "seconds", json_real(wbctl_round_secs(secs[i])));
        json_object_set_new(one, "gbps", json_real(wbctl_round_secs(rates[i])));
        json_object_set_new(st, names[i], one);
    }
    json_object_set_new(o, "load_stages", st);
    json_object_set_new(o, "wait_seconds", json_real(wbctl_round_secs(m->wait_seconds)));
    json_object_set_new(o, "open_seconds", json_real(wbctl_round_secs(m->open_seconds)));
    json_object_set_new(o, "alloc_seconds", json_real(wbctl_round_secs(m->alloc_seconds)));
    json_object_set_new(o, "register_seconds", json_real(wbctl_round_secs(m->register_seconds)));
    json_object_set_new(o, "seal_seconds", json_real(wbctl_round_secs(m->seal_seconds)));
    json_object_set_new(o, "first_copy_seconds",
                        json_real(wbctl_round_secs(m->first_copy_seconds)));
}

void wbctl_print_stages(const Wbproto__ModelInfo *m)
{
    if (!m->load_mode || !m->load_mode[0])
        return;
    char *mode = wbctl_escape(m->load_mode);
    printf("load: %s, %u thread%s", mode ? mode : "?", m->read_threads,
           m->read_threads == 1 ? "" : "s");
    free(mode);
    char size[32], read[32], hash[32], copy[32];
    if (m->staging_buffers)
        printf(", %u x %s pinned staging", m->staging_buffers,
               wbctl_fmt_size(size, sizeof size, m->staging_buffer_bytes));
    printf("; read %s, hash %s", wbctl_fmt_gbps(read, sizeof read, m->read_gbps),
           wbctl_fmt_gbps(hash, sizeof hash, m->hash_gbps));
    if (m->copy_seconds > 0)
        printf(", copy %s", wbctl_fmt_gbps(copy, sizeof copy, m->copy_gbps));
    printf("\n");
}

const char *wbctl_model_tier(const Wbproto__ModelInfo *m)
{
    return m->tier && m->tier[0] ? m->tier : "device";
}

/* Whether a ready model is off its device: its state is then its tier. */
static int off_device(const Wbproto__ModelInfo *m, int state)
{
    return state == WBPROTO__MODEL_STATE__MODEL_READY && strcmp(wbctl_model_tier(m), "device") != 0;
}

const char *wbctl_version_state(const Wbproto__ModelInfo *m)
{
    if (off_device(m, m->state))
        return wbctl_model_tier(m);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_READY && m->current)
        return "current";
    return wb__model_state_name(m->state);
}

/* Where the memory budget has put the model, and its restores. */
static void tier_json(json_t *o, const Wbproto__ModelInfo *m)
{
    json_object_set_new(o, "host_bytes", json_integer((json_int_t)m->host_bytes));
    json_object_set_new(o, "restores", json_integer(m->restores));
    json_object_set_new(o, "last_restore_seconds",
                        json_real(wbctl_round_secs(m->last_restore_seconds)));
    json_object_set_new(o, "last_restore_gbps", json_real(wbctl_round_secs(m->last_restore_gbps)));
    json_object_set_new(o, "last_restore_at", json_real(wbctl_round_time(m->last_restore_at)));
    json_object_set_new(o, "last_used_at", json_real(wbctl_round_time(m->last_used_at)));
}

/* Tensors shared with other models: the bytes resident once for several,
 * and what is the model's alone. */
static void share_json(json_t *o, const Wbproto__ModelInfo *m)
{
    uint64_t shared = m->shared_bytes <= m->bytes ? m->shared_bytes : m->bytes;
    json_object_set_new(o, "shared_bytes", json_integer((json_int_t)m->shared_bytes));
    json_object_set_new(o, "unique_bytes", json_integer((json_int_t)(m->bytes - shared)));
    json_object_set_new(o, "shared_tensors", json_integer(m->shared_tensors));
}

json_t *wbctl_version_json(const Wbproto__ModelInfo *m)
{
    json_t *o = json_object();
    json_object_set_new(o, "version", json_integer(m->version));
    json_object_set_new(o, "state", wbctl_jstr(wbctl_version_state(m)));
    json_object_set_new(o, "tier", wbctl_jstr(wbctl_model_tier(m)));
    json_object_set_new(o, "leases", json_integer(m->leases));
    json_object_set_new(o, "tensors", json_integer(m->tensors));
    json_object_set_new(o, "bytes", json_integer((json_int_t)m->bytes));
    json_object_set_new(o, "slab_bytes", json_integer((json_int_t)m->slab_bytes));
    json_object_set_new(o, "loaded_bytes", json_integer((json_int_t)m->loaded_bytes));
    share_json(o, m);
    json_object_set_new(o, "path", wbctl_jstr(m->path));
    json_object_set_new(o, "load_seconds", json_real(wbctl_round_secs(m->load_seconds)));
    json_object_set_new(o, "published_by_pid", json_integer(m->published_by_pid));
    json_object_set_new(o, "published_by_uid", json_integer(m->published_by_uid));
    json_object_set_new(o, "checksums",
                        wbctl_jstr(m->checksums && m->checksums[0] ? m->checksums : "ready"));
    if (m->error && m->error[0])
        json_object_set_new(o, "error", wbctl_jstr(m->error));
    return o;
}

json_t *wbctl_model_json(const Wbproto__ModelInfo *m)
{
    json_t *o = json_object();
    /* Every string as the broker sent it (wbctl_jstr: never NULL for a
     * string that is not UTF-8, so no key goes missing). */
    json_object_set_new(o, "name", wbctl_jstr(m->name));
    json_object_set_new(o, "version", json_integer(m->version));
    json_object_set_new(o, "current", json_boolean(m->current));
    json_object_set_new(o, "path", wbctl_jstr(m->path));
    /* A ready model off its device: its tier ("host", "evicted", ...). */
    json_object_set_new(
        o, "state",
        wbctl_jstr(off_device(m, m->state) ? wbctl_model_tier(m) : wb__model_state_name(m->state)));
    json_object_set_new(o, "tier", wbctl_jstr(wbctl_model_tier(m)));
    json_object_set_new(o, "backend", json_string(wb__backend_name(m->backend)));
    json_object_set_new(o, "device", json_integer(m->device));
    json_object_set_new(o, "tensors", json_integer(m->tensors));
    json_object_set_new(o, "bytes", json_integer((json_int_t)m->bytes));
    json_object_set_new(o, "slab_bytes", json_integer((json_int_t)m->slab_bytes));
    share_json(o, m);
    json_object_set_new(o, "share", json_boolean(m->share));
    json_object_set_new(o, "leases", json_integer(m->leases));
    json_object_set_new(o, "load_seconds", json_real(wbctl_round_secs(m->load_seconds)));
    json_object_set_new(o, "load_gbps", json_real(wbctl_round_secs(m->load_gbps)));
    json_object_set_new(o, "transport", wbctl_jstr(m->transport));
    json_object_set_new(o, "access", wbctl_jstr(m->access));
    /* A published version: who published it and its checksums' state. */
    json_object_set_new(o, "published_by_pid", json_integer(m->published_by_pid));
    json_object_set_new(o, "published_by_uid", json_integer(m->published_by_uid));
    json_object_set_new(o, "checksums",
                        wbctl_jstr(m->checksums && m->checksums[0] ? m->checksums : "ready"));
    tier_json(o, m);
    load_json(o, m);
    if (m->error && m->error[0])
        json_object_set_new(o, "error", wbctl_jstr(m->error));
    /* One entry per device (a broker that predates copies sends none). */
    json_t *copies = json_array();
    for (size_t k = 0; k < m->n_copies; k++) {
        const Wbproto__ModelCopy *c = m->copies[k];
        json_t *one = json_object();
        json_object_set_new(one, "device", json_integer(c->device));
        json_object_set_new(one, "uuid", wbctl_jstr(c->device_uuid));
        json_object_set_new(one, "state", json_string(wb__model_state_name(c->state)));
        json_object_set_new(one, "slab_bytes", json_integer((json_int_t)c->slab_bytes));
        json_object_set_new(one, "leases", json_integer(c->leases));
        json_object_set_new(one, "copy_seconds", json_real(wbctl_round_secs(c->copy_seconds)));
        if (c->error && c->error[0])
            json_object_set_new(one, "error", wbctl_jstr(c->error));
        json_array_append_new(copies, one);
    }
    json_object_set_new(o, "copies", copies);
    return o;
}

/* The default view: what each model is, where, how big, who leases it and
 * how clients reach it; -o wide adds how its load went, whether its
 * checksums are computed, and where it came from (its path, or the process
 * that published it). */
static const wbctl_column model_columns[WBCTL_MODEL_COLUMNS] = {
    {"NAME", 0},    {"VERSION", 0}, {"STATE", 0},     {"TIER", 1},   {"BACKEND", 0}, {"DEVICE", 0},
    {"TENSORS", 0}, {"SIZE", 0},    {"SHARED", 0},    {"LEASES", 0}, {"LOAD_S", 1},  {"RATE", 1},
    {"SLAB", 0},    {"ACCESS", 0},  {"CHECKSUMS", 1}, {"SOURCE", 1},
};

void wbctl_model_header(wbctl_table *t)
{
    wbctl_table_columns(t, model_columns, WBCTL_MODEL_COLUMNS);
}

/* One row: the model's, or (copy not NULL) its copy on one device. */
static void model_row(wbctl_table *t, const Wbproto__ModelInfo *m, const Wbproto__ModelCopy *c)
{
    char state[48], dev[16], tensors[16], bytes[32], shared[32], leases[16], secs[32], rate[32],
        version[16];
    int st = c ? c->state : m->state;
    /* A ready copy of the current version is current too; off its device,
     * its tier. */
    snprintf(state, sizeof state, "%s",
             off_device(m, st)                         ? wbctl_model_tier(m)
             : st == WBPROTO__MODEL_STATE__MODEL_READY ? wbctl_version_state(m)
                                                       : wb__model_state_name(st));
    /* 0 from a broker that predates versions. */
    if (m->version)
        snprintf(version, sizeof version, "%u", m->version);
    else
        snprintf(version, sizeof version, "-");
    snprintf(dev, sizeof dev, "%d", c ? c->device : m->device);
    snprintf(tensors, sizeof tensors, "%u", m->tensors);
    wbctl_fmt_size(bytes, sizeof bytes, m->bytes);
    /* Of SIZE, the bytes other models hold too (resident once). */
    if (m->shared_bytes)
        wbctl_fmt_size(shared, sizeof shared, m->shared_bytes);
    else
        snprintf(shared, sizeof shared, "-");
    snprintf(leases, sizeof leases, "%u", c ? c->leases : m->leases);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING) {
        /* While loading, STATE shows how far it got. */
        if (m->bytes && st == WBPROTO__MODEL_STATE__MODEL_LOADING)
            snprintf(state, sizeof state, "%s %.0f%%", wb__model_state_name(st),
                     100.0 * (double)m->loaded_bytes / (double)m->bytes);
        snprintf(secs, sizeof secs, "-");
        snprintf(rate, sizeof rate, "-");
    } else {
        snprintf(secs, sizeof secs, "%.3f", m->load_seconds);
        wbctl_fmt_gbps(rate, sizeof rate, m->load_gbps);
    }
    if (c && st == WBPROTO__MODEL_STATE__MODEL_FAILED)
        wbctl_fmt_size(bytes, sizeof bytes, 0);
    char source[64];
    const char *sums =
        m->checksums && m->checksums[0] ? m->checksums
        : st == WBPROTO__MODEL_STATE__MODEL_READY || st == WBPROTO__MODEL_STATE__MODEL_DRAINING
            ? "ready"
            : "-";
    if (m->published_by_pid || (m->checksums && m->checksums[0]))
        snprintf(source, sizeof source, "published by pid %u uid %u", m->published_by_pid,
                 m->published_by_uid);
    /* A broker that predates Slab.transport says nothing: "-". */
    wbctl_table_add(t, m->name, version, state, wbctl_model_tier(m), wb__backend_name(m->backend),
                    dev, tensors, bytes, shared, leases, secs, rate,
                    m->transport && m->transport[0] ? m->transport : "-",
                    m->access && m->access[0] ? m->access : "-", sums,
                    m->checksums && m->checksums[0] ? source : m->path);
}

void wbctl_model_row(wbctl_table *t, const Wbproto__ModelInfo *m)
{
    /* A model on devices: one row per device, with that copy's state and
     * leases (a copy that failed says so while the others serve). A host
     * model, or a broker that predates copies: one row. */
    int per_device = m->n_copies > 1 || (m->n_copies == 1 && m->copies[0]->device >= 0);
    if (!per_device) {
        model_row(t, m, NULL);
        return;
    }
    for (size_t k = 0; k < m->n_copies; k++)
        model_row(t, m, m->copies[k]);
}

void wbctl_model_failures(const Wbproto__ModelInfo *m)
{
    if (m->state == WBPROTO__MODEL_STATE__MODEL_FAILED) {
        /* The record of a failed load: why, once (its copies say no more). */
        char *name = wbctl_escape(m->name);
        char *why = wbctl_escape(m->error && m->error[0] ? m->error : "no reason given");
        printf("%s failed to load: %s\n", name ? name : "?", why ? why : "(out of memory)");
        free(name);
        free(why);
        return;
    }
    for (size_t k = 0; k < m->n_copies; k++) {
        const Wbproto__ModelCopy *c = m->copies[k];
        if (c->state != WBPROTO__MODEL_STATE__MODEL_FAILED || !c->error || !c->error[0])
            continue;
        /* The broker's strings, escaped as in the table above. */
        char *name = wbctl_escape(m->name);
        char *uuid = wbctl_escape(c->device_uuid && c->device_uuid[0] ? c->device_uuid : "-");
        char *why = wbctl_escape(c->error);
        printf("%s on device %d (%s) failed: %s\n", name ? name : "?", c->device, uuid ? uuid : "?",
               why ? why : "(out of memory)");
        free(name);
        free(uuid);
        free(why);
    }
}
