/* bench_graph: CUDA graphs through safecuda. The host cost of a checked replay against a
 * raw cuGraphLaunch, and MoE decode steps eager against replayed, beside their floor and
 * PyTorch.
 *
 *   bench_graph [--out DIR] [--quick]
 *
 * (a) Host cost of a launch. A kernel over 8 buffers (4 read, 4 written; one block of 32
 *     threads, each copying an element) compiled with NVRTC, captured once on a stream into
 *     a graph of one kernel node and instantiated. Four ways of issuing the same work on
 *     the same stream take turns batch by batch:
 *       sc_graph_launch        the checked replay (8 buffers and the kernel checked alive,
 *                              ordered and tracked as one operation);
 *       cuGraphLaunch          the same graph made through the raw driver: the raw
 *                              launch below captured on the same CUstream
 *                              (sc_stream_cu_handle), one kernel node, instantiated;
 *       sc_kernel_launch       the kernel launched eagerly through the checked path;
 *       cuLaunchKernel         the same image loaded a second time, launched raw.
 *     A batch is 20000 calls issued in chunks of 256; only the issuing is timed (host
 *     clock around each chunk) and the stream is synchronized between chunks, untimed, so
 *     the driver's queue never fills and blocks the host. The result is the median of 7
 *     batches, in ns per call. Goal: sc_graph_launch at most 1 us over cuGraphLaunch.
 *
 * (b) MoE decode, eager against replay. The four layers of bench_moe (bf16):
 *       mixtral   E=8   k=2 H=4096 I=14336  softmax, renormalized
 *       qwen3moe  E=128 k=8 H=2048 I=768    softmax, renormalized
 *       olmoe     E=64  k=8 H=2048 I=1024   softmax, not renormalized
 *       dsv3      E=256 k=8 H=7168 I=2048   sigmoid + a random selection bias, renormalized
 *     at T = 1, 4, 16, 64 tokens. Weights: random bf16 cut from a random device block as
 *     bench_moe does (never zeros); one layer's weights are freed before the next's are made.
 *     The layer reserves its workspace for 64 tokens (sc_moe_reserve), then per T one
 *     forward on its own x and out buffers is captured and instantiated. Each timed run
 *     first copies one of 5 random inputs into x (untimed; consecutive runs use different
 *     inputs, so the experts read change and L2 can't hold them), then times with timing
 *     events around it, synchronized after each:
 *       eager     sc_moe_forward(x -> out_eager) from an idle stream;
 *       replay    sc_graph_launch of the captured forward (x -> out) from an idle stream;
 *       eager q, replay q  the same queued behind a 200 us kernel on the stream, so the
 *                 events time the device work alone, not the host's cost of issuing it
 *                 (a sample whose issuing outlasts the kernel is counted and flagged).
 *     Warm-up (at least 3 of each and 0.1 s), then the median of 60 runs of each (the four
 *     take turns). Host us: the host time of the sc_moe_forward / sc_graph_launch call.
 *     Check: for each input, the replay's output must equal the eager forward's bit for bit
 *     (both outputs poisoned with NaN first; the eager one must hold no NaN or Inf):
 *     any difference fails the benchmark (exit 1).
 *     Floor: the bytes the step must read or write at the device copy rate measured in this
 *     run (1 GiB sc_copy D2D, read + write bytes, median of 10): (the distinct experts the
 *     routing used x 3 H I + E H router + 2 T H for x and out) x 2 bytes. The distinct
 *     experts are counted from the expert ids (sc_moe_forward_desc.expert_ids) of one
 *     forward per input; the floor takes the fewest of the 5 inputs, so no run reads less
 *     than it counts. "% of floor" = floor / time; weight GB/s = (used experts + router)
 *     bytes / replay time. Goals: replay at least 80 % of the floor at every point;
 *     qwen3moe T=1 replay under 32 us. A missed goal is printed, not a failure.
 *     Peer: bench/peers/torch_moe.py, run first, alone on the GPU, for the same layers and
 *     token counts (a Hugging Face style expert loop and torch._grouped_mm, see the script).
 *
 * Output: the tables, DIR/bench_graph.csv with --out DIR (section,config,T,metric,value,
 * unit), and a summary as the last lines. --quick: 2000 calls a batch, 3 batches, 12 runs
 * a point (a smoke test, not a result). Without a driver or device it says so and exits 77;
 * any safecuda failure prints sc_last_error() and exits 1. */
#include <math.h> /* NAN, isnan, isfinite: macros only, no libm needed */

#include "bench_common.h"
#include "peer.h"
#include "raw_driver.h"
#include "safecuda/interop.h"
#include "safecuda/moe.h"

#define GIB (1ull << 30)
#define CHUNK 256                /* launches between untimed synchronizations */
#define BLOCK_ELEMS (1ull << 25) /* 64 MiB of bf16: the random block weights are cut from */
#define ALIGN_ELEMS 128ull       /* offsets into the block: 256-byte aligned */
#define NX 5                     /* random inputs per point, used in turn */
#define MAX_T 64                 /* the workspace reserved, the largest T */
#define WARMUP 3                 /* warm-up: at least this many runs of each ... */
#define WARMUP_NS 100000000ull   /* ... and at least 0.1 s of them */
#define SPIN_NS 200000ull        /* the kernel the queued runs wait behind */
#define MAX_REPS 64
#define GOAL_HOST_NS 1000.0      /* sc_graph_launch over cuGraphLaunch */
#define GOAL_PCT 80.0            /* replay, % of the floor */
#define GOAL_QWEN_T1_US 32.0     /* qwen3moe T=1 replay */
#define PEER_SCRIPT "torch_moe.py"

static const char kernels_src[] =
    "extern \"C\" __global__ void touch8(const float *a, const float *b, const float *c,\n"
    "                                    const float *d, float *e, float *f, float *g,\n"
    "                                    float *h, unsigned n)\n"
    "{\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) {\n"
    "        e[i] = a[i] + 1.0f;\n"
    "        f[i] = b[i] + 1.0f;\n"
    "        g[i] = c[i] + 1.0f;\n"
    "        h[i] = d[i] + 1.0f;\n"
    "    }\n"
    "}\n"
    "// Busy for ns nanoseconds of the GPU's global timer: work queued behind it is then\n"
    "// timed without the host's cost of issuing it.\n"
    "extern \"C\" __global__ void spin_ns(unsigned long long ns)\n"
    "{\n"
    "    unsigned long long t0, t;\n"
    "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t0));\n"
    "    do {\n"
    "        asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
    "    } while (t - t0 < ns);\n"
    "}\n";

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

