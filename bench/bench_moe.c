/* bench_moe: the Mixture-of-Experts layer (sc_moe_forward) against its floor and PyTorch.
 *
 *   bench_moe [--out DIR] [--quick] [--configs NAME,...] [--tokens 1,16,64,...]
 *             [--backend auto|mma|sm90]
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
 * Token counts T = 1, 16, 64, 256, 1024, 4096, 16384; deepseek_v3 and kimi_k2 stop at 4096
 * to keep the run short (at 16384 each of their points costs about 3 s, most of it the
 * peer's expert loop, and dsv3's T=16384 runs the same GEMM shapes). --quick: 1, 64, 4096;
 * --tokens: the given counts for every layer.
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
 * - Timing: timing sc_events around each sc_moe_forward, synchronized after each; warm-up
 *   forwards (at least 3 and at least 0.1 s of them, the peer's rule too), then the median
 *   of 20 forwards for T <= 1024 and of 10 above (--quick halves them). Up to 1024 tokens
 *   four different inputs are used in turn, so the routing (and the experts read) changes
 *   from one forward to the next and L2 can't hold the answer.
 * - Check: after the timed runs, out is filled with NaN, one more forward runs, and out is
 *   copied back and scanned: any NaN or Inf (a row never written, or an overflow) fails
 *   the benchmark. Correctness against a reference is the test suite's job.
 * - Floor: max(bytes / copy rate, FLOPs / matmul rate). D = E (1 - (1 - k/E)^T) is the
 *   expected number of distinct experts a random routing touches (the v1 definition, kept
 *   for every layer: the routing is taken as k independent uniform choices per token; a
 *   later change will count the experts the routing really used). With I_s the shared
 *   expert's size (0 without one):
 *     bytes = D x (3 H I x 2 + (2I + H) x 4 with W13/W2 biases)      the experts touched
 *           + E H x 2 + E x 4 per f32 router vector (selection bias, router bias)
 *           + 3 H I_s x 2 + H x 2 with a gate row    the shared expert: read by every forward
 *           + 2 T H x 2                               x and out
 *     FLOPs = 2 T E H (router) + 2 T k 3 H I (routed experts) + 2 T 3 H I_s (shared expert)
 *           + 2 T H (gate row)
 *   (the element-wise work: scores, top-k, activations, bias adds, weights, the sum, is not
 *   counted). The copy rate is a 1 GiB sc_copy D2D (read + write bytes, median of 10)
 *   measured in this run; the matmul rate is the torch peer's bf16 8192^3 matmul in this
 *   run (a nominal figure from the device properties when the peer is unavailable).
 *   "% of floor" = floor / time.
 * - Peer: bench/peers/torch_moe.py runs first, alone on the GPU (kimi_k2's weights and ours
 *   would not fit together), for every point: a Hugging Face style expert loop and a
 *   torch._grouped_mm layer computing the same layer (group-limited routing, routed
 *   scaling, router bias, the shared expert and its gate as dense matmuls, the activation,
 *   the biases; interleaved rows made stacked once, untimed), timed the same way (see the
 *   script). It stops measuring after a time budget (180 s; --quick 120 s): nan after.
 *
 * Output: a table per layer, DIR/bench_moe.csv (config,T,ours_ms,floor_ms,pct_floor,
 * loop_ms,grouped_ms; a row per point a layer runs) and DIR/bench_moe.png
 * (bench/plot_moe.py) with --out DIR, and a summary of every point as the last lines. Exit
 * 77 with "skipped" without a GPU (tests/gpu_presence.h); any safecuda failure prints
 * sc_last_error() and exits 1, except a layer whose sc_moe_create fails: that is printed
 * as FAILED, the other layers still run, and the exit status is 1. */
#include <math.h> /* NAN, isnan, isfinite: macros only, no libm needed */
#include <stdarg.h>

#include "bench_common.h"
#include "safecuda/moe.h"

#define GIB (1ull << 30)
#define BLOCK_ELEMS (1ull << 25) /* 64 MiB of bf16: the random block weights are cut from */
#define ALIGN_ELEMS 128ull       /* offsets into the block: 256-byte aligned */
#define MAX_TOKEN_COUNTS 16
#define WARMUP 3               /* warm-up: at least this many forwards ... */
#define WARMUP_NS 100000000ull /* ... and at least 0.1 s of them */
#define ROTATE_MAX_T 1024 /* up to this many tokens, NX inputs are used in turn */
#define NX 4
#define PEER_SCRIPT "torch_moe.py"

typedef struct moe_config {
    const char *name;
    int E, k, H, I;
    sc_moe_scoring scoring;
    bool renormalize;
    bool bias;                 /* a random f32 selection bias (DeepSeek-V3's) */
    /* ---- the v2 layer's fields (zero: the v1 layer) ---- */
    int n_group, topk_group;   /* group-limited selection; 0, 0: none */
    float routed_scaling;      /* 0 means 1 */
    bool router_bias;          /* a random f32 bias added to the logits (gpt-oss) */
    sc_moe_activation act;
    sc_moe_w13_layout layout;
    bool expert_bias;          /* random f32 biases on W13 and W2 */
    int shared_I;              /* the shared expert's intermediate size I_s; 0: none */
    bool shared_gate;          /* the shared expert scaled by sigmoid(x . gate row) */
    bool one_alloc;            /* the weights as views of one allocation per dtype */
    uint64_t max_T;            /* the default token counts stop here; 0: all of them */
} moe_config;

