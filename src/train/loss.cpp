// Chunked cross-entropy with an immediate per-chunk VJP (see loss.h).
#include "train/loss.h"

#include <torch/csrc/autograd/autograd.h>
#include <c10/core/GradMode.h>

#include "core/error.h"

namespace hearth::train {

at::Tensor shift_labels(const at::Tensor& labels) {
  HEARTH_CHECK(labels.dim() == 2, "shift_labels: labels must be [B, T], got ", labels.sizes());
  at::Tensor out = at::full_like(labels, kIgnoreIndex);
  if (labels.size(1) > 1) out.narrow(1, 0, labels.size(1) - 1).copy_(labels.narrow(1, 1, labels.size(1) - 1));
  return out;
}

namespace {

void check_args(const at::Tensor& hidden, const at::Tensor& targets, int64_t chunk) {
  HEARTH_CHECK(hidden.dim() == 3, "cross_entropy: hidden must be [B, T, C], got ", hidden.sizes());
  HEARTH_CHECK(targets.dim() == 2 && targets.size(0) == hidden.size(0) && targets.size(1) == hidden.size(1),
               "cross_entropy: targets must be [B, T] = ", hidden.sizes().slice(0, 2), ", got ", targets.sizes());
  HEARTH_CHECK(chunk >= 1, "cross_entropy: chunk must be >= 1, got ", chunk);
}

// Σ CE over supervised positions of one chunk: logits [B, t, V] (any float dtype), tgt [B, t].
at::Tensor chunk_ce_sum(const at::Tensor& logits, const at::Tensor& tgt) {
  at::Tensor lf = logits.to(at::promote_types(logits.scalar_type(), at::kFloat)).reshape({-1, logits.size(-1)});
  at::Tensor t = tgt.reshape({-1});
  at::Tensor keep = t.ne(kIgnoreIndex);
  at::Tensor idx = keep.nonzero().squeeze(1);
  at::Tensor sel = lf.index_select(0, idx);
  at::Tensor tsel = t.index_select(0, idx);
  at::Tensor lse = at::logsumexp(sel, -1);
  at::Tensor picked = sel.gather(1, tsel.unsqueeze(1)).squeeze(1);
  return (lse - picked).sum();
}

}  // namespace

HeadVjp chunked_cross_entropy_vjp(const at::Tensor& hidden, const at::Tensor& targets,
                                  const std::function<at::Tensor(const at::Tensor&)>& head, int64_t chunk,
                                  double scale, const std::vector<at::Tensor>& head_params) {
  check_args(hidden, targets, chunk);
  HeadVjp r;
  r.grad_hidden = at::zeros_like(hidden);
  const int64_t T = hidden.size(1);
  at::Tensor tg = targets.to(hidden.device());
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t n = std::min(chunk, T - s);
    at::Tensor t = tg.narrow(1, s, n);
    const int64_t count = t.ne(kIgnoreIndex).sum().item<int64_t>();
    if (count == 0) continue;  // no supervised position: zero gradient, skip the head entirely
    at::Tensor h = hidden.narrow(1, s, n).detach().requires_grad_(true);
    c10::AutoGradMode enable_grad(true);
    at::Tensor loss = chunk_ce_sum(head(h), t);
    std::vector<at::Tensor> inputs{h};
    inputs.insert(inputs.end(), head_params.begin(), head_params.end());
    auto grads = torch::autograd::grad({loss * scale}, inputs, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    r.grad_hidden.narrow(1, s, n).copy_(grads[0]);
    for (size_t i = 0; i < head_params.size(); ++i) {
      if (!grads[i + 1].defined()) continue;
      at::Tensor p = head_params[i];
      if (p.grad().defined()) p.mutable_grad().add_(grads[i + 1]);
      else p.mutable_grad() = grads[i + 1].clone();
    }
    r.loss_sum += loss.item<double>();
    r.n_tokens += count;
  }
  return r;
}

HeadVjp chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& targets,
                              const std::function<at::Tensor(const at::Tensor&)>& head, int64_t chunk) {
  check_args(hidden, targets, chunk);
  c10::NoGradGuard no_grad;
  HeadVjp r;
  at::Tensor tg = targets.to(hidden.device());
  for (int64_t s = 0; s < hidden.size(1); s += chunk) {
    const int64_t n = std::min(chunk, hidden.size(1) - s);
    at::Tensor t = tg.narrow(1, s, n);
    const int64_t count = t.ne(kIgnoreIndex).sum().item<int64_t>();
    if (count == 0) continue;
    r.loss_sum += chunk_ce_sum(head(hidden.narrow(1, s, n)), t).item<double>();
    r.n_tokens += count;
  }
  return r;
}

}  // namespace hearth::train
