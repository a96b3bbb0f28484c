"""FP8 (e4m3) quantization with one float32 scale per block (include/safecuda/quant.h), of
safecuda buffers and views or of CUDA torch tensors (torch is imported only for those).

    q, scale = safecuda.quantize_fp8_blocks(w)    # w bf16 [rows, cols] or [E, rows, cols]
    w2 = safecuda.dequantize_fp8_blocks(q, scale)  # bf16 (dtype="f32" for float32)
    q, scale = safecuda.quantize_fp8_tokens(x)    # x bf16 [..., H]: per token per 128

Weights in 128 x 128 blocks (scale [.., ceil(rows / 128), ceil(cols / 128)], a checkpoint's
weight_scale_inv: w ~ q * scale), activations in 1 x 128 groups (scale [..., ceil(H / 128)]).
The rule and its treatment of NaN and infinities are quant.h's: scale = amax / 448,
q = e4m3(v * (448 / amax)), to nearest even, saturating, bit for bit the same everywhere.

safecuda objects: the results are new Buffers in the input's context (or the views given as
q=, scale=, out=), on `stream` (None: the context's default stream). torch tensors: new
tensors (torch.float8_e4m3fn and float32; bfloat16 or float32 back) on the input's device,
computed on torch's current stream, the tensors borrowed without a copy (a non-contiguous
input is made contiguous first). Needs a GPU of compute capability 8.9 or newer.
"""

from ctypes import byref, c_uint64

from ._core import Buffer, View, _check, _stream_handle, default_context
from ._dtype import DType, as_dtype
from ._lib import (caller_site, fail, intern_c_string, lib, sc_borrow_desc, sc_quant_desc,
                   sc_view)

BLOCK = 128

__all__ = ["dequantize_fp8_blocks", "dequantize_fp8_tokens", "quantize_fp8_blocks",
           "quantize_fp8_tokens"]


def _blocks(n):
    return (n + BLOCK - 1) // BLOCK


def _is_torch(t):
    return type(t).__module__.split(".")[0] == "torch" and hasattr(t, "data_ptr")


def _shapes(fn, shape, tokens):
    """(batch, rows, cols) of a tensor shape, and its scales' shape."""
    shape = tuple(int(s) for s in shape)
    if tokens:
        if len(shape) < 1:
            raise ValueError(f"{fn}: x must be [..., H]; got a scalar")
        rows = 1
        for s in shape[:-1]:
            rows *= s
        return (1, rows, shape[-1]), shape[:-1] + (_blocks(shape[-1]),)
    if len(shape) not in (2, 3):
        raise ValueError(f"{fn}: w must be [rows, cols] or [batch, rows, cols]; got "
                         f"{list(shape)}")
    batch = shape[0] if len(shape) == 3 else 1
    rows, cols = shape[-2], shape[-1]
    return (batch, rows, cols), shape[:-2] + (_blocks(rows), _blocks(cols))


def _desc(dims):
    batch, rows, cols = dims
    return sc_quant_desc(rows, cols, batch)


# ---- safecuda buffers and views ------------------------------------------------------------


def _view(fn, name, v):
    if not isinstance(v, View):
        raise TypeError(f"{fn}: {name} must be a safecuda Buffer or View, or a CUDA torch "
                        f"tensor; got {type(v).__name__}")
    return v


def _output(fn, name, given, ctx, shape, dtype, stream, made):
    """The view given for an output, or a new Buffer of shape (kept in made)."""
    if given is not None:
        return _view(fn, name, given)
    b = Buffer(ctx, shape, dtype, stream=stream, _site=caller_site())
    made.append(b)
    return b


def _call(c_fn, stream, dims, views, made):
    try:
        _check(c_fn(_stream_handle(stream), byref(_desc(dims)), *(v._sv for v in views)))
    except BaseException:
        for b in made:
            b.close()
        raise


