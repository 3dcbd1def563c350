// RecordedStep: CUDA graph capture/replay where CUDA is built and present, eager calls elsewhere.
#include "core/cuda_graph.h"

#include "core/error.h"

#ifdef HEARTH_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace hearth::compat {

struct RecordedStep::Impl {
#ifdef HEARTH_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

RecordedStep::RecordedStep(std::function<void()> fn, const at::Device& device, int warmup)
    : fn_(std::move(fn)), impl_(std::make_unique<Impl>()) {
#ifdef HEARTH_WITH_CUDA
  if (!device.is_cuda()) return;
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < warmup; ++i) fn_();
    side.synchronize();
    impl_->graph = std::make_unique<at::cuda::CUDAGraph>();
    try {
      impl_->graph->capture_begin();
      fn_();
      impl_->graph->capture_end();
    } catch (const std::exception& e) {
      impl_->graph.reset();
      throw Error(std::string("CUDA graph capture failed: ") + e.what());
    }
  }
  c10::cuda::device_synchronize();
#else
  (void)device;
  (void)warmup;
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

}  // namespace hearth::compat
