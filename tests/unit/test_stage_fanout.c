/* Loads to several devices, on the CPU: fake device engines (host memory
 * standing in for device slabs; each copies only when its copy is queried or
 * finished, as a DMA engine reads the staging buffer late) behind the
 * fan-out engine, driven by the real loader and pipeline. Every device gets
 * exactly the file's bytes from one read; a staging buffer is reused only
 * when every device has copied it (a device that copies late would
 * otherwise get another chunk's bytes); a device that fails to allocate, to
 * queue or to finish a copy gets a failed copy with its reason while the
 * others stay ready; a load fails only when no device is left. These fakes
 * are not evidence that CUDA copies work: tests/gpu/multidevice.sh is. */
#include "loader.h"
#include "safetensors.h"
#include "stage_fanout.h"

#include <check.h>
#include <xxhash.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBUF  4
#define CHUNK (64u * 1024u)
#define NDEV  3

/* A fake device: its copy engine and the knobs that make it fail or lag. */
typedef struct fake_gpu {
    wb_copy_engine engine;
    const void *src[NBUF];
    void *dst[NBUF];
    size_t len[NBUF];
    unsigned submits;
    unsigned lag; /* queries answered "not yet" before each copy lands */
    unsigned lag_left[NBUF];
    int fail_submit_at; /* the n-th submit (1-based) fails; 0: never */
    int fail_alloc;     /* slab_alloc on this device fails */
    int fail_engine;    /* device_engine for this device fails */
    int fail_finish;
    unsigned batches; /* submit_many calls */
} fake_gpu;

static fake_gpu gpus[NDEV];
static char ckpt[256];
static uint8_t *ring_mem;
static uint8_t *ring_bufs[NBUF];
static wb_staging ring;
static wb_backend fake_be;

static void land(fake_gpu *g, int b)
{
    if (g->len[b]) {
        memcpy(g->dst[b], g->src[b], g->len[b]);
        g->len[b] = 0;
    }
}

static int g_submit(void *ctx, int buf, const void *src, void *dst, size_t len, wb_err *err)
{
    fake_gpu *g = ctx;
    g->submits++;
    if (g->fail_submit_at && (int)g->submits == g->fail_submit_at)
        return wb__err_set(err, WB_EIO, "fake device %ld: copy %u refused", (long)(g - gpus),
                           g->submits);
    if (buf < 0) {
        memcpy(dst, src, len);
        return WB_OK;
    }
    /* A buffer handed out again before this device copied it is the bug
     * this test exists to catch: its bytes would be another chunk's. */
    ck_assert_uint_eq(g->len[buf], 0);
    g->src[buf] = src;
    g->dst[buf] = dst;
    g->len[buf] = len;
    g->lag_left[buf] = g->lag;
    return WB_OK;
}

/* A device that takes batches (set in a test): each copy as g_submit. */
static int g_submit_many(void *ctx, const wb_copy *cp, unsigned n, wb_err *err)
{
    fake_gpu *g = ctx;
    g->batches++;
    for (unsigned i = 0; i < n; i++) {
        int rc = g_submit(ctx, cp[i].buf, cp[i].src, cp[i].dst, cp[i].len, err);
        if (rc != WB_OK)
            return rc;
    }
    return WB_OK;
}

static int g_query(void *ctx, int buf, wb_err *err)
{
    (void)err;
    fake_gpu *g = ctx;
    if (g->lag_left[buf]) {
        g->lag_left[buf]--;
        return 0;
    }
    land(g, buf);
    return 1;
}

static int g_finish(void *ctx, double *secs, wb_err *err)
{
    fake_gpu *g = ctx;
    for (int b = 0; b < NBUF; b++)
        land(g, b);
    *secs = 0.25 * (double)(g - gpus + 1);
    if (g->fail_finish)
        return wb__err_set(err, WB_EIO, "fake device %ld: an asynchronous copy failed",
                           (long)(g - gpus));
    return WB_OK;
}

static int g_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    memset(slab, 0, sizeof *slab);
    if (gpus[device].fail_alloc)
        return wb__err_set(err, WB_ENOMEM, "fake device %d: out of memory for %llu bytes", device,
                           (unsigned long long)size);
    slab->dev_ptr = calloc(1, size ? size : 1);
    slab->size = size;
    slab->device = device;
    return slab->dev_ptr ? WB_OK : WB_ENOMEM;
}

