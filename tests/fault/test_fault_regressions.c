/* Regression tests for library bugs the fault sweep (test_fault_sweep.c) found, one case a
 * CTest test (test_fault_regression_<case>, tests/fault/CMakeLists.txt):
 *
 *   test_fault_regressions default-stream-deadlock
 *   test_fault_regressions param-info-error
 *   test_fault_regressions release-failure
 *   test_fault_regressions release-sticky
 *   test_fault_regressions destroy-after-loss
 *   test_fault_regressions tolerated-sticky
 *
 * Each case asserts the documented behaviour (docs/RELIABILITY.md) at the injection point
 * that showed the bug, and that the test device holds exactly what it should afterwards.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "../test.h"
#include "driver/driver.h"
#include "td_control.h"
#include "td_ptx.h"

enum { N = 256 };
static const uint64_t BYTES = N * sizeof(float);

/* The message names the public function first, then mentions each of the needles. */
static void check_message(const char *fn, const char *needle1, const char *needle2)
{
    const char *m = sc_last_error();
    size_t fl = strlen(fn);
    if (strncmp(m, fn, fl) != 0 || m[fl] != ':') {
        fprintf(stderr, "message does not start with '%s:': %s\n", fn, m);
        test_failures++;
    }
    if (needle1)
        CHECK_MSG(needle1);
    if (needle2)
        CHECK_MSG(needle2);
}

static sc_context new_context(void)
{
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    return ctx;
}

static sc_buffer new_buffer(sc_context ctx, sc_stream on)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N, .stream = on},
                             &b) == SC_OK);
    return b;
}

/* A round trip on the context's default stream: the context works. */
static void check_usable(sc_context ctx)
{
    float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)i + 0.5f;
    sc_buffer b;
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N}, &b));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), in, sizeof in));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(b)));
    CHECK(memcmp(in, out, sizeof in) == 0);
    CHECK_OK(sc_buffer_destroy(b));
}

/* The context is lost and its message quotes the original error and the call. */
static void check_lost(sc_context ctx, const char *call)
{
    CHECK_STATUS(sc_context_check(ctx), SC_ERR_CONTEXT_LOST);
    CHECK_MSG("CUDA_ERROR_ILLEGAL_ADDRESS");
    if (call)
        CHECK_MSG(call);
}

/* The fake holds what it held at `base`, plus `more` (objects of refused releases). */
static void check_fake(fake_counts base, fake_counts more)
{
    fake_counts want = base;
    want.device += more.device;
    want.host += more.host;
    want.streams += more.streams;
    want.events += more.events;
    want.modules += more.modules;
    want.pools += more.pools;
    want.refcount += more.refcount;
    char why[512];
    if (fake_counts_diff(want, fake_counts_now(), why, sizeof why)) {
        fprintf(stderr, "the test device holds: %s\n", why);
        test_failures++;
    }
    if (fake.misuse_count() != 0) {
        fprintf(stderr, "the test device saw a misuse: %s\n", fake.last_misuse());
        test_failures++;
    }
}

/* ---- default-stream-deadlock ---------------------------------------------------------------
 * sci_context_default_stream() held ctx->lock while create() ran; a sticky error from
 * cuCtxGetStreamPriorityRange or cuStreamCreateWithPriority made create() call
 * sci_context_fail_cu(), which locked ctx->lock again: the first use of SC_DEFAULT_STREAM
 * deadlocked on itself. Fixed: a context is marked lost under a lock of its own. */
static struct {
    sc_context ctx;
    const char *entry;
    int error;
    atomic_int done;
    atomic_int result;
} first_use;

static void *first_use_of_default_stream(void *arg)
{
    (void)arg;
    sc_buffer b = {0};
    REQUIRE(sci_fault_arm(first_use.entry, 1, first_use.error));
    sc_status s = sc_buffer_create(first_use.ctx,
                                   &(sc_buffer_desc){.dtype = SC_F32, .count = 16}, &b);
    sci_fault_disarm();
    if (s == SC_OK)
        sc_buffer_destroy(b);
    atomic_store(&first_use.result, (int)s);
    atomic_store(&first_use.done, 1);
    return NULL;
}