static const moe_config all_configs[] = {
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
     .shared_I = 2048, .one_alloc = true, .max_T = 4096},
    {.name = "kimi_k2", .E = 384, .k = 8, .H = 7168, .I = 2048, .scoring = SC_MOE_SIGMOID,
     .renormalize = true, .bias = true, .n_group = 1, .topk_group = 1,
     .routed_scaling = 2.827f, .shared_I = 2048, .one_alloc = true, .max_T = 4096},
    {.name = "qwen3_next", .E = 512, .k = 10, .H = 2048, .I = 512, .scoring = SC_MOE_SOFTMAX,
     .renormalize = true, .shared_I = 512, .shared_gate = true, .one_alloc = true},
    {.name = "gpt_oss_120b", .E = 128, .k = 4, .H = 2880, .I = 2880,
     .scoring = SC_MOE_SOFTMAX, .renormalize = true, .router_bias = true,
     .act = SC_MOE_SWIGLU_CLAMP, .layout = SC_MOE_W13_INTERLEAVED, .expert_bias = true,
     .one_alloc = true},
};
#define N_CONFIGS (sizeof all_configs / sizeof all_configs[0])

static const uint64_t default_tokens[] = {1, 16, 64, 256, 1024, 4096, 16384};
static const uint64_t quick_tokens[] = {1, 64, 4096};

typedef struct point {
    bool measured;
    double ours_ms;
    double floor_ms, bw_ms, flop_ms;
    double loop_ms, grouped_ms; /* the peer's, NAN when it has none */
    double flops;               /* of the layer at this T */
    double host_us;             /* host time of the sc_moe_forward call (median) */
    sc_moe_profile prof;        /* one profiled forward after the timed ones */
} point;

typedef struct args {
    bench_opts o;
    sc_moe_backend backend;
    bool on[N_CONFIGS];
    uint64_t tokens[MAX_TOKEN_COUNTS];
    size_t n_tokens;
    bool tokens_given; /* --tokens: every layer runs every count */
} args;

typedef struct peer_result {
    bool ok;               /* at least one row came back */
    double matmul_tflops;  /* NAN when missing */
    double copy_tbs;
    char info[256];        /* the first "# ..." line */
    char reason[256];      /* why it is unavailable or incomplete */
    size_t rows;
} peer_result;

typedef struct env {
    sc_context ctx;
    sc_stream st;
    sc_event ev0, ev1;
    sc_host_buffer staging; /* BLOCK_ELEMS bf16, pinned */
    sc_buffer xblk;         /* random block for inputs, N(0, 1) */
    uint64_t rng;
    uint16_t *host;         /* copy-back of out for the check */
    size_t host_elems;
} env;

static point results[N_CONFIGS][MAX_TOKEN_COUNTS];

/* ---- small numerics without libm ---------------------------------------------------------- */

static double nolibm_sqrt(double v)
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

static double pow_u64(double base, uint64_t e)
{
    double r = 1.0;
    while (e) {
        if (e & 1)
            r *= base;
        base *= base;
        e >>= 1;
    }
    return r;
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

/* ---- command line ---------------------------------------------------------------------- */

/* "mixtral, qwen3moe, ...": the layers' names. */
static const char *config_names(void)
{
    static char names[256];
    if (!names[0])
        for (size_t i = 0; i < N_CONFIGS; i++) {
            size_t n = strlen(names);
            snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", all_configs[i].name);
        }
    return names;
}

static void usage(const char *prog)
{
    printf("usage: %s [--out DIR] [--quick] [--configs NAME,...] [--tokens 1,16,64,...] "
           "[--backend auto|mma|sm90]\n"
           "  the fused MoE layer (sc_moe_forward) against its floor, a PyTorch expert loop "
           "and torch._grouped_mm\n"
           "  --out DIR   also write bench_moe.csv and bench_moe.png into DIR\n"
           "  --quick     T = 1, 64, 4096 and half the repetitions (a smoke test)\n"
           "  --configs   the layers to run (default: all): %s\n"
           "  --tokens    the token counts for every layer (default 1,16,64,256,1024,4096,"
           "16384; deepseek_v3 and kimi_k2 up to 4096)\n"
           "  --backend   auto (default), mma or sm90: the layer's GEMMs\n"
           "environment: SAFECUDA_BENCH_PYTHON (default python3), SAFECUDA_BENCH_NO_PEER=1 "
           "(skip the torch peer), SAFECUDA_BENCH_PEERS (the peers' folder)\n",
           prog, config_names());
}

static void parse_configs(const char *prog, const char *list, args *a)
{
    memset(a->on, 0, sizeof a->on);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < N_CONFIGS && strcmp(all_configs[i].name, tok) != 0)
            i++;
        if (i == N_CONFIGS) {
            fprintf(stderr, "%s: unknown config '%s' (%s)\n", prog, tok, config_names());
            exit(2);
        }
        a->on[i] = true;
    }
}

static void parse_tokens(const char *prog, const char *list, args *a)
{
    a->n_tokens = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(tok, &end, 10);
        if (errno || !end || *end || v == 0 || v > (1ull << 20) || tok[0] == '-') {
            fprintf(stderr, "%s: bad token count '%s' (1 .. 1048576)\n", prog, tok);
            exit(2);
        }
        if (a->n_tokens == MAX_TOKEN_COUNTS) {
            fprintf(stderr, "%s: at most %d token counts\n", prog, MAX_TOKEN_COUNTS);
            exit(2);
        }
        a->tokens[a->n_tokens++] = v;
    }
    if (a->n_tokens == 0) {
        fprintf(stderr, "%s: --tokens needs at least one count\n", prog);
        exit(2);
    }
}