static void *g_dest(wb_slab *slab, uint64_t offset, uint64_t len)
{
    (void)slab;
    (void)offset;
    (void)len;
    return NULL;
}

static void g_export(wb_slab *slab, Wbproto__Slab *out)
{
    static uint8_t handle[64];
    wbproto__slab__init(out);
    out->backend = WBPROTO__BACKEND__BACKEND_CUDA;
    out->device = slab->device;
    out->size = slab->size;
    out->cuda_ipc_handle.data = handle;
    out->cuda_ipc_handle.len = sizeof handle;
}

static void g_free(wb_slab *slab)
{
    free(slab->dev_ptr);
    slab->dev_ptr = NULL;
    slab->size = 0;
}

static int g_device_engine(const wb_backend *be, int device, wb_copy_engine **out, wb_err *err)
{
    (void)be;
    if (gpus[device].fail_engine)
        return wb__err_set(err, WB_ENOGPU, "fake device %d: cannot start a stream", device);
    *out = &gpus[device].engine;
    return WB_OK;
}

static void setup(void)
{
    memset(gpus, 0, sizeof gpus);
    for (int i = 0; i < NDEV; i++)
        gpus[i].engine = (wb_copy_engine){
            .ctx = &gpus[i], .submit = g_submit, .query = g_query, .finish = g_finish};
    ring_mem = malloc(NBUF * CHUNK);
    ck_assert_ptr_nonnull(ring_mem);
    for (int i = 0; i < NBUF; i++)
        ring_bufs[i] = ring_mem + (size_t)i * CHUNK;
    ring = (wb_staging){.n = NBUF, .size = CHUNK, .bufs = ring_bufs, .engine = gpus[0].engine};
    fake_be = (wb_backend){.name = "fakegpu",
                           .proto = WBPROTO__BACKEND__BACKEND_CUDA,
                           .slab_alloc = g_alloc,
                           .slab_dest = g_dest,
                           .slab_export = g_export,
                           .slab_free = g_free,
                           .load_mode = WB_STAGE_STAGED,
                           .stage = {.read_threads = 3, .read_block = 4096},
                           .staging = &ring,
                           .engine = &gpus[0].engine,
                           .device_engine = g_device_engine};
}

static void teardown(void)
{
    free(ring_mem);
    if (ckpt[0])
        unlink(ckpt);
    ckpt[0] = '\0';
}

/* A checkpoint of ~1.1 MB: 40 tensors of 20000 bytes and one of 300000, so
 * that a load takes ~18 chunks through 4 buffers and every buffer is reused
 * several times. */
static const char *checkpoint(void)
{
    if (ckpt[0])
        return ckpt;
    snprintf(ckpt, sizeof ckpt, "/tmp/wb-fanout-%d.safetensors", (int)getpid());
    char header[8192];
    size_t at = 0, off = 0;
    at += (size_t)snprintf(header + at, sizeof header - at, "{");
    for (int i = 0; i < 40; i++, off += 20000)
        at += (size_t)snprintf(header + at, sizeof header - at,
                               "\"t%d\":{\"dtype\":\"U8\",\"shape\":[20000],"
                               "\"data_offsets\":[%zu,%zu]},",
                               i, off, off + 20000);
    at += (size_t)snprintf(header + at, sizeof header - at,
                           "\"big\":{\"dtype\":\"F32\",\"shape\":[75000],"
                           "\"data_offsets\":[%zu,%zu]}}",
                           off, off + 300000);
    off += 300000;
    FILE *f = fopen(ckpt, "wb");
    ck_assert_ptr_nonnull(f);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)at >> (8 * i));
    ck_assert_uint_eq(fwrite(le, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite(header, 1, at, f), at);
    uint32_t x = 12345;
    for (size_t i = 0; i < off; i++) {
        x = x * 1103515245u + 12345u;
        fputc((int)(x >> 24), f);
    }
    ck_assert_int_eq(fclose(f), 0);
    return ckpt;
}

