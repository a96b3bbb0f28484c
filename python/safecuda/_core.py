"""Contexts, streams, events, buffers and views over the C API.

Lifetimes. Every object that holds a handle (Context, Stream, Event, Buffer, Program,
Module, MoE) is released by close() (idempotent; also on leaving a `with` block) or
destroy() (the C destroy, strict: a second destroy is StaleHandleError, as in C). An object
the garbage collector finds still open is destroyed then, and reported as a leak through
the log (stderr, or the callback given to set_log_callback), naming what it was and the
Python line that created it. An object keeps its context alive. Closing a context frees
what is still open in it: the library reports those objects as leaks, and their Python
objects then answer StaleHandleError. At interpreter exit the contexts still open are
closed with their objects, quietly, before Python tears the modules down; from then on
garbage collection calls nothing in the library.
"""

import atexit
import itertools
import numbers
import struct
import sys
import threading
import types
import weakref
from ctypes import (byref, c_bool, c_char, c_char_p, c_float, c_int, c_size_t, c_uint64,
                    c_void_p, cast, create_string_buffer, string_at)

from . import _lib
from ._dtype import (DType, as_dtype, bf16_bits_to_float, dtype_for_host_format,
                     fp8_bits_to_float, host_compatible, pack_scalar)
from ._lib import (caller_site, fail, label_bytes, lib, sc_buffer_desc, sc_buffer_origin,
                   sc_buffer_props, sc_context_desc, sc_device_props, sc_event_desc,
                   sc_memory_stats, sc_object_info, sc_stream_desc, sc_view)

# ---- process-wide state ------------------------------------------------------------------


class _State:
    exiting = False
    contexts = {}  # serial -> weakref(Context), in creation order
    serial = itertools.count(1)
    log_py = None  # the Python log callback (set_log_callback)
    log_c = None  # its ctypes trampoline (kept alive while installed)
    lock = threading.Lock()
    default_contexts = {}  # device -> Context


_state = _State()
LOG_LEVELS = ("debug", "info", "warning", "error")


def _report(level, message):
    """A message of the Python package, through the same sink as the library's."""
    fn = _state.log_py
    if fn is not None:
        try:
            fn(level, message)
            return
        except Exception:  # noqa: BLE001 - a failing callback must not lose the message
            pass
    err = sys.stderr
    if err is not None:
        try:
            err.write(f"safecuda {LOG_LEVELS[level]}: {message}\n")
            err.flush()
        except Exception:  # noqa: BLE001
            pass


def set_log_callback(fn):
    """Route the library's messages (leak reports, warnings) and the package's own to
    fn(level, message), level 0..3 (debug, info, warning, error); None restores stderr.
    The callback may be called from any thread."""
    if fn is None:
        lib.sc_set_log_callback(cast(None, _lib.log_fn), None)
        _state.log_py = None
        _state.log_c = None
        return

    def trampoline(level, message, user):
        try:
            fn(int(level), message.decode("utf-8", "replace") if message else "")
        except Exception:  # noqa: BLE001 - nothing may propagate into C
            pass

    c_fn = _lib.log_fn(trampoline)
    lib.sc_set_log_callback(c_fn, None)
    old = _state.log_c
    _state.log_py = fn
    _state.log_c = c_fn
    del old  # the library no longer calls the previous one (sc_set_log_callback waits)


def _at_exit():
    """Close what is still open, quietly, while the interpreter is whole; afterwards the
    garbage collector's finalizers do nothing."""
    _state.exiting = True
    for key in sorted(_state.contexts, reverse=True):
        ctx = _state.contexts[key]()
        if ctx is not None and ctx._open:
            try:
                ctx._close(quiet=True)
            except Exception:  # noqa: BLE001 - at exit, never raise
                pass
    _state.contexts.clear()
    _state.default_contexts.clear()
    if _state.log_c is not None:
        try:
            lib.sc_set_log_callback(cast(None, _lib.log_fn), None)
        except Exception:  # noqa: BLE001
            pass
        # The trampoline is never freed: a message logged later still finds it.


atexit.register(_at_exit)


# ---- library-wide functions ---------------------------------------------------------------


def _check(status):
    if status:
        fail(status)


def version():
    """The C library's version string ("0.1.0")."""
    return lib.sc_version_string().decode()


def init():
    """Load the CUDA driver now (NoDriverError says what was tried and what to install)."""
    _check(lib.sc_init())


def driver_version():
    v = c_int()
    _check(lib.sc_driver_version(byref(v)))
    return v.value


def driver_path():
    buf = create_string_buffer(4096)
    _check(lib.sc_driver_path(buf, len(buf)))
    return buf.value.decode("utf-8", "replace")


def compiler_version():
    """(major, minor) of the NVRTC the library loads (NoCompilerError without one)."""
    a, b = c_int(), c_int()
    _check(lib.sc_compiler_version(byref(a), byref(b)))
    return a.value, b.value


