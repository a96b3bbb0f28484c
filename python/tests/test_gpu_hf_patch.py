"""On a GPU with torch and transformers 5: safecuda.torch.patch_model in small causal LMs of
each required family (two layers, the families' real expert counts, top-k, routing and
shared experts, small hidden sizes; hf_models.py), and from_transformers on single blocks:

- each patched block's output inside the model (forward hooks) against the original block
  in float32 on the same input (relative L2 <= 1.5e-2);
- the patched model's logits against the float32 original: no farther than the original's
  own bf16 run (within 1.5x), top-1 agreement likewise; unpatch_model gives the original
  back (its logits bit for bit);
- greedy generation of 32 tokens, eager, under torch.compile and with CUDA-graph decoding
  (a static cache: generate compiles the decoding step with mode "reduce-overhead"), the
  compiled runs matching the eager one (up to a genuine near-tie, which is reported);
- from_transformers on a block against its float32 forward at T = 1, 7, 129, 1000;
- the errors: float32 weights, a forward needing gradients, a block changed after
  patching (a parameter replaced, modified in place, the model converted).

Skipped (saying why) without a GPU, torch or transformers 5; failed instead under
SAFECUDA_REQUIRE_GPU=1."""

import pytest

from conftest import gpu_skip
from hf_models import MODELS, build_model, float32_copy
from moe_reference import rel_l2

pytestmark = pytest.mark.gpu

TOL = 1.5e-2
COMPILED = ("qwen2_moe", "gpt_oss")  # the compile and CUDA-graph runs (the slow part)


@pytest.fixture(scope="module")
def torch(torch_cuda, nvrtc):
    cc = torch_cuda.cuda.get_device_capability(0)
    if cc < (8, 0):
        gpu_skip(f"the GPU is sm_{cc[0]}{cc[1]}; the MoE kernels need sm_80 or newer")
    torch_cuda.backends.cuda.matmul.allow_tf32 = False
    torch_cuda.backends.cudnn.allow_tf32 = False
    return torch_cuda


@pytest.fixture(scope="module")
def transformers(torch):
    try:
        import transformers
    except ImportError as exc:
        gpu_skip(f"transformers is not installed ({exc}); pip install 'transformers>=5'")
    if int(transformers.__version__.split(".")[0]) < 5:
        gpu_skip(f"transformers {transformers.__version__}; the mapping reads transformers 5")
    transformers.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="module")
def sct(torch):
    import safecuda.torch as sct
    return sct


_models = {}


def model_of(torch, transformers, name):
    """The family's model (bf16, CUDA, unpatched), built once per module."""
    if name not in _models:
        _models[name] = build_model(torch, transformers, name)
    return _models[name]


def ids_for(torch, model, B=2, T=24, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (B, T), device="cuda", generator=g)


