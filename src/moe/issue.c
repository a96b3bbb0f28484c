/* The MoE layer's forward as launches: each step of the plan issued through the checked
 * launch path (argument sizes, stream ordering), like any user kernel; the profile's timed
 * steps (issue.h). */
#include <string.h>

#include "../../kernels/moe/moe_config.cuh"
#include "memory/buffer.h"
#include "moe/issue.h"
#include "moe/tp.h"

sc_status sci_moe_step(sci_moe_steps *st, const char *name)
{
    if (!st->prof)
        return SC_OK;
    if (st->n >= SC_MOE_MAX_STEPS)
        return SC_OK;
    sc_status s = sc_event_create(st->ctx, &(sc_event_desc){.timing = true}, &st->ev[st->n]);
    if (s == SC_OK)
        s = sc_event_record(st->ev[st->n], st->stream);
    if (s == SC_OK)
        st->prof->name[st->n++] = name;
    return s;
}

sc_status sci_moe_steps_finish(sci_moe_steps *st, sc_status s)
{
    if (!st->prof)
        return s;
    sc_event end = {0};
    if (s == SC_OK && st->n > 0)
        s = sc_event_create(st->ctx, &(sc_event_desc){.timing = true}, &end);
    if (s == SC_OK && st->n > 0 && (s = sc_event_record(end, st->stream)) == SC_OK &&
        (s = sc_event_synchronize(end)) == SC_OK) {
        st->prof->steps = st->n;
        for (int i = 0; i < st->n && s == SC_OK; i++)
            s = sc_event_elapsed(st->ev[i], i + 1 < st->n ? st->ev[i + 1] : end,
                                 &st->prof->ms[i]);
        if (s == SC_OK)
            s = sc_event_elapsed(st->ev[0], end, &st->prof->total_ms);
    }
    for (int i = 0; i < st->n; i++)
        sc_event_destroy(st->ev[i]);
    if (end.id)
        sc_event_destroy(end);
    return s;
}

bool sci_moe_same_view(sc_view a, sc_view b)
{
    sc_view ra;
    return a.buffer.id == b.buffer.id &&
           sc_buffer_view(a.buffer, a.offset, a.count, &ra) == SC_OK && ra.offset == b.offset &&
           ra.count == b.count;
}

typedef sci_moe_fwd forward;

/* Rows of the workspace (its capacity in tokens x slots per token): the stride of the fp8
 * row scales. */
static int32_t rows_cap(const sci_moe *m)
{
    return (int32_t)(m->capacity * (uint64_t)m->cfg.slots);
}

/* SM90: the row stride of x in expert order (H + the padding); elsewhere H. */
static int32_t xperm_ld(const sci_moe *m)
{
    return m->desc.hidden + (int32_t)sci_moe_a_pad(&m->cfg);
}

/* The whole of workspace buffer w. */
static sc_view ws(const forward *f, sci_moe_ws w) { return sc_view_of(f->m->ws[w]); }

/* Weight w of the layer, or (absent) the workspace's one-element stand-in: the kernel gets a
 * flag and never reads it. */
static sc_view wt_or_none(const forward *f, sci_moe_weight w)
{
    return f->m->wt[w].buffer.id ? f->m->wt[w] : ws(f, SCI_MOE_W_NO_BIAS);
}

/* A bf16 weight or, absent, another bf16 weight of the layer (the kernel never reads it). */
static sc_view wt_or(const forward *f, sci_moe_weight w, sci_moe_weight other)
{
    return f->m->wt[w].buffer.id ? f->m->wt[w] : f->m->wt[other];
}

