"""safecuda.Comm on the test device with safecuda's NCCL test double (tests/ncclfault), in a
child process (conftest.py) with SAFECUDA_TESTDEVICE_DEVICES=4 and SAFECUDA_LIBNCCL set to
the double, which this file compiles from the checkout's sources. The double computes each
collective on the test device's memory (host memory) once every rank has issued its part;
it proves nothing about GPUs or NCCL: what is checked here is the binding (which views,
counts, operations and peers reach the library; errors and their messages; timeouts,
aborts, closes and leaks)."""

import atexit
import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

import safecuda as sc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = 4


def _child_env():
    """The child's environment: four test devices and the NCCL test double, compiled here
    (or SAFECUDA_TEST_NCCLFAULT, a built libsafecuda_ncclfault.so)."""
    env = {"SAFECUDA_TESTDEVICE_DEVICES": str(DEVICES)}
    given = os.environ.get("SAFECUDA_TEST_NCCLFAULT")
    if given:
        env["SAFECUDA_LIBNCCL"] = given
        return env
    src = os.path.join(ROOT, "tests", "ncclfault")
    files = [os.path.join(src, f) for f in ("ncclfault.c", "reduce.c")]
    if not all(os.path.exists(f) for f in files):
        env["SAFECUDA_TEST_COMM_SKIP"] = (f"the NCCL test double's sources are not beside the "
                                          f"tests ({src}): run the tests from a checkout")
        return env
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or \
        shutil.which("clang")
    if not cc:
        env["SAFECUDA_TEST_COMM_SKIP"] = "no C compiler (cc, gcc, clang) for the NCCL test double"
        return env
    out = tempfile.mkdtemp(prefix="safecuda-ncclfault-")
    atexit.register(shutil.rmtree, out, True)
    lib = os.path.join(out, "libsafecuda_ncclfault.so")
    cmd = [cc, "-std=c11", "-O1", "-shared", "-fPIC", "-fvisibility=hidden",
           "-I", os.path.join(ROOT, "src"), "-I", os.path.join(ROOT, "include"),
           "-I", os.path.join(ROOT, "tests"), *files, "-o", lib, "-lpthread", "-ldl", "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        env["SAFECUDA_TEST_COMM_FAIL"] = (f"compiling the NCCL test double failed: "
                                          f"{' '.join(cmd)}\n{proc.stderr[-3000:]}")
    env["SAFECUDA_LIBNCCL"] = lib
    return env


pytestmark = pytest.mark.testdevice(env=_child_env)
np = pytest.importorskip("numpy")


@pytest.fixture(autouse=True)
def _double():
    if os.environ.get("SAFECUDA_TEST_COMM_SKIP"):
        pytest.skip(os.environ["SAFECUDA_TEST_COMM_SKIP"])
    if os.environ.get("SAFECUDA_TEST_COMM_FAIL"):
        pytest.fail(os.environ["SAFECUDA_TEST_COMM_FAIL"], pytrace=False)
    yield
    for k in ("SAFECUDA_NCCLFAULT_HANG", "SAFECUDA_NCCLFAULT_FAIL"):
        os.environ.pop(k, None)


