// BoundaryStore (see boundary_store.h): host copies made of pieces, and on CUDA the side-stream
// copies with their events. Everything CUDA-specific is under HEARTH_WITH_CUDA; elsewhere an
// offloaded field is a plain copy into separate host tensors and back.
#include "train/boundary_store.h"

#include <algorithm>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

#ifdef HEARTH_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace hearth::train {

// Named, not anonymous: BoundaryStore::Impl (external linkage) holds these types (-Wsubobject-linkage).
namespace boundary_store_detail {

#ifdef HEARTH_WITH_CUDA
// A CUDA event without timing, made on `device` and destroyed with the object (a pending event is
// released by the driver once reached; a wait already enqueued on it stays valid).
class CudaEvent {
 public:
  explicit CudaEvent(c10::DeviceIndex device) : device_(device) {
    c10::cuda::CUDAGuard guard(device_);
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~CudaEvent() {
    c10::cuda::CUDAGuard guard(device_);
    (void)cudaEventDestroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(const c10::cuda::CUDAStream& s) {
    c10::cuda::CUDAGuard guard(device_);
    C10_CUDA_CHECK(cudaEventRecord(event_, s.stream()));
  }
  // Work enqueued on `s` after this call waits until the event is reached.
  void block(const c10::cuda::CUDAStream& s) const {
    c10::cuda::CUDAGuard guard(s.device_index());
    C10_CUDA_CHECK(cudaStreamWaitEvent(s.stream(), event_, 0));
  }

 private:
  c10::DeviceIndex device_;
  cudaEvent_t event_ = nullptr;
};

// `waiter` waits for the work enqueued on `producer` so far.
void wait_for(const c10::cuda::CUDAStream& producer, const c10::cuda::CUDAStream& waiter) {
  CudaEvent e(producer.device_index());
  e.record(producer);
  e.block(waiter);
}
#endif

// One host copy of a tensor (possibly the field of several edges): flat pieces, and the tensor
// brought back to the device once prefetched.
struct Slot {
  std::vector<at::Tensor> pieces;  // 1-D host tensors, in order
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  int64_t bytes = 0;
  at::Tensor restored;  // on `device`, shaped `sizes`, once prefetched
#ifdef HEARTH_WITH_CUDA
  std::unique_ptr<CudaEvent> arrived;  // recorded on the side stream after the copy back
#endif
};

// A field of an edge: kept as given, or a (shared) host copy.
struct Field {
  std::string name;  // "" = hidden
  at::Tensor kept;
  std::shared_ptr<Slot> slot;
};

struct Edge {
  std::vector<Field> fields;  // hidden first, then the streams in order
  bool prefetched = false, taken = false;
};

std::vector<std::pair<std::string, at::Tensor>> fields_of(const models::Boundary& b) {
  std::vector<std::pair<std::string, at::Tensor>> f{{"", b.hidden}};
  f.insert(f.end(), b.streams.begin(), b.streams.end());
  return f;
}

const void* storage_id(const at::Tensor& t) { return t.defined() ? t.storage().unsafeGetStorageImpl() : nullptr; }

bool same_tensor(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.scalar_type() == b.scalar_type();
}

}  // namespace boundary_store_detail

using namespace boundary_store_detail;

struct BoundaryStore::Impl {
  BoundaryStoreOptions opts;
  std::vector<Edge> edges;
  int64_t peak_device = 0, peak_host = 0;
  std::vector<const void*> last_put;  // storages of the last put()'s fields (compared, never dereferenced)
#ifdef HEARTH_WITH_CUDA
  std::map<int, c10::cuda::CUDAStream> side;  // one copy stream per device
  c10::cuda::CUDAStream side_stream(c10::DeviceIndex d) {
    auto it = side.find(d);
    if (it == side.end()) it = side.emplace(d, c10::cuda::getStreamFromPool(false, d)).first;
    return it->second;
  }
#endif

  int64_t device_bytes() const {
    std::set<const void*> seen;
    int64_t n = 0;
    for (const Edge& e : edges)
      for (const Field& f : e.fields) {
        const at::Tensor& t = f.slot ? f.slot->restored : f.kept;
        if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) n += t.nbytes();
      }
    return n;
  }
  int64_t host_bytes() const {
    std::set<const Slot*> seen;
    int64_t n = 0;
    for (const Edge& e : edges)
      for (const Field& f : e.fields)
        if (f.slot && seen.insert(f.slot.get()).second) n += f.slot->bytes;
    return n;
  }
  void update_peaks() {
    peak_device = std::max(peak_device, device_bytes());
    peak_host = std::max(peak_host, host_bytes());
  }

