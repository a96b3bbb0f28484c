"""safecuda's MoE layer in a Hugging Face transformers model (re-exported by safecuda.torch):

    from_transformers(block) -> TransformersMoE   one block as a safecuda.torch.MoE
    patch_model(model) -> PatchReport             every supported block replaced in place
    unpatch_model(model) -> int                   the originals back

The mapping of each family (which tensors, which options) is the spec step, _hf_blocks.
moe_spec (pure: no GPU, no copy); this file builds the layer from it and swaps it in."""

import torch

from ._hf_blocks import looks_like_moe, moe_spec
from ._hf_spec import MoESpec, UnsupportedBlockError
from ._ep import shard_for_ep
from ._tp import shard_for_tp

_WEIGHTS = ("router_weight", "w13", "w2", "shared_w13", "shared_w2", "shared_gate")
_EXPERT_WEIGHTS = ("w13", "w2", "shared_w13", "shared_w2")


def _what(cls):
    return f"safecuda.torch.from_transformers: {cls}"


def check_devices(spec, who):
    """The block's tensors on one CUDA device: else ValueError saying what to do."""
    devices = {}
    for s in spec.sources():
        devices.setdefault(s.tensor.device, s.path)
    for dev, path in devices.items():
        if dev.type == "meta":
            raise ValueError(f"{who}: {path} is on the meta device (not loaded): load the "
                             f"model's weights first")
        if dev.type != "cuda":
            raise ValueError(f"{who}: {path} is on {dev}; safecuda's MoE layer runs on a CUDA "
                             f"GPU: move the model there first (model.to('cuda'), or "
                             f"from_pretrained(..., device_map='cuda'))")
    if len(devices) > 1:
        where = ", ".join(f"{p} on {d}" for d, p in devices.items())
        raise ValueError(f"{who}: the block's tensors are on several devices ({where}); the "
                         f"layer runs on one: keep each MoE block on one GPU")


def check_dtypes(spec, who):
    """The block's weights bfloat16 (the experts' may be float8_e4m3fn): else TypeError
    saying what to do."""
    for name in _WEIGHTS:
        t = spec.tensors.get(name)
        if t is None:
            continue
        ok = (torch.bfloat16, torch.float8_e4m3fn) if name in _EXPERT_WEIGHTS else \
            (torch.bfloat16,)
        if t.dtype not in ok:
            src = " + ".join(s.path for s in t.sources)
            raise TypeError(f"{who}: {src} is {t.dtype}; safecuda's MoE layer takes bfloat16 "
                            f"weights (or float8_e4m3fn experts with their block scales): "
                            f"load the model in bfloat16 (from_pretrained(..., "
                            f"dtype=torch.bfloat16)) or convert it (model.to(torch.bfloat16)) "
                            f"before patching")


def check_placement(spec, who=None):
    """check_devices, then check_dtypes."""
    who = who or _what(spec.block_class)
    check_devices(spec, who)
    check_dtypes(spec, who)


def held_bytes(kw, block):
    """(borrowed, copied): the bytes of the tensors in kw (a layer's arguments) that share
    storage with the block's parameters and buffers, and of the others (made for the
    layer: a rearranged copy, a rank's shard)."""
    own = {t.untyped_storage().data_ptr()
           for t in list(block.parameters()) + list(block.buffers())}
    borrowed = copied = 0
    seen = set()
    for t in kw.values():
        if not isinstance(t, torch.Tensor) or id(t) in seen:
            continue
        seen.add(id(t))
        n = t.numel() * t.element_size()
        if t.untyped_storage().data_ptr() in own:
            borrowed += n
        else:
            copied += n
    return borrowed, copied


