/* CUDA graphs on a real GPU: capture and replay of a copy/fill/launch chain equal to the
 * eager result bit for bit on fresh random inputs each replay; a two-stream fork/join
 * capture (and an unjoined one, invalidated cleanly); replay refused after a captured
 * buffer was destroyed, with a sentinel proving nothing ran; a buffer destroyed while a
 * replay is in flight freed after it; every call a capture refuses, with the stream and
 * context usable afterwards; update in place and by re-instantiation; 8 threads capturing
 * and replaying their own graphs at once; a captured MoE forward replayed with new x
 * equal to the eager forward. SAFECUDA_UNDER_SANITIZER shrinks the sizes and counts. */
#include <pthread.h>
#include <stdatomic.h>

#include "../test.h"
#include "safecuda/moe.h"

static bool sanitizer;
static sc_context ctx;
static sc_module mod;
static sc_kernel k_mad, k_spin;

static const char src[] =
    "extern \"C\" __global__ void mad3(const unsigned *x, unsigned *y, unsigned long long n)\n"
    "{\n"
    "    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = y[i] * 3u + x[i];\n"
    "}\n"
    "// Busy for about `cycles` clock cycles, then y[i] += 1: a replay that stays in flight.\n"
    "extern \"C\" __global__ void spin(unsigned *y, unsigned long long n, long long cycles)\n"
    "{\n"
    "    long long t0 = clock64();\n"
    "    while (clock64() - t0 < cycles) { }\n"
    "    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] += 1u;\n"
    "}\n";

/* ---- helpers ------------------------------------------------------------------------------ */

static sc_buffer make_u32(uint64_t n, const char *label)
{
    sc_buffer b = {0};
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = n, .label = label},
                             &b) == SC_OK);
    return b;
}

static sc_stream make_stream(const char *label)
{
    sc_stream s = {0};
    REQUIRE(sc_stream_create(ctx, &(sc_stream_desc){.label = label}, &s) == SC_OK);
    return s;
}

static sc_status mad(sc_stream s, sc_buffer x, sc_buffer y, uint64_t n)
{
    sc_launch_desc cfg;
    sc_status st = sc_launch_config_for(n, k_mad, &cfg);
    if (st != SC_OK)
        return st;
    return SC_LAUNCH(s, k_mad, &cfg, sc_arg_in(sc_view_of(x)), sc_arg_inout(sc_view_of(y)),
                     sc_arg_u64(n));
}

static void random_u32(uint32_t *p, uint64_t n, uint64_t seed) { test_fill_random(p, n * 4, seed); }

static bool same_u32(const uint32_t *got, const uint32_t *want, uint64_t n, const char *what)
{
    for (uint64_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "%s: element %llu is 0x%08x, expected 0x%08x\n", what,
                    (unsigned long long)i, got[i], want[i]);
            return false;
        }
    return true;
}

/* ---- a copy / fill / launch chain, captured and replayed ----------------------------------------- */

