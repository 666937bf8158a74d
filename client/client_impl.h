/* The insides of wb_client and wb_lease, shared by client.c and lease.c. */
#ifndef WB_CLIENT_IMPL_H
#define WB_CLIENT_IMPL_H

#include "wb/client.h"

#include "err.h"
#include "mapcache.h"
#include "rpc.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct wb__tensor_entry {
    char *name;
    char *dtype;
    uint32_t ndim;
    uint64_t *shape;
    const void *data;
    uint64_t nbytes;
    uint64_t xxh3;
    int device;
} wb__tensor_entry;

/* What a container reports about itself with every heartbeat (see
 * ContainerRecord in wb.proto). Owned by the container; a lease points to it
 * while the container is attached. */
typedef struct wb__container_rec {
    uint64_t id;
    char aoti_api[64];
    int pinned_async_copy;
    uint64_t folded_bytes;
    uint64_t embedded_bytes;
    /* How each constant was bound (see wb_container_info). */
    uint32_t leased_constants, aliased_constants, caller_constants, package_constants;
    uint32_t folded_constants, unbound_constants;
    uint64_t package_bytes;
    double created_at;
    const char *model_path;
} wb__container_rec;

/* One container's use of one lease: how much of the lease it binds. */
typedef struct wb__lease_use {
    struct wb__lease_use *next;
    const wb__container_rec *rec;
    uint64_t bound_bytes;
    uint32_t bound_tensors;
} wb__lease_use;

struct wb_lease {
    /* NULL once the client was destroyed while containers still used the
     * lease: it then lives on, mapped, until released locally. */
    wb_client *client;
    struct wb_lease *prev, *next; /* the client's list, under client->mu */
    uint8_t id[WB_LEASE_ID_BYTES];
    char id_hex[2 * WB_LEASE_ID_BYTES + 1];
    char *model;
    size_t n_maps;
    wb__map **maps; /* one reference per slab, in the broker's slab order */
    size_t n_tensors;
    wb__tensor_entry *tensors;
    atomic_uint containers;
    atomic_int orphaned;
    wb__lease_use *uses; /* attached containers, under a lock private to lease.c */
};

struct wb_client {
    /* Held around every exchange with the broker and every change of the
     * lease list; the heartbeat thread takes it too. */
    pthread_mutex_t mu;
    wb__rpc rpc;
    wb_err err;
    atomic_int connected;
    struct wb_lease *leases;

    uint32_t broker_pid;
    uint32_t heartbeat_ms;
    uint32_t stale_ms;

    /* Reconnection, under mu except where atomic. A failed exchange clears
     * `connected`; the next call, or the heartbeat thread once
     * next_reconnect_ms has passed, opens a new socket and says hello again.
     * A broker with another instance id knows none of the leases. */
    char hello_name[128];
    int hello_done;
    uint64_t broker_instance;
    uint32_t backoff_ms; /* 0 while connected */
    _Atomic int64_t next_reconnect_ms;
    atomic_uint reconnect_attempts;
    atomic_uint reconnects;

    /* The heartbeat thread sleeps on hb_cond so destroy can wake it. */
    int hb_started;
    pthread_t hb_thread;
    pthread_mutex_t hb_mu;
    pthread_cond_t hb_cond;
    int hb_stop;
};

/* Stores a message in the client (when there is one) and returns code. The
 * caller holds client->mu. */
int wb__client_fail(wb_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One exchange with the broker; records whether it answered (connected).
 * Same contract as wb__rpc_call. The caller holds client->mu. */
int wb__client_call(wb_client *c, Wbproto__Request *req, int timeout_ms, Wbproto__Reply **out,
                    wb_err *err);

/* Tells the broker (unless `tell` is 0) and frees the lease: unlinks it from
 * the client, drops its slab references. The caller holds client->mu when
 * the lease has a client. Returns what the broker said (0, its refusal, or
 * WB_ECONN when it could not be told), with a message in err. */
int wb__lease_end(wb_lease *lease, int tell, wb_err *err);

/* Registers a container on a lease (it then counts as one of the lease's
 * containers, so the lease cannot be released) together with the record that
 * heartbeats report. `rec` must stay valid until wb__lease_detach. */
int wb__lease_attach(wb_lease *lease, const wb__container_rec *rec, uint64_t bound_bytes,
                     uint32_t bound_tensors, wb_err *err);
/* Undoes wb__lease_attach. */
void wb__lease_detach(wb_lease *lease, const wb__container_rec *rec);

/* Fills beat->container_records with copies of the records of the containers
 * attached to the lease (at most the protocol's limit). Free with
 * wb__lease_beat_free. Returns WB_ENOMEM (and leaves none) when out of memory. */
int wb__lease_fill_beat(wb_lease *lease, Wbproto__LeaseBeat *beat);
void wb__lease_beat_free(Wbproto__LeaseBeat *beat);

#endif