def _make_layer_class():
    from .torch import MoE, _is_compiling

    class TransformersMoE(MoE):
        """A safecuda.torch.MoE made from a transformers MoE block (from_transformers),
        called as the block is: forward(hidden_states [..., H]) returns what the block
        returns (the output, or for gpt-oss (output, routing scores)).

        It holds the block (hf_block) and registers the block's submodules, parameters and
        buffers under their own names, so that the model's state_dict() keeps its keys.
        spec: the mapping (MoESpec); released_bytes: what release_originals freed.

        Each eager forward checks that the block's tensors are where the layer read them
        (a tensor replaced, moved, converted or modified in place since: RuntimeError), and
        a forward that would need gradients is refused: the layer is forward-only."""

        def __init__(self, block, spec, tensors, *, max_tokens, backend, label,
                     use_dispatcher, released_bytes=0, name=None, tp_comm=None, ep=None):
            kw = spec.kwargs(tensors)
            # what the layer holds: the spec's borrowed and copied bytes; a parallel layer
            # its shards instead (copies where a shard is not a view of the block's tensor)
            self_bytes = (spec.borrowed_bytes, spec.copied_bytes)
            if tp_comm is not None:  # this rank's shard of I (copies), the partials summed
                kw = shard_for_tp(kw, tp_comm.rank, tp_comm.nranks)
                self_bytes = held_bytes(kw, block)
                kw["tp_comm"] = tp_comm
            if ep is not None:  # this rank's experts (copies), each rank's own tokens
                comm = ep["ep_comm"]
                kw = shard_for_ep(kw, comm.rank, comm.nranks, ep.get("ep_owner"))
                self_bytes = held_bytes(kw, block)
                kw.update(ep)
            router, w13, w2 = kw.pop("router_weight"), kw.pop("w13"), kw.pop("w2")
            super().__init__(router, w13, w2, max_tokens=max_tokens, backend=backend,
                             label=label, use_dispatcher=use_dispatcher, **kw)
            self.__dict__["_hf_block"] = block  # not a submodule: its parts are adopted below
            self.spec = spec
            self.module_name = name
            self.released_bytes = int(released_bytes)
            self.borrowed_bytes, self.copied_bytes = (int(b) for b in self_bytes)
            self.__dict__["_returns_scores"] = spec.returns == "hidden_and_scores"
            self.__dict__["_score_scale"] = float(spec.score_scale)
            taken = set(dir(type(self))) | set(self.__dict__)
            for n, m in block._modules.items():
                if n not in taken and m is not None:
                    self._modules[n] = m
            for n, p in block._parameters.items():
                if n not in taken and p is not None:
                    self._parameters[n] = p
            for n, b in block._buffers.items():
                if n not in taken and b is not None:
                    self._buffers[n] = b
                    if n in block._non_persistent_buffers_set:
                        self._non_persistent_buffers_set.add(n)
            self._watch_now()

        @property
        def hf_block(self):
            """The transformers block this layer computes (unpatch_model puts it back)."""
            return self._hf_block

        def _watch_now(self):
            srcs = self.spec.sources()
            self.__dict__["_watch"] = tuple(
                (s, s.tensor, s.tensor.data_ptr(), s.tensor._version) for s in srcs)
            self.__dict__["_grad_tensors"] = tuple(t for _, t, _, _ in self._watch)

        def check_unchanged(self):
            """RuntimeError where a tensor of the block was replaced, moved, converted or
            modified in place since the layer was made from it."""
            for s, t0, ptr, ver in self._watch:
                t = getattr(s.module, s.attr, None)
                if t is t0 and t.data_ptr() == ptr and t._version == ver:
                    continue
                what = ("was replaced" if t is not t0 else
                        "moved (its memory changed: model.to(), a dtype conversion?)"
                        if t.data_ptr() != ptr else "was modified in place")
                where = f" ({self.module_name})" if self.module_name else ""
                raise RuntimeError(
                    f"safecuda.torch: the transformers block {self.spec.block_class}{where} "
                    f"changed after safecuda's layer was made from it: {s.path} {what}. The "
                    f"layer reads the weights as they were: make it again after changing "
                    f"them (safecuda.torch.unpatch_model(model), then patch_model(model))")

        def forward(self, hidden_states, *args, **kwargs):
            if not _is_compiling():
                self.check_unchanged()
            if torch.is_grad_enabled() and (
                    hidden_states.requires_grad or
                    any(t.requires_grad for t in self._grad_tensors)):
                raise RuntimeError(
                    f"safecuda.torch: the safecuda MoE layer replacing "
                    f"{self.spec.block_class} is forward-only (no gradients), and this "
                    f"forward would need them (grad mode is on and the input or the block's "
                    f"weights require grad): run the model under torch.no_grad() or "
                    f"torch.inference_mode() (generate() does), or call "
                    f"model.requires_grad_(False); unpatch_model(model) to train")
            if self._returns_scores:
                out, _, weights = MoE.forward(self, hidden_states, return_routing=True)
                if self._score_scale != 1.0:
                    weights = weights * self._score_scale
                return out, weights.to(hidden_states.dtype)
            return MoE.forward(self, hidden_states)

        def extra_repr(self):
            return f"{self.spec.family}: {self.spec.block_class}, " + super().extra_repr()

    return TransformersMoE


