// MLX affine quantization: quantize/pack, unpack/dequantize, and the quantized matmul dispatch: CPU
// kernels (the x86 SIMD kernel of quant_simd.cpp for bits 4/8 up to 64 rows; portable ones: decode
// fused with the dot for small M, tiles of dequantized rows + BLAS otherwise) and,
// in CUDA builds, the fused GEMV of kernels/quantized_matmul.cu for small M. Not the Linear module
// (nn/linear.*) and not the CUDA kernel itself.
// Reference: mlx/backend/cpu/quantized.cpp (`quantize`, `extract_bits`, `_qmm_t`) in ml-explore/mlx.
#include "nn/quant.h"

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "nn/cpu_gemm.h"
#include "nn/fused_ops.h"
#include "nn/quant_simd.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/quantized_matmul.h"
#endif

namespace hearth::nn {

void check_quant_spec(const QuantSpec& spec, const std::string& where) {
  const int b = spec.bits;
  HEARTH_CHECK(b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8, where, ".bits: ", b,
               " unsupported (expected 2,3,4,5,6,8)");
  const int g = spec.group_size;
  HEARTH_CHECK(g == 32 || g == 64 || g == 128, where, ".group_size: ", g, " unsupported (expected 32,64,128)");
}

int64_t QuantizedWeight::in_features() const { return wq.size(1) * 32 / spec.bits; }
int64_t QuantizedWeight::out_features() const { return wq.size(0); }

namespace {

// --- bit stream packing ------------------------------------------------------------------------
// A row of codes is one little-endian bit stream: code j occupies bits [j*bits, (j+1)*bits), bit i
// of the stream is bit i%32 of word i/32. On a little-endian host this is byte-for-byte mlx's
// layout: power-of-two bits pack 32/bits codes per uint32; 3 and 5 bits pack 8 codes into 3 and 5
// bytes, 6 bits packs 4 codes into 3 bytes, each pack itself a little-endian bit stream.

// Decodes `n` codes (n a multiple of 32) starting at word `w` into floats.
template <int Bits>
inline void decode_codes(const uint32_t* w, float* out, int64_t n) {
  constexpr uint32_t mask = (1u << Bits) - 1;
  if constexpr (32 % Bits == 0) {
    constexpr int per = 32 / Bits;
    for (int64_t i = 0; i < n / per; ++i) {
      const uint32_t word = w[i];
      for (int k = 0; k < per; ++k) out[i * per + k] = static_cast<float>((word >> (k * Bits)) & mask);
    }
  } else {
    // 32 codes span exactly `Bits` words: decode them from a 64-bit window.
    for (int64_t blk = 0; blk < n / 32; ++blk) {
      const uint32_t* ww = w + blk * Bits;
      float* o = out + blk * 32;
      for (int j = 0; j < 32; ++j) {
        const int bit = j * Bits;
        const int wi = bit >> 5, sh = bit & 31;
        uint64_t window = ww[wi];
        if (sh + Bits > 32) window |= static_cast<uint64_t>(ww[wi + 1]) << 32;
        o[j] = static_cast<float>((window >> sh) & mask);
      }
    }
  }
}

void decode_codes_any(int bits, const uint32_t* w, float* out, int64_t n) {
  switch (bits) {
    case 2: return decode_codes<2>(w, out, n);
    case 3: return decode_codes<3>(w, out, n);
    case 4: return decode_codes<4>(w, out, n);
    case 5: return decode_codes<5>(w, out, n);
    case 6: return decode_codes<6>(w, out, n);
    case 8: return decode_codes<8>(w, out, n);
  }
  throw Error(cat("quantized weight: bits ", bits, " unsupported (expected 2,3,4,5,6,8)"));
}

// Dot product with 8 independent accumulators (lets the compiler use SIMD without fast-math).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void check_qweight(const QuantizedWeight& qw, const char* what) {
  check_quant_spec(qw.spec, cat(what, ": quantization"));
  HEARTH_CHECK(qw.wq.dim() == 2, what, ": packed weight must be 2-D, got ", qw.wq.sizes());
  HEARTH_CHECK(qw.wq.scalar_type() == at::kInt, what, ": packed weight must be uint32 (kInt), got ",
               qw.wq.scalar_type());
  HEARTH_CHECK((qw.wq.size(1) * 32) % qw.spec.bits == 0, what, ": packed width ", qw.wq.size(1),
               " is not a whole number of ", qw.spec.bits, "-bit codes");
  const int64_t out = qw.out_features(), in = qw.in_features();
  HEARTH_CHECK(in % qw.spec.group_size == 0, what, ": in_features ", in, " not divisible by group_size ",
               qw.spec.group_size);
  const std::vector<int64_t> gshape{out, in / qw.spec.group_size};
  HEARTH_CHECK(qw.scales.sizes().vec() == gshape, what, ": scales shape ", qw.scales.sizes(), ", expected ",
               c10::IntArrayRef(gshape), " for bits=", qw.spec.bits, " group_size=", qw.spec.group_size);
  HEARTH_CHECK(qw.biases.sizes().vec() == gshape, what, ": biases shape ", qw.biases.sizes(), ", expected ",
               c10::IntArrayRef(gshape));
}

}  // namespace

