/* FP8 quantization on a real GPU (include/safecuda/quant.h) against the host reference of
 * tests/quant_ref.h, bit for bit:
 *   - weights (128 x 128 blocks) and tokens (1 x 128 groups) on fresh random bf16 data whose
 *     magnitude changes from block to block (2^-133 .. 2^120: bf16 subnormals, blocks below
 *     2^-64, huge ones), with exact zeros, an all-zero block, edge blocks (300 x 200), a
 *     batch of 3, views at odd offsets with a column count that is not a multiple of 8 (the
 *     element-wise path), every output poisoned first and guarded on both sides;
 *   - scales and q bytes equal to the reference's, every one: the rule is one correctly
 *     rounded f32 operation per step and the e4m3 rounding is specified (nearest even,
 *     saturating), so there is nothing to tolerate; the one allowance is the sign bit of a
 *     NaN (NaN inputs, and inf x 0 in a block with an infinity), which the rule leaves open;
 *   - dequantized (bf16 and f32) equal to the reference's, and the round trip's relative
 *     L2 error per block within e4m3's (3 mantissa bits: 0.025 on average, at most 0.045 for
 *     any block or group);
 *   - NaN and infinity: a NaN stays where it was, an infinity makes its block's scale
 *     infinite (quant.h);
 *   - the calls captured into a graph and replayed;
 *   - bandwidth on large tensors (printed, and at least a quarter of the device's peak).
 * On a device older than sm_89 the calls must be refused (SC_ERR_NOT_SUPPORTED); the test
 * then checks that and skips. */
#include <math.h>

#include "../quant_ref.h"
#include "../test.h"
#include "safecuda/quant.h"

static sc_context ctx;
static sc_stream st;
static sc_device_props dev;
static bool sanitizer;

#define GUARD 24 /* elements of poison on each side of every view */

/* ---- data ----------------------------------------------------------------------------- */

/* A block's magnitude: 2^e for e from this list, by a hash of the block. */
static const int exps[] = {0, -3, 5, -130, 12, -70, 1, -64, 40, -20, 120, -100, 7, -126, 2, -8};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* batch x rows x cols bf16 values, block by block (block_rows x 128) of magnitudes from
 * exps, 4 % exact zeros, the rest spread over [0, 1) x 2^e with a few at 2^e; block
 * zero_block (if >= 0) all zeros. */
static void generate(uint16_t *w, uint64_t batch, uint64_t rows, uint64_t cols,
                     uint64_t block_rows, uint64_t seed, int64_t zero_block)
{
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    const uint64_t rb = (rows + block_rows - 1) / block_rows, cb = qref_blocks_of(cols);
    for (uint64_t b = 0; b < batch; b++)
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < cols; c++) {
                const uint64_t block = (b * rb + r / block_rows) * cb + c / QREF_BLOCK;
                const int e = exps[mix(block + seed) % (sizeof exps / sizeof exps[0])];
                const uint64_t x = test_rand(&state);
                float v;
                if ((int64_t)block == zero_block || x % 100 < 4)
                    v = 0;
                else if (x % 100 < 6)
                    v = ldexpf(1.0f, e); /* the block's largest, exactly */
                else
                    v = ldexpf((float)((x >> 11) & 0xffffff) / 16777216.0f, e);
                if ((x >> 40) & 1)
                    v = -v;
                w[(b * rows + r) * cols + c] = f2bf(v);
            }
}

/* ---- buffers with guards --------------------------------------------------------------- */

typedef struct guarded {
    sc_buffer buf;
    sc_view view;
    uint64_t offset, count, esize;
    uint8_t poison[8];
} guarded;

/* count elements at element `offset` of a buffer with GUARD poisoned elements around. */
static guarded make(sc_dtype t, uint64_t offset, uint64_t count, const void *poison)
{
    guarded g = {.offset = GUARD + offset, .count = count, .esize = sc_dtype_size(t)};
    memcpy(g.poison, poison, g.esize);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = t, .count = g.offset + count + GUARD,
                                                     .stream = st},
                             &g.buf) == SC_OK);
    REQUIRE(sc_fill(st, sc_view_of(g.buf), poison) == SC_OK);
    g.view = (sc_view){g.buf, g.offset, count};
    return g;
}