/* The routing's kernel parameters. */
static sc_moe_route_params route_params(const forward *f, int splits)
{
    const sci_moe *m = f->m;
    const sc_moe_desc *d = &m->desc;
    return (sc_moe_route_params){
        .T = (int)f->p->tokens, .E = d->experts, .k = d->top_k, .shared = m->cfg.shared,
        .logit_cols = m->cfg.logit_cols, .splits = splits,
        .sigmoid = d->scoring == SC_MOE_SIGMOID, .renormalize = d->renormalize,
        .has_sel_bias = m->wt[SCI_MOE_WT_SEL_BIAS].buffer.id != 0,
        .has_router_bias = m->wt[SCI_MOE_WT_ROUTER_BIAS].buffer.id != 0,
        .has_gate = m->wt[SCI_MOE_WT_SHARED_GATE].buffer.id != 0,
        .n_group = d->n_group, .topk_group = d->topk_group, .scale = d->routed_scaling};
}

/* SM90: x into expert order after the permutation (bf16), or gathered and quantized per row
 * per 128 channels (fp8 experts). */
static sc_status issue_gather(const forward *f)
{
    const sci_moe_plan *p = f->p;
    const sc_kernel *kn = f->m->kernels;
    const int32_t H = f->m->desc.hidden;
    sc_status s;
    if (f->m->cfg.fp8 && f->xq.buffer.id) { /* rows that came quantized: copied */
        if ((s = sci_moe_step(f->st, "gather x (fp8, quantized)")) != SC_OK ||
            (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_GATHER_Q], &p->gather,
                           sc_arg_in(ws(f, SCI_MOE_W_PERM_TOKEN)),
                           sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_in(f->xq),
                           sc_arg_in(f->xs), sc_arg_out(ws(f, SCI_MOE_W_XQ)),
                           sc_arg_out(ws(f, SCI_MOE_W_XS)), sc_arg_i32((int32_t)p->rows),
                           sc_arg_i32(f->m->cfg.groups), sc_arg_i32(H),
                           sc_arg_i32(xperm_ld(f->m)), sc_arg_i32(f->m->kshift13),
                           sc_arg_i32(rows_cap(f->m)))) != SC_OK)
            return s;
        return SC_OK;
    }
    if (f->m->cfg.fp8) {
        if ((s = sci_moe_step(f->st, "gather + quantize x (fp8)")) != SC_OK ||
            (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_GATHER_FP8], &p->gather,
                           sc_arg_in(ws(f, SCI_MOE_W_PERM_TOKEN)),
                           sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_in(f->x),
                           sc_arg_out(ws(f, SCI_MOE_W_XQ)), sc_arg_out(ws(f, SCI_MOE_W_XS)),
                           sc_arg_i32((int32_t)p->rows), sc_arg_i32(f->m->cfg.groups),
                           sc_arg_i32(H), sc_arg_i32(xperm_ld(f->m)),
                           sc_arg_i32(f->m->kshift13), sc_arg_i32(rows_cap(f->m)))) != SC_OK)
            return s;
        return SC_OK;
    }
    if ((s = sci_moe_step(f->st, "gather x")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_GATHER], &p->gather,
                       sc_arg_in(ws(f, SCI_MOE_W_PERM_TOKEN)), sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)),
                       sc_arg_in(f->x), sc_arg_out(ws(f, SCI_MOE_W_XPERM)),
                       sc_arg_i32((int32_t)p->rows), sc_arg_i32(f->m->cfg.groups),
                       sc_arg_i32(H), sc_arg_i32(xperm_ld(f->m)),
                       sc_arg_i32(f->m->kshift13))) != SC_OK)
        return s;
    return SC_OK;
}

