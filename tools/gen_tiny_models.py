#!/usr/bin/env python3
"""Tiny random-weight llama-family models + reference outputs from `transformers` (CPU, fp32, eager).

Writes tests/golden/models/<variant>/: an HF model folder (config.json, model.safetensors,
generation_config.json, tokenizer files) and golden.json:
  {"variant", "transformers_version", "config_style": "4.x"|"5.x", "prompts": [{"text", "ids",
   "logits": "<file>.bin" (raw little-endian float32 [T, V], every prompt position),
   "greedy_ids": [32 ids: greedy continuation with the KV cache], "min_gap": smallest top1-top2
   logit gap seen along the greedy path}]}
Also writes the tiny byte-level BPE tokenizer they share to tests/golden/tokenizer/tiny/.
The "mlx_q4" variant is an MLX affine 4-bit (group 64) copy of "llama_gqa_tied" with
model.layers.0.mlp.down_proj at 8-bit (group 32); its reference runs transformers on the
dequantized weights (w = scales * q + biases), i.e. on exactly what the packed codes mean.
Run where transformers + tokenizers are installed (the GPU machine): python3 tools/gen_tiny_models.py
Regenerating changes every golden: only do it on purpose, and commit the result whole.
"""
import json
import os
import shutil

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file as np_save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "models")
TOK_DIR = os.path.join(ROOT, "tests", "golden", "tokenizer", "tiny")
N_GREEDY = 32
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away, there lived a curious little robot who loved to read books about the stars.",
]
TRAIN_TEXT = """The quick brown fox jumps over the lazy dog. Once upon a time there was a robot.
It loved to read books about the stars, the moon, and the sun. Every night it looked up at the sky.
In a land far away, curious people built machines that could talk, write and think.
Language models predict the next token from the tokens before it. Tokens are pieces of words.
def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5
Numbers like 1, 2, 3, 42, 1999 and 3.14 appear in text. Café, naïve, résumé: accents too.
She said: "Don't stop!" They're here; we've seen it; I'll go. It's fine, isn't it?
The history of computing starts with mechanical calculators and ends with tiny chips.
""" * 3


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, min_frequency=1, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|bos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN_TEXT.splitlines(), trainer=trainer)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B",
                                                       special_tokens=[("<|bos|>", bos)])
    os.makedirs(TOK_DIR, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|endoftext|>")
    fast.save_pretrained(TOK_DIR)
    return tok


BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=0)

