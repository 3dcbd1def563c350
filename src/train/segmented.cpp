// The segmented and full backward drivers (see segmented.h).
#include "train/segmented.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "train/loss.h"

namespace hearth::train {

std::vector<std::pair<int64_t, int64_t>> plan_segments(int64_t num_layers, int64_t segment_size,
                                                       const std::vector<int64_t>& isolate) {
  std::set<int64_t> iso(isolate.begin(), isolate.end());
  for (int64_t i : iso)
    HEARTH_CHECK(i >= 0 && i < num_layers, "segment plan: isolated layer ", i, " is outside [0, ", num_layers, ")");
  if (segment_size <= 0 || segment_size > num_layers) segment_size = num_layers;
  std::vector<std::pair<int64_t, int64_t>> plan;
  int64_t begin = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    if (iso.count(l)) {
      if (begin < l) plan.emplace_back(begin, l);
      plan.emplace_back(l, l + 1);
      begin = l + 1;
    } else if (l + 1 - begin == segment_size) {
      plan.emplace_back(begin, l + 1);
      begin = l + 1;
    }
  }
  if (begin < num_layers) plan.emplace_back(begin, num_layers);
  return plan;
}

namespace {

using models::Boundary;
// Cotangents by field name ("" is the hidden stream); an absent or undefined entry is zero.
using Cotangents = std::vector<std::pair<std::string, at::Tensor>>;

void add_grads(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, size_t offset) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = grads[offset + i];
    if (!g.defined()) continue;
    at::Tensor p = params[i];
    if (p.grad().defined()) p.mutable_grad().add_(g);
    else p.mutable_grad() = g.clone();
  }
}

void accumulate(Cotangents& d, const std::string& name, const at::Tensor& g) {
  if (!g.defined()) return;
  for (auto& [n, t] : d)
    if (n == name) {
      t = t.defined() ? t + g : g;
      return;
    }
  d.emplace_back(name, g);
}

at::Tensor find(const Cotangents& d, const std::string& name) {
  for (const auto& [n, t] : d)
    if (n == name) return t;
  return {};
}

// Every field of a boundary by name, hidden first as "".
std::vector<std::pair<std::string, at::Tensor>> fields(const Boundary& b) {
  std::vector<std::pair<std::string, at::Tensor>> f{{"", b.hidden}};
  f.insert(f.end(), b.streams.begin(), b.streams.end());
  return f;
}

bool differentiable(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

// A graph-free copy of `b` (shares storage); floating fields become leaves requiring grad when
// `requires_grad`.
Boundary leaf(const Boundary& b, bool requires_grad) {
  auto mk = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor d = t.detach();
    if (requires_grad && differentiable(d)) d.requires_grad_(true);
    return d;
  };
  Boundary out(mk(b.hidden));
  for (const auto& [n, t] : b.streams) out.streams.emplace_back(n, mk(t));
  return out;
}

int64_t boundary_bytes(const Boundary& b) {
  int64_t n = 0;
  for (const auto& [name, t] : fields(b)) n += t.defined() ? t.nbytes() : 0;
  return n;
}

// VJP of the segment y = f(x, params) with cotangents `dy` for y's fields: adds the parameter
// gradients to their .grad and returns the cotangents of x's fields (empty when x has no leaf
// requiring grad). A field of y that is x's own tensor (passed through) hands its cotangent to x
// directly.
Cotangents vjp(const Boundary& y, const Boundary& x, const std::vector<at::Tensor>& params, const Cotangents& dy) {
  Cotangents dx;
  std::vector<std::pair<std::string, at::Tensor>> x_fields = fields(x);
  std::vector<at::Tensor> outputs, grad_outputs;
  for (const auto& [name, t] : fields(y)) {
    at::Tensor g = find(dy, name);
    if (!g.defined() || !t.defined()) continue;
    bool passed = false;
    for (const auto& [xn, xt] : x_fields)
      if (xt.defined() && xt.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        if (xt.requires_grad()) accumulate(dx, xn, g);
        passed = true;
      }
    if (passed || !t.requires_grad()) continue;
    outputs.push_back(t);
    grad_outputs.push_back(g);
  }
  std::vector<at::Tensor> inputs;
  std::vector<std::string> input_names;
  for (const auto& [xn, xt] : x_fields)
    if (xt.defined() && xt.requires_grad()) {
      inputs.push_back(xt);
      input_names.push_back(xn);
    }
  const size_t n_in = inputs.size();
  inputs.insert(inputs.end(), params.begin(), params.end());
  if (inputs.empty() || outputs.empty()) return dx;
  auto grads = torch::autograd::grad(outputs, inputs, grad_outputs, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
  add_grads(params, grads, n_in);
  for (size_t i = 0; i < n_in; ++i) accumulate(dx, input_names[i], grads[i]);
  return dx;
}

}  // namespace

