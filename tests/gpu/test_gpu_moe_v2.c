/* The MoE layer's full contract (include/safecuda/moe.h) against a CPU reference in double
 * precision that implements every variant: group-limited selection, routed scaling, the
 * router and selection biases, softmax and sigmoid scores, renormalization, a shared expert
 * of one to three chunks of I with and without its sigmoid gate, SiLU, GeLU(tanh) and
 * gpt-oss's clamped SwiGLU, stacked and interleaved W13, the w13 and w2 biases, the
 * caller's routing with padded slots, and out += layer(x). Fresh random data, outputs
 * poisoned first.
 *
 * - Layers shaped like DeepSeek-V3, Kimi K2 (its 384 experts), Qwen3-Next (512 experts,
 *   k = 10), gpt-oss and a GeGLU layer at reduced H and I, and odd sizes (H = 200, I = 72),
 *   at T = 1 and 7 (routing in one launch) and T = 129 and 1000 (routing in steps): the
 *   chosen experts equal the reference's (near-ties detected and reported), the weights
 *   and the output within bf16 tolerances; every forward repeated bitwise; sc_moe_route
 *   gives the forward's ids and weights, and the forward given them as the caller's routing
 *   gives bitwise the forward's output; the same weights as views into one allocation at
 *   odd 16-byte aligned offsets give the same routing and (MMA) bitwise the same output, (SM90,
 *   whose K shift then splits the sums elsewhere) an output within the reference's bounds,
 *   bitwise on repeat; out += layer(x).
 * - The caller's routing: padded slots (tokens with none left), every token to one expert,
 *   experts with no token, T = 1.
 * - Routing ids >= E: refused by a checked forward (the message names token, slot and id)
 *   while the other slots are computed, reported once by sc_moe_routing_check.
 * - The checks of sc_moe_create (tests/moe_desc_checks.h, shared with tests/testdevice/).
 * Both backends on an sm_90 device. SAFECUDA_UNDER_SANITIZER: a few small cases. */
#include <math.h>

#include "../moe_desc_checks.h"
#include "../bf16.h"
#include "../test.h"
#include "safecuda/moe.h"

static bool quick; /* under compute-sanitizer: fewer and smaller cases */
static sc_context the_ctx;
static sc_moe_backend backends[2];
static int n_backends;
static const char *const backend_name[] = {"auto", "mma", "sm90"};

/* v rounded to bf16 as the GPU rounds its fp32 h */
static double round_bf16(double v) { return bf2f(f2bf((float)v)); }

static double uniform(uint64_t *seed) /* [-1, 1) */
{
    return (double)(test_rand(seed) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* ---- the layers under test ----------------------------------------------------------------- */

typedef struct model {
    const char *name;
    int E, k, H, I;
    sc_moe_scoring scoring;
    bool renormalize;
    bool sbias, rbias;      /* selection bias, router bias */
    int n_group, topk_group;
    float scaling;          /* routed_scaling (0: 1) */
    sc_moe_activation act;
    float alpha, limit;     /* swiglu_alpha, swiglu_limit as given (0: gpt-oss's) */
    sc_moe_w13_layout layout;
    bool biases;            /* w13_bias and w2_bias */
    int S;                  /* shared_intermediate / I (0: none) */
    bool gate;              /* the shared expert's sigmoid gate */
    double w13_scale;       /* W13 values ~ U(-1, 1) w13_scale / sqrt(H): g ~ w13_scale / 3 */
    double b2_scale;        /* w2 bias ~ U(-1, 1) b2_scale (about the size of y) */
    bool zero_router;       /* logits all 0: the selection bias alone chooses */
} model;

enum { M_DSV3, M_KIMI, M_QWEN3_NEXT, M_GPT_OSS, M_GPT_OSS_CONST, M_GEGLU, M_ODD, M_ODD_SOFTMAX,
       M_ZERO_ROUTER, M_COUNT };

static const model models[M_COUNT] = {
    [M_DSV3] = {.name = "deepseek-v3-like E=64 k=8, 4 of 8 groups, shared I", .E = 64, .k = 8,
                .H = 512, .I = 128, .scoring = SC_MOE_SIGMOID, .renormalize = true,
                .sbias = true, .n_group = 8, .topk_group = 4, .scaling = 2.5f, .S = 1,
                .w13_scale = 1},
    [M_KIMI] = {.name = "kimi-k2-like E=384 k=8, 1 group, shared I", .E = 384, .k = 8,
                .H = 256, .I = 64, .scoring = SC_MOE_SIGMOID, .renormalize = true,
                .sbias = true, .n_group = 1, .topk_group = 1, .scaling = 2.827f, .S = 1,
                .w13_scale = 1},
    [M_QWEN3_NEXT] = {.name = "qwen3-next-like E=512 k=10, gated shared I", .E = 512,
                      .k = 10, .H = 256, .I = 64, .scoring = SC_MOE_SOFTMAX,
                      .renormalize = true, .S = 1, .gate = true, .w13_scale = 1},
    [M_GPT_OSS] = {.name = "gpt-oss-like E=32 k=4, clamped swiglu (1.702, 7)", .E = 32,
                   .k = 4, .H = 384, .I = 192, .scoring = SC_MOE_SOFTMAX, .renormalize = true,
                   .rbias = true, .act = SC_MOE_SWIGLU_CLAMP,
                   .layout = SC_MOE_W13_INTERLEAVED, .biases = true, .w13_scale = 24,
                   .b2_scale = 5},
    [M_GPT_OSS_CONST] = {.name = "clamped swiglu (1.2, 2) stacked, shared 2I", .E = 32, .k = 4,
                         .H = 256, .I = 128, .scoring = SC_MOE_SOFTMAX, .rbias = true,
                         .act = SC_MOE_SWIGLU_CLAMP, .alpha = 1.2f, .limit = 2.0f,
                         .biases = true, .S = 2, .w13_scale = 6, .b2_scale = 1},
    [M_GEGLU] = {.name = "geglu E=16 k=2, shared 3I", .E = 16, .k = 2, .H = 256, .I = 96,
                 .scoring = SC_MOE_SOFTMAX, .act = SC_MOE_GELU_TANH, .S = 3, .w13_scale = 3},
    [M_ODD] = {.name = "odd H=200 I=72 E=40 k=3, 2 of 4 groups, gated shared 2I", .E = 40,
               .k = 3, .H = 200, .I = 72, .scoring = SC_MOE_SIGMOID, .renormalize = true,
               .sbias = true, .n_group = 4, .topk_group = 2, .scaling = 1.5f,
               .layout = SC_MOE_W13_INTERLEAVED, .biases = true, .S = 2, .gate = true,
               .w13_scale = 1, .b2_scale = 0.02},
    [M_ODD_SOFTMAX] = {.name = "odd H=200 I=72 E=24 k=5 softmax, 2 of 3 groups, geglu",
                       .E = 24, .k = 5, .H = 200, .I = 72, .scoring = SC_MOE_SOFTMAX,
                       .renormalize = true, .rbias = true, .n_group = 3, .topk_group = 2,
                       .act = SC_MOE_GELU_TANH, .biases = true, .w13_scale = 3,
                       .b2_scale = 0.1},
    [M_ZERO_ROUTER] = {.name = "logits 0: 2 of 8 groups by the selection bias", .E = 64,
                       .k = 8, .H = 128, .I = 64, .scoring = SC_MOE_SIGMOID,
                       .renormalize = true, .sbias = true, .n_group = 8, .topk_group = 2,
                       .scaling = 2.0f, .w13_scale = 1, .zero_router = true},
};

/* ---- weights ----------------------------------------------------------------------------
 * Expert weights come from one random block of NB values on the device, copied into each
 * expert at an expert-specific offset (the shared expert reads as expert E): cheap to build
 * for 512 experts, and the reference reads the same values from the host copy of the
 * block, kept as floats with NB_EXT values repeated past its end (no wrap in the loops). */

#define NB ((1u << 21) + 17u)
#define NB_EXT (1u << 18) /* at least the largest matrix read from the block */

static uint64_t w13_offset(int e) { return (uint64_t)e * 1000003u % NB; }
static uint64_t w2_offset(int e) { return ((uint64_t)e * 7919u + 12345u) % NB; }

typedef struct weights {
    float *f13, *f2;                 /* the blocks, NB + NB_EXT values */
    uint16_t *router;                /* [E, H] */
    float *sbias, *rbias, *b13, *b2; /* [E], [E], [E, 2I], [E, H] or NULL */
    uint16_t *gate;                  /* [H] or NULL */
    /* whole buffers (biases and shared weights: given as sc_view_of) */
    sc_buffer drouter, dw13, dw2, dsbias, drbias, db13, db2, dsw13, dsw2, dgate;
    /* the same values as views into one bf16 and one f32 allocation */
    sc_buffer ckpt, ckpt32;
    sc_view vrouter, vw13, vw2, vsbias, vrbias, vb13, vb2, vsw13, vsw2, vgate;
} weights;

static sc_buffer new_buffer(sc_dtype dtype, uint64_t count, const char *label)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(the_ctx, &(sc_buffer_desc){.dtype = dtype, .count = count, .label = label}, &b) == SC_OK);
    return b;
}

