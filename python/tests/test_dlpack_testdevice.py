"""DLPack and borrowed buffers on the test device (a child process with
SAFECUDA_DEVICE=test: device memory is host memory there, so the tests can also read it
directly). DLPack tensors are built by hand with ctypes: the deleter's calls are counted."""

import array
import ctypes
import gc
from ctypes import (CFUNCTYPE, POINTER, addressof, c_int64, c_void_p, py_object,
                    string_at)

import pytest

import safecuda as sc
from safecuda._lib import DLManagedTensor, DLManagedTensorVersioned, dl_versioned_deleter

pytestmark = pytest.mark.testdevice

api = ctypes.pythonapi
api.PyCapsule_New.restype = py_object
api.PyCapsule_New.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]
api.PyCapsule_GetName.restype = ctypes.c_char_p
api.PyCapsule_GetName.argtypes = [py_object]
api.PyCapsule_GetPointer.restype = c_void_p
api.PyCapsule_GetPointer.argtypes = [py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [py_object, ctypes.c_char_p]

kDLCPU, kDLCUDA, kDLCUDAManaged = 1, 2, 13
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool = 0, 1, 2, 4, 6


@pytest.fixture
def ctx():
    with sc.Context() as c:
        yield c


class HandMade:
    """A DLManagedTensorVersioned built with ctypes, its deleter counting its calls."""

    def __init__(self, data, shape, code=kDLFloat, bits=32, device=(kDLCUDA, 0),
                 version=(1, 1), strides=None, flags=0, byte_offset=0, lanes=1):
        self.calls = 0
        self.m = DLManagedTensorVersioned()
        m = self.m
        m.version.major, m.version.minor = version
        self.shape = (c_int64 * max(1, len(shape)))(*shape)
        self.strides = (c_int64 * len(strides))(*strides) if strides else None

        def deleter(p):
            self.calls += 1

        self.deleter = dl_versioned_deleter(deleter)
        m.deleter = self.deleter
        m.flags = flags
        t = m.dl_tensor
        t.data = data
        t.device.device_type, t.device.device_id = device
        t.ndim = len(shape)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
        t.shape = self.shape
        t.strides = self.strides
        t.byte_offset = byte_offset

    def capsule(self):
        """A capsule without a destructor: nothing but the consumer calls the deleter."""
        return api.PyCapsule_New(addressof(self.m), b"dltensor_versioned", None)


def name_of(capsule):
    return api.PyCapsule_GetName(capsule)


def device_memory(ctx, n=64, dtype="f32"):
    """A buffer of the test device and its address: memory that can be borrowed."""
    b = ctx.from_host(array.array("f", range(n)), dtype=dtype)
    return b, b.device_ptr


def test_import_and_deleter_exactly_once(ctx):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (4, 16))
    cap = t.capsule()
    b = sc.Buffer.from_dlpack(cap, context=ctx, label="hand made")
    assert name_of(cap) == b"used_dltensor_versioned"
    assert b.shape == (4, 16) and b.dtype is sc.DType.F32
    assert b.device_ptr == ptr
    o = b.origin()
    assert o.borrowed and not o.read_only
    assert b[1].tolist() == [float(i) for i in range(16, 32)]
    del cap
    gc.collect()
    assert t.calls == 0
    assert ctx.memory().borrowed_bytes == 256
    b.close()
    assert t.calls == 1
    b.close()
    gc.collect()
    assert t.calls == 1
    owner.close()


def test_deleter_once_when_the_context_goes(ctx):
    c2 = sc.Context()
    owner, ptr = device_memory(c2)
    t = HandMade(ptr, (64,))
    b = sc.Buffer.from_dlpack(t.capsule(), context=c2, label="left open")
    c2.close()  # reports the open buffers and frees them: the deleter runs once
    assert t.calls == 1
    del b, owner
    gc.collect()
    assert t.calls == 1


def test_cpu_tensor_refused(ctx):
    host = (ctypes.c_float * 16)()
    t = HandMade(addressof(host), (16,), device=(kDLCPU, 0))
    cap = t.capsule()
    with pytest.raises(sc.InvalidArgumentError) as info:
        sc.Buffer.from_dlpack(cap, context=ctx)
    msg = info.value.message
    assert msg.startswith("sc_buffer_from_dlpack")
    assert "CPU" in msg, msg
    assert name_of(cap) == b"dltensor_versioned"  # still the caller's
    assert t.calls == 0


