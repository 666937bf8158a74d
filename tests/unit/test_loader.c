/* The loader: a checkpoint's tensors land in one slab at 256-byte aligned
 * offsets with exactly the file's bytes and correct XXH3-64 checksums, on
 * the direct path (host backend) and the staged path (a fake device backend
 * in host memory); progress and per-stage figures are reported; load errors
 * come back with the reader's message; a cancelled load frees what it
 * allocated; the background loader hands finished and abandoned jobs back. */
#include "loader.h"
#include "safetensors.h"

#include <check.h>
#include <xxhash.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char tmpdir[256];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/wb-loader-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static const char *data_path(const char *rel)
{
    static char buf[1024];
    const char *dir = getenv("WB_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/%s", dir && *dir ? dir : "tests/data", rel);
    return buf;
}

/* Writes a safetensors file: 8-byte little-endian header length, header,
 * data. */
static const char *write_st(const char *name, const char *header, const uint8_t *data, size_t len)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t n = strlen(header);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(n >> (8 * i));
    ck_assert_uint_eq(fwrite(le, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite(header, 1, n, f), n);
    if (len)
        ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
    return path;
}

/* Reads a file whole, so that it is in the page cache. */
static void warm(const char *path)
{
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    char buf[65536];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
}

/* The host backend with the read source of the running loop test
 * (wb_stage_read): the loading tests run once with each. */
static wb_backend host_be;
static int cur_read = WB_STAGE_READ_PREAD;

static void use_read_source(int r)
{
    cur_read = r;
    host_be = wb__backend_host;
    host_be.stage.read_source = r;
}

static int shm_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

START_TEST(test_load_hand_written)
{
    use_read_source(_i);
    uint8_t data[13 + 300];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 7 + 1);
    const char *hdr = "{\"__metadata__\":{\"k\":\"v\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                      "\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[313,313]},"
                      "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[12,13]},"
                      "\"big\":{\"dtype\":\"BF16\",\"shape\":[2,75],\"data_offsets\":[13,313]}}";
    const char *path = write_st("hand.safetensors", hdr, data, sizeof data);
    wb_model_data d;
    wb_err err;
    ck_assert_int_eq(wb__load(path, &host_be, -1, NULL, &d, &err), WB_OK);
    ck_assert_uint_eq(d.n_tensors, 4);
    ck_assert_uint_eq(d.n_slabs, 1);
    ck_assert_uint_eq(d.bytes, 313);
    ck_assert(wb__shm_name_valid(d.slabs[0].shm.name));
    ck_assert_uint_eq(d.slab_bytes, d.slabs[0].size);
    ck_assert_int_eq(d.slabs[0].device, -1);
    ck_assert(d.load_seconds > 0);
    ck_assert(d.load_gbps > 0);

    /* The reader orders tensors by file offset: a, s, big, z. A zero-size
     * tensor still gets its own aligned offset. */
    static const char *const names[] = {"a", "s", "big", "z"};
    static const uint64_t file_off[] = {0, 12, 13, 313}, nbytes[] = {12, 1, 300, 0};
    static const uint64_t slab_off[] = {0, 256, 512, 1024};
    const uint8_t *slab = d.slabs[0].shm.addr;
    for (size_t i = 0; i < 4; i++) {
        const wb_model_tensor *t = &d.tensors[i];
        ck_assert_str_eq(t->name, names[i]);
        ck_assert_uint_eq(t->nbytes, nbytes[i]);
        ck_assert_uint_eq(t->offset, slab_off[i]);
        ck_assert_uint_eq(t->offset % 256, 0);
        ck_assert_uint_eq(t->slab, 0);
        ck_assert_mem_eq(slab + t->offset, data + file_off[i], t->nbytes);
        ck_assert_uint_eq(t->xxh3, XXH3_64bits(data + file_off[i], t->nbytes));
    }
    ck_assert_str_eq(d.tensors[0].dtype, "F32");
    ck_assert_uint_eq(d.tensors[0].ndim, 1);
    ck_assert_uint_eq(d.tensors[0].shape[0], 3);
    ck_assert_uint_eq(d.tensors[3].ndim, 2);
    ck_assert_uint_eq(d.tensors[3].shape[1], 4);
    ck_assert_uint_eq(d.tensors[1].ndim, 0);
    ck_assert_str_eq(d.tensors[2].dtype, "BF16");
    ck_assert_uint_eq(d.slabs[0].size, 1024);

    char name[WB_SHM_NAME_MAX];
    strcpy(name, d.slabs[0].shm.name);
    ck_assert(shm_exists(name));
    wb__model_data_free(&d, &host_be);
    ck_assert(!shm_exists(name));
    ck_assert_uint_eq(d.n_tensors, 0);
}
END_TEST

