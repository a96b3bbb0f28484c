/* The MoE layer: checks, workspace, and the launches of kernels/moe/ as its plans
 * (plan.c) decide them. Every kernel goes through the checked launch path (argument sizes,
 * stream ordering), like any user kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/moe/moe_config.cuh"
#include "launch/builtin.h"
#include "memory/buffer.h"
#include "moe/ep.h"
#include "moe/issue.h"
#include "moe/layer.h"
#include "moe/plan.h"
#include "moe/tp.h"
#include "safecuda/moe.h"
#include "stream/capture.h"

static sc_status moe_destroy(sci_object *obj, const char *fn);

static void describe_moe(const sci_object *obj, sc_object_info *info)
{
    const sci_moe *m = (const sci_moe *)obj;
    if (m->ep) {
        sci_moe_ep_describe(m, info->detail, sizeof info->detail);
        return;
    }
    snprintf(info->detail, sizeof info->detail,
             "E=%d k=%d H=%d I=%d shared %d, workspace for %llu tokens", m->desc.experts,
             m->desc.top_k, m->desc.hidden, m->desc.intermediate, m->desc.shared_intermediate,
             (unsigned long long)m->capacity);
}

static const sci_kind_ops moe_ops = {"moe layer", describe_moe, moe_destroy};

__attribute__((constructor)) static void register_moe_kind(void)
{
    sci_registry_set_ops(SCI_KIND_MOE, &moe_ops);
}

/* Destroy the workspace buffers (gone either way): the first failure, with its message. */
static sc_status free_workspace(sci_moe *m, const char *fn)
{
    sc_status first = SC_OK;
    char *message = NULL;
    for (int i = 0; i < SCI_MOE_W_COUNT; i++) {
        if (m->ws[i].id) {
            sc_status s = sci_buffer_destroy(m->ws[i].id, fn);
            if (s != SC_OK && first == SC_OK) {
                first = s;
                message = sci_error_save();
            }
        }
        m->ws[i].id = 0;
    }
    m->capacity = 0;
    sci_error_restore(message);
    return first;
}

/* The same on an error path: the error being reported keeps its message. */
static void free_workspace_quietly(sci_moe *m, const char *fn)
{
    char *message = sci_error_save();
    free_workspace(m, fn);
    sci_error_restore(message);
}

static sc_status encode_map(sc_buffer b, uint64_t rows, uint64_t cols, uint32_t box_rows,
                            sc_tensor_map *map)
{
    return sci_moe_encode_map_at(sc_view_of(b), 0, rows, cols, 0, box_rows, map);
}

/* (Re)allocate the workspace for `tokens` tokens on stream (stream-ordered). */
static sc_status grow_workspace(sci_moe *m, uint64_t tokens, sc_stream stream, const char *fn)
{
    uint64_t count[SCI_MOE_W_COUNT];
    sci_moe_workspace_counts(&m->cfg, tokens, count);
    sc_status freed = free_workspace(m, fn);
    if (freed != SC_OK)
        return freed;
    for (int i = 0; i < SCI_MOE_W_COUNT; i++) {
        if (count[i] == 0)
            continue;
        sc_status s = sc_buffer_create_at((sc_context){m->ctx->obj.id},
                                          &(sc_buffer_desc){.dtype = sci_moe_workspace[i].dtype,
                                                            .count = count[i],
                                                            .label = sci_moe_workspace[i].label,
                                                            .zero = sci_moe_workspace[i].zero,
                                                            .stream = stream},
                                          &m->ws[i], __FILE__, __LINE__);
        if (s != SC_OK) {
            free_workspace_quietly(m, fn);
            sci_error_append(" (while sizing the %s workspace for %llu tokens)",
                             m->desc.label ? m->desc.label : "moe",
                             (unsigned long long)tokens);
            return s;
        }
        sci_buffer_set_internal(m->ws[i]);
    }
    if (m->cfg.backend == SC_MOE_BACKEND_SM90 && !m->cfg.route_only) {
        const uint64_t rows = tokens * (uint64_t)m->cfg.slots;
        const uint64_t H = (uint64_t)m->cfg.hidden, I = (uint64_t)m->cfg.intermediate;
        const bool fp8 = m->cfg.fp8;
        for (int t = 0; t < SCI_MOE_N_TILES; t++) {
            if (sci_moe_tiles[t].fp8 != fp8)
                continue;
            const uint32_t a_box = (uint32_t)sci_moe_tiles[t].a_box;
            const uint64_t pad = sci_moe_a_pad(&m->cfg); /* A's rows padded */
            sc_status s = encode_map(m->ws[fp8 ? SCI_MOE_W_XQ : SCI_MOE_W_XPERM], rows, H + pad,
                                     a_box, &m->xperm_map[t]);
            if (s == SC_OK)
                s = encode_map(m->ws[fp8 ? SCI_MOE_W_HQ : SCI_MOE_W_H], rows, I + pad, a_box,
                               &m->h_map[t]);
            if (s != SC_OK) {
                free_workspace_quietly(m, fn);
                sci_error_append(" (while describing the workspace for %llu tokens)",
                                 (unsigned long long)tokens);
                return s;
            }
        }
    }
    m->capacity = tokens;
    return SC_OK;
}

