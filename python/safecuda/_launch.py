"""Programs (NVRTC), modules, kernels and checked launches."""

import os
import types
from ctypes import (POINTER, byref, c_char_p, c_int, c_size_t, c_uint64, c_void_p, cast,
                    create_string_buffer, string_at)

from ._core import Arg, _check, _Resource, _stream_handle, _struct_dict
from ._lib import (caller_site, fail, lib, sc_arg, sc_dim3, sc_kernel_props, sc_launch_desc,
                   sc_program_desc, sc_program_header, sc_program_props)


def _c_strings(items):
    """A NULL-terminated char *[] (and the bytes it points into)."""
    enc = [s.encode() if isinstance(s, str) else bytes(s) for s in items]
    arr = (c_char_p * (len(enc) + 1))(*enc, None)
    return arr, enc


class Program(_Resource):
    """CUDA C++ compiled at run time with NVRTC for the context's device:
    Program(ctx, source, name=None, options=(), headers=None, name_expressions=(),
    fast_math=False, ptx=False, no_cache=False, arch=0, arch_specific=False).
    context may be None for a compile-only program (arch required). headers: a dict
    {include name: source}. CompileError quotes NVRTC's log."""

    _kind = "program"
    _destroy_fn = "sc_program_destroy"

    def __init__(self, context, source, *, name=None, options=(), headers=None,
                 name_expressions=(), fast_math=False, ptx=False, no_cache=False, arch=0,
                 arch_specific=False):
        keep = []
        desc = sc_program_desc()
        src = source.encode() if isinstance(source, str) else bytes(source)
        desc.source = src
        desc.name = name.encode() if name else None
        if options:
            arr, enc = _c_strings(options)
            desc.options = cast_pp(arr)
            keep += [arr, enc]
        if headers:
            items = list(headers.items())
            harr = (sc_program_header * len(items))()
            for i, (hname, hsrc) in enumerate(items):
                nb, sb = hname.encode(), hsrc.encode()
                harr[i].name, harr[i].source = nb, sb
                keep += [nb, sb]
            desc.headers = harr
            desc.n_headers = len(items)
            keep.append(harr)
        self._name_expressions = tuple(name_expressions)
        if name_expressions:
            arr, enc = _c_strings(name_expressions)
            desc.name_expressions = cast_pp(arr)
            keep += [arr, enc]
        desc.fast_math, desc.ptx, desc.no_cache = bool(fast_math), bool(ptx), bool(no_cache)
        desc.arch, desc.arch_specific = int(arch), bool(arch_specific)
        h = c_uint64()
        file, line = caller_site()
        ctx_h = context._h if context is not None else 0
        _check(lib.sc_program_create_at(ctx_h, byref(desc), byref(h), file, line))
        self._init_resource(context, h.value, name, (string_at(file).decode(), line))

    def info(self):
        p = sc_program_props()
        _check(lib.sc_program_info(self._h, byref(p)))
        return types.SimpleNamespace(**_struct_dict(p))

    @property
    def log(self):
        """NVRTC's log (warnings); "" when the image came from the cache."""
        need = c_size_t()
        _check(lib.sc_program_log(self._h, None, 0, byref(need)))
        buf = create_string_buffer(max(1, need.value))
        _check(lib.sc_program_log(self._h, buf, len(buf), byref(need)))
        return buf.value.decode("utf-8", "replace")

    @property
    def image(self):
        """The compiled image (cubin, or PTX text) as bytes."""
        p, n = c_void_p(), c_uint64()
        _check(lib.sc_program_image(self._h, byref(p), byref(n)))
        return string_at(p, n.value)

    def lowered_name(self, name_expression):
        out = c_char_p()
        _check(lib.sc_program_lowered_name(self._h, name_expression.encode(), byref(out)))
        return out.value.decode()

    def load(self):
        """Load the program into its context: a Module."""
        return Module(self._ctx, self, _site=caller_site())


def cast_pp(arr):
    return cast(arr, POINTER(c_char_p))


