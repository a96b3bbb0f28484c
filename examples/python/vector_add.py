#!/usr/bin/env python3
"""vector_add.py: the C example examples/vector_add.c from Python.

A kernel compiled at run time with NVRTC, buffers filled from the host, a checked launch,
the result compared on the host; then a launch with a wrong argument, refused before
anything runs. Without a GPU (or NVRTC) it says why and exits 2.

    pip install ./python && python3 examples/python/vector_add.py
"""
import array
import random
import sys

import safecuda as sc

SOURCE = r"""
__global__ void vector_add(const float *a, const float *b, float *c, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def main():
    n = 1 << 20
    rng = random.Random(42)
    a_host = array.array("f", (rng.uniform(-1, 1) for _ in range(n)))
    b_host = array.array("f", (rng.uniform(-1, 1) for _ in range(n)))
    try:
        ctx = sc.Context()
    except (sc.NoDriverError, sc.NoDeviceError) as e:
        print(f"vector_add: no GPU to run on: {e}")
        return 2
    with ctx:
        print(f"device 0: {sc.device_info(0).name}")
        try:
            # A C++ kernel (no extern "C"): its parameter types are known to the launch
            # checks through its mangled name.
            program = ctx.compile(SOURCE, name="vector_add.cu", name_expressions=["vector_add"])
        except sc.NoCompilerError as e:
            print(f"vector_add: no NVRTC: {e}")
            return 2
        with program, program.load() as module:
            kernel = module.kernel("vector_add")
            with ctx.from_host(a_host, label="a") as a, ctx.from_host(b_host, label="b") as b, \
                    ctx.buffer(n, "f32", label="c") as c:
                grid, block = kernel.config_for(n)
                kernel.launch(grid, block, sc.In(a), sc.In(b), sc.Out(c), sc.u32(n))
                got = c.to_host()
                worst = max(abs(g - (x + y)) for g, x, y in zip(got, a_host, b_host))
                print(f"c = a + b over {n} floats: largest error {worst:g}")
                if worst > 1e-6:
                    print("vector_add: WRONG RESULT")
                    return 1
                # A mistake the launch catches: an int buffer where the kernel takes floats.
                with ctx.buffer(n, "i32", label="ints") as wrong:
                    try:
                        kernel.launch(grid, block, sc.In(a), sc.In(wrong), sc.Out(c),
                                      sc.u32(n))
                    except sc.TypeMismatchError as e:
                        print(f"refused as expected: {e}")
    print("vector_add: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
