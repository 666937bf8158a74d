/* The compact tensor table on the client's side (client/lease.c), against
 * a FAKE broker that packs compact tables, sends them inside the reply or
 * as a second frame, and answers tensor_table_cached when the request's
 * digest names its table. The second lease reuses the held table and sees
 * the same tensors; a cached reply whose slab no longer holds the table's
 * tensors is refused, naming the slab and both sizes (a real broker does
 * not send one: this is the client's own check); a reply that promises a
 * frame and sends none, or a frame that is not a table, is refused and the
 * lease handed back. */
#include "wb/client.h"

#include "fake_broker.h"
#include "lease.h"
#include "shm.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fake_env's two tensors on a 4 KiB slab; "b" ends at byte 356. */
typedef fake_env fake;
static const fake_tensor *const tensors = fake_env_tensors;

static void fake_start(fake *f)
{
    fake_env_start(f, 1000);
    atomic_store(&f->b.compact, 1);
}

static void check_tensors(wb_lease *l, const fake *f)
{
    ck_assert_uint_eq(wb_lease_tensor_count(l), 2);
    for (size_t i = 0; i < 2; i++) {
        wb_tensor_view v, w;
        ck_assert_int_eq(wb_lease_find(l, tensors[i].name, &v), WB_OK);
        ck_assert_int_eq(wb_lease_tensor(l, i, &w), WB_OK);
        ck_assert_str_eq(w.name, tensors[i].name);
        ck_assert_str_eq(v.dtype, tensors[i].dtype);
        ck_assert_uint_eq(v.nbytes, tensors[i].nbytes);
        ck_assert_uint_eq(v.ndim, 1);
        ck_assert_uint_eq(v.shape[0], tensors[i].dim);
        ck_assert_int_eq(
            memcmp(v.data, (const uint8_t *)f->slab.addr + tensors[i].offset, tensors[i].nbytes),
            0);
    }
}

/* Two leases in a row: the first gets the table (inside the reply, or as a
 * frame), the second names it and gets none; both see the same tensors. */
static void two_leases(int frame_mode)
{
    fake f;
    fake_start(&f);
    atomic_store(&f.b.frame_mode, frame_mode);
    int framed = frame_mode == FAKE_FRAME_SEND;
    wb_client *c = fake_connect(f.b.path, 1, 2000);
    wb_lease *l = NULL;
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
        ck_assert_int_eq(atomic_load(&f.b.n_tables_sent), framed ? 0 : 1);
        ck_assert_int_eq(atomic_load(&f.b.n_frames_sent), framed ? 1 : 0);
        ck_assert_int_eq(atomic_load(&f.b.n_cached), i);
        check_tensors(l, &f);
        ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    }
    wb_client_destroy(&c);
    fake_env_stop(&f);
}

/* The fake ignores tensor_table_frame, as a broker from before it. */
START_TEST(second_lease_uses_the_held_table)
{
    two_leases(FAKE_FRAME_IGNORE);
}
END_TEST

/* A table that came as a frame is held like any other. */
START_TEST(table_as_a_second_frame)
{
    two_leases(FAKE_FRAME_SEND);
}
END_TEST

START_TEST(held_table_outside_the_slab_is_refused)
{
    fake f;
    fake_start(&f);
    wb_client *c = fake_connect(f.b.path, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);

    /* Tensor "b" needs bytes 256..356 of slab 0: a slab of 355 bytes (the
     * same bytes, one short) is refused. */
    wb_shm short_slab, exact_slab;
    fake_slab_create(&short_slab, 355, 7, 1);
    fake_slab_create(&exact_slab, 356, 7, 1);
    atomic_store(&f.b.cached_slab, &short_slab);
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_EPROTO);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(atomic_load(&f.b.n_cached), 1);
    const char *msg = wb_client_errmsg(c);
    ck_assert_msg(strstr(msg, "acquire 'demo': the tensor table held needs 356 bytes of slab 0, "
                              "the lease's has 355"),
                  "message: %s", msg);

    /* Exactly large enough: accepted, the same tensors. */
    atomic_store(&f.b.cached_slab, &exact_slab);
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_cached), 2);
    check_tensors(l, &f);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    atomic_store(&f.b.cached_slab, NULL);
    fake_slab_destroy(&short_slab);
    fake_slab_destroy(&exact_slab);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

START_TEST(promised_frame_missing_or_bad)
{
    fake f;
    fake_start(&f);
    wb_client *c = fake_connect(f.b.path, 1, 2000);
    wb_lease *l = NULL;
    atomic_store(&f.b.frame_mode, FAKE_FRAME_NONE);
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_EPROTO);
    ck_assert_ptr_null(l);
    ck_assert_msg(strstr(wb_client_errmsg(c), "acquire 'demo': the reply says the tensor table "
                                              "follows in a second frame, but none came"),
                  "message: %s", wb_client_errmsg(c));
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1); /* handed back */

    atomic_store(&f.b.frame_mode, FAKE_FRAME_BAD);
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_EPROTO);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(atomic_load(&f.b.n_frames_sent), 1);
    ck_assert_msg(strstr(wb_client_errmsg(c), "acquire 'demo': the tensor table frame: "
                                              "lease.tensor_table has magic"),
                  "message: %s", wb_client_errmsg(c));
    ck_assert_int_eq(atomic_load(&f.b.n_release), 2);

    /* And nothing of either is held: the next acquire gets a whole table. */
    atomic_store(&f.b.frame_mode, FAKE_FRAME_SEND);
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_cached), 0);
    check_tensors(l, &f);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

