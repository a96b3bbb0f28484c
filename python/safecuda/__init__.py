"""safecuda from Python: the C library's safe GPU objects through ctypes.

    import safecuda as sc
    with sc.Context() as ctx:
        x = ctx.from_host(array.array("f", range(1024)))
        print(x[:4].tolist())

Importing needs no GPU, driver or torch; the driver is loaded by the first call that needs
it, which raises NoDriverError (status SC_ERR_NO_DRIVER, with the library's message) where
there is none. Every failure is a SafecudaError subclass named after its status
(StaleHandleError for SC_ERR_STALE_HANDLE, ...), carrying .status and .message.
safecuda.torch (imported on use) holds the PyTorch integration.
"""

from . import _nvrtc

_nvrtc.setup_nvrtc()  # before the library first loads NVRTC

from ._lib import (ERROR_CLASSES, MissingSymbolError, SafecudaError, Status,  # noqa: E402
                   library_path)
from ._dtype import DType, as_dtype  # noqa: E402
from ._core import (Arg, Buffer, Bytes, Context, Event, In, InOut, Out, Stream,  # noqa: E402
                    View, compiler_path, compiler_version, default_context, device_count,
                    device_info, device_memory, driver_path, driver_version, f32, f64, i32,
                    i64, init, set_log_callback, status_name, u32, u64, version)
from ._launch import Kernel, Module, Program  # noqa: E402
from ._comm import Comm, ReduceOp  # noqa: E402
from ._moe import MoE  # noqa: E402
from ._tensor_map import TensorMap, TensorMapIn, TensorMapOut  # noqa: E402
from ._quant import (dequantize_fp8_blocks, dequantize_fp8_tokens,  # noqa: E402
                     quantize_fp8_blocks, quantize_fp8_tokens)

__version__ = "0.1.0"

# The exception classes, one per status: safecuda.StaleHandleError, ...
for _cls in ERROR_CLASSES.values():
    globals()[_cls.__name__] = _cls
del _cls

_ERROR_NAMES = [c.__name__ for c in ERROR_CLASSES.values()]

__all__ = [
    "Arg", "Buffer", "Bytes", "Comm", "Context", "DType", "Event", "In", "InOut", "Kernel",
    "MissingSymbolError", "MoE", "Module", "Out", "Program", "ReduceOp", "SafecudaError",
    "Status",
    "Stream", "TensorMap", "TensorMapIn", "TensorMapOut", "View", "as_dtype",
    "compiler_path", "compiler_version", "default_context", "dequantize_fp8_blocks",
    "dequantize_fp8_tokens", "device_count", "device_info", "device_memory", "driver_path",
    "driver_version", "f32", "f64", "i32", "i64", "init", "library_path",
    "quantize_fp8_blocks", "quantize_fp8_tokens", "set_log_callback", "status_name", "u32",
    "u64", "version",
    # the error classes, less OverflowError and TimeoutError (a star import must not hide
    # the builtins)
    *[n for n in _ERROR_NAMES if n not in ("OverflowError", "TimeoutError")],
]


def __getattr__(name):
    if name == "torch":  # safecuda.torch needs torch: imported on use
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'safecuda' has no attribute '{name}'")
