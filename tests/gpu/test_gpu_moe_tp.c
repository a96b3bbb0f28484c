/* The tensor-parallel MoE layer (sc_moe_desc.tp_comm) on 2 GPUs (and 4 when there are), one
 * thread per rank: fresh random full weights, each rank's layer over its shard of I (the
 * checkpoints' split, as moe.h describes it), against the one-GPU layer over the full weights
 * on GPU 0 with the same x (the routing is the same: replicated router, same kernels): the
 * relative L2 error of every rank's output within 1e-2 (the partials are rounded to bf16
 * before the all-reduce), plain and accumulating (out = residual + layer(x): the residual
 * counted once), and a stream capture of the forward replayed bit-identical to the eager
 * forward. A DeepSeek-V3-like layer (sigmoid, grouped routing, selection bias, routed
 * scaling, a shared expert) in bf16 and with fp8 experts (compute capability 9.0), and a
 * gpt-oss-like one (interleaved W13, clamped SwiGLU, router, W13 and W2 biases). T = 1, 7,
 * 129, 4096. The reduce-scattered output (desc->tp_output, sequence parallelism) at T = N and
 * 4096: each rank's rows of the one-GPU output, plain and accumulating (its own residual
 * rows). Outputs poisoned first. Skipped (77) with fewer than 2 GPUs or without NCCL.
 * --gpus N: N ranks only. */
#include <pthread.h>

#include "moe_models.h"

#define MAX_RANKS MOE_MODELS_MAX_RANKS

/* Rank r's rows of a W13-like tensor: `outer` experts of 2 full rows each (full = I, or I/128
 * for block scales), rank r's 2 sh of them in the layout, row_bytes each. */
static void *shard_rows(const void *src, size_t outer, size_t full, size_t sh, int r,
                        bool interleaved, size_t row_bytes)
{
    unsigned char *out = test_xmalloc(outer * 2 * sh * row_bytes);
    const unsigned char *in = src;
    for (size_t e = 0; e < outer; e++)
        for (size_t j = 0; j < 2 * sh; j++) {
            const size_t row = interleaved ? 2 * (size_t)r * sh + j
                             : j < sh      ? (size_t)r * sh + j
                                           : full + (size_t)r * sh + (j - sh);
            memcpy(out + (e * 2 * sh + j) * row_bytes, in + (e * 2 * full + row) * row_bytes,
                   row_bytes);
        }
    return out;
}

/* Rank r's columns [r sh, (r+1) sh) of `outer` rows of `full` elements of esize bytes. */
static void *shard_cols(const void *src, size_t outer, size_t full, size_t sh, int r,
                        size_t esize)
{
    unsigned char *out = test_xmalloc(outer * sh * esize);
    const unsigned char *in = src;
    for (size_t o = 0; o < outer; o++)
        memcpy(out + o * sh * esize, in + (o * full + (size_t)r * sh) * esize, sh * esize);
    return out;
}