static args parse_args(int argc, char **argv)
{
    args a;
    memset(&a, 0, sizeof a);
    for (size_t i = 0; i < N_CONFIGS; i++)
        a.on[i] = true;
    const char *configs = NULL, *tokens = NULL;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--quick") == 0) {
            a.o.quick = true;
        } else if (strcmp(s, "--out") == 0 && i + 1 < argc) {
            a.o.out_dir = argv[++i];
        } else if (strncmp(s, "--out=", 6) == 0) {
            a.o.out_dir = s + 6;
        } else if (strcmp(s, "--configs") == 0 && i + 1 < argc) {
            configs = argv[++i];
        } else if (strncmp(s, "--configs=", 10) == 0) {
            configs = s + 10;
        } else if (strcmp(s, "--tokens") == 0 && i + 1 < argc) {
            tokens = argv[++i];
        } else if (strncmp(s, "--tokens=", 9) == 0) {
            tokens = s + 9;
        } else if (strcmp(s, "--backend") == 0 && i + 1 < argc) {
            const char *b = argv[++i];
            if (strcmp(b, "auto") == 0)
                a.backend = SC_MOE_BACKEND_AUTO;
            else if (strcmp(b, "mma") == 0)
                a.backend = SC_MOE_BACKEND_MMA;
            else if (strcmp(b, "sm90") == 0)
                a.backend = SC_MOE_BACKEND_SM90;
            else {
                fprintf(stderr, "%s: unknown backend '%s' (auto, mma, sm90)\n", argv[0], b);
                exit(2);
            }
        } else if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            usage(argv[0]);
            exit(0);
        } else {
            fprintf(stderr, "%s: unknown argument '%s' (try --help)\n", argv[0], s);
            exit(2);
        }
    }
    if (a.o.out_dir && !*a.o.out_dir)
        a.o.out_dir = NULL;
    if (configs)
        parse_configs(argv[0], configs, &a);
    if (tokens) {
        parse_tokens(argv[0], tokens, &a);
        a.tokens_given = true;
    } else {
        const uint64_t *t = a.o.quick ? quick_tokens : default_tokens;
        size_t n = a.o.quick ? sizeof quick_tokens / sizeof *quick_tokens
                             : sizeof default_tokens / sizeof *default_tokens;
        memcpy(a.tokens, t, n * sizeof *t);
        a.n_tokens = n;
    }
    return a;
}

static int reps_for(const args *a, uint64_t T)
{
    int r = T <= 1024 ? 20 : 10;
    return a->o.quick ? r / 2 : r;
}

/* Whether layer c runs at the ti-th token count. */
static bool runs_at(const args *a, const moe_config *c, size_t ti)
{
    return a->tokens_given || !c->max_T || a->tokens[ti] <= c->max_T;
}

/* The largest token count layer c runs (1 when none). */
static uint64_t max_tokens(const args *a, const moe_config *c)
{
    uint64_t m = 1;
    for (size_t i = 0; i < a->n_tokens; i++)
        if (runs_at(a, c, i) && a->tokens[i] > m)
            m = a->tokens[i];
    return m;
}

/* ---- the peer ---------------------------------------------------------------------------- */

static size_t token_index(const args *a, uint64_t T)
{
    for (size_t i = 0; i < a->n_tokens; i++)
        if (a->tokens[i] == T)
            return i;
    return SIZE_MAX;
}