/* The backend's kernels, and on SM90 the tensor maps of the weights, one per tile shape. */
static sc_status load_kernels(sci_moe *m, const char *fn)
{
    sc_status s = SC_OK;
    for (int i = 0; i < SCI_MOE_K_COUNT && s == SC_OK; i++) {
        const sci_moe_kernel_info *ki = &sci_moe_kernels[i];
        if (ki->backend && ki->backend != m->cfg.backend)
            continue;
        s = sci_builtin_kernel(m->ctx, ki->file, ki->name, fn, &m->kernels[i]);
        if (s == SC_OK && ki->smem > 48 * 1024)
            s = sc_kernel_set_max_dynamic_shared(m->kernels[i], ki->smem);
    }
    if (s == SC_OK && m->cfg.backend == SC_MOE_BACKEND_SM90 && !m->cfg.route_only)
        s = sci_moe_encode_weight_maps(m);
    return s;
}

sc_status sci_moe_make(sci_context *c, const sc_moe_desc *desc, unsigned flags, const char *fn,
                       sci_moe **out)
{
    *out = NULL;
    sc_moe_desc d = *desc;
    sc_status s = sci_moe_check_desc(&d, flags, fn);
    if (s == SC_OK)
        s = sci_moe_resolve_backend(&d, c, fn);
    int tp_rank = 0, tp_nranks = 1;
    if (s == SC_OK)
        s = sci_moe_tp_check(&d, c, fn, &tp_rank, &tp_nranks);
    sc_view wt[SCI_MOE_WT_COUNT];
    if (s == SC_OK)
        s = sci_moe_check_weights(&d, c, flags, fn, wt);
    if (s == SC_OK && tp_rank != 0) /* tensor parallel: the expert output bias on rank 0 only */
        wt[SCI_MOE_WT_W2_BIAS] = (sc_view){{0}, 0, 0};
    sci_moe *m = NULL;
    if (s == SC_OK && !(m = calloc(1, sizeof *m)))
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    if (s != SC_OK)
        return s;
    m->ctx = c;
    m->desc = d;
    m->desc.label = NULL;
    memcpy(m->wt, wt, sizeof wt);
    m->tp_rank = tp_rank;
    m->tp_nranks = tp_nranks;
    m->cfg = sci_moe_layer_config(&d, c);
    m->cfg.route_only = flags & SCI_MOE_MAKE_ROUTE_ONLY;
    if (flags & SCI_MOE_MAKE_GATE_COLUMN) /* planned as the layer with its gate column */
        m->cfg.logit_cols++;
    pthread_mutex_init(&m->lock, NULL);
    s = load_kernels(m, fn);
    if (s == SC_OK &&
        (s = sc_buffer_create_at((sc_context){c->obj.id},
                                 &(sc_buffer_desc){.dtype = SC_U32, .count = 4,
                                                   .label = "moe routing faults", .zero = true},
                                 &m->fault, __FILE__, __LINE__)) == SC_OK)
        sci_buffer_set_internal(m->fault);
    if (s == SC_OK)
        s = grow_workspace(m, d.max_tokens ? d.max_tokens : 256, SC_DEFAULT_STREAM, fn);
    if (s != SC_OK) {
        sci_moe_free_quietly(m, fn);
        return s;
    }
    *out = m;
    return SC_OK;
}