static sc_buffer upload(sc_dtype dtype, const void *host, uint64_t count, const char *label)
{
    sc_buffer b = new_buffer(dtype, count, label);
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), host, count * sc_dtype_size(dtype)) == SC_OK);
    return b;
}

static void download(void *host, uint64_t bytes, sc_buffer b)
{
    REQUIRE(sc_copy_to_host(SC_DEFAULT_STREAM, host, bytes, sc_view_of(b)) == SC_OK);
}

/* Fill count elements of dst from the device block starting at offset start (wrapping). */
static void fill_from_block(sc_buffer dst, uint64_t dst_off, uint64_t count, sc_buffer block,
                            uint64_t start)
{
    while (count) {
        uint64_t n = NB - start < count ? NB - start : count;
        sc_view d, s;
        REQUIRE(sc_buffer_view(dst, dst_off, n, &d) == SC_OK);
        REQUIRE(sc_buffer_view(block, start, n, &s) == SC_OK);
        REQUIRE(sc_copy(SC_DEFAULT_STREAM, d, s) == SC_OK);
        dst_off += n;
        count -= n;
        start = 0;
    }
}

/* A place for count elements in a checkpoint: at an odd multiple of align elements (16
 * bytes), so 16-byte but not 32-byte aligned, after *cursor. */
static uint64_t place(uint64_t *cursor, uint64_t align, uint64_t count)
{
    uint64_t off = (*cursor + align - 1) / align * align;
    if ((off / align) % 2 == 0)
        off += align;
    *cursor = off + count + 2 * align;
    return off;
}

/* Copy whole buffer src (when it exists) into ckpt at offset off; its view there. */
static sc_view into_ckpt(sc_buffer ckpt, uint64_t off, sc_buffer src, uint64_t count)
{
    sc_view v = {{0}, 0, 0};
    if (!src.id)
        return v;
    REQUIRE(sc_buffer_view(ckpt, off, count, &v) == SC_OK);
    REQUIRE(sc_copy(SC_DEFAULT_STREAM, v, sc_view_of(src)) == SC_OK);
    return v;
}

static float *random_f32(uint64_t n, double scale, uint64_t *seed)
{
    float *p = test_xmalloc(n * sizeof *p);
    for (uint64_t i = 0; i < n; i++)
        p[i] = (float)(uniform(seed) * scale);
    return p;
}

static void make_weights(const model *m, weights *w, uint64_t seed)
{
    memset(w, 0, sizeof *w);
    const uint64_t E = (uint64_t)m->E, H = (uint64_t)m->H, I = (uint64_t)m->I;
    const uint64_t Is = (uint64_t)m->S * I, Imax = Is > I ? Is : I;
    REQUIRE(2 * Imax * H <= NB_EXT);
    const double s13 = m->w13_scale / sqrt((double)H), s2 = 1.0 / sqrt((double)I);
    uint16_t *b13 = test_xmalloc(NB * sizeof *b13), *b2 = test_xmalloc(NB * sizeof *b2);
    for (uint32_t i = 0; i < NB; i++) {
        b13[i] = f2bf((float)(uniform(&seed) * s13));
        b2[i] = f2bf((float)(uniform(&seed) * s2));
    }
    w->f13 = test_xmalloc((NB + NB_EXT) * sizeof *w->f13);
    w->f2 = test_xmalloc((NB + NB_EXT) * sizeof *w->f2);
    for (uint32_t i = 0; i < NB + NB_EXT; i++) {
        w->f13[i] = bf2f(b13[i % NB]);
        w->f2[i] = bf2f(b2[i % NB]);
    }
    sc_buffer d13 = upload(SC_BF16, b13, NB, "block13"), d2 = upload(SC_BF16, b2, NB, "block2");
    w->dw13 = new_buffer(SC_BF16, E * 2 * I * H, "w13");
    w->dw2 = new_buffer(SC_BF16, E * H * I, "w2");
    for (int e = 0; e < m->E; e++) {
        fill_from_block(w->dw13, (uint64_t)e * 2 * I * H, 2 * I * H, d13, w13_offset(e));
        fill_from_block(w->dw2, (uint64_t)e * H * I, H * I, d2, w2_offset(e));
    }
    if (Is) {
        w->dsw13 = new_buffer(SC_BF16, 2 * Is * H, "shared_w13");
        w->dsw2 = new_buffer(SC_BF16, H * Is, "shared_w2");
        fill_from_block(w->dsw13, 0, 2 * Is * H, d13, w13_offset(m->E));
        fill_from_block(w->dsw2, 0, H * Is, d2, w2_offset(m->E));
    }
    CHECK_OK(sc_buffer_destroy(d13));
    CHECK_OK(sc_buffer_destroy(d2));
    free(b13);
    free(b2);

    /* Router [E, H]: logits ~ 2/3 (or all 0). */
    w->router = test_xmalloc(E * H * sizeof *w->router);
    for (uint64_t i = 0; i < E * H; i++)
        w->router[i] = m->zero_router ? 0 : f2bf((float)(uniform(&seed) * 2.0 / sqrt((double)H)));
    w->drouter = upload(SC_BF16, w->router, E * H, "router");
    if (m->sbias) {
        w->sbias = test_xmalloc(E * sizeof *w->sbias);
        if (m->zero_router) {
            /* A permutation of multiples of 2^-10: exact in fp32, as are 0.5 + bias and the
             * sums of two, so GPU and reference see the same ties (lower index first). */
            for (uint64_t e = 0; e < E; e++)
                w->sbias[e] = (float)e / 1024.0f;
            for (uint64_t e = E - 1; e > 0; e--) {
                uint64_t j = test_rand(&seed) % (e + 1);
                float t = w->sbias[e];
                w->sbias[e] = w->sbias[j];
                w->sbias[j] = t;
            }
        } else {
            for (uint64_t e = 0; e < E; e++)
                w->sbias[e] = (float)((uniform(&seed) + 1.0) * 0.05);
        }
        w->dsbias = upload(SC_F32, w->sbias, E, "selection_bias");
    }
    if (m->rbias) {
        w->rbias = random_f32(E, 0.5, &seed);
        w->drbias = upload(SC_F32, w->rbias, E, "router_bias");
    }
    if (m->biases) {
        w->b13 = random_f32(E * 2 * I, 0.3 * m->w13_scale, &seed);
        w->b2 = random_f32(E * H, m->b2_scale, &seed);
        w->db13 = upload(SC_F32, w->b13, E * 2 * I, "w13_bias");
        w->db2 = upload(SC_F32, w->b2, E * H, "w2_bias");
    }
    if (m->gate) {
        w->gate = test_xmalloc(H * sizeof *w->gate);
        for (uint64_t h = 0; h < H; h++)
            w->gate[h] = f2bf((float)(uniform(&seed) * 2.0 / sqrt((double)H)));
        w->dgate = upload(SC_BF16, w->gate, H, "shared_gate");
    }

    /* The checkpoint: every weight at an odd multiple of 16 bytes of one bf16 and one f32
     * allocation. */
    uint64_t c16 = 0, c32 = 0;
    const uint64_t o_router = place(&c16, 8, E * H), o_w13 = place(&c16, 8, E * 2 * I * H);
    const uint64_t o_w2 = place(&c16, 8, E * H * I), o_sw13 = place(&c16, 8, 2 * Is * H);
    const uint64_t o_sw2 = place(&c16, 8, H * Is), o_gate = place(&c16, 8, H);
    const uint64_t o_sb = place(&c32, 4, E), o_rb = place(&c32, 4, E);
    const uint64_t o_b13 = place(&c32, 4, E * 2 * I), o_b2 = place(&c32, 4, E * H);
    w->ckpt = new_buffer(SC_BF16, c16, "checkpoint");
    w->ckpt32 = new_buffer(SC_F32, c32, "checkpoint-f32");
    w->vrouter = into_ckpt(w->ckpt, o_router, w->drouter, E * H);
    w->vw13 = into_ckpt(w->ckpt, o_w13, w->dw13, E * 2 * I * H);
    w->vw2 = into_ckpt(w->ckpt, o_w2, w->dw2, E * H * I);
    w->vsw13 = into_ckpt(w->ckpt, o_sw13, w->dsw13, 2 * Is * H);
    w->vsw2 = into_ckpt(w->ckpt, o_sw2, w->dsw2, H * Is);
    w->vgate = into_ckpt(w->ckpt, o_gate, w->dgate, H);
    w->vsbias = into_ckpt(w->ckpt32, o_sb, w->dsbias, E);
    w->vrbias = into_ckpt(w->ckpt32, o_rb, w->drbias, E);
    w->vb13 = into_ckpt(w->ckpt32, o_b13, w->db13, E * 2 * I);
    w->vb2 = into_ckpt(w->ckpt32, o_b2, w->db2, E * H);
}

