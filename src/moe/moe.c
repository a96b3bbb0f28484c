/* The MoE layer: checks, workspace, and the launches of kernels/moe/ as its plans
 * (plan.c) decide them. Every kernel goes through the checked launch path (argument sizes,
 * stream ordering), like any user kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/moe/moe_config.cuh"
#include "launch/builtin.h"
#include "memory/buffer.h"
#include "moe/plan.h"
#include "safecuda/moe.h"
#include "stream/capture.h"

typedef struct sci_moe {
    sci_object obj;
    sci_context *ctx;
    sc_moe_desc desc;
    sci_moe_config cfg; /* what the plans depend on: shape, backend, device, tuning */
    sc_kernel kernels[SCI_MOE_K_COUNT];
    pthread_mutex_t lock; /* the workspace */
    uint64_t capacity;    /* tokens */
    sc_buffer ws[SCI_MOE_W_COUNT];
    /* SM90: maps of the weights (made once) and of x_perm and h (made with the workspace),
     * one per tile shape. */
    sc_tensor_map w13_map[SCI_MOE_N_TILES], w2_map[SCI_MOE_N_TILES];
    sc_tensor_map xperm_map[SCI_MOE_N_TILES], h_map[SCI_MOE_N_TILES];
} sci_moe;

static sc_status moe_destroy(uint64_t id, const char *fn);

static void describe_moe(const sci_object *obj, sc_object_info *info)
{
    const sci_moe *m = (const sci_moe *)obj;
    snprintf(info->detail, sizeof info->detail, "E=%d k=%d H=%d I=%d, workspace for %llu tokens",
             m->desc.experts, m->desc.top_k, m->desc.hidden, m->desc.intermediate,
             (unsigned long long)m->capacity);
}

static sc_status destroy_leaked_moe(uint64_t id)
{
    return moe_destroy(id, "sc_context_destroy");
}

static const sci_kind_ops moe_ops = {"moe layer", describe_moe, destroy_leaked_moe};

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

/* A tensor map of a bf16 [rows, cols] buffer in boxes of box_rows x 64 (128-byte rows, the
 * 128-byte swizzle), as the SM90 kernels read A and B tiles. */
static sc_status encode_map(sc_buffer b, uint64_t rows, uint64_t cols, uint32_t box_rows,
                            sc_tensor_map *map)
{
    return sc_tensor_map_encode(sc_view_of(b),
                                &(sc_tensor_map_desc){.rows = rows, .cols = cols,
                                                      .box_rows = box_rows, .box_cols = 64,
                                                      .swizzle = SC_SWIZZLE_128B},
                                map);
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
    if (m->cfg.backend == SC_MOE_BACKEND_SM90) {
        const uint64_t rows = tokens * (uint64_t)m->cfg.top_k;
        const uint64_t H = (uint64_t)m->cfg.hidden, I = (uint64_t)m->cfg.intermediate;
        for (int t = 0; t < SCI_MOE_N_TILES; t++) {
            const uint32_t a_box = (uint32_t)sci_moe_tiles[t].a_box;
            sc_status s = encode_map(m->ws[SCI_MOE_W_XPERM], rows, H, a_box, &m->xperm_map[t]);
            if (s == SC_OK)
                s = encode_map(m->ws[SCI_MOE_W_H], rows, I, a_box, &m->h_map[t]);
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

/* Check a weight buffer's dtype and element count. */
static sc_status check_weight(sc_buffer b, const char *what, sc_dtype dtype, uint64_t count,
                              const char *shape, sci_context *c, const char *fn)
{
    sc_buffer_props p;
    sc_status s = sc_buffer_info(b, &p);
    if (s != SC_OK) {
        sci_error_append(" (desc->%s)", what);
        return s;
    }
    if (p.context.id != c->obj.id)
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn, "desc->%s (buffer '%s') belongs to another "
                        "context", what, p.label);
    if (p.dtype != dtype)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn, "desc->%s (buffer '%s', created at %s:%d) is "
                        "%s; the layer needs %s",
                        what, p.label, p.file, p.line, sc_dtype_name(p.dtype),
                        sc_dtype_name(dtype));
    if (p.count != count)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->%s (buffer '%s', created at %s:%d) has %llu elements; %s needs "
                        "%llu",
                        what, p.label, p.file, p.line, (unsigned long long)p.count, shape,
                        (unsigned long long)count);
    return SC_OK;
}

