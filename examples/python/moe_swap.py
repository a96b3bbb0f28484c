#!/usr/bin/env python3
"""moe_swap.py: swap safecuda's fused MoE layer into a PyTorch model.

A small transformer-style block whose feed-forward part is a Mixture-of-Experts written in
plain PyTorch (router, top-k, the experts in a loop, in float32) is run; then its MoE is
replaced by safecuda.torch.MoE over the very same weight tensors (no copy), and the block
runs again. The two outputs are compared (relative L2 difference; the safecuda layer
computes in bf16 with fp32 accumulation). Without a GPU or torch it says why and exits 2.

    pip install ./python && python3 examples/python/moe_swap.py
"""
import sys


def main():
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("moe_swap: this example needs PyTorch (pip install torch)")
        return 2
    if not torch.cuda.is_available():
        print("moe_swap: no GPU to run on (torch.cuda.is_available() is False)")
        return 2
    import safecuda.torch

    E, K, H, I = 16, 4, 1024, 512  # experts, top-k, hidden, intermediate (per expert)

    class TorchMoE(torch.nn.Module):
        """The reference: softmax routing, top-k, renormalized weights; each expert
        computes silu(x W1^T) * (x W3^T) then W2, with W1 and W3 stacked as w13."""

        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Linear(H, E, bias=False, dtype=torch.bfloat16)
            self.w13 = torch.nn.Parameter(torch.randn(E, 2 * I, H, dtype=torch.bfloat16) / H ** 0.5)
            self.w2 = torch.nn.Parameter(torch.randn(E, H, I, dtype=torch.bfloat16) / I ** 0.5)

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, H).float()
            scores = torch.softmax(x @ self.gate.weight.float().t(), dim=-1)
            weights, experts = torch.topk(scores, K, dim=-1)
            weights = weights / weights.sum(dim=-1, keepdim=True)
            out = torch.zeros_like(x)
            for e in experts.unique().tolist():
                token, slot = torch.where(experts == e)
                h = x[token] @ self.w13[e].float().t()
                y = (F.silu(h[:, :I]) * h[:, I:]) @ self.w2[e].float().t()
                out.index_add_(0, token, y * weights[token, slot, None])
            return out.to(torch.bfloat16).view(shape)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(H, dtype=torch.bfloat16)
            self.mlp = TorchMoE()

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    torch.manual_seed(0)
    with torch.no_grad():
        block = Block().cuda()
        x = torch.randn(4, 32, H, device="cuda", dtype=torch.bfloat16)  # batch 4, 32 tokens
        reference = block(x)

        old = block.mlp
        block.mlp = safecuda.torch.MoE(old.gate.weight, old.w13, old.w2, top_k=K,
                                       scoring="softmax", renormalize=True, max_tokens=128)
        print(block.mlp)
        swapped = block(x)

    diff = ((swapped.float() - reference.float()).norm() / reference.float().norm()).item()
    print(f"block output with the torch MoE vs with safecuda's: relative L2 difference {diff:.2e}")
    if diff > 1e-2:
        print("moe_swap: the outputs differ more than bf16 rounding explains")
        return 1
    print("moe_swap: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
