/* sc_moe_create's checks of the MoE layer's fields (include/safecuda/moe.h): every bad
 * desc is refused with its status and a message naming sc_moe_create and the field, and
 * no layer is made. Shared by tests/gpu/test_gpu_moe_v2.c and tests/testdevice/
 * test_td_moe_desc.c: the refusals come before any kernel is loaded, so the test device
 * answers them too. With can_create (a real GPU) the valid descs around them must create:
 * the checks refuse what they should and nothing more. */
#ifndef SAFECUDA_TEST_MOE_DESC_CHECKS_H
#define SAFECUDA_TEST_MOE_DESC_CHECKS_H

#include <math.h>

#include "safecuda/moe.h"
#include "test.h"

/* desc_ refused with status want_, the message naming sc_moe_create and needle_. */
#define MOE_REFUSED(ctx_, desc_, want_, needle_)                \
    do {                                                        \
        sc_moe l_ = {.id = 77};                                 \
        CHECK_STATUS(sc_moe_create((ctx_), &(desc_), &l_), (want_)); \
        CHECK_MSG("sc_moe_create");                             \
        CHECK_MSG(needle_);                                     \
        CHECK(l_.id == 0);                                      \
        if (l_.id)                                              \
            sc_moe_destroy(l_);                                 \
    } while (0)

/* desc_ creates (only where kernels can be loaded). */
#define MOE_CREATES(ctx_, desc_, can_)                          \
    do {                                                        \
        if (can_) {                                             \
            sc_moe l_ = {0};                                    \
            CHECK_OK(sc_moe_create((ctx_), &(desc_), &l_));     \
            if (l_.id)                                          \
                CHECK_OK(sc_moe_destroy(l_));                   \
        }                                                       \
    } while (0)

static sc_buffer moe_checks_buffer_(sc_context ctx, sc_dtype dtype, uint64_t count,
                                    const char *label)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                    .label = label, .zero = true},
                             &b) == SC_OK);
    return b;
}

static sc_view moe_checks_view_(sc_buffer b, uint64_t offset, uint64_t count)
{
    sc_view v;
    REQUIRE(sc_buffer_view(b, offset, count, &v) == SC_OK);
    return v;
}

