/* The test device's stream capture, graphs and launch attributes, driven through the
 * library's driver wrappers (sci_cu*): what is recorded instead of run, replay moving the
 * bytes, every refusal with its exact code, invalidation, fork and join, threads, graph
 * update, cluster and cooperative launches; the misuse counter moves exactly where the test
 * device promises it does, and every object is gone at the end.
 *
 *   test_testdevice_graphs accept   launches accepted (SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES=1)
 *   test_testdevice_graphs refuse   the default: launches and graphs with kernels refused
 *   test_testdevice_graphs sm80     the device reports sm_80 (no clusters)
 *
 * TEST DEVICE FOR HOST TESTS ONLY: nothing here says anything about a GPU. */
#include <pthread.h>
#include <stdint.h>

#include "../test.h"
#include "driver/driver.h"
#include "td_control.h"
#include "td_ptx.h"

static int accepting, sm80;

/* Expect r and exactly `count` new misuses. */
#define EXPECT(expr, want_r, new_misuse)                                                  \
    do {                                                                                  \
        int m0_ = fake.misuse_count();                                                    \
        CUresult r_ = (expr);                                                             \
        if (r_ != (want_r) || fake.misuse_count() - m0_ != (new_misuse)) {                \
            fprintf(stderr, "%s:%d: %s = %s with %d new misuses; expected %s and %d (%s)\n", \
                    __FILE__, __LINE__, #expr, sci_cu_error_name(r_),                    \
                    fake.misuse_count() - m0_, sci_cu_error_name(want_r), (int)(new_misuse), \
                    fake.last_misuse());                                                  \
            test_failures++;                                                              \
        }                                                                                 \
    } while (0)
#define OK(expr) EXPECT(expr, CUDA_SUCCESS, 0)

static const CUresult INVAL = CUDA_ERROR_INVALID_VALUE;
static const CUresult UNSUPPORTED = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
static const CUresult INVALIDATED = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;

/* Kernels with clusters, as nvcc writes them for __cluster_dims__(2, 1, 1) (valid PTX). */
static const char cluster_ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                                  ".visible .entry clustered(\n"
                                  "    .param .u64 clustered_param_0\n)\n"
                                  ".explicitcluster\n.reqnctapercluster 2, 1, 1\n{\n    ret;\n}\n"
                                  ".visible .entry explicit_only()\n.explicitcluster\n"
                                  "{\n    ret;\n}\n"
                                  ".visible .entry plain(\n    .param .u32 plain_param_0\n)\n"
                                  "{\n    ret;\n}\n";

static CUcontext ctx;
static CUstream s1, s2, s3, sb; /* s1..s3 non-blocking, sb blocking */
static CUdeviceptr d1, d2;      /* 4096 bytes each */
static unsigned char *pin;      /* 8192 pinned bytes */
static CUmodule mod;
static CUfunction add_fn, pack_fn;

static CUstreamCaptureStatus status_of(CUstream s)
{
    CUstreamCaptureStatus st = (CUstreamCaptureStatus)99;
    OK(sci_cuStreamIsCapturing(s, &st));
    return st;
}

static cuuint64_t capture_id(CUstream s)
{
    CUstreamCaptureStatus st;
    cuuint64_t id = 0;
    OK(sci_cuStreamGetCaptureInfo(s, &st, &id));
    return st == CU_STREAM_CAPTURE_STATUS_NONE ? 0 : id;
}

static size_t nodes_of(CUgraph g)
{
    size_t n = 999;
    OK(sci_cuGraphGetNodes(g, NULL, &n));
    return n;
}

/* End a capture that must succeed. */
static CUgraph end_ok(CUstream s)
{
    CUgraph g = NULL;
    OK(sci_cuStreamEndCapture(s, &g));
    CHECK(g != NULL);
    return g;
}

/* End a capture that was invalidated: NULL graph, no new misuse, the stream free again. */
static void end_invalidated(CUstream s)
{
    CUgraph g = (CUgraph)(uintptr_t)1;
    EXPECT(sci_cuStreamEndCapture(s, &g), INVALIDATED, 0);
    CHECK(g == NULL);
    CHECK(status_of(s) == CU_STREAM_CAPTURE_STATUS_NONE);
}

static void host_count(void *user) { ++*(int *)user; }

static void get_device_bytes(void *out, CUdeviceptr d, size_t n)
{
    OK(sci_cuMemcpyDtoHAsync(out, d, n, s3));
}

/* ---- capture records, replay moves the bytes --------------------------------------------- */

