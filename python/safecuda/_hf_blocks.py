"""The transformers MoE blocks safecuda.torch.from_transformers maps (by class name), those
it refuses and why, and moe_spec: a block -> MoESpec (see _hf_spec.py).

A block's entry names its parts: the router ("gate" or "router"), the experts, an
optional shared expert and its sigmoid gate, a factor the block multiplies the routed
output by, and what its forward returns (gpt-oss: the output and the routing scores)."""

from . import _hf_tables as tables
from ._hf_spec import (MAX_SHARED, MoESpec, Source, UnsupportedBlockError, check_limits,
                       constant)


def _entries(names, **info):
    return {n: dict(info) for n in names}


BLOCKS = {}
# router + experts
BLOCKS.update(_entries(
    ("MixtralSparseMoeBlock", "MiniMaxSparseMoeBlock", "Qwen3MoeSparseMoeBlock",
     "Qwen3VLMoeTextSparseMoeBlock", "MellumSparseMoeBlock", "OlmoeSparseMoeBlock",
     "FlexOlmoSparseMoeBlock", "Qwen3OmniMoeThinkerTextSparseMoeBlock",
     "MiniMaxM2SparseMoeBlock", "MiMoV2FlashMoE", "Lfm2MoeSparseMoeBlock"), router="gate"))
BLOCKS.update(_entries(("GraniteMoeMoE", "GraniteMoeHybridMoE", "GraniteMoeSharedMoE",
                        "GraniteMoeSWAMoE", "JambaSparseMoeBlock"), router="router"))
# + a shared expert scaled by sigmoid(shared_expert_gate(x)) (Qwen2-MoE, Qwen3-Next)
BLOCKS.update(_entries(
    ("Qwen2MoeSparseMoeBlock", "Qwen3_5MoeSparseMoeBlock", "Qwen3NextSparseMoeBlock",
     "Qwen3OmniMoeTalkerTextSparseMoeBlock", "Qwen4ExpTextSparseMoeBlock"), router="gate",
    shared="shared_expert", shared_gate="shared_expert_gate"))
# + a shared expert added with weight 1 (DeepSeek-V2/V3, GLM-4.5, Kimi, ...)
BLOCKS.update(_entries(
    ("DeepseekV3MoE", "DeepseekV32MoE", "Dots1MoE", "Glm4MoeMoE", "Glm4MoeLiteMoE",
     "Glm4vMoeTextMoE", "GlmMoeDsaMoE", "Glm5NextTextMoE", "HYV4MoE", "KimiLinearMoE",
     "Mistral4MoE", "SolarOpenMoE", "AXK2MoE", "ExaoneMoeSparseMoEBlock", "DeepseekV2Moe",
     "DeepseekOcr2TextMoe", "HYV3MoE"), router="gate", shared="shared_experts"))
# + the routed output x routed_scaling_factor before the shared expert is added
BLOCKS.update(_entries(("Step3p7SparseMoeBlock", "LagunaSparseMoeBlock",
                        "MiniMaxM3VLSparseMoeBlock"), router="gate", shared="shared_experts",
                       routed_scale="routed_scaling_factor"))
BLOCKS["Cohere2MoeSparseMoeBlock"] = dict(router="gate", shared="shared_experts",
                                          combine="shared_expert_combination_strategy")
BLOCKS["GptOssMLP"] = dict(router="router", returns="hidden_and_scores")
BLOCKS["OpenAIPrivacyFilterMLP"] = dict(router="router", returns="hidden_and_scores")

REFUSED_BLOCKS = {
    "PhimoeSparseMoeBlock": "Phi-MoE's sparsemixer routing (the second expert chosen after "
                            "masking the first by a relative threshold), which the layer "
                            "does not compute",
    "InklingMoE": "its shared experts are weighted by the router (a log-sigmoid "
                  "normalization over routed and shared logits); the layer's shared expert "
                  "has weight 1 or sigmoid(x . gate)",
    "Llama4TextMoe": "Llama 4's top-1 routing scales the expert's input by the sigmoid "
                     "score (the layer scales the expert's output)",
    "DeepseekV4SparseMoeBlock": "DeepSeek-V4's sqrt-softplus scoring, hash routing and "
                                "clamped plain-SiLU experts, which the layer does not "
                                "compute",
    "LongcatFlashMoE": "LongCat-Flash's zero-computation (identity) experts among the "
                       "routed ones, which the layer does not have",
    "AXK1MoE": "its output goes through an RMSNorm (post_mlp_layernorm) inside the block, "
               "which the layer does not apply",
    "NemotronHMoE": "Nemotron-H's experts are not gated (up_proj and ReLU^2); the layer's "
                    "experts are GLUs",
    "JetMoeMoE": "JetMoE's experts are not a GLU of the layer's form (its own top-k gating "
                 "and bias), which the layer does not compute",
    "JetMoeMoA": "a mixture of attention heads, not of MLP experts",
    "NllbMoeSparseMLP": "NLLB-MoE's capacity-limited top-2 routing with token dropping and "
                        "ReLU experts, which the layer does not compute",
    "SwitchTransformersSparseMLP": "Switch Transformers' capacity-limited top-1 routing and "
                                   "ReLU experts, which the layer does not compute",
    "DbrxFFN": "DBRX's router normalizes the chosen weights by a p-norm "
               "(moe_normalize_expert_weights), which the layer does not compute",
    "AfmoeSparseMoeBlock": "AFMoE's routing (its token-choice router's scaling and shared "
                           "experts), which safecuda does not map",
    "HunYuanMoEV1Moe": "Hunyuan-MoE V1's routing (its own gate and capacity), which "
                       "safecuda does not map",
    "Ernie4_5_MoeSparseMoeBlock": "ERNIE-4.5's float32 router and its shared experts' "
                                  "layout, which safecuda does not map",
}