def logits(torch, model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def top1_disagree(a, b):
    return int((a.argmax(-1) != b.argmax(-1)).sum())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_patched_model_matches_the_original(torch, transformers, sct, name):
    model, _ = model_of(torch, transformers, name)
    ids = ids_for(torch, model)
    ref32 = float32_copy(torch, model)
    want = logits(torch, ref32, ids)
    own = logits(torch, model, ids)
    seen = []
    report = sct.patch_model(model, max_tokens=64)
    try:
        assert len(report) == 2 and not report.refused, str(report)
        assert all(e.family for e in report.patched), str(report)
        layers = [m for _, m in model.named_modules() if isinstance(m, sct.TransformersMoE)]
        assert len(layers) == 2
        hooks = [m.register_forward_hook(lambda m, i, o: seen.append((m, i[0], o)))
                 for m in layers]
        got = logits(torch, model, ids)
        for h in hooks:
            h.remove()
        # Each block's output against the original block in float32 on the same input.
        assert len(seen) == 2
        for layer, x, out in seen:
            import copy
            block32 = copy.deepcopy(layer.hf_block).float()
            with torch.no_grad():
                ref = block32(x.float())
            if isinstance(ref, tuple):
                assert isinstance(out, tuple) and len(out) == len(ref)
                assert out[1].shape == ref[1].shape
                ref, out = ref[0], out[0]
            assert out.dtype == x.dtype and out.shape == ref.shape
            err = rel_l2(out, ref)
            assert err <= TOL, f"{name}: block output relative L2 {err:.3g} > {TOL}"
        # The logits: no farther from float32 than the original's bf16 run.
        e_own, e_got = rel_l2(own, want), rel_l2(got, want)
        assert e_got <= 1.5 * e_own + 1e-3, (f"{name}: patched logits relative L2 {e_got:.3g} "
                                             f"vs the bf16 original's {e_own:.3g}")
        d_own, d_got = top1_disagree(own, want), top1_disagree(got, want)
        assert d_got <= 1.5 * d_own + 2, (f"{name}: top-1 differs from float32 on {d_got} "
                                          f"tokens, the bf16 original on {d_own}")
        # Greedy generation runs on the patched model.
        with torch.no_grad():
            gen = model.generate(ids[:1, :8], generation_config=greedy(transformers),
                                 disable_compile=True)
        assert gen.shape == (1, 40)
    finally:
        n = sct.unpatch_model(model)
    assert n == 2
    assert not any(isinstance(m, sct.TransformersMoE) for m in model.modules())
    assert torch.equal(logits(torch, model, ids), own)


def greedy(transformers, **kw):
    """32 greedy tokens, no end-of-sequence token (random models would stop anywhere)."""
    return transformers.GenerationConfig(max_new_tokens=32, do_sample=False, eos_token_id=None,
                                         pad_token_id=0, **kw)


def _generate(torch, transformers, model, ids, **kw):
    """(the 32 new tokens, the raw logits of each step)."""
    with torch.no_grad():
        out = model.generate(ids, generation_config=greedy(
            transformers, return_dict_in_generate=True, output_logits=True), **kw)
    return out.sequences[0, ids.shape[1]:].tolist(), [s[0].float() for s in out.logits]


def _same_tokens(what, base, base_scores, got):
    """got equals base, or first differs where base's choice was a near-tie (top-2 logit
    gap < 2% of the largest |logit|): returns the step of a near-tie, or None."""
    for i, (a, b) in enumerate(zip(base, got)):
        if a != b:
            s = base_scores[i]
            top = s.topk(2).values
            gap = (top[0] - top[1]).item()
            assert gap < 0.02 * s.abs().max().item(), (
                f"{what}: token {i} is {b}, eager {a} (eager's top-2 gap {gap:.3g}: no tie)")
            return i
    assert len(got) == len(base)
    return None


@pytest.mark.parametrize("name", COMPILED)
def test_generate_eager_compiled_and_cuda_graphs(torch, transformers, sct, name):
    model, _ = model_of(torch, transformers, name)
    ids = ids_for(torch, model, B=1, T=8, seed=3)
    sct.patch_model(model, max_tokens=64)
    forward = model.forward
    try:
        eager, scores = _generate(torch, transformers, model, ids, disable_compile=True)
        # CUDA-graph decoding: a static cache makes generate compile the decoding step
        # with mode="reduce-overhead" (CUDA graphs).
        graphs, _ = _generate(torch, transformers, model, ids, cache_implementation="static")
        _same_tokens(f"{name} CUDA-graph decoding", eager, scores, graphs)
        # torch.compile of the model's forward (prefill and decoding).
        model.forward = torch.compile(forward)
        compiled, _ = _generate(torch, transformers, model, ids, disable_compile=True)
        _same_tokens(f"{name} torch.compile", eager, scores, compiled)
    finally:
        if "forward" in model.__dict__:
            del model.forward
        sct.unpatch_model(model)
        torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_single_block_against_float32(torch, transformers, sct, name):
    import copy
    model, _ = model_of(torch, transformers, name)
    block = copy.deepcopy(model.model.layers[1].mlp)
    block32 = copy.deepcopy(block).float()
    layer = sct.from_transformers(block, max_tokens=1000)
    assert isinstance(layer, sct.MoE)
    H = model.config.hidden_size
    g = torch.Generator(device="cuda").manual_seed(11)
    for T in (1, 7, 129, 1000):
        x = torch.randn(1, T, H, device="cuda", generator=g).to(torch.bfloat16)
        with torch.no_grad():
            out = layer(x)
            ref = block32(x.float())
        if isinstance(ref, tuple):
            out, ref = out[0], ref[0]
        assert out.shape == (1, T, H) and out.dtype == torch.bfloat16
        err = rel_l2(out, ref)
        assert err <= TOL, f"{name} T={T}: relative L2 {err:.3g} > {TOL}"
    layer.close()


def test_release_originals_frees_the_copies(torch, transformers, sct):
    model, _ = model_of(torch, transformers, "gpt_oss")
    ids = ids_for(torch, model)
    before = logits(torch, model, ids)
    report = sct.patch_model(model, release_originals=True)
    try:
        layers = [m for m in model.modules() if isinstance(m, sct.TransformersMoE)]
        releasable = sum(t.nbytes for m in layers for t in m.spec.tensors.values()
                         if t.kind == "copied" and t.releasable)  # the transposed experts
        assert releasable > 0 and report.released_bytes == releasable, str(report)
        for m in layers:
            ex = m.hf_block.experts
            assert ex.gate_up_proj.data_ptr() == m.w13.data_ptr()
        got = logits(torch, model, ids)
        assert rel_l2(got, before) <= 0.1
    finally:
        sct.unpatch_model(model)
    # The blocks read their experts through views of the (freed) layers' copies, which the
    # views keep alive: the same values.
    assert rel_l2(logits(torch, model, ids), before) <= 1e-2


# ---- clear errors ------------------------------------------------------------------------------


def test_float32_weights_are_refused(torch, transformers, sct):
    import copy
    model, _ = model_of(torch, transformers, "mixtral")
    block = copy.deepcopy(model.model.layers[0].mlp).float()
    with pytest.raises(TypeError, match="is torch.float32; safecuda's MoE layer takes bfloat16 "
                                        "weights"):
        sct.from_transformers(block)
    with pytest.raises(TypeError, match="model.layers.0.mlp"):
        sct.patch_model(float32_copy(torch, model))


def test_a_forward_needing_gradients_is_refused(torch, transformers, sct):
    import copy
    model, _ = model_of(torch, transformers, "mixtral")
    block = copy.deepcopy(model.model.layers[0].mlp).requires_grad_(True)
    layer = sct.from_transformers(block)
    x = torch.randn(1, 5, model.config.hidden_size, device="cuda").to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="forward-only .* torch.no_grad()"):
        layer(x)
    with torch.no_grad():
        layer(x)
    block.requires_grad_(False)
    layer(x)  # nothing needs a gradient
    with pytest.raises(RuntimeError, match="forward-only"):
        layer(x.requires_grad_(True))
    layer.close()


