/* bench_moe: the Mixture-of-Experts layer (sc_moe_forward) against its floor and PyTorch.
 *
 *   bench_moe [--out DIR] [--quick] [--configs NAME,...] [--tokens 1,16,64,...]
 *             [--backend auto|mma|sm90] [--inputs DIR | --save-inputs DIR]
 *             [--baseline FILE [--baseline-label NAME]] [--fp8]
 *
 * Layers (bf16 weights and activations). The v1 shapes, unchanged, so that one run also
 * shows whether they got slower:
 *   mixtral       E=8   k=2  H=4096 I=14336  softmax, renormalized
 *   qwen3moe      E=128 k=8  H=2048 I=768    softmax, renormalized
 *   olmoe         E=64  k=8  H=2048 I=1024   softmax, not renormalized
 *   dsv3          E=256 k=8  H=7168 I=2048   sigmoid + a random selection bias, renormalized
 * and the models' layers as the v2 layer computes them (their Hugging Face configs):
 *   deepseek_v3   E=256 k=8  H=7168 I=2048   sigmoid + a random selection bias; the experts
 *                 of the best 4 of 8 groups; renormalized, routed scaling 2.5; a shared
 *                 expert of I_s=2048
 *   kimi_k2       E=384 k=8  H=7168 I=2048   as deepseek_v3 with n_group = topk_group = 1
 *                 (no group limit) and routed scaling 2.827; shared expert I_s=2048
 *   qwen3_next    E=512 k=10 H=2048 I=512    softmax, renormalized; a shared expert of
 *                 I_s=512 scaled by sigmoid(x . gate row)
 *   gpt_oss_120b  E=128 k=4  H=2880 I=2880   softmax of the logits + a random router bias,
 *                 renormalized; clamped SwiGLU (alpha 1.702, limit 7); W13 rows interleaved
 *                 (gate, up, gate, ...); random f32 biases on W13 and W2
 * The v1 layers' weights are separate buffers (sc_moe_desc.router, w13, w2, selection_bias).
 * Each v2 layer's weights are views into one allocation, as a checkpoint loaded whole gives
 * them: its bf16 tensors (router, W13, W2, then the shared expert's W13, W2 and gate row)
 * one after the other in one bf16 buffer, the first 16 bytes in (a header's place), each
 * at the next 16-byte boundary (so not 256-byte aligned); its f32 ones (selection bias,
 * router bias, W13 and W2 biases) the same way in one f32 buffer.
 * Token counts T = 1, 16, 64, 256, 1024, 4096, 16384, 32768 for every layer. A count whose
 * weights, workspace, inputs and output do not fit in the device's free memory is skipped
 * with a line saying what it needs and what is free (the layer's other counts still run);
 * the peer skips its points that would not fit the same way. On an H100 (80 GB) every
 * point fits: kimi_k2 at T=32768 needs about 45 GB here and about 50 GB in the peer.
 * --quick: 1, 64, 4096; --tokens: the given counts for every layer.
 *
 * fp8 (--fp8). Each layer whose H, I and I_s are multiples of 128 (all but gpt_oss_120b,
 * whose H = I = 2880: a line says so) runs twice: bf16 as above, then right after it its
 * fp8 twin NAME-fp8: the same layer with sc_moe_desc.expert_dtype = SC_F8E4M3, its W13, W2
 * and shared W13, W2 e4m3 with one f32 scale per 128 x 128 block (w13_scale [E, 2I/128,
 * H/128], w2_scale [E, H/128, I/128], shared_w13_scale, shared_w2_scale), laid out like the
 * bf16 layer's (separate buffers for the v1 layers; for the others the e4m3 tensors in one
 * e4m3 allocation, the scales after the f32 vectors in the f32 one, each at the next 16-byte
 * boundary). x and out stay bf16; the router, its f32 vectors, the shared gate and the
 * expert biases are the bf16 layer's own numbers (copied to the host before its weights
 * are freed), and each point's tokens are drawn again from the random state the bf16
 * point drew them with, so both run on identical tokens and route alike (the router is
 * bf16 in both; a point whose distinct experts differ says so in a note). The fp8 twins'
 * other random numbers come from a stream of their own: the bf16 layers get the numbers
 * they get without --fp8. fp8 experts need the SM90 backend (compute capability 9.0; on
 * another device the twins are skipped with a line; --backend mma with --fp8 exits 2), and
 * there is no file format for them (--fp8 with --inputs or --save-inputs exits 2).
 *
 * Inputs. The weights and tokens are random (below) unless --inputs DIR gives them: one
 * layer, measured on the weights and tokens of DIR, so that it is measured on the inputs
 * another implementation was measured on. --save-inputs DIR writes a run's random inputs
 * in the same format, into DIR/NAME for each layer it runs (NAME the layer's; kimi_k2's
 * weights are 34 GB). The format, one numpy .npy file per tensor (bench/npy.h: format 1.0
 * to 3.0, C order, little-endian; bf16 stored as its uint16 bit patterns, '<u2'; f32 '<f4'):
 *   layer.txt   key=value lines, '#' starts a comment: top_k (required); scoring (softmax
 *               or sigmoid), renormalize (0/1), n_group, topk_group, routed_scaling,
 *               activation (silu, gelu_tanh or swiglu_clamp), swiglu_alpha, swiglu_limit,
 *               w13_layout (stacked or interleaved), shared_intermediate: each absent key
 *               is sc_moe_desc's zero; name (default: the folder's name; letters, digits,
 *               '_', '-', '.'); experts, hidden, intermediate (optional, checked against
 *               the files)
 *   router.npy [E, H], w13.npy [E, 2I, H], w2.npy [E, H, I]                       '<u2'
 *   optional:  selection_bias.npy [E], router_bias.npy [E], w13_bias.npy [E, 2I] (in
 *              w13_layout), w2_bias.npy [E, H]                                     '<f4'
 *              shared_w13.npy [2 I_s, H], shared_w2.npy [H, I_s] (both, with
 *              shared_intermediate = I_s), shared_gate.npy [H]                     '<u2'
 *   x.npy [T, H] and/or x_*.npy [T, H] ('<u2'): every T among them is a point, and the
 *              files of one T, in name order (at most 16), its inputs in turn;
 *              --save-inputs writes x_T<T>_<i>.npy; --tokens picks among those T.
 * Every file is opened and checked (header, dtype, shape against the other files and
 * layer.txt, size) before anything runs; any problem exits 2 naming the file. The peer is
 * given --inputs DIR as well and times the same tensors (with --save-inputs it draws its
 * own random numbers: it runs before ours are made; run again with --inputs DIR/NAME to
 * time both on the saved ones).
 *
 * Method.
 * - Data: random bf16, roughly N(0, 1/sqrt(fan_in)) for the weights (Irwin-Hall sums of 4
 *   random bytes) and N(0, 1) for the inputs, so activations stay O(1) and the routing is
 *   close to uniform. A 64 MiB random block per scale is made on the host, uploaded through
 *   a pinned sc_host_buffer, and the weights are filled from it on the device with sc_copy
 *   at a random offset per piece (each expert gets different numbers) -- 34 GB of kimi_k2
 *   weights take milliseconds instead of minutes of host random numbers. The f32 vectors
 *   are uniform, made on the host: selection bias in [-0.05, 0.05), router and expert
 *   biases in [-0.1, 0.1). Each layer's weights are freed before the next layer's are made.
 *   fp8 twins (bench_moe_fp8.c): the e4m3 experts are cut the same way from one 32 MiB
 *   block of N(0, 1) x 64 rounded to e4m3 (nearest, ties to even, as tests/fp8.h rounds;
 *   never NaN, |v| < 448), and each block's scale is 1 / (64 sqrt(fan_in)) times a uniform
 *   factor in [0.75, 1.25) (made on the host), so the dequantized weights have the bf16
 *   weights' spread (within 2 %) while the scales differ from block to block.
 * - Experts used: for each input of a point, before its timing, one forward with
 *   sc_moe_forward_desc.expert_ids (the ids filled with -1 first) gives the experts the
 *   routing chose; D, the number of distinct routed experts among them, is that input's
 *   (shown as "experts", the smallest-largest over the point's inputs). An id outside
 *   0 .. E-1 fails the check below.
 * - Timing: timing sc_events around each sc_moe_forward, synchronized after each; warm-up
 *   forwards (at least 3 and at least 0.1 s of them, the peer's rule too), then the median
 *   of 20 forwards for T <= 1024, 10 up to 16384 and 5 from 32768 (the largest points, to
 *   keep the run short; their times vary least); --quick halves them (at least 2). Up to
 *   1024 tokens four different inputs are used in turn, so the routing (and the experts
 *   read) changes from one forward to the next and L2 can't hold the answer.
 * - Check: after the timed runs, out is filled with NaN, one more forward runs, and out is
 *   copied back and scanned: any NaN or Inf (a row never written, or an overflow) fails
 *   the benchmark, as does an expert id out of range. Correctness against a reference is
 *   the test suite's job.
 * - Floor, per input: max(bytes / memory rate, FLOPs / matmul rate), with D that input's
 *   distinct routed experts and I_s the shared expert's size (0 without one):
 *     bytes = D x (3 H I x 2 + 2I x 4 with a W13 bias + H x 4 with a W2 bias)   the routed
 *                                                       experts the routing used
 *           + E H x 2 + E x 4 per f32 router vector (selection bias, router bias)
 *           + 3 H I_s x 2 + H x 2 with a gate row   the shared expert: read by every forward
 *           + 2 T H x 2                             x and out
 *     FLOPs = 2 T E H (router) + 2 T k 3 H I (routed experts) + 2 T 3 H I_s (shared expert)
 *           + 2 T H (gate row)
 *   (the element-wise work: scores, top-k, activations, bias adds, weights, the sum, is not
 *   counted). An fp8 twin's floor counts its e4m3 weights and their f32 block scales:
 *     bytes = D x (3 H I x (1 + 4/16384) + the biases as above)   e4m3 + one f32 per block
 *           + E H x 2 + E x 4 per f32 router vector       the router, bf16 as above
 *           + 3 H I_s x (1 + 4/16384) + H x 2 with a gate row      the shared expert
 *           + 2 T H x 2                                   x and out, bf16
 *     FLOPs as above; their time = (2 T E H + 2 T H with a gate row) / the bf16 matmul rate
 *           + (2 T k 3 H I + 2 T 3 H I_s) / the e4m3 matmul rate   (the router stays bf16)
 *   and the floor is max(bytes / memory rate, that time). The memory rate is the larger
 *   of a 1 GiB read by a streaming kernel (bytes / time) and a 1 GiB sc_copy D2D (read +
 *   write bytes / time), each the median of 10 measured in this run (a forward mostly
 *   reads, and reads outrun a copy's r+w rate); the matmul rate is the torch peer's bf16
 *   8192^3 matmul in this run (a nominal figure from the device properties when the peer
 *   is unavailable); the
 *   e4m3 rate (--fp8) the peer's torch._scaled_mm of two e4m3 8192 x 8192 matrices
 *   (per-tensor scales, out bf16, use_fast_accum=False; the fast-accumulation rate is
 *   printed beside it, not used), or twice the bf16 nominal figure without it.
 *   Each timed forward is matched to its own input's floor: "% of floor" is the median, over
 *   the timed forwards, of (the floor of the forward's input / the forward's time), and
 *   "floor ms" the mean of those floors. No forward can beat its floor unless it moves
 *   fewer bytes or does fewer FLOPs than counted, or runs faster than the measured rates; a
 *   point above 100 % prints a WARNING (and the summary lists it): its rates are too low
 *   for this work (a GEMM can outrun torch's 8192^3 matmul) or the timing is wrong.
 *   "weight GB/s" = the weight bytes the forward must read (bytes above without x and out)
 *   / its time, the median over the timed forwards as above; "TFLOP/s" = FLOPs / the
 *   median time.
 * - Peer: bench/peers/torch_moe.py runs first, alone on the GPU (kimi_k2's weights and ours
 *   would not fit together), for every point: a Hugging Face style expert loop and a
 *   torch._grouped_mm layer computing the same layer (group-limited routing, routed
 *   scaling, router bias, the shared expert and its gate as dense matmuls, the activation,
 *   the biases; interleaved rows made stacked once, untimed), timed the same way (see the
 *   script). It stops measuring after a time budget (180 s; --quick 120 s): nan after.
 *   With --fp8 (given to it as --fp8) it measures the e4m3 matmul rates first and, after
 *   each layer, the same layer with e4m3 experts (NAME-fp8, same rules and budget): an
 *   expert loop of torch._scaled_mm and a torch._scaled_grouped_mm layer, x and h
 *   quantized per token and the weights scaled per output channel: ROWWISE scaling, the
 *   finest torch 2.11's fp8 GEMMs take, not 128 x 128 blocks (bench/peers/torch_moe_fp8.py).
 * - Baseline: --baseline FILE reads an earlier run's bench_moe.csv (its config, T and
 *   ours_ms columns; any bench_moe CSV, older ones included) and shows its time beside
 *   ours ("<label> ms", --baseline-label, default "baseline") and the ratio (its time /
 *   ours: above 1 is faster now), in the table, the summary and the CSV.
 * - Run time: about 2.5 minutes on an H100 by the earlier runs' per-point times (the peer
 *   about 2 of them, capped by its budget), plus the MoE kernels' compile on a cold cache.
 *   --fp8 adds the fp8 twins' points (at most as long as the bf16 ones: fewer bytes) and
 *   the peer's fp8 layers (within the same budget: the points past it are nan): about 4 to
 *   5 minutes in all.
 *
 * Output: a table per layer (the per-kernel device times of one profiled forward under each
 * point), DIR/bench_moe.csv (config,T,ours_ms,floor_ms,pct_floor,experts_min,experts_max,
 * weight_gbs,tflops,bound,loop_ms,grouped_ms,baseline_ms,vs_baseline,precision,vs_bf16; a
 * row per point a layer runs) and DIR/bench_moe.png (bench/plot_moe.py) with --out DIR,
 * and a summary of every point as the last lines. An fp8 twin's rows follow its layer's,
 * config NAME-fp8 (so --baseline matches fp8 rows to an earlier run's fp8 rows, and the
 * plot draws them on NAME's panel), precision fp8 (bf16 otherwise), its floor the fp8 one,
 * loop_ms and grouped_ms torch's fp8 layers, vs_bf16 = the bf16 layer's ms / the twin's
 * (nan in bf16 rows); the columns up to vs_baseline are as before. Its table adds "vs bf16",
 * and the summary a block per twin: bf16 ms, fp8 ms, fp8 % of the fp8 floor, speedup (bf16
 * ms / fp8 ms), torch fp8 time / ours. Exit 77 with "skipped" without a GPU
 * (tests/gpu_presence.h); a bad argument or input file exits 2; any safecuda failure prints
 * sc_last_error() and exits 1, except a layer whose sc_moe_create fails: that is printed as
 * FAILED, the other layers still run, and the exit status is 1. */
#include <dirent.h>
#include <math.h> /* NAN, isnan, isfinite: macros only, no libm needed */
#include <stdarg.h>
#include <sys/stat.h>

#include "bench_moe.h"
#include "npy.h"
#include "peer.h"

