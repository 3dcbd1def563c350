// Dispatch of the fused decode ops (kernels/norm_act.cu, kernels/rope_cache.cu) and their
// tensor-op references.
#include "nn/fused_ops.h"

#include <c10/core/GradMode.h>

#include <atomic>

#include "core/env.h"
#include "core/error.h"
#include "nn/fused_ops_cpu.h"
#include "nn/lean_grad.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/norm_act.h"
#include "kernels/rope_cache.h"
#endif

namespace hearth::nn {

namespace {
std::atomic<bool>& fused_flag() {
  static std::atomic<bool> on{env_switch_on("HEARTH_FUSED_DECODE")};
  return on;
}

// LlamaRMSNorm's ops; while autograd records, the lean Function (nn/lean_grad.h: the same ops
// forward, no fp32 copy of s kept for the backward).
at::Tensor reference_norm(const at::Tensor& s, const at::Tensor& weight, double eps) {
  if (lean_grad_enabled() && records_grad(s, weight)) return rms_norm_lean(s, weight, eps);
  at::Tensor h = s.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  return weight * h.to(s.scalar_type());
}

#ifdef HEARTH_WITH_CUDA_KERNELS
// The kernel applies: enabled, CUDA, a float dtype shared by all, and nothing for autograd to record.
bool kernel_applies(std::initializer_list<const at::Tensor*> ts) {
  if (!fused_decode_enabled()) return false;
  const at::Tensor& first = **ts.begin();
  const at::ScalarType st = first.scalar_type();
  if (!first.is_cuda() || (st != at::kFloat && st != at::kHalf && st != at::kBFloat16)) return false;
  for (const at::Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!t->is_cuda() || t->scalar_type() != st || t->device() != first.device()) return false;
    if (c10::GradMode::is_enabled() && t->requires_grad()) return false;
  }
  return true;
}

kernels::QDtype fused_qdtype(at::ScalarType st) {
  return st == at::kBFloat16 ? kernels::QDtype::kBFloat16 : st == at::kHalf ? kernels::QDtype::kFloat16
                                                                             : kernels::QDtype::kFloat32;
}

// The operands of one kernels::rms_norm launch; undefined tensors are absent operands. x's rows are
// x_stride apart (0 = contiguous); everything else is contiguous on x's device.
struct FusedNormCall {
  at::Tensor x, residual, sum, weight, gate, add_after, y;
  int64_t x_stride = 0;
  kernels::NormWeight mode = kernels::NormWeight::kAfterRound;
  double offset = 0.0, eps = 1e-6;
};

void launch_fused_norm(const FusedNormCall& c, const char* who) {
  auto ptr = [](const at::Tensor& t) -> void* { return t.defined() ? t.data_ptr() : nullptr; };
  kernels::RmsNormArgs a;
  a.x = ptr(c.x);
  a.residual = ptr(c.residual);
  a.sum = ptr(c.sum);
  a.weight = ptr(c.weight);
  a.gate = ptr(c.gate);
  a.add_after = ptr(c.add_after);
  a.y = ptr(c.y);
  a.dtype = fused_qdtype(c.x.scalar_type());
  a.mode = c.mode;
  a.weight_offset = static_cast<float>(c.offset);
  a.C = c.x.size(-1);
  a.N = c.x.numel() / a.C;
  a.x_stride = c.x_stride;
  a.eps = static_cast<float>(c.eps);
  a.stream = c10::cuda::getCurrentCUDAStream(c.x.device().index()).stream();
  if (const char* err = kernels::rms_norm(a)) throw Error(cat(who, ": ", err));
}

kernels::NormWeight kernel_norm_mode(NormScale scale) {
  return scale == NormScale::kAfterRound ? kernels::NormWeight::kAfterRound
         : scale == NormScale::kFp32     ? kernels::NormWeight::kFp32
                                         : kernels::NormWeight::kNone;
}
#endif
}  // namespace

namespace {
thread_local int t_fused_off = 0;  // live FusedDecodeOff scopes on this thread
}  // namespace

bool fused_decode_enabled() { return t_fused_off == 0 && fused_flag().load(std::memory_order_relaxed); }
FusedDecodeOff::FusedDecodeOff() { ++t_fused_off; }
FusedDecodeOff::~FusedDecodeOff() { --t_fused_off; }
bool set_fused_decode(bool on) { return fused_flag().exchange(on); }

std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                               double eps) {
  HEARTH_CHECK(weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0) &&
                   (!residual.defined() || residual.sizes() == x.sizes()),
               "add_rms_norm: x ", x.sizes(), ", residual ", residual.defined() ? residual.sizes() : at::IntArrayRef{},
               " and weight ", weight.sizes(), " do not match");