static void run_peer(const args *a, peer_result *p)
{
    memset(p, 0, sizeof *p);
    p->matmul_tflops = NAN;
    p->copy_tbs = NAN;
    /* NAME:E:K:H:I:SCORING:RENORM:BIAS (what bench_graph passes too), then the v2 layer's
     * options as KEY=VALUE fields, only where they differ from the v1 layer. */
    char specs[2048] = "", tokens[256] = "";
    for (size_t i = 0; i < N_CONFIGS; i++) {
        if (!a->on[i])
            continue;
        const moe_config *c = &all_configs[i];
        size_t n = strlen(specs);
        snprintf(specs + n, sizeof specs - n, "%s%s:%d:%d:%d:%d:%s:%d:%d", n ? "," : "",
                 c->name, c->E, c->k, c->H, c->I,
                 c->scoring == SC_MOE_SIGMOID ? "sigmoid" : "softmax", c->renormalize ? 1 : 0,
                 c->bias ? 1 : 0);
        if (c->n_group)
            append(specs, sizeof specs, ":group=%d/%d", c->n_group, c->topk_group);
        if (c->routed_scaling != 0.f)
            append(specs, sizeof specs, ":scale=%g", (double)c->routed_scaling);
        if (c->router_bias)
            append(specs, sizeof specs, ":rbias=1");
        if (c->act != SC_MOE_SILU)
            append(specs, sizeof specs, ":act=%s",
                   c->act == SC_MOE_GELU_TANH ? "gelu_tanh" : "swiglu_clamp");
        if (c->layout == SC_MOE_W13_INTERLEAVED)
            append(specs, sizeof specs, ":layout=interleaved");
        if (c->expert_bias)
            append(specs, sizeof specs, ":ebias=1");
        if (c->shared_I)
            append(specs, sizeof specs, ":shared=%d", c->shared_I);
        if (c->shared_gate)
            append(specs, sizeof specs, ":sgate=1");
        if (!a->tokens_given && c->max_T)
            append(specs, sizeof specs, ":maxT=%" PRIu64, c->max_T);
    }
    for (size_t i = 0; i < a->n_tokens; i++) {
        size_t n = strlen(tokens);
        snprintf(tokens + n, sizeof tokens - n, "%s%" PRIu64, i ? "," : "", a->tokens[i]);
    }
    int budget = a->o.quick ? 120 : 180; /* seconds of measuring; then nan for the rest */

    char peer_args[4096] = "--specs ";
    bench_shell_quote(peer_args, sizeof peer_args, specs);
    strncat(peer_args, " --tokens ", sizeof peer_args - strlen(peer_args) - 1);
    bench_shell_quote(peer_args, sizeof peer_args, tokens);
    size_t n = strlen(peer_args);
    snprintf(peer_args + n, sizeof peer_args - n, " --budget %d%s", budget,
             a->o.quick ? " --quick" : "");
    const int limit = budget + 90; /* torch's start, the weights, the last point */
    const uint64_t t0 = bench_now_ns();
    FILE *f = bench_peer_open(PEER_SCRIPT, peer_args, limit, p->reason, sizeof p->reason);
    if (!f)
        return;
    printf("peer: running %s (up to %d s)\n", PEER_SCRIPT, limit);
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        bench_chomp(line);
        char w1[64], w2[64], w3[64], w4[64];
        int got = sscanf(line, "peer %63s %63s %63s %63s", w1, w2, w3, w4);
        if (got == 2 && strcmp(w1, "matmul_tflops") == 0) {
            p->matmul_tflops = strtod(w2, NULL);
            p->rows++;
        } else if (got == 2 && strcmp(w1, "copy_tbs") == 0) {
            p->copy_tbs = strtod(w2, NULL);
            p->rows++;
        } else if (got == 4) {
            size_t ci = 0;
            while (ci < N_CONFIGS && strcmp(all_configs[ci].name, w1) != 0)
                ci++;
            size_t ti = token_index(a, strtoull(w2, NULL, 10));
            if (ci < N_CONFIGS && ti != SIZE_MAX) {
                results[ci][ti].loop_ms = strtod(w3, NULL);
                results[ci][ti].grouped_ms = strtod(w4, NULL);
                p->rows++;
            }
        } else if (line[0] == '#') {
            if (!p->info[0])
                snprintf(p->info, sizeof p->info, "%.250s", line + (line[1] == ' ' ? 2 : 1));
            printf("  peer %s\n", line);
        } else if (line[0]) {
            snprintf(p->reason, sizeof p->reason, "%.250s", line);
            printf("  peer: %.300s\n", line);
        }
        fflush(stdout);
    }
    p->ok = p->rows > 0;
    bench_peer_close(f, p->reason, sizeof p->reason);
    printf("peer: %s in %.1f s: %zu results%s%s\n", p->ok ? "done" : "unavailable",
           (double)(bench_now_ns() - t0) * 1e-9, p->rows, p->reason[0] ? "; " : "",
           p->reason);
}

/* ---- random data ------------------------------------------------------------------------- */

/* A device block of BLOCK_ELEMS bf16 values ~ N(0, stddev), made on the host in the pinned
 * staging buffer (Irwin-Hall: the sum of 4 random bytes, standardized) and uploaded. */
static sc_buffer make_block(env *e, double stddev, const char *label)
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
static void fill_random(env *e, sc_buffer dst, uint64_t off, uint64_t n, sc_buffer blk)
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

static sc_buffer new_buffer(env *e, sc_dtype dtype, uint64_t count, const char *label)
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

/* ---- the weights --------------------------------------------------------------------------- */

enum {
    W_ROUTER, W_W13, W_W2, W_SHARED_W13, W_SHARED_W2, W_SHARED_GATE, /* bf16 */
    W_SEL_BIAS, W_ROUTER_BIAS, W_W13_BIAS, W_W2_BIAS,                /* f32 */
    W_COUNT
};

#define CKPT_HEADER_BYTES 16 /* where an allocation's first tensor starts */

typedef struct tensor {
    const char *label;
    sc_dtype dtype;  /* SC_BF16 or SC_F32 */
    uint64_t count;  /* elements; 0: the layer has none */
    sc_buffer buf;   /* its own buffer, or the allocation of its dtype */
    uint64_t off;    /* its first element in buf */
    sc_view v;       /* the tensor, exactly count elements */
} tensor;

typedef struct layer_weights {
    tensor t[W_COUNT];
    bool one_alloc;
    uint64_t bf16_elems, f32_elems; /* the allocations' sizes (one_alloc), else 0 */
    sc_buffer all_bf16, all_f32;
} layer_weights;

/* The layer's tensors, and with c->one_alloc where each lies in its dtype's allocation:
 * in the order of the enum, the first at CKPT_HEADER_BYTES, each at the next 16-byte
 * boundary. Nothing is allocated. */
