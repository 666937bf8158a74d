/* The FAKE broker of the client's unit tests (see fake_broker.h). */
#include "fake_broker.h"

#include "alloc.h"
#include "tensor_table.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

int64_t test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t test_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void test_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static uint8_t id_byte(const fake_broker *f)
{
    return f->instance ? (uint8_t)(f->instance & 0xff) : 0xab;
}

static void fill_lease(fake_broker *f, Wbproto__Lease *lease, Wbproto__Slab *slab,
                       Wbproto__Slab **slabs, Wbproto__Tensor *t, Wbproto__Tensor **tensors,
                       uint64_t *shape, uint8_t *id, uint8_t *handle, const char *model)
{
    memset(id, f->instance ? id_byte(f) : 0, WB_LEASE_ID_LEN);
    id[0] = id_byte(f);
    id[15] = ++f->next_id;
    lease->id.data = id;
    lease->id.len = WB_LEASE_ID_LEN;
    lease->model = (char *)model;
    uint32_t v = strcmp(model, "demo") == 0 ? atomic_load(&f->version) : 0;
    wb_shm *vs = v ? atomic_load(&f->version_slab[v % FAKE_MAX_VERSIONS]) : NULL;
    wb_shm *use = vs ? vs : f->slab;
    lease->version = v;
    lease->checksums_pending = atomic_load(&f->checksums_pending) != 0;
    slab->index = 0;
    slab->size = use->size;
    if (atomic_load(&f->mode) == FAKE_CUDA) {
        slab->backend = WBPROTO__BACKEND__BACKEND_CUDA;
        slab->device = 0;
        slab->device_uuid = (char *)(f->slab_uuid ? f->slab_uuid : "");
        memset(handle, 0x11, 64);
        slab->cuda_ipc_handle.data = handle;
        slab->cuda_ipc_handle.len = 64;
    } else {
        slab->backend = WBPROTO__BACKEND__BACKEND_HOST;
        slab->device = -1;
        slab->shm_name = use->name;
    }
    if (f->transport)
        slab->transport = (char *)f->transport;
    slabs[0] = slab;
    lease->n_slabs = 1;
    lease->slabs = slabs;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const fake_tensor *ft = &f->tensors[i];
        wbproto__tensor__init(&t[i]);
        shape[i] = ft->dim;
        t[i].name = (char *)ft->name;
        t[i].dtype = (char *)ft->dtype;
        t[i].n_shape = 1;
        t[i].shape = &shape[i];
        t[i].slab = 0;
        t[i].offset = ft->offset;
        t[i].nbytes = ft->nbytes;
        t[i].xxh3 = XXH3_64bits((const uint8_t *)use->addr + ft->offset, ft->nbytes);
        tensors[i] = &t[i];
    }
    lease->n_tensors = f->n_tensors;
    lease->tensors = tensors;
}

/* Records or drops a subscription of the connection `ident`. */
static void subscribe(fake_broker *f, zmq_msg_t *ident, const char *model, int unsubscribe)
{
    pthread_mutex_lock(&f->sub_mu);
    size_t len = zmq_msg_size(ident);
    size_t found = f->n_subs;
    for (size_t i = 0; i < f->n_subs; i++) {
        if (f->subs[i].ident_len == len &&
            memcmp(f->subs[i].ident, zmq_msg_data(ident), len) == 0 &&
            strcmp(f->subs[i].model, model) == 0)
            found = i;
    }
    if (unsubscribe && found < f->n_subs) {
        f->subs[found] = f->subs[--f->n_subs];
    } else if (!unsubscribe && found == f->n_subs && f->n_subs < FAKE_MAX_SUBS &&
               len <= sizeof f->subs[0].ident) {
        fake_sub *s = &f->subs[f->n_subs++];
        memcpy(s->ident, zmq_msg_data(ident), len);
        s->ident_len = len;
        snprintf(s->model, sizeof s->model, "%s", model);
    }
    pthread_mutex_unlock(&f->sub_mu);
}

void fake_broker_forget_subs(fake_broker *f)
{
    pthread_mutex_lock(&f->sub_mu);
    f->n_subs = 0;
    pthread_mutex_unlock(&f->sub_mu);
}

void fake_send_reply(fake_broker *f, const uint8_t *ident, size_t ident_len,
                     const Wbproto__Reply *rep)
{
    size_t len;
    uint8_t *buf = wb__reply_pack(rep, &len);
    ck_assert_ptr_nonnull(buf);
    zmq_send(f->router, ident, ident_len, ZMQ_SNDMORE);
    zmq_send(f->router, buf, len, 0);
    free(buf);
}