/* The view's elements into out; the guards still poison. */
static void fetch(const guarded *g, void *out)
{
    const uint64_t total = g->offset + g->count + GUARD;
    uint8_t *all = test_xmalloc((size_t)(total * g->esize));
    REQUIRE(sc_copy_to_host(st, all, total * g->esize, sc_view_of(g->buf)) == SC_OK);
    memcpy(out, all + g->offset * g->esize, (size_t)(g->count * g->esize));
    for (uint64_t i = 0; i < total; i++)
        if (i < g->offset || i >= g->offset + g->count)
            if (memcmp(all + i * g->esize, g->poison, (size_t)g->esize) != 0) {
                fprintf(stderr, "element %llu outside the view [%llu, %llu) was written\n",
                        (unsigned long long)i, (unsigned long long)g->offset,
                        (unsigned long long)(g->offset + g->count));
                test_failures++;
                break;
            }
    free(all);
}

static void drop(guarded *g) { CHECK_OK(sc_buffer_destroy(g->buf)); }

/* ---- comparisons ---------------------------------------------------------------------- */

static bool e4m3_nan(uint8_t v) { return (v & 0x7f) == 0x7f; }

static bool same_f32(float a, float b)
{
    return isnan(a) ? isnan(b) : memcmp(&a, &b, 4) == 0;
}

static bool same_bf16(uint16_t a, uint16_t b)
{
    const bool na = (a & 0x7fff) > 0x7f80, nb = (b & 0x7fff) > 0x7f80;
    return na || nb ? na && nb : a == b;
}

/* Compare n elements; print the first few differences. */
#define COMPARE(what, n, got, want, same, fmt, cast)                                          \
    do {                                                                                      \
        uint64_t bad_ = 0;                                                                    \
        for (uint64_t i_ = 0; i_ < (n); i_++)                                                 \
            if (!(same)((got)[i_], (want)[i_]) && bad_++ < 5)                                 \
                fprintf(stderr, "%s: %s[%llu] = " fmt ", want " fmt "\n", name, what,         \
                        (unsigned long long)i_, (cast)(got)[i_], (cast)(want)[i_]);           \
        if (bad_) {                                                                           \
            fprintf(stderr, "%s: %llu of %llu %s differ\n", name, (unsigned long long)bad_,   \
                    (unsigned long long)(n), what);                                           \
            test_failures++;                                                                  \
        }                                                                                     \
    } while (0)

static bool same_q(uint8_t a, uint8_t b) { return a == b || (e4m3_nan(a) && e4m3_nan(b)); }
static bool same_bits_f32(float a, float b) { return memcmp(&a, &b, 4) == 0; }

/* ---- one case ------------------------------------------------------------------------- */

typedef struct qcase {
    const char *name;
    bool tokens;
    uint64_t batch, rows, cols;
    uint64_t in_off, q_off, s_off, out_off; /* view offsets (elements) */
    int64_t zero_block;
    bool special;  /* plant NaNs and an infinity */
    bool captured; /* run the calls through a captured graph */
} qcase;

typedef sc_status (*quant_fn)(sc_stream, const sc_quant_desc *, sc_view, sc_view, sc_view);

/* A case's host side: the input, the reference's results and the device's. */
typedef struct host {
    uint64_t block_rows, n, rb, cb, ns;
    uint16_t *w, *ref16, *out16;
    uint8_t *refq, *q;
    float *refs, *s, *ref32, *out32;
} host;

static uint64_t seed;