static void test_capture_and_replay(void)
{
    int calls = 0;
    OK(sci_cuMemsetD8Async(d1, 0, 4096, s3));
    OK(sci_cuMemsetD8Async(d2, 0, 4096, s3));
    for (int i = 0; i < 256; i++)
        pin[i] = (unsigned char)(i + 1);

    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
    cuuint64_t id = capture_id(s1);
    CHECK(id != 0);
    CHECK(fake.active_captures() == 1);
    OK(sci_cuMemcpyHtoDAsync(d1, pin, 256, s1));
    OK(sci_cuMemsetD32Async(d1 + 256, 0xa5a5a5a5u, 64, s1));
    OK(sci_cuMemsetD16Async(d1 + 512, 0x1234, 8, s1));
    OK(sci_cuMemsetD8Async(d1 + 528, 0x77, 16, s1));
    OK(sci_cuMemsetD2D32Async(d1 + 1024, 16, 0x01020304u, 2, 4, s1)); /* 4 rows of 8 bytes */
    OK(sci_cuMemcpyDtoDAsync(d2, d1, 2048, s1));
    OK(sci_cuMemcpyDtoHAsync(pin + 4096, d2, 2048, s1));
    OK(sci_cuLaunchHostFunc(s1, host_count, &calls));
    OK(sci_cuMemcpyHtoDAsync(d1, pin, 0, s1));  /* empty: no node */
    OK(sci_cuMemsetD8Async(d1, 1, 0, s1));      /* empty: no node */
    /* Nothing ran. */
    unsigned char now[2048];
    get_device_bytes(now, d1, sizeof now);
    unsigned char zero[2048] = {0};
    CHECK(memcmp(now, zero, sizeof now) == 0);
    CHECK(calls == 0);
    CUgraph g = end_ok(s1);
    CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK(capture_id(s1) == 0);
    CHECK(fake.active_captures() == 0);
    CHECK(fake.live_graphs() == 1);

    /* The nodes, in capture order. */
    CHECK(nodes_of(g) == 8);
    CUgraphNode nodes[10];
    size_t n = 2;
    OK(sci_cuGraphGetNodes(g, nodes, &n));
    CHECK(n == 2 && nodes[0] && nodes[1] && nodes[0] != nodes[1]);
    n = 10;
    OK(sci_cuGraphGetNodes(g, nodes, &n));
    CHECK(n == 8 && nodes[7] != NULL && nodes[8] == NULL && nodes[9] == NULL);
    EXPECT(sci_cuGraphGetNodes(g, nodes, NULL), INVAL, 1);

    CUgraphExec x = NULL;
    OK(sci_cuGraphInstantiateWithFlags(&x, g, 0));
    CHECK(x != NULL && fake.live_graph_execs() == 1);
    OK(sci_cuGraphDestroy(g)); /* the executable graph is a copy */
    CHECK(fake.live_graphs() == 0);

    /* Replay: the bytes move now, and again with new input. */
    for (int round = 0; round < 2; round++) {
        OK(sci_cuGraphLaunch(x, s2));
        CHECK(calls == round + 1);
        unsigned char *out = pin + 4096;
        int good = 1;
        for (int i = 0; i < 256; i++)
            good &= out[i] == (unsigned char)(i + 1 + round * 3);
        for (int i = 256; i < 512; i++)
            good &= out[i] == 0xa5;
        for (int i = 512; i < 528; i += 2)
            good &= out[i] == 0x34 && out[i + 1] == 0x12;
        for (int i = 528; i < 544; i++)
            good &= out[i] == 0x77;
        for (int row = 0; row < 4; row++)
            for (int i = 0; i < 16; i++)
                good &= out[1024 + row * 16 + i] == (i < 8 ? (unsigned char)(4 - i % 4) : 0);
        CHECK(good);
        for (int i = 0; i < 256; i++)
            pin[i] = (unsigned char)(i + 4); /* the next replay copies these */
    }
    OK(sci_cuGraphExecDestroy(x));
    CHECK(fake.live_graph_execs() == 0);
    EXPECT(sci_cuGraphExecDestroy(x), INVAL, 1);
    EXPECT(sci_cuGraphLaunch(x, s1), INVAL, 1);
    EXPECT(sci_cuGraphDestroy(g), INVAL, 1);
    EXPECT(sci_cuGraphInstantiateWithFlags(&x, g, 0), INVAL, 1);

    /* Every capture has its own id. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    cuuint64_t id2 = capture_id(s1);
    CHECK(id2 != 0 && id2 != id);
    g = end_ok(s1);
    CHECK(nodes_of(g) == 0); /* an empty capture is an empty graph */
    EXPECT(sci_cuGraphInstantiateWithFlags(&x, g, 1ull << 20), INVAL, 1);
    OK(sci_cuGraphDestroy(g));
}

/* ---- kernels in graphs ------------------------------------------------------------------- */

static void test_kernel_nodes(void)
{
    long refused = fake.refused_launches();
    uint64_t a0 = d1, a1 = d2;
    uint32_t a2 = 16;
    void *params[] = {&a0, &a1, &a2};
    OK(sci_cuMemsetD8Async(d2, 0, 64, s3));
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuLaunchKernel(add_fn, 1, 1, 1, 32, 1, 1, 0, s1, params, NULL)); /* recorded */
    EXPECT(sci_cuLaunchKernel(add_fn, 1, 1, 1, 32, 1, 1, 0, s1, NULL, NULL), INVAL, 1);
    end_invalidated(s1); /* a launch that fails during capture invalidates it */

    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuLaunchKernel(add_fn, 1, 1, 1, 32, 1, 1, 0, s1, params, NULL));
    OK(sci_cuMemsetD8Async(d2, 9, 64, s1));
    CUgraph g = end_ok(s1);
    CHECK(fake.refused_launches() == refused); /* recording runs nothing */
    CHECK(nodes_of(g) == 2);
    CUgraphExec x = NULL;
    OK(sci_cuGraphInstantiateWithFlags(&x, g, 0));
    unsigned char b[64];
    if (accepting) { /* the kernel is skipped, the memset runs */
        OK(sci_cuGraphLaunch(x, s1));
        get_device_bytes(b, d2, 64);
        CHECK(b[0] == 9 && b[63] == 9);
    } else { /* the whole graph is refused: nothing runs */
        EXPECT(sci_cuGraphLaunch(x, s1), CUDA_ERROR_NOT_SUPPORTED, 0);
        CHECK(fake.refused_launches() == refused + 1);
        get_device_bytes(b, d2, 64);
        CHECK(b[0] == 0 && b[63] == 0);
        const char *text = NULL;
        OK(sci_cuGetErrorString(CUDA_ERROR_NOT_SUPPORTED, &text));
        CHECK(text && strstr(text, "kernels do not run on the safecuda test device"));
    }
    OK(sci_cuGraphExecDestroy(x));
    OK(sci_cuGraphDestroy(g));

    /* A kernel node whose module was unloaded since the capture. */
    CUmodule m2 = NULL;
    CUfunction add2 = NULL;
    OK(sci_cuModuleLoadDataEx(&m2, fake_test_ptx, 0, NULL, NULL));
    OK(sci_cuModuleGetFunction(&add2, m2, "add"));
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuLaunchKernel(add2, 1, 1, 1, 32, 1, 1, 0, s1, params, NULL));
    g = end_ok(s1);
    OK(sci_cuGraphInstantiateWithFlags(&x, g, 0));
    OK(sci_cuModuleUnload(m2));
    EXPECT(sci_cuGraphLaunch(x, s1), INVAL, 1);
    OK(sci_cuGraphExecDestroy(x));
    OK(sci_cuGraphDestroy(g));
}

/* ---- refusals and invalidation ----------------------------------------------------------- */

