"""The Python API on the test device (SAFECUDA_DEVICE=test, in a child process: see
conftest.py): host memory stands in for device memory, kernels never run. What is checked
here is the binding: data round trips, views, errors and their messages, lifetimes."""

import array
import gc
import struct

import pytest

import safecuda as sc

pytestmark = pytest.mark.testdevice


@pytest.fixture
def ctx():
    with sc.Context() as c:
        yield c


@pytest.fixture
def log():
    """The library's and the package's log lines while the test runs."""
    lines = []
    sc.set_log_callback(lambda level, msg: lines.append((level, msg)))
    yield lines
    sc.set_log_callback(None)


def test_runs_on_the_test_device():
    assert "libsafecuda_testdevice.so" in sc.driver_path()
    assert sc.device_count() >= 1
    assert "test device" in sc.device_info(0).name


def test_round_trips(ctx):
    data = array.array("f", [i * 0.5 for i in range(12)])
    b = ctx.from_host(data, shape=(3, 4), label="x")
    assert b.shape == (3, 4) and b.dtype is sc.DType.F32 and b.nbytes == 48
    assert b.to_host().tolist() == [[i * 0.5 + 2 * j for i in range(4)] for j in range(3)]
    # into a given host object, of several kinds
    out = array.array("f", bytes(48))
    assert b.to_host(out) is out and out == data
    ba = bytearray(48)
    b.to_host(ba)
    assert bytes(ba) == data.tobytes()
    mv = memoryview(bytearray(48)).cast("f")
    b.to_host(mv)
    assert mv.tolist() == data.tolist()
    # from bytes, a read-only memoryview and a bytearray (raw bytes go anywhere)
    b.copy_from_host(bytes(48))
    assert b.tolist() == [[0.0] * 4] * 3
    b.copy_from_host(memoryview(data.tobytes()))
    assert b.to_host().cast("B").cast("f").tolist() == data.tolist()
    b.copy_from_host(bytearray(data.tobytes()))
    assert b[2].tolist() == [4.0, 4.5, 5.0, 5.5]
    b.close()


def test_numpy_round_trip(ctx):
    np = pytest.importorskip("numpy")
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    b = ctx.from_host(a)
    assert b.shape == (2, 3, 4) and b.dtype is sc.DType.I32
    assert (b.to_numpy() == a).all()
    assert (b[1].to_numpy() == a[1]).all()
    b.copy_from_host(a * 2)
    assert (np.asarray(b.to_host()) == a * 2).all()
    with pytest.raises(sc.TypeMismatchError, match="format 'd'"):
        b.copy_from_host(a.astype(np.float64))
    with pytest.raises(ValueError, match="not C-contiguous"):
        b.copy_from_host(a.transpose(2, 1, 0).astype(np.int32))
    h = ctx.buffer((2, 2), "bf16")
    h.fill(1.5)
    assert (h.to_numpy() == 0x3FC0).all()  # bf16 comes back as 16-bit patterns
    assert h.tolist() == [[1.5, 1.5], [1.5, 1.5]]
    b.close()
    h.close()


def test_views_and_slices(ctx):
    b = ctx.from_host(array.array("i", range(20)), shape=(5, 4), label="grid")
    v = b[1:3]
    assert v.shape == (2, 4) and v.offset == 4 and v.count == 8
    assert v.tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert b[-1].tolist() == [16, 17, 18, 19]
    assert b[3][1:3].tolist() == [13, 14]
    v.fill(-1)
    assert b[1:3].tolist() == [[-1] * 4] * 2 and b[0].tolist() == [0, 1, 2, 3]
    assert b.view(2, 3).tolist() == [2, 3, -1]
    assert b.reshape(20)[18:].tolist() == [18, 19]
    assert b.reshape(-1, 10).shape == (2, 10)
    with pytest.raises(ValueError, match="step"):
        b[::2]
    with pytest.raises(IndexError):
        b[5]
    with pytest.raises(sc.OutOfBoundsError) as info:
        b.view(18, 4)
    assert isinstance(info.value, IndexError)
    assert "sc_view_sub" in info.value.message
    with pytest.raises(sc.OverflowError):
        b.view(3, (1 << 64) - 2)
    # copies between views
    c = ctx.buffer(4, "i32", label="row copy")
    c.copy_from(b[4])
    assert c.tolist() == [16, 17, 18, 19]
    with pytest.raises(sc.InvalidArgumentError, match="overlap"):
        b[0:2].view(0, 4).copy_from(b.view(2, 4))
    c.close()
    b.close()


