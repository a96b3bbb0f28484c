/* The MoE layer's plans: kernels, tile shapes, workspace, and the decisions of a forward
 * over T tokens, as pure functions (see plan.h). */
#include <string.h>

#include "../../kernels/moe/moe_config.cuh"
#include "moe/plan.h"

#define MOE_CU "moe/moe.cu"
#define SM90_CU "moe/moe_sm90a.cu"
#define BOTH SC_MOE_BACKEND_AUTO
#define MMA SC_MOE_BACKEND_MMA
#define SM90 SC_MOE_BACKEND_SM90

const sci_moe_kernel_info sci_moe_kernels[SCI_MOE_K_COUNT] = {
    [SCI_MOE_K_ROUTER] = {MOE_CU, "sc_moe_router_gemm", BOTH, SC_MOE_SMEM_BYTES},
    [SCI_MOE_K_TOPK] = {MOE_CU, "sc_moe_topk", BOTH, 0},
    [SCI_MOE_K_OFFSETS] = {MOE_CU, "sc_moe_offsets", BOTH, 0},
    [SCI_MOE_K_SCATTER] = {MOE_CU, "sc_moe_scatter", BOTH, 0}, /* SM90: fp8 layers */
    [SCI_MOE_K_COMBINE] = {MOE_CU, "sc_moe_combine", BOTH, 0},
    [SCI_MOE_K_W13] = {MOE_CU, "sc_moe_gemm_w13", MMA, SC_MOE_SMEM_BYTES},
    [SCI_MOE_K_W2] = {MOE_CU, "sc_moe_gemm_w2", MMA, SC_MOE_SMEM_BYTES},
    [SCI_MOE_K_SCATTER_GATHER] = {MOE_CU, "sc_moe_scatter_gather", SM90, 0},
    [SCI_MOE_K_ROUTE_SMALL] = {MOE_CU, "sc_moe_route_small", BOTH, 0},
    [SCI_MOE_K_GATHER] = {MOE_CU, "sc_moe_gather", SM90, 0},
    [SCI_MOE_K_GATHER_FP8] = {MOE_CU, "sc_moe_gather_fp8", SM90, 0},
    [SCI_MOE_K_COUNT_IDS] = {MOE_CU, "sc_moe_count_ids", BOTH, 0},
    [SCI_MOE_K_GATHER_Q] = {MOE_CU, "sc_moe_gather_q", SM90, 0}, /* expert parallel, fp8 */
    [SCI_MOE_K_GATE_SMALL] = {MOE_CU, "sc_moe_gate_small", BOTH, 0},
/* the kernels' names for weights at an unaligned offset: e4m3's _ks twins, bf16's own */
#define SHIFTED_NAME_BF16 ""
#define SHIFTED_NAME_E4M3 "_ks"
#define TILE_KERNELS(ID, NAME, PREC, CONS, BN, STAGES, A_BOX, CTAS, SPLIT)                         \
    [SCI_MOE_K_W13_##ID] = {SM90_CU, "sc_moe_w13_sm90_" #NAME, SM90,                      \
                            SC_MOE_SM90_SMEM(CONS, BN, STAGES, SPLIT)},                          \
    [SCI_MOE_K_W2_##ID] = {SM90_CU, "sc_moe_w2_sm90_" #NAME, SM90,                        \
                           SC_MOE_SM90_SMEM(CONS, BN, STAGES, SPLIT)},                           \
    [SCI_MOE_K_W13S_##ID] = {SM90_CU, "sc_moe_w13_sm90_" #NAME SHIFTED_NAME_##PREC, SM90,        \
                             SC_MOE_SM90_SMEM(CONS, BN, STAGES, SPLIT)},                         \
    [SCI_MOE_K_W2S_##ID] = {SM90_CU, "sc_moe_w2_sm90_" #NAME SHIFTED_NAME_##PREC, SM90,          \
                            SC_MOE_SM90_SMEM(CONS, BN, STAGES, SPLIT)},
    SC_MOE_SM90_TILES(TILE_KERNELS)
#undef TILE_KERNELS
};

