// The gated delta rule and causal conv1d, op for op as transformers' modeling_qwen3_5.py (5.17):
// torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule, causal_conv1d_fn/_update. No
// in-place writes into tensors that autograd tracks (outputs are concatenated), so the segmented
// backward can run through them.
#include "nn/gated_delta.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace hearth::nn {

at::Tensor l2norm(const at::Tensor& x, int64_t dim, double eps) {
  at::Tensor inv_norm = at::rsqrt((x * x).sum(dim, /*keepdim=*/true) + eps);
  return x * inv_norm;
}

std::pair<at::Tensor, at::Tensor> causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& state) {
  HEARTH_CHECK(x.dim() == 3, "causal_conv1d: x must be [B, C, T], got ", x.sizes());
  HEARTH_CHECK(weight.dim() == 2 && weight.size(0) == x.size(1), "causal_conv1d: weight must be [C = ", x.size(1),
               ", K], got ", weight.sizes());
  const int64_t B = x.size(0), C = x.size(1), K = weight.size(1);
  at::Tensor st = state.defined() ? state : at::zeros({B, C, K - 1}, x.options().dtype(weight.scalar_type()));
  HEARTH_CHECK(st.dim() == 3 && st.size(0) == B && st.size(1) == C && st.size(2) == K - 1,
               "causal_conv1d: state must be [", B, ", ", C, ", ", K - 1, "], got ", st.sizes());
  // [B, C, K-1+T]: the window the kernel slides over (transformers: cat then .to(weight.dtype)).
  at::Tensor full = at::cat({st.to(weight.scalar_type()), x.to(weight.scalar_type())}, -1);
  at::Tensor new_state = full.narrow(-1, full.size(-1) - (K - 1), K - 1).contiguous();
  // Depthwise: groups = C, weight [C, 1, K], no padding: output length T.
  at::Tensor out = at::conv1d(full, weight.unsqueeze(1), at::Tensor(), /*stride=*/at::IntArrayRef{1},
                              /*padding=*/at::IntArrayRef{0}, /*dilation=*/at::IntArrayRef{1}, /*groups=*/C);
  return {at::silu(out).to(x.scalar_type()), new_state};
}

namespace {

// Shared preamble of both rules: repeats q/k heads up to Hv, moves heads before time and casts to
// float32: q/k/v [B, T, H, D] → [B, H, T, D]; beta/g [B, T, H] → [B, H, T]; q,k L2-normalised.
struct Prepared {
  at::Tensor q, k, v, beta, g;
};

Prepared prepare(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& g,
                 const at::Tensor& beta, const char* who) {
  HEARTH_CHECK(query.dim() == 4 && key.sizes() == query.sizes() && value.dim() == 4 && value.size(0) == key.size(0) &&
                   value.size(1) == key.size(1),
               who, ": query/key must be [B, T, Hk, Dk] and value [B, T, Hv, Dv], got ", query.sizes(), ", ",
               key.sizes(), ", ", value.sizes());
  const int64_t Hk = key.size(2), Hv = value.size(2);
  HEARTH_CHECK(Hv % Hk == 0, who, ": value heads (", Hv, ") must be a multiple of key heads (", Hk, ")");
  const std::vector<int64_t> gb_shape = {value.size(0), value.size(1), Hv};
  HEARTH_CHECK(g.sizes() == at::IntArrayRef(gb_shape) && beta.sizes() == at::IntArrayRef(gb_shape), who,
               ": g and beta must be [B, T, Hv], got ", g.sizes(), ", ", beta.sizes());
  at::Tensor q = query, k = key;
  if (Hk != Hv) {
    q = q.repeat_interleave(Hv / Hk, 2);
    k = k.repeat_interleave(Hv / Hk, 2);
  }
  auto f32 = [](const at::Tensor& x) { return x.transpose(1, 2).to(at::kFloat).contiguous(); };
  Prepared p{f32(q), f32(k), f32(value), f32(beta), f32(g)};
  p.q = l2norm(p.q, -1, 1e-6);
  p.k = l2norm(p.k, -1, 1e-6);
  return p;
}

at::Tensor start_state(const at::Tensor& initial, int64_t B, int64_t H, int64_t Dk, int64_t Dv, const at::Tensor& like,
                       const char* who) {
  if (!initial.defined()) return at::zeros({B, H, Dk, Dv}, like.options());
  HEARTH_CHECK(initial.dim() == 4 && initial.size(0) == B && initial.size(1) == H && initial.size(2) == Dk &&
                   initial.size(3) == Dv,
               who, ": initial_state must be [", B, ", ", H, ", ", Dk, ", ", Dv, "], got ", initial.sizes());
  return initial.to(like.options());
}

}  // namespace

