"""safecuda.MoE's arguments on the test device (SAFECUDA_DEVICE=test, in a child process:
see conftest.py). The test device runs no kernels and loads no MoE kernel image, so no
layer is made here: what is checked is the binding (which desc field each argument
fills, what the shapes tell, the Python-side messages) and the library's own checks of
the desc, which come before it loads its kernels (GPU runs: test_gpu_torch.py)."""

import pytest

import safecuda as sc
from safecuda import _lib
from safecuda._moe import build_desc

pytestmark = pytest.mark.testdevice

E, K, H, I_ = 8, 2, 64, 32

CHECK_STATUSES = (sc.Status.SC_ERR_INVALID_ARGUMENT, sc.Status.SC_ERR_TYPE_MISMATCH,
                  sc.Status.SC_ERR_OUT_OF_BOUNDS)


@pytest.fixture
def ctx():
    with sc.Context() as c:
        yield c


@pytest.fixture
def w(ctx):
    """The weights of a small layer, and the views of a shared expert, biases and gate."""
    bufs = dict(
        router=ctx.buffer((E, H), "bf16", label="router"),
        w13=ctx.buffer((E, 2 * I_, H), "bf16", label="w13"),
        w2=ctx.buffer((E, H, I_), "bf16", label="w2"),
        selection_bias=ctx.buffer(E, "f32", label="selection_bias"),
        router_bias=ctx.buffer(E, "f32", label="router_bias"),
        w13_bias=ctx.buffer((E, 2 * I_), "f32", label="w13_bias"),
        w2_bias=ctx.buffer((E, H), "f32", label="w2_bias"),
        shared_w13=ctx.buffer((2 * 2 * I_, H), "bf16", label="shared_w13"),
        shared_w2=ctx.buffer((H, 2 * I_), "bf16", label="shared_w2"),
        shared_gate=ctx.buffer(H, "bf16", label="shared_gate"))
    yield bufs
    for b in bufs.values():
        b.close()


def accepted(make):
    """Make a layer; True when the library's checks of the desc and weights passed (the
    test device then fails loading the kernels, or a GPU build makes the layer)."""
    try:
        layer = make()
    except sc.SafecudaError as exc:
        if exc.status in CHECK_STATUSES:
            raise
        return True
    layer.close()
    return True


# ---- which desc field each argument fills ----------------------------------------------------


def test_whole_buffers_fill_the_buffer_fields(w):
    desc, info = build_desc(w["router"], w["w13"], w["w2"], top_k=K,
                            selection_bias=w["selection_bias"])
    assert (desc.router, desc.w13, desc.w2, desc.selection_bias) == \
        (w["router"].handle, w["w13"].handle, w["w2"].handle, w["selection_bias"].handle)
    for f in ("router_view", "w13_view", "w2_view", "selection_bias_view"):
        assert getattr(desc, f).buffer == 0, f
    assert (info.experts, info.top_k, info.hidden, info.intermediate) == (E, K, H, I_)
    assert info.shared_intermediate == 0 and desc.shared_intermediate == 0
    # The v2 fields at their zero (the textbook layer).
    assert (desc.n_group, desc.topk_group, desc.routed_scaling, desc.activation,
            desc.swiglu_alpha, desc.swiglu_limit, desc.w13_layout) == (0, 0, 0.0, 0, 0.0,
                                                                      0.0, 0)
    assert desc.dtype == int(sc.DType.BF16) and desc.max_tokens == 256