static uint16_t f32_to_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (no NaN/Inf arrive here) */
    return (uint16_t)(u >> 16);
}

static const char *verdict(bool met) { return met ? "met" : "MISSED"; }

/* ---- (a) host cost of a launch ------------------------------------------------------------ */

enum { V_GRAPH, V_GRAPH_RAW, V_KERNEL, V_KERNEL_RAW, V_COUNT };
static const char *const variant_name[V_COUNT] = {"sc_graph_launch", "cuGraphLaunch (raw)",
                                                  "sc_kernel_launch", "cuLaunchKernel (raw)"};

typedef struct host_env {
    sc_stream s;
    sc_kernel k;
    sc_buffer buf[8];
    sc_launch_desc cfg;
    unsigned n;
    sc_graph_exec exec;
    sc_graph_props props;
    /* raw: the driver's handles of the same stream and executable graph, and the image
     * loaded a second time */
    CUcontext cu_ctx;
    CUstream cs;
    CUgraphExec cexec;
    CUmodule cmod;
    CUfunction cf;
    CUdeviceptr ptr[8];
    void *params[9];
} host_env;

static void launch_touch8(host_env *e)
{
    SC_TRY(SC_LAUNCH(e->s, e->k, &e->cfg, sc_arg_in(sc_view_of(e->buf[0])),
                     sc_arg_in(sc_view_of(e->buf[1])), sc_arg_in(sc_view_of(e->buf[2])),
                     sc_arg_in(sc_view_of(e->buf[3])), sc_arg_out(sc_view_of(e->buf[4])),
                     sc_arg_out(sc_view_of(e->buf[5])), sc_arg_out(sc_view_of(e->buf[6])),
                     sc_arg_out(sc_view_of(e->buf[7])), sc_arg_u32(e->n)));
}

