/* The test device as a user meets it (no SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES): module
 * loads and the launch checks work, and a launch that passes them fails with
 * SC_ERR_NOT_SUPPORTED and a message saying that kernels do not run on the test device.
 * The launch never "succeeds", and its failure does not mark the context lost: copies,
 * fills and further (refused) launches go on working. */
#include <stdint.h>

#include "../test.h"
#include "td_control.h"
#include "td_ptx.h"

int main(void)
{
    const char *accept = getenv("SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES");
    REQUIRE(!accept || !accept[0]); /* this test is about the default */
    fake_attach();
    sc_set_log_callback(NULL, NULL);
    long (*refused)(void) = NULL;
    void *h = dlopen(getenv("SAFECUDA_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h != NULL);
    memcpy(&refused, &(void *){dlsym(h, "safecuda_testdevice_refused_launches")},
           sizeof refused);
    REQUIRE(refused != NULL);
    dlclose(h);

    sc_device_props p;
    CHECK_OK(sc_device_info(0, &p));
    CHECK(strcmp(p.name, "safecuda test device (host memory, runs no kernels)") == 0);

    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_module m;
    sc_kernel add;
    CHECK_OK(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m));
    CHECK_OK(sc_kernel_get(m, "add", &add));

    enum { N = 256 };
    float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)i;
    sc_buffer a, b;
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N, .label = "a"},
                              &a));
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N, .label = "b"},
                              &b));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(a), in, sizeof in));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), in, sizeof in));

    /* The checks come first, as on a GPU. */
    sc_launch_desc cfg;
    CHECK_OK(sc_launch_config_for(N, add, &cfg));
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                           sc_arg_inout(sc_view_of(b))),
                 SC_ERR_LAUNCH);
    CHECK_MSG("takes 3 arguments but 2 were given");
    CHECK(refused() == 0);

    /* A launch that passes them is refused, with the test device's reason quoted. */
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                           sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
                 SC_ERR_NOT_SUPPORTED);
    CHECK_MSG("sc_kernel_launch: ");
    CHECK_MSG("'add'");
    CHECK_MSG("CUDA_ERROR_NOT_SUPPORTED");
    CHECK_MSG("kernels do not run on the safecuda test device (device memory is host memory");
    CHECK(refused() == 1);

    /* A programmatic launch (cuLaunchKernelEx) too. */
    cfg.programmatic = true;
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                           sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
                 SC_ERR_NOT_SUPPORTED);
    CHECK_MSG("kernels do not run on the safecuda test device");
    CHECK(refused() == 2);

    /* The context is not lost; the data is untouched (nothing ran) and still moves. */
    CHECK_OK(sc_context_check(ctx));
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(b)));
    CHECK(memcmp(in, out, sizeof in) == 0);
    float two = 2.0f;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), &two));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(b)));
    CHECK(out[0] == 2.0f && out[N - 1] == 2.0f);

    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_context_destroy(ctx));
    CHECK(fake.misuse_count() == 0);
    return test_result("test_testdevice");
}
