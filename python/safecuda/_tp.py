"""Tensor-parallel shards of a MoE layer's weights (safecuda.torch.shard_for_tp): rank r of N
keeps its slice of the experts' intermediate dimension I, as the checkpoints split it and
include/safecuda/moe.h describes it (sc_moe_desc.tp_comm):

  w13 [E, 2I, H]     stacked: gate rows [r I/N, (r+1) I/N), then the same up rows (I + ..);
                     interleaved: rows [2 r I/N, 2 (r+1) I/N) (gate and up alternate);
  w13_bias [E, 2I]   likewise; w2 [E, H, I]: columns [r I/N, (r+1) I/N);
  shared_w13 [2 I_s, H], shared_w2 [H, I_s]: the same with I_s;
  fp8 block scales   the blocks of those rows and columns (128 x 128 blocks: I / N and
                     I_s / N must be multiples of 128; interleaved, 2 I / N too);
  the router, selection bias, router bias, shared gate and w2_bias whole (the layer adds
  w2_bias on rank 0 only).

Needs torch (imported by safecuda.torch); slices are contiguous copies."""

import torch

FP8_BLOCK = 128
_WHO = "safecuda.torch.shard_for_tp"


def _rows13(t, rank, n, interleaved, dim):
    """W13-like rows (dim: the 2I dimension) of rank of n: stacked gate then up, or the
    interleaved run."""
    two_i = t.shape[dim]
    i_ = two_i // 2
    if interleaved:
        s = two_i // n
        return t.narrow(dim, rank * s, s).contiguous()
    s = i_ // n
    return torch.cat([t.narrow(dim, rank * s, s), t.narrow(dim, i_ + rank * s, s)],
                     dim=dim).contiguous()


def _cols(t, rank, n, dim):
    s = t.shape[dim] // n
    return t.narrow(dim, rank * s, s).contiguous()


def shard_for_tp(kw, rank, nranks):
    """MoE's keyword arguments (router_weight, w13, w2 and the options, as safecuda.torch.MoE
    takes them, with the full weights) made rank `rank` of `nranks`'s: a new dict whose expert
    weights are the rank's shards (see the module's text), with shared_intermediate divided.
    ValueError when I (or I_s) does not split into N parts the layer takes: multiples of 8,
    of 128 for fp8 experts."""
    if not isinstance(rank, int) or not isinstance(nranks, int) or nranks < 1 or \
            not 0 <= rank < nranks:
        raise ValueError(f"{_WHO}: rank {rank!r} of {nranks!r}: 0 <= rank < nranks")
    out = dict(kw)
    if nranks == 1:
        return out
    w13, w2 = kw["w13"], kw["w2"]
    interleaved = kw.get("w13_layout", "stacked") == "interleaved"
    fp8 = w13.dtype == torch.float8_e4m3fn
    unit = FP8_BLOCK if fp8 else 8
    I_ = w2.shape[-1]
    shared_w2 = kw.get("shared_w2")
    Is = shared_w2.shape[-1] if shared_w2 is not None else 0
    for name, size in (("intermediate", I_), ("shared_intermediate", Is)):
        if size and (size % nranks or (size // nranks) % unit):
            why = ("fp8 experts: whole 128 x 128 blocks" if fp8 else
                   "the layer takes multiples of 8")
            raise ValueError(f"{_WHO}: {name} {size} does not split into {nranks} shards of "
                             f"a multiple of {unit} ({why})")
    out["w13"] = _rows13(w13, rank, nranks, interleaved, 1)
    out["w2"] = _cols(w2, rank, nranks, 2)
    if kw.get("w13_bias") is not None:
        out["w13_bias"] = _rows13(kw["w13_bias"], rank, nranks, interleaved, 1)
    if kw.get("shared_w13") is not None:
        out["shared_w13"] = _rows13(kw["shared_w13"], rank, nranks, interleaved, 0)
    if shared_w2 is not None:
        out["shared_w2"] = _cols(shared_w2, rank, nranks, 1)
    if kw.get("shared_intermediate"):
        out["shared_intermediate"] = kw["shared_intermediate"] // nranks
    if fp8:
        if kw.get("w13_scale") is not None:
            out["w13_scale"] = _rows13(kw["w13_scale"], rank, nranks, interleaved, 1)
        if kw.get("w2_scale") is not None:
            out["w2_scale"] = _cols(kw["w2_scale"], rank, nranks, 2)
        if kw.get("shared_w13_scale") is not None:
            out["shared_w13_scale"] = _rows13(kw["shared_w13_scale"], rank, nranks,
                                              interleaved, 0)
        if kw.get("shared_w2_scale") is not None:
            out["shared_w2_scale"] = _cols(kw["shared_w2_scale"], rank, nranks, 1)
    return out
