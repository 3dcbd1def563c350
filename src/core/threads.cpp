// physical_cores() from sysfs topology within the affinity mask; apply_threads() for --threads.
#include "core/threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <utility>

#include "core/error.h"

namespace hearth {

int64_t physical_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 1;
  std::set<std::pair<long, long>> cores;
  int64_t usable = 0;
  bool topology = true;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    ++usable;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream pkg(dir + "physical_package_id"), core(dir + "core_id");
    long p = 0, c = 0;
    if (!(pkg >> p) || !(core >> c)) {
      topology = false;
      continue;
    }
    cores.insert({p, c});
  }
  if (usable == 0) return 1;
  return topology ? static_cast<int64_t>(cores.size()) : usable;
}

int64_t apply_threads(int64_t n) {
  HEARTH_CHECK_T(InvalidArgument, n >= 0 && n <= 4096, "--threads must be between 0 (physical cores) and 4096, got ", n);
  if (n == 0) {
    const char* omp = std::getenv("OMP_NUM_THREADS");
    if (omp && *omp) return at::get_num_threads();
    n = physical_cores();
  }
  at::set_num_threads(static_cast<int>(n));
  return at::get_num_threads();
}

}  // namespace hearth