static void free_weights(weights *w)
{
    sc_buffer bufs[] = {w->drouter, w->dw13, w->dw2, w->dsbias, w->drbias, w->db13,
                        w->db2, w->dsw13, w->dsw2, w->dgate, w->ckpt, w->ckpt32};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i].id)
            CHECK_OK(sc_buffer_destroy(bufs[i]));
    free(w->f13);
    free(w->f2);
    free(w->router);
    free(w->sbias);
    free(w->rbias);
    free(w->b13);
    free(w->b2);
    free(w->gate);
}

static sc_view opt_view(sc_buffer b)
{
    sc_view none = {{0}, 0, 0};
    return b.id ? sc_view_of(b) : none;
}

/* The layer over the whole buffers, or (views) over the checkpoint. */
static sc_moe make_layer(const model *m, const weights *w, sc_moe_backend backend, bool views)
{
    sc_moe_desc d = {.experts = m->E, .top_k = m->k, .hidden = m->H, .intermediate = m->I,
                     .scoring = m->scoring, .renormalize = m->renormalize,
                     .label = views ? "moe-views" : "moe", .backend = backend,
                     .n_group = m->n_group, .topk_group = m->topk_group,
                     .routed_scaling = m->scaling, .activation = m->act,
                     .swiglu_alpha = m->alpha, .swiglu_limit = m->limit,
                     .w13_layout = m->layout, .shared_intermediate = m->S * m->I};
    if (views) {
        d.router_view = w->vrouter;
        d.w13_view = w->vw13;
        d.w2_view = w->vw2;
        d.selection_bias_view = w->vsbias;
        d.router_bias = w->vrbias;
        d.w13_bias = w->vb13;
        d.w2_bias = w->vb2;
        d.shared_w13 = w->vsw13;
        d.shared_w2 = w->vsw2;
        d.shared_gate = w->vgate;
    } else {
        d.router = w->drouter;
        d.w13 = w->dw13;
        d.w2 = w->dw2;
        d.selection_bias = w->dsbias;
        d.router_bias = opt_view(w->drbias);
        d.w13_bias = opt_view(w->db13);
        d.w2_bias = opt_view(w->db2);
        d.shared_w13 = opt_view(w->dsw13);
        d.shared_w2 = opt_view(w->dsw2);
        d.shared_gate = opt_view(w->dgate);
    }
    sc_moe layer = {0};
    sc_status s = sc_moe_create(the_ctx, &d, &layer);
    if (s != SC_OK)
        fprintf(stderr, "%s (%s%s): %s\n", m->name, backend_name[backend],
                views ? ", views" : "", sc_last_error());
    REQUIRE(s == SC_OK);
    return layer;
}

/* ---- the reference ------------------------------------------------------------------------ */

/* One token's routing: the slots' experts (< 0: padded) and weights, and whether a near-tie
 * (fp32 and double may order differently) could change the choice. */
typedef struct ref_route {
    int ids[SC_MOE_MAX_TOPK];
    double wts[SC_MOE_MAX_TOPK];
    bool near_tie;
} ref_route;

static bool near_tie(double a, double b)
{
    return a != b && fabs(a - b) <= 2e-6 * (fabs(a) + fabs(b));
}

/* Steps 1-2: scores (softmax or sigmoid of the logits + router bias). */
static void ref_scores(const model *m, const weights *w, const float *x, double *score)
{
    const int E = m->E, H = m->H;
    double mx = -INFINITY;
    for (int e = 0; e < E; e++) {
        double acc = 0;
        const uint16_t *wr = w->router + (size_t)e * H;
        for (int h = 0; h < H; h++)
            acc += (double)x[h] * bf2f(wr[h]);
        score[e] = acc + (w->rbias ? w->rbias[e] : 0.0);
        mx = fmax(mx, score[e]);
    }
    double sum = 0;
    for (int e = 0; e < E; e++) {
        score[e] = m->scoring == SC_MOE_SOFTMAX ? exp(score[e] - mx) : 1.0 / (1.0 + exp(-score[e]));
        sum += score[e];
    }
    if (m->scoring == SC_MOE_SOFTMAX)
        for (int e = 0; e < E; e++)
            score[e] /= sum;
}

/* Step 6: the weights of the chosen experts. */
static void ref_weights(const model *m, const double *score, const int *ids, double *wts)
{
    double sum = 0;
    for (int j = 0; j < m->k; j++)
        sum += score[ids[j]];
    const double scale = m->scaling != 0.0f ? (double)m->scaling : 1.0;
    for (int j = 0; j < m->k; j++)
        wts[j] = score[ids[j]] / (m->renormalize ? sum : 1.0) * scale;
}

