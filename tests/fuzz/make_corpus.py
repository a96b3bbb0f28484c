#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_api (tests/fuzz/corpus/): small inputs that encode
meaningful call sequences in fuzz_api.c's input format, so the fuzzer starts from programs
that get past the argument checks. Re-run after changing the format:

    python3 tests/fuzz/make_corpus.py
"""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))

# Opcodes (byte % 20 in LLVMFuzzerTestOneInput).
BUF_CREATE, BUF_DESTROY, HOST_CREATE, HOST_DESTROY, VIEW, VIEW_SUB = 0, 2, 3, 4, 5, 6
COPY_FROM_HOST, COPY_TO_HOST, FROM_HOST_BUF, TO_HOST_BUF, COPY, FILL = 7, 8, 9, 10, 11, 12
STREAM_CREATE, STREAM_MISC, EVENT, LAUNCH, HOST_IO, INFO_OR_TRIP, CONTEXT = (
    13, 14, 15, 16, 17, 18, 19)
F32, U8, F64, BF16 = 11, 1, 12, 10


class Program:
    def __init__(self):
        self.b = bytearray()

    def raw(self, *bs):
        self.b += bytes(x & 0xFF for x in bs)
        return self

    # pick_u64
    def u64_byte(self, v):
        return self.raw(2, v)

    def u64_16(self, v):
        return self.raw(4, v & 0xFF, v >> 8)

    def u64_whole(self):
        return self.raw(6)

    def u64_max_minus(self, d):
        return self.raw(7, d)

    def u64_mib(self, mib):
        return self.raw(10, mib)

    # handles: a tracked slot (how < 10, then the index)
    def slot(self, i):
        return self.raw(0, i)

    def default_stream(self):
        return self.raw(0)  # byte % 3 == 0

    def stream(self, i):
        return self.raw(1, 1).slot(i)  # not default, not the default's handle, slot i

    def view_whole(self, buf):
        return self.raw(1).slot(buf)

    def view(self, buf, off, count):
        self.raw(2).slot(buf)
        self.u64_byte(off)
        return self.u64_byte(count)


def buffer(p, dtype=F32, count=64, zero=0, stream=None):
    p.raw(BUF_CREATE, dtype).u64_byte(count)
    p.default_stream() if stream is None else p.stream(stream)
    return p.raw(zero)


def seeds():
    out = {}

    p = Program()  # upload, download, destroy
    buffer(p)
    p.raw(COPY_FROM_HOST).default_stream().view_whole(0).raw(0)
    p.raw(COPY_TO_HOST).default_stream().view_whole(0).raw(0)
    p.raw(INFO_OR_TRIP, 0, 0).default_stream().raw(7)
    p.raw(BUF_DESTROY).slot(0)
    out["round_trip"] = p

    p = Program()  # device to device, fills
    buffer(p)
    buffer(p, zero=1)
    p.raw(COPY).default_stream().view_whole(1).view_whole(0)
    p.raw(FILL).default_stream().view(0, 8, 16).raw(1, 2, 3, 4, 5, 6, 7, 8, 1)
    p.raw(COPY).default_stream().view(0, 0, 10).view(0, 5, 10)  # overlap
    out["copy_fill"] = p

    p = Program()  # pinned host buffers
    p.raw(HOST_CREATE).u64_byte(255).raw(1)
    buffer(p, U8, 128)
    p.raw(FROM_HOST_BUF).default_stream().view_whole(0).slot(0).raw(1, 16)
    p.raw(TO_HOST_BUF).default_stream().view_whole(0).slot(0).raw(1, 100)
    p.raw(HOST_IO).slot(0).raw(1, 4, 1, 32, 1)
    p.raw(HOST_IO).slot(0).raw(1, 0, 1, 200, 2)
    p.raw(HOST_DESTROY).slot(0).raw(1)
    out["pinned"] = p

    p = Program()  # two streams, an event, cross-stream use
    p.raw(STREAM_CREATE, 3, 0, 1)
    p.raw(STREAM_CREATE, 250, 1, 1)
    buffer(p, stream=0)
    p.raw(COPY_FROM_HOST).stream(0).view_whole(0).raw(0)
    p.raw(COPY_TO_HOST).stream(1).view_whole(0).raw(0)
    p.raw(EVENT, 0, 1, 0)
    p.raw(EVENT, 2).slot(0).stream(0)
    p.raw(STREAM_MISC).stream(1).raw(4).slot(0)
    p.raw(FILL).stream(1).view_whole(0).raw(0, 0, 0x80, 0x3F, 0, 0, 0, 0, 1)
    p.raw(STREAM_MISC).stream(0).raw(0)
    p.raw(STREAM_MISC).stream(1).raw(1)
    out["streams_events"] = p

    p = Program()  # a correct launch of add(a, b, n) and a few wrong ones
    buffer(p)
    buffer(p)

    def launch(kernel, grid, block32, args, good=1, config_for=None, desc=1):
        p.raw(LAUNCH, kernel, 1, grid - 1, block32 - 1, 1, len(args))
        for a in args:
            a()
        p.raw(good)
        p.default_stream()
        if config_for is None:
            p.raw(1)
        else:
            p.raw(0).u64_byte(config_for)
        p.raw(desc)
        if not args:
            p.raw(1)  # args array given (not NULL) even with nargs 0

    def view_in(b):
        return lambda: p.raw(0).view_whole(b)

    def view_inout(b):
        return lambda: p.raw(2).view_whole(b)

    def u32(v):
        return lambda: p.raw(3, v, 0, 0, 0)

    def u64(v):
        return lambda: p.raw(4, v, 0, 0, 0, 0, 0, 0, 0)

    launch(0, 4, 4, [view_in(0), view_inout(1), u32(64)])  # correct
    launch(0, 1, 4, [view_in(0), view_inout(1), u64(64)])  # wrong scalar size
    launch(0, 1, 4, [view_in(0), view_inout(1)])  # too few arguments
    launch(0, 1, 40, [view_in(0), view_inout(1), u32(64)], config_for=64)  # 1280 threads
    launch(2, 2, 8, [])  # tiled(): 256 threads
    launch(2, 2, 9, [])  # tiled(): 288 > .maxntid 256
    launch(1, 1, 1, [lambda: p.raw(6, 1, 16), view_inout(0)])  # pack(struct16, out)
    p.raw(LAUNCH, 0, 1, 0, 3, 1, 0).raw(0).view_whole(0).view_whole(1).raw(64)  # the good case
    p.default_stream().raw(1, 1)
    p.raw(BUF_DESTROY).slot(0)
    out["launch"] = p

    p = Program()  # views at the edges
    buffer(p, F64, 200)
    p.raw(VIEW).slot(0).u64_byte(10).u64_whole()
    p.raw(VIEW).slot(0).u64_byte(201).u64_whole()
    p.raw(VIEW).slot(0).u64_max_minus(1).u64_byte(5)
    p.raw(VIEW_SUB).raw(0, 0).u64_byte(3).u64_byte(4)
    p.raw(VIEW_SUB).raw(0, 0).u64_max_minus(0).u64_byte(2)
    p.raw(COPY_TO_HOST).default_stream().raw(0, 0).raw(0)
    out["views"] = p

    p = Program()  # stale, zero and foreign handles
    buffer(p)
    p.raw(BUF_DESTROY).slot(0)
    p.raw(BUF_DESTROY).slot(0)
    p.raw(COPY_FROM_HOST).default_stream().view_whole(0).raw(0)
    p.raw(BUF_DESTROY).raw(10)  # zero handle
    p.raw(BUF_DESTROY).raw(11, 1, 3)  # forged buffer id
    p.raw(BUF_DESTROY).raw(12, 4)  # of another kind
    p.raw(FILL).default_stream().raw(1).raw(14).raw(1, 2, 3, 4, 5, 6, 7, 8, 1)
    out["stale"] = p

    p = Program()  # out of memory and the budget of the device
    p.raw(BUF_CREATE, U8).u64_mib(40).default_stream().raw(0)
    p.raw(BUF_CREATE, U8).u64_mib(40).default_stream().raw(0)
    p.raw(BUF_DESTROY).slot(0)
    p.raw(BUF_CREATE, U8).u64_mib(50).default_stream().raw(0)
    p.raw(CONTEXT, 0)
    p.raw(BUF_CREATE, F64).raw(7, 3).default_stream().raw(0)  # overflowing size
    p.raw(HOST_CREATE).u64_mib(100).raw(0)
    out["oom"] = p

    p = Program()  # dtypes, zero counts, invalid dtypes
    for dt in (0, 1, 3, 5, 7, 9, 10, 12, 13, 14):
        buffer(p, dt, 3, zero=1)
    p.raw(BUF_CREATE, F32).raw(0).default_stream().raw(0)
    out["dtypes"] = p

    p = Program()  # pinned copies at the edges of the host buffer
    p.raw(HOST_CREATE).u64_byte(64).raw(0)
    buffer(p, F32, 16)
    p.raw(FROM_HOST_BUF).default_stream().view_whole(0).slot(0).raw(1, 0)
    p.raw(FROM_HOST_BUF).default_stream().view_whole(0).slot(0).raw(1, 1)
    p.raw(TO_HOST_BUF).default_stream().view_whole(0).slot(0).raw(0).u64_max_minus(3)
    p.raw(HOST_IO).slot(0).raw(0).u64_max_minus(0).raw(1, 2, 1)
    out["pinned_edges"] = p

    p = Program()  # events: timing, elapsed, destroy
    p.raw(EVENT, 0, 1, 0).raw(EVENT, 0, 1, 1)
    p.raw(EVENT, 5).slot(0).slot(1)
    p.raw(EVENT, 2).slot(0).default_stream()
    p.raw(EVENT, 2).slot(1).default_stream()
    p.raw(EVENT, 5).slot(0).slot(1)
    p.raw(EVENT, 3).slot(0)
    p.raw(EVENT, 1).slot(1)
    p.raw(EVENT, 4).slot(1)
    out["events"] = p

    p = Program()  # many buffers, trims and stats
    for i in range(12):
        buffer(p, U8, 200 + i)
    p.raw(CONTEXT, 2, 3).raw(CONTEXT, 0).raw(CONTEXT, 3)
    for i in range(0, 12, 2):
        p.raw(BUF_DESTROY).slot(i)
    p.raw(CONTEXT, 0)
    out["many"] = p

    rnd = random.Random(20240601)
    for k in range(4):
        out[f"random_{k}"] = Program().raw(*(rnd.randrange(256) for _ in range(48 + 32 * k)))
    return out


def main():
    corpus = os.path.join(HERE, "corpus")
    os.makedirs(corpus, exist_ok=True)
    for name, prog in seeds().items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(bytes(prog.b))
    print(f"wrote {len(seeds())} seeds to {corpus}")


if __name__ == "__main__":
    main()