/* Check the layer's shape and options (the dtype defaulted to bf16). */
static sc_status check_desc(sc_moe_desc *d, const char *fn)
{
    if (d->dtype == SC_DTYPE_INVALID)
        d->dtype = SC_BF16;
    if ((unsigned)d->backend > SC_MOE_BACKEND_SM90)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "backend = %d", (int)d->backend);
    const int E = d->experts, k = d->top_k, H = d->hidden, I = d->intermediate;
    if (d->dtype != SC_BF16)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn, "dtype %s: the MoE kernels take bf16",
                        sc_dtype_name(d->dtype));
    if (E < 1 || E > SC_MOE_MAX_EXPERTS)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "experts = %d (1 .. %d)", E,
                        SC_MOE_MAX_EXPERTS);
    if (k < 1 || k > E || k > SC_MOE_MAX_TOPK)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "top_k = %d: it must be 1 .. min(experts "
                        "= %d, %d)", k, E, SC_MOE_MAX_TOPK);
    if (H <= 0 || H % SC_MOE_ALIGN)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "hidden = %d: the kernels need a positive "
                        "multiple of %d", H, SC_MOE_ALIGN);
    if (I <= 0 || I % SC_MOE_ALIGN)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "intermediate = %d: the kernels need a "
                        "positive multiple of %d", I, SC_MOE_ALIGN);
    if (d->scoring != SC_MOE_SOFTMAX && d->scoring != SC_MOE_SIGMOID)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "scoring = %d", (int)d->scoring);
    return SC_OK;
}

/* Resolve the backend for the context's device (AUTO: SM90 on 9.0, MMA elsewhere), or
 * refuse the device. */
static sc_status resolve_backend(sc_moe_desc *d, const sci_context *c, const char *fn)
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
    return SC_OK;
}

/* The weights' dtypes and element counts. */
static sc_status check_weights(const sc_moe_desc *d, sci_context *c, const char *fn)
{
    const int E = d->experts, H = d->hidden, I = d->intermediate;
    char shape[96];
    snprintf(shape, sizeof shape, "[E=%d, H=%d]", E, H);
    sc_status s = check_weight(d->router, "router", SC_BF16, (uint64_t)E * H, shape, c, fn);
    if (s == SC_OK) {
        snprintf(shape, sizeof shape, "[E=%d, 2I=%d, H=%d]", E, 2 * I, H);
        s = check_weight(d->w13, "w13", SC_BF16, (uint64_t)E * 2 * I * H, shape, c, fn);
    }
    if (s == SC_OK) {
        snprintf(shape, sizeof shape, "[E=%d, H=%d, I=%d]", E, H, I);
        s = check_weight(d->w2, "w2", SC_BF16, (uint64_t)E * H * I, shape, c, fn);
    }
    if (s == SC_OK && d->selection_bias.id) {
        snprintf(shape, sizeof shape, "[E=%d]", E);
        s = check_weight(d->selection_bias, "selection_bias", SC_F32, (uint64_t)E, shape, c, fn);
    }
    return s;
}

/* What the plans depend on: the layer's shape and backend, the device, and the tuning
 * knobs SAFECUDA_MOE_TILE=small|medium|large|wide (fixes the SM90 tile shape),
 * SAFECUDA_MOE_PDL=0 (no programmatic launches) and SAFECUDA_MOE_GROUP_M=n (1 .. 1024). */