static void test_chain(void)
{
    const uint64_t n = sanitizer ? 4096 : (1u << 20);
    const int replays = sanitizer ? 3 : 20;
    sc_stream s = make_stream("chain capture"), other = make_stream("chain replay");
    sc_buffer x = make_u32(n, "chain x"), y = make_u32(n, "chain y"), z = make_u32(n, "chain z");
    sc_host_buffer in, out;
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = n * 4, .label = "in"}, &in) == SC_OK);
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = n * 4, .label = "out"}, &out) == SC_OK);
    uint32_t *h = test_xmalloc(n * 4), *got = test_xmalloc(n * 4), *want = test_xmalloc(n * 4);
    for (uint64_t i = 0; i < n; i++)
        h[i] = 0xdeadbeefu;
    CHECK_OK(sc_host_buffer_write(out, 0, h, n * 4)); /* poison */

    const uint32_t one = 1, seven = 7;
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    bool capturing = false;
    CHECK_OK(sc_stream_is_capturing(s, &capturing));
    CHECK(capturing);
    CHECK_OK(sc_copy_from_host_buffer(s, sc_view_of(x), in, 0));
    CHECK_OK(sc_fill(s, sc_view_of(y), &one));
    CHECK_OK(sc_fill(s, sc_view_of(z), &seven));
    CHECK_OK(mad(s, x, y, n)); /* y = 3 + x */
    CHECK_OK(mad(s, y, z, n)); /* z = 21 + y */
    CHECK_OK(sc_copy_to_host_buffer(s, out, 0, sc_view_of(z)));
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(s, &g));
    CHECK_OK(sc_stream_is_capturing(s, &capturing));
    CHECK(!capturing);
    sc_graph_props gp;
    CHECK_OK(sc_graph_info(g, &gp));
    printf("  chain graph: %llu nodes, %llu buffers, %llu host buffers, %llu kernels\n",
           (unsigned long long)gp.nodes, (unsigned long long)gp.buffers,
           (unsigned long long)gp.host_buffers, (unsigned long long)gp.kernels);
    CHECK(gp.nodes >= 6 && gp.buffers == 3 && gp.host_buffers == 2 && gp.kernels == 1);
    /* Captured work did not run. */
    CHECK_OK(sc_host_buffer_read(out, 0, got, n * 4));
    CHECK(got[0] == 0xdeadbeefu && got[n - 1] == 0xdeadbeefu);

    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g, &e));
    CHECK_OK(sc_graph_destroy(g)); /* the exec keeps what it needs */
    for (int r = 0; r < replays; r++) {
        random_u32(h, n, 1000 + (uint64_t)r); /* fresh inputs each replay */
        CHECK_OK(sc_host_buffer_write(in, 0, h, n * 4)); /* waits for the last replay */
        CHECK_OK(sc_graph_launch(r % 2 ? other : s, e));
        CHECK_OK(sc_host_buffer_read(out, 0, got, n * 4)); /* waits for this one */
        for (uint64_t i = 0; i < n; i++)
            want[i] = 21u + 3u + h[i];
        CHECK(same_u32(got, want, n, "chain replay"));
    }
    /* The same chain eagerly gives the same bits. */
    CHECK_OK(sc_copy_from_host_buffer(s, sc_view_of(x), in, 0));
    CHECK_OK(sc_fill(s, sc_view_of(y), &one));
    CHECK_OK(sc_fill(s, sc_view_of(z), &seven));
    CHECK_OK(mad(s, x, y, n));
    CHECK_OK(mad(s, y, z, n));
    CHECK_OK(sc_copy_to_host(s, want, n * 4, sc_view_of(z)));
    CHECK(same_u32(got, want, n, "chain eager"));

    CHECK_OK(sc_graph_exec_destroy(e));
    CHECK_STATUS(sc_graph_launch(s, e), SC_ERR_STALE_HANDLE);
    sc_buffer_destroy(x), sc_buffer_destroy(y), sc_buffer_destroy(z);
    sc_host_buffer_destroy(in), sc_host_buffer_destroy(out);
    sc_stream_destroy(s), sc_stream_destroy(other);
    free(h), free(got), free(want);
}

/* ---- fork and join ---------------------------------------------------------------------------------- */

