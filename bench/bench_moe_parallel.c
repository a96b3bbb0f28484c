/* bench_moe_parallel: the tensor- and expert-parallel MoE layers (sc_moe_desc.tp_comm,
 * ep_comm) on N GPUs against the one-GPU layer doing all the work: whole-forward times and
 * the scaling efficiency.
 *
 * Per layer shape and token count T:
 * - tensor parallel (every rank gets the same T tokens, as tensor parallelism runs them):
 *   N ranks (a thread per GPU) each with its shard of I (I / N) and the all-reduce of the
 *   partial outputs, against the one-GPU layer over the full weights on GPU 0 with T tokens;
 * - expert parallel, normal and low-latency mode (T tokens per rank, each rank its own: the
 *   work of N T tokens): N ranks each with E / N experts, against the one-GPU layer with N T
 *   tokens; low-latency with packets of 128 rows, at T <= 128, its forwards captured in a
 *   CUDA graph (per T, after one eager forward) and timed as replays.
 * A sample: the ranks meet at a barrier, record a start event, run `reps` forwards, record an
 * end event; a sample's time per forward is the slowest rank's. For expert parallelism, one
 * profiled forward after the samples gives the dispatch (the all-to-all of the packets),
 * return (the all-to-all back) and combine steps' device times, the slowest rank's (from
 * its profile events: each includes the wait for the slowest peer to join), and "dispatch
 * GB/s": the bytes a rank's dispatch sends (the mean over the ranks: each token once to
 * every other rank holding one of its experts, from that forward's routing, x's row with
 * its k ids and weights; low-latency: whole packets) / the dispatch time: per rank and
 * without its own share, comparable with bench_comm's all-to-all bus bandwidth. Warm-up samples first, the
 * median of the timed ones after. Efficiency = t(1 GPU, all the work) / (N x t(N GPUs)): 100 %
 * would be the work split perfectly with free communication. Weights are random (bf16
 * values, e4m3 values without NaN codes, block scales near 0.01) and so is x: the routing is
 * close to uniform; the tests check the results (tests/gpu/test_gpu_moe_tp.c, _ep.c).
 *
 *   bench_moe_parallel [--gpus N] [--out DIR] [--quick]  (N: 2 .. the GPUs there; default 2)
 *
 * Needs N GPUs and NCCL: otherwise it exits 77 (skipped), saying why. NCCL_NVLS_ENABLE=0 is set
 * unless the environment sets it. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>

#include "bench_common.h"
#include "safecuda/comm.h"
#include "safecuda/moe.h"

#define MAX_GPUS 8

typedef struct shape {
    const char *name;
    int E, k, H, I, Is;
    bool fp8, deepseek; /* deepseek: sigmoid, 8 groups (top 4), routed scaling 2.5, selection bias */
} shape;

