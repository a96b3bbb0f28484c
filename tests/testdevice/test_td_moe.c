/* The MoE layer's host side against the test device: every variant of sc_moe_desc (group-
 * limited routing, routed scaling, router and expert biases, a shared expert with and
 * without its gate and of several chunks, the activations, interleaved W13, weights as views
 * into one allocation, up to 512 experts) is created on both backends, and forwards of every
 * routing path (one launch for few tokens, steps for more, the caller's routing, the routing
 * alone, accumulate, the optional outputs) are issued: each launch passes the library's
 * checks of argument count and sizes against the kernels' real parameters (the test device
 * reads them from the PTX) and each tensor map the test device's checks of its geometry
 * (inside one allocation, aligned strides). Then the forward-time checks of the caller's
 * routing and the routing call, and a destroyed weight (the create-time checks are
 * tests/moe_desc_checks.h, run by test_td_moe_desc).
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: no kernel runs here, so nothing here says
 * anything about the layer's results (tests/gpu/test_gpu_moe*.c compare them with a CPU
 * reference on a GPU). */
#include <stdint.h>

#include "../test.h"
#include "td_control.h"
#include "safecuda/moe.h"
#include "td_moe.h"

static sc_context ctx;

#define CHECK_FAIL_SAYS(expr, want, needle)                                                    \
    do {                                                                                  \
        sc_clear_error();                                                                 \
        CHECK_STATUS(expr, want);                                                         \
        CHECK_MSG(needle);                                                                \
    } while (0)

/* ---- weights ---------------------------------------------------------------------------- */

/* A layer's weights: whole buffers, or views into one bf16 and one f32 allocation at
 * 16-byte (not 256-byte) aligned offsets. */
typedef struct weights {
    sc_buffer bf, f32;  /* the allocations the views are of */
    sc_buffer whole[6]; /* router, w13, w2, selection bias, (unused) when not views */
} weights;

static uint64_t place(uint64_t *cursor, uint64_t count)
{
    uint64_t at = *cursor + 8; /* 16 bytes of bf16 (32 of f32) past the last one */
    *cursor = at + count;
    *cursor = (*cursor + 7) / 8 * 8;
    return at;
}

/* Fill d's weight fields for its shape (E, k, H, I, shared_intermediate) and the flags:
 * views, sel_bias, router_bias, expert biases, gate. */
static void make_weights(sc_moe_desc *d, weights *w, bool views, bool sel_bias, bool router_bias,
                         bool biases, bool gate)
{
    memset(w, 0, sizeof *w);
    const uint64_t E = (uint64_t)d->experts, H = (uint64_t)d->hidden;
    const uint64_t I = (uint64_t)d->intermediate, Is = (uint64_t)d->shared_intermediate;
    const uint64_t n_router = E * H, n_w13 = E * 2 * I * H, n_w2 = E * H * I;
    uint64_t bf_end = 0, f_end = 0;
    const uint64_t o_router = place(&bf_end, n_router), o_w13 = place(&bf_end, n_w13);
    const uint64_t o_w2 = place(&bf_end, n_w2);
    const uint64_t o_sw13 = Is ? place(&bf_end, 2 * Is * H) : 0;
    const uint64_t o_sw2 = Is ? place(&bf_end, H * Is) : 0;
    const uint64_t o_gate = gate ? place(&bf_end, H) : 0;
    const uint64_t o_sel = place(&f_end, E), o_rb = place(&f_end, E);
    const uint64_t o_b13 = place(&f_end, E * 2 * I), o_b2 = place(&f_end, E * H);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = bf_end + 8,
                                                     .label = "moe checkpoint", .zero = true},
                             &w->bf) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = f_end + 8,
                                                     .label = "moe f32 checkpoint",
                                                     .zero = true},
                             &w->f32) == SC_OK);
    if (views) {
        d->router_view = (sc_view){w->bf, o_router, n_router};
        d->w13_view = (sc_view){w->bf, o_w13, n_w13};
        d->w2_view = (sc_view){w->bf, o_w2, n_w2};
        if (sel_bias)
            d->selection_bias_view = (sc_view){w->f32, o_sel, E};
    } else {
        const uint64_t counts[4] = {n_router, n_w13, n_w2, E};
        const sc_dtype types[4] = {SC_BF16, SC_BF16, SC_BF16, SC_F32};
        for (int i = 0; i < 4; i++)
            if (i < 3 || sel_bias)
                REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = types[i],
                                                                 .count = counts[i],
                                                                 .zero = true},
                                         &w->whole[i]) == SC_OK);
        d->router = w->whole[0];
        d->w13 = w->whole[1];
        d->w2 = w->whole[2];
        d->selection_bias = w->whole[3];
    }
    if (router_bias)
        d->router_bias = (sc_view){w->f32, o_rb, E};
    if (biases) {
        d->w13_bias = (sc_view){w->f32, o_b13, E * 2 * I};
        d->w2_bias = (sc_view){w->f32, o_b2, E * H};
    }
    if (Is) {
        d->shared_w13 = (sc_view){w->bf, o_sw13, 2 * Is * H};
        d->shared_w2 = (sc_view){w->bf, o_sw2, H * Is};
    }
    if (gate)
        d->shared_gate = (sc_view){w->bf, o_gate, H};
}