static void moe_desc_checks(sc_context ctx, bool can_create)
{
    enum { E = 8, H = 64, I = 32, S = 2 };
    const sc_view none = {{0}, 0, 0};
    sc_buffer r = moe_checks_buffer_(ctx, SC_BF16, E * H, "router");
    sc_buffer a = moe_checks_buffer_(ctx, SC_BF16, E * 2 * I * H, "w13");
    sc_buffer b = moe_checks_buffer_(ctx, SC_BF16, E * H * I, "w2");
    sc_buffer sb = moe_checks_buffer_(ctx, SC_F32, E, "selection-bias");
    sc_buffer rb = moe_checks_buffer_(ctx, SC_F32, E, "router-bias");
    sc_buffer b13 = moe_checks_buffer_(ctx, SC_F32, E * 2 * I, "w13-bias");
    sc_buffer b2 = moe_checks_buffer_(ctx, SC_F32, E * H, "w2-bias");
    sc_buffer sw13 = moe_checks_buffer_(ctx, SC_BF16, 2 * S * I * H, "shared-w13");
    sc_buffer sw2 = moe_checks_buffer_(ctx, SC_BF16, H * S * I, "shared-w2");
    sc_buffer gate = moe_checks_buffer_(ctx, SC_BF16, H, "shared-gate");
    /* Room for views at any offset: one bf16 and one f32 allocation. */
    sc_buffer big = moe_checks_buffer_(ctx, SC_BF16, E * 2 * I * H + 64, "ckpt-bf16");
    sc_buffer big32 = moe_checks_buffer_(ctx, SC_F32, 2 * S * I * H + 64, "ckpt-f32");
    /* E = 32 (for top_k = 17: more than 16, not more than E). */
    sc_buffer r32 = moe_checks_buffer_(ctx, SC_BF16, 32 * H, "router32");
    sc_buffer a32 = moe_checks_buffer_(ctx, SC_BF16, 32 * 2 * I * H, "w13-32");
    sc_buffer b32 = moe_checks_buffer_(ctx, SC_BF16, 32 * H * I, "w2-32");

    const sc_moe_desc plain = {.experts = E, .top_k = 2, .hidden = H, .intermediate = I,
                               .router = r, .w13 = a, .w2 = b, .label = "desc-checks"};
    /* Every field in use, valid: DeepSeek-V3 routing, gpt-oss experts, a gated shared
     * expert of 2I. */
    const sc_moe_desc full = {.experts = E, .top_k = 2, .hidden = H, .intermediate = I,
                              .scoring = SC_MOE_SIGMOID, .renormalize = true, .router = r,
                              .w13 = a, .w2 = b, .selection_bias = sb, .label = "desc-checks",
                              .n_group = 4, .topk_group = 2, .routed_scaling = 2.5f,
                              .activation = SC_MOE_SWIGLU_CLAMP, .swiglu_alpha = 1.702f,
                              .swiglu_limit = 7.0f, .w13_layout = SC_MOE_W13_INTERLEAVED,
                              .router_bias = sc_view_of(rb), .w13_bias = sc_view_of(b13),
                              .w2_bias = sc_view_of(b2), .shared_intermediate = S * I,
                              .shared_w13 = sc_view_of(sw13), .shared_w2 = sc_view_of(sw2),
                              .shared_gate = sc_view_of(gate)};
    /* The same weights as views, 16-byte aligned (offset 8 elements), exact counts. */
    sc_moe_desc views = full;
    views.router = views.w13 = views.w2 = views.selection_bias = (sc_buffer){0};
    views.router_view = moe_checks_view_(big, 8, E * H);
    views.w13_view = moe_checks_view_(big, 8, E * 2 * I * H);
    views.w2_view = moe_checks_view_(big, 8, E * H * I);
    views.selection_bias_view = moe_checks_view_(big32, 4, E);
    MOE_CREATES(ctx, plain, can_create);
    MOE_CREATES(ctx, full, can_create);
    MOE_CREATES(ctx, views, can_create);
    sc_moe_desc d;

    /* ---- routing ---- */
    d = plain, d.n_group = 3, d.topk_group = 1; /* 3 does not divide 8 */
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->n_group");
    d = plain, d.n_group = 8, d.topk_group = 1; /* groups of one expert */
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->n_group");
    d = plain, d.n_group = 4, d.topk_group = 0;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->topk_group");
    d = plain, d.n_group = 4, d.topk_group = 5;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->topk_group");
    d = plain, d.n_group = 4, d.topk_group = 1, d.top_k = 3; /* 3 > 1 group of 2 */
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "topk_group");
    CHECK_MSG("top_k");
    d = plain, d.n_group = 4, d.topk_group = 1, d.top_k = 2; /* exactly one group of 2 */
    MOE_CREATES(ctx, d, can_create);
    d = plain, d.n_group = 1, d.topk_group = 1; /* Kimi K2: one group, no restriction */
    MOE_CREATES(ctx, d, can_create);
    d = plain, d.routed_scaling = -1.0f;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->routed_scaling");
    d = plain, d.routed_scaling = NAN;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->routed_scaling");
    d = plain, d.experts = SC_MOE_MAX_EXPERTS + 1;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "experts = 513");
    d = plain, d.experts = 32, d.router = r32, d.w13 = a32, d.w2 = b32, d.top_k = 17;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "top_k = 17");
    d.top_k = 16;
    MOE_CREATES(ctx, d, can_create);

    /* ---- activations and layout ---- */
    d = plain, d.activation = (sc_moe_activation)3;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->activation");
    d = plain, d.swiglu_alpha = 1.702f; /* SiLU takes no constants */
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->swiglu_alpha");
    d = plain, d.swiglu_limit = 7.0f;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->swiglu_limit");
    d = plain, d.activation = SC_MOE_GELU_TANH, d.swiglu_limit = 7.0f;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->swiglu_limit");
    d = full, d.swiglu_limit = -1.0f;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->swiglu_limit");
    d = full, d.swiglu_limit = NAN;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->swiglu_limit");
    d = full, d.swiglu_alpha = -1.0f;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->swiglu_alpha");
    d = full, d.swiglu_alpha = 0.0f, d.swiglu_limit = 0.0f; /* gpt-oss's constants */
    MOE_CREATES(ctx, d, can_create);
    d = plain, d.activation = SC_MOE_GELU_TANH;
    MOE_CREATES(ctx, d, can_create);
    d = plain, d.w13_layout = (sc_moe_w13_layout)2;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w13_layout");

    /* ---- weights: a buffer or a view, not both, not neither ---- */
    d = views, d.router = r;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->router");
    d = views, d.w13 = a;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w13");
    d = views, d.w2 = b;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w2");
    d = views, d.selection_bias = sb;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->selection_bias");
    d = plain, d.router = (sc_buffer){0};
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->router");
    d = plain, d.w13 = (sc_buffer){0};
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w13");
    d = plain, d.w2 = (sc_buffer){0};
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w2");
    /* Views not 16-byte aligned. */
    d = views, d.router_view = moe_checks_view_(big, 4, E * H);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->router_view");
    d = views, d.w13_view = moe_checks_view_(big, 12, E * 2 * I * H);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w13_view");
    d = views, d.w2_view = moe_checks_view_(big, 1, E * H * I);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w2_view");
    d = views, d.selection_bias_view = moe_checks_view_(big32, 1, E);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->selection_bias_view");
    d = full, d.shared_w13 = moe_checks_view_(big, 4, 2 * S * I * H);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_w13");
    /* Views of another element count. */
    d = views, d.router_view = moe_checks_view_(big, 8, E * H - 8);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->router_view");
    d = views, d.w13_view = moe_checks_view_(big, 8, E * 2 * I * H - 64);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w13_view");
    d = views, d.w2_view = moe_checks_view_(big, 8, E * H * I + 8);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w2_view");
    d = views, d.selection_bias_view = moe_checks_view_(big32, 4, E + 4);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->selection_bias_view");
    /* Views of another dtype. */
    d = views, d.router_view = moe_checks_view_(big32, 0, E * H);
    MOE_REFUSED(ctx, d, SC_ERR_TYPE_MISMATCH, "desc->router_view");
    d = views, d.selection_bias_view = moe_checks_view_(big, 0, E);
    MOE_REFUSED(ctx, d, SC_ERR_TYPE_MISMATCH, "desc->selection_bias_view");

    /* ---- biases: f32, exact counts ---- */
    d = full, d.router_bias = moe_checks_view_(big, 0, E);
    MOE_REFUSED(ctx, d, SC_ERR_TYPE_MISMATCH, "desc->router_bias");
    d = full, d.w13_bias = moe_checks_view_(big, 0, E * 2 * I);
    MOE_REFUSED(ctx, d, SC_ERR_TYPE_MISMATCH, "desc->w13_bias");
    d = full, d.w2_bias = moe_checks_view_(big, 0, E * H);
    MOE_REFUSED(ctx, d, SC_ERR_TYPE_MISMATCH, "desc->w2_bias");
    d = full, d.router_bias = moe_checks_view_(big32, 0, E - 1);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->router_bias");
    d = full, d.w13_bias = moe_checks_view_(big32, 0, E * I); /* [E, I], not [E, 2I] */
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w13_bias");
    d = full, d.w2_bias = moe_checks_view_(big32, 0, E * H + 4);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->w2_bias");

    /* ---- the shared expert ---- */
    d = full, d.shared_intermediate = I + 8; /* not a multiple of I */
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_intermediate");
    d = full, d.shared_intermediate = (SC_MOE_MAX_SHARED + 1) * I;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_intermediate");
    d = full, d.shared_intermediate = -I;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_intermediate");
    d = full, d.shared_w13 = none;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_w13");
    d = full, d.shared_w2 = none;
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_w2");
    d = full, d.shared_w13 = moe_checks_view_(big, 0, 2 * I * H); /* sized for I_s = I */
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_w13");
    d = full, d.shared_w2 = moe_checks_view_(big, 0, H * I);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_w2");
    d = full, d.shared_w13 = moe_checks_view_(big32, 0, 2 * S * I * H);
    MOE_REFUSED(ctx, d, SC_ERR_TYPE_MISMATCH, "desc->shared_w13");
    d = full, d.shared_gate = moe_checks_view_(big, 0, H - 8);
    MOE_REFUSED(ctx, d, SC_ERR_INVALID_ARGUMENT, "desc->shared_gate");
    d = full, d.shared_gate = moe_checks_view_(big32, 0, H);
    MOE_REFUSED(ctx, d, SC_ERR_TYPE_MISMATCH, "desc->shared_gate");
    d = full, d.shared_gate = none; /* ungated (DeepSeek-V3, Kimi K2) */
    MOE_CREATES(ctx, d, can_create);
    d = full, d.shared_intermediate = I, d.shared_w13 = moe_checks_view_(big, 0, 2 * I * H),
    d.shared_w2 = moe_checks_view_(big, 0, H * I);
    MOE_CREATES(ctx, d, can_create);

    sc_buffer all[] = {r, a, b, sb, rb, b13, b2, sw13, sw2, gate, big, big32, r32, a32, b32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
}

#endif
