// The data-parallel launcher and worker join of `hearth train` (launch.h): fork/exec of this same
// command line per rank, first-failure propagation, signal forwarding.
#include "cli/launch.h"

#include <c10/util/Exception.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"

extern char** environ;

namespace hearth::cli {

namespace {

std::atomic<int> g_forward{0};  // a signal the launcher got, to pass on to its workers

extern "C" void on_launcher_signal(int sig) { g_forward.store(sig); }

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  HEARTH_CHECK(in, "--nproc-per-node: cannot read /proc/self/cmdline to start the workers");
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  HEARTH_CHECK(!args.empty(), "--nproc-per-node: /proc/self/cmdline is empty");
  return args;
}

bool is_dist_var(const std::string& kv) {
  for (const char* v : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
                        "TORCHELASTIC_USE_AGENT_STORE=", "TORCHELASTIC_RESTART_COUNT="})
    if (kv.rfind(v, 0) == 0) return true;
  return false;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

void add_dist_options(CLI::App& app, DistOptions& o) {
  app.add_option("--nproc-per-node", o.nproc_per_node,
                 "Data-parallel worker processes to start on this machine, like torchrun (default 1). "
                 "--batch-size stays the global batch. With RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (torchrun, "
                 "SLURM), this process is one rank and joins directly");
  app.add_option("--backend", o.backend, "Data-parallel backend: auto | gloo | nccl (auto: nccl on cuda, gloo on cpu)");
  app.add_option("--dist-timeout", o.timeout_s,
                 "Seconds a rendezvous or a collective may wait for the other ranks before failing (default 1800)");
}

void check_dist_options(const DistOptions& o) {
  HEARTH_CHECK(o.nproc_per_node >= 1, "--nproc-per-node must be >= 1, got ", o.nproc_per_node);
  HEARTH_CHECK(o.timeout_s > 0 && o.timeout_s <= 1e7, "--dist-timeout must be > 0 seconds, got ", o.timeout_s);
  HEARTH_CHECK(o.backend == "auto" || o.backend == "gloo" || o.backend == "nccl", "--backend: '", o.backend,
               "' is not auto, gloo or nccl");
}

int launch_workers(const DistOptions& o) {
  const int64_t n = o.nproc_per_node;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  const char* addr_env = std::getenv("MASTER_ADDR");
  const char* port_env = std::getenv("MASTER_PORT");
  const std::string addr = addr_env && *addr_env ? addr_env : "127.0.0.1";
  std::unique_ptr<train::StoreServer> store;
  std::string port;
  if (port_env && *port_env) {
    port = port_env;
  } else {
    store = train::StoreServer::start(timeout);  // a free port; rank 0 connects as a client
    port = std::to_string(store->port());
  }
  const std::vector<std::string> args = own_command_line();
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e)
    if (!is_dist_var(*e)) base_env.emplace_back(*e);
  std::printf("data-parallel: starting %lld processes, rendezvous at %s:%s\n", static_cast<long long>(n), addr.c_str(),
              port.c_str());
  std::fflush(stdout);
  std::fflush(stderr);

  struct sigaction sa {}, old_int {}, old_term {}, old_hup {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);  // a closed terminal: the workers stop as on SIGTERM
  const pid_t launcher = getpid();
  std::vector<pid_t> pids;
  const auto kill_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) kill(p, sig);
  };
  for (int64_t r = 0; r < n; ++r) {
    // Everything the child needs is built before fork (only exec-safe calls after it).
    std::vector<std::string> env = base_env;
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(n));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(n));
    env.push_back("MASTER_ADDR=" + addr);
    env.push_back("MASTER_PORT=" + port);
    if (store) env.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
    std::vector<char*> envp, argv;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argcopy = args;
    for (auto& s : argcopy) argv.push_back(s.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      // A launcher that dies however it dies (SIGKILL included) takes its workers with it: they
      // get SIGTERM (checkpoint, then exit) instead of training on as orphans.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher) _exit(1);  // it died before the line above
      execve("/proc/self/exe", argv.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) {
      kill_all(SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      throw hearth::Error(cat("--nproc-per-node: cannot start worker ", r, ": ", std::strerror(errno)));
    }
    pids.push_back(pid);
  }

  int first_failure = 0;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  int64_t alive = n;
  while (alive > 0) {
    if (const int sig = g_forward.exchange(0)) kill_all(sig == SIGHUP ? SIGTERM : sig);
    if (kill_at && std::chrono::steady_clock::now() >= *kill_at) {
      kill_all(SIGKILL);
      kill_at.reset();
    }
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != done) continue;
      pids[r] = -1;
      --alive;
      const int code = exit_code(status);
      if (code != 0 && first_failure == 0) {
        first_failure = code;
        std::fprintf(stderr, "hearth: data-parallel worker %zu exited with code %d; stopping the others\n", r, code);
        kill_all(SIGTERM);
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      }
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  return first_failure;
}

void prepare_worker(const train::DistEnv& env, const std::string& device_flag) {
  if (env.world_size <= 1 || device_flag == "cpu") return;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string pick = std::to_string(env.local_rank);
  if (visible && *visible) {
    std::vector<std::string> ids;
    std::stringstream ss(visible);
    for (std::string id; std::getline(ss, id, ',');) ids.push_back(id);
    HEARTH_CHECK(env.local_rank < static_cast<int64_t>(ids.size()), "LOCAL_RANK=", env.local_rank,
                 " has no GPU in CUDA_VISIBLE_DEVICES=", visible, " (one GPU per local rank)");
    pick = ids[env.local_rank];
  }
  setenv("CUDA_VISIBLE_DEVICES", pick.c_str(), 1);
}

std::shared_ptr<train::DataParallel> join_workers(const train::DistEnv& env, const DistOptions& o,
                                                  const at::Device& device) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  auto dp = train::DataParallel::join(env, train::resolve_backend(o.backend, device), device, timeout);
  if (const char* f = std::getenv("HEARTH_TEST_FAIL_RANK"); f && std::to_string(env.rank) == f)
    throw hearth::Error("failing on purpose after joining (HEARTH_TEST_FAIL_RANK, a test hook)");
  return dp;
}

int with_rank_prefix(int64_t rank, const std::function<int()>& f) {
  if (rank < 0) return f();
  try {
    return f();
  } catch (const hearth::Error& e) {
    throw hearth::Error(cat("rank ", rank, ": ", e.what()));
  } catch (const c10::Error& e) {
    throw hearth::Error(cat("rank ", rank, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw hearth::Error(cat("rank ", rank, ": ", e.what()));
  }
}

}  // namespace hearth::cli
