/* The fp8 MoE layer's host side against the test device: layers with e4m3 experts and
 * their block scales (DeepSeek-V3-like with a shared expert, gpt-oss-like interleaved with
 * biases, Qwen3-Next-like with a gated shared expert; whole buffers and views at 16-byte
 * offsets) are created, and forwards of every routing path are issued at several token
 * counts: each launch (x gathered and quantized, the e4m3 GEMMs with their scale arguments)
 * passes the library's checks of argument count and sizes against the kernels' real
 * parameters (read from the PTX) and each tensor map the test device's checks of its
 * geometry. Then every refusal of an fp8 desc, with its status and message.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: no kernel runs here, so nothing here says
 * anything about the layer's results (tests/gpu/test_gpu_moe_fp8.c compares them with a
 * CPU reference on a GPU). */
#include <stdint.h>

#include "../test.h"
#include "td_control.h"
#include "safecuda/moe.h"
#include "td_moe.h"

static sc_context ctx;


/* The weights of an fp8 layer: one e4m3 allocation, one bf16 (router, gate), one f32
 * (scales, biases); each weight a view at an odd multiple of 16 bytes (views) or its own
 * buffer. */
typedef struct weights {
    sc_buffer f8, bf, f32;
    sc_buffer own[4]; /* w13, w2, w13_scale, w2_scale when not views */
} weights;

static uint64_t place(uint64_t *cursor, uint64_t es, uint64_t count)
{
    uint64_t off = (*cursor + 15) / 16 * 16;
    if ((off / 16) % 2 == 0)
        off += 16;
    *cursor = off + count * es + 32;
    return off / es;
}

static void make_weights(sc_moe_desc *d, weights *w, bool views, bool biases, bool gate)
{
    memset(w, 0, sizeof *w);
    const uint64_t E = (uint64_t)d->experts, H = (uint64_t)d->hidden;
    const uint64_t I = (uint64_t)d->intermediate, Is = (uint64_t)d->shared_intermediate;
    const uint64_t Hb = H / 128, Ib = I / 128, Isb = Is / 128;
    uint64_t c8 = 0, cb = 0, c32 = 0;
    const uint64_t o13 = place(&c8, 1, E * 2 * I * H), o2 = place(&c8, 1, E * H * I);
    const uint64_t os13 = place(&c8, 1, 2 * Is * H), os2 = place(&c8, 1, H * Is);
    const uint64_t orouter = place(&cb, 2, E * H), ogate = place(&cb, 2, H);
    const uint64_t p13 = place(&c32, 4, E * 2 * Ib * Hb), p2 = place(&c32, 4, E * Hb * Ib);
    const uint64_t ps13 = place(&c32, 4, 2 * Isb * Hb), ps2 = place(&c32, 4, Hb * Isb);
    const uint64_t pb13 = place(&c32, 4, E * 2 * I), pb2 = place(&c32, 4, E * H);
    w->f8 = td_moe_buf(ctx, SC_F8E4M3, c8);
    w->bf = td_moe_buf(ctx, SC_BF16, cb / 2 + 1);
    w->f32 = td_moe_buf(ctx, SC_F32, c32 / 4 + 1);
    d->expert_dtype = SC_F8E4M3;
    d->router_view = (sc_view){w->bf, orouter, E * H};
    if (views) {
        d->w13_view = (sc_view){w->f8, o13, E * 2 * I * H};
        d->w2_view = (sc_view){w->f8, o2, E * H * I};
        d->w13_scale = (sc_view){w->f32, p13, E * 2 * Ib * Hb};
        d->w2_scale = (sc_view){w->f32, p2, E * Hb * Ib};
    } else {
        w->own[0] = td_moe_buf(ctx, SC_F8E4M3, E * 2 * I * H);
        w->own[1] = td_moe_buf(ctx, SC_F8E4M3, E * H * I);
        /* (a layer of a size fp8 refuses has no whole blocks: one scale stands in) */
        w->own[2] = td_moe_buf(ctx, SC_F32, Ib && Hb ? E * 2 * Ib * Hb : 1);
        w->own[3] = td_moe_buf(ctx, SC_F32, Ib && Hb ? E * Hb * Ib : 1);
        d->w13 = w->own[0];
        d->w2 = w->own[1];
        d->w13_scale = sc_view_of(w->own[2]);
        d->w2_scale = sc_view_of(w->own[3]);
    }
    if (Is) {
        d->shared_w13 = (sc_view){w->f8, os13, 2 * Is * H};
        d->shared_w2 = (sc_view){w->f8, os2, H * Is};
        d->shared_w13_scale = (sc_view){w->f32, ps13, 2 * Isb * Hb};
        d->shared_w2_scale = (sc_view){w->f32, ps2, Hb * Isb};
    }
    if (biases) {
        d->w13_bias = (sc_view){w->f32, pb13, E * 2 * I};
        d->w2_bias = (sc_view){w->f32, pb2, E * H};
    }
    if (gate)
        d->shared_gate = (sc_view){w->bf, ogate, H};
}