/* Returns false if the call hung (the thread stays stuck: the caller must not clean up). */
static bool run_first_use(const char *entry, int error, sc_status want)
{
    first_use.ctx = new_context();
    first_use.entry = entry;
    first_use.error = error;
    atomic_store(&first_use.done, 0);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, first_use_of_default_stream, NULL) == 0);
    for (int i = 0; i < 500 && !atomic_load(&first_use.done); i++)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    if (!atomic_load(&first_use.done)) {
        fprintf(stderr, "sc_buffer_create on a fresh context hung for 5 s after %s failed "
                        "with error %d (a deadlock creating the default stream)\n",
                entry, error);
        test_failures++;
        return false;
    }
    pthread_join(t, NULL);
    sc_status s = (sc_status)atomic_load(&first_use.result);
    if (s != want)
        fprintf(stderr, "%s failing with error %d: sc_buffer_create returned %s, want %s\n",
                entry, error, sc_status_name(s), sc_status_name(want));
    CHECK(s == want);
    return true;
}

static void default_stream_deadlock(void)
{
    static const char *const entries[] = {"cuCtxGetStreamPriorityRange",
                                          "cuStreamCreateWithPriority"};
    for (size_t i = 0; i < 2; i++) {
        fake_counts base = fake_counts_now();
        /* Sticky: the context is lost, no hang. */
        if (!run_first_use(entries[i], CUDA_ERROR_ILLEGAL_ADDRESS, SC_ERR_CONTEXT_LOST))
            return;
        check_lost(first_use.ctx, entries[i]);
        CHECK_OK(sc_context_destroy(first_use.ctx));
        check_fake(base, (fake_counts){0});

        /* Not sticky: the call fails, the next first use creates the default stream. */
        if (!run_first_use(entries[i], CUDA_ERROR_OUT_OF_MEMORY, SC_ERR_OUT_OF_MEMORY))
            return;
        check_usable(first_use.ctx);
        CHECK_OK(sc_context_destroy(first_use.ctx));
        check_fake(base, (fake_counts){0});
    }
}

/* ---- param-info-error ----------------------------------------------------------------------
 * read_params() took ANY failure of cuFuncGetParamInfo for the end of the parameter list:
 * a transient error gave a kernel handle that believed 'add' takes fewer parameters, so
 * sc_kernel_get said SC_OK and every correct launch was refused for good; a sticky error
 * did not mark the context lost. Fixed: only CUDA_ERROR_INVALID_VALUE ends the list. */
static void check_add_kernel(sc_context ctx, sc_module m)
{
    sc_kernel k = {0};
    CHECK_OK(sc_kernel_get(m, "add", &k));
    sc_kernel_props p;
    CHECK_OK(sc_kernel_info(k, &p));
    CHECK(p.n_params == 3);
    sc_buffer a = new_buffer(ctx, SC_DEFAULT_STREAM), b = new_buffer(ctx, SC_DEFAULT_STREAM);
    sc_launch_desc cfg = {.grid = {1, 1, 1}, .block = {32, 1, 1}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_in(sc_view_of(a)),
                       sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)));
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
}

static void param_info_error(void)
{
    static const struct {
        int error;
        sc_status want;
    } cases[] = {
        {CUDA_ERROR_OUT_OF_MEMORY, SC_ERR_OUT_OF_MEMORY},
        {CUDA_ERROR_UNKNOWN, SC_ERR_DRIVER},
        {CUDA_ERROR_ILLEGAL_ADDRESS, SC_ERR_CONTEXT_LOST},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (uint64_t nth = 1; nth <= 4; nth++) { /* parameters 0, 1, 2 and the end probe */
            fake_counts base = fake_counts_now();
            sc_context ctx = new_context();
            sc_module m;
            REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m) ==
                    SC_OK);
            sc_kernel k = {0};
            REQUIRE(sci_fault_arm("cuFuncGetParamInfo", nth, cases[i].error));
            sc_status s = sc_kernel_get(m, "add", &k);
            sci_fault_disarm();
            if (s != cases[i].want)
                fprintf(stderr, "cuFuncGetParamInfo call %llu failing with %d: sc_kernel_get "
                                "returned %s, want %s (%s)\n",
                        (unsigned long long)nth, cases[i].error, sc_status_name(s),
                        sc_status_name(cases[i].want), sc_last_error());
            CHECK(s == cases[i].want);
            CHECK(k.id == 0);
            check_message("sc_kernel_get", "cuFuncGetParamInfo", "'add'");
            size_t live = 0;
            CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
            CHECK(live == 1); /* the module only: no kernel was registered */
            if (cases[i].want == SC_ERR_CONTEXT_LOST) {
                CHECK_MSG("CUDA_ERROR_ILLEGAL_ADDRESS");
                check_lost(ctx, "cuFuncGetParamInfo");
            } else {
                check_add_kernel(ctx, m); /* a second try sees all three parameters */
            }
            CHECK_OK(sc_module_destroy(m));
            CHECK_OK(sc_context_destroy(ctx));
            check_fake(base, (fake_counts){0});
        }
    }

    /* CUDA_ERROR_INVALID_VALUE is the end of the list (the limit RELIABILITY.md names):
     * at the end probe it changes nothing. */
    fake_counts base = fake_counts_now();
    sc_context ctx = new_context();
    sc_module m;
    REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m) == SC_OK);
    REQUIRE(sci_fault_arm("cuFuncGetParamInfo", 4, CUDA_ERROR_INVALID_VALUE));
    check_add_kernel(ctx, m);
    sci_fault_disarm();
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_context_destroy(ctx));
    check_fake(base, (fake_counts){0});
}