/* Routing in one launch, then (SM90, when it doesn't gather) x into expert order. */
static sc_status issue_route_small(const forward *f)
{
    const sc_moe_desc *d = &f->m->desc;
    const sci_moe_plan *p = f->p;
    const sc_kernel *kn = f->m->kernels;
    const bool sm90 = f->m->cfg.backend == SC_MOE_BACKEND_SM90;
    const sc_moe_route_params rp = route_params(f, 1);
    sc_status s;
    if ((s = sci_moe_step(f->st, "route (small T)")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_ROUTE_SMALL], &p->route, sc_arg_in(f->x),
                       sc_arg_in(f->m->wt[SCI_MOE_WT_ROUTER]),
                       sc_arg_in(wt_or(f, SCI_MOE_WT_SHARED_GATE, SCI_MOE_WT_ROUTER)),
                       sc_arg_in(wt_or_none(f, SCI_MOE_WT_SEL_BIAS)),
                       sc_arg_in(wt_or_none(f, SCI_MOE_WT_ROUTER_BIAS)),
                       sc_arg_out(ws(f, SCI_MOE_W_LOGITS)), sc_arg_out(ws(f, SCI_MOE_W_IDS)),
                       sc_arg_out(ws(f, SCI_MOE_W_WEIGHTS)), sc_arg_out(ws(f, SCI_MOE_W_SHARED_W)),
                       sc_arg_out(ws(f, SCI_MOE_W_ROW_OFF)),
                       sc_arg_out(ws(f, SCI_MOE_W_TILE_OFF)),
                       sc_arg_out(ws(f, SCI_MOE_W_PERM_TOKEN)),
                       sc_arg_out(ws(f, SCI_MOE_W_PERM_WEIGHT)), sc_arg_out(ws(f, SCI_MOE_W_POS)),
                       sc_arg_out(ws(f, f->m->cfg.route_only ? SCI_MOE_W_NO_BIAS /* (not written) */
                                        : !sm90                 ? SCI_MOE_W_H
                                        : f->m->cfg.fp8 ? SCI_MOE_W_XQ /* (not written) */
                                                        : SCI_MOE_W_XPERM)),
                       sc_arg_inout(ws(f, SCI_MOE_W_TICKET)), sc_arg_i32(d->hidden),
                       sc_arg_i32(xperm_ld(f->m)), sc_arg_i32(f->m->kshift13),
                       sc_arg_i32(p->route_gathers), sc_arg_bytes(&rp, sizeof rp))) != SC_OK)
        return s;
    if (p->gather.grid.x == 0)
        return SC_OK;
    return issue_gather(f);
}

/* The permutation into expert order (rows grouped by expert), and on SM90 x gathered
 * into that order with it. */
static sc_status issue_scatter(const forward *f)
{
    const sci_moe *m = f->m;
    const sci_moe_plan *p = f->p;
    const sc_kernel *kn = m->kernels;
    const int32_t T = (int32_t)p->tokens, k = m->desc.top_k, E = m->desc.experts;
    const int32_t S = m->cfg.shared;
    sc_status s;
    if (m->cfg.backend == SC_MOE_BACKEND_SM90 && !m->cfg.fp8) {
        if ((s = sci_moe_step(f->st, "scatter + gather x")) != SC_OK ||
            (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_SCATTER_GATHER], &p->scatter,
                           sc_arg_in(f->ids), sc_arg_in(f->weights),
                           sc_arg_in(ws(f, SCI_MOE_W_SHARED_W)),
                           sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)),
                           sc_arg_inout(ws(f, SCI_MOE_W_CURSOR)),
                           sc_arg_out(ws(f, SCI_MOE_W_PERM_TOKEN)),
                           sc_arg_out(ws(f, SCI_MOE_W_PERM_WEIGHT)),
                           sc_arg_out(ws(f, SCI_MOE_W_POS)), sc_arg_in(f->x),
                           sc_arg_out(ws(f, SCI_MOE_W_XPERM)), sc_arg_i32(T), sc_arg_i32(E),
                           sc_arg_i32(k), sc_arg_i32(S), sc_arg_i32((int32_t)f->shared_rows),
                           sc_arg_i32(m->desc.hidden),
                           sc_arg_i32(xperm_ld(m)), sc_arg_i32(m->kshift13))) != SC_OK)
            return s;
        return SC_OK;
    }
    if ((s = sci_moe_step(f->st, "scatter")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_SCATTER], &p->scatter, sc_arg_in(f->ids),
                       sc_arg_in(f->weights), sc_arg_in(ws(f, SCI_MOE_W_SHARED_W)),
                       sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_inout(ws(f, SCI_MOE_W_CURSOR)),
                       sc_arg_out(ws(f, SCI_MOE_W_PERM_TOKEN)),
                       sc_arg_out(ws(f, SCI_MOE_W_PERM_WEIGHT)), sc_arg_out(ws(f, SCI_MOE_W_POS)),
                       sc_arg_i32(T), sc_arg_i32(E), sc_arg_i32(k), sc_arg_i32(S),
                       sc_arg_i32((int32_t)f->shared_rows))) != SC_OK)
        return s;
    return m->cfg.fp8 ? issue_gather(f) : SC_OK;
}

