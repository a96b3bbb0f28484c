#!/usr/bin/env python3
"""safecuda's MoE layer against Hugging Face transformers' own MoE blocks, on a GPU.

For DeepSeek-V3 (DeepseekV3MoE), Kimi K2's routing (the same block with n_group = 1),
Qwen3-Next (Qwen3NextSparseMoeBlock) and gpt-oss (GptOssMLP), the script builds the
transformers block from a config object (never from_pretrained: no network, no
checkpoint) at moderate sizes but with the models' real structure (expert count, top-k,
grouped routing, routed scaling, shared expert and its gate, biases, activation), fills it
with random weights, makes the safecuda layer from a bf16 copy of the block with
safecuda.torch.from_transformers (its mapping checked against the script's own reading of
the block, tensor by tensor and option by option; the block's bf16 tensors borrowed
without a copy, where gpt-oss's input-major layout and the shared expert's separate
gate/up weights take one), and compares, for fresh random inputs of T = 1, 7, 129 and
1000 tokens:

- the chosen experts: safecuda's (MoE.route, and the forward's own) against the indices
  the transformers router module itself returned in that forward (read with a forward
  hook on block.gate / block.router). A token may choose differently only where the
  choice is a genuine near-tie: the gap on which it turns (between the k-th and
  (k+1)-th ranking score, and for grouped routing between the kept and the first dropped
  group score, computed in float64) is below 1e-4; those are counted and reported;
- the routing weights of the tokens that agree;
- the outputs: relative L2 <= 1e-2 (bf16), over the tokens whose choice agrees with the
  layer's own routing, and over all tokens with the transformers router's exact choice
  and weights handed to the layer as the caller's routing; at T = 129 also out +=
  layer(x) (accumulate) on top of a random residual.

The reference is the transformers block run in float32, with weights and inputs whose
values are bf16-representable (random values rounded to bf16; the float32 copies the
block holds are exact). safecuda computes the router logits as float32 sums of bf16
products, which are exact in float32: both sides then rank experts on logits that differ
only by float32 summation order, so the transformers routing is not perturbed by a bf16
rounding of the logits that safecuda does not make (a bf16 block would round its logits,
and its choice would differ from the exact one on many more tokens). TF32 is turned off
for the reference's matmuls. The transformers experts run their plain eager loop
(config._experts_implementation = "eager"; hub kernels off).

Semantics checked against transformers 5.17 (modeling_deepseek_v3.py,
modeling_qwen3_next.py, modeling_gpt_oss.py), and how the data is chosen where the
two differ:
- DeepSeek-V3 router: sigmoid of float32 logits; selection on score +
  e_score_correction_bias; a group's score is the sum of its two best selection scores;
  torch.topk(group_scores, topk_group, sorted=False) keeps the groups; the experts of the
  other groups are masked with -inf in 5.x (older releases masked with 0.0); top-k of the
  masked selection scores (sorted=False: the slot order is not meaningful, only the set);
  weights = the chosen plain scores / (their sum + 1e-20) * routed_scaling_factor.
  safecuda masks with -inf and breaks ties to the lower index. The selection bias here is
  random and non-negative, so every allowed selection score is > 0 and a 0.0 mask could
  not win either: the comparison holds for both mask values.
- DeepSeek-V3 experts: gate_up_proj [E, 2I, H] with the gate rows first (chunk(2)), as
  safecuda's stacked W13; down_proj [E, H, I] as W2; the shared expert an MLP of
  moe_intermediate_size * n_shared_experts (gate_proj, up_proj, down_proj Linear
  weights), added with weight 1. safecuda's shared_w13 is the [2 I_s, H] tensor whose
  first I_s rows are the gate_proj weight and the rest the up_proj weight.
- Qwen3-Next: softmax over the E logits (float32), top-k, divided by their sum
  (norm_topk_prob); experts as DeepSeek-V3's; the shared expert's output multiplied by
  sigmoid(shared_expert_gate(x)), a Linear(H, 1, bias=False) whose [1, H] weight is
  safecuda's shared_gate.
- gpt-oss: router Linear(H, E) with a bias; top-k of the logits, softmax over those k
  (the same weights as safecuda's softmax over E + renormalize, its router_bias the
  Linear's bias); gate_up_proj [E, H, 2I] input-major with gate and up interleaved along
  the last dimension (gate = [..., ::2], up = [..., 1::2]) and gate_up_proj_bias [E, 2I]
  alike: safecuda's W13 is gate_up_proj transposed to [E, 2I, H] with w13_layout
  "interleaved", its w13_bias the bias as it is; down_proj [E, I, H] transposed to W2
  [E, H, I], down_proj_bias [E, H] as w2_bias; activation: gate clamped above at limit
  7.0, up clamped to [-7, 7], (up + 1) * gate * sigmoid(1.702 gate) = safecuda's
  swiglu_clamp (alpha and limit read from the block). Biases are added before the clamp
  on both sides. The W13 weights are scaled up (x W ~ N(0, 9)) so that the clamps act on
  a few percent of the values (reported).

Exit status: 0 all comparisons passed; 1 a comparison failed (each failure line says
what differed, by how much, and what that points at); 77 skipped, with a line
"moe_transformers: skipped: <why>" (no torch, no transformers 5, no CUDA GPU, a GPU
older than sm_80).

    python3 tests/gpu/moe_transformers.py [--models deepseek-v3,kimi-k2,qwen3-next,gpt-oss]
                                          [--tokens 1,7,129,1000] [--seed 0]

The last line printed is the summary ("moe_transformers: PASSED ..." or
"moe_transformers: FAILED ..."). Run it with the safecuda Python package importable
(scripts/gpu-check does); from a checkout it falls back to python/ and the library in
build-gpu/ or build/.
"""