/* Checkpoints written by the official libraries, one file and sharded. */
static void check_against_files(const char *path)
{
    wb_model_data d;
    wb_err err;
    ck_assert_msg(wb__load(path, &host_be, -1, NULL, &d, &err) == WB_OK, "%s: %s", path, err.msg);
    wb_st_table *table;
    ck_assert_int_eq(wb__st_open(path, &table, &err), WB_OK);
    ck_assert_uint_eq(d.n_tensors, table->n_tensors);
    ck_assert_uint_eq(d.bytes, table->total_bytes);
    const uint8_t *slab = d.slabs[0].shm.addr;
    uint64_t prev_end = 0;
    for (size_t i = 0; i < d.n_tensors; i++) {
        const wb_model_tensor *t = &d.tensors[i];
        const wb_st_tensor *st = wb__st_find(table, t->name);
        ck_assert_ptr_nonnull(st);
        ck_assert_uint_eq(t->nbytes, st->nbytes);
        ck_assert_uint_eq(t->offset % 256, 0);
        ck_assert_uint_ge(t->offset, prev_end); /* no overlap */
        prev_end = t->offset + t->nbytes;
        ck_assert_uint_le(prev_end, d.slabs[0].size);
        uint8_t *buf = malloc(t->nbytes + 1);
        int fd = open(table->files[st->file], O_RDONLY);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(pread(fd, buf, t->nbytes, (off_t)st->offset), (ssize_t)t->nbytes);
        close(fd);
        ck_assert_mem_eq(slab + t->offset, buf, t->nbytes);
        ck_assert_uint_eq(t->xxh3, XXH3_64bits(buf, t->nbytes));
        free(buf);
    }
    wb__st_table_free(&table);
    wb__model_data_free(&d, &host_be);
}

START_TEST(test_load_official)
{
    use_read_source(_i);
    check_against_files(data_path("official/all_dtypes.safetensors"));
    check_against_files(data_path("official/gpt2/model.safetensors"));
    check_against_files(data_path("official/gpt2_sharded"));
}
END_TEST

START_TEST(test_load_errors)
{
    use_read_source(_i);
    wb_model_data d;
    wb_err err;
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.safetensors", tmpdir);
    ck_assert_int_eq(wb__load(missing, &host_be, -1, NULL, &d, &err), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, missing));
    ck_assert_uint_eq(d.n_slabs, 0);

    /* Data section shorter than the header says: the reader's message, with
     * the file's name. */
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    uint8_t data[8] = {0};
    const char *path = write_st("short.safetensors", hdr, data, sizeof data);
    ck_assert_int_eq(wb__load(path, &host_be, -1, NULL, &d, &err), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "short.safetensors"));
    ck_assert_uint_eq(d.n_slabs, 0);
}
END_TEST

START_TEST(test_load_cancelled)
{
    use_read_source(_i);
    uint8_t data[64] = {1};
    const char *hdr = "{\"a\":{\"dtype\":\"U8\",\"shape\":[64],\"data_offsets\":[0,64]}}";
    const char *path = write_st("c.safetensors", hdr, data, sizeof data);
    atomic_int cancel;
    atomic_init(&cancel, 1);
    wb_model_data d;
    wb_err err;
    ck_assert_int_eq(wb__load(path, &host_be, -1, &cancel, &d, &err), WB_ESTATE);
    ck_assert_ptr_nonnull(strstr(err.msg, "cancelled"));
    ck_assert_uint_eq(d.n_slabs, 0);
    ck_assert_ptr_null(d.slabs);
}
END_TEST

