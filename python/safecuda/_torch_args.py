"""safecuda.torch.MoE's weight arguments checked: types, dtypes, shapes, contiguity, then
the device, all before anything is borrowed or the library is called (imported by
safecuda.torch, which needs torch). Each refusal names the argument, the dtype and the
shape it must have."""

import types

import torch
from torch import Tensor

from ._moe import FP8_BLOCK, SCALES, _comm_arg, ep_local_experts

# The layer's options besides the three weights (MoE's keyword arguments), with their
# defaults: those of safecuda.MoE.
OPTIONS = dict(n_group=0, topk_group=0, routed_scaling=0.0, activation="silu",
               swiglu_alpha=None, swiglu_limit=None, w13_layout="stacked", router_bias=None,
               w13_bias=None, w2_bias=None, shared_intermediate=None, shared_w13=None,
               shared_w2=None, shared_gate=None, w13_scale=None, w2_scale=None,
               shared_w13_scale=None, shared_w2_scale=None, tp_comm=None,
               tp_output="all_reduce", ep_comm=None, ep_mode="normal", ep_max_tokens=0,
               ep_owner=None)
OPTIONAL_TENSORS = ("selection_bias", "router_bias", "w13_bias", "w2_bias", "shared_w13",
                    "shared_w2", "shared_gate") + SCALES

_WHO = "safecuda.torch.MoE"
_EXPERTS = "the experts' weights (w13, w2, shared_w13, shared_w2)"


