// The CPU fp32 GEMM of prefill-sized linears: oneDNN's sgemm (found in the process at run time:
// libtorch links oneDNN) called single-threaded on column blocks spread over ATen's own thread
// pool, so one pool does all the work. Not the quantized kernels (nn/quant*.h) and not GPU code.
//
// Why: libtorch's at::linear on the CPU goes to BLAS; with Debian's libtorch that is OpenBLAS,
// whose own pthread pool spins beside ATen's OpenMP pool (4 busy threads on 2 cores) and whose
// kernel choice on AMD Zen 4/5 is the AVX2 "Haswell" one. docs/benchmarks.md (CPU) has the numbers.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace hearth::nn::cpu {

/// Whether the fast GEMM is in use: oneDNN's `dnnl_sgemm` is in the process (looked up once with
/// dlsym), it is not switched off by HEARTH_CPU_GEMM=aten or set_fast_gemm(false), and the calling
/// thread holds no ReferenceKernelsScope. Throws
/// hearth::Error naming HEARTH_CPU_GEMM when it holds another value than "aten", "fast" or "".
bool fast_gemm_enabled();

/// RAII: the calling thread runs the reference CPU paths (at::linear, the eager attention, the tiled
/// quantized matmul) while the scope lives, whatever fast_gemm_enabled() says elsewhere. Training's
/// backward holds one, so that a forward without a graph (segment boundaries) rounds exactly like its
/// recomputation with one (autograd always takes the reference path). Scopes nest.
class ReferenceKernelsScope {
 public:
  ReferenceKernelsScope();
  ~ReferenceKernelsScope();
  ReferenceKernelsScope(const ReferenceKernelsScope&) = delete;
  ReferenceKernelsScope& operator=(const ReferenceKernelsScope&) = delete;

 private:
  bool saved_;
};

/// Switches the fast GEMM on or off (tests compare both paths); returns the previous setting.
/// Switching on has no effect where `dnnl_sgemm` is missing. Not thread-safe against running matmuls.
bool set_fast_gemm(bool on);

/// Single-threaded fp32 y[M, N] = alpha · x[M, K] · w[N, K]ᵀ, all row-major: x with row stride ldx, w with
/// row stride ldw, y with row stride ldy (so y may be a column block of a wider matrix).
/// Requires fast_gemm_enabled() (throws hearth::Error otherwise or when oneDNN reports an error).
/// `alpha` scales the product (applied once to each finished sum).
void sgemm_nt(int64_t M, int64_t N, int64_t K, const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
              int64_t ldy, float alpha = 1.0f);

/// As sgemm_nt with w not transposed: y[M, N] = x[M, K] · w[K, N] (w row stride ldw).
void sgemm_nn(int64_t M, int64_t N, int64_t K, const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
              int64_t ldy, float alpha = 1.0f);

/// Runs fn(n0, n1) over column blocks [n0, n1) covering [0, N) on ATen's intra-op threads (one
/// contiguous block per thread, each at least `min_block` wide; block edges on multiples of 16).
/// fn runs inside the parallel region: what it calls must not start its own threads (sgemm_nt does not).
void for_column_blocks(int64_t N, int64_t min_block, const std::function<void(int64_t, int64_t)>& fn);

/// x [..., K] · w[N, K]ᵀ → [..., N] through sgemm_nt over column blocks (calls of at most 256
/// columns) when it applies: both on the CPU in fp32, w contiguous, nothing for autograd to record,
/// fast_gemm_enabled() and at least `kMinRows` rows of x. Returns an undefined tensor when it does not apply (the caller then runs
/// at::linear). Sums in another order than BLAS: equal to at::linear within fp32 rounding.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w);

/// Fewest rows of x for which linear() takes over: every size (a decode step's M = 1 included:
/// OpenBLAS's product of one row runs at a fifth of the speed, docs/benchmarks.md).
constexpr int64_t kMinRows = 1;

}  // namespace hearth::nn::cpu
