// Schedules, gradient clipping and the named AdamW wrapper (optimizer.h).
#include "train/optimizer.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/torch_compat.h"

namespace hearth::train {

double Schedule::lr(int64_t step) const {
  if (warmup > 0 && step <= warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
  if (kind == Kind::kConstant) return peak;
  const double span = static_cast<double>(std::max<int64_t>(total - warmup, 1));
  const double k = std::clamp(static_cast<double>(step - warmup - 1), 0.0, span);
  return min_lr + 0.5 * (peak - min_lr) * (1.0 + std::cos(M_PI * k / span));
}

Schedule::Kind Schedule::parse(const std::string& name) {
  if (name == "constant") return Kind::kConstant;
  if (name == "cosine") return Kind::kCosine;
  throw InvalidArgument(cat("--lr-schedule: '", name, "' is not constant or cosine"));
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::Tensor norm = clip_grad_norm_async(params, max_norm);
  return norm.defined() ? norm.item<double>() : 0.0;
}

at::Tensor clip_grad_norm_async(const std::vector<at::Tensor>& params, double max_norm) {
  std::vector<at::Tensor> sq;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) sq.push_back(p.grad().to(at::kDouble).pow(2).sum());
  if (sq.empty()) return {};
  at::Tensor norm = at::stack(sq).sum().sqrt();
  if (max_norm > 0) {
    at::Tensor s = (max_norm / (norm + 1e-6)).clamp_max(1.0);
    for (const at::Tensor& p : params)
      if (p.grad().defined()) p.grad().mul_(s);
  }
  return norm;
}

NamedAdamW::NamedAdamW(std::vector<std::pair<std::string, at::Tensor>> params, const AdamWConfig& cfg)
    : params_(std::move(params)), cfg_(cfg) {
  HEARTH_CHECK(!params_.empty(), "optimizer: no trainable parameters");
  std::set<std::string> seen;
  for (auto& [name, t] : params_) {
    HEARTH_CHECK(seen.insert(name).second, "optimizer: parameter ", name, " listed twice");
    HEARTH_CHECK(t.requires_grad() && t.is_leaf(), "optimizer: parameter ", name, " is not a trainable leaf");
  }
  state_.resize(params_.size());
}

NamedAdamW::~NamedAdamW() = default;

void NamedAdamW::set_lr(double lr) { cfg_.lr = lr; }

// torch::optim::AdamW::step for one tensor, op for op (libtorch 1.13 / 2.x adamw.cpp).
void NamedAdamW::step_plain(size_t i) {
  const at::Tensor& p = params_[i].second;
  const at::Tensor& grad = p.grad();
  State& s = state_[i];
  if (cfg_.weight_decay != 0) p.mul_(1 - cfg_.lr * cfg_.weight_decay);
  ++s.step;
  const double bias_correction1 = 1 - std::pow(cfg_.beta1, s.step);
  const double bias_correction2 = 1 - std::pow(cfg_.beta2, s.step);
  s.exp_avg.mul_(cfg_.beta1).add_(grad, 1 - cfg_.beta1);
  s.exp_avg_sq.mul_(cfg_.beta2).addcmul_(grad, grad, 1 - cfg_.beta2);
  at::Tensor denom = (s.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(cfg_.eps);
  p.addcdiv_(s.exp_avg, denom, -cfg_.lr / bias_correction1);
}

void NamedAdamW::step() {
  c10::NoGradGuard no_grad;
  // Fused groups: same device and dtype (the kernel's contract); a parameter's step tensor is
  // made on its first fused step from its step count.
  std::map<std::pair<std::string, at::ScalarType>, std::vector<size_t>> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].second;
    if (!p.grad().defined()) continue;
    State& s = state_[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = at::zeros_like(p, at::MemoryFormat::Preserve);
      s.exp_avg_sq = at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    groups[{p.device().str(), p.scalar_type()}].push_back(i);
  }
  fused_ = false;
  for (const auto& [key, idx] : groups) {
    bool done = false;
    if (cfg_.fused && fused_available_) {
      std::vector<at::Tensor> ps, gs, ms, vs, ts;
      for (size_t i : idx) {
        State& s = state_[i];
        const at::Tensor& p = params_[i].second;
        if (!s.step_t.defined()) s.step_t = at::full({}, static_cast<double>(s.step), p.options().dtype(at::kFloat));
        ps.push_back(p.detach());
        gs.push_back(p.grad());
        ms.push_back(s.exp_avg);
        vs.push_back(s.exp_avg_sq);
        ts.push_back(s.step_t);
      }
      at::_foreach_add_(ts, 1.0);
      done = compat::fused_adamw(ps, gs, ms, vs, ts, cfg_.lr, cfg_.beta1, cfg_.beta2, cfg_.weight_decay, cfg_.eps);
      if (done) {
        for (size_t i : idx) ++state_[i].step;
        fused_ = true;
      } else {
        at::_foreach_sub_(ts, 1.0);
        fused_available_ = false;  // this build has no fused kernel: do not ask again
      }
    }
    if (!done)
      for (size_t i : idx) {
        step_plain(i);
        state_[i].step_t = at::Tensor();  // stale: remade from the count if the fused path runs later
      }
  }
  ++steps_;
}

void NamedAdamW::zero_grad() {
  for (auto& [name, t] : params_) t.mutable_grad() = at::Tensor();
}

std::map<std::string, at::Tensor> NamedAdamW::state_tensors() const {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const State& s = state_[i];
    if (!s.exp_avg.defined()) continue;
    const std::string& name = params_[i].first;
    out[name + ".exp_avg"] = s.exp_avg.detach().cpu().clone();
    out[name + ".exp_avg_sq"] = s.exp_avg_sq.detach().cpu().clone();
    out[name + ".step"] = at::full({1}, s.step, at::kLong);
  }
  return out;
}

