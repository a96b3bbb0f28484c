"""DLPack both ways, borrowed buffers.

Export (View.__dlpack__): sc_view_to_dlpack gives a DLManagedTensorVersioned; it goes to
the consumer in a capsule named "dltensor_versioned" (or, for a consumer that asks for no
version, a DLManagedTensor in a capsule named "dltensor"). A consumer renames the capsule
"used_..." and calls the deleter itself; a capsule never consumed calls it when it is
freed.

Import (Buffer.from_dlpack): the producer's capsule is handed to sc_buffer_from_dlpack; on
success the capsule is renamed "used_dltensor_versioned" and the buffer owns the tensor
(its deleter runs once, when the buffer goes). A producer that only gives the unversioned
"dltensor" capsule is wrapped in a versioned struct whose deleter calls the original's.
With dtype= the tensor's elements are taken as that dtype of the same width (the fp8 bits
of a producer whose DLPack has no fp8 codes, exported as uint8).

retype_capsule changes the element type a capsule of ours announces (the fp8 view handed
to a consumer as uint8 bits: safecuda.torch.as_tensor).

The capsule destructors and deleters written here are ctypes callbacks that are never
freed (a capsule or a buffer may outlive this module's globals at exit); they call into
Python's C API through plain function pointers, without touching Python's error state.
"""

import ctypes
import itertools
from ctypes import (CFUNCTYPE, POINTER, byref, c_char_p, c_int, c_uint64, c_void_p, cast,
                    py_object, sizeof, string_at)

from . import _lib
from ._core import _check, _Resource, _stream_handle, default_context
from ._dtype import DType, as_dtype
from ._lib import (DLDataType, DLManagedTensor, DLManagedTensorVersioned, DLTensor, fail,
                   intern_c_string, kDLCUDA, label_bytes, lib, sc_borrow_desc,
                   sc_buffer_props, sc_dlpack_export_desc, sc_dlpack_import_desc)

_api = ctypes.pythonapi
_libc = ctypes.CDLL(None)


