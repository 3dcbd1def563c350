// x86 SIMD kernel of the CPU quantized matmul (MLX affine 4/8-bit): AVX-512 and AVX2 + FMA versions
// compiled with function target attributes and chosen at run time by cpuid, so the build stays
// portable. Not the dispatch between kernels (quant.cpp). Layout: mlx's packed rows (quant.h).
#include "nn/quant_simd.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's own intrinsics (the `__Y = __Y` of _mm512_undefined_*) warn falsely when inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define HEARTH_QSIMD_X86 1
#endif

namespace hearth::nn::simd {

namespace {
std::atomic<int> g_cap{static_cast<int>(Isa::kAvx512)};

// HEARTH_CPU_ISA's cap (kAvx512: unset).
Isa env_cap() {
  const char* v = std::getenv("HEARTH_CPU_ISA");
  if (v == nullptr || *v == 0) return Isa::kAvx512;
  const std::string s(v);
  if (s == "none") return Isa::kNone;
  if (s == "avx2") return Isa::kAvx2;
  if (s == "avx512") return Isa::kAvx512;
  throw Error(cat("HEARTH_CPU_ISA: '", s, "' is not one of none, avx2, avx512"));
}

Isa detect() {
#ifdef HEARTH_QSIMD_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kNone;
}

// Rows [r0, r0 + n) of a contiguous [out, ng] float tensor to fp32 in `dst` (n * ng floats).
void rows_to_f32(const at::Tensor& t, int64_t r0, int64_t n, int64_t ng, float* dst) {
  const int64_t k = n * ng, off = r0 * ng;
  switch (t.scalar_type()) {
    case at::kFloat: std::memcpy(dst, t.data_ptr<float>() + off, static_cast<size_t>(k) * 4); return;
    case at::kBFloat16: {
      const c10::BFloat16* p = t.data_ptr<c10::BFloat16>() + off;
      for (int64_t i = 0; i < k; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    case at::kHalf: {
      const c10::Half* p = t.data_ptr<c10::Half>() + off;
      for (int64_t i = 0; i < k; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    default: {
      const at::Tensor f = t.narrow(0, r0, n).to(at::kFloat).contiguous();
      std::memcpy(dst, f.data_ptr<float>(), static_cast<size_t>(k) * 4);
    }
  }
}

// What one block kernel call needs: R weight rows from `w` (row stride row_bytes) with their fp32
// scales/biases `s`, `b` (row stride ng), MB rows of x from `x` (row stride in), results to
// y[m * out] (y points at column r of row m0).
struct Block {
  const float* x;
  const uint8_t* w;
  const float* s;
  const float* b;
  float* y;
  int64_t in, ng, row_bytes, out;
};
using BlockFn = void (*)(const Block&);

#ifdef HEARTH_QSIMD_X86
#define HEARTH_T512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define HEARTH_T256 __attribute__((target("avx2,fma")))

// Bytes ahead of the current group that each weight row prefetches: a block walks R rows (up to 4
// streams) a group at a time, too many interleaved streams for the hardware prefetcher to keep a
// one-row decode fed (measured: 2.5 GB/s of codes at M = 1 before the prefetch and the unrolled
// loops together; 6.1 -> 14.5 tok/s on a Qwen3.5-0.8B-shape 4-bit model, docs/benchmarks.md).
constexpr int64_t kPrefetchAhead = 512;

// --- AVX-512: 16 lanes -------------------------------------------------------------------------
// Per group and weight row: w = fma(q, s, b) for 16 codes at a time, then acc[r][m] += w · x[m]
// for the MB rows of x. 8 bits: 16 codes from 16 bytes. 4 bits: 16 bytes give the 16 even codes
// (low nibbles, paired with x's group-split first half) and the 16 odd ones (high nibbles).
template <int Bits, int GS, int R, int MB>
HEARTH_T512 void block512(const Block& a) {
  __m512 acc[R][MB];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
  constexpr int64_t GB = GS * Bits / 8;  // bytes per group
  for (int64_t g = 0; g < a.ng; ++g) {
    __m512 sg[R], bg[R];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      sg[r] = _mm512_set1_ps(a.s[r * a.ng + g]);
      bg[r] = _mm512_set1_ps(a.b[r * a.ng + g]);
    }
    const float* xg = a.x + g * GS;
    const uint8_t* wg = a.w + g * GB;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(wg + r * a.row_bytes + kPrefetchAhead), _MM_HINT_T0);
    if constexpr (Bits == 8) {
      #pragma GCC unroll 16
      for (int c = 0; c < GS / 16; ++c) {
        __m512 wv[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + r * a.row_bytes + 16 * c));
          wv[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), sg[r], bg[r]);
        }
        #pragma GCC unroll 16
        for (int m = 0; m < MB; ++m) {
          const __m512 xv = _mm512_loadu_ps(xg + m * a.in + 16 * c);
          #pragma GCC unroll 16
          for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
        }
      }
    } else {
      const __m512i lo4 = _mm512_set1_epi32(15);
      #pragma GCC unroll 16
      for (int c = 0; c < GS / 32; ++c) {
        __m512 wl[R], wh[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + r * a.row_bytes + 16 * c));
          const __m512i q32 = _mm512_cvtepu8_epi32(q);
          wl[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q32, lo4)), sg[r], bg[r]);
          wh[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q32, 4)), sg[r], bg[r]);
        }
        #pragma GCC unroll 16
        for (int m = 0; m < MB; ++m) {
          const __m512 xl = _mm512_loadu_ps(xg + m * a.in + 16 * c);
          const __m512 xh = _mm512_loadu_ps(xg + m * a.in + GS / 2 + 16 * c);
          #pragma GCC unroll 16
          for (int r = 0; r < R; ++r) {
            acc[r][m] = _mm512_fmadd_ps(wl[r], xl, acc[r][m]);
            acc[r][m] = _mm512_fmadd_ps(wh[r], xh, acc[r][m]);
          }
        }
      }
    }
  }
  #pragma GCC unroll 16
  for (int m = 0; m < MB; ++m)
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a.y[m * a.out + r] = _mm512_reduce_add_ps(acc[r][m]);
}

