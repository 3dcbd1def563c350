// The lean RMSNorm (LlamaRMSNorm, fp32-weight, gated) and RoPE autograd Functions (see lean_grad.h).
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

// Gemma4RMSNorm / Qwen3_5RMSNorm: y = (x_f32 · r · wf).to(dtype), r = rsqrt(ms) or pow(ms, −½),
// ms = mean(x_f32²) + eps, wf = weight_f32 (+ offset when offset ≠ 0; no weight: no product).
struct RmsNormFp32wFn : torch::autograd::Function<RmsNormFp32wFn> {
  // Runs with grad off. The reference ops in the same order; the products in place when h is not x.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                            double eps, double offset, bool pow_form) {
    at::Tensor h = x.to(at::kFloat);
    const at::Tensor ms = h.pow(2).mean(-1, /*keepdim=*/true) + eps;
    const at::Tensor rstd = pow_form ? at::pow(ms, -0.5) : at::rsqrt(ms);
    if (h.is_same(x)) h = h * rstd;
    else h.mul_(rstd);
    if (weight) h.mul_(weight_f32(*weight, offset));
    at::Tensor y = h.to(x.scalar_type());
    if (weight) ctx->save_for_backward({x, rstd, *weight});
    else ctx->save_for_backward({x, rstd});
    ctx->saved_data["offset"] = offset;
    return y;
  }

  static at::Tensor weight_f32(const at::Tensor& weight, double offset) {
    at::Tensor wf = weight.to(at::kFloat);
    return offset != 0.0 ? wf + offset : wf;
  }

  // Reference graph (all fp32 after the cast of gy): g = gy_f32, n = h · r, y32 = n · wf:
  //   dwf = Σ_rows g · n, dn = g · wf, dh = dn · r + h · (Σ_c dn · h) · (−r³ / C), dx = dh.to(dtype),
  //   dw = dwf.to(weight's dtype) (the offset's add passes the gradient through).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &rstd = saved[1];
    const bool has_w = saved.size() > 2;
    const at::Tensor weight = has_w ? saved[2] : at::Tensor();
    const at::Tensor& gy = grads[0];
    const bool need_x = ctx->needs_input_grad(0), need_w = has_w && ctx->needs_input_grad(1);
    const variable_list none(5);
    if (!gy.defined() || (!need_x && !need_w)) return none;
    const at::Tensor wf = has_w ? weight_f32(weight, ctx->saved_data["offset"].toDouble()) : at::Tensor();
    const int64_t C = x.size(-1), N = C == 0 ? 0 : x.numel() / C;
    const at::Tensor x2 = x.reshape({N, C}), g2 = gy.reshape({N, C}), r2 = rstd.reshape({N, 1});
    at::Tensor dx = need_x ? at::empty({N, C}, x.options()) : at::Tensor();
    at::Tensor dw = need_w ? at::zeros({C}, weight.options().dtype(at::kFloat)) : at::Tensor();
    const int64_t rows = chunk_rows(C);
    for (int64_t s = 0; s < N; s += rows) {
      const int64_t n = std::min(rows, N - s);
      const at::Tensor h = x2.narrow(0, s, n).to(at::kFloat), g = g2.narrow(0, s, n).to(at::kFloat);
      const at::Tensor r = r2.narrow(0, s, n);
      if (need_w) dw.add_((g * (h * r)).sum(0));
      if (need_x) {
        const at::Tensor dn = has_w ? g * wf : g;
        const at::Tensor dr = (dn * h).sum(-1, /*keepdim=*/true);
        dx.narrow(0, s, n).copy_(dn * r + h * (dr * r.pow(3) * (-1.0 / static_cast<double>(C))));
      }
    }
    variable_list out = none;
    if (need_x) out[0] = dx.view(x.sizes());
    if (need_w) out[1] = dw.to(weight.scalar_type());
    return out;
  }
};

