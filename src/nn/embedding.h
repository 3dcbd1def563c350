// Token embedding (dense or MLX-quantized table) and its use as a tied lm_head. Not positional
// embeddings (see rope.h).
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "nn/linear.h"

namespace hearth::nn {

class Embedding {
 public:
  Embedding() = default;
  explicit Embedding(at::Tensor weight) : weight_(std::move(weight)) {}  // [V, C]
  explicit Embedding(QuantizedWeight qweight) : qweight_(std::move(qweight)) {}

  /// Loads "<path>.weight" [V, C] (or the quantized triple when "<path>.scales" exists).
  static Embedding load(const ParamSource& src, const std::string& path, int64_t vocab, int64_t hidden,
                        const std::optional<QuantSpec>& spec, const LoadOptions& opts);

  /// ids [B, T] (int64) → [B, T, C]. Quantized tables dequantize only the rows gathered.
  at::Tensor forward(const at::Tensor& ids) const;

  /// The table as an output projection [.., C] → [.., V] (tied lm_head): dense weight, or
  /// quantized_matmul over the quantized table.
  Linear as_linear() const;

  int64_t nbytes() const;

 private:
  at::Tensor weight_;
  std::optional<QuantizedWeight> qweight_;
};

}  // namespace hearth::nn
