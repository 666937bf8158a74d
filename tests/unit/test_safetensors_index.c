/* The count of a shard index's entries made before it is parsed: exact
 * counts for texts jansson accepts (the weight_map's members, and every other
 * value), keys compared after their escapes, nothing counted in a map that
 * is not the root's, and -1 for text whose structure it cannot follow. */
#include "safetensors_index.h"

#include <check.h>
#include <jansson.h>

#include <stdlib.h>
#include <string.h>

static uint64_t values(const json_t *v)
{
    uint64_t n = 1;
    if (json_is_object(v)) {
        const char *k;
        json_t *m;
        json_object_foreach((json_t *)v, k, m)
        {
            n += values(m);
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            n += values(json_array_get(v, i));
    }
    return n;
}

/* Counts `text`, expecting map and other; when jansson accepts the text,
 * its tree must say the same. */
static void expect_count(const char *text, uint64_t map, uint64_t other)
{
    wb_st_index_count n = {99, 99};
    ck_assert_msg(wb__st_index_count(text, strlen(text), &n) == 0, "not counted: %s", text);
    ck_assert_msg(n.map_entries == map && n.other_values == other,
                  "%s: map %llu other %llu, expected %llu %llu", text,
                  (unsigned long long)n.map_entries, (unsigned long long)n.other_values,
                  (unsigned long long)map, (unsigned long long)other);
    json_error_t je;
    json_t *root = json_loadb(text, strlen(text), JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    ck_assert_uint_eq(map, json_is_object(wm) ? json_object_size(wm) : 0);
    ck_assert_uint_eq(map + other, values(root));
    json_decref(root);
}

static void expect_refused(const char *text, size_t len)
{
    wb_st_index_count n = {99, 99};
    ck_assert_msg(wb__st_index_count(text, len, &n) == -1, "counted: %.*s", (int)len, text);
    ck_assert_uint_eq(n.map_entries, 99); /* untouched */
}

START_TEST(counts_an_index)
{
    /* root, metadata, its one member, the map itself; two entries. */
    expect_count("{\"metadata\":{\"total_size\":16},\"weight_map\":{\"a\":\"s1.safetensors\","
                 "\"b\":\"s2.safetensors\"}}",
                 2, 4);
    expect_count(" \t\r\n{ \"weight_map\" : { } } \n", 0, 2);
    expect_count("{\"weight_map\":{\"a\":\"s\"},\"metadata\":{\"k\":[1,-2.5e3,true,false,null,"
                 "{\"n\":[]}]}}",
                 1, 11);
}
END_TEST

START_TEST(keys_and_strings)
{
    /* The key decoded, as jansson looks it up. */
    expect_count("{\"weight\\u005fmap\":{\"a\":\"s\",\"b\":\"s\"}}", 2, 2);
    expect_count("{\"weight\\u005Fmap\":{\"a\":\"s\"}}", 1, 2);
    expect_count("{\"weight_ma\\u0070\":{\"a\":\"s\"}}", 1, 2);
    expect_count("{\"\\u0077eight_map\":{\"a\":\"s\"}}", 1, 2);
    /* Not the key: a longer or shorter name, a non-ASCII escape. */
    expect_count("{\"weight_maps\":{\"a\":\"s\"}}", 0, 3);
    expect_count("{\"weight_ma\":{\"a\":\"s\"}}", 0, 3);
    expect_count("{\"weight_m\\u00e1p\":{\"a\":\"s\"}}", 0, 3);
    /* Brackets, commas, colons and escaped quotes inside strings are text. */
    expect_count("{\"weight_map\":{\"a\\\"}]\":\"{[,:\\\\\",\"b\\/\":\"\\n\\t\\u1234\"}}", 2, 2);
}
END_TEST

/* One NUL byte right after a number or literal, which jansson skips. */
START_TEST(nul_after_a_scalar)
{
    const char text[] = "{\"weight_map\":{\"a\":1\0,\"b\":true\0},\"m\":[null\0]}";
    wb_st_index_count n;
    ck_assert_int_eq(wb__st_index_count(text, sizeof text - 1, &n), 0);
    ck_assert_uint_eq(n.map_entries, 2);
    ck_assert_uint_eq(n.other_values, 4);
    json_error_t je;
    json_t *root = json_loadb(text, sizeof text - 1, JSON_REJECT_DUPLICATES, &je);
    if (root) {
        ck_assert_uint_eq(json_object_size(json_object_get(root, "weight_map")), 2);
        ck_assert_uint_eq(values(root), 6);
        json_decref(root);
    }
}
END_TEST

START_TEST(only_the_root_map)
{
    /* A weight_map below the root, inside an array, or not an object. */
    expect_count("{\"metadata\":{\"weight_map\":{\"a\":\"s\"}}}", 0, 4);
    expect_count("[{\"weight_map\":{\"a\":\"b\"}},{}]", 0, 5);
    expect_count("{\"weight_map\":[\"a\",\"b\"]}", 0, 4);
    expect_count("{\"weight_map\":\"a\"}", 0, 2);
    /* Values nested in a map's entries are not entries. */
    expect_count("{\"weight_map\":{\"a\":[\"x\",\"y\"],\"b\":{\"c\":1}}}", 2, 5);
    /* The key repeated (jansson refuses it): both maps count. */
    expect_count("{\"weight_map\":{\"a\":\"s\"},\"weight_map\":{\"b\":\"s\",\"c\":\"s\"}}", 3, 3);
}
END_TEST

START_TEST(structure_it_cannot_follow)
{
    const char *bad[] = {
        "",
        "   ",
        "{",
        "{\"a\":1",
        "{\"a\":1}}",
        "{\"a\":1} x",
        "{\"a\" 1}",
        "{\"a\":}",
        "{1:2}",
        "{\"a\":1,}",
        "[1,]",
        "[1 2]",
        "{\"a\":[1}",
        "{\"a\":{1]}",
        "{\"a\":\"unterminated}",
        "{\"a\":\"ends in a backslash\\",
        "{,}",
        "{\"a\"::1}",
        "{\"a\":1 \"b\":2}",
        "{} {}",
        "{\"a\":@}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_refused(bad[i], strlen(bad[i]));
    /* A NUL outside a string, and bytes after it. */
    expect_refused("{}\0{}", 5);
    expect_refused("[1,\0 2]", 7);
    expect_refused("[1\0\0]", 5);
    /* Deeper than the count follows. */
    size_t deep = WB_ST_INDEX_MAX_DEPTH + 1;
    char *text = malloc(2 * deep);
    ck_assert_ptr_nonnull(text);
    memset(text, '[', deep);
    memset(text + deep, ']', deep);
    expect_refused(text, 2 * deep);
    /* As deep as it follows is fine. */
    wb_st_index_count n;
    ck_assert_int_eq(wb__st_index_count(text + 1, 2 * deep - 2, &n), 0);
    ck_assert_uint_eq(n.other_values, WB_ST_INDEX_MAX_DEPTH);
    free(text);
}
END_TEST

/* A million entries are counted in one pass, exactly. */
START_TEST(a_big_index)
{
    const size_t entries = 1000000;
    size_t cap = entries * 32 + 64, used = 0;
    char *text = malloc(cap);
    ck_assert_ptr_nonnull(text);
    used += (size_t)snprintf(text, cap, "{\"metadata\":{},\"weight_map\":{");
    for (size_t i = 0; i < entries; i++)
        used += (size_t)snprintf(text + used, cap - used, "%s\"l.%zu.w\":\"s%zu\"", i ? "," : "", i,
                                 i % 7);
    used += (size_t)snprintf(text + used, cap - used, "}}");
    wb_st_index_count n;
    ck_assert_int_eq(wb__st_index_count(text, used, &n), 0);
    ck_assert_uint_eq(n.map_entries, entries);
    ck_assert_uint_eq(n.other_values, 3);
    free(text);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors_index");
    TCase *tc = tcase_create("count");
    tcase_add_test(tc, counts_an_index);
    tcase_add_test(tc, keys_and_strings);
    tcase_add_test(tc, only_the_root_map);
    tcase_add_test(tc, nul_after_a_scalar);
    tcase_add_test(tc, structure_it_cannot_follow);
    tcase_add_test(tc, a_big_index);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
