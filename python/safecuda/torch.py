"""safecuda for PyTorch (imported on use: `import safecuda.torch`; needs torch >= 2.4).

- MoE: the fused Mixture-of-Experts layer as an nn.Module, over the model's own bf16 weight
  tensors, or float8_e4m3fn experts with the block scales of an FP8 checkpoint (borrowed
  through DLPack, never copied), callable on a bf16 CUDA tensor [..., H].
  It runs on torch's current stream (wrapped as a safecuda stream), inside
  torch.cuda.graph captures (its workspace is reserved for max_tokens tokens when it is
  built: a forward of more tokens inside a capture is refused with CaptureError) and
  under torch.compile, where it is one opaque operator. The options of
  include/safecuda/moe.h (grouped routing, routed scaling, activations, W13 layouts,
  biases, a shared expert) under their C names; the caller's routing; out += layer(x).
- The operators, registered with torch.library.custom_op and a fake (shape)
  implementation; `layer` is the int id of a layer (MoE.layer_id):
    torch.ops.safecuda.moe(x, layer) -> out
    torch.ops.safecuda.moe_routed(x, layer) -> (out, expert_ids i32 [T, k],
        expert_weights f32 [T, k])
    torch.ops.safecuda.moe_route(x, layer) -> (expert_ids, expert_weights): the routing
        alone
    torch.ops.safecuda.moe_with_routing(x, layer, routing_ids, routing_weights,
        check_routing=False) -> out: the caller's routing (i32 / f32 [T, k])
    torch.ops.safecuda.moe_accumulate(x, layer, out, routing_ids=None,
        routing_weights=None, check_routing=False): out += layer(x), in place (out is
        declared mutated)
- from_transformers(block), patch_model(model), unpatch_model(model), moe_spec(block):
  the layer in a Hugging Face transformers model (safecuda/_hf.py); tp_comm= for tensor
  parallelism, shard_for_tp(kwargs, rank, nranks): a rank's shard of MoE's weights;
  ep_comm= for expert parallelism, shard_for_ep(kwargs, rank, nranks, owner): a rank's
  experts.
- Comm.from_process_group(pg): a communicator (safecuda.Comm) for this rank of a
  torch.distributed process group, its collectives on torch CUDA tensors on torch's current
  stream (all_reduce, reduce_scatter, all_gather, all_to_all, all_to_all_v with split
  sizes, send, recv; safecuda/_torch_comm.py).
- as_buffer(tensor) / as_tensor(view): zero-copy exchange of CUDA memory both ways (fp8
  too: torch.float8_e4m3fn <-> f8e4m3, torch.float8_e5m2 <-> f8e5m2, carried as uint8
  bits through DLPack, which many torch versions refuse for fp8); torch_dtype(dtype):
  the torch dtype of a safecuda dtype.

The layer keeps references to the weight tensors; it reads them where they were when it
was built, so build a new layer after moving or converting them. It is forward-only (no
autograd formula). Keep the module alive while a CUDA graph that captured it may be
replayed: its workspace goes with it.
"""

import atexit
import itertools
import threading
import weakref
from ctypes import byref, c_uint64
from typing import Optional, Tuple

try:
    import torch
except ModuleNotFoundError as _exc:
    if _exc.name != "torch":
        raise  # torch is there and one of its own imports failed: its error says which
    raise ModuleNotFoundError(
        "safecuda.torch needs PyTorch (torch >= 2.4), which is not installed: pip install "
        "torch (https://pytorch.org/get-started/ names the build for your CUDA driver); "
        "import safecuda (without .torch) needs no torch", name="torch") from None
from torch import Tensor

from . import _lib
from ._core import Buffer, Stream, default_context
from ._dtype import DType, as_dtype
from ._lib import fail, intern_c_string, lib, sc_borrow_desc, sc_view
from ._moe import MoE as _MoE
from ._torch_args import OPTIONAL_TENSORS as _OPTIONAL_TENSORS
from ._torch_args import OPTIONS as _OPTIONS
from ._torch_args import check_layer_args

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"safecuda.torch needs torch >= 2.4 (torch.library.custom_op); this is "
                      f"torch {torch.__version__}")

__all__ = ["Comm", "MoE", "MoESpec", "PatchReport", "TransformersMoE", "UnsupportedBlockError",
           "as_buffer", "as_tensor", "from_transformers", "moe", "moe_accumulate", "moe_route",
           "moe_routed", "moe_spec", "moe_with_routing", "patch_model", "shard_for_ep",
           "shard_for_tp", "torch_dtype", "unpatch_model"]

_layers = {}  # layer id -> _Layer
_layer_ids = itertools.count(1)
_SITE_FILE = intern_c_string(__file__)


# torch's names of safecuda's dtypes (getattr: the unsigned 16- to 64-bit types came in
# torch 2.3, fp8 in 2.1).
_TORCH_NAMES = {DType.U8: "uint8", DType.I8: "int8", DType.U16: "uint16", DType.I16: "int16",
                DType.U32: "uint32", DType.I32: "int32", DType.U64: "uint64",
                DType.I64: "int64", DType.F16: "float16", DType.BF16: "bfloat16",
                DType.F32: "float32", DType.F64: "float64",
                DType.F8E4M3: "float8_e4m3fn", DType.F8E5M2: "float8_e5m2"}
