"""The fp8 dtypes (f8e4m3, f8e5m2) through the Python API on the test device (a child
process with SAFECUDA_DEVICE=test: see conftest.py): buffers of raw bit patterns, fills
from numbers and from bits, tolist's floats, copies between fp8 flavours refused, DLPack
export and import (with dtype= taking uint8 bits as fp8), and the launch type checks of
kernels on __nv_fp8_e4m3* / __nv_fp8_e5m2* (hand-written PTX with their mangled names)."""

import array
import math
import random

import pytest

import safecuda as sc
from safecuda._dtype import float_to_fp8_bits, fp8_bits_to_float

pytestmark = pytest.mark.testdevice

E4, E5 = sc.DType.F8E4M3, sc.DType.F8E5M2


@pytest.fixture
def ctx():
    with sc.Context() as c:
        yield c


def random_bits(n, seed):
    rng = random.Random(seed)
    return bytes(rng.getrandbits(8) for _ in range(n))


def test_buffers_hold_bit_patterns(ctx):
    data = random_bits(1001, 1)
    for d in (E4, E5):
        b = ctx.from_host(data, dtype=d, label="fp8")
        assert b.dtype is d and b.shape == (1001,) and b.nbytes == 1001
        mv = b.to_host()
        assert mv.format == "B" and bytes(mv) == data
        out = bytearray(1001)
        b.to_host(out)
        assert bytes(out) == data
        want = [fp8_bits_to_float(v, d) for v in data]
        got = b.tolist()
        assert len(got) == 1001
        assert all(g == w or (math.isnan(g) and math.isnan(w)) for g, w in zip(got, want))
        # A shaped view: bytes at element offsets.
        v = b.view(3, 200).reshape(10, 20)
        assert bytes(v.to_host().cast("B")) == data[3:203]
        # Host elements that are not raw bytes are refused: fp8 has no host format.
        with pytest.raises(sc.TypeMismatchError, match="format 'f'"):
            b.view(0, 4).copy_from_host(array.array("f", [1.0]))
        b.copy_from_host(array.array("B", data[::-1]))
        assert bytes(b.to_host()) == data[::-1]
        b.close()
    with pytest.raises(sc.OutOfBoundsError):
        ctx.buffer(8, "f8e4m3").copy_from_host(bytes(9))


def test_fills(ctx):
    b = ctx.from_host(random_bits(300, 2), dtype="f8e4m3")
    before = bytes(b.to_host())
    b.view(10, 100).fill(1.0)
    b.view(200, 5).fill(b"\xff")  # bits: a NaN
    b.view(250, 3).fill(-1000.0)  # saturates to -448
    got = bytes(b.to_host())
    assert got[:10] == before[:10] and got[110:200] == before[110:200]
    assert got[10:110] == b"\x38" * 100 and got[200:205] == b"\xff" * 5
    assert got[250:253] == b"\xfe" * 3 and got[253:] == before[253:]
    assert b.view(10, 3).tolist() == [1.0] * 3 and b.view(250, 1).tolist() == [-448.0]
    e = ctx.buffer(64, "f8e5m2")
    e.fill(0.3)  # rounded to nearest: 0.3125
    assert e.tolist() == [0.3125] * 64 and bytes(e.to_host()) == bytes([float_to_fp8_bits(
        0.3, "f8e5m2")]) * 64
    e.fill(math.inf)  # satfinite: the largest finite value
    assert e.tolist() == [57344.0] * 64
    with pytest.raises(ValueError, match="2 bytes for f8e5m2"):
        e.fill(b"\x00\x00")
    b.close()
    e.close()


def test_numpy_arrays_are_uint8(ctx):
    np = pytest.importorskip("numpy")
    data = np.frombuffer(random_bits(96, 3), dtype=np.uint8).reshape(8, 12)
    b = ctx.from_host(data, dtype="f8e5m2")
    assert b.shape == (8, 12) and b.dtype is E5
    got = b.to_numpy()
    assert got.dtype == np.uint8 and got.shape == (8, 12) and (got == data).all()
    with pytest.raises(sc.TypeMismatchError, match="format 'e'"):
        b.copy_from_host(np.zeros(48, dtype=np.float16))
    b.close()


def test_copies_between_types_are_refused(ctx):
    a = ctx.from_host(random_bits(64, 4), dtype="f8e4m3", label="a")
    e = ctx.buffer(64, "f8e5m2", label="e")
    u = ctx.buffer(64, "u8", label="u")
    with pytest.raises(sc.TypeMismatchError) as info:
        e.copy_from(a)
    assert "f8e4m3" in info.value.message and "f8e5m2" in info.value.message
    with pytest.raises(sc.TypeMismatchError, match="u8"):
        u.copy_from(a)
    b = ctx.buffer(64, "f8e4m3")
    b.copy_from(a)
    assert bytes(b.to_host()) == bytes(a.to_host())
    for o in (a, e, u, b):
        o.close()