def test_managed_tensor_refused(ctx):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (64,), device=(kDLCUDAManaged, 0))
    with pytest.raises(sc.InvalidArgumentError, match="sc_buffer_from_dlpack"):
        sc.Buffer.from_dlpack(t.capsule(), context=ctx)
    assert t.calls == 0
    owner.close()


@pytest.mark.parametrize("version", [(0, 8), (2, 0)])
def test_wrong_version_refused(ctx, version):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (64,), version=version)
    with pytest.raises(sc.SafecudaError) as info:
        sc.Buffer.from_dlpack(t.capsule(), context=ctx)
    assert f"DLPack {version[0]}.{version[1]} is not supported" in info.value.message
    assert t.calls == 0
    owner.close()


def test_non_contiguous_strides_refused(ctx):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (8, 8), strides=(1, 8))  # a transposed view
    with pytest.raises(sc.InvalidArgumentError) as info:
        sc.Buffer.from_dlpack(t.capsule(), context=ctx)
    assert "strides" in info.value.message or "contiguous" in info.value.message
    assert t.calls == 0
    # Extents of 1 may have any stride; compact strides given explicitly are fine.
    ok = HandMade(ptr, (8, 1, 8), strides=(8, 1234, 1))
    b = sc.Buffer.from_dlpack(ok.capsule(), context=ctx)
    assert b.shape == (8, 1, 8)
    b.close()
    assert ok.calls == 1
    owner.close()


def test_dtype_refused(ctx):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (64,), code=kDLBool, bits=8)
    with pytest.raises(sc.TypeMismatchError, match="sc_buffer_from_dlpack"):
        sc.Buffer.from_dlpack(t.capsule(), context=ctx)
    t2 = HandMade(ptr, (32,), lanes=2)
    with pytest.raises(sc.SafecudaError, match="lanes"):
        sc.Buffer.from_dlpack(t2.capsule(), context=ctx)
    assert t.calls == 0 and t2.calls == 0
    owner.close()


def test_dtype_taken_as_another_of_its_width(ctx):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (4, 16), code=kDLUInt, bits=8)
    b = sc.Buffer.from_dlpack(t.capsule(), context=ctx, dtype="f8e5m2")
    assert b.dtype is sc.DType.F8E5M2 and b.shape == (4, 16) and b.device_ptr == ptr
    assert bytes(b.to_host().cast("B")) == bytes(owner.to_host().cast("B"))[:64]
    b.close()
    assert t.calls == 1
    # Refused by the library (a CPU tensor): the producer's tensor keeps its own dtype.
    cpu = HandMade(ptr, (64,), code=kDLUInt, bits=8, device=(kDLCPU, 0))
    with pytest.raises(sc.InvalidArgumentError, match="kDLCPU"):
        sc.Buffer.from_dlpack(cpu.capsule(), context=ctx, dtype="f8e4m3")
    dt = cpu.m.dl_tensor.dtype
    assert (dt.code, dt.bits, dt.lanes) == (kDLUInt, 8, 1) and cpu.calls == 0
    # Another width: refused before the library sees it.
    wide = HandMade(ptr, (16,), code=kDLUInt, bits=16)
    with pytest.raises(sc.TypeMismatchError, match="16 bits x 1 lanes"):
        sc.Buffer.from_dlpack(wide.capsule(), context=ctx, dtype="f8e4m3")
    assert wide.calls == 0
    owner.close()


def test_read_only_flag(ctx):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (64,), flags=1)  # DLPACK_FLAG_BITMASK_READ_ONLY
    b = sc.Buffer.from_dlpack(t.capsule(), context=ctx)
    assert b.origin().read_only
    with pytest.raises(sc.InvalidArgumentError, match="read"):
        b.fill(0.0)
    out = ctx.buffer(64, "f32")
    out.copy_from(b)  # reading is fine
    assert out.tolist()[:3] == [0.0, 1.0, 2.0]
    b.close()
    out.close()
    owner.close()


def test_consumed_capsule_refused(ctx):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (64,))
    cap = t.capsule()
    sc.Buffer.from_dlpack(cap, context=ctx).close()
    with pytest.raises(BufferError, match="consumed"):
        sc.Buffer.from_dlpack(cap, context=ctx)
    assert t.calls == 1
    owner.close()


