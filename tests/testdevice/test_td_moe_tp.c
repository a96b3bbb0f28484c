/* The tensor-parallel MoE layer (sc_moe_desc.tp_comm) on two test devices with the NCCL test
 * double: create's checks of the communicator (another context, one rank, destroyed), a
 * forward's (destroyed, aborted: refused before anything is enqueued), and the forward's
 * all-reduce of out over the ranks, one thread per rank: no kernel runs on the test device,
 * so out keeps what each rank put there, and the double really sums, so out on every rank
 * must come back as the sum of the ranks' contents (the collective ran on out, in place, in
 * bf16, after the layer's launches, which the launch checks passed), plain and accumulating,
 * and in a stream capture replayed. Ranks that disagree (T = 5 on one, 4 on the other): every
 * rank's synchronize reports the aborted communicator, nothing hangs. The reduce-scattered
 * output (desc->tp_output): its refusals,
 * and accumulating forwards whose out (each rank's rows) comes back as its own residual (the
 * partial starts as zeros with the rank's rows holding its out; no kernel adds to it here).
 * Nothing here says anything about the layer's results (tests/gpu/test_gpu_moe_tp.c
 * compares them with the one-GPU layer on GPUs). */
#define _GNU_SOURCE

#include "../bf16.h"
#include "comm_td.h"
#include "safecuda/moe.h"

enum { E = 16, K = 4, H = 128, I = 64, T = 5, N = 2 };

typedef struct rank_layer {
    sc_buffer w[6]; /* router, w13, w2, w2 bias, x, out */
    sc_moe layer;
} rank_layer;

static sc_moe_desc rank_desc(sc_context ctx, rank_layer *r, sc_comm comm)
{
    const uint64_t counts[5] = {E * H, E * 2 * I, E * H * I, E * H, T * H};
    const sc_dtype types[5] = {SC_BF16, SC_BF16, SC_BF16, SC_F32, SC_BF16};
    for (int i = 0; i < 5; i++)
        r->w[i] = buf(ctx, types[i], counts[i] * (i == 1 ? H : 1), "moe weight");
    r->w[5] = buf(ctx, SC_BF16, T * H, "moe out");
    return (sc_moe_desc){.experts = E, .top_k = K, .hidden = H, .intermediate = I,
                         .renormalize = true, .router = r->w[0], .w13 = r->w[1],
                         .w2 = r->w[2], .w2_bias = sc_view_of(r->w[3]), .tp_comm = comm,
                         .label = "tp moe"};
}

static void free_rank(rank_layer *r)
{
    for (int i = 0; i < 6; i++)
        CHECK_OK(sc_buffer_destroy(r->w[i]));
}

/* ---- create's and forward's refusals ------------------------------------------------------ */

static void test_refusals(void)
{
    char cd[256];
    rank_layer r0;
    sc_moe_desc d = rank_desc(ctxs[0], &r0, comms[1]);
    /* rank 1's communicator (device 1) for a layer on device 0 */
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_WRONG_CONTEXT,
                  "sc_moe_create: desc->tp_comm (%s) belongs to another context than the layer "
                  "(device 0): a rank's layer is made on its communicator's context",
                  cdesc(1, N, cd, sizeof cd));
    /* a communicator of one rank */
    sc_comm one;
    const int one_line = __LINE__ + 1;
    REQUIRE(sc_comm_create_all(ctxs, 1, &(sc_comm_all_desc){.label = "alone"}, &one) == SC_OK);
    d.tp_comm = one;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->tp_comm (communicator 'alone' (rank 0 of 1 on device 0, "
                  "created at test_td_moe_tp.c:%d)) has 1 rank: a tensor-parallel layer takes 2 "
                  "or more (leave tp_comm zero for a layer on one GPU)",
                  one_line);
    /* destroyed */
    CHECK_OK(sc_comm_destroy(one));
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_STALE_HANDLE,
                  "sc_moe_create: stale communicator handle: the communicator created at "
                  "test_td_moe_tp.c:%d was destroyed (the layer's desc->tp_comm)",
                  one_line);
    CHECK(r0.layer.id == 0);
    free_rank(&r0);
}

/* A layer whose communicator is destroyed, then one whose communicator is aborted: each
 * forward refused before anything is enqueued (out untouched). */