// Qwen3_5RMSNormGated: a = weight · (h_f32 · r).to(dtype), y = (a · silu(gate_f32)).to(dtype),
// r = rsqrt(mean(h_f32²) + eps).
struct RmsNormGatedFn : torch::autograd::Function<RmsNormGatedFn> {
  // Runs with grad off: the reference ops in their order.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& gate,
                            const at::Tensor& weight, double eps) {
    const at::ScalarType dt = hidden.scalar_type();
    at::Tensor h = hidden.to(at::kFloat);
    const at::Tensor rstd = at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
    if (h.is_same(hidden)) h = h * rstd;
    else h.mul_(rstd);
    const at::Tensor a = weight * h.to(dt);
    h.reset();
    // silu and a · silu in place on gate's fp32 copy (a · s and s · a are the same product) unless
    // the product is wider than fp32 (an fp64 a).
    at::Tensor s = gate.to(at::kFloat);
    s = s.is_same(gate) ? at::silu(s) : at::silu_(s);
    at::Tensor y = (at::promote_types(a.scalar_type(), at::kFloat) == at::kFloat ? s.mul_(a) : a * s).to(dt);
    ctx->save_for_backward({hidden, gate, weight, rstd});
    return y;
  }

  // Reference graph: s = silu(gate_f32), b = a · s in bt = promote(a's dtype, fp32), g = gy in bt:
  //   ds = (g · a).to(fp32), dgate = silu_backward(ds, gate_f32).to(gate's dtype); da = (g · s).to(a's dtype);
  //   dw = Σ_rows da · n16 (the products in a's dtype, summed in fp32); dn16 = (da · w).to(dtype);
  //   dn = dn16_f32, dh = dn · r + h · (Σ_c dn · h) · (−r³ / C), dx = dh.to(dtype).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &gate = saved[1], &weight = saved[2], &rstd = saved[3];
    const at::Tensor& gy = grads[0];
    const bool need_x = ctx->needs_input_grad(0), need_g = ctx->needs_input_grad(1), need_w = ctx->needs_input_grad(2);
    if (!gy.defined() || (!need_x && !need_g && !need_w)) return variable_list(4);
    const at::ScalarType dt = hidden.scalar_type();
    const int64_t C = hidden.size(-1), N = C == 0 ? 0 : hidden.numel() / C;
    const at::Tensor x2 = hidden.reshape({N, C}), z2 = gate.reshape({N, C}), g2 = gy.reshape({N, C});
    const at::Tensor r2 = rstd.reshape({N, 1});
    at::Tensor dx = need_x ? at::empty({N, C}, hidden.options()) : at::Tensor();
    at::Tensor dz = need_g ? at::empty({N, C}, gate.options()) : at::Tensor();
    at::Tensor dw = need_w ? at::zeros({C}, weight.options().dtype(at::kFloat)) : at::Tensor();
    const int64_t rows = chunk_rows(C);
    for (int64_t s = 0; s < N; s += rows) {
      const int64_t n = std::min(rows, N - s);
      const at::Tensor h = x2.narrow(0, s, n).to(at::kFloat);
      const at::Tensor z = z2.narrow(0, s, n).to(at::kFloat), r = r2.narrow(0, s, n);
      const at::Tensor n16 = (h * r).to(dt);
      const at::Tensor a = weight * n16;
      const at::Tensor g = g2.narrow(0, s, n).to(at::promote_types(a.scalar_type(), at::kFloat));
      if (need_g) dz.narrow(0, s, n).copy_(at::silu_backward((g * a).to(at::kFloat), z));
      if (!need_x && !need_w) continue;
      const at::Tensor da = (g * at::silu(z)).to(a.scalar_type());
      if (need_w) dw.add_((da * n16).sum(0, /*keepdim=*/false, at::kFloat));
      if (need_x) {
        const at::Tensor dn = (da * weight).to(dt).to(at::kFloat);
        const at::Tensor dr = (dn * h).sum(-1, /*keepdim=*/true);
        dx.narrow(0, s, n).copy_(dn * r + h * (dr * r.pow(3) * (-1.0 / static_cast<double>(C))));
      }
    }
    return {need_x ? dx.view(hidden.sizes()) : at::Tensor(), need_g ? dz.view(gate.sizes()) : at::Tensor(),
            need_w ? dw.to(weight.scalar_type()) : at::Tensor(), at::Tensor()};
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

at::Tensor rms_norm_lean_fp32w(const at::Tensor& x, const at::Tensor& weight, double eps, double offset,
                               RstdOp rstd_op) {
  HEARTH_CHECK(x.dim() >= 1 && at::isFloatingType(x.scalar_type()), "rms_norm_lean_fp32w: x ", x.sizes(), " (",
               x.scalar_type(), ") is not a float tensor of rank >= 1");
  HEARTH_CHECK(!weight.defined() || (weight.dim() == 1 && weight.size(0) == x.size(-1) &&
                                     at::isFloatingType(weight.scalar_type())),
               "rms_norm_lean_fp32w: x ", x.sizes(), " and weight ", weight.defined() ? weight.sizes() : at::IntArrayRef{},
               " do not match");
  const c10::optional<at::Tensor> w = weight.defined() ? c10::optional<at::Tensor>(weight) : c10::nullopt;
  return RmsNormFp32wFn::apply(x, w, eps, offset, rstd_op == RstdOp::kPowMinusHalf);
}

at::Tensor rms_norm_gated_lean(const at::Tensor& hidden, const at::Tensor& gate, const at::Tensor& weight, double eps) {
  HEARTH_CHECK(hidden.dim() >= 1 && gate.sizes() == hidden.sizes() && weight.dim() == 1 &&
                   weight.size(0) == hidden.size(-1),
               "rms_norm_gated_lean: hidden ", hidden.sizes(), ", gate ", gate.sizes(), " and weight ", weight.sizes(),
               " do not match");
  return RmsNormGatedFn::apply(hidden, gate, weight, eps);
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
