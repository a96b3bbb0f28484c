/* The expert-parallel MoE layer (sc_moe_desc.ep_comm) on two test devices with the NCCL test
 * double: create's checks (the communicator, the mode, the expert map, the rank's weights),
 * a forward's refusals (before anything is enqueued), and forwards on both ranks, one
 * thread per rank, in both modes: normal (the counts exchanged and read on the host), low
 * latency eager and captured in a graph replayed twice, the caller's routing, different T
 * on each rank, a rank with no tokens (T = 0); ranks whose layers disagree (both find it at
 * their first forward and return it), a rank that stops (the communicator's timeout ends the
 * other's forward), a rank whose forward fails after its first exchange (its communicator
 * aborted, the other's forward ended by the timeout). No kernel runs on the test device, so nothing here says anything about
 * the layer's results (tests/gpu/test_gpu_moe_ep.c compares them with the one-GPU layer on
 * GPUs): these check the plumbing: every launch passes its checks, every exchange is one
 * the double accepts (the ranks' counts agree), nothing is misused, nothing leaks. */
#define _GNU_SOURCE

#include "../bf16.h"
#include "comm_td.h"
#include "safecuda/moe.h"

enum { E = 16, K = 4, H = 128, I = 64, IS = 64, N = 2, TMAX = 8 };

typedef struct rank_layer {
    sc_buffer w[8]; /* router, w13, w2, shared w13, shared w2, shared gate, x, out */
    sc_moe layer;
} rank_layer;

/* Rank r's layer over `local` experts (the shared expert and its gate whole). */
static sc_moe_desc rank_desc(sc_context ctx, rank_layer *r, sc_comm comm, int local)
{
    const uint64_t counts[8] = {E * H, (uint64_t)local * 2 * I * H, (uint64_t)local * H * I,
                                2 * IS * H, H * IS, H, TMAX * H, TMAX * H};
    static const char *const labels[8] = {"router", "w13", "w2", "shared w13",
                                          "shared w2", "shared gate", "x", "out"};
    for (int i = 0; i < 8; i++)
        r->w[i] = buf(ctx, SC_BF16, counts[i], labels[i]);
    return (sc_moe_desc){.experts = E, .top_k = K, .hidden = H, .intermediate = I,
                         .renormalize = true, .router = r->w[0], .w13 = r->w[1], .w2 = r->w[2],
                         .shared_intermediate = IS, .shared_w13 = sc_view_of(r->w[3]),
                         .shared_w2 = sc_view_of(r->w[4]), .shared_gate = sc_view_of(r->w[5]),
                         .ep_comm = comm, .label = "ep moe"};
}

static void free_rank(rank_layer *r)
{
    for (int i = 0; i < 8; i++)
        CHECK_OK(sc_buffer_destroy(r->w[i]));
}

/* ---- create's refusals -------------------------------------------------------------------- */

