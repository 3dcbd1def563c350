// Causal GQA attention: eager (plain libtorch) and SDPA paths; masks by absolute positions.
#include "nn/attention.h"

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "nn/cpu_gemm.h"
#include "nn/decode_attention.h"
#include "nn/fused_ops.h"
#include "nn/lean_grad.h"

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

namespace {
// CPU fp32 with a contiguous last dim: what the CPU paths below read through raw pointers.
bool f32cpu(const at::Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat && t.stride(3) == 1; }

// The CPU fp32 prefill path: one (batch row, head) pair per task on ATen's threads; per pair the
// scores q kᵀ · scale by a single-threaded sgemm (nn/cpu_gemm.h), hidden keys set to -inf, softmax
// (ATen's vectorized kernel, inline in the parallel region), then P v by sgemm straight into the
// output laid out [B, T, H, D] (returned as its [B, H, T, D] view, so the caller's transpose back
// is free). GQA heads read their kv head in place (no repeat_kv copy). Undefined tensor when it
// does not apply: not CPU fp32, an explicit mask, T < 2 (decode steps), autograd, inner dims not
// contiguous or the fast GEMM off.
at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionParams& p) {
  if (p.backend != AttentionBackend::kAuto || p.mask.defined() || !f32cpu(q) || !f32cpu(k) || !f32cpu(v)) return {};
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return {};
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  if (T < 1 || S == 0 || D == 0 || !cpu::fast_gemm_enabled()) return {};
  const int64_t n_rep = H / Hkv;
  at::Tensor out = at::empty({B, T, H, D}, q.options());
  float* op = out.data_ptr<float>();
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const bool masked = needs_mask(T, S, p);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, B * H, 1, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(2 * T * S));
    float* sc = buf.data();
    float* pr = sc + T * S;
    at::Tensor scores = at::from_blob(sc, {T, S}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor probs = at::from_blob(pr, {T, S}, at::TensorOptions().dtype(at::kFloat));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H, h = i % H, hk = h / n_rep;
      const float* qh = qp + b * q.stride(0) + h * q.stride(1);
      const float* kh = kp + b * k.stride(0) + hk * k.stride(1);
      const float* vh = vp + b * v.stride(0) + hk * v.stride(1);
      cpu::sgemm_nt(T, S, D, qh, q.stride(2), kh, k.stride(2), sc, S, static_cast<float>(p.scale));
      if (masked) {
        for (int64_t t = 0; t < T; ++t) {
          const int64_t qpos = p.q_pos0 + t;
          float* row = sc + t * S;
          int64_t visible = 0;
          for (int64_t j = 0; j < S; ++j) {
            const int64_t kpos = p.k_pos0 + j;
            const bool ok = kpos <= qpos && (!p.sliding_window || kpos > qpos - *p.sliding_window);
            if (ok) ++visible;
            else row[j] = neg_inf;
          }
          // No visible key: the additive-mask path gives equal weights to all keys; so does this.
          if (visible == 0) std::fill(row, row + S, 0.0f);
        }
      }
      at::_softmax_out(probs, scores, 1, false);
      cpu::sgemm_nn(T, D, S, pr, S, vh, v.stride(2), op + b * T * H * D + h * D, H * D);
    }
  });
  return out.permute({0, 2, 1, 3});
}

