"""The fp8 layers of bench_moe's torch peer (torch_moe.py --fp8).

bench_moe --fp8 runs each layer whose H, I and shared I are multiples of 128 twice: bf16,
and with e4m3 experts and 128 x 128 block scales (the layer NAME-fp8). With --fp8 the peer
times the same layers in fp8 the best way torch offers without custom kernels, and prints
their rows as "peer NAME-fp8 T <loop ms> <grouped ms>":

  rates    "peer matmul_f8_tflops R": torch._scaled_mm of two e4m3 8192 x 8192 matrices
           (per-tensor f32 scales, out bf16, use_fast_accum=False; the median of 10 after
           warm-up), the e4m3 rate of bench_moe's fp8 floor; "peer matmul_f8_fast_tflops R"
           the same with use_fast_accum=True (reported only).
  loop     the bf16 expert loop with each expert's two GEMMs as torch._scaled_mm: the rows
           of x that chose the expert (and then h) quantized per row (amax / 448, e4m3), the
           weight scaled per output channel;
  grouped  torch._scaled_grouped_mm (its 2D x 3D form with int32 offsets): x in expert order
           and h quantized per row, W13 [E, 2I, H] and W2 [E, H, I] as the e4m3 checkpoint
           holds them (the transposed [E, H, 2I] / [E, I, H] views the function takes, no
           copy), scaled per expert per output channel; out bf16, use_fast_accum=False.
  Both compute the routing as the bf16 layers do (bf16 router), the shared expert with
  torch._scaled_mm the same way, the gate row and biases in bf16.

Scaling: torch 2.11's fp8 GEMMs take per-tensor or per-row (rowwise) f32 scales, so the peer
scales x and h per token (row) and the weights per output channel: ROWWISE scaling, not
safecuda's (and the DeepSeek-V3 / Kimi K2 checkpoints') 128 x 128 weight blocks and
128-channel activation blocks. The weights are random e4m3 (torch.randn x 64, |v| < 448)
with per-row scales around 1 / (64 sqrt(fan-in)), so that the dequantized weights have the
bf16 layers' spread. The quantization of x and h is part of each timed forward (as it is
in safecuda's layer).
"""
import math

SUFFIX = "-fp8"
FP8_MAX = 448.0
BLOCK = 128  # bench_moe's fp8 layers: one scale per 128 x 128 block of a weight


def ineligible(sp):
    """Why the layer has no fp8 twin in bench_moe (None: it has one)."""
    if sp.H % BLOCK or sp.I % BLOCK or sp.shared % BLOCK:
        dims = f"H={sp.H}, I={sp.I}" + (f", I_s={sp.shared}" if sp.shared else "")
        return f"{dims}: not all multiples of {BLOCK} (no fp8 layer in bench_moe)"
    return None


def unsupported(torch, dev):
    """Why this torch or device can't run the fp8 layers (None: it can)."""
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn or _scaled_mm"
    cc = torch.cuda.get_device_capability(dev)
    if cc < (8, 9):
        return f"e4m3 GEMMs need compute capability 8.9 or newer; this device is {cc[0]}.{cc[1]}"
    return None


def measure_rates(torch, dev, event_ms, median):
    """Print the e4m3 matmul rates (TFLOP/s): use_fast_accum False, then True."""
    n = 8192
    f8 = torch.float8_e4m3fn
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16).to(f8)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16).to(f8)  # [N, K]: b.t() col-major
    one = torch.ones((), device=dev, dtype=torch.float32)
    for fast, key in ((False, "matmul_f8_tflops"), (True, "matmul_f8_fast_tflops")):
        def mm():
            return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                    out_dtype=torch.bfloat16, use_fast_accum=fast)
        for _ in range(5):
            mm()
        ms = median(event_ms(mm) for _ in range(10))
        print(f"peer {key} {2.0 * n ** 3 / (ms * 1e-3) * 1e-12:.2f}", flush=True)
    del a, b
    torch.cuda.empty_cache()


