// core/threads: physical cores against /proc/cpuinfo's (physical id, core id) pairs of the CPUs
// this process may use, and --threads' values (n, 0 = physical cores, OMP_NUM_THREADS standing,
// out-of-range values refused).
#include "core/threads.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"

namespace {

// Distinct (physical id, core id) of the usable processors listed in /proc/cpuinfo; -1 when it
// lacks those fields (some VMs).
int64_t cores_from_cpuinfo() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return -1;
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<long, long>> cores;
  long proc = -1, phys = -1;
  std::string line;
  bool any = false;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const long value = std::atol(line.c_str() + colon + 1);
    if (key == "processor") proc = value;
    if (key == "physical id") phys = value;
    if (key == "core id" && proc >= 0 && proc < CPU_SETSIZE && CPU_ISSET(proc, &mask)) {
      cores.insert({phys, value});
      any = true;
    }
  }
  return any ? static_cast<int64_t>(cores.size()) : -1;
}

struct RestoreThreads {
  int before = at::get_num_threads();
  ~RestoreThreads() {
    unsetenv("OMP_NUM_THREADS");
    at::set_num_threads(before);
  }
};

}  // namespace

TEST(Threads, PhysicalCoresMatchCpuinfo) {
  const int64_t got = hearth::physical_cores();
  EXPECT_GE(got, 1);
  const int64_t want = cores_from_cpuinfo();
  if (want < 0) GTEST_SKIP() << "/proc/cpuinfo has no core ids here (got " << got << ")";
  EXPECT_EQ(got, want);
}

TEST(Threads, ApplyThreads) {
  RestoreThreads restore;
  unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(hearth::apply_threads(1), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(hearth::apply_threads(0), hearth::physical_cores());
  // OMP_NUM_THREADS set: 0 leaves the count as it is.
  at::set_num_threads(1);
  setenv("OMP_NUM_THREADS", "1", 1);
  EXPECT_EQ(hearth::apply_threads(0), 1);
  for (int64_t bad : {int64_t{-1}, int64_t{4097}}) {
    try {
      hearth::apply_threads(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const hearth::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--threads"), std::string::npos) << e.what();
    }
  }
}
