"""safecuda.quantize_fp8_* / dequantize_fp8_* on a GPU with PyTorch (compute capability 8.9
or newer) against a reference in PyTorch on the CPU, written from quant.h's rule (amax
without NaNs, scale = amax / 448, q = e4m3(v * (448 / amax)), every step in float32): the
scales and the q bytes must be equal, every one, and the dequantized values too; the round
trip's relative error is e4m3's. Also on a torch side stream, on safecuda buffers, and
through the torch operators' shapes. Skipped (saying why) without a GPU, torch or NVRTC;
failed instead under SAFECUDA_REQUIRE_GPU=1."""

import pytest

import safecuda as sc

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch(torch_cuda, nvrtc):
    if not hasattr(torch_cuda, "float8_e4m3fn"):
        pytest.skip(f"torch {torch_cuda.__version__} has no float8_e4m3fn")
    major, minor = torch_cuda.cuda.get_device_capability(0)
    if major * 10 + minor < 89:
        pytest.skip(f"sm_{major}{minor}: FP8 conversions need compute capability 8.9")
    return torch_cuda


def data(torch, shape, block_rows, seed):
    """bf16 values whose magnitude changes from block to block (10^-4 .. 10^4), a few exact
    zeros, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    rows, cols = shape[-2], shape[-1]
    rb, cb = -(-rows // block_rows), -(-cols // 128)
    mags = 10.0 ** torch.empty(shape[:-2] + (rb, cb)).uniform_(-4, 4, generator=g)
    mags = mags.repeat_interleave(block_rows, -2)[..., :rows, :]
    mags = mags.repeat_interleave(128, -1)[..., :cols]
    x = x * mags
    x[torch.rand(shape, generator=g) < 0.03] = 0
    return x.to(torch.bfloat16)


def reference(torch, w, block_rows):
    """(q as uint8 bits, scale, dequantized f32) of bf16 w [..., rows, cols] on the CPU."""
    v = w.float()
    rows, cols = v.shape[-2], v.shape[-1]
    rb, cb = -(-rows // block_rows), -(-cols // 128)
    pad = torch.zeros(v.shape[:-2] + (rb * block_rows, cb * 128))
    pad[..., :rows, :cols] = v
    a = pad.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    blocks = a.reshape(v.shape[:-2] + (rb, block_rows, cb, 128))
    amax = blocks.amax(dim=(-3, -1))
    tiny = (amax > 0) & (amax < 2.0 ** -64)
    pre = torch.where(tiny, torch.full_like(amax, 2.0 ** 64), torch.ones_like(amax))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    # 448 / (amax x pre) as one correctly rounded division: `448.0 / tensor` is
    # tensor.reciprocal() * 448 in torch (two roundings), which differs in the last bit for
    # some amax and then rounds products that are exact e4m3 ties the other way.
    inv = torch.where(amax > 0, torch.div(torch.full_like(amax, 448.0), amax * pre),
                      torch.ones_like(amax))

    def expand(t):
        t = t.repeat_interleave(block_rows, -2)[..., :rows, :]
        return t.repeat_interleave(128, -1)[..., :cols]

    q = ((v * expand(pre)) * expand(inv)).to(torch.float8_e4m3fn)
    deq = q.float() * expand(scale)
    return q.view(torch.uint8), scale, deq


def as_blocks(torch, t):
    """A tokens tensor [..., H] as [rows, H] for the reference (1 x 128 blocks)."""
    return t.reshape(-1, t.shape[-1])


@pytest.mark.parametrize("shape", [(300, 200), (3, 300, 200), (256, 384), (1, 1), (130, 100)])
def test_weights_bit_for_bit(torch, shape):
    w = data(torch, shape, 128, seed=sum(shape))
    q, scale = sc.quantize_fp8_blocks(w.cuda())
    assert q.dtype == torch.float8_e4m3fn and tuple(q.shape) == shape
    rows, cols = shape[-2], shape[-1]
    assert tuple(scale.shape) == shape[:-2] + (-(-rows // 128), -(-cols // 128))
    rq, rs, rdeq = reference(torch, w, 128)
    assert torch.equal(scale.cpu(), rs)
    assert torch.equal(q.cpu().view(torch.uint8), rq)
    back = sc.dequantize_fp8_blocks(q, scale)
    assert back.dtype == torch.bfloat16
    assert torch.equal(back.cpu().view(torch.int16), rdeq.to(torch.bfloat16).view(torch.int16))
    back32 = sc.dequantize_fp8_blocks(q, scale, dtype="f32")
    assert torch.equal(back32.cpu(), rdeq)
    err = ((back32.cpu() - w.float()).norm() / w.float().norm()).item() if w.float().norm() \
        else 0.0
    assert err < 0.035


@pytest.mark.parametrize("shape", [(37, 7168), (2, 5, 300), (1, 128), (3, 100)])
def test_tokens_bit_for_bit(torch, shape):
    x = data(torch, (int(torch.tensor(shape[:-1]).prod()), shape[-1]), 1, seed=7 + sum(shape))
    x = x.reshape(shape)
    q, scale = sc.quantize_fp8_tokens(x.cuda())
    assert tuple(q.shape) == shape and tuple(scale.shape) == shape[:-1] + (-(-shape[-1] // 128),)
    rq, rs, rdeq = reference(torch, as_blocks(torch, x), 1)
    assert torch.equal(scale.cpu().reshape(rs.shape), rs)
    assert torch.equal(q.cpu().view(torch.uint8).reshape(rq.shape), rq)
    back = sc.dequantize_fp8_tokens(q, scale, dtype="f32")
    assert torch.equal(back.cpu().reshape(rdeq.shape), rdeq)


def test_on_a_side_stream_and_non_contiguous(torch):
    w = data(torch, (512, 256), 128, seed=3)
    rq, rs, _ = reference(torch, w, 128)
    wt = w.t().contiguous().cuda().t()  # a non-contiguous view of the same values
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        q, scale = sc.quantize_fp8_blocks(wt)
    side.synchronize()
    assert torch.equal(scale.cpu(), rs)
    assert torch.equal(q.cpu().view(torch.uint8), rq)


def test_safecuda_buffers(torch):
    w = data(torch, (2, 256, 384), 128, seed=11)
    rq, rs, rdeq = reference(torch, w, 128)
    with sc.Context() as ctx:
        b = ctx.from_host(w.view(torch.int16).numpy().view("uint16"), dtype="bf16",
                          shape=(2, 256, 384))  # bf16 as its 16 raw bits ('H')
        q, s = sc.quantize_fp8_blocks(b)
        assert q.dtype is sc.DType.F8E4M3 and q.shape == (2, 256, 384)
        assert s.dtype is sc.DType.F32 and s.shape == (2, 2, 3)
        assert bytes(q.to_host()) == rq.numpy().tobytes()
        assert s.tolist() == rs.tolist()
        out = sc.dequantize_fp8_blocks(q, s, dtype="f32")
        assert bytes(out.to_host()) == rdeq.numpy().tobytes()
        for x in (b, q, s, out):
            x.close()


def test_refusals(torch):
    with pytest.raises(TypeError, match="w is torch.float32; it must be torch.bfloat16"):
        sc.quantize_fp8_blocks(torch.zeros(128, 128, device="cuda"))
    with pytest.raises(ValueError, match="is on cpu, not a CUDA device"):
        sc.quantize_fp8_tokens(torch.zeros(4, 128, dtype=torch.bfloat16))
    q = torch.zeros(256, 256, dtype=torch.float8_e4m3fn, device="cuda")
    with pytest.raises(ValueError, match=r"scale must be \[2, 2\] for q \[256, 256\]"):
        sc.dequantize_fp8_blocks(q, torch.ones(2, 3, device="cuda"))
    e = torch.zeros(0, 128, dtype=torch.bfloat16, device="cuda")  # no tokens: empty results
    q0, s0 = sc.quantize_fp8_tokens(e)
    assert tuple(q0.shape) == (0, 128) and tuple(s0.shape) == (0, 1)
