#!/usr/bin/env python3
"""Peer for bench_moe: the same Mixture-of-Experts layers measured with PyTorch.

bench_moe runs this once, before it allocates anything on the GPU, with the layer shapes
and token counts it will measure itself:

    torch_moe.py --specs NAME:E:K:H:I:SCORING:RENORM:BIAS[:KEY=VALUE...],... --tokens 1,16,...
                 [--inputs DIR] [--quick] [--budget SECONDS] [--fp8]

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
                  LIMIT, up to [-LIMIT, LIMIT], h = gate sigmoid(ALPHA gate) (up + 1))
    alpha=A, limit=L  swiglu_clamp's constants (default 1.702 and 7, gpt-oss's)
    layout=L      stacked (default: W13 rows 0..I-1 gate, I..2I-1 up) or interleaved (row
                  2i gate, 2i + 1 up; also of the W13 bias and the shared W13)
    ebias=1       random f32 biases on W13 ([E, 2I]) and W2 ([E, H]); w13bias=1 or
                  w2bias=1: on one of them only
    shared=IS     a shared expert of intermediate size IS every token uses
    sgate=1       its output scaled by sigmoid(x . gate row) (Qwen3-Next)
    maxT=N        measure only the token counts up to N (the others are not printed)

--inputs DIR: one layer, its weights and tokens read from DIR instead of made at random,
the files bench_moe --inputs reads (and --save-inputs writes; bench/bench_moe.c's header
describes them): layer.txt (key=value: top_k, scoring, renormalize, n_group, topk_group,
routed_scaling, activation, swiglu_alpha, swiglu_limit, w13_layout, shared_intermediate,
name, experts, hidden, intermediate), router.npy, w13.npy, w2.npy and the optional
selection_bias.npy, router_bias.npy, w13_bias.npy, w2_bias.npy, shared_w13.npy,
shared_w2.npy, shared_gate.npy (bf16 as '<u2', f32 as '<f4', C order), and the tokens
x.npy / x_*.npy [T, H] (every T a point, the files of one T in name order its inputs in
turn). Needs numpy. --specs may then be left out; when given (bench_moe gives its reading of
DIR), it must describe the same layer, else the script stops: the two readers disagree.
--tokens may be left out too (every T of the files).

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
next, unless --inputs gives them. Inputs are randn; up to 1024 tokens, four different
inputs are used in turn (as bench_moe does) so that the routing, and the experts read,
change between runs.

Timing: torch.cuda.Event around each forward, synchronized after each; warm-up forwards (at
least 3, and at least 0.1 s of them, as bench_moe does), then the median of 20 forwards
(T <= 1024), 10 (up to 16384) or 5 (from 32768); --quick halves the counts (at least 2). A
point whose first forward takes more than 0.5 s gets 3 timed forwards and no more warm-up.
A loop point estimated to take more than 2 s (the previous token count's time plus the
added expert FLOPs at a quarter of the measured matmul rate) is skipped (nan), as is every
point once --budget seconds have passed (a layer not started by then is not made at all),
and a point whose activations (estimated from its shape) would not fit in the GPU memory
left free: "# NAME T=N: loop skipped (needs about X GB, Y GB free)"; a point that runs out
of memory anyway is reported the same way and nan.

--fp8 (bench_moe --fp8): after each layer whose H, I and shared IS are multiples of 128,
the same layer with e4m3 experts, NAME-fp8, timed the same way (the same budget, skips and
repetitions): an expert loop of torch._scaled_mm and a torch._scaled_grouped_mm layer, with
ROWWISE scales (x and h per token, the weights per output channel), not 128 x 128 blocks;
and the e4m3 matmul rates. torch_moe_fp8.py beside this file describes them.

Output, one line per result:
    peer matmul_tflops <bf16 8192^3 matmul TFLOP/s, median of 10 after warm-up>
    peer copy_tbs <1 GiB device-to-device copy, (read + write bytes) / s in TB/s>
    peer matmul_f8_tflops <e4m3 8192^3 _scaled_mm TFLOP/s, use_fast_accum=False>  (--fp8)
    peer matmul_f8_fast_tflops <the same, use_fast_accum=True>                     (--fp8)
    peer <name> <T> <loop ms> <grouped ms>          ("nan" where not measured; --fp8 adds
                                                     the rows of <name>-fp8)
Lines starting with "#" are information. Exits non-zero, saying why, when torch or CUDA is
missing, or numpy with --inputs, or a file of --inputs is refused.
"""
import argparse
import copy
import math
import os
import statistics
import sys
import time