/* The router GEMM over `cols` columns from column `first` of [Wg; gate] (all of them, or
 * the gate's alone with first = E), split over H as planned. */
static sc_status issue_router(const forward *f, int E, int cols)
{
    const sci_moe_plan *p = f->p;
    return SC_LAUNCH(f->stream, f->m->kernels[SCI_MOE_K_ROUTER], &p->router, sc_arg_in(f->x),
                     sc_arg_in(f->m->wt[SCI_MOE_WT_ROUTER]),
                     sc_arg_in(wt_or(f, SCI_MOE_WT_SHARED_GATE, SCI_MOE_WT_ROUTER)),
                     sc_arg_out(ws(f, SCI_MOE_W_LOGITS)), sc_arg_i32((int32_t)p->tokens),
                     sc_arg_i32(E), sc_arg_i32(cols), sc_arg_i32(f->m->desc.hidden),
                     sc_arg_i32(p->router_k_chunk));
}

/* The layer's routing in steps: expert counts zeroed, router GEMM (split over H), scores and
 * top-k (counting the rows of each expert) into ids and weights. */
static sc_status issue_topk(const forward *f, sc_view ids, sc_view weights)
{
    const sci_moe_plan *p = f->p;
    const int32_t zero = 0;
    const sc_moe_route_params rp = route_params(f, p->router_splits);
    sc_status s;
    if ((s = sci_moe_step(f->st, "zero counts")) != SC_OK ||
        (s = sc_fill(f->stream, ws(f, SCI_MOE_W_COUNTS), &zero)) != SC_OK)
        return s;
    if ((s = sci_moe_step(f->st, "router gemm")) != SC_OK ||
        (s = issue_router(f, f->m->desc.experts, f->m->cfg.logit_cols)) != SC_OK)
        return s;
    if ((s = sci_moe_step(f->st, "scores + top-k")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, f->m->kernels[SCI_MOE_K_TOPK], &p->topk,
                       sc_arg_in(ws(f, SCI_MOE_W_LOGITS)),
                       sc_arg_in(wt_or_none(f, SCI_MOE_WT_SEL_BIAS)),
                       sc_arg_in(wt_or_none(f, SCI_MOE_WT_ROUTER_BIAS)), sc_arg_out(ids),
                       sc_arg_out(weights), sc_arg_inout(ws(f, SCI_MOE_W_COUNTS)),
                       sc_arg_out(ws(f, SCI_MOE_W_SHARED_W)), sc_arg_bytes(&rp, sizeof rp))) !=
            SC_OK)
        return s;
    return SC_OK;
}

/* The caller's routing: expert counts zeroed, the gate's logits (with a shared gate), the
 * counts of the given ids (bad ones recorded), the shared weight. */
