// free_memory_bytes: cudaMemGetInfo on CUDA, /proc/meminfo MemAvailable on the CPU.
#include "core/device_memory.h"

#include <fstream>
#include <sstream>
#include <string>

#ifdef HEARTH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace hearth::compat {

int64_t free_memory_bytes(const at::Device& device) {
#ifdef HEARTH_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return static_cast<int64_t>(free);
  }
#endif
  if (!device.is_cpu()) return 0;
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    int64_t kib = 0;
    in >> kib;
    return kib * 1024;
  }
  return 0;
}

}  // namespace hearth::compat