  at::Tensor alloc_host(int64_t n, at::ScalarType dtype, bool pin) {
    try {
      return at::empty({n}, at::TensorOptions().dtype(dtype).pinned_memory(pin));
    } catch (const std::exception&) {
      throw Error(cat("--offload-boundaries: could not allocate ", n * static_cast<int64_t>(c10::elementSize(dtype)),
                      " bytes of ", pin ? "pinned " : "", "host memory for a saved boundary (", host_bytes(),
                      " bytes already held); shorten the sequence, cap the host copies (--offload-host-limit) or drop "
                      "--offload-boundaries"));
    }
  }

  // A new host copy of `t` (the copy to the host is enqueued, not waited for).
  std::shared_ptr<Slot> offload(const at::Tensor& t) {
    auto slot = std::make_shared<Slot>();
    slot->sizes = t.sizes().vec();
    slot->dtype = t.scalar_type();
    slot->device = t.device();
    slot->bytes = t.numel() * static_cast<int64_t>(t.element_size());
    const at::Tensor flat = t.contiguous().reshape({-1});
    const int64_t per_piece = std::max<int64_t>(1, opts.piece_bytes / static_cast<int64_t>(t.element_size()));
    const bool pin = t.device().is_cuda();
    for (int64_t s = 0; s < flat.numel(); s += per_piece)
      slot->pieces.push_back(alloc_host(std::min(per_piece, flat.numel() - s), slot->dtype, pin));
#ifdef HEARTH_WITH_CUDA
    if (t.device().is_cuda()) {
      const c10::DeviceIndex d = t.device().index();
      const c10::cuda::CUDAStream side_s = side_stream(d);
      wait_for(c10::cuda::getCurrentCUDAStream(d), side_s);  // t (and flat) are written by then
      {
        c10::cuda::CUDAStreamGuard guard(side_s);
        int64_t s = 0;
        for (at::Tensor& p : slot->pieces) {
          p.copy_(flat.narrow(0, s, p.numel()), /*non_blocking=*/true);
          s += p.numel();
        }
      }
      flat.record_stream(side_s.unwrap());  // its memory is not reused before the copy is done
      return slot;
    }
#endif
    int64_t s = 0;
    for (at::Tensor& p : slot->pieces) {
      p.copy_(flat.narrow(0, s, p.numel()));
      s += p.numel();
    }
    return slot;
  }

  // Enqueues the copy of `slot` back to its device (no-op when already there).
  void restore(Slot& slot) {
    if (slot.restored.defined()) return;
    int64_t numel = 0;
    for (const at::Tensor& p : slot.pieces) numel += p.numel();
    // Allocated on the current stream: it is the one that will use (and free) it.
    at::Tensor dev = at::empty({numel}, at::TensorOptions().dtype(slot.dtype).device(slot.device));
#ifdef HEARTH_WITH_CUDA
    if (slot.device.is_cuda()) {
      const c10::DeviceIndex d = slot.device.index();
      const c10::cuda::CUDAStream side_s = side_stream(d);
      // The block may have been freed by work still queued on the current stream.
      wait_for(c10::cuda::getCurrentCUDAStream(d), side_s);
      {
        c10::cuda::CUDAStreamGuard guard(side_s);
        int64_t s = 0;
        for (const at::Tensor& p : slot.pieces) {
          dev.narrow(0, s, p.numel()).copy_(p, /*non_blocking=*/true);
          s += p.numel();
        }
      }
      dev.record_stream(side_s.unwrap());
      slot.arrived = std::make_unique<CudaEvent>(d);
      slot.arrived->record(side_s);
      slot.restored = dev.view(slot.sizes);
      return;
    }
#endif
    int64_t s = 0;
    for (const at::Tensor& p : slot.pieces) {
      dev.narrow(0, s, p.numel()).copy_(p);
      s += p.numel();
    }
    slot.restored = dev.view(slot.sizes);
  }

