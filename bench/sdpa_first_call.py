"""How long PyTorch's scaled_dot_product_attention takes the first time it meets a shape, against
the same shape again: a serving prefill meets new (rows, prompt length) shapes all the time.
Shapes like a Llama-3.2-1B prefill (32 heads of 64, keys repeated to the query heads), bf16, an
additive float mask [B, 1, T, S] as Hearth passes for padded rows. Usage (GPU): python3 bench/sdpa_first_call.py"""
import time

import torch
import torch.nn.functional as F


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t)


def main():
    b = torch.backends.cuda
    print(f"torch {torch.__version__}; sdp enabled: cudnn {b.cudnn_sdp_enabled()} flash {b.flash_sdp_enabled()} "
          f"mem_efficient {b.mem_efficient_sdp_enabled()} math {b.math_sdp_enabled()}")
    dev, dt = "cuda", torch.bfloat16
    for cudnn in (True, False):
        b.enable_cudnn_sdp(cudnn)
        for B, T in [(1, 16), (3, 17), (8, 15), (14, 18), (14, 16), (5, 19), (1, 128), (4, 512), (3, 17)]:
            q = torch.randn(B, 32, T, 64, device=dev, dtype=dt)
            k = torch.randn(B, 32, T, 64, device=dev, dtype=dt)
            v = torch.randn(B, 32, T, 64, device=dev, dtype=dt)
            m = torch.zeros(B, 1, T, T, device=dev, dtype=dt).masked_fill(
                torch.ones(T, T, device=dev, dtype=torch.bool).triu(1), float("-inf"))
            choice = torch._fused_sdp_choice(q, k, v, m) if hasattr(torch, "_fused_sdp_choice") else "?"
            first = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
            again = min(timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m)) for _ in range(5))
            print(f"cudnn {'on ' if cudnn else 'off'} B={B:2d} T={T:3d} backend={choice} first {first:8.2f} ms, again {again:6.3f} ms")


if __name__ == "__main__":
    main()
