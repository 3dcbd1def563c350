// Programmatic dependent launch (PDL, Hopper and later; CUDA programming guide, "Programmatic
// Dependent Launch and Synchronization") for the decode path's kernels: a kernel launched through
// launch_kernel may start while the kernel before it on the stream is still running, so its
// prologue (a GEMV's first weight loads, a norm's weight) and its launch overlap that kernel's tail;
// pdl_wait() then blocks until that kernel has completed and its writes are visible. Inside a CUDA
// graph the captured edges keep the same meaning, so a replayed decode step runs its ~150 small
// kernels with the launch gaps hidden.
//
// Rules for a kernel launched with launch_kernel (each kernel of kernels/ that uses it follows them):
//  - every block calls pdl_wait() before it reads anything an earlier kernel of the stream wrote and
//    before it writes any global memory (a write-after-read on a reused buffer is a dependency too);
//    only constants (weights, scales) may be read before it;
//  - it may call pdl_launch_dependents() at any point (here: at the start): the next kernel may then
//    launch once every block of this one has called it or exited. The next kernel still waits for
//    this one's completion in its own pdl_wait(), so completion stays transitive along the stream.
// A kernel launched without the attribute (any other launch) runs both calls as no-ops, and a PDL
// kernel after a kernel that never calls pdl_launch_dependents (cuBLAS, ATen) simply starts when that
// one ends. Off below sm_90 and with HEARTH_PDL=0 at start-up (plain stream order).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

namespace hearth::kernels {

/// Blocks the calling thread until every kernel this grid depends on (the previous kernel on the
/// stream) has completed and its memory is visible. A no-op without a programmatic dependency.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Lets the next kernel on the stream launch (early) once every block of this grid has called this or
/// exited. A no-op without a programmatic dependent.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/// Whether launch_kernel asks for programmatic dependent launch: the current device's compute
/// capability is 9.0 or more and HEARTH_PDL is not "0" (read once per process, on the first launch).
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("HEARTH_PDL");
    if (env && env[0] == '0') return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

/// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization when
/// pdl_enabled(). The kernel must follow the rules above. Returns the launch's error code.
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (pdl_enabled()) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace hearth::kernels
