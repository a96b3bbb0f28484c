/* The MoE layer's expert parallelism (sc_moe_desc.ep_comm): a forward on rank r routes its
 * own T tokens over all E experts, finds for each token the other ranks holding its chosen
 * experts (kernels/moe/ep.cu: plan), packs each token once per such rank with its routing
 * over that rank's experts (pack), exchanges the packets over the communicator, runs the
 * rank's experts' layer over its own tokens and the rows it received (the own tokens first:
 * they alone get the shared expert), sends those rows back and sums each token's rows in
 * rank order (combine).
 *
 * Normal mode exchanges the counts first and reads them on the host (a wait) to send
 * exactly the rows needed; low-latency mode sends packets of ep_max_tokens rows (the rows
 * not used carry no expert: ids -1), so nothing waits and a capture records it all.
 *
 * Rows: the own tokens' [T, .] buffers (routing ids and weights, pos [T, N]); the packets
 * (send_x, send_ids, send_w and back, the same layout: rank d's packet from row off(d));
 * the experts' input and output (in_x, in_ids, in_w, in_out: the own T rows, then the rows
 * received from each other rank in rank order). With fp8 experts the packets carry e4m3
 * rows and their per-128-channel scales instead of bf16 rows (send_xq, send_xs, in_xq,
 * in_xs), quantized by the layer's own rule. Each group grows when a forward needs more
 * (stream-ordered, as the layer's workspace does).
 *
 * The first forward all-gathers each rank's description of its layer and compares them
 * (agree()): ranks made with different descs all fail there, before any exchange that
 * could not match. A failure after the first exchange aborts the communicator, so that the
 * other ranks' exchanges end with its error instead of waiting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/moe/moe_config.cuh"
#include "launch/builtin.h"
#include "memory/buffer.h"
#include "moe/ep.h"
#include "moe/issue.h"
#include "moe/tp.h"
#include "stream/capture.h"
#include "stream/stream.h"

#define EP_CU "moe/ep.cu"

typedef enum ep_buf {
    B_IDS, B_W, B_POS,                       /* per own token: k, k, N */
    B_SEND_X, B_SEND_IDS, B_SEND_W, B_SEND_XQ, B_SEND_XS, B_BACK, /* per packet row: H (not
                                             * with fp8 experts), k, k, H and H/128 (fp8), H */
    B_IN_X, B_IN_IDS, B_IN_W, B_IN_XQ, B_IN_XS, B_IN_OUT, /* per experts' row, likewise (x:
                                             * bf16 always, the shared gate reads it) */
    B_COUNTS,                                /* [2N]: sent to each rank, received from each */
    B_MAP,                                   /* [2E]: each expert's rank, its index there */
    B_AGREE,                                 /* [N x AGREE_FIELDS]: every rank's layer, once */
    B_COUNT
} ep_buf;

/* What the ranks' layers must agree on, checked by the first forward (agree()). */
enum { AGREE_FIELDS = 12 };
static const char *const agree_names[AGREE_FIELDS] = {
    "the layer kind", "experts", "top_k", "hidden", "intermediate", "shared_intermediate",
    "expert_dtype", "ep_mode", "ep_max_tokens", "the expert map (ep_owner)",
    "the routing (scoring, renormalize, n_group, topk_group)",
    "the experts' activation and w13_layout"};

static const struct {
    sc_dtype dtype;
    const char *label;
} ep_bufs[B_COUNT] = {
    [B_IDS] = {SC_I32, "moe ep routing ids"},      [B_W] = {SC_F32, "moe ep routing weights"},
    [B_POS] = {SC_I32, "moe ep packet rows"},      [B_SEND_X] = {SC_BF16, "moe ep packets"},
    [B_SEND_IDS] = {SC_I32, "moe ep packet ids"},  [B_SEND_W] = {SC_F32, "moe ep packet weights"},
    [B_SEND_XQ] = {SC_F8E4M3, "moe ep packets (fp8)"},
    [B_SEND_XS] = {SC_F32, "moe ep packets' scales"},
    [B_IN_XQ] = {SC_F8E4M3, "moe ep experts' input (fp8)"},
    [B_IN_XS] = {SC_F32, "moe ep experts' input scales"},
    [B_BACK] = {SC_BF16, "moe ep returned rows"},  [B_IN_X] = {SC_BF16, "moe ep experts' input"},
    [B_IN_IDS] = {SC_I32, "moe ep experts' ids"},  [B_IN_W] = {SC_F32, "moe ep experts' weights"},
    [B_IN_OUT] = {SC_BF16, "moe ep experts' output"}, [B_COUNTS] = {SC_I32, "moe ep counts"},
    [B_MAP] = {SC_I32, "moe ep expert map"},
    [B_AGREE] = {SC_I64, "moe ep layers' descriptions"},
};

enum { K_PLAN, K_PACK, K_COMBINE, K_COUNT };
static const char *const ep_kernel_names[K_COUNT] = {"sc_moe_ep_plan", "sc_moe_ep_pack",
                                                     "sc_moe_ep_combine"};

typedef struct sci_moe_ep {
    int64_t agree[AGREE_FIELDS]; /* this rank's layer, as the first forward compares it */
    bool agreed;                 /* the ranks' layers were found the same */
    sc_comm comm;
    int rank, nranks;
    int slab;          /* low-latency: rows per packet (ep_max_tokens); 0: normal mode */
    int local_experts; /* E_r */
    sci_moe *experts;  /* the layer over the rank's experts */
    sc_kernel kernels[K_COUNT];
    pthread_mutex_t lock; /* the buffers */
    sc_buffer buf[B_COUNT];
    uint64_t cap[3]; /* rows of each group: own tokens, packets, experts' rows */
} sci_moe_ep;

