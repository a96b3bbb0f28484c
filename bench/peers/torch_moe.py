#!/usr/bin/env python3
"""Peer for bench_moe: the same Mixture-of-Experts layers measured with PyTorch.

bench_moe runs this once, before it allocates anything on the GPU, with the layer shapes
and token counts it will measure itself:

    torch_moe.py --specs NAME:E:K:H:I:SCORING:RENORM:BIAS,... --tokens 1,16,...
                 [--quick] [--budget SECONDS]

SCORING is softmax or sigmoid; RENORM and BIAS are 0 or 1 (BIAS: a random f32 selection
bias per expert, added to the scores for the top-k choice only, DeepSeek-V3 style).

Two layers, both bf16 on the GPU, with the same routing as safecuda's layer (router GEMM,
softmax or sigmoid scores, top-k by score + bias, the chosen scores as weights,
renormalized when asked):

  loop     the Hugging Face Mixtral style: a one-hot expert mask, the experts that got
           tokens, and for each of them torch.where, index_select, one GEMM for gate+up
           (W13 [2I, H], rows 0..I-1 gate), silu(gate) * up, the W2 GEMM, the routing
           weight, index_add_ into the output;
  grouped  torch._grouped_mm: tokens sorted by expert, int32 cumulative offsets, one grouped
           GEMM with W13 laid out [E, H, 2I] (made contiguous once, untimed), silu * mul,
           one grouped GEMM with W2 laid out [E, I, H], the routing weight, index_add_ back.

Before the grouped layer is timed, both layers run on one input of 64 tokens with the same
weights and their largest difference is printed as information (a check of the peer).

Weights are random (torch.randn * 1/sqrt(fan_in)), made on the GPU per layer and freed
before the next. Inputs are randn; up to 1024 tokens, four different inputs are used in
turn (as bench_moe does) so that the routing, and the experts read, change between runs.

Timing: torch.cuda.Event around each forward, synchronized after each; warm-up forwards (at
least 3, and at least 0.1 s of them, as bench_moe does), then the median of 20 forwards
(T <= 1024) or 10 (more tokens); --quick halves the counts. A point whose first forward
takes more than 0.5 s gets 3 timed forwards and no more warm-up. A loop point estimated to
take more than 2 s (the previous token count's time plus the added expert FLOPs at a
quarter of the measured matmul rate) is skipped (nan), as is every point once --budget
seconds have passed.

Output, one line per result:
    peer matmul_tflops <bf16 8192^3 matmul TFLOP/s, median of 10 after warm-up>
    peer copy_tbs <1 GiB device-to-device copy, (read + write bytes) / s in TB/s>
    peer <name> <T> <loop ms> <grouped ms>          ("nan" where not measured)
Lines starting with "#" are information. Exits non-zero, saying why, when torch or CUDA is
missing.
"""
import argparse
import math
import statistics
import sys
import time

SLOW_RUN_S = 0.5     # a forward slower than this: 3 timed runs, no more warm-up
SKIP_LOOP_S = 2.0    # loop points estimated slower than this are skipped
WARM = 3             # warm-up: at least WARM forwards and at least WARM_S seconds
WARM_S = 0.1
LOOP_EFFICIENCY = 0.25  # the loop's assumed share of the matmul rate, for its estimate


