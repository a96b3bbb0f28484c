/* The MoE layer's desc and weights: the checks of sc_moe_create (every refusal names the
 * desc field), the plans' configuration, and on SM90 the weights' tensor maps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/layer.h"

/* Resolve weight `what`, given as a whole buffer b or a view v (one or the other; neither
 * when !required: absent), and check its context, dtype, element count and alignment. */
static sc_status check_weight(sc_buffer b, sc_view v, const char *what, const char *view_name,
                              bool required, sc_dtype dtype, uint64_t count, const char *shape,
                              sci_context *c, const char *fn, sc_view *out)
{
    *out = (sc_view){{0}, 0, 0};
    if (b.id && v.buffer.id)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->%s and desc->%s are both given: "
                        "the weight is one or the other", what, view_name);
    if (!b.id && !v.buffer.id) {
        if (required)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->%s%s%s%s is missing", what,
                            view_name ? " (or desc->" : "", view_name ? view_name : "",
                            view_name ? ")" : "");
        return SC_OK;
    }
    const char *name = b.id || !view_name ? what : view_name;
    if (b.id)
        v = sc_view_of(b);
    sc_buffer_props p;
    sc_view r;
    sc_status s = sc_buffer_info(v.buffer, &p);
    if (s == SC_OK)
        s = sc_buffer_view(v.buffer, v.offset, v.count, &r);
    if (s != SC_OK) {
        sci_error_append(" (desc->%s)", name);
        return s;
    }
    if (p.context.id != c->obj.id)
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn, "desc->%s (buffer '%s') belongs to another "
                        "context", name, p.label);
    if (p.dtype != dtype)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn, "desc->%s (buffer '%s', created at %s:%d) is "
                        "%s; the layer needs %s",
                        name, p.label, p.file, p.line, sc_dtype_name(p.dtype),
                        sc_dtype_name(dtype));
    if (r.count != count)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->%s (buffer '%s', created at %s:%d%s) has %llu elements; %s needs "
                        "%llu",
                        name, p.label, p.file, p.line, b.id ? "" : ", a view", (unsigned long long)r.count, shape,
                        (unsigned long long)count);
    if ((r.offset * sc_dtype_size(dtype)) % 16)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->%s starts at element %llu of buffer '%s' (created at %s:%d): the "
                        "kernels need a 16-byte aligned start", name,
                        (unsigned long long)r.offset, p.label, p.file, p.line);
    *out = r;
    return SC_OK;
}

/* Check the layer's shape and options (defaults filled in: dtype bf16, routed scaling 1,
 * gpt-oss's activation constants). */
