/* Wrapped streams on a real GPU: CUstreams made by "another library" (this test, calling
 * libcuda directly as the CUDA runtime or PyTorch would) used as sc_streams. Ordering
 * between a wrapped stream and safecuda's own (random data, checked on the host); the
 * legacy default stream (PyTorch's default current stream); a capture the other library
 * begins on its stream (as torch.cuda.graph does) holding safecuda's work, which then runs
 * when that library replays the graph; the refusals inside it; a stream of another CUDA
 * context refused. */
#include <dlfcn.h>

#include "../test.h"
#include "driver/cuda_api.h"
#include "safecuda/interop.h"

static sc_context ctx;

static struct {
    CUresult (*stream_create)(CUstream *s, unsigned flags);
    CUresult (*stream_destroy)(CUstream s);
    CUresult (*stream_sync)(CUstream s);
    CUresult (*begin_capture)(CUstream s, CUstreamCaptureMode mode);
    CUresult (*end_capture)(CUstream s, CUgraph *g);
    CUresult (*instantiate)(CUgraphExec *e, CUgraph g, unsigned long long flags);
    CUresult (*graph_launch)(CUgraphExec e, CUstream s);
    CUresult (*graph_destroy)(CUgraph g);
    CUresult (*exec_destroy)(CUgraphExec e);
    CUresult (*ctx_create)(CUcontext *c, unsigned flags, CUdevice d);
    CUresult (*ctx_destroy)(CUcontext c);
    CUresult (*ctx_set_current)(CUcontext c);
} cu;

static void bind(void *h, const char *name, void *slot)
{
    void *p = dlsym(h, name);
    REQUIRE(p != NULL);
    memcpy(slot, &p, sizeof p);
}

static void attach_libcuda(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(h != NULL);
    bind(h, "cuStreamCreate", &cu.stream_create);
    bind(h, "cuStreamDestroy_v2", &cu.stream_destroy);
    bind(h, "cuStreamSynchronize", &cu.stream_sync);
    bind(h, "cuStreamBeginCapture_v2", &cu.begin_capture);
    bind(h, "cuStreamEndCapture", &cu.end_capture);
    bind(h, "cuGraphInstantiateWithFlags", &cu.instantiate);
    bind(h, "cuGraphLaunch", &cu.graph_launch);
    bind(h, "cuGraphDestroy", &cu.graph_destroy);
    bind(h, "cuGraphExecDestroy", &cu.exec_destroy);
    bind(h, "cuCtxCreate_v2", &cu.ctx_create);
    bind(h, "cuCtxDestroy_v2", &cu.ctx_destroy);
    bind(h, "cuCtxSetCurrent", &cu.ctx_set_current);
}

static sc_buffer make_f32(uint64_t n, const char *label)
{
    sc_buffer b = {0};
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = label},
                             &b) == SC_OK);
    return b;
}

/* A stream of the primary context, as the CUDA runtime makes them. */
static CUstream foreign_stream(void)
{
    REQUIRE(sc_context_synchronize(ctx) == SC_OK); /* the primary context current here */
    CUstream s = NULL;
    REQUIRE(cu.stream_create(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    return s;
}

/* 64 MiB written on safecuda's stream, read at once on the wrapped one (and the other way
 * round), with no synchronization by the caller: the tracking orders them. */
static void test_ordering(void)
{
    const uint64_t n = 16u << 20;
    float *h = test_xmalloc(n * 4), *back = test_xmalloc(n * 4);
    test_fill_random(h, n * 4, 101);
    CUstream fs = foreign_stream();
    sc_stream w = {0}, own = {0};
    CHECK_OK(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)fs, "torch", &w));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "mine"}, &own));
    sc_buffer a = make_f32(n, "a"), b = make_f32(n, "b");
    const float poison = -7.0f;
    CHECK_OK(sc_fill(w, sc_view_of(b), &poison));
    CHECK_OK(sc_copy_from_host(own, sc_view_of(a), h, n * 4));
    CHECK_OK(sc_copy(w, sc_view_of(b), sc_view_of(a))); /* waits for own's write */
    CHECK_OK(sc_copy_to_host(own, back, n * 4, sc_view_of(b))); /* waits for w's copy */
    CHECK_BYTES(back, h, n * 4, "wrapped-stream copy of data written on another stream");

    /* The legacy default stream (handle 0), PyTorch's default current stream. */
    sc_stream legacy = {0};
    CHECK_OK(sc_stream_wrap(ctx, 0, "legacy", &legacy));
    const float three = 3.0f;
    CHECK_OK(sc_fill(legacy, sc_view_of(a), &three));
    sc_view head = {0};
    CHECK_OK(sc_buffer_view(a, 0, 4, &head));
    CHECK_OK(sc_copy_to_host(own, back, 16, head));
    CHECK(back[0] == 3.0f && back[3] == 3.0f);
    CHECK_OK(sc_stream_destroy(legacy));

    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_stream_destroy(w));
    CHECK_OK(sc_stream_destroy(own));
    CHECK(cu.stream_sync(fs) == CUDA_SUCCESS); /* the CUstream is still the test's */
    CHECK(cu.stream_destroy(fs) == CUDA_SUCCESS);
    free(h);
    free(back);
}

