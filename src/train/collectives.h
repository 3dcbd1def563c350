// The one file that speaks torch.distributed's c10d (and so the one place its version differences
// live: Debian's libtorch 1.13 with Gloo, PyTorch 2.x with Gloo and NCCL): a TCPStore rendezvous,
// a Gloo or NCCL process group behind a small interface, and a store a launcher can host.
// Not the data-parallel training logic (distributed.h) or the process launcher (cli/launch.h).
#pragma once
#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hearth::train {

/// Where and how one rank joins a job (the torchrun variables, see distributed.h).
struct RendezvousSpec {
  int64_t rank = 0, world_size = 1;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;
  /// The store is hosted by the launcher (torchrun's TORCHELASTIC_USE_AGENT_STORE, or `hearth
  /// train --nproc-per-node`): rank 0 connects as a client instead of serving it.
  bool agent_store = false;
  int64_t restart_count = 0;                // namespaces the store's keys per launcher attempt
  std::chrono::milliseconds timeout{1800000};  // store connect and every collective
};

/// A collective in flight (Collectives::all_reduce_sum_async). Destroying one that was not waited
/// for leaves the collective to finish on its own (its tensors stay alive until it does).
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  /// Blocks until the collective is done on this rank; the tensors it was given then hold the
  /// result. Throws hearth::Error (naming the backend) when a peer is gone or the timeout passes.
  /// A second call returns at once.
  virtual void wait() = 0;
};

/// The collectives data-parallel training needs, on one process group of world_size ranks.
/// Every blocking call returns when done on this rank and throws hearth::Error (naming the
/// backend) when a peer is gone or the timeout passes. Every rank must issue the same collectives
/// (same kinds, tensor sizes and dtypes) in the same order, blocking and asynchronous alike.
class Collectives {
 public:
  virtual ~Collectives() = default;
  /// "gloo" | "nccl".
  virtual std::string backend() const = 0;
  /// Where tensors given to the collectives must live (CPU for Gloo, the rank's GPU for NCCL).
  virtual at::Device device() const = 0;
  /// Sums each tensor over the ranks, in place (all issued, then all waited for). Contiguous
  /// tensors on device().
  virtual void all_reduce_sum(std::vector<at::Tensor>& tensors) = 0;
  /// all_reduce_sum started and not waited for: returns at once (c10d: the backend's own threads
  /// or streams run it; Gloo has 2 worker threads per group) while this thread keeps computing.
  /// The tensors must not be read or written until the handle's wait() returns. This default
  /// runs all_reduce_sum before returning (for a group with nothing asynchronous, e.g. a fake).
  virtual std::unique_ptr<CollectiveWork> all_reduce_sum_async(std::vector<at::Tensor>& tensors);
  /// Replaces each tensor by rank `root`'s, in place. Contiguous tensors on device().
  virtual void broadcast(std::vector<at::Tensor>& tensors, int64_t root) = 0;
};

/// Which backends this build has: Gloo when the c10d Gloo header and gloo's headers were found
/// at build time (Debian: libtorch-dev + libgloo-dev), NCCL on a CUDA build with nccl.h.
bool gloo_built();
bool nccl_built();

/// Joins the job: connects to (or, rank 0 without agent_store, serves) the TCPStore at
/// master_addr:master_port, then makes the process group. backend "gloo" | "nccl"; `device` is
/// this rank's device (NCCL: its GPU). Gloo's transport uses GLOO_SOCKET_IFNAME when set, the
/// loopback for a loopback master_addr, else the host's name. Throws hearth::Error naming the
/// backend for one this build lacks, and naming master_addr:port when the rendezvous fails or
/// times out.
std::unique_ptr<Collectives> connect_collectives(const RendezvousSpec& spec, const std::string& backend,
                                                 const at::Device& device);

/// A TCPStore server on a free port of this host (for a launcher whose workers connect with
/// agent_store set). Lives as long as the object.
class StoreServer {
 public:
  /// Binds port 0 (the kernel picks a free one). Throws hearth::Error when it cannot listen.
  static std::unique_ptr<StoreServer> start(std::chrono::milliseconds timeout);
  virtual ~StoreServer() = default;
  virtual int64_t port() const = 0;
};

}  // namespace hearth::train
