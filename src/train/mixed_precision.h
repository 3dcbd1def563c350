// Mixed-precision training state: fp32 master copies of the low-precision (bf16) tensors a model
// computes with, Megatron-LM's "bf16 with fp32 main params and main grads" scheme. Not the
// optimizer (optimizer.h) or the loop (trainer.h).
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hearth::train {

struct TrainableParam;

/// Parses --mixed-precision: "none" → false, "bf16" → true. "fp16" throws hearth::Error saying it
/// needs loss scaling, which Hearth does not do (use bf16); anything else throws naming the flag.
bool parse_mixed_precision(const std::string& value);

/// The fp32 masters of a run's trainable tensors. With `enabled`, each trainable tensor that is not
/// fp32 gets an fp32 master (a requires_grad leaf, the tensor's value upcast); the optimizer,
/// clipping and checkpoints work on the masters and the model keeps computing with its own
/// (bf16) tensors, refreshed from the masters once per optimizer step. A tensor that already is
/// fp32 (LoRA A/B in a bf16 model, see make_fp32) is its own master. Without `enabled` every
/// tensor is its own master and every call here is a no-op (plain fp32 or pure bf16 training).
class MasterWeights {
 public:
  /// `init`: fp32 starting values by name for the masters (shape-checked, moved to the tensor's
  /// device); a master whose name is absent starts as the model tensor upcast. Throws
  /// hearth::Error naming the tensor on a shape mismatch.
  MasterWeights(const std::vector<TrainableParam>& params, bool enabled,
                const std::map<std::string, at::Tensor>& init = {});

  /// `params` with each tensor replaced by its master (same names, layers and roles).
  const std::vector<TrainableParam>& masters() const { return masters_; }
  std::vector<std::pair<std::string, at::Tensor>> named() const;
  std::vector<at::Tensor> tensors() const;

  /// After a micro-batch's backward: adds each model tensor's .grad into its master's fp32 .grad
  /// and clears the model tensor's .grad (so micro-batches accumulate in fp32). No device sync.
  void accumulate_grads();
  /// accumulate_grads for `model_tensors` alone (tensors of the params given at construction,
  /// matched by identity; others are skipped): returns their masters, in order (a tensor that is
  /// its own master, itself). The same additions as accumulate_grads, so doing a subset now and
  /// the rest later gives the same values. No device sync.
  std::vector<at::Tensor> accumulate_grads_of(const std::vector<at::Tensor>& model_tensors);
  /// After an optimizer step (or a checkpoint load into the masters): model tensor ← master,
  /// rounded to the model tensor's dtype. No device sync.
  void copy_to_model();

 private:
  std::vector<TrainableParam> model_, masters_;
  std::vector<bool> own_;  // masters_[i] is a separate fp32 copy
  std::unordered_map<const void*, size_t> index_;  // a model tensor's TensorImpl → i
  void accumulate(size_t i);
};

/// Turns each tensor of `params` into fp32 in place (the same tensor object, so every holder —
/// e.g. nn::Linear's LoRA adapter — sees it): LoRA A/B of a mixed-precision run train and compute
/// in fp32 over the frozen bf16 base. No-op for tensors already fp32.
void make_fp32(const std::vector<TrainableParam>& params);

}  // namespace hearth::train