def test_a_block_changed_after_patching_is_refused(torch, transformers, sct):
    import copy
    model, _ = model_of(torch, transformers, "qwen2_moe")
    block = copy.deepcopy(model.model.layers[0].mlp)
    x = torch.randn(1, 5, model.config.hidden_size, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        layer = sct.from_transformers(block)
        layer(x)
        block.experts.gate_up_proj.mul_(1.0)
        with pytest.raises(RuntimeError, match="experts.gate_up_proj was modified in place"):
            layer(x)
        layer.close()
        layer = sct.from_transformers(block)
        block.shared_expert.up_proj.weight = torch.nn.Parameter(
            block.shared_expert.up_proj.weight.clone())
        with pytest.raises(RuntimeError, match="shared_expert.up_proj.weight was replaced"):
            layer(x)
        layer.close()
        layer = sct.from_transformers(block)
        block.gate.weight.data = block.gate.weight.data.clone()
        with pytest.raises(RuntimeError, match="gate.weight moved"):
            layer(x)
        layer.close()
    # A patched model converted (model.to() replaces the tensors' memory).
    m2 = copy.deepcopy(model)
    sct.patch_model(m2)
    m2.to(torch.float16)
    with pytest.raises(RuntimeError, match="changed after safecuda's layer was made"):
        logits(torch, m2, ids_for(torch, m2))
    sct.unpatch_model(m2)
