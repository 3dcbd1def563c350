// The optimizer side of training: learning-rate schedules, global-norm gradient clipping, and
// AdamW over named parameters (PyTorch's fused multi-tensor kernel where the build has it, else
// libtorch's per-tensor math) with its state saved to / restored from safetensors.
// Not the trainer loop (trainer.h) or the mixed-precision masters (mixed_precision.h).
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hearth::train {

/// Learning-rate schedule over optimizer steps 1..total.
struct Schedule {
  enum class Kind { kConstant, kCosine };
  Kind kind = Kind::kConstant;
  double peak = 1e-5;     // learning rate after warmup
  int64_t warmup = 0;     // linear warmup steps: lr(s) = peak · s / warmup for s <= warmup
  int64_t total = 1;      // steps of the whole run (cosine reaches min_lr at total)
  double min_lr = 0.0;    // cosine floor
  /// Learning rate of optimizer step `step` (1-based). Warmup: peak · step / warmup. Cosine after
  /// warmup, with k = step − warmup − 1: min + ½(peak − min)(1 + cos(π · k / max(total − warmup, 1)))
  /// (mlx's cosine_decay joined after a linear warmup, as mlx-lm's build_schedule; mlx counts
  /// steps from 0, so its first warmup step has lr 0 where ours has peak / warmup).
  double lr(int64_t step) const;
  /// Parses "constant" / "cosine"; throws hearth::Error naming the flag otherwise.
  static Kind parse(const std::string& name);
};

/// Scales every defined .grad of `params` by min(1, max_norm / ‖g‖₂) with ‖g‖₂ over all of them
/// together (fp64 accumulation). Returns the norm before clipping. max_norm <= 0: no clipping.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

/// As clip_grad_norm, without waiting for the device: the norm comes back as a 0-dim fp64 tensor
/// on the gradients' device and the scale min(1, max_norm / (‖g‖₂ + 1e-6)) is applied there
/// (torch.nn.utils.clip_grad_norm_'s form). Undefined tensor when no parameter has a gradient.
at::Tensor clip_grad_norm_async(const std::vector<at::Tensor>& params, double max_norm);

/// AdamW hyper-parameters (PyTorch defaults; weight decay decoupled: p ← p − lr·wd·p).
struct AdamWConfig {
  double lr = 1e-5;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  /// Use at::_fused_adamw_ (one kernel for all tensors of a device and dtype) when the build
  /// has it (PyTorch >= 2.4); otherwise, or when false, libtorch AdamW's per-tensor ops.
  bool fused = true;
};

/// AdamW over named trainable leaves, with named state I/O. The per-tensor path does exactly
/// torch::optim::AdamW's ops (p ← p(1 − lr·wd); m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
/// p ← p − lr/(1−β₁ᵗ) · m / (√v / √(1−β₂ᵗ) + ε)); the fused kernel is the same update within
/// float rounding. State tensors have the parameter's dtype and device.
class NamedAdamW {
 public:
  /// `params` are requires_grad leaves, each named (names unique). Throws on an empty list.
  NamedAdamW(std::vector<std::pair<std::string, at::Tensor>> params, const AdamWConfig& cfg);
  ~NamedAdamW();
  NamedAdamW(const NamedAdamW&) = delete;
  NamedAdamW& operator=(const NamedAdamW&) = delete;

  void set_lr(double lr);
  /// One AdamW update from the current .grad of each parameter (parameters with no grad skip).
  /// Never waits for the device.
  void step();
  /// True when the last step() ran the fused kernel (false before the first step).
  bool fused() const { return fused_; }
  /// Clears every parameter's .grad.
  void zero_grad();
  /// Steps taken so far (0 before the first).
  int64_t steps() const { return steps_; }

  /// State as tensors: "<name>.exp_avg", "<name>.exp_avg_sq" (CPU copies) and "<name>.step".
  std::map<std::string, at::Tensor> state_tensors() const;
  /// Restores state written by state_tensors() after `steps` optimizer steps; throws
  /// hearth::Error naming the tensor when one is missing, misshapen, not finite, a negative
  /// exp_avg_sq, a step outside [1, steps], or an entry of no parameter of this run. `origin`
  /// names the file in errors.
  void load_state_tensors(const std::map<std::string, at::Tensor>& state, int64_t steps, const std::string& origin);

  const std::vector<std::pair<std::string, at::Tensor>>& params() const { return params_; }

 private:
  // One parameter's state (undefined tensors until its first step, as libtorch's AdamW).
  struct State {
    at::Tensor exp_avg, exp_avg_sq;
    int64_t step = 0;
    at::Tensor step_t;  // float32 scalar on the parameter's device (fused path)
  };
  void step_plain(size_t i);

  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<State> state_;
  AdamWConfig cfg_;
  bool fused_ = false, fused_available_ = true;
  int64_t steps_ = 0;
};

}  // namespace hearth::train