static void test_begin_end_refusals(void)
{
    EXPECT(sci_cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), UNSUPPORTED, 1);
    EXPECT(sci_cuStreamBeginCapture((CUstream)(uintptr_t)1, CU_STREAM_CAPTURE_MODE_GLOBAL),
           UNSUPPORTED, 1);
    EXPECT(sci_cuStreamBeginCapture((CUstream)(uintptr_t)2, CU_STREAM_CAPTURE_MODE_GLOBAL), INVAL,
           1);
    EXPECT(sci_cuStreamBeginCapture(s1, (CUstreamCaptureMode)7), INVAL, 1);
    CUgraph g = NULL;
    EXPECT(sci_cuStreamEndCapture(s1, &g), CUDA_ERROR_ILLEGAL_STATE, 1);
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE,
           1);
    CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE); /* refused, not invalidated */
    EXPECT(sci_cuStreamEndCapture(s1, NULL), INVAL, 1);
    CUstreamCaptureStatus st;
    EXPECT(sci_cuStreamIsCapturing(s1, NULL), INVAL, 1);
    EXPECT(sci_cuStreamGetCaptureInfo(s1, NULL, NULL), INVAL, 1);
    OK(sci_cuStreamGetCaptureInfo(s1, &st, NULL)); /* the id is optional */
    g = end_ok(s1);
    OK(sci_cuGraphDestroy(g));
}