/* The groups of buffers that grow together, and each buffer's elements per row. */
static const struct {
    ep_buf first, last;
} groups[3] = {{B_IDS, B_POS}, {B_SEND_X, B_BACK}, {B_IN_X, B_IN_OUT}};
_Static_assert(B_SEND_X == B_POS + 1 && B_IN_X == B_BACK + 1 && B_COUNTS == B_IN_OUT + 1,
               "each group's buffers one after the other");

static uint64_t per_row(const sci_moe *m, ep_buf b)
{
    const uint64_t k = (uint64_t)m->desc.top_k, H = (uint64_t)m->desc.hidden;
    const bool fp8 = m->ep->experts->cfg.fp8; /* the dispatch sends e4m3 rows and scales */
    switch (b) {
    case B_POS: return (uint64_t)m->ep->nranks;
    case B_SEND_X: return fp8 ? 0 : H;
    case B_SEND_XQ: case B_IN_XQ: return fp8 ? H : 0;
    case B_SEND_XS: case B_IN_XS: return fp8 ? H / SC_MOE_FP8_BLOCK : 0;
    case B_BACK: case B_IN_X: case B_IN_OUT: return H;
    default: return k;
    }
}

static sc_status make_buffer(sci_moe *m, ep_buf b, uint64_t count, sc_stream stream,
                             const char *fn)
{
    sc_status s = sc_buffer_create_at((sc_context){m->ctx->obj.id},
                                      &(sc_buffer_desc){.dtype = ep_bufs[b].dtype,
                                                        .count = count ? count : 1,
                                                        .label = ep_bufs[b].label,
                                                        .stream = stream},
                                      &m->ep->buf[b], __FILE__, __LINE__);
    if (s == SC_OK)
        sci_buffer_set_internal(m->ep->buf[b]);
    else
        sci_error_append(" (in %s: the %s of an expert-parallel layer)", fn, ep_bufs[b].label);
    return s;
}

static sc_status drop_buffer(sci_moe_ep *ep, ep_buf b, const char *fn)
{
    sc_status s = ep->buf[b].id ? sci_buffer_destroy(ep->buf[b].id, fn) : SC_OK;
    ep->buf[b].id = 0;
    return s;
}

/* Group g with room for `rows` rows (grown to at least twice its capacity). */
static sc_status grow(sci_moe *m, int g, uint64_t rows, sc_stream stream, const char *fn)
{
    sci_moe_ep *ep = m->ep;
    if (rows <= ep->cap[g] && ep->buf[groups[g].first].id)
        return SC_OK;
    const uint64_t want = rows > 2 * ep->cap[g] ? rows : 2 * ep->cap[g];
    sc_status s = SC_OK;
    for (int b = groups[g].first; b <= (int)groups[g].last && s == SC_OK; b++)
        s = drop_buffer(ep, (ep_buf)b, fn);
    ep->cap[g] = 0;
    for (int b = groups[g].first; b <= (int)groups[g].last && s == SC_OK; b++)
        s = make_buffer(m, (ep_buf)b, want * per_row(m, (ep_buf)b), stream, fn);
    if (s == SC_OK)
        ep->cap[g] = want;
    return s;
}

/* ---- create and free ------------------------------------------------------------------- */

/* The expert map from desc->ep_owner (or contiguous blocks): map[e] the rank, map[E + e] the
 * index among that rank's experts; the rank's count of experts. */
static sc_status expert_map(const sc_moe_desc *d, int rank, int N, const char *fn, int32_t *map,
                            int *local)
{
    const int E = d->experts;
    if (!d->ep_owner && E % N)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->experts = %d is not a multiple of desc->ep_comm's %d ranks: give "
                        "desc->ep_owner (each expert's rank) to split them otherwise",
                        E, N);
    int n[SC_MOE_EP_MAX_RANKS] = {0};
    for (int e = 0; e < E; e++) {
        const int r = d->ep_owner ? d->ep_owner[e] : e / (E / N);
        if (r < 0 || r >= N)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->ep_owner[%d] = %d: each expert's rank is 0 .. %d "
                            "(desc->ep_comm's ranks)",
                            e, r, N - 1);
        map[e] = r;
        map[E + e] = n[r]++;
    }
    for (int r = 0; r < N; r++)
        if (n[r] == 0)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->ep_owner gives rank %d no expert: every rank of "
                            "desc->ep_comm holds one or more",
                            r);
    *local = n[rank];
    return SC_OK;
}

/* The communicator: of this context, 2 .. SC_MOE_EP_MAX_RANKS ranks; not with tp_comm. */
static sc_status check_comm(const sc_moe_desc *d, const sci_context *c, const char *fn,
                            int *rank, int *nranks)
{
    if (d->tp_comm.id)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->tp_comm and desc->ep_comm are both given: a layer is tensor- or "
                        "expert-parallel, not both");
    if ((unsigned)d->ep_mode > SC_MOE_EP_LOW_LATENCY)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->ep_mode = %d: SC_MOE_EP_NORMAL (0) or SC_MOE_EP_LOW_LATENCY (1)",
                        (int)d->ep_mode);
    if (d->ep_mode == SC_MOE_EP_LOW_LATENCY && (d->ep_max_tokens < 1 || d->ep_max_tokens > 65536))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->ep_max_tokens = %d: a low-latency expert-parallel layer takes "
                        "1 .. 65536 (the most tokens a rank's forward takes)",
                        d->ep_max_tokens);
    if (d->ep_mode == SC_MOE_EP_NORMAL && d->ep_max_tokens)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->ep_max_tokens = %d is for SC_MOE_EP_LOW_LATENCY (the normal mode "
                        "sends exact counts: leave it 0)",
                        d->ep_max_tokens);
    return sci_moe_comm_check(d->ep_comm, "ep_comm", "an expert-parallel", SC_MOE_EP_MAX_RANKS,
                              c, fn, rank, nranks);
}

