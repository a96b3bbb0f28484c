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

#define SM90_SMEM_L                                                                       \
    SC_MOE_SM90_SMEM(SC_MOE_SM90_LARGE_CONS, SC_MOE_SM90_LARGE_BN, SC_MOE_SM90_LARGE_STAGES)
#define SM90_SMEM_S                                                                       \
    SC_MOE_SM90_SMEM(SC_MOE_SM90_SMALL_CONS, SC_MOE_SM90_SMALL_BN, SC_MOE_SM90_SMALL_STAGES)
#define SM90_SMEM_M                                                                       \
    SC_MOE_SM90_SMEM(SC_MOE_SM90_MEDIUM_CONS, SC_MOE_SM90_MEDIUM_BN, SC_MOE_SM90_MEDIUM_STAGES)
#define SM90_SMEM_W                                                                       \
    SC_MOE_SM90_SMEM(SC_MOE_SM90_WIDE_CONS, SC_MOE_SM90_WIDE_BN, SC_MOE_SM90_WIDE_STAGES)

enum {
    K_ROUTER, K_TOPK, K_OFFSETS, K_SCATTER, K_COMBINE, /* routing and combine (both) */
    K_W13, K_W2,                                      /* MMA backend */
    K_SCATTER_GATHER, K_W13_L, K_W2_L, K_W13_S, K_W2_S, /* SM90 backend */
    K_ROUTE_SMALL, K_GATHER, K_W13_M, K_W2_M, K_W13_W, K_W2_W,
    K_COUNT
};
static const struct {
    const char *file, *name;
    int backend; /* 0: both, else the backend that uses it */
    int smem;    /* dynamic shared memory the launches ask for */
} kernel_table[K_COUNT] = {
    [K_ROUTER] = {"moe/moe.cu", "sc_moe_router_gemm", 0, SC_MOE_SMEM_BYTES},
    [K_TOPK] = {"moe/moe.cu", "sc_moe_topk", 0, 0},
    [K_OFFSETS] = {"moe/moe.cu", "sc_moe_offsets", 0, 0},
    [K_SCATTER] = {"moe/moe.cu", "sc_moe_scatter", SC_MOE_BACKEND_MMA, 0},
    [K_COMBINE] = {"moe/moe.cu", "sc_moe_combine", 0, 0},
    [K_W13] = {"moe/moe.cu", "sc_moe_gemm_w13", SC_MOE_BACKEND_MMA, SC_MOE_SMEM_BYTES},
    [K_W2] = {"moe/moe.cu", "sc_moe_gemm_w2", SC_MOE_BACKEND_MMA, SC_MOE_SMEM_BYTES},
    [K_SCATTER_GATHER] = {"moe/moe.cu", "sc_moe_scatter_gather", SC_MOE_BACKEND_SM90, 0},
    [K_W13_L] = {"moe/moe_sm90a.cu", "sc_moe_w13_sm90_large", SC_MOE_BACKEND_SM90, SM90_SMEM_L},
    [K_W2_L] = {"moe/moe_sm90a.cu", "sc_moe_w2_sm90_large", SC_MOE_BACKEND_SM90, SM90_SMEM_L},
    [K_W13_S] = {"moe/moe_sm90a.cu", "sc_moe_w13_sm90_small", SC_MOE_BACKEND_SM90, SM90_SMEM_S},
    [K_W2_S] = {"moe/moe_sm90a.cu", "sc_moe_w2_sm90_small", SC_MOE_BACKEND_SM90, SM90_SMEM_S},
    [K_ROUTE_SMALL] = {"moe/moe.cu", "sc_moe_route_small", 0, 0},
    [K_GATHER] = {"moe/moe.cu", "sc_moe_gather", SC_MOE_BACKEND_SM90, 0},
    [K_W13_M] = {"moe/moe_sm90a.cu", "sc_moe_w13_sm90_medium", SC_MOE_BACKEND_SM90, SM90_SMEM_M},
    [K_W2_M] = {"moe/moe_sm90a.cu", "sc_moe_w2_sm90_medium", SC_MOE_BACKEND_SM90, SM90_SMEM_M},
    [K_W13_W] = {"moe/moe_sm90a.cu", "sc_moe_w13_sm90_wide", SC_MOE_BACKEND_SM90, SM90_SMEM_W},
    [K_W2_W] = {"moe/moe_sm90a.cu", "sc_moe_w2_sm90_wide", SC_MOE_BACKEND_SM90, SM90_SMEM_W},
};