/* A job's own cancel flag stops it (the loop sets it through
 * wb__loader_cancel for a job the loader has taken): nothing is left
 * allocated, and a flag given to the run instead is the one polled. */
START_TEST(test_job_cancelled)
{
    uint8_t data[64] = {1};
    const char *hdr = "{\"a\":{\"dtype\":\"U8\",\"shape\":[64],\"data_offsets\":[0,64]}}";
    const char *path = write_st("j.safetensors", hdr, data, sizeof data);
    wb_load_job *job = wb__load_job_new("j", path, &wb__backend_host, -1, NULL, 0, 1);
    ck_assert_ptr_nonnull(job);
    wb_loader l;
    wb_err err;
    ck_assert_int_eq(wb__loader_start(&l, &err), WB_OK);
    /* Not in the loader's queue: only its flag is set. */
    ck_assert_int_eq(wb__loader_cancel(&l, job), 0);
    ck_assert_ptr_null(wb__loader_stop(&l));
    ck_assert_int_eq(atomic_load(&job->cancel), 1);
    wb__load_job_run(job, NULL);
    ck_assert_int_eq(job->rc, WB_ESTATE);
    ck_assert_ptr_nonnull(strstr(job->err.msg, "cancelled"));
    ck_assert_uint_eq(job->data.n_slabs, 0);
    ck_assert_ptr_null(job->data.slabs);
    atomic_int go;
    atomic_init(&go, 0);
    wb__load_job_run(job, &go);
    ck_assert_int_eq(job->rc, WB_OK);
    ck_assert_uint_eq(job->data.bytes, 64);
    ck_assert_uint_eq(atomic_load(&job->progress.landed), 64);
    wb__load_job_free(&job);
}
END_TEST

START_TEST(test_background_loader)
{
    wb_loader l;
    wb_err err;
    ck_assert_int_eq(wb__loader_start(&l, &err), WB_OK);
    uint8_t data[16] = {9, 8, 7};
    const char *hdr = "{\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]}}";
    char good[512];
    snprintf(good, sizeof good, "%s", write_st("g.safetensors", hdr, data, sizeof data));
    const uint8_t ident[] = {0, 1, 2, 3, 4};
    wb_load_job *j1 = wb__load_job_new("g", good, &wb__backend_host, -1, ident, sizeof ident, 77);
    wb_load_job *j2 =
        wb__load_job_new("m", "/nonexistent/x.safetensors", &wb__backend_host, -1, NULL, 0, 78);
    ck_assert_ptr_nonnull(j1);
    ck_assert_ptr_nonnull(j2);
    wb__loader_submit(&l, j1);
    wb__loader_submit(&l, j2);

    int got = 0;
    wb_load_job *done[2] = {NULL, NULL};
    while (got < 2) {
        struct pollfd p = {.fd = l.efd, .events = POLLIN};
        ck_assert_int_eq(poll(&p, 1, 10000), 1);
        for (wb_load_job *j = wb__loader_take_done(&l); j;) {
            wb_load_job *next = j->next;
            ck_assert_int_lt(got, 2);
            done[got++] = j;
            j = next;
        }
    }
    ck_assert_ptr_eq(done[0], j1); /* in order */
    ck_assert_int_eq(j1->rc, WB_OK);
    ck_assert_uint_eq(j1->request_id, 77);
    ck_assert_uint_eq(j1->ident_len, sizeof ident);
    ck_assert_mem_eq(j1->ident, ident, sizeof ident);
    ck_assert_uint_eq(j1->data.bytes, 16);
    ck_assert_int_eq(((uint8_t *)j1->data.slabs[0].shm.addr)[1], 8);
    ck_assert_ptr_eq(done[1], j2);
    ck_assert_int_eq(j2->rc, WB_ENOTFOUND);
    wb__load_job_free(&j1);
    wb__load_job_free(&j2);
    ck_assert_ptr_null(j1);

    ck_assert_ptr_null(wb__loader_stop(&l));
}
END_TEST