static const shape shapes[] = {
    {"mixtral", 8, 2, 4096, 14336, 0, false, false},
    {"qwen3moe", 128, 8, 2048, 768, 0, false, false},
    {"deepseek_v3 (bf16)", 256, 8, 7168, 2048, 2048, false, true},
    {"deepseek_v3 (fp8)", 256, 8, 7168, 2048, 2048, true, true},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* ---- random weights ------------------------------------------------------------------- */

/* Per dtype, 16 MiB (+ 8 KiB for the shifted windows below) of random values made harmless:
 * bf16 with a small exponent (2^-7 <= |v| < 2), e4m3 bytes without bit 6 (exponent <= 7: no
 * NaN code), f32 in [0.005, 0.015). */
#define HOST_BLOCK (16u << 20)
#define HOST_BLOCK_ALLOC (HOST_BLOCK + 3 * 4096)
static unsigned char *blocks[3]; /* bf16, e4m3, f32 */

static void make_blocks(void)
{
    for (int d = 0; d < 3; d++) {
        blocks[d] = bench_xmalloc(HOST_BLOCK_ALLOC);
        bench_fill_random(blocks[d], HOST_BLOCK_ALLOC, 0x5AFE + (uint64_t)d);
    }
    uint16_t *bf = (uint16_t *)blocks[0];
    for (size_t i = 0; i < HOST_BLOCK_ALLOC / 2; i++)
        bf[i] = (uint16_t)((bf[i] & 0x807f) | 0x3c00 | ((bf[i] >> 7 & 7) << 7));
    for (size_t i = 0; i < HOST_BLOCK_ALLOC; i++)
        blocks[1][i] &= 0xbf;
    uint32_t *u = (uint32_t *)blocks[2];
    float *f = (float *)blocks[2];
    for (size_t i = 0; i < HOST_BLOCK_ALLOC / 4; i++)
        f[i] = 0.005f + 0.01f * (float)(u[i] >> 8) / 16777216.0f;
}

/* A buffer of count elements of dtype (bf16, e4m3 or f32) on ctx, filled from its block
 * (in windows shifted by 4 KiB per 16 MiB, so that the weights are not one block repeated). */
static sc_buffer rnd(sc_context ctx, sc_stream s, sc_dtype dtype, uint64_t count, const char *label)
{
    const unsigned char *src = blocks[dtype == SC_BF16 ? 0 : dtype == SC_F8E4M3 ? 1 : 2];
    sc_buffer b;
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count, .label = label},
                            &b));
    const uint64_t es = sc_dtype_size(dtype), bytes = count * es;
    for (uint64_t off = 0; off < bytes; off += HOST_BLOCK) {
        const uint64_t n = bytes - off < HOST_BLOCK ? bytes - off : HOST_BLOCK;
        sc_view v;
        SC_TRY(sc_buffer_view(b, off / es, n / es, &v));
        SC_TRY(sc_copy_from_host(s, v, src + (off / HOST_BLOCK % 3) * 4096, n));
    }
    return b;
}

/* ---- one layer: the full one (n = 1) or a rank's shard ------------------------------- */

typedef struct layer {
    sc_context ctx;
    sc_stream stream;
    sc_buffer b[10];
    int nb;
    sc_moe moe;
    sc_buffer x, out;
    uint64_t H;
    sc_event start, end;
    bool graphs;         /* low-latency: the forwards timed as replays of a captured one */
    sc_graph graph;
    sc_graph_exec exec;
    uint64_t exec_T;     /* the T captured (0: none) */
    /* expert parallel: the routing of the profiled forward (i32 [Tmax, k]), and what the
     * rank's dispatch sends: bytes per row, the rank, E, k, the packet rows (low-latency) */
    sc_buffer ids;
    uint64_t row_bytes, slab;
    int rank, E, k;
} layer;

/* How a layer splits the work over its n ranks (n = 1: the one-GPU layer). */
typedef enum split { ONE, TP, EP_NORMAL, EP_LL } split;
static const char *const split_names[] = {"1 GPU", "TP", "EP", "EP low-latency"};
#define LL_ROWS 128 /* the low-latency layers' ep_max_tokens */