static void free_weights(weights *w)
{
    CHECK_OK(sc_buffer_destroy(w->bf));
    CHECK_OK(sc_buffer_destroy(w->f32));
    for (int i = 0; i < 6; i++)
        if (w->whole[i].id)
            CHECK_OK(sc_buffer_destroy(w->whole[i]));
}

/* ---- every routing path of a layer ------------------------------------------------------- */



typedef struct variant {
    const char *name;
    sc_moe_desc shape; /* E, k, H, I, routing and expert fields */
    bool views, sel_bias, router_bias, biases, gate;
} variant;

static const variant variants[] = {
    {"v1 softmax", {.experts = 8, .top_k = 2, .hidden = 256, .intermediate = 128,
                    .renormalize = true}, false, false, false, false, false},
    {"deepseek-v3 like (groups, scaling, shared)",
     {.experts = 64, .top_k = 8, .hidden = 256, .intermediate = 128, .scoring = SC_MOE_SIGMOID,
      .renormalize = true, .n_group = 8, .topk_group = 4, .routed_scaling = 2.5f,
      .shared_intermediate = 128},
     true, true, false, false, false},
    {"kimi-k2 like (384 experts, one group)",
     {.experts = 384, .top_k = 8, .hidden = 128, .intermediate = 64, .scoring = SC_MOE_SIGMOID,
      .renormalize = true, .n_group = 1, .topk_group = 1, .routed_scaling = 2.827f,
      .shared_intermediate = 64},
     true, true, false, false, false},
    {"qwen3-next like (512 experts, top-10, gated shared)",
     {.experts = 512, .top_k = 10, .hidden = 128, .intermediate = 64, .renormalize = true,
      .shared_intermediate = 64},
     true, false, false, false, true},
    {"gpt-oss like (interleaved, biases, clamped SwiGLU)",
     {.experts = 32, .top_k = 4, .hidden = 192, .intermediate = 192, .renormalize = true,
      .activation = SC_MOE_SWIGLU_CLAMP, .w13_layout = SC_MOE_W13_INTERLEAVED},
     true, false, true, true, false},
    {"geglu, odd sizes, 3 shared chunks interleaved",
     {.experts = 6, .top_k = 16 > 6 ? 3 : 3, .hidden = 200, .intermediate = 72,
      .activation = SC_MOE_GELU_TANH, .w13_layout = SC_MOE_W13_INTERLEAVED,
      .shared_intermediate = 216},
     false, false, true, true, true},
    {"2 shared chunks stacked, explicit clamp constants",
     {.experts = 16, .top_k = 16, .hidden = 128, .intermediate = 64,
      .activation = SC_MOE_SWIGLU_CLAMP, .swiglu_alpha = 1.5f, .swiglu_limit = 5.f,
      .shared_intermediate = 128},
     true, false, false, true, true},
};

static void test_variants(void)
{
    const sc_moe_backend backends[] = {SC_MOE_BACKEND_MMA, SC_MOE_BACKEND_SM90};
    const uint64_t tokens[] = {1, 7, 16, 17, 200};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        for (int b = 0; b < 2; b++) {
            const variant *vr = &variants[v];
            sc_moe_desc d = vr->shape;
            d.backend = backends[b];
            d.max_tokens = 16;
            weights w;
            make_weights(&d, &w, vr->views, vr->sel_bias, vr->router_bias, vr->biases,
                         vr->gate);
            sc_moe layer;
            sc_status s = sc_moe_create(ctx, &d, &layer);
            if (s != SC_OK) {
                fprintf(stderr, "%s (%s): %s\n", vr->name, b ? "sm90" : "mma", sc_last_error());
                test_failures++;
                free_weights(&w);
                continue;
            }
            for (size_t t = 0; t < sizeof tokens / sizeof tokens[0]; t++)
                td_moe_exercise(ctx, layer, &d, tokens[t], vr->name);
            uint64_t bytes = 0;
            CHECK_OK(sc_moe_workspace_bytes(layer, &bytes));
            CHECK(bytes > 0);
            CHECK_OK(sc_moe_destroy(layer));
            free_weights(&w);
        }
    }
}