START_TEST(test_loader_stop_returns_queued)
{
    wb_loader l;
    wb_err err;
    ck_assert_int_eq(wb__loader_start(&l, &err), WB_OK);
    /* Hold the queue's lock so the thread cannot take jobs, queue three,
     * then stop: every job comes back, none lost. */
    pthread_mutex_lock(&l.mu);
    wb_load_job *jobs[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] =
            wb__load_job_new("q", "/nonexistent", &wb__backend_host, -1, NULL, 0, (uint64_t)i);
        jobs[i]->next = NULL;
    }
    l.queue = jobs[0];
    jobs[0]->next = jobs[1];
    jobs[1]->next = jobs[2];
    pthread_mutex_unlock(&l.mu);
    wb_load_job *list = wb__loader_stop(&l);
    int n = 0;
    while (list) {
        wb_load_job *next = list->next;
        ck_assert(list->rc == WB_ESTATE || list->rc == WB_ENOTFOUND);
        if (list->rc == WB_ESTATE)
            ck_assert_ptr_nonnull(strstr(list->err.msg, "stopped before loading 'q'"));
        wb__load_job_free(&list);
        list = next;
        n++;
    }
    ck_assert_int_eq(n, 3);
}
END_TEST

/* A device-like backend in host memory: slabs from malloc, filled through
 * a staging ring by an engine that copies when the copy is queried (as a
 * DMA engine reads the buffer late). It drives the loader's staged path on
 * the CPU. */
typedef struct fake_dev {
    wb_staging ring;
    uint8_t *mem;
    const void *src[8];
    void *dst[8];
    size_t len[8];
    unsigned copies;
} fake_dev;

static int fd_submit(void *ctx, int buf, const void *src, void *dst, size_t len, wb_err *err)
{
    (void)err;
    fake_dev *f = ctx;
    f->src[buf] = src;
    f->dst[buf] = dst;
    f->len[buf] = len;
    f->copies++;
    return WB_OK;
}

static int fd_query(void *ctx, int buf, wb_err *err)
{
    (void)err;
    fake_dev *f = ctx;
    if (f->len[buf]) {
        memcpy(f->dst[buf], f->src[buf], f->len[buf]);
        f->len[buf] = 0;
    }
    return 1;
}

static int fd_finish(void *ctx, double *secs, wb_err *err)
{
    for (int i = 0; i < 8; i++)
        fd_query(ctx, i, err);
    *secs = 0.5;
    return WB_OK;
}

static int fd_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    (void)err;
    memset(slab, 0, sizeof *slab);
    slab->dev_ptr = calloc(1, size ? size : 1);
    slab->size = size;
    slab->device = device;
    return slab->dev_ptr ? WB_OK : WB_ENOMEM;
}

static void *fd_dest(wb_slab *slab, uint64_t offset, uint64_t len)
{
    (void)slab;
    (void)offset;
    (void)len;
    return NULL;
}

static void fd_export(wb_slab *slab, Wbproto__Slab *out)
{
    wbproto__slab__init(out);
    out->size = slab->size;
}

static void fd_free(wb_slab *slab)
{
    free(slab->dev_ptr);
    slab->dev_ptr = NULL;
}

static fake_dev fdev;
static wb_backend fake_backend;

static const wb_backend *fake_staged_backend(uint64_t chunk, unsigned threads)
{
    memset(&fdev, 0, sizeof fdev);
    fdev.mem = malloc(8 * chunk);
    ck_assert_ptr_nonnull(fdev.mem);
    static uint8_t *bufs[8];
    for (int i = 0; i < 8; i++)
        bufs[i] = fdev.mem + (size_t)i * chunk;
    fdev.ring = (wb_staging){
        .n = 8,
        .size = chunk,
        .bufs = bufs,
        .engine = {.ctx = &fdev, .submit = fd_submit, .query = fd_query, .finish = fd_finish}};
    fake_backend = (wb_backend){.name = "fakedev",
                                .proto = WBPROTO__BACKEND__BACKEND_CUDA,
                                .slab_alloc = fd_alloc,
                                .slab_dest = fd_dest,
                                .slab_export = fd_export,
                                .slab_free = fd_free,
                                .load_mode = WB_STAGE_STAGED,
                                .stage = {.read_threads = threads, .read_source = cur_read},
                                .staging = &fdev.ring};
    return &fake_backend;
}