/* ---- release-failure -----------------------------------------------------------------------
 * Failures of release calls were swallowed: the destroy returned SC_OK, the accounting said
 * the memory was free while the driver still held it. Fixed: the handle is gone either
 * way, the destroy returns the error's status with a message naming the call, and memory
 * the driver still holds stays accounted. */
typedef enum { R_BUFFER, R_BUFFER_EVENT, R_STREAM, R_EVENT, R_MODULE, R_HOST, R_COUNT } r_kind;

static void release_one(r_kind kind, int error, sc_status want)
{
    static const char *const entry[R_COUNT] = {"cuMemFreeAsync", "cuEventDestroy",
                                               "cuStreamDestroy", "cuEventDestroy",
                                               "cuModuleUnload", "cuMemFreeHost"};
    static const char *const fn[R_COUNT] = {"sc_buffer_destroy", "sc_buffer_destroy",
                                            "sc_stream_destroy", "sc_event_destroy",
                                            "sc_module_destroy", "sc_host_buffer_destroy"};
    bool sticky = want == SC_ERR_CONTEXT_LOST;
    fake.set_reclaim_on_release(sticky); /* as CUDA: a lost context's memory goes with it */
    fake_counts base = fake_counts_now();
    sc_context ctx = new_context();
    sc_stream s0, s1;
    REQUIRE(sc_stream_create(ctx, NULL, &s0) == SC_OK);
    REQUIRE(sc_stream_create(ctx, NULL, &s1) == SC_OK);
    sc_buffer b = new_buffer(ctx, s0);
    float one = 1.0f;
    if (kind == R_BUFFER_EVENT) /* used on two streams: its tracker holds events */
        REQUIRE(sc_fill(s1, sc_view_of(b), &one) == SC_OK);
    sc_event e;
    REQUIRE(sc_event_create(ctx, NULL, &e) == SC_OK);
    sc_module m;
    REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m) == SC_OK);
    sc_kernel k;
    REQUIRE(sc_kernel_get(m, "add", &k) == SC_OK);
    sc_host_buffer h;
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = BYTES}, &h) == SC_OK);

    REQUIRE(sci_fault_arm(entry[kind], 1, error));
    sc_status s;
    switch (kind) {
    case R_BUFFER: case R_BUFFER_EVENT: s = sc_buffer_destroy(b); break;
    case R_STREAM: s = sc_stream_destroy(s1); break;
    case R_EVENT: s = sc_event_destroy(e); break;
    case R_MODULE: s = sc_module_destroy(m); break;
    default: s = sc_host_buffer_destroy(h); break;
    }
    bool fired = sci_fault_fired();
    sci_fault_disarm();
    REQUIRE(fired);
    if (s != want)
        fprintf(stderr, "%s with %s failing (%d): %s, want %s (%s)\n", fn[kind], entry[kind],
                error, sc_status_name(s), sc_status_name(want), sc_last_error());
    CHECK(s == want);
    check_message(fn[kind], entry[kind], sci_cu_error_name((CUresult)error));

    /* The handle is gone either way. */
    switch (kind) {
    case R_BUFFER: case R_BUFFER_EVENT:
        CHECK_STATUS(sc_buffer_info(b, &(sc_buffer_props){0}), SC_ERR_STALE_HANDLE);
        CHECK_STATUS(sc_buffer_destroy(b), SC_ERR_STALE_HANDLE);
        break;
    case R_STREAM: CHECK_STATUS(sc_stream_destroy(s1), SC_ERR_STALE_HANDLE); break;
    case R_EVENT: CHECK_STATUS(sc_event_destroy(e), SC_ERR_STALE_HANDLE); break;
    case R_MODULE:
        CHECK_STATUS(sc_module_destroy(m), SC_ERR_STALE_HANDLE);
        CHECK_STATUS(sc_kernel_info(k, &(sc_kernel_props){0}), SC_ERR_STALE_HANDLE);
        break;
    default: CHECK_STATUS(sc_host_buffer_destroy(h), SC_ERR_STALE_HANDLE); break;
    }

    /* The accounting: memory the driver still holds stays counted; the object is not. */
    if (sticky) {
        check_lost(ctx, entry[kind]);
    } else {
        sc_memory_stats st;
        CHECK_OK(sc_context_memory(ctx, &st));
        bool buffer_gone = kind == R_BUFFER || kind == R_BUFFER_EVENT;
        CHECK(st.live_buffers == (buffer_gone ? 0u : 1u));
        CHECK(st.bytes_in_use == (kind == R_BUFFER_EVENT ? 0 : BYTES));
        CHECK(st.pinned_bytes == BYTES);
        check_usable(ctx);
    }

    /* Everything else is destroyed normally (on a lost context too: SC_OK). */
    if (kind != R_BUFFER && kind != R_BUFFER_EVENT)
        CHECK_OK(sc_buffer_destroy(b));
    if (kind != R_STREAM)
        CHECK_OK(sc_stream_destroy(s1));
    CHECK_OK(sc_stream_destroy(s0));
    if (kind != R_EVENT)
        CHECK_OK(sc_event_destroy(e));
    if (kind != R_MODULE)
        CHECK_OK(sc_module_destroy(m));
    if (kind != R_HOST)
        CHECK_OK(sc_host_buffer_destroy(h));
    CHECK_OK(sc_context_destroy(ctx));

    /* The fake holds the one object it was refused to free. */
    fake_counts more = {0};
    switch (kind) {
    case R_BUFFER: more.device = sticky ? 0 : 1; break; /* a lost context's memory went */
    case R_BUFFER_EVENT: case R_EVENT: more.events = 1; break;
    case R_STREAM: more.streams = 1; break;
    case R_MODULE: more.modules = 1; break;
    default: more.host = 1; break;
    }
    check_fake(base, more);
    if (more.device) { /* reclaim the refused free's memory, as the next release would */
        fake.set_reclaim_on_release(1);
        CUcontext pc;
        REQUIRE(sci_cuDevicePrimaryCtxRetain(&pc, 0) == CUDA_SUCCESS);
        REQUIRE(sci_cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
    }
    fake.set_reclaim_on_release(0);
}

