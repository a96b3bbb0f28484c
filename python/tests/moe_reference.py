"""The MoE layer of include/safecuda/moe.h in float32 PyTorch, for the GPU tests: every
option of the v2 desc (grouped routing, routed scaling, router bias, the activations, the
W13 layouts, biases, the shared expert and its gate), the caller's routing and the
accumulation. The math is float32 throughout (no intermediate bf16 rounding): compare the
layer's bf16 output with a bf16 tolerance (rel_l2).

fp8 experts: quantize_fp8_blocks makes a checkpoint's e4m3 weights and 128 x 128 block
scales from bf16 ones, dequantize_fp8_blocks the float32 weights they stand for, and
quantize_fp8_rows the layer's quantization of x and h (per row per 128 channels), which
moe_reference applies with act_quant=quantize_fp8_rows."""

import math

GELU_C = math.sqrt(2.0 / math.pi)


def _sel_scores(torch, x, router, scoring, bias=None, router_bias=None):
    """(logits, scores, sel) [T, E] f32."""
    logits = x.float() @ router.float().t()
    if router_bias is not None:
        logits = logits + router_bias.float()
    scores = torch.sigmoid(logits) if scoring == "sigmoid" else torch.softmax(logits, dim=-1)
    sel = scores + bias.float() if bias is not None else scores
    return logits, scores, sel


def _group_mask(torch, sel, n_group, topk_group):
    """The experts of the topk_group best groups (a group scored by the sum of its two
    best sel; ties to the lower group), as a bool mask [T, E]; None without groups."""
    if not n_group:
        return None
    T, E = sel.shape
    G = E // n_group
    grouped = sel.view(T, n_group, G)
    top2 = grouped.topk(min(2, G), dim=-1).values.sum(dim=-1)  # [T, n_group]
    keep = torch.sort(top2, dim=-1, descending=True, stable=True).indices[:, :topk_group]
    gmask = torch.zeros_like(top2, dtype=torch.bool)
    gmask.scatter_(1, keep, True)
    return gmask.unsqueeze(-1).expand(T, n_group, G).reshape(T, E)


def route(torch, x, router, top_k, scoring, renormalize, bias=None, *, router_bias=None,
          n_group=0, topk_group=0, routed_scaling=0.0, with_weights=False):
    """(scores [T, E] f32, the top-k expert ids [T, k] by score + bias within the kept
    groups, ties to the lower index); with_weights=True adds the routing weights [T, k]
    (the chosen scores, renormalized, times routed_scaling)."""
    _, scores, sel = _sel_scores(torch, x, router, scoring, bias, router_bias)
    mask = _group_mask(torch, sel, n_group, topk_group)
    if mask is not None:
        sel = sel.masked_fill(~mask, float("-inf"))
    # torch.topk does not promise the lower index on ties: sort stably instead.
    ids = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :top_k]
    if not with_weights:
        return scores, ids
    return scores, ids, routing_weights(torch, scores, ids, renormalize, routed_scaling)


def routing_weights(torch, scores, ids, renormalize, routed_scaling=0.0):
    w = scores.gather(1, ids.long())
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w * (routed_scaling or 1.0)


def split_w13(w, inter, layout):
    """(gate rows, up rows) of a [.., 2 * inter, ..] W13 (or bias [.., 2 * inter]) in
    layout "stacked" (gate rows first) or "interleaved" (gate, up, gate, up, ...), along
    dimension -2 for a matrix, -1 for a bias (dim)."""
    if layout == "interleaved":
        return w[..., 0::2, :], w[..., 1::2, :]
    return w[..., :inter, :], w[..., inter:, :]


def split_bias(b, inter, layout):
    if layout == "interleaved":
        return b[..., 0::2], b[..., 1::2]
    return b[..., :inter], b[..., inter:]


