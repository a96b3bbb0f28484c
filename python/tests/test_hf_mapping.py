"""safecuda.torch's mapping of Hugging Face transformers MoE blocks (moe_spec, the spec step
of from_transformers), with torch and transformers and no GPU: for each family a small
block built from its config class (random weights, no download) is read, the mapping is
checked (which tensors, which options, borrowed or copied), and the float32 reference of
what safecuda's layer computes from the spec (moe_reference.py, include/safecuda/moe.h)
is compared with the block's own forward in float32. Every refusal is checked (exception
type and message). Skipped without torch or transformers 5 (CI's venv has neither)."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"transformers {transformers.__version__}: the mapping reads transformers 5's "
                f"modules", allow_module_level=True)
if not hasattr(torch.library, "custom_op"):
    pytest.skip(f"safecuda.torch needs torch >= 2.4; this is {torch.__version__}",
                allow_module_level=True)

import safecuda.torch as sct  # noqa: E402
from hf_cases import FAMILIES, hf_forward, make_block, spec_reference  # noqa: E402
from moe_reference import dequantize_fp8_blocks, quantize_fp8_blocks, rel_l2  # noqa: E402
from safecuda import _hf, _hf_blocks  # noqa: E402

transformers.logging.set_verbosity_error()
TOL = 1e-5
H = 64


def check_numerics(block, T=37, seed=1, dequant=None):
    x = torch.randn(T, block_hidden(block), generator=torch.Generator().manual_seed(seed))
    hf, rest = hf_forward(torch, block, x)
    spec = sct.moe_spec(block)
    kw = spec.kwargs()
    ref, ids, w = spec_reference(torch, kw, x, dequant)
    err = rel_l2(ref, hf)
    assert err <= TOL, f"{spec.block_class}: relative L2 {err:.3g} against the block's forward"
    assert (rest is not None) == (spec.returns == "hidden_and_scores")
    if rest is not None:  # gpt-oss returns its routing scores [T, k]: the same set of values
        scores = rest[0].reshape(T, -1).float()
        mine = (w * spec.score_scale).sort(dim=-1).values
        assert torch.allclose(scores.sort(dim=-1).values, mine, atol=1e-6)
    return spec, kw


def block_hidden(block):
    for name in ("gate", "router"):
        r = getattr(block, name, None)
        if r is not None and getattr(r, "weight", None) is not None:
            return r.weight.shape[-1]
    raise AssertionError("no router")


# What each family maps to: options, and the tensors borrowed (b) or copied (c).
EXPECT = {
    "mixtral": (dict(scoring="softmax", renormalize=True), "router_weight:b w13:b w2:b"),
    "qwen2_moe": (dict(scoring="softmax", renormalize=False),
                  "router_weight:b w13:b w2:b shared_w13:c shared_w2:c shared_gate:b"),
    "qwen2_moe_norm": (dict(renormalize=True), "shared_w13:c shared_w2:b shared_gate:b"),
    "qwen3_moe": (dict(renormalize=True), "router_weight:b w13:b w2:b"),
    "qwen3_moe_gelu": (dict(activation="gelu_tanh"), "w13:b"),
    "qwen3_next": (dict(scoring="softmax"), "shared_w13:c shared_w2:b shared_gate:b"),
    "olmoe": (dict(renormalize=False), "router_weight:b w13:b w2:b"),
    "deepseek_v2": (dict(scoring="softmax", renormalize=False, routed_scaling=1.5),
                    "shared_w13:c shared_w2:b"),
    "deepseek_v2_groups_all": (dict(n_group=0, topk_group=0), "w13:b"),
    "deepseek_v3": (dict(scoring="sigmoid", renormalize=True, n_group=4, topk_group=2,
                         routed_scaling=2.5),
                    "router_weight:b selection_bias:b w13:b w2:b shared_w13:c shared_w2:b"),
    "kimi_k2": (dict(n_group=0, topk_group=0, routed_scaling=2.827), "selection_bias:b"),
    "glm4_moe": (dict(scoring="sigmoid", n_group=0, routed_scaling=2.5), "selection_bias:b"),
    "mistral4": (dict(scoring="softmax", n_group=4, topk_group=2, routed_scaling=1.5), ""),
    "minimax_m2": (dict(scoring="sigmoid", renormalize=True), "selection_bias:b"),
    "hy_v3": (dict(scoring="sigmoid", routed_scaling=1.3), "selection_bias:b"),
    "laguna": (dict(routed_scaling=2.0), "shared_w13:c"),
    "step3p7": (dict(routed_scaling=1.7), "shared_w13:c"),
    "minimax_m3": (dict(activation="swiglu_clamp", swiglu_alpha=1.702, swiglu_limit=7.0,
                        w13_layout="stacked", routed_scaling=2.0),
                   "shared_w13:b shared_w2:b"),
    "cohere2_moe": (dict(routed_scaling=0.5), "shared_gate:c"),
    "cohere2_moe_sum_sigmoid": (dict(scoring="sigmoid", renormalize=True), "shared_w2:b"),
    "lfm2_moe": (dict(scoring="sigmoid", routed_scaling=1.25), "selection_bias:b"),
    "jamba": (dict(scoring="softmax", renormalize=False), "router_weight:b"),
    "granitemoe": (dict(scoring="softmax", renormalize=True), "router_weight:b"),
    "gpt_oss": (dict(activation="swiglu_clamp", w13_layout="interleaved", renormalize=True),
                "router_weight:b router_bias:b w13:c w2:c w13_bias:b w2_bias:b"),
    "privacy_filter": (dict(activation="swiglu_clamp", w13_layout="stacked"), "w13:c w2:c"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_the_block(family):
    block = make_block(torch, transformers, family)
    spec, kw = check_numerics(block)
    assert spec.family == FAMILIES[family][0]
    opts, tensors = EXPECT.get(family, ({}, ""))
    for k, v in opts.items():
        got = spec.options[k]
        if k == "routed_scaling":
            got = got or 1.0
            assert got == pytest.approx(v), (k, got)
        else:
            assert got == v, (k, got)
    for item in tensors.split():
        name, kind = item.split(":")
        assert spec.tensors[name].kind == {"b": "borrowed", "c": "copied"}[kind], spec
    # A borrowed tensor is the block's own memory; a copy is not.
    made = spec.make_tensors()
    for name, t in spec.tensors.items():
        if not t.sources:
            continue
        src = t.sources[0].tensor
        same = made[name].data_ptr() == src.data_ptr()
        assert same == (t.kind == "borrowed"), (name, t)
        assert tuple(made[name].shape) == t.shape and made[name].dtype == t.dtype
    assert spec.borrowed_bytes + spec.copied_bytes == sum(m.nbytes for m in made.values())


def test_options_are_what_the_layer_takes():
    """The spec's options are safecuda.torch.MoE's keyword arguments (no others)."""
    from safecuda._torch_args import OPTIONS
    spec = sct.moe_spec(make_block(torch, transformers, "deepseek_v3"))
    allowed = set(OPTIONS) | {"top_k", "scoring", "renormalize", "selection_bias",
                              "router_weight", "w13", "w2"}
    assert set(spec.kwargs()) <= allowed


def test_gpt_oss_copies_released_into_the_block():
    """release: the block's gate_up_proj / down_proj become views of the layer's copies
    (the same values), so the block still computes the same, without its own copy."""
    block = make_block(torch, transformers, "gpt_oss")
    x = torch.randn(9, H, generator=torch.Generator().manual_seed(3))
    before, _ = hf_forward(torch, block, x)
    spec = sct.moe_spec(block)
    made = spec.make_tensors()
    freed = sum(spec.tensors[n].release(made[n]) for n in ("w13", "w2"))
    assert freed == made["w13"].nbytes + made["w2"].nbytes
    ex = block.experts
    assert ex.gate_up_proj.data_ptr() == made["w13"].data_ptr()
    assert ex.down_proj.data_ptr() == made["w2"].data_ptr()
    after, _ = hf_forward(torch, block, x)  # the same values, read through a transpose
    assert rel_l2(after, before) <= 1e-6


def test_shared_expert_borrowed_once_released():
    """DeepSeek-V3's shared gate/up weights: a stacked copy; released into it, they lie one
    after the other, and the next spec borrows them without a copy."""
    block = make_block(torch, transformers, "deepseek_v3")
    spec = sct.moe_spec(block)
    t = spec.tensors["shared_w13"]
    assert t.kind == "copied" and t.releasable
    made = t.make()
    t.release(made)
    again = sct.moe_spec(block).tensors["shared_w13"]
    assert again.kind == "borrowed"
    assert again.make().data_ptr() == made.data_ptr()
    check_numerics(block)


def _fp8_swap(block, with_shared=True):
    """The block's experts (and shared expert Linears) replaced by transformers'
    fine-grained FP8 modules holding the blocks' e4m3 weights and 128 x 128 scales; the
    float32 block's weights set to what those dequantize to."""
    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear
    ex = block.experts
    cfg = ex.config
    fp8 = FP8Experts(cfg, block_size=(128, 128))
    with torch.no_grad():
        for name, scale in (("gate_up_proj", "gate_up_proj_scale_inv"),
                            ("down_proj", "down_proj_scale_inv")):
            q, s = quantize_fp8_blocks(torch, getattr(ex, name).detach())
            getattr(fp8, name).data = q
            getattr(fp8, scale).data = s
            getattr(ex, name).copy_(dequantize_fp8_blocks(torch, q, s))
    if not with_shared:
        return fp8, {}
    lins = {}
    sh = block.shared_experts
    for n in ("gate_proj", "up_proj", "down_proj"):
        lin = getattr(sh, n)
        f = FP8Linear(lin.in_features, lin.out_features, block_size=(128, 128))
        with torch.no_grad():
            q, s = quantize_fp8_blocks(torch, lin.weight.detach())
            f.weight.data, f.weight_scale_inv.data = q, s
            lin.weight.copy_(dequantize_fp8_blocks(torch, q, s))
        lins[n] = f
    return fp8, lins