def compiler_path():
    buf = create_string_buffer(4096)
    _check(lib.sc_compiler_path(buf, len(buf)))
    return buf.value.decode("utf-8", "replace")


def device_count():
    n = c_int()
    _check(lib.sc_device_count(byref(n)))
    return n.value


def _struct_dict(s):
    out = {}
    for name, _ in s._fields_:
        v = getattr(s, name)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif hasattr(v, "_length_"):
            v = list(v)
        elif hasattr(v, "_fields_"):
            v = _struct_dict(v)
        out[name] = v
    return out


def device_info(device=0):
    """The device's properties (sc_device_props) as attributes."""
    p = sc_device_props()
    _check(lib.sc_device_info(int(device), byref(p)))
    return types.SimpleNamespace(**_struct_dict(p))


def device_memory(device=0):
    """(free, total) bytes of the device now."""
    f, t = c_uint64(), c_uint64()
    _check(lib.sc_device_memory(int(device), byref(f), byref(t)))
    return f.value, t.value


def status_name(status):
    return lib.sc_status_name(int(status)).decode()


# ---- the base of every object with a handle -----------------------------------------------


class _Resource:
    """An object that holds a handle of the library."""

    _kind = "object"
    _destroy_fn = None  # name of the C destroy function
    _internal = False  # made by the package for itself: closed quietly, never reported

    def _init_resource(self, ctx, handle, label, site):
        self._h = handle
        self._ctx = ctx
        self._label = label
        self._site = site  # (file, line) in Python
        self._open = True
        if ctx is not None:
            ctx._adopt(self)

    @property
    def handle(self):
        """The C handle's id (for code that calls the C API itself)."""
        return self._h

    @property
    def context(self):
        return self._ctx

    @property
    def label(self):
        return self._label

    @property
    def closed(self):
        return not self._open

    def _detail(self):
        return ""

    def _describe(self):
        file, line = self._site if self._site else ("?", 0)
        label = f" '{self._label}'" if self._label else ""
        detail = self._detail()
        return f"{self._kind}{label}{' ' + detail if detail else ''} created at {file}:{line}"

    def close(self):
        """Release the object (idempotent). Objects of a context already closed are gone
        with it: nothing is called."""
        if not self._open:
            return
        self._open = False
        ctx = self._ctx
        if ctx is not None:
            ctx._children.pop(id(self), None)
            if not ctx._open:
                return
        r = getattr(lib, self._destroy_fn)(self._h)
        if r:
            fail(r)

    def destroy(self):
        """The C destroy, as in C: a second destroy (or one after the context's) raises
        StaleHandleError with the library's message."""
        was_open, self._open = self._open, False
        if was_open and self._ctx is not None:
            self._ctx._children.pop(id(self), None)
        r = getattr(lib, self._destroy_fn)(self._h)
        if r:
            fail(r)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Nothing here may raise, nor rely on this module's globals late at exit (by then
        # every context was closed, so the first checks return).
        try:
            if not self.__dict__.get("_open", False):
                return
            ctx = self._ctx
            if ctx is not None and not ctx._open:
                return
            if _state.exiting:
                return
            self._open = False
            if not self._internal:
                _report(2, f"garbage collector: {self._describe()} was not closed; destroyed "
                           f"now (close it, or use `with`)")
            getattr(lib, self._destroy_fn)(self._h)
        except Exception:  # noqa: BLE001 - a finalizer never raises
            pass


# ---- contexts -------------------------------------------------------------------------------