_LAYER_CLASS = []


def layer_class():
    if not _LAYER_CLASS:
        _LAYER_CLASS.append(_make_layer_class())
    return _LAYER_CLASS[0]


def from_transformers(block, *, max_tokens=256, backend="auto", release_originals=False,
                      label=None, use_dispatcher=False, tp_comm=None, ep_comm=None,
                      ep_mode="normal", ep_max_tokens=0, ep_owner=None, _name=None,
                      _spec=None):
    """A safecuda.torch.MoE (TransformersMoE) that computes the transformers MoE block
    `block` (a module instance of a supported family, bf16 or fine-grained FP8, on one CUDA
    device), over the block's own tensors: borrowed where the layouts agree, else copied
    once (spec.copied_bytes says how much). release_originals=True points the block's own
    tensors at views of those copies (the same values; the block still works), freeing
    their memory. UnsupportedBlockError (a ValueError) for a block the layer can't compute,
    naming its class and what the layer lacks; ValueError / TypeError for a block on the
    CPU, on several devices, or not in bfloat16.

    tp_comm (a safecuda.torch.Comm, this rank's): tensor parallelism for a model every rank
    of the communicator holds whole on its own GPU and runs with the same inputs: the layer
    takes this rank's shard of the experts' I (shard_for_tp: copies, 1/N of the experts'
    bytes) and all-reduces the partial outputs, so each rank's block output is the whole
    one. Every rank must patch the same blocks and run the same forwards.

    ep_comm (a safecuda.torch.Comm, this rank's): expert parallelism for a model every rank
    holds whole on its own GPU and runs with its own inputs (data-parallel attention): the
    layer keeps this rank's experts (shard_for_ep: copies; ep_owner: each expert's rank, or
    contiguous blocks), sends each token to the ranks holding its experts and sums what
    comes back (ep_mode "normal" or "low_latency" with packets of ep_max_tokens rows: see
    safecuda.torch.MoE; low_latency without ep_max_tokens: packets of max_tokens rows).
    Every rank must run the same number of forwards (a rank without tokens in a step still
    runs it), the first one eagerly (it checks that the ranks' layers agree); the layer's
    forward is a graph break under torch.compile."""
    if tp_comm is not None and ep_comm is not None:
        raise ValueError("safecuda.torch.from_transformers: tp_comm and ep_comm are both "
                         "given: a layer is tensor- or expert-parallel, not both")
    if ep_comm is not None and ep_mode == "low_latency" and not ep_max_tokens:
        ep_max_tokens = max_tokens  # (packets of max_tokens rows unless told)
    ep = None if ep_comm is None else dict(
        ep_comm=ep_comm, ep_mode=ep_mode, ep_max_tokens=ep_max_tokens,
        ep_owner=None if ep_owner is None else [int(o) for o in ep_owner])
    spec = _spec if _spec is not None else moe_spec(block)
    check_placement(spec)
    tensors = spec.make_tensors()
    released = 0
    if release_originals:
        for name, t in spec.tensors.items():
            if t.kind == "copied" and t.releasable:
                released += t.release(tensors[name])
    return layer_class()(block, spec, tensors, max_tokens=max_tokens, backend=backend,
                         label=label or f"{spec.family} {_name or spec.block_class}",
                         use_dispatcher=use_dispatcher, released_bytes=released, name=_name,
                         tp_comm=tp_comm, ep=ep)


