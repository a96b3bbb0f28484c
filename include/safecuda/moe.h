/* safecuda MoE: a fused Mixture-of-Experts layer (forward pass) on the GPU.
 *
 * For tokens x [T, H]: router logits = x Wg^T (Wg [E, H]); scores = softmax(logits) or
 * sigmoid(logits); the top k experts per token by score (+ an optional per-expert bias used
 * only for the selection, DeepSeek-V3 style), ties to the lower index; the routing weights
 * are the chosen scores, renormalized to sum to 1 when asked. Each chosen expert e computes
 * h = silu(x W1[e]^T) * (x W3[e]^T) with W1 and W3 stacked as W13 [E, 2I, H] (rows 0..I-1
 * are W1), then y_e = h W2[e]^T (W2 [E, H, I]); out[t] = sum over the chosen e of
 * weight(t, e) * y_e[t].
 *
 * bf16 weights and activations, fp32 accumulation, tensor cores: on sm_90 (H100, H200)
 * warpgroup MMAs fed by the bulk tensor copy engine, elsewhere (sm_80+) mma.sync. The
 * forward pass makes no host synchronization (expert counts stay on the device) and is
 * deterministic: the same input gives bit-identical output. */
#ifndef SAFECUDA_MOE_H
#define SAFECUDA_MOE_H

#include "../safecuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sc_moe { uint64_t id; } sc_moe;

typedef enum sc_moe_scoring { SC_MOE_SOFTMAX = 0, SC_MOE_SIGMOID } sc_moe_scoring;

/* The grouped GEMMs' implementation. AUTO: SM90 on compute capability 9.0, MMA elsewhere.
 * SM90 on another device is SC_ERR_NOT_SUPPORTED. Both compute the same function; the
 * choice exists for tests and comparisons. */
typedef enum sc_moe_backend {
    SC_MOE_BACKEND_AUTO = 0,
    SC_MOE_BACKEND_MMA,  /* mma.sync, cp.async (sm_80 and newer) */
    SC_MOE_BACKEND_SM90  /* wgmma, TMA, warp-specialized persistent kernels (sm_90a) */
} sc_moe_backend;

typedef struct sc_moe_desc {
    int experts;          /* E: 1 .. 256 */
    int top_k;            /* k: 1 .. min(E, 16) */
    int hidden;           /* H: a multiple of 8 */
    int intermediate;     /* I: a multiple of 8 */
    sc_dtype dtype;       /* SC_BF16 (0 means SC_BF16) */
    sc_moe_scoring scoring;
    bool renormalize;     /* renormalize the chosen weights to sum to 1 */
    sc_buffer router;     /* Wg  [E, H]      (E * H elements of dtype) */
    sc_buffer w13;        /* W13 [E, 2I, H] */
    sc_buffer w2;         /* W2  [E, H, I] */
    sc_buffer selection_bias; /* optional: [E] f32, added to the scores for selection only */
    uint64_t max_tokens;  /* workspace hint (default 256); grown on demand */
    const char *label;
    sc_moe_backend backend;
} sc_moe_desc;

/* Create a layer over weight buffers (checked for dtype and size; the layer keeps their
 * handles, so destroying a weight buffer makes later forwards fail with a stale handle).
 * Compiles the MoE kernels on first use (cached on disk). Statuses, besides those every
 * function may return (safecuda.h):
 *   SC_ERR_INVALID_ARGUMENT  a desc field out of range (experts, top_k, hidden,
 *                            intermediate, scoring, backend; the message names it), a
 *                            weight buffer of the wrong element count;
 *   SC_ERR_TYPE_MISMATCH     a weight buffer of another dtype than desc->dtype (the bias:
 *                            other than f32);
 *   SC_ERR_NOT_SUPPORTED     a dtype other than bf16, a device older than sm_80, or
 *                            backend SM90 on a device other than sm_90;
 *   SC_ERR_NO_COMPILER, SC_ERR_COMPILE  the kernels can't be compiled (NVRTC missing);
 *   SC_ERR_OUT_OF_MEMORY, SC_ERR_BUDGET_EXCEEDED  the workspace does not fit. */
SC_API sc_status sc_moe_create_at(sc_context ctx, const sc_moe_desc *desc, sc_moe *layer,
                                  const char *file, int line);
#define sc_moe_create(...) sc_moe_create_at(__VA_ARGS__, __FILE__, __LINE__)
/* Destroy the layer: its workspace is freed after the forwards in flight (stream-ordered),
 * its kernels' module unloaded; the weight buffers stay the caller's. The destroy
 * statuses of safecuda.h. */
SC_API sc_status sc_moe_destroy(sc_moe layer);

/* Where a forward's time goes: the device time of each kernel (and fill) it enqueued, in
 * order, measured with timing events around each. */
#define SC_MOE_MAX_STEPS 16
typedef struct sc_moe_profile {
    int steps;                           /* entries filled */
    const char *name[SC_MOE_MAX_STEPS];  /* e.g. "router", "w13 gemm (sm90 large)" */
    float ms[SC_MOE_MAX_STEPS];
    float total_ms;                      /* first event to last */
} sc_moe_profile;

/* Optional outputs of a forward pass: the chosen experts (i32 [T, k]) and their routing
 * weights (f32 [T, k]), in slot order. Zero views (no buffer) are not written. With
 * profile set, the forward times each step and waits for the stream before it returns
 * (a host synchronization, for measurements only). */
typedef struct sc_moe_forward_desc {
    sc_view expert_ids;
    sc_view expert_weights;
    sc_moe_profile *profile;
} sc_moe_forward_desc;

/* out [T, H] = MoE(x [T, H]) on stream; T = x's element count / H. Both views are bf16 and
 * start at a multiple of 8 elements (16 bytes); out must not overlap x. opts may be NULL.
 * Grows the workspace when T exceeds it (stream-ordered, no host synchronization).
 * Statuses: SC_ERR_TYPE_MISMATCH when x or out is not bf16, or an expert_ids /
 * expert_weights view is not i32 / f32; SC_ERR_INVALID_ARGUMENT when x is not T x H, out
 * differs from x in size, a view does not start 16-byte aligned, out overlaps x, or T is
 * too large for one forward; SC_ERR_OUT_OF_BOUNDS when an optional output view does not
 * hold T x k elements; SC_ERR_STALE_HANDLE when a weight buffer was destroyed;
 * SC_ERR_OUT_OF_MEMORY / SC_ERR_BUDGET_EXCEEDED when the workspace can't grow; the view
 * statuses of safecuda.h. Every check is made before anything is enqueued. */
SC_API sc_status sc_moe_forward(sc_stream stream, sc_moe layer, sc_view x, sc_view out,
                                const sc_moe_forward_desc *opts);

/* Make the layer's workspace large enough for forwards of up to max_tokens tokens now
 * (stream-ordered on stream), so that a forward inside a stream capture never has to grow
 * it (a growth can't be captured: such a forward is refused with SC_ERR_CAPTURE). Nothing
 * when it is large enough already. SC_ERR_INVALID_ARGUMENT for 0 or more tokens than one
 * forward takes; SC_ERR_CAPTURE when stream is capturing and the workspace must grow;
 * SC_ERR_OUT_OF_MEMORY / SC_ERR_BUDGET_EXCEEDED. */
SC_API sc_status sc_moe_reserve(sc_stream stream, sc_moe layer, uint64_t max_tokens);

/* Bytes of device workspace the layer holds now (0 before its first forward if create
 * reserved none). */
SC_API sc_status sc_moe_workspace_bytes(sc_moe layer, uint64_t *bytes);

#ifdef __cplusplus
}
#endif
#endif