sc_status sc_moe_create_at(sc_context ctx, const sc_moe_desc *desc, sc_moe *layer,
                           const char *file, int line)
{
    static const char fn[] = "sc_moe_create";
    SCI_CHECK_PTR(fn, layer);
    layer->id = 0;
    SCI_CHECK_PTR(fn, desc);
    sc_moe_desc d = *desc;
    sc_status s = sci_moe_check_desc(&d, 0, fn);
    if (s != SC_OK)
        return s;
    sci_context *c = NULL;
    if ((s = sci_context_acquire(ctx, fn, &c)) != SC_OK)
        return s;
    sci_moe *m = NULL;
    s = d.ep_comm.id ? sci_moe_ep_make(c, &d, fn, &m) : sci_moe_make(c, &d, 0, fn, &m);
    if (s == SC_OK &&
        (s = sci_registry_insert(&m->obj, SCI_KIND_MOE, c->obj.id, d.label, file, line, fn)) !=
            SC_OK)
        sci_moe_free_quietly(m, fn);
    if (s == SC_OK)
        layer->id = m->obj.id;
    sci_context_release(c);
    return s;
}

sc_status sci_moe_free(sci_moe *m, const char *fn)
{
    sc_status s = m->ep ? sci_moe_ep_free(m, fn) : SC_OK;
    sc_status w = free_workspace(m, fn); /* stream-ordered frees, after the forwards that use them */
    if (s == SC_OK)
        s = w;
    if (m->fault.id) {
        sc_status f = sci_buffer_destroy(m->fault.id, fn);
        if (s == SC_OK)
            s = f;
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
    return s;
}

void sci_moe_free_quietly(sci_moe *m, const char *fn)
{
    if (!m)
        return;
    char *message = sci_error_save();
    sci_moe_free(m, fn);
    sci_error_restore(message);
}

/* The layer's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status moe_destroy(sci_object *obj, const char *fn)
{
    return sci_moe_free((sci_moe *)obj, fn);
}

sc_status sc_moe_destroy(sc_moe layer)
{
    return sci_object_destroy(SCI_KIND_MOE, layer.id, NULL, "sc_moe_destroy");
}

uint64_t sci_moe_workspace_total(sci_moe *m)
{
    pthread_mutex_lock(&m->lock);
    uint64_t total = 0;
    for (int i = 0; i < SCI_MOE_W_COUNT; i++) {
        sc_buffer_props p;
        if (m->ws[i].id && sc_buffer_info(m->ws[i], &p) == SC_OK)
            total += p.bytes;
    }
    pthread_mutex_unlock(&m->lock);
    return total + (m->ep ? sci_moe_ep_workspace_bytes(m) : 0);
}

sc_status sc_moe_workspace_bytes(sc_moe layer, uint64_t *bytes)
{
    static const char fn[] = "sc_moe_workspace_bytes";
    SCI_CHECK_PTR(fn, bytes);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MOE, layer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    *bytes = sci_moe_workspace_total((sci_moe *)obj);
    sci_registry_release(obj);
    return SC_OK;
}

/* Check x: bf16, [T, H], 16-byte aligned rows, T within what one forward takes. Its view
 * (with SC_WHOLE resolved) and T come back. */
static sc_status check_x(const sci_moe *m, sc_view x, const char *fn, sc_view *xv, uint64_t *T)
{
    const int H = m->desc.hidden;
    sc_buffer_props xp;
    sc_status s;
    if ((s = sc_buffer_view(x.buffer, x.offset, x.count, xv)) != SC_OK ||
        (s = sc_buffer_info(x.buffer, &xp)) != SC_OK)
        return s;
    if (xp.context.id != m->ctx->obj.id)
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn, "x (buffer '%s', created at %s:%d) belongs to "
                        "another context than the layer", xp.label, xp.file, xp.line);
    if (xp.dtype != SC_BF16)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn, "x is %s; it must be bf16",
                        sc_dtype_name(xp.dtype));
    if (xv->count == 0 || xv->count % (uint64_t)H)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "x has %llu elements: it must be T x H with H = %d, T >= 1",
                        (unsigned long long)xv->count, H);
    if (xv->offset % SC_MOE_ALIGN)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "x starts at element %llu of its buffer: the kernels read 16-byte "
                        "vectors, so it must start at a multiple of %d",
                        (unsigned long long)xv->offset, SC_MOE_ALIGN);
    *T = xv->count / (uint64_t)H;
    if (!sci_moe_tokens_fit(&m->cfg, *T))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "T = %llu tokens is too many for one forward", (unsigned long long)*T);
    return SC_OK;
}

