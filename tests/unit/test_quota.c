/* Configured limits: leases per client, models, tensors per model, shard
 * files per index, message size and safetensors header size. Each refusal
 * is WB_ELIMIT with a message that names the limit and its value, and leaves
 * nothing behind. */
/* The test defines open() itself (below); glibc's fortified inline one
 * would clash with it. */
#undef _FORTIFY_SOURCE
#include "broker_fixture.h"
#include "fdchan_wire.h"
#include "ops.h"
#include "quota.h"
#include "wire.h"

#include <check.h>

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static broker_fixture F;

/* open() as the broker sees it in this test: counts the opens of
 * `watch_path`, and after the first one replaces that link with one to
 * `swap_to`, as a hostile peer racing the load check would. */
static const char *watch_path, *swap_to;
static int watch_opens;

int open(const char *path, int flags, ...)
{
    static int (*real_open)(const char *, int, ...);
    if (!real_open)
        *(void **)&real_open = dlsym(RTLD_NEXT, "open");
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    int fd = real_open(path, flags, mode);
    if (watch_path && strcmp(path, watch_path) == 0 && watch_opens++ == 0 && swap_to) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s.swap", watch_path);
        if (symlink(swap_to, tmp) != 0 || rename(tmp, watch_path) != 0)
            watch_opens = -1000; /* fails the test's count */
    }
    return fd;
}

static void setup(void)
{
    fixture_open(&F, "quota");
}

static void teardown(void)
{
    fixture_close(&F);
}

/* Every request here comes from this test process. */
static Wbproto__Reply *acquire(const char *model)
{
    wb_peer_creds p = me();
    return fixture_acquire(&F, &p, model);
}

static Wbproto__Reply *release(const uint8_t *id)
{
    wb_peer_creds p = me();
    return fixture_release(&F, &p, id);
}

static Wbproto__Reply *load(const char *name, const char *path)
{
    wb_peer_creds p = me();
    return fixture_load(&F, &p, name, path);
}

/* Writes a safetensors file of n U8 tensors of 4 bytes, named with a prefix
 * of `pad` characters (to make lease replies large). When fake_len is not
 * zero, the length field claims that instead of the real header length. */
static void write_model(const char *path, int n, int pad, uint64_t fake_len)
{
    size_t cap = (size_t)n * (size_t)(pad + 96) + 16;
    char *h = malloc(cap);
    ck_assert_ptr_nonnull(h);
    size_t used = (size_t)snprintf(h, cap, "{");
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(
            h + used, cap - used,
            "%s\"%.*s%d\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[%d,%d]}", i ? "," : "",
            pad,
            "tttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt"
            "tttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt",
            i, 4 * i, 4 * i + 4);
    used += (size_t)snprintf(h + used, cap - used, "}");
    uint64_t len = fake_len ? fake_len : used;
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(len >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(h, 1, used, f);
    for (int i = 0; i < 4 * n; i++)
        fputc(i & 0xff, f);
    fclose(f);
    free(h);
}

/* Slab names of this process (the broker here) in /dev/shm. */
static int my_slabs(void)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "wb-%ld-", (long)getpid());
    DIR *d = opendir("/dev/shm");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

