#!/usr/bin/env python3
"""bench_torch_moe: the safecuda MoE layer from Python and PyTorch.

    python3 bench/bench_torch_moe.py [--out DIR] [--quick] [--c-bench PATH]
                                     [--tokens 1,16,256,4096] [--configs qwen3moe,mixtral]

Needs the safecuda package (pip install ./python), torch with CUDA and a GPU; exits 77
saying why when one is missing.

Part 1, host overhead. A small layer (E=8 k=2 H=256 I=512, bf16 zeros) at T=1: the host
wall time of one call, as the median over 50 batches (after 3 warm-up batches) of the time
of 100 back-to-back calls divided by 100 (the calls only; a synchronize after each batch is
not timed; 100 forwards never fill the driver's launch queue, which would make a call wait
for the GPU). Paths:
  C                  sc_moe_forward from C (build/bench/bench_moe_host, the same method);
  safecuda.MoE       MoE.forward on safecuda buffers and a safecuda stream;
  torch op           torch.ops.safecuda.moe(x, layer) on a torch tensor (the dispatcher,
                     torch's current stream, the output allocated by torch, x and out
                     borrowed for the call);
  torch layer impl   the same work without the dispatcher (the op's Python body);
  torch module       safecuda.torch.MoE(...)(x): the nn.Module call, which in plain eager
                     mode runs the op's body without the dispatcher;
  torch module, dispatcher   the same with use_dispatcher=True (through the op).
The C number comes from --c-bench (default: build-gpu/bench/bench_moe_host, then
build/bench/bench_moe_host); without it the C row says "not measured".

Part 2, device time inside a PyTorch module. For qwen3moe (E=128 k=8 H=2048 I=768) and
mixtral (E=8 k=2 H=4096 I=14336), softmax routing renormalized, random bf16 weights
(randn / sqrt(fan in)), at T = 1, 16, 256, 4096 tokens (--quick: 1, 256): the safecuda
layer (safecuda.torch.MoE inside an nn.Module) against PyTorch's own grouped-GEMM MoE
layer (tokens sorted by expert, torch._grouped_mm for W13 and for W2 with int32 offsets,
silu(gate) * up, the routing weights, index_add_ back) on identical weights and inputs.
Time: torch.cuda.Event around one forward, synchronized after each; warm-up (at least 3
forwards and 0.1 s), then the median of 20 forwards (10 above 1024 tokens; --quick halves
them). Up to 1024 tokens four inputs are used in turn. Before timing, both layers run on
one input and the relative L2 difference of their outputs is printed (a check: both compute
the same function in bf16).

Output: two tables, and with --out DIR, DIR/bench_torch_moe.csv with the columns
section,config,T,path,value,unit.
"""
import argparse
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WARM, WARM_S = 3, 0.1
SMALL = dict(E=8, k=2, H=256, I=512)
CONFIGS = {
    "qwen3moe": dict(E=128, k=8, H=2048, I=768),
    "mixtral": dict(E=8, k=2, H=4096, I=14336),
}


def skip(why):
    print(f"bench_torch_moe: skipped: {why}")
    sys.exit(77)


def batch_host_us(call, sync, batch=100, batches=50):
    """Median over batches of the host time per call of `batch` back-to-back calls."""
    per = []
    for b in range(-3, batches):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            call()
        t1 = time.perf_counter_ns()
        sync()
        if b >= 0:
            per.append((t1 - t0) / batch / 1e3)
    return statistics.median(per)