#ifdef HEARTH_WITH_CUDA_KERNELS
  if (kernel_applies({&x, &residual, &weight})) {
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor xc = x.contiguous();
    at::Tensor rc = residual.defined() ? residual.contiguous() : at::Tensor();
    at::Tensor wc = weight.contiguous();
    FusedNormCall c;
    c.x = xc;
    c.residual = rc;
    c.sum = rc.defined() ? at::empty_like(xc) : at::Tensor();
    c.weight = wc;
    c.y = at::empty_like(xc);
    c.eps = eps;
    launch_fused_norm(c, "add_rms_norm");
    return {rc.defined() ? c.sum : xc, c.y};
  }
#endif
  if (fused_decode_enabled())
    if (auto [s, y] = cpu_fused::add_rms_norm(x, residual, weight, eps); y.defined()) return {s, y};
  at::Tensor s = residual.defined() ? x + residual : x;
  return {s, reference_norm(s, weight, eps)};
}

namespace {
// Elements between consecutive rows of x viewed as [N, C] (N = numel / C), or -1 when the leading
// dims do not collapse to one stride (or the last dim is not contiguous). Used by CUDA builds only.
[[maybe_unused]] int64_t fused_norm_row_stride(const at::Tensor& x) {
  const int64_t d = x.dim();
  if (d == 0 || x.stride(d - 1) != 1) return -1;
  int64_t row = -1, next = -1;  // the innermost leading stride; what the next outer dim's must be
  for (int64_t i = d - 2; i >= 0; --i) {
    if (x.size(i) == 1) continue;
    if (row < 0) row = x.stride(i);
    else if (x.stride(i) != next) return -1;
    next = x.stride(i) * x.size(i);
  }
  return row < 0 ? x.size(d - 1) : row;
}
}  // namespace

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, NormScale scale, double offset,
                          const at::Tensor& gate, const at::Tensor& add_after) {
  HEARTH_CHECK(x.dim() >= 1 && (scale == NormScale::kNone || (weight.dim() == 1 && weight.size(0) == x.size(-1))) &&
                   (!gate.defined() || gate.sizes() == x.sizes()) &&
                   (!add_after.defined() || add_after.sizes() == x.sizes()) && !(gate.defined() && add_after.defined()),
               "fused_rms_norm: x ", x.sizes(), ", weight ", weight.defined() ? weight.sizes() : at::IntArrayRef{},
               ", gate ", gate.defined() ? gate.sizes() : at::IntArrayRef{}, " and add_after ",
               add_after.defined() ? add_after.sizes() : at::IntArrayRef{}, " do not match");
#ifdef HEARTH_WITH_CUDA_KERNELS
  const at::Tensor none;
  const at::Tensor& w = scale == NormScale::kNone ? none : weight;
  if (!kernel_applies({&x, &w, &gate, &add_after}) || x.numel() == 0) return {};
  const int64_t stride = fused_norm_row_stride(x);
  if (stride < x.size(-1)) return {};
  const c10::cuda::CUDAGuard guard(x.device());
  auto contiguous = [](const at::Tensor& t) { return t.defined() ? t.contiguous() : t; };
  FusedNormCall c;
  c.x = x;
  c.x_stride = stride;
  c.weight = contiguous(w);
  c.gate = contiguous(gate);
  c.add_after = contiguous(add_after);
  c.y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  c.mode = kernel_norm_mode(scale);
  c.offset = offset;
  c.eps = eps;
  launch_fused_norm(c, "fused_rms_norm");
  return c.y;
#else
  (void)eps;
  (void)offset;
  return {};
#endif
}

