/* Shared by the tests of wb_container_update and wb_container_follow: a
 * FAKE broker (fake_broker.h) granting leases of model "demo" whose
 * version v lies on a host slab of its own, every weight equal to v, and a
 * FAKE AOTI library (tests/fake_aoti) computing y = x * w + b on them, so
 * that a run's output (x = 1: every element 2v) says which version it
 * read, and whether it read one version whole. Neither proves anything
 * about a real broker or real AOTI models. */
#ifndef WB_TEST_SWAP_FIXTURE_H
#define WB_TEST_SWAP_FIXTURE_H

#include "wb/client.h"
#include "wb/container.h"

#include "fake_broker.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SWAP_ELEMS 64

typedef struct swap_env {
    fake_broker b;
    char dir[64];
    char so[256];
    wb_shm base;
    wb_shm slabs[FAKE_MAX_VERSIONS];
    fake_tensor tensors[2];
} swap_env;

/* Every float of a version's weights, and the slab that holds them. */
static inline void swap_fill(swap_env *e, uint32_t v, float value)
{
    wb_shm *s = &e->slabs[v % FAKE_MAX_VERSIONS];
    float *p = s->addr;
    for (size_t i = 0; i < s->size / sizeof *p; i++)
        p[i] = value;
}

/* Makes version v current: its slab filled with v, then (notify) the
 * subscribers told. */
static inline void swap_publish(swap_env *e, uint32_t v, int notify)
{
    swap_fill(e, v, (float)v);
    uint32_t prev = atomic_load(&e->b.version);
    if (notify)
        fake_broker_notify(&e->b, "demo", v, prev);
    else
        atomic_store(&e->b.version, v);
}

static inline void swap_copy(const char *from, const char *to)
{
    FILE *f = fopen(from, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", from);
    FILE *t = fopen(to, "wb");
    ck_assert_ptr_nonnull(t);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        ck_assert_uint_eq(fwrite(buf, 1, n, t), n);
    fclose(f);
    fclose(t);
    chmod(to, 0700);
}

/* The fake broker at version 1, and a copy of the fake library `flavour`
 * with `spec` beside it. */
static inline void swap_start(swap_env *e, const char *flavour, const char *spec,
                              uint32_t heartbeat_ms)
{
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/wbtest-swap-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(e->dir));
    e->tensors[0] = (fake_tensor){"model.weight", "F32", 0, 4 * SWAP_ELEMS, SWAP_ELEMS};
    e->tensors[1] = (fake_tensor){"model.bias", "F32", 512, 4 * SWAP_ELEMS, SWAP_ELEMS};
    fake_slab_create(&e->base, 4096, 0, 0);
    for (int i = 0; i < FAKE_MAX_VERSIONS; i++) {
        fake_slab_create(&e->slabs[i], 4096, 0, 0);
        atomic_store(&e->b.version_slab[i], &e->slabs[i]);
    }
    char path[160];
    snprintf(path, sizeof path, "%s/broker.sock", e->dir);
    wb_shm *slabs[FAKE_MAX_VERSIONS];
    for (int i = 0; i < FAKE_MAX_VERSIONS; i++)
        slabs[i] = &e->slabs[i];
    fake_broker_start(&e->b, path, &e->base, heartbeat_ms, 0, e->tensors, 2);
    for (int i = 0; i < FAKE_MAX_VERSIONS; i++)
        atomic_store(&e->b.version_slab[i], slabs[i]);
    swap_publish(e, 1, 0);
    const char *bin = getenv("WB_BIN_DIR");
    ck_assert_msg(bin != NULL, "WB_BIN_DIR must name the build directory");
    char src[512], specp[300];
    snprintf(src, sizeof src, "%s/tests/fake_aoti/fake_aoti_%s.so", bin, flavour);
    snprintf(e->so, sizeof e->so, "%s/fake_aoti_%s.so", e->dir, flavour);
    swap_copy(src, e->so);
    snprintf(specp, sizeof specp, "%s/fake_aoti_spec.txt", e->dir);
    FILE *f = fopen(specp, "w");
    ck_assert_ptr_nonnull(f);
    fputs(spec, f);
    fclose(f);
}

static inline void swap_stop(swap_env *e)
{
    fake_broker_stop(&e->b);
    fake_slab_destroy(&e->base);
    for (int i = 0; i < FAKE_MAX_VERSIONS; i++)
        fake_slab_destroy(&e->slabs[i]);
    char p[300];
    snprintf(p, sizeof p, "%s/fake_aoti_spec.txt", e->dir);
    unlink(p);
    unlink(e->so);
    rmdir(e->dir);
}

/* One run with x = 1: WB_OK with out[] and *version, or the run's status. */
static inline int swap_run(wb_container *c, float *out, uint32_t *version)
{
    float x[SWAP_ELEMS];
    for (int i = 0; i < SWAP_ELEMS; i++)
        x[i] = 1.0f;
    int64_t shape[1] = {SWAP_ELEMS};
    wb_aten_tensor in = NULL, res = NULL;
    int rc = wb_container_tensor_from_blob(c, x, "F32", 1, shape, -1, &in);
    if (rc != WB_OK)
        return rc;
    rc = wb_container_run_versioned(c, &in, 1, &res, 1, NULL, version);
    if (rc != WB_OK)
        return rc;
    void *data = NULL;
    rc = wb_container_tensor_data_ptr(c, res, &data);
    if (rc == WB_OK)
        memcpy(out, data, sizeof(float) * SWAP_ELEMS);
    wb_container_tensor_delete(c, res);
    return rc;
}

/* 1 when every element of a run's output is that of version v. */
static inline int swap_is(const float *out, uint32_t v)
{
    for (int i = 0; i < SWAP_ELEMS; i++) {
        if (out[i] != 2.0f * (float)v)
            return 0;
    }
    return 1;
}

#endif
