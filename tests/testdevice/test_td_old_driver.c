/* A driver older than CUDA 12.4 (the test device reporting 12.3) can't report a kernel's
 * parameters: sc_kernel_get says so once, for that kernel, through the log; the kernel's
 * n_params is -1; launches skip the argument checks (and still check the configuration
 * and the views). Host bookkeeping only: nothing here says anything about a GPU. */
#include "../test.h"
#include "td_control.h"
#include "td_ptx.h"

static int count_lines(const char *needle)
{
    int n = 0;
    for (const char *p = strstr(test_log_text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

int main(void)
{
    fake_attach();
    int v = 0;
    CHECK_OK(sc_driver_version(&v));
    CHECK(v == 12030);
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_module m;
    REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m) == SC_OK);

    sc_set_log_callback(test_log_capture, NULL);
    test_log_text[0] = '\0';
    sc_kernel add, add_again, pack;
    CHECK_OK(sc_kernel_get(m, "add", &add));
    CHECK_OK(sc_kernel_get(m, "pack", &pack));
    /* Launches log nothing more: the warning came once, when the kernel was made. */
    sc_buffer a, b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 64}, &a) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 64}, &b) == SC_OK);
    sc_launch_desc cfg = {.grid = {.x = 1}, .block = {.x = 64}};
    for (int i = 0; i < 3; i++) /* one argument too many: not caught without parameter info */
        CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                           sc_arg_inout(sc_view_of(b)), sc_arg_u32(64), sc_arg_f64(2.0)));
    sc_set_log_callback(NULL, NULL);
    CHECK(count_lines("kernel 'add': the driver (CUDA 12.3, before 12.4) can't report a "
                      "kernel's parameters, so launches of it skip the argument count, size "
                      "and type checks") == 1);
    CHECK(count_lines("kernel 'pack': the driver (CUDA 12.3") == 1);
    CHECK(count_lines("sc_kernel_get: ") == 2);

    /* Another handle of the same kernel is another kernel object: said again, for it. */
    sc_set_log_callback(test_log_capture, NULL);
    test_log_text[0] = '\0';
    CHECK_OK(sc_kernel_get(m, "add", &add_again));
    sc_set_log_callback(NULL, NULL);
    CHECK(count_lines("kernel 'add'") == 1);

    sc_kernel_props p;
    CHECK_OK(sc_kernel_info(add, &p));
    CHECK(p.n_params == -1);
    CHECK(!p.typed);
    /* The configuration and the views are still checked. */
    sc_launch_desc bad = {.grid = {.x = 1}, .block = {.x = 4096}};
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                           sc_arg_inout(sc_view_of(b)), sc_arg_u32(64)),
                 SC_ERR_LAUNCH);
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                           sc_arg_inout(sc_view_of(b)), sc_arg_u32(64)),
                 SC_ERR_STALE_HANDLE);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_context_destroy(ctx));
    CHECK(fake.misuse_count() == 0);
    return test_result("test_td_old_driver");
}
