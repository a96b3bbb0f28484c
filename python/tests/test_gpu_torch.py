"""On a GPU with PyTorch: zero-copy exchange both ways, stream ordering between torch and
safecuda, the MoE operator against a float32 reference and against the C path, inside
torch.cuda.graph and under torch.compile. Skipped (saying why) without a GPU or torch;
failed instead under SAFECUDA_REQUIRE_GPU=1."""

import array
import gc
import math

import pytest

import safecuda as sc
from moe_reference import moe_reference, rel_l2, route, selection_margin

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch(torch_cuda):
    return torch_cuda


@pytest.fixture(scope="module")
def sct(torch):
    import safecuda.torch as sct
    return sct


def bits(t):
    """A bf16 tensor's bit patterns (for exact comparisons)."""
    import torch
    return t.contiguous().view(torch.int16)


# ---- zero copy ------------------------------------------------------------------------------


def test_torch_tensor_to_buffer_is_zero_copy(torch):
    t = torch.arange(4096, dtype=torch.float32, device="cuda").reshape(64, 64)
    b = sc.Buffer.from_dlpack(t)
    assert b.device_ptr == t.data_ptr()
    assert b.shape == (64, 64) and b.dtype is sc.DType.F32 and b.origin().borrowed
    assert b.to_host().tolist() == t.cpu().tolist()
    b.fill(2.5)  # safecuda writes torch's memory
    torch.cuda.synchronize()
    assert (t == 2.5).all().item()
    b.close()
    h = torch.randn(8, 16, device="cuda").to(torch.bfloat16)
    hb = sc.Buffer.from_dlpack(h)
    assert hb.dtype is sc.DType.BF16 and hb.device_ptr == h.data_ptr()
    hb.close()


def test_buffer_to_torch_is_zero_copy(torch):
    ctx = sc.default_context(0)
    b = ctx.from_host(array.array("f", range(1000)), shape=(10, 100), label="to torch")
    t = torch.from_dlpack(b)
    assert t.device.type == "cuda" and t.dtype == torch.float32 and tuple(t.shape) == (10, 100)
    assert t.data_ptr() == b.device_ptr
    assert torch.equal(t.cpu(), torch.arange(1000, dtype=torch.float32).reshape(10, 100))
    t.mul_(2)  # torch writes safecuda's memory
    torch.cuda.synchronize()
    assert b.to_host().tolist()[9][99] == 1998.0
    b.close()  # the tensor keeps the memory until torch lets it go
    assert t.sum().item() == 2 * sum(range(1000))
    v = ctx.from_host(array.array("i", range(64)), shape=(8, 8))
    row = torch.from_dlpack(v[5])
    assert row.tolist() == list(range(40, 48)) and row.data_ptr() == v.device_ptr + 40 * 4
    del row
    v.close()
    del t


def test_fp8_tensors_both_ways(torch, sct):
    """torch.float8_e4m3fn / float8_e5m2 <-> f8e4m3 / f8e5m2 without a copy, the bits
    unchanged; torch's fp8 values agree with safecuda's decoding and its rounding."""
    import random
    from safecuda._dtype import float_to_fp8_bits, fp8_bits_to_float
    ctx = sc.default_context(0)
    rng = random.Random()
    for tdt, d in ((torch.float8_e4m3fn, sc.DType.F8E4M3), (torch.float8_e5m2, sc.DType.F8E5M2)):
        assert sct.torch_dtype(d) == tdt and sc.as_dtype(tdt) is d
        # torch -> safecuda: safecuda reads and writes torch's fp8 memory.
        raw = torch.randint(0, 256, (64, 48), dtype=torch.uint8, device="cuda")
        t = raw.view(tdt)
        b = sct.as_buffer(t)
        assert b.dtype is d and b.shape == (64, 48) and b.device_ptr == t.data_ptr()
        assert list(b.to_host().cast("B")) == raw.cpu().flatten().tolist()
        b.view(5, 10).fill(-1.5)
        torch.cuda.synchronize()
        assert t.flatten()[5:15].float().tolist() == [-1.5] * 10
        b.close()
        # safecuda -> torch.
        data = bytes(rng.getrandbits(8) for _ in range(128))
        v = ctx.from_host(data, dtype=d, shape=(8, 16), label="fp8 to torch")
        tt = sct.as_tensor(v)
        assert tt.dtype == tdt and tuple(tt.shape) == (8, 16) and tt.data_ptr() == v.device_ptr
        assert bytes(tt.view(torch.uint8).cpu().flatten().tolist()) == data
        for got, bits_ in zip(tt.float().cpu().flatten().tolist(), data):
            want = fp8_bits_to_float(bits_, d)
            assert got == want or (math.isnan(got) and math.isnan(want)), hex(bits_)
        del tt
        v.close()
        # Rounding of float32 values in range (torch does not saturate): the same bits.
        top = 448.0 if d is sc.DType.F8E4M3 else 57344.0
        xs = torch.tensor([rng.uniform(-top, top) * 2.0 ** -rng.randint(0, 20)
                           for _ in range(4096)], dtype=torch.float32)
        got = xs.to(tdt).view(torch.uint8).tolist()
        assert got == [float_to_fp8_bits(x, d) for x in xs.tolist()]