static sci_moe_config layer_config(const sc_moe_desc *d, const sci_context *c)
{
    sci_moe_config cfg = {.experts = d->experts, .top_k = d->top_k, .hidden = d->hidden,
                          .intermediate = d->intermediate, .backend = d->backend,
                          .sm_count = c->props.sm_count};
    cfg.tile_override = sci_moe_tile_named(getenv("SAFECUDA_MOE_TILE"));
    const char *pdl_env = getenv("SAFECUDA_MOE_PDL");
    cfg.pdl = !(pdl_env && strcmp(pdl_env, "0") == 0);
    const char *group_env = getenv("SAFECUDA_MOE_GROUP_M");
    cfg.group_override = group_env ? atoi(group_env) : 0;
    if (cfg.group_override < 0 || cfg.group_override > 1024)
        cfg.group_override = 0;
    return cfg;
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
    const sc_moe_desc *d = &m->desc;
    const uint64_t E = (uint64_t)d->experts, H = (uint64_t)d->hidden;
    const uint64_t I = (uint64_t)d->intermediate;
    for (int t = 0; t < SCI_MOE_N_TILES && s == SC_OK && m->cfg.backend == SC_MOE_BACKEND_SM90;
         t++) {
        const uint32_t bn = (uint32_t)sci_moe_tiles[t].bn;
        s = encode_map(d->w13, E * 2 * I, H, bn / 2, &m->w13_map[t]);
        if (s == SC_OK)
            s = encode_map(d->w2, E * H, I, bn, &m->w2_map[t]);
    }
    return s;
}

sc_status sc_moe_create_at(sc_context ctx, const sc_moe_desc *desc, sc_moe *layer,
                           const char *file, int line)
{
    static const char fn[] = "sc_moe_create";
    SCI_CHECK_PTR(fn, layer);
    layer->id = 0;
    SCI_CHECK_PTR(fn, desc);
    sc_moe_desc d = *desc;
    sc_status s = check_desc(&d, fn);
    if (s != SC_OK)
        return s;
    sci_context *c = NULL;
    if ((s = sci_context_acquire(ctx, fn, &c)) != SC_OK)
        return s;
    s = resolve_backend(&d, c, fn);
    if (s == SC_OK)
        s = check_weights(&d, c, fn);
    sci_moe *m = NULL;
    if (s == SC_OK && !(m = calloc(1, sizeof *m)))
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    if (s != SC_OK) {
        sci_context_release(c);
        return s;
    }
    m->ctx = c;
    m->desc = d;
    m->desc.label = NULL;
    m->cfg = layer_config(&d, c);
    pthread_mutex_init(&m->lock, NULL);
    s = load_kernels(m, fn);
    if (s == SC_OK)
        s = grow_workspace(m, d.max_tokens ? d.max_tokens : 256, SC_DEFAULT_STREAM, fn);
    if (s == SC_OK)
        s = sci_registry_insert(&m->obj, SCI_KIND_MOE, c->obj.id, d.label, file, line, fn);
    if (s != SC_OK) {
        free_workspace_quietly(m, fn);
        pthread_mutex_destroy(&m->lock);
        free(m);
    } else {
        layer->id = m->obj.id;
    }
    sci_context_release(c);
    return s;
}

static sc_status moe_destroy(uint64_t id, const char *fn)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_remove(SCI_KIND_MOE, id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_moe *m = (sci_moe *)obj;
    s = free_workspace(m, fn); /* stream-ordered frees, after the forwards that use them */
    pthread_mutex_destroy(&m->lock);
    free(m);
    return s;
}

sc_status sc_moe_destroy(sc_moe layer)
{
    static const char fn[] = "sc_moe_destroy";
    sci_context *pin = NULL; /* the context outlives the destroy (as for a buffer's) */
    sc_status s = sci_context_pin(SCI_KIND_MOE, layer.id, fn, &pin);
    if (s != SC_OK)
        return s;
    s = moe_destroy(layer.id, fn);
    sci_context_unpin(pin);
    return s;
}

