// Data-parallel pieces without the CLI: the torchrun environment and its errors, batch shares,
// the bucketed gradient all-reduce, blocking, asynchronous and in a step's pieces (on a fake
// group), and a real Gloo group of two ranks as two threads of this process (all-reduce,
// broadcast, the overlapped step reduction against the blocking one, and a rendezvous that times out).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "core/error.h"
#include "train/collectives.h"
#include "train/distributed.h"
#include "core/torch_compat.h"

namespace {

using hearth::train::Collectives;
using hearth::train::DataParallel;

// Rank r of a 2-rank Gloo job on this machine whose store the test serves on `port`.
std::shared_ptr<DataParallel> join_gloo(int r, int64_t port) {
  hearth::train::DistEnv env;
  env.rank = r;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  env.agent_store = true;
  return DataParallel::join(env, "gloo", at::Device(at::kCPU), std::chrono::seconds(20));
}

using hearth::train::dist_env_from;

std::function<const char*(const char*)> env_of(const std::map<std::string, std::string>& m) {
  return [m](const char* k) -> const char* {
    auto it = m.find(k);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hearth::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DistEnv, NoTorchrunVariablesIsOneProcess) {
  EXPECT_FALSE(dist_env_from(env_of({{"MASTER_PORT", "1234"}})).has_value());
}

TEST(DistEnv, ReadsTorchrunVariables) {
  auto e = dist_env_from(env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"},
                                 {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                 {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "node0");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_TRUE(e->agent_store);
  EXPECT_EQ(e->restart_count, 2);
  auto d = dist_env_from(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}));
  EXPECT_EQ(d->local_rank, 1);  // defaults to RANK
  EXPECT_FALSE(d->agent_store);
}

TEST(DistEnv, BadValuesNameTheVariable) {
  const std::map<std::string, std::string> ok = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  const auto with = [&](const std::string& k, const std::string& v) {
    auto m = ok;
    if (v == "<unset>") m.erase(k);
    else m[k] = v;
    return error_of([&] { dist_env_from(env_of(m)); });
  };
  EXPECT_NE(with("WORLD_SIZE", "0").find("WORLD_SIZE=0 must be >= 1"), std::string::npos) << with("WORLD_SIZE", "0");
  EXPECT_NE(with("WORLD_SIZE", "two").find("WORLD_SIZE='two' is not an integer"), std::string::npos);
  EXPECT_NE(with("RANK", "2").find("RANK=2 is outside [0, WORLD_SIZE=2)"), std::string::npos);
  EXPECT_NE(with("RANK", "<unset>").find("RANK is not set"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "<unset>").find("MASTER_PORT is not set"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "70000").find("MASTER_PORT=70000 is not a port"), std::string::npos);
  EXPECT_NE(with("LOCAL_RANK", "-1").find("LOCAL_RANK=-1 must be >= 0"), std::string::npos);
}

TEST(DistEnv, GlobalBatchMustSplitEvenly) {
  EXPECT_NO_THROW(hearth::train::check_global_batch(8, 4));
  const std::string e = error_of([] { hearth::train::check_global_batch(6, 4); });
  EXPECT_NE(e.find("--batch-size 6"), std::string::npos) << e;
  EXPECT_NE(e.find("4 data-parallel processes"), std::string::npos) << e;
  EXPECT_EQ(hearth::train::resolve_backend("auto", at::Device(at::kCPU)), "gloo");
  EXPECT_EQ(hearth::train::resolve_backend("auto", at::Device(at::kCUDA, 0)), "nccl");
  EXPECT_NE(error_of([] { hearth::train::resolve_backend("mpi", at::Device(at::kCPU)); }).find("--backend: 'mpi'"),
            std::string::npos);
}

// A group of `world` ranks that all hold the same values: a sum multiplies by world. Records the
// size of every tensor reduced.
class SameOnEveryRank final : public Collectives {
 public:
  explicit SameOnEveryRank(int64_t world, std::vector<int64_t>* sizes) : world_(world), sizes_(sizes) {}
  std::string backend() const override { return "fake"; }
  at::Device device() const override { return at::Device(at::kCPU); }
  void all_reduce_sum(std::vector<at::Tensor>& ts) override {
    for (auto& t : ts) {
      sizes_->push_back(t.numel());
      t.mul_(static_cast<double>(world_));
    }
  }
  void broadcast(std::vector<at::Tensor>&, int64_t) override {}

 private:
  int64_t world_;
  std::vector<int64_t>* sizes_;
};

TEST(DataParallel, SharesAreStridedSlicesOfTheGlobalBatch) {
  std::vector<int64_t> sizes;
  DataParallel r1(std::make_unique<SameOnEveryRank>(2, &sizes), 1, 2);
  EXPECT_EQ(r1.share({10, 11, 12, 13}), (std::vector<int64_t>{11, 13}));
  DataParallel r0(std::make_unique<SameOnEveryRank>(2, &sizes), 0, 2);
  EXPECT_EQ(r0.share({10, 11, 12, 13}), (std::vector<int64_t>{10, 12}));
  EXPECT_THROW(r0.share({1, 2, 3}), hearth::Error);
}

TEST(DataParallel, AllReduceGradsBucketsAndKeepsUndefinedGrads) {
  std::vector<int64_t> sizes;
  DataParallel dp(std::make_unique<SameOnEveryRank>(3, &sizes), 0, 3);
  at::Tensor a = at::zeros({2, 2}).requires_grad_(true), b = at::zeros({3}).requires_grad_(true),
             c = at::zeros({5}).requires_grad_(true), h = at::zeros({2}, at::kBFloat16).requires_grad_(true);
  a.mutable_grad() = at::arange(4, at::kFloat).view({2, 2});
  c.mutable_grad() = at::ones({5});
  h.mutable_grad() = at::full({2}, 0.5, at::kBFloat16);
  dp.all_reduce_grads({a, b, c, h}, /*bucket_bytes=*/16);
  EXPECT_TRUE(at::equal(a.grad(), at::arange(4, at::kFloat).view({2, 2}) * 3));
  EXPECT_FALSE(b.grad().defined());  // undefined on every rank: stays so (the optimizer skips it)
  EXPECT_TRUE(at::equal(c.grad(), at::full({5}, 3.0)));
  EXPECT_EQ(h.grad().scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(h.grad(), at::full({2}, 1.5, at::kBFloat16)));
  // the defined-mask (4), then fp32 buckets of <= 16 bytes: [a] (4 floats), [c] (5 floats, alone), [h]
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 5, 2}));
}