// Decode-sized steps on the CPU under an explicit additive mask (the decode slots' [B, 1, 1, S]
// over a length bucket): per (batch row, kv head), its n_rep query heads × T ≤ 8 queries as one
// [R, D] block score only the keys from the first to the last visible one (a slot's bucket may be
// twice its row's length) by single-threaded sgemm (nn/cpu_gemm.h), K and V read in place (no
// repeat_kv copy); the mask's values still apply inside that span. Same softmax(q kᵀ·scale + mask) v
// as the plain path up to summation order. Undefined tensor when it does not apply: not CPU fp32,
// no mask or one of another shape, T > 8, autograd, q not contiguous [B, H, T, D], the fast GEMM
// off, or a query row with no visible key.
at::Tensor attention_decode_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionParams& p) {
  if (p.backend != AttentionBackend::kAuto || !p.mask.defined() || !f32cpu(q) || !f32cpu(k) || !f32cpu(v)) return {};
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return {};
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const at::Tensor& m = p.mask;
  if (T > 8 || S == 0 || D == 0 || !cpu::fast_gemm_enabled() || q.stride(2) != D || q.stride(1) != T * D || m.dim() != 4 || m.size(1) != 1 || m.size(3) != S ||
      (m.size(0) != 1 && m.size(0) != B) || (m.size(2) != 1 && m.size(2) != T) || !m.is_cpu() ||
      m.scalar_type() != at::kFloat)
    return {};
  const at::Tensor mask = m.contiguous();
  const float* mp = mask.data_ptr<float>();
  const int64_t mB = mask.size(0) == 1 ? 0 : S * mask.size(2), mT = mask.size(2) == 1 ? 0 : S;
  // The visible span of every (row, query): mask values above half the lowest float.
  const float hidden = std::numeric_limits<float>::lowest() / 2;
  std::vector<int64_t> lo(static_cast<size_t>(B * T)), hi(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* row = mp + b * mB + t * mT;
      int64_t j0 = 0, j1 = S - 1;
      while (j0 < S && row[j0] <= hidden) ++j0;
      if (j0 == S) return {};  // nothing visible: the plain path's (uniform) answer
      while (row[j1] <= hidden) --j1;
      lo[b * T + t] = j0;
      hi[b * T + t] = j1 + 1;
    }
  const int64_t n_rep = H / Hkv, R = n_rep * T;  // query rows per kv head: [R, D] in q, in place
  at::Tensor out = at::empty({B, H, T, D}, q.options());
  float* op = out.data_ptr<float>();
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  // At least ~256K multiply-adds per task: a small step runs on the calling thread instead of
  // waking ATen's pool (whose spinning workers took the core from the server's other threads:
  // 1-client serving at half speed with grain 1).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, 2 * R * S * D));
  at::parallel_for(0, B * Hkv, grain, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> buf;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / Hkv, hk = i % Hkv;
      // The union of this row's query spans; each query's own mask hides the rest of it.
      int64_t j0 = S, j1 = 0;
      for (int64_t t = 0; t < T; ++t) {
        j0 = std::min(j0, lo[b * T + t]);
        j1 = std::max(j1, hi[b * T + t]);
      }
      const int64_t n = j1 - j0;
      buf.resize(static_cast<size_t>(2 * R * n));
      float* sc = buf.data();
      const float* kh = kp + b * k.stride(0) + hk * k.stride(1) + j0 * k.stride(2);
      const float* vh = vp + b * v.stride(0) + hk * v.stride(1) + j0 * v.stride(2);
      cpu::sgemm_nt(R, n, D, qp + b * q.stride(0) + hk * n_rep * q.stride(1), D, kh, k.stride(2), sc, n,
                    static_cast<float>(p.scale));
      for (int64_t r = 0; r < R; ++r) {
        const float* mrow = mp + b * mB + (r % T) * mT + j0;
        float* x = sc + r * n;
        for (int64_t j = 0; j < n; ++j) x[j] += mrow[j];
      }
      at::Tensor scores = at::from_blob(sc, {R, n}, at::TensorOptions().dtype(at::kFloat));
      at::Tensor probs = at::from_blob(sc + R * n, {R, n}, at::TensorOptions().dtype(at::kFloat));
      at::_softmax_out(probs, scores, 1, false);
      cpu::sgemm_nn(R, D, n, sc + R * n, n, vh, v.stride(2), op + (b * H + hk * n_rep) * T * D, D);
    }
  });
  return out;
}

// Decode-sized attention on CUDA with the fused path on: Hearth's split-K kernel
// (nn/decode_attention.h) over k/v in place, the mask built from the positions unless given (only
// once the cheap checks pass). Undefined tensor when it does not apply; attention_grouped and the
// SDPA/plain paths below stay the reference.
at::Tensor attention_decode_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionParams& p) {
  if (!q.is_cuda() || !fused_decode_enabled()) return {};
  const int64_t T = q.size(2), S = k.size(2), D = q.size(3), n_rep = q.size(1) / k.size(1);
  if (S == 0 || n_rep * T > 64 || n_rep * T * D > 4096 || (D != 64 && D != 128 && D != 256)) return {};
  at::Tensor mask = p.mask.defined() ? p.mask : attention_mask(T, S, p, q.scalar_type(), q.device());
  return decode_attention(q, k, v, mask, p.scale);
}

