"""The MoE layer of include/safecuda/moe.h in float32 PyTorch, for the GPU tests."""


def route(torch, x, router, top_k, scoring, renormalize, bias=None):
    """(scores [T, E] f32, the top-k expert ids [T, k] by score + bias, ties to the lower
    index)."""
    logits = x.float() @ router.float().t()
    scores = torch.sigmoid(logits) if scoring == "sigmoid" else torch.softmax(logits, dim=-1)
    sel = scores + bias.float() if bias is not None else scores
    # torch.topk does not promise the lower index on ties: sort stably instead.
    ids = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :top_k]
    return scores, ids


def moe_reference(torch, x, router, w13, w2, top_k, scoring="softmax", renormalize=True,
                  bias=None, ids=None):
    """out [T, H] f32 (and the ids and weights used). ids: use this choice of experts (the
    tested layer's) instead of the reference's own, where near-ties could order them
    differently."""
    scores, own = route(torch, x, router, top_k, scoring, renormalize, bias)
    if ids is None:
        ids = own
    ids = ids.long()
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    xf = x.float()
    out = torch.zeros_like(xf)
    I_ = w2.shape[2]
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        h = xf[tok] @ w13[e].float().t()
        g, u = h[:, :I_], h[:, I_:]
        y = (torch.nn.functional.silu(g) * u) @ w2[e].float().t()
        out.index_add_(0, tok, y * w[tok, slot, None])
    return out, ids, w


def selection_margin(torch, x, router, top_k, scoring, bias=None):
    """Per token, the gap between the k-th and (k+1)-th selection score (inf when k = E):
    where it is tiny, two correct implementations may choose differently."""
    scores, _ = route(torch, x, router, top_k, scoring, True, bias)
    sel = scores + bias.float() if bias is not None else scores
    if top_k >= sel.shape[1]:
        return torch.full((sel.shape[0],), float("inf"), device=sel.device)
    s = torch.sort(sel, dim=-1, descending=True).values
    return s[:, top_k - 1] - s[:, top_k]


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
