// BoundaryStore: the segment-edge boundaries a segmented backward keeps between its forward and its
// backward, held on the device as given or offloaded to host memory (pinned on CUDA) and brought
// back one segment ahead of use. Not the backward schedule itself (train/segmented.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "models/boundary.h"

namespace hearth::train {

/// How a BoundaryStore keeps what it is given.
struct BoundaryStoreOptions {
  /// false: every field stays as given (on its device). true: every floating field of an edge is
  /// copied to host memory (pinned when on CUDA, on a side stream: put() does not wait for it);
  /// integer fields stay as given.
  bool offload = false;
  /// With offload: host bytes the store may hold (0 = no limit). An edge whose floating fields
  /// would take the host copies past the limit is kept on the device instead, whole.
  int64_t host_limit_bytes = 0;
  /// A host copy is made of pieces of at most this many bytes (PyTorch's pinned-memory allocator
  /// rounds every allocation up to a power of two; pieces of 2^k bytes waste nothing but the last).
  int64_t piece_bytes = int64_t{256} << 20;
};

/// The edges of a segmented backward, numbered in put() order. A field (hidden or a stream) whose
/// tensor is the same as a field of the previous edge (a stream passed through a segment unchanged:
/// same storage, offset, sizes, strides and dtype) shares that field's host copy, so it is copied,
/// brought back and counted once. Not thread-safe: one thread, the one that runs the model.
/// On CUDA: a host copy is written on a side stream after an event on the current stream, the
/// source tensor is record_stream()ed on the side stream (the caching allocator never reuses its
/// memory while the copy is in flight); prefetch() allocates on the current stream and copies back
/// on the side stream after an event on the current stream; take() makes the current stream wait
/// for that copy. Nothing here synchronizes the host with the device.
class BoundaryStore {
 public:
  explicit BoundaryStore(BoundaryStoreOptions opts = {});
  ~BoundaryStore();
  BoundaryStore(const BoundaryStore&) = delete;
  BoundaryStore& operator=(const BoundaryStore&) = delete;

  /// Appends `b` as edge size(). `previous`: the boundary given to the last put(), still alive
  /// (held by the caller), whose fields are compared with b's by identity (nullptr: no sharing).
  /// Throws hearth::Error (one line naming --offload-boundaries and the bytes asked for) when host
  /// memory cannot be allocated, and when `previous` cannot be the last put()'s boundary.
  void put(const models::Boundary& b, const models::Boundary* previous = nullptr);
  /// Starts bringing edge `i` back to its device (no-op for an edge kept on the device or already
  /// prefetched). Throws hearth::Error for an edge already taken or out of range.
  void prefetch(size_t i);
  /// Edge `i` on its device, ready to use on the current stream (prefetches it first if needed);
  /// the store drops it (host copies no other edge shares are freed). Each edge is taken once.
  /// Throws hearth::Error for an edge already taken or out of range.
  models::Boundary take(size_t i);

  size_t size() const;
  /// Bytes of stored fields on the device now / at most so far (kept fields and those brought
  /// back, a storage counted once).
  int64_t device_bytes() const;
  int64_t peak_device_bytes() const;
  /// Bytes of host copies now / at most so far (as asked for: the pieces' rounding not counted).
  int64_t host_bytes() const;
  int64_t peak_host_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hearth::train