/* The staged path of the loader: every tensor of the official checkpoints
 * lands in the (fake) device slab with its checksum; progress reaches the
 * total; the stage figures say what ran. */
START_TEST(test_load_staged_progress)
{
    use_read_source(_i);
    static const char *const files[] = {"official/gpt2/model.safetensors", "official/gpt2_sharded",
                                        "official/all_dtypes.safetensors"};
    for (size_t f = 0; f < 3; f++) {
        const wb_backend *be = fake_staged_backend(4096, 3);
        wb_load_progress prog;
        atomic_init(&prog.total, 1);
        atomic_init(&prog.landed, 7);
        wb_load_opts o = {.backend = be, .device = 0, .progress = &prog};
        wb_model_data d;
        wb_err err;
        const char *path = data_path(files[f]);
        ck_assert_msg(wb__load_ex(path, &o, &d, &err) == WB_OK, "%s: %s", path, err.msg);
        ck_assert_uint_eq(atomic_load(&prog.total), d.bytes);
        ck_assert_uint_eq(atomic_load(&prog.landed), d.bytes);
        ck_assert_int_eq(d.stage.mode, WB_STAGE_STAGED);
        ck_assert_uint_eq(d.stage.buffers, 8);
        ck_assert_uint_eq(d.stage.chunk_bytes, 4096);
        ck_assert_uint_le(d.stage.threads, 3);
        ck_assert(d.stage.copy_seconds == 0.5);
        ck_assert_uint_eq(fdev.copies, d.stage.chunks);
        wb_st_table *table;
        ck_assert_int_eq(wb__st_open(path, &table, &err), WB_OK);
        const uint8_t *slab = d.slabs[0].dev_ptr;
        for (size_t i = 0; i < d.n_tensors; i++) {
            const wb_model_tensor *t = &d.tensors[i];
            const wb_st_tensor *st = wb__st_find(table, t->name);
            uint8_t *buf = malloc(t->nbytes + 1);
            int fd = open(table->files[st->file], O_RDONLY);
            ck_assert_int_eq(pread(fd, buf, t->nbytes, (off_t)st->offset), (ssize_t)t->nbytes);
            close(fd);
            ck_assert_mem_eq(slab + t->offset, buf, t->nbytes);
            ck_assert_uint_eq(t->xxh3, XXH3_64bits(buf, t->nbytes));
            free(buf);
        }
        wb__st_table_free(&table);

        /* What list_models shows of it, loaded and while loading. */
        wb_model *m = wb__model_new("m", path, be, 0);
        ck_assert_ptr_nonnull(m);
        ck_assert_int_eq(wb__model_adopt(m, &d, &err), WB_OK);
        Wbproto__ModelInfo mi = WBPROTO__MODEL_INFO__INIT;
        wb__load_fill_model_info(m, &mi);
        ck_assert_uint_eq(mi.loaded_bytes, m->data.bytes);
        ck_assert_str_eq(mi.load_mode, "staged");
        ck_assert_uint_eq(mi.staging_buffers, 8);
        ck_assert_uint_eq(mi.staging_buffer_bytes, 4096);
        ck_assert(mi.copy_seconds == 0.5);
        ck_assert_double_eq_tol(mi.copy_gbps, (double)m->data.bytes / 0.5 / 1e9, 1e-12);
        ck_assert_uint_eq(mi.read_threads, m->data.stage.threads);
        /* While loading, the figures come from its job. */
        m->state = WBPROTO__MODEL_STATE__MODEL_LOADING;
        wb_load_job *job = wb__load_job_new("m", path, be, 0, NULL, 0, 0);
        ck_assert_ptr_nonnull(job);
        m->job = job;
        atomic_store(&job->progress.total, 1000);
        atomic_store(&job->progress.landed, 250);
        Wbproto__ModelInfo li = WBPROTO__MODEL_INFO__INIT;
        wb__load_fill_model_info(m, &li);
        ck_assert_uint_eq(li.bytes, 1000);
        ck_assert_uint_eq(li.loaded_bytes, 250);

        wb_model_registry reg = {0};
        wb__models_add(&reg, m);
        Wbproto__StatsReply sr = WBPROTO__STATS_REPLY__INIT;
        wb__load_fill_stats(be, &reg, &sr);
        ck_assert_uint_eq(sr.loads_in_progress, 1);
        ck_assert_uint_eq(sr.loading_bytes, 250);
        ck_assert_uint_eq(sr.loading_total_bytes, 1000);
        ck_assert_uint_eq(sr.staging_buffers, 8);
        ck_assert_uint_eq(sr.staging_bytes, 8 * 4096);
        ck_assert_uint_eq(sr.read_threads, 3);
        wb__models_clear(&reg);
        wb__load_job_free(&job);
        free(fdev.mem);
    }
}
END_TEST