  Edge& edge(size_t i, const char* what) {
    HEARTH_CHECK(i < edges.size(), "BoundaryStore::", what, ": edge ", i, " of ", edges.size());
    HEARTH_CHECK(!edges[i].taken, "BoundaryStore::", what, ": edge ", i, " was already taken");
    return edges[i];
  }
};

BoundaryStore::BoundaryStore(BoundaryStoreOptions opts) : impl_(std::make_unique<Impl>()) {
  HEARTH_CHECK(opts.host_limit_bytes >= 0, "BoundaryStore: host_limit_bytes must be >= 0, got ", opts.host_limit_bytes);
  HEARTH_CHECK(opts.piece_bytes > 0, "BoundaryStore: piece_bytes must be > 0, got ", opts.piece_bytes);
  impl_->opts = opts;
}

BoundaryStore::~BoundaryStore() = default;

void BoundaryStore::put(const models::Boundary& b, const models::Boundary* previous) {
  Impl& m = *impl_;
  const auto given = fields_of(b);
  // A field that is the same tensor as one of `previous`'s (a stream passed through) shares its copy.
  std::vector<std::pair<std::string, at::Tensor>> before;
  if (previous) {
    before = fields_of(*previous);
    bool same = !m.edges.empty() && !m.edges.back().taken && m.last_put.size() == before.size();
    for (size_t j = 0; same && j < before.size(); ++j)
      same = storage_id(before[j].second) == m.last_put[j];
    HEARTH_CHECK(same, "BoundaryStore::put: `previous` is not the boundary given to the last put()");
  }
  auto shared_with_prev = [&](const at::Tensor& t) -> const Field* {
    for (size_t j = 0; j < before.size(); ++j)
      if (same_tensor(before[j].second, t)) return &m.edges.back().fields[j];
    return nullptr;
  };
  auto offloadable = [&](const at::Tensor& t) { return m.opts.offload && t.defined() && at::isFloatingType(t.scalar_type()); };
  bool keep_all = !m.opts.offload;
  if (!keep_all && m.opts.host_limit_bytes > 0) {
    int64_t fresh = 0;
    for (const auto& [name, t] : given)
      if (offloadable(t) && !shared_with_prev(t)) fresh += t.numel() * static_cast<int64_t>(t.element_size());
    keep_all = m.host_bytes() + fresh > m.opts.host_limit_bytes;
  }
  Edge e;
  for (const auto& [name, t] : given) {
    Field f{name, {}, nullptr};
    const Field* p = keep_all || !offloadable(t) ? nullptr : shared_with_prev(t);
    if (keep_all || !offloadable(t)) f.kept = t;
    else if (p && p->slot) f.slot = p->slot;
    else if (p) f.kept = p->kept;
    else f.slot = m.offload(t);
    e.fields.push_back(std::move(f));
  }
  m.edges.push_back(std::move(e));
  m.last_put.clear();
  for (const auto& [name, t] : given) m.last_put.push_back(storage_id(t));
  m.update_peaks();
}

void BoundaryStore::prefetch(size_t i) {
  Edge& e = impl_->edge(i, "prefetch");
  if (e.prefetched) return;
  for (Field& f : e.fields)
    if (f.slot) impl_->restore(*f.slot);
  e.prefetched = true;
  impl_->update_peaks();
}

models::Boundary BoundaryStore::take(size_t i) {
  prefetch(i);
  Edge& e = impl_->edge(i, "take");
  models::Boundary out;
  for (size_t j = 0; j < e.fields.size(); ++j) {
    const Field& f = e.fields[j];
    at::Tensor t = f.slot ? f.slot->restored : f.kept;
#ifdef HEARTH_WITH_CUDA
    if (f.slot && f.slot->arrived) f.slot->arrived->block(c10::cuda::getCurrentCUDAStream(f.slot->device.index()));
#endif
    if (j == 0) out.hidden = t;
    else out.streams.emplace_back(f.name, t);
  }
  e.fields.clear();
  e.taken = true;
  return out;
}

size_t BoundaryStore::size() const { return impl_->edges.size(); }
int64_t BoundaryStore::device_bytes() const { return impl_->device_bytes(); }
int64_t BoundaryStore::peak_device_bytes() const { return impl_->peak_device; }
int64_t BoundaryStore::host_bytes() const { return impl_->host_bytes(); }
int64_t BoundaryStore::peak_host_bytes() const { return impl_->peak_host; }

}  // namespace hearth::train
