#!/usr/bin/env python3
"""DPO / ORPO goldens from a plain-PyTorch implementation (no TRL, no transformers, no peft).

For each tiny llama model in tests/golden/models/<variant> with its PEFT LoRA adapter in
tests/golden/lora/<variant> (random lora_B, scale lora_alpha / r), this script runs its own fp32
llama forward (HF LlamaForCausalLM's op order: RMSNorm in fp32, rotate_half RoPE, eager causal
attention with GQA, SiLU MLP; LoRA y += s * (x A^T) B^T) and writes tests/golden/preference/<variant>/:
  batch.json           {"input_ids", "labels", "full_labels"} [2B, T]: rows [0, B) chosen, [B, 2B)
                       rejected, right-padded with 0; labels = response tokens (-100 elsewhere),
                       full_labels = every real token; plus per case: loss, metrics, ref logps
  <case>.safetensors   d loss / d param for every lora_A / lora_B (PEFT names), fp32
Cases: dpo (beta 0.1), orpo_response and orpo_full (lambda 0.1, sft_scope response / full); and for
a full fine-tune (no LoRA; the policy starts equal to the reference, so DPO's loss is log 2),
full_dpo and full_orpo_full with the gradients of a few base weights (FULL_CHECKED, HF names).
Formulas (TRL DPOTrainer loss_type="sigmoid", ORPOTrainer; the odds-ratio term as mlx-bun):
  DPO:  pi = sum of response-token log-probs per row, ref the same with LoRA off (no grad);
        loss = mean(-logsigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r))));
        rewards = beta * (pi - ref); accuracy = mean(r_c > r_r); margin = mean(r_c - r_r).
  ORPO: l = mean response log-prob per row; log_odds = (l_c - l_r) - (log1p(-exp(l_c)) - log1p(-exp(l_r)));
        or = mean(-logsigmoid(log_odds)); nll = token-mean CE over the chosen rows' response tokens
        (scope response) or every real token after the first (scope full); loss = nll + lambda * or;
        accuracy = mean(l_c > l_r); margin = mean(log_odds).
Log-probs per token in fp32 (log_softmax of fp32 logits), the loss arithmetic in fp64.
It first checks its forward against the PEFT goldens of gen_lora_goldens.py (CE loss and grads).
Runs with any torch >= 1.13 (Debian's python3-torch works):  python3 tools/gen_preference_goldens.py
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLD = os.path.join(ROOT, "tests", "golden")
VARIANTS = ["llama_mha", "llama_gqa_tied"]
IGNORE = -100
# Base weights whose gradients the full fine-tune cases record (the head, the embedding, norms, projections).
FULL_CHECKED = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight",
                "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"]
DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[s:e]), dtype=DTYPES[v["dtype"]]) if e > s else torch.empty(0)
        out[k] = t.reshape(v["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        t = tensors[k].detach().to(torch.float32).contiguous()
        b = t.numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class Llama:
    """HF LlamaForCausalLM forward (fp32, eager attention) with PEFT-style LoRA on the projections."""

    def __init__(self, folder, lora_folder):
        self.cfg = json.load(open(os.path.join(folder, "config.json")))
        self.w = read_safetensors(os.path.join(folder, "model.safetensors"))
        acfg = json.load(open(os.path.join(lora_folder, "adapter_config.json")))
        self.scale = acfg["lora_alpha"] / acfg["r"]
        self.lora = {k: v.clone().requires_grad_(True)
                     for k, v in read_safetensors(os.path.join(lora_folder, "adapter_model.safetensors")).items()}
        self.lora_on = True

    def linear(self, x, name):
        y = x @ self.w[name + ".weight"].t()
        if name + ".bias" in self.w:
            y = y + self.w[name + ".bias"]
        a = self.lora.get("base_model.model." + name + ".lora_A.weight")
        if self.lora_on and a is not None:
            b = self.lora["base_model.model." + name + ".lora_B.weight"]
            y = y + self.scale * ((x @ a.t()) @ b.t())
        return y

    def rms(self, x, name):
        eps = self.cfg["rms_norm_eps"]
        x32 = x.float()
        return self.w[name + ".weight"] * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))

    def forward(self, ids):
        c = self.cfg
        H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
        D = c.get("head_dim") or c["hidden_size"] // H
        theta = c.get("rope_theta") or c.get("rope_parameters", {}).get("rope_theta", 10000.0)
        B, T = ids.shape
        inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        freqs = torch.arange(T).float()[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]

        def rot(x):
            x1, x2 = x[..., : D // 2], x[..., D // 2:]
            return torch.cat([-x2, x1], -1)

        mask = torch.full((T, T), float("-inf")).triu(1)
        h = self.w["model.embed_tokens.weight"][ids]
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            x = self.rms(h, p + "input_layernorm")
            q = self.linear(x, p + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
            k = self.linear(x, p + "self_attn.k_proj").view(B, T, Hkv, D).transpose(1, 2)
            v = self.linear(x, p + "self_attn.v_proj").view(B, T, Hkv, D).transpose(1, 2)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            att = torch.softmax((q @ k.transpose(2, 3)) / math.sqrt(D) + mask, -1, dtype=torch.float32)
            o = (att @ v).transpose(1, 2).reshape(B, T, H * D)
            h = h + self.linear(o, p + "self_attn.o_proj")
            x = self.rms(h, p + "post_attention_layernorm")
            m = F.silu(self.linear(x, p + "mlp.gate_proj")) * self.linear(x, p + "mlp.up_proj")
            h = h + self.linear(m, p + "mlp.down_proj")
        h = self.rms(h, "model.norm")
        head = self.w["lm_head.weight"] if "lm_head.weight" in self.w else self.w["model.embed_tokens.weight"]
        return h @ head.t()


def shift(labels):
    out = torch.full_like(labels, IGNORE)
    out[:, :-1] = labels[:, 1:]
    return out


def token_logps(logits, targets):
    """[N, T] fp32 log p(target), 0 where targets == IGNORE."""
    lp = torch.log_softmax(logits.float(), -1)
    keep = targets != IGNORE
    picked = lp.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return torch.where(keep, picked, torch.zeros_like(picked))


def dpo(logp, resp, ref, beta):
    B = logp.shape[0] // 2
    seq = (logp.double() * resp.double()).sum(1)
    pc, pr, rc, rr = seq[:B], seq[B:], ref[:B], ref[B:]
    loss = (-F.logsigmoid(beta * ((pc - pr) - (rc - rr)))).mean()
    wc, wr = (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()
    return loss, {"loss": loss.item(), "accuracy": (wc > wr).double().mean().item(), "margin": (wc - wr).mean().item()}


def orpo(logp, resp, nll_mask, lam):
    B = logp.shape[0] // 2
    lp, r = logp.double(), resp.double()
    ell = (lp * r).sum(1) / r.sum(1)
    lc, lr = ell[:B], ell[B:]
    log_odds = (lc - lr) - (torch.log1p(-torch.exp(lc)) - torch.log1p(-torch.exp(lr)))
    or_term = (-F.logsigmoid(log_odds)).mean()
    m = nll_mask.double()
    nll = -(lp[:B] * m).sum() / m.sum()
    loss = nll + lam * or_term
    return loss, {"loss": loss.item(), "accuracy": (lc > lr).double().mean().item(),
                  "margin": log_odds.mean().item(), "nll": nll.item(), "or": or_term.item()}


def make_batch():
    g = torch.Generator().manual_seed(23)
    spec = [(6, 5, 3), (3, 4, 7), (5, 2, 2)]  # (prompt, chosen, rejected) lengths
    rows = []
    for p, c, r in spec:
        prompt = torch.randint(2, 500, (p,), generator=g)
        rows.append((prompt, torch.randint(2, 500, (c,), generator=g), torch.randint(2, 500, (r,), generator=g)))
    seqs = [(p, c) for p, c, _ in rows] + [(p, r) for p, _, r in rows]
    T = max(len(p) + len(x) for p, x in seqs)
    N = len(seqs)
    ids = torch.zeros(N, T, dtype=torch.long)
    labels = torch.full((N, T), IGNORE, dtype=torch.long)
    full = torch.full((N, T), IGNORE, dtype=torch.long)
    for i, (p, x) in enumerate(seqs):
        n = len(p) + len(x)
        ids[i, :n] = torch.cat([p, x])
        labels[i, len(p):n] = x
        full[i, :n] = ids[i, :n]
    return ids, labels, full


def self_check(name):
    """The forward + LoRA against transformers + peft's goldens (tests/golden/lora/<name>)."""
    model = Llama(os.path.join(GOLD, "models", name), os.path.join(GOLD, "lora", name))
    b = json.load(open(os.path.join(GOLD, "lora", name, "batch.json")))
    ids, labels = torch.tensor(b["input_ids"]), torch.tensor(b["labels"])
    t = shift(labels)
    logits = model.forward(ids)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1), ignore_index=IGNORE)
    loss.backward()
    gold = read_safetensors(os.path.join(GOLD, "lora", name, "grads.safetensors"))
    worst = max(((model.lora[k.replace(".default.", ".")].grad - g).norm() / g.norm()).item() for k, g in gold.items())
    assert abs(loss.item() - b["loss"]) <= 1e-5 * abs(b["loss"]), (name, loss.item(), b["loss"])
    assert worst < 1e-4, (name, worst)
    print(f"{name}: forward matches peft (loss {loss.item():.7f} vs {b['loss']:.7f}, worst grad rel err {worst:.2e})")