/* The queued notice, to every subscriber of its model. */
static void send_notices(fake_broker *f)
{
    Wbproto__VersionNotice n = WBPROTO__VERSION_NOTICE__INIT;
    n.model = f->notify_model;
    n.version = atomic_load(&f->notify_version);
    n.previous_version = atomic_load(&f->notify_previous);
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.id = 0;
    rep.body_case = WBPROTO__REPLY__BODY_NOTICE;
    rep.notice = &n;
    pthread_mutex_lock(&f->sub_mu);
    for (size_t i = 0; i < f->n_subs; i++) {
        if (strcmp(f->subs[i].model, f->notify_model) != 0)
            continue;
        if (atomic_load(&f->drop_notices)) {
            atomic_fetch_add(&f->n_notices_dropped, 1);
            continue;
        }
        atomic_store(&f->notice_sent_us, test_now_us());
        fake_send_reply(f, f->subs[i].ident, f->subs[i].ident_len, &rep);
        atomic_fetch_add(&f->n_notices_sent, 1);
    }
    pthread_mutex_unlock(&f->sub_mu);
}

void fake_broker_notify(fake_broker *f, const char *model, uint32_t version, uint32_t previous)
{
    snprintf(f->notify_model, sizeof f->notify_model, "%s", model);
    atomic_store(&f->notify_version, version);
    atomic_store(&f->notify_previous, previous);
    if (strcmp(model, "demo") == 0)
        atomic_store(&f->version, version);
    atomic_store(&f->notify_pending, 1);
    char one = 1;
    ck_assert_int_eq(write(f->wake[1], &one, 1), 1);
    while (atomic_load(&f->notify_pending))
        test_sleep_ms(1);
}