static void test_fork_join(void)
{
    const uint64_t n = sanitizer ? 2048 : (1u << 18);
    sc_stream a = make_stream("fork a"), b = make_stream("fork b");
    sc_event e1, e2;
    REQUIRE(sc_event_create(ctx, &(sc_event_desc){.label = "fork"}, &e1) == SC_OK);
    REQUIRE(sc_event_create(ctx, &(sc_event_desc){.label = "join"}, &e2) == SC_OK);
    sc_buffer p = make_u32(n, "p"), q = make_u32(n, "q"), r = make_u32(n, "r");
    uint32_t *h = test_xmalloc(n * 4), *got = test_xmalloc(n * 4);
    random_u32(h, n, 77);
    CHECK_OK(sc_copy_from_host(a, sc_view_of(p), h, n * 4));
    const uint32_t two = 2, five = 5;

    CHECK_OK(sc_stream_begin_capture(a, NULL));
    CHECK_OK(sc_event_record(e1, a));
    CHECK_OK(sc_stream_wait(b, e1)); /* b joins the capture */
    bool capturing = false;
    CHECK_OK(sc_stream_is_capturing(b, &capturing));
    CHECK(capturing);
    CHECK_OK(sc_fill(b, sc_view_of(q), &two));
    CHECK_OK(mad(b, p, q, n));          /* q = 6 + p, on b */
    CHECK_OK(sc_fill(a, sc_view_of(r), &five));
    CHECK_OK(mad(a, p, r, n));          /* r = 15 + p, on a, beside b */
    CHECK_OK(sc_event_record(e2, b));
    CHECK_OK(sc_stream_wait(a, e2));    /* the join */
    CHECK_OK(mad(a, q, r, n));          /* r = 3 r + q */
    /* An event recorded in the capture can't be waited on from the host. */
    CHECK_STATUS(sc_event_synchronize(e2), SC_ERR_CAPTURE);
    CHECK_MSG("last recorded inside capture");
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(a, &g));
    CHECK_OK(sc_stream_is_capturing(b, &capturing));
    CHECK(!capturing);
    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g, &e));
    for (int rep = 0; rep < 3; rep++) {
        CHECK_OK(sc_graph_launch(b, e));
        CHECK_OK(sc_copy_to_host(a, got, n * 4, sc_view_of(r)));
        bool ok = true;
        for (uint64_t i = 0; i < n && ok; i++)
            ok = got[i] == 3u * (15u + h[i]) + (6u + h[i]);
        CHECK(ok);
    }

    /* Forked work never joined: the capture ends invalidated, both streams usable. */
    CHECK_OK(sc_stream_begin_capture(a, NULL));
    CHECK_OK(sc_event_record(e1, a));
    CHECK_OK(sc_stream_wait(b, e1));
    CHECK_OK(sc_fill(b, sc_view_of(q), &two));
    sc_graph lost = {7};
    CHECK_STATUS(sc_stream_end_capture(a, &lost), SC_ERR_CAPTURE_INVALIDATED);
    CHECK(lost.id == 0);
    CHECK_OK(sc_stream_is_capturing(b, &capturing));
    CHECK(!capturing);
    CHECK_OK(sc_fill(b, sc_view_of(q), &five));
    CHECK_OK(sc_copy_to_host(b, got, n * 4, sc_view_of(q)));
    CHECK(got[0] == 5 && got[n - 1] == 5);
    CHECK_OK(sc_context_check(ctx));
    CHECK_OK(sc_event_record(e2, a)); /* outside a capture again: waitable */
    CHECK_OK(sc_event_synchronize(e2));

    sc_graph_exec_destroy(e), sc_graph_destroy(g);
    sc_event_destroy(e1), sc_event_destroy(e2);
    sc_buffer_destroy(p), sc_buffer_destroy(q), sc_buffer_destroy(r);
    sc_stream_destroy(a), sc_stream_destroy(b);
    free(h), free(got);
}

/* ---- replay checks --------------------------------------------------------------------------------- */

static void test_stale_replay(void)
{
    const uint64_t n = 4096;
    sc_stream s = make_stream("stale");
    sc_buffer sentinel = make_u32(n, "sentinel"), x = make_u32(n, "doomed x");
    const uint32_t zero = 0, nine = 9;
    CHECK_OK(sc_fill(s, sc_view_of(x), &zero));
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    CHECK_OK(sc_fill(s, sc_view_of(sentinel), &nine));
    CHECK_OK(mad(s, x, sentinel, n));
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(s, &g));
    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g, &e));
    CHECK_OK(sc_fill(s, sc_view_of(sentinel), &zero));
    CHECK_OK(sc_buffer_destroy(x));
    sc_clear_error();
    CHECK_STATUS(sc_graph_launch(s, e), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_graph_launch: stale buffer handle: the buffer created at test_gpu_graph.c:");
    CHECK_MSG("executable graph instantiated at test_gpu_graph.c:");
    CHECK_MSG("nothing was launched");
    sc_graph_exec e2 = {0};
    CHECK_STATUS(sc_graph_instantiate(g, &e2), SC_ERR_STALE_HANDLE);
    CHECK(e2.id == 0);
    uint32_t back[4096];
    CHECK_OK(sc_copy_to_host(s, back, sizeof back, sc_view_of(sentinel)));
    bool untouched = true;
    for (uint64_t i = 0; i < n; i++)
        untouched &= back[i] == 0;
    CHECK(untouched); /* nothing ran */
    CHECK_OK(sc_context_check(ctx));
    sc_graph_exec_destroy(e), sc_graph_destroy(g);
    sc_buffer_destroy(sentinel);
    sc_stream_destroy(s);
}