class Context(_Resource):
    """A safecuda context on one device (over the device's primary context, the one the
    CUDA runtime and PyTorch use)."""

    _kind = "context"
    _destroy_fn = "sc_context_destroy"

    def __init__(self, device=0, *, vram_budget=0, disable_event_tracking=False):
        desc = sc_context_desc(int(device), int(vram_budget), bool(disable_event_tracking))
        h = c_uint64()
        file, line = caller_site()
        _check(lib.sc_context_create_at(byref(desc), byref(h), file, line))
        self._children = {}
        self._wrapped = {}  # CUstream value -> Stream
        self._wrap_lock = threading.Lock()
        self._default_stream = None
        self._init_resource(None, h.value, f"device {int(device)}",
                            (string_at(file).decode(), line))
        self._device = int(device)
        self._serial = next(_state.serial)
        _state.contexts[self._serial] = weakref.ref(self)

    def _adopt(self, obj):
        self._children[id(obj)] = weakref.ref(obj)

    @property
    def device(self):
        return self._device

    def _detail(self):
        return f"on device {self._device}"

    def _close(self, quiet):
        """Destroy the context. quiet: close the Python objects still open first (no leak
        report); else the library reports them as leaks."""
        if not self._open:
            return
        children = [r() for r in reversed(list(self._children.values()))]
        internal = [c for c in children if c is not None and c._open and
                    (quiet or c._internal)]
        for c in internal:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - the context's destroy frees it anyway
                c._open = False
        if quiet and self._exports_held():
            # At exit, memory that DLPack consumers still hold (a torch tensor made with
            # torch.from_dlpack, say) must not be freed under them: such a context is left
            # to the end of the process, and the deleters stay safe to call until then.
            self._open = False
            for c in children:
                if c is not None:
                    c._open = False
            return 0
        self._open = False
        _state.contexts.pop(getattr(self, "_serial", None), None)
        for d, c in list(_state.default_contexts.items()):
            if c is self:
                _state.default_contexts.pop(d, None)
        r = lib.sc_context_destroy(self._h)
        for c in children:
            if c is not None:
                c._open = False
        self._children.clear()
        self._wrapped.clear()
        if r and r != _lib.Status.SC_ERR_LEAKED:
            fail(r)
        return r

    def _exports_held(self):
        try:
            return any(o.kind == "dlpack export" for o in self.live_objects())
        except Exception:  # noqa: BLE001 - a library without exports has none
            return False

    def close(self):
        """Destroy the context. Objects still open in it are freed and reported by the
        library as leaks (kind, label, size, the Python line that created them)."""
        self._close(quiet=False)

    def destroy(self):
        """As close(), but a leak is raised (LeakedError) after the report, and a second
        destroy is StaleHandleError."""
        if not self._open:
            _check(lib.sc_context_destroy(self._h))
        r = self._close(quiet=False)
        if r:
            fail(r)

    def __del__(self):
        try:
            if not self.__dict__.get("_open", False) or _state.exiting:
                return
            _report(2, f"garbage collector: {self._describe()} was not closed; destroyed "
                       f"now (close it, or use `with`)")
            self._close(quiet=False)
        except Exception:  # noqa: BLE001 - a finalizer never raises
            pass

    # queries
    def synchronize(self):
        _check(lib.sc_context_synchronize(self._h))

    def check(self):
        """Raise ContextLostError once a sticky device error lost the context."""
        _check(lib.sc_context_check(self._h))

    def memory(self):
        s = sc_memory_stats()
        _check(lib.sc_context_memory(self._h, byref(s)))
        return types.SimpleNamespace(**_struct_dict(s))

    def trim(self):
        _check(lib.sc_context_trim(self._h))

    def live_objects(self):
        """The context's live objects as the leak report lists them."""
        n = c_size_t()
        _check(lib.sc_context_live_objects(self._h, None, 0, byref(n)))
        cap = n.value + 8
        arr = (sc_object_info * cap)()
        _check(lib.sc_context_live_objects(self._h, arr, cap, byref(n)))
        return [types.SimpleNamespace(**_struct_dict(arr[i])) for i in range(min(n.value, cap))]

    def live_report(self):
        """Write the list of live objects to the log; returns their number."""
        n = c_size_t()
        _check(lib.sc_context_live_report(self._h, byref(n)))
        return n.value

    @property
    def default_stream(self):
        """The context's default stream (it goes with the context)."""
        s = self._default_stream
        if s is None:
            h = c_uint64()
            _check(lib.sc_context_default_stream(self._h, byref(h)))
            s = Stream._adopt(self, h.value, "default stream", owned=False)
            self._default_stream = s
        return s

    # factories
    def stream(self, *, priority=0, blocking=False, label=None):
        return Stream(self, priority=priority, blocking=blocking, label=label)

    def event(self, *, timing=False, blocking_sync=False, label=None):
        return Event(self, timing=timing, blocking_sync=blocking_sync, label=label)

    def buffer(self, shape, dtype="f32", *, label=None, zero=False, stream=None):
        return Buffer(self, shape, dtype, label=label, zero=zero, stream=stream)

    def zeros(self, shape, dtype="f32", *, label=None, stream=None):
        return Buffer(self, shape, dtype, label=label, zero=True, stream=stream)

    def from_host(self, data, dtype=None, *, shape=None, label=None, stream=None):
        """A new buffer holding a copy of host data (bytes, array.array, memoryview, a
        numpy array: anything with the buffer protocol). dtype defaults to the data's
        element type; shape to the data's."""
        mv = _host_memoryview(data)
        if dtype is None:
            dtype = dtype_for_host_format(mv.format)
            if dtype is None:
                raise TypeError(f"from_host: no safecuda dtype for host format '{mv.format}': "
                                f"give dtype=")
        dtype = as_dtype(dtype)
        if shape is None:
            if mv.nbytes % dtype.size:
                raise ValueError(f"from_host: {mv.nbytes} bytes is not a whole number of "
                                 f"{dtype} elements")
            same = host_compatible(mv.format, dtype) and mv.itemsize == dtype.size
            shape = tuple(mv.shape) if same and mv.ndim else (mv.nbytes // dtype.size,)
        b = Buffer(self, shape, dtype, label=label, stream=stream, _site=caller_site())
        try:
            b.copy_from_host(data, stream=stream)
        except BaseException:
            b.close()
            raise
        return b

    def compile(self, source, **kw):
        """Program(self, source, **kw): CUDA C++ compiled with NVRTC for this device."""
        from ._launch import Program
        return Program(self, source, **kw)

    def load_module(self, program=None, *, image=None, path=None):
        from ._launch import Module
        return Module(self, program, image=image, path=path)

    def wrap_stream(self, cu_stream, *, label=None):
        """The sc_stream over an existing CUstream of this device (its value as an int;
        0 or 1 is the legacy default stream, 2 the per-thread one). One Stream per
        CUstream value is kept for the context's life (the CUstream must outlive it)."""
        key = int(cu_stream)
        s = self._wrapped.get(key)
        if s is not None:
            return s
        with self._wrap_lock:
            s = self._wrapped.get(key)
            if s is None:
                h = c_uint64()
                file, line = caller_site()
                name = label_bytes(label if label is not None else f"CUstream 0x{key:x}")
                _check(lib.sc_stream_wrap_at(self._h, key, name, byref(h), file, line))
                s = Stream._adopt(self, h.value, label or f"CUstream 0x{key:x}", owned=True,
                                  site=(string_at(file).decode(), line), internal=True)
                self._wrapped[key] = s
        return s

    def __repr__(self):
        state = "open" if self._open else "closed"
        return f"<safecuda.Context device {self._device} ({state})>"


def default_context(device=0):
    """The package's shared context for a device (made on first use, closed at exit):
    what Buffer.from_dlpack, Stream.from_torch and safecuda.torch use when no context is
    given."""
    device = int(device)
    ctx = _state.default_contexts.get(device)
    if ctx is not None and ctx._open:
        return ctx
    with _state.lock:
        ctx = _state.default_contexts.get(device)
        if ctx is None or not ctx._open:
            ctx = Context(device)
            ctx._label = f"default context of device {device}"
            _state.default_contexts[device] = ctx
    return ctx


# ---- streams and events -------------------------------------------------------------------


def _stream_handle(stream):
    if stream is None:
        return 0
    try:
        return stream._h
    except AttributeError:
        raise TypeError(f"expected a safecuda.Stream or None, got {type(stream).__name__}"
                        ) from None


class Stream(_Resource):
    """A stream of a context: Stream(ctx, priority=0, blocking=False, label=None), the
    context's default_stream, or an existing CUstream wrapped (Context.wrap_stream,
    Stream.from_torch)."""

    _kind = "stream"
    _destroy_fn = "sc_stream_destroy"

    def __init__(self, context, *, priority=0, blocking=False, label=None):
        desc = sc_stream_desc(int(priority), bool(blocking), label_bytes(label))
        h = c_uint64()
        file, line = caller_site()
        _check(lib.sc_stream_create_at(context._h, byref(desc), byref(h), file, line))
        self._owned = True
        self._init_resource(context, h.value, label, (string_at(file).decode(), line))

    @classmethod
    def _adopt(cls, ctx, handle, label, owned, site=None, internal=False):
        s = cls.__new__(cls)
        s._owned = owned
        s._internal = internal or not owned
        s._init_resource(ctx, handle, label, site)
        return s

    def close(self):
        if not self._owned:  # the default stream goes with its context
            self._open = False
            return
        super().close()

    def destroy(self):
        if not self._owned:
            raise _lib.error(_lib.Status.SC_ERR_INVALID_ARGUMENT,
                             "Stream.destroy: the default stream goes with its context")
        super().destroy()

    def __del__(self):
        if self.__dict__.get("_owned", False):
            super().__del__()

    def synchronize(self):
        _check(lib.sc_stream_synchronize(self._h))

    def query(self):
        """True when the stream's queued work is done."""
        r = lib.sc_stream_query(self._h)
        if r == _lib.Status.SC_ERR_NOT_READY:
            return False
        _check(r)
        return True

    def wait(self, event):
        """Make later work on this stream wait for the event's last record."""
        _check(lib.sc_stream_wait(self._h, event._h))

    @property
    def priority(self):
        p = c_int()
        _check(lib.sc_stream_priority(self._h, byref(p)))
        return p.value

    @property
    def cu_handle(self):
        """The CUstream behind the stream, as an int (work another library enqueues there
        is not tracked by safecuda)."""
        v = c_uint64()
        _check(lib.sc_stream_cu_handle(self._h, byref(v)))
        return v.value

    @property
    def is_wrapped(self):
        v = c_bool()
        _check(lib.sc_stream_is_wrapped(self._h, byref(v)))
        return v.value

    @classmethod
    def from_torch(cls, torch_stream=None, *, context=None):
        """The Stream over a PyTorch CUDA stream (default: torch's current stream on its
        current device), wrapped once per context and CUstream."""
        import torch
        if torch_stream is None:
            torch_stream = torch.cuda.current_stream()
        dev = torch_stream.device
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        ctx = context if context is not None else default_context(index)
        if ctx.device != index:
            raise ValueError(f"Stream.from_torch: the torch stream is on cuda:{index}, the "
                             f"context on device {ctx.device}")
        return ctx.wrap_stream(torch_stream.cuda_stream)

    def to_torch(self):
        """This stream as a torch.cuda.ExternalStream (work torch enqueues there is not
        tracked by safecuda)."""
        import torch
        return torch.cuda.ExternalStream(self.cu_handle,
                                         device=torch.device("cuda", self._ctx.device))

    def __repr__(self):
        return f"<safecuda.Stream {self._label or hex(self._h)}>"


class Event(_Resource):
    _kind = "event"
    _destroy_fn = "sc_event_destroy"

    def __init__(self, context, *, timing=False, blocking_sync=False, label=None):
        desc = sc_event_desc(bool(timing), bool(blocking_sync), label_bytes(label))
        h = c_uint64()
        file, line = caller_site()
        _check(lib.sc_event_create_at(context._h, byref(desc), byref(h), file, line))
        self._init_resource(context, h.value, label, (string_at(file).decode(), line))

    def record(self, stream=None):
        _check(lib.sc_event_record(self._h, _stream_handle(stream)))

    def synchronize(self):
        _check(lib.sc_event_synchronize(self._h))

    def query(self):
        r = lib.sc_event_query(self._h)
        if r == _lib.Status.SC_ERR_NOT_READY:
            return False
        _check(r)
        return True

    def elapsed_ms(self, end):
        """Milliseconds from this (timing) event's record to end's."""
        ms = c_float()
        _check(lib.sc_event_elapsed(self._h, end._h, byref(ms)))
        return ms.value


# ---- host memory --------------------------------------------------------------------------


def _host_memoryview(data):
    if isinstance(data, memoryview):
        return data
    try:
        return memoryview(data)
    except TypeError:
        raise TypeError(f"expected host memory (bytes, bytearray, array.array, memoryview, a "
                        f"numpy array), got {type(data).__name__}") from None


def _host_address(mv, writable, fn):
    """(address, keep-alive) of a C-contiguous memoryview's bytes."""
    if not mv.c_contiguous:
        raise ValueError(f"{fn}: the host memory is not C-contiguous")
    n = mv.nbytes
    if n == 0:
        return None, None
    if mv.readonly:
        if writable:
            raise ValueError(f"{fn}: the host memory is read-only")
        obj = mv.obj
        if type(obj) is bytes and len(obj) == n:
            return cast(c_char_p(obj), c_void_p).value, obj
        copy = bytes(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv)
        return cast(c_char_p(copy), c_void_p).value, copy
    flat = mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv
    holder = (c_char * n).from_buffer(flat)
    return cast(holder, c_void_p).value, (holder, flat)


def _shape_of(shape):
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    for s in shape:
        if s < 0:
            raise ValueError(f"negative extent in shape {shape}")
    return shape


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# ---- views and buffers --------------------------------------------------------------------


def _fill_bytes(dtype, value):
    """One element of dtype for fill (pack_scalar), or the TypeError / ValueError saying
    what fill takes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return pack_scalar(dtype, value)
    if not isinstance(value, numbers.Real):
        n = dtype.size
        raise TypeError(f"fill: value is {type(value).__name__}; fill takes a number (int or "
                        f"float) or the bytes of one {dtype} element ({n} byte"
                        f"{'s' if n != 1 else ''})")
    try:
        return pack_scalar(dtype, value)
    except (struct.error, OverflowError):
        if dtype.kind != "f" and not isinstance(value, numbers.Integral):
            raise TypeError(f"fill: value {value!r} is a {type(value).__name__}; {dtype} "
                            f"elements take an int") from None
        if dtype.kind == "f":
            raise ValueError(f"fill: value {value!r} is outside {dtype}'s range") from None
        bits = 8 * dtype.size
        lo, hi = (0, 2 ** bits - 1) if dtype.kind == "u" else (-2 ** (bits - 1),
                                                              2 ** (bits - 1) - 1)
        raise ValueError(f"fill: value {value!r} is outside {dtype}'s range {lo} .. {hi}") \
            from None


class View:
    """Elements [offset, offset + count) of a buffer, with a shape. A value: checked by
    the library at every use (a view of a destroyed buffer is StaleHandleError). Slicing
    (v[i], v[a:b]) selects along the first dimension."""

    __slots__ = ("_buf", "offset", "count", "shape", "dtype", "_sv", "__weakref__")

    def __init__(self, buffer, offset, count, shape=None):
        self._buf = buffer
        self.offset = int(offset)
        self.count = int(count)
        self.shape = (self.count,) if shape is None else _shape_of(shape)
        if _prod(self.shape) != self.count:
            raise ValueError(f"shape {self.shape} does not hold {self.count} elements")
        self.dtype = buffer.dtype
        self._sv = sc_view(buffer._h, self.offset, self.count)

    @property
    def buffer(self):
        return self._buf

    @property
    def context(self):
        return self.buffer._ctx

    @property
    def nbytes(self):
        return self.count * self.dtype.size

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return self.count

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d view")
        return self.shape[0]

    def __repr__(self):
        b = self.buffer
        name = f"'{b._label}'" if b._label else hex(b._h)
        return (f"<safecuda.View of buffer {name}: elements [{self.offset}, "
                f"{self.offset + self.count}) shape {self.shape} {self.dtype}>")

    # sub-views
    def __getitem__(self, key):
        if not self.shape:
            raise IndexError("a 0-d view can't be indexed")
        rows = self.shape[0]
        row = _prod(self.shape[1:])
        if isinstance(key, slice):
            start, stop, step = key.indices(rows)
            if step != 1:
                raise ValueError("safecuda views are contiguous ranges: a step other than 1 "
                                 "can't be taken")
            n = max(0, stop - start)
            return View(self.buffer, self.offset + start * row, n * row,
                        (n,) + self.shape[1:])
        try:
            i = int(key.__index__())
        except AttributeError:
            raise TypeError(f"views are indexed by an int or a slice, not "
                            f"{type(key).__name__}") from None
        if i < 0:
            i += rows
        if not 0 <= i < rows:
            raise IndexError(f"index {key} outside the first dimension of extent {rows}")
        return View(self.buffer, self.offset + i * row, row, self.shape[1:])

    def view(self, offset=0, count=None, shape=None):
        """A checked view of elements [offset, offset + count) of this one (flat element
        offsets; count None: to the end). OutOfBoundsError / OverflowError from the
        library as sc_view_sub answers."""
        out = sc_view()
        c = _lib.SC_WHOLE if count is None else int(count)
        _check(lib.sc_view_sub(self._sv, int(offset), c, byref(out)))
        return View(self.buffer, out.offset, out.count, shape)

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) == 1:
            known = _prod([s for s in shape if s != -1])
            shape[shape.index(-1)] = self.count // known if known else 0
        return View(self.buffer, self.offset, self.count, tuple(shape))

    # copies
    def copy_from_host(self, src, *, stream=None):
        """Copy host memory (bytes, bytearray, array.array, memoryview, numpy array) into
        the view; returns when src may be reused. The host bytes must equal the view's
        (OutOfBoundsError otherwise); a host element type other than the view's (or than
        raw bytes) is TypeMismatchError."""
        mv = _host_memoryview(src)
        if not host_compatible(mv.format, self.dtype):
            raise _lib.error(_lib.Status.SC_ERR_TYPE_MISMATCH,
                             f"copy_from_host: host elements of format '{mv.format}' "
                             f"({mv.itemsize} bytes) into {self._what()} of {self.dtype}: "
                             f"convert them first (or pass raw bytes)")
        addr, keep = _host_address(mv, False, "copy_from_host")
        r = lib.sc_copy_from_host(_stream_handle(stream), self._sv, addr, mv.nbytes)
        del keep
        if r:
            fail(r)

    def to_host(self, out=None, *, stream=None):
        """The view's elements on the host. Into out (a writable bytearray, array.array,
        memoryview or numpy array of the same bytes) when given, returned; else a new
        memoryview of the view's format and shape (bf16: 16-bit patterns, 'H'; fp8: 8-bit
        patterns, 'B')."""
        if out is not None:
            mv = _host_memoryview(out)
            if not host_compatible(mv.format, self.dtype):
                raise _lib.error(_lib.Status.SC_ERR_TYPE_MISMATCH,
                                 f"to_host: {self._what()} of {self.dtype} into host "
                                 f"elements of format '{mv.format}'")
            addr, keep = _host_address(mv, True, "to_host")
            r = lib.sc_copy_to_host(_stream_handle(stream), addr, mv.nbytes, self._sv)
            del keep
            if r:
                fail(r)
            return out
        data = bytearray(self.nbytes)
        if data:
            addr, keep = _host_address(memoryview(data), True, "to_host")
            r = lib.sc_copy_to_host(_stream_handle(stream), addr, len(data), self._sv)
            del keep
            if r:
                fail(r)
        mv = memoryview(data).cast(self.dtype.format)
        if len(self.shape) != 1 and self.count:
            mv = mv.cast("B").cast(self.dtype.format, self.shape)
        return mv

    def to_numpy(self, *, stream=None):
        """A new numpy array of the view's elements and shape (bf16 as uint16 patterns, fp8
        as uint8 patterns: numpy has no fp8 type)."""
        import numpy as np
        out = np.empty(self.shape, dtype=_NUMPY_NAMES[self.dtype])
        return self.to_host(out, stream=stream)

    def tolist(self, *, stream=None):
        """The elements as (nested) Python numbers; bf16 and fp8 converted to float."""
        mv = self.to_host(stream=stream)
        if self.dtype is DType.BF16:
            flat = [bf16_bits_to_float(v) for v in mv.cast("B").cast("H").tolist()]
            return _nest(flat, self.shape)
        if self.dtype in (DType.F8E4M3, DType.F8E5M2):
            flat = [fp8_bits_to_float(v, self.dtype) for v in mv.cast("B").tolist()]
            return _nest(flat, self.shape)
        return mv.tolist() if self.shape else mv.cast("B").cast(self.dtype.format)[0]

    def copy_from(self, src, *, stream=None):
        """Device-to-device copy of another view or buffer (same dtype and count) into this
        one (host memory: copy_from_host). TypeError for anything else."""
        if not isinstance(src, View):
            what = type(src).__name__
            try:
                memoryview(src)
                host = True
            except TypeError:
                host = False
            if host:
                raise TypeError(f"copy_from: src is a {what} (host memory); copy_from takes "
                                f"a safecuda View or Buffer (a device-to-device copy): use "
                                f"copy_from_host for host memory")
            raise TypeError(f"copy_from: src is {what}; copy_from takes a safecuda View or "
                            f"Buffer (a device-to-device copy), and copy_from_host host "
                            f"memory (bytes, bytearray, array.array, memoryview, numpy "
                            f"arrays)")
        _check(lib.sc_copy(_stream_handle(stream), self._sv, src._sv))

    def fill(self, value, *, stream=None):
        """Set every element to value: a number of the view's dtype (bf16 and fp8 rounded
        to nearest even, fp8 saturating), or bytes of one element, its bit pattern
        (b"\\x38": 1.0 in f8e4m3). TypeError for another kind of value (a float for an
        integer dtype too), ValueError for a number outside an integer dtype's range."""
        raw = _fill_bytes(self.dtype, value)
        _check(lib.sc_fill(_stream_handle(stream), self._sv, raw))

    @property
    def device_ptr(self):
        """UNCHECKED escape hatch: the device address of the view's first element (see
        sc_buffer_device_ptr: no bounds, no ordering, dangles after the destroy)."""
        p = c_uint64()
        _check(lib.sc_buffer_device_ptr(self.buffer._h, byref(p)))
        return p.value + self.offset * self.dtype.size

    def _what(self):
        # As the library's messages name a buffer: its label quoted, '' when it has none.
        return (f"view [{self.offset}, {self.offset + self.count}) of buffer "
                f"'{self.buffer._label or ''}'")

    # DLPack (the Python array API's protocol)
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        from ._dlpack import export_view
        return export_view(self, stream=stream, max_version=max_version, dl_device=dl_device,
                           copy=copy)

    def __dlpack_device__(self):
        return (_lib.kDLCUDA, self.buffer._ctx.device)