sc_status sc_moe_workspace_bytes(sc_moe layer, uint64_t *bytes)
{
    static const char fn[] = "sc_moe_workspace_bytes";
    SCI_CHECK_PTR(fn, bytes);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MOE, layer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_moe *m = (sci_moe *)obj;
    pthread_mutex_lock(&m->lock);
    uint64_t total = 0;
    for (int i = 0; i < SCI_MOE_W_COUNT; i++) {
        sc_buffer_props p;
        if (m->ws[i].id && sc_buffer_info(m->ws[i], &p) == SC_OK)
            total += p.bytes;
    }
    pthread_mutex_unlock(&m->lock);
    *bytes = total;
    sci_registry_release(obj);
    return SC_OK;
}

static sc_view whole(sc_buffer b) { return sc_view_of(b); }

/* The steps of a forward, timed when a profile is asked for: an event before each step and
 * one after the last. */
typedef struct steps {
    sc_moe_profile *prof;
    sc_stream stream;
    sc_context ctx;
    sc_event ev[SC_MOE_MAX_STEPS + 1];
    int n;
} steps;

static sc_status step(steps *st, const char *name)
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

/* Close the last step, wait, and fill the profile. Destroys the events either way. */
static sc_status steps_finish(steps *st, sc_status s)
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

/* Check x and out: bf16, the same shape [T, H], 16-byte aligned rows, not overlapping, T
 * within what one forward takes. Their views (with SC_WHOLE resolved) and T come back. */
static sc_status check_io(const sci_moe *m, sc_view x, sc_view out, const char *fn,
                          sc_view *xv, sc_view *ov, uint64_t *T)
{
    const int H = m->desc.hidden;
    sc_buffer_props xp, op;
    sc_status s;
    if ((s = sc_buffer_view(x.buffer, x.offset, x.count, xv)) != SC_OK ||
        (s = sc_buffer_view(out.buffer, out.offset, out.count, ov)) != SC_OK ||
        (s = sc_buffer_info(x.buffer, &xp)) != SC_OK ||
        (s = sc_buffer_info(out.buffer, &op)) != SC_OK ||
        (s = sci_buffer_check_writable(out.buffer, fn, "out")) != SC_OK)
        return s;
    if (xp.dtype != SC_BF16 || op.dtype != SC_BF16)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn, "x is %s and out is %s; both must be bf16",
                        sc_dtype_name(xp.dtype), sc_dtype_name(op.dtype));
    if (xv->count == 0 || xv->count % (uint64_t)H || ov->count != xv->count)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "x has %llu elements and out %llu: both must be T x H with H = %d, "
                        "T >= 1",
                        (unsigned long long)xv->count, (unsigned long long)ov->count, H);
    if (xv->offset % SC_MOE_ALIGN || ov->offset % SC_MOE_ALIGN)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "x starts at element %llu and out at %llu of their buffers: the "
                        "kernels read and write 16-byte vectors, so both must start at a "
                        "multiple of %d",
                        (unsigned long long)xv->offset, (unsigned long long)ov->offset,
                        SC_MOE_ALIGN);
    if (x.buffer.id == out.buffer.id && xv->offset < ov->offset + ov->count &&
        ov->offset < xv->offset + xv->count)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "out overlaps x");
    *T = xv->count / (uint64_t)H;
    if (!sci_moe_tokens_fit(&m->cfg, *T))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "T = %llu tokens is too many for one forward", (unsigned long long)*T);
    return SC_OK;
}

/* Check the optional outputs before anything is enqueued: expert_ids i32 and
 * expert_weights f32, each T x k elements, in the layer's context. */