/* The layer of rank r of n (n = 1: the full layer, no communicator) on ctx. */
static sc_status make_layer(sc_context ctx, const model *m, int r, int n, sc_comm comm,
                            layer_bufs *lb)
{
    memset(lb, 0, sizeof *lb);
    const size_t E = (size_t)m->E, H = (size_t)m->H, I = (size_t)m->I, Is = (size_t)m->Is;
    const size_t sh = I / (size_t)n, ssh = Is / (size_t)n;
    const sc_dtype et = m->fp8 ? SC_F8E4M3 : SC_BF16;
    const size_t es = m->fp8 ? 1 : 2;
    sc_moe_desc d = {.experts = m->E, .top_k = m->k, .hidden = m->H, .intermediate = (int)sh,
                     .renormalize = true, .max_tokens = 4096, .label = m->name,
                     .tp_comm = comm, .expert_dtype = et,
                     .w13_layout = m->interleaved ? SC_MOE_W13_INTERLEAVED : SC_MOE_W13_STACKED};
    if (m->gptoss) {
        d.activation = SC_MOE_SWIGLU_CLAMP;
    } else {
        d.scoring = SC_MOE_SIGMOID;
        d.n_group = 4;
        d.topk_group = 2;
        d.routed_scaling = 2.5f;
    }
    d.router_view = upload(ctx, lb, SC_BF16, m->router, E * H);
    void *p = shard_rows(m->w13, E, I, sh, r, m->interleaved, H * es);
    d.w13_view = upload(ctx, lb, et, p, E * 2 * sh * H);
    free(p);
    p = shard_cols(m->w2, E * H, I, sh, r, es);
    d.w2_view = upload(ctx, lb, et, p, E * H * sh);
    free(p);
    if (m->fp8) {
        const size_t hb = H / 128;
        p = shard_rows(m->w13s, E, I / 128, sh / 128, r, m->interleaved, hb * 4);
        d.w13_scale = upload(ctx, lb, SC_F32, p, E * 2 * (sh / 128) * hb);
        free(p);
        p = shard_cols(m->w2s, E * hb, I / 128, sh / 128, r, 4);
        d.w2_scale = upload(ctx, lb, SC_F32, p, E * hb * (sh / 128));
        free(p);
    }
    if (m->shared) {
        d.shared_intermediate = (int)ssh;
        d.selection_bias_view = upload(ctx, lb, SC_F32, m->sel, E);
        p = shard_rows(m->sw13, 1, Is, ssh, r, m->interleaved, H * es);
        d.shared_w13 = upload(ctx, lb, et, p, 2 * ssh * H);
        free(p);
        p = shard_cols(m->sw2, H, Is, ssh, r, es);
        d.shared_w2 = upload(ctx, lb, et, p, H * ssh);
        free(p);
        if (m->fp8) {
            const size_t hb = H / 128;
            p = shard_rows(m->sw13s, 1, Is / 128, ssh / 128, r, m->interleaved, hb * 4);
            d.shared_w13_scale = upload(ctx, lb, SC_F32, p, 2 * (ssh / 128) * hb);
            free(p);
            p = shard_cols(m->sw2s, hb, Is / 128, ssh / 128, r, 4);
            d.shared_w2_scale = upload(ctx, lb, SC_F32, p, hb * (ssh / 128));
            free(p);
        }
    }
    if (m->gptoss) {
        d.router_bias = upload(ctx, lb, SC_F32, m->rbias, E);
        p = shard_rows(m->b13, E, I, sh, r, m->interleaved, 4);
        d.w13_bias = upload(ctx, lb, SC_F32, p, E * 2 * sh);
        free(p);
        d.w2_bias = upload(ctx, lb, SC_F32, m->b2, E * H); /* replicated; used on rank 0 */
    }
    sc_status s = sc_moe_create(ctx, &d, &lb->layer);
    if (s == SC_OK && comm.id) {
        d.tp_output = SC_MOE_TP_REDUCE_SCATTER;
        s = sc_moe_create(ctx, &d, &lb->alt);
    }
    return s;
}

static void free_layer(layer_bufs *lb)
{
    CHECK_OK(sc_moe_destroy(lb->layer));
    if (lb->alt.id)
        CHECK_OK(sc_moe_destroy(lb->alt));
    for (int i = 0; i < lb->n; i++)
        CHECK_OK(sc_buffer_destroy(lb->b[i]));
}

/* ---- one rank's forwards, on its own thread ---------------------------------------------- */

typedef struct rank_job {
    sc_context ctx;
    sc_moe layer;
    const uint16_t *x, *res;
    uint64_t T;
    int H;
    uint16_t *out, *acc, *graph; /* eager, accumulating, replayed */
} rank_job;