def _counter(name):
    h = ctypes.CDLL(os.environ["SAFECUDA_LIBNCCL"], mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    fn = getattr(h, name)
    fn.restype = ctypes.c_long
    return fn()


@pytest.fixture
def log():
    lines = []
    sc.set_log_callback(lambda level, msg: lines.append(msg))
    yield lines
    sc.set_log_callback(None)


@pytest.fixture
def contexts():
    ctxs = [sc.Context(d) for d in range(DEVICES)]
    yield ctxs
    for c in ctxs:
        c.close()


def world(contexts, n, timeout_ms=0):
    return sc.Comm.create_all(contexts[:n], timeout_ms=timeout_ms, label="world")


def end(comms):
    for c in comms:
        c.close()
    assert _counter("safecuda_ncclfault_live_comms") == 0
    assert _counter("safecuda_ncclfault_pending") == 0


def random_f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_the_library_is_the_double():
    assert sc.Comm.library_version() == 22809
    assert sc.Comm.library_path() == os.environ["SAFECUDA_LIBNCCL"]
    a, b = sc.Comm.unique_id(), sc.Comm.unique_id()
    assert isinstance(a, bytes) and len(a) == 128 and a != b


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_against_numpy(contexts, n):
    rng = np.random.default_rng(100 + n)
    comms = world(contexts, n)
    assert [(c.rank, c.nranks) for c in comms] == [(r, n) for r in range(n)]
    p = comms[1].info()
    assert (p.rank, p.nranks, p.device, p.label, p.aborted) == (1, n, 1, "world", False)
    assert p.context is contexts[1] and p.timeout_ms == 600000
    assert p.file == os.path.basename(__file__) and p.line > 0
    k = 24
    nan = float("nan")

    def run(fn):
        with sc.Comm.group():
            for r in range(n):
                fn(r)
        for c in comms:
            c.synchronize()
            assert c.query()

    # all-reduce, every operation, out of place then in place
    data = [random_f32(rng, (3, k)) for _ in range(n)]
    stack = np.stack(data).astype(np.float64)
    want = {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0),
            "max": stack.max(0), "avg": stack.sum(0) / n}
    src = [contexts[r].from_host(data[r], label=f"src{r}") for r in range(n)]
    dst = [contexts[r].buffer((3, k), "f32", label=f"dst{r}") for r in range(n)]
    for op, ref in want.items():
        for d in dst:
            d.fill(nan)
        run(lambda r: comms[r].all_reduce(dst[r], src[r], op))
        for r in range(n):
            np.testing.assert_allclose(dst[r].to_numpy(), ref, rtol=1e-6, atol=1e-6,
                                       err_msg=f"all_reduce {op} rank {r}")
            assert (src[r].to_numpy() == data[r]).all()
    run(lambda r: comms[r].all_reduce(src[r], op=sc.ReduceOp.MAX))  # in place
    for r in range(n):
        assert (src[r].to_numpy() == stack.max(0).astype(np.float32)).all()

    # integers
    idata = [rng.integers(-1000, 1000, 40, dtype=np.int32) for _ in range(n)]
    ib = [contexts[r].from_host(idata[r]) for r in range(n)]
    run(lambda r: comms[r].all_reduce(ib[r]))
    for r in range(n):
        assert (ib[r].to_numpy() == np.sum(idata, axis=0)).all()

    # reduce-scatter: n x m in, m out
    m = 10
    rs_in = [random_f32(rng, n * m) for _ in range(n)]
    rs_src = [contexts[r].from_host(rs_in[r]) for r in range(n)]
    rs_dst = [contexts[r].buffer(m, "f32") for r in range(n)]
    for d in rs_dst:
        d.fill(nan)
    run(lambda r: comms[r].reduce_scatter(rs_dst[r], rs_src[r], "sum"))
    total = np.sum(np.stack(rs_in).astype(np.float64), axis=0)
    for r in range(n):
        np.testing.assert_allclose(rs_dst[r].to_numpy(), total[r * m:(r + 1) * m], rtol=1e-6)

    # all-gather: m in, n x m out
    ag_in = [random_f32(rng, m) for _ in range(n)]
    ag_src = [contexts[r].from_host(ag_in[r]) for r in range(n)]
    ag_dst = [contexts[r].buffer((n, m), "f32") for r in range(n)]
    for d in ag_dst:
        d.fill(nan)
    run(lambda r: comms[r].all_gather(ag_dst[r], ag_src[r]))
    for r in range(n):
        assert (ag_dst[r].to_numpy() == np.stack(ag_in)).all()

    # all-to-all: part p of rank r's src goes to rank p's part r
    a2a_in = [random_f32(rng, (n, m)) for _ in range(n)]
    a2a_src = [contexts[r].from_host(a2a_in[r]) for r in range(n)]
    a2a_dst = [contexts[r].buffer((n, m), "f32") for r in range(n)]
    for d in a2a_dst:
        d.fill(nan)
    run(lambda r: comms[r].all_to_all(a2a_dst[r], a2a_src[r]))
    for r in range(n):
        assert (a2a_dst[r].to_numpy() == np.stack([a2a_in[q][r] for q in range(n)])).all()

    # all-to-all-v: random counts (zeros too), packed sends, receives at given offsets
    counts = rng.integers(0, 6, (n, n))  # counts[s][d]: from rank s to rank d
    counts[0][n - 1] = 0
    sends = [random_f32(rng, int(counts[s].sum()) or 1) for s in range(n)]
    v_src = [contexts[s].from_host(sends[s]) for s in range(n)]
    gap = 3
    recv_offs = [[int(counts[:q, d].sum()) + gap * q for q in range(n)] for d in range(n)]
    v_dst = [contexts[d].buffer(int(counts[:, d].sum()) + gap * n, "f32") for d in range(n)]
    for d in v_dst:
        d.fill(nan)
    run(lambda r: comms[r].all_to_all_v(v_dst[r], counts[:, r], v_src[r], counts[r],
                                        recv_offsets=recv_offs[r]))
    for d in range(n):
        got = v_dst[d].to_numpy()
        for s in range(n):
            off = int(counts[s, :d].sum())
            seg = sends[s][off:off + counts[s, d]]
            at = recv_offs[d][s]
            assert (got[at:at + counts[s, d]] == seg).all(), (s, d)
            assert np.isnan(got[at + counts[s, d]:at + counts[s, d] + gap]).all()

    # send / receive around a ring, in one group
    ring_in = [random_f32(rng, m) for _ in range(n)]
    ring_src = [contexts[r].from_host(ring_in[r]) for r in range(n)]
    ring_dst = [contexts[r].buffer(m, "f32") for r in range(n)]

    def ring(r):
        comms[r].send(ring_src[r], (r + 1) % n)
        comms[r].recv(ring_dst[r], (r - 1) % n)
    run(ring)
    for r in range(n):
        assert (ring_dst[r].to_numpy() == ring_in[(r - 1) % n]).all()

    # on a stream of the context, and a sub-view
    streams = [contexts[r].stream(label=f"s{r}") for r in range(n)]
    run(lambda r: comms[r].all_reduce(src[r][1], op="min", stream=streams[r]))
    for r in range(n):
        streams[r].synchronize()
        assert (src[r].to_numpy()[1] == stack.max(0).astype(np.float32)[1]).all()
    end(comms)