#define WARMUP 3               /* warm-up: at least this many forwards ... */
#define WARMUP_NS 100000000ull /* ... and at least 0.1 s of them */
#define MAX_REPS 20
#define BIG_T 32768            /* from this many tokens, 5 timed forwards */
#define ROTATE_MAX_T 1024      /* up to this many tokens, NX random inputs are used in turn */
#define NX 4
#define PEER_SCRIPT "torch_moe.py"

static const moe_config builtin_configs[] = {
    {.name = "mixtral", .E = 8, .k = 2, .H = 4096, .I = 14336, .scoring = SC_MOE_SOFTMAX,
     .renormalize = true},
    {.name = "qwen3moe", .E = 128, .k = 8, .H = 2048, .I = 768, .scoring = SC_MOE_SOFTMAX,
     .renormalize = true},
    {.name = "olmoe", .E = 64, .k = 8, .H = 2048, .I = 1024, .scoring = SC_MOE_SOFTMAX,
     .renormalize = false},
    {.name = "dsv3", .E = 256, .k = 8, .H = 7168, .I = 2048, .scoring = SC_MOE_SIGMOID,
     .renormalize = true, .bias = true},
    {.name = "deepseek_v3", .E = 256, .k = 8, .H = 7168, .I = 2048, .scoring = SC_MOE_SIGMOID,
     .renormalize = true, .bias = true, .n_group = 8, .topk_group = 4, .routed_scaling = 2.5f,
     .shared_I = 2048, .one_alloc = true},
    {.name = "kimi_k2", .E = 384, .k = 8, .H = 7168, .I = 2048, .scoring = SC_MOE_SIGMOID,
     .renormalize = true, .bias = true, .n_group = 1, .topk_group = 1,
     .routed_scaling = 2.827f, .shared_I = 2048, .one_alloc = true},
    {.name = "qwen3_next", .E = 512, .k = 10, .H = 2048, .I = 512, .scoring = SC_MOE_SOFTMAX,
     .renormalize = true, .shared_I = 512, .shared_gate = true, .one_alloc = true},
    {.name = "gpt_oss_120b", .E = 128, .k = 4, .H = 2880, .I = 2880,
     .scoring = SC_MOE_SOFTMAX, .renormalize = true, .router_bias = true,
     .act = SC_MOE_SWIGLU_CLAMP, .layout = SC_MOE_W13_INTERLEAVED, .w13_bias = true,
     .w2_bias = true, .one_alloc = true},
};
#define N_BUILTIN (sizeof builtin_configs / sizeof builtin_configs[0])

/* The layers of this run: the built-in ones, or the one of --inputs; with --fp8 then the
 * fp8 twins of the layers that can have fp8 experts (named NAME-fp8). */
static moe_config configs[MAX_CONFIGS];
static size_t n_configs;
static int fp8_twin[MAX_CONFIGS]; /* configs index of a layer's fp8 twin, -1: none */
static char twin_names[MAX_CONFIGS][80];
/* --fp8: what a bf16 layer hands its twin (indexed by the bf16 layer), and why this device
 * runs no fp8 layer (empty: it does). */
static kept_tensors kept[MAX_CONFIGS];
static char fp8_unsupported[160];

static const uint64_t default_tokens[] = {1, 16, 64, 256, 1024, 4096, 16384, 32768};
static const uint64_t quick_tokens[] = {1, 64, 4096};

typedef struct point {
    bool measured;
    bool no_room;               /* skipped: does not fit in the device's free memory */
    double ours_ms;             /* median time */
    double floor_ms;            /* mean of the timed forwards' floors */
    double pct;                 /* median of floor / time over the timed forwards, % */
    double bw_ms, flop_ms;      /* the floor's terms (bytes: mean over the timed forwards) */
    double weight_gbs, tflops;  /* achieved */
    int experts_min, experts_max; /* distinct routed experts over the point's inputs */
    double loop_ms, grouped_ms; /* the peer's, NAN when it has none */
    double base_ms;             /* --baseline's ours_ms, NAN when none */
    double host_us;             /* host time of the sc_moe_forward call (median) */
    sc_moe_profile prof;        /* one profiled forward after the timed ones */
    /* --fp8: what the fp8 twin's point repeats (recorded by the bf16 layer's point) */
    bool x_drawn;               /* x_rng holds the state x was drawn with */
    uint64_t x_rng;
    int used[MAX_X];            /* distinct routed experts of each input */
} point;

typedef struct args {
    bench_opts o;
    sc_moe_backend backend;
    bool on[MAX_CONFIGS];
    uint64_t tokens[MAX_TOKEN_COUNTS];
    size_t n_tokens;
    const char *inputs_dir;     /* --inputs */
    const char *save_dir;       /* --save-inputs */
    const char *baseline;       /* --baseline FILE */
    const char *baseline_label; /* --baseline-label, default "baseline" */
    bool fp8;                   /* --fp8: each layer also with fp8 experts */
} args;

/* --view-align: where a one-allocation layer's tensors start (the first this many bytes in,
 * each at the next multiple); 16 (CKPT_HEADER_BYTES) as a checkpoint loaded whole gives
 * them, 256 for views that are all aligned. */
static uint64_t view_align = CKPT_HEADER_BYTES;

/* --inputs: the x files of each token count (index as in args.tokens), in name order. */
typedef struct x_files {
    int n;
    char *path[MAX_X];
} x_files;
static x_files xin[MAX_TOKEN_COUNTS];

static point results[MAX_CONFIGS][MAX_TOKEN_COUNTS];

/* ---- small numerics without libm ---------------------------------------------------------- */

double nolibm_sqrt(double v)
{
    if (v <= 0.0)
        return 0.0;
    double y = v > 1.0 ? v : 1.0;
    for (int i = 0; i < 200; i++) {
        double next = 0.5 * (y + v / y);
        if (next == y)
            break;
        y = next;
    }
    return y;
}

static uint16_t f32_to_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (no NaN/Inf arrive here) */
    return (uint16_t)(u >> 16);
}

static double dmax(double a, double b) { return a > b ? a : b; }

/* snprintf at the end of buf. */
__attribute__((format(printf, 3, 4))) static void append(char *buf, size_t size,
                                                         const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, size - n, fmt, ap);
    va_end(ap);
}

/* A bad argument or input file: the message on stderr, exit 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void die_usage(const char *fmt, ...)
{
    fflush(stdout);
    fprintf(stderr, "bench_moe: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(2);
}

/* ---- the weights' tensors ------------------------------------------------------------------ */

static const char *const tensor_labels[W_COUNT] = {
    "router", "w13", "w2", "shared w13", "shared w2", "shared gate",
    "selection bias", "router bias", "w13 bias", "w2 bias",
    "w13 scale", "w2 scale", "shared w13 scale", "shared w2 scale"};
/* Their files under --inputs / --save-inputs, and their shapes in words (the scales: none,
 * --inputs and --save-inputs are for bf16 layers only). */
static const char *const tensor_files[W_COUNT] = {
    "router.npy", "w13.npy", "w2.npy", "shared_w13.npy", "shared_w2.npy", "shared_gate.npy",
    "selection_bias.npy", "router_bias.npy", "w13_bias.npy", "w2_bias.npy",
    "-", "-", "-", "-"};
static const char *const tensor_shapes[W_COUNT] = {
    "router [E, H]", "W13 [E, 2I, H]", "W2 [E, H, I]", "shared W13 [2 I_s, H]",
    "shared W2 [H, I_s]", "shared gate [H]", "selection bias [E]", "router bias [E]",
    "W13 bias [E, 2I]", "W2 bias [E, H]", "W13 scale [E, 2I/128, H/128]",
    "W2 scale [E, H/128, I/128]", "shared W13 scale [2 I_s/128, H/128]",
    "shared W2 scale [H/128, I_s/128]"};

static bool tensor_is_f32(int i) { return i >= W_SEL_BIAS; }

/* Tensor i's element type in layer c. */
static sc_dtype tensor_dtype(const moe_config *c, int i)
{
    if (tensor_is_f32(i))
        return SC_F32;
    const bool expert = i == W_W13 || i == W_W2 || i == W_SHARED_W13 || i == W_SHARED_W2;
    return c->fp8 && expert ? SC_F8E4M3 : SC_BF16;
}

/* Tensor i's shape in layer c (ndim returned; 0 elements: c has none). */
static int tensor_shape(const moe_config *c, int i, uint64_t shape[3])
{
    const uint64_t E = (uint64_t)c->E, H = (uint64_t)c->H, I = (uint64_t)c->I,
                   Is = (uint64_t)c->shared_I, B = FP8_BLOCK, f = c->fp8 ? 1 : 0;
    switch (i) {
    case W_ROUTER: shape[0] = E, shape[1] = H; return 2;
    case W_W13: shape[0] = E, shape[1] = 2 * I, shape[2] = H; return 3;
    case W_W2: shape[0] = E, shape[1] = H, shape[2] = I; return 3;
    case W_SHARED_W13: shape[0] = 2 * Is, shape[1] = H; return 2;
    case W_SHARED_W2: shape[0] = H, shape[1] = Is; return 2;
    case W_SHARED_GATE: shape[0] = c->shared_gate ? H : 0; return 1;
    case W_SEL_BIAS: shape[0] = c->bias ? E : 0; return 1;
    case W_ROUTER_BIAS: shape[0] = c->router_bias ? E : 0; return 1;
    case W_W13_BIAS: shape[0] = c->w13_bias ? E : 0, shape[1] = 2 * I; return 2;
    case W_W2_BIAS: shape[0] = c->w2_bias ? E : 0, shape[1] = H; return 2;
    case W_W13_SCALE: shape[0] = f * E, shape[1] = 2 * I / B, shape[2] = H / B; return 3;
    case W_W2_SCALE: shape[0] = f * E, shape[1] = H / B, shape[2] = I / B; return 3;
    case W_SHARED_W13_SCALE: shape[0] = f * 2 * Is / B, shape[1] = H / B; return 2;
    default: shape[0] = f * H / B, shape[1] = Is / B; return 2; /* W_SHARED_W2_SCALE */
    }
}

static uint64_t tensor_count(const moe_config *c, int i)
{
    uint64_t shape[3];
    int nd = tensor_shape(c, i, shape);
    uint64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= shape[d];
    return n;
}

/* The layer's tensors, and with c->one_alloc where each lies in its dtype's allocation:
 * in the order of the enum, the first at view_align bytes (CKPT_HEADER_BYTES: 16), each at
 * the next multiple of it (an fp8 layer's e4m3 experts in a third allocation). Nothing is
 * allocated. */
static void weights_layout(const moe_config *c, layer_weights *w)
{
    memset(w, 0, sizeof *w);
    w->one_alloc = c->one_alloc;
    uint64_t next[3] = {view_align / 2, view_align / 4, view_align}; /* bf16, f32, e4m3 */
    bool any[3] = {false, false, false};
    for (int i = 0; i < W_COUNT; i++) {
        tensor *t = &w->t[i];
        t->label = tensor_labels[i];
        t->dtype = tensor_dtype(c, i);
        t->count = tensor_count(c, i);
        if (!t->count || !c->one_alloc)
            continue;
        const int d = t->dtype == SC_F32 ? 1 : t->dtype == SC_F8E4M3 ? 2 : 0;
        const uint64_t per = view_align / sc_dtype_size(t->dtype); /* elements in view_align */
        t->off = (next[d] + per - 1) / per * per;
        next[d] = t->off + t->count;
        any[d] = true;
    }
    w->bf16_elems = any[0] ? next[0] : 0;
    w->f32_elems = any[1] ? next[1] : 0;
    w->f8_elems = any[2] ? next[2] : 0;
}

/* Device bytes of the layer's weights. */
static uint64_t weights_bytes(const layer_weights *w)
{
    if (w->one_alloc)
        return w->bf16_elems * 2 + w->f32_elems * 4 + w->f8_elems;
    uint64_t b = 0;
    for (int i = 0; i < W_COUNT; i++)
        b += w->t[i].count * sc_dtype_size(w->t[i].dtype);
    return b;
}

/* ---- layer.txt ------------------------------------------------------------------------------ */

static const char *activation_name(sc_moe_activation a)
{
    return a == SC_MOE_GELU_TANH ? "gelu_tanh" : a == SC_MOE_SWIGLU_CLAMP ? "swiglu_clamp" : "silu";
}

/* key=value lines of layer c (what --inputs reads back). false when writing fails. */
static bool write_layer_txt(const char *path, const moe_config *c)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    fprintf(f, "# bench_moe --save-inputs: the layer of the .npy files beside this file\n");
    fprintf(f, "name=%s\nexperts=%d\nhidden=%d\nintermediate=%d\n", c->name, c->E, c->H, c->I);
    fprintf(f, "top_k=%d\nscoring=%s\nrenormalize=%d\n", c->k,
            c->scoring == SC_MOE_SIGMOID ? "sigmoid" : "softmax", c->renormalize ? 1 : 0);
    fprintf(f, "n_group=%d\ntopk_group=%d\nrouted_scaling=%.9g\n", c->n_group, c->topk_group,
            (double)c->routed_scaling);
    fprintf(f, "activation=%s\nswiglu_alpha=%.9g\nswiglu_limit=%.9g\n", activation_name(c->act),
            (double)c->swiglu_alpha, (double)c->swiglu_limit);
    fprintf(f, "w13_layout=%s\nshared_intermediate=%d\n",
            c->layout == SC_MOE_W13_INTERLEAVED ? "interleaved" : "stacked", c->shared_I);
    return fclose(f) == 0;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

static bool parse_int(const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || end == s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static bool parse_float(const char *s, float *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !end || end == s || *end || !(v == v) || v > 3.0e38 || v < -3.0e38)
        return false;
    *out = (float)v;
    return true;
}

static bool parse_bool(const char *s, bool *out)
{
    if (strcmp(s, "1") == 0 || strcmp(s, "true") == 0 || strcmp(s, "True") == 0)
        *out = true;
    else if (strcmp(s, "0") == 0 || strcmp(s, "false") == 0 || strcmp(s, "False") == 0)
        *out = false;
    else
        return false;
    return true;
}

static bool name_ok(const char *s)
{
    if (!*s || strlen(s) > 63)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.'))
            return false;
    return true;
}

/* The layer of DIR/layer.txt into c (E, H, I from the files later; -1 in *want_E etc.
 * where layer.txt does not give them). Exits 2 on any problem. */
