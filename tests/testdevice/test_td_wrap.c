/* Wrapped streams (safecuda/interop.h) against the test device: a CUstream made by
 * "another library" (this test, calling the test device's entry points directly, as the
 * CUDA runtime would call the driver) wrapped as an sc_stream; the checks of the wrap; work
 * and ordering on it; its destroy, which leaves the CUstream alive; and a capture that the
 * other library begins on it (as torch.cuda.graph does), which safecuda adopts: the same
 * refusals as its own captures, never ended by safecuda, forgotten once its owner ends it.
 * Nothing here says anything about a GPU. */
#include "../test.h"
#include "driver/cuda_api.h"
#include "td_control.h"
#include "safecuda/interop.h"

static sc_context ctx;

/* The other library's driver calls. */
static struct {
    CUresult (*stream_create)(CUstream *s, unsigned flags, int prio);
    CUresult (*stream_destroy)(CUstream s);
    CUresult (*begin_capture)(CUstream s, CUstreamCaptureMode mode);
    CUresult (*end_capture)(CUstream s, CUgraph *g);
    CUresult (*graph_destroy)(CUgraph g);
    CUresult (*mem_alloc)(CUdeviceptr *p, size_t n);
    CUresult (*mem_free)(CUdeviceptr p);
    int (*move_to_other_context)(CUstream s);
} other;

static void *entry(void *h, const char *name)
{
    CUresult (*get)(const char *, void **, int, cuuint64_t, int *) = NULL;
    void *sym = dlsym(h, "cuGetProcAddress_v2");
    REQUIRE(sym != NULL);
    memcpy(&get, &sym, sizeof sym);
    void *fn = NULL;
    REQUIRE(get(name, &fn, 13000, 0, NULL) == CUDA_SUCCESS && fn);
    return fn;
}

static void attach_other(void)
{
    void *h = dlopen(getenv("SAFECUDA_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h != NULL);
    void *p;
    p = entry(h, "cuStreamCreateWithPriority"); memcpy(&other.stream_create, &p, sizeof p);
    p = entry(h, "cuStreamDestroy"); memcpy(&other.stream_destroy, &p, sizeof p);
    p = entry(h, "cuStreamBeginCapture"); memcpy(&other.begin_capture, &p, sizeof p);
    p = entry(h, "cuStreamEndCapture"); memcpy(&other.end_capture, &p, sizeof p);
    p = entry(h, "cuGraphDestroy"); memcpy(&other.graph_destroy, &p, sizeof p);
    p = entry(h, "cuMemAlloc"); memcpy(&other.mem_alloc, &p, sizeof p);
    p = entry(h, "cuMemFree"); memcpy(&other.mem_free, &p, sizeof p);
    p = dlsym(h, "safecuda_testdevice_move_stream_to_other_context");
    REQUIRE(p != NULL);
    memcpy(&other.move_to_other_context, &p, sizeof p);
    dlclose(h);
}

static CUstream foreign_stream(void)
{
    CUstream s = NULL;
    REQUIRE(other.stream_create(&s, CU_STREAM_NON_BLOCKING, -2) == CUDA_SUCCESS);
    return s;
}

static sc_buffer make_f32(uint64_t n, const char *label)
{
    sc_buffer b = {0};
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = label},
                             &b) == SC_OK);
    return b;
}