// --- quantize ----------------------------------------------------------------------------------

QuantizedWeight quantize(const at::Tensor& w, QuantSpec spec) {
  check_quant_spec(spec, "quantize");
  HEARTH_CHECK(w.dim() == 2, "quantize: weight must be 2-D [out, in], got ", w.sizes());
  HEARTH_CHECK(w.is_floating_point(), "quantize: weight must be floating point, got ", w.scalar_type());
  const int64_t out = w.size(0), in = w.size(1), gs = spec.group_size, bits = spec.bits;
  HEARTH_CHECK(in % gs == 0, "quantize: in_features ", in, " not divisible by group_size ", gs);
  const at::ScalarType sdt =
      (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16) ? w.scalar_type() : at::kFloat;
  const at::Tensor wf = w.to(at::kCPU).to(at::kFloat).contiguous();
  const int64_t ng = in / gs, words = in * bits / 32;
  at::Tensor wq = at::zeros({out, words}, at::kInt);
  at::Tensor scales = at::empty({out, ng}, at::kFloat);
  at::Tensor biases = at::empty({out, ng}, at::kFloat);
  const float* src = wf.data_ptr<float>();
  uint32_t* dst = reinterpret_cast<uint32_t*>(wq.data_ptr<int32_t>());
  float* sp = scales.data_ptr<float>();
  float* bp = biases.data_ptr<float>();
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  at::parallel_for(0, out, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint32_t* row = dst + r * words;
      for (int64_t g = 0; g < ng; ++g) {
        const float* x = src + r * in + g * gs;
        float w_min = std::numeric_limits<float>::infinity(), w_max = -w_min;
        for (int64_t j = 0; j < gs; ++j) {
          w_max = std::max(w_max, x[j]);
          w_min = std::min(w_min, x[j]);
        }
        // mlx: keep the larger-magnitude edge exact. Its sign picks the sign of the scale, and when
        // it rounds to a non-zero code q0 the scale is refit so that edge = q0 * scale + bias with
        // bias = edge, i.e. that edge decodes to itself.
        const bool mask = std::abs(w_min) > std::abs(w_max);
        float scale = std::max((w_max - w_min) / n_bins, eps);
        scale = mask ? scale : -scale;
        const float edge = mask ? w_min : w_max;
        const float q0 = std::rint(edge / scale);
        float bias = 0;
        if (q0 != 0) {
          scale = edge / q0;
          bias = edge;
        }
        for (int64_t j = 0; j < gs; ++j) {
          float q = std::rint((x[j] - bias) / scale);
          q = std::min(std::max(q, 0.0f), n_bins);
          const uint32_t code = static_cast<uint32_t>(q);
          const int64_t bit = (g * gs + j) * bits;
          const int64_t wi = bit >> 5;
          const int sh = static_cast<int>(bit & 31);
          row[wi] |= code << sh;
          if (sh + bits > 32) row[wi + 1] |= code >> (32 - sh);
        }
        sp[r * ng + g] = scale;
        bp[r * ng + g] = bias;
      }
    }
  });
  return QuantizedWeight{wq, scales.to(sdt), biases.to(sdt), spec};
}

// --- unpack / dequantize -----------------------------------------------------------------------

at::Tensor unpack_codes_on_device(const at::Tensor& wq, int bits, int64_t in_features) {
  HEARTH_CHECK(bits == 2 || bits == 4 || bits == 8, "unpack_codes_on_device: ", bits,
               " bits do not divide a 32-bit word");
  HEARTH_CHECK(wq.dim() == 2 && wq.scalar_type() == at::kInt && wq.size(1) * 32 == in_features * bits,
               "unpack_codes_on_device: expected kInt [out, ", in_features * bits / 32, "], got ", wq.scalar_type(),
               " ", wq.sizes());
  // Code j of a row sits in word j / per at bit (j % per) * bits, lowest bits first. The shift is
  // arithmetic on int32, and the mask drops the copied sign bits.
  const int64_t per = 32 / bits;
  const at::Tensor shifts = at::arange(0, 32, bits, wq.options());
  return wq.unsqueeze(-1).__rshift__(shifts).bitwise_and((1 << bits) - 1).to(at::kByte).reshape(
      {wq.size(0), wq.size(1) * per});
}

