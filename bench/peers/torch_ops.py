#!/usr/bin/env python3
"""Peer for bench_stream: the issue cost of small fills and copies with PyTorch.

    torch_ops.py --bytes 4096 --ops 20000 --batches 5 --chunk 128

Like bench_stream, a batch is OPS operations issued in chunks of CHUNK; only the issuing is
timed (time.perf_counter_ns around each chunk) and the streams are synchronized between
chunks, untimed. The result is the median batch, in ns per operation.

Kinds: fill (int32 tensor.fill_ on one stream), copy (dst.copy_(src) on one stream),
fill_alt and copy_alt (operation i on stream i % 2, ordered after the other stream by
torch.cuda.Event.record + Stream.wait_event, which is how a torch program orders a tensor
used on two streams). Output lines: "peer <kind> <bytes> <ns/op>"; "#" lines are
information. Exits non-zero, saying why on stderr, when torch or CUDA is missing.
"""
import argparse
import statistics
import sys
import time

import _harness


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=128)
    args = ap.parse_args()

    torch, dev, status = _harness.open_device()
    if status:
        return status
    print(f"# {_harness.describe(torch, dev)}", flush=True)

    n = args.bytes // 4
    gen = torch.Generator(device=dev)
    gen.manual_seed(0xF111)
    src1 = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device=dev, generator=gen)
    dst1 = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device=dev, generator=gen)
    src2 = src1.clone()
    dst2 = dst1.clone()
    value = 0x5AFE1
    streams = [torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)]
    events = [torch.cuda.Event(), torch.cuda.Event()]
    torch.cuda.synchronize()

    # One-stream kinds run with streams[0] made current once per batch (see batch()).
    def fill(i):
        dst1.fill_(value)

    def copy(i):
        dst1.copy_(src1)

    def fill_alt(i):
        cur, prev = i & 1, (i & 1) ^ 1
        events[prev].record(streams[prev])
        streams[cur].wait_event(events[prev])
        with torch.cuda.stream(streams[cur]):
            dst2.fill_(value)

    def copy_alt(i):
        cur, prev = i & 1, (i & 1) ^ 1
        events[prev].record(streams[prev])
        streams[cur].wait_event(events[prev])
        with torch.cuda.stream(streams[cur]):
            dst2.copy_(src2)

    def batch(fn, ops):
        torch.cuda.synchronize()
        total = 0
        i = 0
        with torch.cuda.stream(streams[0]):
            while i < ops:
                k = min(args.chunk, ops - i)
                t0 = time.perf_counter_ns()
                for j in range(i, i + k):
                    fn(j)
                total += time.perf_counter_ns() - t0
                i += k
                torch.cuda.synchronize()
        return total / ops

    kinds = [("fill", fill), ("copy", copy), ("fill_alt", fill_alt), ("copy_alt", copy_alt)]
    for _, fn in kinds:
        batch(fn, max(1, args.ops // 10))  # warm-up
    results = {name: [] for name, _ in kinds}
    for _ in range(args.batches):
        for name, fn in kinds:
            results[name].append(batch(fn, args.ops))
    for name, _ in kinds:
        print(f"peer {name} {args.bytes} {statistics.median(results[name]):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
