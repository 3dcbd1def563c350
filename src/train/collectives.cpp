// c10d behind Collectives (collectives.h): TCPStore rendezvous, ProcessGroupGloo / ProcessGroupNCCL,
// the launcher's store server. Every c10d type and version difference stays in this file.
#include "train/collectives.h"

#include <cstdlib>
#include <exception>

#include "core/error.h"

// c10d's backend headers are wrapped in USE_C10D_<BACKEND>; libtorch was built with them, and a
// backend is compiled here only when its headers (and their library's) are present, and not at all
// with -DHEARTH_C10D_BACKENDS=OFF (HEARTH_NO_C10D_BACKENDS: a libtorch whose backend headers do not
// build here still builds Hearth, without data-parallel training).
#if !defined(HEARTH_NO_C10D_BACKENDS) && __has_include(<gloo/algorithm.h>) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>)
#define HEARTH_HAS_GLOO 1
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(HEARTH_HAS_NCCL) && !defined(HEARTH_NO_C10D_BACKENDS) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
#undef HEARTH_HAS_NCCL
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace hearth::train {

bool gloo_built() {
#ifdef HEARTH_HAS_GLOO
  return true;
#else
  return false;
#endif
}

bool nccl_built() {
#ifdef HEARTH_HAS_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

// A collective that was done before its handle was made.
class DoneWork final : public CollectiveWork {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<CollectiveWork> Collectives::all_reduce_sum_async(std::vector<at::Tensor>& tensors) {
  all_reduce_sum(tensors);
  return std::make_unique<DoneWork>();
}

namespace {

// Runs `f`, turning c10d's and gloo's exceptions into one hearth::Error line naming `what`.
template <class F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const hearth::Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw hearth::Error(cat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw hearth::Error(cat(what, ": ", e.what()));
  }
}

// c10d Work objects (one per tensor) behind CollectiveWork; keeps the tensors alive until waited.
class C10dWork final : public CollectiveWork {
 public:
  C10dWork(std::string what, std::vector<c10::intrusive_ptr<c10d::Work>> works, std::vector<at::Tensor> tensors)
      : what_(std::move(what)), works_(std::move(works)), tensors_(std::move(tensors)) {}
  void wait() override {
    guarded(what_, [&] {
      for (auto& w : works_) w->wait();
    });
    works_.clear();
    tensors_.clear();
  }

 private:
  std::string what_;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::vector<at::Tensor> tensors_;
};

// PG is ProcessGroupGloo or ProcessGroupNCCL (c10d::ProcessGroup in 1.13, c10d::Backend in 2.x:
// both have allreduce / broadcast returning a Work to wait on).
template <class PG>
class C10dCollectives final : public Collectives {
 public:
  C10dCollectives(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<PG> pg, std::string name, at::Device dev)
      : store_(std::move(store)), pg_(std::move(pg)), name_(std::move(name)), device_(dev) {}
  std::string backend() const override { return name_; }
  at::Device device() const override { return device_; }
  void all_reduce_sum(std::vector<at::Tensor>& tensors) override { all_reduce_sum_async(tensors)->wait(); }
  std::unique_ptr<CollectiveWork> all_reduce_sum_async(std::vector<at::Tensor>& tensors) override {
    const std::string what = name_ + " all_reduce";
    return guarded(what, [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        c10d::AllreduceOptions o;
        o.reduceOp = c10d::ReduceOp::SUM;
        works.push_back(pg_->allreduce(one, o));
      }
      return std::make_unique<C10dWork>(what, std::move(works), tensors);
    });
  }
  void broadcast(std::vector<at::Tensor>& tensors, int64_t root) override {
    guarded(name_ + " broadcast", [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        c10d::BroadcastOptions o;
        o.rootRank = root;
        works.push_back(pg_->broadcast(one, o));
      }
      for (auto& w : works) w->wait();
    });
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<PG> pg_;
  std::string name_;
  at::Device device_;
};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

class TcpStoreServer final : public StoreServer {
 public:
  explicit TcpStoreServer(c10::intrusive_ptr<c10d::TCPStore> s) : store_(std::move(s)) {}
  int64_t port() const override { return store_->getPort(); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

std::unique_ptr<StoreServer> StoreServer::start(std::chrono::milliseconds timeout) {
  return guarded("starting the rendezvous store on a free port", [&]() -> std::unique_ptr<StoreServer> {
    c10d::TCPStoreOptions o;
    o.port = 0;
    o.isServer = true;
    o.waitWorkers = false;
    o.timeout = timeout;
    return std::make_unique<TcpStoreServer>(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o));
  });
}

std::unique_ptr<Collectives> connect_collectives(const RendezvousSpec& s, const std::string& backend,
                                                 const at::Device& device) {
  HEARTH_CHECK(backend == "gloo" || backend == "nccl", "--backend: '", backend, "' is not gloo, nccl or auto");
  HEARTH_CHECK(backend != "gloo" || gloo_built(),
               "--backend gloo: this build has no Gloo (libtorch's c10d Gloo header or gloo's headers were not found "
               "at build time; on Debian install libgloo-dev, i.e. scripts/setup, and rebuild)");
  HEARTH_CHECK(backend != "nccl" || nccl_built(),
               "--backend nccl: this build has no NCCL (it needs a CUDA libtorch and nccl.h at build time); use "
               "--backend gloo");
  HEARTH_CHECK(backend != "nccl" || device.is_cuda(), "--backend nccl needs --device cuda (NCCL reduces GPU tensors); "
               "use --backend gloo on the CPU");
  HEARTH_CHECK(s.master_port > 0 && s.master_port < 65536, "MASTER_PORT ", s.master_port, " is not a port (1-65535)");
  const std::string where = cat("rendezvous at ", s.master_addr, ":", s.master_port, " (rank ", s.rank, " of ",
                                s.world_size, ")");
  c10::intrusive_ptr<c10d::Store> store = guarded(where, [&]() -> c10::intrusive_ptr<c10d::Store> {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(s.master_port);
    o.isServer = s.rank == 0 && !s.agent_store;
    o.numWorkers = static_cast<size_t>(s.world_size);
    o.waitWorkers = false;
    o.timeout = s.timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(s.master_addr, o);
    return c10::make_intrusive<c10d::PrefixStore>(cat("hearth/attempt_", s.restart_count, "/"), tcp);
  });
  const int rank = static_cast<int>(s.rank), size = static_cast<int>(s.world_size);
#ifdef HEARTH_HAS_GLOO
  if (backend == "gloo") {
    return guarded(where + " (gloo)", [&]() -> std::unique_ptr<Collectives> {
      auto opts = c10d::ProcessGroupGloo::Options::create(s.timeout);
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      if (ifname && *ifname)
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else if (is_loopback(s.master_addr))
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      else
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
      return std::make_unique<C10dCollectives<c10d::ProcessGroupGloo>>(store, pg, "gloo", at::Device(at::kCPU));
    });
  }
#endif
#ifdef HEARTH_HAS_NCCL
  if (backend == "nccl") {
    return guarded(where + " (nccl)", [&]() -> std::unique_ptr<Collectives> {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = s.timeout;
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
      return std::make_unique<C10dCollectives<c10d::ProcessGroupNCCL>>(store, pg, "nccl", device);
    });
  }
#endif
  throw hearth::Error(cat("--backend ", backend, ": not built"));
}

}  // namespace hearth::train
