// nn::Linear: dense or MLX-quantized weight matmul (+ bias, + LoRA adapters), and its loading.
#include "nn/linear.h"

#include "core/error.h"

namespace hearth::nn {

Linear::Linear(at::Tensor weight, std::optional<at::Tensor> bias) : weight_(std::move(weight)), bias_(std::move(bias)) {
  HEARTH_CHECK(weight_.dim() == 2, "Linear: weight must be [out, in], got ", shape_str(weight_.sizes()));
}

Linear::Linear(QuantizedWeight qweight, std::optional<at::Tensor> bias)
    : qweight_(std::move(qweight)), bias_(std::move(bias)) {}

QuantizedWeight load_quantized(const ParamSource& src, const std::string& path, int64_t in, int64_t out,
                               const QuantSpec& spec, const LoadOptions& opts) {
  check_quant_spec(spec, path);
  HEARTH_CHECK(in % spec.group_size == 0 && (in * spec.bits) % 32 == 0, path, ": in_features ", in,
               " is not divisible by group_size ", spec.group_size);
  QuantizedWeight q;
  q.spec = spec;
  q.wq = src.get(path + ".weight", {out, in * spec.bits / 32}).to(opts.device).contiguous();
  if (q.wq.scalar_type() != at::kInt) q.wq = q.wq.view(at::kInt);  // U32 bits, reinterpreted
  q.scales = place(src.get(path + ".scales", {out, in / spec.group_size}), opts);
  q.biases = place(src.get(path + ".biases", {out, in / spec.group_size}), opts);
  return q;
}

Linear Linear::load(const ParamSource& src, const std::string& path, int64_t in, int64_t out, bool bias,
                    const std::optional<QuantSpec>& spec, const LoadOptions& opts) {
  std::optional<at::Tensor> b;
  if (bias) b = place(src.get(path + ".bias", {out}), opts);
  if (src.contains(path + ".scales")) {
    HEARTH_CHECK(spec.has_value(), path, ": has .scales but config.json's quantization block does not quantize it");
    return Linear(load_quantized(src, path, in, out, *spec, opts), std::move(b));
  }
  return Linear(place(src.get(path + ".weight", {out, in}), opts), std::move(b));
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  at::Tensor y;
  if (qweight_) {
    y = quantized_matmul(x, *qweight_);
    if (bias_) y = y + *bias_;
  } else {
    y = bias_ ? at::linear(x, weight_, *bias_) : at::linear(x, weight_);
  }
  for (const LoraAdapter& ad : adapters_) y = y + at::linear(at::linear(x, ad.a), ad.b) * ad.scale;
  return y;
}

int64_t Linear::in_features() const { return qweight_ ? qweight_->in_features() : weight_.size(1); }
int64_t Linear::out_features() const { return qweight_ ? qweight_->out_features() : weight_.size(0); }

const at::Tensor& Linear::weight() const {
  HEARTH_CHECK(!qweight_, "Linear::weight: the weight is quantized; use dequantized_weight()");
  return weight_;
}

at::Tensor Linear::dequantized_weight() const { return qweight_ ? dequantize(*qweight_) : weight_; }

void Linear::add_adapter(LoraAdapter adapter) {
  HEARTH_CHECK(adapter.a.dim() == 2 && adapter.b.dim() == 2 && adapter.a.size(1) == in_features() &&
                   adapter.b.size(0) == out_features() && adapter.a.size(0) == adapter.b.size(1),
               "Linear::add_adapter: A ", shape_str(adapter.a.sizes()), " / B ", shape_str(adapter.b.sizes()),
               " do not fit a [", out_features(), ", ", in_features(), "] linear");
  adapters_.push_back(std::move(adapter));
}

int64_t Linear::nbytes() const {
  int64_t n = bias_ ? bias_->nbytes() : 0;
  if (qweight_) return n + qweight_->wq.nbytes() + qweight_->scales.nbytes() + qweight_->biases.nbytes();
  return n + weight_.nbytes();
}

}  // namespace hearth::nn