sc_status sci_moe_check_desc(sc_moe_desc *d, unsigned flags, const char *fn)
{
    if (d->dtype == SC_DTYPE_INVALID)
        d->dtype = SC_BF16;
    if (d->expert_dtype == SC_DTYPE_INVALID)
        d->expert_dtype = SC_BF16;
    if ((unsigned)d->backend > SC_MOE_BACKEND_SM90)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->backend = %d", (int)d->backend);
    if ((unsigned)d->tp_output > SC_MOE_TP_REDUCE_SCATTER)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->tp_output = %d: SC_MOE_TP_ALL_REDUCE (0) or "
                        "SC_MOE_TP_REDUCE_SCATTER (1)",
                        (int)d->tp_output);
    if (d->tp_output == SC_MOE_TP_REDUCE_SCATTER && !d->tp_comm.id)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->tp_output = SC_MOE_TP_REDUCE_SCATTER without a tp_comm: only a "
                        "tensor-parallel layer reduce-scatters its output");
    const int E = d->experts, k = d->top_k, H = d->hidden, I = d->intermediate;
    if (d->dtype != SC_BF16)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn, "dtype %s: the MoE kernels take bf16",
                        sc_dtype_name(d->dtype));
    if (E < 1 || E > SC_MOE_MAX_EXPERTS)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->experts = %d (1 .. %d)", E,
                        SC_MOE_MAX_EXPERTS);
    if (k < 1 || (k > E && !(flags & SCI_MOE_MAKE_EP_EXPERTS)) || k > SC_MOE_MAX_TOPK)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->top_k = %d: it must be 1 .. min(experts "
                        "= %d, %d)", k, E, SC_MOE_MAX_TOPK);
    if (H <= 0 || H % SC_MOE_ALIGN)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->hidden = %d: the kernels need a positive "
                        "multiple of %d", H, SC_MOE_ALIGN);
    if (I <= 0 || I % SC_MOE_ALIGN)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->intermediate = %d: the kernels need a "
                        "positive multiple of %d", I, SC_MOE_ALIGN);
    if (d->expert_dtype != SC_BF16 && d->expert_dtype != SC_F8E4M3)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn, "desc->expert_dtype = %s (%d): the experts are "
                        "bf16 or f8e4m3 (with 128 x 128 block scales)",
                        sc_dtype_name(d->expert_dtype), (int)d->expert_dtype);
    if (d->expert_dtype == SC_F8E4M3) {
        if (H % SC_MOE_FP8_BLOCK)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->hidden = %d: fp8 experts need a multiple of %d (their weights' "
                            "scales are per %d x %d block, x's per %d channels)",
                            H, SC_MOE_FP8_BLOCK, SC_MOE_FP8_BLOCK, SC_MOE_FP8_BLOCK,
                            SC_MOE_FP8_BLOCK);
        if (I % SC_MOE_FP8_BLOCK)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->intermediate = %d: fp8 experts need a multiple of %d (their "
                            "weights' scales are per %d x %d block, h's per %d channels)",
                            I, SC_MOE_FP8_BLOCK, SC_MOE_FP8_BLOCK, SC_MOE_FP8_BLOCK,
                            SC_MOE_FP8_BLOCK);
        if (d->backend == SC_MOE_BACKEND_MMA)
            return sci_fail(SC_ERR_NOT_SUPPORTED, fn, "desc->backend = SC_MOE_BACKEND_MMA: fp8 "
                            "experts run on the SM90 backend only (e4m3 warpgroup MMAs)");
    }
    if (d->scoring != SC_MOE_SOFTMAX && d->scoring != SC_MOE_SIGMOID)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->scoring = %d", (int)d->scoring);
    if (d->n_group || d->topk_group) {
        if (d->n_group < 1 || d->n_group > 32 || E % d->n_group || E / d->n_group < 2)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->n_group = %d: it must be 1 .. 32 and divide desc->experts = %d into "
                            "groups of 2 or more (a group is scored by its two best experts)",
                            d->n_group, E);
        if (d->topk_group < 1 || d->topk_group > d->n_group)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->topk_group = %d: it must be 1 .. "
                            "desc->n_group = %d", d->topk_group, d->n_group);
        if (k > d->topk_group * (E / d->n_group))
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->top_k = %d is more than the %d experts of desc->topk_group = %d groups of "
                            "%d", k, d->topk_group * (E / d->n_group), d->topk_group,
                            E / d->n_group);
    }
    if (!(d->routed_scaling >= 0.f) || d->routed_scaling > 1e30f)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->routed_scaling = %g: it must be finite and "
                        ">= 0 (0 means 1)", (double)d->routed_scaling);
    if (d->routed_scaling == 0.f)
        d->routed_scaling = 1.f;
    if ((unsigned)d->activation > SC_MOE_SWIGLU_CLAMP)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->activation = %d", (int)d->activation);
    if (d->activation != SC_MOE_SWIGLU_CLAMP && (d->swiglu_alpha != 0.f || d->swiglu_limit != 0.f))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->swiglu_alpha = %g, desc->swiglu_limit = %g: they are SC_MOE_SWIGLU_CLAMP's "
                        "constants, and the activation is %d", (double)d->swiglu_alpha,
                        (double)d->swiglu_limit, (int)d->activation);
    if (d->activation == SC_MOE_SWIGLU_CLAMP) {
        if (d->swiglu_alpha == 0.f)
            d->swiglu_alpha = 1.702f;
        if (d->swiglu_limit == 0.f)
            d->swiglu_limit = 7.f;
        if (!(d->swiglu_alpha > 0.f) || d->swiglu_alpha > 1e30f)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->swiglu_alpha = %g: it must be finite "
                            "and > 0", (double)d->swiglu_alpha);
        if (!(d->swiglu_limit > 0.f) || d->swiglu_limit > 1e30f)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->swiglu_limit = %g: it must be finite "
                            "and > 0", (double)d->swiglu_limit);
    }
    if ((unsigned)d->w13_layout > SC_MOE_W13_INTERLEAVED)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->w13_layout = %d", (int)d->w13_layout);
    const int Is = d->shared_intermediate;
    if (Is < 0 || Is % I || Is / I > SC_MOE_MAX_SHARED)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->shared_intermediate = %d: it must be 0 or a multiple of intermediate = "
                        "%d, at most %d of it", Is, I, SC_MOE_MAX_SHARED);
    return SC_OK;
}

