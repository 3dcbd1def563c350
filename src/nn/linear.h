// nn::Linear, THE seam for weight matmuls: y = x Wᵀ (+ b) with W dense [out, in] or MLX-affine
// quantized, plus inference-time LoRA adapters. Model files call forward() and never learn which.
// Not a trainer: LoRA training (trainable A/B leaves) arrives with src/adapters and src/train.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "nn/param_source.h"
#include "nn/quant.h"

namespace hearth::nn {

/// One LoRA adapter on a Linear: y += scale · (x Aᵀ) Bᵀ with A [r, in], B [out, r].
/// (mlx-lm stores lora_a [in, r] / lora_b [r, out]; PEFT stores A [r, in] / B [out, r]: the
/// adapters/ loader converts to this PEFT orientation.)
struct LoraAdapter {
  at::Tensor a;  // [r, in]
  at::Tensor b;  // [out, r]
  double scale = 1.0;
};

class Linear {
 public:
  Linear() = default;
  /// Dense: weight [out, in], optional bias [out].
  explicit Linear(at::Tensor weight, std::optional<at::Tensor> bias = std::nullopt);
  /// Quantized: packed weight + optional bias [out].
  explicit Linear(QuantizedWeight qweight, std::optional<at::Tensor> bias = std::nullopt);

  /// Loads module `path` ("model.layers.0.self_attn.q_proj") from `src`: quantized when
  /// "<path>.scales" exists (then `spec` is required: throws if nullopt), else dense
  /// "<path>.weight" [out, in]; "<path>.bias" [out] is read when `bias`. Shapes are checked
  /// against in/out: "<file>: tensor <name> has shape [..], expected [..]".
  static Linear load(const ParamSource& src, const std::string& path, int64_t in, int64_t out, bool bias,
                     const std::optional<QuantSpec>& spec, const LoadOptions& opts);

  /// y [..., out] = x [..., in] · Wᵀ + b, then each LoRA adapter adds scale · (x Aᵀ) Bᵀ.
  at::Tensor forward(const at::Tensor& x) const;

  bool quantized() const { return qweight_.has_value(); }
  int64_t in_features() const;
  int64_t out_features() const;
  /// The dense weight [out, in] (throws when quantized: use dequantized_weight()).
  const at::Tensor& weight() const;
  /// The weight as a dense [out, in] tensor (dequantized when quantized).
  at::Tensor dequantized_weight() const;
  const std::optional<at::Tensor>& bias() const { return bias_; }
  const std::optional<QuantizedWeight>& qweight() const { return qweight_; }

  // --- LoRA (inference) ---------------------------------------------------------------------
  // The place adapters plug in. Today: a list applied additively on every forward. Later issues
  // (per-request adapter selection, training) extend this list, not the model files.
  void add_adapter(LoraAdapter adapter);
  void clear_adapters() { adapters_.clear(); }
  const std::vector<LoraAdapter>& adapters() const { return adapters_; }

  /// Bytes held by the base weight (+ bias), for memory accounting.
  int64_t nbytes() const;

 private:
  at::Tensor weight_;
  std::optional<QuantizedWeight> qweight_;
  std::optional<at::Tensor> bias_;
  std::vector<LoraAdapter> adapters_;
};

/// Loads an MLX-quantized [out, in] matrix "<path>.weight/.scales/.biases" with shape checks.
QuantizedWeight load_quantized(const ParamSource& src, const std::string& path, int64_t in, int64_t out,
                               const QuantSpec& spec, const LoadOptions& opts);

}  // namespace hearth::nn