static void weights_layout(const moe_config *c, layer_weights *w)
{
    memset(w, 0, sizeof *w);
    static const char *const labels[W_COUNT] = {
        "router", "w13", "w2", "shared w13", "shared w2", "shared gate",
        "selection bias", "router bias", "w13 bias", "w2 bias"};
    const uint64_t E = (uint64_t)c->E, H = (uint64_t)c->H, I = (uint64_t)c->I,
                   Is = (uint64_t)c->shared_I;
    const uint64_t counts[W_COUNT] = {
        E * H, E * 2 * I * H, E * H * I, 2 * Is * H, H * Is, c->shared_gate ? H : 0,
        c->bias ? E : 0, c->router_bias ? E : 0, c->expert_bias ? E * 2 * I : 0,
        c->expert_bias ? E * H : 0};
    w->one_alloc = c->one_alloc;
    uint64_t next[2] = {CKPT_HEADER_BYTES / 2, CKPT_HEADER_BYTES / 4}; /* bf16, f32 */
    bool any[2] = {false, false};
    for (int i = 0; i < W_COUNT; i++) {
        tensor *t = &w->t[i];
        t->label = labels[i];
        t->dtype = i < W_SEL_BIAS ? SC_BF16 : SC_F32;
        t->count = counts[i];
        if (!t->count || !c->one_alloc)
            continue;
        const int d = t->dtype == SC_F32;
        const uint64_t per16 = d ? 4 : 8; /* elements in 16 bytes */
        t->off = (next[d] + per16 - 1) / per16 * per16;
        next[d] = t->off + t->count;
        any[d] = true;
    }
    w->bf16_elems = any[0] ? next[0] : 0;
    w->f32_elems = any[1] ? next[1] : 0;
}

/* Device bytes of the layer's weights. */
static uint64_t weights_bytes(const layer_weights *w)
{
    if (w->one_alloc)
        return w->bf16_elems * 2 + w->f32_elems * 4;
    uint64_t b = 0;
    for (int i = 0; i < W_COUNT; i++)
        b += w->t[i].count * (w->t[i].dtype == SC_F32 ? 4 : 2);
    return b;
}

/* The buffers (or the two allocations) and the tensors' views. */
static void weights_create(env *e, const moe_config *c, layer_weights *w)
{
    char label[2][64];
    snprintf(label[0], sizeof label[0], "%s checkpoint (bf16)", c->name);
    snprintf(label[1], sizeof label[1], "%s checkpoint (f32)", c->name);
    if (w->one_alloc) {
        w->all_bf16 = new_buffer(e, SC_BF16, w->bf16_elems, label[0]);
        if (w->f32_elems)
            w->all_f32 = new_buffer(e, SC_F32, w->f32_elems, label[1]);
    }
    for (int i = 0; i < W_COUNT; i++) {
        tensor *t = &w->t[i];
        if (!t->count)
            continue;
        if (w->one_alloc) {
            t->buf = t->dtype == SC_F32 ? w->all_f32 : w->all_bf16;
            SC_TRY(sc_buffer_view(t->buf, t->off, t->count, &t->v));
        } else {
            t->buf = new_buffer(e, t->dtype, t->count, t->label);
            t->off = 0;
            t->v = sc_view_of(t->buf);
        }
    }
}

/* Uniform f32 values in [-half, half), made on the host. */
static void upload_uniform(env *e, const tensor *t, float half)
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