static sc_status check_outputs(const sci_moe *m, const sc_moe_forward_desc *opts, uint64_t T,
                               const char *fn)
{
    const struct {
        sc_view v;
        const char *name;
        sc_dtype dtype;
    } outs[2] = {{opts ? opts->expert_ids : (sc_view){{0}, 0, 0}, "expert_ids", SC_I32},
                 {opts ? opts->expert_weights : (sc_view){{0}, 0, 0}, "expert_weights", SC_F32}};
    const uint64_t rows = T * (uint64_t)m->desc.top_k;
    for (int i = 0; i < 2; i++) {
        if (!outs[i].v.buffer.id)
            continue;
        sc_view v;
        sc_buffer_props p;
        sc_status s;
        if ((s = sc_buffer_view(outs[i].v.buffer, outs[i].v.offset, outs[i].v.count, &v)) !=
                SC_OK ||
            (s = sc_buffer_info(outs[i].v.buffer, &p)) != SC_OK ||
            (s = sci_buffer_check_writable(outs[i].v.buffer, fn, outs[i].name)) != SC_OK)
            return s;
        if (p.context.id != m->ctx->obj.id)
            return sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                            "opts->%s (buffer '%s', created at %s:%d) belongs to another "
                            "context than the layer",
                            outs[i].name, p.label, p.file, p.line);
        if (p.dtype != outs[i].dtype)
            return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                            "opts->%s (buffer '%s', created at %s:%d) is %s; it must be %s",
                            outs[i].name, p.label, p.file, p.line, sc_dtype_name(p.dtype),
                            sc_dtype_name(outs[i].dtype));
        if (v.count != rows)
            return sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                            "opts->%s has %llu elements; T x k = %llu x %d = %llu are written "
                            "(buffer '%s', created at %s:%d)",
                            outs[i].name, (unsigned long long)v.count, (unsigned long long)T,
                            m->desc.top_k, (unsigned long long)rows, p.label, p.file, p.line);
    }
    return SC_OK;
}

/* A forward being issued: the layer (its workspace locked), the plan, the stream, the
 * checked views of x and out, the selection bias (or the workspace's zero bias), and
 * the profile's steps. */
typedef struct forward {
    const sci_moe *m;
    const sci_moe_plan *p;
    sc_stream stream;
    sc_view x, out, bias;
    steps *st;
} forward;

/* The whole of workspace buffer w. */
static sc_view ws(const forward *f, sci_moe_ws w) { return sc_view_of(f->m->ws[w]); }

/* Routing in one launch, then (SM90, when it doesn't gather) x into expert order. */
static sc_status issue_route_small(const forward *f)
{
    const sc_moe_desc *d = &f->m->desc;
    const sci_moe_plan *p = f->p;
    const sc_kernel *kn = f->m->kernels;
    const bool sm90 = f->m->cfg.backend == SC_MOE_BACKEND_SM90;
    sc_status s;
    if ((s = step(f->st, "route (small T)")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_ROUTE_SMALL], &p->route, sc_arg_in(f->x),
                       sc_arg_in(whole(d->router)), sc_arg_in(f->bias),
                       sc_arg_out(ws(f, SCI_MOE_W_LOGITS)), sc_arg_out(ws(f, SCI_MOE_W_IDS)),
                       sc_arg_out(ws(f, SCI_MOE_W_WEIGHTS)), sc_arg_out(ws(f, SCI_MOE_W_ROW_OFF)),
                       sc_arg_out(ws(f, SCI_MOE_W_TILE_OFF)),
                       sc_arg_out(ws(f, SCI_MOE_W_PERM_TOKEN)),
                       sc_arg_out(ws(f, SCI_MOE_W_PERM_WEIGHT)), sc_arg_out(ws(f, SCI_MOE_W_POS)),
                       sc_arg_out(ws(f, sm90 ? SCI_MOE_W_XPERM : SCI_MOE_W_H)),
                       sc_arg_inout(ws(f, SCI_MOE_W_TICKET)), sc_arg_i32((int32_t)p->tokens),
                       sc_arg_i32(d->experts), sc_arg_i32(d->top_k), sc_arg_i32(d->hidden),
                       sc_arg_i32(d->scoring == SC_MOE_SIGMOID), sc_arg_i32(d->renormalize),
                       sc_arg_i32(d->selection_bias.id != 0),
                       sc_arg_i32(p->route_gathers))) != SC_OK)
        return s;
    if (p->gather.grid.x == 0)
        return SC_OK;
    if ((s = step(f->st, "gather x")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_GATHER], &p->gather,
                       sc_arg_in(ws(f, SCI_MOE_W_PERM_TOKEN)), sc_arg_in(f->x),
                       sc_arg_out(ws(f, SCI_MOE_W_XPERM)), sc_arg_i32((int32_t)p->rows),
                       sc_arg_i32(d->hidden))) != SC_OK)
        return s;
    return SC_OK;
}