static sc_status issue_count_ids(const forward *f)
{
    const sci_moe *m = f->m;
    const sci_moe_plan *p = f->p;
    const int32_t zero = 0;
    const bool gate = m->wt[SCI_MOE_WT_SHARED_GATE].buffer.id != 0;
    const bool small = p->gate_small.grid.x != 0;
    const sc_moe_route_params rp = route_params(f, gate && !small ? p->router_splits : 1);
    sc_status s;
    if ((s = sci_moe_step(f->st, "zero counts")) != SC_OK ||
        (s = sc_fill(f->stream, ws(f, SCI_MOE_W_COUNTS), &zero)) != SC_OK)
        return s;
    if (gate && small &&
        ((s = sci_moe_step(f->st, "shared gate (small T)")) != SC_OK ||
         (s = SC_LAUNCH(f->stream, m->kernels[SCI_MOE_K_GATE_SMALL], &p->gate_small,
                        sc_arg_in(f->x), sc_arg_in(m->wt[SCI_MOE_WT_SHARED_GATE]),
                        sc_arg_out(ws(f, SCI_MOE_W_LOGITS)), sc_arg_i32((int32_t)p->tokens),
                        sc_arg_i32(m->desc.hidden))) != SC_OK))
        return s;
    if (gate && !small &&
        ((s = sci_moe_step(f->st, "shared gate gemm")) != SC_OK || (s = issue_router(f, 0, 1)) != SC_OK))
        return s;
    if ((s = sci_moe_step(f->st, "count ids")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, m->kernels[SCI_MOE_K_COUNT_IDS], &p->count_ids, sc_arg_in(f->ids),
                       sc_arg_in(ws(f, SCI_MOE_W_LOGITS)), sc_arg_inout(ws(f, SCI_MOE_W_COUNTS)),
                       sc_arg_out(ws(f, SCI_MOE_W_SHARED_W)), sc_arg_inout(sc_view_of(m->fault)),
                       sc_arg_bytes(&rp, sizeof rp))) != SC_OK)
        return s;
    return SC_OK;
}

/* Routing in steps (the layer's or the caller's), then offsets and the scatter. */
static sc_status issue_route(const forward *f, bool caller)
{
    const sci_moe_plan *p = f->p;
    sc_status s = caller ? issue_count_ids(f) : issue_topk(f, f->ids, f->weights);
    if (s != SC_OK)
        return s;
    if ((s = sci_moe_step(f->st, "offsets")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, f->m->kernels[SCI_MOE_K_OFFSETS], &p->offsets,
                       sc_arg_in(ws(f, SCI_MOE_W_COUNTS)), sc_arg_out(ws(f, SCI_MOE_W_ROW_OFF)),
                       sc_arg_out(ws(f, SCI_MOE_W_TILE_OFF)), sc_arg_out(ws(f, SCI_MOE_W_CURSOR)),
                       sc_arg_i32(f->m->desc.experts), sc_arg_i32(f->m->cfg.groups),
                       sc_arg_i32((int32_t)f->shared_rows))) != SC_OK)
        return s;
    return issue_scatter(f);
}

/* The expert GEMMs' kernel parameters (with the bias of W13's GEMM, or of W2's). */
static sc_moe_expert_params expert_params(const sci_moe *m, int group_m, sci_moe_weight bias,
                                          int kshift)
{
    const sc_moe_desc *d = &m->desc;
    return (sc_moe_expert_params){
        .E = d->experts, .groups = m->cfg.groups, .H = d->hidden, .I = d->intermediate,
        .group_m = group_m, .interleaved = d->w13_layout == SC_MOE_W13_INTERLEAVED,
        .act = (int)d->activation, .alpha = d->swiglu_alpha, .limit = d->swiglu_limit,
        .has_bias = m->wt[bias].buffer.id != 0, .kshift = kshift,
        .rows_cap = rows_cap(m),
        /* SM90 W13 writes h into W2's A rows: padded, the data from W2's shift */
        .out_ld = d->intermediate + (int)sci_moe_a_pad(&m->cfg), .out_off = m->kshift2};
}

/* fp8 experts (SM90): h (e4m3, with its row scales) = act(x_q W_gate^T + b, x_q W_up^T +
 * b) with the block scales, then y = weight * (h W2^T + b). */
