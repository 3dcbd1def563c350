#!/usr/bin/env python3
"""A CUDA-graph decode peer for `hearth bench` (gpt-fast style, ~plain PyTorch): the llama model of a
folder (weights through transformers, so RoPE scaling and loading are the reference's), a static KV
cache, and the one-token step (all layers + head + argmax) captured once in a CUDA graph and
replayed per token. Measured like tools/bench_transformers.py: random prompt ids, warmup, median of
runs. Prints one JSON line: {"decode_tok_s", "ttft_ms"}.

  python3 tools/bench_cudagraph_ref.py --model DIR [--prompt-tokens 512 --gen-tokens 128 --runs 3]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


class StaticLlama:
    def __init__(self, hf, max_len):
        self.m = hf.model
        self.head = hf.lm_head
        c = hf.config
        self.H, self.Hkv = c.num_attention_heads, c.num_key_value_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        dev, dt = hf.device, hf.dtype
        L = c.num_hidden_layers
        self.k = torch.zeros(L, 1, self.Hkv, max_len, self.D, device=dev, dtype=dt)
        self.v = torch.zeros_like(self.k)
        pos = torch.arange(max_len, device=dev)[None]
        cos, sin = self.m.rotary_emb(torch.zeros(1, device=dev, dtype=dt), pos)
        self.cos, self.sin = cos[0], sin[0]  # [max_len, D]
        self.max_len = max_len

    @staticmethod
    def rot(x):
        a, b = x.chunk(2, -1)
        return torch.cat((-b, a), -1)

    def forward(self, ids, pos):  # ids [1, T], pos [T] (device)
        T = ids.shape[1]
        h = self.m.embed_tokens(ids)
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
        mask = torch.arange(self.max_len, device=ids.device)[None] <= pos[:, None]  # [T, S]
        for i, layer in enumerate(self.m.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(1, T, self.H, self.D).transpose(1, 2)
            k = a.k_proj(x).view(1, T, self.Hkv, self.D).transpose(1, 2)
            v = a.v_proj(x).view(1, T, self.Hkv, self.D).transpose(1, 2)
            q = q * cos + self.rot(q) * sin
            k = k * cos + self.rot(k) * sin
            self.k[i].index_copy_(2, pos, k)
            self.v[i].index_copy_(2, pos, v)
            o = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask[None, None],
                                               enable_gqa=True)
            h = h + a.o_proj(o.transpose(1, 2).reshape(1, T, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.head(self.m.norm(h[:, -1:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    hf = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    P, G = a.prompt_tokens, a.gen_tokens
    s = StaticLlama(hf, P + G + 8)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, 500, (1, P), generator=g).cuda()
    tok = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                out = s.forward(tok, pos)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = s.forward(tok, pos)
            nxt = out[0, -1].argmax()
        rates, ttfts = [], []
        for run in range(a.runs + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = s.forward(prompt, torch.arange(P, device="cuda"))
            tok.copy_(logits[0, -1].argmax().view(1, 1))
            pos.fill_(P)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for _ in range(G):
                graph.replay()
                int(nxt)  # the host reads each token, as a server streams it
                tok.copy_(nxt.view(1, 1))
                pos.add_(1)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if run:
                rates.append(G / (t2 - t1))
                ttfts.append((t1 - t0) * 1e3)
    print(json.dumps({"decode_tok_s": round(statistics.median(rates), 1), "ttft_ms": round(statistics.median(ttfts), 2)}))


if __name__ == "__main__":
    main()