static void test_create_refusals(void)
{
    char cd[256];
    rank_layer r0;
    sc_moe_desc d = rank_desc(ctxs[0], &r0, comms[0], E / N);
    /* both kinds of parallelism */
    d.tp_comm = comms[0];
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->tp_comm and desc->ep_comm are both given: a layer is "
                  "tensor- or expert-parallel, not both");
    d.tp_comm = (sc_comm){0};
    /* the mode and its packets */
    d.ep_mode = (sc_moe_ep_mode)2;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->ep_mode = 2: SC_MOE_EP_NORMAL (0) or "
                  "SC_MOE_EP_LOW_LATENCY (1)");
    d.ep_mode = SC_MOE_EP_LOW_LATENCY;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->ep_max_tokens = 0: a low-latency expert-parallel layer "
                  "takes 1 .. 65536 (the most tokens a rank's forward takes)");
    d.ep_mode = SC_MOE_EP_NORMAL;
    d.ep_max_tokens = 5;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->ep_max_tokens = 5 is for SC_MOE_EP_LOW_LATENCY (the "
                  "normal mode sends exact counts: leave it 0)");
    d.ep_max_tokens = 0;
    /* the expert map: contiguous blocks need E a multiple of N */
    d.experts = 15;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->experts = 15 is not a multiple of desc->ep_comm's 2 "
                  "ranks: give desc->ep_owner (each expert's rank) to split them otherwise");
    d.experts = E;
    int32_t owner[E];
    for (int e = 0; e < E; e++)
        owner[e] = e % N;
    owner[3] = 2;
    d.ep_owner = owner;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->ep_owner[3] = 2: each expert's rank is 0 .. 1 "
                  "(desc->ep_comm's ranks)");
    for (int e = 0; e < E; e++)
        owner[e] = 0;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->ep_owner gives rank 1 no expert: every rank of "
                  "desc->ep_comm holds one or more");
    d.ep_owner = NULL;
    /* the communicator: another device's, a rank of one, destroyed */
    d.ep_comm = comms[1];
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_WRONG_CONTEXT,
                  "sc_moe_create: desc->ep_comm (%s) belongs to another context than the layer "
                  "(device 0): a rank's layer is made on its communicator's context",
                  cdesc(1, N, cd, sizeof cd));
    sc_comm one;
    const int one_line = __LINE__ + 1;
    REQUIRE(sc_comm_create_all(ctxs, 1, &(sc_comm_all_desc){.label = "alone"}, &one) == SC_OK);
    d.ep_comm = one;
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_create: desc->ep_comm (communicator 'alone' (rank 0 of 1 on device 0, "
                  "created at test_td_moe_ep.c:%d)) has 1 rank: an expert-parallel layer takes "
                  "2 .. 32 (leave ep_comm zero for a layer on one GPU)",
                  one_line);
    CHECK_OK(sc_comm_destroy(one));
    CHECK_REFUSED(sc_moe_create(ctxs[0], &d, &r0.layer), SC_ERR_STALE_HANDLE,
                  "sc_moe_create: stale communicator handle: the communicator created at "
                  "test_td_moe_ep.c:%d was destroyed (the layer's desc->ep_comm)",
                  one_line);
    d.ep_comm = comms[0];
    /* the rank's weights: all E experts' instead of its E / N */
    rank_layer full;
    sc_moe_desc df = rank_desc(ctxs[0], &full, comms[0], E);
    sc_clear_error();
    CHECK_STATUS(sc_moe_create(ctxs[0], &df, &full.layer), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_moe_create: ");
    CHECK_MSG("w13");
    CHECK_MSG(" (an expert-parallel layer's w13, w2, their biases and scales hold its rank's "
              "experts: rank 0 of 2 holds 8 of the 16)");
    free_rank(&full);
    CHECK(r0.layer.id == 0);
    /* made: contiguous halves, then a map giving rank 0 three experts (fewer than top_k) */
    REQUIRE(sc_moe_create(ctxs[0], &d, &r0.layer) == SC_OK);
    uint64_t bytes = 0;
    CHECK_OK(sc_moe_workspace_bytes(r0.layer, &bytes));
    CHECK(bytes > 0);
    {   /* what a leak report would say of it: one live layer, its parts not listed */
        sc_object_info live[64];
        size_t n = 0, layers = 0;
        CHECK_OK(sc_context_live_objects(ctxs[0], live, 64, &n));
        for (size_t i = 0; i < n && i < 64; i++)
            if (strcmp(live[i].kind, "moe layer") == 0) {
                layers++;
                CHECK(strcmp(live[i].detail, "E=16 k=4 H=128 I=64 shared 64, expert parallel, "
                                             "rank 0 of 2: 8 experts, normal") == 0);
                if (strstr(live[i].detail, "expert parallel") == NULL)
                    fprintf(stderr, "detail: %s\n", live[i].detail);
            }
        CHECK(layers == 1);
    }
    CHECK_OK(sc_moe_destroy(r0.layer));
    free_rank(&r0);
    rank_layer r3;
    sc_moe_desc d3 = rank_desc(ctxs[0], &r3, comms[0], 3);
    for (int e = 0; e < E; e++)
        owner[e] = e < 3 ? 0 : 1;
    d3.ep_owner = owner;
    CHECK_OK(sc_moe_create(ctxs[0], &d3, &r3.layer));
    owner[0] = 1; /* read at create only */
    CHECK_OK(sc_moe_destroy(r3.layer));
    free_rank(&r3);
}

/* ---- a forward's refusals (one rank; nothing is enqueued, so no collective is made) ---- */

/* A forward of layer on a capturing stream of rank 0's context: SC_ERR_CAPTURE, its message
 * holding msg; the capture ends empty. */
static void refused_in_capture(sc_moe layer, sc_view x, sc_view out,
                               const sc_moe_forward_desc *fd, const char *msg)
{
    sc_stream s;
    sc_graph g;
    REQUIRE(sc_stream_create(ctxs[0], NULL, &s) == SC_OK);
    REQUIRE(sc_stream_begin_capture(s, NULL) == SC_OK);
    sc_clear_error();
    CHECK_STATUS(sc_moe_forward(s, layer, x, out, fd), SC_ERR_CAPTURE);
    CHECK_MSG(msg);
    CHECK_OK(sc_stream_end_capture(s, &g));
    CHECK_OK(sc_graph_destroy(g));
    CHECK_OK(sc_stream_destroy(s));
}

static void test_forward_refusals(void)
{
    rank_layer r0;
    sc_moe_desc d = rank_desc(ctxs[0], &r0, comms[0], E / N);
    d.ep_mode = SC_MOE_EP_LOW_LATENCY;
    d.ep_max_tokens = 4;
    REQUIRE(sc_moe_create(ctxs[0], &d, &r0.layer) == SC_OK);
    sc_view x5, out5;
    REQUIRE(sc_buffer_view(r0.w[6], 0, 5 * H, &x5) == SC_OK);
    REQUIRE(sc_buffer_view(r0.w[7], 0, 5 * H, &out5) == SC_OK);
    CHECK_REFUSED(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, x5, out5, NULL),
                  SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_forward: x holds T = 5 tokens: this low-latency expert-parallel layer "
                  "takes up to desc->ep_max_tokens = 4 per forward");
    CHECK_REFUSED(sc_moe_reserve(SC_DEFAULT_STREAM, r0.layer, 5), SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_reserve: max_tokens = 5: a low-latency expert-parallel layer takes up "
                  "to desc->ep_max_tokens = 4 tokens per forward");
    sc_moe_profile prof;
    sc_view x4, out4;
    REQUIRE(sc_buffer_view(r0.w[6], 0, 4 * H, &x4) == SC_OK);
    REQUIRE(sc_buffer_view(r0.w[7], 0, 4 * H, &out4) == SC_OK);
    CHECK_REFUSED(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, x4, out4,
                                 &(sc_moe_forward_desc){.check_routing = true}),
                  SC_ERR_NOT_SUPPORTED,
                  "sc_moe_forward: opts->check_routing: an expert-parallel layer's forward takes "
                  "no routing check (sc_moe_routing_check after it reports a bad id)");
    /* not in a group: its exchanges depend on each other */
    REQUIRE(sc_comm_group_begin() == SC_OK);
    CHECK_REFUSED(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, x4, out4, NULL),
                  SC_ERR_INVALID_ARGUMENT,
                  "sc_moe_forward: an expert-parallel forward inside sc_comm_group_begin / _end: "
                  "its exchanges depend on each other (counts, then rows, then rows back), so "
                  "it runs from a thread (or process) per GPU, not in a group");
    CHECK_OK(sc_comm_group_end());
    {   /* a rank without tokens: x and out both empty, bf16 */
        sc_view x0, f0;
        REQUIRE(sc_buffer_view(r0.w[6], 0, 0, &x0) == SC_OK);
        CHECK_REFUSED(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, x0, out4, NULL),
                      SC_ERR_INVALID_ARGUMENT,
                      "sc_moe_forward: x is empty (T = 0: a rank with no tokens this step) and "
                      "out has %d elements: both must be T x H",
                      4 * H);
        sc_buffer f = buf(ctxs[0], SC_F32, 8, "f32 x");
        REQUIRE(sc_buffer_view(f, 0, 0, &f0) == SC_OK);
        CHECK_REFUSED(sc_moe_forward(SC_DEFAULT_STREAM, r0.layer, f0, x0, NULL),
                      SC_ERR_TYPE_MISMATCH, "sc_moe_forward: x is f32; it must be bf16");
        CHECK_OK(sc_buffer_destroy(f));
    }
    /* the first forward compares the ranks' layers (a host wait): not in a capture */
    refused_in_capture(r0.layer, x4, out4, NULL,
                       "an expert-parallel layer's first forward, which checks that the ranks' "
                       "layers agree (a host wait; run one forward before capturing),");
    /* a profile waits: not in a capture, even in low-latency mode */
    refused_in_capture(r0.layer, x4, out4, &(sc_moe_forward_desc){.profile = &prof},
                       "a profiled forward (it waits for the stream)");
    /* the routing alone: over all E experts, no collective */
    sc_buffer ids = buf(ctxs[0], SC_I32, 4 * K, "ids"), wts = buf(ctxs[0], SC_F32, 4 * K, "w");
    CHECK_OK(sc_moe_route(SC_DEFAULT_STREAM, r0.layer, x4, sc_view_of(ids), sc_view_of(wts)));
    CHECK_OK(sc_buffer_destroy(ids));
    CHECK_OK(sc_buffer_destroy(wts));
    CHECK_OK(sc_moe_destroy(r0.layer));
    /* normal mode: not in a capture */
    d.ep_mode = SC_MOE_EP_NORMAL;
    d.ep_max_tokens = 0;
    REQUIRE(sc_moe_create(ctxs[0], &d, &r0.layer) == SC_OK);
    refused_in_capture(r0.layer, x4, out4, NULL,
                       "a normal-mode expert-parallel forward, which reads the ranks' token "
                       "counts on the host (SC_MOE_EP_LOW_LATENCY is captured whole),");
    CHECK_OK(sc_moe_destroy(r0.layer));
    free_rank(&r0);
}

