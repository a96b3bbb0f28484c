/* Regression tests for library bugs the fault sweep (test_fault_sweep.c) found, one case a
 * CTest test (test_fault_regression_<case>, tests/fault/CMakeLists.txt):
 *
 *   test_fault_regressions default-stream-deadlock
 *   test_fault_regressions param-info-error
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "../test.h"
#include "driver/driver.h"
#include "fake_control.h"
#include "fake_ptx.h"

/* src/stream/stream.c: sci_context_default_stream() held ctx->lock while create() ran;
 * when cuCtxGetStreamPriorityRange or cuStreamCreateWithPriority failed with a sticky
 * error, create() called sci_context_fail_cu(), which locked ctx->lock again: the thread
 * deadlocked on itself. Fixed: marking a context lost takes a lock of its own. Expected:
 * SC_ERR_CONTEXT_LOST, no hang. */
static atomic_int done;
static atomic_int result;

static void *first_use_of_default_stream(void *arg)
{
    sc_context ctx = *(sc_context *)arg;
    sc_buffer b;
    REQUIRE(sci_fault_arm("cuStreamCreateWithPriority", 1, CUDA_ERROR_ILLEGAL_ADDRESS));
    sc_status s = sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 16}, &b);
    sci_fault_disarm();
    atomic_store(&result, (int)s);
    atomic_store(&done, 1);
    return NULL;
}

static void default_stream_deadlock(void)
{
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, first_use_of_default_stream, &ctx) == 0);
    for (int i = 0; i < 500 && !atomic_load(&done); i++)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    if (!atomic_load(&done)) {
        fprintf(stderr, "sc_buffer_create on a fresh context hung for 5 s after a sticky "
                        "error from cuStreamCreateWithPriority (self-deadlock on the context "
                        "lock in sci_context_default_stream)\n");
        test_failures++;
        return; /* the thread stays stuck: exit without cleanup */
    }
    pthread_join(t, NULL);
    CHECK(atomic_load(&result) == SC_ERR_CONTEXT_LOST);
    sc_status d = sc_context_destroy(ctx);
    CHECK(d == SC_OK || d == SC_ERR_CONTEXT_LOST);
}

/* src/launch/module.c: read_params() took ANY failure of cuFuncGetParamInfo for the end
 * of the parameter list. A transient error (here out of memory on the second call) gave a
 * kernel handle that believed the kernel takes 1 parameter: sc_kernel_get said SC_OK and
 * every correct launch of it was refused with SC_ERR_LAUNCH for good; a sticky error there
 * did not mark the context lost. Fixed, expected: only CUDA_ERROR_INVALID_VALUE ends the
 * list; other errors fail sc_kernel_get with their status. */
static void param_info_error(void)
{
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_module m;
    REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m) == SC_OK);
    sc_kernel k = {0};
    REQUIRE(sci_fault_arm("cuFuncGetParamInfo", 2, CUDA_ERROR_OUT_OF_MEMORY));
    sc_status s = sc_kernel_get(m, "add", &k);
    sci_fault_disarm();
    if (s == SC_OK) {
        sc_kernel_props p;
        CHECK_OK(sc_kernel_info(k, &p));
        if (p.n_params != 3)
            fprintf(stderr, "sc_kernel_get said SC_OK after a failed cuFuncGetParamInfo; the "
                            "kernel handle now believes 'add' takes %d parameter(s), not 3\n",
                    p.n_params);
        CHECK(p.n_params == 3);
        sc_buffer a, b;
        CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 32}, &a));
        CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 32}, &b));
        sc_launch_desc cfg = {.grid = {1, 1, 1}, .block = {32, 1, 1}};
        CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_in(sc_view_of(a)),
                           sc_arg_inout(sc_view_of(b)), sc_arg_u32(32)));
        CHECK_OK(sc_buffer_destroy(a));
        CHECK_OK(sc_buffer_destroy(b));
    } else {
        CHECK(s == SC_ERR_OUT_OF_MEMORY);
    }
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_context_destroy(ctx));
}

int main(int argc, char **argv)
{
    fake_attach();
    sc_set_log_callback(NULL, NULL);
    const char *which = argc > 1 ? argv[1] : "";
    if (strcmp(which, "default-stream-deadlock") == 0)
        default_stream_deadlock();
    else if (strcmp(which, "param-info-error") == 0)
        param_info_error();
    else {
        fprintf(stderr, "usage: %s default-stream-deadlock|param-info-error\n", argv[0]);
        return 2;
    }
    int r = test_result(which);
    fflush(stdout);
    fflush(stderr);
    _Exit(r); /* a deadlocked thread may still hold locks: no atexit work */
}