static void test_forward_refusals(void)
{
    sc_comm two[2];
    const int two_line = __LINE__ + 1;
    REQUIRE(sc_comm_create_all(ctxs, 2, &(sc_comm_all_desc){.label = "pair"}, two) == SC_OK);
    rank_layer r0;
    sc_moe_desc d = rank_desc(ctxs[0], &r0, two[0]);
    REQUIRE(sc_moe_create(ctxs[0], &d, &r0.layer) == SC_OK);
    CHECK_OK(sc_comm_abort(two[0]));
    sc_clear_error();
    CHECK_STATUS(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, sc_view_of(r0.w[4]),
                                sc_view_of(r0.w[5]), NULL),
                 SC_ERR_COMM);
    CHECK_MSG("sc_moe_forward: ");
    CHECK_MSG(" (the layer's desc->tp_comm)");
    CHECK_OK(sc_comm_destroy(two[0]));
    CHECK_OK(sc_comm_destroy(two[1]));
    CHECK_REFUSED(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, sc_view_of(r0.w[4]),
                                 sc_view_of(r0.w[5]), NULL),
                  SC_ERR_STALE_HANDLE,
                  "sc_moe_forward: stale communicator handle: the communicator created at "
                  "test_td_moe_tp.c:%d was destroyed (the layer's desc->tp_comm)",
                  two_line);
    /* the routing alone makes no collective */
    sc_buffer ids = buf(ctxs[0], SC_I32, T * K, "ids"), wts = buf(ctxs[0], SC_F32, T * K, "w");
    CHECK_OK(sc_moe_route(SC_DEFAULT_STREAM, r0.layer, sc_view_of(r0.w[4]), sc_view_of(ids),
                          sc_view_of(wts)));
    CHECK_OK(sc_buffer_destroy(ids));
    CHECK_OK(sc_buffer_destroy(wts));
    CHECK_OK(sc_moe_destroy(r0.layer));
    free_rank(&r0);
}

/* ---- ranks that disagree: T = 5 on rank 0, 4 on rank 1 ------------------------------------------
 * The all-reduces differ in count: the double (like NCCL's own checks, or at worst the
 * timeout) makes it every rank's error, reported by each rank's synchronize; nothing hangs. */
static rank_layer mm[2];
static sc_comm mm_comms[2];
static sc_status mm_status[2];
static char mm_message[2][1024];
static void *rank_mismatched(void *arg)
{
    const int r = (int)(intptr_t)arg;
    sc_view x;
    REQUIRE(sc_buffer_view(mm[r].w[4], 0, (uint64_t)(r == 0 ? 5 : 4) * H, &x) == SC_OK);
    sc_view out = x;
    out.buffer = mm[r].w[5];
    rank_outcome(sc_moe_forward(SC_DEFAULT_STREAM, mm[r].layer, x, out, NULL), mm_comms[r],
                 &mm_status[r], mm_message[r], sizeof mm_message[r]);
    return NULL;
}

static void test_mismatched_ranks(void)
{
    REQUIRE(sc_comm_create_all(ctxs, 2, &(sc_comm_all_desc){.label = "disagree"}, mm_comms) ==
            SC_OK);
    for (int r = 0; r < 2; r++) {
        sc_moe_desc d = rank_desc(ctxs[r], &mm[r], mm_comms[r]);
        REQUIRE(sc_moe_create(ctxs[r], &d, &mm[r].layer) == SC_OK);
    }
    pthread_t th[2];
    for (int r = 0; r < 2; r++)
        REQUIRE(pthread_create(&th[r], NULL, rank_mismatched, (void *)(intptr_t)r) == 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        CHECK(mm_status[r] == SC_ERR_COMM);
        CHECK(strstr(mm_message[r], "communicator 'disagree'") != NULL);
        CHECK(strstr(mm_message[r], "was aborted") != NULL);
        CHECK(strstr(mm_message[r], "ncclInvalidUsage") != NULL);
        if (mm_status[r] != SC_ERR_COMM || !strstr(mm_message[r], "ncclInvalidUsage"))
            fprintf(stderr, "rank %d: %s: %s\n", r, sc_status_name(mm_status[r]), mm_message[r]);
    }
    for (int r = 0; r < 2; r++) {
        CHECK_OK(sc_moe_destroy(mm[r].layer));
        free_rank(&mm[r]);
    }
    for (int r = 0; r < 2; r++)
        CHECK_OK(sc_comm_destroy(mm_comms[r]));
}

/* ---- the reduce-scattered output ------------------------------------------------------------ */

