/* Tuning parameters of the MoE kernels, shared by the kernels (CUDA C++) and the host code
 * that launches them (C): change them here and nowhere else.
 *
 * The grouped GEMMs use BM x BN output tiles, stepping BK along K through STAGES
 * shared-memory buffers filled by cp.async; 8 warps each own a 64 x 32 sub-tile computed
 * with mma.sync m16n8k16 (bf16 in, fp32 accumulate). */
#ifndef SC_MOE_CONFIG_CUH
#define SC_MOE_CONFIG_CUH

#define SC_MOE_BM 128      /* rows (tokens) per tile */
#define SC_MOE_BN 128      /* columns per tile; W13 tiles hold BN/2 gate + BN/2 up columns */
#define SC_MOE_BK 32       /* K step per pipeline stage */
#define SC_MOE_STAGES 4    /* cp.async pipeline depth */
#define SC_MOE_THREADS 256 /* 8 warps: 2 along M x 4 along N */
#define SC_MOE_SMEM_BYTES (SC_MOE_STAGES * (SC_MOE_BM + SC_MOE_BN) * SC_MOE_BK * 2)

#define SC_MOE_MAX_EXPERTS 512 /* routed experts (as include/safecuda/moe.h says) */
#define SC_MOE_MAX_SHARED 16  /* shared-expert chunks of size I */
#define SC_MOE_MAX_GROUPS (SC_MOE_MAX_EXPERTS + SC_MOE_MAX_SHARED) /* experts in the GEMMs */
#define SC_MOE_MAX_TOPK 16
#define SC_MOE_ALIGN 8         /* H and I must be multiples of this (16-byte rows) */

#define SC_MOE_TOPK_TOKENS_PER_BLOCK 8 /* one warp per token */
#define SC_MOE_SCATTER_WARPS 8         /* scatter + gather: one warp per (token, slot) */

/* Expert parallelism (ep.cu): up to MAX_RANKS ranks (a token's ranks are a bit mask); the
 * plan is one block of PLAN_THREADS; the packing runs one warp per (token, rank) pair,
 * PACK_WARPS per block; the combine one block of COMBINE_THREADS per token. */
#define SC_MOE_EP_MAX_RANKS 32
#define SC_MOE_EP_PLAN_THREADS 1024
#define SC_MOE_EP_PACK_WARPS 8
#define SC_MOE_EP_COMBINE_THREADS 128

/* Up to this many tokens the forward's kernels are programmatic dependent launches. */
#define SC_MOE_PDL_MAX_T 64

/* Routing for few tokens in one launch (sc_moe_route_small): up to MAX_T tokens; a block
 * of THREADS threads computes the logits of EXPERTS experts for all of them (TOKENS >=
 * MAX_T), then the last block to finish routes; it gathers x into expert order itself up to
 * GATHER_MAX_BYTES, a separate launch does it above. */
#define SC_MOE_ROUTE_SMALL_MAX_T 16
#define SC_MOE_ROUTE_TOKENS 16
#define SC_MOE_ROUTE_EXPERTS 2
#define SC_MOE_ROUTE_THREADS 256
#define SC_MOE_ROUTE_GATHER_MAX_BYTES (256 * 1024)
/* The router GEMM for more tokens splits H over up to MAX_SPLIT blocks (each at least
 * MIN_K columns) while there are fewer output tiles than SMs, up to SPLIT_MAX_T tokens. */
#define SC_MOE_ROUTER_MAX_SPLIT 16
#define SC_MOE_ROUTER_MIN_K 256
#define SC_MOE_ROUTER_SPLIT_MAX_T 2048
#if SC_MOE_ROUTE_TOKENS < SC_MOE_ROUTE_SMALL_MAX_T
#error "sc_moe_route_small computes the logits of all its tokens in one pass"
#endif

/* The sm_90 grouped GEMMs (moe_sm90a.cu): CONS consumer warpgroups of 64 rows each (BM =
 * 64 CONS), BN rows of B per pipeline stage (for W13: BN/2 gate + BN/2 up rows, so BN/2
 * columns of h), 128 bytes of K per stage (64 bf16 or 128 e4m3) through STAGES TMA stages;
 * GROUP_M M tiles share each N tile. An fp8 W13 tile covers 128 columns of h (one block of
 * h's per-128 scales), split over the SPLIT CTAs of a cluster and passes over K, so that
 * its epilogue sees a whole block. */
/* GROUP_M: M tiles that share each N tile, chosen so that their A rows (GROUP_M x BM x K
 * bytes) stay within GROUP_BYTES of L2 while the N tiles sweep past, 1 .. GROUP_M_MAX. */
#define SC_MOE_SM90_GROUP_BYTES (16u << 20)
#define SC_MOE_SM90_GROUP_M_MAX 16
/* The tile shapes: one line each, the one list that generates the kernels (moe_sm90a.cu),
 * the host's kernel and tile tables (src/moe/plan.c) and their enums (plan.h).
 *   X(ID, name, precision, CONS, BN, STAGES, A_BOX, CTAS_PER_SM, SPLIT)
 * ID names the enums (SCI_MOE_TILE_ID, SCI_MOE_K_W13_ID, SCI_MOE_K_W2_ID); name is the
 * kernels' suffix and what SAFECUDA_MOE_TILE says; precision BF16 or E4M3; A_BOX: rows of A
 * per copy (only the boxes holding rows are copied); SPLIT: CTAs of a cluster that share
 * one fp8 W13 tile's 128 columns of h (each computes 128 / SPLIT of them in 128 / SPLIT /
 * (BN/2) passes, and the cluster exchanges the rows' largest magnitudes through
 * distributed shared memory before quantizing h); 1 for bf16. large is for prefill, small
 * streams weights for decode, medium and wide are for tuning comparisons; fp8_split is the
 * fp8 decode tile when the W13 tiles would not fill the SMs (twice the CTAs per tile);
 * fp8_narrow (BN 64, four passes, two CTAs per SM) is the fp8 decode tile up to
 * SC_MOE_FP8_NARROW_MAX_TILES W13 tiles, fp8_small beyond (DeepSeek-V3 sizes). */
