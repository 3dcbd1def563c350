#!/usr/bin/env python3
"""Float64 reference logits for the tiny Qwen3.5 and Gemma 4 goldens: how far transformers' own fp32
result is from the exact answer, so a parity test can tell Hearth's rounding from a real difference.

For each golden model folder given (default: every tests/golden/models/qwen3_5/* and gemma4_*), the
same transformers 5.17 module that made golden.json runs in float64 on the same weights (an MLX copy:
the fp32 dequantized weights of its `quantized_from` source, as its generator used) over the same
prompt ids, and writes beside golden.json:
  prompt<i>_logits_exact.bin   raw little-endian float32 [T, V]: the float64 logits rounded once
  exact.json                   {"transformers_version", "torch_version", "prompts": [{"logits_exact",
                                "fp32_vs_exact": max |golden fp32 logits - exact|}]}
Run where transformers 5.x is installed (the GPU machine's CPU):
  python3 tools/gen_exact_logits.py [folder ...]
Regenerating rewrites these files only (golden.json and the fp32 logits are left as they are).
"""
import glob
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file as np_load_file
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class Float64Everywhere(TorchDispatchMode):
    """Every ATen op in float64: the modeling code's explicit fp32 casts (`.float()`, `.to(torch.float32)`,
    softmax(dtype=float32), fp32 factories in the delta rule and the norms) are turned into float64,
    so nothing of the forward rounds to fp32. Counts what it had to promote."""

    def __init__(self):
        super().__init__()
        self.promoted = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
            self.promoted += 1

        def up(a):
            if isinstance(a, torch.Tensor) and a.dtype == torch.float32:
                self.promoted += 1
                return a.double()
            if isinstance(a, (list, tuple)):
                return type(a)(up(x) for x in a)
            return a

        if func._schema.name.endswith("_") or any(r.alias_info is not None and r.alias_info.is_write for r in func._schema.arguments):
            return func(*args, **kwargs)  # in-place: the target is float64 already (model.double())
        return func(*up(args), **{k: up(v) for k, v in kwargs.items()})


def model_class(cfg):
    mt = cfg.get("model_type")
    if mt == "qwen3_5":
        from transformers import Qwen3_5ForConditionalGeneration
        return Qwen3_5ForConditionalGeneration
    if mt == "gemma4":
        from transformers import Gemma4ForConditionalGeneration
        return Gemma4ForConditionalGeneration
    if mt == "gemma4_text":
        from transformers import Gemma4ForCausalLM
        return Gemma4ForCausalLM
    return AutoModelForCausalLM


def load(folder, dtype):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    return model_class(cfg).from_pretrained(folder, attn_implementation="eager", dtype=dtype).eval()


def unpack(packed, bits, in_features):
    """MLX affine codes [out, in] from the packed uint32 rows (code k at bits [k*bits, (k+1)*bits))."""
    p = packed.astype(np.uint64)
    per = 32 // bits
    shifts = (bits * np.arange(per, dtype=np.uint64))
    codes = (p[:, :, None] >> shifts) & np.uint64((1 << bits) - 1)
    return torch.from_numpy(codes.reshape(p.shape[0], -1)[:, :in_features].astype(np.int64))


def dequantized_model(folder, golden):
    """The quantized folder's source model with the dequantized weights its generator computed (fp32)."""
    src = os.path.join(os.path.dirname(folder), golden["quantized_from"])
    model = load(src, torch.float32)
    qcfg = json.load(open(os.path.join(folder, "config.json")))["quantization"]
    tensors = np_load_file(os.path.join(folder, "model.safetensors"))
    sd = model.state_dict()
    done = 0
    with torch.no_grad():
        for key, arr in tensors.items():
            if not key.endswith(".weight") or arr.dtype != np.uint32:
                continue
            module = key[: -len(".weight")]
            over = qcfg.get(module, {})
            bits, group = over.get("bits", qcfg["bits"]), over.get("group_size", qcfg["group_size"])
            scales = torch.from_numpy(tensors[module + ".scales"]).float()
            biases = torch.from_numpy(tensors[module + ".biases"]).float()
            in_features = scales.shape[1] * group
            q = unpack(arr, bits, in_features)
            w = scales.repeat_interleave(group, 1) * q.float() + biases.repeat_interleave(group, 1)
            target = key[len("language_model."):] if key.startswith("language_model.") else key
            sd[target].copy_(w)
            done += 1
    assert done > 0, folder
    return model


@torch.no_grad()
def run(folder):
    golden = json.load(open(os.path.join(folder, "golden.json")))
    model = dequantized_model(folder, golden) if "quantized_from" in golden else load(folder, torch.float32)
    model = model.double()
    out = {"transformers_version": transformers.__version__, "torch_version": torch.__version__, "prompts": []}
    for i, p in enumerate(golden["prompts"]):
        ids = p["ids"]
        mode = Float64Everywhere()
        with mode:
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        assert logits.dtype == torch.float64, logits.dtype
        logits = logits.numpy()
        exact32 = logits.astype("<f4")
        fname = f"prompt{i}_logits_exact.bin"
        exact32.tofile(os.path.join(folder, fname))
        fp32 = np.fromfile(os.path.join(folder, p["logits"]), dtype="<f4").reshape(logits.shape)
        err = float(np.abs(fp32.astype(np.float64) - logits).max())
        out["prompts"].append({"logits_exact": fname, "fp32_vs_exact": err, "promoted_ops": mode.promoted})
    json.dump(out, open(os.path.join(folder, "exact.json"), "w"), indent=1)
    print(f"{os.path.relpath(folder, ROOT)}: transformers fp32 vs float64, max |d| per prompt "
          f"{[round(p['fp32_vs_exact'], 7) for p in out['prompts']]}", flush=True)


def main():
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    folders = sys.argv[1:] or sorted(
        glob.glob(os.path.join(ROOT, "tests/golden/models/qwen3_5/*/")) +
        glob.glob(os.path.join(ROOT, "tests/golden/models/gemma4_*/")))
    folders = [f.rstrip("/") for f in folders if os.path.exists(os.path.join(f, "golden.json"))]
    # Sources before their quantized copies (a copy reads its source's config and weights).
    folders.sort(key=lambda f: "quantized_from" in json.load(open(os.path.join(f, "golden.json"))))
    for f in folders:
        run(f)


if __name__ == "__main__":
    main()
