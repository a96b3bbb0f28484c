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
 * bf16 weights (or e4m3 experts with block scales: expert_dtype below) and bf16
 * activations, fp32 accumulation, tensor cores: on sm_90 (H100, H200)
 * warpgroup MMAs fed by the bulk tensor copy engine, elsewhere (sm_80+) mma.sync. The
 * forward pass makes no host synchronization (expert counts stay on the device) and is
 * deterministic: the same input gives bit-identical output.
 *
 * The layers of the models people serve, each field's zero meaning the textbook layer above:
 * - routing: group-limited selection (DeepSeek-V3: the experts of the topk_group best of
 *   n_group groups, a group scored by the sum of its two best biased scores), a routed
 *   scaling factor, a router bias added to the logits (gpt-oss), up to 512 experts and
 *   top-16; or the caller's own routing (expert ids and weights, ids < 0 for padded slots),
 *   or the routing alone (sc_moe_route);
 * - experts: SiLU-GLU, GeLU(tanh)-GLU or gpt-oss's clamped SwiGLU; W13 rows stacked (all
 *   gate rows, then all up rows) or interleaved (gate, up, gate, up, ...); f32 biases on
 *   both projections; a shared expert every token uses (DeepSeek-V3, Kimi K2, Qwen3-Next),
 *   optionally gated by sigmoid(x . gate row), computed in the same grouped GEMMs;
 * - weights as views into larger buffers (a checkpoint loaded as one allocation), at any
 *   16-byte aligned offset (on sm_90 the bf16 GEMMs start K early by the view's
 *   misalignment within 128 bytes, so that every copy stays 128-byte aligned; the sums then
 *   split K elsewhere than for the same weights 128-byte aligned, so the two agree to
 *   rounding, not bitwise; SAFECUDA_MOE_KSHIFT=0 turns it off. fp8 weights at such offsets
 *   read unaligned copies, bitwise as if aligned; SAFECUDA_MOE_KSHIFT=fp8 shifts them too,
 *   each step split at its 128-wide scale block: slower, docs/BENCHMARKS.md);
 * - out += layer(x) (the residual add in the same pass);
 * - tensor parallelism over several GPUs: each rank a layer over its shard of I, the partial
 *   outputs all-reduced over an NCCL communicator (sc_moe_desc.tp_comm, docs/MULTI_GPU.md);
 * - expert parallelism: each rank some of the experts, each token sent to the ranks holding
 *   its experts and the rows sent back and summed (sc_moe_desc.ep_comm). */
#ifndef SAFECUDA_MOE_H
#define SAFECUDA_MOE_H

#include "../safecuda.h"
#include "comm.h"

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

/* The expert activation: h = act(x W1^T) * (x W3^T) (gate g = x W1^T, up u = x W3^T). */
typedef enum sc_moe_activation {
    SC_MOE_SILU = 0,     /* h = g sigmoid(g) u  (SwiGLU) */
    SC_MOE_GELU_TANH,    /* h = gelu_tanh(g) u  (GeGLU, tanh approximation) */
    SC_MOE_SWIGLU_CLAMP  /* gpt-oss: g = min(g, limit), u = clamp(u, -limit, limit),
                            h = g sigmoid(alpha g) (u + 1) */
} sc_moe_activation;

/* The rows of W13 [E, 2I, H] (and of its bias [E, 2I]) within an expert. */
typedef enum sc_moe_w13_layout {
    SC_MOE_W13_STACKED = 0,  /* rows 0 .. I-1 gate (W1), I .. 2I-1 up (W3) */
    SC_MOE_W13_INTERLEAVED   /* row 2i gate, row 2i + 1 up (gpt-oss) */
} sc_moe_w13_layout;

/* An expert-parallel layer's exchange of tokens (sc_moe_desc.ep_mode). */
typedef enum sc_moe_ep_mode {
    SC_MOE_EP_NORMAL = 0,     /* exact counts: the ranks exchange their token counts, which
                                 the host reads (a wait), then exactly the rows needed */
    SC_MOE_EP_LOW_LATENCY = 1 /* fixed packets of ep_max_tokens rows per rank pair: no host
                                 wait, capturable in a CUDA graph (decode) */
} sc_moe_ep_mode;

