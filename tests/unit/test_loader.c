/* The loader: a checkpoint's tensors land in one slab at 256-byte aligned
 * offsets with exactly the file's bytes and correct XXH3-64 checksums; load
 * errors come back with the reader's message; a cancelled load frees what it
 * allocated; the background loader hands finished and abandoned jobs back. */
#include "loader.h"
#include "safetensors.h"

#include <check.h>
#include <xxhash.h>

#include <fcntl.h>
#include <poll.h>
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
    ck_assert_int_eq(wb__load(path, &wb__backend_host, -1, NULL, &d, &err), WB_OK);
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
    wb__model_data_free(&d, &wb__backend_host);
    ck_assert(!shm_exists(name));
    ck_assert_uint_eq(d.n_tensors, 0);
}
END_TEST

/* Checkpoints written by the official libraries, one file and sharded. */
static void check_against_files(const char *path)
{
    wb_model_data d;
    wb_err err;
    ck_assert_msg(wb__load(path, &wb__backend_host, -1, NULL, &d, &err) == WB_OK, "%s: %s", path,
                  err.msg);
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
    wb__model_data_free(&d, &wb__backend_host);
}

START_TEST(test_load_official)
{
    check_against_files(data_path("official/all_dtypes.safetensors"));
    check_against_files(data_path("official/gpt2/model.safetensors"));
    check_against_files(data_path("official/gpt2_sharded"));
}
END_TEST

START_TEST(test_load_errors)
{
    wb_model_data d;
    wb_err err;
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.safetensors", tmpdir);
    ck_assert_int_eq(wb__load(missing, &wb__backend_host, -1, NULL, &d, &err), WB_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, missing));
    ck_assert_uint_eq(d.n_slabs, 0);

    /* Data section shorter than the header says: the reader's message, with
     * the file's name. */
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    uint8_t data[8] = {0};
    const char *path = write_st("short.safetensors", hdr, data, sizeof data);
    ck_assert_int_eq(wb__load(path, &wb__backend_host, -1, NULL, &d, &err), WB_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "short.safetensors"));
    ck_assert_uint_eq(d.n_slabs, 0);
}
END_TEST

START_TEST(test_load_cancelled)
{
    uint8_t data[64] = {1};
    const char *hdr = "{\"a\":{\"dtype\":\"U8\",\"shape\":[64],\"data_offsets\":[0,64]}}";
    const char *path = write_st("c.safetensors", hdr, data, sizeof data);
    atomic_int cancel;
    atomic_init(&cancel, 1);
    wb_model_data d;
    wb_err err;
    ck_assert_int_eq(wb__load(path, &wb__backend_host, -1, &cancel, &d, &err), WB_ESTATE);
    ck_assert_ptr_nonnull(strstr(err.msg, "cancelled"));
    ck_assert_uint_eq(d.n_slabs, 0);
    ck_assert_ptr_null(d.slabs);
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

int main(void)
{
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_load_hand_written);
    tcase_add_test(tc, test_load_official);
    tcase_add_test(tc, test_load_errors);
    tcase_add_test(tc, test_load_cancelled);
    tcase_add_test(tc, test_background_loader);
    tcase_add_test(tc, test_loader_stop_returns_queued);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
