// The MLX affine quantized GEMV entry point (kernels/quantized_matmul.h), now one case of the
// decode GEMV of kernels/gemv.cu (one segment, affine format). No ATen: compiles with `nvcc -c`.
#include <cstdint>

#include "gemv.h"
#include "quantized_matmul.h"

namespace hearth::kernels {

bool quantized_gemv_supported(int bits, int group_size, int64_t M, int64_t in, QDtype x_dtype, QDtype s_dtype) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64 || group_size == 128) && M >= 1 &&
         M <= 8 && in > 0 && in % group_size == 0 && in <= 0x7fffffff &&
         (s_dtype == x_dtype || s_dtype == QDtype::kFloat32);
}

const char* quantized_gemv(const QuantGemvArgs& a) {
  if (!quantized_gemv_supported(a.bits, a.group_size, a.M, a.in, a.x_dtype, a.s_dtype))
    return "quantized_gemv: unsupported bits/group_size/M/dtypes";
  if (a.out == 0) return nullptr;
  GemvArgs g;
  g.x = a.x;
  g.x_dtype = a.x_dtype;
  g.M = a.M;
  g.in = a.in;
  g.format = a.bits == 8 ? WeightFormat::kAffine8 : WeightFormat::kAffine4;
  g.group_size = a.group_size;
  g.s_dtype = a.s_dtype;
  g.seg[0] = GemvSegment{a.wq, a.scales, a.biases, a.y, a.out};
  g.n_seg = 1;
  g.stream = a.stream;
  return gemv(g);
}

}  // namespace hearth::kernels