def test_views_fill_the_view_fields(ctx):
    # One allocation holding the whole checkpoint: router, w13, w2 back to back.
    n_r, n_13, n_2 = E * H, E * 2 * I_ * H, E * H * I_
    ckpt = ctx.buffer(n_r + n_13 + n_2, "bf16", label="checkpoint")
    bias = ctx.buffer(2 * E, "f32", label="biases")
    router = ckpt.view(0, n_r, (E, H))
    w13 = ckpt.view(n_r, n_13, (E, 2 * I_, H))
    w2 = ckpt.view(n_r + n_13, n_2, (E, H, I_))
    desc, info = build_desc(router, w13, w2, top_k=K, selection_bias=bias.view(E, E))
    assert (desc.router, desc.w13, desc.w2, desc.selection_bias) == (0, 0, 0, 0)
    for field, v in (("router_view", router), ("w13_view", w13), ("w2_view", w2)):
        sv = getattr(desc, field)
        assert (sv.buffer, sv.offset, sv.count) == (ckpt.handle, v.offset, v.count), field
    sv = desc.selection_bias_view
    assert (sv.buffer, sv.offset, sv.count) == (bias.handle, E, E)
    assert (info.experts, info.hidden, info.intermediate) == (E, H, I_)
    # A flat view tells no shape: E, H and I are then given.
    with pytest.raises(ValueError, match="experts, hidden and intermediate can't be read"):
        build_desc(ckpt.view(0, n_r), w13, w2, top_k=K)
    desc, info = build_desc(ckpt.view(0, n_r), ckpt.view(n_r, n_13), ckpt.view(n_r + n_13),
                            top_k=K, experts=E, hidden=H, intermediate=I_)
    assert (desc.experts, desc.hidden, desc.intermediate) == (E, H, I_)
    ckpt.close()
    bias.close()


def test_v2_options_fill_their_fields(w):
    desc, info = build_desc(
        w["router"], w["w13"], w["w2"], top_k=K, scoring="sigmoid", n_group=4, topk_group=2,
        routed_scaling=2.5, activation="swiglu_clamp", swiglu_alpha=1.5, swiglu_limit=6.0,
        w13_layout="interleaved", router_bias=w["router_bias"], w13_bias=w["w13_bias"],
        w2_bias=w["w2_bias"], shared_w13=w["shared_w13"], shared_w2=w["shared_w2"],
        shared_gate=w["shared_gate"], label="v2", backend="mma")
    assert (desc.n_group, desc.topk_group) == (4, 2)
    assert desc.routed_scaling == 2.5 and desc.scoring == _lib.SC_MOE_SIGMOID
    assert desc.activation == _lib.SC_MOE_SWIGLU_CLAMP
    assert (desc.swiglu_alpha, desc.swiglu_limit) == (1.5, 6.0)
    assert desc.w13_layout == _lib.SC_MOE_W13_INTERLEAVED
    assert desc.backend == _lib.SC_MOE_BACKEND_MMA and desc.label == b"v2"
    # Biases and shared weights are views; a Buffer stands for all its elements.
    for field in ("router_bias", "w13_bias", "w2_bias", "shared_w13", "shared_w2",
                  "shared_gate"):
        sv, b = getattr(desc, field), w[field]
        assert (sv.buffer, sv.offset, sv.count) == (b.handle, 0, b.count), field
    # I_s read from shared_w2 [H, I_s].
    assert desc.shared_intermediate == 2 * I_ and info.shared_intermediate == 2 * I_
    for name, value in (("silu", _lib.SC_MOE_SILU), ("gelu_tanh", _lib.SC_MOE_GELU_TANH)):
        d, _ = build_desc(w["router"], w["w13"], w["w2"], top_k=K, activation=name)
        assert d.activation == value
    d, _ = build_desc(w["router"], w["w13"], w["w2"], top_k=K, w13_layout="stacked")
    assert d.w13_layout == _lib.SC_MOE_W13_STACKED


def test_shared_intermediate_inferred_or_given(ctx, w):
    d, info = build_desc(w["router"], w["w13"], w["w2"], top_k=K, shared_w13=w["shared_w13"],
                         shared_w2=w["shared_w2"].view(0, None))  # flat: read from w13
    assert d.shared_intermediate == 2 * I_
    d, _ = build_desc(w["router"], w["w13"], w["w2"], top_k=K, shared_w13=w["shared_w13"],
                      shared_w2=w["shared_w2"], shared_intermediate=I_)
    assert d.shared_intermediate == I_  # given: the library checks it against the weights
    flat13, flat2 = w["shared_w13"].view(0, None), w["shared_w2"].view(0, None)
    with pytest.raises(ValueError, match="shared_intermediate can't be read"):
        build_desc(w["router"], w["w13"], w["w2"], top_k=K, shared_w13=flat13,
                   shared_w2=flat2)
    d, _ = build_desc(w["router"], w["w13"], w["w2"], top_k=K, shared_w13=flat13,
                      shared_w2=flat2, shared_intermediate=2 * I_)
    assert d.shared_intermediate == 2 * I_