def check_weight(name, t, dtype, hint=""):
    """t is a contiguous torch tensor of dtype (its device is checked with the others)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{_WHO}: {name} must be a torch tensor, not {type(t).__name__}")
    if t.dtype != dtype:
        what = "bfloat16 weights" if dtype == torch.bfloat16 else f"{name} as {dtype}"
        raise TypeError(f"{_WHO}: {name} is {t.dtype}; the layer takes {what}{hint}")
    if not t.is_contiguous():
        raise ValueError(f"{_WHO}: {name} is not contiguous; the layer borrows the weights "
                         f"without copying them: pass {name}.contiguous()")


def check_shape(name, t, shape, meaning):
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{_WHO}: {name} must be {meaning} = {list(shape)}; got "
                         f"{list(t.shape)}")


def _expert_dtype(w13):
    """The experts' dtype: w13's, bfloat16 or float8_e4m3fn."""
    if not isinstance(w13, Tensor):
        raise TypeError(f"{_WHO}: w13 must be a torch tensor, not {type(w13).__name__}")
    if w13.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise TypeError(f"{_WHO}: w13 is {w13.dtype}; the layer takes bfloat16 weights, or "
                        f"float8_e4m3fn experts with their block scales (w13_scale, "
                        f"w2_scale: the checkpoint's weight_scale_inv)")
    return w13.dtype


def _check_expert(name, t, xd):
    if isinstance(t, Tensor) and t.dtype != xd:
        raise TypeError(f"{_WHO}: {name} is {t.dtype} and w13 {xd}: {_EXPERTS} share one "
                        f"dtype, bfloat16 or float8_e4m3fn")
    check_weight(name, t, xd)


def _check_scales(opts, xd, E, H, I_, S, backend):
    """fp8 experts: each weight with its float32 scales [.., rows/128, cols/128] (the
    checkpoints' weight_scale_inv); bf16 experts: none."""
    if xd != torch.float8_e4m3fn:
        for name in SCALES:
            if opts[name] is not None:
                raise ValueError(f"{_WHO}: {name} is given but {_EXPERTS} are {xd}: block "
                                 f"scales go with float8_e4m3fn experts")
        return
    if backend == "mma":
        raise ValueError(f"{_WHO}: backend='mma' can't run float8_e4m3fn experts: they run "
                         f"on the SM90 backend only (e4m3 warpgroup MMAs, compute capability "
                         f"9.0)")
    B = FP8_BLOCK
    if H % B or I_ % B:
        raise ValueError(f"{_WHO}: float8_e4m3fn experts need hidden and intermediate "
                         f"multiples of {B} (their scales are per {B} x {B} block); H = {H}, "
                         f"I = {I_}")
    want = {"w13_scale": ((E, 2 * I_ // B, H // B), "[E, 2I/128, H/128]"),
            "w2_scale": ((E, H // B, I_ // B), "[E, H/128, I/128]"),
            "shared_w13_scale": ((2 * S // B, H // B), "[2 I_s/128, H/128]"),
            "shared_w2_scale": ((H // B, S // B), "[H/128, I_s/128]")}
    for name in SCALES:
        t = opts[name]
        shape, meaning = want[name]
        if name.startswith("shared_") and not S:
            if t is not None:
                raise ValueError(f"{_WHO}: {name} is given without a shared expert "
                                 f"(shared_w13, shared_w2)")
            continue
        if t is None:
            raise ValueError(f"{_WHO}: the experts are float8_e4m3fn: give {name}, float32 "
                             f"{meaning} = {list(shape)} (the checkpoint's weight_scale_inv: "
                             f"weight = e4m3 value x scale)")
        check_weight(name, t, torch.float32, f" {meaning} = {list(shape)} (pass .float())")
        check_shape(name, t, shape, f"float32 {meaning}")


def check_layer_args(router, w13, w2, selection_bias, opts, backend):
    """Check MoE's weights (opts: OPTIONS updated with the caller's). Returns a namespace:
    E, H, I, S (the shared intermediate size, 0 for none), expert_dtype, selection_bias
    (contiguous), device, and opts with shared_intermediate and shared_gate ([H])
    resolved."""
    check_weight("router_weight", router, torch.bfloat16)
    xd = _expert_dtype(w13)
    _check_expert("w13", w13, xd)
    _check_expert("w2", w2, xd)
    if router.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"{_WHO}: shapes router_weight [E, H], w13 [E, 2I, H], w2 [E, H, I] "
                         f"expected; got {tuple(router.shape)}, {tuple(w13.shape)}, "
                         f"{tuple(w2.shape)}")
    E_all, H = router.shape
    I_ = w2.shape[2]
    # expert parallel (ep_comm): w13, w2, their biases and scales hold the rank's E_r experts
    comm = opts["ep_comm"]
    if comm is not None and not hasattr(comm, "nranks"):
        _comm_arg("ep_comm", comm)  # the TypeError naming what ep_comm must be
    if opts["ep_owner"] is not None:
        opts["ep_owner"] = [int(o) for o in opts["ep_owner"]]  # (an iterator read once)
    E = E_all if comm is None else ep_local_experts(int(E_all), comm.nranks, comm.rank,
                                                   opts["ep_owner"])
    if tuple(w13.shape) != (E, 2 * I_, H) or tuple(w2.shape) != (E, H, I_):
        held = "" if comm is None else \
            f" (the {E} experts rank {comm.rank} of {comm.nranks} holds of the {E_all})"
        raise ValueError(f"{_WHO}: with router_weight [E={E_all}, H={H}] and w2 "
                         f"[.., .., I={I_}], w13 must be [{E}, {2 * I_}, {H}] and w2 "
                         f"[{E}, {H}, {I_}]{held}; got {tuple(w13.shape)} and "
                         f"{tuple(w2.shape)}")
    tensors = {"router_weight": router, "w13": w13, "w2": w2}
    if selection_bias is not None:
        if not isinstance(selection_bias, Tensor) or \
                selection_bias.dtype != torch.float32 or \
                tuple(selection_bias.shape) != (E_all,):
            raise ValueError(f"{_WHO}: selection_bias must be float32 [{E_all}]; got "
                             f"{getattr(selection_bias, 'dtype', type(selection_bias))} "
                             f"{tuple(getattr(selection_bias, 'shape', ()))}")
        selection_bias = selection_bias.contiguous()
        tensors["selection_bias"] = selection_bias
    # The biases (float32) and the shared expert (the experts' dtype, its gate bfloat16).
    f32 = " (pass .float())"
    for name, shape, meaning in (("router_bias", (E_all,), "[E]"),
                                 ("w13_bias", (E, 2 * I_), "[E, 2I]"),
                                 ("w2_bias", (E, H), "[E, H]")):
        t = opts[name]
        if t is not None:
            check_weight(name, t, torch.float32, f32)
            check_shape(name, t, shape, meaning)
            tensors[name] = t
    sw13, sw2, sgate = opts["shared_w13"], opts["shared_w2"], opts["shared_gate"]
    if (sw13 is None) != (sw2 is None):
        raise ValueError(f"{_WHO}: shared_w13 and shared_w2 are given together (the shared "
                         f"expert's [2 I_s, H] and [H, I_s] weights)")
    if sgate is not None and sw13 is None:
        raise ValueError(f"{_WHO}: shared_gate scales the shared expert's output: give "
                         f"shared_w13 and shared_w2 too")
    S = opts["shared_intermediate"]
    if sw13 is not None:
        _check_expert("shared_w13", sw13, xd)
        _check_expert("shared_w2", sw2, xd)
        if sw2.dim() != 2:
            raise ValueError(f"{_WHO}: shared_w2 must be [H, I_s]; got {list(sw2.shape)}")
        if S is None:
            S = int(sw2.shape[1])
        check_shape("shared_w2", sw2, (H, S), "[H, I_s]")
        check_shape("shared_w13", sw13, (2 * S, H), "[2 I_s, H]")
        tensors.update(shared_w13=sw13, shared_w2=sw2)
        if sgate is not None:
            check_weight("shared_gate", sgate, torch.bfloat16)
            if sgate.numel() != H:
                raise ValueError(f"{_WHO}: shared_gate must hold H = {H} elements ([H], or a "
                                 f"Linear(H, 1)'s weight [1, H]); got {list(sgate.shape)}")
            sgate = sgate.reshape(H)
            tensors["shared_gate"] = sgate
    elif S:
        raise ValueError(f"{_WHO}: shared_intermediate = {S} without shared_w13 and "
                         f"shared_w2")
    S = int(S or 0)
    _check_scales(opts, xd, int(E), int(H), int(I_), S, backend)
    tensors.update((n, opts[n]) for n in SCALES if opts[n] is not None)
    # Where they are: all on one CUDA device.
    for name, t in tensors.items():
        if not t.is_cuda:
            raise ValueError(f"{_WHO}: {name} is on {t.device}, not a CUDA device")
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        raise ValueError(f"{_WHO}: the weights are on several devices: "
                         f"{sorted(str(d) for d in devices)}")
    opts = dict(opts, shared_intermediate=S, shared_gate=sgate)
    return types.SimpleNamespace(E=int(E_all), H=int(H), I=int(I_), S=S, expert_dtype=xd,
                                 selection_bias=selection_bias, device=router.device,
                                 opts=opts)
