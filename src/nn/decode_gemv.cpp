// Dispatch of the decode GEMV (kernels/gemv.cu): checks, operand layout, the launch.
#include "nn/decode_gemv.h"

#include <cstdlib>
#include <string>

#include <c10/core/GradMode.h>

#include "nn/fused_ops.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/error.h"
#include "kernels/gemv.h"
#endif

namespace hearth::nn {

#ifdef HEARTH_WITH_CUDA_KERNELS
namespace {
kernels::QDtype gemv_qdtype(at::ScalarType st) {
  return st == at::kBFloat16 ? kernels::QDtype::kBFloat16 : st == at::kHalf ? kernels::QDtype::kFloat16
                                                                             : kernels::QDtype::kFloat32;
}

bool gemv_aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

bool gemv_needs_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

// Fills `a` (dtype, format, rows, segments) for x and ws; false when the kernel does not apply.
// Leaves x, the outputs and the stream to gemv_launch.
bool gemv_prepare(const at::Tensor& x, const std::vector<GemvOperand>& ws, kernels::GemvArgs& a) {
  if (!fused_decode_enabled() || ws.empty() || ws.size() > 3 || !x.is_cuda() || x.dim() < 1) return false;
  const at::ScalarType xt = x.scalar_type();
  if (xt != at::kFloat && xt != at::kHalf && xt != at::kBFloat16) return false;
  const int64_t in = x.size(-1);
  if (in <= 0 || x.numel() % in != 0) return false;
  const bool grad = c10::GradMode::is_enabled();
  if (grad && gemv_needs_grad(x)) return false;
  a.x_dtype = gemv_qdtype(xt);
  a.M = gemv_rows(x);
  a.in = in;
  a.n_seg = static_cast<int>(ws.size());
  const QuantizedWeight* q0 = ws[0].quant;
  at::ScalarType sdt = at::kFloat;
  if (q0) {
    if (q0->spec.bits != 4 && q0->spec.bits != 8) return false;
    a.format = q0->spec.bits == 8 ? kernels::WeightFormat::kAffine8 : kernels::WeightFormat::kAffine4;
    a.group_size = static_cast<int>(q0->spec.group_size);
    sdt = q0->scales.scalar_type();
    if (sdt != xt && sdt != at::kFloat) return false;
    a.s_dtype = gemv_qdtype(sdt);
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    const GemvOperand& w = ws[i];
    if ((w.quant != nullptr) != (q0 != nullptr)) return false;
    kernels::GemvSegment& s = a.seg[i];
    if (q0) {
      const QuantizedWeight& q = *w.quant;
      if (q.spec.bits != q0->spec.bits || q.spec.group_size != q0->spec.group_size || q.in_features() != in ||
          q.scales.scalar_type() != sdt || q.biases.scalar_type() != sdt || !q.wq.is_contiguous() ||
          !q.scales.is_contiguous() || !q.biases.is_contiguous() || q.wq.device() != x.device() ||
          q.scales.device() != x.device() || q.biases.device() != x.device() || !gemv_aligned16(q.wq))
        return false;
      s.w = q.wq.data_ptr();
      s.scales = q.scales.data_ptr();
      s.biases = q.biases.data_ptr();
      s.out = q.out_features();
    } else {
      const at::Tensor& d = w.dense;
      if (!d.defined() || d.dim() != 2 || d.size(1) != in || d.scalar_type() != xt || d.device() != x.device() ||
          !d.is_contiguous() || !gemv_aligned16(d) || (grad && d.requires_grad()))
        return false;
      s.w = d.data_ptr();
      s.out = d.size(0);
    }
    if (w.lora_b.defined()) {
      const at::Tensor& lb = w.lora_b;
      const at::Tensor& lh = w.lora_h;
      if (lb.dim() != 2 || lb.size(0) != s.out || lb.size(1) < 1 || lb.size(1) > kernels::kGemvMaxLoraRank ||
          lb.scalar_type() != xt || lb.device() != x.device() || !lb.is_contiguous() || (grad && lb.requires_grad()) ||
          !lh.defined() || lh.numel() != a.M * lb.size(1) || lh.scalar_type() != xt || lh.device() != x.device() ||
          !lh.is_contiguous() || (grad && lh.requires_grad()))
        return false;
      s.lora_b = lb.data_ptr();
      s.lora_h = lh.data_ptr();
      s.lora_rank = static_cast<int>(lb.size(1));
      s.lora_scale = static_cast<float>(w.lora_scale);
    }
  }
  return true;
}

// x as the kernel reads it ([M, in], contiguous, 16-byte aligned).
at::Tensor gemv_x(const at::Tensor& x, const kernels::GemvArgs& a) {
  at::Tensor x2 = x.reshape({a.M, a.in}).contiguous();
  return gemv_aligned16(x2) ? x2 : x2.clone();
}

// Allocates the outputs ([..., out_i] of x's shape), launches on x's current stream.
std::vector<at::Tensor> gemv_launch(const at::Tensor& x, const at::Tensor& x2, kernels::GemvArgs& a) {
  a.x = x2.data_ptr();
  std::vector<at::Tensor> outs;
  std::vector<int64_t> shape = x.sizes().vec();
  for (int i = 0; i < a.n_seg; ++i) {
    at::Tensor y = at::empty({a.M, a.seg[i].out}, x.options());
    a.seg[i].y = y.data_ptr();
    shape.back() = a.seg[i].out;
    outs.push_back(y.view(shape));
  }
  const c10::cuda::CUDAGuard guard(x.device());
  a.stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  const char* err = kernels::gemv(a);
  HEARTH_CHECK(err == nullptr, "decode_gemv: CUDA kernel failed: ", err);
  return outs;
}
}  // namespace

std::vector<at::Tensor> decode_gemv(const at::Tensor& x, const std::vector<GemvOperand>& ws) {
  kernels::GemvArgs a;
  if (!gemv_prepare(x, ws, a) || !kernels::gemv_supported(a)) return {};
  return gemv_launch(x, gemv_x(x, a), a);
}

NormedGemv decode_gemv_normed(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                              const std::vector<GemvOperand>& ws) {
  kernels::GemvArgs a;
  if (!gemv_prepare(x, ws, a)) return {};
  if (!weight.defined() || weight.dim() != 1 || weight.size(0) != a.in || weight.scalar_type() != x.scalar_type() ||
      weight.device() != x.device() || (c10::GradMode::is_enabled() && weight.requires_grad()))
    return {};
  if (residual.defined() && (residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() ||
                             residual.device() != x.device() ||
                             (c10::GradMode::is_enabled() && residual.requires_grad())))
    return {};
  NormedGemv r;
  const at::Tensor w = weight.contiguous();
  at::Tensor res2;
  if (residual.defined()) {
    res2 = residual.reshape({a.M, a.in}).contiguous();
    r.sum = at::empty({a.M, a.in}, x.options());
    a.norm.residual = res2.data_ptr();
    a.norm.sum = r.sum.data_ptr();
  }
  r.normed = at::empty({a.M, a.in}, x.options());
  a.norm.on = true;
  a.norm.normed = r.normed.data_ptr();
  a.norm.weight = w.data_ptr();
  a.norm.mode = kernels::NormWeight::kAfterRound;
  a.norm.eps = static_cast<float>(eps);
  if (!kernels::gemv_supported(a)) return {};  // the pointers are set: the support check reads them
  const at::Tensor x2 = gemv_x(x, a);
  r.ys = gemv_launch(x, x2, a);
  r.sum = residual.defined() ? r.sum.view(x.sizes()) : x;
  r.normed = r.normed.view(x.sizes());
  return r;
}
#else
std::vector<at::Tensor> decode_gemv(const at::Tensor&, const std::vector<GemvOperand>&) { return {}; }
NormedGemv decode_gemv_normed(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                              const std::vector<GemvOperand>&) {
  return {};
}
#endif

bool gemv_norm_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("HEARTH_GEMV_NORM");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

int64_t gemv_norm_max_rows() {
  static const int64_t rows = [] {
    const char* v = std::getenv("HEARTH_GEMV_NORM_MAX_ROWS");
    if (!v || !*v) return kGemvNormMaxRows;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    return *end == '\0' && n >= 0 ? static_cast<int64_t>(n) : kGemvNormMaxRows;
  }();
  return rows;
}

int64_t dense_gemv_max_rows() {
  static const int64_t rows = [] {
    const char* v = std::getenv("HEARTH_DENSE_GEMV_MAX_ROWS");
    const int64_t n = v ? std::atoll(v) : 1;
    return n >= 1 && n <= 8 ? n : int64_t{1};
  }();
  return rows;
}

int64_t gemv_rows(const at::Tensor& x) {
  const int64_t in = x.dim() >= 1 ? x.size(-1) : 0;
  return in > 0 ? x.numel() / in : 0;
}

}  // namespace hearth::nn
