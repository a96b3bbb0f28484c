/* The MoE layer against a CPU reference in double precision, on fresh random data with the
 * output poisoned first: the four model configurations at small T, odd shapes at several
 * T, empty experts, all tokens routed to the same experts, workspace growth, bitwise
 * repeatability, and the desc checks. */
#include <math.h>

#include "../bf16.h"
#include "../test.h"
#include "safecuda/moe.h"

static bool quick; /* under compute-sanitizer: fewer and smaller cases */
static sc_moe_backend backend; /* the GEMMs under test */
static const char *const backend_name[] = {"auto", "mma", "sm90"};

/* ---- weights ----------------------------------------------------------------------------
 * Expert weights come from one random block of NB values on the device, copied into each
 * expert at an expert-specific offset: cheap to build even for 256 experts, and the CPU
 * reference reads the same values from the host copy of the block. */

#define NB ((1u << 22) + 17u)

typedef struct model {
    int E, k, H, I;
    sc_moe_scoring scoring;
    bool renormalize, bias;
    bool zero_router; /* all logits equal: ties choose experts 0..k-1 */
} model;

typedef struct weights {
    uint16_t *b13, *b2; /* NB random bf16 values each, scaled for W13 and W2 */
    float *bias;        /* [E] or NULL */
    uint16_t *router;   /* [E, H] */
    sc_buffer drouter, dw13, dw2, dbias;
} weights;

static uint64_t w13_offset(int e) { return (uint64_t)e * 1000003u % NB; }
static uint64_t w2_offset(int e) { return ((uint64_t)e * 7919u + 12345u) % NB; }

/* value i (flattened within the expert) of W13[e] / W2[e], as the device holds it */
static double w13_at(const weights *w, int e, uint64_t i)
{
    return bf2f(w->b13[(w13_offset(e) + i) % NB]);
}
static double w2_at(const weights *w, int e, uint64_t i)
{
    return bf2f(w->b2[(w2_offset(e) + i) % NB]);
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

static double uniform(uint64_t *seed) /* [-1, 1) */
{
    return (double)(test_rand(seed) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static sc_buffer upload_block(sc_context ctx, const uint16_t *host, const char *label)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = NB, .label = label}, &b) == SC_OK);
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), host, NB * 2) == SC_OK);
    return b;
}

static void make_weights(sc_context ctx, const model *m, weights *w, uint64_t seed)
{
    memset(w, 0, sizeof *w);
    const uint64_t E = m->E, H = m->H, I = m->I;
    /* Values ~ U(-1, 1) / sqrt(fan-in) keep the activations O(1). */
    double s13 = 1.0 / sqrt((double)H), s2 = 1.0 / sqrt((double)I);
    w->b13 = malloc(NB * sizeof *w->b13);
    w->b2 = malloc(NB * sizeof *w->b2);
    REQUIRE(w->b13 && w->b2);
    for (uint32_t i = 0; i < NB; i++) {
        w->b13[i] = f2bf((float)(uniform(&seed) * s13));
        w->b2[i] = f2bf((float)(uniform(&seed) * s2));
    }
    sc_buffer d13 = upload_block(ctx, w->b13, "block13"), d2 = upload_block(ctx, w->b2, "block2");
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = E * 2 * I * H, .label = "w13"}, &w->dw13) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = E * H * I, .label = "w2"}, &w->dw2) == SC_OK);
    for (int e = 0; e < m->E; e++) {
        fill_from_block(w->dw13, (uint64_t)e * 2 * I * H, 2 * I * H, d13, w13_offset(e));
        fill_from_block(w->dw2, (uint64_t)e * H * I, H * I, d2, w2_offset(e));
    }
    sc_buffer_destroy(d13);
    sc_buffer_destroy(d2);

    /* Router [E, H] random (or zero: all scores equal). */
    w->router = malloc(E * H * sizeof *w->router);
    REQUIRE(w->router);
    for (uint64_t i = 0; i < E * H; i++)
        w->router[i] = m->zero_router ? 0 : f2bf((float)(uniform(&seed) * s13));
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = E * H, .label = "router"}, &w->drouter) == SC_OK);
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(w->drouter), w->router, E * H * 2) == SC_OK);
    if (m->bias) {
        w->bias = malloc(E * sizeof *w->bias);
        for (uint64_t e = 0; e < E; e++)
            w->bias[e] = (float)((double)(test_rand(&seed) % 1000) / 10000.0);
        REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = E, .label = "bias"}, &w->dbias) == SC_OK);
        REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(w->dbias), w->bias, E * 4) == SC_OK);
    }
}