static sc_status issue_gemms_fp8(const forward *f, const sc_moe_expert_params *q13,
                                 const sc_moe_expert_params *q2, int32_t rows_per_expert)
{
    const sci_moe *m = f->m;
    const sci_moe_plan *p = f->p;
    const int t = p->tile;
    const sc_view b13 = wt_or_none(f, SCI_MOE_WT_W13_BIAS), b2 = wt_or_none(f, SCI_MOE_WT_W2_BIAS);
    /* weights at an unaligned offset: the tile's kernels with the K shift */
    const bool s13 = q13->kshift && sci_moe_tiles[t].w13_shifts, s2 = q2->kshift != 0;
    const sci_moe_kernel k13 = s13 ? sci_moe_tiles[t].k13s : p->k13;
    const sci_moe_kernel k2 = s2 ? sci_moe_tiles[t].k2s : p->k2;
    sc_status s;
    if ((s = sci_moe_step(f->st, s13 ? sci_moe_tiles[t].step13s : p->step13)) != SC_OK ||
        (s = SC_LAUNCH(f->stream, m->kernels[k13], &p->w13,
                       sc_arg_tensor_map_in(&m->xperm_map[t]), sc_arg_tensor_map_in(&m->g_map[t]),
                       sc_arg_tensor_map_in(&m->u_map[t]), sc_arg_tensor_map_in(&m->sg_map[t]),
                       sc_arg_tensor_map_in(&m->su_map[t]), sc_arg_in(ws(f, SCI_MOE_W_XS)),
                       sc_arg_in(m->wt[SCI_MOE_WT_W13_SCALE]),
                       sc_arg_in(wt_or(f, SCI_MOE_WT_SHARED_W13_SCALE, SCI_MOE_WT_W13_SCALE)),
                       sc_arg_in(b13), sc_arg_out(ws(f, SCI_MOE_W_HQ)),
                       sc_arg_out(ws(f, SCI_MOE_W_HS)), sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)),
                       sc_arg_i32(rows_per_expert), sc_arg_bytes(q13, sizeof *q13))) != SC_OK)
        return s;
    if ((s = sci_moe_step(f->st, s2 ? sci_moe_tiles[t].step2s : p->step2)) != SC_OK ||
        (s = SC_LAUNCH(f->stream, m->kernels[k2], &p->w2, sc_arg_tensor_map_in(&m->h_map[t]),
                       sc_arg_tensor_map_in(&m->w2_map[t]), sc_arg_tensor_map_in(&m->sw2_map[t]),
                       sc_arg_in(ws(f, SCI_MOE_W_HS)), sc_arg_in(m->wt[SCI_MOE_WT_W2_SCALE]),
                       sc_arg_in(wt_or(f, SCI_MOE_WT_SHARED_W2_SCALE, SCI_MOE_WT_W2_SCALE)),
                       sc_arg_in(b2), sc_arg_in(ws(f, SCI_MOE_W_PERM_WEIGHT)),
                       sc_arg_out(ws(f, SCI_MOE_W_Y)), sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)),
                       sc_arg_bytes(q2, sizeof *q2))) != SC_OK)
        return s;
    return SC_OK;
}

/* The expert GEMMs in the plan's kernels: h = act(x W_gate^T + b, x W_up^T + b), then y =
 * weight * (h W2^T + b), rows in expert order. SM90 reads A and B through tensor maps of the
 * plan's tile shape; MMA reads x through the permutation. */
