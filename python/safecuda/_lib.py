"""The C library through ctypes: loading, the structures of the public headers, the
functions' signatures (bound on first use), statuses and exceptions.

Handles (sc_context, sc_buffer, ...) are C structs holding one uint64_t; they are passed
here as plain uint64 values, which every 64-bit Linux ABI passes and returns exactly like
a struct of one uint64_t. Views (sc_view, 24 bytes) and the desc structs keep their
declared layout.
"""

import ctypes
import enum
import os
import sys
from ctypes import (CFUNCTYPE, POINTER, Structure, Union, c_bool, c_char, c_char_p, c_double,
                    c_float, c_int, c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32,
                    c_uint64, c_void_p)

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# ---- statuses and exceptions ------------------------------------------------------------


class Status(enum.IntEnum):
    """sc_status: the value and the C name (Status.SC_ERR_STALE_HANDLE.name)."""
    SC_OK = 0
    SC_ERR_INVALID_ARGUMENT = 1
    SC_ERR_NO_DRIVER = 2
    SC_ERR_NO_COMPILER = 3
    SC_ERR_NO_DEVICE = 4
    SC_ERR_STALE_HANDLE = 5
    SC_ERR_WRONG_KIND = 6
    SC_ERR_WRONG_CONTEXT = 7
    SC_ERR_OUT_OF_MEMORY = 8
    SC_ERR_HOST_OUT_OF_MEMORY = 9
    SC_ERR_BUDGET_EXCEEDED = 10
    SC_ERR_OUT_OF_BOUNDS = 11
    SC_ERR_OVERFLOW = 12
    SC_ERR_TYPE_MISMATCH = 13
    SC_ERR_BUSY = 14
    SC_ERR_NOT_READY = 15
    SC_ERR_LEAKED = 16
    SC_ERR_CONTEXT_LOST = 17
    SC_ERR_DRIVER = 18
    SC_ERR_COMPILE = 19
    SC_ERR_LAUNCH = 20
    SC_ERR_NOT_SUPPORTED = 21
    SC_ERR_IO = 22
    SC_ERR_LIMIT = 23
    SC_ERR_INTERNAL = 24
    SC_ERR_CAPTURE = 25
    SC_ERR_CAPTURE_INVALIDATED = 26
    SC_ERR_NO_NCCL = 27
    SC_ERR_COMM = 28
    SC_ERR_TIMEOUT = 29


class SafecudaError(Exception):
    """A failed safecuda call. .status is the Status (an int with the C name), .message the
    library's message (sc_last_error): the function, the values, the handles' creation
    sites."""

    status = None

    def __init__(self, status, message):
        self.status = Status(status) if status in _STATUS_VALUES else status
        self.message = message
        super().__init__(message)

    def __str__(self):
        name = self.status.name if isinstance(self.status, Status) else str(self.status)
        return f"{name}: {self.message}"

    def __reduce__(self):
        return (type(self), (int(self.status), self.message))


_STATUS_VALUES = set(int(s) for s in Status)
_BUILTIN_BASES = {
    "SC_ERR_INVALID_ARGUMENT": (ValueError,),
    "SC_ERR_OUT_OF_MEMORY": (MemoryError,),
    "SC_ERR_HOST_OUT_OF_MEMORY": (MemoryError,),
    "SC_ERR_OUT_OF_BOUNDS": (IndexError,),
    "SC_ERR_OVERFLOW": (OverflowError,),
    "SC_ERR_TYPE_MISMATCH": (TypeError,),
    "SC_ERR_TIMEOUT": (TimeoutError,),
}


def _class_name(status_name):
    """SC_ERR_STALE_HANDLE -> StaleHandleError."""
    words = status_name[len("SC_ERR_"):].lower().split("_")
    return "".join(w.capitalize() for w in words) + "Error"


ERROR_CLASSES = {}
for _s in Status:
    if _s == Status.SC_OK:
        continue
    _name = _class_name(_s.name)
    _cls = type(_name, (SafecudaError,) + _BUILTIN_BASES.get(_s.name, ()),
                {"__doc__": f"{_s.name}: see include/safecuda.h.", "__module__": "safecuda"})
    ERROR_CLASSES[int(_s)] = _cls