/* ---- forwards on both ranks, one thread per rank ------------------------------------------- */

static rank_layer normal[N], ll[N];
static int rank_T[N];

static void *rank_forwards(void *arg)
{
    const int r = (int)(intptr_t)arg;
    const uint64_t T = (uint64_t)rank_T[r];
    sc_view x, out;
    REQUIRE(sc_buffer_view(normal[r].w[6], 0, T * H, &x) == SC_OK);
    REQUIRE(sc_buffer_view(normal[r].w[7], 0, T * H, &out) == SC_OK);
    /* Each forward is waited for before the next: the test device runs work enqueued
     * behind an unfinished exchange at once (testdevice/hold.c), which a GPU would not. */
    sc_moe_profile prof = {0};
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, normal[r].layer, x, out,
                            &(sc_moe_forward_desc){.profile = &prof}));
    /* the steps: the routing (with tokens), plan, dispatch, experts, return, combine (with) */
    CHECK(prof.steps == (T ? 6 : 4));
    CHECK(prof.steps >= 4 && strcmp(prof.name[T ? 2 : 1], "ep dispatch (all-to-all)") == 0);
    CHECK_OK(sc_comm_synchronize(comms[r]));
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, normal[r].layer, x, out,
                            &(sc_moe_forward_desc){.accumulate = true}));
    CHECK_OK(sc_comm_synchronize(comms[r]));
    /* the caller's routing (global ids, one slot padded), and the routing's copies; a rank
     * without tokens takes part all the same */
    if (T == 0) {
        CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, normal[r].layer, x, out, NULL));
        CHECK_OK(sc_comm_synchronize(comms[r]));
        goto low_latency;
    }
    sc_buffer ids = buf(ctxs[r], SC_I32, T * K, "ids"), wts = buf(ctxs[r], SC_F32, T * K, "w");
    int32_t h_ids[TMAX * K];
    float h_w[TMAX * K];
    for (uint64_t i = 0; i < T * K; i++) {
        h_ids[i] = i % 7 == 3 ? -1 : (int32_t)((i * 5 + (uint64_t)r) % E);
        h_w[i] = 0.25f;
    }
    upload(ids, h_ids, T * K * sizeof h_ids[0]);
    upload(wts, h_w, T * K * sizeof h_w[0]);
    sc_buffer got_ids = buf(ctxs[r], SC_I32, T * K, "got ids");
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, normal[r].layer, x, out,
                            &(sc_moe_forward_desc){.routing_ids = sc_view_of(ids),
                                                   .routing_weights = sc_view_of(wts),
                                                   .expert_ids = sc_view_of(got_ids)}));
    CHECK_OK(sc_comm_synchronize(comms[r]));
    int32_t back[TMAX * K];
    download(got_ids, back, T * K * sizeof back[0]);
    CHECK(memcmp(back, h_ids, T * K * sizeof back[0]) == 0);
    CHECK_OK(sc_buffer_destroy(got_ids));
    CHECK_OK(sc_buffer_destroy(ids));
    CHECK_OK(sc_buffer_destroy(wts));
    /* low latency: eager, then captured and replayed twice */