static void free_weights(weights *w)
{
    const sc_buffer all[] = {w->f8, w->bf, w->f32, w->own[0], w->own[1], w->own[2], w->own[3]};
    for (int i = 0; i < 7; i++)
        if (all[i].id)
            CHECK_OK(sc_buffer_destroy(all[i]));
}


typedef struct variant {
    const char *name;
    sc_moe_desc shape;
    bool views, biases, gate;
} variant;

static const variant variants[] = {
    {"deepseek-v3 like (groups, scaling, shared)",
     {.experts = 64, .top_k = 8, .hidden = 256, .intermediate = 128, .scoring = SC_MOE_SIGMOID,
      .renormalize = true, .n_group = 8, .topk_group = 4, .routed_scaling = 2.5f,
      .shared_intermediate = 128},
     true, false, false},
    {"gpt-oss like (interleaved, biases, clamped SwiGLU)",
     {.experts = 32, .top_k = 4, .hidden = 384, .intermediate = 256, .renormalize = true,
      .activation = SC_MOE_SWIGLU_CLAMP, .w13_layout = SC_MOE_W13_INTERLEAVED},
     false, true, false},
    {"qwen3-next like (512 experts, top-10, gated shared 2I)",
     {.experts = 512, .top_k = 10, .hidden = 128, .intermediate = 128, .renormalize = true,
      .shared_intermediate = 256},
     true, false, true},
};