def main():
    torch.manual_seed(0)
    ids, labels, full = make_batch()
    B = ids.shape[0] // 2
    resp_t, full_t = shift(labels), shift(full)
    resp = (resp_t != IGNORE)
    for name in VARIANTS:
        self_check(name)
        model = Llama(os.path.join(GOLD, "models", name), os.path.join(GOLD, "lora", name))
        out = os.path.join(GOLD, "preference", name)
        os.makedirs(out, exist_ok=True)
        model.lora_on = False
        with torch.no_grad():
            ref = token_logps(model.forward(ids), resp_t).double().sum(1)
        model.lora_on = True
        record = {"input_ids": ids.tolist(), "labels": labels.tolist(), "full_labels": full.tolist(), "pairs": B,
                  "lora_scale": model.scale, "ref_logps": ref.tolist(), "cases": {}}
        cases = [("dpo", {"beta": 0.1}), ("orpo_response", {"orpo_lambda": 0.1, "sft_scope": "response"}),
                 ("orpo_full", {"orpo_lambda": 0.1, "sft_scope": "full"})]
        for case, opts in cases:
            for t in model.lora.values():
                t.grad = None
            if case == "dpo":
                loss, metrics = dpo(token_logps(model.forward(ids), resp_t), resp, ref, opts["beta"])
            else:
                targets = resp_t.clone()
                nll_mask = resp[:B]
                if opts["sft_scope"] == "full":
                    targets[:B] = full_t[:B]
                    nll_mask = full_t[:B] != IGNORE
                loss, metrics = orpo(token_logps(model.forward(ids), targets), resp, nll_mask, opts["orpo_lambda"])
            loss.backward()
            write_safetensors(os.path.join(out, case + ".safetensors"), {k: t.grad for k, t in model.lora.items()})
            record["cases"][case] = {"options": opts, "metrics": metrics}
            print(f"{name} {case}: " + ", ".join(f"{k} {v:.6f}" for k, v in metrics.items()))
        # Full fine-tune (no LoRA): the policy starts as the reference, gradients of base weights.
        model.lora_on = False
        for k in model.w:
            model.w[k].requires_grad_(True)
        for case, opts in [("full_dpo", {"beta": 0.1}), ("full_orpo_full", {"orpo_lambda": 0.1, "sft_scope": "full"})]:
            for t in model.w.values():
                t.grad = None
            if case == "full_dpo":
                loss, metrics = dpo(token_logps(model.forward(ids), resp_t), resp, ref, opts["beta"])
            else:
                targets = resp_t.clone()
                targets[:B] = full_t[:B]
                loss, metrics = orpo(token_logps(model.forward(ids), targets), resp, full_t[:B] != IGNORE,
                                     opts["orpo_lambda"])
            loss.backward()
            write_safetensors(os.path.join(out, case + ".safetensors"),
                              {k: t.grad for k, t in model.w.items() if k in FULL_CHECKED})
            record["cases"][case] = {"options": opts, "metrics": metrics}
            print(f"{name} {case}: " + ", ".join(f"{k} {v:.6f}" for k, v in metrics.items()))
        for k in model.w:
            model.w[k].requires_grad_(False)
        with open(os.path.join(out, "batch.json"), "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
