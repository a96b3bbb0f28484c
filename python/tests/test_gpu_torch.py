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