del _s, _name, _cls


def error(status, message):
    """The exception for a status and a message."""
    return ERROR_CLASSES.get(int(status), SafecudaError)(status, message)


class MissingSymbolError(SafecudaError, AttributeError):
    """The loaded libsafecuda lacks a function this package needs (an older library)."""

    def __init__(self, name, path):
        Exception.__init__(self, name, path)
        self.status = Status.SC_ERR_NOT_SUPPORTED
        self.message = (f"{name} is not in {path}: this libsafecuda is older than the "
                        f"Python package (rebuild it from the same checkout, or point "
                        f"SAFECUDA_LIBRARY at a current one)")
        self.symbol = name

    def __reduce__(self):
        return (type(self), (self.symbol, ""))


# ---- structures -------------------------------------------------------------------------

Handle = c_uint64
SC_WHOLE = (1 << 64) - 1


class sc_view(Structure):
    _fields_ = [("buffer", c_uint64), ("offset", c_uint64), ("count", c_uint64)]


class sc_dim3(Structure):
    _fields_ = [("x", c_uint32), ("y", c_uint32), ("z", c_uint32)]


class sc_device_props(Structure):
    _fields_ = [("ordinal", c_int), ("name", c_char * 256), ("uuid", c_char * 48),
                ("pci_bus_id", c_char * 32), ("cc_major", c_int), ("cc_minor", c_int),
                ("sm_count", c_int), ("total_memory", c_uint64), ("l2_cache_bytes", c_int),
                ("shared_per_block", c_int), ("shared_per_block_optin", c_int),
                ("shared_per_sm", c_int), ("max_threads_per_block", c_int),
                ("max_threads_per_sm", c_int), ("warp_size", c_int),
                ("registers_per_block", c_int), ("registers_per_sm", c_int),
                ("clock_khz", c_int), ("memory_clock_khz", c_int),
                ("memory_bus_width_bits", c_int), ("memory_bandwidth_gbs", c_double),
                ("max_grid", c_int * 3), ("max_block", c_int * 3), ("async_engines", c_int),
                ("ecc_enabled", c_bool), ("memory_pools_supported", c_bool)]


class sc_context_desc(Structure):
    _fields_ = [("device", c_int), ("vram_budget", c_uint64),
                ("disable_event_tracking", c_bool)]


class sc_object_info(Structure):
    _fields_ = [("kind", c_char_p), ("label", c_char * 64), ("detail", c_char * 96),
                ("bytes", c_uint64), ("file", c_char_p), ("line", c_int)]


class sc_memory_stats(Structure):
    _fields_ = [(n, c_uint64) for n in (
        "bytes_in_use", "peak_bytes", "live_buffers", "vram_budget", "pool_reserved",
        "pinned_bytes", "borrowed_bytes", "device_free", "device_total")]


class sc_stream_desc(Structure):
    _fields_ = [("priority", c_int), ("blocking", c_bool), ("label", c_char_p)]


class sc_event_desc(Structure):
    _fields_ = [("timing", c_bool), ("blocking_sync", c_bool), ("label", c_char_p)]


class sc_buffer_desc(Structure):
    _fields_ = [("dtype", c_int), ("count", c_uint64), ("label", c_char_p), ("zero", c_bool),
                ("stream", c_uint64)]


class sc_buffer_props(Structure):
    _fields_ = [("dtype", c_int), ("count", c_uint64), ("bytes", c_uint64),
                ("label", c_char * 64), ("file", c_char_p), ("line", c_int),
                ("context", c_uint64)]


class sc_program_header(Structure):
    _fields_ = [("name", c_char_p), ("source", c_char_p)]


class sc_program_desc(Structure):
    _fields_ = [("source", c_char_p), ("name", c_char_p), ("options", POINTER(c_char_p)),
                ("headers", POINTER(sc_program_header)), ("n_headers", c_size_t),
                ("name_expressions", POINTER(c_char_p)), ("fast_math", c_bool),
                ("ptx", c_bool), ("no_cache", c_bool), ("arch", c_int),
                ("arch_specific", c_bool)]