/* The staged path allocates the slab while the readers fill the ring: the
 * allocation sees staging buffers already filled and no copy queued yet,
 * and the first copy comes after it. An allocation that fails stops the
 * load with its message before any copy, and leaves the ring to the next
 * load; a checkpoint of empty tensors, with nothing to copy, still gets
 * its slab. */
static int alloc_mode; /* 0: allocate; 1: wait for a filled buffer first; 2: fail */
static int alloc_saw_filled, alloc_saw_copies = -1;

static int fd_alloc_watching(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    if (alloc_mode == 2)
        return wb__err_set(err, WB_ENOMEM, "no room on device %d for %llu bytes (test)", device,
                           (unsigned long long)size);
    alloc_saw_copies = (int)fdev.copies;
    size_t ring = (size_t)fdev.ring.n * fdev.ring.size;
    for (int tries = 0; alloc_mode == 1 && tries < 5000 && !alloc_saw_filled; tries++) {
        for (size_t i = 0; i < ring && !alloc_saw_filled; i++)
            alloc_saw_filled = __atomic_load_n(&fdev.mem[i], __ATOMIC_RELAXED) != 0;
        if (!alloc_saw_filled)
            usleep(1000);
    }
    return fd_alloc(slab, device, size, err);
}

START_TEST(test_load_staged_allocates_while_reading)
{
    uint8_t data[3 * 20000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i % 251 + 1);
    const char *hdr = "{\"a\":{\"dtype\":\"U8\",\"shape\":[20000],\"data_offsets\":[0,20000]},"
                      "\"b\":{\"dtype\":\"U8\",\"shape\":[20000],\"data_offsets\":[20000,40000]},"
                      "\"c\":{\"dtype\":\"U8\",\"shape\":[20000],\"data_offsets\":[40000,60000]}}";
    char path[512];
    snprintf(path, sizeof path, "%s", write_st("s.safetensors", hdr, data, sizeof data));
    const wb_backend *be = fake_staged_backend(4096, 2);
    memset(fdev.mem, 0, 8 * 4096);
    fake_backend.slab_alloc = fd_alloc_watching;
    wb_load_opts o = {.backend = be, .device = 0};
    wb_model_data d;
    wb_err err;

    alloc_mode = 1;
    alloc_saw_filled = 0;
    ck_assert_msg(wb__load_ex(path, &o, &d, &err) == WB_OK, "%s", err.msg);
    ck_assert_msg(alloc_saw_filled, "the slab was allocated before any staging buffer was read");
    ck_assert_int_eq(alloc_saw_copies, 0);
    ck_assert(d.stage.first_copy_at >= d.alloc_seconds);
    ck_assert(d.alloc_seconds > 0);
    ck_assert_uint_eq(fdev.copies, d.stage.chunks);
    const char *names[] = {"a", "b", "c"};
    for (size_t i = 0; i < d.n_tensors; i++) {
        const wb_model_tensor *t = &d.tensors[i];
        size_t k = (size_t)(strchr("abc", t->name[0]) - "abc");
        ck_assert_str_eq(t->name, names[k]);
        ck_assert_mem_eq((const uint8_t *)d.slabs[0].dev_ptr + t->offset, data + k * 20000, 20000);
        ck_assert_uint_eq(t->xxh3, XXH3_64bits(data + k * 20000, 20000));
    }
    wb__model_data_free(&d, be);

    /* A failed allocation: its message, no copy, and the ring serves the
     * next load. */
    alloc_mode = 2;
    fdev.copies = 0;
    ck_assert_int_eq(wb__load_ex(path, &o, &d, &err), WB_ENOMEM);
    ck_assert_ptr_nonnull(strstr(err.msg, "no room on device 0 for"));
    ck_assert_uint_eq(fdev.copies, 0);
    alloc_mode = 0;
    ck_assert_msg(wb__load_ex(path, &o, &d, &err) == WB_OK, "%s", err.msg);
    ck_assert_uint_eq(fdev.copies, d.stage.chunks);
    wb__model_data_free(&d, be);

    /* Nothing to copy: the slab is allocated all the same. */
    const char *empty = "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}";
    snprintf(path, sizeof path, "%s", write_st("e.safetensors", empty, NULL, 0));
    fdev.copies = 0;
    ck_assert_msg(wb__load_ex(path, &o, &d, &err) == WB_OK, "%s", err.msg);
    ck_assert_uint_eq(d.n_slabs, 1);
    ck_assert_ptr_nonnull(d.slabs[0].dev_ptr);
    ck_assert_uint_eq(fdev.copies, 0);
    ck_assert_uint_eq(d.tensors[0].xxh3, XXH3_64bits("", 0));
    wb__model_data_free(&d, be);
    free(fdev.mem);
}
END_TEST