/* Steps 3-6: selection scores, the groups kept, the top k (ties: lower index). */
static void ref_select(const model *m, const weights *w, const double *score, ref_route *r)
{
    const int E = m->E, k = m->k;
    double sel[SC_MOE_MAX_EXPERTS];
    bool allowed[SC_MOE_MAX_EXPERTS], taken[SC_MOE_MAX_EXPERTS] = {false};
    for (int e = 0; e < E; e++) {
        sel[e] = score[e] + (w->sbias ? w->sbias[e] : 0.0);
        allowed[e] = true;
    }
    r->near_tie = false;
    if (m->n_group > 0) {
        const int G = E / m->n_group;
        double gs[32];
        bool kept[32] = {false};
        for (int g = 0; g < m->n_group; g++) {
            double a = -INFINITY, b = -INFINITY;
            for (int e = g * G; e < (g + 1) * G; e++) {
                if (sel[e] > a) {
                    b = a;
                    a = sel[e];
                } else if (sel[e] > b) {
                    b = sel[e];
                }
            }
            gs[g] = a + b;
        }
        double last = 0;
        for (int j = 0; j < m->topk_group; j++) {
            int best = -1;
            for (int g = 0; g < m->n_group; g++)
                if (!kept[g] && (best < 0 || gs[g] > gs[best]))
                    best = g;
            kept[best] = true;
            last = gs[best];
        }
        for (int g = 0; g < m->n_group; g++)
            if (!kept[g] && near_tie(gs[g], last))
                r->near_tie = true;
        for (int e = 0; e < E; e++)
            allowed[e] = kept[e / G];
    }
    double prev = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (allowed[e] && !taken[e] && (best < 0 || sel[e] > sel[best]))
                best = e;
        REQUIRE(best >= 0);
        taken[best] = true;
        r->ids[j] = best;
        if (j > 0 && near_tie(sel[best], prev))
            r->near_tie = true; /* the slot order */
        prev = sel[best];
    }
    for (int e = 0; e < E; e++)
        if (allowed[e] && !taken[e] && near_tie(sel[e], prev))
            r->near_tie = true; /* the k-th choice */
    ref_weights(m, score, r->ids, r->wts);
}

static double act(const model *m, double g, double u)
{
    switch (m->act) {
    case SC_MOE_SILU:
        return g / (1.0 + exp(-g)) * u;
    case SC_MOE_GELU_TANH:
        return 0.5 * g * (1.0 + tanh(0.7978845608028654 /* sqrt(2/pi) */ * (g + 0.044715 * g * g * g))) * u;
    case SC_MOE_SWIGLU_CLAMP: {
        const double alpha = m->alpha != 0.0f ? m->alpha : 1.702f;
        const double limit = m->limit != 0.0f ? m->limit : 7.0f;
        g = fmin(g, limit);
        u = fmax(fmin(u, limit), -limit);
        return g / (1.0 + exp(-alpha * g)) * (u + 1.0);
    }
    }
    REQUIRE(!"activation");
    return 0;
}

/* out += wt * y_e(x) (e = E: the shared expert), h rounded to bf16 as the GPU rounds it;
 * mag += |wt * y| of each row the GPU rounds to bf16 before the sum (the shared expert's S
 * chunks of I are S such rows). */
static void ref_mlp(const model *m, const weights *w, int e, const float *x, double wt,
                    double *out, double *mag, double *hbuf)
{
    const bool shared = e == m->E;
    const uint64_t H = (uint64_t)m->H, I = (uint64_t)m->I;
    const uint64_t In = shared ? (uint64_t)m->S * I : I;
    const bool stacked = m->layout == SC_MOE_W13_STACKED;
    for (uint64_t i = 0; i < In; i++) {
        const uint64_t rg = stacked ? i : 2 * i, ru = stacked ? In + i : 2 * i + 1;
        const float *wg = w->f13 + w13_offset(e) + rg * H, *wu = w->f13 + w13_offset(e) + ru * H;
        double g = 0, u = 0;
        for (uint64_t h = 0; h < H; h++) {
            g += (double)x[h] * wg[h];
            u += (double)x[h] * wu[h];
        }
        if (!shared && w->b13) {
            g += w->b13[(uint64_t)e * 2 * I + rg];
            u += w->b13[(uint64_t)e * 2 * I + ru];
        }
        hbuf[i] = round_bf16(act(m, g, u));
    }
    for (uint64_t o = 0; o < H; o++) {
        const float *w2r = w->f2 + w2_offset(e) + o * In;
        for (uint64_t c = 0; c < In; c += I) {
            double acc = 0;
            for (uint64_t i = c; i < c + I; i++)
                acc += hbuf[i] * w2r[i];
            if (!shared && w->b2)
                acc += w->b2[(uint64_t)e * H + o];
            out[o] += wt * acc;
            mag[o] += fabs(wt * acc);
        }
    }
}

/* One token's output for the slots given (ids < 0 or >= E contribute nothing) plus the
 * shared expert; mag: the sum of the contributions' magnitudes (for the tolerances). */
static void ref_token(const model *m, const weights *w, const float *x, const int *ids,
                      const double *wts, double *out, double *mag, double *hbuf)
{
    memset(out, 0, (size_t)m->H * sizeof *out);
    memset(mag, 0, (size_t)m->H * sizeof *mag);
    for (int j = 0; j < m->k; j++)
        if (ids[j] >= 0 && ids[j] < m->E)
            ref_mlp(m, w, ids[j], x, wts[j], out, mag, hbuf);
    if (m->S) {
        double gw = 1.0;
        if (w->gate) {
            double dot = 0;
            for (int h = 0; h < m->H; h++)
                dot += (double)x[h] * bf2f(w->gate[h]);
            gw = 1.0 / (1.0 + exp(-dot));
        }
        ref_mlp(m, w, m->E, x, gw, out, mag, hbuf);
    }
}

/* ---- one case: T tokens, their reference ------------------------------------------------ */

typedef struct tcase {
    const model *m;
    const weights *w;
    uint64_t T;
    uint16_t *x;        /* [T, H] */
    float *xf;          /* x as floats */
    uint16_t *old;      /* [T, H]: out before the accumulating forward */
    const int32_t *cids; /* the caller's routing [T, k] (NULL: the layer's) */
    const float *cwts;
    uint64_t nchk, *chk; /* the tokens the reference computes (all for small T) */
    ref_route *rt;      /* per checked token */
    double *score;      /* per checked token: [E] */
    double *ref, *mag;  /* per checked token: [H] */
    double *hbuf;
} tcase;