GatedDeltaOut chunk_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                     const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state,
                                     int64_t chunk_size) {
  const auto initial_dtype = query.scalar_type();
  Prepared p = prepare(query, key, value, g, beta, "chunk_gated_delta_rule");
  const int64_t B = p.v.size(0), H = p.v.size(1), T = p.v.size(2), Dk = p.k.size(3), Dv = p.v.size(3);
  const int64_t cs = chunk_size;
  at::Tensor q = p.q * std::pow(static_cast<double>(Dk), -0.5);

  // Pad T to a multiple of the chunk size (zeros: beta = 0 writes nothing, g = 0 keeps the state).
  const int64_t pad = (cs - T % cs) % cs;
  q = at::constant_pad_nd(q, {0, 0, 0, pad});
  at::Tensor k = at::constant_pad_nd(p.k, {0, 0, 0, pad});
  at::Tensor v = at::constant_pad_nd(p.v, {0, 0, 0, pad});
  at::Tensor b = at::constant_pad_nd(p.beta, {0, pad});
  at::Tensor decay = at::constant_pad_nd(p.g, {0, pad});
  const int64_t N = (T + pad) / cs;

  at::Tensor v_beta = v * b.unsqueeze(-1);  // [B, H, Tp, Dv]
  at::Tensor k_beta = k * b.unsqueeze(-1);  // [B, H, Tp, Dk]
  q = q.reshape({B, H, N, cs, Dk});
  k = k.reshape({B, H, N, cs, Dk});
  k_beta = k_beta.reshape({B, H, N, cs, Dk});
  v_beta = v_beta.reshape({B, H, N, cs, Dv});
  decay = decay.reshape({B, H, N, cs});

  at::Tensor strictly_upper = at::ones({cs, cs}, q.options().dtype(at::kBool)).triu(1);
  at::Tensor cum = decay.cumsum(3);  // [B, H, N, cs]: log decay from the chunk start
  // pairwise[i, j] = exp(cum_i - cum_j) for j <= i, 0 above the diagonal: [B, H, N, cs, cs]
  at::Tensor pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3))
                            .masked_fill(strictly_upper, -std::numeric_limits<double>::infinity())
                            .exp();
  at::Tensor ut_system = at::matmul(k_beta, k.transpose(-1, -2)) * pairwise;
  at::Tensor intra = at::matmul(q, k.transpose(-1, -2)) * pairwise;
  at::Tensor decayed_k_beta = k_beta * cum.exp().unsqueeze(-1);
  // (I + strictly-lower(ut_system)) X = rhs: the UT transform of the delta rule.
  at::Tensor new_values = at::linalg_solve_triangular(ut_system, v_beta, /*upper=*/false, /*left=*/true,
                                                      /*unitriangular=*/true);  // [B, H, N, cs, Dv]
  at::Tensor k_cumdecay = at::linalg_solve_triangular(ut_system, decayed_k_beta, false, true, true);  // [.., cs, Dk]

  at::Tensor state = start_state(initial_state, B, H, Dk, Dv, new_values, "chunk_gated_delta_rule");
  q = q * cum.exp().unsqueeze(-1);
  k = k * (cum.narrow(3, cs - 1, 1) - cum).exp().unsqueeze(-1);
  at::Tensor chunk_decay = cum.select(3, cs - 1).exp().unsqueeze(-1).unsqueeze(-1);  // [B, H, N, 1, 1]

  std::vector<at::Tensor> outs;
  outs.reserve(N);
  for (int64_t i = 0; i < N; ++i) {
    at::Tensor v_new = new_values.select(2, i) - at::matmul(k_cumdecay.select(2, i), state);  // [B, H, cs, Dv]
    at::Tensor inter = at::matmul(q.select(2, i), state);
    outs.push_back(inter + at::matmul(intra.select(2, i), v_new));
    state = state * chunk_decay.select(2, i) + at::matmul(k.select(2, i).transpose(-1, -2), v_new);
  }
  at::Tensor out = at::cat(outs, 2).narrow(2, 0, T);  // [B, H, T, Dv]
  return {out.transpose(1, 2).contiguous().to(initial_dtype), state};
}

GatedDeltaOut recurrent_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                         const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state) {
  const auto initial_dtype = query.scalar_type();
  Prepared p = prepare(query, key, value, g, beta, "recurrent_gated_delta_rule");
  const int64_t B = p.v.size(0), H = p.v.size(1), T = p.v.size(2), Dk = p.k.size(3), Dv = p.v.size(3);
  at::Tensor q = p.q / std::pow(static_cast<double>(Dk), 0.5);
  at::Tensor state = start_state(initial_state, B, H, Dk, Dv, p.v, "recurrent_gated_delta_rule");
  std::vector<at::Tensor> outs;
  outs.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor q_t = q.select(2, t), k_t = p.k.select(2, t), v_t = p.v.select(2, t);  // [B, H, D]
    state = state * p.g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    at::Tensor beta_t = p.beta.select(2, t).unsqueeze(-1);
    at::Tensor kv_mem = (state * k_t.unsqueeze(-1)).sum(-2);  // [B, H, Dv]
    at::Tensor delta = (v_t - kv_mem) * beta_t;
    state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
    outs.push_back((state * q_t.unsqueeze(-1)).sum(-2));  // [B, H, Dv]
  }
  at::Tensor out = at::stack(outs, 2);  // [B, H, T, Dv]
  return {out.transpose(1, 2).contiguous().to(initial_dtype), state};
}

}  // namespace hearth::nn