std::pair<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps, NormScale scale,
                                                     double offset) {
  HEARTH_CHECK(residual.sizes() == x.sizes() && x.dim() >= 1 &&
                   (scale == NormScale::kNone || (weight.dim() == 1 && weight.size(0) == x.size(-1))),
               "fused_add_rms_norm: x ", x.sizes(), ", residual ", residual.sizes(), " and weight ",
               weight.defined() ? weight.sizes() : at::IntArrayRef{}, " do not match");
#ifdef HEARTH_WITH_CUDA_KERNELS
  const at::Tensor none;
  const at::Tensor& w = scale == NormScale::kNone ? none : weight;
  if (!kernel_applies({&x, &residual, &w}) || x.numel() == 0 || !x.is_contiguous() || !residual.is_contiguous())
    return {};
  const c10::cuda::CUDAGuard guard(x.device());
  FusedNormCall c;
  c.x = x;
  c.residual = residual;
  c.sum = at::empty_like(x);
  c.weight = w.defined() ? w.contiguous() : w;
  c.y = at::empty_like(x);
  c.mode = kernel_norm_mode(scale);
  c.offset = offset;
  c.eps = eps;
  launch_fused_norm(c, "fused_add_rms_norm");
  return {c.sum, c.y};
#else
  (void)eps;
  (void)offset;
  return {};
#endif
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
#ifdef HEARTH_WITH_CUDA_KERNELS
  if (gate.sizes() == up.sizes() && kernel_applies({&gate, &up})) {
    const c10::cuda::CUDAGuard guard(gate.device());
    at::Tensor g = gate.contiguous(), u = up.contiguous();
    at::Tensor y = at::empty_like(g);
    if (const char* err = kernels::silu_mul(g.data_ptr(), u.data_ptr(), y.data_ptr(), fused_qdtype(g.scalar_type()), g.numel(),
                                            c10::cuda::getCurrentCUDAStream(g.device().index()).stream()))
      throw Error(cat("silu_mul: ", err));
    return y;
  }
#endif
  return at::silu(gate) * up;
}

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (x.is_cpu()) return fused_decode_enabled() ? cpu_fused::rotary(x, cos, sin) : at::Tensor();
#ifdef HEARTH_WITH_CUDA_KERNELS
  if (!kernel_applies({&x, &cos, &sin})) return {};
  int64_t cs_b = 0, cs_t = 0;
  if (!rotary_table_strides(x, cos, sin, cs_b, cs_t)) return {};
  const int64_t B = x.size(0), T = x.size(2), D = x.size(3), rot = cos.size(-1);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  kernels::RopeArgs a;
  a.x = x.data_ptr();
  a.x_sb = x.stride(0), a.x_sh = x.stride(1), a.x_st = x.stride(2);
  a.y = y.data_ptr();
  a.y_sb = y.stride(0), a.y_sh = y.stride(1), a.y_st = y.stride(2);
  a.cos = cos.data_ptr();
  a.sin = sin.data_ptr();
  a.cs_b = cs_b, a.cs_t = cs_t;
  a.B = B, a.H = x.size(1), a.T = T, a.D = D, a.rot = rot;
  a.dtype = fused_qdtype(x.scalar_type());
  a.stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  if (const char* err = kernels::rope(a)) throw Error(cat("fused_rotary: ", err));
  return y;
#else
  (void)x, (void)cos, (void)sin;
  return {};
#endif
}

at::Tensor rope_cache_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& flat_keys,
                            const at::Tensor& flat_values, int64_t row_stride) {
#ifdef HEARTH_WITH_CUDA_KERNELS
  if (!kernel_applies({&q, &k, &v, &cos, &sin, &flat_keys, &flat_values})) return {};
  if (q.dim() != 4 || k.dim() != 4 || v.sizes() != k.sizes() || q.size(2) != 1 || k.size(2) != 1 ||
      k.size(0) != q.size(0) || k.size(3) != q.size(3))
    return {};
  const int64_t B = q.size(0), D = q.size(3), rot = cos.size(-1);
  if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1 || !cos.is_contiguous() || !sin.is_contiguous() ||
      cos.numel() != B * rot || sin.sizes() != cos.sizes() || rot % 2 != 0 || rot > D || !positions.is_cuda() ||
      positions.scalar_type() != at::kLong || positions.numel() != B || !positions.is_contiguous() ||
      flat_keys.dim() != 2 || flat_keys.size(1) != D || !flat_keys.is_contiguous() ||
      flat_values.sizes() != flat_keys.sizes() || !flat_values.is_contiguous() ||
      flat_keys.size(0) < B * k.size(1) * row_stride)
    return {};
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor q_out = at::empty_like(q);  // the strides apply_rotary's output would have
  kernels::RopeCacheArgs a;
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.q_sb = q.stride(0), a.q_sh = q.stride(1), a.k_sb = k.stride(0), a.k_sh = k.stride(1);
  a.v_sb = v.stride(0), a.v_sh = v.stride(1);
  a.cos = cos.data_ptr();
  a.sin = sin.data_ptr();
  a.positions = positions.data_ptr<int64_t>();
  a.q_out = q_out.data_ptr();
  a.qo_sb = q_out.stride(0), a.qo_sh = q_out.stride(1);
  a.k_cache = flat_keys.data_ptr();
  a.v_cache = flat_values.data_ptr();
  a.row_stride = row_stride;
  a.B = B, a.Hq = q.size(1), a.Hk = k.size(1), a.D = D, a.rot = rot;
  a.dtype = fused_qdtype(q.scalar_type());
  a.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  if (const char* err = kernels::rope_cache_write(a)) throw Error(cat("rope_cache_write: ", err));
  return q_out;
#else
  (void)q, (void)k, (void)v, (void)cos, (void)sin, (void)positions, (void)flat_keys, (void)flat_values,
      (void)row_stride;
  return {};
#endif
}

}  // namespace hearth::nn