// --- AVX2: 8 lanes, 16 registers ------------------------------------------------------------------
HEARTH_T256 inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// As block512 with 8 codes at a time: 8 bits from 8 bytes; 4 bits: 8 bytes give 8 even and 8 odd codes.
template <int Bits, int GS, int R, int MB>
HEARTH_T256 void block256(const Block& a) {
  __m256 acc[R][MB];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm256_setzero_ps();
  constexpr int64_t GB = GS * Bits / 8;
  for (int64_t g = 0; g < a.ng; ++g) {
    __m256 sg[R], bg[R];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      sg[r] = _mm256_set1_ps(a.s[r * a.ng + g]);
      bg[r] = _mm256_set1_ps(a.b[r * a.ng + g]);
    }
    const float* xg = a.x + g * GS;
    const uint8_t* wg = a.w + g * GB;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(wg + r * a.row_bytes + kPrefetchAhead), _MM_HINT_T0);
    if constexpr (Bits == 8) {
      #pragma GCC unroll 16
      for (int c = 0; c < GS / 8; ++c) {
        __m256 wv[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wg + r * a.row_bytes + 8 * c));
          wv[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), sg[r], bg[r]);
        }
        #pragma GCC unroll 16
        for (int m = 0; m < MB; ++m) {
          const __m256 xv = _mm256_loadu_ps(xg + m * a.in + 8 * c);
          #pragma GCC unroll 16
          for (int r = 0; r < R; ++r) acc[r][m] = _mm256_fmadd_ps(wv[r], xv, acc[r][m]);
        }
      }
    } else {
      const __m256i lo4 = _mm256_set1_epi32(15);
      #pragma GCC unroll 16
      for (int c = 0; c < GS / 16; ++c) {
        __m256 wl[R], wh[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wg + r * a.row_bytes + 8 * c));
          const __m256i q32 = _mm256_cvtepu8_epi32(q);
          wl[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q32, lo4)), sg[r], bg[r]);
          wh[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q32, 4)), sg[r], bg[r]);
        }
        #pragma GCC unroll 16
        for (int m = 0; m < MB; ++m) {
          const __m256 xl = _mm256_loadu_ps(xg + m * a.in + 8 * c);
          const __m256 xh = _mm256_loadu_ps(xg + m * a.in + GS / 2 + 8 * c);
          #pragma GCC unroll 16
          for (int r = 0; r < R; ++r) {
            acc[r][m] = _mm256_fmadd_ps(wl[r], xl, acc[r][m]);
            acc[r][m] = _mm256_fmadd_ps(wh[r], xh, acc[r][m]);
          }
        }
      }
    }
  }
  #pragma GCC unroll 16
  for (int m = 0; m < MB; ++m)
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a.y[m * a.out + r] = hsum256(acc[r][m]);
}

