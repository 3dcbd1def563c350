// Version- and device-dependent helpers behind torch_compat.h.
#include "core/torch_compat.h"

#include <atomic>

#include "core/env.h"
#include "core/error.h"

#include <c10/core/GradMode.h>

#include <malloc.h>

#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#ifdef HEARTH_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <filesystem>

// Kineto's C++ entry points (torch/csrc/autograd/profiler_kineto.h) as PyTorch 2.x declares them.
#if defined(HEARTH_WITH_CUDA) && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))
#define HEARTH_KINETO_TRACE 1
#include <torch/csrc/autograd/profiler_kineto.h>
#else
#define HEARTH_KINETO_TRACE 0
#endif

namespace hearth::compat {

namespace {
int64_t proc_status_kb(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream is(line.substr(key.size() + 1));
      int64_t kb = 0;
      is >> kb;
      return kb * 1024;
    }
  }
  return 0;
}
}  // namespace

bool cuda_available() {
#ifdef HEARTH_WITH_CUDA
  return c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

#ifdef HEARTH_WITH_CUDA
namespace {
#if TORCH_VERSION_MAJOR >= 2 && TORCH_VERSION_MINOR >= 4 || TORCH_VERSION_MAJOR >= 3
using DeviceStats = c10::CachingDeviceAllocator::DeviceStats;
#else
using DeviceStats = c10::cuda::CUDACachingAllocator::DeviceStats;
#endif
DeviceStats cuda_stats(const at::Device& d) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(d.index() < 0 ? 0 : d.index());
}
}  // namespace
#endif

int64_t peak_memory_bytes(const at::Device& device) {
#ifdef HEARTH_WITH_CUDA
  if (device.is_cuda()) return cuda_stats(device).allocated_bytes[0].peak;
#endif
  return proc_status_kb("VmHWM:");
}

void reset_peak_memory(const at::Device& device) {
#ifdef HEARTH_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
#endif
}

int64_t active_memory_bytes(const at::Device& device) {
#ifdef HEARTH_WITH_CUDA
  if (device.is_cuda()) return cuda_stats(device).allocated_bytes[0].current;
#endif
  // CPU tensors come from malloc: bytes in use there (small blocks + mmapped large ones), which,
  // unlike RSS, does not count memory malloc keeps cached after a free.
  const struct mallinfo2 mi = ::mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

bool fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList steps, double lr, double beta1, double beta2, double weight_decay, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, at::TensorList(), steps, lr, beta1, beta2, weight_decay, eps,
                    /*amsgrad=*/false, /*maximize=*/false);
  return true;
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps;
  (void)lr, (void)beta1, (void)beta2, (void)weight_decay, (void)eps;
  return false;
#endif
}

void synchronize(const at::Device& device) {
#ifdef HEARTH_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

namespace {
std::atomic<bool>& sdpa_cudnn_flag() {
  static std::atomic<bool> on{env_equals("HEARTH_SDPA_CUDNN", "1")};
  return on;
}
}  // namespace

bool sdpa_cudnn_for_inference() { return sdpa_cudnn_flag().load(std::memory_order_relaxed); }
bool set_sdpa_cudnn_for_inference(bool on) { return sdpa_cudnn_flag().exchange(on); }

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& mask,
                bool is_causal, double scale, bool enable_gqa, bool keep_cudnn) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  // cuDNN's SDPA backend builds an execution plan the first time it meets a shape: 40-760 ms on the
  // H200 with PyTorch 2.11 (bench/sdpa_first_call.py), against 0.03-0.13 ms for the call itself, and
  // a server's prefill meets new (rows, prompt length) shapes all the time. So a call that records
  // no autograd (inference) leaves cuDNN out and SDPA picks flash / memory-efficient attention;
  // training keeps PyTorch's choice, and HEARTH_SDPA_CUDNN=1 gives inference it too. The switch is
  // the process-wide one, set and restored around the call (one engine thread runs inference).
  const bool cudnn_for_inference = keep_cudnn || sdpa_cudnn_for_inference();
  const bool recording = c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  struct CudnnOff {
    const bool on;
    explicit CudnnOff(bool o) : on(o) {
      if (on) at::globalContext().setSDPUseCuDNN(false);
    }
    ~CudnnOff() {
      if (on) at::globalContext().setSDPUseCuDNN(true);
    }
  } const off(!recording && !cudnn_for_inference && at::globalContext().userEnabledCuDNNSDP());
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, is_causal, scale, enable_gqa);
#elif TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1
  (void)keep_cudnn;
  if (enable_gqa)
    throw hearth::Error("sdpa: this build's libtorch " TORCH_VERSION " has no enable_gqa (PyTorch >= 2.5)");
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, is_causal, scale);
#else
  (void)enable_gqa, (void)keep_cudnn;
  throw hearth::Error("sdpa: this build's libtorch " TORCH_VERSION " has no scaled_dot_product_attention");
#endif
}

at::Tensor flash_causal_lower_right(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  const at::ScalarType st = q.scalar_type();
  const int64_t T = q.size(2), S = k.size(2), D = q.size(3);
  if (!q.is_cuda() || (st != at::kBFloat16 && st != at::kHalf) || k.scalar_type() != st || v.scalar_type() != st ||
      D > 256 || D % 8 != 0 || T > S || q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1)
    return {};
  // [B, T, H, D] views: flash's layout. is_causal with T < S is its lower-right alignment.
  auto out = at::_flash_attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), c10::nullopt,
                                          c10::nullopt, T, S, 0.0, /*is_causal=*/true, /*return_debug_mask=*/false,
                                          scale);
  return std::get<0>(out).transpose(1, 2);
#else
  (void)q, (void)k, (void)v, (void)scale;
  return {};
#endif
}

bool trace_with_kernels(const std::string& path, const std::function<void()>& work) {
#if HEARTH_KINETO_TRACE
  if (!cuda_available()) return false;
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  try {
    work();
  } catch (...) {
    prof::disableProfiler();
    throw;
  }
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  const std::string tmp = path + ".tmp";
  result->save(tmp);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  HEARTH_CHECK(!ec, path, ": the trace could not be written (", ec.message(), ")");
  return true;
#else
  (void)path, (void)work;
  return false;
#endif
}

std::string torch_version() { return TORCH_VERSION; }

}  // namespace hearth::compat