def test_fp8_experts_map_without_dequantizing():
    """A DeepSeek-V3 block whose experts and shared expert transformers holds in
    fine-grained FP8: the e4m3 weights and their scales are borrowed as they are (the
    shared expert's stacked), and the layer's fp8 experts compute the block."""
    base = dict(hidden_size=256, moe_intermediate_size=128, n_routed_experts=8,
                num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, vocab_size=64)
    block = make_block(torch, transformers, "deepseek_v3", base=base)
    x = torch.randn(21, 256, generator=torch.Generator().manual_seed(5))
    fp8, lins = _fp8_swap(block)
    want, _ = hf_forward(torch, block, x)  # the float32 block with the dequantized weights
    block.experts = fp8
    for n, f in lins.items():
        setattr(block.shared_experts, n, f)
    spec = sct.moe_spec(block)
    kinds = {n: t.kind for n, t in spec.tensors.items()}
    assert kinds == dict(router_weight="borrowed", selection_bias="borrowed", w13="borrowed",
                         w2="borrowed", w13_scale="borrowed", w2_scale="borrowed",
                         shared_w13="copied", shared_w2="borrowed", shared_w13_scale="copied",
                         shared_w2_scale="borrowed")
    kw = spec.kwargs()
    assert kw["w13"].dtype == torch.float8_e4m3fn and kw["w13_scale"].shape == (8, 2, 2)
    ref, _, _ = spec_reference(torch, kw, x, lambda q, s: dequantize_fp8_blocks(torch, q, s))
    assert rel_l2(ref, want) <= TOL


