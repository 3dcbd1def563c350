// Data-parallel training pieces (distributed.h): torchrun environment, batch shares, bucketed
// gradient all-reduce and the start-of-run parameter broadcast.
#include "train/distributed.h"

#include <c10/core/GradMode.h>

#include <cstdlib>
#include <limits>
#include <map>

#include "core/error.h"

namespace hearth::train {

namespace {

// The integer value of variable `name` = `v`; throws naming both when it is not one.
int64_t env_int(const char* name, const char* v) {
  const std::string s = v;
  size_t used = 0;
  int64_t out = 0;
  try {
    out = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HEARTH_CHECK(!s.empty() && used == s.size(), name, "='", s.substr(0, 40), "' is not an integer");
  return out;
}

// Tensors of one dtype flattened into buckets of about `bucket_bytes` each (in the wire dtype, on
// the collectives' device), and where each tensor's values sit in them.
struct Buckets {
  std::vector<at::Tensor> flat;                 // [n_k] per bucket
  std::vector<std::vector<size_t>> members;     // indices into the flattened list, per bucket
};

// Flattens `ts` (same dtype, each defined) into buckets of about `bucket_bytes` on `dev` in `dtype`.
Buckets flatten(const std::vector<at::Tensor>& ts, at::ScalarType dtype, const at::Device& dev, int64_t bucket_bytes) {
  Buckets b;
  std::vector<std::vector<size_t>> groups(1);
  const int64_t elem = static_cast<int64_t>(at::elementSize(dtype));
  int64_t bytes = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (bytes > 0 && bytes + ts[i].numel() * elem > bucket_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += ts[i].numel() * elem;
  }
  for (auto& g : groups) {
    if (g.empty()) continue;
    std::vector<at::Tensor> pieces;
    for (size_t i : g) pieces.push_back(ts[i].detach().reshape({-1}).to(dev, dtype));
    b.flat.push_back(at::cat(pieces).contiguous());
    b.members.push_back(std::move(g));
  }
  return b;
}

// Copies the buckets' values back: tensor i of the flattened list into dst(i) (skipped when that
// is undefined).
void unflatten(const Buckets& b, const std::vector<at::Tensor>& ts, const std::function<at::Tensor(size_t)>& dst) {
  c10::NoGradGuard no_grad;
  for (size_t k = 0; k < b.flat.size(); ++k) {
    int64_t off = 0;
    for (size_t i : b.members[k]) {
      const int64_t n = ts[i].numel();
      at::Tensor d = dst(i);
      if (d.defined()) d.copy_(b.flat[k].narrow(0, off, n).view(ts[i].sizes()));
      off += n;
    }
  }
}

// Flattens `ts` (same dtype) into buckets of about `bucket_bytes` on `dev` in `dtype`, runs `op`
// on all buckets at once, and copies the results back into `ts`.
void bucketed(const std::vector<at::Tensor>& ts, at::ScalarType dtype, const at::Device& dev, int64_t bucket_bytes,
              const std::function<void(std::vector<at::Tensor>&)>& op) {
  Buckets b = flatten(ts, dtype, dev, bucket_bytes);
  if (b.flat.empty()) return;
  op(b.flat);
  unflatten(b, ts, [&](size_t i) { return ts[i]; });
}

// The dtype a tensor of `t`'s type is reduced in (fp16/bf16 in fp32).
at::ScalarType wire_dtype(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

}  // namespace

std::optional<DistEnv> dist_env_from(const std::function<const char*(const char*)>& get_in) {
  const auto get = [&](const char* name) -> const char* {
    const char* v = get_in ? get_in(name) : std::getenv(name);
    return v;
  };
  const char* rank = get("RANK");
  const char* world = get("WORLD_SIZE");
  if (!rank && !world) return std::nullopt;
  const auto need = [&](const char* name) {
    const char* v = get(name);
    HEARTH_CHECK(v != nullptr, name, " is not set (with RANK / WORLD_SIZE set, hearth joins a torch.distributed job as "
                 "torchrun describes it and needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
    return v;
  };
  DistEnv e;
  e.rank = env_int("RANK", need("RANK"));
  e.world_size = env_int("WORLD_SIZE", need("WORLD_SIZE"));
  HEARTH_CHECK(e.world_size >= 1, "WORLD_SIZE=", e.world_size, " must be >= 1");
  HEARTH_CHECK(e.rank >= 0 && e.rank < e.world_size, "RANK=", e.rank, " is outside [0, WORLD_SIZE=", e.world_size, ")");
  e.local_rank = get("LOCAL_RANK") ? env_int("LOCAL_RANK", get("LOCAL_RANK")) : e.rank;
  HEARTH_CHECK(e.local_rank >= 0, "LOCAL_RANK=", e.local_rank, " must be >= 0");
  e.master_addr = need("MASTER_ADDR");
  HEARTH_CHECK(!e.master_addr.empty(), "MASTER_ADDR is empty");
  e.master_port = env_int("MASTER_PORT", need("MASTER_PORT"));
  HEARTH_CHECK(e.master_port >= 1 && e.master_port <= 65535, "MASTER_PORT=", e.master_port, " is not a port (1-65535)");
  if (const char* a = get("TORCHELASTIC_USE_AGENT_STORE")) e.agent_store = std::string(a) == "True" || std::string(a) == "1";
  if (const char* r = get("TORCHELASTIC_RESTART_COUNT")) e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", r);
  return e;
}

void check_global_batch(int64_t batch_size, int64_t world_size) {
  HEARTH_CHECK(world_size >= 1 && batch_size % world_size == 0, "--batch-size ", batch_size,
               " (the global batch) is not divisible by the ", world_size,
               " data-parallel processes (--nproc-per-node / WORLD_SIZE); use a multiple of ", world_size);
}

void check_data_parallel(int64_t batch_size, const std::string& method, int64_t world_size) {
  (void)method;  // every method splits: ORPO's NLL divides by the global count (trainer.cpp)
  check_global_batch(batch_size, world_size);
}

std::string resolve_backend(const std::string& backend, const at::Device& device) {
  if (backend == "auto") return device.is_cuda() ? "nccl" : "gloo";
  HEARTH_CHECK(backend == "gloo" || backend == "nccl", "--backend: '", backend, "' is not auto, gloo or nccl");
  return backend;
}

DataParallel::DataParallel(std::unique_ptr<Collectives> comm, int64_t rank, int64_t world_size)
    : comm_(std::move(comm)), rank_(rank), world_(world_size) {
  HEARTH_CHECK(comm_ != nullptr, "DataParallel: no collectives");
  HEARTH_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_, "DataParallel: rank ", rank_, " of ", world_);
}

std::shared_ptr<DataParallel> DataParallel::join(const DistEnv& env, const std::string& backend,
                                                 const at::Device& device, std::chrono::milliseconds timeout) {
  RendezvousSpec s;
  s.rank = env.rank;
  s.world_size = env.world_size;
  s.master_addr = env.master_addr;
  s.master_port = env.master_port;
  s.agent_store = env.agent_store;
  s.restart_count = env.restart_count;
  s.timeout = timeout;
  return std::make_shared<DataParallel>(connect_collectives(s, backend, device), env.rank, env.world_size);
}

std::vector<int64_t> DataParallel::share(const std::vector<int64_t>& idx) const {
  const int64_t n = static_cast<int64_t>(idx.size());
  HEARTH_CHECK(n % world_ == 0, "a batch of ", n, " items does not split among ", world_, " ranks");
  std::vector<int64_t> out;
  for (int64_t i = rank_; i < n; i += world_) out.push_back(idx[i]);
  return out;
}

Batch DataParallel::next_share(Batcher& b, const Dataset& data) const {
  std::vector<const Example*> rows;
  for (int64_t i : share(b.next_indices())) rows.push_back(&data.examples[i]);
  return make_batch(rows);
}

double DataParallel::sum(double v) {
  std::vector<at::Tensor> t{at::full({1}, v, at::TensorOptions().dtype(at::kDouble).device(comm_->device()))};
  comm_->all_reduce_sum(t);
  return t[0].cpu().item<double>();
}

int64_t DataParallel::sum(int64_t v) { return static_cast<int64_t>(sum(static_cast<double>(v))); }

bool DataParallel::any(bool flag) { return sum(flag ? 1.0 : 0.0) > 0.5; }

void DataParallel::all_reduce_grads(const std::vector<at::Tensor>& params, int64_t bucket_bytes) {
  if (params.empty()) return;
  // Which parameters have a gradient on some rank.
  at::Tensor has = at::zeros({static_cast<int64_t>(params.size())}, at::kDouble);
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].grad().defined()) has[i] = 1.0;
  std::vector<at::Tensor> hv{has.to(comm_->device())};
  comm_->all_reduce_sum(hv);
  has = hv[0].cpu();
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (size_t i = 0; i < params.size(); ++i) {
    if (has[i].item<double>() < 0.5) continue;
    at::Tensor p = params[i];
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    by_dtype[p.grad().scalar_type()].push_back(p.grad());
  }
  for (auto& [dtype, grads] : by_dtype)
    bucketed(grads, wire_dtype(dtype), comm_->device(), bucket_bytes, [&](std::vector<at::Tensor>& flat) {
      comm_->all_reduce_sum(flat);
    });
}

namespace {

// all_reduce_grads_async's handle: the flags and buckets in flight, and where they go back.
class AsyncGradReduce final : public PendingGradReduce {
 public:
  struct Group {
    std::vector<size_t> params;    // indices into params_ of this dtype's tensors
    std::vector<at::Tensor> src;   // their gradients as flattened (zeros where undefined here)
    Buckets buckets;
    std::unique_ptr<CollectiveWork> work;
  };
  AsyncGradReduce(std::vector<at::Tensor> params, at::Tensor has, std::unique_ptr<CollectiveWork> has_work,
                  std::vector<Group> groups)
      : params_(std::move(params)), has_(std::move(has)), has_work_(std::move(has_work)), groups_(std::move(groups)) {}
  void wait() override {
    if (done_) return;
    done_ = true;
    if (has_work_) has_work_->wait();
    for (auto& g : groups_) g.work->wait();
    if (params_.empty()) return;
    const at::Tensor has = has_.cpu();
    const auto h = has.accessor<double, 1>();
    for (auto& g : groups_)
      unflatten(g.buckets, g.src, [&](size_t i) -> at::Tensor {
        const size_t p = g.params[i];
        if (h[static_cast<int64_t>(p)] < 0.5) return {};  // undefined on every rank: stays so
        at::Tensor t = params_[p];
        if (!t.grad().defined()) t.mutable_grad() = at::zeros_like(t);
        return t.grad();
      });
  }