/* The other library captures its stream; safecuda's work lands in its graph and runs at
 * that library's replay. */
static void test_foreign_capture(void)
{
    const uint64_t n = 1u << 20;
    float *h = test_xmalloc(n * 4), *back = test_xmalloc(n * 4);
    test_fill_random(h, n * 4, 202);
    CUstream fs = foreign_stream();
    sc_stream w = {0};
    CHECK_OK(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)fs, "torch", &w));
    sc_buffer src = make_f32(n, "src"), dst = make_f32(n, "dst");
    const float poison = -1.0f;
    CHECK_OK(sc_copy_from_host(w, sc_view_of(src), h, n * 4));
    CHECK_OK(sc_fill(w, sc_view_of(dst), &poison));
    CHECK_OK(sc_stream_synchronize(w));

    REQUIRE(cu.begin_capture(fs, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK_OK(sc_copy(w, sc_view_of(dst), sc_view_of(src)));
    CHECK_STATUS(sc_stream_synchronize(w), SC_ERR_CAPTURE);
    CHECK_MSG("begun by another library");
    sc_graph g = {0};
    CHECK_STATUS(sc_stream_end_capture(w, &g), SC_ERR_INVALID_ARGUMENT);
    CUgraph graph = NULL;
    CHECK(cu.end_capture(fs, &graph) == CUDA_SUCCESS && graph); /* still valid */
    CUgraphExec exec = NULL;
    CHECK(cu.instantiate(&exec, graph, 0) == CUDA_SUCCESS);

    /* Not run yet. */
    sc_view head = {0};
    CHECK_OK(sc_buffer_view(dst, 0, 4, &head));
    CHECK_OK(sc_copy_to_host(w, back, 16, head));
    CHECK(back[0] == poison && back[3] == poison);
    CHECK(cu.graph_launch(exec, fs) == CUDA_SUCCESS);
    CHECK(cu.stream_sync(fs) == CUDA_SUCCESS);
    CHECK_OK(sc_copy_to_host(w, back, n * 4, sc_view_of(dst)));
    CHECK_BYTES(back, h, n * 4, "safecuda's copy replayed from the other library's graph");

    /* New input, replayed again. */
    test_fill_random(h, n * 4, 203);
    CHECK_OK(sc_copy_from_host(w, sc_view_of(src), h, n * 4));
    CHECK(cu.graph_launch(exec, fs) == CUDA_SUCCESS);
    CHECK_OK(sc_copy_to_host(w, back, n * 4, sc_view_of(dst))); /* same stream: ordered */
    CHECK_BYTES(back, h, n * 4, "the second replay, on new input");

    CHECK(cu.exec_destroy(exec) == CUDA_SUCCESS);
    CHECK(cu.graph_destroy(graph) == CUDA_SUCCESS);
    CHECK_OK(sc_buffer_destroy(src));
    CHECK_OK(sc_buffer_destroy(dst));
    CHECK_OK(sc_stream_destroy(w));
    CHECK(cu.stream_destroy(fs) == CUDA_SUCCESS);
    free(h);
    free(back);
}

/* A stream of a context the other library created itself can't be wrapped. */
static void test_other_context(void)
{
    CUcontext mine = NULL;
    REQUIRE(cu.ctx_create(&mine, 0, 0) == CUDA_SUCCESS);
    CUstream s = NULL;
    REQUIRE(cu.stream_create(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    sc_stream w = {0};
    CHECK_STATUS(sc_stream_wrap(ctx, (uint64_t)(uintptr_t)s, "elsewhere", &w),
                 SC_ERR_WRONG_CONTEXT);
    CHECK_MSG("belongs to another CUDA context");
    CHECK(cu.ctx_set_current(mine) == CUDA_SUCCESS);
    CHECK(cu.stream_destroy(s) == CUDA_SUCCESS);
    CHECK(cu.ctx_destroy(mine) == CUDA_SUCCESS);
    CHECK_OK(sc_context_check(ctx));
}

int main(void)
{
    gpu_require();
    attach_libcuda();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    TEST_RUN(test_ordering);
    TEST_RUN(test_foreign_capture);
    TEST_RUN(test_other_context);
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    return test_result("test_gpu_wrap");
}