def test_stale_handle_names_the_creation_site(ctx):
    b = ctx.buffer(16, "f32", label="gone")
    line = b._site[1]
    v = b[2:6]
    b.close()
    b.close()  # close is idempotent
    with pytest.raises(sc.StaleHandleError) as info:
        v.tolist()
    e = info.value
    assert e.status == sc.Status.SC_ERR_STALE_HANDLE
    assert e.message == (f"sc_copy_to_host: stale buffer handle: the buffer created at "
                         f"test_testdevice.py:{line} was destroyed (src)")


def test_double_destroy(ctx):
    b = ctx.buffer(4, "u8")
    line = b._site[1]
    b.destroy()
    with pytest.raises(sc.StaleHandleError, match=f"sc_buffer_destroy: stale buffer handle: "
                                                  f"the buffer created at "
                                                  f"test_testdevice.py:{line} was destroyed"):
        b.destroy()
    s = ctx.stream(label="twice")
    s.destroy()
    with pytest.raises(sc.StaleHandleError, match="sc_stream_destroy"):
        s.destroy()


def test_wrong_dtype(ctx):
    f = ctx.buffer(8, "f32", label="floats")
    i = ctx.buffer(8, "i32", label="ints")
    with pytest.raises(sc.TypeMismatchError) as info:
        i.copy_from(f)
    assert isinstance(info.value, TypeError)
    assert info.value.message.startswith("sc_copy: dst is i32 (buffer 'ints' of 8 i32 ")
    with pytest.raises(sc.TypeMismatchError, match="host elements of format 'd'"):
        f.copy_from_host(array.array("d", range(8)))
    with pytest.raises(sc.TypeMismatchError, match="format 'f'"):
        i.copy_from_host(array.array("f", range(8)))
    with pytest.raises(sc.OutOfBoundsError, match="sc_copy_from_host"):
        f.copy_from_host(array.array("f", range(7)))
    with pytest.raises(TypeError, match="expected host memory"):
        f.copy_from_host([1.0] * 8)
    f.close()
    i.close()


def test_copy_from_and_fill_refuse_what_they_do_not_take(ctx):
    """copy_from takes a View or Buffer (device to device): host memory is pointed at
    copy_from_host, anything else named; fill takes a number or one element's bytes."""
    b = ctx.buffer(4, "f32", label="b")
    for host in (array.array("f", [1.0] * 4), bytearray(16), memoryview(bytes(16))):
        with pytest.raises(TypeError) as info:
            b.copy_from(host)
        msg = str(info.value)
        assert msg.startswith("copy_from: src is a " + type(host).__name__ + " (host memory)")
        assert "a safecuda View or Buffer" in msg and "copy_from_host" in msg
        assert not isinstance(info.value, AttributeError)
    for other in (None, 3, "x", [1.0] * 4):
        with pytest.raises(TypeError) as info:
            b.copy_from(other)
        msg = str(info.value)
        assert msg.startswith(f"copy_from: src is {type(other).__name__}")
        assert "a safecuda View or Buffer (a device-to-device copy)" in msg
    for value in ("x", None, [1.0], object()):
        with pytest.raises(TypeError) as info:
            b.fill(value)
        msg = str(info.value)
        assert msg.startswith(f"fill: value is {type(value).__name__}")
        assert "a number (int or float) or the bytes of one f32 element (4 bytes)" in msg
    i = ctx.buffer(4, "i32")
    with pytest.raises(TypeError, match=r"fill: value 1\.5 is a float; i32 elements take an int"):
        i.fill(1.5)
    u = ctx.buffer(4, "u8")
    with pytest.raises(ValueError, match=r"fill: value 300 is outside u8's range 0 \.\. 255"):
        u.fill(300)
    with pytest.raises(ValueError, match=r"fill: value -1 is outside u8's range 0 \.\. 255"):
        u.fill(-1)
    with pytest.raises(ValueError, match=r"fill: value 1e\+40 is outside f32's range"):
        b.fill(1e40)
    # what is accepted still works
    b.fill(2)
    b.fill(2.5)
    i.fill(True)
    assert b.tolist() == [2.5] * 4 and i.tolist() == [1] * 4
    b.copy_from(ctx.from_host(array.array("f", [3.0] * 4)))
    assert b.tolist() == [3.0] * 4
    for x in (b, i, u):
        x.close()