static void test_wrap_checks(void)
{
    CUstream cu = foreign_stream();
    sc_stream w = {0};
    CHECK_STATUS(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)cu, "torch", NULL),
                 SC_ERR_INVALID_ARGUMENT);
    /* A destroyed CUstream: the driver answers an invalid handle (for a value that never
     * was a stream, the real driver's answer is undefined). */
    CUstream gone = foreign_stream();
    REQUIRE(other.stream_destroy(gone) == CUDA_SUCCESS);
    long misuse = fake.misuse_count();
    CHECK_STATUS(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)gone, "gone", &w),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_stream_wrap: 'gone': CUstream 0x");
    CHECK_MSG("is not a live stream");
    CHECK(w.id == 0);
    CHECK(fake.misuse_count() == misuse + 1); /* the test device counts the query */
    CHECK_STATUS(sc_stream_wrap((sc_context){0}, (uint64_t)(uintptr_t)cu, "x", &w),
                 SC_ERR_STALE_HANDLE);

    CHECK_OK(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)cu, "torch", &w));
    bool wrapped = false;
    CHECK_OK(sc_stream_is_wrapped(w, &wrapped));
    CHECK(wrapped);
    uint64_t handle = 0;
    CHECK_OK(sc_stream_cu_handle(w, &handle));
    CHECK(handle == (uint64_t)(uintptr_t)cu);
    int prio = 0;
    CHECK_OK(sc_stream_priority(w, &prio));
    CHECK(prio == -2);
    sc_stream own = {0}, def = {0};
    CHECK_OK(sc_stream_create(ctx, NULL, &own));
    CHECK_OK(sc_stream_is_wrapped(own, &wrapped));
    CHECK(!wrapped);
    CHECK_OK(sc_stream_cu_handle(own, &handle));
    CHECK(handle != 0);
    CHECK_OK(sc_context_default_stream(ctx, &def));
    CHECK_OK(sc_stream_cu_handle(def, &handle));
    CHECK_STATUS(sc_stream_cu_handle(SC_DEFAULT_STREAM, &handle), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_context_default_stream");
    CHECK_STATUS(sc_stream_cu_handle(own, NULL), SC_ERR_INVALID_ARGUMENT);

    /* The legacy and per-thread default streams can be wrapped (PyTorch's default
     * current stream is the legacy one, handle 0). */
    sc_stream legacy = {0}, per_thread = {0}, legacy1 = {0};
    CHECK_OK(sc_stream_wrap(ctx, 0, NULL, &legacy));
    CHECK_OK(sc_stream_wrap(ctx, 1, NULL, &legacy1));
    CHECK_STATUS(sc_stream_wrap(ctx, 2, "per-thread", &per_thread), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("per-thread default stream");
    per_thread = legacy1;
    sc_buffer b = make_f32(64, "b");
    const float v = 3.0f;
    float back[64];
    CHECK_OK(sc_fill(legacy, sc_view_of(b), &v));
    CHECK_OK(sc_copy_to_host(per_thread, back, sizeof back, sc_view_of(b)));
    CHECK(back[0] == 3.0f && back[63] == 3.0f);
    CHECK_OK(sc_stream_synchronize(legacy));
    CHECK_OK(sc_stream_destroy(legacy));
    CHECK_OK(sc_stream_destroy(legacy1));

    /* Destroying the wrapper leaves the CUstream to its owner. */
    long streams = fake.live_streams();
    CHECK_OK(sc_stream_destroy(w));
    CHECK(fake.live_streams() == streams);
    CHECK_STATUS(sc_stream_synchronize(w), SC_ERR_STALE_HANDLE);
    CHECK_OK(sc_stream_destroy(own));
    CHECK_OK(sc_buffer_destroy(b));

    /* A stream of another CUDA context. */
    REQUIRE(other.move_to_other_context(cu));
    CHECK_STATUS(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)cu, "elsewhere", &w),
                 SC_ERR_WRONG_CONTEXT);
    CHECK_MSG("belongs to another CUDA context");
    CHECK(other.stream_destroy(cu) == CUDA_SUCCESS);
}

/* Work on a wrapped stream is tracked like work on safecuda's own streams. */
static void test_ordering(void)
{
    CUstream cu = foreign_stream();
    sc_stream w = {0}, own = {0};
    CHECK_OK(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)cu, "torch", &w));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "mine"}, &own));
    sc_buffer b = make_f32(256, "shared");
    float h[256], back[256];
    for (int i = 0; i < 256; i++)
        h[i] = (float)i * 0.25f;
    long events = fake.live_events();
    CHECK_OK(sc_copy_from_host(w, sc_view_of(b), h, sizeof h));
    CHECK_OK(sc_copy_to_host(own, back, sizeof back, sc_view_of(b)));
    CHECK_BYTES(back, h, sizeof h, "read on another stream after a write on the wrapped one");
    CHECK(fake.live_events() > events); /* the read waited on an event of the wrapped stream */
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_stream_destroy(w));
    CHECK_OK(sc_stream_destroy(own));
    CHECK(other.stream_destroy(cu) == CUDA_SUCCESS);
}