sc_status sci_moe_ep_make(sci_context *c, const sc_moe_desc *desc, const char *fn, sci_moe **out)
{
    *out = NULL;
    int rank = 0, N = 0;
    sc_status s = check_comm(desc, c, fn, &rank, &N);
    if (s != SC_OK)
        return s;
    const int E = desc->experts;
    int32_t *map = malloc(2 * (size_t)E * sizeof *map);
    if (!map)
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    int local = 0;
    if ((s = expert_map(desc, rank, N, fn, map, &local)) != SC_OK) {
        free(map);
        return s;
    }
    const int slab = desc->ep_mode == SC_MOE_EP_LOW_LATENCY ? desc->ep_max_tokens : 0;
    /* The routing over all E experts: the router and its biases, nothing of the experts. */
    sc_moe_desc rd = *desc;
    rd.w13 = rd.w2 = (sc_buffer){0};
    rd.w13_view = rd.w2_view = rd.w13_bias = rd.w2_bias = (sc_view){{0}, 0, 0};
    rd.w13_scale = rd.w2_scale = rd.shared_w13_scale = rd.shared_w2_scale = rd.w13_bias;
    rd.shared_w13 = rd.shared_w2 = rd.shared_gate = rd.w13_bias;
    rd.shared_intermediate = 0;
    rd.expert_dtype = SC_BF16;
    rd.ep_comm = (sc_comm){0};
    rd.ep_owner = NULL;
    rd.max_tokens = slab ? (uint64_t)slab : desc->max_tokens;
    const unsigned rflags = SCI_MOE_MAKE_ROUTE_ONLY |
                            (desc->shared_intermediate && desc->shared_gate.buffer.id
                                 ? SCI_MOE_MAKE_GATE_COLUMN
                                 : 0u);
    /* The routing's weights checked first, then the rank's experts' layer (its weights
     * checked before any kernel is compiled), then the routing's layer. */
    sc_moe_desc rc = rd;
    sc_view rwt[SCI_MOE_WT_COUNT];
    if ((s = sci_moe_check_desc(&rc, rflags, fn)) != SC_OK ||
        (s = sci_moe_check_weights(&rc, c, rflags, fn, rwt)) != SC_OK) {
        free(map);
        return s;
    }
    /* The rank's experts: its weights, the shared expert, the routing given to it. */
    sc_moe_desc xd = *desc;
    xd.experts = local;
    xd.router = (sc_buffer){0};
    xd.router_view = rwt[SCI_MOE_WT_ROUTER]; /* its first E_r rows: never read */
    xd.router_view.count = (uint64_t)local * (uint64_t)desc->hidden;
    xd.selection_bias = (sc_buffer){0};
    xd.selection_bias_view = xd.router_bias = (sc_view){{0}, 0, 0};
    xd.n_group = xd.topk_group = 0;
    xd.routed_scaling = 1.f;
    xd.ep_comm = (sc_comm){0};
    xd.ep_owner = NULL;
    xd.ep_mode = SC_MOE_EP_NORMAL;
    xd.ep_max_tokens = 0;
    xd.max_tokens = slab ? (uint64_t)slab * (uint64_t)N : 0;
    xd.label = NULL;
    sci_moe *experts = NULL, *m = NULL;
    if ((s = sci_moe_make(c, &xd, SCI_MOE_MAKE_EP_EXPERTS, fn, &experts)) != SC_OK) {
        sci_error_append(" (an expert-parallel layer's w13, w2, their biases and scales hold "
                         "its rank's experts: rank %d of %d holds %d of the %d)",
                         rank, N, local, E);
        free(map);
        return s;
    }
    sci_moe_ep *ep = NULL;
    if ((s = sci_moe_make(c, &rd, rflags, fn, &m)) != SC_OK ||
        !(ep = calloc(1, sizeof *ep))) {
        if (s == SC_OK)
            s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
        sci_moe_free_quietly(experts, fn);
        sci_moe_free_quietly(m, fn);
        free(map);
        return s;
    }
    pthread_mutex_init(&ep->lock, NULL);
    m->ep = ep;
    ep->comm = desc->ep_comm;
    ep->rank = rank;
    ep->nranks = N;
    ep->slab = slab;
    ep->local_experts = local;
    ep->experts = experts;
    for (int i = 0; i < K_COUNT && s == SC_OK; i++)
        s = sci_builtin_kernel(c, EP_CU, ep_kernel_names[i], fn, &ep->kernels[i]);
    if (s == SC_OK && (s = make_buffer(m, B_COUNTS, 2 * (uint64_t)N, SC_DEFAULT_STREAM, fn)) ==
                          SC_OK &&
        (s = make_buffer(m, B_AGREE, (uint64_t)N * AGREE_FIELDS, SC_DEFAULT_STREAM, fn)) ==
            SC_OK &&
        (s = make_buffer(m, B_MAP, 2 * (uint64_t)E, SC_DEFAULT_STREAM, fn)) == SC_OK)
        s = sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(ep->buf[B_MAP]), map,
                              2 * (uint64_t)E * sizeof *map);
    if (s == SC_OK) {
        uint64_t h = 1469598103934665603ull; /* FNV-1a of each expert's rank */
        for (int e = 0; e < E; e++)
            h = (h ^ (uint64_t)map[e]) * 1099511628211ull;
        const int64_t fields[AGREE_FIELDS] = {
            0x4550, E, desc->top_k, desc->hidden, desc->intermediate,
            desc->shared_intermediate, (int64_t)ep->experts->cfg.fp8, desc->ep_mode, slab,
            (int64_t)(h >> 1), (int64_t)desc->scoring | (int64_t)desc->renormalize << 4 |
                                   (int64_t)desc->n_group << 8 | (int64_t)desc->topk_group << 16,
            (int64_t)desc->activation | (int64_t)desc->w13_layout << 4};
        memcpy(ep->agree, fields, sizeof fields);
    }
    free(map);
    /* room for max_tokens (low-latency: ep_max_tokens, all it will take) */
    const uint64_t T0 = slab ? (uint64_t)slab : desc->max_tokens ? desc->max_tokens : 256;
    if (s == SC_OK)
        s = sci_moe_ep_reserve(m, SC_DEFAULT_STREAM, T0, fn);
    if (s != SC_OK) {
        sci_moe_free_quietly(m, fn);
        return s;
    }
    *out = m;
    return SC_OK;
}

