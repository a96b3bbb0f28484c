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

#endif