BackwardResult backward(const LayerStack& model, const at::Tensor& input_ids, const at::Tensor& targets,
                        const BackwardOptions& opts) {
  HEARTH_CHECK(input_ids.dim() == 2, "backward: input_ids must be [B, T], got ", input_ids.sizes());
  const int64_t n_tokens = targets.ne(kIgnoreIndex).sum().item<int64_t>();
  if (n_tokens == 0) return BackwardResult{};
  const double scale = opts.scale != 0.0 ? opts.scale : 1.0 / static_cast<double>(n_tokens);
  BackwardResult res = backward_with_head(
      model, input_ids,
      [&](const at::Tensor& hidden) {
        return chunked_cross_entropy_vjp(hidden, targets, model.head, opts.loss_chunk, scale, model.head_params,
                                         opts.defer_loss);
      },
      opts);
  res.n_tokens = n_tokens;
  return res;
}

BackwardResult backward_with_head(const LayerStack& model, const at::Tensor& input_ids, const LossHead& loss_head,
                                  const BackwardOptions& opts) {
  HEARTH_CHECK(input_ids.dim() == 2, "backward: input_ids must be [B, T], got ", input_ids.sizes());
  BackwardResult res;
  const auto plan = opts.segment_size > 0 ? plan_segments(model.num_layers, opts.segment_size, opts.isolate)
                                          : std::vector<std::pair<int64_t, int64_t>>{{0, model.num_layers}};
  const bool train_embed = !model.embed_params.empty();

  // Forward without a graph, keeping one detached boundary per segment edge.
  std::vector<Boundary> bounds;
  {
    c10::NoGradGuard no_grad;
    bounds.push_back(leaf(model.embed(input_ids), false));
    if (opts.segment_size > 0) {
      for (size_t s = 0; s < plan.size(); ++s) {
        if (opts.on_segment) opts.on_segment(s, false);
        bounds.push_back(leaf(model.layers(bounds.back(), plan[s].first, plan[s].second), false));
        res.peak_boundaries_bytes += boundary_bytes(bounds.back());
      }
    }
  }

  c10::AutoGradMode grad_mode(true);
  Cotangents d;
  if (opts.segment_size > 0) {
    HeadVjp head = loss_head(bounds.back().hidden);
    res.loss_sum = head.loss_sum;
    res.loss = head.loss;
    res.n_tokens = head.n_tokens;
    d = {{"", head.grad_hidden}};
    bounds.pop_back();
    for (size_t s = plan.size(); s-- > 0;) {
      if (opts.on_segment) opts.on_segment(s, true);
      const bool need_input_grad = s > 0 || train_embed;
      Boundary x = leaf(bounds.back(), need_input_grad);
      Boundary y = model.layers(x, plan[s].first, plan[s].second);
      d = vjp(y, x, model.layer_params(plan[s].first, plan[s].second), d);
      bounds.pop_back();
    }
  } else {
    // Full backward: one graph over all layers; the loss head's VJP gives the cotangent at the
    // top of the stack.
    Boundary x = leaf(bounds.back(), train_embed);
    if (opts.on_segment) opts.on_segment(0, false);
    Boundary top = model.layers(x, 0, model.num_layers);
    HeadVjp head = loss_head(top.hidden.detach());
    res.loss_sum = head.loss_sum;
    res.loss = head.loss;
    res.n_tokens = head.n_tokens;
    d = vjp(top, x, model.layer_params(0, model.num_layers), {{"", head.grad_hidden}});
  }
  if (train_embed && !d.empty()) {
    // The embedding's own graph, with the cotangents of every field it produced.
    Boundary e = model.embed(input_ids);
    vjp(e, Boundary(), model.embed_params, d);
  }
  return res;
}

}  // namespace hearth::train