def _prototype(fn, restype, *argtypes):
    """fn with its C signature set (ctypes converts and checks the arguments)."""
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_malloc = _prototype(_libc.calloc, c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_free = _prototype(_libc.free, None, c_void_p)

# Capsule names live as long as the process (a capsule may be freed at any time).
NAME_VERSIONED = intern_c_string("dltensor_versioned")
NAME_USED_VERSIONED = intern_c_string("used_dltensor_versioned")
NAME_LEGACY = intern_c_string("dltensor")
NAME_USED_LEGACY = intern_c_string("used_dltensor")

_capsule_new = _prototype(_api.PyCapsule_New, py_object, c_void_p, c_void_p, c_void_p)
_capsule_get_pointer = _prototype(_api.PyCapsule_GetPointer, c_void_p, py_object, c_char_p)
_capsule_get_name = _prototype(_api.PyCapsule_GetName, c_char_p, py_object)
_capsule_set_name = _prototype(_api.PyCapsule_SetName, c_int, py_object, c_void_p)
_incref = _prototype(_api.Py_IncRef, None, py_object)

# Plain function pointers (no GIL bookkeeping, no error check) for use in destructors.
_raw_is_valid = CFUNCTYPE(c_int, c_void_p, c_void_p)(
    cast(_api.PyCapsule_IsValid, c_void_p).value)
_raw_get_pointer = CFUNCTYPE(c_void_p, c_void_p, c_void_p)(
    cast(_api.PyCapsule_GetPointer, c_void_p).value)
_call_deleter = CFUNCTYPE(None, c_void_p)  # void deleter(void *tensor)

_VERSIONED_DELETER_AT = DLManagedTensorVersioned.deleter.offset
_LEGACY_DELETER_AT = DLManagedTensor.deleter.offset
_LEGACY_CTX_AT = DLManagedTensor.manager_ctx.offset
_VERSIONED_CTX_AT = DLManagedTensorVersioned.manager_ctx.offset

_immortal = []


def _keep_forever(fn):
    _immortal.append(fn)
    _incref(py_object(fn))  # never freed, even when this module's globals are cleared
    return fn


def _make_capsule_destructor(name, deleter_at):
    def destructor(capsule, _valid=_raw_is_valid, _get=_raw_get_pointer, _name=name,
                   _at=deleter_at, _proto=_call_deleter, _vp=c_void_p):
        # Called while the capsule is freed: if no consumer took it (its name is still
        # ours), the tensor is ours to delete.
        if capsule and _valid(capsule, _name):
            p = _get(capsule, _name)
            if p:
                fn = _vp.from_address(p + _at).value
                if fn:
                    _proto(fn)(p)
    return _keep_forever(CFUNCTYPE(None, c_void_p)(destructor))


_versioned_capsule_destructor = _make_capsule_destructor(NAME_VERSIONED, _VERSIONED_DELETER_AT)
_legacy_capsule_destructor = _make_capsule_destructor(NAME_LEGACY, _LEGACY_DELETER_AT)
_VERSIONED_DESTRUCTOR = cast(_versioned_capsule_destructor, c_void_p).value
_LEGACY_DESTRUCTOR = cast(_legacy_capsule_destructor, c_void_p).value


def _wrapping_deleter(ctx_at, deleter_at, doc):
    """A deleter of a DLPack struct made around another one (its manager_ctx at ctx_at):
    calls the inner struct's deleter (at deleter_at), then frees the outer struct. What it
    uses is bound as default arguments, so it still runs while the interpreter exits."""
    def deleter(p, _vp=c_void_p, _proto=_call_deleter, _ctx=ctx_at, _at=deleter_at,
                _release=_free):
        if not p:
            return
        inner = _vp.from_address(p + _ctx).value
        if inner:
            fn = _vp.from_address(inner + _at).value
            if fn:
                _proto(fn)(inner)
        _release(p)
    deleter.__doc__ = doc
    return deleter


_legacy_export_deleter = _wrapping_deleter(
    _LEGACY_CTX_AT, _VERSIONED_DELETER_AT,
    "deleter of a DLManagedTensor made for a consumer without versioned DLPack: calls the "
    "versioned tensor's deleter, then frees the legacy struct.")
_legacy_import_deleter = _wrapping_deleter(
    _VERSIONED_CTX_AT, _LEGACY_DELETER_AT,
    "deleter of the versioned struct wrapped around a producer's DLManagedTensor.")


_legacy_export_deleter_c = _keep_forever(CFUNCTYPE(None, c_void_p)(_legacy_export_deleter))
_legacy_import_deleter_c = _keep_forever(CFUNCTYPE(None, c_void_p)(_legacy_import_deleter))
_LEGACY_EXPORT_DELETER = cast(_legacy_export_deleter_c, c_void_p).value
_LEGACY_IMPORT_DELETER = cast(_legacy_import_deleter_c, c_void_p).value


# ---- export ---------------------------------------------------------------------------------


def export_view(view, *, stream=None, max_version=None, dl_device=None, copy=None):
    """View.__dlpack__ (the Python array API's protocol). stream: None = the host waits
    for safecuda's pending work on the buffer before the capsule is returned; -1 = no
    synchronization; an int = that CUstream (wrapped) is made to wait for it; a
    safecuda.Stream is taken as is."""
    buf = view.buffer
    ctx = buf._ctx
    if copy:
        raise BufferError("safecuda.View.__dlpack__: copy=True asked, but safecuda exports its "
                          "memory without copying")
    if dl_device is not None:
        want = (int(dl_device[0]), int(dl_device[1]))
        if want != (kDLCUDA, ctx.device):
            raise BufferError(f"safecuda.View.__dlpack__: dl_device {want} asked; the buffer "
                              f"is on (kDLCUDA={kDLCUDA}, {ctx.device}) and can't be copied "
                              f"there")
    desc = sc_dlpack_export_desc()
    shape = view.shape
    if len(shape) > _lib.SC_DLPACK_MAX_DIMS:
        raise BufferError(f"safecuda.View.__dlpack__: {len(shape)} dimensions; DLPack export "
                          f"takes at most {_lib.SC_DLPACK_MAX_DIMS}")
    desc.ndim = len(shape)
    for i, s in enumerate(shape):
        desc.shape[i] = s
    if stream is None:
        pass
    elif isinstance(stream, _Resource):
        desc.stream = stream._h
    elif int(stream) == -1:
        desc.no_sync = True
    else:
        desc.stream = ctx.wrap_stream(int(stream))._h
    t = POINTER(DLManagedTensorVersioned)()
    file, line = _lib.caller_site()
    _check(lib.sc_view_to_dlpack_at(view._sv, byref(desc), byref(t), file, line))
    addr = cast(t, c_void_p).value
    try:
        if max_version is None or int(max_version[0]) < 1:
            return _legacy_capsule(addr)
        return _capsule_new(addr, NAME_VERSIONED, _VERSIONED_DESTRUCTOR)
    except BaseException:
        fn = c_void_p.from_address(addr + _VERSIONED_DELETER_AT).value
        if fn:
            _call_deleter(fn)(addr)
        raise


def _dl_type(dtype):
    out = DLDataType()
    _check(lib.sc_dtype_to_dlpack(int(dtype), byref(out)))
    return out


def _dl_tensor_at(capsule):
    """The DLTensor inside an unconsumed capsule (either kind)."""
    name = _capsule_get_name(capsule)
    if name == b"dltensor_versioned":
        base = _capsule_get_pointer(capsule, name)
        return DLTensor.from_address(base + DLManagedTensorVersioned.dl_tensor.offset)
    if name == b"dltensor":
        base = _capsule_get_pointer(capsule, name)
        return DLTensor.from_address(base + DLManagedTensor.dl_tensor.offset)
    raise BufferError(f"a capsule named {name!r} is not an unconsumed DLPack tensor")


def retype_capsule(capsule, dtype):
    """Make an unconsumed capsule announce dtype, which must have the width of the
    tensor's elements (its bits are taken as they are)."""
    t = _dl_tensor_at(capsule)
    new = _dl_type(as_dtype(dtype))
    if (t.dtype.bits, t.dtype.lanes) != (new.bits, 1):
        raise TypeError(f"retype_capsule: elements of {t.dtype.bits} bits x {t.dtype.lanes} "
                        f"lanes can't be taken as {as_dtype(dtype)}")
    t.dtype.code, t.dtype.bits = new.code, new.bits
    return capsule


def _legacy_capsule(versioned_addr):
    p = _malloc(1, sizeof(DLManagedTensor))
    if not p:
        raise MemoryError("DLManagedTensor")
    legacy = DLManagedTensor.from_address(p)
    ctypes.memmove(p + DLManagedTensor.dl_tensor.offset,
                   versioned_addr + DLManagedTensorVersioned.dl_tensor.offset, sizeof(DLTensor))
    legacy.manager_ctx = versioned_addr
    c_void_p.from_address(p + _LEGACY_DELETER_AT).value = _LEGACY_EXPORT_DELETER
    try:
        return _capsule_new(p, NAME_LEGACY, _LEGACY_DESTRUCTOR)
    except BaseException:
        _free(p)
        raise


# ---- import ---------------------------------------------------------------------------------


def _is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"


def _device_name(t):
    return {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 13: "kDLCUDAManaged"}.get(t, str(t))


def import_dlpack(cls, obj, *, context, stream, label, read_only, site, dtype=None):
    ctx = context
    if _is_capsule(obj):
        capsule = obj
        if ctx is None:
            raise ValueError("Buffer.from_dlpack: give context= with a bare capsule")
    else:
        if not hasattr(obj, "__dlpack__"):
            raise TypeError(f"Buffer.from_dlpack: {type(obj).__name__} has no __dlpack__ "
                            f"(not a DLPack producer)")
        dev_type, dev_id = (int(v) for v in obj.__dlpack_device__())
        if dev_type == kDLCUDA:
            if ctx is None:
                ctx = default_context(dev_id)
            s = stream if stream is not None else ctx.default_stream
            cu = s.cu_handle or 1  # DLPack: 1 is the legacy default stream, 0 is ambiguous
            try:
                capsule = obj.__dlpack__(stream=cu, max_version=(1, 1))
            except TypeError:
                capsule = obj.__dlpack__(stream=cu)
        else:
            if ctx is None:
                raise _lib.error(_lib.Status.SC_ERR_INVALID_ARGUMENT,
                                 f"Buffer.from_dlpack: the tensor is on {_device_name(dev_type)}"
                                 f" (device type {dev_type}), not on a CUDA device: move it to"
                                 f" the GPU first, or copy it with Context.from_host")
            try:  # the library refuses it, naming the device type
                capsule = obj.__dlpack__(max_version=(1, 1))
            except TypeError:
                capsule = obj.__dlpack__()
    return _import_capsule(cls, ctx, capsule, stream, label, read_only, site, dtype)


def _import_capsule(cls, ctx, capsule, stream, label, read_only, site, dtype=None):
    name = _capsule_get_name(capsule)
    if name == b"dltensor_versioned":
        ptr = _capsule_get_pointer(capsule, b"dltensor_versioned")
        wrapper = None
    elif name == b"dltensor":
        legacy = _capsule_get_pointer(capsule, b"dltensor")
        wrapper = _malloc(1, sizeof(DLManagedTensorVersioned))
        if not wrapper:
            raise MemoryError("DLManagedTensorVersioned")
        v = DLManagedTensorVersioned.from_address(wrapper)
        v.version.major, v.version.minor = 1, 0
        v.manager_ctx = legacy
        c_void_p.from_address(wrapper + _VERSIONED_DELETER_AT).value = _LEGACY_IMPORT_DELETER
        ctypes.memmove(wrapper + DLManagedTensorVersioned.dl_tensor.offset,
                       legacy + DLManagedTensor.dl_tensor.offset, sizeof(DLTensor))
        ptr = wrapper
    elif name and name.startswith(b"used_"):
        raise BufferError("Buffer.from_dlpack: this DLPack capsule was consumed already")
    else:
        raise BufferError(f"Buffer.from_dlpack: a capsule named {name!r} is not a DLPack "
                          f"tensor")
    t = DLManagedTensorVersioned.from_address(ptr).dl_tensor
    given = (t.dtype.code, t.dtype.bits, t.dtype.lanes)
    if dtype is not None:  # the same bits, taken as dtype
        want = as_dtype(dtype)
        new = _dl_type(want)
        if (given[1], given[2]) != (new.bits, 1):
            if wrapper:
                _free(wrapper)
            raise _lib.error(_lib.Status.SC_ERR_TYPE_MISMATCH,
                             f"Buffer.from_dlpack: dtype={want} asked, but the tensor's "
                             f"elements are {given[1]} bits x {given[2]} lanes (DLPack code "
                             f"{given[0]}); only elements of {new.bits} bits can be taken "
                             f"as {want}")
        t.dtype.code, t.dtype.bits = new.code, new.bits
    desc = sc_dlpack_import_desc(label_bytes(label), _stream_handle(stream), bool(read_only))
    h = c_uint64()
    file, line = site
    r = lib.sc_buffer_from_dlpack_at(ctx._h, ptr, byref(desc), byref(h), file, line)
    if r:
        t.dtype.code, t.dtype.bits, t.dtype.lanes = given  # the producer's tensor as it was
        if wrapper:
            _free(wrapper)  # the capsule still owns the producer's tensor
        fail(r)
    _capsule_set_name(capsule, NAME_USED_VERSIONED if wrapper is None else NAME_USED_LEGACY)
    shape = tuple(t.shape[i] for i in range(t.ndim)) if t.ndim > 0 else ()
    props = sc_buffer_props()
    _check(lib.sc_buffer_info(h.value, byref(props)))
    dtype = DType(props.dtype)
    if shape == () or _prod(shape) != props.count:
        shape = (props.count,)
    return cls._adopt(ctx, h.value, dtype, props.count, shape, label,
                      (string_at(file).decode(), line), borrowed=True)


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# ---- borrowed buffers from a raw device address ------------------------------------------------

_releases = {}
_release_keys = itertools.count(1)


def _release_trampoline(user, _pending=_releases):
    fn = _pending.pop(user or 0, None)
    if fn is not None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - nothing may propagate into C
            pass


_release_trampoline_c = _keep_forever(_lib.release_fn(_release_trampoline))


def borrow(cls, ctx, device_ptr, count, dtype, *, shape, label, stream, read_only, release,
           site):
    dtype = as_dtype(dtype)
    count = int(count)
    shape = (count,) if shape is None else tuple(int(s) for s in shape)
    desc = sc_borrow_desc(int(dtype), count, label_bytes(label), _stream_handle(stream),
                          bool(read_only))
    key = 0
    if release is not None:
        key = next(_release_keys)
        _releases[key] = release
        desc.release = _release_trampoline_c
        desc.release_user = key
    h = c_uint64()
    file, line = site
    r = lib.sc_buffer_borrow_at(ctx._h, int(device_ptr), byref(desc), byref(h), file, line)
    if r:
        _releases.pop(key, None)
        fail(r)
    return cls._adopt(ctx, h.value, dtype, count, shape, label,
                      (string_at(file).decode(), line), borrowed=True)