static void free_weights(weights *w)
{
    sc_buffer bufs[] = {w->dw13, w->dw2, w->drouter, w->dbias};
    for (size_t i = 0; i < 4; i++)
        if (bufs[i].id)
            sc_buffer_destroy(bufs[i]);
    free(w->b13);
    free(w->b2);
    free(w->router);
    free(w->bias);
}

/* ---- the reference ------------------------------------------------------------------------ */

static double silu(double g) { return g / (1.0 + exp(-g)); }

/* Scores (softmax or sigmoid) and selection scores of one token. */
static void ref_scores(const model *m, const weights *w, const uint16_t *x, double *score,
                       double *sel)
{
    double mx = -INFINITY;
    for (int e = 0; e < m->E; e++) {
        double acc = 0;
        for (int h = 0; h < m->H; h++)
            acc += (double)bf2f(x[h]) * bf2f(w->router[(size_t)e * m->H + h]);
        score[e] = acc;
        if (acc > mx)
            mx = acc;
    }
    double sum = 0;
    for (int e = 0; e < m->E; e++) {
        score[e] = m->scoring == SC_MOE_SOFTMAX ? exp(score[e] - mx) : 1.0 / (1.0 + exp(-score[e]));
        sum += score[e];
    }
    for (int e = 0; e < m->E; e++) {
        if (m->scoring == SC_MOE_SOFTMAX)
            score[e] /= sum;
        sel[e] = score[e] + (w->bias ? w->bias[e] : 0.0);
    }
}

/* y_e(x) accumulated into out with weight wt. */
static void ref_expert(const model *m, const weights *w, int e, const uint16_t *x, double wt,
                       double *out, double *hbuf)
{
    const uint64_t H = m->H, I = m->I;
    for (uint64_t i = 0; i < I; i++) {
        double g = 0, u = 0;
        for (uint64_t h = 0; h < H; h++) {
            double xv = bf2f(x[h]);
            g += xv * w13_at(w, e, i * H + h);
            u += xv * w13_at(w, e, (I + i) * H + h);
        }
        hbuf[i] = silu(g) * u;
    }
    for (uint64_t o = 0; o < H; o++) {
        double acc = 0;
        for (uint64_t i = 0; i < I; i++)
            acc += hbuf[i] * w2_at(w, e, o * I + i);
        out[o] += wt * acc;
    }
}

/* ---- one forward against the reference ----------------------------------------------------- */

static uint16_t *random_x(uint64_t n, uint64_t *seed)
{
    uint16_t *x = malloc(n * sizeof *x);
    REQUIRE(x);
    for (uint64_t i = 0; i < n; i++)
        x[i] = f2bf((float)((double)(test_rand(seed) >> 11) / 9007199254740992.0 * 2.0 - 1.0));
    return x;
}

