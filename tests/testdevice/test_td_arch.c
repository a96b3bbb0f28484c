/* What safecuda refuses on a device older than sm_90, against the test device reporting
 * another compute capability (SAFECUDA_TESTDEVICE_CC, argv[1] says which):
 *   80: tensor maps are SC_ERR_NOT_SUPPORTED; a programmatic launch falls back to a plain
 *       one; the MoE layer's SM90 backend is SC_ERR_NOT_SUPPORTED;
 *   75: the MoE layer (bf16 tensor cores) is SC_ERR_NOT_SUPPORTED whatever the backend.
 * Both: a backend outside the enum is SC_ERR_INVALID_ARGUMENT before any device work; a
 * program for sm_90a in the context is SC_ERR_NOT_SUPPORTED before any compile; a
 * thread-block cluster (launch or occupancy query) is SC_ERR_NOT_SUPPORTED before the
 * driver sees it.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include "../test.h"
#include "driver/driver.h"
#include "td_ptx.h"
#include "safecuda/moe.h"

static sc_moe_desc moe_desc(sc_buffer r, sc_buffer w13, sc_buffer w2, sc_moe_backend backend)
{
    return (sc_moe_desc){.experts = 8, .top_k = 2, .hidden = 64, .intermediate = 32,
                         .router = r, .w13 = w13, .w2 = w2, .backend = backend};
}

int main(int argc, char **argv)
{
    const int cc = argc > 1 ? atoi(argv[1]) : 0;
    REQUIRE(cc == 80 || cc == 75);
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_device_props props;
    REQUIRE(sc_device_info(0, &props) == SC_OK);
    REQUIRE(props.cc_major * 10 + props.cc_minor == cc); /* SAFECUDA_TESTDEVICE_CC got there */

    sc_buffer r, w13, w2, a;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = 8 * 64}, &r) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = 8 * 64 * 64}, &w13) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = 8 * 64 * 32}, &w2) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 1024}, &a) == SC_OK);
    sc_moe layer;
    sc_moe_desc d = moe_desc(r, w13, w2, (sc_moe_backend)7);
    CHECK_STATUS(sc_moe_create(ctx, &d, &layer), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_moe_create: desc->backend = 7");
    CHECK(layer.id == 0);

    if (cc == 80) {
        sc_tensor_map map;
        CHECK_STATUS(sc_tensor_map_encode(sc_view_of(a),
                                          &(sc_tensor_map_desc){.rows = 32, .cols = 32,
                                                                .box_rows = 8, .box_cols = 8},
                                          &map),
                     SC_ERR_NOT_SUPPORTED);
        CHECK_MSG("sc_tensor_map_encode: tensor maps need sm_90 or newer");
        CHECK_MSG("sm_80");
        /* The general form too, before any of its own checks. */
        CHECK_STATUS(sc_tensor_map_encode(sc_view_of(a),
                                          &(sc_tensor_map_desc){.rank = 3,
                                                                .dims = {16, 8, 8},
                                                                .box = {16, 8, 8}},
                                          &map),
                     SC_ERR_NOT_SUPPORTED);
        CHECK_MSG("sc_tensor_map_encode: tensor maps need sm_90 or newer");
        /* programmatic is a request: before sm_90 the launch is a plain one. */
        sc_module m;
        sc_kernel add;
        REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m) == SC_OK);
        REQUIRE(sc_kernel_get(m, "add", &add) == SC_OK);
        REQUIRE(sci_fault_arm("cuLaunchKernelEx", 1, CUDA_ERROR_UNKNOWN));
        const sc_launch_desc cfg = {.grid = {.x = 4}, .block = {.x = 256}, .programmatic = true};
        CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)), sc_arg_inout(sc_view_of(a)),
                           sc_arg_u32(1024)));
        CHECK(!sci_fault_fired()); /* cuLaunchKernelEx was not called */
        sci_fault_disarm();
        CHECK_OK(sc_module_destroy(m));
        d = moe_desc(r, w13, w2, SC_MOE_BACKEND_SM90);
        CHECK_STATUS(sc_moe_create(ctx, &d, &layer), SC_ERR_NOT_SUPPORTED);
        CHECK_MSG("the SM90 backend needs compute capability 9.0; device 0 is 8.0");
    } else {
        d = moe_desc(r, w13, w2, SC_MOE_BACKEND_AUTO);
        CHECK_STATUS(sc_moe_create(ctx, &d, &layer), SC_ERR_NOT_SUPPORTED);
        CHECK_MSG("compute capability 8.0 or newer");
        CHECK_MSG("device 0 is 7.5");
    }
    CHECK(layer.id == 0);

    /* Thread-block clusters need sm_90: refused before the driver sees the launch, and the
     * cluster occupancy query too; a kernel's cluster attributes are not even read. */
    {
        sc_module m;
        sc_kernel add;
        REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m) == SC_OK);
        REQUIRE(sci_fault_arm("cuFuncGetAttribute", 0, 0));
        REQUIRE(sc_kernel_get(m, "add", &add) == SC_OK);
        CHECK(sci_fault_calls() == 3); /* threads, static and dynamic shared memory */
        const sc_launch_desc cfg = {.grid = {.x = 4}, .block = {.x = 256}, .cluster = {2, 1, 1}};
        REQUIRE(sci_fault_arm("cuLaunchKernelEx", 0, 0));
        CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                               sc_arg_inout(sc_view_of(a)), sc_arg_u32(1024)),
                     SC_ERR_NOT_SUPPORTED);
        CHECK(sci_fault_calls() == 0);
        sci_fault_disarm();
        CHECK_MSG("sc_kernel_launch: kernel 'add': thread-block clusters (cluster = 2 x 1 x 1) "
                  "need compute capability 9.0 or newer; device 0 is");
        CHECK_MSG(cc == 80 ? "is 8.0" : "is 7.5");
        int n = -1;
        CHECK_STATUS(sc_kernel_occupancy_clusters(add, &cfg, &n), SC_ERR_NOT_SUPPORTED);
        CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'add': thread-block clusters");
        CHECK(n == 0);
        sc_kernel_props kp;
        CHECK_OK(sc_kernel_info(add, &kp));
        CHECK(kp.cluster_dims.x == 0 && !kp.cluster_required);
        CHECK_OK(sc_module_destroy(m));
    }

    /* Architecture-specific code for another architecture than the context's device would
     * never load there: refused before anything compiles (compile-only programs, with the
     * zero context, may target any architecture). */
    sc_program prog = {.id = 5};
    CHECK_STATUS(sc_program_create(ctx,
                                   &(sc_program_desc){.source = "__global__ void k() {}",
                                                      .arch = 90, .arch_specific = true},
                                   &prog),
                 SC_ERR_NOT_SUPPORTED);
    CHECK(prog.id == 0);
    CHECK_MSG("sc_program_create: desc->arch_specific: sm_90a code runs only on compute "
              "capability 9.0; the context's device 0 is");
    CHECK_MSG(cc == 80 ? "is 8.0" : "is 7.5");
    CHECK_OK(sc_buffer_destroy(r));
    CHECK_OK(sc_buffer_destroy(w13));
    CHECK_OK(sc_buffer_destroy(w2));
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_context_destroy(ctx));
    return test_result("test_td_arch");
}