static void read_layer_txt(const char *dir, moe_config *c, int *want_E, int *want_H,
                           int *want_I, char *name, size_t name_size)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/layer.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        die_usage("--inputs: %s: can't open: %s", path, strerror(errno));
    *want_E = *want_H = *want_I = -1;
    bool have_k = false;
    char line[512], seen[32][32];
    int n_seen = 0, lineno = 0;
    name[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        if (!*s)
            continue;
        char *eq = strchr(s, '=');
        if (!eq)
            die_usage("--inputs: %s:%d: '%s' is not key=value", path, lineno, s);
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        for (int i = 0; i < n_seen; i++)
            if (strcmp(seen[i], key) == 0)
                die_usage("--inputs: %s:%d: %s given twice", path, lineno, key);
        if (n_seen < 32)
            snprintf(seen[n_seen++], sizeof seen[0], "%.31s", key);
        bool ok = true;
        if (strcmp(key, "name") == 0) {
            ok = name_ok(val);
            if (ok)
                snprintf(name, name_size, "%s", val);
        } else if (strcmp(key, "top_k") == 0) {
            ok = parse_int(val, 1, SC_MOE_MAX_TOPK, &c->k);
            have_k = true;
        } else if (strcmp(key, "experts") == 0) {
            ok = parse_int(val, 1, SC_MOE_MAX_EXPERTS, want_E);
        } else if (strcmp(key, "hidden") == 0) {
            ok = parse_int(val, 1, 1 << 30, want_H);
        } else if (strcmp(key, "intermediate") == 0) {
            ok = parse_int(val, 1, 1 << 30, want_I);
        } else if (strcmp(key, "scoring") == 0) {
            if (strcmp(val, "softmax") == 0)
                c->scoring = SC_MOE_SOFTMAX;
            else if (strcmp(val, "sigmoid") == 0)
                c->scoring = SC_MOE_SIGMOID;
            else
                ok = false;
        } else if (strcmp(key, "renormalize") == 0) {
            ok = parse_bool(val, &c->renormalize);
        } else if (strcmp(key, "n_group") == 0) {
            ok = parse_int(val, 0, SC_MOE_MAX_EXPERTS, &c->n_group);
        } else if (strcmp(key, "topk_group") == 0) {
            ok = parse_int(val, 0, SC_MOE_MAX_EXPERTS, &c->topk_group);
        } else if (strcmp(key, "routed_scaling") == 0) {
            ok = parse_float(val, &c->routed_scaling);
        } else if (strcmp(key, "activation") == 0) {
            if (strcmp(val, "silu") == 0)
                c->act = SC_MOE_SILU;
            else if (strcmp(val, "gelu_tanh") == 0)
                c->act = SC_MOE_GELU_TANH;
            else if (strcmp(val, "swiglu_clamp") == 0)
                c->act = SC_MOE_SWIGLU_CLAMP;
            else
                ok = false;
        } else if (strcmp(key, "swiglu_alpha") == 0) {
            ok = parse_float(val, &c->swiglu_alpha);
        } else if (strcmp(key, "swiglu_limit") == 0) {
            ok = parse_float(val, &c->swiglu_limit);
        } else if (strcmp(key, "w13_layout") == 0) {
            if (strcmp(val, "stacked") == 0)
                c->layout = SC_MOE_W13_STACKED;
            else if (strcmp(val, "interleaved") == 0)
                c->layout = SC_MOE_W13_INTERLEAVED;
            else
                ok = false;
        } else if (strcmp(key, "shared_intermediate") == 0) {
            ok = parse_int(val, 0, 1 << 30, &c->shared_I);
        } else {
            die_usage("--inputs: %s:%d: unknown key '%s' (name, top_k, scoring, renormalize, "
                      "n_group, topk_group, routed_scaling, activation, swiglu_alpha, "
                      "swiglu_limit, w13_layout, shared_intermediate, experts, hidden, "
                      "intermediate)",
                      path, lineno, key);
        }
        if (!ok)
            die_usage("--inputs: %s:%d: bad value '%s' for %s", path, lineno, val, key);
    }
    bool read_error = ferror(f) != 0;
    fclose(f);
    if (read_error)
        die_usage("--inputs: %s: read failed", path);
    if (!have_k)
        die_usage("--inputs: %s: top_k is required", path);
}

/* ---- --inputs: the layer and tokens of a folder ------------------------------------------- */

static char input_name[64];

/* Open DIR/file, checked as a .npy file; exits 2 with the reader's message on a refusal. */
static void open_npy(const char *dir, const char *file, npy_file *nf, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", dir, file);
    char err[768];
    if (!npy_open(nf, path, err, sizeof err))
        die_usage("--inputs: %s", err);
}

static bool file_exists(const char *dir, const char *file)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return access(path, F_OK) == 0;
}

/* The folder's last name ("a/b/" -> "b"). */
static void folder_name(const char *dir, char *out, size_t size)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", dir);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
    const char *slash = strrchr(buf, '/'), *last = slash && slash[1] ? slash + 1 : buf;
    n = strlen(last);
    if (n >= size)
        die_usage("--inputs: the folder's name '%s' is longer than %zu characters: give name= "
                  "in %s/layer.txt",
                  last, size - 1, dir);
    memcpy(out, last, n);
    out[n] = '\0';
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The layer of DIR into configs[0] and its token counts (every T of an x file; with
 * --tokens only those, each required) into a->tokens and xin. Every file is opened and
 * checked; any problem exits 2. */
static void load_inputs(args *a, bool tokens_given)
{
    const char *dir = a->inputs_dir;
    moe_config c = {.one_alloc = true, .dir = dir};
    int want_E, want_H, want_I;
    read_layer_txt(dir, &c, &want_E, &want_H, &want_I, input_name, sizeof input_name);
    if (!input_name[0]) {
        folder_name(dir, input_name, sizeof input_name);
        if (!name_ok(input_name))
            die_usage("--inputs: the folder's name '%s' is not a layer name (letters, digits, "
                      "'_', '-', '.'): give name= in %s/layer.txt",
                      input_name, dir);
    }
    c.name = input_name;

    /* E and H from the router, I from W13; then every tensor against them. */
    char path[1024], err[768];
    npy_file nf;
    open_npy(dir, tensor_files[W_ROUTER], &nf, path, sizeof path);
    if (strcmp(nf.descr, "<u2") != 0 || nf.ndim != 2 || nf.shape[0] == 0 || nf.shape[1] == 0 ||
        nf.shape[0] > SC_MOE_MAX_EXPERTS || nf.shape[1] > (1u << 30))
        die_usage("--inputs: %s: holds %s of %d dimensions, expected the router [E, H] as '<u2' "
                  "(bf16 bits), 1 <= E <= %d",
                  path, nf.descr, nf.ndim, SC_MOE_MAX_EXPERTS);
    c.E = (int)nf.shape[0];
    c.H = (int)nf.shape[1];
    npy_close(&nf);
    open_npy(dir, tensor_files[W_W13], &nf, path, sizeof path);
    if (nf.ndim != 3 || nf.shape[1] % 2 || nf.shape[1] == 0 || nf.shape[1] > (1u << 30))
        die_usage("--inputs: %s: expected W13 [E, 2I, H] with an even, non-zero 2I", path);
    c.I = (int)(nf.shape[1] / 2);
    npy_close(&nf);
    const int want[3] = {want_E, want_H, want_I}, have[3] = {c.E, c.H, c.I};
    static const char *const keys[3] = {"experts", "hidden", "intermediate"};
    for (int i = 0; i < 3; i++)
        if (want[i] >= 0 && want[i] != have[i])
            die_usage("--inputs: %s/layer.txt says %s=%d, the files hold E=%d H=%d I=%d "
                      "(router [E, H], W13 [E, 2I, H])",
                      dir, keys[i], want[i], c.E, c.H, c.I);

    /* The optional tensors: a file makes the layer have it. */
    c.bias = file_exists(dir, tensor_files[W_SEL_BIAS]);
    c.router_bias = file_exists(dir, tensor_files[W_ROUTER_BIAS]);
    c.w13_bias = file_exists(dir, tensor_files[W_W13_BIAS]);
    c.w2_bias = file_exists(dir, tensor_files[W_W2_BIAS]);
    c.shared_gate = file_exists(dir, tensor_files[W_SHARED_GATE]);
    const bool s13 = file_exists(dir, tensor_files[W_SHARED_W13]),
               s2 = file_exists(dir, tensor_files[W_SHARED_W2]);
    if (c.shared_I > 0 && !(s13 && s2))
        die_usage("--inputs: %s/layer.txt says shared_intermediate=%d, but %s is missing", dir,
                  c.shared_I, s13 ? tensor_files[W_SHARED_W2] : tensor_files[W_SHARED_W13]);
    if (c.shared_I == 0 && (s13 || s2 || c.shared_gate))
        die_usage("--inputs: %s/%s is there, but layer.txt gives no shared_intermediate", dir,
                  s13 ? tensor_files[W_SHARED_W13]
                      : s2 ? tensor_files[W_SHARED_W2] : tensor_files[W_SHARED_GATE]);
    for (int i = 0; i < W_COUNT; i++) {
        uint64_t shape[3];
        int nd = tensor_shape(&c, i, shape);
        if (!tensor_count(&c, i))
            continue;
        open_npy(dir, tensor_files[i], &nf, path, sizeof path);
        if (!npy_expect(&nf, tensor_is_f32(i) ? "<f4" : "<u2", nd, shape, tensor_shapes[i],
                        err, sizeof err))
            die_usage("--inputs: %s (E=%d, H=%d, I=%d, I_s=%d)", err, c.E, c.H, c.I, c.shared_I);
        npy_close(&nf);
    }

    /* The tokens: x.npy and x_*.npy, grouped by T. */
    DIR *d = opendir(dir);
    if (!d)
        die_usage("--inputs: %s: can't list: %s", dir, strerror(errno));
    char *names[256];
    int n_names = 0;
    for (struct dirent *de; (de = readdir(d));) {
        const char *nm = de->d_name;
        size_t len = strlen(nm);
        bool is_x = strcmp(nm, "x.npy") == 0 ||
                    (len > 6 && strncmp(nm, "x_", 2) == 0 && strcmp(nm + len - 4, ".npy") == 0);
        if (!is_x)
            continue;
        if (n_names == (int)(sizeof names / sizeof *names))
            die_usage("--inputs: %s: more than %zu x files", dir, sizeof names / sizeof *names);
        names[n_names] = bench_xmalloc(len + 1);
        memcpy(names[n_names++], nm, len + 1);
    }
    closedir(d);
    if (!n_names)
        die_usage("--inputs: %s holds no x.npy or x_*.npy (the tokens, [T, H] '<u2')", dir);
    qsort(names, (size_t)n_names, sizeof *names, cmp_str);
    uint64_t T_of[256];
    uint64_t found[MAX_TOKEN_COUNTS * 4];
    size_t n_found = 0;
    for (int i = 0; i < n_names; i++) {
        open_npy(dir, names[i], &nf, path, sizeof path);
        if (strcmp(nf.descr, "<u2") != 0 || nf.ndim != 2 || nf.shape[1] != (uint64_t)c.H ||
            nf.shape[0] == 0 || nf.shape[0] > (1u << 20)) {
            char sh[160];
            npy_shape_text(nf.ndim, nf.shape, sh, sizeof sh);
            die_usage("--inputs: %s: holds %s %s, expected tokens [T, %d] as '<u2' (bf16 bits), "
                      "1 <= T <= 1048576",
                      path, nf.descr, sh, c.H);
        }
        T_of[i] = nf.shape[0];
        npy_close(&nf);
        size_t j = 0;
        while (j < n_found && found[j] != T_of[i])
            j++;
        if (j == n_found) {
            if (n_found == sizeof found / sizeof *found)
                die_usage("--inputs: %s: too many token counts", dir);
            found[n_found++] = T_of[i];
        }
    }
    qsort(found, n_found, sizeof *found, cmp_u64);
    if (tokens_given) { /* --tokens picks; each must have a file */
        for (size_t t = 0; t < a->n_tokens; t++) {
            size_t j = 0;
            while (j < n_found && found[j] != a->tokens[t])
                j++;
            if (j == n_found) {
                char list[512] = "";
                for (size_t q = 0; q < n_found; q++)
                    append(list, sizeof list, "%s%" PRIu64, q ? ", " : "", found[q]);
                die_usage("--inputs: no x file of %s has T=%" PRIu64 " (they have T = %s)", dir,
                          a->tokens[t], list);
            }
        }
    } else {
        if (n_found > MAX_TOKEN_COUNTS)
            die_usage("--inputs: %s: x files of %zu token counts, at most %d (pick with --tokens)",
                      dir, n_found, MAX_TOKEN_COUNTS);
        memcpy(a->tokens, found, n_found * sizeof *found);
        a->n_tokens = n_found;
    }
    for (size_t t = 0; t < a->n_tokens; t++) {
        x_files *x = &xin[t];
        for (int i = 0; i < n_names; i++) {
            if (T_of[i] != a->tokens[t])
                continue;
            if (x->n == MAX_X)
                die_usage("--inputs: %s: more than %d x files of T=%" PRIu64, dir, MAX_X,
                          a->tokens[t]);
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, names[i]);
            x->path[x->n] = bench_xmalloc(strlen(p) + 1);
            memcpy(x->path[x->n++], p, strlen(p) + 1);
        }
    }
    for (int i = 0; i < n_names; i++)
        free(names[i]);
    configs[0] = c;
    n_configs = 1;
}

/* ---- --baseline: an earlier run's CSV ---------------------------------------------------- */

/* The ours_ms of (config, T) rows of FILE into results[][].base_ms for this run's layers and
 * counts; exits 2 when the file can't be read or lacks the columns. */
static void read_baseline(const args *a)
{
    FILE *f = fopen(a->baseline, "r");
    if (!f)
        die_usage("--baseline: %s: can't open: %s", a->baseline, strerror(errno));
    char line[4096];
    int col_config = -1, col_T = -1, col_ms = -1, lineno = 0;
    size_t rows = 0, matched = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        bench_chomp(line);
        if (!line[0])
            continue;
        char *cell[64];
        int n = 0;
        for (char *s = line; n < 64;) { /* empty cells kept: columns stay in place */
            char *comma = strchr(s, ',');
            if (comma)
                *comma = '\0';
            cell[n++] = trim(s);
            if (!comma)
                break;
            s = comma + 1;
        }
        if (col_config < 0) { /* the header */
            for (int i = 0; i < n; i++) {
                if (strcmp(cell[i], "config") == 0)
                    col_config = i;
                else if (strcmp(cell[i], "T") == 0)
                    col_T = i;
                else if (strcmp(cell[i], "ours_ms") == 0)
                    col_ms = i;
            }
            if (col_config < 0 || col_T < 0 || col_ms < 0)
                die_usage("--baseline: %s: the first line lacks the columns config, T and "
                          "ours_ms (not a bench_moe.csv?)",
                          a->baseline);
            continue;
        }
        int need = col_config > col_T ? col_config : col_T;
        need = need > col_ms ? need : col_ms;
        if (n <= need)
            die_usage("--baseline: %s:%d: %d cells, the header has more", a->baseline, lineno, n);
        char *end = NULL;
        uint64_t T = strtoull(cell[col_T], &end, 10);
        if (!end || *end || cell[col_T][0] == '-')
            die_usage("--baseline: %s:%d: T '%s' is not a count", a->baseline, lineno,
                      cell[col_T]);
        double ms = strtod(cell[col_ms], &end);
        if (!end || *end)
            die_usage("--baseline: %s:%d: ours_ms '%s' is not a number", a->baseline, lineno,
                      cell[col_ms]);
        rows++;
        for (size_t ci = 0; ci < n_configs; ci++)
            for (size_t ti = 0; ti < a->n_tokens; ti++)
                if (a->on[ci] && a->tokens[ti] == T && strcmp(configs[ci].name, cell[col_config]) == 0 &&
                    isnan(results[ci][ti].base_ms) && !isnan(ms) && ms > 0) {
                    results[ci][ti].base_ms = ms;
                    matched++;
                }
    }
    bool read_error = ferror(f) != 0;
    fclose(f);
    if (read_error)
        die_usage("--baseline: %s: read failed", a->baseline);
    size_t points = 0;
    for (size_t ci = 0; ci < n_configs; ci++)
        points += a->on[ci] ? a->n_tokens : 0;
    printf("baseline: %s (%s): %zu rows, %zu of this run's %zu points have a time there\n",
           a->baseline, a->baseline_label, rows, matched, points);
}