static void test_destroy_in_flight(void)
{
    const uint64_t n = 1u << 16;
    sc_stream s = make_stream("in flight");
    sc_buffer y = make_u32(n, "busy y"), z = make_u32(n, "busy z");
    const uint32_t three = 3;
    sc_launch_desc cfg = {.grid = {.x = (uint32_t)(n / 256)}, .block = {.x = 256}};
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    CHECK_OK(sc_fill(s, sc_view_of(y), &three));
    CHECK_OK(SC_LAUNCH(s, k_spin, &cfg, sc_arg_inout(sc_view_of(y)), sc_arg_u64(n),
                       sc_arg_i64(sanitizer ? 1000000 : 50000000)));
    CHECK_OK(sc_copy(s, sc_view_of(z), sc_view_of(y)));
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(s, &g));
    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g, &e));
    sc_memory_stats m0;
    CHECK_OK(sc_context_memory(ctx, &m0));
    CHECK_OK(sc_graph_launch(s, e));
    if (!sanitizer)
        CHECK(sc_stream_query(s) == SC_ERR_NOT_READY); /* the spin keeps it in flight */
    CHECK_OK(sc_buffer_destroy(y)); /* freed after the replay, not under it */
    CHECK_OK(sc_buffer_destroy(z));
    CHECK_OK(sc_stream_synchronize(s));
    CHECK_OK(sc_context_check(ctx));
    sc_memory_stats m1;
    CHECK_OK(sc_context_memory(ctx, &m1));
    CHECK(m1.bytes_in_use + 2 * n * 4 == m0.bytes_in_use);
    CHECK_STATUS(sc_graph_launch(s, e), SC_ERR_STALE_HANDLE);
    sc_graph_exec_destroy(e), sc_graph_destroy(g);
    sc_stream_destroy(s);
}

/* ---- what a capture refuses ----------------------------------------------------------------------- */