class sc_program_props(Structure):
    _fields_ = [("arch", c_int), ("is_ptx", c_bool), ("from_cache", c_bool),
                ("image_bytes", c_uint64), ("compile_ms", c_double),
                ("cache_path", c_char * 512), ("arch_specific", c_bool)]


class sc_kernel_props(Structure):
    _fields_ = [("name", c_char * 256), ("registers", c_int), ("static_shared_bytes", c_int),
                ("max_dynamic_shared_bytes", c_int), ("max_threads_per_block", c_int),
                ("local_bytes", c_int), ("const_bytes", c_int), ("ptx_version", c_int),
                ("binary_version", c_int), ("n_params", c_int), ("typed", c_bool),
                ("cluster_dims", sc_dim3), ("cluster_required", c_bool)]


class sc_launch_desc(Structure):
    _fields_ = [("grid", sc_dim3), ("block", sc_dim3), ("shared_bytes", c_uint32),
                ("programmatic", c_bool), ("cluster", sc_dim3), ("cooperative", c_bool),
                ("non_portable_cluster", c_bool)]


class _sc_arg_value(Union):
    _fields_ = [("i32", c_int32), ("u32", c_uint32), ("i64", c_int64), ("u64", c_uint64),
                ("f32", c_float), ("f64", c_double)]


class sc_arg(Structure):
    _fields_ = [("kind", c_int), ("dtype", c_int), ("view", sc_view), ("value", _sc_arg_value),
                ("bytes", c_void_p), ("size", c_size_t)]


SC_ARG_IN, SC_ARG_OUT, SC_ARG_INOUT, SC_ARG_SCALAR, SC_ARG_BYTES = 1, 2, 3, 4, 5
SC_ARG_TENSOR_MAP_IN, SC_ARG_TENSOR_MAP_OUT = 6, 7

SC_TENSOR_MAP_MAX_RANK = 5


class sc_tensor_map_desc(Structure):
    _fields_ = [("rows", c_uint64), ("cols", c_uint64), ("box_rows", c_uint32),
                ("box_cols", c_uint32), ("swizzle", c_int), ("row_stride", c_uint64),
                ("rank", c_uint32), ("dims", c_uint64 * SC_TENSOR_MAP_MAX_RANK),
                ("strides", c_uint64 * SC_TENSOR_MAP_MAX_RANK),
                ("box", c_uint32 * SC_TENSOR_MAP_MAX_RANK),
                ("element_strides", c_uint32 * SC_TENSOR_MAP_MAX_RANK),
                ("oob_fill", c_int), ("l2_promotion", c_int)]


class sc_tensor_map(Structure):
    """The C struct is 64-byte aligned (encoded is the CUtensorMap a kernel receives) and
    its size a multiple of 64 (SC_TENSOR_MAP_BYTES): ctypes aligns to 8 at most, so a map
    must be placed by hand (see _tensor_map.py)."""
    _fields_ = [("encoded", c_uint8 * 128), ("view", sc_view), ("address", c_uint64),
                ("desc", sc_tensor_map_desc)]


SC_TENSOR_MAP_BYTES = (ctypes.sizeof(sc_tensor_map) + 63) // 64 * 64


class sc_moe_desc(Structure):
    # include/safecuda/moe.h, field for field and in its order: the library reads the whole
    # struct (python/tests/test_struct_layout.py checks the layout against the header).
    _fields_ = [("experts", c_int), ("top_k", c_int), ("hidden", c_int),
                ("intermediate", c_int), ("dtype", c_int), ("scoring", c_int),
                ("renormalize", c_bool), ("router", c_uint64), ("w13", c_uint64),
                ("w2", c_uint64), ("selection_bias", c_uint64), ("max_tokens", c_uint64),
                ("label", c_char_p), ("backend", c_int),
                # routing
                ("n_group", c_int), ("topk_group", c_int), ("routed_scaling", c_float),
                # experts
                ("activation", c_int), ("swiglu_alpha", c_float), ("swiglu_limit", c_float),
                ("w13_layout", c_int),
                # weights as views
                ("router_view", sc_view), ("w13_view", sc_view), ("w2_view", sc_view),
                ("selection_bias_view", sc_view),
                # biases
                ("router_bias", sc_view), ("w13_bias", sc_view), ("w2_bias", sc_view),
                # the shared expert
                ("shared_intermediate", c_int), ("shared_w13", sc_view), ("shared_w2", sc_view),
                ("shared_gate", sc_view),
                # fp8 experts: their dtype and the checkpoints' 128 x 128 block scales
                ("expert_dtype", c_int), ("w13_scale", sc_view), ("w2_scale", sc_view),
                ("shared_w13_scale", sc_view), ("shared_w2_scale", sc_view),
                # tensor parallelism: the rank's communicator (0: none), its output
                ("tp_comm", c_uint64), ("tp_output", c_int),
                # expert parallelism: the rank's communicator (0: none), the exchange's mode,
                # the low-latency packets' rows, each expert's rank (NULL: contiguous)
                ("ep_comm", c_uint64), ("ep_mode", c_int), ("ep_max_tokens", c_int),
                ("ep_owner", POINTER(c_int32))]