/* ---- command line ---------------------------------------------------------------------- */

/* "mixtral, qwen3moe, ...": the built-in layers' names. */
static const char *config_names(void)
{
    static char names[256];
    if (!names[0])
        for (size_t i = 0; i < N_BUILTIN; i++)
            append(names, sizeof names, "%s%s", i ? ", " : "", builtin_configs[i].name);
    return names;
}

static void usage(const char *prog)
{
    printf("usage: %s [--out DIR] [--quick] [--configs NAME,...] [--tokens 1,16,64,...] "
           "[--backend auto|mma|sm90] [--inputs DIR | --save-inputs DIR] "
           "[--baseline FILE [--baseline-label NAME]] [--fp8] [--view-align BYTES]\n"
           "  the fused MoE layer (sc_moe_forward) against its floor, a PyTorch expert loop "
           "and torch._grouped_mm\n"
           "  --out DIR          also write bench_moe.csv and bench_moe.png into DIR\n"
           "  --quick            T = 1, 64, 4096 and half the repetitions (a smoke test)\n"
           "  --configs          the layers to run (default: all): %s\n"
           "  --tokens           the token counts (default 1,16,64,256,1024,4096,16384,32768; "
           "with --inputs: those of its x files)\n"
           "  --backend          auto (default), mma or sm90: the layer's GEMMs\n"
           "  --inputs DIR       one layer on the weights and tokens of DIR (.npy files and "
           "layer.txt: see the source's header); the peer loads them too\n"
           "  --save-inputs DIR  write each layer's random weights and tokens to DIR/NAME in "
           "that format\n"
           "  --baseline FILE    an earlier run's bench_moe.csv: its ours_ms beside ours, and "
           "the ratio\n"
           "  --baseline-label   the baseline's name in the table (default \"baseline\", e.g. "
           "v1)\n"
           "  --fp8              each layer whose H and I are multiples of 128 also with fp8 "
           "experts (e4m3, 128 x 128 block scales; NAME-fp8), on the same tokens and routing, "
           "and the peer's fp8 layers (SM90 backend; not with --inputs or --save-inputs)\n"
           "  --view-align BYTES the v2 layers' views of one allocation: the first BYTES in, "
           "each at the next multiple of BYTES (default 16, as a checkpoint loaded whole; "
           "256: every view aligned)\n"
           "environment: SAFECUDA_BENCH_PYTHON (default python3), SAFECUDA_BENCH_NO_PEER=1 "
           "(skip the torch peer), SAFECUDA_BENCH_PEERS (the peers' folder)\n",
           prog, config_names());
}

static void parse_configs(const char *list, args *a)
{
    memset(a->on, 0, sizeof a->on);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < n_configs && strcmp(configs[i].name, tok) != 0)
            i++;
        if (i == n_configs)
            die_usage("unknown config '%s' (%s)", tok, config_names());
        a->on[i] = true;
    }
}

static void parse_tokens(const char *list, args *a)
{
    a->n_tokens = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(tok, &end, 10);
        if (errno || !end || *end || v == 0 || v > (1ull << 20) || tok[0] == '-')
            die_usage("bad token count '%s' (1 .. 1048576)", tok);
        if (a->n_tokens == MAX_TOKEN_COUNTS)
            die_usage("at most %d token counts", MAX_TOKEN_COUNTS);
        for (size_t i = 0; i < a->n_tokens; i++)
            if (a->tokens[i] == v)
                die_usage("token count %llu given twice", v);
        a->tokens[a->n_tokens++] = v;
    }
    if (a->n_tokens == 0)
        die_usage("--tokens needs at least one count");
}

/* "--name VALUE" or "--name=VALUE": the value, else NULL. */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    const char *s = argv[*i];
    size_t n = strlen(name);
    if (strncmp(s, name, n) != 0)
        return NULL;
    if (s[n] == '=')
        return s + n + 1;
    if (s[n] == '\0') {
        if (*i + 1 >= argc)
            die_usage("%s needs a value", name);
        return argv[++*i];
    }
    return NULL;
}

/* --fp8: after the built-in layers, the fp8 twin of each that can have fp8 experts, on when
 * its layer is; fp8_twin[] links them. */
static void add_fp8_twins(args *a)
{
    for (size_t i = 0; i < MAX_CONFIGS; i++)
        fp8_twin[i] = -1;
    if (!a->fp8)
        return;
    const size_t n = n_configs;
    for (size_t i = 0; i < n && n_configs < MAX_CONFIGS; i++) {
        if (!fp8_eligible(&configs[i], NULL, 0))
            continue;
        moe_config t = configs[i];
        snprintf(twin_names[n_configs], sizeof twin_names[0], "%s" FP8_SUFFIX, configs[i].name);
        t.name = twin_names[n_configs];
        t.fp8 = true;
        t.base = (int)i;
        fp8_twin[i] = (int)n_configs;
        a->on[n_configs] = a->on[i];
        configs[n_configs++] = t;
    }
}

static args parse_args(int argc, char **argv)
{
    args a;
    memset(&a, 0, sizeof a);
    a.baseline_label = "baseline";
    const char *cfg = NULL, *tokens = NULL, *v;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--quick") == 0) {
            a.o.quick = true;
        } else if (strcmp(s, "--fp8") == 0) {
            a.fp8 = true;
        } else if ((v = opt_value(argc, argv, &i, "--out"))) {
            a.o.out_dir = v;
        } else if ((v = opt_value(argc, argv, &i, "--configs"))) {
            cfg = v;
        } else if ((v = opt_value(argc, argv, &i, "--tokens"))) {
            tokens = v;
        } else if ((v = opt_value(argc, argv, &i, "--inputs"))) {
            a.inputs_dir = v;
        } else if ((v = opt_value(argc, argv, &i, "--save-inputs"))) {
            a.save_dir = v;
        } else if ((v = opt_value(argc, argv, &i, "--baseline-label"))) {
            a.baseline_label = v;
        } else if ((v = opt_value(argc, argv, &i, "--baseline"))) {
            a.baseline = v;
        } else if ((v = opt_value(argc, argv, &i, "--view-align"))) {
            char *end;
            errno = 0;
            const unsigned long long n = strtoull(v, &end, 10);
            if (errno || *end || n < 16 || n > 4096 || (n & (n - 1)))
                die_usage("--view-align '%s': a power of two from 16 to 4096 (bytes)", v);
            view_align = n;
        } else if ((v = opt_value(argc, argv, &i, "--backend"))) {
            if (strcmp(v, "auto") == 0)
                a.backend = SC_MOE_BACKEND_AUTO;
            else if (strcmp(v, "mma") == 0)
                a.backend = SC_MOE_BACKEND_MMA;
            else if (strcmp(v, "sm90") == 0)
                a.backend = SC_MOE_BACKEND_SM90;
            else
                die_usage("unknown backend '%s' (auto, mma, sm90)", v);
        } else if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            memcpy(configs, builtin_configs, sizeof builtin_configs);
            n_configs = N_BUILTIN;
            usage(argv[0]);
            exit(0);
        } else {
            die_usage("unknown argument '%s' (try --help)", s);
        }
    }
    if (a.o.out_dir && !*a.o.out_dir)
        a.o.out_dir = NULL;
    if (a.fp8 && (a.inputs_dir || a.save_dir))
        die_usage("--fp8 is not with %s: the fp8 layers' weights are made here, no file holds "
                  "them",
                  a.inputs_dir ? "--inputs" : "--save-inputs");
    if (a.fp8 && a.backend == SC_MOE_BACKEND_MMA)
        die_usage("--fp8 is not with --backend mma: fp8 experts run on the SM90 backend only");
    if (a.o.out_dir)
        bench_make_out_dir(argv[0], a.o.out_dir); /* made now, or refused before the run */
    if (a.inputs_dir && (!*a.inputs_dir || cfg || a.save_dir))
        die_usage("--inputs DIR names one layer: not with --configs or --save-inputs");
    if (a.save_dir && !*a.save_dir)
        die_usage("--save-inputs needs a folder");
    if (a.baseline && !*a.baseline)
        die_usage("--baseline needs a file");
    if (!name_ok(a.baseline_label) || strlen(a.baseline_label) > 12)
        die_usage("--baseline-label '%s': 1 to 12 letters, digits, '_', '-', '.'",
                  a.baseline_label);
    if (tokens)
        parse_tokens(tokens, &a);
    if (a.inputs_dir) {
        load_inputs(&a, tokens != NULL);
    } else {
        memcpy(configs, builtin_configs, sizeof builtin_configs);
        n_configs = N_BUILTIN;
        if (!tokens) {
            const uint64_t *t = a.o.quick ? quick_tokens : default_tokens;
            size_t n = a.o.quick ? sizeof quick_tokens / sizeof *quick_tokens
                                 : sizeof default_tokens / sizeof *default_tokens;
            memcpy(a.tokens, t, n * sizeof *t);
            a.n_tokens = n;
        }
    }
    for (size_t i = 0; i < n_configs; i++)
        a.on[i] = true;
    if (cfg)
        parse_configs(cfg, &a);
    add_fp8_twins(&a);
    return a;
}

static int reps_for(const args *a, uint64_t T)
{
    int r = T <= ROTATE_MAX_T ? 20 : T < BIG_T ? 10 : 5;
    return a->o.quick ? (r / 2 > 2 ? r / 2 : 2) : r;
}

/* The inputs a point uses in turn. */
static uint64_t inputs_at(const args *a, size_t ti)
{
    if (a->inputs_dir)
        return (uint64_t)xin[ti].n;
    return a->tokens[ti] <= ROTATE_MAX_T ? NX : 1;
}

/* ---- the peer ---------------------------------------------------------------------------- */

static size_t token_index(const args *a, uint64_t T)
{
    for (size_t i = 0; i < a->n_tokens; i++)
        if (a->tokens[i] == T)
            return i;
    return SIZE_MAX;
}

/* Layer c as the peer's spec: NAME:E:K:H:I:SCORING:RENORM:BIAS (what bench_graph passes
 * too), then the v2 layer's options as KEY=VALUE fields, only where they differ from the
 * v1 layer. */
static void peer_spec(const moe_config *c, char *specs, size_t size)
{
    size_t n = strlen(specs);
    snprintf(specs + n, size - n, "%s%s:%d:%d:%d:%d:%s:%d:%d", n ? "," : "", c->name, c->E,
             c->k, c->H, c->I, c->scoring == SC_MOE_SIGMOID ? "sigmoid" : "softmax",
             c->renormalize ? 1 : 0, c->bias ? 1 : 0);
    if (c->n_group)
        append(specs, size, ":group=%d/%d", c->n_group, c->topk_group);
    if (c->routed_scaling != 0.f)
        append(specs, size, ":scale=%.9g", (double)c->routed_scaling);
    if (c->router_bias)
        append(specs, size, ":rbias=1");
    if (c->act != SC_MOE_SILU)
        append(specs, size, ":act=%s", activation_name(c->act));
    if (c->swiglu_alpha != 0.f)
        append(specs, size, ":alpha=%.9g", (double)c->swiglu_alpha);
    if (c->swiglu_limit != 0.f)
        append(specs, size, ":limit=%.9g", (double)c->swiglu_limit);
    if (c->layout == SC_MOE_W13_INTERLEAVED)
        append(specs, size, ":layout=interleaved");
    if (c->w13_bias && c->w2_bias)
        append(specs, size, ":ebias=1");
    else if (c->w13_bias || c->w2_bias)
        append(specs, size, ":%s=1", c->w13_bias ? "w13bias" : "w2bias");
    if (c->shared_I)
        append(specs, size, ":shared=%d", c->shared_I);
    if (c->shared_gate)
        append(specs, size, ":sgate=1");
}

/* A peer point of one of the layers and token counts run. */
static bool peer_point(void *user, const char *config, uint64_t T, double loop_ms,
                       double grouped_ms)
{
    const args *a = user;
    size_t ci = 0;
    while (ci < n_configs && strcmp(configs[ci].name, config) != 0)
        ci++;
    size_t ti = token_index(a, T);
    if (ci == n_configs || ti == SIZE_MAX)
        return false;
    results[ci][ti].loop_ms = loop_ms;
    results[ci][ti].grouped_ms = grouped_ms;
    return true;
}

static void run_peer(const args *a, bench_moe_peer *p)
{
    char specs[2048] = "", tokens[512] = "";
    for (size_t i = 0; i < n_configs; i++)
        if (a->on[i] && !configs[i].fp8) /* --fp8: the peer makes the twins itself */
            peer_spec(&configs[i], specs, sizeof specs);
    for (size_t i = 0; i < a->n_tokens; i++)
        append(tokens, sizeof tokens, "%s%" PRIu64, i ? "," : "", a->tokens[i]);
    int budget = a->o.quick ? 120 : 180; /* seconds of measuring; then nan for the rest */

    char peer_args[3072] = "--specs "; /* bench_peer_open's command line holds 4096 */
    bench_shell_quote(peer_args, sizeof peer_args, specs);
    strncat(peer_args, " --tokens ", sizeof peer_args - strlen(peer_args) - 1);
    bench_shell_quote(peer_args, sizeof peer_args, tokens);
    if (a->inputs_dir) { /* the same files; the spec is checked against them there */
        strncat(peer_args, " --inputs ", sizeof peer_args - strlen(peer_args) - 1);
        bench_shell_quote(peer_args, sizeof peer_args, a->inputs_dir);
    }
    append(peer_args, sizeof peer_args, " --budget %d%s%s", budget, a->o.quick ? " --quick" : "",
           a->fp8 ? " --fp8" : "");
    const int limit = budget + 90; /* torch's start, the weights, the last point */
    bench_moe_peer_run(PEER_SCRIPT, peer_args, limit, peer_point, (void *)a, p);
}

/* ---- random data ------------------------------------------------------------------------- */

/* A device block of BLOCK_ELEMS bf16 values ~ N(0, stddev), made on the host in the pinned
 * staging buffer (Irwin-Hall: the sum of 4 random bytes, standardized) and uploaded. */
sc_buffer make_block(env *e, double stddev, const char *label)
{
    uint16_t table[4 * 255 + 1];
    const double sd = nolibm_sqrt(4.0 * (256.0 * 256.0 - 1.0) / 12.0);
    for (int s = 0; s <= 4 * 255; s++)
        table[s] = f32_to_bf16((float)((s - 510) / sd * stddev));
    void *ptr = NULL;
    uint64_t bytes = 0;
    SC_TRY(sc_host_buffer_ptr(e->staging, &ptr, &bytes)); /* waits for its last upload */
    uint16_t *v = ptr;
    uint64_t st = e->rng;
    for (uint64_t i = 0; i < BLOCK_ELEMS; i += 2) {
        uint64_t r = bench_rand(&st);
        v[i] = table[(r & 0xff) + ((r >> 8) & 0xff) + ((r >> 16) & 0xff) + ((r >> 24) & 0xff)];
        v[i + 1] = table[((r >> 32) & 0xff) + ((r >> 40) & 0xff) + ((r >> 48) & 0xff) +
                         (r >> 56)];
    }
    e->rng = st;
    sc_buffer b;
    SC_TRY(sc_buffer_create(e->ctx,
                            &(sc_buffer_desc){.dtype = SC_BF16, .count = BLOCK_ELEMS,
                                              .label = label, .stream = e->st},
                            &b));
    SC_TRY(sc_copy_from_host_buffer(e->st, sc_view_of(b), e->staging, 0));
    return b;
}

