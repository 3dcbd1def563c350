// Helpers shared by the tests of Hearth's CUDA kernels (tests/nn, tests/kernels: the decode GEMV,
// its norm and LoRA epilogues, decode attention): the fused-path switch, whether the kernels can run
// here, a relative error and its tolerance. Not used by library code.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>

#include "core/torch_compat.h"
#include "nn/fused_ops.h"

namespace hearth::testing {

/// RAII: the fused decode path (nn::set_fused_decode) on or off for a scope, restored after.
struct FusedDecodeSwitch {
  explicit FusedDecodeSwitch(bool on) : was(hearth::nn::set_fused_decode(on)) {}
  ~FusedDecodeSwitch() { hearth::nn::set_fused_decode(was); }
  FusedDecodeSwitch(const FusedDecodeSwitch&) = delete;
  FusedDecodeSwitch& operator=(const FusedDecodeSwitch&) = delete;
  bool was;
};

/// Whether Hearth's CUDA kernels are built into this binary and a CUDA device is present (the GPU
/// machine); the CUDA cases skip otherwise.
inline bool have_cuda_kernels() {
#ifdef HEARTH_WITH_CUDA_KERNELS
  return hearth::compat::cuda_available();
#else
  return false;
#endif
}

/// max |y − ref| / max |ref|, in float64 (ref all zero: relative to 1e-30).
inline double max_rel_err(const at::Tensor& y, const at::Tensor& ref) {
  const double scale = ref.abs().max().item<double>();
  return (y.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>() / std::max(scale, 1e-30);
}

/// The relative error a kernel's result may have against float64 of the same inputs: fp32 sums in
/// another order (1e-5); fp16 / bf16 add one rounding of the output (2e-3 / 1e-2).
inline double one_rounding_tol(at::ScalarType t) { return t == at::kFloat ? 1e-5 : t == at::kHalf ? 2e-3 : 1e-2; }

}  // namespace hearth::testing