#define PREC_FP8_BF16 false
#define PREC_FP8_E4M3 true
#define TILE_INFO(ID, NAME, PREC, CONS, BN, STAGES, A_BOX, CTAS, SPLIT)                     \
    [SCI_MOE_TILE_##ID] = {PREC_FP8_##PREC, CONS, BN, STAGES, A_BOX, CTAS, SPLIT,          \
                           PREC_FP8_##PREC ? SC_MOE_FP8_BLOCK : (BN) / 2,                 \
                           SCI_MOE_K_W13_##ID, SCI_MOE_K_W2_##ID, SCI_MOE_K_W13S_##ID,    \
                           SCI_MOE_K_W2S_##ID, #NAME,                                     \
                           "w13 gemm (sm90 " #NAME ")", "w2 gemm (sm90 " #NAME ")",     \
                           "w13 gemm (sm90 " #NAME ", K shift)",                          \
                           "w2 gemm (sm90 " #NAME ", K shift)",                           \
                           !PREC_FP8_##PREC ||                                            \
                               SC_MOE_FP8_W13_PASSES(BN, SPLIT) <= SC_MOE_FP8_SHIFT_MAX_PASSES},
const sci_moe_tile_info sci_moe_tiles[SCI_MOE_N_TILES] = {SC_MOE_SM90_TILES(TILE_INFO)};
#undef TILE_INFO

const sci_moe_ws_info sci_moe_workspace[SCI_MOE_W_COUNT] = {
    [SCI_MOE_W_LOGITS] = {SC_F32, "moe router logits", false},
    [SCI_MOE_W_IDS] = {SC_I32, "moe expert ids", false},
    [SCI_MOE_W_WEIGHTS] = {SC_F32, "moe routing weights", false},
    [SCI_MOE_W_COUNTS] = {SC_I32, "moe expert counts", false},
    [SCI_MOE_W_ROW_OFF] = {SC_I32, "moe row offsets", false},
    [SCI_MOE_W_TILE_OFF] = {SC_I32, "moe tile offsets", false},
    [SCI_MOE_W_CURSOR] = {SC_I32, "moe cursors", false},
    [SCI_MOE_W_PERM_TOKEN] = {SC_I32, "moe permuted tokens", false},
    [SCI_MOE_W_PERM_WEIGHT] = {SC_F32, "moe permuted weights", false},
    [SCI_MOE_W_POS] = {SC_I32, "moe positions", false},
    [SCI_MOE_W_H] = {SC_BF16, "moe h", true}, /* (SM90: the rows' padding stays 0) */
    [SCI_MOE_W_Y] = {SC_BF16, "moe y", false},
    [SCI_MOE_W_NO_BIAS] = {SC_F32, "moe no bias", false},
    [SCI_MOE_W_XPERM] = {SC_BF16, "moe x in expert order", true},
    [SCI_MOE_W_TICKET] = {SC_U32, "moe route ticket", true}, /* sc_moe_route_small resets it */
    [SCI_MOE_W_SHARED_W] = {SC_F32, "moe shared expert weights", false},
    [SCI_MOE_W_XQ] = {SC_F8E4M3, "moe x in expert order (fp8)", true}, /* (padding: 0) */
    [SCI_MOE_W_XS] = {SC_F32, "moe x scales", false},
    [SCI_MOE_W_HQ] = {SC_F8E4M3, "moe h (fp8)", true}, /* (padding: 0) */
    [SCI_MOE_W_HS] = {SC_F32, "moe h scales", false},
    [SCI_MOE_W_TP_PART] = {SC_BF16, "moe partial output (tensor parallel)", false},
};

int sci_moe_tile_named(const char *name)
{
    int tile = -1;
    for (int t = 0; t < SCI_MOE_N_TILES && name; t++)
        if (strcmp(name, sci_moe_tiles[t].name) == 0)
            tile = t;
    return tile;
}

