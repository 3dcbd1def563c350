// fp32 master weights for bf16 mixed-precision training (mixed_precision.h).
#include "train/mixed_precision.h"

#include <c10/core/GradMode.h>

#include "core/error.h"
#include "train/trainer.h"

namespace hearth::train {

bool parse_mixed_precision(const std::string& value) {
  if (value == "none") return false;
  if (value == "bf16") return true;
  HEARTH_CHECK(value != "fp16", "--mixed-precision fp16 is not supported: fp16 needs dynamic loss scaling, which "
               "Hearth does not do; use --mixed-precision bf16 (same speed on GPUs with bf16, no scaling needed)");
  throw InvalidArgument(cat("--mixed-precision: '", value, "' is not bf16, fp16 or none"));
}

MasterWeights::MasterWeights(const std::vector<TrainableParam>& params, bool enabled,
                             const std::map<std::string, at::Tensor>& init)
    : model_(params), masters_(params) {
  own_.assign(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) index_.emplace(params[i].tensor.unsafeGetTensorImpl(), i);
  if (!enabled) return;
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].tensor.scalar_type() == at::kFloat) continue;
    const at::Tensor& t = params[i].tensor;
    auto it = init.find(params[i].name);
    HEARTH_CHECK(it == init.end() || it->second.sizes() == t.sizes(), "mixed precision: the fp32 value of ",
                 params[i].name, " has shape ", it->second.sizes(), ", the model's ", t.sizes());
    const at::Tensor& src = it != init.end() ? it->second : t;
    masters_[i].tensor = src.detach().to(t.device(), at::kFloat, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
    own_[i] = true;
  }
}

std::vector<std::pair<std::string, at::Tensor>> MasterWeights::named() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : masters_) out.emplace_back(p.name, p.tensor);
  return out;
}

std::vector<at::Tensor> MasterWeights::tensors() const {
  std::vector<at::Tensor> out;
  for (const auto& p : masters_) out.push_back(p.tensor);
  return out;
}

void MasterWeights::accumulate(size_t i) {
  if (!own_[i]) return;
  at::Tensor m = model_[i].tensor, g = m.grad();
  if (!g.defined()) return;
  at::Tensor master = masters_[i].tensor;
  if (master.grad().defined()) master.mutable_grad().add_(g);
  else master.mutable_grad() = g.to(at::kFloat);
  m.mutable_grad() = at::Tensor();
}

void MasterWeights::accumulate_grads() {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i) accumulate(i);
}

std::vector<at::Tensor> MasterWeights::accumulate_grads_of(const std::vector<at::Tensor>& model_tensors) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (const auto& t : model_tensors) {
    auto it = index_.find(t.unsafeGetTensorImpl());
    if (it == index_.end()) continue;
    accumulate(it->second);
    out.push_back(masters_[it->second].tensor);
  }
  return out;
}

void MasterWeights::copy_to_model() {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i)
    if (own_[i]) model_[i].tensor.detach().copy_(masters_[i].tensor);
}

void make_fp32(const std::vector<TrainableParam>& params) {
  c10::NoGradGuard no_grad;
  for (const auto& p : params)
    if (p.tensor.scalar_type() != at::kFloat) p.tensor.set_data(p.tensor.detach().to(at::kFloat));
}

}  // namespace hearth::train
