"""The fused Mixture-of-Experts layer (include/safecuda/moe.h) over safecuda buffers."""

import types
from ctypes import byref, c_uint64, pointer, string_at

from ._core import Buffer, _check, _Resource, _stream_handle
from ._dtype import DType
from ._lib import (SC_MOE_MAX_STEPS, caller_site, fail, label_bytes, lib, sc_moe_desc,
                   sc_moe_forward_desc, sc_moe_profile)

_SCORING = {"softmax": 0, "sigmoid": 1}
_BACKEND = {"auto": 0, "mma": 1, "sm90": 2}


class MoE(_Resource):
    """MoE(ctx, router, w13, w2, top_k=, scoring="softmax", renormalize=True,
    selection_bias=None, max_tokens=256, label=None, backend="auto",
    experts=None, hidden=None, intermediate=None).

    out[t] = sum over the top_k experts e chosen by the router for token t of
    weight(t, e) * (silu(x W1[e]^T) * (x W3[e]^T)) W2[e]^T, with router Wg [E, H], W13
    [E, 2I, H] (rows 0..I-1 are W1) and W2 [E, H, I] as bf16 buffers; selection_bias an
    optional f32 [E] added to the scores for the choice only. E, H and I come from the
    weights' shapes (or are given). The layer keeps the weight buffers' handles: they
    must stay open while it is used."""

    _kind = "MoE layer"
    _destroy_fn = "sc_moe_destroy"

    def __init__(self, context, router, w13, w2, *, top_k, scoring="softmax", renormalize=True,
                 selection_bias=None, max_tokens=256, label=None, backend="auto",
                 experts=None, hidden=None, intermediate=None, _site=None):
        E = experts if experts is not None else (router.shape[0] if len(router.shape) == 2
                                                  else None)
        H = hidden if hidden is not None else (router.shape[1] if len(router.shape) == 2
                                               else None)
        I_ = intermediate
        if I_ is None and len(w2.shape) == 3:
            I_ = w2.shape[2]
        if None in (E, H, I_):
            raise ValueError("MoE: experts, hidden and intermediate can't be read from the "
                             "weights' shapes (router [E, H], w2 [E, H, I]): give them")
        if scoring not in _SCORING:
            raise ValueError(f"MoE: scoring is 'softmax' or 'sigmoid', not {scoring!r}")
        if backend not in _BACKEND:
            raise ValueError(f"MoE: backend is one of {sorted(_BACKEND)}, not {backend!r}")
        for name, b in (("router", router), ("w13", w13), ("w2", w2),
                        ("selection_bias", selection_bias)):
            if b is not None and not isinstance(b, Buffer):
                raise TypeError(f"MoE: {name} must be a safecuda.Buffer (whole buffers: the "
                                f"layer keeps their handles), not {type(b).__name__}")
        desc = sc_moe_desc()
        desc.experts, desc.top_k, desc.hidden, desc.intermediate = int(E), int(top_k), int(H), \
            int(I_)
        desc.dtype = int(DType.BF16)
        desc.scoring = _SCORING[scoring]
        desc.renormalize = bool(renormalize)
        desc.router, desc.w13, desc.w2 = router._h, w13._h, w2._h
        desc.selection_bias = selection_bias._h if selection_bias is not None else 0
        desc.max_tokens = int(max_tokens)
        self._label_b = label_bytes(label)
        desc.label = self._label_b
        desc.backend = _BACKEND[backend]
        h = c_uint64()
        file, line = _site if _site is not None else caller_site()
        _check(lib.sc_moe_create_at(context._h, byref(desc), byref(h), file, line))
        self.experts, self.top_k, self.hidden, self.intermediate = int(E), int(top_k), \
            int(H), int(I_)
        self.weights = (router, w13, w2, selection_bias)  # kept alive with the layer
        self._init_resource(context, h.value, label, (string_at(file).decode(), line))
        self._forward = lib.sc_moe_forward

    def _detail(self):
        return f"E={self.experts} k={self.top_k} H={self.hidden} I={self.intermediate}"

    def forward(self, x, out=None, *, stream=None, expert_ids=None, expert_weights=None,
                profile=False):
        """out = MoE(x) for bf16 x [T, H] on stream (default: the context's default stream);
        out (bf16, like x) is made when not given. expert_ids (i32 [T, k]) and
        expert_weights (f32 [T, k]) views are written when given. profile=True returns
        (out, profile) with each kernel's device time (a host synchronization)."""
        if out is None:
            out = Buffer(self._ctx, x.shape, DType.BF16, stream=stream, _site=caller_site())
        if expert_ids is None and expert_weights is None and not profile:
            r = self._forward(_stream_handle(stream), self._h, x._sv, out._sv, None)
            if r:
                fail(r)
            return out
        opts = sc_moe_forward_desc()
        if expert_ids is not None:
            opts.expert_ids = expert_ids._sv
        if expert_weights is not None:
            opts.expert_weights = expert_weights._sv
        prof = sc_moe_profile() if profile else None
        if prof is not None:
            opts.profile = pointer(prof)
        r = self._forward(_stream_handle(stream), self._h, x._sv, out._sv, byref(opts))
        if r:
            fail(r)
        if prof is None:
            return out
        steps = [(prof.name[i].decode() if prof.name[i] else "?", prof.ms[i])
                 for i in range(min(prof.steps, SC_MOE_MAX_STEPS))]
        return out, types.SimpleNamespace(steps=steps, total_ms=prof.total_ms)

    __call__ = forward

    def reserve(self, max_tokens, *, stream=None):
        """Grow the workspace for forwards of up to max_tokens now (needed before a stream
        capture: a growth can't be captured)."""
        _check(lib.sc_moe_reserve(_stream_handle(stream), self._h, int(max_tokens)))

    @property
    def workspace_bytes(self):
        v = c_uint64()
        _check(lib.sc_moe_workspace_bytes(self._h, byref(v)))
        return v.value

