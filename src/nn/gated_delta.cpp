// The gated delta rule and causal conv1d, op for op as transformers' modeling_qwen3_5.py (5.17):
// torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule, causal_conv1d_fn/_update. No
// in-place writes into tensors that autograd tracks (outputs are concatenated), so the segmented
// backward can run through them. The dispatch to the CUDA kernels (kernels/gated_delta.cu) of the
// inter-chunk scan and the one-token step is here too; the tensor ops are their reference.
#include "nn/gated_delta.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include <c10/core/GradMode.h>

#include "core/error.h"
#include "nn/fused_ops.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/gated_delta.h"
#endif

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
  at::Tensor chunk_decay = cum.select(3, cs - 1).exp();  // [B, H, N]

  GatedDeltaOut scanned = chunk_gated_delta_scan(new_values, k_cumdecay, q, intra, k, chunk_decay, state);
  at::Tensor out = scanned.out.narrow(2, 0, T);  // [B, H, T, Dv]
  return {out.transpose(1, 2).contiguous().to(initial_dtype), scanned.state};
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

namespace {

#ifdef HEARTH_WITH_CUDA_KERNELS
// Whether autograd would record an op over these tensors (then the kernels, which have no
// backward, stay out).
bool gd_records_grad(std::initializer_list<const at::Tensor*> ts) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

// All defined tensors on one CUDA device.
bool gd_on_one_cuda(std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor& first = **ts.begin();
  if (!first.is_cuda()) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && (!t->is_cuda() || t->device() != first.device())) return false;
  return true;
}

kernels::QDtype gd_qdtype(at::ScalarType st) {
  return st == at::kBFloat16 ? kernels::QDtype::kBFloat16 : st == at::kHalf ? kernels::QDtype::kFloat16
                                                                             : kernels::QDtype::kFloat32;
}

bool gd_float_dtype(at::ScalarType st) { return st == at::kFloat || st == at::kHalf || st == at::kBFloat16; }

// Contiguous float32 with a 16-byte aligned start (cp.async's requirement), copying only if needed.
at::Tensor gd_aligned_f32(const at::Tensor& t) {
  at::Tensor c = t.to(at::kFloat).contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
  return c;
}
#endif

}  // namespace

GatedDeltaOut chunk_gated_delta_scan(const at::Tensor& new_values, const at::Tensor& k_cumdecay, const at::Tensor& q,
                                     const at::Tensor& intra, const at::Tensor& k, const at::Tensor& chunk_decay,
                                     const at::Tensor& state) {
  HEARTH_CHECK(q.dim() == 5 && k.sizes() == q.sizes() && k_cumdecay.sizes() == q.sizes() && new_values.dim() == 5 &&
                   new_values.sizes().slice(0, 4) == q.sizes().slice(0, 4),
               "chunk_gated_delta_scan: q, k, k_cumdecay must be [B, H, N, cs, Dk] and new_values [B, H, N, cs, Dv], got ",
               q.sizes(), ", ", k.sizes(), ", ", k_cumdecay.sizes(), ", ", new_values.sizes());
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), cs = q.size(3), Dk = q.size(4), Dv = new_values.size(4);
  HEARTH_CHECK(intra.dim() == 5 && intra.sizes().slice(0, 4) == q.sizes().slice(0, 4) && intra.size(4) == cs,
               "chunk_gated_delta_scan: intra must be [", B, ", ", H, ", ", N, ", ", cs, ", ", cs, "], got ",
               intra.sizes());
  HEARTH_CHECK(chunk_decay.dim() == 3 && chunk_decay.sizes() == q.sizes().slice(0, 3),
               "chunk_gated_delta_scan: chunk_decay must be [", B, ", ", H, ", ", N, "], got ", chunk_decay.sizes());
  HEARTH_CHECK(state.dim() == 4 && state.size(0) == B && state.size(1) == H && state.size(2) == Dk &&
                   state.size(3) == Dv,
               "chunk_gated_delta_scan: state must be [", B, ", ", H, ", ", Dk, ", ", Dv, "], got ", state.sizes());
#ifdef HEARTH_WITH_CUDA_KERNELS
  if (fused_decode_enabled() && cs == 64 && N >= 1 && Dk % 4 == 0 && Dk <= 128 &&
      gd_on_one_cuda({&new_values, &k_cumdecay, &q, &intra, &k, &chunk_decay, &state}) &&
      !gd_records_grad({&new_values, &k_cumdecay, &q, &intra, &k, &chunk_decay, &state})) {
    const c10::cuda::CUDAGuard guard(q.device());
    const at::Tensor nv = gd_aligned_f32(new_values), kcd = gd_aligned_f32(k_cumdecay), qc = gd_aligned_f32(q);
    const at::Tensor ic = gd_aligned_f32(intra), kc = gd_aligned_f32(k), dc = gd_aligned_f32(chunk_decay);
    const at::Tensor s0 = gd_aligned_f32(state);
    at::Tensor out = at::empty({B, H, N * cs, Dv}, nv.options());
    at::Tensor final_state = at::empty({B, H, Dk, Dv}, nv.options());
    kernels::ChunkScanArgs a;
    a.new_values = nv.data_ptr<float>();
    a.k_cumdecay = kcd.data_ptr<float>();
    a.q = qc.data_ptr<float>();
    a.intra = ic.data_ptr<float>();
    a.k = kc.data_ptr<float>();
    a.chunk_decay = dc.data_ptr<float>();
    a.initial_state = s0.data_ptr<float>();
    a.out = out.data_ptr<float>();
    a.final_state = final_state.data_ptr<float>();
    a.BH = B * H, a.N = N, a.dk = Dk, a.dv = Dv;
    a.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
    if (const char* err = kernels::chunk_scan(a)) throw Error(cat("chunk_gated_delta_scan: ", err));
    return {out, final_state};
  }
