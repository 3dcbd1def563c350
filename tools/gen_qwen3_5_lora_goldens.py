#!/usr/bin/env python3
"""LoRA gradient goldens for the tiny Qwen3.5 models, from transformers + peft (CPU, fp32).

For each model in <models>/<variant> (made by gen_qwen3_5_goldens.py), writes <out>/<variant>/:
  adapter_model.safetensors + adapter_config.json   a PEFT LoRA adapter (r=4, alpha=8) on every
                                                    projection of both layer kinds (full attention
                                                    q/k/v/o, DeltaNet in_proj_qkv/z/b/a + out_proj,
                                                    MLP gate/up/down); lora_B random, not zero
  grads.safetensors                                 d loss / d param for every lora_A / lora_B, PEFT names
  batch.json                                        {"input_ids", "attention_mask", "labels", "loss"}
Same batch recipe as gen_lora_goldens.py, but longer rows (one over the 64-token chunk) so the
chunked gated delta rule's backward crosses chunks. Rows are right-padded; labels are -100 on
prompt and padding positions.
Run where transformers + peft are installed (the GPU machine):
  python3 tools/gen_qwen3_5_lora_goldens.py [models_dir] [out_dir]
"""
import json
import os
import sys

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "golden", "models", "qwen3_5")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "golden", "lora", "qwen3_5")
VARIANTS = ["q35_tied_hv2", "q35_untied_hv1_mqa"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj",
           "gate_proj", "up_proj", "down_proj"]


def make_batch():
    g = torch.Generator().manual_seed(7)
    rows = [(torch.randint(2, 500, (30,), generator=g), torch.randint(2, 500, (45,), generator=g)),
            (torch.randint(2, 500, (5,), generator=g), torch.randint(2, 500, (12,), generator=g))]
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
        print(f"{name}: loss {loss.item():.6f}, {len(grads)} lora grads", flush=True)


if __name__ == "__main__":
    main()
