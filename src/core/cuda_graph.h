// A recorded GPU step: on a CUDA build with a CUDA device, a CUDA graph (at::cuda::CUDAGraph)
// captured from a function once and replayed; elsewhere (CPU, CPU-only libtorch) the function
// itself, called again on each replay — the same results, so the code around it is tested on CPU.
// Not the decode logic that uses it (generate/graph_decode.h).
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>

namespace hearth::compat {

/// A memory pool that several RecordedSteps capture into (at::cuda::graph_pool_handle), so that
/// graphs which are replayed one at a time, never concurrently, share their temporaries: the pool
/// grows to the largest step's, not the sum of all (vLLM shares one pool across its batch-size
/// graphs). Safe only when a step's results are read from buffers allocated outside the capture
/// (or before another step of the pool replays). Empty on CPU and CPU-only builds. Must outlive
/// the steps that use it.
class GraphPool {
 public:
  GraphPool();
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;

 private:
  friend class RecordedStep;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class RecordedStep {
 public:
  /// Records `fn` for `device`: on CUDA, `warmup` eager calls on a side stream (cuBLAS and the
  /// caching allocator settle) then one capture; `fn` must then only touch tensors whose storage
  /// outlives this object, do no host synchronisation and allocate the same way every call. On CPU,
  /// nothing runs until replay(). With `pool`, the capture allocates from that shared pool (see
  /// GraphPool) instead of a pool of its own. Throws hearth::Error when the capture fails (e.g. a
  /// host sync).
  RecordedStep(std::function<void()> fn, const at::Device& device, int warmup = 2, GraphPool* pool = nullptr);
  ~RecordedStep();
  RecordedStep(const RecordedStep&) = delete;
  RecordedStep& operator=(const RecordedStep&) = delete;

  /// Runs the step again (graph replay on CUDA: queued on the current stream, returns at once).
  void replay();
  /// True when replay() is a CUDA graph (false: the function is called eagerly).
  bool captured() const;

 private:
  struct Impl;
  std::function<void()> fn_;
  std::unique_ptr<Impl> impl_;
};

/// A small device tensor read to the host without waiting for later work on the stream: start()
/// queues a copy into pinned host memory on the current stream (and records an event after it),
/// wait() blocks until that copy is done and returns the host tensor — so a decode loop can queue
/// its next step between the two and keep the GPU busy while it streams the token (the issue-11
/// pipelining). On the CPU, start() copies at once and wait() returns it. The returned tensor is
/// overwritten by the next start().
class HostReadback {
 public:
  HostReadback();
  ~HostReadback();
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;
  /// Queues the copy of `src` (any device, any shape; the host buffer follows its shape and dtype).
  void start(const at::Tensor& src);
  /// Waits for the copy queued by the last start() and returns it (a CPU tensor). Throws
  /// hearth::Error without a start().
  const at::Tensor& wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hearth::compat