/* The input (fresh random data, with the case's NaNs and infinities) and the reference. */
static void prepare(const qcase *k, host *h)
{
    h->block_rows = k->tokens ? 1 : QREF_BLOCK;
    h->n = k->batch * k->rows * k->cols;
    h->rb = (k->rows + h->block_rows - 1) / h->block_rows;
    h->cb = qref_blocks_of(k->cols);
    h->ns = k->batch * h->rb * h->cb;
    const uint64_t n = h->n, ns = h->ns;
    h->w = test_xmalloc(n * 2);
    h->ref16 = test_xmalloc(n * 2);
    h->out16 = test_xmalloc(n * 2);
    h->refq = test_xmalloc(n);
    h->q = test_xmalloc(n);
    h->refs = test_xmalloc(ns * 4);
    h->s = test_xmalloc(ns * 4);
    h->ref32 = test_xmalloc(n * 4);
    h->out32 = test_xmalloc(n * 4);
    uint64_t case_seed = seed;
    for (const char *c = k->name; *c; c++)
        case_seed = mix(case_seed ^ (uint8_t)*c);
    generate(h->w, k->batch, k->rows, k->cols, h->block_rows, case_seed, k->zero_block);
    if (k->special) { /* block 0: NaNs; block 1: an infinity and a NaN; block 5: -inf */
        h->w[3] = 0x7fc0;
        h->w[k->cols + 5] = 0xffc1;
        h->w[200] = 0x7f80;
        h->w[201] = 0x7fc0;
        h->w[(k->rows - 1) * k->cols + 300] = 0xff80;
    }
    qref_quantize(h->w, k->batch, k->rows, k->cols, h->block_rows, h->refq, h->refs);
    qref_dequantize(h->refq, h->refs, k->batch, k->rows, k->cols, h->block_rows, h->ref32,
                    h->ref16);
}

static void release(host *h)
{
    free(h->w);
    free(h->ref16);
    free(h->out16);
    free(h->refq);
    free(h->q);
    free(h->refs);
    free(h->s);
    free(h->ref32);
    free(h->out32);
}

/* The device's results: quantize, then dequantize to bf16 and to f32 (captured and replayed
 * for k->captured), into poisoned, guarded views at the case's offsets. */
static void run_device(const qcase *k, host *h)
{
    const uint64_t n = h->n, ns = h->ns;
    const sc_quant_desc shape = {.rows = k->rows, .cols = k->cols, .batch = k->batch};
    const quant_fn quant = k->tokens ? sc_quantize_fp8_tokens : sc_quantize_fp8_blocks;
    const quant_fn dequant = k->tokens ? sc_dequantize_fp8_tokens : sc_dequantize_fp8_blocks;
    const uint16_t bf_poison = 0xffbf; /* a NaN */
    const uint8_t q_poison = 0x7f;     /* e4m3 NaN */
    const uint32_t f_poison = 0x7fbadbadu;
    guarded gw = make(SC_BF16, k->in_off, n, &bf_poison);
    guarded gq = make(SC_F8E4M3, k->q_off, n, &q_poison);
    guarded gs = make(SC_F32, k->s_off, ns, &f_poison);
    guarded g16 = make(SC_BF16, k->out_off, n, &bf_poison);
    guarded g32 = make(SC_F32, k->out_off, n, &f_poison);
    REQUIRE(sc_copy_from_host(st, gw.view, h->w, n * 2) == SC_OK);

    if (k->captured)
        REQUIRE(sc_stream_begin_capture(st, NULL) == SC_OK);
    CHECK_OK(quant(st, &shape, gw.view, gq.view, gs.view));
    CHECK_OK(dequant(st, &shape, gq.view, gs.view, g16.view));
    CHECK_OK(dequant(st, &shape, gq.view, gs.view, g32.view));
    if (k->captured) {
        sc_graph graph;
        sc_graph_exec exec;
        REQUIRE(sc_stream_end_capture(st, &graph) == SC_OK);
        REQUIRE(sc_graph_instantiate(graph, &exec) == SC_OK);
        CHECK_OK(sc_graph_launch(st, exec));
        CHECK_OK(sc_graph_exec_destroy(exec));
        CHECK_OK(sc_graph_destroy(graph));
    }
    fetch(&gq, h->q);
    fetch(&gs, h->s);
    fetch(&g16, h->out16);
    fetch(&g32, h->out32);
    uint16_t *w_back = test_xmalloc(n * 2);
    fetch(&gw, w_back); /* the input is untouched too */
    CHECK(memcmp(w_back, h->w, n * 2) == 0);
    free(w_back);
    drop(&gw);
    drop(&gq);
    drop(&gs);
    drop(&g16);
    drop(&g32);
}

