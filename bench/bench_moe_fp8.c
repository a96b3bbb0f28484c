/* bench_moe --fp8: the fp8 twins' weights, floor and memory (bench_moe.c's header comment
 * describes the method).
 *
 * An fp8 twin is its bf16 layer with e4m3 experts (W13, W2 and the shared expert's) and one
 * f32 scale per 128 x 128 block of each (weight = e4m3 value x scale, the checkpoints'
 * weight_scale_inv), everything else the bf16 layer's own tensors (router, selection and
 * router biases, shared gate, expert biases: copied from it), so that both route alike.
 * The e4m3 bytes are cut from a random block like the bf16 weights: 32 MiB of N(0, 1) x 64
 * rounded to e4m3 (nearest, ties to even: the rounding of tests/fp8.h; |values| stay below
 * 448, never NaN) made on the host, uploaded, and copied into each expert from random
 * offsets on the device. A block's scale is 1 / (64 sqrt(fan-in)) times a uniform factor in
 * [0.75, 1.25), so the dequantized weights have the bf16 weights' spread (N(0, 1/sqrt(fan-in))
 * within 2 %) and the scales differ from block to block. */
#include "bench_moe.h"

#define E4M3_SPREAD 64.0 /* the block's values: N(0, 1) x this, rounded to e4m3 */

bool fp8_eligible(const moe_config *c, char *why, size_t size)
{
    const int B = FP8_BLOCK;
    const bool ok = c->H % B == 0 && c->I % B == 0 && c->shared_I % B == 0;
    if (!ok && why) {
        char is[32] = "";
        if (c->shared_I)
            snprintf(is, sizeof is, ", I_s=%d", c->shared_I);
        snprintf(why, size, "H=%d, I=%d%s: not all multiples of %d (fp8 weights have a scale "
                 "per %d x %d block)", c->H, c->I, is, B, B, B);
    }
    return ok;
}

/* ---- e4m3 on the host (no libm) ------------------------------------------------------------- */

/* The value of e4m3 bits 0x00 .. 0x7e (the finite non-negative ones; OCP e4m3fn: bias 7,
 * 3 mantissa bits, subnormals below 2^-6, 0x7f NaN). */
static double e4m3_value(unsigned b)
{
    const unsigned e = b >> 3, m = b & 7;
    double v = e ? (double)(8 + m) : (double)m; /* x 2^(e - 10), or 2^-9 for subnormals */
    for (int s = (e ? (int)e : 1) - 10; s < 0; s++)
        v *= 0.5;
    for (int s = (e ? (int)e : 1) - 10; s > 0; s--)
        v *= 2.0;
    return v;
}

/* The nearest e4m3 value to v (ties to the even mantissa), saturating to +-448. */
static uint8_t to_e4m3(double v)
{
    const uint8_t sign = v < 0 ? 0x80 : 0;
    const double a = v < 0 ? -v : v;
    unsigned best = 0;
    double best_d = a;
    for (unsigned b = 1; b <= 0x7e; b++) {
        const double d = a > e4m3_value(b) ? a - e4m3_value(b) : e4m3_value(b) - a;
        if (d < best_d || (d == best_d && (b & 1) == 0)) {
            best = b;
            best_d = d;
        }
    }
    return (uint8_t)(sign | best);
}

/* A device block of BLOCK_ELEMS e4m3 values ~ N(0, 1) x E4M3_SPREAD (Irwin-Hall of 4 random
 * bytes, as make_block), made in the pinned staging buffer and uploaded. */