def activate(torch, g, u, activation="silu", swiglu_alpha=None, swiglu_limit=None):
    """h = act(g, u) in f32 (moe.h's sc_moe_activation)."""
    if activation == "silu":
        return torch.nn.functional.silu(g) * u
    if activation == "gelu_tanh":
        return 0.5 * g * (1.0 + torch.tanh(GELU_C * (g + 0.044715 * g * g * g))) * u
    if activation == "swiglu_clamp":
        alpha = swiglu_alpha or 1.702
        limit = swiglu_limit or 7.0
        g = g.clamp(max=limit)
        u = u.clamp(min=-limit, max=limit)
        return g * torch.sigmoid(alpha * g) * (u + 1.0)
    raise ValueError(f"activation {activation!r}")


def expert_mlp(torch, xf, w13, w2, inter, *, b13=None, b2=None, activation="silu",
               swiglu_alpha=None, swiglu_limit=None, w13_layout="stacked", act_quant=None):
    """y = act(x Wg^T + bg, x Wu^T + bu) W2^T + b2 for one expert (f32); act_quant: h
    quantized (and dequantized) with it before W2."""
    wg, wu = split_w13(w13.float(), inter, w13_layout)
    g = xf @ wg.t()
    u = xf @ wu.t()
    if b13 is not None:
        bg, bu = split_bias(b13.float(), inter, w13_layout)
        g, u = g + bg, u + bu
    h = activate(torch, g, u, activation, swiglu_alpha, swiglu_limit)
    if act_quant is not None:
        h = act_quant(torch, h)
    y = h @ w2.float().t()
    return y + b2.float() if b2 is not None else y


# ---- fp8: the checkpoints' block quantization and the layer's ------------------------------

FP8_MAX = 448.0  # the largest finite e4m3fn value


def _block_scale(torch, amax):
    """(scale, inverse) of blocks whose largest magnitude is amax: amax / 448 and 448 /
    amax, 1 and 1 where amax is 0 (float32, as the layer computes them)."""
    zero = amax == 0
    one = torch.ones_like(amax)
    scale = torch.where(zero, one, amax / FP8_MAX)
    # One correctly rounded division, as the kernels': `FP8_MAX / tensor` would be
    # tensor.reciprocal() * FP8_MAX in torch (two roundings), one bit off for some amax,
    # which moves values that are exact e4m3 ties (common in bf16 data) to the other side.
    inv = torch.where(zero, one, torch.div(torch.full_like(amax, FP8_MAX),
                                           torch.where(zero, one, amax)))
    return scale, inv