static void make_layer(layer *L, sc_context ctx, const shape *sh, int n, split how, sc_comm comm,
                       uint64_t Tmax)
{
    memset(L, 0, sizeof *L);
    L->ctx = ctx;
    L->H = (uint64_t)sh->H;
    SC_TRY(sc_stream_create(ctx, &(sc_stream_desc){.label = "bench_moe_parallel"}, &L->stream));
    const uint64_t tp = how == TP ? (uint64_t)n : 1, ep = how >= EP_NORMAL ? (uint64_t)n : 1;
    const uint64_t E = (uint64_t)sh->E, H = (uint64_t)sh->H, I = (uint64_t)sh->I / tp;
    const uint64_t Is = (uint64_t)sh->Is / tp, El = E / ep; /* the rank's experts */
    const sc_dtype et = sh->fp8 ? SC_F8E4M3 : SC_BF16;
    sc_moe_desc d = {.experts = sh->E, .top_k = sh->k, .hidden = sh->H, .intermediate = (int)I,
                     .renormalize = true, .max_tokens = Tmax, .label = sh->name,
                     .expert_dtype = et, .shared_intermediate = (int)Is};
    if (how == TP)
        d.tp_comm = comm;
    if (how >= EP_NORMAL) {
        d.ep_comm = comm;
        d.ep_mode = how == EP_LL ? SC_MOE_EP_LOW_LATENCY : SC_MOE_EP_NORMAL;
        d.ep_max_tokens = how == EP_LL ? LL_ROWS : 0;
        d.max_tokens = how == EP_LL ? 0 : Tmax;
    }
    sc_stream s = L->stream;
    d.router = L->b[L->nb++] = rnd(ctx, s, SC_BF16, E * H, "router");
    d.w13 = L->b[L->nb++] = rnd(ctx, s, et, El * 2 * I * H, "w13");
    d.w2 = L->b[L->nb++] = rnd(ctx, s, et, El * H * I, "w2");
    if (sh->fp8) {
        d.w13_scale = sc_view_of(L->b[L->nb++] = rnd(ctx, s, SC_F32, El * 2 * I / 128 * H / 128,
                                                      "w13_scale"));
        d.w2_scale = sc_view_of(L->b[L->nb++] = rnd(ctx, s, SC_F32, El * H / 128 * I / 128,
                                                     "w2_scale"));
    }
    if (Is) {
        d.shared_w13 = sc_view_of(L->b[L->nb++] = rnd(ctx, s, et, 2 * Is * H, "shared_w13"));
        d.shared_w2 = sc_view_of(L->b[L->nb++] = rnd(ctx, s, et, H * Is, "shared_w2"));
        if (sh->fp8) {
            d.shared_w13_scale = sc_view_of(L->b[L->nb++] = rnd(ctx, s, SC_F32, 2 * Is / 128 * H / 128, "shared_w13_scale"));
            d.shared_w2_scale = sc_view_of(L->b[L->nb++] = rnd(ctx, s, SC_F32, H / 128 * Is / 128, "shared_w2_scale"));
        }
    }
    if (sh->deepseek) {
        d.scoring = SC_MOE_SIGMOID;
        d.n_group = 8;
        d.topk_group = 4;
        d.routed_scaling = 2.5f;
        d.selection_bias = L->b[L->nb++] = rnd(ctx, s, SC_F32, E, "selection_bias");
    }
    SC_TRY(sc_moe_create(ctx, &d, &L->moe));
    L->x = rnd(ctx, s, SC_BF16, Tmax * H, "x");
    if (how >= EP_NORMAL) {
        SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_I32,
                                                       .count = Tmax * (uint64_t)sh->k,
                                                       .label = "routing"},
                                &L->ids));
        /* a row: x (bf16, or e4m3 with an f32 scale per 128), its k ids and weights */
        L->row_bytes = (sh->fp8 ? H + H / 128 * 4 : 2 * H) + 8 * (uint64_t)sh->k;
        L->slab = how == EP_LL ? LL_ROWS : 0;
        L->E = sh->E;
        L->k = sh->k;
        sc_comm_props cp;
        SC_TRY(sc_comm_info(comm, &cp));
        L->rank = cp.rank;
    }
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = Tmax * H, .label = "out"},
                            &L->out));
    if (how != EP_LL)
        SC_TRY(sc_moe_reserve(s, L->moe, Tmax));
    SC_TRY(sc_event_create(ctx, &(sc_event_desc){.timing = true}, &L->start));
    SC_TRY(sc_event_create(ctx, &(sc_event_desc){.timing = true}, &L->end));
    SC_TRY(sc_stream_synchronize(s));
}

static void drop_graph(layer *L)
{
    if (L->exec_T) {
        SC_TRY(sc_graph_exec_destroy(L->exec));
        SC_TRY(sc_graph_destroy(L->graph));
        L->exec_T = 0;
    }
}

static void free_layer(layer *L)
{
    drop_graph(L);
    if (L->ids.id)
        SC_TRY(sc_buffer_destroy(L->ids));
    SC_TRY(sc_moe_destroy(L->moe));
    for (int i = 0; i < L->nb; i++)
        SC_TRY(sc_buffer_destroy(L->b[i]));
    SC_TRY(sc_buffer_destroy(L->x));
    SC_TRY(sc_buffer_destroy(L->out));
    SC_TRY(sc_event_destroy(L->start));
    SC_TRY(sc_event_destroy(L->end));
    SC_TRY(sc_stream_destroy(L->stream));
}