at::Tensor unpack_codes(const at::Tensor& wq, int bits, int64_t in_features) {
  check_quant_spec(QuantSpec{bits, 32}, "unpack_codes");
  HEARTH_CHECK(wq.dim() == 2 && wq.scalar_type() == at::kInt, "unpack_codes: expected a 2-D kInt tensor, got ",
               wq.scalar_type(), " ", wq.sizes());
  HEARTH_CHECK(in_features % 32 == 0 && wq.size(1) == in_features * bits / 32, "unpack_codes: ", wq.size(1),
               " words per row do not hold ", in_features, " codes of ", bits, " bits");
  // Off the CPU, widths that divide 32 unpack where the tensor lives (no host round trip).
  if (!wq.is_cpu() && 32 % bits == 0) return unpack_codes_on_device(wq, bits, in_features);
  const at::Tensor w = wq.to(at::kCPU).contiguous();
  const int64_t out = w.size(0), words = w.size(1);
  at::Tensor codes = at::empty({out, in_features}, at::kByte);
  const uint32_t* src = reinterpret_cast<const uint32_t*>(w.data_ptr<int32_t>());
  uint8_t* dst = codes.data_ptr<uint8_t>();
  at::parallel_for(0, out, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(static_cast<size_t>(in_features));
    for (int64_t r = r0; r < r1; ++r) {
      decode_codes_any(bits, src + r * words, buf.data(), in_features);
      for (int64_t j = 0; j < in_features; ++j) dst[r * in_features + j] = static_cast<uint8_t>(buf[j]);
    }
  });
  return codes.to(wq.device());
}

at::Tensor pack_codes(const at::Tensor& codes, int bits) {
  check_quant_spec(QuantSpec{bits, 32}, "pack_codes");
  HEARTH_CHECK(codes.dim() == 2 && !codes.is_floating_point(), "pack_codes: expected 2-D integer codes, got ",
               codes.scalar_type(), " ", codes.sizes());
  const int64_t out = codes.size(0), in = codes.size(1);
  HEARTH_CHECK(in % 32 == 0, "pack_codes: ", in, " codes per row is not a multiple of 32");
  const at::Tensor c = codes.to(at::kCPU).to(at::kLong).contiguous();
  if (c.numel() > 0) {
    const int64_t lo = c.min().item<int64_t>(), hi = c.max().item<int64_t>();
    HEARTH_CHECK(lo >= 0 && hi < (int64_t{1} << bits), "pack_codes: codes span [", lo, ", ", hi, "], outside [0, ",
                 (1 << bits) - 1, "] for ", bits, " bits");
  }
  const int64_t words = in * bits / 32;
  at::Tensor wq = at::zeros({out, words}, at::kInt);
  const int64_t* src = c.data_ptr<int64_t>();
  uint32_t* dst = reinterpret_cast<uint32_t*>(wq.data_ptr<int32_t>());
  for (int64_t r = 0; r < out; ++r)
    for (int64_t j = 0; j < in; ++j) {
      const uint32_t code = static_cast<uint32_t>(src[r * in + j]);
      const int64_t bit = j * bits, wi = r * words + (bit >> 5);
      const int sh = static_cast<int>(bit & 31);
      dst[wi] |= code << sh;
      if (sh + bits > 32) dst[wi + 1] |= code >> (32 - sh);
    }
  return wq.to(codes.device());
}

#ifdef HEARTH_WITH_CUDA_KERNELS
namespace {
at::Tensor dequantize_cuda(const QuantizedWeight& qw, at::ScalarType dtype);
}  // namespace
#endif

at::Tensor dequantize(const QuantizedWeight& qw, c10::optional<at::ScalarType> dtype) {
  check_qweight(qw, "dequantize");
#ifdef HEARTH_WITH_CUDA_KERNELS
  if (at::Tensor w = dequantize_cuda(qw, dtype.value_or(qw.scales.scalar_type())); w.defined()) return w;
#endif
  const int64_t out = qw.out_features(), in = qw.in_features(), gs = qw.spec.group_size;
  // Codes fit in 8 bits; go through float: w = scale * q + bias per group, in fp32.
  at::Tensor q = unpack_codes(qw.wq, qw.spec.bits, in).to(at::kFloat).view({out, in / gs, gs});
  at::Tensor s = qw.scales.to(q.device()).to(at::kFloat).unsqueeze(-1);
  at::Tensor b = qw.biases.to(q.device()).to(at::kFloat).unsqueeze(-1);
  at::Tensor w = (q * s + b).view({out, in});
  return w.to(dtype.value_or(qw.scales.scalar_type()));
}

