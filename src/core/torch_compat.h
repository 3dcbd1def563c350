// The one place where PyTorch version differences live (Debian libtorch 1.13 on CPU machines,
// PyTorch 2.x + CUDA on the GPU machine). Code elsewhere calls these helpers and never tests
// TORCH_VERSION_* itself.
#pragma once
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <string>

namespace hearth::compat {

/// True when this build's libtorch provides at::scaled_dot_product_attention (PyTorch >= 2.1, with `scale`).
constexpr bool kHasSdpa = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1);

/// True when SDPA takes `enable_gqa` (PyTorch >= 2.5): k/v with fewer heads than q, read in place.
constexpr bool kHasSdpaGqa = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5);

/// at::scaled_dot_product_attention(q, k, v, mask, 0.0, is_causal, scale, enable_gqa) on PyTorch >= 2.1;
/// q [B, H, T, D], k/v [B, H, S, D] (heads already repeated), or with enable_gqa k/v [B, Hkv, S, D]
/// (H % Hkv == 0, q head h reads kv head h / (H / Hkv), as repeat_kv would lay them out); mask bool
/// (true = attend) or additive float, broadcastable to [B, H, T, S]. A call that records no autograd
/// leaves SDPA's cuDNN backend out (it plans each new shape for 40-760 ms on the H200; see the .cpp),
/// unless sdpa_cudnn_for_inference() or `keep_cudnn` (the caller's reference ops: a training
/// run's forwards without a graph must take the kernel their recomputation takes). Throws
/// hearth::Error on builds without SDPA, or with enable_gqa on builds without it (kHasSdpaGqa false).
at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& mask,
                bool is_causal, double scale, bool enable_gqa = false, bool keep_cudnn = false);

/// Causal attention of a chunk's T queries over S >= T keys aligned lower-right (query i sits at key
/// position S - T + i, as in a chunked prefill after S - T cached tokens) by PyTorch's flash kernel
/// (at::_flash_attention_forward, PyTorch >= 2.5): q [B, H, T, D], k/v [B, Hkv, S, D] with H % Hkv
/// == 0 read in place (GQA), no mask tensor → [B, H, T, D]. SDPA's is_causal aligns upper-left, so
/// without this a later chunk takes an explicit [T, S] mask and the memory-efficient kernel (which
/// has no GQA: repeated keys/values). The alignment is torch.nn.attention.bias.causal_lower_right's.
/// Undefined tensor where it does not apply: older builds, not CUDA, not bf16/fp16, head dim over
/// 256 or not a multiple of 8, a last dim not contiguous, or T > S.
at::Tensor flash_causal_lower_right(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

/// Whether sdpa lets inference calls use cuDNN's backend too (PyTorch's own choice, as transformers
/// gets it: what bit-identical parity with its SDPA runs needs). Off by default (the per-shape
/// planning above); HEARTH_SDPA_CUDNN=1 turns it on for the process, set_sdpa_cudnn_for_inference
/// at run time (returns the previous setting; process-wide).
bool sdpa_cudnn_for_inference();
bool set_sdpa_cudnn_for_inference(bool on);

/// One at::_fused_adamw_ (multi-tensor AdamW, PyTorch >= 2.4) over same-device, same-dtype lists;
/// `steps` are float32 scalars on that device, already incremented. Returns false, touching nothing,
/// on builds without it (the caller then loops). Throws what the kernel throws.
bool fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList steps, double lr, double beta1, double beta2, double weight_decay, double eps);

/// True when the build links CUDA-enabled Torch and a CUDA device is present at run time.
bool cuda_available();

/// Peak bytes allocated on `device` since the last reset (CUDA: caching allocator's peak;
/// CPU: the process's peak resident set size, from /proc/self/status VmHWM). 0 if unknown.
int64_t peak_memory_bytes(const at::Device& device);

/// Resets the CUDA allocator's peak counter (no-op on CPU).
void reset_peak_memory(const at::Device& device);

/// Bytes currently allocated by the CUDA caching allocator on `device` (CPU: bytes malloc has
/// handed out and not had back, from glibc's mallinfo2 — not RSS, which keeps freed memory).
int64_t active_memory_bytes(const at::Device& device);

/// Waits for all queued work on `device` (CUDA synchronize; no-op on CPU).
void synchronize(const at::Device& device);

/// Runs `work` under PyTorch's Kineto profiler with its host ops and, on CUDA, its GPU kernels and
/// copies (CUPTI), and saves the Chrome trace to `path` (written beside it, then renamed over it).
/// Returns false, running nothing, where that profiler is not available here (PyTorch < 2.5 or a
/// build without CUDA): the caller then traces the host alone. Throws what `work` throws (the
/// profiler stopped, nothing saved) or hearth::Error when the trace cannot be written.
bool trace_with_kernels(const std::string& path, const std::function<void()>& work);

/// "2.11.0" / "1.13.1": the libtorch version this binary was built against.
std::string torch_version();

}  // namespace hearth::compat
