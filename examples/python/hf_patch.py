#!/usr/bin/env python3
"""hf_patch.py: put safecuda's fused MoE layer into a Hugging Face transformers model.

A small Qwen3-MoE causal LM is built from its config (random weights: no download; with a
real checkpoint it is from_pretrained(..., dtype=torch.bfloat16, device_map="cuda")), run,
then every MoE block is replaced in place by a safecuda layer over the model's own weights
(safecuda.torch.patch_model), and the model runs again: the logits are compared, and the
patched model generates. unpatch_model puts the original blocks back. Without a GPU,
torch or transformers 5 it says why and exits 2.

    pip install ./python torch "transformers>=5" && python3 examples/python/hf_patch.py
"""
import sys


def main():
    try:
        import torch
        import transformers
    except ImportError as exc:
        print(f"hf_patch: this example needs PyTorch and transformers ({exc})")
        return 2
    if not torch.cuda.is_available():
        print("hf_patch: no GPU to run on (torch.cuda.is_available() is False)")
        return 2
    if int(transformers.__version__.split(".")[0]) < 5:
        print(f"hf_patch: transformers {transformers.__version__}; this needs transformers 5")
        return 2
    import safecuda.torch
    transformers.logging.set_verbosity_error()

    config = transformers.Qwen3MoeConfig(
        hidden_size=512, moe_intermediate_size=128, intermediate_size=1024, num_experts=64,
        num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.to(torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (2, 64), device="cuda")

    with torch.no_grad():  # the layer is forward-only
        before = model(ids).logits.float()
        report = safecuda.torch.patch_model(model)  # every MoE block, in place
        print(report)
        after = model(ids).logits.float()
        out = model.generate(ids[:1, :16], max_new_tokens=16, do_sample=False)

    diff = ((after - before).norm() / before.norm()).item()
    same = (after.argmax(-1) == before.argmax(-1)).float().mean().item()
    print(f"logits, patched vs original: relative L2 difference {diff:.2e}, top-1 the same "
          f"on {100 * same:.1f}% of tokens; generated {out.shape[1] - 16} tokens")
    safecuda.torch.unpatch_model(model)  # the original blocks back
    if len(report.patched) != config.num_hidden_layers or diff > 5e-2:
        print("hf_patch: the patched model differs more than bf16 rounding explains")
        return 1
    print("hf_patch: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
