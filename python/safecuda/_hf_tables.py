"""The transformers families safecuda.torch.from_transformers maps, by class name, and the
readers of their routers, experts and shared experts (used by _hf_spec.moe_spec).

Each reader states the family's semantics as its modeling_*.py computes them
(transformers 5.x, checked against 5.17) and what the layer's options make of them; a
reader refuses (UnsupportedBlockError) where the layer would compute something else."""

import torch

from ._hf_spec import (FP8_BLOCK, MAX_GROUPS, MAX_SHARED, Source, TensorSpec,
                       UnsupportedBlockError, activation_of, as_f32, as_vector, borrow,
                       padded_cols, require_activation, stacked_rows, transposed)

# ---- routers -----------------------------------------------------------------------------------


def _weight(router, path):
    return borrow("router_weight", Source(router, "weight", f"{path}.weight"))


def _top_k(router):
    return int(router.top_k)


def r_softmax(block, router, info, renormalize=None):
    """softmax over the E logits (float32), top-k, divided by their sum when
    norm_topk_prob (Qwen2/3-MoE, OLMoE, ...) or always (Mixtral, Qwen3-VL, ...)."""
    norm = bool(router.norm_topk_prob) if renormalize is None else renormalize
    return dict(top_k=_top_k(router), scoring="softmax", renormalize=norm,
                tensors=dict(router_weight=_weight(router, info["router"])))


def r_softmax_norm(block, router, info):
    return r_softmax(block, router, info, renormalize=True)


def r_topk_logits(block, router, info):
    """top-k of the logits (+ the router Linear's bias), softmax over those k: the same
    choice and weights as softmax over E renormalized (gpt-oss, Granite-MoE)."""
    p = info["router"]
    out = dict(top_k=_top_k(router), scoring="softmax", renormalize=True,
               tensors=dict(router_weight=_weight(router, p)))
    if getattr(router, "bias", None) is not None:
        out["tensors"]["router_bias"] = as_f32("router_bias", Source(router, "bias", f"{p}.bias"))
    return out


def r_privacy_filter(block, router, info):
    """gpt-oss's routing divided by top_k, the block's output multiplied by num_experts
    (= top_k): routed_scaling num_experts / top_k."""
    out = r_topk_logits(block, router, info)
    k = out["top_k"]
    out["routed_scaling"] = float(block.num_experts) / k
    out["score_scale"] = 1.0 / float(block.num_experts)
    return out