static void test_refusals(void)
{
    const uint64_t n = 1024;
    sc_stream s = make_stream("refusing"), other = make_stream("bystander");
    sc_buffer x = make_u32(n, "rx"), y = make_u32(n, "ry");
    uint32_t h[1024];
    random_u32(h, n, 5);
    CHECK_OK(sc_copy_from_host(s, sc_view_of(x), h, sizeof h));
    sc_event outside;
    REQUIRE(sc_event_create(ctx, NULL, &outside) == SC_OK);
    CHECK_OK(sc_event_record(outside, other));
    sc_buffer w = make_u32(n, "bystander buffer");
    sc_graph_exec some = {0};
    { /* an executable graph to try to launch inside the capture */
        sc_graph g0 = {0};
        CHECK_OK(sc_stream_begin_capture(other, NULL));
        CHECK_OK(mad(other, x, y, n));
        CHECK_OK(sc_stream_end_capture(other, &g0));
        CHECK_OK(sc_graph_instantiate(g0, &some));
        sc_graph_destroy(g0);
    }
    const uint32_t four = 4;
    CHECK_OK(sc_fill(s, sc_view_of(y), &four));
    CHECK_OK(sc_stream_synchronize(s));

    CHECK_OK(sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_GLOBAL}));
    CHECK_OK(mad(s, x, y, n)); /* captured: y = 12 + x at replay */
    uint32_t back[1024];
    CHECK_STATUS(sc_copy_from_host(s, sc_view_of(x), h, sizeof h), SC_ERR_CAPTURE);
    CHECK_MSG("a copy from pageable host memory can't be part of a graph");
    CHECK_MSG("the capture is still usable");
    CHECK_STATUS(sc_copy_to_host(other, back, sizeof back, sc_view_of(x)), SC_ERR_CAPTURE);
    CHECK_MSG("is not allowed while capture");
    CHECK_STATUS(sc_stream_synchronize(s), SC_ERR_CAPTURE);
    CHECK_STATUS(sc_stream_query(s), SC_ERR_CAPTURE);
    sc_buffer nb = {0};
    CHECK_STATUS(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = 4, .stream = s}, &nb), SC_ERR_CAPTURE);
    CHECK(nb.id == 0);
    CHECK_STATUS(sc_context_synchronize(ctx), SC_ERR_CAPTURE);
    CHECK_STATUS(sc_context_trim(ctx), SC_ERR_CAPTURE);
    sc_host_buffer hb = {0};
    CHECK_STATUS(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 64}, &hb), SC_ERR_CAPTURE);
    CHECK_MSG("pinning host memory");
    sc_program p;
    REQUIRE(sc_program_create(ctx, &(sc_program_desc){.source = src, .name = "again.cu"}, &p) == SC_OK);
    sc_module m2 = {0};
    CHECK_STATUS(sc_module_load(ctx, p, &m2), SC_ERR_CAPTURE);
    CHECK_MSG("loading a module");
    CHECK_STATUS(sc_stream_wait(s, outside), SC_ERR_CAPTURE);
    CHECK_MSG("a graph can't wait for work outside it");
    CHECK_STATUS(sc_graph_launch(s, some), SC_ERR_CAPTURE);
    CHECK_STATUS(sc_stream_begin_capture(s, NULL), SC_ERR_CAPTURE);
    sc_graph none = {0};
    CHECK_STATUS(sc_stream_end_capture(other, &none), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("is not capturing");
    /* Allowed work elsewhere goes on: an asynchronous fill on another stream. */
    const uint32_t eight = 8;
    CHECK_OK(sc_fill(other, sc_view_of(w), &eight));
    /* The capture is still usable. */
    CHECK_OK(mad(s, x, y, n)); /* y = 3 y + x */
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(s, &g));
    CHECK(g.id != 0);
    /* And everything refused works again. */
    CHECK_OK(sc_stream_synchronize(s));
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK_OK(sc_module_load(ctx, p, &m2));
    CHECK_OK(sc_module_destroy(m2));
    CHECK_OK(sc_program_destroy(p));
    CHECK_OK(sc_copy_to_host(other, back, sizeof back, sc_view_of(w)));
    CHECK(back[0] == 8 && back[n - 1] == 8);
    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g, &e));
    CHECK_OK(sc_fill(s, sc_view_of(y), &four));
    CHECK_OK(sc_graph_launch(s, e));
    CHECK_OK(sc_copy_to_host(s, back, sizeof back, sc_view_of(y)));
    bool ok = true;
    for (uint64_t i = 0; i < n; i++)
        ok &= back[i] == 3u * (12u + h[i]) + h[i];
    CHECK(ok);

    /* Relaxed: only the stream-bound refusals. */
    CHECK_OK(sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_RELAXED}));
    CHECK_OK(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 64, .label = "relaxed"}, &hb));
    CHECK_STATUS(sc_stream_synchronize(s), SC_ERR_CAPTURE);
    CHECK_OK(mad(s, x, y, n));
    sc_graph g2 = {0};
    CHECK_OK(sc_stream_end_capture(s, &g2));
    CHECK_OK(sc_host_buffer_destroy(hb));

    /* Destroys during a capture always destroy: a pinned buffer's release waits for the
     * capture's end; a stream taking part abandons the capture. */
    sc_host_buffer late;
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 64}, &late) == SC_OK);
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    CHECK_OK(sc_host_buffer_destroy(late));
    CHECK_STATUS(sc_host_buffer_destroy(late), SC_ERR_STALE_HANDLE);
    CHECK_OK(mad(s, x, y, n));
    sc_graph g3 = {0};
    CHECK_OK(sc_stream_end_capture(s, &g3)); /* the deferred release runs here */
    sc_stream doomed = make_stream("doomed");
    CHECK_OK(sc_stream_begin_capture(doomed, NULL));
    CHECK_OK(sc_fill(doomed, sc_view_of(y), &four));
    CHECK_OK(sc_stream_destroy(doomed));
    CHECK_OK(sc_context_synchronize(ctx)); /* no capture left open */
    CHECK_OK(sc_context_check(ctx));

    sc_graph_exec_destroy(e), sc_graph_exec_destroy(some);
    sc_graph_destroy(g), sc_graph_destroy(g2), sc_graph_destroy(g3);
    sc_event_destroy(outside);
    sc_buffer_destroy(x), sc_buffer_destroy(y), sc_buffer_destroy(w);
    sc_stream_destroy(s), sc_stream_destroy(other);
}

