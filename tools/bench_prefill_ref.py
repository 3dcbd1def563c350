#!/usr/bin/env python3
"""Prefill peers for `hearth bench --gen-tokens 1` on a llama folder (issue 11's 8B prefill at 4K):
transformers' own forward (logits of the last token only, `logits_to_keep=1`), and a plain-PyTorch
prefill written for speed (q/k/v and gate/up weights concatenated, RMSNorm by F.rms_norm, flash SDPA
with enable_gqa; a later chunk attends with lower-right causal alignment), both bf16, warmup then the
median of runs. With --profile, the plain prefill's CUDA kernel time by kind (GEMM, attention, other)
from torch.profiler. Prints one JSON line.

  python3 tools/bench_prefill_ref.py --model DIR [--prompt-tokens 4096 --chunks 4096,2048 --runs 3 --profile]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


class PlainLlama:
    """The llama forward of `hf` over a static cache of `max_len` positions, weights concatenated."""

    def __init__(self, hf, max_len):
        self.m, self.head, c = hf.model, hf.lm_head, hf.config
        self.H, self.Hkv = c.num_attention_heads, c.num_key_value_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.layers = []
        for layer in self.m.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.layers.append(dict(
                n1=layer.input_layernorm.weight, n2=layer.post_attention_layernorm.weight,
                qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), o=a.o_proj.weight,
                gu=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), down=mlp.down_proj.weight))
        dev, dt = hf.device, hf.dtype
        L = len(self.layers)
        self.k = torch.zeros(L, 1, max_len, self.Hkv, self.D, device=dev, dtype=dt)
        self.v = torch.zeros_like(self.k)
        cos, sin = self.m.rotary_emb(torch.zeros(1, device=dev, dtype=dt), torch.arange(max_len, device=dev)[None])
        self.cos, self.sin = cos[0][:, None], sin[0][:, None]  # [max_len, 1, D]

    @staticmethod
    def rope(x, cos, sin):
        a, b = x.chunk(2, -1)
        return x * cos + torch.cat((-b, a), -1) * sin

    def forward(self, ids, start):  # ids [1, T] at positions start.. → logits of the last [1, 1, V]
        T, e = ids.shape[1], start + ids.shape[1]
        C, qd, kd = self.m.config.hidden_size, self.H * self.D, self.Hkv * self.D
        cos, sin = self.cos[start:e], self.sin[start:e]
        h = self.m.embed_tokens(ids)
        for i, w in enumerate(self.layers):
            qkv = F.linear(F.rms_norm(h, (C,), w["n1"], self.eps), w["qkv"])
            q = self.rope(qkv[..., :qd].view(1, T, self.H, self.D), cos, sin)
            self.k[i, :, start:e] = self.rope(qkv[..., qd:qd + kd].view(1, T, self.Hkv, self.D), cos, sin)
            self.v[i, :, start:e] = qkv[..., qd + kd:].view(1, T, self.Hkv, self.D)
            k, v = self.k[i, :, :e].transpose(1, 2), self.v[i, :, :e].transpose(1, 2)
            q = q.transpose(1, 2)
            if start == 0:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:  # lower-right causal: flash's own alignment when T != S
                o = torch.ops.aten._flash_attention_forward(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, T, e, 0.0, True, False,
                    scale=self.D ** -0.5)[0].transpose(1, 2)
            h = h + F.linear(o.transpose(1, 2).reshape(1, T, qd), w["o"])
            g, u = F.linear(F.rms_norm(h, (C,), w["n2"], self.eps), w["gu"]).chunk(2, -1)
            h = h + F.linear(F.silu(g) * u, w["down"])
        return self.head(self.m.norm(h[:, -1:]))

    def prefill(self, ids, chunk):
        for s in range(0, ids.shape[1], chunk):
            logits = self.forward(ids[:, s:s + chunk], s)
        return logits[0, -1].argmax()


def timed(fn, runs):
    out = []
    for r in range(runs + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if r:
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def kind(name):
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "xmma", "cutlass", "cublas", "sm90_")):
        return "gemm"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--chunks", default="4096,2048")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    hf = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    P = a.prompt_tokens
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 500, (1, P), generator=g).cuda()
    res = {"prompt_tokens": P}
    with torch.no_grad():
        s = timed(lambda: hf(ids, logits_to_keep=1).logits[0, -1].argmax(), a.runs)
        res["transformers_prefill_tok_s"] = round(P / s, 1)
        plain = PlainLlama(hf, P + 8)
        for c in [int(x) for x in a.chunks.split(",")]:
            s = timed(lambda: plain.prefill(ids, c), a.runs)
            res[f"plain_chunk{c}_tok_s"] = round(P / s, 1)
        if a.profile:
            c = int(a.chunks.split(",")[0])
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                plain.prefill(ids, c)
                torch.cuda.synchronize()
            by = {}
            for ev in prof.key_averages():
                us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
                if us and not ev.key.startswith("aten::"):
                    by[kind(ev.key)] = by.get(kind(ev.key), 0) + us
            res[f"plain_chunk{c}_kernel_ms"] = {k: round(v / 1e3, 2) for k, v in by.items()}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