// Decode-sized GQA on CUDA with the fused path on (nn/fused_ops.h) and nothing to differentiate:
// the n_rep query heads of each kv head attend as n_rep·T rows of one head ([B, Hkv, n_rep·T, D],
// the mask's rows repeated to match), so K and V are read in place instead of through repeat_kv's
// copies of the whole cache. Same softmax(q kᵀ·scale + mask) v per row; the kernels' summation
// order may differ from the ungrouped call (within rounding). Undefined tensor when it does not
// apply (MHA, T·n_rep > 64, a causal square block, a per-head mask, CPU, grad, switched off).
at::Tensor attention_grouped(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionParams& p,
                             bool use_sdpa) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t n_rep = H / Hkv;
  if (n_rep == 1 || T * n_rep > 64 || S == 0 || !q.is_cuda() || !fused_decode_enabled()) return {};
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return {};
  at::Tensor mask = p.mask.defined() ? p.mask.to(q.scalar_type()) : attention_mask(T, S, p, q.scalar_type(), q.device());
  if (mask.defined()) {
    if ((mask.dim() != 2 && mask.dim() != 4) || mask.size(-2) != T || (mask.dim() == 4 && mask.size(1) != 1)) return {};
    std::vector<int64_t> rep = mask.sizes().vec(), flat = mask.sizes().vec();
    rep.insert(rep.end() - 2, n_rep);
    flat[flat.size() - 2] = n_rep * T;
    mask = mask.unsqueeze(-3).expand(rep).reshape(flat);
  }
  at::Tensor qg = q.reshape({B, Hkv, n_rep * T, D});
  at::Tensor out;
  if (use_sdpa) {
    c10::optional<at::Tensor> m;
    if (mask.defined()) m = mask;
    out = compat::sdpa(qg, k, v, m, /*is_causal=*/false, p.scale);
  } else {
    at::Tensor weights = at::matmul(qg, k.transpose(2, 3)) * p.scale;
    if (mask.defined()) weights = weights + mask;
    out = at::matmul(at::softmax(weights, -1, at::kFloat).to(q.scalar_type()), v);
  }
  return out.reshape({B, H, T, D});
}

// Operands SDPA's flash kernel takes with enable_gqa (PyTorch >= 2.5): CUDA, half or bf16 q/k/v of
// one dtype and device, head dims up to 256. Neither flash nor cuDNN takes more and the
// memory-efficient kernel (the one that takes Gemma 4's 512) has no GQA, so enable_gqa there would
// fall back to the math path's [B, H, T, S] scores; elsewhere the repeated call stays.
bool flash_gqa_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!compat::kHasSdpaGqa || !q.is_cuda() || q.size(3) > 256) return false;
  const at::ScalarType st = q.scalar_type();
  return (st == at::kBFloat16 || st == at::kHalf) && k.scalar_type() == st && v.scalar_type() == st &&
         k.device() == q.device() && v.device() == q.device();
}

// The training path of square causal SDPA: autograd recording, lean path on (nn/lean_grad.h),
// flash_gqa_operands. SDPA then reads each kv head in place (enable_gqa) instead of repeat_kv's
// copies, which its backward would keep: at 512K tokens of the 8B shape (32 q heads, 8 kv heads,
// bf16) 8.6 GB fewer saved and a 6.4 GB lower attention peak (H200, PyTorch 2.11). There both calls
// take the same kernel (cuDNN's by default, flash's with cuDNN off; both accept GQA; checked for
// bf16/fp16, head dims 128 and 64), whose output, dk and dv are bit-identical to the repeated
// call's (dq differs from run to run in either: atomics), so the forward without a graph and its
// recomputation agree. Inference: sdpa_gqa_inference_applies.
bool sdpa_gqa_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return lean_grad_enabled() && records_grad(q, k, v) && flash_gqa_operands(q, k, v);
}

// A later prompt chunk (T > 1 queries that are the last T of S > T keys, no window, no explicit
// mask): flash attention aligned lower-right (compat::flash_causal_lower_right) instead of SDPA's
// memory-efficient kernel under a [T, S] mask with keys and values repeated per query head. Not
// with the reference ops (nn::FusedDecodeOff); HEARTH_FLASH_CHUNK=0 keeps the masked SDPA call (A/B).
bool flash_chunk_applies(int64_t T, int64_t S, const AttentionParams& p) {
  static const bool on = env_switch_on("HEARTH_FLASH_CHUNK");
  return on && fused_decode_enabled() && T > 1 && T < S && !p.mask.defined() && !p.sliding_window &&
         p.q_pos0 + T == p.k_pos0 + S;
}