low_latency:
    REQUIRE(sc_buffer_view(ll[r].w[6], 0, T * H, &x) == SC_OK);
    REQUIRE(sc_buffer_view(ll[r].w[7], 0, T * H, &out) == SC_OK);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, ll[r].layer, x, out, NULL));
    CHECK_OK(sc_comm_synchronize(comms[r]));
    sc_stream s;
    sc_graph g;
    sc_graph_exec ex;
    REQUIRE(sc_stream_create(ctxs[r], NULL, &s) == SC_OK);
    CHECK_OK(sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_THREAD_LOCAL}));
    CHECK_OK(sc_moe_forward(s, ll[r].layer, x, out, &(sc_moe_forward_desc){.accumulate = true}));
    REQUIRE(sc_stream_end_capture(s, &g) == SC_OK);
    REQUIRE(sc_graph_instantiate(g, &ex) == SC_OK);
    for (int i = 0; i < 2; i++) {
        CHECK_OK(sc_graph_launch(s, ex));
        CHECK_OK(sc_stream_synchronize(s));
    }
    CHECK_OK(sc_graph_exec_destroy(ex));
    CHECK_OK(sc_graph_destroy(g));
    CHECK_OK(sc_stream_destroy(s));
    CHECK_OK(sc_comm_synchronize(comms[r]));
    return NULL;
}