/* Resolve the backend for the context's device (AUTO: SM90 on 9.0, MMA elsewhere), or
 * refuse the device. */
sc_status sci_moe_resolve_backend(sc_moe_desc *d, const sci_context *c, const char *fn)
{
    const bool sm90 = c->props.cc_major == 9 && c->props.cc_minor == 0;
    if (d->backend == SC_MOE_BACKEND_AUTO)
        d->backend = sm90 ? SC_MOE_BACKEND_SM90 : SC_MOE_BACKEND_MMA;
    if (d->backend == SC_MOE_BACKEND_SM90 && !sm90)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn, "the SM90 backend needs compute capability "
                        "9.0; device %d is %d.%d", c->device, c->props.cc_major,
                        c->props.cc_minor);
    if (c->props.cc_major < 8)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn, "the MoE kernels need compute capability 8.0 "
                        "or newer (bf16 tensor cores); device %d is %d.%d", c->device,
                        c->props.cc_major, c->props.cc_minor);
    if (d->expert_dtype == SC_F8E4M3 && d->backend != SC_MOE_BACKEND_SM90)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn, "desc->expert_dtype = f8e4m3: fp8 experts need "
                        "the SM90 backend (compute capability 9.0: e4m3 warpgroup MMAs); device "
                        "%d is %d.%d", c->device, c->props.cc_major, c->props.cc_minor);
    return SC_OK;
}