static void build_case(tcase *tc, const model *m, const weights *w, uint64_t T, uint64_t seed,
                       const int32_t *cids, const float *cwts)
{
    memset(tc, 0, sizeof *tc);
    const uint64_t H = (uint64_t)m->H, E = (uint64_t)m->E, k = (uint64_t)m->k;
    tc->m = m;
    tc->w = w;
    tc->T = T;
    tc->cids = cids;
    tc->cwts = cwts;
    tc->x = test_xmalloc(T * H * sizeof *tc->x);
    tc->xf = test_xmalloc(T * H * sizeof *tc->xf);
    for (uint64_t i = 0; i < T * H; i++) {
        tc->x[i] = f2bf((float)uniform(&seed));
        tc->xf[i] = bf2f(tc->x[i]);
    }
    /* The reference is expensive: every token up to 160, else the first 16, a sample and
     * the last. */
    tc->chk = test_xmalloc(T * sizeof *tc->chk);
    const uint64_t step = T <= 160 ? 1 : T / 32;
    for (uint64_t t = 0; t < T; t++)
        if (t < 16 || t % step == 0 || t == T - 1)
            tc->chk[tc->nchk++] = t;
    tc->rt = test_xmalloc(tc->nchk * sizeof *tc->rt);
    tc->score = test_xmalloc(tc->nchk * E * sizeof *tc->score);
    tc->ref = test_xmalloc(tc->nchk * H * sizeof *tc->ref);
    tc->mag = test_xmalloc(tc->nchk * H * sizeof *tc->mag);
    tc->hbuf = test_xmalloc((uint64_t)(m->S > 1 ? m->S : 1) * (uint64_t)m->I * sizeof *tc->hbuf);
    double ref2 = 0;
    for (uint64_t c = 0; c < tc->nchk; c++) {
        const uint64_t t = tc->chk[c];
        const float *xt = tc->xf + t * H;
        ref_route *r = &tc->rt[c];
        if (cids) {
            for (uint64_t j = 0; j < k; j++) {
                r->ids[j] = cids[t * k + j];
                r->wts[j] = cwts[t * k + j];
            }
            r->near_tie = false;
        } else {
            ref_scores(m, w, xt, tc->score + c * E);
            ref_select(m, w, tc->score + c * E, r);
        }
        ref_token(m, w, xt, r->ids, r->wts, tc->ref + c * H, tc->mag + c * H, tc->hbuf);
        for (uint64_t h = 0; h < H; h++)
            ref2 += tc->ref[c * H + h] * tc->ref[c * H + h];
    }
    /* out before out += layer(x): of the size of layer(x). */
    double rms = sqrt(ref2 / (double)(tc->nchk * H));
    if (!(rms > 0))
        rms = 0.1;
    tc->old = test_xmalloc(T * H * sizeof *tc->old);
    for (uint64_t i = 0; i < T * H; i++)
        tc->old[i] = f2bf((float)(uniform(&seed) * rms));
}

static void free_case(tcase *tc)
{
    free(tc->x);
    free(tc->xf);
    free(tc->old);
    free(tc->chk);
    free(tc->rt);
    free(tc->score);
    free(tc->ref);
    free(tc->mag);
    free(tc->hbuf);
}

/* Compare a forward's output (and, with ids, the layer's choice and weights) with the
 * reference; acc: out was tc->old before (out += layer(x)). The choice must equal the
 * reference's except where the reference found a near-tie (then the output is checked
 * against the reference for the GPU's choice); the weights within 1e-4 relative. Output:
 * every element finite, the relative L2 error <= 1e-2, and each element within 6e-3 x
 * (the magnitudes of the rows summed + the result's) + 1e-3 x their RMS over the token:
 * each row is rounded to bf16 before the sum and the sum once more, each rounding off by
 * up to 2^-8 of its value. */
static void compare(const tcase *tc, int backend, const char *what, const uint16_t *out,
                    const int32_t *ids, const float *wts, bool acc)
{
    const model *m = tc->m;
    const uint64_t H = (uint64_t)m->H, k = (uint64_t)m->k, E = (uint64_t)m->E;
    double *alt = test_xmalloc(2 * H * sizeof *alt);
    double err2 = 0, ref2 = 0, worst = 0;
    int route_bad = 0, tolerated = 0, elem_bad = 0, nonfinite = 0;
    for (uint64_t c = 0; c < tc->nchk; c++) {
        const uint64_t t = tc->chk[c];
        const ref_route *r = &tc->rt[c];
        const double *ref = tc->ref + c * H, *mag = tc->mag + c * H;
        if (ids) {
            const int32_t *gi = ids + t * k;
            const double *want_w = r->wts;
            double alt_w[SC_MOE_MAX_TOPK];
            bool same = true, valid = true;
            for (uint64_t j = 0; j < k; j++) {
                same = same && gi[j] == r->ids[j];
                valid = valid && gi[j] >= 0 && (uint64_t)gi[j] < E;
                for (uint64_t j2 = 0; j2 < j; j2++)
                    valid = valid && gi[j2] != gi[j];
            }
            if (!same) {
                if (!r->near_tie || !valid) {
                    if (route_bad++ < 3) {
                        fprintf(stderr, "  token %llu: experts", (unsigned long long)t);
                        for (uint64_t j = 0; j < k; j++)
                            fprintf(stderr, " %d", gi[j]);
                        fprintf(stderr, ", the reference's");
                        for (uint64_t j = 0; j < k; j++)
                            fprintf(stderr, " %d", r->ids[j]);
                        fprintf(stderr, "\n");
                    }
                    continue;
                }
                /* A near-tie decided the other way: the reference for the GPU's choice. */
                tolerated++;
                int gids[SC_MOE_MAX_TOPK];
                for (uint64_t j = 0; j < k; j++)
                    gids[j] = gi[j];
                ref_weights(m, tc->score + c * E, gids, alt_w);
                ref_token(m, tc->w, tc->xf + t * H, gids, alt_w, alt, alt + H, tc->hbuf);
                want_w = alt_w;
                ref = alt;
                mag = alt + H;
            }
            for (uint64_t j = 0; j < k; j++) {
                const double got = wts[t * k + j];
                if (!(fabs(got - want_w[j]) <= 1e-4 * fabs(want_w[j]) + 1e-7) && route_bad++ < 3)
                    fprintf(stderr, "  token %llu slot %llu: weight %.8g, the reference's %.8g\n",
                            (unsigned long long)t, (unsigned long long)j, got, want_w[j]);
            }
        }
        double mag2 = 0;
        for (uint64_t h = 0; h < H; h++) {
            const double mg = mag[h] + (acc ? fabs(bf2f(tc->old[t * H + h])) : 0.0);
            mag2 += mg * mg;
        }
        const double abs_floor = 1e-3 * sqrt(mag2 / (double)H);
        for (uint64_t h = 0; h < H; h++) {
            const double o = bf2f(out[t * H + h]);
            const double old = acc ? bf2f(tc->old[t * H + h]) : 0.0;
            const double want = ref[h] + old;
            const double bound = 6e-3 * (mag[h] + fabs(old) + fabs(want)) + abs_floor;
            const double d = fabs(o - want);
            if (!(d <= bound)) {
                if (elem_bad++ < 3)
                    fprintf(stderr, "  token %llu, h %llu: %.6g, the reference's %.6g (bound %.3g)\n",
                            (unsigned long long)t, (unsigned long long)h, o, want, bound);
            } else if (bound > 0 && d / bound > worst) {
                worst = d / bound;
            }
            if (isfinite(o)) {
                err2 += (o - want) * (o - want);
                ref2 += want * want;
            }
        }
    }
    /* Every element was written (the poison is gone), checked by the reference or not. */
    for (uint64_t i = 0; i < tc->T * H; i++)
        if (!isfinite(bf2f(out[i])))
            nonfinite++;
    const double rel = sqrt(err2 / (ref2 > 0 ? ref2 : 1));
    printf("  %-4s %-22s T=%-5llu rel L2 %.2e, worst element %.2f of its bound%s%s%s\n",
           backend_name[backends[backend]], what, (unsigned long long)tc->T, rel, worst,
           tolerated ? ", a near-tie decided otherwise" : "",
           route_bad ? " ROUTING MISMATCH" : "", nonfinite ? " NON-FINITE OUTPUT" : "");
    if (tolerated)
        printf("       (%d token(s): the output checked for the GPU's choice)\n", tolerated);
    CHECK(route_bad == 0);
    CHECK(elem_bad == 0);
    CHECK(nonfinite == 0);
    CHECK(rel <= 1e-2);
    free(alt);
}

/* ---- device buffers of one case ---------------------------------------------------------- */