/* A tensor-parallel layer's output (sc_moe_desc.tp_output). */
typedef enum sc_moe_tp_output {
    SC_MOE_TP_ALL_REDUCE = 0,  /* every rank's out: the whole [T, H] output */
    SC_MOE_TP_REDUCE_SCATTER   /* rank r's out: rows [r T/N, (r+1) T/N) of it (sequence
                                  parallelism: x is the whole [T, H], T a multiple of N) */
} sc_moe_tp_output;

/* The layer's limits, defined here only: the kernels (kernels/moe/moe_config.cuh) and the
 * Python package (safecuda/_lib.py) can't include this header and hold copies, which every
 * build checks against these (cmake/check_moe_limits.cmake). */
#define SC_MOE_MAX_EXPERTS 512
#define SC_MOE_MAX_TOPK 16
#define SC_MOE_MAX_SHARED 16 /* shared_intermediate / intermediate */

typedef struct sc_moe_desc {
    int experts;          /* E: 1 .. 512 */
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

    /* ---- routing ---- */
    int n_group, topk_group;  /* group-limited selection: E = n_group x group size (2 ..),
                                 n_group 1 .. 32, topk_group 1 .. n_group, top_k <= topk_group
                                 x group size; a group's score is the sum of its two best
                                 selection scores (score + selection bias). 0, 0: none */
    float routed_scaling;     /* the routed experts' weights are multiplied by it after the
                                 renormalization (DeepSeek-V3 2.5, Kimi K2 2.827); 0 means 1 */
    /* ---- experts ---- */
    sc_moe_activation activation;
    float swiglu_alpha, swiglu_limit; /* SC_MOE_SWIGLU_CLAMP's constants; 0 means gpt-oss's
                                         1.702 and 7.0 (other activations: must be 0) */
    sc_moe_w13_layout w13_layout;     /* of w13, w13_bias and shared_w13 */
    /* ---- weights as views (instead of the whole buffers above: give one or the other) ----
     * Each view is of the dtype and exact element count the whole buffer would have, and
     * starts 16-byte aligned. */
    sc_view router_view, w13_view, w2_view, selection_bias_view;
    /* ---- optional biases (f32) of the routed experts ---- */
    sc_view router_bias;  /* [E]: added to the router logits before scoring (gpt-oss) */
    sc_view w13_bias;     /* [E, 2I] in w13_layout: added to gate and up before the activation */
    sc_view w2_bias;      /* [E, H]: added to each expert's output before its weight */
    /* ---- a shared expert: every token uses it, with weight 1 or sigmoid(x . shared_gate) ----
     * An MLP of intermediate size shared_intermediate, a multiple of I (I_s = S I, S <= 16;
     * computed as S experts of size I in the routed experts' GEMMs); no biases. 0: none. */
    int shared_intermediate;
    sc_view shared_w13;   /* [2 I_s, H] bf16 in w13_layout */
    sc_view shared_w2;    /* [H, I_s] bf16 */
    sc_view shared_gate;  /* optional [H] bf16: the shared expert's output is scaled by
                             sigmoid(x . shared_gate) (Qwen3-Next) */
    /* ---- fp8 experts (DeepSeek-V3/R1, Kimi K2, Qwen3-FP8, GLM-4.5-FP8 checkpoints) ----
     * expert_dtype SC_F8E4M3: w13, w2, shared_w13 and shared_w2 are e4m3 (OCP e4m3fn), each
     * 128 x 128 block of a weight matrix with one f32 scale (the checkpoints'
     * weight_scale_inv: weight = e4m3 value x scale), in the checkpoints' layout:
     *   w13_scale [E, 2I/128, H/128] (the blocks of W13's 2I rows in w13_layout order),
     *   w2_scale [E, H/128, I/128], shared_w13_scale [2 I_s/128, H/128],
     *   shared_w2_scale [H/128, I_s/128].
     * x and out stay bf16, the router, shared gate and biases as above. x is quantized per
     * token per 128 channels where it is gathered (scale = amax / 448, e4m3 round to nearest
     * even, saturating), h likewise where the activation makes it; the GEMMs run e4m3
     * warpgroup MMAs and apply the block scales to fp32 partial sums every 128 of K. H and I
     * must be multiples of 128; SM90 backend (compute capability 9.0) only. 0 or SC_BF16:
     * bf16 experts (then no scale may be given). */
    sc_dtype expert_dtype;
    sc_view w13_scale, w2_scale, shared_w13_scale, shared_w2_scale;
    /* ---- tensor parallelism (docs/MULTI_GPU.md) ----
     * tp_comm: this rank's communicator of a tensor-parallel group of N >= 2 GPUs (zero: a
     * layer on one GPU). Every rank makes a layer over its shard of the experts'
     * intermediate dimension (the checkpoints' split of I), and the desc describes the
     * shard: intermediate is I / N (the rank's, checked like any I: a multiple of 8, of 128
     * for fp8 experts), shared_intermediate I_s / N, and the weights are an ordinary layer's
     * of that size:
     *   w13 [E, 2 I/N, H]: the rank's gate rows [r I/N, (r+1) I/N) and the same up rows, in
     *     w13_layout (stacked: those gate rows, then those up rows; interleaved: rows
     *     [2 r I/N, 2 (r+1) I/N) of the full interleaved W13); w13_bias [E, 2 I/N] likewise;
     *   w2 [E, H, I/N]: columns [r I/N, (r+1) I/N) of each row;
     *   shared_w13 [2 I_s/N, H], shared_w2 [H, I_s/N] likewise;
     *   fp8 scales of the shards' blocks: w13_scale [E, 2 (I/N)/128, H/128], w2_scale
     *     [E, H/128, (I/N)/128], and the shared expert's likewise.
     * Replicated (the full tensors, the same on every rank): the router, selection_bias,
     * router_bias, shared_gate and w2_bias. Routing runs on every rank, identically (the same
     * x, weights and kernels give the same bits), so every rank computes its shard of every
     * chosen expert. w2_bias (added once to each expert's output) is added on rank 0 only:
     * other ranks need not give it (one given there is checked, then unused).
     * Each forward computes the rank's partial output, then all-reduces it (sum, in bf16,
     * in place in out: what vLLM does) over tp_comm on the forward's stream, so every rank's
     * out holds the layer's output. The partials are rounded to bf16 before the sum: the
     * result agrees with the one-GPU layer over the full weights to about N bf16 roundings.
     * With opts->accumulate, rank 0 adds the residual (out += partial) and the other ranks
     * write their partial over out, so the residual is counted once: every rank must give
     * the same out contents (the residual stream, replicated as in any TP model).
     * The communicator must be of the layer's context and alive; the layer keeps its handle
     * (not a reference): destroy the layer before the communicator; a forward after the
     * communicator was destroyed is SC_ERR_STALE_HANDLE, after it was aborted SC_ERR_COMM,
     * before anything is enqueued. Every rank must make the same forwards in the same order
     * (each is a collective: comm.h's rules, groups and threads, apply); in a stream capture
     * the all-reduce is captured with the kernels. sc_moe_route makes no collective.
     * tp_output SC_MOE_TP_REDUCE_SCATTER (sequence-parallel callers): x is still the whole
     * [T, H] on every rank (T a multiple of N), but each rank's out is its [T/N, H] rows
     * r T/N .. (r+1) T/N - 1 of the output: the partial output goes to the layer's workspace
     * ([T, H] bf16 more of it) and is reduce-scattered (sum, bf16) into out. With
     * opts->accumulate every rank adds its own out (its rows' residual) once. */
    sc_comm tp_comm;
    sc_moe_tp_output tp_output; /* SC_MOE_TP_ALL_REDUCE (0) or _REDUCE_SCATTER; needs tp_comm */
    /* ---- expert parallelism (docs/MULTI_GPU.md) ----
     * ep_comm: this rank's communicator of an expert-parallel group of N = 2 .. 32 GPUs
     * (zero: none; not with tp_comm). Each rank holds some of the E routed experts and
     * every rank's layer is made with the same desc but for the weights: experts is E (all
     * of them), and
     *   the router [E, H], selection_bias, router_bias: the full tensors (each rank routes
     *     its own tokens over all E experts);
     *   w13, w2, w13_bias, w2_bias, w13_scale, w2_scale: the rank's experts only, in
     *     increasing expert id, as an ordinary layer over that many experts would take them
     *     (w13 [E_r, 2I, H], ...);
     *   the shared expert (shared_w13, shared_w2, shared_gate, their scales): whole, on
     *     every rank (each computes it for its own tokens).
     * ep_owner (optional, read at create): [E] the rank holding each expert; NULL: rank r
     * holds experts [r E/N, (r+1) E/N) (E a multiple of N). Every rank must hold one or more.
     * A forward on rank r takes that rank's own tokens x [T_r, H] (T_r may differ from rank
     * to rank, and be 0: empty views of x and out, for a rank with no tokens this step, which
     * still takes part) and writes their output to out [T_r, H], as the one-GPU layer would: the
     * routing, then each token sent once to every other rank that holds one of its chosen
     * experts (with its routing over that rank's experts), those rows computed there (with
     * the rank's own tokens, which alone get the shared expert), sent back, and summed in
     * rank order (f32 sums of bf16 rows: a row computed elsewhere is rounded to bf16 once
     * more than on one GPU). No data-dependent host work but what ep_mode says:
     *   SC_MOE_EP_NORMAL: the ranks exchange their counts and the host reads them (the
     *     forward waits for the stream there), then exchanges exactly the rows needed; not
     *     capturable (SC_ERR_CAPTURE). For prefill.
     *   SC_MOE_EP_LOW_LATENCY: every rank pair exchanges a packet of ep_max_tokens rows
     *     (unused rows carry no expert), so nothing waits and a stream capture records the
     *     whole forward; T_r <= ep_max_tokens (1 .. 65536) on every rank. For decode.
     * The first forward checks that the ranks' layers agree (a small all-gather and a host
     * wait: E, k, H, I, I_s, the experts' dtype, the mode, ep_max_tokens, the expert map,
     * the routing and activation options): ranks that differ all return
     * SC_ERR_INVALID_ARGUMENT naming the field, before any exchange; run it eagerly, not in
     * a capture (SC_ERR_CAPTURE). Every rank must make the same forwards in the same order
     * (each is a collective), from a thread (or process) per GPU, not inside
     * sc_comm_group_begin / _end (SC_ERR_INVALID_ARGUMENT: its exchanges depend on each
     * other); a forward that fails on one rank after its first exchange aborts ep_comm, so
     * the others return an error instead of waiting. opts->expert_ids and expert_weights give the global routing; the
     * caller's routing (opts->routing_ids, global ids) is sent the same way; a profile
     * times the steps (routing, plan, dispatch, the rank's experts, return, combine; it
     * waits, so not in a capture); check_routing is not taken (SC_ERR_NOT_SUPPORTED: a
     * caller's id >= E is skipped and recorded for sc_moe_routing_check). With fp8 experts
     * the dispatch sends e4m3 rows and their per-128-channel scales (quantized by the
     * layer's own rule: the same result, half the bytes). sc_moe_route routes over all E experts and makes no collective. The layer keeps the
     * communicator's handle, as tp_comm's rules say. */
    sc_comm ep_comm;
    sc_moe_ep_mode ep_mode;
    int ep_max_tokens;       /* SC_MOE_EP_LOW_LATENCY: the most tokens a rank's forward takes */
    const int32_t *ep_owner; /* [E] or NULL (contiguous) */
} sc_moe_desc;