def test_one_thread_per_rank(contexts):
    uid = sc.Comm.unique_id()
    n = 2
    comms, errors = [None] * n, []
    bufs = [contexts[r].from_host(np.full(5, r + 1.5, np.float32)) for r in range(n)]

    def rank(r):
        try:
            comms[r] = sc.Comm(contexts[r], uid, n, r, timeout_ms=5000, label=f"t{r}")
            comms[r].all_reduce(bufs[r])
            comms[r].synchronize()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in range(n):
        assert bufs[r].tolist() == [4.0] * 5
        assert comms[r].info().label == f"t{r}" and comms[r].info().timeout_ms == 5000
    end(comms)


def test_refusals(contexts):
    comms = world(contexts, 2)
    c0 = comms[0]
    x0 = contexts[0].buffer(8, "f32", label="x0")
    x1 = contexts[1].buffer(8, "f32", label="x1")
    i0 = contexts[0].buffer(8, "i32", label="i0")
    host = np.zeros(8, np.float32)
    with pytest.raises(TypeError, match="dst is ndarray; collectives take safecuda Views"):
        c0.all_reduce(host)
    with pytest.raises(TypeError, match="stream must be a safecuda.Stream"):
        c0.all_reduce(x0, stream=1)
    with pytest.raises(ValueError, match="unknown reduction 'mean'"):
        c0.all_reduce(x0, op="mean")
    with pytest.raises(TypeError, match="op must be a name"):
        c0.all_reduce(x0, op=0)
    with pytest.raises(ValueError, match="recv_counts has 3 entries; the communicator has 2"):
        c0.all_to_all_v(x0, [1, 1, 1], x0, [1, 1])
    with pytest.raises(TypeError, match=r"send_counts\[1\] must be an int"):
        c0.all_to_all_v(x0, [1, 1], x0, [1, 1.5])
    with pytest.raises(ValueError, match=r"send_offsets\[0\] = -1 is outside"):
        c0.all_to_all_v(x0, [1, 1], x0, [1, 1], send_offsets=[-1, 0])
    with pytest.raises(ValueError, match="peer 2 is outside 0 .. 1"):
        c0.send(x0, 2)
    with pytest.raises(ValueError, match="unique_id has 3 bytes"):
        sc.Comm(contexts[0], b"abc", 2, 0)
    with pytest.raises(TypeError, match="unique_id must be the bytes"):
        sc.Comm(contexts[0], 5, 2, 0)
    uid = sc.Comm.unique_id()
    with pytest.raises(ValueError, match="nranks is 0"):
        sc.Comm(contexts[0], uid, 0, 0)
    with pytest.raises(ValueError, match=r"rank 2 is outside 0 .. 1 \(nranks 2\)"):
        sc.Comm(contexts[0], uid, 2, 2)
    with pytest.raises(TypeError, match="context must be a safecuda.Context"):
        sc.Comm(0, uid, 1, 0)
    with pytest.raises(ValueError, match="timeout_ms -1 is outside"):
        sc.Comm(contexts[0], uid, 1, 0, timeout_ms=-1)
    with pytest.raises(ValueError, match="no contexts"):
        sc.Comm.create_all([])
    with pytest.raises(TypeError, match=r"contexts\[1\] is int"):
        sc.Comm.create_all([contexts[0], 1])

    # the library's own checks, with its messages
    with pytest.raises(sc.WrongContextError) as e:
        c0.all_reduce(x0, x1)
    assert e.value.message.startswith("sc_comm_all_reduce: src buffer 'x1' of 8 f32 (created "
                                      "at test_comm_testdevice.py:")
    assert "belongs to another context than communicator 'world' (rank 0 of 2 on device 0" \
        in e.value.message
    with pytest.raises(sc.TypeMismatchError, match="sc_comm_all_reduce: dst is f32 .* but "
                                                   "src is i32"):
        c0.all_reduce(x0, i0)
    with pytest.raises(sc.InvalidArgumentError, match="sc_comm_all_reduce") as e:
        c0.all_reduce(i0, op="avg")
    assert isinstance(e.value, ValueError)
    with pytest.raises(sc.OutOfBoundsError, match="sc_comm_reduce_scatter"):
        c0.reduce_scatter(x0, x0.view(0, 4))
    y0 = contexts[0].buffer(8, "f32", label="y0")
    with pytest.raises(sc.OutOfBoundsError, match="sc_comm_all_to_all_v"):
        c0.all_to_all_v(x0, [4, 5], y0, [1, 1])
    with pytest.raises(sc.InvalidArgumentError, match="sc_comm_create_all"):
        sc.Comm.create_all([contexts[0], sc.Context(0)])
    # nothing was issued: the communicators are fine
    assert c0.query() and not c0.info().aborted
    # a rank that never joins: creation times out
    t0 = time.monotonic()
    with pytest.raises(sc.TimeoutError, match="sc_comm_create") as e:
        sc.Comm(contexts[2], uid, 2, 0, timeout_ms=200, label="alone")
    assert isinstance(e.value, TimeoutError) and 0.19 <= time.monotonic() - t0 < 10
    for b in (x0, x1, i0, y0):
        b.close()
    end(comms)