_NUMPY_NAMES = {DType.U8: "uint8", DType.I8: "int8", DType.U16: "uint16", DType.I16: "int16",
                DType.U32: "uint32", DType.I32: "int32", DType.U64: "uint64",
                DType.I64: "int64", DType.F16: "float16", DType.BF16: "uint16",
                DType.F32: "float32", DType.F64: "float64", DType.F8E4M3: "uint8",
                DType.F8E5M2: "uint8"}


def _nest(flat, shape):
    if len(shape) <= 1:
        return flat if shape else flat[0]
    step = _prod(shape[1:])
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


class Buffer(_Resource, View):
    """Device memory of a context with an element type and a shape:
    Buffer(ctx, shape, dtype="f32", label=None, zero=False, stream=None). A buffer is
    also the view of all its elements."""

    _kind = "buffer"
    _destroy_fn = "sc_buffer_destroy"

    def __init__(self, context, shape, dtype="f32", *, label=None, zero=False, stream=None,
                 _site=None):
        shape = _shape_of(shape)
        dtype = as_dtype(dtype)
        count = _prod(shape)
        desc = sc_buffer_desc(int(dtype), count, label_bytes(label), bool(zero),
                              _stream_handle(stream))
        h = c_uint64()
        file, line = _site if _site is not None else caller_site()
        _check(lib.sc_buffer_create_at(context._h, byref(desc), byref(h), file, line))
        self._setup(context, h.value, dtype, count, shape, label,
                    (string_at(file).decode(), line))

    def _setup(self, ctx, handle, dtype, count, shape, label, site, borrowed=False):
        self._borrowed = borrowed
        self._init_resource(ctx, handle, label, site)
        self._buf = None
        self.offset = 0
        self.count = count
        self.shape = shape
        self.dtype = dtype
        self._sv = sc_view(handle, 0, count)

    @classmethod
    def _adopt(cls, ctx, handle, dtype, count, shape, label, site, borrowed=True):
        b = cls.__new__(cls)
        b._setup(ctx, handle, dtype, count, shape, label, site, borrowed)
        return b

    @property
    def buffer(self):
        return self

    def _detail(self):
        return f"{self.count} x {self.dtype}{' (borrowed)' if self._borrowed else ''}"

    def info(self):
        p = sc_buffer_props()
        _check(lib.sc_buffer_info(self._h, byref(p)))
        d = _struct_dict(p)
        d["dtype"] = DType(d["dtype"]) if d["dtype"] in DType._value2member_map_ else d["dtype"]
        return types.SimpleNamespace(**d)

    def origin(self):
        """(borrowed, read_only, exports): how the buffer came to be, and the DLPack
        exports of it whose deleter has not run yet."""
        o = sc_buffer_origin()
        _check(lib.sc_buffer_get_origin(self._h, byref(o)))
        return types.SimpleNamespace(borrowed=o.borrowed, read_only=o.read_only,
                                     exports=o.exports)

    def __repr__(self):
        name = f"'{self._label}'" if self._label else hex(self._h)
        state = "" if self._open else " (closed)"
        return f"<safecuda.Buffer {name} shape {self.shape} {self.dtype}{state}>"

    @classmethod
    def from_dlpack(cls, obj, *, context=None, stream=None, label=None, read_only=False,
                    dtype=None):
        """Import a DLPack tensor (an object with __dlpack__, e.g. a CUDA torch tensor, or
        a capsule) as a borrowed buffer of its shape, without a copy. The producer is asked
        to order its work before `stream` (default: the context's default stream); with
        `stream` given it is taken as the owner's stream (see sc_borrow_desc.stream): the
        release waits on it instead of the host. The buffer holds the producer's tensor
        until it is closed. dtype: take the tensor's elements as this dtype, their bits
        unchanged (elements of its width only, else TypeMismatchError): fp8 data a producer
        exports as uint8, say (safecuda.torch.as_buffer does that for torch's fp8)."""
        from ._dlpack import import_dlpack
        return import_dlpack(cls, obj, context=context, stream=stream, label=label,
                             read_only=read_only, site=caller_site(), dtype=dtype)

    @classmethod
    def borrow(cls, context, device_ptr, count, dtype, *, shape=None, label=None, stream=None,
               read_only=False, release=None):
        """Wrap count elements at a device address another library owns (checked by the
        library: see sc_buffer_borrow). release (a callable, may be None) is called once
        when the buffer goes; the caller keeps the memory alive until then."""
        from ._dlpack import borrow
        return borrow(cls, context, device_ptr, count, dtype, shape=shape, label=label,
                      stream=stream, read_only=read_only, release=release,
                      site=caller_site())