sc_status sci_moe_ep_free(sci_moe *m, const char *fn)
{
    sci_moe_ep *ep = m->ep;
    sc_status s = ep->experts ? sci_moe_free(ep->experts, fn) : SC_OK;
    for (int b = 0; b < B_COUNT; b++) {
        sc_status f = drop_buffer(ep, (ep_buf)b, fn);
        if (s == SC_OK)
            s = f;
    }
    pthread_mutex_destroy(&ep->lock);
    free(ep);
    m->ep = NULL;
    return s;
}

/* Rows of the packets and of the experts' input for forwards of up to T own tokens: in
 * low-latency mode all they will ever need; in normal mode a guess (each token sent to at
 * most min(k, N - 1) ranks; as many received as sent), grown when a forward needs more. */
static void rows_for(const sci_moe *m, uint64_t T, uint64_t *send, uint64_t *in)
{
    const sci_moe_ep *ep = m->ep;
    const uint64_t N = (uint64_t)ep->nranks, k = (uint64_t)m->desc.top_k;
    if (ep->slab) {
        *send = N * (uint64_t)ep->slab;
        *in = T + (N - 1) * (uint64_t)ep->slab;
    } else {
        *send = T * (k < N - 1 ? k : N - 1);
        *in = T + *send;
    }
}

sc_status sci_moe_ep_reserve(sci_moe *m, sc_stream stream, uint64_t max_tokens, const char *fn)
{
    sci_moe_ep *ep = m->ep;
    if (ep->slab && max_tokens > (uint64_t)ep->slab)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "max_tokens = %llu: a low-latency expert-parallel layer takes up to "
                        "desc->ep_max_tokens = %d tokens per forward",
                        (unsigned long long)max_tokens, ep->slab);
    if (max_tokens == 0 || !sci_moe_tokens_fit(&m->cfg, max_tokens))
        return SC_OK; /* (sc_moe_reserve's own check refuses it next) */
    uint64_t send, in;
    rows_for(m, ep->slab ? (uint64_t)ep->slab : max_tokens, &send, &in);
    pthread_mutex_lock(&ep->lock);
    sc_status s = grow(m, 0, ep->slab ? (uint64_t)ep->slab : max_tokens, stream, fn);
    if (s == SC_OK)
        s = grow(m, 1, send, stream, fn);
    if (s == SC_OK)
        s = grow(m, 2, in, stream, fn);
    pthread_mutex_unlock(&ep->lock);
    if (s == SC_OK)
        s = sci_moe_reserve_run(ep->experts, stream, in, fn);
    return s;
}

void sci_moe_ep_describe(const sci_moe *m, char *buf, size_t size)
{
    const sci_moe_ep *ep = m->ep;
    const sci_moe *x = ep->experts;
    snprintf(buf, size,
             "E=%d k=%d H=%d I=%d shared %d, expert parallel, rank %d of %d: %d experts, %s",
             m->desc.experts, m->desc.top_k, m->desc.hidden, x->desc.intermediate,
             x->desc.shared_intermediate, ep->rank, ep->nranks, ep->local_experts,
             ep->slab ? "low-lat." : "normal");
}

uint64_t sci_moe_ep_workspace_bytes(sci_moe *m)
{
    sci_moe_ep *ep = m->ep;
    uint64_t total = sci_moe_workspace_total(ep->experts);
    pthread_mutex_lock(&ep->lock);
    for (int b = 0; b < B_COUNT; b++) {
        sc_buffer_props p;
        if (ep->buf[b].id && sc_buffer_info(ep->buf[b], &p) == SC_OK)
            total += p.bytes;
    }
    pthread_mutex_unlock(&ep->lock);
    return total;
}

/* ---- the forward ------------------------------------------------------------------------- */

static sc_view part(sc_buffer b, uint64_t offset, uint64_t count)
{
    return (sc_view){b, offset, count};
}

/* SC_ERR_CAPTURE (naming `what`) when stream, the forward's, is capturing. */
static sc_status refuse_capture(const sci_moe *m, sc_stream stream, const char *what,
                                const char *fn)
{
    sci_stream *st = NULL;
    sc_status s = sci_stream_resolve(stream, m->ctx, fn, &st);
    if (s != SC_OK)
        return s;
    s = sci_capture_refuse_stream(st, fn, what);
    sci_stream_release(st);
    return s;
}

