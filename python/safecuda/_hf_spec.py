"""A Hugging Face transformers MoE block read as safecuda.torch.MoE's arguments: the
"spec" step of safecuda.torch.from_transformers, with no GPU and no library call.

_hf_blocks.moe_spec(block) reads the block's modules (by class name: transformers itself is
never imported) and returns an MoESpec: the layer's options (top_k, scoring, renormalize,
groups, routed scaling, activation, W13 layout) and, for each weight argument, a
TensorSpec that says where it comes from in the block and whether the layer borrows the
block's tensor as it is or needs a rearranged copy (made by TensorSpec.make(), not by
moe_spec). A block the layer can't compute exactly is refused with UnsupportedBlockError,
naming the class and what the layer lacks. This file holds those classes and the ways a
tensor is taken; _hf_tables.py the readers of each family's router, experts and shared
expert; _hf_blocks.py the blocks themselves."""

import math

import torch

FP8_BLOCK = 128
MAX_EXPERTS, MAX_TOPK, MAX_SHARED, MAX_GROUPS = 512, 16, 16, 32  # include/safecuda/moe.h


class UnsupportedBlockError(ValueError):
    """A transformers block that safecuda's MoE layer can't compute exactly: the message
    names its class and what the layer lacks."""

    def __init__(self, block_class, reason):
        super().__init__(f"safecuda.torch.from_transformers: {block_class}: {reason}")
        self.block_class = block_class
        self.reason = reason


class Source:
    """A parameter or buffer of the block: the module that holds it and its attribute
    name, so that a replaced tensor is seen too (path: its name within the block)."""

    __slots__ = ("module", "attr", "path")

    def __init__(self, module, attr, path):
        self.module, self.attr, self.path = module, attr, path

    @property
    def tensor(self):
        return getattr(self.module, self.attr)


class TensorSpec:
    """One weight argument of the layer. kind: "borrowed" (the block's tensor itself, no
    copy) or "copied" (made once by make(): why says what the copy does). shape and
    dtype: what make() gives. release(copy): for a copy, points the block's own tensors
    at views of it (the same values), so that their memory can go (None: not possible)."""

    __slots__ = ("name", "sources", "kind", "why", "shape", "dtype", "_make", "_release")

    def __init__(self, name, sources, kind, make, shape, dtype, why="", release=None):
        self.name, self.sources, self.kind, self.why = name, tuple(sources), kind, why
        self._make, self._release = make, release
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype

    @property
    def nbytes(self):
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    @property
    def releasable(self):
        return self._release is not None

    def make(self):
        with torch.no_grad():
            return self._make()

    def release(self, made):
        """Point the block's tensors at views of made (a copy from make()); returns the
        bytes the block's old tensors held."""
        if self._release is None:
            return 0
        freed = sum(s.tensor.nbytes for s in self.sources)
        with torch.no_grad():
            self._release(made)
        return freed

    def __repr__(self):
        src = " + ".join(s.path for s in self.sources)
        what = f"copied ({self.why})" if self.kind == "copied" else "borrowed"
        return (f"{self.name} <- {src}: {what}, {list(self.shape)} "
                f"{str(self.dtype).replace('torch.', '')}")