 private:
  std::vector<at::Tensor> params_;
  at::Tensor has_;  // [n] fp64 on the collectives' device: ranks whose gradient was defined
  std::unique_ptr<CollectiveWork> has_work_;
  std::vector<Group> groups_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<PendingGradReduce> DataParallel::all_reduce_grads_async(const std::vector<at::Tensor>& params,
                                                                        int64_t bucket_bytes) {
  if (params.empty()) return std::make_unique<AsyncGradReduce>(params, at::Tensor(), nullptr,
                                                               std::vector<AsyncGradReduce::Group>{});
  at::Tensor has = at::zeros({static_cast<int64_t>(params.size())}, at::kDouble);
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].grad().defined()) has[i] = 1.0;
  std::vector<at::Tensor> hv{has.to(comm_->device())};
  auto has_work = comm_->all_reduce_sum_async(hv);
  std::map<at::ScalarType, AsyncGradReduce::Group> by_dtype;  // by the parameter's dtype: the same on every rank
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    auto& g = by_dtype[p.scalar_type()];
    g.params.push_back(i);
    g.src.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
  }
  std::vector<AsyncGradReduce::Group> groups;
  for (auto& [dtype, g] : by_dtype) {
    g.buckets = flatten(g.src, wire_dtype(dtype), comm_->device(), bucket_bytes);
    g.work = comm_->all_reduce_sum_async(g.buckets.flat);
    groups.push_back(std::move(g));
  }
  return std::make_unique<AsyncGradReduce>(params, hv[0], std::move(has_work), std::move(groups));
}