_FP8 = (DType.F8E4M3, DType.F8E5M2)


def torch_dtype(dtype):
    """The torch dtype of a safecuda dtype (anything as_dtype takes): torch.float32 for
    f32, torch.float8_e4m3fn for f8e4m3, torch.float8_e5m2 for f8e5m2, ... TypeError
    where this torch has none. (The other way is safecuda.as_dtype(torch_dtype).)"""
    d = as_dtype(dtype)
    t = getattr(torch, _TORCH_NAMES[d], None)
    if not isinstance(t, torch.dtype):
        raise TypeError(f"torch_dtype: torch {torch.__version__} has no torch."
                        f"{_TORCH_NAMES[d]} for safecuda's {d}")
    return t


def _fp8_dtype(tdtype):
    """The safecuda fp8 DType of a torch dtype, None for the others."""
    for d in _FP8:
        if getattr(torch, _TORCH_NAMES[d], None) == tdtype:
            return d
    return None


class _Fp8AsBytes:
    """An fp8 view as a DLPack producer of uint8 bits (its export retyped), for torch
    versions whose DLPack import refuses the fp8 codes."""

    def __init__(self, view):
        self._view = view

    def __dlpack_device__(self):
        return self._view.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        from ._dlpack import retype_capsule
        return retype_capsule(self._view.__dlpack__(**kwargs), DType.U8)


def as_buffer(tensor, *, context=None, read_only=False, label=None):
    """A CUDA tensor as a safecuda Buffer of the same memory and shape (no copy), ordered
    on torch's current stream (its owner stream). The buffer holds the tensor until it is
    closed. An fp8 tensor (torch.float8_e4m3fn, torch.float8_e5m2) gives a buffer of
    f8e4m3 / f8e5m2 (its bits cross as uint8)."""
    if not tensor.is_cuda:
        raise ValueError(f"as_buffer: the tensor is on {tensor.device}, not a CUDA device")
    ctx = context if context is not None else default_context(tensor.device.index)
    stream = Stream.from_torch(torch.cuda.current_stream(tensor.device), context=ctx)
    fp8 = _fp8_dtype(tensor.dtype)
    src = tensor.detach()
    if fp8 is not None:
        src = src.view(torch.uint8)
    return Buffer.from_dlpack(src, context=ctx, stream=stream, read_only=read_only,
                              label=label, dtype=fp8)


def as_tensor(view):
    """A safecuda view (or buffer) as a torch tensor of the same memory (no copy), ordered
    after safecuda's pending work on it on torch's current stream (torch.from_dlpack). An
    fp8 view gives a torch.float8_e4m3fn / torch.float8_e5m2 tensor (its bits cross as
    uint8)."""
    if view.dtype in _FP8:
        raw = torch.utils.dlpack.from_dlpack(_Fp8AsBytes(view))
        return raw.view(torch_dtype(view.dtype))
    return torch.utils.dlpack.from_dlpack(view)