/* Run T tokens through layer and compare. Returns the relative L2 error. */
static double check_forward(sc_context ctx, const model *m, const weights *w, sc_moe layer,
                            uint64_t T, uint64_t seed, const char *name)
{
    const uint64_t H = m->H, k = m->k;
    uint16_t *x = random_x(T * H, &seed);
    uint16_t *out = malloc(T * H * 2);
    int32_t *ids = malloc(T * k * 4);
    float *wts = malloc(T * k * 4);
    REQUIRE(out && ids && wts);
    sc_buffer dx, dout, dids, dwts;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = T * H, .label = "x"}, &dx) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = T * H, .label = "out"}, &dout) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_I32, .count = T * k, .label = "ids"}, &dids) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = T * k, .label = "wts"}, &dwts) == SC_OK);
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(dx), x, T * H * 2) == SC_OK);
    const uint16_t nan_bits = 0x7fc0;
    const int32_t bad_id = -1;
    const float nan_f = NAN;
    REQUIRE(sc_fill(SC_DEFAULT_STREAM, sc_view_of(dout), &nan_bits) == SC_OK); /* poison */
    REQUIRE(sc_fill(SC_DEFAULT_STREAM, sc_view_of(dids), &bad_id) == SC_OK);
    REQUIRE(sc_fill(SC_DEFAULT_STREAM, sc_view_of(dwts), &nan_f) == SC_OK);
    sc_status s = sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(dx), sc_view_of(dout),
                                 &(sc_moe_forward_desc){.expert_ids = sc_view_of(dids),
                                                        .expert_weights = sc_view_of(dwts)});
    CHECK_OK(s);
    REQUIRE(sc_copy_to_host(SC_DEFAULT_STREAM, out, T * H * 2, sc_view_of(dout)) == SC_OK);
    REQUIRE(sc_copy_to_host(SC_DEFAULT_STREAM, ids, T * k * 4, sc_view_of(dids)) == SC_OK);
    REQUIRE(sc_copy_to_host(SC_DEFAULT_STREAM, wts, T * k * 4, sc_view_of(dwts)) == SC_OK);

    double *score = malloc(m->E * sizeof *score), *sel = malloc(m->E * sizeof *sel);
    double *ref = calloc(H, sizeof *ref), *hbuf = malloc(m->I * sizeof *hbuf);
    REQUIRE(score && sel && ref && hbuf);
    double err2 = 0, ref2 = 0;
    int routing_bad = 0, nonfinite = 0;
    /* The reference is expensive: check every token for small T, a sample for large T. */
    uint64_t step = T <= 64 ? 1 : T / 48;
    for (uint64_t t = 0; t < T; t += step) {
        const uint16_t *xt = x + t * H;
        ref_scores(m, w, xt, score, sel);
        /* The GPU's choice must be a valid top-k of the reference selection scores (fp32 vs
         * double may swap near-ties), in descending order, with matching weights. */
        double kth = -INFINITY;
        {
            double *sorted = malloc(m->E * sizeof *sorted);
            memcpy(sorted, sel, m->E * sizeof *sorted);
            for (uint64_t j = 0; j < k; j++) { /* partial selection of the k-th largest */
                int best = (int)j;
                for (int e = (int)j + 1; e < m->E; e++)
                    if (sorted[e] > sorted[best])
                        best = e;
                double tmp = sorted[j];
                sorted[j] = sorted[best];
                sorted[best] = tmp;
            }
            kth = sorted[k - 1];
            free(sorted);
        }
        double wsum = 0;
        for (uint64_t j = 0; j < k; j++) {
            int e = ids[t * k + j];
            if (e < 0 || e >= m->E || sel[e] < kth - 1e-5) {
                routing_bad++;
                continue;
            }
            for (uint64_t j2 = 0; j2 < j; j2++)
                if (ids[t * k + j2] == e)
                    routing_bad++;
            wsum += score[e];
        }
        memset(ref, 0, H * sizeof *ref);
        for (uint64_t j = 0; j < k; j++) {
            int e = ids[t * k + j];
            if (e < 0 || e >= m->E)
                continue;
            double wt = m->renormalize ? score[e] / wsum : score[e];
            if (fabs(wt - wts[t * k + j]) > 1e-4 * fmax(1.0, fabs(wt)))
                routing_bad++;
            ref_expert(m, w, e, xt, wt, ref, hbuf);
        }
        for (uint64_t h = 0; h < H; h++) {
            double o = bf2f(out[t * H + h]);
            if (!isfinite(o))
                nonfinite++;
            err2 += (o - ref[h]) * (o - ref[h]);
            ref2 += ref[h] * ref[h];
        }
    }
    /* Every element was written (the poison is gone) even where the reference skipped. */
    for (uint64_t i = 0; i < T * H; i++)
        if (!isfinite(bf2f(out[i])))
            nonfinite++;
    double rel = sqrt(err2 / (ref2 > 0 ? ref2 : 1));
    printf("%-5s %-28s T=%-5llu rel L2 error %.2e%s%s\n", backend_name[backend], name,
           (unsigned long long)T, rel,
           routing_bad ? " ROUTING MISMATCH" : "", nonfinite ? " NON-FINITE OUTPUT" : "");
    CHECK(routing_bad == 0);
    CHECK(nonfinite == 0);
    CHECK(rel <= 1e-2);
    CHECK(ref2 > 0);
    if (m->zero_router) /* equal scores: ties go to the lowest indices, in order */
        for (uint64_t t = 0; t < T; t++)
            for (uint64_t j = 0; j < k; j++)
                CHECK(ids[t * k + j] == (int)j);
    free(score); free(sel); free(ref); free(hbuf);
    free(x); free(out); free(ids); free(wts);
    sc_buffer_destroy(dx); sc_buffer_destroy(dout); sc_buffer_destroy(dids); sc_buffer_destroy(dwts);
    return rel;
}