SC_MOE_SOFTMAX, SC_MOE_SIGMOID = 0, 1
SC_MOE_BACKEND_AUTO, SC_MOE_BACKEND_MMA, SC_MOE_BACKEND_SM90 = 0, 1, 2
SC_MOE_SILU, SC_MOE_GELU_TANH, SC_MOE_SWIGLU_CLAMP = 0, 1, 2
SC_MOE_W13_STACKED, SC_MOE_W13_INTERLEAVED = 0, 1
SC_MOE_TP_ALL_REDUCE, SC_MOE_TP_REDUCE_SCATTER = 0, 1
SC_MOE_EP_NORMAL, SC_MOE_EP_LOW_LATENCY = 0, 1
SC_MOE_MAX_EXPERTS, SC_MOE_MAX_TOPK, SC_MOE_MAX_SHARED = 512, 16, 16
SC_MOE_MAX_STEPS = 16


class sc_moe_profile(Structure):
    _fields_ = [("steps", c_int), ("name", c_char_p * SC_MOE_MAX_STEPS),
                ("ms", c_float * SC_MOE_MAX_STEPS), ("total_ms", c_float)]


class sc_moe_forward_desc(Structure):
    _fields_ = [("expert_ids", sc_view), ("expert_weights", sc_view),
                ("profile", POINTER(sc_moe_profile)),
                ("routing_ids", sc_view), ("routing_weights", sc_view),
                ("check_routing", c_bool), ("accumulate", c_bool)]


# quant.h


class sc_quant_desc(Structure):
    _fields_ = [("rows", c_uint64), ("cols", c_uint64), ("batch", c_uint64)]


SC_QUANT_BLOCK = 128

# interop.h and dlpack.h

release_fn = CFUNCTYPE(None, c_void_p)


class sc_borrow_desc(Structure):
    _fields_ = [("dtype", c_int), ("count", c_uint64), ("label", c_char_p),
                ("stream", c_uint64), ("read_only", c_bool), ("release", release_fn),
                ("release_user", c_void_p)]


# comm.h
SC_COMM_ID_BYTES = 128
SC_COMM_DEFAULT_TIMEOUT_MS = 600000


class sc_comm_id(Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * SC_COMM_ID_BYTES)]


class sc_comm_desc(Structure):
    _fields_ = [("unique_id", sc_comm_id), ("nranks", c_int), ("rank", c_int),
                ("timeout_ms", c_uint32), ("label", c_char_p)]


class sc_comm_all_desc(Structure):
    _fields_ = [("timeout_ms", c_uint32), ("label", c_char_p)]


class sc_comm_props(Structure):
    _fields_ = [("rank", c_int), ("nranks", c_int), ("device", c_int), ("timeout_ms", c_uint32),
                ("context", c_uint64), ("label", c_char * 64), ("file", c_char_p),
                ("line", c_int), ("aborted", c_bool)]


class sc_buffer_origin(Structure):
    _fields_ = [("borrowed", c_bool), ("read_only", c_bool), ("exports", c_uint32)]


class sc_dlpack_import_desc(Structure):
    _fields_ = [("label", c_char_p), ("stream", c_uint64), ("read_only", c_bool)]


