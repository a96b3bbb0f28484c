/* The expert-parallel MoE layer (sc_moe_desc.ep_comm) on 2 GPUs (and 4 when there are), one
 * thread per rank: fresh random full weights, each rank's layer over its experts (moe.h's
 * layout: the router and the shared expert whole, the routed experts' tensors the rank's
 * experts only), against the one-GPU layer over the full weights on GPU 0 with the same x:
 * the relative L2 error of every rank's output within 1e-2 (a row computed on another rank
 * is rounded to bf16 once more), plain and accumulating (out = residual + layer(x)).
 * Every rank has its own tokens, a different T on each: T = base + rank for base = 1, 7,
 * 129, 4096, and a step where rank 1 has none (T = 0). Normal mode at every T; low-latency
 * mode (packets of 160 rows) at the bases up to 129, eager, accumulating, and a stream
 * capture of the forward replayed bit-identical to the eager forward. The caller's routing
 * sending every token to rank 0's experts (each rank's x against the one-GPU layer with the
 * same routing). A DeepSeek-V3-like layer (sigmoid, grouped routing, selection bias, routed
 * scaling, a shared expert: computed on each token's own rank) in bf16 and with fp8 experts
 * (compute capability 9.0), with experts in contiguous blocks, and a gpt-oss-like one
 * (interleaved W13, clamped SwiGLU, router, W13 and W2 biases) with expert e on rank
 * e mod N (desc->ep_owner). Outputs poisoned first. Skipped (77) with fewer than 2 GPUs or
 * without NCCL. --gpus N: N ranks only. --quick (for compute-sanitizer): the bf16
 * DeepSeek-V3-like layer at bases 7 and 129 only. */
#include <pthread.h>

#include "moe_models.h"

#define MAX_RANKS MOE_MODELS_MAX_RANKS
#define LL_ROWS 160 /* the low-latency layers' ep_max_tokens */

/* Expert e's block of `per` elements of esize bytes, for each e of the rank's experts. */
static void *expert_rows(const void *src, const int32_t *owner, int E, int r, size_t per,
                         size_t esize, size_t *count)
{
    size_t n = 0;
    for (int e = 0; e < E; e++)
        n += owner[e] == r;
    unsigned char *out = test_xmalloc(n * per * esize + 1);
    const unsigned char *in = src;
    size_t at = 0;
    for (int e = 0; e < E; e++)
        if (owner[e] == r) {
            memcpy(out + at * per * esize, in + (size_t)e * per * esize, per * esize);
            at++;
        }
    *count = n * per;
    return out;
}

/* The layer of rank r (owner: each expert's rank; comm zero: the full layer on one GPU,
 * owner all r). On ranks also the low-latency layer (lb->alt). */
