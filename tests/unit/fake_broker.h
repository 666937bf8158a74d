/* Test fixture shared by the client's unit tests: a FAKE broker, a thread
 * answering the protocol on a ROUTER socket with canned replies (hello,
 * acquire on one host slab, release, heartbeat), counting what it was asked.
 * It tests the client's side of the protocol, not the broker. */
#ifndef WB_TEST_FAKE_BROKER_H
#define WB_TEST_FAKE_BROKER_H

#include "wb/client.h"

#include "shm.h"
#include "wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

enum fake_frame_mode { FAKE_FRAME_IGNORE, FAKE_FRAME_SEND, FAKE_FRAME_NONE, FAKE_FRAME_BAD };

/* How the fake answers AcquireRequest.tensor_table_shared (with compact). */
enum fake_shared_mode {
    FAKE_SHARED_IGNORE,  /* as a broker that predates it: frame_mode decides */
    FAKE_SHARED_SEND,    /* the table in a shm object of its own (shared_table) */
    FAKE_SHARED_MISSING, /* names a shm object that does not exist */
    FAKE_SHARED_BAD,     /* the object holds a table with a wrong magic */
};

enum fake_mode {
    FAKE_NORMAL,
    FAKE_CUDA,   /* grant a lease on a cuda slab */
    FAKE_SILENT, /* read requests, never answer */
};

/* One tensor of the leases the fake grants, on its slab. */
typedef struct fake_tensor {
    const char *name;
    const char *dtype;
    uint64_t offset;
    uint64_t nbytes;
    uint64_t dim; /* the one dimension */
} fake_tensor;

#define FAKE_MAX_TENSORS  8
#define FAKE_MAX_VERSIONS 16
#define FAKE_MAX_SUBS     16

/* How the fake answers SubscribeRequest. */
enum fake_sub_mode {
    FAKE_SUB_ANSWER,  /* as a broker with versions */
    FAKE_SUB_UNKNOWN, /* as one that predates them: "request has no body" */
};

/* A connection's subscription: the ROUTER identity and the model. */
typedef struct fake_sub {
    uint8_t ident[64];
    size_t ident_len;
    char model[64];
} fake_sub;

/* Publishing, as the fake answers it (fake_publish.c). The begin's table is
 * recorded; a commit reads each tensor's bytes out of the memfd the
 * descriptor channel received (host sources) into `bytes`. Under mu. */
#define FAKE_PUB_TENSORS 8
#define FAKE_PUB_BYTES   512
typedef struct fake_pub_tensor {
    char name[64];
    char dtype[16];
    uint32_t ndim;
    uint64_t shape[4];
    uint64_t nbytes;
    /* From the commit: its source and offset, and its bytes (host). */
    uint32_t source;
    uint64_t offset;
    uint8_t bytes[FAKE_PUB_BYTES];
    int got; /* the bytes were read */
} fake_pub_tensor;

typedef struct fake_pub {
    pthread_mutex_t mu;
    /* 0: accept; else the status a begin or a commit is refused with (the
     * message says "fake refusal"). FAKE_PUB_UNKNOWN: the begin is answered
     * as by a broker without publishing. */
    atomic_int begin_status, commit_status;
    atomic_int n_begin, n_commit, n_abort, n_fds;
    int open; /* a publish is open: begun, not committed or aborted */
    char model[64];
    int partial;
    char placement[64];
    size_t n;
    fake_pub_tensor t[FAKE_PUB_TENSORS];
    /* The commit's sources: how many, and of the first, host_fd and size,
     * and whether a device source came (its handle's first byte). */
    size_t n_sources;
    int host_fd;
    uint64_t host_size;
    int cuda_sources;
    /* The memfd the channel received for the open publish (-1: none), its
     * seals (F_GET_SEALS), and whether the request named the open
     * publish's id. */
    int fd;
    int seals;
    int fd_id_ok;
    /* The descriptor channel ("<path>.fd"), when fake_broker_channel ran. */
    int listen_fd;
    int conns[4];
    pthread_t thread;
    atomic_int running;
} fake_pub;