def _quantize_views(fn, c_fn, x, q, scale, stream, tokens):
    x = _view(fn, "x" if tokens else "w", x)
    dims, scale_shape = _shapes(fn, x.shape, tokens)
    made = []
    q = _output(fn, "q", q, x.context, x.shape, DType.F8E4M3, stream, made)
    scale = _output(fn, "scale", scale, x.context, scale_shape, DType.F32, stream, made)
    _call(c_fn, stream, dims, (x, q, scale), made)
    return q, scale


def _dequantize_views(fn, c_fn, q, scale, dtype, out, stream, tokens):
    q = _view(fn, "q", q)
    scale = _view(fn, "scale", scale)
    dims, _ = _shapes(fn, q.shape, tokens)
    made = []
    out = _output(fn, "out", out, q.context, q.shape, dtype, stream, made)
    _call(c_fn, stream, dims, (q, scale, out), made)
    return out


# ---- torch tensors ---------------------------------------------------------------------------

_SITE_FILE = None


def _torch_dtype(torch, dtype):
    return {DType.BF16: torch.bfloat16, DType.F32: torch.float32,
            DType.F8E4M3: _float8(torch)}[dtype]


def _float8(torch):
    t = getattr(torch, "float8_e4m3fn", None)
    if t is None:
        raise TypeError(f"safecuda: torch {torch.__version__} has no float8_e4m3fn (torch "
                        f">= 2.1 has)")
    return t