static void test_reduce_scatter_refusals(void)
{
    rank_layer r0;
    sc_moe_desc d = rank_desc(ctxs[0], &r0, (sc_comm){0});
    d.tp_output = SC_MOE_TP_REDUCE_SCATTER;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->tp_output = SC_MOE_TP_REDUCE_SCATTER without a tp_comm: "
                  "only a tensor-parallel layer reduce-scatters its output");
    d.tp_comm = comms[0];
    d.tp_output = (sc_moe_tp_output)2;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->tp_output = 2: SC_MOE_TP_ALL_REDUCE (0) or "
                  "SC_MOE_TP_REDUCE_SCATTER (1)");
    CHECK(r0.layer.id == 0);
    /* made: T = 5 is no multiple of 2 ranks; out not T / N rows */
    d.tp_output = SC_MOE_TP_REDUCE_SCATTER;
    REQUIRE(sc_moe_create(ctxs[0], &d, &r0.layer) == SC_OK);
    CHECK_REFUSED(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, sc_view_of(r0.w[4]),
                                 sc_view_of(r0.w[5]), NULL),
                  SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_forward: x holds T = 5 tokens: a reduce-scattering tensor-parallel "
                  "layer (desc->tp_output) takes a multiple of its 2 ranks");
    sc_view x4;
    REQUIRE(sc_buffer_view(r0.w[4], 0, 4 * H, &x4) == SC_OK);
    CHECK_REFUSED(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, x4, sc_view_of(r0.w[5]), NULL),
                  SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_forward: out has %d elements: a reduce-scattering tensor-parallel "
                  "layer writes rank 0's T / N = 4 / 2 rows of H = %d (%d elements)",
                  T * H, H, 2 * H);
    CHECK_OK(sc_moe_destroy(r0.layer));
    free_rank(&r0);
}

/* ---- the all-reduce, one thread per rank ----------------------------------------------------- */

static rank_layer ranks[N];
static uint16_t contents[N][T * H], got[N][T * H];
static bool accumulate_now, capture_now;

/* Reduce-scattered, accumulating, T = 4: each rank's out (2 rows) is its residual again. */
static sc_moe rs_layers[N];
static void *rank_scatter(void *arg)
{
    const int r = (int)(intptr_t)arg;
    sc_view x4, out2;
    REQUIRE(sc_buffer_view(ranks[r].w[4], 0, 4 * H, &x4) == SC_OK);
    REQUIRE(sc_buffer_view(ranks[r].w[5], 0, 2 * H, &out2) == SC_OK);
    upload(ranks[r].w[5], contents[r], sizeof contents[r]);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, rs_layers[r], x4, out2,
                            &(sc_moe_forward_desc){.accumulate = true}));
    /* The test device runs work enqueued behind an unfinished collective at once (its holds
     * model completion only, testdevice/hold.c): without this wait the second forward would
     * rewrite its partial while the other rank's thread still reduces the first. */
    CHECK_OK(sc_comm_synchronize(comms[r]));
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, rs_layers[r], x4, out2,
                            &(sc_moe_forward_desc){.accumulate = true}));
    CHECK_OK(sc_comm_synchronize(comms[r]));
    download(ranks[r].w[5], got[r], sizeof got[r]);
    return NULL;
}

static void *rank_forward(void *arg)
{
    const int r = (int)(intptr_t)arg;
    upload(ranks[r].w[5], contents[r], sizeof contents[r]);
    const sc_moe_forward_desc o = {.accumulate = accumulate_now};
    if (!capture_now) {
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, ranks[r].layer, sc_view_of(ranks[r].w[4]),
                                sc_view_of(ranks[r].w[5]), &o));
    } else {
        sc_stream s;
        sc_graph g;
        sc_graph_exec ex;
        REQUIRE(sc_stream_create(ctxs[r], NULL, &s) == SC_OK);
        CHECK_OK(sc_moe_reserve(s, ranks[r].layer, T));
        /* thread-local: the other rank's thread copies to pageable memory meanwhile, which a
         * global-mode capture forbids in every thread */
        CHECK_OK(sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_THREAD_LOCAL}));
        CHECK_OK(sc_moe_forward(s, ranks[r].layer, sc_view_of(ranks[r].w[4]),
                                sc_view_of(ranks[r].w[5]), &o));
        REQUIRE(sc_stream_end_capture(s, &g) == SC_OK);
        REQUIRE(sc_graph_instantiate(g, &ex) == SC_OK);
        CHECK_OK(sc_graph_launch(s, ex));
        CHECK_OK(sc_stream_synchronize(s));
        CHECK_OK(sc_graph_exec_destroy(ex));
        CHECK_OK(sc_graph_destroy(g));
        CHECK_OK(sc_stream_destroy(s));
    }
    CHECK_OK(sc_comm_synchronize(comms[r]));
    download(ranks[r].w[5], got[r], sizeof got[r]);
    return NULL;
}