/* Rank 0 with T0 tokens, rank 1 with T1 (0: a rank with no tokens this step). */
static void test_forwards(int T0, int T1)
{
    rank_T[0] = T0;
    rank_T[1] = T1;
    for (int r = 0; r < N; r++) {
        sc_moe_desc d = rank_desc(ctxs[r], &normal[r], comms[r], E / N);
        REQUIRE(sc_moe_create(ctxs[r], &d, &normal[r].layer) == SC_OK);
        d = rank_desc(ctxs[r], &ll[r], comms[r], E / N);
        d.ep_mode = SC_MOE_EP_LOW_LATENCY;
        d.ep_max_tokens = TMAX;
        REQUIRE(sc_moe_create(ctxs[r], &d, &ll[r].layer) == SC_OK);
    }
    pthread_t th[N];
    for (int r = 0; r < N; r++)
        REQUIRE(pthread_create(&th[r], NULL, rank_forwards, (void *)(intptr_t)r) == 0);
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < N; r++) {
        CHECK_OK(sc_moe_destroy(normal[r].layer));
        CHECK_OK(sc_moe_destroy(ll[r].layer));
        free_rank(&normal[r]);
        free_rank(&ll[r]);
    }
}

/* ---- ranks whose layers disagree, a rank that stops --------------------------------------
 * Rank 0 in normal mode, rank 1 in low-latency: the first forward's comparison finds it on
 * both ranks, which both return it at once (no exchange that could not match is made).
 * Then ranks that agree, and rank 1 makes no forward after the first: rank 0's next one
 * ends with the communicator's timeout; nothing hangs. */