import argparse
import inspect
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NAME = "moe_transformers"
SKIP = 77
TIE_EPS = 1e-4     # a choice turning on a smaller gap is a near-tie
OUT_TOL = 1e-2     # relative L2 of the bf16 output against the float32 reference
GIVEN_TOL = 1e-2


def say(msg=""):
    print(f"{NAME}: {msg}" if msg else "", flush=True)


def skip(why):
    say(f"skipped: {why}")
    sys.exit(SKIP)


def environment():
    """torch, transformers, safecuda and safecuda.torch, or a skip saying what is missing."""
    os.environ.setdefault("USE_HUB_KERNELS", "0")  # the plain transformers code
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import torch
    except ImportError as exc:
        skip(f"torch is not installed ({exc})")
    if not torch.cuda.is_available():
        skip("torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    try:
        import transformers
    except ImportError as exc:
        skip(f"transformers is not installed ({exc}); pip install 'transformers>=5'")
    try:
        major = int(transformers.__version__.split(".")[0])
    except ValueError:
        major = 0
    if major < 5:
        skip(f"transformers {transformers.__version__}: the comparison reads the module "
             f"layouts of transformers 5 (experts as 3-d gate_up_proj / down_proj "
             f"parameters); pip install 'transformers>=5'")
    cc = torch.cuda.get_device_capability(0)
    if cc < (8, 0):
        skip(f"the GPU is sm_{cc[0]}{cc[1]}; safecuda's MoE kernels need sm_80 or newer")
    transformers.logging.set_verbosity_error()
    try:
        import safecuda  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        try:
            import safecuda  # noqa: F401
        except ImportError as exc:
            say(f"FAILED: the safecuda Python package can't be imported ({exc}): pip install "
                f"./python, or build the library (cmake --build build-gpu) and run from the "
                f"checkout")
            sys.exit(1)
    try:
        import safecuda.torch as sct
    except ImportError as exc:  # torch older than safecuda.torch needs
        skip(f"safecuda.torch can't be used with this torch: {exc}")
    return torch, transformers, sct


# ---- data ---------------------------------------------------------------------------------------


class Rand:
    """Random bf16-representable tensors on the GPU, from one seeded generator."""

    def __init__(self, torch, seed):
        self.torch = torch
        self.g = torch.Generator(device="cuda").manual_seed(seed)

    def normal(self, *shape, std=1.0, dtype=None):
        t = self.torch
        v = (t.randn(*shape, device="cuda", generator=self.g) * std).to(t.bfloat16)
        return v if dtype is None else v.to(dtype)

    def uniform(self, *shape, lo=0.0, hi=1.0):
        t = self.torch
        v = t.rand(*shape, device="cuda", generator=self.g) * (hi - lo) + lo
        return v.to(t.bfloat16).float()


class LayoutError(Exception):
    """The transformers block is not laid out as this script expects."""


class Loader:
    """Sets every parameter and buffer of a transformers block, checking each shape; then
    check_all() reports any it did not set."""

    def __init__(self, torch, block, version):
        self.torch, self.block, self.version = torch, block, version
        self.done = set()

    def set(self, name, value):
        params = dict(self.block.named_parameters())
        params.update(self.block.named_buffers())
        if name not in params:
            raise LayoutError(f"{type(self.block).__name__} has no parameter or buffer {name!r} "
                              f"in transformers {self.version}: the module layout changed")
        p = params[name]
        if tuple(p.shape) != tuple(value.shape):
            raise LayoutError(f"{type(self.block).__name__}.{name} is {list(p.shape)} in "
                              f"transformers {self.version}; the script fills it with "
                              f"{list(value.shape)}: the layout changed")
        with self.torch.no_grad():
            p.copy_(value.to(p.dtype))
        self.done.add(name)

    def check_all(self):
        names = {n for n, _ in self.block.named_parameters()}
        names |= {n for n, _ in self.block.named_buffers()}
        left = sorted(names - self.done)
        if left:
            raise LayoutError(f"{type(self.block).__name__} has parameters the script does not "
                              f"set (the module grew): {left}")


def hf_layer(torch, sct, block, name, expect):
    """safecuda.torch.from_transformers on a bf16 copy of the float32 block (exact: its
    values are bf16-representable), its mapping checked against the script's own reading
    of the block (expect: the layer's weights and options as the script maps them by
    hand): a LayoutError names the first that differs."""
    import copy
    b16 = copy.deepcopy(block).to(torch.bfloat16)
    layer = sct.from_transformers(b16, max_tokens=1024, label=name)
    for key, want in expect.items():
        if isinstance(want, torch.Tensor):
            got = getattr(layer, key)
            if got is None or got.numel() != want.numel() or \
                    not torch.equal(got.float().flatten(), want.float().flatten()):
                raise LayoutError(f"from_transformers({type(block).__name__}) maps {key} "
                                  f"otherwise than the script reads the block: "
                                  f"{layer.spec.tensors.get(key)}")
        else:
            got = layer.spec.options.get(key)
            if key == "routed_scaling":
                got, want = got or 1.0, float(want) or 1.0
            if got != want and not (isinstance(want, float) and abs(got - want) < 1e-6):
                raise LayoutError(f"from_transformers({type(block).__name__}): {key} = "
                                  f"{got!r}, the script reads {want!r}")
    return layer


def source_has(obj, text):
    try:
        return text in inspect.getsource(obj)
    except (OSError, TypeError):
        return None


# ---- the models -------------------------------------------------------------------------------


class Case:
    """One model: the transformers block (float32), the safecuda layer over the same bf16
    weights, the router module to hook and how to read its output, and the float64
    ranking used to find near-ties."""

    name = ""
    describe = ""
    notes = ()

    def hf_routing(self, out):
        """(ids [T, k] int64, weights [T, k] f32) from the router module's output."""
        logits, weights, ids = out
        return ids, weights

    def hf_forward(self, x):
        out = self.block(x.float().unsqueeze(0))
        if isinstance(out, tuple):
            out = out[0]
        return out.reshape(x.shape[0], -1)

    def shared_output(self, xf):
        return None

    def margins(self, x):
        raise NotImplementedError


def top_gap(torch, rank, k):
    """Per row, rank's k-th largest minus its (k+1)-th (inf where there is no (k+1)-th)."""
    if k >= rank.shape[1]:
        return torch.full((rank.shape[0],), float("inf"), dtype=rank.dtype,
                          device=rank.device)
    s = torch.sort(rank, dim=-1, descending=True).values
    return s[:, k - 1] - s[:, k]


class DeepSeek(Case):
    """DeepseekV3MoE: sigmoid routing with a selection bias, groups, routed scaling, one
    shared expert. n_group = 1, topk_group = 1 is Kimi K2's routing."""

    def __init__(self, torch, transformers, sct, rnd, *, name, E, k, H, I, n_group,
                 topk_group, routed_scaling, n_shared):
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
        self.torch, self.name = torch, name
        self.E, self.k, self.H, self.I = E, k, H, I
        self.n_group, self.topk_group = n_group, topk_group
        cfg = transformers.DeepseekV3Config(
            hidden_size=H, moe_intermediate_size=I, n_routed_experts=E,
            num_experts_per_tok=k, n_group=n_group, topk_group=topk_group,
            n_shared_experts=n_shared, routed_scaling_factor=float(routed_scaling),
            norm_topk_prob=True, hidden_act="silu", num_hidden_layers=1)
        cfg._experts_implementation = "eager"
        with torch.device("cuda"):
            self.block = DeepseekV3MoE(cfg).float().eval()
        Is = I * n_shared
        self.router = rnd.normal(E, H, std=H ** -0.5)
        self.bias = rnd.uniform(E, lo=0.0, hi=0.25)  # >= 0: see the docstring
        self.w13 = rnd.normal(E, 2 * I, H, std=H ** -0.5)
        self.w2 = rnd.normal(E, H, I, std=I ** -0.5)
        self.sw13 = rnd.normal(2 * Is, H, std=H ** -0.5)  # gate_proj rows, then up_proj rows
        self.sw2 = rnd.normal(H, Is, std=Is ** -0.5)
        ld = Loader(torch, self.block, transformers.__version__)
        ld.set("gate.weight", self.router)
        ld.set("gate.e_score_correction_bias", self.bias)
        ld.set("experts.gate_up_proj", self.w13)
        ld.set("experts.down_proj", self.w2)
        ld.set("shared_experts.gate_proj.weight", self.sw13[:Is])
        ld.set("shared_experts.up_proj.weight", self.sw13[Is:])
        ld.set("shared_experts.down_proj.weight", self.sw2)
        ld.check_all()
        self.gate = self.block.gate
        self.layer = hf_layer(torch, sct, self.block, name, dict(
            router_weight=self.router, w13=self.w13, w2=self.w2, top_k=k, scoring="sigmoid",
            renormalize=True, selection_bias=self.bias, n_group=n_group if n_group > 1 else 0,
            topk_group=topk_group if n_group > 1 else 0, routed_scaling=routed_scaling,
            shared_w13=self.sw13, shared_w2=self.sw2))
        self.routed_scaling = routed_scaling
        self.describe = (f"DeepseekV3MoE E={E} k={k} H={H} I={I} n_group={n_group} "
                         f"topk_group={topk_group} routed_scaling={routed_scaling} shared "
                         f"I_s={Is}")
        router_cls = type(self.block.gate)
        if source_has(router_cls.forward, 'float("-inf")'):
            mask = "-inf (as safecuda)"
        elif source_has(router_cls.forward, "0.0)"):
            mask = "0.0 (safecuda: -inf; the non-negative selection bias makes it irrelevant)"
        else:
            mask = "not found in the source (the non-negative selection bias makes it irrelevant)"
        self.notes = (f"transformers masks the dropped groups' experts with {mask}",)

    def shared_output(self, xf):
        return self.block.shared_experts(xf)

    def margins(self, x):
        torch = self.torch
        logits = x.double() @ self.router.double().t()
        sel = torch.sigmoid(logits) + self.bias.double()
        T = sel.shape[0]
        margin = torch.full((T,), float("inf"), dtype=torch.float64, device=sel.device)
        if self.n_group > 1:
            G = self.E // self.n_group
            gs = sel.view(T, self.n_group, G).topk(2, dim=-1).values.sum(dim=-1)
            margin = torch.minimum(margin, top_gap(torch, gs, self.topk_group))
            keep = torch.sort(gs, dim=-1, descending=True, stable=True).indices
            mask = torch.zeros_like(gs, dtype=torch.bool)
            mask.scatter_(1, keep[:, :self.topk_group], True)
            mask = mask.unsqueeze(-1).expand(T, self.n_group, G).reshape(T, self.E)
            sel = sel.masked_fill(~mask, float("-inf"))
        return torch.minimum(margin, top_gap(torch, sel, self.k))


class Qwen3Next(Case):
    """Qwen3NextSparseMoeBlock: softmax routing, norm_topk_prob, a shared expert scaled by
    sigmoid(shared_expert_gate(x))."""

    def __init__(self, torch, transformers, sct, rnd, *, E, k, H, I, Is):
        from transformers.models.qwen3_next.modeling_qwen3_next import \
            Qwen3NextSparseMoeBlock
        self.torch, self.name = torch, "qwen3-next"
        self.E, self.k, self.H, self.I = E, k, H, I
        cfg = transformers.Qwen3NextConfig(
            hidden_size=H, moe_intermediate_size=I, shared_expert_intermediate_size=Is,
            num_experts=E, num_experts_per_tok=k, norm_topk_prob=True, hidden_act="silu",
            num_hidden_layers=1)
        cfg._experts_implementation = "eager"
        with torch.device("cuda"):
            self.block = Qwen3NextSparseMoeBlock(cfg).float().eval()
        self.router = rnd.normal(E, H, std=H ** -0.5)
        self.w13 = rnd.normal(E, 2 * I, H, std=H ** -0.5)
        self.w2 = rnd.normal(E, H, I, std=I ** -0.5)
        self.sw13 = rnd.normal(2 * Is, H, std=H ** -0.5)
        self.sw2 = rnd.normal(H, Is, std=Is ** -0.5)
        self.sgate = rnd.normal(1, H, std=H ** -0.5)  # Linear(H, 1).weight
        ld = Loader(torch, self.block, transformers.__version__)
        ld.set("gate.weight", self.router)
        ld.set("experts.gate_up_proj", self.w13)
        ld.set("experts.down_proj", self.w2)
        ld.set("shared_expert.gate_proj.weight", self.sw13[:Is])
        ld.set("shared_expert.up_proj.weight", self.sw13[Is:])
        ld.set("shared_expert.down_proj.weight", self.sw2)
        ld.set("shared_expert_gate.weight", self.sgate)
        ld.check_all()
        self.gate = self.block.gate
        self.layer = hf_layer(torch, sct, self.block, self.name, dict(
            router_weight=self.router, w13=self.w13, w2=self.w2, top_k=k, scoring="softmax",
            renormalize=True, shared_w13=self.sw13, shared_w2=self.sw2,
            shared_gate=self.sgate))
        self.routed_scaling = 1.0
        self.describe = (f"Qwen3NextSparseMoeBlock E={E} k={k} H={H} I={I} shared I_s={Is} "
                         f"gated")

    def shared_output(self, xf):
        b = self.block
        return self.torch.sigmoid(b.shared_expert_gate(xf)) * b.shared_expert(xf)

    def margins(self, x):
        logits = x.double() @ self.router.double().t()  # softmax keeps their order
        return top_gap(self.torch, logits, self.k)


class GptOss(Case):
    """GptOssMLP: router with a bias, top-k then softmax, clamped SwiGLU, interleaved
    gate/up, biases on both projections, input-major expert weights."""

    def __init__(self, torch, transformers, sct, rnd, *, E, k, H, I):
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
        self.torch, self.name = torch, "gpt-oss"
        self.E, self.k, self.H, self.I = E, k, H, I
        cfg = transformers.GptOssConfig(hidden_size=H, intermediate_size=I,
                                        num_local_experts=E, num_experts_per_tok=k,
                                        num_hidden_layers=1)
        cfg._experts_implementation = "eager"
        with torch.device("cuda"):
            self.block = GptOssMLP(cfg).float().eval()
        ex = self.block.experts
        self.alpha, self.limit = float(ex.alpha), float(ex.limit)
        self.router = rnd.normal(E, H, std=H ** -0.5)
        self.router_bias = rnd.normal(E, std=0.5, dtype=torch.float32)
        # safecuda's layouts: W13 [E, 2I, H] rows gate, up, gate, up, ...; W2 [E, H, I].
        self.w13 = rnd.normal(E, 2 * I, H, std=3.0 * H ** -0.5)
        self.b13 = rnd.normal(E, 2 * I, std=0.5, dtype=torch.float32)
        self.w2 = rnd.normal(E, H, I, std=I ** -0.5)
        self.b2 = rnd.normal(E, H, std=0.5, dtype=torch.float32)
        ld = Loader(torch, self.block, transformers.__version__)
        ld.set("router.weight", self.router)
        ld.set("router.bias", self.router_bias)
        gu = ex.gate_up_proj
        if tuple(gu.shape) == (E, H, 2 * I):  # input-major (transformers 5.17)
            ld.set("experts.gate_up_proj", self.w13.transpose(1, 2))
            gu_layout = "[E, H, 2I] input-major: transposed"
        else:
            ld.set("experts.gate_up_proj", self.w13)
            gu_layout = "[E, 2I, H]: as it is"
        ld.set("experts.gate_up_proj_bias", self.b13)
        if tuple(ex.down_proj.shape) == (E, I, H):
            ld.set("experts.down_proj", self.w2.transpose(1, 2))
            dp_layout = "[E, I, H] input-major: transposed"
        else:
            ld.set("experts.down_proj", self.w2)
            dp_layout = "[E, H, I]: as it is"
        ld.set("experts.down_proj_bias", self.b2)
        ld.check_all()
        self.gate = self.block.router
        self.layer = hf_layer(torch, sct, self.block, self.name, dict(
            router_weight=self.router, w13=self.w13, w2=self.w2, top_k=k, scoring="softmax",
            renormalize=True, router_bias=self.router_bias, activation="swiglu_clamp",
            swiglu_alpha=self.alpha, swiglu_limit=self.limit, w13_layout="interleaved",
            w13_bias=self.b13, w2_bias=self.b2))
        self.routed_scaling = 1.0
        self.describe = (f"GptOssMLP E={E} k={k} H={H} I={I} alpha={self.alpha} "
                         f"limit={self.limit}")
        inter = source_has(type(ex), "::2")
        self.notes = (f"gate_up_proj {gu_layout}, down_proj {dp_layout}",
                      "gate/up interleaved (gate_up[..., ::2], [..., 1::2]) as w13_layout "
                      "'interleaved'" if inter is not False else
                      "WARNING: GptOssExperts' source has no '::2': gate/up may no longer be "
                      "interleaved in this transformers (a mismatch below would say so)")

    def margins(self, x):
        logits = x.double() @ self.router.double().t() + self.router_bias.double()
        return top_gap(self.torch, logits, self.k)

    def clamp_share(self, x):
        """The share of gate and up values (all experts, these tokens) the clamps change."""
        torch = self.torch
        xf = x.float()
        g = torch.einsum("th,eih->tei", xf, self.w13[:, 0::2, :].float()) + self.b13[:, 0::2]
        u = torch.einsum("th,eih->tei", xf, self.w13[:, 1::2, :].float()) + self.b13[:, 1::2]
        return ((g > self.limit).float().mean().item(),
                (u.abs() > self.limit).float().mean().item())


MODELS = {
    "deepseek-v3": lambda t, tr, s, r: DeepSeek(
        t, tr, s, r, name="deepseek-v3", E=256, k=8, H=1024, I=256, n_group=8, topk_group=4,
        routed_scaling=2.5, n_shared=1),
    "kimi-k2": lambda t, tr, s, r: DeepSeek(
        t, tr, s, r, name="kimi-k2", E=384, k=8, H=512, I=256, n_group=1, topk_group=1,
        routed_scaling=2.827, n_shared=1),
    "qwen3-next": lambda t, tr, s, r: Qwen3Next(t, tr, s, r, E=512, k=10, H=1024, I=256,
                                                Is=256),
    "gpt-oss": lambda t, tr, s, r: GptOss(t, tr, s, r, E=32, k=4, H=768, I=512),
}


# ---- the comparison ------------------------------------------------------------------------------


def rel_l2(torch, a, b):
    d = (a.float() - b.float()).norm()
    n = b.float().norm()
    return (d / n).item() if n > 0 else d.item()


def compare(torch, case, x, T, stats):
    """One model, one T: returns a list of failure messages (empty: passed)."""
    fails = []
    tag = f"{case.name} T={T}"
    k = case.k
    # transformers, float32, its router's own choice read from the router module.
    seen = []
    hook = case.gate.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.no_grad():
            hf_out = case.hf_forward(x)
    finally:
        hook.remove()
    if len(seen) != 1:
        return [f"{tag}: the transformers router module ran {len(seen)} times in one forward "
                f"(expected once): the block's structure changed"]
    hf_ids, hf_w = case.hf_routing(seen[0])
    hf_ids, hf_w = hf_ids.reshape(T, -1), hf_w.reshape(T, -1).float()
    if hf_ids.shape != (T, k) or hf_w.shape != (T, k) or hf_ids.dtype.is_floating_point:
        return [f"{tag}: the transformers router returned ids {hf_ids.dtype} "
                f"{list(hf_ids.shape)} and weights {list(hf_w.shape)}; expected [T={T}, "
                f"k={k}] integer ids: its output tuple changed"]
    # safecuda: the routing alone, the forward with its own routing, and with the
    # transformers router's choice given.
    # The layer is a TransformersMoE, called as the block is (the output alone); the
    # safecuda.torch.MoE forward it derives from takes the options compared here.
    layer = lambda *a, **kw: super(type(case.layer), case.layer).forward(*a, **kw)  # noqa: E731
    sc_ids, sc_w = case.layer.route(x)
    sc_out, f_ids, f_w = layer(x, return_routing=True)
    sc_given = layer(x, routing=(hf_ids, hf_w))
    torch.cuda.synchronize()
    if not (torch.equal(f_ids, sc_ids) and torch.equal(f_w, sc_w)):
        fails.append(f"{tag}: the forward's own routing differs from MoE.route's on "
                     f"{int((f_ids != sc_ids).any(dim=1).sum())} tokens (sc_moe_route must "
                     f"write exactly what the forward uses)")
    # The choice of experts.
    hs, ss = hf_ids.sort(dim=1), sc_ids.long().sort(dim=1)
    differ = (hs.values != ss.values).any(dim=1)
    margin = case.margins(x)
    ties = margin < TIE_EPS
    bad = differ & ~ties
    n_differ, n_ties = int(differ.sum()), int(ties.sum())
    stats["tokens"] += T
    stats["ties"] += n_ties
    stats["tie_differ"] += int((differ & ties).sum())
    if bad.any():
        rows = bad.nonzero().flatten().tolist()
        lines = [f"token {t}: transformers {hs.values[t].tolist()}, safecuda "
                 f"{ss.values[t].tolist()}, gap {margin[t].item():.3g}" for t in rows[:5]]
        fails.append(f"{tag}: {len(rows)} tokens chose other experts than the transformers "
                     f"router where the choice is no near-tie (gap >= {TIE_EPS}): the "
                     f"routing differs (scoring, selection bias, groups, router bias?):\n    "
                     + "\n    ".join(lines))
    agree = ~differ
    # The weights of the tokens that agree (paired by expert id).
    if agree.any():
        hw = hf_w.gather(1, hs.indices)[agree]
        sw = sc_w.gather(1, ss.indices)[agree]
        wdiff = (hw - sw).abs().max().item()
        tol = 1e-4 * max(1.0, case.routed_scaling) + 1e-3 * hw.abs().max().item()
        if wdiff > tol:
            fails.append(f"{tag}: routing weights differ by up to {wdiff:.3g} (tolerance "
                         f"{tol:.3g}) on tokens with the same experts: renormalization or "
                         f"routed scaling (transformers {hw[0].tolist()} vs safecuda "
                         f"{sw[0].tolist()} on the first)")
    else:
        wdiff = float("nan")
    # The outputs.
    own = rel_l2(torch, sc_out[agree], hf_out[agree]) if agree.any() else 0.0
    given = rel_l2(torch, sc_given, hf_out)
    worst = (sc_given.float() - hf_out).abs().max().item()
    scale = hf_out.abs().max().item()
    if given > GIVEN_TOL:
        hint = ("the routing is the transformers router's own here, so the difference is in "
                "the experts (activation, W13 layout or interleaving, biases, shared expert "
                "and its gate)")
        with torch.no_grad():
            shared = case.shared_output(x.float())
        if shared is not None:
            with torch.no_grad():
                d = sc_given.float() - hf_out
                miss = rel_l2(torch, d, -shared)
                twice = rel_l2(torch, d, shared)
            hint += (f"; rel L2 of (safecuda - transformers) against -(the transformers "
                     f"shared expert's output): {miss:.3g} (near 0: safecuda left the shared "
                     f"expert out), against +(it): {twice:.3g} (near 0: counted twice)")
        fails.append(f"{tag}: output with the transformers routing given: relative L2 "
                     f"{given:.3g} > {GIVEN_TOL} (largest element error {worst:.3g}, largest "
                     f"|output| {scale:.3g}); {hint}")
    if own > OUT_TOL:
        fails.append(f"{tag}: output with safecuda's own routing: relative L2 {own:.3g} > "
                     f"{OUT_TOL} on the {int(agree.sum())} tokens whose experts agree"
                     + ("; with the transformers routing given it matches, so the routing "
                        "weights differ (renormalization, routed scaling)"
                        if given <= GIVEN_TOL else ""))
    extra = ""
    if T == 129:
        # out += layer(x): on top of a random residual, with the transformers routing.
        g = torch.Generator(device="cuda").manual_seed(T)
        residual = torch.randn(T, case.H, device="cuda", generator=g).to(torch.bfloat16)
        acc = residual.clone()
        layer(x, routing=(hf_ids, hf_w), accumulate_into=acc)
        acc_own = residual.clone()
        layer(x, accumulate_into=acc_own)
        torch.cuda.synchronize()
        want = residual.float() + hf_out
        a1 = rel_l2(torch, acc, want)
        a2 = rel_l2(torch, acc_own[agree], want[agree]) if agree.any() else 0.0
        extra = f"; accumulate rel L2 {a1:.2e} / {a2:.2e}"
        if a1 > OUT_TOL or a2 > OUT_TOL:
            fails.append(f"{tag}: out += layer(x) (accumulate): relative L2 {a1:.3g} "
                         f"(transformers routing given), {a2:.3g} (own routing) against "
                         f"residual + the transformers output; > {OUT_TOL}"
                         + ("; the plain forward matches, so the accumulation is wrong"
                            if max(given, own) <= OUT_TOL else ""))
    say(f"  {tag}: experts: {n_differ} of {T} tokens differ, {n_ties} near-ties (gap < "
        f"{TIE_EPS}); weights max diff {wdiff:.2e}; out rel L2 {own:.2e} (own routing), "
        f"{given:.2e} (transformers routing){extra}: {'FAILED' if fails else 'ok'}")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--tokens", default="1,7,129,1000")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    tokens = [int(t) for t in args.tokens.split(",")]

    torch, transformers, sct = environment()
    import safecuda
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    say(f"torch {torch.__version__}, transformers {transformers.__version__}, safecuda "
        f"{safecuda.version()} ({safecuda.library_path()}), "
        f"{torch.cuda.get_device_name(0)}")
    failures, checks = [], 0
    stats = dict(tokens=0, ties=0, tie_differ=0)
    t0 = time.time()
    for mi, name in enumerate(models):
        rnd = Rand(torch, args.seed * 1000 + mi)
        try:
            case = MODELS[name](torch, transformers, sct, rnd)
        except LayoutError as exc:
            failures.append(f"{name}: {exc}")
            say(f"{name}: FAILED to set up: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - one model's failure must not hide the rest
            failures.append(f"{name}: setting up raised {type(exc).__name__}: {exc}")
            say(f"{name}: FAILED to set up (building the transformers block from its config or "
                f"the safecuda layer over the same weights):")
            traceback.print_exc()
            continue
        say(f"{name}: {case.describe}")
        for note in case.notes:
            say(f"  {note}")
        for T in tokens:
            checks += 1
            x = Rand(torch, args.seed * 1000 + 100 * mi + T).normal(T, case.H)
            try:
                # The layer is forward-only: it refuses a forward that would need gradients
                # (the block's parameters require grad), as a patched model does outside
                # no_grad / inference_mode.
                with torch.no_grad():
                    fails = compare(torch, case, x, T, stats)
            except Exception as exc:  # noqa: BLE001
                fails = [f"{name} T={T}: raised {type(exc).__name__}: {exc}"]
                say(f"  {name} T={T}: FAILED with an exception:")
                traceback.print_exc()
            for f in fails:
                say(f"  FAIL {f}")
            failures += fails
        if isinstance(case, GptOss):
            g, u = case.clamp_share(Rand(torch, 7).normal(129, case.H))
            say(f"  the clamps act on {100 * g:.1f}% of gate and {100 * u:.1f}% of up values")
        case.layer.close()
        del case
        torch.cuda.empty_cache()
    say()
    ties = (f"near-ties: {stats['ties']} of {stats['tokens']} tokens, "
            f"{stats['tie_differ']} of them chose differently")
    if failures:
        say(f"FAILED: {len(failures)} failure(s) in {checks} comparisons of {len(models)} "
            f"models ({ties}; {time.time() - t0:.0f} s); the first: {failures[0][:300]}")
        return 1
    say(f"PASSED: {checks} comparisons ({len(models)} models x T = "
        f"{','.join(map(str, tokens))}) against transformers {transformers.__version__} "
        f"in float32, outputs within relative L2 {OUT_TOL}; {ties} "
        f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