/* Every tensor of the checkpoint is in slab k with the file's bytes. */
static void check_slab(const char *path, const wb_model_data *d, unsigned k)
{
    wb_st_table *table;
    wb_err err;
    ck_assert_int_eq(wb__st_open(path, &table, &err), WB_OK);
    const uint8_t *slab = d->slabs[k].dev_ptr;
    ck_assert_ptr_nonnull(slab);
    for (size_t i = 0; i < d->n_tensors; i++) {
        const wb_model_tensor *t = &d->tensors[i];
        const wb_st_tensor *st = wb__st_find(table, t->name);
        uint8_t *buf = malloc(t->nbytes + 1);
        int fd = open(table->files[st->file], O_RDONLY);
        ck_assert_int_eq(pread(fd, buf, t->nbytes, (off_t)st->offset), (ssize_t)t->nbytes);
        close(fd);
        ck_assert_msg(memcmp(slab + t->offset, buf, t->nbytes) == 0, "tensor %s on copy %u",
                      t->name, k);
        ck_assert_uint_eq(t->xxh3, XXH3_64bits(buf, t->nbytes));
        free(buf);
    }
    wb__st_table_free(&table);
}

static int load(const int *devs, unsigned n, wb_model_data *d, wb_err *err)
{
    wb_gpu_list l = {.n = NDEV};
    for (int i = 0; i < NDEV; i++) {
        l.dev[i].index = i;
        snprintf(l.dev[i].uuid, sizeof l.dev[i].uuid, "GPU-0000000%d-0000-0000-0000-000000000000",
                 i);
    }
    wb_load_opts o = {
        .backend = &fake_be, .device = 0, .devices = devs, .n_devices = n, .gpus = &l};
    return wb__load_ex(checkpoint(), &o, d, err);
}

START_TEST(every_device_gets_the_bytes_from_one_read)
{
    static const int devs[] = {0, 1, 2};
    gpus[1].lag = 3; /* device 1 copies late: buffers must wait for it */
    gpus[2].lag = 1;
    wb_model_data d;
    wb_err err;
    ck_assert_msg(load(devs, 3, &d, &err) == WB_OK, "%s", err.msg);
    ck_assert_uint_eq(d.n_copies, 3);
    ck_assert_uint_eq(d.n_slabs, 3);
    ck_assert_uint_ge(d.stage.chunks, 3 * NBUF);
    for (unsigned k = 0; k < 3; k++) {
        ck_assert_int_eq(d.copies[k].state, WBPROTO__MODEL_STATE__MODEL_READY);
        ck_assert_int_eq(d.copies[k].device, (int)k);
        ck_assert_str_eq(d.copies[k].error, "");
        check_slab(checkpoint(), &d, k);
        /* Each device's own time, from its engine. */
        ck_assert(d.copies[k].copy_seconds == 0.25 * (k + 1));
        /* One copy per chunk on every device: the file was read once. */
        ck_assert_uint_eq(gpus[k].submits, d.stage.chunks);
    }
    ck_assert_str_eq(d.copies[1].uuid, "GPU-00000001-0000-0000-0000-000000000000");
    ck_assert_uint_eq(d.slab_bytes, 3 * d.slabs[0].size);
    ck_assert(d.stage.copy_seconds == 0.75); /* the slowest device */
    wb__model_data_free(&d, &fake_be);
}
END_TEST