/* Before anything is enqueued: the communicator alive; no option the layer does not take;
 * T within a low-latency layer's packets; a normal-mode forward not in a capture. */
static sc_status ready(const sci_moe *m, sc_stream stream, const sc_moe_forward_desc *opts,
                       uint64_t T, const char *fn)
{
    const sci_moe_ep *ep = m->ep;
    sci_comm *cm = NULL;
    sc_status s = sci_moe_comm_acquire(ep->comm, "ep_comm", fn, &cm);
    if (s != SC_OK)
        return s;
    sci_registry_release(&cm->obj);
    if (opts && opts->check_routing)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "opts->check_routing: an expert-parallel layer's forward takes no "
                        "routing check (sc_moe_routing_check after it reports a bad id)");
    if (sci_comm_group_open())
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "an expert-parallel forward inside sc_comm_group_begin / _end: its "
                        "exchanges depend on each other (counts, then rows, then rows back), "
                        "so it runs from a thread (or process) per GPU, not in a group");
    if (ep->slab && T > (uint64_t)ep->slab)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "x holds T = %llu tokens: this low-latency expert-parallel layer takes up "
                        "to desc->ep_max_tokens = %d per forward",
                        (unsigned long long)T, ep->slab);
    if (!ep->slab || (opts && opts->profile))
        return refuse_capture(m, stream,
                              !ep->slab ? "a normal-mode expert-parallel forward, which reads "
                                          "the ranks' token counts on the host "
                                          "(SC_MOE_EP_LOW_LATENCY is captured whole),"
                                        : "a profiled forward (it waits for the stream)",
                              fn);
    return SC_OK;
}

/* The exchange of rows: to each other rank d, n_send[d] rows of the send buffers from row
 * send_row[d]; from each other rank p, n_recv[p] rows into the receive buffers from row
 * recv_row[p] (rows of `width` elements: x's H, the routing's k). */
typedef struct exchange {
    uint64_t n_send[SC_MOE_EP_MAX_RANKS], send_row[SC_MOE_EP_MAX_RANKS];
    uint64_t n_recv[SC_MOE_EP_MAX_RANKS], recv_row[SC_MOE_EP_MAX_RANKS];
} exchange;

static sc_status all_to_all_rows(const sci_moe_ep *ep, sc_stream stream, sc_buffer dst,
                                 sc_buffer src, uint64_t width, const exchange *x,
                                 bool back)
{
    uint64_t sc[SC_MOE_EP_MAX_RANKS], so[SC_MOE_EP_MAX_RANKS];
    uint64_t rc[SC_MOE_EP_MAX_RANKS], ro[SC_MOE_EP_MAX_RANKS];
    for (int p = 0; p < ep->nranks; p++) {
        /* back: the received rows go back where they came from */
        sc[p] = (back ? x->n_recv[p] : x->n_send[p]) * width;
        so[p] = (back ? x->recv_row[p] : x->send_row[p]) * width;
        rc[p] = (back ? x->n_send[p] : x->n_recv[p]) * width;
        ro[p] = (back ? x->send_row[p] : x->recv_row[p]) * width;
    }
    return sc_comm_all_to_all_v(ep->comm, stream, sc_view_of(dst), rc, ro, sc_view_of(src), sc,
                                so);
}

/* Wait for stream (the forward's; SC_DEFAULT_STREAM: the layer's context's). */
static sc_status wait_stream(const sci_moe *m, sc_stream stream, const char *fn)
{
    sci_stream *st = NULL;
    sc_status s = sci_stream_resolve(stream, m->ctx, fn, &st);
    if (s != SC_OK)
        return s;
    const sc_stream h = {st->obj.id};
    sci_stream_release(st);
    return sc_stream_synchronize(h);
}

/* The rows each rank pair exchanges: low-latency, whole packets; normal, the counts the
 * ranks sent each other (read on the host: a wait), the buffers grown to hold them. */
static sc_status plan_exchange(sci_moe *m, sc_stream stream, uint64_t T, exchange *x,
                               uint64_t *in_rows, bool *exchanged, const char *fn)
{
    sci_moe_ep *ep = m->ep;
    const int N = ep->nranks, r = ep->rank;
    uint64_t sent = 0, received = 0;
    int32_t counts[2 * SC_MOE_EP_MAX_RANKS] = {0};
    sc_status s = SC_OK;
    if (!ep->slab) {
        /* (the stream is waited for before the copy, which then reads what the exchange
         * wrote wherever the copy would run) */
        *exchanged = true;
        if ((s = sc_comm_all_to_all(ep->comm, stream,
                                    part(ep->buf[B_COUNTS], (uint64_t)N, (uint64_t)N),
                                    part(ep->buf[B_COUNTS], 0, (uint64_t)N))) != SC_OK ||
            (s = wait_stream(m, stream, fn)) != SC_OK ||
            (s = sc_copy_to_host(stream, counts, 2 * (uint64_t)N * sizeof counts[0],
                                 sc_view_of(ep->buf[B_COUNTS]))) != SC_OK)
            return s;
    }
    for (int p = 0; p < N; p++) {
        const uint64_t slab = (uint64_t)ep->slab;
        x->n_send[p] = p == r ? 0 : slab ? slab : (uint64_t)counts[p];
        x->n_recv[p] = p == r ? 0 : slab ? slab : (uint64_t)counts[N + p];
        if (counts[p] < 0 || counts[N + p] < 0 || (!slab && counts[N + p] > 0x7fffffff / 2))
            return sci_fail(SC_ERR_COMM, fn,
                            "rank %d's token counts came back as %d sent to and %d received "
                            "from rank %d: the ranks' layers disagree (the same forwards on "
                            "every rank?)",
                            r, counts[p], counts[N + p], p);
        x->send_row[p] = slab ? (uint64_t)p * slab : sent;
        x->recv_row[p] = T + received;
        sent += x->n_send[p];
        received += x->n_recv[p];
    }
    *in_rows = T + received;
    if (!ep->slab && ((s = grow(m, 1, sent, stream, fn)) != SC_OK ||
                      (s = grow(m, 2, T + received, stream, fn)) != SC_OK))
        return s;
    return SC_OK;
}