/* Check x and out: as check_x, and out bf16 of x's shape, writable, 16-byte aligned, not
 * overlapping x. */
sc_status sci_moe_check_io(const sci_moe *m, sc_view x, sc_view out, const char *fn,
                           sc_view *xv, sc_view *ov, uint64_t *T)
{
    sc_buffer_props op;
    sc_status s;
    if ((s = check_x(m, x, fn, xv, T)) != SC_OK ||
        (s = sc_buffer_view(out.buffer, out.offset, out.count, ov)) != SC_OK ||
        (s = sc_buffer_info(out.buffer, &op)) != SC_OK ||
        (s = sci_buffer_check_writable(out.buffer, fn, "out")) != SC_OK)
        return s;
    if (op.dtype != SC_BF16)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn, "out is %s; it must be bf16",
                        sc_dtype_name(op.dtype));
    if (m->cfg.tp_scatter) { /* out: the rank's T / N rows */
        const uint64_t N = (uint64_t)m->tp_nranks;
        if (*T % N)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "x holds T = %llu tokens: a reduce-scattering tensor-parallel layer "
                            "(desc->tp_output) takes a multiple of its %llu ranks",
                            (unsigned long long)*T, (unsigned long long)N);
        if (ov->count != *T / N * (uint64_t)m->desc.hidden)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "out has %llu elements: a reduce-scattering tensor-parallel layer "
                            "writes rank %d's T / N = %llu / %llu rows of H = %d (%llu elements)",
                            (unsigned long long)ov->count, m->tp_rank, (unsigned long long)*T,
                            (unsigned long long)N, m->desc.hidden,
                            (unsigned long long)(*T / N * (uint64_t)m->desc.hidden));
    } else if (ov->count != xv->count) {
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "x has %llu elements and out %llu: both must be T x H with H = %d",
                        (unsigned long long)xv->count, (unsigned long long)ov->count,
                        m->desc.hidden);
    }
    if (ov->offset % SC_MOE_ALIGN)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "out starts at element %llu of its buffer: the kernels write 16-byte "
                        "vectors, so it must start at a multiple of %d",
                        (unsigned long long)ov->offset, SC_MOE_ALIGN);
    if (x.buffer.id == out.buffer.id && xv->offset < ov->offset + ov->count &&
        ov->offset < xv->offset + xv->count)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "out overlaps x");
    return SC_OK;
}

/* Check a [T, k] view the forward reads or writes (the opts->`name` of `dtype`, in the
 * layer's context); its resolved view comes back. */
