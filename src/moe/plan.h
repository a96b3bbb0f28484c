/* The MoE layer's plans (internal): which kernels a layer loads, the SM90 tile shapes, the
 * workspace, and for a forward over T tokens every decision it makes (the routing path,
 * tile shape, grids, schedule, programmatic launches, workspace bytes). The functions are
 * pure: no driver, no allocation, no state, so the host tests call them directly and
 * moe.c only issues what they decide. Tuning constants: kernels/moe/moe_config.cuh. */
#ifndef SAFECUDA_MOE_PLAN_H
#define SAFECUDA_MOE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "../../kernels/moe/moe_config.cuh"
#include "safecuda/moe.h"

/* The kernels of kernels/moe/ the layer uses: the routing's, the MMA backend's GEMMs, and
 * the SM90 GEMMs of each tile shape (SCI_MOE_K_W13_LARGE, ..., from SC_MOE_SM90_TILES), each
 * also as launched for weights at an unaligned offset (SCI_MOE_K_W13S_LARGE, ...: e4m3's
 * own kernels with the K shift, moe_sm90a.cu; bf16's shift is in its one kernel). */
#define SCI_MOE_TILE_KERNEL_ENUM(ID, ...)                                                   \
    SCI_MOE_K_W13_##ID, SCI_MOE_K_W2_##ID, SCI_MOE_K_W13S_##ID, SCI_MOE_K_W2S_##ID,
typedef enum sci_moe_kernel {
    SCI_MOE_K_ROUTER, SCI_MOE_K_TOPK, SCI_MOE_K_OFFSETS, SCI_MOE_K_SCATTER, SCI_MOE_K_COMBINE,
    SCI_MOE_K_W13, SCI_MOE_K_W2, /* MMA backend */
    SCI_MOE_K_SCATTER_GATHER, SCI_MOE_K_ROUTE_SMALL, SCI_MOE_K_GATHER, SCI_MOE_K_GATHER_FP8,
    SCI_MOE_K_COUNT_IDS, SCI_MOE_K_GATE_SMALL, SCI_MOE_K_GATHER_Q,
    SC_MOE_SM90_TILES(SCI_MOE_TILE_KERNEL_ENUM)
    SCI_MOE_K_COUNT
} sci_moe_kernel;

typedef struct sci_moe_kernel_info {
    const char *file, *name;
    sc_moe_backend backend; /* the backend that uses it; SC_MOE_BACKEND_AUTO: both */
    int smem;               /* dynamic shared memory its launches ask for */
} sci_moe_kernel_info;

extern const sci_moe_kernel_info sci_moe_kernels[SCI_MOE_K_COUNT];

/* The SM90 GEMMs' tile shapes (SC_MOE_SM90_TILES), each with its pair of kernels and the
 * tensor maps they read through (boxes of a_box rows of A, bn/2 rows of W13, bn rows of W2,
 * 128 bytes of K). */
#define SCI_MOE_TILE_ENUM(ID, ...) SCI_MOE_TILE_##ID,
typedef enum sci_moe_tile {
    SC_MOE_SM90_TILES(SCI_MOE_TILE_ENUM)
    SCI_MOE_N_TILES
} sci_moe_tile;

typedef struct sci_moe_tile_info {
    bool fp8;                   /* the e4m3 kernels (fp8 experts), else bf16 */
    int cons, bn, stages, a_box, ctas_per_sm;
    int split;                  /* W13: CTAs of a cluster sharing a tile (grid a multiple) */
    int cols13;                 /* columns of h per W13 tile: bn/2, or 128 for fp8 */
    sci_moe_kernel k13, k2;
    sci_moe_kernel k13s, k2s;   /* for weights at an unaligned offset (the K shift) */
    const char *name;           /* as SAFECUDA_MOE_TILE names it */
    const char *step13, *step2; /* the GEMMs' profile step names */
    const char *step13s, *step2s; /* theirs with the K shift (weights at unaligned offsets) */
    bool w13_shifts;            /* false: the W13 kernel reads unaligned weights unshifted
                                   (e4m3 tiles of more than two passes: moe_sm90a.cu) */
} sci_moe_tile_info;

extern const sci_moe_tile_info sci_moe_tiles[SCI_MOE_N_TILES];

/* The tile shape called name ("small", "fp8_large", ...), or -1. */
int sci_moe_tile_named(const char *name);

/* The workspace buffers, sized for a number of tokens (the capacity). */
typedef enum sci_moe_ws {
    SCI_MOE_W_LOGITS, SCI_MOE_W_IDS, SCI_MOE_W_WEIGHTS, SCI_MOE_W_COUNTS, SCI_MOE_W_ROW_OFF,
    SCI_MOE_W_TILE_OFF, SCI_MOE_W_CURSOR, SCI_MOE_W_PERM_TOKEN, SCI_MOE_W_PERM_WEIGHT,
    SCI_MOE_W_POS, SCI_MOE_W_H, SCI_MOE_W_Y, SCI_MOE_W_NO_BIAS, SCI_MOE_W_XPERM,
    SCI_MOE_W_TICKET, SCI_MOE_W_SHARED_W,
    SCI_MOE_W_XQ, SCI_MOE_W_XS, SCI_MOE_W_HQ, SCI_MOE_W_HS, /* fp8: x and h, e4m3 + scales */
    SCI_MOE_W_TP_PART, /* tensor parallel, reduce-scattered: the rank's partial [T, H] */
    SCI_MOE_W_COUNT
} sci_moe_ws;