/* ---- the checks ------------------------------------------------------------------------- */

/* A valid DeepSeek-V3-like desc over w. */
static sc_moe_desc base_desc(weights *w)
{
    sc_moe_desc d = {.experts = 16, .top_k = 4, .hidden = 128, .intermediate = 64,
                     .scoring = SC_MOE_SIGMOID, .renormalize = true, .n_group = 4,
                     .topk_group = 2, .routed_scaling = 2.5f, .shared_intermediate = 128};
    make_weights(&d, w, true, true, true, true, true);
    return d;
}

/* The forward's checks of the caller's routing and the routing call's views. */
static void test_forward_checks(void)
{
    weights w;
    sc_moe_desc d = base_desc(&w);
    sc_moe layer;
    REQUIRE(sc_moe_create(ctx, &d, &layer) == SC_OK);
    const uint64_t T = 5, H = 128, k = 4;
    sc_buffer x = td_moe_buf(ctx, SC_BF16, T * H), out = td_moe_buf(ctx, SC_BF16, T * H);
    sc_buffer ids = td_moe_buf(ctx, SC_I32, T * k), wts = td_moe_buf(ctx, SC_F32, T * k);
    sc_buffer f = td_moe_buf(ctx, SC_F32, T * k);
    sc_buffer small = td_moe_buf(ctx, SC_I32, T * k - 1);
    const sc_view xv = sc_view_of(x), ov = sc_view_of(out);
    CHECK_FAIL_SAYS(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                              &(sc_moe_forward_desc){.routing_ids = sc_view_of(ids)}),
               SC_ERR_INVALID_ARGUMENT, "routing_ids and opts->routing_weights go together");
    CHECK_FAIL_SAYS(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                              &(sc_moe_forward_desc){.routing_weights = sc_view_of(wts)}),
               SC_ERR_INVALID_ARGUMENT, "routing_weights is given");
    CHECK_FAIL_SAYS(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                              &(sc_moe_forward_desc){.routing_ids = sc_view_of(f),
                                                     .routing_weights = sc_view_of(wts)}),
               SC_ERR_TYPE_MISMATCH, "opts->routing_ids");
    CHECK_FAIL_SAYS(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                              &(sc_moe_forward_desc){.routing_ids = sc_view_of(ids),
                                                     .routing_weights = sc_view_of(ids)}),
               SC_ERR_TYPE_MISMATCH, "opts->routing_weights");
    CHECK_FAIL_SAYS(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                              &(sc_moe_forward_desc){.routing_ids = sc_view_of(small),
                                                     .routing_weights = sc_view_of(wts)}),
               SC_ERR_OUT_OF_BOUNDS, "opts->routing_ids has 19 elements; T x k = 5 x 4 = 20");
    CHECK_FAIL_SAYS(sc_moe_route(SC_DEFAULT_STREAM, layer, xv, sc_view_of(small), sc_view_of(wts)),
               SC_ERR_OUT_OF_BOUNDS, "ids has 19 elements");
    CHECK_FAIL_SAYS(sc_moe_route(SC_DEFAULT_STREAM, layer, xv, sc_view_of(ids), sc_view_of(ids)),
               SC_ERR_TYPE_MISMATCH, "weights (buffer");
    CHECK_FAIL_SAYS(sc_moe_route(SC_DEFAULT_STREAM, layer, sc_view_of(wts), sc_view_of(ids),
                            sc_view_of(wts)),
               SC_ERR_TYPE_MISMATCH, "x is f32");
    sc_moe gone;
    REQUIRE(sc_moe_create(ctx, &d, &gone) == SC_OK);
    CHECK_OK(sc_moe_destroy(gone));
    CHECK_FAIL_SAYS(sc_moe_routing_check(SC_DEFAULT_STREAM, gone), SC_ERR_STALE_HANDLE,
               "sc_moe_routing_check");
    /* The outputs of the routing used may be the caller's views themselves, not overlap
     * them otherwise. */
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                            &(sc_moe_forward_desc){.routing_ids = sc_view_of(ids),
                                                   .routing_weights = sc_view_of(wts),
                                                   .expert_ids = sc_view_of(ids),
                                                   .expert_weights = sc_view_of(wts)}));
    CHECK_FAIL_SAYS(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                              &(sc_moe_forward_desc){
                                  .routing_ids = (sc_view){ids, 0, T * k},
                                  .routing_weights = sc_view_of(wts),
                                  .expert_ids = (sc_view){small, 0, T * k - 1},
                                  .expert_weights = (sc_view){f, 0, T * k}}),
               SC_ERR_OUT_OF_BOUNDS, "opts->expert_ids");
    sc_buffer two = td_moe_buf(ctx, SC_I32, 2 * T * k);
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, (sc_view){two, 0, T * k}, sc_view_of(ids)));
    CHECK_FAIL_SAYS(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                              &(sc_moe_forward_desc){
                                  .routing_ids = (sc_view){two, 0, T * k},
                                  .routing_weights = sc_view_of(wts),
                                  .expert_ids = (sc_view){two, 4, T * k}}),
               SC_ERR_INVALID_ARGUMENT, "opts->expert_ids overlaps opts->routing_ids");
    CHECK_OK(sc_buffer_destroy(two));
    /* No bad id was met (none can be: no kernel runs here). */
    CHECK_OK(sc_moe_routing_check(SC_DEFAULT_STREAM, layer));
    /* Nothing was enqueued by the refusals: the layer still works. */
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, xv, ov,
                            &(sc_moe_forward_desc){.routing_ids = sc_view_of(ids),
                                                   .routing_weights = sc_view_of(wts),
                                                   .check_routing = true}));
    const sc_buffer all[] = {x, out, ids, wts, f, small};
    for (int i = 0; i < 6; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
    CHECK_OK(sc_moe_destroy(layer));
    free_weights(&w);
}