static sc_moe make_layer(sc_context ctx, const model *m, const weights *w, uint64_t max_tokens)
{
    sc_moe layer;
    sc_status s = sc_moe_create(ctx, &(sc_moe_desc){.experts = m->E, .top_k = m->k,
                                                    .hidden = m->H, .intermediate = m->I,
                                                    .scoring = m->scoring,
                                                    .renormalize = m->renormalize,
                                                    .router = w->drouter, .w13 = w->dw13,
                                                    .w2 = w->dw2, .selection_bias = w->dbias,
                                                    .max_tokens = max_tokens, .label = "moe",
                                                    .backend = backend},
                                &layer);
    REQUIRE(s == SC_OK);
    return layer;
}

static void run_model(sc_context ctx, const char *name, model m, const uint64_t *Ts, int nT,
                      uint64_t max_tokens, uint64_t seed)
{
    weights w;
    make_weights(ctx, &m, &w, seed);
    sc_moe layer = make_layer(ctx, &m, &w, max_tokens);
    for (int i = 0; i < nT; i++)
        check_forward(ctx, &m, &w, layer, Ts[i], seed + 100 + (uint64_t)i, name);
    CHECK_OK(sc_moe_destroy(layer));
    free_weights(&w);
}

/* ---- repeatability and errors ----------------------------------------------------------------- */