class PatchEntry:
    """One block patch_model met: name (its module path), block_class, family, status
    ("patched" or "refused"), borrowed_bytes, copied_bytes, released_bytes, reason (of a
    refusal), notes."""

    __slots__ = ("name", "block_class", "family", "status", "borrowed_bytes", "copied_bytes",
                 "released_bytes", "reason", "notes")

    def __init__(self, name, block_class, family=None, status="patched", borrowed_bytes=0,
                 copied_bytes=0, released_bytes=0, reason=None, notes=()):
        self.name, self.block_class, self.family, self.status = name, block_class, family, status
        self.borrowed_bytes, self.copied_bytes = borrowed_bytes, copied_bytes
        self.released_bytes, self.reason, self.notes = released_bytes, reason, list(notes)

    def __repr__(self):
        if self.status == "refused":
            return f"{self.name}: {self.block_class}: refused: {self.reason}"
        return (f"{self.name}: {self.block_class} ({self.family}): patched, "
                f"{_mib(self.borrowed_bytes)} borrowed, {_mib(self.copied_bytes)} copied"
                + (f", {_mib(self.released_bytes)} released" if self.released_bytes else ""))


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


class PatchReport:
    """What patch_model did: entries (PatchEntry, in module order), patched and refused
    (the entries of each), and the bytes borrowed, copied and released in all."""

    def __init__(self, entries):
        self.entries = list(entries)

    @property
    def patched(self):
        return [e for e in self.entries if e.status == "patched"]

    @property
    def refused(self):
        return [e for e in self.entries if e.status == "refused"]

    borrowed_bytes = property(lambda self: sum(e.borrowed_bytes for e in self.patched))
    copied_bytes = property(lambda self: sum(e.copied_bytes for e in self.patched))
    released_bytes = property(lambda self: sum(e.released_bytes for e in self.patched))

    def __len__(self):
        return len(self.patched)

    def __str__(self):
        fams = sorted({e.family for e in self.patched})
        head = (f"safecuda.torch.patch_model: {len(self.patched)} MoE block(s) patched"
                f"{' (' + ', '.join(fams) + ')' if fams else ''}, {len(self.refused)} refused; "
                f"{_mib(self.borrowed_bytes)} borrowed, {_mib(self.copied_bytes)} copied"
                + (f", {_mib(self.released_bytes)} released" if self.released_bytes else ""))
        return "\n".join([head] + [f"  {e!r}" for e in self.entries])

    __repr__ = __str__


def _model_device(model, who):
    devices = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if t.numel():
            devices.add(t.device)
    cpu = sorted(str(d) for d in devices if d.type != "cuda")
    if cpu:
        raise ValueError(f"{who}: the model is on {', '.join(cpu)}; safecuda's MoE layer runs "
                         f"on a CUDA GPU: move the model there first (model.to('cuda'), or "
                         f"from_pretrained(..., device_map='cuda'))")
    if len(devices) > 1:
        raise ValueError(f"{who}: the model is spread over several devices "
                         f"({', '.join(sorted(str(d) for d in devices))}); patch a model on "
                         f"one GPU (device_map='cuda:0')")