# ---- kernel arguments -----------------------------------------------------------------------


class Arg:
    """One argument of Kernel.launch: In(view), Out(view), InOut(view), a typed scalar
    (i32(3), f32(1.5), ...) or Bytes(b) (a struct passed by value)."""

    __slots__ = ("_c", "_keep", "_text")

    def __repr__(self):
        return self._text


def _view_arg(kind, name, v):
    if not isinstance(v, View):
        raise TypeError(f"{name}() takes a safecuda Buffer or View, not {type(v).__name__}")
    a = Arg()
    a._c = _lib.sc_arg(kind, 0, v._sv)
    a._keep = v
    a._text = f"{name}({v!r})"
    return a


def In(view):
    """A view the kernel reads (it may be a const T* parameter)."""
    return _view_arg(_lib.SC_ARG_IN, "In", view)


def Out(view):
    """A view the kernel writes."""
    return _view_arg(_lib.SC_ARG_OUT, "Out", view)


def InOut(view):
    """A view the kernel reads and writes."""
    return _view_arg(_lib.SC_ARG_INOUT, "InOut", view)


def _scalar(dtype, field, value, lo=None, hi=None):
    if lo is not None:
        value = int(value.__index__() if hasattr(value, "__index__") else value)
        if not lo <= value <= hi:
            raise OverflowError(f"{value} does not fit {dtype}")
    else:
        value = float(value)
    a = Arg()
    c = _lib.sc_arg(_lib.SC_ARG_SCALAR, int(dtype))
    setattr(c.value, field, value)
    a._c = c
    a._keep = None
    a._text = f"{dtype}({value})"
    return a


def i32(x):
    return _scalar(DType.I32, "i32", x, -(1 << 31), (1 << 31) - 1)


def u32(x):
    return _scalar(DType.U32, "u32", x, 0, (1 << 32) - 1)


def i64(x):
    return _scalar(DType.I64, "i64", x, -(1 << 63), (1 << 63) - 1)


def u64(x):
    return _scalar(DType.U64, "u64", x, 0, (1 << 64) - 1)


def f32(x):
    return _scalar(DType.F32, "f32", x)


def f64(x):
    return _scalar(DType.F64, "f64", x)


def Bytes(data):
    """Raw bytes passed by value (a struct: pack it with the struct module)."""
    data = bytes(data)
    a = Arg()
    c = _lib.sc_arg(_lib.SC_ARG_BYTES, 0)
    c.bytes = cast(c_char_p(data), c_void_p).value if data else None
    c.size = len(data)
    a._c = c
    a._keep = data
    a._text = f"Bytes({len(data)} bytes)"
    return a