/* ---- update -------------------------------------------------------------------------------------- */

static sc_graph capture_mad(sc_stream s, sc_buffer x, sc_buffer y, uint64_t n, int extra)
{
    const uint32_t one = 1;
    sc_graph g = {0};
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    CHECK_OK(sc_fill(s, sc_view_of(y), &one));
    CHECK_OK(mad(s, x, y, n));
    for (int i = 0; i < extra; i++)
        CHECK_OK(mad(s, x, y, n));
    CHECK_OK(sc_stream_end_capture(s, &g));
    return g;
}

static void test_update(void)
{
    const uint64_t n = 8192;
    sc_stream s = make_stream("update");
    sc_buffer x1 = make_u32(n, "x1"), y1 = make_u32(n, "y1"), x2 = make_u32(n, "x2"),
              y2 = make_u32(n, "y2");
    uint32_t *h1 = test_xmalloc(n * 4), *h2 = test_xmalloc(n * 4), *got = test_xmalloc(n * 4);
    random_u32(h1, n, 11), random_u32(h2, n, 12);
    CHECK_OK(sc_copy_from_host(s, sc_view_of(x1), h1, n * 4));
    CHECK_OK(sc_copy_from_host(s, sc_view_of(x2), h2, n * 4));
    sc_graph g1 = capture_mad(s, x1, y1, n, 0), g2 = capture_mad(s, x2, y2, n, 0),
             g3 = capture_mad(s, x2, y2, n, 1);
    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g1, &e));
    sc_graph_update_result how = SC_GRAPH_REINSTANTIATED;
    CHECK_OK(sc_graph_exec_update(e, g2, &how)); /* same shape, other arguments */
    CHECK(how == SC_GRAPH_UPDATED);
    const uint32_t zero = 0;
    CHECK_OK(sc_fill(s, sc_view_of(y1), &zero));
    CHECK_OK(sc_graph_launch(s, e));
    CHECK_OK(sc_copy_to_host(s, got, n * 4, sc_view_of(y2)));
    bool ok = true;
    for (uint64_t i = 0; i < n; i++)
        ok &= got[i] == 3u + h2[i];
    CHECK(ok);
    CHECK_OK(sc_copy_to_host(s, got, n * 4, sc_view_of(y1)));
    CHECK(got[0] == 0 && got[n - 1] == 0); /* the old arguments are not used any more */
    /* The remembered objects followed: x1 may go. */
    CHECK_OK(sc_buffer_destroy(x1));
    CHECK_OK(sc_graph_launch(s, e));
    /* Another shape: instantiated anew. */
    CHECK_OK(sc_graph_exec_update(e, g3, &how));
    CHECK(how == SC_GRAPH_REINSTANTIATED);
    CHECK_OK(sc_graph_launch(s, e));
    CHECK_OK(sc_copy_to_host(s, got, n * 4, sc_view_of(y2)));
    ok = true;
    for (uint64_t i = 0; i < n; i++)
        ok &= got[i] == 3u * (3u + h2[i]) + h2[i];
    CHECK(ok);
    sc_graph_props p;
    CHECK_OK(sc_graph_exec_info(e, &p));
    CHECK(p.buffers == 2 && p.kernels == 1);
    sc_graph_exec_destroy(e);
    sc_graph_destroy(g1), sc_graph_destroy(g2), sc_graph_destroy(g3);
    sc_buffer_destroy(y1), sc_buffer_destroy(x2), sc_buffer_destroy(y2);
    sc_stream_destroy(s);
    free(h1), free(h2), free(got);
}

/* ---- 8 threads, each capturing and replaying its own graphs --------------------------------------- */

static atomic_int thread_failures;

