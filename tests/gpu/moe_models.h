/* What the multi-GPU MoE tests share (test_gpu_moe_tp.c, test_gpu_moe_ep.c): a model's full
 * weights made on the host from fresh random numbers (bf16 or e4m3 experts with block
 * scales, a shared expert, gpt-oss's biases), the buffers of a layer uploaded from them, and
 * the relative L2 error of a bf16 output against a reference. */
#ifndef SAFECUDA_TESTS_GPU_MOE_MODELS_H
#define SAFECUDA_TESTS_GPU_MOE_MODELS_H

#include <math.h>

#include "../bf16.h"
#include "../fp8.h"
#include "../test.h"
#include "safecuda/moe.h"

typedef struct model {
    const char *name;
    int E, k, H, I, Is; /* full sizes */
    bool fp8, interleaved, shared, gptoss;
    /* host: bf16 (uint16_t) or e4m3 (uint8_t) experts; f32 biases and scales */
    void *router, *w13, *w2, *sw13, *sw2;
    float *sel, *rbias, *b13, *b2, *w13s, *w2s, *sw13s, *sw2s;
} model;

typedef struct layer_bufs {
    sc_buffer b[14];
    int n;
    sc_moe layer, alt; /* alt: a second layer over the same weights, on ranks only (tensor
                        * parallel: reduce-scattering; expert parallel: low-latency) */
} layer_bufs;

static uint64_t seed = 0x5eed;

static inline float urand(void) { return (float)((double)(test_rand(&seed) >> 11) / 9007199254740992.0 * 2 - 1); }

static inline void *bf16_random(size_t n, float scale)
{
    uint16_t *p = test_xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        p[i] = f2bf(urand() * scale);
    return p;
}

static inline void *e4m3_random(size_t n)
{
    uint8_t *p = test_xmalloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = f_to_e4m3(urand() * 448.0f);
    return p;
}

static inline float *f32_random(size_t n, float lo, float hi)
{
    float *p = test_xmalloc(n * 4);
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * (urand() + 1) / 2;
    return p;
}

static inline void make_model(model *m)
{
    const size_t E = (size_t)m->E, H = (size_t)m->H, I = (size_t)m->I, Is = (size_t)m->Is;
    const float s13 = 1.0f / sqrtf((float)H), s2 = 1.0f / sqrtf((float)I);
    m->router = bf16_random(E * H, s13);
    if (m->fp8) {
        m->w13 = e4m3_random(E * 2 * I * H);
        m->w2 = e4m3_random(E * H * I);
        m->w13s = f32_random(E * (2 * I / 128) * (H / 128), 0.5f * s13 / 448, 1.5f * s13 / 448);
        m->w2s = f32_random(E * (H / 128) * (I / 128), 0.5f * s2 / 448, 1.5f * s2 / 448);
    } else {
        m->w13 = bf16_random(E * 2 * I * H, s13);
        m->w2 = bf16_random(E * H * I, s2);
    }
    if (m->shared) {
        if (m->fp8) {
            m->sw13 = e4m3_random(2 * Is * H);
            m->sw2 = e4m3_random(H * Is);
            m->sw13s = f32_random((2 * Is / 128) * (H / 128), 0.5f * s13 / 448, 1.5f * s13 / 448);
            m->sw2s = f32_random((H / 128) * (Is / 128), 0.5f * s2 / 448, 1.5f * s2 / 448);
        } else {
            m->sw13 = bf16_random(2 * Is * H, s13);
            m->sw2 = bf16_random(H * Is, s2);
        }
        m->sel = f32_random(E, -0.1f, 0.1f);
    }
    if (m->gptoss) {
        m->rbias = f32_random(E, -0.5f, 0.5f);
        m->b13 = f32_random(E * 2 * I, -0.5f, 0.5f);
        m->b2 = f32_random(E * H, -0.5f, 0.5f);
    }
}