def test_fp8_refusals():
    base = dict(hidden_size=256, moe_intermediate_size=128, n_routed_experts=8,
                num_experts_per_tok=2, n_group=1, topk_group=1, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=4, vocab_size=64)
    block = make_block(torch, transformers, "deepseek_v3", base=base)
    fp8, _ = _fp8_swap(block, with_shared=False)
    block.experts = fp8
    with pytest.raises(sct.UnsupportedBlockError, match="shared expert is not fp8 while the "
                                                        "routed experts are fp8"):
        sct.moe_spec(block)
    fp8.block_size = (128, 64)
    with pytest.raises(sct.UnsupportedBlockError, match=r"weight_block_size is \(128, 64\)"):
        sct.moe_spec(block)
    fp8.block_size = (128, 128)
    fp8.activation_scheme = "static"
    with pytest.raises(sct.UnsupportedBlockError, match="activation_scheme 'static'"):
        sct.moe_spec(block)


# ---- refusals -----------------------------------------------------------------------------------


def refused(block, *fragments):
    with pytest.raises(sct.UnsupportedBlockError) as info:
        sct.moe_spec(block)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert msg.startswith(f"safecuda.torch.from_transformers: {type(block).__name__}: "), msg
    for f in fragments:
        assert f in msg, msg
    return msg