static sc_status issue_gemms(const forward *f)
{
    const sci_moe *m = f->m;
    const sci_moe_plan *p = f->p;
    const int t = p->tile;
    sc_status s;
    const sc_view b13 = wt_or_none(f, SCI_MOE_WT_W13_BIAS), b2 = wt_or_none(f, SCI_MOE_WT_W2_BIAS);
    if (m->cfg.backend == SC_MOE_BACKEND_SM90) {
        const sc_moe_expert_params q13 =
            expert_params(m, p->group_m13, SCI_MOE_WT_W13_BIAS, m->kshift13);
        const sc_moe_expert_params q2 =
            expert_params(m, p->group_m2, SCI_MOE_WT_W2_BIAS, m->kshift2);
        const int32_t rows_per_expert = m->desc.w13_layout == SC_MOE_W13_INTERLEAVED
                                            ? m->desc.intermediate
                                            : 2 * m->desc.intermediate;
        if (m->cfg.fp8)
            return issue_gemms_fp8(f, &q13, &q2, rows_per_expert);
        if ((s = sci_moe_step(f->st, q13.kshift ? sci_moe_tiles[t].step13s : p->step13)) != SC_OK ||
            (s = SC_LAUNCH(f->stream, m->kernels[p->k13], &p->w13,
                           sc_arg_tensor_map_in(&m->xperm_map[t]),
                           sc_arg_tensor_map_in(&m->g_map[t]), sc_arg_tensor_map_in(&m->u_map[t]),
                           sc_arg_tensor_map_in(&m->sg_map[t]),
                           sc_arg_tensor_map_in(&m->su_map[t]), sc_arg_in(b13),
                           sc_arg_out(ws(f, SCI_MOE_W_H)), sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)),
                           sc_arg_i32(rows_per_expert), sc_arg_bytes(&q13, sizeof q13))) != SC_OK)
            return s;
        if ((s = sci_moe_step(f->st, q2.kshift ? sci_moe_tiles[t].step2s : p->step2)) != SC_OK ||
            (s = SC_LAUNCH(f->stream, m->kernels[p->k2], &p->w2,
                           sc_arg_tensor_map_in(&m->h_map[t]),
                           sc_arg_tensor_map_in(&m->w2_map[t]),
                           sc_arg_tensor_map_in(&m->sw2_map[t]), sc_arg_in(b2),
                           sc_arg_in(ws(f, SCI_MOE_W_PERM_WEIGHT)), sc_arg_out(ws(f, SCI_MOE_W_Y)),
                           sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_bytes(&q2, sizeof q2))) !=
                SC_OK)
            return s;
        return SC_OK;
    }
    const sc_moe_expert_params q13 = expert_params(m, 0, SCI_MOE_WT_W13_BIAS, 0);
    const sc_moe_expert_params q2 = expert_params(m, 0, SCI_MOE_WT_W2_BIAS, 0);
    if ((s = sci_moe_step(f->st, p->step13)) != SC_OK ||
        (s = SC_LAUNCH(f->stream, m->kernels[p->k13], &p->w13, sc_arg_in(f->x),
                       sc_arg_in(ws(f, SCI_MOE_W_PERM_TOKEN)), sc_arg_in(m->wt[SCI_MOE_WT_W13]),
                       sc_arg_in(wt_or(f, SCI_MOE_WT_SHARED_W13, SCI_MOE_WT_W13)), sc_arg_in(b13),
                       sc_arg_out(ws(f, SCI_MOE_W_H)), sc_arg_in(ws(f, SCI_MOE_W_TILE_OFF)),
                       sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_bytes(&q13, sizeof q13))) != SC_OK)
        return s;
    if ((s = sci_moe_step(f->st, p->step2)) != SC_OK ||
        (s = SC_LAUNCH(f->stream, m->kernels[p->k2], &p->w2, sc_arg_in(ws(f, SCI_MOE_W_H)),
                       sc_arg_in(m->wt[SCI_MOE_WT_W2]),
                       sc_arg_in(wt_or(f, SCI_MOE_WT_SHARED_W2, SCI_MOE_WT_W2)), sc_arg_in(b2),
                       sc_arg_in(ws(f, SCI_MOE_W_PERM_WEIGHT)), sc_arg_out(ws(f, SCI_MOE_W_Y)),
                       sc_arg_in(ws(f, SCI_MOE_W_TILE_OFF)), sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)),
                       sc_arg_bytes(&q2, sizeof q2))) != SC_OK)
        return s;
    return SC_OK;
}