// Inference (nothing recorded) without a mask, as transformers' sdpa_attention_forward decides
// (integrations/sdpa_attention.py use_gqa_in_sdpa: PyTorch >= 2.5 and attention_mask None): SDPA
// reads each kv head in place (enable_gqa) instead of repeat_kv's copies — the call transformers
// makes, so its bits are the reference's, and a prompt's keys and values are not copied n_rep times
// per layer. Only with flash_gqa_operands. There a square causal block's output is bit-identical
// to the repeated call's (Attention.CudaInferenceGqaIsTheRepeatedCall), so training's graph-free
// forwards (boundaries) and its recomputation (sdpa_gqa_applies or the repeated call) agree — given
// the same SDPA backend: training runs the former under the reference ops, which keep cuDNN.
bool sdpa_gqa_inference_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return !records_grad(q, k, v) && flash_gqa_operands(q, k, v);
}
}  // namespace

at::Tensor attention_sliding_blocked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const AttentionParams& p, int64_t block) {
  const int64_t T = q.size(2), S = k.size(2);
  if (!p.sliding_window || p.mask.defined() || block < 1 || T <= block) return {};
  const int64_t W = *p.sliding_window;
  // Query block [i0, i1) sits at absolute positions a..b; it sees keys at (a - W, b].
  struct Span { int64_t i0, n, k0, kn; };
  std::vector<Span> spans;
  for (int64_t i0 = 0; i0 < T; i0 += block) {
    const int64_t n = std::min(block, T - i0);
    const int64_t a = p.q_pos0 + i0, b = a + n - 1;
    const int64_t k0 = std::max<int64_t>(0, a - W + 1 - p.k_pos0), k1 = std::min<int64_t>(S, b - p.k_pos0 + 1);
    // Every query of the block must see a key: its own position (or the last key before it) is in range.
    if (a < p.k_pos0 || b - W + 1 > p.k_pos0 + S - 1 || k1 <= k0) return {};
    spans.push_back({i0, n, k0, k1 - k0});
  }
  std::vector<at::Tensor> outs;
  outs.reserve(spans.size());
  for (const Span& sp : spans) {
    AttentionParams pb = p;
    pb.q_pos0 = p.q_pos0 + sp.i0;
    pb.k_pos0 = p.k_pos0 + sp.k0;
    outs.push_back(attention(q.narrow(2, sp.i0, sp.n), k.narrow(2, sp.k0, sp.kn), v.narrow(2, sp.k0, sp.kn), pb));
  }
  return at::cat(outs, 2);
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
  if (at::Tensor fast = attention_cpu(q, k, v, p); fast.defined()) return fast;
  if (at::Tensor fast = attention_decode_cpu(q, k, v, p); fast.defined()) return fast;
  if (at::Tensor fast = attention_decode_kernel(q, k, v, p); fast.defined()) return fast;
  if (at::Tensor grouped = attention_grouped(q, k, v, p, use_sdpa); grouped.defined()) return grouped;
  // A long windowed block (Gemma's and Mistral's sliding layers at 8K+): by query blocks, not one
  // [T, S] mask (at 128K tokens that mask alone is 32 GB in bf16).
  constexpr int64_t kBlockedMinEntries = int64_t{1} << 24;
  if (p.sliding_window && !p.mask.defined() && T * S >= kBlockedMinEntries && *p.sliding_window * 4 <= S)
    if (at::Tensor blocked = attention_sliding_blocked(q, k, v, p, std::max<int64_t>(*p.sliding_window, 1024));
        blocked.defined())
      return blocked;
  if (use_sdpa && flash_chunk_applies(T, S, p) && !records_grad(q, k, v))
    if (at::Tensor out = compat::flash_causal_lower_right(q, k, v, p.scale); out.defined()) return out;
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
    // With the reference ops (nn::FusedDecodeOff: a training run's forwards without a graph, the
    // strict parity tier) inference keeps SDPA's cuDNN backend, the kernel a recomputation with
    // autograd takes, so both give the same bits.
    const bool reference = !fused_decode_enabled();
    if (n_rep > 1 && ((plain_causal && sdpa_gqa_applies(q, k, v)) || (!mask && sdpa_gqa_inference_applies(q, k, v))))
      return compat::sdpa(q, k, v, mask, plain_causal, p.scale, /*enable_gqa=*/true, reference);
    return compat::sdpa(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, plain_causal, p.scale, false, reference);
  }
  at::Tensor keys = repeat_kv(k, n_rep);
  at::Tensor values = repeat_kv(v, n_rep);
  at::Tensor weights = at::matmul(q, keys.transpose(2, 3)) * p.scale;
  at::Tensor mask = p.mask.defined() ? p.mask.to(q.scalar_type()) : attention_mask(T, S, p, q.scalar_type(), q.device());
  if (mask.defined()) weights = weights + mask;
  weights = at::softmax(weights, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(weights, values);
}

}  // namespace hearth::nn