static void test_repeatable(sc_context ctx)
{
    model m = {40, 3, 1544, 648, SC_MOE_SOFTMAX, true, false, false};
    weights w;
    make_weights(ctx, &m, &w, 77);
    sc_moe layer = make_layer(ctx, &m, &w, 64);
    const uint64_t T = quick ? 67 : 1000, H = m.H;
    uint64_t seed = 5;
    uint16_t *x = random_x(T * H, &seed), *first = malloc(T * H * 2), *again = malloc(T * H * 2);
    sc_buffer dx, dout;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = T * H}, &dx) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = T * H}, &dout) == SC_OK);
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(dx), x, T * H * 2) == SC_OK);
    int differ = 0;
    for (int run = 0; run < 10; run++) {
        const uint16_t poison = (uint16_t)(0x7fc0 + run);
        CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(dout), &poison));
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(dx), sc_view_of(dout), NULL));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, run ? again : first, T * H * 2, sc_view_of(dout)));
        if (run && memcmp(first, again, T * H * 2) != 0)
            differ++;
    }
    printf("bitwise repeatability: %d of 9 repeated runs differ\n", differ);
    CHECK(differ == 0);
    /* Bad arguments to forward. */
    sc_buffer f32;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = T * H}, &f32) == SC_OK);
    CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(f32), sc_view_of(dout), NULL), SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("sc_moe_forward");
    sc_view part;
    REQUIRE(sc_buffer_view(dx, 0, H + 1, &part) == SC_OK);
    CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, part, sc_view_of(dout), NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("H = 1544");
    CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(dx), sc_view_of(dx), NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("overlaps");
    /* x must start 16-byte aligned (the kernels move 16-byte vectors). */
    sc_view shifted;
    REQUIRE(sc_buffer_view(dx, 4, H, &shifted) == SC_OK);
    sc_view out1;
    REQUIRE(sc_buffer_view(dout, 0, H, &out1) == SC_OK);
    CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, shifted, out1, NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("multiple of 8");
    /* Bad optional outputs are refused before anything runs: out keeps its poison. */
    {
        const uint16_t poison = 0x7fd1;
        const uint64_t rows = T * 3;
        CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(dout), &poison));
        sc_buffer ids_f32, ids_short;
        REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = rows, .label = "ids-f32"}, &ids_f32) == SC_OK);
        REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_I32, .count = rows - 1, .label = "ids-short"}, &ids_short) == SC_OK);
        CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(dx), sc_view_of(dout),
                                    &(sc_moe_forward_desc){.expert_ids = sc_view_of(ids_f32)}),
                     SC_ERR_TYPE_MISMATCH);
        CHECK_MSG("opts->expert_ids (buffer 'ids-f32'");
        CHECK_MSG("it must be i32");
        CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(dx), sc_view_of(dout),
                                    &(sc_moe_forward_desc){.expert_ids = sc_view_of(ids_short)}),
                     SC_ERR_OUT_OF_BOUNDS);
        CHECK_MSG("opts->expert_ids has");
        CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(dx), sc_view_of(dout),
                                    &(sc_moe_forward_desc){.expert_weights = sc_view_of(ids_short)}),
                     SC_ERR_TYPE_MISMATCH);
        CHECK_MSG("opts->expert_weights");
        uint16_t *after = malloc(T * H * 2);
        REQUIRE(after != NULL);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, after, T * H * 2, sc_view_of(dout)));
        size_t untouched = 0;
        for (uint64_t i = 0; i < T * H; i++)
            untouched += after[i] == poison;
        CHECK(untouched == T * H);
        free(after);
        sc_buffer_destroy(ids_f32);
        sc_buffer_destroy(ids_short);
    }
    /* The profile: every step timed, the forward waited for. */
    sc_moe_profile prof;
    memset(&prof, 0xff, sizeof prof);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(dx), sc_view_of(dout),
                            &(sc_moe_forward_desc){.profile = &prof}));
    CHECK(prof.steps >= 7 && prof.steps <= SC_MOE_MAX_STEPS);
    double sum = 0;
    for (int i = 0; i < prof.steps && i < SC_MOE_MAX_STEPS; i++) {
        CHECK(prof.name[i] != NULL && prof.ms[i] >= 0.0f);
        sum += prof.ms[i];
        printf("  %-24s %8.3f ms\n", prof.name[i] ? prof.name[i] : "?", (double)prof.ms[i]);
    }
    CHECK(prof.total_ms > 0.0f && fabs(sum - prof.total_ms) <= 0.01 * prof.total_ms + 0.01);

    sc_buffer_destroy(f32);
    /* A destroyed weight buffer makes the layer's forward a stale-handle error. */
    sc_buffer_destroy(w.dw2);
    CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(dx), sc_view_of(dout), NULL), SC_ERR_STALE_HANDLE);
    CHECK_MSG("stale buffer handle");
    w.dw2.id = 0;
    CHECK_OK(sc_moe_destroy(layer));
    CHECK_STATUS(sc_moe_destroy(layer), SC_ERR_STALE_HANDLE);
    sc_buffer_destroy(dx);
    sc_buffer_destroy(dout);
    free_weights(&w);
    free(x); free(first); free(again);
}

