#!/usr/bin/env python3
"""Diagnosis (GPU machine): transformers bf16 eager, one prompt per model; dumps the input and output
of every submodule of chosen decoder layers (first full-attention layer; for Gemma 4 also layer 0),
the eager attention function's q/k/v/out, the RoPE cos/sin handed to self_attn, the per-layer
input of the layer, the embedding output and the final norm input + logits.
Files: OUT/<model>/meta.json and <key>.bin (float32 of the bf16 values), meta lists key -> shape.
Read by tests/models/cuda_parity_sub_test.cpp (CudaParitySub, HEARTH_CUDA_SUB=DIR).
  python3 tools/cuda_sub_dump.py --out DIR MODEL_DIR...
"""
import argparse
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM


def first_tensor(args, kwargs):
    if args and torch.is_tensor(args[0]):
        return args[0]
    for k in ("hidden_states", "x", "input", "input_ids"):
        if k in kwargs and torch.is_tensor(kwargs[k]):
            return kwargs[k]
    return None


def out_tensor(o):
    if torch.is_tensor(o):
        return o
    if isinstance(o, (tuple, list)) and o and torch.is_tensor(o[0]):
        return o[0]
    if hasattr(o, "logits"):
        return o.logits
    return None


def text_model(model):
    for _, m in model.named_modules():
        if hasattr(m, "layers") and hasattr(m, "embed_tokens") and isinstance(m.layers, torch.nn.ModuleList):
            return m
    raise RuntimeError("no text model found")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    for mdir in a.models:
        name = os.path.basename(mdir.rstrip("/"))
        gold = json.load(open(os.path.join(mdir, "golden.json")))
        ids = gold["prompts"][0]["ids"]
        model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
        tm = text_model(model)
        cfg = tm.config
        types = list(cfg.layer_types)
        full = types.index("full_attention")
        chosen = sorted({full, 0}) if "gemma" in type(tm).__name__.lower() else [full]
        store = {}
        meta = {"model": os.path.abspath(mdir), "ids": ids, "layers": chosen, "tensors": {}}

        def put(key, t):
            if t is None:
                return
            store[key] = t.detach().float().cpu().contiguous()

        hooks = []
        for li in chosen:
            layer = tm.layers[li]
            for sub, mod in layer.named_modules():
                key = f"L{li}.{sub}" if sub else f"L{li}"

                def fh(m, args, kwargs, out, key=key):
                    put(key + ".in", first_tensor(args, kwargs))
                    put(key + ".out", out_tensor(out))

                hooks.append(mod.register_forward_hook(fh, with_kwargs=True))

            def pre_attn(m, args, kwargs, li=li):
                pe = kwargs.get("position_embeddings")
                if pe is not None:
                    put(f"L{li}.cos", pe[0])
                    put(f"L{li}.sin", pe[1])

            hooks.append(layer.self_attn.register_forward_pre_hook(pre_attn, with_kwargs=True))

            def pre_layer(m, args, kwargs, li=li):
                pli = args[1] if len(args) > 1 else kwargs.get("per_layer_input")
                if torch.is_tensor(pli):
                    put(f"L{li}.per_layer_input", pli)

            hooks.append(layer.register_forward_pre_hook(pre_layer, with_kwargs=True))

        def emb_hook(m, args, out):
            put("embed.out", out)

        hooks.append(tm.embed_tokens.register_forward_hook(emb_hook))

        def norm_hook(m, args, out):
            put("norm.in", args[0])
            put("norm.out", out)

        hooks.append(tm.norm.register_forward_hook(norm_hook))

        mod = sys.modules[type(tm.layers[full].self_attn).__module__]
        orig = mod.eager_attention_forward

        def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
            out, w = orig(module, query, key, value, attention_mask, *args, **kwargs)
            li = getattr(module, "layer_idx", -1)
            if li in chosen:
                put(f"L{li}.attn_fn.q", query)
                put(f"L{li}.attn_fn.k", key)
                put(f"L{li}.attn_fn.v", value)
                put(f"L{li}.attn_fn.out", out)
                if attention_mask is not None:
                    put(f"L{li}.attn_fn.mask", attention_mask)
                meta.setdefault("scaling", {})[str(li)] = float(kwargs.get("scaling", -1.0))
            return out, w

        mod.eager_attention_forward = wrapped
        try:
            with torch.no_grad():
                o = model(torch.tensor([ids], device="cuda"), use_cache=False)
            put("logits", o.logits)
        finally:
            mod.eager_attention_forward = orig
            for h in hooks:
                h.remove()
        folder = os.path.join(a.out, name)
        os.makedirs(folder, exist_ok=True)
        for k, t in store.items():
            t.numpy().astype("<f4").tofile(os.path.join(folder, k + ".bin"))
            meta["tensors"][k] = list(t.shape)
        json.dump(meta, open(os.path.join(folder, "meta.json"), "w"), indent=1)
        print(f"[sub-dump] {name} layers {chosen}: {len(store)} tensors; gelu act = "
              f"{[type(m).__name__ for n, m in tm.layers[0].named_modules() if 'act' in n][:2]}")
        del model


if __name__ == "__main__":
    main()