/* The weights: each resolved to a view and checked (dtype, element count, alignment). */
sc_status sci_moe_check_weights(const sc_moe_desc *d, sci_context *c, unsigned flags,
                                const char *fn, sc_view wt[SCI_MOE_WT_COUNT])
{
    const uint64_t E = (uint64_t)d->experts, H = (uint64_t)d->hidden;
    const uint64_t I = (uint64_t)d->intermediate, Is = (uint64_t)d->shared_intermediate;
    const sc_view none = {{0}, 0, 0};
    const sc_dtype xd = d->expert_dtype; /* the experts' weights */
    const bool fp8 = xd == SC_F8E4M3;
    const bool route_only = flags & SCI_MOE_MAKE_ROUTE_ONLY;
    const uint64_t B = SC_MOE_FP8_BLOCK, Hb = H / B, Ib = I / B, Isb = Is / B;
    const sc_buffer nob = {0};
    const struct {
        sc_buffer b;
        sc_view v;
        const char *name, *view_name;
        bool required;
        sc_dtype dtype;
        uint64_t count;
    } w[SCI_MOE_WT_COUNT] = {
        [SCI_MOE_WT_ROUTER] = {d->router, d->router_view, "router", "router_view", true, SC_BF16,
                               E * H},
        [SCI_MOE_WT_W13] = {d->w13, d->w13_view, "w13", "w13_view", !route_only, xd,
                            E * 2 * I * H},
        [SCI_MOE_WT_W2] = {d->w2, d->w2_view, "w2", "w2_view", !route_only, xd, E * H * I},
        [SCI_MOE_WT_SEL_BIAS] = {d->selection_bias, d->selection_bias_view, "selection_bias",
                                 "selection_bias_view", false, SC_F32, E},
        [SCI_MOE_WT_ROUTER_BIAS] = {nob, d->router_bias, "router_bias", NULL, false, SC_F32, E},
        [SCI_MOE_WT_W13_BIAS] = {nob, d->w13_bias, "w13_bias", NULL, false, SC_F32, E * 2 * I},
        [SCI_MOE_WT_W2_BIAS] = {nob, d->w2_bias, "w2_bias", NULL, false, SC_F32, E * H},
        [SCI_MOE_WT_SHARED_W13] = {nob, Is ? d->shared_w13 : none, "shared_w13", NULL, Is > 0,
                                   xd, 2 * Is * H},
        [SCI_MOE_WT_SHARED_W2] = {nob, Is ? d->shared_w2 : none, "shared_w2", NULL, Is > 0,
                                  xd, H * Is},
        [SCI_MOE_WT_SHARED_GATE] = {nob, Is ? d->shared_gate : none, "shared_gate", NULL, false,
                                    SC_BF16, H},
        [SCI_MOE_WT_W13_SCALE] = {nob, d->w13_scale, "w13_scale", NULL, fp8, SC_F32,
                                  E * (2 * Ib) * Hb},
        [SCI_MOE_WT_W2_SCALE] = {nob, d->w2_scale, "w2_scale", NULL, fp8, SC_F32, E * Hb * Ib},
        [SCI_MOE_WT_SHARED_W13_SCALE] = {nob, Is ? d->shared_w13_scale : none,
                                         "shared_w13_scale", NULL, fp8 && Is > 0, SC_F32,
                                         2 * Isb * Hb},
        [SCI_MOE_WT_SHARED_W2_SCALE] = {nob, Is ? d->shared_w2_scale : none, "shared_w2_scale",
                                        NULL, fp8 && Is > 0, SC_F32, Hb * Isb},
    };
    if (!fp8) {
        const struct { sc_view v; const char *name; } scales[] = {
            {d->w13_scale, "w13_scale"}, {d->w2_scale, "w2_scale"},
            {d->shared_w13_scale, "shared_w13_scale"}, {d->shared_w2_scale, "shared_w2_scale"}};
        for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++)
            if (scales[i].v.buffer.id)
                return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->%s is given but the experts "
                                "are bf16 (desc->expert_dtype = %s): block scales are for "
                                "f8e4m3 experts", scales[i].name, sc_dtype_name(xd));
    }
    if (!Is && (d->shared_w13_scale.buffer.id || d->shared_w2_scale.buffer.id))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->shared_w13_scale / shared_w2_scale "
                        "are given but shared_intermediate = 0");
    if (!Is && (d->shared_w13.buffer.id || d->shared_w2.buffer.id || d->shared_gate.buffer.id))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->shared_w13 / shared_w2 / shared_gate "
                        "are given but shared_intermediate = 0");
    static const char *const shapes[SCI_MOE_WT_COUNT] = {
        "[E=%llu, H=%llu]", "[E=%llu, 2I=%llu, H=%llu]", "[E=%llu, H=%llu, I=%llu]", "[E=%llu]",
        "[E=%llu]", "[E=%llu, 2I=%llu]", "[E=%llu, H=%llu]", "[2 I_s=%llu, H=%llu]",
        "[H=%llu, I_s=%llu]", "[H=%llu]", "[E=%llu, 2I/128=%llu, H/128=%llu]",
        "[E=%llu, H/128=%llu, I/128=%llu]", "[2 I_s/128=%llu, H/128=%llu]",
        "[H/128=%llu, I_s/128=%llu]"};
    const unsigned long long dims[SCI_MOE_WT_COUNT][3] = {
        {E, H, 0}, {E, 2 * I, H}, {E, H, I}, {E, 0, 0}, {E, 0, 0}, {E, 2 * I, 0}, {E, H, 0},
        {2 * Is, H, 0}, {H, Is, 0}, {H, 0, 0}, {E, 2 * Ib, Hb}, {E, Hb, Ib}, {2 * Isb, Hb, 0},
        {Hb, Isb, 0}};
    for (int i = 0; i < SCI_MOE_WT_COUNT; i++) {
        char shape[96];
        snprintf(shape, sizeof shape, shapes[i], dims[i][0], dims[i][1], dims[i][2]);
        sc_status s = check_weight(w[i].b, w[i].v, w[i].name, w[i].view_name, w[i].required,
                                   w[i].dtype, w[i].count, shape, c, fn, &wt[i]);
        if (s != SC_OK)
            return s;
    }
    return SC_OK;
}