def test_deepseek_v2_group_max_is_refused():
    block = make_block(torch, transformers, "deepseek_v2", topk_method="group_limited_greedy",
                       n_group=4, topk_group=2)
    refused(block, "group_limited_greedy", "by its best expert",
            "sum of its two best experts")


def test_deepseek_v2_unknown_method_is_refused():
    block = make_block(torch, transformers, "deepseek_v2")
    block.gate.topk_method = "noaux_tc"
    refused(block, "topk_method 'noaux_tc'")


def test_zero_mask_with_negative_bias_is_refused():
    block = make_block(torch, transformers, "axk2", n_group=4, topk_group=2)
    with torch.no_grad():
        block.gate.e_score_correction_bias.abs_()
    check_numerics(block)  # non-negative: the 0.0 mask chooses as -inf does
    with torch.no_grad():
        block.gate.e_score_correction_bias[3] = -0.5
    refused(block, "masks the dropped groups' experts with 0.0", "-inf")


@pytest.mark.parametrize("family,change,fragments", [
    ("laguna", dict(moe_router_logit_softcapping=30.0), ("soft-caps the logits",)),
    ("qwen3_moe", dict(hidden_act="gelu"), ("activation GELUActivation",)),
    ("deepseek_v2", dict(mlp_bias=True), ("shared expert's projections have biases",)),
    ("step3p7", dict(swiglu_limits=[7.0, 7.0]), ("clamp the activated gate and up to 7.0",)),
    ("mixtral", dict(num_local_experts=520, num_experts=520, num_experts_per_tok=2),
     ("520 experts", "at most 512")),
    ("mixtral", dict(num_experts_per_tok=17, num_local_experts=32, num_experts=32),
     ("top-17", "at most 16")),
    ("qwen2_moe", dict(shared_expert_intermediate_size=32 * 17), ("more than 16 times",)),
    ("mixtral", dict(hidden_size=60), ("hidden size 60", "multiples of 8")),
    ("deepseek_v3", dict(n_group=64, topk_group=2, n_routed_experts=128,
                         num_local_experts=128), ("64 expert groups", "at most 32")),
    ("deepseek_v3", dict(n_group=16, topk_group=2), ("16 experts into 16 groups",
                                                     "2 or more experts each")),
    ("deepseek_v3", dict(routed_scaling_factor=0.0), ("routed_scaling_factor = 0.0",)),
])
def test_refusals(family, change, fragments):
    block = make_block(torch, transformers, family, **change)
    refused(block, *fragments)


def test_shared_expert_with_another_activation_is_refused():
    block = make_block(torch, transformers, "deepseek_v3")
    block.shared_experts.act_fn = torch.nn.GELU()
    refused(block, "shared expert's activation (GELU) differs from the routed experts' (silu)")


@pytest.mark.parametrize("module,cls,config,fragment,kw", [
    ("phimoe", "PhimoeSparseMoeBlock", "PhimoeConfig", "sparsemixer", {}),
    ("nemotron_h", "NemotronHMoE", "NemotronHConfig", "not gated", {}),
    ("glm5_next", "Glm5NextTextMoE", "Glm5NextTextConfig", "clamp gate and up to 10.0",
     dict(num_key_value_heads=4)),
    ("llama4", "Llama4TextMoe", "Llama4TextConfig", "scales the expert's input", {}),
])
def test_refused_families(module, cls, config, fragment, kw):
    from hf_cases import BASE, block_class, make_config
    cfg = make_config(transformers, module, config, kw)
    B = block_class(transformers, module, cls)
    try:
        block = B(cfg)
    except TypeError:
        block = B(cfg, 0)
    refused(block, fragment)
    del BASE


