/* The graph bookkeeping of the library against the test device (host memory, launches
 * accepted without running): capture states, the calls a capture refuses (none of them may
 * reach the driver: the device counts each as misuse), what a graph remembers, replay
 * checks, ordering of a replay against other streams' work, update, destroys during a
 * capture, leak reports. Nothing here says anything about a GPU. */
#include "../test.h"
#include "td_control.h"
#include "td_ptx.h"

static sc_context ctx;
static sc_module mod;
static sc_kernel add;

static sc_buffer make_f32(uint64_t n, const char *label)
{
    sc_buffer b = {0};
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = label},
                             &b) == SC_OK);
    return b;
}

static sc_stream make_stream(const char *label)
{
    sc_stream s = {0};
    REQUIRE(sc_stream_create(ctx, &(sc_stream_desc){.label = label}, &s) == SC_OK);
    return s;
}

static sc_status launch_add(sc_stream s, sc_buffer a, sc_buffer b)
{
    sc_launch_desc cfg = {.grid = {.x = 1}, .block = {.x = 64}};
    return SC_LAUNCH(s, add, &cfg, sc_arg_in(sc_view_of(a)), sc_arg_inout(sc_view_of(b)),
                     sc_arg_u32(64));
}

/* Copies and fills captured move bytes only when the graph is launched. */
static void test_capture_and_replay(void)
{
    const uint64_t n = 64;
    sc_stream s = make_stream("capturing"), other = make_stream("other");
    sc_buffer a = make_f32(n, "a"), b = make_f32(n, "b");
    sc_host_buffer in, out;
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = n * 4, .label = "in"}, &in) == SC_OK);
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = n * 4, .label = "out"}, &out) == SC_OK);
    float h[64], got[64];
    for (int i = 0; i < 64; i++)
        h[i] = (float)i + 0.5f;
    CHECK_OK(sc_host_buffer_write(in, 0, h, sizeof h));
    const float poison = -1.0f, two = 2.0f;
    CHECK_OK(sc_fill(s, sc_view_of(b), &poison));
    for (int i = 0; i < 64; i++)
        got[i] = poison;
    CHECK_OK(sc_host_buffer_write(out, 0, got, sizeof got));

    fake_counts before = fake_counts_now();
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    CHECK(fake.active_captures() == before.captures + 1);
    CHECK_OK(sc_copy_from_host_buffer(s, sc_view_of(a), in, 0));
    CHECK_OK(sc_fill(s, sc_view_of(b), &two));
    CHECK_OK(launch_add(s, a, b));
    CHECK_OK(sc_copy_to_host_buffer(s, out, 0, sc_view_of(b)));
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(s, &g));
    /* Nothing ran: out and b still hold the poison. */
    float back[64];
    CHECK_OK(sc_host_buffer_read(out, 0, back, sizeof back));
    CHECK(back[0] == poison && back[63] == poison);
    CHECK_OK(sc_copy_to_host(other, back, sizeof back, sc_view_of(b)));
    CHECK(back[0] == poison && back[63] == poison);
    CHECK(fake.active_captures() == before.captures);
    sc_graph_props p;
    CHECK_OK(sc_graph_info(g, &p));
    CHECK(p.nodes == 4 && p.buffers == 2 && p.host_buffers == 2 && p.kernels == 1);
    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g, &e));
    CHECK(fake.live_graph_execs() == before.graph_execs + 1);
    CHECK_OK(sc_graph_launch(other, e));
    CHECK_OK(sc_host_buffer_read(out, 0, got, sizeof got));
    CHECK(got[0] == two && got[63] == two); /* the copy and fill ran (the kernel does not) */
    CHECK_OK(sc_copy_to_host(s, back, sizeof back, sc_view_of(a)));
    CHECK(memcmp(back, h, sizeof h) == 0);

    /* A replay is one operation on its objects: a write on another stream waits for it, and
     * it waits for earlier writes (on the test device streams are synchronous, so what is
     * checked is that the library's ordering calls reach the driver without misuse). */
    CHECK_OK(sc_fill(s, sc_view_of(a), &two));
    CHECK_OK(sc_graph_launch(other, e));
    CHECK_OK(sc_fill(s, sc_view_of(b), &poison));

    /* A stale object refuses the launch before anything runs. */
    CHECK_OK(sc_buffer_destroy(a));
    for (int i = 0; i < 64; i++)
        got[i] = 7.0f;
    CHECK_OK(sc_host_buffer_write(out, 0, got, sizeof got));
    CHECK_STATUS(sc_graph_launch(other, e), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_graph_launch: stale buffer handle: the buffer created at test_td_graph.c:");
    CHECK_MSG("executable graph instantiated at test_td_graph.c:");
    CHECK_MSG("from the graph captured at test_td_graph.c:");
    CHECK_OK(sc_host_buffer_read(out, 0, got, sizeof got));
    CHECK(got[0] == 7.0f); /* nothing ran */
    sc_graph_exec e2 = {0};
    CHECK_STATUS(sc_graph_instantiate(g, &e2), SC_ERR_STALE_HANDLE);
    CHECK(e2.id == 0);

    CHECK_OK(sc_graph_exec_destroy(e));
    CHECK_STATUS(sc_graph_exec_destroy(e), SC_ERR_STALE_HANDLE);
    CHECK_OK(sc_graph_destroy(g));
    CHECK_STATUS(sc_graph_info(g, &p), SC_ERR_STALE_HANDLE);
    sc_buffer_destroy(b);
    sc_host_buffer_destroy(in), sc_host_buffer_destroy(out);
    sc_stream_destroy(s), sc_stream_destroy(other);
}

