"""Flash against cuDNN for a prompt's causal attention with the 8B shape's heads (32 query heads, 8
kv heads, head dim 128, bf16, SDPA with enable_gqa; cuDNN also with the keys repeated): the first
call of each prompt length (cuDNN plans a new shape) and the steady time per call, with the TFLOP/s
of the causal half. Which backend a long prefill should take, and what a new length costs.
Usage (GPU): python3 bench/sdpa_prefill_backends.py"""
import contextlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def per_call_ms(fn, n=20):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    for T in (512, 1024, 2048, 4096, 8192, 4000, 4001):
        q = torch.randn(1, 32, T, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 8, T, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        kr, vr = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
        row = {"T": T}
        cases = (("flash", SDPBackend.FLASH_ATTENTION, True), ("cudnn", SDPBackend.CUDNN_ATTENTION, True),
                 ("cudnn_rep", SDPBackend.CUDNN_ATTENTION, False), ("default", None, True))
        for name, backend, gqa in cases:
            with sdpa_kernel([backend]) if backend else contextlib.nullcontext():
                if gqa:
                    f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
                else:
                    f = lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True)  # noqa: E731
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                try:
                    f()
                    torch.cuda.synchronize()
                except RuntimeError as e:
                    row[name] = str(e)[:80]
                    continue
                row[name + "_first_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
                row[name + "_ms"] = round(per_call_ms(f), 4)
        flops = 4 * T * T * 128 * 32 / 2
        for name in ("flash", "cudnn"):
            if name + "_ms" in row:
                row[name + "_tflops"] = round(flops / row[name + "_ms"] / 1e9, 1)
        print(row, flush=True)


if __name__ == "__main__":
    main()