// The asynchronous all-reduce: the same sums and undefined-gradient rules as the blocking one,
// without its first round: a gradient undefined here travels as zeros beside a flags vector.
TEST(DataParallel, AllReduceGradsAsyncMatchesTheBlockingOne) {
  std::vector<int64_t> sizes;
  DataParallel dp(std::make_unique<SameOnEveryRank>(3, &sizes), 0, 3);
  at::Tensor a = at::zeros({2, 2}).requires_grad_(true), b = at::zeros({3}).requires_grad_(true),
             c = at::zeros({5}).requires_grad_(true), h = at::zeros({2}, at::kBFloat16).requires_grad_(true);
  a.mutable_grad() = at::arange(4, at::kFloat).view({2, 2});
  c.mutable_grad() = at::ones({5});
  h.mutable_grad() = at::full({2}, 0.5, at::kBFloat16);
  auto w = dp.all_reduce_grads_async({a, b, c, h}, /*bucket_bytes=*/16);
  // the flags (4), then fp32 buckets of <= 16 bytes: [a], [b's zeros], [c], then bf16 in fp32: [h]
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 3, 5, 2}));
  EXPECT_TRUE(at::equal(a.grad(), at::arange(4, at::kFloat).view({2, 2})));  // nothing written before wait()
  w->wait();
  w->wait();  // a second wait does nothing
  EXPECT_TRUE(at::equal(a.grad(), at::arange(4, at::kFloat).view({2, 2}) * 3));
  EXPECT_FALSE(b.grad().defined());  // undefined on every rank: stays so
  EXPECT_TRUE(at::equal(c.grad(), at::full({5}, 3.0)));
  EXPECT_EQ(h.grad().scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(h.grad(), at::full({2}, 1.5, at::kBFloat16)));
  sizes.clear();
  dp.all_reduce_grads_async({}, 16)->wait();
  EXPECT_TRUE(sizes.empty());
}

