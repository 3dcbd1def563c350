#!/usr/bin/env python3
"""Checks that peft loads Hearth-saved PEFT adapters and computes Hearth's logits with them.

1. HEARTH_PEFT_CHECK_OUT=/tmp/peft_check build/hearth_tests --gtest_filter=AdapterFormat.ExportForPeftCheck
   (writes /tmp/peft_check/<name>/ adapters for tests/golden/models/llama_mha and logits.safetensors)
2. python3 tools/check_peft_load.py /tmp/peft_check
For each adapter: PeftModel.from_pretrained on the tiny model (CPU fp32, eager attention), the
number of LoRA modules peft built must equal the adapter's, and logits must match within 1e-4.
Exit status 0 when every adapter passes.
"""
import os
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "golden", "models", "llama_mha")


def main():
    out = sys.argv[1]
    logits = load_file(os.path.join(out, "logits.safetensors"))
    ids = logits.pop("input_ids")
    ok = True
    for name, ref in sorted(logits.items()):
        base = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager")
        model = PeftModel.from_pretrained(base, os.path.join(out, name)).eval()
        with torch.no_grad():
            got = model(input_ids=ids).logits
        saved = load_file(os.path.join(out, name, "adapter_model.safetensors"))
        built = sum(1 for k, _ in model.named_parameters() if k.endswith("lora_A.default.weight"))
        diff = (got - ref).abs().max().item()
        passed = diff < 1e-4 and built == len(saved) // 2
        ok &= passed
        print(f"{name}: max |logits diff| {diff:.3e}, lora modules built {built} / saved {len(saved) // 2}: "
              f"{'ok' if passed else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
