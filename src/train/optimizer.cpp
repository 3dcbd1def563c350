// Schedules, gradient clipping and the named AdamW wrapper (optimizer.h).
#include "train/optimizer.h"

#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <type_traits>

#include "core/error.h"

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
  double sq = 0.0;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const double s = max_norm / (norm + 1e-6);
    for (const at::Tensor& p : params)
      if (p.grad().defined()) p.grad().mul_(s);
  }
  return norm;
}

namespace {

// libtorch keys optimizer state by the parameter's TensorImpl: as a string in 1.x, as void* in
// 2.x. Deduce the key type instead of testing the version.
template <typename Map>
typename Map::key_type state_key(const at::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;  // as libtorch 1.x keyed it (guts::to_string of the impl)
    os << p.unsafeGetTensorImpl();
    return os.str();
  }
  else return static_cast<Key>(p.unsafeGetTensorImpl());
}

}  // namespace

NamedAdamW::NamedAdamW(std::vector<std::pair<std::string, at::Tensor>> params, const AdamWConfig& cfg)
    : params_(std::move(params)) {
  HEARTH_CHECK(!params_.empty(), "optimizer: no trainable parameters");
  std::set<std::string> seen;
  std::vector<at::Tensor> ts;
  for (auto& [name, t] : params_) {
    HEARTH_CHECK(seen.insert(name).second, "optimizer: parameter ", name, " listed twice");
    HEARTH_CHECK(t.requires_grad() && t.is_leaf(), "optimizer: parameter ", name, " is not a trainable leaf");
    ts.push_back(t);
  }
  torch::optim::AdamWOptions o(cfg.lr);
  o.betas(std::make_tuple(cfg.beta1, cfg.beta2)).eps(cfg.eps).weight_decay(cfg.weight_decay);
  opt_ = std::make_unique<torch::optim::AdamW>(ts, o);
}

NamedAdamW::~NamedAdamW() = default;

void NamedAdamW::set_lr(double lr) {
  for (auto& g : opt_->param_groups()) g.options().set_lr(lr);
}

void NamedAdamW::step() {
  opt_->step();
  ++steps_;
}

void NamedAdamW::zero_grad() {
  for (auto& [name, t] : params_) t.mutable_grad() = at::Tensor();
}

std::map<std::string, at::Tensor> NamedAdamW::state_tensors() const {
  std::map<std::string, at::Tensor> out;
  auto& state = opt_->state();
  for (const auto& [name, t] : params_) {
    auto it = state.find(state_key<std::decay_t<decltype(state)>>(t));
    if (it == state.end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    out[name + ".exp_avg"] = s.exp_avg().detach().cpu().clone();
    out[name + ".exp_avg_sq"] = s.exp_avg_sq().detach().cpu().clone();
    out[name + ".step"] = at::full({1}, s.step(), at::kLong);
  }
  return out;
}

void NamedAdamW::load_state_tensors(const std::map<std::string, at::Tensor>& state, int64_t steps,
                                    const std::string& origin) {
  auto& st = opt_->state();
  for (const auto& [name, t] : params_) {
    auto get = [&](const std::string& key) -> const at::Tensor* {
      auto it = state.find(name + key);
      return it == state.end() ? nullptr : &it->second;
    };
    const at::Tensor *m = get(".exp_avg"), *v = get(".exp_avg_sq"), *n = get(".step");
    if (!m && !v && !n) continue;  // parameter never stepped
    HEARTH_CHECK(m && v && n, origin, ": optimizer state of ", name, " is incomplete");
    HEARTH_CHECK(m->sizes() == t.sizes() && v->sizes() == t.sizes(), origin, ": optimizer state of ", name,
                 " has shape ", m->sizes(), ", the parameter ", t.sizes());
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(n->item<int64_t>());
    s->exp_avg(m->to(t.device(), t.scalar_type()).clone());
    s->exp_avg_sq(v->to(t.device(), t.scalar_type()).clone());
    st[state_key<std::decay_t<decltype(st)>>(t)] = std::move(s);
  }
  steps_ = steps;
}

}  // namespace hearth::train
