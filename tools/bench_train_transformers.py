#!/usr/bin/env python3
"""The yardstick for `hearth bench-train`: LoRA SFT step speed and peak GPU memory with
transformers + peft, with and without gradient checkpointing, on the same model folder, random
tokens and sequence lengths (one warmup step, then timed steps of forward + backward + AdamW).

  python3 tools/bench_train_transformers.py --model DIR --seq-lens 2048 8192 16384 32768 [--steps 2]
Prints one line per (seq_len, checkpointing): tokens/s and peak GB, or OOM.
"""
import argparse
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def cell(model_dir, T, ckpt, steps, rank):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, task_type="CAUSAL_LM"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(2, model.config.vocab_size, (1, T), device="cuda")
    try:
        def step():
            loss = model(input_ids=ids, labels=ids).loss
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
        return f"{T * steps / (time.perf_counter() - t0):9.1f}  {torch.cuda.max_memory_allocated() / 1e9:.3f}"
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
    a = ap.parse_args()
    print("seq_len  grad_ckpt  tokens/s   peak GB   (transformers + peft, bf16, sdpa)")
    for T in a.seq_lens:
        for ckpt in (False, True):
            print(f"{T:7d}  {str(ckpt):>9}  {cell(a.model, T, ckpt, a.steps, a.lora_rank)}", flush=True)


if __name__ == "__main__":
    main()
