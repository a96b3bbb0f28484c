/* The MoE layer: checks, workspace, and the launch sequence of kernels/moe/moe.cu. Every
 * kernel goes through the checked launch path (argument sizes, stream ordering), like any
 * user kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/moe/moe_config.cuh"
#include "launch/builtin.h"
#include "memory/buffer.h"
#include "safecuda/moe.h"

enum { K_ROUTER, K_TOPK, K_OFFSETS, K_SCATTER, K_W13, K_W2, K_COMBINE, K_COUNT };
static const char *const kernel_names[K_COUNT] = {
    "sc_moe_router_gemm", "sc_moe_topk", "sc_moe_offsets", "sc_moe_scatter",
    "sc_moe_gemm_w13",    "sc_moe_gemm_w2", "sc_moe_combine",
};

/* Workspace buffers, sized for `capacity` tokens. */
enum {
    W_LOGITS, W_IDS, W_WEIGHTS, W_COUNTS, W_ROW_OFF, W_TILE_OFF, W_CURSOR, W_PERM_TOKEN,
    W_PERM_WEIGHT, W_POS, W_H, W_Y, W_NO_BIAS, W_COUNT
};

typedef struct sci_moe {
    sci_object obj;
    sci_context *ctx;
    sc_moe_desc desc;
    sc_kernel kernels[K_COUNT];
    pthread_mutex_t lock; /* the workspace */
    uint64_t capacity;    /* tokens */
    sc_buffer ws[W_COUNT];
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
    for (int i = 0; i < W_COUNT; i++) {
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

/* (Re)allocate the workspace for `tokens` tokens on stream (stream-ordered). */
static sc_status grow_workspace(sci_moe *m, uint64_t tokens, sc_stream stream, const char *fn)
{
    const uint64_t E = (uint64_t)m->desc.experts, k = (uint64_t)m->desc.top_k;
    const uint64_t H = (uint64_t)m->desc.hidden, I = (uint64_t)m->desc.intermediate;
    uint64_t rows = tokens * k;
    struct {
        sc_dtype dtype;
        uint64_t count;
        const char *label;
    } spec[W_COUNT] = {
        [W_LOGITS] = {SC_F32, tokens * E, "moe router logits"},
        [W_IDS] = {SC_I32, rows, "moe expert ids"},
        [W_WEIGHTS] = {SC_F32, rows, "moe routing weights"},
        [W_COUNTS] = {SC_I32, E, "moe expert counts"},
        [W_ROW_OFF] = {SC_I32, E + 1, "moe row offsets"},
        [W_TILE_OFF] = {SC_I32, E + 1, "moe tile offsets"},
        [W_CURSOR] = {SC_I32, E, "moe cursors"},
        [W_PERM_TOKEN] = {SC_I32, rows, "moe permuted tokens"},
        [W_PERM_WEIGHT] = {SC_F32, rows, "moe permuted weights"},
        [W_POS] = {SC_I32, rows, "moe positions"},
        [W_H] = {SC_BF16, rows * I, "moe h"},
        [W_Y] = {SC_BF16, rows * H, "moe y"},
        [W_NO_BIAS] = {SC_F32, 1, "moe no bias"},
    };
    sc_status freed = free_workspace(m, fn);
    if (freed != SC_OK)
        return freed;
    for (int i = 0; i < W_COUNT; i++) {
        sc_status s = sc_buffer_create_at((sc_context){m->ctx->obj.id},
                                          &(sc_buffer_desc){.dtype = spec[i].dtype,
                                                            .count = spec[i].count,
                                                            .label = spec[i].label,
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

sc_status sc_moe_create_at(sc_context ctx, const sc_moe_desc *desc, sc_moe *layer,
                           const char *file, int line)
{
    static const char fn[] = "sc_moe_create";
    SCI_CHECK_PTR(fn, layer);
    layer->id = 0;
    SCI_CHECK_PTR(fn, desc);
    sc_moe_desc d = *desc;
    if (d.dtype == SC_DTYPE_INVALID)
        d.dtype = SC_BF16;
    const int E = d.experts, k = d.top_k, H = d.hidden, I = d.intermediate;
    if (d.dtype != SC_BF16)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn, "dtype %s: the MoE kernels take bf16",
                        sc_dtype_name(d.dtype));
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
    if (d.scoring != SC_MOE_SOFTMAX && d.scoring != SC_MOE_SIGMOID)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "scoring = %d", (int)d.scoring);

    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    char shape[96];
    snprintf(shape, sizeof shape, "[E=%d, H=%d]", E, H);
    s = check_weight(d.router, "router", SC_BF16, (uint64_t)E * H, shape, c, fn);
    if (s == SC_OK) {
        snprintf(shape, sizeof shape, "[E=%d, 2I=%d, H=%d]", E, 2 * I, H);
        s = check_weight(d.w13, "w13", SC_BF16, (uint64_t)E * 2 * I * H, shape, c, fn);
    }
    if (s == SC_OK) {
        snprintf(shape, sizeof shape, "[E=%d, H=%d, I=%d]", E, H, I);
        s = check_weight(d.w2, "w2", SC_BF16, (uint64_t)E * H * I, shape, c, fn);
    }
    if (s == SC_OK && d.selection_bias.id) {
        snprintf(shape, sizeof shape, "[E=%d]", E);
        s = check_weight(d.selection_bias, "selection_bias", SC_F32, (uint64_t)E, shape, c, fn);
    }
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
    pthread_mutex_init(&m->lock, NULL);
    for (int i = 0; i < K_COUNT && s == SC_OK; i++)
        s = sci_builtin_kernel(c, "moe/moe.cu", kernel_names[i], fn, &m->kernels[i]);
    for (int i = K_ROUTER; i < K_COUNT && s == SC_OK; i++)
        if (i == K_ROUTER || i == K_W13 || i == K_W2)
            s = sc_kernel_set_max_dynamic_shared(m->kernels[i], SC_MOE_SMEM_BYTES);
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

sc_status sc_moe_destroy(sc_moe layer) { return moe_destroy(layer.id, "sc_moe_destroy"); }

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
    for (int i = 0; i < W_COUNT; i++) {
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

static uint32_t ceil_div(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

sc_status sc_moe_forward(sc_stream stream, sc_moe layer, sc_view x, sc_view out,
                         const sc_moe_forward_desc *opts)
{
    static const char fn[] = "sc_moe_forward";
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MOE, layer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_moe *m = (sci_moe *)obj;
    const sc_moe_desc *d = &m->desc;
    const int E = d->experts, k = d->top_k, H = d->hidden, I = d->intermediate;

    /* Check x and out: bf16, same shape [T, H]. */
    sc_view xv, ov;
    sc_buffer_props xp, op;
    uint64_t T = 0;
    if ((s = sc_buffer_view(x.buffer, x.offset, x.count, &xv)) != SC_OK ||
        (s = sc_buffer_view(out.buffer, out.offset, out.count, &ov)) != SC_OK ||
        (s = sc_buffer_info(x.buffer, &xp)) != SC_OK ||
        (s = sc_buffer_info(out.buffer, &op)) != SC_OK)
        goto done;
    if (xp.dtype != SC_BF16 || op.dtype != SC_BF16) {
        s = sci_fail(SC_ERR_TYPE_MISMATCH, fn, "x is %s and out is %s; both must be bf16",
                     sc_dtype_name(xp.dtype), sc_dtype_name(op.dtype));
        goto done;
    }
    if (xv.count == 0 || xv.count % (uint64_t)H || ov.count != xv.count) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "x has %llu elements and out %llu: both must be T x H with H = %d, T >= 1",
                     (unsigned long long)xv.count, (unsigned long long)ov.count, H);
        goto done;
    }
    if (x.buffer.id == out.buffer.id && xv.offset < ov.offset + ov.count &&
        ov.offset < xv.offset + xv.count) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "out overlaps x");
        goto done;
    }
    T = xv.count / (uint64_t)H;
    if (T * (uint64_t)k / SC_MOE_BM + (uint64_t)E > 2000000000ull || T > 0x7fffffffull / k) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "T = %llu tokens is too many for one forward",
                     (unsigned long long)T);
        goto done;
    }

    pthread_mutex_lock(&m->lock);
    if (T > m->capacity) {
        uint64_t want = m->capacity * 2 > T ? m->capacity * 2 : T;
        s = grow_workspace(m, want, stream, fn);
        if (s != SC_OK) {
            pthread_mutex_unlock(&m->lock);
            goto done;
        }
    }
    sc_buffer *ws = m->ws;
    const uint64_t rows = T * (uint64_t)k;
    const int32_t zero = 0;
    sc_kernel *kn = m->kernels;
    sc_view bias = d->selection_bias.id ? whole(d->selection_bias) : whole(ws[W_NO_BIAS]);
    uint32_t max_m_tiles = ceil_div(rows, SC_MOE_BM) + (uint32_t)E;
    sc_launch_desc gemm_router = {{ceil_div(T, SC_MOE_BM), ceil_div((uint64_t)E, SC_MOE_BN), 1},
                                  {SC_MOE_THREADS, 1, 1}, SC_MOE_SMEM_BYTES};
    sc_launch_desc topk = {{ceil_div(T, SC_MOE_TOPK_TOKENS_PER_BLOCK), 1, 1},
                           {32 * SC_MOE_TOPK_TOKENS_PER_BLOCK, 1, 1}, 0};
    sc_launch_desc one_block = {{1, 1, 1}, {256, 1, 1}, 0};
    sc_launch_desc scatter = {{ceil_div(rows, 256), 1, 1}, {256, 1, 1}, 0};
    sc_launch_desc gemm_w13 = {{max_m_tiles, ceil_div((uint64_t)I, SC_MOE_BN / 2), 1},
                               {SC_MOE_THREADS, 1, 1}, SC_MOE_SMEM_BYTES};
    sc_launch_desc gemm_w2 = {{max_m_tiles, ceil_div((uint64_t)H, SC_MOE_BN), 1},
                              {SC_MOE_THREADS, 1, 1}, SC_MOE_SMEM_BYTES};
    sc_launch_desc combine = {{(uint32_t)T, 1, 1}, {SC_MOE_COMBINE_THREADS, 1, 1}, 0};

    if ((s = sc_fill(stream, whole(ws[W_COUNTS]), &zero)) != SC_OK)
        goto unlock;
    if ((s = SC_LAUNCH(stream, kn[K_ROUTER], &gemm_router, sc_arg_in(xv),
                       sc_arg_in(whole(d->router)), sc_arg_out(whole(ws[W_LOGITS])),
                       sc_arg_i32((int32_t)T), sc_arg_i32(E), sc_arg_i32(H))) != SC_OK)
        goto unlock;
    if ((s = SC_LAUNCH(stream, kn[K_TOPK], &topk, sc_arg_in(whole(ws[W_LOGITS])), sc_arg_in(bias),
                       sc_arg_out(whole(ws[W_IDS])), sc_arg_out(whole(ws[W_WEIGHTS])),
                       sc_arg_inout(whole(ws[W_COUNTS])), sc_arg_i32((int32_t)T), sc_arg_i32(E),
                       sc_arg_i32(k), sc_arg_i32(d->scoring == SC_MOE_SIGMOID),
                       sc_arg_i32(d->renormalize), sc_arg_i32(d->selection_bias.id != 0))) !=
        SC_OK)
        goto unlock;
    if ((s = SC_LAUNCH(stream, kn[K_OFFSETS], &one_block, sc_arg_in(whole(ws[W_COUNTS])),
                       sc_arg_out(whole(ws[W_ROW_OFF])), sc_arg_out(whole(ws[W_TILE_OFF])),
                       sc_arg_out(whole(ws[W_CURSOR])), sc_arg_i32(E))) != SC_OK)
        goto unlock;
    if ((s = SC_LAUNCH(stream, kn[K_SCATTER], &scatter, sc_arg_in(whole(ws[W_IDS])),
                       sc_arg_in(whole(ws[W_WEIGHTS])), sc_arg_in(whole(ws[W_ROW_OFF])),
                       sc_arg_inout(whole(ws[W_CURSOR])), sc_arg_out(whole(ws[W_PERM_TOKEN])),
                       sc_arg_out(whole(ws[W_PERM_WEIGHT])), sc_arg_out(whole(ws[W_POS])),
                       sc_arg_i32((int32_t)T), sc_arg_i32(k))) != SC_OK)
        goto unlock;
    if ((s = SC_LAUNCH(stream, kn[K_W13], &gemm_w13, sc_arg_in(xv),
                       sc_arg_in(whole(ws[W_PERM_TOKEN])), sc_arg_in(whole(d->w13)),
                       sc_arg_out(whole(ws[W_H])), sc_arg_in(whole(ws[W_TILE_OFF])),
                       sc_arg_in(whole(ws[W_ROW_OFF])), sc_arg_i32(E), sc_arg_i32(I),
                       sc_arg_i32(H))) != SC_OK)
        goto unlock;
    if ((s = SC_LAUNCH(stream, kn[K_W2], &gemm_w2, sc_arg_in(whole(ws[W_H])),
                       sc_arg_in(whole(d->w2)), sc_arg_in(whole(ws[W_PERM_WEIGHT])),
                       sc_arg_out(whole(ws[W_Y])), sc_arg_in(whole(ws[W_TILE_OFF])),
                       sc_arg_in(whole(ws[W_ROW_OFF])), sc_arg_i32(E), sc_arg_i32(H),
                       sc_arg_i32(I))) != SC_OK)
        goto unlock;
    if ((s = SC_LAUNCH(stream, kn[K_COMBINE], &combine, sc_arg_in(whole(ws[W_Y])),
                       sc_arg_in(whole(ws[W_POS])), sc_arg_out(ov), sc_arg_i32((int32_t)T),
                       sc_arg_i32(k), sc_arg_i32(H))) != SC_OK)
        goto unlock;
    if (opts && opts->expert_ids.buffer.id) {
        sc_view src;
        if ((s = sc_buffer_view(ws[W_IDS], 0, rows, &src)) != SC_OK ||
            (s = sc_copy(stream, opts->expert_ids, src)) != SC_OK)
            goto unlock;
    }
    if (opts && opts->expert_weights.buffer.id) {
        sc_view src;
        if ((s = sc_buffer_view(ws[W_WEIGHTS], 0, rows, &src)) != SC_OK ||
            (s = sc_copy(stream, opts->expert_weights, src)) != SC_OK)
            goto unlock;
    }
unlock:
    pthread_mutex_unlock(&m->lock);
done:
    if (s != SC_OK && strncmp(sc_last_error(), fn, strlen(fn)) != 0)
        sci_error_append(" (in %s)", fn);
    sci_registry_release(obj);
    return s;
}
