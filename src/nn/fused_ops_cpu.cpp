// CPU fp32 loops for nn/fused_ops.h's RMSNorm and RoPE (see nn/fused_ops_cpu.h).
#include "nn/fused_ops_cpu.h"

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace hearth::nn {
namespace cpu_fused {

namespace {
// CPU fp32 tensors (or undefined ones) with nothing for autograd to record.
bool applies(std::initializer_list<const at::Tensor*> ts) {
  for (const at::Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!t->is_cpu() || t->scalar_type() != at::kFloat) return false;
    if (c10::GradMode::is_enabled() && t->requires_grad()) return false;
  }
  return true;
}

// Rows per parallel task: at least ~16K elements each, so a decode step's single row stays on the
// calling thread.
int64_t grain_rows(int64_t row_elems) { return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, row_elems)); }

// One row of RoPE. Products and sums each rounded to fp32 as the tensor ops round them: contraction
// into a fused multiply-add is kept out (GCC contracts by default where the target has FMA).
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
void rope_row(const float* x, const float* c, const float* s, float* y, int64_t D, int64_t rot) {
  const int64_t half = rot / 2;
  for (int64_t d = 0; d < half; ++d) {
    const float a = x[d] * c[d];
    const float b = -x[d + half] * s[d];
    y[d] = a + b;
  }
  for (int64_t d = half; d < rot; ++d) {
    const float a = x[d] * c[d];
    const float b = x[d - half] * s[d];
    y[d] = a + b;
  }
  for (int64_t d = rot; d < D; ++d) y[d] = x[d];
}
// The layout apply_rotary's tensor ops give y, which later checks read (the CPU decode attention
// takes a [B, H, 1, D] q only with contiguous strides): a partial rotation ends in at::cat
// (contiguous); a full one is an elementwise op, which keeps x's order of dims (size-1 dims
// aside): contiguous when the others already run outermost to innermost, else x's layout.
at::Tensor rotary_out(const at::Tensor& x, int64_t rot) {
  bool ordered = true;
  int64_t prev = std::numeric_limits<int64_t>::max();
  for (int64_t i = 0; i < x.dim() && ordered; ++i) {
    if (x.size(i) == 1) continue;
    ordered = x.stride(i) <= prev;
    prev = x.stride(i);
  }
  return rot < x.size(-1) || ordered ? at::empty(x.sizes(), x.options()) : at::empty_like(x);
}
}  // namespace

std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                               double eps) {
  if (!applies({&x, &residual, &weight}) || x.numel() == 0 || !x.is_contiguous() || !weight.is_contiguous() ||
      (residual.defined() && !residual.is_contiguous()))
    return {};
  const int64_t C = x.size(-1), N = x.numel() / C;
  at::Tensor s = residual.defined() ? at::empty_like(x) : x;
  at::Tensor y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* rp = residual.defined() ? residual.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* sp = s.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float feps = static_cast<float>(eps);  // variance + eps: an fp32 add
  at::parallel_for(0, N, grain_rows(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* h = rp ? sp + r * C : xp + r * C;
      if (rp)
        for (int64_t i = 0; i < C; ++i) sp[r * C + i] = xp[r * C + i] + rp[r * C + i];
      double ss = 0;
      for (int64_t i = 0; i < C; ++i) ss += static_cast<double>(h[i]) * h[i];
      const float var = static_cast<float>(ss / static_cast<double>(C));
      const float inv = 1.0f / std::sqrt(var + feps);  // at::rsqrt on the CPU: 1 / sqrt
      float* out = yp + r * C;
      for (int64_t i = 0; i < C; ++i) {
        const float normed = h[i] * inv;  // h * rsqrt(...), then .to(dtype): a no-op in fp32
        out[i] = wp[i] * normed;
      }
    }
  });
  return {s, y};
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  int64_t cs_b = 0, cs_t = 0;
  if (!applies({&x, &cos, &sin}) || !rotary_table_strides(x, cos, sin, cs_b, cs_t)) return {};
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), rot = cos.size(-1);
  at::Tensor y = rotary_out(x, rot);
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, B * H * T, grain_rows(D), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / (H * T), h = (i / T) % H, t = i % T;
      rope_row(xp + b * x.stride(0) + h * x.stride(1) + t * x.stride(2), cp + b * cs_b + t * cs_t,
               sp + b * cs_b + t * cs_t, yp + b * y.stride(0) + h * y.stride(1) + t * y.stride(2), D, rot);
    }
  });
  return y;
}

}  // namespace cpu_fused

bool rotary_table_strides(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t& cs_b,
                          int64_t& cs_t) {
  if (x.dim() != 4 || x.numel() == 0 || x.stride(3) != 1 || sin.sizes() != cos.sizes() ||
      sin.strides() != cos.strides() || cos.dim() < 1 || cos.stride(-1) != 1)
    return false;
  const int64_t B = x.size(0), T = x.size(2), D = x.size(3), rot = cos.size(-1);
  if (rot < 2 || rot % 2 != 0 || rot > D) return false;
  cs_b = 0, cs_t = 0;
  if (cos.dim() == 2 && (cos.size(0) == T || cos.size(0) == 1)) {
    cs_t = cos.size(0) == 1 ? 0 : cos.stride(0);
    return true;
  }
  if (cos.dim() == 4 && (cos.size(0) == B || cos.size(0) == 1) && cos.size(1) == 1 &&
      (cos.size(2) == T || cos.size(2) == 1)) {
    cs_b = cos.size(0) == 1 ? 0 : cos.stride(0);
    cs_t = cos.size(2) == 1 ? 0 : cos.stride(2);
    return true;
  }
  return false;
}

}  // namespace hearth::nn