def c_host_us(path, shape):
    if not path or not os.path.exists(path):
        return None, f"no {path or 'bench_moe_host'} (build the C benchmarks)"
    cmd = [path, "--experts", str(shape["E"]), "--top-k", str(shape["k"]), "--hidden",
           str(shape["H"]), "--intermediate", str(shape["I"]), "--tokens", "1"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path}: {exc}"
    for line in p.stdout.splitlines():
        if line.startswith("host_us_per_call "):
            return float(line.split()[1]), None
    return None, f"{path} exit {p.returncode}: {(p.stdout + p.stderr).strip()[-300:]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--c-bench")
    ap.add_argument("--tokens")
    ap.add_argument("--configs", default="qwen3moe,mixtral")
    args = ap.parse_args()
    tokens = ([int(t) for t in args.tokens.split(",")] if args.tokens else
              ([1, 256] if args.quick else [1, 16, 256, 4096]))
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c} (have {', '.join(CONFIGS)})")

    try:
        import torch
        import torch.nn.functional as F
    except ImportError as exc:
        skip(f"torch is not installed ({exc})")
    if not torch.cuda.is_available():
        skip("torch.cuda.is_available() is False")
    try:
        import safecuda as sc
        import safecuda.torch as sct
    except ImportError as exc:
        skip(f"the safecuda package is not importable ({exc}): pip install ./python")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(0x5AFEC0DA)
    print(f"bench_torch_moe: {torch.cuda.get_device_name(dev)}; torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}); safecuda {sc.version()} ({sc.library_path()})",
          flush=True)
    rows = []

    # ---- part 1: host overhead --------------------------------------------------------------
    E, k, H, I_ = SMALL["E"], SMALL["k"], SMALL["H"], SMALL["I"]
    c_path = args.c_bench
    if c_path is None:
        for cand in ("build-gpu/bench/bench_moe_host", "build/bench/bench_moe_host"):
            if os.path.exists(os.path.join(ROOT, cand)):
                c_path = os.path.join(ROOT, cand)
                break
    c_us, c_why = c_host_us(c_path, SMALL)

    bf16 = torch.bfloat16
    router = torch.zeros(E, H, device=dev, dtype=bf16)
    w13 = torch.zeros(E, 2 * I_, H, device=dev, dtype=bf16)
    w2 = torch.zeros(E, H, I_, device=dev, dtype=bf16)
    x = torch.zeros(1, H, device=dev, dtype=bf16)
    module = sct.MoE(router, w13, w2, top_k=k, max_tokens=1)
    layer_id = module.layer_id
    impl = sct._layers[layer_id]
    op = torch.ops.safecuda.moe
    sync = torch.cuda.synchronize

    results = [("C (sc_moe_forward)", c_us)]
    with sc.Context() as ctx:
        s = ctx.stream(label="python forwards")
        bufs = [ctx.buffer(shape, "bf16", zero=True, stream=s)
                for shape in ((E, H), (E, 2 * I_, H), (E, H, I_), (1, H), (1, H))]
        layer = sc.MoE(ctx, bufs[0], bufs[1], bufs[2], top_k=k, max_tokens=1)
        bx, bo = bufs[3], bufs[4]
        results.append(("safecuda.MoE.forward", batch_host_us(
            lambda: layer.forward(bx, bo, stream=s), s.synchronize)))
        layer.close()
        s.synchronize()
        for b in bufs:
            b.close()
        s.close()
    with torch.no_grad():
        results.append(("torch op (torch.ops.safecuda.moe)",
                        batch_host_us(lambda: op(x, layer_id), sync)))
        results.append(("torch layer impl (no dispatcher)",
                        batch_host_us(lambda: impl.run(x, False), sync)))
        results.append(("torch module (safecuda.torch.MoE)",
                        batch_host_us(lambda: module(x), sync)))
        module.use_dispatcher = True
        results.append(("torch module, use_dispatcher=True",
                        batch_host_us(lambda: module(x), sync)))
    module.close()
    print(f"\nhost time per call, T=1, E={E} k={k} H={H} I={I_} (median of 50 batches of 100 "
          f"back-to-back calls):")
    print(f"  {'path':<36} {'us/call':>9} {'vs C':>9}")
    for name, us in results:
        if us is None:
            print(f"  {name:<36} {'-':>9} {'':>9}  not measured: {c_why}")
            continue
        extra = f"{us - c_us:+.2f}" if c_us is not None and name != results[0][0] else ""
        print(f"  {name:<36} {us:9.2f} {extra:>9}")
        rows.append(("host", "small", 1, name, f"{us:.3f}", "us"))
    if c_us is not None:
        rows.append(("host", "small", 1, "C (sc_moe_forward)", f"{c_us:.3f}", "us"))

    # ---- part 2: device time against torch._grouped_mm ------------------------------------------
    has_grouped = hasattr(torch, "_grouped_mm")
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def event_ms(fn, x):
        ev0.record()
        fn(x)
        ev1.record()
        ev1.synchronize()
        return ev0.elapsed_time(ev1)

    def measure(fn, xs, T):
        reps = 20 if T <= 1024 else 10
        if args.quick:
            reps = max(1, reps // 2)
        t0 = time.monotonic()
        i = 0
        while i < WARM or time.monotonic() - t0 < WARM_S:
            fn(xs[i % len(xs)])
            torch.cuda.synchronize()
            i += 1
            if i > 1000:
                break
        return statistics.median(event_ms(fn, xs[r % len(xs)]) for r in range(reps))

    class SafecudaBlock(torch.nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.moe = moe

        def forward(self, x):
            return self.moe(x)

    class GroupedMoE(torch.nn.Module):
        """PyTorch's own grouped-GEMM MoE layer, the same function as safecuda's."""

        def __init__(self, router, w13, w2, k):
            super().__init__()
            self.router, self.k, self.E = router, k, router.shape[0]
            self.I = w2.shape[2]
            self.w13_t = w13.transpose(1, 2).contiguous()  # [E, H, 2I]
            self.w2_t = w2.transpose(1, 2).contiguous()    # [E, I, H]

        def forward(self, x):
            k, I_ = self.k, self.I
            scores = torch.softmax(F.linear(x, self.router).float(), dim=-1)
            w, ids = torch.topk(scores, k, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)
            flat = ids.view(-1)
            order = torch.argsort(flat, stable=True)
            tok = order // k
            offs = torch.cumsum(torch.bincount(flat, minlength=self.E), 0, dtype=torch.int32)
            xs = x.index_select(0, tok)
            h13 = torch._grouped_mm(xs, self.w13_t, offs=offs)
            h = F.silu(h13[:, :I_]) * h13[:, I_:]
            y = torch._grouped_mm(h, self.w2_t, offs=offs)
            y = y * w.view(-1)[order, None].to(y.dtype)
            return torch.zeros_like(x).index_add_(0, tok, y)

    table = []
    for name in configs:
        c = CONFIGS[name]
        E, k, H, I_ = c["E"], c["k"], c["H"], c["I"]
        print(f"\n{name}: E={E} k={k} H={H} I={I_}", flush=True)
        with torch.no_grad():
            router = torch.randn(E, H, device=dev, dtype=bf16) / math.sqrt(H)
            w13 = torch.randn(E, 2 * I_, H, device=dev, dtype=bf16) / math.sqrt(H)
            w2 = torch.randn(E, H, I_, device=dev, dtype=bf16) / math.sqrt(I_)
            ours = SafecudaBlock(sct.MoE(router, w13, w2, top_k=k, max_tokens=max(tokens)))
            peer = GroupedMoE(router, w13, w2, k) if has_grouped else None
            xc = torch.randn(64, H, device=dev, dtype=bf16)
            a = ours(xc).float()
            if peer is not None:
                try:
                    b = peer(xc).float()
                    rel = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
                    print(f"  check at T=64: relative L2 (safecuda vs grouped) = {rel:.2e}")
                    rows.append(("check", name, 64, "rel_l2_vs_grouped", f"{rel:.3e}", ""))
                except Exception as exc:  # noqa: BLE001 - the timing says it too
                    print(f"  check failed: {type(exc).__name__}: {str(exc)[:200]}")
            for T in tokens:
                xs = [torch.randn(T, H, device=dev, dtype=bf16)
                      for _ in range(4 if T <= 1024 else 1)]
                ms_ours = measure(ours, xs, T)
                ms_peer = math.nan
                if peer is not None:
                    try:
                        ms_peer = measure(peer, xs, T)
                    except Exception as exc:  # noqa: BLE001 - a shape it refuses: nan
                        print(f"  T={T}: _grouped_mm failed: {type(exc).__name__}: "
                              f"{str(exc)[:200]}")
                table.append((name, T, ms_ours, ms_peer))
                rows.append(("device", name, T, "safecuda", f"{ms_ours:.4f}", "ms"))
                rows.append(("device", name, T, "torch_grouped_mm", f"{ms_peer:.4f}", "ms"))
                print(f"  T={T:<5} safecuda {ms_ours:8.4f} ms   grouped_mm {ms_peer:8.4f} ms"
                      f"   ({ms_peer / ms_ours:.2f}x)", flush=True)
                del xs
            ours.moe.close()
            del ours, peer, router, w13, w2
            torch.cuda.empty_cache()

    print("\n==== bench_torch_moe summary")
    print(f"host us/call at T=1 (small layer): " + ", ".join(
        f"{n} {'-' if us is None else f'{us:.2f}'}" for n, us in results))
    if not has_grouped:
        print("torch._grouped_mm: missing in this torch (peer not measured)")
    print(f"{'config':<10} {'T':>6} {'safecuda ms':>12} {'grouped ms':>11} {'grouped/ours':>13}")
    for name, T, a, b in table:
        print(f"{name:<10} {T:>6} {a:12.4f} {b:11.4f} {b / a:13.2f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "bench_torch_moe.csv")
        with open(path, "w") as f:
            f.write("section,config,T,path,value,unit\n")
            for r in rows:
                f.write(",".join(str(v) for v in r) + "\n")
        print(f"csv: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
