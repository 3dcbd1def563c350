// Causal GQA attention: eager (plain libtorch) and SDPA paths; masks by absolute positions.
#include "nn/attention.h"

#include <limits>

#include "core/error.h"
#include "core/torch_compat.h"

namespace hearth::nn {

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), Hkv = x.size(1), S = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, Hkv, n_rep, S, D}).reshape({B, Hkv * n_rep, S, D});
}

namespace {
bool needs_mask(int64_t T, int64_t S, const AttentionParams& p) {
  const int64_t q_first = p.q_pos0, k_last = p.k_pos0 + S - 1;
  const bool causal_ok = k_last <= q_first;  // every key at or before the first query
  const bool window_ok = !p.sliding_window || p.k_pos0 > (p.q_pos0 + T - 1) - *p.sliding_window;
  return !(causal_ok && window_ok);
}
}  // namespace

double mask_min(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return std::numeric_limits<float>::lowest();
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kHalf: return -65504.0;
    case at::kBFloat16: return -3.3895313892515355e38;
    default: throw Error(cat("attention_mask: unsupported dtype ", c10::toString(dtype)));
  }
}

at::Tensor attention_mask(int64_t T, int64_t S, const AttentionParams& p, at::ScalarType dtype, at::Device device) {
  if (!needs_mask(T, S, p)) return {};
  auto lopt = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor qp = at::arange(p.q_pos0, p.q_pos0 + T, lopt).unsqueeze(1);
  at::Tensor kp = at::arange(p.k_pos0, p.k_pos0 + S, lopt).unsqueeze(0);
  at::Tensor allowed = kp <= qp;
  if (p.sliding_window) allowed = allowed.logical_and(kp > qp - *p.sliding_window);
  const double min = mask_min(dtype);
  at::Tensor zero = at::zeros({}, at::TensorOptions().dtype(dtype).device(device));
  return at::where(allowed, zero, at::full({}, min, zero.options()));
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionParams& p) {
  HEARTH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                   q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
               "attention: q [B,H,T,D] / k,v [B,Hkv,S,D] mismatch: q ", q.sizes(), " k ", k.sizes(), " v ", v.sizes());
  const int64_t T = q.size(2), S = k.size(2);
  const int64_t n_rep = q.size(1) / k.size(1);
  bool use_sdpa = p.backend == AttentionBackend::kSdpa || (p.backend == AttentionBackend::kAuto && compat::kHasSdpa);
  HEARTH_CHECK(!use_sdpa || compat::kHasSdpa, "attention: SDPA requested but libtorch ", compat::torch_version(),
               " lacks it");
  at::Tensor keys = repeat_kv(k, n_rep);
  at::Tensor values = repeat_kv(v, n_rep);
  if (use_sdpa) {
    // Like transformers' sdpa_attention_forward: is_causal when no explicit mask is needed beyond
    // square causality; otherwise an explicit mask.
    const bool plain_causal = !p.mask.defined() && T > 1 && T == S && p.q_pos0 == p.k_pos0 && !p.sliding_window;
    c10::optional<at::Tensor> mask;
    if (p.mask.defined()) {
      mask = p.mask.to(q.scalar_type());
    } else if (!plain_causal) {
      at::Tensor m = attention_mask(T, S, p, q.scalar_type(), q.device());
      if (m.defined()) mask = m;
    }
    return compat::sdpa(q, keys, values, mask, plain_causal, p.scale);
  }
  at::Tensor weights = at::matmul(q, keys.transpose(2, 3)) * p.scale;
  at::Tensor mask = p.mask.defined() ? p.mask.to(q.scalar_type()) : attention_mask(T, S, p, q.scalar_type(), q.device());
  if (mask.defined()) weights = weights + mask;
  weights = at::softmax(weights, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(weights, values);
}

}  // namespace hearth::nn
