/* UUID to ordinal mapping with a fake device list (built here, as a process
 * with CUDA_VISIBLE_DEVICES=1 would see a two-GPU node: the broker's device
 * 1 is this process's device 0). No GPU is involved. */
#include "devlist.h"

#include <check.h>

#include <stdlib.h>
#include <string.h>

#define U0 "GPU-11111111-2222-3333-4444-555555555555"
#define U1 "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"

START_TEST(formats_and_validates_uuids)
{
    const uint8_t b[16] = {0x3b, 0x1e, 0x00, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0xab};
    char u[WB_GPU_UUID_SIZE];
    wb__gpu_uuid_format(b, u);
    ck_assert_str_eq(u, "GPU-3b1e00ff-0102-0304-0506-0708090a0bab");
    ck_assert_int_eq(wb__gpu_uuid_valid(u), 1);
    ck_assert_int_eq(wb__gpu_uuid_valid("MIG-3b1e00ff-0102-0304-0506-0708090a0bab"), 1);
    ck_assert_int_eq(wb__gpu_uuid_valid("GPU-3B1E00FF-0102-0304-0506-0708090A0BAB"), 1);
    ck_assert_int_eq(wb__gpu_uuid_valid("GPU-3b1e00ff-0102-0304-0506-0708090a0ba"), 0);
    ck_assert_int_eq(wb__gpu_uuid_valid("GPU-3b1e00ff-0102-0304-0506-0708090a0babc"), 0);
    ck_assert_int_eq(wb__gpu_uuid_valid("GPU-3b1e00ff0102-0304-0506-0708090a0bab-"), 0);
    ck_assert_int_eq(wb__gpu_uuid_valid("XPU-3b1e00ff-0102-0304-0506-0708090a0bab"), 0);
    ck_assert_int_eq(wb__gpu_uuid_valid(NULL), 0);
}
END_TEST

START_TEST(maps_the_brokers_uuid_to_the_local_ordinal)
{
    /* Fake: this process sees only the node's second GPU, as its device 0. */
    wb_gpu_list mine = {.n = 1};
    mine.dev[0].index = 0;
    strcpy(mine.dev[0].uuid, U1);
    wb_err err;
    int local = 7;
    ck_assert_int_eq(wb__devlist_map(&mine, 1, U1, &local, &err), WB_OK);
    ck_assert_int_eq(local, 0);
    /* The broker's device 0 is not visible here. */
    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    ck_assert_int_eq(wb__devlist_map(&mine, 0, U0, &local, &err), WB_ENOGPU);
    ck_assert_int_eq(local, -1);
    ck_assert_str_eq(err.msg, "device " U0 " (the broker's device 0) is not visible in this "
                              "process, which sees: 0=" U1 " (CUDA_VISIBLE_DEVICES=1)");
    unsetenv("CUDA_VISIBLE_DEVICES");
    ck_assert_int_eq(wb__devlist_map(&mine, 0, U0, &local, &err), WB_ENOGPU);
    ck_assert_ptr_nonnull(strstr(err.msg, "(CUDA_VISIBLE_DEVICES=unset)"));
    /* A broker without UUIDs: the ordinal is taken as it is, when it exists. */
    ck_assert_int_eq(wb__devlist_map(&mine, 0, "", &local, &err), WB_OK);
    ck_assert_int_eq(local, 0);
    ck_assert_int_eq(wb__devlist_map(&mine, 3, NULL, &local, &err), WB_ENOGPU);
    ck_assert_str_eq(err.msg, "the broker's device 3 (no UUID given) is not visible in this "
                              "process, which sees: 0=" U1);
    wb_gpu_list none = {.n = 0};
    ck_assert_int_eq(wb__devlist_map(&none, 0, U0, &local, &err), WB_ENOGPU);
    ck_assert_ptr_nonnull(strstr(err.msg, "which sees: none"));
}
END_TEST

START_TEST(finds_by_uuid_and_index)
{
    wb_gpu_list l = {.n = 2};
    l.dev[0].index = 0;
    strcpy(l.dev[0].uuid, U0);
    l.dev[1].index = 1;
    strcpy(l.dev[1].uuid, U1);
    ck_assert_ptr_eq(wb__devlist_find_uuid(&l, U1), &l.dev[1]);
    ck_assert_ptr_eq(wb__devlist_find_uuid(&l, "GPU-AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE"),
                     &l.dev[1]);
    ck_assert_ptr_null(wb__devlist_find_uuid(&l, "GPU-00000000-0000-0000-0000-000000000000"));
    ck_assert_ptr_null(wb__devlist_find_uuid(&l, NULL));
    ck_assert_ptr_eq(wb__devlist_find_index(&l, 0), &l.dev[0]);
    ck_assert_ptr_null(wb__devlist_find_index(&l, 2));
    char buf[16];
    wb__devlist_describe(&l, buf, sizeof buf); /* cut, still terminated */
    ck_assert_uint_eq(strlen(buf), sizeof buf - 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("devlist");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, formats_and_validates_uuids);
    tcase_add_test(tc, maps_the_brokers_uuid_to_the_local_ordinal);
    tcase_add_test(tc, finds_by_uuid_and_index);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