/* Workspace buffers, sized for `capacity` tokens. */
enum {
    W_LOGITS, W_IDS, W_WEIGHTS, W_COUNTS, W_ROW_OFF, W_TILE_OFF, W_CURSOR, W_PERM_TOKEN,
    W_PERM_WEIGHT, W_POS, W_H, W_Y, W_NO_BIAS, W_XPERM, W_TICKET, W_COUNT
};

/* The SM90 kernels' two tile shapes and the tensor maps they read through. */
enum { TILE_L, TILE_S, TILE_M, TILE_W, N_TILES };
static const struct {
    int cons, bn, a_box, ctas_per_sm;
    int k13, k2; /* the kernels */
    const char *name;
} tile_shape[N_TILES] = {
    [TILE_L] = {SC_MOE_SM90_LARGE_CONS, SC_MOE_SM90_LARGE_BN, SC_MOE_SM90_LARGE_A_BOX, 1,
                K_W13_L, K_W2_L, "large"},
    [TILE_S] = {SC_MOE_SM90_SMALL_CONS, SC_MOE_SM90_SMALL_BN, SC_MOE_SM90_SMALL_A_BOX,
                SC_MOE_SM90_SMALL_CTAS_PER_SM, K_W13_S, K_W2_S, "small"},
    [TILE_M] = {SC_MOE_SM90_MEDIUM_CONS, SC_MOE_SM90_MEDIUM_BN, SC_MOE_SM90_MEDIUM_A_BOX, 1,
                K_W13_M, K_W2_M, "medium"},
    [TILE_W] = {SC_MOE_SM90_WIDE_CONS, SC_MOE_SM90_WIDE_BN, SC_MOE_SM90_WIDE_A_BOX, 1, K_W13_W,
                K_W2_W, "wide"},
};
static const char *const step_w13[N_TILES] = {"w13 gemm (sm90 large)", "w13 gemm (sm90 small)",
                                              "w13 gemm (sm90 medium)", "w13 gemm (sm90 wide)"};
static const char *const step_w2[N_TILES] = {"w2 gemm (sm90 large)", "w2 gemm (sm90 small)",
                                             "w2 gemm (sm90 medium)", "w2 gemm (sm90 wide)"};

