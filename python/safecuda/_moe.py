"""The fused Mixture-of-Experts layer (include/safecuda/moe.h) over safecuda buffers."""

import types
from ctypes import byref, c_int32, c_uint64, pointer, string_at

from ._core import Buffer, View, _check, _Resource, _stream_handle
from ._dtype import DType
from ._lib import (SC_MOE_MAX_STEPS, caller_site, fail, label_bytes, lib, sc_moe_desc,
                   sc_moe_forward_desc, sc_moe_profile)

SCORING = {"softmax": 0, "sigmoid": 1}
BACKEND = {"auto": 0, "mma": 1, "sm90": 2}
ACTIVATION = {"silu": 0, "gelu_tanh": 1, "swiglu_clamp": 2}
W13_LAYOUT = {"stacked": 0, "interleaved": 1}
TP_OUTPUT = {"all_reduce": 0, "reduce_scatter": 1}
EP_MODE = {"normal": 0, "low_latency": 1}


def _comm_arg(what, comm):
    """tp_comm / ep_comm as a safecuda.Comm (a safecuda.torch.Comm gives its own), or None."""
    if comm is None:
        return None
    from ._comm import Comm
    inner = getattr(comm, "comm", None)  # safecuda.torch.Comm wraps one
    if isinstance(inner, Comm):
        comm = inner
    if not isinstance(comm, Comm):
        raise TypeError(f"MoE: {what} must be a safecuda.Comm (or a safecuda.torch.Comm), "
                        f"not {type(comm).__name__}")
    return comm


def ep_local_experts(E, nranks, rank, owner):
    """The experts rank holds of E over nranks (owner: each expert's rank, or None for
    contiguous blocks); ValueError for an owner list that is no such map."""
    if owner is None:
        if E % nranks:
            raise ValueError(f"MoE: experts = {E} is not a multiple of ep_comm's {nranks} "
                             f"ranks: give ep_owner (each expert's rank)")
        return E // nranks
    owner = [int(o) for o in owner]
    if len(owner) != E:
        raise ValueError(f"MoE: ep_owner has {len(owner)} entries; one per expert ({E}) "
                         f"expected")
    bad = [(e, o) for e, o in enumerate(owner) if not 0 <= o < nranks]
    if bad:
        raise ValueError(f"MoE: ep_owner[{bad[0][0]}] = {bad[0][1]}: each expert's rank is "
                         f"0 .. {nranks - 1}")
    return sum(1 for o in owner if o == rank)
FP8_BLOCK = 128  # the weights' scales are per 128 x 128 block (moe.h: SC_MOE_FP8_BLOCK)
SCALES = ("w13_scale", "w2_scale", "shared_w13_scale", "shared_w2_scale")


def _choice(what, value, table):
    if value not in table:
        names = ", ".join(repr(k) for k in table)
        raise ValueError(f"MoE: {what} is one of {names}, not {value!r}")
    return table[value]


def _shape2(w):
    shape = getattr(w, "shape", None)
    return tuple(shape) if shape is not None else ()


def _float(what, value):
    if value is None:
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"MoE: {what} must be a number, not {type(value).__name__}") from None


def _int(what, value):
    if value is None:
        return 0
    try:
        return int(value.__index__())
    except AttributeError:
        raise TypeError(f"MoE: {what} must be an int, not {type(value).__name__}") from None


def _expert_dtype(w13, w2, shared_w13, shared_w2):
    """The experts' DType: w13's (else w2's); TypeError for fp8 other than e4m3, or fp8
    weights mixed with others."""
    named = (("w13", w13), ("w2", w2), ("shared_w13", shared_w13), ("shared_w2", shared_w2))
    given = [(n, w.dtype) for n, w in named if w is not None]
    if not given:
        return DType.BF16
    first, xd = given[0]
    if xd is DType.F8E5M2:
        raise TypeError(f"MoE: {first} is f8e5m2; the experts are bf16, or f8e4m3 (OCP "
                        f"e4m3fn, torch.float8_e4m3fn) with 128 x 128 block scales")
    for name, d in given[1:]:
        if d != xd and DType.F8E4M3 in (d, xd):
            raise TypeError(f"MoE: {name} is {d} and {first} {xd}: the experts' weights "
                            f"(w13, w2, shared_w13, shared_w2) are all bf16 or all f8e4m3")
    return DType.F8E4M3 if xd is DType.F8E4M3 else DType.BF16


