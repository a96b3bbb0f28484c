#!/usr/bin/env python3
"""bench_hf: transformers MoE models, as transformers runs them and patched with safecuda.

    python3 bench/bench_hf.py [--out DIR] [--quick] [--models mixtral,qwen3_30b_a3b,...]
                              [--impls eager,grouped_mm,batched_mm] [--batches 1,16,64]
                              [--prefill 4096] [--prefix 512] [--vocab 32000]
                              [--dry-run]

Needs torch with CUDA, transformers 5, the safecuda package (pip install ./python) and a
GPU; exits 77 saying why when one is missing.

Models: Mixtral-8x7B-, Qwen3-30B-A3B-, OLMoE-1B-7B-, gpt-oss-20b- and DeepSeek-V3-shaped
causal LMs built from their config classes with the real hidden and expert sizes, expert
counts, top-k, routing, shared experts and attention shapes, but 2 decoder layers (DeepSeek-V3:
1, an MoE layer, first_k_dense_replace=0: its 256 experts of 7168 x 2048 are 22 GiB a
layer in bf16) and a vocabulary of --vocab tokens (default 32000; 0: the model's own: the
LM head is a fixed cost outside the MoE layers that a 2-layer model would overweight). All
bf16 on the GPU, random weights (N(0, 1/fan_in), drawn on the GPU; transformers' own
initialization skipped), no download. gpt-oss's experts are bf16 (the checkpoint's MXFP4 is
not used).

Each model runs under each of transformers' experts implementations (--impls, default every
one registered: "eager" (a loop over the experts hit), "grouped_mm" (torch._grouped_mm,
transformers' default), "batched_mm" (the selected experts' weights gathered per token, a
bmm: what generate() switches to for decoding), and "deepgemm" / "sonicmoe" where their
`kernels` packages load), then patched (safecuda.torch.patch_model, max_tokens = the
prefill, release_originals=True):

- prefill: one eager forward of --prefill tokens (default 4096) at batch 1, no cache, the
  LM head on the last token only (logits_to_keep=1);
- decode: one step of batch B (--batches, default 1, 16, 64): one token per sequence
  against a static cache of --prefix positions (default 512; the cache's contents do not
  change the work), replayed as a CUDA graph (torch.cuda.CUDAGraph captured after 3 warm-up
  steps on a side stream; torch.tensor(<Python numbers>, device=<GPU>) in the step, a
  pageable host-to-device copy that a capture refuses, gives a device tensor made in the
  warm-up: gpt-oss's eager attention masks and its full sliding-window cache do that);
  "eager" can't be captured (it reads which experts were hit on the host) and runs without
  a graph. batched_mm is skipped where the weights it gathers would not fit (it needs
  tokens x top-k x the size of one expert).

Time: CUDA events around each forward (graph replay), after warm-up (prefill 1, decode 5;
the same on the MoE blocks), the median of 5 prefills / 50 decode steps (--quick: 2 / 20).
The MoE layers' time: each MoE block run alone on the hidden states it got in the step
(captured by a forward hook), all blocks in one CUDA graph for decode, eager for prefill;
their share is that over the step's time. Before timing, the patched model's logits on a
32-token prompt are compared with the original's (grouped_mm; relative L2 printed). The
speedup is the fastest transformers path's time over the patched model's, of the step and
of the MoE layers alone; the goal is a patched decode step at batch 1 at least 2x faster
than the fastest transformers path, on every model.

--dry-run: tiny sizes on the CPU, the transformers paths only, no graphs (a check of the
script itself: its times mean nothing). A full run takes about 3-4 minutes on an H100
(--quick about half).

Output: a table per model and a summary; with --out DIR, DIR/bench_hf.csv with the columns
model,phase,batch,tokens,path,step_ms,moe_ms,moe_share,note and the summary's rows
(path "speedup": step_ms and moe_ms hold the speedups, note the fastest transformers path).
"""
import argparse
import math
import os
import statistics
import sys
import time