// Block kernels of one (isa, bits, group size): fn[i][mb - 1] takes mb rows of x and R = 1, 2, 4
// weight rows for i = 0, 1, 2. R is chosen so accumulators + weights fit the register file: 4
// rows for up to 2 rows of x, else 2 (AVX-512: 32 registers, blocks of up to 8 rows of x; AVX2:
// 16 registers, blocks of up to 4 rows of x, R = 2). R = 4 exists only for mb <= 2.
struct Kernels {
  int max_mb = 0;
  BlockFn fn[3][8] = {};
};

template <int Bits, int GS, int... MB>
Kernels kernels512(std::integer_sequence<int, MB...>) {
  Kernels k;
  k.max_mb = 8;
  ((k.fn[0][MB] = &block512<Bits, GS, 1, MB + 1>), ...);
  ((k.fn[1][MB] = &block512<Bits, GS, 2, MB + 1>), ...);
  k.fn[2][0] = &block512<Bits, GS, 4, 1>;
  k.fn[2][1] = &block512<Bits, GS, 4, 2>;
  return k;
}

template <int Bits, int GS, int... MB>
Kernels kernels256(std::integer_sequence<int, MB...>) {
  Kernels k;
  k.max_mb = 4;
  ((k.fn[0][MB] = &block256<Bits, GS, 1, MB + 1>), ...);
  ((k.fn[1][MB] = &block256<Bits, GS, 2, MB + 1>), ...);
  return k;
}

const Kernels* kernels_for(Isa isa, int bits, int gs) {
#define HEARTH_QSIMD_CASE(B, G)                                                                   \
  if (bits == B && gs == G) {                                                                     \
    static const Kernels k512 = kernels512<B, G>(std::make_integer_sequence<int, 8>{});           \
    static const Kernels k256 = kernels256<B, G>(std::make_integer_sequence<int, 4>{});           \
    return isa == Isa::kAvx512 ? &k512 : &k256;                                                   \
  }
  HEARTH_QSIMD_CASE(8, 32) HEARTH_QSIMD_CASE(8, 64) HEARTH_QSIMD_CASE(8, 128)
  HEARTH_QSIMD_CASE(4, 32) HEARTH_QSIMD_CASE(4, 64) HEARTH_QSIMD_CASE(4, 128)
#undef HEARTH_QSIMD_CASE
  return nullptr;
}

// --- Dequantizing rows (the prefill path: decoded rows + fp32 GEMM) ------------------------------
// Row i of dst = fma(q, s, b) per group in natural column order. 4 bits: byte j holds code 2j in its
// low nibble and 2j+1 in its high one; the nibbles are interleaved back in bytes before widening.
template <int Bits>
HEARTH_T512 void dequant_rows512(const uint8_t* w, int64_t row_bytes, const float* s, const float* b, int64_t n,
                                 int64_t in, int64_t gs, float* dst) {
  const int64_t ng = in / gs;
  const __m128i lo4 = _mm_set1_epi8(15);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* wr = w + i * row_bytes;
    float* d = dst + i * in;
    for (int64_t g = 0; g < ng; ++g) {
      const __m512 sg = _mm512_set1_ps(s[i * ng + g]), bg = _mm512_set1_ps(b[i * ng + g]);
      if constexpr (Bits == 8) {
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 16) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + c));
          _mm512_storeu_ps(d + c, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), sg, bg));
        }
      } else {
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 32) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + c / 2));
          const __m128i lo = _mm_and_si128(q, lo4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), lo4);
          const __m128i c0 = _mm_unpacklo_epi8(lo, hi), c1 = _mm_unpackhi_epi8(lo, hi);
          _mm512_storeu_ps(d + c, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c0)), sg, bg));
          _mm512_storeu_ps(d + c + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c1)), sg, bg));
        }
      }
    }
  }
}

template <int Bits>
HEARTH_T256 void dequant_rows256(const uint8_t* w, int64_t row_bytes, const float* s, const float* b, int64_t n,
                                 int64_t in, int64_t gs, float* dst) {
  const int64_t ng = in / gs;
  const __m128i lo4 = _mm_set1_epi8(15);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* wr = w + i * row_bytes;
    float* d = dst + i * in;
    for (int64_t g = 0; g < ng; ++g) {
      const __m256 sg = _mm256_set1_ps(s[i * ng + g]), bg = _mm256_set1_ps(b[i * ng + g]);
      if constexpr (Bits == 8) {
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 8) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wr + c));
          _mm256_storeu_ps(d + c, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), sg, bg));
        }
      } else {
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 16) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wr + c / 2));
          const __m128i lo = _mm_and_si128(q, lo4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), lo4);
          const __m128i codes = _mm_unpacklo_epi8(lo, hi);
          _mm256_storeu_ps(d + c, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), sg, bg));
          _mm256_storeu_ps(d + c + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))),
                                                      sg, bg));
        }
      }
    }
  }
}
#endif  // HEARTH_QSIMD_X86

}  // namespace

