// Token embedding lookup, dense or MLX-quantized (dequantizing only the gathered rows).
#include "nn/embedding.h"

#include "core/error.h"

namespace hearth::nn {

Embedding Embedding::load(const ParamSource& src, const std::string& path, int64_t vocab, int64_t hidden,
                          const std::optional<QuantSpec>& spec, const LoadOptions& opts) {
  if (src.contains(path + ".scales")) {
    HEARTH_CHECK(spec.has_value(), path, ": has .scales but config.json's quantization block does not quantize it");
    return Embedding(load_quantized(src, path, hidden, vocab, *spec, opts));
  }
  return Embedding(place(src.get(path + ".weight", {vocab, hidden}), opts));
}

at::Tensor Embedding::forward(const at::Tensor& ids) const {
  if (!qweight_) return at::embedding(weight_, ids);
  // Gather the packed rows, scales and biases of the ids, then dequantize just those rows.
  at::Tensor flat = ids.reshape({-1});
  QuantizedWeight rows{qweight_->wq.index_select(0, flat), qweight_->scales.index_select(0, flat),
                       qweight_->biases.index_select(0, flat), qweight_->spec};
  at::Tensor out = dequantize(rows);
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(out.size(1));
  return out.view(shape);
}

Linear Embedding::as_linear() const { return qweight_ ? Linear(*qweight_) : Linear(weight_); }

int64_t Embedding::nbytes() const {
  if (qweight_) return qweight_->wq.nbytes() + qweight_->scales.nbytes() + qweight_->biases.nbytes();
  return weight_.nbytes();
}

}  // namespace hearth::nn