def test_unlabelled_buffer_named_alike(ctx):
    """An unlabelled buffer reads the same in the library's messages and the package's:
    buffer '' (with its size and creation site from the library)."""
    f = ctx.buffer(8, "f32")
    i = ctx.buffer(8, "i32")
    with pytest.raises(sc.TypeMismatchError) as info:
        i.copy_from(f)
    assert "buffer '' of 8 i32" in info.value.message
    with pytest.raises(sc.TypeMismatchError) as info:
        f.copy_from_host(array.array("d", range(8)))
    assert "of buffer '' of f32" in info.value.message
    assert "no label" not in info.value.message
    f.close()
    i.close()


def test_context_close_reports_and_frees_open_objects(log):
    ctx = sc.Context()
    b = ctx.buffer(10, "f64", label="still open")
    line = b._site[1]
    ctx.close()
    text = "\n".join(m for _, m in log)
    assert "sc_context_destroy: context on device 0 (created at test_testdevice.py:" in text
    assert f"buffer 'still open' 10 x f64, 80 bytes, created at test_testdevice.py:{line}" \
        in text
    with pytest.raises(sc.StaleHandleError):
        b.tolist()
    b.close()  # nothing left to do: the context freed it
    with pytest.raises(sc.LeakedError):
        c2 = sc.Context()
        keep = c2.buffer(1, "u8")
        c2.destroy()
    del keep


def test_garbage_collection_reports_a_leak(log):
    ctx = sc.Context()
    b = ctx.buffer(3, "u16", label="dropped")
    line = b._site[1]
    del b
    gc.collect()
    assert (2, f"garbage collector: buffer 'dropped' 3 x u16 created at "
               f"{__file__}:{line} was not closed; destroyed now (close it, or use `with`)") \
        in log
    assert ctx.memory().live_buffers == 0
    ctx.close()
    assert not any("live object" in m for _, m in log)


def test_with_blocks_close(ctx):
    with ctx.buffer(4, "f32") as b, ctx.stream() as s, ctx.event() as e:
        b.fill(2.0, stream=s)
        e.record(s)
        e.synchronize()
        assert s.query() and e.query()
    assert b.closed and s.closed and e.closed
    assert ctx.memory().live_buffers == 0
    assert ctx.live_objects() == []


def test_streams_events_memory(ctx):
    s = ctx.stream(priority=-1, label="hi")
    assert isinstance(s.priority, int)
    b = ctx.buffer(1024, "f32", zero=True, stream=s)
    s.synchronize()
    assert b.tolist()[:3] == [0.0, 0.0, 0.0]
    t0, t1 = ctx.event(timing=True), ctx.event(timing=True)
    t0.record(s)
    b.fill(1.0, stream=s)
    t1.record(s)
    t1.synchronize()
    assert t0.elapsed_ms(t1) >= 0.0
    m = ctx.memory()
    assert m.live_buffers == 1 and m.bytes_in_use >= 4096
    names = sorted(o.kind for o in ctx.live_objects())
    assert names == ["buffer", "event", "event", "stream"]
    ctx.default_stream.synchronize()
    ctx.synchronize()
    ctx.check()
    for o in (b, s, t0, t1):
        o.close()