def test_timeouts_and_aborts(contexts, log):
    comms = world(contexts, 2, timeout_ms=300)
    x = [contexts[r].from_host(np.ones(16, np.float32)) for r in range(2)]
    # rank 1 never joins rank 0's all-reduce
    t0 = time.monotonic()
    comms[0].all_reduce(x[0])
    assert comms[0].query() is False
    with pytest.raises(sc.TimeoutError) as e:
        comms[0].synchronize()
    assert 0.29 <= time.monotonic() - t0 < 10
    msg = e.value.message
    assert msg.startswith("sc_comm_synchronize: communicator 'world' (rank 0 of 2 on device "
                          "0, created at test_comm_testdevice.py:")
    assert "was aborted: the all-reduce of 16 x f32 (sum) issued " in msg
    assert msg.endswith(" s ago did not finish within the timeout of 300 ms (a rank that never "
                        "joined it, or a peer that hangs); its outputs are undefined")
    assert comms[0].info().aborted
    with pytest.raises(sc.TimeoutError, match="sc_comm_all_reduce: .* was aborted"):
        comms[0].all_reduce(x[0])
    assert comms[1].query()
    end(comms)

    # both join, the double never completes it (SAFECUDA_NCCLFAULT_HANG), nobody waits:
    # the watchdog aborts both
    comms = world(contexts, 2, timeout_ms=300)
    os.environ["SAFECUDA_NCCLFAULT_HANG"] = "allreduce"
    t0 = time.monotonic()
    with sc.Comm.group():
        for r in range(2):
            comms[r].all_reduce(x[r])
    del os.environ["SAFECUDA_NCCLFAULT_HANG"]
    while time.monotonic() - t0 < 10 and not all(c.info().aborted for c in comms):
        time.sleep(0.005)
    assert all(c.info().aborted for c in comms) and time.monotonic() - t0 >= 0.29
    for c in contexts[:2]:
        c.synchronize()  # the abort ended their parts: the streams go on
    with pytest.raises(sc.TimeoutError, match="did not finish within the timeout of 300 ms"):
        comms[1].all_reduce(x[1])
    assert any("did not finish within the timeout of 300 ms" in m for m in log)
    end(comms)

    # abort(): later calls are CommError
    comms = world(contexts, 2)
    comms[0].abort()
    comms[0].abort()  # again: nothing
    assert comms[0].info().aborted
    with pytest.raises(sc.CommError, match="sc_comm_all_reduce: .* was aborted"):
        comms[0].all_reduce(x[0])
    end(comms)

    # a close whose wait for the work never ends: aborted, closed, TimeoutError
    comms = world(contexts, 2, timeout_ms=200)
    os.environ["SAFECUDA_NCCLFAULT_HANG"] = "finalize"
    with pytest.raises(sc.TimeoutError, match=r"sc_comm_destroy: .* \(ncclCommFinalize\) did "
                                              r"not complete within the timeout of 200 ms"):
        comms[0].close()
    del os.environ["SAFECUDA_NCCLFAULT_HANG"]
    assert comms[0].closed
    comms[0].close()  # idempotent
    end(comms)
    for b in x:
        b.close()


