"""On an H100 / H200 (compute capability 9.0) with torch and transformers 5: a DeepSeek-V3-like
causal LM (two MoE layers: 64 experts, top-8 of 8 groups keeping 4, routed scaling 2.5, a
shared expert; H = 512, I = 256; MLA attention, bf16) whose experts and shared experts
transformers holds in fine-grained FP8 (its FP8Experts and FP8Linear modules, made as its
"fp8" quantizer makes them: float8_e4m3fn weights, float32 weight_scale_inv per 128 x 128
block, dynamic activation quantization), patched with safecuda.torch.patch_model:

- each block's fp8 weights borrowed as they are (no dequantized copy);
- each block through from_transformers against transformers' own block computing in
  float32 with its fine-grained FP8 matmul replaced by what that kernel computes (x
  quantized per token per 128 channels to e4m3, scale = amax / 448, times the weight
  dequantized: e4m3 value x block scale), at T = 1, 7, 129, 500: relative L2 <= 1.5e-2.
  transformers' own kernel (the `kernels` package's Triton finegrained-fp8, or DeepGEMM)
  is used instead where it loads (it usually does not: it comes from the Hub);
- in the patched model, each block's output against transformers' block (float32, the
  same emulation) on the input it got (relative L2 <= 1.5e-2); the logits against the
  float32 original (same emulation): no farther than the original's own bf16 run within 2x
  (the activations' e4m3 rounding makes a bf16 run of this model some 10% off float32, and
  which values round which way differs between any two bf16 runs); greedy generation of 16
  tokens, eager; unpatch_model gives the fp8 blocks back.

Skipped (saying why) without a GPU, torch or transformers 5 (failed instead under
SAFECUDA_REQUIRE_GPU=1), and on a GPU of another compute capability (fp8 experts run on
9.0 only)."""

import copy

import pytest

from conftest import gpu_skip
from hf_models import bias_up
from moe_reference import dequantize_fp8_blocks, quantize_fp8_blocks, quantize_fp8_rows, rel_l2

pytestmark = pytest.mark.gpu

TOL = 1.5e-2
BLOCK = (128, 128)
CONFIG = dict(hidden_size=512, moe_intermediate_size=256, intermediate_size=1024,
              n_routed_experts=64, num_experts_per_tok=8, n_group=8, topk_group=4,
              routed_scaling_factor=2.5, n_shared_experts=1, first_k_dense_replace=0,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
              q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
              v_head_dim=32, head_dim=32, vocab_size=1024, max_position_embeddings=512,
              initializer_range=0.05, tie_word_embeddings=False)
SHARED = ("gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def torch(torch_cuda, nvrtc):
    cap = torch_cuda.cuda.get_device_capability(0)
    if cap != (9, 0):
        pytest.skip(f"fp8 experts run on compute capability 9.0 only; this GPU is "
                    f"{cap[0]}.{cap[1]}")
    torch_cuda.backends.cuda.matmul.allow_tf32 = False
    torch_cuda.backends.cudnn.allow_tf32 = False
    return torch_cuda


@pytest.fixture(scope="module")
def transformers(torch):
    try:
        import transformers
        from transformers.integrations import finegrained_fp8  # noqa: F401
    except ImportError as exc:
        gpu_skip(f"transformers 5 with its fine-grained FP8 integration is not installed "
                 f"({exc}); pip install 'transformers>=5'")
    if int(transformers.__version__.split(".")[0]) < 5:
        gpu_skip(f"transformers {transformers.__version__}; the mapping reads transformers 5")
    transformers.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="module")
def sct(torch):
    import safecuda.torch as sct
    return sct


# ---- the model -------------------------------------------------------------------------------


