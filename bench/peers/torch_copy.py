#!/usr/bin/env python3
"""Peer for bench_memory: the same copies measured with PyTorch.

bench_memory runs this with its own plan so both sides do the same work:

    torch_copy.py --arena BYTES --rotate BYTES --plan SIZE:INNER:SAMPLES:WARM,...

For each size and kind, a sample is INNER back-to-back copies of SIZE bytes. Pinned and
device-to-device copies are timed with torch.cuda.Event around the copies on one stream;
pageable copies with the host clock around the copies and a stream synchronize. The result
is the median of SAMPLES samples after WARM untimed ones. Copies rotate through offsets of
ARENA-byte arenas exactly as bench_memory does (a window of ROTATE bytes), so neither side
finds its data in L2. Sources hold random bytes. The slices of a sample are made before its
timing starts (the C side builds its views for free).

Output: one line per result, "peer <kind> <bytes> <GB/s>", with kinds h2d_pinned,
d2h_pinned, d2d (bytes read + bytes written), h2d_pageable, d2h_pageable; lines starting
with "#" are information. Exits non-zero, saying why on stderr, when torch or CUDA is
missing.
"""
import argparse
import statistics
import sys
import time

import _harness

KINDS = ("h2d_pinned", "d2h_pinned", "d2d", "h2d_pageable", "d2h_pageable")


def parse_plan(text):
    plan = []
    for item in text.split(","):
        size, inner, samples, warm = (int(x) for x in item.split(":"))
        plan.append((size, inner, samples, warm))
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arena", type=int, required=True)
    ap.add_argument("--rotate", type=int, default=256 << 20)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    plan = parse_plan(args.plan)
    kinds = [k for k in args.kinds.split(",") if k]

    torch, dev, status = _harness.open_device()
    if status:
        return status
    print(f"# {_harness.describe(torch, dev)}", flush=True)

    arena = args.arena
    stream = torch.cuda.Stream(device=dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(0x5AFEC0DA)
    with torch.cuda.stream(stream):
        d_src = torch.randint(0, 256, (arena,), dtype=torch.uint8, device=dev, generator=gen)
        d_dst = torch.randint(0, 256, (arena,), dtype=torch.uint8, device=dev, generator=gen)
    stream.synchronize()
    # Pinned arenas through pin_memory(); pageable ones plain. All hold random bytes.
    h_src = torch.empty(arena, dtype=torch.uint8).pin_memory()
    h_dst = torch.empty(arena, dtype=torch.uint8).pin_memory()
    p_src = torch.empty(arena, dtype=torch.uint8)
    p_dst = torch.empty(arena, dtype=torch.uint8)
    h_src.copy_(d_src)
    h_dst.copy_(d_dst)
    p_src.copy_(d_src)
    p_dst.copy_(d_dst)  # touches every page of the pageable destination
    torch.cuda.synchronize()

    timer = _harness.EventTimer(torch, stream)
    rot = [0]

    def next_offset(size):
        window = min(arena, args.rotate)
        slots = max(1, window // size)
        if size >= window:
            slots = max(1, arena // size)
        off = (rot[0] % slots) * size
        rot[0] += 1
        return off

    def pairs(kind, size, inner):
        out = []
        for _ in range(inner):
            o = next_offset(size)
            if kind == "h2d_pinned":
                out.append((d_dst[o:o + size], h_src[o:o + size]))
            elif kind == "d2h_pinned":
                out.append((h_dst[o:o + size], d_src[o:o + size]))
            elif kind == "d2d":
                out.append((d_dst[o:o + size], d_src[o:o + size]))
            elif kind == "h2d_pageable":
                out.append((d_dst[o:o + size], p_src[o:o + size]))
            else:
                out.append((p_dst[o:o + size], d_src[o:o + size]))
        return out

    def sample(kind, size, inner):
        """Seconds for `inner` copies of `size` bytes."""
        work = pairs(kind, size, inner)

        def copies():
            for dst, src in work:
                dst.copy_(src, non_blocking=True)

        if kind.endswith("pageable"):
            with torch.cuda.stream(stream):
                t0 = time.perf_counter_ns()
                copies()
                stream.synchronize()
                return (time.perf_counter_ns() - t0) * 1e-9
        return timer.ms(copies) * 1e-3

    for size, inner, samples, warm in plan:
        for kind in kinds:
            for _ in range(warm):
                sample(kind, size, inner)
            times = [sample(kind, size, inner) for _ in range(samples)]
            moved = size * inner * (2 if kind == "d2d" else 1)
            t = statistics.median(times)
            print(f"peer {kind} {size} {moved / t * 1e-9:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
