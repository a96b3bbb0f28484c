"""safecuda.torch.Comm on 2 GPUs: two processes (torch.multiprocessing spawn, a gloo process
group for the id, NCCL_NVLS_ENABLE=0), Comm.from_process_group, all_reduce and all_to_all_v
on bf16 and f32 CUDA tensors against torch's own results (float64 on the CPU, and
torch.distributed over the same group); then safecuda.torch.MoE tensor parallel (tp_comm:
each rank its shard of I) against the one-GPU layer over the full weights on each rank's
GPU, all-reduced (every rank the whole output) and reduce-scattered (each rank its rows),
plain and accumulating: relative L2 <= 1e-2; safecuda.torch.MoE expert parallel (ep_comm:
each rank its experts, a listed map, and its own tokens) against the one-GPU layer on the
same tokens, normal and low-latency, with a step where one rank has none; and (with
transformers 5) from_transformers and patch_model with tp_comm on small Mixtral and DeepSeek-V3 models (hf_models.py, the same
random weights on both ranks): each block against the one-GPU layer (relative L2 <= 1e-2),
the patched model's logits against a float32 run of the original model no farther than the
original's own bf16 run or the one-GPU patched model (within 1.5x: a small random model
amplifies bf16 rounding, as in test_gpu_hf_patch.py), and patch_model with ep_comm (normal and low-latency; each rank its
own ids) likewise.

Not a test_gpu*.py file: the one-GPU check (scripts/gpu-check) collects it and it skips
there (fewer than 2 GPUs). scripts/gpu-check --gpus N runs it with
SAFECUDA_REQUIRE_GPUS=2, where a skip fails instead:
    SAFECUDA_REQUIRE_GPUS=2 python3 -m pytest python/tests/test_multigpu_comm_torch.py
"""

import os
import socket

import pytest

NRANKS = 2


def _skip(reason):
    if int(os.environ.get("SAFECUDA_REQUIRE_GPUS", "0") or 0) >= NRANKS:
        pytest.fail(f"SAFECUDA_REQUIRE_GPUS={os.environ['SAFECUDA_REQUIRE_GPUS']} but: "
                    f"{reason}", pytrace=False)
    pytest.skip(reason)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, errors):
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    import torch
    import torch.distributed as dist

    import safecuda.torch as sct
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=NRANKS)
        comm = sct.Comm.from_process_group(timeout_ms=120000)
        assert (comm.rank, comm.nranks) == (rank, NRANKS)
        assert comm.info().device == rank
        dev = torch.device("cuda", rank)
        g = torch.Generator().manual_seed(1234)  # every rank draws every rank's inputs
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
            # all_reduce: against the float64 sum of every rank's input
            inputs = [torch.randn(3, 1000, generator=g).to(dtype) for _ in range(NRANKS)]
            x = inputs[rank].to(dev)
            comm.all_reduce(x)
            want = sum(t.double() for t in inputs)
            torch.testing.assert_close(x.double().cpu(), want.to(dtype).double(), rtol=tol,
                                       atol=tol)
            # max, against torch.distributed's own over the same group (gloo: on the CPU)
            y = inputs[rank].to(dev)
            comm.all_reduce(y, op="max")
            ref = inputs[rank].float().clone()
            dist.all_reduce(ref, op=dist.ReduceOp.MAX)
            assert torch.equal(y.float().cpu(), ref)

            # all_to_all_v: rank s sends counts[s][d] rows of 64 to rank d
            counts = torch.randint(0, 7, (NRANKS, NRANKS), generator=g)
            counts[0, 1] = 0
            sends = [torch.randn(int(counts[s].sum()), 64, generator=g).to(dtype)
                     for s in range(NRANKS)]
            inp = sends[rank].to(dev)
            out = torch.full((int(counts[:, rank].sum()), 64), float("nan"), dtype=dtype,
                             device=dev)
            comm.all_to_all_v(out, inp, counts[:, rank].tolist(), counts[rank].tolist())
            parts = []
            for s in range(NRANKS):
                off = int(counts[s, :rank].sum())
                parts.append(sends[s][off:off + int(counts[s, rank])])
            assert torch.equal(out.cpu(), torch.cat(parts))
            # and torch.distributed's all_to_all_single over the same group, on the CPU
            ref = torch.empty(out.shape, dtype=torch.float32)
            dist.all_to_all_single(ref, sends[rank].float(), counts[:, rank].tolist(),
                                   counts[rank].tolist())
            assert torch.equal(out.float().cpu(), ref)
        _tp_moe(rank, comm, dev)
        _ep_moe(rank, comm, dev)
        _tp_transformers(rank, comm, dev)
        comm.synchronize()
        comm.close()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        import traceback
        errors.put(f"rank {rank}: {exc!r}\n{traceback.format_exc()}")


