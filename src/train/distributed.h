// Data-parallel training over torch.distributed (collectives.h): the torchrun environment, each
// rank's share of a global batch, and the gradient all-reduce (bucketed, token-weighted by the
// caller's scale, blocking or started as the backward goes) that makes N ranks step exactly as one
// process over the global batch. Follows PyTorch's DistributedDataParallel (25 MB buckets,
// parameters broadcast from rank 0 at start, reduction overlapped with the backward).
// Not the process launcher (cli/launch.h) or the training loop (trainer.h).
#pragma once
#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "train/collectives.h"
#include "train/dataset.h"

namespace hearth::train {

/// The torchrun variables of one worker (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
/// plus torchrun's TORCHELASTIC_USE_AGENT_STORE and TORCHELASTIC_RESTART_COUNT).
struct DistEnv {
  int64_t rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr;
  int64_t master_port = 0;
  bool agent_store = false;
  int64_t restart_count = 0;
};

/// Reads the torchrun variables through `get` (getenv by default). None of RANK / WORLD_SIZE set:
/// std::nullopt (a plain single process). Otherwise all of RANK, WORLD_SIZE, MASTER_ADDR and
/// MASTER_PORT must be set; LOCAL_RANK defaults to RANK. Throws hearth::Error naming the variable
/// and its value for a missing one, a non-integer, WORLD_SIZE < 1, RANK outside [0, WORLD_SIZE),
/// LOCAL_RANK < 0 or MASTER_PORT outside 1-65535.
std::optional<DistEnv> dist_env_from(const std::function<const char*(const char*)>& get = {});

/// Checks that the global --batch-size divides evenly among `world_size` ranks; throws
/// hearth::Error naming both numbers otherwise.
void check_global_batch(int64_t batch_size, int64_t world_size);

/// check_global_batch; every method (sft, dpo, orpo) runs data-parallel (ORPO's NLL term divides
/// by the global batch's token count, see PreferenceOptions::nll_count). Kept per method so a
/// method that cannot split is refused here, before any worker starts.
void check_data_parallel(int64_t batch_size, const std::string& method, int64_t world_size);

/// "auto" → "nccl" on a CUDA device, else "gloo"; "gloo" / "nccl" pass; throws naming --backend otherwise.
std::string resolve_backend(const std::string& backend, const at::Device& device);

/// A gradient all-reduce in flight (DataParallel::all_reduce_grads_async).
class PendingGradReduce {
 public:
  virtual ~PendingGradReduce() = default;
  /// Blocks until the sums are in, then writes them into the parameters' .grad as
  /// all_reduce_grads would (undefined on every rank: stays undefined; on some: zeros + the sum).
  /// Throws as Collectives (hearth::Error naming the backend). A second call does nothing.
  virtual void wait() = 0;
};

/// One rank's view of a data-parallel job.
class DataParallel {
 public:
  /// Wraps collectives already joined as `rank` of `world_size`.
  DataParallel(std::unique_ptr<Collectives> comm, int64_t rank, int64_t world_size);
  /// Joins the job described by `env` with `backend` ("gloo" | "nccl"; see resolve_backend) for
  /// a model on `device`; every rendezvous and collective times out after `timeout`. Throws as
  /// connect_collectives.
  static std::shared_ptr<DataParallel> join(const DistEnv& env, const std::string& backend, const at::Device& device,
                                            std::chrono::milliseconds timeout);

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_; }
  /// Rank 0 writes the adapter, checkpoints and metrics; the others write nothing.
  bool is_writer() const { return rank_ == 0; }

  /// This rank's items of a global batch `idx` (its size a multiple of world_size): every
  /// world_size-th item starting at rank (strided, so the length-sorted windows split evenly).
  std::vector<int64_t> share(const std::vector<int64_t>& idx) const;
  /// The next global batch of `b` (over `data`), cut to this rank's share.
  Batch next_share(Batcher& b, const Dataset& data) const;

