#!/usr/bin/env python3
"""The yardstick for `hearth bench`: transformers' prefill and greedy decode speed on the same model
folder and GPU, measured the same way (random prompt ids, warmup, median of runs).

  python3 tools/bench_transformers.py --model DIR [--prompt-tokens 512 --gen-tokens 128 --runs 3]
Prints one JSON line: {"prefill_tok_s", "decode_tok_s", "ttft_ms", "peak_gb"}.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attn", default="sdpa")
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype),
                                                 attn_implementation=a.attn).cuda().eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 500, (1, a.prompt_tokens), generator=g).cuda()
    res = []
    for run in range(a.runs + 1):
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model(ids, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            past = out.past_key_values
            for _ in range(a.gen_tokens - 1):
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
        if run > 0:
            res.append((a.prompt_tokens / (t1 - t0), (a.gen_tokens - 1) / (t2 - t1), (t1 - t0) * 1e3,
                        torch.cuda.max_memory_allocated() / 1e9))
    med = [statistics.median(x) for x in zip(*res)]
    print(json.dumps({"prefill_tok_s": round(med[0], 1), "decode_tok_s": round(med[1], 1),
                      "ttft_ms": round(med[2], 2), "peak_gb": round(med[3], 3)}))


if __name__ == "__main__":
    main()