static rank_layer mm[N];
static sc_comm mm_comms[N];
static sc_status mm_status[N];
static char mm_message[N][1024];
static int mm_forwards[N];

static void *rank_forwards_n(void *arg)
{
    const int r = (int)(intptr_t)arg;
    sc_view x, out;
    REQUIRE(sc_buffer_view(mm[r].w[6], 0, 3 * H, &x) == SC_OK);
    REQUIRE(sc_buffer_view(mm[r].w[7], 0, 3 * H, &out) == SC_OK);
    sc_status s = SC_OK;
    for (int i = 0; i < mm_forwards[r] && s == SC_OK; i++)
        if ((s = sc_moe_forward(SC_DEFAULT_STREAM, mm[r].layer, x, out, NULL)) == SC_OK)
            s = sc_comm_synchronize(mm_comms[r]);
    mm_status[r] = s;
    snprintf(mm_message[r], sizeof mm_message[r], "%s", sc_last_error());
    return NULL;
}

static void run_pair(bool rank1_low_latency, int forwards0, int forwards1)
{
    REQUIRE(sc_comm_create_all(ctxs, N, &(sc_comm_all_desc){.timeout_ms = 500,
                                                            .label = "disagree"},
                               mm_comms) == SC_OK);
    for (int r = 0; r < N; r++) {
        sc_moe_desc d = rank_desc(ctxs[r], &mm[r], mm_comms[r], E / N);
        if (r == 1 && rank1_low_latency) {
            d.ep_mode = SC_MOE_EP_LOW_LATENCY;
            d.ep_max_tokens = TMAX;
        }
        REQUIRE(sc_moe_create(ctxs[r], &d, &mm[r].layer) == SC_OK);
    }
    mm_forwards[0] = forwards0;
    mm_forwards[1] = forwards1;
    pthread_t th[N];
    for (int r = 0; r < N; r++)
        REQUIRE(pthread_create(&th[r], NULL, rank_forwards_n, (void *)(intptr_t)r) == 0);
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
}

static void end_pair(void)
{
    for (int r = 0; r < N; r++) {
        CHECK_OK(sc_moe_destroy(mm[r].layer));
        free_rank(&mm[r]);
    }
    for (int r = 0; r < N; r++)
        CHECK_OK(sc_comm_destroy(mm_comms[r]));
}

