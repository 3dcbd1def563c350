// How much memory a device has free for caches: the CUDA driver's free bytes on a GPU, the
// kernel's MemAvailable on the CPU. Not allocator statistics (torch_compat.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace hearth::compat {

/// Bytes free on `device` now: cudaMemGetInfo's free bytes on CUDA builds with a CUDA device;
/// /proc/meminfo MemAvailable on the CPU. 0 when unknown.
int64_t free_memory_bytes(const at::Device& device);

}  // namespace hearth::compat
