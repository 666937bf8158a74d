/* libwbclient: the containers registered on a lease, and the records that
 * heartbeats carry for them. All of a lease's container state (count,
 * records, whether release has begun) is guarded by the lease's own lock,
 * so that wb_lease_release decides under the lock registrations change
 * under. */
#include "lease.h"

#include "alloc.h"
#include "client_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Container records per lease in one heartbeat, as the decoder allows. */
#define MAX_RECORDS WB_MAX_CONTAINER_RECORDS

void wb__lease_containers_init(wb_lease *lease)
{
    pthread_mutex_init(&lease->mu, NULL);
    lease->containers = 0;
    lease->uses = NULL;
    lease->ending = 0;
}

void wb__lease_containers_free(wb_lease *lease)
{
    while (lease->uses) {
        wb__lease_use *u = lease->uses;
        lease->uses = u->next;
        free(u);
    }
    pthread_mutex_destroy(&lease->mu);
}

unsigned wb__lease_begin_end(wb_lease *lease)
{
    pthread_mutex_lock(&lease->mu);
    unsigned n = lease->containers;
    if (n == 0)
        lease->ending = 1;
    pthread_mutex_unlock(&lease->mu);
    return n;
}

/* Records a failed registration call in the client's message. */
static int lease_fail(wb_lease *lease, int code, const char *what)
{
    return wb__client_fail(lease->client, code, "lease %.8s: %s", lease->id_hex, what);
}

WB_EXPORT int wb_lease_container_add(wb_lease *lease)
{
    if (!lease)
        return WB_EINVAL;
    pthread_mutex_lock(&lease->mu);
    int ending = lease->ending;
    if (!ending)
        lease->containers++;
    pthread_mutex_unlock(&lease->mu);
    if (ending)
        return lease_fail(lease, WB_ESTATE, "container_add while the lease is being released");
    return WB_OK;
}

WB_EXPORT int wb_lease_container_remove(wb_lease *lease)
{
    if (!lease)
        return WB_EINVAL;
    pthread_mutex_lock(&lease->mu);
    unsigned n = lease->containers;
    if (n > 0)
        lease->containers--;
    pthread_mutex_unlock(&lease->mu);
    if (n == 0)
        return lease_fail(lease, WB_EINVAL, "container_remove without a matching container_add");
    return WB_OK;
}

WB_EXPORT unsigned wb_lease_containers(const wb_lease *lease)
{
    if (!lease)
        return 0;
    /* The lock is part of the lease's state, not of its value. */
    wb_lease *l = (wb_lease *)lease;
    pthread_mutex_lock(&l->mu);
    unsigned n = l->containers;
    pthread_mutex_unlock(&l->mu);
    return n;
}

int wb__lease_attach(wb_lease *lease, const wb__container_rec *rec, wb_err *err)
{
    wb__lease_use *u = wb__calloc(1, sizeof *u);
    if (!u)
        return wb__err_set(err, WB_ENOMEM, "out of memory registering a container on lease %.8s",
                           lease->id_hex);
    u->rec = rec;
    pthread_mutex_lock(&lease->mu);
    int ending = lease->ending;
    if (!ending) {
        u->next = lease->uses;
        lease->uses = u;
        lease->containers++;
    }
    pthread_mutex_unlock(&lease->mu);
    if (ending) {
        free(u);
        return wb__err_set(err, WB_ESTATE, "lease %.8s (model '%s') is being released",
                           lease->id_hex, lease->model);
    }
    return WB_OK;
}

void wb__lease_publish(wb_lease *lease, const wb__container_rec *rec, uint64_t bound_bytes,
                       uint32_t bound_tensors)
{
    pthread_mutex_lock(&lease->mu);
    for (wb__lease_use *u = lease->uses; u; u = u->next) {
        if (u->rec == rec) {
            u->bound_bytes = bound_bytes;
            u->bound_tensors = bound_tensors;
            u->published = 1;
            break;
        }
    }
    pthread_mutex_unlock(&lease->mu);
}

