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
 * 64 CONS), BN columns of B per tile (for W13: BN/2 gate + BN/2 up rows, so BN/2 columns
 * of h), K steps of 64 through STAGES TMA stages; GROUP_M M tiles share each N tile. The
 * large tile is for prefill, the small one streams weights for decode. */
/* GROUP_M: M tiles that share each N tile, chosen so that their A rows (GROUP_M x BM x K
 * bf16) stay within GROUP_BYTES of L2 while the N tiles sweep past, 1 .. GROUP_M_MAX. */
#define SC_MOE_SM90_GROUP_BYTES (16u << 20)
#define SC_MOE_SM90_GROUP_M_MAX 16
#define SC_MOE_SM90_LARGE_CONS 2
#define SC_MOE_SM90_LARGE_BN 256
#define SC_MOE_SM90_LARGE_STAGES 4
#define SC_MOE_SM90_LARGE_A_BOX 64 /* rows per A copy: only the boxes with rows are copied */
#define SC_MOE_SM90_SMALL_CONS 1
#define SC_MOE_SM90_SMALL_BN 64
#define SC_MOE_SM90_SMALL_STAGES 4
#define SC_MOE_SM90_SMALL_A_BOX 8
#define SC_MOE_SM90_SMALL_CTAS_PER_SM 3
/* A medium tile (BN = 128, deeper ring) for tuning comparisons (SAFECUDA_MOE_TILE=medium). */
#define SC_MOE_SM90_MEDIUM_CONS 2
#define SC_MOE_SM90_MEDIUM_BN 128
#define SC_MOE_SM90_MEDIUM_STAGES 6
#define SC_MOE_SM90_MEDIUM_A_BOX 64
/* A wide tile (one consumer, BN = 256) for tuning comparisons (SAFECUDA_MOE_TILE=wide). */
#define SC_MOE_SM90_WIDE_CONS 1
#define SC_MOE_SM90_WIDE_BN 256
#define SC_MOE_SM90_WIDE_STAGES 5
#define SC_MOE_SM90_WIDE_A_BOX 16
/* Rows per expert (T k / E on average) up to which the small tile is used. */
#define SC_MOE_SM90_SMALL_MAX_ROWS 24
/* Dynamic shared memory: 1024 bytes of alignment slack, the ring, its barriers, the row
 * and tile offsets. */
#define SC_MOE_SM90_SMEM(CONS, BN, STAGES)                                                \
    (1024 + (STAGES) * ((CONS) * 64 * 128 + (BN) * 128) + 2 * (STAGES) * 8 +              \
     2 * (SC_MOE_MAX_GROUPS + 1) * 4)
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
} sc_moe_expert_params;

#endif