def _family(block):
    """The transformers model type (the models/<type>/ folder), else the class name."""
    mod = type(block).__module__ or ""
    parts = mod.split(".")
    if len(parts) >= 3 and parts[-3] == "models":
        return parts[-2]
    return type(block).__name__


def build_spec(block, info):
    cls = type(block).__name__
    rpath = info.get("router", "gate")
    router = getattr(block, rpath)
    reader = tables.ROUTERS.get(type(router).__name__)
    if reader is None and cls == "JambaSparseMoeBlock":
        reader = tables.r_jamba
    if reader is None:
        why = tables.REFUSED_ROUTERS.get(type(router).__name__)
        if why:
            raise UnsupportedBlockError(cls, f"its router {type(router).__name__} uses {why}, "
                                        f"which the layer does not compute")
        raise UnsupportedBlockError(cls, f"its router {type(router).__name__} is not one whose "
                                    f"routing safecuda's layer is known to compute")
    r = reader(block, router, dict(info, router=rpath))
    experts = block.experts
    xname = type(experts).__name__
    if xname == "FP8Experts" or hasattr(experts, "gate_up_proj_scale_inv"):
        x = tables.fp8_experts(block, experts)
    else:
        xr = tables.EXPERTS.get(xname)
        if xr is None:
            why = tables.REFUSED_EXPERTS.get(xname, "are not a layout safecuda's layer is known "
                                                    "to compute")
            raise UnsupportedBlockError(cls, f"its experts ({xname}) {why}")
        x = xr(block, experts)
    E, H, I_ = x["E"], x["H"], x["I"]
    rw = r["tensors"]["router_weight"]
    if rw.shape != (E, H):
        raise UnsupportedBlockError(cls, f"its router weight is {list(rw.shape)} and its "
                                    f"experts [E={E}, H={H}, I={I_}]")
    k = r["top_k"]
    check_limits(cls, E, k, H, I_)
    opts = dict(top_k=k, scoring=r["scoring"], renormalize=r["renormalize"],
                n_group=r.get("n_group", 0), topk_group=r.get("topk_group", 0),
                routed_scaling=float(r.get("routed_scaling", 1.0)))
    opts.update(activation="silu", swiglu_alpha=None, swiglu_limit=None)
    opts.update(x["options"])
    tensors = dict(r["tensors"])
    tensors.update(x["tensors"])
    notes = list(r.get("notes", ()))
    scale_attr = info.get("routed_scale")
    if scale_attr:
        s = float(getattr(block, scale_attr))
        tables._scaling(block, s, scale_attr)
        opts["routed_scaling"] *= s
    # The shared expert and its gate.
    shared = info.get("shared")
    mlp = getattr(block, shared, None) if shared else None
    if mlp is not None and cls == "Cohere2MoeSparseMoeBlock" and not block.num_shared_experts:
        mlp = None
    if mlp is not None:
        act = {k2: opts[k2] for k2 in ("activation", "swiglu_alpha", "swiglu_limit")}
        st, Is = tables.shared_mlp(block, mlp, shared, act, I_, x["fp8"])
        if Is:
            if Is // I_ > MAX_SHARED:
                raise UnsupportedBlockError(cls, "its shared expert is too large")
            tensors.update(st)
            gate = info.get("shared_gate")
            if gate:
                tensors["shared_gate"] = tables.shared_gate(block, getattr(block, gate), gate, H)
            combine = info.get("combine")
            if combine:
                how = getattr(block, combine)
                if how == "average":
                    # (routed + shared) / 2: the routed weights halved, the shared expert
                    # scaled by sigmoid(x . 0) = 1/2 exactly.
                    opts["routed_scaling"] *= 0.5
                    tensors["shared_gate"] = constant(
                        "shared_gate", Source(router, "weight", f"{rpath}.weight"), (H,), 0.0,
                        "zeros: sigmoid(0) = 1/2 halves the shared expert (the block averages "
                        "the routed and shared outputs)")
                elif how != "sum":
                    raise UnsupportedBlockError(cls, f"{combine} = {how!r}")
    score_scale = r.get("score_scale", 1.0)
    if opts["routed_scaling"] == 1.0:
        opts["routed_scaling"] = 0.0  # the layer's default: 1
    return MoESpec(_family(block), cls, opts, tensors, returns=info.get("returns", "hidden"),
                   score_scale=score_scale, notes=notes)


def moe_spec(block):
    """The MoESpec of a transformers MoE block instance, or UnsupportedBlockError naming its
    class and what the layer lacks."""
    cls = type(block).__name__
    info = BLOCKS.get(cls)
    if info is None:
        why = REFUSED_BLOCKS.get(cls)
        if why:
            raise UnsupportedBlockError(cls, why)
        raise UnsupportedBlockError(
            cls, "not a transformers Mixture-of-Experts block safecuda knows (it maps "
            + ", ".join(sorted(BLOCKS)) + ")")
    return build_spec(block, info)


def looks_like_moe(module):
    """Whether a module is a mixture-of-experts block (known or not): a known class, or one
    with an `experts` child."""
    cls = type(module).__name__
    if cls in BLOCKS or cls in REFUSED_BLOCKS:
        return True
    experts = getattr(module, "_modules", {}).get("experts")
    return experts is not None