#define FAKE_PUB_UNKNOWN 1

typedef struct fake_broker {
    char path[160]; /* the socket */
    void *ctx, *router;
    pthread_t thread;
    atomic_int stop;
    uint32_t heartbeat_ms; /* told in hello; stale after 5 of them */
    /* 0: every lease id starts with 0xab and every lease is known. Else the
     * id starts with the low byte of `instance`, as does every lease this
     * run knows: a new instance plays a restarted broker. */
    uint64_t instance;
    wb_shm *slab;
    fake_tensor tensors[FAKE_MAX_TENSORS];
    size_t n_tensors;

    atomic_int mode;          /* enum fake_mode */
    const char *transport;    /* Slab.transport of the grants; NULL: none */
    const char *slab_uuid;    /* FAKE_CUDA: the slab's device UUID (NULL: none sent) */
    atomic_int delay_next_ms; /* delay the next answer by this much, once */
    atomic_int forget;        /* heartbeats: report every lease as unknown */
    atomic_uint pace_ms;      /* heartbeat replies ask for this interval (0: say nothing) */
    atomic_int n_hello, n_acquire, n_release, n_heartbeat;
    atomic_int n_received; /* requests decoded, answered or not (FAKE_SILENT) */
    /* Acquires that asked for the compact table; the fake, like a broker
     * that predates it, answers with tensor messages all the same. */
    atomic_int n_asked_table;
    /* Compact tables: when set, an acquire that asks for the table gets it
     * packed (Lease.tensor_table), and one whose tensor_table_digest names
     * it gets Lease.tensor_table_cached and no table, as from a broker. */
    atomic_int compact;
    /* Non-NULL: the slab of cached replies instead of `slab` (a held table
     * that no longer fits its lease's slab, which a real broker does not
     * send). */
    _Atomic(wb_shm *) cached_slab;
    atomic_int n_tables_sent, n_cached;
    /* With compact, for acquires that ask for the table as a second frame:
     * FAKE_FRAME_IGNORE answers as a broker that predates it (the table
     * inside the reply), FAKE_FRAME_SEND sends the frame, FAKE_FRAME_NONE
     * says it follows but sends none, FAKE_FRAME_BAD sends it with a wrong
     * magic. n_frames_sent counts the frames sent. */
    atomic_int frame_mode;
    atomic_int n_frames_sent;
    /* enum fake_shared_mode; requests that asked for the shared table, and
     * replies that named one (Lease.tensor_table_slab). The object is made
     * at the first such reply and removed by fake_broker_stop. */
    atomic_int shared_mode;
    atomic_int n_asked_shared, n_shared_sent;
    wb_shm shared_table;
    atomic_uint last_containers; /* of the first lease in the last heartbeat */
    /* ContainerRecord.swaps and last_swap_ms (in microseconds) of the last
     * record in the last heartbeat (0 without one). */
    atomic_uint last_swaps;
    _Atomic int64_t last_swap_us;
    atomic_int last_beats; /* leases in the last heartbeat */
    uint8_t released_id[WB_LEASE_ID_LEN];
    uint8_t next_id; /* the last byte of the next lease id, less one */

    /* Versions of model "demo" ("other", also granted, has none): leases
     * carry `version` (0: say nothing, as a broker that predates versions)
     * and, when version_slab[version % FAKE_MAX_VERSIONS] is set, are
     * granted on that slab instead of `slab` (same tensors). */
    atomic_uint version;
    _Atomic(wb_shm *) version_slab[FAKE_MAX_VERSIONS];
    /* Subscriptions: enum fake_sub_mode; the subscribers (under sub_mu);
     * counts of SubscribeRequests (and of those that unsubscribed). */
    atomic_int sub_mode;
    pthread_mutex_t sub_mu;
    fake_sub subs[FAKE_MAX_SUBS];
    size_t n_subs;
    atomic_int n_subscribe, n_unsubscribe;
    /* Heartbeat replies list the current version of each model the
     * connection subscribed to, unless this is set. */
    atomic_int beat_versions_off;
    /* Notices: fake_broker_notify queues one, the thread sends it to every
     * subscriber of the model (drop_notices: counts it, sends nothing).
     * notice_sent_us: CLOCK_MONOTONIC microseconds of the last send. */
    int wake[2];
    atomic_int notify_pending;
    char notify_model[64];
    atomic_uint notify_version, notify_previous;
    atomic_int drop_notices;
    atomic_int n_notices_sent, n_notices_dropped;
    _Atomic int64_t notice_sent_us;
    /* Acquires of a model it knows refused with WB_EBUSY ("model 'M' is
     * being brought back to its device") and Reply.retry_after_ms =
     * busy_retry_ms, as by a broker restoring the model: the next
     * busy_acquires of them, every one while it is negative. n_busy counts
     * them. */
    atomic_int busy_acquires;
    atomic_uint busy_retry_ms;
    atomic_int n_busy;
    fake_pub pub;                 /* publishing (fake_publish.c) */
    atomic_int checksums_pending; /* Lease.checksums_pending of the grants */
} fake_broker;