/* One sample: reps forwards of T tokens between the layer's events; ms per forward. */
static double sample(layer *L, uint64_t T, int reps)
{
    sc_view x, out;
    SC_TRY(sc_buffer_view(L->x, 0, T * L->H, &x));
    SC_TRY(sc_buffer_view(L->out, 0, T * L->H, &out));
    if (L->graphs && L->exec_T != T) { /* capture a forward of T tokens (after one eager) */
        drop_graph(L);
        SC_TRY(sc_moe_forward(L->stream, L->moe, x, out, NULL));
        SC_TRY(sc_stream_begin_capture(L->stream,
                                       &(sc_capture_desc){.mode = SC_CAPTURE_THREAD_LOCAL}));
        SC_TRY(sc_moe_forward(L->stream, L->moe, x, out, NULL));
        SC_TRY(sc_stream_end_capture(L->stream, &L->graph));
        SC_TRY(sc_graph_instantiate(L->graph, &L->exec));
        L->exec_T = T;
    }
    SC_TRY(sc_event_record(L->start, L->stream));
    for (int i = 0; i < reps; i++) {
        if (L->graphs)
            SC_TRY(sc_graph_launch(L->stream, L->exec));
        else
            SC_TRY(sc_moe_forward(L->stream, L->moe, x, out, NULL));
    }
    SC_TRY(sc_event_record(L->end, L->stream));
    SC_TRY(sc_event_synchronize(L->end));
    float ms = 0.f;
    SC_TRY(sc_event_elapsed(L->start, L->end, &ms));
    return ms / reps;
}

static int reps_for(uint64_t T) { return T <= 128 ? 20 : T <= 1024 ? 5 : 2; }

/* ---- the ranks: a thread each, samples aligned by a barrier ---------------------------- */

static int nranks;
static layer ranks[MAX_GPUS];
static pthread_barrier_t all_barrier, rank_barrier;
static struct {
    uint64_t T;
    int samples, warmup;
    bool quit, profile; /* profile: one profiled forward after the samples */
} job;
static double rank_ms[MAX_GPUS][64];
static sc_moe_profile rank_prof[MAX_GPUS];
static double rank_sent[MAX_GPUS]; /* bytes the rank's profiled dispatch sent */
/* low-latency at T = 128 (the goal's point), the largest over the shapes: dispatch, and the
 * combine (the return and the sum) */
static double ll128_dispatch = NAN, ll128_combine = NAN;

/* One profiled forward of T tokens (its steps' device times), and the bytes its dispatch
 * sent: each token once to every other rank holding one of its experts (E / N contiguous
 * experts per rank), or whole packets in low-latency mode. */
static double profile_one(layer *L, uint64_t T, int n, sc_moe_profile *p)
{
    sc_view x, out, ids;
    SC_TRY(sc_buffer_view(L->x, 0, T * L->H, &x));
    SC_TRY(sc_buffer_view(L->out, 0, T * L->H, &out));
    SC_TRY(sc_buffer_view(L->ids, 0, T * (uint64_t)L->k, &ids));
    memset(p, 0, sizeof *p);
    SC_TRY(sc_moe_forward(L->stream, L->moe, x, out,
                          &(sc_moe_forward_desc){.profile = p, .expert_ids = ids}));
    if (L->slab)
        return (double)(n - 1) * (double)L->slab * (double)L->row_bytes;
    int32_t *h = bench_xmalloc(T * (uint64_t)L->k * sizeof *h);
    SC_TRY(sc_copy_to_host(L->stream, h, T * (uint64_t)L->k * sizeof *h, ids));
    uint64_t rows = 0;
    for (uint64_t t = 0; t < T; t++) {
        unsigned mask = 0;
        for (int j = 0; j < L->k; j++) {
            const int e = h[t * (uint64_t)L->k + (uint64_t)j];
            if (e >= 0 && e < L->E && e / (L->E / n) != L->rank)
                mask |= 1u << (e / (L->E / n));
        }
        rows += (uint64_t)__builtin_popcount(mask);
    }
    free(h);
    return (double)rows * (double)L->row_bytes;
}