/* The permutation into expert order (rows grouped by expert), and on SM90 x gathered
 * into that order with it. */
static sc_status issue_scatter(const forward *f)
{
    const sci_moe_plan *p = f->p;
    const sc_kernel *kn = f->m->kernels;
    const int32_t T = (int32_t)p->tokens, k = f->m->desc.top_k;
    sc_status s;
    if (f->m->cfg.backend == SC_MOE_BACKEND_SM90) {
        if ((s = step(f->st, "scatter + gather x")) != SC_OK ||
            (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_SCATTER_GATHER], &p->scatter,
                           sc_arg_in(ws(f, SCI_MOE_W_IDS)), sc_arg_in(ws(f, SCI_MOE_W_WEIGHTS)),
                           sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)),
                           sc_arg_inout(ws(f, SCI_MOE_W_CURSOR)),
                           sc_arg_out(ws(f, SCI_MOE_W_PERM_TOKEN)),
                           sc_arg_out(ws(f, SCI_MOE_W_PERM_WEIGHT)),
                           sc_arg_out(ws(f, SCI_MOE_W_POS)), sc_arg_in(f->x),
                           sc_arg_out(ws(f, SCI_MOE_W_XPERM)), sc_arg_i32(T), sc_arg_i32(k),
                           sc_arg_i32(f->m->desc.hidden))) != SC_OK)
            return s;
        return SC_OK;
    }
    if ((s = step(f->st, "scatter")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_SCATTER], &p->scatter,
                       sc_arg_in(ws(f, SCI_MOE_W_IDS)), sc_arg_in(ws(f, SCI_MOE_W_WEIGHTS)),
                       sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_inout(ws(f, SCI_MOE_W_CURSOR)),
                       sc_arg_out(ws(f, SCI_MOE_W_PERM_TOKEN)),
                       sc_arg_out(ws(f, SCI_MOE_W_PERM_WEIGHT)), sc_arg_out(ws(f, SCI_MOE_W_POS)),
                       sc_arg_i32(T), sc_arg_i32(k))) != SC_OK)
        return s;
    return SC_OK;
}

/* Routing in steps: expert counts zeroed, router GEMM (split over H), scores and top-k
 * (counting the rows of each expert), offsets, then the scatter. */
static sc_status issue_route(const forward *f)
{
    const sc_moe_desc *d = &f->m->desc;
    const sci_moe_plan *p = f->p;
    const sc_kernel *kn = f->m->kernels;
    const int32_t T = (int32_t)p->tokens, zero = 0;
    sc_status s;
    if ((s = step(f->st, "zero counts")) != SC_OK ||
        (s = sc_fill(f->stream, ws(f, SCI_MOE_W_COUNTS), &zero)) != SC_OK)
        return s;
    if ((s = step(f->st, "router gemm")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_ROUTER], &p->router, sc_arg_in(f->x),
                       sc_arg_in(whole(d->router)), sc_arg_out(ws(f, SCI_MOE_W_LOGITS)),
                       sc_arg_i32(T), sc_arg_i32(d->experts), sc_arg_i32(d->hidden),
                       sc_arg_i32(p->router_k_chunk))) != SC_OK)
        return s;
    if ((s = step(f->st, "scores + top-k")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_TOPK], &p->topk,
                       sc_arg_in(ws(f, SCI_MOE_W_LOGITS)), sc_arg_in(f->bias),
                       sc_arg_out(ws(f, SCI_MOE_W_IDS)), sc_arg_out(ws(f, SCI_MOE_W_WEIGHTS)),
                       sc_arg_inout(ws(f, SCI_MOE_W_COUNTS)), sc_arg_i32(T),
                       sc_arg_i32(d->experts), sc_arg_i32(d->top_k),
                       sc_arg_i32(d->scoring == SC_MOE_SIGMOID), sc_arg_i32(d->renormalize),
                       sc_arg_i32(d->selection_bias.id != 0),
                       sc_arg_i32(p->router_splits))) != SC_OK)
        return s;
    if ((s = step(f->st, "offsets")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, kn[SCI_MOE_K_OFFSETS], &p->offsets,
                       sc_arg_in(ws(f, SCI_MOE_W_COUNTS)), sc_arg_out(ws(f, SCI_MOE_W_ROW_OFF)),
                       sc_arg_out(ws(f, SCI_MOE_W_TILE_OFF)), sc_arg_out(ws(f, SCI_MOE_W_CURSOR)),
                       sc_arg_i32(d->experts))) != SC_OK)
        return s;
    return issue_scatter(f);
}