#endif
  // The reference: torch_chunk_gated_delta_rule's loop, chunk by chunk.
  at::Tensor S = state;
  std::vector<at::Tensor> outs;
  outs.reserve(N);
  for (int64_t i = 0; i < N; ++i) {
    at::Tensor v_new = new_values.select(2, i) - at::matmul(k_cumdecay.select(2, i), S);  // [B, H, cs, Dv]
    at::Tensor inter = at::matmul(q.select(2, i), S);
    outs.push_back(inter + at::matmul(intra.select(2, i), v_new));
    S = S * chunk_decay.select(2, i).unsqueeze(-1).unsqueeze(-1) + at::matmul(k.select(2, i).transpose(-1, -2), v_new);
  }
  return {at::cat(outs, 2), S};  // [B, H, N·cs, Dv]
}

GatedDeltaStep fused_gated_delta_step(const at::Tensor& mixed_qkv, const at::Tensor& conv_weight,
                                      const at::Tensor& conv_state, const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& state,
                                      int64_t num_k_heads, int64_t head_k_dim, int64_t head_v_dim, bool in_place) {
#ifdef HEARTH_WITH_CUDA_KERNELS
  const std::initializer_list<const at::Tensor*> all = {&mixed_qkv, &conv_weight, &conv_state, &a,
                                                        &b,         &A_log,       &dt_bias,    &state};
  for (const at::Tensor* t : all)
    if (!t->defined()) return {};
  if (!fused_decode_enabled() || !gd_on_one_cuda(all) || gd_records_grad(all)) return {};
  const at::ScalarType dt = mixed_qkv.scalar_type();
  if (!gd_float_dtype(dt) || conv_weight.scalar_type() != dt || conv_state.scalar_type() != dt ||
      a.scalar_type() != dt || b.scalar_type() != dt || !gd_float_dtype(A_log.scalar_type()) ||
      !gd_float_dtype(dt_bias.scalar_type()) || state.scalar_type() != at::kFloat)
    return {};
  if (mixed_qkv.dim() != 3 || state.dim() != 4 || conv_weight.dim() != 2 || conv_state.dim() != 3) return {};
  const int64_t B = mixed_qkv.size(0), C = mixed_qkv.size(2), Hk = num_k_heads, Dk = head_k_dim, Dv = head_v_dim;
  const int64_t Hv = state.size(1), K = conv_weight.size(1);
  if (mixed_qkv.size(1) != 1 || mixed_qkv.stride(2) != 1 || Hk < 1 || Hv % Hk != 0 || C != 2 * Hk * Dk + Hv * Dv ||
      state.size(0) != B || state.size(2) != Dk || state.size(3) != Dv || !state.is_contiguous() ||
      conv_weight.size(0) != C || !conv_weight.is_contiguous() || K < 2 || K > 8 || Dk > 256 ||
      conv_state.size(0) != B || conv_state.size(1) != C || conv_state.size(2) != K - 1 ||
      !conv_state.is_contiguous() || a.dim() != 3 || b.dim() != 3 || a.size(0) != B || b.size(0) != B ||
      a.size(1) != 1 || b.size(1) != 1 || a.size(2) != Hv || b.size(2) != Hv || a.stride(2) != 1 ||
      b.stride(2) != 1 || A_log.numel() != Hv || dt_bias.numel() != Hv || !A_log.is_contiguous() ||
      !dt_bias.is_contiguous() || B > 65535 || Hv > 65535)
    return {};
  const c10::cuda::CUDAGuard guard(mixed_qkv.device());
  GatedDeltaStep r;
  r.out = at::empty({B, 1, Hv, Dv}, mixed_qkv.options());
  r.conv_state = at::empty_like(conv_state);
  r.state = in_place ? state : at::empty_like(state);
  kernels::GatedDeltaStepArgs g;
  g.mixed_qkv = mixed_qkv.data_ptr();
  g.x_sb = mixed_qkv.stride(0);
  g.conv_state = conv_state.data_ptr();
  g.conv_weight = conv_weight.data_ptr();
  g.conv_state_out = r.conv_state.data_ptr();
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.a_sb = a.stride(0), g.b_sb = b.stride(0);
  g.A_log = A_log.data_ptr();
  g.dt_bias = dt_bias.data_ptr();
  g.A_log_dtype = gd_qdtype(A_log.scalar_type());
  g.dt_bias_dtype = gd_qdtype(dt_bias.scalar_type());
  g.state = state.data_ptr<float>();
  g.state_out = r.state.data_ptr<float>();
  g.out = r.out.data_ptr();
  g.B = B, g.Hk = Hk, g.Hv = Hv, g.dk = Dk, g.dv = Dv, g.K = K;
  g.dtype = gd_qdtype(dt);
  g.stream = c10::cuda::getCurrentCUDAStream(mixed_qkv.device().index()).stream();
  if (const char* err = kernels::gated_delta_step(g)) throw Error(cat("fused_gated_delta_step: ", err));
  return r;
#else
  (void)mixed_qkv, (void)conv_weight, (void)conv_state, (void)a, (void)b, (void)A_log, (void)dt_bias, (void)state,
      (void)num_k_heads, (void)head_k_dim, (void)head_v_dim, (void)in_place;
  return {};
#endif
}

}  // namespace hearth::nn
