// RecordedStep: CUDA graph capture/replay where CUDA is built and present, eager calls elsewhere.
#include "core/cuda_graph.h"

#include "core/env.h"
#include "core/error.h"
#include "core/graph_profile.h"

#include <atomic>
#include <iostream>

#ifdef HEARTH_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace hearth::compat {

struct GraphPool::Impl {
#ifdef HEARTH_WITH_CUDA
  decltype(at::cuda::graph_pool_handle()) id{0, 0};
  bool made = false;  // the handle is taken at the first capture (it needs a CUDA device)
#endif
};

GraphPool::GraphPool() : impl_(std::make_unique<Impl>()) {}
GraphPool::~GraphPool() = default;

struct RecordedStep::Impl {
#ifdef HEARTH_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

RecordedStep::RecordedStep(std::function<void()> fn, const at::Device& device, int warmup, GraphPool* pool)
    : fn_(std::move(fn)), impl_(std::make_unique<Impl>()) {
#ifdef HEARTH_WITH_CUDA
  if (!device.is_cuda()) return;
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < warmup; ++i) fn_();
    side.synchronize();
    // Hand the warm-up's cached blocks back: a capture that needs memory while the cache holds it
    // would have to free cached blocks mid-capture, which CUDA refuses.
    if (pool) c10::cuda::CUDACachingAllocator::emptyCache();
    // HEARTH_GRAPH_PROFILE=1: the first graph this process captures is kept as a graph too and
    // profiled node by node (graph_profile.h), the table on stderr — a bench-time tool.
    static std::atomic<bool> profiled{false};
    const bool profile = env_equals("HEARTH_GRAPH_PROFILE", "1") && !profiled.exchange(true);
    impl_->graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/profile);
    try {
      if (pool) {
        if (!pool->impl_->made) {
          pool->impl_->id = at::cuda::graph_pool_handle();
          pool->impl_->made = true;
        }
        impl_->graph->capture_begin(pool->impl_->id);
      } else {
        impl_->graph->capture_begin();
      }
      fn_();
      impl_->graph->capture_end();
      if (profile) {
        impl_->graph->instantiate();
        try {
          std::cerr << format_graph_profile(profile_graph(impl_->graph->raw_cuda_graph(), side.stream(), 20)) << std::flush;
        } catch (const Error& e) {
          std::cerr << "hearth: " << e.what() << " (the step runs unprofiled)\n";
        }
      }
    } catch (const std::exception& e) {
      // End the capture before dropping the graph: a stream left capturing makes every later CUDA
      // call of the process fail ("operation not permitted when stream is capturing").
      try {
        impl_->graph->capture_end();
      } catch (const std::exception&) {
      }
      (void)cudaGetLastError();
      impl_->graph.reset();
      throw Error(std::string("CUDA graph capture failed: ") + e.what());
    }
  }
  c10::cuda::device_synchronize();
#else
  (void)device;
  (void)warmup;
  (void)pool;
#endif
}

RecordedStep::~RecordedStep() = default;

void RecordedStep::replay() {
#ifdef HEARTH_WITH_CUDA
  if (impl_->graph) {
    impl_->graph->replay();
    return;
  }
#endif
  fn_();
}

bool RecordedStep::captured() const {
#ifdef HEARTH_WITH_CUDA
  return impl_->graph != nullptr;
#else
  return false;
#endif
}

struct HostReadback::Impl {
  at::Tensor host;  // undefined until the first start()
#ifdef HEARTH_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> done;  // recorded after the copy when the source is on a GPU
#endif
};

HostReadback::HostReadback() : impl_(std::make_unique<Impl>()) {}
HostReadback::~HostReadback() = default;

void HostReadback::start(const at::Tensor& src) {
  Impl& m = *impl_;
#ifdef HEARTH_WITH_CUDA
  if (src.is_cuda()) {
    if (!m.host.defined() || m.host.sizes() != src.sizes() || m.host.scalar_type() != src.scalar_type())
      m.host = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(true));
    m.host.copy_(src, /*non_blocking=*/true);
    if (!m.done) m.done = std::make_unique<at::cuda::CUDAEvent>();
    m.done->record(c10::cuda::getCurrentCUDAStream(src.device().index()));
    return;
  }
  m.done.reset();
#endif
  m.host = src.to(at::kCPU).clone();
}

const at::Tensor& HostReadback::wait() {
  Impl& m = *impl_;
  HEARTH_CHECK(m.host.defined(), "HostReadback::wait without a start()");
#ifdef HEARTH_WITH_CUDA
  if (m.done) m.done->synchronize();
#endif
  return m.host;
}

}  // namespace hearth::compat