/* The experts' input rows to the rank's experts' layer, their rows back out, the sum. */
static sc_status issue(sci_moe *m, sc_stream stream, sc_view x, sc_view out, sc_view ids,
                       sc_view w, uint64_t T, bool accumulate, sci_moe_steps *st,
                       bool *exchanged, const char *fn)
{
    sci_moe_ep *ep = m->ep;
    const int N = ep->nranks, k = m->desc.top_k, E = m->desc.experts, H = m->desc.hidden;
    const int32_t zero = 0, none = -1;
    const bool fp8 = ep->experts->cfg.fp8;
    sc_buffer *b = ep->buf;
    const uint64_t pairs = T * (uint64_t)N;
    const sc_launch_desc one_block = {.grid = {1, 1, 1}, .block = {SC_MOE_EP_PLAN_THREADS, 1, 1}};
    const sc_launch_desc per_pair = {
        .grid = {(uint32_t)((pairs + SC_MOE_EP_PACK_WARPS - 1) / SC_MOE_EP_PACK_WARPS), 1, 1},
        .block = {32 * SC_MOE_EP_PACK_WARPS, 1, 1}};
    const sc_launch_desc per_token = {.grid = {(uint32_t)T, 1, 1},
                                      .block = {SC_MOE_EP_COMBINE_THREADS, 1, 1}};
    sc_status s;
    /* destinations and packet rows (counts zeroed first: the plan writes them all, but a
     * failure in between must not leave the last forward's; with no tokens they stay 0) */
    if ((s = sci_moe_step(st, ep->slab ? "ep plan + pack" : "ep plan + counts + pack")) !=
            SC_OK ||
        (s = sc_fill(stream, sc_view_of(b[B_COUNTS]), &zero)) != SC_OK ||
        (T > 0 && (s = SC_LAUNCH(stream, ep->kernels[K_PLAN], &one_block,
                       sc_arg_in(ids), sc_arg_in(sc_view_of(b[B_MAP])),
                       sc_arg_out(part(b[B_POS], 0, T * (uint64_t)N)),
                       sc_arg_out(part(b[B_COUNTS], 0, (uint64_t)N)),
                       sc_arg_inout(sc_view_of(m->fault)), sc_arg_i32((int32_t)T),
                       sc_arg_i32(k), sc_arg_i32(E), sc_arg_i32(N), sc_arg_i32(ep->rank))) != SC_OK))
        return s;
    exchange xc;
    uint64_t R = 0;
    if ((s = plan_exchange(m, stream, T, &xc, &R, exchanged, fn)) != SC_OK)
        return s;
    /* low-latency: the packets' unused rows carry no expert */
    if (ep->slab && (s = sc_fill(stream, sc_view_of(b[B_SEND_IDS]), &none)) != SC_OK)
        return s;
    if (T > 0 && (s = SC_LAUNCH(stream, ep->kernels[K_PACK], &per_pair,
                       sc_arg_in(x), sc_arg_in(ids), sc_arg_in(w), sc_arg_in(sc_view_of(b[B_MAP])),
                       sc_arg_in(part(b[B_POS], 0, pairs)),
                       sc_arg_in(part(b[B_COUNTS], 0, (uint64_t)N)),
                       sc_arg_out(sc_view_of(b[B_SEND_X])), sc_arg_out(sc_view_of(b[B_SEND_IDS])),
                       sc_arg_out(sc_view_of(b[B_SEND_W])), sc_arg_out(sc_view_of(b[B_SEND_XQ])),
                       sc_arg_out(sc_view_of(b[B_SEND_XS])), sc_arg_out(sc_view_of(b[B_IN_X])),
                       sc_arg_out(sc_view_of(b[B_IN_IDS])), sc_arg_out(sc_view_of(b[B_IN_W])),
                       sc_arg_out(sc_view_of(b[B_IN_XQ])), sc_arg_out(sc_view_of(b[B_IN_XS])),
                       sc_arg_i32((int32_t)T), sc_arg_i32(k), sc_arg_i32(E), sc_arg_i32(N),
                       sc_arg_i32(H), sc_arg_i32(ep->slab), sc_arg_i32(ep->rank),
                       sc_arg_i32(fp8))) != SC_OK)
        return s;
    /* dispatch: the packets' rows, ids and weights, in one group */
    if ((s = sci_moe_step(st, "ep dispatch (all-to-all)")) != SC_OK)
        return s;
    *exchanged = true;
    sc_status g = sc_comm_group_begin();
    if (g != SC_OK)
        return g;
    if (fp8) { /* e4m3 rows and their scales: half the bytes */
        s = all_to_all_rows(ep, stream, b[B_IN_XQ], b[B_SEND_XQ], (uint64_t)H, &xc, false);
        if (s == SC_OK)
            s = all_to_all_rows(ep, stream, b[B_IN_XS], b[B_SEND_XS],
                                (uint64_t)H / SC_MOE_FP8_BLOCK, &xc, false);
    } else {
        s = all_to_all_rows(ep, stream, b[B_IN_X], b[B_SEND_X], (uint64_t)H, &xc, false);
    }
    if (s == SC_OK)
        s = all_to_all_rows(ep, stream, b[B_IN_IDS], b[B_SEND_IDS], (uint64_t)k, &xc, false);
    if (s == SC_OK)
        s = all_to_all_rows(ep, stream, b[B_IN_W], b[B_SEND_W], (uint64_t)k, &xc, false);
    g = sc_comm_group_end();
    if (s == SC_OK)
        s = g;
    if (s != SC_OK) {
        sci_error_append(" (the dispatch of an expert-parallel layer's tokens over desc->ep_comm)");
        return s;
    }
    /* the rank's experts over its own tokens (the shared expert's) and those received */
    const sc_moe_forward_desc xo = {.routing_ids = part(b[B_IN_IDS], 0, R * (uint64_t)k),
                                    .routing_weights = part(b[B_IN_W], 0, R * (uint64_t)k)};
    if ((s = sci_moe_step(st, "ep the rank's experts")) != SC_OK)
        return s;
    const sc_view xq = fp8 ? part(b[B_IN_XQ], 0, R * (uint64_t)H) : (sc_view){{0}, 0, 0};
    const sc_view xs = fp8 ? part(b[B_IN_XS], 0, R * (uint64_t)H / SC_MOE_FP8_BLOCK)
                           : (sc_view){{0}, 0, 0};
    if (R > 0 && (s = sci_moe_run(ep->experts, stream, part(b[B_IN_X], 0, R * (uint64_t)H),
                                  part(b[B_IN_OUT], 0, R * (uint64_t)H), &xo, T, xq, xs,
                                  fn)) != SC_OK)
        return s;
    /* combine: the rows back to their ranks, then each token's sum */
    if ((s = sci_moe_step(st, "ep return (all-to-all)")) != SC_OK)
        return s;
    if ((s = all_to_all_rows(ep, stream, b[B_BACK], b[B_IN_OUT], (uint64_t)H, &xc, true)) !=
        SC_OK) {
        sci_error_append(" (the return of an expert-parallel layer's rows over desc->ep_comm)");
        return s;
    }
    if (T == 0)
        return SC_OK;
    if ((s = sci_moe_step(st, "ep combine")) != SC_OK)
        return s;
    return SC_LAUNCH(stream, ep->kernels[K_COMBINE], &per_token,
                     sc_arg_in(part(b[B_IN_OUT], 0, T * (uint64_t)H)),
                     sc_arg_in(sc_view_of(b[B_BACK])), sc_arg_in(part(b[B_POS], 0, pairs)),
                     sc_arg_in(part(b[B_COUNTS], 0, (uint64_t)N)),
                     accumulate ? sc_arg_inout(out) : sc_arg_out(out), sc_arg_i32((int32_t)T),
                     sc_arg_i32(N), sc_arg_i32(H), sc_arg_i32(ep->slab),
                     sc_arg_i32(accumulate));
}