def test_torch_tensor_deleted_while_safecuda_holds_it(torch):
    t = torch.randn(1 << 20, device="cuda")
    want = t.cpu()
    b = sc.Buffer.from_dlpack(t)
    del t
    gc.collect()
    # Allocations that would reuse the tensor's memory had it been freed.
    junk = [torch.full((1 << 20,), -1.0, device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    got = torch.frombuffer(bytearray(b.to_host().cast("B")), dtype=torch.float32)
    assert torch.equal(got, want)
    b.close()
    del junk


def test_stream_from_torch(torch):
    s = torch.cuda.Stream()
    w = sc.Stream.from_torch(s)
    assert w.is_wrapped and w.cu_handle == s.cuda_stream
    assert sc.Stream.from_torch(s) is w
    with torch.cuda.stream(s):
        assert sc.Stream.from_torch() is w
    assert w.to_torch().cuda_stream == s.cuda_stream


# ---- ordering between torch's streams and safecuda's ------------------------------------------


def _slow_write(torch, n, value):
    """A tensor written on the current stream after ~50 ms of spinning there."""
    t = torch.empty(n, device="cuda")
    torch.cuda._sleep(100_000_000)
    t.fill_(value)
    return t


def test_torch_writes_safecuda_copies_on_another_stream(torch):
    ctx = sc.default_context(0)
    n = 1 << 24
    A = torch.cuda.Stream()
    B = ctx.stream(label="safecuda B")
    for how in ("owner stream", "producer's current stream"):
        with torch.cuda.stream(A):
            big = _slow_write(torch, n, 3.0)
            if how == "producer's current stream":
                # DLPack: torch orders its current stream (A) before the consumer's.
                src = sc.Buffer.from_dlpack(big)
        if how == "owner stream":
            src = sc.Buffer.from_dlpack(big, stream=sc.Stream.from_torch(A))
        dst = ctx.buffer(n, "f32", stream=B)
        dst.copy_from(src, stream=B)  # no synchronization by the user
        B.synchronize()
        t = torch.from_dlpack(dst)
        assert (t == 3.0).all().item(), how
        del t
        src.close()
        dst.close()
        A.synchronize()
    B.close()


def test_safecuda_writes_torch_reads(torch):
    ctx = sc.default_context(0)
    n = 1 << 24
    B = ctx.stream(label="safecuda writer")
    a = ctx.buffer(n, "f32", stream=B)
    b = ctx.buffer(n, "f32", stream=B)
    a.fill(1.0, stream=B)
    for _ in range(100):  # keep B busy for a while
        b.copy_from(a, stream=B)
        a.copy_from(b, stream=B)
    a.fill(5.0, stream=B)
    t = torch.from_dlpack(a)  # torch's current stream waits for B's pending writes
    assert (t == 5.0).all().item()
    del t
    a.close()
    b.close()
    B.close()


# ---- the MoE operator -------------------------------------------------------------------------

CONFIGS = {
    "softmax": dict(E=16, k=4, H=512, I=256, scoring="softmax", renormalize=True, bias=False),
    "sigmoid+bias": dict(E=32, k=8, H=256, I=512, scoring="sigmoid", renormalize=True,
                         bias=True),
    "softmax raw": dict(E=8, k=2, H=384, I=128, scoring="softmax", renormalize=False,
                        bias=False),
}


def weights(torch, c, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I_ = c["E"], c["H"], c["I"]

    def randn(*shape, scale):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)

    router = randn(E, H, scale=1 / math.sqrt(H))
    w13 = randn(E, 2 * I_, H, scale=1 / math.sqrt(H))
    w2 = randn(E, H, I_, scale=1 / math.sqrt(I_))
    bias = ((torch.rand(E, device="cuda", generator=g) - 0.5) * 0.1) if c["bias"] else None
    return router, w13, w2, bias


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("T", [1, 7, 64, 300])
def test_moe_op_against_float32_reference(torch, sct, name, T):
    c = CONFIGS[name]
    router, w13, w2, bias = weights(torch, c, seed=T)
    layer = sct.MoE(router, w13, w2, top_k=c["k"], scoring=c["scoring"],
                    renormalize=c["renormalize"], selection_bias=bias, max_tokens=512)
    x = torch.randn(T, c["H"], device="cuda").to(torch.bfloat16)
    out, ids, w = layer(x, return_routing=True)
    assert out.shape == x.shape and out.dtype == torch.bfloat16 and out.data_ptr() != x.data_ptr()
    assert ids.shape == (T, c["k"]) and ids.dtype == torch.int32
    assert w.shape == (T, c["k"]) and w.dtype == torch.float32
    # The choice of experts: the reference's, wherever the k-th and (k+1)-th scores are not
    # a near-tie (there two correct implementations may differ by rounding).
    _, own = route(torch, x, router, c["k"], c["scoring"], c["renormalize"], bias)
    clear = selection_margin(torch, x, router, c["k"], c["scoring"], bias) > 1e-4
    assert torch.equal(ids.long().sort(dim=1).values[clear], own.sort(dim=1).values[clear])
    assert len(set(ids[0].tolist())) == c["k"]
    ref, _, ref_w = moe_reference(torch, x, router, w13, w2, c["k"], c["scoring"],
                                  c["renormalize"], bias, ids=ids)
    assert rel_l2(out, ref) <= 1e-2, rel_l2(out, ref)
    assert torch.allclose(w, ref_w, atol=1e-4, rtol=1e-3)
    if c["renormalize"]:
        assert torch.allclose(w.sum(dim=1), torch.ones(T, device="cuda"), atol=1e-5)
    layer.close()


def test_moe_op_bit_identical_to_the_c_path(torch, sct):
    c = CONFIGS["softmax"]
    router, w13, w2, _ = weights(torch, c, seed=7)
    x = torch.randn(200, c["H"], device="cuda").to(torch.bfloat16)
    layer = sct.MoE(router, w13, w2, top_k=c["k"])
    via_torch = layer(x)
    # The plain class on safecuda's own buffers, filled with copies of the same data.
    ctx = sc.default_context(0)
    owned = []
    for t in (router, w13, w2, x):
        src = sc.Buffer.from_dlpack(t)
        dst = ctx.buffer(tuple(t.shape), "bf16")
        dst.copy_from(src)
        src.close()
        owned.append(dst)
    with sc.MoE(ctx, owned[0], owned[1], owned[2], top_k=c["k"]) as plain:
        out = plain.forward(owned[3])
        via_c = torch.from_dlpack(out)
        assert torch.equal(bits(via_c), bits(via_torch))
        # Deterministic: the same input again gives the same bits, through the dispatcher
        # (the operator) as through the module's eager shortcut.
        assert torch.equal(bits(layer(x)), bits(via_torch))
        assert torch.equal(bits(torch.ops.safecuda.moe(x, layer.layer_id)), bits(via_torch))
        layer.use_dispatcher = True
        assert torch.equal(bits(layer(x)), bits(via_torch))
        del via_c
        out.close()
    for b in owned:
        b.close()
    layer.close()


def test_moe_op_in_a_cuda_graph(torch, sct):
    c = CONFIGS["softmax"]
    router, w13, w2, _ = weights(torch, c, seed=11)
    layer = sct.MoE(router, w13, w2, top_k=c["k"], max_tokens=64)
    static_x = torch.randn(16, c["H"], device="cuda").to(torch.bfloat16)
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
        new = torch.randn(16, c["H"], device="cuda",
                          generator=torch.Generator(device="cuda").manual_seed(seed))
        static_x.copy_(new.to(torch.bfloat16))
        g.replay()
        eager = layer(static_x.clone())
        torch.cuda.synchronize()
        assert torch.equal(bits(static_out), bits(eager)), f"replay {seed}"
    del g
    layer.close()


def test_moe_under_torch_compile(torch, sct):
    c = CONFIGS["sigmoid+bias"]
    router, w13, w2, bias = weights(torch, c, seed=3)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = sct.MoE(router, w13, w2, top_k=c["k"], scoring="sigmoid",
                               selection_bias=bias)

        def forward(self, x):
            return x + 2 * self.moe(x)

    block = Block()
    x = torch.randn(4, 8, c["H"], device="cuda").to(torch.bfloat16)
    eager = block(x)
    seen = []

    def recording_backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(block, backend=recording_backend, fullgraph=True)(x)
    assert any("safecuda.moe" in s for s in seen), seen  # one opaque operator
    assert torch.equal(bits(out), bits(eager))
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)  # inductor
    out = compiled(x)
    assert out.shape == x.shape
    assert rel_l2(out, eager) <= 1e-2
    block.moe.close()


def test_swap_into_a_model(torch, sct):
    """The examples/python/moe_swap.py pattern: a torch MoE block replaced in a model."""
    c = CONFIGS["softmax"]
    router, w13, w2, _ = weights(torch, c, seed=5)

    class TorchMoE(torch.nn.Module):
        def forward(self, x):
            shape = x.shape
            out, _, _ = moe_reference(torch, x.reshape(-1, shape[-1]), router, w13, w2,
                                      c["k"])
            return out.to(x.dtype).view(shape)

    model = torch.nn.Sequential(torch.nn.Identity(), TorchMoE())
    x = torch.randn(3, 5, c["H"], device="cuda").to(torch.bfloat16)
    want = model(x)
    model[1] = sct.MoE(router, w13, w2, top_k=c["k"])
    got = model(x)
    assert got.shape == want.shape
    assert rel_l2(got, want) <= 1e-2
    model[1].close()


def test_moe_module_checks(torch, sct):
    c = CONFIGS["softmax"]
    router, w13, w2, _ = weights(torch, c, seed=1)
    with pytest.raises(TypeError, match="bfloat16"):
        sct.MoE(router.float(), w13, w2, top_k=2)
    with pytest.raises(ValueError, match="not contiguous"):
        sct.MoE(router, w13.transpose(1, 2), w2, top_k=2)
    with pytest.raises(ValueError, match="not a CUDA device"):
        sct.MoE(router.cpu(), w13, w2, top_k=2)
    layer = sct.MoE(router, w13, w2, top_k=2)
    with pytest.raises(ValueError, match="bfloat16 CUDA tensor"):
        layer(torch.randn(4, c["H"], device="cuda"))
    assert layer(torch.empty(0, c["H"], device="cuda", dtype=torch.bfloat16)).shape == \
        (0, c["H"])
    lid = layer.layer_id
    layer.close()
    # Parameters (requires_grad) are borrowed too: the layer exports their storage.
    params = [torch.nn.Parameter(t) for t in (router, w13, w2)]
    p_layer = sct.MoE(*params, top_k=2)
    x = torch.randn(3, c["H"], device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(bits(p_layer(x)), bits(sct.MoE(router, w13, w2, top_k=2)(x)))
    buf = sct.as_buffer(params[0])
    assert buf.device_ptr == params[0].data_ptr() and buf.shape == tuple(router.shape)
    assert torch.equal(bits(sct.as_tensor(buf)), bits(router))
    buf.close()
    p_layer.close()
    with pytest.raises(RuntimeError, match=f"no MoE layer {lid}"):
        torch.ops.safecuda.moe(torch.zeros(1, c["H"], device="cuda", dtype=torch.bfloat16),
                               lid)


# ---- the v2 layer: every option against the float32 reference ----------------------------------

# The models' layer structures at test sizes. shared: I_s / I (0: no shared expert);
# gate: the shared expert's sigmoid gate; router_bias / expert_bias: gpt-oss's biases;
# scale: of the W13 weights (x W13 ~ scale: 3 makes the swiglu clamp bite).
V2 = {
    "deepseek-v3": dict(E=64, k=8, H=256, I=128, scoring="sigmoid", renormalize=True,
                        bias=True, shared=1,
                        opts=dict(n_group=8, topk_group=4, routed_scaling=2.5)),
    "kimi-k2": dict(E=48, k=8, H=256, I=64, scoring="sigmoid", renormalize=True, bias=True,
                    shared=2, opts=dict(n_group=1, topk_group=1, routed_scaling=2.827)),
    "qwen3-next": dict(E=512, k=10, H=256, I=64, scoring="softmax", renormalize=True,
                       shared=1, gate=True, opts={}),
    "gpt-oss": dict(E=32, k=4, H=256, I=256, scoring="softmax", renormalize=True,
                    router_bias=True, expert_bias=True, scale=3.0,
                    opts=dict(activation="swiglu_clamp", w13_layout="interleaved")),
    "geglu raw": dict(E=16, k=3, H=128, I=96, scoring="softmax", renormalize=False,
                      opts=dict(activation="gelu_tanh", routed_scaling=1.5)),
    "swiglu constants": dict(E=8, k=2, H=128, I=64, scoring="sigmoid", renormalize=True,
                             expert_bias=True, scale=2.0, shared=1,
                             opts=dict(activation="swiglu_clamp", swiglu_alpha=1.2,
                                       swiglu_limit=3.0)),
}


def v2_weights(torch, c, seed):
    """The tensors of a V2 config: bf16 weights, f32 biases (None where not used)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I_ = c["E"], c["H"], c["I"]
    scale = c.get("scale", 1.0)

    def randn(*shape, s, dtype=torch.bfloat16):
        return (torch.randn(*shape, device="cuda", generator=g) * s).to(dtype)

    W = dict(router=randn(E, H, s=1 / math.sqrt(H)),
             w13=randn(E, 2 * I_, H, s=scale / math.sqrt(H)),
             w2=randn(E, H, I_, s=1 / math.sqrt(I_)))
    W["selection_bias"] = ((torch.rand(E, device="cuda", generator=g) - 0.5) * 0.2
                           if c.get("bias") else None)
    W["router_bias"] = randn(E, s=0.5, dtype=torch.float32) if c.get("router_bias") else None
    eb = c.get("expert_bias")
    W["w13_bias"] = randn(E, 2 * I_, s=0.5, dtype=torch.float32) if eb else None
    W["w2_bias"] = randn(E, H, s=0.5, dtype=torch.float32) if eb else None
    S = c.get("shared", 0) * I_
    W["shared_w13"] = randn(2 * S, H, s=scale / math.sqrt(H)) if S else None
    W["shared_w2"] = randn(H, S, s=1 / math.sqrt(S)) if S else None
    W["shared_gate"] = randn(H, s=1 / math.sqrt(H)) if S and c.get("gate") else None
    return W


OPTIONAL = ("router_bias", "w13_bias", "w2_bias", "shared_w13", "shared_w2", "shared_gate")


def v2_layer(torch, sct, name, seed, **extra):
    c = V2[name]
    W = v2_weights(torch, c, seed)
    kw = {n: W[n] for n in OPTIONAL if W[n] is not None}
    layer = sct.MoE(W["router"], W["w13"], W["w2"], top_k=c["k"], scoring=c["scoring"],
                    renormalize=c["renormalize"], selection_bias=W["selection_bias"],
                    max_tokens=512, **c["opts"], **kw, **extra)
    return c, W, layer


def ref_options(c, W):
    """moe_reference's keyword arguments for a V2 config."""
    o = {n: W[n] for n in OPTIONAL}
    o.update(c["opts"])
    return o


def route_options(c, W):
    return dict(router_bias=W["router_bias"], n_group=c["opts"].get("n_group", 0),
                topk_group=c["opts"].get("topk_group", 0))


def assert_close(out, ref, what):
    """bf16 tolerances: relative L2 1e-2 and every element within 5% of the largest."""
    r = rel_l2(out, ref)
    assert r <= 1e-2, f"{what}: relative L2 {r:.3g} > 1e-2"
    worst = (out.float() - ref.float()).abs().max().item()
    bound = 0.05 * ref.float().abs().max().item() + 1e-3
    assert worst <= bound, f"{what}: an element off by {worst:.3g} (bound {bound:.3g})"


def x_for(torch, c, T, seed):
    g = torch.Generator(device="cuda").manual_seed(1000 + seed)
    return torch.randn(T, c["H"], device="cuda", generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("name", list(V2))
@pytest.mark.parametrize("T", [1, 7, 300])
def test_v2_against_float32_reference(torch, sct, name, T):
    c, W, layer = v2_layer(torch, sct, name, seed=T)
    x = x_for(torch, c, T, T)
    out, ids, w = layer(x, return_routing=True)
    k, E = c["k"], c["E"]
    assert out.shape == x.shape and ids.shape == (T, k) and w.shape == (T, k)
    assert ((ids >= 0) & (ids < E)).all().item()
    assert all(len(set(row)) == k for row in ids.tolist()), "an expert chosen twice"
    ro = route_options(c, W)
    _, own = route(torch, x, W["router"], k, c["scoring"], c["renormalize"],
                   W["selection_bias"], **ro)
    clear = selection_margin(torch, x, W["router"], k, c["scoring"], W["selection_bias"],
                             **ro) > 1e-4
    got, want = ids.long().sort(dim=1).values, own.sort(dim=1).values
    bad = (got != want).any(dim=1) & clear
    assert not bad.any().item(), (f"{int(bad.sum())} of {T} tokens chose other experts than "
                                  f"the reference (no near-tie there): token "
                                  f"{int(bad.nonzero()[0])}")
    if c["opts"].get("n_group", 0) > 1:
        G = E // c["opts"]["n_group"]
        groups = (ids.long() // G)
        assert all(len(set(row)) <= c["opts"]["topk_group"] for row in groups.tolist())
    ref, _, ref_w = moe_reference(torch, x, W["router"], W["w13"], W["w2"], k, c["scoring"],
                                  c["renormalize"], W["selection_bias"], ids=ids,
                                  **ref_options(c, W))
    assert torch.allclose(w, ref_w, atol=1e-4, rtol=1e-3), (w - ref_w).abs().max().item()
    if c["renormalize"]:
        scale = c["opts"].get("routed_scaling", 0) or 1.0
        assert torch.allclose(w.sum(dim=1), torch.full((T,), scale, device="cuda"),
                              atol=1e-4 * scale)
    assert_close(out, ref, f"{name} T={T}")
    layer.close()


@pytest.mark.parametrize("name", list(V2))
def test_v2_route_is_what_the_forward_uses(torch, sct, name):
    c, W, layer = v2_layer(torch, sct, name, seed=21)
    x = x_for(torch, c, 129, 21)
    ids_r, w_r = layer.route(x)
    assert ids_r.dtype == torch.int32 and w_r.dtype == torch.float32
    assert ids_r.shape == (129, c["k"]) and w_r.shape == (129, c["k"])
    out, ids, w = layer(x, return_routing=True)
    assert torch.equal(ids_r, ids) and torch.equal(w_r, w)
    # Given back as the caller's routing, the same layer.
    given = layer(x, routing=(ids_r, w_r))
    assert rel_l2(given, out) <= 2e-3, rel_l2(given, out)
    # Through the operators as through the eager shortcut.
    ids_o, w_o = torch.ops.safecuda.moe_route(x, layer.layer_id)
    assert torch.equal(ids_o, ids_r) and torch.equal(w_o, w_r)
    given_o = torch.ops.safecuda.moe_with_routing(x, layer.layer_id, ids_r, w_r, False)
    assert torch.equal(bits(given_o), bits(given))
    # No tokens.
    e_ids, e_w = layer.route(x[:0])
    assert e_ids.shape == (0, c["k"]) and e_w.shape == (0, c["k"])
    layer.close()


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss", "qwen3-next"])
def test_v2_caller_routing_with_padded_slots(torch, sct, name):
    c, W, layer = v2_layer(torch, sct, name, seed=5)
    T, k, E = 77, c["k"], c["E"]
    x = x_for(torch, c, T, 5)
    g = torch.Generator(device="cuda").manual_seed(55)
    ids = torch.rand(T, E, device="cuda", generator=g).argsort(dim=1)[:, :k]  # int64
    ids[::3, -1] = -1  # padded slots
    ids[5] = -1  # a token with no routed expert: the shared expert alone
    weights = torch.rand(T, k, device="cuda", generator=g) + 0.1  # used as given
    out = layer(x.view(1, T, -1), routing=(ids.view(1, T, k), weights))
    assert out.shape == (1, T, c["H"])
    ref, _, _ = moe_reference(torch, x, W["router"], W["w13"], W["w2"], k, c["scoring"],
                              c["renormalize"], W["selection_bias"], ids=ids,
                              weights=weights, **ref_options(c, W))
    assert_close(out.view(T, -1), ref, f"{name} caller routing")
    layer.close()


def test_v2_bad_routing_id_is_reported(torch, sct):
    c, W, layer = v2_layer(torch, sct, "gpt-oss", seed=8)
    T, k, E = 16, c["k"], c["E"]
    x = x_for(torch, c, T, 8)
    ids, weights = layer.route(x)
    bad = ids.clone()
    bad[3, 1] = E
    with pytest.raises(sc.InvalidArgumentError) as info:
        layer(x, routing=(bad, weights), check_routing=True)
    assert str(E) in info.value.message, info.value.message
    # Unchecked: the slot is skipped, the rest computed, and the next check reports it once.
    out = layer(x, routing=(bad, weights))
    ref, _, _ = moe_reference(torch, x, W["router"], W["w13"], W["w2"], k, c["scoring"],
                              c["renormalize"], ids=bad, weights=weights,
                              **ref_options(c, W))
    assert_close(out, ref, "bad id skipped")
    with pytest.raises(sc.InvalidArgumentError) as info:
        layer.routing_check()
    msg = info.value.message
    assert "sc_moe_routing_check" in msg and str(E) in msg, msg
    layer.routing_check()  # reported once, then forgotten
    layer(x, routing=(ids, weights), check_routing=True)  # good ids: no report
    layer.close()


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-next", "gpt-oss"])
def test_v2_accumulate(torch, sct, name):
    c, W, layer = v2_layer(torch, sct, name, seed=9)
    T = 65
    x = x_for(torch, c, T, 9)
    residual = torch.randn(T, c["H"], device="cuda").to(torch.bfloat16)
    acc = residual.clone()
    ids, w = layer.route(x)
    assert layer(x, accumulate_into=acc) is acc
    ref, _, _ = moe_reference(torch, x, W["router"], W["w13"], W["w2"], c["k"],
                              c["scoring"], c["renormalize"], W["selection_bias"], ids=ids,
                              accumulate=residual, **ref_options(c, W))
    assert_close(acc, ref, f"{name} accumulate")
    # With the caller's routing, through the operator, into a 3-d tensor.
    acc3 = residual.clone().view(5, 13, -1)
    layer.use_dispatcher = True
    assert layer(x.view(5, 13, -1), routing=(ids, w), accumulate_into=acc3) is acc3
    assert rel_l2(acc3.view(T, -1), acc) <= 2e-3
    layer.use_dispatcher = False
    # The sum must not overlap x.
    with pytest.raises(ValueError, match="overlaps x"):
        layer(x, accumulate_into=x)
    layer.close()


def test_v2_interleaved_equals_stacked(torch, sct):
    """The same expert weights in both W13 layouts give the same layer."""
    c, W, inter = v2_layer(torch, sct, "gpt-oss", seed=13)
    I_ = c["I"]
    perm = torch.empty(2 * I_, dtype=torch.long, device="cuda")
    perm[:I_] = torch.arange(0, 2 * I_, 2, device="cuda")  # gate rows
    perm[I_:] = torch.arange(1, 2 * I_, 2, device="cuda")  # up rows
    w13_s = W["w13"][:, perm, :].contiguous()
    b13_s = W["w13_bias"][:, perm].contiguous()
    stacked = sct.MoE(W["router"], w13_s, W["w2"], top_k=c["k"], activation="swiglu_clamp",
                      router_bias=W["router_bias"], w13_bias=b13_s, w2_bias=W["w2_bias"])
    x = x_for(torch, c, 100, 13)
    a, ids_a, _ = inter(x, return_routing=True)
    b, ids_b, _ = stacked(x, return_routing=True)
    assert torch.equal(ids_a, ids_b)
    assert rel_l2(a, b) <= 1e-3, rel_l2(a, b)
    inter.close()
    stacked.close()


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss"])
def test_v2_weights_as_views_of_one_allocation(torch, sct, name):
    """safecuda.MoE over views into one checkpoint buffer (and one f32 buffer for the
    biases) computes what the torch layer over separate tensors does (the same bits, or on
    sm_90, whose K shift splits the sums elsewhere for such views, within 1e-2)."""
    c, W, layer = v2_layer(torch, sct, name, seed=17)
    ctx = sc.default_context(0)
    bf16 = [n for n in ("router", "w13", "w2", "shared_w13", "shared_w2", "shared_gate")
            if W[n] is not None]
    f32 = [n for n in ("selection_bias", "router_bias", "w13_bias", "w2_bias")
           if W[n] is not None]

    def pack(names, dtype):
        # 8 elements of padding first and between: every view starts 16-byte aligned, none
        # at the buffer's start.
        align = 16 // (2 if dtype == "bf16" else 4)
        offsets, n = {}, align
        for name_ in names:
            offsets[name_] = n
            n += -(-W[name_].numel() // align) * align + align
        buf = ctx.buffer(n, dtype, label=f"{dtype} checkpoint")
        views = {}
        for name_ in names:
            t = W[name_].contiguous()
            views[name_] = buf.view(offsets[name_], t.numel(), tuple(t.shape))
            src = sc.Buffer.from_dlpack(t)
            views[name_].copy_from(src)
            src.close()
        return buf, views

    big, vb = pack(bf16, "bf16")
    bias_buf, vf = pack(f32, "f32") if f32 else (None, {})
    views = {**vb, **vf}
    kw = {n: views[n] for n in OPTIONAL if n in views}
    plain = sc.MoE(ctx, views["router"], views["w13"], views["w2"], top_k=c["k"],
                   scoring=c["scoring"], renormalize=c["renormalize"],
                   selection_bias=views.get("selection_bias"), **c["opts"], **kw)
    x = x_for(torch, c, 50, 17)
    want = layer(x)
    xb = sc.Buffer.from_dlpack(x)
    out = plain.forward(xb)
    torch.cuda.synchronize()
    got = torch.from_dlpack(out)
    # On sm_90 the weights at 16-byte (not 128-byte) offsets get the K shift (the sums split
    # K elsewhere: not the same bits as whole tensors), elsewhere the same bits.
    if torch.cuda.get_device_capability(0) == (9, 0):
        d = (got.float() - want.float()).norm() / want.float().norm()
        assert d.item() <= 1e-2, d.item()
        out2 = plain.forward(xb)
        torch.cuda.synchronize()
        again = torch.from_dlpack(out2)
        assert torch.equal(bits(again), bits(got))  # deterministic
        del again
        out2.close()
    else:
        assert torch.equal(bits(got), bits(want))
    del got
    for o in (out, xb, plain, big, bias_buf, layer):
        if o is not None:
            o.close()


def test_v2_operators_under_torch_compile(torch, sct):
    c, W, layer = v2_layer(torch, sct, "deepseek-v3", seed=3)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = layer

        def forward(self, x):
            ids, w = self.moe.route(x)
            y = self.moe(x, routing=(ids, w))
            r = x * 2
            self.moe(x, accumulate_into=r)
            return y, r, ids, w

    block = Block()
    x = x_for(torch, c, 24, 3).view(4, 6, -1)
    eager = block(x)
    seen = []

    def recording_backend(gm, example_inputs):
        seen.extend(f"{n.target} {n.args}" for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(block, backend=recording_backend, fullgraph=True)(x)
    text = "\n".join(seen)
    for op in ("moe_route", "moe_with_routing", "moe_accumulate"):
        assert op in text, text
    for what, a, b in zip(("out", "accumulated", "ids", "weights"), got, eager):
        if a.dtype == torch.bfloat16:
            a, b = bits(a), bits(b)
        assert torch.equal(a, b), what
    torch._dynamo.reset()
    got = torch.compile(block, fullgraph=True)(x)  # inductor (functionalized accumulate)
    assert rel_l2(got[0], eager[0]) <= 1e-2 and rel_l2(got[1], eager[1]) <= 1e-2
    assert torch.equal(got[2], eager[2])
    layer.close()


def test_v2_module_checks(torch, sct):
    c = V2["gpt-oss"]
    W = v2_weights(torch, c, seed=2)
    base = (W["router"], W["w13"], W["w2"])
    with pytest.raises(TypeError, match=r"w13_bias is torch.bfloat16; the layer takes "
                                        r"w13_bias as torch.float32 \(pass .float\(\)\)"):
        sct.MoE(*base, top_k=4, w13_bias=W["w13_bias"].to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"w2_bias must be \[E, H\] = \[32, 256\]"):
        sct.MoE(*base, top_k=4, w2_bias=W["w2_bias"][:, :128].contiguous())
    # A shared expert of I_s = I = 256 (zero weights: the checks are what is tested).
    s13 = torch.zeros(2 * 256, 256, device="cuda", dtype=torch.bfloat16)
    s2 = torch.zeros(256, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="shared_w13 and shared_w2 are given together"):
        sct.MoE(*base, top_k=4, shared_w13=s13)
    with pytest.raises(ValueError, match="shared_gate scales the shared expert"):
        sct.MoE(*base, top_k=4, shared_gate=s2[:, 0].contiguous())
    with pytest.raises(ValueError, match=r"shared_w13 must be \[2 I_s, H\] = \[512, 256\]"):
        sct.MoE(*base, top_k=4, shared_w13=s13[:64], shared_w2=s2)
    with pytest.raises(ValueError, match="shared_gate must hold H = 256"):
        sct.MoE(*base, top_k=4, shared_w13=s13, shared_w2=s2,
                shared_gate=s2[:8, 0].contiguous())
    with pytest.raises(TypeError, match="unknown option"):
        sct.MoE(*base, top_k=4, n_groups=8)
    with pytest.raises(ValueError, match="activation is one of"):
        sct.MoE(*base, top_k=4, activation="relu")
    layer = sct.MoE(*base, top_k=4, activation="swiglu_clamp", w13_layout="interleaved",
                    shared_w13=s13, shared_w2=s2,
                    shared_gate=torch.zeros(1, 256, device="cuda", dtype=torch.bfloat16))
    assert layer.shared_intermediate == 256 and layer.shared_w2 is s2
    assert "activation=swiglu_clamp" in repr(layer) and "shared_intermediate=256" in repr(layer)
    x = x_for(torch, c, 8, 2)
    ids, w = layer.route(x)
    with pytest.raises(ValueError, match=r"\[\.\.\., k=4\] for the 8 tokens"):
        layer(x, routing=(ids[:, :3], w[:, :3]))
    with pytest.raises(TypeError, match="integer tensor is expected"):
        layer(x, routing=(ids.float(), w))
    with pytest.raises(TypeError, match="routing is a pair"):
        layer(x, routing=ids)
    with pytest.raises(ValueError, match="return_routing goes with the layer's own routing"):
        layer(x, True, routing=(ids, w))
    with pytest.raises(ValueError, match="check_routing checks the caller's routing"):
        layer(x, check_routing=True)
    with pytest.raises(ValueError, match="accumulate_into must be a contiguous tensor of "
                                         "x's shape"):
        layer(x, accumulate_into=torch.zeros(8, 128, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="the tensor to accumulate into must be a "
                                         "contiguous bfloat16 tensor"):
        layer(x, accumulate_into=torch.zeros(8, 256, device="cuda"))
    layer.close()