# model id: (config class, options, decoder layers, real vocabulary, what it is)
MODELS = {
    "mixtral": ("MixtralConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6),
        2, 32000, "Mixtral-8x7B: E=8 k=2 H=4096 I=14336, GQA 32/8"),
    "qwen3_30b_a3b": ("Qwen3MoeConfig", dict(
        hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, decoder_sparse_step=1, mlp_only_layers=[]),
        2, 151936, "Qwen3-30B-A3B: E=128 k=8 H=2048 I=768, GQA 32/4"),
    "olmoe": ("OlmoeConfig", dict(
        hidden_size=2048, intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
        num_attention_heads=16, num_key_value_heads=16),
        2, 50304, "OLMoE-1B-7B: E=64 k=8 H=2048 I=1024, MHA 16"),
    "gpt_oss_20b": ("GptOssConfig", dict(
        hidden_size=2880, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"]),
        2, 201088, "gpt-oss-20b: E=32 k=4 H=2880 I=2880 (bf16 experts), GQA 64/8, sinks"),
    "deepseek_v3": ("DeepseekV3Config", dict(
        hidden_size=7168, moe_intermediate_size=2048, intermediate_size=18432,
        n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4,
        routed_scaling_factor=2.5, n_shared_experts=1, first_k_dense_replace=0,
        num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, head_dim=64),
        1, 129280, "DeepSeek-V3: E=256 k=8 (8 groups, 4 kept) H=7168 I=2048 + 1 shared, MLA"),
}
# --dry-run: the same families at tiny sizes (CPU).
TINY = dict(hidden_size=256, intermediate_size=128, moe_intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64)
TINY_MLA = dict(q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
                v_head_dim=32, head_dim=32, num_key_value_heads=4, intermediate_size=512)
TINY_EXPERTS = 16
GRAPHABLE_NOT = {"eager"}  # reads on the host which experts were hit


def skip(why):
    print(f"bench_hf: skipped: {why}", flush=True)
    sys.exit(77)


def csv_list(s, conv=str):
    return [conv(v) for v in s.split(",") if v]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Exit status 77: torch, transformers 5, CUDA or the safecuda package missing.")
    ap.add_argument("--out", help="write DIR/bench_hf.csv")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    ap.add_argument("--impls", help="transformers experts implementations (default: every "
                    "registered one, and eager)")
    ap.add_argument("--batches", default="1,16,64", help="decode batch sizes (default 1,16,64)")
    ap.add_argument("--prefill", type=int, default=4096, help="prefill tokens (default 4096)")
    ap.add_argument("--prefix", type=int, default=512,
                    help="decode: the cached positions before the step (default 512)")
    ap.add_argument("--vocab", type=int, default=32000,
                    help="vocabulary size (default 32000; 0: each model's own)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny models on the CPU, transformers' paths only, no graphs")
    a = ap.parse_args(argv)
    a.models = csv_list(a.models)
    for m in a.models:
        if m not in MODELS:
            ap.error(f"unknown model {m} (have {', '.join(MODELS)})")
    try:
        a.batches = csv_list(a.batches, int)
    except ValueError:
        ap.error(f"--batches {a.batches}: comma-separated integers")
    if not a.batches or min(a.batches) < 1 or a.prefill < 1 or a.prefix < 0 or a.vocab < 0:
        ap.error("--batches, --prefill must be positive, --prefix and --vocab not negative")
    a.impls = csv_list(a.impls) if a.impls else None
    if a.dry_run:
        a.prefill, a.prefix = min(a.prefill, 64), min(a.prefix, 16)
        a.batches = [min(b, 4) for b in a.batches]
        a.vocab = min(a.vocab or 512, 512)
    a.batches = sorted(set(a.batches))
    a.reps_prefill, a.reps_decode = (2, 20) if a.quick or a.dry_run else (5, 50)
    return a


# ---- building ------------------------------------------------------------------------------


def build_model(torch, transformers, name, args, dev):
    """(model, config): the model in bf16 on dev, eval mode, random weights."""
    from transformers.initialization import no_init_weights
    cls, opts, layers, vocab, _ = MODELS[name]
    opts = dict(opts, num_hidden_layers=layers, vocab_size=args.vocab or vocab,
                max_position_embeddings=max(args.prefill, args.prefix + 1, 4096),
                tie_word_embeddings=False)
    if args.dry_run:
        opts.update(TINY)
        if "kv_lora_rank" in opts:
            opts.update(TINY_MLA)
        for k in ("num_local_experts", "num_experts", "n_routed_experts"):
            if k in opts:
                opts[k] = min(opts[k], TINY_EXPERTS)
        if "n_group" in opts:
            opts.update(n_group=4, topk_group=2)
        opts["num_experts_per_tok"] = min(opts["num_experts_per_tok"], 4)
    cfg = getattr(transformers, cls)(**opts)
    with torch.device(dev), no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    init_weights(torch, model)
    return model.eval(), cfg


def init_weights(torch, model):
    """N(0, 1/fan_in) matrices (the experts' fan-in per their layout), norms 1, biases
    N(0, 0.02^2), DeepSeek's selection biases U[0, 0.25), gpt-oss's sinks N(0, 1)."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(0x5AFE)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            leaf = name.rsplit(".", 1)[-1]
            if "inv_freq" in leaf or not t.dtype.is_floating_point:
                continue
            if leaf == "e_score_correction_bias":
                t.uniform_(0.0, 0.25, generator=g)
            elif t.dim() >= 2:
                owner = model.get_submodule(name.rsplit(".", 1)[0])
                fan_in = t.shape[-2] if getattr(owner, "is_transposed", False) else t.shape[-1]
                t.normal_(0.0, fan_in ** -0.5, generator=g)
            elif "norm" in name:
                t.fill_(1.0)
            elif leaf == "sinks":
                t.normal_(0.0, 1.0, generator=g)
            else:
                t.normal_(0.0, 0.02, generator=g)


def moe_blocks(model):
    """The decoder layers' MoE blocks (each layer's mlp)."""
    return [layer.mlp for layer in model.model.layers]


def experts_geometry(cfg):
    """(top-k, bytes of one expert's weights in bf16)."""
    H = cfg.hidden_size
    inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    return cfg.num_experts_per_tok, 3 * H * inter * 2


# ---- timing --------------------------------------------------------------------------------


class Timer:
    def __init__(self, torch, dev):
        self.torch, self.cuda = torch, dev.type == "cuda"

    def ms(self, fn, warm, reps):
        """Median of reps timings of fn() (CUDA events; on the CPU, wall time)."""
        torch = self.torch
        for _ in range(warm):
            fn()
        if self.cuda:
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(reps):
            if self.cuda:
                e0.record()
                fn()
                e1.record()
                e1.synchronize()
                out.append(e0.elapsed_time(e1))
            else:
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)


