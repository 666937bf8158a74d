/* The process-wide slab mapping cache: one mapping per slab, shared by the
 * leases that use it, unmapped when the last reference goes. */
#include "mapcache.h"
#include "shm.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

/* Counts this process's read-only shared mappings of `name` in
 * /proc/self/maps (the broker side's read-write mapping is not counted). */
static int ro_mappings(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char perms[8] = {0};
        if (sscanf(line, "%*s %7s", perms) == 1 && strcmp(perms, "r--s") == 0 &&
            strstr(line, name + 1)) /* maps show /dev/shm/wb-..., the name has a leading '/' */
            n++;
    }
    fclose(f);
    return n;
}

static void make_slab(wb_shm *shm, uint64_t size, unsigned char fill)
{
    wb_err err;
    ck_assert_int_eq(wb__shm_create(shm, size, &err), WB_OK);
    memset(shm->addr, fill, (size_t)shm->size);
}

static void drop_slab(wb_shm *shm)
{
    wb__shm_unlink(shm);
    wb__shm_unmap(shm);
}

START_TEST(two_leases_share_one_mapping)
{
    wb_shm slab;
    make_slab(&slab, 8192, 0x5a);
    wb_err err;
    wb__map *a = NULL, *b = NULL;
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    ck_assert_int_eq(wb__mapcache_get_host(slab.name, slab.size, &a, &err), WB_OK);
    ck_assert_int_eq(wb__mapcache_get_host(slab.name, slab.size, &b, &err), WB_OK);
    ck_assert_ptr_eq(a, b);
    ck_assert_ptr_eq(wb__map_addr(a), wb__map_addr(b));
    ck_assert_uint_eq(wb__map_refs(a), 2);
    ck_assert_uint_eq(wb__map_size(a), 8192);
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    ck_assert_int_eq(ro_mappings(slab.name), 1);
    ck_assert_uint_eq(((const unsigned char *)wb__map_addr(a))[8191], 0x5a);

    wb__mapcache_put(&a);
    ck_assert_ptr_null(a);
    ck_assert_uint_eq(wb__map_refs(b), 1);
    ck_assert_uint_eq(wb__mapcache_count(), 1);
    ck_assert_int_eq(ro_mappings(slab.name), 1);
    ck_assert_uint_eq(((const unsigned char *)wb__map_addr(b))[0], 0x5a);

    wb__mapcache_put(&b);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    ck_assert_int_eq(ro_mappings(slab.name), 0);
    drop_slab(&slab);
}
END_TEST

START_TEST(distinct_slabs_distinct_mappings)
{
    wb_shm s1, s2;
    make_slab(&s1, 4096, 1);
    make_slab(&s2, 4096, 2);
    wb_err err;
    wb__map *a = NULL, *b = NULL;
    ck_assert_int_eq(wb__mapcache_get_host(s1.name, s1.size, &a, &err), WB_OK);
    ck_assert_int_eq(wb__mapcache_get_host(s2.name, s2.size, &b, &err), WB_OK);
    ck_assert_ptr_ne(a, b);
    ck_assert_ptr_ne(wb__map_addr(a), wb__map_addr(b));
    ck_assert_uint_eq(wb__mapcache_count(), 2);
    ck_assert_uint_eq(((const unsigned char *)wb__map_addr(a))[0], 1);
    ck_assert_uint_eq(((const unsigned char *)wb__map_addr(b))[0], 2);
    wb__mapcache_put(&a);
    ck_assert_int_eq(ro_mappings(s1.name), 0);
    ck_assert_int_eq(ro_mappings(s2.name), 1);
    wb__mapcache_put(&b);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    drop_slab(&s1);
    drop_slab(&s2);
}
END_TEST

/* The mapping outlives the name: a broker that unlinks (or dies) does not
 * take the bytes away from a lease that holds them. */
START_TEST(mapping_survives_unlink)
{
    wb_shm slab;
    make_slab(&slab, 4096, 7);
    char name[WB_SHM_NAME_MAX];
    snprintf(name, sizeof name, "%s", slab.name);
    wb_err err;
    wb__map *a = NULL;
    ck_assert_int_eq(wb__mapcache_get_host(name, 4096, &a, &err), WB_OK);
    drop_slab(&slab);
    ck_assert_uint_eq(((const unsigned char *)wb__map_addr(a))[100], 7);
    /* A new lease on the same (now unlinked) name still finds the mapping. */
    wb__map *b = NULL;
    ck_assert_int_eq(wb__mapcache_get_host(name, 4096, &b, &err), WB_OK);
    ck_assert_ptr_eq(a, b);
    wb__mapcache_put(&a);
    wb__mapcache_put(&b);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    /* Now the name is gone and nothing maps it. */
    ck_assert_int_eq(wb__mapcache_get_host(name, 4096, &a, &err), WB_ENOTFOUND);
    ck_assert_ptr_null(a);
    ck_assert_ptr_nonnull(strstr(err.msg, name));
}
END_TEST

START_TEST(size_mismatch_refused)
{
    wb_shm slab;
    make_slab(&slab, 4096, 3);
    wb_err err;
    wb__map *a = NULL, *b = NULL;
    ck_assert_int_eq(wb__mapcache_get_host(slab.name, 4096, &a, &err), WB_OK);
    ck_assert_int_eq(wb__mapcache_get_host(slab.name, 8192, &b, &err), WB_EPROTO);
    ck_assert_ptr_null(b);
    ck_assert_ptr_nonnull(strstr(err.msg, slab.name));
    ck_assert_ptr_nonnull(strstr(err.msg, "8192"));
    ck_assert_uint_eq(wb__map_refs(a), 1);
    wb__mapcache_put(&a);
    /* A first mapping with the wrong size fails in the shm layer. */
    ck_assert_int_eq(wb__mapcache_get_host(slab.name, 8192, &b, &err), WB_EPROTO);
    ck_assert_uint_eq(wb__mapcache_count(), 0);
    drop_slab(&slab);
}
END_TEST

START_TEST(bad_names_and_null)
{
    wb_err err;
    wb__map *a = (wb__map *)&err;
    ck_assert_int_eq(wb__mapcache_get_host(NULL, 4096, &a, &err), WB_EPROTO);
    ck_assert_ptr_null(a);
    ck_assert_int_ne(wb__mapcache_get_host("/etc-passwd", 4096, &a, &err), WB_OK);
    ck_assert_ptr_null(a);
    ck_assert_ptr_nonnull(strstr(err.msg, "/etc-passwd"));
    wb__mapcache_put(NULL);
    wb__mapcache_put(&a);
    ck_assert_ptr_null(wb__map_addr(NULL));
    ck_assert_uint_eq(wb__mapcache_count(), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mapcache");
    TCase *tc = tcase_create("mapcache");
    tcase_add_test(tc, two_leases_share_one_mapping);
    tcase_add_test(tc, distinct_slabs_distinct_mappings);
    tcase_add_test(tc, mapping_survives_unlink);
    tcase_add_test(tc, size_mismatch_refused);
    tcase_add_test(tc, bad_names_and_null);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
