#!/usr/bin/env python3
"""Diagnosis aid for CUDA bf16 parity (GPU machine): dumps transformers' per-layer hidden states of
one prompt per model for tests/models/cuda_parity_test.cpp (CudaParityLayers), which prints where
Hearth's bf16 forward departs. Writes OUTDIR/<name>/layers.json and h<i>.bin (bf16 values as
float32; h0 = embeddings output, h<i+1> = after layer i), and prints, per layer, how far the bf16
reference itself is from an fp32 run (the size of plain bf16 rounding noise).
  python3 tools/cuda_layer_diff.py --out DIR MODEL_DIR...
"""
import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM


def hidden_states(m, dtype, ids):
    model = AutoModelForCausalLM.from_pretrained(m, dtype=dtype, attn_implementation="eager").cuda().eval()
    with torch.no_grad():
        out = model(torch.tensor([ids], device="cuda"), output_hidden_states=True, use_cache=False)
    return [h[0].float().cpu() for h in out.hidden_states]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    for m in a.models:
        name = os.path.basename(m.rstrip("/"))
        gold = json.load(open(os.path.join(m, "golden.json")))
        ids = gold["prompts"][0]["ids"]
        try:
            hb = hidden_states(m, torch.bfloat16, ids)
            hf = hidden_states(m, torch.float32, ids)
        except Exception as e:
            print(f"failed: {m}: {type(e).__name__}: {e}")
            continue
        folder = os.path.join(a.out, name)
        os.makedirs(folder, exist_ok=True)
        for i, h in enumerate(hb):
            h.numpy().astype("<f4").tofile(os.path.join(folder, f"h{i}.bin"))
        json.dump({"model": os.path.abspath(m), "ids": ids, "num": len(hb)}, open(os.path.join(folder, "layers.json"), "w"))
        noise = " ".join(f"{(b - f).abs().max().item():.3g}" for b, f in zip(hb, hf))
        print(f"[tf bf16 vs fp32] {name} T={len(ids)} per hidden state: {noise}")


if __name__ == "__main__":
    main()