  /// Σ over the ranks (fp64; exact for integers below 2^53).
  double sum(double v);
  int64_t sum(int64_t v);
  /// Whether `flag` is true on any rank (e.g. a stop request, so all ranks stop at the same step).
  bool any(bool flag);

  /// Sums the .grad of `params` over the ranks in place (the caller scaled each rank's loss by the
  /// global normalizer, e.g. 1 / global target tokens, so the sum is the one-process gradient).
  /// Gradients are flattened into buckets of about `bucket_bytes` per dtype (fp16/bf16 reduced in
  /// fp32) on the collectives' device, all issued, then copied back. A parameter whose .grad is
  /// undefined on every rank stays undefined (the optimizer skips it, as one process would); one
  /// defined on some ranks only gets zeros where it was undefined before the sum.
  void all_reduce_grads(const std::vector<at::Tensor>& params, int64_t bucket_bytes = 25 << 20);
  /// all_reduce_grads started and not waited for: flattens the gradients into buckets now and
  /// returns while the backend sums them (Gloo's worker threads, NCCL's stream), so this thread
  /// can keep computing. The .grad of `params` must be final and untouched until the handle's
  /// wait(), which writes the sums back. It skips all_reduce_grads' blocking first round (which
  /// gradients exist anywhere): a gradient undefined on this rank travels as zeros, beside a
  /// defined-flag per parameter reduced asynchronously too, so the collectives issued (one flags
  /// vector, then the buckets per dtype, by the parameters' dtype) depend only on the parameters'
  /// shapes and dtypes, the same on every rank. Empty `params`: issues nothing.
  std::unique_ptr<PendingGradReduce> all_reduce_grads_async(const std::vector<at::Tensor>& params,
                                                            int64_t bucket_bytes = 25 << 20);
  /// Copies rank 0's values of `tensors` into every rank's (no grad; bucketed as above).
  void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes = 25 << 20);

 private:
  std::unique_ptr<Collectives> comm_;
  int64_t rank_, world_;
};

/// One optimizer step's gradient all-reduce over `params` (every tensor the optimizer steps),
/// started in pieces as the backward makes gradients final and finished before the optimizer:
/// PyTorch DDP's overlap of communication with the backward of earlier layers. The trainer starts
/// each backward segment's parameters on the last micro-batch of a step (BackwardOptions::
/// on_segment_grads); the rest (embedding, head, and everything when nothing was started) is
/// reduced by finish(). Every rank must start the same pieces in the same order (the trainer's
/// segment plan is the same on every rank).
class StepGradReduce {
 public:
  /// `dp` must outlive this object.
  StepGradReduce(DataParallel& dp, std::vector<at::Tensor> params, int64_t bucket_bytes = 25 << 20);
  /// Starts all_reduce_grads_async of those of `ready` that are among the params and not started
  /// since the last finish() (others are ignored); returns at once. Their .grad must be final for
  /// the step and stay untouched until finish().
  void start(const std::vector<at::Tensor>& ready);
  /// all_reduce_grads of the params not started, then waits for the started ones and writes their
  /// sums: every param's .grad is then what all_reduce_grads(params) alone would leave (the same
  /// elementwise sums: bit-for-bit with 2 ranks, where a sum is one addition; with more, a
  /// backend's summation order may depend on an element's place in its bucket, so the last bit
  /// may differ). Ready for the next step. Throws as Collectives.
  void finish();
  /// Parameters started since the last finish().
  int64_t started() const { return n_started_; }

 private:
  DataParallel& dp_;
  std::vector<at::Tensor> params_;
  int64_t bucket_bytes_;
  std::unordered_map<const void*, size_t> index_;  // a param's TensorImpl → its place in params_
  std::vector<bool> started_;
  int64_t n_started_ = 0;
  std::vector<std::unique_ptr<PendingGradReduce>> pending_;
};

}  // namespace hearth::train