START_TEST(a_failing_device_leaves_the_others_ready)
{
    static const int devs[] = {0, 1, 2};
    gpus[1].fail_submit_at = 3;
    gpus[2].fail_alloc = 1;
    wb_model_data d;
    wb_err err;
    ck_assert_msg(load(devs, 3, &d, &err) == WB_OK, "%s", err.msg);
    ck_assert_int_eq(d.copies[0].state, WBPROTO__MODEL_STATE__MODEL_READY);
    check_slab(checkpoint(), &d, 0);
    ck_assert_int_eq(d.copies[1].state, WBPROTO__MODEL_STATE__MODEL_FAILED);
    ck_assert_str_eq(d.copies[1].error, "fake device 1: copy 3 refused");
    ck_assert_ptr_null(d.slabs[1].dev_ptr); /* freed at once */
    ck_assert_int_eq(d.copies[2].state, WBPROTO__MODEL_STATE__MODEL_FAILED);
    ck_assert_ptr_nonnull(strstr(d.copies[2].error, "fake device 2: out of memory for "));
    /* Device 1 stopped being fed after its failure. */
    ck_assert_uint_eq(gpus[1].submits, 3);
    ck_assert_uint_eq(d.slab_bytes, d.slabs[0].size);

    /* The model serves the ready copy; the failed ones are refused by name. */
    wb_model *m = wb__model_new("m", "p", &fake_be, 0);
    ck_assert_ptr_nonnull(m);
    wb__model_set_devices(m, devs, 3);
    ck_assert_int_eq(wb__model_adopt(m, &d, &err), WB_OK);
    ck_assert_int_eq(m->state, WBPROTO__MODEL_STATE__MODEL_READY);
    unsigned copy = 9;
    ck_assert_int_eq(wb__model_pick_copy(m, 1, 0, "", 0, &copy, &err), WB_OK);
    ck_assert_uint_eq(copy, 0);
    ck_assert_int_eq(wb__model_pick_copy(m, 1, 1, "", 0, &copy, &err), WB_ENOGPU);
    ck_assert_str_eq(err.msg,
                     "model 'm' has no ready copy on device 1 (the broker's ordinal); its copies: "
                     "0=GPU-00000000-0000-0000-0000-000000000000 ready, "
                     "1=GPU-00000001-0000-0000-0000-000000000000 failed, "
                     "2=GPU-00000002-0000-0000-0000-000000000000 failed (load it there, or ask "
                     "for peer access)");
    ck_assert_int_eq(
        wb__model_pick_copy(m, 0, 0, "GPU-00000002-0000-0000-0000-000000000000", 0, &copy, &err),
        WB_ENOGPU);
    ck_assert_ptr_nonnull(
        strstr(err.msg, "no ready copy on device GPU-00000002-0000-0000-0000-000000000000;"));
    /* Peer access asked for: the ready copy elsewhere. */
    ck_assert_int_eq(wb__model_pick_copy(m, 1, 1, "", 1, &copy, &err), WB_OK);
    ck_assert_uint_eq(copy, 0);
    wb__model_free(&m);
}
END_TEST

START_TEST(the_load_fails_only_when_no_device_is_left)
{
    static const int devs[] = {0, 1};
    gpus[0].fail_submit_at = 2;
    gpus[1].fail_engine = 1;
    wb_model_data d;
    wb_err err;
    ck_assert_int_eq(load(devs, 2, &d, &err), WB_EIO);
    ck_assert_str_eq(err.msg, "the load failed on every device: device 0: fake device 0: copy 2 "
                              "refused; device 1: fake device 1: cannot start a stream");
    ck_assert_uint_eq(d.n_copies, 0);
    ck_assert_ptr_null(d.slabs);

    /* One device, failing at the end: the load fails with its reason. */
    teardown();
    setup();
    static const int one[] = {1};
    gpus[1].fail_finish = 1;
    ck_assert_int_eq(load(one, 1, &d, &err), WB_EIO);
    ck_assert_str_eq(err.msg, "fake device 1: an asynchronous copy failed");
    teardown();

    /* Every allocation failing. */
    setup();
    gpus[0].fail_alloc = gpus[1].fail_alloc = 1;
    ck_assert_int_eq(load(devs, 2, &d, &err), WB_ENOMEM);
    ck_assert_ptr_nonnull(strstr(err.msg, "no slab could be allocated on any of 2 devices: fake "
                                          "device 0: out of memory"));
}
END_TEST

