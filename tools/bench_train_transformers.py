#!/usr/bin/env python3
"""The yardstick for `hearth bench-train`: LoRA SFT step speed and peak GPU memory with
transformers + peft, with and without gradient checkpointing, on the same model folder, random
tokens and sequence lengths (one warmup step, then timed steps of forward + backward + AdamW).

  python3 tools/bench_train_transformers.py --model DIR --seq-lens 2048 8192 16384 32768 [--steps 2]
      [--method sft|dpo|orpo] [--response-tokens 1024] [--no-plain]
Prints one line per (seq_len, checkpointing): tokens/s and peak GB, or OOM.

--method dpo|orpo: one preference pair per step, chosen and rejected each seq_len tokens (random ids,
the last --response-tokens of each scored), batched as two rows like `hearth train --method dpo|orpo`;
DPO's reference log-probs from the same model with the adapter disabled (peft's disable_adapter, no
grad), beta 0.1; ORPO: NLL of the chosen response + 0.1 * the odds-ratio term over length-normalised
log-probs. tokens/s counts both sequences' tokens (2 * seq_len per step).
"""
import argparse
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def response_logps(model, ids, R):
    """Sum and mean of the log-probs of the last R tokens of each row of ids [N, T]."""
    logits = model(input_ids=ids).logits[:, -R - 1:-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, -R:].unsqueeze(-1)).squeeze(-1)
    return lp.sum(-1), lp.mean(-1)


def preference_loss(model, ids, R, method):
    s, m = response_logps(model, ids, R)
    if method == "dpo":
        with torch.no_grad(), model.disable_adapter():
            rs, _ = response_logps(model, ids, R)
        margin = (s[0] - rs[0]) - (s[1] - rs[1])
        return -torch.nn.functional.logsigmoid(0.1 * margin)
    log_odds = (m[0] - m[1]) - (torch.log1p(-torch.exp(m[0])) - torch.log1p(-torch.exp(m[1])))
    return -m[0] - 0.1 * torch.nn.functional.logsigmoid(log_odds)


def cell(model_dir, T, ckpt, steps, rank, method="sft", R=1024):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, task_type="CAUSAL_LM"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(2, model.config.vocab_size, (1 if method == "sft" else 2, T), device="cuda")
    try:
        def step():
            loss = model(input_ids=ids, labels=ids).loss if method == "sft" else preference_loss(model, ids, R, method)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        n = T * steps * ids.shape[0]
        return f"{n / (time.perf_counter() - t0):9.1f}  {torch.cuda.max_memory_allocated() / 1e9:.3f}"
    except torch.cuda.OutOfMemoryError:
        return "OOM"
    finally:
        del model, opt
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--method", choices=["sft", "dpo", "orpo"], default="sft")
    ap.add_argument("--response-tokens", type=int, default=1024)
    ap.add_argument("--no-plain", action="store_true", help="only the gradient-checkpointing cells")
    a = ap.parse_args()
    print(f"seq_len  grad_ckpt  tokens/s   peak GB   (transformers + peft, bf16, sdpa, {a.method})")
    for T in a.seq_lens:
        for ckpt in ((True,) if a.no_plain else (False, True)):
            r = cell(a.model, T, ckpt, a.steps, a.lora_rank, a.method, a.response_tokens)
            print(f"{T:7d}  {str(ckpt):>9}  {r}", flush=True)


if __name__ == "__main__":
    main()