/* The expert GEMMs in the plan's kernels: h = silu(x W1^T) * (x W3^T), then y = weight *
 * (h W2^T), rows in expert order. SM90 reads A and B through tensor maps of the plan's
 * tile shape; MMA reads x through the permutation. */
static sc_status issue_gemms(const forward *f)
{
    const sci_moe *m = f->m;
    const sc_moe_desc *d = &m->desc;
    const sci_moe_plan *p = f->p;
    const int E = d->experts, H = d->hidden, I = d->intermediate, t = p->tile;
    sc_status s;
    if (m->cfg.backend == SC_MOE_BACKEND_SM90) {
        if ((s = step(f->st, p->step13)) != SC_OK ||
            (s = SC_LAUNCH(f->stream, m->kernels[p->k13], &p->w13,
                           sc_arg_tensor_map_in(&m->xperm_map[t]),
                           sc_arg_tensor_map_in(&m->w13_map[t]), sc_arg_out(ws(f, SCI_MOE_W_H)),
                           sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_i32(E), sc_arg_i32(I),
                           sc_arg_i32(H), sc_arg_i32(p->group_m13))) != SC_OK)
            return s;
        if ((s = step(f->st, p->step2)) != SC_OK ||
            (s = SC_LAUNCH(f->stream, m->kernels[p->k2], &p->w2,
                           sc_arg_tensor_map_in(&m->h_map[t]),
                           sc_arg_tensor_map_in(&m->w2_map[t]),
                           sc_arg_in(ws(f, SCI_MOE_W_PERM_WEIGHT)), sc_arg_out(ws(f, SCI_MOE_W_Y)),
                           sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_i32(E), sc_arg_i32(H),
                           sc_arg_i32(I), sc_arg_i32(p->group_m2))) != SC_OK)
            return s;
        return SC_OK;
    }
    if ((s = step(f->st, p->step13)) != SC_OK ||
        (s = SC_LAUNCH(f->stream, m->kernels[p->k13], &p->w13, sc_arg_in(f->x),
                       sc_arg_in(ws(f, SCI_MOE_W_PERM_TOKEN)), sc_arg_in(whole(d->w13)),
                       sc_arg_out(ws(f, SCI_MOE_W_H)), sc_arg_in(ws(f, SCI_MOE_W_TILE_OFF)),
                       sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_i32(E), sc_arg_i32(I),
                       sc_arg_i32(H))) != SC_OK)
        return s;
    if ((s = step(f->st, p->step2)) != SC_OK ||
        (s = SC_LAUNCH(f->stream, m->kernels[p->k2], &p->w2, sc_arg_in(ws(f, SCI_MOE_W_H)),
                       sc_arg_in(whole(d->w2)), sc_arg_in(ws(f, SCI_MOE_W_PERM_WEIGHT)),
                       sc_arg_out(ws(f, SCI_MOE_W_Y)), sc_arg_in(ws(f, SCI_MOE_W_TILE_OFF)),
                       sc_arg_in(ws(f, SCI_MOE_W_ROW_OFF)), sc_arg_i32(E), sc_arg_i32(H),
                       sc_arg_i32(I))) != SC_OK)
        return s;
    return SC_OK;
}

/* out = the weighted sum of each token's expert outputs; then the optional copies of the
 * chosen experts and their weights. */