static void test_stream_refusals(void)
{
    unsigned char pageable[64] = {0};
    /* A pageable copy invalidates; later operations answer INVALIDATED, uncounted. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuMemsetD8Async(d1, 3, 16, s1));
    EXPECT(sci_cuMemcpyHtoDAsync(d1, pageable, 16, s1), UNSUPPORTED, 1);
    CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    EXPECT(sci_cuMemsetD8Async(d1, 3, 16, s1), INVALIDATED, 0);
    EXPECT(sci_cuLaunchHostFunc(s1, host_count, pageable), INVALIDATED, 0);
    EXPECT(sci_cuStreamSynchronize(s1), INVALIDATED, 0);
    end_invalidated(s1);
    OK(sci_cuStreamSynchronize(s1)); /* the stream is an ordinary stream again */

    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT(sci_cuMemcpyDtoHAsync(pageable, d1, 16, s1), UNSUPPORTED, 1);
    end_invalidated(s1);

    /* Synchronizing or querying a capturing stream. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT(sci_cuStreamSynchronize(s1), UNSUPPORTED, 1);
    end_invalidated(s1);
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(sci_cuStreamQuery(s2)); /* another stream: fine */
    EXPECT(sci_cuStreamQuery(s1), UNSUPPORTED, 1);
    end_invalidated(s1);

    /* Stream-ordered allocation on a capturing stream (memory nodes: not modelled). */
    CUmemPoolProps props = {0};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemoryPool pool = NULL;
    OK(sci_cuMemPoolCreate(&pool, &props));
    CUdeviceptr p = 0;
    OK(sci_cuMemAllocFromPoolAsync(&p, 256, pool, s2));
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUdeviceptr q = 0;
    EXPECT(sci_cuMemAllocFromPoolAsync(&q, 256, pool, s1), UNSUPPORTED, 1);
    end_invalidated(s1);
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT(sci_cuMemFreeAsync(p, s1), UNSUPPORTED, 1);
    OK(sci_cuMemFreeAsync(p, s2)); /* on a stream that is not capturing: fine */
    end_invalidated(s1);
    OK(sci_cuMemPoolDestroy(pool));

    /* A capturing stream can't be destroyed; it stays alive. */
    long streams = fake.live_streams();
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(sci_cuStreamDestroy(s1), UNSUPPORTED, 1);
    CHECK(fake.live_streams() == streams);
    end_invalidated(s1);

    /* A graph launched into a capturing stream (a child graph: not modelled). */
    OK(sci_cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUgraph g = end_ok(s2);
    CUgraphExec x = NULL;
    OK(sci_cuGraphInstantiateWithFlags(&x, g, 0));
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(sci_cuGraphLaunch(x, s1), UNSUPPORTED, 1);
    end_invalidated(s1);
    OK(sci_cuGraphExecDestroy(x));
    OK(sci_cuGraphDestroy(g));

    /* The legacy stream beside a capturing blocking stream: an implicit dependency. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuMemsetD8Async(d1, 1, 16, NULL)); /* s1 is non-blocking: no conflict */
    OK(sci_cuStreamSynchronize(NULL));
    CUstreamCaptureStatus st;
    OK(sci_cuStreamIsCapturing(NULL, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
    CUgraph g1 = end_ok(s1);
    OK(sci_cuGraphDestroy(g1));
    OK(sci_cuStreamBeginCapture(sb, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(sci_cuStreamIsCapturing(NULL, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 1);
    CHECK(status_of(sb) == CU_STREAM_CAPTURE_STATUS_ACTIVE); /* a query does not invalidate */
    EXPECT(sci_cuMemsetD8Async(d1, 1, 16, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 1);
    CHECK(status_of(sb) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    OK(sci_cuMemsetD8Async(d1, 1, 16, (CUstream)(uintptr_t)1)); /* already invalidated */
    end_invalidated(sb);
}

/* Calls CUDA forbids during a GLOBAL capture, or a THREAD_LOCAL one of the same thread. */
enum { CALL_ALLOC, CALL_FREE, CALL_HOST_ALLOC, CALL_FREE_HOST, CALL_LOAD, CALL_UNLOAD, CALLS };
static const char *const call_names[] = {"cuMemAlloc",    "cuMemFree",          "cuMemHostAlloc",
                                         "cuMemFreeHost", "cuModuleLoadDataEx", "cuModuleUnload"};
static CUdeviceptr spare_dev;
static void *spare_host;
static CUmodule spare_mod;

static void make_spares(void)
{
    OK(sci_cuMemAlloc(&spare_dev, 64));
    OK(sci_cuMemHostAlloc(&spare_host, 64, 0));
    OK(sci_cuModuleLoadDataEx(&spare_mod, fake_test_ptx, 0, NULL, NULL));
}

static CUresult unsafe_call(int which)
{
    CUdeviceptr p = 0;
    void *h = NULL;
    CUmodule m = NULL;
    CUresult r = CUDA_SUCCESS;
    switch (which) { /* what succeeds is undone, so the counts stay */
    case CALL_ALLOC:
        r = sci_cuMemAlloc(&p, 64);
        if (r == CUDA_SUCCESS && (r = sci_cuMemFree(spare_dev)) == CUDA_SUCCESS)
            spare_dev = p;
        break;
    case CALL_FREE:
        r = sci_cuMemFree(spare_dev);
        if (r == CUDA_SUCCESS)
            r = sci_cuMemAlloc(&spare_dev, 64);
        break;
    case CALL_HOST_ALLOC:
        r = sci_cuMemHostAlloc(&h, 64, 0);
        if (r == CUDA_SUCCESS && (r = sci_cuMemFreeHost(spare_host)) == CUDA_SUCCESS)
            spare_host = h;
        break;
    case CALL_FREE_HOST:
        r = sci_cuMemFreeHost(spare_host);
        if (r == CUDA_SUCCESS)
            r = sci_cuMemHostAlloc(&spare_host, 64, 0);
        break;
    case CALL_LOAD:
        r = sci_cuModuleLoadDataEx(&m, fake_test_ptx, 0, NULL, NULL);
        if (r == CUDA_SUCCESS && (r = sci_cuModuleUnload(spare_mod)) == CUDA_SUCCESS)
            spare_mod = m;
        break;
    case CALL_UNLOAD:
        r = sci_cuModuleUnload(spare_mod);
        if (r == CUDA_SUCCESS)
            r = sci_cuModuleLoadDataEx(&spare_mod, fake_test_ptx, 0, NULL, NULL);
        break;
    }
    return r;
}

static void test_unsafe_calls(void)
{
    make_spares();
    fake_counts before = fake_counts_now();
    for (int which = 0; which < CALLS; which++) {
        /* GLOBAL and THREAD_LOCAL captures of this thread forbid it: refused (no effect),
         * the capture invalidated. */
        for (int mode = 0; mode < 2; mode++) {
            OK(sci_cuStreamBeginCapture(s1, (CUstreamCaptureMode)mode));
            OK(sci_cuMemsetD8Async(d1, 0, 8, s1));
            EXPECT(unsafe_call(which), UNSUPPORTED, 1);
            if (!strstr(fake.last_misuse(), call_names[which])) {
                fprintf(stderr, "misuse description lacks %s: %s\n", call_names[which],
                        fake.last_misuse());
                test_failures++;
            }
            CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
            end_invalidated(s1);
            char why[256];
            if (fake_counts_diff(before, fake_counts_now(), why, sizeof why)) {
                fprintf(stderr, "%s during capture changed: %s\n", call_names[which], why);
                test_failures++;
            }
        }
        /* A RELAXED capture allows it. */
        OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
        OK(unsafe_call(which));
        CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
        CUgraph g = end_ok(s1);
        OK(sci_cuGraphDestroy(g));
    }
    /* cuCtxSynchronize conflicts with every capture, RELAXED too. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT(sci_cuCtxSynchronize(), UNSUPPORTED, 1);
    end_invalidated(s1);
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(sci_cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    EXPECT(sci_cuCtxSynchronize(), UNSUPPORTED, 1);
    CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    end_invalidated(s1);
    end_invalidated(s2);
    OK(sci_cuCtxSynchronize());
    OK(sci_cuMemFree(spare_dev));
    OK(sci_cuMemFreeHost(spare_host));
    OK(sci_cuModuleUnload(spare_mod));
}

/* ---- threads ----------------------------------------------------------------------------- */

typedef struct {
    int op; /* 0: cuMemAlloc + cuMemFree; 1: end the capture of s1 */
    CUresult r;
    CUgraph g;
} thread_job;

static void *other_thread(void *arg)
{
    thread_job *job = arg;
    job->r = sci_cuCtxSetCurrent(ctx);
    if (job->r != CUDA_SUCCESS)
        return NULL;
    if (job->op == 0) {
        CUdeviceptr p = 0;
        job->r = sci_cuMemAlloc(&p, 64);
        if (job->r == CUDA_SUCCESS)
            job->r = sci_cuMemFree(p);
    } else {
        job->r = sci_cuStreamEndCapture(s1, &job->g);
    }
    sci_cuCtxSetCurrent(NULL);
    return NULL;
}

static CUresult on_other_thread(int op, CUgraph *g)
{
    thread_job job = {op, CUDA_ERROR_UNKNOWN, NULL};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, other_thread, &job) == 0);
    REQUIRE(pthread_join(t, NULL) == 0);
    if (g)
        *g = job.g;
    return job.r;
}

static void test_threads(void)
{
    /* Another thread's allocation: forbidden by a GLOBAL capture, not by THREAD_LOCAL or
     * RELAXED ones. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(on_other_thread(0, NULL), UNSUPPORTED, 1);
    end_invalidated(s1);
    for (int mode = 1; mode <= 2; mode++) {
        OK(sci_cuStreamBeginCapture(s1, (CUstreamCaptureMode)mode));
        OK(on_other_thread(0, NULL));
        CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
        CUgraph g = end_ok(s1);
        OK(sci_cuGraphDestroy(g));
    }
    /* Ending from another thread: only a RELAXED capture. */
    for (int mode = 0; mode < 2; mode++) {
        OK(sci_cuStreamBeginCapture(s1, (CUstreamCaptureMode)mode));
        CUgraph g = NULL;
        EXPECT(on_other_thread(1, &g), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, 1);
        CHECK(g == NULL);
        CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED); /* still to be ended */
        end_invalidated(s1);
    }
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(sci_cuMemsetD8Async(d1, 0, 8, s1));
    CUgraph g = NULL;
    OK(on_other_thread(1, &g));
    CHECK(g != NULL && nodes_of(g) == 1);
    CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_NONE);
    OK(sci_cuGraphDestroy(g));
}

/* ---- events: fork, join, isolation, merge, captured events ------------------------------- */

static void test_fork_join(void)
{
    CUevent e1 = NULL, e2 = NULL, e3 = NULL;
    OK(sci_cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));
    OK(sci_cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
    OK(sci_cuEventCreate(&e3, CU_EVENT_DISABLE_TIMING));
    for (int i = 0; i < 64; i++)
        pin[i] = (unsigned char)(100 + i);
    OK(sci_cuMemsetD8Async(d2, 0, 64, s3));

    /* s1 forks s2 (which joins the capture), both work, s1 joins s2 back. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuMemcpyHtoDAsync(d1, pin, 64, s1));
    OK(sci_cuEventRecord(e1, s1));
    OK(sci_cuStreamWaitEvent(s2, e1, 0));
    CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK(capture_id(s2) == capture_id(s1));
    OK(sci_cuMemcpyDtoDAsync(d2, d1, 32, s2)); /* after the fork point: sees d1 */
    OK(sci_cuMemsetD8Async(d1 + 64, 5, 8, s1));
    OK(sci_cuEventRecord(e2, s2));
    OK(sci_cuStreamWaitEvent(s1, e2, 0));
    OK(sci_cuMemcpyDtoHAsync(pin + 512, d2, 32, s1));
    CUgraph g = end_ok(s1);
    CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK(nodes_of(g) == 4); /* records and waits make edges, not nodes */
    CUgraphExec x = NULL;
    OK(sci_cuGraphInstantiateWithFlags(&x, g, 0));
    OK(sci_cuGraphLaunch(x, s3));
    int good = 1;
    for (int i = 0; i < 32; i++)
        good &= pin[512 + i] == (unsigned char)(100 + i);
    CHECK(good);
    OK(sci_cuGraphExecDestroy(x));
    OK(sci_cuGraphDestroy(g));
    /* Events recorded in the capture stand for graph work, also after it ended. */
    EXPECT(sci_cuEventQuery(e1), CUDA_ERROR_CAPTURED_EVENT, 1);
    EXPECT(sci_cuEventSynchronize(e2), CUDA_ERROR_CAPTURED_EVENT, 1);
    EXPECT(sci_cuStreamWaitEvent(s3, e1, 0), CUDA_ERROR_CAPTURED_EVENT, 1);
    OK(sci_cuEventRecord(e1, s3)); /* recorded again outside: an ordinary event */
    OK(sci_cuEventQuery(e1));
    OK(sci_cuStreamWaitEvent(s3, e1, 0));

    /* A chain: s1 forks s2, s2 forks s3; s3 joins s2, s2 joins s1. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuEventRecord(e1, s1));
    OK(sci_cuStreamWaitEvent(s2, e1, 0));
    OK(sci_cuMemsetD8Async(d1, 1, 8, s2));
    OK(sci_cuEventRecord(e2, s2));
    OK(sci_cuStreamWaitEvent(s3, e2, 0));
    OK(sci_cuMemsetD8Async(d2, 2, 8, s3));
    OK(sci_cuEventRecord(e3, s3));
    OK(sci_cuStreamWaitEvent(s2, e3, 0));
    OK(sci_cuEventRecord(e2, s2));
    OK(sci_cuStreamWaitEvent(s1, e2, 0));
    g = end_ok(s1);
    CHECK(nodes_of(g) == 2);
    CHECK(status_of(s3) == CU_STREAM_CAPTURE_STATUS_NONE);
    OK(sci_cuGraphDestroy(g));

    /* A fork that did no work needs no join. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuMemsetD8Async(d1, 1, 8, s1));
    OK(sci_cuEventRecord(e1, s1));
    OK(sci_cuStreamWaitEvent(s2, e1, 0));
    g = end_ok(s1);
    CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
    OK(sci_cuGraphDestroy(g));

    /* Unjoined: work on the fork, never waited for (or waited for before it was done). */
    for (int early = 0; early < 2; early++) {
        OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
        OK(sci_cuEventRecord(e1, s1));
        OK(sci_cuStreamWaitEvent(s2, e1, 0));
        if (early) {
            OK(sci_cuEventRecord(e2, s2));
            OK(sci_cuStreamWaitEvent(s1, e2, 0));
        }
        OK(sci_cuMemsetD8Async(d2, 3, 8, s2));
        g = (CUgraph)(uintptr_t)1;
        /* A mistake of the program's, which the driver reports: not misuse. */
        EXPECT(sci_cuStreamEndCapture(s1, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED, 0);
        CHECK(g == NULL);
        CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_NONE);
        CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
        CHECK(fake.live_graphs() == 0 && fake.active_captures() == 0);
    }

    /* Ending on a stream that joined: UNMATCHED, the capture invalidated. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuEventRecord(e1, s1));
    OK(sci_cuStreamWaitEvent(s2, e1, 0));
    EXPECT(sci_cuStreamEndCapture(s2, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, 1);
    CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    end_invalidated(s1);
    CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_NONE);

    /* Isolation: a capturing stream waits on an event recorded outside the capture. */
    OK(sci_cuEventRecord(e3, s3));
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(sci_cuStreamWaitEvent(s1, e3, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION, 1);
    end_invalidated(s1);
    /* ... unless it is an external wait: an event wait node (invalid outside capture). */
    EXPECT(sci_cuStreamWaitEvent(s3, e3, 1), INVAL, 1);
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuStreamWaitEvent(s1, e3, 1 /* CU_EVENT_WAIT_EXTERNAL */));
    g = end_ok(s1);
    CHECK(nodes_of(g) == 1);
    OK(sci_cuGraphInstantiateWithFlags(&x, g, 0));
    OK(sci_cuGraphLaunch(x, s3));
    CUevent gone = e3;
    OK(sci_cuEventDestroy(gone));
    EXPECT(sci_cuGraphLaunch(x, s3), INVAL, 1); /* its event was destroyed */
    OK(sci_cuGraphExecDestroy(x));
    OK(sci_cuGraphDestroy(g));

    /* Merge: a stream of one capture waits on an event of another; both are invalidated. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuEventRecord(e1, s1));
    EXPECT(sci_cuStreamWaitEvent(s2, e1, 0), CUDA_ERROR_STREAM_CAPTURE_MERGE, 1);
    CHECK(status_of(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK(status_of(s2) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    /* An idle stream waiting on an event of an invalidated capture: CUDA_ERROR_INVALID_VALUE. */
    EXPECT(sci_cuStreamWaitEvent(s3, e1, 0), INVAL, 0);
    end_invalidated(s1);
    end_invalidated(s2);

    /* A captured event queried during its capture: refused, and the capture invalidated. */
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(sci_cuEventRecord(e1, s1));
    float ms = 0;
    EXPECT(sci_cuEventElapsedTime(&ms, e1, e1), CUDA_ERROR_CAPTURED_EVENT, 1);
    end_invalidated(s1);
    OK(sci_cuEventDestroy(e1));
    OK(sci_cuEventDestroy(e2));
}

/* ---- update ------------------------------------------------------------------------------ */

static CUgraph capture_two(int kinds, CUdeviceptr a, CUdeviceptr b, unsigned v)
{
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    if (kinds == 0) { /* a copy to a, a memset of b */
        OK(sci_cuMemcpyHtoDAsync(a, pin, 64, s1));
        OK(sci_cuMemsetD32Async(b, v, 16, s1));
    } else if (kinds == 1) { /* swapped */
        OK(sci_cuMemsetD32Async(b, v, 16, s1));
        OK(sci_cuMemcpyHtoDAsync(a, pin, 64, s1));
    } else if (kinds == 2) { /* a copy in the other direction */
        OK(sci_cuMemcpyDtoHAsync(pin, a, 64, s1));
        OK(sci_cuMemsetD32Async(b, v, 16, s1));
    } else if (kinds == 3) { /* three nodes */
        OK(sci_cuMemcpyHtoDAsync(a, pin, 64, s1));
        OK(sci_cuMemsetD32Async(b, v, 16, s1));
        OK(sci_cuMemsetD32Async(b, v, 16, s1));
    } else { /* the same two nodes, independent of each other (a fork) */
        CUevent e = NULL, f = NULL;
        OK(sci_cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
        OK(sci_cuEventCreate(&f, CU_EVENT_DISABLE_TIMING));
        OK(sci_cuEventRecord(e, s1));
        OK(sci_cuStreamWaitEvent(s2, e, 0));
        OK(sci_cuMemcpyHtoDAsync(a, pin, 64, s1));
        OK(sci_cuMemsetD32Async(b, v, 16, s2));
        OK(sci_cuEventRecord(f, s2));
        OK(sci_cuStreamWaitEvent(s1, f, 0));
        OK(sci_cuEventDestroy(e));
        OK(sci_cuEventDestroy(f));
    }
    return end_ok(s1);
}

static CUgraph capture_kernel(CUfunction f, int cooperative)
{
    uint64_t a0 = d1, a1 = d2;
    uint32_t a2 = 16;
    void *add_params[] = {&a0, &a1, &a2};
    double pair[2] = {1, 2};
    void *pack_params[] = {pair, &a0};
    CUlaunchAttribute attr = {0};
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = cooperative;
    CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, s1, &attr, 1};
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuLaunchKernelEx(&cfg, f, f == add_fn ? add_params : pack_params, NULL));
    return end_ok(s1);
}

static CUgraphExecUpdateResult update(CUgraphExec x, CUgraph g, CUresult want, CUgraphNode *node)
{
    CUgraphExecUpdateResultInfo info = {(CUgraphExecUpdateResult)99, NULL, NULL};
    EXPECT(sci_cuGraphExecUpdate(x, g, &info), want, 0);
    if (node)
        *node = info.errorNode;
    return info.result;
}

static void test_update(void)
{
    const CUresult FAIL = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    for (int i = 0; i < 64; i++)
        pin[i] = (unsigned char)(200 + i);
    CUgraph base = capture_two(0, d1, d2, 1);
    CUgraphExec x = NULL;
    OK(sci_cuGraphInstantiateWithFlags(&x, base, 0));

    /* Same shape, other addresses and values: updated, and the replay uses them. */
    CUgraph g = capture_two(0, d2 + 512, d1 + 512, 0x07070707u);
    CHECK(update(x, g, CUDA_SUCCESS, NULL) == CU_GRAPH_EXEC_UPDATE_SUCCESS);
    OK(sci_cuMemsetD8Async(d1, 0, 4096, s3));
    OK(sci_cuMemsetD8Async(d2, 0, 4096, s3));
    OK(sci_cuGraphLaunch(x, s3));
    unsigned char b[64];
    get_device_bytes(b, d2 + 512, 64);
    CHECK(b[0] == 200 && b[63] == (unsigned char)(200 + 63));
    get_device_bytes(b, d1 + 512, 64);
    CHECK(b[0] == 7 && b[63] == 7);
    get_device_bytes(b, d2, 64);
    CHECK(b[0] == 0); /* the old addresses are not touched */
    OK(sci_cuGraphDestroy(g));

    /* What may not change. */
    CUgraphNode where = (CUgraphNode)(uintptr_t)1;
    g = capture_two(3, d1, d2, 1);
    CHECK(update(x, g, FAIL, &where) == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
    CHECK(where == NULL); /* a different node count names no node */
    OK(sci_cuGraphDestroy(g));
    CUgraphNode nodes[2];
    size_t n = 2;
    g = capture_two(4, d1, d2, 1);
    OK(sci_cuGraphGetNodes(g, nodes, &n));
    CHECK(update(x, g, FAIL, &where) == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
    CHECK(where == nodes[1]); /* the memset no longer depends on the copy */
    OK(sci_cuGraphDestroy(g));
    g = capture_two(1, d1, d2, 1);
    OK(sci_cuGraphGetNodes(g, nodes, &n));
    CHECK(update(x, g, FAIL, &where) == CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED);
    CHECK(where == nodes[0]);
    OK(sci_cuGraphDestroy(g));
    g = capture_two(2, d1, d2, 1);
    OK(sci_cuGraphGetNodes(g, nodes, &n));
    CHECK(update(x, g, FAIL, &where) == CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED);
    CHECK(where == nodes[0]);
    OK(sci_cuGraphDestroy(g));
    /* A failed update changed nothing: the replay is still the first update's. */
    OK(sci_cuMemsetD8Async(d1, 0, 4096, s3));
    OK(sci_cuGraphLaunch(x, s3));
    get_device_bytes(b, d1 + 512, 64);
    CHECK(b[0] == 7);
    CUgraphExecUpdateResultInfo info;
    EXPECT(sci_cuGraphExecUpdate(x, base, NULL), INVAL, 1);
    OK(sci_cuGraphDestroy(base));
    EXPECT(sci_cuGraphExecUpdate(x, base, &info), INVAL, 1);
    CHECK(info.result == CU_GRAPH_EXEC_UPDATE_ERROR);
    OK(sci_cuGraphExecDestroy(x));

    /* Kernel nodes: another function is allowed (CUDA 12), another cooperativeness not. */
    base = capture_kernel(add_fn, 0);
    OK(sci_cuGraphInstantiateWithFlags(&x, base, 0));
    g = capture_kernel(pack_fn, 0);
    CHECK(update(x, g, CUDA_SUCCESS, NULL) == CU_GRAPH_EXEC_UPDATE_SUCCESS);
    OK(sci_cuGraphDestroy(g));
    g = capture_kernel(add_fn, 1);
    CHECK(update(x, g, FAIL, &where) == CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED);
    OK(sci_cuGraphDestroy(g));
    OK(sci_cuGraphDestroy(base));
    OK(sci_cuGraphExecDestroy(x));
}

/* ---- replay checks: what a graph uses must still be there -------------------------------- */

static void test_replay_checks(void)
{
    CUdeviceptr dev = 0;
    void *host = NULL;
    OK(sci_cuMemAlloc(&dev, 256));
    OK(sci_cuMemHostAlloc(&host, 256, 0));
    OK(sci_cuMemsetD8Async(d1, 0, 64, s3));
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuMemsetD8Async(d1, 0x11, 64, s1));
    OK(sci_cuMemcpyHtoDAsync(dev, host, 256, s1));
    CUgraph g1 = end_ok(s1);
    OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(sci_cuMemsetD8Async(d1, 0x22, 64, s1));
    OK(sci_cuMemcpyDtoHAsync(host, d2, 256, s1));
    CUgraph g2 = end_ok(s1);
    CUgraphExec x1 = NULL, x2 = NULL;
    OK(sci_cuGraphInstantiateWithFlags(&x1, g1, 0));
    OK(sci_cuGraphInstantiateWithFlags(&x2, g2, 0));
    OK(sci_cuGraphLaunch(x1, s3));
    OK(sci_cuGraphLaunch(x2, s3));
    OK(sci_cuMemsetD8Async(d1, 0, 64, s3));
    OK(sci_cuMemFree(dev));
    EXPECT(sci_cuGraphLaunch(x1, s3), INVAL, 1); /* its device memory was freed */
    CHECK(strstr(fake.last_misuse(), "node 1 (memcpy)") != NULL);
    OK(sci_cuMemFreeHost(host));
    EXPECT(sci_cuGraphLaunch(x2, s3), INVAL, 1); /* its pinned memory was freed */
    CHECK(strstr(fake.last_misuse(), "pinned") != NULL);
    unsigned char b[64];
    get_device_bytes(b, d1, 64);
    CHECK(b[0] == 0 && b[63] == 0); /* a refused replay runs no node */
    OK(sci_cuGraphExecDestroy(x1));
    OK(sci_cuGraphExecDestroy(x2));
    OK(sci_cuGraphDestroy(g1));
    OK(sci_cuGraphDestroy(g2));
}

/* ---- launch attributes ------------------------------------------------------------------- */

static CUresult launch_ex(CUfunction f, unsigned grid, unsigned block, const unsigned *cluster,
                          int cooperative, void **params)
{
    CUlaunchAttribute attrs[2];
    memset(attrs, 0, sizeof attrs);
    unsigned n = 0;
    if (cluster) {
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[n].value.clusterDim.x = cluster[0];
        attrs[n].value.clusterDim.y = cluster[1];
        attrs[n].value.clusterDim.z = cluster[2];
        n++;
    }
    if (cooperative) {
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attrs[n].value.cooperative = 1;
        n++;
    }
    CUlaunchConfig cfg = {grid, 1, 1, block, 1, 1, 0, s1, attrs, n};
    return sci_cuLaunchKernelEx(&cfg, f, params, NULL);
}

static int func_attr(CUfunction f, CUfunction_attribute a)
{
    int v = -1;
    OK(sci_cuFuncGetAttribute(&v, a, f));
    return v;
}

static int clusters(CUfunction f, unsigned block, const unsigned *cluster, CUresult want,
                    int misuse)
{
    CUlaunchAttribute attr = {0};
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    if (cluster) {
        attr.value.clusterDim.x = cluster[0];
        attr.value.clusterDim.y = cluster[1];
        attr.value.clusterDim.z = cluster[2];
    }
    CUlaunchConfig cfg = {16, 1, 1, block, 1, 1, 0, s1, &attr, cluster ? 1u : 0u};
    int n = -1;
    EXPECT(sci_cuOccupancyMaxActiveClusters(&n, f, &cfg), want, misuse);
    return n;
}

static void test_attributes(void)
{
    const CUresult ran = accepting ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
    const CUresult TOO_BIG = CUDA_ERROR_INVALID_CLUSTER_SIZE;
    CUmodule m = NULL;
    CUfunction clustered = NULL, explicit_only = NULL, plain = NULL;
    OK(sci_cuModuleLoadDataEx(&m, cluster_ptx, 0, NULL, NULL));
    OK(sci_cuModuleGetFunction(&clustered, m, "clustered"));
    OK(sci_cuModuleGetFunction(&explicit_only, m, "explicit_only"));
    OK(sci_cuModuleGetFunction(&plain, m, "plain"));

    int v = -1;
    OK(sci_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 0));
    CHECK(v == 1);
    OK(sci_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 0));
    CHECK(v == !sm80);

    /* What the PTX says. */
    CHECK(func_attr(clustered, CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET) == 1);
    CHECK(func_attr(clustered, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH) == 2);
    CHECK(func_attr(clustered, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT) == 1);
    CHECK(func_attr(clustered, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH) == 1);
    CHECK(func_attr(explicit_only, CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET) == 1);
    CHECK(func_attr(explicit_only, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH) == 0);
    CHECK(func_attr(plain, CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET) == 0);
    CHECK(func_attr(plain, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH) == 0);
    CHECK(func_attr(plain, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) == 0);
    EXPECT(sci_cuFuncSetAttribute(clustered, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, 4),
           CUDA_ERROR_NOT_PERMITTED, 1);
    EXPECT(sci_cuFuncSetAttribute(plain, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 2),
           INVAL, 1);

    uint32_t n32 = 0;
    uint64_t p64 = 0;
    void *plain_params[] = {&n32};
    void *clustered_params[] = {&p64};
    const unsigned c2[3] = {2, 1, 1}, c4[3] = {4, 1, 1}, c16[3] = {16, 1, 1};
    const unsigned c0[3] = {0, 1, 1}, c32[3] = {32, 1, 1}, c9[3] = {3, 3, 1};
    if (sm80) { /* no clusters before sm_90 */
        EXPECT(launch_ex(plain, 4, 32, c2, 0, plain_params), CUDA_ERROR_NOT_SUPPORTED, 1);
        EXPECT(launch_ex(clustered, 4, 32, NULL, 0, clustered_params), CUDA_ERROR_NOT_SUPPORTED,
               1);
        clusters(plain, 128, c2, CUDA_ERROR_NOT_SUPPORTED, 1);
    } else {
        EXPECT(launch_ex(plain, 4, 32, c2, 0, plain_params), ran, 0);
        EXPECT(launch_ex(plain, 3, 32, c2, 0, plain_params), INVAL, 1);    /* 1.5 clusters */
        EXPECT(launch_ex(plain, 4, 32, c0, 0, plain_params), INVAL, 1);    /* a zero */
        EXPECT(launch_ex(plain, 18, 32, c9, 0, plain_params), INVAL, 1);   /* grid y = 1 */
        EXPECT(launch_ex(plain, 16, 32, c16, 0, plain_params), TOO_BIG, 1); /* > 8 */
        OK(sci_cuFuncSetAttribute(plain, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
        CHECK(func_attr(plain, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) == 1);
        EXPECT(launch_ex(plain, 16, 32, c16, 0, plain_params), ran, 0);
        EXPECT(launch_ex(plain, 32, 32, c32, 0, plain_params), TOO_BIG, 1); /* > 16 */
        /* The compiled cluster: used without an attribute, the same one accepted. */
        EXPECT(launch_ex(clustered, 4, 32, NULL, 0, clustered_params), ran, 0);
        EXPECT(launch_ex(clustered, 4, 32, c2, 0, clustered_params), ran, 0);
        EXPECT(launch_ex(clustered, 3, 32, NULL, 0, clustered_params), INVAL, 1);
        EXPECT(launch_ex(clustered, 4, 32, c4, 0, clustered_params), INVAL, 1);
        EXPECT(launch_ex(explicit_only, 4, 32, NULL, 0, NULL), TOO_BIG, 1);
        EXPECT(launch_ex(explicit_only, 4, 32, c4, 0, NULL), ran, 0);
        /* Occupancy of clusters: 8 GPCs x (16 SMs x blocks per SM / cluster size). The plain
         * kernel at 1024 threads: 2 blocks per SM. */
        CHECK(clusters(plain, 1024, c2, CUDA_SUCCESS, 0) == 8 * (16 * 2 / 2));
        CHECK(clusters(plain, 1024, c16, CUDA_SUCCESS, 0) == 8 * (16 * 2 / 16));
        CHECK(clusters(plain, 1024, c32, CUDA_SUCCESS, 0) == 0); /* too large: none */
        OK(sci_cuFuncSetAttribute(plain, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 0));
        CHECK(clusters(plain, 1024, c16, CUDA_SUCCESS, 0) == 0);
        clusters(plain, 1024, NULL, INVAL, 1); /* no cluster anywhere */
        /* The compiled cluster (2) at 128 threads: 16 blocks per SM. */
        CHECK(clusters(clustered, 128, NULL, CUDA_SUCCESS, 0) == 8 * (16 * 16 / 2));
        clusters(clustered, 128, c4, INVAL, 1);
    }
    /* Cooperative: the whole grid resident at once (2 blocks of 1024 per SM x 132). */
    EXPECT(launch_ex(plain, 264, 1024, NULL, 1, plain_params), ran, 0);
    EXPECT(launch_ex(plain, 265, 1024, NULL, 1, plain_params),
           CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, 1);
    /* An attribute the test device does not know: not supported, not misuse. */
    CUlaunchAttribute other = {0};
    other.id = 99;
    CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, s1, &other, 1};
    EXPECT(sci_cuLaunchKernelEx(&cfg, plain, plain_params, NULL), CUDA_ERROR_NOT_SUPPORTED, 0);

    /* A captured launch keeps its attributes (and its checks). */
    if (!sm80) {
        OK(sci_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
        OK(launch_ex(clustered, 4, 32, NULL, 1, clustered_params));
        EXPECT(launch_ex(clustered, 3, 32, NULL, 0, clustered_params), INVAL, 1);
        end_invalidated(s1);
    }
    OK(sci_cuModuleUnload(m));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "accept";
    const char *accept = getenv("SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES");
    const char *cc = getenv("SAFECUDA_TESTDEVICE_CC");
    accepting = accept && strcmp(accept, "1") == 0;
    sm80 = cc && strcmp(cc, "80") == 0;
    REQUIRE(strcmp(mode, "accept") == 0 ? accepting && !sm80
            : strcmp(mode, "refuse") == 0 ? !accepting && !sm80
            : strcmp(mode, "sm80") == 0   ? sm80
                                          : 0);
    fake_attach();
    sc_set_log_callback(NULL, NULL);
    fake_counts start = fake_counts_now();

    OK(sci_cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(sci_cuCtxSetCurrent(ctx));
    OK(sci_cuStreamCreateWithPriority(&s1, CU_STREAM_NON_BLOCKING, 0));
    OK(sci_cuStreamCreateWithPriority(&s2, CU_STREAM_NON_BLOCKING, 0));
    OK(sci_cuStreamCreateWithPriority(&s3, CU_STREAM_NON_BLOCKING, 0));
    OK(sci_cuStreamCreateWithPriority(&sb, 0, 0));
    OK(sci_cuMemAlloc(&d1, 4096));
    OK(sci_cuMemAlloc(&d2, 4096));
    void *h = NULL;
    OK(sci_cuMemHostAlloc(&h, 8192, 0));
    pin = h;
    OK(sci_cuModuleLoadDataEx(&mod, fake_test_ptx, 0, NULL, NULL));
    OK(sci_cuModuleGetFunction(&add_fn, mod, "add"));
    OK(sci_cuModuleGetFunction(&pack_fn, mod, "pack"));
    REQUIRE(fake.misuse_count() == 0);

    test_capture_and_replay();
    test_kernel_nodes();
    test_begin_end_refusals();
    test_stream_refusals();
    test_unsafe_calls();
    test_threads();
    test_fork_join();
    test_update();
    test_replay_checks();
    test_attributes();

    CHECK(fake.active_captures() == 0);
    OK(sci_cuModuleUnload(mod));
    OK(sci_cuMemFreeHost(pin));
    OK(sci_cuMemFree(d1));
    OK(sci_cuMemFree(d2));
    OK(sci_cuStreamDestroy(s1));
    OK(sci_cuStreamDestroy(s2));
    OK(sci_cuStreamDestroy(s3));
    OK(sci_cuStreamDestroy(sb));
    OK(sci_cuCtxSetCurrent(NULL));
    OK(sci_cuDevicePrimaryCtxRelease(0));
    char diff[512];
    if (fake_counts_diff(start, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "the test device still holds: %s\n", diff);
        test_failures++;
    }
    return test_result("test_testdevice_graphs");
}