# ---- the Python side's messages ---------------------------------------------------------------


@pytest.mark.parametrize("kw,match", [
    (dict(activation="relu"), "activation is one of 'silu', 'gelu_tanh', 'swiglu_clamp', "
                              "not 'relu'"),
    (dict(w13_layout="rows"), "w13_layout is one of 'stacked', 'interleaved', not 'rows'"),
    (dict(scoring="relu"), "scoring is one of 'softmax', 'sigmoid'"),
    (dict(backend="sm100"), "backend is one of"),
])
def test_unknown_names(ctx, w, kw, match):
    with pytest.raises(ValueError, match=match):
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K, **kw)


@pytest.mark.parametrize("kw,match", [
    (dict(n_group=2.5), "n_group must be an int, not float"),
    (dict(top_k="2"), "top_k must be an int, not str"),
    (dict(routed_scaling="x"), "routed_scaling must be a number, not str"),
    (dict(swiglu_limit=[7]), "swiglu_limit must be a number, not list"),
    (dict(w13_bias=b"\0" * 8), "w13_bias must be a safecuda.Buffer or View, not bytes"),
    (dict(shared_gate=3), "shared_gate must be a safecuda.Buffer or View, not int"),
])
def test_wrong_types(ctx, w, kw, match):
    with pytest.raises(TypeError, match=match):
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], **{"top_k": K, **kw})


def test_weights_are_buffers_or_views(ctx, w):
    with pytest.raises(TypeError, match="router must be a safecuda.Buffer .* or a View"):
        sc.MoE(ctx, [0] * (E * H), w["w13"], w["w2"], top_k=K)


# ---- the forward's arguments --------------------------------------------------------------------


class _Captured:
    """Stands in for sc_moe_forward in a layer object made without the library (no layer
    can be made on the test device): records the forward desc the binding passes."""

    def __init__(self):
        self.opts = "not called"

    def __call__(self, stream, layer, x, out, opts):
        self.opts = None if opts is None else opts._obj
        return 0


def _bare_layer(ctx):
    m = sc.MoE.__new__(sc.MoE)
    m._h, m._ctx, m._open, m.hidden, m.top_k = 0, ctx, False, H, K
    m._forward = _Captured()
    return m


def test_forward_fills_the_forward_desc(ctx):
    m = _bare_layer(ctx)
    x, out = ctx.buffer((4, H), "bf16"), ctx.buffer((4, H), "bf16")
    ids, wts = ctx.buffer((4, K), "i32"), ctx.buffer((4, K), "f32")
    assert m.forward(x, out) is out and m._forward.opts is None  # no options: NULL
    m.forward(x, out, routing_ids=ids, routing_weights=wts, check_routing=True,
              accumulate=True)
    o = m._forward.opts
    assert (o.routing_ids.buffer, o.routing_ids.count) == (ids.handle, 4 * K)
    assert (o.routing_weights.buffer, o.routing_weights.count) == (wts.handle, 4 * K)
    assert o.check_routing and o.accumulate
    assert o.expert_ids.buffer == 0 and not o.profile
    m.forward(x, out, expert_ids=ids[1:3], expert_weights=wts)
    o = m._forward.opts
    assert (o.expert_ids.buffer, o.expert_ids.offset, o.expert_ids.count) == \
        (ids.handle, K, 2 * K)
    assert not o.check_routing and not o.accumulate and o.routing_ids.buffer == 0
    for b in (x, out, ids, wts):
        b.close()


def test_forward_argument_messages(ctx):
    m = _bare_layer(ctx)
    x, ids = ctx.buffer((4, H), "bf16"), ctx.buffer((4, K), "i32")
    with pytest.raises(ValueError, match="accumulate=True adds into out: give out"):
        m.forward(x, accumulate=True)
    with pytest.raises(ValueError, match="routing_ids and routing_weights are given "
                                         "together"):
        m.forward(x, ctx.buffer((4, H), "bf16"), routing_ids=ids)
    assert m._forward.opts == "not called"
    x.close()
    ids.close()


# ---- the library's checks of the v2 desc (before it loads its kernels) -------------------------