static void *graph_thread(void *arg)
{
    const int me = (int)(intptr_t)arg;
    const uint64_t n = sanitizer ? 1024 : 65536;
    const int rounds = sanitizer ? 2 : 10, replays = sanitizer ? 2 : 10;
    char label[32];
    snprintf(label, sizeof label, "thread %d", me);
    sc_stream s;
    sc_buffer x, y;
    sc_host_buffer in, out;
    if (sc_stream_create(ctx, &(sc_stream_desc){.label = label}, &s) != SC_OK ||
        sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = n}, &x) != SC_OK ||
        sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = n}, &y) != SC_OK ||
        sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = n * 4}, &in) != SC_OK ||
        sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = n * 4}, &out) != SC_OK) {
        fprintf(stderr, "thread %d: setup failed: %s\n", me, sc_last_error());
        atomic_fetch_add(&thread_failures, 1);
        return NULL;
    }
    uint32_t *h = malloc(n * 4), *got = malloc(n * 4);
    int bad = 0;
    for (int r = 0; r < rounds && h && got; r++) {
        const uint32_t base = (uint32_t)(me * 100 + r);
        sc_graph g = {0};
        sc_graph_exec e = {0};
        bad += sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_THREAD_LOCAL}) != SC_OK;
        bad += sc_copy_from_host_buffer(s, sc_view_of(x), in, 0) != SC_OK;
        bad += sc_fill(s, sc_view_of(y), &base) != SC_OK;
        bad += mad(s, x, y, n) != SC_OK;
        bad += sc_copy_to_host_buffer(s, out, 0, sc_view_of(y)) != SC_OK;
        bad += sc_stream_end_capture(s, &g) != SC_OK;
        bad += sc_graph_instantiate(g, &e) != SC_OK;
        for (int k = 0; k < replays; k++) {
            test_fill_random(h, n * 4, (uint64_t)(me * 1000 + r * 10 + k));
            bad += sc_host_buffer_write(in, 0, h, n * 4) != SC_OK;
            bad += sc_graph_launch(s, e) != SC_OK;
            bad += sc_host_buffer_read(out, 0, got, n * 4) != SC_OK;
            for (uint64_t i = 0; i < n; i++)
                if (got[i] != base * 3u + h[i]) {
                    bad++;
                    break;
                }
        }
        bad += sc_graph_exec_destroy(e) != SC_OK;
        bad += sc_graph_destroy(g) != SC_OK;
    }
    if (bad)
        fprintf(stderr, "thread %d: %d failures (last error: %s)\n", me, bad, sc_last_error());
    atomic_fetch_add(&thread_failures, bad);
    free(h), free(got);
    sc_buffer_destroy(x), sc_buffer_destroy(y);
    sc_host_buffer_destroy(in), sc_host_buffer_destroy(out);
    sc_stream_destroy(s);
    return NULL;
}

static void test_threads(void)
{
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        REQUIRE(pthread_create(&t[i], NULL, graph_thread, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    CHECK(atomic_load(&thread_failures) == 0);
    CHECK_OK(sc_context_check(ctx));
}

/* ---- a captured MoE forward ------------------------------------------------------------------------- */

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static sc_buffer random_bf16(uint64_t n, float scale, uint64_t *seed, const char *label)
{
    uint16_t *h = test_xmalloc(n * 2);
    for (uint64_t i = 0; i < n; i++)
        h[i] = bf16_of(((float)(test_rand(seed) >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * scale);
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n, .label = label}, &b) == SC_OK);
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), h, n * 2) == SC_OK);
    free(h);
    return b;
}