void wb__lease_detach(wb_lease *lease, const wb__container_rec *rec)
{
    wb__lease_use *found = NULL;
    pthread_mutex_lock(&lease->mu);
    for (wb__lease_use **pp = &lease->uses; *pp; pp = &(*pp)->next) {
        if ((*pp)->rec == rec) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    if (found && lease->containers > 0)
        lease->containers--;
    pthread_mutex_unlock(&lease->mu);
    free(found);
}

void wb__lease_beat_free(Wbproto__LeaseBeat *beat)
{
    for (size_t i = 0; i < beat->n_container_records; i++) {
        Wbproto__ContainerRecord *r = beat->container_records[i];
        free(r->aoti_api);
        free(r->model_path);
        free(r);
    }
    free(beat->container_records);
    beat->container_records = NULL;
    beat->n_container_records = 0;
}

/* A model path as the broker takes it (a heartbeat with a string that is
 * not UTF-8, or a path of WB_MAX_RECORD_PATH bytes or more, is refused
 * whole): UTF-8, each byte of a path that is not as U+FFFD, and a long one
 * by its end ("..." and its last bytes, from a character's start), which
 * names the model. Malloc'd; NULL when out of memory. */
static char *record_path(const char *path)
{
    char *fixed = wb__malloc(3 * strlen(path) + 1);
    if (!fixed)
        return NULL;
    wb__utf8_repair(fixed, path);
    size_t len = strlen(fixed);
    if (len < WB_MAX_RECORD_PATH)
        return fixed;
    size_t from = len - (WB_MAX_RECORD_PATH - 4);
    while ((fixed[from] & 0xc0) == 0x80)
        from++;
    char *out = wb__malloc(WB_MAX_RECORD_PATH);
    if (out)
        snprintf(out, WB_MAX_RECORD_PATH, "...%s", fixed + from);
    free(fixed);
    return out;
}

int wb__lease_fill_beat(wb_lease *lease, Wbproto__LeaseBeat *beat)
{
    beat->n_container_records = 0;
    beat->container_records = NULL;
    pthread_mutex_lock(&lease->mu);
    beat->containers = lease->containers;
    size_t n = 0;
    for (const wb__lease_use *u = lease->uses; u && n < MAX_RECORDS; u = u->next)
        n += u->published != 0;
    if (n == 0) {
        pthread_mutex_unlock(&lease->mu);
        return WB_OK;
    }
    beat->container_records = wb__calloc(n, sizeof *beat->container_records);
    int rc = beat->container_records ? WB_OK : WB_ENOMEM;
    for (const wb__lease_use *u = lease->uses; u && rc == WB_OK; u = u->next) {
        if (!u->published)
            continue;
        if (beat->n_container_records == n)
            break;
        Wbproto__ContainerRecord *r = wb__calloc(1, sizeof *r);
        if (!r) {
            rc = WB_ENOMEM;
            break;
        }
        wbproto__container_record__init(r);
        beat->container_records[beat->n_container_records++] = r;
        r->container_id = u->rec->id;
        r->aoti_api = wb__strdup(u->rec->aoti_api);
        r->model_path = record_path(u->rec->model_path ? u->rec->model_path : "");
        r->pinned_async_copy = u->rec->pinned_async_copy != 0;
        r->bound_bytes = u->bound_bytes;
        r->bound_tensors = u->bound_tensors;
        r->folded_bytes = u->rec->folded_bytes;
        r->embedded_bytes = u->rec->embedded_bytes;
        r->leased_constants = u->rec->leased_constants;
        r->aliased_constants = u->rec->aliased_constants;
        r->caller_constants = u->rec->caller_constants;
        r->package_constants = u->rec->package_constants;
        r->folded_constants = u->rec->folded_constants;
        r->unbound_constants = u->rec->unbound_constants;
        r->package_bytes = u->rec->package_bytes;
        r->created_at = u->rec->created_at;
        r->swaps = atomic_load(&u->rec->swaps);
        r->last_swap_ms = (double)atomic_load(&u->rec->last_swap_us) / 1000.0;
        if (!r->aoti_api || !r->model_path)
            rc = WB_ENOMEM;
    }
    pthread_mutex_unlock(&lease->mu);
    if (rc != WB_OK)
        wb__lease_beat_free(beat);
    return rc;
}