/* The slowest rank's time of the profile step named `name` (0 when no rank has it). */
static double step_ms(const char *name)
{
    double worst = 0;
    for (int r = 0; r < nranks; r++)
        for (int i = 0; i < rank_prof[r].steps && i < SC_MOE_MAX_STEPS; i++)
            if (rank_prof[r].name[i] && strcmp(rank_prof[r].name[i], name) == 0)
                worst = fmax(worst, rank_prof[r].ms[i]);
    return worst;
}

static void *rank_main(void *arg)
{
    layer *L = arg;
    const int r = (int)(L - ranks);
    for (;;) {
        pthread_barrier_wait(&all_barrier); /* the job is set */
        if (job.quit)
            break;
        for (int i = 0; i < job.warmup + job.samples; i++) {
            pthread_barrier_wait(&rank_barrier);
            const double ms = sample(L, job.T, reps_for(job.T));
            if (i >= job.warmup)
                rank_ms[r][i - job.warmup] = ms;
        }
        if (job.profile) {
            pthread_barrier_wait(&rank_barrier);
            rank_sent[r] = profile_one(L, job.T, nranks, &rank_prof[r]);
        }
        pthread_barrier_wait(&all_barrier); /* the samples are written */
    }
    return NULL;
}

static double run_ranks(uint64_t T, bool quick)
{
    job.T = T;
    job.samples = quick ? 3 : 15;
    job.warmup = quick ? 1 : 3;
    pthread_barrier_wait(&all_barrier);
    pthread_barrier_wait(&all_barrier);
    return bench_median_of_slowest((const double (*)[64])rank_ms, nranks, job.samples);
}

static double run_one(layer *L, uint64_t T, bool quick)
{
    const int samples = quick ? 3 : 15, warmup = quick ? 1 : 3;
    double v[64];
    for (int i = 0; i < warmup + samples; i++) {
        const double ms = sample(L, T, reps_for(T));
        if (i >= warmup)
            v[i - warmup] = ms;
    }
    return bench_median(v, (size_t)samples);
}

/* The ranks' layers of one split, a thread each; time per T (0 where the split does not
 * run it), against the one-GPU times (one[ti]: T tokens; one_all[ti]: N T tokens). */