static sc_status check_tk(const sci_moe *m, sc_view in, const char *name, sc_dtype dtype,
                          uint64_t T, bool written, const char *fn, sc_view *v)
{
    const uint64_t rows = T * (uint64_t)m->desc.top_k;
    sc_buffer_props p;
    sc_status s;
    if ((s = sc_buffer_view(in.buffer, in.offset, in.count, v)) != SC_OK ||
        (s = sc_buffer_info(in.buffer, &p)) != SC_OK ||
        (written && (s = sci_buffer_check_writable(in.buffer, fn, name)) != SC_OK)) {
        sci_error_append(" (%s)", name);
        return s;
    }
    if (p.context.id != m->ctx->obj.id)
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                        "%s (buffer '%s', created at %s:%d) belongs to another context than "
                        "the layer",
                        name, p.label, p.file, p.line);
    if (p.dtype != dtype)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                        "%s (buffer '%s', created at %s:%d) is %s; it must be %s", name, p.label,
                        p.file, p.line, sc_dtype_name(p.dtype), sc_dtype_name(dtype));
    if (v->count != rows)
        return sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                        "%s has %llu elements; T x k = %llu x %d = %llu are %s (buffer '%s', "
                        "created at %s:%d)",
                        name, (unsigned long long)v->count, (unsigned long long)T,
                        m->desc.top_k, (unsigned long long)rows, written ? "written" : "read",
                        p.label, p.file, p.line);
    return SC_OK;
}

/* Check the optional views of a forward before anything is enqueued: the outputs
 * expert_ids (i32) and expert_weights (f32), and the caller's routing (given together). */
sc_status sci_moe_check_opts(const sci_moe *m, const sc_moe_forward_desc *opts, uint64_t T,
                             const char *fn, sc_view *rids, sc_view *rweights)
{
    *rids = *rweights = (sc_view){{0}, 0, 0};
    if (!opts)
        return SC_OK;
    sc_view v;
    sc_status s = SC_OK;
    if (opts->expert_ids.buffer.id)
        s = check_tk(m, opts->expert_ids, "opts->expert_ids", SC_I32, T, true, fn, &v);
    if (s == SC_OK && opts->expert_weights.buffer.id)
        s = check_tk(m, opts->expert_weights, "opts->expert_weights", SC_F32, T, true, fn, &v);
    if (s != SC_OK)
        return s;
    if (!opts->routing_ids.buffer.id != !opts->routing_weights.buffer.id)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "opts->routing_ids and opts->routing_weights go together: %s is given, "
                        "%s is not",
                        opts->routing_ids.buffer.id ? "routing_ids" : "routing_weights",
                        opts->routing_ids.buffer.id ? "routing_weights" : "routing_ids");
    if (opts->routing_ids.buffer.id &&
        ((s = check_tk(m, opts->routing_ids, "opts->routing_ids", SC_I32, T, false, fn, rids)) !=
             SC_OK ||
         (s = check_tk(m, opts->routing_weights, "opts->routing_weights", SC_F32, T, false, fn,
                       rweights)) != SC_OK))
        return s;
    /* The outputs are copies of the routing used: of the caller's, they may be the same
     * views (nothing to copy), not overlap them otherwise. */
    const struct {
        sc_view out, in;
        const char *out_name, *in_name;
    } pairs[2] = {{opts->expert_ids, *rids, "expert_ids", "routing_ids"},
                  {opts->expert_weights, *rweights, "expert_weights", "routing_weights"}};
    for (int i = 0; i < 2; i++) {
        if (!pairs[i].out.buffer.id || !pairs[i].in.buffer.id)
            continue;
        sc_view o;
        if ((s = sc_buffer_view(pairs[i].out.buffer, pairs[i].out.offset, pairs[i].out.count,
                                &o)) != SC_OK)
            return s;
        const sc_view r = pairs[i].in;
        if (o.buffer.id == r.buffer.id && o.offset < r.offset + r.count &&
            r.offset < o.offset + o.count && (o.offset != r.offset || o.count != r.count))
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "opts->%s overlaps opts->%s (the same buffer, elements [%llu, %llu) "
                            "and [%llu, %llu)): it may be the same view, or apart",
                            pairs[i].out_name, pairs[i].in_name, (unsigned long long)o.offset,
                            (unsigned long long)(o.offset + o.count),
                            (unsigned long long)r.offset, (unsigned long long)(r.offset + r.count));
    }
    return SC_OK;
}

/* A forward that must grow its workspace (buffers destroyed and created) or wait for the
 * stream (a profile, a routing check) can't be captured: SC_ERR_CAPTURE before anything is
 * done. */
