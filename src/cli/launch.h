// `hearth train --nproc-per-node N`: a torchrun-like launcher (the parent spawns N copies of this
// command line with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set, waits, and on the
// first failure stops the rest and exits with its code) and the worker side of joining the job.
// Not the data-parallel training itself (train/distributed.h).
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "train/distributed.h"

namespace hearth::cli {

/// The data-parallel flags of `hearth train`.
struct DistOptions {
  int64_t nproc_per_node = 1;  // workers to start on this machine; 1 = no launcher
  std::string backend = "auto";  // auto | gloo | nccl
  double timeout_s = 1800;     // rendezvous and collective timeout (torch's default, 30 min)
};

/// Adds --nproc-per-node, --backend and --dist-timeout to `app`.
void add_dist_options(CLI::App& app, DistOptions& o);

/// Checks the flags alone (nproc >= 1, timeout > 0, backend name). Throws hearth::Error naming
/// the flag. (The global batch's divisibility: train::check_global_batch.)
void check_dist_options(const DistOptions& o);

/// The launcher: runs N = o.nproc_per_node copies of this process's command line
/// (/proc/self/exe, /proc/self/cmdline) with RANK = LOCAL_RANK = 0..N-1, WORLD_SIZE = N,
/// MASTER_ADDR (kept when set, else 127.0.0.1) and MASTER_PORT (kept when set and rank 0 then serves
/// the store; else this process serves it on a free port and sets torchrun's
/// TORCHELASTIC_USE_AGENT_STORE=True). The children inherit stdout/stderr (rank 0 prints, the
/// others print only errors, prefixed "rank N:"). SIGINT/SIGTERM are forwarded to them (SIGHUP as
/// SIGTERM), and a worker gets SIGTERM when the launcher dies, even by SIGKILL (PR_SET_PDEATHSIG). Returns 0
/// when all exit 0; else the exit code of the first to fail (128 + signal for a killed one), after
/// sending the others SIGTERM and, 5 s later, SIGKILL. Throws hearth::Error when it cannot start.
int launch_workers(const DistOptions& o);

/// Worker side, before any CUDA call: for a job of more than one rank on a GPU device (device
/// flag not "cpu"), makes this rank see only its GPU (CUDA_VISIBLE_DEVICES = the LOCAL_RANK-th of
/// the visible ones). Throws hearth::Error when LOCAL_RANK has no GPU in CUDA_VISIBLE_DEVICES.
void prepare_worker(const train::DistEnv& env, const std::string& device_flag);

/// Joins the job (train::DataParallel::join with the resolved backend and o.timeout_s). Test
/// hook: HEARTH_TEST_FAIL_RANK=<rank> makes that rank fail right after joining.
std::shared_ptr<train::DataParallel> join_workers(const train::DistEnv& env, const DistOptions& o,
                                                  const at::Device& device);

/// Runs `f`; when `rank` >= 0, an error it throws is rethrown as hearth::Error prefixed "rank N: ".
int with_rank_prefix(int64_t rank, const std::function<int()>& f);

}  // namespace hearth::cli