def test_close_stale_and_leaks(contexts, log):
    comms = world(contexts, 2)
    with comms[0], comms[1]:
        pass
    assert comms[0].closed and comms[1].closed
    with pytest.raises(sc.StaleHandleError, match="sc_comm_info"):
        comms[0].info()
    with pytest.raises(sc.StaleHandleError):
        comms[1].destroy()
    assert _counter("safecuda_ncclfault_live_comms") == 0

    # one left open when its context closes: reported and freed by the context
    ctx = sc.Context(3)
    others = sc.Comm.create_all([contexts[2], ctx], label="leaky")
    ctx.close()
    assert others[1].closed
    assert any("communicator 'leaky'" in m for m in log), log
    others[0].close()
    assert _counter("safecuda_ncclfault_live_comms") == 0

    # one dropped without close: the garbage collector reports it
    lone = sc.Comm.create_all([contexts[0]], label="dropped")[0]
    del lone
    import gc
    gc.collect()
    assert any("garbage collector: communicator 'dropped'" in m for m in log), log
    assert _counter("safecuda_ncclfault_live_comms") == 0


# ---- the tensor-parallel MoE layer's binding (tp_comm, tp_output) -------------------------

def _moe_weights(ctx, E=8, H=64, I_=32):
    return dict(router=ctx.buffer((E, H), "bf16", label="router"),
                w13=ctx.buffer((E, 2 * I_, H), "bf16", label="w13"),
                w2=ctx.buffer((E, H, I_), "bf16", label="w2"))


def test_moe_tp_fields_and_refusals(contexts):
    from safecuda._moe import build_desc
    comms = world(contexts, 2)
    w = _moe_weights(contexts[0])
    desc, info = build_desc(w["router"], w["w13"], w["w2"], top_k=2, tp_comm=comms[0],
                            tp_output="reduce_scatter")
    assert desc.tp_comm == comms[0]._h and desc.tp_output == 1
    assert info.tp_comm is comms[0] and comms[0] in info.keep
    desc, _ = build_desc(w["router"], w["w13"], w["w2"], top_k=2)
    assert desc.tp_comm == 0 and desc.tp_output == 0
    with pytest.raises(TypeError, match="tp_comm must be a safecuda.Comm"):
        build_desc(w["router"], w["w13"], w["w2"], top_k=2, tp_comm=5)
    with pytest.raises(ValueError, match="tp_output"):
        build_desc(w["router"], w["w13"], w["w2"], top_k=2, tp_output="gather")
    # the library's checks, before it loads any kernel
    with pytest.raises(sc.InvalidArgumentError,
                       match="desc->tp_output = SC_MOE_TP_REDUCE_SCATTER without a tp_comm"):
        sc.MoE(contexts[0], w["router"], w["w13"], w["w2"], top_k=2,
               tp_output="reduce_scatter")
    with pytest.raises(sc.WrongContextError, match="desc->tp_comm .* belongs to another context"):
        sc.MoE(contexts[0], w["router"], w["w13"], w["w2"], top_k=2, tp_comm=comms[1])
    lone = sc.Comm.create_all([contexts[2]], label="lone")[0]
    w2 = _moe_weights(contexts[2])
    with pytest.raises(sc.InvalidArgumentError, match="has 1 rank: a tensor-parallel layer"):
        sc.MoE(contexts[2], w2["router"], w2["w13"], w2["w2"], top_k=2, tp_comm=lone)
    for b in list(w.values()) + list(w2.values()):
        b.close()
    lone.close()
    end(comms)


