"""safecuda for PyTorch (imported on use: `import safecuda.torch`; needs torch >= 2.4).

- MoE: the fused Mixture-of-Experts layer as an nn.Module, over the model's own bf16 weight
  tensors (borrowed through DLPack, never copied), callable on a bf16 CUDA tensor [..., H].
  It runs on torch's current stream (wrapped as a safecuda stream), inside
  torch.cuda.graph captures (its workspace is reserved for max_tokens tokens when it is
  built: a forward of more tokens inside a capture is refused with CaptureError) and
  under torch.compile, where it is one opaque operator.
- The operators torch.ops.safecuda.moe(x, layer) -> out and
  torch.ops.safecuda.moe_routed(x, layer) -> (out, expert_ids i32 [T, k], expert_weights
  f32 [T, k]), registered with torch.library.custom_op and a fake (shape) implementation;
  `layer` is the int id of a layer (MoE.layer_id).
- as_buffer(tensor) / as_tensor(view): zero-copy exchange of CUDA memory both ways.

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
from typing import Tuple

import torch
from torch import Tensor

from . import _lib
from ._core import Buffer, Stream, default_context
from ._dtype import DType
from ._lib import fail, intern_c_string, lib, sc_borrow_desc, sc_view
from ._moe import MoE as _MoE

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"safecuda.torch needs torch >= 2.4 (torch.library.custom_op); this is "
                      f"torch {torch.__version__}")

__all__ = ["MoE", "as_buffer", "as_tensor", "moe", "moe_routed"]

_layers = {}  # layer id -> _Layer
_layer_ids = itertools.count(1)
_SITE_FILE = intern_c_string(__file__)


def as_buffer(tensor, *, context=None, read_only=False, label=None):
    """A CUDA tensor as a safecuda Buffer of the same memory and shape (no copy), ordered
    on torch's current stream (its owner stream). The buffer holds the tensor until it is
    closed."""
    if not tensor.is_cuda:
        raise ValueError(f"as_buffer: the tensor is on {tensor.device}, not a CUDA device")
    ctx = context if context is not None else default_context(tensor.device.index)
    stream = Stream.from_torch(torch.cuda.current_stream(tensor.device), context=ctx)
    return Buffer.from_dlpack(tensor.detach(), context=ctx, stream=stream,
                              read_only=read_only, label=label)


def as_tensor(view):
    """A safecuda view (or buffer) as a torch tensor of the same memory (no copy), ordered
    after safecuda's pending work on it on torch's current stream (torch.from_dlpack)."""
    return torch.utils.dlpack.from_dlpack(view)


class _Layer:
    """One safecuda MoE layer over borrowed torch weights, and the per-call borrows."""

    def __init__(self, router, w13, w2, top_k, scoring, renormalize, selection_bias,
                 max_tokens, backend, label):
        tensors = {"router_weight": router, "w13": w13, "w2": w2}
        for name, t in tensors.items():
            if not isinstance(t, Tensor):
                raise TypeError(f"safecuda.torch.MoE: {name} must be a torch tensor")
            if not t.is_cuda:
                raise ValueError(f"safecuda.torch.MoE: {name} is on {t.device}, not a CUDA "
                                 f"device")
            if t.dtype != torch.bfloat16:
                raise TypeError(f"safecuda.torch.MoE: {name} is {t.dtype}; the layer takes "
                                f"bfloat16 weights")
            if not t.is_contiguous():
                raise ValueError(f"safecuda.torch.MoE: {name} is not contiguous; the layer "
                                 f"borrows the weights without copying them: pass "
                                 f"{name}.contiguous()")
        if router.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
            raise ValueError(f"safecuda.torch.MoE: shapes router_weight [E, H], w13 [E, 2I, H], "
                             f"w2 [E, H, I] expected; got {tuple(router.shape)}, "
                             f"{tuple(w13.shape)}, {tuple(w2.shape)}")
        E, H = router.shape
        I_ = w2.shape[2]
        if tuple(w13.shape) != (E, 2 * I_, H) or tuple(w2.shape) != (E, H, I_):
            raise ValueError(f"safecuda.torch.MoE: with router_weight [E={E}, H={H}] and w2 "
                             f"[.., .., I={I_}], w13 must be [{E}, {2 * I_}, {H}] and w2 "
                             f"[{E}, {H}, {I_}]; got {tuple(w13.shape)} and "
                             f"{tuple(w2.shape)}")
        devices = {t.device for t in tensors.values()}
        if selection_bias is not None:
            if selection_bias.dtype != torch.float32 or tuple(selection_bias.shape) != (E,):
                raise ValueError(f"safecuda.torch.MoE: selection_bias must be float32 [{E}]; "
                                 f"got {selection_bias.dtype} {tuple(selection_bias.shape)}")
            devices.add(selection_bias.device)
            selection_bias = selection_bias.contiguous()
        if len(devices) != 1:
            raise ValueError(f"safecuda.torch.MoE: the weights are on several devices: "
                             f"{sorted(str(d) for d in devices)}")
        dev = router.device
        self.device = dev
        self.ctx = ctx = default_context(dev.index)
        stream = Stream.from_torch(torch.cuda.current_stream(dev), context=ctx)
        self.buffers = []
        try:
            for name, t in (("router", router), ("w13", w13), ("w2", w2),
                            ("selection_bias", selection_bias)):
                if t is None:
                    self.buffers.append(None)
                    continue
                # detach(): the same storage, without the autograd record that keeps
                # torch from exporting a parameter.
                self.buffers.append(Buffer.from_dlpack(
                    t.detach(), context=ctx, stream=stream, read_only=True,
                    label=f"{label or 'torch MoE'} {name}"))
            r, a, b, bias = self.buffers
            self.moe = _MoE(ctx, r, a, b, top_k=top_k, scoring=scoring,
                            renormalize=renormalize, selection_bias=bias,
                            max_tokens=max_tokens, label=label, backend=backend)
            if max_tokens:
                self.moe.reserve(max_tokens, stream=stream)
        except BaseException:
            self.close()
            raise
        self.E, self.H, self.I, self.top_k = int(E), int(H), int(I_), int(top_k)
        self.max_tokens = int(max_tokens)
        self.tensors = (router, w13, w2, selection_bias)
        self._tls = threading.local()
        self._ctx_h = ctx._h
        self._moe_h = self.moe._h

    def close(self):
        moe = getattr(self, "moe", None)
        if moe is not None:
            moe.close()
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
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        ids = weights = None
        if routed:
            ids = torch.empty((T, self.top_k), dtype=torch.int32, device=x.device)
            weights = torch.empty((T, self.top_k), dtype=torch.float32, device=x.device)
        if T == 0:
            return (out, ids, weights) if routed else out
        cu = _current_raw_stream(x.device.index)
        ctx = self.ctx
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
        try:
            r = borrow(self._ctx_h, out.data_ptr(), byref(do), byref(ho), _SITE_FILE, 2)
            if r:
                fail(r)
            ho_v = ho.value
            vx.buffer, vx.offset, vx.count = hx_v, 0, n
            vo.buffer, vo.offset, vo.count = ho_v, 0, n
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


@moe.register_fake
def _moe_fake(x, layer):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("safecuda::moe_routed", mutates_args=())
def moe_routed(x: Tensor, layer: int) -> Tuple[Tensor, Tensor, Tensor]:
    """As moe, also giving the chosen experts (int32 [T, k]) and their routing weights
    (float32 [T, k]), in slot order."""
    return _layer(layer).run(x, True)


@moe_routed.register_fake
def _moe_routed_fake(x, layer):
    k = _layer(layer).top_k
    T = x.shape[0]
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty((T, k), dtype=torch.int32), x.new_empty((T, k), dtype=torch.float32))


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
            [E]), max_tokens=256, backend="auto", label=None)

    bf16 CUDA weights, contiguous, on one device, borrowed without a copy. forward(x) takes
    a bf16 CUDA tensor [..., H] and returns a new one of its shape;
    forward(x, return_routing=True) also gives the expert ids and weights [T, k] (T = the
    tokens of x). max_tokens: the workspace reserved now, the most tokens a forward may
    take inside a CUDA graph capture (eager forwards grow it as needed).

    In plain eager execution the forward runs the operator's body directly (the same
    work, without the dispatcher's overhead); under torch.compile, tracing, tensor
    subclasses or autograd it calls torch.ops.safecuda.moe. use_dispatcher=True makes it
    always call the operator."""

    def __init__(self, router_weight, w13, w2, *, top_k, scoring="softmax", renormalize=True,
                 selection_bias=None, max_tokens=256, backend="auto", label=None,
                 use_dispatcher=False):
        super().__init__()
        self.use_dispatcher = bool(use_dispatcher)
        layer = _Layer(router_weight, w13, w2, top_k, scoring, renormalize, selection_bias,
                       max_tokens, backend, label)
        layer_id = next(_layer_ids)
        _layers[layer_id] = layer
        self.layer_id = layer_id
        self.num_experts, self.hidden, self.intermediate = layer.E, layer.H, layer.I
        self.top_k, self.scoring, self.renormalize = layer.top_k, scoring, bool(renormalize)
        self.max_tokens = layer.max_tokens
        # Plain references (not parameters or buffers: .to() must not move them out from
        # under the layer, which reads them where they are now).
        self._weights = layer.tensors
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
    def safecuda_layer(self):
        """The safecuda.MoE under the module."""
        return _layer(self.layer_id).moe

    def forward(self, x: Tensor, return_routing: bool = False):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
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

    def close(self):
        """Release the layer now (also done when the module is garbage-collected)."""
        self._finalizer()

    def extra_repr(self):
        return (f"experts={self.num_experts}, top_k={self.top_k}, hidden={self.hidden}, "
                f"intermediate={self.intermediate}, scoring={self.scoring}, "
                f"renormalize={self.renormalize}, max_tokens={self.max_tokens}, "
                f"layer_id={self.layer_id}")


def _close_all():
    for layer_id in list(_layers):
        try:
            _release(layer_id)
        except Exception:  # noqa: BLE001 - at exit, never raise
            pass


atexit.register(_close_all)
