/* Placement texts ("@0,1", "@all", "@GPU-...") parse or are refused with the
 * text and the position of the fault; resolving against a fake device list
 * (built here, not read from a GPU) maps UUIDs and ordinals and refuses
 * devices that are not there. */
#include "placement.h"

#include <check.h>

#include <string.h>

#define U0 "GPU-11111111-2222-3333-4444-555555555555"
#define U1 "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"

/* A fake list: two devices, as a broker that sees both would have. */
static wb_gpu_list fake_two(void)
{
    wb_gpu_list l = {.n = 2};
    l.dev[0].index = 0;
    strcpy(l.dev[0].uuid, U0);
    l.dev[1].index = 1;
    strcpy(l.dev[1].uuid, U1);
    return l;
}

static int parse(const char *s, wb_placement *p, wb_err *err)
{
    return wb__placement_parse(s, strlen(s), p, err);
}

START_TEST(parses_ordinals_all_and_uuids)
{
    wb_placement p;
    wb_err err;
    ck_assert_int_eq(parse("@0,1", &p, &err), WB_OK);
    ck_assert_int_eq(p.all, 0);
    ck_assert_uint_eq(p.n, 2);
    ck_assert_int_eq(p.items[0].index, 0);
    ck_assert_int_eq(p.items[1].index, 1);
    ck_assert_int_eq(parse("all", &p, &err), WB_OK);
    ck_assert_int_eq(p.all, 1);
    ck_assert_int_eq(parse("@all", &p, &err), WB_OK);
    ck_assert_int_eq(p.all, 1);
    ck_assert_int_eq(parse("@" U1 ",0", &p, &err), WB_OK);
    ck_assert_uint_eq(p.n, 2);
    ck_assert_int_eq(p.items[0].index, -1);
    ck_assert_str_eq(p.items[0].uuid, U1);
    ck_assert_int_eq(p.items[1].index, 0);
    char buf[200];
    wb__placement_format(&p, buf, sizeof buf);
    ck_assert_str_eq(buf, U1 ",0");
    ck_assert_int_eq(parse("12", &p, &err), WB_OK);
    ck_assert_int_eq(p.items[0].index, 12);
    /* Only the first len bytes count. */
    ck_assert_int_eq(wb__placement_parse("3=/path", 1, &p, &err), WB_OK);
    ck_assert_int_eq(p.items[0].index, 3);
}
END_TEST

START_TEST(refuses_with_text_and_position)
{
    wb_placement p;
    wb_err err;
    ck_assert_int_eq(parse("@0,x", &p, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "placement '@0,x': position 4: 'x' is not a device ordinal, 'all' "
                              "or a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
    ck_assert_int_eq(parse("0,,1", &p, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg,
                     "placement '0,,1': position 3: an empty item (two commas, or a comma at an "
                     "end)");
    ck_assert_int_eq(parse("0,", &p, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "placement '0,': position 3: an empty item (two commas, or a comma "
                              "at an end)");
    ck_assert_int_eq(parse("@", &p, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg,
                     "placement '@': position 2: expected 'all', device ordinals or GPU UUIDs");
    ck_assert_int_eq(parse("1a", &p, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "placement '1a': position 2: '1a' is not a device ordinal");
    ck_assert_int_eq(parse("0,all", &p, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "placement '0,all': position 3: 'all' is not a device ordinal or a "
                              "GPU UUID ('all' stands alone)");
    ck_assert_int_eq(parse("99999", &p, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg,
                     "placement '99999': position 1: device ordinal '99999' is above 1023");
    /* A UUID one digit short. */
    ck_assert_int_eq(parse("GPU-11111111-2222-3333-4444-55555555555", &p, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "position 1: 'GPU-11111111-2222-3333-4444-55555555555' "
                                          "is not a device ordinal"));
    ck_assert_int_eq(parse("0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", &p, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "position 39: '16': more than 16 devices"));
}
END_TEST

START_TEST(resolves_against_a_fake_list)
{
    wb_gpu_list l = fake_two();
    wb_placement p;
    wb_err err;
    int out[WB_GPU_MAX];
    unsigned n = 99;
    ck_assert_int_eq(parse("all", &p, &err), WB_OK);
    ck_assert_int_eq(wb__placement_resolve(&p, &l, out, &n, &err), WB_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(out[0], 0);
    ck_assert_int_eq(out[1], 1);
    /* A UUID in another case is the same device. */
    ck_assert_int_eq(parse("GPU-AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE", &p, &err), WB_OK);
    ck_assert_int_eq(wb__placement_resolve(&p, &l, out, &n, &err), WB_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(out[0], 1);
    ck_assert_int_eq(parse("2", &p, &err), WB_OK);
    ck_assert_int_eq(wb__placement_resolve(&p, &l, out, &n, &err), WB_ENOGPU);
    ck_assert_str_eq(err.msg, "placement names device 2, which this broker does not see (it sees: "
                              "0=" U0 ", 1=" U1 ")");
    ck_assert_int_eq(parse("0," U0, &p, &err), WB_OK);
    ck_assert_int_eq(wb__placement_resolve(&p, &l, out, &n, &err), WB_EINVAL);
    ck_assert_str_eq(err.msg, "placement names device 0 (" U0 ") twice");
    wb_gpu_list none = {.n = 0};
    ck_assert_int_eq(parse("all", &p, &err), WB_OK);
    ck_assert_int_eq(wb__placement_resolve(&p, &none, out, &n, &err), WB_ENOGPU);
    ck_assert_str_eq(err.msg, "placement 'all': this broker sees no device");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("placement");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, parses_ordinals_all_and_uuids);
    tcase_add_test(tc, refuses_with_text_and_position);
    tcase_add_test(tc, resolves_against_a_fake_list);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