/* A failure after the forward's first exchange: the other ranks' exchanges would wait for
 * this rank's, so the communicator is aborted (they return its error, within its timeout;
 * the message being reported stays the caller's, with a note). */
static void abort_exchange(const sci_moe_ep *ep, const char *fn)
{
    char *message = sci_error_save();
    sci_comm *c = NULL;
    if (sci_comm_acquire(ep->comm, fn, &c) == SC_OK) {
        sci_comm_lock_device(c->ctx->device);
        sci_comm_abort_locked(c, SC_ERR_COMM, true,
                              "an expert-parallel layer's forward failed on this rank after "
                              "its first exchange (the other ranks' would wait for it)");
        sci_comm_unlock_device(c->ctx->device);
        sci_comm_release(c);
    }
    sci_error_restore(message);
    sci_error_append(" (desc->ep_comm was aborted: the other ranks' forwards return an error)");
}

/* The first forward: every rank's layer description gathered (a collective, then a host
 * wait), compared with this rank's; ranks that disagree (a desc that differs, a mode, an
 * expert map) all find it and all return the error, before any exchange that could not
 * match. Not in a capture (the first forward runs eagerly). */
static sc_status agree(sci_moe *m, sc_stream stream, bool *exchanged, const char *fn)
{
    sci_moe_ep *ep = m->ep;
    const int N = ep->nranks;
    sc_status s = refuse_capture(m, stream,
                                 "an expert-parallel layer's first forward, which checks that "
                                 "the ranks' layers agree (a host wait; run one forward before "
                                 "capturing),",
                                 fn);
    if (s != SC_OK)
        return s;
    int64_t all[SC_MOE_EP_MAX_RANKS * AGREE_FIELDS];
    const sc_view mine = part(ep->buf[B_AGREE], (uint64_t)ep->rank * AGREE_FIELDS, AGREE_FIELDS);
    *exchanged = true;
    if ((s = sc_copy_from_host(stream, mine, ep->agree, sizeof ep->agree)) != SC_OK ||
        (s = sc_comm_all_gather(ep->comm, stream, sc_view_of(ep->buf[B_AGREE]), mine)) != SC_OK ||
        (s = wait_stream(m, stream, fn)) != SC_OK ||
        (s = sc_copy_to_host(stream, all, (uint64_t)N * sizeof ep->agree,
                             sc_view_of(ep->buf[B_AGREE]))) != SC_OK)
        return s;
    for (int r = 0; r < N; r++)
        for (int f = 0; f < AGREE_FIELDS; f++)
            if (all[r * AGREE_FIELDS + f] != ep->agree[f]) {
                *exchanged = false; /* every rank found it: none waits for another */
                return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                                "rank %d's expert-parallel layer differs from rank %d's (this "
                                "one) in %s (%lld, here %lld): every rank makes its layer with "
                                "the same desc but for its experts' weights",
                                r, ep->rank, agree_names[f],
                                (long long)all[r * AGREE_FIELDS + f], (long long)ep->agree[f]);
            }
    ep->agreed = true;
    return SC_OK;
}