/* The other library captures its stream: safecuda sees it at its next use. */
static void test_foreign_capture(void)
{
    CUstream cu = foreign_stream();
    sc_stream w = {0}, own = {0};
    CHECK_OK(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)cu, "torch", &w));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "mine"}, &own));
    sc_buffer a = make_f32(64, "a"), b = make_f32(64, "b");
    const float one = 1.0f, two = 2.0f;
    CHECK_OK(sc_fill(own, sc_view_of(a), &one));
    CHECK_OK(sc_stream_synchronize(own));

    long captures = fake.active_captures();
    REQUIRE(other.begin_capture(cu, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK_OK(sc_fill(w, sc_view_of(b), &two));          /* captured, not run */
    CHECK_OK(sc_copy(w, sc_view_of(a), sc_view_of(b)));  /* ordered in the capture */
    CHECK_STATUS(sc_stream_synchronize(w), SC_ERR_CAPTURE);
    CHECK_MSG("begun by another library");
    sc_buffer c = {0};
    CHECK_STATUS(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 4, .stream = w},
                                  &c),
                 SC_ERR_CAPTURE);
    sc_graph g = {0};
    CHECK_STATUS(sc_stream_end_capture(w, &g), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("end it there");
    CHECK(fake.active_captures() == captures + 1); /* still the other library's */

    CUgraph cg = NULL;
    CHECK(other.end_capture(cu, &cg) == CUDA_SUCCESS && cg);
    CHECK(other.graph_destroy(cg) == CUDA_SUCCESS);
    /* Ended by its owner: safecuda follows at the next use. Nothing ran. */
    CHECK_OK(sc_stream_synchronize(w));
    float back[64];
    CHECK_OK(sc_copy_to_host(w, back, sizeof back, sc_view_of(a)));
    CHECK(back[0] == 1.0f && back[63] == 1.0f);

    /* A buffer only ever used on the wrapped stream, the stream then captured by its owner,
     * and a conflicting use on another stream during it: the point safecuda recorded on
     * the wrapped stream after its last work there (nothing can be recorded once it
     * captures) holds the earlier use, and the other stream waits for it. */
    sc_buffer d = {0};
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 64, .stream = w},
                              &d));
    CHECK_OK(sc_fill(w, sc_view_of(d), &two));
    CHECK_OK(sc_fill(w, sc_view_of(b), &two));
    REQUIRE(other.begin_capture(cu, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK_OK(sc_fill(own, sc_view_of(d), &one));
    CHECK_OK(sc_fill(own, sc_view_of(b), &one));
    /* Destroying the wrapper during the other library's capture leaves the capture alone. */
    CHECK_OK(sc_stream_destroy(w));
    CHECK(fake.active_captures() == captures + 1);
    CHECK(other.end_capture(cu, &cg) == CUDA_SUCCESS);
    if (cg)
        CHECK(other.graph_destroy(cg) == CUDA_SUCCESS);
    CHECK(fake.active_captures() == captures);
    CHECK_OK(sc_fill(own, sc_view_of(d), &one));
    CHECK_OK(sc_stream_synchronize(own));

    CHECK_OK(sc_buffer_destroy(d));
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_stream_destroy(own));
    CHECK(other.stream_destroy(cu) == CUDA_SUCCESS);
}

static int releases;
static void count_release(void *user)
{
    (void)user;
    releases++;
}

/* What the PyTorch operator does inside torch.cuda.graph: the other library's memory
 * borrowed with the capturing stream as its owner, safecuda's work captured on it, the
 * borrowed buffers destroyed inside the capture. Their release runs at once (the owner's
 * next use is later in the same graph) and nothing waits on the host, which would
 * invalidate the capture. */