/* Elements [off, off + n) of dst from the block, in pieces of at most half the block, each
 * from a random (aligned) offset of it. */
void fill_random(env *e, sc_buffer dst, uint64_t off, uint64_t n, sc_buffer blk)
{
    while (n) {
        uint64_t len = n < BLOCK_ELEMS / 2 ? n : BLOCK_ELEMS / 2;
        uint64_t slots = (BLOCK_ELEMS - len) / ALIGN_ELEMS + 1;
        uint64_t src = (bench_rand(&e->rng) % slots) * ALIGN_ELEMS;
        sc_view d, s;
        SC_TRY(sc_buffer_view(dst, off, len, &d));
        SC_TRY(sc_buffer_view(blk, src, len, &s));
        SC_TRY(sc_copy(e->st, d, s));
        off += len;
        n -= len;
    }
}

sc_buffer new_buffer(env *e, sc_dtype dtype, uint64_t count, const char *label)
{
    sc_buffer b;
    SC_TRY(sc_buffer_create(e->ctx,
                            &(sc_buffer_desc){.dtype = dtype, .count = count, .label = label,
                                              .stream = e->st},
                            &b));
    return b;
}

static sc_buffer new_bf16(env *e, uint64_t count, const char *label)
{
    return new_buffer(e, SC_BF16, count, label);
}

/* ---- files <-> device, through the pinned staging buffer ------------------------------------ */

/* The next v.count elements of the open file into the view (its dtype's size is the file's). */
static void upload_npy(env *e, npy_file *nf, sc_view v, uint64_t n)
{
    const uint64_t per = BLOCK_ELEMS * 2 / nf->elem_size;
    char err[768];
    for (uint64_t done = 0; done < n;) {
        const uint64_t len = n - done < per ? n - done : per;
        void *ptr = NULL;
        uint64_t bytes = 0;
        SC_TRY(sc_host_buffer_ptr(e->staging, &ptr, &bytes)); /* waits for the last upload */
        if (!npy_read(nf, ptr, len, err, sizeof err)) {
            printf("FAILED: --inputs: %s\n", err);
            exit(1);
        }
        sc_view sub;
        SC_TRY(sc_view_sub(v, done, len, &sub));
        SC_TRY(sc_copy_from_host_buffer(e->st, sub, e->staging, 0));
        done += len;
    }
}

/* The view's n elements of elem_size bytes into the file being written. */
static void download_npy(env *e, npy_writer *w, sc_view v, uint64_t n, size_t elem_size)
{
    const uint64_t per = BLOCK_ELEMS * 2 / elem_size;
    char err[768];
    for (uint64_t done = 0; done < n;) {
        const uint64_t len = n - done < per ? n - done : per;
        sc_view sub;
        SC_TRY(sc_view_sub(v, done, len, &sub));
        SC_TRY(sc_copy_to_host_buffer(e->st, e->staging, 0, sub));
        void *ptr = NULL;
        uint64_t bytes = 0;
        SC_TRY(sc_host_buffer_ptr(e->staging, &ptr, &bytes)); /* waits for the copy */
        if (!npy_write(w, ptr, len, err, sizeof err)) {
            npy_abandon(w);
            printf("FAILED: --save-inputs: %s\n", err);
            exit(1);
        }
        done += len;
    }
}

/* Write the view (a tensor of ndim/shape, '<u2' or '<f4') to path. */
static void save_view(env *e, const char *path, sc_view v, bool f32, int ndim,
                      const uint64_t *shape)
{
    npy_writer w;
    char err[768];
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    if (!npy_create(&w, path, f32 ? "<f4" : "<u2", ndim, shape, err, sizeof err)) {
        printf("FAILED: --save-inputs: %s\n", err);
        exit(1);
    }
    download_npy(e, &w, v, n, f32 ? 4 : 2);
    if (!npy_finish(&w, err, sizeof err)) {
        printf("FAILED: --save-inputs: %s\n", err);
        exit(1);
    }
}