typedef struct io {
    sc_buffer x, out, ids, wts, ids2, wts2;
    uint16_t *hout, *hout2;
    int32_t *hids, *hids2;
    float *hwts, *hwts2;
} io;

static void io_make(io *b, const tcase *tc)
{
    const uint64_t n = tc->T * (uint64_t)tc->m->H, nk = tc->T * (uint64_t)tc->m->k;
    b->x = upload(SC_BF16, tc->x, n, "x");
    b->out = new_buffer(SC_BF16, n, "out");
    b->ids = new_buffer(SC_I32, nk, "ids");
    b->wts = new_buffer(SC_F32, nk, "weights");
    b->ids2 = new_buffer(SC_I32, nk, "ids2");
    b->wts2 = new_buffer(SC_F32, nk, "weights2");
    b->hout = test_xmalloc(n * 2);
    b->hout2 = test_xmalloc(n * 2);
    b->hids = test_xmalloc(nk * 4);
    b->hids2 = test_xmalloc(nk * 4);
    b->hwts = test_xmalloc(nk * 4);
    b->hwts2 = test_xmalloc(nk * 4);
}

static void io_free(io *b)
{
    sc_buffer bufs[] = {b->x, b->out, b->ids, b->wts, b->ids2, b->wts2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CHECK_OK(sc_buffer_destroy(bufs[i]));
    free(b->hout);
    free(b->hout2);
    free(b->hids);
    free(b->hids2);
    free(b->hwts);
    free(b->hwts2);
}

/* Fill with a pattern the layer never writes (salt: a different one each time). */
static void poison(sc_buffer b, sc_dtype dtype, int salt)
{
    const uint16_t h = (uint16_t)(0x7fc0 + salt);
    const int32_t i = -1000 - salt;
    uint32_t fbits = 0x7fc00000u + (uint32_t)salt;
    float f;
    memcpy(&f, &fbits, 4);
    const void *v = dtype == SC_BF16 ? (const void *)&h : dtype == SC_I32 ? (const void *)&i : (const void *)&f;
    REQUIRE(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), v) == SC_OK);
}

/* The layer's own routing, on one backend: forward (checked against the reference), again
 * with check_routing (bitwise), sc_moe_route (the same ids and weights), the caller's
 * routing given those (bitwise the same output), the view layer (bitwise), out += layer. */
static void run_own_routing(const tcase *tc, int bi, sc_moe layer, sc_moe vlayer)
{
    const model *m = tc->m;
    const uint64_t n = tc->T * (uint64_t)m->H, nk = tc->T * (uint64_t)m->k;
    io b;
    io_make(&b, tc);
    const sc_view x = sc_view_of(b.x), out = sc_view_of(b.out);

    poison(b.out, SC_BF16, 0);
    poison(b.ids, SC_I32, 0);
    poison(b.wts, SC_F32, 0);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out,
                            &(sc_moe_forward_desc){.expert_ids = sc_view_of(b.ids),
                                                   .expert_weights = sc_view_of(b.wts)}));
    download(b.hout, n * 2, b.out);
    download(b.hids, nk * 4, b.ids);
    download(b.hwts, nk * 4, b.wts);
    compare(tc, bi, "forward", b.hout, b.hids, b.hwts, false);

    /* Again, with check_routing (no bad id: SC_OK): bitwise the same. */
    poison(b.out, SC_BF16, 1);
    poison(b.ids2, SC_I32, 1);
    poison(b.wts2, SC_F32, 1);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out,
                            &(sc_moe_forward_desc){.expert_ids = sc_view_of(b.ids2),
                                                   .expert_weights = sc_view_of(b.wts2),
                                                   .check_routing = true}));
    download(b.hout2, n * 2, b.out);
    download(b.hids2, nk * 4, b.ids2);
    download(b.hwts2, nk * 4, b.wts2);
    CHECK_BYTES(b.hout2, b.hout, n * 2, "repeated forward: out");
    CHECK_BYTES(b.hids2, b.hids, nk * 4, "repeated forward: expert_ids");
    CHECK_BYTES(b.hwts2, b.hwts, nk * 4, "repeated forward: expert_weights");

    /* The routing alone: what the forward used. */
    poison(b.ids2, SC_I32, 2);
    poison(b.wts2, SC_F32, 2);
    CHECK_OK(sc_moe_route(SC_DEFAULT_STREAM, layer, x, sc_view_of(b.ids2), sc_view_of(b.wts2)));
    download(b.hids2, nk * 4, b.ids2);
    download(b.hwts2, nk * 4, b.wts2);
    CHECK_BYTES(b.hids2, b.hids, nk * 4, "sc_moe_route: ids");
    CHECK_BYTES(b.hwts2, b.hwts, nk * 4, "sc_moe_route: weights");

    /* Those given back as the caller's routing: the same forward, bitwise. */
    poison(b.out, SC_BF16, 3);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out,
                            &(sc_moe_forward_desc){.routing_ids = sc_view_of(b.ids),
                                                   .routing_weights = sc_view_of(b.wts),
                                                   .check_routing = true}));
    download(b.hout2, n * 2, b.out);
    CHECK_BYTES(b.hout2, b.hout, n * 2, "caller's routing = the layer's: out");

    /* The same weights as views into one allocation: bitwise the same. */
    poison(b.out, SC_BF16, 4);
    poison(b.ids2, SC_I32, 4);
    poison(b.wts2, SC_F32, 4);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, vlayer, x, out,
                            &(sc_moe_forward_desc){.expert_ids = sc_view_of(b.ids2),
                                                   .expert_weights = sc_view_of(b.wts2)}));
    download(b.hout2, n * 2, b.out);
    download(b.hids2, nk * 4, b.ids2);
    download(b.hwts2, nk * 4, b.wts2);
    CHECK_BYTES(b.hids2, b.hids, nk * 4, "weights as views: expert_ids");
    CHECK_BYTES(b.hwts2, b.hwts, nk * 4, "weights as views: expert_weights");
    if (backends[bi] == SC_MOE_BACKEND_SM90) {
        /* SM90 shifts K for weights at 16-byte (not 128-byte) aligned views, so the sums
         * split K elsewhere: the reference decides, then a repeat is bitwise. */
        compare(tc, bi, "weights as views", b.hout2, b.hids2, b.hwts2, false);
        poison(b.out, SC_BF16, 5);
        sc_moe_profile prof; /* (its steps say the GEMMs ran shifted: the views' W13 and W2
                                are at odd multiples of 16 bytes) */
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, vlayer, x, out,
                                &(sc_moe_forward_desc){.profile = &prof}));
        int shifted = 0;
        for (int i = 0; i < prof.steps; i++)
            shifted += prof.name[i] && strstr(prof.name[i], "K shift") != NULL;
        if (shifted != 2)
            fprintf(stderr, "weights as views: %d GEMM steps shifted, not 2\n", shifted);
        CHECK(shifted == 2);
        download(b.hout, n * 2, b.out);
        CHECK_BYTES(b.hout, b.hout2, n * 2, "weights as views, repeated: out");
    } else {
        CHECK_BYTES(b.hout2, b.hout, n * 2, "weights as views: out");
    }

    /* out += layer(x). */
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, out, tc->old, n * 2) == SC_OK);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out,
                            &(sc_moe_forward_desc){.accumulate = true}));
    download(b.hout2, n * 2, b.out);
    compare(tc, bi, "out += layer(x)", b.hout2, b.hids, b.hwts, true);
    io_free(&b);
}