static sc_status refuse_in_capture(const sci_moe *m, sc_stream stream, uint64_t grow,
                                   uint64_t T, const char *fn)
{
    sci_stream *st = NULL;
    sc_status s = sci_stream_resolve(stream, m->ctx, fn, &st);
    if (s != SC_OK)
        return s;
    char what[200];
    if (grow)
        snprintf(what, sizeof what,
                 "a forward of %llu tokens, which must grow the layer's workspace from %llu "
                 "tokens (reserve it before the capture with sc_moe_reserve),",
                 (unsigned long long)T, (unsigned long long)m->capacity);
    else
        snprintf(what, sizeof what, "a call that waits for the stream (a profile or a routing "
                 "check)");
    s = sci_capture_refuse_stream(st, fn, what);
    sci_stream_release(st);
    return s;
}

sc_status sci_moe_reserve_run(sci_moe *m, sc_stream stream, uint64_t max_tokens, const char *fn)
{
    sc_status s = SC_OK;
    if (max_tokens == 0 || !sci_moe_tokens_fit(&m->cfg, max_tokens)) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "max_tokens = %llu: a forward takes 1 .. the largest T it can index",
                     (unsigned long long)max_tokens);
    } else {
        pthread_mutex_lock(&m->lock);
        if (max_tokens > m->capacity) {
            s = refuse_in_capture(m, stream, max_tokens, max_tokens, fn);
            if (s == SC_OK)
                s = grow_workspace(m, max_tokens, stream, fn);
        }
        pthread_mutex_unlock(&m->lock);
    }
    return s;
}

sc_status sc_moe_reserve(sc_stream stream, sc_moe layer, uint64_t max_tokens)
{
    static const char fn[] = "sc_moe_reserve";
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MOE, layer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_moe *m = (sci_moe *)obj;
    /* (an expert-parallel layer's own checks first: nothing grows when they refuse) */
    if (m->ep)
        s = sci_moe_ep_reserve(m, stream, max_tokens, fn);
    if (s == SC_OK)
        s = sci_moe_reserve_run(m, stream, max_tokens, fn);
    sci_registry_release(obj);
    return s;
}

/* Read the routing fault record on stream (a host wait), report it and clear it. */
static sc_status report_faults(const sci_moe *m, sc_stream stream, const char *fn)
{
    uint32_t rec[4] = {0};
    const uint32_t zero = 0;
    sc_status s = sc_copy_to_host(stream, rec, sizeof rec, sc_view_of(m->fault));
    if (s != SC_OK || rec[0] == 0)
        return s;
    if ((s = sc_fill(stream, sc_view_of(m->fault), &zero)) != SC_OK)
        return s;
    return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                    "opts->routing_ids[%u] (token %u, slot %u) = expert id %d: an expert id must "
                    "be < experts = %d (ids < 0 are padded slots); %u such slot%s skipped",
                    rec[1] * (uint32_t)m->desc.top_k + rec[2], rec[1], rec[2], (int32_t)rec[3],
                    m->desc.experts, rec[0], rec[0] == 1 ? " was" : "s were");
}

sc_status sc_moe_routing_check(sc_stream stream, sc_moe layer)
{
    static const char fn[] = "sc_moe_routing_check";
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MOE, layer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_moe *m = (sci_moe *)obj;
    s = refuse_in_capture(m, stream, 0, 0, fn);
    if (s == SC_OK)
        s = report_faults(m, stream, fn);
    sci_registry_release(obj);
    return s;
}