import _harness
import torch_moe_fp8 as fp8

SLOW_RUN_S = 0.5     # a forward slower than this: 3 timed runs, no more warm-up
SKIP_LOOP_S = 2.0    # loop points estimated slower than this are skipped
WARM = 3             # warm-up: at least WARM forwards and at least WARM_S seconds
WARM_S = 0.1
LOOP_EFFICIENCY = 0.25  # the loop's assumed share of the matmul rate, for its estimate
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's (safecuda's defaults)
ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_clamp")
BIG_T = 32768        # from this many tokens, 5 timed forwards
MEM_MARGIN = 1.25    # a point runs when its estimated bytes x this fit in the free memory
MAX_X = 16           # --inputs: token files per T


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
        self.rbias = self.b13 = self.b2 = self.sgate = self.interleaved = False
        self.act = "silu"
        self.alpha, self.limit = SWIGLU_ALPHA, SWIGLU_LIMIT
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
                elif key in ("alpha", "limit"):
                    v = float(val)
                    if not math.isfinite(v):
                        raise ValueError
                    if key == "alpha":
                        self.alpha = v or SWIGLU_ALPHA
                    else:
                        self.limit = v or SWIGLU_LIMIT
                elif key == "ebias":
                    self.b13 = self.b2 = val == "1"
                elif key == "w13bias":
                    self.b13 = val == "1"
                elif key == "w2bias":
                    self.b2 = val == "1"
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

    def key(self):
        """What the layer computes (the name and maxT aside)."""
        return (self.E, self.k, self.H, self.I, self.sigmoid, self.renorm, self.bias,
                self.n_group, self.topk_group, round(self.scale, 5), self.rbias, self.act,
                round(self.alpha, 5), round(self.limit, 5), self.interleaved, self.b13,
                self.b2, self.shared, self.sgate)

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
            if (self.alpha, self.limit) != (SWIGLU_ALPHA, SWIGLU_LIMIT):
                parts.append(f"alpha {self.alpha:g} limit {self.limit:g}")
        if self.interleaved:
            parts.append("W13 interleaved")
        if self.b13 or self.b2:
            parts.append("W13/W2 biases" if self.b13 and self.b2 else
                         "W13 bias" if self.b13 else "W2 bias")
        if self.shared:
            parts.append(f"shared {self.shared}" + (" gated" if self.sgate else ""))
        return ", ".join(parts)


# ---- --inputs: a layer's weights and tokens from .npy files ------------------------------

LAYER_KEYS = ("name", "top_k", "scoring", "renormalize", "n_group", "topk_group",
              "routed_scaling", "activation", "swiglu_alpha", "swiglu_limit", "w13_layout",
              "shared_intermediate", "experts", "hidden", "intermediate")

# file, Layer attribute, dtype, shape from (E, H, I, Is)
TENSORS = (
    ("router.npy", "router", "<u2", lambda E, H, I, Is: (E, H)),
    ("w13.npy", "w13", "<u2", lambda E, H, I, Is: (E, 2 * I, H)),
    ("w2.npy", "w2", "<u2", lambda E, H, I, Is: (E, H, I)),
    ("selection_bias.npy", "bias", "<f4", lambda E, H, I, Is: (E,)),
    ("router_bias.npy", "router_bias", "<f4", lambda E, H, I, Is: (E,)),
    ("w13_bias.npy", "b13", "<f4", lambda E, H, I, Is: (E, 2 * I)),
    ("w2_bias.npy", "b2", "<f4", lambda E, H, I, Is: (E, H)),
    ("shared_w13.npy", "sw13", "<u2", lambda E, H, I, Is: (2 * Is, H)),
    ("shared_w2.npy", "sw2", "<u2", lambda E, H, I, Is: (H, Is)),
    ("shared_gate.npy", "sgate", "<u2", lambda E, H, I, Is: (H,)),
)