# ---- the expert-parallel MoE layer's binding (ep_comm, ep_mode, ep_max_tokens, ep_owner) ----

def test_moe_ep_fields_and_refusals(contexts):
    from safecuda._moe import build_desc, ep_local_experts
    comms = world(contexts, 2)
    E, H, I_ = 8, 64, 32
    full = _moe_weights(contexts[0], E=E, H=H, I_=I_)
    half = dict(router=full["router"],
                w13=contexts[0].buffer((E // 2, 2 * I_, H), "bf16", label="w13 half"),
                w2=contexts[0].buffer((E // 2, H, I_), "bf16", label="w2 half"))
    desc, info = build_desc(half["router"], half["w13"], half["w2"], top_k=2,
                            ep_comm=comms[0], ep_mode="low_latency", ep_max_tokens=16)
    assert desc.experts == E and desc.ep_comm == comms[0]._h
    assert desc.ep_mode == 1 and desc.ep_max_tokens == 16 and not desc.ep_owner
    assert info.ep_comm is comms[0] and comms[0] in info.keep
    owner = [e % 2 for e in range(E)]
    desc, info = build_desc(half["router"], half["w13"], half["w2"], top_k=2,
                            ep_comm=comms[1], ep_owner=owner)
    assert [desc.ep_owner[e] for e in range(E)] == owner and desc.ep_mode == 0
    assert ep_local_experts(E, 2, 0, None) == 4 and ep_local_experts(E, 2, 1, [0] * E) == 0
    with pytest.raises(ValueError, match=r"ep_owner\[3\] = 2: each expert's rank is 0 .. 1"):
        build_desc(half["router"], half["w13"], half["w2"], top_k=2, ep_comm=comms[0],
                   ep_owner=[0, 1, 0, 2, 0, 1, 0, 1])
    with pytest.raises(ValueError, match="ep_owner has 3 entries; one per expert"):
        build_desc(half["router"], half["w13"], half["w2"], top_k=2, ep_comm=comms[0],
                   ep_owner=[0, 1, 0])
    with pytest.raises(ValueError, match="ep_mode"):
        build_desc(half["router"], half["w13"], half["w2"], top_k=2, ep_comm=comms[0],
                   ep_mode="fast")
    with pytest.raises(ValueError, match="an expert-parallel layer's: give ep_comm"):
        build_desc(half["router"], half["w13"], half["w2"], top_k=2, ep_max_tokens=4)
    with pytest.raises(TypeError, match="ep_comm must be a safecuda.Comm"):
        build_desc(half["router"], half["w13"], half["w2"], top_k=2, ep_comm=5)
    # the library's checks
    with pytest.raises(sc.InvalidArgumentError, match="both given: a layer is tensor- or "
                       "expert-parallel"):
        sc.MoE(contexts[0], half["router"], half["w13"], half["w2"], top_k=2,
               tp_comm=comms[0], ep_comm=comms[0])
    with pytest.raises(sc.InvalidArgumentError, match="rank 0 of 2 holds 4 of the 8"):
        sc.MoE(contexts[0], full["router"], full["w13"], full["w2"], top_k=2,
               ep_comm=comms[0])
    with pytest.raises(sc.WrongContextError, match="desc->ep_comm .* belongs to another context"):
        sc.MoE(contexts[0], half["router"], half["w13"], half["w2"], top_k=2,
               ep_comm=comms[1])
    for b in list(full.values()) + [half["w13"], half["w2"]]:
        b.close()
    end(comms)