def test_legacy_capsule_import(ctx):
    """A producer that only speaks unversioned DLPack ("dltensor" capsules)."""
    owner, ptr = device_memory(ctx)
    calls = []
    m = DLManagedTensor()
    shape = (c_int64 * 1)(64)
    m.dl_tensor.data = ptr
    m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = kDLCUDA, 0
    m.dl_tensor.ndim = 1
    m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = kDLFloat, 32, 1
    m.dl_tensor.shape = shape
    deleter = CFUNCTYPE(None, POINTER(DLManagedTensor))(lambda p: calls.append(1))
    m.deleter = deleter
    cap = api.PyCapsule_New(addressof(m), b"dltensor", None)
    b = sc.Buffer.from_dlpack(cap, context=ctx)
    assert name_of(cap) == b"used_dltensor"
    assert b.tolist()[:2] == [0.0, 1.0]
    assert calls == []
    b.close()
    assert calls == [1]
    owner.close()


class Producer:
    """An object with the protocol's two methods, recording what it was asked."""

    def __init__(self, tensor, device=(kDLCUDA, 0), versioned=True):
        self.tensor, self.device, self.versioned = tensor, device, versioned
        self.asked = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None):
        self.asked.append((stream, max_version))
        if not self.versioned and max_version is not None:
            raise TypeError("unexpected keyword argument 'max_version'")
        return self.tensor.capsule()


def test_protocol_objects(ctx):
    owner, ptr = device_memory(ctx)
    t = HandMade(ptr, (2, 32))
    p = Producer(t)
    s = ctx.stream(label="consumer")
    b = sc.Buffer.from_dlpack(p, context=ctx, stream=s)
    assert p.asked == [(s.cu_handle, (1, 1))]  # ordered before the consumer's stream
    assert b.shape == (2, 32)
    b.close()
    assert t.calls == 1
    # Without a stream: the context's default stream is the one the producer orders on.
    t2 = HandMade(ptr, (64,))
    p2 = Producer(t2)
    sc.Buffer.from_dlpack(p2, context=ctx).close()
    assert p2.asked == [(ctx.default_stream.cu_handle or 1, (1, 1))]
    # A CPU producer is asked without a stream and refused by the library.
    host = (ctypes.c_float * 4)()
    t3 = HandMade(addressof(host), (4,), device=(kDLCPU, 0))
    p3 = Producer(t3, device=(kDLCPU, 0))
    with pytest.raises(sc.InvalidArgumentError, match="CPU"):
        sc.Buffer.from_dlpack(p3, context=ctx)
    assert p3.asked == [(None, (1, 1))]
    with pytest.raises(sc.InvalidArgumentError, match="kDLCPU"):
        sc.Buffer.from_dlpack(p3)  # no context to ask: refused before
    assert t3.calls == 0
    with pytest.raises(TypeError, match="no __dlpack__"):
        sc.Buffer.from_dlpack(object(), context=ctx)
    s.close()
    owner.close()


# ---- export ------------------------------------------------------------------------------


def tensor_of(capsule, name=b"dltensor_versioned"):
    return DLManagedTensorVersioned.from_address(api.PyCapsule_GetPointer(capsule, name))


def consume(capsule):
    """What a consumer does when it is done: rename, then call the deleter once."""
    p = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    api.PyCapsule_SetName(capsule, b"used_dltensor_versioned")
    m = DLManagedTensorVersioned.from_address(p)
    m.deleter(ctypes.cast(p, POINTER(DLManagedTensorVersioned)))


def test_export_fields(ctx):
    b = ctx.from_host(array.array("f", range(24)), shape=(2, 3, 4), label="exported")
    assert b.__dlpack_device__() == (kDLCUDA, 0)
    cap = b.__dlpack__(max_version=(1, 1))
    assert name_of(cap) == b"dltensor_versioned"
    m = tensor_of(cap)
    assert m.version.major == 1 and m.version.minor >= 0
    t = m.dl_tensor
    assert (t.device.device_type, t.device.device_id) == (kDLCUDA, 0)
    assert t.ndim == 3 and [t.shape[i] for i in range(3)] == [2, 3, 4]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (kDLFloat, 32, 1)
    assert t.data + t.byte_offset == b.device_ptr
    assert not (m.flags & 1)
    assert b.origin().exports == 1
    consume(cap)
    assert b.origin().exports == 0
    # A sub-view: its own address and shape.
    v = b[1]
    cap = v.__dlpack__(max_version=(1, 0))
    t = tensor_of(cap).dl_tensor
    assert t.data + t.byte_offset == b.device_ptr + 12 * 4
    assert [t.shape[i] for i in range(t.ndim)] == [3, 4]
    del cap
    gc.collect()
    assert b.origin().exports == 0  # the unconsumed capsule's destructor deleted it
    b.close()