Isa active_isa() {
  static const Isa cpu = detect();
  static const Isa env = env_cap();
  return static_cast<Isa>(std::min({static_cast<int>(cpu), static_cast<int>(env), g_cap.load()}));
}

Isa set_isa_cap(Isa cap) { return static_cast<Isa>(g_cap.exchange(static_cast<int>(cap))); }

bool quantized_matmul_simd(const float* x, int64_t M, const QuantizedWeight& qw, const at::Tensor& scales,
                           const at::Tensor& biases, float* y) {
#ifdef HEARTH_QSIMD_X86
  const Isa isa = active_isa();
  if (isa == Isa::kNone) return false;
  const Kernels* k = kernels_for(isa, qw.spec.bits, qw.spec.group_size);
  if (k == nullptr) return false;
  const int64_t out = qw.out_features(), in = qw.in_features(), ng = in / qw.spec.group_size;
  const int64_t row_bytes = in * qw.spec.bits / 8;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(qw.wq.data_ptr<int32_t>());
  // Chunks of output rows per thread: at least ~64 KiB of codes, so small matrices stay on one.
  const int64_t grain = std::max<int64_t>(8, (64 << 10) / std::max<int64_t>(row_bytes, 1));
  // Weight rows per block: 4 when the whole of x is one block of <= 2 rows (AVX-512), else 2;
  // the last rows of a thread's range go one at a time. Every block of weight rows meets all of x
  // (blocks of max_mb rows) while its codes are in L1.
  const int wide = (isa == Isa::kAvx512 && M <= 2) ? 2 : 1;  // index into fn: R = 4 or 2
  const int R = wide == 2 ? 4 : 2;
  at::parallel_for(0, out, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> sb(static_cast<size_t>(2 * (r1 - r0) * ng));
    float* s = sb.data();
    float* b = s + (r1 - r0) * ng;
    rows_to_f32(scales, r0, r1 - r0, ng, s);
    rows_to_f32(biases, r0, r1 - r0, ng, b);
    Block blk{nullptr, nullptr, nullptr, nullptr, nullptr, in, ng, row_bytes, out};
    for (int64_t r = r0; r < r1;) {
      const int i = r + R <= r1 ? wide : 0;
      blk.w = w + r * row_bytes;
      blk.s = s + (r - r0) * ng;
      blk.b = b + (r - r0) * ng;
      for (int64_t m0 = 0; m0 < M; m0 += k->max_mb) {
        const int mb = static_cast<int>(std::min<int64_t>(k->max_mb, M - m0));
        blk.x = x + m0 * in;
        blk.y = y + m0 * out + r;
        k->fn[i][mb - 1](blk);
      }
      r += i == 0 ? 1 : R;
    }
  });
  return true;
#else
  (void)x, (void)M, (void)qw, (void)scales, (void)biases, (void)y;
  return false;
#endif
}

bool dequantize_rows_simd(const QuantizedWeight& qw, const at::Tensor& scales, const at::Tensor& biases, int64_t r0,
                          int64_t n, float* dst) {
#ifdef HEARTH_QSIMD_X86
  const Isa isa = active_isa();
  const int bits = qw.spec.bits;
  if (isa == Isa::kNone || (bits != 4 && bits != 8)) return false;
  const int64_t in = qw.in_features(), gs = qw.spec.group_size, ng = in / gs, row_bytes = in * bits / 8;
  thread_local std::vector<float> sb;
  sb.resize(static_cast<size_t>(2 * n * ng));
  rows_to_f32(scales, r0, n, ng, sb.data());
  rows_to_f32(biases, r0, n, ng, sb.data() + n * ng);
  const uint8_t* w = reinterpret_cast<const uint8_t*>(qw.wq.data_ptr<int32_t>()) + r0 * row_bytes;
  const float* s = sb.data();
  const float* b = sb.data() + n * ng;
  if (isa == Isa::kAvx512)
    (bits == 8 ? dequant_rows512<8> : dequant_rows512<4>)(w, row_bytes, s, b, n, in, gs, dst);
  else
    (bits == 8 ? dequant_rows256<8> : dequant_rows256<4>)(w, row_bytes, s, b, n, in, gs, dst);
  return true;
#else
  (void)qw, (void)scales, (void)biases, (void)r0, (void)n, (void)dst;
  return false;
#endif
}

}  // namespace hearth::nn::simd