/* Create a layer over weight buffers (checked for dtype and size; the layer keeps their
 * handles, so destroying a weight buffer makes later forwards fail with a stale handle).
 * Compiles the MoE kernels on first use (cached on disk). Statuses, besides those every
 * function may return (safecuda.h):
 *   SC_ERR_INVALID_ARGUMENT  a desc field out of range or a combination the layer does not
 *                            compute (the message names the field), a tp_comm of one rank,
 *                            a weight of the wrong
 *                            element count, a view not 16-byte aligned, a weight given both
 *                            as a buffer and as a view, or neither;
 *   SC_ERR_TYPE_MISMATCH     a weight buffer of another dtype than desc->dtype (the experts'
 *                            weights: desc->expert_dtype; the biases and scales: other than
 *                            f32);
 *   SC_ERR_NOT_SUPPORTED     a dtype other than bf16, an expert_dtype other than bf16 or
 *                            f8e4m3, a device older than sm_80, backend SM90 on a device
 *                            other than sm_90, or fp8 experts on the MMA backend or a device
 *                            other than sm_90;
 *   SC_ERR_WRONG_CONTEXT     desc->tp_comm of another context than ctx;
 *   SC_ERR_STALE_HANDLE      desc->tp_comm destroyed (or a weight buffer);
 *   SC_ERR_COMM, SC_ERR_TIMEOUT  desc->tp_comm was aborted (its message);
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
    /* The caller's routing instead of the layer's router: expert ids (i32 [T, k]) and their
     * weights (f32 [T, k], used as given: no renormalization or routed scaling). An id < 0
     * is a padded slot (no expert); an id >= E is an error: the slot is skipped (nothing is
     * read or written out of bounds) and the first such id is recorded on the device and
     * reported by the next forward with check_routing, or by sc_moe_routing_check. */
    sc_view routing_ids, routing_weights;
    bool check_routing; /* wait for the stream and report a bad id (SC_ERR_INVALID_ARGUMENT) */
    bool accumulate;    /* out += layer(x) (rounded once to bf16) instead of out = layer(x) */
} sc_moe_forward_desc;

