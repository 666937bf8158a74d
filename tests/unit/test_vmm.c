/* The cuda-vmm transport's CPU-testable parts (common/cudrv.h,
 * broker/backend_vmm.h): the granularity rounding, and the clear refusals
 * where there is no CUDA in the build or no GPU on the machine (these tests
 * run without one). The GPU path itself is tested by tests/gpu/vmm.sh. */
#include "backend.h"
#include "backend_pick.h"
#include "backend_vmm.h"
#include "cudrv.h"
#include "gpu.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

START_TEST(rounding_to_the_granularity)
{
    const uint64_t g = 2u << 20;
    ck_assert_uint_eq(wb__vmm_round(0, g), g); /* an empty model still maps one granule */
    ck_assert_uint_eq(wb__vmm_round(1, g), g);
    ck_assert_uint_eq(wb__vmm_round(g - 1, g), g);
    ck_assert_uint_eq(wb__vmm_round(g, g), g);
    ck_assert_uint_eq(wb__vmm_round(g + 1, g), 2 * g);
    ck_assert_uint_eq(wb__vmm_round(5 * g - 256, g), 5 * g);
    ck_assert_uint_eq(wb__vmm_round(1000, 768), 1536);      /* not a power of two */
    ck_assert_uint_eq(wb__vmm_round(UINT64_MAX - 5, g), 0); /* would overflow */
    ck_assert_uint_eq(wb__vmm_round(UINT64_MAX - (UINT64_MAX % g), g),
                      UINT64_MAX - (UINT64_MAX % g));
    ck_assert_uint_eq(wb__vmm_round(4096, 0), 0);
}
END_TEST

START_TEST(support_check_without_a_gpu)
{
    uint64_t g = 7;
    wb_err e;
    int rc = wb__cudrv_vmm_check(0, &g, &e);
    ck_assert_uint_eq(g, 0);
    if (!wb__gpu_built()) {
        ck_assert_int_eq(rc, WB_ENOSYS);
        ck_assert_str_eq(e.msg, "this build has no cuda-vmm support (CUDA toolkit not found at "
                                "build time)");
        return;
    }
    ck_assert_int_eq(rc, WB_ENOGPU);
    ck_assert_msg(strncmp(e.msg, "cuda-vmm: cudaSetDevice(0): ", 28) == 0, "%s", e.msg);
}
END_TEST

/* --backend cuda --cuda-slab vmm fails at start with the reason; auto
 * falls back to the host backend, whose transport is unchanged. */
START_TEST(backend_start_refuses_clearly)
{
    wb_stage_config stage = {0};
    const wb_backend *be = NULL;
    wb_err e;
    int rc = wb__backend_pick("cuda", 0, &stage, 0, 0, WB_CUDA_SLAB_VMM, &be, &e);
    ck_assert_ptr_null(be);
    if (!wb__gpu_built()) {
        ck_assert_int_eq(rc, WB_ENOSYS);
        ck_assert_ptr_nonnull(strstr(e.msg, "this build has no cuda backend"));
    } else {
        /* Without the driver the message says so; with one but no device,
         * that no GPU is usable. */
        ck_assert_int_eq(rc, WB_ENOGPU);
        ck_assert_msg(strstr(e.msg, "no usable GPU") || strstr(e.msg, "needs the NVIDIA driver") ||
                          strstr(e.msg, "needs a newer NVIDIA driver"),
                      "unexpected message: %s", e.msg);
    }
    wb_cuda_options o = {.device = 0, .slab = WB_CUDA_SLAB_VMM};
    wb_backend *cuda = NULL;
    rc = wb__backend_cuda_new(&o, &cuda, &e);
    ck_assert_ptr_null(cuda);
    ck_assert_int_eq(rc, wb__gpu_built() ? WB_ENOGPU : WB_ENOSYS);

    ck_assert_int_eq(wb__backend_pick("auto", 0, &stage, 0, 0, WB_CUDA_SLAB_VMM, &be, &e), WB_OK);
    ck_assert_str_eq(wb__backend_transport(be), "shm");
    ck_assert_str_eq(wb__backend_access(be), "ro");
    wb__backend_release(&be);
    ck_assert_ptr_null(be);
}
END_TEST

/* The slab functions' own answers that need no device. */
START_TEST(slab_without_an_allocation)
{
    wb_slab s;
    memset(&s, 0, sizeof s);
    s.vmm_fd = 5;
    ck_assert_int_eq(wb__vmm_slab_fd(&s), -1); /* not a VMM slab: no descriptor */
    s.vmm_handle = 1;
    ck_assert_int_eq(wb__vmm_slab_fd(&s), 5);
    s.index = 3;
    s.device = 1;
    s.size = 4u << 20;
    Wbproto__Slab out;
    wb__vmm_slab_export(&s, &out);
    ck_assert_str_eq(out.transport, "cuda-vmm");
    ck_assert_int_eq(out.backend, WBPROTO__BACKEND__BACKEND_CUDA);
    ck_assert_uint_eq(out.index, 3);
    ck_assert_int_eq(out.device, 1);
    ck_assert_uint_eq(out.size, 4u << 20);
    ck_assert_uint_eq(out.cuda_ipc_handle.len, 0);
    ck_assert_str_eq(out.shm_name, "");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("vmm");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, rounding_to_the_granularity);
    tcase_add_test(tc, support_check_without_a_gpu);
    tcase_add_test(tc, backend_start_refuses_clearly);
    tcase_add_test(tc, slab_without_an_allocation);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
