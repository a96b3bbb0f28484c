"""On a GPU, without torch: compiled kernels, checked launches, DLPack between safecuda
buffers. Skipped (saying why) without a driver or a GPU; failed instead under
SAFECUDA_REQUIRE_GPU=1."""

import array
import random

import pytest

import safecuda as sc

pytestmark = pytest.mark.gpu

SRC = r"""
template <typename T>
__global__ void axpy(const T *x, T *y, T a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


@pytest.fixture
def ctx(gpu):
    with sc.Context(gpu) as c:
        yield c


def test_axpy(ctx, nvrtc):
    n = 100_003
    rng = random.Random(1)
    xs = array.array("f", (rng.uniform(-1, 1) for _ in range(n)))
    ys = array.array("f", (rng.uniform(-1, 1) for _ in range(n)))
    with ctx.compile(SRC, name_expressions=["axpy<float>"]) as prog, prog.load() as mod:
        k = mod.kernel("axpy<float>")
        x, y = ctx.from_host(xs, label="x"), ctx.from_host(ys, label="y")
        grid, block = k.config_for(n)
        k.launch(grid, block, sc.In(x), sc.InOut(y), sc.f32(0.5), sc.u32(n))
        got = y.to_host()
        want = array.array("f", (0.5 * a + b for a, b in zip(xs, ys)))
        assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-6
        d = ctx.buffer(n, "f64", label="doubles")
        with pytest.raises(sc.TypeMismatchError, match="argument 0"):
            k.launch(grid, block, sc.In(d), sc.InOut(y), sc.f32(0.5), sc.u32(n))
        for b in (x, y, d):
            b.close()


def test_dlpack_between_buffers_on_the_gpu(ctx):
    a = ctx.from_host(array.array("i", range(4096)), shape=(64, 64), label="a")
    b = sc.Buffer.from_dlpack(a, context=ctx)
    assert b.device_ptr == a.device_ptr and b.shape == (64, 64)
    s = ctx.stream()
    b[3].fill(-7, stream=s)  # written through the borrowed buffer on another stream
    a.close()
    got = b.to_host().tolist()  # ordered after the fill; the export kept the memory
    assert got[3] == [-7] * 64 and got[4] == list(range(256, 320))
    b.close()
    s.close()


def test_fp8_buffers_on_the_gpu(ctx):
    rng = random.Random()
    data = bytes(rng.getrandbits(8) for _ in range(100_003))
    for d in ("f8e4m3", "f8e5m2"):
        a = ctx.from_host(data, dtype=d, label="a")
        b = ctx.buffer(len(data), d, label="b")
        b.fill(b"\x7f")  # poison: NaN in both formats
        b.view(1, len(data) - 3).copy_from(a.view(2, len(data) - 3))
        got = bytes(b.to_host())
        assert got[0] == 0x7F and got[1:-2] == data[2:-1] and got[-2:] == b"\x7f\x7f"
        b.view(10, 20).fill(2.0)
        assert b.view(9, 22).tolist()[1:21] == [2.0] * 20
        imp = sc.Buffer.from_dlpack(b.view(10, 20), context=ctx)
        assert imp.dtype is sc.as_dtype(d) and imp.tolist() == [2.0] * 20
        for o in (imp, a, b):
            o.close()


def test_readme_python_example(gpu, nvrtc):
    """The README's first Python example ("From Python and PyTorch"), run verbatim."""
    import os
    import re
    import subprocess
    import sys

    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## From Python and PyTorch"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "[2.0, 3.0, 4.0]", r.stdout
    assert lines[1] == str([2.0 * i for i in range(8)]), r.stdout
    assert "argument 2" in lines[2], r.stdout  # the refused launch, printed
