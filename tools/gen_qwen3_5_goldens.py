#!/usr/bin/env python3
"""Tiny random-weight Qwen3.5 (gated-DeltaNet hybrid) models + reference outputs from transformers
(CPU, fp32, eager attention, torch fallbacks of the gated delta rule and causal conv1d).

Writes <out>/<variant>/ (default out: tests/golden/models/qwen3_5/): a model folder (config.json,
model.safetensors, tokenizer files of tests/golden/tokenizer/tiny) and golden.json:
  {"variant", "transformers_version", "layer_types", "prompts": [{"text", "ids",
   "logits": "<file>.bin" (raw little-endian float32 [T, V], every prompt position),
   "greedy_ids": [64 ids: greedy continuation through the cache (prefill = chunked rule, then
   one-token recurrent steps)], "distinct": distinct ids among them, "min_gap": smallest
   top1-top2 logit gap along the greedy path}]}
Variants: several layer patterns (layer_types given, and the full_attention_interval rule with no
layer_types in config.json), linear value/key head ratios 1 and 2, tied and untied heads, GQA and
MQA full attention, one `qwen3_5` VLM-wrapper layout (text_config; weights under
model.language_model., a vision tower and an mtp.* tensor that a text runtime skips), and one
MLX-quantized copy (mlx-community layout: language_model.model.*, conv1d [C, K, 1], the five
zero-centred norms stored +1, affine 4-bit group 64 with 8-bit overrides) whose reference runs
transformers on the dequantized weights. The third prompt is longer than the 64-token chunk, so
prefill crosses chunk boundaries. Each model's seed is the first (of 12) whose greedy
continuations are not one token repeated (>= 8 distinct ids per prompt).
Also "q3next_dense": model_type qwen3_next (fused in_proj_qkvz / in_proj_ba projections) with
num_experts 0, i.e. the dense MLP on every layer.
Run where transformers 5.x + tokenizers are installed (the GPU machine):
  python3 tools/gen_qwen3_5_goldens.py [out_dir] [--only name,name]
Regenerating changes every golden: only do it on purpose, and commit the result whole.
"""
import json
import os
import shutil
import sys
import traceback

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOK_DIR = next(d for d in (os.path.join(ROOT, "tests", "golden", "tokenizer", "tiny"), os.path.join(HERE, "tiny_tok"))
               if os.path.exists(os.path.join(d, "tokenizer.json")))
ARGS = [a for a in sys.argv[1:] if not a.startswith("--only")]
ONLY = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")]
ONLY = set(ONLY[0]) if ONLY else None
OUT = ARGS[0] if ARGS else os.path.join(ROOT, "tests", "golden", "models", "qwen3_5")
N_GREEDY = 64
MIN_DISTINCT = 8
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away, there lived a curious little robot who loved to read books about the stars.",
    "Language models predict the next token from the tokens before it. Tokens are pieces of words. "
    "The history of computing starts with mechanical calculators and ends with tiny chips. "
    "In a land far away, curious people built machines that could talk, write and think. "
    "Every night it looked up at the sky, at the moon and the sun, and wondered what came next.",
]

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=0, hidden_act="silu")