def patch_model(model, *, max_tokens=256, backend="auto", release_originals=False,
                strict=False, use_dispatcher=False, tp_comm=None, ep_comm=None,
                ep_mode="normal", ep_max_tokens=0, ep_owner=None):
    """Replace every supported transformers MoE block in model (an nn.Module, on one CUDA
    device, bf16 or fine-grained FP8) by a safecuda layer computing it (from_transformers),
    in place. Returns a PatchReport: each block's module name, family and the bytes
    borrowed and copied, and the MoE-like blocks refused with the reason (strict=True: the
    first refusal raises UnsupportedBlockError instead). A model on the CPU, on several
    devices or not in bfloat16 raises before anything is replaced. The patched model runs
    forward-only (under torch.no_grad() / inference_mode(), as generate() does), under
    torch.compile and in CUDA graphs (max_tokens: the most tokens one forward of a layer
    may take inside a capture). unpatch_model(model) restores the blocks. tp_comm: tensor
    parallelism over the communicator's ranks, each holding the whole model on its GPU (the
    report's copied bytes then count the rank's shards);
    ep_comm (with ep_mode, ep_max_tokens, ep_owner): expert parallelism, each rank running
    the model on its own inputs (from_transformers says how)."""
    who = "safecuda.torch.patch_model"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{who}: model must be a torch.nn.Module, not {type(model).__name__}")
    _model_device(model, who)
    entries, planned = plan(model, strict)
    for name, m, spec, _ in planned:
        check_placement(spec, f"{who}: {name} ({spec.block_class})")
    done = []
    try:
        for name, m, spec, entry in planned:
            layer = from_transformers(m, max_tokens=max_tokens, backend=backend,
                                      release_originals=release_originals,
                                      use_dispatcher=use_dispatcher, tp_comm=tp_comm,
                                      ep_comm=ep_comm, ep_mode=ep_mode,
                                      ep_max_tokens=ep_max_tokens, ep_owner=ep_owner,
                                      _name=name, _spec=spec)
            entry.released_bytes = layer.released_bytes
            entry.borrowed_bytes, entry.copied_bytes = layer.borrowed_bytes, layer.copied_bytes
            _set(model, name, layer)
            done.append((name, layer))
    except BaseException:
        for name, layer in done:
            _set(model, name, layer.hf_block)
            layer.close()
        raise
    return PatchReport(entries)


def plan(model, strict=False):
    """patch_model's plan, without a GPU: (entries, [(name, block, spec, entry)]) for the
    MoE-like blocks of model (the outermost; blocks patched already are left out), each
    entry "patched" (to be) with its spec's bytes, or "refused" with the reason."""
    cls = layer_class()
    found, skip = [], []
    for name, m in model.named_modules():
        if any(name.startswith(p + ".") for p in skip):
            continue
        if isinstance(m, cls):
            skip.append(name)
            continue
        if looks_like_moe(m):
            skip.append(name)
            found.append((name, m))
    entries, planned = [], []
    for name, m in found:
        try:
            spec = moe_spec(m)
        except UnsupportedBlockError as exc:
            if strict:
                raise
            entries.append(PatchEntry(name, type(m).__name__, status="refused",
                                      reason=exc.reason))
            continue
        entries.append(PatchEntry(name, spec.block_class, spec.family, "patched",
                                  spec.borrowed_bytes, spec.copied_bytes, notes=spec.notes))
        planned.append((name, m, spec, entries[-1]))
    return entries, planned


def _set(model, name, module):
    parent, _, child = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    setattr(owner, child, module)


def unpatch_model(model):
    """Put back every transformers block patch_model (or a from_transformers swap) replaced
    in model, releasing the safecuda layers; returns how many."""
    cls = layer_class()
    n = 0
    for name, m in list(model.named_modules()):
        if isinstance(m, cls) and name:
            _set(model, name, m.hf_block)
            m.close()
            n += 1
    return n


__all__ = ["MoESpec", "PatchEntry", "PatchReport", "UnsupportedBlockError", "check_devices",
           "check_dtypes", "check_placement", "from_transformers", "held_bytes", "layer_class",
           "moe_spec", "patch_model", "plan", "unpatch_model"]