/* The context's own releases, at sc_context_destroy. */
static void release_at_context_destroy(const char *entry, uint64_t nth, fake_counts more)
{
    fake_counts base = fake_counts_now();
    sc_context ctx = new_context();
    check_usable(ctx); /* creates the pool and the default stream */
    REQUIRE(sci_fault_arm(entry, nth, CUDA_ERROR_INVALID_VALUE));
    sc_status s = sc_context_destroy(ctx);
    bool fired = sci_fault_fired();
    sci_fault_disarm();
    REQUIRE(fired);
    if (s != SC_ERR_DRIVER)
        fprintf(stderr, "sc_context_destroy with %s failing: %s (%s)\n", entry,
                sc_status_name(s), sc_last_error());
    CHECK(s == SC_ERR_DRIVER);
    check_message("sc_context_destroy", entry, "CUDA_ERROR_INVALID_VALUE");
    CHECK_STATUS(sc_context_check(ctx), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_context_destroy(ctx), SC_ERR_STALE_HANDLE);
    if (more.refcount) /* give back the primary context reference the fault kept */
        REQUIRE(sci_cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
    check_fake(base, (fake_counts){.pools = more.pools, .streams = more.streams});
}

static void release_failure(void)
{
    for (r_kind k = 0; k < R_COUNT; k++) {
        release_one(k, CUDA_ERROR_INVALID_VALUE, SC_ERR_DRIVER);
        release_one(k, CUDA_ERROR_OUT_OF_MEMORY, SC_ERR_OUT_OF_MEMORY);
    }
    release_at_context_destroy("cuMemPoolDestroy", 1, (fake_counts){.pools = 1});
    release_at_context_destroy("cuStreamDestroy", 1, (fake_counts){.streams = 1}); /* default */
    release_at_context_destroy("cuDevicePrimaryCtxRelease", 1, (fake_counts){.refcount = 1});
}

/* ---- release-sticky ------------------------------------------------------------------------
 * A sticky error from a release call did not mark the context lost. */
static void release_sticky(void)
{
    for (r_kind k = 0; k < R_COUNT; k++)
        release_one(k, CUDA_ERROR_ILLEGAL_ADDRESS, SC_ERR_CONTEXT_LOST);

    /* At sc_context_destroy: the status says so (there is no context left to mark). */
    fake_counts base = fake_counts_now();
    sc_context ctx = new_context();
    check_usable(ctx);
    REQUIRE(sci_fault_arm("cuMemPoolDestroy", 1, CUDA_ERROR_ILLEGAL_ADDRESS));
    CHECK_STATUS(sc_context_destroy(ctx), SC_ERR_CONTEXT_LOST);
    sci_fault_disarm();
    check_message("sc_context_destroy", "cuMemPoolDestroy", "CUDA_ERROR_ILLEGAL_ADDRESS");
    check_fake(base, (fake_counts){.pools = 1});
}

/* ---- destroy-after-loss --------------------------------------------------------------------
 * The documented policy for objects of a context that was already lost: the destroy frees
 * the handle and the host memory and returns SC_OK (sc_stream_destroy answered
 * SC_ERR_CONTEXT_LOST, the other destroys SC_OK), leaving the message alone. */
static void destroy_after_loss(void)
{
    fake_counts base = fake_counts_now();
    fake.set_reclaim_on_release(1); /* as CUDA: the lost context's memory goes with it */
    sc_context ctx = new_context();
    sc_stream s0;
    REQUIRE(sc_stream_create(ctx, NULL, &s0) == SC_OK);
    sc_buffer b = new_buffer(ctx, s0);
    sc_event e;
    REQUIRE(sc_event_create(ctx, NULL, &e) == SC_OK);
    REQUIRE(sc_event_record(e, s0) == SC_OK);
    sc_module m;
    REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m) == SC_OK);
    sc_host_buffer h;
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = BYTES}, &h) == SC_OK);
    REQUIRE(sc_copy_to_host_buffer(s0, h, 0, sc_view_of(b)) == SC_OK);

    REQUIRE(sci_fault_arm("cuCtxSynchronize", 1, CUDA_ERROR_ILLEGAL_ADDRESS));
    CHECK_STATUS(sc_context_synchronize(ctx), SC_ERR_CONTEXT_LOST);
    sci_fault_disarm();
    check_lost(ctx, "cuCtxSynchronize");
    char before[1024];
    snprintf(before, sizeof before, "%s", sc_last_error());

    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_host_buffer_destroy(h));
    CHECK_OK(sc_event_destroy(e));
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_stream_destroy(s0));
    CHECK(strcmp(before, sc_last_error()) == 0);
    CHECK_STATUS(sc_buffer_destroy(b), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_stream_destroy(s0), SC_ERR_STALE_HANDLE);
    CHECK_OK(sc_context_destroy(ctx));
    fake.set_reclaim_on_release(0);
    check_fake(base, (fake_counts){0});
}