static sc_buffer make_block_e4m3(env *e)
{
    uint8_t table[4 * 255 + 1];
    const double sd = nolibm_sqrt(4.0 * (256.0 * 256.0 - 1.0) / 12.0);
    for (int s = 0; s <= 4 * 255; s++)
        table[s] = to_e4m3((s - 510) / sd * E4M3_SPREAD);
    void *ptr = NULL;
    uint64_t bytes = 0;
    SC_TRY(sc_host_buffer_ptr(e->staging, &ptr, &bytes)); /* waits for its last upload */
    uint8_t *v = ptr;
    uint64_t st = e->rng;
    for (uint64_t i = 0; i < BLOCK_ELEMS; i += 2) {
        const uint64_t r = bench_rand(&st);
        v[i] = table[(r & 0xff) + ((r >> 8) & 0xff) + ((r >> 16) & 0xff) + ((r >> 24) & 0xff)];
        v[i + 1] = table[((r >> 32) & 0xff) + ((r >> 40) & 0xff) + ((r >> 48) & 0xff) +
                         (r >> 56)];
    }
    e->rng = st;
    sc_buffer b = new_buffer(e, SC_F8E4M3, BLOCK_ELEMS, "random block e4m3 N(0,1) x 64");
    SC_TRY(sc_copy_from_host_buffer(e->st, sc_view_of(b), e->staging, 0));
    return b;
}

/* The block scales of a tensor: 1 / (E4M3_SPREAD sqrt(fan_in)) times a uniform factor in
 * [0.75, 1.25) per block, made on the host. */
static void upload_scales(env *e, const tensor *t, double fan_in)
{
    const double base = 1.0 / (E4M3_SPREAD * nolibm_sqrt(fan_in));
    float *v = bench_xmalloc(t->count * sizeof *v);
    for (uint64_t i = 0; i < t->count; i++)
        v[i] = (float)(base * (0.75 + 0.5 * (double)(bench_rand(&e->rng) >> 11) /
                                           9007199254740992.0));
    SC_TRY(sc_copy_from_host(e->st, t->v, v, t->count * sizeof *v));
    free(v);
}

/* ---- the weights ----------------------------------------------------------------------------- */

/* The tensors a twin takes from its bf16 layer. */
static const int kept_ids[] = {W_ROUTER,   W_SHARED_GATE, W_SEL_BIAS,
                               W_ROUTER_BIAS, W_W13_BIAS, W_W2_BIAS};
#define N_KEPT (sizeof kept_ids / sizeof kept_ids[0])

void kept_save(env *e, const layer_weights *w, kept_tensors *kept)
{
    kept_free(kept);
    for (size_t i = 0; i < N_KEPT; i++) {
        const tensor *t = &w->t[kept_ids[i]];
        if (!t->count)
            continue;
        const uint64_t bytes = t->count * sc_dtype_size(t->dtype);
        kept->host[kept_ids[i]] = bench_xmalloc(bytes);
        SC_TRY(sc_copy_to_host(e->st, kept->host[kept_ids[i]], bytes, t->v));
    }
}

void kept_free(kept_tensors *kept)
{
    for (int i = 0; i < W_COUNT; i++) {
        free(kept->host[i]);
        kept->host[i] = NULL;
    }
}