class _Layer:
    """One safecuda MoE layer over borrowed torch weights, and the per-call borrows."""

    def __init__(self, router, w13, w2, top_k, scoring, renormalize, selection_bias,
                 max_tokens, backend, label, **options):
        opts = dict(_OPTIONS)
        unknown = set(options) - set(opts)
        if unknown:
            raise TypeError(f"safecuda.torch.MoE: unknown option(s) {sorted(unknown)}")
        opts.update(options)
        a = check_layer_args(router, w13, w2, selection_bias, opts, backend)
        opts, selection_bias = a.opts, a.selection_bias
        dev = a.device
        self.device = dev
        self.ctx = ctx = default_context(dev.index)
        self.buffers = []
        named = {"router": router, "w13": w13, "w2": w2, "selection_bias": selection_bias}
        named.update((n, opts[n]) for n in _OPTIONAL_TENSORS if n != "selection_bias")
        borrowed = {}
        try:
            for name, t in named.items():
                if t is None:
                    borrowed[name] = None
                    continue
                # On torch's current stream, read-only, fp8 as its uint8 bits (as_buffer
                # detaches: the same storage, without the autograd record that keeps torch
                # from exporting a parameter).
                b = as_buffer(t, context=ctx, read_only=True,
                              label=f"{label or 'torch MoE'} {name}")
                self.buffers.append(b)
                borrowed[name] = b
            kw = {n: opts[n] for n in _OPTIONS}
            kw.update((n, borrowed[n]) for n in _OPTIONAL_TENSORS if n != "selection_bias")
            self.moe = _MoE(ctx, borrowed["router"], borrowed["w13"], borrowed["w2"],
                            top_k=top_k, scoring=scoring, renormalize=renormalize,
                            selection_bias=borrowed["selection_bias"], max_tokens=max_tokens,
                            label=label, backend=backend, **kw)
            # (a low-latency expert-parallel layer has room for its ep_max_tokens already,
            # and takes no more)
            if max_tokens and not (self.moe.ep_comm is not None and
                                   self.moe.ep_mode == "low_latency"):
                self.moe.reserve(max_tokens,
                                 stream=Stream.from_torch(torch.cuda.current_stream(dev),
                                                          context=ctx))
        except BaseException:
            self.close()
            raise
        self.E, self.H, self.I, self.top_k = a.E, a.H, a.I, int(top_k)
        # tensor parallel, reduce-scattered: the output is this rank's T / N rows
        self.out_div = self.moe._out_div
        # expert parallel: a step without tokens still takes part (empty views of this)
        self.ep = self.moe.ep_comm is not None
        self._empty = Buffer(ctx, (8,), DType.BF16, label="torch MoE empty step") \
            if self.ep else None
        self.shared_intermediate = a.S
        self.expert_dtype = a.expert_dtype
        # (a low-latency expert-parallel layer takes up to its ep_max_tokens per forward)
        self.max_tokens = int(opts["ep_max_tokens"]) if \
            self.ep and self.moe.ep_mode == "low_latency" else int(max_tokens)
        self.tensors = (router, w13, w2, selection_bias)
        self.named = {"router_weight": router, "w13": w13, "w2": w2,
                      "selection_bias": selection_bias}
        self.named.update((n, opts[n]) for n in _OPTIONAL_TENSORS if n != "selection_bias")
        self._tls = threading.local()
        self._ctx_h = ctx._h
        self._moe_h = self.moe._h

    def close(self):
        moe = getattr(self, "moe", None)
        if moe is not None:
            moe.close()
        empty = getattr(self, "_empty", None)
        if empty is not None:
            empty.close()
        for b in self.buffers:
            if b is not None:
                b.close()
        self.buffers = []

    def _scratch(self):
        """Per-thread borrow descs, handles and views (no allocation per call)."""
        s = getattr(self._tls, "s", None)
        if s is None:
            s = (sc_borrow_desc(int(DType.BF16), 0, None, 0, True),
                 sc_borrow_desc(int(DType.BF16), 0, None, 0, False),
                 sc_borrow_desc(int(DType.I32), 0, None, 0, False),
                 sc_borrow_desc(int(DType.F32), 0, None, 0, False),
                 c_uint64(), c_uint64(), c_uint64(), c_uint64(),
                 sc_view(), sc_view(), _lib.sc_moe_forward_desc())
            self._tls.s = s
        return s

    def run(self, x, routed):
        if x.dtype != torch.bfloat16 or not x.is_cuda or x.dim() != 2 or x.shape[1] != self.H:
            raise ValueError(f"safecuda.torch.MoE: x must be a bfloat16 CUDA tensor [T, "
                             f"{self.H}]; got {x.dtype} {tuple(x.shape)} on {x.device}")
        if x.device != self.device:
            raise ValueError(f"safecuda.torch.MoE: x is on {x.device}, the layer on "
                             f"{self.device}")
        if not x.is_contiguous():
            x = x.contiguous()
        T = x.shape[0]
        out = x.new_empty((T // self.out_div, self.H))
        ids = weights = None
        if routed:
            ids = torch.empty((T, self.top_k), dtype=torch.int32, device=x.device)
            weights = torch.empty((T, self.top_k), dtype=torch.float32, device=x.device)
        cu = _current_raw_stream(x.device.index)
        ctx = self.ctx
        if T == 0:
            self._empty_step(x)
            return (out, ids, weights) if routed else out
        st = ctx._wrapped.get(cu)
        if st is None:
            st = ctx.wrap_stream(cu)
        dx, do, di, dw, hx, ho, hi, hw, vx, vo, opts = self._scratch()
        n = T * self.H
        sh = st._h
        dx.count = do.count = n
        dx.stream = do.stream = sh
        borrow, destroy = lib.sc_buffer_borrow_at, lib.sc_buffer_destroy
        r = borrow(self._ctx_h, x.data_ptr(), byref(dx), byref(hx), _SITE_FILE, 1)
        if r:
            fail(r)
        hx_v, ho_v, hi_v, hw_v = hx.value, 0, 0, 0
        do.count = out.numel()
        try:
            r = borrow(self._ctx_h, out.data_ptr(), byref(do), byref(ho), _SITE_FILE, 2)
            if r:
                fail(r)
            ho_v = ho.value
            vx.buffer, vx.offset, vx.count = hx_v, 0, n
            vo.buffer, vo.offset, vo.count = ho_v, 0, out.numel()
            if routed:
                di.count = dw.count = T * self.top_k
                di.stream = dw.stream = sh
                r = borrow(self._ctx_h, ids.data_ptr(), byref(di), byref(hi), _SITE_FILE, 3)
                if r:
                    fail(r)
                hi_v = hi.value
                r = borrow(self._ctx_h, weights.data_ptr(), byref(dw), byref(hw), _SITE_FILE, 4)
                if r:
                    fail(r)
                hw_v = hw.value
                opts.expert_ids = sc_view(hi_v, 0, T * self.top_k)
                opts.expert_weights = sc_view(hw_v, 0, T * self.top_k)
                r = lib.sc_moe_forward(sh, self._moe_h, vx, vo, byref(opts))
            else:
                r = lib.sc_moe_forward(sh, self._moe_h, vx, vo, None)
            if r:
                fail(r)
        finally:
            # Borrowed without a release: the destroys forget the memory (torch's, on this
            # same stream) once safecuda's work on it is ordered.
            for h in (hx_v, ho_v, hi_v, hw_v):
                if h:
                    destroy(h)
        return (out, ids, weights) if routed else out

    # ---- the caller's routing, out += layer(x), the routing alone ----------------------

    def _check_x(self, x):
        if x.dtype != torch.bfloat16 or not x.is_cuda or x.dim() != 2 or x.shape[1] != self.H:
            raise ValueError(f"safecuda.torch.MoE: x must be a bfloat16 CUDA tensor [T, "
                             f"{self.H}]; got {x.dtype} {tuple(x.shape)} on {x.device}")
        if x.device != self.device:
            raise ValueError(f"safecuda.torch.MoE: x is on {x.device}, the layer on "
                             f"{self.device}")
        return x if x.is_contiguous() else x.contiguous()

    def _check_routing(self, T, ids, weights, x):
        k = self.top_k
        for name, t, dtype in (("routing_ids", ids, torch.int32),
                               ("routing_weights", weights, torch.float32)):
            if not isinstance(t, Tensor):
                raise TypeError(f"safecuda.torch.MoE: {name} must be a torch tensor, not "
                                f"{type(t).__name__}")
            if t.dtype != dtype or tuple(t.shape) != (T, k) or t.device != x.device or \
                    not t.is_contiguous():
                raise ValueError(f"safecuda.torch.MoE: {name} must be a contiguous {dtype} "
                                 f"tensor [T={T}, k={k}] on {x.device}; got {t.dtype} "
                                 f"{list(t.shape)} on {t.device}"
                                 f"{'' if t.is_contiguous() else ' (not contiguous)'}")

    def _stream(self, x):
        cu = _current_raw_stream(x.device.index)
        st = self.ctx._wrapped.get(cu)
        if st is None:
            st = self.ctx.wrap_stream(cu)
        return st._h

    def _borrow(self, t, dtype, read_only, stream, count, handles, line):
        d = sc_borrow_desc(int(dtype), count, None, stream, read_only)
        h = c_uint64()
        r = lib.sc_buffer_borrow_at(self._ctx_h, t.data_ptr(), byref(d), byref(h), _SITE_FILE,
                                    line)
        if r:
            fail(r)
        handles.append(h.value)
        return sc_view(h.value, 0, count)

    def _empty_step(self, x):
        """A forward without tokens: nothing, but an expert-parallel layer's step still
        takes part in the exchanges (every rank makes the same forwards)."""
        if not self.ep:
            return
        cu = _current_raw_stream(x.device.index)
        st = self.ctx._wrapped.get(cu) or self.ctx.wrap_stream(cu)
        empty = sc_view(self._empty._h, 0, 0)
        r = lib.sc_moe_forward(st._h, self._moe_h, empty, empty, None)
        if r:
            fail(r)

    def run_ex(self, x, out=None, ids=None, weights=None, check=False):
        """out = layer(x), or out += layer(x) when out is given (mutated in place, and
        returned); with the caller's routing when ids and weights are given."""
        x = self._check_x(x)
        T = x.shape[0]
        accumulate = out is not None
        if accumulate:
            want = [T // self.out_div, self.H]
            if not isinstance(out, Tensor) or out.dtype != torch.bfloat16 or \
                    list(out.shape) != want or out.device != x.device or \
                    not out.is_contiguous():
                what = "x's shape" if self.out_div == 1 else "this rank's rows' shape"
                raise ValueError(f"safecuda.torch.MoE: the tensor to accumulate into must be "
                                 f"a contiguous bfloat16 tensor of {what} {want} "
                                 f"on {x.device}; got {getattr(out, 'dtype', type(out))} "
                                 f"{list(getattr(out, 'shape', ()))}")
            if x.data_ptr() < out.data_ptr() + out.nbytes and \
                    out.data_ptr() < x.data_ptr() + x.nbytes:
                raise ValueError("safecuda.torch.MoE: the tensor to accumulate into overlaps x "
                                 "(the layer reads x while it writes the sum): give another "
                                 "tensor")
        else:
            out = x.new_empty((T // self.out_div, self.H))
        if (ids is None) != (weights is None):
            raise ValueError("safecuda.torch.MoE: routing_ids and routing_weights are given "
                             "together")
        if ids is not None:
            self._check_routing(T, ids, weights, x)
        if T == 0:
            self._empty_step(x)
            return out
        sh = self._stream(x)
        n, nk = T * self.H, T * self.top_k
        handles = []
        try:
            vx = self._borrow(x, DType.BF16, True, sh, n, handles, 5)
            vo = self._borrow(out, DType.BF16, False, sh, out.numel(), handles, 6)
            opts = _lib.sc_moe_forward_desc()
            if ids is not None:
                opts.routing_ids = self._borrow(ids, DType.I32, True, sh, nk, handles, 7)
                opts.routing_weights = self._borrow(weights, DType.F32, True, sh, nk, handles,
                                                    8)
            opts.check_routing = bool(check)
            opts.accumulate = accumulate
            r = lib.sc_moe_forward(sh, self._moe_h, vx, vo, byref(opts))
            if r:
                fail(r)
        finally:
            for h in handles:  # as in run(): forgotten once safecuda's work is ordered
                lib.sc_buffer_destroy(h)
        return out

    def route(self, x):
        """(expert ids i32 [T, k], weights f32 [T, k]) of the layer's router for x [T, H]."""
        x = self._check_x(x)
        T = x.shape[0]
        ids = torch.empty((T, self.top_k), dtype=torch.int32, device=x.device)
        weights = torch.empty((T, self.top_k), dtype=torch.float32, device=x.device)
        if T == 0:
            return ids, weights
        sh = self._stream(x)
        nk = T * self.top_k
        handles = []
        try:
            vx = self._borrow(x, DType.BF16, True, sh, T * self.H, handles, 9)
            vi = self._borrow(ids, DType.I32, False, sh, nk, handles, 10)
            vw = self._borrow(weights, DType.F32, False, sh, nk, handles, 11)
            r = lib.sc_moe_route(sh, self._moe_h, vx, vi, vw)
            if r:
                fail(r)
        finally:
            for h in handles:
                lib.sc_buffer_destroy(h)
        return ids, weights

    def routing_check(self, device):
        """Report (InvalidArgumentError) a routing id >= E met by an unchecked forward on
        torch's current stream since the last report; waits for that stream."""
        cu = _current_raw_stream(device.index)
        st = self.ctx._wrapped.get(cu)
        if st is None:
            st = self.ctx.wrap_stream(cu)
        r = lib.sc_moe_routing_check(st._h, self._moe_h)
        if r:
            fail(r)


def _current_stream_handle(index):
    return torch.cuda.current_stream(index).cuda_stream


# torch's current CUstream as an int without making a torch.cuda.Stream object (a few
# microseconds per call); the public call where this torch lacks the private one.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream_handle)


def _layer(layer_id):
    layer = _layers.get(int(layer_id))
    if layer is None:
        raise RuntimeError(f"safecuda.torch: no MoE layer {layer_id} (it was closed, or "
                           f"never made in this process)")
    return layer


@torch.library.custom_op("safecuda::moe", mutates_args=())
def moe(x: Tensor, layer: int) -> Tensor:
    """The MoE layer `layer` (MoE.layer_id) on x [T, H] (bf16, CUDA), on torch's current
    stream: a new tensor [T, H]."""
    return _layer(layer).run(x, False)


def _out_fake(x, layer):
    """The forward's new output for x [T, H]: [T, H], or a reduce-scattering tensor-parallel
    layer's [T / N, H]."""
    L = _layer(layer)
    return x.new_empty((x.shape[0] // L.out_div, x.shape[1]))


@moe.register_fake
def _moe_fake(x, layer):
    return _out_fake(x, layer)


@torch.library.custom_op("safecuda::moe_routed", mutates_args=())
def moe_routed(x: Tensor, layer: int) -> Tuple[Tensor, Tensor, Tensor]:
    """As moe, also giving the chosen experts (int32 [T, k]) and their routing weights
    (float32 [T, k]), in slot order."""
    return _layer(layer).run(x, True)


@moe_routed.register_fake
def _moe_routed_fake(x, layer):
    k = _layer(layer).top_k
    T = x.shape[0]
    return (_out_fake(x, layer),
            x.new_empty((T, k), dtype=torch.int32), x.new_empty((T, k), dtype=torch.float32))


@torch.library.custom_op("safecuda::moe_route", mutates_args=())
def moe_route(x: Tensor, layer: int) -> Tuple[Tensor, Tensor]:
    """The routing alone of layer `layer` for x [T, H]: the chosen experts (int32 [T, k])
    and their weights (float32 [T, k], renormalized and scaled as the forward uses them),
    in slot order."""
    return _layer(layer).route(x)


@moe_route.register_fake
def _moe_route_fake(x, layer):
    k = _layer(layer).top_k
    T = x.shape[0]
    return x.new_empty((T, k), dtype=torch.int32), x.new_empty((T, k), dtype=torch.float32)


@torch.library.custom_op("safecuda::moe_with_routing", mutates_args=())
def moe_with_routing(x: Tensor, layer: int, routing_ids: Tensor, routing_weights: Tensor,
                     check_routing: bool = False) -> Tensor:
    """The layer on x [T, H] with the caller's routing: expert ids (int32 [T, k]; < 0 a
    padded slot) and their weights (float32 [T, k], used as given). An id >= E is skipped
    and reported (InvalidArgumentError) by a call with check_routing=True (which waits
    for the stream) or by MoE.routing_check()."""
    return _layer(layer).run_ex(x, None, routing_ids, routing_weights, check_routing)


@moe_with_routing.register_fake
def _moe_with_routing_fake(x, layer, routing_ids, routing_weights, check_routing=False):
    return _out_fake(x, layer)


@torch.library.custom_op("safecuda::moe_accumulate", mutates_args=("out",))
def moe_accumulate(x: Tensor, layer: int, out: Tensor, routing_ids: Optional[Tensor] = None,
                   routing_weights: Optional[Tensor] = None,
                   check_routing: bool = False) -> None:
    """out += layer(x) in place (out: bfloat16 [T, H], contiguous, not overlapping x), the
    sum rounded once to bf16; with the caller's routing when routing_ids and
    routing_weights are given (as moe_with_routing)."""
    _layer(layer).run_ex(x, out, routing_ids, routing_weights, check_routing)


@moe_accumulate.register_fake
def _moe_accumulate_fake(x, layer, out, routing_ids=None, routing_weights=None,
                         check_routing=False):
    return None


def _plain_eager(x):
    """Whether a forward may run the operator's body directly, skipping the dispatcher's
    few microseconds: plain eager execution of a plain CUDA tensor that needs no gradient.
    Anything else (torch.compile, tracing, fake or functional tensors, dispatch and
    function modes, functorch transforms, autograd) goes through torch.ops.safecuda."""
    return (type(x) is Tensor and not _is_compiling() and not torch.jit.is_tracing() and
            _dispatch_depth() == 0 and not _function_mode() and
            not (x.requires_grad and torch.is_grad_enabled()) and not _wrapped(x))


def _no(*_):
    return False


def _ep_forward_body(module, *args):
    return module._forward(*args)


# An expert-parallel layer's forward runs outside any compiled graph (a graph break).
_ep_forward = torch.compiler.disable(_ep_forward_body) if hasattr(torch, "compiler") and \
    hasattr(torch.compiler, "disable") else _ep_forward_body


_is_compiling = getattr(torch.compiler, "is_compiling", _no)
_dispatch_depth = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)
_function_mode = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: True)
_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor",
                   lambda x: True)


def _release(layer_id):
    layer = _layers.pop(layer_id, None)
    if layer is not None:
        layer.close()


class MoE(torch.nn.Module):
    """A safecuda MoE layer over a model's weights, to swap into a PyTorch model:

        MoE(router_weight [E, H], w13 [E, 2I, H], w2 [E, H, I], top_k=k,
            scoring="softmax" | "sigmoid", renormalize=True, selection_bias=None (float32
            [E]), max_tokens=256, backend="auto", label=None,
            # the options of include/safecuda/moe.h, under their C names:
            n_group=0, topk_group=0, routed_scaling=0.0 (0: 1),
            activation="silu" | "gelu_tanh" | "swiglu_clamp",
            swiglu_alpha=None, swiglu_limit=None (swiglu_clamp's; None: 1.702 and 7.0),
            w13_layout="stacked" | "interleaved",
            router_bias=None (float32 [E]), w13_bias=None (float32 [E, 2I], in
            w13_layout), w2_bias=None (float32 [E, H]),
            shared_w13=None (bf16 [2 I_s, H], in w13_layout), shared_w2=None (bf16
            [H, I_s]), shared_gate=None (bf16 [H] or [1, H]), shared_intermediate=None
            (I_s: read from shared_w2),
            # fp8 experts (w13, w2, shared_w13, shared_w2 float8_e4m3fn): their scales
            w13_scale=None, w2_scale=None, shared_w13_scale=None, shared_w2_scale=None,
            # tensor parallelism: this rank's communicator, its output
            tp_comm=None, tp_output="all_reduce" | "reduce_scatter",
            # expert parallelism: this rank's communicator, the exchange, the experts' ranks
            ep_comm=None, ep_mode="normal" | "low_latency", ep_max_tokens=0,
            ep_owner=None)

    bf16 CUDA weights, contiguous, on one device, borrowed without a copy (so are the
    float32 biases and the shared expert's weights).

    fp8 experts, as a transformers fine-grained FP8 (DeepSeek-V3) checkpoint holds them:
    w13, w2 (and shared_w13, shared_w2) torch.float8_e4m3fn, each 128 x 128 block of a
    weight matrix with one float32 scale (the checkpoint's weight_scale_inv: weight = e4m3
    value x scale): w13_scale [E, 2I/128, H/128] (W13's row blocks in w13_layout order),
    w2_scale [E, H/128, I/128], shared_w13_scale [2 I_s/128, H/128], shared_w2_scale
    [H/128, I_s/128]. H and I are multiples of 128; the router, shared gate, biases, x and
    the output stay as above. The layer quantizes x per token and h per row, in blocks of
    128 channels (scale = amax / 448), and runs e4m3 tensor-core GEMMs: compute capability
    9.0 (H100, H200) only. Every weight argument is checked (dtype, shape, contiguity,
    device) before anything is borrowed: TypeError or ValueError naming it. forward(x) takes a bf16 CUDA tensor
    [..., H] and returns a new one of its shape; forward(x, return_routing=True) also
    gives the expert ids and weights [T, k] (T = the tokens of x). max_tokens: the
    workspace reserved now, the most tokens a forward may take inside a CUDA graph
    capture (eager forwards grow it as needed).

    forward(x, routing=(ids, weights)): the caller's routing instead of the router's:
    ids [..., k] (int32; other integer types are converted), < 0 for a padded slot;
    weights [..., k] (float32, converted likewise), used as given (no renormalization or
    scaling). An id >= E is skipped; check_routing=True reports it (InvalidArgumentError,
    waiting for the stream), as does routing_check() later.
    forward(x, accumulate_into=r): r += layer(x) in place (r: contiguous bf16 of x's
    shape, not x itself), the sum rounded once; returns r. route(x): the router's (ids,
    weights), what routing= takes back.

    Tensor parallelism (docs/MULTI_GPU.md): tp_comm, this rank's safecuda.torch.Comm (from
    Comm.from_process_group) on the weights' device, with the rank's shard of I as the
    weights (w13 [E, 2 I/N, H]: its gate rows and its up rows; w2 [E, H, I/N]; fp8 scales
    of the shards' blocks; the router, biases but w2_bias, and the shared gate whole);
    every rank calls forward with the same x. tp_output="all_reduce": every rank gets the
    whole output; "reduce_scatter" (sequence parallelism): rank r gets its rows
    [r T/N, (r+1) T/N) as a 2-D tensor [T/N, H] (T, the tokens of x, a multiple of N).

    Expert parallelism (docs/MULTI_GPU.md): ep_comm, this rank's safecuda.torch.Comm on the
    weights' device; router_weight [E, H] (and selection_bias, router_bias) whole, w13, w2,
    their biases and scales the rank's experts only ([E_r, 2I, H], in increasing expert id;
    ep_owner: each expert's rank, a sequence of E ints, or None for contiguous blocks of
    E/N), the shared expert whole. Each rank calls forward with its own tokens (any number,
    0 included: an empty step still takes part in the exchanges) and gets their output.
    ep_mode="normal" (prefill: exact counts, a host wait per forward) or "low_latency"
    (decode: packets of ep_max_tokens rows, T <= ep_max_tokens, capturable in CUDA graphs
    once the first forward ran eagerly: it checks that the ranks' layers agree; max_tokens
    is then ep_max_tokens). An expert-parallel forward is never traced by torch.compile (a
    graph break: every rank's forward is a collective, which a compiler could drop).

    In plain eager execution the forward runs the operator's body directly (the same
    work, without the dispatcher's overhead); under torch.compile, tracing, tensor
    subclasses or autograd it calls the torch.ops.safecuda operators. use_dispatcher=True
    makes it always call them."""

    def __init__(self, router_weight, w13, w2, *, top_k, scoring="softmax", renormalize=True,
                 selection_bias=None, max_tokens=256, backend="auto", label=None,
                 use_dispatcher=False, **options):
        super().__init__()
        self.use_dispatcher = bool(use_dispatcher)
        layer = _Layer(router_weight, w13, w2, top_k, scoring, renormalize, selection_bias,
                       max_tokens, backend, label, **options)
        layer_id = next(_layer_ids)
        _layers[layer_id] = layer
        self.layer_id = layer_id
        self.num_experts, self.hidden, self.intermediate = layer.E, layer.H, layer.I
        self.top_k, self.scoring, self.renormalize = layer.top_k, scoring, bool(renormalize)
        self.max_tokens = layer.max_tokens
        self.shared_intermediate = layer.shared_intermediate
        self.expert_dtype = layer.expert_dtype  # torch.bfloat16 or torch.float8_e4m3fn
        m = layer.moe
        self.n_group, self.topk_group = m.n_group, m.topk_group
        self.routed_scaling, self.activation, self.w13_layout = \
            m.routed_scaling, m.activation, m.w13_layout
        # Plain references (not parameters or buffers: .to() must not move them out from
        # under the layer, which reads them where they are now).
        self._weights = layer.tensors
        self._named = layer.named
        self._finalizer = weakref.finalize(self, _release, layer_id)

    @property
    def router_weight(self):
        return self._weights[0]

    @property
    def w13(self):
        return self._weights[1]

    @property
    def w2(self):
        return self._weights[2]

    @property
    def selection_bias(self):
        return self._weights[3]

    @property
    def router_bias(self):
        return self._named["router_bias"]

    @property
    def w13_bias(self):
        return self._named["w13_bias"]

    @property
    def w2_bias(self):
        return self._named["w2_bias"]

    @property
    def shared_w13(self):
        return self._named["shared_w13"]

    @property
    def shared_w2(self):
        return self._named["shared_w2"]

    @property
    def shared_gate(self):
        return self._named["shared_gate"]

    @property
    def w13_scale(self):
        return self._named["w13_scale"]

    @property
    def w2_scale(self):
        return self._named["w2_scale"]

    @property
    def shared_w13_scale(self):
        return self._named["shared_w13_scale"]

    @property
    def shared_w2_scale(self):
        return self._named["shared_w2_scale"]

    @property
    def safecuda_layer(self):
        """The safecuda.MoE under the module."""
        return _layer(self.layer_id).moe

    def _routing(self, routing, T):
        try:
            ids, weights = routing
        except (TypeError, ValueError):
            raise TypeError("safecuda.torch.MoE: routing is a pair (expert ids [..., k], "
                            "weights [..., k]) of tensors") from None
        k = self.top_k
        for name, t in (("routing ids", ids), ("routing weights", weights)):
            if not isinstance(t, Tensor):
                raise TypeError(f"safecuda.torch.MoE: the {name} must be a torch tensor, "
                                f"not {type(t).__name__}")
            if t.dim() < 1 or t.shape[-1] != k or t.numel() != T * k:
                raise ValueError(f"safecuda.torch.MoE: the {name} must be [..., k={k}] for "
                                 f"the {T} tokens of x; got {list(t.shape)}")
        if ids.dtype != torch.int32:
            if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
                raise TypeError(f"safecuda.torch.MoE: the routing ids are {ids.dtype}; an "
                                f"integer tensor is expected")
            ids = ids.to(torch.int32)
        if weights.dtype != torch.float32:
            if not weights.dtype.is_floating_point:
                raise TypeError(f"safecuda.torch.MoE: the routing weights are "
                                f"{weights.dtype}; a floating tensor is expected")
            weights = weights.to(torch.float32)
        return ids.reshape(T, k).contiguous(), weights.reshape(T, k).contiguous()

    def forward(self, x: Tensor, return_routing: bool = False, *, routing=None,
                accumulate_into=None, check_routing: bool = False):
        if _layer(self.layer_id).ep:
            # Every rank's expert-parallel forward is a collective, even without tokens:
            # never traced (a compiler could drop a call whose output is empty or unused).
            return _ep_forward(self, x, return_routing, routing, accumulate_into,
                               check_routing)
        return self._forward(x, return_routing, routing, accumulate_into, check_routing)

    def _forward(self, x, return_routing, routing, accumulate_into, check_routing):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        div = _layer(self.layer_id).out_div
        if div > 1:  # reduce-scattered tensor parallel: this rank's T / N rows
            shape = (x2.shape[0] // div, shape[-1])
        if routing is None and accumulate_into is None:
            if check_routing:
                raise ValueError("safecuda.torch.MoE: check_routing checks the caller's "
                                 "routing: give routing=(ids, weights)")
            if not self.use_dispatcher and _plain_eager(x2):
                layer = _layer(self.layer_id)
                if return_routing:
                    out, ids, weights = layer.run(x2, True)
                    return out.view(shape), ids, weights
                return layer.run(x2, False).view(shape)
            if return_routing:
                out, ids, weights = torch.ops.safecuda.moe_routed(x2, self.layer_id)
                return out.view(shape), ids, weights
            return torch.ops.safecuda.moe(x2, self.layer_id).view(shape)
        if return_routing:
            raise ValueError("safecuda.torch.MoE: return_routing goes with the layer's own "
                             "routing into a new tensor; with routing= the routing is the "
                             "caller's, and with accumulate_into call route(x) first and "
                             "pass routing=")
        T = x2.shape[0]
        ids = weights = None
        if routing is not None:
            ids, weights = self._routing(routing, T)
        eager = not self.use_dispatcher and _plain_eager(x2) and \
            all(t is None or type(t) is Tensor for t in (ids, weights, accumulate_into))
        if accumulate_into is None:
            if eager:
                return _layer(self.layer_id).run_ex(x2, None, ids, weights,
                                                    check_routing).view(shape)
            return torch.ops.safecuda.moe_with_routing(x2, self.layer_id, ids, weights,
                                                       check_routing).view(shape)
        acc = accumulate_into
        if not isinstance(acc, Tensor):
            raise TypeError(f"safecuda.torch.MoE: accumulate_into must be a torch tensor, "
                            f"not {type(acc).__name__}")
        if tuple(acc.shape) != tuple(shape) or not acc.is_contiguous():
            what = "" if acc.is_contiguous() else " (not contiguous)"
            whose = "x's shape" if div == 1 else "this rank's rows' shape"
            raise ValueError(f"safecuda.torch.MoE: accumulate_into must be a contiguous "
                             f"tensor of {whose} {list(shape)} (it is added to in place); "
                             f"got {list(acc.shape)}{what}")
        acc2 = acc.view(-1, shape[-1])
        if eager:
            _layer(self.layer_id).run_ex(x2, acc2, ids, weights, check_routing)
        else:
            torch.ops.safecuda.moe_accumulate(x2, self.layer_id, acc2, ids, weights,
                                              check_routing)
        return acc

    def route(self, x: Tensor):
        """The router's choice for x [..., H]: (expert ids int32 [T, k], weights float32
        [T, k]), in slot order, the weights renormalized and scaled as forward uses them
        (what forward(x, routing=...) takes back)."""
        x2 = x.reshape(-1, x.shape[-1])
        if not self.use_dispatcher and _plain_eager(x2):
            return _layer(self.layer_id).route(x2)
        return torch.ops.safecuda.moe_route(x2, self.layer_id)

    def routing_check(self):
        """Wait for torch's current stream and raise InvalidArgumentError (naming the
        token, slot and id) when a forward with the caller's routing met an id >= E since
        the last report (forwards with check_routing=True report at once)."""
        layer = _layer(self.layer_id)
        layer.routing_check(layer.device)

    def close(self):
        """Release the layer now (also done when the module is garbage-collected)."""
        self._finalizer()

    def extra_repr(self):
        extra = ""
        if self.n_group:
            extra += f", n_group={self.n_group}, topk_group={self.topk_group}"
        if self.routed_scaling:
            extra += f", routed_scaling={self.routed_scaling:g}"
        if self.activation != "silu":
            extra += f", activation={self.activation}"
        if self.w13_layout != "stacked":
            extra += f", w13_layout={self.w13_layout}"
        if self.shared_intermediate:
            extra += f", shared_intermediate={self.shared_intermediate}"
        if self.expert_dtype != torch.bfloat16:
            extra += f", experts={str(self.expert_dtype).replace('torch.', '')}"
        return (f"experts={self.num_experts}, top_k={self.top_k}, hidden={self.hidden}, "
                f"intermediate={self.intermediate}, scoring={self.scoring}, "
                f"renormalize={self.renormalize}{extra}, max_tokens={self.max_tokens}, "
                f"layer_id={self.layer_id}")


def _close_all():
    for layer_id in list(_layers):
        try:
            _release(layer_id)
        except Exception:  # noqa: BLE001 - at exit, never raise
            pass


atexit.register(_close_all)

# Hugging Face transformers models (_hf.py; transformers itself is not imported).
from ._hf import (MoESpec, PatchReport, UnsupportedBlockError, from_transformers,  # noqa: E402
                  layer_class as _hf_layer_class, moe_spec, patch_model, unpatch_model)

TransformersMoE = _hf_layer_class()

# Communicators over torch tensors (_torch_comm.py).
from ._torch_comm import Comm  # noqa: E402
from ._ep import shard_for_ep  # noqa: E402
from ._tp import shard_for_tp  # noqa: E402