/* out [T, H] = MoE(x [T, H]) on stream (or out += with opts->accumulate); T = x's element
 * count / H. Both views are bf16 and
 * start at a multiple of 8 elements (16 bytes); out must not overlap x. opts may be NULL.
 * Grows the workspace when T exceeds it (stream-ordered, no host synchronization).
 * Statuses: SC_ERR_TYPE_MISMATCH when x or out is not bf16, or an expert_ids /
 * expert_weights view is not i32 / f32; SC_ERR_INVALID_ARGUMENT when x is not T x H, out
 * differs from x in size (a reduce-scattering tensor-parallel layer: out is not T/N x H, or
 * T is not a multiple of N), a view does not start 16-byte aligned, out overlaps x, or T is
 * too large for one forward; SC_ERR_OUT_OF_BOUNDS when an optional output view does not
 * hold T x k elements, or routing_ids / routing_weights do not (they are i32 / f32, given
 * together); SC_ERR_INVALID_ARGUMENT with check_routing when a routing id >= E was met
 * (by this forward or an earlier unchecked one); SC_ERR_STALE_HANDLE when a weight buffer
 * was destroyed;
 * SC_ERR_OUT_OF_MEMORY / SC_ERR_BUDGET_EXCEEDED when the workspace can't grow; the view
 * statuses of safecuda.h. A tensor-parallel layer (desc->tp_comm): SC_ERR_STALE_HANDLE when
 * its communicator was destroyed, SC_ERR_COMM / SC_ERR_TIMEOUT when it was aborted, and the
 * statuses of sc_comm_all_reduce (sc_comm_reduce_scatter). Every check is made before
 * anything is enqueued. */
SC_API sc_status sc_moe_forward(sc_stream stream, sc_moe layer, sc_view x, sc_view out,
                                const sc_moe_forward_desc *opts);

/* The routing alone: for x [T, H], the chosen experts (i32 [T, k]) and their weights (f32
 * [T, k], renormalized and scaled as the forward uses them), in slot order, without running
 * the experts: what sc_moe_forward takes back as opts->routing_ids / routing_weights. The
 * statuses of sc_moe_forward for x, ids and weights. */
SC_API sc_status sc_moe_route(sc_stream stream, sc_moe layer, sc_view x, sc_view ids,
                              sc_view weights);

/* Wait for stream and report a routing id >= E met by an unchecked forward since the last
 * report: SC_ERR_INVALID_ARGUMENT naming the token, slot and id (then forgotten); SC_OK when
 * none. */
SC_API sc_status sc_moe_routing_check(sc_stream stream, sc_moe layer);

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