static sc_status make_layer(sc_context ctx, const model *m, int r, sc_comm comm,
                            const int32_t *owner, bool listed, layer_bufs *lb)
{
    memset(lb, 0, sizeof *lb);
    const size_t H = (size_t)m->H, I = (size_t)m->I, Is = (size_t)m->Is, E = (size_t)m->E;
    const sc_dtype et = m->fp8 ? SC_F8E4M3 : SC_BF16;
    const size_t es = m->fp8 ? 1 : 2, hb = H / 128;
    sc_moe_desc d = {.experts = m->E, .top_k = m->k, .hidden = m->H, .intermediate = m->I,
                     .renormalize = true, .max_tokens = 4096, .label = m->name,
                     .ep_comm = comm, .ep_owner = comm.id && listed ? owner : NULL,
                     .expert_dtype = et,
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
    size_t n;
    void *p = expert_rows(m->w13, owner, m->E, r, 2 * I * H, es, &n);
    d.w13_view = upload(ctx, lb, et, p, n);
    free(p);
    p = expert_rows(m->w2, owner, m->E, r, H * I, es, &n);
    d.w2_view = upload(ctx, lb, et, p, n);
    free(p);
    if (m->fp8) {
        p = expert_rows(m->w13s, owner, m->E, r, 2 * (I / 128) * hb, 4, &n);
        d.w13_scale = upload(ctx, lb, SC_F32, p, n);
        free(p);
        p = expert_rows(m->w2s, owner, m->E, r, hb * (I / 128), 4, &n);
        d.w2_scale = upload(ctx, lb, SC_F32, p, n);
        free(p);
    }
    if (m->shared) { /* whole on every rank */
        d.shared_intermediate = m->Is;
        d.selection_bias_view = upload(ctx, lb, SC_F32, m->sel, E);
        d.shared_w13 = upload(ctx, lb, et, m->sw13, 2 * Is * H);
        d.shared_w2 = upload(ctx, lb, et, m->sw2, H * Is);
        if (m->fp8) {
            d.shared_w13_scale = upload(ctx, lb, SC_F32, m->sw13s, 2 * (Is / 128) * hb);
            d.shared_w2_scale = upload(ctx, lb, SC_F32, m->sw2s, hb * (Is / 128));
        }
    }
    if (m->gptoss) {
        d.router_bias = upload(ctx, lb, SC_F32, m->rbias, E);
        p = expert_rows(m->b13, owner, m->E, r, 2 * I, 4, &n);
        d.w13_bias = upload(ctx, lb, SC_F32, p, n);
        free(p);
        p = expert_rows(m->b2, owner, m->E, r, H, 4, &n);
        d.w2_bias = upload(ctx, lb, SC_F32, p, n);
        free(p);
    }
    sc_status s = sc_moe_create(ctx, &d, &lb->layer);
    if (s == SC_OK && comm.id) {
        d.ep_mode = SC_MOE_EP_LOW_LATENCY;
        d.ep_max_tokens = LL_ROWS;
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

/* ---- one rank's forwards (or the one-GPU layer's), on its own thread ----------------------- */

typedef struct rank_job {
    sc_context ctx;
    sc_moe layer;
    const uint16_t *x, *res;
    const int32_t *ids; /* the caller's routing (with wts), or NULL */
    const float *wts;
    uint64_t T;
    int H, k;
    bool graph_too;              /* also captured and replayed */
    uint16_t *out, *acc, *graph; /* eager, accumulating, replayed */
} rank_job;

static void *rank_run(void *arg)
{
    rank_job *j = arg;
    const uint64_t n = j->T * (uint64_t)j->H, nk = j->T * (uint64_t)j->k;
    sc_stream s;
    sc_buffer xb, ob, ib, wb;
    REQUIRE(sc_stream_create(j->ctx, NULL, &s) == SC_OK);
    REQUIRE(sc_buffer_create(j->ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n + 8}, &xb) ==
            SC_OK);
    REQUIRE(sc_buffer_create(j->ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n + 8}, &ob) ==
            SC_OK);
    REQUIRE(sc_buffer_create(j->ctx, &(sc_buffer_desc){.dtype = SC_I32, .count = nk + 1}, &ib) ==
            SC_OK);
    REQUIRE(sc_buffer_create(j->ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = nk + 1}, &wb) ==
            SC_OK);
    const sc_view x = {xb, 0, n}, out = {ob, 0, n}; /* empty views when T = 0 */
    sc_moe_forward_desc o = {0};
    if (j->ids && n) {
        o.routing_ids = (sc_view){ib, 0, nk};
        o.routing_weights = (sc_view){wb, 0, nk};
        CHECK_OK(sc_copy_from_host(s, o.routing_ids, j->ids, nk * 4));
        CHECK_OK(sc_copy_from_host(s, o.routing_weights, j->wts, nk * 4));
    }
    const uint16_t poison = 0x7fc1; /* a NaN */
    if (n) {
        CHECK_OK(sc_copy_from_host(s, x, j->x, n * 2));
        CHECK_OK(sc_fill(s, out, &poison));
    }
    CHECK_OK(sc_moe_forward(s, j->layer, x, out, &o));
    if (n)
        CHECK_OK(sc_copy_to_host(s, j->out, n * 2, out));
    if (n)
        CHECK_OK(sc_copy_from_host(s, out, j->res, n * 2));
    o.accumulate = true;
    CHECK_OK(sc_moe_forward(s, j->layer, x, out, &o));
    if (n)
        CHECK_OK(sc_copy_to_host(s, j->acc, n * 2, out));
    o.accumulate = false;
    if (j->graph_too) {
        sc_graph g;
        sc_graph_exec ex;
        if (n)
            CHECK_OK(sc_fill(s, out, &poison));
        /* thread-local: the other ranks' threads copy to pageable memory meanwhile */
        CHECK_OK(sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_THREAD_LOCAL}));
        CHECK_OK(sc_moe_forward(s, j->layer, x, out, &o));
        REQUIRE(sc_stream_end_capture(s, &g) == SC_OK);
        REQUIRE(sc_graph_instantiate(g, &ex) == SC_OK);
        CHECK_OK(sc_graph_launch(s, ex));
        if (n)
            CHECK_OK(sc_copy_to_host(s, j->graph, n * 2, out));
        CHECK_OK(sc_stream_synchronize(s));
        CHECK_OK(sc_graph_exec_destroy(ex));
        CHECK_OK(sc_graph_destroy(g));
    }
    CHECK_OK(sc_stream_synchronize(s));
    sc_buffer all[4] = {xb, ob, ib, wb};
    for (int i = 0; i < 4; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
    CHECK_OK(sc_stream_destroy(s));
    return NULL;
}

