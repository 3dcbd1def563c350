#!/usr/bin/env python3
"""Random-weight model folders with the real shapes of public checkpoints, for benchmarks (no
download needed). Writes an HF folder (config.json, safetensors, generation_config.json) with the
tiny test tokenizer's files copied in (512 ids: most generated ids decode to no text, so a server's
time to first token cannot be timed on it; for that, --vocab-size 32000 --tokenizer DIR with
llama2's tokenizer files gives a model whose every token is text).

  python3 tools/make_random_model.py --shape llama-3.2-1b --out /tmp/l1b [--dtype bfloat16] [--mlx-q4]
                                     [--layers N] [--vocab-size V --tokenizer DIR]
Shapes: llama-3.2-1b, llama-3.1-8b, qwen3.5-0.8b (Qwen3.5-0.8B's text model: 24 layers, 3 linear :
1 full), gemma4-e4b (Gemma 4 e4b's text model: 42 layers, 5 sliding : 1 full, 18 KV-shared layers,
per-layer inputs of 256). --mlx-q4 also writes OUT-mlx4 (MLX affine 4-bit, group 64).
"""
import argparse
import json
import os
import shutil

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                         max_position_embeddings=131072, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
                         max_position_embeddings=131072, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}),
    # Qwen/Qwen3.5-0.8B's text_config (random weights).
    "qwen3.5-0.8b": dict(model_type="qwen3_5_text", hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                         layer_types=["linear_attention"] * 3 + ["full_attention"],  # repeated below
                         num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                         linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                         linear_value_head_dim=128, linear_conv_kernel_dim=4, vocab_size=248320,
                         tie_word_embeddings=True, max_position_embeddings=262144, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                          "partial_rotary_factor": 0.25}),
    # google/gemma-4-e4b's text_config as mlx-bun's inventory describes it (random weights).
    "gemma4-e4b": dict(model_type="gemma4_text", hidden_size=2560, intermediate_size=10240, num_hidden_layers=42,
                       layer_types=["sliding_attention"] * 5 + ["full_attention"],  # repeated below
                       num_attention_heads=8, num_key_value_heads=2, head_dim=256, global_head_dim=512,
                       num_kv_shared_layers=18, hidden_size_per_layer_input=256, vocab_size=262144,
                       vocab_size_per_layer_input=262144, sliding_window=512, final_logit_softcapping=30.0,
                       hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, attention_k_eq_v=False,
                       use_double_wide_mlp=False, max_position_embeddings=131072, rms_norm_eps=1e-6,
                       rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                           "rope_theta": 1000000.0}}),
}


def make_config(shape):
    kw = dict(SHAPES[shape])
    model_type = kw.pop("model_type", "llama")
    if "layer_types" in kw:
        kw["layer_types"] = (kw["layer_types"] * kw["num_hidden_layers"])[: kw["num_hidden_layers"]]
    return AutoConfig.for_model(model_type, bos_token_id=1, eos_token_id=0, pad_token_id=0, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=SHAPES)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mlx-q4", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0,
                    help="keep only the first N decoder layers (a slice of the shape, e.g. to measure one layer's memory)")
    ap.add_argument("--vocab-size", type=int, default=0,
                    help="override the shape's vocabulary (e.g. 32000 with --tokenizer of llama2, so that every "
                         "generated token decodes to text and a server's time to first token can be measured)")
    ap.add_argument("--tokenizer", default=None,
                    help="folder whose tokenizer files are copied into OUT (default tests/golden/tokenizer/tiny)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = make_config(a.shape)
    if a.vocab_size > 0:
        cfg.vocab_size = a.vocab_size
    if a.layers > 0:
        cfg.num_hidden_layers = a.layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[: a.layers]
    dtype = getattr(torch, a.dtype)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight") or name.endswith("layer_scalar"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.normal_(0.0, 0.02)
    model.save_pretrained(a.out, safe_serialization=True)
    tok = a.tokenizer or os.path.join(ROOT, "tests", "golden", "tokenizer", "tiny")
    for f in os.listdir(tok):
        if f.startswith("tokenizer") or f == "special_tokens_map.json":
            shutil.copy(os.path.join(tok, f), a.out)
    if a.mlx_q4:
        from gen_tiny_models import mlx_quantize  # same quantizer the goldens use
        from safetensors.numpy import save_file
        qout = a.out.rstrip("/") + "-mlx4"
        os.makedirs(qout, exist_ok=True)
        tensors = {}
        for key, w in model.state_dict().items():
            module = key[:-7] if key.endswith(".weight") else None
            if key == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            if module and w.dim() == 2 and w.shape[1] % 64 == 0:
                packed, scales, biases, _ = mlx_quantize(w.float(), 4, 64)  # on the GPU when there is one
                tensors[key] = packed
                tensors[module + ".scales"] = torch.from_numpy(scales).to(dtype).float().numpy()
                tensors[module + ".biases"] = torch.from_numpy(biases).to(dtype).float().numpy()
            else:
                tensors[key] = w.float().cpu().numpy()
        save_file(tensors, os.path.join(qout, "model.safetensors"), metadata={"format": "mlx"})
        c = json.load(open(os.path.join(a.out, "config.json")))
        c["quantization"] = c["quantization_config"] = {"group_size": 64, "bits": 4, "mode": "affine"}
        json.dump(c, open(os.path.join(qout, "config.json"), "w"), indent=2)
        for f in os.listdir(a.out):
            if not f.endswith(".safetensors") and f != "config.json":
                shutil.copy(os.path.join(a.out, f), qout)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