# (data, dtype, device) -> the device tensor torch.tensor(data, ...) made in a warm-up; kept
# for the process's life (a graph that reads one may outlive its capture).
HOST_CONSTANTS = {}


def py_data_key(x):
    """x (a Python bool/int/float or a short nested list/tuple of them) as a hashable key that
    tells 0.0 from -0.0 and 1 from 1.0 and True; None for anything else."""
    if isinstance(x, (bool, int, float)):
        return (type(x).__name__, repr(x))
    if isinstance(x, (list, tuple)) and len(x) <= 64:
        keys = [py_data_key(v) for v in x]
        return None if None in keys else (type(x).__name__, tuple(keys))
    return None


def host_constants(torch):
    """A torch function mode for capture(): torch.tensor(Python numbers, device=<not the
    CPU>) returns the device tensor made by the first such call (in a warm-up, outside the
    graph) instead of copying from pageable host memory, which a capturing stream refuses
    ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU
    tensor is pinned"). transformers 5's gpt-oss decode step makes three: eager_mask's
    torch.tensor(0.0, device=mask.device) for each of its two masks (masking_utils) and,
    once the sliding window is full, StaticSlidingWindowLayer.update's
    torch.tensor([-1], device=self.device) (cache_utils); both only read them (a torch.where
    operand, an index), as a compiled graph would read a constant. The other models' steps
    make none: their graphs are unchanged."""
    from torch.overrides import TorchFunctionMode

    class HostConstants(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            dev = kwargs.get("device")
            if func is torch.tensor and len(args) == 1 and dev is not None and \
                    torch.device(dev).type != "cpu" and not kwargs.get("requires_grad") and \
                    not kwargs.get("pin_memory"):
                data = py_data_key(args[0])
                if data is not None:
                    key = (data, str(kwargs.get("dtype")), str(torch.device(dev)))
                    t = HOST_CONSTANTS.get(key)
                    if t is None:  # a warm-up call; in a capture this fails as before
                        t = HOST_CONSTANTS[key] = func(*args, **kwargs)
                    return t
            return func(*args, **kwargs)

    return HostConstants()


def capture(torch, fn):
    """A CUDA graph of fn() (after 3 warm-up calls on a side stream): (graph, its output).
    The warm-up calls and the captured one run under host_constants()."""
    consts = host_constants(torch)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            with consts:
                fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with consts:
            out = fn()
    torch.cuda.synchronize()
    return g, out


def block_inputs(torch, blocks, fn):
    """The hidden states each block got in one call of fn (copies)."""
    seen = {}
    hooks = [b.register_forward_hook(
        lambda m, i, o, j=j: seen.__setitem__(j, i[0].detach().clone()))
        for j, b in enumerate(blocks)]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return [seen[j] for j in range(len(blocks))]


def run_blocks(blocks, xs):
    for b, x in zip(blocks, xs):
        b(x)


class Runner:
    """Prefill and decode measurements of one model (original or patched)."""

    def __init__(self, torch, transformers, model, args, dev):
        self.torch, self.tf, self.model, self.args, self.dev = torch, transformers, model, \
            args, dev
        self.timer = Timer(torch, dev)
        g = torch.Generator(device=dev).manual_seed(7)
        V = model.config.vocab_size
        self.prompt = torch.randint(0, V, (1, args.prefill), device=dev, generator=g)
        self.tokens = {B: torch.randint(0, V, (B, 1), device=dev, generator=g)
                       for B in args.batches}

    def prefill(self, blocks):
        """(step ms, MoE ms)."""
        torch, model, a = self.torch, self.model, self.args

        def step():
            return model(input_ids=self.prompt, use_cache=False, logits_to_keep=1).logits

        step_ms = self.timer.ms(step, 1, a.reps_prefill)
        xs = block_inputs(torch, blocks, step)
        moe_ms = self.timer.ms(lambda: run_blocks(blocks, xs), 1, a.reps_prefill)
        return step_ms, moe_ms

    def decode(self, blocks, B, graph):
        """(step ms, MoE ms) of one decode step of batch B; graph: as a CUDA graph."""
        torch, model, a = self.torch, self.model, self.args
        P = a.prefix
        cache = self.tf.StaticCache(config=model.config, max_cache_len=P + 1)
        ids = self.tokens[B]
        cpos = torch.full((1,), P, dtype=torch.long, device=self.dev)
        pos = torch.full((B, 1), P, dtype=torch.long, device=self.dev)

        def rewind():
            # transformers' static layers count what they hold (a device tensor, and for a
            # sliding window also a Python int): back to P positions, so that every step
            # (and every replay of a graph of it) writes position P.
            for layer in cache.layers:
                if hasattr(layer, "cumulative_length_int"):
                    layer.cumulative_length_int = P
                if getattr(layer, "is_initialized", False) and \
                        torch.is_tensor(getattr(layer, "cumulative_length", None)):
                    layer.cumulative_length.fill_(P)

        def step():
            rewind()
            return model(input_ids=ids, past_key_values=cache, cache_position=cpos,
                         position_ids=pos, use_cache=True).logits

        step()  # the cache's tensors exist from here
        xs = block_inputs(torch, blocks, step)
        if not graph:
            return (self.timer.ms(step, 5, a.reps_decode),
                    self.timer.ms(lambda: run_blocks(blocks, xs), 5, a.reps_decode))
        g, _ = capture(torch, step)
        step_ms = self.timer.ms(g.replay, 5, a.reps_decode)
        del g
        g, _ = capture(torch, lambda: run_blocks(blocks, xs))
        moe_ms = self.timer.ms(g.replay, 5, a.reps_decode)
        del g, cache
        return step_ms, moe_ms


# ---- one model ------------------------------------------------------------------------------


def available_impls(transformers, args):
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    have = ["eager"] + sorted(ALL_EXPERTS_FUNCTIONS.keys())
    want = args.impls or have
    bad = [i for i in want if i not in have]
    if bad:
        sys.exit(f"bench_hf: --impls {','.join(bad)}: transformers {transformers.__version__} "
                 f"has {', '.join(have)}")
    return want


def impl_unusable(transformers, impl):
    """Why transformers' experts implementation impl can't run here, or None."""
    if impl in ("deepgemm", "sonicmoe"):
        from transformers.utils.import_utils import is_kernels_available
        if not is_kernels_available():
            return "needs the kernels package (not installed)"
    return None


def bench_model(torch, transformers, sct, name, args, dev, rows, summary):
    cls, _, layers, _, what = MODELS[name]
    torch.manual_seed(0)
    t0 = time.monotonic()
    model, cfg = build_model(torch, transformers, name, args, dev)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"\n== {name} ({what}; {layers} decoder layer{'s' if layers > 1 else ''}, vocab "
          f"{cfg.vocab_size}): {nparams / 1e9:.2f} B parameters, built in "
          f"{time.monotonic() - t0:.1f} s", flush=True)
    run = Runner(torch, transformers, model, args, dev)
    k, expert_bytes = experts_geometry(cfg)
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else 1 << 40
    results = []  # (phase, B, path, step_ms, moe_ms, note)

    def record(phase, B, path, fn, note=""):
        try:
            with torch.no_grad():
                s, m = fn()
        except Exception as exc:  # noqa: BLE001 - a path that fails here is reported as such
            if dev.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            print(f"  {phase:<7} B={B:<3} {path:<12} failed: {why}", flush=True)
            results.append((phase, B, path, math.nan, math.nan, f"failed: {why}"))
            return
        print(f"  {phase:<7} B={B:<3} {path:<12} step {s:9.3f} ms   MoE {m:9.3f} ms "
              f"({100 * m / s:5.1f}%){'   ' + note if note else ''}", flush=True)
        results.append((phase, B, path, s, m, note))

    def skipped(phase, B, path, why):
        print(f"  {phase:<7} B={B:<3} {path:<12} skipped: {why}", flush=True)
        results.append((phase, B, path, math.nan, math.nan, f"skipped: {why}"))

    blocks = moe_blocks(model)
    check_ids = run.prompt[:, :32]
    ref_logits, ref_impl = None, None
    for impl in available_impls(transformers, args):
        why = impl_unusable(transformers, impl)
        if why:
            skipped("all", 0, impl, why)
            continue
        try:
            model.set_experts_implementation(impl)
        except Exception as exc:  # noqa: BLE001
            skipped("all", 0, impl, f"{type(exc).__name__}: {str(exc)[:160]}")
            continue
        if impl == "grouped_mm" or ref_logits is None:
            with torch.no_grad():
                ref_logits, ref_impl = model(check_ids).logits.float(), impl
        graph = dev.type == "cuda" and impl not in GRAPHABLE_NOT
        gather = expert_bytes * k
        if impl == "batched_mm" and gather * args.prefill > 0.6 * free:
            skipped("prefill", 1, impl, f"would gather {gather * args.prefill / 2**30:.0f} GiB "
                    f"of expert weights")
        else:
            record("prefill", 1, impl, lambda: run.prefill(blocks))
        for B in args.batches:
            if impl == "batched_mm" and gather * B > 0.6 * free:
                skipped("decode", B, impl, f"would gather {gather * B / 2**30:.0f} GiB of "
                        f"expert weights")
                continue
            record("decode", B, impl, lambda: run.decode(blocks, B, graph),
                   "" if graph else "no CUDA graph")
    if sct is not None:
        model.set_experts_implementation("grouped_mm")
        report = sct.patch_model(model, max_tokens=max(args.prefill, max(args.batches)),
                                 release_originals=True)
        print(f"  {str(report).splitlines()[0]}")
        blocks = moe_blocks(model)
        with torch.no_grad():
            got = model(check_ids).logits.float()
        rel = ((got - ref_logits).norm() / ref_logits.norm()).item()
        print(f"  check: the patched model's logits on 32 tokens vs the original's "
              f"({ref_impl}): relative L2 {rel:.2e}", flush=True)
        results.append(("check", 1, "safecuda", math.nan, math.nan,
                        f"logits relative L2 vs {ref_impl} {rel:.3e}"))
        record("prefill", 1, "safecuda", lambda: run.prefill(blocks))
        for B in args.batches:
            record("decode", B, "safecuda", lambda: run.decode(blocks, B, dev.type == "cuda"))
        sct.unpatch_model(model)
    print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)

    for phase, B, path, s, m, note in results:
        rows.append((name, phase, B, args.prefill if phase == "prefill" else B, path,
                     s, m, m / s if s == s and s else math.nan, note))
    for phase, B in [("prefill", 1)] + [("decode", B) for B in args.batches]:
        hf = [(s, m, p) for ph, b, p, s, m, _ in results
              if ph == phase and b == B and p != "safecuda" and s == s]
        ours = [(s, m) for ph, b, p, s, m, _ in results
                if ph == phase and b == B and p == "safecuda" and s == s]
        if not hf:
            continue
        fs, fm, fp = min(hf)
        best_moe = min(m for _, m, _ in hf)
        s, m = ours[0] if ours else (math.nan, math.nan)
        summary.append((name, phase, B, fp, fs, fm, s, m, fs / s, best_moe / m))
    del model, blocks, run
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def fmt(v, spec="9.3f"):
    return format(v, spec) if v == v else format("-", ">" + spec.split(".")[0])


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never wait on the network for a kernel
    try:
        import torch
    except ImportError as exc:
        skip(f"torch is not installed ({exc})")
    try:
        import transformers
    except ImportError as exc:
        skip(f"transformers is not installed ({exc}): pip install 'transformers>=5'")
    if int(transformers.__version__.split(".")[0]) < 5:
        skip(f"transformers {transformers.__version__}; this benchmark needs transformers 5")
    transformers.logging.set_verbosity_error()
    sct = None
    if args.dry_run:
        dev = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            skip("torch.cuda.is_available() is False")
        try:
            import safecuda as sc
            import safecuda.torch as sct
        except ImportError as exc:
            skip(f"the safecuda package is not importable ({exc}): pip install ./python")
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        print(f"bench_hf: {torch.cuda.get_device_name(dev)}; torch {torch.__version__} "
              f"(CUDA {torch.version.cuda}); transformers {transformers.__version__}; safecuda "
              f"{sc.version()}", flush=True)
    print(f"prefill {args.prefill} tokens (eager); decode batches "
          f"{','.join(map(str, args.batches))} at {args.prefix} cached positions (CUDA graphs); "
          f"medians of {args.reps_prefill} / {args.reps_decode}"
          f"{'; DRY RUN: tiny models on the CPU' if args.dry_run else ''}", flush=True)
    rows, summary = [], []
    t0 = time.monotonic()
    for name in args.models:
        bench_model(torch, transformers, sct, name, args, dev, rows, summary)

    print(f"\n==== bench_hf summary ({time.monotonic() - t0:.0f} s): fastest transformers path "
          f"vs patched (safecuda)")
    print(f"{'model':<14} {'phase':<8} {'B':>3} {'fastest hf':<11} {'hf ms':>9} "
          f"{'hf MoE%':>8} {'ours ms':>9} {'our MoE%':>8} {'step x':>7} {'MoE x':>7}")
    for name, phase, B, fp, fs, fm, s, m, sx, mx in summary:
        print(f"{name:<14} {phase:<8} {B:>3} {fp:<11} {fmt(fs)} {fmt(100 * fm / fs, '8.1f')} "
              f"{fmt(s)} {fmt(100 * m / s, '8.1f')} {fmt(sx, '7.2f')} {fmt(mx, '7.2f')}")
        rows.append((name, phase, B, args.prefill if phase == "prefill" else B, "speedup",
                     sx, mx, math.nan, f"fastest transformers path {fp}"))
    goal = [(n, sx) for n, ph, B, _, _, _, _, _, sx, _ in summary if ph == "decode" and B == 1]
    if goal and sct is not None:
        met = all(sx >= 2.0 for _, sx in goal)
        print(f"goal (patched decode step at batch 1 >= 2x the fastest transformers path): "
              f"{'met' if met else 'NOT met'} (" +
              ", ".join(f"{n} {fmt(sx, '.2f')}x" for n, sx in goal) + ")")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "bench_hf.csv")
        with open(path, "w") as f:
            f.write("model,phase,batch,tokens,path,step_ms,moe_ms,moe_share,note\n")
            for r in rows:
                vals = [f"{v:.5g}" if isinstance(v, float) else str(v) for v in r]
                vals[-1] = '"' + vals[-1].replace('"', "'") + '"'
                f.write(",".join(vals) + "\n")
        print(f"csv: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