SC_DLPACK_MAX_DIMS = 8


class sc_dlpack_export_desc(Structure):
    _fields_ = [("ndim", c_int), ("shape", c_int64 * SC_DLPACK_MAX_DIMS),
                ("read_only", c_bool), ("stream", c_uint64), ("no_sync", c_bool)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensorVersioned(Structure):
    pass


dl_versioned_deleter = CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p),
                                     ("deleter", dl_versioned_deleter), ("flags", c_uint64),
                                     ("dl_tensor", DLTensor)]


class DLManagedTensor(Structure):
    pass


dl_legacy_deleter = CFUNCTYPE(None, POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p),
                            ("deleter", dl_legacy_deleter)]

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
DLPACK_FLAG_BITMASK_READ_ONLY = 1

log_fn = CFUNCTYPE(None, c_int, c_char_p, c_void_p)

# ---- function signatures ----------------------------------------------------------------

S = c_int  # sc_status
H = c_uint64  # any handle
P = POINTER
u64p = P(c_uint64)
site = (c_void_p, c_int)  # const char *file, int line (an interned C string: see intern_file)

SIGNATURES = {
    "sc_status_name": (c_char_p, [c_int]),
    "sc_last_error": (c_char_p, []),
    "sc_clear_error": (None, []),
    "sc_set_log_callback": (None, [log_fn, c_void_p]),
    "sc_version_string": (c_char_p, []),
    "sc_init": (S, []),
    "sc_driver_version": (S, [P(c_int)]),
    "sc_driver_path": (S, [c_char_p, c_size_t]),
    "sc_compiler_version": (S, [P(c_int), P(c_int)]),
    "sc_compiler_path": (S, [c_char_p, c_size_t]),
    "sc_device_count": (S, [P(c_int)]),
    "sc_device_info": (S, [c_int, P(sc_device_props)]),
    "sc_device_memory": (S, [c_int, u64p, u64p]),
    "sc_context_create_at": (S, [P(sc_context_desc), u64p, *site]),
    "sc_context_destroy": (S, [H]),
    "sc_context_device": (S, [H, P(c_int)]),
    "sc_context_synchronize": (S, [H]),
    "sc_context_check": (S, [H]),
    "sc_context_live_objects": (S, [H, P(sc_object_info), c_size_t, P(c_size_t)]),
    "sc_context_live_report": (S, [H, P(c_size_t)]),
    "sc_context_memory": (S, [H, P(sc_memory_stats)]),
    "sc_context_trim": (S, [H]),
    "sc_dtype_size": (c_size_t, [c_int]),
    "sc_dtype_name": (c_char_p, [c_int]),
    "sc_stream_create_at": (S, [H, P(sc_stream_desc), u64p, *site]),
    "sc_stream_destroy": (S, [H]),
    "sc_context_default_stream": (S, [H, u64p]),
    "sc_stream_synchronize": (S, [H]),
    "sc_stream_query": (S, [H]),
    "sc_stream_wait": (S, [H, H]),
    "sc_stream_priority": (S, [H, P(c_int)]),
    "sc_event_create_at": (S, [H, P(sc_event_desc), u64p, *site]),
    "sc_event_destroy": (S, [H]),
    "sc_event_record": (S, [H, H]),
    "sc_event_synchronize": (S, [H]),
    "sc_event_query": (S, [H]),
    "sc_event_elapsed": (S, [H, H, P(c_float)]),
    "sc_buffer_create_at": (S, [H, P(sc_buffer_desc), u64p, *site]),
    "sc_buffer_destroy": (S, [H]),
    "sc_buffer_info": (S, [H, P(sc_buffer_props)]),
    "sc_buffer_device_ptr": (S, [H, u64p]),
    "sc_buffer_view": (S, [H, c_uint64, c_uint64, P(sc_view)]),
    "sc_view_sub": (S, [sc_view, c_uint64, c_uint64, P(sc_view)]),
    "sc_copy_from_host": (S, [H, sc_view, c_void_p, c_uint64]),
    "sc_copy_to_host": (S, [H, c_void_p, c_uint64, sc_view]),
    "sc_copy": (S, [H, sc_view, sc_view]),
    "sc_fill": (S, [H, sc_view, c_void_p]),
    "sc_program_create_at": (S, [H, P(sc_program_desc), u64p, *site]),
    "sc_program_destroy": (S, [H]),
    "sc_program_info": (S, [H, P(sc_program_props)]),
    "sc_program_log": (S, [H, c_char_p, c_size_t, P(c_size_t)]),
    "sc_program_image": (S, [H, P(c_void_p), u64p]),
    "sc_program_lowered_name": (S, [H, c_char_p, P(c_char_p)]),
    "sc_module_load_at": (S, [H, H, u64p, *site]),
    "sc_module_load_image_at": (S, [H, c_void_p, c_uint64, u64p, *site]),
    "sc_module_load_file_at": (S, [H, c_char_p, u64p, *site]),
    "sc_module_destroy": (S, [H]),
    "sc_module_kernel_names": (S, [H, P(c_char_p), c_size_t, P(c_size_t)]),
    "sc_kernel_get_at": (S, [H, c_char_p, u64p, *site]),
    "sc_kernel_info": (S, [H, P(sc_kernel_props)]),
    "sc_kernel_set_max_dynamic_shared": (S, [H, c_int]),
    "sc_kernel_occupancy": (S, [H, c_int, c_uint64, P(c_int)]),
    "sc_launch_config_for": (S, [c_uint64, H, P(sc_launch_desc)]),
    "sc_kernel_launch": (S, [H, H, P(sc_launch_desc), P(sc_arg), c_size_t]),
    "sc_tensor_map_encode": (S, [sc_view, P(sc_tensor_map_desc), c_void_p]),
    "sc_moe_create_at": (S, [H, P(sc_moe_desc), u64p, *site]),
    "sc_moe_destroy": (S, [H]),
    "sc_moe_forward": (S, [H, H, sc_view, sc_view, P(sc_moe_forward_desc)]),
    "sc_moe_route": (S, [H, H, sc_view, sc_view, sc_view]),
    "sc_moe_routing_check": (S, [H, H]),
    "sc_moe_reserve": (S, [H, H, c_uint64]),
    "sc_moe_workspace_bytes": (S, [H, u64p]),
    # quant.h
    "sc_quantize_fp8_blocks": (S, [H, P(sc_quant_desc), sc_view, sc_view, sc_view]),
    "sc_dequantize_fp8_blocks": (S, [H, P(sc_quant_desc), sc_view, sc_view, sc_view]),
    "sc_quantize_fp8_tokens": (S, [H, P(sc_quant_desc), sc_view, sc_view, sc_view]),
    "sc_dequantize_fp8_tokens": (S, [H, P(sc_quant_desc), sc_view, sc_view, sc_view]),
    # interop.h
    "sc_stream_wrap_at": (S, [H, c_uint64, c_char_p, u64p, *site]),
    "sc_stream_cu_handle": (S, [H, u64p]),
    "sc_stream_is_wrapped": (S, [H, P(c_bool)]),
    "sc_buffer_borrow_at": (S, [H, c_uint64, P(sc_borrow_desc), u64p, *site]),
    "sc_buffer_get_origin": (S, [H, P(sc_buffer_origin)]),
    "sc_buffer_from_dlpack_at": (S, [H, c_void_p, P(sc_dlpack_import_desc), u64p, *site]),
    "sc_view_to_dlpack_at": (S, [sc_view, P(sc_dlpack_export_desc),
                                 P(P(DLManagedTensorVersioned)), *site]),
    "sc_dtype_to_dlpack": (S, [c_int, P(DLDataType)]),
    # comm.h
    "sc_comm_library_version": (S, [P(c_int)]),
    "sc_comm_library_path": (S, [c_char_p, c_size_t]),
    "sc_comm_unique_id": (S, [P(sc_comm_id)]),
    "sc_comm_create_at": (S, [H, P(sc_comm_desc), u64p, *site]),
    "sc_comm_create_all_at": (S, [u64p, c_int, P(sc_comm_all_desc), u64p, *site]),
    "sc_comm_destroy": (S, [H]),
    "sc_comm_abort": (S, [H]),
    "sc_comm_info": (S, [H, P(sc_comm_props)]),
    "sc_comm_synchronize": (S, [H]),
    "sc_comm_query": (S, [H]),
    "sc_comm_all_reduce": (S, [H, H, sc_view, sc_view, c_int]),
    "sc_comm_reduce_scatter": (S, [H, H, sc_view, sc_view, c_int]),
    "sc_comm_all_gather": (S, [H, H, sc_view, sc_view]),
    "sc_comm_all_to_all": (S, [H, H, sc_view, sc_view]),
    "sc_comm_all_to_all_v": (S, [H, H, sc_view, u64p, u64p, sc_view, u64p, u64p]),
    "sc_comm_send": (S, [H, H, sc_view, c_int]),
    "sc_comm_recv": (S, [H, H, sc_view, c_int]),
    "sc_comm_group_begin": (S, []),
    "sc_comm_group_end": (S, []),
    "sc_dtype_from_dlpack": (S, [DLDataType, P(c_int)]),
}