void NamedAdamW::load_state_tensors(const std::map<std::string, at::Tensor>& state, int64_t steps,
                                    const std::string& origin) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, t] = params_[i];
    auto get = [&](const std::string& key) -> const at::Tensor* {
      auto it = state.find(name + key);
      return it == state.end() ? nullptr : &it->second;
    };
    const at::Tensor *m = get(".exp_avg"), *v = get(".exp_avg_sq"), *n = get(".step");
    if (!m && !v && !n) continue;  // parameter never stepped
    HEARTH_CHECK(m && v && n, origin, ": optimizer state of ", name, " is incomplete");
    HEARTH_CHECK(m->sizes() == t.sizes() && v->sizes() == t.sizes(), origin, ": optimizer state of ", name,
                 " has shape ", m->sizes(), ", the parameter ", t.sizes());
    HEARTH_CHECK(n->numel() == 1, origin, ": optimizer state ", name, ".step must hold one number, got ", n->sizes());
    // A damaged file is named here, not one step later as a diverged run.
    HEARTH_CHECK(at::isfinite(*m).all().item<bool>(), origin, ": optimizer state ", name,
                 ".exp_avg is not finite (a damaged file)");
    HEARTH_CHECK(at::isfinite(*v).all().item<bool>() && v->ge(0).all().item<bool>(), origin, ": optimizer state ",
                 name, ".exp_avg_sq must be finite and non-negative (a damaged file)");
    State s;
    s.step = n->item<int64_t>();
    HEARTH_CHECK(s.step >= 1 && s.step <= steps, origin, ": optimizer state ", name, ".step is ", s.step,
                 ", expected 1 to the checkpoint's ", steps, " steps (a damaged file)");
    s.exp_avg = m->to(t.device(), t.scalar_type()).clone();
    s.exp_avg_sq = v->to(t.device(), t.scalar_type()).clone();
    state_[i] = std::move(s);
  }
  // Every entry must belong to a parameter of this run (a state for a module that does not exist
  // is a file of another run or a damaged one).
  std::set<std::string> known;
  for (const auto& [name, t] : params_)
    for (const char* key : {".exp_avg", ".exp_avg_sq", ".step"}) known.insert(name + key);
  for (const auto& [key, t] : state)
    HEARTH_CHECK(known.count(key), origin, ": optimizer state ", key, " belongs to no trained parameter of this run");
  steps_ = steps;
}

}  // namespace hearth::train
