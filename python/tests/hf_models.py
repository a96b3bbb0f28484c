"""Small causal LMs of each required family for the GPU tests (test_gpu_hf_patch.py): two
layers, the families' real expert counts, top-k, routing and shared experts, small hidden
sizes and attention, random weights from the config (no download)."""

import copy

ATTN = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            vocab_size=1024, max_position_embeddings=512, initializer_range=0.05,
            tie_word_embeddings=False)
MLA = dict(q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
           v_head_dim=32, head_dim=32, first_k_dense_replace=0, num_key_value_heads=4)

# id: (config class, options): hidden 256, the family's experts
MODELS = {
    "mixtral": ("MixtralConfig", dict(hidden_size=256, intermediate_size=128,
                                      num_local_experts=8, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(hidden_size=256, moe_intermediate_size=64,
                                         shared_expert_intermediate_size=256, num_experts=60,
                                         num_experts_per_tok=4, intermediate_size=512)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=256, moe_intermediate_size=64,
                                         num_experts=128, num_experts_per_tok=8,
                                         norm_topk_prob=True, intermediate_size=512)),
    "qwen3_next": ("Qwen3NextConfig", dict(hidden_size=256, moe_intermediate_size=64,
                                           shared_expert_intermediate_size=64, num_experts=512,
                                           num_experts_per_tok=10, intermediate_size=512,
                                           layer_types=["full_attention"] * 2)),
    "olmoe": ("OlmoeConfig", dict(hidden_size=256, intermediate_size=64, num_experts=64,
                                  num_experts_per_tok=8)),
    "deepseek_v2": ("DeepseekV2Config", dict(MLA, hidden_size=256, moe_intermediate_size=64,
                                             n_routed_experts=64, num_experts_per_tok=6,
                                             n_shared_experts=2, intermediate_size=512,
                                             topk_method="greedy")),
    "deepseek_v3": ("DeepseekV3Config", dict(MLA, hidden_size=256, moe_intermediate_size=64,
                                             n_routed_experts=256, num_experts_per_tok=8,
                                             n_group=8, topk_group=4, routed_scaling_factor=2.5,
                                             n_shared_experts=1, intermediate_size=512)),
    "kimi_k2": ("DeepseekV3Config", dict(MLA, hidden_size=256, moe_intermediate_size=64,
                                         n_routed_experts=384, num_experts_per_tok=8, n_group=1,
                                         topk_group=1, routed_scaling_factor=2.827,
                                         n_shared_experts=1, intermediate_size=512)),
    "glm4_moe": ("Glm4MoeConfig", dict(hidden_size=256, moe_intermediate_size=64,
                                       n_routed_experts=160, num_experts_per_tok=8, n_group=1,
                                       topk_group=1, routed_scaling_factor=2.5,
                                       n_shared_experts=1, first_k_dense_replace=0,
                                       intermediate_size=512)),
    "gpt_oss": ("GptOssConfig", dict(hidden_size=256, intermediate_size=256,
                                     num_local_experts=32, num_experts_per_tok=4,
                                     layer_types=["sliding_attention", "full_attention"],
                                     sliding_window=128)),
}


def build_model(torch, transformers, name, device="cuda", dtype=None, seed=0):
    """(model, config): the family's small model, eval mode, bf16 on device by default."""
    cfg_cls, opts = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(**dict(ATTN, **opts))
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    bias_up(torch, model)
    model.to(device=device, dtype=dtype or torch.bfloat16).eval()
    return model, cfg


def bias_up(torch, model):
    """Selection biases random in [0, 0.25) (transformers' init leaves them 0), and the
    experts' biases and routers' biases random, so that they matter."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "e_score_correction_bias":
                t.copy_(torch.rand(t.shape, generator=g) * 0.25)
            elif leaf in ("gate_up_proj_bias", "down_proj_bias") or \
                    (leaf == "bias" and ".router." in f".{name}"):
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)


def float32_copy(torch, model):
    """The model in float32 (its bf16 weights exactly)."""
    return copy.deepcopy(model).float()