def test_dlpack(ctx):
    data = random_bits(128, 5)
    for d in (E4, E5):
        b = ctx.from_host(data, dtype=d, label="original")
        imp = sc.Buffer.from_dlpack(b.view(1, 120).reshape(10, 12), context=ctx)
        assert imp.dtype is d and imp.shape == (10, 12) and imp.device_ptr == b.device_ptr + 1
        assert bytes(imp.to_host().cast("B")) == data[1:121]
        imp.close()
        # As uint8 bits and back: dtype= takes the same bits as fp8.
        from safecuda._dlpack import retype_capsule
        raw = sc.Buffer.from_dlpack(retype_capsule(b.__dlpack__(max_version=(1, 1)), "u8"),
                                    context=ctx)
        assert raw.dtype is sc.DType.U8 and bytes(raw.to_host()) == data
        again = sc.Buffer.from_dlpack(raw, context=ctx, dtype=d)
        assert again.dtype is d and bytes(again.to_host()) == data
        assert again.device_ptr == b.device_ptr
        again.close()
        raw.close()
        b.close()


def test_dlpack_dtype_of_another_width_is_refused(ctx):
    from safecuda._dlpack import retype_capsule
    f = ctx.from_host(array.array("f", range(16)), label="floats")
    cap = f.__dlpack__(max_version=(1, 1))
    with pytest.raises(sc.TypeMismatchError) as info:
        sc.Buffer.from_dlpack(cap, context=ctx, dtype="f8e4m3")
    msg = info.value.message
    del info
    assert "dtype=f8e4m3 asked" in msg and "32 bits" in msg
    # The capsule was not consumed and its dtype is untouched: still f32.
    ok = sc.Buffer.from_dlpack(cap, context=ctx)
    assert ok.dtype is sc.DType.F32 and ok.tolist() == [float(i) for i in range(16)]
    ok.close()
    cap = f.__dlpack__(max_version=(1, 1))
    with pytest.raises(TypeError, match="32 bits x 1 lanes can't be taken as f8e4m3"):
        retype_capsule(cap, "f8e4m3")
    ok = sc.Buffer.from_dlpack(cap, context=ctx)
    assert ok.dtype is sc.DType.F32
    ok.close()
    f.close()


K4 = "_Z1kI13__nv_fp8_e4m3EvPKT_PS1_j"  # k<__nv_fp8_e4m3>(const T *, T *, unsigned)
K5 = "_Z1kI13__nv_fp8_e5m2EvPKT_PS1_j"


def entry(name):
    return (f".visible .entry {name}(\n    .param .u64 {name}_param_0,\n"
            f"    .param .u64 {name}_param_1,\n    .param .u32 {name}_param_2\n)\n"
            "{\n    ret;\n}\n")


PTX = ".version 8.0\n.target sm_90\n.address_size 64\n\n" + entry(K4) + entry(K5)


def test_launch_type_checks(ctx):
    mod = sc.Module(ctx, image=PTX)
    k4, k5 = mod.kernel(K4), mod.kernel(K5)
    assert k4.info().typed and k5.info().n_params == 3
    x4, y4 = ctx.buffer(256, "f8e4m3", label="x4"), ctx.buffer(256, "f8e4m3", label="y4")
    x5, u = ctx.buffer(256, "f8e5m2", label="x5"), ctx.buffer(256, "u8", label="raw")
    with pytest.raises(sc.TypeMismatchError) as info:
        k5.launch(1, 256, sc.In(x4), sc.Out(x5), sc.u32(256))
    assert ("argument 0: the kernel wants 'const __nv_fp8_e5m2*' but an in f8e4m3 view"
            in info.value.message)
    with pytest.raises(sc.TypeMismatchError, match=r"'__nv_fp8_e4m3\*' but an out f8e5m2"):
        k4.launch(1, 256, sc.In(x4), sc.Out(x5), sc.u32(256))
    with pytest.raises(sc.TypeMismatchError, match=r"'const __nv_fp8_e4m3\*' but an in u8"):
        k4.launch(1, 256, sc.In(u), sc.Out(y4), sc.u32(256))
    # The right types pass every check; the test device then refuses to pretend it ran.
    with pytest.raises(sc.NotSupportedError, match="test device"):
        k4.launch(1, 256, sc.In(x4), sc.Out(y4), sc.u32(256))
    for o in (x4, y4, x5, u, mod):
        o.close()