START_TEST(messages_name_the_limit)
{
    wb_limits l;
    wb__limits_default(&l);
    ck_assert_uint_eq(l.max_leases_per_client, 1024);
    ck_assert_uint_eq(l.max_models, 64);
    ck_assert_uint_eq(l.max_tensors, 1000000);
    ck_assert_uint_eq(l.max_shards, 4096);
    ck_assert_uint_eq(l.max_message, WB_MAX_MESSAGE);
    ck_assert_uint_eq(l.max_header, 100000000);
    wb_err err;
    ck_assert_int_eq(wb__limits_check_leases(&l, 7, 1000, 1023, &err), WB_OK);
    ck_assert_int_eq(wb__limits_check_leases(&l, 7, 1000, 1024, &err), WB_ELIMIT);
    ck_assert_str_eq(err.msg,
                     "pid 7 already holds 1024 leases, the limit (--max-leases-per-client 1024)");
    ck_assert_int_eq(wb__limits_check_leases(&l, WB_SESSION_ID_BASE + 3, 1000, 1024, &err),
                     WB_ELIMIT);
    ck_assert_str_eq(err.msg, "the sessions of uid 1000 (pid hidden) already hold 1024 leases "
                              "together, the limit (--max-leases-per-client 1024)");
    ck_assert_int_eq(wb__limits_check_models(&l, 63, &err), WB_OK);
    ck_assert_int_eq(wb__limits_check_models(&l, 64, &err), WB_ELIMIT);
    ck_assert_str_eq(err.msg, "the broker already holds 64 models, the limit (--max-models 64); "
                              "unload one first");
    ck_assert_int_eq(wb__limits_check_tensors(&l, "m", 1000000, &err), WB_OK);
    ck_assert_int_eq(wb__limits_check_tensors(&l, "m", 1000001, &err), WB_ELIMIT);
    ck_assert_str_eq(err.msg,
                     "model 'm' has 1000001 tensors, over the limit of 1000000 (--max-tensors)");
    ck_assert_int_eq(wb__limits_check_shards(&l, "/m/i.json", 4096, &err), WB_OK);
    ck_assert_int_eq(wb__limits_check_shards(&l, "/m/i.json", 4097, &err), WB_ELIMIT);
    ck_assert_str_eq(err.msg, "/m/i.json: the index names 4097 shard files, over the limit of "
                              "4096 (--max-shards)");
    l.max_message = 4096;
    ck_assert_int_eq(wb__limits_check_lease_size(&l, "m", 3072, &err), WB_OK);
    ck_assert_int_eq(wb__limits_check_lease_size(&l, "m", 3073, &err), WB_ELIMIT);
    ck_assert_str_eq(err.msg, "a lease of model 'm' would take 4097 bytes, over the 4096-byte "
                              "message limit (--max-message-bytes)");
}
END_TEST

/* Container record bytes per client: the default and the refusal. */
START_TEST(record_bytes)
{
    wb_limits l;
    wb__limits_default(&l);
    ck_assert_uint_eq(l.max_record_bytes, 1024u * 1024u);
    wb_err err;
    ck_assert_int_eq(wb__limits_check_records(&l, 42, 1024u * 1024u, &err), WB_OK);
    ck_assert_int_eq(wb__limits_check_records(&l, 42, 1024u * 1024u + 1, &err), WB_ELIMIT);
    ck_assert_str_eq(err.msg, "pid 42 would keep 1048577 bytes of container records, over the "
                              "limit of 1048576 bytes per client");
}
END_TEST

START_TEST(leases_per_client)
{
    fixture_model(&F.b, "demo");
    F.b.limits.max_leases_per_client = 2;
    uint8_t first[WB_LEASE_ID_LEN];
    Wbproto__Reply *r = acquire("demo");
    ck_assert_int_eq(r->status, 0);
    memcpy(first, r->acquire->lease->id.data, WB_LEASE_ID_LEN);
    ck_assert_int_eq(acquire("demo")->status, 0);
    r = acquire("demo");
    ck_assert_int_eq(r->status, WB_ELIMIT);
    char want[160];
    snprintf(want, sizeof want,
             "pid %ld already holds 2 leases, the limit (--max-leases-per-client 2)",
             (long)getpid());
    ck_assert_str_eq(r->error, want);
    ck_assert_uint_eq(F.b.leases.n_leases, 2);
    /* Below the limit again after a release. */
    ck_assert_int_eq(release(first)->status, 0);
    ck_assert_int_eq(acquire("demo")->status, 0);
}
END_TEST

START_TEST(models)
{
    fixture_model(&F.b, "demo");
    F.b.limits.max_models = 1;
    char path[128];
    snprintf(path, sizeof path, "%s/m.safetensors", F.dir);
    write_model(path, 2, 1, 0);
    Wbproto__Reply *r = load("second", path);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    ck_assert_str_eq(r->error, "the broker already holds 1 model, the limit (--max-models 1); "
                               "unload one first");
    ck_assert_ptr_null(wb__models_find(&F.b.models, "second"));
    F.b.limits.max_models = 2;
    r = load("second", path);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
}
END_TEST

