// The segmented and full backward drivers (see segmented.h).
#include "train/segmented.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <optional>
#include <set>

#include "core/error.h"
#include "nn/cpu_gemm.h"
#include "nn/fused_ops.h"
#include "nn/mlp_chunk.h"
#include "train/boundary_store.h"
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

// VJP of the segment y = f(x, params) with cotangents `dy` for y's fields: adds the parameter
// gradients to their .grad and returns the cotangents of x's fields (empty when x has no leaf
// requiring grad). A field of y that is x's own tensor (passed through) hands its cotangent to x
// directly. A chunked MLP checkpoint (nn/mlp_chunk.h) in the segment adds its parameters'
// gradients to .grad itself, inside grad(), and grad returns none for them: each counted once.
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

// The segments a backward runs: plan_segments, or the whole stack as one for the full backward.
std::vector<std::pair<int64_t, int64_t>> backward_plan(const LayerStack& model, const BackwardOptions& opts) {
  if (opts.segment_size > 0) return plan_segments(model.num_layers, opts.segment_size, opts.isolate);
  return {{0, model.num_layers}};
}

}  // namespace

BackwardResult backward(const LayerStack& model, const at::Tensor& input_ids, const at::Tensor& targets,
                        const BackwardOptions& opts) {
  HEARTH_CHECK(input_ids.dim() == 2, "backward: input_ids must be [B, T], got ", input_ids.sizes());
  const int64_t n_tokens = targets.ne(kIgnoreIndex).sum().item<int64_t>();
  if (n_tokens == 0) {
    if (opts.on_segment_grads) {  // the same calls as a backward that ran (see segmented.h)
      const auto plan = backward_plan(model, opts);
      for (size_t s = plan.size(); s-- > 0;) opts.on_segment_grads(plan[s].first, plan[s].second);
    }
    return BackwardResult{};
  }
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
  HEARTH_CHECK(opts.mlp_chunk >= 0, "backward: mlp_chunk must be >= 0 (0 = off), got ", opts.mlp_chunk);
  // The forward without a graph must round as its recomputation with one does (nn/cpu_gemm.h).
  nn::cpu::ReferenceKernelsScope reference_kernels;
  std::optional<nn::MlpChunkScope> mlp_chunk;
  if (opts.mlp_chunk > 0) mlp_chunk.emplace(opts.mlp_chunk);
  BackwardResult res;
  const bool segmented = opts.segment_size > 0;
  const auto plan = backward_plan(model, opts);
  const bool train_embed = !model.embed_params.empty();

  // Forward without a graph: the input edge of every segment goes to the store (on the device or
  // offloaded), `top` is the last boundary (segmented) or the embedding's (full backward).
  BoundaryStoreOptions so;
  so.offload = segmented && opts.offload_boundaries;
  so.host_limit_bytes = opts.offload_host_limit_bytes;
  BoundaryStore store(so);
  Boundary top;
  // The boundaries' forward (no graph) rounds as the segments' recomputation (graph) does.
  const nn::FusedDecodeOff reference_ops;
  {
    c10::NoGradGuard no_grad;
    top = leaf(model.embed(input_ids), false);
    if (segmented) {
      store.put(top);
      for (size_t s = 0; s < plan.size(); ++s) {
        if (opts.on_segment) opts.on_segment(s, false);
        Boundary next = leaf(model.layers(top, plan[s].first, plan[s].second), false);
        if (s + 1 < plan.size()) store.put(next, &top);  // `top` (the last put) is still alive here
        top = std::move(next);
      }
    }
  }

  c10::AutoGradMode grad_mode(true);
  Cotangents d;
  if (segmented) {
    store.prefetch(plan.size() - 1);  // its copy back overlaps the loss head
    HeadVjp head = loss_head(top.hidden);
    res.loss_sum = head.loss_sum;
    res.loss = head.loss;
    res.n_tokens = head.n_tokens;
    d = {{"", head.grad_hidden}};
    top = Boundary();
    for (size_t s = plan.size(); s-- > 0;) {
      if (opts.on_segment) opts.on_segment(s, true);
      const bool need_input_grad = s > 0 || train_embed;
      Boundary x = leaf(store.take(s), need_input_grad);
      if (s > 0) store.prefetch(s - 1);  // copied back while this segment recomputes
      Boundary y = model.layers(x, plan[s].first, plan[s].second);
      d = vjp(y, x, model.layer_params(plan[s].first, plan[s].second), d);
      if (opts.on_segment_grads) opts.on_segment_grads(plan[s].first, plan[s].second);
    }
    res.boundary_device_bytes = store.peak_device_bytes();
    res.boundary_host_bytes = store.peak_host_bytes();
  } else {
    // Full backward: one graph over all layers; the loss head's VJP gives the cotangent at the
    // top of the stack.
    Boundary x = leaf(top, train_embed);
    top = Boundary();
    if (opts.on_segment) opts.on_segment(0, false);
    Boundary out = model.layers(x, 0, model.num_layers);
    HeadVjp head = loss_head(out.hidden.detach());
    res.loss_sum = head.loss_sum;
    res.loss = head.loss;
    res.n_tokens = head.n_tokens;
    d = vjp(out, x, model.layer_params(0, model.num_layers), {{"", head.grad_hidden}});
    if (opts.on_segment_grads) opts.on_segment_grads(0, model.num_layers);
  }
  if (train_embed && !d.empty()) {
    // The embedding's own graph, with the cotangents of every field it produced.
    Boundary e = model.embed(input_ids);
    vjp(e, Boundary(), model.embed_params, d);
  }
  return res;
}

}  // namespace hearth::train