/* Every refusal: the status, the message, and no call reaching the driver that would
 * invalidate the capture (the device counts those as misuse). */
static void test_refusals(void)
{
    sc_stream s = make_stream("refusing"), other = make_stream("other");
    sc_buffer a = make_f32(64, "ra"), b = make_f32(64, "rb");
    float h[64] = {0};
    sc_event outside, inside;
    REQUIRE(sc_event_create(ctx, NULL, &outside) == SC_OK);
    REQUIRE(sc_event_create(ctx, NULL, &inside) == SC_OK);
    CHECK_OK(sc_event_record(outside, other));
    sc_host_buffer early;
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 64}, &early) == SC_OK);
    sc_program prog;
    const long misuse0 = fake.misuse_count();

    CHECK_OK(sc_stream_begin_capture(s, NULL));
    CHECK_STATUS(sc_stream_begin_capture(s, NULL), SC_ERR_CAPTURE);
    CHECK_MSG("stream 'refusing' (created at test_td_graph.c:");
    CHECK_STATUS(sc_copy_from_host(s, sc_view_of(a), h, sizeof h), SC_ERR_CAPTURE);
    CHECK_MSG("sc_copy_from_host: a copy from pageable host memory can't be part of a graph");
    CHECK_STATUS(sc_copy_to_host(other, h, sizeof h, sc_view_of(a)), SC_ERR_CAPTURE);
    CHECK_MSG("is not allowed while capture");
    CHECK_MSG("global mode");
    CHECK_STATUS(sc_stream_synchronize(s), SC_ERR_CAPTURE);
    CHECK_STATUS(sc_stream_query(s), SC_ERR_CAPTURE);
    sc_buffer nb = {0};
    CHECK_STATUS(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 4, .stream = s}, &nb),
                 SC_ERR_CAPTURE);
    CHECK_MSG("creating a buffer on it");
    CHECK_STATUS(sc_context_synchronize(ctx), SC_ERR_CAPTURE);
    CHECK_STATUS(sc_context_trim(ctx), SC_ERR_CAPTURE);
    sc_host_buffer hb = {0};
    CHECK_STATUS(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 64}, &hb), SC_ERR_CAPTURE);
    sc_module m2 = {0};
    CHECK_STATUS(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m2),
                 SC_ERR_CAPTURE);
    CHECK_MSG("loading a module");
    CHECK_STATUS(sc_stream_wait(s, outside), SC_ERR_CAPTURE);
    CHECK_MSG("a graph can't wait for work outside it");
    CHECK_OK(sc_event_record(inside, s));
    CHECK_STATUS(sc_event_synchronize(inside), SC_ERR_CAPTURE);
    CHECK_STATUS(sc_event_query(inside), SC_ERR_CAPTURE);
    CHECK_MSG("(still in progress)");
    sc_graph none = {0};
    CHECK_STATUS(sc_stream_end_capture(other, &none), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("is not capturing");
    (void)prog;
    /* Destroys during the capture: a pinned buffer's release is deferred to its end. */
    const long host0 = fake.live_host_allocations();
    CHECK_OK(sc_host_buffer_destroy(early));
    CHECK(fake.live_host_allocations() == host0);
    /* A buffer last used on the capturing stream is freed on another stream. */
    CHECK_OK(sc_fill(other, sc_view_of(b), &(float){1.0f}));
    CHECK_OK(launch_add(s, a, b)); /* captured */
    CHECK_OK(sc_buffer_destroy(b)); /* last real use: 'other'; fine */
    /* The capture is still usable. */
    CHECK_OK(sc_fill(s, sc_view_of(a), &(float){3.0f}));
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(s, &g));
    CHECK(fake.live_host_allocations() == host0 - 1); /* the deferred release ran */
    CHECK(fake.misuse_count() == misuse0);
    /* Everything refused works again. */
    CHECK_OK(sc_stream_synchronize(s));
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK_OK(sc_event_synchronize(outside));
    CHECK_STATUS(sc_event_synchronize(inside), SC_ERR_CAPTURE); /* until recorded again */
    CHECK_MSG("was last recorded inside capture");
    CHECK_OK(sc_event_record(inside, other));
    CHECK_OK(sc_event_synchronize(inside));
    /* The graph remembers b, destroyed during the capture: its launch is refused. */
    sc_graph_exec e = {0};
    CHECK_STATUS(sc_graph_instantiate(g, &e), SC_ERR_STALE_HANDLE);

    /* Relaxed: only the stream-bound refusals. */
    CHECK_OK(sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_RELAXED}));
    CHECK_OK(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 64}, &hb));
    CHECK_OK(sc_copy_to_host(other, h, sizeof h, sc_view_of(a)));
    CHECK_STATUS(sc_context_synchronize(ctx), SC_ERR_CAPTURE); /* its work can't finish */
    CHECK_STATUS(sc_stream_synchronize(s), SC_ERR_CAPTURE);
    sc_graph g2 = {0};
    CHECK_OK(sc_stream_end_capture(s, &g2));
    CHECK_OK(sc_host_buffer_destroy(hb));
    CHECK(fake.misuse_count() == misuse0);

    /* A stream taking part in a capture is destroyed: the capture is abandoned. */
    sc_stream doomed = make_stream("doomed");
    CHECK_OK(sc_stream_begin_capture(doomed, NULL));
    CHECK_OK(sc_fill(doomed, sc_view_of(a), &(float){4.0f}));
    const long graphs0 = fake.live_graphs();
    CHECK_OK(sc_stream_destroy(doomed));
    CHECK(fake.active_captures() == 0 && fake.live_graphs() == graphs0);
    CHECK_OK(sc_context_synchronize(ctx));

    sc_graph_destroy(g), sc_graph_destroy(g2);
    sc_event_destroy(outside), sc_event_destroy(inside);
    sc_buffer_destroy(a);
    sc_stream_destroy(s), sc_stream_destroy(other);
    CHECK(fake.misuse_count() == misuse0);
}