static void run_model(const model *m, const uint64_t *Ts, int nT, uint64_t seed)
{
    printf("%s\n", m->name);
    weights w;
    make_weights(m, &w, seed);
    sc_moe layers[2], vlayers[2];
    for (int bi = 0; bi < n_backends; bi++) {
        layers[bi] = make_layer(m, &w, backends[bi], false);
        vlayers[bi] = make_layer(m, &w, backends[bi], true);
    }
    for (int i = 0; i < nT; i++) {
        tcase tc;
        build_case(&tc, m, &w, Ts[i], seed * 1000 + (uint64_t)i, NULL, NULL);
        for (int bi = 0; bi < n_backends; bi++)
            run_own_routing(&tc, bi, layers[bi], vlayers[bi]);
        free_case(&tc);
    }
    for (int bi = 0; bi < n_backends; bi++) {
        CHECK_OK(sc_moe_destroy(layers[bi]));
        CHECK_OK(sc_moe_destroy(vlayers[bi]));
    }
    free_weights(&w);
}

static void test_models(void)
{
    const uint64_t Ts[] = {1, 7, 129, 1000};
    if (quick) {
        const uint64_t small[] = {1, 129}, seven[] = {7};
        run_model(&models[M_ODD], small, 2, 101);
        run_model(&models[M_GPT_OSS], seven, 1, 102);
        run_model(&models[M_QWEN3_NEXT], seven, 1, 103);
        return;
    }
    for (int i = 0; i < M_COUNT; i++)
        run_model(&models[i], Ts, 4, 100 + (uint64_t)i);
}

/* ---- the caller's routing ------------------------------------------------------------------ */

enum pattern {
    P_PADDED,  /* every slot padded */
    P_RANDOM,  /* random experts, 30% of the slots padded (also ids < -1), some tokens all */
    P_ONE,     /* every token to expert 7 in slot 0, the other slots padded */
    P_FIRST_K, /* every token to experts 0 .. k-1 */
    P_HALF     /* experts of the lower half only (the others get no token), 20% padded */
};

static void make_routing(const model *m, uint64_t T, enum pattern p, uint64_t seed,
                         int32_t *ids, float *wts)
{
    const uint64_t k = (uint64_t)m->k;
    for (uint64_t t = 0; t < T; t++) {
        const bool all_padded = p == P_PADDED ||
                                ((p == P_RANDOM || p == P_HALF) && T > 1 &&
                                 (t == 0 || t == T / 2 || t == T - 1));
        for (uint64_t j = 0; j < k; j++) {
            int32_t *id = &ids[t * k + j];
            wts[t * k + j] = (float)uniform(&seed);
            if (all_padded) {
                *id = -1;
                continue;
            }
            const uint64_t r = test_rand(&seed) % 100;
            if (p == P_ONE) {
                *id = j == 0 ? 7 % m->E : -1;
            } else if (p == P_FIRST_K) {
                *id = (int32_t)j;
            } else if (r < (p == P_RANDOM ? 30u : 20u)) {
                *id = r % 3 ? -1 : -(int32_t)(2 + r); /* any id < 0 is padded */
            } else {
                const uint64_t range = p == P_HALF ? (uint64_t)m->E / 2 : (uint64_t)m->E;
                bool dup;
                do { /* distinct within the token */
                    *id = (int32_t)(test_rand(&seed) % range);
                    dup = false;
                    for (uint64_t j2 = 0; j2 < j; j2++)
                        dup = dup || ids[t * k + j2] == *id;
                } while (dup);
            }
        }
    }
}

/* The caller's routing on every backend: checked forward, repeated bitwise, out += layer. */
static void run_caller(const model *m, const weights *w, const sc_moe *layers, uint64_t T,
                       enum pattern p, uint64_t seed, const char *what)
{
    const uint64_t k = (uint64_t)m->k, n = T * (uint64_t)m->H, nk = T * k;
    int32_t *ids = test_xmalloc(nk * sizeof *ids);
    float *wts = test_xmalloc(nk * sizeof *wts);
    make_routing(m, T, p, seed, ids, wts);
    tcase tc;
    build_case(&tc, m, w, T, seed + 7, ids, wts);
    for (int bi = 0; bi < n_backends; bi++) {
        io b;
        io_make(&b, &tc);
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.ids), ids, nk * 4) == SC_OK);
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.wts), wts, nk * 4) == SC_OK);
        const sc_moe_forward_desc opts = {.routing_ids = sc_view_of(b.ids),
                                          .routing_weights = sc_view_of(b.wts),
                                          .check_routing = true};
        poison(b.out, SC_BF16, 5);
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layers[bi], sc_view_of(b.x), sc_view_of(b.out), &opts));
        download(b.hout, n * 2, b.out);
        compare(&tc, bi, what, b.hout, NULL, NULL, false);
        poison(b.out, SC_BF16, 6);
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layers[bi], sc_view_of(b.x), sc_view_of(b.out), &opts));
        download(b.hout2, n * 2, b.out);
        CHECK_BYTES(b.hout2, b.hout, n * 2, "repeated forward, caller's routing: out");
        sc_moe_forward_desc acc = opts;
        acc.accumulate = true;
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.out), tc.old, n * 2) == SC_OK);
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layers[bi], sc_view_of(b.x), sc_view_of(b.out), &acc));
        download(b.hout2, n * 2, b.out);
        compare(&tc, bi, "out += (caller's)", b.hout2, NULL, NULL, true);
        io_free(&b);
    }
    free_case(&tc);
    free(ids);
    free(wts);
}

static void test_caller_routing(void)
{
    const int which[] = {M_ODD, M_ODD_SOFTMAX}; /* a gated shared expert, and none */
    for (int i = 0; i < (quick ? 1 : 2); i++) {
        const model *m = &models[which[i]];
        printf("%s, the caller's routing\n", m->name);
        weights w;
        make_weights(m, &w, 300 + (uint64_t)i);
        sc_moe layers[2];
        for (int bi = 0; bi < n_backends; bi++)
            layers[bi] = make_layer(m, &w, backends[bi], false);
        const uint64_t s = 310 + 10 * (uint64_t)i;
        run_caller(m, &w, layers, 1, P_PADDED, s, "T=1, all slots padded");
        run_caller(m, &w, layers, 129, P_ONE, s + 3, "all to expert 7");
        if (!quick) {
            run_caller(m, &w, layers, 1, P_RANDOM, s + 1, "T=1");
            run_caller(m, &w, layers, 7, P_RANDOM, s + 2, "padded slots");
            run_caller(m, &w, layers, 1000, P_ONE, s + 4, "all to expert 7");
            run_caller(m, &w, layers, 1000, P_FIRST_K, s + 5, "all to experts 0..k-1");
            run_caller(m, &w, layers, 1000, P_HALF, s + 6, "half the experts idle");
            run_caller(m, &w, layers, 129, P_RANDOM, s + 7, "padded slots");
        }
        for (int bi = 0; bi < n_backends; bi++)
            CHECK_OK(sc_moe_destroy(layers[bi]));
        free_weights(&w);
    }
}

/* ---- routing ids >= E ---------------------------------------------------------------------- */

/* The last error names word followed by value ("token 5", "token = 5", "token: 5"). */
static bool msg_names(const char *word, long long value)
{
    const char *msg = sc_last_error();
    const size_t wl = strlen(word);
    for (const char *p = strstr(msg, word); p; p = strstr(p + 1, word)) {
        const char *q = p + wl;
        while (*q == ' ' || *q == '=' || *q == ':')
            q++;
        char *end;
        long long v = strtoll(q, &end, 10);
        if (end != q && v == value)
            return true;
    }
    return false;
}