typedef struct sci_moe_ws_info {
    sc_dtype dtype;
    const char *label;
    bool zero; /* zeroed when created */
} sci_moe_ws_info;

extern const sci_moe_ws_info sci_moe_workspace[SCI_MOE_W_COUNT];

/* What the plans depend on besides T, fixed when the layer is created. */
typedef struct sci_moe_config {
    int experts, top_k, hidden, intermediate; /* E, k, H, I */
    int shared;             /* S: the shared expert's chunks of I (0: none) */
    int groups, slots;      /* E + S experts in the GEMMs, k + S rows per token */
    int logit_cols;         /* router columns: E, + 1 for the shared expert's gate */
    sc_moe_backend backend; /* resolved: MMA or SM90 */
    bool fp8;               /* e4m3 experts with block scales (SM90) */
    int sm_count;           /* the device's */
    int tile_override;      /* SM90 tile shape from SAFECUDA_MOE_TILE (tuning), or -1 */
    int group_override;     /* GROUP_M from SAFECUDA_MOE_GROUP_M (tuning), or 0 */
    bool pdl;               /* programmatic dependent launches (SAFECUDA_MOE_PDL=0: off) */
    bool tp_scatter;        /* tensor parallel, reduce-scattered: the partial output in the
                               workspace (SCI_MOE_W_TP_PART) */
    bool route_only;        /* an expert-parallel layer's routing over all E experts (ep.c):
                               no experts' weights, GEMMs or their workspace */
} sci_moe_config;

/* SM90: the elements by which the GEMMs' A rows (x in expert order, h) exceed H or I, 128
 * bytes (room for the K shift); elsewhere 0. */
static inline uint64_t sci_moe_a_pad(const sci_moe_config *c)
{
    if (c->backend != SC_MOE_BACKEND_SM90)
        return 0;
    return c->fp8 ? SC_MOE_SM90_A_PAD_FP8 : SC_MOE_SM90_A_PAD;
}

/* Elements of each workspace buffer for `tokens` tokens (0: the backend doesn't use it),
 * and their bytes in all. */
void sci_moe_workspace_counts(const sci_moe_config *c, uint64_t tokens,
                              uint64_t count[SCI_MOE_W_COUNT]);
uint64_t sci_moe_workspace_bytes_for(const sci_moe_config *c, uint64_t tokens);

/* The capacity a workspace for `capacity` tokens grows to for a forward of T tokens (at
 * least double, so growth is rare), or 0 when it is large enough. */
uint64_t sci_moe_workspace_grow(uint64_t capacity, uint64_t T);

/* Whether one forward takes T tokens (the kernels' index arithmetic stays in range). The
 * plans assume it. */
bool sci_moe_tokens_fit(const sci_moe_config *c, uint64_t T);

/* A forward over T tokens, in launch order. Launches the forward doesn't make are zero. */
typedef struct sci_moe_plan {
    uint64_t tokens, rows;  /* T, and T (k + S) rows in expert order (at most: padded slots
                               of the caller's routing have none) */
    bool pdl;               /* every launch programmatic (few tokens: launch latency) */
    /* Routing: in one launch (few tokens) or in steps. */
    bool route_small;       /* sc_moe_route_small: logits, top-k, offsets, permutation */
    bool route_gathers;     /* ... and x in expert order (SM90, while x is small) */
    sc_launch_desc route, gather; /* gather: x in expert order after route (SM90) */
    int router_splits;      /* the router GEMM splits H in this many (blocks along z) */
    int router_k_chunk;     /* columns of H per split */
    sc_launch_desc router, topk, offsets, scatter; /* scatter + gather x on SM90 */
    sc_launch_desc count_ids; /* the caller's routing: instead of top-k; the gate's logits
                                 by gate_small (few tokens) or the router (the routing's
                                 splits of H, one column tile): the routing's bits */
    sc_launch_desc gate_small;
    /* The expert GEMMs: W13 (gate and up, silu) then W2 (down, routing weight). */
    int tile;               /* the SM90 tile shape (sci_moe_tile), -1 for MMA */
    sci_moe_kernel k13, k2;
    const char *step13, *step2;
    sc_launch_desc w13, w2;
    int group_m13, group_m2; /* SM90: M tiles that share each N tile */
    sc_launch_desc combine;
    uint64_t workspace_bytes; /* a workspace for exactly T tokens */
} sci_moe_plan;

/* caller: the routing is the caller's (routing in steps, no top-k; the router GEMM only
 * computes the shared gate's logits, when there is a gate). */
void sci_moe_plan_make(const sci_moe_config *c, uint64_t T, bool caller, sci_moe_plan *p);

#endif