static void run_ranks(bool accumulate, bool capture, uint64_t seed)
{
    uint64_t st = seed;
    for (int r = 0; r < N; r++)
        for (int i = 0; i < T * H; i++)
            contents[r][i] = f2bf((float)((double)(test_rand(&st) >> 11) / 9007199254740992.0 * 2 - 1));
    accumulate_now = accumulate;
    capture_now = capture;
    pthread_t th[N];
    for (int r = 0; r < N; r++)
        REQUIRE(pthread_create(&th[r], NULL, rank_forward, (void *)(intptr_t)r) == 0);
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
    int bad = 0;
    for (int r = 0; r < N; r++)
        for (int i = 0; i < T * H; i++)
            bad += got[r][i] != f2bf(bf2f(contents[0][i]) + bf2f(contents[1][i]));
    if (bad)
        fprintf(stderr, "all-reduce (accumulate %d, capture %d): %d elements differ from the sum\n",
                accumulate, capture, bad);
    CHECK(bad == 0);
}

static void test_all_reduce(void)
{
    sc_moe_desc d[N];
    for (int r = 0; r < N; r++) {
        d[r] = rank_desc(ctxs[r], &ranks[r], comms[r]);
        if (r == 1) /* w2_bias is rank 0's only: other ranks may leave it out */
            d[r].w2_bias = (sc_view){{0}, 0, 0};
        REQUIRE(sc_moe_create(ctxs[r], &d[r], &ranks[r].layer) == SC_OK);
    }
    run_ranks(false, false, 11);
    run_ranks(true, false, 12);
    run_ranks(false, true, 13);
    run_ranks(true, true, 14);
    /* reduce-scattered: the same weights, a layer per rank */
    for (int r = 0; r < N; r++) {
        d[r].tp_output = SC_MOE_TP_REDUCE_SCATTER;
        REQUIRE(sc_moe_create(ctxs[r], &d[r], &rs_layers[r]) == SC_OK);
    }
    uint64_t st = 15;
    for (int r = 0; r < N; r++)
        for (int i = 0; i < T * H; i++)
            contents[r][i] = f2bf((float)((double)(test_rand(&st) >> 11) / 9007199254740992.0 * 2 - 1));
    pthread_t th[N];
    for (int r = 0; r < N; r++)
        REQUIRE(pthread_create(&th[r], NULL, rank_scatter, (void *)(intptr_t)r) == 0);
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < N; r++) {
        CHECK(memcmp(got[r], contents[r], sizeof got[r]) == 0); /* out's 2 rows and the rest */
        CHECK_OK(sc_moe_destroy(rs_layers[r]));
    }
    for (int r = 0; r < N; r++) {
        CHECK_OK(sc_moe_destroy(ranks[r].layer));
        free_rank(&ranks[r]);
    }
}

int main(void)
{
    comm_td_attach();
    open_contexts(N);
    /* The kernels are compiled with NVRTC: without it, nothing here can run. */
    {
        rank_layer r0;
        sc_moe_desc d = rank_desc(ctxs[0], &r0, (sc_comm){0});
        sc_moe layer;
        sc_status s = sc_moe_create(ctxs[0], &d, &layer);
        free_rank(&r0);
        if (s == SC_ERR_NO_COMPILER) {
            printf("test_td_moe_tp: skipped: %s\n", sc_last_error());
            close_contexts(N);
            return 77;
        }
        REQUIRE(s == SC_OK);
        CHECK_OK(sc_moe_destroy(layer));
    }
    world(N, 0);
    const int misuse0 = fake.misuse_count();
    test_refusals();
    test_forward_refusals();
    test_reduce_scatter_refusals();
    test_mismatched_ranks();
    test_all_reduce();
    CHECK(fake.misuse_count() == misuse0);
    if (fake.misuse_count() != misuse0)
        fprintf(stderr, "last misuse: %s\n", fake.last_misuse());
    end_world(N);
    close_contexts(N);
    CHECK(fake.live_device_allocations() == 0);
    return test_result("test_td_moe_tp");
}