class Module(_Resource):
    """Compiled code loaded into a context: Module(ctx, program), Module(ctx, image=bytes)
    (PTX, cubin or fatbin) or Module(ctx, path=file)."""

    _kind = "module"
    _destroy_fn = "sc_module_destroy"

    def __init__(self, context, program=None, *, image=None, path=None, _site=None):
        h = c_uint64()
        file, line = _site if _site is not None else caller_site()
        given = sum(x is not None for x in (program, image, path))
        if given != 1:
            raise ValueError("Module: give exactly one of program, image= and path=")
        if program is not None:
            _check(lib.sc_module_load_at(context._h, program._h, byref(h), file, line))
            label = program._label
        elif image is not None:
            data = image.encode() if isinstance(image, str) else bytes(image)
            _check(lib.sc_module_load_image_at(context._h, data, len(data), byref(h), file,
                                               line))
            label = None
        else:
            _check(lib.sc_module_load_file_at(context._h, os.fsencode(path), byref(h), file,
                                              line))
            label = os.fspath(path)
        self._kernels = {}
        self._init_resource(context, h.value, label, (string_at(file).decode(), line))

    def kernel(self, name):
        """A kernel by name (extern "C", mangled, or a program's name expression)."""
        k = self._kernels.get(name)
        if k is None:
            h = c_uint64()
            file, line = caller_site()
            _check(lib.sc_kernel_get_at(self._h, name.encode(), byref(h), file, line))
            k = Kernel(self, h.value, name)
            self._kernels[name] = k
        return k

    __getitem__ = kernel

    def kernel_names(self):
        n = c_size_t()
        _check(lib.sc_module_kernel_names(self._h, None, 0, byref(n)))
        arr = (c_char_p * max(1, n.value))()
        _check(lib.sc_module_kernel_names(self._h, arr, n.value, byref(n)))
        return [arr[i].decode() for i in range(n.value)]


def _dim3(v, what):
    if isinstance(v, int):
        return sc_dim3(v, 1, 1)
    t = tuple(int(x) for x in v)
    if not 1 <= len(t) <= 3:
        raise ValueError(f"{what}: 1 to 3 dimensions, got {v!r}")
    t = t + (1,) * (3 - len(t))
    return sc_dim3(*t)


class Kernel:
    """A kernel of a module (valid while the module is loaded)."""

    __slots__ = ("module", "_h", "name", "_arrays")

    def __init__(self, module, handle, name):
        self.module = module
        self._h = handle
        self.name = name
        self._arrays = {}

    def info(self):
        p = sc_kernel_props()
        _check(lib.sc_kernel_info(self._h, byref(p)))
        return types.SimpleNamespace(**_struct_dict(p))

    def set_max_dynamic_shared(self, nbytes):
        _check(lib.sc_kernel_set_max_dynamic_shared(self._h, int(nbytes)))

    def occupancy(self, block_threads, shared_bytes=0):
        n = c_int()
        _check(lib.sc_kernel_occupancy(self._h, int(block_threads), int(shared_bytes),
                                       byref(n)))
        return n.value

    def config_for(self, n):
        """(grid, block) covering n elements, one thread each (sc_launch_config_for)."""
        d = sc_launch_desc()
        _check(lib.sc_launch_config_for(int(n), self._h, byref(d)))
        return (d.grid.x, d.grid.y, d.grid.z), (d.block.x, d.block.y, d.block.z)

    def launch(self, grid, block, *args, stream=None, shared_bytes=0, cluster=None,
               cooperative=False, programmatic=False, non_portable_cluster=False):
        """Launch with the checks of sc_kernel_launch (SC_LAUNCH in C): the argument count
        and sizes, the parameter types of C++ kernels against the views' dtypes and the
        declared accesses, the configuration. Arguments: In(v), Out(v), InOut(v), typed
        scalars (safecuda.i32(3), f32(1.5), u64(n), ...), Bytes(b). grid and block: an int
        or a tuple of up to 3."""
        n = len(args)
        arr_t = self._arrays.get(n)
        if arr_t is None:
            arr_t = self._arrays[n] = sc_arg * max(1, n)
        arr = arr_t()
        for i, a in enumerate(args):
            if type(a) is not Arg:
                raise TypeError(
                    f"{self.name}: argument {i} ({a!r}) is not a kernel argument: pass views "
                    f"as safecuda.In(v), Out(v) or InOut(v) and scalars with their type, "
                    f"e.g. safecuda.i32(3), safecuda.f32(1.5), safecuda.u64(n)")
            arr[i] = a._c
        d = sc_launch_desc(_dim3(grid, "grid"), _dim3(block, "block"), int(shared_bytes),
                           bool(programmatic), _dim3(cluster, "cluster") if cluster else
                           sc_dim3(0, 0, 0), bool(cooperative), bool(non_portable_cluster))
        r = lib.sc_kernel_launch(_stream_handle(stream), self._h, byref(d), arr, n)
        if r:
            fail(r)

    def __call__(self, grid, block, *args, **kw):
        return self.launch(grid, block, *args, **kw)

    def __repr__(self):
        return f"<safecuda.Kernel {self.name}>"