// --- quantized matmul --------------------------------------------------------------------------

at::Tensor quantized_matmul_ref(const at::Tensor& x, const QuantizedWeight& qw) {
  check_qweight(qw, "quantized_matmul");
  HEARTH_CHECK(x.dim() >= 1 && x.size(-1) == qw.in_features(), "quantized_matmul: x has last dim ",
               x.dim() ? x.size(-1) : 0, ", weight expects ", qw.in_features());
  at::Tensor w = dequantize(qw, x.scalar_type()).to(x.device());
  return at::matmul(x, w.t());
}

namespace {

// Most rows of x that the SIMD kernel (nn/quant_simd.h) takes; more go to qmm_tiled.
constexpr int64_t kSimdMaxRows = 64;

// Rows of the weight decoded per tile; bounded so the fp32 tile stays cache-sized.
int64_t tile_rows(int64_t in) { return std::clamp<int64_t>((int64_t{1} << 20) / (in * 4), 8, 256); }

// Σx over each group of `gs` inputs, per row of x [M, in]: [M, in / gs] (the bias term of an
// affine group is b · Σx_g).
std::vector<float> group_sums(const float* x, int64_t M, int64_t in, int64_t gs) {
  const int64_t ng = in / gs;
  std::vector<float> xsum(static_cast<size_t>(M * ng));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < ng; ++g) {
      float s = 0;
      for (int64_t j = 0; j < gs; ++j) s += x[m * in + g * gs + j];
      xsum[m * ng + g] = s;
    }
  return xsum;
}

// y[M, out] = x[M, in] · Wᵀ for M small: per output row and group, y += s·(q·x_g) + b·Σx_g, with
// Σx_g precomputed. The codes of one row are decoded to fp32 once and reused for all M rows of x.
void qmm_small_m(const float* x, int64_t M, const QuantizedWeight& qw, const float* scales, const float* biases,
                 float* y) {
  const int64_t out = qw.out_features(), in = qw.in_features(), gs = qw.spec.group_size, ng = in / gs;
  const int64_t words = qw.wq.size(1);
  const int bits = qw.spec.bits;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(qw.wq.data_ptr<int32_t>());
  const std::vector<float> xsum = group_sums(x, M, in, gs);
  at::parallel_for(0, out, 8, [&](int64_t r0, int64_t r1) {
    std::vector<float> qrow(static_cast<size_t>(in));
    for (int64_t r = r0; r < r1; ++r) {
      decode_codes_any(bits, w + r * words, qrow.data(), in);
      const float* s = scales + r * ng;
      const float* b = biases + r * ng;
      for (int64_t m = 0; m < M; ++m) {
        const float* xm = x + m * in;
        const float* xs = xsum.data() + m * ng;
        float acc = 0;
        for (int64_t g = 0; g < ng; ++g) acc += s[g] * dot(qrow.data() + g * gs, xm + g * gs, gs) + b[g] * xs[g];
        y[m * out + r] = acc;
      }
    }
  });
}

// --- small-M fast paths for 4 and 8 bits ---------------------------------------------------------
// Codes are read straight from the packed bytes (little-endian host, the layout above): for 8 bits
// byte j of a row is code j; for 4 bits byte i holds code 2i in its low nibble and code 2i+1 in its
// high nibble. So that nibble lanes line up with x lanes, x is pre-split per group into its even
// then its odd elements ("group-split" order) and 4-bit codes are decoded in that order too. Fixed
// trip counts and kLanes independent accumulators let GCC vectorize without fast-math.

static_assert(std::endian::native == std::endian::little, "packed codes are read as little-endian bytes");
constexpr int kLanes = 16;