/* out (+)= the weighted sum of each token's expert outputs; then the optional copies of the
 * chosen experts and their weights. */
static sc_status issue_combine(const forward *f, const sc_moe_forward_desc *opts)
{
    const sci_moe_plan *p = f->p;
    sc_status s;
    if ((s = sci_moe_step(f->st, "combine")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, f->m->kernels[SCI_MOE_K_COMBINE], &p->combine,
                       sc_arg_in(ws(f, SCI_MOE_W_Y)), sc_arg_in(ws(f, SCI_MOE_W_POS)),
                       f->accumulate ? sc_arg_inout(f->out) : sc_arg_out(f->out),
                       sc_arg_i32((int32_t)p->tokens), sc_arg_i32(f->m->cfg.slots),
                       sc_arg_i32(f->m->desc.hidden), sc_arg_i32(f->accumulate))) != SC_OK)
        return s;
    if (opts && opts->expert_ids.buffer.id && !sci_moe_same_view(opts->expert_ids, f->ids) &&
        (s = sc_copy(f->stream, opts->expert_ids, f->ids)) != SC_OK)
        return s;
    if (opts && opts->expert_weights.buffer.id && !sci_moe_same_view(opts->expert_weights, f->weights) &&
        (s = sc_copy(f->stream, opts->expert_weights, f->weights)) != SC_OK)
        return s;
    return SC_OK;
}

/* Reduce-scattered tensor parallel, accumulating: the partial starts as zeros with this
 * rank's rows holding its out (the residual), so that the reduce-scatter adds each residual
 * once. */
static sc_status issue_tp_residual(const forward *f)
{
    const sci_moe *m = f->m;
    const uint64_t rows = f->tp_out.count; /* T / N x H */
    const uint16_t zero = 0;
    sc_view mine = f->out;
    mine.offset += (uint64_t)m->tp_rank * rows;
    mine.count = rows;
    sc_status s;
    if ((s = sci_moe_step(f->st, "tp residual")) != SC_OK || (s = sc_fill(f->stream, f->out, &zero)) != SC_OK ||
        (s = sc_copy(f->stream, mine, f->tp_out)) != SC_OK)
        sci_error_append(" (putting the residual into the reduce-scattered partial output)");
    return s;
}

sc_status sci_moe_issue(forward *f, const sc_moe_forward_desc *opts)
{
    const bool caller = opts && opts->routing_ids.buffer.id;
    sc_status s = SC_OK;
    if (f->m->cfg.tp_scatter && f->accumulate)
        s = issue_tp_residual(f);
    if (s == SC_OK)
        s = f->p->route_small ? issue_route_small(f) : issue_route(f, caller);
    if (s == SC_OK)
        s = issue_gemms(f);
    if (s == SC_OK)
        s = issue_combine(f, opts);
    if (s == SC_OK && f->m->desc.tp_comm.id &&
        (s = sci_moe_step(f->st, f->m->cfg.tp_scatter ? "tp reduce-scatter" : "tp all-reduce")) == SC_OK)
        s = sci_moe_tp_reduce(&f->m->desc, f->stream, f->m->cfg.tp_scatter ? f->tp_out : f->out,
                              f->out);
    return s;
}

sc_status sci_moe_issue_routing(forward *f)
{
    if (!f->p->route_small)
        return issue_topk(f, f->ids, f->weights);
    /* The forward's own one-launch routing (so that its ids and weights are the forward's to
     * the bit), then a copy of them. */
    sc_view wids = sc_view_of(f->m->ws[SCI_MOE_W_IDS]);
    sc_view wws = sc_view_of(f->m->ws[SCI_MOE_W_WEIGHTS]);
    wids.count = wws.count = f->ids.count;
    sc_status s = issue_route_small(f);
    if (s == SC_OK)
        s = sc_copy(f->stream, f->ids, wids);
    if (s == SC_OK)
        s = sc_copy(f->stream, f->weights, wws);
    return s;
}
