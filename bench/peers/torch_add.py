#!/usr/bin/env python3
"""Peer for bench_launch: fp32 vector add and a large device copy with PyTorch.

bench_launch runs this with its own sizes so both sides do the same work:

    torch_add.py --n 268435456 --runs 50 --warmup 5

a, b and c are float32 tensors of N random elements on device 0. A run is one
torch.add(a, b, out=c) (no allocation in the timed region), timed with torch.cuda.Event
around it on one stream; the copy is c.copy_(a), timed the same way. The result is the
median of RUNS runs after WARMUP untimed ones.

Output lines:
    peer torch_add <n> <ms> <GB/s>        GB/s counts 12 bytes per element (2 reads, 1 write)
    peer torch_copy <bytes> <ms> <GB/s>   bytes = 4 * n; GB/s counts bytes read + written
Lines starting with "#" are information. Exits non-zero, saying why on stderr, when torch
or CUDA is missing.
"""
import argparse
import sys

import _harness


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1 << 28)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    n = args.n

    torch, dev, status = _harness.open_device()
    if status:
        return status
    print(f"# {_harness.describe(torch, dev)}", flush=True)

    stream = torch.cuda.Stream(device=dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(0xADD)
    with torch.cuda.stream(stream):
        a = torch.rand(n, dtype=torch.float32, device=dev, generator=gen) * 2 - 1
        b = torch.rand(n, dtype=torch.float32, device=dev, generator=gen) * 2 - 1
        c = torch.empty(n, dtype=torch.float32, device=dev)
    stream.synchronize()

    timer = _harness.EventTimer(torch, stream)

    def measure(op):
        return timer.median_ms(op, args.runs, args.warmup)

    def add():
        torch.add(a, b, out=c)

    def copy():
        c.copy_(a)

    ms = measure(add)
    # Check once that the add did the work (outside the timing).
    stream.synchronize()
    if not torch.equal(c[:1024], a[:1024] + b[:1024]):
        print("torch.add produced a wrong result", file=sys.stderr)
        return 4
    print(f"peer torch_add {n} {ms:.6f} {12.0 * n / (ms * 1e-3) * 1e-9:.2f}", flush=True)

    ms = measure(copy)
    nbytes = 4 * n
    print(f"peer torch_copy {nbytes} {ms:.6f} {2.0 * nbytes / (ms * 1e-3) * 1e-9:.2f}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