/* What the plans depend on: the layer's shape and backend, the device, and the tuning
 * knobs SAFECUDA_MOE_TILE=small|medium|large|wide (fixes the SM90 tile shape),
 * SAFECUDA_MOE_PDL=0 (no programmatic launches) and SAFECUDA_MOE_GROUP_M=n (1 .. 1024). */
sci_moe_config sci_moe_layer_config(const sc_moe_desc *d, const sci_context *c)
{
    const int S = d->shared_intermediate / d->intermediate;
    sci_moe_config cfg = {.experts = d->experts, .top_k = d->top_k, .hidden = d->hidden,
                          .intermediate = d->intermediate, .shared = S,
                          .groups = d->experts + S, .slots = d->top_k + S,
                          .logit_cols = d->experts + (d->shared_gate.buffer.id != 0),
                          .backend = d->backend, .fp8 = d->expert_dtype == SC_F8E4M3,
                          .sm_count = c->props.sm_count,
                          .tp_scatter = d->tp_output == SC_MOE_TP_REDUCE_SCATTER};
    cfg.tile_override = sci_moe_tile_named(getenv("SAFECUDA_MOE_TILE"));
    const char *pdl_env = getenv("SAFECUDA_MOE_PDL");
    cfg.pdl = !(pdl_env && strcmp(pdl_env, "0") == 0);
    const char *group_env = getenv("SAFECUDA_MOE_GROUP_M");
    cfg.group_override = group_env ? atoi(group_env) : 0;
    if (cfg.group_override < 0 || cfg.group_override > 1024)
        cfg.group_override = 0;
    return cfg;
}

sc_status sci_moe_encode_map_at(sc_view v, uint64_t offset, uint64_t rows, uint64_t cols,
                                uint64_t stride, uint32_t box_rows, sc_tensor_map *map)
{
    const uint64_t span = (rows - 1) * (stride ? stride : cols) + cols;
    sc_buffer_props p;
    sc_status s = sc_buffer_info(v.buffer, &p);
    if (s != SC_OK)
        return s;
    const uint32_t box_cols = (uint32_t)(128 / sc_dtype_size(p.dtype));
    return sc_tensor_map_encode((sc_view){v.buffer, v.offset + offset, span},
                                &(sc_tensor_map_desc){.rows = rows, .cols = cols,
                                                      .box_rows = box_rows, .box_cols = box_cols,
                                                      .swizzle = SC_SWIZZLE_128B,
                                                      .row_stride = stride},
                                map);
}

/* SM90: the tensor maps of the weights, one set per tile shape of the layer's precision. W13's gate rows and up rows
 * are read through two maps, rows_per_expert (2I stacked, I interleaved) apart per routed
 * expert: stacked, the up map starts I rows later; interleaved, both skip every other row
 * (a row stride of 2H) and the up map starts one row later. The shared expert's W13 alike
 * (chunk s at row s I of both), its W2 [H, S I] as one map (chunk s at column s I). */
