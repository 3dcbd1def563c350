#!/usr/bin/env python3
"""Golden greedy continuations of the shipped starter model (models/starter) from `transformers`.

The starter is an MLX affine 8-bit folder, which transformers does not read; this script
dequantizes every packed weight exactly as the format defines it (w = scales * q + biases per
group, in fp32 from the stored bf16 scales/biases), loads the result into LlamaForCausalLM (fp32,
eager attention, CPU) and writes tests/golden/starter/golden.json:
  {"transformers_version", "model_sha256": sha256 of model.safetensors, "prompts": [{"text",
   "ids" (tokenizers, with specials), "last_logits_top": [[id, logit] x 10] at the last prompt
   position, "greedy_ids": [32 ids, greedy with the KV cache], "min_gap": smallest top1-top2 gap
   along the greedy path}]}
Run where transformers + tokenizers are installed (the GPU machine):
  python3 tools/gen_starter_golden.py [--model models/starter] [--out tests/golden/starter]
Regenerate only when models/starter changes, and commit the result with it.
"""
import argparse
import hashlib
import json
import os

import numpy as np
import torch
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["The history of the city", "She opened the door and"]
N_GREEDY = 32


def unpack(packed, bits, in_features):
    """MLX packing: codes little-end first in uint32 words (bits dividing 32 only)."""
    assert 32 % bits == 0, bits
    per = 32 // bits
    w = packed.astype(np.uint64)[:, :, None] >> (bits * np.arange(per, dtype=np.uint64))
    return (w & ((1 << bits) - 1)).reshape(packed.shape[0], -1)[:, :in_features].astype(np.float32)


def load_tensors(path):
    """Every tensor as numpy: bf16/f16 widened to fp32 (numpy has no bf16), U32 kept as uint32."""
    out = {}
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if t.dtype in (torch.bfloat16, torch.float16):
                out[k] = t.float().numpy()
            elif t.dtype == torch.uint32:
                out[k] = t.view(torch.int32).numpy().view(np.uint32)
            else:
                out[k] = t.numpy()
    return out


def dequantized_state(folder, cfg):
    q = cfg["quantization"]
    raw = load_tensors(os.path.join(folder, "model.safetensors"))
    out = {}
    for key, t in raw.items():
        if key.endswith(".scales") or key.endswith(".biases"):
            continue
        module = key[: -len(".weight")]
        if module + ".scales" in raw:
            spec = q.get(module, q)
            bits, group = spec["bits"], spec["group_size"]
            scales = raw[module + ".scales"].astype(np.float32)
            biases = raw[module + ".biases"].astype(np.float32)
            codes = unpack(t.view(np.uint32), bits, t.shape[1] * 32 // bits)
            w = codes * np.repeat(scales, group, 1) + np.repeat(biases, group, 1)
            out[key] = torch.from_numpy(w)
        else:
            out[key] = torch.from_numpy(t.astype(np.float32))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "starter"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "starter"))
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    state = dequantized_state(a.model, cfg)
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    config = LlamaConfig(**hf_cfg)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).float().eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(m == "lm_head.weight" for m in missing), missing  # tied
    model.tie_weights()
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    prompts = []
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok.encode(text, add_special_tokens=True).ids
            out = model(torch.tensor([ids]), use_cache=True)
            last = out.logits[0, -1]
            top = torch.topk(last, 10)
            top_pairs = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]
            past, greedy, gaps = out.past_key_values, [], []
            for _ in range(N_GREEDY):
                t2 = torch.topk(last, 2).values
                gaps.append(float(t2[0] - t2[1]))
                nxt = int(torch.argmax(last))
                greedy.append(nxt)
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, last = out.past_key_values, out.logits[0, -1]
            prompts.append({"text": text, "ids": ids, "last_logits_top": top_pairs, "greedy_ids": greedy,
                            "min_gap": min(gaps)})
            print(f"{text!r} -> {tok.decode(greedy)!r} (min gap {min(gaps):.4f})")
    sha = hashlib.sha256(open(os.path.join(a.model, "model.safetensors"), "rb").read()).hexdigest()
    os.makedirs(a.out, exist_ok=True)
    json.dump({"transformers_version": transformers.__version__, "model_sha256": sha, "prompts": prompts},
              open(os.path.join(a.out, "golden.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