static uint32_t ceil_div(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

/* Rows of router logits for up to `tokens` tokens: the split router keeps one [T, E] slice
 * per split of H. */
static uint64_t logit_rows(uint64_t tokens)
{
    uint64_t split_tokens = tokens < SC_MOE_ROUTER_SPLIT_MAX_T ? tokens : SC_MOE_ROUTER_SPLIT_MAX_T;
    uint64_t split_rows = split_tokens * SC_MOE_ROUTER_MAX_SPLIT;
    return tokens > split_rows ? tokens : split_rows;
}

void sci_moe_workspace_counts(const sci_moe_config *c, uint64_t tokens,
                              uint64_t count[SCI_MOE_W_COUNT])
{
    const uint64_t k = (uint64_t)c->top_k, G = (uint64_t)c->groups;
    const uint64_t H = (uint64_t)c->hidden, I = (uint64_t)c->intermediate;
    const uint64_t rows = tokens * (uint64_t)c->slots;
    count[SCI_MOE_W_LOGITS] = logit_rows(tokens) * (uint64_t)c->logit_cols;
    count[SCI_MOE_W_IDS] = tokens * k;
    count[SCI_MOE_W_WEIGHTS] = tokens * k;
    count[SCI_MOE_W_COUNTS] = G;
    count[SCI_MOE_W_ROW_OFF] = G + 1;
    count[SCI_MOE_W_TILE_OFF] = G + 1;
    count[SCI_MOE_W_CURSOR] = G;
    count[SCI_MOE_W_PERM_TOKEN] = rows;
    count[SCI_MOE_W_PERM_WEIGHT] = rows;
    count[SCI_MOE_W_POS] = rows;
    const bool sm90 = c->backend == SC_MOE_BACKEND_SM90;
    const uint64_t pad = sci_moe_a_pad(c); /* SM90: A's rows (see moe_config) */
    count[SCI_MOE_W_H] = c->fp8 ? 0 : rows * (I + pad);
    count[SCI_MOE_W_Y] = rows * H;
    count[SCI_MOE_W_NO_BIAS] = 1;
    count[SCI_MOE_W_XPERM] = sm90 && !c->fp8 ? rows * (H + pad) : 0;
    count[SCI_MOE_W_TICKET] = 1;
    count[SCI_MOE_W_SHARED_W] = tokens;
    /* fp8: x and h in e4m3 with one f32 scale per row per 128 channels */
    count[SCI_MOE_W_XQ] = c->fp8 ? rows * (H + pad) : 0;
    count[SCI_MOE_W_XS] = c->fp8 ? rows * (H / SC_MOE_FP8_BLOCK) : 0;
    count[SCI_MOE_W_HQ] = c->fp8 ? rows * (I + pad) : 0;
    count[SCI_MOE_W_HS] = c->fp8 ? rows * (I / SC_MOE_FP8_BLOCK) : 0;
    count[SCI_MOE_W_TP_PART] = c->tp_scatter ? tokens * H : 0;
    if (c->route_only) /* routing alone: nothing for the GEMMs */
        count[SCI_MOE_W_H] = count[SCI_MOE_W_Y] = count[SCI_MOE_W_XPERM] = count[SCI_MOE_W_XQ] =
            count[SCI_MOE_W_XS] = count[SCI_MOE_W_HQ] = count[SCI_MOE_W_HS] = 0;
}

uint64_t sci_moe_workspace_bytes_for(const sci_moe_config *c, uint64_t tokens)
{
    uint64_t count[SCI_MOE_W_COUNT], bytes = 0;
    sci_moe_workspace_counts(c, tokens, count);
    for (int i = 0; i < SCI_MOE_W_COUNT; i++)
        bytes += count[i] * sc_dtype_size(sci_moe_workspace[i].dtype);
    return bytes;
}

uint64_t sci_moe_workspace_grow(uint64_t capacity, uint64_t T)
{
    if (T <= capacity)
        return 0;
    return capacity * 2 > T ? capacity * 2 : T;
}

bool sci_moe_tokens_fit(const sci_moe_config *c, uint64_t T)
{
    const int E = c->groups, k = c->slots, H = c->hidden, I = c->intermediate;
    return !(T * (uint64_t)k / SC_MOE_BM + (uint64_t)E > 2000000000ull ||
             T > 0x7fffffffull / k || T * (uint64_t)k * (uint64_t)(H > I ? H : I) > (1ull << 46));
}

static sc_launch_desc launch(uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                             uint32_t threads, uint32_t shared_bytes, bool pdl)
{
    return (sc_launch_desc){.grid = {grid_x, grid_y, grid_z}, .block = {threads, 1, 1},
                            .shared_bytes = shared_bytes, .programmatic = pdl};
}

/* The router GEMM for more tokens splits H while its output tiles leave SMs idle: splits
 * of whole K steps, at least SC_MOE_ROUTER_MIN_K columns each. */
static void plan_router(const sci_moe_config *c, uint64_t E, sci_moe_plan *p)
{
    const uint64_t T = p->tokens, H = (uint64_t)c->hidden;
    const uint64_t router_tiles = (uint64_t)ceil_div(T, SC_MOE_BM) * ceil_div(E, SC_MOE_BN);
    uint64_t splits = 1;
    if (T <= SC_MOE_ROUTER_SPLIT_MAX_T) {
        splits = (uint64_t)c->sm_count / router_tiles;
        if (splits > SC_MOE_ROUTER_MAX_SPLIT)
            splits = SC_MOE_ROUTER_MAX_SPLIT;
        if (splits > H / SC_MOE_ROUTER_MIN_K)
            splits = H / SC_MOE_ROUTER_MIN_K;
        if (splits < 1)
            splits = 1;
    }
    const uint64_t k_chunk = ((uint64_t)ceil_div(H, splits) + SC_MOE_BK - 1) / SC_MOE_BK *
                             SC_MOE_BK;
    splits = ceil_div(H, k_chunk);
    p->router_splits = (int)splits;
    p->router_k_chunk = (int)k_chunk;
    p->router = launch(ceil_div(T, SC_MOE_BM), ceil_div(E, SC_MOE_BN), (uint32_t)splits,
                       SC_MOE_THREADS, SC_MOE_SMEM_BYTES, p->pdl);
}

/* Routing: for few tokens one launch (logits, top-k, offsets, permutation, and on SM90 x
 * in expert order while it is small, else a gather after it); for more, a fill of the
 * expert counts, the router GEMM, top-k, offsets and the scatter (with the gather of x on
 * SM90). */
static void plan_routing(const sci_moe_config *c, bool caller, sci_moe_plan *p)
{
    const uint64_t T = p->tokens, rows = p->rows;
    const bool sm90 = c->backend == SC_MOE_BACKEND_SM90, pdl = p->pdl;
    const sc_launch_desc warp_per_row = launch(ceil_div(rows, SC_MOE_SCATTER_WARPS), 1, 1,
                                               32 * SC_MOE_SCATTER_WARPS, 0, pdl);
    /* fp8 experts: x is gathered and quantized by its own kernel after the permutation */
    const sc_launch_desc gather_fp8 =
        launch(ceil_div(rows * ((uint64_t)c->hidden / SC_MOE_FP8_BLOCK), SC_MOE_GATHER_FP8_WARPS),
               1, 1, 32 * SC_MOE_GATHER_FP8_WARPS, 0, pdl);
    if (T <= SC_MOE_ROUTE_SMALL_MAX_T && !caller) {
        p->route_small = true;
        p->route_gathers = sm90 && !c->fp8 && !c->route_only &&
                           rows * (uint64_t)c->hidden * 2 <= SC_MOE_ROUTE_GATHER_MAX_BYTES;
        p->route = launch(ceil_div((uint64_t)c->logit_cols, SC_MOE_ROUTE_EXPERTS), 1, 1,
                          SC_MOE_ROUTE_THREADS, 0, pdl);
        if (sm90 && !p->route_gathers && !c->route_only)
            p->gather = c->fp8 ? gather_fp8 : warp_per_row;
        return;
    }
    if (caller) {
        /* The gate's logits alone (one column), when there is a gate, computed as the
         * layer's own routing computes its gate column (the same bits): for few tokens as
         * sc_moe_route_small does, else by the router GEMM split over H as for all the
         * columns, launched over the one column tile. */
        if (c->logit_cols > c->experts && T <= SC_MOE_ROUTE_SMALL_MAX_T) {
            p->gate_small = launch(1, 1, 1, SC_MOE_ROUTE_THREADS, 0, pdl);
        } else if (c->logit_cols > c->experts) {
            plan_router(c, (uint64_t)c->logit_cols, p);
            p->router.grid.y = 1;
        }
        p->count_ids = launch(ceil_div(T, 256), 1, 1, 256, 0, pdl);
    } else {
        plan_router(c, (uint64_t)c->logit_cols, p);
        p->topk = launch(ceil_div(T, SC_MOE_TOPK_TOKENS_PER_BLOCK), 1, 1,
                         32 * SC_MOE_TOPK_TOKENS_PER_BLOCK, 0, pdl);
    }
    p->offsets = launch(1, 1, 1, (uint32_t)(c->groups + 31) / 32 * 32, 0, pdl);
    p->scatter = sm90 && !c->fp8 ? warp_per_row : launch(ceil_div(rows, 256), 1, 1, 256, 0, pdl);
    if (c->fp8)
        p->gather = gather_fp8;
}

/* The tile shape of the SM90 GEMMs for T tokens: the small tile while the average expert
 * gets few rows (decode), where weight streaming decides, the large one otherwise. */
static int sm90_tile_for(const sci_moe_config *c, uint64_t T)
{
    /* SAFECUDA_MOE_TILE: a tile of the layer's precision (another precision's is ignored) */
    if (c->tile_override >= 0 && c->tile_override < SCI_MOE_N_TILES &&
        sci_moe_tiles[c->tile_override].fp8 == c->fp8)
        return c->tile_override;
    uint64_t rows_per_expert = T * (uint64_t)c->top_k / (uint64_t)c->experts;
    if (rows_per_expert <= SC_MOE_SM90_SMALL_MAX_ROWS && c->fp8) {
        const uint64_t slots = T * (uint64_t)c->top_k, E = (uint64_t)c->experts;
        const uint64_t tiles = ((slots < E ? slots : E) + (uint64_t)c->shared) *
                               ((uint64_t)c->intermediate / SC_MOE_FP8_BLOCK);
        /* Measured on the H100 (docs/BENCHMARKS.md): two CTAs per tile while the tiles
         * would not fill the SMs; the narrow tile (two CTAs per SM) up to
         * SC_MOE_FP8_NARROW_MAX_TILES tiles; the small one (deeper stages per CTA) for more. */
        if (tiles < (uint64_t)c->sm_count)
            return SCI_MOE_TILE_FP8_SPLIT;
        return tiles < SC_MOE_FP8_NARROW_MAX_TILES ? SCI_MOE_TILE_FP8_NARROW
                                                   : SCI_MOE_TILE_FP8_SMALL;
    }
    if (rows_per_expert <= SC_MOE_SM90_SMALL_MAX_ROWS)
        return SCI_MOE_TILE_SMALL;
    return c->fp8 ? SCI_MOE_TILE_FP8_LARGE : SCI_MOE_TILE_LARGE;
}

/* M tiles per group of the SM90 schedule for A rows of K elements (bf16 or e4m3) in tiles
 * of bm rows. */
static int sm90_group_m(const sci_moe_config *c, int bm, int K)
{
    if (c->group_override > 0)
        return c->group_override;
    uint64_t g = SC_MOE_SM90_GROUP_BYTES / ((uint64_t)bm * (uint64_t)K * (c->fp8 ? 1 : 2));
    return g < 1 ? 1 : g > SC_MOE_SM90_GROUP_M_MAX ? SC_MOE_SM90_GROUP_M_MAX : (int)g;
}

/* SM90: persistent grids of at most ctas_per_sm CTAs per SM over the M tiles (each
 * expert's rows in tiles of bm, at most one partial tile per expert) times the N tiles. */
static void plan_sm90(const sci_moe_config *c, sci_moe_plan *p)
{
    const int t = sm90_tile_for(c, p->tokens);
    const sci_moe_tile_info *ts = &sci_moe_tiles[t];
    const int cons = ts->cons, bn = ts->bn, bm = 64 * cons;
    const uint32_t max_ctas = (uint32_t)c->sm_count * (uint32_t)ts->ctas_per_sm;
    const uint64_t m_tiles = p->rows / (uint64_t)bm + (uint64_t)c->groups;
    const uint64_t tiles13 = m_tiles * ceil_div((uint64_t)c->intermediate, (uint64_t)ts->cols13);
    const uint64_t tiles2 = m_tiles * ceil_div((uint64_t)c->hidden, (uint64_t)bn);
    const uint32_t threads = (uint32_t)(128 * (cons + 1));
    const uint32_t smem = (uint32_t)sci_moe_kernels[ts->k13].smem;
    p->tile = t;
    p->k13 = ts->k13;
    p->k2 = ts->k2;
    p->step13 = ts->step13;
    p->step2 = ts->step2;
    /* W13: clusters of `split` CTAs, each cluster a tile at a time */
    const uint32_t split = (uint32_t)ts->split, clusters = max_ctas / split;
    p->w13 = launch((uint32_t)(tiles13 < clusters ? tiles13 : clusters) * split, 1, 1, threads,
                    smem, p->pdl);
    if (split > 1)
        p->w13.cluster = (sc_dim3){split, 1, 1};
    p->w2 = launch((uint32_t)(tiles2 < max_ctas ? tiles2 : max_ctas), 1, 1, threads, smem,
                   p->pdl);
    p->group_m13 = sm90_group_m(c, bm, c->hidden);
    p->group_m2 = sm90_group_m(c, bm, c->intermediate);
}

/* MMA: a grid over every possible M tile (each expert's rows in tiles of SC_MOE_BM) times
 * the N tiles; tiles past an expert's rows exit. */
static void plan_mma(const sci_moe_config *c, sci_moe_plan *p)
{
    const uint32_t max_m_tiles = ceil_div(p->rows, SC_MOE_BM) + (uint32_t)c->groups;
    p->k13 = SCI_MOE_K_W13;
    p->k2 = SCI_MOE_K_W2;
    p->step13 = "w13 gemm (mma)";
    p->step2 = "w2 gemm (mma)";
    p->w13 = launch(max_m_tiles, ceil_div((uint64_t)c->intermediate, SC_MOE_BN / 2), 1,
                    SC_MOE_THREADS, SC_MOE_SMEM_BYTES, p->pdl);
    p->w2 = launch(max_m_tiles, ceil_div((uint64_t)c->hidden, SC_MOE_BN), 1, SC_MOE_THREADS,
                   SC_MOE_SMEM_BYTES, p->pdl);
}

void sci_moe_plan_make(const sci_moe_config *c, uint64_t T, bool caller, sci_moe_plan *p)
{
    /* For few tokens (decode) every kernel of the forward is a programmatic dependent
     * launch: each waits (griddepcontrol.wait) before it touches memory, so its launch
     * overlaps the tail of the kernel before it, microseconds that matter when the whole
     * forward takes tens of them. SAFECUDA_MOE_PDL=0 turns it off (for comparisons). */
    const bool pdl = T <= SC_MOE_PDL_MAX_T && c->pdl;
    *p = (sci_moe_plan){.tokens = T, .rows = T * (uint64_t)c->slots, .pdl = pdl, .tile = -1,
                        .workspace_bytes = sci_moe_workspace_bytes_for(c, T)};
    plan_routing(c, caller, p);
    if (c->backend == SC_MOE_BACKEND_SM90)
        plan_sm90(c, p);
    else
        plan_mma(c, p);
    p->combine = launch((uint32_t)T, 1, 1, SC_MOE_COMBINE_THREADS, 0, pdl);
}
