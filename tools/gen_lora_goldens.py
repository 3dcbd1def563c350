#!/usr/bin/env python3
"""LoRA / full fine-tuning gradient goldens from transformers + peft (CPU, fp32).

For each tiny model in tests/golden/models/<variant> (made by gen_tiny_models.py), writes
tests/golden/lora/<variant>/:
  adapter_model.safetensors + adapter_config.json   a PEFT LoRA adapter (r=4, alpha=8, all of
                                                    q,k,v,o,gate,up,down; lora_B random, not zero,
                                                    so every gradient is informative)
  grads.safetensors                                 d loss / d param for every lora_A / lora_B, PEFT names
  batch.json                                        {"input_ids", "attention_mask", "labels", "loss"}
and for llama_mha also full_grads.safetensors (every base weight's gradient, no LoRA).
The batch has two right-padded rows; labels are -100 on prompt and padding positions, so the
loss is transformers' token-mean cross-entropy over supervised (shifted) positions.
Run where transformers + peft are installed (the GPU machine): python3 tools/gen_lora_goldens.py
"""
import json
import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "golden", "models")
OUT = os.path.join(ROOT, "tests", "golden", "lora")
VARIANTS = ["llama_mha", "llama_gqa_tied", "qwen3", "llama_bias"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_batch():
    g = torch.Generator().manual_seed(7)
    rows = [(torch.randint(2, 500, (9,), generator=g), torch.randint(2, 500, (7,), generator=g)),
            (torch.randint(2, 500, (5,), generator=g), torch.randint(2, 500, (4,), generator=g))]
    T = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    labels = torch.full((len(rows), T), -100, dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        n = len(p) + len(c)
        ids[i, :n] = torch.cat([p, c])
        mask[i, :n] = 1
        labels[i, len(p):n] = c
    return ids, mask, labels


def main():
    torch.manual_seed(0)
    ids, mask, labels = make_batch()
    for name in VARIANTS:
        out = os.path.join(OUT, name)
        os.makedirs(out, exist_ok=True)
        base = AutoModelForCausalLM.from_pretrained(os.path.join(MODELS, name), dtype=torch.float32,
                                                    attn_implementation="eager")
        if name == "llama_mha":
            base.train()
            loss = base(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            save_file({k: p.grad.contiguous() for k, p in base.named_parameters() if p.grad is not None},
                      os.path.join(out, "full_grads.safetensors"))
            json.dump({"loss": loss.item()}, open(os.path.join(out, "full_loss.json"), "w"))
            base.zero_grad(set_to_none=True)
        cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                         task_type="CAUSAL_LM")
        model = get_peft_model(base, cfg)
        g = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for k, p in model.named_parameters():
                if "lora_B" in k:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        model.train()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        grads = {k: p.grad.contiguous() for k, p in model.named_parameters() if p.requires_grad}
        save_file(grads, os.path.join(out, "grads.safetensors"))
        model.save_pretrained(out)
        json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "labels": labels.tolist(),
                   "loss": loss.item(), "lora_r": 4, "lora_alpha": 8, "target_modules": TARGETS},
                  open(os.path.join(out, "batch.json"), "w"))
        print(f"{name}: loss {loss.item():.6f}, {len(grads)} lora grads")


if __name__ == "__main__":
    main()