L, F = "linear_attention", "full_attention"
# name: (overrides, rope_parameters, write full_attention_interval instead of layer_types)
VARIANTS = {
    "q35_tied_hv2": ({"tie_word_embeddings": True, "layer_types": [L, F, L, F]},
                     {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}, None),
    "q35_untied_hv1_mqa": ({"num_hidden_layers": 5, "layer_types": [F, L, L, F, L], "num_key_value_heads": 1,
                            "linear_num_key_heads": 4, "linear_num_value_heads": 4},
                           {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5}, None),
    "q35_interval_k3": ({"num_hidden_layers": 4, "linear_conv_kernel_dim": 3, "linear_value_head_dim": 32,
                         "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32, "attention_bias": True},
                        {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}, 4),
    "q3next_dense": ({"model_type": "qwen3_next", "num_hidden_layers": 3, "layer_types": [L, F, L],
                      "num_experts": 0, "mlp_only_layers": [0, 1, 2]},
                     {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}, None),
}
VLM_FROM = "q35_vlm"  # a wrapper-layout model of its own (layer pattern L, L, F, tied)
VLM_TEXT = ({"num_hidden_layers": 3, "layer_types": [L, L, F], "tie_word_embeddings": True},
            {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
             "mrope_interleaved": True, "mrope_section": [1, 1, 0]})


def make_config(overrides, rope, vocab, interval):
    kw = dict(BASE)
    kw.update(overrides)
    model_type = kw.pop("model_type", "qwen3_5_text")
    kw["vocab_size"] = vocab
    kw["rope_parameters"] = dict(rope)
    if interval:
        kw.pop("layer_types", None)
        kw["full_attention_interval"] = interval
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.3, 6.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("linear_attn.norm.weight"):  # RMSNormGated: plain weight
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("norm.weight"):  # Qwen3_5RMSNorm: (1 + weight), zero-centred
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "conv1d" in name:
                p.copy_(0.4 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                std = 0.25 if ("embed" in name or "lm_head" in name) else 0.15
                p.copy_(std * torch.randn(p.shape, generator=g))


@torch.no_grad()
def reference(model, tok, folder, write=True):
    prompts = []
    for i, text in enumerate(PROMPTS):
        ids = tok.encode(text, add_special_tokens=True).ids
        out = model(torch.tensor([ids]), use_cache=True)
        fname = f"prompt{i}_logits.bin"
        if write:
            out.logits[0].float().numpy().astype("<f4").tofile(os.path.join(folder, fname))
        past, last = out.past_key_values, out.logits[0, -1]
        greedy, gaps = [], []
        for _ in range(N_GREEDY):
            top2 = torch.topk(last, 2).values
            gaps.append(float(top2[0] - top2[1]))
            nxt = int(torch.argmax(last))
            greedy.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past, last = out.past_key_values, out.logits[0, -1]
        prompts.append({"text": text, "ids": ids, "logits": fname, "greedy_ids": greedy,
                        "distinct": len(set(greedy)), "min_gap": min(gaps), "_logits": out.logits})
    return prompts


def strip(prompts):
    return [{k: v for k, v in p.items() if not k.startswith("_")} for p in prompts]


def pick_seed(cfg, tok, base_seed):
    """The first seed whose greedy continuations all have >= MIN_DISTINCT distinct ids."""
    best = None
    for s in range(12):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
        init_weights(model, base_seed + s)
        d = min(p["distinct"] for p in reference(model, tok, None, write=False))
        if best is None or d > best[1]:
            best = (base_seed + s, d)
        if d >= MIN_DISTINCT:
            break
    return best


def copy_tokenizer(folder):
    for f in os.listdir(TOK_DIR):
        shutil.copy(os.path.join(TOK_DIR, f), folder)


def dump_golden(folder, name, prompts, layer_types, extra=None):
    g = {"variant": name, "transformers_version": transformers.__version__, "layer_types": layer_types,
         "prompts": strip(prompts)}
    g.update(extra or {})
    json.dump(g, open(os.path.join(folder, "golden.json"), "w"), indent=1)
    print(f"{name}: distinct {[p['distinct'] for p in prompts]} min gap "
          f"{min(p['min_gap'] for p in prompts):.4f} T {[len(p['ids']) for p in prompts]}", flush=True)


def make_text_variant(name, overrides, rope, interval, tok, vocab, seed):
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    cfg = make_config(overrides, rope, vocab, interval)
    seed, distinct = pick_seed(cfg, tok, seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    init_weights(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    copy_tokenizer(folder)
    if interval:  # config.json without layer_types: the reader must apply the interval rule
        path = os.path.join(folder, "config.json")
        c = json.load(open(path))
        c.pop("layer_types", None)
        c["full_attention_interval"] = interval
        json.dump(c, open(path, "w"), indent=2)
    back = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    assert back.config.layer_types == cfg.layer_types, (name, back.config.layer_types, cfg.layer_types)
    prompts = reference(back, tok, folder)
    dump_golden(folder, name, prompts, list(cfg.layer_types), {"seed": seed})
    return folder, back


def make_vlm(tok, vocab, seed):
    """model_type qwen3_5 (Qwen3_5ForConditionalGeneration layout) with a tiny vision tower and an
    extra mtp.* tensor; reference from the wrapper itself (text-only input)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    name = VLM_FROM
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    tcfg = make_config(VLM_TEXT[0], VLM_TEXT[1], vocab, None)
    seed, _ = pick_seed(tcfg, tok, seed)
    text = AutoModelForCausalLM.from_config(tcfg, attn_implementation="eager").float().eval()
    init_weights(text, seed)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=tcfg.hidden_size,
                  num_position_embeddings=16)
    cfg = Qwen3_5Config(text_config=tcfg.to_dict(), vision_config=vision,
                        tie_word_embeddings=tcfg.tie_word_embeddings)
    vlm = Qwen3_5ForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        missing, unexpected = vlm.model.language_model.load_state_dict(
            {k[len("model."):]: v for k, v in text.state_dict().items() if k.startswith("model.")}, strict=False)
        assert not missing and not unexpected, (missing, unexpected)
        vlm.lm_head.weight.copy_(text.lm_head.weight)
    vlm.save_pretrained(folder, safe_serialization=True)
    copy_tokenizer(folder)
    st = os.path.join(folder, "model.safetensors")
    sd = load_file(st)
    sd["mtp.fc.weight"] = torch.randn(8, 8)  # a multi-token-prediction head: skipped by text runtimes
    save_file(sd, st, metadata={"format": "pt"})
    back = Qwen3_5ForConditionalGeneration.from_pretrained(folder, attn_implementation="eager",
                                                           dtype=torch.float32).eval()
    prompts = reference(back, tok, folder)
    ref_text = reference(text, tok, None, write=False)
    same = all(a["greedy_ids"] == b["greedy_ids"] for a, b in zip(prompts, ref_text))
    dump_golden(folder, name, prompts, list(tcfg.layer_types),
                {"seed": seed, "weights": sorted(k for k in sd if not k.startswith("model.language_model.layers")),
                 "text_model_greedy_equal": same})


def mlx_quantize(w, bits, group):
    """mlx.core.quantize (affine): (packed uint32 [out, in*bits/32], scales, biases, codes)."""
    out_f, in_f = w.shape
    g = w.float().reshape(out_f, in_f // group, group)
    w_max, w_min = g.amax(-1, keepdim=True), g.amin(-1, keepdim=True)
    n_bins = float((1 << bits) - 1)
    mask = w_min.abs() > w_max.abs()
    scales = torch.clamp((w_max - w_min) / n_bins, min=1e-7)
    scales = torch.where(mask, scales, -scales)
    edge = torch.where(mask, w_min, w_max)
    q0 = torch.round(edge / scales)
    scales = torch.where(q0 != 0, edge / q0, scales)
    biases = torch.where(q0 == 0, torch.zeros_like(edge), edge)
    q = torch.clamp(torch.round((g - biases) / scales), 0, n_bins).to(torch.int64).reshape(out_f, in_f)
    if 32 % bits == 0:
        per = 32 // bits
        qs = q.numpy().astype(np.uint64).reshape(out_f, -1, per)
        packed = (qs << (bits * np.arange(per, dtype=np.uint64))).sum(-1).astype(np.uint32)
    else:
        bitsarr = ((q.numpy()[:, :, None] >> np.arange(bits)) & 1).reshape(out_f, -1, 32).astype(np.uint64)
        packed = (bitsarr << np.arange(32, dtype=np.uint64)).sum(-1).astype(np.uint32)
    return packed, scales.reshape(out_f, -1).numpy(), biases.reshape(out_f, -1).numpy(), q


ZERO_CENTRED = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                ".q_norm.weight", ".k_norm.weight")


def make_mlx(src_name, src_folder, model, tok):
    """MLX-community layout of `model` (qwen3_5 wrapper config, language_model.model.* weights)."""
    name = "q35_mlx_mixed"
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    special = {"model.embed_tokens": (8, 64), "model.layers.0.linear_attn.in_proj_qkv": (8, 32),
               "model.layers.1.mlp.down_proj": (8, 32)}
    tensors, deq = {}, {}
    for key, w in model.state_dict().items():
        if key == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        module = key[: -len(".weight")] if key.endswith(".weight") else None
        mkey = "language_model." + key  # language_model.model.* / language_model.lm_head.*
        if module and w.dim() == 2 and ("proj" in module or module.endswith("embed_tokens") or module == "lm_head"):
            bits, group = special.get(module, (4, 64))
            packed, scales, biases, q = mlx_quantize(w, bits, group)
            tensors[mkey] = packed
            mmod = mkey[: -len(".weight")]
            tensors[mmod + ".scales"], tensors[mmod + ".biases"] = scales, biases
            deq[key] = (torch.from_numpy(scales).repeat_interleave(group, 1) * q.float()
                        + torch.from_numpy(biases).repeat_interleave(group, 1))
        elif "conv1d.weight" in key:
            tensors[mkey] = w.float().permute(0, 2, 1).contiguous().numpy()  # [C, 1, K] -> [C, K, 1]
        elif any(key.endswith(s) for s in ZERO_CENTRED):
            tensors[mkey] = (w.float() + 1.0).numpy()  # mlx-lm's sanitize: plain RMSNorm weight
        else:
            tensors[mkey] = w.float().numpy()
    np_save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "mlx"})
    text_cfg = json.load(open(os.path.join(src_folder, "config.json")))
    qblock = {"group_size": 64, "bits": 4, "mode": "affine"}
    for module, (bits, group) in special.items():
        qblock["language_model." + module] = {"group_size": group, "bits": bits}
    cfg = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "text_config": text_cfg, "tie_word_embeddings": text_cfg["tie_word_embeddings"],
           "quantization": qblock, "quantization_config": dict(qblock)}
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"), indent=2)
    copy_tokenizer(folder)
    with torch.no_grad():
        for key, w in deq.items():
            model.state_dict()[key].copy_(w)
    prompts = reference(model, tok, folder)
    dump_golden(folder, name, prompts, list(model.config.layer_types), {"quantized_from": src_name})


def main():
    torch.manual_seed(0)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    tok = Tokenizer.from_file(os.path.join(TOK_DIR, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    print(f"tiny tokenizer: vocab {vocab}; transformers {transformers.__version__}; torch {torch.__version__}")
    os.makedirs(OUT, exist_ok=True)
    failed = []
    for i, (name, (over, rope, interval)) in enumerate(VARIANTS.items()):
        if ONLY is not None and name not in ONLY:
            continue
        try:
            folder, model = make_text_variant(name, over, rope, interval, tok, vocab, 3000 + 100 * i)
            if name == "q35_tied_hv2" and (ONLY is None or "q35_mlx_mixed" in ONLY):
                make_mlx(name, folder, model, tok)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    try:
        if ONLY is None or VLM_FROM in ONLY:
            make_vlm(tok, vocab, 5000)
    except Exception:
        traceback.print_exc()
        failed.append(VLM_FROM)
    print("failed:", failed)


if __name__ == "__main__":
    main()