/* ---- tolerated-sticky ----------------------------------------------------------------------
 * Sticky errors from calls whose failure the library tolerates (the eager cuEventRecord of
 * cross-stream tracking, cuCtxGetCurrent, cuMemPoolSetAttribute) were ignored: the context
 * was not marked lost. Non-sticky errors there stay tolerated. */
static void tolerated_sticky(void)
{
    fake.set_reclaim_on_release(1);
    fake_counts base = fake_counts_now();

    /* The eager event record after a use of a buffer shared between streams. */
    for (int sticky = 0; sticky < 2; sticky++) {
        sc_context ctx = new_context();
        sc_stream s0, s1;
        REQUIRE(sc_stream_create(ctx, NULL, &s0) == SC_OK);
        REQUIRE(sc_stream_create(ctx, NULL, &s1) == SC_OK);
        sc_buffer b = new_buffer(ctx, s0);
        float one = 1.0f, two = 2.0f, out[N];
        REQUIRE(sc_fill(s1, sc_view_of(b), &one) == SC_OK); /* now shared: eager records */
        REQUIRE(sci_fault_arm("cuEventRecord", 1,
                              sticky ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE));
        sc_status s = sc_fill(s1, sc_view_of(b), &two);
        bool fired = sci_fault_fired();
        sci_fault_disarm();
        CHECK(fired);
        if (sticky) {
            CHECK(s == SC_ERR_CONTEXT_LOST);
            check_message("sc_fill", "cuEventRecord", "CUDA_ERROR_ILLEGAL_ADDRESS");
            check_lost(ctx, "cuEventRecord");
        } else {
            CHECK_OK(s);
            /* The use is recorded later, when s0 needs it: the data is right. */
            CHECK_OK(sc_copy_to_host(s0, out, sizeof out, sc_view_of(b)));
            CHECK(out[0] == 2.0f && out[N - 1] == 2.0f);
        }
        CHECK_OK(sc_buffer_destroy(b));
        CHECK_OK(sc_stream_destroy(s0));
        CHECK_OK(sc_stream_destroy(s1));
        CHECK_OK(sc_context_destroy(ctx));
        check_fake(base, (fake_counts){0});
    }

    /* cuCtxGetCurrent while making the context current. */
    sc_context ctx = new_context();
    REQUIRE(sci_fault_arm("cuCtxGetCurrent", 1, CUDA_ERROR_ILLEGAL_ADDRESS));
    CHECK_STATUS(sc_context_synchronize(ctx), SC_ERR_CONTEXT_LOST);
    sci_fault_disarm();
    check_message("sc_context_synchronize", "cuCtxGetCurrent", "CUDA_ERROR_ILLEGAL_ADDRESS");
    check_lost(ctx, "cuCtxGetCurrent");
    CHECK_OK(sc_context_destroy(ctx));
    check_fake(base, (fake_counts){0});

    /* cuMemPoolSetAttribute when the pool is created: the pool is still destroyed. */
    for (int sticky = 0; sticky < 2; sticky++) {
        ctx = new_context();
        sc_buffer b = {0};
        REQUIRE(sci_fault_arm("cuMemPoolSetAttribute", 1,
                              sticky ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE));
        sc_status s = sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N}, &b);
        sci_fault_disarm();
        if (sticky) {
            CHECK(s == SC_ERR_CONTEXT_LOST && b.id == 0);
            check_message("sc_buffer_create", "cuMemPoolSetAttribute", NULL);
            check_lost(ctx, "cuMemPoolSetAttribute");
        } else {
            CHECK_OK(s);
            CHECK_OK(sc_buffer_destroy(b));
            check_usable(ctx);
        }
        CHECK_OK(sc_context_destroy(ctx));
        check_fake(base, (fake_counts){0});
    }
    fake.set_reclaim_on_release(0);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } cases[] = {
        {"default-stream-deadlock", default_stream_deadlock},
        {"param-info-error", param_info_error},
        {"release-failure", release_failure},
        {"release-sticky", release_sticky},
        {"destroy-after-loss", destroy_after_loss},
        {"tolerated-sticky", tolerated_sticky},
    };
    fake_attach();
    sc_set_log_callback(NULL, NULL);
    const char *which = argc > 1 ? argv[1] : "";
    size_t i = 0;
    while (i < sizeof cases / sizeof cases[0] && strcmp(which, cases[i].name) != 0)
        i++;
    if (i == sizeof cases / sizeof cases[0]) {
        fprintf(stderr, "usage: %s CASE; cases:", argv[0]);
        for (size_t j = 0; j < sizeof cases / sizeof cases[0]; j++)
            fprintf(stderr, " %s", cases[j].name);
        fputc('\n', stderr);
        return 2;
    }
    cases[i].run();
    int r = test_result(which);
    fflush(stdout);
    fflush(stderr);
    _Exit(r); /* after a hang a thread may still hold locks: no atexit work */
}