class MoESpec:
    """What from_transformers builds: the family (the transformers model type), the
    block's class, the layer's options, its weight arguments (TensorSpec by keyword),
    what the block's forward returns, and notes (exactness remarks)."""

    def __init__(self, family, block_class, options, tensors, returns="hidden",
                 score_scale=1.0, notes=()):
        self.family, self.block_class = family, block_class
        self.options = dict(options)
        self.tensors = {k: v for k, v in tensors.items() if v is not None}
        self.returns = returns          # "hidden" or "hidden_and_scores"
        self.score_scale = score_scale  # the block's returned routing scores = weights x it
        self.notes = list(notes)

    @property
    def borrowed_bytes(self):
        return sum(t.nbytes for t in self.tensors.values() if t.kind == "borrowed")

    @property
    def copied_bytes(self):
        return sum(t.nbytes for t in self.tensors.values() if t.kind == "copied")

    def make_tensors(self):
        """The weight arguments as tensors (the copies made now)."""
        return {name: t.make() for name, t in self.tensors.items()}

    def kwargs(self, tensors=None):
        """safecuda.torch.MoE's keyword arguments: router_weight, w13, w2 and the options."""
        kw = dict(self.options)
        kw.update(self.make_tensors() if tensors is None else tensors)
        return kw

    def sources(self):
        """Every block tensor the layer reads (directly or through a copy)."""
        seen, out = set(), []
        for t in self.tensors.values():
            for s in t.sources:
                key = (id(s.module), s.attr)
                if key not in seen:
                    seen.add(key)
                    out.append(s)
        return out

    def __repr__(self):
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        lines = [f"MoESpec({self.family}: {self.block_class}; {opts}; returns {self.returns})"]
        lines += [f"  {t!r}" for t in self.tensors.values()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---- tensors: borrowed, or copied once ----------------------------------------------------


def _name(t):
    return str(t.dtype).replace("torch.", "")


def borrow(name, src):
    t = src.tensor
    return TensorSpec(name, [src], "borrowed", lambda: src.tensor.detach(), t.shape, t.dtype)


def as_f32(name, src, shape=None):
    """A float32 [..] argument (a bias or a selection bias): the tensor itself where it is
    float32 and contiguous, else a float32 copy."""
    t = src.tensor
    shape = tuple(t.shape) if shape is None else shape
    if t.dtype == torch.float32 and t.is_contiguous() and tuple(t.shape) == tuple(shape):
        return borrow(name, src)
    return TensorSpec(name, [src], "copied",
                      lambda: src.tensor.detach().to(torch.float32).reshape(shape).contiguous(),
                      shape, torch.float32, f"float32 copy of a {_name(t)} tensor")


def as_vector(name, src, n):
    """A [1, n] or [n] tensor as [n] (a view of the same memory)."""
    t = src.tensor
    return TensorSpec(name, [src], "borrowed", lambda: src.tensor.detach().reshape(n), (n,),
                      t.dtype)


def transposed(name, src):
    """[E, a, b] -> a contiguous copy [E, b, a]; release points the block's tensor at the
    copy's transpose (its own shape, the same values)."""
    t = src.tensor
    E, a, b = t.shape

    def release(made):
        src.tensor.data = made.transpose(1, 2)

    return TensorSpec(name, [src], "copied",
                      lambda: src.tensor.detach().transpose(1, 2).contiguous(), (E, b, a),
                      t.dtype, "transposed from the block's input-major layout", release)


def _adjacent(a, b):
    """b's memory follows a's (both contiguous, one storage)."""
    return (a.is_contiguous() and b.is_contiguous() and a.dtype == b.dtype and
            a.device == b.device and a.shape[1:] == b.shape[1:] and
            a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and
            a.storage_offset() + a.numel() == b.storage_offset())


def stacked_rows(name, srcs, why, pad_to=None):
    """Row blocks [r_i, c] stacked into one [sum r_i, c] tensor: borrowed where they lie one
    after the other in one allocation already (a block whose copy was released before), else
    copied; release points the block's tensors at the copy's row ranges. pad_to: each block
    padded with zero rows to that many (the shared expert grown to a multiple of the routed
    experts' size: zero gate and up rows give h = 0, and zero W2 columns add nothing)."""
    ts = [s.tensor for s in srcs]
    rows = [int(t.shape[0]) for t in ts]
    cols = tuple(ts[0].shape[1:])
    total = sum(pad_to or r for r in rows)
    if pad_to is None and all(_adjacent(a, b) for a, b in zip(ts, ts[1:])):
        def view():
            first = srcs[0].tensor
            return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(),
                                           (total,) + cols).detach()
        return TensorSpec(name, srcs, "borrowed", view, (total,) + cols, ts[0].dtype)

    def make():
        parts = []
        for s, r in zip(srcs, rows):
            t = s.tensor.detach()
            parts.append(t)
            if pad_to and pad_to > r:
                parts.append(t.new_zeros((pad_to - r,) + cols))
        return torch.cat(parts, dim=0).contiguous()

    def release(made):
        at = 0
        for s, r in zip(srcs, rows):
            s.tensor.data = made[at:at + r]
            at += pad_to or r

    return TensorSpec(name, srcs, "copied", make, (total,) + cols, ts[0].dtype, why,
                      None if pad_to else release)


def padded_cols(name, src, cols, why):
    """[r, c] -> [r, cols] with zero columns after c (a copy)."""
    t = src.tensor

    def make():
        w = src.tensor.detach()
        return torch.cat([w, w.new_zeros((w.shape[0], cols - w.shape[1]))], dim=1).contiguous()

    return TensorSpec(name, [src], "copied", make, (t.shape[0], cols), t.dtype, why)


def constant(name, like, shape, value, why):
    """A tensor of one value, of the dtype and on the device of the source like."""
    t = like.tensor
    return TensorSpec(name, [], "copied",
                      lambda: torch.full(shape, value, dtype=like.tensor.dtype,
                                         device=like.tensor.device), shape, t.dtype, why)


# ---- activations -----------------------------------------------------------------------------


def activation_of(fn):
    """"silu" or "gelu_tanh" for a transformers activation (module or function), else
    None."""
    name = type(fn).__name__
    if fn is torch.nn.functional.silu or isinstance(fn, torch.nn.SiLU) or \
            name in ("SiLUActivation", "SiLU"):
        return "silu"
    if name in ("GELUTanh", "NewGELUActivation", "FastGELUActivation", "PytorchGELUTanh"):
        return "gelu_tanh"
    if isinstance(fn, torch.nn.GELU) and getattr(fn, "approximate", "none") == "tanh":
        return "gelu_tanh"
    return None


def require_activation(block_class, fn, where):
    act = activation_of(fn)
    if act is None:
        shown = getattr(fn, "__name__", None) or type(fn).__name__
        raise UnsupportedBlockError(
            block_class, f"{where} uses the activation {shown}; the layer's experts compute "
            f"SiLU-GLU, GeLU(tanh)-GLU or gpt-oss's clamped SwiGLU")
    return act


def check_limits(block_class, E, k, H, I_):
    if E > MAX_EXPERTS:
        raise UnsupportedBlockError(block_class, f"{E} experts; the layer takes at most "
                                    f"{MAX_EXPERTS}")
    if k > MAX_TOPK or k > E:
        raise UnsupportedBlockError(block_class, f"top-{k} routing over {E} experts; the "
                                    f"layer chooses at most {MAX_TOPK}")
    if H % 8 or I_ % 8:
        raise UnsupportedBlockError(block_class, f"hidden size {H} and expert size {I_}; the "
                                    f"layer's kernels need multiples of 8")