/* The device's results against the reference, and what holds whatever the reference says:
 * each finite, non-zero block reaches +-448 in q, and the round trip's error per block. */
static void check(const qcase *k, const host *h)
{
    const char *name = k->name;
    const uint64_t n = h->n, ns = h->ns, rb = h->rb, cb = h->cb, block_rows = h->block_rows;
    COMPARE("scale", ns, h->s, h->refs, same_bits_f32, "%a", double);
    COMPARE("q", n, h->q, h->refq, same_q, "0x%02x", unsigned);
    COMPARE("bf16 out", n, h->out16, h->ref16, same_bf16, "0x%04x", unsigned);
    COMPARE("f32 out", n, h->out32, h->ref32, same_f32, "%a", double);

    double worst = 0, sum = 0;
    uint64_t blocks = 0, nan_q = 0;
    for (uint64_t b = 0; b < k->batch; b++)
        for (uint64_t br = 0; br < rb; br++)
            for (uint64_t bc = 0; bc < cb; bc++) {
                double err = 0, norm = 0;
                bool has448 = false, finite = true;
                for (uint64_t r = br * block_rows; r < (br + 1) * block_rows && r < k->rows; r++)
                    for (uint64_t c = bc * QREF_BLOCK; c < (bc + 1) * QREF_BLOCK && c < k->cols;
                         c++) {
                        const uint64_t i = (b * k->rows + r) * k->cols + c;
                        const double v = bf2f(h->w[i]);
                        nan_q += e4m3_nan(h->q[i]);
                        if (!isfinite(v)) {
                            finite = false;
                            continue;
                        }
                        err += (h->out32[i] - v) * (h->out32[i] - v);
                        norm += v * v;
                        has448 |= (h->q[i] & 0x7f) == 0x7e;
                    }
                if (!finite)
                    continue;
                if (norm == 0) {
                    CHECK(h->s[(b * rb + br) * cb + bc] == 1.0f);
                    continue;
                }
                CHECK(has448);
                const double rel = sqrt(err / norm);
                worst = rel > worst ? rel : worst;
                sum += rel;
                blocks++;
            }
    const double mean = blocks ? sum / (double)blocks : 0;
    printf("  %-38s %llu x %5llu x %4llu: %6llu scales, round trip error %.4f mean, %.4f "
           "worst\n",
           name, (unsigned long long)k->batch, (unsigned long long)k->rows,
           (unsigned long long)k->cols, (unsigned long long)ns, mean, worst);
    CHECK(worst <= 0.045);
    CHECK(mean <= 0.03 && (blocks < 8 || mean > 0.005));
    if (!k->special) {
        CHECK(nan_q == 0);
        return;
    }
    /* The NaNs stayed NaN, alone: block 0 keeps a finite scale; the block with the
     * infinity has an infinite one and dequantizes to NaN throughout. */
    CHECK(e4m3_nan(h->q[3]) && e4m3_nan(h->q[k->cols + 5]));
    CHECK(isfinite(h->s[0]) && !e4m3_nan(h->q[4]) && !isnan(h->out32[4]));
    CHECK(isinf(h->s[1]) && h->s[1] > 0);
    CHECK(isnan(h->out32[k->cols + 130]) && isnan(h->out32[200]));
    const uint64_t last = (k->rows - 1) * k->cols + 300;
    CHECK(isinf(h->s[(rb - 1) * cb + 2]) && e4m3_nan(h->q[last]));
}

