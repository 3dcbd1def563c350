// Training losses: token-mean cross-entropy over supervised positions, computed in chunks of
// positions so the [T, V] logits and their gradient are never whole in memory. Not the
// optimizer or the backward driver (segmented.h).
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace hearth::train {

/// Label value of a position that carries no loss (prompt, padding), as in transformers.
constexpr int64_t kIgnoreIndex = -100;

/// Next-token targets from labels: targets[b, t] = labels[b, t + 1], and kIgnoreIndex at the last
/// position. labels [B, T] int64 (kIgnoreIndex where unsupervised) → [B, T] int64. This is the
/// shift transformers' ForCausalLMLoss applies.
at::Tensor shift_labels(const at::Tensor& labels);

/// What the loss head's vector-Jacobian product returns.
struct HeadVjp {
  double loss_sum = 0.0;  // Σ CE over supervised positions (fp64 accumulation of fp32 chunk sums); 0 when deferred
  at::Tensor loss;        // the same Σ as a 0-dim fp64 tensor on hidden's device (set by the CE heads; may be undefined)
  int64_t n_tokens = 0;   // number of supervised positions
  at::Tensor grad_hidden; // [B, T, C], d(scale · Σ CE)/d hidden, dtype of hidden
};

/// Runs `head` (hidden [B, t, C] → logits [B, t, V]) over `hidden` [B, T, C] in chunks of
/// `chunk` positions, each chunk with its own small autograd graph: logits are upcast to at least fp32,
/// CE = logsumexp(logits) − logits[target] at positions whose target ≠ kIgnoreIndex, and the chunk's
/// VJP is taken at once (the chunk's logits are freed before the next chunk). `targets` [B, T] int64
/// are already shifted (see shift_labels). The gradient of scale · Σ CE flows to the returned
/// grad_hidden and is ADDED to `.grad` of each tensor in `head_params` (trainable head weights;
/// may be empty). `hidden` should be a detached tensor (a segment boundary). With `targets` on the
/// CPU the token counts need no device sync; `defer_loss` also leaves loss_sum at 0 (read
/// HeadVjp::loss when needed), so the call never waits for the device. Throws hearth::Error on
/// shape mismatch or chunk < 1.
HeadVjp chunked_cross_entropy_vjp(const at::Tensor& hidden, const at::Tensor& targets,
                                  const std::function<at::Tensor(const at::Tensor&)>& head, int64_t chunk,
                                  double scale, const std::vector<at::Tensor>& head_params = {},
                                  bool defer_loss = false);

/// `t` on `device`; a CPU tensor going to CUDA is staged in pinned memory and copied without
/// blocking the host (a pageable copy would wait for the device's queue). Other moves: t.to(device).
at::Tensor to_device_async(const at::Tensor& t, const at::Device& device);

/// Forward only (evaluation): Σ CE and count over supervised positions, chunked, no graph.
HeadVjp chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& targets,
                              const std::function<at::Tensor(const at::Tensor&)>& head, int64_t chunk);

}  // namespace hearth::train