static void answer(fake_broker *f, zmq_msg_t *ident, const Wbproto__Request *req)
{
    Wbproto__Reply rep = WBPROTO__REPLY__INIT;
    rep.version = WB_PROTOCOL_VERSION;
    rep.id = req->id;
    Wbproto__HelloReply hello = WBPROTO__HELLO_REPLY__INIT;
    Wbproto__AcquireReply acq = WBPROTO__ACQUIRE_REPLY__INIT;
    Wbproto__Lease lease = WBPROTO__LEASE__INIT;
    Wbproto__Slab slab = WBPROTO__SLAB__INIT;
    Wbproto__Slab *slabs[1];
    Wbproto__Tensor t[FAKE_MAX_TENSORS];
    Wbproto__Tensor *tensors[FAKE_MAX_TENSORS];
    uint64_t shape[FAKE_MAX_TENSORS];
    uint8_t id[WB_LEASE_ID_LEN], handle[64];
    Wbproto__ReleaseReply rel = WBPROTO__RELEASE_REPLY__INIT;
    Wbproto__HeartbeatReply hb = WBPROTO__HEARTBEAT_REPLY__INIT;
    Wbproto__SubscribeReply sub = WBPROTO__SUBSCRIBE_REPLY__INIT;
    Wbproto__VersionNotice cur[FAKE_MAX_SUBS], *curp[FAKE_MAX_SUBS];
    char cur_model[FAKE_MAX_SUBS][64];
    ProtobufCBinaryData unknown[16];
    uint8_t *table = NULL, *frame = NULL;
    size_t frame_len = 0;
    Wbproto__Slab shared_slab;
    char busy[128];

    if (fake_publish_answer(f, zmq_msg_data(ident), zmq_msg_size(ident), req))
        return;
    switch (req->body_case) {
    case WBPROTO__REQUEST__BODY_HELLO:
        atomic_fetch_add(&f->n_hello, 1);
        hello.broker_version = "fake";
        hello.broker_pid = (uint32_t)getpid(); /* the same pid across restarts */
        hello.broker_instance = f->instance;
        hello.backend = atomic_load(&f->mode) == FAKE_CUDA ? WBPROTO__BACKEND__BACKEND_CUDA
                                                           : WBPROTO__BACKEND__BACKEND_HOST;
        hello.heartbeat_interval_ms = f->heartbeat_ms;
        hello.stale_after_ms = 5 * f->heartbeat_ms;
        rep.body_case = WBPROTO__REPLY__BODY_HELLO;
        rep.hello = &hello;
        break;
    case WBPROTO__REQUEST__BODY_ACQUIRE:
        atomic_fetch_add(&f->n_acquire, 1);
        if (req->acquire->tensor_table)
            atomic_fetch_add(&f->n_asked_table, 1);
        if (req->acquire->tensor_table_shared)
            atomic_fetch_add(&f->n_asked_shared, 1);
        if (strcmp(req->acquire->model, "demo") != 0 && strcmp(req->acquire->model, "other") != 0) {
            rep.status = WB_ENOTFOUND;
            rep.error = "no model named 'nosuch'";
            break;
        }
        if (atomic_load(&f->busy_acquires) != 0) {
            if (atomic_load(&f->busy_acquires) > 0)
                atomic_fetch_sub(&f->busy_acquires, 1);
            snprintf(busy, sizeof busy, "model '%s' is being brought back to its device",
                     req->acquire->model);
            rep.status = WB_EBUSY;
            rep.error = busy;
            rep.retry_after_ms = atomic_load(&f->busy_retry_ms);
            atomic_fetch_add(&f->n_busy, 1);
            break;
        }
        fill_lease(f, &lease, &slab, slabs, t, tensors, shape, id, handle, req->acquire->model);
        if (atomic_load(&f->compact) && req->acquire->tensor_table) {
            size_t tlen;
            table = wb__tensor_table_pack(lease.tensors, lease.n_tensors, &tlen);
            ck_assert_ptr_nonnull(table);
            uint8_t digest[16];
            wb__tensor_table_digest(table, tlen, digest);
            const ProtobufCBinaryData *held = &req->acquire->tensor_table_digest;
            if (held->len == sizeof digest && memcmp(held->data, digest, sizeof digest) == 0) {
                lease.tensor_table_cached = 1;
                wb_shm *other = atomic_load(&f->cached_slab);
                if (other) {
                    slab.size = other->size;
                    slab.shm_name = other->name;
                }
                atomic_fetch_add(&f->n_cached, 1);
            } else if (req->acquire->tensor_table_shared &&
                       atomic_load(&f->shared_mode) != FAKE_SHARED_IGNORE) {
                int sm = atomic_load(&f->shared_mode);
                if (!f->shared_table.addr) {
                    wb_err e;
                    ck_assert_int_eq(wb__shm_create(&f->shared_table, tlen, &e), WB_OK);
                    memcpy(f->shared_table.addr, table, tlen);
                    if (sm == FAKE_SHARED_BAD)
                        ((uint8_t *)f->shared_table.addr)[0] ^= 0xff; /* the magic */
                }
                wbproto__slab__init(&shared_slab);
                shared_slab.backend = WBPROTO__BACKEND__BACKEND_HOST;
                shared_slab.device = -1;
                shared_slab.transport = "shm";
                shared_slab.size = tlen;
                shared_slab.shm_name = sm == FAKE_SHARED_MISSING
                                           ? "/wb-1-00000000000000000000000000000000"
                                           : f->shared_table.name;
                lease.tensor_table_slab = &shared_slab;
                atomic_fetch_add(&f->n_shared_sent, 1);
            } else if (req->acquire->tensor_table_frame &&
                       atomic_load(&f->frame_mode) != FAKE_FRAME_IGNORE) {
                lease.tensor_table_in_frame = 1;
                int fm = atomic_load(&f->frame_mode);
                if (fm != FAKE_FRAME_NONE) {
                    frame = table;
                    frame_len = tlen;
                    if (fm == FAKE_FRAME_BAD)
                        table[0] ^= 0xff; /* the magic */
                }
            } else {
                lease.tensor_table.data = table;
                lease.tensor_table.len = tlen;
                atomic_fetch_add(&f->n_tables_sent, 1);
            }
            lease.n_tensors = 0;
            lease.tensors = NULL;
        }
        acq.lease = &lease;
        rep.body_case = WBPROTO__REPLY__BODY_ACQUIRE;
        rep.acquire = &acq;
        break;
    case WBPROTO__REQUEST__BODY_RELEASE:
        atomic_fetch_add(&f->n_release, 1);
        if (req->release->lease_id.len == WB_LEASE_ID_LEN)
            memcpy(f->released_id, req->release->lease_id.data, WB_LEASE_ID_LEN);
        rel.model_state = WBPROTO__MODEL_STATE__MODEL_READY;
        rep.body_case = WBPROTO__REPLY__BODY_RELEASE;
        rep.release = &rel;
        break;
    case WBPROTO__REQUEST__BODY_HEARTBEAT:
        atomic_store(&f->last_beats, (int)req->heartbeat->n_leases);
        if (req->heartbeat->n_leases > 0)
            atomic_store(&f->last_containers, req->heartbeat->leases[0]->containers);
        atomic_store(&f->last_swaps, 0);
        for (size_t i = 0; i < req->heartbeat->n_leases; i++) {
            const Wbproto__LeaseBeat *lb = req->heartbeat->leases[i];
            for (size_t k = 0; k < lb->n_container_records; k++) {
                atomic_store(&f->last_swaps, lb->container_records[k]->swaps);
                atomic_store(&f->last_swap_us,
                             (int64_t)(lb->container_records[k]->last_swap_ms * 1000.0));
            }
        }
        for (size_t i = 0; i < req->heartbeat->n_leases && hb.n_unknown_leases < 16; i++) {
            const ProtobufCBinaryData *lid = &req->heartbeat->leases[i]->lease_id;
            /* Only leases this instance granted are known. */
            if (atomic_load(&f->forget) || (f->instance && lid->data[0] != id_byte(f)))
                unknown[hb.n_unknown_leases++] = *lid;
        }
        hb.unknown_leases = hb.n_unknown_leases ? unknown : NULL;
        pthread_mutex_lock(&f->sub_mu);
        for (size_t i = 0; i < f->n_subs && !atomic_load(&f->beat_versions_off); i++) {
            if (f->subs[i].ident_len != zmq_msg_size(ident) ||
                memcmp(f->subs[i].ident, zmq_msg_data(ident), f->subs[i].ident_len) != 0)
                continue;
            wbproto__version_notice__init(&cur[hb.n_current_versions]);
            memcpy(cur_model[hb.n_current_versions], f->subs[i].model, 64);
            cur[hb.n_current_versions].model = cur_model[hb.n_current_versions];
            cur[hb.n_current_versions].version =
                strcmp(f->subs[i].model, "demo") == 0 ? atomic_load(&f->version) : 0;
            curp[hb.n_current_versions] = &cur[hb.n_current_versions];
            hb.n_current_versions++;
        }
        pthread_mutex_unlock(&f->sub_mu);
        hb.current_versions = hb.n_current_versions ? curp : NULL;
        hb.heartbeat_interval_ms = atomic_load(&f->pace_ms);
        hb.stale_after_ms = 5 * hb.heartbeat_interval_ms;
        rep.body_case = WBPROTO__REPLY__BODY_HEARTBEAT;
        rep.heartbeat = &hb;
        atomic_fetch_add(&f->n_heartbeat, 1);
        break;
    case WBPROTO__REQUEST__BODY_SUBSCRIBE:
        if (atomic_load(&f->sub_mode) == FAKE_SUB_UNKNOWN) {
            /* What a broker that predates versions answers. */
            rep.status = WB_EPROTO;
            rep.error = "request has no body";
            break;
        }
        atomic_fetch_add(&f->n_subscribe, 1);
        if (req->subscribe->unsubscribe)
            atomic_fetch_add(&f->n_unsubscribe, 1);
        subscribe(f, ident, req->subscribe->model, req->subscribe->unsubscribe);
        sub.version = strcmp(req->subscribe->model, "demo") == 0 ? atomic_load(&f->version) : 0;
        rep.body_case = WBPROTO__REPLY__BODY_SUBSCRIBE;
        rep.subscribe = &sub;
        break;
    default:
        rep.status = WB_ENOSYS;
        rep.error = "the fake broker does not do that";
        break;
    }
    size_t len;
    uint8_t *buf = wb__reply_pack(&rep, &len);
    ck_assert_ptr_nonnull(buf);
    /* Counted before the client can see the reply. */
    if (frame)
        atomic_fetch_add(&f->n_frames_sent, 1);
    zmq_msg_send(ident, f->router, ZMQ_SNDMORE);
    zmq_send(f->router, buf, len, frame ? ZMQ_SNDMORE : 0);
    if (frame)
        zmq_send(f->router, frame, frame_len, 0);
    free(buf);
    free(table);
}