static void test_borrow_inside_foreign_capture(void)
{
    CUstream cu = foreign_stream();
    CUdeviceptr px = 0, pout = 0;
    REQUIRE(other.mem_alloc(&px, 4096) == CUDA_SUCCESS);
    REQUIRE(other.mem_alloc(&pout, 4096) == CUDA_SUCCESS);
    sc_stream w = {0};
    CHECK_OK(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)cu, "torch capture", &w));
    REQUIRE(other.begin_capture(cu, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    releases = 0;
    sc_buffer x = {0}, out = {0};
    CHECK_OK(sc_buffer_borrow(ctx, px, &(sc_borrow_desc){.dtype = SC_F32, .count = 1024,
                                                        .label = "x", .stream = w,
                                                        .release = count_release},
                              &x));
    CHECK_OK(sc_buffer_borrow(ctx, pout, &(sc_borrow_desc){.dtype = SC_F32, .count = 1024,
                                                          .label = "out", .stream = w,
                                                          .release = count_release},
                              &out));
    CHECK_OK(sc_copy(w, sc_view_of(out), sc_view_of(x)));
    long misuse = fake.misuse_count();
    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_buffer_destroy(out));
    CHECK(releases == 2);
    CHECK(fake.misuse_count() == misuse);
    CUgraph cg = NULL;
    CHECK(other.end_capture(cu, &cg) == CUDA_SUCCESS && cg); /* not invalidated */
    if (cg)
        CHECK(other.graph_destroy(cg) == CUDA_SUCCESS);
    CHECK_OK(sc_stream_destroy(w));
    CHECK(other.mem_free(px) == CUDA_SUCCESS);
    CHECK(other.mem_free(pout) == CUDA_SUCCESS);
    CHECK(other.stream_destroy(cu) == CUDA_SUCCESS);
}

/* The owner writes its memory on the wrapped stream after safecuda's last work there, then
 * lends it (a borrow naming that stream): the point is recorded at the borrow, so another
 * stream's use during a later capture by the owner waits for those writes. A borrow made
 * while the owner captures can't record one: such a wait is refused instead of being
 * ordered after an older point. */
static void test_owner_writes_before_capture(void)
{
    CUstream cu = foreign_stream();
    CUdeviceptr p1 = 0, p2 = 0;
    REQUIRE(other.mem_alloc(&p1, 4096) == CUDA_SUCCESS);
    REQUIRE(other.mem_alloc(&p2, 4096) == CUDA_SUCCESS);
    sc_stream w = {0}, own = {0};
    CHECK_OK(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)cu, "torch", &w));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "mine"}, &own));
    const float one = 1.0f;
    sc_buffer before = {0}, during = {0};
    CHECK_OK(sc_buffer_borrow(ctx, p1, &(sc_borrow_desc){.dtype = SC_F32, .count = 1024,
                                                        .label = "lent before", .stream = w},
                              &before));
    REQUIRE(other.begin_capture(cu, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK_OK(sc_fill(own, sc_view_of(before), &one)); /* waits on the point of the borrow */
    CHECK_OK(sc_buffer_borrow(ctx, p2, &(sc_borrow_desc){.dtype = SC_F32, .count = 1024,
                                                        .label = "lent during", .stream = w},
                              &during));
    CHECK_STATUS(sc_fill(own, sc_view_of(during), &one), SC_ERR_CAPTURE);
    CHECK_MSG("before the library that made that stream began capturing it");
    CUgraph cg = NULL;
    CHECK(other.end_capture(cu, &cg) == CUDA_SUCCESS && cg);
    if (cg)
        CHECK(other.graph_destroy(cg) == CUDA_SUCCESS);
    CHECK_OK(sc_fill(own, sc_view_of(during), &one)); /* outside the capture: ordered */
    CHECK_OK(sc_buffer_destroy(before));
    CHECK_OK(sc_buffer_destroy(during));
    CHECK_OK(sc_stream_destroy(own));
    CHECK_OK(sc_stream_destroy(w));
    CHECK(other.mem_free(p1) == CUDA_SUCCESS);
    CHECK(other.mem_free(p2) == CUDA_SUCCESS);
    CHECK(other.stream_destroy(cu) == CUDA_SUCCESS);
}

/* Review findings on adopted captures: (1) once the owner ends its capture, safecuda's
 * context-wide calls work again without the wrapped stream being touched; (2) one of
 * safecuda's own streams forked into the capture leaves it with it; (3) destroying such
 * a member during the capture leaves the owner's capture valid (its CUstream is destroyed
 * once the capture has ended). */
static void test_adopted_capture_lifetime(void)
{
    CUstream cu = foreign_stream();
    sc_stream w = {0}, own = {0}, member = {0};
    CHECK_OK(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)cu, "torch", &w));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "forked"}, &own));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "member"}, &member));
    sc_buffer a = make_f32(64, "a"), b = make_f32(64, "b");
    sc_event fork = {0}, join = {0}, fork2 = {0};
    CHECK_OK(sc_event_create(ctx, NULL, &fork));
    CHECK_OK(sc_event_create(ctx, NULL, &join));
    CHECK_OK(sc_event_create(ctx, NULL, &fork2));
    const float one = 1.0f;

    REQUIRE(other.begin_capture(cu, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK_OK(sc_fill(w, sc_view_of(a), &one));
    CHECK_STATUS(sc_context_synchronize(ctx), SC_ERR_CAPTURE);
    CHECK_OK(sc_event_record(fork, w));
    CHECK_OK(sc_stream_wait(own, fork));   /* own joins the capture */
    CHECK_OK(sc_fill(own, sc_view_of(b), &one));
    CHECK_OK(sc_event_record(join, own));
    CHECK_OK(sc_stream_wait(w, join));     /* and joins back */
    CHECK_OK(sc_event_record(fork2, w));
    CHECK_OK(sc_stream_wait(member, fork2));
    CHECK_STATUS(sc_stream_synchronize(own), SC_ERR_CAPTURE);
    long streams = fake.live_streams();
    CHECK_OK(sc_stream_destroy(member));      /* forked in, never joined back */
    CHECK(fake.live_streams() == streams);    /* its CUstream's destroy waits */
    CUgraph cg = NULL;
    CHECK(other.end_capture(cu, &cg) == CUDA_SUCCESS && cg); /* still valid */
    if (cg)
        CHECK(other.graph_destroy(cg) == CUDA_SUCCESS);
    /* Nothing of safecuda's touched w since: the context-wide call sees the end. */
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK(fake.live_streams() == streams - 1); /* the deferred destroy ran */
    CHECK_OK(sc_stream_synchronize(own));      /* left the capture with it */
    CHECK_OK(sc_fill(own, sc_view_of(b), &one));

    CHECK_OK(sc_event_destroy(fork));
    CHECK_OK(sc_event_destroy(join));
    CHECK_OK(sc_event_destroy(fork2));
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_stream_destroy(own));
    CHECK_OK(sc_stream_destroy(w));
    CHECK(other.stream_destroy(cu) == CUDA_SUCCESS);
}