/* One step: rank r's T[r] tokens (x[r], res[r]) through the rank layers (low-latency ones
 * when ll), each against the one-GPU layer on the same tokens; with the caller's routing
 * (ids, wts per rank) when given. */
static void step(sc_context *ctxs, int n, const model *m, const layer_bufs *full,
                 layer_bufs *ranks, const uint64_t *T, bool ll, int32_t **ids, float **wts,
                 const char *what)
{
    uint16_t *x[MAX_RANKS], *res[MAX_RANKS];
    rank_job jobs[MAX_RANKS], ref;
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        const uint64_t cnt = T[r] * (uint64_t)m->H;
        x[r] = bf16_random(cnt + 1, 1.0f);
        res[r] = bf16_random(cnt + 1, 1.0f);
        jobs[r] = (rank_job){ctxs[r], ll ? ranks[r].alt : ranks[r].layer, x[r], res[r],
                             ids ? ids[r] : NULL, wts ? wts[r] : NULL, T[r], m->H, m->k, ll,
                             test_xmalloc(cnt * 2 + 2), test_xmalloc(cnt * 2 + 2),
                             test_xmalloc(cnt * 2 + 2)};
        REQUIRE(pthread_create(&th[r], NULL, rank_run, &jobs[r]) == 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
        if (T[r] == 0) {
            printf("%s, %d ranks, %s, rank %d: no tokens\n", m->name, n, what, r);
        } else {
            const uint64_t cnt = T[r] * (uint64_t)m->H;
            ref = (rank_job){ctxs[0], full->layer, x[r], res[r], ids ? ids[r] : NULL,
                             wts ? wts[r] : NULL, T[r], m->H, m->k, false,
                             test_xmalloc(cnt * 2), test_xmalloc(cnt * 2), NULL};
            rank_run(&ref);
            const double e = rel_l2(jobs[r].out, ref.out, cnt);
            const double ea = rel_l2(jobs[r].acc, ref.acc, cnt);
            const bool same = !ll || memcmp(jobs[r].graph, jobs[r].out, cnt * 2) == 0;
            printf("%s, %d ranks, %s, rank %d, T = %llu: rel L2 %.2e, accumulating %.2e%s\n",
                   m->name, n, what, r, (unsigned long long)T[r], e, ea,
                   !ll ? "" : same ? ", graph bit-identical" : ", graph DIFFERS");
            CHECK(e <= 1e-2);
            CHECK(ea <= 1e-2);
            CHECK(same);
            free(ref.out);
            free(ref.acc);
        }
        free(jobs[r].out);
        free(jobs[r].acc);
        free(jobs[r].graph);
        free(x[r]);
        free(res[r]);
    }
}

static bool quick;