/* The last error names token t, slot j and the id. */
#define CHECK_NAMES_SLOT(t, j, id)                                                           \
    do {                                                                                     \
        if (!msg_names("token", (t)) || !msg_names("slot", (j)) ||                           \
            !(msg_names("id", (id)) || msg_names("expert", (id)))) {                         \
            fprintf(stderr, "%s:%d: message does not name token %d, slot %d and id %lld: %s\n", \
                    __FILE__, __LINE__, (int)(t), (int)(j), (long long)(id), sc_last_error()); \
            test_failures++;                                                                 \
        }                                                                                    \
    } while (0)

static void test_bad_routing(void)
{
    const model *m = &models[M_ODD];
    const uint64_t T = 9, k = (uint64_t)m->k, n = T * (uint64_t)m->H, nk = T * k;
    weights w;
    make_weights(m, &w, 400);
    int32_t ids[9 * 3], bad[9 * 3];
    float wts[9 * 3];
    REQUIRE(k == 3);
    make_routing(m, T, P_HALF, 402, ids, wts);
    for (uint64_t i = 0; i < nk; i++) /* no padded slot */
        if (ids[i] < 0)
            ids[i] = (int32_t)(m->E / 2 + i % (uint64_t)(m->E / 2));
    printf("%s, routing ids >= E\n", m->name);
    for (int bi = 0; bi < n_backends; bi++) {
        sc_moe layer = make_layer(m, &w, backends[bi], false);
        tcase tc;
        memcpy(bad, ids, sizeof bad);
        bad[5 * k + 1] = m->E + 7;
        build_case(&tc, m, &w, T, 403, bad, wts);
        io b;
        io_make(&b, &tc);
        const sc_view x = sc_view_of(b.x), out = sc_view_of(b.out);
        const sc_moe_forward_desc checked = {.routing_ids = sc_view_of(b.ids),
                                             .routing_weights = sc_view_of(b.wts),
                                             .check_routing = true};
        sc_moe_forward_desc unchecked = checked;
        unchecked.check_routing = false;
        /* A checked forward: refused, naming the slot; the other slots computed. */
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.ids), bad, nk * 4) == SC_OK);
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.wts), wts, nk * 4) == SC_OK);
        poison(b.out, SC_BF16, 7);
        CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out, &checked), SC_ERR_INVALID_ARGUMENT);
        CHECK_MSG("sc_moe_forward");
        CHECK_NAMES_SLOT(5, 1, m->E + 7);
        download(b.hout, n * 2, b.out);
        compare(&tc, bi, "bad id skipped", b.hout, NULL, NULL, false);
        CHECK_OK(sc_moe_routing_check(SC_DEFAULT_STREAM, layer)); /* reported already */

        /* An unchecked forward's bad id, reported once by sc_moe_routing_check (after a
         * good forward). */
        memcpy(bad, ids, sizeof bad);
        bad[2 * k + 0] = INT32_MAX;
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.ids), bad, nk * 4) == SC_OK);
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out, &unchecked));
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.ids), ids, nk * 4) == SC_OK);
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out, &unchecked));
        CHECK_STATUS(sc_moe_routing_check(SC_DEFAULT_STREAM, layer), SC_ERR_INVALID_ARGUMENT);
        CHECK_MSG("sc_moe_routing_check");
        CHECK_NAMES_SLOT(2, 0, INT32_MAX);
        CHECK_OK(sc_moe_routing_check(SC_DEFAULT_STREAM, layer));

        /* ... or by the next checked forward, though its own routing is good. */
        memcpy(bad, ids, sizeof bad);
        bad[8 * k + 2] = m->E;
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.ids), bad, nk * 4) == SC_OK);
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out, &unchecked));
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.ids), ids, nk * 4) == SC_OK);
        CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out, &checked), SC_ERR_INVALID_ARGUMENT);
        CHECK_NAMES_SLOT(8, 2, m->E);
        CHECK_OK(sc_moe_routing_check(SC_DEFAULT_STREAM, layer));
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, x, out, &checked));
        io_free(&b);
        free_case(&tc);

        /* Any id < 0 is a padded slot, not an error. */
        memcpy(bad, ids, sizeof bad);
        bad[1 * k + 0] = -5;
        bad[4 * k + 2] = INT32_MIN;
        bad[6 * k + 0] = -1, bad[6 * k + 1] = -2, bad[6 * k + 2] = -3;
        build_case(&tc, m, &w, T, 404, bad, wts);
        io_make(&b, &tc);
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.ids), bad, nk * 4) == SC_OK);
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b.wts), wts, nk * 4) == SC_OK);
        poison(b.out, SC_BF16, 8);
        const sc_moe_forward_desc neg = {.routing_ids = sc_view_of(b.ids),
                                         .routing_weights = sc_view_of(b.wts),
                                         .check_routing = true};
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(b.x), sc_view_of(b.out), &neg));
        download(b.hout, n * 2, b.out);
        compare(&tc, bi, "ids < -1 padded", b.hout, NULL, NULL, false);

        /* Routing views of the wrong size; sc_moe_route's outputs checked like the
         * forward's. */
        sc_view short_ids;
        REQUIRE(sc_buffer_view(b.ids, 0, nk - 1, &short_ids) == SC_OK);
        poison(b.out, SC_BF16, 9);
        CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(b.x), sc_view_of(b.out),
                                    &(sc_moe_forward_desc){.routing_ids = short_ids,
                                                           .routing_weights = sc_view_of(b.wts)}),
                     SC_ERR_OUT_OF_BOUNDS);
        CHECK_MSG("routing_ids");
        CHECK_STATUS(sc_moe_route(SC_DEFAULT_STREAM, layer, sc_view_of(b.x), short_ids, sc_view_of(b.wts)),
                     SC_ERR_OUT_OF_BOUNDS);
        CHECK_MSG("sc_moe_route");
        CHECK_STATUS(sc_moe_route(SC_DEFAULT_STREAM, layer, sc_view_of(b.x), sc_view_of(b.wts), sc_view_of(b.wts2)),
                     SC_ERR_TYPE_MISMATCH);
        CHECK_MSG("sc_moe_route");
        /* Refused before anything ran: out keeps its poison. */
        download(b.hout, n * 2, b.out);
        uint64_t untouched = 0;
        for (uint64_t i = 0; i < n; i++)
            untouched += b.hout[i] == 0x7fc0 + 9;
        CHECK(untouched == n);
        io_free(&b);
        free_case(&tc);
        CHECK_OK(sc_moe_destroy(layer));
    }
    free_weights(&w);
}

static void test_desc_checks(void) { moe_desc_checks(the_ctx, true); }

int main(void)
{
    gpu_require();
    quick = getenv("SAFECUDA_UNDER_SANITIZER") != NULL;
    REQUIRE(sc_context_create(NULL, &the_ctx) == SC_OK);
    sc_device_props props;
    REQUIRE(sc_device_info(0, &props) == SC_OK);
    backends[n_backends++] = SC_MOE_BACKEND_MMA;
    if (props.cc_major == 9 && props.cc_minor == 0)
        backends[n_backends++] = SC_MOE_BACKEND_SM90;
    else
        printf("sm90 backend: not tested (device is sm_%d%d)\n", props.cc_major, props.cc_minor);
    if (quick)
        printf("SAFECUDA_UNDER_SANITIZER: a few small cases\n");

    TEST_RUN(test_desc_checks);
    TEST_RUN(test_models);
    TEST_RUN(test_caller_routing);
    TEST_RUN(test_bad_routing);

    size_t live = 0;
    CHECK_OK(sc_context_live_objects(the_ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(the_ctx));
    return test_result("test_gpu_moe_v2");
}
