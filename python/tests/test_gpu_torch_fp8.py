"""fp8 experts through safecuda.torch.MoE on a GPU of compute capability 9.0 (H100, H200):
torch.float8_e4m3fn weights with their 128 x 128 block scales (as transformers'
fine-grained FP8 checkpoints hold them, made here from bf16 weights whose blocks span
magnitudes 2^-2 .. 2^2) against a float32 torch reference that dequantizes the weights
(e4m3 value x block scale) and quantizes x per token and h per row in blocks of 128
channels as the layer does (scale = amax / 448), for a DeepSeek-V3-like layer (grouped
sigmoid routing, routed scaling, a shared expert) and a Qwen3-like one (softmax top-8 of
128). The error against the unquantized bf16 layer and float32 reference is printed
(pytest -s). Also: the C-level safecuda.MoE over the same tensors gives the same bits,
the caller's routing with padded slots and out += layer(x), a CUDA graph replay, the
module's checks with CUDA tensors. Skipped without a GPU or torch (failed instead under
SAFECUDA_REQUIRE_GPU=1), and on a GPU of another compute capability."""

import math

import pytest

import safecuda as sc
from moe_reference import (dequantize_fp8_blocks, moe_reference, quantize_fp8_blocks,
                           quantize_fp8_rows, rel_l2, route, selection_margin)

pytestmark = pytest.mark.gpu

DEV = "cuda"


@pytest.fixture(scope="module")
def torch(torch_cuda):
    cap = torch_cuda.cuda.get_device_capability(0)
    if cap != (9, 0):
        pytest.skip(f"fp8 experts run on compute capability 9.0 only; this GPU is "
                    f"{cap[0]}.{cap[1]}")
    return torch_cuda


@pytest.fixture(scope="module")
def sct(torch):
    import safecuda.torch as sct
    return sct


def bits(t):
    import torch
    return t.contiguous().view(torch.int16)


# The models' layers at test sizes (H and I multiples of 128). shared: I_s / I.
CONFIGS = {
    "deepseek-v3": dict(E=64, k=8, H=512, I=256, scoring="sigmoid", renormalize=True,
                        bias=True, shared=1,
                        opts=dict(n_group=8, topk_group=4, routed_scaling=2.5)),
    "qwen3": dict(E=128, k=8, H=384, I=128, scoring="softmax", renormalize=True, opts={}),
}
EXPERT_WEIGHTS = ("w13", "w2", "shared_w13", "shared_w2")
FP8_ARGS = ("w13_scale", "w2_scale", "shared_w13", "shared_w2", "shared_w13_scale",
            "shared_w2_scale")