void DataParallel::broadcast_from_rank0(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) {
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, ts] : by_dtype)
    bucketed(ts, wire_dtype(dtype), comm_->device(), bucket_bytes, [&](std::vector<at::Tensor>& flat) {
      comm_->broadcast(flat, 0);
    });
}

StepGradReduce::StepGradReduce(DataParallel& dp, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : dp_(dp), params_(std::move(params)), bucket_bytes_(bucket_bytes), started_(params_.size(), false) {
  for (size_t i = 0; i < params_.size(); ++i) index_.emplace(params_[i].unsafeGetTensorImpl(), i);
}

void StepGradReduce::start(const std::vector<at::Tensor>& ready) {
  std::vector<at::Tensor> now;
  for (const auto& t : ready) {
    auto it = index_.find(t.unsafeGetTensorImpl());
    if (it == index_.end() || started_[it->second]) continue;
    started_[it->second] = true;
    now.push_back(params_[it->second]);
  }
  n_started_ += static_cast<int64_t>(now.size());
  if (!now.empty()) pending_.push_back(dp_.all_reduce_grads_async(now, bucket_bytes_));
}

void StepGradReduce::finish() {
  std::vector<at::Tensor> rest;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!started_[i]) rest.push_back(params_[i]);
  dp_.all_reduce_grads(rest, bucket_bytes_);  // issued behind the started pieces, summed while they finish
  for (auto& p : pending_) p->wait();
  pending_.clear();
  started_.assign(params_.size(), false);
  n_started_ = 0;
}

}  // namespace hearth::train