static void make_dir(const char *path)
{
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        printf("FAILED: --save-inputs: can't make %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

/* ---- the weights --------------------------------------------------------------------------- */

/* The buffers (or the two allocations) and the tensors' views. */
static void weights_create(env *e, const moe_config *c, layer_weights *w)
{
    char label[3][96];
    snprintf(label[0], sizeof label[0], "%s checkpoint (bf16)", c->name);
    snprintf(label[1], sizeof label[1], "%s checkpoint (f32)", c->name);
    snprintf(label[2], sizeof label[2], "%s checkpoint (e4m3)", c->name);
    if (w->one_alloc) {
        w->all_bf16 = new_buffer(e, SC_BF16, w->bf16_elems, label[0]);
        if (w->f32_elems)
            w->all_f32 = new_buffer(e, SC_F32, w->f32_elems, label[1]);
        if (w->f8_elems)
            w->all_f8 = new_buffer(e, SC_F8E4M3, w->f8_elems, label[2]);
    }
    for (int i = 0; i < W_COUNT; i++) {
        tensor *t = &w->t[i];
        if (!t->count)
            continue;
        if (w->one_alloc) {
            t->buf = t->dtype == SC_F32 ? w->all_f32 : t->dtype == SC_F8E4M3 ? w->all_f8
                                                                                : w->all_bf16;
            SC_TRY(sc_buffer_view(t->buf, t->off, t->count, &t->v));
        } else {
            t->buf = new_buffer(e, t->dtype, t->count, t->label);
            t->off = 0;
            t->v = sc_view_of(t->buf);
        }
    }
}

/* Uniform f32 values in [-half, half), made on the host. */
void upload_uniform(env *e, const tensor *t, float half)
{
    float *v = bench_xmalloc(t->count * sizeof *v);
    for (uint64_t i = 0; i < t->count; i++)
        v[i] = (float)((double)(bench_rand(&e->rng) >> 11) / 9007199254740992.0 - 0.5) *
               (2.0f * half);
    SC_TRY(sc_copy_from_host(e->st, t->v, v, t->count * sizeof *v));
    free(v);
}

/* Random values in every tensor (the bf16 ones from two random blocks: fan-in H and fan-in
 * I); returns when they are there. */
static void weights_fill(env *e, const moe_config *c, layer_weights *w)
{
    const uint64_t E = (uint64_t)c->E, H = (uint64_t)c->H, I = (uint64_t)c->I;
    const tensor *t = w->t;
    sc_buffer blk_h = make_block(e, 1.0 / nolibm_sqrt((double)H), "random block 1/sqrt(H)");
    sc_buffer blk_i = make_block(e, 1.0 / nolibm_sqrt((double)I), "random block 1/sqrt(I)");
    fill_random(e, t[W_ROUTER].buf, t[W_ROUTER].off, t[W_ROUTER].count, blk_h);
    for (uint64_t x = 0; x < E; x++) {
        fill_random(e, t[W_W13].buf, t[W_W13].off + x * 2 * I * H, 2 * I * H, blk_h);
        fill_random(e, t[W_W2].buf, t[W_W2].off + x * H * I, H * I, blk_i);
    }
    if (t[W_SEL_BIAS].count)
        upload_uniform(e, &t[W_SEL_BIAS], 0.05f);
    /* The shared expert's W2 from the 1/sqrt(I) block: its outputs are sqrt(I_s / I) times
     * a routed expert's, at most 4x (I_s <= 16 I). */
    static const int bf16_more[] = {W_SHARED_W13, W_SHARED_W2, W_SHARED_GATE};
    for (size_t i = 0; i < sizeof bf16_more / sizeof *bf16_more; i++) {
        const tensor *s = &t[bf16_more[i]];
        if (s->count)
            fill_random(e, s->buf, s->off, s->count, bf16_more[i] == W_SHARED_W2 ? blk_i : blk_h);
    }
    static const int f32_more[] = {W_ROUTER_BIAS, W_W13_BIAS, W_W2_BIAS};
    for (size_t i = 0; i < sizeof f32_more / sizeof *f32_more; i++)
        if (t[f32_more[i]].count)
            upload_uniform(e, &t[f32_more[i]], 0.1f);
    SC_TRY(sc_buffer_destroy(blk_h)); /* after the copies from them (stream-ordered) */
    SC_TRY(sc_buffer_destroy(blk_i));
    SC_TRY(sc_stream_synchronize(e->st));
}

/* Every tensor from its file under c->dir (checked again: the files may have changed since
 * the start); returns when they are there. */
static void weights_load(env *e, const moe_config *c, layer_weights *w)
{
    for (int i = 0; i < W_COUNT; i++) {
        const tensor *t = &w->t[i];
        if (!t->count)
            continue;
        char path[1024], err[768];
        npy_file nf;
        uint64_t shape[3];
        const int nd = tensor_shape(c, i, shape);
        snprintf(path, sizeof path, "%s/%s", c->dir, tensor_files[i]);
        if (!npy_open(&nf, path, err, sizeof err) ||
            !npy_expect(&nf, tensor_is_f32(i) ? "<f4" : "<u2", nd, shape, tensor_shapes[i], err,
                        sizeof err)) {
            printf("FAILED: --inputs: %s\n", err);
            exit(1);
        }
        upload_npy(e, &nf, t->v, t->count);
        npy_close(&nf);
    }
    SC_TRY(sc_stream_synchronize(e->st));
}

/* --save-inputs: layer.txt and every tensor into DIR/NAME. */
static void weights_save(env *e, const args *a, const moe_config *c, const layer_weights *w)
{
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/%s", a->save_dir, c->name);
    make_dir(a->save_dir);
    make_dir(dir);
    snprintf(path, sizeof path, "%s/layer.txt", dir);
    if (!write_layer_txt(path, c)) {
        printf("FAILED: --save-inputs: writing %s failed: %s\n", path, strerror(errno));
        exit(1);
    }
    const uint64_t t0 = bench_now_ns();
    uint64_t bytes = 0;
    for (int i = 0; i < W_COUNT; i++) {
        const tensor *t = &w->t[i];
        if (!t->count)
            continue;
        uint64_t shape[3];
        const int nd = tensor_shape(c, i, shape);
        snprintf(path, sizeof path, "%s/%s", dir, tensor_files[i]);
        save_view(e, path, t->v, tensor_is_f32(i), nd, shape);
        bytes += t->count * (tensor_is_f32(i) ? 4 : 2);
    }
    printf("  saved the weights to %s: %.2f GB in %.1f s\n", dir, (double)bytes * 1e-9,
           (double)(bench_now_ns() - t0) * 1e-9);
}

static void weights_destroy(layer_weights *w)
{
    if (w->one_alloc) {
        SC_TRY(sc_buffer_destroy(w->all_bf16));
        if (w->all_f32.id)
            SC_TRY(sc_buffer_destroy(w->all_f32));
        if (w->all_f8.id)
            SC_TRY(sc_buffer_destroy(w->all_f8));
    } else {
        for (int i = 0; i < W_COUNT; i++)
            if (w->t[i].count)
                SC_TRY(sc_buffer_destroy(w->t[i].buf));
    }
}

/* The layer over the weights: whole buffers for the v1 layers (as v1 takes them), views of
 * the allocations for the others. */
static sc_moe_desc layer_desc(const args *a, const moe_config *c, const layer_weights *w,
                              uint64_t max_T)
{
    const tensor *t = w->t;
    sc_moe_desc d = {.experts = c->E, .top_k = c->k, .hidden = c->H, .intermediate = c->I,
                     .dtype = SC_BF16, .scoring = c->scoring, .renormalize = c->renormalize,
                     .max_tokens = max_T, .label = c->name, .backend = a->backend,
                     .n_group = c->n_group, .topk_group = c->topk_group,
                     .routed_scaling = c->routed_scaling, .activation = c->act,
                     .swiglu_alpha = c->swiglu_alpha, .swiglu_limit = c->swiglu_limit,
                     .w13_layout = c->layout, .shared_intermediate = c->shared_I};
    if (w->one_alloc) {
        d.router_view = t[W_ROUTER].v;
        d.w13_view = t[W_W13].v;
        d.w2_view = t[W_W2].v;
        if (t[W_SEL_BIAS].count)
            d.selection_bias_view = t[W_SEL_BIAS].v;
    } else {
        d.router = t[W_ROUTER].buf;
        d.w13 = t[W_W13].buf;
        d.w2 = t[W_W2].buf;
        if (t[W_SEL_BIAS].count)
            d.selection_bias = t[W_SEL_BIAS].buf;
    }
    if (t[W_ROUTER_BIAS].count)
        d.router_bias = t[W_ROUTER_BIAS].v;
    if (t[W_W13_BIAS].count)
        d.w13_bias = t[W_W13_BIAS].v;
    if (t[W_W2_BIAS].count)
        d.w2_bias = t[W_W2_BIAS].v;
    if (t[W_SHARED_W13].count) {
        d.shared_w13 = t[W_SHARED_W13].v;
        d.shared_w2 = t[W_SHARED_W2].v;
    }
    if (t[W_SHARED_GATE].count)
        d.shared_gate = t[W_SHARED_GATE].v;
    if (c->fp8) { /* the e4m3 experts (buffers or views as above) and their block scales */
        d.expert_dtype = SC_F8E4M3;
        d.w13_scale = t[W_W13_SCALE].v;
        d.w2_scale = t[W_W2_SCALE].v;
        if (t[W_SHARED_W13_SCALE].count) {
            d.shared_w13_scale = t[W_SHARED_W13_SCALE].v;
            d.shared_w2_scale = t[W_SHARED_W2_SCALE].v;
        }
    }
    return d;
}

/* "sigmoid + selection bias, groups 4 of 8, renormalized, x2.5, shared expert I_s=2048" */
static void describe(const moe_config *c, char *buf, size_t size)
{
    buf[0] = '\0';
    append(buf, size, "%s%s%s", c->scoring == SC_MOE_SIGMOID ? "sigmoid" : "softmax",
           c->router_bias ? " + router bias" : "", c->bias ? " + selection bias" : "");
    if (c->n_group)
        append(buf, size, ", groups %d of %d", c->topk_group, c->n_group);
    append(buf, size, "%s", c->renormalize ? ", renormalized" : ", not renormalized");
    if (c->routed_scaling != 0.f)
        append(buf, size, ", x%g", (double)c->routed_scaling);
    if (c->act != SC_MOE_SILU)
        append(buf, size, ", %s", c->act == SC_MOE_GELU_TANH ? "GeLU(tanh)" : "clamped SwiGLU");
    if (c->swiglu_alpha != 0.f || c->swiglu_limit != 0.f)
        append(buf, size, " (alpha %g, limit %g)", (double)c->swiglu_alpha,
               (double)c->swiglu_limit);
    if (c->layout == SC_MOE_W13_INTERLEAVED)
        append(buf, size, ", W13 interleaved");
    if (c->w13_bias || c->w2_bias)
        append(buf, size, ", %s biases",
               c->w13_bias && c->w2_bias ? "W13/W2" : c->w13_bias ? "W13" : "W2");
    if (c->shared_I)
        append(buf, size, ", shared expert I_s=%d%s", c->shared_I,
               c->shared_gate ? " (gated)" : "");
    if (c->dir)
        append(buf, size, "; inputs from %s", c->dir);
    if (c->fp8 && kept[c->base].host[W_ROUTER])
        append(buf, size, "; e4m3 experts (128 x 128 block scales), x and out bf16, the router "
               "and tokens of %s", configs[c->base].name);
    else if (c->fp8)
        append(buf, size, "; e4m3 experts (128 x 128 block scales), x and out bf16, a router "
               "and tokens of its own (%s made no weights)", configs[c->base].name);
}

/* Device time of one forward (events around it); *host_us: the host time of the call. */
static float time_one(env *e, sc_moe layer, sc_view x, sc_view out, double *host_us)
{
    SC_TRY(sc_event_record(e->ev0, e->st));
    uint64_t h0 = bench_now_ns();
    SC_TRY(sc_moe_forward(e->st, layer, x, out, NULL));
    *host_us = (double)(bench_now_ns() - h0) * 1e-3;
    SC_TRY(sc_event_record(e->ev1, e->st));
    SC_TRY(sc_event_synchronize(e->ev1));
    float ms = 0.f;
    SC_TRY(sc_event_elapsed(e->ev0, e->ev1, &ms));
    return ms;
}

/* ---- the copy rate: 1 GiB sc_copy D2D, (read + write bytes) / time, median of 10 ---------- */

static double measure_copy_tbs(env *e)
{
    const uint64_t n = GIB / 2; /* bf16 elements */
    sc_buffer src = new_bf16(e, n, "copy src"), dst = new_bf16(e, n, "copy dst");
    fill_random(e, src, 0, n, e->xblk);
    for (int i = 0; i < 2; i++)
        SC_TRY(sc_copy(e->st, sc_view_of(dst), sc_view_of(src)));
    double ms[10];
    for (int i = 0; i < 10; i++) {
        SC_TRY(sc_event_record(e->ev0, e->st));
        SC_TRY(sc_copy(e->st, sc_view_of(dst), sc_view_of(src)));
        SC_TRY(sc_event_record(e->ev1, e->st));
        SC_TRY(sc_event_synchronize(e->ev1));
        float f = 0.f;
        SC_TRY(sc_event_elapsed(e->ev0, e->ev1, &f));
        ms[i] = f;
    }
    SC_TRY(sc_buffer_destroy(src));
    SC_TRY(sc_buffer_destroy(dst));
    SC_TRY(sc_context_trim(e->ctx));
    return 2.0 * (double)GIB / (bench_median(ms, 10) * 1e-3) * 1e-12;
}

/* ---- the read rate: 1 GiB read by a streaming kernel, bytes / time, median of 10 ----------
 * A forward mostly reads (its weights), and a read-only stream outruns a copy's read + write
 * rate, so the floor's bandwidth is the larger of the two. The kernel reads 16 bytes per
 * load, four loads in flight per thread, and folds them into a word that is stored only if
 * it equals a constant (so the loads can't be dropped and nearly nothing is written). */
static const char read_kernel_src[] =
    "extern \"C\" __global__ void __launch_bounds__(512)\n"
    "bench_read(const uint4 *a, unsigned long long n, unsigned *out)\n"
    "{\n"
    "    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n"
    "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    unsigned acc = 0;\n"
    "    for (; i + 3 * stride < n; i += 4 * stride) {\n"
    "        const uint4 v0 = __ldcs(a + i), v1 = __ldcs(a + i + stride);\n"
    "        const uint4 v2 = __ldcs(a + i + 2 * stride), v3 = __ldcs(a + i + 3 * stride);\n"
    "        acc ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w;\n"
    "        acc ^= v2.x ^ v2.y ^ v2.z ^ v2.w ^ v3.x ^ v3.y ^ v3.z ^ v3.w;\n"
    "    }\n"
    "    for (; i < n; i += stride) {\n"
    "        const uint4 v = __ldcs(a + i);\n"
    "        acc ^= v.x ^ v.y ^ v.z ^ v.w;\n"
    "    }\n"
    "    if (acc == 0x9e3779b9u)\n"
    "        out[blockIdx.x] = acc;\n"
    "}\n";

static double measure_read_tbs(env *e, int sm_count)
{
    const uint64_t n = GIB / 2; /* bf16 elements */
    const uint32_t blocks = (uint32_t)sm_count * 4;
    sc_buffer src = new_bf16(e, n, "read src");
    sc_buffer out = new_buffer(e, SC_U32, blocks, "read out");
    fill_random(e, src, 0, n, e->xblk);
    sc_program prog;
    sc_module mod;
    sc_kernel k;
    SC_TRY(sc_program_create(e->ctx,
                             &(sc_program_desc){.source = read_kernel_src, .name = "bench_read.cu"},
                             &prog));
    SC_TRY(sc_module_load(e->ctx, prog, &mod));
    SC_TRY(sc_kernel_get(mod, "bench_read", &k));
    const sc_launch_desc cfg = {.grid = {blocks, 1, 1}, .block = {512, 1, 1}};
    double ms[10];
    for (int i = -2; i < 10; i++) {
        SC_TRY(sc_event_record(e->ev0, e->st));
        SC_TRY(SC_LAUNCH(e->st, k, &cfg, sc_arg_in(sc_view_of(src)), sc_arg_u64(GIB / 16),
                         sc_arg_out(sc_view_of(out))));
        SC_TRY(sc_event_record(e->ev1, e->st));
        SC_TRY(sc_event_synchronize(e->ev1));
        float f = 0.f;
        SC_TRY(sc_event_elapsed(e->ev0, e->ev1, &f));
        if (i >= 0)
            ms[i] = f;
    }
    SC_TRY(sc_module_destroy(mod));
    SC_TRY(sc_program_destroy(prog));
    SC_TRY(sc_buffer_destroy(src));
    SC_TRY(sc_buffer_destroy(out));
    SC_TRY(sc_context_trim(e->ctx));
    return (double)GIB / (bench_median(ms, 10) * 1e-3) * 1e-12;
}

/* ---- one layer ---------------------------------------------------------------------------- */

/* The floor of a forward over T tokens whose routing used `used` distinct routed experts
 * (the header's formula; an fp8 twin's: bench_moe_fp8.c). */
static floor_terms floor_for(const moe_config *c, uint64_t T, int used, const rates *r)
{
    if (c->fp8)
        return floor_for_fp8(c, T, used, r);
    const double copy_tbs = r->mem_tbs, tflops = r->tflops;
    const double E = c->E, k = c->k, H = c->H, I = c->I, Is = c->shared_I, t = (double)T;
    const double gate = c->shared_gate ? 1.0 : 0.0;
    const double per_expert =
        3.0 * H * I * 2.0 + (c->w13_bias ? 2.0 * I * 4.0 : 0.0) + (c->w2_bias ? H * 4.0 : 0.0);
    floor_terms f;
    f.weight_bytes = used * per_expert                                  /* routed, used */
                     + E * H * 2.0 + ((c->bias ? E : 0) + (c->router_bias ? E : 0)) * 4.0
                     + 3.0 * H * Is * 2.0 + gate * H * 2.0; /* the shared expert: always */
    f.bytes = f.weight_bytes + 2.0 * t * H * 2.0;           /* x and out */
    f.flops = 2.0 * t * E * H + 2.0 * t * k * 3.0 * H * I + 2.0 * t * 3.0 * H * Is +
              gate * 2.0 * t * H;
    f.bw_ms = f.bytes / (copy_tbs * 1e12) * 1e3;
    f.flop_ms = f.flops / (tflops * 1e12) * 1e3;
    f.floor_ms = dmax(f.bw_ms, f.flop_ms);
    return f;
}

/* Device bytes a point of T tokens and nx inputs needs: the weights, the layer's workspace
 * (an upper bound of src/moe/plan.c's: router logits with the split router's slices, ids
 * and weights, per-row indices and weights, h, y and the SM90 backend's x in expert order;
 * an fp8 twin's: its e4m3 weights, and x and h in e4m3 with their scales), the inputs, out,
 * the expert ids and the random blocks. */
static uint64_t bytes_needed(const moe_config *c, uint64_t T, uint64_t nx)
{
    const uint64_t E = (uint64_t)c->E, k = (uint64_t)c->k, H = (uint64_t)c->H,
                   I = (uint64_t)c->I, S = ((uint64_t)c->shared_I + I - 1) / I,
                   rows = T * (k + S); /* the shared expert: S more rows per token */
    const uint64_t split_rows = (T < 2048 ? T : 2048) * 16;
    const uint64_t logit_rows = T > split_rows ? T : split_rows;
    layer_weights w;
    weights_layout(c, &w);
    const uint64_t ws = c->fp8 ? workspace_bound_fp8(c, T)
                               : logit_rows * (E + 1) * 4 + T * k * 8 + rows * 4 * 3 + T * 4 +
                                     rows * (I + 64) * 2 + rows * H * 2 + rows * (H + 64) * 2 +
                                     (4 * (E + S) + 8) * 4; /* (SM90's A rows padded by 64) */
    const uint64_t io = (nx + 1) * T * H * 2 + T * k * 4;
    return weights_bytes(&w) + ws + io + 2 * BLOCK_ELEMS * 2;
}

static void fmt_ms(char *buf, size_t size, double v)
{
    if (isnan(v))
        snprintf(buf, size, "-");
    else if (v < 0.1)
        snprintf(buf, size, "%.4f", v);
    else if (v < 1)
        snprintf(buf, size, "%.3f", v);
    else if (v < 10)
        snprintf(buf, size, "%.2f", v);
    else if (v < 100)
        snprintf(buf, size, "%.1f", v);
    else
        snprintf(buf, size, "%.0f", v);
}

static void fmt_ratio(char *buf, size_t size, double num, double den)
{
    if (isnan(num) || isnan(den) || den <= 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.2fx", num / den);
}

static int base_width(const args *a)
{
    int n = (int)strlen(a->baseline_label) + 3;
    return n > 9 ? n : 9;
}

static void print_header(const args *a, bool fp8)
{
    printf("  %6s %7s %9s %9s %8s %5s %7s %7s", "T", "experts", "ours ms", "floor ms", "% floor",
           "bound", "wt GB/s", "TFLOP/s");
    if (a->baseline) {
        char h1[32], h2[32];
        snprintf(h1, sizeof h1, "%s ms", a->baseline_label);
        snprintf(h2, sizeof h2, "vs %s", a->baseline_label);
        printf(" %*s %*s", base_width(a), h1, base_width(a), h2);
    }
    printf(" %9s %10s %8s %10s%s\n", "loop ms", "grouped ms", "vs loop", "vs grouped",
           fp8 ? "  vs bf16" : "");
}

/* The bf16 layer's time / its fp8 twin's at token count ti (NAN unless both measured). */
static double fp8_speedup(size_t twin, size_t ti)
{
    const point *p = &results[twin][ti], *b = &results[configs[twin].base][ti];
    return p->measured && b->measured ? b->ours_ms / p->ours_ms : NAN;
}

static void print_row(const args *a, size_t ci, size_t ti)
{
    const point *p = &results[ci][ti];
    const double ours = p->measured ? p->ours_ms : NAN;
    char ex[32] = "-", om[32], fl[32], pct[32] = "-", bound[8] = "-", gbs[32] = "-",
         tf[32] = "-", bm[32], vb[32], lp[32], gm[32], vl[32], vg[32];
    fmt_ms(om, sizeof om, ours);
    fmt_ms(fl, sizeof fl, p->measured ? p->floor_ms : NAN);
    fmt_ms(bm, sizeof bm, p->base_ms);
    fmt_ms(lp, sizeof lp, p->loop_ms);
    fmt_ms(gm, sizeof gm, p->grouped_ms);
    fmt_ratio(vb, sizeof vb, p->base_ms, ours);
    fmt_ratio(vl, sizeof vl, p->loop_ms, ours);
    fmt_ratio(vg, sizeof vg, p->grouped_ms, ours);
    if (p->measured) {
        if (p->experts_min == p->experts_max)
            snprintf(ex, sizeof ex, "%d", p->experts_min);
        else
            snprintf(ex, sizeof ex, "%d-%d", p->experts_min, p->experts_max);
        snprintf(pct, sizeof pct, "%.1f%%%s", p->pct, p->pct > 100.0 ? "!" : "");
        snprintf(bound, sizeof bound, "%s", p->bw_ms >= p->flop_ms ? "mem" : "flops");
        snprintf(gbs, sizeof gbs, "%.0f", p->weight_gbs);
        snprintf(tf, sizeof tf, "%.0f", p->tflops);
    }
    printf("  %6" PRIu64 " %7s %9s %9s %8s %5s %7s %7s", a->tokens[ti], ex, om, fl, pct, bound,
           gbs, tf);
    if (a->baseline)
        printf(" %*s %*s", base_width(a), bm, base_width(a), vb);
    printf(" %9s %10s %8s %10s", lp, gm, vl, vg);
    if (configs[ci].fp8) {
        char sp[32];
        fmt_ratio(sp, sizeof sp, fp8_speedup(ci, ti), 1.0);
        printf(" %8s", sp);
    }
    printf("\n");
    if (p->measured && p->prof.steps > 0) {
        printf("         host %.1f us; steps (ms):", p->host_us);
        for (int i = 0; i < p->prof.steps; i++)
            printf(" %s %.3f%s", p->prof.name[i], (double)p->prof.ms[i],
                   i + 1 < p->prof.steps ? " |" : "");
        printf("\n");
    }
}

/* The experts the layer's routing chooses for x: one forward with expert_ids (filled with -1
 * first), copied back. Returns the distinct routed experts; ids outside 0 .. E-1 are counted
 * into *bad (the first one's slot into *first_bad). */
static int experts_used(env *e, sc_moe layer, const moe_config *c, sc_view x, sc_view out,
                        sc_buffer ids, uint64_t T, uint64_t *bad, uint64_t *first_bad)
{
    const uint64_t n = T * (uint64_t)c->k;
    const int32_t poison = -1;
    SC_TRY(sc_fill(e->st, sc_view_of(ids), &poison));
    SC_TRY(sc_moe_forward(e->st, layer, x, out,
                          &(sc_moe_forward_desc){.expert_ids = sc_view_of(ids)}));
    if (e->ids_elems < n) {
        free(e->ids);
        e->ids = bench_xmalloc(n * sizeof *e->ids);
        e->ids_elems = n;
    }
    SC_TRY(sc_copy_to_host(e->st, e->ids, n * sizeof *e->ids, sc_view_of(ids)));
    bool seen[SC_MOE_MAX_EXPERTS] = {false};
    int distinct = 0;
    for (uint64_t i = 0; i < n; i++) {
        const int32_t id = e->ids[i];
        if (id < 0 || id >= c->E) {
            if (!*bad)
                *first_bad = i;
            ++*bad;
        } else if (!seen[id]) {
            seen[id] = true;
            distinct++;
        }
    }
    return distinct;
}

/* Measure layer ci at token count ti (the point's inputs, experts, floor, timing, check). */
static void run_point(env *e, const args *a, size_t ci, size_t ti, sc_moe layer,
                      const rates *rt)
{
    const moe_config *c = &configs[ci];
    point *p = &results[ci][ti];
    point *twin_of = c->fp8 ? &results[c->base][ti] : NULL; /* an fp8 twin's bf16 point */
    const uint64_t H = (uint64_t)c->H, T = a->tokens[ti], TH = T * H;
    const uint64_t nx = inputs_at(a, ti);
    sc_buffer xb = new_bf16(e, nx * TH, "x"), ob = new_bf16(e, TH, "out");
    sc_buffer ib = new_buffer(e, SC_I32, T * (uint64_t)c->k, "expert ids");
    sc_view xv[MAX_X], ov = sc_view_of(ob);
    for (uint64_t i = 0; i < nx; i++)
        SC_TRY(sc_buffer_view(xb, i * TH, TH, &xv[i]));
    const uint64_t shape[2] = {T, H};
    if (a->inputs_dir) {
        for (uint64_t i = 0; i < nx; i++) {
            npy_file nf;
            char err[768];
            if (!npy_open(&nf, xin[ti].path[i], err, sizeof err) ||
                !npy_expect(&nf, "<u2", 2, shape, "tokens [T, H]", err, sizeof err)) {
                printf("FAILED: --inputs: %s\n", err);
                exit(1);
            }
            upload_npy(e, &nf, xv[i], TH);
            npy_close(&nf);
        }
    } else if (twin_of && twin_of->x_drawn) { /* the bf16 layer's tokens, drawn again */
        const uint64_t keep = e->rng;
        e->rng = twin_of->x_rng;
        fill_random(e, xb, 0, nx * TH, e->xblk);
        e->rng = keep;
    } else {
        p->x_rng = e->rng;
        p->x_drawn = true;
        fill_random(e, xb, 0, nx * TH, e->xblk);
    }
    if (a->save_dir)
        for (uint64_t i = 0; i < nx; i++) {
            char path[1200];
            snprintf(path, sizeof path, "%s/%s/x_T%" PRIu64 "_%" PRIu64 ".npy", a->save_dir,
                     c->name, T, i);
            save_view(e, path, xv[i], false, 2, shape);
        }

    /* The experts each input's routing uses, and so its floor. */
    floor_terms fl[MAX_X];
    uint64_t bad = 0, first_bad = 0, bad_input = 0;
    p->experts_min = SC_MOE_MAX_EXPERTS + 1;
    p->experts_max = 0;
    for (uint64_t i = 0; i < nx; i++) {
        uint64_t before = bad;
        int used = experts_used(e, layer, c, xv[i], ov, ib, T, &bad, &first_bad);
        if (bad && !before)
            bad_input = i;
        fl[i] = floor_for(c, T, used, rt);
        p->used[i] = used;
        p->experts_min = used < p->experts_min ? used : p->experts_min;
        p->experts_max = used > p->experts_max ? used : p->experts_max;
        if (twin_of && twin_of->measured && twin_of->used[i] != used)
            printf("  note: %s T=%" PRIu64 ": input %" PRIu64 " routed to %d distinct experts, "
                   "%d in %s (same router and tokens: near-ties summed in another order?)\n",
                   c->name, T, i, used, twin_of->used[i], configs[c->base].name);
    }

    const uint64_t w0 = bench_now_ns();
    for (int i = 0; i < 1000 && (i < WARMUP || bench_now_ns() - w0 < WARMUP_NS); i++) {
        SC_TRY(sc_moe_forward(e->st, layer, xv[(uint64_t)i % nx], ov, NULL));
        SC_TRY(sc_stream_synchronize(e->st));
    }
    const int reps = reps_for(a, T);
    double ms[MAX_REPS], host[MAX_REPS], ratio[MAX_REPS], gbs[MAX_REPS];
    double floor_sum = 0, bw_sum = 0;
    for (int r = 0; r < reps; r++) {
        const uint64_t i = (uint64_t)r % nx;
        ms[r] = time_one(e, layer, xv[i], ov, &host[r]);
        ratio[r] = fl[i].floor_ms / ms[r]; /* each forward against its own input's floor */
        gbs[r] = fl[i].weight_bytes / (ms[r] * 1e-3) * 1e-9;
        floor_sum += fl[i].floor_ms;
        bw_sum += fl[i].bw_ms;
    }
    p->ours_ms = bench_median(ms, (size_t)reps);
    p->host_us = bench_median(host, (size_t)reps);
    p->pct = 100.0 * bench_median(ratio, (size_t)reps);
    p->weight_gbs = bench_median(gbs, (size_t)reps);
    p->floor_ms = floor_sum / reps;
    p->bw_ms = bw_sum / reps;
    p->flop_ms = fl[0].flop_ms;
    p->tflops = fl[0].flops / (p->ours_ms * 1e-3) * 1e-12;
    p->measured = true;
    SC_TRY(sc_moe_forward(e->st, layer, xv[0], ov, &(sc_moe_forward_desc){.profile = &p->prof}));

    /* The check: out all NaN, one forward, no NaN or Inf may remain; every id an expert. */
    const uint16_t nan_bits = 0x7fc0;
    SC_TRY(sc_fill(e->st, ov, &nan_bits));
    SC_TRY(sc_moe_forward(e->st, layer, xv[0], ov, NULL));
    if (e->host_elems < TH) {
        free(e->host);
        e->host = bench_xmalloc(TH * sizeof(uint16_t));
        e->host_elems = TH;
    }
    SC_TRY(sc_copy_to_host(e->st, e->host, TH * sizeof(uint16_t), ov));
    uint64_t nonfinite = 0, nonzero = 0, first_nf = 0;
    for (uint64_t i = 0; i < TH; i++) {
        uint16_t v = e->host[i];
        if ((v & 0x7f80u) == 0x7f80u) {
            if (!nonfinite)
                first_nf = i;
            nonfinite++;
        }
        nonzero += (v & 0x7fffu) != 0;
    }
    if (nonfinite) {
        fflush(stdout);
        printf("FAILED: %s T=%" PRIu64 ": out holds %" PRIu64 " NaN/Inf values of %" PRIu64
               " (first at token %" PRIu64 ", column %" PRIu64 ": 0x%04x)\n",
               c->name, T, nonfinite, TH, first_nf / H, first_nf % H, e->host[first_nf]);
        exit(1);
    }
    if (bad) {
        fflush(stdout);
        printf("FAILED: %s T=%" PRIu64 ": the routing's expert ids hold %" PRIu64
               " values outside 0 .. %d (input %" PRIu64 ", first at token %" PRIu64
               ", slot %" PRIu64 ")\n",
               c->name, T, bad, c->E - 1, bad_input, first_bad / (uint64_t)c->k,
               first_bad % (uint64_t)c->k);
        exit(1);
    }
    if (!nonzero)
        printf("  warning: %s T=%" PRIu64 ": out is all zeros\n", c->name, T);
    print_row(a, ci, ti);
    if (p->pct > 100.0)
        printf("  WARNING: %s T=%" PRIu64 " reads %.1f %% of its floor: faster than the floor "
               "allows. The floor's rates (memory %.2f TB/s, matmul %.0f TFLOP/s%s) are below "
               "what this forward reached, or its bytes or FLOPs are counted wrong, or the "
               "timing is: this point's %% of floor is not a result\n",
               c->name, T, p->pct, rt->mem_tbs, c->fp8 ? rt->f8_tflops : rt->tflops,
               c->fp8 ? " e4m3" : "");
    fflush(stdout);
    SC_TRY(sc_buffer_destroy(xb));
    SC_TRY(sc_buffer_destroy(ob));
    SC_TRY(sc_buffer_destroy(ib));
}

/* Measure layer ci at its token counts; false when its sc_moe_create failed (printed). */
static bool run_config(env *e, const args *a, size_t ci, const rates *rt)
{
    const moe_config *c = &configs[ci];
    if (c->fp8 && fp8_unsupported[0]) {
        printf("\n== %s: skipped: %s\n", c->name, fp8_unsupported);
        kept_free(&kept[c->base]);
        return true;
    }
    layer_weights w;
    weights_layout(c, &w);
    char what[1400];
    describe(c, what, sizeof what);
    printf("\n== %s: E=%d k=%d H=%d I=%d, %s; weights %.2f GB%s", c->name, c->E, c->k,
           c->H, c->I, what, (double)weights_bytes(&w) * 1e-9,
           w.one_alloc ? ", views of one allocation per dtype" : ", separate buffers");
    if (w.one_alloc)
        printf(" at %" PRIu64 "-byte offsets", view_align);
    printf("\n");

    /* The counts that fit in the free memory (the weights included: none exist yet). */
    uint64_t free_b = 0, total_b = 0, maxT = 0;
    SC_TRY(sc_context_trim(e->ctx));
    SC_TRY(sc_device_memory(0, &free_b, &total_b));
    for (size_t ti = 0; ti < a->n_tokens; ti++) {
        const uint64_t T = a->tokens[ti], need = bytes_needed(c, T, inputs_at(a, ti)) + GIB / 2;
        if (need > free_b) {
            results[ci][ti].no_room = true;
            printf("  T=%" PRIu64 ": skipped: needs %.1f GB of device memory (weights %.1f GB, "
                   "workspace, inputs and output), %.1f GB free\n",
                   T, (double)need * 1e-9, (double)weights_bytes(&w) * 1e-9,
                   (double)free_b * 1e-9);
        } else if (T > maxT) {
            maxT = T;
        }
    }
    if (!maxT) {
        printf("  skipped: no token count fits\n");
        print_header(a, c->fp8);
        for (size_t ti = 0; ti < a->n_tokens; ti++)
            print_row(a, ci, ti);
        if (c->fp8)
            kept_free(&kept[c->base]);
        return true;
    }

    /* An fp8 twin draws its random numbers from its own stream: the bf16 layers after it get
     * the numbers they get without --fp8. */
    uint64_t bf16_rng = e->rng;
    if (c->fp8)
        e->rng = e->rng_fp8;
    uint64_t t0 = bench_now_ns();
    weights_create(e, c, &w);
    if (c->dir) {
        weights_load(e, c, &w);
    } else if (c->fp8) {
        weights_fill_fp8(e, c, &w, &kept[c->base]);
        kept_free(&kept[c->base]);
    } else {
        weights_fill(e, c, &w);
        if (fp8_twin[ci] >= 0 && a->on[fp8_twin[ci]])
            kept_save(e, &w, &kept[ci]);
    }
    double made_s = (double)(bench_now_ns() - t0) * 1e-9;

    t0 = bench_now_ns();
    sc_moe layer;
    sc_moe_desc desc = layer_desc(a, c, &w, maxT);
    sc_status cs = sc_moe_create(e->ctx, &desc, &layer);
    if (cs != SC_OK) {
        printf("FAILED: %s: sc_moe_create returned %s: %s\n", c->name, sc_status_name(cs),
               sc_last_error());
        weights_destroy(&w);
        SC_TRY(sc_context_trim(e->ctx));
        if (c->fp8) {
            e->rng_fp8 = e->rng;
            e->rng = bf16_rng;
        }
        return false;
    }
    SC_TRY(sc_stream_synchronize(e->st));
    double create_s = (double)(bench_now_ns() - t0) * 1e-9;
    uint64_t ws = 0;
    SC_TRY(sc_moe_workspace_bytes(layer, &ws));
    printf("  weights %s in %.2f s; sc_moe_create %.2f s (kernels compiled or loaded from the "
           "cache); workspace %.2f GB for %" PRIu64 " tokens\n",
           c->dir ? "read" : "made", made_s, create_s, (double)ws * 1e-9, maxT);
    if (a->save_dir)
        weights_save(e, a, c, &w);
    print_header(a, c->fp8);
    for (size_t ti = 0; ti < a->n_tokens; ti++) {
        if (results[ci][ti].no_room)
            print_row(a, ci, ti);
        else
            run_point(e, a, ci, ti, layer, rt);
    }

    SC_TRY(sc_moe_destroy(layer));
    weights_destroy(&w);
    SC_TRY(sc_context_trim(e->ctx));
    if (c->fp8) {
        e->rng_fp8 = e->rng;
        e->rng = bf16_rng;
    }
    return true;
}

/* ---- output ------------------------------------------------------------------------------ */

static void csv_num(FILE *f, double v, const char *sep)
{
    if (isnan(v) || !isfinite(v))
        fprintf(f, "nan%s", sep);
    else
        fprintf(f, "%.6g%s", v, sep);
}

/* The order layers are run and written in: each bf16 layer, then its fp8 twin. */
static size_t run_order(size_t order[MAX_CONFIGS])
{
    size_t n = 0;
    for (size_t ci = 0; ci < n_configs; ci++) {
        if (configs[ci].fp8)
            continue;
        order[n++] = ci;
        if (fp8_twin[ci] >= 0)
            order[n++] = (size_t)fp8_twin[ci];
    }
    return n;
}

static bool write_csv(const args *a, char *path, size_t path_size)
{
    FILE *f = bench_open_out(&a->o, "bench_moe.csv", path, path_size);
    if (!f)
        return false;
    fprintf(f, "config,T,ours_ms,floor_ms,pct_floor,experts_min,experts_max,weight_gbs,tflops,"
               "bound,loop_ms,grouped_ms,baseline_ms,vs_baseline,precision,vs_bf16\n");
    size_t order[MAX_CONFIGS];
    const size_t n = run_order(order);
    for (size_t oi = 0; oi < n; oi++) {
        const size_t ci = order[oi];
        if (!a->on[ci])
            continue;
        for (size_t ti = 0; ti < a->n_tokens; ti++) {
            const point *p = &results[ci][ti];
            const bool m = p->measured;
            fprintf(f, "%s,%" PRIu64 ",", configs[ci].name, a->tokens[ti]);
            csv_num(f, m ? p->ours_ms : NAN, ",");
            csv_num(f, m ? p->floor_ms : NAN, ",");
            csv_num(f, m ? p->pct : NAN, ",");
            csv_num(f, m ? p->experts_min : NAN, ",");
            csv_num(f, m ? p->experts_max : NAN, ",");
            csv_num(f, m ? p->weight_gbs : NAN, ",");
            csv_num(f, m ? p->tflops : NAN, ",");
            fprintf(f, "%s,", !m ? "nan" : p->bw_ms >= p->flop_ms ? "mem" : "flops");
            csv_num(f, p->loop_ms, ",");
            csv_num(f, p->grouped_ms, ",");
            csv_num(f, p->base_ms, ",");
            csv_num(f, m && !isnan(p->base_ms) ? p->base_ms / p->ours_ms : NAN, ",");
            fprintf(f, "%s,", configs[ci].fp8 ? "fp8" : "bf16");
            csv_num(f, configs[ci].fp8 ? fp8_speedup(ci, ti) : NAN, "\n");
        }
    }
    bool ok = fclose(f) == 0;
    if (!ok)
        printf("note: writing %s failed\n", path);
    return ok;
}

/* python3 bench/plot_moe.py CSV PNG; a one-line result into msg. */
static void plot(const args *a, const char *csv, char *msg, size_t size)
{
    char png[1024];
    snprintf(png, sizeof png, "%s/bench_moe.png", a->o.out_dir);
    const char *py = getenv("SAFECUDA_BENCH_PYTHON");
    if (!py || !*py)
        py = "python3";
    char script[1024];
    snprintf(script, sizeof script, "%s/bench/plot_moe.py", SAFECUDA_SOURCE_DIR);
    char cmd[4096] = "";
    bench_shell_quote(cmd, sizeof cmd, py);
    strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
    bench_shell_quote(cmd, sizeof cmd, script);
    strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
    bench_shell_quote(cmd, sizeof cmd, csv);
    strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
    bench_shell_quote(cmd, sizeof cmd, png);
    strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    fflush(stdout);
    FILE *f = popen(cmd, "r");
    if (!f) {
        snprintf(msg, size, "not drawn (popen: %s)", strerror(errno));
        return;
    }
    char line[1024], last[512] = "";
    while (fgets(line, sizeof line, f)) {
        bench_chomp(line);
        if (line[0])
            snprintf(last, sizeof last, "%.500s", line);
    }
    int st = pclose(f);
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        snprintf(msg, size, "%.1000s", png);
    else
        snprintf(msg, size, "not drawn (exit %d: %.400s)",
                 st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1, last);
}

/* The summary's table: the T header, then for each layer chosen by `want` its rows (label,
 * cell(point, row) into buf). Returns the points above 100 % of their floors. */
typedef void (*cell_fn)(const args *a, size_t ci, size_t ti, int row, char *buf, size_t size);

static int summary_rows(const args *a, bool fp8, const char *const *labels, int n_rows,
                        cell_fn cell)
{
    const int width = fp8 ? 7 : 6; /* the labels' */
    printf("%-*s", 13 + width, "T");
    for (size_t ti = 0; ti < a->n_tokens; ti++)
        printf(" %7" PRIu64, a->tokens[ti]);
    printf("\n");
    int above = 0;
    for (size_t ci = 0; ci < n_configs; ci++) {
        if (!a->on[ci] || configs[ci].fp8 != fp8)
            continue;
        const char *name = fp8 ? configs[configs[ci].base].name : configs[ci].name;
        for (int r = 0; r < n_rows; r++) {
            printf("%-12.12s %-*s", r == 0 ? name : "", width, labels[r]);
            for (size_t ti = 0; ti < a->n_tokens; ti++) {
                char buf[32];
                cell(a, ci, ti, r, buf, sizeof buf);
                printf(" %7s", buf);
            }
            printf("\n");
        }
        for (size_t ti = 0; ti < a->n_tokens; ti++)
            above += results[ci][ti].measured && results[ci][ti].pct > 100.0;
    }
    return above;
}

static void pct_cell(const point *p, char *buf, size_t size)
{
    if (p->measured)
        snprintf(buf, size, "%.0f%%%s", p->pct, p->pct > 100.0 ? "!" : "");
    else
        snprintf(buf, size, "-");
}

/* bf16 layers: ms, %fl, x loop, x grpd, x base. */
static void bf16_cell(const args *a, size_t ci, size_t ti, int r, char *buf, size_t size)
{
    (void)a;
    const point *p = &results[ci][ti];
    const double ours = p->measured ? p->ours_ms : NAN;
    if (r == 0)
        fmt_ms(buf, size, ours);
    else if (r == 1)
        pct_cell(p, buf, size);
    else
        fmt_ratio(buf, size, r == 2 ? p->loop_ms : r == 3 ? p->grouped_ms : p->base_ms, ours);
}

/* fp8 twins: bf16 ms, fp8 ms, fp8 %fl, speedup, x loop, x grpd (torch fp8), x base. */
static void fp8_cell(const args *a, size_t ci, size_t ti, int r, char *buf, size_t size)
{
    (void)a;
    const point *p = &results[ci][ti], *b = &results[configs[ci].base][ti];
    const double ours = p->measured ? p->ours_ms : NAN;
    if (r == 0)
        fmt_ms(buf, size, b->measured ? b->ours_ms : NAN);
    else if (r == 1)
        fmt_ms(buf, size, ours);
    else if (r == 2)
        pct_cell(p, buf, size);
    else if (r == 3)
        fmt_ratio(buf, size, fp8_speedup(ci, ti), 1.0);
    else
        fmt_ratio(buf, size, r == 4 ? p->loop_ms : r == 5 ? p->grouped_ms : p->base_ms, ours);
}

static void summary(const args *a, const sc_device_props *props, double read_tbs, double copy_tbs,
                    const bench_moe_peer *peer, const rates *rt, bool tflops_nominal,
                    bool f8_nominal, const bool *failed, const char *csv, const char *png)
{
    printf("\n==== bench_moe summary: %s%s\n", props->name, a->o.quick ? " (--quick)" : "");
    char torch_copy[64] = "";
    if (!isnan(peer->copy_tbs))
        snprintf(torch_copy, sizeof torch_copy, "; torch %.2f", peer->copy_tbs);
    printf("floor rates: memory %.2f TB/s (the larger of: read %.2f TB/s, 1 GiB streaming "
           "kernel; copy %.2f TB/s, r+w, sc_copy 1 GiB%s), matmul %.0f TFLOP/s (%s); "
           "floor bytes count the experts each input's routing used\n",
           dmax(read_tbs, copy_tbs), read_tbs, copy_tbs, torch_copy, rt->tflops,
           tflops_nominal ? "nominal: no peer" : "torch bf16 8192^3");
    if (a->fp8) {
        char fast[64] = "";
        if (!isnan(peer->f8_fast_tflops))
            snprintf(fast, sizeof fast, "; with fast accumulation %.0f", peer->f8_fast_tflops);
        printf("fp8 floor: e4m3 matmul %.0f TFLOP/s (%s%s) for the experts' FLOPs, bf16 for "
               "the router's; bytes count e4m3 weights and their f32 block scales\n",
               rt->f8_tflops,
               f8_nominal ? "nominal: 2x the bf16 nominal, no peer rate"
                          : "torch _scaled_mm e4m3 8192^3, per-tensor scales, "
                            "use_fast_accum=False",
               fast);
    }
    printf("ms = median forward; %%fl = median of floor / time; x loop, x grpd = torch time / "
           "ours%s%s%s; -: not measured\n",
           a->baseline ? "; x base = " : "", a->baseline ? a->baseline_label : "",
           a->baseline ? " time / ours" : "");
    static const char *const rows[] = {"ms", "%fl", "x loop", "x grpd", "x base"};
    int above = summary_rows(a, false, rows, a->baseline ? 5 : 4, bf16_cell);
    if (a->fp8) {
        printf("fp8 experts (e4m3, 128 x 128 block scales), the same tokens and routing as bf16: "
               "bf16 ms, fp8 ms, fp8 %% of the fp8 floor, speedup = bf16 ms / fp8 ms; x loop8, "
               "x grpd8 = torch fp8 time / ours fp8 (torch scales per row, not per 128 x 128 "
               "block)\n");
        static const char *const rows8[] = {"bf16", "fp8", "%fl", "speedup", "x loop8",
                                            "x grpd8", "x base"};
        above += summary_rows(a, true, rows8, a->baseline ? 7 : 6, fp8_cell);
        for (size_t ci = 0; ci < n_configs; ci++) {
            char why[160];
            if (a->on[ci] && !configs[ci].fp8 && fp8_twin[ci] < 0 &&
                !fp8_eligible(&configs[ci], why, sizeof why))
                printf("%-19s no fp8 layer: %s\n", configs[ci].name, why);
        }
        if (fp8_unsupported[0])
            printf("fp8 layers skipped: %s\n", fp8_unsupported);
    }
    if (above) {
        printf("WARNING: %d point%s above 100 %% of the floor (marked !):", above,
               above == 1 ? "" : "s");
        for (size_t ci = 0; ci < n_configs; ci++)
            for (size_t ti = 0; ti < a->n_tokens; ti++)
                if (a->on[ci] && results[ci][ti].measured && results[ci][ti].pct > 100.0)
                    printf(" %s T=%" PRIu64 " (%.1f%%)", configs[ci].name, a->tokens[ti],
                           results[ci][ti].pct);
        printf("; their floors' rates are below what the forwards reached, or something is "
               "counted or timed wrong\n");
    }
    for (size_t ci = 0; ci < n_configs; ci++)
        if (failed[ci])
            printf("FAILED: %s: sc_moe_create failed (see above)\n", configs[ci].name);
    if (peer->ok)
        printf("peer: %s\n", peer->info[0] ? peer->info : "ok");
    else
        printf("peer: unavailable (%s)\n", peer->reason[0] ? peer->reason : "no output");
    if (peer->ok && a->fp8)
        printf("peer %s\n", peer->f8_info[0] ? peer->f8_info : "fp8: no fp8 layers (see above)");
    if (csv[0])
        printf("csv: %s; plot: %s\n", csv, png);
    else
        printf("no --out: no csv or plot written\n");
}

int main(int argc, char **argv)
{
    args a = parse_args(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (size_t ci = 0; ci < MAX_CONFIGS; ci++)
        for (size_t ti = 0; ti < MAX_TOKEN_COUNTS; ti++) {
            point *p = &results[ci][ti];
            p->loop_ms = p->grouped_ms = p->base_ms = NAN;
            p->floor_ms = p->pct = p->bw_ms = p->flop_ms = NAN;
        }
    if (a.baseline)
        read_baseline(&a);
    bench_require_gpu("bench_moe");
    sc_device_props props;
    char desc[512];
    bench_describe_device(0, &props, desc, sizeof desc);
    printf("bench_moe: %s\n", desc);
    printf("configs:");
    size_t order[MAX_CONFIGS];
    const size_t n_order = run_order(order);
    for (size_t oi = 0; oi < n_order; oi++)
        if (a.on[order[oi]])
            printf(" %s", configs[order[oi]].name);
    if (a.inputs_dir)
        printf(" (from %s)", a.inputs_dir);
    printf("; T:");
    for (size_t ti = 0; ti < a.n_tokens; ti++)
        printf(" %" PRIu64, a.tokens[ti]);
    printf("; median of %d (T <= %d) / %d (T < %d) / %d forwards after >= %d warm-up (>= %.1f "
           "s)%s\n",
           reps_for(&a, 1), ROTATE_MAX_T, reps_for(&a, BIG_T / 2), BIG_T, reps_for(&a, BIG_T),
           WARMUP, (double)WARMUP_NS * 1e-9, a.o.quick ? " (--quick)" : "");
    if (a.save_dir)
        printf("saving each layer's weights and tokens under %s/NAME\n", a.save_dir);
    if (a.fp8) {
        printf("--fp8: each layer then its fp8 twin NAME" FP8_SUFFIX " (e4m3 experts, 128 x 128 "
               "block scales) on the same tokens, router and biases\n");
        for (size_t ci = 0; ci < n_configs; ci++) {
            char why[160];
            if (a.on[ci] && !configs[ci].fp8 && !fp8_eligible(&configs[ci], why, sizeof why))
                printf("  %s: no fp8 layer: %s\n", configs[ci].name, why);
        }
        if (props.cc_major != 9 || props.cc_minor != 0)
            snprintf(fp8_unsupported, sizeof fp8_unsupported,
                     "fp8 experts need the SM90 backend (compute capability 9.0); this device is "
                     "%d.%d",
                     props.cc_major, props.cc_minor);
    }

    /* The peer first, alone on the GPU: nothing of ours is allocated yet. */
    bench_moe_peer peer;
    run_peer(&a, &peer);

    env e;
    memset(&e, 0, sizeof e);
    e.rng = 0x5AFEC0DA12345ULL;
    e.rng_fp8 = 0xF8E4A3B10C2D5ULL;
    SC_TRY(sc_context_create(&(sc_context_desc){.device = 0}, &e.ctx));
    SC_TRY(sc_context_default_stream(e.ctx, &e.st));
    SC_TRY(sc_event_create(e.ctx, &(sc_event_desc){.timing = true, .label = "t0"}, &e.ev0));
    SC_TRY(sc_event_create(e.ctx, &(sc_event_desc){.timing = true, .label = "t1"}, &e.ev1));
    SC_TRY(sc_host_buffer_create(
        e.ctx, &(sc_host_buffer_desc){.bytes = BLOCK_ELEMS * 2, .label = "staging"},
        &e.staging));
    e.xblk = make_block(&e, 1.0, "random block N(0,1)");

    const double copy_only_tbs = measure_copy_tbs(&e);
    const double read_tbs = measure_read_tbs(&e, props.sm_count);
    /* The floor's bandwidth: the faster of the two ways of moving bytes measured here. */
    const double copy_tbs = dmax(copy_only_tbs, read_tbs);
    double tflops = peer.matmul_tflops;
    bool nominal = isnan(tflops) || tflops <= 0;
    if (nominal) { /* dense bf16 tensor FLOP per SM per clock: 4096 on Hopper */
        double per_clk = props.cc_major >= 10 ? 8192 : props.cc_major == 9 ? 4096 : 2048;
        tflops = props.sm_count * (props.clock_khz * 1e3) * per_clk * 1e-12;
    }
    /* The e4m3 rate: the peer's _scaled_mm (use_fast_accum=False), else twice the bf16
     * nominal one (Hopper's dense e4m3 tensor rate). */
    double f8_tflops = peer.f8_tflops;
    const bool f8_nominal = isnan(f8_tflops) || f8_tflops <= 0;
    if (f8_nominal) {
        double per_clk = props.cc_major >= 10 ? 8192 : props.cc_major == 9 ? 4096 : 2048;
        f8_tflops = 2.0 * props.sm_count * (props.clock_khz * 1e3) * per_clk * 1e-12;
    }
    printf("\nrates: read %.3f TB/s (1 GiB by a streaming kernel, median of 10), copy %.3f TB/s "
           "(1 GiB sc_copy D2D, read + write, median of 10): the floor uses %.3f; matmul "
           "%.1f TFLOP/s (%s)\n",
           read_tbs, copy_only_tbs, copy_tbs, tflops,
           nominal ? "nominal, from the device properties" : "torch peer");
    if (a.fp8) {
        char fast[96] = "";
        if (!isnan(peer.f8_fast_tflops))
            snprintf(fast, sizeof fast, "; use_fast_accum=True: %.1f TFLOP/s",
                     peer.f8_fast_tflops);
        printf("rates: e4m3 matmul %.1f TFLOP/s (%s)%s: the fp8 floor's for the experts' "
               "FLOPs\n",
               f8_tflops,
               f8_nominal ? "nominal: twice the bf16 nominal rate, the peer gave none"
                          : "torch peer: _scaled_mm 8192^3, per-tensor scales, out bf16, "
                            "use_fast_accum=False",
               fast);
    }
    const rates rt = {.mem_tbs = copy_tbs, .tflops = tflops, .f8_tflops = f8_tflops};

    bool failed[MAX_CONFIGS] = {false};
    int rc = 0;
    for (size_t oi = 0; oi < n_order; oi++) {
        const size_t ci = order[oi];
        if (a.on[ci] && !run_config(&e, &a, ci, &rt)) {
            failed[ci] = true;
            rc = 1;
        }
    }

    SC_TRY(sc_buffer_destroy(e.xblk));
    SC_TRY(sc_host_buffer_destroy(e.staging));
    SC_TRY(sc_event_destroy(e.ev0));
    SC_TRY(sc_event_destroy(e.ev1));
    SC_TRY(sc_context_destroy(e.ctx));
    free(e.host);
    free(e.ids);

    char csv[1024] = "", png[1200] = "";
    if (write_csv(&a, csv, sizeof csv)) {
        plot(&a, csv, png, sizeof png);
    } else {
        csv[0] = '\0';
    }
    summary(&a, &props, read_tbs, copy_only_tbs, &peer, &rt, nominal, f8_nominal, failed, csv,
            png);
    return rc;
}