static void host_setup(sc_context ctx, sc_program prog, sc_kernel k, host_env *e)
{
    memset(e, 0, sizeof *e);
    e->k = k;
    e->n = 32;
    e->cfg = (sc_launch_desc){.grid = {1, 1, 1}, .block = {32, 1, 1}};
    SC_TRY(sc_stream_create(ctx, &(sc_stream_desc){.label = "launches"}, &e->s));
    static const char *const labels[8] = {"a", "b", "c", "d", "e", "f", "g", "h"};
    for (int i = 0; i < 8; i++) {
        SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 1024,
                                                       .label = labels[i], .stream = e->s},
                                &e->buf[i]));
        const float v = (float)(i + 1);
        SC_TRY(sc_fill(e->s, sc_view_of(e->buf[i]), &v));
    }

    /* The graph: one launch over the 8 buffers. */
    sc_graph g;
    SC_TRY(sc_stream_begin_capture(e->s, NULL));
    launch_touch8(e);
    SC_TRY(sc_stream_end_capture(e->s, &g));
    SC_TRY(sc_graph_instantiate(g, &e->exec));
    SC_TRY(sc_graph_info(g, &e->props));
    SC_TRY(sc_graph_destroy(g));

    /* The replay runs: e = a + 1 = 2 .. h = d + 1 = 5. */
    SC_TRY(sc_graph_launch(e->s, e->exec));
    for (int i = 4; i < 8; i++) {
        float got[32];
        sc_view v;
        SC_TRY(sc_buffer_view(e->buf[i], 0, 32, &v));
        SC_TRY(sc_copy_to_host(e->s, got, sizeof got, v));
        for (int j = 0; j < 32; j++)
            if (got[j] != (float)(i - 4 + 2)) {
                printf("FAILED: the replayed touch8 left %s[%d] = %g, expected %g\n", labels[i],
                       j, (double)got[j], (double)(i - 4 + 2));
                exit(1);
            }
    }

    /* The raw side: the primary context (sc_context's), the stream's CUstream
     * (sc_stream_cu_handle), the program's image loaded again for cuLaunchKernel, and that
     * launch captured on the same CUstream into a graph of one kernel node. */
    SC_TRY(sc_stream_synchronize(e->s));
    raw_driver_load();
    e->cu_ctx = raw_driver_primary_context(0);
    e->cs = raw_driver_stream(e->s);
    const void *img = NULL;
    uint64_t bytes = 0;
    SC_TRY(sc_program_image(prog, &img, &bytes));
    CU_TRY(rd.cuCtxSetCurrent(e->cu_ctx));
    CU_TRY(rd.cuModuleLoadDataEx(&e->cmod, img, 0, NULL, NULL));
    CU_TRY(rd.cuModuleGetFunction(&e->cf, e->cmod, "touch8"));
    for (int i = 0; i < 8; i++) {
        uint64_t p = 0;
        SC_TRY(sc_buffer_device_ptr(e->buf[i], &p));
        e->ptr[i] = (CUdeviceptr)p;
        e->params[i] = &e->ptr[i];
    }
    e->params[8] = &e->n;
    CUgraph cg = NULL;
    CU_TRY(rd.cuStreamBeginCapture(e->cs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CU_TRY(rd.cuLaunchKernel(e->cf, 1, 1, 1, 32, 1, 1, 0, e->cs, e->params, NULL));
    CU_TRY(rd.cuStreamEndCapture(e->cs, &cg));
    CU_TRY(rd.cuGraphInstantiateWithFlags(&e->cexec, cg, 0));
    CU_TRY(rd.cuGraphDestroy(cg));
    SC_TRY(sc_stream_synchronize(e->s));
}

static void host_teardown(host_env *e)
{
    SC_TRY(sc_stream_synchronize(e->s));
    CU_TRY(rd.cuCtxSetCurrent(e->cu_ctx));
    CU_TRY(rd.cuGraphExecDestroy(e->cexec));
    CU_TRY(rd.cuModuleUnload(e->cmod));
    raw_driver_release_context(0);
    SC_TRY(sc_graph_exec_destroy(e->exec));
    for (int i = 0; i < 8; i++)
        SC_TRY(sc_buffer_destroy(e->buf[i]));
    SC_TRY(sc_stream_destroy(e->s));
}

/* Host ns per call of one batch of `calls`. */
static double host_batch(host_env *e, int variant, uint64_t calls)
{
    SC_TRY(sc_stream_synchronize(e->s));
    if (variant == V_GRAPH_RAW || variant == V_KERNEL_RAW)
        CU_TRY(rd.cuCtxSetCurrent(e->cu_ctx));
    uint64_t total = 0, i = 0;
    while (i < calls) {
        uint64_t n = calls - i < CHUNK ? calls - i : CHUNK;
        uint64_t t0 = bench_now_ns();
        switch (variant) {
        case V_GRAPH:
            for (uint64_t j = 0; j < n; j++)
                SC_TRY(sc_graph_launch(e->s, e->exec));
            break;
        case V_GRAPH_RAW:
            for (uint64_t j = 0; j < n; j++)
                CU_TRY(rd.cuGraphLaunch(e->cexec, e->cs));
            break;
        case V_KERNEL:
            for (uint64_t j = 0; j < n; j++)
                launch_touch8(e);
            break;
        default:
            for (uint64_t j = 0; j < n; j++)
                CU_TRY(rd.cuLaunchKernel(e->cf, 1, 1, 1, 32, 1, 1, 0, e->cs, e->params, NULL));
            break;
        }
        total += bench_now_ns() - t0;
        i += n;
        SC_TRY(sc_stream_synchronize(e->s));
    }
    return (double)total / (double)calls;
}

static void bench_host(sc_context ctx, sc_program prog, sc_kernel k, uint64_t calls,
                       int batches, double med[V_COUNT], sc_graph_props *props)
{
    host_env e;
    host_setup(ctx, prog, k, &e);
    *props = e.props;
    for (int v = 0; v < V_COUNT; v++) /* warm-up: a tenth of a batch each */
        (void)host_batch(&e, v, calls / 10 ? calls / 10 : 1);
    double ns[V_COUNT][16];
    if (batches > 16)
        batches = 16;
    for (int b = 0; b < batches; b++)
        for (int v = 0; v < V_COUNT; v++)
            ns[v][b] = host_batch(&e, v, calls);
    for (int v = 0; v < V_COUNT; v++)
        med[v] = bench_median(ns[v], (size_t)batches);
    host_teardown(&e);
}

/* ---- (b) MoE decode ---------------------------------------------------------------------- */

typedef struct moe_config {
    const char *name;
    int E, k, H, I;
    sc_moe_scoring scoring;
    bool renormalize;
    bool bias;
} moe_config;

static const moe_config configs[] = {
    {"mixtral", 8, 2, 4096, 14336, SC_MOE_SOFTMAX, true, false},
    {"qwen3moe", 128, 8, 2048, 768, SC_MOE_SOFTMAX, true, false},
    {"olmoe", 64, 8, 2048, 1024, SC_MOE_SOFTMAX, false, false},
    {"dsv3", 256, 8, 7168, 2048, SC_MOE_SIGMOID, true, true},
};
#define N_CONFIGS (sizeof configs / sizeof configs[0])
static const uint64_t tokens[] = {1, 4, 16, 64};
#define N_TOKENS (sizeof tokens / sizeof tokens[0])

enum { M_EAGER, M_REPLAY, M_EAGER_Q, M_REPLAY_Q, M_COUNT };

typedef struct point {
    bool measured;
    int experts_min, experts_max; /* distinct experts used, over the NX inputs */
    uint64_t nodes;               /* of the captured forward */
    double us[M_COUNT];           /* median device time */
    double host_us[M_COUNT];      /* median host time of the call */
    int late[M_COUNT];            /* queued runs whose issuing outlasted the spin kernel */
    double floor_us, weight_bytes;
    double loop_ms, grouped_ms;   /* the peer's, NAN when it has none */
} point;

static point results[N_CONFIGS][N_TOKENS];

typedef struct env {
    sc_context ctx;
    sc_stream st;
    sc_event ev0, ev1;
    sc_host_buffer staging; /* BLOCK_ELEMS bf16, pinned */
    sc_buffer xblk;         /* random block for inputs, N(0, 1) */
    sc_kernel spin;
    uint64_t rng;
    int reps;
} env;

/* A peer point of one of the layers and token counts above. */
static bool peer_point(void *user, const char *config, uint64_t T, double loop_ms,
                       double grouped_ms)
{
    (void)user;
    size_t ci = 0, ti = 0;
    while (ci < N_CONFIGS && strcmp(configs[ci].name, config) != 0)
        ci++;
    while (ti < N_TOKENS && tokens[ti] != T)
        ti++;
    if (ci == N_CONFIGS || ti == N_TOKENS)
        return false;
    results[ci][ti].loop_ms = loop_ms;
    results[ci][ti].grouped_ms = grouped_ms;
    return true;
}

/* The torch peer, for the layers and token counts above (bench_moe_peer_run: its
 * matmul_tflops is not a floor here, decode is bound by memory); never fails the
 * benchmark. */
static void run_peer(bool quick, bench_moe_peer *p)
{
    char specs[512] = "", toks[64] = "";
    for (size_t i = 0; i < N_CONFIGS; i++) {
        const moe_config *c = &configs[i];
        size_t n = strlen(specs);
        snprintf(specs + n, sizeof specs - n, "%s%s:%d:%d:%d:%d:%s:%d:%d", n ? "," : "",
                 c->name, c->E, c->k, c->H, c->I,
                 c->scoring == SC_MOE_SIGMOID ? "sigmoid" : "softmax", c->renormalize ? 1 : 0,
                 c->bias ? 1 : 0);
    }
    for (size_t i = 0; i < N_TOKENS; i++) {
        size_t n = strlen(toks);
        snprintf(toks + n, sizeof toks - n, "%s%" PRIu64, i ? "," : "", tokens[i]);
    }
    const int budget = quick ? 60 : 150; /* seconds of measuring; then nan for the rest */

    char peer_args[1024] = "--specs ";
    bench_shell_quote(peer_args, sizeof peer_args, specs);
    strncat(peer_args, " --tokens ", sizeof peer_args - strlen(peer_args) - 1);
    bench_shell_quote(peer_args, sizeof peer_args, toks);
    size_t n = strlen(peer_args);
    snprintf(peer_args + n, sizeof peer_args - n, " --budget %d%s", budget,
             quick ? " --quick" : "");
    const int limit = budget + 90; /* torch's start, the weights, the last point */
    bench_moe_peer_run(PEER_SCRIPT, peer_args, limit, peer_point, NULL, p);
}

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

/* The copy rate: 1 GiB sc_copy D2D, (read + write bytes) / time, median of 10, in TB/s. */
static double measure_copy_tbs(env *e)
{
    const uint64_t n = GIB / 2; /* bf16 elements */
    sc_buffer src = new_buffer(e, SC_BF16, n, "copy src");
    sc_buffer dst = new_buffer(e, SC_BF16, n, "copy dst");
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

/* One decode point: the layer, its captured forward and its buffers. */
typedef struct step {
    sc_moe layer;
    sc_graph_exec exec;
    sc_view x, out_e, out_g;
    sc_view xs[NX];
} step;

/* One timed run of mode m on input `input`: device ms; *host_us the call's host time; *late
 * set when a queued run's issuing outlasted the kernel it waits behind. */
static double time_run(env *e, const step *s, int m, int input, double *host_us, bool *late)
{
    SC_TRY(sc_copy(e->st, s->x, s->xs[input])); /* this step's tokens, untimed */
    const bool queued = m == M_EAGER_Q || m == M_REPLAY_Q;
    const uint64_t q0 = bench_now_ns();
    static const sc_launch_desc one_thread = {.grid = {1, 1, 1}, .block = {1, 1, 1}};
    if (queued)
        SC_TRY(SC_LAUNCH(e->st, e->spin, &one_thread, sc_arg_u64(SPIN_NS)));
    SC_TRY(sc_event_record(e->ev0, e->st));
    const uint64_t h0 = bench_now_ns();
    if (m == M_EAGER || m == M_EAGER_Q)
        SC_TRY(sc_moe_forward(e->st, s->layer, s->x, s->out_e, NULL));
    else
        SC_TRY(sc_graph_launch(e->st, s->exec));
    const uint64_t h1 = bench_now_ns();
    SC_TRY(sc_event_record(e->ev1, e->st));
    SC_TRY(sc_event_synchronize(e->ev1));
    float ms = 0.f;
    SC_TRY(sc_event_elapsed(e->ev0, e->ev1, &ms));
    *host_us = (double)(h1 - h0) * 1e-3;
    *late = queued && (h1 - q0) >= SPIN_NS;
    return ms;
}

static bool is_nan_or_inf(uint16_t v) { return (v & 0x7f80u) == 0x7f80u; }

/* The replay equals the eager forward bit for bit on every input; the routing's distinct
 * experts counted per input. */
static void check_point(env *e, const moe_config *c, uint64_t T, const step *s, sc_buffer ids,
                        point *p)
{
    const uint64_t TH = T * (uint64_t)c->H, Tk = T * (uint64_t)c->k;
    uint16_t *ge = bench_xmalloc(TH * 2), *gg = bench_xmalloc(TH * 2);
    int32_t *hid = bench_xmalloc(Tk * 4);
    const uint16_t nan_bits = 0x7fc0;
    p->experts_min = c->E + 1;
    p->experts_max = 0;
    for (int i = 0; i < NX; i++) {
        SC_TRY(sc_copy(e->st, s->x, s->xs[i]));
        SC_TRY(sc_fill(e->st, s->out_e, &nan_bits));
        SC_TRY(sc_fill(e->st, s->out_g, &nan_bits));
        SC_TRY(sc_moe_forward(e->st, s->layer, s->x, s->out_e, NULL));
        SC_TRY(sc_graph_launch(e->st, s->exec));
        SC_TRY(sc_copy_to_host(e->st, ge, TH * 2, s->out_e));
        SC_TRY(sc_copy_to_host(e->st, gg, TH * 2, s->out_g));
        uint64_t bad = 0, differ = 0, first = 0;
        for (uint64_t j = 0; j < TH; j++) {
            bad += is_nan_or_inf(ge[j]);
            if (ge[j] != gg[j] && !differ++)
                first = j;
        }
        if (bad || differ) {
            fflush(stdout);
            printf("FAILED: %s T=%" PRIu64 " input %d: ", c->name, T, i);
            if (bad)
                printf("the eager output holds %" PRIu64 " NaN/Inf values of %" PRIu64 "\n", bad,
                       TH);
            else
                printf("the replay differs from the eager forward at %" PRIu64 " of %" PRIu64
                       " values (first: token %" PRIu64 ", column %" PRIu64
                       ": replay 0x%04x, eager 0x%04x)\n",
                       differ, TH, first / (uint64_t)c->H, first % (uint64_t)c->H, gg[first],
                       ge[first]);
            exit(1);
        }

        /* The experts this input routes to (an eager forward that also writes the ids). */
        SC_TRY(sc_moe_forward(e->st, s->layer, s->x, s->out_e,
                              &(sc_moe_forward_desc){.expert_ids = sc_view_of(ids)}));
        SC_TRY(sc_copy_to_host(e->st, hid, Tk * 4, sc_view_of(ids)));
        bool used[256] = {false};
        int distinct = 0;
        for (uint64_t j = 0; j < Tk; j++) {
            if (hid[j] < 0 || hid[j] >= c->E) {
                printf("FAILED: %s T=%" PRIu64 ": expert id %d at slot %" PRIu64
                       " is outside 0 .. %d\n",
                       c->name, T, (int)hid[j], j, c->E - 1);
                exit(1);
            }
            if (!used[hid[j]]) {
                used[hid[j]] = true;
                distinct++;
            }
        }
        if (distinct < p->experts_min)
            p->experts_min = distinct;
        if (distinct > p->experts_max)
            p->experts_max = distinct;
    }
    free(ge);
    free(gg);
    free(hid);
}

static void run_point(env *e, const moe_config *c, sc_moe layer, uint64_t T, double copy_tbs,
                      point *p)
{
    const uint64_t H = (uint64_t)c->H, I = (uint64_t)c->I, E = (uint64_t)c->E, TH = T * H;
    step s = {.layer = layer};
    sc_buffer xs = new_buffer(e, SC_BF16, NX * TH, "inputs");
    sc_buffer x = new_buffer(e, SC_BF16, TH, "x"), out_e = new_buffer(e, SC_BF16, TH, "out eager"),
              out_g = new_buffer(e, SC_BF16, TH, "out replay");
    sc_buffer ids = new_buffer(e, SC_I32, T * (uint64_t)c->k, "expert ids");
    fill_random(e, xs, 0, NX * TH, e->xblk);
    for (int i = 0; i < NX; i++)
        SC_TRY(sc_buffer_view(xs, (uint64_t)i * TH, TH, &s.xs[i]));
    s.x = sc_view_of(x);
    s.out_e = sc_view_of(out_e);
    s.out_g = sc_view_of(out_g);
    SC_TRY(sc_copy(e->st, s.x, s.xs[0]));

    /* The decode step, captured once. */
    sc_graph g;
    sc_graph_props gp;
    SC_TRY(sc_stream_begin_capture(e->st, NULL));
    SC_TRY(sc_moe_forward(e->st, layer, s.x, s.out_g, NULL));
    SC_TRY(sc_stream_end_capture(e->st, &g));
    SC_TRY(sc_graph_instantiate(g, &s.exec));
    SC_TRY(sc_graph_info(g, &gp));
    SC_TRY(sc_graph_destroy(g));
    p->nodes = gp.nodes;

    check_point(e, c, T, &s, ids, p);

    /* Warm-up, the four modes in turn. */
    double host, ms[M_COUNT][MAX_REPS], hs[M_COUNT][MAX_REPS];
    bool late;
    const uint64_t w0 = bench_now_ns();
    for (int i = 0; i < 1000 && (i < WARMUP * M_COUNT || bench_now_ns() - w0 < WARMUP_NS); i++)
        (void)time_run(e, &s, i % M_COUNT, i % NX, &host, &late);

    /* Timed: the modes take turns; consecutive runs use different inputs. */
    memset(p->late, 0, sizeof p->late);
    for (int r = 0; r < e->reps; r++)
        for (int m = 0; m < M_COUNT; m++) {
            ms[m][r] = time_run(e, &s, m, (r * M_COUNT + m) % NX, &hs[m][r], &late);
            p->late[m] += late;
        }
    for (int m = 0; m < M_COUNT; m++) {
        p->us[m] = 1e3 * bench_median(ms[m], (size_t)e->reps);
        p->host_us[m] = bench_median(hs[m], (size_t)e->reps);
    }

    /* The floor: the bytes of the fewest experts any input used, the router, x and out. */
    p->weight_bytes =
        ((double)p->experts_min * 3.0 * (double)H * (double)I + (double)E * (double)H) * 2.0;
    const double bytes = p->weight_bytes + 2.0 * (double)TH * 2.0;
    p->floor_us = bytes / (copy_tbs * 1e12) * 1e6;
    p->measured = true;

    SC_TRY(sc_graph_exec_destroy(s.exec));
    SC_TRY(sc_buffer_destroy(xs));
    SC_TRY(sc_buffer_destroy(x));
    SC_TRY(sc_buffer_destroy(out_e));
    SC_TRY(sc_buffer_destroy(out_g));
    SC_TRY(sc_buffer_destroy(ids));
}

static void fmt_us(char *buf, size_t size, double us)
{
    if (isnan(us))
        snprintf(buf, size, "-");
    else if (us < 100)
        snprintf(buf, size, "%.1f", us);
    else
        snprintf(buf, size, "%.0f", us);
}

static void fmt_pct(char *buf, size_t size, double floor_us, double us)
{
    if (isnan(us) || us <= 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.0f%%", 100.0 * floor_us / us);
}

static void print_header(void)
{
    printf("  %4s %7s %5s %9s %9s %9s %8s %8s %8s %9s %9s %7s %7s %10s %10s\n", "T", "experts",
           "nodes", "eager us", "replay us", "floor us", "eager %", "replay %", "GB/s",
           "eager q", "replay q", "host e", "host r", "torch grp", "torch loop");
}

static void print_row(uint64_t T, const point *p)
{
    char eu[24], ru[24], fu[24], ep[24], rp[24], eq[24], rq[24], he[24], hr[24], tg[24], tl[24],
        ex[24];
    fmt_us(eu, sizeof eu, p->us[M_EAGER]);
    fmt_us(ru, sizeof ru, p->us[M_REPLAY]);
    fmt_us(fu, sizeof fu, p->floor_us);
    fmt_pct(ep, sizeof ep, p->floor_us, p->us[M_EAGER]);
    fmt_pct(rp, sizeof rp, p->floor_us, p->us[M_REPLAY]);
    fmt_us(eq, sizeof eq, p->us[M_EAGER_Q]);
    fmt_us(rq, sizeof rq, p->us[M_REPLAY_Q]);
    if (p->late[M_EAGER_Q])
        strncat(eq, "*", sizeof eq - strlen(eq) - 1);
    if (p->late[M_REPLAY_Q])
        strncat(rq, "*", sizeof rq - strlen(rq) - 1);
    fmt_us(he, sizeof he, p->host_us[M_EAGER]);
    fmt_us(hr, sizeof hr, p->host_us[M_REPLAY]);
    fmt_us(tg, sizeof tg, p->grouped_ms * 1e3);
    fmt_us(tl, sizeof tl, p->loop_ms * 1e3);
    if (p->experts_min == p->experts_max)
        snprintf(ex, sizeof ex, "%d", p->experts_min);
    else
        snprintf(ex, sizeof ex, "%d-%d", p->experts_min, p->experts_max);
    printf("  %4" PRIu64 " %7s %5" PRIu64 " %9s %9s %9s %8s %8s %8.0f %9s %9s %7s %7s %10s %10s\n",
           T, ex, p->nodes, eu, ru, fu, ep, rp,
           p->weight_bytes / (p->us[M_REPLAY] * 1e-6) * 1e-9, eq, rq, he, hr, tg, tl);
}

/* Device bytes a layer needs: weights, workspace for MAX_T tokens, the points' buffers, the
 * two random blocks its weights are cut from. */
static uint64_t bytes_needed(const moe_config *c)
{
    const uint64_t E = (uint64_t)c->E, k = (uint64_t)c->k, H = (uint64_t)c->H,
                   I = (uint64_t)c->I, rows = MAX_T * k;
    uint64_t weights = (E * H + 3 * E * H * I) * 2 + E * 4;
    uint64_t ws = MAX_T * E * 4 + rows * 4 * 5 + (rows * I + rows * H) * 2 + (3 * E + 2) * 4;
    uint64_t io = (NX + 3) * MAX_T * H * 2 + rows * 4;
    return weights + ws + io + 2 * BLOCK_ELEMS * 2;
}

static void run_config(env *e, size_t ci, double copy_tbs)
{
    const moe_config *c = &configs[ci];
    const uint64_t E = (uint64_t)c->E, H = (uint64_t)c->H, I = (uint64_t)c->I;
    const double weight_gb = (double)((E * H + 3 * E * H * I) * 2) * 1e-9;
    printf("\n== %s: E=%d k=%d H=%d I=%d, %s%s%s; weights %.2f GB bf16\n", c->name, c->E, c->k,
           c->H, c->I, c->scoring == SC_MOE_SIGMOID ? "sigmoid" : "softmax",
           c->bias ? " + selection bias" : "",
           c->renormalize ? ", renormalized" : ", not renormalized", weight_gb);

    uint64_t free_b = 0, total_b = 0;
    SC_TRY(sc_context_trim(e->ctx));
    SC_TRY(sc_device_memory(0, &free_b, &total_b));
    const uint64_t need = bytes_needed(c) + GIB / 2;
    if (need > free_b) {
        printf("  skipped: needs %.1f GB of device memory, %.1f GB free\n", (double)need * 1e-9,
               (double)free_b * 1e-9);
        return;
    }

    /* The weights, from two random blocks (fan-in H and fan-in I). */
    uint64_t t0 = bench_now_ns();
    sc_buffer blk_h = make_block(e, 1.0 / nolibm_sqrt((double)H), "random block 1/sqrt(H)");
    sc_buffer blk_i = make_block(e, 1.0 / nolibm_sqrt((double)I), "random block 1/sqrt(I)");
    sc_buffer router = new_buffer(e, SC_BF16, E * H, "router");
    sc_buffer w13 = new_buffer(e, SC_BF16, E * 2 * I * H, "w13");
    sc_buffer w2 = new_buffer(e, SC_BF16, E * H * I, "w2");
    fill_random(e, router, 0, E * H, blk_h);
    for (uint64_t x = 0; x < E; x++) {
        fill_random(e, w13, x * 2 * I * H, 2 * I * H, blk_h);
        fill_random(e, w2, x * H * I, H * I, blk_i);
    }
    sc_buffer bias = {0};
    if (c->bias) {
        float b[256]; /* E <= 256 (the layer's limit) */
        for (uint64_t x = 0; x < E; x++) /* uniform in [-0.05, 0.05) */
            b[x] = (float)((double)(bench_rand(&e->rng) >> 11) / 9007199254740992.0 - 0.5) *
                   0.1f;
        bias = new_buffer(e, SC_F32, E, "selection bias");
        SC_TRY(sc_copy_from_host(e->st, sc_view_of(bias), b, E * sizeof(float)));
    }
    SC_TRY(sc_buffer_destroy(blk_h)); /* after the copies from them (stream-ordered) */
    SC_TRY(sc_buffer_destroy(blk_i));
    SC_TRY(sc_stream_synchronize(e->st));
    const double made_s = (double)(bench_now_ns() - t0) * 1e-9;

    t0 = bench_now_ns();
    sc_moe layer;
    SC_TRY(sc_moe_create(e->ctx,
                         &(sc_moe_desc){.experts = c->E, .top_k = c->k, .hidden = c->H,
                                        .intermediate = c->I, .dtype = SC_BF16,
                                        .scoring = c->scoring, .renormalize = c->renormalize,
                                        .router = router, .w13 = w13, .w2 = w2,
                                        .selection_bias = bias, .max_tokens = MAX_T,
                                        .label = c->name},
                         &layer));
    SC_TRY(sc_moe_reserve(e->st, layer, MAX_T)); /* no forward below grows it */
    SC_TRY(sc_stream_synchronize(e->st));
    const double create_s = (double)(bench_now_ns() - t0) * 1e-9;
    printf("  weights made in %.2f s; sc_moe_create + sc_moe_reserve(%d) %.2f s\n", made_s, MAX_T,
           create_s);
    print_header();
    for (size_t ti = 0; ti < N_TOKENS; ti++) {
        run_point(e, c, layer, tokens[ti], copy_tbs, &results[ci][ti]);
        print_row(tokens[ti], &results[ci][ti]);
    }

    SC_TRY(sc_moe_destroy(layer));
    SC_TRY(sc_buffer_destroy(router));
    SC_TRY(sc_buffer_destroy(w13));
    SC_TRY(sc_buffer_destroy(w2));
    if (bias.id)
        SC_TRY(sc_buffer_destroy(bias));
    SC_TRY(sc_context_trim(e->ctx));
}

/* ---- output ------------------------------------------------------------------------------ */

static void csv_row(FILE *f, const char *section, const char *config, uint64_t T,
                    const char *metric, double v, const char *unit)
{
    fprintf(f, "%s,%s,", section, config);
    if (T)
        fprintf(f, "%" PRIu64, T);
    if (isnan(v) || !isfinite(v))
        fprintf(f, ",%s,nan,%s\n", metric, unit);
    else
        fprintf(f, ",%s,%.6g,%s\n", metric, v, unit);
}

static bool write_csv(const bench_opts *o, const double host[V_COUNT], double copy_tbs,
                      char *path, size_t size)
{
    FILE *f = bench_open_out(o, "bench_graph.csv", path, size);
    if (!f)
        return false;
    fprintf(f, "section,config,T,metric,value,unit\n");
    for (int v = 0; v < V_COUNT; v++)
        csv_row(f, "host", "", 0, variant_name[v], host[v], "ns/call");
    csv_row(f, "rate", "", 0, "copy", copy_tbs, "TB/s");
    static const char *const mode_name[M_COUNT] = {"eager", "replay", "eager_queued",
                                                   "replay_queued"};
    for (size_t ci = 0; ci < N_CONFIGS; ci++)
        for (size_t ti = 0; ti < N_TOKENS; ti++) {
            const point *p = &results[ci][ti];
            const char *n = configs[ci].name;
            const uint64_t T = tokens[ti];
            if (!p->measured)
                continue;
            char metric[64];
            for (int m = 0; m < M_COUNT; m++) {
                snprintf(metric, sizeof metric, "%s_us", mode_name[m]);
                csv_row(f, "moe", n, T, metric, p->us[m], "us");
            }
            csv_row(f, "moe", n, T, "floor_us", p->floor_us, "us");
            csv_row(f, "moe", n, T, "pct_floor_eager", 100.0 * p->floor_us / p->us[M_EAGER], "%");
            csv_row(f, "moe", n, T, "pct_floor_replay", 100.0 * p->floor_us / p->us[M_REPLAY], "%");
            csv_row(f, "moe", n, T, "weight_gbs", p->weight_bytes / (p->us[M_REPLAY] * 1e-6) * 1e-9,
                    "GB/s");
            csv_row(f, "moe", n, T, "host_eager_us", p->host_us[M_EAGER], "us");
            csv_row(f, "moe", n, T, "host_replay_us", p->host_us[M_REPLAY], "us");
            csv_row(f, "moe", n, T, "experts_min", p->experts_min, "experts");
            csv_row(f, "moe", n, T, "experts_max", p->experts_max, "experts");
            csv_row(f, "moe", n, T, "graph_nodes", (double)p->nodes, "nodes");
            csv_row(f, "moe", n, T, "torch_loop_us", p->loop_ms * 1e3, "us");
            csv_row(f, "moe", n, T, "torch_grouped_us", p->grouped_ms * 1e3, "us");
        }
    bool ok = fclose(f) == 0;
    if (!ok)
        printf("note: writing %s failed\n", path);
    return ok;
}

static void summary(const bench_opts *o, const sc_device_props *props, const double host[V_COUNT],
                    const sc_graph_props *gp, double copy_tbs, const bench_moe_peer *peer,
                    const char *csv)
{
    printf("\n==== bench_graph summary: %s%s\n", props->name, o->quick ? " (--quick)" : "");
    const double extra = host[V_GRAPH] - host[V_GRAPH_RAW];
    printf("launch host ns/call (%" PRIu64 " buffers, %" PRIu64 " node): sc_graph_launch %.0f, "
           "cuGraphLaunch %.0f (%+.0f); sc_kernel_launch %.0f, cuLaunchKernel %.0f (%+.0f)\n",
           gp->buffers, gp->nodes, host[V_GRAPH], host[V_GRAPH_RAW], extra, host[V_KERNEL],
           host[V_KERNEL_RAW], host[V_KERNEL] - host[V_KERNEL_RAW]);
    printf("goal sc_graph_launch <= 1 us over cuGraphLaunch: %+.0f ns -> %s\n", extra,
           verdict(extra <= GOAL_HOST_NS));
    char torch_copy[48] = "";
    if (!isnan(peer->copy_tbs))
        snprintf(torch_copy, sizeof torch_copy, "; torch %.2f", peer->copy_tbs);
    printf("MoE decode, device us from an idle stream; floor = used experts + router + x/out "
           "at %.2f TB/s (sc_copy r+w%s)\n",
           copy_tbs, torch_copy);
    printf("%-8s %-9s", "", "T");
    for (size_t ti = 0; ti < N_TOKENS; ti++)
        printf(" %7" PRIu64, tokens[ti]);
    printf("\n");
    int met = 0, points = 0;
    char missed[1024] = "";
    for (size_t ci = 0; ci < N_CONFIGS; ci++) {
        static const char *const rows[] = {"replay us", "eager us", "replay %", "torch grp"};
        for (int r = 0; r < 4; r++) {
            printf("%-8s %-9s", r == 0 ? configs[ci].name : "", rows[r]);
            for (size_t ti = 0; ti < N_TOKENS; ti++) {
                const point *p = &results[ci][ti];
                char cell[24];
                if (!p->measured && r < 3)
                    snprintf(cell, sizeof cell, "-");
                else if (r == 0)
                    fmt_us(cell, sizeof cell, p->us[M_REPLAY]);
                else if (r == 1)
                    fmt_us(cell, sizeof cell, p->us[M_EAGER]);
                else if (r == 2)
                    fmt_pct(cell, sizeof cell, p->floor_us, p->us[M_REPLAY]);
                else
                    fmt_us(cell, sizeof cell, p->grouped_ms * 1e3);
                printf(" %7s", cell);
            }
            printf("\n");
        }
        for (size_t ti = 0; ti < N_TOKENS; ti++) {
            const point *p = &results[ci][ti];
            if (!p->measured)
                continue;
            points++;
            const double pct = 100.0 * p->floor_us / p->us[M_REPLAY];
            if (pct >= GOAL_PCT) {
                met++;
            } else {
                size_t n = strlen(missed);
                snprintf(missed + n, sizeof missed - n, "%s%s T=%" PRIu64 " %.0f%%",
                         n ? ", " : "", configs[ci].name, tokens[ti], pct);
            }
        }
    }
    printf("goal replay >= %.0f%% of floor: %d of %d points met%s%s%s\n", GOAL_PCT, met, points,
           points < (int)(N_CONFIGS * N_TOKENS) ? " (some not measured)" : "",
           missed[0] ? "; missed: " : "", missed);
    const point *q = &results[1][0]; /* qwen3moe, T=1 */
    if (q->measured)
        printf("goal qwen3moe T=1 replay < %.0f us: %.1f us (queued behind a kernel %.1f us) -> "
               "%s\n",
               GOAL_QWEN_T1_US, q->us[M_REPLAY], q->us[M_REPLAY_Q],
               verdict(q->us[M_REPLAY] < GOAL_QWEN_T1_US));
    else
        printf("goal qwen3moe T=1 replay < %.0f us: not measured\n", GOAL_QWEN_T1_US);
    if (peer->ok)
        printf("peer: %s%s%s\n", peer->info[0] ? peer->info : "ok", peer->reason[0] ? "; " : "",
               peer->reason);
    else
        printf("peer: unavailable (%s)\n", peer->reason[0] ? peer->reason : "no output");
    if (csv[0])
        printf("csv: %s\n", csv);
    else
        printf("no --out: no csv written\n");
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse_args(argc, argv,
                                    "CUDA graphs: the host cost of sc_graph_launch against raw "
                                    "cuGraphLaunch, and MoE decode steps eager against graph "
                                    "replay, beside their bandwidth floor and PyTorch.");
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_require_gpu("bench_graph");
    sc_device_props props;
    char desc[512];
    bench_describe_device(0, &props, desc, sizeof desc);
    const uint64_t calls = o.quick ? 2000 : 20000;
    const int batches = o.quick ? 3 : 7;
    printf("bench_graph%s: %s\n", o.quick ? " (--quick: smoke test, not a result)" : "", desc);
    for (size_t ci = 0; ci < N_CONFIGS; ci++)
        for (size_t ti = 0; ti < N_TOKENS; ti++) {
            results[ci][ti].loop_ms = NAN;
            results[ci][ti].grouped_ms = NAN;
            results[ci][ti].floor_us = NAN;
        }

    /* The peer first, alone on the GPU: nothing of ours is allocated yet. */
    bench_moe_peer peer;
    run_peer(o.quick, &peer);

    env e;
    memset(&e, 0, sizeof e);
    e.rng = 0x5AFEC0DA12345ULL;
    e.reps = o.quick ? 12 : 60;
    SC_TRY(sc_context_create(&(sc_context_desc){.device = 0}, &e.ctx));
    sc_program prog;
    sc_module mod;
    sc_kernel touch8;
    SC_TRY(sc_program_create(e.ctx, &(sc_program_desc){.source = kernels_src,
                                                       .name = "bench_graph.cu"},
                             &prog));
    SC_TRY(sc_module_load(e.ctx, prog, &mod));
    SC_TRY(sc_kernel_get(mod, "touch8", &touch8));
    SC_TRY(sc_kernel_get(mod, "spin_ns", &e.spin));

    /* (a) */
    double host[V_COUNT];
    sc_graph_props gp;
    uint64_t t0 = bench_now_ns();
    bench_host(e.ctx, prog, touch8, calls, batches, host, &gp);
    SC_TRY(sc_program_destroy(prog));
    printf("\nhost cost of a launch: a graph of %" PRIu64 " node over %" PRIu64
           " buffers (%" PRIu64 " kernel) against the same work raw; ns per call, median of %d "
           "batches of %" PRIu64 " calls in chunks of %d [%.1f s]\n",
           gp.nodes, gp.buffers, gp.kernels, batches, calls, CHUNK,
           (double)(bench_now_ns() - t0) * 1e-9);
    for (int v = 0; v < V_COUNT; v++) {
        if (v == V_GRAPH)
            printf("  %-24s %8.0f ns (%+.0f ns over cuGraphLaunch)\n", variant_name[v], host[v],
                   host[v] - host[V_GRAPH_RAW]);
        else if (v == V_KERNEL)
            printf("  %-24s %8.0f ns (%+.0f ns over cuLaunchKernel)\n", variant_name[v], host[v],
                   host[v] - host[V_KERNEL_RAW]);
        else
            printf("  %-24s %8.0f ns\n", variant_name[v], host[v]);
    }

    /* (b) */
    SC_TRY(sc_stream_create(e.ctx, &(sc_stream_desc){.label = "decode"}, &e.st));
    SC_TRY(sc_event_create(e.ctx, &(sc_event_desc){.timing = true, .label = "t0"}, &e.ev0));
    SC_TRY(sc_event_create(e.ctx, &(sc_event_desc){.timing = true, .label = "t1"}, &e.ev1));
    SC_TRY(sc_host_buffer_create(
        e.ctx, &(sc_host_buffer_desc){.bytes = BLOCK_ELEMS * 2, .label = "random staging"},
        &e.staging));
    e.xblk = make_block(&e, 1.0, "random block N(0,1)");
    const double copy_tbs = measure_copy_tbs(&e);
    printf("\nMoE decode: eager sc_moe_forward against the replay of its captured graph; "
           "device us, median of %d runs after warm-up\n"
           "copy rate %.3f TB/s (1 GiB sc_copy D2D, read + write, median of 10); floor = (used "
           "experts x 3HI + EH + 2TH) x 2 bytes at that rate\n"
           "q: queued behind a %.0f us kernel (device time alone; * = some runs were issued "
           "late); host: the call's host time; torch in us\n",
           e.reps, copy_tbs, (double)SPIN_NS * 1e-3);
    for (size_t ci = 0; ci < N_CONFIGS; ci++)
        run_config(&e, ci, copy_tbs);

    SC_TRY(sc_buffer_destroy(e.xblk));
    SC_TRY(sc_host_buffer_destroy(e.staging));
    SC_TRY(sc_event_destroy(e.ev0));
    SC_TRY(sc_event_destroy(e.ev1));
    SC_TRY(sc_stream_destroy(e.st));
    SC_TRY(sc_module_destroy(mod));
    SC_TRY(sc_context_destroy(e.ctx));

    char csv[1024] = "";
    if (!write_csv(&o, host, copy_tbs, csv, sizeof csv))
        csv[0] = '\0';
    summary(&o, &props, host, &gp, copy_tbs, &peer, csv);
    return 0;
}