typedef struct sci_moe {
    sci_object obj;
    sci_context *ctx;
    sc_moe_desc desc;
    sc_moe_backend backend; /* resolved: MMA or SM90 */
    int tile_override;      /* SM90 tile shape from SAFECUDA_MOE_TILE (tuning), or -1 */
    int group_override;     /* GROUP_M from SAFECUDA_MOE_GROUP_M (tuning), or 0 */
    bool pdl;               /* programmatic dependent launches (SAFECUDA_MOE_PDL=0: off) */
    sc_kernel kernels[K_COUNT];
    pthread_mutex_t lock; /* the workspace */
    uint64_t capacity;    /* tokens */
    sc_buffer ws[W_COUNT];
    /* SM90: maps of the weights (made once) and of x_perm and h (made with the workspace). */
    sc_tensor_map w13_map[N_TILES], w2_map[N_TILES], xperm_map[N_TILES], h_map[N_TILES];
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

/* Rows of router logits for up to `tokens` tokens: the split router keeps one [T, E] slice
 * per split of H. */
static uint64_t logit_rows(uint64_t tokens)
{
    uint64_t split_rows = (tokens < SC_MOE_ROUTER_SPLIT_MAX_T ? tokens : SC_MOE_ROUTER_SPLIT_MAX_T) *
                          SC_MOE_ROUTER_MAX_SPLIT;
    return tokens > split_rows ? tokens : split_rows;
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
        bool zero;
    } spec[W_COUNT] = {
        [W_LOGITS] = {SC_F32, logit_rows(tokens) * E, "moe router logits", false},
        [W_IDS] = {SC_I32, rows, "moe expert ids", false},
        [W_WEIGHTS] = {SC_F32, rows, "moe routing weights", false},
        [W_COUNTS] = {SC_I32, E, "moe expert counts", false},
        [W_ROW_OFF] = {SC_I32, E + 1, "moe row offsets", false},
        [W_TILE_OFF] = {SC_I32, E + 1, "moe tile offsets", false},
        [W_CURSOR] = {SC_I32, E, "moe cursors", false},
        [W_PERM_TOKEN] = {SC_I32, rows, "moe permuted tokens", false},
        [W_PERM_WEIGHT] = {SC_F32, rows, "moe permuted weights", false},
        [W_POS] = {SC_I32, rows, "moe positions", false},
        [W_H] = {SC_BF16, rows * I, "moe h", false},
        [W_Y] = {SC_BF16, rows * H, "moe y", false},
        [W_NO_BIAS] = {SC_F32, 1, "moe no bias", false},
        [W_XPERM] = {SC_BF16, m->backend == SC_MOE_BACKEND_SM90 ? rows * H : 0,
                     "moe x in expert order", false},
        [W_TICKET] = {SC_U32, 1, "moe route ticket", true}, /* sc_moe_route_small resets it */
    };
    sc_status freed = free_workspace(m, fn);
    if (freed != SC_OK)
        return freed;
    for (int i = 0; i < W_COUNT; i++) {
        if (spec[i].count == 0)
            continue;
        sc_status s = sc_buffer_create_at((sc_context){m->ctx->obj.id},
                                          &(sc_buffer_desc){.dtype = spec[i].dtype,
                                                            .count = spec[i].count,
                                                            .label = spec[i].label,
                                                            .zero = spec[i].zero,
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
    if (m->backend == SC_MOE_BACKEND_SM90) {
        for (int t = 0; t < N_TILES; t++) {
            sc_status s = encode_map(m->ws[W_XPERM], rows, H, (uint32_t)tile_shape[t].a_box,
                                     &m->xperm_map[t]);
            if (s == SC_OK)
                s = encode_map(m->ws[W_H], rows, I, (uint32_t)tile_shape[t].a_box, &m->h_map[t]);
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
    if ((unsigned)d.backend > SC_MOE_BACKEND_SM90)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "backend = %d", (int)d.backend);
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
    const bool sm90 = c->props.cc_major == 9 && c->props.cc_minor == 0;
    if (d.backend == SC_MOE_BACKEND_AUTO)
        d.backend = sm90 ? SC_MOE_BACKEND_SM90 : SC_MOE_BACKEND_MMA;
    if (d.backend == SC_MOE_BACKEND_SM90 && !sm90) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "the SM90 backend needs compute capability 9.0; "
                     "device %d is %d.%d", c->device, c->props.cc_major, c->props.cc_minor);
        sci_context_release(c);
        return s;
    }
    if (c->props.cc_major < 8) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "the MoE kernels need compute capability 8.0 "
                     "or newer (bf16 tensor cores); device %d is %d.%d", c->device,
                     c->props.cc_major, c->props.cc_minor);
        sci_context_release(c);
        return s;
    }
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
    m->backend = d.backend;
    /* A tuning knob: SAFECUDA_MOE_TILE=small|medium|large fixes the SM90 tile shape. */
    const char *tile_env = getenv("SAFECUDA_MOE_TILE");
    m->tile_override = -1;
    for (int t = 0; t < N_TILES && tile_env; t++)
        if (strcmp(tile_env, tile_shape[t].name) == 0)
            m->tile_override = t;
    const char *pdl_env = getenv("SAFECUDA_MOE_PDL");
    m->pdl = !(pdl_env && strcmp(pdl_env, "0") == 0);
    const char *group_env = getenv("SAFECUDA_MOE_GROUP_M");
    m->group_override = group_env ? atoi(group_env) : 0;
    if (m->group_override < 0 || m->group_override > 1024)
        m->group_override = 0;
    pthread_mutex_init(&m->lock, NULL);
    for (int i = 0; i < K_COUNT && s == SC_OK; i++) {
        if (kernel_table[i].backend && kernel_table[i].backend != (int)m->backend)
            continue;
        s = sci_builtin_kernel(c, kernel_table[i].file, kernel_table[i].name, fn, &m->kernels[i]);
        if (s == SC_OK && kernel_table[i].smem > 48 * 1024)
            s = sc_kernel_set_max_dynamic_shared(m->kernels[i], kernel_table[i].smem);
    }
    if (s == SC_OK && m->backend == SC_MOE_BACKEND_SM90) {
        for (int t = 0; t < N_TILES && s == SC_OK; t++) {
            int bn = tile_shape[t].bn;
            s = encode_map(d.w13, (uint64_t)E * 2 * I, (uint64_t)H, (uint32_t)bn / 2,
                           &m->w13_map[t]);
            if (s == SC_OK)
                s = encode_map(d.w2, (uint64_t)E * H, (uint64_t)I, (uint32_t)bn, &m->w2_map[t]);
        }
    }
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

/* M tiles per group of the SM90 schedule for A rows of K bf16 in tiles of bm rows. */
static int sm90_group_m(const sci_moe *m, int bm, int K)
{
    if (m->group_override > 0)
        return m->group_override;
    uint64_t g = SC_MOE_SM90_GROUP_BYTES / ((uint64_t)bm * (uint64_t)K * 2);
    return g < 1 ? 1 : g > SC_MOE_SM90_GROUP_M_MAX ? SC_MOE_SM90_GROUP_M_MAX : (int)g;
}

/* The tile shape of the SM90 GEMMs for T tokens: the small tile while the average expert
 * gets few rows (decode), where weight streaming decides, the large one otherwise. */
static int sm90_tile_for(const sci_moe *m, uint64_t T)
{
    const sc_moe_desc *d = &m->desc;
    if (m->tile_override >= 0)
        return m->tile_override;
    uint64_t rows_per_expert = T * (uint64_t)d->top_k / (uint64_t)d->experts;
    return rows_per_expert <= SC_MOE_SM90_SMALL_MAX_ROWS ? TILE_S : TILE_L;
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
    const sc_moe_desc *d = &m->desc;
    const int E = d->experts, k = d->top_k, H = d->hidden, I = d->intermediate;
    steps st = {opts ? opts->profile : NULL, stream, {m->ctx->obj.id}, {{0}}, 0};

    /* Check x and out: bf16, same shape [T, H], 16-byte aligned rows. */
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
    if (xv.offset % SC_MOE_ALIGN || ov.offset % SC_MOE_ALIGN) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "x starts at element %llu and out at %llu of their buffers: the kernels "
                     "read and write 16-byte vectors, so both must start at a multiple of %d",
                     (unsigned long long)xv.offset, (unsigned long long)ov.offset,
                     SC_MOE_ALIGN);
        goto done;
    }
    if (x.buffer.id == out.buffer.id && xv.offset < ov.offset + ov.count &&
        ov.offset < xv.offset + xv.count) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "out overlaps x");
        goto done;
    }
    T = xv.count / (uint64_t)H;
    if (T * (uint64_t)k / SC_MOE_BM + (uint64_t)E > 2000000000ull || T > 0x7fffffffull / k ||
        T * (uint64_t)k * (uint64_t)(H > I ? H : I) > (1ull << 46)) {
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
    const bool sm90 = m->backend == SC_MOE_BACKEND_SM90;
    sc_view bias = d->selection_bias.id ? whole(d->selection_bias) : whole(ws[W_NO_BIAS]);
    uint32_t max_m_tiles = ceil_div(rows, SC_MOE_BM) + (uint32_t)E;
    /* For few tokens (decode) every kernel of the forward is a programmatic dependent launch:
     * each waits (griddepcontrol.wait) before it touches memory, so its launch overlaps the
     * tail of the kernel before it, microseconds that matter when the whole forward takes
     * tens of them. SAFECUDA_MOE_PDL=0 turns it off (for comparisons). The router splits H
     * while its output tiles leave SMs idle. */
    const bool pdl = T <= SC_MOE_PDL_MAX_T && m->pdl;
    const uint64_t router_tiles = (uint64_t)ceil_div(T, SC_MOE_BM) * ceil_div((uint64_t)E, SC_MOE_BN);
    uint64_t splits = 1;
    if (T <= SC_MOE_ROUTER_SPLIT_MAX_T) {
        splits = (uint64_t)m->ctx->props.sm_count / router_tiles;
        if (splits > SC_MOE_ROUTER_MAX_SPLIT)
            splits = SC_MOE_ROUTER_MAX_SPLIT;
        if (splits > (uint64_t)H / SC_MOE_ROUTER_MIN_K)
            splits = (uint64_t)H / SC_MOE_ROUTER_MIN_K;
        if (splits < 1)
            splits = 1;
    }
    const uint64_t k_chunk = ((uint64_t)ceil_div((uint64_t)H, splits) + SC_MOE_BK - 1) /
                             SC_MOE_BK * SC_MOE_BK;
    splits = ceil_div((uint64_t)H, k_chunk);
    sc_launch_desc gemm_router = {{ceil_div(T, SC_MOE_BM), ceil_div((uint64_t)E, SC_MOE_BN),
                                   (uint32_t)splits},
                                  {SC_MOE_THREADS, 1, 1}, SC_MOE_SMEM_BYTES, pdl};
    sc_launch_desc topk = {{ceil_div(T, SC_MOE_TOPK_TOKENS_PER_BLOCK), 1, 1},
                           {32 * SC_MOE_TOPK_TOKENS_PER_BLOCK, 1, 1}, 0, pdl};
    sc_launch_desc one_block = {{1, 1, 1}, {SC_MOE_MAX_EXPERTS, 1, 1}, 0, pdl};
    sc_launch_desc combine = {{(uint32_t)T, 1, 1}, {SC_MOE_COMBINE_THREADS, 1, 1}, 0, pdl};

    const bool route_small = T <= SC_MOE_ROUTE_SMALL_MAX_T;
    if (route_small) {
        /* One launch: logits, top-k, offsets, permutation (and x in expert order). */
        const bool gather_here =
            sm90 && rows * (uint64_t)H * 2 <= SC_MOE_ROUTE_GATHER_MAX_BYTES;
        sc_launch_desc route = {{ceil_div((uint64_t)E, SC_MOE_ROUTE_EXPERTS), 1, 1},
                                {SC_MOE_ROUTE_THREADS, 1, 1}, 0, pdl};
        if ((s = step(&st, "route (small T)")) != SC_OK ||
            (s = SC_LAUNCH(stream, kn[K_ROUTE_SMALL], &route, sc_arg_in(xv),
                           sc_arg_in(whole(d->router)), sc_arg_in(bias),
                           sc_arg_out(whole(ws[W_LOGITS])), sc_arg_out(whole(ws[W_IDS])),
                           sc_arg_out(whole(ws[W_WEIGHTS])), sc_arg_out(whole(ws[W_ROW_OFF])),
                           sc_arg_out(whole(ws[W_TILE_OFF])),
                           sc_arg_out(whole(ws[W_PERM_TOKEN])),
                           sc_arg_out(whole(ws[W_PERM_WEIGHT])), sc_arg_out(whole(ws[W_POS])),
                           sc_arg_out(whole(sm90 ? ws[W_XPERM] : ws[W_H])),
                           sc_arg_inout(whole(ws[W_TICKET])), sc_arg_i32((int32_t)T),
                           sc_arg_i32(E), sc_arg_i32(k), sc_arg_i32(H),
                           sc_arg_i32(d->scoring == SC_MOE_SIGMOID), sc_arg_i32(d->renormalize),
                           sc_arg_i32(d->selection_bias.id != 0), sc_arg_i32(gather_here))) !=
                SC_OK)
            goto unlock;
        if (sm90 && !gather_here) {
            sc_launch_desc g = {{ceil_div(rows, SC_MOE_SCATTER_WARPS), 1, 1},
                                {32 * SC_MOE_SCATTER_WARPS, 1, 1}, 0, pdl};
            if ((s = step(&st, "gather x")) != SC_OK ||
                (s = SC_LAUNCH(stream, kn[K_GATHER], &g, sc_arg_in(whole(ws[W_PERM_TOKEN])),
                               sc_arg_in(xv), sc_arg_out(whole(ws[W_XPERM])),
                               sc_arg_i32((int32_t)rows), sc_arg_i32(H))) != SC_OK)
                goto unlock;
        }
    } else {
        if ((s = step(&st, "zero counts")) != SC_OK ||
            (s = sc_fill(stream, whole(ws[W_COUNTS]), &zero)) != SC_OK)
            goto unlock;
        if ((s = step(&st, "router gemm")) != SC_OK ||
            (s = SC_LAUNCH(stream, kn[K_ROUTER], &gemm_router, sc_arg_in(xv),
                           sc_arg_in(whole(d->router)), sc_arg_out(whole(ws[W_LOGITS])),
                           sc_arg_i32((int32_t)T), sc_arg_i32(E), sc_arg_i32(H),
                           sc_arg_i32((int32_t)k_chunk))) != SC_OK)
            goto unlock;
        if ((s = step(&st, "scores + top-k")) != SC_OK ||
            (s = SC_LAUNCH(stream, kn[K_TOPK], &topk, sc_arg_in(whole(ws[W_LOGITS])),
                           sc_arg_in(bias), sc_arg_out(whole(ws[W_IDS])),
                           sc_arg_out(whole(ws[W_WEIGHTS])), sc_arg_inout(whole(ws[W_COUNTS])),
                           sc_arg_i32((int32_t)T), sc_arg_i32(E), sc_arg_i32(k),
                           sc_arg_i32(d->scoring == SC_MOE_SIGMOID), sc_arg_i32(d->renormalize),
                           sc_arg_i32(d->selection_bias.id != 0), sc_arg_i32((int32_t)splits))) !=
                SC_OK)
            goto unlock;
        if ((s = step(&st, "offsets")) != SC_OK ||
            (s = SC_LAUNCH(stream, kn[K_OFFSETS], &one_block, sc_arg_in(whole(ws[W_COUNTS])),
                           sc_arg_out(whole(ws[W_ROW_OFF])), sc_arg_out(whole(ws[W_TILE_OFF])),
                           sc_arg_out(whole(ws[W_CURSOR])), sc_arg_i32(E))) != SC_OK)
            goto unlock;
        if (sm90) {
            sc_launch_desc scatter = {{ceil_div(rows, SC_MOE_SCATTER_WARPS), 1, 1},
                                      {32 * SC_MOE_SCATTER_WARPS, 1, 1}, 0, pdl};
            if ((s = step(&st, "scatter + gather x")) != SC_OK ||
                (s = SC_LAUNCH(stream, kn[K_SCATTER_GATHER], &scatter,
                               sc_arg_in(whole(ws[W_IDS])), sc_arg_in(whole(ws[W_WEIGHTS])),
                               sc_arg_in(whole(ws[W_ROW_OFF])), sc_arg_inout(whole(ws[W_CURSOR])),
                               sc_arg_out(whole(ws[W_PERM_TOKEN])),
                               sc_arg_out(whole(ws[W_PERM_WEIGHT])),
                               sc_arg_out(whole(ws[W_POS])), sc_arg_in(xv),
                               sc_arg_out(whole(ws[W_XPERM])), sc_arg_i32((int32_t)T),
                               sc_arg_i32(k), sc_arg_i32(H))) != SC_OK)
                goto unlock;
        } else {
            sc_launch_desc scatter = {{ceil_div(rows, 256), 1, 1}, {256, 1, 1}, 0, pdl};
            if ((s = step(&st, "scatter")) != SC_OK ||
                (s = SC_LAUNCH(stream, kn[K_SCATTER], &scatter, sc_arg_in(whole(ws[W_IDS])),
                               sc_arg_in(whole(ws[W_WEIGHTS])), sc_arg_in(whole(ws[W_ROW_OFF])),
                               sc_arg_inout(whole(ws[W_CURSOR])),
                               sc_arg_out(whole(ws[W_PERM_TOKEN])),
                               sc_arg_out(whole(ws[W_PERM_WEIGHT])),
                               sc_arg_out(whole(ws[W_POS])), sc_arg_i32((int32_t)T),
                               sc_arg_i32(k))) != SC_OK)
                goto unlock;
        }
    }
    if (sm90) {
        const int t = sm90_tile_for(m, T);
        const int cons = tile_shape[t].cons, bn = tile_shape[t].bn, bm = 64 * cons;
        const uint32_t max_ctas = (uint32_t)m->ctx->props.sm_count * (uint32_t)tile_shape[t].ctas_per_sm;
        uint64_t m_tiles = rows / (uint64_t)bm + (uint64_t)E;
        uint64_t tiles13 = m_tiles * ceil_div((uint64_t)I, (uint64_t)bn / 2);
        uint64_t tiles2 = m_tiles * ceil_div((uint64_t)H, (uint64_t)bn);
        sc_launch_desc g13 = {{(uint32_t)(tiles13 < max_ctas ? tiles13 : max_ctas), 1, 1},
                              {(uint32_t)(128 * (cons + 1)), 1, 1},
                              (uint32_t)kernel_table[tile_shape[t].k13].smem, pdl};
        sc_launch_desc g2 = {{(uint32_t)(tiles2 < max_ctas ? tiles2 : max_ctas), 1, 1},
                             {(uint32_t)(128 * (cons + 1)), 1, 1}, g13.shared_bytes, pdl};
        if ((s = step(&st, step_w13[t])) != SC_OK ||
            (s = SC_LAUNCH(stream, kn[tile_shape[t].k13], &g13,
                           sc_arg_tensor_map_in(&m->xperm_map[t]),
                           sc_arg_tensor_map_in(&m->w13_map[t]), sc_arg_out(whole(ws[W_H])),
                           sc_arg_in(whole(ws[W_ROW_OFF])), sc_arg_i32(E), sc_arg_i32(I),
                           sc_arg_i32(H), sc_arg_i32(sm90_group_m(m, bm, H)))) != SC_OK)
            goto unlock;
        if ((s = step(&st, step_w2[t])) != SC_OK ||
            (s = SC_LAUNCH(stream, kn[tile_shape[t].k2], &g2,
                           sc_arg_tensor_map_in(&m->h_map[t]),
                           sc_arg_tensor_map_in(&m->w2_map[t]),
                           sc_arg_in(whole(ws[W_PERM_WEIGHT])), sc_arg_out(whole(ws[W_Y])),
                           sc_arg_in(whole(ws[W_ROW_OFF])), sc_arg_i32(E), sc_arg_i32(H),
                           sc_arg_i32(I), sc_arg_i32(sm90_group_m(m, bm, I)))) != SC_OK)
            goto unlock;
    } else {
        sc_launch_desc gemm_w13 = {{max_m_tiles, ceil_div((uint64_t)I, SC_MOE_BN / 2), 1},
                                   {SC_MOE_THREADS, 1, 1}, SC_MOE_SMEM_BYTES, pdl};
        sc_launch_desc gemm_w2 = {{max_m_tiles, ceil_div((uint64_t)H, SC_MOE_BN), 1},
                                  {SC_MOE_THREADS, 1, 1}, SC_MOE_SMEM_BYTES, pdl};
        if ((s = step(&st, "w13 gemm (mma)")) != SC_OK ||
            (s = SC_LAUNCH(stream, kn[K_W13], &gemm_w13, sc_arg_in(xv),
                           sc_arg_in(whole(ws[W_PERM_TOKEN])), sc_arg_in(whole(d->w13)),
                           sc_arg_out(whole(ws[W_H])), sc_arg_in(whole(ws[W_TILE_OFF])),
                           sc_arg_in(whole(ws[W_ROW_OFF])), sc_arg_i32(E), sc_arg_i32(I),
                           sc_arg_i32(H))) != SC_OK)
            goto unlock;
        if ((s = step(&st, "w2 gemm (mma)")) != SC_OK ||
            (s = SC_LAUNCH(stream, kn[K_W2], &gemm_w2, sc_arg_in(whole(ws[W_H])),
                           sc_arg_in(whole(d->w2)), sc_arg_in(whole(ws[W_PERM_WEIGHT])),
                           sc_arg_out(whole(ws[W_Y])), sc_arg_in(whole(ws[W_TILE_OFF])),
                           sc_arg_in(whole(ws[W_ROW_OFF])), sc_arg_i32(E), sc_arg_i32(H),
                           sc_arg_i32(I))) != SC_OK)
            goto unlock;
    }
    if ((s = step(&st, "combine")) != SC_OK ||
        (s = SC_LAUNCH(stream, kn[K_COMBINE], &combine, sc_arg_in(whole(ws[W_Y])),
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
    s = steps_finish(&st, s);
    if (s != SC_OK && strncmp(sc_last_error(), fn, strlen(fn)) != 0)
        sci_error_append(" (in %s)", fn);
    sci_registry_release(obj);
    return s;
}