void weights_fill_fp8(env *e, const moe_config *c, layer_weights *w, const kept_tensors *kept)
{
    const uint64_t E = (uint64_t)c->E, H = (uint64_t)c->H, I = (uint64_t)c->I;
    const tensor *t = w->t;
    sc_buffer blk = make_block_e4m3(e);
    for (uint64_t x = 0; x < E; x++) {
        fill_random(e, t[W_W13].buf, t[W_W13].off + x * 2 * I * H, 2 * I * H, blk);
        fill_random(e, t[W_W2].buf, t[W_W2].off + x * H * I, H * I, blk);
    }
    upload_scales(e, &t[W_W13_SCALE], (double)H);
    upload_scales(e, &t[W_W2_SCALE], (double)I);
    if (t[W_SHARED_W13].count) { /* fan-in as the bf16 layer's: H, and I for W2 (its note) */
        fill_random(e, t[W_SHARED_W13].buf, t[W_SHARED_W13].off, t[W_SHARED_W13].count, blk);
        fill_random(e, t[W_SHARED_W2].buf, t[W_SHARED_W2].off, t[W_SHARED_W2].count, blk);
        upload_scales(e, &t[W_SHARED_W13_SCALE], (double)H);
        upload_scales(e, &t[W_SHARED_W2_SCALE], (double)I);
    }
    /* The bf16 layer's router, vectors, gate and biases; random like its own where there are
     * none to copy (its points did not fit, so it made no weights). */
    sc_buffer blk_h = {0};
    for (size_t i = 0; i < N_KEPT; i++) {
        const int id = kept_ids[i];
        const tensor *s = &t[id];
        if (!s->count)
            continue;
        if (kept && kept->host[id]) {
            SC_TRY(sc_copy_from_host(e->st, s->v, kept->host[id],
                                     s->count * sc_dtype_size(s->dtype)));
        } else if (s->dtype == SC_BF16) {
            if (!blk_h.id)
                blk_h = make_block(e, 1.0 / nolibm_sqrt((double)H), "random block 1/sqrt(H)");
            fill_random(e, s->buf, s->off, s->count, blk_h);
        } else {
            upload_uniform(e, s, id == W_SEL_BIAS ? 0.05f : 0.1f);
        }
    }
    SC_TRY(sc_buffer_destroy(blk)); /* after the copies from them (stream-ordered) */
    if (blk_h.id)
        SC_TRY(sc_buffer_destroy(blk_h));
    SC_TRY(sc_stream_synchronize(e->st));
}

/* ---- floor and memory ----------------------------------------------------------------------- */

floor_terms floor_for_fp8(const moe_config *c, uint64_t T, int used, const rates *r)
{
    const double E = c->E, k = c->k, H = c->H, I = c->I, Is = c->shared_I, t = (double)T;
    const double B2 = (double)FP8_BLOCK * FP8_BLOCK; /* elements per scale */
    const double gate = c->shared_gate ? 1.0 : 0.0;
    const double per_expert = 3.0 * H * I * (1.0 + 4.0 / B2) + (c->w13_bias ? 2.0 * I * 4.0 : 0.0) +
                              (c->w2_bias ? H * 4.0 : 0.0);
    floor_terms f;
    f.weight_bytes = used * per_expert                                  /* routed, used */
                     + E * H * 2.0 + ((c->bias ? E : 0) + (c->router_bias ? E : 0)) * 4.0
                     + 3.0 * H * Is * (1.0 + 4.0 / B2) + gate * H * 2.0; /* shared: always */
    f.bytes = f.weight_bytes + 2.0 * t * H * 2.0;                      /* x and out, bf16 */
    const double bf16_flops = 2.0 * t * E * H + gate * 2.0 * t * H;   /* router, gate row */
    const double f8_flops = 2.0 * t * k * 3.0 * H * I + 2.0 * t * 3.0 * H * Is;
    f.flops = bf16_flops + f8_flops;
    f.bw_ms = f.bytes / (r->mem_tbs * 1e12) * 1e3;
    f.flop_ms = (bf16_flops / (r->tflops * 1e12) + f8_flops / (r->f8_tflops * 1e12)) * 1e3;
    f.floor_ms = f.bw_ms > f.flop_ms ? f.bw_ms : f.flop_ms;
    return f;
}

uint64_t workspace_bound_fp8(const moe_config *c, uint64_t T)
{
    const uint64_t E = (uint64_t)c->E, k = (uint64_t)c->k, H = (uint64_t)c->H,
                   I = (uint64_t)c->I, S = ((uint64_t)c->shared_I + I - 1) / I,
                   rows = T * (k + S), B = FP8_BLOCK;
    const uint64_t split_rows = (T < 2048 ? T : 2048) * 16;
    const uint64_t logit_rows = T > split_rows ? T : split_rows;
    /* logits, ids and weights, per-row indices and weights, y (bf16), x and h in e4m3 with
     * an f32 scale per 128 channels, the small vectors */
    return logit_rows * (E + 1) * 4 + T * k * 8 + rows * 4 * 3 + T * 4 + rows * H * 2 +
           rows * (H + H / B * 4) + rows * (I + I / B * 4) + (4 * (E + S) + 8) * 4;
}