static void *fake_main(void *arg)
{
    fake_broker *f = arg;
    while (!atomic_load(&f->stop)) {
        zmq_pollitem_t items[2] = {{.socket = f->router, .events = ZMQ_POLLIN},
                                   {.fd = f->wake[0], .events = ZMQ_POLLIN}};
        if (zmq_poll(items, 2, 10) <= 0)
            continue;
        if (items[1].revents & ZMQ_POLLIN) {
            char buf[16];
            while (read(f->wake[0], buf, sizeof buf) > 0)
                ;
            if (atomic_load(&f->notify_pending)) {
                send_notices(f);
                atomic_store(&f->notify_pending, 0);
            }
        }
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        zmq_msg_t ident, payload;
        zmq_msg_init(&ident);
        zmq_msg_init(&payload);
        zmq_msg_recv(&ident, f->router, 0);
        zmq_msg_recv(&payload, f->router, 0);
        Wbproto__Request *req = NULL;
        uint64_t id;
        wb_err err;
        int rc =
            wb__request_decode(zmq_msg_data(&payload), zmq_msg_size(&payload), &req, &id, &err);
        if (rc == WB_OK)
            atomic_fetch_add(&f->n_received, 1);
        if (rc == WB_OK && atomic_load(&f->mode) != FAKE_SILENT) {
            int delay = atomic_exchange(&f->delay_next_ms, 0);
            if (delay > 0)
                test_sleep_ms(delay);
            answer(f, &ident, req);
        }
        wb__request_free(&req);
        zmq_msg_close(&ident);
        zmq_msg_close(&payload);
    }
    return NULL;
}