static void test_moe(void)
{
    enum { E = 16, K = 4, H = 512, I = 256, T = 4 };
    const int replays = sanitizer ? 20 : 1000;
    uint64_t seed = 42;
    sc_buffer router = random_bf16(E * H, 0.05f, &seed, "router"),
              w13 = random_bf16((uint64_t)E * 2 * I * H, 0.05f, &seed, "w13"),
              w2 = random_bf16((uint64_t)E * H * I, 0.07f, &seed, "w2");
    sc_moe layer;
    REQUIRE(sc_moe_create(ctx, &(sc_moe_desc){.experts = E, .top_k = K, .hidden = H,
                                              .intermediate = I, .renormalize = true,
                                              .router = router, .w13 = w13, .w2 = w2,
                                              .max_tokens = 8, .label = "graph moe"},
                          &layer) == SC_OK);
    sc_stream s = make_stream("moe decode");
    CHECK_OK(sc_moe_reserve(s, layer, 16));
    sc_buffer x, out, eager, big_x, big_out;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = T * H, .label = "x"}, &x) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = T * H, .label = "out"}, &out) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = T * H, .label = "eager"}, &eager) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = 64 * H, .label = "big x"}, &big_x) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = 64 * H, .label = "big out"}, &big_out) == SC_OK);

    CHECK_OK(sc_stream_begin_capture(s, NULL));
    /* A forward that would grow the workspace, or a profiled one, is refused. */
    CHECK_STATUS(sc_moe_forward(s, layer, sc_view_of(big_x), sc_view_of(big_out), NULL), SC_ERR_CAPTURE);
    CHECK_MSG("sc_moe_reserve");
    sc_moe_profile prof;
    CHECK_STATUS(sc_moe_forward(s, layer, sc_view_of(x), sc_view_of(out), &(sc_moe_forward_desc){.profile = &prof}), SC_ERR_CAPTURE);
    CHECK_OK(sc_moe_forward(s, layer, sc_view_of(x), sc_view_of(out), NULL));
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(s, &g));
    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g, &e));
    sc_graph_props p;
    CHECK_OK(sc_graph_info(g, &p));
    printf("  moe decode graph: %llu nodes, %llu buffers, %llu kernels\n",
           (unsigned long long)p.nodes, (unsigned long long)p.buffers,
           (unsigned long long)p.kernels);

    uint16_t *hx = test_xmalloc(T * H * 2), *a = test_xmalloc(T * H * 2), *b = test_xmalloc(T * H * 2);
    int differ = 0;
    for (int r = 0; r < replays; r++) {
        for (int i = 0; i < T * H; i++)
            hx[i] = bf16_of(((float)(test_rand(&seed) >> 40) / (float)(1 << 24) * 2.0f - 1.0f));
        CHECK_OK(sc_copy_from_host(s, sc_view_of(x), hx, T * H * 2)); /* new tokens */
        const uint16_t poison = 0x7fc3;
        CHECK_OK(sc_fill(s, sc_view_of(out), &poison));
        CHECK_OK(sc_graph_launch(s, e));
        CHECK_OK(sc_moe_forward(s, layer, sc_view_of(x), sc_view_of(eager), NULL));
        CHECK_OK(sc_copy_to_host(s, a, T * H * 2, sc_view_of(out)));
        CHECK_OK(sc_copy_to_host(s, b, T * H * 2, sc_view_of(eager)));
        if (memcmp(a, b, T * H * 2) != 0)
            differ++;
    }
    printf("  moe decode: %d replays, %d differ from the eager forward\n", replays, differ);
    CHECK(differ == 0);
    /* The layer destroyed: its workspace and kernels went with it, so the replay is refused. */
    CHECK_OK(sc_moe_destroy(layer));
    CHECK_STATUS(sc_graph_launch(s, e), SC_ERR_STALE_HANDLE);
    sc_graph_exec_destroy(e), sc_graph_destroy(g);
    sc_buffer bufs[] = {router, w13, w2, x, out, eager, big_x, big_out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        sc_buffer_destroy(bufs[i]);
    sc_stream_destroy(s);
    free(hx), free(a), free(b);
}

int main(void)
{
    gpu_require();
    sanitizer = getenv("SAFECUDA_UNDER_SANITIZER") != NULL;
    if (sanitizer)
        printf("SAFECUDA_UNDER_SANITIZER: small sizes and few replays\n");
    double t0 = test_now_s();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_program prog;
    REQUIRE(sc_program_create(ctx, &(sc_program_desc){.source = src, .name = "graph.cu"}, &prog) == SC_OK);
    REQUIRE(sc_module_load(ctx, prog, &mod) == SC_OK);
    REQUIRE(sc_kernel_get(mod, "mad3", &k_mad) == SC_OK);
    REQUIRE(sc_kernel_get(mod, "spin", &k_spin) == SC_OK);
    TEST_RUN(test_chain);
    TEST_RUN(test_fork_join);
    TEST_RUN(test_stale_replay);
    TEST_RUN(test_destroy_in_flight);
    TEST_RUN(test_refusals);
    TEST_RUN(test_update);
    TEST_RUN(test_threads);
    TEST_RUN(test_moe);
    CHECK_OK(sc_module_destroy(mod));
    CHECK_OK(sc_program_destroy(prog));
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    printf("total %.2f s\n", test_now_s() - t0);
    return test_result("test_gpu_graph");
}
