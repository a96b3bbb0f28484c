"""safecuda.torch.shard_for_tp on the CPU: the shards of every rank put back together give the
full layer. For stacked and interleaved W13, bf16 and fp8 experts (with their 128 x 128
block scales), a shared expert and biases: the sum over the ranks of each rank's partial
expert output (float64, SwiGLU) equals the full layer's, and each fp8 shard dequantized with
its scales is exactly the full dequantized weight's rows or columns. The refusals: sizes
that don't split into shards the layer takes."""

import pytest

torch = pytest.importorskip("torch")
from safecuda._tp import shard_for_tp  # noqa: E402 - after the torch check


def _gate_up(w, interleaved):
    """W1 (gate) and W3 (up) rows of a W13 [E, 2I, H] or of its bias [E, 2I] (dim 1)."""
    n = w.shape[1]
    if interleaved:
        return (w.index_select(1, torch.arange(0, n, 2)),
                w.index_select(1, torch.arange(1, n, 2)))
    return w.narrow(1, 0, n // 2), w.narrow(1, n // 2, n // 2)


def _expert_out(x, w13, w2, b13, interleaved):
    """sum over the experts of W2[e] (silu(g) u) for x [H] (float64), g = W1 x + b1, u = ..."""
    g_w, u_w = _gate_up(w13, interleaved)            # [E, I, H]
    g = torch.einsum("eih,h->ei", g_w, x)
    u = torch.einsum("eih,h->ei", u_w, x)
    if b13 is not None:
        gb, ub = _gate_up(b13, interleaved)          # [E, I]
        g, u = g + gb, u + ub
    h = torch.nn.functional.silu(g) * u
    return torch.einsum("ehi,ei->h", w2, h)


def _shared_out(x, sw13, sw2, interleaved):
    g_w, u_w = _gate_up(sw13.unsqueeze(0), interleaved)
    h = torch.nn.functional.silu(g_w[0] @ x) * (u_w[0] @ x)
    return sw2 @ h


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("n", [2, 4])
def test_partials_sum_to_the_full_layer(interleaved, n):
    g = torch.Generator().manual_seed(7)
    E, H, I_, Is = 3, 16, 32, 64
    f = torch.float64
    kw = dict(router_weight=torch.randn(E, H, generator=g, dtype=f),
              w13=torch.randn(E, 2 * I_, H, generator=g, dtype=f),
              w2=torch.randn(E, H, I_, generator=g, dtype=f),
              w13_bias=torch.randn(E, 2 * I_, generator=g, dtype=f),
              w2_bias=torch.randn(E, H, generator=g, dtype=f),
              shared_w13=torch.randn(2 * Is, H, generator=g, dtype=f),
              shared_w2=torch.randn(H, Is, generator=g, dtype=f),
              shared_intermediate=Is, top_k=2,
              w13_layout="interleaved" if interleaved else "stacked")
    x = torch.randn(H, generator=g, dtype=f)
    full = _expert_out(x, kw["w13"], kw["w2"], kw["w13_bias"], interleaved)
    full_s = _shared_out(x, kw["shared_w13"], kw["shared_w2"], interleaved)
    parts = torch.zeros(H, dtype=f)
    parts_s = torch.zeros(H, dtype=f)
    for r in range(n):
        s = shard_for_tp(kw, r, n)
        assert s["w13"].shape == (E, 2 * I_ // n, H) and s["w2"].shape == (E, H, I_ // n)
        assert s["shared_w13"].shape == (2 * Is // n, H) and s["shared_w2"].shape == (H, Is // n)
        assert s["shared_intermediate"] == Is // n
        assert s["w13"].is_contiguous() and s["w2"].is_contiguous()
        # replicated, whole
        assert s["router_weight"] is kw["router_weight"] and s["w2_bias"] is kw["w2_bias"]
        parts += _expert_out(x, s["w13"], s["w2"], s["w13_bias"], interleaved)
        parts_s += _shared_out(x, s["shared_w13"], s["shared_w2"], interleaved)
    torch.testing.assert_close(parts, full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(parts_s, full_s, rtol=1e-12, atol=1e-12)
    assert kw["w13"].shape == (E, 2 * I_, H)  # the caller's dict untouched


def _dequant(q, scale):
    """e4m3 [.., R, C] x its scales [.., R/128, C/128] -> float64."""
    s = scale.repeat_interleave(128, dim=-2).repeat_interleave(128, dim=-1)
    return q.to(torch.float64) * s.to(torch.float64)


@pytest.mark.parametrize("interleaved", [False, True])
def test_fp8_shards_keep_their_blocks(interleaved):
    g = torch.Generator().manual_seed(3)
    E, H, I_, n = 2, 256, 512, 2
    w13 = (torch.randn(E, 2 * I_, H, generator=g)).to(torch.float8_e4m3fn)
    w2 = (torch.randn(E, H, I_, generator=g)).to(torch.float8_e4m3fn)
    s13 = torch.rand(E, 2 * I_ // 128, H // 128, generator=g) + 0.5
    s2 = torch.rand(E, H // 128, I_ // 128, generator=g) + 0.5
    kw = dict(w13=w13, w2=w2, w13_scale=s13, w2_scale=s2, router_weight=None,
              w13_layout="interleaved" if interleaved else "stacked")
    d13, d2 = _dequant(w13, s13), _dequant(w2, s2)
    g_full, u_full = _gate_up(d13, interleaved)
    for r in range(n):
        s = shard_for_tp(kw, r, n)
        assert s["w13_scale"].shape == (E, 2 * I_ // n // 128, H // 128)
        assert s["w2_scale"].shape == (E, H // 128, I_ // n // 128)
        g_r, u_r = _gate_up(_dequant(s["w13"], s["w13_scale"]), interleaved)
        sh = I_ // n
        assert torch.equal(g_r, g_full[:, r * sh:(r + 1) * sh])
        assert torch.equal(u_r, u_full[:, r * sh:(r + 1) * sh])
        assert torch.equal(_dequant(s["w2"], s["w2_scale"]), d2[:, :, r * sh:(r + 1) * sh])


def test_refusals():
    f = torch.float32
    kw = dict(w13=torch.zeros(2, 2 * 24, 8, dtype=f), w2=torch.zeros(2, 8, 24, dtype=f))
    with pytest.raises(ValueError, match="intermediate 24 does not split into 2 shards of a "
                                         "multiple of 8"):
        shard_for_tp(kw, 0, 2)
    assert shard_for_tp(kw, 0, 3)["w2"].shape == (2, 8, 8)
    kw8 = dict(w13=torch.zeros(1, 2 * 128, 128).to(torch.float8_e4m3fn),
               w2=torch.zeros(1, 128, 128).to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="fp8 experts: whole 128 x 128 blocks"):
        shard_for_tp(kw8, 1, 2)
    for rank, n in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="0 <= rank < nranks"):
            shard_for_tp(kw, rank, n)
    assert shard_for_tp(kw, 0, 1) == kw