def _groups(block, router, E, k, n_group, topk_group, what):
    """(n_group, topk_group) for the layer: 0, 0 where the grouping keeps every expert."""
    if not n_group or not topk_group or int(topk_group) >= int(n_group):
        return 0, 0
    n_group, topk_group = int(n_group), int(topk_group)
    cls = type(block).__name__
    if E % n_group or E // n_group < 2:
        raise UnsupportedBlockError(cls, f"{what} groups {E} experts into {n_group} groups; "
                                    f"the layer's groups hold 2 or more experts each")
    if n_group > MAX_GROUPS:
        raise UnsupportedBlockError(cls, f"{what} uses {n_group} expert groups; the layer "
                                    f"takes at most {MAX_GROUPS}")
    if k > topk_group * (E // n_group):
        raise UnsupportedBlockError(cls, f"top-{k} from {topk_group} groups of "
                                    f"{E // n_group}: fewer experts than it chooses")
    return n_group, topk_group


def _scaling(block, value, what):
    v = float(value)
    if not (v > 0.0) or v != v or v == float("inf"):
        raise UnsupportedBlockError(type(block).__name__, f"{what} = {value}; the layer "
                                    f"scales the routed weights by a finite factor > 0")
    return v


def r_deepseek_v3(block, router, info, zero_mask=False):
    """sigmoid of float32 logits; the choice on score + e_score_correction_bias, within the
    topk_group best of n_group groups (a group scored by the sum of its two best), the
    other groups' experts masked with -inf; weights = the chosen scores, / (their sum +
    1e-20) when norm_topk_prob, x routed_scaling_factor. zero_mask: the dropped groups
    masked with 0.0 instead (A.X-K2), the same choice only where no kept expert's selection
    score is negative."""
    p = info["router"]
    E, k = int(router.weight.shape[0]), _top_k(router)
    n_group, topk_group = _groups(block, router, E, k, router.num_group, router.topk_group,
                                  "its router")
    bias = Source(router, "e_score_correction_bias", f"{p}.e_score_correction_bias")
    if zero_mask and n_group and bool((bias.tensor < 0).any()):
        raise UnsupportedBlockError(
            type(block).__name__, "its router masks the dropped groups' experts with 0.0, "
            "which a kept expert with a negative selection score (a negative "
            "e_score_correction_bias) ranks below; the layer masks with -inf")
    return dict(top_k=k, scoring="sigmoid", renormalize=bool(router.norm_topk_prob),
                n_group=n_group, topk_group=topk_group,
                routed_scaling=_scaling(block, router.routed_scaling_factor,
                                        "routed_scaling_factor"),
                tensors=dict(router_weight=_weight(router, p),
                             selection_bias=as_f32("selection_bias", bias)),
                notes=["renormalization divides by the sum (transformers adds 1e-20 to it)"]
                if router.norm_topk_prob else [])


def r_axk2(block, router, info):
    return r_deepseek_v3(block, router, info, zero_mask=True)


def r_deepseek_v2(block, router, info):
    """softmax over E (float32); topk_method "greedy": the top k; "group_limited_greedy":
    the top k of the topk_group groups with the best single expert (the layer scores a
    group by its two best: the same only where the grouping keeps every expert or a group
    is one expert); weights = the chosen scores x routed_scaling_factor (no
    renormalization in transformers' DeepSeek-V2)."""
    cls = type(block).__name__
    E, k = int(router.weight.shape[0]), _top_k(router)
    method = router.topk_method
    if method == "group_limited_greedy":
        n, tg = router.num_group, router.topk_group
        G = E // int(n) if n else E
        if n and tg and int(tg) < int(n) and not (G == 1 and k <= int(tg)):
            raise UnsupportedBlockError(
                cls, f"its router's group_limited_greedy routing scores a group by its best "
                f"expert (n_group={n}, topk_group={tg}); the layer's group-limited routing "
                f"scores a group by the sum of its two best experts (DeepSeek-V3's), a "
                f"different choice")
    elif method != "greedy":
        raise UnsupportedBlockError(cls, f"its router's topk_method {method!r} is not one "
                                    f"transformers' DeepSeek-V2 router computes")
    return dict(top_k=k, scoring="softmax", renormalize=False,
                routed_scaling=_scaling(block, router.routed_scaling_factor,
                                        "routed_scaling_factor"),
                tensors=dict(router_weight=_weight(router, info["router"])))


def r_sigmoid_bias(block, router, info, bias=None, scaling=1.0, renormalize=True, notes=()):
    """sigmoid of float32 logits, the choice on score + a selection bias, weights the
    chosen scores renormalized, x scaling."""
    t = dict(router_weight=_weight(router, info["router"]))
    if bias is not None:
        t["selection_bias"] = as_f32("selection_bias", bias)
    return dict(top_k=_top_k(router), scoring="sigmoid", renormalize=renormalize,
                routed_scaling=scaling, tensors=t, notes=list(notes))


def r_minimax_m2(block, router, info):
    """MiniMax-M2: the selection bias is the block's e_score_correction_bias."""
    return r_sigmoid_bias(block, router, info,
                          Source(block, "e_score_correction_bias", "e_score_correction_bias"))


def r_router_bias(block, router, info):
    """Step-3.7, MiniMax-M3: the selection bias is the router's e_score_correction_bias."""
    p = info["router"]
    return r_sigmoid_bias(block, router, info,
                          Source(router, "e_score_correction_bias",
                                 f"{p}.e_score_correction_bias"))


def r_hy_v3(block, router, info):
    """Hunyuan V3: the block's e_score_correction_bias, / (sum + 1e-20),
    x router_scaling_factor."""
    return r_sigmoid_bias(block, router, info,
                          Source(block, "e_score_correction_bias", "e_score_correction_bias"),
                          _scaling(block, router.router_scaling_factor,
                                   "router_scaling_factor"),
                          notes=["renormalization divides by the sum (transformers adds "
                                 "1e-20 to it)"])


def r_laguna(block, router, info):
    cap = float(router.router_logit_softcapping or 0.0)
    if cap > 0.0:
        raise UnsupportedBlockError(type(block).__name__, f"its router soft-caps the logits "
                                    f"(tanh, moe_router_logit_softcapping = {cap}), which "
                                    f"the layer does not")
    return r_router_bias(block, router, info)


def r_mistral4(block, router, info):
    """softmax over E; DeepSeek-V3's groups on the plain scores (the dropped groups masked
    with 0.0: no kept softmax score is below it); / (sum + 1e-20) when norm_topk_prob;
    x routed_scaling_factor."""
    E, k = int(router.weight.shape[0]), _top_k(router)
    n_group, topk_group = _groups(block, router, E, k, router.num_group, router.topk_group,
                                  "its router")
    return dict(top_k=k, scoring="softmax", renormalize=bool(router.norm_topk_prob),
                n_group=n_group, topk_group=topk_group,
                routed_scaling=_scaling(block, router.routed_scaling_factor,
                                        "routed_scaling_factor"),
                tensors=dict(router_weight=_weight(router, info["router"])))


def r_cohere2(block, router, info):
    """top-k of the logits; "softmax": softmax over those k (= softmax over E
    renormalized); "sigmoid": their sigmoids (the same choice: sigmoid keeps the order),
    renormalized when norm_topk_prob."""
    fn = router.expert_selection_fn
    base = dict(top_k=_top_k(router), tensors=dict(router_weight=_weight(router,
                                                                         info["router"])))
    if fn == "softmax":
        return dict(base, scoring="softmax", renormalize=True)
    if fn == "sigmoid":
        return dict(base, scoring="sigmoid", renormalize=bool(router.norm_topk_prob))
    raise UnsupportedBlockError(type(block).__name__, f"expert_selection_fn {fn!r}")


def r_lfm2(block, router, info):
    """LFM2-MoE: sigmoid; the choice on score + the block's expert_bias when
    use_expert_bias; / (sum + 1e-6) when norm_topk_prob; x routed_scaling_factor."""
    bias = None
    if router.use_expert_bias:
        bias = Source(block, "expert_bias", "expert_bias")
    norm = bool(router.norm_topk_prob)
    return r_sigmoid_bias(block, router, info, bias,
                          _scaling(block, router.routed_scaling_factor,
                                   "routed_scaling_factor"), renormalize=norm,
                          notes=["renormalization divides by the sum (transformers adds 1e-6 "
                                 "to it: a relative difference of 1e-6 / the sum)"]
                          if norm else [])


def r_jamba(block, router, info):
    """Jamba: the block's router Linear; softmax over E, top-k, not renormalized."""
    if router.bias is not None:
        raise UnsupportedBlockError(type(block).__name__, "its router Linear has a bias")
    return dict(top_k=int(block.top_k), scoring="softmax", renormalize=False,
                tensors=dict(router_weight=_weight(router, info["router"])))


ROUTERS = {}
for _names, _fn in (
        (("Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "Qwen3NextTopKRouter", "OlmoeTopKRouter",
          "FlexOlmoTopKRouter", "MellumTopKRouter", "Qwen3OmniMoeThinkerTextTopKRouter",
          "Qwen3OmniMoeTalkerTextTopKRouter", "Qwen4ExpTextTopKRouter"), r_softmax),
        (("MixtralTopKRouter", "MiniMaxTopKRouter", "Qwen3VLMoeTextTopKRouter",
          "Qwen3_5MoeTopKRouter", "Qwen3OmniMoeTextTopKRouter"), r_softmax_norm),
        (("GptOssTopKRouter", "GraniteMoeTopKRouter", "GraniteMoeHybridTopKRouter",
          "GraniteMoeSharedTopKRouter", "GraniteMoeSWATopKRouter"), r_topk_logits),
        (("OpenAIPrivacyFilterTopKRouter",), r_privacy_filter),
        (("DeepseekV3TopkRouter", "DeepseekV32TopkRouter", "Dots1TopkRouter",
          "Glm4MoeTopkRouter", "Glm4MoeLiteTopkRouter", "Glm4vMoeTextTopkRouter",
          "GlmMoeDsaTopkRouter", "Glm5NextTextTopkRouter", "HYV4TopkRouter",
          "KimiLinearTopkRouter", "MiMoV2FlashTopkRouter", "SolarOpenTopkRouter",
          "ExaoneMoeTopkRouter", "AXK1TopkRouter"), r_deepseek_v3),
        (("AXK2TopkRouter",), r_axk2),
        (("DeepseekV2TopkRouter", "DeepseekOcr2TextTopkRouter"), r_deepseek_v2),
        (("MiniMaxM2TopKRouter",), r_minimax_m2),
        (("Step3p7TopKRouter", "MiniMaxM3VLTopKRouter"), r_router_bias),
        (("HYV3TopKRouter",), r_hy_v3),
        (("LagunaTopKRouter",), r_laguna),
        (("Mistral4TopkRouter",), r_mistral4),
        (("Cohere2MoeTopKRouter",), r_cohere2),
        (("Lfm2MoeTopKRouter",), r_lfm2)):
    for _n in _names:
        ROUTERS[_n] = _fn

REFUSED_ROUTERS = {
    "PhimoeTopKRouter": "sparsemixer routing (the second expert chosen after masking the "
                        "first by a relative threshold, each weight from its own masked "
                        "softmax)",
    "InklingTopkRouter": "shared experts weighted by the router (a log-sigmoid "
                         "normalization over the chosen and the shared experts' logits)",
    "Llama4Router": "top-1 routing whose sigmoid score scales the expert's input, not its "
                    "output",
    "DeepseekV4HashRouter": "hash routing (experts chosen from the token id)",
    "LongcatFlashTopkRouter": "zero-computation (identity) experts among the routed ones",
}

# ---- routed experts -----------------------------------------------------------------------------


def _default_gate(experts):
    fn = getattr(type(experts), "_apply_gate", None)
    return fn is None or getattr(fn, "__name__", "") == "_default_apply_gate"


def e_glu(block, experts, act=None):
    """gate_up_proj [E, 2I, H] (gate rows first: chunk(2)) = W13 stacked; down_proj
    [E, H, I] = W2; act_fn(gate) * up (act: the activation options where the family's
    reader has read its own _apply_gate). Both borrowed."""
    cls = type(block).__name__
    flags = dict(has_gate=True, has_bias=False, is_transposed=False, is_concatenated=True)
    for f, want in flags.items():
        if hasattr(experts, f) and bool(getattr(experts, f)) != want:
            raise UnsupportedBlockError(cls, f"its experts have {f}={getattr(experts, f)}")
    if act is None and not _default_gate(experts):
        raise UnsupportedBlockError(cls, f"its experts ({type(experts).__name__}) override "
                                    f"the gate/up activation (_apply_gate)")
    gu, dp = experts.gate_up_proj, experts.down_proj
    E, I2, H = gu.shape
    I_ = I2 // 2
    if tuple(dp.shape) != (E, H, I_):
        raise UnsupportedBlockError(cls, f"its experts' down_proj is {list(dp.shape)}; "
                                    f"[E={E}, H={H}, I={I_}] expected")
    if act is None:
        act = dict(activation=require_activation(cls, experts.act_fn, "its experts"))
    return dict(options=dict(act, w13_layout="stacked"),
                tensors=dict(w13=borrow("w13", Source(experts, "gate_up_proj",
                                                      "experts.gate_up_proj")),
                             w2=borrow("w2", Source(experts, "down_proj", "experts.down_proj"))),
                E=int(E), H=int(H), I=int(I_), fp8=False)


def e_clamp_after_act(block, experts):
    """Step-3.7: act_fn(gate).clamp(max=limit) * up.clamp(-limit, limit): SiLU-GLU where the
    limit is infinite (its default), else refused."""
    lim = float(experts.limit)
    if lim != float("inf"):
        raise UnsupportedBlockError(type(block).__name__, f"its experts clamp the activated "
                                    f"gate and up to {lim} (swiglu_limits), which the layer "
                                    f"does not (its clamped SwiGLU is gpt-oss's)")
    return e_glu(block, experts, dict(activation=require_activation(
        type(block).__name__, experts.act_fn, "its experts")))


def e_clamp_before_act(block, experts):
    """GLM-5-Next, DeepSeek-V4: gate.clamp(max=limit), up.clamp(-limit, limit), then a plain
    GLU: refused where the limit is finite (the layer's clamped SwiGLU is gpt-oss's, with
    alpha and up + 1)."""
    lim = getattr(experts, "swiglu_limit", getattr(experts, "limit", None))
    if lim is not None and float(lim) != float("inf"):
        raise UnsupportedBlockError(type(block).__name__, f"its experts clamp gate and up to "
                                    f"{lim} before a plain GLU; the layer's clamped SwiGLU is "
                                    f"gpt-oss's (alpha, up + 1)")
    return e_glu(block, experts, dict(activation=require_activation(
        type(block).__name__, getattr(experts, "act_fn", torch.nn.functional.silu),
        "its experts")))


def e_swiglu_stacked(block, experts):
    """MiniMax-M3: gpt-oss's clamped SwiGLU (alpha, limit, up + 1) on chunk(2) gate/up."""
    return e_glu(block, experts, dict(activation="swiglu_clamp",
                                      swiglu_alpha=float(experts.swiglu_alpha),
                                      swiglu_limit=float(experts.swiglu_limit)))


def _input_major(block, experts, layout):
    """gpt-oss-like experts: gate_up_proj [E, H, 2I] and down_proj [E, I, H] input-major
    (x @ W), biases [E, 2I] and [E, H]; clamped SwiGLU (alpha, limit). The weights are
    transposed once into the layer's [E, 2I, H] and [E, H, I] (copies)."""
    cls = type(block).__name__
    gu, dp = experts.gate_up_proj, experts.down_proj
    E, H, I2 = gu.shape
    I_ = I2 // 2
    if tuple(dp.shape) != (E, I_, H):
        raise UnsupportedBlockError(cls, f"its experts' down_proj is {list(dp.shape)}; "
                                    f"[E={E}, I={I_}, H={H}] expected")
    t = dict(w13=transposed("w13", Source(experts, "gate_up_proj", "experts.gate_up_proj")),
             w2=transposed("w2", Source(experts, "down_proj", "experts.down_proj")))
    for name, attr in (("w13_bias", "gate_up_proj_bias"), ("w2_bias", "down_proj_bias")):
        if getattr(experts, attr, None) is not None:
            t[name] = as_f32(name, Source(experts, attr, f"experts.{attr}"))
    return dict(options=dict(activation="swiglu_clamp", swiglu_alpha=float(experts.alpha),
                             swiglu_limit=float(experts.limit), w13_layout=layout),
                tensors=t, E=int(E), H=int(H), I=int(I_), fp8=False)


def e_gpt_oss(block, experts):
    """gpt-oss: gate and up interleaved along the last dimension ([..., ::2], [..., 1::2])."""
    return _input_major(block, experts, "interleaved")


def e_privacy_filter(block, experts):
    """OpenAI privacy filter: as gpt-oss with gate and up stacked (chunk(2))."""
    return _input_major(block, experts, "stacked")


def fp8_experts(block, experts):
    """transformers' fine-grained FP8 experts (FP8Experts, the "fp8" quantizer):
    gate_up_proj float8_e4m3fn [E, 2I, H] with gate_up_proj_scale_inv float32 [E, 2I/128,
    H/128], down_proj [E, H, I] with down_proj_scale_inv [E, H/128, I/128] (weight = e4m3
    value x scale): the layer's fp8 experts, borrowed without dequantizing (ue8m0 scales
    copied to float32, exactly). Dynamic activation scales only."""
    cls = type(block).__name__
    bs = getattr(experts, "block_size", None)
    if bs is None or tuple(int(b) for b in bs) != (FP8_BLOCK, FP8_BLOCK):
        raise UnsupportedBlockError(cls, f"its fp8 experts' weight_block_size is {bs}; the "
                                    f"layer's fp8 experts have one scale per {FP8_BLOCK} x "
                                    f"{FP8_BLOCK} block")
    if getattr(experts, "activation_scheme", "dynamic") != "dynamic":
        raise UnsupportedBlockError(cls, f"its fp8 experts use activation_scheme "
                                    f"{experts.activation_scheme!r}; the layer quantizes "
                                    f"activations dynamically (per token, per 128 channels)")
    if not getattr(experts, "has_gate", True) or getattr(experts, "has_bias", False):
        raise UnsupportedBlockError(cls, "its fp8 experts are not a GLU without biases")
    gu, dp = experts.gate_up_proj, experts.down_proj
    if gu.dtype != torch.float8_e4m3fn or dp.dtype != torch.float8_e4m3fn:
        raise UnsupportedBlockError(cls, f"its quantized experts are {gu.dtype}; the layer "
                                    f"takes float8_e4m3fn (fp4 experts are not supported)")
    E, I2, H = gu.shape
    I_ = I2 // 2
    if H % FP8_BLOCK or I_ % FP8_BLOCK:
        raise UnsupportedBlockError(cls, f"fp8 experts of hidden size {H} and expert size "
                                    f"{I_}; the layer's fp8 experts need multiples of "
                                    f"{FP8_BLOCK}")
    alpha = getattr(experts, "swiglu_alpha", None)
    limit = getattr(experts, "swiglu_limit", None)
    if alpha is not None:
        act = dict(activation="swiglu_clamp", swiglu_alpha=float(alpha),
                   swiglu_limit=float(limit))
    elif getattr(experts, "limit", None) is not None:
        raise UnsupportedBlockError(cls, f"its fp8 experts clamp gate and up to "
                                    f"{experts.limit} before a plain GLU")
    else:
        act = dict(activation=require_activation(cls, experts.act_fn, "its fp8 experts"))
    t = dict(w13=borrow("w13", Source(experts, "gate_up_proj", "experts.gate_up_proj")),
             w2=borrow("w2", Source(experts, "down_proj", "experts.down_proj")))
    B = FP8_BLOCK
    for name, attr, shape in (("w13_scale", "gate_up_proj_scale_inv", (E, 2 * I_ // B, H // B)),
                              ("w2_scale", "down_proj_scale_inv", (E, H // B, I_ // B))):
        s = getattr(experts, attr)
        if tuple(s.shape) != shape:
            raise UnsupportedBlockError(cls, f"experts.{attr} is {list(s.shape)}; "
                                        f"{list(shape)} expected for 128 x 128 blocks")
        t[name] = as_f32(name, Source(experts, attr, f"experts.{attr}"))
    return dict(options=dict(act, w13_layout="stacked"), tensors=t, E=int(E), H=int(H),
                I=int(I_), fp8=True)


_STANDARD_EXPERTS = (
    "MixtralExperts", "MiniMaxExperts", "MiniMaxM2Experts", "OlmoeExperts", "FlexOlmoExperts",
    "PhimoeExperts", "JambaExperts", "GraniteMoeExperts", "GraniteMoeSWAExperts",
    "GraniteMoeHybridExperts", "GraniteMoeSharedExperts", "HunYuanMoEV1Experts",
    "Qwen2MoeExperts", "Qwen3MoeExperts", "Qwen3NextExperts", "Qwen3_5MoeExperts",
    "Qwen3VLMoeTextExperts", "Qwen3OmniMoeThinkerTextExperts", "Qwen3OmniMoeTalkerTextExperts",
    "Qwen4ExpTextExperts", "MellumExperts", "DeepseekV2Experts", "DeepseekOcr2TextExperts",
    "DeepseekV3Experts", "DeepseekV32Experts", "Dots1Experts", "Glm4MoeExperts",
    "Glm4MoeLiteExperts", "Glm4vMoeTextExperts", "GlmMoeDsaExperts", "KimiLinearExperts",
    "MiMoV2FlashExperts", "Mistral4Experts", "SolarOpenExperts", "AXK1Experts", "AXK2Experts",
    "ExaoneMoeExperts", "HYV3Experts", "LagunaExperts", "Ernie4_5_MoeExperts", "AfmoeExperts",
    "ZayaExperts", "Lfm2MoeExperts", "Cohere2MoeExperts")
EXPERTS = {n: e_glu for n in _STANDARD_EXPERTS}
EXPERTS.update(GptOssExperts=e_gpt_oss, OpenAIPrivacyFilterExperts=e_privacy_filter,
               MiniMaxM3VLExperts=e_swiglu_stacked, Step3p7Experts=e_clamp_after_act,
               Glm5NextTextExperts=e_clamp_before_act, HYV4Experts=e_clamp_before_act,
               DeepseekV4Experts=e_clamp_before_act)
REFUSED_EXPERTS = {
    "NemotronHExperts": "are not gated (up_proj and a ReLU^2, no gate): the layer's experts "
                        "are GLUs",
}

# ---- shared experts ------------------------------------------------------------------------------

_SHARED_GLU = (
    "DeepseekV3MLP", "DeepseekV32MLP", "Dots1MLP", "Glm4MoeMLP", "Glm4MoeLiteMLP",
    "Glm4vMoeTextMLP", "GlmMoeDsaMLP", "HYV4MLP", "KimiLinearMLP", "Mistral4MLP",
    "SolarOpenMLP", "AXK1MLP", "AXK2MLP", "ExaoneMoeMLP", "Qwen2MoeMLP", "Qwen3MoeMLP",
    "Qwen3NextMLP", "Qwen3_5MoeMLP", "Qwen3OmniMoeTalkerTextMLP", "Qwen4ExpTextMLP",
    "LagunaMLP", "HYV3MLP", "Cohere2MoeMLP", "DeepseekV2MLP", "DeepseekOcr2TextMLP",
    "Step3p7MLP")


def _is_fp8_linear(m):
    return type(m).__name__ == "FP8Linear" or hasattr(m, "weight_scale_inv")


def shared_mlp(block, mlp, path, act, I_, fp8):
    """gate_proj, up_proj, down_proj Linears without biases, act_fn(gate(x)) * up(x) in the
    routed experts' activation: shared_w13 = [gate_proj.weight; up_proj.weight] (one copy,
    or borrowed where they lie one after the other already), shared_w2 = down_proj.weight.
    A size that is not a multiple of the routed experts' I is padded with zero rows and
    columns (exact: h = 0 there). MiniMax-M3's DenseMLP: a stacked gate_up_proj Linear,
    borrowed, in gpt-oss's clamped SwiGLU."""
    cls = type(block).__name__
    name = type(mlp).__name__
    if name == "MiniMaxM3VLDenseMLP":
        if act.get("activation") != "swiglu_clamp" or \
                float(mlp.swiglu_alpha) != act.get("swiglu_alpha") or \
                float(mlp.swiglu_limit) != act.get("swiglu_limit"):
            raise UnsupportedBlockError(cls, "its shared expert's activation differs from "
                                        "the routed experts'; the layer uses one for both")
        w13 = mlp.gate_up_proj.weight
        Is = w13.shape[0] // 2
        if Is % I_ or Is // I_ > MAX_SHARED or mlp.gate_up_proj.bias is not None or \
                mlp.down_proj.bias is not None:
            raise UnsupportedBlockError(cls, f"its shared expert of size {Is} (routed {I_}) "
                                        f"is not a bias-free multiple of at most {MAX_SHARED}")
        return dict(shared_w13=borrow("shared_w13", Source(mlp.gate_up_proj, "weight",
                                                           f"{path}.gate_up_proj.weight")),
                    shared_w2=borrow("shared_w2", Source(mlp.down_proj, "weight",
                                                         f"{path}.down_proj.weight"))), Is
    if name not in _SHARED_GLU:
        raise UnsupportedBlockError(cls, f"its shared expert ({name}) is not an MLP safecuda's "
                                    f"layer is known to compute")
    lins = [getattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
    if any(getattr(m, "bias", None) is not None for m in lins):
        raise UnsupportedBlockError(cls, "its shared expert's projections have biases; the "
                                    "layer's shared expert has none")
    limit = getattr(mlp, "limit", None)
    if limit is not None and float(limit) != float("inf"):
        raise UnsupportedBlockError(cls, f"its shared expert clamps to {limit}, which the "
                                    f"layer does not")
    sact = activation_of(mlp.act_fn)
    if act.get("activation") != sact:
        raise UnsupportedBlockError(cls, f"its shared expert's activation "
                                    f"({type(mlp.act_fn).__name__}) differs from the routed "
                                    f"experts' ({act.get('activation')}); the layer uses one "
                                    f"for both")
    sfp8 = any(_is_fp8_linear(m) for m in lins)
    if sfp8 != fp8:
        raise UnsupportedBlockError(
            cls, f"its shared expert is {'fp8' if sfp8 else 'not fp8'} while the routed experts "
            f"are {'fp8' if fp8 else 'not'}; the layer holds them in one dtype")
    Is = int(lins[0].weight.shape[0])
    if Is == 0:
        return {}, 0
    pad = None
    if Is % I_:
        pad = -(-Is // I_) * I_
        if fp8:
            raise UnsupportedBlockError(cls, f"its fp8 shared expert's size {Is} is not a "
                                        f"multiple of the routed experts' {I_}")
    if (pad or Is) // I_ > MAX_SHARED:
        raise UnsupportedBlockError(cls, f"its shared expert of size {Is} is more than "
                                    f"{MAX_SHARED} times the routed experts' {I_}")
    g, u, d = (Source(m, "weight", f"{path}.{n}.weight")
               for m, n in zip(lins, ("gate_proj", "up_proj", "down_proj")))
    why = "gate_proj and up_proj weights stacked"
    if pad:
        why += f", padded with zeros from {Is} to {pad} rows"
    out = dict(shared_w13=stacked_rows("shared_w13", [g, u], why, pad_to=pad))
    if pad:
        out["shared_w2"] = padded_cols("shared_w2", d, pad, f"padded with zero columns from "
                                       f"{Is} to {pad}")
    else:
        out["shared_w2"] = borrow("shared_w2", d)
    if fp8:
        gs, us, ds = (Source(m, "weight_scale_inv", f"{path}.{n}.weight_scale_inv")
                      for m, n in zip(lins, ("gate_proj", "up_proj", "down_proj")))
        for m in lins:
            bs = getattr(m, "block_size", None)
            if bs is None or tuple(int(b) for b in bs) != (FP8_BLOCK, FP8_BLOCK):
                raise UnsupportedBlockError(cls, f"its fp8 shared expert's block size is {bs}")
        out["shared_w13_scale"] = stacked_rows("shared_w13_scale", [gs, us],
                                               "gate_proj and up_proj scales stacked")
        if gs.tensor.dtype != torch.float32:
            s = out["shared_w13_scale"]
            out["shared_w13_scale"] = TensorSpec(
                s.name, s.sources, "copied", lambda s=s: s.make().to(torch.float32),
                s.shape, torch.float32, "scales stacked, as float32")
        out["shared_w2_scale"] = as_f32("shared_w2_scale", ds)
    return out, pad or Is


def shared_gate(block, lin, path, H):
    """A Linear(H, 1) without bias: its [1, H] weight as shared_gate [H] (a view). An FP8
    one (a gate the quantizer converted) dequantized into a copy in the router's dtype."""
    cls = type(block).__name__
    if getattr(lin, "bias", None) is not None:
        raise UnsupportedBlockError(cls, "its shared expert gate has a bias; the layer's has "
                                    "none")
    src = Source(lin, "weight", f"{path}.weight")
    if not _is_fp8_linear(lin) and src.tensor.dtype != torch.float8_e4m3fn:
        return as_vector("shared_gate", src, H)
    sc = Source(lin, "weight_scale_inv", f"{path}.weight_scale_inv")

    def make():
        w = src.tensor.detach().float().reshape(1, H)
        s = sc.tensor.detach().float().reshape(-1)
        per = s.repeat_interleave(FP8_BLOCK)[:H] if s.numel() > 1 else s.expand(H)
        return (w.reshape(H) * per).to(torch.bfloat16)

    return TensorSpec("shared_gate", [src, sc], "copied", make, (H,), torch.bfloat16,
                      "an fp8 gate dequantized to bfloat16")