START_TEST(tensors)
{
    F.b.limits.max_tensors = 2;
    char path[128];
    snprintf(path, sizeof path, "%s/three.safetensors", F.dir);
    write_model(path, 3, 1, 0);
    int before = my_slabs();
    Wbproto__Reply *r = load("three", path);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    ck_assert_str_eq(r->error, "model 'three' has 3 tensors, over the limit of 2 (--max-tensors)");
    ck_assert_ptr_null(wb__models_find(&F.b.models, "three"));
    ck_assert_uint_eq(F.b.stats.loads_failed, 1);
    ck_assert_int_eq(my_slabs(), before); /* its slab is gone */
    advance_ms(1);
    ck_assert(!shm_name_exists("/wb-0-00000000000000000000000000000000"));

    /* A sharded checkpoint's index says how many tensors there are: refused
     * before anything is read. */
    char index[160], shard[160];
    snprintf(shard, sizeof shard, "%s/shard-1.safetensors", F.dir);
    write_model(shard, 3, 1, 0);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", F.dir);
    FILE *f = fopen(index, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"weight_map\":{\"t0\":\"shard-1.safetensors\",\"t1\":\"shard-1.safetensors\","
               "\"t2\":\"shard-1.safetensors\"}}");
    fclose(f);
    r = load("sharded", F.dir);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    ck_assert_str_eq(r->error,
                     "model 'sharded' has 3 tensors, over the limit of 2 (--max-tensors)");
    ck_assert_uint_eq(F.b.stats.loads_total, 1); /* only the first load ran */
    F.b.limits.max_tensors = 3;
    r = load("sharded", index);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
    ck_assert_uint_eq(r->load->model->tensors, 3);
}
END_TEST

/* Shard files one index names: refused once the index is read, before any
 * shard is opened (the third is not even there), and not counted as a
 * load. */
