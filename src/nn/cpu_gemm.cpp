// CPU fp32 GEMM over column blocks: oneDNN's dnnl_sgemm, looked up with dlsym, one block per ATen
// thread. Not the quantized kernels (quant.cpp calls for_column_blocks/sgemm_nt for its prefill path).
#include "nn/cpu_gemm.h"

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace hearth::nn::cpu {

namespace {
// oneDNN's C API (dnnl.h), row-major: C = alpha · op(A) · op(B) + beta · C; returns dnnl_success (0).
using SgemmFn = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

SgemmFn find_sgemm() {
  static const SgemmFn fn = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "dnnl_sgemm"));
  return fn;
}

bool env_allows() {
  const char* v = std::getenv("HEARTH_CPU_GEMM");
  if (v == nullptr || *v == 0 || std::strcmp(v, "fast") == 0) return true;
  if (std::strcmp(v, "aten") == 0) return false;
  throw Error(cat("HEARTH_CPU_GEMM: '", v, "' is not one of aten, fast"));
}

std::atomic<bool>& switch_flag() {
  static std::atomic<bool> on{env_allows()};
  return on;
}
}  // namespace

thread_local bool t_reference = false;

ReferenceKernelsScope::ReferenceKernelsScope() : saved_(t_reference) { t_reference = true; }
ReferenceKernelsScope::~ReferenceKernelsScope() { t_reference = saved_; }

bool fast_gemm_enabled() {
  return !t_reference && switch_flag().load(std::memory_order_relaxed) && find_sgemm() != nullptr;
}

bool set_fast_gemm(bool on) { return switch_flag().exchange(on); }

namespace {
void sgemm(char transb, int64_t M, int64_t N, int64_t K, const float* x, int64_t ldx, const float* w, int64_t ldw,
           float* y, int64_t ldy, float alpha) {
  const SgemmFn fn = find_sgemm();
  HEARTH_CHECK(fn != nullptr, "cpu::sgemm: oneDNN's dnnl_sgemm is not in this process");
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m) std::fill(y + m * ldy, y + m * ldy + N, 0.0f);
    return;
  }
  const int st = fn('N', transb, M, N, K, alpha, x, ldx, w, ldw, 0.0f, y, ldy);
  HEARTH_CHECK(st == 0, "cpu::sgemm: dnnl_sgemm failed with status ", st, " (M ", M, ", N ", N, ", K ", K, ")");
}
}  // namespace

void sgemm_nt(int64_t M, int64_t N, int64_t K, const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
              int64_t ldy, float alpha) {
  sgemm('T', M, N, K, x, ldx, w, ldw, y, ldy, alpha);
}

void sgemm_nn(int64_t M, int64_t N, int64_t K, const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
              int64_t ldy, float alpha) {
  sgemm('N', M, N, K, x, ldx, w, ldw, y, ldy, alpha);
}

void for_column_blocks(int64_t N, int64_t min_block, const std::function<void(int64_t, int64_t)>& fn) {
  if (N <= 0) return;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N / std::max<int64_t>(min_block, 1)));
  if (threads == 1 || at::in_parallel_region()) {
    fn(0, N);
    return;
  }
  // One block per thread (ATen's OpenMP backend hands each thread one contiguous range), edges
  // rounded up to 16 columns.
  const int64_t per = (N + threads - 1) / threads;
  const int64_t block = std::min(N, (per + 15) / 16 * 16);
  const int64_t blocks = (N + block - 1) / block;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b * block, std::min(N, (b + 1) * block));
  });
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  if (!x.is_cpu() || !w.is_cpu() || x.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat) return {};
  if (w.dim() != 2 || !w.is_contiguous() || x.dim() < 1 || x.size(-1) != w.size(1)) return {};
  if (c10::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())) return {};
  const int64_t K = w.size(1), N = w.size(0);
  if (K == 0 || x.numel() / K < kMinRows || !fast_gemm_enabled()) return {};
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  at::Tensor y = at::empty({M, N}, x2.options());
  const float* xp = x2.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // At most kChunk columns per call: oneDNN packs the whole of w's block for a call, a waste for
  // few rows (M = 4 over a 32000-row head: 3.9 ms in chunks vs 10.6 ms whole); neutral for many.
  constexpr int64_t kChunk = 256;
  for_column_blocks(N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t c = n0; c < n1; c += kChunk) {
      const int64_t e = std::min(n1, c + kChunk);
      sgemm_nt(M, e - c, K, xp, K, wp + c * K, K, yp + c, N);
    }
  });
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

}  // namespace hearth::nn::cpu