static void run_case(const qcase *k)
{
    host h;
    prepare(k, &h);
    run_device(k, &h);
    check(k, &h);
    release(&h);
}

static const qcase cases[] = {
    {"weights, edges", false, 1, 300, 200, 0, 0, 0, 0, -1, false, false},
    {"weights, edges, batch 3", false, 3, 300, 200, 0, 0, 0, 0, 4, false, false},
    {"weights, aligned, zero block", false, 3, 256, 384, 0, 0, 0, 0, 7, false, false},
    {"weights, 1 x 1", false, 1, 1, 1, 0, 0, 0, 0, -1, false, false},
    {"weights, odd offsets, cols % 8 != 0", false, 2, 130, 100, 3, 5, 1, 7, -1, false, false},
    {"weights, 16-byte offsets", false, 1, 256, 264, 8, 16, 4, 8, -1, false, false},
    {"weights, NaN and inf", false, 1, 256, 384, 0, 0, 0, 0, -1, true, false},
    {"weights, captured", false, 2, 384, 512, 0, 0, 0, 0, 3, false, true},
    {"tokens, 37 x 7168", true, 1, 37, 7168, 0, 0, 0, 0, 11, false, false},
    {"tokens, edges, batch 2", true, 2, 5, 300, 0, 0, 0, 0, -1, false, false},
    {"tokens, odd offsets, H % 8 != 0", true, 1, 3, 100, 1, 3, 1, 5, -1, false, false},
    {"tokens, 1 x 128", true, 1, 1, 128, 0, 0, 0, 0, -1, false, false},
    {"tokens, 70000 x 256 (grid.y strides)", true, 1, 70000, 256, 0, 0, 0, 0, 5, false, false},
    {"tokens, captured", true, 1, 64, 2048, 0, 0, 0, 0, -1, false, true},
};

/* ---- bandwidth ------------------------------------------------------------------------- */

/* The time of quantizing and of dequantizing (to bf16) large tensors, as bandwidth. */
static void bandwidth(const char *what, bool tokens, uint64_t batch, uint64_t rows, uint64_t cols)
{
    const uint64_t n = batch * rows * cols, ns = batch * (tokens ? rows : qref_blocks_of(rows)) *
                                                qref_blocks_of(cols);
    const sc_quant_desc shape = {.rows = rows, .cols = cols, .batch = batch};
    sc_buffer w, q, s, out;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n, .stream = st},
                             &w) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F8E4M3, .count = n, .stream = st},
                             &q) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = ns, .stream = st},
                             &s) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n, .stream = st},
                             &out) == SC_OK);
    /* Data: a random block, copied all over (the values don't change the time). */
    const uint64_t chunk = 1 << 20;
    uint16_t *h = test_xmalloc(chunk * 2);
    generate(h, 1, chunk / 1024, 1024, 128, 42, -1);
    for (uint64_t at = 0; at < n; at += chunk) {
        sc_view v;
        REQUIRE(sc_buffer_view(w, at, n - at < chunk ? n - at : chunk, &v) == SC_OK);
        REQUIRE(sc_copy_from_host(st, v, h, v.count * 2) == SC_OK);
    }
    free(h);
    sc_event e0, e1;
    REQUIRE(sc_event_create(ctx, &(sc_event_desc){.timing = true}, &e0) == SC_OK);
    REQUIRE(sc_event_create(ctx, &(sc_event_desc){.timing = true}, &e1) == SC_OK);
    const int reps = 10;
    const quant_fn quant = tokens ? sc_quantize_fp8_tokens : sc_quantize_fp8_blocks;
    const quant_fn dequant = tokens ? sc_dequantize_fp8_tokens : sc_dequantize_fp8_blocks;
    for (int pass = 0; pass < 2; pass++) {
        /* quantize w -> (q, s), then dequantize (q, s) -> out; one call first (compiles) */
        const quant_fn fn = pass == 0 ? quant : dequant;
        const sc_view a = sc_view_of(pass == 0 ? w : q), b = sc_view_of(pass == 0 ? q : s),
                      c = sc_view_of(pass == 0 ? s : out);
        CHECK_OK(fn(st, &shape, a, b, c));
        CHECK_OK(sc_event_record(e0, st));
        for (int i = 0; i < reps; i++)
            CHECK_OK(fn(st, &shape, a, b, c));
        CHECK_OK(sc_event_record(e1, st));
        CHECK_OK(sc_event_synchronize(e1));
        float ms = 0;
        CHECK_OK(sc_event_elapsed(e0, e1, &ms));
        ms /= (float)reps;
        const double bytes = (double)n * 3 + (double)ns * 4; /* 2 + 1 bytes an element */
        const double gbs = bytes / (ms * 1e-3) / 1e9;
        printf("  %-10s %s %llu x %llu x %llu: %.3f ms, %.0f GB/s (%.0f %% of the device's "
               "%.0f GB/s)\n",
               pass == 0 ? "quantize" : "dequantize", what, (unsigned long long)batch,
               (unsigned long long)rows, (unsigned long long)cols, ms, gbs,
               100 * gbs / dev.memory_bandwidth_gbs, dev.memory_bandwidth_gbs);
        CHECK(gbs >= 0.25 * dev.memory_bandwidth_gbs);
    }
    CHECK_OK(sc_event_destroy(e0));
    CHECK_OK(sc_event_destroy(e1));
    CHECK_OK(sc_buffer_destroy(w));
    CHECK_OK(sc_buffer_destroy(q));
    CHECK_OK(sc_buffer_destroy(s));
    CHECK_OK(sc_buffer_destroy(out));
}