inline float reduce_lanes(const float* a) {
  float s[kLanes / 2];
  for (int k = 0; k < kLanes / 2; ++k) s[k] = a[k] + a[k + kLanes / 2];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// Σ q_j · x_j over one group, codes read from the packed bytes `q`, x in group-split order for 4 bits.
template <int Bits, int GS>
inline float group_dot(const uint8_t* q, const float* x) {
  static_assert(Bits == 4 || Bits == 8);
  float acc[kLanes] = {};
  if constexpr (Bits == 8) {
    for (int j = 0; j < GS; j += kLanes)
      for (int k = 0; k < kLanes; ++k) acc[k] += static_cast<float>(q[j + k]) * x[j + k];
  } else {
    constexpr int H = GS / 2;
    for (int j = 0; j < H; j += kLanes)
      for (int k = 0; k < kLanes; ++k)
        acc[k] += static_cast<float>(q[j + k] & 15) * x[j + k] + static_cast<float>(q[j + k] >> 4) * x[H + j + k];
  }
  return reduce_lanes(acc);
}

// Decodes one group of codes to fp32 in the order group_dot pairs them with x.
template <int Bits, int GS>
inline void group_decode(const uint8_t* q, float* out) {
  if constexpr (Bits == 8) {
    for (int j = 0; j < GS; ++j) out[j] = static_cast<float>(q[j]);
  } else {
    for (int j = 0; j < GS / 2; ++j) {
      out[j] = static_cast<float>(q[j] & 15);
      out[GS / 2 + j] = static_cast<float>(q[j] >> 4);
    }
  }
}

inline float dot_lanes(const float* a, const float* b, int64_t n) {  // n % kLanes == 0
  float acc[kLanes] = {};
  for (int64_t i = 0; i < n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += a[i + k] * b[i + k];
  return reduce_lanes(acc);
}

// One row of scales or biases to fp32 (they stay in their own dtype in the weight).
void row_to_f32(const at::Tensor& t, int64_t row, int64_t n, float* dst) {
  switch (t.scalar_type()) {
    case at::kFloat: std::memcpy(dst, t.data_ptr<float>() + row * n, static_cast<size_t>(n) * 4); return;
    case at::kBFloat16: {
      const c10::BFloat16* p = t.data_ptr<c10::BFloat16>() + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    case at::kHalf: {
      const c10::Half* p = t.data_ptr<c10::Half>() + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    default: {
      const at::Tensor f = t[row].to(at::kFloat).contiguous();
      std::memcpy(dst, f.data_ptr<float>(), static_cast<size_t>(n) * 4);
    }
  }
}

// y[M, out] = x[M, in] · Wᵀ for M <= 8 and bits 4/8: x is fp32 (group-split for 4 bits); scales and
// biases are contiguous [out, ng] in any float dtype. Per row and group y += s·(q·x_g) + b·Σx_g.
// M == 1 fuses decode and dot; larger M decodes each group once to fp32 and reuses it for every row.
template <int Bits, int GS>
void qmv_fast(const float* x, int64_t M, const QuantizedWeight& qw, const at::Tensor& scales, const at::Tensor& biases,
              float* y) {
  const int64_t out = qw.out_features(), in = qw.in_features(), ng = in / GS;
  const int64_t row_bytes = in * Bits / 8, group_bytes = GS * Bits / 8;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(qw.wq.data_ptr<int32_t>());
  const std::vector<float> xsum = group_sums(x, M, in, GS);
  const int64_t grain = std::max<int64_t>(1, 16384 / in);
  at::parallel_for(0, out, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> sb(static_cast<size_t>(2 * ng));
    alignas(64) float qf[GS];
    float acc[8];
    for (int64_t r = r0; r < r1; ++r) {
      row_to_f32(scales, r, ng, sb.data());
      row_to_f32(biases, r, ng, sb.data() + ng);
      const float* s = sb.data();
      const float* b = sb.data() + ng;
      const uint8_t* wr = w + r * row_bytes;
      if (M == 1) {
        float a = 0;
        for (int64_t g = 0; g < ng; ++g) a += s[g] * group_dot<Bits, GS>(wr + g * group_bytes, x + g * GS) + b[g] * xsum[g];
        y[r] = a;
        continue;
      }
      // Several rows of x (a batched decode step): each decoded, scaled weight lane is loaded once
      // and multiplied into every row's accumulators (register blocking over M), so the step costs
      // little more than one row instead of M times one row.
      alignas(64) float lanes[8][kLanes] = {};
      for (int64_t m = 0; m < M; ++m) acc[m] = 0;
      for (int64_t g = 0; g < ng; ++g) {
        group_decode<Bits, GS>(wr + g * group_bytes, qf);
        const float sg = s[g];
        for (int j = 0; j < GS; ++j) qf[j] *= sg;
        const float* xg = x + g * GS;
        for (int j = 0; j < GS; j += kLanes)
          for (int64_t m = 0; m < M; ++m) {
            const float* xm = xg + m * in + j;
            for (int k = 0; k < kLanes; ++k) lanes[m][k] += qf[j + k] * xm[k];
          }
        for (int64_t m = 0; m < M; ++m) acc[m] += b[g] * xsum[m * ng + g];
      }
      for (int64_t m = 0; m < M; ++m) y[m * out + r] = acc[m] + reduce_lanes(lanes[m]);
    }
  });
}

// Dispatches qmv_fast on (bits, group size); false when there is no fast path for them.
bool qmv_fast_any(const float* x, int64_t M, const QuantizedWeight& qw, const at::Tensor& scales,
                  const at::Tensor& biases, float* y) {
  const int bits = qw.spec.bits, gs = qw.spec.group_size;
#define HEARTH_QMV_CASE(B, G) \
  if (bits == B && gs == G) return qmv_fast<B, G>(x, M, qw, scales, biases, y), true;
  HEARTH_QMV_CASE(8, 32) HEARTH_QMV_CASE(8, 64) HEARTH_QMV_CASE(8, 128)
  HEARTH_QMV_CASE(4, 32) HEARTH_QMV_CASE(4, 64) HEARTH_QMV_CASE(4, 128)
#undef HEARTH_QMV_CASE
  return false;
}

// x [M, in] fp32 → the same with each group's elements reordered evens first, then odds.
at::Tensor split_groups_even_odd(const at::Tensor& x2, int64_t gs) {
  const int64_t M = x2.size(0), in = x2.size(1);
  return x2.view({M, in / gs, gs / 2, 2}).transpose(2, 3).contiguous().view({M, in});
}

// Larger M: dequantize a tile of rows into fp32 (in parallel), then one BLAS matmul per tile.
void qmm_tiled(const at::Tensor& x2, const QuantizedWeight& qw, const float* scales, const float* biases,
               at::Tensor& y) {
  const int64_t out = qw.out_features(), in = qw.in_features(), gs = qw.spec.group_size, ng = in / gs;
  const int64_t words = qw.wq.size(1);
  const int bits = qw.spec.bits;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(qw.wq.data_ptr<int32_t>());
  const int64_t tr = tile_rows(in);
  at::Tensor tile = at::empty({tr, in}, at::kFloat);
  float* t = tile.data_ptr<float>();
  for (int64_t r0 = 0; r0 < out; r0 += tr) {
    const int64_t rows = std::min(tr, out - r0);
    at::parallel_for(0, rows, 4, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) {
        const int64_t r = r0 + i;
        float* dst = t + i * in;
        decode_codes_any(bits, w + r * words, dst, in);
        for (int64_t g = 0; g < ng; ++g) {
          const float s = scales[r * ng + g], bb = biases[r * ng + g];
          for (int64_t j = 0; j < gs; ++j) dst[g * gs + j] = s * dst[g * gs + j] + bb;
        }
      }
    });
    y.narrow(1, r0, rows).copy_(at::mm(x2, tile.narrow(0, 0, rows).t()));
  }
}

// Prefill-sized M with the fast CPU GEMM (nn/cpu_gemm.h): each thread takes one block of output
// rows, dequantizes a tile of them to fp32 (SIMD where it can) and multiplies x by it with a
// single-threaded sgemm straight into its columns of y. One thread pool, no whole-matrix copy.
void qmm_dequant_gemm(const at::Tensor& x2, const QuantizedWeight& qw, float* y) {
  const int64_t M = x2.size(0), out = qw.out_features(), in = qw.in_features(), gs = qw.spec.group_size;
  const int64_t ng = in / gs, words = qw.wq.size(1);
  const float* x = x2.data_ptr<float>();
  const at::Tensor scales = qw.scales.contiguous(), biases = qw.biases.contiguous();
  const bool simd_ok = simd::active_isa() != simd::Isa::kNone && (qw.spec.bits == 4 || qw.spec.bits == 8);
  at::Tensor s32, b32;  // the portable decode's fp32 scales/biases
  if (!simd_ok) {
    s32 = scales.to(at::kFloat).contiguous();
    b32 = biases.to(at::kFloat).contiguous();
  }
  const uint32_t* w = reinterpret_cast<const uint32_t*>(qw.wq.data_ptr<int32_t>());
  const int64_t tr = std::min<int64_t>(tile_rows(in), 128);
  cpu::for_column_blocks(out, 32, [&](int64_t n0, int64_t n1) {
    thread_local std::vector<float> tile;
    tile.resize(static_cast<size_t>(tr * in));
    float* t = tile.data();
    for (int64_t r0 = n0; r0 < n1; r0 += tr) {
      const int64_t rows = std::min(tr, n1 - r0);
      if (simd_ok) {
        simd::dequantize_rows_simd(qw, scales, biases, r0, rows, t);
      } else {
        const float* sp = s32.data_ptr<float>();
        const float* bp = b32.data_ptr<float>();
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t r = r0 + i;
          float* dst = t + i * in;
          decode_codes_any(qw.spec.bits, w + r * words, dst, in);
          for (int64_t g = 0; g < ng; ++g)
            for (int64_t j = 0; j < gs; ++j) dst[g * gs + j] = sp[r * ng + g] * dst[g * gs + j] + bp[r * ng + g];
        }
      }
      cpu::sgemm_nt(M, rows, in, x, in, t, in, y + r0, out);
    }
  });
}