/* A leaked wrapper is reported (as a wrapped stream) and forgotten, not destroyed. */
static void test_leak(void)
{
    sc_context c2 = {0};
    REQUIRE(sc_context_create(NULL, &c2) == SC_OK);
    CUstream cu = foreign_stream();
    sc_stream w = {0};
    CHECK_OK(sc_stream_wrap(c2, (uint64_t)(uintptr_t)cu, "leaky", &w));
    long streams = fake.live_streams();
    test_log_text[0] = '\0';
    sc_set_log_callback(test_log_capture, NULL);
    CHECK_STATUS(sc_context_destroy(c2), SC_ERR_LEAKED);
    sc_set_log_callback(NULL, NULL);
    CHECK(strstr(test_log_text, "leaky") && strstr(test_log_text, "wrapped CUstream") &&
          strstr(test_log_text, "test_td_wrap.c"));
    CHECK(fake.live_streams() == streams);
    CHECK_OK(sc_context_synchronize(ctx)); /* the primary context current again */
    CHECK(other.stream_destroy(cu) == CUDA_SUCCESS);
}

int main(void)
{
    fake_attach();
    attach_other();
    fake_counts start = fake_counts_now();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    TEST_RUN(test_wrap_checks);
    TEST_RUN(test_ordering);
    TEST_RUN(test_foreign_capture);
    TEST_RUN(test_borrow_inside_foreign_capture);
    TEST_RUN(test_adopted_capture_lifetime);
    TEST_RUN(test_owner_writes_before_capture);
    TEST_RUN(test_leak);
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    char diff[512];
    CHECK(fake_counts_diff(start, fake_counts_now(), diff, sizeof diff) == 0);
    if (diff[0])
        fprintf(stderr, "the test device's objects differ: %s\n", diff);
    CHECK(fake.misuse_count() == 1); /* the destroyed stream's query, above */
    if (fake.misuse_count() != 1)
        fprintf(stderr, "misuse: %s\n", fake.last_misuse());
    return test_result("test_td_wrap");
}