def test_a_module_that_is_no_moe_block_is_refused():
    msg = refused(torch.nn.Linear(4, 4), "not a transformers Mixture-of-Experts block")
    assert "MixtralSparseMoeBlock" in msg and "DeepseekV3MoE" in msg


def test_unknown_router_and_experts_are_refused():
    block = make_block(torch, transformers, "mixtral")
    block.gate.__class__ = type("OtherRouter", (type(block.gate),), {})
    refused(block, "its router OtherRouter is not one")
    block = make_block(torch, transformers, "mixtral")
    block.experts.__class__ = type("OtherExperts", (type(block.experts),), {})
    refused(block, "its experts (OtherExperts) are not a layout")


# ---- from_transformers and patch_model without a GPU --------------------------------------------


def test_a_block_on_the_cpu_is_refused_with_what_to_do():
    block = make_block(torch, transformers, "qwen3_moe", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"gate.weight is on cpu; safecuda's MoE layer runs on "
                                         r"a CUDA GPU: move the model there first"):
        sct.from_transformers(block)


def test_float32_and_float16_weights_are_refused_with_what_to_do():
    for dtype in (torch.float32, torch.float16):
        spec = sct.moe_spec(make_block(torch, transformers, "qwen3_moe", dtype=dtype))
        with pytest.raises(TypeError, match=rf"gate.weight is {dtype}; safecuda's MoE layer "
                                            r"takes bfloat16 weights .*dtype=torch.bfloat16"):
            _hf.check_dtypes(spec, "who")
    spec = sct.moe_spec(make_block(torch, transformers, "qwen3_moe", dtype=torch.bfloat16))
    _hf.check_dtypes(spec, "who")


def test_patch_model_on_the_cpu_is_refused():
    model = tiny_model("qwen2_moe")
    with pytest.raises(ValueError, match="the model is on cpu; safecuda's MoE layer runs on a "
                                         "CUDA GPU"):
        sct.patch_model(model)


def tiny_model(model_type, **kw):
    from hf_cases import make_config
    cfgs = {"qwen2_moe": "Qwen2MoeConfig", "phimoe": "PhimoeConfig",
            "mixtral": "MixtralConfig"}
    cfg = make_config(transformers, model_type, cfgs[model_type], kw)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def test_plan_finds_every_block_and_reports_refusals():
    entries, planned = _hf.plan(tiny_model("qwen2_moe"))
    assert [e.name for e in entries] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert all(e.status == "patched" and e.family == "qwen2_moe" for e in entries)
    assert all(e.copied_bytes > 0 and e.borrowed_bytes > 0 for e in entries)
    entries, planned = _hf.plan(tiny_model("phimoe"))
    assert len(entries) == 2 and not planned
    assert all(e.status == "refused" and "sparsemixer" in e.reason for e in entries)
    text = str(_hf.PatchReport(entries))
    assert "0 MoE block(s) patched, 2 refused" in text and "sparsemixer" in text
    with pytest.raises(sct.UnsupportedBlockError, match="sparsemixer"):
        _hf.plan(tiny_model("phimoe"), strict=True)


def test_importing_safecuda_imports_neither_torch_nor_transformers():
    code = ("import sys, safecuda; assert 'torch' not in sys.modules, 'torch'; "
            "assert 'transformers' not in sys.modules; import safecuda.torch; "
            "assert 'transformers' not in sys.modules, 'transformers'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_mapped_block_class_exists_in_transformers():
    """The tables name classes of this transformers (a rename would leave a dead entry)."""
    import os
    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    text = ""
    for d in os.listdir(root):
        f = os.path.join(root, d, f"modeling_{d}.py")
        if os.path.exists(f):
            with open(f) as fh:
                text += fh.read()
    missing = [c for c in _hf_blocks.BLOCKS if f"class {c}(" not in text]
    assert not missing, missing