/* The host backend's readers populate the slab range by range: the ranges
 * they prepare tile the whole slab, gaps between tensors included, each
 * byte once, one range per chunk; a range that cannot be had fails the load
 * with the backend's message and leaves nothing allocated. */
static pthread_mutex_t prep_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t prep_off[4096], prep_len[4096];
static size_t n_prep;
static uint64_t prep_fail_at = UINT64_MAX;

static int recording_prepare(wb_slab *slab, uint64_t offset, uint64_t len, wb_err *err)
{
    pthread_mutex_lock(&prep_mu);
    ck_assert_uint_lt(n_prep, 4096);
    prep_off[n_prep] = offset;
    prep_len[n_prep++] = len;
    pthread_mutex_unlock(&prep_mu);
    if (offset <= prep_fail_at && prep_fail_at - offset < len)
        return wb__err_set(err, WB_ENOMEM, "no memory for byte %llu",
                           (unsigned long long)prep_fail_at);
    return wb__backend_host.slab_prepare(slab, offset, len, err);
}

static int by_off(const void *a, const void *b)
{
    uint64_t x = prep_off[*(const size_t *)a], y = prep_off[*(const size_t *)b];
    return (x > y) - (x < y);
}

START_TEST(test_load_direct_prepares_every_byte)
{
    use_read_source(_i);
    wb_backend host = host_be;
    ck_assert_ptr_nonnull(host.slab_prepare);
    host.slab_prepare = recording_prepare;
    host.stage.read_threads = 2;
    host.stage.chunk_bytes = 1024;
    wb_model_data d;
    wb_err err;
    const char *path = data_path("official/gpt2/model.safetensors");
    n_prep = 0;
    prep_fail_at = UINT64_MAX;
    ck_assert_msg(wb__load(path, &host, -1, NULL, &d, &err) == WB_OK, "%s", err.msg);
    ck_assert_uint_eq(n_prep, d.stage.chunks);
    ck_assert_uint_gt(n_prep, 2);
    size_t idx[4096];
    for (size_t i = 0; i < n_prep; i++)
        idx[i] = i;
    qsort(idx, n_prep, sizeof idx[0], by_off);
    uint64_t at = 0;
    for (size_t i = 0; i + 1 < n_prep; i++) {
        ck_assert_uint_eq(prep_off[idx[i]], at);
        at += prep_len[idx[i]];
    }
    ck_assert_uint_eq(prep_off[idx[n_prep - 1]], at);
    ck_assert_uint_ge(prep_len[idx[n_prep - 1]], d.slabs[0].size - at); /* to the end */
    /* Every tensor's bytes are the file's (the checksums were computed
     * from the slab). */
    for (size_t i = 0; i < d.n_tensors; i++) {
        const uint8_t *p = (const uint8_t *)d.slabs[0].shm.addr + d.tensors[i].offset;
        ck_assert_uint_eq(XXH3_64bits(p, d.tensors[i].nbytes), d.tensors[i].xxh3);
    }
    wb__model_data_free(&d, &host);

    n_prep = 0;
    prep_fail_at = 100000;
    ck_assert_int_eq(wb__load(path, &host, -1, NULL, &d, &err), WB_ENOMEM);
    ck_assert_str_eq(err.msg, "no memory for byte 100000");
    ck_assert_uint_eq(d.n_slabs, 0);
    prep_fail_at = UINT64_MAX;
}
END_TEST