def library_path():
    """The libsafecuda this package loads: $SAFECUDA_LIBRARY, else the one installed in the
    package folder (pip install), else a build folder of the checkout it came from."""
    env = os.environ.get("SAFECUDA_LIBRARY")
    if env:
        return env
    here = os.path.join(PACKAGE_DIR, "libsafecuda.so")
    if os.path.exists(here):
        return here
    # Run from the checkout (PYTHONPATH=python): the usual build folders.
    root = os.path.dirname(os.path.dirname(PACKAGE_DIR))
    for build in ("build", "build-gpu"):
        p = os.path.join(root, build, "libsafecuda.so")
        if os.path.exists(p):
            return p
    return here


class Library:
    """The loaded libsafecuda. Each function is looked up and given its signature on first
    use, so a library without some function still loads (that function's use raises
    MissingSymbolError)."""

    def __init__(self, path):
        self.path = path
        try:
            self.dll = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        except OSError as exc:
            raise ImportError(
                f"safecuda: cannot load the C library {path}: {exc}. Reinstall the package "
                f"(pip install ./python from the safecuda checkout) or set SAFECUDA_LIBRARY "
                f"to a libsafecuda.so") from exc

    def __getattr__(self, name):
        sig = SIGNATURES.get(name)
        if sig is None:
            raise AttributeError(name)
        try:
            fn = getattr(self.dll, name)
        except AttributeError:
            raise MissingSymbolError(name, self.path) from None
        fn.restype, fn.argtypes = sig[0], sig[1]
        setattr(self, name, fn)
        return fn

    def has(self, name):
        try:
            getattr(self, name)
            return True
        except MissingSymbolError:
            return False