# name: (model_type, overrides, rope_parameters, config style written to config.json)
VARIANTS = {
    "llama_mha": ("llama", {}, {"rope_type": "default", "rope_theta": 10000.0}, "4.x"),
    "llama_gqa_tied": ("llama", {"num_key_value_heads": 2, "tie_word_embeddings": True},
                       {"rope_type": "default", "rope_theta": 10000.0}, "5.x"),
    "llama_mqa": ("llama", {"num_key_value_heads": 1}, {"rope_type": "default", "rope_theta": 10000.0}, "4.x"),
    "llama_bias": ("llama", {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 2},
                   {"rope_type": "default", "rope_theta": 10000.0}, "4.x"),
    "qwen2": ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": True},
              {"rope_type": "default", "rope_theta": 1000000.0}, "4.x"),
    "qwen3": ("qwen3", {"num_key_value_heads": 2, "head_dim": 32},
              {"rope_type": "default", "rope_theta": 1000000.0}, "5.x"),
    "mistral_swa": ("mistral", {"num_key_value_heads": 2, "sliding_window": 8},
                    {"rope_type": "default", "rope_theta": 10000.0}, "4.x"),
    "rope_linear": ("llama", {}, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, "4.x"),
    "rope_dynamic": ("llama", {"max_position_embeddings": 24},
                     {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, "4.x"),
    "rope_llama3": ("llama", {"num_key_value_heads": 2},
                    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, "5.x"),
    "rope_yarn": ("llama", {"max_position_embeddings": 128},
                  {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                   "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0}, "4.x"),
}


def make_config(model_type, overrides, rope, vocab):
    kw = dict(BASE)
    kw.update(overrides)
    kw["vocab_size"] = vocab
    kw["rope_parameters"] = dict(rope)
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                std = 0.2 if ("embed" in name or "lm_head" in name) else 0.15
                p.copy_(std * torch.randn(p.shape, generator=g))


def to_4x_style(path):
    """Rewrite config.json's rope_parameters as transformers 4.x's rope_theta + rope_scaling."""
    cfg = json.load(open(path))
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp["rope_theta"]
    rest = {k: v for k, v in rp.items() if k != "rope_theta"}
    if rest.get("rope_type", "default") != "default":
        rest["type"] = rest["rope_type"]  # 4.x checkpoints carry both keys
        cfg["rope_scaling"] = rest
    else:
        cfg["rope_scaling"] = None
    json.dump(cfg, open(path, "w"), indent=2)


@torch.no_grad()
def reference(model, tok, folder):
    prompts = []
    for i, text in enumerate(PROMPTS):
        ids = tok.encode(text, add_special_tokens=True).ids
        x = torch.tensor([ids])
        out = model(x, use_cache=True)
        logits = out.logits[0].float().numpy().astype("<f4")
        fname = f"prompt{i}_logits.bin"
        logits.tofile(os.path.join(folder, fname))
        past = out.past_key_values
        last = out.logits[0, -1]
        greedy, gaps = [], []
        for _ in range(N_GREEDY):
            top2 = torch.topk(last, 2).values
            gaps.append(float(top2[0] - top2[1]))
            nxt = int(torch.argmax(last))
            greedy.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            last = out.logits[0, -1]
        prompts.append({"text": text, "ids": ids, "logits": fname, "greedy_ids": greedy, "min_gap": min(gaps)})
    return prompts


def mlx_quantize(w, bits, group):
    """mlx.core.quantize (affine): returns (packed uint32 [out, in*bits/32], scales, biases) as numpy."""
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
    # little-endian bit stream: bit j of element i lands at stream bit i*bits + j
    # (integer ops and IEEE fp32 arithmetic: the same bits on a CUDA w as on the CPU, only faster)
    if 32 % bits == 0:  # whole values per word: element k of a word sits at bits*k
        per = 32 // bits
        shifts = bits * torch.arange(per, dtype=torch.int64, device=q.device)
        packed = (q.reshape(out_f, -1, per) << shifts).sum(-1).cpu().numpy().astype(np.uint32)
    else:
        q_np = q.cpu().numpy()
        bitsarr = ((q_np[:, :, None] >> np.arange(bits)) & 1).reshape(out_f, -1, 32).astype(np.uint64)
        packed = (bitsarr << np.arange(32, dtype=np.uint64)).sum(-1).astype(np.uint32)
    return (packed, scales.reshape(out_f, -1).cpu().numpy(), biases.reshape(out_f, -1).cpu().numpy(),
            q.cpu())


def make_mlx_q4(src_folder, model, tok):
    name = "mlx_q4"
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    special = {"model.layers.0.mlp.down_proj": (8, 32)}
    tensors, deq = {}, {}
    sd = model.state_dict()
    for key, w in sd.items():
        module = key[: -len(".weight")] if key.endswith(".weight") else None
        if module and w.dim() == 2 and (module.endswith("_proj") or module.endswith("embed_tokens")):
            bits, group = special.get(module, (4, 64))
            packed, scales, biases, q = mlx_quantize(w, bits, group)
            tensors[key], tensors[module + ".scales"], tensors[module + ".biases"] = packed, scales, biases
            deq[key] = (torch.from_numpy(scales).repeat_interleave(group, 1) * q.float()
                        + torch.from_numpy(biases).repeat_interleave(group, 1))
        elif key == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        else:
            tensors[key] = w.float().numpy()
    np_save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "mlx"})
    cfg = json.load(open(os.path.join(src_folder, "config.json")))
    qblock = {"group_size": 64, "bits": 4, "mode": "affine",
              "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}}
    cfg["quantization"] = qblock
    cfg["quantization_config"] = dict(qblock)
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"), indent=2)
    for f in os.listdir(src_folder):
        if f.startswith("tokenizer") or f in ("generation_config.json", "special_tokens_map.json"):
            shutil.copy(os.path.join(src_folder, f), folder)
    with torch.no_grad():
        for key, w in deq.items():
            model.state_dict()[key].copy_(w)
    prompts = reference(model, tok, folder)
    json.dump({"variant": name, "transformers_version": transformers.__version__, "config_style": "5.x",
               "quantized_from": "llama_gqa_tied", "prompts": prompts},
              open(os.path.join(folder, "golden.json"), "w"), indent=1)
    print(f"{name}: min greedy gap {min(p['min_gap'] for p in prompts):.4f}")


def main():
    torch.manual_seed(0)
    tok = train_tokenizer()
    vocab = tok.get_vocab_size()
    print(f"tiny tokenizer: vocab {vocab}; transformers {transformers.__version__}")
    os.makedirs(OUT, exist_ok=True)
    for seed, (name, (mtype, over, rope, style)) in enumerate(VARIANTS.items()):
        folder = os.path.join(OUT, name)
        shutil.rmtree(folder, ignore_errors=True)
        cfg = make_config(mtype, over, rope, vocab)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
        init_weights(model, 1000 + seed)
        model.save_pretrained(folder, safe_serialization=True)
        for f in os.listdir(TOK_DIR):
            shutil.copy(os.path.join(TOK_DIR, f), folder)
        if style == "4.x":
            to_4x_style(os.path.join(folder, "config.json"))
        # the written config must read back (both styles) to the same rope parameters
        back = AutoConfig.from_pretrained(folder)
        assert back.rope_parameters["rope_type"] == rope["rope_type"], (name, back.rope_parameters)
        assert abs(back.rope_parameters["rope_theta"] - rope["rope_theta"]) < 1e-9, (name, back.rope_parameters)
        reloaded = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                        dtype=torch.float32).eval()
        prompts = reference(reloaded, tok, folder)
        json.dump({"variant": name, "transformers_version": transformers.__version__, "config_style": style,
                   "prompts": prompts}, open(os.path.join(folder, "golden.json"), "w"), indent=1)
        print(f"{name}: {mtype} {style} min greedy gap {min(p['min_gap'] for p in prompts):.4f}")
        if name == "llama_gqa_tied":
            make_mlx_q4(folder, reloaded, tok)


if __name__ == "__main__":
    main()
