#!/usr/bin/env python3
"""Peer for bench_moe: the same Mixture-of-Experts layers measured with PyTorch.

bench_moe runs this once, before it allocates anything on the GPU, with the layer shapes
and token counts it will measure itself:

    torch_moe.py --specs NAME:E:K:H:I:SCORING:RENORM:BIAS[:KEY=VALUE...],... --tokens 1,16,...
                 [--quick] [--budget SECONDS]

SCORING is softmax or sigmoid; RENORM and BIAS are 0 or 1 (BIAS: a random f32 selection
bias per expert, added to the scores for the top-k choice only, DeepSeek-V3 style). The
optional KEY=VALUE fields are the v2 layer's (safecuda/moe.h), each absent meaning the v1
layer:
    group=G/K     group-limited selection: E/G experts per group, a group scored by the sum
                  of its two best selection scores, the experts of the K best groups only
                  (G = 1 means no limit)
    scale=S       the routing weights times S after the renormalization
    rbias=1       a random f32 router bias added to the logits (gpt-oss)
    act=A         silu (default), gelu_tanh or swiglu_clamp (gpt-oss: gate clamped above at
                  7, up to [-7, 7], h = gate sigmoid(1.702 gate) (up + 1))
    layout=L      stacked (default: W13 rows 0..I-1 gate, I..2I-1 up) or interleaved (row
                  2i gate, 2i + 1 up; also of the W13 bias and the shared W13)
    ebias=1       random f32 biases on W13 ([E, 2I]) and W2 ([E, H])
    shared=IS     a shared expert of intermediate size IS every token uses
    sgate=1       its output scaled by sigmoid(x . gate row) (Qwen3-Next)
    maxT=N        measure only the token counts up to N (the others are not printed)

Two layers, both bf16 on the GPU, with the same routing as safecuda's layer (router GEMM
plus router bias, softmax or sigmoid scores, the group limit, top-k by score + selection
bias, the chosen scores as weights, renormalized when asked, times the routed scaling):

  loop     the Hugging Face Mixtral / DeepSeek-V3 style: a one-hot expert mask, the experts
           that got tokens, and for each of them torch.where, index_select, one GEMM for
           gate+up (W13 [2I, H] stacked, plus its bias), the activation, the W2 GEMM (plus
           its bias), the routing weight, index_add_ into the output;
  grouped  torch._grouped_mm: tokens sorted by expert, int32 cumulative offsets, one grouped
           GEMM with W13 laid out [E, H, 2I] (made contiguous once, untimed), the W13 bias
           of each row's expert added, the activation, one grouped GEMM with W2 laid out
           [E, I, H], the W2 bias, the routing weight, index_add_ back.
  Both add the shared expert as dense matmuls over all tokens (W13 [2 IS, H], the
  activation, W2 [H, IS], times sigmoid(x . gate row) with sgate=1). Interleaved rows are
  made stacked once when the weights are made (untimed), so both split gate and up in
  halves; the f32 biases are used as bf16 copies made then too.

Before the grouped layer is timed, both layers run on one input of 64 tokens with the same
weights and their largest difference is printed as information (a check of the peer).

Weights are random (torch.randn * 1/sqrt(fan_in); biases uniform: selection bias in
[-0.05, 0.05), the others in [-0.1, 0.1)), made on the GPU per layer and freed before the
next. Inputs are randn; up to 1024 tokens, four different inputs are used in turn (as
bench_moe does) so that the routing, and the experts read, change between runs.

Timing: torch.cuda.Event around each forward, synchronized after each; warm-up forwards (at
least 3, and at least 0.1 s of them, as bench_moe does), then the median of 20 forwards
(T <= 1024) or 10 (more tokens); --quick halves the counts. A point whose first forward
takes more than 0.5 s gets 3 timed forwards and no more warm-up. A loop point estimated to
take more than 2 s (the previous token count's time plus the added expert FLOPs at a
quarter of the measured matmul rate) is skipped (nan), as is every point once --budget
seconds have passed (a layer not started by then is not made at all).

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
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's (safecuda's defaults)
ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_clamp")


class Spec:
    def __init__(self, text):
        f = text.split(":")
        if len(f) < 8:
            raise ValueError(f"bad spec '{text}'")
        self.name = f[0]
        self.E, self.k, self.H, self.I = (int(v) for v in f[1:5])
        if f[5] not in ("softmax", "sigmoid"):
            raise ValueError(f"bad scoring '{f[5]}'")
        self.sigmoid = f[5] == "sigmoid"
        self.renorm = f[6] == "1"
        self.bias = f[7] == "1"
        self.n_group = self.topk_group = 0
        self.scale = 1.0
        self.rbias = self.ebias = self.sgate = self.interleaved = False
        self.act = "silu"
        self.shared = 0
        self.max_t = 0
        for opt in f[8:]:
            key, eq, val = opt.partition("=")
            try:
                if not eq:
                    raise ValueError
                if key == "group":
                    g, _, tg = val.partition("/")
                    self.n_group, self.topk_group = int(g), int(tg)
                    if not (1 <= self.topk_group <= self.n_group and self.E % self.n_group == 0
                            and self.E // self.n_group >= 2):
                        raise ValueError
                elif key == "scale":
                    self.scale = float(val) or 1.0
                elif key == "rbias":
                    self.rbias = val == "1"
                elif key == "act":
                    if val not in ACTIVATIONS:
                        raise ValueError
                    self.act = val
                elif key == "layout":
                    if val not in ("stacked", "interleaved"):
                        raise ValueError
                    self.interleaved = val == "interleaved"
                elif key == "ebias":
                    self.ebias = val == "1"
                elif key == "shared":
                    self.shared = int(val)
                elif key == "sgate":
                    self.sgate = val == "1"
                elif key == "maxT":
                    self.max_t = int(val)
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(f"bad option '{opt}' in spec '{text}'") from None
        if self.sgate and not self.shared:
            raise ValueError(f"sgate without a shared expert in spec '{text}'")

    def tokens(self, tokens):
        """The token counts this layer is measured at."""
        return [T for T in tokens if not self.max_t or T <= self.max_t]

    def describe(self):
        parts = ["sigmoid" if self.sigmoid else "softmax"]
        if self.rbias:
            parts.append("router bias")
        if self.bias:
            parts.append("selection bias")
        if self.n_group > 1:
            parts.append(f"groups {self.topk_group} of {self.n_group}")
        if self.renorm:
            parts.append("renormalized")
        if self.scale != 1.0:
            parts.append(f"x{self.scale:g}")
        if self.act != "silu":
            parts.append(self.act)
        if self.interleaved:
            parts.append("W13 interleaved")
        if self.ebias:
            parts.append("W13/W2 biases")
        if self.shared:
            parts.append(f"shared {self.shared}" + (" gated" if self.sgate else ""))
        return ", ".join(parts)


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
        toks = sp.tokens(tokens)
        loop_ms = {T: math.nan for T in toks}
        grouped_ms = {T: math.nan for T in toks}
        if over_budget():
            print(f"# {sp.name}: skipped (peer time budget spent)", flush=True)
        else:
            try:
                with torch.no_grad():
                    run_layer(torch, F, sp, toks, dev, measure, over_budget, has_grouped,
                              matmul_rate, loop_ms, grouped_ms)
            except Exception as exc:  # noqa: BLE001 - report, print what was measured, go on
                msg = str(exc).replace("\n", " ")[:300]
                print(f"# {sp.name}: failed: {type(exc).__name__}: {msg}", flush=True)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        for T in toks:
            print(f"peer {sp.name} {T} {loop_ms[T]:.4f} {grouped_ms[T]:.4f}", flush=True)
    print(f"# done in {time.monotonic() - t_start:.1f} s", flush=True)
    return 0


class Layer:
    """One layer's random weights and its two torch implementations (loop, grouped).

    The weights are made as a checkpoint holds them (W13 rows, their bias and the shared
    W13 in the spec's layout, biases f32); setup() then makes what the forwards use, once:
    interleaved rows stacked, bf16 copies of the biases. grouped_setup() makes the grouped
    layout and frees the loop's (the loop can't run after it)."""

    def __init__(self, torch, F, sp, dev):
        self.torch, self.F, self.sp = torch, F, sp
        E, H, I, Is = sp.E, sp.H, sp.I, sp.shared
        bf16, f32 = torch.bfloat16, torch.float32

        def randn(*shape, fan_in):
            return torch.randn(*shape, device=dev, dtype=bf16).mul_(1.0 / math.sqrt(fan_in))

        def uniform(*shape, half):
            return (torch.rand(*shape, device=dev, dtype=f32) - 0.5) * (2 * half)

        self.router = randn(E, H, fan_in=H)
        self.w13 = randn(E, 2 * I, H, fan_in=H)
        self.w2 = randn(E, H, I, fan_in=I)
        self.bias = uniform(E, half=0.05) if sp.bias else None  # selection bias
        self.router_bias = uniform(E, half=0.1) if sp.rbias else None
        self.b13 = uniform(E, 2 * I, half=0.1) if sp.ebias else None
        self.b2 = uniform(E, H, half=0.1) if sp.ebias else None
        self.sw13 = randn(2 * Is, H, fan_in=H) if Is else None
        self.sw2 = randn(H, Is, fan_in=Is) if Is else None
        self.sgate = randn(1, H, fan_in=H) if sp.sgate else None
        self.b13b = self.b2b = None
        self.w13_t = self.w2_t = None

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (
            self.router, self.w13, self.w2, self.bias, self.router_bias, self.b13, self.b2,
            self.sw13, self.sw2, self.sgate) if t is not None)

    def setup(self):
        torch = self.torch
        if self.sp.interleaved:
            def stacked(w, dim):  # rows 0, 2, 4, ... (gate) then 1, 3, 5, ... (up)
                n = w.shape[dim]
                idx = torch.cat((torch.arange(0, n, 2, device=w.device),
                                 torch.arange(1, n, 2, device=w.device)))
                return w.index_select(dim, idx)
            self.w13 = stacked(self.w13, 1)
            if self.b13 is not None:
                self.b13 = stacked(self.b13, 1)
            if self.sw13 is not None:
                self.sw13 = stacked(self.sw13, 0)
        if self.b13 is not None:
            self.b13b = self.b13.to(torch.bfloat16)
            self.b2b = self.b2.to(torch.bfloat16)

    def grouped_setup(self):
        """W13 as [E, H, 2I], W2 as [E, I, H], contiguous; the loop's layout freed."""
        self.w13_t = self.w13.transpose(1, 2).contiguous()
        self.w13 = None
        self.w2_t = self.w2.transpose(1, 2).contiguous()
        self.w2 = None

    def route(self, x):
        """(weights f32 [T, k], expert ids int64 [T, k]) as safecuda's layer routes."""
        torch, F, sp = self.torch, self.F, self.sp
        logits = F.linear(x, self.router).float()
        if self.router_bias is not None:
            logits = logits + self.router_bias
        if sp.sigmoid:
            scores = torch.sigmoid(logits)
        else:
            scores = torch.softmax(logits, dim=-1)
        sel = scores + self.bias if self.bias is not None else scores
        if sp.n_group > 1:  # only the experts of the topk_group best groups
            g = sel.view(sel.shape[0], sp.n_group, -1)
            group_scores = g.topk(2, dim=-1).values.sum(dim=-1)
            keep = group_scores.topk(sp.topk_group, dim=-1).indices
            drop = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, keep, False)
            sel = g.masked_fill(drop.unsqueeze(-1), float("-inf")).view_as(scores)
        if sel is scores:
            w, ids = torch.topk(scores, sp.k, dim=-1)
        else:
            _, ids = torch.topk(sel, sp.k, dim=-1)
            w = scores.gather(1, ids)
        if sp.renorm:
            w = w / w.sum(dim=-1, keepdim=True)
        if sp.scale != 1.0:
            w = w * sp.scale
        return w, ids

    def act(self, gate, up):
        F = self.F
        if self.sp.act == "silu":
            return F.silu(gate) * up
        if self.sp.act == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        gate = gate.clamp(max=SWIGLU_LIMIT)
        up = up.clamp(min=-SWIGLU_LIMIT, max=SWIGLU_LIMIT)
        return gate * self.torch.sigmoid(gate * SWIGLU_ALPHA) * (up + 1)

    def shared(self, x):
        """The shared expert over all tokens (gated by sigmoid(x . gate row) if given)."""
        F, Is = self.F, self.sp.shared
        h = F.linear(x, self.sw13)
        y = F.linear(self.act(h[:, :Is], h[:, Is:]), self.sw2)
        if self.sgate is not None:
            y = y * self.torch.sigmoid(F.linear(x, self.sgate))
        return y

    def loop_forward(self, x):
        torch, F, E = self.torch, self.F, self.sp.E
        w, ids = self.route(x)
        w = w.to(x.dtype)
        out = torch.zeros_like(x)
        mask = F.one_hot(ids, num_classes=E).permute(2, 1, 0)  # [E, k, T]
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit.view(-1).tolist():
            slot, tok = torch.where(mask[e])
            xs = x.index_select(0, tok)
            b13 = self.b13b[e] if self.b13b is not None else None
            b2 = self.b2b[e] if self.b2b is not None else None
            gate, up = F.linear(xs, self.w13[e], b13).chunk(2, dim=-1)
            y = F.linear(self.act(gate, up), self.w2[e], b2)
            y = y * w[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        if self.sp.shared:
            out += self.shared(x)
        return out

    def grouped_forward(self, x):
        torch, sp = self.torch, self.sp
        E, k, I = sp.E, sp.k, sp.I
        w, ids = self.route(x)
        flat = ids.view(-1)
        order = torch.argsort(flat, stable=True)
        tok = order // k
        offs = torch.cumsum(torch.bincount(flat, minlength=E), 0, dtype=torch.int32)
        xs = x.index_select(0, tok)
        h13 = torch._grouped_mm(xs, self.w13_t, offs=offs)  # [T*k, 2I]
        expert = flat[order] if self.b13b is not None else None  # each row's expert
        if self.b13b is not None:
            h13.add_(self.b13b.index_select(0, expert))
        h = self.act(h13[:, :I], h13[:, I:])
        y = torch._grouped_mm(h, self.w2_t, offs=offs)  # [T*k, H]
        if self.b2b is not None:
            y.add_(self.b2b.index_select(0, expert))
        y = y * w.view(-1)[order, None].to(y.dtype)
        out = torch.zeros_like(x).index_add_(0, tok, y)
        if sp.shared:
            out += self.shared(x)
        return out


def run_layer(torch, F, sp, tokens, dev, measure, over_budget, has_grouped, matmul_rate,
              loop_ms, grouped_ms):
    E, k, H, I, Is = sp.E, sp.k, sp.H, sp.I, sp.shared
    t0 = time.monotonic()
    layer = Layer(torch, F, sp, dev)
    nbytes = layer.nbytes()
    layer.setup()
    torch.cuda.synchronize()
    print(f"# {sp.name}: E={E} k={k} H={H} I={I} ({sp.describe()}): weights "
          f"{nbytes / 1e9:.2f} GB made in {time.monotonic() - t0:.2f} s", flush=True)

    def inputs(T):
        n = 4 if T <= 1024 else 1
        return [torch.randn(T, H, device=dev, dtype=torch.bfloat16) for _ in range(n)]

    prev = None  # (T, ms) of the last loop point measured
    for T in tokens:
        if over_budget():
            print(f"# {sp.name} T={T}: loop skipped (peer time budget spent)", flush=True)
            continue
        if prev:
            added = 2.0 * (T - prev[0]) * (k * 3 * H * I + 3 * H * Is) / (
                matmul_rate * LOOP_EFFICIENCY)
            est_s = prev[1] * 1e-3 + max(0.0, added)
            if est_s > SKIP_LOOP_S:
                print(f"# {sp.name} T={T}: loop skipped (estimated {est_s:.1f} s)",
                      flush=True)
                continue
        xs = inputs(T)
        loop_ms[T] = measure(layer.loop_forward, xs, T)
        prev = (T, loop_ms[T])
        del xs

    if not has_grouped:
        return
    # The two torch layers must agree (same weights, same input): a check of the peer. The
    # loop's output first: grouped_setup frees the loop's weights.
    x = torch.randn(64, H, device=dev, dtype=torch.bfloat16)
    ref = layer.loop_forward(x).float()
    layer.grouped_setup()
    torch.cuda.empty_cache()
    try:
        got = layer.grouped_forward(x).float()
        err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        print(f"# {sp.name}: grouped vs loop at T=64: max |diff| / max |out| = {err:.2e}",
              flush=True)
        del got
    except Exception as exc:  # noqa: BLE001 - the timing below reports the failure
        print(f"# {sp.name}: grouped vs loop check failed: {type(exc).__name__}: "
              f"{str(exc)[:200]}", flush=True)
    del x, ref

    for T in tokens:
        if over_budget():
            print(f"# {sp.name} T={T}: grouped skipped (peer time budget spent)", flush=True)
            continue
        xs = inputs(T)
        try:
            grouped_ms[T] = measure(layer.grouped_forward, xs, T)
        except Exception as exc:  # noqa: BLE001 - a shape _grouped_mm refuses: nan
            msg = str(exc).replace("\n", " ")[:200]
            print(f"# {sp.name} T={T}: _grouped_mm failed: {type(exc).__name__}: {msg}",
                  flush=True)
        del xs


if __name__ == "__main__":
    sys.exit(main())