class Spec:
    def __init__(self, text):
        f = text.split(":")
        if len(f) != 8:
            raise ValueError(f"bad spec '{text}'")
        self.name = f[0]
        self.E, self.k, self.H, self.I = (int(v) for v in f[1:5])
        if f[5] not in ("softmax", "sigmoid"):
            raise ValueError(f"bad scoring '{f[5]}'")
        self.sigmoid = f[5] == "sigmoid"
        self.renorm = f[6] == "1"
        self.bias = f[7] == "1"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specs", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=240.0)
    args = ap.parse_args()
    specs = [Spec(s) for s in args.specs.split(",") if s]
    tokens = [int(t) for t in args.tokens.split(",") if t]
    t_start = time.monotonic()

    try:
        import torch
        import torch.nn.functional as F
    except Exception as exc:  # noqa: BLE001 - any import failure means "no peer"
        print(f"torch unavailable: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch unavailable: torch.cuda.is_available() is False", file=sys.stderr)
        return 3

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(0x5AFEC0DA)
    has_grouped = hasattr(torch, "_grouped_mm")
    print(f"# torch {torch.__version__} (CUDA {torch.version.cuda}) on "
          f"{torch.cuda.get_device_name(dev)}; _grouped_mm "
          f"{'available' if has_grouped else 'missing'}", flush=True)

    ev0 = torch.cuda.Event(enable_timing=True)
    ev1 = torch.cuda.Event(enable_timing=True)

    def event_ms(fn):
        ev0.record()
        fn()
        ev1.record()
        ev1.synchronize()
        return ev0.elapsed_time(ev1)

    # ---- the machine's rates: bf16 matmul and device-to-device copy ----------------------
    with torch.no_grad():
        n = 8192
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        for _ in range(5):
            torch.mm(a, b, out=c)
        ms = statistics.median(event_ms(lambda: torch.mm(a, b, out=c)) for _ in range(10))
        matmul_rate = 2.0 * n ** 3 / (ms * 1e-3)  # FLOP/s
        print(f"peer matmul_tflops {matmul_rate * 1e-12:.2f}", flush=True)
        del a, b, c
        nbytes = 1 << 30
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        for _ in range(2):
            dst.copy_(src)
        ms = statistics.median(event_ms(lambda: dst.copy_(src)) for _ in range(10))
        print(f"peer copy_tbs {2.0 * nbytes / (ms * 1e-3) * 1e-12:.4f}", flush=True)
        del src, dst
        torch.cuda.empty_cache()

    def reps_for(T):
        r = 20 if T <= 1024 else 10
        return max(1, r // 2) if args.quick else r

    def over_budget():
        return time.monotonic() - t_start > args.budget

    def measure(fn, xs, T):
        """Median ms of fn(x), the inputs taken in turn."""
        t0 = time.monotonic()
        fn(xs[0])
        torch.cuda.synchronize()
        first = time.monotonic() - t0
        reps, warm = reps_for(T), WARM - 1
        if first > SLOW_RUN_S:
            reps, warm = min(reps, 3), 0
        i = 0
        while warm > 0 and (i < warm or time.monotonic() - t0 < WARM_S) and i < 1000:
            fn(xs[(i + 1) % len(xs)])
            i += 1
            torch.cuda.synchronize()
        times = []
        for r in range(reps):
            x = xs[r % len(xs)]
            times.append(event_ms(lambda: fn(x)))
            if times[-1] > SLOW_RUN_S * 1e3 and len(times) >= 3:
                break
        return statistics.median(times)

    for sp in specs:
        E, k, H, I = sp.E, sp.k, sp.H, sp.I
        loop_ms = {T: math.nan for T in tokens}
        grouped_ms = {T: math.nan for T in tokens}
        try:
            with torch.no_grad():
                run_layer(torch, F, sp, tokens, dev, measure, over_budget, has_grouped,
                          matmul_rate, loop_ms, grouped_ms)
        except Exception as exc:  # noqa: BLE001 - report, print what was measured, go on
            msg = str(exc).replace("\n", " ")[:300]
            print(f"# {sp.name}: failed: {type(exc).__name__}: {msg}", flush=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        for T in tokens:
            print(f"peer {sp.name} {T} {loop_ms[T]:.4f} {grouped_ms[T]:.4f}", flush=True)
    print(f"# done in {time.monotonic() - t_start:.1f} s", flush=True)
    return 0


def run_layer(torch, F, sp, tokens, dev, measure, over_budget, has_grouped, matmul_rate,
              loop_ms, grouped_ms):
    E, k, H, I = sp.E, sp.k, sp.H, sp.I
    bf16 = torch.bfloat16
    t0 = time.monotonic()
    router = torch.randn(E, H, device=dev, dtype=bf16).mul_(1.0 / math.sqrt(H))
    w13 = torch.randn(E, 2 * I, H, device=dev, dtype=bf16).mul_(1.0 / math.sqrt(H))
    w2 = torch.randn(E, H, I, device=dev, dtype=bf16).mul_(1.0 / math.sqrt(I))
    bias = ((torch.rand(E, device=dev, dtype=torch.float32) - 0.5) * 0.1) if sp.bias else None
    torch.cuda.synchronize()
    print(f"# {sp.name}: E={E} k={k} H={H} I={I}: weights "
          f"{(router.numel() + w13.numel() + w2.numel()) * 2 / 1e9:.2f} GB made in "
          f"{time.monotonic() - t0:.2f} s", flush=True)

    def route(x):
        """(weights f32 [T, k], expert ids int64 [T, k]) as safecuda's layer routes."""
        logits = F.linear(x, router).float()
        if sp.sigmoid:
            scores = torch.sigmoid(logits)
        else:
            scores = torch.softmax(logits, dim=-1)
        if bias is not None:
            _, ids = torch.topk(scores + bias, k, dim=-1)
            w = scores.gather(1, ids)
        else:
            w, ids = torch.topk(scores, k, dim=-1)
        if sp.renorm:
            w = w / w.sum(dim=-1, keepdim=True)
        return w, ids

    def loop_forward(x):
        w, ids = route(x)
        w = w.to(x.dtype)
        out = torch.zeros_like(x)
        mask = F.one_hot(ids, num_classes=E).permute(2, 1, 0)  # [E, k, T]
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit.view(-1).tolist():
            slot, tok = torch.where(mask[e])
            xs = x.index_select(0, tok)
            gate, up = F.linear(xs, w13[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, w2[e])
            y = y * w[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out

    def inputs(T):
        n = 4 if T <= 1024 else 1
        return [torch.randn(T, H, device=dev, dtype=bf16) for _ in range(n)]

    prev = None  # (T, ms) of the last loop point measured
    for T in tokens:
        if over_budget():
            print(f"# {sp.name} T={T}: loop skipped (peer time budget spent)", flush=True)
            continue
        if prev:
            added = 2.0 * (T - prev[0]) * k * 3 * H * I / (matmul_rate * LOOP_EFFICIENCY)
            est_s = prev[1] * 1e-3 + max(0.0, added)
            if est_s > SKIP_LOOP_S:
                print(f"# {sp.name} T={T}: loop skipped (estimated {est_s:.1f} s)",
                      flush=True)
                continue
        xs = inputs(T)
        loop_ms[T] = measure(loop_forward, xs, T)
        prev = (T, loop_ms[T])
        del xs

    if not has_grouped:
        return
    # The grouped layout: W13 as [E, H, 2I], W2 as [E, I, H], contiguous, made once.
    w13_t = w13.transpose(1, 2).contiguous()
    w2_t = w2.transpose(1, 2).contiguous()

    def grouped_forward(x):
        w, ids = route(x)
        flat = ids.view(-1)
        order = torch.argsort(flat, stable=True)
        tok = order // k
        offs = torch.cumsum(torch.bincount(flat, minlength=E), 0, dtype=torch.int32)
        xs = x.index_select(0, tok)
        h13 = torch._grouped_mm(xs, w13_t, offs=offs)  # [T*k, 2I]
        h = F.silu(h13[:, :I]) * h13[:, I:]
        y = torch._grouped_mm(h, w2_t, offs=offs)  # [T*k, H]
        y = y * w.view(-1)[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, tok, y)

    # The two torch layers must agree (same weights, same input): a check of the peer.
    try:
        x = torch.randn(64, H, device=dev, dtype=bf16)
        ref, got = loop_forward(x).float(), grouped_forward(x).float()
        err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        print(f"# {sp.name}: grouped vs loop at T=64: max |diff| / max |out| = {err:.2e}",
              flush=True)
        del x, ref, got
    except Exception as exc:  # noqa: BLE001 - the timing below reports the failure
        print(f"# {sp.name}: grouped vs loop check failed: {type(exc).__name__}: "
              f"{str(exc)[:200]}", flush=True)
    del w13, w2
    torch.cuda.empty_cache()

    for T in tokens:
        if over_budget():
            print(f"# {sp.name} T={T}: grouped skipped (peer time budget spent)", flush=True)
            continue
        xs = inputs(T)
        try:
            grouped_ms[T] = measure(grouped_forward, xs, T)
        except Exception as exc:  # noqa: BLE001 - a shape _grouped_mm refuses: nan
            msg = str(exc).replace("\n", " ")[:200]
            print(f"# {sp.name} T={T}: _grouped_mm failed: {type(exc).__name__}: {msg}",
                  flush=True)
        del xs


if __name__ == "__main__":
    sys.exit(main())