/* After a stale handle: name the layer's weight whose buffer was destroyed, if one was. */
static void name_stale_weight(const sci_moe *m)
{
    static const char *const names[SCI_MOE_WT_COUNT] = {
        [SCI_MOE_WT_ROUTER] = "router", [SCI_MOE_WT_W13] = "w13", [SCI_MOE_WT_W2] = "w2",
        [SCI_MOE_WT_SEL_BIAS] = "selection_bias", [SCI_MOE_WT_ROUTER_BIAS] = "router_bias",
        [SCI_MOE_WT_W13_BIAS] = "w13_bias", [SCI_MOE_WT_W2_BIAS] = "w2_bias",
        [SCI_MOE_WT_SHARED_W13] = "shared_w13", [SCI_MOE_WT_SHARED_W2] = "shared_w2",
        [SCI_MOE_WT_SHARED_GATE] = "shared_gate", [SCI_MOE_WT_W13_SCALE] = "w13_scale",
        [SCI_MOE_WT_W2_SCALE] = "w2_scale", [SCI_MOE_WT_SHARED_W13_SCALE] = "shared_w13_scale",
        [SCI_MOE_WT_SHARED_W2_SCALE] = "shared_w2_scale"};
    _Static_assert(SCI_MOE_WT_COUNT == 14, "a name for every weight");
    char *message = sci_error_save();
    for (int i = 0; i < SCI_MOE_WT_COUNT; i++) {
        sc_buffer_props p;
        if (m->wt[i].buffer.id && sc_buffer_info(m->wt[i].buffer, &p) == SC_ERR_STALE_HANDLE) {
            sci_error_restore(message);
            sci_error_append(" (the layer's weight desc->%s)", names[i]);
            return;
        }
    }
    sci_error_restore(message);
}

/* After a forward's launches: on a wrapped stream, one point recorded for the whole forward. */
static sc_status mark_wrapped(const sci_moe *m, sc_stream stream, sc_status s, const char *fn)
{
    sci_stream *st = NULL;
    if (sci_stream_resolve(stream, m->ctx, fn, &st) == SC_OK) {
        if (st->wrapped) {
            sc_status mk = sci_stream_mark_wrapped(st, fn);
            if (s == SC_OK)
                s = mk;
        }
        sci_stream_release(st);
    }
    return s;
}

/* The calls that take x [T, H] (forward, route): the plan for T, made with the workspace
 * locked and grown when needed (refused in a capture, as is a call that waits). On SC_OK
 * the lock is held. */
static sc_status begin(sci_moe *m, sc_stream stream, uint64_t T, bool waits, bool caller,
                       const char *fn, sci_moe_plan *plan)
{
    sc_status s = SC_OK;
    sci_moe_plan_make(&m->cfg, T, caller, plan);
    pthread_mutex_lock(&m->lock);
    const uint64_t grow = sci_moe_workspace_grow(m->capacity, T);
    if (grow || waits)
        s = refuse_in_capture(m, stream, grow, T, fn);
    if (s == SC_OK && grow)
        s = grow_workspace(m, grow, stream, fn);
    if (s != SC_OK)
        pthread_mutex_unlock(&m->lock);
    return s;
}

