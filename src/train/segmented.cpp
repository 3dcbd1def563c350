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

void add_grads(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, size_t offset) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = grads[offset + i];
    if (!g.defined()) continue;
    at::Tensor p = params[i];
    if (p.grad().defined()) p.mutable_grad().add_(g);
    else p.mutable_grad() = g.clone();
  }
}

// VJP of `out` (computed from `in` and `params`) with cotangent `dout`; returns d/d in (undefined
// if `in` is not differentiable) and adds the parameter gradients to their .grad.
at::Tensor vjp(const at::Tensor& out, const at::Tensor& in, const std::vector<at::Tensor>& params,
               const at::Tensor& dout) {
  std::vector<at::Tensor> inputs;
  if (in.defined()) inputs.push_back(in);
  inputs.insert(inputs.end(), params.begin(), params.end());
  if (inputs.empty() || !out.requires_grad()) return {};
  auto grads = torch::autograd::grad({out}, inputs, {dout}, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
  add_grads(params, grads, in.defined() ? 1 : 0);
  return in.defined() ? grads[0] : at::Tensor();
}

}  // namespace

BackwardResult backward(const LayerStack& model, const at::Tensor& input_ids, const at::Tensor& targets,
                        const BackwardOptions& opts) {
  HEARTH_CHECK(input_ids.dim() == 2, "backward: input_ids must be [B, T], got ", input_ids.sizes());
  const int64_t n_tokens = targets.ne(kIgnoreIndex).sum().item<int64_t>();
  BackwardResult res;
  res.n_tokens = n_tokens;
  if (n_tokens == 0) return res;
  const double scale = opts.scale != 0.0 ? opts.scale : 1.0 / static_cast<double>(n_tokens);
  const auto plan = opts.segment_size > 0 ? plan_segments(model.num_layers, opts.segment_size, opts.isolate)
                                          : std::vector<std::pair<int64_t, int64_t>>{{0, model.num_layers}};
  const bool train_embed = !model.embed_params.empty();

  // Forward without a graph, keeping one detached boundary per segment edge.
  std::vector<at::Tensor> bounds;
  {
    c10::NoGradGuard no_grad;
    bounds.push_back(model.embed(input_ids).detach());
    if (opts.segment_size > 0) {
      for (size_t s = 0; s < plan.size(); ++s) {
        if (opts.on_segment) opts.on_segment(s, false);
        bounds.push_back(model.layers(bounds.back(), plan[s].first, plan[s].second).detach());
        res.peak_boundaries_bytes += bounds.back().nbytes();
      }
    }
  }

  c10::AutoGradMode grad_mode(true);
  at::Tensor dh;
  if (opts.segment_size > 0) {
    HeadVjp head = chunked_cross_entropy_vjp(bounds.back(), targets, model.head, opts.loss_chunk, scale,
                                             model.head_params);
    res.loss_sum = head.loss_sum;
    dh = head.grad_hidden;
    bounds.pop_back();
    for (size_t s = plan.size(); s-- > 0;) {
      if (opts.on_segment) opts.on_segment(s, true);
      const bool need_input_grad = s > 0 || train_embed;
      at::Tensor x = bounds.back().detach().requires_grad_(need_input_grad);
      at::Tensor y = model.layers(x, plan[s].first, plan[s].second);
      dh = vjp(y, need_input_grad ? x : at::Tensor(), model.layer_params(plan[s].first, plan[s].second), dh);
      bounds.pop_back();
    }
  } else {
    // Full backward: one graph over all layers; the loss head is still chunked and its VJP
    // gives the cotangent at the top of the stack.
    at::Tensor x = bounds.back().detach().requires_grad_(train_embed);
    if (opts.on_segment) opts.on_segment(0, false);
    at::Tensor top = model.layers(x, 0, model.num_layers);
    HeadVjp head = chunked_cross_entropy_vjp(top.detach(), targets, model.head, opts.loss_chunk, scale,
                                             model.head_params);
    res.loss_sum = head.loss_sum;
    dh = vjp(top, train_embed ? x : at::Tensor(), model.layer_params(0, model.num_layers), head.grad_hidden);
  }
  if (train_embed && dh.defined()) vjp(model.embed(input_ids), at::Tensor(), model.embed_params, dh);
  return res;
}

}  // namespace hearth::train
