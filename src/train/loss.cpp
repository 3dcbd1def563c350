// Chunked cross-entropy with an immediate per-chunk VJP (see loss.h).
#include "train/loss.h"

#include <torch/csrc/autograd/autograd.h>
#include <c10/core/GradMode.h>

#include "core/env.h"
#include "core/error.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cross_entropy.h"
#endif

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

// Σ CE over supervised positions of one chunk: logits [B, t, V] (any float dtype, upcast to at least
// fp32), tgt [B, t] on the logits' device. Unsupervised positions are masked, not gathered out,
// so no step waits for the device (nonzero would).
at::Tensor chunk_ce_sum(const at::Tensor& logits, const at::Tensor& tgt) {
  at::Tensor lf = logits.to(at::promote_types(logits.scalar_type(), at::kFloat)).reshape({-1, logits.size(-1)});
  at::Tensor t = tgt.reshape({-1});
  at::Tensor keep = t.ne(kIgnoreIndex);
  at::Tensor lse = at::logsumexp(lf, -1);
  at::Tensor picked = lf.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);
  return at::where(keep, lse - picked, at::zeros({}, lse.options())).sum();
}

#ifdef HEARTH_WITH_CUDA_KERNELS
// The fused kernel (kernels/cross_entropy.cu) for a chunk's logits [B, t, V] on CUDA: sets `loss`
// (0-dim fp32, Σ CE over kept positions) and `grad` (d(scale · Σ CE)/d logits, logits' dtype) and
// returns true; false, touching nothing, when it does not apply (CPU, another dtype, or
// HEARTH_FUSED_CE=0 — the autograd reference then runs).
bool fused_ce(const at::Tensor& logits, const at::Tensor& tgt, double scale, at::Tensor& loss, at::Tensor& grad) {
  if (!logits.is_cuda()) return false;
  const at::ScalarType st = logits.scalar_type();
  if (st != at::kFloat && st != at::kHalf && st != at::kBFloat16) return false;
  static const bool off = !env_switch_on("HEARTH_FUSED_CE");
  if (off) return false;
  const int64_t V = logits.size(-1);
  at::Tensor x = logits.detach().reshape({-1, V}).contiguous();
  at::Tensor t = tgt.reshape({-1}).to(at::kLong).contiguous();
  at::Tensor rows = at::empty({x.size(0)}, x.options().dtype(at::kFloat));
  at::Tensor g = at::empty_like(x);
  const c10::cuda::CUDAGuard guard(x.device());
  kernels::CrossEntropyArgs a;
  a.logits = x.data_ptr();
  a.dtype = st == at::kBFloat16 ? kernels::QDtype::kBFloat16 : st == at::kHalf ? kernels::QDtype::kFloat16
                                                                                : kernels::QDtype::kFloat32;
  a.targets = t.data_ptr<int64_t>();
  a.ignore_index = kIgnoreIndex;
  a.scale = static_cast<float>(scale);
  a.loss_rows = rows.data_ptr<float>();
  a.grad = g.data_ptr();
  a.N = x.size(0);
  a.V = V;
  a.stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  const char* err = kernels::cross_entropy_fwd_bwd(a);
  HEARTH_CHECK(err == nullptr, "cross_entropy: CUDA kernel failed: ", err);
  loss = rows.sum();
  grad = g.view(logits.sizes());
  return true;
}
#endif

// Supervised positions of each chunk of `targets` [B, T] (read on the CPU: free for CPU targets).
std::vector<int64_t> chunk_counts(const at::Tensor& targets, int64_t chunk) {
  at::Tensor per_pos = targets.ne(kIgnoreIndex).sum(0).cpu();  // [T]
  std::vector<int64_t> out;
  for (int64_t s = 0; s < targets.size(1); s += chunk)
    out.push_back(per_pos.narrow(0, s, std::min(chunk, targets.size(1) - s)).sum().item<int64_t>());
  return out;
}

}  // namespace

HeadVjp chunked_cross_entropy_vjp(const at::Tensor& hidden, const at::Tensor& targets,
                                  const std::function<at::Tensor(const at::Tensor&)>& head, int64_t chunk,
                                  double scale, const std::vector<at::Tensor>& head_params, bool defer_loss) {
  check_args(hidden, targets, chunk);
  HeadVjp r;
  r.grad_hidden = at::zeros_like(hidden);
  r.loss = at::zeros({}, hidden.options().dtype(at::kDouble));
  const int64_t T = hidden.size(1);
  const std::vector<int64_t> counts = chunk_counts(targets, chunk);
  at::Tensor tg = to_device_async(targets, hidden.device());
  for (int64_t s = 0, c = 0; s < T; s += chunk, ++c) {
    const int64_t n = std::min(chunk, T - s);
    at::Tensor t = tg.narrow(1, s, n);
    const int64_t count = counts[c];
    if (count == 0) continue;  // no supervised position: zero gradient, skip the head entirely
    at::Tensor h = hidden.narrow(1, s, n).detach().requires_grad_(true);
    c10::AutoGradMode enable_grad(true);
    at::Tensor logits = head(h);
    std::vector<at::Tensor> inputs{h};
    inputs.insert(inputs.end(), head_params.begin(), head_params.end());
    at::Tensor loss, grad_logits;
#ifdef HEARTH_WITH_CUDA_KERNELS
    fused_ce(logits, t, scale, loss, grad_logits);  // sets both where the kernel applies
#endif
    std::vector<at::Tensor> grads;
    if (grad_logits.defined()) {
      grads = torch::autograd::grad({logits}, inputs, {grad_logits}, /*retain_graph=*/false, /*create_graph=*/false,
                                    /*allow_unused=*/true);
    } else {
      loss = chunk_ce_sum(logits, t);
      grads = torch::autograd::grad({loss * scale}, inputs, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    r.grad_hidden.narrow(1, s, n).copy_(grads[0]);
    for (size_t i = 0; i < head_params.size(); ++i) {
      if (!grads[i + 1].defined()) continue;
      at::Tensor p = head_params[i];
      if (p.grad().defined()) p.mutable_grad().add_(grads[i + 1]);
      else p.mutable_grad() = grads[i + 1].clone();
    }
    r.loss.add_(loss.detach().to(at::kDouble));
    r.n_tokens += count;
  }
  if (!defer_loss) r.loss_sum = r.loss.item<double>();
  return r;
}

at::Tensor to_device_async(const at::Tensor& t, const at::Device& device) {
  if (t.device() == device) return t;
  if (device.is_cuda() && t.is_cpu()) return t.pin_memory().to(device, /*non_blocking=*/true);
  return t.to(device);
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