static inline void free_model(model *m)
{
    void *all[] = {m->router, m->w13, m->w2, m->sw13, m->sw2, m->sel, m->rbias, m->b13,
                   m->b2, m->w13s, m->w2s, m->sw13s, m->sw2s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static inline sc_view upload(sc_context ctx, layer_bufs *lb, sc_dtype t, const void *data,
                             size_t count)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = t, .count = count}, &b) == SC_OK);
    size_t esize = t == SC_BF16 ? 2 : t == SC_F32 ? 4 : 1;
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), data, count * esize) == SC_OK);
    lb->b[lb->n++] = b;
    return sc_view_of(b);
}

static inline double rel_l2(const uint16_t *got, const uint16_t *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double g = bf2f(got[i]), w = bf2f(want[i]);
        num += (g - w) * (g - w);
        den += w * w;
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

/* ---- the rounds: 2 GPUs, then 4 (or --gpus N alone) -------------------------------------- */

#define MOE_MODELS_MAX_RANKS 8

/* One round's layers on n ranks (contexts on devices 0 .. n-1, a communicator over them);
 * fp8: the device takes fp8 experts (compute capability 9.0). */
typedef void (*moe_round_fn)(sc_context *ctxs, sc_comm *comms, int n, bool fp8);

/* A multi-GPU test's main: --gpus N (2 .. 8: that many ranks only; other arguments are the
 * test's own), then a round on 2 GPUs and one on 4 when there are; skipped (77), saying why,
 * with fewer than 2 GPUs (or N) or without NCCL. `layer` names the layer in the skip line
 * ("the tensor-parallel layer"); `label` the communicators. The exit status. (A macro: the
 * GPU check names the test's file.) */
#define moe_rounds(argc, argv, name, layer, label, round)                                     \
    moe_rounds_in(test_basename_(__FILE__), argc, argv, name, layer, label, round)
static inline int moe_rounds_in(const char *file, int argc, char **argv, const char *name,
                                const char *layer, const char *label, moe_round_fn round)
{
    int want = 0;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--gpus") == 0)
            want = atoi(argv[i + 1]);
    if (want < 0 || want > MOE_MODELS_MAX_RANKS) {
        fprintf(stderr, "%s: --gpus %d: 2 .. %d\n", name, want, MOE_MODELS_MAX_RANKS);
        return 2;
    }
    gpu_presence_require(file);
    int count = 0;
    REQUIRE(sc_device_count(&count) == SC_OK);
    if (count < 2 || (want && count < want)) {
        printf("%s: skipped: %d GPU%s here; %s needs %d\n", name, count, count == 1 ? "" : "s",
               layer, want ? want : 2);
        return 77;
    }
    int v = 0;
    if (sc_comm_library_version(&v) != SC_OK) {
        printf("%s: skipped: no NCCL: %s\n", name, sc_last_error());
        return 77;
    }
    sc_device_props dp;
    REQUIRE(sc_device_info(0, &dp) == SC_OK);
    const bool fp8 = dp.cc_major == 9 && dp.cc_minor == 0;
    if (!fp8)
        printf("fp8 experts: skipped (compute capability %d.%d, not 9.0)\n", dp.cc_major,
               dp.cc_minor);
    const int rounds[] = {2, 4};
    for (int k = 0; k < 2; k++) {
        const int n = want ? want : rounds[k];
        if (n > count || (want && k > 0))
            break;
        sc_context ctxs[MOE_MODELS_MAX_RANKS];
        sc_comm comms[MOE_MODELS_MAX_RANKS];
        for (int r = 0; r < n; r++)
            REQUIRE(sc_context_create(&(sc_context_desc){.device = r}, &ctxs[r]) == SC_OK);
        REQUIRE(sc_comm_create_all(ctxs, n, &(sc_comm_all_desc){.label = label}, comms) ==
                SC_OK);
        round(ctxs, comms, n, fp8);
        for (int r = 0; r < n; r++)
            CHECK_OK(sc_comm_destroy(comms[r]));
        for (int r = 0; r < n; r++)
            CHECK_OK(sc_context_destroy(ctxs[r]));
    }
    return test_result(name);
}

#endif