def to_fp8(torch, transformers, model):
    """Each MoE block's experts and shared expert replaced by transformers' fine-grained FP8
    modules (as replace_with_fp8_linear makes them) holding the bf16 weights quantized per
    128 x 128 block."""
    from transformers.integrations.finegrained_fp8 import (ALL_FP8_EXPERTS_FUNCTIONS,
                                                           FP8Experts, FP8Linear)
    from transformers.integrations.moe import use_experts_implementation
    cfg = model.config
    dev = next(model.parameters()).device
    experts_cls = use_experts_implementation(experts_class=FP8Experts,
                                             experts_interface=ALL_FP8_EXPERTS_FUNCTIONS,
                                             has_bias=False, has_gate=True)
    with torch.no_grad():
        for layer in model.model.layers:
            block = layer.mlp
            with torch.device(dev):
                fp8 = experts_cls(config=cfg, block_size=BLOCK)
            for name in ("gate_up_proj", "down_proj"):
                q, s = quantize_fp8_blocks(torch, getattr(block.experts, name))
                getattr(fp8, name).data = q
                getattr(fp8, name + "_scale_inv").data = s
            block.experts = fp8
            for name in SHARED:
                lin = getattr(block.shared_experts, name)
                with torch.device(dev):
                    f = FP8Linear(lin.in_features, lin.out_features, block_size=BLOCK)
                q, s = quantize_fp8_blocks(torch, lin.weight)
                f.weight.data, f.weight_scale_inv.data = q, s
                f.requires_grad_(False)
                setattr(block.shared_experts, name, f)
    return model


def build_fp8_model(torch, transformers, device="cuda", seed=0):
    """(model, config): the DeepSeek-V3-like model, its MoE blocks in fine-grained FP8,
    the rest bf16, eval mode, on device."""
    cfg = transformers.DeepseekV3Config(**CONFIG)
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    bias_up(torch, model)
    model.to(device=device, dtype=torch.bfloat16).eval()
    return to_fp8(torch, transformers, model), cfg


def fp8_matmul(torch, x, weight, scale_inv):
    """What transformers' fine-grained FP8 matmul computes (float32): x quantized per token
    per 128 channels (dynamic), times the weight dequantized (e4m3 value x block scale)."""
    y = torch.nn.functional.linear(quantize_fp8_rows(torch, x.float()),
                                   dequantize_fp8_blocks(torch, weight, scale_inv))
    return y.to(x.dtype)


def emulate_fp8(torch, model):
    """model (a copy) with its FP8 modules computing fp8_matmul in float32 instead of calling
    transformers' kernel (not installed here); everything else is transformers' own code."""
    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear
    for m in model.modules():
        if isinstance(m, FP8Experts):
            m.linear = (lambda x, w, s, activation_scale=None:
                        fp8_matmul(torch, x, w, s))
        elif isinstance(m, FP8Linear):
            m.forward = lambda x, m=m: fp8_matmul(torch, x, m.weight, m.weight_scale_inv)
    return model


def float32_copy(torch, model):
    """A copy computing in float32: its bf16 tensors converted (exactly), the e4m3 weights
    and their scales left as they are; FP8 modules emulated."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for t in list(m.parameters()) + list(m.buffers()):
            if t.dtype == torch.bfloat16:
                t.data = t.data.float()
    return emulate_fp8(torch, m)


def transformers_kernel(transformers):
    """Whether transformers' own fine-grained FP8 kernel loads here: (yes, why not)."""
    from transformers.utils.import_utils import is_kernels_available
    if not is_kernels_available():
        return False, "the kernels package is not installed"
    try:
        from transformers.integrations.finegrained_fp8 import load_finegrained_fp8_kernel
        load_finegrained_fp8_kernel()
    except Exception as exc:  # noqa: BLE001 - any failure to load means: emulate
        return False, f"{type(exc).__name__}: {str(exc)[:160]}"
    return True, ""


_models = {}


def model_of(torch, transformers):
    if "m" not in _models:
        _models["m"] = build_fp8_model(torch, transformers)
    return _models["m"]


# ---- the tests -------------------------------------------------------------------------------