/* A rank with no tokens this step: x and out both empty views (bf16, of the layer's
 * context); it still takes part in the exchanges. SC_ERR_NOT_READY (no message) when x is
 * not empty: the ordinary checks follow. */
static sc_status check_empty(const sci_moe *m, sc_view x, sc_view out, const char *fn,
                             sc_view *xv, sc_view *ov)
{
    sc_buffer_props xp, op;
    sc_status s;
    if ((s = sc_buffer_view(x.buffer, x.offset, x.count, xv)) != SC_OK)
        return s;
    if (xv->count != 0)
        return SC_ERR_NOT_READY;
    if ((s = sc_buffer_view(out.buffer, out.offset, out.count, ov)) != SC_OK ||
        (s = sc_buffer_info(x.buffer, &xp)) != SC_OK ||
        (s = sc_buffer_info(out.buffer, &op)) != SC_OK)
        return s;
    if (xp.context.id != m->ctx->obj.id || op.context.id != m->ctx->obj.id)
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                        "%s (buffer '%s', created at %s:%d) belongs to another context than the "
                        "layer",
                        xp.context.id != m->ctx->obj.id ? "x" : "out",
                        xp.context.id != m->ctx->obj.id ? xp.label : op.label,
                        xp.context.id != m->ctx->obj.id ? xp.file : op.file,
                        xp.context.id != m->ctx->obj.id ? xp.line : op.line);
    if (xp.dtype != SC_BF16 || op.dtype != SC_BF16)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn, "%s is %s; it must be bf16",
                        xp.dtype != SC_BF16 ? "x" : "out",
                        sc_dtype_name(xp.dtype != SC_BF16 ? xp.dtype : op.dtype));
    if (ov->count != 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "x is empty (T = 0: a rank with no tokens this step) and out has %llu "
                        "elements: both must be T x H",
                        (unsigned long long)ov->count);
    return SC_OK;
}

sc_status sci_moe_ep_forward(sci_moe *m, sc_stream stream, sc_view x, sc_view out,
                             const sc_moe_forward_desc *opts, const char *fn)
{
    sci_moe_ep *ep = m->ep;
    sc_view xv, ov, rids, rw;
    uint64_t T = 0;
    sc_status s;
    s = check_empty(m, x, out, fn, &xv, &ov);
    if (s == SC_ERR_NOT_READY) /* x is not empty */
        s = sci_moe_check_io(m, x, out, fn, &xv, &ov, &T);
    if (s != SC_OK || (s = sci_moe_check_opts(m, opts, T, fn, &rids, &rw)) != SC_OK ||
        (s = ready(m, stream, opts, T, fn)) != SC_OK)
        return s;
    const uint64_t k = (uint64_t)m->desc.top_k;
    pthread_mutex_lock(&ep->lock);
    if (T > ep->cap[0]) { /* normal mode only: low-latency layers have room for ep_max_tokens */
        uint64_t send, in;
        rows_for(m, T, &send, &in);
        if ((s = grow(m, 0, T, stream, fn)) == SC_OK && (s = grow(m, 1, send, stream, fn)) == SC_OK)
            s = grow(m, 2, in, stream, fn);
    }
    /* the first forward: the ranks' layers compared before anything else is enqueued */
    bool exchanged = false;
    if (s == SC_OK && !ep->agreed)
        s = agree(m, stream, &exchanged, fn);
    sci_moe_steps st = {opts ? opts->profile : NULL, stream, {m->ctx->obj.id}, {{0}}, 0};
    const bool caller = rids.buffer.id != 0;
    const sc_view ids = caller ? rids : part(ep->buf[B_IDS], 0, T * k);
    const sc_view w = caller ? rw : part(ep->buf[B_W], 0, T * k);
    if (s == SC_OK && !caller && T > 0 && (s = sci_moe_step(&st, "ep routing")) == SC_OK)
        s = sci_moe_route_run(m, stream, xv, ids, w, fn);
    if (s == SC_OK && T > 0 && opts && opts->expert_ids.buffer.id &&
        !sci_moe_same_view(opts->expert_ids, ids))
        s = sc_copy(stream, opts->expert_ids, ids);
    if (s == SC_OK && T > 0 && opts && opts->expert_weights.buffer.id &&
        !sci_moe_same_view(opts->expert_weights, w))
        s = sc_copy(stream, opts->expert_weights, w);
    if (s == SC_OK)
        s = issue(m, stream, xv, ov, ids, w, T, opts && opts->accumulate, &st, &exchanged, fn);
    if (s != SC_OK && exchanged)
        abort_exchange(ep, fn);
    pthread_mutex_unlock(&ep->lock);
    s = sci_moe_steps_finish(&st, s);
    if (s != SC_OK && strncmp(sc_last_error(), fn, strlen(fn)) != 0)
        sci_error_append(" (in %s)", fn);
    return s;
}
