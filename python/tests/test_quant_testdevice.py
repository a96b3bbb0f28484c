"""safecuda.quantize_fp8_* / dequantize_fp8_* over safecuda buffers on the test device
(SAFECUDA_DEVICE=test, in a child process: see conftest.py), and the fp8 element types.
The test device runs no kernels: what is checked is the binding (the shapes read, the
outputs made, their dtypes and shapes, the desc each call fills) and the library's checks,
which come before any launch; a call that passes them ends at the test device's refusal
of the launch (NotSupportedError), or at NoCompilerError without NVRTC. The GPU runs,
against a reference, are test_gpu_quant.py's (and tests/gpu/test_gpu_quant.c's)."""

import pytest

import safecuda as sc
from safecuda import _lib, _quant

# ---- no device needed -----------------------------------------------------------------------


def test_fp8_dtypes_have_the_c_values_and_names():
    assert int(sc.DType.F8E4M3) == 13 and int(sc.DType.F8E5M2) == 14
    assert sc.as_dtype("f8e4m3") is sc.DType.F8E4M3
    assert sc.as_dtype("float8_e4m3fn") is sc.DType.F8E4M3
    assert sc.as_dtype("torch.float8_e5m2") is sc.DType.F8E5M2
    assert sc.DType.F8E4M3.size == 1 and str(sc.DType.F8E5M2) == "f8e5m2"
    # Raw bytes of the host are still u8, not fp8.
    from safecuda._dtype import dtype_for_host_format
    assert dtype_for_host_format("B") is sc.DType.U8


def test_shapes_of_the_scales():
    blocks = _quant._shapes("f", (300, 200), False)
    assert blocks == ((1, 300, 200), (3, 2))
    assert _quant._shapes("f", (3, 300, 200), False) == ((3, 300, 200), (3, 3, 2))
    assert _quant._shapes("f", (128, 128), False) == ((1, 128, 128), (1, 1))
    assert _quant._shapes("f", (2, 5, 300), True) == ((1, 10, 300), (2, 5, 3))
    assert _quant._shapes("f", (7168,), True) == ((1, 1, 7168), (56,))
    with pytest.raises(ValueError, match=r"w must be \[rows, cols\] or \[batch, rows, cols\]"):
        _quant._shapes("quantize_fp8_blocks", (4, 3, 2, 1), False)
    with pytest.raises(ValueError, match="w must be"):
        _quant._shapes("quantize_fp8_blocks", (128,), False)


def test_the_desc_and_signatures():
    d = _quant._desc((3, 300, 200))
    assert (d.rows, d.cols, d.batch) == (300, 200, 3)
    for name in ("sc_quantize_fp8_blocks", "sc_dequantize_fp8_blocks", "sc_quantize_fp8_tokens",
                 "sc_dequantize_fp8_tokens"):
        assert _lib.lib.has(name), name


def test_arguments_of_the_wrong_kind():
    with pytest.raises(TypeError, match="w must be a safecuda Buffer or View, or a CUDA torch"):
        sc.quantize_fp8_blocks([1, 2, 3])
    with pytest.raises(ValueError, match="dtype is bf16 or f32, not f16"):
        sc.dequantize_fp8_blocks(None, None, dtype="f16")


# ---- on the test device ---------------------------------------------------------------------

on_testdevice = pytest.mark.testdevice


@pytest.fixture
def ctx():
    with sc.Context() as c:
        yield c


def _passed_the_checks(call):
    """Run call; True when the library's checks passed (the test device then refuses the
    launch; without NVRTC the kernels can't be compiled)."""
    try:
        call()
    except (sc.NotSupportedError, sc.NoCompilerError) as exc:
        if isinstance(exc, sc.NotSupportedError):
            assert "test device" in exc.message or "launch" in exc.message, exc.message
        return True
    return True


@on_testdevice
def test_outputs_made_with_their_shapes(ctx):
    w = ctx.buffer((3, 300, 200), "bf16", label="w")
    q = ctx.buffer((3, 300, 200), "f8e4m3", label="q")
    s = ctx.buffer((3, 3, 2), "f32", label="s")
    # Given outputs: the call is made with them (the test device refuses the launch).
    assert _passed_the_checks(lambda: sc.quantize_fp8_blocks(w, q=q, scale=s))
    assert _passed_the_checks(lambda: sc.dequantize_fp8_blocks(q, s, dtype="f32"))
    x = ctx.buffer((2, 5, 300), "bf16")
    st = ctx.buffer((2, 5, 3), "f32")
    qx = ctx.buffer((2, 5, 300), "f8e4m3")
    assert _passed_the_checks(lambda: sc.quantize_fp8_tokens(x, q=qx, scale=st))
    assert _passed_the_checks(lambda: sc.dequantize_fp8_tokens(qx, st))
    # The outputs the calls make are closed when the call fails: nothing is left behind.
    before = len(ctx.live_objects())
    _passed_the_checks(lambda: sc.quantize_fp8_blocks(w))
    _passed_the_checks(lambda: sc.dequantize_fp8_tokens(qx, st, dtype="bf16"))
    assert len(ctx.live_objects()) == before


@on_testdevice
def test_the_library_refusals_reach_python(ctx):
    w = ctx.buffer((256, 256), "bf16", label="w")
    f32 = ctx.buffer((256, 256), "f32", label="f32")
    q = ctx.buffer((256, 256), "f8e4m3", label="q")
    s = ctx.buffer((2, 2), "f32", label="s")
    with pytest.raises(sc.TypeMismatchError, match="sc_quantize_fp8_blocks: w is f32; it must "
                                                   "be bf16"):
        sc.quantize_fp8_blocks(f32, q=q, scale=s)
    with pytest.raises(sc.TypeMismatchError, match="q is f32; it must be f8e4m3"):
        sc.quantize_fp8_blocks(w, q=f32, scale=s)
    small = ctx.buffer((2, 1), "f32", label="small")
    with pytest.raises(sc.InvalidArgumentError, match=r"scale has 2 elements; the shape gives "
                                                      r"it batch 1 x ceil\(rows / 128\) 2"):
        sc.quantize_fp8_blocks(w, q=q, scale=small)
    with pytest.raises(sc.InvalidArgumentError, match="q has 65536 elements; the shape gives "
                                                      "it tokens 1 x hidden 256 = 256"):
        sc.quantize_fp8_tokens(w[0], q=q, scale=s.view(0, 2))
    with pytest.raises(sc.TypeMismatchError, match="out is f8e4m3; it must be bf16 or f32"):
        sc.dequantize_fp8_blocks(q, s, out=q)
    with pytest.raises(TypeError, match="q must be a safecuda Buffer or View"):
        sc.quantize_fp8_blocks(w, q=b"\0" * 65536, scale=s)


@on_testdevice
def test_sub_views_and_the_stream(ctx):
    big = ctx.buffer(70000, "bf16")
    w = big.view(8, 300 * 200, shape=(300, 200))  # 16-byte offset into a larger buffer
    s = ctx.stream()
    assert _passed_the_checks(lambda: sc.quantize_fp8_blocks(w, stream=s))
    s.close()