#ifdef HEARTH_WITH_CUDA_KERNELS
// The fused CUDA GEMV (kernels/quantized_matmul.cu) when it applies: x on a CUDA device with the
// weight, x float/half/bf16, M = x.numel()/in in [1, 8], bits 4 or 8. Scales/biases in another
// dtype than x go to fp32 first (exact for bf16/f16). Undefined tensor when it does not apply.
kernels::QDtype qdtype(at::ScalarType t) {
  return t == at::kBFloat16 ? kernels::QDtype::kBFloat16 : t == at::kHalf ? kernels::QDtype::kFloat16
                                                                           : kernels::QDtype::kFloat32;
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// One kernel (kernels::affine_dequantize, the same bits as the ops below) when the codes live on a
// CUDA device with their scales, the fused path is on, nothing needs a gradient and bits divide 32.
at::Tensor dequantize_cuda(const QuantizedWeight& qw, at::ScalarType dtype) {
  const auto is_float = [](at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; };
  if (!fused_decode_enabled() || !qw.wq.is_cuda() || qw.scales.device() != qw.wq.device() ||
      qw.biases.device() != qw.wq.device() || !is_float(dtype) || !is_float(qw.scales.scalar_type()) ||
      qw.biases.scalar_type() != qw.scales.scalar_type() ||
      (c10::GradMode::is_enabled() && (qw.scales.requires_grad() || qw.biases.requires_grad())))
    return {};
  kernels::AffineDequantArgs a;
  a.bits = qw.spec.bits;
  a.group_size = static_cast<int>(qw.spec.group_size);
  a.out = qw.out_features();
  a.in = qw.in_features();
  if (32 % a.bits != 0 || (a.group_size != 32 && a.group_size != 64 && a.group_size != 128)) return {};
  const c10::cuda::CUDAGuard guard(qw.wq.device());
  const at::Tensor wq = qw.wq.contiguous(), sc = qw.scales.contiguous(), bi = qw.biases.contiguous();
  at::Tensor w = at::empty({a.out, a.in}, sc.options().dtype(dtype));
  if (!aligned16(w)) return {};
  a.wq = reinterpret_cast<const uint32_t*>(wq.data_ptr<int32_t>());
  a.scales = sc.data_ptr();
  a.biases = bi.data_ptr();
  a.s_dtype = qdtype(sc.scalar_type());
  a.w = w.data_ptr();
  a.w_dtype = qdtype(dtype);
  a.stream = c10::cuda::getCurrentCUDAStream(w.device().index()).stream();
  if (const char* err = kernels::affine_dequantize(a)) throw Error(cat("dequantize: ", err));
  return w;
}

at::Tensor qmv_cuda(const at::Tensor& x, const QuantizedWeight& qw) {
  const at::ScalarType xt = x.scalar_type();
  if (!x.is_cuda() || (xt != at::kFloat && xt != at::kHalf && xt != at::kBFloat16)) return {};
  if (qw.wq.device() != x.device() || qw.scales.device() != x.device() || qw.biases.device() != x.device()) return {};
  const int64_t in = qw.in_features(), out = qw.out_features();
  const int64_t M = in > 0 ? x.numel() / in : 0;
  at::Tensor s = qw.scales, b = qw.biases;
  if (s.scalar_type() != xt || b.scalar_type() != xt) {
    s = s.to(at::kFloat);
    b = b.to(at::kFloat);
  }
  if (!kernels::quantized_gemv_supported(qw.spec.bits, qw.spec.group_size, M, in, qdtype(xt),
                                         qdtype(s.scalar_type())))
    return {};
  at::Tensor x2 = x.reshape({M, in}).contiguous();
  if (!aligned16(x2)) x2 = x2.clone();
  at::Tensor wq = qw.wq.contiguous();
  if (!aligned16(wq)) wq = wq.clone();
  s = s.contiguous();
  b = b.contiguous();
  at::Tensor y = at::empty({M, out}, x.options());
  const c10::cuda::CUDAGuard guard(x.device());
  kernels::QuantGemvArgs a;
  a.x = x2.data_ptr();
  a.x_dtype = qdtype(xt);
  a.wq = reinterpret_cast<const uint32_t*>(wq.data_ptr<int32_t>());
  a.scales = s.data_ptr();
  a.biases = b.data_ptr();
  a.s_dtype = qdtype(s.scalar_type());
  a.y = y.data_ptr();
  a.M = M;
  a.out = out;
  a.in = in;
  a.bits = qw.spec.bits;
  a.group_size = qw.spec.group_size;
  a.stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  const char* err = kernels::quantized_gemv(a);
  HEARTH_CHECK(err == nullptr, "quantized_matmul: CUDA kernel failed: ", err);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = out;
  return y.view(out_shape);
}
#endif

}  // namespace