def _tp_moe(rank, comm, dev):
    """The tensor-parallel layer over this rank's shard against the full layer."""
    import torch

    import safecuda.torch as sct
    E, k, H, I_, T = 8, 2, 256, 512, 64
    g = torch.Generator().manual_seed(99)  # the same full weights and x on every rank
    router = (torch.randn(E, H, generator=g) / H ** 0.5).to(torch.bfloat16).to(dev)
    w13 = (torch.randn(E, 2 * I_, H, generator=g) / H ** 0.5).to(torch.bfloat16).to(dev)
    w2 = (torch.randn(E, H, I_, generator=g) / I_ ** 0.5).to(torch.bfloat16).to(dev)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).to(dev)
    res = torch.randn(T, H, generator=g).to(torch.bfloat16).to(dev)
    full = sct.MoE(router, w13, w2, top_k=k)
    want = full(x).float()
    want_acc = full(x, accumulate_into=res.clone()).float()
    sh = I_ // NRANKS  # the checkpoints' split: gate rows, up rows, w2 columns of the rank
    w13_r = torch.cat([w13[:, rank * sh:(rank + 1) * sh],
                       w13[:, I_ + rank * sh:I_ + (rank + 1) * sh]], dim=1).contiguous()
    w2_r = w2[:, :, rank * sh:(rank + 1) * sh].contiguous()

    def rel(a, b):
        return float((a.float() - b).norm() / b.norm())

    for output in ("all_reduce", "reduce_scatter"):
        tp = sct.MoE(router, w13_r, w2_r, top_k=k, tp_comm=comm, tp_output=output)
        rows = slice(None) if output == "all_reduce" else \
            slice(rank * T // NRANKS, (rank + 1) * T // NRANKS)
        got = tp(x)
        assert tuple(got.shape) == tuple(want[rows].shape), (output, got.shape)
        assert rel(got, want[rows]) <= 1e-2, (output, rel(got, want[rows]))
        acc = res[rows].clone()
        tp(x, accumulate_into=acc)
        assert rel(acc, want_acc[rows]) <= 1e-2, (output, "accumulate", rel(acc, want_acc[rows]))
        torch.cuda.synchronize(dev)
        del tp


def _ep_moe(rank, comm, dev):
    """The expert-parallel layer (this rank's experts, its own tokens) against the full
    layer on the same tokens, normal and low-latency, and a step where rank 1 has none."""
    import torch

    import safecuda.torch as sct
    E, k, H, I_ = 8, 2, 256, 512
    g = torch.Generator().manual_seed(77)  # the same full weights on every rank
    router = (torch.randn(E, H, generator=g) / H ** 0.5).to(torch.bfloat16).to(dev)
    w13 = (torch.randn(E, 2 * I_, H, generator=g) / H ** 0.5).to(torch.bfloat16).to(dev)
    w2 = (torch.randn(E, H, I_, generator=g) / I_ ** 0.5).to(torch.bfloat16).to(dev)
    sw13 = (torch.randn(2 * I_, H, generator=g) / H ** 0.5).to(torch.bfloat16).to(dev)
    sw2 = (torch.randn(H, I_, generator=g) / I_ ** 0.5).to(torch.bfloat16).to(dev)
    full = sct.MoE(router, w13, w2, top_k=k, shared_w13=sw13, shared_w2=sw2)
    kw = sct.shard_for_ep(dict(router_weight=router, w13=w13, w2=w2, shared_w13=sw13,
                               shared_w2=sw2), rank, NRANKS, [e % NRANKS for e in range(E)])
    r_, w13_r, w2_r = kw.pop("router_weight"), kw.pop("w13"), kw.pop("w2")

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    mine = torch.Generator().manual_seed(500 + rank)  # each rank its own tokens
    for mode, max_t in (("normal", 0), ("low_latency", 64)):
        ep = sct.MoE(r_, w13_r, w2_r, top_k=k, ep_comm=comm, ep_mode=mode,
                     ep_max_tokens=max_t, **kw)
        for T in (37 + rank, 0 if rank == 1 else 5):
            x = torch.randn(T, H, generator=mine).to(torch.bfloat16).to(dev)
            got = ep(x)
            assert tuple(got.shape) == (T, H)
            if T:
                want = full(x)
                assert rel(got, want) <= 1e-2, (mode, T, rel(got, want))
        torch.cuda.synchronize(dev)
        del ep


def _tp_transformers(rank, comm, dev):
    """patch_model / from_transformers with tp_comm against the one-GPU layer."""
    import sys

    import torch
    try:
        import transformers
    except ImportError:
        return  # (the parent reports transformers missing)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hf_models import build_model, float32_copy

    import safecuda.torch as sct
    transformers.logging.set_verbosity_error()

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    for name in ("mixtral", "deepseek_v3"):
        model, cfg = build_model(torch, transformers, name, device=dev, seed=5)
        ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(6)).to(dev)
        mine = (ids + rank) % cfg.vocab_size  # (the expert-parallel part's own ids)
        with torch.no_grad():
            # Whole-model logits are judged as the one-GPU tests judge them (random small
            # models amplify bf16 noise: a routing near-tie flips after a rounding change):
            # against a float32 run of the original, no farther than the original's own
            # bf16 run or the one-GPU patched model (within 1.5x).
            ref32 = float32_copy(torch, model)
            want32 = {"ids": ref32(ids).logits, "mine": ref32(mine).logits}
            del ref32
            own = {"ids": model(ids).logits, "mine": model(mine).logits}

            plan = sct.patch_model(model)
            one = {"ids": model(ids).logits, "mine": model(mine).logits}

            def close(got, key, what):
                # as close as the original's bf16 run or the one-GPU patched model (whose
                # own fidelity is test_gpu_hf_patch.py's)
                e_own, e_one = rel(own[key], want32[key]), rel(one[key], want32[key])
                e_got = rel(got, want32[key])
                assert e_got <= 1.5 * max(e_own, e_one) + 1e-3, (
                    f"{name}: {what}: relative L2 {e_got:.3g} from float32; the bf16 "
                    f"original's {e_own:.3g}, the one-GPU patched model's {e_one:.3g}; "
                    f"{rel(got, one[key]):.3g} from the one-GPU patched model's")

            blocks = [m for m in model.modules() if isinstance(m, sct.TransformersMoE)]
            x = torch.randn(48, cfg.hidden_size, generator=torch.Generator().manual_seed(8)
                            ).to(torch.bfloat16).to(dev)
            singles = [b(x) for b in blocks]
            singles = [s[0] if isinstance(s, tuple) else s for s in singles]
            for b, want in zip(blocks, singles):
                tp = sct.from_transformers(b.hf_block, tp_comm=comm)
                got = tp(x)
                got = got[0] if isinstance(got, tuple) else got
                assert rel(got, want) <= 1e-2, (name, "block", rel(got, want))
                del tp
            sct.unpatch_model(model)
            report = sct.patch_model(model, tp_comm=comm)
            assert len(report.patched) == len(plan.patched) > 0, (name, str(report))
            # the rank's shards are copies, fewer bytes than the whole experts
            whole = plan.borrowed_bytes + plan.copied_bytes
            assert 0 < report.copied_bytes < whole, (name, str(report), str(plan))
            close(model(ids).logits, "ids", "tensor-parallel logits")
            sct.unpatch_model(model)
            # expert parallel: each rank its experts and its own inputs (here rank r's ids
            # shifted by r)
            for mode in ("normal", "low_latency"):
                report = sct.patch_model(model, ep_comm=comm, ep_mode=mode,
                                         ep_max_tokens=64 if mode == "low_latency" else 0)
                assert len(report.patched) == len(plan.patched), (name, str(report))
                assert 0 < report.copied_bytes < whole, (name, mode, str(report), str(plan))
                close(model(mine).logits, "mine", f"expert-parallel ({mode}) logits")
                sct.unpatch_model(model)
        torch.cuda.synchronize(dev)
        del model


@pytest.mark.gpu
def test_comm_from_process_group_on_two_gpus():
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as exc:
        _skip(f"torch is not installed ({exc})")
    if not torch.cuda.is_available() or torch.cuda.device_count() < NRANKS:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        _skip(f"needs {NRANKS} GPUs; torch sees {n}")
    import torch.distributed as dist
    if not dist.is_available():
        _skip("torch.distributed is not available in this torch")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    mp.spawn(_worker, args=(_free_port(), errors), nprocs=NRANKS, join=True)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
