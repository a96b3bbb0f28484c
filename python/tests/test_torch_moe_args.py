"""safecuda.torch.MoE's checks of its weight arguments, with torch and no GPU: the dtypes,
shapes and contiguity are checked before where the tensors are, so CPU tensors show every
refusal (bf16 and fp8 experts, the fp8 block scales), and a set that passes them all is
refused only for not being on a CUDA device. Nothing is borrowed and the library is not
called. Also: the pure-torch fp8 quantization helper of docs/INTEROP.md is the tests'
(moe_reference.quantize_fp8_blocks). Skipped without torch (GPU runs: test_gpu_torch*.py)."""

import os
import re

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip(f"safecuda.torch needs torch >= 2.4; this is {torch.__version__}",
                allow_module_level=True)

import safecuda.torch as sct  # noqa: E402
from moe_reference import dequantize_fp8_blocks, quantize_fp8_blocks, rel_l2  # noqa: E402

E, K, H, I_, S = 8, 2, 256, 128, 128
BF16, F8, F32 = torch.bfloat16, torch.float8_e4m3fn, torch.float32


def tensors(fp8=True, shared=True):
    """CPU weights of a small layer: (router, w13, w2, options)."""
    xd = F8 if fp8 else BF16
    router = torch.zeros(E, H, dtype=BF16)
    w13 = torch.zeros(E, 2 * I_, H, dtype=xd)
    w2 = torch.zeros(E, H, I_, dtype=xd)
    opts = {}
    if fp8:
        opts.update(w13_scale=torch.ones(E, 2 * I_ // 128, H // 128),
                    w2_scale=torch.ones(E, H // 128, I_ // 128))
    if shared:
        opts.update(shared_w13=torch.zeros(2 * S, H, dtype=xd),
                    shared_w2=torch.zeros(H, S, dtype=xd))
        if fp8:
            opts.update(shared_w13_scale=torch.ones(2 * S // 128, H // 128),
                        shared_w2_scale=torch.ones(H // 128, S // 128))
    return router, w13, w2, opts


def make(router, w13, w2, **opts):
    return sct.MoE(router, w13, w2, top_k=K, **opts)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_a_valid_set_is_refused_only_for_its_device(fp8, shared):
    router, w13, w2, opts = tensors(fp8, shared)
    with pytest.raises(ValueError, match="router_weight is on cpu, not a CUDA device"):
        make(router, w13, w2, **opts)


def _fp8_case(change):
    router, w13, w2, opts = tensors()
    args = dict(router=router, w13=w13, w2=w2, **opts)
    change(args)
    return args


def _bf16_case(change, shared=False):
    router, w13, w2, opts = tensors(fp8=False, shared=shared)
    args = dict(router=router, w13=w13, w2=w2, **opts)
    change(args)
    return args


def _set(**kv):
    def change(a):
        for k, v in kv.items():
            if v is None:
                a.pop(k, None)
            else:
                a[k] = v(a) if callable(v) else v
    return change


W = "safecuda.torch.MoE: "
CASES = {
    # scales with bf16 experts
    "bf16 experts with w13_scale": (
        _bf16_case(_set(w13_scale=torch.ones(E, 2, 2))), ValueError,
        W + r"w13_scale is given but the experts' weights \(w13, w2, shared_w13, shared_w2\) "
            r"are torch.bfloat16: block scales go with float8_e4m3fn experts"),
    "bf16 experts with shared_w2_scale": (
        _bf16_case(_set(shared_w2_scale=torch.ones(2, 1)), shared=True), ValueError,
        "shared_w2_scale is given but the experts' weights"),
    # fp8 experts without their scales
    "fp8 without w13_scale": (
        _fp8_case(_set(w13_scale=None)), ValueError,
        W + r"the experts are float8_e4m3fn: give w13_scale, float32 \[E, 2I/128, H/128\] = "
            r"\[8, 2, 2\] \(the checkpoint's weight_scale_inv: weight = e4m3 value x scale\)"),
    "fp8 without w2_scale": (
        _fp8_case(_set(w2_scale=None)), ValueError,
        r"give w2_scale, float32 \[E, H/128, I/128\] = \[8, 2, 1\]"),
    "fp8 without shared_w13_scale": (
        _fp8_case(_set(shared_w13_scale=None)), ValueError,
        r"give shared_w13_scale, float32 \[2 I_s/128, H/128\] = \[2, 2\]"),
    "fp8 without shared_w2_scale": (
        _fp8_case(_set(shared_w2_scale=None)), ValueError,
        r"give shared_w2_scale, float32 \[H/128, I_s/128\] = \[2, 1\]"),
    "shared scales without a shared expert": (
        _fp8_case(_set(shared_w13=None, shared_w2=None)), ValueError,
        r"shared_w13_scale is given without a shared expert \(shared_w13, shared_w2\)"),
    # scales of another dtype, shape or layout
    "bf16 scale": (
        _fp8_case(_set(w2_scale=lambda a: a["w2_scale"].to(BF16))), TypeError,
        W + r"w2_scale is torch.bfloat16; the layer takes w2_scale as torch.float32 "
            r"\[E, H/128, I/128\] = \[8, 2, 1\] \(pass .float\(\)\)"),
    "scale of the wrong shape": (
        _fp8_case(_set(w2_scale=torch.ones(E, 1, 2))), ValueError,
        W + r"w2_scale must be float32 \[E, H/128, I/128\] = \[8, 2, 1\]; got \[8, 1, 2\]"),
    "scale padded (ceil) beyond the blocks": (
        _fp8_case(_set(w13_scale=torch.ones(E, 3, 2))), ValueError,
        r"w13_scale must be float32 \[E, 2I/128, H/128\] = \[8, 2, 2\]; got \[8, 3, 2\]"),
    "flat scale": (
        _fp8_case(_set(shared_w13_scale=torch.ones(4))), ValueError,
        r"shared_w13_scale must be float32 \[2 I_s/128, H/128\] = \[2, 2\]; got \[4\]"),
    "scale not contiguous": (
        _fp8_case(_set(w13_scale=torch.ones(E, 2, 2).transpose(1, 2))), ValueError,
        W + r"w13_scale is not contiguous; the layer borrows the weights without copying "
            r"them: pass w13_scale.contiguous\(\)"),
    "scale not a tensor": (
        _fp8_case(_set(w13_scale=[1.0] * 32)), TypeError,
        W + "w13_scale must be a torch tensor, not list"),
    # the experts' dtypes
    "fp8 w13, bf16 w2": (
        _fp8_case(_set(w2=torch.zeros(E, H, I_, dtype=BF16))), TypeError,
        W + r"w2 is torch.bfloat16 and w13 torch.float8_e4m3fn: the experts' weights \(w13, "
            r"w2, shared_w13, shared_w2\) share one dtype, bfloat16 or float8_e4m3fn"),
    "fp8 experts, bf16 shared expert": (
        _fp8_case(_set(shared_w13=torch.zeros(2 * S, H, dtype=BF16))), TypeError,
        "shared_w13 is torch.bfloat16 and w13 torch.float8_e4m3fn"),
    "e5m2 experts": (
        _fp8_case(_set(w13=torch.zeros(E, 2 * I_, H, dtype=torch.float8_e5m2))), TypeError,
        W + r"w13 is torch.float8_e5m2; the layer takes bfloat16 weights, or float8_e4m3fn "
            r"experts with their block scales"),
    "float32 experts": (
        _bf16_case(_set(w13=torch.zeros(E, 2 * I_, H))), TypeError,
        r"w13 is torch.float32; the layer takes bfloat16 weights, or float8_e4m3fn"),
    "fp8 router": (
        _fp8_case(_set(router=torch.zeros(E, H, dtype=F8))), TypeError,
        W + "router_weight is torch.float8_e4m3fn; the layer takes bfloat16 weights"),
    # the backend
    "fp8 on the mma backend": (
        _fp8_case(_set(backend="mma")), ValueError,
        W + r"backend='mma' can't run float8_e4m3fn experts: they run on the SM90 backend "
            r"only"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refusals_name_the_argument(name):
    args, exc, match = CASES[name]
    args = dict(args)
    router, w13, w2 = args.pop("router"), args.pop("w13"), args.pop("w2")
    with pytest.raises(exc, match=match):
        make(router, w13, w2, **args)


@pytest.mark.parametrize("hidden,inter", [(192, 128), (256, 64), (384, 96)])
def test_fp8_sizes_are_multiples_of_128(hidden, inter):
    router = torch.zeros(E, hidden, dtype=BF16)
    w13 = torch.zeros(E, 2 * inter, hidden, dtype=F8)
    w2 = torch.zeros(E, hidden, inter, dtype=F8)
    s = torch.ones(E, 1, 1)
    with pytest.raises(ValueError, match=rf"float8_e4m3fn experts need hidden and "
                                         rf"intermediate multiples of 128 \(their scales are "
                                         rf"per 128 x 128 block\); H = {hidden}, I = {inter}"):
        make(router, w13, w2, w13_scale=s, w2_scale=s)


def test_bf16_checks_as_before():
    router, w13, w2, _ = tensors(fp8=False, shared=False)
    with pytest.raises(TypeError, match="router_weight is torch.float32; the layer takes "
                                        "bfloat16 weights"):
        make(router.float(), w13, w2)
    with pytest.raises(ValueError, match="w13 is not contiguous"):
        make(router, w13.transpose(1, 2), w2)
    with pytest.raises(ValueError, match=r"w13 must be \[8, 256, 256\] and w2 \[8, 256, 128\]"):
        make(router, w13[:, :128].contiguous(), w2)
    with pytest.raises(TypeError, match=r"w13_bias is torch.bfloat16; the layer takes "
                                        r"w13_bias as torch.float32 \(pass .float\(\)\)"):
        make(router, w13, w2, w13_bias=torch.zeros(E, 2 * I_, dtype=BF16))
    with pytest.raises(TypeError, match="unknown option"):
        make(router, w13, w2, w13_scales=torch.ones(E, 2, 2))


# ---- the quantization helper of docs/INTEROP.md ---------------------------------------------

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "docs", "INTEROP.md")


def _doc_helper():
    if not os.path.exists(DOC):
        pytest.skip("docs/INTEROP.md is not beside the tests: run them from a checkout")
    with open(DOC) as f:
        text = f.read()
    m = re.search(r"```python\n(def quantize_fp8_blocks\(.*?)```", text, flags=re.S)
    assert m, "docs/INTEROP.md: the fp8 example's quantize_fp8_blocks not found"
    # The function alone (the example's code after it uses a model).
    code = m.group(1).split("\n\n\n")[0]
    scope = {"torch": torch}
    exec(compile(code, DOC, "exec"), scope)
    return scope["quantize_fp8_blocks"]


def test_the_doc_helper_is_the_tests_quantization():
    helper = _doc_helper()
    g = torch.Generator().manual_seed(5)
    w = torch.randn(3, 256, 384, generator=g)
    # Blocks of very different magnitudes, and one block all zero (scale 1).
    w = w * torch.tensor([0.01, 1.0, 30.0]).repeat_interleave(128).reshape(1, 1, 384)
    w[1, :128, :128] = 0
    w = w.to(BF16)
    q, s = helper(w)
    q_ref, s_ref = quantize_fp8_blocks(torch, w)
    assert q.dtype == F8 and s.dtype == F32
    assert tuple(q.shape) == (3, 256, 384) and tuple(s.shape) == (3, 2, 3)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s, s_ref)
    assert s[1, 0, 0].item() == 1.0
    # Dequantized, the weights within e4m3's relative precision of the originals.
    d = dequantize_fp8_blocks(torch, q, s)
    assert rel_l2(d, w) < 0.05
    assert (q.float().abs().amax(dim=(-1, -2)) <= 448).all()


class _Rank:
    """A stand-in for a safecuda.torch.Comm where only its rank and size are read (the
    shapes are checked before anything else: a set that passes is refused for its device)."""

    def __init__(self, rank, nranks):
        self.rank, self.nranks = rank, nranks


@pytest.mark.parametrize("fp8", [False, True])
def test_expert_parallel_shapes_are_the_ranks_experts(fp8):
    router, w13, w2, opts = tensors(fp8)
    half = {k: v[: E // 2] for k, v in opts.items() if k in ("w13_scale", "w2_scale")}
    opts = dict(opts, **half)
    # rank 1 of 2, contiguous: 4 experts; the router stays [E, H]
    with pytest.raises(ValueError, match="router_weight is on cpu, not a CUDA device"):
        make(router, w13[: E // 2], w2[: E // 2], ep_comm=_Rank(1, 2), **opts)
    # the full experts' tensors on a rank: refused, naming what the rank holds
    with pytest.raises(ValueError, match=r"w13 must be \[4, 256, 256\] and w2 \[4, 256, 128\] "
                       r"\(the 4 experts rank 1 of 2 holds of the 8\)"):
        make(router, w13, w2, ep_comm=_Rank(1, 2), **dict(tensors(fp8)[3]))
    # a listed map: rank 0 holds experts 0 and 5
    owner = [0, 1, 1, 1, 1, 0, 1, 1]
    two = {k: v[:2] for k, v in opts.items() if k in ("w13_scale", "w2_scale")}
    with pytest.raises(ValueError, match="router_weight is on cpu, not a CUDA device"):
        make(router, w13[:2], w2[:2], ep_comm=_Rank(0, 2), ep_owner=owner, **dict(opts, **two))
    with pytest.raises(ValueError, match=r"ep_owner\[2\] = 3: each expert's rank is 0 .. 1"):
        make(router, w13[:2], w2[:2], ep_comm=_Rank(0, 2), ep_owner=[0, 1, 3, 1, 1, 0, 1, 1],
             **dict(opts, **two))
    with pytest.raises(ValueError, match="experts = 8 is not a multiple of ep_comm's 3 ranks"):
        make(router, w13[:2], w2[:2], ep_comm=_Rank(0, 3), **dict(opts, **two))


def test_expert_parallel_arguments_read_once_and_typed():
    router, w13, w2, opts = tensors(False)
    # an owner map given as an iterator is read once, as a list
    owner = iter([0, 1, 1, 1, 1, 0, 1, 1])
    with pytest.raises(ValueError, match="router_weight is on cpu, not a CUDA device"):
        make(router, w13[:2], w2[:2], ep_comm=_Rank(0, 2), ep_owner=owner, **opts)
    with pytest.raises(TypeError, match="ep_comm must be a safecuda.Comm"):
        make(router, w13[:2], w2[:2], ep_comm=object(), **opts)


def test_an_expert_parallel_forward_is_never_traced():
    # every rank's forward is a collective: torch.compile must not drop one (a graph break)
    assert getattr(sct._ep_forward, "_torchdynamo_disable", False) or \
        not hasattr(torch.compiler, "disable")