class InputsError(Exception):
    """A file of --inputs refused (the message names it)."""


def read_layer_txt(path):
    """layer.txt's key=value lines, checked as bench_moe checks them."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except OSError as exc:
        raise InputsError(f"{path}: can't open: {exc.strerror}") from None
    cfg = {}

    def bad(n, msg):
        raise InputsError(f"{path}:{n}: {msg}")

    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, eq, val = line.partition("=")
        key, val = key.strip(), val.strip()
        if not eq:
            bad(n, f"'{line}' is not key=value")
        if key not in LAYER_KEYS:
            bad(n, f"unknown key '{key}'")
        if key in cfg:
            bad(n, f"{key} given twice")
        try:
            if key == "name":
                if not (0 < len(val) < 64 and all(c.isascii() and (c.isalnum() or c in "_-.")
                                                  for c in val)):
                    raise ValueError
                cfg[key] = val
            elif key in ("scoring", "activation", "w13_layout"):
                allowed = {"scoring": ("softmax", "sigmoid"), "activation": ACTIVATIONS,
                           "w13_layout": ("stacked", "interleaved")}[key]
                if val not in allowed:
                    raise ValueError
                cfg[key] = val
            elif key == "renormalize":
                if val not in ("0", "1", "true", "false", "True", "False"):
                    raise ValueError
                cfg[key] = val in ("1", "true", "True")
            elif key in ("routed_scaling", "swiglu_alpha", "swiglu_limit"):
                v = float(val)
                if not math.isfinite(v):
                    raise ValueError
                cfg[key] = v
            else:
                if not val.lstrip("-").isdigit():
                    raise ValueError
                cfg[key] = int(val)
        except ValueError:
            bad(n, f"bad value '{val}' for {key}")
    if "top_k" not in cfg:
        raise InputsError(f"{path}: top_k is required")
    return cfg


def load_npy(np, path, descr, shape=None):
    """A .npy file (memory-mapped) of descr and, when given, shape; C order."""
    if not os.path.exists(path):
        raise InputsError(f"{path}: can't open: no such file")
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - numpy's refusal, named
        raise InputsError(f"{path}: not read by numpy: {exc}") from None
    if isinstance(a, np.memmap) and os.path.getsize(path) != a.offset + a.nbytes:
        raise InputsError(f"{path}: {os.path.getsize(path)} bytes, but its header and shape "
                          f"make {a.offset + a.nbytes}")
    if a.dtype.str != descr:
        raise InputsError(f"{path}: dtype '{a.dtype.str}', expected '{descr}'" +
                          (" (bf16 as its uint16 bit patterns)" if descr == "<u2" else ""))
    if a.ndim > 1 and not a.flags.c_contiguous:
        raise InputsError(f"{path}: fortran_order is True: only C order is read")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise InputsError(f"{path}: holds {descr} {tuple(a.shape)}, expected {descr} "
                          f"{tuple(shape)}")
    return a


def load_inputs(np, directory):
    """(Spec, {attribute: array}, {T: [x arrays' paths]}) of an --inputs folder."""
    cfg = read_layer_txt(os.path.join(directory, "layer.txt"))
    name = cfg.get("name") or os.path.basename(os.path.normpath(directory))
    router = load_npy(np, os.path.join(directory, "router.npy"), "<u2")
    w13 = load_npy(np, os.path.join(directory, "w13.npy"), "<u2")
    if router.ndim != 2 or w13.ndim != 3 or w13.shape[1] % 2:
        raise InputsError(f"{directory}: router.npy must be [E, H] and w13.npy [E, 2I, H]")
    E, H = router.shape
    I = w13.shape[1] // 2
    for key, have in (("experts", E), ("hidden", H), ("intermediate", I)):
        if key in cfg and cfg[key] != have:
            raise InputsError(f"{directory}/layer.txt says {key}={cfg[key]}, the files hold "
                              f"E={E} H={H} I={I}")
    Is = cfg.get("shared_intermediate", 0)
    present = {f: os.path.exists(os.path.join(directory, f)) for f, *_ in TENSORS}
    if Is and not (present["shared_w13.npy"] and present["shared_w2.npy"]):
        raise InputsError(f"{directory}/layer.txt says shared_intermediate={Is}, but a shared "
                          "expert file is missing")
    if not Is and any(present[f] for f in ("shared_w13.npy", "shared_w2.npy",
                                           "shared_gate.npy")):
        raise InputsError(f"{directory}: a shared expert file is there, but layer.txt gives "
                          "no shared_intermediate")
    text = (f"{name}:{E}:{cfg['top_k']}:{H}:{I}:{cfg.get('scoring', 'softmax')}:"
            f"{int(cfg.get('renormalize', False))}:{int(present['selection_bias.npy'])}")
    if cfg.get("n_group", 0) or cfg.get("topk_group", 0):
        text += f":group={cfg.get('n_group', 0)}/{cfg.get('topk_group', 0)}"
    opts = {"scale": cfg.get("routed_scaling", 0.0), "alpha": cfg.get("swiglu_alpha", 0.0),
            "limit": cfg.get("swiglu_limit", 0.0)}
    text += "".join(f":{k}={v!r}" for k, v in opts.items() if v)
    text += ":rbias=1" if present["router_bias.npy"] else ""
    text += f":act={cfg.get('activation', 'silu')}"
    text += f":layout={cfg.get('w13_layout', 'stacked')}"
    text += ":w13bias=1" if present["w13_bias.npy"] else ""
    text += ":w2bias=1" if present["w2_bias.npy"] else ""
    text += f":shared={Is}" if Is else ""
    text += ":sgate=1" if present["shared_gate.npy"] else ""
    try:
        sp = Spec(text)
    except ValueError as exc:
        raise InputsError(f"{directory}: {exc}") from None
    arrays = {}
    for f, attr, descr, shape in TENSORS:
        if present[f]:
            arrays[attr] = load_npy(np, os.path.join(directory, f), descr, shape(E, H, I, Is))
    xs = {}
    for f in sorted(os.listdir(directory)):
        if f == "x.npy" or (f.startswith("x_") and f.endswith(".npy") and len(f) > 6):
            path = os.path.join(directory, f)
            a = load_npy(np, path, "<u2")
            if a.ndim != 2 or a.shape[1] != H or not 1 <= a.shape[0] <= 1 << 20:
                raise InputsError(f"{path}: holds <u2 {tuple(a.shape)}, expected tokens "
                                  f"[T, {H}]")
            xs.setdefault(int(a.shape[0]), []).append(path)
            if len(xs[int(a.shape[0])]) > MAX_X:
                raise InputsError(f"{directory}: more than {MAX_X} x files of T={a.shape[0]}")
    if not xs:
        raise InputsError(f"{directory} holds no x.npy or x_*.npy (the tokens, [T, H] '<u2')")
    return sp, arrays, xs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specs")
    ap.add_argument("--tokens")
    ap.add_argument("--inputs", metavar="DIR")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=240.0)
    ap.add_argument("--fp8", action="store_true")
    args = ap.parse_args()
    if args.fp8 and args.inputs:
        print("--fp8 is not with --inputs: the fp8 layers' weights are made here", file=sys.stderr)
        return 5
    t_start = time.monotonic()
    specs = [Spec(s) for s in (args.specs or "").split(",") if s]
    tokens = [int(t) for t in (args.tokens or "").split(",") if t]
    source = None  # --inputs: (numpy, {attribute: array}, {T: [x paths]})
    if args.inputs:
        try:
            import numpy as np
        except Exception as exc:  # noqa: BLE001 - any import failure means "no peer"
            print(f"numpy unavailable (needed by --inputs): {exc}", file=sys.stderr)
            return 4
        try:
            sp, arrays, xs = load_inputs(np, args.inputs)
        except InputsError as exc:
            print(f"--inputs: {exc}", file=sys.stderr)
            return 5
        if specs:  # bench_moe's reading of the folder: it must be this one
            if len(specs) != 1 or specs[0].key() != sp.key():
                print(f"--inputs: {args.inputs} reads as {sp.name}: {sp.describe()} "
                      f"{sp.key()} here, but --specs says {args.specs}", file=sys.stderr)
                return 5
            sp.name = specs[0].name
        missing = [T for T in tokens if T not in xs]
        if missing:
            print(f"--inputs: no x file of {args.inputs} has T={missing[0]} (they have T = "
                  f"{', '.join(str(T) for T in sorted(xs))})", file=sys.stderr)
            return 5
        tokens = tokens or sorted(xs)
        specs, source = [sp], (np, arrays, xs)
    elif not specs or not tokens:
        ap.error("--specs and --tokens are required without --inputs")

    torch, dev, status = _harness.open_device()
    if status:
        return status
    import torch.nn.functional as F

    torch.manual_seed(0x5AFEC0DA)
    has_grouped = hasattr(torch, "_grouped_mm")
    print(f"# {_harness.describe(torch, dev)}; _grouped_mm "
          f"{'available' if has_grouped else 'missing'}", flush=True)

    timer = _harness.EventTimer(torch)
    event_ms = timer.ms

    # ---- the machine's rates: bf16 matmul and device-to-device copy ----------------------
    with torch.no_grad():
        n = 8192
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        for _ in range(5):
            torch.mm(a, b, out=c)
        ms = timer.median_ms(lambda: torch.mm(a, b, out=c), 10)
        matmul_rate = 2.0 * n ** 3 / (ms * 1e-3)  # FLOP/s
        print(f"peer matmul_tflops {matmul_rate * 1e-12:.2f}", flush=True)
        del a, b, c
        nbytes = 1 << 30
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        for _ in range(2):
            dst.copy_(src)
        ms = timer.median_ms(lambda: dst.copy_(src), 10)
        print(f"peer copy_tbs {2.0 * nbytes / (ms * 1e-3) * 1e-12:.4f}", flush=True)
        del src, dst
        torch.cuda.empty_cache()

    fp8_why = fp8.unsupported(torch, dev) if args.fp8 else None
    has_scaled_grouped = hasattr(torch, "_scaled_grouped_mm")
    if args.fp8 and not fp8_why:
        try:
            with torch.no_grad():
                fp8.measure_rates(torch, dev, event_ms, statistics.median)
        except Exception as exc:  # noqa: BLE001 - no e4m3 GEMM here: no fp8 layers
            fp8_why = f"_scaled_mm failed: {type(exc).__name__}: {str(exc)[:200]}"
    if args.fp8:
        print("# fp8: " + (f"no fp8 layers ({fp8_why})" if fp8_why else
                           "NAME-fp8 layers: e4m3 weights, ROWWISE scales (x and h per token, "
                           "weights per output channel), not 128x128 blocks; loop of "
                           "_scaled_mm, grouped _scaled_grouped_mm " +
                           ("available" if has_scaled_grouped else "missing") +
                           "; use_fast_accum=False"), flush=True)

    def reps_for(T):
        r = 20 if T <= 1024 else 10 if T < BIG_T else 5
        return max(2, r // 2) if args.quick else r

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

    def run_spec(sp, layer_cls, bytes_fn, grouped_ok, why=None):
        """Measure one layer (or say why not) and print its rows."""
        toks = sp.tokens(tokens)
        loop_ms = {T: math.nan for T in toks}
        grouped_ms = {T: math.nan for T in toks}
        if why:
            print(f"# {sp.name}: skipped ({why})", flush=True)
        elif over_budget():
            print(f"# {sp.name}: skipped (peer time budget spent)", flush=True)
        else:
            try:
                with torch.no_grad():
                    run_layer(torch, F, sp, toks, dev, measure, over_budget, grouped_ok,
                              matmul_rate, loop_ms, grouped_ms, source, layer_cls, bytes_fn)
            except Exception as exc:  # noqa: BLE001 - report, print what was measured, go on
                msg = str(exc).replace("\n", " ")[:300]
                print(f"# {sp.name}: failed: {type(exc).__name__}: {msg}", flush=True)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        for T in toks:
            print(f"peer {sp.name} {T} {loop_ms[T]:.4f} {grouped_ms[T]:.4f}", flush=True)

    layer8 = fp8.layer_class(Layer) if args.fp8 else None
    for sp in specs:
        run_spec(sp, Layer, point_bytes, has_grouped)
        if not args.fp8:
            continue
        sp8 = copy.copy(sp)
        sp8.name = sp.name + fp8.SUFFIX
        if fp8.ineligible(sp):  # bench_moe has no such layer: no rows
            print(f"# {sp8.name}: none ({fp8.ineligible(sp)})", flush=True)
            continue
        run_spec(sp8, layer8, fp8.point_bytes, has_scaled_grouped, fp8_why)
    print(f"# done in {time.monotonic() - t_start:.1f} s", flush=True)
    return 0


def fill_from(torch, np, a, out):
    """Copy the array a (numpy, memory-mapped; bf16 as uint16 bits, or f32) into the tensor
    out of the same element count, a block of rows at a time (a 34 GB file needs no 34 GB
    of host memory)."""
    flat = out.view(-1, out.shape[-1]) if out.dim() > 1 else out.view(1, -1)
    src = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
    step = max(1, (64 << 20) // max(1, src.shape[1] * src.dtype.itemsize))
    for i in range(0, src.shape[0], step):
        part = np.array(src[i:i + step], copy=True)  # writable: torch.from_numpy wants it
        if part.dtype == np.uint16:
            t = torch.from_numpy(part.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(part)
        flat[i:i + step].copy_(t)


class Layer:
    """One layer's weights (random, or from --inputs) and its two torch implementations.

    The weights are made (or loaded) as a checkpoint holds them (W13 rows, their bias and
    the shared W13 in the spec's layout, biases f32); setup() then makes what the forwards
    use, once: interleaved rows stacked, bf16 copies of the biases. grouped_setup() makes
    the grouped layout and frees the loop's (the loop can't run after it)."""

    GROUPED = "_grouped_mm"  # the grouped layer's GEMM, for messages

    def __init__(self, torch, F, sp, dev, source=None):
        self.torch, self.F, self.sp = torch, F, sp
        E, H, I, Is = sp.E, sp.H, sp.I, sp.shared
        bf16, f32 = torch.bfloat16, torch.float32

        def randn(*shape, fan_in):
            if source is not None:  # filled from the files below
                return torch.empty(*shape, device=dev, dtype=bf16)
            return torch.randn(*shape, device=dev, dtype=bf16).mul_(1.0 / math.sqrt(fan_in))

        def uniform(*shape, half):
            if source is not None:
                return torch.empty(*shape, device=dev, dtype=f32)
            return (torch.rand(*shape, device=dev, dtype=f32) - 0.5) * (2 * half)

        self.router = randn(E, H, fan_in=H)
        self.w13 = randn(E, 2 * I, H, fan_in=H)
        self.w2 = randn(E, H, I, fan_in=I)
        self.bias = uniform(E, half=0.05) if sp.bias else None  # selection bias
        self.router_bias = uniform(E, half=0.1) if sp.rbias else None
        self.b13 = uniform(E, 2 * I, half=0.1) if sp.b13 else None
        self.b2 = uniform(E, H, half=0.1) if sp.b2 else None
        self.sw13 = randn(2 * Is, H, fan_in=H) if Is else None
        self.sw2 = randn(H, Is, fan_in=Is) if Is else None
        self.sgate = randn(1, H, fan_in=H) if sp.sgate else None
        self.b13b = self.b2b = None
        self.w13_t = self.w2_t = None
        if source is not None:  # the files' numbers (their shapes were checked)
            np, arrays, _ = source
            for attr, a in arrays.items():
                fill_from(torch, np, a, getattr(self, attr))

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
        if self.b2 is not None:
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
        limit = self.sp.limit
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return gate * self.torch.sigmoid(gate * self.sp.alpha) * (up + 1)

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
        biased = self.b13b is not None or self.b2b is not None
        expert = flat[order] if biased else None  # each row's expert
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


def point_bytes(sp, T, nx, grouped):
    """Estimated device bytes one point of T tokens allocates besides the weights: nx
    inputs, the routing, the shared expert, and the loop's or the grouped layer's
    activations (the loop's for one expert that got every token: its worst case)."""
    E, k, H, I, Is = sp.E, sp.k, sp.H, sp.I, sp.shared
    b = (nx + 2) * T * H * 2 + 6 * T * E * 4  # x, out, a sum; logits, scores, selection
    if Is:
        b += T * (4 * Is + H) * 2
    if grouped:
        rows = T * k  # x in expert order, h13, the activation's temporaries, h, y, y * w
        b += rows * (H + 2 * I + 2 * I + I + 2 * H) * 2 + rows * 8 * 4
    else:  # the one-hot mask and its reductions (int64), one expert's rows
        b += 2 * T * k * E * 8 + T * k * 8 * 4 + 2 * T * (3 * H + 3 * I) * 2
    return b


def is_oom(torch, exc):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc)


def run_layer(torch, F, sp, tokens, dev, measure, over_budget, has_grouped, matmul_rate,
              loop_ms, grouped_ms, source=None, layer_cls=None, bytes_fn=None):
    """Measure the layer's loop, then its grouped form (layer_cls: Layer or the fp8 layer;
    bytes_fn: its point_bytes)."""
    E, k, H, I, Is = sp.E, sp.k, sp.H, sp.I, sp.shared
    layer_cls, bytes_fn = layer_cls or Layer, bytes_fn or point_bytes
    t0 = time.monotonic()
    layer = layer_cls(torch, F, sp, dev, source)
    nbytes = layer.nbytes()
    layer.setup()
    torch.cuda.synchronize()
    print(f"# {sp.name}: E={E} k={k} H={H} I={I} ({sp.describe()}): weights "
          f"{nbytes / 1e9:.2f} GB {'read' if source else 'made'} in "
          f"{time.monotonic() - t0:.2f} s", flush=True)

    def n_inputs(T):
        return len(source[2][T]) if source else 4 if T <= 1024 else 1

    def inputs(T):
        if not source:
            return [torch.randn(T, H, device=dev, dtype=torch.bfloat16)
                    for _ in range(n_inputs(T))]
        np, xs = source[0], []
        for path in source[2][T]:
            x = torch.empty(T, H, device=dev, dtype=torch.bfloat16)
            fill_from(torch, np, np.load(path, mmap_mode="r", allow_pickle=False), x)
            xs.append(x)
        return xs

    def room(T, grouped, what):
        """Whether the point's estimated bytes fit in the free memory (else it says so)."""
        free = (torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev) -
                torch.cuda.memory_allocated(dev))
        need = bytes_fn(sp, T, n_inputs(T), grouped) * MEM_MARGIN
        if need <= free:
            return True
        print(f"# {sp.name} T={T}: {what} skipped (needs about {need / 1e9:.1f} GB, "
              f"{free / 1e9:.1f} GB free)", flush=True)
        return False

    def timed(fn, T, what):
        """measure(fn) on the point's inputs; nan (said why) when memory runs out."""
        xs = None
        try:
            xs = inputs(T)
            return measure(fn, xs, T)
        except Exception as exc:  # noqa: BLE001 - out of memory: reported, nan
            if not is_oom(torch, exc):
                raise
            print(f"# {sp.name} T={T}: {what} out of memory", flush=True)
            return math.nan
        finally:
            del xs
            torch.cuda.empty_cache()

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
        if not room(T, False, "loop"):
            continue
        loop_ms[T] = timed(layer.loop_forward, T, "loop")
        if not math.isnan(loop_ms[T]):
            prev = (T, loop_ms[T])

    if not has_grouped:
        return
    # The two torch layers must agree (same weights, same input): a check of the peer. The
    # loop's output first: grouped_setup frees the loop's weights.
    x = torch.randn(64, H, device=dev, dtype=torch.bfloat16)
    ref = layer.loop_forward(x).float()
    try:
        layer.grouped_setup()
    except Exception as exc:  # noqa: BLE001 - its layout does not fit: no grouped points
        if not is_oom(torch, exc):
            raise
        print(f"# {sp.name}: grouped skipped (the [E, H, 2I] copy of W13 does not fit)",
              flush=True)
        return
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
        if not room(T, True, "grouped"):
            continue
        try:
            grouped_ms[T] = timed(layer.grouped_forward, T, "grouped")
        except Exception as exc:  # noqa: BLE001 - a shape _grouped_mm refuses: nan
            msg = str(exc).replace("\n", " ")[:200]
            print(f"# {sp.name} T={T}: {layer.GROUPED} failed: {type(exc).__name__}: {msg}",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