def _check_fp8(xd, E, H, I_, S, shared, scales, backend):
    """The Python side of fp8 experts: scales given with f8e4m3 experts only, each f32 of
    the checkpoint's block layout; H and I multiples of 128; the SM90 backend."""
    if xd is not DType.F8E4M3:
        for name in SCALES:
            if scales[name] is not None:
                raise ValueError(f"MoE: {name} is given but the experts (w13, w2) are {xd}: "
                                 f"block scales go with f8e4m3 experts")
        return
    if backend == "mma":
        raise ValueError("MoE: backend='mma' can't run f8e4m3 experts: they run on the SM90 "
                         "backend only (e4m3 warpgroup MMAs, compute capability 9.0)")
    if H % FP8_BLOCK or I_ % FP8_BLOCK:
        raise ValueError(f"MoE: f8e4m3 experts need hidden and intermediate multiples of "
                         f"{FP8_BLOCK} (their scales are per {FP8_BLOCK} x {FP8_BLOCK} "
                         f"block); H = {H}, I = {I_}")
    B = FP8_BLOCK
    want = {"w13_scale": ((E, 2 * I_ // B, H // B), "[E, 2I/128, H/128]"),
            "w2_scale": ((E, H // B, I_ // B), "[E, H/128, I/128]"),
            "shared_w13_scale": ((2 * S // B, H // B), "[2 I_s/128, H/128]"),
            "shared_w2_scale": ((H // B, S // B), "[H/128, I_s/128]")}
    for name in SCALES:
        v = scales[name]
        shape, meaning = want[name]
        if name.startswith("shared_") and not shared:
            if v is not None:
                raise ValueError(f"MoE: {name} is given without a shared expert "
                                 f"(shared_w13, shared_w2)")
            continue
        expect = f"f32 {meaning} = {list(shape)}"
        if v is None:
            raise ValueError(f"MoE: the experts are f8e4m3: give {name}, {expect} (the "
                             f"checkpoint's weight_scale_inv: weight = e4m3 value x scale)")
        if v.dtype is not DType.F32:
            raise TypeError(f"MoE: {name} is {v.dtype}; block scales are {expect}")
        n = 1
        for d in shape:
            n *= d
        if tuple(v.shape) != shape and not (len(v.shape) == 1 and v.count == n):
            raise ValueError(f"MoE: {name} must be {expect}; got shape {tuple(v.shape)}")


def build_desc(router, w13, w2, *, top_k, scoring="softmax", renormalize=True,
               selection_bias=None, max_tokens=256, label=None, backend="auto",
               experts=None, hidden=None, intermediate=None, n_group=0, topk_group=0,
               routed_scaling=0.0, activation="silu", swiglu_alpha=None, swiglu_limit=None,
               w13_layout="stacked", router_bias=None, w13_bias=None, w2_bias=None,
               shared_intermediate=None, shared_w13=None, shared_w2=None, shared_gate=None,
               w13_scale=None, w2_scale=None, shared_w13_scale=None, shared_w2_scale=None,
               tp_comm=None, tp_output="all_reduce", ep_comm=None, ep_mode="normal",
               ep_max_tokens=0, ep_owner=None):
    """The sc_moe_desc of MoE's arguments (see MoE), and a namespace of what was read:
    experts, top_k, hidden, intermediate, shared_intermediate, expert_dtype, the objects to
    keep alive and the label's bytes (the desc points into them). Checks the Python side
    only (names, types, what the shapes and dtypes tell); the library checks the rest when
    the layer is made."""
    weights = (("router", router, "router", "router_view"),
               ("w13", w13, "w13", "w13_view"),
               ("w2", w2, "w2", "w2_view"),
               ("selection_bias", selection_bias, "selection_bias", "selection_bias_view"))
    views = (("router_bias", router_bias), ("w13_bias", w13_bias), ("w2_bias", w2_bias),
             ("shared_w13", shared_w13), ("shared_w2", shared_w2),
             ("shared_gate", shared_gate), ("w13_scale", w13_scale), ("w2_scale", w2_scale),
             ("shared_w13_scale", shared_w13_scale), ("shared_w2_scale", shared_w2_scale))
    for name, w, _, _ in weights:
        if w is not None and not isinstance(w, View):
            raise TypeError(f"MoE: {name} must be a safecuda.Buffer (the layer keeps its "
                            f"handle) or a View of one (its exact elements), not "
                            f"{type(w).__name__}")
    for name, w in views:
        if w is not None and not isinstance(w, View):
            raise TypeError(f"MoE: {name} must be a safecuda.Buffer or View, not "
                            f"{type(w).__name__}")
    rs, ws = _shape2(router), _shape2(w2)
    E = experts if experts is not None else (rs[0] if len(rs) == 2 else None)
    H = hidden if hidden is not None else (rs[1] if len(rs) == 2 else None)
    I_ = intermediate if intermediate is not None else (ws[2] if len(ws) == 3 else None)
    if None in (E, H, I_):
        raise ValueError("MoE: experts, hidden and intermediate can't be read from the "
                         "weights' shapes (router [E, H], w2 [E, H, I]): give them")
    S = shared_intermediate
    if S is None:
        s2, s13 = _shape2(shared_w2), _shape2(shared_w13)
        if shared_w2 is not None and len(s2) == 2:
            S = s2[1]
        elif shared_w13 is not None and len(s13) == 2:
            S = s13[0] // 2
        elif shared_w2 is not None or shared_w13 is not None:
            raise ValueError("MoE: shared_intermediate can't be read from the shared "
                             "weights' shapes (shared_w2 [H, I_s], shared_w13 [2 I_s, H]): "
                             "give it")
        else:
            S = 0
    xd = _expert_dtype(w13, w2, shared_w13, shared_w2)
    # expert parallel: the routed experts' tensors hold the rank's experts
    ecomm = _comm_arg("ep_comm", ep_comm)
    E_x = _int("experts", E) if ecomm is None else \
        ep_local_experts(_int("experts", E), ecomm.nranks, ecomm.rank, ep_owner)
    _check_fp8(xd, E_x, _int("hidden", H), _int("intermediate", I_),
               _int("shared_intermediate", S), shared_w13 is not None or shared_w2 is not None,
               dict(views[6:]), backend)
    desc = sc_moe_desc()
    desc.experts, desc.top_k = _int("experts", E), _int("top_k", top_k)
    desc.hidden, desc.intermediate = _int("hidden", H), _int("intermediate", I_)
    desc.dtype = int(DType.BF16)
    desc.scoring = _choice("scoring", scoring, SCORING)
    desc.renormalize = bool(renormalize)
    for name, w, buffer_field, view_field in weights:
        if w is None:
            continue
        if isinstance(w, Buffer):
            setattr(desc, buffer_field, w._h)
        else:
            setattr(desc, view_field, w._sv)
    desc.max_tokens = _int("max_tokens", max_tokens)
    label_b = label_bytes(label)
    desc.label = label_b
    desc.backend = _choice("backend", backend, BACKEND)
    desc.n_group, desc.topk_group = _int("n_group", n_group), _int("topk_group", topk_group)
    desc.routed_scaling = _float("routed_scaling", routed_scaling)
    desc.activation = _choice("activation", activation, ACTIVATION)
    desc.swiglu_alpha = _float("swiglu_alpha", swiglu_alpha)
    desc.swiglu_limit = _float("swiglu_limit", swiglu_limit)
    desc.w13_layout = _choice("w13_layout", w13_layout, W13_LAYOUT)
    for name, w in views:
        if w is not None:
            setattr(desc, name, w._sv)
    desc.shared_intermediate = _int("shared_intermediate", S)
    desc.expert_dtype = int(xd)
    comm = _comm_arg("tp_comm", tp_comm)
    desc.tp_output = _choice("tp_output", tp_output, TP_OUTPUT)
    if comm is not None:
        desc.tp_comm = comm._h
    desc.ep_mode = _choice("ep_mode", ep_mode, EP_MODE)
    desc.ep_max_tokens = _int("ep_max_tokens", ep_max_tokens)
    owner_arr = None
    if ecomm is not None:
        desc.ep_comm = ecomm._h
        if ep_owner is not None:
            owner_arr = (c_int32 * desc.experts)(*[int(o) for o in ep_owner])
            desc.ep_owner = owner_arr
    elif ep_owner is not None or ep_max_tokens or ep_mode != "normal":
        raise ValueError("MoE: ep_mode, ep_max_tokens and ep_owner are an expert-parallel "
                         "layer's: give ep_comm")
    info = types.SimpleNamespace(
        experts=desc.experts, top_k=desc.top_k, hidden=desc.hidden,
        intermediate=desc.intermediate, shared_intermediate=desc.shared_intermediate,
        expert_dtype=xd, tp_comm=comm, tp_output=tp_output, ep_comm=ecomm, ep_mode=ep_mode,
        keep=(router, w13, w2, selection_bias, comm, ecomm, owner_arr) +
        tuple(w for _, w in views),
        label=label_b)
    return desc, info


class MoE(_Resource):
    """MoE(ctx, router, w13, w2, top_k=, scoring="softmax", renormalize=True,
    selection_bias=None, max_tokens=256, label=None, backend="auto",
    experts=None, hidden=None, intermediate=None, **v2 options).

    out[t] = sum over the top_k experts e chosen by the router for token t of
    weight(t, e) * (act(x W1[e]^T) * (x W3[e]^T)) W2[e]^T (+ the shared expert), with router
    Wg [E, H], W13 [E, 2I, H] and W2 [E, H, I] bf16; selection_bias an optional f32 [E]
    added to the scores for the choice only. These four are safecuda Buffers (whole
    buffers: the layer keeps their handles) or Views (exactly the elements of the weight,
    16-byte aligned: a checkpoint loaded as one allocation). E, H and I come from the
    weights' shapes (or are given). The layer keeps the weights' buffers' handles: they
    must stay open while it is used.

    The options of include/safecuda/moe.h, under the C names (each one's default the
    textbook layer):
      n_group, topk_group   group-limited routing (DeepSeek-V3: 8, 4); 0, 0: none;
      routed_scaling        the routed weights' factor after renormalization (0: 1);
      activation            "silu" | "gelu_tanh" | "swiglu_clamp" (gpt-oss);
      swiglu_alpha, swiglu_limit   swiglu_clamp's constants (None: 1.702 and 7.0);
      w13_layout            "stacked" (gate rows, then up rows) | "interleaved";
      router_bias (f32 [E]), w13_bias (f32 [E, 2I], in w13_layout), w2_bias (f32 [E, H]);
      shared_w13 (bf16 [2 I_s, H]), shared_w2 (bf16 [H, I_s]), shared_gate (bf16 [H],
        optional: the shared output scaled by sigmoid(x . shared_gate)): a shared expert
        of intermediate size shared_intermediate (read from shared_w2's shape when not
        given), a multiple of I.
    Biases and shared weights are Buffers or Views (a Buffer stands for all its
    elements).

    fp8 experts (the layout of DeepSeek-V3 / transformers fine-grained FP8 checkpoints):
    w13, w2, shared_w13 and shared_w2 of f8e4m3 (OCP e4m3fn) make the layer's
    expert_dtype f8e4m3, and each then comes with its f32 scales (the checkpoint's
    weight_scale_inv, one per 128 x 128 block: weight = e4m3 value x scale):
      w13_scale [E, 2I/128, H/128] (W13's row blocks in w13_layout order),
      w2_scale [E, H/128, I/128], shared_w13_scale [2 I_s/128, H/128],
      shared_w2_scale [H/128, I_s/128]
    (Buffers or Views; a flat View of the right count too). x and out stay bf16, the
    router, shared gate and biases as above; H and I are multiples of 128; SM90 backend
    (compute capability 9.0) only. The layer quantizes x per token and h per row in
    blocks of 128 channels (scale = amax / 448). ValueError / TypeError, before the
    library is called, for scales with bf16 experts, fp8 experts without their scales,
    a scale of another dtype or shape, mixed dtypes, H or I not multiples of 128, or
    backend="mma".

    Tensor parallelism over several GPUs (include/safecuda/moe.h, docs/MULTI_GPU.md):
    tp_comm, this rank's safecuda.Comm (or safecuda.torch.Comm) of the layer's context, with
    the rank's shard of I as the weights (intermediate = I / N, shared_intermediate likewise);
    every rank runs the same forwards, whose partial outputs are all-reduced (tp_output=
    "all_reduce": every rank's out is the whole [T, H]) or reduce-scattered
    ("reduce_scatter": rank r's out is its [T/N, H] rows r T/N ..; T a multiple of N).

    Expert parallelism: ep_comm, this rank's communicator; experts is all E of them (the
    router [E, H], selection_bias and router_bias whole), w13, w2, their biases and scales
    hold the rank's experts only (in increasing id: [E_r, 2I, H], ...), the shared expert
    whole. ep_owner: each expert's rank (a sequence of E ints; None: rank r holds experts
    r E/N .. (r+1) E/N - 1). Each rank's forward takes its own tokens (T may differ, and be
    0: x and out empty views); ep_mode="normal" (exact counts exchanged, read on the host)
    or "low_latency" (packets of ep_max_tokens rows; capturable; T <= ep_max_tokens)."""

    _kind = "MoE layer"
    _destroy_fn = "sc_moe_destroy"

    def __init__(self, context, router, w13, w2, *, top_k, scoring="softmax", renormalize=True,
                 selection_bias=None, max_tokens=256, label=None, backend="auto",
                 experts=None, hidden=None, intermediate=None, n_group=0, topk_group=0,
                 routed_scaling=0.0, activation="silu", swiglu_alpha=None, swiglu_limit=None,
                 w13_layout="stacked", router_bias=None, w13_bias=None, w2_bias=None,
                 shared_intermediate=None, shared_w13=None, shared_w2=None,
                 shared_gate=None, w13_scale=None, w2_scale=None, shared_w13_scale=None,
                 shared_w2_scale=None, tp_comm=None, tp_output="all_reduce", ep_comm=None,
                 ep_mode="normal", ep_max_tokens=0, ep_owner=None, _site=None):
        desc, info = build_desc(
            router, w13, w2, top_k=top_k, scoring=scoring, renormalize=renormalize,
            selection_bias=selection_bias, max_tokens=max_tokens, label=label,
            backend=backend, experts=experts, hidden=hidden, intermediate=intermediate,
            n_group=n_group, topk_group=topk_group, routed_scaling=routed_scaling,
            activation=activation, swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit,
            w13_layout=w13_layout, router_bias=router_bias, w13_bias=w13_bias,
            w2_bias=w2_bias, shared_intermediate=shared_intermediate, shared_w13=shared_w13,
            shared_w2=shared_w2, shared_gate=shared_gate, w13_scale=w13_scale,
            w2_scale=w2_scale, shared_w13_scale=shared_w13_scale,
            shared_w2_scale=shared_w2_scale, tp_comm=tp_comm, tp_output=tp_output,
            ep_comm=ep_comm, ep_mode=ep_mode, ep_max_tokens=ep_max_tokens, ep_owner=ep_owner)
        self._label_b = info.label
        h = c_uint64()
        file, line = _site if _site is not None else caller_site()
        _check(lib.sc_moe_create_at(context._h, byref(desc), byref(h), file, line))
        self.experts, self.top_k = info.experts, info.top_k
        self.hidden, self.intermediate = info.hidden, info.intermediate
        self.shared_intermediate = info.shared_intermediate
        self.expert_dtype = info.expert_dtype  # DType.BF16 or DType.F8E4M3
        self.n_group, self.topk_group = desc.n_group, desc.topk_group
        self.routed_scaling = desc.routed_scaling
        self.activation, self.w13_layout = activation, w13_layout
        self.weights = info.keep  # kept alive with the layer
        self.tp_comm, self.tp_output = info.tp_comm, tp_output
        self.ep_comm, self.ep_mode = info.ep_comm, ep_mode
        # the ranks a reduce-scattering layer divides T by (1 otherwise)
        self._out_div = info.tp_comm.nranks if tp_output == "reduce_scatter" else 1
        self._init_resource(context, h.value, label, (string_at(file).decode(), line))
        self._forward = lib.sc_moe_forward

    def _detail(self):
        extra = f" shared={self.shared_intermediate}" if self.shared_intermediate else ""
        xd = getattr(self, "expert_dtype", DType.BF16)
        if xd is not DType.BF16:
            extra += f" experts={xd}"
        return (f"E={self.experts} k={self.top_k} H={self.hidden} I={self.intermediate}"
                f"{extra}")

    def forward(self, x, out=None, *, stream=None, expert_ids=None, expert_weights=None,
                profile=False, routing_ids=None, routing_weights=None, check_routing=False,
                accumulate=False):
        """out = MoE(x) for bf16 x [T, H] on stream (default: the context's default stream);
        out (bf16, like x) is made when not given. expert_ids (i32 [T, k]) and
        expert_weights (f32 [T, k]) views are written when given. profile=True returns
        (out, profile) with each kernel's device time (a host synchronization).

        routing_ids (i32 [T, k]) and routing_weights (f32 [T, k]), given together: the
        caller's routing instead of the router's (used as given; an id < 0 is a padded
        slot; an id >= E is skipped and reported by a forward with check_routing=True,
        which waits for the stream, or by routing_check()). accumulate=True: out += MoE(x)
        (out must be given)."""
        if accumulate and out is None:
            raise ValueError("MoE.forward: accumulate=True adds into out: give out")
        if (routing_ids is None) != (routing_weights is None):
            raise ValueError("MoE.forward: routing_ids and routing_weights are given together "
                             "(the caller's routing: expert ids i32 [T, k] and their weights "
                             "f32 [T, k])")
        if out is None and self.ep_comm is not None and x.count == 0:
            out = x  # an expert-parallel step without tokens: empty views, no buffer
        if out is None:
            shape = tuple(x.shape)
            if self._out_div > 1:  # reduce-scattered: this rank's T / N rows
                shape = (shape[0] // self._out_div,) + shape[1:]
            out = Buffer(self._ctx, shape, DType.BF16, stream=stream, _site=caller_site())
        if (expert_ids is None and expert_weights is None and not profile and
                routing_ids is None and not check_routing and not accumulate):
            r = self._forward(_stream_handle(stream), self._h, x._sv, out._sv, None)
            if r:
                fail(r)
            return out
        opts = sc_moe_forward_desc()
        if expert_ids is not None:
            opts.expert_ids = expert_ids._sv
        if expert_weights is not None:
            opts.expert_weights = expert_weights._sv
        if routing_ids is not None:
            opts.routing_ids = routing_ids._sv
            opts.routing_weights = routing_weights._sv
        opts.check_routing = bool(check_routing)
        opts.accumulate = bool(accumulate)
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

    def route(self, x, ids=None, weights=None, *, stream=None):
        """The routing alone (sc_moe_route): for bf16 x [T, H], the chosen experts (i32
        [T, k]) and their weights (f32 [T, k], renormalized and scaled as a forward uses
        them), into the views ids and weights (made when not given); returns (ids,
        weights), what forward takes back as routing_ids / routing_weights."""
        T = x.count // self.hidden if self.hidden else 0
        if ids is None:
            ids = Buffer(self._ctx, (T, self.top_k), DType.I32, stream=stream,
                         _site=caller_site())
        if weights is None:
            weights = Buffer(self._ctx, (T, self.top_k), DType.F32, stream=stream,
                             _site=caller_site())
        _check(lib.sc_moe_route(_stream_handle(stream), self._h, x._sv, ids._sv,
                                weights._sv))
        return ids, weights

    def routing_check(self, stream=None):
        """Wait for stream and raise InvalidArgumentError (naming the token, slot and id)
        when an unchecked forward since the last report met a routing id >= E."""
        _check(lib.sc_moe_routing_check(_stream_handle(stream), self._h))

    def reserve(self, max_tokens, *, stream=None):
        """Grow the workspace for forwards of up to max_tokens now (needed before a stream
        capture: a growth can't be captured)."""
        _check(lib.sc_moe_reserve(_stream_handle(stream), self._h, int(max_tokens)))

    @property
    def workspace_bytes(self):
        v = c_uint64()
        _check(lib.sc_moe_workspace_bytes(self._h, byref(v)))
        return v.value
