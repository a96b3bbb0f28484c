"""Small transformers MoE blocks of each family, built from their config classes (random
weights, no download), for the host tests (test_hf_mapping.py) and the GPU tests
(test_gpu_hf_patch.py); and the float32 reference of what safecuda's layer computes from a
spec (moe_reference.py's, which follows include/safecuda/moe.h)."""

import importlib

from moe_reference import moe_reference

# Options every config gets (each takes the names it knows; the others are kept as
# attributes): 16 experts, top-4, 2 of 4 groups where the family groups.
BASE = dict(hidden_size=64, intermediate_size=32, moe_intermediate_size=32, num_experts=16,
            num_local_experts=16, n_routed_experts=16, num_experts_per_tok=4,
            n_shared_experts=1, num_shared_experts=1, shared_expert_intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=128)

# id: (model type, block class, config class, config overrides)
FAMILIES = {
    "mixtral": ("mixtral", "MixtralSparseMoeBlock", "MixtralConfig", {}),
    "minimax": ("minimax", "MiniMaxSparseMoeBlock", "MiniMaxConfig", {}),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeSparseMoeBlock", "Qwen2MoeConfig",
                  dict(shared_expert_intermediate_size=80)),  # padded to 96
    "qwen2_moe_norm": ("qwen2_moe", "Qwen2MoeSparseMoeBlock", "Qwen2MoeConfig",
                       dict(norm_topk_prob=True)),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeSparseMoeBlock", "Qwen3MoeConfig",
                  dict(norm_topk_prob=True)),
    "qwen3_moe_gelu": ("qwen3_moe", "Qwen3MoeSparseMoeBlock", "Qwen3MoeConfig",
                       dict(hidden_act="gelu_pytorch_tanh")),
    "qwen3_vl_moe": ("qwen3_vl_moe", "Qwen3VLMoeTextSparseMoeBlock", "Qwen3VLMoeTextConfig", {}),
    "qwen3_5_moe": ("qwen3_5_moe", "Qwen3_5MoeSparseMoeBlock", "Qwen3_5MoeTextConfig", {}),
    "qwen3_next": ("qwen3_next", "Qwen3NextSparseMoeBlock", "Qwen3NextConfig", {}),
    "olmoe": ("olmoe", "OlmoeSparseMoeBlock", "OlmoeConfig", {}),
    "flex_olmo": ("flex_olmo", "FlexOlmoSparseMoeBlock", "FlexOlmoConfig", {}),
    "jamba": ("jamba", "JambaSparseMoeBlock", "JambaConfig", {}),
    "granitemoe": ("granitemoe", "GraniteMoeMoE", "GraniteMoeConfig", {}),
    "deepseek_v2": ("deepseek_v2", "DeepseekV2Moe", "DeepseekV2Config",
                    dict(routed_scaling_factor=1.5, n_shared_experts=2)),
    "deepseek_v2_groups_all": ("deepseek_v2", "DeepseekV2Moe", "DeepseekV2Config",
                               dict(topk_method="group_limited_greedy", n_group=4,
                                    topk_group=4)),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3MoE", "DeepseekV3Config",
                    dict(n_group=4, topk_group=2, routed_scaling_factor=2.5)),
    "kimi_k2": ("deepseek_v3", "DeepseekV3MoE", "DeepseekV3Config",
                dict(n_group=1, topk_group=1, routed_scaling_factor=2.827)),
    "glm4_moe": ("glm4_moe", "Glm4MoeMoE", "Glm4MoeConfig",
                 dict(n_group=1, topk_group=1, routed_scaling_factor=2.5)),
    "dots1": ("dots1", "Dots1MoE", "Dots1Config", dict(n_group=2, topk_group=1)),
    "mimo_v2_flash": ("mimo_v2_flash", "MiMoV2FlashMoE", "MiMoV2FlashConfig", {}),
    "mistral4": ("mistral4", "Mistral4MoE", "Mistral4Config",
                 dict(n_group=4, topk_group=2, routed_scaling_factor=1.5)),
    "exaone_moe": ("exaone_moe", "ExaoneMoeSparseMoEBlock", "ExaoneMoeConfig", {}),
    "axk2": ("axk2", "AXK2MoE", "AXK2Config", {}),
    "minimax_m2": ("minimax_m2", "MiniMaxM2SparseMoeBlock", "MiniMaxM2Config", {}),
    "hy_v3": ("hy_v3", "HYV3MoE", "HYV3Config", dict(router_scaling_factor=1.3)),
    "laguna": ("laguna", "LagunaSparseMoeBlock", "LagunaConfig",
               dict(moe_routed_scaling_factor=2.0)),
    "step3p7": ("step3p7", "Step3p7SparseMoeBlock", "Step3p7TextConfig",
                dict(share_expert_dim=64, moe_router_scaling_factor=1.7)),
    "minimax_m3": ("minimax_m3_vl", "MiniMaxM3VLSparseMoeBlock", "MiniMaxM3VLTextConfig",
                   dict(shared_intermediate_size=64)),
    "cohere2_moe": ("cohere2_moe", "Cohere2MoeSparseMoeBlock", "Cohere2MoeConfig", {}),
    "cohere2_moe_sum_sigmoid": ("cohere2_moe", "Cohere2MoeSparseMoeBlock", "Cohere2MoeConfig",
                                dict(shared_expert_combination_strategy="sum",
                                     expert_selection_fn="sigmoid")),
    "lfm2_moe": ("lfm2_moe", "Lfm2MoeSparseMoeBlock", "Lfm2MoeConfig",
                 dict(routed_scaling_factor=1.25)),
    "gpt_oss": ("gpt_oss", "GptOssMLP", "GptOssConfig", {}),
    "privacy_filter": ("openai_privacy_filter", "OpenAIPrivacyFilterMLP",
                       "OpenAIPrivacyFilterConfig", {}),
}