sc_status sci_moe_encode_weight_maps(sci_moe *m)
{
    const uint64_t E = (uint64_t)m->cfg.experts, H = (uint64_t)m->cfg.hidden;
    const uint64_t I = (uint64_t)m->cfg.intermediate, Is = (uint64_t)m->cfg.shared * I;
    const bool il = m->desc.w13_layout == SC_MOE_W13_INTERLEAVED;
    const sc_view w13 = m->wt[SCI_MOE_WT_W13], sw13 = m->wt[SCI_MOE_WT_SHARED_W13];
    sc_status s = SC_OK;
    uint64_t addr13 = 0, addr2 = 0; /* the routed W13's and W2's device addresses */
    for (int t = 0; t < SCI_MOE_N_TILES && s == SC_OK; t++) {
        if (sci_moe_tiles[t].fp8 != m->cfg.fp8)
            continue;
        const uint32_t bn = (uint32_t)sci_moe_tiles[t].bn;
        if (il) {
            s = sci_moe_encode_map_at(w13, 0, E * I, H, 2 * H, bn / 2, &m->g_map[t]);
            if (s == SC_OK)
                s = sci_moe_encode_map_at(w13, H, E * I, H, 2 * H, bn / 2, &m->u_map[t]);
        } else {
            s = sci_moe_encode_map_at(w13, 0, E * 2 * I - I, H, 0, bn / 2, &m->g_map[t]);
            if (s == SC_OK)
                s = sci_moe_encode_map_at(w13, I * H, E * 2 * I - I, H, 0, bn / 2, &m->u_map[t]);
        }
        if (s == SC_OK)
            s = sci_moe_encode_map_at(m->wt[SCI_MOE_WT_W2], 0, E * H, I, 0, bn, &m->w2_map[t]);
        if (s == SC_OK && Is) {
            if (il) {
                s = sci_moe_encode_map_at(sw13, 0, Is, H, 2 * H, bn / 2, &m->sg_map[t]);
                if (s == SC_OK)
                    s = sci_moe_encode_map_at(sw13, H, Is, H, 2 * H, bn / 2, &m->su_map[t]);
            } else {
                s = sci_moe_encode_map_at(sw13, 0, Is, H, 0, bn / 2, &m->sg_map[t]);
                if (s == SC_OK)
                    s = sci_moe_encode_map_at(sw13, Is * H, Is, H, 0, bn / 2, &m->su_map[t]);
            }
            if (s == SC_OK)
                s = sci_moe_encode_map_at(m->wt[SCI_MOE_WT_SHARED_W2], 0, H, Is, 0, bn, &m->sw2_map[t]);
        } else if (s == SC_OK) { /* never read: the kernels take four maps either way */
            m->sg_map[t] = m->g_map[t];
            m->su_map[t] = m->u_map[t];
            m->sw2_map[t] = m->w2_map[t];
        }
        if (s == SC_OK) {
            addr13 = m->g_map[t].address;
            addr2 = m->w2_map[t].address;
        }
    }
    /* The routed weights' K shift: their misalignment within 128 bytes, in elements (the
     * kernels then start K that much early, so each box starts 128-byte aligned: a
     * checkpoint's views at 16-byte offsets read whole lines): exactly for every row when the
     * rows are a multiple of 128 bytes apart, for the first row's boxes otherwise. bf16
     * only by default: e4m3's shifted kernels (each stage split at the scale blocks'
     * boundaries, moe_sm90a.cu's _ks kernels) are correct but slower than reading the
     * unaligned boxes unshifted (H200, deepseek_v3 views at 16 bytes: T = 16 1.68 against
     * 1.35 ms, T = 16384 28.3 against 26.0), since a shift of 16 mod 32 elements must wait
     * for its register-operand MMA every stage; SAFECUDA_MOE_KSHIFT=fp8 selects them.
     * SAFECUDA_MOE_KSHIFT=0 turns the shift off (for comparisons). */
    if (s == SC_OK) {
        const char *env = getenv("SAFECUDA_MOE_KSHIFT");
        const bool on = !(env && strcmp(env, "0") == 0) &&
                        (!m->cfg.fp8 || (env && strcmp(env, "fp8") == 0));
        const uint64_t es = m->cfg.fp8 ? 1 : 2;
        m->kshift13 = on ? (int)(addr13 % 128 / es) : 0;
        m->kshift2 = on ? (int)(addr2 % 128 / es) : 0;
    }
    return s;
}