static void test_bad_descs(sc_context ctx)
{
    sc_buffer r, a, b, f;
    const int E = 8, H = 64, I = 32;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = E * H, .label = "r"}, &r) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = E * 2 * I * H, .label = "a"}, &a) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = E * H * I, .label = "b"}, &b) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = E * H, .label = "f"}, &f) == SC_OK);
    sc_moe l;
    sc_moe_desc ok = {.experts = E, .top_k = 2, .hidden = H, .intermediate = I, .router = r, .w13 = a, .w2 = b};
    CHECK_OK(sc_moe_create(ctx, &ok, &l));
    CHECK_OK(sc_moe_destroy(l));
    sc_moe_desc d = ok;
    d.top_k = 9;
    CHECK_STATUS(sc_moe_create(ctx, &d, &l), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("top_k = 9");
    CHECK(l.id == 0);
    d = ok; d.hidden = 60;
    CHECK_STATUS(sc_moe_create(ctx, &d, &l), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("hidden = 60");
    d = ok; d.intermediate = 36;
    CHECK_STATUS(sc_moe_create(ctx, &d, &l), SC_ERR_INVALID_ARGUMENT);
    d = ok; d.router = f;
    CHECK_STATUS(sc_moe_create(ctx, &d, &l), SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("desc->router");
    d = ok; d.w13 = b; /* wrong shape */
    CHECK_STATUS(sc_moe_create(ctx, &d, &l), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("desc->w13");
    CHECK_MSG("[E=8, 2I=64, H=64]");
    d = ok; d.dtype = SC_F16;
    CHECK_STATUS(sc_moe_create(ctx, &d, &l), SC_ERR_NOT_SUPPORTED);
    d = ok; d.experts = 300;
    CHECK_STATUS(sc_moe_create(ctx, &d, &l), SC_ERR_INVALID_ARGUMENT);
    d = ok; d.selection_bias = r; /* bf16, not f32 */
    CHECK_STATUS(sc_moe_create(ctx, &d, &l), SC_ERR_TYPE_MISMATCH);
    CHECK_STATUS(sc_moe_create(ctx, NULL, &l), SC_ERR_INVALID_ARGUMENT);
    sc_buffer_destroy(r); sc_buffer_destroy(a); sc_buffer_destroy(b); sc_buffer_destroy(f);
}

static void run_backend(sc_context ctx)
{

    const uint64_t odd_T[] = {1, 7, 129, 1000};
    model odd = {40, 3, 1544, 648, SC_MOE_SOFTMAX, true, false, false};
    run_model(ctx, "odd E=40 k=3 H=1544 I=648", odd, odd_T, quick ? 2 : 4, 16, 11);
    model odd_sig = {40, 3, 1544, 648, SC_MOE_SIGMOID, false, true, false};
    run_model(ctx, "odd, sigmoid + bias", odd_sig, odd_T + 1, 2, 0, 12);
    /* All logits equal: every token goes to experts 0..k-1, the others get none. */
    model same = {40, 3, 1544, 648, SC_MOE_SOFTMAX, true, false, true};
    const uint64_t same_T[] = {129};
    run_model(ctx, "all tokens to experts 0..2", same, same_T, 1, 4, 13);

    if (!quick) {
        const uint64_t small_T[] = {5};
        model mixtral = {8, 2, 4096, 14336, SC_MOE_SOFTMAX, true, false, false};
        model qwen3 = {128, 8, 2048, 768, SC_MOE_SOFTMAX, true, false, false};
        model olmoe = {64, 8, 2048, 1024, SC_MOE_SOFTMAX, false, false, false};
        model dsv3 = {256, 8, 7168, 2048, SC_MOE_SIGMOID, true, true, false};
        run_model(ctx, "mixtral-8x7b", mixtral, small_T, 1, 0, 21);
        run_model(ctx, "qwen3-30b-a3b", qwen3, small_T, 1, 0, 22);
        run_model(ctx, "olmoe", olmoe, small_T, 1, 0, 23);
        run_model(ctx, "deepseek-v3", dsv3, small_T, 1, 0, 24);
    }
    /* Prefill-sized: more than 128 rows per expert, several M tiles each (the large SM90
     * tile), the reference on a sample of the tokens. */
    if (!quick) {
        const uint64_t big_T[] = {2048};
        model qwen3 = {128, 8, 2048, 768, SC_MOE_SOFTMAX, true, false, false};
        model olmoe = {64, 8, 2048, 1024, SC_MOE_SOFTMAX, false, false, false};
        run_model(ctx, "qwen3-30b-a3b", qwen3, big_T, 1, 0, 25);
        run_model(ctx, "olmoe", olmoe, big_T, 1, 0, 26);
        const uint64_t odd_big_T[] = {3001};
        run_model(ctx, "odd E=40 k=3 H=1544 I=648", odd, odd_big_T, 1, 0, 27);
    } else {
        const uint64_t odd_big_T[] = {2000};
        run_model(ctx, "odd E=40 k=3 H=1544 I=648", odd, odd_big_T, 1, 0, 27);
    }
    test_repeatable(ctx);
}

int main(void)
{
    gpu_require();
    quick = getenv("SAFECUDA_UNDER_SANITIZER") != NULL;
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_device_props props;
    REQUIRE(sc_device_info(0, &props) == SC_OK);

    test_bad_descs(ctx);
    backend = SC_MOE_BACKEND_MMA;
    run_backend(ctx);
    if (props.cc_major == 9 && props.cc_minor == 0) {
        backend = SC_MOE_BACKEND_SM90;
        run_backend(ctx);
    } else {
        printf("sm90 backend: not tested (device is sm_%d%d)\n", props.cc_major, props.cc_minor);
    }

    size_t live = 0;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    return test_result("test_gpu_moe");
}