void fake_broker_start(fake_broker *f, const char *path, wb_shm *slab, uint32_t heartbeat_ms,
                       uint64_t instance, const fake_tensor *tensors, size_t n_tensors)
{
    memset(f, 0, sizeof *f);
    ck_assert_uint_le(n_tensors, FAKE_MAX_TENSORS);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->heartbeat_ms = heartbeat_ms;
    f->instance = instance;
    f->slab = slab;
    memcpy(f->tensors, tensors, n_tensors * sizeof *tensors);
    f->n_tensors = n_tensors;
    pthread_mutex_init(&f->sub_mu, NULL);
    fake_publish_init(f);
    ck_assert_int_eq(pipe2(f->wake, O_NONBLOCK | O_CLOEXEC), 0);
    f->ctx = zmq_ctx_new();
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof linger);
    char ep[200];
    snprintf(ep, sizeof ep, "ipc://%s", f->path);
    ck_assert_int_eq(zmq_bind(f->router, ep), 0);
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

void fake_broker_stop(fake_broker *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    fake_publish_stop(f);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    unlink(f->path);
    close(f->wake[0]);
    close(f->wake[1]);
    pthread_mutex_destroy(&f->sub_mu);
    if (f->shared_table.addr) {
        wb__shm_unlink(&f->shared_table);
        wb__shm_unmap(&f->shared_table);
    }
}

void fake_slab_create(wb_shm *slab, size_t size, unsigned mul, unsigned add)
{
    wb_err err;
    ck_assert_int_eq(wb__shm_create(slab, size, &err), WB_OK);
    for (size_t i = 0; i < size; i++)
        ((uint8_t *)slab->addr)[i] = (uint8_t)(i * mul + add);
}

void fake_slab_destroy(wb_shm *slab)
{
    wb__shm_unlink(slab);
    wb__shm_unmap(slab);
}

wb_client *fake_connect(const char *path, int no_heartbeat_thread, int timeout_ms)
{
    wb_client_options o;
    wb_client_options_init(&o);
    o.socket_path = path;
    o.no_heartbeat_thread = no_heartbeat_thread;
    o.timeout_ms = timeout_ms;
    wb_client *c = NULL;
    int rc = wb_client_connect(&o, &c);
    ck_assert_msg(rc == WB_OK, "connect: %s", wb_client_errmsg(c));
    return c;
}

const fake_tensor fake_env_tensors[2] = {
    {"a", "F32", 0, 64, 16},
    {"b", "U8", 256, 100, 25},
};

void fake_env_start(fake_env *f, uint32_t heartbeat_ms)
{
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/wbtest-client-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    char path[160];
    snprintf(path, sizeof path, "%s/broker.sock", f->dir);
    fake_slab_create(&f->slab, 4096, 7, 1);
    fake_broker_start(&f->b, path, &f->slab, heartbeat_ms, 0, fake_env_tensors, 2);
}

void fake_env_stop(fake_env *f)
{
    fake_broker_stop(&f->b);
    fake_slab_destroy(&f->slab);
    rmdir(f->dir);
}