static void run_split(const shape *sh, split how, sc_context *ctxs, sc_comm *comms,
                      const uint64_t *tokens, int ntok, const double *one, const double *one_all,
                      bool quick, FILE *csv, double *eff_4096_min)
{
    const uint64_t Tmax = how == EP_LL ? LL_ROWS : tokens[ntok - 1];
    for (int r = 0; r < nranks; r++) {
        make_layer(&ranks[r], ctxs[r], sh, nranks, how, comms[r], Tmax);
        ranks[r].graphs = how == EP_LL;
    }
    pthread_t th[MAX_GPUS];
    for (int r = 0; r < nranks; r++)
        if (pthread_create(&th[r], NULL, rank_main, &ranks[r]) != 0) {
            printf("FAILED: pthread_create\n");
            exit(1);
        }
    if (how == TP)
        printf("  %s: I / %d on each GPU, the partial outputs all-reduced; T tokens on every "
               "rank, the one GPU doing T\n",
               split_names[how], nranks);
    else
        printf("  %s: E / %d experts on each GPU; T tokens per rank (each its own), the one "
               "GPU doing %d T%s\n",
               split_names[how], nranks, nranks,
               how == EP_LL ? " (packets of 128 rows: T <= 128; timed as CUDA graph replays, "
                              "the steps from an eager forward)"
                            : "");
    job.profile = how >= EP_NORMAL;
    if (job.profile)
        printf("  %8s %12s %12s %11s %12s %12s %12s %14s\n", "T", "1 GPU ms", "N GPUs ms",
               "efficiency", "dispatch ms", "return ms", "combine ms", "dispatch GB/s");
    else
        printf("  %8s %12s %12s %11s\n", "T", "1 GPU ms", "N GPUs ms", "efficiency");
    for (int ti = 0; ti < ntok; ti++) {
        const uint64_t T = tokens[ti];
        if (T > Tmax)
            continue;
        const double base = how == TP ? one[ti] : one_all[ti];
        const double par = run_ranks(T, quick);
        const double eff = base / (nranks * par);
        const double dispatch = step_ms("ep dispatch (all-to-all)");
        const double back = step_ms("ep return (all-to-all)"), comb = step_ms("ep combine");
        double sent = 0; /* bytes per rank, the mean */
        for (int r = 0; r < nranks; r++)
            sent += rank_sent[r] / nranks;
        const double gbs = dispatch > 0 ? sent / (dispatch * 1e6) : NAN;
        if (job.profile)
            printf("  %8llu %12.4f %12.4f %10.1f%% %12.4f %12.4f %12.4f %14.1f\n",
                   (unsigned long long)T, base, par, 100 * eff, dispatch, back, comb, gbs);
        else
            printf("  %8llu %12.4f %12.4f %10.1f%%\n", (unsigned long long)T, base, par,
                   100 * eff);
        if (csv)
            fprintf(csv, "%s,%d,%s,%llu,%.6f,%.6f,%.4f,%.6f,%.6f,%.6f,%.2f\n", sh->name,
                    nranks, split_names[how], (unsigned long long)T, base, par, eff,
                    job.profile ? dispatch : NAN, job.profile ? back : NAN,
                    job.profile ? comb : NAN, job.profile ? gbs : NAN);
        if (T == 4096)
            *eff_4096_min = fmin(*eff_4096_min, eff);
        if (how == EP_LL && T == 128) {
            ll128_dispatch = isnan(ll128_dispatch) ? dispatch : fmax(ll128_dispatch, dispatch);
            ll128_combine = isnan(ll128_combine) ? back + comb : fmax(ll128_combine, back + comb);
        }
    }
    job.quit = true;
    pthread_barrier_wait(&all_barrier);
    for (int r = 0; r < nranks; r++)
        pthread_join(th[r], NULL);
    job.quit = false;
    for (int r = 0; r < nranks; r++)
        free_layer(&ranks[r]);
}