def make_weights(torch, c, seed):
    """(W, Q): the bf16 weights (router, experts, shared expert; float32 selection bias)
    and the experts' fp8 forms with their scales (w13, w13_scale, ...)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    E, H, I_ = c["E"], c["H"], c["I"]

    def randn(*shape, s):
        return torch.randn(*shape, device=DEV, generator=g) * s

    def blocky(*shape, s):
        """bf16 [..., R, C] whose 128 x 128 blocks have magnitudes s x 2^-2 .. 2^2."""
        *lead, R, C = shape
        mag = 2.0 ** torch.randint(-2, 3, (*lead, R // 128, 1, C // 128, 1), device=DEV,
                                   generator=g).float()
        return (randn(*lead, R // 128, 128, C // 128, 128, s=s) * mag).reshape(shape).to(
            torch.bfloat16)

    W = dict(router=randn(E, H, s=1 / math.sqrt(H)).to(torch.bfloat16),
             w13=blocky(E, 2 * I_, H, s=1 / math.sqrt(H)),
             w2=blocky(E, H, I_, s=1 / math.sqrt(I_)))
    W["selection_bias"] = ((torch.rand(E, device=DEV, generator=g) - 0.5) * 0.2
                           if c.get("bias") else None)
    S = c.get("shared", 0) * I_
    W["shared_w13"] = blocky(2 * S, H, s=1 / math.sqrt(H)) if S else None
    W["shared_w2"] = blocky(H, S, s=1 / math.sqrt(S)) if S else None
    Q = {}
    for name in EXPERT_WEIGHTS:
        if W[name] is not None:
            Q[name], Q[name + "_scale"] = quantize_fp8_blocks(torch, W[name])
    return W, Q


def x_for(torch, c, T, seed):
    g = torch.Generator(device=DEV).manual_seed(1000 + seed)
    return torch.randn(T, c["H"], device=DEV, generator=g).to(torch.bfloat16)


def fp8_layer(sct, c, W, Q, **extra):
    kw = {n: Q[n] for n in FP8_ARGS if n in Q}
    kw.update(c["opts"])
    kw.setdefault("max_tokens", 256)
    kw.update(extra)
    return sct.MoE(W["router"], Q["w13"], Q["w2"], top_k=c["k"], scoring=c["scoring"],
                   renormalize=c["renormalize"], selection_bias=W["selection_bias"], **kw)


def bf16_layer(sct, c, W):
    kw = {n: W[n] for n in ("shared_w13", "shared_w2") if W[n] is not None}
    return sct.MoE(W["router"], W["w13"], W["w2"], top_k=c["k"], scoring=c["scoring"],
                   renormalize=c["renormalize"], selection_bias=W["selection_bias"],
                   max_tokens=256, **c["opts"], **kw)


def reference(torch, c, W, Q, x, ids, weights=None, accumulate=None, quantized=True):
    """The layer in float32 for the experts ids (and the caller's weights): quantized=True
    the fp8 layer's (dequantized weights, x and h quantized as the layer does), False the
    unquantized bf16 weights'."""
    if quantized:
        w = {n: dequantize_fp8_blocks(torch, Q[n], Q[n + "_scale"]) if n in Q else None
             for n in EXPERT_WEIGHTS}
    else:
        w = {n: W[n] for n in EXPERT_WEIGHTS}
    o = c["opts"]
    ref, _, ref_w = moe_reference(
        torch, x, W["router"], w["w13"], w["w2"], c["k"], c["scoring"], c["renormalize"],
        W["selection_bias"], ids=ids, weights=weights, n_group=o.get("n_group", 0),
        topk_group=o.get("topk_group", 0), routed_scaling=o.get("routed_scaling", 0.0),
        shared_w13=w["shared_w13"], shared_w2=w["shared_w2"], accumulate=accumulate,
        act_quant=quantize_fp8_rows if quantized else None)
    return ref, ref_w


def worst_token(out, ref):
    d = (out.float() - ref.float()).norm(dim=-1)
    return (d / ref.float().norm(dim=-1).clamp_min(1e-30)).max().item()


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("T", [1, 7, 129])
def test_fp8_against_the_quantized_reference(torch, sct, name, T):
    c = CONFIGS[name]
    W, Q = make_weights(torch, c, seed=T)
    assert Q["w13"].dtype == torch.float8_e4m3fn and Q["w13_scale"].dtype == torch.float32
    layer = fp8_layer(sct, c, W, Q)
    assert layer.expert_dtype == torch.float8_e4m3fn
    assert "experts=float8_e4m3fn" in layer.extra_repr()
    assert layer.safecuda_layer.expert_dtype is sc.DType.F8E4M3
    x = x_for(torch, c, T, T)
    out, ids, w = layer(x, return_routing=True)
    k, E = c["k"], c["E"]
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    assert torch.isfinite(out.float()).all().item()
    assert ids.shape == (T, k) and ((ids >= 0) & (ids < E)).all().item()
    assert all(len(set(row)) == k for row in ids.tolist()), "an expert chosen twice"
    # The routing is the bf16 router's: the reference's wherever there is no near-tie.
    o = c["opts"]
    ro = dict(n_group=o.get("n_group", 0), topk_group=o.get("topk_group", 0))
    _, own = route(torch, x, W["router"], k, c["scoring"], c["renormalize"],
                   W["selection_bias"], **ro)
    clear = selection_margin(torch, x, W["router"], k, c["scoring"], W["selection_bias"],
                             **ro) > 1e-4
    bad = (ids.long().sort(dim=1).values != own.sort(dim=1).values).any(dim=1) & clear
    assert not bad.any().item(), f"{int(bad.sum())} of {T} tokens chose other experts"
    ref, ref_w = reference(torch, c, W, Q, x, ids)
    assert torch.allclose(w, ref_w, atol=1e-4, rtol=1e-3), (w - ref_w).abs().max().item()
    r, worst = rel_l2(out, ref), worst_token(out, ref)
    # How far the quantization moves the output: the bf16 layer over the unquantized
    # weights with the same routing, and the unquantized float32 reference.
    bf = bf16_layer(sct, c, W)
    out_b = bf(x, routing=(ids, w))
    ref_b, _ = reference(torch, c, W, Q, x, ids, quantized=False)
    vs_bf16, vs_ref_b = rel_l2(out, out_b), rel_l2(out, ref_b)
    print(f"\n  fp8 {name:12s} T={T:<4d} relative L2 {r:.2e} against the quantized reference "
          f"(worst token {worst:.2e}); against the bf16 layer {vs_bf16:.2e}, the "
          f"unquantized float32 reference {vs_ref_b:.2e} (the bf16 layer's own "
          f"{rel_l2(out_b, ref_b):.2e})")
    assert r <= 1e-2, f"{name} T={T}: relative L2 {r:.3g} > 1e-2"
    assert worst <= 4e-2, f"{name} T={T}: a token's relative L2 {worst:.3g} > 4e-2"
    # The quantization's own error: real (the weights are e4m3) but bounded.
    assert 1e-3 < vs_ref_b < 0.25, vs_ref_b
    bf.close()
    layer.close()


def test_fp8_c_path_gives_the_same_bits(torch, sct):
    """safecuda.MoE over the same tensors borrowed with as_buffer (fp8 as uint8 bits,
    retyped): the module's bits, and again through the dispatcher (deterministic)."""
    c = CONFIGS["deepseek-v3"]
    W, Q = make_weights(torch, c, seed=3)
    layer = fp8_layer(sct, c, W, Q)
    x = x_for(torch, c, 64, 3)
    via_torch = layer(x)
    ctx = sc.default_context(0)
    st = sc.Stream.from_torch(context=ctx)
    tensors = dict(Q, router=W["router"], selection_bias=W["selection_bias"], x=x)
    bufs = {n: sct.as_buffer(t, context=ctx, read_only=True) for n, t in tensors.items()}
    assert bufs["w13"].dtype is sc.DType.F8E4M3 and bufs["w2_scale"].dtype is sc.DType.F32
    assert bufs["w13"].device_ptr == Q["w13"].data_ptr()  # borrowed, not copied
    assert bufs["w13"].shape == tuple(Q["w13"].shape)
    kw = {n: bufs[n] for n in FP8_ARGS}
    with sc.MoE(ctx, bufs["router"], bufs["w13"], bufs["w2"], top_k=c["k"],
                scoring=c["scoring"], renormalize=c["renormalize"],
                selection_bias=bufs["selection_bias"], **c["opts"], **kw) as plain:
        assert plain.expert_dtype is sc.DType.F8E4M3
        out = plain.forward(bufs["x"], stream=st)
        via_c = sct.as_tensor(out)
        assert torch.equal(bits(via_c), bits(via_torch))
        del via_c
        out.close()
    assert torch.equal(bits(torch.ops.safecuda.moe(x, layer.layer_id)), bits(via_torch))
    assert torch.equal(bits(layer(x)), bits(via_torch))
    for b in bufs.values():
        b.close()
    layer.close()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fp8_caller_routing_and_accumulate(torch, sct, name):
    c = CONFIGS[name]
    W, Q = make_weights(torch, c, seed=41)
    layer = fp8_layer(sct, c, W, Q)
    T = 33
    x = x_for(torch, c, T, 41)
    ids, w = layer.route(x)
    ids = ids.clone()
    ids[::5, -1] = -1  # padded slots
    out = layer(x, routing=(ids, w))
    ref, _ = reference(torch, c, W, Q, x, ids, weights=w)
    assert rel_l2(out, ref) <= 1e-2, rel_l2(out, ref)
    r = x_for(torch, c, T, 99)
    r0 = r.clone()
    assert layer(x, routing=(ids, w), accumulate_into=r) is r
    ref_acc, _ = reference(torch, c, W, Q, x, ids, weights=w, accumulate=r0)
    assert rel_l2(r, ref_acc) <= 1e-2, rel_l2(r, ref_acc)
    layer.close()


def test_fp8_in_a_cuda_graph(torch, sct):
    c = CONFIGS["qwen3"]
    W, Q = make_weights(torch, c, seed=11)
    layer = fp8_layer(sct, c, W, Q, max_tokens=64)
    static_x = x_for(torch, c, 16, 0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch recommends
        for _ in range(2):
            layer(static_x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = layer(static_x)
    for seed in range(3):
        static_x.copy_(x_for(torch, c, 16, seed + 1))
        g.replay()
        eager = layer(static_x.clone())
        torch.cuda.synchronize()
        assert torch.equal(bits(static_out), bits(eager)), f"replay {seed}"
    del g
    layer.close()


def test_fp8_module_checks_on_the_gpu(torch, sct):
    c = CONFIGS["qwen3"]
    W, Q = make_weights(torch, c, seed=5)
    with pytest.raises(ValueError, match="w13_scale is on cpu, not a CUDA device"):
        fp8_layer(sct, c, W, dict(Q, w13_scale=Q["w13_scale"].cpu()))
    with pytest.raises(ValueError, match=r"give w2_scale, float32 \[E, H/128, I/128\] = "
                                         r"\[128, 3, 1\]"):
        fp8_layer(sct, c, W, {n: t for n, t in Q.items() if n != "w2_scale"})
    with pytest.raises(TypeError, match="w2 is torch.bfloat16 and w13 torch.float8_e4m3fn"):
        sct.MoE(W["router"], Q["w13"], W["w2"], top_k=c["k"], w13_scale=Q["w13_scale"],
                w2_scale=Q["w2_scale"])
    with pytest.raises(ValueError, match="w13_scale is given but the experts' weights"):
        sct.MoE(W["router"], W["w13"], W["w2"], top_k=c["k"], w13_scale=Q["w13_scale"])
    layer = fp8_layer(sct, c, W, Q)
    assert layer.w13 is Q["w13"] and layer.w13_scale is Q["w13_scale"]
    assert layer.w2_scale is Q["w2_scale"] and layer.shared_w13_scale is None
    x = x_for(torch, c, 4, 5)
    with pytest.raises(ValueError, match="bfloat16 CUDA tensor"):
        layer(x.to(torch.float8_e4m3fn))
    assert layer(x[:0]).shape == (0, c["H"])
    layer.close()