def quant_rows(torch, x):
    """x [M, K] -> (e4m3 [M, K], f32 scales [M, 1]): per row, scale = amax / 448."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp_(min=1e-12)
    q = (x * (FP8_MAX / amax)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, amax / FP8_MAX


def point_bytes(sp, T, nx, grouped):
    """As torch_moe.point_bytes, for the fp8 layers: x, out, the routing, the shared expert,
    and the activations with their quantization's temporaries (|x| in bf16, x times 448 /
    amax in f32, the e4m3 copy)."""
    E, k, H, I, Is = sp.E, sp.k, sp.H, sp.I, sp.shared
    b = (nx + 2) * T * H * 2 + 6 * T * E * 4
    if Is:
        b += T * (7 * H + 4 * Is * 2 + 7 * Is)
    if grouped:
        rows = T * k  # x in expert order and its quantization, h13, the activation, h and
        b += rows * (9 * H + 4 * H + 4 * I + 4 * I + 2 * I + 7 * I) + rows * 8 * 4  # its, y
    else:
        b += 2 * T * k * E * 8 + T * k * 8 * 4 + 2 * T * (3 * H + 3 * I) * 2 + T * 7 * (H + I)
    return b


def e4m3_matrices(torch, dev, n, rows, cols, fan_in):
    """n matrices [rows, cols] of e4m3 values, N(0, 1) x 64 rounded, and per-row f32 scales
    1 / (64 sqrt(fan_in)) x U[0.75, 1.25) ([n, rows]); made a few at a time."""
    w = torch.empty(n, rows, cols, device=dev, dtype=torch.float8_e4m3fn)
    step = max(1, (512 << 20) // (rows * cols * 2))
    for i in range(0, n, step):
        j = min(n, i + step)
        w[i:j] = (torch.randn(j - i, rows, cols, device=dev, dtype=torch.bfloat16)
                  .mul_(64.0).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))
    s = (torch.rand(n, rows, device=dev, dtype=torch.float32) * 0.5 + 0.75) / (
        64.0 * math.sqrt(fan_in))
    return w, s


def layer_class(Layer):
    """The fp8 layer: torch_moe.Layer's routing, activation and interface (setup,
    grouped_setup, loop_forward, grouped_forward, nbytes) over e4m3 experts."""

    class Layer8(Layer):
        GROUPED = "_scaled_grouped_mm"

        def __init__(self, torch, F, sp, dev, source=None):  # noqa: D107 - see the class
            if source is not None:
                raise ValueError("the fp8 layers take no --inputs")
            self.torch, self.F, self.sp = torch, F, sp
            E, H, I, Is = sp.E, sp.H, sp.I, sp.shared
            bf16, f32 = torch.bfloat16, torch.float32

            def uniform(*shape, half):
                return (torch.rand(*shape, device=dev, dtype=f32) - 0.5) * (2 * half)

            self.router = torch.randn(E, H, device=dev, dtype=bf16).mul_(1.0 / math.sqrt(H))
            self.w13, self.s13 = e4m3_matrices(torch, dev, E, 2 * I, H, H)
            self.w2, self.s2 = e4m3_matrices(torch, dev, E, H, I, I)
            self.bias = uniform(E, half=0.05) if sp.bias else None
            self.router_bias = uniform(E, half=0.1) if sp.rbias else None
            self.b13 = uniform(E, 2 * I, half=0.1) if sp.b13 else None
            self.b2 = uniform(E, H, half=0.1) if sp.b2 else None
            self.sw13 = self.sw2 = self.ss13 = self.ss2 = self.sgate = None
            if Is:
                sw13, ss13 = e4m3_matrices(torch, dev, 1, 2 * Is, H, H)
                sw2, ss2 = e4m3_matrices(torch, dev, 1, H, Is, I)
                self.sw13, self.ss13, self.sw2, self.ss2 = sw13[0], ss13[0], sw2[0], ss2[0]
                if sp.sgate:
                    self.sgate = torch.randn(1, H, device=dev, dtype=bf16).mul_(
                        1.0 / math.sqrt(H))
            self.b13b = self.b2b = None

        def nbytes(self):
            return sum(t.numel() * t.element_size() for t in (
                self.router, self.w13, self.s13, self.w2, self.s2, self.bias, self.router_bias,
                self.b13, self.b2, self.sw13, self.ss13, self.sw2, self.ss2, self.sgate)
                if t is not None)

        def setup(self):
            torch = self.torch
            if self.sp.interleaved:  # rows 0, 2, 4, ... (gate) then 1, 3, 5, ... (up)
                def stacked(w, dim):
                    n = w.shape[dim]
                    idx = torch.cat((torch.arange(0, n, 2, device=w.device),
                                     torch.arange(1, n, 2, device=w.device)))
                    if w.dtype == torch.float8_e4m3fn:  # index_select on the bytes
                        return w.view(torch.uint8).index_select(dim, idx).view(w.dtype)
                    return w.index_select(dim, idx)
                self.w13, self.s13 = stacked(self.w13, 1), stacked(self.s13, 1)
                if self.b13 is not None:
                    self.b13 = stacked(self.b13, 1)
                if self.sw13 is not None:
                    self.sw13, self.ss13 = stacked(self.sw13, 0), stacked(self.ss13, 0)
            if self.b13 is not None:
                self.b13b = self.b13.to(torch.bfloat16)
            if self.b2 is not None:
                self.b2b = self.b2.to(torch.bfloat16)

        def grouped_setup(self):
            """Nothing: _scaled_grouped_mm takes the checkpoint's layout transposed."""

        def mm(self, a, w8, ws):
            """a [M, K] bf16 quantized per row, times w8 [N, K] e4m3 scaled per row (ws [N])."""
            torch = self.torch
            q, s = quant_rows(torch, a)
            return torch._scaled_mm(q, w8.t(), scale_a=s, scale_b=ws.view(1, -1),
                                    out_dtype=torch.bfloat16, use_fast_accum=False)

        def gmm(self, a, w8, ws, offs):
            """The grouped form: a [rows, K] in expert order, w8 [E, N, K], ws [E, N]."""
            torch = self.torch
            q, s = quant_rows(torch, a)
            s = s.view(-1)
            rows = q.shape[0]
            pad = rows == self.sp.E  # a scale of E values could read as one per group: a
            if pad:                  # row past the last offset makes it a row's, unambiguous
                pad_row = torch.zeros(1, q.shape[1], device=q.device, dtype=torch.bfloat16)
                q = torch.cat((q, pad_row.to(q.dtype)))
                s = torch.cat((s, torch.ones_like(s[:1])))
            out = torch._scaled_grouped_mm(q, w8.transpose(-2, -1), s, ws, offs=offs,
                                           out_dtype=torch.bfloat16, use_fast_accum=False)
            return out[:rows] if pad else out

        def shared(self, x):
            Is = self.sp.shared
            h = self.mm(x, self.sw13, self.ss13)
            y = self.mm(self.act(h[:, :Is], h[:, Is:]), self.sw2, self.ss2)
            if self.sgate is not None:
                y = y * self.torch.sigmoid(self.F.linear(x, self.sgate))
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
                h13 = self.mm(xs, self.w13[e], self.s13[e])
                if self.b13b is not None:
                    h13 = h13 + self.b13b[e]
                gate, up = h13.chunk(2, dim=-1)
                y = self.mm(self.act(gate, up), self.w2[e], self.s2[e])
                if self.b2b is not None:
                    y = y + self.b2b[e]
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
            h13 = self.gmm(xs, self.w13, self.s13, offs)  # [T*k, 2I]
            biased = self.b13b is not None or self.b2b is not None
            expert = flat[order] if biased else None
            if self.b13b is not None:
                h13.add_(self.b13b.index_select(0, expert))
            h = self.act(h13[:, :I], h13[:, I:])
            y = self.gmm(h, self.w2, self.s2, offs)  # [T*k, H]
            if self.b2b is not None:
                y.add_(self.b2b.index_select(0, expert))
            y = y * w.view(-1)[order, None].to(y.dtype)
            out = torch.zeros_like(x).index_add_(0, tok, y)
            if sp.shared:
                out += self.shared(x)
            return out

    return Layer8