def test_export_outlives_the_buffer(ctx):
    b = ctx.from_host(array.array("i", range(16)), label="short lived")
    cap = b.__dlpack__(max_version=(1, 1))
    t = tensor_of(cap).dl_tensor
    addr = t.data + t.byte_offset
    b.close()
    with pytest.raises(sc.StaleHandleError):
        b.origin()
    # The memory stays until the deleter (the test device's memory is host memory).
    assert array.array("i", string_at(addr, 64)).tolist() == list(range(16))
    consume(cap)


def test_export_legacy_when_no_version_asked(ctx):
    b = ctx.from_host(array.array("f", range(8)))
    cap = b.__dlpack__()
    assert name_of(cap) == b"dltensor"
    m = DLManagedTensor.from_address(api.PyCapsule_GetPointer(cap, b"dltensor"))
    assert m.dl_tensor.data + m.dl_tensor.byte_offset == b.device_ptr
    assert b.origin().exports == 1
    del cap, m
    gc.collect()
    assert b.origin().exports == 0
    b.close()


def test_export_streams_and_options(ctx):
    b = ctx.from_host(array.array("f", range(8)))
    s = ctx.stream()
    for stream in (None, -1, s.cu_handle, s):
        cap = b.__dlpack__(stream=stream, max_version=(1, 1))
        consume(cap)
    assert s.cu_handle in ctx._wrapped  # an int stream is wrapped once, then reused
    with pytest.raises(BufferError, match="copy"):
        b.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="dl_device"):
        b.__dlpack__(dl_device=(kDLCPU, 0))
    cap = b.__dlpack__(dl_device=(kDLCUDA, 0), copy=False, max_version=(1, 1))
    consume(cap)
    assert b.origin().exports == 0
    s.close()
    b.close()


def test_zero_copy_round_trip(ctx):
    a = ctx.from_host(array.array("f", range(32)), shape=(4, 8), label="a")
    b = sc.Buffer.from_dlpack(a, context=ctx)
    assert b.device_ptr == a.device_ptr and b.shape == (4, 8)
    assert a.origin().exports == 1 and b.origin().borrowed
    a.close()  # the export keeps the memory: b still reads it
    assert b[3].tolist() == [float(i) for i in range(24, 32)]
    b.close()


def test_borrow_raw_address(ctx):
    owner, ptr = device_memory(ctx)
    released = []
    b = sc.Buffer.borrow(ctx, ptr + 16 * 4, 16, "f32", shape=(4, 4), label="raw",
                         release=lambda: released.append(1))
    assert b.tolist()[0] == [16.0, 17.0, 18.0, 19.0]
    b.close()
    assert released == [1]
    with pytest.raises(sc.InvalidArgumentError):
        sc.Buffer.borrow(ctx, ptr + 2, 4, "f32")  # misaligned
    with pytest.raises(sc.OutOfBoundsError):
        sc.Buffer.borrow(ctx, ptr, 65, "f32")  # past the allocation
    with pytest.raises(sc.InvalidArgumentError):
        sc.Buffer.borrow(ctx, 0, 4, "f32")
    assert released == [1]
    owner.close()


def test_wrapped_streams(ctx):
    s = ctx.stream(label="own")
    assert not s.is_wrapped
    w = ctx.wrap_stream(s.cu_handle)
    assert w.is_wrapped and w.cu_handle == s.cu_handle
    assert ctx.wrap_stream(s.cu_handle) is w  # cached per context and CUstream
    b = ctx.buffer(16, "f32")
    b.fill(3.0, stream=w)
    w.synchronize()
    assert b.tolist() == [3.0] * 16
    with pytest.raises(sc.InvalidArgumentError):
        sc.Stream._adopt(ctx, 0, "zero", owned=False).cu_handle
    b.close()
    s.close()


def test_dtype_codes():
    lib = sc._lib.lib
    out = sc._lib.DLDataType()
    assert lib.sc_dtype_to_dlpack(int(sc.DType.BF16), ctypes.byref(out)) == 0
    assert (out.code, out.bits, out.lanes) == (kDLBfloat, 16, 1)
    d = ctypes.c_int()
    assert lib.sc_dtype_from_dlpack(sc._lib.DLDataType(kDLInt, 64, 1), ctypes.byref(d)) == 0
    assert d.value == int(sc.DType.I64)
    assert lib.sc_dtype_from_dlpack(sc._lib.DLDataType(kDLBool, 8, 1), ctypes.byref(d)) == \
        int(sc.Status.SC_ERR_TYPE_MISMATCH)