static void test_ranks_that_disagree(void)
{
    sc_set_log_callback(test_log_capture, NULL);
    double t0 = test_now_s();
    run_pair(true, 1, 1);
    CHECK(test_now_s() - t0 < 0.45); /* found at once, not by the timeout */
    for (int r = 0; r < N; r++) {
        char want[300];
        snprintf(want, sizeof want,
                 "sc_moe_forward: rank %d's expert-parallel layer differs from rank %d's (this "
                 "one) in ep_mode (%d, here %d): every rank makes its layer with the same desc "
                 "but for its experts' weights",
                 1 - r, r, 1 - r, r);
        CHECK(mm_status[r] == SC_ERR_INVALID_ARGUMENT);
        CHECK(strcmp(mm_message[r], want) == 0);
        if (strcmp(mm_message[r], want) != 0)
            fprintf(stderr, "rank %d: %s\n  want: %s\n", r, mm_message[r], want);
    }
    end_pair();
    /* rank 1 stops after the first forward */
    t0 = test_now_s();
    run_pair(false, 2, 1);
    const double t = test_now_s() - t0;
    CHECK(t >= 0.45 && t < 30);
    CHECK_OK(mm_status[1]);
    CHECK(mm_status[0] == SC_ERR_TIMEOUT);
    CHECK(strstr(mm_message[0], "communicator 'disagree'") != NULL);
    CHECK(strstr(mm_message[0], "did not finish within the timeout of 500 ms") != NULL);
    if (mm_status[0] != SC_ERR_TIMEOUT)
        fprintf(stderr, "rank 0: %s: %s\n", sc_status_name(mm_status[0]), mm_message[0]);
    end_pair();
    sc_set_log_callback(NULL, NULL);
}

/* ---- a rank whose forward fails after its first exchange ----------------------------------
 * Low-latency layers on both ranks; a first forward on each (the agreement), then NCCL
 * refuses the first send of the second (SAFECUDA_NCCLFAULT_FAIL: one rank's dispatch, after
 * it began exchanging): that rank returns the failure with the note that desc->ep_comm was
 * aborted, its communicator is aborted (a later forward says so), and the other rank's
 * forward, whose dispatch waits for the failed rank's, ends with the communicator's
 * timeout; nothing hangs. */
static pthread_barrier_t fx_barrier;

static void *rank_fails_after_exchange(void *arg)
{
    const int r = (int)(intptr_t)arg;
    sc_view x, out;
    REQUIRE(sc_buffer_view(mm[r].w[6], 0, 3 * H, &x) == SC_OK);
    REQUIRE(sc_buffer_view(mm[r].w[7], 0, 3 * H, &out) == SC_OK);
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, mm[r].layer, x, out, NULL));
    CHECK_OK(sc_comm_synchronize(mm_comms[r]));
    pthread_barrier_wait(&fx_barrier); /* the fault is set */
    pthread_barrier_wait(&fx_barrier);
    rank_outcome(sc_moe_forward(SC_DEFAULT_STREAM, mm[r].layer, x, out, NULL), mm_comms[r],
                 &mm_status[r], mm_message[r], sizeof mm_message[r]);
    return NULL;
}