def quantize_fp8_blocks(torch, w, block=128):
    """A weight [..., R, C] (R and C multiples of block) as an FP8 checkpoint holds it:
    (e4m3 [..., R, C], float32 scales [..., R/block, C/block]), each block's scale its
    largest magnitude / 448 and its values rounded (to nearest even) from v * (448 /
    amax): weight ~ e4m3 value x scale."""
    *lead, R, C = w.shape
    blocks = w.float().reshape(*lead, R // block, block, C // block, block)
    amax = blocks.abs().amax(dim=(-3, -1), keepdim=True)
    scale, inv = _block_scale(torch, amax)
    q = (blocks * inv).to(torch.float8_e4m3fn).reshape(*lead, R, C)
    return q, scale.reshape(*lead, R // block, C // block).contiguous()


def dequantize_fp8_blocks(torch, q, scale, block=128):
    """The float32 weight an e4m3 weight [..., R, C] and its block scales stand for."""
    s = scale.float().repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return q.float() * s


def quantize_fp8_rows(torch, v, block=128):
    """v [..., N] (float32) quantized as the layer quantizes x and h, per row per block
    channels (N a multiple of block): each value's dequantized e4m3 value, float32."""
    *lead, N = v.shape
    b = v.float().reshape(*lead, N // block, block)
    scale, inv = _block_scale(torch, b.abs().amax(dim=-1, keepdim=True))
    # torch's float8_e4m3fn cast rounds to nearest even and does not saturate (from 480 up
    # it gives NaN); |v * inv| <= 448 (times 1 + 2^-23) here, so nothing is lost.
    return ((b * inv).to(torch.float8_e4m3fn).float() * scale).reshape(v.shape)


def moe_reference(torch, x, router, w13, w2, top_k, scoring="softmax", renormalize=True,
                  bias=None, ids=None, *, weights=None, router_bias=None, n_group=0,
                  topk_group=0, routed_scaling=0.0, activation="silu", swiglu_alpha=None,
                  swiglu_limit=None, w13_layout="stacked", w13_bias=None, w2_bias=None,
                  shared_w13=None, shared_w2=None, shared_gate=None, accumulate=None,
                  act_quant=None):
    """out [T, H] f32 (and the ids and weights used).

    ids: use this choice of experts (the tested layer's) instead of the reference's own,
    where near-ties could order them differently; the weights are then the reference's
    scores of those experts (renormalized, scaled). ids and weights together: the
    caller's routing, used as given (an id < 0 is a padded slot, an id >= E is skipped).
    accumulate: a [T, H] tensor the output is added to. act_quant: the experts' inputs
    (x) and h quantized with it (quantize_fp8_rows: the fp8 layer's), the router and the
    shared gate taking x as it is; give the fp8 layer's weights dequantized."""
    E = router.shape[0]
    if weights is not None:
        if ids is None:
            raise ValueError("weights without ids")
        ids = ids.long()
        w = weights.float()
    else:
        scores, own = route(torch, x, router, top_k, scoring, renormalize, bias,
                            router_bias=router_bias, n_group=n_group, topk_group=topk_group)
        if ids is None:
            ids = own
        ids = ids.long()
        w = routing_weights(torch, scores, ids, renormalize, routed_scaling)
    xf = x.float()
    xe = xf if act_quant is None else act_quant(torch, xf)  # the experts' input
    out = torch.zeros_like(xf)
    I_ = w2.shape[2]
    for e in torch.unique(ids).tolist():
        if e < 0 or e >= E:
            continue  # a padded slot, or a bad id the layer skips
        tok, slot = torch.where(ids == e)
        y = expert_mlp(torch, xe[tok], w13[e], w2[e], I_,
                       b13=None if w13_bias is None else w13_bias[e],
                       b2=None if w2_bias is None else w2_bias[e], activation=activation,
                       swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit,
                       w13_layout=w13_layout, act_quant=act_quant)
        out.index_add_(0, tok, y * w[tok, slot, None])
    if shared_w13 is not None:
        I_s = shared_w2.shape[1]
        ys = expert_mlp(torch, xe, shared_w13, shared_w2, I_s, activation=activation,
                        swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit,
                        w13_layout=w13_layout, act_quant=act_quant)
        if shared_gate is not None:
            ys = ys * torch.sigmoid(xf @ shared_gate.float().reshape(-1, 1))
        out = out + ys
    if accumulate is not None:
        out = out + accumulate.float()
    return out, ids, w


def selection_margin(torch, x, router, top_k, scoring, bias=None, *, router_bias=None,
                     n_group=0, topk_group=0):
    """Per token, the smallest gap on which the choice turns (inf where none): between the
    k-th and (k+1)-th selection score among the allowed experts, and with groups between
    the topk_group-th and the next group score. Where it is tiny, two correct
    implementations may choose differently. The gaps are in logits for softmax without a
    selection bias or groups (the scores there are ~1/E: their gaps say little), else in
    selection scores."""
    logits, _, sel = _sel_scores(torch, x, router, scoring, bias, router_bias)
    if scoring == "softmax" and bias is None and not n_group:
        sel = logits  # the same order as the scores'
    T, E = sel.shape
    inf = torch.full((T,), float("inf"), device=sel.device)
    margin = inf
    mask = _group_mask(torch, sel, n_group, topk_group)
    if mask is not None and topk_group < n_group:
        G = E // n_group
        top2 = sel.view(T, n_group, G).topk(min(2, G), dim=-1).values.sum(dim=-1)
        g = torch.sort(top2, dim=-1, descending=True).values
        margin = torch.minimum(margin, g[:, topk_group - 1] - g[:, topk_group])
    if mask is not None:
        sel = sel.masked_fill(~mask, float("-inf"))
    allowed = E if mask is None else int(mask[0].sum().item())
    if top_k < allowed:
        s = torch.sort(sel, dim=-1, descending=True).values
        margin = torch.minimum(margin, s[:, top_k - 1] - s[:, top_k])
    return margin


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
