"""Expert-parallel shards of a MoE layer's weights (safecuda.torch.shard_for_ep): rank r of N
keeps its experts, as include/safecuda/moe.h describes it (sc_moe_desc.ep_comm):

  w13 [E, 2I, H], w2 [E, H, I], w13_bias [E, 2I], w2_bias [E, H] and the fp8 block scales
  w13_scale [E, ..], w2_scale [E, ..]: the rows of the rank's experts, in increasing expert
  id (those e with owner[e] == r; owner None: experts r E/N .. (r+1) E/N - 1);
  the router, selection bias, router bias and the shared expert whole.

Needs torch (imported by safecuda.torch); the slices are contiguous copies."""

import torch

from ._moe import ep_local_experts

_WHO = "safecuda.torch.shard_for_ep"
_PER_EXPERT = ("w13", "w2", "w13_bias", "w2_bias", "w13_scale", "w2_scale")


def shard_for_ep(kw, rank, nranks, owner=None):
    """MoE's keyword arguments (router_weight, w13, w2 and the options, as safecuda.torch.MoE
    takes them, with the full weights) made rank `rank` of `nranks`'s: a new dict whose
    routed experts' tensors hold the rank's experts (see the module's text), with ep_owner
    set when owner is given. ValueError for a rank out of range, an owner list that is no
    map of the E experts to the ranks, E not a multiple of N without one, or a rank
    without experts."""
    if not isinstance(rank, int) or not isinstance(nranks, int) or nranks < 1 or \
            not 0 <= rank < nranks:
        raise ValueError(f"{_WHO}: rank {rank!r} of {nranks!r}: 0 <= rank < nranks")
    E = kw["w13"].shape[0]
    try:
        n = ep_local_experts(E, nranks, rank, owner)
    except ValueError as e:
        raise ValueError(f"{_WHO}: {str(e).removeprefix('MoE: ')}") from None
    if n == 0:
        raise ValueError(f"{_WHO}: rank {rank} of {nranks} holds none of the {E} experts: "
                         f"every rank holds one or more")
    if owner is None:
        ids = list(range(rank * (E // nranks), (rank + 1) * (E // nranks)))
    else:
        ids = [e for e, o in enumerate(owner) if int(o) == rank]
    out = dict(kw)
    for name in _PER_EXPERT:
        t = kw.get(name)
        if t is not None:
            index = torch.tensor(ids, dtype=torch.long, device=t.device)
            out[name] = t.index_select(0, index).contiguous()
    if owner is not None:
        out["ep_owner"] = [int(o) for o in owner]
    return out