def test_budget(ctx):
    with sc.Context(vram_budget=1 << 20) as small:
        with pytest.raises(sc.BudgetExceededError, match="budget"):
            small.buffer(1 << 20, "f32")


def test_kernel_launch_checks(ctx, nvrtc):
    src = r"""
    template <typename T>
    __global__ void scale(const T *x, T *y, T a, unsigned n) {
        unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i];
    }
    """
    prog = ctx.compile(src, name="scale.cu", name_expressions=["scale<float>"], ptx=True)
    assert prog.image.lstrip().startswith(b"//")  # PTX (the test device loads only PTX)
    mod = prog.load()
    k = mod.kernel("scale<float>")
    assert k.info().n_params == 4
    x = ctx.buffer(256, "f32", label="x")
    y = ctx.buffer(256, "f32", label="y")
    yi = ctx.buffer(256, "i32", label="y ints")
    with pytest.raises(sc.TypeMismatchError) as info:
        k.launch(1, 256, sc.In(x), sc.Out(yi), sc.f32(2.0), sc.u32(256))
    assert "argument 1" in info.value.message
    with pytest.raises(sc.TypeMismatchError, match="argument 2"):
        k.launch(1, 256, sc.In(x), sc.Out(y), sc.i32(2), sc.u32(256))
    with pytest.raises(sc.LaunchError, match="argument"):
        k.launch(1, 256, sc.In(x), sc.Out(y), sc.f32(2.0))
    with pytest.raises(sc.TypeMismatchError, match="const"):
        k.launch(1, 256, sc.Out(x), sc.Out(y), sc.f32(2.0), sc.u32(256))
    with pytest.raises(TypeError, match="is not a kernel argument"):
        k.launch(1, 256, sc.In(x), sc.Out(y), 2.0, sc.u32(256))
    with pytest.raises(sc.LaunchError, match="block"):
        k.launch(1, 1 << 20, sc.In(x), sc.Out(y), sc.f32(2.0), sc.u32(256))
    # Everything checks out: the test device then refuses to pretend it ran.
    with pytest.raises(sc.NotSupportedError, match="test device"):
        k.launch(1, 256, sc.In(x), sc.Out(y), sc.f32(2.0), sc.u32(256))
    with pytest.raises(sc.CompileError) as info:
        ctx.compile("__global__ void broken( {", ptx=True)
    assert "program.cu(" in info.value.message
    for o in (x, y, yi, mod, prog):
        o.close()


def test_moe_checks_its_weights(ctx):
    E, H, I_ = 4, 64, 32
    router = ctx.buffer((E, H), "bf16", label="router")
    w13 = ctx.buffer((E, 2 * I_, H), "bf16", label="w13")
    w2 = ctx.buffer((E, H, I_), "f32", label="w2 f32")
    with pytest.raises(sc.TypeMismatchError, match="w2"):
        sc.MoE(ctx, router, w13, w2, top_k=2)
    w2b = ctx.buffer((E, H, I_), "bf16", label="w2")
    with pytest.raises(sc.InvalidArgumentError, match="top_k"):
        sc.MoE(ctx, router, w13, w2b, top_k=E + 1)
    with pytest.raises(ValueError, match="scoring"):
        sc.MoE(ctx, router, w13, w2b, top_k=2, scoring="relu")
    for o in (router, w13, w2, w2b):
        o.close()


def test_struct_bytes_argument():
    a = sc.Bytes(struct.pack("dd", 1.0, 2.0))
    assert a._c.size == 16 and repr(a) == "Bytes(16 bytes)"