int main(int argc, char **argv)
{
    int want = bench_take_gpus(&argc, argv, MAX_GPUS);
    if (!want)
        want = 2;
    bench_opts o = bench_parse_args(argc, argv,
                                    "The tensor- and expert-parallel MoE layers on N GPUs "
                                    "(--gpus N, default 2) against one GPU doing all the work: "
                                    "forward times and the scaling efficiency per layer shape "
                                    "and token count.");
    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    bench_require_gpu("bench_moe_parallel");
    int count = 0;
    SC_TRY(sc_device_count(&count));
    nranks = want;
    if (count < nranks) {
        printf("bench_moe_parallel: skipped: needs %d GPUs, this machine has %d\n", nranks, count);
        return 77;
    }
    int version = 0;
    if (sc_comm_library_version(&version) != SC_OK) {
        printf("bench_moe_parallel: skipped: no NCCL: %s\n", sc_last_error());
        return 77;
    }
    sc_device_props props;
    char desc[512];
    bench_describe_device(0, &props, desc, sizeof desc);
    const bool test_device = strstr(props.name, "test device") != NULL;
    const bool fp8_ok = props.cc_major == 9 && props.cc_minor == 0;
    printf("bench_moe_parallel%s: %d x %s; NCCL %d.%d.%d, NCCL_NVLS_ENABLE=%s\n",
           o.quick ? " (--quick: smoke test, not a result)" : "", nranks, desc, version / 10000,
           version / 100 % 100, version % 100, getenv("NCCL_NVLS_ENABLE"));
    static const uint64_t tokens_full[] = {1, 16, 128, 1024, 4096}, tokens_quick[] = {1, 128};
    const uint64_t *tokens = o.quick ? tokens_quick : tokens_full;
    const int ntok = o.quick ? 2 : 5;
    const uint64_t Tmax = tokens[ntok - 1];
    make_blocks();

    sc_context ctxs[MAX_GPUS];
    for (int r = 0; r < nranks; r++)
        SC_TRY(sc_context_create(&(sc_context_desc){.device = r}, &ctxs[r]));
    sc_comm comms[MAX_GPUS];
    SC_TRY(sc_comm_create_all(ctxs, nranks, &(sc_comm_all_desc){.label = "moe"}, comms));
    pthread_barrier_init(&all_barrier, NULL, (unsigned)nranks + 1);
    pthread_barrier_init(&rank_barrier, NULL, (unsigned)nranks);

    char path[4096];
    FILE *csv = bench_open_out(&o, "bench_moe_parallel.csv", path, sizeof path);
    if (csv)
        fprintf(csv, "layer,gpus,split,tokens_per_rank,one_gpu_ms,parallel_ms,efficiency,"
                     "dispatch_ms,return_ms,combine_ms,dispatch_gbs\n");
    double eff_min[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    for (size_t si = 0; si < N_SHAPES; si++) {
        const shape *sh = &shapes[si];
        if (sh->fp8 && !fp8_ok) {
            printf("\n%s: skipped (fp8 experts need compute capability 9.0)\n", sh->name);
            continue;
        }
        if (o.quick && si != 1) /* --quick: one small shape */
            continue;
        printf("\n%s (E %d, top-%d, H %d, I %d%s%s), %d GPUs\n", sh->name, sh->E, sh->k, sh->H,
               sh->I, sh->Is ? ", shared expert" : "", sh->fp8 ? ", fp8 experts" : "", nranks);
        /* the one GPU doing all the work: T and N T tokens */
        layer full;
        make_layer(&full, ctxs[0], sh, 1, ONE, (sc_comm){0}, Tmax * (uint64_t)nranks);
        double one[8], one_all[8];
        for (int ti = 0; ti < ntok; ti++) {
            one[ti] = run_one(&full, tokens[ti], o.quick);
            one_all[ti] = run_one(&full, tokens[ti] * (uint64_t)nranks, o.quick);
        }
        free_layer(&full);
        const bool tp_ok = !((sh->I / nranks) % (sh->fp8 ? 128 : 8) ||
                             (sh->Is / nranks) % (sh->fp8 ? 128 : 8));
        const bool ep_ok = sh->E % nranks == 0;
        for (split how = TP; how <= EP_LL; how++) {
            if ((how == TP && !tp_ok) || (how != TP && !ep_ok)) {
                printf("  %s: skipped (%s is not a multiple of %d)\n", split_names[how],
                       how == TP ? "I / N" : "E", how == TP ? (sh->fp8 ? 128 : 8) : nranks);
                continue;
            }
            run_split(sh, how, ctxs, comms, tokens, ntok, one, one_all, o.quick, csv,
                      test_device ? &(double){0} : &eff_min[how]);
        }
    }
    pthread_barrier_destroy(&all_barrier);
    pthread_barrier_destroy(&rank_barrier);
    for (int r = 0; r < nranks; r++)
        SC_TRY(sc_comm_destroy(comms[r]));
    for (int r = 0; r < nranks; r++)
        SC_TRY(sc_context_destroy(ctxs[r]));
    for (int d = 0; d < 3; d++)
        free(blocks[d]);
    if (csv) {
        fclose(csv);
        printf("\nwrote %s\n", path);
    }
    if (isinf(eff_min[TP]) && isinf(eff_min[EP_NORMAL]))
        printf("\nsummary: %d GPUs: no T = 4096 point measured on a GPU\n", nranks);
    else
        printf("\nsummary: %d GPUs: the lowest scaling efficiency at T = 4096 (per rank): TP "
               "%.1f%%, EP %.1f%% (goal 80%%); EP low-latency at T = 128, the slowest shape: "
               "dispatch %.1f us, combine %.1f us (return + sum, from an eager profiled "
               "forward: each step includes the wait for the slowest rank; goal 60 us each "
               "on 2 GPUs under graph replay)\n",
               nranks, 100 * eff_min[TP], 100 * eff_min[EP_NORMAL], 1000 * ll128_dispatch,
               1000 * ll128_combine);
    return 0;
}
