// The lean RMSNorm and RoPE autograd Functions (see lean_grad.h).
#include "nn/lean_grad.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>

#include "core/env.h"
#include "core/error.h"

namespace hearth::nn {

namespace {

std::atomic<bool>& lean_flag() {
  static std::atomic<bool> on{env_switch_on("HEARTH_LEAN_GRAD")};
  return on;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per backward chunk: about 2^22 elements (16 MB per fp32 temporary), at least one row.
int64_t chunk_rows(int64_t C) { return std::max<int64_t>(1, (int64_t{1} << 22) / std::max<int64_t>(C, 1)); }

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  // Runs with grad off (Function::apply). The reference ops (fused_ops.cpp's reference_norm) in
  // the same order; the fp32 product is taken in place when it is not x itself.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    at::Tensor h = x.to(at::kFloat);
    at::Tensor rstd = at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
    if (h.is_same(x)) h = h * rstd;
    else h.mul_(rstd);
    at::Tensor y = weight * h.to(x.scalar_type());
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  // Reference graph: y = w · n16, n16 = (h · r).to(dtype), h = x_f32, r = rsqrt(mean(h²) + eps).
  //   dn16 = gy · w (rounded to the dtype), dw = Σ_rows gy · n16 (each product rounded, summed in fp32),
  //   dh = dn · r + h · (Σ_c dn · h) · (−r³ / C), dx = dh.to(dtype).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::Tensor& gy = grads[0];
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    if (!gy.defined() || (!need_x && !need_w)) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const int64_t C = x.size(-1), N = C == 0 ? 0 : x.numel() / C;
    const at::Tensor x2 = x.reshape({N, C}), g2 = gy.reshape({N, C}), r2 = rstd.reshape({N, 1});
    at::Tensor dx = need_x ? at::empty({N, C}, x.options()) : at::Tensor();
    at::Tensor dw = need_w ? at::zeros({C}, weight.options().dtype(at::kFloat)) : at::Tensor();
    const int64_t rows = chunk_rows(C);
    for (int64_t s = 0; s < N; s += rows) {
      const int64_t n = std::min(rows, N - s);
      const at::Tensor h = x2.narrow(0, s, n).to(at::kFloat);
      const at::Tensor g = g2.narrow(0, s, n), r = r2.narrow(0, s, n);
      if (need_w) dw.add_((g * (h * r).to(x.scalar_type())).sum(0, /*keepdim=*/false, at::kFloat));
      if (need_x) {
        const at::Tensor dn = (g * weight).to(at::kFloat);
        const at::Tensor dr = (dn * h).sum(-1, /*keepdim=*/true);
        dx.narrow(0, s, n).copy_(dn * r + h * (dr * r.pow(3) * (-1.0 / static_cast<double>(C))));
      }
    }
    return {need_x ? dx.view(x.sizes()) : at::Tensor(), need_w ? dw.to(weight.scalar_type()) : at::Tensor(),
            at::Tensor()};
  }
};

struct RotaryFn : torch::autograd::Function<RotaryFn> {
  // out = x·cos, then out₁ −= x₂·sin₁ and out₂ += x₁·sin₂: the reference's
  // (x·cos) + (cat(−x₂, x₁)·sin) with the same roundings ((−a)·b = −(a·b) and c + (−t) = c − t exactly).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t h = x.size(-1) / 2;
    at::Tensor out = x * cos;
    out.narrow(-1, 0, h).sub_(x.narrow(-1, h, h) * sin.narrow(-1, 0, h));
    out.narrow(-1, h, h).add_(x.narrow(-1, 0, h) * sin.narrow(-1, h, h));
    ctx->save_for_backward({cos, sin});
    return out;
  }

  // dx = g·cos + [u₂, −u₁] with u = g·sin: autograd's sum of the mul's and the two narrows' grads.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &cos = saved[0], &sin = saved[1];
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const int64_t h = g.size(-1) / 2;
    at::Tensor dx = g * cos;
    dx.narrow(-1, 0, h).add_(g.narrow(-1, h, h) * sin.narrow(-1, h, h));
    dx.narrow(-1, h, h).sub_(g.narrow(-1, 0, h) * sin.narrow(-1, 0, h));
    return {dx, at::Tensor(), at::Tensor()};
  }
};

bool rg(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace

bool lean_grad_enabled() { return lean_flag().load(std::memory_order_relaxed); }
bool set_lean_grad(bool on) { return lean_flag().exchange(on); }

bool records_grad(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  return c10::GradMode::is_enabled() && (rg(a) || rg(b) || rg(c));
}

at::Tensor rms_norm_lean(const at::Tensor& x, const at::Tensor& weight, double eps) {
  HEARTH_CHECK(weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0), "rms_norm_lean: x ", x.sizes(),
               " and weight ", weight.sizes(), " do not match");
  return RmsNormFn::apply(x, weight, eps);
}

bool rotary_lean_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!lean_grad_enabled() || !c10::GradMode::is_enabled() || !rg(x) || rg(cos) || rg(sin)) return false;
  const at::ScalarType st = x.scalar_type();
  if (!at::isFloatingType(st) || cos.scalar_type() != st || sin.scalar_type() != st) return false;
  if (x.dim() < 1 || cos.dim() < 1 || x.size(-1) % 2 != 0 || cos.size(-1) != x.size(-1) || sin.sizes() != cos.sizes())
    return false;
  if (x.device() != cos.device() || x.device() != sin.device()) return false;
  // The output (and so the gradient) has x's shape: cos and sin broadcast to it.
  if (cos.dim() > x.dim()) return false;
  for (int64_t i = 1; i <= cos.dim(); ++i)
    if (cos.size(-i) != 1 && cos.size(-i) != x.size(-i)) return false;
  return true;
}

at::Tensor rotary_lean(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  HEARTH_CHECK(rotary_lean_applies(x, cos, sin), "rotary_lean: x ", x.sizes(), " / cos ", cos.sizes(), " / sin ",
               sin.sizes(), " (dtypes, grad) are not a case it handles");
  return RotaryFn::apply(x, cos, sin);
}

}  // namespace hearth::nn