/* Starts the fake on socket `path`, granting leases on `slab` (which the
 * caller owns) with the given tensors (at most FAKE_MAX_TENSORS) of model
 * "demo" (and "other"); any other model is refused with WB_ENOTFOUND. */
void fake_broker_start(fake_broker *f, const char *path, wb_shm *slab, uint32_t heartbeat_ms,
                       uint64_t instance, const fake_tensor *tensors, size_t n_tensors);

/* Makes `version` the current version of "demo" (new leases get it) and,
 * for `model`'s subscribers, sends VersionNotice{model, version, previous}
 * from the fake's thread; returns once it is sent (or dropped). */
void fake_broker_notify(fake_broker *f, const char *model, uint32_t version, uint32_t previous);

/* Starts the fake's descriptor channel on "<path>.fd" (session tokens and
 * publish memfds; lease fetches are refused): before connecting a client
 * that publishes host bytes. fake_broker_stop stops it. */
void fake_broker_channel(fake_broker *f);

/* fake_publish.c: answers a publish request (1), or not one (0). */
int fake_publish_answer(fake_broker *f, const uint8_t *ident, size_t ident_len,
                        const Wbproto__Request *req);
/* Sends a reply to the connection `ident` (fake_broker.c). */
void fake_send_reply(fake_broker *f, const uint8_t *ident, size_t ident_len,
                     const Wbproto__Reply *rep);
void fake_publish_init(fake_broker *f);
/* Forgets the open publish and the memfd received, as after its end. */
void fake_publish_reset(fake_broker *f);
void fake_publish_stop(fake_broker *f);

/* Forgets every subscription, as a broker does when the connection ends. */
void fake_broker_forget_subs(fake_broker *f);

/* Stops the thread and closes the socket; as after a crash, nothing listens
 * on the path any more. The slab is left to the caller. */
void fake_broker_stop(fake_broker *f);

/* A host slab of `size` bytes, byte i = i * mul + add. */
void fake_slab_create(wb_shm *slab, size_t size, unsigned mul, unsigned add);
void fake_slab_destroy(wb_shm *slab);

/* The usual setting of the client tests: a fake in a scratch directory of
 * its own under /tmp, granting leases of model "demo" on fake_env_tensors
 * ("a": F32 [16] at 0, 64 bytes; "b": U8 [25] at 256, 100 bytes) of a
 * 4 KiB slab whose byte i is 7i + 1. */
typedef struct fake_env {
    fake_broker b;
    char dir[64];
    wb_shm slab;
} fake_env;

extern const fake_tensor fake_env_tensors[2];

void fake_env_start(fake_env *f, uint32_t heartbeat_ms);
/* Stops the fake and removes its slab and directory. */
void fake_env_stop(fake_env *f);

/* Connects a client to the fake and asserts that it worked. */
wb_client *fake_connect(const char *path, int no_heartbeat_thread, int timeout_ms);

int64_t test_now_ms(void);
int64_t test_now_us(void);
void test_sleep_ms(int ms);

#endif