// A step's reduction in pieces: started ones once (unknown tensors and repeats ignored), the rest
// by finish() as all_reduce_grads; then ready for the next step.
TEST(DataParallel, StepGradReduceStartsPiecesAndFinishesTheRest) {
  std::vector<int64_t> sizes;
  DataParallel dp(std::make_unique<SameOnEveryRank>(2, &sizes), 0, 2);
  at::Tensor a = at::zeros({4}).requires_grad_(true), b = at::zeros({3}).requires_grad_(true),
             c = at::zeros({5}).requires_grad_(true), h = at::zeros({2}, at::kBFloat16).requires_grad_(true),
             other = at::zeros({7}).requires_grad_(true);
  hearth::train::StepGradReduce step(dp, {a, b, c, h});
  for (int rep = 0; rep < 2; ++rep) {
    sizes.clear();
    a.mutable_grad() = at::full({4}, 1.0);
    b.mutable_grad() = at::Tensor();
    c.mutable_grad() = at::full({5}, 2.0);
    h.mutable_grad() = at::full({2}, 0.25, at::kBFloat16);
    other.mutable_grad() = at::full({7}, 1.0);
    step.start({c, other, c});
    step.start({a, c});
    EXPECT_EQ(step.started(), 2);
    step.finish();
    EXPECT_EQ(step.started(), 0);
    // [c]: flags (1) + c (5); [a]: flags (1) + a (4); the rest {b, h}: the blocking flags (2), then h
    // (b is undefined everywhere: not sent)
    EXPECT_EQ(sizes, (std::vector<int64_t>{1, 5, 1, 4, 2, 2})) << "step " << rep;
    EXPECT_TRUE(at::equal(a.grad(), at::full({4}, 2.0)));
    EXPECT_FALSE(b.grad().defined());
    EXPECT_TRUE(at::equal(c.grad(), at::full({5}, 4.0)));
    EXPECT_TRUE(at::equal(h.grad(), at::full({2}, 0.5, at::kBFloat16)));
    EXPECT_TRUE(at::equal(other.grad(), at::full({7}, 1.0)));  // not a param of the step: untouched
  }
}

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(s);
  return port;
}

// Debian's libtorch 1.x (this machine, CI) must come with Gloo: scripts/setup installs libgloo-dev.
// PyTorch 2.x's pip wheel (the GPU machine) ships no gloo headers: there the suite is skipped.
#define HEARTH_REQUIRE_GLOO()                                                                      \
  do {                                                                                             \
    if (hearth::compat::torch_version()[0] >= '2' && !hearth::train::gloo_built()) GTEST_SKIP() << "no Gloo in this libtorch"; \
    ASSERT_TRUE(hearth::train::gloo_built()) << "this build has no Gloo (libgloo-dev missing at build time)"; \
  } while (0)