static void test_rank_fails_after_exchange(void)
{
    sc_set_log_callback(test_log_capture, NULL);
    const int line = __LINE__ + 1;
    REQUIRE(sc_comm_create_all(ctxs, N, &(sc_comm_all_desc){.timeout_ms = 500,
                                                            .label = "fails"},
                               mm_comms) == SC_OK);
    for (int r = 0; r < N; r++) {
        sc_moe_desc d = rank_desc(ctxs[r], &mm[r], mm_comms[r], E / N);
        d.ep_mode = SC_MOE_EP_LOW_LATENCY;
        d.ep_max_tokens = TMAX;
        REQUIRE(sc_moe_create(ctxs[r], &d, &mm[r].layer) == SC_OK);
    }
    REQUIRE(pthread_barrier_init(&fx_barrier, NULL, N + 1) == 0);
    pthread_t th[N];
    for (int r = 0; r < N; r++)
        REQUIRE(pthread_create(&th[r], NULL, rank_fails_after_exchange, (void *)(intptr_t)r) == 0);
    pthread_barrier_wait(&fx_barrier);
    setenv("SAFECUDA_NCCLFAULT_FAIL", "ncclSend:1:ncclSystemError", 1);
    const double t0 = test_now_s();
    pthread_barrier_wait(&fx_barrier);
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
    const double t = test_now_s() - t0;
    unsetenv("SAFECUDA_NCCLFAULT_FAIL");
    pthread_barrier_destroy(&fx_barrier);
    CHECK(t < 30);
    /* the rank whose send NCCL refused, and the other */
    const int f = mm_status[0] == SC_ERR_COMM ? 0 : 1, o = 1 - f;
    char want[1200];
    snprintf(want, sizeof want,
             "sc_comm_group_end: communicator 'fails' (rank %d of 2 on device %d, created at "
             "test_td_moe_ep.c:%d) was aborted: NCCL refused the all-to-all-v of %d x bf16: "
             "ncclSystemError (unhandled system error (run with NCCL_DEBUG=INFO for details)); "
             "NCCL's last error: ncclfault: injected ncclSystemError into ncclSend (call 1); "
             "the state of its ranks is unknown (the dispatch of an expert-parallel layer's "
             "tokens over desc->ep_comm) (desc->ep_comm was aborted: the other ranks' forwards "
             "return an error) (in sc_moe_forward)",
             f, f, line, N * TMAX * H); /* (the packets to every rank, its own too) */
    CHECK(mm_status[f] == SC_ERR_COMM);
    CHECK(strcmp(mm_message[f], want) == 0);
    CHECK(mm_status[o] == SC_ERR_TIMEOUT);
    CHECK(strstr(mm_message[o], "communicator 'fails'") != NULL);
    CHECK(strstr(mm_message[o], "did not finish within the timeout of 500 ms") != NULL);
    for (int r = 0; r < N; r++)
        if (r == f ? mm_status[r] != SC_ERR_COMM : mm_status[r] != SC_ERR_TIMEOUT)
            fprintf(stderr, "rank %d: %s: %s\n", r, sc_status_name(mm_status[r]), mm_message[r]);
    if (strcmp(mm_message[f], want) != 0)
        fprintf(stderr, "rank %d\n  got:  %s\n  want: %s\n", f, mm_message[f], want);
    /* the failed rank's layer: its communicator is aborted, which its next forward says */
    sc_view x, out;
    REQUIRE(sc_buffer_view(mm[f].w[6], 0, 3 * H, &x) == SC_OK);
    REQUIRE(sc_buffer_view(mm[f].w[7], 0, 3 * H, &out) == SC_OK);
    CHECK(sc_moe_forward(SC_DEFAULT_STREAM, mm[f].layer, x, out, NULL) == SC_ERR_COMM);
    CHECK(strstr(sc_last_error(), "communicator 'fails'") != NULL &&
          strstr(sc_last_error(), "was aborted") != NULL);
    end_pair();
    sc_set_log_callback(NULL, NULL);
}

int main(void)
{
    comm_td_attach();
    open_contexts(N);
    world(N, 0);
    /* The kernels are compiled with NVRTC: without it, nothing here can run. */
    {
        rank_layer r0;
        sc_moe_desc d = rank_desc(ctxs[0], &r0, comms[0], E / N);
        sc_moe layer;
        sc_status s = sc_moe_create(ctxs[0], &d, &layer);
        free_rank(&r0);
        if (s == SC_ERR_NO_COMPILER) {
            printf("test_td_moe_ep: skipped: %s\n", sc_last_error());
            end_world(N);
            close_contexts(N);
            return 77;
        }
        REQUIRE(s == SC_OK);
        CHECK_OK(sc_moe_destroy(layer));
    }
    const int misuse0 = fake.misuse_count();
    test_create_refusals();
    test_forward_refusals();
    test_forwards(5, 3);
    test_forwards(0, 4);
    test_ranks_that_disagree();
    test_rank_fails_after_exchange();
    CHECK(fake.misuse_count() == misuse0);
    if (fake.misuse_count() != misuse0)
        fprintf(stderr, "last misuse: %s\n", fake.last_misuse());
    end_world(N);
    close_contexts(N);
    CHECK(fake.live_device_allocations() == 0);
    return test_result("test_td_moe_ep");
}