static sc_status issue_combine(const forward *f, const sc_moe_forward_desc *opts)
{
    const sci_moe_plan *p = f->p;
    sc_status s;
    if ((s = step(f->st, "combine")) != SC_OK ||
        (s = SC_LAUNCH(f->stream, f->m->kernels[SCI_MOE_K_COMBINE], &p->combine,
                       sc_arg_in(ws(f, SCI_MOE_W_Y)), sc_arg_in(ws(f, SCI_MOE_W_POS)),
                       sc_arg_out(f->out), sc_arg_i32((int32_t)p->tokens),
                       sc_arg_i32(f->m->desc.top_k), sc_arg_i32(f->m->desc.hidden))) != SC_OK)
        return s;
    sc_view src;
    if (opts && opts->expert_ids.buffer.id &&
        ((s = sc_buffer_view(f->m->ws[SCI_MOE_W_IDS], 0, p->rows, &src)) != SC_OK ||
         (s = sc_copy(f->stream, opts->expert_ids, src)) != SC_OK))
        return s;
    if (opts && opts->expert_weights.buffer.id &&
        ((s = sc_buffer_view(f->m->ws[SCI_MOE_W_WEIGHTS], 0, p->rows, &src)) != SC_OK ||
         (s = sc_copy(f->stream, opts->expert_weights, src)) != SC_OK))
        return s;
    return SC_OK;
}

/* The plan's launches in order, on the workspace (locked, large enough). */
static sc_status issue(forward *f, const sc_moe_forward_desc *opts)
{
    const sc_moe_desc *d = &f->m->desc;
    f->bias = d->selection_bias.id ? whole(d->selection_bias) : ws(f, SCI_MOE_W_NO_BIAS);
    sc_status s = f->p->route_small ? issue_route_small(f) : issue_route(f);
    if (s == SC_OK)
        s = issue_gemms(f);
    if (s == SC_OK)
        s = issue_combine(f, opts);
    return s;
}

/* A forward that must grow its workspace (buffers destroyed and created) or time its steps
 * (a host wait) can't be captured: SC_ERR_CAPTURE before anything is done. */
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
        snprintf(what, sizeof what, "a forward with a profile (it waits for the stream)");
    s = sci_capture_refuse_stream(st, fn, what);
    sci_stream_release(st);
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
    sci_registry_release(obj);
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
    steps st = {opts ? opts->profile : NULL, stream, {m->ctx->obj.id}, {{0}}, 0};
    sci_moe_plan plan;
    forward f = {.m = m, .p = &plan, .stream = stream, .st = &st};
    uint64_t T = 0;
    if ((s = check_io(m, x, out, fn, &f.x, &f.out, &T)) == SC_OK &&
        (s = check_outputs(m, opts, T, fn)) == SC_OK) {
        sci_moe_plan_make(&m->cfg, T, &plan);
        pthread_mutex_lock(&m->lock);
        const uint64_t grow = sci_moe_workspace_grow(m->capacity, T);
        if (grow || (opts && opts->profile))
            s = refuse_in_capture(m, stream, grow, T, fn);
        if (s == SC_OK && grow)
            s = grow_workspace(m, grow, stream, fn);
        if (s == SC_OK) {
            /* One point recorded on a wrapped stream after the whole forward, not one per
             * launch (stream/order.h). */
            sci_wrapped_marks_defer(true);
            s = issue(&f, opts);
            sci_wrapped_marks_defer(false);
            sci_stream *ws = NULL;
            if (sci_stream_resolve(stream, m->ctx, fn, &ws) == SC_OK) {
                if (ws->wrapped) {
                    sc_status mk = sci_stream_mark_wrapped(ws, fn);
                    if (s == SC_OK)
                        s = mk;
                }
                sci_stream_release(ws);
            }
        }
        pthread_mutex_unlock(&m->lock);
    }
    s = steps_finish(&st, s);
    if (s != SC_OK && strncmp(sc_last_error(), fn, strlen(fn)) != 0)
        sci_error_append(" (in %s)", fn);
    sci_registry_release(obj);
    return s;
}