sc_status sci_moe_run(sci_moe *m, sc_stream stream, sc_view x, sc_view out,
                      const sc_moe_forward_desc *opts, uint64_t shared_rows, sc_view xq,
                      sc_view xs, const char *fn)
{
    sc_status s;
    sci_moe_steps st = {opts ? opts->profile : NULL, stream, {m->ctx->obj.id}, {{0}}, 0};
    sci_moe_plan plan;
    /* Tensor parallel: the residual is added on rank 0 only (the others write their partial
     * over out), and the all-reduce sums the partials. Reduce-scattered: every rank's partial
     * goes to the workspace, where each rank's residual rows are put first (issue.c). */
    sci_moe_fwd f = {.m = m, .p = &plan, .stream = stream, .st = &st,
                     .accumulate = opts && opts->accumulate &&
                                   (m->tp_rank == 0 || m->cfg.tp_scatter)};
    uint64_t T = 0;
    sc_view rids, rweights;
    const bool caller = opts && opts->routing_ids.buffer.id;
    const bool waits = opts && (opts->profile || opts->check_routing);
    /* x, out and the options are checked before anything is enqueued (x's T first). */
    if ((s = sci_moe_tp_ready(&m->desc, fn)) == SC_OK &&
        (s = sci_moe_check_io(m, x, out, fn, &f.x, &f.out, &T)) == SC_OK &&
        (s = sci_moe_check_opts(m, opts, T, fn, &rids, &rweights)) == SC_OK &&
        (s = begin(m, stream, T, waits, caller, fn, &plan)) == SC_OK) {
        f.shared_rows = shared_rows < T ? shared_rows : T;
        f.xq = xq;
        f.xs = xs;
        if (m->cfg.tp_scatter) { /* the partial [T, H] in the workspace, then out */
            f.tp_out = f.out;
            f.out = sc_view_of(m->ws[SCI_MOE_W_TP_PART]);
            f.out.count = T * (uint64_t)m->desc.hidden;
        }
        f.ids = caller ? rids : sc_view_of(m->ws[SCI_MOE_W_IDS]);
        f.weights = caller ? rweights : sc_view_of(m->ws[SCI_MOE_W_WEIGHTS]);
        if (!caller) { /* the first T x k of the workspace's */
            f.ids.count = f.weights.count = plan.tokens * (uint64_t)m->desc.top_k;
        }
        /* One point recorded on a wrapped stream after the whole forward, not one per
         * launch (stream/order.h). */
        sci_wrapped_marks_defer(true);
        s = sci_moe_issue(&f, opts);
        sci_wrapped_marks_defer(false);
        s = mark_wrapped(m, stream, s, fn);
        if (s == SC_OK && opts && opts->check_routing)
            s = report_faults(m, stream, fn);
        pthread_mutex_unlock(&m->lock);
    }
    s = sci_moe_steps_finish(&st, s);
    if (s == SC_ERR_STALE_HANDLE)
        name_stale_weight(m);
    if (s != SC_OK && strncmp(sc_last_error(), fn, strlen(fn)) != 0)
        sci_error_append(" (in %s)", fn);
    return s;
}

sc_status sc_moe_forward(sc_stream stream, sc_moe layer, sc_view x, sc_view out,
                         const sc_moe_forward_desc *opts)
{
    static const char fn[] = "sc_moe_forward";
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MOE, layer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_moe *m = (sci_moe *)obj;
    s = m->ep ? sci_moe_ep_forward(m, stream, x, out, opts, fn)
              : sci_moe_run(m, stream, x, out, opts, UINT64_MAX, (sc_view){{0}, 0, 0},
                            (sc_view){{0}, 0, 0}, fn);
    sci_registry_release(obj);
    return s;
}

sc_status sci_moe_route_run(sci_moe *m, sc_stream stream, sc_view x, sc_view ids,
                            sc_view weights, const char *fn)
{
    sc_status s;
    sci_moe_steps st = {NULL, stream, {m->ctx->obj.id}, {{0}}, 0};
    sci_moe_plan plan;
    sci_moe_fwd f = {.m = m, .p = &plan, .stream = stream, .st = &st};
    uint64_t T = 0;
    if ((s = check_x(m, x, fn, &f.x, &T)) == SC_OK &&
        (s = check_tk(m, ids, "ids", SC_I32, T, true, fn, &f.ids)) == SC_OK &&
        (s = check_tk(m, weights, "weights", SC_F32, T, true, fn, &f.weights)) == SC_OK &&
        (s = begin(m, stream, T, false, false, fn, &plan)) == SC_OK) {
        {
            sci_wrapped_marks_defer(true);
            s = sci_moe_issue_routing(&f);
            sci_wrapped_marks_defer(false);
            s = mark_wrapped(m, stream, s, fn);
        }
        pthread_mutex_unlock(&m->lock);
    }
    if (s == SC_ERR_STALE_HANDLE)
        name_stale_weight(m);
    if (s != SC_OK && strncmp(sc_last_error(), fn, strlen(fn)) != 0)
        sci_error_append(" (in %s)", fn);
    return s;
}

sc_status sc_moe_route(sc_stream stream, sc_moe layer, sc_view x, sc_view ids, sc_view weights)
{
    static const char fn[] = "sc_moe_route";
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MOE, layer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    s = sci_moe_route_run((sci_moe *)obj, stream, x, ids, weights, fn);
    sci_registry_release(obj);
    return s;
}