TEST(Gloo, TwoRanksAllReduceAndBroadcast) {
  HEARTH_REQUIRE_GLOO();
  auto server = hearth::train::StoreServer::start(std::chrono::seconds(20));
  std::vector<std::vector<double>> sums(2), bcast(2);
  std::vector<double> scalar(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      try {
        auto dp = join_gloo(r, server->port());
        at::Tensor p = at::full({3}, 100.0 * (r + 1)).requires_grad_(true);
        p.mutable_grad() = at::tensor({1.0f, 2.0f, 3.0f}) * static_cast<float>(r + 1);
        dp->all_reduce_grads({p});
        for (int i = 0; i < 3; ++i) sums[r].push_back(p.grad()[i].item<double>());
        dp->broadcast_from_rank0({p});
        for (int i = 0; i < 3; ++i) bcast[r].push_back(p[i].item<double>());
        scalar[r] = dp->sum(0.25 * (r + 1));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(sums[r], (std::vector<double>{3, 6, 9})) << "rank " << r;
    EXPECT_EQ(bcast[r], (std::vector<double>{100, 100, 100})) << "rank " << r;
    EXPECT_DOUBLE_EQ(scalar[r], 0.75) << "rank " << r;
  }
}

// Two real ranks: the overlapped reduction (pieces started asynchronously, the rest by finish)
// leaves every gradient bit-equal to the blocking all_reduce_grads, including a gradient defined on
// one rank only (zeros + the sum), one defined on none (stays undefined) and a bf16 one.
TEST(Gloo, StepGradReduceEqualsAllReduceGradsBitForBit) {
  HEARTH_REQUIRE_GLOO();
  auto server = hearth::train::StoreServer::start(std::chrono::seconds(20));
  std::vector<std::string> errors(2), mismatches(2);
  std::vector<std::vector<double>> only0(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      try {
        auto dp = join_gloo(r, server->port());
        // Per set: 6 "layer" tensors (two per segment), a head, one defined on rank 0 only, one on none.
        const auto make = [&] {
          at::Generator gen = at::detail::createCPUGenerator(100 + r);
          std::vector<at::Tensor> ps;
          for (int i = 0; i < 6; ++i) {
            at::Tensor p = at::zeros({97 + i}, i == 5 ? at::kBFloat16 : at::kFloat).requires_grad_(true);
            p.mutable_grad() = at::randn({97 + i}, gen).to(p.scalar_type());
            ps.push_back(p);
          }
          at::Tensor head = at::zeros({33}).requires_grad_(true);
          head.mutable_grad() = at::randn({33}, gen);
          at::Tensor half = at::zeros({8}).requires_grad_(true), none = at::zeros({8}).requires_grad_(true);
          if (r == 0) half.mutable_grad() = at::arange(8, at::kFloat);
          ps.insert(ps.end(), {head, half, none});
          return ps;
        };
        const auto x = make(), y = make();
        dp->all_reduce_grads(y, /*bucket_bytes=*/400);
        hearth::train::StepGradReduce step(*dp, x, /*bucket_bytes=*/400);
        step.start({x[4], x[5]});
        step.start({x[2], x[3], x[7], x[8]});
        step.start({x[0], x[1]});
        step.finish();
        for (size_t i = 0; i < x.size(); ++i) {
          if (x[i].grad().defined() != y[i].grad().defined() ||
              (x[i].grad().defined() && !at::equal(x[i].grad(), y[i].grad())))
            mismatches[r] += " " + std::to_string(i);
        }
        EXPECT_FALSE(x[8].grad().defined());
        for (int i = 0; i < 8; ++i) only0[r].push_back(x[7].grad()[i].item<double>());
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(mismatches[r], "") << "rank " << r << ": these gradients differ";
    EXPECT_EQ(only0[r], (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7})) << "rank " << r;
  }
}

TEST(Gloo, RendezvousWithNobodyThereTimesOutNamingTheAddress) {
  HEARTH_REQUIRE_GLOO();
  const int port = free_port();
  hearth::train::DistEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e =
      error_of([&] { DataParallel::join(env, "gloo", at::Device(at::kCPU), std::chrono::milliseconds(1500)); });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(e.find("rendezvous at 127.0.0.1:" + std::to_string(port) + " (rank 1 of 2)"), std::string::npos) << e;
  EXPECT_LT(took, 15.0);
}

}  // namespace