TMAP_PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry boxes(
    .param .align 64 .b8 boxes_param_0[128],
    .param .u64 boxes_param_1
)
{
    ret;
}
"""


def test_tensor_maps(ctx):
    x = ctx.buffer(4 * 16 * 80, "bf16", label="x")
    # x[4][16][64] with rows padded to 80: dims innermost first, strides in elements.
    m = sc.TensorMap(x, dims=(64, 16, 4), box=(64, 8, 2), strides=(1, 80, 0), swizzle=128)
    assert m.rank == 3 and m.dims == (64, 16, 4) and m.box == (64, 8, 2)
    assert m.address != 0 and len(m.encoded) == 128 and m.view is x
    assert "TensorMap dims=(64, 16, 4)" in repr(m)
    # Every option, rank 5, bytes; a view that starts 16 bytes in.
    f8 = ctx.buffer(4096, "u8", label="bytes")
    sc.TensorMap(f8[16:], dims=(64, 2, 2, 2, 2), box=(32, 2, 1, 2, 2),
                 element_strides=(1, 2, 1, 1, 1), swizzle=32, l2_promotion=64)
    f = ctx.buffer(1024, "f32", label="f")
    sc.TensorMap(f, dims=(1000,), box=(16,), oob_fill="nan", l2_promotion="none")
    # The library's checks, named.
    with pytest.raises(sc.InvalidArgumentError, match=r"strides\[1\] = 32 elements overlaps"):
        sc.TensorMap(x, dims=(64, 16), box=(64, 8), strides=(1, 32))
    with pytest.raises(sc.InvalidArgumentError, match=r"box\[0\] = 128 bf16 is 256 bytes"):
        sc.TensorMap(x, dims=(128, 8), box=(128, 8), swizzle=128)
    with pytest.raises(sc.InvalidArgumentError, match="u8 is copied as integer bits"):
        sc.TensorMap(f8, dims=(64,), box=(16,), oob_fill="nan")
    # The last element: 63 + 15 x 80 + 3 x 1280 = 5103.
    with pytest.raises(sc.InvalidArgumentError, match="last element is element 5103 of the "
                                                      "view, which holds 5103"):
        sc.TensorMap(x[:5103], dims=(64, 16, 4), box=(64, 8, 2), strides=(1, 80, 0))
    sc.TensorMap(x[:5104], dims=(64, 16, 4), box=(64, 8, 2), strides=(1, 80, 0))
    # The package's own: the number of values and their range, the option names.
    with pytest.raises(ValueError, match="1 .. 5"):
        sc.TensorMap(x, dims=(2,) * 6, box=(8,) * 6)
    with pytest.raises(ValueError, match="box has 1 values for 2 dimensions"):
        sc.TensorMap(x, dims=(64, 16), box=(64,))
    with pytest.raises(ValueError, match=r"dims\[1\] = -1"):
        sc.TensorMap(x, dims=(64, -1), box=(64, 8))
    with pytest.raises(ValueError, match="swizzle=96"):
        sc.TensorMap(x, dims=(64,), box=(64,), swizzle=96)
    with pytest.raises(TypeError, match="Buffer or View"):
        sc.TensorMap("x", dims=(64,), box=(64,))
    with pytest.raises(TypeError, match="TensorMap"):
        sc.TensorMapIn(x)
    # Launches: the map is a 128-byte parameter, checked like its view.
    mod = ctx.load_module(image=TMAP_PTX)
    k = mod.kernel("boxes")
    out = ctx.buffer(64, "u8", label="out")
    assert repr(sc.TensorMapIn(m)).startswith("TensorMapIn(<safecuda.TensorMap")
    with pytest.raises(sc.LaunchError, match="argument 0"):
        k.launch(1, 128, sc.In(x), sc.Out(out))
    with pytest.raises(sc.NotSupportedError, match="test device"):  # every check passed
        k.launch(1, 128, sc.TensorMapIn(m), sc.Out(out))
    with pytest.raises(sc.NotSupportedError, match="test device"):
        k.launch(1, 128, sc.TensorMapOut(m), sc.Out(out))
    x.close()
    with pytest.raises(sc.StaleHandleError):
        k.launch(1, 128, sc.TensorMapIn(m), sc.Out(out))
    for o in (f8, f, out, mod):
        o.close()
