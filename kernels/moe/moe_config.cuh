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

#define SC_MOE_MAX_EXPERTS 256 /* the top-k kernel keeps a token's scores in one warp */
#define SC_MOE_MAX_TOPK 16
#define SC_MOE_ALIGN 8         /* H and I must be multiples of this (16-byte rows) */

#define SC_MOE_TOPK_TOKENS_PER_BLOCK 8 /* one warp per token */
#define SC_MOE_COMBINE_THREADS 256

#endif
