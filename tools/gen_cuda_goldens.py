#!/usr/bin/env python3
"""CUDA bf16 reference runs from transformers, made on the GPU machine right before Hearth's CUDA
parity test reads them (they depend on the GPU and library versions, so they are not committed).

For each model folder given, writes OUTDIR/<basename>/golden.json in the format of
tests/golden/models/*/golden.json (prompts: ids, logits file = bf16-model logits of every prompt
position as float32, greedy_ids = N greedy tokens with the KV cache, step_logits = first K decode
steps' logits files) using attn_implementation="eager" (op order Hearth's plain path follows) and
"sdpa" (written as golden_sdpa.json).
  python3 tools/gen_cuda_goldens.py --out DIR --steps 100 MODEL_DIR...
"""
import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM


@torch.no_grad()
def run(model, ids, steps, folder, tag, k_logits=4):
    x = torch.tensor([ids], device="cuda")
    out = model(x, use_cache=True)
    out.logits[0].float().cpu().numpy().astype("<f4").tofile(os.path.join(folder, f"{tag}_prompt_logits.bin"))
    past, last = out.past_key_values, out.logits[0, -1]
    greedy, step_files = [], []
    for s in range(steps):
        nxt = int(torch.argmax(last))
        greedy.append(nxt)
        out = model(torch.tensor([[nxt]], device="cuda"), past_key_values=past, use_cache=True)
        past, last = out.past_key_values, out.logits[0, -1]
        if s < k_logits:
            f = f"{tag}_step{s}_logits.bin"
            last.float().cpu().numpy().astype("<f4").tofile(os.path.join(folder, f))
            step_files.append(f)
    return {"ids": ids, "logits": f"{tag}_prompt_logits.bin", "greedy_ids": greedy, "step_logits": step_files}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    models = []
    for m in a.models:  # a folder of model folders (tests/golden/models/qwen3_5) stands for each of them
        if os.path.exists(os.path.join(m, "config.json")):
            models.append(m)
        elif os.path.isdir(m):
            subs = sorted(os.path.join(m, d) for d in os.listdir(m) if os.path.exists(os.path.join(m, d, "config.json")))
            if not subs:
                print("skipped (no config.json in it or its subfolders):", m)
            models += subs
    for m in models:
        cfg = json.load(open(os.path.join(m, "config.json")))
        if "quantization" in cfg or "quantization_config" in cfg:
            print("skipped (transformers cannot run MLX-quantized folders):", m)
            continue
        folder = os.path.join(a.out, os.path.basename(m.rstrip("/")))
        os.makedirs(folder, exist_ok=True)
        gold = json.load(open(os.path.join(m, "golden.json"))) if os.path.exists(os.path.join(m, "golden.json")) else None
        prompts = [p["ids"] for p in gold["prompts"]] if gold else [[1] + list(range(100, 140))]
        for attn in ("eager", "sdpa"):
            try:
                model = AutoModelForCausalLM.from_pretrained(m, dtype=torch.bfloat16, attn_implementation=attn).cuda().eval()
                res = [run(model, ids, a.steps, folder, f"{attn}_p{i}") for i, ids in enumerate(prompts)]
            except Exception as e:  # one model the reference cannot run must not stop the others
                print(f"failed ({attn}): {m}: {type(e).__name__}: {e}")
                continue
            name = "golden.json" if attn == "eager" else "golden_sdpa.json"
            json.dump({"model": m, "dtype": "bfloat16", "attn": attn, "prompts": res},
                      open(os.path.join(folder, name), "w"))
            del model
        print("cuda goldens:", folder)


if __name__ == "__main__":
    main()