START_TEST(the_fanout_engine_alone)
{
    /* Offsets are kept per device; query says done only when all are. */
    uint8_t a[64] = {0}, b[64] = {0}, src[16];
    for (int i = 0; i < 16; i++)
        src[i] = (uint8_t)(i + 1);
    wb_stage_fanout_target t[2] = {{.device = 0, .engine = &gpus[0].engine, .dst = a},
                                   {.device = 1, .engine = &gpus[1].engine, .dst = b}};
    wb_stage_fanout f;
    wb_err err;
    ck_assert_int_eq(wb__stage_fanout_init(&f, t, 2, &err), WB_OK);
    ck_assert_ptr_eq(f.base, a);
    ck_assert_ptr_null(f.engine.host_register); /* the fakes cannot register */
    gpus[1].lag = 2;
    ck_assert_int_eq(f.engine.submit(f.engine.ctx, 1, src, f.base + 32, 16, &err), WB_OK);
    ck_assert_int_eq(f.engine.query(f.engine.ctx, 1, &err), 0);
    ck_assert_int_eq(f.engine.query(f.engine.ctx, 1, &err), 0);
    ck_assert_int_eq(f.engine.query(f.engine.ctx, 1, &err), 1);
    ck_assert_mem_eq(a + 32, src, 16);
    ck_assert_mem_eq(b + 32, src, 16);
    ck_assert_uint_eq(wb__stage_fanout_live(&f), 2);
    /* No usable target: every device's reason. */
    t[0].failed = t[1].failed = 1;
    wb__err_set(&t[0].err, WB_ENOGPU, "no stream");
    wb__err_set(&t[1].err, WB_ENOMEM, "no memory");
    ck_assert_int_eq(wb__stage_fanout_init(&f, t, 2, &err), WB_ENOGPU);
    ck_assert_str_eq(err.msg,
                     "the load failed on every device: device 0: no stream; device 1: no memory");
    ck_assert_int_eq(wb__stage_fanout_init(&f, t, 0, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "no device to load to");
}
END_TEST

START_TEST(a_batch_reaches_every_device_at_its_own_offset)
{
    /* Device 0 takes batches, device 1 only single copies (the fan-out
     * submits them one by one), device 2 refuses the batch's second copy
     * and leaves the load; the others go on. */
    uint8_t a[64] = {0}, b[64] = {0}, c[64] = {0}, src[3][8];
    for (int i = 0; i < 3; i++)
        memset(src[i], 0x10 * (i + 1), sizeof src[i]);
    gpus[0].engine.submit_many = g_submit_many;
    gpus[2].fail_submit_at = 2;
    wb_stage_fanout_target t[3] = {{.device = 0, .engine = &gpus[0].engine, .dst = a},
                                   {.device = 1, .engine = &gpus[1].engine, .dst = b},
                                   {.device = 2, .engine = &gpus[2].engine, .dst = c}};
    wb_stage_fanout f;
    wb_err err;
    ck_assert_int_eq(wb__stage_fanout_init(&f, t, 3, &err), WB_OK);
    ck_assert_ptr_nonnull(f.engine.submit_many);
    wb_copy cp[3] = {{.buf = 0, .src = src[0], .dst = f.base + 0, .len = 8},
                     {.buf = 2, .src = src[1], .dst = f.base + 40, .len = 8},
                     {.buf = 3, .src = src[2], .dst = f.base + 16, .len = 8}};
    ck_assert_int_eq(f.engine.submit_many(f.engine.ctx, cp, 3, &err), WB_OK);
    ck_assert_uint_eq(gpus[0].batches, 1);
    ck_assert_uint_eq(gpus[0].submits, 3);
    ck_assert_uint_eq(gpus[1].submits, 3);
    ck_assert_uint_eq(wb__stage_fanout_live(&f), 2);
    ck_assert_int_eq(t[2].failed, 1);
    ck_assert_str_eq(t[2].err.msg, "fake device 2: copy 2 refused");
    for (int k = 0; k < 3; k++)
        ck_assert_int_eq(f.engine.query(f.engine.ctx, cp[k].buf, &err), 1);
    ck_assert_mem_eq(a + 0, src[0], 8);
    ck_assert_mem_eq(a + 40, src[1], 8);
    ck_assert_mem_eq(a + 16, src[2], 8);
    ck_assert_mem_eq(b + 0, src[0], 8);
    ck_assert_mem_eq(b + 40, src[1], 8);
    ck_assert_mem_eq(b + 16, src[2], 8);
    /* A batch out of bounds is refused before any device sees it. */
    ck_assert_int_eq(f.engine.submit_many(f.engine.ctx, cp, 0, &err), WB_EINTERNAL);
    ck_assert_uint_eq(gpus[0].batches, 1);
    /* The last device refusing ends the load. */
    gpus[0].fail_submit_at = 4;
    gpus[1].fail_submit_at = 4;
    ck_assert_int_eq(f.engine.submit_many(f.engine.ctx, cp, 1, &err), WB_EIO);
    ck_assert_ptr_nonnull(strstr(err.msg, "the load failed on every device"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stage_fanout");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, every_device_gets_the_bytes_from_one_read);
    tcase_add_test(tc, a_batch_reaches_every_device_at_its_own_offset);
    tcase_add_test(tc, a_failing_device_leaves_the_others_ready);
    tcase_add_test(tc, the_load_fails_only_when_no_device_is_left);
    tcase_add_test(tc, the_fanout_engine_alone);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