int main(void)
{
    gpu_require();
    sanitizer = getenv("SAFECUDA_UNDER_SANITIZER") != NULL;
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("test_gpu_quant: skipped: %s\n", sc_last_error());
        return TEST_SKIP;
    }
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    REQUIRE(sc_device_info(0, &dev) == SC_OK);
    REQUIRE(sc_stream_create(ctx, NULL, &st) == SC_OK);
    printf("%s (sm_%d%d), NVRTC %d.%d\n", dev.name, dev.cc_major, dev.cc_minor, major, minor);
    if (dev.cc_major * 10 + dev.cc_minor < 89) {
        sc_buffer w, q, s;
        REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = 128}, &w) == SC_OK);
        REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F8E4M3, .count = 128}, &q) == SC_OK);
        REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 1}, &s) == SC_OK);
        CHECK_FAIL(sc_quantize_fp8_blocks(st, &(sc_quant_desc){.rows = 1, .cols = 128},
                                          sc_view_of(w), sc_view_of(q), sc_view_of(s)),
                   SC_ERR_NOT_SUPPORTED, "sc_quantize_fp8_blocks");
        CHECK_MSG("compute capability 8.9");
        CHECK_OK(sc_buffer_destroy(w));
        CHECK_OK(sc_buffer_destroy(q));
        CHECK_OK(sc_buffer_destroy(s));
        CHECK_OK(sc_stream_destroy(st));
        CHECK_OK(sc_context_destroy(ctx));
        if (test_failures)
            return test_result("test_gpu_quant");
        printf("test_gpu_quant: skipped: sm_%d%d has no e4m3 conversions (refused, as it "
               "must be)\n", dev.cc_major, dev.cc_minor);
        return TEST_SKIP;
    }
    const char *env = getenv("SAFECUDA_TEST_SEED");
    seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    printf("seed %llu (SAFECUDA_TEST_SEED repeats a run)\n", (unsigned long long)seed);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
    if (!sanitizer) {
        bandwidth("weights", false, 16, 2048, 7168);
        bandwidth("tokens ", true, 1, 16384, 7168);
    }
    CHECK_OK(sc_stream_destroy(st));
    CHECK_OK(sc_context_destroy(ctx));
    return test_result("test_gpu_quant");
}