def _check_tensor(fn, name, t, want, torch, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch tensor like the other arguments, not "
                        f"{type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"{fn}: {name} is on {t.device}, not a CUDA device")
    if device is not None and t.device != device:
        raise ValueError(f"{fn}: {name} is on {t.device}, the other tensors on {device}")
    if t.dtype != want:
        raise TypeError(f"{fn}: {name} is {t.dtype}; it must be {want}")
    return t.contiguous()


def _torch_run(fn, c_fn, tensors, dims):
    """c_fn over the tensors ((tensor, DType, read_only) each), borrowed on torch's current
    stream of their device."""
    import torch
    global _SITE_FILE
    if _SITE_FILE is None:
        _SITE_FILE = intern_c_string(__file__)
    dev = tensors[0][0].device
    ctx = default_context(dev.index)
    cu = torch.cuda.current_stream(dev).cuda_stream
    st = ctx._wrapped.get(cu)
    if st is None:
        st = ctx.wrap_stream(cu)
    handles, views = [], []
    try:
        for i, (t, dtype, read_only) in enumerate(tensors):
            d = sc_borrow_desc(int(dtype), t.numel(), None, st._h, read_only)
            h = c_uint64()
            r = lib.sc_buffer_borrow_at(ctx._h, t.data_ptr(), byref(d), byref(h), _SITE_FILE,
                                        i + 1)
            if r:
                fail(r)
            handles.append(h.value)
            views.append(sc_view(h.value, 0, t.numel()))
        r = c_fn(st._h, byref(_desc(dims)), *views)
        if r:
            fail(r)
    finally:
        # Borrowed without a release: the destroys forget the memory (torch's, used on this
        # same stream) once safecuda's work on it is ordered.
        for h in handles:
            lib.sc_buffer_destroy(h)


def _quantize_torch(fn, c_fn, x, tokens):
    import torch
    x = _check_tensor(fn, "x" if tokens else "w", x, torch.bfloat16, torch)
    dims, scale_shape = _shapes(fn, x.shape, tokens)
    q = torch.empty(x.shape, dtype=_float8(torch), device=x.device)
    scale = torch.empty(scale_shape, dtype=torch.float32, device=x.device)
    if x.numel():
        _torch_run(fn, c_fn, ((x, DType.BF16, True), (q, DType.F8E4M3, False),
                              (scale, DType.F32, False)), dims)
    return q, scale


def _dequantize_torch(fn, c_fn, q, scale, dtype, tokens):
    import torch
    q = _check_tensor(fn, "q", q, _float8(torch), torch)
    scale = _check_tensor(fn, "scale", scale, torch.float32, torch, q.device)
    dims, scale_shape = _shapes(fn, q.shape, tokens)
    if tuple(scale.shape) != tuple(scale_shape):
        raise ValueError(f"{fn}: scale must be {list(scale_shape)} for q {list(q.shape)}; "
                         f"got {list(scale.shape)}")
    out = torch.empty(q.shape, dtype=_torch_dtype(torch, dtype), device=q.device)
    if q.numel():
        _torch_run(fn, c_fn, ((q, DType.F8E4M3, True), (scale, DType.F32, True),
                              (out, dtype, False)), dims)
    return out


def _out_dtype(fn, dtype):
    d = as_dtype(dtype)
    if d not in (DType.BF16, DType.F32):
        raise ValueError(f"{fn}: dtype is bf16 or f32, not {d}")
    return d


# ---- the functions ---------------------------------------------------------------------------


def quantize_fp8_blocks(w, *, q=None, scale=None, stream=None):
    """(q, scale) of w, bf16 [rows, cols] or [batch, rows, cols], in 128 x 128 blocks: q
    float8 e4m3 of w's shape, scale float32 [(batch,) ceil(rows / 128), ceil(cols / 128)]
    with w ~ q * scale. A torch tensor gives torch tensors (q, scale= are for safecuda
    views only: outputs to write, e.g. views into one checkpoint buffer)."""
    fn = "quantize_fp8_blocks"
    if _is_torch(w):
        if q is not None or scale is not None or stream is not None:
            raise TypeError(f"{fn}: q=, scale= and stream= go with safecuda views; a torch "
                            f"tensor gets new tensors on torch's current stream")
        return _quantize_torch(fn, lib.sc_quantize_fp8_blocks, w, False)
    return _quantize_views(fn, lib.sc_quantize_fp8_blocks, w, q, scale, stream, False)


def quantize_fp8_tokens(x, *, q=None, scale=None, stream=None):
    """(q, scale) of x, bf16 [..., H], per token (row) per 128 channels: q float8 e4m3 of
    x's shape, scale float32 [..., ceil(H / 128)]."""
    fn = "quantize_fp8_tokens"
    if _is_torch(x):
        if q is not None or scale is not None or stream is not None:
            raise TypeError(f"{fn}: q=, scale= and stream= go with safecuda views; a torch "
                            f"tensor gets new tensors on torch's current stream")
        return _quantize_torch(fn, lib.sc_quantize_fp8_tokens, x, True)
    return _quantize_views(fn, lib.sc_quantize_fp8_tokens, x, q, scale, stream, True)


def dequantize_fp8_blocks(q, scale, *, dtype="bf16", out=None, stream=None):
    """q * the scale of its 128 x 128 block, as bf16 (or dtype="f32"), of q's shape."""
    fn = "dequantize_fp8_blocks"
    d = _out_dtype(fn, dtype)
    if _is_torch(q):
        if out is not None or stream is not None:
            raise TypeError(f"{fn}: out= and stream= go with safecuda views")
        return _dequantize_torch(fn, lib.sc_dequantize_fp8_blocks, q, scale, d, False)
    return _dequantize_views(fn, lib.sc_dequantize_fp8_blocks, q, scale, d, out, stream, False)


def dequantize_fp8_tokens(q, scale, *, dtype="bf16", out=None, stream=None):
    """q * the scale of its token's 128 channels, as bf16 (or dtype="f32"), of q's shape."""
    fn = "dequantize_fp8_tokens"
    d = _out_dtype(fn, dtype)
    if _is_torch(q):
        if out is not None or stream is not None:
            raise TypeError(f"{fn}: out= and stream= go with safecuda views")
        return _dequantize_torch(fn, lib.sc_dequantize_fp8_tokens, q, scale, d, True)
    return _dequantize_views(fn, lib.sc_dequantize_fp8_tokens, q, scale, d, out, stream, True)
