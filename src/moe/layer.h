/* The MoE layer object (internal), shared by moe.c (lifecycle, workspace, forwards) and
 * weights.c (the desc and weight checks, the weights' tensor maps). */
#ifndef SAFECUDA_MOE_LAYER_H
#define SAFECUDA_MOE_LAYER_H

#include <pthread.h>

#include "core/context.h"
#include "core/registry.h"
#include "moe/plan.h"
#include "safecuda/moe.h"

/* The layer's weights, each a checked view (a whole buffer or a part of one); absent
 * optional ones have no buffer. */
typedef enum sci_moe_weight {
    SCI_MOE_WT_ROUTER, SCI_MOE_WT_W13, SCI_MOE_WT_W2, SCI_MOE_WT_SEL_BIAS, SCI_MOE_WT_ROUTER_BIAS,
    SCI_MOE_WT_W13_BIAS, SCI_MOE_WT_W2_BIAS, SCI_MOE_WT_SHARED_W13, SCI_MOE_WT_SHARED_W2,
    SCI_MOE_WT_SHARED_GATE,
    SCI_MOE_WT_W13_SCALE, SCI_MOE_WT_W2_SCALE, SCI_MOE_WT_SHARED_W13_SCALE,
    SCI_MOE_WT_SHARED_W2_SCALE, /* fp8 experts' block scales */
    SCI_MOE_WT_COUNT
} sci_moe_weight;

typedef struct sci_moe {
    sci_object obj;
    sci_context *ctx;
    sc_moe_desc desc;
    sci_moe_config cfg; /* what the plans depend on: shape, backend, device, tuning */
    sc_view wt[SCI_MOE_WT_COUNT];
    sc_kernel kernels[SCI_MOE_K_COUNT];
    sc_buffer fault;      /* u32 [4]: bad caller routing ids seen, the first's token, slot, id */
    pthread_mutex_t lock; /* the workspace */
    uint64_t capacity;    /* tokens */
    sc_buffer ws[SCI_MOE_W_COUNT];
    /* SM90: maps of the weights (made once: W13's gate and up rows, W2, and the shared
     * expert's) and of the GEMMs' A operands in the workspace (x in expert order and h, bf16
     * or e4m3; made with the workspace), one per tile shape of the layer's precision. */
    sc_tensor_map g_map[SCI_MOE_N_TILES], u_map[SCI_MOE_N_TILES], w2_map[SCI_MOE_N_TILES];
    sc_tensor_map sg_map[SCI_MOE_N_TILES], su_map[SCI_MOE_N_TILES], sw2_map[SCI_MOE_N_TILES];
    sc_tensor_map xperm_map[SCI_MOE_N_TILES], h_map[SCI_MOE_N_TILES];
    int kshift13, kshift2; /* SM90: the routed W13's and W2's K shift (elements) */
    int tp_rank, tp_nranks; /* desc.tp_comm's rank and size (0 and 1 without one) */
    struct sci_moe_ep *ep;  /* expert parallel (desc.ep_comm, ep.c): this layer routes over
                             * all E experts (cfg.route_only); the rest is there */
} sci_moe;

/* Make a layer (checked, its kernels loaded, its workspace allocated; not published), or
 * free one (its workspace freed stream-ordered; the first failure's status). */
sc_status sci_moe_make(sci_context *c, const sc_moe_desc *desc, unsigned flags, const char *fn,
                       sci_moe **out);
sc_status sci_moe_free(sci_moe *m, const char *fn);
/* The same on an error path (m may be NULL): the error being reported keeps its message. */
void sci_moe_free_quietly(sci_moe *m, const char *fn);
/* sc_moe_forward's and sc_moe_route's work on a layer (not an expert-parallel one: ep.c
 * calls them on its parts), under fn's name. The first shared_rows tokens of x get the
 * shared expert (UINT64_MAX: all). fp8 experts: xq (e4m3 [T, H]) and xs (f32 [T, H/128]),
 * when given (buffer ids not 0), are x's rows already quantized by the layer's rule (views
 * made by the library: not checked), gathered as they are. */
sc_status sci_moe_run(sci_moe *m, sc_stream stream, sc_view x, sc_view out,
                      const sc_moe_forward_desc *opts, uint64_t shared_rows, sc_view xq,
                      sc_view xs, const char *fn);
sc_status sci_moe_route_run(sci_moe *m, sc_stream stream, sc_view x, sc_view ids,
                            sc_view weights, const char *fn);
/* The layer's capacity grown to max_tokens (sc_moe_reserve's work; the lock not held). */
sc_status sci_moe_reserve_run(sci_moe *m, sc_stream stream, uint64_t max_tokens, const char *fn);
/* A forward's checks of x and out ([T, H] bf16; T comes back) and of its options (the
 * caller's routing views come back, or none), before anything is enqueued. */
sc_status sci_moe_check_io(const sci_moe *m, sc_view x, sc_view out, const char *fn,
                           sc_view *xv, sc_view *ov, uint64_t *T);
sc_status sci_moe_check_opts(const sci_moe *m, const sc_moe_forward_desc *opts, uint64_t T,
                             const char *fn, sc_view *rids, sc_view *rweights);
/* The bytes of the layer's workspace (the lock not held). */
uint64_t sci_moe_workspace_total(sci_moe *m);

/* How a layer is made (sci_moe_make): an ordinary one (0), or an expert-parallel layer's
 * parts (ep.c): its routing over all E experts, without experts' weights (ROUTE_ONLY; with
 * GATE_COLUMN, its router GEMM planned with the shared gate's column, unused, as the
 * one-GPU layer's with a gate is, so that the logits are the same bits), and its rank's
 * experts, which may be fewer than top_k (EP_EXPERTS). */
enum { SCI_MOE_MAKE_ROUTE_ONLY = 1, SCI_MOE_MAKE_EP_EXPERTS = 2, SCI_MOE_MAKE_GATE_COLUMN = 4 };

/* Check the layer's shape and options, filling in the defaults (dtype and expert_dtype
 * bf16, routed scaling 1, gpt-oss's activation constants). */
sc_status sci_moe_check_desc(sc_moe_desc *d, unsigned flags, const char *fn);
/* Resolve the backend for the context's device (AUTO: SM90 on 9.0, MMA elsewhere), or
 * refuse the device. */
sc_status sci_moe_resolve_backend(sc_moe_desc *d, const sci_context *c, const char *fn);
/* The weights: each resolved to a view and checked (dtype, element count, alignment). */
sc_status sci_moe_check_weights(const sc_moe_desc *d, sci_context *c, unsigned flags,
                                const char *fn, sc_view wt[SCI_MOE_WT_COUNT]);
/* What the plans depend on (with the tuning knobs from the environment). */
sci_moe_config sci_moe_layer_config(const sc_moe_desc *d, const sci_context *c);
/* SM90: the weights' tensor maps for the tile shapes of the layer's precision, and the
 * bf16 K shifts. */
sc_status sci_moe_encode_weight_maps(sci_moe *m);
/* A tensor map of rows x cols elements at element `offset` of view v, rows `stride`
 * elements apart (0: cols), in boxes of box_rows x 128 bytes (the 128-byte swizzle), as the
 * SM90 kernels read A and B tiles. */
sc_status sci_moe_encode_map_at(sc_view v, uint64_t offset, uint64_t rows, uint64_t cols,
                                uint64_t stride, uint32_t box_rows, sc_tensor_map *map);

#endif
