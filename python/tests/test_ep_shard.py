"""safecuda.torch.shard_for_ep on the CPU: every rank's experts put back together give the
full layer's: each routed expert's tensors (w13, w2, their biases, the fp8 block scales) on
exactly one rank, in increasing expert id, equal to the full tensors' rows; the router and
the shared expert whole on every rank; contiguous blocks and a listed map (ep_owner set);
the refusals."""

import pytest

torch = pytest.importorskip("torch")
from safecuda._ep import shard_for_ep  # noqa: E402 - after the torch check

E, H, I_ = 8, 256, 128


def _kw(fp8):
    g = torch.Generator().manual_seed(7)
    xd = torch.float8_e4m3fn if fp8 else torch.bfloat16
    kw = dict(router_weight=torch.randn(E, H, generator=g).to(torch.bfloat16),
              w13=torch.randn(E, 2 * I_, H, generator=g).to(xd),
              w2=torch.randn(E, H, I_, generator=g).to(xd),
              w13_bias=torch.randn(E, 2 * I_, generator=g),
              w2_bias=torch.randn(E, H, generator=g),
              shared_w13=torch.randn(2 * I_, H, generator=g).to(xd),
              shared_w2=torch.randn(H, I_, generator=g).to(xd), top_k=2)
    if fp8:
        kw.update(w13_scale=torch.rand(E, 2 * I_ // 128, H // 128, generator=g),
                  w2_scale=torch.rand(E, H // 128, I_ // 128, generator=g))
    return kw


def _same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.element_size() == 1
                                              else a, b.view(torch.uint8)
                                              if b.element_size() == 1 else b)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("owner", [None, [1, 0, 2, 0, 1, 3, 3, 2]])
def test_the_ranks_experts_make_the_whole(fp8, owner):
    kw, n = _kw(fp8), 4
    per = [n for n in ("w13", "w2", "w13_bias", "w2_bias", "w13_scale", "w2_scale") if n in kw]
    got = {name: [None] * E for name in per}
    for r in range(n):
        out = shard_for_ep(kw, r, n, owner)
        ids = [e for e in range(E) if (owner[e] if owner else e // (E // n)) == r]
        for name in per:
            assert out[name].shape[0] == len(ids) and out[name].is_contiguous()
            for i, e in enumerate(ids):
                assert got[name][e] is None
                got[name][e] = out[name][i]
        for name in ("router_weight", "shared_w13", "shared_w2"):
            assert out[name] is kw[name]
        assert out.get("ep_owner") == (owner if owner else None)
        assert out["top_k"] == 2
    for name in per:
        for e in range(E):
            assert _same(got[name][e], kw[name][e]), (name, e)


def test_refusals():
    kw = _kw(False)
    with pytest.raises(ValueError, match="rank 2 of 2: 0 <= rank < nranks"):
        shard_for_ep(kw, 2, 2)
    with pytest.raises(ValueError, match="experts = 8 is not a multiple of ep_comm's 3 ranks"):
        shard_for_ep(kw, 0, 3)
    with pytest.raises(ValueError, match=r"ep_owner\[1\] = 5: each expert's rank is 0 .. 1"):
        shard_for_ep(kw, 0, 2, [0, 5, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="rank 1 of 2 holds none of the 8 experts"):
        shard_for_ep(kw, 1, 2, [0] * E)


def test_held_bytes_count_the_ranks_shards_as_copies():
    """patch_model's report for a parallel layer (safecuda._hf.held_bytes): what shares the
    block's storage is borrowed, the rank's shards (copies) are copied; one tensor passed
    twice counts once."""
    from safecuda._hf import held_bytes
    from safecuda._tp import shard_for_tp

    kw = _kw(False)
    block = torch.nn.Module()
    for name, t in kw.items():
        if isinstance(t, torch.Tensor):
            block.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
    kw = {n: getattr(block, n) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}

    def nbytes(*names):
        return sum(kw[n].numel() * kw[n].element_size() for n in names)

    experts = ("w13", "w2", "w13_bias", "w2_bias")
    whole = ("router_weight", "shared_w13", "shared_w2")
    assert held_bytes(kw, block) == (nbytes(*experts, *whole), 0)
    assert held_bytes(dict(kw, again=kw["w13"]), block) == (nbytes(*experts, *whole), 0)
    ep = shard_for_ep(kw, 1, 4)  # two of the eight experts, copied; the rest whole
    assert held_bytes(ep, block) == (nbytes(*whole), nbytes(*experts) // 4)
    tp = shard_for_tp(kw, 1, 2)  # half of I of every expert and of the shared expert
    assert held_bytes(tp, block) == (nbytes("router_weight", "w2_bias"),
                                      nbytes("w13", "w2", "w13_bias", "shared_w13",
                                             "shared_w2") // 2)