at::Tensor quantized_matmul(const at::Tensor& x, const QuantizedWeight& qw) {
  check_qweight(qw, "quantized_matmul");
  HEARTH_CHECK(x.dim() >= 1 && x.size(-1) == qw.in_features(), "quantized_matmul: x has last dim ",
               x.dim() ? x.size(-1) : 0, ", weight expects ", qw.in_features());
  // The kernels below record no autograd graph: an x that needs a gradient takes the reference.
  if (c10::GradMode::is_enabled() && x.requires_grad()) return quantized_matmul_ref(x, qw);
  if (!x.is_cpu() || !qw.wq.is_cpu()) {
#ifdef HEARTH_WITH_CUDA_KERNELS
    // Decode-sized M on CUDA: the fused GEMV; larger M (or other widths/dtypes): dequantize + matmul.
    if (at::Tensor y = qmv_cuda(x, qw); y.defined()) return y;
#endif
    return quantized_matmul_ref(x, qw);
  }
  const int64_t in = qw.in_features(), out = qw.out_features();
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = out;
  at::Tensor x2 = x.reshape({-1, in}).to(at::kFloat).contiguous();
  const int64_t M = x2.size(0);
  QuantizedWeight q = qw;
  q.wq = qw.wq.contiguous();
  at::Tensor y = at::empty({M, out}, at::kFloat);
  if (M == 0 || out == 0) return y.view(out_shape).to(x.scalar_type());
  // Bits 4 and 8 up to 64 rows (a decode step of up to 64 sequences): the SIMD kernel, whose cost
  // per row falls with the rows. Past 64 rows (prefill chunks) dequantized tiles + BLAS are faster
  // (bench/quant_bench.cpp, docs/benchmarks.md).
  if (M <= kSimdMaxRows && (qw.spec.bits == 4 || qw.spec.bits == 8)) {
    const at::Tensor xk = qw.spec.bits == 4 ? split_groups_even_odd(x2, qw.spec.group_size) : x2;
    if (simd::quantized_matmul_simd(xk.data_ptr<float>(), M, q, qw.scales.contiguous(), qw.biases.contiguous(),
                                    y.data_ptr<float>()))
      return y.view(out_shape).to(x.scalar_type());
  }
  if (M <= 8) {
    // Bits 4 and 8 read scales/biases in their own dtype, row by row; x goes group-split for 4 bits.
    const at::Tensor xk = qw.spec.bits == 4 ? split_groups_even_odd(x2, qw.spec.group_size) : x2;
    if (qmv_fast_any(xk.data_ptr<float>(), M, q, qw.scales.contiguous(), qw.biases.contiguous(), y.data_ptr<float>()))
      return y.view(out_shape).to(x.scalar_type());
  }
  if (M > 8 && cpu::fast_gemm_enabled()) {
    qmm_dequant_gemm(x2, q, y.data_ptr<float>());
    return y.view(out_shape).to(x.scalar_type());
  }
  const at::Tensor s = qw.scales.to(at::kFloat).contiguous();
  const at::Tensor b = qw.biases.to(at::kFloat).contiguous();
  if (M <= 8)
    qmm_small_m(x2.data_ptr<float>(), M, q, s.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>());
  else
    qmm_tiled(x2, q, s.data_ptr<float>(), b.data_ptr<float>(), y);
  return y.view(out_shape).to(x.scalar_type());
}

}  // namespace hearth::nn