def test_a_valid_v2_desc_passes_the_checks(ctx, w):
    assert accepted(lambda: sc.MoE(
        ctx, w["router"], w["w13"], w["w2"], top_k=K, scoring="sigmoid", n_group=4,
        topk_group=2, routed_scaling=2.5, selection_bias=w["selection_bias"],
        shared_w13=w["shared_w13"], shared_w2=w["shared_w2"], shared_gate=w["shared_gate"]))
    assert accepted(lambda: sc.MoE(
        ctx, w["router"], w["w13"], w["w2"], top_k=K, activation="swiglu_clamp",
        w13_layout="interleaved", router_bias=w["router_bias"], w13_bias=w["w13_bias"],
        w2_bias=w["w2_bias"]))


@pytest.mark.parametrize("kw,field", [
    (dict(n_group=3, topk_group=1), "n_group"),       # 3 does not divide E = 8
    (dict(n_group=8, topk_group=1), "n_group"),       # groups of 1 expert
    (dict(n_group=64, topk_group=1), "n_group"),      # more than 32
    (dict(n_group=2, topk_group=3), "topk_group"),    # more than n_group
    (dict(n_group=2, topk_group=0), "topk_group"),
    (dict(swiglu_alpha=1.0), "swiglu_alpha"),          # only for swiglu_clamp
    (dict(swiglu_limit=7.0, activation="gelu_tanh"), "swiglu_limit"),
    (dict(activation="swiglu_clamp", swiglu_limit=-1.0), "swiglu_limit"),
])
def test_v2_desc_field_checks_name_the_field(ctx, w, kw, field):
    with pytest.raises(sc.InvalidArgumentError) as info:
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K, **kw)
    assert info.value.message.startswith("sc_moe_create"), info.value.message
    assert field in info.value.message, info.value.message


def test_top_k_beyond_the_kept_groups(ctx, w):
    # E = 8 in 4 groups of 2, one group kept: at most 2 experts can be chosen.
    with pytest.raises(sc.InvalidArgumentError, match="top_k|topk_group"):
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=4, n_group=4, topk_group=1)


def test_v2_weight_checks_name_the_weight(ctx, w):
    wrong = ctx.buffer((E, I_), "f32", label="short bias")
    with pytest.raises(sc.SafecudaError, match="w13_bias") as info:
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K, w13_bias=wrong)
    assert info.value.status in CHECK_STATUSES
    bf = ctx.buffer(E, "bf16", label="bf16 bias")
    with pytest.raises(sc.TypeMismatchError, match="router_bias"):
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K, router_bias=bf)
    # I_s = 48 is not a multiple of I = 32.
    s13, s2 = ctx.buffer((96, H), "bf16"), ctx.buffer((H, 48), "bf16")
    with pytest.raises(sc.InvalidArgumentError, match="shared_intermediate"):
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K, shared_w13=s13, shared_w2=s2)
    # A shared gate without a shared expert.
    with pytest.raises(sc.InvalidArgumentError, match="shared"):
        sc.MoE(ctx, w["router"], w["w13"], w["w2"], top_k=K, shared_gate=w["shared_gate"])
    for b in (wrong, bf, s13, s2):
        b.close()


def test_a_weight_view_must_start_16_byte_aligned(ctx):
    n = E * H
    big = ctx.buffer(n + 8, "bf16", label="checkpoint")
    w13 = ctx.buffer((E, 2 * I_, H), "bf16")
    w2 = ctx.buffer((E, H, I_), "bf16")
    with pytest.raises(sc.InvalidArgumentError, match="router"):
        sc.MoE(ctx, big.view(1, n, (E, H)), w13, w2, top_k=K)  # 2 bytes in
    assert accepted(lambda: sc.MoE(ctx, big.view(8, n, (E, H)), w13, w2, top_k=K))
    for b in (big, w13, w2):
        b.close()


def test_route_and_routing_check_of_no_layer(ctx):
    m = _bare_layer(ctx)
    x, ids, wts = ctx.buffer((4, H), "bf16"), ctx.buffer((4, K), "i32"), \
        ctx.buffer((4, K), "f32")
    with pytest.raises(sc.SafecudaError, match="sc_moe_route"):
        m.route(x, ids, wts)
    with pytest.raises(sc.SafecudaError, match="sc_moe_routing_check"):
        m.routing_check()
    for b in (x, ids, wts):
        b.close()