static void weights_destroy(layer_weights *w)
{
    if (w->one_alloc) {
        SC_TRY(sc_buffer_destroy(w->all_bf16));
        if (w->all_f32.id)
            SC_TRY(sc_buffer_destroy(w->all_f32));
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
    if (c->layout == SC_MOE_W13_INTERLEAVED)
        append(buf, size, ", W13 interleaved");
    if (c->expert_bias)
        append(buf, size, ", W13/W2 biases");
    if (c->shared_I)
        append(buf, size, ", shared expert I_s=%d%s", c->shared_I,
               c->shared_gate ? " (gated)" : "");
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

/* ---- one layer ---------------------------------------------------------------------------- */

static void floor_for(const moe_config *c, uint64_t T, double copy_tbs, double tflops,
                      point *pt)
{
    const double E = c->E, k = c->k, H = c->H, I = c->I, Is = c->shared_I, t = (double)T;
    const double gate = c->shared_gate ? 1.0 : 0.0;
    double distinct = E * (1.0 - pow_u64(1.0 - k / E, T));
    double per_expert = 3.0 * H * I * 2.0 + (c->expert_bias ? (2.0 * I + H) * 4.0 : 0.0);
    double bytes = distinct * per_expert                             /* the experts touched */
                   + E * H * 2.0 + ((c->bias ? E : 0) + (c->router_bias ? E : 0)) * 4.0
                   + 3.0 * H * Is * 2.0 + gate * H * 2.0 /* the shared expert: always */
                   + 2.0 * t * H * 2.0;                  /* x and out */
    double flops = 2.0 * t * E * H + 2.0 * t * k * 3.0 * H * I + 2.0 * t * 3.0 * H * Is +
                   gate * 2.0 * t * H;
    pt->bw_ms = bytes / (copy_tbs * 1e12) * 1e3;
    pt->flop_ms = flops / (tflops * 1e12) * 1e3;
    pt->floor_ms = dmax(pt->bw_ms, pt->flop_ms);
    pt->flops = flops;
}

/* Device bytes the layer needs at T tokens: weights, workspace, inputs and output. */
static uint64_t bytes_needed(const moe_config *c, uint64_t T)
{
    const uint64_t E = (uint64_t)c->E, k = (uint64_t)c->k, H = (uint64_t)c->H,
                   I = (uint64_t)c->I, S = (uint64_t)(c->shared_I / c->I),
                   rows = T * (k + S); /* the shared expert: S more rows per token */
    layer_weights w;
    weights_layout(c, &w);
    uint64_t ws = T * E * 4 + rows * 4 * 5 + (rows * I + rows * H) * 2 + (3 * E + 2) * 4;
    uint64_t io = ((T <= ROTATE_MAX_T ? NX : 1) + 1) * T * H * 2;
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

static void print_row(const args *a, size_t ci, size_t ti)
{
    const point *p = &results[ci][ti];
    char ours[32], fl[32], lp[32], gm[32], vl[32], vg[32], pct[32];
    fmt_ms(ours, sizeof ours, p->measured ? p->ours_ms : NAN);
    fmt_ms(fl, sizeof fl, p->floor_ms);
    fmt_ms(lp, sizeof lp, p->loop_ms);
    fmt_ms(gm, sizeof gm, p->grouped_ms);
    fmt_ratio(vl, sizeof vl, p->loop_ms, p->measured ? p->ours_ms : NAN);
    fmt_ratio(vg, sizeof vg, p->grouped_ms, p->measured ? p->ours_ms : NAN);
    if (p->measured)
        snprintf(pct, sizeof pct, "%.1f%%", 100.0 * p->floor_ms / p->ours_ms);
    else
        snprintf(pct, sizeof pct, "-");
    char tf[32];
    if (p->measured)
        snprintf(tf, sizeof tf, "%.0f", p->flops / (p->ours_ms * 1e-3) * 1e-12);
    else
        snprintf(tf, sizeof tf, "-");
    printf("  %6" PRIu64 " %10s %10s %8s %6s %8s %10s %11s %8s %10s\n", a->tokens[ti], ours, fl,
           pct, p->bw_ms >= p->flop_ms ? "mem" : "flops", tf, lp, gm, vl, vg);
    if (p->measured && p->prof.steps > 0) {
        printf("         host %.1f us; steps (ms):", p->host_us);
        for (int i = 0; i < p->prof.steps; i++)
            printf(" %s %.3f%s", p->prof.name[i], (double)p->prof.ms[i],
                   i + 1 < p->prof.steps ? " |" : "");
        printf("\n");
    }
}

/* Measure layer ci at its token counts; false when its sc_moe_create failed (printed). */
static bool run_config(env *e, const args *a, size_t ci, double copy_tbs, double tflops)
{
    const moe_config *c = &all_configs[ci];
    const uint64_t H = (uint64_t)c->H;
    const uint64_t maxT = max_tokens(a, c);
    for (size_t ti = 0; ti < a->n_tokens; ti++)
        if (runs_at(a, c, ti))
            floor_for(c, a->tokens[ti], copy_tbs, tflops, &results[ci][ti]);
    layer_weights w;
    weights_layout(c, &w);
    char what[256];
    describe(c, what, sizeof what);
    printf("\n== %s: E=%d k=%d H=%d I=%d, %s; weights %.2f GB%s\n", c->name, c->E, c->k,
           c->H, c->I, what, (double)weights_bytes(&w) * 1e-9,
           w.one_alloc ? ", views of one allocation per dtype" : ", separate buffers");

    uint64_t free_b = 0, total_b = 0;
    SC_TRY(sc_context_trim(e->ctx));
    SC_TRY(sc_device_memory(0, &free_b, &total_b));
    uint64_t need = bytes_needed(c, maxT) + GIB / 2;
    if (need > free_b) {
        printf("  skipped: needs %.1f GB of device memory at T=%" PRIu64 ", %.1f GB free\n",
               (double)need * 1e-9, maxT, (double)free_b * 1e-9);
        for (size_t ti = 0; ti < a->n_tokens; ti++)
            if (runs_at(a, c, ti))
                print_row(a, ci, ti);
        return true;
    }

    uint64_t t0 = bench_now_ns();
    weights_create(e, c, &w);
    weights_fill(e, c, &w);
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
        return false;
    }
    SC_TRY(sc_stream_synchronize(e->st));
    double create_s = (double)(bench_now_ns() - t0) * 1e-9;
    uint64_t ws = 0;
    SC_TRY(sc_moe_workspace_bytes(layer, &ws));
    printf("  weights made in %.2f s; sc_moe_create %.2f s (kernels compiled or loaded from the "
           "cache); workspace %.2f GB for %" PRIu64 " tokens\n",
           made_s, create_s, (double)ws * 1e-9, maxT);
    printf("  %6s %10s %10s %8s %6s %8s %10s %11s %8s %10s\n", "T", "ours ms", "floor ms",
           "% floor", "bound", "TFLOP/s", "loop ms", "grouped ms", "vs loop", "vs grouped");

    for (size_t ti = 0; ti < a->n_tokens; ti++) {
        if (!runs_at(a, c, ti))
            continue;
        const uint64_t T = a->tokens[ti], TH = T * H;
        const uint64_t nx = T <= ROTATE_MAX_T ? NX : 1;
        sc_buffer xb = new_bf16(e, nx * TH, "x"), ob = new_bf16(e, TH, "out");
        fill_random(e, xb, 0, nx * TH, e->xblk);
        sc_view xv[NX], ov = sc_view_of(ob);
        for (uint64_t i = 0; i < nx; i++)
            SC_TRY(sc_buffer_view(xb, i * TH, TH, &xv[i]));

        const uint64_t w0 = bench_now_ns();
        for (int i = 0; i < 1000 && (i < WARMUP || bench_now_ns() - w0 < WARMUP_NS); i++) {
            SC_TRY(sc_moe_forward(e->st, layer, xv[(uint64_t)i % nx], ov, NULL));
            SC_TRY(sc_stream_synchronize(e->st));
        }
        const int reps = reps_for(a, T);
        double ms[20], host[20];
        for (int r = 0; r < reps; r++)
            ms[r] = time_one(e, layer, xv[(uint64_t)r % nx], ov, &host[r]);
        point *p = &results[ci][ti];
        p->ours_ms = bench_median(ms, (size_t)reps);
        p->host_us = bench_median(host, (size_t)reps);
        p->measured = true;
        SC_TRY(sc_moe_forward(e->st, layer, xv[0], ov,
                              &(sc_moe_forward_desc){.profile = &p->prof}));

        /* The check: out all NaN, one forward, no NaN or Inf may remain. */
        const uint16_t nan_bits = 0x7fc0;
        SC_TRY(sc_fill(e->st, ov, &nan_bits));
        SC_TRY(sc_moe_forward(e->st, layer, xv[0], ov, NULL));
        if (e->host_elems < TH) {
            free(e->host);
            e->host = bench_xmalloc(TH * sizeof(uint16_t));
            e->host_elems = TH;
        }
        SC_TRY(sc_copy_to_host(e->st, e->host, TH * sizeof(uint16_t), ov));
        uint64_t bad = 0, nonzero = 0, first_bad = 0;
        for (uint64_t i = 0; i < TH; i++) {
            uint16_t v = e->host[i];
            if ((v & 0x7f80u) == 0x7f80u) {
                if (!bad)
                    first_bad = i;
                bad++;
            }
            nonzero += (v & 0x7fffu) != 0;
        }
        if (bad) {
            fflush(stdout);
            printf("FAILED: %s T=%" PRIu64 ": out holds %" PRIu64 " NaN/Inf values of %" PRIu64
                   " (first at token %" PRIu64 ", column %" PRIu64 ": 0x%04x)\n",
                   c->name, T, bad, TH, first_bad / H, first_bad % H, e->host[first_bad]);
            exit(1);
        }
        if (!nonzero)
            printf("  warning: %s T=%" PRIu64 ": out is all zeros\n", c->name, T);
        print_row(a, ci, ti);
        fflush(stdout);
        SC_TRY(sc_buffer_destroy(xb));
        SC_TRY(sc_buffer_destroy(ob));
    }

    SC_TRY(sc_moe_destroy(layer));
    weights_destroy(&w);
    SC_TRY(sc_context_trim(e->ctx));
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

static bool write_csv(const args *a, char *path, size_t path_size)
{
    FILE *f = bench_open_out(&a->o, "bench_moe.csv", path, path_size);
    if (!f)
        return false;
    fprintf(f, "config,T,ours_ms,floor_ms,pct_floor,loop_ms,grouped_ms\n");
    for (size_t ci = 0; ci < N_CONFIGS; ci++) {
        if (!a->on[ci])
            continue;
        for (size_t ti = 0; ti < a->n_tokens; ti++) {
            if (!runs_at(a, &all_configs[ci], ti))
                continue;
            const point *p = &results[ci][ti];
            fprintf(f, "%s,%" PRIu64 ",", all_configs[ci].name, a->tokens[ti]);
            csv_num(f, p->measured ? p->ours_ms : NAN, ",");
            csv_num(f, p->floor_ms, ",");
            csv_num(f, p->measured ? 100.0 * p->floor_ms / p->ours_ms : NAN, ",");
            csv_num(f, p->loop_ms, ",");
            csv_num(f, p->grouped_ms, "\n");
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

static void summary(const args *a, const sc_device_props *props, double copy_tbs,
                    const peer_result *peer, double tflops, bool tflops_nominal,
                    const bool *failed, const char *csv, const char *png)
{
    printf("\n==== bench_moe summary: %s%s\n", props->name, a->o.quick ? " (--quick)" : "");
    char torch_copy[64] = "";
    if (!isnan(peer->copy_tbs))
        snprintf(torch_copy, sizeof torch_copy, "; torch %.2f", peer->copy_tbs);
    printf("floor rates: copy %.2f TB/s (r+w, sc_copy 1 GiB%s), matmul %.0f TFLOP/s (%s)\n",
           copy_tbs, torch_copy, tflops,
           tflops_nominal ? "nominal: no peer" : "torch bf16 8192^3");
    printf("ms = median forward; %%fl = floor / ours; x loop, x grpd = torch time / ours; "
           "blank: a count the layer does not run\n");
    printf("%-19s", "T");
    for (size_t ti = 0; ti < a->n_tokens; ti++)
        printf(" %7" PRIu64, a->tokens[ti]);
    printf("\n");
    for (size_t ci = 0; ci < N_CONFIGS; ci++) {
        if (!a->on[ci])
            continue;
        static const char *const rows[] = {"ms", "%fl", "x loop", "x grpd"};
        for (int r = 0; r < 4; r++) {
            printf("%-12s %-6s", r == 0 ? all_configs[ci].name : "", rows[r]);
            for (size_t ti = 0; ti < a->n_tokens; ti++) {
                const point *p = &results[ci][ti];
                double ours = p->measured ? p->ours_ms : NAN;
                char cell[32];
                if (!runs_at(a, &all_configs[ci], ti))
                    cell[0] = '\0';
                else if (r == 0)
                    fmt_ms(cell, sizeof cell, ours);
                else if (r == 1 && !isnan(ours))
                    snprintf(cell, sizeof cell, "%.0f%%", 100.0 * p->floor_ms / ours);
                else if (r == 1)
                    snprintf(cell, sizeof cell, "-");
                else
                    fmt_ratio(cell, sizeof cell, r == 2 ? p->loop_ms : p->grouped_ms, ours);
                printf(" %7s", cell);
            }
            printf("\n");
        }
    }
    for (size_t ci = 0; ci < N_CONFIGS; ci++)
        if (failed[ci])
            printf("FAILED: %s: sc_moe_create failed (see above)\n",
                   all_configs[ci].name);
    if (peer->ok)
        printf("peer: %s\n", peer->info[0] ? peer->info : "ok");
    else
        printf("peer: unavailable (%s)\n", peer->reason[0] ? peer->reason : "no output");
    if (csv[0])
        printf("csv: %s; plot: %s\n", csv, png);
    else
        printf("no --out: no csv or plot written\n");
}

int main(int argc, char **argv)
{
    args a = parse_args(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_require_gpu("bench_moe");
    sc_device_props props;
    char desc[512];
    bench_describe_device(0, &props, desc, sizeof desc);
    printf("bench_moe: %s\n", desc);
    printf("configs:");
    for (size_t ci = 0; ci < N_CONFIGS; ci++)
        if (a.on[ci]) {
            printf(" %s", all_configs[ci].name);
            const moe_config unlimited = {.name = "any"}; /* runs every count */
            if (max_tokens(&a, &all_configs[ci]) < max_tokens(&a, &unlimited))
                printf(" (T <= %" PRIu64 ")", max_tokens(&a, &all_configs[ci]));
        }
    printf("; T:");
    for (size_t ti = 0; ti < a.n_tokens; ti++)
        printf(" %" PRIu64, a.tokens[ti]);
    printf("; median of %d (T <= 1024) / %d forwards after >= %d warm-up (>= %.1f s)%s\n",
           reps_for(&a, 1), reps_for(&a, 4096), WARMUP, (double)WARMUP_NS * 1e-9,
           a.o.quick ? " (--quick)" : "");
    for (size_t ci = 0; ci < N_CONFIGS; ci++)
        for (size_t ti = 0; ti < MAX_TOKEN_COUNTS; ti++) {
            results[ci][ti].loop_ms = NAN;
            results[ci][ti].grouped_ms = NAN;
            results[ci][ti].floor_ms = results[ci][ti].bw_ms = results[ci][ti].flop_ms = NAN;
        }

    /* The peer first, alone on the GPU: nothing of ours is allocated yet. */
    peer_result peer;
    run_peer(&a, &peer);

    env e;
    memset(&e, 0, sizeof e);
    e.rng = 0x5AFEC0DA12345ULL;
    SC_TRY(sc_context_create(&(sc_context_desc){.device = 0}, &e.ctx));
    SC_TRY(sc_context_default_stream(e.ctx, &e.st));
    SC_TRY(sc_event_create(e.ctx, &(sc_event_desc){.timing = true, .label = "t0"}, &e.ev0));
    SC_TRY(sc_event_create(e.ctx, &(sc_event_desc){.timing = true, .label = "t1"}, &e.ev1));
    SC_TRY(sc_host_buffer_create(
        e.ctx, &(sc_host_buffer_desc){.bytes = BLOCK_ELEMS * 2, .label = "random staging"},
        &e.staging));
    e.xblk = make_block(&e, 1.0, "random block N(0,1)");

    double copy_tbs = measure_copy_tbs(&e);
    double tflops = peer.matmul_tflops;
    bool nominal = isnan(tflops) || tflops <= 0;
    if (nominal) { /* dense bf16 tensor FLOP per SM per clock: 4096 on Hopper */
        double per_clk = props.cc_major >= 10 ? 8192 : props.cc_major == 9 ? 4096 : 2048;
        tflops = props.sm_count * (props.clock_khz * 1e3) * per_clk * 1e-12;
    }
    printf("\nrates: copy %.3f TB/s (1 GiB sc_copy D2D, read + write, median of 10); matmul "
           "%.1f TFLOP/s (%s)\n",
           copy_tbs, tflops, nominal ? "nominal, from the device properties" : "torch peer");

    bool failed[N_CONFIGS] = {false};
    int rc = 0;
    for (size_t ci = 0; ci < N_CONFIGS; ci++)
        if (a.on[ci] && !run_config(&e, &a, ci, copy_tbs, tflops)) {
            failed[ci] = true;
            rc = 1;
        }

    SC_TRY(sc_buffer_destroy(e.xblk));
    SC_TRY(sc_host_buffer_destroy(e.staging));
    SC_TRY(sc_event_destroy(e.ev0));
    SC_TRY(sc_event_destroy(e.ev1));
    SC_TRY(sc_context_destroy(e.ctx));
    free(e.host);

    char csv[1024] = "", png[1200] = "";
    if (write_csv(&a, csv, sizeof csv)) {
        plot(&a, csv, png, sizeof png);
    } else {
        csv[0] = '\0';
    }
    summary(&a, &props, copy_tbs, &peer, tflops, nominal, failed, csv, png);
    return rc;
}