START_TEST(shards)
{
    F.b.limits.max_shards = 2;
    char sub[128], shard[160], index[160], want[400];
    snprintf(sub, sizeof sub, "%s/three", F.dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    for (int k = 0; k < 2; k++) {
        snprintf(shard, sizeof shard, "%s/s%d.safetensors", sub, k);
        write_model(shard, 1, k + 1, 0); /* "t0", "tt0" */
    }
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", sub);
    FILE *f = fopen(index, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"weight_map\":{\"t0\":\"s0.safetensors\",\"tt0\":\"s1.safetensors\","
               "\"ttt0\":\"s2.safetensors\"}}");
    fclose(f);
    Wbproto__Reply *r = load("three", sub);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    snprintf(want, sizeof want,
             "%s: the index names 3 shard files, over the limit of 2 (--max-shards)", index);
    ck_assert_str_eq(r->error, want);
    ck_assert_ptr_null(wb__models_find(&F.b.models, "three"));
    ck_assert_uint_eq(F.b.stats.loads_total, 0);
    /* Within the limit, the missing third shard is what fails. */
    F.b.limits.max_shards = 3;
    r = load("three", sub);
    ck_assert_int_eq(r->status, WB_ENOTFOUND);
    ck_assert_ptr_nonnull(
        strstr(r->error, "shard 's2.safetensors' (holding tensor 'ttt0') is missing"));
    ck_assert_uint_eq(F.b.stats.loads_failed, 1);
}
END_TEST

START_TEST(message_size)
{
    F.b.limits.max_message = 4096;
    char path[128];
    snprintf(path, sizeof path, "%s/wide.safetensors", F.dir);
    write_model(path, 40, 100, 0); /* 40 tensors with 100-character names */
    Wbproto__Reply *r = load("wide", path);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    ck_assert_ptr_nonnull(strstr(r->error, "a lease of model 'wide' would take "));
    ck_assert_ptr_nonnull(
        strstr(r->error, "bytes, over the 4096-byte message limit (--max-message-bytes)"));
    ck_assert_ptr_null(wb__models_find(&F.b.models, "wide"));
    F.b.limits.max_message = WB_MAX_MESSAGE;
    r = load("wide", path);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
}
END_TEST

START_TEST(header_size)
{
    char path[128], want[300];
    snprintf(path, sizeof path, "%s/h.safetensors", F.dir);
    /* The length field claims a header larger than the safetensors limit:
     * refused from the first 8 bytes, as a limit. */
    write_model(path, 1, 1, 100000001);
    Wbproto__Reply *r = load("h", path);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    snprintf(want, sizeof want,
             "%s: the safetensors header is 100000001 bytes, over the limit of 100000000 "
             "(--max-header-bytes)",
             path);
    ck_assert_str_eq(r->error, want);
    ck_assert_uint_eq(F.b.stats.loads_total, 0);

    /* A configured, smaller limit. */
    write_model(path, 2, 1, 0);
    F.b.limits.max_header = 64;
    r = load("h", path);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    ck_assert_ptr_nonnull(strstr(r->error, "over the limit of 64 (--max-header-bytes)"));
    /* ... also for each shard an index names. */
    char sub[128], shard[160], index[160];
    snprintf(sub, sizeof sub, "%s/sharded", F.dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    snprintf(shard, sizeof shard, "%s/a.safetensors", sub);
    write_model(shard, 2, 1, 0);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", sub);
    FILE *f = fopen(index, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"weight_map\":{\"t0\":\"a.safetensors\",\"t1\":\"a.safetensors\"}}");
    fclose(f);
    r = load("s", sub);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    snprintf(want, sizeof want, "%s: the safetensors header is", shard);
    ck_assert_msg(strncmp(r->error, want, strlen(want)) == 0, "got: %s", r->error);
    F.b.limits.max_header = 100000000;
    r = load("s", sub);
    ck_assert_msg(r->status == 0, "load: %s", r->error);
}
END_TEST

/* The header and tensor-count limits are judged on the descriptors whose
 * access was judged, by the loader's checks: a link swapped after the check
 * opened its file is not followed by the checks or the header read, and the
 * limit message cannot echo the 8-byte length field of the file it now
 * names; the data reader, which opens the path again, finds the change. */
START_TEST(limits_on_the_judged_descriptor)
{
    char good[160], secret[160], link_path[160];
    snprintf(good, sizeof good, "%s/good.safetensors", F.dir);
    snprintf(secret, sizeof secret, "%s/secret.bin", F.dir);
    snprintf(link_path, sizeof link_path, "%s/link.safetensors", F.dir);
    write_model(good, 2, 1, 0);
    FILE *f = fopen(secret, "wb");
    ck_assert_ptr_nonnull(f);
    fputs("AAAAAAAAsecret", f); /* a length field of 0x4141414141414141 */
    fclose(f);
    ck_assert_int_eq(symlink(good, link_path), 0);
    F.b.limits.max_header = 1000;

    watch_path = link_path;
    swap_to = secret;
    watch_opens = 0;
    Wbproto__Reply *r = load("raced", link_path);
    watch_path = swap_to = NULL;
    ck_assert_int_eq(r->status, WB_EFORMAT);
    ck_assert_msg(strstr(r->error, "changed while loading") != NULL, "got: %s", r->error);
    ck_assert_ptr_null(strstr(r->error, "4702111234474983745"));
    /* Judged, limited and its header read through one open; the data
     * reader's is the second. */
    ck_assert_int_eq(watch_opens, 2);
    ck_assert_ptr_null(wb__models_find(&F.b.models, "raced"));
    ck_assert_uint_eq(F.b.stats.loads_failed, 1);

    /* The same checks still refuse what is over the limits, with the
     * messages of before, and that refusal is not a load. */
    ck_assert_int_eq(unlink(link_path), 0);
    ck_assert_int_eq(symlink(secret, link_path), 0);
    r = load("secret", link_path);
    ck_assert_int_eq(r->status, WB_ELIMIT);
    char want[300];
    snprintf(want, sizeof want,
             "%s: the safetensors header is 4702111234474983745 bytes, over the limit of 1000 "
             "(--max-header-bytes)",
             link_path);
    ck_assert_str_eq(r->error, want);
    ck_assert_ptr_null(wb__models_find(&F.b.models, "secret"));
    ck_assert_uint_eq(F.b.stats.loads_total, 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("quota");
    TCase *tc = tcase_create("quota");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, messages_name_the_limit);
    tcase_add_test(tc, leases_per_client);
    tcase_add_test(tc, record_bytes);
    tcase_add_test(tc, models);
    tcase_add_test(tc, tensors);
    tcase_add_test(tc, shards);
    tcase_add_test(tc, message_size);
    tcase_add_test(tc, header_size);
    tcase_add_test(tc, limits_on_the_judged_descriptor);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