/* The host backend with loader settings: the direct path uses them. */
START_TEST(test_load_direct_settings)
{
    use_read_source(_i);
    wb_backend host = host_be;
    host.stage.read_threads = 2;
    host.stage.chunk_bytes = 1024;
    wb_load_progress prog = {0};
    wb_load_opts o = {.backend = &host, .device = -1, .progress = &prog};
    wb_model_data d;
    wb_err err;
    const char *path = data_path("official/gpt2/model.safetensors");
    /* In the page cache, as auto's choice below assumes. */
    warm(path);
    ck_assert_msg(wb__load_ex(path, &o, &d, &err) == WB_OK, "%s", err.msg);
    ck_assert_int_eq(d.stage.mode, WB_STAGE_DIRECT);
    /* auto reads the fixture, cached above, from its mapping. */
    ck_assert_int_eq(d.stage.read_source,
                     cur_read == WB_STAGE_READ_AUTO ? WB_STAGE_READ_MMAP_NT : cur_read);
    ck_assert_uint_eq(d.stage.threads, 2);
    ck_assert_uint_eq(d.read_threads, 2);
    ck_assert_uint_eq(d.stage.chunk_bytes, 1024);
    ck_assert_uint_gt(d.stage.chunks, d.n_tensors);
    ck_assert_uint_eq(atomic_load(&prog.landed), d.bytes);
    ck_assert(d.stage.read_busy > 0);
    Wbproto__ModelInfo mi = WBPROTO__MODEL_INFO__INIT;
    wb_model *m = wb__model_new("m", path, &host, -1);
    ck_assert_int_eq(wb__model_adopt(m, &d, &err), WB_OK);
    wb__load_fill_model_info(m, &mi);
    ck_assert_str_eq(mi.load_mode, "direct");
    ck_assert_uint_eq(mi.staging_buffers, 0);
    ck_assert(mi.read_gbps > 0);
    wb__model_free(&m);

    /* A staged backend without its ring is a bug, said as such. */
    host.load_mode = WB_STAGE_STAGED;
    ck_assert_int_eq(wb__load_ex(path, &o, &d, &err), WB_EINTERNAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "has no staging ring"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_load_hand_written, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_load_official, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_load_errors, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_load_cancelled, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_test(tc, test_job_cancelled);
    tcase_add_test(tc, test_background_loader);
    tcase_add_test(tc, test_loader_stop_returns_queued);
    tcase_add_loop_test(tc, test_load_staged_progress, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_test(tc, test_load_staged_allocates_while_reading);
    tcase_add_loop_test(tc, test_load_direct_settings, WB_STAGE_READ_PREAD, WB_STAGE_READ_AUTO + 1);
    tcase_add_loop_test(tc, test_load_direct_prepares_every_byte, WB_STAGE_READ_PREAD,
                        WB_STAGE_READ_AUTO + 1);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