static void *rank_run(void *arg)
{
    rank_job *j = arg;
    const uint64_t n = j->T * (uint64_t)j->H;
    sc_stream s;
    sc_buffer x, out;
    REQUIRE(sc_stream_create(j->ctx, NULL, &s) == SC_OK);
    REQUIRE(sc_buffer_create(j->ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n}, &x) == SC_OK);
    REQUIRE(sc_buffer_create(j->ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n}, &out) == SC_OK);
    const uint16_t poison = 0x7fc1; /* a NaN */
    CHECK_OK(sc_copy_from_host(s, sc_view_of(x), j->x, n * 2));
    CHECK_OK(sc_fill(s, sc_view_of(out), &poison));
    CHECK_OK(sc_moe_forward(s, j->layer, sc_view_of(x), sc_view_of(out), NULL));
    CHECK_OK(sc_copy_to_host(s, j->out, n * 2, sc_view_of(out)));
    CHECK_OK(sc_copy_from_host(s, sc_view_of(out), j->res, n * 2));
    CHECK_OK(sc_moe_forward(s, j->layer, sc_view_of(x), sc_view_of(out),
                            &(sc_moe_forward_desc){.accumulate = true}));
    CHECK_OK(sc_copy_to_host(s, j->acc, n * 2, sc_view_of(out)));
    /* captured, then replayed */
    sc_graph g;
    sc_graph_exec ex;
    CHECK_OK(sc_fill(s, sc_view_of(out), &poison));
    CHECK_OK(sc_moe_reserve(s, j->layer, j->T));
    /* thread-local: the other ranks' threads copy to pageable memory meanwhile, which a
     * global-mode capture forbids in every thread */
    CHECK_OK(sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_THREAD_LOCAL}));
    CHECK_OK(sc_moe_forward(s, j->layer, sc_view_of(x), sc_view_of(out), NULL));
    REQUIRE(sc_stream_end_capture(s, &g) == SC_OK);
    REQUIRE(sc_graph_instantiate(g, &ex) == SC_OK);
    CHECK_OK(sc_graph_launch(s, ex));
    CHECK_OK(sc_copy_to_host(s, j->graph, n * 2, sc_view_of(out)));
    CHECK_OK(sc_graph_exec_destroy(ex));
    CHECK_OK(sc_graph_destroy(g));
    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_buffer_destroy(out));
    CHECK_OK(sc_stream_destroy(s));
    return NULL;
}

/* The reduce-scattering layer of rank r of n: out = its T / n rows, then with its rows of
 * res accumulated. */
typedef struct rs_job {
    sc_context ctx;
    sc_moe layer;
    const uint16_t *x, *res;
    uint64_t T;
    int H, r, n;
    uint16_t *out, *acc; /* T / n rows each */
} rs_job;

static void *rs_run(void *arg)
{
    rs_job *j = arg;
    const uint64_t n = j->T * (uint64_t)j->H, rows = n / (uint64_t)j->n;
    sc_stream s;
    sc_buffer x, out;
    REQUIRE(sc_stream_create(j->ctx, NULL, &s) == SC_OK);
    REQUIRE(sc_buffer_create(j->ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n}, &x) == SC_OK);
    REQUIRE(sc_buffer_create(j->ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = rows}, &out) == SC_OK);
    const uint16_t poison = 0x7fc1; /* a NaN */
    CHECK_OK(sc_copy_from_host(s, sc_view_of(x), j->x, n * 2));
    CHECK_OK(sc_fill(s, sc_view_of(out), &poison));
    CHECK_OK(sc_moe_forward(s, j->layer, sc_view_of(x), sc_view_of(out), NULL));
    CHECK_OK(sc_copy_to_host(s, j->out, rows * 2, sc_view_of(out)));
    CHECK_OK(sc_copy_from_host(s, sc_view_of(out), j->res + (uint64_t)j->r * rows, rows * 2));
    CHECK_OK(sc_moe_forward(s, j->layer, sc_view_of(x), sc_view_of(out),
                            &(sc_moe_forward_desc){.accumulate = true}));
    CHECK_OK(sc_copy_to_host(s, j->acc, rows * 2, sc_view_of(out)));
    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_buffer_destroy(out));
    CHECK_OK(sc_stream_destroy(s));
    return NULL;
}