/* A destroyed weight: the next forward says which (the layer keeps the views' handles). */
static void test_stale_view(void)
{
    weights w;
    sc_moe_desc d = base_desc(&w);
    sc_moe layer;
    REQUIRE(sc_moe_create(ctx, &d, &layer) == SC_OK);
    sc_buffer x = td_moe_buf(ctx, SC_BF16, 128), out = td_moe_buf(ctx, SC_BF16, 128);
    CHECK_OK(sc_buffer_destroy(w.f32));
    CHECK_FAIL_SAYS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(x), sc_view_of(out), NULL),
               SC_ERR_STALE_HANDLE, "desc->selection_bias");
    /* the weight named once, at the end of the message */
    {
        const char *msg = sc_last_error(), *at = strstr(msg, " (the layer's weight ");
        CHECK(at && strcmp(at, " (the layer's weight desc->selection_bias) (in sc_moe_forward)") == 0);
        CHECK(at && !strstr(at + 1, " (the layer's weight "));
    }
    /* and a destroyed buffer given to create. */
    sc_moe other;
    d.w13_view.buffer = x;
    CHECK_OK(sc_buffer_destroy(x));
    CHECK_FAIL_SAYS(sc_moe_create(ctx, &d, &other), SC_ERR_STALE_HANDLE, "desc->w13_view");
    CHECK_OK(sc_moe_destroy(layer));
    CHECK_OK(sc_buffer_destroy(out));
    CHECK_OK(sc_buffer_destroy(w.bf));
}

int main(void)
{
    fake_attach();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    /* The kernels are compiled with NVRTC: without it, nothing here can run. */
    {
        weights w;
        sc_moe_desc d = base_desc(&w);
        sc_moe layer;
        sc_status s = sc_moe_create(ctx, &d, &layer);
        free_weights(&w);
        if (s == SC_ERR_NO_COMPILER) {
            printf("test_td_moe: skipped: %s\n", sc_last_error());
            sc_context_destroy(ctx);
            return 77;
        }
        REQUIRE(s == SC_OK);
        CHECK_OK(sc_moe_destroy(layer));
    }
    const int misuse0 = fake.misuse_count();
    test_variants();
    test_forward_checks();
    test_stale_view();
    CHECK(fake.misuse_count() == misuse0);
    if (fake.misuse_count() != misuse0)
        fprintf(stderr, "last misuse: %s\n", fake.last_misuse());
    CHECK_OK(sc_context_destroy(ctx));
    CHECK(fake.live_device_allocations() == 0);
    return test_result("test_td_moe");
}