static void run_model(sc_context *ctxs, sc_comm *comms, int n, model *m, bool listed)
{
    make_model(m);
    int32_t owner[SC_MOE_MAX_EXPERTS], all0[SC_MOE_MAX_EXPERTS] = {0};
    for (int e = 0; e < m->E; e++)
        owner[e] = listed ? e % n : e / (m->E / n);
    layer_bufs full, ranks[MAX_RANKS];
    REQUIRE(make_layer(ctxs[0], m, 0, (sc_comm){0}, all0, false, &full) == SC_OK);
    for (int r = 0; r < n; r++)
        if (make_layer(ctxs[r], m, r, comms[r], owner, listed, &ranks[r]) != SC_OK) {
            fprintf(stderr, "%s rank %d: %s\n", m->name, r, sc_last_error());
            REQUIRE(false);
        }
    const uint64_t bases[] = {1, 7, 129, 4096};
    for (size_t b = 0; b < sizeof bases / sizeof bases[0]; b++) {
        if (quick && bases[b] != 7 && bases[b] != 129)
            continue;
        uint64_t T[MAX_RANKS] = {0};
        for (int r = 0; r < n; r++)
            T[r] = bases[b] + (uint64_t)r;
        step(ctxs, n, m, &full, ranks, T, false, NULL, NULL, "normal");
        if (bases[b] + (uint64_t)n <= LL_ROWS)
            step(ctxs, n, m, &full, ranks, T, true, NULL, NULL, "low-latency");
    }
    /* a rank with no tokens */
    uint64_t T[MAX_RANKS] = {0};
    for (int r = 0; r < n; r++)
        T[r] = r == 1 ? 0 : 5 + (uint64_t)r;
    step(ctxs, n, m, &full, ranks, T, false, NULL, NULL, "normal");
    step(ctxs, n, m, &full, ranks, T, true, NULL, NULL, "low-latency");
    /* every token to rank 0's experts (the caller's routing, k distinct of them) */
    int r0[SC_MOE_MAX_EXPERTS], n0 = 0;
    for (int e = 0; e < m->E; e++)
        if (owner[e] == 0)
            r0[n0++] = e;
    int32_t *ids[MAX_RANKS];
    float *wts[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        T[r] = 129 + (uint64_t)r;
        ids[r] = test_xmalloc(T[r] * (uint64_t)m->k * 4);
        wts[r] = test_xmalloc(T[r] * (uint64_t)m->k * 4);
        for (uint64_t t = 0; t < T[r]; t++)
            for (int j = 0; j < m->k; j++) {
                ids[r][t * (uint64_t)m->k + (uint64_t)j] =
                    j < n0 ? r0[(t + (uint64_t)j) % (uint64_t)n0] : -1;
                wts[r][t * (uint64_t)m->k + (uint64_t)j] = (urand() + 1.5f) / (float)m->k;
            }
    }
    step(ctxs, n, m, &full, ranks, T, false, ids, wts, "all to rank 0's experts");
    for (int r = 0; r < n; r++) {
        free(ids[r]);
        free(wts[r]);
    }
    for (int r = 0; r < n; r++)
        free_layer(&ranks[r]);
    free_layer(&full);
    free_model(m);
}

static void round_ep(sc_context *ctxs, sc_comm *comms, int n, bool fp8)
{
    model ds = {.name = "deepseek-v3 like bf16", .E = 16, .k = 4, .H = 256, .I = 256,
                .Is = 512, .shared = true};
    run_model(ctxs, comms, n, &ds, false);
    if (quick) {
        printf("--quick: the fp8 and gpt-oss-like layers left out\n");
        return;
    }
    if (fp8) {
        model d8 = {.name = "deepseek-v3 like fp8", .E = 16, .k = 4, .H = 256, .I = 256,
                    .Is = 512, .shared = true, .fp8 = true};
        run_model(ctxs, comms, n, &d8, false);
    }
    model go = {.name = "gpt-oss like bf16", .E = 8, .k = 2, .H = 256, .I = 256,
                .interleaved = true, .gptoss = true};
    run_model(ctxs, comms, n, &go, true);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        quick |= strcmp(argv[i], "--quick") == 0;
    return moe_rounds(argc, argv, "test_gpu_moe_ep", "the expert-parallel layer", "ep",
                      round_ep);
}