lib = Library(library_path())


def last_error():
    m = lib.sc_last_error()
    return m.decode("utf-8", "replace") if m else ""


def fail(status):
    """Raise the exception of a failed call (the calling thread's message)."""
    raise error(status, last_error())


# ---- creation sites ---------------------------------------------------------------------
# The library keeps the file pointer it is given for the life of the process (messages
# about a destroyed handle still name its creation site), so file names are copied once
# into memory that is never freed.

_libc = ctypes.CDLL(None)
_strdup = _libc.strdup
_strdup.restype = c_void_p
_strdup.argtypes = [c_char_p]
_files = {}


def intern_c_string(text):
    """A NUL-terminated copy of text that lives as long as the process."""
    p = _files.get(text)
    if p is None:
        p = _strdup(text.encode("utf-8", "replace"))
        if not p:
            raise MemoryError("strdup")
        _files[text] = p
    return p


def caller_site(depth=2):
    """(file, line) of the first frame outside this package, for the *_at functions."""
    try:
        f = sys._getframe(depth)
        while f is not None and f.f_code.co_filename.startswith(PACKAGE_DIR):
            f = f.f_back
        if f is None:
            return intern_c_string("<python>"), 0
        return intern_c_string(f.f_code.co_filename), f.f_lineno
    except Exception:  # noqa: BLE001 - a site is information, never a failure
        return intern_c_string("<python>"), 0


def label_bytes(label):
    return None if label is None else str(label).encode("utf-8", "replace")