def block_class(transformers, model_type, cls):
    m = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    return getattr(m, cls)


def make_config(transformers, model_type, config_cls, overrides, base=BASE):
    c = importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}")
    cfg = getattr(c, config_cls)(**dict(base, **overrides))
    cfg._experts_implementation = "eager"
    return cfg


def make_block(torch, transformers, family, seed=0, base=BASE, dtype=None, device=None,
               **extra):
    """A block of the family with random weights (float32 on the CPU unless told)."""
    model_type, cls, config_cls, overrides = FAMILIES[family]
    cfg = make_config(transformers, model_type, config_cls, dict(overrides, **extra), base)
    B = block_class(transformers, model_type, cls)
    try:
        block = B(cfg)
    except TypeError:
        block = B(cfg, 0)
    fill(torch, block, seed)
    block.eval()
    if dtype is not None or device is not None:
        block.to(device=device, dtype=dtype)
    return block


def fill(torch, block, seed):
    """Random values everywhere: weights N(0, 1/fan_in), biases N(0, 0.5^2), selection
    biases in [-0.05, 0.25); gpt-oss-like gate/up weights 3x larger (the clamps act)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(block.named_parameters()) + list(block.named_buffers()):
            if not t.dtype.is_floating_point or t.numel() == 0:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("e_score_correction_bias", "expert_bias"):
                v = torch.rand(t.shape, generator=g) * 0.3 - 0.05
            elif leaf.endswith("bias"):
                v = torch.randn(t.shape, generator=g) * 0.5
            elif t.dim() >= 2:
                owner = block.get_submodule(name.rsplit(".", 1)[0]) if "." in name else block
                transposed = bool(getattr(owner, "is_transposed", False))
                fan_in = t.shape[-2] if transposed else t.shape[-1]
                v = torch.randn(t.shape, generator=g) * fan_in ** -0.5
                if transposed and leaf == "gate_up_proj":
                    v = v * 3.0
            else:
                v = torch.randn(t.shape, generator=g) * 0.5
            t.copy_(v.to(t.dtype))


def hf_forward(torch, block, x):
    """The block on x [T, H] (as [1, T, H]): (output [T, H], the rest of a tuple or None)."""
    with torch.no_grad():
        out = block(x.unsqueeze(0))
    rest = None
    if isinstance(out, tuple):
        out, rest = out[0], out[1:]
    return out.reshape(x.shape[0], -1), rest


def spec_reference(torch, kw, x, dequant=None):
    """What safecuda's layer computes from the keyword arguments kw of a spec (float32):
    (out [T, H], ids [T, k], weights [T, k]). dequant(q, scale): fp8 weights to float32."""
    w13, w2 = kw["w13"], kw["w2"]
    sw13, sw2 = kw.get("shared_w13"), kw.get("shared_w2")
    if dequant is not None and w13.dtype == torch.float8_e4m3fn:
        w13, w2 = dequant(w13, kw["w13_scale"]), dequant(w2, kw["w2_scale"])
        if sw13 is not None:
            sw13 = dequant(sw13, kw["shared_w13_scale"])
            sw2 = dequant(sw2, kw["shared_w2_scale"])
    return moe_reference(
        torch, x, kw["router_weight"], w13, w2, kw["top_k"], kw["scoring"],
        kw["renormalize"], kw.get("selection_bias"), router_bias=kw.get("router_bias"),
        n_group=kw["n_group"], topk_group=kw["topk_group"], routed_scaling=kw["routed_scaling"],
        activation=kw["activation"], swiglu_alpha=kw["swiglu_alpha"],
        swiglu_limit=kw["swiglu_limit"], w13_layout=kw["w13_layout"],
        w13_bias=kw.get("w13_bias"), w2_bias=kw.get("w2_bias"), shared_w13=sw13,
        shared_w2=sw2, shared_gate=kw.get("shared_gate"))
