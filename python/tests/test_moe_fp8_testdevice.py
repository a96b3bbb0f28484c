"""safecuda.MoE with fp8 experts on the test device (SAFECUDA_DEVICE=test, in a child
process: see conftest.py): the desc fields the fp8 arguments fill (expert_dtype and the
four block-scale views, at the offsets test_struct_layout.py pins), every refusal the
Python side makes before the library is called (each naming the argument, the expected
dtype and shape), the library's own checks passed through, and, where NVRTC is at hand,
fp8 layers made and forwards issued: the test device runs no kernel, but every launch
passes the library's checks of its arguments against the kernels' parameters. The
results are checked on a GPU (test_gpu_torch_fp8.py)."""

import pytest

import safecuda as sc
from safecuda import _moe
from safecuda._moe import build_desc

pytestmark = pytest.mark.testdevice

# A DeepSeek-V3-like layer at test size: H = 2 blocks, I = 1 block, a shared expert of I.
E, K, H, I_, S = 8, 2, 256, 128, 128
F8 = "f8e4m3"


@pytest.fixture
def ctx():
    with sc.Context() as c:
        yield c


@pytest.fixture
def w(ctx):
    """The weights of a small fp8 layer with a shared expert, and bf16 twins."""
    bufs = dict(
        router=ctx.buffer((E, H), "bf16", label="router"),
        w13=ctx.buffer((E, 2 * I_, H), F8, label="w13"),
        w2=ctx.buffer((E, H, I_), F8, label="w2"),
        w13_scale=ctx.buffer((E, 2 * I_ // 128, H // 128), "f32", label="w13_scale"),
        w2_scale=ctx.buffer((E, H // 128, I_ // 128), "f32", label="w2_scale"),
        shared_w13=ctx.buffer((2 * S, H), F8, label="shared_w13"),
        shared_w2=ctx.buffer((H, S), F8, label="shared_w2"),
        shared_w13_scale=ctx.buffer((2 * S // 128, H // 128), "f32", label="shared_w13_scale"),
        shared_w2_scale=ctx.buffer((H // 128, S // 128), "f32", label="shared_w2_scale"),
        shared_gate=ctx.buffer(H, "bf16", label="shared_gate"),
        selection_bias=ctx.buffer(E, "f32", label="selection_bias"),
        w13_bf16=ctx.buffer((E, 2 * I_, H), "bf16", label="w13 bf16"),
        w2_bf16=ctx.buffer((E, H, I_), "bf16", label="w2 bf16"),
        shared_w13_bf16=ctx.buffer((2 * S, H), "bf16", label="shared_w13 bf16"),
        shared_w2_bf16=ctx.buffer((H, S), "bf16", label="shared_w2 bf16"))
    yield bufs
    for b in bufs.values():
        b.close()


ROUTED = ("w13_scale", "w2_scale")
SHARED = ("shared_w13", "shared_w2", "shared_w13_scale", "shared_w2_scale")


def fp8_kw(w, shared=True):
    kw = {n: w[n] for n in ROUTED}
    if shared:
        kw.update((n, w[n]) for n in SHARED)
    return kw


class _NoLibrary:
    """Stands in for the library in _moe: a refusal must come before any call into it."""

    def __getattr__(self, name):
        raise AssertionError(f"the library was called ({name}) before the Python-side "
                             f"refusal")


@pytest.fixture
def no_library(monkeypatch):
    monkeypatch.setattr(_moe, "lib", _NoLibrary())


# ---- the desc fields ------------------------------------------------------------------------


def test_fp8_weights_fill_expert_dtype_and_the_scale_views(w):
    desc, info = build_desc(w["router"], w["w13"], w["w2"], top_k=K, **fp8_kw(w))
    assert desc.expert_dtype == int(sc.DType.F8E4M3) == 13
    assert info.expert_dtype is sc.DType.F8E4M3
    assert (desc.w13, desc.w2) == (w["w13"].handle, w["w2"].handle)
    for field in ("w13_scale", "w2_scale", "shared_w13", "shared_w2", "shared_w13_scale",
                  "shared_w2_scale"):
        sv, b = getattr(desc, field), w[field]
        assert (sv.buffer, sv.offset, sv.count) == (b.handle, 0, b.count), field
    assert desc.shared_intermediate == S and info.shared_intermediate == S
    # The layer keeps the scales alive with the weights.
    assert all(any(k is w[n] for k in info.keep) for n in ROUTED + SHARED)
    # Without a shared expert the shared scale fields stay zero.
    desc, _ = build_desc(w["router"], w["w13"], w["w2"], top_k=K, **fp8_kw(w, False))
    assert desc.shared_w13_scale.buffer == 0 and desc.shared_w2_scale.buffer == 0
    assert desc.shared_intermediate == 0


def test_bf16_weights_leave_the_fp8_fields_zero(w):
    desc, info = build_desc(w["router"], w["w13_bf16"], w["w2_bf16"], top_k=K)
    assert desc.expert_dtype == int(sc.DType.BF16) and info.expert_dtype is sc.DType.BF16
    for field in ("w13_scale", "w2_scale", "shared_w13_scale", "shared_w2_scale"):
        sv = getattr(desc, field)
        assert (sv.buffer, sv.offset, sv.count) == (0, 0, 0), field


def test_fp8_views_of_one_checkpoint(ctx):
    """A checkpoint as one e4m3 allocation and one f32 allocation: views at 16-byte
    offsets, the scales as flat views of the right count."""
    n13, n2, s13, s2 = E * 2 * I_ * H, E * H * I_, E * 2 * 2, E * 2 * 1
    f8 = ctx.buffer(n13 + n2 + 64, F8, label="checkpoint e4m3")
    f32 = ctx.buffer(s13 + s2 + 8, "f32", label="checkpoint scales")
    router = ctx.buffer((E, H), "bf16")
    w13 = f8.view(16, n13, (E, 2 * I_, H))
    w2 = f8.view(n13 + 48, n2, (E, H, I_))
    w13_scale = f32.view(4, s13)               # flat: its count is checked
    w2_scale = f32.view(4 + s13 + 4, s2, (E, 2, 1))
    desc, info = build_desc(router, w13, w2, top_k=K, w13_scale=w13_scale, w2_scale=w2_scale)
    assert desc.expert_dtype == 13
    assert (desc.w13, desc.w2) == (0, 0)
    assert (desc.w13_view.buffer, desc.w13_view.offset, desc.w13_view.count) == \
        (f8.handle, 16, n13)
    assert (desc.w2_view.buffer, desc.w2_view.offset) == (f8.handle, n13 + 48)
    assert (desc.w13_scale.buffer, desc.w13_scale.offset, desc.w13_scale.count) == \
        (f32.handle, 4, s13)
    assert (desc.w2_scale.buffer, desc.w2_scale.offset, desc.w2_scale.count) == \
        (f32.handle, 4 + s13 + 4, s2)
    assert (info.experts, info.hidden, info.intermediate) == (E, H, I_)
    for b in (f8, f32, router):
        b.close()


# ---- the Python side's refusals (before the library is called) ----------------------------------


def _swap(w, **changes):
    """The fp8 layer's arguments with some replaced (None: left out)."""
    kw = dict(router=w["router"], w13=w["w13"], w2=w["w2"], **fp8_kw(w))
    for k, v in changes.items():
        if v is None:
            kw.pop(k, None)
        else:
            kw[k] = w[v] if isinstance(v, str) and v in w else v
    return kw


REFUSALS = [
    # scales with bf16 experts
    (dict(w13="w13_bf16", w2="w2_bf16", shared_w13=None, shared_w2=None,
          shared_w13_scale=None, shared_w2_scale=None), ValueError,
     r"MoE: w13_scale is given but the experts \(w13, w2\) are bf16: block scales go with "
     r"f8e4m3 experts"),
    (dict(w13="w13_bf16", w2="w2_bf16", shared_w13="shared_w13_bf16",
          shared_w2="shared_w2_bf16", w13_scale=None, w2_scale=None, shared_w13_scale=None),
     ValueError, "shared_w2_scale is given but the experts"),
    # fp8 experts without their scales
    (dict(w13_scale=None), ValueError,
     r"MoE: the experts are f8e4m3: give w13_scale, f32 \[E, 2I/128, H/128\] = \[8, 2, 2\] "
     r"\(the checkpoint's weight_scale_inv"),
    (dict(w2_scale=None), ValueError, r"give w2_scale, f32 \[E, H/128, I/128\] = \[8, 2, 1\]"),
    (dict(shared_w13_scale=None), ValueError,
     r"give shared_w13_scale, f32 \[2 I_s/128, H/128\] = \[2, 2\]"),
    (dict(shared_w2_scale=None), ValueError,
     r"give shared_w2_scale, f32 \[H/128, I_s/128\] = \[2, 1\]"),
    # shared scales without a shared expert
    (dict(shared_w13=None, shared_w2=None), ValueError,
     r"shared_w13_scale is given without a shared expert \(shared_w13, shared_w2\)"),
    # scales of another dtype or shape
    (dict(w2_scale="w2_bf16"), TypeError,
     r"MoE: w2_scale is bf16; block scales are f32 \[E, H/128, I/128\] = \[8, 2, 1\]"),
    (dict(w2_scale="w13_scale"), ValueError,
     r"MoE: w2_scale must be f32 \[E, H/128, I/128\] = \[8, 2, 1\]; got shape \(8, 2, 2\)"),
    (dict(shared_w13_scale="shared_w2_scale"), ValueError,
     r"shared_w13_scale must be f32 \[2 I_s/128, H/128\] = \[2, 2\]; got shape \(2, 1\)"),
    (dict(w13_scale=b"\0" * 128), TypeError,
     "w13_scale must be a safecuda.Buffer or View, not bytes"),
    # experts of mixed dtypes, or e5m2
    (dict(w2="w2_bf16"), TypeError,
     r"MoE: w2 is bf16 and w13 f8e4m3: the experts' weights \(w13, w2, shared_w13, "
     r"shared_w2\) are all bf16 or all f8e4m3"),
    (dict(shared_w13="shared_w13_bf16"), TypeError, "shared_w13 is bf16 and w13 f8e4m3"),
    # the backend
    (dict(backend="mma"), ValueError,
     "backend='mma' can't run f8e4m3 experts: they run on the SM90 backend only"),
]


@pytest.mark.parametrize("changes,exc,match", REFUSALS, ids=[f"{i}" for i in range(len(REFUSALS))])
def test_fp8_refusals_name_the_argument(w, no_library, changes, exc, match):
    kw = _swap(w, **changes)
    router, w13, w2 = kw.pop("router"), kw.pop("w13"), kw.pop("w2")
    with pytest.raises(exc, match=match):
        sc.MoE(w["router"].context, router, w13, w2, top_k=K, **kw)


def test_fp8_flat_scale_of_the_wrong_count(ctx, w, no_library):
    flat = ctx.buffer(E * 2 * 2 + 1, "f32")
    with pytest.raises(ValueError, match=r"w13_scale must be f32 \[E, 2I/128, H/128\] = "
                                         r"\[8, 2, 2\]; got shape \(33,\)"):
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K, **_scales(w, w13_scale=flat))
    # A flat view of the right count is the same elements.
    desc, _ = build_desc(w["router"], w["w13"], w["w2"], top_k=K,
                         **_scales(w, w13_scale=flat.view(1, E * 2 * 2)))
    assert (desc.w13_scale.offset, desc.w13_scale.count) == (1, E * 2 * 2)
    flat.close()


def _scales(w, **changes):
    kw = fp8_kw(w, shared=False)
    kw.update(changes)
    return kw


@pytest.mark.parametrize("hidden,inter", [(192, 128), (256, 64), (320, 192)])
def test_fp8_sizes_are_multiples_of_128(ctx, no_library, hidden, inter):
    router = ctx.buffer((E, hidden), "bf16")
    w13 = ctx.buffer((E, 2 * inter, hidden), F8)
    w2 = ctx.buffer((E, hidden, inter), F8)
    s = ctx.buffer(E * 4, "f32")
    with pytest.raises(ValueError, match=rf"MoE: f8e4m3 experts need hidden and intermediate "
                                         rf"multiples of 128 \(their scales are per 128 x 128 "
                                         rf"block\); H = {hidden}, I = {inter}"):
        sc.MoE(ctx, router, w13, w2, top_k=K, w13_scale=s, w2_scale=s)
    for b in (router, w13, w2, s):
        b.close()


def test_e5m2_experts_are_refused(ctx, w, no_library):
    w13 = ctx.buffer((E, 2 * I_, H), "f8e5m2")
    w2 = ctx.buffer((E, H, I_), "f8e5m2")
    with pytest.raises(TypeError, match=r"MoE: w13 is f8e5m2; the experts are bf16, or "
                                        r"f8e4m3 \(OCP e4m3fn, torch.float8_e4m3fn\)"):
        sc.MoE(ctx, w["router"], w13, w2, top_k=K, **_scales(w))
    w13.close()
    w2.close()


# ---- the library's checks, and layers made -------------------------------------------------------


def _make(ctx, w, **kw):
    """An fp8 layer, or None where the test device's library can't compile the kernels."""
    try:
        return sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K, **kw)
    except sc.NoCompilerError:
        return None


def test_library_checks_an_fp8_view_s_alignment(ctx, w):
    # 4 bytes into an f32 buffer: the Python side takes the view, the library refuses it.
    big = ctx.buffer(E * 2 * 2 + 4, "f32", label="scales")
    with pytest.raises(sc.InvalidArgumentError) as info:
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K,
               **_scales(w, w13_scale=big.view(1, E * 2 * 2, (E, 2, 2))))
    m = info.value.message
    assert m.startswith("sc_moe_create") and "w13_scale" in m and "16-byte" in m, m
    big.close()


def test_library_checks_the_fp8_weights_counts(ctx, w):
    # A weight's element count is the library's to check (w13 given as half the experts).
    with pytest.raises(sc.InvalidArgumentError) as info:
        sc.MoE(ctx, w["router"], w["w13"][:E // 2].view(0, None), w["w2"], top_k=K,
               experts=E, hidden=H, intermediate=I_, **_scales(w))
    assert "w13" in info.value.message and "sc_moe_create" in info.value.message


LAYERS = """
import safecuda as sc
E, K, H, I_, S = 8, 2, 256, 128, 128
ctx = sc.Context()
def buf(shape, dtype):
    return ctx.buffer(shape, dtype, label=str(shape))
router = buf((E, H), "bf16")
w = dict(w13=buf((E, 2 * I_, H), "f8e4m3"), w2=buf((E, H, I_), "f8e4m3"),
         w13_scale=buf((E, 2, 2), "f32"), w2_scale=buf((E, 2, 1), "f32"))
shared = dict(shared_w13=buf((2 * S, H), "f8e4m3"), shared_w2=buf((H, S), "f8e4m3"),
              shared_w13_scale=buf((2, 2), "f32"), shared_w2_scale=buf((2, 1), "f32"))
layers = {}
try:
    layers["deepseek-v3 like"] = sc.MoE(
        ctx, router, w.pop("w13"), w.pop("w2"), top_k=K, scoring="sigmoid", n_group=4,
        topk_group=2, routed_scaling=2.5, selection_bias=buf(E, "f32"), max_tokens=16,
        **w, **shared)
except sc.NoCompilerError:
    print("NO-NVRTC")
    raise SystemExit(0)
layers["qwen3 like"] = sc.MoE(ctx, router, buf((E, 2 * I_, H), "f8e4m3"),
                              buf((E, H, I_), "f8e4m3"), top_k=K, max_tokens=16,
                              w13_scale=buf((E, 2, 2), "f32"), w2_scale=buf((E, 2, 1), "f32"))
for name, layer in layers.items():
    assert layer.expert_dtype is sc.DType.F8E4M3, layer.expert_dtype
    for T in (1, 7, 129):
        x, out = buf((T, H), "bf16"), buf((T, H), "bf16")
        ids, wts = buf((T, K), "i32"), buf((T, K), "f32")
        try:
            assert layer.forward(x, out, expert_ids=ids, expert_weights=wts) is out
            layer.forward(x, out, accumulate=True)
            layer.route(x, ids, wts)
            layer.forward(x, out, routing_ids=ids, routing_weights=wts, check_routing=True)
            layer.routing_check()
            print("FORWARDS", name, T, "ok")
        except sc.SafecudaError as exc:
            print("FORWARDS", name, T, exc.status.name, exc.message)
    assert layer.workspace_bytes > 0
    print("DETAIL", layer._detail())
ctx.close()
"""


def test_fp8_layers_are_made_and_forwards_checked(ctx, w):
    """A DeepSeek-V3-like fp8 layer (groups, scaling, the shared expert) and a Qwen3-like
    one (no shared expert), made on the test device's sm_90. A forward there is refused at
    its first launch (kernels do not run on the test device) after every check of its
    arguments; with the test device accepting launches (a child process), forwards of
    every path at T = 1, 7, 129 issue every launch (x gathered and quantized, the e4m3
    GEMMs with their scales), each checked against the kernels' parameters."""
    layer = _make(ctx, w, scoring="sigmoid", n_group=4, topk_group=2, routed_scaling=2.5,
                  selection_bias=w["selection_bias"], max_tokens=16, **fp8_kw(w))
    if layer is None:
        pytest.skip("no NVRTC: the MoE kernels can't be compiled here")
    assert layer.expert_dtype is sc.DType.F8E4M3 and layer.shared_intermediate == S
    assert "experts=f8e4m3" in layer._detail()
    x, out = ctx.buffer((7, H), "bf16"), ctx.buffer((7, H), "bf16")
    with pytest.raises(sc.NotSupportedError, match="kernels do not run on the safecuda test "
                                                   "device"):
        layer.forward(x, out)
    # The forward's own checks: x of another dtype than bf16, out of another size.
    x8 = ctx.buffer((7, H), F8)
    with pytest.raises(sc.TypeMismatchError, match="sc_moe_forward"):
        layer.forward(x8, out)
    with pytest.raises(sc.InvalidArgumentError, match="sc_moe_forward"):
        layer.forward(x, out[:3])
    for b in (x, x8, out):
        b.close()
    layer.close()
    from conftest import run_python
    rc, stdout, err = run_python(LAYERS, {"SAFECUDA_DEVICE": "test",
                                          "SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES": "1"},
                                 drop=("SAFECUDA_LIBCUDA",))
    assert rc == 0, err[-3000:]
    if "NO-NVRTC" in stdout:
        pytest.skip("no NVRTC in the child process")
    lines = [ln for ln in stdout.splitlines() if ln.startswith("FORWARDS")]
    assert len(lines) == 6 and all(ln.endswith(" ok") for ln in lines), stdout
    assert stdout.count("experts=f8e4m3") == 2, stdout