/* True when this process maps shm object `name` (read-only, shared). */
static int mapped_ro(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    char line[512], want[128];
    snprintf(want, sizeof want, "/dev/shm%s", name);
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, want) && strstr(line, " r--s "))
            found = 1;
    }
    fclose(f);
    return found;
}

/* The broker publishes the table in shared memory: the client maps it
 * (read-only, shared) and uses its bytes where they lie; no frame and no
 * table in the reply came, and the next lease names the digest as for any
 * held table. */
START_TEST(shared_table_is_mapped)
{
    fake f;
    fake_start(&f);
    atomic_store(&f.b.frame_mode, FAKE_FRAME_SEND);
    atomic_store(&f.b.shared_mode, FAKE_SHARED_SEND);
    wb_client *c = fake_connect(f.b.path, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_asked_shared), 1);
    ck_assert_int_eq(atomic_load(&f.b.n_shared_sent), 1);
    ck_assert_int_eq(atomic_load(&f.b.n_frames_sent), 0);
    ck_assert_int_eq(atomic_load(&f.b.n_tables_sent), 0);
    wb__table *t = l->table;
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_nonnull(t->map);
    ck_assert_ptr_null(t->frame);
    ck_assert_ptr_null(t->rep);
    ck_assert_ptr_eq(t->bytes, wb__map_addr(t->map));
    ck_assert_int_eq(memcmp(t->bytes, f.b.shared_table.addr, t->len), 0);
    ck_assert(mapped_ro(f.b.shared_table.name));
    check_tensors(l, &f);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);

    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_cached), 1);
    ck_assert_int_eq(atomic_load(&f.b.n_shared_sent), 1);
    ck_assert_ptr_eq(l->table, t);
    check_tensors(l, &f);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    /* The table (and its mapping) goes with the client's last reference. */
    wb_client_destroy(&c);
    ck_assert(!mapped_ro(f.b.shared_table.name));
    fake_env_stop(&f);
}
END_TEST

/* A broker that predates tensor_table_shared ignores it: the table comes as
 * a frame, as it did. */
START_TEST(shared_table_old_broker_sends_the_frame)
{
    fake f;
    fake_start(&f);
    atomic_store(&f.b.frame_mode, FAKE_FRAME_SEND);
    atomic_store(&f.b.shared_mode, FAKE_SHARED_IGNORE);
    wb_client *c = fake_connect(f.b.path, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_asked_shared), 1);
    ck_assert_int_eq(atomic_load(&f.b.n_shared_sent), 0);
    ck_assert_int_eq(atomic_load(&f.b.n_frames_sent), 1);
    ck_assert_ptr_null(l->table->map);
    check_tensors(l, &f);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

/* A shared table that cannot be mapped here: the lease is handed back and
 * the acquire asked again without the flag, which this client then no
 * longer sets; the caller sees one lease. */
START_TEST(shared_table_unmappable_falls_back)
{
    fake f;
    fake_start(&f);
    atomic_store(&f.b.frame_mode, FAKE_FRAME_SEND);
    atomic_store(&f.b.shared_mode, FAKE_SHARED_MISSING);
    wb_client *c = fake_connect(f.b.path, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_acquire), 2);
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1); /* the first lease */
    ck_assert_int_eq(atomic_load(&f.b.n_asked_shared), 1);
    ck_assert_int_eq(atomic_load(&f.b.n_frames_sent), 1);
    ck_assert_int_eq(memcmp(l->id, f.b.released_id, WB_LEASE_ID_LEN) != 0, 1);
    check_tensors(l, &f);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    /* Another client starts asking again. */
    wb_client *c2 = fake_connect(f.b.path, 1, 2000);
    ck_assert_int_eq(wb_lease_acquire(c2, "demo", &l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_asked_shared), 2);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_client_destroy(&c2);
    /* This one no longer asks. */
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_OK);
    ck_assert_int_eq(atomic_load(&f.b.n_asked_shared), 2);
    ck_assert_int_eq(wb_lease_release(&l), WB_OK);
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

/* A shared table that is not a table is refused like a bad frame (its
 * content is the broker's word, checked), the lease handed back. */
START_TEST(shared_table_bad_is_refused)
{
    fake f;
    fake_start(&f);
    atomic_store(&f.b.frame_mode, FAKE_FRAME_SEND);
    atomic_store(&f.b.shared_mode, FAKE_SHARED_BAD);
    wb_client *c = fake_connect(f.b.path, 1, 2000);
    wb_lease *l = NULL;
    ck_assert_int_eq(wb_lease_acquire(c, "demo", &l), WB_EPROTO);
    ck_assert_ptr_null(l);
    char want[160];
    snprintf(want, sizeof want,
             "acquire 'demo': the shared tensor table %s: lease.tensor_table has magic",
             f.b.shared_table.name);
    ck_assert_msg(strstr(wb_client_errmsg(c), want), "message: %s", wb_client_errmsg(c));
    ck_assert_int_eq(atomic_load(&f.b.n_release), 1);
    ck_assert_int_eq(atomic_load(&f.b.n_acquire), 1); /* not asked again */
    ck_assert(!mapped_ro(f.b.shared_table.name));
    wb_client_destroy(&c);
    fake_env_stop(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("held_table");
    TCase *tc = tcase_create("held_table");
    tcase_add_test(tc, second_lease_uses_the_held_table);
    tcase_add_test(tc, held_table_outside_the_slab_is_refused);
    tcase_add_test(tc, table_as_a_second_frame);
    tcase_add_test(tc, promised_frame_missing_or_bad);
    tcase_add_test(tc, shared_table_is_mapped);
    tcase_add_test(tc, shared_table_old_broker_sends_the_frame);
    tcase_add_test(tc, shared_table_unmappable_falls_back);
    tcase_add_test(tc, shared_table_bad_is_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