#define SC_MOE_SM90_TILES(X)                                                                \
    X(LARGE, large, BF16, 2, 256, 4, 64, 1, 1)                                              \
    X(SMALL, small, BF16, 1, 64, 4, 8, 3, 1)                                                \
    X(MEDIUM, medium, BF16, 2, 128, 6, 64, 1, 1)                                            \
    X(WIDE, wide, BF16, 1, 256, 5, 16, 1, 1)                                                \
    X(FP8_LARGE, fp8_large, E4M3, 2, 128, 6, 64, 1, 1)                                      \
    X(FP8_SMALL, fp8_small, E4M3, 1, 128, 8, 8, 1, 1)                                       \
    X(FP8_SPLIT, fp8_split, E4M3, 1, 128, 8, 8, 1, 2)                                       \
    X(FP8_NARROW, fp8_narrow, E4M3, 1, 64, 6, 8, 2, 1)
/* Rows per expert (T k / E on average) up to which the small tiles are used. fp8: the
 * cluster-split tile while the W13 tiles of the experts a forward can use (min(T k, E) + the
 * shared chunks, times I / 128) are fewer than the SMs. */
#define SC_MOE_SM90_SMALL_MAX_ROWS 24
/* SM90: the GEMMs' A rows in the workspace (x in expert order, h) are 128 bytes longer than
 * H or I (SC_MOE_SM90_A_PAD bf16 or SC_MOE_SM90_A_PAD_FP8 e4m3 elements), their data from
 * column kshift of the weight they multiply on: the K shift then starts every box of A and
 * B 128-byte aligned. bf16's padding stays zero (it meets B's zeros); e4m3 never multiplies
 * its padding. */
#define SC_MOE_SM90_A_PAD 64
#define SC_MOE_SM90_A_PAD_FP8 128
#define SC_MOE_FP8_NARROW_MAX_TILES 2048
/* Dynamic shared memory: 1024 bytes of alignment slack, the ring, its barriers, the row
 * and tile offsets, and (fp8 W13 split over a cluster) the rows' largest magnitudes and
 * the two barriers of their exchange. */
#define SC_MOE_SM90_SMEM(CONS, BN, STAGES, SPLIT)                                         \
    (1024 + (STAGES) * ((CONS) * 64 * 128 + (BN) * 128) + 2 * (STAGES) * 8 +              \
     2 * (SC_MOE_MAX_GROUPS + 1) * 4 + ((SPLIT) > 1 ? (CONS) * 64 * 4 + 32 : 0))
/* fp8 experts: 128 x 128 weight blocks, activations scaled per row per 128 channels. */
#define SC_MOE_FP8_BLOCK 128
/* An fp8 W13 tile's passes over K (its 128 columns of h over the cluster's SPLIT CTAs, BN/2
 * per pass), and the most passes whose kernels take the K shift (more keep h in registers
 * across the passes and have none to spare: those read unaligned weights unshifted). */
#define SC_MOE_FP8_W13_PASSES(BN, SPLIT) (SC_MOE_FP8_BLOCK / (SPLIT) / ((BN) / 2))
#define SC_MOE_FP8_SHIFT_MAX_PASSES 2
#define SC_MOE_GATHER_FP8_WARPS 8 /* x gathered and quantized: a warp per row and 128 */
#define SC_MOE_COMBINE_THREADS 256

/* The routing's parameters: one kernel argument (by value) of the routing kernels. */
typedef struct sc_moe_route_params {
    int T, E, k;       /* tokens, routed experts, routed slots per token */
    int shared;        /* S: shared-expert chunks, slots k .. k + S - 1 of every token */
    int logit_cols;    /* columns of the logits: E, or E + 1 with a shared gate (column E) */
    int splits;        /* the router's K slices to add */
    int sigmoid, renormalize, has_sel_bias, has_router_bias, has_gate;
    int n_group, topk_group; /* group-limited selection when topk_group < n_group */
    float scale;       /* routed scaling */
} sc_moe_route_params;

/* The expert GEMMs' parameters (by value). Groups 0 .. E - 1 are the routed experts,
 * E .. groups - 1 the shared expert's chunks of I columns. */
typedef struct sc_moe_expert_params {
    int E, groups, H, I;
    int group_m;       /* SM90: M tiles that share each N tile */
    int interleaved;   /* W13 rows gate, up, gate, ... (else all gate rows, then all up) */
    int act;           /* sc_moe_activation */
    float alpha, limit;
    int has_bias;      /* the routed experts' W13 and W2 biases */
    int kshift;        /* routed weights: K starts this many elements before the copies'
                          boxes (the weight view's misalignment within 128 bytes), so that
                          every box starts 128-byte aligned; A's rows hold their data from
                          this column on (SC_MOE_SM90_A_PAD, _FP8) */
    int rows_cap;      /* fp8: rows of the workspace (the row scales' stride) */
    int out_ld, out_off; /* SM90 W13: h's row stride and first column (W2's A rows) */
} sc_moe_expert_params;

#endif