static void test_variants(void)
{
    const uint64_t tokens[] = {1, 7, 16, 17, 200, 1000};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const variant *vr = &variants[v];
        sc_moe_desc d = vr->shape;
        d.max_tokens = 16;
        weights w;
        make_weights(&d, &w, vr->views, vr->biases, vr->gate);
        sc_moe layer;
        sc_status s = sc_moe_create(ctx, &d, &layer);
        if (s != SC_OK) {
            fprintf(stderr, "%s: %s\n", vr->name, sc_last_error());
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

/* desc refused with status want, the message naming sc_moe_create and needle. */
#define REFUSED(desc_, want_, needle_)                                  \
    do {                                                                \
        sc_moe l_ = {.id = 77};                                         \
        sc_clear_error();                                               \
        CHECK_STATUS(sc_moe_create(ctx, &(desc_), &l_), (want_));       \
        CHECK_MSG("sc_moe_create");                                     \
        CHECK_MSG(needle_);                                             \
        CHECK(l_.id == 0);                                              \
    } while (0)

static void test_refusals(void)
{
    const sc_moe_desc shape = {.experts = 8, .top_k = 2, .hidden = 256, .intermediate = 128,
                               .renormalize = true, .shared_intermediate = 128};
    weights w;
    sc_moe_desc good = shape;
    make_weights(&good, &w, true, true, true);
    sc_moe layer;
    CHECK_OK(sc_moe_create(ctx, &good, &layer));
    CHECK_OK(sc_moe_destroy(layer));

    sc_moe_desc d = good;
    d.expert_dtype = SC_F16;
    REFUSED(d, SC_ERR_NOT_SUPPORTED, "desc->expert_dtype = f16");
    d = good;
    d.expert_dtype = SC_F8E5M2;
    REFUSED(d, SC_ERR_NOT_SUPPORTED, "bf16 or f8e4m3");
    d = good;
    d.expert_dtype = (sc_dtype)999;
    REFUSED(d, SC_ERR_NOT_SUPPORTED, "desc->expert_dtype = invalid (999)");
    d = good;
    d.backend = SC_MOE_BACKEND_MMA;
    REFUSED(d, SC_ERR_NOT_SUPPORTED, "fp8 experts run on the SM90 backend only");

    /* sizes: multiples of 128 (a layer of H = 192 / I = 64 and the right counts) */
    weights w2;
    sc_moe_desc odd = shape;
    odd.hidden = 192;
    odd.intermediate = 128;
    odd.shared_intermediate = 0;
    make_weights(&odd, &w2, false, false, false);
    REFUSED(odd, SC_ERR_INVALID_ARGUMENT, "desc->hidden = 192: fp8 experts need a multiple of 128");
    free_weights(&w2);
    odd = shape;
    odd.intermediate = 64;
    odd.shared_intermediate = 0;
    make_weights(&odd, &w2, false, false, false);
    REFUSED(odd, SC_ERR_INVALID_ARGUMENT,
            "desc->intermediate = 64: fp8 experts need a multiple of 128");
    free_weights(&w2);

    /* scales: missing, wrong count, wrong dtype */
    d = good;
    d.w13_scale = (sc_view){{0}, 0, 0};
    REFUSED(d, SC_ERR_INVALID_ARGUMENT, "desc->w13_scale is missing");
    d = good;
    d.w2_scale.count -= 1;
    REFUSED(d, SC_ERR_INVALID_ARGUMENT, "desc->w2_scale");
    CHECK_MSG("[E=8, H/128=2, I/128=1] needs 16");
    d = good;
    d.shared_w13_scale = (sc_view){{0}, 0, 0};
    REFUSED(d, SC_ERR_INVALID_ARGUMENT, "desc->shared_w13_scale is missing");
    d = good;
    d.shared_w2_scale.count += 1;
    REFUSED(d, SC_ERR_INVALID_ARGUMENT, "[H/128=2, I_s/128=1]");
    sc_buffer bf = td_moe_buf(ctx, SC_BF16, 16);
    d = good;
    d.w2_scale = sc_view_of(bf);
    REFUSED(d, SC_ERR_TYPE_MISMATCH, "desc->w2_scale");
    CHECK_MSG("is bf16; the layer needs f32");
    /* the experts' weights of another dtype */
    sc_buffer bw13 = td_moe_buf(ctx, SC_BF16, 8 * 2 * 128 * 256);
    d = good;
    d.w13_view = (sc_view){{0}, 0, 0};
    d.w13 = bw13;
    REFUSED(d, SC_ERR_TYPE_MISMATCH, "desc->w13");
    CHECK_MSG("is bf16; the layer needs f8e4m3");
    /* bf16 experts given scales */
    d = good;
    d.expert_dtype = SC_BF16;
    REFUSED(d, SC_ERR_INVALID_ARGUMENT, "is given but the experts are bf16");
    /* shared scales without a shared expert */
    d = good;
    d.shared_intermediate = 0;
    d.shared_w13 = d.shared_w2 = d.shared_gate = (sc_view){{0}, 0, 0};
    REFUSED(d, SC_ERR_INVALID_ARGUMENT, "shared_w13_scale / shared_w2_scale are given but "
                                        "shared_intermediate = 0");
    CHECK_OK(sc_buffer_destroy(bf));
    CHECK_OK(sc_buffer_destroy(bw13));
    free_weights(&w);
}

/* A destroyed buffer of block scales: the next forward names the scale. */
static void test_stale_scale(void)
{
    sc_moe_desc d = variants[0].shape; /* views; the f32 buffer holds the scales alone */
    weights w;
    make_weights(&d, &w, true, false, false);
    sc_moe layer;
    REQUIRE(sc_moe_create(ctx, &d, &layer) == SC_OK);
    sc_buffer x = td_moe_buf(ctx, SC_BF16, 256), out = td_moe_buf(ctx, SC_BF16, 256);
    CHECK_OK(sc_buffer_destroy(w.f32));
    w.f32 = (sc_buffer){0};
    sc_clear_error();
    CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(x), sc_view_of(out), NULL),
                 SC_ERR_STALE_HANDLE);
    const char *at = strstr(sc_last_error(), " (the layer's weight ");
    CHECK(at && strcmp(at, " (the layer's weight desc->w13_scale) (in sc_moe_forward)") == 0);
    CHECK_OK(sc_moe_destroy(layer));
    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_buffer_destroy(out));
    free_weights(&w);
}

int main(void)
{
    fake_attach();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    /* The kernels are compiled with NVRTC: without it, nothing here can run. */
    {
        weights w;
        sc_moe_desc d = variants[0].shape;
        make_weights(&d, &w, true, false, false);
        sc_moe layer;
        sc_status s = sc_moe_create(ctx, &d, &layer);
        free_weights(&w);
        if (s == SC_ERR_NO_COMPILER) {
            printf("test_td_moe_fp8: skipped: %s\n", sc_last_error());
            sc_context_destroy(ctx);
            return 77;
        }
        if (s != SC_OK)
            fprintf(stderr, "%s\n", sc_last_error());
        REQUIRE(s == SC_OK);
        CHECK_OK(sc_moe_destroy(layer));
    }
    const int misuse0 = fake.misuse_count();
    test_variants();
    test_refusals();
    test_stale_scale();
    CHECK(fake.misuse_count() == misuse0);
    if (fake.misuse_count() != misuse0)
        fprintf(stderr, "last misuse: %s\n", fake.last_misuse());
    CHECK_OK(sc_context_destroy(ctx));
    CHECK(fake.live_device_allocations() == 0);
    return test_result("test_td_moe_fp8");
}