def test_fp8_blocks_against_transformers_fp8(torch, transformers, sct):
    model, cfg = model_of(torch, transformers)
    own_kernel, why = transformers_kernel(transformers)
    print(f"\ntransformers' fp8 kernel: {'used' if own_kernel else 'emulated: ' + why}")
    H = cfg.hidden_size
    g = torch.Generator(device="cuda").manual_seed(21)
    for i, layer in enumerate(model.model.layers):
        block = layer.mlp
        ref_block = copy.deepcopy(block) if own_kernel else float32_copy(torch, block)
        moe = sct.from_transformers(block, max_tokens=500)
        spec = moe.spec
        assert spec.family and spec.copied_bytes < spec.borrowed_bytes, str(spec)
        for name in ("w13", "w2"):
            assert spec.tensors[name].kind == "borrowed"
            assert spec.tensors[name].dtype == torch.float8_e4m3fn
        assert moe.w13.data_ptr() == block.experts.gate_up_proj.data_ptr()
        for T in (1, 7, 129, 500):
            x = torch.randn(1, T, H, device="cuda", generator=g).to(torch.bfloat16)
            with torch.no_grad():
                out = moe(x)
                ref = ref_block(x if own_kernel else x.float())
            assert out.shape == (1, T, H) and out.dtype == torch.bfloat16
            err = rel_l2(out, ref)
            print(f"layer {i} T={T}: relative L2 {err:.2e}")
            assert err <= TOL, f"layer {i} T={T}: relative L2 {err:.3g} > {TOL}"
        moe.close()


def test_fp8_model_patched_logits_and_generate(torch, transformers, sct):
    model, cfg = model_of(torch, transformers)
    g = torch.Generator(device="cuda").manual_seed(3)
    ids = torch.randint(0, cfg.vocab_size, (2, 24), device="cuda", generator=g)
    with torch.no_grad():
        want = float32_copy(torch, model)(ids).logits.float()
        own = emulate_fp8(torch, copy.deepcopy(model))(ids).logits.float()
    fp8_before = [(l.mlp.experts.gate_up_proj, l.mlp.experts.down_proj)
                  for l in model.model.layers]
    report = sct.patch_model(model, max_tokens=64)
    try:
        assert len(report) == 2 and not report.refused, str(report)
        assert {e.family for e in report.patched} == {"deepseek_v3"}, str(report)
        assert report.copied_bytes < report.borrowed_bytes, str(report)
        layers = [m for m in model.modules() if isinstance(m, sct.TransformersMoE)]
        assert len(layers) == 2
        seen = []
        hooks = [m.register_forward_hook(lambda m, i, o: seen.append((m, i[0], o)))
                 for m in layers]
        with torch.no_grad():
            got = model(ids).logits.float()
        for h in hooks:
            h.remove()
        assert torch.isfinite(got).all()
        # Each block's output inside the model against transformers' block (float32,
        # emulated fp8 matmuls) on the same input.
        assert len(seen) == 2
        for layer, x, out in seen:
            with torch.no_grad():
                ref = float32_copy(torch, layer.hf_block)(x.float())
            err = rel_l2(out, ref)
            assert out.dtype == torch.bfloat16 and err <= TOL, (
                f"{layer.module_name}: relative L2 {err:.3g} > {TOL}")
        e_own, e_got = rel_l2(own, want), rel_l2(got, want)
        print(f"\nlogits relative L2 to float32: patched {e_got:.3g}, bf16 original {e_own:.3g}")
        assert e_got <= 2.0 * e_own + 2e-3, (f"patched logits relative L2 {e_got:.3g} vs the "
                                             f"bf16 original's {e_own:.3g}")
        gen_cfg = transformers.GenerationConfig(max_new_tokens=16, do_sample=False,
                                                eos_token_id=None, pad_token_id=0)
        with torch.no_grad():
            gen = model.generate(ids[:1, :8], generation_config=gen_cfg, disable_compile=True)
        assert gen.shape == (1, 24)
        assert torch.equal(gen[:, :8], ids[:1, :8])
        assert int(gen.min()) >= 0 and int(gen.max()) < cfg.vocab_size
    finally:
        n = sct.unpatch_model(model)
    assert n == 2
    for layer, (gu, dp) in zip(model.model.layers, fp8_before):
        assert layer.mlp.experts.gate_up_proj is gu and layer.mlp.experts.down_proj is dp
        assert gu.dtype == torch.float8_e4m3fn