/* Fork, join, and work forked and never joined. */
static void test_fork_join(void)
{
    sc_stream a = make_stream("origin"), b = make_stream("forked");
    sc_event e1, e2;
    REQUIRE(sc_event_create(ctx, NULL, &e1) == SC_OK);
    REQUIRE(sc_event_create(ctx, NULL, &e2) == SC_OK);
    sc_buffer x = make_f32(64, "x"), y = make_f32(64, "y");
    CHECK_OK(sc_stream_begin_capture(a, NULL));
    CHECK_OK(sc_event_record(e1, a));
    CHECK_OK(sc_stream_wait(b, e1));
    bool capturing = false;
    CHECK_OK(sc_stream_is_capturing(b, &capturing));
    CHECK(capturing);
    CHECK_OK(sc_fill(b, sc_view_of(x), &(float){1.0f}));
    CHECK_OK(launch_add(a, x, y)); /* reads x, written on b: ordered inside the capture */
    CHECK_STATUS(sc_stream_end_capture(b, &(sc_graph){0}), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("joined capture");
    CHECK_OK(sc_event_record(e2, b));
    CHECK_OK(sc_stream_wait(a, e2));
    sc_graph g = {0};
    CHECK_OK(sc_stream_end_capture(a, &g));
    CHECK_OK(sc_stream_is_capturing(b, &capturing));
    CHECK(!capturing);
    sc_graph_props p;
    CHECK_OK(sc_graph_info(g, &p));
    CHECK(p.nodes == 2 && p.buffers == 2);

    /* Unjoined: invalidated, no graph, both streams usable. */
    CHECK_OK(sc_stream_begin_capture(a, NULL));
    CHECK_OK(sc_event_record(e1, a));
    CHECK_OK(sc_stream_wait(b, e1));
    CHECK_OK(sc_fill(b, sc_view_of(x), &(float){2.0f}));
    sc_graph lost = {9};
    CHECK_STATUS(sc_stream_end_capture(a, &lost), SC_ERR_CAPTURE_INVALIDATED);
    CHECK_MSG("never waited for");
    CHECK(lost.id == 0);
    CHECK(fake.active_captures() == 0);
    CHECK_OK(sc_fill(b, sc_view_of(x), &(float){3.0f}));
    CHECK_OK(sc_stream_synchronize(b));
    CHECK_OK(sc_context_check(ctx));
    sc_graph_destroy(g);
    sc_event_destroy(e1), sc_event_destroy(e2);
    sc_buffer_destroy(x), sc_buffer_destroy(y);
    sc_stream_destroy(a), sc_stream_destroy(b);
}

static sc_graph capture_fill(sc_stream s, sc_buffer b, float v, int fills)
{
    sc_graph g = {0};
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    for (int i = 0; i < fills; i++)
        CHECK_OK(sc_fill(s, sc_view_of(b), &v));
    CHECK_OK(sc_stream_end_capture(s, &g));
    return g;
}

static void test_update(void)
{
    sc_stream s = make_stream("update");
    sc_buffer b1 = make_f32(64, "b1"), b2 = make_f32(64, "b2");
    sc_graph g1 = capture_fill(s, b1, 1.0f, 1), g2 = capture_fill(s, b2, 2.0f, 1),
             g3 = capture_fill(s, b2, 3.0f, 2);
    sc_graph_exec e = {0};
    CHECK_OK(sc_graph_instantiate(g1, &e));
    sc_graph_update_result how = SC_GRAPH_REINSTANTIATED;
    CHECK_OK(sc_graph_exec_update(e, g2, &how));
    CHECK(how == SC_GRAPH_UPDATED);
    CHECK_OK(sc_buffer_destroy(b1)); /* no longer remembered */
    CHECK_OK(sc_graph_launch(s, e));
    float back[64];
    CHECK_OK(sc_copy_to_host(s, back, sizeof back, sc_view_of(b2)));
    CHECK(back[0] == 2.0f && back[63] == 2.0f);
    CHECK_OK(sc_graph_exec_update(e, g3, &how));
    CHECK(how == SC_GRAPH_REINSTANTIATED);
    CHECK_OK(sc_graph_launch(s, e));
    CHECK_OK(sc_copy_to_host(s, back, sizeof back, sc_view_of(b2)));
    CHECK(back[0] == 3.0f);
    sc_graph_props p;
    CHECK_OK(sc_graph_exec_info(e, &p));
    CHECK(p.nodes == 2 && p.buffers == 1);
    /* g1 remembers the destroyed b1: updating to it is refused. */
    CHECK_STATUS(sc_graph_exec_update(e, g1, &how), SC_ERR_STALE_HANDLE);
    CHECK_OK(sc_graph_launch(s, e)); /* still the g3 work */
    sc_graph_exec_destroy(e);
    sc_graph_destroy(g1), sc_graph_destroy(g2), sc_graph_destroy(g3);
    sc_buffer_destroy(b2);
    sc_stream_destroy(s);
}

/* Graphs and executable graphs are leak-reported with their creation sites and freed. */
static void test_leaks(void)
{
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_stream s;
    REQUIRE(sc_stream_create(c, &(sc_stream_desc){.label = "leaky"}, &s) == SC_OK);
    sc_buffer b;
    REQUIRE(sc_buffer_create(c, &(sc_buffer_desc){.dtype = SC_F32, .count = 8}, &b) == SC_OK);
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    CHECK_OK(sc_fill(s, sc_view_of(b), &(float){1.0f}));
    sc_graph g;
    CHECK_OK(sc_stream_end_capture(s, &g));
    sc_graph_exec e;
    CHECK_OK(sc_graph_instantiate(g, &e));
    /* And a capture left open: abandoned with its stream. */
    CHECK_OK(sc_stream_begin_capture(s, NULL));
    sc_set_log_callback(test_log_capture, NULL);
    test_log_text[0] = '\0';
    CHECK_STATUS(sc_context_destroy(c), SC_ERR_LEAKED);
    sc_set_log_callback(NULL, NULL);
    CHECK(strstr(test_log_text, "graph 'capture of 'leaky''") != NULL);
    CHECK(strstr(test_log_text, "executable graph 'capture of 'leaky''") != NULL);
    CHECK(strstr(test_log_text, "was abandoned") != NULL);
    CHECK_STATUS(sc_graph_launch(s, e), SC_ERR_STALE_HANDLE);
}

int main(void)
{
    fake_attach();
    fake_counts start = fake_counts_now();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &mod) == SC_OK);
    REQUIRE(sc_kernel_get(mod, "add", &add) == SC_OK);
    TEST_RUN(test_capture_and_replay);
    TEST_RUN(test_refusals);
    TEST_RUN(test_fork_join);
    TEST_RUN(test_update);
    CHECK_OK(sc_module_destroy(mod));
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    TEST_RUN(test_leaks);
    char diff[512];
    CHECK(fake_counts_diff(start, fake_counts_now(), diff, sizeof diff) == 0);
    if (diff[0])
        fprintf(stderr, "the test device's objects differ: %s\n", diff);
    CHECK(fake.misuse_count() == 0);
    if (fake.misuse_count())
        fprintf(stderr, "misuse: %s\n", fake.last_misuse());
    return test_result("test_td_graph");
}