static void run_model(sc_context *ctxs, sc_comm *comms, int n, model *m)
{
    make_model(m);
    layer_bufs full, ranks[MAX_RANKS];
    REQUIRE(make_layer(ctxs[0], m, 0, 1, (sc_comm){0}, &full) == SC_OK);
    for (int r = 0; r < n; r++)
        if (make_layer(ctxs[r], m, r, n, comms[r], &ranks[r]) != SC_OK) {
            fprintf(stderr, "%s rank %d: %s\n", m->name, r, sc_last_error());
            REQUIRE(false);
        }
    const uint64_t tokens[] = {1, 7, 129, 4096, (uint64_t)n};
    for (size_t ti = 0; ti < sizeof tokens / sizeof tokens[0]; ti++) {
        const uint64_t T = tokens[ti], cnt = T * (uint64_t)m->H;
        uint16_t *x = bf16_random(cnt, 1.0f), *res = bf16_random(cnt, 1.0f);
        uint16_t *ref = test_xmalloc(cnt * 2), *ref_acc = test_xmalloc(cnt * 2);
        /* the one-GPU layer over the full weights, on GPU 0 */
        rank_job ref_job = {ctxs[0], full.layer, x, res, T, m->H, ref, ref_acc,
                            test_xmalloc(cnt * 2)};
        rank_run(&ref_job);
        free(ref_job.graph);
        rank_job jobs[MAX_RANKS];
        pthread_t th[MAX_RANKS];
        for (int r = 0; r < n; r++) {
            jobs[r] = (rank_job){ctxs[r], ranks[r].layer, x, res, T, m->H,
                                 test_xmalloc(cnt * 2), test_xmalloc(cnt * 2),
                                 test_xmalloc(cnt * 2)};
            REQUIRE(pthread_create(&th[r], NULL, rank_run, &jobs[r]) == 0);
        }
        for (int r = 0; r < n; r++)
            pthread_join(th[r], NULL);
        if (T % (uint64_t)n == 0 && (T == (uint64_t)n || T == 4096)) {
            /* reduce-scattered: rank r's rows of the one-GPU output */
            rs_job rj[MAX_RANKS];
            const uint64_t rows = cnt / (uint64_t)n;
            for (int r = 0; r < n; r++) {
                rj[r] = (rs_job){ctxs[r], ranks[r].alt, x, res, T, m->H, r, n,
                                 test_xmalloc(rows * 2), test_xmalloc(rows * 2)};
                REQUIRE(pthread_create(&th[r], NULL, rs_run, &rj[r]) == 0);
            }
            for (int r = 0; r < n; r++)
                pthread_join(th[r], NULL);
            for (int r = 0; r < n; r++) {
                const double e = rel_l2(rj[r].out, ref + (uint64_t)r * rows, rows);
                const double ea = rel_l2(rj[r].acc, ref_acc + (uint64_t)r * rows, rows);
                printf("%s, %d ranks, T = %llu, rank %d, reduce-scattered: rel L2 %.2e, "
                       "accumulating %.2e\n",
                       m->name, n, (unsigned long long)T, r, e, ea);
                CHECK(e <= 1e-2);
                CHECK(ea <= 1e-2);
                free(rj[r].out);
                free(rj[r].acc);
            }
        }
        for (int r = 0; r < n; r++) {
            const double e = rel_l2(jobs[r].out, ref, cnt), ea = rel_l2(jobs[r].acc, ref_acc, cnt);
            const bool same = memcmp(jobs[r].graph, jobs[r].out, cnt * 2) == 0;
            printf("%s, %d ranks, T = %llu, rank %d: rel L2 %.2e, accumulating %.2e, graph %s\n",
                   m->name, n, (unsigned long long)T, r, e, ea,
                   same ? "bit-identical" : "DIFFERS");
            CHECK(e <= 1e-2);
            CHECK(ea <= 1e-2);
            CHECK(same);
            free(jobs[r].out);
            free(jobs[r].acc);
            free(jobs[r].graph);
        }
        free(x);
        free(res);
        free(ref);
        free(ref_acc);
    }
    for (int r = 0; r < n; r++)
        free_layer(&ranks[r]);
    free_layer(&full);
    free_model(m);
}

static void round_tp(sc_context *ctxs, sc_comm *comms, int n, bool fp8)
{
    model ds = {.name = "deepseek-v3 like bf16", .E = 16, .k = 4, .H = 256, .I = 512,
                .Is = 512, .shared = true};
    run_model(ctxs, comms, n, &ds);
    if (fp8) {
        model d8 = {.name = "deepseek-v3 like fp8", .E = 16, .k = 4, .H = 256, .I = 512,
                    .Is = 512, .shared = true, .fp8 = true};
        run_model(ctxs, comms, n, &d8);
    }
    model go = {.name = "gpt-oss like bf16", .E = 8, .k = 2, .H = 256, .I = 256,
                .interleaved = true, .gptoss = true};
    run_model(ctxs, comms, n, &go);
}

int main(int argc, char **argv)
{
    return moe_rounds(argc, argv, "test_gpu_moe_tp", "the tensor-parallel layer", "tp",
                      round_tp);
}
